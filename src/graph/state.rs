//! What the launches and updates of one exec share ([`ExecState`], behind the exec's lock), and
//! how what they held is released after the exec's last launch.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use super::device_graph::DeviceLaunchKeep;
use super::{lock, release_when_idle};
use crate::driver;
use crate::driver::graph::{ExecRef, IdMap, KeepChunk, NodeOwnersIndex, Owners};
use crate::error::{Error, Refusal, Result};
use crate::runtime::Stream;

/// What launches and updates of one exec share, behind one lock: CUDA does not synchronise an
/// exec object, so its launches, uploads and updates are serialised here.
#[derive(Default)]
pub(crate) struct ExecState {
    /// The graph it was instantiated from (its root): held until the last launch has finished,
    /// since what the graph owns (conditional handles, bodies) may be used by the exec.
    pub(crate) source: Option<ExecRef>,
    /// What the nodes of the graph it was instantiated from used.
    pub(super) keep: Vec<KeepChunk>,
    /// The source of the latest update, and what its nodes used then: the exec uses them.
    pub(crate) current: Option<(ExecRef, Vec<KeepChunk>)>,
    /// The stream of the latest launch. Every earlier launch is ordered before it on the device
    /// (see [`chain`](Self::chain)), so what is released after it was used by no launch still
    /// running.
    pub(super) last_stream: Option<Stream>,
    /// Recorded on the latest launch's stream when the next launch is on another stream, which
    /// waits for it: made on the first such launch.
    pub(super) chain: Option<Arc<crate::driver::event::EventHandle>>,
    /// Whether the exec was launched since the latest update.
    pub(super) launched_since_update: bool,
    /// Device addresses of allocation nodes with no free node: what a launch leaves allocated
    /// is freed when the exec is dropped, after its last launch.
    pub(super) unfreed: Vec<u64>,
    /// The source tree's epoch this exec was instantiated at: the nodes it has were made
    /// before it (see `NodeTable::born`).
    pub(crate) epoch: u64,
    /// What the parameters that per-node updates ([`Graph::set_params`]) put in the exec use,
    /// per node `(graph id, raw node)`: the current ones. Replaced ones are released after the
    /// last launch that may use them.
    pub(crate) node_owners: IdMap<(u64, usize), Owners>,
    /// The `ready` events of stream-ordered allocations (`Stream::alloc_async`) that the exec
    /// uses and that no launch of it has waited for yet: the next launch's stream waits on them
    /// first (later launches are ordered after it). Set at instantiation, update and per-node
    /// update.
    pub(crate) pending_ready: Vec<Arc<crate::driver::event::EventHandle>>,
    /// Whether the exec was instantiated for device launch.
    pub(super) device_launch: bool,
    /// Held while the exec lives if its graph has memory allocation nodes: the device's graph
    /// memory pool is trimmed only when the last such exec goes.
    pub(super) memory_user: Option<GraphMemoryUser>,
    /// Whether the graph the exec was made from has ever had a programmatic edge
    /// (`TreeState::programmatic`): its exec keeps such edges, so updates from any graph are
    /// refused (an update could put a kernel that does not wait behind one).
    pub(crate) programmatic: bool,
    /// What each explicit node of the source used at instantiation, so that a per-node update
    /// releases what the replaced parameters used (see [`InstantiatedNodes`]).
    pub(super) instantiated_nodes: Option<InstantiatedNodes>,
    /// Set once [`Graph::device_handle`] handed out a handle: device code may launch the exec
    /// whenever a graph holding the handle runs, so what the exec holds is released only after
    /// the last such holder is gone, and updates are refused.
    pub(super) device_keep: Option<Arc<DeviceLaunchKeep>>,
    /// The graph this exec was instantiated from (its raw handle; its tree is `source`'s) and
    /// that tree's [`shape`](crate::driver::graph::TreeState::shape) then, with its structure
    /// once read: the other side of [`latest`](Self::latest)'s pairing.
    pub(crate) instantiated: Instantiated,
    /// The source graph of the latest update from another tree, whose nodes per-node updates
    /// may name (see [`pairing`](crate::driver::graph::pairing)).
    pub(crate) latest: Option<Latest>,
}

