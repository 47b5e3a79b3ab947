//! Thin wrappers of the graph, node and exec entry points: one driver call each.

use cudarc::driver::sys;

use crate::driver::compat::edges;
use crate::driver::context::PrimaryContext;
use crate::driver::drv;
use crate::error::Result;

// Thin wrappers of the graph, node and exec entry points. The node-adding ones share one promise:
// `graph` is live and its tree locked, and `deps` is null with `n == 0` or holds `n` live nodes
// of `graph`; the new node is written into `out`.

/// Adds a kernel node (`cuGraphAddKernelNode_v2`).
///
/// # Safety
/// The node-adding promise (above); `params` points at argument storage that outlives the call
/// (the driver copies it) and the arguments match the kernel, which stays in bounds of the
/// memory it is given.
#[inline(always)]
pub(crate) unsafe fn add_kernel_node(
    ctx: &PrimaryContext,
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    if let Some(f) = ctx.hot.add_kernel_node {
        // SAFETY: the caller's promises above; `f` is the entry point (see `HotEntryPoints`).
        return crate::driver::check(
            unsafe { f(out, graph, deps, n, params) },
            "cuGraphAddKernelNode_v2",
        );
    }
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddKernelNode_v2(out, graph, deps, n, params)) }
}

/// Adds a memset node (`cuGraphAddMemsetNode`).
///
/// # Safety
/// The node-adding promise (above); the memset lies inside memory the graph keeps alive; `ctx`
/// is the graph's context.
pub(crate) unsafe fn add_memset_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &sys::CUDA_MEMSET_NODE_PARAMS,
    ctx: sys::CUcontext,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddMemsetNode(out, graph, deps, n, params, ctx)) }
}

/// Adds a memcpy node (`cuGraphAddMemcpyNode`).
///
/// # Safety
/// The node-adding promise (above); the copy lies inside memory the graph keeps alive; `ctx` is
/// the graph's context.
pub(crate) unsafe fn add_memcpy_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    copy: &sys::CUDA_MEMCPY3D,
    ctx: sys::CUcontext,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddMemcpyNode(out, graph, deps, n, copy, ctx)) }
}

/// Adds an empty node (`cuGraphAddEmptyNode`).
///
/// # Safety
/// The node-adding promise (above).
pub(crate) unsafe fn add_empty_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuGraphAddEmptyNode(out, graph, deps, n)) }
}

/// Adds an event record node (`cuGraphAddEventRecordNode`).
///
/// # Safety
/// The node-adding promise (above); the graph keeps `event` alive.
pub(crate) unsafe fn add_event_record_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddEventRecordNode(out, graph, deps, n, event)) }
}

/// Adds an event wait node (`cuGraphAddEventWaitNode`).
///
/// # Safety
/// The node-adding promise (above); the graph keeps `event` alive.
pub(crate) unsafe fn add_event_wait_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddEventWaitNode(out, graph, deps, n, event)) }
}

/// Adds a host node (`cuGraphAddHostNode`).
///
/// # Safety
/// The node-adding promise (above); `params.userData` stays valid while the graph and its execs
/// may run the node; the function never unwinds and never calls CUDA.
pub(crate) unsafe fn add_host_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &sys::CUDA_HOST_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddHostNode(out, graph, deps, n, params)) }
}

/// Adds a child-graph node that runs a copy of `child` (`cuGraphAddChildGraphNode`).
///
/// # Safety
/// The node-adding promise (above); `child` is live and its tree locked too.
pub(crate) unsafe fn add_child_graph_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    child: sys::CUgraph,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddChildGraphNode(out, graph, deps, n, child)) }
}

/// Adds a memory allocation node (`cuGraphAddMemAllocNode`); the driver writes the address into
/// `params.dptr`.
///
/// # Safety
/// The node-adding promise (above); `params` is fully initialised.
pub(crate) unsafe fn add_mem_alloc_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &mut sys::CUDA_MEM_ALLOC_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddMemAllocNode(out, graph, deps, n, params)) }
}

