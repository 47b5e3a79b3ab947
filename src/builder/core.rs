//! What every builder holds, whatever its kind and state, and the driver work behind transitions.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use crate::driver::graph::GraphHandle;
use crate::driver::release::CaptureActive;
use crate::driver::stream::{status_out, CaptureStatus};
use crate::driver::{self, drv, DriverVersion};
use crate::error::{Error, Result};
use crate::runtime::{Event, Stream};

/// How a capture ends up in a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// `cuStreamBeginCapture_v2`: the driver makes the graph, handed over at the end (drivers
    /// before 12.3).
    DriverGraph,
    /// `cuStreamBeginCaptureToGraph` into `Core::graph`, which this crate owns from the start.
    OwnGraph,
}

/// The runtime part of a builder.
///
/// `Drop` is what makes faults safe: a builder dropped (or unwound) mid-capture ends its capture,
/// a fork dropped unjoined is joined, and the streams of forks stay alive until the capture ends.
#[derive(Debug)]
pub struct Core {
    pub(crate) stream: Stream,
    /// The capture target (`OwnGraph`), or the finished graph once ended.
    pub(crate) graph: Option<Arc<GraphHandle>>,
    pub(crate) target: Target,
    /// Whether this builder's stream is capturing and the capture still needs ending or joining.
    pub(crate) capturing: bool,
    /// For a fork: the stream it joins back into.
    pub(crate) join_into: Option<Stream>,
    /// Held while this builder's own capture (not a fork's) is active; see `driver::release`.
    pub(crate) active: Option<CaptureActive>,
    /// Streams of forks that recorded into this capture; they must outlive it. Shared by a
    /// capture's root and all its forks.
    pub(crate) streams: Arc<Mutex<Vec<Stream>>>,
}

