//! DOT debug output (`cuGraphDebugDotPrint`).

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::sys::CUgraphDebugDot_flags_enum as F;

use crate::driver;
use crate::driver::graph::GraphHandle;
use crate::error::{Error, Result};

/// One detail `debug_dot_print` can add to the DOT output (a `CU_GRAPH_DEBUG_DOT_FLAGS_*` flag).
/// Non-exhaustive: a flag a newer CUDA adds becomes a new variant.
///
/// ```
/// use cuda_graph::{DotDetail, GraphDebugPrintOptions};
/// let options = GraphDebugPrintOptions::new().with(DotDetail::Handles);
/// assert!(options.contains(DotDetail::Handles));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DotDetail {
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE`: everything.
    Verbose,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_RUNTIME_TYPES`: runtime types instead of driver types.
    RuntimeTypes,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_KERNEL_NODE_PARAMS`: kernel node parameters.
    KernelNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_MEMCPY_NODE_PARAMS`: memcpy node parameters.
    MemcpyNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_MEMSET_NODE_PARAMS`: memset node parameters.
    MemsetNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_HOST_NODE_PARAMS`: host node parameters.
    HostNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_EVENT_NODE_PARAMS`: event node parameters.
    EventNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_EXT_SEMAS_SIGNAL_NODE_PARAMS`: external semaphore signal node parameters.
    ExtSemasSignalNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_EXT_SEMAS_WAIT_NODE_PARAMS`: external semaphore wait node parameters.
    ExtSemasWaitNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_KERNEL_NODE_ATTRIBUTES`: kernel node attributes.
    KernelNodeAttributes,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_HANDLES`: node handles.
    Handles,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_MEM_ALLOC_NODE_PARAMS`: memory allocation node parameters.
    MemAllocNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_MEM_FREE_NODE_PARAMS`: memory free node parameters.
    MemFreeNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_BATCH_MEM_OP_NODE_PARAMS`: batch memory operation node parameters.
    BatchMemOpNodeParams,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_EXTRA_TOPO_INFO`: extra topology information.
    ExtraTopoInfo,
    /// `CU_GRAPH_DEBUG_DOT_FLAGS_CONDITIONAL_NODE_PARAMS`: conditional node parameters.
    ConditionalNodeParams,
}

impl DotDetail {
    /// Every detail.
    pub const ALL: [DotDetail; 16] = [
        DotDetail::Verbose,
        DotDetail::RuntimeTypes,
        DotDetail::KernelNodeParams,
        DotDetail::MemcpyNodeParams,
        DotDetail::MemsetNodeParams,
        DotDetail::HostNodeParams,
        DotDetail::EventNodeParams,
        DotDetail::ExtSemasSignalNodeParams,
        DotDetail::ExtSemasWaitNodeParams,
        DotDetail::KernelNodeAttributes,
        DotDetail::Handles,
        DotDetail::MemAllocNodeParams,
        DotDetail::MemFreeNodeParams,
        DotDetail::BatchMemOpNodeParams,
        DotDetail::ExtraTopoInfo,
        DotDetail::ConditionalNodeParams,
    ];

    /// The driver's flag for this detail.
    fn flag(self) -> u32 {
        (match self {
            DotDetail::Verbose => F::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE,
            DotDetail::RuntimeTypes => F::CU_GRAPH_DEBUG_DOT_FLAGS_RUNTIME_TYPES,
            DotDetail::KernelNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_KERNEL_NODE_PARAMS,
            DotDetail::MemcpyNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_MEMCPY_NODE_PARAMS,
            DotDetail::MemsetNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_MEMSET_NODE_PARAMS,
            DotDetail::HostNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_HOST_NODE_PARAMS,
            DotDetail::EventNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_EVENT_NODE_PARAMS,
            DotDetail::ExtSemasSignalNodeParams => {
                F::CU_GRAPH_DEBUG_DOT_FLAGS_EXT_SEMAS_SIGNAL_NODE_PARAMS
            }
            DotDetail::ExtSemasWaitNodeParams => {
                F::CU_GRAPH_DEBUG_DOT_FLAGS_EXT_SEMAS_WAIT_NODE_PARAMS
            }
            DotDetail::KernelNodeAttributes => F::CU_GRAPH_DEBUG_DOT_FLAGS_KERNEL_NODE_ATTRIBUTES,
            DotDetail::Handles => F::CU_GRAPH_DEBUG_DOT_FLAGS_HANDLES,
            DotDetail::MemAllocNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_MEM_ALLOC_NODE_PARAMS,
            DotDetail::MemFreeNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_MEM_FREE_NODE_PARAMS,
            DotDetail::BatchMemOpNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_BATCH_MEM_OP_NODE_PARAMS,
            DotDetail::ExtraTopoInfo => F::CU_GRAPH_DEBUG_DOT_FLAGS_EXTRA_TOPO_INFO,
            DotDetail::ConditionalNodeParams => F::CU_GRAPH_DEBUG_DOT_FLAGS_CONDITIONAL_NODE_PARAMS,
        }) as u32
    }
}

/// Which details `debug_dot_print` writes ([`DotDetail`]s). None by default (the driver then
/// writes the basic topology); [`GraphDebugPrintOptions::all`] turns every one on.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::GraphDebugPrintOptions;
/// use cuda_graph::DotDetail;
/// # fn f(ended: &GraphBuilder<Primary, Ended>) -> cuda_graph::Result<()> {
/// let options = GraphDebugPrintOptions::new()
///     .with(DotDetail::KernelNodeParams)
///     .with(DotDetail::Handles);
/// ended.debug_dot_print("graph.dot", &options)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphDebugPrintOptions {
    flags: u32,
}

impl GraphDebugPrintOptions {
    /// No details: the basic topology (the same as `default()`).
    ///
    /// ```
    /// use cuda_graph::GraphDebugPrintOptions;
    /// assert_eq!(GraphDebugPrintOptions::new().flags(), 0);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Every detail on.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::GraphDebugPrintOptions;
    /// # fn f(ended: &GraphBuilder<Primary, Ended>) -> cuda_graph::Result<()> {
    /// ended.debug_dot_print("graph.dot", &GraphDebugPrintOptions::all())?;
    /// # Ok(()) }
    /// ```
    pub fn all() -> Self {
        DotDetail::ALL.iter().fold(Self::new(), |o, d| o.with(*d))
    }

    /// These options with `detail` on.
    ///
    /// ```
    /// use cuda_graph::{DotDetail, GraphDebugPrintOptions};
    /// let verbose = GraphDebugPrintOptions::new().with(DotDetail::Verbose);
    /// # let _ = verbose;
    /// ```
    #[must_use = "`with` returns the changed options"]
    pub fn with(mut self, detail: DotDetail) -> Self {
        self.flags |= detail.flag();
        self
    }

    /// These options with `detail` off.
    ///
    /// ```
    /// use cuda_graph::{DotDetail, GraphDebugPrintOptions};
    /// let quieter = GraphDebugPrintOptions::all().without(DotDetail::Verbose);
    /// assert!(!quieter.contains(DotDetail::Verbose));
    /// ```
    #[must_use = "`without` returns the changed options"]
    pub fn without(mut self, detail: DotDetail) -> Self {
        self.flags &= !detail.flag();
        self
    }

    /// Whether `detail` is on.
    ///
    /// ```
    /// use cuda_graph::{DotDetail, GraphDebugPrintOptions};
    /// assert!(GraphDebugPrintOptions::all().contains(DotDetail::Handles));
    /// ```
    pub fn contains(&self, detail: DotDetail) -> bool {
        self.flags & detail.flag() != 0
    }

    /// The `CUgraphDebugDot_flags` bit set.
    ///
    /// ```
    /// use cuda_graph::GraphDebugPrintOptions;
    /// assert_ne!(GraphDebugPrintOptions::all().flags(), 0); // CU_GRAPH_DEBUG_DOT_FLAGS_*
    /// ```
    pub fn flags(&self) -> u32 {
        self.flags
    }
}

