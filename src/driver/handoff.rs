//! The destroy hand-off of [`super::release`], without the driver: when a destroy runs at once and
//! when it waits for the release thread, the captures that forbid destroys, the release thread's
//! loop, and the order destroys run in. `release` makes one [`Handoff`] for the process, whose
//! release thread is a real thread fed by a channel; the loom models at the end of this file make
//! a fresh one in every execution, with a release thread of their own.
//!
//! The rules (see `release` and docs/design/destruction.md, "The release thread"):
//! a destroy runs at once unless a `Global` capture records (anywhere), a `ThreadLocal` or `Global`
//! capture records on this thread, or this thread runs a host callback; then it is queued and the
//! release thread is woken, which runs the queue once no `Global` capture records. The check and
//! the destroy happen under the read side of the gate; a `Global` capture takes the write side to
//! begin, so no destroy falls between "no Global capture records" and the destroy itself.

use std::cell::Cell;
use std::sync::PoisonError;

// `std`'s types, or loom's under `--cfg cuda_graph_loom`.
use super::sync::{lock_model as lock, thread_local_const, AtomicUsize, Mutex, Ordering, RwLock};

/// Work for the release thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A message to the release thread.
pub(crate) enum Msg {
    /// Drop a value (run a job that may run user code).
    Run(Job),
    /// Something may have become destroyable: try the deferred destroys.
    Wake,
}

/// How a [`Handoff`] reaches its release thread, whose loop is [`Handoff::serve`].
pub(crate) trait ReleaseThread {
    /// Queues `msg` for the release thread; `false` if there is none (it could not start).
    fn send(&self, msg: Msg) -> bool;
}

/// How a capture restricts destroys while it records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restricts {
    /// `Global`: every thread.
    Everyone,
    /// `ThreadLocal`: the capturing thread.
    ThisThread,
    /// `Relaxed`: nothing.
    Nothing,
}

thread_local_const! {
    /// Captures begun on this thread in `Global` or `ThreadLocal` mode and still recording.
    static LOCAL_ACTIVE: Cell<usize> = Cell::new(0);
    /// Set while a host callback's closure runs on this (driver) thread.
    static IN_CALLBACK: Cell<bool> = Cell::new(false);
    /// Set while this thread runs destroys (in [`Handoff::run_in_order`], holding `order`).
    static IN_ORDER: Cell<bool> = Cell::new(false);
    /// Set when a destroy job on this thread asked for another destroy (queued in `deferred`).
    static ASKED_IN_ORDER: Cell<bool> = Cell::new(false);
}

/// The shared state of destroys, captures and the release thread `R`.
pub(crate) struct Handoff<R> {
    /// `Global` captures recording now.
    global_active: AtomicUsize,
    /// Read: a destroy is checking and running. Write: a `Global` capture is beginning.
    gate: RwLock<()>,
    /// Destroys that could not run when asked; the release thread (or the next destroy) runs them.
    deferred: Mutex<Vec<Job>>,
    /// Held while destroys run: one at a time, in the order asked (see [`Self::run_in_order`]).
    order: Mutex<()>,
    thread: R,
}

/// Runs `f`, containing a panic: the panic's payload is leaked, not dropped, since its own `Drop`
/// may panic again (which would take down the release thread, or unwind into the driver).
pub(crate) fn contain(f: impl FnOnce()) {
    // Under loom a panic is how the checker reports what it found (a deadlock, a failed check in
    // a job): it must reach the model.
    #[cfg(cuda_graph_loom)]
    f();
    #[cfg(not(cuda_graph_loom))]
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        std::mem::forget(payload);
    }
}

/// Whether this thread runs a host callback's closure now (a driver thread: no CUDA calls).
pub(crate) fn in_host_callback() -> bool {
    IN_CALLBACK.with(Cell::get)
}

/// Marks this thread as running a host callback's closure (or not); returns what it was.
pub(crate) fn set_in_host_callback(on: bool) -> bool {
    IN_CALLBACK.with(|c| c.replace(on))
}

/// Whether this thread runs destroy jobs now (inside [`Handoff::run_in_order`]).
pub(crate) fn in_destroy_job() -> bool {
    IN_ORDER.with(Cell::get)
}

