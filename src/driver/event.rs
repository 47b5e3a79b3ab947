//! Event handle.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::release;
use super::{drv, drv_drop};
use crate::error::Result;

/// An owned event (`cuEventCreate(CU_EVENT_DISABLE_TIMING)`), destroyed on drop.
#[derive(Debug)]
pub(crate) struct EventHandle {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) raw: sys::CUevent,
    /// The capture the event was last recorded into, if it was recorded on a capturing stream: a
    /// stream that waits on it joins that capture.
    pub(crate) recorded_in: Mutex<Option<super::stream::CaptureLink>>,
    /// Returned to the context's pool instead of destroyed (forks' and joins' events).
    pooled: bool,
    /// The `CUevent_flags` it was created with.
    pub(crate) flags: u32,
}

// SAFETY: CUevent handles may be used from any thread.
unsafe impl Send for EventHandle {}
// SAFETY: as above.
unsafe impl Sync for EventHandle {}

impl EventHandle {
    /// An event without timing (`CU_EVENT_DISABLE_TIMING`).
    pub(crate) fn new(ctx: &Arc<PrimaryContext>) -> Result<Arc<Self>> {
        Self::with_flags(ctx, DISABLE_TIMING)
    }

    /// An event created with `flags`, a combination of `CUevent_flags`.
    pub(crate) fn with_flags(ctx: &Arc<PrimaryContext>, flags: u32) -> Result<Arc<Self>> {
        let raw = Self::create_raw(ctx, flags)?;
        Ok(Arc::new(EventHandle {
            ctx: ctx.clone(),
            raw,
            recorded_in: Mutex::new(None),
            pooled: false,
            flags,
        }))
    }

    fn create_raw(ctx: &Arc<PrimaryContext>, flags: u32) -> Result<sys::CUevent> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the context is current; `raw` is a valid out pointer; `flags` combines
        // `CUevent_flags` values (the callers pass only those).
        unsafe { drv!(cuEventCreate(&mut raw, flags)) }?;
        Ok(raw)
    }

    /// An event from the context's pool (made if the pool is empty), returned to it on drop.
    pub(crate) fn pooled(ctx: &Arc<PrimaryContext>) -> Result<Arc<Self>> {
        let idle = ctx
            .pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .events
            .pop();
        let raw = match idle {
            Some(raw) => raw,
            None => Self::create_raw(ctx, DISABLE_TIMING)?,
        };
        Ok(Arc::new(EventHandle {
            ctx: ctx.clone(),
            raw,
            recorded_in: Mutex::new(None),
            pooled: true,
            flags: DISABLE_TIMING,
        }))
    }
}

/// `CU_EVENT_DISABLE_TIMING`.
pub(crate) const DISABLE_TIMING: u32 = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
/// `CU_EVENT_BLOCKING_SYNC`.
pub(crate) const BLOCKING_SYNC: u32 = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;

/// The milliseconds between two recorded events (`cuEventElapsedTime`, `_v2` with 13.x
/// bindings: see `compat::event_elapsed`).
///
/// Both events must have been created with timing and recorded; the driver reports
/// `CUDA_ERROR_NOT_READY` while either has not completed.
pub(crate) fn elapsed_ms(start: &EventHandle, end: &EventHandle) -> Result<f32> {
    let mut ms = 0f32;
    // SAFETY: both events are live (the handles own them); `ms` is a valid out pointer.
    unsafe { super::compat::event_elapsed(&mut ms, start.raw, end.raw) }?;
    Ok(ms)
}

/// Blocks until the work recorded before `event` has completed (`cuEventSynchronize`).
pub(crate) fn synchronize(event: &EventHandle) -> Result<()> {
    // SAFETY: the event is live (the handle owns it).
    unsafe { drv!(cuEventSynchronize(event.raw)) }
}

/// Whether the work recorded before `event` has completed (`cuEventQuery`): `Ok` if so, the
/// driver's `CUDA_ERROR_NOT_READY` if not.
pub(crate) fn query(event: &EventHandle) -> Result<()> {
    // SAFETY: the event is live (the handle owns it).
    unsafe { drv!(cuEventQuery(event.raw)) }
}

impl Drop for EventHandle {
    fn drop(&mut self) {
        if self.pooled {
            let mut pool = self.ctx.pool.lock().unwrap_or_else(|p| p.into_inner());
            if pool.events.len() < super::context::POOL_MAX {
                pool.events.push(self.raw);
                return;
            }
        }
        // SAFETY: created in `new`, destroyed exactly once, here.
        release::destroy_in(&self.ctx, self.raw, |raw| unsafe {
            drv_drop!(cuEventDestroy_v2(raw))
        });
    }
}
