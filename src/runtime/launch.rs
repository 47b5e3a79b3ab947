use std::any::Any;
use std::sync::Arc;

use super::{DeviceBuffer, DeviceCopy};

/// Grid and block dimensions and dynamic shared memory for a kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid, `(x, y, z)`.
    pub grid: (u32, u32, u32),
    /// Threads in a block, `(x, y, z)`.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self::single()
    }
}

impl LaunchConfig {
    /// One block of one thread.
    pub const fn single() -> Self {
        LaunchConfig {
            grid: (1, 1, 1),
            block: (1, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Enough 256-thread blocks to give each of `n` elements a thread (at least one block).
    pub const fn for_num_elems(n: u32) -> Self {
        let blocks = n.div_ceil(256);
        LaunchConfig {
            grid: (if blocks == 0 { 1 } else { blocks }, 1, 1),
            block: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// A value that can be passed to a kernel: numbers by value, buffers by device address.
pub trait KernelArg {
    /// Appends this argument to `args`.
    fn push_to(&self, args: &mut KernelArgs);
}

/// The arguments of one kernel launch, in order, and the resources they refer to.
///
/// A buffer passed as an argument is kept alive by every graph that captures the launch.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(buf: &DeviceBuffer<i32>) {
/// let args = KernelArgs::new().arg(buf).arg(3i32).arg(4i32);
/// # }
/// ```
#[derive(Default)]
pub struct KernelArgs {
    /// Each argument's bytes, 8-byte aligned.
    values: Vec<Box<[u64]>>,
    /// Resources the arguments refer to.
    pub(crate) keep: Vec<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for KernelArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelArgs")
            .field("count", &self.values.len())
            .finish_non_exhaustive()
    }
}

impl KernelArgs {
    /// No arguments.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an argument.
    pub fn arg(mut self, value: impl KernelArg) -> Self {
        value.push_to(&mut self);
        self
    }

    /// Appends an argument in place.
    pub fn push(&mut self, value: impl KernelArg) -> &mut Self {
        value.push_to(self);
        self
    }

    /// The number of arguments.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Appends the bytes of a plain value.
    pub fn push_value<T: DeviceCopy>(&mut self, value: T) {
        let words = std::mem::size_of::<T>().div_ceil(8).max(1);
        let mut storage = vec![0u64; words].into_boxed_slice();
        // SAFETY: `storage` holds at least size_of::<T>() bytes and is 8-byte aligned.
        unsafe { storage.as_mut_ptr().cast::<T>().write(value) };
        self.values.push(storage);
    }

    /// Keeps `resource` alive as long as a graph that captures this launch.
    pub(crate) fn keep_alive(&mut self, resource: Arc<dyn Any + Send + Sync>) {
        self.keep.push(resource);
    }

    /// The `void**` array `cuLaunchKernel` takes; valid while `self` is borrowed.
    pub(crate) fn pointers(&self) -> Vec<*mut std::ffi::c_void> {
        self.values
            .iter()
            .map(|v| v.as_ptr() as *mut std::ffi::c_void)
            .collect()
    }
}

impl<T: DeviceCopy> KernelArg for T {
    fn push_to(&self, args: &mut KernelArgs) {
        args.push_value(*self);
    }
}

impl<T: DeviceCopy> KernelArg for &DeviceBuffer<T> {
    fn push_to(&self, args: &mut KernelArgs) {
        args.push_value(self.device_ptr());
        args.keep_alive(self.alloc.clone());
    }
}

impl<T: DeviceCopy> KernelArg for &mut DeviceBuffer<T> {
    fn push_to(&self, args: &mut KernelArgs) {
        (&**self).push_to(args);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_stored_in_order() {
        let args = KernelArgs::new().arg(7i32).arg(2.5f32).arg(u64::MAX);
        assert_eq!(args.len(), 3);
        let p = args.pointers();
        unsafe {
            assert_eq!(*(p[0] as *const i32), 7);
            assert_eq!(*(p[1] as *const f32), 2.5);
            assert_eq!(*(p[2] as *const u64), u64::MAX);
        }
    }

    #[test]
    fn config_covers_elements() {
        assert_eq!(LaunchConfig::for_num_elems(1000).grid.0, 4);
        assert_eq!(LaunchConfig::for_num_elems(0).grid.0, 1);
    }
}
