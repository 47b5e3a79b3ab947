//! [`NodeParams`]: complete replacement parameters for one kind of node, and setting them on a
//! definition's node ([`GraphDefinition::set_params`]). Execs set them with
//! [`Graph::set_params`](crate::Graph::set_params) (in `definition/exec_nodes.rs`).

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys;

use super::memset::{memset_value, Memset2d, MemsetValue};
use super::node;
use super::typed::{node_kind, NodeKind, TypedNode};
use super::GraphDefinition;
use crate::core::callback;
use crate::core::source::FinishedGraph;
use crate::driver;
use crate::driver::compat;
use crate::driver::event::EventHandle;
use crate::driver::graph::{lock_two, GraphHandle, Owner, Owners, TreeState};
use crate::error::{Error, Refusal, Result};
use crate::runtime::{DeviceBuffer, DeviceCopy, Event, Function, KernelArgs, LaunchConfig};
use crate::HostCallback;

/// Complete new parameters for a node of kind `K`: what [`GraphDefinition::set_params`] puts in
/// a definition's node and [`Graph::set_params`](crate::Graph::set_params) in an exec's. Each
/// kind has its constructors ([`kernel`](NodeParams::kernel), [`memset`](NodeParams::memset),
/// [`memcpy`](NodeParams::memcpy), [`host_callback`](NodeParams::host_callback),
/// [`child_graph`](NodeParams::child_graph), [`event_record`](NodeParams::event_record),
/// [`event_wait`](NodeParams::event_wait)), and a `NodeParams<K>` only fits a
/// [`TypedNode<K>`]: memset parameters for a kernel node do not compile.
///
/// It holds what the parameters use (buffers, the kernel's module, the callback, the event, the
/// child graph and its operands); the node or exec that takes them holds that from then on.
/// `Send + Sync`.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(def: &GraphDefinition, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
/// let clear = def.add_memset(&[], buf, 0i32)?;
/// def.set_params(&clear, NodeParams::memset(buf, 7i32)?)?; // now it sets 7
/// # Ok(()) }
/// ```
#[must_use = "parameters do nothing until passed to `set_params`"]
pub struct NodeParams<K: NodeKind> {
    pub(crate) raw: RawParams,
    /// What the parameters use.
    pub(crate) owners: Owners,
    /// The device whose memory or modules the parameters use (`None`: no device's).
    device: Option<i32>,
    /// The graphs of the conditional handles a typed kernel's arguments hold: the node's graph
    /// must be one of them or a body or child of one.
    handles: smallvec::SmallVec<[u64; 1]>,
    kind: PhantomData<fn() -> K>,
}

/// A kernel launch's parameters (boxed: `KernelArgs` holds its values inline).
pub(crate) struct KernelParams {
    function: Function,
    config: LaunchConfig,
    args: KernelArgs<'static>,
}

/// The parameters themselves, without raw pointers (so `NodeParams` is `Send + Sync`); the
/// driver's structures are made at the call.
pub(crate) enum RawParams {
    Kernel(Box<KernelParams>),
    Memset {
        dst: u64,
        pitch: usize,
        value: u32,
        element_size: u32,
        width: usize,
        height: usize,
    },
    Memcpy {
        dst: u64,
        src: u64,
        region: crate::driver::memory::RawCopy,
    },
    Host {
        func: unsafe extern "C" fn(*mut c_void),
        /// The callback's state, held by `owners`.
        user_data: usize,
    },
    Child(Arc<GraphHandle>),
    EventRecord(Arc<EventHandle>),
    EventWait(Arc<EventHandle>),
}

