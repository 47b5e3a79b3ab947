use std::ffi::CString;
use std::sync::Arc;

use crate::driver;
use crate::driver::module::ModuleHandle;
use crate::error::{Error, Refusal, Result};

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
    /// The module's device (`module.ctx.device`), kept here: the per-node checks then read
    /// nothing behind the module's pointer (a cache line each, see `HotEntryPoints`).
    pub(crate) device: cudarc::driver::sys::CUdevice,
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
    /// The raw `CUmodule`, for passing to other CUDA code; loaded while this `Module` (or one of
    /// its functions, or a graph launching them) lives. Do not unload it.
    ///
    /// ```no_run
    /// # fn f(module: &cuda_graph::Module) {
    /// let raw: cudarc::driver::sys::CUmodule = module.as_raw();
    /// # }
    /// ```
    pub fn as_raw(&self) -> cudarc::driver::sys::CUmodule {
        self.handle.raw
    }

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
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(module: &Module) -> cuda_graph::Result<()> {
    /// let add_one = module.function("add_one")?; // Error::FunctionNotFound if absent
    /// # let _ = add_one;
    /// # Ok(()) }
    /// ```
    pub fn function(&self, name: &str) -> Result<Function> {
        let cname = CString::new(name).map_err(|_| {
            Error::invalid(
                Refusal::Image,
                format!("kernel name {name:?} contains a NUL"),
            )
        })?;
        self.handle.ctx.bind()?;
        // SAFETY: the module is live (a module this crate loaded: `Module` is made only by
        // loading one) and its context current; `cname` is NUL-terminated.
        match unsafe { driver::module::get_function(self.handle.raw, &cname) } {
            Ok(raw) => Ok(Function {
                device: self.handle.ctx.device,
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
    /// A kernel of `module` read back from a node.
    pub(crate) fn from_parts(
        module: Arc<ModuleHandle>,
        raw: cudarc::driver::sys::CUfunction,
        name: String,
    ) -> Function {
        Function {
            device: module.ctx.device,
            module,
            raw,
            name: name.into(),
        }
    }

    /// Wraps a kernel this crate did not load — a raw `CUfunction`, or cudarc's `CudaFunction`
    /// — so it can be launched on streams, into captures and into definitions. `owner` (for
    /// example what keeps its module loaded) is held by this `Function`, its clones and every
    /// graph and exec that launches it, and dropped after the last of them.
    ///
    /// # Safety
    /// `raw` is a kernel of a module loaded in `device`'s primary context, and stays valid until
    /// `owner` is dropped. (Launching it stays `unsafe`: the arguments are the caller's promise.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, raw: cudarc::driver::sys::CUfunction, module_owner: std::sync::Arc<()>) {
    /// // SAFETY: `raw` is a kernel of a module `module_owner` keeps loaded in device 0's context.
    /// let k = unsafe { Function::from_raw(device, raw, "my_kernel", module_owner) };
    /// # }
    /// ```
    pub unsafe fn from_raw(
        device: &crate::Device,
        raw: cudarc::driver::sys::CUfunction,
        name: &str,
        owner: impl std::any::Any + Send + Sync,
    ) -> Function {
        Function {
            module: ModuleHandle::borrowed(&device.ctx, Box::new(owner)),
            raw,
            device: device.ctx.device,
            name: name.into(),
        }
    }

    /// The raw `CUfunction`, for passing to other CUDA code; valid while this `Function` lives.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(k: &Function) {
    /// let raw: cudarc::driver::sys::CUfunction = k.as_raw();
    /// # }
    /// ```
    pub fn as_raw(&self) -> cudarc::driver::sys::CUfunction {
        self.raw
    }

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
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(module: &Module) -> cuda_graph::Result<()> {
    /// assert_eq!(module.function("add_one")?.name(), "add_one");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }
}
