//! Graph and graph-exec handles.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::tree_lock::{TreeGuard, TreeLock};

use cudarc::driver::sys;

use super::compat::edges;
use super::context::PrimaryContext;
use super::release;
use super::{drv, drv_drop};
use crate::error::{Error, Result};

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
}

/// A fast hasher for the crate's internal integer keys (ids, node and object addresses): one
/// multiply per word (the Fx hash). The keys are not chosen by an adversary.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type Ids = std::hash::BuildHasherDefault<IdHasher>;
/// A map keyed by ids or addresses.
pub(crate) type IdMap<K, V> = HashMap<K, V, Ids>;
/// A set of ids or addresses.
pub(crate) type IdSet<K> = HashSet<K, Ids>;

/// A batch of values that graphs and execs keep alive (see [`TreeState::snapshot`]).
pub(crate) type KeepChunk = Arc<Vec<Arc<dyn Any + Send + Sync>>>;

/// A value that a node uses and that must outlive it (a buffer's allocation, a module, a
/// callback's state, an event, an embedded graph's operands).
pub(crate) type Owner = Arc<dyn Any + Send + Sync>;

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

/// One of `items` that `pred` picks, looking inside the shared chunks (`Vec<Owner>`) that trees,
/// snapshots and copies hold, however deeply nested (each embed or clone wraps its operands one
/// level deeper), each chunk once; `None` if none. A `pred` that never picks visits everything.
/// Iterative, so a deep nesting cannot overflow the stack.
pub(crate) fn search_owners<'a>(
    items: impl Iterator<Item = &'a Owner>,
    pred: &mut dyn FnMut(&Owner) -> bool,
) -> Option<Owner> {
    let mut seen: IdSet<usize> = IdSet::default();
    let mut chunks: Vec<&'a Vec<Owner>> = Vec::new();
    let mut visit = |o: &'a Owner, chunks: &mut Vec<&'a Vec<Owner>>| {
        if pred(o) {
            return Some(o.clone());
        }
        if let Some(chunk) = o.downcast_ref::<Vec<Owner>>() {
            if seen.insert(chunk as *const Vec<Owner> as usize) {
                chunks.push(chunk);
            }
        }
        None
    };
    for o in items {
        if let Some(found) = visit(o, &mut chunks) {
            return Some(found);
        }
    }
    while let Some(chunk) = chunks.pop() {
        for o in chunk {
            if let Some(found) = visit(o, &mut chunks) {
                return Some(found);
            }
        }
    }
    None
}

/// What one node uses besides its shared entries (see [`SharedRef`]): held for its slot in the
/// [`NodeTable`]'s out-of-line list until the node is destroyed.
pub(crate) type Owners = smallvec::SmallVec<[Owner; 1]>;

/// What the lock of a graph tree (a root graph and its conditional bodies) guards besides the
/// driver calls: the bookkeeping of explicit definitions.
/// The live nodes of a tree that this crate handed out tokens for, and what each uses: a slab of
/// slots, each with a generation, so that checking a token is one array read and adding a node
/// one push (no hashing on the path that builds a graph). A token's serial is
/// `generation << 32 | slot`. Looking a node up by its address (for nodes the driver lists) uses
/// an index made on first need.
///
/// Each slot names what its node uses (up to two shared entries, or an out-of-line list of
/// owners): it lives while the node does (execs and copies made before hold their own
/// references, see [`TreeState::snapshot`]), and is released when the node is destroyed.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct NodeTable {
    // Laid out in declaration order (`repr(C)`): the fields an explicit node reads and writes
    // come first and fill two cache lines (`slots`, `free`, `last_graph`; `last_shared`,
    // `shared`, `index`: checked below, with `TreeState` placing the table on a line). On the
    // H200's hosts, with the driver's own work evicting what the crate touched between nodes,
    // each further line cost a few nanoseconds per node.
    slots: Vec<NodeSlot>,
    /// Slots of forgotten nodes, for reuse (the table stays as large as the live node count).
    free: Vec<u32>,
    /// The graph added to last, and its position plus one (a definition adds to one graph at a
    /// time); `(0, 0)` for none (graph ids start at 1).
    last_graph: (u64, u32),
    /// The two entries used last, newest first (the usual case: a chain of nodes launching
    /// kernels of one module, on one buffer), with the uses counted since: a node adds its use
    /// here, in the table's line, and the entry's own count (another line) is brought up to date
    /// before anything reads it ([`flush_shared`](Self::flush_shared)).
    last_shared: [RecentShared; 2],
    /// Values many nodes use (a kernel's module, a buffer), each held once with a count of the
    /// live nodes using it (see [`SharedRef`]); freed entries are reused.
    shared: Vec<SharedOwner>,
    /// `(graph id, raw node)` → slot, once something looked a node up by address (boxed: one
    /// word, read per node, in the second line).
    index: Option<Box<IdMap<(u64, usize), u32>>>,
    /// The graphs (ids) that slots name by position plus one ([`NodeSlot::graph`]): a tree has
    /// a root and any number of bodies, so a slot keeps four bytes instead of the eight-byte id.
    graphs: Vec<u64>,
    /// Graph id → its position in `graphs`.
    graph_index: IdMap<u64, u32>,
    /// Positions of `graphs` freed with their graph (bodies the driver freed), for reuse.
    graphs_free: Vec<u32>,
    /// What nodes hold besides shared entries, out of line: a node using at most two values
    /// holds them through shared entries (a kernel's module and one buffer), so a slot only
    /// names an entry here ([`NodeSlot::owners`]) for more and stays 32 bytes.
    owners: Vec<Owners>,
    /// Entries of `owners` free for reuse.
    owners_free: Vec<u32>,
    shared_free: Vec<u32>,
    /// Address → entry of `shared`, for the entries that hold a value.
    shared_index: IdMap<usize, u32>,
    /// Every live node's owners in one chunk, as the last snapshot made it; `None` once a node
    /// with owners was added or forgotten since.
    owners_chunk: Option<KeepChunk>,
}

/// A value that a new node uses and that the node table holds once for every node using it,
/// borrowed: its address names it, and the table clones it into an [`Owner`] the first time. A
/// node then counts its use in the table under the tree lock instead of cloning the `Arc` — an
/// atomic increment when the node is added and a decrement when it goes, which were most of an
/// explicit node's cost besides the tree lock (profiled with the stub driver). What the node
/// uses is still released with the node: the value goes when the last node using it does. The
/// address and the value come from one `Arc`, so they cannot disagree.
#[derive(Clone, Copy)]
pub(crate) struct SharedRef<'a> {
    addr: usize,
    value: &'a dyn Shareable,
}

impl<'a> SharedRef<'a> {
    /// The shared reference to `value`.
    #[inline]
    pub(crate) fn new(value: &'a dyn Shareable) -> Self {
        SharedRef {
            addr: value.addr(),
            value,
        }
    }

    /// A new strong reference to the value.
    fn owner(&self) -> Owner {
        self.value.owner()
    }
}

/// An `Arc` a [`SharedRef`] can borrow: a typed one (a module, an allocation) or an [`Owner`].
pub(crate) trait Shareable {
    /// Where the `Arc` points (what names the value in the table).
    fn addr(&self) -> usize;
    /// A new strong reference, as an [`Owner`].
    fn owner(&self) -> Owner;
}

impl<T: Any + Send + Sync> Shareable for Arc<T> {
    #[inline]
    fn addr(&self) -> usize {
        Arc::as_ptr(self) as *const () as usize
    }
    fn owner(&self) -> Owner {
        self.clone()
    }
}

