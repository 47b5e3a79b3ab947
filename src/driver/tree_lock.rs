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

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How long a thread waiting for the lock sleeps before it looks again, woken or not.
const NAP: Duration = Duration::from_millis(1);

/// How many times a thread that finds the lock taken looks again before it sleeps.
const SPINS: u32 = 64;

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
    /// Where the value starts in the lock (for layout checks).
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
        }
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
            std::hint::spin_loop();
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
            // wait below began. One that read it before sleeps out the nap.
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
}

impl<T> Deref for TreeGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock: no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for TreeGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
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

#[cfg(test)]
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
