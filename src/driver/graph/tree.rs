//! Graph and graph-exec handles, and the state a graph tree's lock guards.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use cudarc::driver::sys;

use crate::driver::context::PrimaryContext;
use crate::driver::release;
use crate::driver::tree_lock::{TreeGuard, TreeLock};
use crate::driver::{drv, drv_drop};
use crate::error::{Error, Refusal, Result};

use super::node_table::{search_owners, IdMap, IdSet, KeepChunk, NodeTable, Owner};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A process-unique id, for graphs and captures.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A `CUgraph`: owned (destroyed on drop) or a body owned by a node of another graph, which this
/// handle then keeps alive.
///
/// Laid out in declaration order from a cache line's start (`repr(C, align(64))`): the fields a
/// node reads, then the tree's lock and the hot fields of its state, fill the first cache lines
/// (see `TreeState`).
#[derive(Debug)]
#[repr(C, align(64))]
pub struct GraphHandle {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) raw: sys::CUgraph,
    /// A process-unique id (raw pointers can be reused after a graph is destroyed).
    pub(crate) id: u64,
    /// `Some` for a graph owned by a node of `owner` (conditional bodies, and graphs embedded by
    /// child-graph nodes): never destroyed here.
    owner: Option<Arc<GraphHandle>>,
    /// Whether this is the graph a child-graph node of `owner` runs (not a conditional body).
    embedded: bool,
    /// Set when the driver destroyed the graph itself (an invalidated capture into it).
    disowned: AtomicBool,
    /// CUDA graph objects are not internally synchronised: every driver call that reads or
    /// mutates a graph runs under its tree's lock ([`GraphHandle::lock`]). Only the root's is
    /// used; a conditional body takes its root's, since instantiating the root reads the bodies.
    tree: TreeLock<TreeState>,
    /// How many of the strong references to this graph are held by execs ([`ExecRef`]): where
    /// they are all that is left, no one can instantiate, copy or read the tree again, and what
    /// its nodes use can go (execs hold their own snapshots).
    exec_holds: AtomicUsize,
}

/// A graph (a tree's root) held by an exec: for the raw graph and the node table that per-node
/// updates name the exec's nodes through, not for what the nodes use (the exec holds its own
/// snapshot of that). Counted in the graph's `exec_holds`.
#[derive(Debug)]
pub(crate) struct ExecRef(Arc<GraphHandle>);

impl ExecRef {
    pub(crate) fn new(graph: Arc<GraphHandle>) -> Self {
        graph.exec_holds.fetch_add(1, Ordering::AcqRel);
        ExecRef(graph)
    }
}

impl std::ops::Deref for ExecRef {
    type Target = Arc<GraphHandle>;
    fn deref(&self) -> &Arc<GraphHandle> {
        &self.0
    }
}