impl<K: NodeKind> std::fmt::Debug for NodeParams<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeParams")
            .field("kind", &K::TYPE)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl<K: NodeKind> NodeParams<K> {
    fn new(raw: RawParams, owners: Owners, device: Option<i32>) -> Self {
        NodeParams {
            raw,
            owners,
            device,
            handles: smallvec::SmallVec::new(),
            kind: PhantomData,
        }
    }

    /// Refuses conditional handles of graphs outside `graph`'s chain (the graph the node is in,
    /// and the graphs whose body or child it is).
    pub(crate) fn check_handles(&self, graph: &crate::driver::graph::GraphHandle) -> Result<()> {
        check_handles(&self.handles, graph)
    }

    /// The parameters taken apart: what the driver is given, what it uses, and the graphs of
    /// the conditional handles among them (for [`check_handles`]).
    pub(crate) fn into_parts(self) -> (RawParams, Owners, smallvec::SmallVec<[u64; 1]>) {
        (self.raw, self.owners, self.handles)
    }

    /// Refuses parameters of another device than `graph`'s.
    pub(crate) fn check_device(&self, device: i32) -> Result<()> {
        match self.device {
            Some(d) if d != device => Err(Error::invalid(
                Refusal::OtherDevice,
                format!("the new parameters use device {d} but the graph lives on device {device}"),
            )),
            _ => Ok(()),
        }
    }
}

/// Refuses conditional handles (`handles`: the graphs they belong to) that are not of `graph`
/// or a graph above it ([`Error::ForeignConditionalHandle`]).
pub(crate) fn check_handles(
    handles: &[u64],
    graph: &crate::driver::graph::GraphHandle,
) -> Result<()> {
    if handles.iter().any(|&h| !graph.any_in_chain(|id| id == h)) {
        return Err(Error::ForeignConditionalHandle);
    }
    Ok(())
}

impl NodeParams<node_kind::Kernel> {
    /// A launch of a typed `kernel` with `config` and `args`, one per parameter of its
    /// signature, checked at compile time, for a [`KernelNode`](crate::KernelNode). A buffer of
    /// another device than the kernel's is an [`Error::InvalidArgument`]. The kernel's
    /// module and every buffer given are held by the node or exec that takes them.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(g: &Graph, k: &KernelNode, affine: &Kernel<(*mut i32, i32, i32)>, other: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// g.set_params(k, NodeParams::kernel(affine, LaunchConfig::single(), (other, 3, 0))?)?;
    /// # Ok(()) }
    /// ```
    pub fn kernel<S: crate::Signature>(
        kernel: &crate::Kernel<S>,
        config: LaunchConfig,
        args: impl crate::ArgsFor<S>,
    ) -> Result<Self> {
        let device = kernel.function().module.ctx.device;
        let handles = crate::runtime::with_refs(&args, device, |refs| {
            if refs.uses_graph_memory() {
                return Err(Error::invalid(
                    Refusal::Order,
                    "a GraphBuffer cannot go into node parameters (the order of a node that exists is not checked against its allocation): add a new kernel node after the allocation node instead",
                ));
            }
            refs.check_device("kernel's module")
                .map(|()| refs.handle_graphs().iter().copied().collect())
        })?;
        let args = crate::runtime::collect_args(args);
        // SAFETY: `Kernel`'s maker promised its signature and bounds; `args` matches the
        // signature (checked by `ArgsFor`), holds no graph allocation, and lives on the kernel's
        // device (checked above); its conditional handles are checked against the node's graph
        // by `set_params`.
        let mut params = unsafe { Self::kernel_unchecked(kernel.function(), config, args) };
        params.handles = handles;
        Ok(params)
    }

    /// A launch of a [`DependentKernel`](crate::DependentKernel) for a [`KernelNode`](crate::KernelNode), as
    /// [`kernel`](Self::kernel): the only kernel parameters a node that follows another
    /// programmatically ([`GraphDefinition::add_dependent_kernel`], a captured
    /// [`launch_dependent`](crate::GraphBuilder::launch_dependent)) takes.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(g: &Graph, k: &KernelNode, then: &DependentKernel<(*mut f32,)>, other: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// g.set_params(k, NodeParams::dependent_kernel(then, LaunchConfig::for_num_elems(1024), other)?)?;
    /// # Ok(()) }
    /// ```
    pub fn dependent_kernel<D: crate::WaitsForPredecessor>(
        kernel: &D,
        config: LaunchConfig,
        args: impl crate::ArgsFor<D::Sig>,
    ) -> Result<Self> {
        let mut config = config;
        config.attributes = config.attributes.set_dependent(true);
        Self::kernel(kernel.waiting_kernel(), config, args)
    }

