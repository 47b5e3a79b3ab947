//! Reading nodes back: [`GraphDefinition::inspect`] and [`GraphDefinition::node_info`] give a
//! node's typed handle with its parameters, as the driver holds them now.

use std::sync::Arc;

use cudarc::driver::sys;

use super::node::{self, GraphNode, NodeType};
use super::typed::{node_kind, NodeKind, TypedNode};
use super::GraphDefinition;
use crate::core::callback;
use crate::core::conditional::{CondKind, ConditionalKind};
use crate::driver::event::EventHandle;
use crate::driver::graph::{GraphHandle, Owner, TreeState};
use crate::driver::module::ModuleHandle;
use crate::driver::{self, DriverVersion};
use crate::error::{Error, Refusal, Result};
use crate::runtime::{DeviceCopy, Event, Function, LaunchConfig};
use crate::{ConditionalHandle, HostCallback};

/// A node read back with [`GraphDefinition::inspect`]: its typed handle and its parameters, one
/// variant per kind of node.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// use cuda_graph::NodeInfo;
/// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
/// for node in def.nodes()? {
///     match def.inspect(&node)? {
///         NodeInfo::Kernel(k, info) => println!("{k:?}: {:?} {:?}", info.name, info.config),
///         NodeInfo::Memset(_, m) => println!("memset of {} x {} bytes", m.width, m.element_size),
///         other => println!("{other:?}"),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum NodeInfo {
    /// A kernel launch.
    Kernel(TypedNode<node_kind::Kernel>, KernelInfo),
    /// A memset.
    Memset(TypedNode<node_kind::Memset>, MemsetInfo),
    /// A memory copy.
    Memcpy(TypedNode<node_kind::Memcpy>, MemcpyInfo),
    /// A host callback.
    Host(TypedNode<node_kind::Host>, HostInfo),
    /// A child graph, with a definition of the graph it runs: see [`ChildGraphInfo`].
    ChildGraph(TypedNode<node_kind::ChildGraph>, ChildGraphInfo),
    /// An empty node.
    Empty(TypedNode<node_kind::Empty>),
    /// An event record.
    EventRecord(TypedNode<node_kind::EventRecord>, EventInfo),
    /// An event wait.
    EventWait(TypedNode<node_kind::EventWait>, EventInfo),
    /// A memory allocation.
    MemAlloc(TypedNode<node_kind::MemAlloc>, MemAllocInfo),
    /// A memory free.
    MemFree(TypedNode<node_kind::MemFree>, MemFreeInfo),
    /// A conditional node, with its handle, kind and bodies.
    Conditional(TypedNode<node_kind::Conditional>, ConditionalInfo),
    /// A kind of node this crate does not read back (external semaphores, batch memory
    /// operations, and types a newer driver adds).
    Other(GraphNode, NodeType),
}

impl NodeInfo {
    /// The node, untyped.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, n: &GraphNode) -> cuda_graph::Result<()> {
    /// assert_eq!(def.inspect(n)?.node(), *n);
    /// # Ok(()) }
    /// ```
    pub fn node(&self) -> GraphNode {
        match self {
            NodeInfo::Kernel(n, _) => n.node(),
            NodeInfo::Memset(n, _) => n.node(),
            NodeInfo::Memcpy(n, _) => n.node(),
            NodeInfo::Host(n, _) => n.node(),
            NodeInfo::ChildGraph(n, _) => n.node(),
            NodeInfo::Empty(n) => n.node(),
            NodeInfo::EventRecord(n, _) => n.node(),
            NodeInfo::EventWait(n, _) => n.node(),
            NodeInfo::MemAlloc(n, _) => n.node(),
            NodeInfo::MemFree(n, _) => n.node(),
            NodeInfo::Conditional(n, _) => n.node(),
            NodeInfo::Other(n, _) => *n,
        }
    }
}

