use std::ffi::CString;
use std::sync::Arc;

use crate::driver::drv;
use crate::driver::module::ModuleHandle;
use crate::error::{Error, Result};

/// A loaded module of device code (cubin, fatbin or PTX). Clones share it. `Send + Sync`.
#[derive(Clone)]
pub struct Module {
    pub(crate) handle: Arc<ModuleHandle>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("raw", &self.handle.raw)
            .finish_non_exhaustive()
    }
}

/// A kernel in a [`Module`]; it keeps the module loaded. `Send + Sync`.
#[derive(Clone)]
pub struct Function {
    pub(crate) module: Arc<ModuleHandle>,
    pub(crate) raw: cudarc::driver::sys::CUfunction,
    name: Arc<str>,
}

// SAFETY: a CUfunction is an immutable handle into a module that `module` keeps loaded; the
// driver allows using it from any thread.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("name", &&*self.name)
            .finish_non_exhaustive()
    }
}

impl Module {
    /// An observer that tells when the module is unloaded (after every `Module` and `Function`
    /// handle of it and every graph and exec launching its kernels are dropped).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(module: &Module) {
    /// let watch = module.release_observer();
    /// # }
    /// ```
    pub fn release_observer(&self) -> super::ReleaseObserver {
        super::ReleaseObserver::new(&self.handle)
    }

    /// Looks up an `extern "C"` kernel by name; [`Error::FunctionNotFound`] if there is none.
    pub fn function(&self, name: &str) -> Result<Function> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} contains a NUL")))?;
        self.handle.ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the module is live; `cname` is NUL-terminated; `raw` is a valid out pointer.
        match unsafe {
            drv!(cuModuleGetFunction(
                &mut raw,
                self.handle.raw,
                cname.as_ptr()
            ))
        } {
            Ok(()) => Ok(Function {
                module: self.handle.clone(),
                raw,
                name: name.into(),
            }),
            Err(e)
                if e.code() == Some(cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_FOUND as u32) =>
            {
                Err(Error::FunctionNotFound(name.to_string()))
            }
            Err(e) => Err(e),
        }
    }
}

impl Function {
    /// An observer that tells when the function's module is unloaded (after every `Module` and
    /// `Function` handle of it and every graph and exec launching it are dropped).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(k: &Function) {
    /// let watch = k.release_observer();
    /// # }
    /// ```
    pub fn release_observer(&self) -> super::ReleaseObserver {
        super::ReleaseObserver::new(&self.module)
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

fn read_u16(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as u64)
}
fn read_u32(b: &[u8], at: usize) -> Option<u64> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as u64)
}
fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn truncated(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "the module image is a truncated or corrupt {what}: its header points past its end"
    ))
}

/// Checks the image's shape and copies it into an 8-byte aligned, NUL-terminated buffer, so the
/// driver never reads past what the caller gave.
pub(crate) fn prepare_image(image: &[u8]) -> Result<Vec<u64>> {
    if image.is_empty() {
        return Err(Error::InvalidArgument("the module image is empty".into()));
    }
    let len = image.len() as u64;
    if image.starts_with(&ELF_MAGIC) {
        // 64-bit little-endian ELF: section and program header tables must lie inside.
        if image.get(4) != Some(&2) {
            return Err(truncated("ELF (not ELF64)"));
        }
        let (Some(phoff), Some(shoff), Some(phentsize), Some(phnum), Some(shentsize), Some(shnum)) = (
            read_u64(image, 0x20),
            read_u64(image, 0x28),
            read_u16(image, 0x36),
            read_u16(image, 0x38),
            read_u16(image, 0x3a),
            read_u16(image, 0x3c),
        ) else {
            return Err(truncated("ELF"));
        };
        let ph_end = phoff.checked_add(phentsize * phnum);
        let sh_end = shoff.checked_add(shentsize * shnum);
        if ph_end.is_none_or(|e| e > len) || sh_end.is_none_or(|e| e > len) {
            return Err(truncated("ELF"));
        }
    } else if read_u32(image, 0) == Some(FATBIN_MAGIC as u64) {
        let (Some(header), Some(size)) = (read_u16(image, 6), read_u64(image, 8)) else {
            return Err(truncated("fatbin"));
        };
        if header.checked_add(size).is_none_or(|e| e > len) {
            return Err(truncated("fatbin"));
        }
    }
    // Copy, with at least one trailing NUL (PTX must be NUL-terminated).
    let mut out = vec![0u64; image.len() / 8 + 1];
    // SAFETY: `out` holds at least `image.len() + 1` bytes; the regions do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(image.as_ptr(), out.as_mut_ptr().cast::<u8>(), image.len())
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_image_is_rejected() {
        assert!(matches!(prepare_image(&[]), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn truncated_fatbin_is_rejected() {
        let mut img = FATBIN_MAGIC.to_le_bytes().to_vec();
        img.extend_from_slice(&[1, 0, 16, 0]);
        img.extend_from_slice(&1_000_000u64.to_le_bytes());
        assert!(matches!(
            prepare_image(&img),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn truncated_elf_is_rejected() {
        let mut img = vec![0u8; 64];
        img[..4].copy_from_slice(&ELF_MAGIC);
        img[4] = 2;
        img[0x28..0x30].copy_from_slice(&4096u64.to_le_bytes());
        img[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        img[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        assert!(matches!(
            prepare_image(&img),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn ptx_text_is_nul_terminated() {
        let img = b".version 8.0";
        let out = prepare_image(img).unwrap();
        let bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(out.as_ptr().cast(), out.len() * 8) };
        assert_eq!(&bytes[..img.len()], img);
        assert_eq!(bytes[img.len()], 0);
    }

    #[test]
    fn shipped_fatbin_passes_the_shape_check() {
        let img = include_bytes!("../../tests/kernels/kernels.fatbin");
        assert!(prepare_image(img).is_ok());
    }
}
