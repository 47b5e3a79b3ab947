use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys;

use super::{DeviceBuffer, DeviceCopy, Event, Function, KernelArgs, LaunchConfig, PinnedBuffer};
use crate::driver;
use crate::driver::event::EventHandle;
use crate::driver::graph::{lock_two, GraphHandle, TreeState};
use crate::driver::memory::DeviceAlloc;
use crate::driver::stream::{CaptureLink, CaptureStatus, StreamHandle};
use crate::error::{Error, Refusal, Result};
use crate::Device;

mod launch;
mod memory;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a stream operation sees of the capture it is recorded into (see [`Stream::enqueue`]).
pub(crate) struct Recording<'a> {
    /// The capture's tree, locked; `None` when the stream is not capturing.
    pub(crate) tree: Option<&'a mut TreeState>,
    /// The tree of the other graph passed to [`Stream::enqueue_with`], when it is another tree.
    pub(crate) other: Option<&'a mut TreeState>,
    /// The graph captured into and the capture's id.
    capture: Option<(&'a Arc<GraphHandle>, u64)>,
    /// The stream's capture slot (held for the whole operation).
    pub(crate) slot: &'a mut Option<CaptureLink>,
}

impl Recording<'_> {
    /// Whether the work is recorded into a capture.
    pub(crate) fn capturing(&self) -> bool {
        self.tree.is_some()
    }

    /// Holds `value` as long as the captured graph and its execs (nothing when not capturing).
    pub(crate) fn keep<T: Any + Send + Sync>(&mut self, value: &Arc<T>) {
        if let Some(tree) = self.tree.as_deref_mut() {
            tree.keep(value);
        }
    }

    /// Holds `value` until the capture ends (nothing when not capturing): what the driver refers
    /// to while the capture records, such as events recorded into it and streams joined to it.
    pub(crate) fn hold_until_end(&mut self, value: Arc<dyn Any + Send + Sync>) {
        if let (Some(tree), Some((_, id))) = (self.tree.as_deref_mut(), self.capture) {
            tree.until_end.entry(id).or_default().push(value);
        }
    }

    /// The id of the graph the capture records into (`None` when not capturing).
    pub(crate) fn graph_id(&self) -> Option<u64> {
        self.capture.map(|(graph, _)| graph.id)
    }

    /// The capture, as a link a stream or event can hold.
    pub(crate) fn link(&self) -> Option<CaptureLink> {
        self.capture.map(|(graph, id)| CaptureLink {
            graph: Arc::downgrade(graph),
            id,
        })
    }

    /// [`keep`](Self::keep) for a value already shared as `Arc<dyn Any>`.
    pub(crate) fn keep_dyn(&mut self, value: &Arc<dyn Any + Send + Sync>) {
        if let Some(tree) = self.tree.as_deref_mut() {
            tree.keep_dyn(value);
        }
    }
}

/// A capture's graph, upgraded from a stream's or an event's link for the length of one
/// operation. Its handle may be the last (the capture ended and its builder was dropped
/// meanwhile): the graph then goes to the release thread, not here, where locks are held (the
/// stream's slot, and the caller's: an event's, an exec's) and a tree's drop runs the `Drop` of
/// values it held, which may call back into the crate and take them. So where it is dropped
/// among those locks does not matter.
struct Upgraded(Option<Arc<GraphHandle>>);

impl Drop for Upgraded {
    fn drop(&mut self) {
        if let Some(last) = self.0.take().and_then(Arc::into_inner) {
            driver::release::later(Box::new(move || drop(last)));
        }
    }
}

/// A builder's own capture, as the builder knows it while it is borrowed in its capturing
/// state: the graph recorded into and the capture's id (see `Stream::launch_recorded`).
#[derive(Clone, Copy)]
pub(crate) struct OwnCapture<'a> {
    pub(crate) graph: &'a Arc<GraphHandle>,
    pub(crate) id: u64,
}

/// The error for work on a capture whose graph the driver freed.
fn dead_capture() -> Error {
    Error::invalid(
        Refusal::Broken,
        "the graph this stream's capture records into was freed by the driver (a capture of its tree failed): nothing more can be recorded; end or drop the capture",
    )
}