impl Shareable for Owner {
    #[inline]
    fn addr(&self) -> usize {
        Arc::as_ptr(self) as *const () as usize
    }
    fn owner(&self) -> Owner {
        self.clone()
    }
}

/// One of [`NodeTable::last_shared`]: an entry of [`NodeTable::shared`] used lately, and the
/// uses of it counted here and not yet in the entry. Address 0: none (no value lives there).
#[derive(Debug, Default, Clone, Copy)]
struct RecentShared {
    addr: usize,
    entry: u32,
    pending: u32,
}

/// An entry of [`NodeTable::shared`].
#[derive(Debug)]
struct SharedOwner {
    /// `None` while the entry is free.
    owner: Option<Owner>,
    addr: usize,
    /// Live nodes using it.
    uses: u64,
}

// Half a cache line per node: what the crate keeps per explicit node besides what the node
// uses (issue "Capture at the driver's speed": at most 32 bytes).
static_assertions::const_assert!(std::mem::size_of::<NodeSlot>() <= 32);

#[derive(Debug)]
struct NodeSlot {
    raw: usize,
    /// The tree's [`TreeState::epoch`] when the node was made (an upper bound for nodes seen
    /// first in a listing): an exec instantiated at a later epoch knows the node.
    born: u64,
    generation: u32,
    /// The node's graph: its position in [`NodeTable::graphs`] plus one; 0 while the slot is
    /// free (the node was forgotten).
    graph: u32,
    /// The entry of [`NodeTable::shared`] the node uses, plus one (0: none).
    shared: u32,
    /// What else the node uses: 0 for nothing, a second entry of [`NodeTable::shared`] plus
    /// one, or with [`OUT_OF_LINE`] set an entry of [`NodeTable::owners`] plus one.
    owners: u32,
}

/// Drops an empty `owners` without a call where there is nothing to free (an inline `SmallVec`'s
/// drop glue is a call on the per-node path).
#[inline]
fn drop_empty(owners: Owners) {
    debug_assert!(owners.is_empty());
    if owners.spilled() {
        drop(owners);
    } else {
        std::mem::forget(owners);
    }
}

/// A slot taken by [`NodeTable::reserve`] for a node the driver is about to make: to be
/// committed or cancelled under the same lock.
#[derive(Debug)]
#[must_use = "a reserved slot is committed or cancelled"]
pub(crate) struct Reserved {
    slot: u32,
    serial: u64,
    /// Whether the table had an address index when the slot was taken (it cannot change while
    /// the lock is held): committing then records the address in it.
    indexed: bool,
}

/// Marks [`NodeSlot::owners`] as naming an entry of [`NodeTable::owners`].
const OUT_OF_LINE: u32 = 1 << 31;

impl NodeSlot {
    fn live(&self) -> bool {
        self.graph != 0
    }
}

