//! Where driver objects are destroyed, and when.
//!
//! Destroying or freeing a driver object while a stream capture is recording is a "potentially
//! unsafe" call: in `Global` mode, from any thread, it invalidates the capture. So while any
//! capture this crate began is active, handle destructors do not call the driver; they hand their
//! work to the release thread, which runs it once no capture is active. The release thread also
//! drops the values graphs kept alive as user objects (the driver's destructor callback must not
//! call CUDA itself), and runs in relaxed capture mode.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::drv;

static_assertions::assert_eq_size!(u32, sys::CUstreamCaptureMode);
static_assertions::assert_eq_align!(u32, sys::CUstreamCaptureMode);

/// Work for the release thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

static ACTIVE: Mutex<usize> = Mutex::new(0);
/// Held by the release thread while it runs a job, so a capture never begins mid-job.
static RUNNING: Mutex<()> = Mutex::new(());
static IDLE: Condvar = Condvar::new();
static THREAD: OnceLock<Option<Sender<Job>>> = OnceLock::new();

fn active() -> usize {
    *ACTIVE.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait_until_idle() {
    let mut n = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
    while *n > 0 {
        n = IDLE.wait(n).unwrap_or_else(|p| p.into_inner());
    }
}

fn thread() -> Option<&'static Sender<Job>> {
    THREAD
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("cuda-graph-release".into())
                .spawn(move || {
                    // The driver writes the previous mode back: into a `u32`, so a mode a newer
                    // driver has is never held as the bindings' enum.
                    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as u32;
                    let mode_ptr = (&mut mode as *mut u32).cast::<sys::CUstreamCaptureMode>();
                    // SAFETY: only sets this thread's capture interaction mode; `mode_ptr` points
                    // at a live, initialised 4-byte integer holding a valid mode.
                    let _ = unsafe { drv!(cuThreadExchangeStreamCaptureMode(mode_ptr)) };
                    for job in rx {
                        loop {
                            let running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
                            if active() == 0 {
                                // A panicking destructor must not take the thread down.
                                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                                drop(running);
                                break;
                            }
                            drop(running);
                            wait_until_idle();
                        }
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// Whether the release thread runs (it is started on first use).
pub(crate) fn available() -> bool {
    thread().is_some()
}

/// Runs `job` on the release thread once no capture is active. If the thread cannot run, the job
/// is leaked: nothing is destroyed at an unsafe time.
pub(crate) fn later(job: Job) {
    match thread() {
        Some(tx) => {
            if let Err(mpsc::SendError(job)) = tx.send(job) {
                std::mem::forget(job);
            }
        }
        None => std::mem::forget(job),
    }
}

/// Runs a destructor now, or on the release thread if a capture is active.
pub(crate) fn destroy(job: impl FnOnce() + Send + 'static) {
    if active() == 0 {
        job();
    } else {
        later(Box::new(job));
    }
}

/// A handle's destructor: makes `ctx` current and calls `destroy(raw)`, now or (while a capture
/// is active) on the release thread. `destroy` must destroy `raw` exactly once.
pub(crate) fn destroy_in<T: 'static>(ctx: &Arc<PrimaryContext>, raw: T, destroy: fn(T)) {
    let (ctx, raw) = (ctx.clone(), SendPtr(raw));
    self::destroy(move || {
        if ctx.bind().is_ok() {
            destroy(raw.into_inner());
        }
    });
}

/// Marks a capture as active for as long as it lives.
#[derive(Debug)]
pub(crate) struct CaptureActive(());

impl CaptureActive {
    /// Call before the capture begins: from then on destructors are deferred, and a job the
    /// release thread is running has finished.
    pub(crate) fn new() -> Self {
        *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        drop(RUNNING.lock().unwrap_or_else(|p| p.into_inner()));
        CaptureActive(())
    }
}

impl Drop for CaptureActive {
    fn drop(&mut self) {
        let mut n = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            IDLE.notify_all();
        }
    }
}

/// A raw driver handle moved into a deferred destructor.
struct SendPtr<T>(T);
// SAFETY: driver handles are plain pointers that the driver lets any thread use; the wrapper only
// moves one into the job that destroys it.
unsafe impl<T> Send for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The handle (a method, so closures capture the whole `Send` wrapper).
    fn into_inner(self) -> T {
        self.0
    }
}
