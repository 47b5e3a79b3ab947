//! Typed node handles: [`TypedNode`] and its kinds, so that parameters of the wrong kind of node
//! do not compile.

use std::marker::PhantomData;

use super::node::{self, GraphNode, NodeType};
use super::GraphDefinition;
use crate::error::{Error, Result};

mod sealed {
    pub trait Sealed {}
}

/// The kinds of nodes, as types: the parameter of [`TypedNode`] and
/// [`NodeParams`](crate::NodeParams). Each is an uninhabited marker.
pub mod node_kind {
    macro_rules! kinds {
        ($($(#[$doc:meta])* $name:ident => $ty:ident,)*) => { $(
            $(#[$doc])*
            #[derive(Debug)]
            pub enum $name {}
            impl super::sealed::Sealed for $name {}
            impl super::NodeKind for $name {
                const TYPE: super::NodeType = super::NodeType::$ty;
            }
        )* };
    }
    kinds!(
        /// A kernel launch ([`KernelNode`](crate::KernelNode)).
        Kernel => Kernel,
        /// A memset ([`MemsetNode`](crate::MemsetNode)).
        Memset => Memset,
        /// A memory copy ([`MemcpyNode`](crate::MemcpyNode)).
        Memcpy => Memcpy,
        /// A host callback ([`HostNode`](crate::HostNode)).
        Host => Host,
        /// A child graph ([`ChildGraphNode`](crate::ChildGraphNode)).
        ChildGraph => Child,
        /// An empty node ([`EmptyNode`](crate::EmptyNode)).
        Empty => Empty,
        /// An event record ([`EventRecordNode`](crate::EventRecordNode)).
        EventRecord => EventRecord,
        /// An event wait ([`EventWaitNode`](crate::EventWaitNode)).
        EventWait => EventWait,
        /// A memory allocation ([`MemAllocNode`](crate::MemAllocNode)).
        MemAlloc => MemAlloc,
        /// A memory free ([`MemFreeNode`](crate::MemFreeNode)).
        MemFree => MemFree,
        /// A conditional node ([`ConditionalNode`](crate::ConditionalNode)).
        Conditional => Conditional,
    );
}

/// A kind of node (one of the types in [`node_kind`]): what [`TypedNode`] knows about its node.
/// Sealed.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::NodeType;
/// use cuda_graph::{node_kind, NodeKind};
/// assert_eq!(<node_kind::Kernel as NodeKind>::TYPE, NodeType::Kernel);
/// ```
pub trait NodeKind: sealed::Sealed + 'static {
    /// The node type the driver reports for nodes of this kind.
    const TYPE: NodeType;
}

/// A [`GraphNode`] that knows what kind of node it is: what the `add_*` methods of
/// [`GraphDefinition`] return, and what the per-node updates
/// ([`GraphDefinition::set_params`], [`Graph::set_params`](crate::Graph::set_params)) take, so
/// that parameters of another kind of node do not compile.
///
/// It is the node's token and nothing more (`Copy`, keeps nothing alive). Where a `&GraphNode` is
/// expected — dependencies, edges, inspection — pass `&typed` (it dereferences to its
/// [`GraphNode`]); `GraphNode::from(typed)` or `*typed` gives the untyped token, and
/// [`GraphDefinition::typed_node`] (or `kernel_node`, `memset_node`, …) the typed one back,
/// checking the kind with the driver. `Send + Sync`.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::{EmptyNode, MemsetNode};
/// # fn f(def: &GraphDefinition, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
/// let clear: MemsetNode = def.add_memset(&[], buf, 0i32)?;
/// let after: EmptyNode = def.add_empty(&[&clear])?; // a typed node is a dependency
/// let untyped: GraphNode = clear.into();
/// assert_eq!(def.memset_node(&untyped)?, clear);
/// assert!(def.kernel_node(&untyped).is_err()); // not a kernel node
/// # let _ = after;
/// # Ok(()) }
/// ```
pub struct TypedNode<K: NodeKind> {
    node: GraphNode,
    kind: PhantomData<fn() -> K>,
}

/// A kernel launch node ([`GraphDefinition::add_kernel`]).
pub type KernelNode = TypedNode<node_kind::Kernel>;
/// A memset node ([`GraphDefinition::add_memset`]).
pub type MemsetNode = TypedNode<node_kind::Memset>;
/// A memory copy node ([`GraphDefinition::add_memcpy`]).
pub type MemcpyNode = TypedNode<node_kind::Memcpy>;
/// A host callback node ([`GraphDefinition::add_host_callback`]).
pub type HostNode = TypedNode<node_kind::Host>;
/// A child-graph node ([`GraphDefinition::add_child_graph`]).
pub type ChildGraphNode = TypedNode<node_kind::ChildGraph>;
/// An empty node ([`GraphDefinition::add_empty`], [`GraphDefinition::join`]).
pub type EmptyNode = TypedNode<node_kind::Empty>;
/// An event record node ([`GraphDefinition::add_event_record`]).
pub type EventRecordNode = TypedNode<node_kind::EventRecord>;
/// An event wait node ([`GraphDefinition::add_event_wait`]).
pub type EventWaitNode = TypedNode<node_kind::EventWait>;
/// A memory allocation node ([`GraphDefinition::add_mem_alloc`]).
pub type MemAllocNode = TypedNode<node_kind::MemAlloc>;
/// A memory free node ([`GraphDefinition::add_mem_free`]).
pub type MemFreeNode = TypedNode<node_kind::MemFree>;
/// A conditional node ([`GraphDefinition::add_if`] and the other conditionals).
pub type ConditionalNode = TypedNode<node_kind::Conditional>;

impl<K: NodeKind> TypedNode<K> {
    /// A node the caller knows to be of kind `K` (it just made it).
    pub(crate) fn new(node: GraphNode) -> Self {
        TypedNode {
            node,
            kind: PhantomData,
        }
    }

