use std::sync::Arc;

use cudarc::driver::sys;

use super::{DeviceBuffer, DeviceCopy, Event, Function, KernelArgs, LaunchConfig};
use crate::driver::drv;
use crate::driver::stream::{status_out, CaptureStatus, StreamHandle};
use crate::driver::user_object::{self, KeepAlive};
use crate::error::{Error, Result};
use crate::Device;

/// A non-blocking CUDA stream. Clones share the stream. `Send + Sync`.
///
/// Operations that refer to crate resources (buffers, modules) keep them alive in the graph when
/// the stream is capturing, so a captured graph never outlives what it uses.
#[derive(Clone)]
pub struct Stream {
    pub(crate) handle: Arc<StreamHandle>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &self.handle.raw)
            .finish_non_exhaustive()
    }
}

impl Stream {
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.handle.raw
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> Device {
        Device::from_ctx(&self.handle.ctx)
    }

    /// Blocks until all work on the stream is done. (While the stream is capturing this
    /// invalidates the capture, which `end_building` then reports.)
    pub fn synchronize(&self) -> Result<()> {
        self.handle.ctx.bind()?;
        // SAFETY: the stream is live.
        unsafe { drv!(cuStreamSynchronize(self.raw())) }
    }

    /// Records `event` after the work queued so far.
    pub fn record(&self, event: &Event) -> Result<()> {
        self.handle.ctx.bind()?;
        // SAFETY: both handles are live and belong to this context.
        unsafe { drv!(cuEventRecord(event.handle.raw, self.raw())) }
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.handle.ctx.bind()?;
        // SAFETY: both handles are live; flags must be 0.
        unsafe { drv!(cuStreamWaitEvent(self.raw(), event.handle.raw, 0)) }
    }

    /// Whether the stream is capturing now (an invalidated capture counts).
    pub fn is_capturing(&self) -> Result<bool> {
        Ok(self.handle.capture_status()? != CaptureStatus::None)
    }

    /// If the stream is capturing, moves `make()` into the capture's graph as a user object and
    /// returns `true`; otherwise returns `false`.
    pub(crate) fn keep_alive_in_capture(&self, make: impl FnOnce() -> KeepAlive) -> Result<bool> {
        self.handle.ctx.bind()?;
        let mut status = CaptureStatus::NONE_RAW;
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream is live; the out pointers are valid or null where allowed; the
        // status is written into a `u32` (see `status_out`), never read as the bindings' enum.
        unsafe {
            drv!(cuStreamGetCaptureInfo_v2(
                self.raw(),
                status_out(&mut status),
                std::ptr::null_mut(),
                &mut graph,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ))
        }?;
        match CaptureStatus::from_raw(status) {
            CaptureStatus::Active if !graph.is_null() => {
                user_object::retain(graph, make()).map(|()| true)
            }
            _ => Ok(false),
        }
    }

    /// Launches `function` on this stream (or into its capture).
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and type, and the kernel
    /// must only access memory that is valid for it (in bounds of the buffers it is given).
    pub unsafe fn launch(
        &self,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        let keep: Vec<_> = args.keep.clone();
        let module = function.module.clone();
        self.keep_alive_in_capture(|| Box::new((module, keep)))?;
        let mut ptrs = args.pointers();
        let params = if ptrs.is_empty() {
            std::ptr::null_mut()
        } else {
            ptrs.as_mut_ptr()
        };
        let (g, b) = (config.grid, config.block);
        // SAFETY: the context is current (bound above); `params` points at `args.len()` pointers to
        // argument storage that lives until the call returns (the driver copies it); the caller
        // promises the arguments match the kernel.
        unsafe {
            drv!(cuLaunchKernel(
                function.raw,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                config.shared_mem_bytes,
                self.raw(),
                params,
                std::ptr::null_mut()
            ))
        }
    }

    fn same_context<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>) -> Result<()> {
        if !Arc::ptr_eq(&buf.alloc.ctx, &self.handle.ctx)
            && buf.alloc.ctx.device != self.handle.ctx.device
        {
            return Err(Error::InvalidArgument(
                "the buffer lives on another device than the stream".into(),
            ));
        }
        Ok(())
    }

    /// Sets every byte of `buf` to `value` (asynchronous; capturable).
    pub fn memset_d8<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, value: u8) -> Result<()> {
        self.same_context(buf)?;
        let alloc = buf.alloc.clone();
        self.keep_alive_in_capture(|| Box::new(alloc))?;
        // SAFETY: `buf` holds `byte_len` bytes; the allocation is kept alive by the caller's
        // handle or, in a capture, by the graph.
        unsafe {
            drv!(cuMemsetD8Async(
                buf.device_ptr(),
                value,
                buf.byte_len(),
                self.raw()
            ))
        }
    }

    /// Sets every 32-bit word of `buf` to `value` (asynchronous; capturable). The buffer's byte
    /// length must be a multiple of 4.
    pub fn memset_d32<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, value: u32) -> Result<()> {
        self.same_context(buf)?;
        if buf.byte_len() % 4 != 0 {
            return Err(Error::InvalidArgument(format!(
                "memset_d32 of a {}-byte buffer: the size must be a multiple of 4",
                buf.byte_len()
            )));
        }
        let alloc = buf.alloc.clone();
        self.keep_alive_in_capture(|| Box::new(alloc))?;
        // SAFETY: `buf` holds `byte_len / 4` words.
        unsafe {
            drv!(cuMemsetD32Async(
                buf.device_ptr(),
                value,
                buf.byte_len() / 4,
                self.raw()
            ))
        }
    }

    /// Copies `src` into `dst` (asynchronous; capturable). The lengths must match.
    pub fn memcpy_dtod<T: DeviceCopy>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
    ) -> Result<()> {
        self.same_context(dst)?;
        self.same_context(src)?;
        if dst.len() != src.len() {
            return Err(Error::InvalidArgument(format!(
                "memcpy_dtod from {} elements into {}",
                src.len(),
                dst.len()
            )));
        }
        let (a, b) = (dst.alloc.clone(), src.alloc.clone());
        self.keep_alive_in_capture(|| Box::new((a, b)))?;
        // SAFETY: both buffers hold `byte_len` bytes.
        unsafe {
            drv!(cuMemcpyDtoDAsync_v2(
                dst.device_ptr(),
                src.device_ptr(),
                dst.byte_len(),
                self.raw()
            ))
        }
    }

    /// Copies host `data` into `dst`, ordered on this stream. The host slice is read before the
    /// call returns. Refused while the stream is capturing: a captured copy would keep reading
    /// `data` at every launch, long after the borrow ended.
    pub fn memcpy_htod<T: DeviceCopy>(&self, dst: &DeviceBuffer<T>, data: &[T]) -> Result<()> {
        self.same_context(dst)?;
        if data.len() != dst.len() {
            return Err(Error::InvalidArgument(format!(
                "memcpy_htod of {} elements into a buffer of {}",
                data.len(),
                dst.len()
            )));
        }
        if self.is_capturing()? {
            return Err(Error::InvalidArgument(
                "memcpy_htod cannot be captured (the graph would read host memory it does not own); copy before capturing, or capture a device-to-device copy".into(),
            ));
        }
        // Synchronise first so the copy is complete when we return and `data` may be freed.
        self.handle.ctx.bind()?;
        // SAFETY: `data` holds `byte_len` bytes and is read before the synchronize returns.
        unsafe {
            drv!(cuMemcpyHtoDAsync_v2(
                dst.device_ptr(),
                data.as_ptr().cast(),
                dst.byte_len(),
                self.raw()
            ))
        }?;
        self.synchronize()
    }
}
