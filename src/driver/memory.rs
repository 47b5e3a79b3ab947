//! Device memory handle.

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::{drv, drv_drop, release};
use crate::error::Result;

/// A device allocation: either owned (`cuMemAlloc_v2`, freed on drop) or the caller's
/// (`DeviceBuffer::from_raw`: never freed here; its owner value is dropped with this handle).
pub(crate) struct DeviceAlloc {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    /// For memory the caller owns: what keeps it allocated. `None` for memory allocated here.
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for DeviceAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAlloc")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .field("borrowed", &self.owner.is_some())
            .finish()
    }
}

impl DeviceAlloc {
    /// Allocates `bytes` (> 0) and zeroes them.
    pub(crate) fn zeroed(ctx: &Arc<PrimaryContext>, bytes: usize) -> Result<Arc<Self>> {
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: the context is current; `ptr` is a valid out pointer.
        unsafe { drv!(cuMemAlloc_v2(&mut ptr, bytes)) }?;
        let alloc = Arc::new(DeviceAlloc {
            ctx: ctx.clone(),
            ptr,
            bytes,
            owner: None,
        });
        // Zeroed on the context's private setup stream, and waited for, so the zeroes are there
        // for any stream — without synchronising the context (refused while streams capture).
        let setup = ctx.setup_stream()?;
        // SAFETY: `ptr` points at `bytes` bytes just allocated; the setup stream is live.
        unsafe { drv!(cuMemsetD8Async(ptr, 0, bytes, setup)) }?;
        // SAFETY: as above; the setup stream is never captured.
        unsafe { drv!(cuStreamSynchronize(setup)) }?;
        Ok(alloc)
    }

    /// Stands for `bytes` bytes at `ptr` that the caller keeps allocated through `owner`
    /// (dropped with this handle); never freed here. Makes no driver call.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` is device memory usable in `ctx`'s context and stays allocated until
    /// `owner` is dropped.
    pub(crate) unsafe fn borrowed(
        ctx: &Arc<PrimaryContext>,
        ptr: sys::CUdeviceptr,
        bytes: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Self> {
        Arc::new(DeviceAlloc {
            ctx: ctx.clone(),
            ptr,
            bytes,
            owner: Some(owner),
        })
    }

    /// Whether the memory is the caller's (made by [`borrowed`](Self::borrowed)).
    pub(crate) fn is_borrowed(&self) -> bool {
        self.owner.is_some()
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.owner.is_some() {
            // The caller's memory: its owner (dropped after this) frees it, or not.
            return;
        }
        // SAFETY: allocated in `zeroed` (not borrowed: checked above), freed exactly once, here.
        release::destroy_in(&self.ctx, self.ptr, |ptr| unsafe {
            drv_drop!(cuMemFree_v2(ptr))
        });
    }
}

/// Copies `bytes` bytes from device memory at `src` to host memory at `dst`, synchronously
/// (`cuMemcpyDtoH_v2`).
///
/// # Safety
/// The context that owns `src` is current; `dst` is valid for writes of `bytes` bytes and `src`
/// for reads of as many.
pub(crate) unsafe fn memcpy_dtoh(
    dst: *mut std::ffi::c_void,
    src: sys::CUdeviceptr,
    bytes: usize,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemcpyDtoH_v2(dst, src, bytes)) }
}

/// Copies `bytes` bytes from host memory at `src` to device memory at `dst` (`cuMemcpyHtoD_v2`);
/// `src` is read before the call returns.
///
/// # Safety
/// The context that owns `dst` is current; `src` is valid for reads of `bytes` bytes and `dst`
/// for writes of as many.
pub(crate) unsafe fn memcpy_htod(
    dst: sys::CUdeviceptr,
    src: *const std::ffi::c_void,
    bytes: usize,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemcpyHtoD_v2(dst, src, bytes)) }
}

/// Frees device memory (`cuMemFree_v2`); freeing an address not allocated now is an error.
///
/// # Safety
/// Nothing uses the memory at `ptr` any more (no queued or running work), and it is freed once.
pub(crate) unsafe fn free(ptr: sys::CUdeviceptr) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuMemFree_v2(ptr)) }
}
