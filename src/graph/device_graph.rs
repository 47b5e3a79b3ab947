//! [`DeviceGraph`]: an exec's handle for launches from device code, and what it keeps alive.

use std::sync::{Arc, Mutex};

use crate::runtime::{KernelArg, KernelArgs};

/// What an exec that handed out device handles releases: held by the exec's own release (after
/// its last host launch) and by every [`DeviceGraph`]; released on the release thread when the
/// last of them goes.
#[derive(Default)]
pub(super) struct DeviceLaunchKeep {
    pub(super) held: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

impl Drop for DeviceLaunchKeep {
    fn drop(&mut self) {
        let held = self
            .held
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(held) = held {
            crate::driver::release::later(Box::new(move || drop(held)));
        }
    }
}

/// An exec as device code launches it: the `cudaGraphExec_t` argument of a kernel that calls
/// `cudaGraphLaunch` (device graph launch). Made by [`Graph::device_handle`](crate::Graph::device_handle); pass it as a kernel
/// argument (by value or by reference).
///
/// A graph whose kernel takes it keeps the exec alive for as long as that graph and its execs
/// live, even after the [`Graph`](crate::Graph) is dropped. `Clone`, `Send + Sync`.
#[derive(Clone)]
#[must_use = "a device handle does nothing until a kernel takes it as an argument"]
pub struct DeviceGraph {
    pub(super) raw: u64,
    /// The exec's [`DeviceLaunchKeep`], as the owner a graph holds.
    pub(super) keep: Arc<dyn std::any::Any + Send + Sync>,
    /// The exec's device.
    pub(super) device: i32,
}

impl std::fmt::Debug for DeviceGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceGraph")
            .field("exec", &(self.raw as *const ()))
            .finish()
    }
}

impl DeviceGraph {
    /// The raw `CUgraphExec`, as the 64-bit value the kernel receives.
    ///
    /// ```no_run
    /// # fn f(g: &cuda_graph::Graph) -> cuda_graph::Result<()> {
    /// let handle = g.device_handle()?;
    /// assert_ne!(handle.raw(), 0);
    /// # Ok(()) }
    /// ```
    pub fn raw(&self) -> u64 {
        self.raw
    }
}

/// Given by value, the arguments hold the device graph's exec.
impl KernelArg for DeviceGraph {
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(self.raw);
        args.keep_owned(self.keep);
    }
}

/// Given by reference, the arguments borrow it.
impl KernelArg for &DeviceGraph {
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(self.raw);
        args.keep_borrowed(crate::runtime::OwnerRef::Other(&self.keep));
    }
}

/// A `cudaGraphExec_t` parameter of a typed [`Kernel`](crate::Kernel).
impl crate::KernelParam for DeviceGraph {}
impl crate::runtime::kernel_sealed::Param for DeviceGraph {
    const SIZE: usize = std::mem::size_of::<u64>();
}
crate::runtime::arg_for! {
    [] DeviceGraph => DeviceGraph, |g, r| r.other(&g.raw, &g.keep, g.device);
    [] &DeviceGraph => DeviceGraph, |g, r| r.other(&g.raw, &g.keep, g.device);
}
