use std::any::Any;
use std::sync::Arc;

use crate::driver::sync::lock;

use cudarc::driver::sys;

use super::{DeviceBuffer, DeviceCopy, Event, Function, KernelArgs, LaunchConfig, PinnedBuffer};
use crate::driver;
use crate::driver::event::EventHandle;
use crate::driver::graph::{lock_two, GraphHandle, TreeState};
use crate::driver::memory::DeviceAlloc;
use crate::driver::stream::{CaptureLink, CaptureStatus, StreamHandle};
use crate::error::{Error, Refusal, Result};
use crate::Device;

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

    /// Launches a typed `kernel` on this stream (or into its capture) with `args`, one per
    /// parameter of its signature, checked at compile time. Buffers given are kept alive by any
    /// graph that captures the launch.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream, fill: &Kernel<(*mut i32, i32, i32)>, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let n = buf.len() as i32;
    /// stream.launch(fill, LaunchConfig::for_num_elems(n as u32), (buf, n, 7))?;
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn launch<S: crate::Signature>(
        &self,
        kernel: &crate::Kernel<S>,
        config: LaunchConfig,
        args: impl crate::ArgsFor<S>,
    ) -> Result<()> {
        self.launch_via(None, kernel, config, args)
    }

    /// Launches a [`DependentKernel`](crate::DependentKernel) as a programmatic dependent
    /// launch: it may begin before the stream's previous kernel has ended, and waits for it
    /// where its code says (`cudaGridDependencySynchronize()`). In a capture the edge from the
    /// previous kernel's node is programmatic. Otherwise as [`launch`](Self::launch). Needs
    /// compute capability 9.0 ([`Refusal::Attribute`](crate::Refusal::Attribute) before it).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, first: &Kernel<(*mut f32,)>, then: &DependentKernel<(*mut f32,)>, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// stream.launch(first, LaunchConfig::for_num_elems(1024), buf)?;
    /// stream.launch_dependent(then, LaunchConfig::for_num_elems(1024), buf)?;
    /// # Ok(()) }
    /// ```
    pub fn launch_dependent<K: crate::WaitsForPredecessor>(
        &self,
        kernel: &K,
        config: LaunchConfig,
        args: impl crate::ArgsFor<K::Sig>,
    ) -> Result<()> {
        let mut config = config;
        config.attributes = config.attributes.set_dependent(true);
        self.launch_via(None, kernel.waiting_kernel(), config, args)
    }

    /// [`launch`](Self::launch), recorded through `own` when the caller is a builder whose
    /// capture this stream records into (see [`OwnCapture`]).
    pub(crate) fn launch_via<S: crate::Signature>(
        &self,
        own: Option<OwnCapture<'_>>,
        kernel: &crate::Kernel<S>,
        config: LaunchConfig,
        args: impl crate::ArgsFor<S>,
    ) -> Result<()> {
        let function = kernel.function();
        let device = self.handle.ctx.device;
        if function.device != device {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                format!(
                    "kernel `{}` is loaded on device {}, but the stream is on device {device}",
                    function.name(),
                    function.device
                ),
            ));
        }
        super::with_refs(&args, device, |refs| {
            refs.check_device("stream")?;
            if refs.uses_graph_memory() {
                return self.launch_with_graph_memory(function, &config, refs);
            }
            let params = refs.params();
            // SAFETY: `params` points at one pointer per parameter, each at argument bytes that
            // live until the call returns; `Kernel`'s maker promised its signature and bounds,
            // and the arguments match the signature (checked by `ArgsFor`).
            unsafe {
                self.launch_recorded(
                    own,
                    function,
                    &config,
                    params,
                    refs.owners.iter().copied(),
                    |graph| refs.check_target(graph),
                )
            }
        })
    }

    /// A typed launch whose arguments include graph memory ([`GraphBuffer`](crate::GraphBuffer)):
    /// only into a capture of the graph that allocates it, after the allocation node (the
    /// capture's dependencies reach it), and recorded as a user of each allocation for the check
    /// of its free. The stream's slot and the capture's tree stay held from the check to the
    /// record (`enqueue`), so no other work on the stream comes between.
    #[cold]
    #[inline(never)]
    fn launch_with_graph_memory(
        &self,
        function: &Function,
        config: &LaunchConfig,
        refs: &mut super::ArgRefs<'_>,
    ) -> Result<()> {
        self.enqueue(|rec| {
            refs.check_target(rec.capture.map(|(graph, _)| &**graph))?;
            let (Some(graph), Some(tree)) = (rec.graph_id(), rec.tree.as_deref_mut()) else {
                // `check_target` refused a stream outside a capture.
                return Err(Error::invalid(
                    Refusal::Capture,
                    "a GraphBuffer is used outside a capture",
                ));
            };
            let stream = self.raw();
            let deps = crate::driver::graph::ledger::capture_dependencies(stream)?;
            // SAFETY: the capture's dependencies are live nodes of its graph, whose tree is
            // locked and whose stream's slot is held (`rec`).
            unsafe { crate::driver::graph::ledger::check_after_allocations(graph, &deps, refs.graph_uses()) }?;
            if config.attributes.is_dependent() {
                tree.programmatic = true;
            }
            tree.keep(&function.module);
            for o in refs.owners.iter().copied() {
                match o {
                    super::OwnerRef::Alloc(alloc) => tree.keep(alloc),
                    super::OwnerRef::Other(owner) => tree.keep_dyn(owner),
                }
            }
            let params = refs.params();
            // SAFETY: the stream's context is bound (by `enqueue`); `params` points at one
            // pointer per parameter, each at argument bytes that live until the call returns;
            // `Kernel`'s maker promised its signature and bounds, and the graph memory among the
            // arguments exists when the node runs (checked above, and at its free).
            unsafe { self.launch_here::<true>(function, config, params) }?;
            match crate::driver::graph::ledger::capture_dependencies(stream)?.as_slice() {
                [node] => {
                    crate::driver::graph::ledger::note_users(tree, *node as usize, refs.graph_uses());
                    Ok(())
                }
                // The launch is in the graph, but its node cannot be named: the free node could
                // not be checked against it.
                other => {
                    tree.break_with(|| format!("a captured launch using graph memory left the capture with {} dependencies instead of its node, so its free cannot be checked", other.len()));
                    Err(Error::invalid(Refusal::Order, "after a captured launch using a GraphBuffer the capture does not end in its node"))
                }
            }
        })
    }

    /// Launches an untyped `function` on this stream (or into its capture): the raw form of
    /// [`launch`](Self::launch), for kernels without a declared [`Kernel`](crate::Kernel) signature.
    ///
    /// What `args` borrows is held as long as the launch needs it: in a capture, by the graph
    /// (and every exec made from it); outside one, the crate's own buffers need no hold (freeing
    /// one waits for the device), and memory borrowed from elsewhere
    /// ([`DeviceBuffer::from_raw`](crate::DeviceBuffer::from_raw), cudarc's) is held until the
    /// stream has run the launch.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and type, and the kernel
    /// must only access memory that is valid for it (in bounds of the buffers it is given).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, add_one: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// // SAFETY: add_one takes one int*, and `buf` holds it.
    /// unsafe { stream.launch_unchecked(add_one, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    #[inline]
    pub unsafe fn launch_unchecked(
        &self,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_unchecked_via(None, function, config, args) }
    }

    /// [`launch_unchecked`](Self::launch_unchecked), recorded through `own` when the caller is a
    /// builder whose capture this stream records into (see [`OwnCapture`]).
    ///
    /// # Safety
    /// As [`launch_unchecked`](Self::launch_unchecked).
    pub(crate) unsafe fn launch_unchecked_via(
        &self,
        own: Option<OwnCapture<'_>>,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        let (mut ptrs, mut spill) = (crate::runtime::launch::NO_POINTERS, Vec::new());
        let params = args.fill_pointers(&mut ptrs, &mut spill);
        let owners = args.owners();
        // SAFETY: `params` points at `args.len()` pointers to argument storage that lives until
        // the call returns; the caller promises the arguments match the kernel.
        unsafe { self.launch_recorded(own, function, &config, params, owners, |_| Ok(())) }
    }

    /// The part of a launch both forms share: `check` (given the graph captured into, if any),
    /// the stream checks of the buffers among `owners`, the owners kept by the capture (if
    /// any), the launch, and the hold on borrowed memory outside a capture.
    ///
    /// Through a builder (`own`, its capture), all of it runs in this one frame under the
    /// capture's tree lock alone. The stream's capture slot is not needed: it guards against a
    /// capture beginning or ending on the stream in the middle of the operation, and neither
    /// can happen to a capture whose builder is borrowed for it (ending consumes the builder;
    /// beginning another on a capturing stream is refused by the driver without touching this
    /// tree). Work on the stream from other threads takes the slot and then the same tree
    /// lock, so it is serialised with this. The builder's launch is the per-node path of a
    /// capture: going through [`enqueue`](Self::enqueue)'s closure and a [`Recording`] cost 214
    /// instructions per launch with the stub driver, this 187 (one buffer argument: 261, 234;
    /// a typed launch: 366, 300; `scripts/check-instructions.sh` keeps the
    /// current counts). Other launches take the stream's capture slot.
    ///
    /// # Safety
    /// `params` points at one pointer per kernel parameter, each at argument bytes that live
    /// until this returns and match the kernel's parameter; the kernel stays within the memory
    /// it is given.
    #[inline(always)]
    unsafe fn launch_recorded<'a>(
        &self,
        own: Option<OwnCapture<'_>>,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
        owners: impl Iterator<Item = super::OwnerRef<'a>> + Clone,
        check: impl FnOnce(Option<&GraphHandle>) -> Result<()>,
    ) -> Result<()> {
        if config.attributes.is_empty() {
            // SAFETY: the caller's promise.
            unsafe {
                self.launch_recorded_as::<false>(own, function, config, params, owners, check)
            }
        } else {
            // SAFETY: the caller's promise.
            unsafe { self.launch_recorded_attributed(own, function, config, params, owners, check) }
        }
    }

    /// [`launch_recorded`](Self::launch_recorded) of a launch with attributes: off the plain
    /// launch's path.
    ///
    /// # Safety
    /// As [`launch_recorded`](Self::launch_recorded).
    #[cold]
    #[inline(never)]
    unsafe fn launch_recorded_attributed<'a>(
        &self,
        own: Option<OwnCapture<'_>>,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
        owners: impl Iterator<Item = super::OwnerRef<'a>> + Clone,
        check: impl FnOnce(Option<&GraphHandle>) -> Result<()>,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.launch_recorded_as::<true>(own, function, config, params, owners, check) }
    }

    /// [`launch_recorded`](Self::launch_recorded), for a launch with attributes (`ATTRS`) or
    /// without: the plain form has no attribute code at all.
    ///
    /// # Safety
    /// As [`launch_recorded`](Self::launch_recorded).
    unsafe fn launch_recorded_as<'a, const ATTRS: bool>(
        &self,
        own: Option<OwnCapture<'_>>,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
        owners: impl Iterator<Item = super::OwnerRef<'a>> + Clone,
        check: impl FnOnce(Option<&GraphHandle>) -> Result<()>,
    ) -> Result<()> {
        if let Some(own) = own {
            check(Some(own.graph))?;
            // Binding also refuses a host callback's thread: a builder can be there (a
            // `Relaxed` one is `Send` and `Sync`, a `Global` one `Sync`).
            self.bind_for_work()?;
            let mut tree = own.graph.lock();
            // Only the builder's own end removes its capture, and it is borrowed for this.
            debug_assert!(tree.captures().contains_key(&own.id));
            if tree.is_dead(own.graph) {
                return Err(dead_capture());
            }
            if ATTRS && config.attributes.is_dependent() {
                tree.programmatic = true;
            }
            tree.keep(&function.module);
            for o in owners {
                match o {
                    super::OwnerRef::Alloc(alloc) => tree.keep(alloc),
                    super::OwnerRef::Other(owner) => tree.keep_dyn(owner),
                }
            }
            // SAFETY: the stream's context is bound (`bind_for_work`: a stream of its own names
            // it, a special handle was bound as the driver reported); `params` is the caller's
            // promise.
            return unsafe { self.launch_here::<ATTRS>(function, config, params) };
        }
        // A stream of its own with no capture linked in its slot is not capturing: a capture of
        // this crate begins and links itself there under the slot's lock (`Core::begin`), and so
        // does a stream joining one (`wait`), and no other code captures on a stream it does not
        // hold. The launch runs here, with the slot held so that no capture can begin in
        // between, without `enqueue`'s general path (two calls and a `Recording`: about 70
        // instructions per launch under the stub driver). A borrowed stream, whose capture
        // status only the driver knows, and a stream linked to a capture take the general path.
        if !self.handle.is_borrowed() {
            self.bind_for_work()?;
            let slot = self.handle.slot();
            if slot.is_none() {
                // SAFETY: the stream's context is bound (`bind_for_work`, a stream of its own)
                // and its slot held; `params` is the caller's promise.
                let launched = unsafe {
                    self.launch_uncaptured::<ATTRS>(function, config, params, owners, check)
                };
                drop(slot);
                return launched;
            }
        }
        self.enqueue_out_of_line(|rec| {
            if !rec.capturing() {
                // SAFETY: the stream's context is bound and its slot held (by `enqueue`);
                // `params` is the caller's promise.
                return unsafe {
                    self.launch_uncaptured::<ATTRS>(function, config, params, owners, check)
                };
            }
            check(rec.capture.map(|(graph, _)| &**graph))?;
            if ATTRS && config.attributes.is_dependent() {
                if let Some(t) = rec.tree.as_deref_mut() {
                    t.programmatic = true;
                }
            }
            rec.keep(&function.module);
            for o in owners {
                match o {
                    super::OwnerRef::Alloc(alloc) => rec.keep(alloc),
                    super::OwnerRef::Other(owner) => rec.keep_dyn(owner),
                }
            }
            // SAFETY: the stream's context is bound (by `enqueue`); `params` is the caller's
            // promise.
            unsafe { self.launch_here::<ATTRS>(function, config, params) }
        })
    }

    /// A launch on this stream outside any capture, for both paths of
    /// [`launch_recorded`](Self::launch_recorded) that find none: `check`, the stream checks of
    /// the buffers among `owners`, the launch, and the hold on borrowed memory.
    ///
    /// # Safety
    /// As [`launch_here`](Self::launch_here), with the stream's slot held by the caller (so no
    /// capture begins on the stream meanwhile) and the stream not capturing.
    #[inline(always)]
    unsafe fn launch_uncaptured<'a, const ATTRS: bool>(
        &self,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
        owners: impl Iterator<Item = super::OwnerRef<'a>> + Clone,
        check: impl FnOnce(Option<&GraphHandle>) -> Result<()>,
    ) -> Result<()> {
        check(None)?;
        for alloc in owners.clone().filter_map(|o| o.alloc()) {
            alloc.check_stream(self.raw())?;
        }
        // SAFETY: the caller's promise above.
        unsafe { self.launch_here::<ATTRS>(function, config, params) }?;
        self.hold_borrowed_now(owners)
    }

    /// The driver's launch of `function` on this stream, written once for the three paths of
    /// [`launch_recorded`](Self::launch_recorded) and inlined into each (a shared closure cost
    /// 8 instructions per launch).
    ///
    /// # Safety
    /// As `driver::stream::launch_kernel`: the stream's context is bound on this thread, which
    /// is not a host callback's (`bind_for_work` ensures both), and `function` belongs to that
    /// context (the callers' device check); `params` points at one pointer per kernel parameter,
    /// each at argument bytes that live until this returns and match the kernel's parameter (the
    /// driver copies them during the call); the kernel stays within the memory it is given.
    #[inline(always)]
    unsafe fn launch_here<const ATTRS: bool>(
        &self,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
    ) -> Result<()> {
        if ATTRS && !config.attributes.is_empty() {
            // SAFETY: the caller's promise above.
            return unsafe { self.launch_with_attributes(function, config, params) };
        }
        // SAFETY: the caller's promise above; the stream is live while `self` is.
        unsafe {
            driver::stream::launch_kernel(
                &self.handle.ctx,
                function.raw,
                config.grid,
                config.block,
                config.shared_mem_bytes,
                self.raw(),
                params,
            )
        }
    }

    /// [`launch_here`](Self::launch_here) of a launch with [`LaunchAttributes`]
    /// (crate::LaunchAttributes): checked against the device and the kernel, then
    /// `cuLaunchKernelEx`.
    ///
    /// # Safety
    /// As [`launch_here`](Self::launch_here).
    #[cold]
    #[inline(never)]
    unsafe fn launch_with_attributes(
        &self,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
    ) -> Result<()> {
        let attributes = crate::runtime::launch::check_attributes(function, config)?;
        // SAFETY: the caller's promise (as `launch_here`); the attributes were checked above.
        unsafe {
            driver::launch::launch_kernel_ex(
                function.raw,
                config.grid,
                config.block,
                config.shared_mem_bytes,
                self.raw(),
                params,
                attributes,
            )
        }
    }

    /// Outside a capture, refuses work on `buf` when it is a stream-ordered allocation of another
    /// stream ([`alloc_async`](Self::alloc_async)): its memory is freed in its own stream's order
    /// when it is dropped, and this crate cannot order that free after work on other streams.
    /// (In a capture the graph runs at launch, and the graph holds the buffer until its launches
    /// have finished.)
    pub(crate) fn after_allocation<T: DeviceCopy>(
        &self,
        rec: &Recording<'_>,
        buf: &DeviceBuffer<T>,
    ) -> Result<()> {
        if rec.capturing() {
            return Ok(());
        }
        buf.alloc.check_stream(self.raw())
    }

    /// Outside a capture, keeps the owners of borrowed memory among `owners` (made by
    /// [`DeviceBuffer::from_raw`] or a cudarc adapter) until the work just queued on this stream
    /// has run: their owners may free the memory on a stream of their own the moment they are
    /// dropped (cudarc frees a slice with `cuMemFreeAsync` on its stream), unordered with this
    /// stream's work. The crate's own allocations need nothing: `cuMemFree` waits for the device.
    /// Called after the operation is queued; where the driver refuses to queue the host function
    /// that releases them, waits for the stream instead. (A host callback's thread never gets
    /// here: binding refuses it first.)
    #[inline]
    pub(crate) fn hold_borrowed<'a, I>(&self, rec: &Recording<'_>, owners: I) -> Result<()>
    where
        I: IntoIterator<Item = super::OwnerRef<'a>>,
        I::IntoIter: Clone,
    {
        if rec.capturing() {
            return Ok(());
        }
        self.hold_borrowed_now(owners)
    }

    /// [`hold_borrowed`](Self::hold_borrowed) outside a capture.
    #[inline(always)]
    fn hold_borrowed_now<'a, I>(&self, owners: I) -> Result<()>
    where
        I: IntoIterator<Item = super::OwnerRef<'a>>,
        I::IntoIter: Clone,
    {
        let owners = owners.into_iter();
        let borrowed = |o: &super::OwnerRef<'a>| o.alloc().is_some_and(DeviceAlloc::is_borrowed);
        // The usual case, no borrowed memory: a plain loop, no list built and no call made
        // (building and dropping an empty list were two calls per launch; an iterator adapter
        // here was one).
        let mut any = false;
        for o in owners.clone() {
            if borrowed(&o) {
                any = true;
                break;
            }
        }
        if !any {
            return Ok(());
        }
        self.hold_until_run(owners.filter(borrowed).map(|o| o.owner()).collect())
    }

    /// Holds `held` until the work queued on this stream so far has run (see
    /// [`hold_borrowed`](Self::hold_borrowed)).
    #[inline(never)]
    pub(crate) fn hold_until_run(
        &self,
        held: smallvec::SmallVec<[crate::driver::graph::Owner; 2]>,
    ) -> Result<()> {
        match crate::driver::release::after_stream(self.raw(), Box::new(move || drop(held))) {
            Ok(()) => Ok(()),
            Err((_, job)) => {
                let waited = driver::stream::synchronize(&self.handle);
                if waited.is_ok() {
                    drop(job);
                } else {
                    // The work may not have run: leak what it uses rather than free it early.
                    std::mem::forget(job);
                }
                waited
            }
        }
    }

    /// Allocates `len` zeroed elements of `T` ordered on this stream (`cuMemAllocAsync`, then a
    /// memset on this stream), without waiting.
    ///
    /// The buffer is a [`DeviceBuffer`] like any other: work queued later on this stream may use
    /// it at once; this crate's copies and memsets on other streams, and
    /// [`to_vec`](DeviceBuffer::to_vec) / [`copy_from`](DeviceBuffer::copy_from), wait for the
    /// allocation first. Its memory is freed **in this stream's order** when the last owner lets
    /// go (`cuMemFreeAsync` after the work queued on this stream by then; should the stream be
    /// capturing at that moment, a helper thread frees it once the capture is over and the
    /// stream idle): work on other streams that uses it must be ordered before that drop (wait
    /// for it), as with CUDA's stream-ordered allocator. Graphs that use it hold it, and an
    /// exec's first launch (on whatever stream) waits for the allocation and its zeroing.
    ///
    /// Refused while the stream captures (the memory would exist only while the graph runs):
    /// use the builder's [`alloc_async`](crate::GraphBuilder::alloc_async), which returns a
    /// [`GraphAllocation`](crate::GraphAllocation). A zero length or a size that overflows
    /// `usize` is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream) -> cuda_graph::Result<()> {
    /// let tmp = stream.alloc_async::<f32>(1 << 20)?;
    /// stream.memset_d32(&tmp, 1.0f32.to_bits())?;
    /// stream.free_async(tmp)?;
    /// # Ok(()) }
    /// ```
    pub fn alloc_async<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = super::pinned::device_byte_size::<T>(len)?;
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Capture,
                    "Stream::alloc_async on a capturing stream: the memory would exist only while the graph runs; use the builder's alloc_async (a GraphAllocation) instead",
                ));
            }
            Ok(DeviceBuffer::new(
                DeviceAlloc::zeroed_async(&self.handle, bytes)?,
                len,
            ))
        })
    }

    /// Lets go of `buf`, freeing it after the work queued on this stream so far (and, for a
    /// stream-ordered buffer, after the work on its own stream): use it when the last user of a
    /// buffer from [`alloc_async`](Self::alloc_async) of another stream was this stream. Graphs
    /// that still use the buffer keep it until they are done.
    ///
    /// For a buffer ordered on this stream, or one from
    /// [`Device::alloc_zeroed`](crate::Device::alloc_zeroed), it is the same as dropping it.
    /// Refused while the stream captures (record a [`GraphAllocation`](crate::GraphAllocation)
    /// free with the builder's [`free_async`](crate::GraphBuilder::free_async)); the buffer is
    /// then dropped as usual.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, a: &Stream, b: &Stream) -> cuda_graph::Result<()> {
    /// let tmp = a.alloc_async::<u8>(4096)?;
    /// let def = GraphDefinition::new(device)?;
    /// def.add_memset(&[], &tmp, 1u8)?;
    /// def.instantiate()?.launch(b)?; // waits for the allocation on `a`
    /// drop(def);
    /// b.free_async(tmp)?; // freed after the launch on `b`
    /// # Ok(()) }
    /// ```
    pub fn free_async<T: DeviceCopy>(&self, buf: DeviceBuffer<T>) -> Result<()> {
        self.same_context(&buf)?;
        let Some(ordered) = &buf.alloc.ordered else {
            return Ok(());
        };
        if ordered.stream.raw == self.raw() {
            return Ok(());
        }
        let own = ordered.stream.clone();
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Capture,
                    "Stream::free_async on a capturing stream: a DeviceBuffer is not graph memory; free a GraphAllocation with the builder's free_async",
                ));
            }
            // Make the buffer's own stream wait for this one, if it can without blocking or
            // joining a capture; otherwise wait for this stream here.
            let event = EventHandle::pooled(&self.handle.ctx)?;
            if let Some(slot) = own.try_slot() {
                if slot.is_none() && own.is_idle_of_captures() {
                    // SAFETY: both streams and the event are live handles of the current
                    // context; the buffer's stream does not capture (checked under its slot).
                    let ordered = unsafe {
                        driver::stream::record_event(event.raw, self.raw())
                            .and_then(|()| driver::stream::wait_event(own.raw, event.raw, 0))
                    };
                    if ordered.is_ok() {
                        return Ok(());
                    }
                }
            }
            driver::stream::synchronize(&self.handle)
        })?;
        drop(buf);
        Ok(())
    }

    /// Copies `src` (page-locked host memory) into `dst`, ordered on this stream, without
    /// waiting. The lengths must match. `src` remembers the copy: writing it from the host
    /// ([`PinnedBuffer::as_mut_slice`]) waits until the copy has read it.
    ///
    /// Refused while the stream captures (a graph would read the host memory at every launch,
    /// which the buffer cannot track): copy before launching, or capture device-to-device
    /// copies.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream, host: &PinnedBuffer<f32>, dev: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// stream.memcpy_htod_async(dev, host)?;
    /// # Ok(()) }
    /// ```
    pub fn memcpy_htod_async<T: DeviceCopy>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &PinnedBuffer<T>,
    ) -> Result<()> {
        self.same_context(dst)?;
        check_lens("memcpy_htod_async", src.len(), dst.len())?;
        let event = EventHandle::pooled(&self.handle.ctx)?;
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(pinned_in_capture("memcpy_htod_async"));
            }
            self.after_allocation(rec, dst)?;
            // SAFETY: `src` holds `byte_len` bytes of pinned memory that it keeps until this copy
            // has run (tracked below; its host access and `Drop` wait); `dst` as many, kept alive
            // by the caller's borrow and its own drop order; the stream does not capture.
            unsafe {
                driver::stream::memcpy_htod_async(
                    dst.device_ptr(),
                    src.ptr().cast_const(),
                    dst.byte_len(),
                    self.raw(),
                )
            }?;
            src.track(&self.handle, self.mark(event));
            self.hold_borrowed(rec, [super::OwnerRef::Alloc(&dst.alloc)])
        })
    }

    /// Copies `src` into `dst` (page-locked host memory), ordered on this stream, without
    /// waiting. The lengths must match. `dst` remembers the copy: reading it
    /// ([`PinnedBuffer::as_slice`]) waits until the copy has written it.
    ///
    /// Refused while the stream captures, as [`memcpy_htod_async`](Self::memcpy_htod_async).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream, dev: &DeviceBuffer<f32>, host: &mut PinnedBuffer<f32>) -> cuda_graph::Result<()> {
    /// stream.memcpy_dtoh_async(host, dev)?;
    /// let first = host.as_slice()?[0];
    /// # Ok(()) }
    /// ```
    pub fn memcpy_dtoh_async<T: DeviceCopy>(
        &self,
        dst: &mut PinnedBuffer<T>,
        src: &DeviceBuffer<T>,
    ) -> Result<()> {
        self.same_context(src)?;
        check_lens("memcpy_dtoh_async", src.len(), dst.len())?;
        let event = EventHandle::pooled(&self.handle.ctx)?;
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(pinned_in_capture("memcpy_dtoh_async"));
            }
            // Device memory the copy reads lives until it has run, as for any non-captured work.
            self.after_allocation(rec, src)?;
            // SAFETY: `dst` holds `byte_len` bytes of pinned memory that nothing else reads or
            // writes until this copy has run: it is borrowed mutably here, and its host access
            // and `Drop` wait for the copy (tracked below); the stream does not capture.
            unsafe {
                driver::stream::memcpy_dtoh_async(
                    dst.ptr(),
                    src.device_ptr(),
                    src.byte_len(),
                    self.raw(),
                )
            }?;
            dst.track(&self.handle, self.mark(event));
            self.hold_borrowed(rec, [super::OwnerRef::Alloc(&src.alloc)])
        })
    }

    /// Records `event` after the work queued so far (the stream does not capture). If that
    /// fails, waits for the stream instead; if that fails too, the error (the work is untracked).
    fn mark(&self, event: Arc<EventHandle>) -> Result<Arc<EventHandle>> {
        // SAFETY: both handles are live and of this (current) context.
        match unsafe { driver::stream::record_event(event.raw, self.raw()) } {
            Ok(()) => Ok(event),
            Err(_) => {
                driver::stream::synchronize(&self.handle)?;
                // The work is done: an unrecorded event is complete.
                Ok(event)
            }
        }
    }

    pub(crate) fn same_context<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>) -> Result<()> {
        if !Arc::ptr_eq(&buf.alloc.ctx, &self.handle.ctx)
            && buf.alloc.ctx.device != self.handle.ctx.device
        {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                "the buffer lives on another device than the stream",
            ));
        }
        Ok(())
    }

    /// Sets every byte of `buf` to `value` (asynchronous; capturable).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, buf: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// stream.memset_d8(buf, 0)?;
    /// # Ok(()) }
    /// ```
    pub fn memset_d8<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, value: u8) -> Result<()> {
        self.same_context(buf)?;
        self.enqueue(|rec| {
            rec.keep(&buf.alloc);
            self.after_allocation(rec, buf)?;
            // SAFETY: `buf` holds `byte_len` bytes; the allocation is kept alive by the caller's
            // handle or, in a capture, by the graph.
            unsafe {
                driver::stream::memset_d8_async(buf.device_ptr(), value, buf.byte_len(), self.raw())
            }?;
            self.hold_borrowed(rec, [super::OwnerRef::Alloc(&buf.alloc)])
        })
    }

    /// Sets every 32-bit word of `buf` to `value` (asynchronous; capturable). The buffer's byte
    /// length must be a multiple of 4.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// stream.memset_d32(buf, 1.0f32.to_bits())?; // every element 1.0
    /// # Ok(()) }
    /// ```
    pub fn memset_d32<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, value: u32) -> Result<()> {
        self.same_context(buf)?;
        if !buf.byte_len().is_multiple_of(4) {
            return Err(Error::invalid(
                Refusal::Size,
                format!(
                    "memset_d32 of a {}-byte buffer: the size must be a multiple of 4",
                    buf.byte_len()
                ),
            ));
        }
        self.enqueue(|rec| {
            rec.keep(&buf.alloc);
            self.after_allocation(rec, buf)?;
            // SAFETY: `buf` holds `byte_len / 4` words.
            unsafe {
                driver::stream::memset_d32_async(
                    buf.device_ptr(),
                    value,
                    buf.byte_len() / 4,
                    self.raw(),
                )
            }?;
            self.hold_borrowed(rec, [super::OwnerRef::Alloc(&buf.alloc)])
        })
    }

    /// Copies `src` into `dst` (asynchronous; capturable). The lengths must match.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, dst: &DeviceBuffer<i32>, src: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// stream.memcpy_dtod(dst, src)?; // same length
    /// # Ok(()) }
    /// ```
    pub fn memcpy_dtod<T: DeviceCopy>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
    ) -> Result<()> {
        self.same_context(dst)?;
        self.same_context(src)?;
        let whole = super::check_whole(dst.len(), src.len(), std::mem::size_of::<T>())?;
        self.enqueue(|rec| {
            rec.keep(&dst.alloc);
            rec.keep(&src.alloc);
            self.after_allocation(rec, dst)?;
            self.after_allocation(rec, src)?;
            // SAFETY: both buffers hold `width_bytes` bytes (`check_whole`).
            unsafe {
                driver::stream::memcpy_dtod_async(
                    dst.device_ptr(),
                    src.device_ptr(),
                    whole.width_bytes,
                    self.raw(),
                )
            }?;
            self.hold_borrowed(
                rec,
                [
                    super::OwnerRef::Alloc(&dst.alloc),
                    super::OwnerRef::Alloc(&src.alloc),
                ],
            )
        })
    }

    /// Copies a 2D or 3D `region` of `src` into `dst`, ordered on this stream (or recorded into
    /// its capture as a memcpy node): `cuMemcpy3DAsync`, checked against both buffers as
    /// [`Copy3d`](crate::Copy3d) says.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::Copy3d;
    /// # fn f(stream: &Stream, image: &DeviceBuffer<u8>, row_pairs: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// // Every other row of a 64 x 64 image, packed.
    /// stream.memcpy_3d(row_pairs, image, Copy3d::rows(64, 32, 128, 64))?;
    /// # Ok(()) }
    /// ```
    pub fn memcpy_3d<T: DeviceCopy>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
        region: crate::Copy3d,
    ) -> Result<()> {
        self.same_context(dst)?;
        self.same_context(src)?;
        let raw = region.check(src.len(), dst.len(), std::mem::size_of::<T>())?;
        self.enqueue(|rec| {
            rec.keep(&dst.alloc);
            rec.keep(&src.alloc);
            self.after_allocation(rec, dst)?;
            self.after_allocation(rec, src)?;
            // SAFETY: both regions lie in their buffers (checked above); the buffers are held
            // (by the capture, or below until the stream has run the copy).
            unsafe {
                driver::memory::copy3d_async(dst.device_ptr(), src.device_ptr(), &raw, self.raw())
            }?;
            self.hold_borrowed(
                rec,
                [
                    super::OwnerRef::Alloc(&dst.alloc),
                    super::OwnerRef::Alloc(&src.alloc),
                ],
            )
        })
    }

    /// Copies host `data` into `dst`, ordered on this stream. The host slice is read before the
    /// call returns. Refused while the stream is capturing: a captured copy would keep reading
    /// `data` at every launch, long after the borrow ended.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, dst: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// stream.memcpy_htod(dst, &[1, 2, 3, 4])?; // dst.len() == 4
    /// # Ok(()) }
    /// ```
    pub fn memcpy_htod<T: DeviceCopy>(&self, dst: &DeviceBuffer<T>, data: &[T]) -> Result<()> {
        self.same_context(dst)?;
        if data.len() != dst.len() {
            return Err(Error::invalid(
                Refusal::Size,
                format!(
                    "memcpy_htod of {} elements into a buffer of {}",
                    data.len(),
                    dst.len()
                ),
            ));
        }
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Capture,
                    "memcpy_htod cannot be captured (the graph would read host memory it does not own); copy before capturing, or capture a device-to-device copy",
                ));
            }
            self.after_allocation(rec, dst)?;
            // SAFETY: `data` holds `byte_len` bytes and is read before the synchronize below
            // returns; `dst` is kept alive by the caller's borrow.
            unsafe {
                driver::stream::memcpy_htod_async(
                    dst.device_ptr(),
                    data.as_ptr().cast(),
                    dst.byte_len(),
                    self.raw(),
                )
            }?;
            // Synchronise so the copy is complete when we return and `data` may be freed.
            // The stream is not capturing (checked above, under the slot).
            driver::stream::synchronize(&self.handle)
        })
    }
}

fn check_lens(what: &str, src: usize, dst: usize) -> Result<()> {
    if src != dst {
        return Err(Error::invalid(
            Refusal::Size,
            format!("{what} from {src} elements into {dst}"),
        ));
    }
    Ok(())
}

fn pinned_in_capture(what: &str) -> Error {
    Error::invalid(Refusal::Capture, format!(
        "{what} cannot be captured: a graph launch would use the pinned host memory at times the buffer cannot track; copy outside the capture (before or after launching the graph), or capture device-to-device copies"
    ))
}