impl Core {
    pub(crate) fn new(stream: Stream) -> Self {
        Core {
            stream,
            graph: None,
            target: Target::DriverGraph,
            capturing: false,
            join_into: None,
            active: None,
            streams: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub(crate) fn driver(&self) -> Result<DriverVersion> {
        driver::loaded()
    }

    /// Begins capture on the stream: into `into` if given (a conditional body), else into a graph
    /// of our own (12.3+), else into a driver-made graph.
    pub(crate) fn begin(
        &mut self,
        mode: sys::CUstreamCaptureMode,
        into: Option<Arc<GraphHandle>>,
    ) -> Result<()> {
        let active = CaptureActive::new();
        let ctx = &self.stream.handle.ctx;
        ctx.bind()?;
        let raw = self.stream.raw();
        let into = match into {
            Some(g) => Some(g),
            None if self.driver()? >= DriverVersion::V12_3 => Some(GraphHandle::create(ctx)?),
            None => None,
        };
        match into {
            Some(graph) => {
                // Definitions of this graph (a conditional body's) keep off it while it captures.
                graph.set_capturing();
                // SAFETY: stream and graph are live; no dependencies are passed.
                let begun = unsafe {
                    drv!(cuStreamBeginCaptureToGraph(
                        raw,
                        graph.raw,
                        std::ptr::null(),
                        std::ptr::null(),
                        0,
                        mode
                    ))
                };
                if let Err(e) = begun {
                    graph.capture_ended(false);
                    return Err(e);
                }
                self.graph = Some(graph);
                self.target = Target::OwnGraph;
            }
            None => {
                // SAFETY: the stream is live.
                unsafe { drv!(cuStreamBeginCapture_v2(raw, mode)) }?;
                self.target = Target::DriverGraph;
            }
        }
        self.capturing = true;
        self.active = Some(active);
        Ok(())
    }

    /// Ends the capture. On any failure the capture is over, whatever it made is destroyed (unless
    /// it belongs to a parent node) and the stream is usable.
    pub(crate) fn end(&mut self) -> Result<()> {
        self.stream.handle.ctx.bind()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (typestate) on this thread or in relaxed mode.
        let ended = unsafe { drv!(cuStreamEndCapture(self.stream.raw(), &mut graph)) };
        self.capturing = false;
        let _active = self.active.take();
        let mut destroyed = false;
        let result = match ended {
            Ok(()) => {
                if self.target == Target::DriverGraph {
                    self.graph = Some(Arc::new(GraphHandle::owned(&self.stream.handle.ctx, graph)));
                }
                self.release_streams();
                Ok(())
            }
            Err(e) => {
                if !graph.is_null() && self.target == Target::DriverGraph {
                    // SAFETY: the driver handed us this graph and nothing else refers to it.
                    unsafe { crate::driver::drv_drop!(cuGraphDestroy(graph)) };
                }
                // A failed end destroys a graph captured into; ours must not destroy it again.
                if let (Target::OwnGraph, Some(g)) = (self.target, &self.graph) {
                    g.disown();
                    destroyed = true;
                }
                // In case the driver left the stream capturing.
                self.stream
                    .handle
                    .abandon_capture(self.target == Target::OwnGraph);
                self.release_streams();
                Err(capture_error(e))
            }
        };
        self.capture_over(destroyed);
        result
    }

    /// The capture's status: `Ok` while active, [`Error::CaptureInvalidated`] once invalidated.
    pub(crate) fn status(&self) -> Result<()> {
        match self.stream.handle.capture_status()? {
            CaptureStatus::Active => Ok(()),
            CaptureStatus::Invalidated => Err(Error::CaptureInvalidated(driver::driver_error(
                sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                "cuStreamIsCapturing",
            ))),
            CaptureStatus::None => Err(Error::InvalidArgument(
                "the builder's stream is not capturing".into(),
            )),
            CaptureStatus::Unknown(v) => Err(Error::InvalidArgument(format!(
                "the builder's stream reports capture status {v}, which this crate does not know"
            ))),
        }
    }

    /// The graph being captured into, with the dependencies of the capture's next node.
    pub(crate) fn capture_info(
        &self,
    ) -> Result<(
        sys::CUgraph,
        Vec<sys::CUgraphNode>,
        Vec<sys::CUgraphEdgeData>,
    )> {
        driver::require("adding nodes to a capture", DriverVersion::V12_3)?;
        self.stream.handle.ctx.bind()?;
        let mut status = CaptureStatus::NONE_RAW;
        let mut graph = std::ptr::null_mut();
        let mut deps: *const sys::CUgraphNode = std::ptr::null();
        let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
        let mut n = 0usize;
        // SAFETY: the stream is live; all out pointers are valid; the status is written into a
        // `u32` (see `status_out`), never read as the bindings' enum.
        unsafe {
            drv!(cuStreamGetCaptureInfo_v3(
                self.stream.raw(),
                status_out(&mut status),
                std::ptr::null_mut(),
                &mut graph,
                &mut deps,
                &mut edges,
                &mut n
            ))
        }?;
        if CaptureStatus::from_raw(status) != CaptureStatus::Active {
            self.status()?;
        }
        fn copy<T: Copy>(p: *const T, n: usize) -> Vec<T> {
            if p.is_null() || n == 0 {
                Vec::new()
            } else {
                // SAFETY: the driver returns arrays of `n` entries valid until the next capture call;
                // we copy them at once.
                unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
            }
        }
        Ok((graph, copy(deps, n), copy(edges, n)))
    }

    /// Adds a node to the capture graph after the capture's current dependencies, and makes it the
    /// capture's only dependency, so later work runs after it.
    pub(crate) fn add_node(&self, params: &mut sys::CUgraphNodeParams) -> Result<sys::CUgraphNode> {
        let (graph, deps, edges) = self.capture_info()?;
        let mut node = std::ptr::null_mut();
        let edge_ptr = if edges.is_empty() {
            std::ptr::null()
        } else {
            edges.as_ptr()
        };
        // SAFETY: `graph` is the live capture graph; `deps`/`edges` hold `deps.len()` entries;
        // `params` is a valid, fully initialised parameter block.
        unsafe {
            drv!(cuGraphAddNode_v2(
                &mut node,
                graph,
                deps.as_ptr(),
                edge_ptr,
                deps.len(),
                params
            ))
        }?;
        let mut set = [node];
        let flags =
            sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32;
        // SAFETY: `set` holds one node of the capture graph.
        unsafe {
            drv!(cuStreamUpdateCaptureDependencies_v2(
                self.stream.raw(),
                set.as_mut_ptr(),
                std::ptr::null(),
                1,
                flags
            ))
        }?;
        Ok(node)
    }

    /// Joins a fork into its parent: the parent's stream waits for the fork's work, and the fork's
    /// stream is kept alive until the capture ends. Runs at most once.
    pub(crate) fn finish_fork(&mut self) -> Result<()> {
        self.capturing = false;
        if let Ok(mut s) = self.streams.lock() {
            s.push(self.stream.clone());
        }
        match &self.join_into {
            Some(parent) => self.join_into(parent),
            None => Ok(()),
        }
    }

    /// Makes `into`'s stream wait for everything recorded on this builder's stream so far.
    pub(crate) fn join_into(&self, into: &Stream) -> Result<()> {
        let event: Event = self.stream.device().create_event()?;
        self.stream.record(&event)?;
        into.wait(&event)
    }

    /// Lets definitions of the capture's graph use it again — or, if the driver destroyed the
    /// graph with a failed capture, refuses them for good.
    fn capture_over(&self, destroyed: bool) {
        if let (Target::OwnGraph, Some(g)) = (self.target, &self.graph) {
            g.capture_ended(destroyed);
        }
    }

    fn release_streams(&self) {
        if let Ok(mut s) = self.streams.lock() {
            s.clear();
        }
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
                self.capturing = false;
                let own = self.target == Target::OwnGraph;
                let survived = self.stream.handle.abandon_capture(own);
                if !survived && own {
                    if let Some(g) = &self.graph {
                        g.disown();
                    }
                }
                self.capture_over(!survived);
                self.active = None;
            }
        }
    }
}
