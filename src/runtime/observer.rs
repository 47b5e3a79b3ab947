//! [`ReleaseObserver`]: watching, without keeping alive, a resource that graphs hold.

use std::any::Any;
use std::sync::{Arc, Weak};

/// Watches a resource of this crate (a buffer's allocation, an event, a module, a graph) without
/// keeping it alive: [`is_released`](Self::is_released) turns `true` once every owner — the
/// user's handles, graph definitions and execs — has let go and the resource is freed.
///
/// Graphs and execs release what they hold on the crate's release thread, shortly after the last
/// of them is dropped and its pending launches have finished; poll for it. `Send + Sync`.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(device: &Device) -> cuda_graph::Result<()> {
/// let buf = device.alloc_zeroed::<i32>(16)?;
/// let watch = buf.release_observer();
/// drop(buf);
/// assert!(watch.is_released()); // no graph held it
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ReleaseObserver {
    weak: Weak<dyn Any + Send + Sync>,
}

impl ReleaseObserver {
    pub(crate) fn new<T: Any + Send + Sync>(owner: &Arc<T>) -> Self {
        let weak: Weak<T> = Arc::downgrade(owner);
        ReleaseObserver { weak }
    }

    /// Whether the resource has been freed.
    ///
    /// ```no_run
    /// # fn f(watch: &cuda_graph::ReleaseObserver) {
    /// while !watch.is_released() {
    ///     std::thread::sleep(std::time::Duration::from_millis(1));
    /// }
    /// # }
    /// ```
    pub fn is_released(&self) -> bool {
        self.weak.strong_count() == 0
    }

    /// How many owners (handles, graphs, execs) share the resource now; `0` once released.
    ///
    /// ```no_run
    /// # fn f(watch: &cuda_graph::ReleaseObserver) {
    /// println!("{} owners", watch.share_count());
    /// # }
    /// ```
    pub fn share_count(&self) -> usize {
        self.weak.strong_count()
    }
}

impl std::fmt::Debug for ReleaseObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseObserver")
            .field("share_count", &self.share_count())
            .finish()
    }
}

static_assertions::assert_impl_all!(ReleaseObserver: Send, Sync, Clone, std::fmt::Debug);
