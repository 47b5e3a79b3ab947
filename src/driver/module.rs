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

/// The module a kernel belongs to (`cuFuncGetModule`).
///
/// # Safety
/// `func` is a kernel of a module that is loaded now.
pub(crate) unsafe fn func_module(func: sys::CUfunction) -> Result<sys::CUmodule> {
    let mut m = std::ptr::null_mut();
    // SAFETY: the caller's promise above; `m` is a valid out pointer.
    unsafe { drv!(cuFuncGetModule(&mut m, func)) }?;
    Ok(m)
}

/// A kernel's name (`cuFuncGetName`, driver 12.3).
///
/// # Safety
/// `func` is a kernel of a module that is loaded now.
pub(crate) unsafe fn func_name(func: sys::CUfunction) -> Result<String> {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the caller's promise above; `name` is a valid out pointer.
    unsafe { drv!(cuFuncGetName(&mut name, func)) }?;
    if name.is_null() {
        return Ok(String::new());
    }
    // SAFETY: the driver returns a NUL-terminated string that lives as long as the module.
    Ok(unsafe { std::ffi::CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned())
}

/// The offset and size in bytes of a kernel's parameter `index` in its parameter buffer
/// (`cuFuncGetParamInfo`, driver 12.4); `None` past the last parameter.
///
/// # Safety
/// `func` is a kernel of a module that is loaded now.
pub(crate) unsafe fn func_param_info(
    func: sys::CUfunction,
    index: usize,
) -> Result<Option<(usize, usize)>> {
    // SAFETY: the caller's promise above.
    unsafe { super::compat::func_param_info(func, index) }
}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            // The caller's module: its owner keeps or unloads it (cudarc's module unloads
            // itself): dropped where a destroy may run.
            release::drop_owner(owner);
            return;
        }
        // SAFETY: loaded in `load`, unloaded exactly once, here.
        release::destroy_in(&self.ctx, self.raw, |raw| unsafe {
            drv_drop!(cuModuleUnload(raw))
        });
    }
}
