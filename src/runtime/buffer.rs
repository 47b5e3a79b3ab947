use std::marker::PhantomData;
use std::sync::Arc;

use super::Device;
use crate::driver;
use crate::driver::memory::DeviceAlloc;
use crate::error::{Error, Refusal, Result};

/// Plain data that can be copied to and from the device byte for byte: the element type of a
/// [`DeviceBuffer`], and a kernel argument passed by value ([`KernelArgs::push_value`]).
///
/// Implemented for the primitive integers and floats. Implement it for your own `#[repr(C)]`
/// structs that mirror a kernel's parameter or element type:
///
/// ```
/// use cuda_graph::DeviceCopy;
///
/// /// CUDA's `float4` (`struct __align__(16) float4 { float x, y, z, w; }`).
/// #[derive(Clone, Copy)]
/// #[repr(C, align(16))]
/// struct Float4 {
///     x: f32,
///     y: f32,
///     z: f32,
///     w: f32,
/// }
///
/// // SAFETY: four `f32`s (every bit pattern valid), no pointers, no interior mutability, and
/// // the layout (16 bytes, 16-byte aligned) of the kernel's `float4`.
/// unsafe impl DeviceCopy for Float4 {}
/// ```
///
/// # Safety
/// By implementing `DeviceCopy` for a type you promise all of the following:
///
/// - **Every bit pattern is valid.** Any `size_of::<Self>()` bytes are a valid `Self`: values are
///   copied back from device memory byte for byte ([`DeviceBuffer::to_vec`]), whatever a kernel
///   wrote there. So no `bool`, `char`, Rust enums, `NonZero*`, references or `Box`es, nor types
///   containing them.
/// - **No pointers, references or interior mutability.** The type holds no host pointers or
///   references (a kernel could not use them, and reading one back would forge it) and nothing
///   like `Cell`, `UnsafeCell` or atomics: its bytes are copied without synchronisation. A device
///   address stored as an integer (`u64`, like [`DeviceBuffer::device_ptr`]) is fine.
/// - **`Copy + Send + Sync + 'static`** (the supertraits): values are duplicated bitwise, never
///   dropped, and may be copied on any thread at any time while a graph holds them.
/// - **The device's layout.** Its size, field offsets and alignment are exactly those of the type
///   the kernel declares for the parameter or element: use `#[repr(C)]` (or `#[repr(transparent)]`
///   over such a type), never the default Rust representation, and `#[repr(C, align(N))]` to match
///   a CUDA `__align__(N)` type. Padding bytes are copied as they are; their values are
///   unspecified, so a kernel must not depend on them.
///
/// **Supported alignments**: every alignment the Rust type can have. A kernel argument is stored
/// on the host with the type's alignment (inline when it fits 16 bytes at an alignment of at
/// most 16, else in an allocation of its own with the type's layout), and the driver copies it
/// into the kernel's parameter space at the offset the kernel declares. Device buffers start at a
/// `cuMemAlloc` address, aligned to at least 256 bytes, so elements of alignment up to 256 are
/// aligned on the device (and host copies go through `Vec<Self>` / `&[Self]`, aligned for the
/// type); allocating elements aligned more strictly is an [`Error::InvalidArgument`]. Zero-sized types cannot be allocated on the device and match no kernel parameter.
///
/// Implemented here for the primitive numbers (`u8` … `u64`, `i8` … `i64`, `usize`, `isize`,
/// `f32`, `f64`), for arrays `[T; N]` of `DeviceCopy` elements, and with the `half` feature for
/// `half::f16` and `half::bf16` (CUDA's `__half`, `__nv_bfloat16`). `bool` is not `DeviceCopy` (a
/// byte read back from the device need not be 0 or 1), but it is a kernel argument
/// ([`KernelArg`](crate::KernelArg)): a C++ `bool`, one byte, 0 or 1.
///
/// ```
/// use cuda_graph::KernelArgs;
/// let args = KernelArgs::new().arg(42usize).arg([1.0f32, 2.0, 3.0, 4.0]).arg(true);
/// assert_eq!(args.len(), 3);
/// ```
///
/// [`KernelArgs::push_value`]: crate::KernelArgs::push_value
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number: every bit pattern is valid and it holds no pointers.
        unsafe impl DeviceCopy for $t {}
    )* };
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, usize, isize, f32, f64);

// SAFETY: an array of `DeviceCopy` elements has no padding between them, the C layout of
// `T[N]`, and every bit pattern of each element is valid.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}

// SAFETY: IEEE half and bfloat16 are 16-bit patterns, every one valid (`half` stores them as
// `u16`, `#[repr(transparent)]`), the layout of CUDA's `__half` and `__nv_bfloat16`.
#[cfg(feature = "half")]
unsafe impl DeviceCopy for half::f16 {}
// SAFETY: as above.
#[cfg(feature = "half")]
unsafe impl DeviceCopy for half::bf16 {}

