//! The node table of a graph tree: the live nodes this crate handed out tokens for, and what
//! each uses (slots, free lists, shared entries), with the id maps and owner types it is built on.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The hasher of the crate's internal integer keys (ids, node and object addresses): rustc's Fx
/// hash, a multiply per word. The keys are not chosen by an adversary.
type Ids = rustc_hash::FxBuildHasher;
/// A map keyed by ids or addresses.
pub(crate) type IdMap<K, V> = HashMap<K, V, Ids>;
/// A set of ids or addresses.
pub(crate) type IdSet<K> = HashSet<K, Ids>;

/// A batch of values that graphs and execs keep alive (see
/// [`TreeState::snapshot`](super::TreeState::snapshot)).
pub(crate) type KeepChunk = Arc<Vec<Arc<dyn Any + Send + Sync>>>;

/// A value that a node uses and that must outlive it (a buffer's allocation, a module, a
/// callback's state, an event, an embedded graph's operands).
pub(crate) type Owner = Arc<dyn Any + Send + Sync>;

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
/// references, see [`TreeState::snapshot`](super::TreeState::snapshot)), and is released when
/// the node is destroyed.
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
    /// The tree's [`TreeState::epoch`](super::TreeState::epoch) when the node was made (an upper
    /// bound for nodes seen first in a listing): an exec instantiated at a later epoch knows the
    /// node.
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
    pub(super) fn all_owners(&self) -> impl Iterator<Item = &Owner> {
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
    /// For a tree no one can instantiate, copy or read again (see
    /// [`TreeState::take_operands`](super::TreeState::take_operands)).
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
    pub(super) fn owners_chunk(&mut self) -> Option<KeepChunk> {
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

// The node table's part of the cache-line plan (the rest is checked with `TreeState`, in
// src/driver/graph/tree.rs).
#[cfg(not(cuda_graph_loom))]
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(NodeTable, last_shared) == 64);
    assert!(offset_of!(NodeTable, graphs) == 128);
};

/// Which entries of a tree's owners chunk each of its explicit nodes used when an exec was
/// instantiated: `nodes` lists `(graph id, raw node)` with a range of `uses`, whose values are
/// positions in the chunk. An exec releases a node's entries once a per-node update replaced
/// its parameters and no other node of the exec uses them.
#[derive(Debug, Default)]
pub(crate) struct NodeOwnersIndex {
    pub(crate) nodes: Vec<((u64, usize), u32, u32)>,
    pub(crate) uses: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