    /// A launch of an untyped `function` with `config` and `args` (moved in: the parameters keep
    /// its values), for a [`KernelNode`](crate::KernelNode): the raw form of [`kernel`](Self::kernel). The function's module and every
    /// buffer in `args` are held by the node or exec that takes them.
    ///
    /// # Safety
    /// As [`GraphDefinition::add_kernel`]: `args` must match the kernel's parameters in number,
    /// order and type, and the kernel must stay in bounds of the memory it is given.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, k: &KernelNode, add_one: &Function, other: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// // SAFETY: add_one takes one int*.
    /// let p = unsafe { NodeParams::kernel_unchecked(add_one, LaunchConfig::single(), KernelArgs::new().arg(other)) };
    /// def.set_params(k, p)?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn kernel_unchecked(
        function: &Function,
        config: LaunchConfig,
        args: KernelArgs<'_>,
    ) -> Self {
        let mut owners = Owners::new();
        owners.push(function.module.clone());
        owners.extend(args.owners().map(|o| o.owner()));
        // The parameters hold the owners (`owners`); the arguments keep their values alone.
        let args = args.into_values();
        let device = Some(function.module.ctx.device);
        Self::new(
            RawParams::Kernel(Box::new(KernelParams {
                function: function.clone(),
                config,
                args,
            })),
            owners,
            device,
        )
    }
}

impl NodeParams<node_kind::Memset> {
    /// A memset of every element of `buf` to `value`, for a [`MemsetNode`](crate::MemsetNode).
    /// Elements of 1, 2 or 4 bytes; an 8-byte type is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::MemsetNode;
    /// # fn f(g: &Graph, m: &MemsetNode, buf: &DeviceBuffer<u32>) -> cuda_graph::Result<()> {
    /// g.set_params(m, NodeParams::memset(buf, 5u32)?)?;
    /// # Ok(()) }
    /// ```
    pub fn memset<T: MemsetValue>(buf: &DeviceBuffer<T>, value: T) -> Result<Self> {
        let len = buf.len();
        Self::memset_2d(
            buf,
            value,
            Memset2d {
                width: len,
                height: 1,
                pitch: len,
            },
        )
    }

    /// A 2D memset, as [`GraphDefinition::add_memset_2d`]. (Execs take only 1D memsets: the
    /// driver refuses a 2D one there.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::{MemsetNode, Memset2d};
    /// # fn f(def: &GraphDefinition, m: &MemsetNode, image: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// def.set_params(m, NodeParams::memset_2d(image, 0u8, Memset2d { width: 10, height: 4, pitch: 16 })?)?;
    /// # Ok(()) }
    /// ```
    pub fn memset_2d<T: MemsetValue>(
        buf: &DeviceBuffer<T>,
        value: T,
        shape: Memset2d,
    ) -> Result<Self> {
        let (element_size, value) = memset_value(value)?;
        shape.check(buf.len())?;
        let mut owners = Owners::new();
        owners.push(buf.alloc.clone());
        Ok(Self::new(
            RawParams::Memset {
                dst: buf.device_ptr(),
                pitch: shape.pitch * element_size as usize,
                value,
                element_size,
                width: shape.width,
                height: shape.height,
            },
            owners,
            Some(buf.alloc.ctx.device),
        ))
    }
}