/// Adds a memory free node (`cuGraphAddMemFreeNode`).
///
/// # Safety
/// The node-adding promise (above); `ptr` was returned by a live allocation node of `graph`.
pub(crate) unsafe fn add_mem_free_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    ptr: sys::CUdeviceptr,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddMemFreeNode(out, graph, deps, n, ptr)) }
}

/// Adds a node of any kind from a parameter block (`cuGraphAddNode_v2`), with edge data `edges`
/// (null for default edges).
///
/// # Safety
/// The node-adding promise (above; `deps` may be non-null with `n == 0`); `edges` is null or
/// holds `n` entries; `params` is a valid, fully initialised parameter block.
pub(crate) unsafe fn add_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    edges: *const sys::CUgraphEdgeData,
    n: usize,
    params: &mut sys::CUgraphNodeParams,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddNode_v2(out, graph, deps, edges, n, params)) }
}

/// Lists the nodes of `graph` (`cuGraphGetNodes`): with `nodes` null, writes their count into
/// `n`; else fills `nodes` with up to `*n` of them and writes how many it wrote.
///
/// # Safety
/// `graph` is live and its tree locked; `n` is valid for reads and writes; `nodes` is null or
/// has room for `*n` nodes.
pub(crate) unsafe fn get_nodes(
    graph: sys::CUgraph,
    nodes: *mut sys::CUgraphNode,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphGetNodes(graph, nodes, n)) }
}

/// Lists the edges of `graph` (`cuGraphGetEdges_v2`; see [`crate::driver::compat::edges`]), as
/// `cuGraphGetNodes` lists nodes. The edges' data is read and dropped (a query without it is
/// refused where an edge is programmatic).
///
/// # Safety
/// `graph` is live and its tree locked; `n` is valid for reads and writes; `from` and `to` are
/// both null (to ask for the count) or both have room for `*n` nodes.
pub(crate) unsafe fn get_edges(
    graph: sys::CUgraph,
    from: *mut sys::CUgraphNode,
    to: *mut sys::CUgraphNode,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: `n` is valid for reads (the caller's promise).
    let mut data = unsafe { edge_data_room(from.is_null(), n) };
    // SAFETY: the caller's promises above; `data` is null (a count) or has room for `*n`.
    unsafe { edges!(cuGraphGetEdges_v2 / cuGraphGetEdges(graph, from, to; data.as_ptr(); n)) }
}

/// Lists the nodes `node` runs after (`cuGraphNodeGetDependencies_v2`, without edge data), as
/// `cuGraphGetNodes` lists nodes.
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked; `n` is valid for reads and writes;
/// `deps` is null or has room for `*n` nodes.
pub(crate) unsafe fn node_dependencies(
    node: sys::CUgraphNode,
    deps: *mut sys::CUgraphNode,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: `n` is valid for reads (the caller's promise).
    let mut data = unsafe { edge_data_room(deps.is_null(), n) };
    // SAFETY: the caller's promises above; `data` is null (a count) or has room for `*n`.
    unsafe {
        edges!(cuGraphNodeGetDependencies_v2 / cuGraphNodeGetDependencies(node, deps; data.as_ptr(); n))
    }
}

/// Lists the nodes that run after `node` (`cuGraphNodeGetDependentNodes_v2`, without edge data),
/// as `cuGraphGetNodes` lists nodes.
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked; `n` is valid for reads and writes;
/// `dependents` is null or has room for `*n` nodes.
pub(crate) unsafe fn node_dependents(
    node: sys::CUgraphNode,
    dependents: *mut sys::CUgraphNode,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: `n` is valid for reads (the caller's promise).
    let mut data = unsafe { edge_data_room(dependents.is_null(), n) };
    // SAFETY: the caller's promises above; `data` is null (a count) or has room for `*n`.
    unsafe {
        edges!(cuGraphNodeGetDependentNodes_v2 / cuGraphNodeGetDependentNodes(node, dependents; data.as_ptr(); n))
    }
}

/// Adds `n` edges `from[i]` → `to[i]` to `graph` (`cuGraphAddDependencies_v2`, without edge
/// data).
///
/// # Safety
/// `graph` is live and its tree locked; `from` and `to` hold `n` live nodes of it each.
pub(crate) unsafe fn add_dependencies(
    graph: sys::CUgraph,
    from: *const sys::CUgraphNode,
    to: *const sys::CUgraphNode,
    n: usize,
) -> Result<()> {
    // SAFETY: the caller's promises above; no edge data.
    unsafe { edges!(cuGraphAddDependencies_v2 / cuGraphAddDependencies(graph, from, to; n)) }
}

/// Removes `n` edges `from[i]` → `to[i]` from `graph` (`cuGraphRemoveDependencies_v2`, without
/// edge data).
///
/// # Safety
/// `graph` is live and its tree locked; `from` and `to` hold `n` live nodes of it each.
pub(crate) unsafe fn remove_dependencies(
    graph: sys::CUgraph,
    from: *const sys::CUgraphNode,
    to: *const sys::CUgraphNode,
    n: usize,
) -> Result<()> {
    // SAFETY: the caller's promises above; no edge data.
    unsafe { edges!(cuGraphRemoveDependencies_v2 / cuGraphRemoveDependencies(graph, from, to; n)) }
}

/// Destroys `node` and its edges (`cuGraphDestroyNode`).
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked, never passed to the driver again.
pub(crate) unsafe fn destroy_node(node: sys::CUgraphNode) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuGraphDestroyNode(node)) }
}

