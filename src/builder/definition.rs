//! `graph_definition()`: an explicit view of a builder's graph.

use super::kind::{HasGraphDefinition, Kind};
use super::state::{NotCapturing, State};
use super::GraphBuilder;
use crate::definition::GraphDefinition;
use crate::error::{Error, Result};

/// `Primary` + `Ended`, or `ConditionalBody` + `NotStarted` / `Ended`: the graph as a definition.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// A [`GraphDefinition`] view of this builder's graph, sharing its ownership: it outlives the
    /// builder, and nodes added through it become part of the graph (and so of what
    /// [`instantiate`](Self::instantiate) instantiates).
    ///
    /// Legal on an ended `Primary` builder, and on a `ConditionalBody` builder before its capture
    /// (a body built explicitly, or captured afterwards: while the body's capture runs, the
    /// definition returns errors) or after it (a captured body, extended explicitly). It does
    /// not compile on a fork, while capturing, or on a `Primary` builder that has not captured
    /// yet.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, k: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let builder = device.create_graph_builder()?.begin_building(Global)?;
    /// // SAFETY: k takes one int*.
    /// unsafe { builder.launch_unchecked(k, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    /// let ended = builder.end_building()?;
    /// let def = ended.graph_definition()?;
    /// let last = def.nodes()?[0];
    /// unsafe { def.add_kernel_unchecked(&[&last], k, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    /// let graph = ended.instantiate()?; // runs both kernels
    /// # Ok(()) }
    /// ```
    pub fn graph_definition(&self) -> Result<GraphDefinition>
    where
        S: NotCapturing,
        K: HasGraphDefinition<S>,
    {
        let graph = self
            .graph_handle()
            .ok_or_else(|| Error::Internal("the builder has no graph".into()))?;
        Ok(GraphDefinition::view(graph.clone()))
    }
}
