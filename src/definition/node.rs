//! [`GraphNode`] tokens, [`NodeType`], and the per-tree registry that keeps tokens honest.

use cudarc::driver::sys;

use crate::driver::graph::{Owner, Owners, Reserved, SharedRef, TreeState};
use crate::error::{Error, Refusal, Result};

/// A node of one graph: the value the `add_*` methods of [`GraphDefinition`](crate::GraphDefinition)
/// return, and what they take as dependencies.
///
/// It is a name, not an owner: it is `Copy`, keeps nothing alive, and is only meaningful to the
/// definitions of the graph it was added to (or listed from, with `nodes()`). Passing it to a
/// definition of another graph is an [`Error::ForeignNode`]; using it after
/// [`destroy_node`](crate::GraphDefinition::destroy_node) is an [`Error::DestroyedNode`] (even if
/// the driver reuses the node's address for a new node). `Send + Sync`.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(device: &Device) -> cuda_graph::Result<()> {
/// let def = GraphDefinition::new(device)?;
/// let first = def.add_empty(&[])?;
/// let second = def.add_empty(&[&first])?; // runs after `first`
/// assert_eq!(def.successors(&first)?, [second]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphNode {
    /// The id of the graph (`GraphHandle::id`) the node lives in.
    pub(crate) graph: u64,
    /// The raw `CUgraphNode`, as an address.
    pub(crate) raw: usize,
    /// Distinguishes this node from a later one at the same address.
    pub(crate) serial: u64,
}

impl GraphNode {
    pub(crate) fn raw(&self) -> sys::CUgraphNode {
        self.raw as sys::CUgraphNode
    }
}

pub use crate::node_type::NodeType;

/// Registers a node the driver just made (or that this crate sees for the first time) in graph
/// `graph` and returns its token. A node already registered keeps its token.
pub(crate) fn token(tree: &mut TreeState, graph: u64, raw: sys::CUgraphNode) -> GraphNode {
    let born = tree.unregistered_born();
    let serial = tree.nodes.lookup_or_insert(graph, raw as usize, born);
    GraphNode {
        graph,
        raw: raw as usize,
        serial,
    }
}

