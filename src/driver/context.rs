//! The device's primary context, retained for as long as any handle needs it.

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use super::{drv, drv_drop};
use crate::error::Result;

/// Declares `$name` as the C signature of the driver entry point `$entry` taking `$arg`s, and
/// checks at compile time that the bindings' wrapper of `$entry` takes the same arguments.
macro_rules! entry_point {
    ($(#[$doc:meta])* $name:ident = $entry:ident($($arg:ty),* $(,)?)) => {
        $(#[$doc])*
        pub(crate) type $name = unsafe extern "C" fn($($arg),*) -> sys::CUresult;
        const _: () = {
            type Binding = unsafe fn($($arg),*) -> sys::CUresult;
            let _: Binding = sys::$entry;
        };
    };
}

entry_point! {
    /// `cuLaunchKernel`'s C signature, as the bindings declare it.
    LaunchKernelFn = cuLaunchKernel(
        sys::CUfunction,
        std::ffi::c_uint,
        std::ffi::c_uint,
        std::ffi::c_uint,
        std::ffi::c_uint,
        std::ffi::c_uint,
        std::ffi::c_uint,
        std::ffi::c_uint,
        sys::CUstream,
        *mut *mut std::ffi::c_void,
        *mut *mut std::ffi::c_void,
    )
}

entry_point! {
    /// `cuGraphAddKernelNode_v2`'s C signature, as the bindings declare it.
    AddKernelNodeFn = cuGraphAddKernelNode_v2(
        *mut sys::CUgraphNode,
        sys::CUgraph,
        *const sys::CUgraphNode,
        usize,
        *const sys::CUDA_KERNEL_NODE_PARAMS,
    )
}

entry_point! {
    /// `cuCtxGetCurrent`'s C signature, as the bindings declare it.
    CtxGetCurrentFn = cuCtxGetCurrent(*mut sys::CUcontext)
}

/// The driver entry points a captured launch and an explicit kernel node call, as pointers held
/// beside the context handle those paths read anyway. Calling through the bindings instead reads
/// the wrapper's own cached pointer, and the crate's check that the entry point exists reads a
/// flag per call site: each a cache line of its own, and on the H200's host, where the driver's
/// work evicts what the crate touched between two nodes, each line missed costs a few
/// nanoseconds per node. `None` where the library lacks one, or with `dynamic-linking` (the
/// calls then go through the bindings, which report a missing entry point as an error).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HotEntryPoints {
    pub(crate) launch_kernel: Option<LaunchKernelFn>,
    pub(crate) add_kernel_node: Option<AddKernelNodeFn>,
    pub(crate) ctx_get_current: Option<CtxGetCurrentFn>,
}

impl HotEntryPoints {
    /// Looks the entry points up in the loaded driver library.
    #[cfg(feature = "dynamic-loading")]
    fn resolve() -> Self {
        if super::loaded().is_err() {
            return Self::default();
        }
        let Some(lib) = super::library() else {
            return Self::default();
        };
        // SAFETY: each type is its symbol's C signature (checked against the bindings above);
        // the library stays loaded for the process's life (`library` keeps it in a static), so
        // the pointers stay valid.
        unsafe {
            HotEntryPoints {
                launch_kernel: lib
                    .get::<LaunchKernelFn>(b"cuLaunchKernel\0")
                    .ok()
                    .map(|f| *f),
                add_kernel_node: lib
                    .get::<AddKernelNodeFn>(b"cuGraphAddKernelNode_v2\0")
                    .ok()
                    .map(|f| *f),
                ctx_get_current: lib
                    .get::<CtxGetCurrentFn>(b"cuCtxGetCurrent\0")
                    .ok()
                    .map(|f| *f),
            }
        }
    }

    /// Linked at build time: the calls go through the bindings.
    #[cfg(not(feature = "dynamic-loading"))]
    fn resolve() -> Self {
        Self::default()
    }
}

/// A retained primary context (`cuDevicePrimaryCtxRetain` / `Release`).
///
/// Every handle that needs a context holds an `Arc<PrimaryContext>`, so the context outlives all of
/// them and is released exactly once, after the last.
///
/// Laid out in declaration order from a cache line's start (`repr(C, align(64))`): the handle and
/// the per-node entry points share the first cache line, which every captured launch and
/// explicit node reads to bind the context.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct PrimaryContext {
    pub(crate) raw: sys::CUcontext,
    /// The driver entry points called once per node, resolved when the context was retained.
    pub(crate) hot: HotEntryPoints,
    pub(crate) device: sys::CUdevice,
    pub(crate) ordinal: usize,
    /// A private non-blocking stream for synchronous setup work (zeroing new allocations). It is
    /// never captured, so waiting for it is legal while other streams capture — unlike
    /// `cuCtxSynchronize`, which fails while any stream of the context captures.
    setup: OnceLock<SetupStream>,
    /// Streams and events that forks and joins used, kept for the next ones (so `split` and
    /// `join` make no driver objects in steady state). Destroyed with the context.
    pub(crate) pool: std::sync::Mutex<Pool>,
}

