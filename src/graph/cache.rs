//! [`GraphCache`]: one exec, updated in place from each new graph when the driver allows it and
//! instantiated again when it does not.

use super::{Graph, InstantiateOptions};
use crate::core::source::FinishedGraph;
use crate::error::{Error, Refusal, Result, UpdateFailure};
use crate::runtime::Stream;

/// What [`GraphCache::refresh`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheOutcome {
    /// A new exec was instantiated: `refused` says why the update was refused
    /// ([`UpdateFailure::TopologyChanged`], say), or is `None` when there was no exec to update
    /// (the first refresh, or an exec that handed out a device handle and so cannot be updated).
    Instantiated {
        /// Why the driver refused to update the exec, if it was asked.
        refused: Option<UpdateFailure>,
    },
    /// The exec was updated in place (`cuGraphExecUpdate`).
    Updated,
}

/// An exec kept across a loop that builds a new graph each step (captures the same work again,
/// say): [`refresh`](Self::refresh) updates it in place from the new graph when the driver
/// accepts the update ([`Graph::update`]: same topology, compatible parameters), and
/// instantiates a new one when the update is refused; [`updates`](Self::updates) and
/// [`instantiations`](Self::instantiations) count which happened.
///
/// Operands stay alive either way: an updated exec holds the new graph's operands (as
/// [`Graph::update`] does) and releases the old ones after its launches; a replaced exec is
/// dropped as any [`Graph`] is, releasing what it held after its last launch. Either way, the
/// cached exec's per-node updates ([`Graph::set_params`], [`Graph::set_enabled`]) take the
/// nodes of the graph last refreshed from. `Send + Sync`.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(device: &Device, add_one: &Function, bufs: &[DeviceBuffer<i32>]) -> cuda_graph::Result<()> {
/// let stream = device.create_stream()?;
/// let mut cache = GraphCache::new(InstantiateOptions::default());
/// for buf in bufs {
///     let builder = device.create_graph_builder()?.begin_building(Global)?;
///     // SAFETY: add_one takes one int*.
///     unsafe { builder.launch_unchecked(add_one, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
///     cache.refresh(&builder.end_building()?)?;
///     cache.launch(&stream)?;
/// }
/// stream.synchronize()?;
/// assert_eq!(cache.instantiations(), 1); // the first step; the others updated it
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GraphCache {
    options: InstantiateOptions,
    graph: Option<Graph>,
    updates: u64,
    instantiations: u64,
}

impl GraphCache {
    /// An empty cache; execs are instantiated with `options`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// let cache = GraphCache::new(InstantiateOptions::default());
    /// assert!(cache.graph().is_none());
    /// ```
    pub fn new(options: InstantiateOptions) -> GraphCache {
        GraphCache {
            options,
            graph: None,
            updates: 0,
            instantiations: 0,
        }
    }

    /// Makes the cached exec run `source` (an ended primary builder or a definition): updates it
    /// in place if the driver accepts the update, else instantiates `source` and replaces it.
    ///
    /// Any update refusal ([`Error::Update`], whatever its reason) leads to an instantiation, and
    /// so does an exec that handed out a device handle ([`Graph::device_handle`]: it cannot be
    /// updated, and lives on while graphs hold the handle); other errors (a source still being
    /// captured into, a failed instantiation) are returned, and the cache keeps its exec as it
    /// was.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(cache: &mut GraphCache, def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// match cache.refresh(def)? {
    ///     CacheOutcome::Updated => println!("updated in place"),
    ///     CacheOutcome::Instantiated { refused: Some(why) } => println!("instantiated again: {why}"),
    ///     CacheOutcome::Instantiated { refused: None } => println!("instantiated"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn refresh(&mut self, source: &impl FinishedGraph) -> Result<CacheOutcome> {
        let mut refused = None;
        if let Some(graph) = self.graph.as_ref().filter(|g| !g.has_device_handle()) {
            match graph.update(source) {
                Ok(()) => {
                    self.updates += 1;
                    return Ok(CacheOutcome::Updated);
                }
                Err(Error::Update { reason, .. }) => refused = Some(reason),
                Err(e) => return Err(e),
            }
        }
        let fresh = Graph::instantiate(source.finished_graph()?, &self.options)?;
        // The replaced exec releases what it held after its last launch.
        self.graph = Some(fresh);
        self.instantiations += 1;
        Ok(CacheOutcome::Instantiated { refused })
    }

    /// Launches the cached exec on `stream`; an [`Error::InvalidArgument`] before the first
    /// [`refresh`](Self::refresh).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(cache: &GraphCache, stream: &Stream) -> cuda_graph::Result<()> {
    /// cache.launch(stream)?;
    /// # Ok(()) }
    /// ```
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.graph
            .as_ref()
            .ok_or_else(|| {
                Error::invalid(
                    Refusal::Missing,
                    "the cache holds no exec yet: call `refresh` with a graph first",
                )
            })?
            .launch(stream)
    }

    /// The cached exec, if any.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(cache: &GraphCache) {
    /// if let Some(graph) = cache.graph() {
    ///     println!("{graph:?}");
    /// }
    /// # }
    /// ```
    pub fn graph(&self) -> Option<&Graph> {
        self.graph.as_ref()
    }

    /// The cached exec, mutably, if any. (Per-node updates take `&Graph`:
    /// [`graph`](Self::graph) is enough for them.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(cache: &mut GraphCache, k: &KernelNode) -> cuda_graph::Result<()> {
    /// if let Some(graph) = cache.graph_mut() {
    ///     graph.set_enabled(k, false)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn graph_mut(&mut self) -> Option<&mut Graph> {
        self.graph.as_mut()
    }

    /// Takes the cached exec out, leaving the cache empty (the counters stay).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(cache: &mut GraphCache) {
    /// let graph: Option<Graph> = cache.take();
    /// # }
    /// ```
    pub fn take(&mut self) -> Option<Graph> {
        self.graph.take()
    }

    /// How many [`refresh`](Self::refresh) calls updated the exec in place.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(cache: &GraphCache) {
    /// println!("{} updates, {} instantiations", cache.updates(), cache.instantiations());
    /// # }
    /// ```
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// How many [`refresh`](Self::refresh) calls instantiated a new exec.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(cache: &GraphCache) {
    /// assert!(cache.instantiations() >= 1 || cache.graph().is_none());
    /// # }
    /// ```
    pub fn instantiations(&self) -> u64 {
        self.instantiations
    }
}

static_assertions::assert_impl_all!(GraphCache: Send, Sync, std::fmt::Debug);
static_assertions::assert_impl_all!(CacheOutcome: Send, Sync, Copy, std::fmt::Debug);