impl NodeTable {
    /// Takes a slot for a node about to be made in graph `graph`, with everything but its
    /// address: [`commit`](Self::commit) it with the address once the driver made the node, or
    /// [`cancel`](Self::cancel) it. Done before the driver call, under the same lock, so that
    /// after the call a node writes one slot (the driver's work between the two evicts what the
    /// crate touched, and every line touched again is read again).
    #[inline(always)]
    pub(crate) fn reserve(
        &mut self,
        graph: u64,
        shared: &[SharedRef<'_>],
        mut owners: Owners,
        born: u64,
    ) -> Reserved {
        let local = match self.last_graph {
            (id, local) if id == graph && local != 0 => local,
            _ => self.local_graph(graph),
        };
        // A slot names two shared entries; a node using more values, or owners of its own,
        // holds all but the first through an entry of `owners`.
        let (first, second) = match shared {
            [] => (None, None),
            [a] => (Some(a), None),
            [a, b] if owners.is_empty() => (Some(a), Some(b)),
            [a, rest @ ..] => {
                owners.extend(rest.iter().map(SharedRef::owner));
                (Some(a), None)
            }
        };
        let owners = if let Some(r) = second {
            drop_empty(owners);
            self.share(r)
        } else if owners.is_empty() {
            drop_empty(owners);
            0
        } else {
            self.owners_chunk = None;
            self.hold(owners) | OUT_OF_LINE
        };
        let shared = first.map_or(0, |r| self.share(r));
        let slot = match self.free.pop() {
            Some(i) => {
                let s = &mut self.slots[i as usize];
                s.graph = local;
                s.raw = 0;
                s.generation = s.generation.wrapping_add(1);
                s.shared = shared;
                s.owners = owners;
                s.born = born;
                i
            }
            None => {
                if self.slots.capacity() == 0 {
                    // A definition's first node: room for a few dozen (1 KiB) instead of
                    // growing through 4, 8, 16 and 32, a copy each.
                    self.slots.reserve_exact(32);
                } else {
                    self.slots.reserve(1);
                }
                // Written in place: `push` built the slot on the stack and copied it with wide
                // loads over narrower stores, a store-forwarding stall that was the largest
                // single cost of an explicit node after the tree lock (`perf`, stub driver).
                let len = self.slots.len();
                self.slots.spare_capacity_mut()[0].write(NodeSlot {
                    raw: 0,
                    born,
                    generation: 0,
                    graph: local,
                    shared,
                    owners,
                });
                // SAFETY: the element at `len` (within capacity, reserved above) was just
                // initialised.
                unsafe { self.slots.set_len(len + 1) };
                len as u32
            }
        };
        Reserved {
            slot,
            serial: Self::serial(slot, self.slots[slot as usize].generation),
            indexed: self.index.is_some(),
        }
    }

    /// Gives the reserved slot `r` the address `raw` of the node the driver made in `graph`, and
    /// returns its serial. A node that the index still lists at the same address (destroyed, its
    /// address reused) is forgotten; its owners are returned in `released`.
    #[inline]
    pub(crate) fn commit(
        &mut self,
        r: Reserved,
        graph: u64,
        raw: usize,
        released: &mut Vec<Owner>,
    ) -> u64 {
        if let Some(s) = self.slots.get_mut(r.slot as usize) {
            debug_assert!(s.live() && Self::serial(r.slot, s.generation) == r.serial);
            s.raw = raw;
        }
        if r.indexed {
            self.index_new(r.slot, graph, raw, released);
        }
        r.serial
    }

    /// [`commit`](Self::commit)'s index work, once something looked nodes up by address.
    #[cold]
    fn index_new(&mut self, slot: u32, graph: u64, raw: usize, released: &mut Vec<Owner>) {
        let old = self
            .index
            .as_ref()
            .and_then(|i| i.get(&(graph, raw)).copied());
        if let Some(old) = old.filter(|&old| old != slot) {
            released.extend(self.release(old));
        }
        if let Some(index) = self.index.as_mut() {
            index.insert((graph, raw), slot);
        }
    }

    /// Frees the reserved slot `r` (the driver made no node) and returns what it was to hold.
    pub(crate) fn cancel(&mut self, r: Reserved) -> Owners {
        debug_assert!(self
            .slots
            .get(r.slot as usize)
            .is_some_and(|s| s.live() && Self::serial(r.slot, s.generation) == r.serial));
        self.release(r.slot)
    }

    /// The position of graph `graph` in [`graphs`](Self::graphs) plus one, given one if it has
    /// none yet.
    #[cold]
    fn local_graph(&mut self, graph: u64) -> u32 {
        let local = match self.graph_index.get(&graph) {
            Some(&i) => i + 1,
            None => {
                let i = match self.graphs_free.pop() {
                    Some(i) => {
                        self.graphs[i as usize] = graph;
                        i
                    }
                    None => {
                        self.graphs.push(graph);
                        (self.graphs.len() - 1) as u32
                    }
                };
                self.graph_index.insert(graph, i);
                i + 1
            }
        };
        self.last_graph = (graph, local);
        local
    }

    /// Whether the slot field `local` names graph `graph`; the graph added to last is checked
    /// without reading [`graphs`](Self::graphs).
    #[inline]
    fn names_graph(&self, local: u32, graph: u64) -> bool {
        match self.last_graph {
            // `last_graph` always agrees with `graphs` (set with it, cleared when freed).
            (id, l) if l == local && l != 0 => id == graph,
            _ => self.graph_id(local) == Some(graph),
        }
    }

    /// The id of the graph a slot names (`local`, a position plus one).
    fn graph_id(&self, local: u32) -> Option<u64> {
        let i = local.checked_sub(1)?;
        self.graphs.get(i as usize).copied()
    }

    /// Holds `owners` in an entry of [`owners`](Self::owners); returns the entry plus one.
    fn hold(&mut self, owners: Owners) -> u32 {
        match self.owners_free.pop() {
            Some(i) => {
                self.owners[i as usize] = owners;
                i + 1
            }
            None => {
                self.owners.push(owners);
                self.owners.len() as u32
            }
        }
    }

    /// Takes what a slot's [`owners`](NodeSlot::owners) field `id` names: the node's use of a
    /// shared entry, or an entry of [`owners`](Self::owners) (freed).
    fn unhold(&mut self, id: u32) -> Owners {
        if id & OUT_OF_LINE == 0 {
            return self.unshare(id).into_iter().collect();
        }
        let Some(i) = (id & !OUT_OF_LINE).checked_sub(1) else {
            return Owners::new();
        };
        match self.owners.get_mut(i as usize) {
            Some(entry) => {
                self.owners_free.push(i);
                std::mem::take(entry)
            }
            None => Owners::new(),
        }
    }

    /// Counts one more use of the value `r` names, holding it first if no node does yet;
    /// returns its entry plus one. A value used lately is counted in [`last_shared`]
    /// (Self::last_shared), without reading its entry.
    #[inline]
    fn share(&mut self, r: &SharedRef<'_>) -> u32 {
        for last in &mut self.last_shared {
            if last.addr == r.addr && last.pending < u32::MAX {
                last.pending += 1;
                return last.entry + 1;
            }
        }
        self.share_slow(r)
    }

    /// Adds the uses counted in [`last_shared`](Self::last_shared) to their entries: done before
    /// an entry's count is read or the recent entries change.
    fn flush_shared(&mut self) {
        for last in &mut self.last_shared {
            if last.pending > 0 {
                if let Some(e) = self.shared.get_mut(last.entry as usize) {
                    e.uses += u64::from(last.pending);
                }
                last.pending = 0;
            }
        }
    }

    /// [`share`](Self::share) for a value not used last.
    #[cold]
    fn share_slow(&mut self, r: &SharedRef<'_>) -> u32 {
        self.flush_shared();
        let i = match self.shared_index.get(&r.addr).copied() {
            Some(i) => {
                self.shared[i as usize].uses += 1;
                i
            }
            None => {
                let entry = SharedOwner {
                    owner: Some(r.owner()),
                    addr: r.addr,
                    uses: 1,
                };
                let i = match self.shared_free.pop() {
                    Some(i) => {
                        self.shared[i as usize] = entry;
                        i
                    }
                    None => {
                        self.shared.push(entry);
                        (self.shared.len() - 1) as u32
                    }
                };
                self.shared_index.insert(r.addr, i);
                // Execs snapshot what the tree holds: the new value must be in the next one.
                self.owners_chunk = None;
                i
            }
        };
        let newest = RecentShared {
            addr: r.addr,
            entry: i,
            pending: 0,
        };
        self.last_shared = [newest, self.last_shared[0]];
        i + 1
    }

    /// Takes one use of the shared entry `id` (an entry plus one) away from a node and returns
    /// the value for the caller to hold or drop: the entry's own reference once no node uses it
    /// (the entry is freed), else a new one.
    fn unshare(&mut self, id: u32) -> Option<Owner> {
        let i = id.checked_sub(1)?;
        self.flush_shared();
        let entry = self.shared.get_mut(i as usize)?;
        // A freed entry gives nothing back (and is not freed twice).
        entry.owner.as_ref()?;
        entry.uses = entry.uses.saturating_sub(1);
        if entry.uses > 0 {
            return entry.owner.clone();
        }
        let owner = entry.owner.take();
        let addr = entry.addr;
        self.shared_index.remove(&addr);
        self.shared_free.push(i);
        for last in &mut self.last_shared {
            if last.entry == i {
                *last = RecentShared::default();
            }
        }
        self.owners_chunk = None;
        owner
    }

    /// The values held for node slots through [`SharedRef`]s.
    fn shared_owners(&self) -> impl Iterator<Item = &Owner> {
        self.shared.iter().filter_map(|e| e.owner.as_ref())
    }

    fn serial(slot: u32, generation: u32) -> u64 {
        (u64::from(generation) << 32) | u64::from(slot)
    }

    #[inline]
    fn slot_of(&self, graph: u64, raw: usize, serial: u64) -> Option<u32> {
        let slot = (serial & 0xffff_ffff) as u32;
        let s = self.slots.get(slot as usize)?;
        (s.live()
            && s.raw == raw
            && Self::serial(slot, s.generation) == serial
            && self.names_graph(s.graph, graph))
        .then_some(slot)
    }

    /// What the live node `(graph, raw, serial)` holds.
    pub(crate) fn owners_of(
        &self,
        graph: u64,
        raw: usize,
        serial: u64,
    ) -> Option<impl Iterator<Item = &Owner>> {
        self.slot_of(graph, raw, serial).map(|slot| {
            let s = &self.slots[slot as usize];
            let shared = s
                .shared
                .checked_sub(1)
                .and_then(|i| self.shared.get(i as usize))
                .and_then(|e| e.owner.as_ref());
            let (second, own) = if s.owners & OUT_OF_LINE == 0 {
                let second = s
                    .owners
                    .checked_sub(1)
                    .and_then(|i| self.shared.get(i as usize))
                    .and_then(|e| e.owner.as_ref());
                (second, None)
            } else {
                let own = (s.owners & !OUT_OF_LINE)
                    .checked_sub(1)
                    .and_then(|i| self.owners.get(i as usize));
                (None, own)
            };
            shared
                .into_iter()
                .chain(second)
                .chain(own.into_iter().flatten())
        })
    }

    /// What every live node holds (freed entries of [`owners`](Self::owners) are empty).
    fn all_owners(&self) -> impl Iterator<Item = &Owner> {
        self.owners.iter().flatten().chain(self.shared_owners())
    }

    /// Whether the token `(graph, raw, serial)` names a live node.
    #[inline]
    pub(crate) fn is_live(&self, graph: u64, raw: usize, serial: u64) -> bool {
        self.slot_of(graph, raw, serial).is_some()
    }

    /// The epoch at which the live node `(graph, raw, serial)` was made (at the latest); `None`
    /// if the token names no live node.
    pub(crate) fn born(&self, graph: u64, raw: usize, serial: u64) -> Option<u64> {
        self.slot_of(graph, raw, serial)
            .map(|slot| self.slots[slot as usize].born)
    }

    /// Whether a live node of `graph` is registered (a graph of this tree the crate saw nodes
    /// of).
    pub(crate) fn knows_graph(&self, graph: u64) -> bool {
        match self.graph_index.get(&graph) {
            Some(&i) => self.slots.iter().any(|s| s.graph == i + 1),
            None => false,
        }
    }

    /// Puts `owners` in the place of what the live node `(graph, raw, serial)` holds and returns
    /// what it held (`None`, and `owners` dropped, if the token names no live node). Calling it
    /// again with the returned owners undoes it.
    pub(crate) fn replace_owners(
        &mut self,
        graph: u64,
        raw: usize,
        serial: u64,
        owners: Owners,
    ) -> Option<Owners> {
        let slot = self.slot_of(graph, raw, serial)?;
        self.owners_chunk = None;
        let s = &mut self.slots[slot as usize];
        // What the node used through the shared table goes with the rest of the old owners.
        let shared = std::mem::take(&mut s.shared);
        let held = std::mem::take(&mut s.owners);
        let mut old = self.unhold(held);
        let new = if owners.is_empty() {
            0
        } else {
            self.hold(owners) | OUT_OF_LINE
        };
        self.slots[slot as usize].owners = new;
        old.extend(self.unshare(shared));
        Some(old)
    }

    /// Takes what every live node holds; the nodes stay (their tokens valid), holding nothing.
    /// For a tree no one can instantiate, copy or read again (see [`TreeState::take_operands`]).
    pub(crate) fn take_all_owners(&mut self) -> Vec<Owner> {
        let mut out = Vec::new();
        self.owners_chunk = None;
        for i in 0..self.slots.len() {
            if !self.slots[i].live() {
                continue;
            }
            let shared = std::mem::take(&mut self.slots[i].shared);
            let held = std::mem::take(&mut self.slots[i].owners);
            out.extend(self.unhold(held));
            out.extend(self.unshare(shared));
        }
        out
    }

    /// The serial of the live node at `raw` in `graph`, registering it (with no owners, made at
    /// or before epoch `born`) if it is new.
    pub(crate) fn lookup_or_insert(&mut self, graph: u64, raw: usize, born: u64) -> u64 {
        if self.index.is_none() {
            let index = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some(((self.graph_id(s.graph)?, s.raw), i as u32)))
                .collect();
            self.index = Some(Box::new(index));
        }
        match self.index.as_ref().and_then(|i| i.get(&(graph, raw))) {
            Some(&slot) => Self::serial(slot, self.slots[slot as usize].generation),
            None => {
                let r = self.reserve(graph, &[], Owners::new(), born);
                self.commit(r, graph, raw, &mut Vec::new())
            }
        }
    }

