//! Adapters for cudarc's safe types (feature `cudarc`, off by default).
//!
//! | cudarc | here | what is held |
//! | --- | --- | --- |
//! | `Arc<CudaContext>` | [`Device::from_cudarc`] | nothing (the same primary context) |
//! | `Arc<CudaStream>` | [`Stream::from_cudarc`]: capture builders, launches, memsets, copies | the `Arc<CudaStream>`, by the `Stream`, its clones and every capture on it |
//! | `Arc<CudaSlice<T>>` | [`DeviceBuffer::from_cudarc`] / [`from_cudarc_range`](DeviceBuffer::from_cudarc_range): kernel arguments, memset and memcpy operands, captured, in definitions or on plain streams | the `Arc<CudaSlice<T>>`, by the buffer, its clones and every graph and exec using it |
//! | `CudaFunction` | [`Function::from_cudarc`] (`unsafe`: its context cannot be checked) | a clone of the `CudaFunction` (it keeps its module loaded) |
//! | `DriverError` | `From<cudarc::driver::DriverError> for Error` | |
//!
//! **Contexts.** This crate works in each device's primary context. cudarc's
//! `CudaContext::new(ordinal)` retains that same context, so its streams, slices and kernels can
//! be used here; a context of another device, or a non-primary one (`new_non_primary`,
//! `from_raw_context`), is refused with [`Error::InvalidArgument`].
//!
//! **Slices, not views.** A graph replays long after the call that recorded it, so it must own
//! what it uses. A `CudaSlice` is owned, so it is taken shared through an `Arc` and held. A
//! `CudaView` / `CudaViewMut` borrows its slice for a lifetime the graph cannot extend, so views
//! are not accepted: take a range of the `Arc`-shared slice instead
//! ([`from_cudarc_range`](DeviceBuffer::from_cudarc_range)), or, for memory you keep alive by
//! other means, the `unsafe` [`DeviceBuffer::from_raw`].
//!
//! **cudarc's event tracking.** Once a cudarc context has more than one stream (`new_stream`),
//! each `CudaSlice` records a read and a write event after every use through cudarc's API and
//! makes the next user's stream wait on them (`cuStreamWaitEvent`). Inside a capture that breaks
//! things: waiting on an event recorded outside the capture invalidates it, and an event
//! recorded inside it is one cudarc later waits on from outside, which fails. So:
//!
//! - Work issued through this crate (a [`Stream`] from [`Stream::from_cudarc`], buffers from
//!   [`DeviceBuffer::from_cudarc`]) never touches cudarc's events, except once, when a slice is
//!   converted: its device pointer is read on the slice's own stream, and the conversion is
//!   refused while that stream is capturing. Convert slices before capturing.
//! - To capture work issued through cudarc's own API (its `launch_builder`, `memcpy_*`, cuBLAS's
//!   safe `CudaBlas`), call `unsafe { ctx.disable_event_tracking() }` (cudarc 0.19) **before**
//!   allocating the slices involved: it only affects slices created after it. The ordering
//!   between streams is then yours, as cudarc's safety contract for it says.
//! - Graph replays are invisible to cudarc: order later cudarc work after a replay yourself
//!   (synchronise the launch stream, or make the other stream wait on an event recorded there).
//!
//! **When a held slice is dropped.** If an exec is the last holder, the slice is dropped after the
//! exec's last launch has finished — when the exec is dropped, on that thread, if its launches
//! have already ended, else on this crate's release thread — in `Relaxed` capture interaction
//! mode either way (so the free does not invalidate a `Global` capture of another thread), and
//! cudarc frees it on the
//! slice's own stream (`cuMemFreeAsync` where the device has memory pools). If that stream is
//! capturing at that moment, the free goes wrong (cudarc stores the error in its context:
//! `check_err`). Allocate on one stream and capture on another, as in the example below.
//!
//! **Other captures.** Work issued through this crate on a cudarc stream that a capture begun
//! with cudarc (`CudaStream::begin_capture`) records on is refused with an error, because the
//! crate could not keep its operands alive; the driver is asked before each operation on such a
//! stream. Do not begin a cudarc capture on a stream from another thread while this crate issues
//! work on it: the check cannot see a capture that begins during the operation.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use cuda_graph::prelude::*;
//! use cudarc::driver::CudaContext;
//!
//! fn main() -> cuda_graph::Result<()> {
//!     let ctx = CudaContext::new(0)?; // cudarc's errors convert into this crate's
//!     let alloc_stream = ctx.new_stream()?;
//!     let data = Arc::new(alloc_stream.alloc_zeros::<u32>(1024)?);
//!     alloc_stream.synchronize()?;
//!
//!     let device = Device::from_cudarc(&ctx)?; // the same primary context
//!     let buf = DeviceBuffer::from_cudarc(&device, data.clone())?;
//!     // SAFETY: no capture is begun on this stream through cudarc while the crate uses it.
//!     let stream = unsafe { Stream::from_cudarc(&device, &ctx.new_stream()?)? };
//!     let builder = stream.create_graph_builder().begin_building(ThreadLocal)?;
//!     builder.memset_d32(&buf, 7)?;
//!     let graph = builder.end_building()?.instantiate()?;
//!     drop((buf, data)); // the graph holds the slice
//!     graph.launch(&stream)?;
//!     stream.synchronize()?;
//!     Ok(())
//! }
//! ```

