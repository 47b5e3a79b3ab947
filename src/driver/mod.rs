//! The handle layer: loading the driver and one RAII type per driver object.
//!
//! Everything here is crate-private except [`DriverVersion`] and [`driver_version`]. cudarc's sys
//! layer panics when libcuda or a symbol is missing, so every call goes through [`drv!`], which
//! first checks (once per call site) that the driver is loaded and the entry point exists, and
//! turns a failing `CUresult` into [`crate::Error`]. With the `dynamic-linking` feature libcuda is
//! linked at build time instead: the driver is then always loaded and every entry point exists.
//! The differences between the CUDA versions of the bindings are shimmed in [`compat`].

use std::ffi::CStr;
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::error::{DriverError, Error, Result};

pub(crate) mod compat;
pub(crate) mod context;
pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod graph;
pub(crate) mod handoff;
pub(crate) mod lock_rank;
pub(crate) mod memory;
pub(crate) mod module;
#[cfg(feature = "nccl")]
pub(crate) mod nccl;
#[cfg(feature = "nvrtc")]
pub(crate) mod nvrtc;
pub(crate) mod release;
pub(crate) mod stream;
pub(crate) mod sync;
pub(crate) mod tree_lock;

pub use crate::version::DriverVersion;

// The features forwarded to cudarc (see `Cargo.toml`). When cudarc itself gets neither, its build
// script stops first with its own list of features; these errors are for the case where another
// dependency chose cudarc's features and this crate's were left out.
#[cfg(not(cuda_version_chosen))]
compile_error!(
    "cuda-graph: no CUDA version chosen for the driver bindings. Enable exactly one of the \
     features cuda-12030, cuda-12040, cuda-12050, cuda-12060, cuda-12080 (the default), \
     cuda-12090, cuda-13000, cuda-13010, cuda-13020, cuda-13030, cuda-13040: the same one as \
     for cudarc if you depend on it too."
);
#[cfg(not(any(feature = "dynamic-loading", feature = "dynamic-linking")))]
compile_error!(
    "cuda-graph: no way to find libcuda chosen. Enable the feature `dynamic-loading` (open it \
     at run time, the default) or `dynamic-linking` (link it at build time): the same one as \
     for cudarc if you depend on it too."
);

static DRIVER: OnceLock<Result<DriverVersion>> = OnceLock::new();

/// Whether libcuda exports `name`. Only call after [`loaded`] succeeded.
#[cfg(feature = "dynamic-loading")]
fn has_symbol(name: &str) -> bool {
    // SAFETY: `culib()` is only reached after `is_culib_present()` returned true (see `init`), so it
    // loads the library instead of panicking; looking a symbol up has no side effects.
    unsafe { sys::culib().get::<*const ()>(name.as_bytes()).is_ok() }
}

/// Linked at build time (`dynamic-linking`): the program would not have started without libcuda
/// and every entry point the bindings declare.
#[cfg(not(feature = "dynamic-loading"))]
fn has_symbol(_name: &str) -> bool {
    true
}

fn init() -> Result<DriverVersion> {
    // SAFETY: `is_culib_present` only tries to open the library and drops it.
    #[cfg(feature = "dynamic-loading")]
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::DriverNotFound);
    }
    for sym in [
        "cuInit",
        "cuDriverGetVersion",
        "cuGetErrorName",
        "cuGetErrorString",
    ] {
        if !has_symbol(sym) {
            return Err(Error::DriverNotFound);
        }
    }
    let mut v = 0;
    // SAFETY: the symbol exists (checked above); `v` is a valid out pointer.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(driver_error(r, "cuDriverGetVersion").into());
    }
    // SAFETY: the symbol exists; cuInit(0) is thread-safe and idempotent, and OnceLock runs it once.
    let r = unsafe { sys::cuInit(0) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(driver_error(r, "cuInit").into());
    }
    Ok(DriverVersion(v))
}

/// Loads and initialises the driver once (thread-safe) and returns its version.
pub(crate) fn loaded() -> Result<DriverVersion> {
    DRIVER.get_or_init(init).clone()
}

/// The installed CUDA driver's version, loading and initialising the driver on first use.
///
/// ```
/// match cuda_graph::driver_version() {
///     Ok(v) => println!("CUDA driver {v}"),
///     Err(e) => println!("no driver: {e}"),
/// }
/// ```
pub fn driver_version() -> Result<DriverVersion> {
    loaded()
}

/// Fails with [`Error::Unsupported`] when the driver is older than `needs`.
pub(crate) fn require(feature: &'static str, needs: DriverVersion) -> Result<()> {
    require_of(feature, needs, loaded()?)
}

/// [`require`] against a given driver version.
pub(crate) fn require_of(
    feature: &'static str,
    needs: DriverVersion,
    driver: DriverVersion,
) -> Result<()> {
    if driver < needs {
        return Err(Error::Unsupported {
            feature,
            needs,
            driver,
        });
    }
    Ok(())
}

