//! The crate's lock order, checked in debug builds (as wgpu-core ranks its locks).
//!
//! Three locks nest: an exec's state ([`Rank::Exec`], `Graph::state`), a stream's capture slot
//! ([`Rank::StreamSlot`]) and a graph tree's lock ([`Rank::Tree`]); they are taken in that order
//! (docs/design/captures.md, invariant 5), and two trees only by increasing tree id
//! (`lock_two`). Each acquisition of one of them records its rank, with the tree's id for a
//! tree, in a per-thread list; in a debug build, taking a lock whose (rank, id) is not greater
//! than every one the thread holds is a bug of the crate's, reported by a panic that names both,
//! before the thread can deadlock. Release builds record nothing: [`Held`] is empty there.
//! Non-blocking attempts (`try_lock`) cannot deadlock and are not ranked.

/// A rank in the lock order: a lock may only be taken while every lock the thread holds ranks
/// below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// `Graph::state`: launches, uploads and updates of one exec.
    Exec,
    /// `StreamHandle::capture`: which capture a stream records into.
    StreamSlot,
    /// `GraphHandle::lock`: a graph tree's driver objects and bookkeeping; ordered by tree id.
    Tree,
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: std::cell::RefCell<Vec<(Rank, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One ranked lock held by this thread, recorded until dropped (with the lock's guard).
#[derive(Debug)]
pub(crate) struct Held {
    #[cfg(debug_assertions)]
    entry: (Rank, u64),
}

impl Held {
    /// Records that this thread takes the lock of `rank` (`id`: the tree's id for a tree, else
    /// 0), checking it against the locks the thread holds (debug builds).
    #[inline]
    pub(crate) fn acquire(rank: Rank, id: u64) -> Held {
        #[cfg(debug_assertions)]
        {
            let entry = (rank, id);
            HELD.with(|held| {
                let mut held = held.borrow_mut();
                if let Some(worse) = held.iter().find(|h| **h >= entry) {
                    let worse = *worse;
                    // Unrecorded, so the unwinding guards of the locks held do not trip again.
                    drop(held);
                    panic!(
                        "cuda-graph lock order violated: taking {entry:?} while holding {worse:?} (the order is exec, stream slot, tree by increasing id; see src/driver/lock_rank.rs)"
                    );
                }
                held.push(entry);
            });
            Held { entry }
        }
        #[cfg(not(debug_assertions))]
        {
            let _ = (rank, id);
            Held {}
        }
    }
}

#[cfg(debug_assertions)]
impl Drop for Held {
    fn drop(&mut self) {
        // Guards may be dropped in any order: the latest record of this lock goes.
        let _ = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            if let Some(i) = held.iter().rposition(|h| *h == self.entry) {
                held.remove(i);
            }
        });
    }
}

/// A lock guard with its rank recorded ([`Held`]); derefs to what the guard derefs to. The guard
/// is released before the record (field order).
pub(crate) struct Ranked<G> {
    guard: G,
    _held: Held,
}

impl<G> Ranked<G> {
    /// Takes a lock of `rank` through `lock`, checking the order first (so a violation is
    /// reported before the thread could block).
    #[inline]
    pub(crate) fn take(rank: Rank, id: u64, lock: impl FnOnce() -> G) -> Ranked<G> {
        let held = Held::acquire(rank, id);
        Ranked {
            guard: lock(),
            _held: held,
        }
    }
}

impl<G: std::ops::Deref> std::ops::Deref for Ranked<G> {
    type Target = G::Target;
    #[inline]
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: std::ops::DerefMut> std::ops::DerefMut for Ranked<G> {
    #[inline]
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

impl<G: std::fmt::Debug> std::fmt::Debug for Ranked<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_order_pass_and_are_forgotten_when_released() {
        let exec = Held::acquire(Rank::Exec, 0);
        let slot = Held::acquire(Rank::StreamSlot, 0);
        let first = Held::acquire(Rank::Tree, 3);
        let second = Held::acquire(Rank::Tree, 7);
        drop(slot);
        drop(first);
        drop(second);
        drop(exec);
        // Everything released: any order may start again.
        let _tree = Held::acquire(Rank::Tree, 1);
        HELD.with(|h| assert_eq!(h.borrow().len(), 1));
    }

    #[test]
    fn a_lock_taken_against_the_order_panics_naming_both() {
        for (first, then) in [
            ((Rank::Tree, 1), (Rank::StreamSlot, 0)),
            ((Rank::StreamSlot, 0), (Rank::Exec, 0)),
            ((Rank::Tree, 7), (Rank::Tree, 3)),
            ((Rank::Tree, 5), (Rank::Tree, 5)),
            ((Rank::StreamSlot, 0), (Rank::StreamSlot, 0)),
        ] {
            let r = std::thread::spawn(move || {
                let _a = Held::acquire(first.0, first.1);
                let _b = Held::acquire(then.0, then.1);
            })
            .join();
            let msg = r.expect_err("must panic");
            let msg = msg
                .downcast_ref::<String>()
                .expect("a formatted message")
                .clone();
            assert!(msg.contains("lock order violated"), "{msg}");
            assert!(msg.contains(&format!("{then:?}")), "{msg}");
        }
    }
}
