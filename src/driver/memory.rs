//! Device memory handle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::event::EventHandle;
use super::stream::StreamHandle;
use super::{drv, drv_drop, release};
use crate::error::Result;

/// A device allocation: owned (`cuMemAlloc_v2`, or `cuMemAllocAsync` on a stream; freed on
/// drop) or the caller's (`DeviceBuffer::from_raw`: never freed here; its owner value is dropped
/// with this handle).
pub(crate) struct DeviceAlloc {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    /// For a stream-ordered allocation: its stream and the event recorded after it.
    pub(crate) ordered: Option<Ordered>,
    /// For memory the caller owns: what keeps it allocated. `None` for memory allocated here.
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// For a part of another allocation (`DeviceBuffer::slice`): that allocation, kept alive and
    /// freed by its own handle.
    parent: Option<Arc<DeviceAlloc>>,
}

impl std::fmt::Debug for DeviceAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAlloc")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .field("borrowed", &self.is_borrowed())
            .field("part_of", &self.parent.as_ref().map(|p| p.ptr))
            .field("stream_ordered", &self.ordered.is_some())
            .finish()
    }
}

/// Whether this process has made a stream-ordered allocation: until it has, no graph can hold
/// one, and [`ready_events`] has nothing to look for.
static ANY_ORDERED: AtomicBool = AtomicBool::new(false);

/// The `ready` events of the stream-ordered allocations among `owners` (looking inside shared
/// chunks, as graphs hold them), each once. A graph that holds such an allocation may be
/// launched on any stream: its first launch must wait for the allocation (and its zeroing) to
/// have been made on the allocation's own stream.
pub(crate) fn ready_events<'a>(
    owners: impl Iterator<Item = &'a super::graph::Owner>,
) -> Vec<Arc<EventHandle>> {
    let mut out: Vec<Arc<EventHandle>> = Vec::new();
    if ANY_ORDERED.load(Ordering::Relaxed) {
        super::graph::search_owners(owners, &mut |o| {
            if let Some(ord) = o
                .downcast_ref::<DeviceAlloc>()
                .and_then(|a| a.ordered.as_ref())
            {
                if !out.iter().any(|e| Arc::ptr_eq(e, &ord.ready)) {
                    out.push(ord.ready.clone());
                }
            }
            false
        });
    }
    out
}

/// Where a stream-ordered allocation (`cuMemAllocAsync`) is ordered.
#[derive(Debug, Clone)]
pub(crate) struct Ordered {
    /// The stream it was allocated on, and is freed on (`cuMemFreeAsync`).
    pub(crate) stream: Arc<StreamHandle>,
    /// Recorded on `stream` right after the allocation (and its zeroing): other streams wait on
    /// it before they use the memory.
    pub(crate) ready: Arc<EventHandle>,
}

impl DeviceAlloc {
    /// Allocates `bytes` (> 0) and zeroes them.
    pub(crate) fn zeroed(ctx: &Arc<PrimaryContext>, bytes: usize) -> Result<Arc<Self>> {
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: the context is current; `ptr` is a valid out pointer.
        unsafe { drv!(cuMemAlloc_v2(&mut ptr, bytes)) }?;
        let alloc = Arc::new(DeviceAlloc {
            ctx: ctx.clone(),
            ptr,
            bytes,
            ordered: None,
            owner: None,
            parent: None,
        });
        // Zeroed on the context's private setup stream, and waited for, so the zeroes are there
        // for any stream — without synchronising the context (refused while streams capture).
        let setup = ctx.setup_stream()?;
        // SAFETY: `ptr` points at `bytes` bytes just allocated; the setup stream is live.
        unsafe { drv!(cuMemsetD8Async(ptr, 0, bytes, setup)) }?;
        // SAFETY: as above; the setup stream is never captured.
        unsafe { drv!(cuStreamSynchronize(setup)) }?;
        Ok(alloc)
    }