/// The graph an exec was instantiated from, for [`pairing`](crate::driver::graph::pairing).
#[derive(Default)]
pub(crate) struct Instantiated {
    /// Its id and raw handle.
    pub(crate) id: u64,
    pub(crate) raw: usize,
    /// Its tree's [`shape`](crate::driver::graph::TreeState::shape) at the instantiation.
    pub(crate) shape: u64,
    /// Its structure, read on the first pairing (while `shape` still holds).
    pub(crate) read: Option<crate::driver::graph::pairing::Shape>,
    /// Whether the exec was updated from this graph after its structure changed: the driver
    /// paired the graph's nodes with the exec's by their places, which may no longer be those
    /// of the exec nodes instantiated from them, so the graph's nodes no longer name the exec's.
    pub(crate) restructured: bool,
}

/// The source of an exec's latest update from another tree, for
/// [`pairing`](crate::driver::graph::pairing).
pub(crate) struct Latest {
    /// The graph (its id and raw handle); its root is held in [`ExecState::current`].
    pub(crate) id: u64,
    pub(crate) raw: usize,
    /// Its tree's [`shape`](crate::driver::graph::TreeState::shape) at the update.
    pub(crate) shape: u64,
    /// Raw node of the graph → raw node of the instantiation graph, made on the first
    /// per-node update that names one of its nodes.
    pub(crate) pairs: Option<IdMap<usize, usize>>,
}

/// Live execs of this crate with memory allocation nodes, per device (`CUdevice`): the graph
/// memory pool they share keeps freed memory for their next launches.
static GRAPH_MEMORY_USERS: Mutex<Vec<(sys::CUdevice, usize)>> = Mutex::new(Vec::new());

/// One exec with memory allocation nodes on `device`, counted in [`GRAPH_MEMORY_USERS`].
#[derive(Debug)]
pub(crate) struct GraphMemoryUser {
    pub(super) device: sys::CUdevice,
}

impl GraphMemoryUser {
    pub(super) fn new(device: sys::CUdevice) -> Self {
        let mut users = lock(&GRAPH_MEMORY_USERS);
        match users.iter_mut().find(|(d, _)| *d == device) {
            Some((_, n)) => *n += 1,
            None => users.push((device, 1)),
        }
        GraphMemoryUser { device }
    }

    /// Stops counting this exec; whether it was the device's last.
    pub(super) fn leave(self) -> bool {
        let last = Self::uncount(self.device);
        std::mem::forget(self);
        last
    }

    /// Takes one exec off `device`'s count; whether none is left.
    pub(super) fn uncount(device: sys::CUdevice) -> bool {
        let mut users = lock(&GRAPH_MEMORY_USERS);
        match users.iter_mut().find(|(d, _)| *d == device) {
            Some((_, n)) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => true,
        }
    }
}

impl Drop for GraphMemoryUser {
    fn drop(&mut self) {
        Self::uncount(self.device);
    }
}

/// What the explicit nodes of an exec's source used when it was instantiated, per node: at first
/// the tree's shared owners chunk (also in [`ExecState::keep`]) with its index; on the first
/// per-node update the exec takes its own references to the chunk's values and lets go of the
/// chunk, then releases each value once no node of the exec that has not been given new
/// parameters uses it.
pub(super) enum InstantiatedNodes {
    Shared(KeepChunk, NodeOwnersIndex),
    Own {
        held: Vec<Option<crate::driver::graph::Owner>>,
        /// Per value of `held`: the nodes still using it.
        users: Vec<u32>,
        /// Node → the positions in `held` it uses.
        nodes: IdMap<(u64, usize), Vec<u32>>,
    },
}

