//! The explicit layer: [`GraphDefinition`], a CUDA graph built node by node, and [`GraphNode`].
//!
//! See [`GraphDefinition`] and [the definitions guide](crate::docs::definitions).

use std::path::Path;
use std::sync::Arc;

use crate::driver::tree_lock::TreeGuard;

use cudarc::driver::sys;

use crate::core::source::{sealed::Source, FinishedGraph};
use crate::driver;
use crate::driver::graph::{GraphHandle, TreeState, UserGraph};
use crate::error::{Error, Refusal, Result};
use crate::graph::{Graph, GraphDebugPrintOptions, InstantiateOptions};
use crate::runtime::{Device, ReleaseObserver};
use crate::ConditionalHandle;

mod conditional;
mod exec_nodes;
mod inspect;
mod memory;
mod memset;
mod node;
mod nodes;
pub(crate) use nodes::{hold_in_copies, Embedded};
mod params;
mod topology;
mod typed;

pub use inspect::{
    ChildGraphInfo, ConditionalInfo, EventInfo, HostInfo, KernelInfo, MemAllocInfo, MemFreeInfo,
    MemcpyInfo, MemoryKind, MemsetInfo, NodeInfo, ReadBack,
};
pub use memory::{GraphAllocation, GraphBuffer, MemAllocOptions, PeerAccess};
pub use memset::{Memset2d, MemsetValue};
pub use node::{GraphNode, NodeType};
pub use params::NodeParams;
pub use typed::{
    node_kind, ChildGraphNode, ConditionalNode, EmptyNode, EventRecordNode, EventWaitNode,
    HostNode, KernelNode, MemAllocNode, MemFreeNode, MemcpyNode, MemsetNode, NodeKind, TypedNode,
};

/// A CUDA graph (`CUgraph`) built explicitly, node by node — or a view of a graph a builder
/// captured, to inspect and extend it.
///
/// ## Making one
/// - [`GraphDefinition::new`] starts an empty graph.
/// - [`GraphBuilder::graph_definition`](crate::GraphBuilder::graph_definition) gives a view of
///   an ended primary builder's graph, or of a conditional body's graph (before or after its
///   capture: bodies may be captured, then extended, or never captured at all).
/// - The `add_if`/`add_if_else`/`add_while`/`add_switch` nodes return their bodies as
///   definitions.
///
/// A view shares ownership of the graph: it outlives the builder, and nodes added through it are
/// part of that graph (use [`try_clone`](Self::try_clone) for a copy).
///
/// ## Dependencies
/// Every `add_*` method takes `deps: &[&GraphNode]`, the nodes the new node runs after (`&[]`
/// for a root), and returns the new node. [`join`](Self::join) adds an empty node after several
/// nodes. Edges can also be added and removed later ([`add_edge`](Self::add_edge),
/// [`remove_edge`](Self::remove_edge)).
///
/// ## Lifetimes
/// Every resource of this crate that a node refers to — a [`DeviceBuffer`](crate::DeviceBuffer)'s
/// memory, an [`Event`](crate::Event), a kernel's module, a host callback's closure, a child or
/// body graph — is held by the graph (its tree's keep set), so it lives until this graph, its
/// clones and every [`Graph`] exec made from them are dropped and their launches have finished
/// (an exec holds a snapshot of what the graph used when it was instantiated). Dropping your
/// handles early is fine.
///
/// ## Threads
/// `GraphDefinition` is `Send + Sync`. CUDA graph objects are not internally synchronised, so
/// every call that reads or changes the graph (adding and destroying nodes and edges,
/// inspection, clone, instantiate, print, update from it, embedding it) takes a lock shared by
/// the graph and its conditional bodies. While a conditional body's builder is capturing into
/// the body, definitions of that body return an error.
///
/// ```no_run
/// use cuda_graph::prelude::*;
/// # fn main() -> cuda_graph::Result<()> {
/// # let device = Device::new(0)?;
/// # let module = device.load_ptx("")?;
/// let affine = module.function("affine")?; // p[0] = p[0] * m + b
/// let value = device.alloc_zeroed::<i32>(1)?;
///
/// let def = GraphDefinition::new(&device)?;
/// let zero = def.add_memset(&[], &value, 0i32)?;
/// // SAFETY: affine takes (int*, int, int).
/// let plus_one = unsafe {
///     def.add_kernel_unchecked(&[&zero], &affine, LaunchConfig::single(), &KernelArgs::new().arg(&value).arg(1i32).arg(1i32))?
/// };
/// let times_ten = unsafe {
///     def.add_kernel_unchecked(&[&plus_one], &affine, LaunchConfig::single(), &KernelArgs::new().arg(&value).arg(10i32).arg(0i32))?
/// };
/// assert_eq!(def.nodes()?.len(), 3);
/// let graph = def.instantiate()?;
/// let stream = device.create_stream()?;
/// graph.launch(&stream)?;
/// stream.synchronize()?;
/// assert_eq!(value.to_vec()?, [10]);
/// # let _ = times_ten;
/// # Ok(()) }
/// ```
pub struct GraphDefinition {
    graph: UserGraph,
}

