use std::sync::Arc;

use cudarc::driver::sys;

use crate::driver;
use crate::driver::event::EventHandle;
use crate::error::Result;

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

    /// Whether the work recorded before this event has completed.
    pub fn is_complete(&self) -> Result<bool> {
        self.handle.ctx.bind()?;
        match driver::event::query(&self.handle) {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(sys::CUresult::CUDA_ERROR_NOT_READY as u32) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
