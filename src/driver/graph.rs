//! Graph and graph-exec handles.

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::PrimaryContext;

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
use std::sync::atomic::{AtomicBool, Ordering};

use super::release::{self, SendPtr};
use super::{drv, drv_drop};
use crate::error::Result;

/// A `CUgraph`: owned (destroyed on drop) or a body owned by a node of another graph, which this
/// handle then keeps alive.
#[derive(Debug)]
pub struct GraphHandle {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) raw: sys::CUgraph,
    /// A process-unique id (raw pointers can be reused after a graph is destroyed).
    pub(crate) id: u64,
    /// `Some` for a graph owned by a node of `owner` (conditional bodies): never destroyed here.
    owner: Option<Arc<GraphHandle>>,
    /// Set when the driver destroyed the graph itself (an invalidated capture into it).
    disowned: AtomicBool,
}

// SAFETY: CUgraph handles may be used from any thread; this crate never mutates a graph from two
// threads at once (mutation goes through `&mut` or through a capture owned by one builder).
unsafe impl Send for GraphHandle {}
// SAFETY: as above.
unsafe impl Sync for GraphHandle {}

impl GraphHandle {
    /// Creates an empty graph.
    pub(crate) fn create(ctx: &Arc<PrimaryContext>) -> Result<Arc<Self>> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the context is current; `raw` is a valid out pointer; flags must be 0.
        unsafe { drv!(cuGraphCreate(&mut raw, 0)) }?;
        Ok(Arc::new(Self::owned(ctx, raw)))
    }

    /// Wraps a graph this crate now owns.
    pub(crate) fn owned(ctx: &Arc<PrimaryContext>, raw: sys::CUgraph) -> Self {
        GraphHandle {
            ctx: ctx.clone(),
            raw,
            id: next_id(),
            owner: None,
            disowned: AtomicBool::new(false),
        }
    }

    /// Wraps a body graph owned by a node of `owner`.
    pub(crate) fn body(owner: &Arc<GraphHandle>, raw: sys::CUgraph) -> Arc<Self> {
        Arc::new(GraphHandle {
            ctx: owner.ctx.clone(),
            raw,
            id: next_id(),
            owner: Some(owner.clone()),
            disowned: AtomicBool::new(false),
        })
    }

    /// Records that the driver destroyed this graph (when a capture into it was invalidated and
    /// ended), so `Drop` must not destroy it again.
    pub(crate) fn disown(&self) {
        self.disowned.store(true, Ordering::Release);
    }

    /// The graph that owns this one's memory: itself, or the root of its owner chain.
    pub(crate) fn root(self: &Arc<Self>) -> Arc<GraphHandle> {
        match &self.owner {
            None => self.clone(),
            Some(o) => o.root(),
        }
    }
}

impl Drop for GraphHandle {
    fn drop(&mut self) {
        if self.owner.is_some() || self.disowned.load(Ordering::Acquire) {
            return;
        }
        let (ctx, raw) = (self.ctx.clone(), SendPtr(self.raw));
        release::destroy(move || {
            if ctx.bind().is_ok() {
                // SAFETY: an owned graph is destroyed exactly once, here. Execs instantiated from
                // it do not depend on it.
                unsafe { drv_drop!(cuGraphDestroy(raw.get())) };
            }
        });
    }
}

/// An owned `CUgraphExec`, destroyed on drop.
#[derive(Debug)]
pub(crate) struct ExecHandle {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) raw: sys::CUgraphExec,
}

// SAFETY: CUgraphExec handles may be used from any thread; the driver serialises launches of one
// exec. Update goes through `&mut Graph`.
unsafe impl Send for ExecHandle {}
// SAFETY: as above.
unsafe impl Sync for ExecHandle {}

impl Drop for ExecHandle {
    fn drop(&mut self) {
        let (ctx, raw) = (self.ctx.clone(), SendPtr(self.raw));
        release::destroy(move || {
            if ctx.bind().is_ok() {
                // SAFETY: the exec was wrapped once after a successful instantiate and is
                // destroyed exactly once, here. The driver defers the free until pending launches
                // finish, and the user objects it holds are released after that.
                unsafe { drv_drop!(cuGraphExecDestroy(raw.get())) };
            }
        });
    }
}