/// A non-blocking CUDA stream. Clones share the stream. `Send + Sync`.
///
/// Operations that refer to crate resources (buffers, modules) keep them alive in the graph when
/// the stream is capturing, so a captured graph never outlives what it uses.
#[derive(Clone)]
pub struct Stream {
    pub(crate) handle: Arc<StreamHandle>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &self.handle.raw)
            .finish_non_exhaustive()
    }
}

impl Stream {
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.handle.raw
    }

    /// Wraps a stream this crate did not create — a raw `CUstream`, or cudarc's, or a library's —
    /// so graphs can be captured on it and work issued on it. The crate never destroys it;
    /// `owner` (for example the `Arc` that owns the stream) is held by this `Stream`, its clones
    /// and every capture it takes part in, and dropped after the last of them.
    ///
    /// What is kept alive: work issued through this crate (launches, memsets, copies, captures)
    /// keeps its operands alive exactly as on a stream of the crate's own. Work issued on
    /// [`as_raw`](Self::as_raw) behind the crate's back is recorded into a running capture by
    /// the driver as usual, but what it uses is the caller's to keep alive for as long as the
    /// graph and its execs.
    ///
    /// Work issued through this crate on a stream that a capture begun outside this crate
    /// records on (cudarc's `begin_capture`, raw calls) is refused with an error: the crate asks
    /// the driver (`cuStreamIsCapturing`, one call per operation on such streams) before each.
    ///
    /// The legacy default-stream handles (null and `CU_STREAM_LEGACY`, as cudarc's
    /// `default_stream()` holds) name the legacy stream of whichever context is current: for
    /// work on them the crate asks the driver which context is current and makes `device`'s
    /// current if it is not.
    ///
    /// # Safety
    /// - `raw` is a live stream of `device`'s primary context (the context cudarc's
    ///   `CudaContext::new(ordinal)` also uses), and stays valid until `owner` is dropped;
    /// - `raw` is not `CU_STREAM_PER_THREAD` (cudarc's `per_thread_stream()`): that handle names
    ///   a different stream on each thread, and a `Stream` is used from other threads (its
    ///   clones, builders, graphs launched on it, and the crate's own release work);
    /// - no capture is begun on it outside this crate (on another thread) while this crate issues
    ///   work on it: the check above cannot see a capture that begins during the operation, and
    ///   the crate could not keep that work's operands alive;
    /// - `raw` is not the handle of a [`Stream`] this crate made (`Device::create_stream`, a
    ///   builder's or fork's stream, [`as_raw`](Self::as_raw) of one): a capture begun through
    ///   one wrapper is not known to the other, whose work would go into the capture without its
    ///   operands kept. (Wrapping one raw handle twice is safe: a borrowed stream asks the
    ///   driver whether it captures, and refuses work during a capture it did not begin.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, raw: cudarc::driver::sys::CUstream, keep: std::sync::Arc<()>) -> cuda_graph::Result<()> {
    /// // SAFETY: `raw` is a stream of device 0's primary context; `keep` owns it.
    /// let stream = unsafe { Stream::from_raw(device, raw, keep) };
    /// let builder = stream.create_graph_builder().begin_building(Global)?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn from_raw(
        device: &Device,
        raw: sys::CUstream,
        owner: impl Any + Send + Sync,
    ) -> Stream {
        Stream {
            // SAFETY: forwarded from the caller.
            handle: unsafe { StreamHandle::borrowed(&device.ctx, raw, Box::new(owner)) },
        }
    }

    /// The raw `CUstream`, for passing to other CUDA code. It stays valid while this `Stream`
    /// (or a clone) lives. Work issued on it behind this crate's back is not tracked: what it
    /// uses is the caller's to keep alive.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream) {
    /// let raw: cudarc::driver::sys::CUstream = stream.as_raw();
    /// # }
    /// ```
    pub fn as_raw(&self) -> sys::CUstream {
        self.handle.raw
    }

    /// The device the stream belongs to.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream) -> cuda_graph::Result<()> {
    /// let buf = stream.device().alloc_zeroed::<u8>(64)?;
    /// # let _ = buf;
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        Device::from_ctx(&self.handle.ctx)
    }

    /// Blocks until all work on the stream is done. (While the stream is capturing this
    /// invalidates the capture, which `end_building` then reports.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, buf: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// stream.memset_d8(buf, 1)?;
    /// stream.synchronize()?; // the memset is done
    /// # Ok(()) }
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.handle.ctx.bind()?;
        driver::stream::synchronize(&self.handle)
    }

    /// Records `event` after the work queued so far.
    ///
    /// Recorded on a capturing stream, the event marks a point of the capture: a stream that
    /// [`wait`](Self::wait)s on it joins the capture (this is how forks work).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, other: &Stream) -> cuda_graph::Result<()> {
    /// let event = stream.device().create_event()?;
    /// stream.record(&event)?;
    /// other.wait(&event)?; // `other`'s later work runs after `stream`'s work so far
    /// # Ok(()) }
    /// ```
    pub fn record(&self, event: &Event) -> Result<()> {
        // Before the event's lock (see `refuse_in_host_callback`).
        driver::context::refuse_in_host_callback()?;
        // Held across the record: a `wait` on this event sees the record and where it was made
        // together, never one without the other (a wait between the two would join the capture
        // in the driver while this crate thought the waiting stream was not capturing). Taken
        // before the stream's slot, as `wait` does.
        let mut recorded_in = lock(&event.handle.recorded_in);
        self.enqueue(|rec| {
            // SAFETY: both handles are live and belong to this context.
            unsafe { driver::stream::record_event(event.handle.raw, self.raw()) }?;
            *recorded_in = rec.link();
            rec.hold_until_end(event.handle.clone());
            Ok(())
        })
    }

    /// Makes later work on this stream wait for `event`.
    ///
    /// If `event` was recorded into a capture that is still recording, this stream joins that
    /// capture: its later work is recorded into the graph too, until the capture ends. (The
    /// capture cannot end until the joined stream's work is joined back into it.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, other: &Stream) -> cuda_graph::Result<()> {
    /// let event = stream.device().create_event()?;
    /// stream.record(&event)?;
    /// other.wait(&event)?;
    /// # Ok(()) }
    /// ```
    pub fn wait(&self, event: &Event) -> Result<()> {
        // Before the event's lock (see `refuse_in_host_callback`).
        driver::context::refuse_in_host_callback()?;
        // Held across the wait (see `record`): the event is not recorded again meanwhile.
        let recorded_in = lock(&event.handle.recorded_in);
        let joins = recorded_in.as_ref();
        // The graph of the capture the event was recorded into, while the wait needs it.
        let joined = Upgraded(joins.and_then(|link| link.graph.upgrade()));
        let wait = || {
            // SAFETY: both handles are live; flags must be 0.
            unsafe { driver::stream::wait_event(self.raw(), event.handle.raw, 0) }
        };
        self.enqueue(|rec| {
            if rec.capturing() {
                rec.hold_until_end(event.handle.clone());
            } else {
                if let (Some(link), Some(graph)) = (joins, &joined.0) {
                    let mut tree = graph.lock();
                    if tree.captures().contains_key(&link.id) {
                        if tree.is_dead(graph) {
                            return Err(Error::invalid(
                                Refusal::Broken,
                                "the event was recorded into a capture whose graph the driver freed (a capture of its tree failed): waiting on it would join that capture",
                            ));
                        }
                        // The driver makes this stream part of the capture: so does the slot.
                        // The stream must live until the capture ends.
                        wait()?;
                        *rec.slot = Some((*link).clone());
                        let held = tree.until_end.entry(link.id).or_default();
                        held.push(self.handle.clone());
                        held.push(event.handle.clone());
                        return Ok(());
                    }
                }
            }
            wait()
        })
    }

    /// Whether the stream is capturing now (an invalidated capture counts).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream) -> cuda_graph::Result<()> {
    /// let b = stream.create_graph_builder().begin_building(Relaxed)?;
    /// assert!(stream.is_capturing()?);
    /// b.end_building()?;
    /// # Ok(()) }
    /// ```
    pub fn is_capturing(&self) -> Result<bool> {
        Ok(self.handle.capture_status()? != CaptureStatus::None)
    }

    /// Runs `op`, which issues work on this stream, atomically with respect to beginning and
    /// ending a capture on it. If the stream records into a capture of this crate, `op` runs
    /// under that graph tree's lock (CUDA graphs are not thread-safe, and every stream of one
    /// capture adds nodes to the same tree) and may hold its operands through the
    /// [`Recording`]; otherwise it runs with the stream's capture slot held, so no capture can
    /// begin in between.
    pub(crate) fn enqueue<R>(&self, op: impl FnOnce(&mut Recording<'_>) -> Result<R>) -> Result<R> {
        self.enqueue_with(None, op)
    }

    /// [`enqueue`](Self::enqueue), kept out of [`launch_recorded`](Self::launch_recorded)'s
    /// body so that the builder's path there stays small.
    #[inline(never)]
    fn enqueue_out_of_line<R>(
        &self,
        op: impl FnOnce(&mut Recording<'_>) -> Result<R>,
    ) -> Result<R> {
        self.enqueue(op)
    }

    /// Binds the stream's context for work on it, refusing a host callback's thread. For a
    /// stream of its own, the thread's record of what the crate bound last is enough: the driver
    /// runs work on a stream in the stream's context whichever context is current (see
    /// docs/design/captures.md, "Which calls need a current context"). The special handles (0 to 2: the legacy default
    /// stream, which a borrowed stream can be, and the per-thread one, which `from_raw`'s
    /// contract excludes) name a stream of the *current* context, so for them the driver is
    /// asked.
    #[inline]
    fn bind_for_work(&self) -> Result<()> {
        if (self.raw() as usize) <= 2 {
            self.handle.ctx.bind_checked()
        } else {
            self.handle.ctx.bind_cached()
        }
    }

    /// [`enqueue`](Self::enqueue), also locking `other`'s tree (in the fixed order of
    /// [`lock_two`]) when the stream captures: for work that reads another graph (`add_child_graph`).
    pub(crate) fn enqueue_with<R>(
        &self,
        other: Option<&GraphHandle>,
        op: impl FnOnce(&mut Recording<'_>) -> Result<R>,
    ) -> Result<R> {
        self.bind_for_work()?;
        let mut slot = self.handle.slot();
        if let Some((graph, id)) = slot.as_ref().map(|l| (l.graph.upgrade(), l.id)) {
            // The capture's graph while the work needs it.
            let upgraded = Upgraded(graph);
            if let Some(graph) = &upgraded.0 {
                let (mut tree, mut second) = match other {
                    Some(o) => lock_two(graph, o),
                    None => (graph.lock(), None),
                };
                if tree.captures().contains_key(&id) {
                    if tree.is_dead(graph) {
                        // The driver freed the graph this capture records into (the parent's
                        // capture failed while a forgotten body still captured into it).
                        return Err(dead_capture());
                    }
                    let mut rec = Recording {
                        tree: Some(&mut tree),
                        other: second.as_deref_mut(),
                        capture: Some((graph, id)),
                        slot: &mut slot,
                    };
                    return op(&mut rec);
                }
            }
            // The capture ended: the link is stale.
            *slot = None;
        }
        if self.handle.is_borrowed() && self.handle.raw_capture_status()? != CaptureStatus::None {
            // A capture this crate did not begin (cudarc's `begin_capture`, raw calls): the work
            // would be recorded into a graph that holds none of its operands.
            return Err(Error::invalid(
                Refusal::Capture,
                "a capture begun outside this crate is recording on this stream: end it first, or capture with this crate (`create_graph_builder`)",
            ));
        }
        let mut rec = Recording {
            tree: None,
            other: None,
            capture: None,
            slot: &mut slot,
        };
        op(&mut rec)
    }
}
