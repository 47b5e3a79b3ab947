//! Stream handle.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::graph::GraphHandle;
use super::lock_rank::{Rank, Ranked};
use super::release;
use super::{drv, drv_drop};
use crate::error::Result;

/// Which capture of this crate a stream (or an event recorded on a capturing stream) belongs to:
/// the graph captured into and the capture's id. The capture is live while the graph's tree lists
/// the id ([`super::graph::TreeState::captures`]); a link to an ended capture is stale.
#[derive(Debug, Clone)]
pub(crate) struct CaptureLink {
    pub(crate) graph: Weak<GraphHandle>,
    pub(crate) id: u64,
}

/// A stream's capture status (`CUstreamCaptureStatus`), read from the driver as an integer so a
/// status a newer driver adds is not undefined behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CaptureStatus {
    /// `CU_STREAM_CAPTURE_STATUS_NONE`: not capturing.
    None,
    /// `CU_STREAM_CAPTURE_STATUS_ACTIVE`: capturing.
    Active,
    /// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`: the capture was invalidated; it must be ended.
    Invalidated,
    /// A status this crate does not know.
    Unknown(u32),
}

impl CaptureStatus {
    /// The raw value of `CU_STREAM_CAPTURE_STATUS_NONE`, to initialise an out parameter.
    pub(crate) const NONE_RAW: u32 =
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32;

    /// Converts the value the driver wrote.
    pub(crate) fn from_raw(v: u32) -> Self {
        use sys::CUstreamCaptureStatus::*;
        match v {
            _ if v == CU_STREAM_CAPTURE_STATUS_NONE as u32 => Self::None,
            _ if v == CU_STREAM_CAPTURE_STATUS_ACTIVE as u32 => Self::Active,
            _ if v == CU_STREAM_CAPTURE_STATUS_INVALIDATED as u32 => Self::Invalidated,
            _ => Self::Unknown(v),
        }
    }
}

// The driver writes a C enum (4 bytes) where `status_out` points.
static_assertions::assert_eq_size!(u32, sys::CUstreamCaptureStatus);
static_assertions::assert_eq_align!(u32, sys::CUstreamCaptureStatus);

/// `status` as the out parameter of `cuStreamIsCapturing` / `cuStreamGetCaptureInfo_*`: the driver
/// writes the status into the `u32`, which is then converted with [`CaptureStatus::from_raw`]
/// (never read as the bindings' enum).
pub(crate) fn status_out(status: &mut u32) -> *mut sys::CUstreamCaptureStatus {
    (status as *mut u32).cast()
}

/// An owned non-blocking stream (`cuStreamCreate(CU_STREAM_NON_BLOCKING)`), destroyed on drop.
///
/// Laid out in declaration order on a cache line of its own (`repr(C, align(64))`): a launch
/// reads the context and the handle from one line.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct StreamHandle {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) raw: sys::CUstream,
    /// The capture this stream records into, if any. Held while work is issued on the stream and
    /// while a capture begins or ends on it, so "which capture, if any" and "record the work with
    /// its operands" are one step.
    capture: Mutex<Option<CaptureLink>>,
    /// Who destroys the stream.
    origin: Origin,
}

/// Where a stream handle's raw stream came from, and so what its `Drop` does.
#[derive(Debug)]
enum Origin {
    /// Made here: destroyed on drop.
    Owned,
    /// From the context's pool (forks' streams): returned to it on drop.
    Pooled,
    /// The caller's (`Stream::from_raw`): never destroyed here; the owner value is dropped.
    Borrowed(#[allow(dead_code)] Box<dyn std::any::Any + Send + Sync>),
}

// SAFETY: CUstream handles may be used from any thread; the driver synchronises access.
unsafe impl Send for StreamHandle {}
// SAFETY: as above.
unsafe impl Sync for StreamHandle {}

impl StreamHandle {
    pub(crate) fn new(ctx: &Arc<PrimaryContext>) -> Result<Arc<Self>> {
        let raw = Self::create_raw(ctx)?;
        Ok(Arc::new(StreamHandle {
            ctx: ctx.clone(),
            raw,
            capture: Mutex::new(None),
            origin: Origin::Owned,
        }))
    }

