//! What a node does ([`NodeType`]): vocabulary below every layer, since errors name it
//! ([`Error::WrongNodeType`](crate::Error::WrongNodeType)) as well as read-back.

/// What a node does (`CUgraphNodeType`).
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::NodeType;
/// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
/// let kernels = def
///     .nodes()?
///     .iter()
///     .filter(|n| matches!(def.node_type(n), Ok(NodeType::Kernel)))
///     .count();
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeType {
    /// A kernel launch.
    Kernel,
    /// A memory copy.
    Memcpy,
    /// A memset.
    Memset,
    /// A host callback.
    Host,
    /// A child-graph node (`CU_GRAPH_NODE_TYPE_GRAPH`): runs a copy of another graph.
    Child,
    /// An empty node (only orders other nodes).
    Empty,
    /// Waits for an event.
    EventWait,
    /// Records an event.
    EventRecord,
    /// Signals external semaphores.
    ExternalSemaphoreSignal,
    /// Waits on external semaphores.
    ExternalSemaphoreWait,
    /// Allocates memory.
    MemAlloc,
    /// Frees memory allocated by an allocation node.
    MemFree,
    /// A batch of memory operations.
    BatchMemOp,
    /// A conditional node (IF, IF/ELSE, WHILE, SWITCH).
    Conditional,
    /// A type this crate does not know (a newer driver's).
    Other(u32),
}

impl NodeType {
    /// The type for the driver's raw `CUgraphNodeType` value.
    pub(crate) fn from_raw(v: u32) -> NodeType {
        match v {
            0 => NodeType::Kernel,
            1 => NodeType::Memcpy,
            2 => NodeType::Memset,
            3 => NodeType::Host,
            4 => NodeType::Child,
            5 => NodeType::Empty,
            6 => NodeType::EventWait,
            7 => NodeType::EventRecord,
            8 => NodeType::ExternalSemaphoreSignal,
            9 => NodeType::ExternalSemaphoreWait,
            10 => NodeType::MemAlloc,
            11 => NodeType::MemFree,
            12 => NodeType::BatchMemOp,
            13 => NodeType::Conditional,
            other => NodeType::Other(other),
        }
    }
}