impl Drop for ExecRef {
    fn drop(&mut self) {
        self.0.exec_holds.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A user's handle of a graph: what a `GraphDefinition` (a definition, or a view of a body, an
/// embedded graph or an ended builder's graph) holds. When the last user's handle of a tree goes
/// while execs hold it, the tree lets go of what its nodes use ([`GraphHandle::user_left`]).
pub(crate) struct UserGraph(std::mem::ManuallyDrop<Arc<GraphHandle>>);

impl UserGraph {
    pub(crate) fn new(graph: Arc<GraphHandle>) -> Self {
        UserGraph(std::mem::ManuallyDrop::new(graph))
    }
}

impl std::ops::Deref for UserGraph {
    type Target = Arc<GraphHandle>;
    fn deref(&self) -> &Arc<GraphHandle> {
        &self.0
    }
}

impl Drop for UserGraph {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again (this is its owner's drop).
        let graph = unsafe { std::mem::ManuallyDrop::take(&mut self.0) };
        let root = graph.root();
        if !root.exec_held() {
            return;
        }
        let root_weak = Arc::downgrade(&root);
        drop((root, graph));
        GraphHandle::user_left(root_weak);
    }
}

/// Forgets the handles in `views` that are gone, and a dead graph (in `dead`) none of whose
/// handles is left, from both: nothing can name it any more (node tokens are checked against a
/// live handle's graph and the node table, which forgot the dead graph's nodes when it died).
/// A graph still alive keeps its entry, empty or not, until it dies: every graph a node owns
/// gets one when its first handle is made ([`GraphHandle::node_owned`]), so a dead graph with
/// no entry never had such a handle (a primary capture's graph freed by a failed end) and stays
/// in `dead`.
fn prune_views<T>(views: &mut IdMap<u64, Vec<Weak<T>>>, dead: &mut IdSet<u64>) {
    views.retain(|id, handles| {
        handles.retain(|h| h.strong_count() > 0);
        !(handles.is_empty() && dead.remove(id))
    });
}

/// A conditional node as this crate made it: its handle, type and bodies.
#[derive(Debug, Clone)]
pub(crate) struct CondRecord {
    /// The handle's raw value and the id of the graph it was created in.
    pub(crate) handle: (u64, u64),
    /// `CUgraphConditionalNodeType` as the integer it is (0 IF, 1 WHILE, 2 SWITCH).
    pub(crate) ty: u32,
    /// The bodies: the id their views carry and the raw graph.
    pub(crate) bodies: Vec<(u64, usize)>,
}

impl CondRecord {
    /// A record with only body ids (for tests of the bookkeeping).
    #[cfg(test)]
    pub(crate) fn with_bodies(ids: &[u64]) -> Self {
        CondRecord {
            handle: (0, 0),
            ty: 0,
            bodies: ids.iter().map(|&id| (id, 0)).collect(),
        }
    }

    /// Whether graph `id` is one of the bodies.
    pub(crate) fn owns_body(&self, id: u64) -> bool {
        self.bodies.iter().any(|&(b, _)| b == id)
    }
}

/// A set of addresses: a short inline list while it holds few (a capture usually keeps a module
/// and a few buffers), so a tree that keeps little allocates no hash table for it; a hash set
/// once it holds more.
#[derive(Debug, Default)]
struct KeptSet {
    few: [usize; KeptSet::FEW],
    len: usize,
    many: IdSet<usize>,
}

impl KeptSet {
    const FEW: usize = 8;

    /// Adds `addr`; whether it was not in the set.
    fn insert(&mut self, addr: usize) -> bool {
        if !self.many.is_empty() {
            return self.many.insert(addr);
        }
        if self.few[..self.len].contains(&addr) {
            return false;
        }
        if self.len < Self::FEW {
            self.few[self.len] = addr;
            self.len += 1;
            return true;
        }
        // The list is full: from now on the hash set holds everything.
        self.many.extend(self.few);
        self.many.insert(addr)
    }
}

/// The stream captures recording into graphs of a tree now, as (capture id, graph id) pairs: a
/// short list, since a tree rarely has more than one or two (a parent's and a body's), kept
/// inline so that beginning and ending a capture allocate nothing for it.
#[derive(Debug, Default)]
pub(crate) struct Captures(smallvec::SmallVec<[(u64, u64); 2]>);

impl Captures {
    /// Whether capture `id` records into the tree.
    pub(crate) fn contains_key(&self, id: &u64) -> bool {
        self.0.iter().any(|(c, _)| c == id)
    }

    /// Whether no capture records into the tree.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The graphs captured into, one per capture.
    pub(crate) fn values(&self) -> impl Iterator<Item = &u64> {
        self.0.iter().map(|(_, g)| g)
    }

    /// Notes that capture `id` records into `graph`.
    fn insert(&mut self, id: u64, graph: u64) {
        match self.0.iter_mut().find(|(c, _)| *c == id) {
            Some(entry) => entry.1 = graph,
            None => self.0.push((id, graph)),
        }
    }

    /// Forgets capture `id`.
    fn remove(&mut self, id: &u64) {
        if let Some(i) = self.0.iter().position(|(c, _)| c == id) {
            self.0.swap_remove(i);
        }
    }
}

#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct TreeState {
    // Laid out in declaration order (`repr(C)`) behind the lock word, in `GraphHandle`'s first
    // line (`epoch`, `recent_next`, `unusual`: what an explicit node checks); then a line of
    // what a captured launch reads (`dead`, `recent`); then `captures` and `broken`, read only
    // when `unusual` is set; then the node table's two hot lines. Checked below.
    /// Counts instantiations of this tree: each exec records the epoch it was made at, and each
    /// node the epoch it was made at (see [`NodeTable::born`]), so that an exec can tell the
    /// nodes it was instantiated with from nodes added later.
    pub(crate) epoch: u64,
    /// The next slot of `recent` to overwrite.
    recent_next: u32,
    /// Whether anything below can refuse a node: a capture records into the tree, a graph of it
    /// is dead, or it is broken (`captures`, `dead` and `broken` are changed only through
    /// methods that keep this flag). A node added explicitly reads this one byte in the lock's
    /// line instead of three fields on two further lines.
    unusual: bool,
    /// Graphs the driver freed: bodies whose conditional node was destroyed, and graphs a failed
    /// capture into destroyed.
    dead: IdSet<u64>,
    /// The addresses kept last (a small ring): a capture that launches the same kernel on the
    /// same buffers again and again skips the hash.
    recent: [usize; 4],
    /// Stream captures recording into graphs of this tree now: capture id → graph id.
    /// Definitions refuse a graph being captured into; instantiation, update, embedding and
    /// cloning refuse the whole tree while any capture records (a leaked body builder's capture
    /// never ends).
    captures: Captures,
    /// Why the tree can no longer be used, if the driver broke it: a conditional body's capture
    /// was invalidated, and the driver destroyed the body graph that a node of this tree owns.
    /// Instantiating, destroying the node, or destroying the root graph then crash inside the
    /// driver, so the crate refuses the first two and leaks the root graph.
    broken: Option<String>,
    /// Live nodes known to this crate. A node token is valid only while its slot holds it, so
    /// a destroyed node (whose address the driver may reuse) is never mistaken for a new one.
    pub(crate) nodes: NodeTable,
    /// The epoch at which the latest capture into this tree ended: every node a capture made was
    /// made at or before it (while a capture records, [`TreeState::epoch`] is the bound).
    pub(crate) captured_epoch: u64,
    /// Operands used by captured nodes of this tree (and what clones and captured embeds hold),
    /// added since the last [`TreeState::snapshot`]. Nodes added explicitly hold theirs in
    /// [`TreeState::nodes`], so that destroying a node releases what it used. The first two
    /// (a captured launch's module and buffer) stay inline: a capture allocates nothing for them.
    pending: smallvec::SmallVec<[Owner; 2]>,
    /// Addresses of everything this tree holds, so each is held once.
    kept: KeptSet,
    /// Earlier operands, in chunks shared with the execs instantiated from this tree: an exec
    /// holds the chunks that existed when it was made.
    chunks: Vec<KeepChunk>,
    /// Conditional nodes this crate created: `(graph id, raw node)` → their handle, type and the
    /// body graphs they own (destroying the node marks those dead; reading it back reports them).
    pub(crate) conditionals: IdMap<(u64, usize), CondRecord>,
    /// Child-graph nodes whose graph was looked at (`GraphDefinition::inspect`): `(graph id, raw
    /// node)` → the id its views carry, so that destroying the node marks them dead.
    pub(crate) embedded: IdMap<(u64, usize), u64>,
    /// Held until a capture ends (capture id → values): events recorded and streams joined into
    /// it, which the driver refers to while the capture records.
    pub(crate) until_end: IdMap<u64, Vec<Arc<dyn Any + Send + Sync>>>,
    /// Memory allocation nodes with no free node in the graph: `(graph id, raw node)` → the
    /// device address. Each exec frees what is still allocated when it is dropped.
    pub(crate) unfreed: IdMap<(u64, usize), u64>,
    /// Kernel nodes that use an allocation through a `GraphBuffer`: `(graph id, raw allocation
    /// node)` → the raw nodes, which its free node must run after.
    pub(crate) memory_users: IdMap<(u64, usize), Vec<usize>>,
    /// Graphs holding memory allocation (and so free) nodes. CUDA forbids deleting nodes or
    /// edges of such a graph: `destroy_node` and `remove_edge` refuse it.
    pub(crate) memory_graphs: IdSet<u64>,
    /// The handles made for graphs owned by nodes of this tree (bodies, embedded graphs), by
    /// graph id: once none of a dead graph's handles is alive, nothing can name it again, and
    /// its id leaves `dead` (see [`TreeState::prune_views`]).
    views: IdMap<u64, Vec<Weak<GraphHandle>>>,
    /// `views` and `dead` are pruned when together they grow past this.
    prune_at: usize,
    /// Counts changes to the graphs' structure: nodes made or destroyed, edges added or
    /// removed, captures ended. An exec records it when it is instantiated or updated, and pairs
    /// an update's source with its nodes only while neither graph changed since
    /// ([`pairing`](super::pairing)).
    pub(crate) shape: u64,
    /// Whether a programmatic edge was ever made in a graph of this tree (a dependent kernel
    /// node, or a dependent launch captured). From then on, a kernel node that follows another
    /// programmatically takes parameters only of a dependent kernel, and the edge is not
    /// removed while both nodes live (`check_programmatic`, `destroy_node`, `remove_edge`):
    /// an exec made earlier keeps the edge, whatever the definition does later.
    pub(crate) programmatic: bool,
}

// The cache-line plan above (`GraphHandle` starts on a line: `repr(C, align(64))`). Loom's
// atomics (`--cfg cuda_graph_loom`, src/driver/sync.rs) are larger than `std`'s. The node
// table's own lines are checked beside it (src/driver/graph/node_table.rs).
#[cfg(not(cuda_graph_loom))]
const _: () = {
    use std::mem::offset_of;
    let state = offset_of!(GraphHandle, tree) + TreeLock::<TreeState>::VALUE_OFFSET;
    assert!(state == 48);
    assert!(state + offset_of!(TreeState, dead) == 64);
    assert!(state + offset_of!(TreeState, captures) == 128);
    assert!(state + offset_of!(TreeState, nodes) == 192);
};

impl TreeState {
    /// The latest epoch at which a node not registered yet (made by a capture or a clone) can
    /// have been made: nodes this crate adds itself are registered when they are made.
    pub(crate) fn unregistered_born(&self) -> u64 {
        if self.captures.is_empty() {
            self.captured_epoch
        } else {
            self.epoch
        }
    }

