//! Page-locked host memory and the asynchronous copies between it and device buffers.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, Weak};

use crate::driver::sync::lock;

use super::{Device, DeviceCopy};
use crate::driver;
use crate::driver::event::EventHandle;
use crate::driver::memory::PinnedAlloc;
use crate::driver::stream::StreamHandle;
use crate::error::{Error, Refusal, Result};

/// A typed buffer of page-locked (pinned) host memory (`cuMemHostAlloc`), zeroed when made:
/// the host side of asynchronous copies ([`Stream::memcpy_htod_async`](crate::Stream::memcpy_htod_async),
/// [`Stream::memcpy_dtoh_async`](crate::Stream::memcpy_dtoh_async)).
///
/// **Why host access can wait.** The GPU reads and writes this memory while copies run, after
/// the call that queued them returned. So the buffer remembers its copies (an event recorded on
/// each stream after the last copy there), and every host access — [`as_slice`](Self::as_slice),
/// [`as_mut_slice`](Self::as_mut_slice), [`synchronize`](Self::synchronize) and `Drop` — first
/// waits for them. A copy into the buffer (device to host) takes `&mut self`, so no slice of it
/// can be alive while it is queued; a copy out of it takes `&self` (the GPU only reads it).
/// `mem::forget` of the buffer only leaks it. If the driver fails to track or to wait for a copy,
/// host access is refused from then on and the memory is leaked rather than freed.
///
/// Copies cannot be captured: a graph launch would touch the memory at times the buffer cannot
/// see. Capture device-to-device copies, and copy to or from the host around the launches.
/// `Send + Sync`.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(device: &Device, stream: &Stream) -> cuda_graph::Result<()> {
/// let mut host = device.alloc_pinned::<i32>(1024)?;
/// host.as_mut_slice()?.fill(7);
/// let dev = device.alloc_zeroed::<i32>(1024)?;
/// stream.memcpy_htod_async(&dev, &host)?;
/// stream.memcpy_dtoh_async(&mut host, &dev)?;
/// assert_eq!(host.as_slice()?[0], 7); // waits for the copy first
/// # Ok(()) }
/// ```
pub struct PinnedBuffer<T: DeviceCopy> {
    alloc: Option<PinnedAlloc>,
    len: usize,
    copies: Mutex<Copies>,
    _t: PhantomData<T>,
}

/// The copies that may still use a pinned buffer.
#[derive(Debug, Default)]
struct Copies {
    /// Per stream: an event recorded after the last copy queued there. A stream is told apart
    /// by its handle's allocation, which the `Weak` keeps from being reused, not by its raw
    /// `CUstream`: two devices' legacy default streams share the raw value 0, and a destroyed
    /// stream's value can be handed out again while its copy still runs.
    pending: Vec<(Weak<StreamHandle>, Arc<EventHandle>)>,
    /// A copy was queued that could be neither tracked nor waited for.
    untracked: bool,
}

impl<T: DeviceCopy> std::fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("ptr", &self.alloc.as_ref().map(|a| a.ptr))
            .field("len", &self.len)
            .field("elem", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

/// The size in bytes of `len` elements of `T`: zero and overflowing sizes are errors.
pub(crate) fn byte_size<T>(len: usize, what: &str) -> Result<usize> {
    if len == 0 || std::mem::size_of::<T>() == 0 {
        return Err(Error::invalid(
            Refusal::Size,
            format!("cannot allocate a zero-sized {what}"),
        ));
    }
    len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        Error::invalid(
            Refusal::Size,
            format!(
                "{len} elements of {} bytes overflow the address space",
                std::mem::size_of::<T>()
            ),
        )
    })
}

/// [`byte_size`] for device memory, which `cuMemAlloc` and the stream-ordered allocator align
/// to 256 bytes: an element type aligned more strictly would be misaligned on the device.
pub(crate) fn device_byte_size<T>(len: usize) -> Result<usize> {
    let align = std::mem::align_of::<T>();
    if align > 256 {
        return Err(Error::invalid(
            Refusal::Size,
            format!(
                "`{}` is aligned to {align} bytes; device allocations are aligned to 256",
                std::any::type_name::<T>()
            ),
        ));
    }
    byte_size::<T>(len, "device buffer")
}

impl<T: DeviceCopy> PinnedBuffer<T> {
    pub(crate) fn new(device: &Device, len: usize) -> Result<Self> {
        let bytes = byte_size::<T>(len, "pinned host buffer")?;
        let alloc = PinnedAlloc::zeroed(&device.ctx, bytes)?;
        let align = std::mem::align_of::<T>();
        if !(alloc.ptr as usize).is_multiple_of(align) {
            // The driver aligns to pages; a slice of a type aligned more strictly would not be.
            // (`alloc` is freed on return.)
            return Err(Error::invalid(Refusal::Size, format!(
                "`{}` is aligned to {align} bytes, more than the driver aligned this pinned buffer to",
                std::any::type_name::<T>()
            )));
        }
        Ok(PinnedBuffer {
            alloc: Some(alloc),
            len,
            copies: Mutex::new(Copies::default()),
            _t: PhantomData,
        })
    }

    /// The number of elements.
    ///
    /// ```no_run
    /// # fn f(host: &cuda_graph::PinnedBuffer<i32>) { let n = host.len(); }
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: zero-length buffers cannot be allocated.
    ///
    /// ```no_run
    /// # fn f(host: &cuda_graph::PinnedBuffer<i32>) { assert!(!host.is_empty()); }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    ///
    /// ```no_run
    /// # fn f(host: &cuda_graph::PinnedBuffer<i32>) { assert_eq!(host.byte_len(), host.len() * 4); }
    /// ```
    pub fn byte_len(&self) -> usize {
        self.alloc.as_ref().map_or(0, |a| a.bytes)
    }