    /// Stands for `bytes` bytes at `ptr` that the caller keeps allocated through `owner`
    /// (dropped with this handle); never freed here. Makes no driver call.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` is device memory usable in `ctx`'s context and stays allocated until
    /// `owner` is dropped.
    pub(crate) unsafe fn borrowed(
        ctx: &Arc<PrimaryContext>,
        ptr: sys::CUdeviceptr,
        bytes: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Self> {
        Arc::new(DeviceAlloc {
            ctx: ctx.clone(),
            ptr,
            bytes,
            ordered: None,
            owner: Some(owner),
            parent: None,
        })
    }

    /// Bytes `offset..offset + bytes` of `parent`, as an allocation of their own that keeps
    /// `parent` alive and is ordered as it is (a stream-ordered parent's part stays on its
    /// stream). `None` if the range is not inside `parent`.
    pub(crate) fn part(
        parent: &Arc<DeviceAlloc>,
        offset: usize,
        bytes: usize,
    ) -> Option<Arc<Self>> {
        let end = offset.checked_add(bytes)?;
        if bytes == 0 || end > parent.bytes {
            return None;
        }
        Some(Arc::new(DeviceAlloc {
            ctx: parent.ctx.clone(),
            ptr: parent.ptr.checked_add(offset as u64)?,
            bytes,
            ordered: parent.ordered.clone(),
            owner: None,
            parent: Some(parent.clone()),
        }))
    }

    /// Whether the memory is the caller's (made by [`borrowed`](Self::borrowed), or a part of
    /// such memory).
    pub(crate) fn is_borrowed(&self) -> bool {
        self.owner.is_some() || self.parent.as_ref().is_some_and(|p| p.is_borrowed())
    }
}

impl DeviceAlloc {
    /// Allocates `bytes` (> 0) ordered on `stream` (`cuMemAllocAsync`), zeroes them on the same
    /// stream and records `ready` after that. Nothing is waited for.
    ///
    /// The caller holds the stream's capture slot and has checked that the stream does not
    /// capture (a captured allocation is graph memory, not this).
    pub(crate) fn zeroed_async(stream: &Arc<StreamHandle>, bytes: usize) -> Result<Arc<Self>> {
        let ctx = &stream.ctx;
        ctx.bind()?;
        // Before the allocation exists, so that no graph can hold it unseen.
        ANY_ORDERED.store(true, Ordering::Relaxed);
        // Made first, so that nothing fails between the allocation and its owner.
        let ready = EventHandle::new(ctx)?;
        let mut ptr = 0;
        // SAFETY: the context is current; the stream is live and not capturing (the caller's
        // promise); `ptr` is a valid out pointer.
        unsafe { drv!(cuMemAllocAsync(&mut ptr, bytes, stream.raw)) }?;
        let alloc = Arc::new(DeviceAlloc {
            ctx: ctx.clone(),
            ptr,
            bytes,
            ordered: Some(Ordered {
                stream: stream.clone(),
                ready: ready.clone(),
            }),
            owner: None,
            parent: None,
        });
        // SAFETY: `ptr` holds `bytes` bytes from the allocation just queued before it on the
        // same stream.
        unsafe { drv!(cuMemsetD8Async(ptr, 0, bytes, stream.raw)) }?;
        // SAFETY: both handles are live and belong to this context.
        unsafe { drv!(cuEventRecord(ready.raw, stream.raw)) }?;
        Ok(alloc)
    }

    /// Refuses work on a stream-ordered allocation on a stream other than its own (its free is
    /// ordered on its own stream only); anything goes for other allocations.
    pub(crate) fn check_stream(&self, stream: sys::CUstream) -> Result<()> {
        match &self.ordered {
            Some(o) if o.stream.raw != stream => Err(crate::error::Error::invalid(
                crate::error::Refusal::Order,
                "a buffer from `Stream::alloc_async` is used on the stream that allocated it (or in captures): its memory is freed in that stream's order; copy it into a `Device::alloc_zeroed` buffer to share it between streams",
            )),
            _ => Ok(()),
        }
    }

