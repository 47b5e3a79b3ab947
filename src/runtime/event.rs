use std::sync::Arc;

use cudarc::driver::sys;

use crate::driver;
use crate::driver::event::EventHandle;
use crate::driver::event::{BLOCKING_SYNC, DISABLE_TIMING};
use crate::error::{Error, Refusal, Result};

/// How an event is made ([`Device::create_event_with`](crate::Device::create_event_with)):
/// timing off and spinning waits by default, as [`Device::create_event`](crate::Device::create_event).
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::EventOptions;
/// # fn f(device: &Device) -> cuda_graph::Result<()> {
/// let options = EventOptions::default().timing(true).blocking_sync(true);
/// let start = device.create_event_with(&options)?;
/// assert!(start.options().has_timing());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventOptions {
    timing: bool,
    blocking_sync: bool,
}

impl EventOptions {
    /// Whether the event records a timestamp, for [`Event::elapsed_ms`] (off by default:
    /// `CU_EVENT_DISABLE_TIMING`, cheaper to record and wait on).
    ///
    /// ```
    /// let o = cuda_graph::EventOptions::default().timing(true);
    /// assert!(o.has_timing());
    /// ```
    pub fn timing(mut self, on: bool) -> Self {
        self.timing = on;
        self
    }

    /// Whether [`Event::synchronize`] blocks the thread (`CU_EVENT_BLOCKING_SYNC`) instead of
    /// spinning (off by default).
    ///
    /// ```
    /// let o = cuda_graph::EventOptions::default().blocking_sync(true);
    /// assert!(o.has_blocking_sync());
    /// ```
    pub fn blocking_sync(mut self, on: bool) -> Self {
        self.blocking_sync = on;
        self
    }

    /// Whether timing is on.
    ///
    /// ```
    /// assert!(!cuda_graph::EventOptions::default().has_timing());
    /// ```
    pub fn has_timing(&self) -> bool {
        self.timing
    }

    /// Whether waits block the thread.
    ///
    /// ```
    /// assert!(!cuda_graph::EventOptions::default().has_blocking_sync());
    /// ```
    pub fn has_blocking_sync(&self) -> bool {
        self.blocking_sync
    }

    /// The `CUevent_flags` for these options.
    pub(crate) fn flags(&self) -> u32 {
        let mut flags = 0;
        if !self.timing {
            flags |= DISABLE_TIMING;
        }
        if self.blocking_sync {
            flags |= BLOCKING_SYNC;
        }
        flags
    }

    /// The options that `flags` (as made by [`flags`](Self::flags)) stand for.
    pub(crate) fn from_flags(flags: u32) -> Self {
        EventOptions {
            timing: flags & DISABLE_TIMING == 0,
            blocking_sync: flags & BLOCKING_SYNC != 0,
        }
    }
}

/// A CUDA event: recorded on one stream, waited on by another. Clones share the event.
/// `Send + Sync`.
#[derive(Clone)]
pub struct Event {
    pub(crate) handle: Arc<EventHandle>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("raw", &self.handle.raw)
            .finish_non_exhaustive()
    }
}

impl Event {
    /// The raw `CUevent`, for passing to other CUDA code; valid while this `Event` (or a clone)
    /// lives. Records and waits issued on it behind this crate's back are not tracked: a stream
    /// that waits on it through the raw handle does not join a capture the way
    /// [`Stream::wait`](crate::Stream::wait) does.
    ///
    /// ```no_run
    /// # fn f(event: &cuda_graph::Event) {
    /// let raw: cudarc::driver::sys::CUevent = event.as_raw();
    /// # }
    /// ```
    pub fn as_raw(&self) -> sys::CUevent {
        self.handle.raw
    }

    /// Blocks until the work recorded before this event has completed.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, event: &Event) -> cuda_graph::Result<()> {
    /// stream.record(event)?;
    /// event.synchronize()?; // the host waits for the work recorded before it
    /// # Ok(()) }
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.handle.ctx.bind()?;
        driver::event::synchronize(&self.handle)
    }

    /// An observer that tells when the event is destroyed (after every clone of this handle and
    /// every graph and exec using it are dropped), without keeping it alive.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(event: &Event) {
    /// let watch = event.release_observer();
    /// # }
    /// ```
    pub fn release_observer(&self) -> super::ReleaseObserver {
        super::ReleaseObserver::new(&self.handle)
    }

    /// The options the event was made with.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// assert!(!device.create_event()?.options().has_timing());
    /// # Ok(()) }
    /// ```
    pub fn options(&self) -> EventOptions {
        EventOptions::from_flags(self.handle.flags)
    }

    /// The milliseconds of GPU time between this event and `end` (`cuEventElapsedTime`), both
    /// recorded (outside a capture) and completed; resolution about half a microsecond.
    ///
    /// An event made without [`timing`](EventOptions::timing) is an [`Error::InvalidArgument`];
    /// an event not recorded yet is the driver's `CUDA_ERROR_INVALID_HANDLE`, one not completed
    /// yet its `CUDA_ERROR_NOT_READY`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::EventOptions;
    /// # fn f(device: &Device, stream: &Stream, graph: &Graph) -> cuda_graph::Result<()> {
    /// let timing = EventOptions::default().timing(true);
    /// let (start, end) = (device.create_event_with(&timing)?, device.create_event_with(&timing)?);
    /// stream.record(&start)?;
    /// graph.launch(stream)?;
    /// stream.record(&end)?;
    /// end.synchronize()?;
    /// println!("{} ms", start.elapsed_ms(&end)?);
    /// # Ok(()) }
    /// ```
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        for (which, e) in [("start", self), ("end", end)] {
            if !e.options().has_timing() {
                return Err(Error::invalid(Refusal::Unsupported, format!(
                    "elapsed_ms: the {which} event was made without timing (use EventOptions::default().timing(true))"
                )));
            }
        }
        if self.handle.ctx.device != end.handle.ctx.device {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                "elapsed_ms: the events belong to different devices",
            ));
        }
        self.handle.ctx.bind()?;
        driver::event::elapsed_ms(&self.handle, &end.handle)
    }

    /// Whether the work recorded before this event has completed.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, event: &Event) -> cuda_graph::Result<()> {
    /// stream.record(event)?;
    /// while !event.is_complete()? {
    ///     std::thread::yield_now();
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_complete(&self) -> Result<bool> {
        self.handle.ctx.bind()?;
        match driver::event::query(&self.handle) {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(sys::CUresult::CUDA_ERROR_NOT_READY as u32) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_options_map_to_flags_and_back() {
        for timing in [false, true] {
            for blocking in [false, true] {
                let o = EventOptions::default()
                    .timing(timing)
                    .blocking_sync(blocking);
                assert_eq!(EventOptions::from_flags(o.flags()), o);
                assert_eq!(o.flags() & DISABLE_TIMING == 0, timing);
                assert_eq!(o.flags() & BLOCKING_SYNC != 0, blocking);
            }
        }
        // The default is what `Device::create_event` makes: no timing, spinning waits.
        assert_eq!(EventOptions::default().flags(), DISABLE_TIMING);
    }
}