    pub(crate) fn ptr(&self) -> *mut std::ffi::c_void {
        self.alloc.as_ref().map_or(std::ptr::null_mut(), |a| a.ptr)
    }

    /// Blocks until every copy queued with this buffer has finished.
    ///
    /// ```no_run
    /// # fn f(host: &cuda_graph::PinnedBuffer<i32>) -> cuda_graph::Result<()> {
    /// host.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        // Before the lock: another thread may hold it while it waits for a copy queued behind
        // the callback (see `refuse_in_host_callback`).
        crate::driver::context::refuse_in_host_callback()?;
        wait(&mut lock(&self.copies))
    }

    /// The contents, after waiting for every copy queued with this buffer
    /// ([`synchronize`](Self::synchronize)).
    ///
    /// ```no_run
    /// # fn f(host: &cuda_graph::PinnedBuffer<i32>) -> cuda_graph::Result<()> {
    /// let sum: i32 = host.as_slice()?.iter().sum();
    /// # Ok(()) }
    /// ```
    pub fn as_slice(&self) -> Result<&[T]> {
        self.synchronize()?;
        // SAFETY: `len` elements (`bytes` bytes, zeroed or written by copies, any bit pattern
        // valid for `DeviceCopy`) at a page-aligned pointer; every copy writing it has finished
        // and new ones need `&mut self`, which the returned borrow excludes.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr().cast::<T>(), self.len) })
    }

    /// The contents, writable, after waiting for every copy queued with this buffer.
    ///
    /// ```no_run
    /// # fn f(host: &mut cuda_graph::PinnedBuffer<i32>) -> cuda_graph::Result<()> {
    /// host.as_mut_slice()?.fill(1);
    /// # Ok(()) }
    /// ```
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        wait(self.copies.get_mut().unwrap_or_else(|p| p.into_inner()))?;
        // SAFETY: as in `as_slice`; `&mut self` excludes every other access, and no copy that
        // uses the memory is still running.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr().cast::<T>(), self.len) })
    }

    /// Records that a copy using this buffer was queued on `stream` (its event recorded after
    /// it), or that it could not be tracked.
    pub(crate) fn track(&self, stream: &Arc<StreamHandle>, done: Result<Arc<EventHandle>>) {
        let mut copies = lock(&self.copies);
        match done {
            Ok(event) => {
                // Copies that have finished are forgotten here, not only by a wait: a buffer
                // copied on many streams keeps only what may still run.
                copies.pending.retain(|(s, e)| {
                    !std::ptr::eq(s.as_ptr(), Arc::as_ptr(stream))
                        && driver::event::query(e).is_err()
                });
                copies.pending.push((Arc::downgrade(stream), event));
            }
            Err(_) => copies.untracked = true,
        }
    }
}

fn wait(copies: &mut Copies) -> Result<()> {
    if copies.untracked {
        return Err(Error::invalid(
            Refusal::Broken,
            "a copy with this pinned buffer could not be tracked, so host access is refused",
        ));
    }
    while let Some((_, event)) = copies.pending.last() {
        event.ctx.bind()?;
        driver::event::synchronize(event)?;
        copies.pending.pop();
    }
    Ok(())
}

impl<T: DeviceCopy> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        let mut copies = std::mem::take(self.copies.get_mut().unwrap_or_else(|p| p.into_inner()));
        let alloc = self.alloc.take();
        if crate::driver::release::in_host_callback() {
            // No wait here (the driver's thread may not call CUDA): the release thread waits for
            // the copies and then frees the memory, as it releases every other handle.
            crate::driver::release::later(Box::new(move || {
                if wait(&mut copies).is_ok() {
                    drop(alloc);
                } else {
                    std::mem::forget(alloc);
                }
            }));
        } else if wait(&mut copies).is_err() {
            // A copy may still use the memory: leak it rather than free it.
            std::mem::forget(alloc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_overflowing_sizes_are_errors() {
        assert!(matches!(
            byte_size::<i32>(0, "x"),
            Err(e) if e.refusal() == Some(Refusal::Size)
        ));
        assert!(matches!(
            byte_size::<()>(5, "x"),
            Err(e) if e.refusal() == Some(Refusal::Size)
        ));
        assert!(matches!(
            byte_size::<u64>(usize::MAX / 4, "x"),
            Err(e) if e.refusal() == Some(Refusal::Size)
        ));
        assert_eq!(byte_size::<u16>(3, "x").unwrap(), 6);
        #[repr(C, align(512))]
        struct Wide([u8; 512]);
        assert!(matches!(
            device_byte_size::<Wide>(1),
            Err(e) if e.refusal() == Some(Refusal::Size)
        ));
        assert_eq!(device_byte_size::<[u8; 256]>(2).unwrap(), 512);
        assert_eq!(byte_size::<u8>(usize::MAX, "x").unwrap(), usize::MAX);
    }

    #[test]
    fn untracked_copies_refuse_host_access_and_pending_ones_clear() {
        let mut copies = Copies::default();
        assert!(wait(&mut copies).is_ok());
        copies.untracked = true;
        assert!(matches!(
            wait(&mut copies),
            Err(e) if e.refusal() == Some(Refusal::Broken)
        ));
    }
}
