//! Stream handle.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::graph::GraphHandle;
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

/// An owned non-blocking stream (`cuStreamCreate(CU_STREAM_NON_BLOCKING)`), destroyed on drop.
#[derive(Debug)]
pub(crate) struct StreamHandle {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) raw: sys::CUstream,
    /// The capture this stream records into, if any. Held while work is issued on the stream and
    /// while a capture begins or ends on it, so "which capture, if any" and "record the work with
    /// its operands" are one step.
    capture: Mutex<Option<CaptureLink>>,
}

// SAFETY: CUstream handles may be used from any thread; the driver synchronises access.
unsafe impl Send for StreamHandle {}
// SAFETY: as above.
unsafe impl Sync for StreamHandle {}

impl StreamHandle {
    pub(crate) fn new(ctx: &Arc<PrimaryContext>) -> Result<Arc<Self>> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; `raw` is a valid out pointer.
        unsafe { drv!(cuStreamCreate(&mut raw, flags)) }?;
        Ok(Arc::new(StreamHandle {
            ctx: ctx.clone(),
            raw,
            capture: Mutex::new(None),
        }))
    }

    /// Locks the stream's capture slot (see [`StreamHandle::capture`]).
    pub(crate) fn slot(&self) -> MutexGuard<'_, Option<CaptureLink>> {
        self.capture.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the stream is capturing, and the capture's status.
    pub(crate) fn capture_status(&self) -> Result<sys::CUstreamCaptureStatus> {
        self.ctx.bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `raw` is a live stream; `status` is a valid out pointer.
        unsafe { drv!(cuStreamIsCapturing(self.raw, &mut status)) }?;
        Ok(status)
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
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `raw` is a live stream; `status` is a valid out pointer.
        if unsafe { drv!(cuStreamIsCapturing(self.raw, &mut status)) }.is_err()
            || status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        {
            return true;
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
        // SAFETY: created in `new`, destroyed exactly once, here; the driver lets pending work
        // finish first.
        release::destroy_in(&self.ctx, self.raw, |raw| unsafe {
            drv_drop!(cuStreamDestroy_v2(raw))
        });
    }
}