use std::ops::RangeBounds;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};

use crate::driver;
use crate::driver::stream::CaptureStatus;
use crate::runtime::bounds;
use crate::{Device, DeviceBuffer, DeviceCopy, Error, Function, Result, Stream};

impl From<cudarc::driver::DriverError> for Error {
    /// A failed cudarc call as [`Error::Driver`], with the driver's name and description of the
    /// result (the call is reported as `cudarc`).
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Driver(driver::foreign_error(e.0, "cudarc"))
    }
}

/// Refuses a cudarc context that is not `device`'s primary context.
fn same_context(device: &Device, ctx: &CudaContext, what: &str) -> Result<()> {
    if ctx.cu_ctx() == device.ctx.raw {
        return Ok(());
    }
    let kind = if ctx.is_primary() {
        "the primary context"
    } else {
        "a non-primary context"
    };
    Err(Error::invalid(
        crate::error::Refusal::OtherDevice,
        format!(
            "the cudarc {what} belongs to {kind} of device {}, not to the primary context of device {} \
             that this crate uses (make it with `CudaContext::new({})`)",
            ctx.ordinal(),
            device.ordinal(),
            device.ordinal()
        ),
    ))
}

impl Device {
    /// The device of a cudarc context made by `CudaContext::new(ordinal)`: this crate uses the
    /// same primary context. A non-primary context is refused with [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # fn main() -> cuda_graph::Result<()> {
    /// let ctx = cudarc::driver::CudaContext::new(0)?;
    /// let device = cuda_graph::Device::from_cudarc(&ctx)?;
    /// # Ok(()) }
    /// ```
    pub fn from_cudarc(ctx: &Arc<CudaContext>) -> Result<Device> {
        let device = Device::new(ctx.ordinal())?;
        same_context(&device, ctx, "context")?;
        Ok(device)
    }
}