impl InstantiatedNodes {
    /// Takes node `key`'s instantiation values out of this exec: those no other node of it uses
    /// are returned, for release after the last launch. Once, for the first update of the node
    /// (later ones replace what the per-node map holds). `keep` loses its reference to the
    /// shared chunk the first time.
    pub(super) fn release_node(
        &mut self,
        key: (u64, usize),
        keep: &mut Vec<KeepChunk>,
    ) -> Vec<crate::driver::graph::Owner> {
        if let InstantiatedNodes::Shared(chunk, index) = self {
            let held: Vec<_> = chunk.iter().cloned().map(Some).collect();
            let mut users = vec![0u32; held.len()];
            let mut nodes = IdMap::default();
            for &(k, start, len) in &index.nodes {
                let uses = index.uses[start as usize..(start + len) as usize].to_vec();
                for &u in &uses {
                    users[u as usize] += 1;
                }
                nodes.insert(k, uses);
            }
            if let Some(i) = keep.iter().position(|c| Arc::ptr_eq(c, chunk)) {
                keep.swap_remove(i);
            }
            *self = InstantiatedNodes::Own { held, users, nodes };
        }
        let InstantiatedNodes::Own { held, users, nodes } = self else {
            return Vec::new();
        };
        let mut released = Vec::new();
        for u in nodes.remove(&key).unwrap_or_default() {
            let n = &mut users[u as usize];
            *n = n.saturating_sub(1);
            if *n == 0 {
                released.extend(held[u as usize].take());
            }
        }
        released
    }
}

impl ExecState {
    /// Takes node `key`'s instantiation values out of the exec (see
    /// [`InstantiatedNodes::release_node`]).
    pub(crate) fn release_instantiated(
        &mut self,
        key: (u64, usize),
    ) -> Vec<crate::driver::graph::Owner> {
        match self.instantiated_nodes.as_mut() {
            Some(nodes) => nodes.release_node(key, &mut self.keep),
            None => Vec::new(),
        }
    }

    /// Adds stream-ordered allocations' `ready` events for the next launch to wait on, each once.
    pub(crate) fn add_pending_ready(
        &mut self,
        events: Vec<Arc<crate::driver::event::EventHandle>>,
    ) {
        for e in events {
            if !self.pending_ready.iter().any(|p| Arc::ptr_eq(p, &e)) {
                self.pending_ready.push(e);
            }
        }
    }

    /// Makes work queued next on `stream` wait for the pending `ready` events (see
    /// `pending_ready`); they stay pending, since the caller clears them only once the work that
    /// needed them is queued.
    pub(super) fn wait_pending_ready(&self, stream: sys::CUstream) -> Result<()> {
        for ready in &self.pending_ready {
            // SAFETY: the stream and the event are live; flags 0.
            unsafe { driver::stream::wait_event(stream, ready.raw, 0) }?;
        }
        Ok(())
    }