/// A typed allocation in device memory, freed when the last owner lets go.
///
/// Graphs that use the buffer (a kernel argument, a memset or memcpy) hold it too, so dropping
/// the `DeviceBuffer` while a graph or exec still uses it only drops this handle's share.
/// Clones share the allocation (another handle to the same device memory, not a copy of it).
/// `Send + Sync`: the handle is a device address; the data lives on the GPU.
///
/// Memory this crate did not allocate (a raw `CUdeviceptr`, cudarc's, a library's) becomes a
/// `DeviceBuffer` through the `unsafe` [`from_raw`](Self::from_raw), with an owner value that is
/// held in place of the allocation; such a buffer is used exactly like one of the crate's own.
pub struct DeviceBuffer<T: DeviceCopy> {
    pub(crate) alloc: Arc<DeviceAlloc>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: DeviceCopy> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.alloc.ptr))
            .field("len", &self.len)
            .field("elem", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: DeviceCopy> Clone for DeviceBuffer<T> {
    fn clone(&self) -> Self {
        DeviceBuffer::new(self.alloc.clone(), self.len)
    }
}

/// The byte length of `len` elements of `T` at device address `ptr`, if they can form a buffer:
/// `T` is not zero-sized, `len > 0`, `ptr` is not null and aligned for `T`, and the range does not
/// overflow.
/// `range` within `0..len` as `(start, end)`, non-empty.
pub(crate) fn bounds(
    range: &impl std::ops::RangeBounds<usize>,
    len: usize,
) -> Result<(usize, usize)> {
    use std::ops::Bound;
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s < e && e <= len => Ok((s, e)),
        _ => Err(Error::invalid(
            Refusal::Size,
            format!(
                "the range {:?}..{:?} is empty or out of the {len} elements",
                range.start_bound(),
                range.end_bound()
            ),
        )),
    }
}

