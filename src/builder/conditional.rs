//! Conditional nodes: `if_then`, `if_else`, `switch`, `while_loop`, and their handles.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys;

use super::core::Core;
use super::kind::{ConditionalBody, Kind};
use super::state::State;
use super::state::{IsCapturing, NotStarted};
use super::GraphBuilder;
use crate::driver::graph::{GraphHandle, TreeState};
use crate::driver::{self, compat, drv, DriverVersion};
use crate::error::{Error, Result};
use crate::runtime::{KernelArg, KernelArgs};

/// A conditional handle (`CUgraphConditionalHandle`): the value a conditional node tests, set from
/// device code with `cudaGraphSetConditional` or reset to its default at each launch.
///
/// It is `Copy` and passes to kernels as a 64-bit argument. It belongs to the graph whose builder
/// created it; using it with another graph is an [`Error::ForeignConditionalHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConditionalHandle {
    pub(crate) raw: sys::CUgraphConditionalHandle,
    pub(crate) graph_id: u64,
}

impl ConditionalHandle {
    /// The raw 64-bit handle value.
    pub fn raw(&self) -> u64 {
        self.raw
    }
}

impl KernelArg for ConditionalHandle {
    fn push_to(&self, args: &mut KernelArgs) {
        args.push_value(self.raw);
    }
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
    let mut raw = 0;
    let flags = if default.is_some() {
        sys::CU_GRAPH_COND_ASSIGN_DEFAULT
    } else {
        0
    };
    // SAFETY: the graph and context are live, the graph's tree is locked (by the caller); `raw` is
    // a valid out pointer.
    unsafe {
        drv!(cuGraphConditionalHandleCreate(
            &mut raw,
            graph.raw,
            ctx.raw,
            default.unwrap_or(0),
            flags
        ))
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

impl CondKind {
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

/// The parameters of a conditional node of `kind` in `graph`; checks that the handle belongs to
/// `graph` and that there is at least one body.
pub(crate) fn node_params(
    graph: &GraphHandle,
    handle: &ConditionalHandle,
    kind: CondKind,
) -> Result<sys::CUgraphNodeParams> {
    let (ty, size) = (kind.ty(), kind.size());
    if handle.graph_id != graph.id {
        return Err(Error::ForeignConditionalHandle);
    }
    if size == 0 {
        return Err(Error::InvalidArgument(
            "a conditional node needs at least one body".into(),
        ));
    }
    if size > MAX_SWITCH_BODIES {
        return Err(Error::InvalidArgument(format!(
            "a SWITCH node of {size} bodies: at most {MAX_SWITCH_BODIES} are supported"
        )));
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
            return Err(Error::InvalidArgument(
                "the driver returned no conditional body graphs".into(),
            ));
        }
        Ok(std::slice::from_raw_parts(out, size as usize).to_vec())
    }
}

/// Wraps the bodies of conditional node `node` of `graph` and records them in the tree, so that
/// destroying the node (through a definition) marks them dead.
pub(crate) fn register_bodies(
    tree: &mut TreeState,
    graph: &Arc<GraphHandle>,
    node: sys::CUgraphNode,
    raws: Vec<sys::CUgraph>,
) -> Vec<Arc<GraphHandle>> {
    let bodies: Vec<_> = raws
        .into_iter()
        .map(|raw| GraphHandle::body(graph, raw))
        .collect();
    tree.bodies.insert(
        (graph.id, node as usize),
        bodies.iter().map(|b| b.id).collect(),
    );
    bodies
}

/// While capturing: conditional nodes.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    fn conditional_graph(&self) -> Result<&Arc<GraphHandle>>
    where
        S: IsCapturing,
    {
        self.core
            .graph
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("the builder's stream is not capturing".into()))
    }

    /// Creates a conditional handle in this builder's graph (`cuGraphConditionalHandleCreate`).
    ///
    /// With `Some(value)` the handle is reset to `value` at the start of every launch; with `None`
    /// it keeps what device code last set. Needs driver 12.3.
    pub fn create_conditional_handle(&self, default: Option<u32>) -> Result<ConditionalHandle>
    where
        S: IsCapturing,
    {
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
        let bodies = self.core.stream.enqueue(|rec| {
            let node = self.core.add_node(rec, &mut params)?;
            let raws = body_graphs(&params, size)?;
            let tree = rec.tree.as_deref_mut().ok_or_else(|| {
                Error::InvalidArgument("the builder's stream is not capturing".into())
            })?;
            Ok(register_bodies(tree, &graph, node, raws))
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
    pub fn if_then(
        &self,
        handle: &ConditionalHandle,
    ) -> Result<GraphBuilder<ConditionalBody<'_>, NotStarted>>
    where
        S: IsCapturing,
    {
        let mut v = self.conditional(handle, CondKind::If)?;
        v.pop()
            .ok_or_else(|| Error::InvalidArgument("no body".into()))
    }

    /// Adds an IF node with an ELSE body: `(then, else)`; `then` runs when the value is non-zero,
    /// `else` when it is zero. Needs driver 12.8.
    #[allow(clippy::type_complexity)]
    pub fn if_else(
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
            _ => Err(Error::InvalidArgument("no bodies".into())),
        }
    }

    /// Adds a SWITCH node with `n` bodies: body `i` runs when the value is `i`; a value `>= n` runs
    /// none. Needs driver 12.8. `n == 0` and `n >` [`MAX_SWITCH_BODIES`] are an
    /// [`Error::InvalidArgument`], refused before any driver work.
    pub fn switch(
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
    pub fn while_loop(
        &self,
        handle: &ConditionalHandle,
    ) -> Result<GraphBuilder<ConditionalBody<'_>, NotStarted>>
    where
        S: IsCapturing,
    {
        let mut v = self.conditional(handle, CondKind::While)?;
        v.pop()
            .ok_or_else(|| Error::InvalidArgument("no body".into()))
    }
}