impl NodeParams<node_kind::Memcpy> {
    /// A device-to-device copy of a 2D or 3D `region` of `src` into `dst`, for a
    /// [`MemcpyNode`](crate::MemcpyNode) of a definition: checked against both buffers as
    /// [`Copy3d`](crate::Copy3d) says. (An exec's memcpy node takes only 1D copies, the
    /// driver's rule: [`Refusal::Unsupported`] there.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::{Copy3d, MemcpyNode};
    /// # fn f(def: &GraphDefinition, c: &MemcpyNode, image: &DeviceBuffer<u8>, tile: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// def.set_params(c, NodeParams::memcpy_3d(tile, image, Copy3d::rows(32, 32, 640, 32))?)?;
    /// # Ok(()) }
    /// ```
    pub fn memcpy_3d<T: DeviceCopy>(
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
        region: crate::Copy3d,
    ) -> Result<Self> {
        let raw = region.check(src.len(), dst.len(), std::mem::size_of::<T>())?;
        if dst.alloc.ctx.device != src.alloc.ctx.device {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                "a copy between buffers of two devices",
            ));
        }
        let mut owners = Owners::new();
        owners.push(dst.alloc.clone());
        owners.push(src.alloc.clone());
        Ok(Self::new(
            RawParams::Memcpy {
                dst: dst.device_ptr(),
                src: src.device_ptr(),
                region: raw,
            },
            owners,
            Some(dst.alloc.ctx.device),
        ))
    }

    /// A device-to-device copy of `src` into `dst`, for a [`MemcpyNode`](crate::MemcpyNode). The
    /// lengths must match.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::MemcpyNode;
    /// # fn f(def: &GraphDefinition, c: &MemcpyNode, a: &DeviceBuffer<f32>, b: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// def.set_params(c, NodeParams::memcpy(a, b)?)?; // now a = b
    /// # Ok(()) }
    /// ```
    pub fn memcpy<T: DeviceCopy>(dst: &DeviceBuffer<T>, src: &DeviceBuffer<T>) -> Result<Self> {
        let whole = crate::runtime::check_whole(dst.len(), src.len(), std::mem::size_of::<T>())?;
        if dst.alloc.ctx.device != src.alloc.ctx.device {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                "a copy between buffers of two devices",
            ));
        }
        let mut owners = Owners::new();
        owners.push(dst.alloc.clone());
        owners.push(src.alloc.clone());
        Ok(Self::new(
            RawParams::Memcpy {
                dst: dst.device_ptr(),
                src: src.device_ptr(),
                region: whole,
            },
            owners,
            Some(dst.alloc.ctx.device),
        ))
    }
}

impl NodeParams<node_kind::Host> {
    /// A new host callback `f`, for a [`HostNode`](crate::HostNode), with its observer. As
    /// [`GraphDefinition::add_host_callback`]: `f` must not call CUDA, and a panic in it is
    /// caught.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::HostNode;
    /// # fn f(def: &GraphDefinition, h: &HostNode) -> cuda_graph::Result<()> {
    /// let (p, cb) = NodeParams::host_callback(|| println!("the new callback"));
    /// def.set_params(h, p)?;
    /// # Ok(()) }
    /// ```
    pub fn host_callback<F>(f: F) -> (Self, HostCallback)
    where
        F: FnMut() + Send + 'static,
    {
        let prepared = callback::prepare(f);
        let mut owners = Owners::new();
        owners.push(prepared.keep);
        (
            Self::new(
                RawParams::Host {
                    func: prepared.func,
                    user_data: prepared.user_data as usize,
                },
                owners,
                None,
            ),
            prepared.observer,
        )
    }
}

impl NodeParams<node_kind::ChildGraph> {
    /// A copy of `child` (an ended primary builder or a definition), for a
    /// [`ChildGraphNode`](crate::ChildGraphNode); what `child`'s nodes use now is held with it.
    /// An exec's child-graph node takes only a graph of the same topology as the one it was
    /// instantiated with (the driver refuses others).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::ChildGraphNode;
    /// # fn f(g: &Graph, c: &ChildGraphNode, step: &GraphDefinition) -> cuda_graph::Result<()> {
    /// g.set_params(c, NodeParams::child_graph(step)?)?;
    /// # Ok(()) }
    /// ```
    pub fn child_graph(child: &impl FinishedGraph) -> Result<Self> {
        let child = child.finished_graph()?;
        // What the child's nodes use is added when the parameters are applied, under the
        // child's lock (`lock_with_child`); until then `RawParams::Child` holds the child.
        Ok(Self::new(
            RawParams::Child(child.clone()),
            Owners::new(),
            Some(child.ctx.device),
        ))
    }
}

impl NodeParams<node_kind::EventRecord> {
    /// Record `event` instead, for an [`EventRecordNode`](crate::EventRecordNode).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::EventRecordNode;
    /// # fn f(def: &GraphDefinition, r: &EventRecordNode, e: &Event) -> cuda_graph::Result<()> {
    /// def.set_params(r, NodeParams::event_record(e))?;
    /// # Ok(()) }
    /// ```
    pub fn event_record(event: &Event) -> Self {
        let mut owners = Owners::new();
        owners.push(event.handle.clone());
        Self::new(
            RawParams::EventRecord(event.handle.clone()),
            owners,
            Some(event.handle.ctx.device),
        )
    }
}