/// A kernel node's launch: what [`NodeInfo::Kernel`] and `node_info` on a
/// [`KernelNode`](crate::KernelNode) give.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KernelInfo {
    /// The kernel, when its module is one this graph holds (a module this crate loaded, or a
    /// kernel wrapped with [`Function::from_raw`]-style constructors whose module this crate
    /// cannot name: then `None`).
    pub function: Option<Function>,
    /// The kernel's name (`cuFuncGetName`); `None` if the driver cannot tell.
    pub name: Option<String>,
    /// Grid, block, dynamic shared memory and the node's launch attributes (cluster,
    /// priority, cooperative). Never a dependent launch: reusing it for another launch or node
    /// launches plainly (see [`dependent`](Self::dependent)).
    pub config: LaunchConfig,
    /// Whether an edge into the node is programmatic: the node may begin before that kernel
    /// has ended ([`GraphDefinition::add_dependent_kernel`](crate::GraphDefinition::add_dependent_kernel),
    /// a captured [`launch_dependent`](crate::GraphBuilder::launch_dependent)).
    pub dependent: bool,
    /// Each argument's bytes, in order, as the kernel's parameter list lays them out
    /// (`cuFuncGetParamInfo`, driver 12.4). Empty for a kernel without parameters.
    pub args: Vec<Vec<u8>>,
}

impl KernelInfo {
    /// Argument `index` as a `T`, if it exists and has `T`'s size. A buffer argument reads back as
    /// its device address (`u64`, as [`DeviceBuffer::device_ptr`](crate::DeviceBuffer::device_ptr)
    /// gives it).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, k: &KernelNode, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let info = def.node_info(k)?;
    /// assert_eq!(info.arg::<u64>(0), Some(buf.device_ptr()));
    /// # Ok(()) }
    /// ```
    pub fn arg<T: DeviceCopy>(&self, index: usize) -> Option<T> {
        let bytes = self.args.get(index)?;
        if bytes.len() != std::mem::size_of::<T>() {
            return None;
        }
        // SAFETY: `bytes` holds exactly `size_of::<T>()` bytes, read unaligned; every bit pattern
        // is a valid `T` (the `DeviceCopy` contract).
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
    }
}

/// A memset node's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemsetInfo {
    /// The device address of the first element.
    pub dst: u64,
    /// The row pitch in bytes (for a 2D memset; the row's size for 1D).
    pub pitch: usize,
    /// The value, in its low `element_size` bytes.
    pub value: u32,
    /// The element size in bytes: 1, 2 or 4.
    pub element_size: u32,
    /// Elements per row.
    pub width: usize,
    /// Rows (1 for a 1D memset).
    pub height: usize,
}

/// Where one side of a copy is, as the driver says (`CUmemorytype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Host memory (an address in this process).
    Host,
    /// Device memory.
    Device,
    /// A CUDA array.
    Array,
    /// Unified (managed) memory.
    Unified,
    /// A value this crate does not know.
    Other(u32),
}

impl MemoryKind {
    fn from_raw(v: u32) -> MemoryKind {
        match v {
            1 => MemoryKind::Host,
            2 => MemoryKind::Device,
            3 => MemoryKind::Array,
            4 => MemoryKind::Unified,
            other => MemoryKind::Other(other),
        }
    }
}

/// A memcpy node's copy (linear memory: a CUDA array's side reads as address 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemcpyInfo {
    /// Where the source is.
    pub src_kind: MemoryKind,
    /// The source address (device or host, after its byte offset).
    pub src: u64,
    /// Where the destination is.
    pub dst_kind: MemoryKind,
    /// The destination address (device or host, after its byte offset).
    pub dst: u64,
    /// Bytes per row.
    pub width_bytes: usize,
    /// Rows.
    pub height: usize,
    /// Slices.
    pub depth: usize,
}