/// The raw type of `node` (`cuGraphNodeGetType`), as the integer the driver writes.
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked.
pub(crate) unsafe fn node_type(node: sys::CUgraphNode) -> Result<u32> {
    let mut v: u32 = u32::MAX;
    // SAFETY: `node` is a live node (the caller's promise). The driver writes a 4-byte enum
    // value; it is written into a `u32`, never read as the Rust enum, so an unknown value from a
    // newer driver is not undefined behaviour.
    unsafe {
        drv!(cuGraphNodeGetType(
            node,
            (&mut v as *mut u32).cast::<sys::CUgraphNodeType>()
        ))
    }?;
    Ok(v)
}

// Parameter updates of definition nodes. They share one promise: `node` is a live node of a
// graph whose tree is locked, of the type the call is for, and what the new parameters refer to
// is held by the node's slot (see `NodeTable::replace_owners`) from before the call.

/// Sets a kernel node's parameters (`cuGraphKernelNodeSetParams_v2`).
///
/// # Safety
/// The node-update promise (above); `params` points at argument storage that outlives the call
/// (the driver copies it) and the arguments match the kernel, which stays in bounds of the
/// memory it is given.
pub(crate) unsafe fn kernel_node_set_params(
    node: sys::CUgraphNode,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphKernelNodeSetParams_v2(node, params)) }
}

/// Sets a memset node's parameters (`cuGraphMemsetNodeSetParams`).
///
/// # Safety
/// The node-update promise (above); the memset lies inside memory the node holds.
pub(crate) unsafe fn memset_node_set_params(
    node: sys::CUgraphNode,
    params: &sys::CUDA_MEMSET_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphMemsetNodeSetParams(node, params)) }
}

/// Sets a memcpy node's parameters (`cuGraphMemcpyNodeSetParams`).
///
/// # Safety
/// The node-update promise (above); the copy lies inside memory the node holds.
pub(crate) unsafe fn memcpy_node_set_params(
    node: sys::CUgraphNode,
    copy: &sys::CUDA_MEMCPY3D,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphMemcpyNodeSetParams(node, copy)) }
}

/// Sets a host node's function and data (`cuGraphHostNodeSetParams`).
///
/// # Safety
/// The node-update promise (above); `params.userData` stays valid while the node holds it; the
/// function never unwinds and never calls CUDA.
pub(crate) unsafe fn host_node_set_params(
    node: sys::CUgraphNode,
    params: &sys::CUDA_HOST_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphHostNodeSetParams(node, params)) }
}