/// Checks (once per call site, cached in `present`) that the driver is loaded and exports `name`.
#[inline]
pub(crate) fn ensure_symbol(present: &OnceLock<bool>, name: &'static str) -> Result<()> {
    // Set only after the driver loaded: the common case is one atomic load.
    if present.get() == Some(&true) {
        return Ok(());
    }
    ensure_symbol_slow(present, name)
}

/// [`ensure_symbol`] for a call site's first call, or a missing driver or entry point.
#[cold]
#[inline(never)]
fn ensure_symbol_slow(present: &OnceLock<bool>, name: &'static str) -> Result<()> {
    let driver = loaded()?;
    if *present.get_or_init(|| has_symbol(name)) {
        Ok(())
    } else {
        Err(Error::MissingEntryPoint {
            symbol: name,
            driver,
        })
    }
}

/// Builds the [`DriverError`] for a failed call, with the driver's own name and description.
pub(crate) fn driver_error(r: sys::CUresult, call: &'static str) -> DriverError {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut desc: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `driver_error` is only called once the driver library is loaded and these two symbols
    // were checked in `init`; the out pointers are valid.
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut desc);
    }
    let read = |p: *const std::ffi::c_char, fallback: &str| {
        if p.is_null() {
            fallback.to_string()
        } else {
            // SAFETY: the driver returns pointers to static NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    DriverError::new(
        call,
        r as u32,
        read(name, "CUDA_ERROR_UNKNOWN_CODE"),
        read(desc, "unrecognised error code"),
    )
}

/// The [`DriverError`] for a result another library's call got (cudarc's `DriverError`): the
/// driver's name and description when the driver is loaded; else the bindings' name for it.
#[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
pub(crate) fn foreign_error(r: sys::CUresult, call: &'static str) -> DriverError {
    if loaded().is_ok() {
        driver_error(r, call)
    } else {
        DriverError::new(
            call,
            r as u32,
            format!("{r:?}"),
            "(no description: the CUDA driver is not loaded)",
        )
    }
}

/// Turns a `CUresult` into `Result<()>`. Inlined: it follows every driver call, and whether the
/// compiler inlined it on its own changed with unrelated code elsewhere in the crate (17 more
/// instructions per captured launch when it did not).
#[inline]
pub(crate) fn check(r: sys::CUresult, call: &'static str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(driver_error(r, call).into())
    }
}

/// Calls a driver entry point after checking that it exists: `unsafe { drv!(cuFoo(a, b)) }?`.
///
/// Evaluates to `Result<()>`. The expansion calls the raw binding, so the call site needs `unsafe`
/// and a `// SAFETY:` line for the arguments.
macro_rules! drv {
    ($f:ident ( $($a:expr),* $(,)? )) => {{
        static PRESENT: ::std::sync::OnceLock<bool> = ::std::sync::OnceLock::new();
        match $crate::driver::ensure_symbol(&PRESENT, stringify!($f)) {
            Err(e) => Err(e),
            Ok(()) => $crate::driver::check(::cudarc::driver::sys::$f($($a),*), stringify!($f)),
        }
    }};
}
pub(crate) use drv;

/// Calls a driver entry point for a destructor: errors are ignored, nothing panics.
macro_rules! drv_drop {
    ($f:ident ( $($a:expr),* $(,)? )) => {{
        let _ = drv!($f($($a),*));
    }};
}
pub(crate) use drv_drop;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_display() {
        assert_eq!(DriverVersion(12080).to_string(), "12.8");
        assert_eq!(DriverVersion(13000).to_string(), "13.0");
        assert!(DriverVersion(12030) < DriverVersion::V12_8);
    }

    #[test]
    fn features_need_their_driver_version() {
        let e = require_of(
            "updating a child-graph node (cuGraphNodeSetParams)",
            DriverVersion::V12_2,
            DriverVersion(12010),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Unsupported { needs, .. } if needs == DriverVersion::V12_2));
        let text = e.to_string();
        assert!(
            text.contains("cuGraphNodeSetParams") && text.contains("12.2"),
            "{text}"
        );
        assert!(text.contains("12.1"), "names the installed driver: {text}");
        assert!(require_of("x", DriverVersion::V12_2, DriverVersion::V12_2).is_ok());
        assert!(require_of("x", DriverVersion::V12_2, DriverVersion::V13_0).is_ok());
    }

    #[test]
    fn no_driver_or_version() {
        // Either the driver loads and reports a 11.x+ version, or it is reported missing.
        match driver_version() {
            Ok(v) => assert!(v.major() >= 11, "{v}"),
            Err(e) => assert!(matches!(e, Error::DriverNotFound), "{e}"),
        }
    }
}
