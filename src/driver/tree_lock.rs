//! The lock of a graph tree: a mutex whose release is one plain store.
//!
//! Every node a capture records or a definition adds takes its tree's lock (CUDA graph objects
//! are not thread-safe), so the lock's own cost is paid per node. `std::sync::Mutex` makes an
//! atomic read-modify-write both to take and to release the lock (its release swaps the state to
//! learn whether a thread sleeps on it); with the stub driver that release was a third of an
//! explicit node's time in the crate besides the acquire. This lock releases with a store and
//! then reads a count of sleeping threads: the read may run ahead of the store (x86 lets a load
//! pass an earlier store), so a thread that went to sleep in that instant can miss its wake-up.
//! Sleepers therefore wake by themselves after [`NAP`] and try again: mutual exclusion rests on
//! the compare-and-swap alone, and a missed wake-up costs that waiter at most one nap. Threads
//! only sleep on the lock when another thread holds it past a short spin, which the crate's
//! per-node operations never do.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::PoisonError;
use std::time::Duration;

// `std`'s types, or loom's under `--cfg cuda_graph_loom` (the models at the end of this file).
use super::sync::{spin_loop, AtomicBool, AtomicU32, Condvar, Mutex, Ordering, UnsafeCell};

/// How long a thread waiting for the lock sleeps before it looks again, woken or not.
const NAP: Duration = Duration::from_millis(1);

/// How many times a thread that finds the lock taken looks again before it sleeps (under loom
/// once: each look is a yield there, and more of them only multiply the interleavings).
const SPINS: u32 = if cfg!(cuda_graph_loom) { 1 } else { 64 };

/// A mutual-exclusion lock around a `T` (see the module's documentation).
///
/// Laid out in declaration order (`repr(C)`): the lock word, then the value, whose first fields
/// the per-node paths read right after taking the lock (see `TreeState`), so that a node touches
/// as few cache lines as it can.
#[repr(C)]
pub(crate) struct TreeLock<T> {
    locked: AtomicBool,
    /// Threads asleep (or about to sleep) waiting for the lock.
    sleepers: AtomicU32,
    value: UnsafeCell<T>,
    park: Mutex<()>,
    wake: Condvar,
    /// [`NAP`], longer in a test that must see a wake-up arrive.
    nap: Duration,
}

// SAFETY: the lock hands out access to `value` to one thread at a time (`locked`, taken by a
// compare-and-swap with acquire ordering and released with a release store), as `Mutex<T>`
// does; so it may move and be shared between threads when `T` may move.
unsafe impl<T: Send> Send for TreeLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for TreeLock<T> {}

// As for `std::sync::Mutex`: a panic while the lock is held leaves the value as it was and the
// lock usable (there is no poisoning; the crate never panics while holding it). Without these,
// every public type holding a graph would stop being unwind-safe.
impl<T> UnwindSafe for TreeLock<T> {}
impl<T> RefUnwindSafe for TreeLock<T> {}