    /// Forgets the node `(graph, raw, serial)` if it is live, and returns what it held (for the
    /// caller to drop once the tree lock is released).
    pub(crate) fn remove(&mut self, graph: u64, raw: usize, serial: u64) -> Owners {
        match self.slot_of(graph, raw, serial) {
            Some(slot) => self.release(slot),
            None => Owners::new(),
        }
    }

    /// Forgets every node of the graphs `dead` (conditional bodies the driver freed with their
    /// node), returning what they held. The graphs' places in [`graphs`](Self::graphs) are
    /// freed for reuse.
    pub(crate) fn remove_graphs(&mut self, dead: &[u64]) -> Vec<Owner> {
        let locals: Vec<u32> = dead
            .iter()
            .filter_map(|id| self.graph_index.get(id).map(|&i| i + 1))
            .collect();
        if locals.is_empty() {
            return Vec::new();
        }
        let doomed: Vec<u32> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live() && locals.contains(&s.graph))
            .map(|(i, _)| i as u32)
            .collect();
        let released = doomed.into_iter().flat_map(|i| self.release(i)).collect();
        for local in locals {
            let i = local - 1;
            let id = self.graphs[i as usize];
            // Freed once even if `dead` names the graph twice: a position freed twice would be
            // handed to two graphs.
            if self.graph_index.remove(&id).is_none() {
                continue;
            }
            self.graphs[i as usize] = 0;
            self.graphs_free.push(i);
            if self.last_graph.1 == local {
                self.last_graph = (0, 0);
            }
        }
        released
    }

    fn release(&mut self, slot: u32) -> Owners {
        let s = &mut self.slots[slot as usize];
        if !s.live() {
            return Owners::new();
        }
        let local = std::mem::take(&mut s.graph);
        let raw = s.raw;
        let held = std::mem::take(&mut s.owners);
        let shared = std::mem::take(&mut s.shared);
        if let Some(graph) = self.graph_id(local) {
            if let Some(index) = self.index.as_mut() {
                if index.get(&(graph, raw)) == Some(&slot) {
                    index.remove(&(graph, raw));
                }
            }
        }
        self.free.push(slot);
        let out_of_line = held & OUT_OF_LINE != 0;
        let mut owners = self.unhold(held);
        if out_of_line && !owners.is_empty() {
            self.owners_chunk = None;
        }
        owners.extend(self.unshare(shared));
        owners
    }

    /// The owners chunk (see [`owners_chunk`](Self::owners_chunk)) with the index of which of
    /// its entries each live node uses, for an exec that releases them node by node.
    pub(crate) fn owners_chunk_indexed(&mut self) -> Option<(KeepChunk, NodeOwnersIndex)> {
        let chunk = self.owners_chunk()?;
        let index = self.owners_index();
        debug_assert!(index.uses.iter().all(|&u| (u as usize) < chunk.len()));
        Some((chunk, index))
    }

    /// Which entries of the owners chunk each live node uses. The chunk is laid out as
    /// [`all_owners`](Self::all_owners) lists them: the out-of-line lists in order, then the
    /// shared entries that hold a value. A valid cached chunk has that layout now (every change
    /// of either drops the cache), so the index is made fresh, with no clone of any owner.
    fn owners_index(&mut self) -> NodeOwnersIndex {
        self.flush_shared();
        let mut list_start = Vec::with_capacity(self.owners.len());
        let mut pos = 0u32;
        for list in &self.owners {
            list_start.push(pos);
            pos += list.len() as u32;
        }
        let mut shared_pos = Vec::with_capacity(self.shared.len());
        for entry in &self.shared {
            shared_pos.push(entry.owner.is_some().then_some(pos));
            if entry.owner.is_some() {
                pos += 1;
            }
        }
        let shared_at = |id: u32| {
            id.checked_sub(1)
                .and_then(|i| shared_pos.get(i as usize).copied().flatten())
        };
        let mut index = NodeOwnersIndex::default();
        for slot in self.slots.iter().filter(|s| s.live()) {
            let start = index.uses.len() as u32;
            index.uses.extend(shared_at(slot.shared));
            if slot.owners & OUT_OF_LINE != 0 {
                if let Some(j) = (slot.owners & !OUT_OF_LINE).checked_sub(1) {
                    let (from, n) = (list_start[j as usize], self.owners[j as usize].len());
                    index.uses.extend(from..from + n as u32);
                }
            } else {
                index.uses.extend(shared_at(slot.owners));
            }
            let len = index.uses.len() as u32 - start;
            if len > 0 {
                let graph = self.graphs[(slot.graph - 1) as usize];
                index.nodes.push(((graph, slot.raw), start, len));
            }
        }
        index
    }

    /// Every live node's owners, in one shared chunk (made again only after a change).
    fn owners_chunk(&mut self) -> Option<KeepChunk> {
        if self.owners_chunk.is_none() {
            let all: Vec<Owner> = self.all_owners().cloned().collect();
            if all.is_empty() {
                return None;
            }
            self.owners_chunk = Some(Arc::new(all));
        }
        self.owners_chunk.clone()
    }
}

