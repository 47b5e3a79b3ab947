//! The device's primary context, retained for as long as any handle needs it.

use std::sync::Arc;

use cudarc::driver::sys;

use super::{drv, drv_drop};
use crate::error::Result;

/// A retained primary context (`cuDevicePrimaryCtxRetain` / `Release`).
///
/// Every handle that needs a context holds an `Arc<PrimaryContext>`, so the context outlives all of
/// them and is released exactly once, after the last.
#[derive(Debug)]
pub(crate) struct PrimaryContext {
    pub(crate) device: sys::CUdevice,
    pub(crate) ordinal: usize,
    pub(crate) raw: sys::CUcontext,
}

// SAFETY: a CUcontext is a driver handle usable from any thread; the driver synchronises access.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; `&PrimaryContext` only allows binding the context, which is thread-safe.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    pub(crate) fn retain(ordinal: usize, device: sys::CUdevice) -> Result<Arc<Self>> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `device` came from `cuDeviceGet`; `raw` is a valid out pointer.
        unsafe { drv!(cuDevicePrimaryCtxRetain(&mut raw, device)) }?;
        Ok(Arc::new(PrimaryContext {
            device,
            ordinal,
            raw,
        }))
    }

    /// Makes this context current on the calling thread. Every driver call that needs a context is
    /// preceded by this.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: `raw` is a retained primary context, valid until `Drop`.
        unsafe { drv!(cuCtxSetCurrent(self.raw)) }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: the context was retained once in `retain`; this is the matching release.
        unsafe { drv_drop!(cuDevicePrimaryCtxRelease_v2(self.device)) };
    }
}