    fn create_raw(ctx: &Arc<PrimaryContext>) -> Result<sys::CUstream> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; `raw` is a valid out pointer.
        unsafe { drv!(cuStreamCreate(&mut raw, flags)) }?;
        Ok(raw)
    }

    /// A stream from the context's pool (made if the pool is empty), returned to it on drop.
    pub(crate) fn pooled(ctx: &Arc<PrimaryContext>) -> Result<Arc<Self>> {
        let idle = ctx
            .pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .streams
            .pop();
        let raw = match idle {
            Some(raw) => raw,
            None => Self::create_raw(ctx)?,
        };
        Ok(Arc::new(StreamHandle {
            ctx: ctx.clone(),
            raw,
            capture: Mutex::new(None),
            origin: Origin::Pooled,
        }))
    }

    /// Wraps a stream the caller owns; it is never destroyed here, and `owner` is dropped with
    /// the handle.
    ///
    /// # Safety
    /// `raw` is a live stream of `ctx`'s context and stays valid until `owner` is dropped.
    pub(crate) unsafe fn borrowed(
        ctx: &Arc<PrimaryContext>,
        raw: sys::CUstream,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Self> {
        Arc::new(StreamHandle {
            ctx: ctx.clone(),
            raw,
            capture: Mutex::new(None),
            origin: Origin::Borrowed(owner),
        })
    }

    /// Locks the stream's capture slot (see [`StreamHandle::capture`]).
    pub(crate) fn slot(&self) -> Ranked<MutexGuard<'_, Option<CaptureLink>>> {
        Ranked::take(Rank::StreamSlot, 0, || {
            self.capture.lock().unwrap_or_else(|p| p.into_inner())
        })
    }

    /// The capture slot if no one holds it now (never blocks: for destructors, which may run
    /// while this thread holds the slot).
    pub(crate) fn try_slot(&self) -> Option<MutexGuard<'_, Option<CaptureLink>>> {
        match self.capture.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Whether the driver reports the stream as not capturing (an error counts as capturing);
    /// the context must be current.
    pub(crate) fn is_idle_of_captures(&self) -> bool {
        matches!(self.raw_capture_status(), Ok(CaptureStatus::None))
    }

    /// Whether the stream is capturing, and the capture's status.
    pub(crate) fn capture_status(&self) -> Result<CaptureStatus> {
        self.ctx.bind()?;
        self.raw_capture_status()
    }

    /// Whether the stream is the caller's (`Stream::from_raw`): a capture begun outside this
    /// crate may record on it without its capture slot knowing.
    pub(crate) fn is_borrowed(&self) -> bool {
        matches!(self.origin, Origin::Borrowed(_))
    }

    /// `cuStreamIsCapturing`; the context must be current.
    pub(crate) fn raw_capture_status(&self) -> Result<CaptureStatus> {
        // SAFETY: `raw` is a live stream of `ctx`, which the caller made current.
        unsafe { capture_status_of(self.raw) }
    }