    /// Makes work queued next on `stream` wait until a stream-ordered allocation exists (nothing
    /// for other allocations, or on its own stream). `stream` must not be capturing: an event
    /// recorded outside a capture cannot be waited on inside it.
    ///
    /// # Safety
    /// `stream` is a live stream of this allocation's context, which is current.
    pub(crate) unsafe fn order_before(&self, stream: sys::CUstream) -> Result<()> {
        match &self.ordered {
            Some(o) if o.stream.raw != stream => {
                // SAFETY: both handles are live (the caller's promise; `ready` is held).
                unsafe { drv!(cuStreamWaitEvent(stream, o.ready.raw, 0)) }
            }
            _ => Ok(()),
        }
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.owner.is_some() || self.parent.is_some() {
            // The caller's memory: its owner frees it, or not (dropped where a destroy may run:
            // a cudarc slice's drop frees its memory). A part of another allocation: that
            // allocation's handle frees it.
            if let Some(owner) = self.owner.take() {
                release::drop_owner(owner);
            }
            return;
        }
        match self.ordered.take() {
            // SAFETY: allocated in `zeroed`, freed exactly once, here.
            None => release::destroy_in(&self.ctx, self.ptr, |ptr| unsafe {
                drv_drop!(cuMemFree_v2(ptr))
            }),
            Some(o) => free_ordered(self.ctx.clone(), self.ptr, o),
        }
    }
}

/// Frees a stream-ordered allocation: `cuMemFreeAsync` on its stream, after the work queued
/// there so far, when the stream does not capture (checked under its capture slot, so no capture
/// can begin in between). Otherwise (the stream captures, or its slot is held by this very
/// thread) a thread of its own waits until the stream stops capturing and has finished its work,
/// then frees it with `cuMemFree_v2`. If that thread cannot start, the memory is leaked rather
/// than freed early.
fn free_ordered(ctx: Arc<PrimaryContext>, ptr: sys::CUdeviceptr, o: Ordered) {
    // The stream, where it is left here, drops in the job: the owner of a stream made from the
    // caller's goes to the release thread then (`release::drop_owner`), never run under the
    // destroy order lock.
    release::destroy(move || drop(free_ordered_now(&ctx, ptr, o)));
}

/// [`free_ordered`]'s job: frees `ptr` now on its stream, or hands it to a thread of its own.
/// Returns the stream where it is left to drop (the thread takes it otherwise).
fn free_ordered_now(
    ctx: &Arc<PrimaryContext>,
    ptr: sys::CUdeviceptr,
    o: Ordered,
) -> Option<Arc<super::stream::StreamHandle>> {
    if ctx.bind().is_err() {
        return Some(o.stream);
    }
    let freed = match o.stream.try_slot() {
        Some(slot) if slot.is_none() && o.stream.is_idle_of_captures() => {
            // SAFETY: the stream is live and not capturing (checked under its slot, which is
            // held across the call); the memory was allocated by `cuMemAllocAsync` and is freed
            // once, after the work queued on its stream.
            unsafe { drv!(cuMemFreeAsync(ptr, o.stream.raw)) }.is_ok()
        }
        _ => false,
    };
    if freed {
        return Some(o.stream);
    }
    // The thread takes the stream through a slot: if it cannot start, the stream comes back
    // here (the closure, dropped inside `spawn`, must not drop it).
    let slot = Arc::new(std::sync::Mutex::new(Some(o.stream)));
    let (ctx, for_thread) = (ctx.clone(), slot.clone());
    let spawned = std::thread::Builder::new()
        .name("cuda-graph-free".into())
        .spawn(move || {
            let stream = for_thread.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(stream) = stream {
                if super::stream::wait_until_idle(&stream) {
                    // SAFETY: the work queued on the allocation's stream has finished (other
                    // streams are ordered by the user, as for any stream-ordered memory);
                    // `cuMemFree_v2` frees `cuMemAllocAsync` memory without waiting; freed once.
                    release::destroy_in(&ctx, ptr, |ptr| unsafe { drv_drop!(cuMemFree_v2(ptr)) });
                }
            }
        });
    match spawned {
        Ok(_) => None,
        // Without a thread the memory leaks: never freed while still in use.
        Err(_) => slot.lock().unwrap_or_else(|p| p.into_inner()).take(),
    }
}

/// Copies the whole of `alloc` to host memory at `dst` on the context's private setup stream
/// (after the allocation exists, for stream-ordered memory) and waits for that stream only.
///
/// # Safety
/// `dst` is valid for writes of `alloc.bytes` bytes. If this fails, `dst` may still be written
/// later: the caller must then leak it rather than free or reuse it.
pub(crate) unsafe fn dtoh_on_setup(alloc: &DeviceAlloc, dst: *mut std::ffi::c_void) -> Result<()> {
    alloc.ctx.bind()?;
    let setup = alloc.ctx.setup_stream()?;
    // SAFETY: the setup stream is live, of this context (current), and never captured.
    unsafe { alloc.order_before(setup) }?;
    // SAFETY: `dst` holds `bytes` writable bytes (the caller's promise), `alloc` as many; the
    // setup stream is never captured.
    unsafe { drv!(cuMemcpyDtoHAsync_v2(dst, alloc.ptr, alloc.bytes, setup)) }?;
    // SAFETY: as above.
    unsafe { drv!(cuStreamSynchronize(setup)) }
}

/// Copies `alloc.bytes` bytes from host memory at `src` into `alloc` on the context's private
/// setup stream (after the allocation exists, for stream-ordered memory) and waits for that
/// stream only.
///
/// # Safety
/// `src` is valid for reads of `alloc.bytes` bytes during the call. (A copy from pageable memory
/// is staged before `cuMemcpyHtoDAsync_v2` returns, so `src` is not read after a failure.)
pub(crate) unsafe fn htod_on_setup(
    alloc: &DeviceAlloc,
    src: *const std::ffi::c_void,
) -> Result<()> {
    alloc.ctx.bind()?;
    let setup = alloc.ctx.setup_stream()?;
    // SAFETY: the setup stream is live, of this context (current), and never captured.
    unsafe { alloc.order_before(setup) }?;
    // SAFETY: `src` holds `bytes` readable bytes (the caller's promise), `alloc` as many; the
    // setup stream is never captured.
    unsafe { drv!(cuMemcpyHtoDAsync_v2(alloc.ptr, src, alloc.bytes, setup)) }?;
    // SAFETY: as above.
    unsafe { drv!(cuStreamSynchronize(setup)) }
}

/// Frees device memory (`cuMemFree_v2`); freeing an address not allocated now is an error.
///
/// # Safety
/// Nothing uses the memory at `ptr` any more (no queued or running work), and it is freed once.
pub(crate) unsafe fn free(ptr: sys::CUdeviceptr) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuMemFree_v2(ptr)) }
}

