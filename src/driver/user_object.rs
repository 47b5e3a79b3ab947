//! CUDA user objects: Rust values whose lifetime a graph or exec extends.
//!
//! A value that a node refers to (a buffer, a module, a callback closure, a child graph) is boxed
//! and handed to the driver as a user object moved into the graph. Instantiation carries the
//! reference to each exec. When the last graph and exec let go, the driver calls [`destroy`],
//! which must not call CUDA: it only sends the box to a reaper thread, which drops it (and so may
//! free device memory) outside the driver's callback. The reaper runs in relaxed capture mode, so
//! a release never invalidates a `Global` capture that another thread is recording.

use std::any::Any;
use std::ffi::c_void;
use std::sync::mpsc::{self, Sender};
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::drv;
use crate::error::{Error, Result};

/// What a graph keeps alive.
pub(crate) type KeepAlive = Box<dyn Any + Send + Sync>;

static REAPER: OnceLock<Option<Sender<KeepAlive>>> = OnceLock::new();

fn reaper() -> Option<&'static Sender<KeepAlive>> {
    REAPER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<KeepAlive>();
            std::thread::Builder::new()
                .name("cuda-graph-release".into())
                .spawn(move || {
                    // Dropping a value may free device memory. In the default (global) mode that
                    // call would invalidate a `Global` capture running on another thread at the
                    // time; the release thread's calls never touch a capture, so it relaxes them.
                    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
                    // SAFETY: only sets this thread's capture interaction mode; `mode` is valid.
                    let _ = unsafe { drv!(cuThreadExchangeStreamCaptureMode(&mut mode)) };
                    for value in rx {
                        drop(value);
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

unsafe extern "C" fn destroy(ptr: *mut c_void) {
    // SAFETY: `ptr` is the `Box<KeepAlive>` leaked in `retain`, and the driver calls the
    // destructor exactly once.
    let value: Box<KeepAlive> = unsafe { Box::from_raw(ptr.cast()) };
    // Never drop here (that could call CUDA from a driver callback) and never unwind.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        if let Some(tx) = reaper() {
            if let Err(mpsc::SendError(v)) = tx.send(*value) {
                std::mem::forget(v);
            }
        } else {
            std::mem::forget(value);
        }
    }));
}

/// Moves `value` into `graph` as a user object: it lives until `graph` and every exec made from
/// it (and from its clones) are destroyed. The graph's context must be current.
pub(crate) fn retain(graph: sys::CUgraph, value: KeepAlive) -> Result<()> {
    if reaper().is_none() {
        return Err(Error::InvalidArgument(
            "cannot start the thread that releases graph-owned resources".into(),
        ));
    }
    let ptr = Box::into_raw(Box::new(value));
    let mut obj = std::ptr::null_mut();
    let flags = sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
    // SAFETY: `ptr` stays valid until `destroy` takes it back; `destroy` never calls CUDA.
    let created = unsafe {
        drv!(cuUserObjectCreate(
            &mut obj,
            ptr.cast(),
            Some(destroy),
            1,
            flags
        ))
    };
    if let Err(e) = created {
        // SAFETY: the driver did not take ownership, so the box is still ours.
        drop(unsafe { Box::from_raw(ptr) });
        return Err(e);
    }
    let mv = sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32;
    // SAFETY: `obj` is a live user object holding one reference, which MOVE hands to `graph`.
    let moved = unsafe { drv!(cuGraphRetainUserObject(graph, obj, 1, mv)) };
    if let Err(e) = moved {
        // SAFETY: we still hold the one reference; releasing it runs `destroy`.
        let _ = unsafe { drv!(cuUserObjectRelease(obj, 1)) };
        return Err(e);
    }
    Ok(())
}