impl std::fmt::Debug for GraphDefinition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphDefinition")
            .field("graph", &self.graph.raw)
            .field("conditional_body", &self.graph.is_body())
            .finish_non_exhaustive()
    }
}

/// The state of the graph's tree, locked, for one operation.
pub(crate) struct Locked<'a> {
    pub(crate) tree: TreeGuard<'a, TreeState>,
}

impl GraphDefinition {
    /// Creates an empty graph on `device` (`cuGraphCreate`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// let device = Device::new(0)?;
    /// let def = GraphDefinition::new(&device)?;
    /// assert!(def.nodes()?.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn new(device: &Device) -> Result<GraphDefinition> {
        Ok(GraphDefinition {
            graph: UserGraph::new(GraphHandle::create(&device.ctx)?),
        })
    }

    /// A view of `graph`, sharing its ownership.
    pub(crate) fn view(graph: Arc<GraphHandle>) -> GraphDefinition {
        GraphDefinition {
            graph: UserGraph::new(graph),
        }
    }

    /// The device the graph belongs to.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let stream = def.device().create_stream()?;
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        Device::from_ctx(&self.graph.ctx)
    }

    /// Whether this is the body of a conditional node. A body runs as part of the graph holding
    /// its node: it cannot be instantiated, cloned, embedded or used as an update source alone.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let h = def.create_conditional_handle(Some(1))?;
    /// let (_node, body) = def.add_if(&[], &h)?;
    /// assert!(body.is_conditional_body() && !def.is_conditional_body());
    /// # Ok(()) }
    /// ```
    pub fn is_conditional_body(&self) -> bool {
        self.graph.is_body() && !self.graph.is_embedded()
    }

    /// An observer that tells when the graph itself is destroyed: after every definition and
    /// builder of it, every graph it is embedded in as a body or kept alive by (a clone keeps
    /// its original), are dropped.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let def = GraphDefinition::new(device)?;
    /// let watch = def.release_observer();
    /// drop(def);
    /// assert!(watch.is_released());
    /// # Ok(()) }
    /// ```
    pub fn release_observer(&self) -> ReleaseObserver {
        ReleaseObserver::new(&self.graph)
    }

    /// Binds the context and locks the graph's tree, refusing a graph that a capture is recording
    /// into or whose conditional node was destroyed.
    #[inline(always)]
    pub(crate) fn lock(&self) -> Result<Locked<'_>> {
        self.graph.ctx.bind_cached()?;
        let tree = self.graph.lock();
        check_usable(&self.graph, &tree)?;
        Ok(Locked { tree })
    }

    /// The graph, for driver calls made under [`lock`](Self::lock).
    pub(crate) fn handle(&self) -> &Arc<GraphHandle> {
        &self.graph
    }

    /// The error for a body used where a graph of its own is needed.
    fn standalone(&self, what: &str) -> Result<&Arc<GraphHandle>> {
        if self.graph.is_embedded() {
            return Err(Error::invalid(Refusal::Unsupported, format!(
                "the graph of a child-graph node cannot be {what} on its own: it runs as part of the graph that holds the node; use that graph's definition, or the definition it was embedded from"
            )));
        }
        if self.graph.is_body() {
            return Err(Error::invalid(Refusal::Unsupported, format!(
                "a conditional body cannot be {what} on its own: it runs as part of the graph that holds its conditional node; use that graph's definition"
            )));
        }
        Ok(&self.graph)
    }

    /// Copies the graph (`cuGraphClone`) into a new, independent definition.
    ///
    /// The copy's nodes are new nodes: list them with [`nodes`](Self::nodes) (tokens of this
    /// graph are foreign to the copy). The copy keeps this graph alive, and so everything this
    /// graph's nodes use, for as long as the copy and its execs live. A conditional body cannot
    /// be cloned on its own.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let copy = def.try_clone()?;
    /// assert_eq!(copy.nodes()?.len(), def.nodes()?.len());
    /// # Ok(()) }
    /// ```
    pub fn try_clone(&self) -> Result<GraphDefinition> {
        self.standalone("cloned")?;
        let mut locked = self.lock()?;
        locked.tree.check_complete()?;
        // SAFETY: the graph is live and its tree locked.
        let raw = unsafe { driver::graph::clone(self.graph.raw) }?;
        // The clone's nodes use what the original's use now: the clone holds that (the original's
        // nodes may change or go later), and the original graph only where conditional handles
        // of it may be in use (CUDA clones no conditional nodes today): a clone that held its
        // original would make a graph that embeds its own clone hold itself.
        let held = locked.tree.snapshot();
        let hold_original = locked.tree.has_conditionals();
        let programmatic = locked.tree.programmatic;
        drop(locked);
        let clone = Arc::new(GraphHandle::owned(&self.graph.ctx, raw));
        {
            let mut tree = clone.lock();
            tree.programmatic = programmatic;
            if hold_original {
                tree.keep(&self.graph.root());
            }
            for chunk in &held {
                tree.keep(chunk);
            }
        }
        Ok(GraphDefinition {
            graph: UserGraph::new(clone),
        })
    }

    /// Instantiates the graph into an executable [`Graph`] (`cuGraphInstantiateWithParams`), as
    /// often as you like. The exec keeps every operand alive; the definition can be dropped.
    ///
    /// A refusal is an [`Error::Instantiate`] naming the driver's reason. A conditional body cannot
    /// be instantiated on its own.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, stream: &Stream) -> cuda_graph::Result<()> {
    /// let graph = def.instantiate()?;
    /// graph.launch(stream)?;
    /// # Ok(()) }
    /// ```
    pub fn instantiate(&self) -> Result<Graph> {
        Graph::instantiate(self.finished_graph()?, &InstantiateOptions::default())
    }

    /// Instantiates the graph with `options` (uploads, auto-free, device launch, node
    /// priorities).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let graph = def.instantiate_with(&InstantiateOptions::new().auto_free_on_launch(true))?;
    /// # Ok(()) }
    /// ```
    pub fn instantiate_with(&self, options: &InstantiateOptions) -> Result<Graph> {
        Graph::instantiate(self.finished_graph()?, options)
    }

    /// Writes the graph as Graphviz DOT to `path` (`cuGraphDebugDotPrint`). An unwritable path
    /// is an [`Error::Io`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::GraphDebugPrintOptions;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// def.debug_dot_print("graph.dot", &GraphDebugPrintOptions::all())?;
    /// # Ok(()) }
    /// ```
    pub fn debug_dot_print(
        &self,
        path: impl AsRef<Path>,
        options: &GraphDebugPrintOptions,
    ) -> Result<()> {
        crate::graph::dot_print(&self.graph, path.as_ref(), options, |tree| {
            check_usable(&self.graph, tree)
        })
    }

    /// Creates a conditional handle in this graph (`cuGraphConditionalHandleCreate`), for the
    /// conditional nodes of this graph. Needs driver 12.3.
    ///
    /// With `Some(value)` the handle is reset to `value` at the start of every launch; with
    /// `None` it keeps what device code last set (`cudaGraphSetConditional`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let always = def.create_conditional_handle(Some(1))?;
    /// let (_node, body) = def.add_if(&[], &always)?;
    /// # Ok(()) }
    /// ```
    pub fn create_conditional_handle(&self, default: Option<u32>) -> Result<ConditionalHandle> {
        let _locked = self.lock()?;
        crate::core::conditional::create_handle(&self.graph, default)
    }
}

