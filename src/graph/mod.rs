//! The executable layer: [`Graph`] (a `CUgraphExec`), its options, update and DOT output.

use std::ffi::CString;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub(crate) use crate::driver::sync::lock;

use cudarc::driver::sys;

use crate::core::source::FinishedGraph;
use crate::driver::graph::{ExecHandle, ExecRef, GraphHandle, KeepChunk};
use crate::driver::{self, compat, DriverVersion};
use crate::error::{Error, InstantiateFailure, Refusal, Result, UpdateFailure};
use crate::runtime::Stream;

mod cache;
mod debug;
mod device_graph;
mod options;
mod set;
pub(crate) mod state;
pub use cache::{CacheOutcome, GraphCache};
pub(crate) use debug::dot_print;
pub use debug::{DotDetail, GraphDebugPrintOptions};
pub use device_graph::DeviceGraph;
use device_graph::DeviceLaunchKeep;
pub use options::InstantiateOptions;
pub use set::{GraphSet, GraphSetStats};
pub(crate) use state::ExecState;
use state::{release_unused, Caller, GraphMemoryUser, InstantiatedNodes};

/// An executable graph (`CUgraphExec`): launch it as often as you like.
///
/// Made by [`GraphBuilder::instantiate`](crate::GraphBuilder::instantiate) or
/// [`GraphDefinition::instantiate`](crate::GraphDefinition::instantiate). It holds everything its
/// nodes use (a snapshot of its graph's keep set), so it runs after the builder and every buffer
/// handle are dropped. Dropping it never waits: the exec, the graph it was instantiated from and
/// what it held are released on a background thread once its last launch has finished.
/// `Send + Sync`.
#[must_use = "an executable graph does nothing until it is launched"]
pub struct Graph {
    // Crate-visible for the per-node updates, which live with the definition's node types
    // (`definition::exec_nodes`) so that this layer does not depend on the definition's.
    pub(crate) exec: ExecHandle,
    /// The graphs of successful updates: the exec may use their operands.
    pub(crate) state: Mutex<ExecState>,
    /// Whether a [`DeviceGraph`] handle was made ([`Graph::has_device_handle`] reads it without
    /// the lock, so that a host callback asking it never waits for a launch).
    device_handled: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("exec", &self.exec.raw)
            .finish_non_exhaustive()
    }
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` with `result_out` as the integer it is in C, so a result a
/// newer driver writes there is not undefined behaviour (the bindings' field is a Rust enum).
#[repr(C)]
struct InstantiateParams {
    flags: u64,
    upload_stream: sys::CUstream,
    err_node_out: sys::CUgraphNode,
    /// A `CUgraphInstantiateResult`.
    result_out: u32,
}

static_assertions::assert_eq_size!(InstantiateParams, sys::CUDA_GRAPH_INSTANTIATE_PARAMS);
static_assertions::assert_eq_align!(InstantiateParams, sys::CUDA_GRAPH_INSTANTIATE_PARAMS);
static_assertions::assert_eq_size!(u32, sys::CUgraphInstantiateResult);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(InstantiateParams, flags),
    std::mem::offset_of!(sys::CUDA_GRAPH_INSTANTIATE_PARAMS, flags)
);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(InstantiateParams, upload_stream),
    std::mem::offset_of!(sys::CUDA_GRAPH_INSTANTIATE_PARAMS, hUploadStream)
);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(InstantiateParams, err_node_out),
    std::mem::offset_of!(sys::CUDA_GRAPH_INSTANTIATE_PARAMS, hErrNode_out)
);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(InstantiateParams, result_out),
    std::mem::offset_of!(sys::CUDA_GRAPH_INSTANTIATE_PARAMS, result_out)
);

/// `CUgraphExecUpdateResultInfo` with `result` as the integer it is in C (see
/// [`InstantiateParams`]).
#[repr(C)]
struct UpdateResultInfo {
    /// A `CUgraphExecUpdateResult`.
    result: u32,
    error_node: sys::CUgraphNode,
    error_from_node: sys::CUgraphNode,
}

static_assertions::assert_eq_size!(UpdateResultInfo, sys::CUgraphExecUpdateResultInfo);
static_assertions::assert_eq_align!(UpdateResultInfo, sys::CUgraphExecUpdateResultInfo);
static_assertions::assert_eq_size!(u32, sys::CUgraphExecUpdateResult);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(UpdateResultInfo, result),
    std::mem::offset_of!(sys::CUgraphExecUpdateResultInfo, result)
);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(UpdateResultInfo, error_node),
    std::mem::offset_of!(sys::CUgraphExecUpdateResultInfo, errorNode)
);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(UpdateResultInfo, error_from_node),
    std::mem::offset_of!(sys::CUgraphExecUpdateResultInfo, errorFromNode)
);

/// The failure a `CUgraphInstantiateResult` value stands for; `None` for success.
fn instantiate_failure(v: u32) -> Option<InstantiateFailure> {
    use sys::CUgraphInstantiateResult::*;
    const TABLE: [(u32, InstantiateFailure); 5] = [
        (
            CUDA_GRAPH_INSTANTIATE_ERROR as u32,
            InstantiateFailure::InvalidStructure,
        ),
        (
            CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE as u32,
            InstantiateFailure::InvalidGraphStructure,
        ),
        (
            CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED as u32,
            InstantiateFailure::NodeOperationNotSupported,
        ),
        (
            CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED as u32,
            InstantiateFailure::MultipleContextsNotSupported,
        ),
        (
            compat::INSTANTIATE_CONDITIONAL_HANDLE_UNUSED,
            InstantiateFailure::ConditionalHandleUnused,
        ),
    ];
    if v == CUDA_GRAPH_INSTANTIATE_SUCCESS as u32 {
        return None;
    }
    Some(
        TABLE
            .iter()
            .find(|(r, _)| *r == v)
            .map_or(InstantiateFailure::Other(v), |(_, f)| *f),
    )
}

/// The failure a `CUgraphExecUpdateResult` value stands for; `None` for success.
fn update_failure(v: u32) -> Option<UpdateFailure> {
    use sys::CUgraphExecUpdateResult::*;
    const TABLE: [(sys::CUgraphExecUpdateResult, UpdateFailure); 8] = [
        (CU_GRAPH_EXEC_UPDATE_ERROR, UpdateFailure::Error),
        (
            CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
            UpdateFailure::TopologyChanged,
        ),
        (
            CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED,
            UpdateFailure::NodeTypeChanged,
        ),
        (
            CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED,
            UpdateFailure::FunctionChanged,
        ),
        (
            CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED,
            UpdateFailure::ParametersChanged,
        ),
        (
            CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED,
            UpdateFailure::NotSupported,
        ),
        (
            CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE,
            UpdateFailure::UnsupportedFunctionChange,
        ),
        (
            CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED,
            UpdateFailure::AttributesChanged,
        ),
    ];
    if v == CU_GRAPH_EXEC_UPDATE_SUCCESS as u32 {
        return None;
    }
    Some(
        TABLE
            .iter()
            .find(|(r, _)| *r as u32 == v)
            .map_or(UpdateFailure::Other(v), |(_, f)| *f),
    )
}

impl Graph {
    /// Takes the exec's lock ([`Rank::Exec`](crate::driver::lock_rank::Rank::Exec): before any
    /// stream slot or tree lock).
    #[inline]
    pub(crate) fn lock_state(
        &self,
    ) -> crate::driver::lock_rank::Ranked<std::sync::MutexGuard<'_, ExecState>> {
        use crate::driver::lock_rank::{Rank, Ranked};
        Ranked::take(Rank::Exec, 0, || lock(&self.state))
    }

    /// `cuGraphInstantiateWithParams`, with `result_out` checked before the exec is wrapped.
    pub(crate) fn instantiate(
        graph: &Arc<GraphHandle>,
        options: &InstantiateOptions,
    ) -> Result<Graph> {
        driver::require("cuGraphInstantiateWithParams", DriverVersion::V12_0)?;
        match &options.upload_stream {
            // Checked as `upload` checks its stream, before any driver call: an upload into a
            // capturing stream would fail the instantiation and invalidate that capture.
            Some(stream) => {
                check_same_device(graph.ctx.device, stream, "uploaded")?;
                stream.enqueue(|rec| {
                    if rec.capturing() {
                        return Err(launch_in_capture("uploaded"));
                    }
                    Self::instantiate_now(graph, options)
                })
            }
            None => Self::instantiate_now(graph, options),
        }
    }

    /// [`instantiate`](Self::instantiate) once its upload stream (if any) was checked and its
    /// capture slot is held.
    fn instantiate_now(graph: &Arc<GraphHandle>, options: &InstantiateOptions) -> Result<Graph> {
        graph.ctx.bind()?;
        let mut params = InstantiateParams {
            flags: options.flags(),
            upload_stream: options
                .upload_stream
                .as_ref()
                .map_or(std::ptr::null_mut(), |s| s.raw()),
            err_node_out: std::ptr::null_mut(),
            result_out: sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS as u32,
        };
        let mut exec = std::ptr::null_mut();
        let mut tree = graph.lock();
        tree.check_complete()?;
        // Nodes made from here on are not this exec's.
        tree.epoch += 1;
        let epoch = tree.epoch;
        // The exec holds what the graph's nodes use now, until its last launch has finished.
        let keep = tree.snapshot();
        let instantiated_nodes = tree
            .nodes
            .owners_chunk_indexed()
            .map(|(chunk, index)| InstantiatedNodes::Shared(chunk, index));
        let pending_ready = driver::memory::ready_events(keep.iter().flat_map(|c| c.iter()));
        let unfreed: Vec<u64> = tree.unfreed.values().copied().collect();
        let instantiated = state::Instantiated {
            id: graph.id,
            raw: graph.raw as usize,
            shape: tree.shape,
            read: None,
            restructured: false,
        };
        let memory_user =
            (!tree.memory_graphs.is_empty()).then(|| GraphMemoryUser::new(graph.ctx.device));
        let programmatic = tree.programmatic;
        // SAFETY: `graph` is live and its tree locked; `params` is fully initialised and has the
        // layout of `CUDA_GRAPH_INSTANTIATE_PARAMS` (asserted above), with `result_out` a `u32`
        // that is never read as the bindings' enum; `exec` is a valid out pointer.
        let r = unsafe {
            driver::graph::instantiate_with_params(
                &mut exec,
                graph.raw,
                (&mut params as *mut InstantiateParams).cast(),
            )
        };
        drop(tree);
        if let Some(reason) = instantiate_failure(params.result_out) {
            if !exec.is_null() {
                // SAFETY: an exec returned despite a failure result is ours to destroy.
                let _ = unsafe { driver::graph::exec_destroy(exec) };
            }
            return Err(Error::Instantiate {
                reason,
                source: r.err().and_then(|e| e.driver_error().cloned()),
            });
        }
        r?;
        if exec.is_null() {
            return Err(Error::Internal("instantiation returned no exec".into()));
        }
        Ok(Graph {
            exec: ExecHandle {
                ctx: graph.ctx.clone(),
                raw: exec,
            },
            state: Mutex::new(ExecState {
                source: Some(ExecRef::new(graph.root())),
                keep,
                unfreed,
                epoch,
                pending_ready,
                device_launch: options.device_launch,
                memory_user,
                programmatic,
                instantiated_nodes,
                instantiated,
                ..ExecState::default()
            }),
            device_handled: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Launches the graph on `stream` (`cuGraphLaunch`).
    ///
    /// Launches of one `Graph` are serialised (CUDA does not synchronise an exec); they run on
    /// the GPU in launch order, on whatever streams: a launch on another stream than the one
    /// before waits for that one (an event recorded on its stream). Launching into a stream that
    /// is capturing is refused: embed the graph into the capture instead
    /// ([`GraphBuilder::add_child_graph`](crate::GraphBuilder::add_child_graph)); so is a launch
    /// on another stream while the previous launch's stream captures ([`Refusal::Capture`]).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(graph: &Graph, stream: &Stream) -> cuda_graph::Result<()> {
    /// for _ in 0..100 {
    ///     graph.launch(stream)?;
    /// }
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        // Before the exec's lock (see `refuse_in_host_callback`).
        driver::context::refuse_in_host_callback()?;
        check_same_device(self.exec.ctx.device, stream, "launched")?;
        let mut state = self.lock_state();
        let chain = state.chain_to(&self.exec.ctx, stream)?;
        stream.enqueue(|rec| {
            if rec.capturing() {
                return Err(launch_in_capture("launched"));
            }
            // Stream-ordered allocations the exec uses exist (and are zeroed) before it runs.
            state.wait_pending_ready(stream.raw())?;
            if let Some(chain) = &chain {
                // After the latest launch, on its stream.
                // SAFETY: the stream and the event are live, of the exec's context.
                unsafe { driver::stream::wait_event(stream.raw(), chain.raw, 0) }?;
            }
            // SAFETY: exec and stream are live; the exec's lock is held.
            unsafe { driver::graph::launch(self.exec.raw, stream.raw()) }?;
            // Later launches are ordered after this one.
            state.pending_ready.clear();
            Ok(())
        })?;
        let previous = state.last_stream.replace(stream.clone());
        state.launched_since_update = true;
        drop(state);
        // The stream launched on before may have been its last handle: a stream made from the
        // caller's (`Stream::from_raw`, `from_cudarc`) then drops its owner, whose `Drop` may
        // call back into the crate, this exec included. Dropped with no lock held.
        drop(previous);
        Ok(())
    }

    /// Uploads the graph's work to the device ahead of the first launch (`cuGraphUpload`).
    /// Refused on a capturing stream, as [`launch`](Self::launch).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(graph: &Graph, stream: &Stream) -> cuda_graph::Result<()> {
    /// graph.upload(stream)?; // the first launch then starts sooner
    /// graph.launch(stream)?;
    /// # Ok(()) }
    /// ```
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        // Before the exec's lock (see `refuse_in_host_callback`).
        driver::context::refuse_in_host_callback()?;
        check_same_device(self.exec.ctx.device, stream, "uploaded")?;
        let _state = self.lock_state();
        stream.enqueue(|rec| {
            if rec.capturing() {
                return Err(launch_in_capture("uploaded"));
            }
            // SAFETY: exec and stream are live; the exec's lock is held.
            unsafe { driver::graph::upload(self.exec.raw, stream.raw()) }
        })
    }

    /// A handle that device code can launch this exec with (`cudaGraphLaunch` in a kernel, device
    /// graph launch): pass it to the kernel as its `cudaGraphExec_t` argument. The exec must be
    /// instantiated with [`InstantiateOptions::device_launch`]; the first call uploads it
    /// (`cuGraphUpload`, waited for), as device launch requires.
    ///
    /// A typed kernel ([`Kernel`](crate::Kernel) with a `DeviceGraph` parameter) that takes it
    /// is refused on a plain stream — device launch needs the launching kernel to run in a graph
    /// — and refused with a handle of another device; the exec must hold only kernel, memcpy
    /// and memset nodes on one device (instantiation refuses other nodes). Through the untyped
    /// `launch_unchecked` / `add_kernel_unchecked`, CUDA's rules are the caller's.
    ///
    /// Once a handle exists the exec is launched by device code whenever a graph holding it runs,
    /// which the host cannot see: [`update`](Self::update),
    /// [`set_params`](Self::set_params) and [`set_enabled`](Self::set_enabled) are refused from
    /// then on, and the exec (with what it uses) lives until this `Graph` and every graph holding
    /// the handle are dropped and their launches have finished.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(inner: &GraphDefinition, outer: &GraphDefinition, launcher: &Function) -> cuda_graph::Result<()> {
    /// let options = InstantiateOptions::new().device_launch(true);
    /// let child = inner.instantiate_with(&options)?;
    /// let args = KernelArgs::new().arg(child.device_handle()?);
    /// // SAFETY: `launcher(cudaGraphExec_t g)` calls cudaGraphLaunch(g, cudaStreamGraphFireAndForget).
    /// unsafe { outer.add_kernel_unchecked(&[], launcher, LaunchConfig::single(), &args)? };
    /// # Ok(()) }
    /// ```
    pub fn device_handle(&self) -> Result<DeviceGraph> {
        // Before the exec's lock (see `refuse_in_host_callback`).
        driver::context::refuse_in_host_callback()?;
        let mut state = self.lock_state();
        if !state.device_launch {
            return Err(Error::invalid(
                Refusal::Unsupported,
                "this exec was not instantiated for device launch: instantiate it with InstantiateOptions::new().device_launch(true)",
            ));
        }
        let keep = match &state.device_keep {
            Some(keep) => keep.clone(),
            None => {
                let ctx = &self.exec.ctx;
                ctx.bind()?;
                let setup = ctx.setup_stream()?;
                // Device code may launch the exec from now on: its stream-ordered allocations
                // must exist first (waited for below, with the upload).
                state.wait_pending_ready(setup)?;
                // SAFETY: the exec and the context's setup stream are live; the exec's lock is
                // held; the setup stream is never captured.
                unsafe { driver::graph::upload(self.exec.raw, setup) }?;
                // SAFETY: as above.
                unsafe { driver::stream::synchronize_raw(setup) }?;
                // The allocations exist now, for every launch to come.
                state.pending_ready.clear();
                let keep = Arc::new(DeviceLaunchKeep::default());
                state.device_keep = Some(keep.clone());
                self.device_handled
                    .store(true, std::sync::atomic::Ordering::Release);
                keep
            }
        };
        Ok(DeviceGraph {
            raw: self.exec.raw as u64,
            keep,
            device: self.exec.ctx.device,
        })
    }

    /// Whether [`device_handle`](Self::device_handle) handed out a handle (the exec then refuses
    /// updates).
    ///
    /// ```no_run
    /// # fn f(g: &cuda_graph::Graph) -> cuda_graph::Result<()> {
    /// let handle = g.device_handle()?;
    /// assert!(g.has_device_handle());
    /// # Ok(()) }
    /// ```
    pub fn has_device_handle(&self) -> bool {
        self.device_handled
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Updates the exec's node parameters from `source` — an ended primary builder or a
    /// `GraphDefinition` with the same topology
    /// (`cuGraphExecUpdate_v2`).
    ///
    /// On failure the error names the reason (e.g. [`UpdateFailure::TopologyChanged`]) and the
    /// exec is unchanged: it keeps working as before, with its own operands. On success the exec
    /// keeps `source`'s operands alive, and what it used before (what it was instantiated with,
    /// an earlier source's, per-node parameters) is released once the launches made before the
    /// update have finished. The exec's source and devices must match: a source of another
    /// device is refused.
    ///
    /// After the update, per-node updates ([`set_params`](Self::set_params),
    /// [`set_enabled`](Self::set_enabled)) take `source`'s own nodes as well as those of the
    /// graph the exec was instantiated from: each names the exec node the update paired it with
    /// (see `set_params` for when they are refused). An update from the graph the exec was
    /// instantiated from, made after that graph's structure changed (a node or edge added or
    /// removed), pairs its nodes by their new places, so from then on its nodes are refused.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(graph: &Graph, next_step: &GraphBuilder<Primary, Ended>) -> cuda_graph::Result<()> {
    /// match graph.update(next_step) {
    ///     Ok(()) => {
    ///         // Same topology: parameters taken over, and the step's nodes name the exec's.
    ///         // Switch off the node that runs first.
    ///         let view = next_step.graph_definition()?;
    ///         for node in view.nodes()? {
    ///             if view.predecessors(&node)?.is_empty() {
    ///                 graph.set_enabled(&node, false)?;
    ///             }
    ///         }
    ///     }
    ///     Err(Error::Update { reason, .. }) => println!("instantiate again: {reason}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn update(&self, source: &impl FinishedGraph) -> Result<()> {
        // Before the exec's lock (see `refuse_in_host_callback`).
        driver::context::refuse_in_host_callback()?;
        let graph = source.finished_graph()?;
        if graph.ctx.device != self.exec.ctx.device {
            return Err(Error::invalid(Refusal::OtherDevice, format!(
                "this exec belongs to device {} and the update's source graph to device {}: an exec can only take the parameters of a graph of its own device (instantiate the source instead)",
                self.exec.ctx.device, graph.ctx.device
            )));
        }
        let mut state = self.lock_state();
        state.check_not_device_launched()?;
        self.exec.ctx.bind()?;
        let mut info = UpdateResultInfo {
            result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS as u32,
            error_node: std::ptr::null_mut(),
            error_from_node: std::ptr::null_mut(),
        };
        let mut tree = graph.lock();
        tree.check_complete()?;
        if graph.id != state.instantiated.id
            && (state.memory_user.is_some() || !tree.memory_graphs.is_empty())
        {
            // Graph memory belongs to one graph and its exec: its allocation nodes' addresses are
            // fixed. After an update from another graph with memory nodes this exec would
            // allocate that graph's addresses (which its own exec allocates too, and which this
            // exec would not free when dropped); its kernels would address memory this exec does
            // not map; and this exec's own allocations would be left to the other graph's nodes.
            return Err(Error::Update {
                reason: UpdateFailure::GraphMemory,
                source: None,
            });
        }
        if state.programmatic || tree.programmatic {
            // The driver's update compares nodes and dependencies, not the kind of an edge:
            // an exec's programmatic edge could end up in front of a kernel that does not wait.
            return Err(Error::Update {
                reason: UpdateFailure::Programmatic,
                source: None,
            });
        }
        // SAFETY: exec and graph are live, the graph's tree locked; `info` is a valid out pointer
        // with the layout of `CUgraphExecUpdateResultInfo` (asserted above), its `result` a `u32`
        // that is never read as the bindings' enum.
        let r = unsafe {
            driver::graph::exec_update(
                self.exec.raw,
                graph.raw,
                (&mut info as *mut UpdateResultInfo).cast(),
            )
        };
        // What the source's nodes use now: the exec uses it from here on, whatever happens to
        // the source's nodes later.
        let keep = if r.is_ok() && update_failure(info.result).is_none() {
            tree.snapshot()
        } else {
            Vec::new()
        };
        let ready = driver::memory::ready_events(keep.iter().flat_map(|c| c.iter()));
        let shape = tree.shape;
        drop(tree);
        let failure = update_failure(info.result);
        if failure.is_some() || r.is_err() {
            return Err(Error::Update {
                // A failed call with a success result: the raw result, with the call's error.
                reason: failure.unwrap_or(UpdateFailure::Other(info.result)),
                source: r.err().and_then(|e| e.driver_error().cloned()),
            });
        }
        // Launches made so far may still use the previous source's operands, the parameters of
        // per-node updates and what the exec was instantiated with, all of which the update
        // replaced (it sets every node's parameters).
        let replaced_nodes = std::mem::take(&mut state.node_owners);
        // The graph the exec was instantiated from stays (its node tokens name the exec's nodes
        // for per-node updates); where the exec is its only holder, what its nodes use goes.
        let from_source = match &state.source {
            Some(source) if source.only_execs_hold(0) => source.lock().take_operands(),
            _ => Vec::new(),
        };
        let instantiated = (
            std::mem::take(&mut state.keep),
            state.instantiated_nodes.take(),
            from_source,
        );
        if !replaced_nodes.is_empty()
            || !instantiated.0.is_empty()
            || instantiated.1.is_some()
            || !instantiated.2.is_empty()
        {
            state.release_after_last_launch(Box::new((replaced_nodes, instantiated)));
        }
        let root = graph.root();
        // Per-node updates may name the nodes of a source from another tree from now on; those
        // of the instantiation's own tree name the exec's nodes already, unless its structure
        // changed since the instantiation: the driver then paired its nodes by their new places.
        state.latest = match &state.source {
            Some(source) if !Arc::ptr_eq(source, &root) => Some(state::Latest {
                id: graph.id,
                raw: graph.raw as usize,
                shape,
                pairs: None,
            }),
            _ => {
                state.instantiated.restructured |= shape != state.instantiated.shape;
                None
            }
        };
        let mut unused = None;
        if let Some(previous) = state.current.replace((ExecRef::new(root), keep)) {
            if state.launched_since_update {
                state.release_after_last_launch(Box::new(previous));
            } else {
                unused = Some(previous);
            }
        }
        state.launched_since_update = false;
        state.add_pending_ready(ready);
        drop(state);
        if let Some(previous) = unused {
            // Never launched while it was current: nothing uses it. Released here with no lock
            // held, as an idle exec's operands are when it is dropped; handing it to the
            // release thread would cost every update a wake-up of that thread (see
            // performance.md for how update costs are measured).
            release_unused(Box::new(previous));
        }
        Ok(())
    }
}

