//! The differences between the CUDA versions of cudarc's bindings, one small shim each.
//!
//! cudarc generates one set of driver bindings per `cuda-*` feature; this crate forwards those
//! features under the same names (see `Cargo.toml`). The rest of the crate uses the names below and
//! compiles against every version from 12.3 on. Each shim is selected by the version aliases of
//! `build.rs` (`cfg_aliases`): "before 12.8" is `cuda_before_12_8` (any of the older versions'
//! features) and "12.8 and newer" `not(cuda_before_12_8)`, so a version added later (to the
//! aliases' lists) takes the newest shims unchanged.
//! The entry points it calls keep their real exported names, as `drv!` looks them up by name.

use cudarc::driver::sys;

/// Calls the `_v2` (edge-data) form of a topology entry point with no edge data,
/// `edges!(cuX_v2 / cuX (args..; count))`, or with the edge-data array `data`,
/// `edges!(cuX_v2 / cuX (args..; data; count))` (queries of a graph with programmatic edges
/// need one: the driver refuses a lossy query, `CUDA_ERROR_LOSSY_QUERY`).
///
/// 12.x bindings: where the driver lacks the `_v2` form (before 12.3), the original form is called
/// instead. The 13.x bindings no longer declare the original forms (`cuGraphGetEdges`,
/// `cuGraphNodeGetDependencies`, `cuGraphNodeGetDependentNodes`, `cuGraphAddDependencies`,
/// `cuGraphRemoveDependencies`), so there a driver without `_v2` is `Error::MissingEntryPoint`.
#[cfg(cuda_before_13_0)]
macro_rules! edges {
    ($v2:ident / $v1:ident ( $($a:expr),* ; $n:expr )) => {
        $crate::driver::compat::edges!($v2 / $v1 ($($a),* ; std::ptr::null_mut() ; $n))
    };
    ($v2:ident / $v1:ident ( $($a:expr),* ; $data:expr ; $n:expr )) => {
        match $crate::driver::drv!($v2($($a,)* $data, $n)) {
            Err($crate::Error::MissingEntryPoint { .. }) => $crate::driver::drv!($v1($($a,)* $n)),
            r => r,
        }
    };
}
#[cfg(not(cuda_before_13_0))]
macro_rules! edges {
    ($v2:ident / $v1:ident ( $($a:expr),* ; $n:expr )) => {
        $crate::driver::compat::edges!($v2 / $v1 ($($a),* ; std::ptr::null_mut() ; $n))
    };
    ($v2:ident / $v1:ident ( $($a:expr),* ; $data:expr ; $n:expr )) => {
        $crate::driver::drv!($v2($($a,)* $data, $n))
    };
}
pub(crate) use edges;

/// The parameters of a child-graph node that runs a copy of `graph`.
///
/// 12.9+ bindings have an `ownership` field: `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE` (0), which is
/// what older drivers always do and what the zeroed field means to them.
pub(crate) fn child_graph_params(graph: sys::CUgraph) -> sys::CUDA_CHILD_GRAPH_NODE_PARAMS {
    sys::CUDA_CHILD_GRAPH_NODE_PARAMS {
        graph,
        #[cfg(not(cuda_before_12_9))]
        ownership: sys::CUgraphChildGraphNodeOwnership::CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE,
    }
}

/// The memory location "device `ordinal`".
///
/// 13.2+ bindings put `id` in an anonymous union (beside `localized` in 13.4); same layout.
pub(crate) fn device_location(ordinal: i32) -> sys::CUmemLocation {
    let type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    #[cfg(cuda_before_13_2)]
    let location = sys::CUmemLocation { type_, id: ordinal };
    #[cfg(not(cuda_before_13_2))]
    let location = sys::CUmemLocation {
        type_,
        __bindgen_anon_1: sys::CUmemLocation_st__bindgen_ty_1 { id: ordinal },
    };
    location
}

/// The allocation type of a graph memory pool: pinned device memory, or managed memory (only
/// the CUDA 13 bindings name it; `None` with the 12.x bindings).
pub(crate) fn allocation_type(managed: bool) -> Option<sys::CUmemAllocationType> {
    if !managed {
        return Some(sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED);
    }
    #[cfg(cuda_13)]
    return Some(sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED);
    #[allow(unreachable_code)]
    None
}

/// `cuEventElapsedTime`: the 13.x bindings declare only `cuEventElapsedTime_v2` (driver 12.8),
/// the 12.x bindings the original (every 12.x driver), which is called there.
///
/// # Safety
/// Both events are live; `ms` is a valid out pointer.
pub(crate) unsafe fn event_elapsed(
    ms: &mut f32,
    start: sys::CUevent,
    end: sys::CUevent,
) -> crate::Result<()> {
    #[cfg(cuda_before_13_0)]
    // SAFETY: the caller's promises above.
    let r = unsafe { super::drv!(cuEventElapsedTime(ms, start, end)) };
    #[cfg(not(cuda_before_13_0))]
    // SAFETY: the caller's promises above.
    let r = unsafe { super::drv!(cuEventElapsedTime_v2(ms, start, end)) };
    r
}