/// Which entries of a tree's owners chunk each of its explicit nodes used when an exec was
/// instantiated: `nodes` lists `(graph id, raw node)` with a range of `uses`, whose values are
/// positions in the chunk. An exec releases a node's entries once a per-node update replaced
/// its parameters and no other node of the exec uses them.
#[derive(Debug, Default)]
pub(crate) struct NodeOwnersIndex {
    pub(crate) nodes: Vec<((u64, usize), u32, u32)>,
    pub(crate) uses: Vec<u32>,
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
}

// The cache-line plan above (`GraphHandle` starts on a line: `repr(C, align(64))`). Loom's
// atomics (`--cfg cuda_graph_loom`, src/driver/sync.rs) are larger than `std`'s.
#[cfg(not(cuda_graph_loom))]
const _: () = {
    use std::mem::offset_of;
    let state = offset_of!(GraphHandle, tree) + TreeLock::<TreeState>::VALUE_OFFSET;
    assert!(state == 48);
    assert!(state + offset_of!(TreeState, dead) == 64);
    assert!(state + offset_of!(TreeState, captures) == 128);
    assert!(state + offset_of!(TreeState, nodes) == 192);
    assert!(offset_of!(NodeTable, last_shared) == 64);
    assert!(offset_of!(NodeTable, graphs) == 128);
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
            return Err(Error::InvalidArgument(why.clone()));
        }
        if !self.captures.is_empty() {
            return Err(Error::InvalidArgument(
                "a stream capture still records into this graph or one of its conditional bodies (a body builder was not ended, or was leaked): end every body's capture first".into(),
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
        });
        tree.register_view(&view);
        view
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
        g.tree.lock()
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

// Thin wrappers of the graph, node and exec entry points. The node-adding ones share one promise:
// `graph` is live and its tree locked, and `deps` is null with `n == 0` or holds `n` live nodes
// of `graph`; the new node is written into `out`.

/// Adds a kernel node (`cuGraphAddKernelNode_v2`).
///
/// # Safety
/// The node-adding promise (above); `params` points at argument storage that outlives the call
/// (the driver copies it) and the arguments match the kernel, which stays in bounds of the
/// memory it is given.
#[inline(always)]
pub(crate) unsafe fn add_kernel_node(
    ctx: &PrimaryContext,
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    if let Some(f) = ctx.hot.add_kernel_node {
        // SAFETY: the caller's promises above; `f` is the entry point (see `HotEntryPoints`).
        return super::check(
            unsafe { f(out, graph, deps, n, params) },
            "cuGraphAddKernelNode_v2",
        );
    }
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddKernelNode_v2(out, graph, deps, n, params)) }
}

/// Adds a memset node (`cuGraphAddMemsetNode`).
///
/// # Safety
/// The node-adding promise (above); the memset lies inside memory the graph keeps alive; `ctx`
/// is the graph's context.
pub(crate) unsafe fn add_memset_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &sys::CUDA_MEMSET_NODE_PARAMS,
    ctx: sys::CUcontext,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddMemsetNode(out, graph, deps, n, params, ctx)) }
}

/// Adds a memcpy node (`cuGraphAddMemcpyNode`).
///
/// # Safety
/// The node-adding promise (above); the copy lies inside memory the graph keeps alive; `ctx` is
/// the graph's context.
pub(crate) unsafe fn add_memcpy_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    copy: &sys::CUDA_MEMCPY3D,
    ctx: sys::CUcontext,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddMemcpyNode(out, graph, deps, n, copy, ctx)) }
}

/// Adds an empty node (`cuGraphAddEmptyNode`).
///
/// # Safety
/// The node-adding promise (above).
pub(crate) unsafe fn add_empty_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuGraphAddEmptyNode(out, graph, deps, n)) }
}

/// Adds an event record node (`cuGraphAddEventRecordNode`).
///
/// # Safety
/// The node-adding promise (above); the graph keeps `event` alive.
pub(crate) unsafe fn add_event_record_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddEventRecordNode(out, graph, deps, n, event)) }
}

/// Adds an event wait node (`cuGraphAddEventWaitNode`).
///
/// # Safety
/// The node-adding promise (above); the graph keeps `event` alive.
pub(crate) unsafe fn add_event_wait_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddEventWaitNode(out, graph, deps, n, event)) }
}

/// Adds a host node (`cuGraphAddHostNode`).
///
/// # Safety
/// The node-adding promise (above); `params.userData` stays valid while the graph and its execs
/// may run the node; the function never unwinds and never calls CUDA.
pub(crate) unsafe fn add_host_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &sys::CUDA_HOST_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddHostNode(out, graph, deps, n, params)) }
}

/// Adds a child-graph node that runs a copy of `child` (`cuGraphAddChildGraphNode`).
///
/// # Safety
/// The node-adding promise (above); `child` is live and its tree locked too.
pub(crate) unsafe fn add_child_graph_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    child: sys::CUgraph,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddChildGraphNode(out, graph, deps, n, child)) }
}

/// Adds a memory allocation node (`cuGraphAddMemAllocNode`); the driver writes the address into
/// `params.dptr`.
///
/// # Safety
/// The node-adding promise (above); `params` is fully initialised.
pub(crate) unsafe fn add_mem_alloc_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    params: &mut sys::CUDA_MEM_ALLOC_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddMemAllocNode(out, graph, deps, n, params)) }
}

/// Adds a memory free node (`cuGraphAddMemFreeNode`).
///
/// # Safety
/// The node-adding promise (above); `ptr` was returned by a live allocation node of `graph`.
pub(crate) unsafe fn add_mem_free_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    n: usize,
    ptr: sys::CUdeviceptr,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddMemFreeNode(out, graph, deps, n, ptr)) }
}

/// Adds a node of any kind from a parameter block (`cuGraphAddNode_v2`), with edge data `edges`
/// (null for default edges).
///
/// # Safety
/// The node-adding promise (above; `deps` may be non-null with `n == 0`); `edges` is null or
/// holds `n` entries; `params` is a valid, fully initialised parameter block.
pub(crate) unsafe fn add_node(
    out: &mut sys::CUgraphNode,
    graph: sys::CUgraph,
    deps: *const sys::CUgraphNode,
    edges: *const sys::CUgraphEdgeData,
    n: usize,
    params: &mut sys::CUgraphNodeParams,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphAddNode_v2(out, graph, deps, edges, n, params)) }
}

/// Lists the nodes of `graph` (`cuGraphGetNodes`): with `nodes` null, writes their count into
/// `n`; else fills `nodes` with up to `*n` of them and writes how many it wrote.
///
/// # Safety
/// `graph` is live and its tree locked; `n` is valid for reads and writes; `nodes` is null or
/// has room for `*n` nodes.
pub(crate) unsafe fn get_nodes(
    graph: sys::CUgraph,
    nodes: *mut sys::CUgraphNode,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphGetNodes(graph, nodes, n)) }
}

