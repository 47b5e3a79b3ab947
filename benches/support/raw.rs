//! Raw-driver helpers shared by the overhead bench and the soak (`examples/soak.rs`): they run
//! the same work through `cudarc::driver::sys` beside the library, in one process.

use cudarc::driver::sys;

/// A raw driver result as `Result`, naming the call.
pub fn ok(call: &str, r: sys::CUresult) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("raw: {call} failed: {r:?}"))
    }
}

/// Whether libcuda exports `name`. Only called after `Device::new` succeeded (the library loads).
#[cfg(feature = "dynamic-loading")]
pub fn has_symbol(name: &str) -> bool {
    // SAFETY: the library is present (the crate opened a device through it), so `culib` loads it
    // instead of panicking; looking a symbol up has no side effects.
    unsafe { sys::culib().get::<*const ()>(name.as_bytes()).is_ok() }
}

/// Linked at build time (`dynamic-linking`): every entry point the bindings declare exists.
#[cfg(not(feature = "dynamic-loading"))]
pub fn has_symbol(_name: &str) -> bool {
    true
}

/// `Err` naming every entry point in `names` the driver lacks (cudarc panics on a missing one).
pub fn require_symbols(names: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = names.iter().copied().filter(|n| !has_symbol(n)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("raw: the driver lacks {}", missing.join(", ")))
    }
}

/// Device `ordinal` and its primary context, retained (the context the library uses too).
pub fn retain_primary(ordinal: i32) -> Result<(sys::CUdevice, sys::CUcontext), String> {
    let mut dev = 0;
    // SAFETY: the driver is initialised (the crate opened a device); `dev` is an out pointer.
    ok("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal)
    })?;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: `dev` is a valid device; `ctx` is a valid out pointer.
    ok("cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
    })?;
    Ok((dev, ctx))
}

/// Loads `image` (a fatbin) into the current context.
pub fn load_module(image: &[u8]) -> Result<sys::CUmodule, String> {
    // The image copied into 8-byte-aligned storage, as cuModuleLoadData wants it.
    let aligned: Vec<u64> = image
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_ne_bytes(w)
        })
        .collect();
    let mut module = std::ptr::null_mut();
    // SAFETY: `aligned` holds the whole image (zero-padded), aligned, alive during the call; a
    // context is current (the caller's).
    ok("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut module, aligned.as_ptr().cast())
    })?;
    Ok(module)
}

/// The kernel `name` of a loaded `module`.
pub fn function(module: sys::CUmodule, name: &std::ffi::CStr) -> Result<sys::CUfunction, String> {
    let mut f = std::ptr::null_mut();
    // SAFETY: the module is loaded; `name` is NUL-terminated; `f` is a valid out pointer.
    ok("cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut f, module, name.as_ptr())
    })
    .map_err(|e| format!("{e} ({})", name.to_string_lossy()))?;
    Ok(f)
}