impl<T> std::fmt::Debug for TreeLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeLock")
            .field("locked", &self.locked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<T> TreeLock<T> {
    /// Where the value starts in the lock (for layout checks; none under loom).
    #[cfg_attr(cuda_graph_loom, allow(dead_code))]
    pub(crate) const VALUE_OFFSET: usize = std::mem::offset_of!(TreeLock<T>, value);

    pub(crate) fn new(value: T) -> Self {
        Self::with_nap(value, NAP)
    }

    fn with_nap(value: T, nap: Duration) -> Self {
        TreeLock {
            locked: AtomicBool::new(false),
            sleepers: AtomicU32::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            nap,
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting for it if another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> TreeGuard<'_, T> {
        if !self.try_acquire() {
            self.lock_contended();
        }
        TreeGuard {
            lock: self,
            _value: PhantomData,
            _rank: None,
        }
    }

    /// [`lock`](Self::lock) for the tree `id`, its rank recorded and checked
    /// ([`Rank::Tree`](super::lock_rank::Rank::Tree); debug builds) before it blocks.
    #[inline]
    pub(crate) fn lock_ranked(&self, id: u64) -> TreeGuard<'_, T> {
        let held = super::lock_rank::Held::acquire(super::lock_rank::Rank::Tree, id);
        let mut guard = self.lock();
        guard._rank = Some(held);
        guard
    }

    /// The value, through exclusive access to the lock itself.
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    #[inline]
    fn try_acquire(&self) -> bool {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        for _ in 0..SPINS {
            spin_loop();
            if !self.locked.load(Ordering::Relaxed) && self.try_acquire() {
                return;
            }
        }
        // A read-modify-write: ordered before the attempts below.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Counted out however this ends (nothing below is expected to panic).
        struct Awake<'a>(&'a AtomicU32);
        impl Drop for Awake<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _awake = Awake(&self.sleepers);
        loop {
            if self.try_acquire() {
                break;
            }
            let park = self.park.lock().unwrap_or_else(PoisonError::into_inner);
            // A release that read `sleepers` after the increment above wakes this thread under
            // `park`: either before this check (which then sees the lock free) or after the
            // wait below began. One that read it before sleeps out the nap. (Loom has no time:
            // there `wait_timeout` waits for a notification, and the models notify for a nap
            // that ends.)
            if self.locked.load(Ordering::SeqCst) {
                drop(
                    self.wake
                        .wait_timeout(park, self.nap)
                        .unwrap_or_else(PoisonError::into_inner),
                );
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        let _park = self.park.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_one();
    }
}

/// The lock of a [`TreeLock`], held until dropped; gives access to the value.
pub(crate) struct TreeGuard<'a, T> {
    lock: &'a TreeLock<T>,
    /// Shares and moves like `&mut T`.
    _value: PhantomData<&'a mut T>,
    /// The lock's rank, recorded while it is held (taken through
    /// [`lock_ranked`](TreeLock::lock_ranked); released after the lock, field order).
    _rank: Option<super::lock_rank::Held>,
}

impl<T> Deref for TreeGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock: no other reference to the value exists.
        unsafe { &*self.lock.value.read() }
    }
}

impl<T> DerefMut for TreeGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.write() }
    }
}