/// `CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED` (CUDA 12.8 headers) as the integer the driver
/// writes; the 12.3–12.6 bindings' `CUgraphInstantiateResult` lacks it.
#[cfg(not(cuda_before_12_8))]
pub(crate) const INSTANTIATE_CONDITIONAL_HANDLE_UNUSED: u32 =
    sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED as u32;
#[cfg(cuda_before_12_8)]
pub(crate) const INSTANTIATE_CONDITIONAL_HANDLE_UNUSED: u32 = 5;

/// Makes `params`, the parameters of a conditional node, those of a SWITCH node
/// (`CU_GRAPH_COND_TYPE_SWITCH`, CUDA 12.8; the driver itself is checked by the caller).
///
/// The 12.3–12.6 bindings' `CUgraphConditionalNodeType` lacks SWITCH, so there its value (2 in the
/// 12.8 headers) is stored as the `u32` the C field is. `params` is a union, which has no validity
/// invariant, and nothing reads `type_` back as the Rust enum, so the value is never a Rust enum.
#[cfg(not(cuda_before_12_8))]
pub(crate) fn set_switch(params: &mut sys::CUgraphNodeParams) {
    // `params` holds a conditional block (the caller built it); storing a field reads nothing.
    params.__bindgen_anon_1.conditional.type_ =
        sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_SWITCH;
}
#[cfg(cuda_before_12_8)]
pub(crate) fn set_switch(params: &mut sys::CUgraphNodeParams) {
    static_assertions::assert_eq_size!(u32, sys::CUgraphConditionalNodeType);
    const CU_GRAPH_COND_TYPE_SWITCH: u32 = 2;
    // SAFETY: `addr_of_mut!` makes a pointer to the field without reading the union; the field is
    // a 4-byte C enum (asserted), in bounds and aligned for a `u32`.
    unsafe {
        std::ptr::addr_of_mut!(params.__bindgen_anon_1.conditional.type_)
            .cast::<u32>()
            .write(CU_GRAPH_COND_TYPE_SWITCH);
    }
}

/// `cuFuncGetParamInfo` (bindings 12.4 and newer): the offset and size of parameter `index`, or
/// `None` past the last one.
///
/// # Safety
/// `func` is a kernel of a module that is loaded now.
#[cfg(not(cuda_before_12_4))]
pub(crate) unsafe fn func_param_info(
    func: sys::CUfunction,
    index: usize,
) -> crate::Result<Option<(usize, usize)>> {
    let (mut offset, mut size) = (0usize, 0usize);
    // SAFETY: the caller's promise above; the out pointers are valid.
    match unsafe { super::drv!(cuFuncGetParamInfo(func, index, &mut offset, &mut size)) } {
        Ok(()) => Ok(Some((offset, size))),
        Err(crate::Error::Driver(e))
            if e.code() == sys::CUresult::CUDA_ERROR_INVALID_VALUE as u32 =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The 12.3 bindings lack `cuFuncGetParamInfo`.
///
/// # Safety
/// None needed; kept `unsafe` to match the other bindings' shim.
#[cfg(cuda_before_12_4)]
pub(crate) unsafe fn func_param_info(
    _func: sys::CUfunction,
    _index: usize,
) -> crate::Result<Option<(usize, usize)>> {
    Err(crate::Error::invalid(
        crate::error::Refusal::Unsupported,
        "reading back kernel arguments needs cuFuncGetParamInfo, which the CUDA 12.3 bindings lack: build with a cuda-12040 or newer feature",
    ))
}

/// The offset and size of parameter `index` of `func` (`cuFuncGetParamInfo`, driver 12.4+):
/// `Ok(None)` past the last parameter (`CUDA_ERROR_INVALID_VALUE`), an error when the driver
/// cannot tell. The 12.3 bindings lack the call: always an error there.
///
/// # Safety
/// `func` is a kernel of a module that is loaded now.
#[cfg(not(cuda_before_12_4))]
pub(crate) unsafe fn param_info(
    func: sys::CUfunction,
    index: usize,
) -> crate::Result<Option<(usize, usize)>> {
    let (mut offset, mut size) = (0usize, 0usize);
    // SAFETY: the caller's promise; the out pointers are valid.
    match unsafe { super::drv!(cuFuncGetParamInfo(func, index, &mut offset, &mut size)) } {
        Ok(()) => Ok(Some((offset, size))),
        Err(e) if e.code() == Some(sys::CUresult::CUDA_ERROR_INVALID_VALUE as u32) => Ok(None),
        Err(e) => Err(e),
    }
}

/// See the 12.4+ form: the 12.3 bindings do not declare `cuFuncGetParamInfo`.
///
/// # Safety
/// None needed; kept `unsafe` to match the other form.
#[cfg(cuda_before_12_4)]
pub(crate) unsafe fn param_info(
    _func: sys::CUfunction,
    _index: usize,
) -> crate::Result<Option<(usize, usize)>> {
    Err(crate::Error::invalid(
        crate::error::Refusal::Unsupported,
        "cuFuncGetParamInfo is not declared in the CUDA 12.3 bindings",
    ))
}
