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
pub(crate) mod launch;
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

// The CUDA version of the bindings this crate was built for (build.rs settles it, and refuses a
// missing or contradictory choice with one message) must be the version of cudarc's bindings,
// which another crate may have chosen.
const _: () = assert!(
    match u32::from_str_radix(env!("CUDA_GRAPH_BINDINGS_VERSION"), 10) {
        Ok(v) => sys::CUDA_VERSION == v,
        Err(_) => false,
    },
    "cuda-graph and cudarc were built with the bindings of different CUDA versions: enable the same \
     cuda-* feature for both, or cuda-graph's cuda-version-from-build-system where another crate \
     turns on cudarc's"
);

static DRIVER: OnceLock<Result<DriverVersion>> = OnceLock::new();

/// libcuda, opened by this crate (`dynamic-loading`), or `None` where it cannot be opened. The
/// names are tried in the order cudarc tries them and are among cudarc's, so where this opens the
/// library cudarc's own loader (which panics where it finds none) opens it too; where another
/// crate made cudarc link libcuda instead, this opens the library the program already loaded.
#[cfg(feature = "dynamic-loading")]
pub(crate) fn library() -> Option<&'static libloading::Library> {
    const NAMES: &[&str] = if cfg!(windows) {
        &["nvcuda.dll"]
    } else {
        &["libcuda.so", "libcuda.so.1"]
    };
    static LIB: OnceLock<Option<libloading::Library>> = OnceLock::new();
    LIB.get_or_init(|| {
        NAMES.iter().find_map(|name| {
            // SAFETY: loading libcuda runs its initialisers, which have no preconditions.
            unsafe { libloading::Library::new(*name) }.ok()
        })
    })
    .as_ref()
}

/// Whether libcuda exports `name`.
#[cfg(feature = "dynamic-loading")]
fn has_symbol(name: &str) -> bool {
    // SAFETY: looking a symbol up has no side effects.
    library().is_some_and(|lib| unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_ok())
}

/// Linked at build time (`dynamic-linking`): the program would not have started without libcuda
/// and every entry point the bindings declare.
#[cfg(not(feature = "dynamic-loading"))]
fn has_symbol(_name: &str) -> bool {
    true
}

fn init() -> Result<DriverVersion> {
    #[cfg(feature = "dynamic-loading")]
    if library().is_none() {
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
