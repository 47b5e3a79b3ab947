//! Launch attributes (`CUlaunchAttribute`): the array `cuLaunchKernelEx` takes, the same values
//! set on and read from kernel nodes (`cuGraphKernelNodeSetAttribute` / `GetAttribute`), and
//! the device facts their checks need (priority range, occupancy).

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::drv;
use crate::error::Result;

/// The attributes this crate sets, in the driver's terms: `None` or `false` leave one unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawAttributes {
    pub(crate) cluster: Option<(u32, u32, u32)>,
    pub(crate) priority: Option<i32>,
    pub(crate) cooperative: bool,
    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: the launch may begin before the
    /// kernel it follows has ended (programmatic dependent launch).
    pub(crate) programmatic: bool,
}

impl RawAttributes {
    /// Whether `self` and `other` ask the same of the device: a cluster of one block is none,
    /// priority 0 (the default) is none; the dependent flag is not compared.
    pub(crate) fn same_as(&self, other: &RawAttributes) -> bool {
        let cluster = |c: Option<(u32, u32, u32)>| c.filter(|&d| d != (1, 1, 1) && d != (0, 0, 0));
        let priority = |p: Option<i32>| p.filter(|&p| p != 0);
        cluster(self.cluster) == cluster(other.cluster)
            && priority(self.priority) == priority(other.priority)
            && self.cooperative == other.cooperative
    }
}

/// The most attributes [`RawAttributes`] sets at once.
pub(crate) const MAX_ATTRIBUTES: usize = 4;

fn attribute(
    id: sys::CUlaunchAttributeID,
    value: sys::CUlaunchAttributeValue,
) -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id,
        pad: [0; 4],
        value,
    }
}

/// A zeroed attribute value (every field of the union is plain data).
fn zero_value() -> sys::CUlaunchAttributeValue {
    // SAFETY: `CUlaunchAttributeValue` is a C union of integers, arrays and plain structs, for
    // which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

impl RawAttributes {
    /// The attributes as the array `cuLaunchKernelEx` takes, and how many of it are set.
    pub(crate) fn to_array(self) -> ([sys::CUlaunchAttribute; MAX_ATTRIBUTES], usize) {
        use sys::CUlaunchAttributeID::*;
        let mut out = [attribute(CU_LAUNCH_ATTRIBUTE_IGNORE, zero_value()); MAX_ATTRIBUTES];
        let mut n = 0;
        let mut push = |id, value| {
            out[n] = attribute(id, value);
            n += 1;
        };
        if let Some((x, y, z)) = self.cluster {
            let mut v = zero_value();
            v.clusterDim.x = x;
            v.clusterDim.y = y;
            v.clusterDim.z = z;
            push(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, v);
        }
        if let Some(p) = self.priority {
            let mut v = zero_value();
            v.priority = p;
            push(CU_LAUNCH_ATTRIBUTE_PRIORITY, v);
        }
        if self.cooperative {
            let mut v = zero_value();
            v.cooperative = 1;
            push(CU_LAUNCH_ATTRIBUTE_COOPERATIVE, v);
        }
        if self.programmatic {
            let mut v = zero_value();
            v.programmaticStreamSerializationAllowed = 1;
            push(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, v);
        }
        (out, n)
    }
}

/// Launches `function` on `stream` with `attributes` (`cuLaunchKernelEx`).
///
/// # Safety
/// As [`super::stream::launch_kernel`]; the attributes were checked against the device and the
/// kernel (`runtime::launch::check_attributes`).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch_kernel_ex(
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem_bytes: u32,
    stream: sys::CUstream,
    params: *mut *mut std::ffi::c_void,
    attributes: RawAttributes,
) -> Result<()> {
    let (mut attrs, n) = attributes.to_array();
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: shared_mem_bytes,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: n as u32,
    };
    // SAFETY: the caller's promises above; `config` and `attrs` live until the call returns.
    unsafe {
        drv!(cuLaunchKernelEx(
            &config,
            function,
            params,
            std::ptr::null_mut()
        ))
    }
}

