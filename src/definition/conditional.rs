//! Conditional nodes of a definition: IF, IF/ELSE, WHILE, SWITCH, with definitions as bodies.

use super::node::{self, GraphNode};
use super::typed::{ConditionalNode, TypedNode};
use super::GraphDefinition;
use crate::core::conditional::{body_graphs, check_unused, node_params, register_bodies, CondKind};
use crate::driver;
use crate::error::{Error, Refusal, Result};
use crate::ConditionalHandle;

impl GraphDefinition {
    /// Adds a conditional node with `size` bodies after `deps` (`cuGraphAddNode_v2`) and returns
    /// it with one definition per body graph.
    fn add_conditional(
        &self,
        deps: &[&GraphNode],
        handle: &ConditionalHandle,
        kind: CondKind,
    ) -> Result<(ConditionalNode, Vec<GraphDefinition>)> {
        kind.require()?;
        let graph = self.handle();
        let mut params = node_params(graph, handle, kind)?;
        let size = kind.size();
        let mut locked = self.lock()?;
        check_unused(&locked.tree, handle)?;
        let (mut room, mut spill) = (node::DEP_ROOM, Vec::new());
        let (deps_ptr, n) = node::check_deps(&locked.tree, graph.id, deps, &mut room, &mut spill)?;
        let mut out = std::ptr::null_mut();
        // SAFETY: the graph is live and its tree locked; `deps_ptr` holds `n` checked nodes of
        // it, with default edges (no edge data); `params` is a fully initialised conditional
        // block.
        unsafe {
            driver::graph::add_node(
                &mut out,
                graph.raw,
                deps_ptr,
                std::ptr::null(),
                n,
                &mut params,
            )
        }?;
        let mut released = Vec::new();
        let node = node::fresh(
            &mut locked.tree,
            graph.id,
            out,
            &[],
            Default::default(),
            &mut released,
        );
        let raws = body_graphs(&params, size)?;
        let bodies = register_bodies(&mut locked.tree, graph, out, raws, handle, kind);
        drop(locked);
        drop(released);
        Ok((
            TypedNode::new(node),
            bodies.into_iter().map(GraphDefinition::view).collect(),
        ))
    }

    /// Adds an IF node: its body runs when `handle`'s value is non-zero. Needs driver 12.3.
    ///
    /// The body is a definition of the node's body graph: add its nodes explicitly. Bodies may
    /// hold only kernel, empty, child-graph, memset, memcpy and conditional nodes (the driver
    /// refuses others). The handle must come from this definition's
    /// [`create_conditional_handle`](Self::create_conditional_handle), else
    /// [`Error::ForeignConditionalHandle`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, add_one: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let h = def.create_conditional_handle(Some(1))?;
    /// let (_if_node, body) = def.add_if(&[], &h)?;
    /// // SAFETY: add_one takes one int*.
    /// unsafe { body.add_kernel_unchecked(&[], add_one, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    /// # Ok(()) }
    /// ```
    pub fn add_if(
        &self,
        deps: &[&GraphNode],
        handle: &ConditionalHandle,
    ) -> Result<(ConditionalNode, GraphDefinition)> {
        let (node, mut bodies) = self.add_conditional(deps, handle, CondKind::If)?;
        let body = bodies.pop().ok_or_else(no_body)?;
        Ok((node, body))
    }

    /// Adds an IF node with an ELSE body: `(node, then, else)`; `then` runs when the value is
    /// non-zero, `else` when it is zero. Needs driver 12.8.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let h = def.create_conditional_handle(None)?;
    /// let (_node, then_body, else_body) = def.add_if_else(&[], &h)?;
    /// # Ok(()) }
    /// ```
    pub fn add_if_else(
        &self,
        deps: &[&GraphNode],
        handle: &ConditionalHandle,
    ) -> Result<(ConditionalNode, GraphDefinition, GraphDefinition)> {
        let (node, mut bodies) = self.add_conditional(deps, handle, CondKind::IfElse)?;
        let else_body = bodies.pop().ok_or_else(no_body)?;
        let then_body = bodies.pop().ok_or_else(no_body)?;
        Ok((node, then_body, else_body))
    }

    /// Adds a WHILE node: its body runs again and again while `handle`'s value is non-zero
    /// (tested before each iteration); a kernel in the body sets it with
    /// `cudaGraphSetConditional`. Needs driver 12.3.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let h = def.create_conditional_handle(Some(1))?;
    /// let (_loop_node, body) = def.add_while(&[], &h)?;
    /// # Ok(()) }
    /// ```
    pub fn add_while(
        &self,
        deps: &[&GraphNode],
        handle: &ConditionalHandle,
    ) -> Result<(ConditionalNode, GraphDefinition)> {
        let (node, mut bodies) = self.add_conditional(deps, handle, CondKind::While)?;
        let body = bodies.pop().ok_or_else(no_body)?;
        Ok((node, body))
    }

    /// Adds a SWITCH node with `n` bodies: body `i` runs when the value is `i`, none when it is
    /// `n` or more. Needs driver 12.8. `n == 0` is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let h = def.create_conditional_handle(Some(2))?;
    /// let (_node, cases) = def.add_switch(&[], &h, 3)?;
    /// assert_eq!(cases.len(), 3);
    /// # Ok(()) }
    /// ```
    pub fn add_switch(
        &self,
        deps: &[&GraphNode],
        handle: &ConditionalHandle,
        n: u32,
    ) -> Result<(ConditionalNode, Vec<GraphDefinition>)> {
        if n == 0 {
            return Err(Error::invalid(
                Refusal::Size,
                "a SWITCH node needs at least one branch",
            ));
        }
        self.add_conditional(deps, handle, CondKind::Switch(n))
    }
}

fn no_body() -> Error {
    Error::Internal("the driver returned fewer conditional bodies than asked".into())
}