/// Idle driver objects for reuse (see [`PrimaryContext::pool`]).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    pub(crate) streams: Vec<sys::CUstream>,
    pub(crate) events: Vec<sys::CUevent>,
}

/// At most this many idle streams and events each are kept per context.
pub(crate) const POOL_MAX: usize = 64;

#[derive(Debug)]
struct SetupStream(sys::CUstream);

thread_local! {
    /// The context this crate last made current, or found current, on this thread (its
    /// address; 0 for none): [`PrimaryContext::bind_cached`] skips the driver call
    /// when it is the one wanted.
    static BOUND: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Forgets which context the crate bound on this thread, returning it: a host callback's driver
/// thread may have bound one while running code that is not a crate callback (a foreign host
/// function calling into the crate); while a crate callback runs there, every bind must go
/// through [`PrimaryContext::bind`], which refuses it.
pub(crate) fn take_bound() -> usize {
    BOUND.with(|b| b.replace(0))
}

/// Puts back what [`take_bound`] returned.
pub(crate) fn restore_bound(raw: usize) {
    BOUND.with(|b| b.set(raw));
}

// SAFETY: a CUcontext is a driver handle usable from any thread; the driver synchronises access.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; `&PrimaryContext` only allows binding the context, which is thread-safe.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    pub(crate) fn retain(ordinal: usize, device: sys::CUdevice) -> Result<Arc<Self>> {
        refuse_in_host_callback()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `device` came from `cuDeviceGet`; `raw` is a valid out pointer.
        unsafe { drv!(cuDevicePrimaryCtxRetain(&mut raw, device)) }?;
        Ok(Arc::new(PrimaryContext {
            raw,
            hot: HotEntryPoints::resolve(),
            device,
            ordinal,
            setup: OnceLock::new(),
            pool: std::sync::Mutex::new(Pool::default()),
        }))
    }

    /// Makes this context current on the calling thread. Every driver call that needs a context is
    /// preceded by this.
    pub(crate) fn bind(&self) -> Result<()> {
        // A driver thread running a host callback: CUDA calls there are refused or deadlock
        // (a synchronize waits for the very callback it runs in). Every operation of this crate
        // binds its context first, so this is where they all stop. (`bind_cached` comes here
        // too: nothing is ever bound on such a thread.)
        refuse_in_host_callback()?;
        let mut current = std::ptr::null_mut();
        // SAFETY: `current` is a valid out pointer. Reading the current context is cheaper than
        // setting it, and other code (cudarc, the user) may have changed it since our last call,
        // so it is read every time rather than cached.
        unsafe { drv!(cuCtxGetCurrent(&mut current)) }?;
        if current != self.raw {
            // SAFETY: `raw` is a retained primary context, valid until `Drop`.
            unsafe { drv!(cuCtxSetCurrent(self.raw)) }?;
        }
        BOUND.with(|b| b.set(self.raw as usize));
        Ok(())
    }

    /// [`bind`](Self::bind) for kernel nodes of a definition, which the driver crashes making
    /// with no context current (see [`bind_cached`](Self::bind_cached)), and for work on the
    /// special default-stream handles, which name a stream of the current context: asks the
    /// driver which context is current, through the entry point the context holds, and binds
    /// this one if it is not. One driver call, with no further work where the crate bound this
    /// context on this thread last and it is still current.
    #[inline]
    pub(crate) fn bind_checked(&self) -> Result<()> {
        if BOUND.with(|b| b.get()) == self.raw as usize {
            if let Some(get) = self.hot.ctx_get_current {
                let mut current = std::ptr::null_mut();
                // SAFETY: `current` is a valid out pointer; `get` is the entry point (see
                // `HotEntryPoints`).
                let r = unsafe { get(&mut current) };
                if r == sys::CUresult::CUDA_SUCCESS && current == self.raw {
                    return Ok(());
                }
            }
        }
        self.bind()
    }

    /// [`bind`](Self::bind) for calls whose context comes with their operands, with no driver
    /// call when this crate made the context current on this thread last: work on a stream
    /// (launches, memsets, copies, event records and waits, host functions, graph launches) and
    /// graph edits (the node parameters name their context). The driver runs work on a stream in
    /// the stream's context whichever context is current (measured on driver 13.0: launches,
    /// memsets and captures of them on a stream of context A succeed and run with context B, or
    /// none, current), so if other code changed the current context since, the work is still
    /// right (except on the special default-stream handles, see `Stream::bind_for_work`). Calls
    /// that use the current context itself (allocation, module loads, creating streams and
    /// events, instantiation) use `bind`, which asks the driver every time; kernel nodes of a
    /// definition (adding one, setting its parameters) use `bind_checked`: the driver crashes
    /// making one with no context current (measured on driver 13.0, whatever context the
    /// parameters name), which other code can leave behind by destroying or popping its own
    /// context. With another context current they are made right.
    #[inline]
    pub(crate) fn bind_cached(&self) -> Result<()> {
        if BOUND.with(|b| b.get()) == self.raw as usize {
            return Ok(());
        }
        self.bind()
    }
}