    /// Whether anything can refuse a node: a capture records into the tree, a graph of it is
    /// dead, or it is broken. `false` in the usual case, read from the lock's cache line.
    #[inline]
    pub(crate) fn unusual(&self) -> bool {
        debug_assert_eq!(
            self.unusual,
            self.broken.is_some() || !self.captures.is_empty() || !self.dead.is_empty()
        );
        self.unusual
    }

    fn note_unusual(&mut self) {
        self.unusual = self.broken.is_some() || !self.captures.is_empty() || !self.dead.is_empty();
    }

    /// Captures recording into graphs of this tree now: capture id → graph id.
    pub(crate) fn captures(&self) -> &Captures {
        &self.captures
    }

    /// Records that capture `id` records into graph `graph` from now on.
    pub(crate) fn add_capture(&mut self, id: u64, graph: u64) {
        self.captures.insert(id, graph);
        self.note_unusual();
    }

    /// Records that capture `id` ended.
    pub(crate) fn remove_capture(&mut self, id: u64) {
        self.captures.remove(&id);
        self.note_unusual();
    }

    /// Graphs of this tree that the driver freed.
    pub(crate) fn dead(&self) -> &IdSet<u64> {
        &self.dead
    }

    /// Records that the driver freed the graphs `ids`.
    pub(crate) fn mark_dead(&mut self, ids: impl IntoIterator<Item = u64>) {
        self.dead.extend(ids);
        self.maybe_prune_views();
        self.note_unusual();
    }