impl<T> Drop for TreeGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
        if self.lock.sleepers.load(Ordering::Relaxed) != 0 {
            self.lock.wake_one();
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for TreeGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(all(test, not(cuda_graph_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    /// `threads` threads each making `rounds` non-atomic read-modify-writes under the lock, the
    /// `i`-th of a thread sleeping `hold` inside it when `sleep(thread, i)`: lost updates or a
    /// second thread inside would show that the lock failed. Returns the lock.
    fn hammer(
        threads: u64,
        rounds: u64,
        sleep: fn(u64, u64) -> bool,
        hold: Duration,
    ) -> Arc<TreeLock<(u64, bool)>> {
        let lock = Arc::new(TreeLock::new((0u64, false)));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for i in 0..rounds {
                        let mut g = lock.lock();
                        assert!(!g.1, "two threads inside the lock");
                        g.1 = true;
                        if sleep(t, i) {
                            std::thread::sleep(hold);
                        }
                        let v = g.0;
                        std::hint::black_box(&v);
                        g.0 = v + 1;
                        g.1 = false;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(lock.lock().0, threads * rounds);
        lock
    }

    #[test]
    fn threads_taking_turns_never_overlap() {
        hammer(4, 50_000, |_, _| false, Duration::ZERO);
    }

    #[test]
    fn threads_that_sleep_on_the_lock_never_overlap() {
        // Some holds outlast the spin, so waiters go through the sleeping path.
        let lock = hammer(4, 200, |t, i| (i + t) % 50 == 0, Duration::from_millis(2));
        assert_eq!(lock.sleepers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_sleeping_waiter_is_woken_by_the_release() {
        // A nap far longer than the test: the waiter gets the lock only if the release wakes it.
        let lock = Arc::new(TreeLock::with_nap(0u32, Duration::from_secs(600)));
        let g = lock.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let lock = lock.clone();
            std::thread::spawn(move || {
                *lock.lock() += 1;
                let _ = tx.send(());
            });
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while lock.sleepers.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the waiter never went to sleep");
            std::thread::sleep(Duration::from_millis(1));
        }
        // The waiter counted itself before its last look at the lock: it may still be between
        // that look and the wait, which the release must not miss either (the park mutex).
        std::thread::sleep(Duration::from_millis(20));
        drop(g);
        assert!(
            rx.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the waiter was not woken"
        );
        assert_eq!(*lock.lock(), 1);
        assert_eq!(lock.sleepers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_lock_is_unwind_safe_like_a_mutex() {
        static_assertions::assert_impl_all!(
            TreeLock<std::sync::Arc<dyn std::any::Any + Send + Sync>>: UnwindSafe, RefUnwindSafe, Send, Sync
        );
        let lock = Arc::new(TreeLock::new(1u32));
        let l = lock.clone();
        let r = std::panic::catch_unwind(move || {
            let mut g = l.lock();
            *g = 2;
            panic!("inside the lock");
        });
        assert!(r.is_err());
        assert_eq!(
            *lock.lock(),
            2,
            "the lock is usable after a panic inside it"
        );
    }

    #[test]
    fn get_mut_reaches_the_value_without_locking() {
        let mut lock = TreeLock::new(vec![1]);
        lock.get_mut().push(2);
        assert_eq!(*lock.lock(), vec![1, 2]);
        assert!(format!("{lock:?}").contains("locked: false"));
    }
}

#[cfg(all(test, cuda_graph_loom))]
mod loom_tests {
    //! Loom models of the lock: loom runs each model once per interleaving of its threads (with
    //! at most the preemptions each model names), with the loads of atomics allowed every value
    //! the memory model allows (a load may read an older store, as on x86 a load passes an
    //! earlier store), and fails on a deadlock, a failed assertion, or two accesses to the
    //! value that the lock does not order (a data race).
    //!
    //! Loom has no time: its `wait_timeout` waits for a notification. A "clock" thread of the
    //! model ends naps: whenever it finds the lock free with a sleeper counted, it notifies the
    //! sleepers, as their naps' ends would. (A nap that ends while the lock is held only sends
    //! the sleeper round its loop to sleep again, from a state the model already explores, so
    //! the clock leaves those out.) Without the clock, loom finds a sleeper that waits forever:
    //! the missed wake-up the module's documentation describes. Run with
    //! `RUSTFLAGS="--cfg cuda_graph_loom" cargo test --release --lib loom` (see docs/design/destruction.md).

    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// `threads` threads each take the lock and make a non-atomic read-modify-write of the
    /// value with a point in the middle where loom may switch threads (a second thread inside
    /// would see the flag set, lose an update, or race on the value); every thread must get in
    /// (a thread left asleep is a deadlock).
    fn model(threads: usize, preemptions: usize) {
        super::super::sync::model(preemptions, move || {
            let lock = Arc::new(TreeLock::new((0usize, false)));
            // Touched inside the lock only to give loom a place to switch threads there.
            let switch = Arc::new(AtomicU32::new(0));
            let done = Arc::new(AtomicBool::new(false));
            let clock = {
                let (lock, done) = (lock.clone(), done.clone());
                thread::spawn(move || {
                    while !done.load(Ordering::SeqCst) {
                        if lock.sleepers.load(Ordering::SeqCst) != 0
                            && !lock.locked.load(Ordering::SeqCst)
                        {
                            let _park = lock.park.lock().unwrap();
                            lock.wake.notify_all();
                        }
                        thread::yield_now();
                    }
                })
            };
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    let (lock, switch) = (lock.clone(), switch.clone());
                    thread::spawn(move || {
                        let mut g = lock.lock();
                        assert!(!g.1, "two threads inside the lock");
                        g.1 = true;
                        let v = g.0;
                        switch.fetch_add(1, Ordering::Relaxed);
                        g.0 = v + 1;
                        g.1 = false;
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            done.store(true, Ordering::SeqCst);
            clock.join().unwrap();
            assert_eq!(lock.lock().0, threads, "an update was lost");
            assert_eq!(lock.sleepers.load(Ordering::SeqCst), 0);
        });
    }

    /// Two threads: mutual exclusion, the value's accesses ordered by the lock, and both get in
    /// (through the spin, a wake-up, or the end of a nap after a missed wake-up).
    #[test]
    fn loom_two_threads_exclude_each_other_and_both_get_in() {
        model(2, 3);
    }

    /// Three threads: as above, with a sleeper woken while the third thread may hold the lock.
    #[test]
    fn loom_three_threads_exclude_each_other_and_all_get_in() {
        model(3, 2);
    }
}
