//! Where driver objects are destroyed, and when.
//!
//! Destroying or freeing a driver object is a "potentially unsafe" call in CUDA's capture rules:
//! - while a `Global` capture records, such a call from any thread invalidates it;
//! - while a `ThreadLocal` (or `Global`) capture records, such a call from the capturing thread
//!   invalidates it;
//! - inside a host callback (a driver thread), CUDA calls are refused outright.
//!
//! So a handle's destructor ([`destroy`]) frees at once when none of these holds, and otherwise
//! hands the work to the release thread, which frees it as soon as no `Global` capture records.
//! `Relaxed` captures forbid nothing and defer nothing. The check and the free happen under the
//! read side of a gate; a `Global` capture takes the write side to begin, so no free can fall
//! between "no Global capture is active" and the free itself. That protocol, without the driver,
//! is [`super::handoff`], where loom models check it.
//!
//! The release thread also drops the values that execs release after their last launch (a host
//! function queued behind it, on the driver's thread, must not call CUDA itself), with no lock held, so such a value's `Drop`
//! may call back into the crate (even begin a capture). It runs in relaxed capture mode.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use super::sync::lock;

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::drv;
pub(crate) use super::handoff::{contain, in_host_callback, thread_may_destroy, Job, Restricts};
use super::handoff::{Handoff, Msg};

static_assertions::assert_eq_size!(u32, sys::CUstreamCaptureMode);
static_assertions::assert_eq_align!(u32, sys::CUstreamCaptureMode);

/// The process's destroys, captures and release thread (the protocol itself, with its rules and
/// the loom models that check it, is in [`super::handoff`]).
#[cfg(not(cuda_graph_loom))]
static HANDOFF: Handoff<Thread> = Handoff::new(Thread);
// Loom's primitives are made inside a model; nothing under `--cfg cuda_graph_loom` runs this one.
#[cfg(cuda_graph_loom)]
loom::lazy_static! {
    static ref HANDOFF: Handoff<Thread> = Handoff::new(Thread);
}

static THREAD: OnceLock<Option<Mutex<Sender<Msg>>>> = OnceLock::new();

/// The release thread, started when first needed.
struct Thread;

impl super::handoff::ReleaseThread for Thread {
    fn send(&self, msg: Msg) -> bool {
        send(msg)
    }
}