    /// Ends any capture on this stream (an invalidated one too) so the stream can be used again.
    /// A graph the capture created itself (`cuStreamBeginCapture`) is destroyed; with
    /// `into_own_graph` the graph belongs to the caller and is left alone. Never fails; returns
    /// `false` when the driver reported the capture as failed at its end (it then destroys a
    /// graph captured into).
    pub(crate) fn abandon_capture(&self, into_own_graph: bool) -> bool {
        if self.ctx.bind().is_err() {
            return true;
        }
        match self.raw_capture_status() {
            Err(_) | Ok(CaptureStatus::None) => return true,
            // Active, invalidated, or a status a newer driver added: try to end it.
            Ok(_) => {}
        }
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (or invalidated); ending it is legal here because
        // builders that capture in Global/ThreadLocal mode are `!Send`, so this runs on the thread
        // that began the capture.
        let ended = unsafe { drv!(cuStreamEndCapture(self.raw, &mut graph)) };
        if !graph.is_null() && !into_own_graph {
            // SAFETY: a graph made by `cuStreamBeginCapture` is owned by whoever ends the capture,
            // here us, and nothing else refers to it.
            unsafe { drv_drop!(cuGraphDestroy(graph)) };
        }
        ended.is_ok()
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        // Idle again, unless a capture it took part in left it capturing (a failed end).
        if let Origin::Borrowed(owner) = &mut self.origin {
            // The owner's drop may call the driver (a cudarc stream destroys itself): dropped
            // where a destroy may run.
            let owner: Box<dyn std::any::Any + Send + Sync> =
                std::mem::replace(owner, Box::new(()));
            release::drop_owner(owner);
            return;
        }
        if matches!(self.origin, Origin::Pooled) {
            if release::in_host_callback() {
                // Asking whether it captures is a CUDA call, not made on a host callback's
                // thread: the release thread decides.
                let (ctx, raw) = (self.ctx.clone(), self.raw as usize);
                release::later(Box::new(move || retire_pooled(&ctx, raw as sys::CUstream)));
            } else {
                retire_pooled(&self.ctx, self.raw);
            }
            return;
        }
        destroy_stream(&self.ctx, self.raw);
    }
}

/// A pooled stream whose last handle went: back to the pool if no capture is left on it and
/// the pool has room, destroyed otherwise.
fn retire_pooled(ctx: &Arc<PrimaryContext>, raw: sys::CUstream) {
    // SAFETY: `raw` is a live stream of `ctx`, owned by the handle that was just dropped.
    if matches!(unsafe { capture_status_of(raw) }, Ok(CaptureStatus::None)) {
        let mut pool = ctx.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.streams.len() < super::context::POOL_MAX {
            pool.streams.push(raw);
            return;
        }
    }
    destroy_stream(ctx, raw);
}

/// Destroys a stream this crate created, once (see `release::destroy_in`).
fn destroy_stream(ctx: &Arc<PrimaryContext>, raw: sys::CUstream) {
    // SAFETY: created by this crate, destroyed exactly once, here; the driver lets pending
    // work finish first.
    release::destroy_in(ctx, raw, |raw| unsafe {
        drv_drop!(cuStreamDestroy_v2(raw))
    });
}

/// Whether `stream` is capturing (`cuStreamIsCapturing`), for a stream this crate may hold no
/// handle of (a cudarc slice's stream).
///
/// # Safety
/// `stream` is a live stream of the current context.
pub(crate) unsafe fn capture_status_of(stream: sys::CUstream) -> Result<CaptureStatus> {
    let mut status = CaptureStatus::NONE_RAW;
    // SAFETY: the caller's promise; `status_out` points at a `u32` the driver may write any
    // status value into (it is never read as the bindings' enum).
    unsafe { drv!(cuStreamIsCapturing(stream, status_out(&mut status))) }?;
    Ok(CaptureStatus::from_raw(status))
}

/// Blocks until all work on `stream` is done (`cuStreamSynchronize`). On a capturing stream this
/// invalidates the capture (the driver reports it then).
pub(crate) fn synchronize(stream: &StreamHandle) -> Result<()> {
    // SAFETY: the stream is live (the handle owns it, or its owner keeps it alive).
    unsafe { drv!(cuStreamSynchronize(stream.raw)) }
}

/// Blocks until all work on the raw `stream` is done (`cuStreamSynchronize`).
///
/// # Safety
/// `stream` is live.
pub(crate) unsafe fn synchronize_raw(stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuStreamSynchronize(stream)) }
}

