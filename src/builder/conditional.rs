//! Conditional nodes: `add_if`, `add_if_else`, `add_switch`, `add_while`.

use std::marker::PhantomData;
use std::sync::Arc;

use super::core::Core;
use super::kind::{ConditionalBody, Kind};
use super::state::State;
use super::state::{IsCapturing, NotStarted};
use super::GraphBuilder;
use crate::core::conditional::{
    body_graphs, check_unused, create_handle, node_params, register_bodies, CondKind,
    ConditionalHandle,
};
use crate::driver::graph::GraphHandle;
use crate::error::{Error, Refusal, Result};

/// While capturing: conditional nodes.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    fn conditional_graph(&self) -> Result<&Arc<GraphHandle>>
    where
        S: IsCapturing,
    {
        self.core.graph.as_ref().ok_or_else(|| {
            Error::invalid(Refusal::Capture, "the builder's stream is not capturing")
        })
    }

    /// Creates a conditional handle in this builder's graph (`cuGraphConditionalHandleCreate`).
    ///
    /// With `Some(value)` the handle is reset to `value` at the start of every launch; with `None`
    /// it keeps what device code last set. Needs driver 12.3.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let reset_to_one = b.create_conditional_handle(Some(1))?; // at every launch
    /// let kept = b.create_conditional_handle(None)?; // what device code set last
    /// # let _ = (reset_to_one, kept);
    /// # Ok(()) }
    /// ```
    pub fn create_conditional_handle(&self, default: Option<u32>) -> Result<ConditionalHandle>
    where
        S: IsCapturing,
    {
        // Before the tree's lock (see `refuse_in_host_callback`).
        crate::driver::context::refuse_in_host_callback()?;
        let graph = self.conditional_graph()?;
        let _tree = graph.lock();
        create_handle(graph, default)
    }

    /// Adds a conditional node with `size` bodies after the capture's current work, and returns
    /// one `NotStarted` body builder per body graph. A body gets its stream when its capture
    /// begins.
    fn conditional(
        &self,
        handle: &ConditionalHandle,
        kind: CondKind,
    ) -> Result<Vec<GraphBuilder<ConditionalBody<'_>, NotStarted>>>
    where
        S: IsCapturing,
    {
        kind.require()?;
        let graph = self.conditional_graph()?.clone();
        let mut params = node_params(&graph, handle, kind)?;
        let size = kind.size();
        // Not only stream work (a node is added to the graph directly): the context is made
        // current the way every other driver call makes it.
        self.core.stream.handle.ctx.bind()?;
        let bodies = self.core.stream.enqueue(|rec| {
            if let Some(tree) = rec.tree.as_deref() {
                check_unused(tree, handle)?;
            }
            let node = self.core.add_node(rec, &mut params)?;
            let raws = body_graphs(&params, size)?;
            let tree = rec.tree.as_deref_mut().ok_or_else(|| {
                Error::invalid(Refusal::Capture, "the builder's stream is not capturing")
            })?;
            Ok(register_bodies(tree, &graph, node, raws, handle, kind))
        })?;
        Ok(bodies
            .into_iter()
            .map(|body| {
                let mut core = Core::new(self.core.stream.clone());
                core.graph = Some(body);
                core.new_stream_on_begin = true;
                GraphBuilder {
                    core,
                    kind: ConditionalBody {
                        _parent: PhantomData,
                    },
                    state: NotStarted,
                }
            })
            .collect())
    }

    /// Adds an IF node: its body runs when the handle's value is non-zero. Needs driver 12.3.
    ///
    /// The body is a `GraphBuilder<ConditionalBody, NotStarted>`: begin, record, end (or leave it
    /// empty). It borrows this builder, so this builder cannot end while the body is open.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, add_one: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let h = b.create_conditional_handle(Some(1))?;
    /// let body = b.add_if(&h)?.begin_building(Global)?;
    /// // SAFETY: add_one takes one int*.
    /// unsafe { body.launch_unchecked(add_one, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    /// body.end_building()?;
    /// # Ok(()) }
    /// ```
    pub fn add_if(
        &self,
        handle: &ConditionalHandle,
    ) -> Result<GraphBuilder<ConditionalBody<'_>, NotStarted>>
    where
        S: IsCapturing,
    {
        let mut v = self.conditional(handle, CondKind::If)?;
        v.pop().ok_or_else(|| Error::Internal("no body".into()))
    }

    /// Adds an IF node with an ELSE body: `(then, else)`; `then` runs when the value is non-zero,
    /// `else` when it is zero. Needs driver 12.8.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let h = b.create_conditional_handle(Some(0))?;
    /// let (then_body, else_body) = b.add_if_else(&h)?;
    /// then_body.begin_building(Global)?.end_building()?;
    /// else_body.begin_building(Global)?.end_building()?; // runs: the value is 0
    /// # Ok(()) }
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn add_if_else(
        &self,
        handle: &ConditionalHandle,
    ) -> Result<(
        GraphBuilder<ConditionalBody<'_>, NotStarted>,
        GraphBuilder<ConditionalBody<'_>, NotStarted>,
    )>
    where
        S: IsCapturing,
    {
        let mut v = self.conditional(handle, CondKind::IfElse)?;
        let else_body = v.pop();
        let then_body = v.pop();
        match (then_body, else_body) {
            (Some(t), Some(e)) => Ok((t, e)),
            _ => Err(Error::Internal("no bodies".into())),
        }
    }

    /// Adds a SWITCH node with `n` bodies: body `i` runs when the value is `i`; a value `>= n` runs
    /// none. Needs driver 12.8. `n == 0` and `n >` [`MAX_SWITCH_BODIES`](crate::MAX_SWITCH_BODIES) are an
    /// [`Error::InvalidArgument`], refused before any driver work.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let h = b.create_conditional_handle(Some(2))?;
    /// let bodies = b.add_switch(&h, 3)?; // body 2 runs
    /// for body in bodies {
    ///     body.begin_building(Global)?.end_building()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn add_switch(
        &self,
        handle: &ConditionalHandle,
        n: u32,
    ) -> Result<Vec<GraphBuilder<ConditionalBody<'_>, NotStarted>>>
    where
        S: IsCapturing,
    {
        self.conditional(handle, CondKind::Switch(n))
    }

    /// Adds a WHILE node: its body runs again and again while the handle's value is non-zero
    /// (tested before each iteration). The body sets the value with `cudaGraphSetConditional`.
    /// Needs driver 12.3.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, countdown: &Function, counter: &DeviceBuffer<i32>, iterations: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let h = b.create_conditional_handle(Some(1))?;
    /// let body = b.add_while(&h)?.begin_building(Global)?;
    /// // SAFETY: countdown(handle, int*, int*) sets the handle to 0 when the counter runs out.
    /// unsafe { body.launch_unchecked(countdown, LaunchConfig::single(), &KernelArgs::new().arg(h).arg(counter).arg(iterations))? };
    /// body.end_building()?;
    /// # Ok(()) }
    /// ```
    pub fn add_while(
        &self,
        handle: &ConditionalHandle,
    ) -> Result<GraphBuilder<ConditionalBody<'_>, NotStarted>>
    where
        S: IsCapturing,
    {
        let mut v = self.conditional(handle, CondKind::While)?;
        v.pop().ok_or_else(|| Error::Internal("no body".into()))
    }
}
