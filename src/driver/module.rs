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
    /// For a kernel the caller owns (`Function::from_raw`): what keeps its module loaded. The
    /// module is then never unloaded here (`raw` is null).
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
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
            owner: None,
        }))
    }

    /// Stands for a module the caller keeps loaded through `owner` (dropped with this handle).
    pub(crate) fn borrowed(
        ctx: &Arc<PrimaryContext>,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Self> {
        Arc::new(ModuleHandle {
            ctx: ctx.clone(),
            raw: std::ptr::null_mut(),
            owner: Some(owner),
        })
    }
}

/// Looks up the kernel `name` in `module` (`cuModuleGetFunction`); the driver's
/// `CUDA_ERROR_NOT_FOUND` if there is none.
///
/// # Safety
/// `module` is a live, loaded module, and its context is current.
pub(crate) unsafe fn get_function(
    module: sys::CUmodule,
    name: &std::ffi::CStr,
) -> Result<sys::CUfunction> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: the module is live (the caller's promise); `name` is NUL-terminated; `raw` is a
    // valid out pointer.
    unsafe { drv!(cuModuleGetFunction(&mut raw, module, name.as_ptr())) }?;
    Ok(raw)
}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        if self.owner.is_some() {
            // The caller's module: its owner (dropped after this) keeps or unloads it.
            return;
        }
        // SAFETY: loaded in `load`, unloaded exactly once, here.
        release::destroy_in(&self.ctx, self.raw, |raw| unsafe {
            drv_drop!(cuModuleUnload(raw))
        });
    }
}
