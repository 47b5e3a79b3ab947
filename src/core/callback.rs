//! Host callbacks, for builders and definitions alike: the closure behind a panic-catching
//! trampoline, and the [`HostCallback`] observer.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};

type Closure = Box<dyn FnMut() + Send>;

/// A callback's closure and what observers see of it.
///
/// No lock an observer takes is held while the closure runs: the closure sits behind its own
/// mutex, which only [`run`](Self::run) locks, and the panic message's mutex is taken only
/// briefly, after the closure returned. So the closure may call its own [`HostCallback`]'s
/// methods without deadlocking.
struct CallbackState {
    /// Locked by `run` alone (observers never touch it), while the closure runs.
    f: Mutex<Closure>,
    calls: AtomicU64,
    /// Set when the closure panicked, after `panic` holds the message; it is not called again.
    disabled: AtomicBool,
    /// The panic's message; locked only briefly, never while the closure runs.
    panic: Mutex<Option<String>>,
}

impl CallbackState {
    fn run(&self) {
        if self.disabled.load(Ordering::Acquire) {
            return;
        }
        let mut f = self.f.lock().unwrap_or_else(|p| p.into_inner());
        // Another run may have panicked while this one waited for the closure.
        if self.disabled.load(Ordering::Acquire) {
            return;
        }
        let result = catch_unwind(AssertUnwindSafe(|| (*f)()));
        drop(f);
        match result {
            Ok(()) => {
                self.calls.fetch_add(1, Ordering::SeqCst);
            }
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".to_string());
                *self.panic.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg);
                self.disabled.store(true, Ordering::Release);
                // The payload may own anything, and its destructor could call CUDA, which a
                // driver callback must not: it is dropped on the release thread instead.
                crate::driver::release::later(Box::new(move || drop(payload)));
            }
        }
    }

    /// The panic's message, if the closure panicked.
    fn panic_message(&self) -> Option<String> {
        if !self.disabled.load(Ordering::Acquire) {
            return None;
        }
        self.panic.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The host function of every callback of this crate, as one address. A function's address is
/// not unique in Rust: `prepare` is generic, so it is compiled into its callers' codegen units,
/// and a small function they refer to may be copied into each (two copies of `trampoline` were
/// found in a release build, and a host node's function then matched neither). Everything that
/// hands the driver the trampoline, or compares against it, reads this one value.
static TRAMPOLINE: unsafe extern "C" fn(*mut c_void) = trampoline;

#[inline(never)]
unsafe extern "C" fn trampoline(user_data: *mut c_void) {
    // A panic never crosses into the driver (nor does one from its payload's `Drop`).
    crate::driver::release::contain(|| {
        // SAFETY: `user_data` is `Arc::as_ptr` of a `CallbackState` that the graph (and every exec
        // made from it) keeps alive through its keep set, so it is valid whenever the node runs.
        let state = unsafe { &*(user_data as *const CallbackState) };
        // CUDA calls are refused on this thread: destroys the closure causes are deferred.
        crate::driver::release::in_callback(|| state.run());
    });
}

/// An observer of a recorded host callback. It does not keep the closure alive: the graphs and
/// execs holding the callback do. `Send + Sync`.
///
/// A panic inside the closure is caught before it reaches the driver: the GPU work goes on, the
/// closure is not called again by any launch, and [`panic_message`](Self::panic_message) reports it.
/// The panic's payload is dropped later on the crate's release thread, not on the driver's.
///
/// The closure may hold a clone of its own observer and call its methods.
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
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let cb = b.add_host_callback(|| println!("step done"))?;
    /// // ... instantiate, launch, synchronize ...
    /// println!("ran {:?} times", cb.calls());
    /// # Ok(()) }
    /// ```
    pub fn calls(&self) -> Option<u64> {
        self.state.upgrade().map(|s| s.calls.load(Ordering::SeqCst))
    }

    /// Whether every graph and exec holding the closure has been dropped and the closure freed.
    /// The release happens shortly after the last exec's pending launches finish.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(cb: &HostCallback) -> cuda_graph::Result<()> {
    /// if cb.is_released() {
    ///     println!("every graph and exec holding the closure is gone");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_released(&self) -> bool {
        self.state.strong_count() == 0
    }

    /// The message of the panic that disabled the closure, if it panicked.
    ///
    /// Like every method here, it may be called from inside the closure itself.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(cb: &HostCallback) -> cuda_graph::Result<()> {
    /// if let Some(message) = cb.panic_message() {
    ///     eprintln!("the callback panicked: {message}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn panic_message(&self) -> Option<String> {
        self.state.upgrade()?.panic_message()
    }

    /// [`Error::CallbackPanicked`] if the closure panicked, else `Ok`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(cb: &HostCallback) -> cuda_graph::Result<()> {
    /// cb.check()?; // Err(Error::CallbackPanicked(..)) if the closure panicked
    /// # Ok(()) }
    /// ```
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
    /// What the graph must keep alive while the node can run.
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
        disabled: AtomicBool::new(false),
        panic: Mutex::new(None),
    });
    PreparedCallback {
        observer: HostCallback {
            state: Arc::downgrade(&state),
        },
        func: TRAMPOLINE,
        user_data: Arc::as_ptr(&state) as *mut c_void,
        keep: state,
    }
}