/// Lists the edges of `graph` (`cuGraphGetEdges_v2`, without edge data; see
/// [`super::compat::edges`]), as `cuGraphGetNodes` lists nodes.
///
/// # Safety
/// `graph` is live and its tree locked; `n` is valid for reads and writes; `from` and `to` are
/// both null (to ask for the count) or both have room for `*n` nodes.
pub(crate) unsafe fn get_edges(
    graph: sys::CUgraph,
    from: *mut sys::CUgraphNode,
    to: *mut sys::CUgraphNode,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: the caller's promises above; no edge data is asked for.
    unsafe { edges!(cuGraphGetEdges_v2 / cuGraphGetEdges(graph, from, to; n)) }
}

/// Lists the nodes `node` runs after (`cuGraphNodeGetDependencies_v2`, without edge data), as
/// `cuGraphGetNodes` lists nodes.
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked; `n` is valid for reads and writes;
/// `deps` is null or has room for `*n` nodes.
pub(crate) unsafe fn node_dependencies(
    node: sys::CUgraphNode,
    deps: *mut sys::CUgraphNode,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: the caller's promises above; no edge data is asked for.
    unsafe { edges!(cuGraphNodeGetDependencies_v2 / cuGraphNodeGetDependencies(node, deps; n)) }
}

/// Lists the nodes that run after `node` (`cuGraphNodeGetDependentNodes_v2`, without edge data),
/// as `cuGraphGetNodes` lists nodes.
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked; `n` is valid for reads and writes;
/// `dependents` is null or has room for `*n` nodes.
pub(crate) unsafe fn node_dependents(
    node: sys::CUgraphNode,
    dependents: *mut sys::CUgraphNode,
    n: *mut usize,
) -> Result<()> {
    // SAFETY: the caller's promises above; no edge data is asked for.
    unsafe {
        edges!(cuGraphNodeGetDependentNodes_v2 / cuGraphNodeGetDependentNodes(node, dependents; n))
    }
}

/// Adds `n` edges `from[i]` → `to[i]` to `graph` (`cuGraphAddDependencies_v2`, without edge
/// data).
///
/// # Safety
/// `graph` is live and its tree locked; `from` and `to` hold `n` live nodes of it each.
pub(crate) unsafe fn add_dependencies(
    graph: sys::CUgraph,
    from: *const sys::CUgraphNode,
    to: *const sys::CUgraphNode,
    n: usize,
) -> Result<()> {
    // SAFETY: the caller's promises above; no edge data.
    unsafe { edges!(cuGraphAddDependencies_v2 / cuGraphAddDependencies(graph, from, to; n)) }
}

/// Removes `n` edges `from[i]` → `to[i]` from `graph` (`cuGraphRemoveDependencies_v2`, without
/// edge data).
///
/// # Safety
/// `graph` is live and its tree locked; `from` and `to` hold `n` live nodes of it each.
pub(crate) unsafe fn remove_dependencies(
    graph: sys::CUgraph,
    from: *const sys::CUgraphNode,
    to: *const sys::CUgraphNode,
    n: usize,
) -> Result<()> {
    // SAFETY: the caller's promises above; no edge data.
    unsafe { edges!(cuGraphRemoveDependencies_v2 / cuGraphRemoveDependencies(graph, from, to; n)) }
}

/// Destroys `node` and its edges (`cuGraphDestroyNode`).
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked, never passed to the driver again.
pub(crate) unsafe fn destroy_node(node: sys::CUgraphNode) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuGraphDestroyNode(node)) }
}

/// The raw type of `node` (`cuGraphNodeGetType`), as the integer the driver writes.
///
/// # Safety
/// `node` is a live node of a graph whose tree is locked.
pub(crate) unsafe fn node_type(node: sys::CUgraphNode) -> Result<u32> {
    let mut v: u32 = u32::MAX;
    // SAFETY: `node` is a live node (the caller's promise). The driver writes a 4-byte enum
    // value; it is written into a `u32`, never read as the Rust enum, so an unknown value from a
    // newer driver is not undefined behaviour.
    unsafe {
        drv!(cuGraphNodeGetType(
            node,
            (&mut v as *mut u32).cast::<sys::CUgraphNodeType>()
        ))
    }?;
    Ok(v)
}

// Parameter updates of definition nodes. They share one promise: `node` is a live node of a
// graph whose tree is locked, of the type the call is for, and what the new parameters refer to
// is held by the node's slot (see `NodeTable::replace_owners`) from before the call.

/// Sets a kernel node's parameters (`cuGraphKernelNodeSetParams_v2`).
///
/// # Safety
/// The node-update promise (above); `params` points at argument storage that outlives the call
/// (the driver copies it) and the arguments match the kernel, which stays in bounds of the
/// memory it is given.
pub(crate) unsafe fn kernel_node_set_params(
    node: sys::CUgraphNode,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphKernelNodeSetParams_v2(node, params)) }
}

/// Sets a memset node's parameters (`cuGraphMemsetNodeSetParams`).
///
/// # Safety
/// The node-update promise (above); the memset lies inside memory the node holds.
pub(crate) unsafe fn memset_node_set_params(
    node: sys::CUgraphNode,
    params: &sys::CUDA_MEMSET_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphMemsetNodeSetParams(node, params)) }
}

/// Sets a memcpy node's parameters (`cuGraphMemcpyNodeSetParams`).
///
/// # Safety
/// The node-update promise (above); the copy lies inside memory the node holds.
pub(crate) unsafe fn memcpy_node_set_params(
    node: sys::CUgraphNode,
    copy: &sys::CUDA_MEMCPY3D,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphMemcpyNodeSetParams(node, copy)) }
}

/// Sets a host node's function and data (`cuGraphHostNodeSetParams`).
///
/// # Safety
/// The node-update promise (above); `params.userData` stays valid while the node holds it; the
/// function never unwinds and never calls CUDA.
pub(crate) unsafe fn host_node_set_params(
    node: sys::CUgraphNode,
    params: &sys::CUDA_HOST_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphHostNodeSetParams(node, params)) }
}

/// Sets the event an event record node records (`cuGraphEventRecordNodeSetEvent`).
///
/// # Safety
/// The node-update promise (above); `event` is live and held by the node.
pub(crate) unsafe fn event_record_node_set_event(
    node: sys::CUgraphNode,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphEventRecordNodeSetEvent(node, event)) }
}

/// Sets the event an event wait node waits for (`cuGraphEventWaitNodeSetEvent`).
///
/// # Safety
/// The node-update promise (above); `event` is live and held by the node.
pub(crate) unsafe fn event_wait_node_set_event(
    node: sys::CUgraphNode,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphEventWaitNodeSetEvent(node, event)) }
}

/// Sets a node's parameters from a parameter block (`cuGraphNodeSetParams`, driver 12.2).
///
/// # Safety
/// The node-update promise (above); `params` is a valid, fully initialised block (unused bytes
/// zeroed) of the node's type; a child graph it names is live and its tree locked too.
pub(crate) unsafe fn node_set_params(
    node: sys::CUgraphNode,
    params: &mut sys::CUgraphNodeParams,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphNodeSetParams(node, params)) }
}

// Parameter updates of exec nodes. They share one promise: `exec` is live and not launched or
// updated concurrently (its lock is held); `node` is a live node of the graph `exec` was
// instantiated from, of the type the call is for, that existed at instantiation, and the tree of
// that graph is locked; what the new parameters refer to is held by the exec from before the
// call until its last launch that may use it has finished.

/// Sets a kernel node's parameters in an exec (`cuGraphExecKernelNodeSetParams_v2`).
///
/// # Safety
/// The exec-update promise (above); as [`kernel_node_set_params`] for `params`.
pub(crate) unsafe fn exec_kernel_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecKernelNodeSetParams_v2(exec, node, params)) }
}