    /// Records `view`, a handle just made for a graph owned by a node of this tree (under the
    /// tree's lock, so that the graph cannot die unseen in between).
    fn register_view(&mut self, view: &Arc<GraphHandle>) {
        self.views
            .entry(view.id)
            .or_default()
            .push(Arc::downgrade(view));
        self.maybe_prune_views();
    }

    /// [`prune_views`](Self::prune_views) once `views` and `dead` have doubled since the last
    /// time: amortised constant time per view made or graph freed.
    fn maybe_prune_views(&mut self) {
        if self.views.len() + self.dead.len() > self.prune_at.max(64) {
            prune_views(&mut self.views, &mut self.dead);
            self.prune_at = 2 * (self.views.len() + self.dead.len());
            self.note_unusual();
        }
    }

    /// Why the tree can no longer be used, if the driver broke it.
    pub(crate) fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Marks the tree broken with the reason `why` makes, unless it already is.
    pub(crate) fn break_with(&mut self, why: impl FnOnce() -> String) {
        self.broken.get_or_insert_with(why);
        self.note_unusual();
    }

    /// Whether the driver freed `graph` or a graph it belongs to (a body's or child's owner).
    /// The usual answer (no graph of the tree was freed) is one inline test.
    #[inline]
    pub(crate) fn is_dead(&self, graph: &GraphHandle) -> bool {
        !self.dead.is_empty() && self.is_dead_in_chain(graph)
    }