/// Runs `job` on the release thread once `stream` has no capture and its queued work is done,
/// waiting for that on a thread of its own (the fallback when no host function can be queued).
/// If that thread cannot start, the job is leaked rather than run early.
fn release_when_idle(stream: Stream, job: crate::driver::release::Job) {
    let slot = Arc::new(Mutex::new(Some(job)));
    let for_thread = slot.clone();
    let spawned = std::thread::Builder::new()
        .name("cuda-graph-fence".into())
        .spawn(move || {
            let job = lock(&for_thread).take();
            if crate::driver::stream::wait_until_idle(&stream.handle) {
                if let Some(job) = job {
                    crate::driver::release::later(job);
                }
            } else {
                // Never run early: the launch may still use what the job releases.
                std::mem::forget(job);
            }
        });
    if spawned.is_err() {
        // Never run early: what the job releases may still be in use.
        std::mem::forget(lock(&slot).take());
    }
}

/// Refuses a stream of another device than the exec's (`device`), for an exec to be `what`.
fn check_same_device(device: sys::CUdevice, stream: &Stream, what: &str) -> Result<()> {
    let theirs = stream.handle.ctx.device;
    if theirs != device {
        return Err(Error::invalid(Refusal::OtherDevice, format!(
            "this exec belongs to device {device} and cannot be {what} on a stream of device {theirs}: use a stream of the exec's device"
        )));
    }
    Ok(())
}

