//! The synchronisation primitives of the tree lock ([`super::tree_lock`]) and of the destroy
//! hand-off ([`super::handoff`]): `std`'s, or the `loom` model checker's when built with
//! `--cfg cuda_graph_loom` (see docs/design/destruction.md, "Model-checking the tree lock and the hand-off"). Ordinary
//! builds get `std`'s types themselves, and a cell whose accessors are `UnsafeCell::get`
//! inlined: nothing is added to the code that uses them.

#[cfg(cuda_graph_loom)]
pub(crate) use loom::hint::spin_loop;
#[cfg(cuda_graph_loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicBool, AtomicU32, AtomicUsize},
    Condvar, Mutex, MutexGuard, RwLock,
};
#[cfg(not(cuda_graph_loom))]
pub(crate) use std::hint::spin_loop;
pub(crate) use std::sync::atomic::Ordering;
#[cfg(not(cuda_graph_loom))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicU32, AtomicUsize},
    Condvar, Mutex, RwLock,
};

/// Locks `m`, taking its value as it is where a panic poisoned it: the crate's state behind its
/// mutexes is consistent at every point a user's code (a callback, a `Drop`) can panic, so a
/// poisoned lock is never a reason to fail or panic. The one lock helper of the crate's `std`
/// mutexes.
#[inline]
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`lock`] for this module's `Mutex` (loom's under `--cfg cuda_graph_loom`, else `std`'s, where
/// it is `lock` itself).
#[cfg(cuda_graph_loom)]
#[inline]
pub(crate) fn lock_model<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
#[cfg(not(cuda_graph_loom))]
pub(crate) use lock as lock_model;

/// `std::thread_local!` with `const` initialisers, or loom's (fresh in every execution of a
/// model) under `--cfg cuda_graph_loom`.
macro_rules! thread_local_const {
    ($($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;)*) => {
        #[cfg(not(cuda_graph_loom))]
        std::thread_local! { $($(#[$attr])* static $name: $t = const { $init };)* }
        #[cfg(cuda_graph_loom)]
        loom::thread_local! { $($(#[$attr])* static $name: $t = $init;)* }
    };
}
pub(crate) use thread_local_const;

/// `std::cell::UnsafeCell` with the pointer taken for reading or for writing. Under loom each
/// access is recorded, so that two accesses not ordered by the lock are reported as a race.
#[cfg(not(cuda_graph_loom))]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(cuda_graph_loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }

    /// A pointer to the value, to read through.
    #[inline(always)]
    pub(crate) fn read(&self) -> *const T {
        self.0.get()
    }

    /// A pointer to the value, to write through.
    #[inline(always)]
    pub(crate) fn write(&self) -> *mut T {
        self.0.get()
    }
}

#[cfg(cuda_graph_loom)]
pub(crate) struct UnsafeCell<T>(loom::cell::UnsafeCell<T>);

#[cfg(cuda_graph_loom)]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        UnsafeCell(loom::cell::UnsafeCell::new(value))
    }

    pub(crate) fn get_mut(&mut self) -> &mut T {
        // SAFETY: `&mut self` is the only access.
        self.0.with_mut(|p| unsafe { &mut *p })
    }

    /// A pointer to the value, to read through; loom records a read now.
    pub(crate) fn read(&self) -> *const T {
        self.0.with(|p| p)
    }

    /// A pointer to the value, to write through; loom records a write now.
    pub(crate) fn write(&self) -> *mut T {
        self.0.with_mut(|p| p)
    }
}

/// Runs the loom model `f` over every interleaving that preempts threads at most `preemptions`
/// times in all (`LOOM_MAX_PREEMPTIONS` overrides it; unbounded, the larger models take
/// minutes to hours). The bounds the models pass here keep the whole run near a minute.
#[cfg(all(test, cuda_graph_loom))]
pub(crate) fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(preemptions);
    builder.check(f);
}
