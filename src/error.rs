//! The crate's error type.

use std::fmt;

use cudarc::driver::sys;

use crate::driver::DriverVersion;

/// `Result<T, cuda_graph::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failed driver call: the `CUresult`, its name and description, and the call.
///
/// Displays as `cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed`.
#[derive(Clone, PartialEq, Eq)]
pub struct DriverError {
    /// The driver entry point that failed, e.g. `cuModuleLoadData`.
    pub call: &'static str,
    /// The raw `CUresult` value.
    pub code: u32,
    /// The result's name from `cuGetErrorName`, e.g. `CUDA_ERROR_INVALID_PTX`.
    pub name: String,
    /// The result's description from `cuGetErrorString`.
    pub description: String,
}

impl DriverError {
    /// The raw result as the binding's enum.
    pub fn result(&self) -> sys::CUresult {
        // SAFETY: `code` was produced from a `CUresult` returned by the driver
        // (see `driver::check`), so it is one of the enum's values.
        unsafe { std::mem::transmute::<u32, sys::CUresult>(self.code) }
    }
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
            Self::Other(v) => return write!(f, "unknown update result {v}"),
        };
        f.write_str(s)
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

    /// The caller passed a value the operation cannot take.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A device ordinal past the number of devices.
    #[error("device ordinal {ordinal} is out of range: {count} CUDA device(s) present")]
    InvalidDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
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
    /// between two graphs, a dependency from another graph).
    #[error("the node belongs to another graph: pass a node only to the definition of the graph it was added to (or listed from)")]
    ForeignNode,

    /// A [`GraphNode`](crate::GraphNode) was used after `destroy_node` destroyed it.
    #[error("the node was destroyed: it cannot be used any more")]
    DestroyedNode,

    /// A host callback panicked; the panic was caught at the FFI boundary.
    #[error("a host callback panicked: {0}")]
    CallbackPanicked(String),

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
    /// The driver error inside, if this error came from a driver call.
    pub fn driver_error(&self) -> Option<&DriverError> {
        match self {
            Error::Driver(e) | Error::CaptureInvalidated(e) => Some(e),
            Error::Instantiate { source, .. } | Error::Update { source, .. } => source.as_ref(),
            _ => None,
        }
    }

    /// The driver's `CUresult` code, if this error came from a driver call.
    pub fn code(&self) -> Option<u32> {
        self.driver_error().map(|e| e.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_read_like_the_driver() {
        let e = Error::Driver(DriverError {
            call: "cuModuleLoadData",
            code: 218,
            name: "CUDA_ERROR_INVALID_PTX".into(),
            description: "a PTX JIT compilation failed".into(),
        });
        assert_eq!(
            e.to_string(),
            "cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed"
        );
        assert_eq!(e.code(), Some(218));
        assert_eq!(
            e.driver_error().map(|d| d.result()),
            Some(sys::CUresult::CUDA_ERROR_INVALID_PTX)
        );
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