/// Blocks until `stream` has run the work queued on it so far, once no capture records on it:
/// for the fence threads that release what a launch or an allocation used. The check and an
/// event's record happen under the stream's slot, so a capture another thread begins meanwhile
/// cannot come between them (`cuStreamSynchronize` on a stream that began capturing would
/// invalidate that capture and return at once, before the work ran). `false` if the wait could
/// not be made, and the caller then leaks what it would have released.
pub(crate) fn wait_until_idle(stream: &StreamHandle) -> bool {
    if stream.ctx.bind().is_err() {
        return false;
    }
    let Ok(event) = super::event::EventHandle::pooled(&stream.ctx) else {
        return false;
    };
    loop {
        let slot = stream.slot();
        if slot.is_none() {
            match stream.raw_capture_status() {
                Ok(CaptureStatus::None) => {
                    // SAFETY: both handles are live and of the stream's context, bound above;
                    // the stream does not capture (checked under its slot, held across the
                    // call, which every capture this crate begins takes).
                    let recorded = unsafe { record_event(event.raw, stream.raw) };
                    drop(slot);
                    return recorded.is_ok() && super::event::synchronize(&event).is_ok();
                }
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        drop(slot);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Records `event` on `stream` after the work queued so far (`cuEventRecord`).
///
/// # Safety
/// Both handles are live and belong to the current context.
pub(crate) unsafe fn record_event(event: sys::CUevent, stream: sys::CUstream) -> Result<()> {
    // SAFETY: both handles are live and belong to this context (the caller's promise).
    unsafe { drv!(cuEventRecord(event, stream)) }
}

/// Makes later work on `stream` wait for `event` (`cuStreamWaitEvent`).
///
/// # Safety
/// Both handles are live; `flags` is a valid combination of `CUevent_wait_flags` (0 for none).
pub(crate) unsafe fn wait_event(
    stream: sys::CUstream,
    event: sys::CUevent,
    flags: std::ffi::c_uint,
) -> Result<()> {
    // SAFETY: both handles are live; `flags` is valid (the caller's promises).
    unsafe { drv!(cuStreamWaitEvent(stream, event, flags)) }
}

/// Launches `function` on `stream` (`cuLaunchKernel`) with no `extra` options.
///
/// # Safety
/// The function's module is loaded; `stream` is a live stream of the function's context, or a
/// legacy default-stream handle while that context is current; the calling thread is not
/// running a host callback; `params` is null
/// for a kernel without parameters, or points at one pointer per kernel parameter, each to
/// storage of that parameter's type that lives until the call returns (the driver copies it);
/// the kernel stays in bounds of the memory it is given.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn launch_kernel(
    ctx: &PrimaryContext,
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem_bytes: u32,
    stream: sys::CUstream,
    params: *mut *mut std::ffi::c_void,
) -> Result<()> {
    if let Some(f) = ctx.hot.launch_kernel {
        // SAFETY: the caller's promises above; `f` is the entry point (see `HotEntryPoints`).
        let r = unsafe {
            f(
                function,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_mem_bytes,
                stream,
                params,
                std::ptr::null_mut(),
            )
        };
        return super::check(r, "cuLaunchKernel");
    }
    // SAFETY: the caller's promises above.
    unsafe {
        drv!(cuLaunchKernel(
            function,
            grid.0,
            grid.1,
            grid.2,
            block.0,
            block.1,
            block.2,
            shared_mem_bytes,
            stream,
            params,
            std::ptr::null_mut()
        ))
    }
}

/// Sets `n` bytes at `dst` to `value`, on `stream` (`cuMemsetD8Async`).
///
/// # Safety
/// `dst` holds `n` bytes that stay allocated until the work has run (or, captured, as long as
/// the graph); `stream` is live.
pub(crate) unsafe fn memset_d8_async(
    dst: sys::CUdeviceptr,
    value: u8,
    n: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemsetD8Async(dst, value, n, stream)) }
}

/// Sets `n` 32-bit words at `dst` to `value`, on `stream` (`cuMemsetD32Async`).
///
/// # Safety
/// `dst` holds `n` words that stay allocated until the work has run (or, captured, as long as
/// the graph); `stream` is live.
pub(crate) unsafe fn memset_d32_async(
    dst: sys::CUdeviceptr,
    value: u32,
    n: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemsetD32Async(dst, value, n, stream)) }
}