impl MemcpyInfo {
    /// The bytes copied: `width_bytes * height * depth` (saturating).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::MemcpyNode;
    /// use cuda_graph::NodeInfo;
    /// # fn f(def: &GraphDefinition, n: &MemcpyNode) -> cuda_graph::Result<()> {
    /// println!("{} bytes", def.node_info(n)?.bytes());
    /// # Ok(()) }
    /// ```
    pub fn bytes(&self) -> usize {
        self.width_bytes
            .saturating_mul(self.height)
            .saturating_mul(self.depth)
    }
}

/// A host node's callback.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HostInfo {
    /// The observer of the node's closure (the same one `add_host_callback` returned); `None`
    /// for a host function this crate did not install.
    pub callback: Option<HostCallback>,
}

/// The graph a child-graph node runs, as a definition.
///
/// The definition is a view of the node's own graph (not a copy): nodes added to it or changed
/// in it change what the child-graph node runs — in execs instantiated from then on. It is a part
/// of the outer graph, so it cannot be instantiated, cloned or embedded on its own, and once the
/// child-graph node is destroyed every operation on it is refused.
#[derive(Debug)]
#[non_exhaustive]
pub struct ChildGraphInfo {
    /// The node's graph.
    pub graph: GraphDefinition,
}

/// The event of an event-record or event-wait node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EventInfo {
    /// The event, when it is one this crate made (`None` for an event the graph does not hold).
    pub event: Option<Event>,
    /// The raw `CUevent`.
    pub raw: sys::CUevent,
}

// SAFETY: `raw` is an opaque handle, only compared and handed back to the caller; the `Event`
// next to it is `Send + Sync`.
unsafe impl Send for EventInfo {}
// SAFETY: as above.
unsafe impl Sync for EventInfo {}

/// A memory allocation node's allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemAllocInfo {
    /// The address the allocation gets in every launch (as
    /// [`GraphAllocation::device_ptr`](crate::GraphAllocation::device_ptr)).
    pub device_ptr: u64,
    /// Its size in bytes.
    pub bytes: usize,
    /// The ordinal of the device it lives on.
    pub device: i32,
}

/// A memory free node's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemFreeInfo {
    /// The address it frees.
    pub device_ptr: u64,
}

/// A conditional node's handle, kind and bodies.
#[derive(Debug)]
#[non_exhaustive]
pub struct ConditionalInfo {
    /// The handle the node tests.
    pub handle: ConditionalHandle,
    /// IF, IF/ELSE, WHILE or SWITCH.
    pub kind: ConditionalKind,
    /// The bodies, in order (for IF/ELSE: then, else), as definitions of the node's own body
    /// graphs.
    pub bodies: Vec<GraphDefinition>,
}

mod sealed {
    /// Seals [`ReadBack`](super::ReadBack) and carries its one method.
    pub trait Sealed: super::NodeKind {
        /// The parameters of a node of this kind, as [`ReadBack::Info`](super::ReadBack::Info).
        type Picked;
        /// Takes them out of the node's `NodeInfo`; `None` if it is another kind's.
        fn pick(info: super::NodeInfo) -> Option<Self::Picked>;
    }
}

/// What [`GraphDefinition::node_info`] gives for a node of kind `K`: the parameters from
/// [`NodeInfo`]'s variant of that kind. Sealed; implemented by the kinds in
/// [`node_kind`](crate::node_kind).
pub trait ReadBack: NodeKind + sealed::Sealed<Picked = Self::Info> {
    /// The parameters of a node of this kind.
    type Info: std::fmt::Debug;
}

macro_rules! read_back {
    ($($kind:ident => $variant:ident($info:ty),)*) => { $(
        impl sealed::Sealed for node_kind::$kind {
            type Picked = $info;
            fn pick(info: NodeInfo) -> Option<$info> {
                match info {
                    NodeInfo::$variant(_, i) => Some(i),
                    _ => None,
                }
            }
        }
        impl ReadBack for node_kind::$kind {
            type Info = $info;
        }
    )* };
}