impl NodeParams<node_kind::EventWait> {
    /// Wait for `event` instead, for an [`EventWaitNode`](crate::EventWaitNode).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::EventWaitNode;
    /// # fn f(def: &GraphDefinition, w: &EventWaitNode, e: &Event) -> cuda_graph::Result<()> {
    /// def.set_params(w, NodeParams::event_wait(e))?;
    /// # Ok(()) }
    /// ```
    pub fn event_wait(event: &Event) -> Self {
        let mut owners = Owners::new();
        owners.push(event.handle.clone());
        Self::new(
            RawParams::EventWait(event.handle.clone()),
            owners,
            Some(event.handle.ctx.device),
        )
    }
}

/// Refuses parameters of a kernel that has not declared its wait ([`NodeParams::kernel`],
/// not [`NodeParams::dependent_kernel`]) for a kernel node that follows another
/// programmatically: it would begin before that kernel has ended. Asked of the driver only in a
/// tree where a programmatic edge was ever made ([`TreeState::programmatic`]).
///
/// # Safety
/// `node` is a live node of `tree`'s graphs, whose lock is held.
pub(crate) unsafe fn check_programmatic(
    tree: &TreeState,
    raw: &RawParams,
    node: sys::CUgraphNode,
) -> Result<()> {
    let RawParams::Kernel(kernel) = raw else {
        return Ok(());
    };
    if !tree.programmatic || kernel.config.attributes.is_dependent() {
        return Ok(());
    }
    // SAFETY: the caller's promise.
    if unsafe { driver::launch::has_programmatic_dependency(node) }? {
        return Err(Error::invalid(
            Refusal::Attribute,
            "this kernel node follows another programmatically (it may begin before that kernel ends): it takes parameters only of a kernel that waits for it (NodeParams::dependent_kernel)",
        ));
    }
    Ok(())
}

/// Where parameters go: a definition's node, or a node of an exec.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    /// The node of a definition.
    Definition,
    /// The node in this exec.
    Exec(sys::CUgraphExec),
}

impl RawParams {
    /// The child graph these parameters name, if any (its tree must be locked for the call).
    pub(crate) fn child(&self) -> Option<&Arc<GraphHandle>> {
        match self {
            RawParams::Child(c) => Some(c),
            _ => None,
        }
    }

    /// Sets these parameters on `node` in `target` (one driver call).
    ///
    /// # Safety
    /// `node` is a live node of a graph whose tree is locked, of the kind these parameters are
    /// for; for an exec target, the exec is live, its lock held, and `node` one of the nodes it
    /// was instantiated with; what the parameters use is held by the node or exec from before the
    /// call (see `driver::graph`'s update promises); a child graph's tree is locked too; `ctx` is
    /// the graph's context.
    pub(crate) unsafe fn apply(
        &self,
        target: Target,
        node: sys::CUgraphNode,
        ctx: sys::CUcontext,
    ) -> Result<()> {
        let mut taken = false;
        // SAFETY: forwarded from the caller.
        unsafe { self.apply_noting(target, node, ctx, &mut taken) }
    }

