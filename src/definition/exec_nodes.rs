//! Per-node updates of an exec: [`Graph::set_params`], [`Graph::set_enabled`],
//! [`Graph::is_enabled`]. They take the definition's typed nodes and parameters, so they live
//! here, above the exec layer (`crate::graph`), which knows nothing of definitions.

use cudarc::driver::sys;

use super::node;
use super::params::{lock_with_child, Target};
use super::typed::{NodeKind, TypedNode};
use super::NodeParams;
use crate::driver;

use crate::driver::graph::pairing::{self, Shape};
use crate::driver::graph::{GraphHandle, Owners, TreeState};
use crate::driver::tree_lock::TreeGuard;
use crate::error::{Error, Refusal, Result};
use crate::graph::state::ExecState;
use crate::graph::Graph;
use crate::GraphNode;

/// Whether graph `graph` is the graph of a child-graph node (seen through
/// [`GraphDefinition::inspect`](crate::GraphDefinition::inspect)) or a conditional body inside
/// one, at any depth.
fn inside_embedded(tree: &TreeState, mut graph: u64) -> bool {
    // Bounded: the owner chain is acyclic, and no tree nests this deep in practice.
    for _ in 0..1024 {
        if tree.embedded.values().any(|v| *v == graph) {
            return true;
        }
        match tree
            .conditionals
            .iter()
            .find(|(_, rec)| rec.owns_body(graph))
        {
            Some(((parent, _), _)) => graph = *parent,
            None => return false,
        }
    }
    true
}

/// Checks that `node` is one of the nodes the exec instantiated from `source` at `epoch` has:
/// a live node of `source`'s tree made before the instantiation.
fn exec_node(
    tree: &TreeState,
    source: &GraphHandle,
    epoch: u64,
    node: &GraphNode,
) -> Result<sys::CUgraphNode> {
    tree.check_complete()?;
    if inside_embedded(tree, node.graph) {
        return Err(Error::invalid(
            Refusal::Unsupported,
            "a node inside a child-graph node's graph cannot be updated in an exec on its own: update the child-graph node (NodeParams::child_graph)",
        ));
    }
    let in_tree = node.graph == source.id
        || tree.dead().contains(&node.graph)
        || tree
            .conditionals
            .values()
            .any(|rec| rec.owns_body(node.graph))
        || tree.nodes.knows_graph(node.graph);
    if !in_tree {
        return Err(Error::ForeignNode);
    }
    match tree.nodes.born(node.graph, node.raw, node.serial) {
        None => Err(Error::DestroyedNode),
        Some(born) if born >= epoch => Err(Error::NodeNotInExec),
        Some(_) => Ok(node.raw()),
    }
}

/// A node named through the source of an exec's latest update ([`Graph::update`],
/// [`GraphCache::refresh`](crate::GraphCache::refresh)) rather than the graph it was
/// instantiated from: what [`latest_node`] found under the source's lock, for
/// [`paired_node`] to finish under the instantiation graph's.
struct LatestNode {
    /// The node's raw handle in the update's source.
    raw: usize,
    /// The source's structure, where the exec has no pairing with it yet.
    shape: Option<Shape>,
}

/// Whether `node` is a node of the exec's latest update's source (`None`: it is not, and is
/// checked as a node of the instantiation graph's tree). Takes the source's tree lock, and
/// reads its structure if no pairing was made yet.
fn latest_node(state: &ExecState, node: &GraphNode) -> Result<Option<LatestNode>> {
    let (Some(latest), Some((root, _))) = (&state.latest, &state.current) else {
        return Ok(None);
    };
    if node.graph != latest.id {
        return Ok(None);
    }
    let tree = root.lock();
    if !tree.nodes.is_live(node.graph, node.raw, node.serial) {
        return Err(Error::DestroyedNode);
    }
    if tree.shape != latest.shape {
        return Err(Error::invalid(
            Refusal::ForeignGraph,
            "the graph this exec was last updated from, or a graph of its tree, changed after the update (a node or edge added or removed, a capture ended): its nodes no longer name the exec's; update the exec from it again",
        ));
    }
    let shape = match latest.pairs {
        Some(_) => None,
        // SAFETY: the update's source graph is live (the exec holds its root) and its tree is
        // locked.
        None => Some(unsafe { Shape::read(latest.raw as sys::CUgraph) }?),
    };
    Ok(Some(LatestNode {
        raw: node.raw,
        shape,
    }))
}