read_back!(
    Kernel => Kernel(KernelInfo),
    Memset => Memset(MemsetInfo),
    Memcpy => Memcpy(MemcpyInfo),
    Host => Host(HostInfo),
    ChildGraph => ChildGraph(ChildGraphInfo),
    EventRecord => EventRecord(EventInfo),
    EventWait => EventWait(EventInfo),
    MemAlloc => MemAlloc(MemAllocInfo),
    MemFree => MemFree(MemFreeInfo),
    Conditional => Conditional(ConditionalInfo),
);

impl sealed::Sealed for node_kind::Empty {
    type Picked = ();
    fn pick(info: NodeInfo) -> Option<()> {
        matches!(info, NodeInfo::Empty(_)).then_some(())
    }
}
impl ReadBack for node_kind::Empty {
    type Info = ();
}

/// The most parameters a kernel can have is bounded by its 32 KiB parameter space; this bounds
/// the loop that asks for them.
const MAX_KERNEL_PARAMS: usize = 32 * 1024;

impl GraphDefinition {
    /// Reads `node` back: its typed handle and its parameters as the driver holds them now —
    /// a kernel's launch configuration, function and arguments; memset, memcpy, allocation and
    /// free parameters; an event node's [`Event`]; a host node's [`HostCallback`]; the graph a
    /// child-graph node runs, as a definition to inspect and extend; a conditional node's handle,
    /// kind and bodies. Works for every node [`nodes`](Self::nodes) lists, captured ones
    /// included.
    ///
    /// Refused: a node of another graph ([`Error::ForeignNode`]) or destroyed
    /// ([`Error::DestroyedNode`]). A conditional node this crate did not make (one of a
    /// [`try_clone`](Self::try_clone)'s copies) needs `cuGraphNodeGetParams` (driver 13.2):
    /// [`Error::Unsupported`]. Reading kernel arguments needs driver 12.4 (`cuFuncGetParamInfo`):
    /// [`Error::Unsupported`] below it.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// use cuda_graph::NodeInfo;
    /// # fn f(def: &GraphDefinition, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let set = def.add_memset(&[], buf, 7i32)?;
    /// match def.inspect(&set)? {
    ///     NodeInfo::Memset(node, m) => {
    ///         assert_eq!(node, set);
    ///         assert_eq!((m.dst, m.value, m.width), (buf.device_ptr(), 7, buf.len()));
    ///     }
    ///     other => unreachable!("{other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn inspect(&self, node: &GraphNode) -> Result<NodeInfo> {
        let graph = self.handle();
        let mut locked = self.lock()?;
        let raw = node::check(&locked.tree, graph.id, node)?;
        let ty = NodeType::from_raw(super::raw_node_type(raw)?);
        let n = *node;
        if ty == NodeType::Child {
            // SAFETY: `raw` is a live child-graph node of the locked tree.
            let child = unsafe { driver::graph::child_graph_node_get_graph(raw) }?;
            let next = crate::driver::graph::next_id();
            let id = *locked.tree.embedded.entry((n.graph, n.raw)).or_insert(next);
            // Made under the lock: destroying the node marks its graph dead, which the view
            // then sees.
            let view = GraphHandle::node_owned(&mut locked.tree, graph, child, id, true);
            drop(locked);
            return Ok(NodeInfo::ChildGraph(
                TypedNode::new(n),
                ChildGraphInfo {
                    graph: GraphDefinition::view(view),
                },
            ));
        }
        let tree = &mut *locked.tree;
        // Every driver call below reads a live node of the locked tree (the read-back promise).
        let info = match ty {
            NodeType::Kernel => NodeInfo::Kernel(TypedNode::new(n), kernel_info(tree, &n, raw)?),
            NodeType::Memset => {
                // SAFETY: `raw` is a live memset node of the locked tree.
                let p = unsafe { driver::graph::memset_node_get_params(raw) }?;
                NodeInfo::Memset(
                    TypedNode::new(n),
                    MemsetInfo {
                        dst: p.dst,
                        pitch: p.pitch,
                        value: p.value,
                        element_size: p.elementSize,
                        width: p.width,
                        height: p.height,
                    },
                )
            }
            NodeType::Memcpy => {
                // SAFETY: `raw` is a live memcpy node of the locked tree.
                let c = unsafe { driver::graph::memcpy_node_get_params(raw) }?;
                let side = |kind: u32, host: usize, device: u64, x: usize| {
                    let base = if kind == 1 { host as u64 } else { device };
                    (MemoryKind::from_raw(kind), base.wrapping_add(x as u64))
                };
                let (src_kind, src) = side(c.src_type, c.src_host, c.src_device, c.src_x);
                let (dst_kind, dst) = side(c.dst_type, c.dst_host, c.dst_device, c.dst_x);
                NodeInfo::Memcpy(
                    TypedNode::new(n),
                    MemcpyInfo {
                        src_kind,
                        src,
                        dst_kind,
                        dst,
                        width_bytes: c.width,
                        height: c.height,
                        depth: c.depth,
                    },
                )
            }
            NodeType::Host => {
                // SAFETY: `raw` is a live host node of the locked tree.
                let (func, data) = unsafe { driver::graph::host_node_get_params(raw) }?;
                let ours = func.is_some_and(callback::is_trampoline);
                let callback = if ours {
                    let mut found = None;
                    tree.find_owner(n.graph, n.raw, n.serial, &mut |o| {
                        found = callback::observer_of(o, data);
                        found.is_some()
                    });
                    found
                } else {
                    None
                };
                NodeInfo::Host(TypedNode::new(n), HostInfo { callback })
            }
            NodeType::EventRecord | NodeType::EventWait => {
                let wait = ty == NodeType::EventWait;
                // SAFETY: `raw` is a live event node of the locked tree, of the kind `wait` says.
                let ev = unsafe { driver::graph::event_node_get_event(raw, wait) }?;
                let event = tree
                    .find_owner(n.graph, n.raw, n.serial, &mut |o| {
                        o.downcast_ref::<EventHandle>().is_some_and(|e| e.raw == ev)
                    })
                    .and_then(|o| o.downcast::<EventHandle>().ok())
                    .map(|handle| Event { handle });
                let info = EventInfo { event, raw: ev };
                if wait {
                    NodeInfo::EventWait(TypedNode::new(n), info)
                } else {
                    NodeInfo::EventRecord(TypedNode::new(n), info)
                }
            }
            NodeType::MemAlloc => {
                // SAFETY: `raw` is a live allocation node of the locked tree.
                let (device_ptr, bytes, device) =
                    unsafe { driver::graph::mem_alloc_node_get_params(raw) }?;
                NodeInfo::MemAlloc(
                    TypedNode::new(n),
                    MemAllocInfo {
                        device_ptr,
                        bytes,
                        device,
                    },
                )
            }
            NodeType::MemFree => {
                // SAFETY: `raw` is a live free node of the locked tree.
                let device_ptr = unsafe { driver::graph::mem_free_node_get_params(raw) }?;
                NodeInfo::MemFree(TypedNode::new(n), MemFreeInfo { device_ptr })
            }
            NodeType::Empty => NodeInfo::Empty(TypedNode::new(n)),
            NodeType::Conditional => {
                let Some(rec) = tree.conditionals.get(&(n.graph, n.raw)).cloned() else {
                    driver::require(
                        "reading back a conditional node this crate did not make (cuGraphNodeGetParams)",
                        DriverVersion::V13_2,
                    )?;
                    return Err(Error::invalid(
                        Refusal::ForeignGraph,
                        "this conditional node was not made by this crate (a copy's node, say): read the original graph's node instead",
                    ));
                };
                let kind = CondKind::from_raw(rec.ty, rec.bodies.len() as u32)
                    .map(CondKind::public)
                    .ok_or_else(|| {
                        Error::Internal(format!("unknown conditional node type {}", rec.ty))
                    })?;
                let bodies = rec
                    .bodies
                    .iter()
                    .map(|&(id, raw)| {
                        GraphDefinition::view(GraphHandle::node_owned(
                            tree,
                            graph,
                            raw as sys::CUgraph,
                            id,
                            false,
                        ))
                    })
                    .collect();
                NodeInfo::Conditional(
                    TypedNode::new(n),
                    ConditionalInfo {
                        handle: ConditionalHandle {
                            raw: rec.handle.0,
                            graph_id: rec.handle.1,
                        },
                        kind,
                        bodies,
                    },
                )
            }
            other => NodeInfo::Other(n, other),
        };
        drop(locked);
        Ok(info)
    }

    /// The parameters of `node`, of the type its kind reads back as (see [`inspect`](Self::inspect),
    /// which also takes untyped nodes): a [`KernelInfo`] for a
    /// [`KernelNode`](crate::KernelNode), a [`MemsetInfo`] for a
    /// [`MemsetNode`](crate::MemsetNode), and so on.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, f: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let args = KernelArgs::new().arg(buf).arg(5i32);
    /// // SAFETY: the kernel takes (int*, int) and stays in bounds.
    /// let k = unsafe { def.add_kernel_unchecked(&[], f, LaunchConfig::single(), &args)? };
    /// let info = def.node_info(&k)?;
    /// assert_eq!(info.arg::<i32>(1), Some(5));
    /// # Ok(()) }
    /// ```
    pub fn node_info<K: ReadBack>(&self, node: &TypedNode<K>) -> Result<K::Info> {
        let info = self.inspect(node)?;
        let found = kind_of(&info);
        <K as sealed::Sealed>::pick(info).ok_or(Error::WrongNodeType {
            expected: K::TYPE,
            found,
        })
    }
}