    /// [`apply`](Self::apply), setting `taken` once the driver has taken the new parameters:
    /// an error after that (a kernel node's attributes refused) leaves the node using them, so
    /// the caller must keep what they use alive.
    ///
    /// # Safety
    /// As [`apply`](Self::apply).
    pub(crate) unsafe fn apply_noting(
        &self,
        target: Target,
        node: sys::CUgraphNode,
        ctx: sys::CUcontext,
        taken: &mut bool,
    ) -> Result<()> {
        use driver::graph as g;
        match (self, target) {
            (RawParams::Kernel(kernel), _) => {
                let KernelParams {
                    function,
                    config,
                    args,
                } = &**kernel;
                let (mut ptrs, mut spill) = (crate::runtime::launch::NO_POINTERS, Vec::new());
                let params =
                    config.kernel_node_params(function, args.fill_pointers(&mut ptrs, &mut spill));
                // Whether the kernel waits is checked before (`check_programmatic`); the edge
                // itself is not a parameter.
                let given = config.attributes.set_dependent(false);
                let given_raw = driver::launch::RawAttributes {
                    cluster: given.cluster(),
                    priority: given.priority(),
                    cooperative: given.cooperative(),
                    programmatic: false,
                };
                // No attributes given: the node keeps its own (not asked of the driver, so a
                // plain update costs no more than before; a grid its attributes cannot take is
                // the driver's error at instantiation or launch). Attributes given: compared
                // with the node's own, and checked against the new grid.
                let keep = given.is_empty() || {
                    // SAFETY: `node` is a live kernel node of the locked tree (the caller's;
                    // for an exec, of the graph it was instantiated from).
                    let current = unsafe { driver::launch::node_attributes(node) }?;
                    given_raw.same_as(&current)
                };
                let effective = given_raw;
                if !given.is_empty() {
                    let mut checked = *config;
                    checked.attributes = given;
                    crate::runtime::launch::check_attributes(function, &checked)?;
                }
                match target {
                    Target::Definition => {
                        // SAFETY: the caller's promises; `ptrs` points into `args`, which
                        // outlives the call (the driver copies the values); the constructor's
                        // caller promised the arguments match the kernel.
                        unsafe { g::kernel_node_set_params(node, &params) }?;
                        *taken = true;
                        if keep {
                            return Ok(());
                        }
                        // SAFETY: `node` is a live kernel node of the locked tree; the
                        // attributes were checked just now.
                        unsafe { driver::launch::set_node_attributes(node, effective) }
                    }
                    Target::Exec(_) if !keep => Err(Error::invalid(
                        Refusal::Attribute,
                        "an exec's kernel node keeps the launch attributes (cluster, priority, cooperative) it was instantiated with: the driver has no per-node update for them. Pass a configuration without attributes (or with the node's own), or set them on the definition's node and update the exec from it (Graph::update)",
                    )),
                    Target::Exec(e) => {
                        // SAFETY: as above.
                        unsafe { g::exec_kernel_node_set_params(e, node, &params) }?;
                        *taken = true;
                        Ok(())
                    }
                }
            }
            (
                &RawParams::Memset {
                    dst,
                    pitch,
                    value,
                    element_size,
                    width,
                    height,
                },
                _,
            ) => {
                let params = sys::CUDA_MEMSET_NODE_PARAMS {
                    dst,
                    pitch,
                    value,
                    elementSize: element_size,
                    width,
                    height,
                };
                match target {
                    // SAFETY: the caller's promises; the shape lies inside the buffer (checked when
                    // the parameters were made), which the node holds.
                    Target::Definition => unsafe { g::memset_node_set_params(node, &params) },
                    // SAFETY: as above; the exec holds the buffer.
                    Target::Exec(e) => unsafe {
                        g::exec_memset_node_set_params(e, node, &params, ctx)
                    },
                }
            }
            (&RawParams::Memcpy { dst, src, region }, _) => {
                let copy = driver::memory::copy3d(dst, src, &region);
                match target {
                    // SAFETY: the caller's promises; both regions lie in their buffers (checked
                    // when the parameters were made) and the node holds them.
                    Target::Definition => unsafe { g::memcpy_node_set_params(node, &copy) },
                    // The driver updates an exec's memcpy node only between 1D copies
                    // (`cuGraphExecMemcpyNodeSetParams`).
                    Target::Exec(_) if region.height > 1 || region.depth > 1 => Err(Error::invalid(
                        Refusal::Unsupported,
                        "an exec's memcpy node takes only a 1D copy (the driver updates no 2D or 3D copy in an exec): set the region on the definition's node and instantiate again, or update the exec from it (Graph::update)",
                    )),
                    // SAFETY: as above; the exec holds them.
                    Target::Exec(e) => unsafe {
                        g::exec_memcpy_node_set_params(e, node, &copy, ctx)
                    },
                }
            }
            (&RawParams::Host { func, user_data }, _) => {
                let params = sys::CUDA_HOST_NODE_PARAMS {
                    fn_: Some(func),
                    userData: user_data as *mut c_void,
                };
                match target {
                    // SAFETY: the caller's promises; `userData` is the callback's state, which the
                    // node holds; the trampoline never unwinds and never calls CUDA.
                    Target::Definition => unsafe { g::host_node_set_params(node, &params) },
                    // SAFETY: as above; the exec holds it.
                    Target::Exec(e) => unsafe { g::exec_host_node_set_params(e, node, &params) },
                }
            }
            (RawParams::Child(child), Target::Definition) => {
                driver::require(
                    "updating a child-graph node of a definition (cuGraphNodeSetParams)",
                    crate::DriverVersion::V12_2,
                )?;
                // SAFETY: zeroed node parameters are valid plain C data (unused bytes must be
                // zero); the used fields are set below.
                let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
                params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH;
                params.__bindgen_anon_1.graph = compat::child_graph_params(child.raw);
                // SAFETY: the caller's promises; the child graph is live and its tree locked; the
                // driver copies it.
                unsafe { g::node_set_params(node, &mut params) }
            }
            (RawParams::Child(child), Target::Exec(e)) => {
                // SAFETY: the caller's promises; the child graph is live and its tree locked.
                unsafe { g::exec_child_graph_node_set_params(e, node, child.raw) }
            }
            (RawParams::EventRecord(event), Target::Definition) => {
                // SAFETY: the caller's promises; the node holds the event.
                unsafe { g::event_record_node_set_event(node, event.raw) }
            }
            (RawParams::EventRecord(event), Target::Exec(e)) => {
                // SAFETY: the caller's promises; the exec holds the event.
                unsafe { g::exec_event_record_node_set_event(e, node, event.raw) }
            }
            (RawParams::EventWait(event), Target::Definition) => {
                // SAFETY: the caller's promises; the node holds the event.
                unsafe { g::event_wait_node_set_event(node, event.raw) }
            }
            (RawParams::EventWait(event), Target::Exec(e)) => {
                // SAFETY: the caller's promises; the exec holds the event.
                unsafe { g::exec_event_wait_node_set_event(e, node, event.raw) }
            }
        }
    }
}