    /// [`is_dead`](Self::is_dead) once some graph of the tree was freed.
    #[inline(never)]
    fn is_dead_in_chain(&self, graph: &GraphHandle) -> bool {
        graph.any_in_chain(|id| self.dead.contains(&id))
    }

    /// Whether a capture records into graph `graph_id` now.
    pub(crate) fn is_capturing_into(&self, graph_id: u64) -> bool {
        self.captures.values().any(|g| *g == graph_id)
    }

    /// Something this tree holds that `pred` picks: first among what node `(graph, raw, serial)`
    /// holds, then among everything the tree holds (a copy's or a capture's operands, which are
    /// held per graph, not per node), looking inside shared chunks. For read-back, not a hot
    /// path.
    pub(crate) fn find_owner(
        &self,
        graph: u64,
        raw: usize,
        serial: u64,
        pred: &mut dyn FnMut(&Owner) -> bool,
    ) -> Option<Owner> {
        if let Some(found) = self
            .nodes
            .owners_of(graph, raw, serial)
            .and_then(|own| search_owners(own, pred))
        {
            return Some(found);
        }
        search_owners(self.pending.iter(), pred)
            .or_else(|| search_owners(self.chunks.iter().flat_map(|c| c.iter()), pred))
            .or_else(|| search_owners(self.nodes.all_owners(), pred))
    }

    /// Records the memory allocation node `(graph, raw)` of address `ptr`: execs free it when
    /// they are dropped until a free node takes it, and its graph refuses node and edge
    /// removals from now on.
    pub(crate) fn note_allocation(&mut self, graph: u64, raw: usize, ptr: u64) {
        self.unfreed.insert((graph, raw), ptr);
        self.memory_graphs.insert(graph);
    }

    /// Holds `value` for as long as the tree (and, once flushed, every exec made from it) lives.
    /// The same `Arc` is held once.
    #[inline]
    pub(crate) fn keep<T: Any + Send + Sync>(&mut self, value: &Arc<T>) {
        self.keep_at(Arc::as_ptr(value) as *const () as usize, || value.clone());
    }

    /// Holds a value shared as `Arc<dyn Any>` (a kernel argument's owner).
    #[inline]
    pub(crate) fn keep_dyn(&mut self, value: &Arc<dyn Any + Send + Sync>) {
        self.keep_at(Arc::as_ptr(value) as *const () as usize, || value.clone());
    }

    /// Holds the value at `addr`, made by `make` the first time. The check of the recent
    /// addresses is inlined into the per-node paths; the rest is not.
    #[inline]
    fn keep_at(&mut self, addr: usize, make: impl FnOnce() -> Owner) {
        if !self.recent.contains(&addr) {
            self.keep_new(addr, make);
        }
    }

    /// [`keep_at`](Self::keep_at) for an address not among the recent ones.
    #[inline(never)]
    fn keep_new(&mut self, addr: usize, make: impl FnOnce() -> Owner) {
        self.recent[self.recent_next as usize % self.recent.len()] = addr;
        self.recent_next = (self.recent_next + 1) % self.recent.len() as u32;
        if self.kept.insert(addr) {
            self.pending.push(make());
        }
    }

    /// Whether the tree has conditional nodes this crate made: their handles belong to its
    /// graphs, so a copy (clone, embedding) that could hold such nodes holds the tree's root too.
    /// Otherwise a copy holds only what the nodes use, never the graph it came from (which would
    /// make a graph that embeds its own clone hold itself).
    pub(crate) fn has_conditionals(&self) -> bool {
        !self.conditionals.is_empty()
    }

    /// Takes every operand the tree holds — its explicit nodes' owners (the nodes stay, holding
    /// nothing) and what captures, clones and embeds keep — for a tree whose only holder is an
    /// exec that no longer uses them (a whole-graph update replaced every node's parameters):
    /// no one can instantiate, copy or read the tree again, and execs hold their own snapshots.
    pub(crate) fn take_operands(&mut self) -> Vec<Owner> {
        let mut out = self.nodes.take_all_owners();
        out.extend(std::mem::take(&mut self.pending));
        out.extend(
            std::mem::take(&mut self.chunks)
                .into_iter()
                .map(|c| c as Owner),
        );
        self.kept = KeptSet::default();
        self.recent = [0; 4];
        out
    }