/// The type of node `info` describes.
fn kind_of(info: &NodeInfo) -> NodeType {
    match info {
        NodeInfo::Kernel(..) => NodeType::Kernel,
        NodeInfo::Memset(..) => NodeType::Memset,
        NodeInfo::Memcpy(..) => NodeType::Memcpy,
        NodeInfo::Host(..) => NodeType::Host,
        NodeInfo::ChildGraph(..) => NodeType::Child,
        NodeInfo::Empty(..) => NodeType::Empty,
        NodeInfo::EventRecord(..) => NodeType::EventRecord,
        NodeInfo::EventWait(..) => NodeType::EventWait,
        NodeInfo::MemAlloc(..) => NodeType::MemAlloc,
        NodeInfo::MemFree(..) => NodeType::MemFree,
        NodeInfo::Conditional(..) => NodeType::Conditional,
        NodeInfo::Other(_, t) => *t,
    }
}

/// A kernel node's launch, read under the tree lock.
fn kernel_info(tree: &TreeState, n: &GraphNode, raw: sys::CUgraphNode) -> Result<KernelInfo> {
    // SAFETY: `raw` is a live kernel node of the locked tree.
    let p = unsafe { driver::graph::kernel_node_get_params(raw) }?;
    // SAFETY: `raw` is a live kernel node of the locked tree.
    let raw_attributes = unsafe { driver::launch::node_attributes(raw) }?;
    // SAFETY: as above.
    let dependent = unsafe { driver::launch::has_programmatic_dependency(raw) }?;
    // The dependent flag stays out of the configuration: a safe caller reusing it must not
    // make a dependent launch of a kernel that has not declared its wait.
    let attributes = crate::LaunchAttributes::NONE
        .set_cluster(raw_attributes.cluster)
        .set_priority(raw_attributes.priority)
        .set_cooperative(raw_attributes.cooperative);
    let config = LaunchConfig {
        grid: (p.gridDimX, p.gridDimY, p.gridDimZ),
        block: (p.blockDimX, p.blockDimY, p.blockDimZ),
        shared_mem_bytes: p.sharedMemBytes,
        attributes,
    };
    let func = p.func;
    if func.is_null() {
        return Ok(KernelInfo {
            function: None,
            name: None,
            config,
            dependent,
            args: Vec::new(),
        });
    }
    // SAFETY (these three): `func` is the node's kernel, whose module the graph keeps loaded.
    let name = unsafe { driver::module::func_name(func) }.ok();
    let module = unsafe { driver::module::func_module(func) }.ok();
    driver::require(
        "reading kernel arguments back (cuFuncGetParamInfo)",
        DriverVersion::V12_4,
    )?;
    let mut args = Vec::new();
    for index in 0..MAX_KERNEL_PARAMS {
        let Some((_, size)) = (unsafe { driver::module::func_param_info(func, index) })? else {
            break;
        };
        if p.kernelParams.is_null() {
            break;
        }
        // SAFETY: the driver returned `kernelParams` with one pointer per parameter of the kernel
        // (`index` is one, as `cuFuncGetParamInfo` just said), each at `size` readable bytes
        // owned by the node, valid while the tree stays locked.
        let bytes = unsafe {
            let value = *p.kernelParams.add(index);
            std::slice::from_raw_parts(value.cast::<u8>(), size).to_vec()
        };
        args.push(bytes);
    }
    let function = module.and_then(|m| {
        let owner: Owner = tree.find_owner(n.graph, n.raw, n.serial, &mut |o| {
            o.downcast_ref::<ModuleHandle>().is_some_and(|h| h.raw == m)
        })?;
        let module: Arc<ModuleHandle> = owner.downcast().ok()?;
        Some(Function::from_parts(
            module,
            func,
            name.clone().unwrap_or_default(),
        ))
    });
    Ok(KernelInfo {
        function,
        name,
        config,
        dependent,
        args,
    })
}

