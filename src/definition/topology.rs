//! Inspecting and changing a definition's topology: nodes, edges, types, destroying nodes.

use super::node::{self, GraphNode, NodeType};
use super::GraphDefinition;
use crate::driver;
use crate::driver::graph::node_list as list;
use crate::driver::graph::TreeState;
use crate::error::{Error, Refusal, Result};

impl GraphDefinition {
    /// Every node of the graph (`cuGraphGetNodes`), including those a capture recorded.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// for n in def.nodes()? {
    ///     println!("{:?}", def.node_type(&n)?);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn nodes(&self) -> Result<Vec<GraphNode>> {
        let mut locked = self.lock()?;
        let g = self.handle();
        let raws = list(|p, n| {
            // SAFETY: the graph is live and locked; `p` is null or has room for `*n` nodes.
            unsafe { driver::graph::get_nodes(g.raw, p, n) }
        })?;
        Ok(raws
            .into_iter()
            .map(|r| node::token(&mut locked.tree, g.id, r))
            .collect())
    }

    /// Every edge of the graph as `(from, to)`: `to` runs after `from` (`cuGraphGetEdges`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let a = def.add_empty(&[])?;
    /// let b = def.add_empty(&[&a])?;
    /// assert_eq!(def.edges()?, [(*a, *b)]); // `*` gives the untyped tokens
    /// # Ok(()) }
    /// ```
    pub fn edges(&self) -> Result<Vec<(GraphNode, GraphNode)>> {
        let mut locked = self.lock()?;
        let g = self.handle();
        let mut n = 0usize;
        // SAFETY: the graph is live and locked; null arrays ask for the count.
        unsafe {
            driver::graph::get_edges(g.raw, std::ptr::null_mut(), std::ptr::null_mut(), &mut n)
        }?;
        let mut from = vec![std::ptr::null_mut(); n];
        let mut to = vec![std::ptr::null_mut(); n];
        if n > 0 {
            // SAFETY: both arrays have room for `n` nodes.
            unsafe { driver::graph::get_edges(g.raw, from.as_mut_ptr(), to.as_mut_ptr(), &mut n) }?;
        }
        from.truncate(n);
        to.truncate(n);
        Ok(from
            .into_iter()
            .zip(to)
            .map(|(a, b)| {
                (
                    node::token(&mut locked.tree, g.id, a),
                    node::token(&mut locked.tree, g.id, b),
                )
            })
            .collect())
    }

    /// What `node` does (`cuGraphNodeGetType`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::NodeType;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let e = def.add_empty(&[])?;
    /// assert_eq!(def.node_type(&e)?, NodeType::Empty);
    /// # Ok(()) }
    /// ```
    pub fn node_type(&self, node: &GraphNode) -> Result<NodeType> {
        let locked = self.lock()?;
        let raw = node::check(&locked.tree, self.handle().id, node)?;
        Ok(NodeType::from_raw(super::raw_node_type(raw)?))
    }

    /// The nodes `node` runs after (`cuGraphNodeGetDependencies`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, a: &GraphNode, b: &GraphNode) -> cuda_graph::Result<()> {
    /// let j = def.join(&[a, b])?;
    /// assert_eq!(def.predecessors(&j)?.len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn predecessors(&self, node: &GraphNode) -> Result<Vec<GraphNode>> {
        let mut locked = self.lock()?;
        let g = self.handle();
        let raw = node::check(&locked.tree, g.id, node)?;
        let raws = list(|p, n| {
            // SAFETY: `raw` is a live node of the locked graph; `p` is null or has room for `*n`.
            unsafe { driver::graph::node_dependencies(raw, p, n) }
        })?;
        Ok(raws
            .into_iter()
            .map(|r| node::token(&mut locked.tree, g.id, r))
            .collect())
    }

    /// The nodes that run after `node` (`cuGraphNodeGetDependentNodes`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, a: &GraphNode) -> cuda_graph::Result<()> {
    /// let next = def.successors(a)?;
    /// # Ok(()) }
    /// ```
    pub fn successors(&self, node: &GraphNode) -> Result<Vec<GraphNode>> {
        let mut locked = self.lock()?;
        let g = self.handle();
        let raw = node::check(&locked.tree, g.id, node)?;
        let raws = list(|p, n| {
            // SAFETY: `raw` is a live node of the locked graph; `p` is null or has room for `*n`.
            unsafe { driver::graph::node_dependents(raw, p, n) }
        })?;
        Ok(raws
            .into_iter()
            .map(|r| node::token(&mut locked.tree, g.id, r))
            .collect())
    }

    /// Adds an edge: `to` runs after `from` (`cuGraphAddDependencies`). Both must be live nodes
    /// of this graph and different ([`Error::ForeignNode`], [`Error::DestroyedNode`],
    /// [`Error::InvalidArgument`]); the driver refuses an edge that already exists.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let (a, b) = (def.add_empty(&[])?, def.add_empty(&[])?);
    /// def.add_edge(&a, &b)?;
    /// # Ok(()) }
    /// ```
    pub fn add_edge(&self, from: &GraphNode, to: &GraphNode) -> Result<()> {
        let mut locked = self.lock()?;
        let g = self.handle();
        let (a, b) = node::check_edge(&locked.tree, g.id, from, to)?;
        locked.tree.shape = locked.tree.shape.wrapping_add(1);
        // SAFETY: `a` and `b` are distinct live nodes of the locked graph; one edge, no data.
        unsafe { driver::graph::add_dependencies(g.raw, &a, &b, 1) }
    }

    /// Removes the edge from `from` to `to` (`cuGraphRemoveDependencies`); the driver refuses an
    /// edge that does not exist. Edges into a node that follows a kernel programmatically
    /// ([`add_dependent_kernel`](Self::add_dependent_kernel)) are not removed
    /// ([`Refusal::Attribute`](crate::Refusal::Attribute)).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, a: &GraphNode, b: &GraphNode) -> cuda_graph::Result<()> {
    /// def.remove_edge(a, b)?;
    /// # Ok(()) }
    /// ```
    pub fn remove_edge(&self, from: &GraphNode, to: &GraphNode) -> Result<()> {
        let mut locked = self.lock()?;
        let g = self.handle();
        let (a, b) = node::check_edge(&locked.tree, g.id, from, to)?;
        refuse_if_memory_nodes(&locked.tree, g.id, "an edge removed")?;
        // SAFETY: `b` is a live node of the locked graph.
        if locked.tree.programmatic && unsafe { driver::launch::has_programmatic_dependency(b) }? {
            return Err(Error::invalid(
                Refusal::Attribute,
                "`to` follows a kernel programmatically: its edges stay while both nodes live (execs made from this graph keep them); destroy `to` instead",
            ));
        }
        locked.tree.shape = locked.tree.shape.wrapping_add(1);
        // SAFETY: `a` and `b` are distinct live nodes of the locked graph; one edge, no data.
        unsafe { driver::graph::remove_dependencies(g.raw, &a, &b, 1) }
    }

    /// Destroys `node` and its edges (`cuGraphDestroyNode`). Its token, and every copy of it, is
    /// dead from now on ([`Error::DestroyedNode`]). Destroying a conditional node frees its
    /// bodies (and a child-graph node its graph), with everything nested in them: their
    /// definitions and node tokens then return errors. A graph holding memory allocation nodes
    /// refuses (CUDA forbids deleting its nodes), as does [`remove_edge`](Self::remove_edge). What the
    /// node used is released now, unless execs or copies made before still hold it.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let e = def.add_empty(&[])?;
    /// def.destroy_node(e)?;
    /// assert!(def.node_type(&e).is_err());
    /// # Ok(()) }
    /// ```
    pub fn destroy_node(&self, node: impl Into<GraphNode>) -> Result<()> {
        let node: GraphNode = node.into();
        let mut locked = self.lock()?;
        let g = self.handle();
        let raw = node::check(&locked.tree, g.id, &node)?;
        refuse_if_memory_nodes(&locked.tree, g.id, "a node destroyed")?;
        // SAFETY: `raw` is a live node of the locked graph.
        if locked.tree.programmatic && unsafe { driver::launch::has_programmatic_dependent(raw) }? {
            return Err(Error::invalid(
                Refusal::Attribute,
                "a dependent kernel follows this node programmatically: the edge stays while both nodes live (execs made from this graph keep it); destroy the dependent node first",
            ));
        }
        if locked.tree.conditionals.contains_key(&(g.id, raw as usize))
            && !locked.tree.captures().is_empty()
        {
            // Destroying a conditional node frees its bodies, which a capture may record into
            // (a body builder still capturing, or leaked with `mem::forget`).
            return Err(Error::invalid(
                Refusal::Capture,
                "a stream capture records into this graph's tree (a conditional body builder is capturing): end it before destroying a conditional node",
            ));
        }
        locked.tree.shape = locked.tree.shape.wrapping_add(1);
        // SAFETY: `raw` is a live node of the locked graph; its token is forgotten right after,
        // so it is never passed to the driver again.
        unsafe { driver::graph::destroy_node(raw) }?;
        let released = node::forget(&mut locked.tree, g.id, &node);
        // What the node used goes once the tree is unlocked (a `Drop` may call back into this
        // crate); execs and copies made before hold their own references.
        drop(locked);
        drop(released);
        Ok(())
    }
}

/// CUDA forbids deleting nodes or edges of a graph that holds memory allocation or free nodes
/// (`cuGraphAddMemAllocNode`'s restrictions); refused here rather than left to the driver.
fn refuse_if_memory_nodes(tree: &TreeState, graph: u64, what: &str) -> Result<()> {
    if tree.memory_graphs.contains(&graph) {
        return Err(Error::invalid(Refusal::Unsupported, format!(
            "this graph holds memory allocation nodes, and CUDA forbids deleting nodes or edges of such a graph: it cannot have {what}; build it again without the part to remove"
        )));
    }
    Ok(())
}
