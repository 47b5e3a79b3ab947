//! What every builder holds, whatever its kind and state, and the driver work behind transitions.

use std::sync::Arc;

use cudarc::driver::sys;

use crate::driver::graph::{next_id, GraphHandle, TreeState};
use crate::driver::release::{self, CaptureActive, Restricts};
use crate::driver::stream::CaptureLink;
use crate::driver::stream::{status_out, CaptureStatus};
use crate::driver::{self, DriverVersion};
use crate::error::{Error, Refusal, Result};
use crate::runtime::{Event, OwnCapture, Recording, Stream};

/// The runtime part of a builder.
///
/// `Drop` is what makes faults safe: a builder dropped (or unwound) mid-capture ends its capture,
/// a fork dropped unjoined is joined, and the streams of forks stay alive until the capture ends.
#[derive(Debug)]
pub struct Core {
    pub(crate) stream: Stream,
    /// The graph captured into (a new graph of this crate's, or a conditional body's), kept as
    /// the finished graph once ended.
    pub(crate) graph: Option<Arc<GraphHandle>>,
    /// This builder's own capture (a primary's or a body's; forks record into their parent's).
    pub(crate) capture: Option<u64>,
    /// For a fork: the capture its stream joined (its parent's), which cannot end while the fork
    /// lives (the fork borrows its parent).
    pub(crate) joined: Option<u64>,
    /// Whether this builder's stream is capturing and the capture still needs ending or joining.
    pub(crate) capturing: bool,
    /// For a fork: the stream it joins back into.
    pub(crate) join_into: Option<Stream>,
    /// Held while this builder's own capture is active; see `driver::release`.
    pub(crate) active: Option<CaptureActive>,
    /// A conditional body gets a stream of its own only when its capture begins (until then
    /// `stream` is its parent's, unused), so bodies that are never captured cost no stream.
    pub(crate) new_stream_on_begin: bool,
}

impl Core {
    pub(crate) fn new(stream: Stream) -> Self {
        Core {
            stream,
            graph: None,
            capture: None,
            joined: None,
            capturing: false,
            join_into: None,
            active: None,
            new_stream_on_begin: false,
        }
    }