/// Sets the event an event record node records (`cuGraphEventRecordNodeSetEvent`).
///
/// # Safety
/// The node-update promise (above); `event` is live and held by the node.
pub(crate) unsafe fn event_record_node_set_event(
    node: sys::CUgraphNode,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphEventRecordNodeSetEvent(node, event)) }
}

/// Sets the event an event wait node waits for (`cuGraphEventWaitNodeSetEvent`).
///
/// # Safety
/// The node-update promise (above); `event` is live and held by the node.
pub(crate) unsafe fn event_wait_node_set_event(
    node: sys::CUgraphNode,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphEventWaitNodeSetEvent(node, event)) }
}

/// Sets a node's parameters from a parameter block (`cuGraphNodeSetParams`, driver 12.2).
///
/// # Safety
/// The node-update promise (above); `params` is a valid, fully initialised block (unused bytes
/// zeroed) of the node's type; a child graph it names is live and its tree locked too.
pub(crate) unsafe fn node_set_params(
    node: sys::CUgraphNode,
    params: &mut sys::CUgraphNodeParams,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphNodeSetParams(node, params)) }
}

// Parameter updates of exec nodes. They share one promise: `exec` is live and not launched or
// updated concurrently (its lock is held); `node` is a live node of the graph `exec` was
// instantiated from, of the type the call is for, that existed at instantiation, and the tree of
// that graph is locked; what the new parameters refer to is held by the exec from before the
// call until its last launch that may use it has finished.

/// Sets a kernel node's parameters in an exec (`cuGraphExecKernelNodeSetParams_v2`).
///
/// # Safety
/// The exec-update promise (above); as [`kernel_node_set_params`] for `params`.
pub(crate) unsafe fn exec_kernel_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecKernelNodeSetParams_v2(exec, node, params)) }
}

/// Sets a memset node's parameters in an exec (`cuGraphExecMemsetNodeSetParams`).
///
/// # Safety
/// The exec-update promise (above); the memset lies inside memory the exec holds; `ctx` is the
/// exec's context.
pub(crate) unsafe fn exec_memset_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    params: &sys::CUDA_MEMSET_NODE_PARAMS,
    ctx: sys::CUcontext,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecMemsetNodeSetParams(exec, node, params, ctx)) }
}

/// Sets a memcpy node's parameters in an exec (`cuGraphExecMemcpyNodeSetParams`).
///
/// # Safety
/// The exec-update promise (above); the copy lies inside memory the exec holds; `ctx` is the
/// exec's context.
pub(crate) unsafe fn exec_memcpy_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    copy: &sys::CUDA_MEMCPY3D,
    ctx: sys::CUcontext,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecMemcpyNodeSetParams(exec, node, copy, ctx)) }
}

/// Sets a host node's function and data in an exec (`cuGraphExecHostNodeSetParams`).
///
/// # Safety
/// The exec-update promise (above); as [`host_node_set_params`] for `params`.
pub(crate) unsafe fn exec_host_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    params: &sys::CUDA_HOST_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecHostNodeSetParams(exec, node, params)) }
}

/// Updates a child-graph node of an exec from `child` (`cuGraphExecChildGraphNodeSetParams`).
///
/// # Safety
/// The exec-update promise (above); `child` is live and its tree locked.
pub(crate) unsafe fn exec_child_graph_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    child: sys::CUgraph,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecChildGraphNodeSetParams(exec, node, child)) }
}

/// Sets the event an event record node of an exec records
/// (`cuGraphExecEventRecordNodeSetEvent`).
///
/// # Safety
/// The exec-update promise (above); `event` is live and held by the exec.
pub(crate) unsafe fn exec_event_record_node_set_event(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecEventRecordNodeSetEvent(exec, node, event)) }
}

/// Sets the event an event wait node of an exec waits for (`cuGraphExecEventWaitNodeSetEvent`).
///
/// # Safety
/// The exec-update promise (above); `event` is live and held by the exec.
pub(crate) unsafe fn exec_event_wait_node_set_event(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecEventWaitNodeSetEvent(exec, node, event)) }
}