fn sender() -> Option<&'static Mutex<Sender<Msg>>> {
    THREAD
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Msg>();
            std::thread::Builder::new()
                .name("cuda-graph-release".into())
                .spawn(move || {
                    exchange_capture_mode(RELAXED);
                    HANDOFF.serve(rx);
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

fn send(msg: Msg) -> bool {
    match sender() {
        Some(tx) => lock(tx).send(msg).is_ok(),
        None => false,
    }
}

/// Runs `job` (typically dropping a value that may own crate resources) on the release thread. If
/// the thread cannot run, the job is leaked: nothing is destroyed at an unsafe time.
pub(crate) fn later(job: Job) {
    match sender() {
        Some(tx) => {
            if let Err(mpsc::SendError(Msg::Run(job))) = lock(tx).send(Msg::Run(job)) {
                std::mem::forget(job);
            }
        }
        None => std::mem::forget(job),
    }
}

/// Drops an owner of the caller's: the value a `from_raw` or `from_cudarc` handle holds for a
/// buffer, stream or kernel it does not own (a cudarc slice, stream or module). Its `Drop` is
/// code this crate cannot read and may call the driver (a cudarc slice waits on an event, frees
/// its memory with `cuMemFreeAsync` and destroys the event), so it runs where a destroy would
/// run: here, in `Relaxed` capture interaction mode, when this thread has no capture of its own,
/// runs no host callback and no destroy job; otherwise on the release thread (in `Relaxed` mode,
/// with no lock held). Either way another thread's `Global` capture and this thread's own
/// captures stay valid; a panic in it is contained.
pub(crate) fn drop_owner(owner: Box<dyn std::any::Any + Send>) {
    if thread_may_destroy() && !super::handoff::in_destroy_job() {
        let _relaxed = RelaxedMode::enter();
        contain(move || drop(owner));
    } else {
        later(Box::new(move || drop(owner)));
    }
}

/// Runs a driver destructor now, or on the release thread while a capture or a callback forbids
/// it here (see [`Handoff::destroy`]). `job` must only call the driver (no user code).
pub(crate) fn destroy(job: impl FnOnce() + Send + 'static) {
    HANDOFF.destroy(job);
}

/// A handle's destructor: makes `ctx` current and calls `destroy(raw)`, now or later (see
/// [`destroy`](self::destroy)). `destroy` must destroy `raw` exactly once.
pub(crate) fn destroy_in<T: 'static>(ctx: &Arc<PrimaryContext>, raw: T, destroy: fn(T)) {
    let (ctx, raw) = (ctx.clone(), SendPtr(raw));
    self::destroy(move || {
        if ctx.bind().is_ok() {
            destroy(raw.into_inner());
        }
    });
}

/// This thread in `Relaxed` capture interaction mode for as long as it lives
/// (`cuThreadExchangeStreamCaptureMode`), the mode it had restored after: for releases made on
/// a user's thread, whose values' destructors (a cudarc slice freeing its memory, say) would
/// otherwise invalidate a `Global` capture another thread records — as on the release thread,
/// which runs in `Relaxed` mode. Nothing is changed inside a host callback (no CUDA call there).
pub(crate) struct RelaxedMode(Option<u32>);

impl RelaxedMode {
    pub(crate) fn enter() -> Self {
        if in_host_callback() {
            return RelaxedMode(None);
        }
        RelaxedMode(exchange_capture_mode(RELAXED))
    }
}

impl Drop for RelaxedMode {
    fn drop(&mut self) {
        if let Some(mode) = self.0 {
            exchange_capture_mode(mode);
        }
    }
}

const RELAXED: u32 = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as u32;

/// Sets this thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`) and returns
/// the one it had, or `None` if the driver refused. Modes travel as the integers they are, so a
/// mode a newer driver reports is never held as the bindings' enum.
fn exchange_capture_mode(mode: u32) -> Option<u32> {
    let mut mode = mode;
    // SAFETY: only exchanges this thread's capture interaction mode; `mode` is a live,
    // initialised 4-byte integer holding a mode this crate or the driver gave, and the driver
    // writes the previous one into it.
    let r = unsafe {
        drv!(cuThreadExchangeStreamCaptureMode(
            (&mut mode as *mut u32).cast::<sys::CUstreamCaptureMode>()
        ))
    };
    r.is_ok().then_some(mode)
}

/// Runs `f` as a host callback: destroys it causes are deferred (CUDA calls are refused on the
/// driver's callback thread).
pub(crate) fn in_callback<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool, usize);
    impl Drop for Reset {
        fn drop(&mut self) {
            super::handoff::set_in_host_callback(self.0);
            super::context::restore_bound(self.1);
        }
    }
    // The thread's record of a bound context is forgotten meanwhile, so that no bind takes the
    // shortcut past the refusal (see `take_bound`).
    let _reset = Reset(
        super::handoff::set_in_host_callback(true),
        super::context::take_bound(),
    );
    f()
}

impl Restricts {
    pub(crate) fn of(mode: sys::CUstreamCaptureMode) -> Self {
        use sys::CUstreamCaptureMode::*;
        match mode {
            CU_STREAM_CAPTURE_MODE_GLOBAL => Restricts::Everyone,
            CU_STREAM_CAPTURE_MODE_THREAD_LOCAL => Restricts::ThisThread,
            CU_STREAM_CAPTURE_MODE_RELAXED => Restricts::Nothing,
        }
    }
}

/// Marks a capture as recording for as long as it lives, so destroys that would invalidate it
/// are deferred. For `Global` and `ThreadLocal` captures it must be dropped on the thread that
/// made it (the builders holding one are `!Send`).
#[derive(Debug)]
pub(crate) struct CaptureActive(Restricts);

