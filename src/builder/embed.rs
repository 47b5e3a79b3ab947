//! Child graphs: `add_child_graph(&child)`.

use cudarc::driver::sys;

use super::kind::{Kind, StandsAlone};
use super::state::State;
use super::state::{IsCapturing, IsEnded};
use super::GraphBuilder;
use crate::core::source::{sealed::Source, FinishedGraph};
use crate::definition::{hold_in_copies, Embedded};
use crate::driver::compat;
use crate::driver::graph::GraphHandle;
use crate::error::{Error, Refusal, Result};

impl<K: StandsAlone, S: IsEnded> Source for GraphBuilder<K, S> {
    fn finished_graph(&self) -> Result<&std::sync::Arc<GraphHandle>> {
        self.ended_graph()
    }
}

impl<K: StandsAlone, S: IsEnded> FinishedGraph for GraphBuilder<K, S> {}

/// While capturing: child graphs.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Adds a child-graph node that runs a copy of `child`, after everything recorded so far;
    /// later work runs after it. The child's resources stay alive with this graph.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, step: &GraphBuilder<Primary, Ended>) -> cuda_graph::Result<()> {
    /// b.add_child_graph(step)?;       // a copy of `step`'s graph, after the work so far
    /// b.add_child_graph(step)?;       // and another
    /// # Ok(()) }
    /// ```
    pub fn add_child_graph(&self, child: &impl FinishedGraph) -> Result<()>
    where
        S: IsCapturing,
    {
        let child = child.finished_graph()?;
        if child.ctx.device != self.core.stream.handle.ctx.device {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                "the child graph belongs to another device",
            ));
        }
        let keep = child.root();
        // SAFETY: zeroed node parameters are valid plain C data; the fields used are set below.
        let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
        params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH;
        params.__bindgen_anon_1.graph = compat::child_graph_params(child.raw);
        // Not only stream work (a node is added to the graph directly): bind as every other
        // driver call does.
        self.core.stream.handle.ctx.bind()?;
        // The driver copies the child: its tree stays locked meanwhile (both trees, in order).
        self.core.stream.enqueue_with(Some(&keep), |rec| {
            let child_tree = match rec.other.as_deref() {
                Some(t) => t,
                None => rec.tree.as_deref().ok_or_else(|| {
                    Error::invalid(Refusal::Capture, "the builder's stream is not capturing")
                })?,
            };
            child_tree.check_complete()?;
            // What the child's nodes use now (they may change or go later), and the child only
            // where its conditional handles may be in use (see `TreeState::has_conditionals`).
            // What a node of the child holds is held by that node's copy, so destroying the copy
            // through the node's `inspect` view releases it, as for a definition's child graph.
            // A copy of programmatic edges is one too (see `TreeState::programmatic`).
            if rec.other.as_deref().is_some_and(|t| t.programmatic) {
                if let Some(t) = rec.tree.as_deref_mut() {
                    t.programmatic = true;
                }
            }
            let embedded = rec.other.as_deref_mut().map(|t| Embedded::of(t, child));
            if embedded.is_none() {
                rec.keep(&keep);
            }
            let node = self.core.add_node(rec, &mut params)?;
            if let (Some(e), Some(graph), Some(tree)) =
                (embedded, rec.graph_id(), rec.tree.as_deref_mut())
            {
                let unnamed = hold_in_copies(tree, graph, node, child.id, &e.nested, e.per_node);
                for owner in e.owners.iter().chain(unnamed.iter()) {
                    tree.keep_dyn(owner);
                }
            }
            Ok(())
        })?;
        Ok(())
    }
}