/// Enables or disables `node` in `exec` (`cuGraphNodeSetEnabled`).
///
/// # Safety
/// The exec-update promise (above), without new parameters.
pub(crate) unsafe fn node_set_enabled(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    enabled: bool,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphNodeSetEnabled(exec, node, u32::from(enabled))) }
}

/// Whether `node` is enabled in `exec` (`cuGraphNodeGetEnabled`).
///
/// # Safety
/// As [`node_set_enabled`].
pub(crate) unsafe fn node_get_enabled(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
) -> Result<bool> {
    let mut v: std::ffi::c_uint = 0;
    // SAFETY: the caller's promises above; `v` is a valid out pointer.
    unsafe { drv!(cuGraphNodeGetEnabled(exec, node, &mut v)) }?;
    Ok(v != 0)
}

// Read-back of node parameters. They share one promise: `node` is a live node of a graph whose
// tree is locked, of the type the call is for. What a call returns that points into the driver
// (a kernel's argument array) is valid only until the node is changed or destroyed: read it under
// the same lock.

/// A kernel node's parameters (`cuGraphKernelNodeGetParams_v2`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn kernel_node_get_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_KERNEL_NODE_PARAMS> {
    // SAFETY: the structure is plain C data (pointers and integers, no enums): zero is valid.
    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's promise above; `p` is a valid out pointer.
    unsafe { drv!(cuGraphKernelNodeGetParams_v2(node, &mut p)) }?;
    Ok(p)
}

/// A memset node's parameters (`cuGraphMemsetNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn memset_node_get_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_MEMSET_NODE_PARAMS> {
    // SAFETY: plain C integers: zero is valid.
    let mut p: sys::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's promise above; `p` is a valid out pointer.
    unsafe { drv!(cuGraphMemsetNodeGetParams(node, &mut p)) }?;
    Ok(p)
}

/// A memory copy as the driver describes it, with the memory types as the integers the driver
/// writes (`CUmemorytype`: 1 host, 2 device, 3 array, 4 unified).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memcpy3d {
    pub(crate) src_type: u32,
    pub(crate) src_host: usize,
    pub(crate) src_device: u64,
    pub(crate) src_x: usize,
    pub(crate) dst_type: u32,
    pub(crate) dst_host: usize,
    pub(crate) dst_device: u64,
    pub(crate) dst_x: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) depth: usize,
}

/// A memcpy node's copy (`cuGraphMemcpyNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn memcpy_node_get_params(node: sys::CUgraphNode) -> Result<Memcpy3d> {
    let mut p = std::mem::MaybeUninit::<sys::CUDA_MEMCPY3D>::zeroed();
    // SAFETY: the caller's promise above; `p` is valid for writes.
    unsafe { drv!(cuGraphMemcpyNodeGetParams(node, p.as_mut_ptr())) }?;
    let p = p.as_ptr();
    // SAFETY: every field is read through a raw pointer as the C type it is (the memory types as
    // `u32`), so a value the bindings' enums do not list is not undefined behaviour; the
    // structure was zeroed and then written by the driver.
    unsafe {
        use std::ptr::addr_of;
        Ok(Memcpy3d {
            src_type: addr_of!((*p).srcMemoryType).cast::<u32>().read(),
            src_host: addr_of!((*p).srcHost).read() as usize,
            src_device: addr_of!((*p).srcDevice).read(),
            src_x: addr_of!((*p).srcXInBytes).read(),
            dst_type: addr_of!((*p).dstMemoryType).cast::<u32>().read(),
            dst_host: addr_of!((*p).dstHost).read() as usize,
            dst_device: addr_of!((*p).dstDevice).read(),
            dst_x: addr_of!((*p).dstXInBytes).read(),
            width: addr_of!((*p).WidthInBytes).read(),
            height: addr_of!((*p).Height).read(),
            depth: addr_of!((*p).Depth).read(),
        })
    }
}

/// A host node's function and user data (`cuGraphHostNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn host_node_get_params(
    node: sys::CUgraphNode,
) -> Result<(Option<unsafe extern "C" fn(*mut std::ffi::c_void)>, usize)> {
    // SAFETY: an optional function pointer and a pointer: zero is valid (`None`, null).
    let mut p: sys::CUDA_HOST_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's promise above; `p` is a valid out pointer.
    unsafe { drv!(cuGraphHostNodeGetParams(node, &mut p)) }?;
    Ok((p.fn_, p.userData as usize))
}