/// The exec's node paired with `found` (a node of its latest update's source), as a node of the
/// instantiation graph, registered in its tree (`tree`, locked): pairs the two graphs first
/// if that was not done since the update ([`pairing`](crate::driver::graph::pairing)).
fn paired_node(
    state: &mut ExecState,
    tree: &mut TreeState,
    found: LatestNode,
) -> Result<GraphNode> {
    // Refused here, before anything is read or registered, as `exec_node` refuses it.
    tree.check_complete()?;
    if tree.shape != state.instantiated.shape {
        return Err(Error::invalid(
            Refusal::ForeignGraph,
            "the graph this exec was instantiated from, or a graph of its tree, changed since (a node or edge added or removed, a capture ended), so the nodes of a later update's source cannot be paired with the exec's: name the node through the graph the exec was instantiated from, or instantiate again",
        ));
    }
    let instantiated = &mut state.instantiated;
    let Some(latest) = state.latest.as_mut() else {
        return Err(no_source());
    };
    if let Some(new) = found.shape {
        let old = match instantiated.read.take() {
            Some(old) => old,
            // SAFETY: the instantiation graph is live (the exec holds its root) and its tree is
            // locked (`tree`).
            None => unsafe { Shape::read(instantiated.raw as sys::CUgraph) }?,
        };
        let pairs = pairing::pair(&old, &new).map(|to_old| {
            new.nodes
                .iter()
                .zip(to_old)
                .map(|(&n, o)| (n, old.nodes[o as usize]))
                .collect()
        });
        instantiated.read = Some(old);
        latest.pairs = Some(pairs.unwrap_or_default());
    }
    let raw = latest
        .pairs
        .as_ref()
        .and_then(|p| p.get(&found.raw))
        .copied()
        .ok_or_else(|| {
            Error::invalid(
                Refusal::ForeignGraph,
                "the nodes of the graph this exec was last updated from cannot be paired with the exec's: two of its sinks (nodes nothing runs after) look alike, so the driver may have paired them either way; name the node through the graph the exec was instantiated from (or join the sinks)",
            )
        })?;
    Ok(node::token(tree, instantiated.id, raw as sys::CUgraphNode))
}

/// The error for a node that is neither the instantiation graph's nor a top-level node of the
/// latest update's source: a refusal that says so where it is inside a conditional body of that
/// source (such nodes are not paired), else [`Error::ForeignNode`]. Takes the source's tree
/// lock: call it with no tree lock held.
fn not_in_exec(state: &ExecState, node: &GraphNode) -> Error {
    if let (Some(_), Some((root, _))) = (&state.latest, &state.current) {
        let tree = root.lock();
        let in_body = tree.nodes.knows_graph(node.graph)
            || tree
                .conditionals
                .values()
                .any(|rec| rec.owns_body(node.graph));
        if in_body {
            return Error::invalid(
                Refusal::ForeignGraph,
                "the node is inside a conditional body (or a child graph) of the graph this exec was last updated from: only that graph's own nodes are paired with the exec's; name it through the graph the exec was instantiated from",
            );
        }
    }
    Error::ForeignNode
}