fn launch_in_capture(what: &str) -> Error {
    Error::invalid(Refusal::Capture, format!(
        "an executable graph cannot be {what} into a stream capture: embed the graph into the capture instead (`builder.add_child_graph(&ended_builder)` or a definition's `add_child_graph`)"
    ))
}

impl Drop for Graph {
    fn drop(&mut self) {
        // The exec and what this handle holds for its launches (its source graph, adopted
        // update sources, graph memory left allocated) are released after the last launch.
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let unfreed = std::mem::take(&mut state.unfreed);
        // The exec is destroyed first, then the graphs it came from, in that order on one
        // thread: driver 13.0 crashed in `cuGraphExecDestroy` of an exec with a conditional node
        // while another thread destroyed its source graph (the soak's conditional loop).
        // The exec is destroyed under its source graph's tree lock: driver 13.0 also crashed
        // when an exec was destroyed on the release thread while the main thread added and
        // destroyed nodes of the definition it came from (the soak's edit loop).
        //
        // An exec that handed out device handles is parked in their keep-alive until the last
        // graph holding one goes; a graph that holds one may be the exec's own source (a kernel
        // that device-launches an exec of the definition it is added to), so the parked release
        // holds its source graphs weakly: else that graph would hold itself and leak. Nothing
        // is lost: such an exec has only kernel, memcpy and memset nodes (device launch refuses
        // others), so it uses no conditional handle of its source, and CUDA's execs do not depend
        // on the graph they came from; the exec is still destroyed under the source's lock if
        // the source lives, and before it.
        let parked = state.device_keep.is_some();
        let source = state.source.take();
        let current = state.current.take();
        let (source, current): (SourceRef, Option<(SourceRef, Vec<KeepChunk>)>) = if parked {
            (
                SourceRef::weak(source.as_deref()),
                current.map(|(root, keep)| (SourceRef::weak(Some(&root)), keep)),
            )
        } else {
            (
                SourceRef::Strong(source),
                current.map(|(root, keep)| (SourceRef::Strong(Some(root)), keep)),
            )
        };
        let held = (
            ExecWithSource {
                exec: Some(self.exec.take()),
                source,
            },
            current,
            std::mem::take(&mut state.keep),
            state.instantiated_nodes.take(),
            std::mem::take(&mut state.node_owners),
        );
        let ctx = self.exec.ctx.clone();
        let memory_user = state.memory_user.take();
        let release = move || {
            drop(held);
            for ptr in unfreed {
                // SAFETY: `ptr` is the address of a graph allocation of this exec, whose
                // launches have all finished; freeing graph memory outside the graph is
                // allowed, and freeing an address not allocated now is an error, ignored.
                crate::driver::release::destroy_in(&ctx, ptr, |p| {
                    let _ = unsafe { driver::memory::free(p) };
                });
            }
            if memory_user.is_some_and(GraphMemoryUser::leave) {
                // The device's last exec of this crate with memory nodes is gone: give the
                // pool's unused memory back to the device (freed graph memory otherwise stays
                // in the pool, counted as in use). While other execs with memory nodes live the
                // pool is left alone: it keeps their memory for their next launches.
                // SAFETY: `destroy_in` makes the context current; trimming only releases pool
                // memory no graph uses.
                crate::driver::release::destroy_in(&ctx, ctx.device, |d| {
                    let _ = unsafe { driver::device::graph_mem_trim(d) };
                });
            }
        };
        let release: Box<dyn std::any::Any + Send> = Box::new(OnDrop(Some(release)));
        match state.device_keep.take() {
            // Device code may still launch the exec: it goes after the last host launch and
            // once no graph holds a device handle of it.
            Some(keep) => {
                *lock(&keep.held) = Some(release);
                state.release_after_last_launch_from(Box::new(keep), Caller::Free);
            }
            None => state.release_after_last_launch_from(release, Caller::Free),
        }
    }
}