/// Whether `f` is the host function of this crate's callbacks.
pub(crate) fn is_trampoline(f: unsafe extern "C" fn(*mut c_void)) -> bool {
    f as usize == TRAMPOLINE as usize
}

/// The observer of the callback whose state `owner` is, if it is the state at `user_data`.
pub(crate) fn observer_of(
    owner: &Arc<dyn std::any::Any + Send + Sync>,
    user_data: usize,
) -> Option<HostCallback> {
    let state = owner.downcast_ref::<CallbackState>()?;
    if state as *const CallbackState as usize != user_data {
        return None;
    }
    let state = owner.clone().downcast::<CallbackState>().ok()?;
    Some(HostCallback {
        state: Arc::downgrade(&state),
    })
}

static_assertions::assert_impl_all!(HostCallback: Send, Sync);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{mpsc, OnceLock};
    use std::time::Duration;

    /// Runs the node's host function once, as the driver would: on another thread, through the
    /// trampoline. `false` if it did not return within a few seconds (a deadlock); the thread is
    /// then left blocked, owning the callback, so nothing it uses is freed.
    fn run_like_the_driver(cb: &PreparedCallback) -> bool {
        // The test keeps `cb.keep` alive until after the thread returned (or forever).
        let (func, data) = (cb.func, cb.user_data as usize);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: `data` is the callback's `user_data`, kept alive by the caller's `keep`
            // while this runs (the caller waits for us, or leaks `keep`).
            unsafe { func(data as *mut c_void) };
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(10)).is_ok()
    }

    /// A callback whose closure runs `body` with its own observer.
    fn with_observer(
        body: impl Fn(&HostCallback) + Send + 'static,
    ) -> (PreparedCallback, HostCallback) {
        let me = Arc::new(OnceLock::<HostCallback>::new());
        let inner = me.clone();
        let cb = prepare(move || {
            if let Some(observer) = inner.get() {
                body(observer);
            }
        });
        let _ = me.set(cb.observer.clone());
        let observer = cb.observer.clone();
        (cb, observer)
    }

    #[test]
    fn prepared_callbacks_are_recognised_as_the_crates() {
        let prepared = prepare(|| {});
        assert!(is_trampoline(prepared.func));
        unsafe extern "C" fn other(_: *mut c_void) {}
        assert!(!is_trampoline(other));
    }

    #[test]
    fn a_closure_may_observe_its_own_callback() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let (cb, observer) = with_observer(move |me| {
            let entry = (me.check().is_ok(), me.panic_message(), me.calls());
            log.lock().unwrap().push(entry);
        });
        for _ in 0..2 {
            if !run_like_the_driver(&cb) {
                std::mem::forget(cb);
                panic!("the callback deadlocked observing itself");
            }
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [(true, None, Some(0)), (true, None, Some(1))]
        );
        assert_eq!(observer.calls(), Some(2));
        assert!(observer.check().is_ok());
    }

    #[test]
    fn a_panicking_closure_is_reported_and_not_run_again() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let cb = prepare(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            panic!("boom {}", 42);
        });
        let observer = cb.observer.clone();
        assert!(observer.check().is_ok());
        for _ in 0..3 {
            assert!(run_like_the_driver(&cb), "the callback hung");
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "run again after it panicked"
        );
        assert_eq!(observer.calls(), Some(0));
        assert_eq!(observer.panic_message().as_deref(), Some("boom 42"));
        match observer.check() {
            Err(Error::CallbackPanicked(m)) => assert_eq!(m, "boom 42"),
            other => panic!("expected CallbackPanicked, got {other:?}"),
        }
        drop(cb);
        assert!(observer.is_released());
        assert_eq!(observer.panic_message(), None);
    }

    #[test]
    fn a_closure_panicking_while_observing_itself_is_reported() {
        let (cb, observer) = with_observer(|me| {
            let _ = me.check();
            panic!("observed, then panicked");
        });
        if !run_like_the_driver(&cb) {
            std::mem::forget(cb);
            panic!("the callback deadlocked observing itself");
        }
        assert!(matches!(
            observer.check(),
            Err(Error::CallbackPanicked(m)) if m == "observed, then panicked"
        ));
        // Now disabled: observing from inside can't happen any more, and running is a no-op.
        assert!(run_like_the_driver(&cb));
        assert_eq!(observer.calls(), Some(0));
    }

    /// A panic payload that records where it was dropped.
    struct Payload(mpsc::Sender<Option<String>>);

    impl Drop for Payload {
        fn drop(&mut self) {
            let _ = self
                .0
                .send(std::thread::current().name().map(str::to_string));
        }
    }

    #[test]
    fn the_panic_payload_is_dropped_on_the_release_thread() {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(Some(tx));
        let cb = prepare(move || {
            if let Some(tx) = tx.lock().unwrap().take() {
                std::panic::panic_any(Payload(tx));
            }
        });
        assert!(run_like_the_driver(&cb));
        assert_eq!(
            cb.observer.panic_message().as_deref(),
            Some("a non-string panic payload")
        );
        let dropped_on = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the panic payload was never dropped (leaked)");
        assert_eq!(dropped_on.as_deref(), Some("cuda-graph-release"));
    }
}