/// Sets `attributes` on the kernel node `node` (`cuGraphKernelNodeSetAttribute`, one call per
/// attribute set).
///
/// # Safety
/// `node` is a live kernel node of a graph whose tree is locked.
pub(crate) unsafe fn set_node_attributes(
    node: sys::CUgraphNode,
    attributes: RawAttributes,
) -> Result<()> {
    let (attrs, n) = attributes.to_array();
    for a in &attrs[..n] {
        // SAFETY: the caller's promise above; `a.value` lives until the call returns.
        unsafe { drv!(cuGraphKernelNodeSetAttribute(node, a.id, &a.value)) }?;
    }
    Ok(())
}

/// The attributes of the kernel node `node` (`cuGraphKernelNodeGetAttribute`): a cluster of
/// `(0, 0, 0)` or `(1, 1, 1)` reads back as none, as does priority 0.
///
/// # Safety
/// `node` is a live kernel node of a graph whose tree is locked.
pub(crate) unsafe fn node_attributes(node: sys::CUgraphNode) -> Result<RawAttributes> {
    use sys::CUlaunchAttributeID::*;
    let get = |id| -> Result<sys::CUlaunchAttributeValue> {
        let mut v = zero_value();
        // SAFETY: the caller's promise above; `v` is a valid out pointer.
        unsafe { drv!(cuGraphKernelNodeGetAttribute(node, id, &mut v)) }?;
        Ok(v)
    };
    let c = get(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)?;
    // SAFETY: the driver wrote the union's field for the attribute asked (plain integers).
    let (cluster, priority, cooperative) = unsafe {
        (
            (c.clusterDim.x, c.clusterDim.y, c.clusterDim.z),
            get(CU_LAUNCH_ATTRIBUTE_PRIORITY)?.priority,
            get(CU_LAUNCH_ATTRIBUTE_COOPERATIVE)?.cooperative,
        )
    };
    Ok(RawAttributes {
        cluster: match cluster {
            (0, 0, 0) | (1, 1, 1) => None,
            dims => Some(dims),
        },
        priority: (priority != 0).then_some(priority),
        cooperative: cooperative != 0,
        programmatic: false,
    })
}

/// The context's stream priorities as `(least, greatest)`: lower numbers are higher priorities,
/// so `greatest <= least` (`cuCtxGetStreamPriorityRange`).
///
/// # Safety
/// `ctx` is bound on the calling thread.
pub(crate) unsafe fn priority_range(_ctx: &PrimaryContext) -> Result<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: a context is current (the caller's promise); both out pointers are valid.
    unsafe { drv!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest)) }?;
    Ok((least, greatest))
}

/// How many blocks of `function` of `threads` threads and `shared` bytes of dynamic shared
/// memory fit on one multiprocessor at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
///
/// # Safety
/// `function` is a live function of a context bound on the calling thread.
pub(crate) unsafe fn blocks_per_multiprocessor(
    function: sys::CUfunction,
    threads: u32,
    shared: u32,
) -> Result<u32> {
    let mut n = 0;
    // SAFETY: the caller's promise above; `n` is a valid out pointer.
    unsafe {
        drv!(cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut n,
            function,
            threads as i32,
            shared as usize
        ))
    }?;
    Ok(n.max(0) as u32)
}

/// Whether any edge into `node` is programmatic (`cuGraphNodeGetDependencies_v2` with edge
/// data): the node may begin before that dependency has ended.
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked.
pub(crate) unsafe fn has_programmatic_dependency(node: sys::CUgraphNode) -> Result<bool> {
    // SAFETY: the caller's promise.
    unsafe { any_programmatic(node, false) }
}

/// Whether any edge out of `node` is programmatic (`cuGraphNodeGetDependentNodes_v2` with
/// edge data): a dependent kernel follows it.
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked.
pub(crate) unsafe fn has_programmatic_dependent(node: sys::CUgraphNode) -> Result<bool> {
    // SAFETY: the caller's promise.
    unsafe { any_programmatic(node, true) }
}

