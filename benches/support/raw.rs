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