/// Copies `bytes` bytes from device memory `src` to `dst`, on `stream` (`cuMemcpyDtoDAsync_v2`).
///
/// # Safety
/// Both hold `bytes` bytes that stay allocated until the work has run (or, captured, as long as
/// the graph); `stream` is live.
pub(crate) unsafe fn memcpy_dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemcpyDtoDAsync_v2(dst, src, bytes, stream)) }
}

/// Copies `bytes` bytes from host memory `src` to device memory `dst`, on `stream`
/// (`cuMemcpyHtoDAsync_v2`).
///
/// # Safety
/// `src` is valid for reads of `bytes` bytes until the copy has run (the caller synchronises),
/// `dst` holds `bytes` bytes; `stream` is live and not capturing.
pub(crate) unsafe fn memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: *const std::ffi::c_void,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemcpyHtoDAsync_v2(dst, src, bytes, stream)) }
}

/// Copies `bytes` bytes from device memory `src` to host memory `dst`, on `stream`
/// (`cuMemcpyDtoHAsync_v2`).
///
/// # Safety
/// `dst` is valid for writes of `bytes` bytes, and nothing else reads or writes it, until the
/// copy has run; `src` holds `bytes` bytes; `stream` is live and not capturing.
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: *mut std::ffi::c_void,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemcpyDtoHAsync_v2(dst, src, bytes, stream)) }
}

/// Allocates `bytes` bytes ordered on `stream` (`cuMemAllocAsync`); in a capture this adds a
/// memory allocation node and the address is valid only while the graph runs.
///
/// # Safety
/// `stream` is live; its context is current; a capture it records into is locked by the caller.
pub(crate) unsafe fn mem_alloc_async(
    out: &mut sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemAllocAsync(out, bytes, stream)) }
}

/// Frees `ptr` ordered on `stream` (`cuMemFreeAsync`); in a capture this adds a memory free node.
///
/// # Safety
/// `stream` is live; `ptr` is stream-ordered or graph memory that nothing uses after the work
/// queued so far (in a capture: an allocation of the same graph, freed once).
pub(crate) unsafe fn mem_free_async(ptr: sys::CUdeviceptr, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuMemFreeAsync(ptr, stream)) }
}

/// Queues a host function on `stream` (`cuLaunchHostFunc`).
///
/// # Safety
/// `stream` is live; `user_data` stays valid for as long as `func` may be called with it (once
/// per run of the work, or per launch if captured); `func` never unwinds and never calls CUDA.
pub(crate) unsafe fn launch_host_func(
    stream: sys::CUstream,
    func: sys::CUhostFn,
    user_data: *mut std::ffi::c_void,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuLaunchHostFunc(stream, func, user_data)) }
}

/// Begins capturing `stream` into a graph the driver makes for the capture
/// (`cuStreamBeginCapture_v2`); `cuStreamEndCapture` hands that graph to its caller.
///
/// # Safety
/// `stream` is live and not capturing; its context is current.
pub(crate) unsafe fn begin_capture(
    stream: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuStreamBeginCapture_v2(stream, mode)) }
}

