//! Stream-ordered allocation, copies and memsets on a stream or into its capture.

use super::*;

impl Stream {
    /// Allocates `len` zeroed elements of `T` ordered on this stream (`cuMemAllocAsync`, then a
    /// memset on this stream), without waiting.
    ///
    /// The buffer is a [`DeviceBuffer`] like any other: work queued later on this stream may use
    /// it at once; this crate's copies and memsets on other streams, and
    /// [`to_vec`](DeviceBuffer::to_vec) / [`copy_from`](DeviceBuffer::copy_from), wait for the
    /// allocation first. Its memory is freed **in this stream's order** when the last owner lets
    /// go (`cuMemFreeAsync` after the work queued on this stream by then; should the stream be
    /// capturing at that moment, a helper thread frees it once the capture is over and the
    /// stream idle): work on other streams that uses it must be ordered before that drop (wait
    /// for it), as with CUDA's stream-ordered allocator. Graphs that use it hold it, and an
    /// exec's first launch (on whatever stream) waits for the allocation and its zeroing.
    ///
    /// Refused while the stream captures (the memory would exist only while the graph runs):
    /// use the builder's [`alloc_async`](crate::GraphBuilder::alloc_async), which returns a
    /// [`GraphAllocation`](crate::GraphAllocation). A zero length or a size that overflows
    /// `usize` is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream) -> cuda_graph::Result<()> {
    /// let tmp = stream.alloc_async::<f32>(1 << 20)?;
    /// stream.memset_d32(&tmp, 1.0f32.to_bits())?;
    /// stream.free_async(tmp)?;
    /// # Ok(()) }
    /// ```
    pub fn alloc_async<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = crate::runtime::pinned::device_byte_size::<T>(len)?;
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Capture,
                    "Stream::alloc_async on a capturing stream: the memory would exist only while the graph runs; use the builder's alloc_async (a GraphAllocation) instead",
                ));
            }
            Ok(DeviceBuffer::new(
                DeviceAlloc::zeroed_async(&self.handle, bytes)?,
                len,
            ))
        })
    }

    /// Lets go of `buf`, freeing it after the work queued on this stream so far (and, for a
    /// stream-ordered buffer, after the work on its own stream): use it when the last user of a
    /// buffer from [`alloc_async`](Self::alloc_async) of another stream was this stream. Graphs
    /// that still use the buffer keep it until they are done.
    ///
    /// For a buffer ordered on this stream, or one from
    /// [`Device::alloc_zeroed`](crate::Device::alloc_zeroed), it is the same as dropping it.
    /// Refused while the stream captures (record a [`GraphAllocation`](crate::GraphAllocation)
    /// free with the builder's [`free_async`](crate::GraphBuilder::free_async)); the buffer is
    /// then dropped as usual.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(a: &Stream, b: &Stream) -> cuda_graph::Result<()> {
    /// let tmp = a.alloc_async::<u8>(4096)?;
    /// b.memset_d8(&tmp, 1)?; // waits for the allocation on `a`
    /// b.free_async(tmp)?; // freed after the memset on `b`
    /// # Ok(()) }
    /// ```
    pub fn free_async<T: DeviceCopy>(&self, buf: DeviceBuffer<T>) -> Result<()> {
        self.same_context(&buf)?;
        let Some(ordered) = &buf.alloc.ordered else {
            return Ok(());
        };
        if ordered.stream.raw == self.raw() {
            return Ok(());
        }
        let own = ordered.stream.clone();
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Capture,
                    "Stream::free_async on a capturing stream: a DeviceBuffer is not graph memory; free a GraphAllocation with the builder's free_async",
                ));
            }
            // Make the buffer's own stream wait for this one, if it can without blocking or
            // joining a capture; otherwise wait for this stream here.
            let event = EventHandle::pooled(&self.handle.ctx)?;
            if let Some(slot) = own.try_slot() {
                if slot.is_none() && own.is_idle_of_captures() {
                    // SAFETY: both streams and the event are live handles of the current
                    // context; the buffer's stream does not capture (checked under its slot).
                    let ordered = unsafe {
                        driver::stream::record_event(event.raw, self.raw())
                            .and_then(|()| driver::stream::wait_event(own.raw, event.raw, 0))
                    };
                    if ordered.is_ok() {
                        return Ok(());
                    }
                }
            }
            driver::stream::synchronize(&self.handle)
        })?;
        drop(buf);
        Ok(())
    }

    /// Copies `src` (page-locked host memory) into `dst`, ordered on this stream, without
    /// waiting. The lengths must match. `src` remembers the copy: writing it from the host
    /// ([`PinnedBuffer::as_mut_slice`]) waits until the copy has read it.
    ///
    /// Refused while the stream captures (a graph would read the host memory at every launch,
    /// which the buffer cannot track): copy before launching, or capture device-to-device
    /// copies.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream, host: &PinnedBuffer<f32>, dev: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// stream.memcpy_htod_async(dev, host)?;
    /// # Ok(()) }
    /// ```
    pub fn memcpy_htod_async<T: DeviceCopy>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &PinnedBuffer<T>,
    ) -> Result<()> {
        self.same_context(dst)?;
        check_lens("memcpy_htod_async", src.len(), dst.len())?;
        let event = EventHandle::pooled(&self.handle.ctx)?;
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(pinned_in_capture("memcpy_htod_async"));
            }
            self.after_allocation(rec, dst)?;
            // SAFETY: `src` holds `byte_len` bytes of pinned memory that it keeps until this copy
            // has run (tracked below; its host access and `Drop` wait); `dst` as many, kept alive
            // by the caller's borrow and its own drop order; the stream does not capture.
            unsafe {
                driver::stream::memcpy_htod_async(
                    dst.device_ptr(),
                    src.ptr().cast_const(),
                    dst.byte_len(),
                    self.raw(),
                )
            }?;
            src.track(&self.handle, self.mark(event));
            self.hold_borrowed(rec, [crate::runtime::OwnerRef::Alloc(&dst.alloc)])
        })
    }

    /// Copies `src` into `dst` (page-locked host memory), ordered on this stream, without
    /// waiting. The lengths must match. `dst` remembers the copy: reading it
    /// ([`PinnedBuffer::as_slice`]) waits until the copy has written it.
    ///
    /// Refused while the stream captures, as [`memcpy_htod_async`](Self::memcpy_htod_async).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream, dev: &DeviceBuffer<f32>, host: &mut PinnedBuffer<f32>) -> cuda_graph::Result<()> {
    /// stream.memcpy_dtoh_async(host, dev)?;
    /// let first = host.as_slice()?[0];
    /// # Ok(()) }
    /// ```
    pub fn memcpy_dtoh_async<T: DeviceCopy>(
        &self,
        dst: &mut PinnedBuffer<T>,
        src: &DeviceBuffer<T>,
    ) -> Result<()> {
        self.same_context(src)?;
        check_lens("memcpy_dtoh_async", src.len(), dst.len())?;
        let event = EventHandle::pooled(&self.handle.ctx)?;
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(pinned_in_capture("memcpy_dtoh_async"));
            }
            // Device memory the copy reads lives until it has run, as for any non-captured work.
            self.after_allocation(rec, src)?;
            // SAFETY: `dst` holds `byte_len` bytes of pinned memory that nothing else reads or
            // writes until this copy has run: it is borrowed mutably here, and its host access
            // and `Drop` wait for the copy (tracked below); the stream does not capture.
            unsafe {
                driver::stream::memcpy_dtoh_async(
                    dst.ptr(),
                    src.device_ptr(),
                    src.byte_len(),
                    self.raw(),
                )
            }?;
            dst.track(&self.handle, self.mark(event));
            self.hold_borrowed(rec, [crate::runtime::OwnerRef::Alloc(&src.alloc)])
        })
    }

    /// Records `event` after the work queued so far (the stream does not capture). If that
    /// fails, waits for the stream instead; if that fails too, the error (the work is untracked).
    fn mark(&self, event: Arc<EventHandle>) -> Result<Arc<EventHandle>> {
        // SAFETY: both handles are live and of this (current) context.
        match unsafe { driver::stream::record_event(event.raw, self.raw()) } {
            Ok(()) => Ok(event),
            Err(_) => {
                driver::stream::synchronize(&self.handle)?;
                // The work is done: an unrecorded event is complete.
                Ok(event)
            }
        }
    }

    fn same_context<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>) -> Result<()> {
        if !Arc::ptr_eq(&buf.alloc.ctx, &self.handle.ctx)
            && buf.alloc.ctx.device != self.handle.ctx.device
        {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                "the buffer lives on another device than the stream",
            ));
        }
        Ok(())
    }

    /// Sets every byte of `buf` to `value` (asynchronous; capturable).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, buf: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// stream.memset_d8(buf, 0)?;
    /// # Ok(()) }
    /// ```
    pub fn memset_d8<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, value: u8) -> Result<()> {
        self.same_context(buf)?;
        self.enqueue(|rec| {
            rec.keep(&buf.alloc);
            self.after_allocation(rec, buf)?;
            // SAFETY: `buf` holds `byte_len` bytes; the allocation is kept alive by the caller's
            // handle or, in a capture, by the graph.
            unsafe {
                driver::stream::memset_d8_async(buf.device_ptr(), value, buf.byte_len(), self.raw())
            }?;
            self.hold_borrowed(rec, [crate::runtime::OwnerRef::Alloc(&buf.alloc)])
        })
    }

    /// Sets every 32-bit word of `buf` to `value` (asynchronous; capturable). The buffer's byte
    /// length must be a multiple of 4.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// stream.memset_d32(buf, 1.0f32.to_bits())?; // every element 1.0
    /// # Ok(()) }
    /// ```
    pub fn memset_d32<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, value: u32) -> Result<()> {
        self.same_context(buf)?;
        if !buf.byte_len().is_multiple_of(4) {
            return Err(Error::invalid(
                Refusal::Size,
                format!(
                    "memset_d32 of a {}-byte buffer: the size must be a multiple of 4",
                    buf.byte_len()
                ),
            ));
        }
        self.enqueue(|rec| {
            rec.keep(&buf.alloc);
            self.after_allocation(rec, buf)?;
            // SAFETY: `buf` holds `byte_len / 4` words.
            unsafe {
                driver::stream::memset_d32_async(
                    buf.device_ptr(),
                    value,
                    buf.byte_len() / 4,
                    self.raw(),
                )
            }?;
            self.hold_borrowed(rec, [crate::runtime::OwnerRef::Alloc(&buf.alloc)])
        })
    }

    /// Copies `src` into `dst` (asynchronous; capturable). The lengths must match.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, dst: &DeviceBuffer<i32>, src: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// stream.memcpy_dtod(dst, src)?; // same length
    /// # Ok(()) }
    /// ```
    pub fn memcpy_dtod<T: DeviceCopy>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
    ) -> Result<()> {
        self.same_context(dst)?;
        self.same_context(src)?;
        if dst.len() != src.len() {
            return Err(Error::invalid(
                Refusal::Size,
                format!("memcpy_dtod from {} elements into {}", src.len(), dst.len()),
            ));
        }
        self.enqueue(|rec| {
            rec.keep(&dst.alloc);
            rec.keep(&src.alloc);
            self.after_allocation(rec, dst)?;
            self.after_allocation(rec, src)?;
            // SAFETY: both buffers hold `byte_len` bytes.
            unsafe {
                driver::stream::memcpy_dtod_async(
                    dst.device_ptr(),
                    src.device_ptr(),
                    dst.byte_len(),
                    self.raw(),
                )
            }?;
            self.hold_borrowed(
                rec,
                [
                    crate::runtime::OwnerRef::Alloc(&dst.alloc),
                    crate::runtime::OwnerRef::Alloc(&src.alloc),
                ],
            )
        })
    }

    /// Copies host `data` into `dst`, ordered on this stream. The host slice is read before the
    /// call returns. Refused while the stream is capturing: a captured copy would keep reading
    /// `data` at every launch, long after the borrow ended.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, dst: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// stream.memcpy_htod(dst, &[1, 2, 3, 4])?; // dst.len() == 4
    /// # Ok(()) }
    /// ```
    pub fn memcpy_htod<T: DeviceCopy>(&self, dst: &DeviceBuffer<T>, data: &[T]) -> Result<()> {
        self.same_context(dst)?;
        if data.len() != dst.len() {
            return Err(Error::invalid(
                Refusal::Size,
                format!(
                    "memcpy_htod of {} elements into a buffer of {}",
                    data.len(),
                    dst.len()
                ),
            ));
        }
        self.enqueue(|rec| {
            if rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Capture,
                    "memcpy_htod cannot be captured (the graph would read host memory it does not own); copy before capturing, or capture a device-to-device copy",
                ));
            }
            self.after_allocation(rec, dst)?;
            // SAFETY: `data` holds `byte_len` bytes and is read before the synchronize below
            // returns; `dst` is kept alive by the caller's borrow.
            unsafe {
                driver::stream::memcpy_htod_async(
                    dst.device_ptr(),
                    data.as_ptr().cast(),
                    dst.byte_len(),
                    self.raw(),
                )
            }?;
            // Synchronise so the copy is complete when we return and `data` may be freed.
            // The stream is not capturing (checked above, under the slot).
            driver::stream::synchronize(&self.handle)
        })
    }
}

fn check_lens(what: &str, src: usize, dst: usize) -> Result<()> {
    if src != dst {
        return Err(Error::invalid(
            Refusal::Size,
            format!("{what} from {src} elements into {dst}"),
        ));
    }
    Ok(())
}

fn pinned_in_capture(what: &str) -> Error {
    Error::invalid(Refusal::Capture, format!(
        "{what} cannot be captured: a graph launch would use the pinned host memory at times the buffer cannot track; copy outside the capture (before or after launching the graph), or capture device-to-device copies"
    ))
}