/// Locks `graph`'s tree, and `child`'s (a child graph the parameters name) if any: refuses a
/// child of the same tree, a child a capture still records into, and adds what the child's nodes
/// use now to `owners`.
pub(crate) fn lock_with_child<'a>(
    graph: &'a GraphHandle,
    child: Option<&'a Arc<GraphHandle>>,
    owners: &mut Owners,
) -> Result<(
    crate::driver::tree_lock::TreeGuard<'a, TreeState>,
    Option<crate::driver::tree_lock::TreeGuard<'a, TreeState>>,
)> {
    let Some(child) = child else {
        return Ok((graph.lock(), None));
    };
    if child.tree_id() == graph.tree_id() {
        return Err(Error::invalid(
            Refusal::Order,
            "a graph cannot be embedded into itself: embed a clone (`try_clone()`)",
        ));
    }
    let (mut tree, mut child_tree) = lock_two(graph, child);
    if let Some(c) = child_tree.as_deref_mut() {
        c.check_complete()?;
        // A copy of programmatic edges is one too (see `TreeState::programmatic`).
        if c.programmatic {
            tree.programmatic = true;
        }
        if c.has_conditionals() {
            // The child graph itself is held only where its conditional handles may be in use
            // (see `TreeState::has_conditionals`).
            owners.push(child.root());
        }
        owners.extend(c.snapshot().into_iter().map(|chunk| chunk as Owner));
    }
    Ok((tree, child_tree))
}