impl Graph {
    /// Replaces the parameters of `node` in this exec with `params`
    /// (`cuGraphExecKernelNodeSetParams`, `cuGraphExecMemsetNodeSetParams`, … for its kind):
    /// the next launch uses them. `node` is a node of the graph this exec was instantiated from
    /// (the definition, or the view of the ended builder), or a node of the graph of its latest
    /// update ([`Graph::update`], [`GraphCache::refresh`](crate::GraphCache::refresh)), which
    /// names the exec node the update paired it with — as long as neither graph changed since,
    /// and the pairing is certain: where two sinks (nodes nothing runs after) of a graph look
    /// alike (same node type, same dependencies' types in the same order, recursively), the
    /// driver may pair them either way, and the source's nodes are refused (see
    /// `docs/design/definitions.md`, "Per-node updates").
    ///
    /// The definition is not changed. The exec holds what the new parameters use; what the
    /// parameters it replaces used — an earlier `set_params`'s, or what the node was
    /// instantiated with, as far as no other node of the exec uses it (a kernel's module shared
    /// with other kernel nodes stays) — is released once every launch made before has finished
    /// (and once nothing else, such as the definition, holds it). A refusal — a node of another graph
    /// ([`Error::ForeignNode`]; an earlier update's source), destroyed ([`Error::DestroyedNode`])
    /// or added after the instantiation ([`Error::NodeNotInExec`]), a node of the latest
    /// update's source inside one of its conditional bodies, after either graph changed, or
    /// where the pairing is not certain, or a node of the instantiation graph once the exec was
    /// updated from that graph after its structure changed
    /// ([`Refusal::ForeignGraph`](crate::Refusal::ForeignGraph)),
    /// parameters of another device, or the driver's (it refuses, for example, a 2D memset or a
    /// kernel of another context) — leaves the exec and what it holds as they were.
    ///
    /// Updates and launches of one exec are serialised.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, buf: &DeviceBuffer<i32>, stream: &Stream) -> cuda_graph::Result<()> {
    /// let def = GraphDefinition::new(device)?;
    /// let fill = def.add_memset(&[], buf, 1i32)?;
    /// let graph = def.instantiate()?;
    /// graph.set_params(&fill, NodeParams::memset(buf, 2i32)?)?;
    /// graph.launch(stream)?; // sets 2; the definition still sets 1
    /// # Ok(()) }
    /// ```
    pub fn set_params<K: NodeKind>(
        &self,
        node: &TypedNode<K>,
        params: NodeParams<K>,
    ) -> Result<()> {
        // Before the exec's lock (see `refuse_in_host_callback`).
        crate::driver::context::refuse_in_host_callback()?;
        params.check_device(self.exec.ctx.device)?;
        // Taken apart before the exec's lock, so that parameters refused below are dropped after
        // it is released: what they hold (a callback's closure) may call back into the crate,
        // this exec included, when dropped.
        let (raw, mut owners, handles) = params.into_parts();
        let mut state = self.lock_state();
        state.check_not_device_launched()?;
        self.exec.ctx.bind()?;
        let source = state.source.as_deref().cloned().ok_or_else(no_source)?;
        super::params::check_handles(&handles, &source)?;
        let latest = latest_node(&state, node)?;
        let (mut tree, child_tree) = lock_with_child(&source, raw.child(), &mut owners)?;
        let Some((node, raw_node)) = resolve(&mut state, &mut tree, &source, node, latest)? else {
            drop((tree, child_tree));
            return Err(not_in_exec(&state, node));
        };
        // SAFETY: `raw_node` is a live node of the locked source tree.
        unsafe { super::params::check_programmatic(&tree, &raw, raw_node) }?;
        // A child graph's contents replaced in an exec: as for a whole-graph update, the driver
        // does not compare the kind of an edge (see `UpdateFailure::Programmatic`).
        if raw.child().is_some()
            && (state.programmatic
                || tree.programmatic
                || child_tree.as_deref().is_some_and(|c| c.programmatic))
        {
            drop((tree, child_tree));
            return Err(Error::invalid(
                Refusal::Attribute,
                "this exec or the new child graph has programmatic edges (dependent kernels), which replacing a child graph's contents could put in front of a kernel that does not wait: instantiate again instead",
            ));
        }
        // SAFETY: the exec is live and its lock (`state`) held; `raw_node` is a live node of the
        // graph it was instantiated from, made before the instantiation (checked under that
        // graph's tree lock, held across the call), of kind `K` (a `TypedNode<K>` is only made for
        // nodes of that kind), and `raw` was made for kind `K`; `owners` holds what the
        // parameters use until it moves into the exec below; a child graph's tree is locked; the
        // context is the exec's.
        let r = unsafe { raw.apply(Target::Exec(self.exec.raw), raw_node, self.exec.ctx.raw) };
        // Where only execs hold the source graph (the definition and every view of it dropped:
        // execs and this call's clone are its references), no one can instantiate, copy or read
        // the graph again, so what its node held goes too.
        let from_source = match r {
            Ok(()) if source.only_execs_hold(1) => {
                tree.nodes
                    .replace_owners(node.graph, node.raw, node.serial, Owners::new())
            }
            _ => None,
        };
        drop((tree, child_tree));
        r?;
        // Stream-ordered allocations among the new parameters exist before the next launch.
        state.add_pending_ready(driver::memory::ready_events(owners.iter()));
        // Launches made so far may still use what the replaced parameters used: the previous
        // per-node update's values, or (the first time) what the node was instantiated with that
        // no other node of the exec uses.
        let key = (node.graph, node.raw);
        let instantiated = state.release_instantiated(key);
        let replaced = state.node_owners.insert(key, owners);
        if replaced.is_some() || !instantiated.is_empty() || from_source.is_some() {
            state.release_after_last_launch(Box::new((replaced, instantiated, from_source)));
        }
        Ok(())
    }