pub(crate) fn raw_byte_len<T>(ptr: u64, len: usize) -> Result<usize> {
    let size = std::mem::size_of::<T>();
    let align = std::mem::align_of::<T>() as u64;
    let what = std::any::type_name::<T>();
    if size == 0 {
        return Err(Error::invalid(
            Refusal::Size,
            format!("a device buffer of the zero-sized type {what}"),
        ));
    }
    if len == 0 {
        return Err(Error::invalid(
            Refusal::Size,
            "a device buffer of 0 elements",
        ));
    }
    if ptr == 0 {
        return Err(Error::invalid(
            Refusal::Size,
            "a device buffer at the null address",
        ));
    }
    if !ptr.is_multiple_of(align) {
        return Err(Error::invalid(
            Refusal::Size,
            format!("device address {ptr:#x} is not aligned for {what} (alignment {align})"),
        ));
    }
    let bytes = len
        .checked_mul(size)
        .filter(|&b| ptr.checked_add(b as u64).is_some())
        .ok_or_else(|| {
            Error::invalid(
                Refusal::Size,
                format!("{len} elements of {what} at {ptr:#x} overflow the address space"),
            )
        })?;
    Ok(bytes)
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Wraps device memory this crate did not allocate — a raw `CUdeviceptr`, cudarc's, a
    /// library's — as a buffer of `len` elements at `ptr`. The crate never frees it: `owner`
    /// (for example what owns the allocation) is held in place of an allocation by this buffer,
    /// its clones and every graph and exec that uses it (as a kernel argument, memset or memcpy,
    /// captured or in a definition), and dropped after the last of them.
    ///
    /// Fails with [`Error::InvalidArgument`] when `T` is zero-sized, `len` is 0, `ptr` is null or
    /// not aligned for `T`, or the range overflows. Makes no driver call.
    ///
    /// With the `cudarc` feature, `DeviceBuffer::from_cudarc` does this safely for a cudarc
    /// `CudaSlice` shared through an `Arc`.
    ///
    /// # Safety
    /// - `ptr..ptr + len * size_of::<T>()` is device memory usable in `device`'s primary context
    ///   (allocated in it, or mapped/peer-accessible there), readable and writable by the GPU;
    /// - it stays allocated until `owner` is dropped (the crate drops `owner` only after the
    ///   last graph launch and the last stream operation that use the memory have finished);
    /// - nothing else frees it, or reuses it in ways the graphs' work would race with, before then.
    ///
    /// The host never reads or writes this memory except through this buffer's own methods, so
    /// the contents need not be valid `T`s until they are copied back ([`DeviceCopy`] types
    /// accept any bits).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, raw_ptr: u64, keep: std::sync::Arc<()>) -> cuda_graph::Result<()> {
    /// // SAFETY: `raw_ptr` points at 256 f32 in device 0's primary context; `keep` owns them.
    /// let buf = unsafe { DeviceBuffer::<f32>::from_raw(device, raw_ptr, 256, keep) }?;
    /// let stream = device.create_stream()?;
    /// stream.memset_d32(&buf, 0)?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn from_raw(
        device: &Device,
        ptr: u64,
        len: usize,
        owner: impl std::any::Any + Send + Sync,
    ) -> Result<DeviceBuffer<T>> {
        let bytes = raw_byte_len::<T>(ptr, len)?;
        // SAFETY: forwarded from the caller.
        let alloc = unsafe { DeviceAlloc::borrowed(&device.ctx, ptr, bytes, Box::new(owner)) };
        Ok(DeviceBuffer::new(alloc, len))
    }

    /// The raw device address (`CUdeviceptr`), for passing to other CUDA code; the same as
    /// [`device_ptr`](Self::device_ptr). Work issued with it behind this crate's back is not
    /// tracked: keep this buffer (or a clone) alive for as long as that work may run.
    ///
    /// ```no_run
    /// # fn f(buf: &cuda_graph::DeviceBuffer<f32>) {
    /// let raw: cudarc::driver::sys::CUdeviceptr = buf.as_raw();
    /// # }
    /// ```
    pub fn as_raw(&self) -> cudarc::driver::sys::CUdeviceptr {
        self.alloc.ptr
    }

    /// Whether the memory is someone else's (made by [`from_raw`](Self::from_raw) or a cudarc
    /// adapter): it is then never freed by this crate.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// assert!(!buf.is_borrowed()); // allocated by this crate
    /// # Ok(()) }
    /// ```
    pub fn is_borrowed(&self) -> bool {
        self.alloc.is_borrowed()
    }

    /// Elements `range` of this buffer as a buffer of its own (a view): the same device memory,
    /// not a copy, at an offset. It works wherever a buffer does — kernel arguments, memsets and
    /// copies on streams, in captures and as definition nodes, `to_vec`, `copy_from` — and keeps
    /// the whole allocation alive for as long as it (or a graph using it) lives. A part of a
    /// stream-ordered buffer ([`Stream::alloc_async`](crate::Stream::alloc_async)) stays on that
    /// buffer's stream, as the buffer does.
    ///
    /// An empty or out-of-range `range` is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, stream: &Stream) -> cuda_graph::Result<()> {
    /// let buf = device.alloc_zeroed::<i32>(1024)?;
    /// let second_half = buf.slice(512..)?;
    /// stream.memset_d32(&second_half, 7)?; // elements 512..1024 become 7
    /// assert_eq!(second_half.len(), 512);
    /// assert_eq!(second_half.device_ptr(), buf.device_ptr() + 512 * 4);
    /// # Ok(()) }
    /// ```
    pub fn slice(&self, range: impl std::ops::RangeBounds<usize>) -> Result<DeviceBuffer<T>> {
        let (start, end) = bounds(&range, self.len)?;
        let size = std::mem::size_of::<T>();
        let part = start
            .checked_mul(size)
            .zip((end - start).checked_mul(size))
            .and_then(|(offset, bytes)| DeviceAlloc::part(&self.alloc, offset, bytes))
            .ok_or_else(|| {
                Error::invalid(
                    Refusal::Size,
                    "the slice does not fit the buffer's allocation",
                )
            })?;
        Ok(DeviceBuffer::new(part, end - start))
    }

    pub(crate) fn new(alloc: Arc<DeviceAlloc>, len: usize) -> Self {
        DeviceBuffer {
            alloc,
            len,
            _t: PhantomData,
        }
    }

    /// The number of elements.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let buf = device.alloc_zeroed::<f32>(256)?;
    /// assert_eq!(buf.len(), 256);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: zero-length buffers cannot be allocated.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// assert!(!buf.is_empty()); // zero-length buffers cannot be made
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let buf = device.alloc_zeroed::<f32>(256)?;
    /// assert_eq!(buf.byte_len(), 1024);
    /// # Ok(()) }
    /// ```
    pub fn byte_len(&self) -> usize {
        self.alloc.bytes
    }

    /// The raw device address (`CUdeviceptr`), for passing to other CUDA code.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// println!("at {:#x}", buf.device_ptr()); // a CUdeviceptr
    /// # Ok(()) }
    /// ```
    pub fn device_ptr(&self) -> u64 {
        self.alloc.ptr
    }

    /// The device the buffer lives on.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// let stream = buf.device().create_stream()?;
    /// # let _ = stream;
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        Device::from_ctx(&self.alloc.ctx)
    }

    /// Copies the buffer back to the host.
    ///
    /// What it waits for: the copy only. It runs on a private stream of the context (never
    /// captured, so this works while other streams capture) and waits for that stream — not for
    /// work queued on your streams: synchronize the stream (or wait for an event) whose results
    /// you want to read first. A buffer from [`Stream::alloc_async`](crate::Stream::alloc_async)
    /// is copied after its allocation.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// stream.memset_d32(buf, 7)?;
    /// stream.synchronize()?; // the memset's results, then the copy
    /// assert!(buf.to_vec()?.iter().all(|&v| v == 7));
    /// # Ok(()) }
    /// ```
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = Vec::<T>::with_capacity(self.len);
        // SAFETY: `out` has room for `len` elements = `bytes` bytes.
        if let Err(e) =
            unsafe { driver::memory::dtoh_on_setup(&self.alloc, out.as_mut_ptr().cast()) }
        {
            // The copy may still write into `out`: never free it.
            std::mem::forget(out);
            return Err(e);
        }
        // SAFETY: the driver wrote all `len` elements (the copy finished), and any bit pattern
        // is a valid `T` (`DeviceCopy`).
        unsafe { out.set_len(self.len) };
        Ok(out)
    }

    /// Overwrites the buffer with `data`. The lengths must match.
    ///
    /// What it waits for: the copy only, on a private stream of the context (never captured, so
    /// this works while other streams capture); when it returns, the new contents are there for
    /// work queued afterwards on any stream. It does not wait for work already queued on your
    /// streams that uses the buffer: synchronize them first.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// buf.copy_from(&vec![1; buf.len()])?;
    /// # Ok(()) }
    /// ```
    pub fn copy_from(&self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::invalid(
                Refusal::Size,
                format!(
                    "copy of {} elements into a buffer of {}",
                    data.len(),
                    self.len
                ),
            ));
        }
        // SAFETY: `data` holds exactly `bytes` readable bytes, borrowed for the whole call.
        unsafe { driver::memory::htod_on_setup(&self.alloc, data.as_ptr().cast()) }
    }

    /// An observer that tells when the allocation is freed (after this handle and every graph
    /// and exec using it are dropped), without keeping it alive.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(buf: DeviceBuffer<i32>) {
    /// let watch = buf.release_observer();
    /// drop(buf);
    /// assert!(watch.is_released());
    /// # }
    /// ```
    pub fn release_observer(&self) -> super::ReleaseObserver {
        super::ReleaseObserver::new(&self.alloc)
    }

    /// How many handles (this one, graphs, execs) share the allocation. For tests and diagnostics.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// println!("{} holders of the allocation", buf.share_count());
    /// # Ok(()) }
    /// ```
    pub fn share_count(&self) -> usize {
        Arc::strong_count(&self.alloc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_ranges_are_checked() {
        use std::ops::Bound;
        assert_eq!(bounds(&(..), 8).unwrap(), (0, 8));
        assert_eq!(bounds(&(2..6), 8).unwrap(), (2, 6));
        assert_eq!(bounds(&(..=1), 8).unwrap(), (0, 2));
        assert_eq!(bounds(&(6..), 8).unwrap(), (6, 8));
        for bad in [3..3, 2..9, 8..9] {
            assert!(bounds(&bad, 8).is_err(), "{bad:?}");
        }
        assert!(bounds(&(..=usize::MAX), 8).is_err());
        assert!(bounds(&(Bound::Excluded(usize::MAX), Bound::Unbounded), 8).is_err());
    }

    #[test]
    fn raw_buffers_are_checked_before_wrapping() {
        assert_eq!(raw_byte_len::<f32>(0x1000, 256).unwrap(), 1024);
        assert_eq!(raw_byte_len::<u8>(0x1001, 3).unwrap(), 3);
        let refused = |r: Result<usize>, what: &str| match r {
            Err(Error::InvalidArgument(m)) if m.kind() == Refusal::Size => {
                assert!(m.contains(what), "{m}")
            }
            other => panic!("expected a refusal mentioning {what:?}, got {other:?}"),
        };
        refused(raw_byte_len::<f32>(0x1000, 0), "0 elements");
        refused(raw_byte_len::<f32>(0, 4), "null");
        refused(raw_byte_len::<f32>(0x1002, 4), "not aligned");
        refused(raw_byte_len::<u64>(0x1004, 1), "not aligned");
        refused(raw_byte_len::<u64>(u64::MAX - 15, 4), "overflow");
        refused(raw_byte_len::<u32>(0x1000, usize::MAX / 2), "overflow");
        refused(raw_byte_len::<()>(0x1000, 1), "zero-sized");
    }
}