static_assertions::assert_impl_all!(NodeInfo: Send, Sync, std::fmt::Debug);
static_assertions::assert_impl_all!(KernelInfo: Send, Sync, Clone);
static_assertions::assert_impl_all!(EventInfo: Send, Sync, Clone);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_read_back_by_size() {
        let info = KernelInfo {
            function: None,
            name: None,
            config: LaunchConfig::single(),
            dependent: false,
            args: vec![
                0x1234_5678_9abc_def0u64.to_ne_bytes().to_vec(),
                7i32.to_ne_bytes().to_vec(),
            ],
        };
        assert_eq!(info.arg::<u64>(0), Some(0x1234_5678_9abc_def0));
        assert_eq!(info.arg::<i32>(1), Some(7));
        assert_eq!(info.arg::<u64>(1), None, "wrong size");
        assert_eq!(info.arg::<i32>(2), None, "no such argument");
    }

    #[test]
    fn memory_kinds_and_copy_sizes() {
        assert_eq!(MemoryKind::from_raw(2), MemoryKind::Device);
        assert_eq!(MemoryKind::from_raw(1), MemoryKind::Host);
        assert_eq!(MemoryKind::from_raw(99), MemoryKind::Other(99));
        let c = MemcpyInfo {
            src_kind: MemoryKind::Device,
            src: 0,
            dst_kind: MemoryKind::Device,
            dst: 0,
            width_bytes: usize::MAX,
            height: 2,
            depth: 1,
        };
        assert_eq!(c.bytes(), usize::MAX, "saturates");
    }

    #[test]
    fn conditional_kinds_from_the_driver_type() {
        assert_eq!(
            CondKind::from_raw(0, 1).map(CondKind::public),
            Some(ConditionalKind::If)
        );
        assert_eq!(
            CondKind::from_raw(0, 2).map(CondKind::public),
            Some(ConditionalKind::IfElse)
        );
        assert_eq!(
            CondKind::from_raw(1, 1).map(CondKind::public),
            Some(ConditionalKind::While)
        );
        assert_eq!(
            CondKind::from_raw(2, 5).map(CondKind::public),
            Some(ConditionalKind::Switch(5))
        );
        assert!(CondKind::from_raw(7, 1).is_none());
    }
}
