//! DOT debug output (`cuGraphDebugDotPrint`).

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::sys::CUgraphDebugDot_flags_enum as F;

use crate::driver;
use crate::driver::graph::GraphHandle;
use crate::error::{Error, Result};

/// Which details `debug_dot_print` writes: one `bool` per `CU_GRAPH_DEBUG_DOT_FLAGS_*` flag.
/// All off by default (the driver then writes the basic topology);
/// [`GraphDebugPrintOptions::all`] turns every one on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphDebugPrintOptions {
    /// `VERBOSE`: everything.
    pub verbose: bool,
    /// `RUNTIME_TYPES`: runtime types instead of driver types.
    pub runtime_types: bool,
    /// `KERNEL_NODE_PARAMS`: kernel node parameters.
    pub kernel_node_params: bool,
    /// `MEMCPY_NODE_PARAMS`: memcpy node parameters.
    pub memcpy_node_params: bool,
    /// `MEMSET_NODE_PARAMS`: memset node parameters.
    pub memset_node_params: bool,
    /// `HOST_NODE_PARAMS`: host node parameters.
    pub host_node_params: bool,
    /// `EVENT_NODE_PARAMS`: event node parameters.
    pub event_node_params: bool,
    /// `EXT_SEMAS_SIGNAL_NODE_PARAMS`: external semaphore signal node parameters.
    pub ext_semas_signal_node_params: bool,
    /// `EXT_SEMAS_WAIT_NODE_PARAMS`: external semaphore wait node parameters.
    pub ext_semas_wait_node_params: bool,
    /// `KERNEL_NODE_ATTRIBUTES`: kernel node attributes.
    pub kernel_node_attributes: bool,
    /// `HANDLES`: node handles.
    pub handles: bool,
    /// `MEM_ALLOC_NODE_PARAMS`: memory allocation node parameters.
    pub mem_alloc_node_params: bool,
    /// `MEM_FREE_NODE_PARAMS`: memory free node parameters.
    pub mem_free_node_params: bool,
    /// `BATCH_MEM_OP_NODE_PARAMS`: batch memory operation node parameters.
    pub batch_mem_op_node_params: bool,
    /// `EXTRA_TOPO_INFO`: extra topology information.
    pub extra_topo_info: bool,
    /// `CONDITIONAL_NODE_PARAMS`: conditional node parameters.
    pub conditional_node_params: bool,
}

impl GraphDebugPrintOptions {
    /// Every flag on.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(ended: &GraphBuilder<Primary, Ended>) -> cuda_graph::Result<()> {
    /// ended.debug_dot_print("graph.dot", &GraphDebugPrintOptions::all())?;
    /// # Ok(()) }
    /// ```
    pub fn all() -> Self {
        GraphDebugPrintOptions {
            verbose: true,
            runtime_types: true,
            kernel_node_params: true,
            memcpy_node_params: true,
            memset_node_params: true,
            host_node_params: true,
            event_node_params: true,
            ext_semas_signal_node_params: true,
            ext_semas_wait_node_params: true,
            kernel_node_attributes: true,
            handles: true,
            mem_alloc_node_params: true,
            mem_free_node_params: true,
            batch_mem_op_node_params: true,
            extra_topo_info: true,
            conditional_node_params: true,
        }
    }

    /// The `CUgraphDebugDot_flags` bit set.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// assert_ne!(GraphDebugPrintOptions::all().flags(), 0); // CU_GRAPH_DEBUG_DOT_FLAGS_*
    /// # Ok(()) }
    /// ```
    pub fn flags(&self) -> u32 {
        let table = [
            (self.verbose, F::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE),
            (
                self.runtime_types,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_RUNTIME_TYPES,
            ),
            (
                self.kernel_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_KERNEL_NODE_PARAMS,
            ),
            (
                self.memcpy_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_MEMCPY_NODE_PARAMS,
            ),
            (
                self.memset_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_MEMSET_NODE_PARAMS,
            ),
            (
                self.host_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_HOST_NODE_PARAMS,
            ),
            (
                self.event_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_EVENT_NODE_PARAMS,
            ),
            (
                self.ext_semas_signal_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_EXT_SEMAS_SIGNAL_NODE_PARAMS,
            ),
            (
                self.ext_semas_wait_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_EXT_SEMAS_WAIT_NODE_PARAMS,
            ),
            (
                self.kernel_node_attributes,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_KERNEL_NODE_ATTRIBUTES,
            ),
            (self.handles, F::CU_GRAPH_DEBUG_DOT_FLAGS_HANDLES),
            (
                self.mem_alloc_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_MEM_ALLOC_NODE_PARAMS,
            ),
            (
                self.mem_free_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_MEM_FREE_NODE_PARAMS,
            ),
            (
                self.batch_mem_op_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_BATCH_MEM_OP_NODE_PARAMS,
            ),
            (
                self.extra_topo_info,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_EXTRA_TOPO_INFO,
            ),
            (
                self.conditional_node_params,
                F::CU_GRAPH_DEBUG_DOT_FLAGS_CONDITIONAL_NODE_PARAMS,
            ),
        ];
        table
            .iter()
            .filter(|(on, _)| *on)
            .fold(0, |acc, (_, f)| acc | *f as u32)
    }
}

/// Writes `graph` as DOT to `path`, checking first that the path is writable.
pub(crate) fn dot_print(
    graph: &Arc<GraphHandle>,
    path: &Path,
    options: &GraphDebugPrintOptions,
) -> Result<()> {
    std::fs::File::create(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let cpath = super::path_cstring(path)?;
    graph.ctx.bind()?;
    let _tree = graph.lock();
    // SAFETY: the graph is live and its tree locked; `cpath` is NUL-terminated.
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
        let one = GraphDebugPrintOptions {
            handles: true,
            ..Default::default()
        };
        assert_eq!(one.flags(), F::CU_GRAPH_DEBUG_DOT_FLAGS_HANDLES as u32);
    }
}