/// An exec and the graph it was instantiated from, dropped in that order, the exec under the
/// graph's tree lock (so never beside a driver call on that graph).
struct ExecWithSource {
    exec: Option<ExecHandle>,
    source: SourceRef,
}

/// A graph an exec came from, as the exec's release holds it: strongly, or weakly where holding
/// it could make a cycle (an exec parked in its device handles' keep-alive).
enum SourceRef {
    Strong(Option<ExecRef>),
    Weak(Option<std::sync::Weak<GraphHandle>>),
}

impl SourceRef {
    fn weak(graph: Option<&Arc<GraphHandle>>) -> Self {
        SourceRef::Weak(graph.map(Arc::downgrade))
    }

    /// The graph, if it is still alive.
    fn take(&mut self) -> Option<Arc<GraphHandle>> {
        match self {
            SourceRef::Strong(s) => s.take().map(|r| Arc::clone(&r)),
            SourceRef::Weak(w) => w.take().and_then(|w| w.upgrade()),
        }
    }
}

impl Drop for ExecWithSource {
    fn drop(&mut self) {
        let source = self.source.take();
        let guard = source.as_ref().map(|s| s.lock());
        drop(self.exec.take());
        drop(guard);
        drop(source);
    }
}

/// Runs its closure when dropped (where `release_after_last_launch_from` drops it).
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