impl Stream {
    /// A cudarc stream, for capturing graphs on it and issuing work on it. The `Arc<CudaStream>`
    /// is held by the returned `Stream`, its clones and every capture on it; the crate never
    /// destroys the stream. A stream of another device or context is refused with
    /// [`Error::InvalidArgument`].
    ///
    /// Work issued through this crate while a capture begun with cudarc records on the stream is
    /// refused (see the [module documentation](self) for that and for cudarc's event
    /// tracking). cudarc's per-thread default stream (`per_thread_stream()`) is an
    /// [`Error::InvalidArgument`]: its handle names a different stream on each thread.
    ///
    /// # Safety
    /// No capture is begun on this stream outside this crate (`CudaStream::begin_capture`, raw
    /// calls) while this crate issues work on it from another thread: the crate checks for such a
    /// capture before each operation, but one begun between that check and the operation would
    /// record the operation without this crate keeping its operands alive for the graph.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn main() -> cuda_graph::Result<()> {
    /// let ctx = cudarc::driver::CudaContext::new(0)?;
    /// let device = Device::from_cudarc(&ctx)?;
    /// // SAFETY: no capture is begun on this stream through cudarc while the crate uses it.
    /// let stream = unsafe { Stream::from_cudarc(&device, &ctx.new_stream()?)? };
    /// let builder = stream.create_graph_builder().begin_building(ThreadLocal)?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn from_cudarc(device: &Device, stream: &Arc<CudaStream>) -> Result<Stream> {
        same_context(device, stream.context(), "stream")?;
        if stream.cu_stream() as usize == 2 {
            return Err(Error::invalid(
                crate::error::Refusal::Unsupported,
                "cudarc's per-thread default stream names a different stream on each thread, and a `Stream` is used from other threads (its clones, builders, graphs launched on it): use a stream of its own (`ctx.new_stream()`) or the legacy default stream",
            ));
        }
        // SAFETY: `cu_stream` is a stream of the cudarc context, which is `device`'s primary
        // context (checked above); the `CudaStream` held as the owner keeps it alive (cudarc
        // destroys the streams it made only when the last `Arc` goes, and a borrowed one is
        // kept alive under `wrap_borrowed_stream`'s contract). Work issued while a foreign
        // capture records on it is refused by `Stream::enqueue`.
        Ok(unsafe { Stream::from_raw(device, stream.cu_stream(), stream.clone()) })
    }
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// A cudarc slice as a buffer: a kernel argument and a memset or memcpy operand wherever a
    /// `DeviceBuffer` is. The `Arc<CudaSlice<T>>` is held by the buffer, its clones and every
    /// graph and exec that uses it, and dropped after the last of them. A slice of another device
    /// or context, or an empty one, is refused with [`Error::InvalidArgument`]; so is a slice of
    /// cudarc's per-thread default stream (`per_thread_stream()`: its handle names the calling
    /// thread's stream, so the conversion could not wait for the slice's allocation made on
    /// another thread), and converting while the slice's own stream captures (see the
    /// [module documentation](crate::interop::cudarc)). The conversion waits for the work
    /// queued on the slice's stream so far: cudarc allocates and zeroes a slice there with
    /// stream-ordered calls, and this crate's streams and graphs are not ordered after them.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn main() -> cuda_graph::Result<()> {
    /// let ctx = cudarc::driver::CudaContext::new(0)?;
    /// let slice = std::sync::Arc::new(ctx.default_stream().alloc_zeros::<f32>(256)?);
    /// let device = Device::from_cudarc(&ctx)?;
    /// let buf = DeviceBuffer::from_cudarc(&device, slice)?;
    /// assert_eq!(buf.len(), 256);
    /// # Ok(()) }
    /// ```
    pub fn from_cudarc(device: &Device, slice: Arc<CudaSlice<T>>) -> Result<DeviceBuffer<T>> {
        Self::from_cudarc_range(device, slice, ..)
    }

    /// Elements `range` of a cudarc slice as a buffer, holding the whole slice (what a
    /// `CudaView` of it would be, but owned; see [`from_cudarc`](Self::from_cudarc)). A range
    /// out of bounds or empty is refused with [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, slice: std::sync::Arc<cudarc::driver::CudaSlice<f32>>) -> cuda_graph::Result<()> {
    /// let second_half = DeviceBuffer::from_cudarc_range(device, slice.clone(), slice.len() / 2..)?;
    /// # Ok(()) }
    /// ```
    pub fn from_cudarc_range(
        device: &Device,
        slice: Arc<CudaSlice<T>>,
        range: impl RangeBounds<usize>,
    ) -> Result<DeviceBuffer<T>> {
        same_context(device, slice.context(), "slice")?;
        let (start, end) = bounds(&range, slice.len())?;
        let base = base_ptr(device, &slice)?;
        let offset = (start as u64)
            .checked_mul(std::mem::size_of::<T>() as u64)
            .and_then(|o| base.checked_add(o))
            .ok_or_else(|| {
                Error::invalid(
                    crate::error::Refusal::Size,
                    "the range overflows the address space",
                )
            })?;
        // SAFETY: elements `start..end` of the slice lie in its allocation, in `device`'s primary
        // context (checked above); the slice, held as the owner, keeps it allocated until the
        // owner is dropped (cudarc frees a slice only in its `Drop`).
        unsafe { DeviceBuffer::from_raw(device, offset, end - start, slice) }
    }
}

