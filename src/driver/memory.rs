//! Device memory handle.

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::{drv, drv_drop, release};
use crate::error::Result;

/// An owned device allocation (`cuMemAlloc_v2`), freed on drop.
#[derive(Debug)]
pub(crate) struct DeviceAlloc {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
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
        });
        // SAFETY: `ptr` points at `bytes` bytes just allocated.
        unsafe { drv!(cuMemsetD8_v2(ptr, 0, bytes)) }?;
        // The memset runs on the legacy stream, which does not order with this crate's
        // non-blocking streams: wait for it, so the zeroes are there for any stream.
        // SAFETY: the context is current.
        unsafe { drv!(cuCtxSynchronize()) }?;
        Ok(alloc)
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed`, freed exactly once, here.
        release::destroy_in(&self.ctx, self.ptr, |ptr| unsafe {
            drv_drop!(cuMemFree_v2(ptr))
        });
    }
}