/// Refuses a graph that a capture records into, or a body whose conditional node is gone.
#[inline]
pub(crate) fn check_usable(graph: &GraphHandle, tree: &TreeState) -> Result<()> {
    if !tree.unusual() {
        // The common case, on every node added: nothing below can refuse.
        return Ok(());
    }
    check_usable_slow(graph, tree)
}

/// [`check_usable`] for a tree with a capture, a dead graph or a break.
#[cold]
#[inline(never)]
fn check_usable_slow(graph: &GraphHandle, tree: &TreeState) -> Result<()> {
    if let Some(why) = tree.broken() {
        return Err(Error::invalid(Refusal::Broken, why.to_string()));
    }
    if tree.is_capturing_into(graph.id) {
        return Err(Error::invalid(
            Refusal::Capture,
            "a stream capture is recording into this graph (its conditional body builder is capturing): call `end_building()` on the body first",
        ));
    }
    if tree.is_dead(graph) {
        return Err(Error::invalid(
            Refusal::Broken,
            "the driver freed this graph: its conditional node was destroyed, or a capture into it failed",
        ));
    }
    Ok(())
}

impl Source for GraphDefinition {
    fn finished_graph(&self) -> Result<&Arc<GraphHandle>> {
        self.standalone("instantiated, embedded or used as an update source")
    }
}

impl FinishedGraph for GraphDefinition {}

/// Raw node type of `node` (the tree locked).
pub(crate) fn raw_node_type(node: sys::CUgraphNode) -> Result<u32> {
    // SAFETY: `node` is a live node (checked by the caller under the tree lock).
    unsafe { driver::graph::node_type(node) }
}

static_assertions::assert_impl_all!(GraphDefinition: Send, Sync, std::fmt::Debug);
static_assertions::assert_impl_all!(GraphNode: Send, Sync, Copy, std::fmt::Debug);
static_assertions::assert_impl_all!(NodeType: Send, Sync, Copy, std::fmt::Debug);
static_assertions::assert_impl_all!(GraphAllocation: Send, Sync, std::fmt::Debug);
static_assertions::assert_impl_all!(Memset2d: Send, Sync, Copy, std::fmt::Debug);
static_assertions::assert_not_impl_any!(GraphAllocation: Clone, Copy);
// A panic caught around graph work leaves nothing half-locked (the tree lock has no poisoning).
static_assertions::assert_impl_all!(
    GraphDefinition: std::panic::UnwindSafe,
    std::panic::RefUnwindSafe
);
