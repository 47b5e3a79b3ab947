//! Conditional nodes, for builders and definitions alike: handles, node parameters, bodies.

use std::sync::Arc;

use cudarc::driver::sys;

use crate::driver::graph::{CondRecord, GraphHandle, TreeState};
use crate::driver::{self, compat, DriverVersion};
use crate::error::{Error, Refusal, Result};
use crate::runtime::{KernelArg, KernelArgs};

/// A conditional handle (`CUgraphConditionalHandle`): the value a conditional node tests, set from
/// device code with `cudaGraphSetConditional` or reset to its default at each launch.
///
/// It is `Copy` and passes to kernels as a 64-bit argument. It belongs to the graph whose builder
/// or definition created it: conditional nodes of that graph, of its conditional bodies (at any
/// depth) and of the graphs its child-graph nodes run (seen through
/// [`GraphDefinition::inspect`](crate::GraphDefinition::inspect)) may test it, as CUDA allows;
/// a conditional node anywhere else refuses it with [`Error::ForeignConditionalHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConditionalHandle {
    pub(crate) raw: sys::CUgraphConditionalHandle,
    pub(crate) graph_id: u64,
}

impl ConditionalHandle {
    /// The raw 64-bit handle value.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let h = b.create_conditional_handle(Some(1))?;
    /// println!("handle {:#x}", h.raw());
    /// # Ok(()) }
    /// ```
    pub fn raw(&self) -> u64 {
        self.raw
    }
}

impl KernelArg for ConditionalHandle {
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(self.raw);
    }
}

impl KernelArg for &ConditionalHandle {
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(self.raw);
    }
}

/// A `cudaGraphConditionalHandle` parameter of a typed [`Kernel`](crate::Kernel).
impl crate::KernelParam for ConditionalHandle {}
impl crate::runtime::kernel_sealed::Param for ConditionalHandle {
    const SIZE: usize = std::mem::size_of::<sys::CUgraphConditionalHandle>();
}
crate::runtime::arg_for! {
    [] ConditionalHandle => ConditionalHandle, |h, r| r.handle(&h.raw, h.graph_id);
    [] &ConditionalHandle => ConditionalHandle, |h, r| r.handle(&h.raw, h.graph_id);
}

/// Creates a conditional handle in `graph` (`cuGraphConditionalHandleCreate`), for builders and
/// definitions alike. The caller holds the graph's tree lock.
pub(crate) fn create_handle(
    graph: &GraphHandle,
    default: Option<u32>,
) -> Result<ConditionalHandle> {
    driver::require("conditional handles", DriverVersion::V12_3)?;
    let ctx = &graph.ctx;
    ctx.bind()?;
    let flags = if default.is_some() {
        sys::CU_GRAPH_COND_ASSIGN_DEFAULT
    } else {
        0
    };
    // SAFETY: the graph and context are live, the graph's tree is locked (by the caller).
    let raw = unsafe {
        driver::graph::conditional_handle_create(graph.raw, ctx.raw, default.unwrap_or(0), flags)
    }?;
    Ok(ConditionalHandle {
        raw,
        graph_id: graph.id,
    })
}

/// The four conditional node kinds, shared by builders and definitions.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CondKind {
    If,
    IfElse,
    Switch(u32),
    While,
}

/// What kind of conditional node a node is, as read back with
/// [`GraphDefinition::inspect`](crate::GraphDefinition::inspect).
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// use cuda_graph::{ConditionalKind, NodeInfo};
/// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
/// let h = def.create_conditional_handle(Some(1))?;
/// let (node, _body) = def.add_while(&[], &h)?;
/// if let NodeInfo::Conditional(_, info) = def.inspect(&node)? {
///     assert_eq!(info.kind, ConditionalKind::While);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConditionalKind {
    /// IF: one body, run when the value is non-zero.
    If,
    /// IF with an ELSE body: the first body runs when the value is non-zero, the second when it
    /// is zero.
    IfElse,
    /// WHILE: one body, run again as long as the value is non-zero.
    While,
    /// SWITCH with this many bodies: body `n` runs when the value is `n`.
    Switch(u32),
}

impl CondKind {
    /// The kind as the public enum.
    pub(crate) fn public(self) -> ConditionalKind {
        match self {
            CondKind::If => ConditionalKind::If,
            CondKind::IfElse => ConditionalKind::IfElse,
            CondKind::Switch(n) => ConditionalKind::Switch(n),
            CondKind::While => ConditionalKind::While,
        }
    }

    /// The kind the driver's type and body count describe (`None`: a type this crate does not
    /// know).
    pub(crate) fn from_raw(ty: u32, size: u32) -> Option<CondKind> {
        match (ty, size) {
            (0, 1) => Some(CondKind::If),
            (0, 2) => Some(CondKind::IfElse),
            (1, _) => Some(CondKind::While),
            (2, n) => Some(CondKind::Switch(n)),
            _ => None,
        }
    }

