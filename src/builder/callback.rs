//! Host callbacks: `callback(closure)` records a host function node.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::kind::Kind;
use super::state::IsCapturing;
use super::state::State;
use super::GraphBuilder;
use crate::driver::drv;
use crate::error::{Error, Result};

type Closure = Box<dyn FnMut() + Send>;

struct CallbackState {
    f: Mutex<Closure>,
    calls: AtomicU64,
    /// Set when the closure panicked; it is not called again.
    panic: Mutex<Option<String>>,
}

impl CallbackState {
    fn run(&self) {
        let mut panic = self.panic.lock().unwrap_or_else(|p| p.into_inner());
        if panic.is_some() {
            return;
        }
        let mut f = self.f.lock().unwrap_or_else(|p| p.into_inner());
        match catch_unwind(AssertUnwindSafe(|| (*f)())) {
            Ok(()) => {
                self.calls.fetch_add(1, Ordering::SeqCst);
            }
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".to_string());
                // The payload may own anything; it is leaked rather than dropped in a driver
                // callback, where dropping crate resources could call CUDA.
                std::mem::forget(payload);
                *panic = Some(msg);
            }
        }
    }
}

unsafe extern "C" fn trampoline(user_data: *mut c_void) {
    // A panic never crosses into the driver.
    let _ = catch_unwind(|| {
        // SAFETY: `user_data` is `Arc::as_ptr` of a `CallbackState` that the graph (and every exec
        // made from it) keeps alive through a user object, so it is valid whenever the node runs.
        let state = unsafe { &*(user_data as *const CallbackState) };
        state.run();
    });
}

/// An observer of a recorded host callback. It does not keep the closure alive: the graphs and
/// execs holding the callback do. `Send + Sync`.
///
/// A panic inside the closure is caught before it reaches the driver: the GPU work goes on, the
/// closure is not called again by any launch, and [`panic_message`](Self::panic_message) reports it.
#[derive(Clone)]
pub struct HostCallback {
    state: Weak<CallbackState>,
}

impl std::fmt::Debug for HostCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCallback")
            .field("calls", &self.calls())
            .field("released", &self.is_released())
            .finish()
    }
}

impl HostCallback {
    /// How many times the closure has run to completion; `None` once it has been released.
    pub fn calls(&self) -> Option<u64> {
        self.state.upgrade().map(|s| s.calls.load(Ordering::SeqCst))
    }

    /// Whether every graph and exec holding the closure has been dropped and the closure freed.
    /// The release happens shortly after the last exec's pending launches finish.
    pub fn is_released(&self) -> bool {
        self.state.strong_count() == 0
    }

    /// The message of the panic that disabled the closure, if it panicked.
    pub fn panic_message(&self) -> Option<String> {
        let state = self.state.upgrade()?;
        let msg = state
            .panic
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        msg
    }

    /// [`Error::CallbackPanicked`] if the closure panicked, else `Ok`.
    pub fn check(&self) -> Result<()> {
        match self.panic_message() {
            Some(m) => Err(Error::CallbackPanicked(m)),
            None => Ok(()),
        }
    }
}

/// A closure made ready to be a host node, shared by captured callbacks and definitions' host
/// nodes.
pub(crate) struct PreparedCallback {
    /// What the graph must keep alive (a user object) while the node can run.
    pub(crate) keep: Arc<dyn std::any::Any + Send + Sync>,
    /// The observer handed to the user.
    pub(crate) observer: HostCallback,
    /// The host function the node calls with `user_data`; it never unwinds, never calls CUDA.
    pub(crate) func: unsafe extern "C" fn(*mut c_void),
    /// Valid while `keep` lives.
    pub(crate) user_data: *mut c_void,
}

/// Boxes `f` behind the panic-catching trampoline.
pub(crate) fn prepare<F>(f: F) -> PreparedCallback
where
    F: FnMut() + Send + 'static,
{
    let state = Arc::new(CallbackState {
        f: Mutex::new(Box::new(f)),
        calls: AtomicU64::new(0),
        panic: Mutex::new(None),
    });
    PreparedCallback {
        observer: HostCallback {
            state: Arc::downgrade(&state),
        },
        func: trampoline,
        user_data: Arc::as_ptr(&state) as *mut c_void,
        keep: state,
    }
}

/// While capturing: host callbacks.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Records a host function node that runs `f` on a driver thread, once per launch, after the
    /// work recorded before it (`cuLaunchHostFunc`).
    ///
    /// `f` must be `Send + 'static`: it outlives this call and runs on another thread. It is kept
    /// alive until the last graph and exec holding it are dropped. It must not call CUDA.
    /// Conditional bodies cannot hold host nodes: there the driver refuses the callback.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let cb = b.callback(|| println!("the graph reached this point"))?;
    /// # Ok(()) }
    /// ```
    pub fn callback<F>(&self, f: F) -> Result<HostCallback>
    where
        S: IsCapturing,
        F: FnMut() + Send + 'static,
    {
        let PreparedCallback {
            keep: state,
            observer,
            func,
            user_data: ptr,
        } = prepare(f);
        let stream = &self.core.stream;
        stream.enqueue(|rec| {
            if !rec.capturing() {
                // Not capturing any more (invalidated): nothing would own the closure.
                self.core.status()?;
                return Err(Error::InvalidArgument(
                    "the builder's stream is not capturing".into(),
                ));
            }
            rec.keep_dyn(&state);
            // SAFETY: `ptr` stays valid as long as the graph holds the state (above); the
            // trampoline never unwinds and never calls CUDA.
            unsafe { drv!(cuLaunchHostFunc(stream.raw(), Some(func), ptr)) }
        })?;
        Ok(observer)
    }
}

static_assertions::assert_impl_all!(HostCallback: Send, Sync);