/// Sets a memset node's parameters in an exec (`cuGraphExecMemsetNodeSetParams`).
///
/// # Safety
/// The exec-update promise (above); the memset lies inside memory the exec holds; `ctx` is the
/// exec's context.
pub(crate) unsafe fn exec_memset_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    params: &sys::CUDA_MEMSET_NODE_PARAMS,
    ctx: sys::CUcontext,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecMemsetNodeSetParams(exec, node, params, ctx)) }
}

/// Sets a memcpy node's parameters in an exec (`cuGraphExecMemcpyNodeSetParams`).
///
/// # Safety
/// The exec-update promise (above); the copy lies inside memory the exec holds; `ctx` is the
/// exec's context.
pub(crate) unsafe fn exec_memcpy_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    copy: &sys::CUDA_MEMCPY3D,
    ctx: sys::CUcontext,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecMemcpyNodeSetParams(exec, node, copy, ctx)) }
}

/// Sets a host node's function and data in an exec (`cuGraphExecHostNodeSetParams`).
///
/// # Safety
/// The exec-update promise (above); as [`host_node_set_params`] for `params`.
pub(crate) unsafe fn exec_host_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    params: &sys::CUDA_HOST_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecHostNodeSetParams(exec, node, params)) }
}

/// Updates a child-graph node of an exec from `child` (`cuGraphExecChildGraphNodeSetParams`).
///
/// # Safety
/// The exec-update promise (above); `child` is live and its tree locked.
pub(crate) unsafe fn exec_child_graph_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    child: sys::CUgraph,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecChildGraphNodeSetParams(exec, node, child)) }
}

/// Sets the event an event record node of an exec records
/// (`cuGraphExecEventRecordNodeSetEvent`).
///
/// # Safety
/// The exec-update promise (above); `event` is live and held by the exec.
pub(crate) unsafe fn exec_event_record_node_set_event(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecEventRecordNodeSetEvent(exec, node, event)) }
}

/// Sets the event an event wait node of an exec waits for (`cuGraphExecEventWaitNodeSetEvent`).
///
/// # Safety
/// The exec-update promise (above); `event` is live and held by the exec.
pub(crate) unsafe fn exec_event_wait_node_set_event(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    event: sys::CUevent,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecEventWaitNodeSetEvent(exec, node, event)) }
}

/// Enables or disables `node` in `exec` (`cuGraphNodeSetEnabled`).
///
/// # Safety
/// The exec-update promise (above), without new parameters.
pub(crate) unsafe fn node_set_enabled(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    enabled: bool,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphNodeSetEnabled(exec, node, u32::from(enabled))) }
}

/// Whether `node` is enabled in `exec` (`cuGraphNodeGetEnabled`).
///
/// # Safety
/// As [`node_set_enabled`].
pub(crate) unsafe fn node_get_enabled(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
) -> Result<bool> {
    let mut v: std::ffi::c_uint = 0;
    // SAFETY: the caller's promises above; `v` is a valid out pointer.
    unsafe { drv!(cuGraphNodeGetEnabled(exec, node, &mut v)) }?;
    Ok(v != 0)
}

// Read-back of node parameters. They share one promise: `node` is a live node of a graph whose
// tree is locked, of the type the call is for. What a call returns that points into the driver
// (a kernel's argument array) is valid only until the node is changed or destroyed: read it under
// the same lock.

/// A kernel node's parameters (`cuGraphKernelNodeGetParams_v2`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn kernel_node_get_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_KERNEL_NODE_PARAMS> {
    // SAFETY: the structure is plain C data (pointers and integers, no enums): zero is valid.
    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's promise above; `p` is a valid out pointer.
    unsafe { drv!(cuGraphKernelNodeGetParams_v2(node, &mut p)) }?;
    Ok(p)
}

/// A memset node's parameters (`cuGraphMemsetNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn memset_node_get_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_MEMSET_NODE_PARAMS> {
    // SAFETY: plain C integers: zero is valid.
    let mut p: sys::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's promise above; `p` is a valid out pointer.
    unsafe { drv!(cuGraphMemsetNodeGetParams(node, &mut p)) }?;
    Ok(p)
}

/// A memory copy as the driver describes it, with the memory types as the integers the driver
/// writes (`CUmemorytype`: 1 host, 2 device, 3 array, 4 unified).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memcpy3d {
    pub(crate) src_type: u32,
    pub(crate) src_host: usize,
    pub(crate) src_device: u64,
    pub(crate) src_x: usize,
    pub(crate) dst_type: u32,
    pub(crate) dst_host: usize,
    pub(crate) dst_device: u64,
    pub(crate) dst_x: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) depth: usize,
}

/// A memcpy node's copy (`cuGraphMemcpyNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn memcpy_node_get_params(node: sys::CUgraphNode) -> Result<Memcpy3d> {
    let mut p = std::mem::MaybeUninit::<sys::CUDA_MEMCPY3D>::zeroed();
    // SAFETY: the caller's promise above; `p` is valid for writes.
    unsafe { drv!(cuGraphMemcpyNodeGetParams(node, p.as_mut_ptr())) }?;
    let p = p.as_ptr();
    // SAFETY: every field is read through a raw pointer as the C type it is (the memory types as
    // `u32`), so a value the bindings' enums do not list is not undefined behaviour; the
    // structure was zeroed and then written by the driver.
    unsafe {
        use std::ptr::addr_of;
        Ok(Memcpy3d {
            src_type: addr_of!((*p).srcMemoryType).cast::<u32>().read(),
            src_host: addr_of!((*p).srcHost).read() as usize,
            src_device: addr_of!((*p).srcDevice).read(),
            src_x: addr_of!((*p).srcXInBytes).read(),
            dst_type: addr_of!((*p).dstMemoryType).cast::<u32>().read(),
            dst_host: addr_of!((*p).dstHost).read() as usize,
            dst_device: addr_of!((*p).dstDevice).read(),
            dst_x: addr_of!((*p).dstXInBytes).read(),
            width: addr_of!((*p).WidthInBytes).read(),
            height: addr_of!((*p).Height).read(),
            depth: addr_of!((*p).Depth).read(),
        })
    }
}

/// A host node's function and user data (`cuGraphHostNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn host_node_get_params(
    node: sys::CUgraphNode,
) -> Result<(Option<unsafe extern "C" fn(*mut std::ffi::c_void)>, usize)> {
    // SAFETY: an optional function pointer and a pointer: zero is valid (`None`, null).
    let mut p: sys::CUDA_HOST_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's promise above; `p` is a valid out pointer.
    unsafe { drv!(cuGraphHostNodeGetParams(node, &mut p)) }?;
    Ok((p.fn_, p.userData as usize))
}

/// The node of `copy` made from `original` when `copy` was made from its graph
/// (`cuGraphNodeFindInClone`), or an error where the driver cannot tell.
///
/// # Safety
/// `original` is a live node of a graph whose tree is locked; `copy` is a live graph of a locked
/// tree.
pub(crate) unsafe fn node_find_in_clone(
    original: sys::CUgraphNode,
    copy: sys::CUgraph,
) -> Result<sys::CUgraphNode> {
    let mut n = std::ptr::null_mut();
    // SAFETY: the caller's promise above; `n` is a valid out pointer.
    unsafe { drv!(cuGraphNodeFindInClone(&mut n, original, copy)) }?;
    Ok(n)
}