    /// The driver's `CUgraphConditionalNodeType`, as the integer it is.
    fn raw_type(self) -> u32 {
        match self {
            CondKind::If | CondKind::IfElse => 0,
            CondKind::While => 1,
            CondKind::Switch(_) => 2,
        }
    }
    /// The node type; SWITCH is set by [`compat::set_switch`] (not every binding version has it).
    fn ty(self) -> sys::CUgraphConditionalNodeType {
        use sys::CUgraphConditionalNodeType::*;
        match self {
            CondKind::If | CondKind::IfElse | CondKind::Switch(_) => CU_GRAPH_COND_TYPE_IF,
            CondKind::While => CU_GRAPH_COND_TYPE_WHILE,
        }
    }

    /// The number of bodies.
    pub(crate) fn size(self) -> u32 {
        match self {
            CondKind::If | CondKind::While => 1,
            CondKind::IfElse => 2,
            CondKind::Switch(n) => n,
        }
    }

    /// Fails with [`Error::Unsupported`] when the driver is too old for this kind.
    pub(crate) fn require(self) -> Result<()> {
        let (feature, needs) = match self {
            CondKind::If => ("conditional IF nodes", DriverVersion::V12_3),
            CondKind::While => ("conditional WHILE nodes", DriverVersion::V12_3),
            CondKind::IfElse => (
                "conditional IF nodes with an ELSE body",
                DriverVersion::V12_8,
            ),
            CondKind::Switch(_) => ("conditional SWITCH nodes", DriverVersion::V12_8),
        };
        driver::require(feature, needs)
    }
}

/// The most bodies a SWITCH node may have here. The driver makes every body graph at once
/// (2^20 bodies take it 0.6 s on an H200), and each body is a builder or definition of its own:
/// a larger count is almost certainly a mistake, refused before any driver work.
pub const MAX_SWITCH_BODIES: u32 = 1 << 16;

/// Refuses a handle that already drives a conditional node of the tree: the driver lets one
/// handle drive one conditional node (it answers a second with `CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn check_unused(tree: &TreeState, handle: &ConditionalHandle) -> Result<()> {
    if tree
        .conditionals
        .values()
        .any(|r| r.handle == (handle.raw, handle.graph_id))
    {
        return Err(Error::invalid(
            Refusal::ForeignGraph,
            "this conditional handle already drives a conditional node: each conditional node needs a handle of its own (create another with create_conditional_handle)",
        ));
    }
    Ok(())
}

/// The parameters of a conditional node of `kind` in `graph`; checks that the handle belongs to
/// `graph` and that there is at least one body.
pub(crate) fn node_params(
    graph: &GraphHandle,
    handle: &ConditionalHandle,
    kind: CondKind,
) -> Result<sys::CUgraphNodeParams> {
    let (ty, size) = (kind.ty(), kind.size());
    // CUDA lets the conditional nodes of a graph's bodies and children test its handles.
    if !graph.any_in_chain(|id| id == handle.graph_id) {
        return Err(Error::ForeignConditionalHandle);
    }
    if size == 0 {
        return Err(Error::invalid(
            Refusal::Size,
            "a conditional node needs at least one body",
        ));
    }
    if size > MAX_SWITCH_BODIES {
        return Err(Error::invalid(
            Refusal::Size,
            format!("a SWITCH node of {size} bodies: at most {MAX_SWITCH_BODIES} are supported"),
        ));
    }
    // SAFETY: zeroed node parameters are valid plain C data; the used fields are set below.
    let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
    params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
    params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
        handle: handle.raw,
        type_: ty,
        size,
        phGraph_out: std::ptr::null_mut(),
        ctx: graph.ctx.raw,
    };
    if let CondKind::Switch(_) = kind {
        compat::set_switch(&mut params);
    }
    Ok(params)
}

/// The body graphs the driver made for a conditional node added with `params`.
pub(crate) fn body_graphs(params: &sys::CUgraphNodeParams, size: u32) -> Result<Vec<sys::CUgraph>> {
    // SAFETY: after a successful add the driver set `phGraph_out` to an array of `size` body
    // graphs owned by the node, valid as long as the node lives; we copy it at once.
    unsafe {
        let out = params.__bindgen_anon_1.conditional.phGraph_out;
        if out.is_null() {
            return Err(Error::Internal(
                "the driver returned no conditional body graphs".into(),
            ));
        }
        Ok(std::slice::from_raw_parts(out, size as usize).to_vec())
    }
}

/// Wraps the bodies of conditional node `node` of `graph` and records them in the tree, so that
/// destroying the node (through a definition) marks them dead, and the node's handle and kind
/// for reading it back.
pub(crate) fn register_bodies(
    tree: &mut TreeState,
    graph: &Arc<GraphHandle>,
    node: sys::CUgraphNode,
    raws: Vec<sys::CUgraph>,
    handle: &ConditionalHandle,
    kind: CondKind,
) -> Vec<Arc<GraphHandle>> {
    let bodies: Vec<_> = raws
        .into_iter()
        .map(|raw| GraphHandle::body(tree, graph, raw))
        .collect();
    tree.conditionals.insert(
        (graph.id, node as usize),
        CondRecord {
            handle: (handle.raw, handle.graph_id),
            ty: kind.raw_type(),
            bodies: bodies.iter().map(|b| (b.id, b.raw as usize)).collect(),
        },
    );
    bodies
}