impl CaptureActive {
    /// What the capture restricts.
    pub(crate) fn restricts(&self) -> Restricts {
        self.0
    }

    /// Call before the capture begins. For a `Global` capture this waits for a destroy that is
    /// running on another thread to finish.
    pub(crate) fn new(restricts: Restricts) -> Self {
        HANDOFF.begin_capture(restricts);
        CaptureActive(restricts)
    }
}

impl Drop for CaptureActive {
    fn drop(&mut self) {
        HANDOFF.end_capture(self.0);
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

unsafe extern "C" fn run_later(p: *mut std::ffi::c_void) {
    // SAFETY: `p` is the `Box<Job>` leaked in `after_stream`; the driver calls this once.
    let job: Box<Job> = unsafe { Box::from_raw(p.cast()) };
    // On the driver's thread: never call CUDA, never unwind; the release thread runs the job.
    contain(move || later(*job));
}

/// Whether `stream` has finished all work queued on it (`cuStreamQuery`), asked only where no
/// capture forbids the call on this thread (`false` otherwise, and on any error). The stream's
/// context must be current and the stream must not be capturing.
pub(crate) fn stream_idle_now(stream: sys::CUstream) -> bool {
    // SAFETY: the caller's promise: `stream` is live and its context current; no Global capture
    // records (checked under the gate, held while the query runs) and none of this thread's
    // captures does, so the query cannot invalidate a capture.
    HANDOFF.if_destroy_allowed(|| unsafe { drv!(cuStreamQuery(stream)) }.is_ok()) == Some(true)
}

/// Runs `job` on the release thread once `stream` has finished the work queued on it so far
/// (`cuLaunchHostFunc`). The stream's context must be current and the stream must not be
/// capturing (the host function would be captured). If the driver refuses, the job comes back
/// with the error, not run: what it would release may still be in use.
pub(crate) fn after_stream(stream: sys::CUstream, job: Job) -> Result<(), (crate::Error, Job)> {
    let p = Box::into_raw(Box::new(job));
    // SAFETY: `run_later` takes back the box exactly once, never unwinds and never calls CUDA.
    match unsafe { drv!(cuLaunchHostFunc(stream, Some(run_later), p.cast())) } {
        Ok(()) => Ok(()),
        // SAFETY: the driver did not take `p`: the box is still ours.
        Err(e) => Err((e, *unsafe { Box::from_raw(p) })),
    }
}

#[cfg(all(test, not(cuda_graph_loom)))]
mod tests {
    //! The deferral rules, without a driver: the jobs here call no CUDA, so only where and when
    //! they run is checked. The tests share process-wide state, so they run one at a time.

    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    static SERIAL: Mutex<()> = Mutex::new(());

    /// A destroy job that reports the name of the thread that ran it.
    fn reporting_destroy() -> mpsc::Receiver<String> {
        let (tx, rx) = mpsc::channel();
        destroy(move || {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            let _ = tx.send(name);
        });
        rx
    }

    fn ran_here(rx: &mpsc::Receiver<String>) -> bool {
        // A job run at once has already sent before `destroy` returned.
        matches!(rx.try_recv(), Ok(name) if name != "cuda-graph-release")
    }

    fn ran_on_release_thread(rx: &mpsc::Receiver<String>) -> bool {
        matches!(rx.recv_timeout(Duration::from_secs(10)), Ok(name) if name == "cuda-graph-release")
    }

    #[test]
    fn with_no_capture_a_destroy_runs_at_once() {
        let _serial = lock(&SERIAL);
        assert!(ran_here(&reporting_destroy()));
    }

    #[test]
    fn a_relaxed_capture_defers_nothing() {
        let _serial = lock(&SERIAL);
        let _active = CaptureActive::new(Restricts::Nothing);
        assert!(ran_here(&reporting_destroy()));
    }

    #[test]
    fn a_thread_local_capture_defers_only_its_own_threads_destroys() {
        let _serial = lock(&SERIAL);
        let active = CaptureActive::new(Restricts::ThisThread);
        let own = reporting_destroy();
        let other = std::thread::spawn(|| ran_here(&reporting_destroy()))
            .join()
            .expect("no panic");
        assert!(other, "another thread destroys at once");
        // The deferred destroy runs on a thread that is not capturing: the release thread, or
        // (destroys run in the order asked) the other thread, before its own.
        let here = std::thread::current().name().unwrap_or("?").to_string();
        assert!(matches!(
            own.recv_timeout(Duration::from_secs(10)),
            Ok(name) if name != here
        ));
        drop(active);
    }

    #[test]
    fn a_global_capture_defers_every_thread_until_it_ends() {
        let _serial = lock(&SERIAL);
        let active = CaptureActive::new(Restricts::Everyone);
        let own = reporting_destroy();
        let other = std::thread::spawn(reporting_destroy)
            .join()
            .expect("no panic");
        assert!(
            other.recv_timeout(Duration::from_millis(200)).is_err(),
            "nothing is destroyed while the Global capture records"
        );
        assert!(own.try_recv().is_err());
        drop(active);
        assert!(ran_on_release_thread(&own));
        assert!(ran_on_release_thread(&other));
    }

    #[test]
    fn destroys_run_in_the_order_asked_and_one_at_a_time() {
        let _serial = lock(&SERIAL);
        let log = Arc::new(Mutex::new(Vec::new()));
        let entry = |name: &'static str, slow: bool| {
            let log = log.clone();
            move || {
                lock(&log).push(format!("{name} begins"));
                if slow {
                    std::thread::sleep(Duration::from_millis(50));
                }
                lock(&log).push(format!("{name} ends"));
            }
        };
        // An exec's destroy deferred by a Global capture, then — the capture over — its source
        // graph's destroy asked on another thread before the release thread got to the first.
        let active = CaptureActive::new(Restricts::Everyone);
        destroy(entry("exec", true));
        // Ends the capture without waking the release thread (the state `drop(active)` leaves
        // until that thread runs).
        HANDOFF.end_global_capture_quietly();
        std::mem::forget(active);
        let source = entry("source", false);
        std::thread::spawn(move || destroy(source))
            .join()
            .expect("no panic");
        send(Msg::Wake);
        let done = || lock(&log).len() == 4;
        let start = std::time::Instant::now();
        while !done() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            *lock(&log),
            ["exec begins", "exec ends", "source begins", "source ends"],
            "the deferred destroy runs first, and alone"
        );
    }