    /// The capture this builder records into while it is active (its own, for a primary or a
    /// body; its parent's, for a fork): work recorded through the builder then needs only the
    /// tree's lock (`Stream::launch_recorded`).
    #[inline]
    pub(crate) fn own_capture(&self) -> Option<OwnCapture<'_>> {
        match (&self.graph, self.capture.or(self.joined)) {
            (Some(graph), Some(id)) if self.capturing => Some(OwnCapture { graph, id }),
            _ => None,
        }
    }

    /// Begins capture on the stream: into `into` if given (a conditional body's graph,
    /// `cuStreamBeginCaptureToGraph`, driver 12.3), else into a graph the driver makes for the
    /// capture (`cuStreamBeginCapture_v2`, the cheaper path: no graph is created beforehand),
    /// which this crate owns from the start, read from the capture's info.
    pub(crate) fn begin(
        &mut self,
        mode: sys::CUstreamCaptureMode,
        into: Option<Arc<GraphHandle>>,
    ) -> Result<()> {
        // Capture info (`cuStreamGetCaptureInfo_v3`), conditional nodes and the bodies' captures
        // into their graphs all need 12.3; asked once here.
        driver::require(
            "stream capture with the capture's graph readable (cuStreamGetCaptureInfo_v3)",
            DriverVersion::V12_3,
        )?;
        if self.new_stream_on_begin {
            self.stream = self.stream.device().pooled_stream()?;
            self.new_stream_on_begin = false;
        }
        let ctx = self.stream.handle.ctx.clone();
        ctx.bind()?;
        let id = next_id();
        // Before the capture begins: from here on, destroys that would invalidate it wait.
        let active = CaptureActive::new(Restricts::of(mode));
        let mut slot = self.stream.handle.slot();
        let graph = match into {
            Some(graph) => {
                let mut tree = graph.lock();
                if let Some(why) = tree.broken() {
                    return Err(Error::invalid(Refusal::Broken, why.to_string()));
                }
                // SAFETY: stream and graph are live, the graph's tree is locked; no
                // dependencies.
                unsafe {
                    driver::stream::begin_capture_to_graph(
                        self.stream.raw(),
                        graph.raw,
                        std::ptr::null(),
                        std::ptr::null(),
                        0,
                        mode,
                    )
                }?;
                tree.add_capture(id, graph.id);
                drop(tree);
                graph
            }
            None => {
                // SAFETY: the stream is live and not capturing (typestate: a builder that has
                // not begun owns its stream's capture slot); its context is current.
                unsafe { driver::stream::begin_capture(self.stream.raw(), mode) }?;
                let mut raw: sys::CUgraph = std::ptr::null_mut();
                let mut status = 0u32;
                // SAFETY: the stream is live; `status` (written as a `u32`, see `status_out`; the
                // driver requires it) and `raw` are valid out pointers, the other out pointers
                // are null (optional).
                let info = unsafe {
                    driver::stream::capture_info(
                        self.stream.raw(),
                        status_out(&mut status),
                        std::ptr::null_mut(),
                        &mut raw,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
                if info.is_err() || raw.is_null() {
                    // Ends the capture and destroys the graph the driver made for it.
                    self.stream.handle.abandon_capture(false);
                    info?;
                    return Err(Error::Internal(
                        "the driver began a capture but reported no graph for it".into(),
                    ));
                }
                // The graph made by `cuStreamBeginCapture_v2` is the one `cuStreamEndCapture`
                // hands back: owned by whoever ends the capture, here this handle, which ends
                // it (or marks the graph destroyed where the driver destroys it at a failed end).
                let graph = Arc::new(GraphHandle::owned(&ctx, raw));
                graph.lock().add_capture(id, graph.id);
                graph
            }
        };
        *slot = Some(CaptureLink {
            graph: Arc::downgrade(&graph),
            id,
        });
        drop(slot);
        self.graph = Some(graph);
        self.capture = Some(id);
        self.capturing = true;
        self.active = Some(active);
        Ok(())
    }

    /// Ends the capture. On any failure the capture is over, the stream is usable, and the graph
    /// is marked as the driver left it (see [`Core::capture_failed`]).
    pub(crate) fn end(&mut self) -> Result<()> {
        // Asked of the driver (one `cuCtxGetCurrent` per capture): ending a capture worked with
        // no context, or another, current in the GPU tests, but a failed end is costly (the
        // graph is taken for freed by the driver), so it is not left to the thread's note. The
        // bind also refuses a host callback's thread.
        self.stream.handle.ctx.bind_checked()?;
        let ended = self.finish_capture();
        self.active = None;
        ended
    }

    /// Ends this builder's own capture under the stream's slot and the tree's lock (also when the
    /// builder is dropped mid-capture, which ignores the result).
    fn finish_capture(&mut self) -> Result<()> {
        self.capturing = false;
        let (Some(graph), Some(id)) = (self.graph.clone(), self.capture.take()) else {
            return Ok(());
        };
        let mut slot = self.stream.handle.slot();
        let mut tree = graph.lock();
        let mut out = std::ptr::null_mut();
        // SAFETY: the stream is capturing into `graph` (typestate; `!Send` builders end on their
        // thread); the tree is locked.
        let ended = unsafe { driver::stream::end_capture(self.stream.raw(), &mut out) };
        tree.remove_capture(id);
        // The nodes this capture made were made at this epoch or earlier.
        tree.captured_epoch = tree.epoch;
        tree.shape = tree.shape.wrapping_add(1);
        // Events and joined streams held for the capture; dropped once the locks are released
        // (a joined borrowed stream's owner may hold anything, even a `Graph` of this tree).
        // (Most captures hold nothing until their end: an empty map is not searched.)
        let held = if tree.until_end.is_empty() {
            None
        } else {
            tree.until_end.remove(&id)
        };
        *slot = None;
        let r = match ended {
            Ok(()) => {
                drop(tree);
                Ok(())
            }
            Err(e) => {
                Self::capture_failed(&graph, &mut tree);
                drop(tree);
                // In case the driver left the stream capturing.
                self.stream.handle.abandon_capture(true);
                Err(capture_error(e))
            }
        };
        drop(slot);
        drop(held);
        r
    }

    /// A failed end destroys the graph captured into (driver 13.0). For a primary's graph the
    /// handle must not destroy it again; for a conditional body's graph, which a node of the
    /// parent owns, the whole tree is broken: instantiating it or destroying that node crashes
    /// inside the driver, so the crate refuses the first and leaks the root graph.
    fn capture_failed(graph: &GraphHandle, tree: &mut TreeState) {
        tree.mark_dead([graph.id]);
        if graph.is_body() {
            tree.break_with(|| {
                "a conditional body's capture failed (it was invalidated, e.g. by a synchronize on its stream), and the driver destroyed the body graph: the graph holding that conditional node can no longer be instantiated, updated from, embedded or changed; capture it again".to_string()
            });
        } else {
            graph.disown();
        }
    }

    /// The capture's status: `Ok` while active, [`Error::CaptureInvalidated`] once invalidated.
    pub(crate) fn status(&self) -> Result<()> {
        match self.stream.handle.capture_status()? {
            CaptureStatus::Active => Ok(()),
            CaptureStatus::Invalidated => Err(Error::CaptureInvalidated(driver::driver_error(
                sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                "cuStreamIsCapturing",
            ))),
            CaptureStatus::None => Err(Error::invalid(
                Refusal::Capture,
                "the builder's stream is not capturing",
            )),
            CaptureStatus::Unknown(v) => Err(Error::Internal(format!(
                "the builder's stream reports capture status {v}, which this crate does not know"
            ))),
        }
    }

    /// Adds a node to the capture graph after the capture's current dependencies, and makes it
    /// the capture's only dependency, so later work runs after it. Call inside
    /// [`Stream::enqueue`] on this builder's stream, with its [`Recording`].
    pub(crate) fn add_node(
        &self,
        rec: &Recording<'_>,
        params: &mut sys::CUgraphNodeParams,
    ) -> Result<sys::CUgraphNode> {
        if !rec.capturing() {
            self.status()?;
            return Err(Error::invalid(
                Refusal::Capture,
                "the builder's stream is not capturing",
            ));
        }
        let mut status = 0u32;
        let mut graph = std::ptr::null_mut();
        let mut deps: *const sys::CUgraphNode = std::ptr::null();
        let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
        let mut n = 0usize;
        // SAFETY: the stream is live; all out pointers are valid. The status is written into a
        // `u32` (see `status_out`), never read as the bindings' enum.
        unsafe {
            driver::stream::capture_info(
                self.stream.raw(),
                status_out(&mut status),
                std::ptr::null_mut(),
                &mut graph,
                &mut deps,
                &mut edges,
                &mut n,
            )
        }?;
        if CaptureStatus::from_raw(status) != CaptureStatus::Active {
            self.status()?;
        }
        fn copy<T: Copy>(p: *const T, n: usize) -> Vec<T> {
            if p.is_null() || n == 0 {
                Vec::new()
            } else {
                // SAFETY: the driver returns arrays of `n` entries valid until the next capture
                // call on this stream; we copy them at once, under the stream's slot.
                unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
            }
        }
        let (deps, edges) = (copy(deps, n), copy(edges, n));
        let mut node = std::ptr::null_mut();
        let edge_ptr = if edges.is_empty() {
            std::ptr::null()
        } else {
            edges.as_ptr()
        };
        // SAFETY: `graph` is the live capture graph, its tree locked (`rec`); `deps`/`edges`
        // hold `deps.len()` entries; `params` is a valid, fully initialised parameter block.
        unsafe {
            driver::graph::add_node(
                &mut node,
                graph,
                deps.as_ptr(),
                edge_ptr,
                deps.len(),
                params,
            )
        }?;
        let mut set = [node];
        let flags =
            sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32;
        // SAFETY: `set` holds one node of the capture graph.
        unsafe {
            driver::stream::update_capture_dependencies(
                self.stream.raw(),
                set.as_mut_ptr(),
                std::ptr::null(),
                1,
                flags,
            )
        }?;
        Ok(node)
    }

    /// Joins a fork into its parent: the parent's stream waits for the fork's work (the fork's
    /// stream joined the capture, which holds it until it ends). Runs at most once.
    pub(crate) fn finish_fork(&mut self) -> Result<()> {
        self.capturing = false;
        match &self.join_into {
            Some(parent) => self.join_into(parent),
            None => Ok(()),
        }
    }

    /// Makes `into`'s stream wait for everything recorded on this builder's stream so far.
    pub(crate) fn join_into(&self, into: &Stream) -> Result<()> {
        let event: Event = self.stream.device().pooled_event()?;
        self.stream.record(&event)?;
        into.wait(&event)
    }
}

/// An invalidated capture gets its own variant.
pub(crate) fn capture_error(e: Error) -> Error {
    match e {
        Error::Driver(d)
            if d.code() == sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED as u32 =>
        {
            Error::CaptureInvalidated(d)
        }
        e => e,
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if !self.capturing {
            return;
        }
        match &self.join_into {
            // A fork dropped unjoined joins its parent, so the capture is never left unjoined.
            Some(_) => {
                let _ = self.finish_fork();
            }
            // A builder dropped mid-capture ends the capture and discards it.
            None => {
                if self.stream.handle.ctx.bind().is_ok() {
                    let _ = self.finish_capture();
                    self.active = None;
                } else {
                    self.end_elsewhere();
                }
            }
        }
    }
}

impl Core {
    /// Ends the capture of a builder dropped where it cannot be ended: on a host callback's
    /// thread (the driver's, where the bind is refused), it is ended on the release thread, with
    /// the graph alive until then. Only a `Relaxed` capture can get there (a callback owns what
    /// it holds, and builders capturing in the other modes are not `Send`). Any other (the bind
    /// failed for another reason) is left recording, as a forgotten builder's: the graph and the
    /// stream's link to the capture stay, so the driver never records into a freed graph, and
    /// work on the stream goes on into the capture. Dropping the graph here instead left the
    /// driver capturing into it after its destroy.
    fn end_elsewhere(&mut self) {
        let relaxed = self
            .active
            .as_ref()
            .is_some_and(|a| a.restricts() == Restricts::Nothing);
        let rest = Core {
            stream: self.stream.clone(),
            graph: self.graph.take(),
            capture: self.capture.take(),
            joined: self.joined.take(),
            capturing: true,
            join_into: self.join_into.take(),
            active: self.active.take(),
            new_stream_on_begin: false,
        };
        self.capturing = false;
        if relaxed && release::in_host_callback() {
            // Its `Drop`, on the release thread, ends the capture.
            release::later(Box::new(move || drop(rest)));
        } else {
            std::mem::forget(rest);
        }
    }
}
