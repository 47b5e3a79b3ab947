//! The one trait for finished graphs: what can be instantiated, embedded as a child graph, or be
//! the source of an exec update.

use std::sync::Arc;

use crate::driver::graph::GraphHandle;
use crate::error::Result;

pub(crate) mod sealed {
    use super::*;

    /// The crate's side of [`FinishedGraph`](super::FinishedGraph): only this crate implements it.
    pub trait Source {
        /// The graph, or why it is not a finished graph on its own (a conditional body).
        fn finished_graph(&self) -> Result<&Arc<GraphHandle>>;
    }
}

/// A finished graph: an ended primary builder (`GraphBuilder<Primary, Ended>`) or a
/// [`GraphDefinition`](crate::GraphDefinition). It can be embedded as a child graph
/// ([`GraphBuilder::add_child_graph`](crate::GraphBuilder::add_child_graph),
/// [`GraphDefinition::add_child_graph`](crate::GraphDefinition::add_child_graph)) and be the
/// source of an update ([`Graph::update`](crate::Graph::update)). Sealed: only this crate's types
/// implement it.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::FinishedGraph;
/// fn embed_twice(b: &GraphBuilder<Primary, Capturing<Global>>, step: &impl FinishedGraph) -> cuda_graph::Result<()> {
///     b.add_child_graph(step)?;
///     b.add_child_graph(step)
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a finished graph",
    label = "a finished graph is needed here (to add it as a child graph, or to update an exec from it)",
    note = "pass an ended primary builder (call `end_building()` on it first) or a `GraphDefinition`; forks and conditional bodies are parts of their parent's graph"
)]
pub trait FinishedGraph: sealed::Source {}