/// The graph a child-graph node runs (`cuGraphChildGraphNodeGetGraph`): owned by the node, not
/// a copy; changing it changes the node.
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn child_graph_node_get_graph(node: sys::CUgraphNode) -> Result<sys::CUgraph> {
    let mut g = std::ptr::null_mut();
    // SAFETY: the caller's promise above; `g` is a valid out pointer.
    unsafe { drv!(cuGraphChildGraphNodeGetGraph(node, &mut g)) }?;
    Ok(g)
}

/// The event an event-record (`wait == false`) or event-wait node uses
/// (`cuGraphEventRecordNodeGetEvent`, `cuGraphEventWaitNodeGetEvent`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn event_node_get_event(
    node: sys::CUgraphNode,
    wait: bool,
) -> Result<sys::CUevent> {
    let mut e = std::ptr::null_mut();
    // SAFETY: the caller's promise above; `e` is a valid out pointer.
    unsafe {
        if wait {
            drv!(cuGraphEventWaitNodeGetEvent(node, &mut e))
        } else {
            drv!(cuGraphEventRecordNodeGetEvent(node, &mut e))
        }
    }?;
    Ok(e)
}

/// A memory allocation node's address, size in bytes and device
/// (`cuGraphMemAllocNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn mem_alloc_node_get_params(
    node: sys::CUgraphNode,
) -> Result<(u64, usize, i32)> {
    let mut p = std::mem::MaybeUninit::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>::zeroed();
    // SAFETY: the caller's promise above; `p` is valid for writes.
    unsafe { drv!(cuGraphMemAllocNodeGetParams(node, p.as_mut_ptr())) }?;
    let p = p.as_ptr();
    // SAFETY: the fields are read through raw pointers as the C types they are: the pool's
    // location is `{ int type; int id; }` in every CUDA version (later ones make `id` a union of
    // 4 bytes), so the device ordinal is the second `i32`; no enum is read.
    unsafe {
        use std::ptr::addr_of;
        let location = addr_of!((*p).poolProps.location).cast::<i32>();
        Ok((
            addr_of!((*p).dptr).read(),
            addr_of!((*p).bytesize).read(),
            location.add(1).read(),
        ))
    }
}

/// A memory free node's address (`cuGraphMemFreeNodeGetParams`).
///
/// # Safety
/// The read-back promise (above).
pub(crate) unsafe fn mem_free_node_get_params(node: sys::CUgraphNode) -> Result<u64> {
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: the caller's promise above; `d` is a valid out pointer.
    unsafe { drv!(cuGraphMemFreeNodeGetParams(node, &mut d)) }?;
    Ok(d)
}

/// A copy of `graph` (`cuGraphClone`), owned by the caller.
///
/// # Safety
/// `graph` is live and its tree locked.
pub(crate) unsafe fn clone(graph: sys::CUgraph) -> Result<sys::CUgraph> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: the graph is live and its tree locked (the caller's promise); `raw` is a valid out
    // pointer.
    unsafe { drv!(cuGraphClone(&mut raw, graph)) }?;
    Ok(raw)
}

/// Writes `graph` as DOT to `path` (`cuGraphDebugDotPrint`).
///
/// # Safety
/// `graph` is live and its tree locked.
pub(crate) unsafe fn debug_dot_print(
    graph: sys::CUgraph,
    path: &std::ffi::CStr,
    flags: std::ffi::c_uint,
) -> Result<()> {
    // SAFETY: the caller's promise above; `path` is NUL-terminated.
    unsafe { drv!(cuGraphDebugDotPrint(graph, path.as_ptr(), flags)) }
}

/// Creates a conditional handle in `graph` (`cuGraphConditionalHandleCreate`).
///
/// # Safety
/// `graph` and `ctx` are live, `ctx` the graph's context, and the graph's tree is locked.
pub(crate) unsafe fn conditional_handle_create(
    graph: sys::CUgraph,
    ctx: sys::CUcontext,
    default_launch_value: std::ffi::c_uint,
    flags: std::ffi::c_uint,
) -> Result<sys::CUgraphConditionalHandle> {
    let mut raw = 0;
    // SAFETY: the caller's promises above; `raw` is a valid out pointer.
    unsafe {
        drv!(cuGraphConditionalHandleCreate(
            &mut raw,
            graph,
            ctx,
            default_launch_value,
            flags
        ))
    }?;
    Ok(raw)
}

/// Instantiates `graph` (`cuGraphInstantiateWithParams`). The driver writes the exec into `exec`
/// (possibly also when it fails) and its result into `params`.
///
/// # Safety
/// `graph` is live and its tree locked; `params` points at a fully initialised parameter block.
pub(crate) unsafe fn instantiate_with_params(
    exec: &mut sys::CUgraphExec,
    graph: sys::CUgraph,
    params: *mut sys::CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> Result<()> {
    // SAFETY: the caller's promises above; `exec` is a valid out pointer.
    unsafe { drv!(cuGraphInstantiateWithParams(exec, graph, params)) }
}

/// Updates `exec`'s node parameters from `graph` (`cuGraphExecUpdate_v2`); the driver writes
/// the outcome into `info`.
///
/// # Safety
/// `exec` and `graph` are live, the graph's tree locked, the exec not being launched or updated
/// concurrently; `info` is valid for a write of a `CUgraphExecUpdateResultInfo`.
pub(crate) unsafe fn exec_update(
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
    info: *mut sys::CUgraphExecUpdateResultInfo,
) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphExecUpdate_v2(exec, graph, info)) }
}

/// Launches `exec` on `stream` (`cuGraphLaunch`).
///
/// # Safety
/// `exec` and `stream` are live; the exec is not launched or updated concurrently.
pub(crate) unsafe fn launch(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphLaunch(exec, stream)) }
}

/// Uploads `exec`'s work to the device on `stream` (`cuGraphUpload`).
///
/// # Safety
/// `exec` and `stream` are live; the exec is not launched or updated concurrently.
pub(crate) unsafe fn upload(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's promises above.
    unsafe { drv!(cuGraphUpload(exec, stream)) }
}

/// Destroys `exec` (`cuGraphExecDestroy`); the driver defers the free until its launches finish.
///
/// # Safety
/// `exec` is live, owned by the caller, and never used again.
pub(crate) unsafe fn exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
    // SAFETY: the caller's promise above.
    unsafe { drv!(cuGraphExecDestroy(exec)) }
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
    fn owner_searches_reach_any_depth_and_visit_shared_chunks_once() {
        // 64 levels, each holding the level below twice (as a chain of clones or embeds shares
        // its chunks): the value at the bottom is found, and each chunk is looked at once.
        let bottom: Owner = Arc::new(42u32);
        let mut level: Owner = Arc::new(vec![bottom.clone()]);
        for _ in 0..64 {
            level = Arc::new(vec![level.clone(), Arc::new(0u8) as Owner, level]);
        }
        let mut visits = 0;
        let found = search_owners(std::iter::once(&level), &mut |o| {
            visits += 1;
            o.downcast_ref::<u32>() == Some(&42)
        });
        assert!(found.is_some_and(|f| Arc::ptr_eq(&f, &bottom)));
        assert!(visits < 64 * 3 + 4, "{visits} visits");
        // A predicate that never picks visits everything once and finds nothing.
        let mut all = 0;
        assert!(search_owners(std::iter::once(&level), &mut |_| {
            all += 1;
            false
        })
        .is_none());
        assert_eq!(all, 1 + 64 * 3 + 1);
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