    /// The untyped token (also `*typed` and `GraphNode::from(typed)`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let e = def.add_empty(&[])?;
    /// let all: Vec<GraphNode> = vec![e.node()];
    /// # Ok(()) }
    /// ```
    pub fn node(&self) -> GraphNode {
        self.node
    }
}

impl<K: NodeKind> Clone for TypedNode<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K: NodeKind> Copy for TypedNode<K> {}

impl<K: NodeKind> PartialEq for TypedNode<K> {
    fn eq(&self, other: &Self) -> bool {
        self.node == other.node
    }
}

impl<K: NodeKind> Eq for TypedNode<K> {}

impl<K: NodeKind> PartialEq<GraphNode> for TypedNode<K> {
    fn eq(&self, other: &GraphNode) -> bool {
        self.node == *other
    }
}

/// A listed node compares equal to the typed handle of the same node (`def.successors(&a)? ==
/// [b]`). Comparing a list with an empty array then needs its type: `[] as [GraphNode; 0]`, or
/// `is_empty()`.
impl<K: NodeKind> PartialEq<TypedNode<K>> for GraphNode {
    fn eq(&self, other: &TypedNode<K>) -> bool {
        *self == other.node
    }
}

impl<K: NodeKind> std::hash::Hash for TypedNode<K> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.node.hash(state);
    }
}

impl<K: NodeKind> std::fmt::Debug for TypedNode<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedNode")
            .field("kind", &K::TYPE)
            .field("node", &self.node)
            .finish()
    }
}

impl<K: NodeKind> std::ops::Deref for TypedNode<K> {
    type Target = GraphNode;
    fn deref(&self) -> &GraphNode {
        &self.node
    }
}

impl<K: NodeKind> AsRef<GraphNode> for TypedNode<K> {
    fn as_ref(&self) -> &GraphNode {
        &self.node
    }
}

impl<K: NodeKind> std::borrow::Borrow<GraphNode> for TypedNode<K> {
    fn borrow(&self) -> &GraphNode {
        &self.node
    }
}