    /// Refuses a tree that a capture still records into or that the driver broke, for
    /// operations that read the whole tree (instantiate, update from it, embed it, clone it).
    pub(crate) fn check_complete(&self) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::invalid(Refusal::Broken, why.clone()));
        }
        if !self.captures.is_empty() {
            return Err(Error::invalid(
                Refusal::Capture,
                "a stream capture still records into this graph or one of its conditional bodies (a body builder was not ended, or was leaked): end every body's capture first",
            ));
        }
        Ok(())
    }

    /// Everything the tree's nodes use, as shared chunks: what an exec instantiated now holds
    /// for as long as its launches may run. (Not CUDA user objects: on driver 13.0 each one
    /// leaks about 240 bytes of host memory inside the driver.)
    pub(crate) fn snapshot(&mut self) -> Vec<KeepChunk> {
        let mut all = self.tree_wide_chunks();
        all.extend(self.nodes.owners_chunk());
        all
    }

    /// What the tree holds apart from its registered nodes' own owners (operands of captured
    /// nodes, and what clones and captured embeds hold), as shared chunks.
    pub(crate) fn tree_wide_chunks(&mut self) -> Vec<KeepChunk> {
        if !self.pending.is_empty() {
            self.chunks
                .push(Arc::new(std::mem::take(&mut self.pending).into_vec()));
        }
        self.chunks.clone()
    }
}

// SAFETY: CUgraph handles may be used from any thread; this crate never touches a graph tree from
// two threads at once: driver calls on it run under its tree lock (`lock`), and a capture that
// records into it is owned by one builder, while definitions refuse it (`TreeState::captures`).
unsafe impl Send for GraphHandle {}
// SAFETY: as above.
unsafe impl Sync for GraphHandle {}

impl GraphHandle {
    /// Creates an empty graph.
    pub(crate) fn create(ctx: &Arc<PrimaryContext>) -> Result<Arc<Self>> {
        ctx.bind()?;
        Self::create_bound(ctx)
    }