    /// Orders a launch about to be made on `stream` after the latest launch, where that was on
    /// another stream: records [`chain`](Self::chain) on the latest launch's stream and returns
    /// it for `stream` to wait on before the launch (`None` where the stream is the same). The
    /// releases of what updates replace are queued behind the latest launch only, so every
    /// earlier launch, on whatever stream, must be ordered before it by the crate itself, not
    /// left to the driver. Refused while the latest launch's stream captures (an event recorded
    /// there would be captured).
    pub(super) fn chain_to(
        &mut self,
        ctx: &Arc<crate::driver::context::PrimaryContext>,
        stream: &Stream,
    ) -> Result<Option<Arc<crate::driver::event::EventHandle>>> {
        let Some(last) = self.last_stream.as_ref() else {
            return Ok(None);
        };
        if last.raw() == stream.raw() {
            return Ok(None);
        }
        let event = match &self.chain {
            Some(e) => e.clone(),
            None => {
                let e = crate::driver::event::EventHandle::new(ctx)?;
                self.chain = Some(e.clone());
                e
            }
        };
        last.enqueue(|rec| {
            if rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Capture,
                    "this exec's latest launch was on a stream that is capturing now: a launch on another stream must be ordered after it; launch on that stream, or after its capture ends",
                ));
            }
            // SAFETY: the event and the stream are live, of the exec's context (launches are on
            // streams of the exec's device); the stream is not capturing (checked under its slot).
            unsafe { driver::stream::record_event(event.raw, last.raw()) }
        })?;
        Ok(Some(event))
    }

    /// Refuses an update of an exec that device code may be launching.
    pub(crate) fn check_not_device_launched(&self) -> Result<()> {
        if self.device_keep.is_some() {
            return Err(Error::invalid(
                Refusal::Unsupported,
                "this exec handed out a device handle (Graph::device_handle): device code may be launching it, so it cannot be updated; instantiate a new exec instead",
            ));
        }
        Ok(())
    }

    /// Releases `held` on the release thread once the latest launch has finished (a host
    /// function queued behind it), or at once if there was no launch.
    pub(crate) fn release_after_last_launch(&mut self, held: Box<dyn std::any::Any + Send>) {
        self.release_after_last_launch_from(held, Caller::Locked);
    }

    /// [`release_after_last_launch`](Self::release_after_last_launch); with [`Caller::Free`]
    /// (the caller holds no lock of this crate), `held` is dropped here and now when the latest
    /// launch has already finished.
    pub(super) fn release_after_last_launch_from(
        &mut self,
        held: Box<dyn std::any::Any + Send>,
        caller: Caller,
    ) {
        if crate::driver::release::in_host_callback() {
            // Dropped inside a host callback (a driver thread): no CUDA call here, and not even
            // the stream's slot (a thread holding it may be waiting for this very callback).
            let job: crate::driver::release::Job = Box::new(move || drop(held));
            match self.last_stream.clone() {
                Some(stream) => release_when_idle(stream, job),
                None => crate::driver::release::later(job),
            }
            return;
        }
        let Some(stream) = self.last_stream.clone() else {
            match caller {
                Caller::Free => release_unused(held),
                Caller::Locked => crate::driver::release::later(Box::new(move || drop(held))),
            }
            return;
        };
        // The stream query and the release made here run in `Relaxed` capture interaction mode,
        // as on the release thread (see `release_unused`).
        let _relaxed = (caller == Caller::Free).then(crate::driver::release::RelaxedMode::enter);
        let mut held = Some(held);
        let mut job: Option<crate::driver::release::Job> = None;
        let mut finished = false;
        let _ = stream.enqueue(|rec| {
            if rec.capturing() {
                return Ok(());
            }
            if caller == Caller::Free && crate::driver::release::stream_idle_now(stream.raw()) {
                finished = true;
                return Ok(());
            }
            if let Some(h) = held.take() {
                let j: crate::driver::release::Job = Box::new(move || drop(h));
                if let Err((e, j)) = crate::driver::release::after_stream(stream.raw(), j) {
                    job = Some(j);
                    return Err(e);
                }
            }
            Ok(())
        });
        match (held, job) {
            // Destroying on the thread that drops, rather than on the release thread, keeps the
            // driver from doing the work twice over: raw driver calls that destroy each exec
            // and its graph on a second thread took twice as long per capture cycle and grew
            // the host heap (measured on the H200, driver 13.0).
            (Some(held), _) if finished => drop_here(held),
            (Some(held), _) => release_when_idle(stream, Box::new(move || drop(held))),
            // The driver refused the host function (on a host callback's thread, say).
            (None, Some(job)) => release_when_idle(stream, job),
            (None, None) => {}
        }
    }
}

/// Who asks for a release: a caller that holds none of this crate's locks, so that what is
/// released may be dropped on its thread (a `Drop` there may call back into the crate), or one
/// that holds some.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    Free,
    Locked,
}

/// Releases what no launch can use, for a caller that holds none of this crate's locks: on this
/// thread when it may destroy now, else on the release thread. It runs in `Relaxed` capture
/// interaction mode, as on the release thread: a destructor among the released values (a cudarc
/// slice freeing its memory) must not invalidate a `Global` capture of another thread.
pub(super) fn release_unused(held: Box<dyn std::any::Any + Send>) {
    let _relaxed = crate::driver::release::RelaxedMode::enter();
    if crate::driver::release::thread_may_destroy() {
        drop_here(held);
    } else {
        crate::driver::release::later(Box::new(move || drop(held)));
    }
}

/// Runs a release on this thread; a panicking `Drop` in it is contained, as on the release
/// thread. Releases nested deeper than a few levels (a graph whose callback owns a graph whose
/// callback owns a graph …) go to the release thread instead, so a long chain cannot overflow
/// this thread's stack.
pub(super) fn drop_here(held: Box<dyn std::any::Any + Send>) {
    const MAX_DEPTH: u32 = 8;
    thread_local! {
        static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    if DEPTH.with(|d| d.get()) >= MAX_DEPTH {
        crate::driver::release::later(Box::new(move || drop(held)));
        return;
    }
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    let _leave = Leave;
    crate::driver::release::contain(move || drop(held));
}