/// The node of `copy` made from `original` when `copy` was made from its graph
/// (`cuGraphNodeFindInClone`), or an error where the driver cannot tell.
///
/// # Safety
/// `original` is a live node of a graph whose tree is locked; `copy` is a live graph of a locked
/// tree.
pub(crate) unsafe fn node_find_in_clone(
    original: sys::CUgraphNode,
    copy: sys::CUgraph,
) -> Result<sys::CUgraphNode> {
    let mut n = std::ptr::null_mut();
    // SAFETY: the caller's promise above; `n` is a valid out pointer.
    unsafe { drv!(cuGraphNodeFindInClone(&mut n, original, copy)) }?;
    Ok(n)
}

/// The graph a child-graph node runs (`cuGraphChildGraphNodeGetGraph`): owned by the node, not
/// a copy; changing it changes the node.
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn child_graph_node_get_graph(node: sys::CUgraphNode) -> Result<sys::CUgraph> {
    let mut g = std::ptr::null_mut();
    // SAFETY: the caller's promise above; `g` is a valid out pointer.
    unsafe { drv!(cuGraphChildGraphNodeGetGraph(node, &mut g)) }?;
    Ok(g)
}

/// The event an event-record (`wait == false`) or event-wait node uses
/// (`cuGraphEventRecordNodeGetEvent`, `cuGraphEventWaitNodeGetEvent`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn event_node_get_event(
    node: sys::CUgraphNode,
    wait: bool,
) -> Result<sys::CUevent> {
    let mut e = std::ptr::null_mut();
    // SAFETY: the caller's promise above; `e` is a valid out pointer.
    unsafe {
        if wait {
            drv!(cuGraphEventWaitNodeGetEvent(node, &mut e))
        } else {
            drv!(cuGraphEventRecordNodeGetEvent(node, &mut e))
        }
    }?;
    Ok(e)
}

/// A memory allocation node's address, size in bytes and device
/// (`cuGraphMemAllocNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn mem_alloc_node_get_params(
    node: sys::CUgraphNode,
) -> Result<(u64, usize, i32)> {
    let mut p = std::mem::MaybeUninit::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>::zeroed();
    // SAFETY: the caller's promise above; `p` is valid for writes.
    unsafe { drv!(cuGraphMemAllocNodeGetParams(node, p.as_mut_ptr())) }?;
    let p = p.as_ptr();
    // SAFETY: the fields are read through raw pointers as the C types they are: the pool's
    // location is `{ int type; int id; }` in every CUDA version (later ones make `id` a union of
    // 4 bytes), so the device ordinal is the second `i32`; no enum is read.
    unsafe {
        use std::ptr::addr_of;
        let location = addr_of!((*p).poolProps.location).cast::<i32>();
        Ok((
            addr_of!((*p).dptr).read(),
            addr_of!((*p).bytesize).read(),
            location.add(1).read(),
        ))
    }
}

/// A memory free node's address (`cuGraphMemFreeNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn mem_free_node_get_params(node: sys::CUgraphNode) -> Result<u64> {
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: the caller's promise above; `d` is a valid out pointer.
    unsafe { drv!(cuGraphMemFreeNodeGetParams(node, &mut d)) }?;
    Ok(d)
}

/// A copy of `graph` (`cuGraphClone`), owned by the caller.
///
/// # Safety
/// `graph` is live and its tree locked.
pub(crate) unsafe fn clone(graph: sys::CUgraph) -> Result<sys::CUgraph> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: the graph is live and its tree locked (the caller's promise); `raw` is a valid out
    // pointer.
    unsafe { drv!(cuGraphClone(&mut raw, graph)) }?;
    Ok(raw)
}

