//! The crate's error type.

use std::fmt;

use cudarc::driver::sys;

use crate::version::DriverVersion;

/// `Result<T, cuda_graph::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failed driver call: the `CUresult`, its name and description, and the call.
///
/// Displays as `cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed`.
///
/// The code is kept as the driver's raw number, so a result that a newer driver returns and these
/// bindings do not know stays representable: [`code`](Self::code) and [`name`](Self::name) report
/// it, and [`result`](Self::result) is `None`.
#[derive(Clone, PartialEq, Eq)]
pub struct DriverError {
    call: &'static str,
    code: u32,
    name: String,
    description: String,
}

impl DriverError {
    /// A driver error from its parts (the crate builds these from the driver's answers).
    pub(crate) fn new(
        call: &'static str,
        code: u32,
        name: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        DriverError {
            call,
            code,
            name: name.into(),
            description: description.into(),
        }
    }

    /// The driver entry point that failed, e.g. `cuModuleLoadData`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(e: &DriverError) -> cuda_graph::Result<()> {
    /// println!("{} failed", e.call()); // e.g. cuModuleLoadData
    /// # Ok(()) }
    /// ```
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// The raw `CUresult` value, e.g. `218`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(e: &DriverError) -> cuda_graph::Result<()> {
    /// if e.code() == 200 {
    ///     println!("CUDA_ERROR_INVALID_IMAGE");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The result's name from `cuGetErrorName`, e.g. `CUDA_ERROR_INVALID_PTX`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(e: &DriverError) -> cuda_graph::Result<()> {
    /// println!("{}", e.name()); // e.g. CUDA_ERROR_INVALID_IMAGE
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The result's description from `cuGetErrorString`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(e: &DriverError) -> cuda_graph::Result<()> {
    /// println!("{}", e.description()); // e.g. device kernel image is invalid
    /// # Ok(()) }
    /// ```
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The result as the bindings' enum, or `None` for a code the bindings do not know (one a
    /// newer driver added): compare with e.g. `Some(CUresult::CUDA_ERROR_NOT_READY)`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(e: &DriverError) -> cuda_graph::Result<()> {
    /// use cudarc::driver::sys::CUresult;
    /// if e.result() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
    ///     println!("out of device memory");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn result(&self) -> Option<sys::CUresult> {
        known_result(self.code)
    }
}

