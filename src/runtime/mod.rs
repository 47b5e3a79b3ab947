//! The runtime layer: devices, streams, events, device memory, modules and kernel launches.

mod buffer;
mod copy;
mod device;
mod event;
mod image;
mod kernel;
pub(crate) mod launch;
mod module;
mod observer;
mod pinned;
mod stream;

pub(crate) use buffer::bounds;
pub use buffer::{DeviceBuffer, DeviceCopy};
pub(crate) use copy::check_whole;
pub use copy::Copy3d;
pub use device::{Device, GraphMemoryUsage};
pub use event::{Event, EventOptions};
pub(crate) use kernel::{
    arg_for, collect as collect_args, push_slice, sealed as kernel_sealed, with_refs, ArgRefs,
    GraphUse, OwnerRef,
};
pub use kernel::{
    ArgFor, ArgsFor, ConstSlice, DependentKernel, Kernel, KernelParam, Signature, Slice,
    WaitsForPredecessor,
};
pub use launch::{KernelArg, KernelArgs, LaunchAttributes, LaunchConfig};
pub use module::{Function, Module};
pub use observer::ReleaseObserver;
pub use pinned::PinnedBuffer;
pub use stream::Stream;
pub(crate) use stream::{OwnCapture, Recording};

static_assertions::assert_impl_all!(Device: Send, Sync, Clone, std::fmt::Debug);
static_assertions::assert_impl_all!(Stream: Send, Sync, Clone, std::fmt::Debug);
static_assertions::assert_impl_all!(Event: Send, Sync, Clone, std::fmt::Debug);
static_assertions::assert_impl_all!(DeviceBuffer<i32>: Send, Sync, Clone, std::fmt::Debug);
static_assertions::assert_impl_all!(PinnedBuffer<i32>: Send, Sync, std::fmt::Debug);
static_assertions::assert_not_impl_any!(PinnedBuffer<i32>: Clone);
static_assertions::assert_impl_all!(EventOptions: Send, Sync, Copy, Default, std::fmt::Debug);
static_assertions::assert_impl_all!(GraphMemoryUsage: Send, Sync, Copy, Default, std::fmt::Debug);
static_assertions::assert_impl_all!(Module: Send, Sync, Clone, std::fmt::Debug);
static_assertions::assert_impl_all!(Function: Send, Sync, Clone, std::fmt::Debug);
static_assertions::assert_impl_all!(Kernel<(*mut f32, u32)>: Send, Sync, Clone, std::fmt::Debug);
static_assertions::assert_impl_all!(KernelArgs<'static>: Send, Sync, std::fmt::Debug);