/// Writes `graph` as DOT to `path` (`cuGraphDebugDotPrint`).
///
/// # Safety
/// `graph` is live and its tree locked.
pub(crate) unsafe fn debug_dot_print(
    graph: sys::CUgraph,
    path: &std::ffi::CStr,
    flags: std::ffi::c_uint,
) -> Result<()> {
    // SAFETY: the caller's promise above; `path` is NUL-terminated.
    unsafe { drv!(cuGraphDebugDotPrint(graph, path.as_ptr(), flags)) }
}

/// Creates a conditional handle in `graph` (`cuGraphConditionalHandleCreate`).
///
/// # Safety
/// `graph` and `ctx` are live, `ctx` the graph's context, and the graph's tree is locked.
pub(crate) unsafe fn conditional_handle_create(
    graph: sys::CUgraph,
    ctx: sys::CUcontext,
    default_launch_value: std::ffi::c_uint,
    flags: std::ffi::c_uint,
) -> Result<sys::CUgraphConditionalHandle> {
    let mut raw = 0;
    // SAFETY: the caller's promises above; `raw` is a valid out pointer.
    unsafe {
        drv!(cuGraphConditionalHandleCreate(
            &mut raw,
            graph,
            ctx,
            default_launch_value,
            flags
        ))
    }?;
    Ok(raw)
}

/// Instantiates `graph` (`cuGraphInstantiateWithParams`). The driver writes the exec into `exec`
/// (possibly also when it fails) and its result into `params`.
///
/// # Safety
/// `graph` is live and its tree locked; `params` points at a fully initialised parameter block.
pub(crate) unsafe fn instantiate_with_params(
    exec: &mut sys::CUgraphExec,
    graph: sys::CUgraph,
    params: *mut sys::CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above; `exec` is a valid out pointer.
    unsafe { drv!(cuGraphInstantiateWithParams(exec, graph, params)) }
}

/// Updates `exec`'s node parameters from `graph` (`cuGraphExecUpdate_v2`); the driver writes
/// the outcome into `info`.
///
/// # Safety
/// `exec` and `graph` are live, the graph's tree locked, the exec not being launched or updated
/// concurrently; `info` is valid for a write of a `CUgraphExecUpdateResultInfo`.
pub(crate) unsafe fn exec_update(
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
    info: *mut sys::CUgraphExecUpdateResultInfo,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecUpdate_v2(exec, graph, info)) }
}

/// Launches `exec` on `stream` (`cuGraphLaunch`).
///
/// # Safety
/// `exec` and `stream` are live; the exec is not launched or updated concurrently.
pub(crate) unsafe fn launch(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphLaunch(exec, stream)) }
}

/// Uploads `exec`'s work to the device on `stream` (`cuGraphUpload`).
///
/// # Safety
/// `exec` and `stream` are live; the exec is not launched or updated concurrently.
pub(crate) unsafe fn upload(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphUpload(exec, stream)) }
}

/// Destroys `exec` (`cuGraphExecDestroy`); the driver defers the free until its launches finish.
///
/// # Safety
/// `exec` is live, owned by the caller, and never used again.
pub(crate) unsafe fn exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuGraphExecDestroy(exec)) }
}

/// Room for the edge data of a list query: none for a count (`count_only`), else `*n` entries
/// (read and dropped).
///
/// # Safety
/// `n` is valid for reads.
unsafe fn edge_data_room(count_only: bool, n: *mut usize) -> EdgeData {
    if count_only {
        return EdgeData(Vec::new());
    }
    // SAFETY: the caller's promise.
    let len = unsafe { *n };
    let none = sys::CUgraphEdgeData {
        from_port: 0,
        to_port: 0,
        type_: 0,
        reserved: [0; 5],
    };
    EdgeData(vec![none; len])
}

/// Edge data room for one query ([`edge_data_room`]).
struct EdgeData(Vec<sys::CUgraphEdgeData>);

impl EdgeData {
    /// The array the driver writes, or null for a count.
    fn as_ptr(&mut self) -> *mut sys::CUgraphEdgeData {
        if self.0.is_empty() {
            std::ptr::null_mut()
        } else {
            self.0.as_mut_ptr()
        }
    }
}
