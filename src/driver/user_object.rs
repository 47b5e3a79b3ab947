//! CUDA user objects: Rust values whose lifetime a graph or exec extends.
//!
//! A value that a node refers to (a buffer, a module, a callback closure, a child graph) is boxed
//! and handed to the driver as a user object moved into the graph. Instantiation carries the
//! reference to each exec. When the last graph and exec let go, the driver calls [`destroy`],
//! which must not call CUDA: it only hands the box to the release thread ([`super::release`]),
//! which drops it (and so may free device memory) once no capture is active.

use std::any::Any;
use std::ffi::c_void;

use cudarc::driver::sys;

use super::{drv, release};
use crate::error::{Error, Result};

/// What a graph keeps alive.
pub(crate) type KeepAlive = Box<dyn Any + Send + Sync>;

unsafe extern "C" fn destroy(ptr: *mut c_void) {
    // SAFETY: `ptr` is the `Box<KeepAlive>` leaked in `retain`, and the driver calls the
    // destructor exactly once.
    let value: Box<KeepAlive> = unsafe { Box::from_raw(ptr.cast()) };
    // Never drop here (that could call CUDA from a driver callback) and never unwind.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        release::later(Box::new(move || drop(value)));
    }));
}

/// Moves `value` into `graph` as a user object: it lives until `graph` and every exec made from
/// it (and from its clones) are destroyed. The graph's context must be current.
pub(crate) fn retain(graph: sys::CUgraph, value: KeepAlive) -> Result<()> {
    if !release::available() {
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