impl<K: NodeKind> From<TypedNode<K>> for GraphNode {
    fn from(typed: TypedNode<K>) -> GraphNode {
        typed.node
    }
}

impl<K: NodeKind> From<&TypedNode<K>> for GraphNode {
    fn from(typed: &TypedNode<K>) -> GraphNode {
        typed.node
    }
}

macro_rules! typed_getters {
    ($($(#[$doc:meta])* $name:ident => $kind:ident,)*) => { $(
        $(#[$doc])*
        pub fn $name(&self, node: &GraphNode) -> Result<TypedNode<node_kind::$kind>> {
            self.typed_node(node)
        }
    )* };
}

impl GraphDefinition {
    /// `node` as a [`TypedNode`] of kind `K`, after asking the driver what it is
    /// (`cuGraphNodeGetType`): an [`Error::WrongNodeType`] if it is another kind, an
    /// [`Error::ForeignNode`] or [`Error::DestroyedNode`] as for every node argument. For nodes
    /// listed with [`nodes`](Self::nodes) (a captured graph's, say) or kept untyped.
    /// [`kernel_node`](Self::kernel_node) and its siblings are shorthands.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// use cuda_graph::node_kind;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// for n in def.nodes()? {
    ///     if let Ok(k) = def.typed_node::<node_kind::Kernel>(&n) {
    ///         println!("kernel node {k:?}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn typed_node<K: NodeKind>(&self, node: &GraphNode) -> Result<TypedNode<K>> {
        let locked = self.lock()?;
        let raw = node::check(&locked.tree, self.handle().id, node)?;
        let found = NodeType::from_raw(super::raw_node_type(raw)?);
        drop(locked);
        if found != K::TYPE {
            return Err(Error::WrongNodeType {
                expected: K::TYPE,
                found,
            });
        }
        Ok(TypedNode::new(*node))
    }

    typed_getters!(
        /// `node` as a [`KernelNode`], checked (see [`typed_node`](Self::typed_node)).
        ///
        /// ```no_run
        /// # use cuda_graph::prelude::*;
        /// # fn f(def: &GraphDefinition, n: &GraphNode) -> cuda_graph::Result<()> {
        /// let k: KernelNode = def.kernel_node(n)?;
        /// # Ok(()) }
        /// ```
        kernel_node => Kernel,
        /// `node` as a [`MemsetNode`], checked (see [`typed_node`](Self::typed_node)).
        ///
        /// ```no_run
        /// # use cuda_graph::prelude::*;
        /// # use cuda_graph::MemsetNode;
        /// # fn f(def: &GraphDefinition, n: &GraphNode) -> cuda_graph::Result<()> {
        /// let m: MemsetNode = def.memset_node(n)?;
        /// # Ok(()) }
        /// ```
        memset_node => Memset,
        /// `node` as a [`MemcpyNode`], checked (see [`typed_node`](Self::typed_node)).
        ///
        /// ```no_run
        /// # use cuda_graph::prelude::*;
        /// # use cuda_graph::MemcpyNode;
        /// # fn f(def: &GraphDefinition, n: &GraphNode) -> cuda_graph::Result<()> {
        /// let c: MemcpyNode = def.memcpy_node(n)?;
        /// # Ok(()) }
        /// ```
        memcpy_node => Memcpy,
        /// `node` as a [`HostNode`], checked (see [`typed_node`](Self::typed_node)).
        ///
        /// ```no_run
        /// # use cuda_graph::prelude::*;
        /// # use cuda_graph::HostNode;
        /// # fn f(def: &GraphDefinition, n: &GraphNode) -> cuda_graph::Result<()> {
        /// let h: HostNode = def.host_node(n)?;
        /// # Ok(()) }
        /// ```
        host_node => Host,
        /// `node` as a [`ChildGraphNode`], checked (see [`typed_node`](Self::typed_node)).
        ///
        /// ```no_run
        /// # use cuda_graph::prelude::*;
        /// # use cuda_graph::ChildGraphNode;
        /// # fn f(def: &GraphDefinition, n: &GraphNode) -> cuda_graph::Result<()> {
        /// let c: ChildGraphNode = def.child_graph_node(n)?;
        /// # Ok(()) }
        /// ```
        child_graph_node => ChildGraph,
        /// `node` as an [`EventRecordNode`], checked (see [`typed_node`](Self::typed_node)).
        ///
        /// ```no_run
        /// # use cuda_graph::prelude::*;
        /// # use cuda_graph::EventRecordNode;
        /// # fn f(def: &GraphDefinition, n: &GraphNode) -> cuda_graph::Result<()> {
        /// let r: EventRecordNode = def.event_record_node(n)?;
        /// # Ok(()) }
        /// ```
        event_record_node => EventRecord,
        /// `node` as an [`EventWaitNode`], checked (see [`typed_node`](Self::typed_node)).
        ///
        /// ```no_run
        /// # use cuda_graph::prelude::*;
        /// # use cuda_graph::EventWaitNode;
        /// # fn f(def: &GraphDefinition, n: &GraphNode) -> cuda_graph::Result<()> {
        /// let w: EventWaitNode = def.event_wait_node(n)?;
        /// # Ok(()) }
        /// ```
        event_wait_node => EventWait,
    );
}

static_assertions::assert_impl_all!(KernelNode: Send, Sync, Copy, std::fmt::Debug, std::hash::Hash);
static_assertions::assert_impl_all!(ConditionalNode: Send, Sync, Copy, std::fmt::Debug);
static_assertions::assert_impl_all!(node_kind::Kernel: Send, Sync, std::fmt::Debug);

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUgraphNodeType as T;

    #[test]
    fn each_kind_is_the_driver_type_of_its_nodes() {
        fn is<K: NodeKind>(raw: T) {
            assert_eq!(K::TYPE, NodeType::from_raw(raw as u32), "{raw:?}");
        }
        is::<node_kind::Kernel>(T::CU_GRAPH_NODE_TYPE_KERNEL);
        is::<node_kind::Memset>(T::CU_GRAPH_NODE_TYPE_MEMSET);
        is::<node_kind::Memcpy>(T::CU_GRAPH_NODE_TYPE_MEMCPY);
        is::<node_kind::Host>(T::CU_GRAPH_NODE_TYPE_HOST);
        is::<node_kind::ChildGraph>(T::CU_GRAPH_NODE_TYPE_GRAPH);
        is::<node_kind::Empty>(T::CU_GRAPH_NODE_TYPE_EMPTY);
        is::<node_kind::EventRecord>(T::CU_GRAPH_NODE_TYPE_EVENT_RECORD);
        is::<node_kind::EventWait>(T::CU_GRAPH_NODE_TYPE_WAIT_EVENT);
        is::<node_kind::MemAlloc>(T::CU_GRAPH_NODE_TYPE_MEM_ALLOC);
        is::<node_kind::MemFree>(T::CU_GRAPH_NODE_TYPE_MEM_FREE);
        is::<node_kind::Conditional>(T::CU_GRAPH_NODE_TYPE_CONDITIONAL);
    }

    #[test]
    fn a_typed_node_is_its_untyped_token() {
        let node = GraphNode {
            graph: 1,
            raw: 0x100,
            serial: 7,
        };
        let typed = KernelNode::new(node);
        assert_eq!(*typed, node);
        assert_eq!(GraphNode::from(typed), node);
        assert_eq!(typed.as_ref(), &node);
        assert_eq!(node, typed);
        assert_eq!(typed, node);
        let other = KernelNode::new(GraphNode { serial: 8, ..node });
        assert!(typed != other && node != other);
        let deps: &[&GraphNode] = &[&typed, &other];
        assert_eq!(deps.len(), 2);
        assert!(format!("{typed:?}").contains("Kernel"));
    }
}