impl PrimaryContext {
    /// The private setup stream (made on first use); the context must be current.
    pub(crate) fn setup_stream(&self) -> Result<sys::CUstream> {
        if let Some(s) = self.setup.get() {
            return Ok(s.0);
        }
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current (the caller's promise); `raw` is a valid out pointer.
        unsafe { drv!(cuStreamCreate(&mut raw, flags)) }?;
        if let Err(SetupStream(lost)) = self.setup.set(SetupStream(raw)) {
            // Another thread made one first: ours is not needed.
            // SAFETY: `lost` was created above and is used by no one.
            unsafe { drv_drop!(cuStreamDestroy_v2(lost)) };
        }
        self.setup
            .get()
            .map(|s| s.0)
            .ok_or_else(|| crate::error::Error::Internal("no setup stream".into()))
    }
}

/// Blocks until all work of the current context is done (`cuCtxSynchronize`).
///
/// # Safety
/// A context is current on the calling thread.
pub(crate) unsafe fn synchronize() -> Result<()> {
    // SAFETY: the context is current (the caller's promise).
    unsafe { drv!(cuCtxSynchronize()) }
}

/// Refuses a host callback's thread (a driver thread), where CUDA calls are not allowed. Every
/// operation binds first ([`PrimaryContext::bind`]); those that take a lock another thread may
/// hold while it waits for the stream running the callback (an event's record lock, an exec's
/// launch lock, a tree's lock) call this before taking it, so a callback gets the error instead
/// of waiting for a lock whose holder waits for the callback.
pub(crate) fn refuse_in_host_callback() -> Result<()> {
    if super::release::in_host_callback() {
        return Err(crate::Error::invalid(
            crate::error::Refusal::InCallback,
            "this runs inside a host callback (a driver thread), where CUDA calls are not allowed: do the work before or after the callback, on a stream or as graph nodes",
        ));
    }
    Ok(())
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // Destroyed as every other handle is: now, or on the release thread when this runs in a
        // host callback (no CUDA call there) or while a `Global` capture records (destroying a
        // stream then would invalidate it).
        let pool = std::mem::take(self.pool.get_mut().unwrap_or_else(|p| p.into_inner()));
        let left = Retired {
            raw: self.raw as usize,
            device: self.device,
            streams: pool.streams.into_iter().map(|s| s as usize).collect(),
            events: pool.events.into_iter().map(|e| e as usize).collect(),
            setup: self.setup.take().map(|SetupStream(s)| s as usize),
        };
        super::release::destroy(move || left.destroy());
    }
}

/// What a dropped [`PrimaryContext`] leaves to destroy: its idle pooled streams and events, its
/// setup stream, and its retain of the primary context (handles as addresses, to be sent).
struct Retired {
    raw: usize,
    device: sys::CUdevice,
    streams: Vec<usize>,
    events: Vec<usize>,
    setup: Option<usize>,
}

impl Retired {
    fn destroy(self) {
        let raw = self.raw as sys::CUcontext;
        let owned = !self.streams.is_empty() || !self.events.is_empty() || self.setup.is_some();
        // SAFETY: `raw` is the primary context, still retained (released below).
        if owned && unsafe { drv!(cuCtxSetCurrent(raw)) }.is_ok() {
            BOUND.with(|b| b.set(self.raw));
            for s in self.streams.into_iter().chain(self.setup) {
                // SAFETY: an idle pooled stream, or the setup stream, owned by the dropped
                // context alone, destroyed once, here, while the context is still retained.
                unsafe { drv_drop!(cuStreamDestroy_v2(s as sys::CUstream)) };
            }
            for e in self.events {
                // SAFETY: an idle pooled event, owned by the pool alone, destroyed once, here.
                unsafe { drv_drop!(cuEventDestroy_v2(e as sys::CUevent)) };
            }
        }
        // SAFETY: the context was retained once in `retain`; this is the matching release.
        unsafe { drv_drop!(cuDevicePrimaryCtxRelease_v2(self.device)) };
        // The note would name a context that may now be gone: the next bind asks the driver.
        BOUND.with(|b| {
            if b.get() == self.raw {
                b.set(0);
            }
        });
    }
}