/// Whether this thread may call a destroying driver function now, as far as its own state goes.
pub(crate) fn thread_may_destroy() -> bool {
    LOCAL_ACTIVE.with(Cell::get) == 0 && !in_host_callback()
}

impl<R> Handoff<R> {
    #[cfg(not(cuda_graph_loom))]
    pub(crate) const fn new(thread: R) -> Self {
        Handoff {
            global_active: AtomicUsize::new(0),
            gate: RwLock::new(()),
            deferred: Mutex::new(Vec::new()),
            order: Mutex::new(()),
            thread,
        }
    }

    #[cfg(cuda_graph_loom)]
    pub(crate) fn new(thread: R) -> Self {
        Handoff {
            global_active: AtomicUsize::new(0),
            gate: RwLock::new(()),
            deferred: Mutex::new(Vec::new()),
            order: Mutex::new(()),
            thread,
        }
    }

    /// The release thread.
    #[cfg(all(test, cuda_graph_loom))]
    pub(crate) fn thread(&self) -> &R {
        &self.thread
    }

    /// Runs `f` now if this thread may call a destroying driver function now (no capture of its
    /// own, not in a host callback, no `Global` capture anywhere), under the read side of the
    /// gate (no `Global` capture begins meanwhile); `None` without running it otherwise.
    pub(crate) fn if_destroy_allowed<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        if !thread_may_destroy() {
            return None;
        }
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        (self.global_active.load(Ordering::SeqCst) == 0).then(f)
    }

    /// Ends a `Global` capture without waking the release thread (the state that ending one
    /// leaves until the release thread runs).
    #[cfg(all(test, not(cuda_graph_loom)))]
    pub(crate) fn end_global_capture_quietly(&self) {
        self.global_active.fetch_sub(1, Ordering::SeqCst);
        LOCAL_ACTIVE.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

impl<R: ReleaseThread> Handoff<R> {
    /// The release thread's loop: runs each job sent to it (with no lock held, so the job may
    /// call back into the crate, even begin a capture), and after each message the deferred
    /// destroys if no `Global` capture records.
    pub(crate) fn serve(&self, messages: impl IntoIterator<Item = Msg>) {
        for msg in messages {
            if let Msg::Run(job) = msg {
                // A panicking destructor must not take the thread down.
                contain(job);
            }
            self.run_deferred();
        }
    }

    /// Runs the deferred destroys if no `Global` capture records (on the release thread).
    fn run_deferred(&self) {
        if self.global_active.load(Ordering::SeqCst) != 0 {
            return;
        }
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        if self.global_active.load(Ordering::SeqCst) != 0 {
            return;
        }
        self.run_in_order(|| {});
    }

    /// Runs the deferred destroys, then `job`, holding `order`: destroys run one at a time and in
    /// the order they were asked for, whichever thread runs them. (An exec whose destroy was
    /// deferred, then its source graph destroyed at once on another thread, would otherwise be
    /// destroyed beside it — a pattern driver 13.0 crashed on.) The caller holds the read side of
    /// `gate` with no `Global` capture recording. Destroy jobs only call the driver; none waits
    /// for a lock a host callback takes (callbacks only defer). A job may drop the last handle of
    /// another object (a stream-ordered buffer's free holds its stream): that destroy is queued
    /// while this runs ([`Self::destroy`] sees [`IN_ORDER`]) and run here after the job, never
    /// waiting for `order` on the thread that holds it.
    fn run_in_order(&self, job: impl FnOnce()) {
        let _order = lock(&self.order);
        IN_ORDER.with(|c| c.set(true));
        self.run_queued();
        contain(job);
        if ASKED_IN_ORDER.with(|c| c.replace(false)) {
            self.run_queued();
        }
        IN_ORDER.with(|c| c.set(false));
    }

    /// Runs the deferred destroys, and those they ask for, until none is left (under `order`).
    fn run_queued(&self) {
        loop {
            let jobs = std::mem::take(&mut *lock(&self.deferred));
            if jobs.is_empty() {
                return;
            }
            for deferred in jobs {
                contain(deferred);
            }
            ASKED_IN_ORDER.with(|c| c.set(false));
        }
    }

    /// Runs a destroy now, or on the release thread while a capture or a callback forbids it
    /// here. If there is no release thread, a deferred destroy is leaked: nothing is destroyed
    /// at an unsafe time.
    pub(crate) fn destroy(&self, job: impl FnOnce() + Send + 'static) {
        if IN_ORDER.with(Cell::get) {
            // Asked by a destroy job (it dropped another object's last handle): the
            // `run_in_order` running on this thread runs it next.
            lock(&self.deferred).push(Box::new(job));
            ASKED_IN_ORDER.with(|c| c.set(true));
            return;
        }
        if thread_may_destroy() {
            let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
            if self.global_active.load(Ordering::SeqCst) == 0 {
                self.run_in_order(job);
                drop(gate);
                return;
            }
        }
        lock(&self.deferred).push(Box::new(job));
        if !self.thread.send(Msg::Wake) {
            // No release thread: leak rather than destroy at an unsafe time.
            std::mem::forget(std::mem::take(&mut *lock(&self.deferred)));
        }
    }

    /// Counts a capture that begins now. For a `Global` capture this waits for a destroy that is
    /// running on another thread to finish.
    pub(crate) fn begin_capture(&self, restricts: Restricts) {
        match restricts {
            Restricts::Everyone => {
                let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
                self.global_active.fetch_add(1, Ordering::SeqCst);
                LOCAL_ACTIVE.with(|n| n.set(n.get() + 1));
            }
            Restricts::ThisThread => LOCAL_ACTIVE.with(|n| n.set(n.get() + 1)),
            Restricts::Nothing => {}
        }
    }

    /// Counts out a capture begun on this thread by [`Self::begin_capture`], waking the release
    /// thread if destroys wait for it.
    pub(crate) fn end_capture(&self, restricts: Restricts) {
        match restricts {
            Restricts::Everyone => {
                LOCAL_ACTIVE.with(|n| n.set(n.get().saturating_sub(1)));
                if self.global_active.fetch_sub(1, Ordering::SeqCst) == 1 {
                    self.wake_if_deferred();
                }
            }
            Restricts::ThisThread => {
                LOCAL_ACTIVE.with(|n| n.set(n.get().saturating_sub(1)));
                self.wake_if_deferred();
            }
            Restricts::Nothing => {}
        }
    }

    /// Wakes the release thread for the deferred destroys, if there are any. A destroy deferred
    /// after the check sends its own wake-up once it is queued, and the release thread then sees
    /// this capture ended (the counters were updated before the check). Waking the thread
    /// unconditionally cost every capture's end a message to the release thread and a wake-up.
    fn wake_if_deferred(&self) {
        if !lock(&self.deferred).is_empty() {
            self.thread.send(Msg::Wake);
        }
    }
}

#[cfg(all(test, cuda_graph_loom))]
mod loom_tests {
    //! Loom models of the hand-off: loom runs each model once per interleaving of its threads
    //! with at most 5 preemptions (4 suffice to find a release thread that runs the queue
    //! without re-checking for a `Global` capture under the gate; 3 do not), with the loads of
    //! atomics allowed every value the memory model allows, and fails on a deadlock, a failed
    //! assertion or a thread left blocked. Each model has its own `Handoff`
    //! and release thread (`serve` over a channel closed at the end, as `std::sync::mpsc`'s
    //! queue: messages are never lost or merged). Jobs record what they saw in atomics (and
    //! `contain` lets panics through under loom); the model checks the records at the end.
    //! Run with `RUSTFLAGS="--cfg cuda_graph_loom" cargo test --release --lib loom` (see docs/design/destruction.md).

    use super::*;
    use loom::sync::{Arc, Condvar};
    use loom::thread::{self, JoinHandle};
    use std::collections::VecDeque;

    use super::super::sync::AtomicBool;

    /// The release thread's queue: `send` never blocks and never fails (the process's release
    /// thread never stops); `recv` returns `None` once the model closed the queue and it is
    /// empty (what the release thread sends itself while it drains the queue still runs).
    struct Channel {
        queue: Mutex<(VecDeque<Msg>, bool)>,
        ready: Condvar,
    }

    impl ReleaseThread for Channel {
        fn send(&self, msg: Msg) -> bool {
            lock(&self.queue).0.push_back(msg);
            self.ready.notify_one();
            true
        }
    }

    impl Channel {
        fn recv(&self) -> Option<Msg> {
            let mut q = lock(&self.queue);
            loop {
                if let Some(msg) = q.0.pop_front() {
                    return Some(msg);
                }
                if q.1 {
                    return None;
                }
                q = self.ready.wait(q).unwrap();
            }
        }

        fn close(&self) {
            lock(&self.queue).1 = true;
            self.ready.notify_one();
        }
    }

    type Shared = Arc<Handoff<Channel>>;

    /// A fresh hand-off with its release thread running.
    fn start() -> (Shared, JoinHandle<()>) {
        let h = Arc::new(Handoff::new(Channel {
            queue: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
        }));
        let release = {
            let h = h.clone();
            thread::spawn(move || h.serve(std::iter::from_fn(|| h.thread().recv())))
        };
        (h, release)
    }

    /// Once every other thread of the model is done: lets the release thread handle what was
    /// sent to it, and waits for it.
    fn finish(h: &Shared, release: JoinHandle<()>) {
        h.thread().close();
        release.join().unwrap();
    }

    fn flag() -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(false))
    }

    fn count() -> Arc<AtomicUsize> {
        Arc::new(AtomicUsize::new(0))
    }

    /// A destroy asked on another thread while a `Global` capture records, the capture ending,
    /// then a second `Global` capture beginning and ending: the destroy runs exactly once, never
    /// while either capture records (deferred during the first, not slipping past the gate into
    /// the second), and is never left queued (the capture's end, racing the deferral and its
    /// wake-up, wakes the release thread or the deferral's own wake-up finds it ended).
    #[test]
    fn loom_a_destroy_deferred_by_a_global_capture_runs_once_after_it() {
        super::super::sync::model(5, || {
            let (h, release) = start();
            let (recording, bad, runs) = (flag(), flag(), count());
            h.begin_capture(Restricts::Everyone);
            recording.store(true, Ordering::SeqCst);
            let destroyer = {
                let (h, recording, bad, runs) =
                    (h.clone(), recording.clone(), bad.clone(), runs.clone());
                thread::spawn(move || {
                    h.destroy(move || {
                        if recording.load(Ordering::SeqCst) {
                            bad.store(true, Ordering::SeqCst);
                        }
                        runs.fetch_add(1, Ordering::SeqCst);
                    })
                })
            };
            recording.store(false, Ordering::SeqCst);
            h.end_capture(Restricts::Everyone);
            h.begin_capture(Restricts::Everyone);
            recording.store(true, Ordering::SeqCst);
            recording.store(false, Ordering::SeqCst);
            h.end_capture(Restricts::Everyone);
            destroyer.join().unwrap();
            finish(&h, release);
            assert!(
                !bad.load(Ordering::SeqCst),
                "a destroy ran while a Global capture recorded"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 1, "the destroy ran once");
        });
    }

    loom::thread_local! {
        /// Set on the thread with the `ThreadLocal` capture of the model below.
        static CAPTURING: std::cell::Cell<bool> = std::cell::Cell::new(false);
    }

    /// A thread with a `ThreadLocal` capture asks a destroy `X` (deferred: the release thread
    /// is woken) and ends the capture (a second wake-up, if `X` is still queued), while another
    /// thread asks a destroy `Y` that it may run at once. `X` never runs on the capturing
    /// thread, both run exactly once and one at a time, and if `X` was asked before `Y` it ran
    /// before `Y` (`Y`'s destroy runs the queue first, or the release thread had).
    #[test]
    fn loom_destroys_run_once_one_at_a_time_and_in_the_order_asked() {
        super::super::sync::model(5, || {
            let (h, release) = start();
            let (x_asked, x_ran, y_ran, running, bad) = (flag(), flag(), flag(), flag(), flag());
            let capturing = {
                let (h, x_asked, x_ran, running, bad) = (
                    h.clone(),
                    x_asked.clone(),
                    x_ran.clone(),
                    running.clone(),
                    bad.clone(),
                );
                thread::spawn(move || {
                    CAPTURING.with(|c| c.set(true));
                    h.begin_capture(Restricts::ThisThread);
                    h.destroy(move || {
                        if running.swap(true, Ordering::SeqCst)
                            || CAPTURING.with(std::cell::Cell::get)
                            || x_ran.swap(true, Ordering::SeqCst)
                        {
                            bad.store(true, Ordering::SeqCst);
                        }
                        running.store(false, Ordering::SeqCst);
                    });
                    x_asked.store(true, Ordering::SeqCst);
                    h.end_capture(Restricts::ThisThread);
                })
            };
            let x_first = x_asked.load(Ordering::SeqCst);
            {
                let (x_ran, y_ran, running, bad) =
                    (x_ran.clone(), y_ran.clone(), running.clone(), bad.clone());
                h.destroy(move || {
                    if running.swap(true, Ordering::SeqCst)
                        || (x_first && !x_ran.load(Ordering::SeqCst))
                        || y_ran.swap(true, Ordering::SeqCst)
                    {
                        bad.store(true, Ordering::SeqCst);
                    }
                    running.store(false, Ordering::SeqCst);
                });
            }
            capturing.join().unwrap();
            finish(&h, release);
            assert!(
                !bad.load(Ordering::SeqCst),
                "a destroy ran twice, beside another, out of order or where its capture forbade it"
            );
            assert!(
                x_ran.load(Ordering::SeqCst) && y_ran.load(Ordering::SeqCst),
                "a destroy never ran"
            );
        });
    }

    /// A value dropped on the release thread whose `Drop` begins a `Global` capture, asks a
    /// destroy (deferred) and ends the capture; meanwhile another thread asks a destroy whose job
    /// asks a further destroy (a buffer's free dropping its stream: queued through `IN_ORDER`,
    /// run right after it on the same thread). Nothing deadlocks (the release thread holds no
    /// lock while it drops the value; the nested destroy never waits for `order`), every destroy
    /// runs exactly once, none while the capture records, and the nested one after its parent.
    #[test]
    fn loom_a_drop_on_the_release_thread_may_capture_and_a_destroy_may_ask_another() {
        super::super::sync::model(5, || {
            let (h, release) = start();
            let (recording, bad) = (flag(), flag());
            let (inner, outer, nested) = (count(), count(), count());
            {
                let (h2, recording, bad, inner) =
                    (h.clone(), recording.clone(), bad.clone(), inner.clone());
                assert!(h.thread().send(Msg::Run(Box::new(move || {
                    h2.begin_capture(Restricts::Everyone);
                    recording.store(true, Ordering::SeqCst);
                    let seen = recording.clone();
                    h2.destroy(move || {
                        if seen.load(Ordering::SeqCst) {
                            bad.store(true, Ordering::SeqCst);
                        }
                        inner.fetch_add(1, Ordering::SeqCst);
                    });
                    recording.store(false, Ordering::SeqCst);
                    h2.end_capture(Restricts::Everyone);
                }))));
            }
            let destroyer = {
                let (h, recording, bad, outer, nested) = (
                    h.clone(),
                    recording.clone(),
                    bad.clone(),
                    outer.clone(),
                    nested.clone(),
                );
                thread::spawn(move || {
                    let h2 = h.clone();
                    h.destroy(move || {
                        if recording.load(Ordering::SeqCst) {
                            bad.store(true, Ordering::SeqCst);
                        }
                        outer.fetch_add(1, Ordering::SeqCst);
                        let after = outer.clone();
                        h2.destroy(move || {
                            if after.load(Ordering::SeqCst) != 1 || recording.load(Ordering::SeqCst)
                            {
                                bad.store(true, Ordering::SeqCst);
                            }
                            nested.fetch_add(1, Ordering::SeqCst);
                        });
                    });
                })
            };
            destroyer.join().unwrap();
            finish(&h, release);
            assert!(
                !bad.load(Ordering::SeqCst),
                "a destroy ran during the capture or before its parent"
            );
            for (n, what) in [(&inner, "inner"), (&outer, "outer"), (&nested, "nested")] {
                assert_eq!(n.load(Ordering::SeqCst), 1, "the {what} destroy ran once");
            }
        });
    }
}