    #[test]
    fn a_panic_whose_payload_panics_when_dropped_does_not_stop_the_release_thread() {
        let _serial = lock(&SERIAL);
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic!("the payload's own drop");
            }
        }
        later(Box::new(|| std::panic::panic_any(Bomb)));
        let (tx, rx) = mpsc::channel();
        later(Box::new(move || {
            let _ = tx.send(());
        }));
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "the release thread still runs jobs"
        );
    }

    #[test]
    fn a_host_callback_defers_its_destroys() {
        let _serial = lock(&SERIAL);
        let rx = in_callback(reporting_destroy);
        assert!(ran_on_release_thread(&rx));
        // Outside the callback, at once again.
        assert!(ran_here(&reporting_destroy()));
    }

    #[test]
    fn a_value_dropped_on_the_release_thread_may_begin_and_end_a_global_capture() {
        let _serial = lock(&SERIAL);
        let (tx, rx) = mpsc::channel();
        later(Box::new(move || {
            // What a `Drop` that begins a capture does first; it deadlocked the release thread.
            let active = CaptureActive::new(Restricts::Everyone);
            let inner = reporting_destroy();
            drop(active);
            let _ = tx.send(inner);
        }));
        let inner = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the release thread did not deadlock");
        assert!(
            ran_on_release_thread(&inner),
            "its own deferred destroy runs after"
        );
        // And a Global capture still begins on this thread afterwards.
        drop(CaptureActive::new(Restricts::Everyone));
        assert!(ran_here(&reporting_destroy()));
    }
}