static_assertions::assert_impl_all!(Graph: Send, Sync, std::fmt::Debug);
static_assertions::assert_impl_all!(DeviceGraph: Send, Sync, Clone, std::fmt::Debug);
static_assertions::assert_impl_all!(InstantiateOptions: Send, Sync, Default, Clone);

pub(crate) fn path_cstring(path: &Path) -> Result<CString> {
    let s = path.to_str().ok_or_else(|| Error::Io {
        path: path.display().to_string(),
        message: "the path is not valid UTF-8".into(),
    })?;
    CString::new(s).map_err(|_| Error::Io {
        path: s.to_string(),
        message: "the path contains a NUL byte".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::graph::NodeOwnersIndex;

    #[test]
    fn a_node_updated_in_an_exec_releases_what_only_it_used() {
        use crate::driver::graph::Owner;
        let module: Owner = Arc::new(1u8);
        let (buf_a, buf_b): (Owner, Owner) = (Arc::new(2u8), Arc::new(3u8));
        let watch = |o: &Owner| Arc::downgrade(o);
        let (w_module, w_a, w_b) = (watch(&module), watch(&buf_a), watch(&buf_b));
        let chunk: KeepChunk = Arc::new(vec![module, buf_a, buf_b]);
        // Node 1 uses the module and buf_a, node 2 the module and buf_b.
        let index = NodeOwnersIndex {
            nodes: vec![((1, 0x10), 0, 2), ((1, 0x20), 2, 2)],
            uses: vec![0, 1, 0, 2],
        };
        let mut keep = vec![chunk.clone()];
        drop(chunk);
        let mut nodes = InstantiatedNodes::Shared(keep[0].clone(), index);
        let released = nodes.release_node((1, 0x10), &mut keep);
        assert!(keep.is_empty(), "the exec lets go of the shared chunk");
        assert_eq!(released.len(), 1, "buf_a: the module is still node 2's");
        drop(released);
        assert!(w_a.upgrade().is_none() && w_module.upgrade().is_some());
        assert!(nodes.release_node((1, 0x10), &mut keep).is_empty(), "once");
        assert!(
            nodes.release_node((1, 0x99), &mut keep).is_empty(),
            "unknown node"
        );
        drop(nodes.release_node((1, 0x20), &mut keep));
        assert!(w_b.upgrade().is_none() && w_module.upgrade().is_none());
    }

    #[test]
    fn instantiate_results_convert_without_trusting_the_driver() {
        use sys::CUgraphInstantiateResult::*;
        assert_eq!(
            instantiate_failure(CUDA_GRAPH_INSTANTIATE_SUCCESS as u32),
            None
        );
        assert_eq!(
            instantiate_failure(CUDA_GRAPH_INSTANTIATE_ERROR as u32),
            Some(InstantiateFailure::InvalidStructure)
        );
        assert_eq!(
            instantiate_failure(compat::INSTANTIATE_CONDITIONAL_HANDLE_UNUSED),
            Some(InstantiateFailure::ConditionalHandleUnused)
        );
        assert_eq!(
            instantiate_failure(0xDEAD_BEEF),
            Some(InstantiateFailure::Other(0xDEAD_BEEF))
        );
    }

    #[test]
    fn update_results_convert_without_trusting_the_driver() {
        use sys::CUgraphExecUpdateResult::*;
        assert_eq!(update_failure(CU_GRAPH_EXEC_UPDATE_SUCCESS as u32), None);
        assert_eq!(
            update_failure(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED as u32),
            Some(UpdateFailure::TopologyChanged)
        );
        assert_eq!(
            update_failure(CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED as u32),
            Some(UpdateFailure::AttributesChanged)
        );
        assert_eq!(update_failure(1234), Some(UpdateFailure::Other(1234)));
    }
}
static_assertions::assert_impl_all!(Graph: std::panic::UnwindSafe, std::panic::RefUnwindSafe);