    /// Enables or disables `node` in this exec (`cuGraphNodeSetEnabled`): a disabled node does
    /// nothing when the exec is launched (its dependencies are still ordered), until it is
    /// enabled again. `node` is a node of the graph the exec was instantiated from or of its
    /// latest update's source, as for [`set_params`](Self::set_params). The driver supports kernel
    /// and memcpy nodes (newer drivers some more) and refuses others with an error; memset nodes,
    /// which it supports too, are refused here ([`Refusal::Unsupported`]): launches after a memset
    /// node was disabled and enabled again fail and end the context.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(graph: &Graph, k: &KernelNode, stream: &Stream) -> cuda_graph::Result<()> {
    /// graph.set_enabled(k, false)?;
    /// graph.launch(stream)?; // without k
    /// graph.set_enabled(k, true)?;
    /// assert!(graph.is_enabled(k)?);
    /// # Ok(()) }
    /// ```
    pub fn set_enabled(&self, node: &GraphNode, enabled: bool) -> Result<()> {
        // Before the exec's lock (see `refuse_in_host_callback`).
        crate::driver::context::refuse_in_host_callback()?;
        let mut state = self.lock_state();
        state.check_not_device_launched()?;
        self.exec.ctx.bind()?;
        let source = state.source.as_deref().cloned().ok_or_else(no_source)?;
        let raw_node = exec_node_of(&mut state, &source, node)?;
        // SAFETY: `raw_node` is a live node of the instantiation graph, whose tree is locked
        // (`raw_node.0`).
        let kind = unsafe { driver::graph::node_type(raw_node.1) }?;
        if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET as u32 {
            // Launches of an exec whose memset node was disabled and enabled again between
            // them fail with CUDA_ERROR_LAUNCH_FAILED, which ends the context: seen with raw
            // driver calls on driver 13.0 (`safety::a_memset_node_is_never_toggled`).
            return Err(Error::invalid(
                Refusal::Unsupported,
                "a memset node cannot be enabled or disabled in an exec: the driver's launches fail afterwards (CUDA_ERROR_LAUNCH_FAILED, which ends the context). point it at a scratch buffer with set_params instead, or put it in a conditional node's body",
            ));
        }
        // SAFETY: the exec is live and its lock held; `raw_node` is one of the nodes it was
        // instantiated with (checked under its graph's tree lock, held across the call).
        unsafe { driver::graph::node_set_enabled(self.exec.raw, raw_node.1, enabled) }
    }

    /// Whether `node` is enabled in this exec (`cuGraphNodeGetEnabled`); see
    /// [`set_enabled`](Self::set_enabled).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(graph: &Graph, k: &KernelNode) -> cuda_graph::Result<()> {
    /// assert!(graph.is_enabled(k)?); // nodes start enabled
    /// # Ok(()) }
    /// ```
    pub fn is_enabled(&self, node: &GraphNode) -> Result<bool> {
        // Before the exec's lock (see `refuse_in_host_callback`).
        crate::driver::context::refuse_in_host_callback()?;
        let mut state = self.lock_state();
        self.exec.ctx.bind()?;
        let source = state.source.as_deref().cloned().ok_or_else(no_source)?;
        let raw_node = exec_node_of(&mut state, &source, node)?;
        // SAFETY: as in `set_enabled`; the call only reads.
        unsafe { driver::graph::node_get_enabled(self.exec.raw, raw_node.1) }
    }
}

/// The exec's node that `node` names ([`exec_node`], through the latest update's source where
/// it is one of that graph's nodes), with the lock of the instantiation graph's tree, held for
/// the driver call that follows.
fn exec_node_of<'a>(
    state: &mut ExecState,
    source: &'a GraphHandle,
    node: &GraphNode,
) -> Result<(TreeGuard<'a, TreeState>, sys::CUgraphNode)> {
    let latest = latest_node(state, node)?;
    let mut tree = source.lock();
    match resolve(state, &mut tree, source, node, latest)? {
        Some((_, raw)) => Ok((tree, raw)),
        None => {
            drop(tree);
            Err(not_in_exec(state, node))
        }
    }
}

/// Under the instantiation tree's lock (`tree`): the exec node that `node` names — `node`
/// itself, or its partner where [`latest_node`] found it in the latest update's source — as a
/// token and the raw node ([`exec_node`]'s checks). `None` where it is foreign to the exec: the
/// caller unlocks and returns [`not_in_exec`], which takes another tree's lock.
fn resolve(
    state: &mut ExecState,
    tree: &mut TreeState,
    source: &GraphHandle,
    node: &GraphNode,
    latest: Option<LatestNode>,
) -> Result<Option<(GraphNode, sys::CUgraphNode)>> {
    let (node, own) = match latest {
        None => (*node, true),
        Some(found) => (paired_node(state, tree, found)?, false),
    };
    match exec_node(tree, source, state.epoch, &node) {
        Ok(_) if own && state.instantiated.restructured => Err(Error::invalid(
            Refusal::ForeignGraph,
            "this exec was updated from the graph it was instantiated from after that graph's structure changed (a node or edge added or removed, a capture ended): the update paired the graph's nodes with the exec's by their new places, so they no longer name the exec nodes instantiated from them; instantiate again",
        )),
        Ok(raw) => Ok(Some((node, raw))),
        Err(Error::ForeignNode) => Ok(None),
        Err(e) => Err(e),
    }
}

fn no_source() -> Error {
    Error::Internal("the exec no longer holds the graph it was instantiated from".into())
}
