//! NVRTC, opened at run time (`libnvrtc`): CUDA C++ source to a cubin for one architecture.
//!
//! The library is opened with `libloading` on first use, not through cudarc's loader (which
//! panics when the library is missing), and every NVRTC result is read as the integer it is.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use crate::error::{Error, Refusal, Result};

type Program = *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type GetFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The entry points this crate calls, resolved once.
struct Nvrtc {
    create: CreateFn,
    compile: CompileFn,
    destroy: DestroyFn,
    log_size: SizeFn,
    log: GetFn,
    cubin_size: SizeFn,
    cubin: GetFn,
    error_string: ErrorStringFn,
    /// Keeps the library loaded (the function pointers above point into it).
    _lib: libloading::Library,
}

/// The library names tried, newest first.
const CANDIDATES: &[&str] = if cfg!(windows) {
    &[
        "nvrtc64_130_0.dll",
        "nvrtc64_120_0.dll",
        "nvrtc64_112_0.dll",
    ]
} else {
    &[
        "libnvrtc.so",
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so.11.2",
    ]
};

static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();

fn open() -> std::result::Result<Nvrtc, String> {
    let mut last = String::new();
    for &name in CANDIDATES {
        // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(lib) => lib,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        // SAFETY: each symbol is looked up with the C signature NVRTC declares for it
        // (nvrtc.h), with `nvrtcResult` as the `int` it is.
        let nvrtc = unsafe {
            (|| -> std::result::Result<Nvrtc, libloading::Error> {
                Ok(Nvrtc {
                    create: *lib.get::<CreateFn>(b"nvrtcCreateProgram\0")?,
                    compile: *lib.get::<CompileFn>(b"nvrtcCompileProgram\0")?,
                    destroy: *lib.get::<DestroyFn>(b"nvrtcDestroyProgram\0")?,
                    log_size: *lib.get::<SizeFn>(b"nvrtcGetProgramLogSize\0")?,
                    log: *lib.get::<GetFn>(b"nvrtcGetProgramLog\0")?,
                    cubin_size: *lib.get::<SizeFn>(b"nvrtcGetCUBINSize\0")?,
                    cubin: *lib.get::<GetFn>(b"nvrtcGetCUBIN\0")?,
                    error_string: *lib.get::<ErrorStringFn>(b"nvrtcGetErrorString\0")?,
                    _lib: lib,
                })
            })()
        };
        match nvrtc {
            Ok(n) => return Ok(n),
            Err(e) => last = format!("{name}: {e}"),
        }
    }
    Err(format!("{}; last error: {last}", CANDIDATES.join(", ")))
}

fn nvrtc() -> Result<&'static Nvrtc> {
    NVRTC
        .get_or_init(open)
        .as_ref()
        .map_err(|tried| Error::NvrtcNotFound {
            tried: tried.clone(),
        })
}

/// A program, destroyed on drop.
struct Prog<'a> {
    n: &'a Nvrtc,
    raw: Program,
}

impl Drop for Prog<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` was created by `nvrtcCreateProgram` and is destroyed once, here.
        unsafe { (self.n.destroy)(&mut self.raw) };
    }
}

impl Nvrtc {
    fn name(&self, r: c_int) -> String {
        // SAFETY: `nvrtcGetErrorString` returns a static NUL-terminated string for any value
        // (an unknown one reads as such).
        let p = unsafe { (self.error_string)(r) };
        if p.is_null() {
            return format!("NVRTC result {r}");
        }
        // SAFETY: as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, r: c_int, what: &str) -> Result<()> {
        if r == 0 {
            Ok(())
        } else {
            Err(Error::Compile {
                result: self.name(r),
                log: format!("{what} failed"),
            })
        }
    }

    /// The program's log (empty if there is none).
    fn log(&self, prog: &Prog<'_>) -> String {
        let mut size = 0usize;
        // SAFETY: `prog` is live; `size` is a valid out pointer.
        if unsafe { (self.log_size)(prog.raw, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes NVRTC said the log takes.
        if unsafe { (self.log)(prog.raw, buf.as_mut_ptr().cast()) } != 0 {
            return String::new();
        }
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Compiles `source` (named `name` in messages) with `options` to a cubin.
pub(crate) fn compile_cubin(source: &str, name: &str, options: &[String]) -> Result<Vec<u8>> {
    let n = nvrtc()?;
    let src = CString::new(source)
        .map_err(|_| Error::invalid(Refusal::Image, "the CUDA source contains a NUL byte"))?;
    let cname = CString::new(name)
        .map_err(|_| Error::invalid(Refusal::Image, "the program name contains a NUL byte"))?;
    let opts: Vec<CString> = options
        .iter()
        .map(|o| {
            CString::new(o.as_str()).map_err(|_| {
                Error::invalid(
                    Refusal::Image,
                    format!("the NVRTC option {o:?} contains a NUL byte"),
                )
            })
        })
        .collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let count = c_int::try_from(opt_ptrs.len())
        .map_err(|_| Error::invalid(Refusal::Size, "too many NVRTC options"))?;
    let mut raw: Program = std::ptr::null_mut();
    // SAFETY: `src` and `cname` are NUL-terminated and outlive the call; no headers.
    let r = unsafe {
        (n.create)(
            &mut raw,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    n.check(r, "nvrtcCreateProgram")?;
    let prog = Prog { n, raw };
    // SAFETY: `prog` is live; `opt_ptrs` holds `count` NUL-terminated options that outlive the
    // call.
    let r = unsafe { (n.compile)(prog.raw, count, opt_ptrs.as_ptr()) };
    if r != 0 {
        return Err(Error::Compile {
            result: n.name(r),
            log: n.log(&prog),
        });
    }
    let mut size = 0usize;
    // SAFETY: `prog` is live and compiled; `size` is a valid out pointer.
    n.check(
        unsafe { (n.cubin_size)(prog.raw, &mut size) },
        "nvrtcGetCUBINSize",
    )?;
    if size == 0 {
        return Err(Error::Compile {
            result: "no cubin".into(),
            log: "NVRTC made no cubin: compile for a real architecture (sm_XY), not a virtual one (compute_XY)".into(),
        });
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds the `size` bytes NVRTC said the cubin takes.
    n.check(
        unsafe { (n.cubin)(prog.raw, cubin.as_mut_ptr().cast()) },
        "nvrtcGetCUBIN",
    )?;
    Ok(cubin)
}
