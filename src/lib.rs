//! # cuda-graph
//!
//! CUDA graphs for Rust whose illegal uses fail to compile.
//!
//! A CUDA graph records GPU work once — by stream capture or by adding nodes explicitly —, is
//! instantiated into an executable graph, and is replayed many times at a fraction of the launch
//! cost. This crate puts the capture state machine into the types: a builder is
//! [`GraphBuilder<K, S>`](GraphBuilder), generic over a kind (`Primary`, `Forked`,
//! `ConditionalBody`) and a state (`NotStarted`, `Capturing<M>`, `Ended`), and a method exists only
//! where it is legal. What remains at run time is a thin layer of reference-counted RAII handles
//! over the CUDA driver, loaded dynamically: a machine without a driver builds and runs, and gets
//! [`Error::DriverNotFound`] instead of a crash.
//!
//! ## Layers
//! | layer | what |
//! | --- | --- |
//! | driver handles (private) | one RAII type per driver object over `cudarc::driver::sys` |
//! | runtime | [`Device`], [`Stream`], [`Event`], [`DeviceBuffer`], [`Module`], [`Kernel`] (typed, safe launches; [`Slice`]), [`Function`] and [`KernelArgs`] (untyped), [`LaunchConfig`], [`Error`] |
//! | typestate | [`GraphBuilder`] and its markers in [`builder`] |
//! | executable | [`Graph`], [`InstantiateOptions`] |
//! | explicit | [`GraphDefinition`], [`GraphNode`], [`NodeType`], [`GraphAllocation`] (see [the definitions guide](docs::definitions)) |
//!
//! Everything a user needs is in the [`prelude`]. The guides are in [`docs`]: a
//! [tour](docs::guide), [explicit definitions](docs::definitions) and the [design](docs::design).
//!
//! ## Features
//! The driver bindings are cudarc's, and its features pick their CUDA version and how libcuda is
//! found; this crate forwards them under the same names: one of `cuda-12030` … `cuda-13040` and
//! one of `dynamic-loading` or `dynamic-linking` (default: `cuda-12080`, `dynamic-loading`). A
//! crate that depends on cudarc too turns the defaults off and names the same two for both.
//!
//! The feature `cudarc` (off by default) adds safe adapters for cudarc's own types — captures on
//! a `CudaStream`, `CudaSlice`s as buffers, `CudaFunction`s as kernels — in `interop::cudarc`.
//! The feature `nvrtc` compiles CUDA C++ at run time (`Device::compile`, with NVRTC opened when
//! first used), and `half` makes `half::f16` and `half::bf16` [`DeviceCopy`].
//! The feature `nccl` adds NCCL collectives on streams and recorded into captures, in `nccl`.
//!
//! ## Example
//! ```no_run
//! use cuda_graph::prelude::*;
//!
//! # fn main() -> cuda_graph::Result<()> {
//! let device = Device::new(0)?;
//! # let fatbin: &[u8] = &[];
//! // SAFETY: `fatbin` is the image nvcc built for this program, unmodified (a corrupt binary
//! // image can crash the driver itself; PTX text loads safely with `load_ptx`).
//! let module = unsafe { device.load_module(fatbin)? };
//! // SAFETY: `add_one(int* p)` increments p[0]: its parameter list, within any buffer.
//! let add_one = unsafe { module.kernel::<(*mut i32,)>("add_one")? };
//! let counter = device.alloc_zeroed::<i32>(1)?;
//!
//! let builder = device.create_graph_builder()?.begin_building(Global)?;
//! for _ in 0..3 {
//!     builder.launch(&add_one, LaunchConfig::single(), &counter)?;
//! }
//! let graph = builder.end_building()?.instantiate()?;
//! let stream = device.create_stream()?;
//! graph.launch(&stream)?;
//! stream.synchronize()?;
//! assert_eq!(counter.to_vec()?, [3]);
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations)]
// docs.rs (nightly rustdoc, `--cfg docsrs`): each item a feature adds carries that feature's badge.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod builder;
mod core;
mod definition;
pub mod docs;
pub(crate) mod driver;
mod error;
mod graph;
#[cfg(feature = "cudarc")]
pub mod interop;
#[cfg(feature = "nccl")]
pub mod nccl;
mod node_type;
mod runtime;
mod version;

pub use builder::{
    CaptureMode, Capturing, ConditionalBody, ConditionalHandle, Ended, Forked, Global,
    GraphBuilder, HostCallback, NotStarted, Primary, Relaxed, ThreadLocal, MAX_SWITCH_BODIES,
};
pub use core::conditional::ConditionalKind;
pub use core::source::FinishedGraph;
pub use definition::{
    node_kind, ChildGraphInfo, ChildGraphNode, ConditionalInfo, ConditionalNode, EmptyNode,
    EventInfo, EventRecordNode, EventWaitNode, GraphAllocation, GraphBuffer, GraphDefinition,
    GraphNode, HostInfo, HostNode, KernelInfo, KernelNode, MemAllocInfo, MemAllocNode,
    MemAllocOptions, MemFreeInfo, MemFreeNode, MemcpyInfo, MemcpyNode, MemoryKind, Memset2d,
    MemsetInfo, MemsetNode, MemsetValue, NodeInfo, NodeKind, NodeParams, NodeType, PeerAccess,
    ReadBack, TypedNode,
};
pub use driver::{driver_version, DriverVersion};
pub use error::{DriverError, Error, InstantiateFailure, Refusal, Refused, Result, UpdateFailure};
pub use graph::{
    CacheOutcome, DeviceGraph, DotDetail, Graph, GraphCache, GraphDebugPrintOptions, GraphSet,
    GraphSetStats, InstantiateOptions,
};
pub use runtime::ConstSlice;
pub use runtime::{
    ArgFor, ArgsFor, Copy3d, DependentKernel, Device, DeviceBuffer, DeviceCopy, Event,
    EventOptions, Function, GraphMemoryUsage, Kernel, KernelArg, KernelArgs, KernelParam,
    LaunchAttributes, LaunchConfig, Module, PinnedBuffer, ReleaseObserver, Signature, Slice,
    Stream, WaitsForPredecessor,
};

/// What a program writes daily: `use cuda_graph::prelude::*;` — devices, streams, buffers,
/// kernels, the builder and its states, definitions, execs and the cache, errors. The rest (typed
/// node handles other than [`KernelNode`], node parameter details, debug output options,
/// observers, driver versions) is reached by path, `cuda_graph::…`.
///
/// Beside `use cudarc::driver::*;` one name is in both globs, `LaunchConfig` (each crate has its
/// own): `use cuda_graph::LaunchConfig;` picks this crate's and beats both globs.
pub mod prelude {
    pub use crate::{
        CacheOutcome, Capturing, ConditionalHandle, ConstSlice, Device, DeviceBuffer, DeviceCopy,
        Ended, Error, Event, Function, Global, Graph, GraphAllocation, GraphBuffer, GraphBuilder,
        GraphCache, GraphDefinition, GraphNode, InstantiateOptions, Kernel, KernelArgs, KernelNode,
        LaunchConfig, Module, NodeParams, NotStarted, PinnedBuffer, Primary, Relaxed, Result,
        Slice, Stream, ThreadLocal,
    };
}

static_assertions::assert_impl_all!(Error: Send, Sync, std::error::Error, Clone);