impl GraphDefinition {
    /// Replaces the parameters of `node` with `params` (`cuGraphKernelNodeSetParams`,
    /// `cuGraphMemsetNodeSetParams`, … for its kind; a child-graph node through
    /// `cuGraphNodeSetParams`, driver 12.2). The next instantiation, clone, embedding or
    /// [`Graph::update`](crate::Graph::update) from this graph uses the new parameters; execs
    /// made before keep what they were instantiated with.
    ///
    /// The node holds what the new parameters use from now on; what the old ones used is released
    /// (unless an exec, clone or embedding made before still holds it). A refusal — a node of
    /// another graph ([`Error::ForeignNode`]) or destroyed ([`Error::DestroyedNode`]), parameters
    /// of another device, a driver error — changes nothing.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, affine: &Function, value: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let def = GraphDefinition::new(device)?;
    /// // SAFETY: affine takes (int*, int, int).
    /// let k = unsafe { def.add_kernel_unchecked(&[], affine, LaunchConfig::single(), &KernelArgs::new().arg(value).arg(1i32).arg(1i32))? };
    /// let before = def.instantiate()?; // adds 1
    /// // SAFETY: as above.
    /// def.set_params(&k, unsafe { NodeParams::kernel_unchecked(affine, LaunchConfig::single(), KernelArgs::new().arg(value).arg(1i32).arg(2i32)) })?;
    /// let after = def.instantiate()?; // adds 2
    /// # Ok(()) }
    /// ```
    pub fn set_params<K: NodeKind>(
        &self,
        node: &TypedNode<K>,
        params: NodeParams<K>,
    ) -> Result<()> {
        let graph = self.handle();
        params.check_device(graph.ctx.device)?;
        params.check_handles(graph)?;
        // Asked of the driver: a kernel node's parameters with no context current crash it (see
        // `add_kernel_params`).
        graph.ctx.bind_checked()?;
        let NodeParams {
            raw, mut owners, ..
        } = params;
        let (mut tree, child_tree) = lock_with_child(graph, raw.child(), &mut owners)?;
        super::check_usable(graph, &tree)?;
        let raw_node = node::check(&tree, graph.id, node)?;
        // SAFETY: `raw_node` is a live node of this locked tree.
        unsafe { check_programmatic(&tree, &raw, raw_node) }?;
        // The new owners are in place before the driver refers to them.
        let old = tree
            .nodes
            .replace_owners(graph.id, node.raw, node.serial, owners)
            .ok_or(Error::DestroyedNode)?;
        // SAFETY: `raw_node` is a live node of this graph (checked under the tree lock), of kind
        // `K` (a `TypedNode<K>` is only made for nodes of that kind), and `raw` was made for kind
        // `K`; the node holds what the parameters use; the child's tree, if any, is locked; the
        // context is the graph's.
        let is_child = raw.child().is_some();
        let mut taken = false;
        let r =
            unsafe { raw.apply_noting(Target::Definition, raw_node, graph.ctx.raw, &mut taken) };
        let released = match r {
            Ok(()) if is_child => {
                // The driver replaced the child graph's contents: the nodes a view of it showed
                // (and anything nested in them) are gone. Views made before are refused; the
                // next `node_info` makes a fresh one.
                let mut released: Owners = old;
                if let Some(view) = tree.embedded.remove(&(graph.id, node.raw)) {
                    released.extend(node::forget_graphs(&mut tree, vec![view]));
                }
                released
            }
            Ok(()) => old,
            // The driver took the new parameters, then refused the rest (a kernel node's
            // attributes): the node uses what the new ones use, so it keeps those and the old.
            Err(_) if taken => {
                let mut both = old;
                if let Some(new) =
                    tree.nodes
                        .replace_owners(graph.id, node.raw, node.serial, Owners::new())
                {
                    both.extend(new);
                }
                tree.nodes
                    .replace_owners(graph.id, node.raw, node.serial, both)
                    .unwrap_or_default()
            }
            // Refused: the node holds what it held before; the new owners go.
            Err(_) => tree
                .nodes
                .replace_owners(graph.id, node.raw, node.serial, old)
                .unwrap_or_default(),
        };
        drop((tree, child_tree));
        drop(released);
        drop(raw);
        r
    }
}

static_assertions::assert_impl_all!(NodeParams<node_kind::Kernel>: Send, Sync, std::fmt::Debug);
static_assertions::assert_impl_all!(NodeParams<node_kind::Host>: Send, Sync, std::fmt::Debug);
static_assertions::assert_impl_all!(NodeParams<node_kind::ChildGraph>: Send, Sync, std::fmt::Debug);