/// Registers a node the driver just created, holding `owners` (what it uses) until it is
/// destroyed: it gets a new serial even if a destroyed node had its address. What a node
/// forgotten on the way held is pushed to `released`, to be dropped once the tree is unlocked.
#[inline]
pub(crate) fn fresh(
    tree: &mut TreeState,
    graph: u64,
    raw: sys::CUgraphNode,
    shared: &[SharedRef<'_>],
    owners: Owners,
    released: &mut Vec<Owner>,
) -> GraphNode {
    let r = reserve(tree, graph, shared, owners);
    commit(tree, graph, r, raw, released)
}

/// [`fresh`]'s first half, before the driver makes the node (see `NodeTable::reserve`): a node
/// made now, in graph `graph`, using `shared` and holding `owners`.
#[inline]
pub(crate) fn reserve(
    tree: &mut TreeState,
    graph: u64,
    shared: &[SharedRef<'_>],
    owners: Owners,
) -> Reserved {
    let born = tree.epoch;
    tree.nodes.reserve(graph, shared, owners, born)
}

/// [`fresh`]'s second half: the node the driver made at `raw`, with its token.
#[inline]
pub(crate) fn commit(
    tree: &mut TreeState,
    graph: u64,
    r: Reserved,
    raw: sys::CUgraphNode,
    released: &mut Vec<Owner>,
) -> GraphNode {
    let serial = tree.nodes.commit(r, graph, raw as usize, released);
    tree.shape = tree.shape.wrapping_add(1);
    GraphNode {
        graph,
        raw: raw as usize,
        serial,
    }
}

/// Checks that `node` is a live node of graph `graph`.
#[inline]
pub(crate) fn check(tree: &TreeState, graph: u64, node: &GraphNode) -> Result<sys::CUgraphNode> {
    if is_live_in(tree, graph, node) {
        Ok(node.raw())
    } else {
        Err(refusal(graph, node))
    }
}

/// Whether `node` is a live node of graph `graph`.
#[inline]
fn is_live_in(tree: &TreeState, graph: u64, node: &GraphNode) -> bool {
    node.graph == graph && tree.nodes.is_live(graph, node.raw, node.serial)
}

/// Why [`check`] refused `node`.
#[cold]
#[inline(never)]
fn refusal(graph: u64, node: &GraphNode) -> Error {
    if node.graph != graph {
        Error::ForeignNode
    } else {
        Error::DestroyedNode
    }
}

/// Room on the stack for the raw nodes of a short dependency list ([`check_deps`]).
pub(crate) type DepRoom = [std::mem::MaybeUninit<sys::CUgraphNode>; 8];

/// An empty [`DepRoom`].
pub(crate) const DEP_ROOM: DepRoom = [std::mem::MaybeUninit::uninit(); 8];

/// Checks every dependency and writes the raw nodes into `room` (up to eight) or `spill`;
/// returns them as the pointer and count the driver takes (null and 0 for none), valid while
/// `room` and `spill` are. Every node-adding path checks its dependencies here; on the per-node
/// path of explicit definitions a `SmallVec` cost a call per node (its drop glue).
///
/// No dependency and one (a chain) are checked inline; more in [`check_many`], whose loop the
/// compiler unrolls into a body too large to inline (one dependency through it cost 70
/// instructions with the stub driver, inline about 20).
#[inline(always)]
pub(crate) fn check_deps(
    tree: &TreeState,
    graph: u64,
    nodes: &[&GraphNode],
    room: &mut DepRoom,
    spill: &mut Vec<sys::CUgraphNode>,
) -> Result<(*const sys::CUgraphNode, usize)> {
    match nodes {
        [] => Ok((std::ptr::null(), 0)),
        [one] => {
            if !is_live_in(tree, graph, one) {
                return Err(refusal(graph, one));
            }
            room[0].write(one.raw());
            Ok((room.as_ptr().cast(), 1))
        }
        _ => check_many(tree, graph, nodes, room, spill),
    }
}

/// [`check_deps`] for two dependencies or more.
#[inline(never)]
fn check_many(
    tree: &TreeState,
    graph: u64,
    nodes: &[&GraphNode],
    room: &mut DepRoom,
    spill: &mut Vec<sys::CUgraphNode>,
) -> Result<(*const sys::CUgraphNode, usize)> {
    if nodes.len() <= room.len() {
        for (slot, n) in room.iter_mut().zip(nodes) {
            if !is_live_in(tree, graph, n) {
                return Err(refusal(graph, n));
            }
            slot.write(n.raw());
        }
        return Ok((room.as_ptr().cast(), nodes.len()));
    }
    spill.reserve_exact(nodes.len());
    for n in nodes {
        if !is_live_in(tree, graph, n) {
            return Err(refusal(graph, n));
        }
        spill.push(n.raw());
    }
    Ok((spill.as_ptr(), spill.len()))
}

/// Checks every node of `nodes` and keeps nothing.
pub(crate) fn check_each(tree: &TreeState, graph: u64, nodes: &[&GraphNode]) -> Result<()> {
    for n in nodes {
        check(tree, graph, n)?;
    }
    Ok(())
}

/// Checks both ends of an edge: live nodes of `graph`, and not the same node.
pub(crate) fn check_edge(
    tree: &TreeState,
    graph: u64,
    from: &GraphNode,
    to: &GraphNode,
) -> Result<(sys::CUgraphNode, sys::CUgraphNode)> {
    let (a, b) = (check(tree, graph, from)?, check(tree, graph, to)?);
    if a == b {
        return Err(Error::invalid(
            Refusal::Order,
            "an edge from a node to itself would be a cycle",
        ));
    }
    Ok((a, b))
}

/// Forgets a destroyed node and returns what it used, to be dropped once the tree is unlocked
/// (a value's `Drop` may call back into this crate). If it was a conditional node this crate
/// made, its body graphs (freed by the driver with it) are marked dead and their nodes forgotten
/// too.
#[must_use = "the owners are dropped by the caller, after unlocking the tree"]
pub(crate) fn forget(tree: &mut TreeState, graph: u64, node: &GraphNode) -> Vec<Owner> {
    let mut released: Vec<Owner> = tree
        .nodes
        .remove(graph, node.raw, node.serial)
        .into_iter()
        .collect();
    tree.unfreed.remove(&(graph, node.raw));
    let mut owned: Vec<u64> = tree
        .conditionals
        .remove(&(graph, node.raw))
        .map(|rec| rec.bodies.iter().map(|&(id, _)| id).collect())
        .unwrap_or_default();
    owned.extend(tree.embedded.remove(&(graph, node.raw)));
    released.extend(forget_graphs(tree, owned));
    released
}

/// Forgets graphs the driver freed (the bodies or the child graph of a destroyed node, or a
/// child graph whose contents a parameter update replaced) and returns what their nodes used:
/// they are marked dead, so their views and node tokens are refused from now on.
#[must_use = "the owners are dropped by the caller, after unlocking the tree"]
pub(crate) fn forget_graphs(tree: &mut TreeState, mut owned: Vec<u64>) -> Vec<Owner> {
    // What those graphs' own conditional and child-graph nodes owned goes with them, at any
    // depth: the driver freed it all (an exec's per-node update must never reach those nodes,
    // and a handle that drove a nested conditional node is free again).
    /// The keys `(graph, raw node)` of `map` for nodes of graph `g`.
    fn nodes_of<V>(
        map: &crate::driver::graph::IdMap<(u64, usize), V>,
        g: u64,
    ) -> Vec<(u64, usize)> {
        map.keys()
            .filter(|(parent, _)| *parent == g)
            .copied()
            .collect()
    }
    let mut work = owned.clone();
    while let Some(g) = work.pop() {
        let mut below = Vec::new();
        for key in nodes_of(&tree.conditionals, g) {
            below.extend(
                tree.conditionals
                    .remove(&key)
                    .into_iter()
                    .flat_map(|rec| rec.bodies.into_iter().map(|(id, _)| id)),
            );
        }
        for key in nodes_of(&tree.embedded, g) {
            below.extend(tree.embedded.remove(&key));
        }
        tree.unfreed.retain(|(parent, _), _| *parent != g);
        tree.memory_users.retain(|(parent, _), _| *parent != g);
        owned.extend_from_slice(&below);
        work.extend(below);
    }
    let mut released = Vec::new();
    if !owned.is_empty() {
        released.extend(tree.nodes.remove_graphs(&owned));
        tree.mark_dead(owned);
    }
    released
}

#[cfg(test)]
mod tests;