/// Page-locked host memory (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`), zeroed, freed
/// with `cuMemFreeHost` on drop. The owner ([`crate::PinnedBuffer`]) makes sure no copy uses it
/// any more before it drops this.
#[derive(Debug)]
pub(crate) struct PinnedAlloc {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) ptr: *mut std::ffi::c_void,
    pub(crate) bytes: usize,
}

// SAFETY: a pointer to host memory the owner synchronises access to; freeing it is thread-safe.
unsafe impl Send for PinnedAlloc {}
// SAFETY: as above; `&PinnedAlloc` gives only the address.
unsafe impl Sync for PinnedAlloc {}

impl PinnedAlloc {
    /// Allocates `bytes` (> 0) of page-locked host memory and zeroes it.
    pub(crate) fn zeroed(ctx: &Arc<PrimaryContext>, bytes: usize) -> Result<Self> {
        ctx.bind()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: the context is current; `ptr` is a valid out pointer; PORTABLE is a valid flag.
        unsafe {
            drv!(cuMemHostAlloc(
                &mut ptr,
                bytes,
                sys::CU_MEMHOSTALLOC_PORTABLE
            ))
        }?;
        let alloc = PinnedAlloc {
            ctx: ctx.clone(),
            ptr,
            bytes,
        };
        if ptr.is_null() {
            return Err(crate::Error::Internal(
                "cuMemHostAlloc returned a null pointer".into(),
            ));
        }
        // SAFETY: the driver returned `bytes` writable bytes at `ptr`, used by nothing else yet.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        Ok(alloc)
    }
}

impl Drop for PinnedAlloc {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: allocated in `zeroed`, freed exactly once, here; the owner waited for every
        // copy that used it.
        release::destroy_in(&self.ctx, self.ptr, |ptr| unsafe {
            drv_drop!(cuMemFreeHost(ptr))
        });
    }
}

/// A region copied between device memory, in bytes, as `CUDA_MEMCPY3D` takes it (a checked
/// `Copy3d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawCopy {
    pub(crate) width_bytes: usize,
    pub(crate) height: usize,
    pub(crate) depth: usize,
    pub(crate) src_pitch: usize,
    pub(crate) src_rows: usize,
    pub(crate) dst_pitch: usize,
    pub(crate) dst_rows: usize,
}

impl RawCopy {
    /// `bytes` contiguous bytes.
    pub(crate) fn linear(bytes: usize) -> RawCopy {
        RawCopy {
            width_bytes: bytes,
            height: 1,
            depth: 1,
            src_pitch: bytes,
            src_rows: 1,
            dst_pitch: bytes,
            dst_rows: 1,
        }
    }
}

/// The `CUDA_MEMCPY3D` of a device-to-device copy of `c` from `src` into `dst`.
pub(crate) fn copy3d(dst: u64, src: u64, c: &RawCopy) -> sys::CUDA_MEMCPY3D {
    // Every field spelled out: zeroing is not valid here (`CUmemorytype` has no 0 value).
    let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
    sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: device,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: c.src_pitch,
        srcHeight: c.src_rows,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: device,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: c.dst_pitch,
        dstHeight: c.dst_rows,
        WidthInBytes: c.width_bytes,
        Height: c.height,
        Depth: c.depth,
    }
}

/// Copies `c` from `src` into `dst` on `stream` (`cuMemcpy3DAsync_v2`).
///
/// # Safety
/// Both regions lie inside memory that stays allocated until the copy has run (or, captured,
/// as long as the graph); `stream` is live and its context bound.
pub(crate) unsafe fn copy3d_async(
    dst: u64,
    src: u64,
    c: &RawCopy,
    stream: sys::CUstream,
) -> Result<()> {
    let p = copy3d(dst, src, c);
    // SAFETY: the caller's promises; `p` lives until the call returns.
    unsafe { drv!(cuMemcpy3DAsync_v2(&p, stream)) }
}