/// The slice's device address, read through cudarc's `DevicePtr` on the slice's own stream,
/// once the work queued on that stream so far has run. cudarc allocates and zeroes a slice with
/// stream-ordered calls on its stream (`cuMemAllocAsync`, a memset), so the memory is the
/// slice's only once they have run; this crate's streams and graphs are not ordered after them,
/// so the conversion waits for them (`cuStreamSynchronize` of the slice's stream). Refused while
/// that stream captures: the wait would invalidate the capture, and with event tracking on so
/// would cudarc's own event waits there.
fn base_ptr<T>(device: &Device, slice: &CudaSlice<T>) -> Result<u64> {
    let stream = slice.stream();
    if stream.cu_stream() as usize == 2 {
        // `CU_STREAM_PER_THREAD`: the wait below would wait for this thread's stream, not for
        // the one of the thread that allocated the slice.
        return Err(Error::invalid(
            crate::error::Refusal::Unsupported,
            "the cudarc slice was allocated on the per-thread default stream, which names a different stream on each thread, so the allocation cannot be waited for here: allocate it on a stream of its own (`ctx.new_stream()`) or the legacy default stream",
        ));
    }
    device.ctx.bind()?;
    // SAFETY: the slice holds its stream alive, and the stream is of the slice's context,
    // `device`'s primary context (checked by the caller), now current.
    let status = unsafe { driver::stream::capture_status_of(stream.cu_stream()) }?;
    if status != CaptureStatus::None {
        return Err(Error::invalid(
            crate::error::Refusal::Capture,
            "the cudarc slice's own stream is capturing: convert the slice before the capture begins, or allocate it on another stream",
        ));
    }
    let (ptr, _recorded_on_drop) = slice.device_ptr(stream);
    // SAFETY: as above. The stream was not capturing just now; should another thread begin a
    // cudarc capture on it in between, the wait fails (and invalidates that capture) with an
    // error, which is returned.
    unsafe { driver::stream::synchronize_raw(stream.cu_stream()) }?;
    Ok(ptr)
}

impl Function {
    /// A cudarc kernel, for launching on streams, into captures and into definitions. A clone of
    /// the `CudaFunction` (which keeps its module loaded) is held by the returned `Function`, its
    /// clones and every graph and exec that launches it.
    ///
    /// # Safety
    /// `function` was loaded in `device`'s primary context (a module of
    /// `CudaContext::new(device.ordinal())`). cudarc does not tell which context a
    /// `CudaFunction` belongs to, so this cannot be checked. (Launching stays `unsafe`: the
    /// arguments are the caller's promise.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, k: &cudarc::driver::CudaFunction) {
    /// // SAFETY: `k` comes from a module loaded by `CudaContext::new(0)`, and `device` is device 0.
    /// let k = unsafe { Function::from_cudarc(device, k, "my_kernel") };
    /// # }
    /// ```
    pub unsafe fn from_cudarc(device: &Device, function: &CudaFunction, name: &str) -> Function {
        // SAFETY: the caller's promise above; the cloned `CudaFunction` holds its module's
        // `Arc`, so the kernel stays loaded until the owner is dropped.
        unsafe { Function::from_raw(device, function.cu_function(), name, function.clone()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;
    use std::ops::Bound;

    /// The README's "With cudarc" example is this module's doctest, line for line (README code
    /// is not compiled by itself: this keeps it compiling).
    #[test]
    fn readme_cudarc_example_is_the_module_doctest() {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("```rust,no_run\nuse std::sync::Arc;")
            .expect("README: the cudarc example block");
        let body = &readme[start + "```rust,no_run\n".len()..];
        let block = &body[..body.find("```").expect("README: the block's end")];
        let doc: String = include_str!("cudarc.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .fold(String::new(), |acc, l| acc + l + "\n");
        assert!(block.contains("Stream::from_cudarc"), "{block}");
        assert!(
            doc.contains(block),
            "README's cudarc example differs from the doctest of src/interop/cudarc.rs:\n{block}"
        );
    }

    #[test]
    fn cudarc_errors_convert_with_their_code_and_name() {
        let e: Error = cudarc::driver::DriverError(CUresult::CUDA_ERROR_INVALID_VALUE).into();
        match e {
            Error::Driver(d) => {
                assert_eq!(d.code(), CUresult::CUDA_ERROR_INVALID_VALUE as u32);
                assert_eq!(d.name(), "CUDA_ERROR_INVALID_VALUE");
                assert_eq!(d.call(), "cudarc");
                assert_eq!(d.result(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
            }
            other => panic!("expected Error::Driver, got {other:?}"),
        }
    }

    #[test]
    fn ranges_are_checked() {
        assert_eq!(bounds(&(..), 10).unwrap(), (0, 10));
        assert_eq!(bounds(&(2..5), 10).unwrap(), (2, 5));
        assert_eq!(bounds(&(2..=9), 10).unwrap(), (2, 10));
        assert_eq!(bounds(&(7..), 10).unwrap(), (7, 10));
        for bad in [bounds(&(5..5), 10), bounds(&(0..11), 10), bounds(&(..), 0)] {
            assert!(
                matches!(&bad, Err(e) if e.refusal() == Some(crate::Refusal::Size)),
                "{bad:?}"
            );
        }
        assert!(bounds(&(3..=usize::MAX), 10).is_err());
        let excluded_start = (Bound::Excluded(usize::MAX), Bound::Unbounded);
        assert!(bounds(&excluded_start, 10).is_err());
    }
}