/// Lists the bindings' `CUresult` variants as `KNOWN_RESULTS`. The list is checked to be complete:
/// a variant the bindings have and the list lacks fails the exhaustive match below. After the
/// variants of every version come groups `; #[cfg(..)] A, B` that only some versions have, each
/// cfg "this version and newer" (`not(any(<the older versions>))`), as in `driver::compat`.
macro_rules! known_results {
    ($($v:ident),+ $(; #[$m:meta] $($w:ident),+)* $(;)?) => {
        /// Every `CUresult` the bindings know.
        const KNOWN_RESULTS: &[sys::CUresult] =
            &[$(sys::CUresult::$v,)+ $($(#[$m] sys::CUresult::$w,)+)*];

        // Fails to compile if the bindings (another `cuda-*` feature) gain a variant the list
        // lacks.
        const _: fn(sys::CUresult) = |r| match r {
            $(sys::CUresult::$v)|+ => {}
            $($(#[$m] sys::CUresult::$w => {})+)*
        };
    };
}

known_results!(
    CUDA_SUCCESS,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_PROFILER_DISABLED,
    CUDA_ERROR_PROFILER_NOT_INITIALIZED,
    CUDA_ERROR_PROFILER_ALREADY_STARTED,
    CUDA_ERROR_PROFILER_ALREADY_STOPPED,
    CUDA_ERROR_STUB_LIBRARY,
    CUDA_ERROR_DEVICE_UNAVAILABLE,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_DEVICE_NOT_LICENSED,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
    CUDA_ERROR_MAP_FAILED,
    CUDA_ERROR_UNMAP_FAILED,
    CUDA_ERROR_ARRAY_IS_MAPPED,
    CUDA_ERROR_ALREADY_MAPPED,
    CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_ALREADY_ACQUIRED,
    CUDA_ERROR_NOT_MAPPED,
    CUDA_ERROR_NOT_MAPPED_AS_ARRAY,
    CUDA_ERROR_NOT_MAPPED_AS_POINTER,
    CUDA_ERROR_ECC_UNCORRECTABLE,
    CUDA_ERROR_UNSUPPORTED_LIMIT,
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
    CUDA_ERROR_NVLINK_UNCORRECTABLE,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CUDA_ERROR_JIT_COMPILATION_DISABLED,
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
    CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
    CUDA_ERROR_INVALID_SOURCE,
    CUDA_ERROR_FILE_NOT_FOUND,
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
    CUDA_ERROR_OPERATING_SYSTEM,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_LOSSY_QUERY,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    CUDA_ERROR_LAUNCH_TIMEOUT,
    CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
    CUDA_ERROR_CONTEXT_IS_DESTROYED,
    CUDA_ERROR_ASSERT,
    CUDA_ERROR_TOO_MANY_PEERS,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUDA_ERROR_MISALIGNED_ADDRESS,
    CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUDA_ERROR_INVALID_PC,
    CUDA_ERROR_LAUNCH_FAILED,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_SYSTEM_NOT_READY,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
    CUDA_ERROR_MPS_CONNECTION_FAILED,
    CUDA_ERROR_MPS_RPC_FAILURE,
    CUDA_ERROR_MPS_SERVER_NOT_READY,
    CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
    CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
    CUDA_ERROR_MPS_CLIENT_TERMINATED,
    CUDA_ERROR_CDP_NOT_SUPPORTED,
    CUDA_ERROR_CDP_VERSION_MISMATCH,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_MERGE,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CUDA_ERROR_CAPTURED_EVENT,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
    CUDA_ERROR_TIMEOUT,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
    CUDA_ERROR_EXTERNAL_DEVICE,
    CUDA_ERROR_INVALID_CLUSTER_SIZE,
    CUDA_ERROR_UNKNOWN;
    // 12.4+
    #[cfg(not(cuda_before_12_4))]
    CUDA_ERROR_FUNCTION_NOT_LOADED,
    CUDA_ERROR_INVALID_RESOURCE_TYPE,
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    // 12.8+
    #[cfg(not(cuda_before_12_8))]
    CUDA_ERROR_CONTAINED,
    CUDA_ERROR_TENSOR_MEMORY_LEAK,
    CUDA_ERROR_KEY_ROTATION;
    // 13.0+
    #[cfg(not(cuda_before_13_0))]
    CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER;
    // 13.1+
    #[cfg(not(cuda_before_13_1))]
    CUDA_ERROR_STREAM_DETACHED;
    // 13.3+
    #[cfg(not(cuda_before_13_3))]
    CUDA_ERROR_GRAPH_RECAPTURE_FAILURE;
    // 13.4+
    #[cfg(not(cuda_before_13_4))]
    CUDA_ERROR_FABRIC_NOT_READY,
    CUDA_ERROR_INSUFFICIENT_LOADER_VERSION,
    CUDA_ERROR_MULTICAST_RESOURCE_FULL;
);

/// The bindings' `CUresult` whose value is `code`, if there is one. Never transmutes: an unknown
/// code (from a newer driver) is `None`.
fn known_result(code: u32) -> Option<sys::CUresult> {
    KNOWN_RESULTS.iter().copied().find(|r| *r as u32 == code)
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({}): {}",
            self.call, self.name, self.code, self.description
        )
    }
}

impl std::error::Error for DriverError {}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why `cuGraphInstantiateWithParams` refused a graph (`CUgraphInstantiateResult`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstantiateFailure {
    /// `CUDA_GRAPH_INSTANTIATE_ERROR`: the graph is invalid (e.g. an unused conditional handle, or a
    /// conditional body holding a node type bodies may not hold).
    InvalidStructure,
    /// `CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE`: the graph's structure cannot be instantiated.
    InvalidGraphStructure,
    /// `CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED`: a node's operation is not allowed
    /// where it is — in a device-launchable graph, or in a conditional body (e.g. a host node).
    NodeOperationNotSupported,
    /// `CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED`: device launch across several contexts.
    MultipleContextsNotSupported,
    /// `CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED`: a conditional handle was created but no
    /// conditional node uses it.
    ConditionalHandleUnused,
    /// A result value this crate does not know.
    Other(u32),
}

impl fmt::Display for InstantiateFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::InvalidStructure => "the graph is invalid (CUDA_GRAPH_INSTANTIATE_ERROR)",
            Self::InvalidGraphStructure => {
                "the graph structure is invalid (CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE)"
            }
            Self::NodeOperationNotSupported => {
                "a node's operation is not allowed where it is: in a device-launchable graph or a conditional body (CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED)"
            }
            Self::MultipleContextsNotSupported => {
                "device launch does not support several contexts (CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED)"
            }
            Self::ConditionalHandleUnused => {
                "a conditional handle is not used by any conditional node (CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED)"
            }
            Self::Other(v) => return write!(f, "unknown instantiate result {v}"),
        };
        f.write_str(s)
    }
}

/// Why `cuGraphExecUpdate_v2` refused an update (`CUgraphExecUpdateResult`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UpdateFailure {
    /// `CU_GRAPH_EXEC_UPDATE_ERROR`: invalid value (unspecified reason).
    Error,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED`: the graph's topology changed.
    TopologyChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED`: a node's type changed.
    NodeTypeChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED`: a kernel node's function changed in a way that
    /// cannot be updated.
    FunctionChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED`: parameters changed in a way that cannot be updated.
    ParametersChanged,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED`: something about the node is not supported for update.
    NotSupported,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE`: the function changed in an unsupported way.
    UnsupportedFunctionChange,
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED`: node attributes changed in an unsupported way.
    AttributesChanged,
    /// The exec or the source (a graph other than the one the exec was instantiated from) has
    /// memory allocation nodes: graph memory belongs to one graph and its exec (an allocation
    /// node's address is fixed), so the exec would allocate the other graph's addresses, leave
    /// its own to it, and its kernels would address memory it does not map. Refused by this
    /// crate before the driver is asked. Instantiate the source instead.
    GraphMemory,
    /// The exec or the source graph has programmatic edges (dependent kernels): the driver's
    /// update does not compare the kind of an edge, so it could put a kernel that does not wait
    /// behind one. Refused by this crate before the driver is asked; instantiate the source
    /// instead ([`GraphCache`](crate::GraphCache) and [`GraphSet`](crate::GraphSet) do).
    Programmatic,
    /// A result value this crate does not know.
    Other(u32),
}

impl fmt::Display for UpdateFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Error => "the update is invalid (CU_GRAPH_EXEC_UPDATE_ERROR)",
            Self::TopologyChanged => {
                "the graph topology changed (CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED)"
            }
            Self::NodeTypeChanged => {
                "a node's type changed (CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED)"
            }
            Self::FunctionChanged => {
                "a kernel node's function changed (CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED)"
            }
            Self::ParametersChanged => {
                "node parameters changed in an unsupported way (CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED)"
            }
            Self::NotSupported => {
                "the node cannot be updated (CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED)"
            }
            Self::UnsupportedFunctionChange => {
                "the function changed in an unsupported way (CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE)"
            }
            Self::AttributesChanged => {
                "node attributes changed in an unsupported way (CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED)"
            }
            Self::GraphMemory => {
                "the exec or the source graph has memory allocation nodes, whose memory belongs to one graph and its exec: instantiate the source instead"
            }
            Self::Programmatic => {
                "the exec or the source graph has programmatic edges (dependent kernels), which an update could put in front of a kernel that does not wait: instantiate the source instead"
            }
            Self::Other(v) => return write!(f, "unknown update result {v}"),
        };
        f.write_str(s)
    }
}

/// The kind of an [`Error::InvalidArgument`]: what about the arguments was refused.
///
/// Each refusal has one kind, and its message (see [`Refused`]) says the details. New kinds
/// may be added, so a `match` needs a `_` arm.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::*;
/// # fn f(device: &Device) -> cuda_graph::Result<()> {
/// match device.load_ptx("not PTX\0") {
///     Err(e) if e.refusal() == Some(Refusal::Image) => println!("not a module: {e}"),
///     Err(e) => return Err(e),
///     Ok(_module) => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// A size, length, count, range or alignment the operation cannot take: a zero-sized
    /// allocation or buffer, sizes that overflow the address space, copies between buffers of
    /// different lengths, a range out of a buffer, a graph allocation that is not a whole number
    /// of elements, a type aligned more than the memory, a memset element or shape that does not
    /// fit, a conditional node with no body or more bodies than supported. Pass sizes that fit.
    Size,
    /// Something of another device or context: a buffer, kernel, stream, event or graph of
    /// another device than the one the operation runs on, a cudarc object outside the primary
    /// context, a device ordinal that does not exist or a peer that cannot access the memory.
    /// Use objects of one device (copy the data over first).
    OtherDevice,
    /// Something that belongs to another graph, or is used where it does not belong: a
    /// [`GraphBuffer`](crate::GraphBuffer) in another graph than the one that allocates it, a
    /// free of an allocation this graph did not make, a conditional node of a copy, a conditional
    /// handle that already drives a node, a node of an exec's latest update's source that cannot
    /// be paired with the exec's nodes (inside a conditional body, either graph changed since,
    /// or two look-alike sinks). Use it only with the graph it came from.
    ForeignGraph,
    /// Work that would not be ordered as it must be: a kernel using a
    /// [`GraphBuffer`](crate::GraphBuffer) that does not come after its allocation node, a free
    /// node that does not come after every kernel using the allocation, a buffer from
    /// `Stream::alloc_async` used on another stream, an edge from a node to itself, a graph
    /// embedded into itself. Add the missing dependencies (or use a clone).
    Order,
    /// The stream or graph is capturing where it must not be, or not where it must be: a builder
    /// whose stream is not capturing, a host copy or an exec launch recorded into a capture, a
    /// graph a capture still records into, a [`GraphBuffer`](crate::GraphBuffer) or
    /// graph-only kernel on a plain stream, a capture begun outside this crate. End (or begin)
    /// the capture first.
    Capture,
    /// The graph was freed by the driver, or left broken by a failed capture (of a conditional
    /// body, say): nothing more can be recorded into it, and it cannot be instantiated, updated
    /// from, embedded or changed. Capture or build it again. Also a pinned buffer one of whose
    /// copies could not be tracked (the driver refused the event that follows it): its host side
    /// is no longer handed out.
    Broken,
    /// A CUDA call from inside a host callback (a driver thread, where CUDA calls are not
    /// allowed). Do the work before or after the callback, on a stream or as graph nodes.
    InCallback,
    /// A module image, source text or kernel name refused before the driver or NVRTC reads it:
    /// an empty or corrupt image, a host-side fatbin wrapper, PTX or CUDA source that is not text
    /// or holds a NUL, a kernel name holding a NUL. Pass the cubin, fatbin or PTX itself, and
    /// names as the module spells them.
    Image,
    /// A kernel's declared [`Signature`](crate::Signature) does not match the kernel (as the
    /// driver reports it): a parameter of another size, or another number of parameters. Declare
    /// the kernel as it is defined.
    Declaration,
    /// A launch attribute ([`LaunchAttributes`](crate::LaunchAttributes)) or dependent launch the
    /// device, the kernel or the grid cannot take: clusters before compute capability 9.0, or
    /// whose dimensions do not divide the grid or hold more than 8 blocks; a priority outside the
    /// context's range; a cooperative grid larger than the device holds at once; a programmatic
    /// dependency before compute capability 9.0 or from a node that is not a kernel. Use values
    /// the message names.
    Attribute,
    /// Options or a use this build, this object or the driver cannot do: managed graph memory
    /// without CUDA 13 bindings, kernel argument read-back without `cuFuncGetParamInfo`, an event
    /// without timing asked for a time, a device handle of an exec not instantiated for device
    /// launch, an update of an exec that handed out a device handle, a child graph or conditional
    /// body used on its own, removing nodes from a graph with memory nodes, cudarc's per-thread
    /// default stream. Change the options, or do it another way.
    Unsupported,
    /// Something asked for that is not there yet: a [`GraphCache`](crate::GraphCache) launched
    /// before its first refresh, a [`GraphSet`](crate::GraphSet) key launched before it was
    /// captured. Make it first.
    Missing,
    /// An object another thread is using where only one may at a time: an NCCL communicator
    /// in use on another thread (or by an open group there). Give each thread its own, or order
    /// the calls.
    Busy,
    /// Anything else: a refusal of code outside this crate that returns its `Result` (the crate
    /// itself files every refusal under one of the kinds above, and what it believes impossible
    /// as [`Error::Internal`]). The message says what.
    Other,
}

/// A refused argument: the kind of refusal and the message. Inside [`Error::InvalidArgument`].
///
/// Displays as the message; derefs to it as a `str`, so `r.contains("…")` reads it.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::*;
/// # fn f(e: &Error) {
/// if let Error::InvalidArgument(r) = e {
///     println!("{:?}: {}", r.kind(), r.message());
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    kind: Refusal,
    message: String,
}

impl Refused {
    /// The kind of refusal.
    pub fn kind(&self) -> Refusal {
        self.kind
    }

    /// What was refused and why, in words.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::ops::Deref for Refused {
    type Target = str;

    fn deref(&self) -> &str {
        &self.message
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA driver library (`libcuda.so.1` / `nvcuda.dll`) could not be loaded.
    #[error("the CUDA driver (libcuda) could not be loaded: no NVIDIA driver is installed or it is not on the library path")]
    DriverNotFound,

    /// The installed driver is too old for a feature.
    #[error("{feature} needs CUDA driver {needs} or newer, but the installed driver is {driver}")]
    Unsupported {
        /// What was asked for, e.g. `conditional IF nodes`.
        feature: &'static str,
        /// The driver version the feature needs.
        needs: DriverVersion,
        /// The installed driver's version.
        driver: DriverVersion,
    },

    /// The driver library lacks an entry point this crate was about to call.
    #[error("the CUDA driver {driver} does not export `{symbol}`; update the driver")]
    MissingEntryPoint {
        /// The missing symbol.
        symbol: &'static str,
        /// The installed driver's version.
        driver: DriverVersion,
    },

    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),

    /// The operation refused what it was given, before (or instead of) asking the driver. The
    /// [`Refused`] inside says which kind of refusal it is ([`Refused::kind`], a [`Refusal`]) and
    /// why, in words ([`Refused::message`]; it also derefs to the message as a `str`).
    /// [`Error::refusal`] gives the kind from the error itself.
    ///
    /// Branch on the kind, not on the message's words (those may be reworded):
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, dst: &DeviceBuffer<f32>, src: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// match stream.memcpy_dtod(dst, src) {
    ///     Err(Error::InvalidArgument(r)) if r.kind() == Refusal::Size => {
    ///         println!("the lengths differ: {r}");
    ///     }
    ///     Err(e) if e.refusal() == Some(Refusal::OtherDevice) => {
    ///         println!("copy through a buffer of the stream's device: {e}");
    ///     }
    ///     other => other?,
    /// }
    /// # Ok(()) }
    /// ```
    #[error("invalid argument: {0}")]
    InvalidArgument(Refused),

    /// A device ordinal past the number of devices.
    #[error("device ordinal {ordinal} is out of range: {count} CUDA device(s) present")]
    InvalidDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },

    /// NVRTC (`libnvrtc`), which `Device::compile` (feature `nvrtc`) needs, could not
    /// be loaded.
    #[error("NVRTC (libnvrtc) could not be loaded (tried {tried}): install the CUDA toolkit's NVRTC and put its library directory on the library path (LD_LIBRARY_PATH=/usr/local/cuda/lib64, say)")]
    NvrtcNotFound {
        /// The library names tried.
        tried: String,
    },

    /// NCCL (`libnccl`), which the collectives of `cuda_graph::nccl` (feature `nccl`) need, could
    /// not be loaded.
    #[error("NCCL (libnccl) could not be loaded (tried {tried}): install NCCL (the libnccl2 package, or the nvidia-nccl wheel) and put the directory of libnccl.so.2 on the library path (LD_LIBRARY_PATH)")]
    NcclNotFound {
        /// The library names tried.
        tried: String,
    },

    /// An NCCL call failed (feature `nccl`): its `ncclResult_t`, read as the integer it is.
    #[error("{call} failed: {name} ({code}){detail}")]
    Nccl {
        /// The NCCL entry point, e.g. `ncclAllReduce`.
        call: &'static str,
        /// The raw `ncclResult_t`, e.g. `5` (`ncclInvalidUsage`).
        code: i32,
        /// The result's name, e.g. `ncclInvalidUsage`, or NCCL's string for a code this crate does
        /// not know.
        name: String,
        /// NCCL's last error message for the communicator, as `: <message>`, or empty.
        detail: String,
    },

    /// NVRTC refused the CUDA C++ source.
    #[error("NVRTC could not compile the source ({result}):\n{log}")]
    Compile {
        /// NVRTC's result, e.g. `NVRTC_ERROR_COMPILATION`.
        result: String,
        /// The compiler's log: the errors and warnings, with line numbers.
        log: String,
    },

    /// A module has no function of that name.
    #[error("the module has no kernel named `{0}` (is it declared `extern \"C\"`?)")]
    FunctionNotFound(String),

    /// Instantiation refused the graph (`result_out` of `cuGraphInstantiateWithParams`).
    #[error("graph instantiation failed: {reason}")]
    Instantiate {
        /// The driver's reason.
        reason: InstantiateFailure,
        /// The driver call's own error, if it returned one.
        source: Option<DriverError>,
    },

    /// `cuGraphExecUpdate_v2` refused the update; the exec is unchanged and keeps working.
    #[error("graph exec update failed: {reason}")]
    Update {
        /// The driver's reason.
        reason: UpdateFailure,
        /// The driver call's own error.
        source: Option<DriverError>,
    },

    /// The stream capture was invalidated by an operation that is illegal while capturing (for
    /// example a synchronous copy in `Global` mode). The capture is over and the stream usable.
    #[error("the stream capture was invalidated by an operation that is not allowed while capturing ({0})")]
    CaptureInvalidated(#[source] DriverError),

    /// A conditional handle was used with a graph that did not create it.
    #[error("the conditional handle belongs to another graph; create it with `create_conditional_handle` on this graph's builder")]
    ForeignConditionalHandle,

    /// A [`GraphNode`](crate::GraphNode) was passed to a definition of another graph (an edge
    /// between two graphs, a dependency from another graph), or to an exec that was neither
    /// instantiated from its graph nor last updated from it.
    #[error("the node belongs to another graph: pass a node only to the definition of the graph it was added to (or listed from), or to an exec instantiated from that graph or last updated from it")]
    ForeignNode,

    /// A [`GraphNode`](crate::GraphNode) was used after `destroy_node` destroyed it.
    #[error("the node was destroyed: it cannot be used any more")]
    DestroyedNode,

    /// A node was read back as a typed node of another kind
    /// ([`GraphDefinition::typed_node`](crate::GraphDefinition::typed_node)).
    #[error("the node is a {found:?} node, not a {expected:?} node")]
    WrongNodeType {
        /// The kind asked for.
        expected: crate::node_type::NodeType,
        /// The kind the driver reports.
        found: crate::node_type::NodeType,
    },

    /// A node passed to an executable [`Graph`](crate::Graph) is not one of the nodes it was
    /// instantiated with: it was added to its definition after the instantiation.
    #[error("the node was added to the graph after this exec was instantiated from it: the exec does not have it (instantiate again, or update with `GraphCache`)")]
    NodeNotInExec,

    /// A host callback panicked; the panic was caught at the FFI boundary.
    #[error("a host callback panicked: {0}")]
    CallbackPanicked(String),

    /// A state the crate believes impossible: the driver answered in a way it does not expect
    /// (a null handle where it promised one, fewer conditional bodies than asked, a capture
    /// status it does not know) or its own records disagree. Nothing the caller did is at fault;
    /// the message says what happened, and it is worth a report.
    #[error("internal error: {0} (a state this crate does not expect; please report it)")]
    Internal(String),

    /// Writing a file failed (e.g. a DOT debug print to an unwritable path).
    #[error("cannot write `{path}`: {message}")]
    Io {
        /// The path.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`] of kind `kind` saying `message` (the crate makes its
    /// refusals with this; code of its own that returns this crate's `Result` may too).
    ///
    /// ```
    /// use cuda_graph::{Error, Refusal};
    /// let e = Error::invalid(Refusal::Size, "STEPS must be at least 1");
    /// assert_eq!(e.to_string(), "invalid argument: STEPS must be at least 1");
    /// assert_eq!(e.refusal(), Some(Refusal::Size));
    /// ```
    #[cold]
    #[inline(never)]
    pub fn invalid(kind: Refusal, message: impl Into<String>) -> Error {
        Error::InvalidArgument(Refused {
            kind,
            message: message.into(),
        })
    }

    /// The kind of refusal, if this is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, dst: &DeviceBuffer<f32>, src: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// if let Err(e) = stream.memcpy_dtod(dst, src) {
    ///     if e.refusal() == Some(Refusal::OtherDevice) {
    ///         println!("a buffer is on another device than the stream");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::InvalidArgument(r) => Some(r.kind),
            _ => None,
        }
    }

    /// The driver error inside, if this error came from a driver call.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// if let Err(e) = device.load_ptx("not PTX") {
    ///     if let Some(d) = e.driver_error() {
    ///         println!("{} returned {}", d.call(), d.name());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn driver_error(&self) -> Option<&DriverError> {
        match self {
            Error::Driver(e) | Error::CaptureInvalidated(e) => Some(e),
            Error::Instantiate { source, .. } | Error::Update { source, .. } => source.as_ref(),
            _ => None,
        }
    }

    /// The driver's `CUresult` code, if this error came from a driver call.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// match device.load_ptx("not PTX") {
    ///     Err(e) => println!("CUresult {:?}", e.code()),
    ///     Ok(_) => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub fn code(&self) -> Option<u32> {
        self.driver_error().map(DriverError::code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_read_like_the_driver() {
        let e = Error::Driver(DriverError::new(
            "cuModuleLoadData",
            218,
            "CUDA_ERROR_INVALID_PTX",
            "a PTX JIT compilation failed",
        ));
        assert_eq!(
            e.to_string(),
            "cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed"
        );
        assert_eq!(e.code(), Some(218));
        let d = e.driver_error().expect("a driver error");
        assert_eq!(d.call(), "cuModuleLoadData");
        assert_eq!(d.code(), 218);
        assert_eq!(d.name(), "CUDA_ERROR_INVALID_PTX");
        assert_eq!(d.description(), "a PTX JIT compilation failed");
        assert_eq!(d.result(), Some(sys::CUresult::CUDA_ERROR_INVALID_PTX));
    }

    #[test]
    fn an_unknown_code_is_kept_and_has_no_result() {
        let d = DriverError::new(
            "cuGraphLaunch",
            0xDEAD_BEEF,
            "CUDA_ERROR_FROM_THE_FUTURE",
            "a result a newer driver added",
        );
        assert_eq!(d.result(), None);
        assert_eq!(d.code(), 0xDEAD_BEEF);
        assert_eq!(d.name(), "CUDA_ERROR_FROM_THE_FUTURE");
        assert_eq!(
            d.to_string(),
            "cuGraphLaunch failed: CUDA_ERROR_FROM_THE_FUTURE (3735928559): a result a newer driver added"
        );
        assert_eq!(format!("{d:?}"), d.to_string());
        let e = Error::Driver(d);
        assert_eq!(e.code(), Some(0xDEAD_BEEF));
        assert_eq!(e.driver_error().and_then(DriverError::result), None);
        // Codes next to known ones, and past the last one, are unknown too (in the bindings of
        // every `cuda-*` feature: 13.4 added 227, 13.1 917 and later 918, 919).
        for code in [9, 33, 35, 228, 920, 998, 1000, u32::MAX] {
            assert_eq!(known_result(code), None, "{code}");
        }
    }

    #[test]
    fn known_codes_round_trip() {
        assert!(KNOWN_RESULTS.len() > 90);
        for &r in KNOWN_RESULTS {
            let d = DriverError::new("cuTest", r as u32, format!("{r:?}"), "");
            assert_eq!(d.result(), Some(r));
            assert_eq!(d.code(), r as u32);
        }
        assert_eq!(known_result(0), Some(sys::CUresult::CUDA_SUCCESS));
        assert_eq!(known_result(600), Some(sys::CUresult::CUDA_ERROR_NOT_READY));
        assert_eq!(known_result(999), Some(sys::CUresult::CUDA_ERROR_UNKNOWN));
    }

    #[test]
    fn unsupported_names_the_feature_and_versions() {
        let e = Error::Unsupported {
            feature: "conditional SWITCH nodes",
            needs: DriverVersion::V12_8,
            driver: DriverVersion(12040),
        };
        assert_eq!(
            e.to_string(),
            "conditional SWITCH nodes needs CUDA driver 12.8 or newer, but the installed driver is 12.4"
        );
        assert_eq!(e.code(), None);
    }

    #[test]
    fn refusals_keep_their_message_and_kind() {
        let e = Error::invalid(Refusal::Size, "a device buffer of 0 elements");
        assert_eq!(
            e.to_string(),
            "invalid argument: a device buffer of 0 elements"
        );
        assert_eq!(e.refusal(), Some(Refusal::Size));
        assert_eq!(e.code(), None);
        let Error::InvalidArgument(r) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(r.kind(), Refusal::Size);
        assert_eq!(r.message(), "a device buffer of 0 elements");
        assert_eq!(r.to_string(), "a device buffer of 0 elements");
        assert_eq!(format!("{r}"), r.message());
        // Deref to the message.
        assert!(r.contains("0 elements"));
        assert!(r.starts_with("a device"));
        let s: &str = r;
        assert_eq!(s, "a device buffer of 0 elements");
        assert_eq!(r.clone(), *r);
        assert_ne!(
            *r,
            match Error::invalid(Refusal::Other, r.message()) {
                Error::InvalidArgument(o) => o,
                other => panic!("{other:?}"),
            }
        );
        let owned = String::from("the module image is empty");
        let e = Error::invalid(Refusal::Image, owned);
        assert_eq!(e.to_string(), "invalid argument: the module image is empty");
        assert_eq!(e.refusal(), Some(Refusal::Image));
        let other = Error::ForeignNode;
        assert_eq!(other.refusal(), None);
    }

    #[test]
    fn failure_reasons_name_the_driver_constant() {
        let u = Error::Update {
            reason: UpdateFailure::TopologyChanged,
            source: None,
        };
        assert!(u
            .to_string()
            .contains("CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED"));
        let i = Error::Instantiate {
            reason: InstantiateFailure::ConditionalHandleUnused,
            source: None,
        };
        assert!(i.to_string().contains("CONDITIONAL_HANDLE_UNUSED"));
    }
}