/// # Safety
/// `node` is a live node of a graph whose tree is locked.
unsafe fn any_programmatic(node: sys::CUgraphNode, out: bool) -> Result<bool> {
    let list = |nodes: *mut sys::CUgraphNode, edges: *mut sys::CUgraphEdgeData, n: &mut usize| {
        if out {
            // SAFETY: the caller's promise; the arrays are null (count) or hold `*n` entries.
            unsafe { drv!(cuGraphNodeGetDependentNodes_v2(node, nodes, edges, n)) }
        } else {
            // SAFETY: as above.
            unsafe { drv!(cuGraphNodeGetDependencies_v2(node, nodes, edges, n)) }
        }
    };
    let mut n = 0usize;
    list(std::ptr::null_mut(), std::ptr::null_mut(), &mut n)?;
    if n == 0 {
        return Ok(false);
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    let mut edges = vec![NO_EDGE_DATA; n];
    list(nodes.as_mut_ptr(), edges.as_mut_ptr(), &mut n)?;
    let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
    Ok(edges[..n.min(edges.len())]
        .iter()
        .any(|e| e.type_ == programmatic))
}

/// Edge data of a plain edge.
const NO_EDGE_DATA: sys::CUgraphEdgeData = sys::CUgraphEdgeData {
    from_port: 0,
    to_port: 0,
    type_: 0,
    reserved: [0; 5],
};

/// Adds a kernel node with `attributes`: with `programmatic`, its edges from the `n` nodes at
/// `deps` are programmatic (`cuGraphAddNode_v2` with edge data: the node and its edges made in
/// one call), and each of those must be a kernel node; the other attributes are then set on
/// the node (`cuGraphKernelNodeSetAttribute`).
///
/// Returns `Ok(None)` when all is done. When setting an attribute fails, the node is destroyed
/// and the error returned; where the driver cannot destroy it (a graph with memory nodes), the
/// node stays, ordered as asked but without its attributes, and `Ok(Some(error))` says so: the
/// caller registers the node (so what it uses stays alive) and reports the error.
///
/// # Safety
/// As [`super::graph::add_kernel_node`]; the attributes were checked against the device.
pub(crate) unsafe fn add_kernel_node_with(
    ctx: &PrimaryContext,
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
    attributes: RawAttributes,
) -> Result<Option<crate::Error>> {
    use crate::error::{Error, Refusal};
    if attributes.programmatic && n > 0 {
        // SAFETY: the caller's promise: `deps` holds `n` live nodes.
        let from = unsafe { std::slice::from_raw_parts(deps, n) };
        for &d in from {
            // SAFETY: `d` is a live node of the locked graph.
            if unsafe { super::graph::node_type(d) }? != 0 {
                return Err(Error::invalid(
                    Refusal::Attribute,
                    "a programmatic dependency must come from a kernel node: add the dependent kernel after kernels only, or add it with add_kernel",
                ));
            }
        }
        let edge = sys::CUgraphEdgeData {
            from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
            to_port: 0,
            type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
            reserved: [0; 5],
        };
        let edges = vec![edge; n];
        // SAFETY: a fully initialised parameter block (zeroed, then the kernel's fields).
        let mut block: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
        block.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL;
        block.__bindgen_anon_1.kernel = sys::CUDA_KERNEL_NODE_PARAMS_v3 {
            func: params.func,
            gridDimX: params.gridDimX,
            gridDimY: params.gridDimY,
            gridDimZ: params.gridDimZ,
            blockDimX: params.blockDimX,
            blockDimY: params.blockDimY,
            blockDimZ: params.blockDimZ,
            sharedMemBytes: params.sharedMemBytes,
            kernelParams: params.kernelParams,
            extra: params.extra,
            kern: params.kern,
            ctx: params.ctx,
        };
        // SAFETY: the caller's promises; `edges` holds `n` entries.
        unsafe { super::graph::add_node(out, graph, deps, edges.as_ptr(), n, &mut block) }?;
    } else {
        // SAFETY: the caller's promises.
        unsafe { super::graph::add_kernel_node(ctx, out, graph, deps, n, params) }?;
    }
    let rest = RawAttributes {
        programmatic: false,
        ..attributes
    };
    // SAFETY: `*out` is the kernel node just added to the locked graph.
    if let Err(e) = unsafe { set_node_attributes(*out, rest) } {
        // SAFETY: as above; the node has no dependents yet.
        return match unsafe { super::graph::destroy_node(*out) } {
            Ok(()) => Err(e),
            Err(_) => Ok(Some(e)),
        };
    }
    Ok(None)
}