    /// [`create`](Self::create) for a caller that has just bound `ctx`, with nothing run since
    /// that could change the current context (one driver call fewer per capture).
    pub(crate) fn create_bound(ctx: &Arc<PrimaryContext>) -> Result<Arc<Self>> {
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
            embedded: false,
            tree: TreeLock::new(TreeState::default()),
            disowned: AtomicBool::new(false),
            exec_holds: AtomicUsize::new(0),
        }
    }

    /// Wraps a body graph owned by a node of `owner`, whose tree is `tree` (locked).
    pub(crate) fn body(
        tree: &mut TreeState,
        owner: &Arc<GraphHandle>,
        raw: sys::CUgraph,
    ) -> Arc<Self> {
        Self::node_owned(tree, owner, raw, next_id(), false)
    }

    /// Wraps a graph owned by a node of `owner` under a known id (another view of a body or of
    /// an embedded graph, with the id its first view got, so that node tokens carry over), and
    /// registers it with `tree`, `owner`'s tree, which the caller holds locked.
    pub(crate) fn node_owned(
        tree: &mut TreeState,
        owner: &Arc<GraphHandle>,
        raw: sys::CUgraph,
        id: u64,
        embedded: bool,
    ) -> Arc<Self> {
        let view = Arc::new(GraphHandle {
            ctx: owner.ctx.clone(),
            raw,
            id,
            owner: Some(owner.clone()),
            embedded,
            tree: TreeLock::new(TreeState::default()),
            disowned: AtomicBool::new(false),
            exec_holds: AtomicUsize::new(0),
        });
        tree.register_view(&view);
        view
    }

    /// Whether execs hold this graph and nothing else does but `others` references the caller
    /// knows of: then no one can instantiate, copy or read its tree again.
    pub(crate) fn only_execs_hold(self: &Arc<Self>, others: usize) -> bool {
        let execs = self.exec_holds.load(Ordering::Acquire);
        execs > 0 && Arc::strong_count(self) == execs + others
    }

    /// Called when a user's handle of the tree `root` is gone ([`UserGraph`]): where only execs
    /// hold the tree now, no one can instantiate, copy or read it again, and every exec holds
    /// its own snapshot of what its nodes use, so the tree lets go of that, here, with no lock
    /// held (as a tree's last handle drops what its nodes use). An exec updated from
    /// another graph thus keeps the graph it was instantiated from (its nodes name the exec's
    /// for per-node updates) but not that graph's operands. Concurrent last drops are
    /// serialised, so the last one sees the others' references gone.
    pub(crate) fn user_left(root: Weak<GraphHandle>) {
        static GATE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let gate = GATE.lock().unwrap_or_else(|p| p.into_inner());
        let Some(root) = root.upgrade() else {
            return;
        };
        // The upgrade is the one reference besides the execs'.
        if !root.only_execs_hold(1) {
            return;
        }
        let taken = root.lock().take_operands();
        drop(root);
        drop(gate);
        drop(taken);
    }

    /// Whether an exec holds this graph.
    pub(crate) fn exec_held(&self) -> bool {
        self.exec_holds.load(Ordering::Acquire) > 0
    }

    /// Whether this is the graph a child-graph node runs, seen through the node.
    pub(crate) fn is_embedded(&self) -> bool {
        self.embedded
    }

    /// Takes the lock of this graph's tree (see [`TreeState`]). Hold it across every driver call
    /// that reads or mutates the graph; never take a second tree's lock while holding it except
    /// through [`lock_two`].
    #[inline]
    pub(crate) fn lock(&self) -> TreeGuard<'_, TreeState> {
        let mut g = self;
        while let Some(o) = &g.owner {
            g = o;
        }
        g.tree.lock_ranked(g.id)
    }

    /// The id of this graph's tree: its root graph's id.
    pub(crate) fn tree_id(&self) -> u64 {
        let mut g = self;
        while let Some(o) = &g.owner {
            g = o;
        }
        g.id
    }

    /// Whether this graph is owned by a node of another graph (a conditional body, or the graph
    /// a child-graph node runs).
    pub(crate) fn is_body(&self) -> bool {
        self.owner.is_some()
    }

    /// Whether `pred` holds for the id of this graph or of a graph that owns it.
    pub(crate) fn any_in_chain(&self, mut pred: impl FnMut(u64) -> bool) -> bool {
        let mut g = self;
        loop {
            if pred(g.id) {
                return true;
            }
            match &g.owner {
                Some(o) => g = o,
                None => return false,
            }
        }
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
        let tree = self.tree.get_mut();
        if tree.broken.is_some() {
            // The driver destroyed a body graph owned by one of this graph's nodes;
            // `cuGraphDestroy` would crash on it (seen on driver 13.0). Leaked instead.
            return;
        }
        // SAFETY: an owned graph is destroyed exactly once, here. Execs instantiated from it do
        // not depend on it.
        release::destroy_in(&self.ctx, self.raw, |raw| unsafe {
            drv_drop!(cuGraphDestroy(raw))
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
// exec. Launches, uploads and updates of one `Graph` take its `ExecState` lock.
unsafe impl Send for ExecHandle {}
// SAFETY: as above.
unsafe impl Sync for ExecHandle {}

impl ExecHandle {
    /// Moves the exec out, leaving a handle that destroys nothing: the exec can then be destroyed
    /// elsewhere (after its last launch, right before the graph it was instantiated from).
    pub(crate) fn take(&mut self) -> ExecHandle {
        ExecHandle {
            ctx: self.ctx.clone(),
            raw: std::mem::replace(&mut self.raw, std::ptr::null_mut()),
        }
    }
}

impl Drop for ExecHandle {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        // SAFETY: the exec was wrapped once after a successful instantiate and is destroyed
        // exactly once, here. The driver defers the free until pending launches finish, and the
        // values `Graph` holds for it are released after its last launch (see `Graph`'s `Drop`).
        release::destroy_in(&self.ctx, self.raw, |raw| unsafe {
            drv_drop!(cuGraphExecDestroy(raw))
        });
    }
}

/// Locks the trees of two graphs, in a fixed order (by tree id) so that two threads locking the
/// same pair never deadlock; one guard when both are in the same tree.
pub(crate) fn lock_two<'a>(
    a: &'a GraphHandle,
    b: &'a GraphHandle,
) -> (TreeGuard<'a, TreeState>, Option<TreeGuard<'a, TreeState>>) {
    if a.tree_id() == b.tree_id() {
        (a.lock(), None)
    } else if a.tree_id() < b.tree_id() {
        let ga = a.lock();
        (ga, Some(b.lock()))
    } else {
        let gb = b.lock();
        (a.lock(), Some(gb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_graphs_are_forgotten_once_no_handle_of_them_is_left() {
        let mut views: IdMap<u64, Vec<Weak<u32>>> = IdMap::default();
        let mut dead: IdSet<u64> = IdSet::default();
        let kept = Arc::new(1);
        let gone = Arc::new(2);
        let other = Arc::new(3);
        views.entry(1).or_default().push(Arc::downgrade(&kept));
        views.entry(1).or_default().push(Arc::downgrade(&gone));
        views.entry(2).or_default().push(Arc::downgrade(&gone));
        views.entry(3).or_default().push(Arc::downgrade(&other));
        dead.extend([1, 2, 9]);
        drop(gone);
        prune_views(&mut views, &mut dead);
        // Graph 1 still has a live handle: dead, and named. Graph 2's only handle is gone:
        // forgotten. Graph 3 is alive and named. Graph 9 never had a handle: stays dead.
        assert_eq!(views[&1].len(), 1);
        assert!(!views.contains_key(&2));
        assert_eq!(views[&3].len(), 1);
        let mut left: Vec<u64> = dead.iter().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [1, 9]);
        drop((kept, other));
        prune_views(&mut views, &mut dead);
        // Graph 1 goes; graph 3, alive, keeps its (empty) entry until it dies.
        assert!(!views.contains_key(&1));
        assert!(views[&3].is_empty());
        assert_eq!(dead.iter().copied().collect::<Vec<_>>(), [9]);
        dead.insert(3);
        prune_views(&mut views, &mut dead);
        assert!(views.is_empty());
        assert_eq!(dead.iter().copied().collect::<Vec<_>>(), [9]);
    }

    #[test]
    fn kept_sets_report_each_address_once_before_and_after_they_outgrow_their_list() {
        let mut kept = KeptSet::default();
        // Past the inline list's size, in an order that revisits early addresses after it
        // spilled into the hash set.
        let addrs: Vec<usize> = (1..=3 * KeptSet::FEW).map(|i| i * 64).collect();
        for (n, &a) in addrs.iter().enumerate() {
            assert!(kept.insert(a), "address {n} is new");
            assert!(!kept.insert(a), "address {n} is already held");
            for &earlier in &addrs[..n] {
                assert!(!kept.insert(earlier), "an earlier address was held again");
            }
        }
    }

    #[test]
    fn captures_are_found_updated_and_removed_by_id() {
        let mut c = Captures::default();
        assert!(c.is_empty());
        for id in 1..=5u64 {
            c.insert(id, 100 + id);
        }
        c.insert(3, 7);
        assert!((1..=5).all(|id| c.contains_key(&id)));
        assert_eq!(c.values().filter(|g| **g == 7).count(), 1);
        assert_eq!(c.values().filter(|g| **g == 103).count(), 0);
        c.remove(&3);
        c.remove(&3);
        assert!(!c.contains_key(&3));
        assert!([1, 2, 4, 5].iter().all(|id| c.contains_key(id)));
        for id in [1, 2, 4, 5] {
            c.remove(&id);
        }
        assert!(c.is_empty());
    }

    #[test]
    fn the_keep_set_holds_each_value_once() {
        let mut tree = TreeState::default();
        let values: Vec<Arc<u32>> = (0..6).map(Arc::new).collect();
        // Interleaved and repeated, past the size of the recent-address ring.
        for round in 0..3 {
            for v in values.iter().chain(values.iter().rev()) {
                tree.keep(v);
            }
            assert_eq!(
                tree.snapshot().iter().map(|c| c.len()).sum::<usize>(),
                6,
                "{round}"
            );
        }
        for v in &values {
            assert_eq!(Arc::strong_count(v), 2, "held once by the tree");
        }
        let dynamic: Arc<dyn Any + Send + Sync> = values[0].clone();
        tree.keep_dyn(&dynamic);
        assert_eq!(tree.snapshot().iter().map(|c| c.len()).sum::<usize>(), 6);
    }

    #[test]
    fn a_snapshot_shares_what_the_tree_held_then() {
        let mut tree = TreeState::default();
        let a = Arc::new(1u8);
        tree.keep(&a);
        let first = tree.snapshot();
        let b = Arc::new(2u8);
        tree.keep(&b);
        let second = tree.snapshot();
        assert_eq!(first.iter().map(|c| c.len()).sum::<usize>(), 1);
        assert_eq!(second.iter().map(|c| c.len()).sum::<usize>(), 2);
        drop(tree);
        drop(second);
        assert_eq!(
            Arc::strong_count(&a),
            2,
            "the first snapshot still holds `a`"
        );
        assert_eq!(Arc::strong_count(&b), 1);
    }
}