/// Writes `graph` as DOT to `path`, checking first that the path is writable, and that `usable`
/// accepts the tree — under the same lock as the driver call, so the graph cannot be freed
/// (its conditional node destroyed on another thread, say) in between.
pub(crate) fn dot_print(
    graph: &Arc<GraphHandle>,
    path: &Path,
    options: &GraphDebugPrintOptions,
    usable: impl FnOnce(&crate::driver::graph::TreeState) -> Result<()>,
) -> Result<()> {
    let cpath = super::path_cstring(path)?;
    graph.ctx.bind()?;
    let tree = graph.lock();
    usable(&tree)?;
    std::fs::File::create(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    // SAFETY: the graph is live (checked by `usable` under the tree lock, held across the call);
    // `cpath` is NUL-terminated.
    unsafe { driver::graph::debug_dot_print(graph.raw, &cpath, options.flags()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_distinct_flags() {
        let all = GraphDebugPrintOptions::all().flags();
        assert_eq!(all.count_ones(), 16);
        assert_eq!(GraphDebugPrintOptions::default().flags(), 0);
        let one = GraphDebugPrintOptions::new().with(DotDetail::Handles);
        assert_eq!(one.flags(), F::CU_GRAPH_DEBUG_DOT_FLAGS_HANDLES as u32);
        assert!(one.contains(DotDetail::Handles) && !one.contains(DotDetail::Verbose));
        assert_eq!(
            one.without(DotDetail::Handles),
            GraphDebugPrintOptions::new()
        );
    }
}