/// Begins capturing `stream` into the existing `graph` (`cuStreamBeginCaptureToGraph`), after
/// the `n` nodes `deps` (with edge data `edges`, or null for default edges).
///
/// # Safety
/// Stream and graph are live, the graph's tree is locked; `deps` (and `edges` unless null) hold
/// `n` entries, nodes of `graph`.
pub(crate) unsafe fn begin_capture_to_graph(
    stream: sys::CUstream,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    edges: *const sys::CUgraphEdgeData,
    n: usize,
    mode: sys::CUstreamCaptureMode,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe {
        drv!(cuStreamBeginCaptureToGraph(
            stream, graph, deps, edges, n, mode
        ))
    }
}

/// Ends the capture on `stream` (`cuStreamEndCapture`); the driver writes the captured graph (or
/// null) into `graph`, also when it reports a failure.
///
/// # Safety
/// `stream` is live; a capture in `Global` or `ThreadLocal` mode is ended on the thread that
/// began it; the caller holds what the capture records into as the capture requires (its
/// graph's tree lock).
pub(crate) unsafe fn end_capture(stream: sys::CUstream, graph: &mut sys::CUgraph) -> Result<()> {
    // SAFETY: the caller's promises above; `graph` is a valid out pointer.
    unsafe { drv!(cuStreamEndCapture(stream, graph)) }
}

/// Reads the capture state of `stream` (`cuStreamGetCaptureInfo_v3`). `status` is required (the
/// driver returns `CUDA_ERROR_INVALID_VALUE` for a null one); every other out pointer may be null.
///
/// # Safety
/// `stream` is live; every non-null out pointer is valid for a write of its type (`status`
/// through [`status_out`] where the value is read as a `u32`).
pub(crate) unsafe fn capture_info(
    stream: sys::CUstream,
    status: *mut sys::CUstreamCaptureStatus,
    id: *mut sys::cuuint64_t,
    graph: *mut sys::CUgraph,
    deps: *mut *const sys::CUgraphNode,
    edges: *mut *const sys::CUgraphEdgeData,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe {
        drv!(cuStreamGetCaptureInfo_v3(
            stream, status, id, graph, deps, edges, n
        ))
    }
}

/// Sets or adds to the dependencies of the capture on `stream`
/// (`cuStreamUpdateCaptureDependencies_v2`).
///
/// # Safety
/// `stream` is live and capturing; `deps` (and `edges` unless null) hold `n` entries, nodes of
/// the capture graph; `flags` is a `CUstreamUpdateCaptureDependencies_flags` value.
pub(crate) unsafe fn update_capture_dependencies(
    stream: sys::CUstream,
    deps: *mut sys::CUgraphNode,
    edges: *const sys::CUgraphEdgeData,
    n: usize,
    flags: std::ffi::c_uint,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe {
        drv!(cuStreamUpdateCaptureDependencies_v2(
            stream, deps, edges, n, flags
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_statuses_convert_without_trusting_the_driver() {
        use sys::CUstreamCaptureStatus::*;
        assert_eq!(
            CaptureStatus::from_raw(CaptureStatus::NONE_RAW),
            CaptureStatus::None
        );
        assert_eq!(
            CaptureStatus::from_raw(CU_STREAM_CAPTURE_STATUS_ACTIVE as u32),
            CaptureStatus::Active
        );
        assert_eq!(
            CaptureStatus::from_raw(CU_STREAM_CAPTURE_STATUS_INVALIDATED as u32),
            CaptureStatus::Invalidated
        );
        assert_eq!(CaptureStatus::from_raw(3), CaptureStatus::Unknown(3));
        assert_eq!(
            CaptureStatus::from_raw(0xDEAD_BEEF),
            CaptureStatus::Unknown(0xDEAD_BEEF)
        );
    }

    #[test]
    fn the_status_out_pointer_is_the_u32() {
        let mut v = 7u32;
        let p = status_out(&mut v);
        // SAFETY: `p` points at `v`, a live `u32`; writing a `u32` through it is what the driver
        // does.
        unsafe { p.cast::<u32>().write(CaptureStatus::NONE_RAW) };
        assert_eq!(CaptureStatus::from_raw(v), CaptureStatus::None);
    }
}
