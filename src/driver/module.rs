//! Module handle.

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::release;
use super::{drv, drv_drop};
use crate::error::Result;

/// A loaded module (`cuModuleLoadData`), unloaded on drop.
#[derive(Debug)]
pub(crate) struct ModuleHandle {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) raw: sys::CUmodule,
}

// SAFETY: CUmodule handles may be used from any thread.
unsafe impl Send for ModuleHandle {}
// SAFETY: as above.
unsafe impl Sync for ModuleHandle {}

impl ModuleHandle {
    /// Loads an image. `image` must be NUL-terminated if it is PTX text; cubins and fatbins are
    /// self-describing. The caller checks the image's shape first.
    pub(crate) fn load(ctx: &Arc<PrimaryContext>, image: &[u8]) -> Result<Arc<Self>> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the context is current; `image` outlives the call and the driver reads it
        // according to its own header (the caller made PTX NUL-terminated).
        unsafe { drv!(cuModuleLoadData(&mut raw, image.as_ptr().cast())) }?;
        Ok(Arc::new(ModuleHandle {
            ctx: ctx.clone(),
            raw,
        }))
    }
}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        // SAFETY: loaded in `load`, unloaded exactly once, here.
        release::destroy_in(&self.ctx, self.raw, |raw| unsafe {
            drv_drop!(cuModuleUnload(raw))
        });
    }
}
