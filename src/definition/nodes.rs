//! The `add_*` methods: one per node type, each after `deps`.

use cudarc::driver::sys;
use std::sync::Arc;

use super::memset::{memset_value, Memset2d, MemsetValue};
use super::node::{self, GraphNode, NodeType};
use super::typed::{
    ChildGraphNode, EmptyNode, EventRecordNode, EventWaitNode, HostNode, KernelNode, MemcpyNode,
    MemsetNode, TypedNode,
};
use super::GraphDefinition;
use crate::core::callback;
use crate::core::source::FinishedGraph;
use crate::driver;
use crate::driver::graph::{lock_two, GraphHandle, Owner, Owners, SharedRef, TreeState};
use crate::driver::launch::RawAttributes;
use crate::error::{Error, Refusal, Result};
use crate::runtime::{DeviceBuffer, DeviceCopy, Event, Function, KernelArgs, LaunchConfig};
use crate::HostCallback;

/// The refusal of a value on another device than the graph.
#[cold]
#[inline(never)]
fn other_device(what: &str) -> Error {
    Error::invalid(
        Refusal::OtherDevice,
        format!("the {what} lives on another device than the graph"),
    )
}

/// Drops the owners a forgotten node held, once the tree is unlocked.
#[inline(never)]
fn drop_owners(released: Vec<Owner>) {
    drop(released);
}

impl GraphDefinition {
    /// Adds one node after `deps`: under the tree lock, checks the dependencies (and that the
    /// nodes in `live` are live nodes of this graph), moves `keep` into the graph, then runs
    /// `add(graph, deps, count, out)`.
    fn add_node_with(
        &self,
        deps: &[&GraphNode],
        live: &[&GraphNode],
        owners: impl FnOnce(&mut Owners),
        add: impl FnOnce(
            sys::CUgraph,
            *const sys::CUgraphNode,
            usize,
            &mut sys::CUgraphNode,
        ) -> Result<()>,
    ) -> Result<GraphNode> {
        self.add_node_then(deps, live, &[], owners, add, |_, _| {})
    }

    /// [`add_node_with`](Self::add_node_with), then `then` on the tree and the new node, under
    /// the same lock (bookkeeping that another thread's instantiation must see with the node).
    /// `shared` names values the node uses that the tree may hold once for many nodes (a
    /// kernel's module and its one buffer, see [`SharedRef`]).
    #[inline(always)]
    pub(super) fn add_node_then(
        &self,
        deps: &[&GraphNode],
        live: &[&GraphNode],
        shared: &[SharedRef<'_>],
        owners: impl FnOnce(&mut Owners),
        add: impl FnOnce(
            sys::CUgraph,
            *const sys::CUgraphNode,
            usize,
            &mut sys::CUgraphNode,
        ) -> Result<()>,
        then: impl FnOnce(&mut TreeState, &GraphNode),
    ) -> Result<GraphNode> {
        self.add_node_then_checked(deps, live, shared, owners, |_, _, _| Ok(()), add, then)
    }

    /// [`add_node_then`](Self::add_node_then), with `check` run on the tree and the checked
    /// dependencies (`n` raw nodes) under the same lock before anything is registered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_node_then_checked(
        &self,
        deps: &[&GraphNode],
        live: &[&GraphNode],
        shared: &[SharedRef<'_>],
        owners: impl FnOnce(&mut Owners),
        check: impl FnOnce(&TreeState, *const sys::CUgraphNode, usize) -> Result<()>,
        add: impl FnOnce(
            sys::CUgraph,
            *const sys::CUgraphNode,
            usize,
            &mut sys::CUgraphNode,
        ) -> Result<()>,
        then: impl FnOnce(&mut TreeState, &GraphNode),
    ) -> Result<GraphNode> {
        let mut held = Owners::new();
        owners(&mut held);
        let mut released = Vec::new();
        let mut locked = self.lock()?;
        let graph = self.handle();
        let (mut room, mut spill) = (node::DEP_ROOM, Vec::new());
        let (raw_deps, n) = node::check_deps(&locked.tree, graph.id, deps, &mut room, &mut spill)?;
        if !live.is_empty() {
            node::check_each(&locked.tree, graph.id, live)?;
        }
        check(&locked.tree, raw_deps, n)?;
        // Everything but the node's address is registered before the driver call (see
        // `NodeTable::reserve`).
        let reserved = node::reserve(&mut locked.tree, graph.id, shared, held);
        let mut out = std::ptr::null_mut();
        if let Err(e) = add(graph.raw, raw_deps, n, &mut out) {
            let unused = locked.tree.nodes.cancel(reserved);
            drop(locked);
            drop(unused);
            return Err(e);
        }
        let node = node::commit(&mut locked.tree, graph.id, reserved, out, &mut released);
        then(&mut locked.tree, &node);
        drop(locked);
        if released.capacity() == 0 {
            // Nothing was ever pushed: there is nothing to free (the usual case, and an empty
            // `Vec`'s drop glue is a call on this path).
            std::mem::forget(released);
        } else {
            drop_owners(released);
        }
        Ok(node)
    }

    #[inline]
    fn same_device(&self, device: sys::CUdevice, what: &str) -> Result<()> {
        if device != self.handle().ctx.device {
            return Err(other_device(what));
        }
        Ok(())
    }

    /// Adds a launch node of a typed `kernel` with `args`, one per parameter of its signature,
    /// checked at compile time (`cuGraphAddKernelNode`). The kernel's module and every buffer
    /// given stay alive with the graph and its execs.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, add_one: &Kernel<(*mut i32,)>, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let first = def.add_kernel(&[], add_one, LaunchConfig::single(), buf)?;
    /// let second = def.add_kernel(&[&first], add_one, LaunchConfig::single(), buf)?;
    /// # Ok(()) }
    /// ```
    pub fn add_kernel<S: crate::Signature>(
        &self,
        deps: &[&GraphNode],
        kernel: &crate::Kernel<S>,
        config: LaunchConfig,
        args: impl crate::ArgsFor<S>,
    ) -> Result<KernelNode> {
        let function = kernel.function();
        self.same_device(function.device, "kernel's module")?;
        if !config.attributes.is_empty() {
            return self.add_kernel_attributed(deps, kernel, config, args);
        }
        let attrs: Option<RawAttributes> = None;
        crate::runtime::with_refs(&args, self.handle().ctx.device, |refs| {
            refs.check_device("graph")?;
            refs.check_target(Some(self.handle()))?;
            let params = config.kernel_node_params(function, refs.params());
            if refs.uses_graph_memory() {
                return self.add_kernel_with_graph_memory(
                    deps,
                    function,
                    &params,
                    attrs.as_ref(),
                    refs,
                );
            }
            if let [one] = refs.owners.as_slice() {
                let extra = one.shared();
                // SAFETY: as below.
                return unsafe {
                    self.add_kernel_params(
                        deps,
                        function,
                        &params,
                        attrs.as_ref(),
                        Some(extra),
                        |_| {},
                    )
                };
            }
            let keep = |owners: &mut Owners| {
                owners.reserve_exact(refs.owners.len());
                for o in &refs.owners {
                    owners.push(o.owner());
                }
            };
            // SAFETY: `params` points at argument bytes that outlive the call; `Kernel`'s maker
            // promised its signature and bounds, and the arguments match it (`ArgsFor`).
            unsafe { self.add_kernel_params(deps, function, &params, attrs.as_ref(), None, keep) }
        })
    }

    /// [`add_kernel`](Self::add_kernel) with launch attributes: off the plain node's path. Its
    /// body repeats `add_kernel`'s on purpose: a shared `#[inline(always)]` body taking the
    /// attributes as an argument put the typed explicit node over its instruction ceiling
    /// (`scripts/check-instructions.sh`, `explicit-typed`).
    #[cold]
    #[inline(never)]
    fn add_kernel_attributed<S: crate::Signature>(
        &self,
        deps: &[&GraphNode],
        kernel: &crate::Kernel<S>,
        config: LaunchConfig,
        args: impl crate::ArgsFor<S>,
    ) -> Result<KernelNode> {
        let function = kernel.function();
        let attrs = attributes_of(function, &config)?;
        crate::runtime::with_refs(&args, self.handle().ctx.device, |refs| {
            refs.check_device("graph")?;
            refs.check_target(Some(self.handle()))?;
            let params = config.kernel_node_params(function, refs.params());
            if refs.uses_graph_memory() {
                return self.add_kernel_with_graph_memory(
                    deps,
                    function,
                    &params,
                    attrs.as_ref(),
                    refs,
                );
            }
            if let [one] = refs.owners.as_slice() {
                let extra = one.shared();
                // SAFETY: as below.
                return unsafe {
                    self.add_kernel_params(
                        deps,
                        function,
                        &params,
                        attrs.as_ref(),
                        Some(extra),
                        |_| {},
                    )
                };
            }
            let keep = |owners: &mut Owners| {
                owners.reserve_exact(refs.owners.len());
                for o in &refs.owners {
                    owners.push(o.owner());
                }
            };
            // SAFETY: `params` points at argument bytes that outlive the call; `Kernel`'s maker
            // promised its signature and bounds, and the arguments match it (`ArgsFor`).
            unsafe { self.add_kernel_params(deps, function, &params, attrs.as_ref(), None, keep) }
        })
    }

    /// Adds a kernel node of a [`DependentKernel`](crate::DependentKernel) whose edges from
    /// `deps` are programmatic (`CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC`): at each launch it may
    /// begin before those kernels have ended, and waits for them where its code says. Every
    /// dependency must be a kernel node ([`Refusal::Attribute`] otherwise); needs compute
    /// capability 9.0. [`inspect`](Self::inspect) reads the node back with
    /// [`KernelInfo::dependent`](crate::KernelInfo::dependent) set.
    ///
    /// The programmatic edges stay as long as both nodes do: destroying a kernel node that a
    /// dependent kernel follows programmatically is refused, and a kernel node that follows one
    /// takes new parameters ([`set_params`](Self::set_params), and an exec's) only of a dependent
    /// kernel ([`NodeParams::dependent_kernel`](crate::NodeParams::dependent_kernel)).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(def: &GraphDefinition, first: &Kernel<(*mut f32,)>, then: &DependentKernel<(*mut f32,)>, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// let a = def.add_kernel(&[], first, LaunchConfig::for_num_elems(1024), buf)?;
    /// let b = def.add_dependent_kernel(&[&a], then, LaunchConfig::for_num_elems(1024), buf)?;
    /// # Ok(()) }
    /// ```
    pub fn add_dependent_kernel<K: crate::WaitsForPredecessor>(
        &self,
        deps: &[&GraphNode],
        kernel: &K,
        config: LaunchConfig,
        args: impl crate::ArgsFor<K::Sig>,
    ) -> Result<KernelNode> {
        let mut config = config;
        config.attributes = config.attributes.set_dependent(true);
        self.add_kernel(deps, kernel.waiting_kernel(), config, args)
    }

    /// Adds a kernel launch node of an untyped `function` (`cuGraphAddKernelNode`): the raw form
    /// of [`add_kernel`](Self::add_kernel), which also takes a [`GraphAllocation`](crate::GraphAllocation) argument. The
    /// function's module and every buffer in `args` stay alive with the graph and its execs.
    ///
    /// # Safety
    /// As [`Stream::launch_unchecked`](crate::Stream::launch_unchecked): `args` must match the kernel's parameters in
    /// number, order and type, and the kernel must stay in bounds of the memory it is given —
    /// for a [`GraphAllocation`](crate::GraphAllocation), only while the graph orders it between the allocation and its
    /// free.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, add_one: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// // SAFETY: add_one takes one int*.
    /// let k = unsafe { def.add_kernel_unchecked(&[], add_one, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    /// # Ok(()) }
    /// ```
    pub unsafe fn add_kernel_unchecked(
        &self,
        deps: &[&GraphNode],
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<KernelNode> {
        self.same_device(function.device, "kernel's module")?;
        if !config.attributes.is_empty() {
            // SAFETY: forwarded from the caller.
            return unsafe { self.add_kernel_unchecked_with(deps, function, config, args) };
        }
        let (mut ptrs, mut spill) = (crate::runtime::launch::NO_POINTERS, Vec::new());
        let params = config.kernel_node_params(function, args.fill_pointers(&mut ptrs, &mut spill));
        if let Some(one) = args.only_owner() {
            let extra = one.shared();
            // SAFETY: as below.
            return unsafe {
                self.add_kernel_params(deps, function, &params, None, Some(extra), |_| {})
            };
        }
        let keep = |owners: &mut Owners| {
            let held = args.owners();
            owners.reserve_exact(held.clone().count());
            for o in held {
                owners.push(o.owner());
            }
        };
        // SAFETY: `params` points at argument storage that outlives the call; the caller
        // promises the arguments match the kernel.
        unsafe { self.add_kernel_params(deps, function, &params, None, None, keep) }
    }

    /// [`add_kernel_unchecked`](Self::add_kernel_unchecked) with launch attributes: off the
    /// plain node's path.
    ///
    /// # Safety
    /// As [`add_kernel_unchecked`](Self::add_kernel_unchecked).
    #[cold]
    #[inline(never)]
    unsafe fn add_kernel_unchecked_with(
        &self,
        deps: &[&GraphNode],
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<KernelNode> {
        let attrs = attributes_of(function, &config)?;
        let (mut ptrs, mut spill) = (crate::runtime::launch::NO_POINTERS, Vec::new());
        let params = config.kernel_node_params(function, args.fill_pointers(&mut ptrs, &mut spill));
        let keep = |owners: &mut Owners| {
            let held = args.owners();
            owners.reserve_exact(held.clone().count());
            for o in held {
                owners.push(o.owner());
            }
        };
        // SAFETY: `params` points at argument storage that outlives the call; the caller
        // promises the arguments match the kernel; the attributes were checked above.
        unsafe { self.add_kernel_params(deps, function, &params, attrs.as_ref(), None, keep) }
    }

    /// The kernel node both launch forms add: `params` for `function`, the function's module
    /// and `extra` (a node's one argument owner) held through the tree's shared entries (see
    /// [`SharedRef`]), and `keep`'s owners by the node.
    ///
    /// # Safety
    /// `params` is `function`'s launch with argument pointers valid during the call, and the
    /// arguments match the kernel's parameters and keep it within the memory it is given.
    unsafe fn add_kernel_params(
        &self,
        deps: &[&GraphNode],
        function: &Function,
        params: &sys::CUDA_KERNEL_NODE_PARAMS,
        attrs: Option<&RawAttributes>,
        extra: Option<SharedRef<'_>>,
        keep: impl FnOnce(&mut Owners),
    ) -> Result<KernelNode> {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.add_kernel_params_checked(
                deps,
                function,
                params,
                attrs,
                extra,
                keep,
                |_, _, _| Ok(()),
                |_, _| {},
            )
        }
    }

    /// [`add_kernel`](Self::add_kernel) of arguments that include [`GraphBuffer`]s
    /// (crate::GraphBuffer): the dependencies must reach each allocation node, and the node is
    /// recorded as a user of each allocation (for the check of its free node).
    #[cold]
    #[inline(never)]
    fn add_kernel_with_graph_memory(
        &self,
        deps: &[&GraphNode],
        function: &Function,
        params: &sys::CUDA_KERNEL_NODE_PARAMS,
        attrs: Option<&RawAttributes>,
        refs: &crate::runtime::ArgRefs<'_>,
    ) -> Result<KernelNode> {
        let uses = refs.graph_uses();
        let graph = self.handle().id;
        let keep = |owners: &mut Owners| {
            owners.reserve_exact(refs.owners.len());
            for o in &refs.owners {
                owners.push(o.owner());
            }
        };
        // SAFETY: `params` points at argument bytes that outlive the call; `Kernel`'s maker
        // promised its signature and bounds, and the arguments match it (`ArgsFor`); the graph
        // memory among them is checked to exist when the node runs (after its allocation node
        // here, before its free node when that is added).
        unsafe {
            self.add_kernel_params_checked(
                deps,
                function,
                params,
                attrs,
                None,
                keep,
                |_, d, n| {
                    // SAFETY: `d` holds `n` checked live nodes of this locked graph.
                    let d = if n == 0 {
                        &[][..]
                    } else {
                        std::slice::from_raw_parts(d, n)
                    };
                    crate::driver::graph::ledger::check_after_allocations(graph, d, uses)
                },
                |tree, node| crate::driver::graph::ledger::note_users(tree, node.raw, uses),
            )
        }
    }

    /// [`add_kernel_params`](Self::add_kernel_params) with `check` and `then` as in
    /// [`add_node_then_checked`](Self::add_node_then_checked).
    ///
    /// # Safety
    /// As [`add_kernel_params`](Self::add_kernel_params).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn add_kernel_params_checked(
        &self,
        deps: &[&GraphNode],
        function: &Function,
        params: &sys::CUDA_KERNEL_NODE_PARAMS,
        attrs: Option<&RawAttributes>,
        extra: Option<SharedRef<'_>>,
        keep: impl FnOnce(&mut Owners),
        check: impl FnOnce(&TreeState, *const sys::CUgraphNode, usize) -> Result<()>,
        then: impl FnOnce(&mut TreeState, &GraphNode),
    ) -> Result<KernelNode> {
        let module = SharedRef::new(&function.module);
        let both;
        let shared: &[SharedRef<'_>] = match extra {
            Some(extra) => {
                both = [module, extra];
                &both
            }
            None => std::slice::from_ref(&module),
        };
        let ctx = &*self.handle().ctx;
        // Asked of the driver, not taken from this thread's record of what the crate bound: the
        // driver crashes adding a kernel node with no context current (driver 13.0, with the
        // node's own context in its parameters too), and other code (a library that destroyed
        // or popped its context) can leave none current behind the crate's back. Other nodes,
        // and launches and captures on a stream of its own, do not need it (see
        // `PrimaryContext::bind_cached`).
        ctx.bind_checked()?;
        if let Some(attrs) = attrs {
            // SAFETY: forwarded from the caller.
            return unsafe {
                self.add_kernel_params_with(deps, params, attrs, shared, keep, check, then)
            };
        }
        self.add_node_then_checked(
            deps,
            &[],
            shared,
            keep,
            check,
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes of it; `params` is
                // valid and its arguments match the kernel (this function's contract; the driver
                // copies the argument bytes).
                unsafe { driver::graph::add_kernel_node(ctx, out, g, d, n, params) }
            },
            then,
        )
        .map(TypedNode::new)
    }

    /// [`add_kernel_params_checked`](Self::add_kernel_params_checked) of a node with launch
    /// attributes (or programmatic edges): off the plain node's path.
    ///
    /// # Safety
    /// As [`add_kernel_params_checked`](Self::add_kernel_params_checked), with `attrs` checked
    /// against the device (`attributes_of`) and the context bound (`bind_checked`).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn add_kernel_params_with(
        &self,
        deps: &[&GraphNode],
        params: &sys::CUDA_KERNEL_NODE_PARAMS,
        attrs: &RawAttributes,
        shared: &[SharedRef<'_>],
        keep: impl FnOnce(&mut Owners),
        check: impl FnOnce(&TreeState, *const sys::CUgraphNode, usize) -> Result<()>,
        then: impl FnOnce(&mut TreeState, &GraphNode),
    ) -> Result<KernelNode> {
        let ctx = &*self.handle().ctx;
        let mut kept_without = None;
        let node = self.add_node_then_checked(
            deps,
            &[],
            shared,
            keep,
            check,
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes of it; `params` is
                // valid and its arguments match the kernel (the caller's contract); the
                // attributes were checked (`attributes_of`).
                kept_without = unsafe {
                    driver::launch::add_kernel_node_with(ctx, out, g, d, n, params, *attrs)
                }?;
                Ok(())
            },
            |tree, node| {
                if attrs.programmatic {
                    tree.programmatic = true;
                }
                then(tree, node)
            },
        )?;
        match kept_without {
            None => Ok(TypedNode::new(node)),
            Some(e) => Err(e),
        }
    }

    /// Adds a memset node that sets every element of `buf` to `value` (`cuGraphAddMemsetNode`).
    ///
    /// Elements of 1, 2 or 4 bytes; an 8-byte element type is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, buf: &DeviceBuffer<u16>) -> cuda_graph::Result<()> {
    /// let clear = def.add_memset(&[], buf, 0xffffu16)?;
    /// # Ok(()) }
    /// ```
    pub fn add_memset<T: MemsetValue>(
        &self,
        deps: &[&GraphNode],
        buf: &DeviceBuffer<T>,
        value: T,
    ) -> Result<MemsetNode> {
        let len = buf.len();
        self.add_memset_2d(
            deps,
            buf,
            value,
            Memset2d {
                width: len,
                height: 1,
                pitch: len,
            },
        )
    }

    /// Adds a 2D memset node: `shape.height` rows of `shape.width` elements, `shape.pitch`
    /// elements apart, all counted in elements of `T`. A shape that does not fit in `buf` is an
    /// [`Error::InvalidArgument`], as is an 8-byte element type.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::Memset2d;
    /// # fn f(def: &GraphDefinition, image: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// // `image` is 480 rows of 640 bytes: clear a 100 x 50 rectangle at its top left.
    /// def.add_memset_2d(&[], image, 0u8, Memset2d { width: 100, height: 50, pitch: 640 })?;
    /// # Ok(()) }
    /// ```
    pub fn add_memset_2d<T: MemsetValue>(
        &self,
        deps: &[&GraphNode],
        buf: &DeviceBuffer<T>,
        value: T,
        shape: Memset2d,
    ) -> Result<MemsetNode> {
        let (element_size, value) = memset_value(value)?;
        shape.check(buf.len())?;
        self.same_device(buf.alloc.ctx.device, "buffer")?;
        let params = sys::CUDA_MEMSET_NODE_PARAMS {
            dst: buf.device_ptr(),
            pitch: shape.pitch * element_size as usize,
            value,
            elementSize: element_size,
            width: shape.width,
            height: shape.height,
        };
        let ctx = self.handle().ctx.raw;
        self.add_node_with(
            deps,
            &[],
            |owners: &mut Owners| owners.push(buf.alloc.clone()),
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes; the shape lies inside
                // the buffer (checked), which the graph keeps alive.
                unsafe { driver::graph::add_memset_node(out, g, d, n, &params, ctx) }
            },
        )
        .map(TypedNode::new)
    }

    /// Adds a device-to-device copy of `src` into `dst` (`cuGraphAddMemcpyNode`). The lengths
    /// must match.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, a: &DeviceBuffer<f32>, b: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// let copy = def.add_memcpy(&[], b, a)?; // b = a
    /// # Ok(()) }
    /// ```
    pub fn add_memcpy<T: DeviceCopy>(
        &self,
        deps: &[&GraphNode],
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
    ) -> Result<MemcpyNode> {
        let whole = crate::runtime::check_whole(dst.len(), src.len(), std::mem::size_of::<T>())?;
        self.same_device(dst.alloc.ctx.device, "destination buffer")?;
        self.same_device(src.alloc.ctx.device, "source buffer")?;
        let copy = driver::memory::copy3d(dst.device_ptr(), src.device_ptr(), &whole);
        let keep = |owners: &mut Owners| {
            owners.push(dst.alloc.clone());
            owners.push(src.alloc.clone());
        };
        let ctx = self.handle().ctx.raw;
        self.add_node_with(deps, &[], keep, |g, d, n, out| {
            // SAFETY: `g` is live and locked, `d` holds `n` checked nodes; both buffers hold
            // `WidthInBytes` bytes and the graph keeps them alive.
            unsafe { driver::graph::add_memcpy_node(out, g, d, n, &copy, ctx) }
        })
        .map(TypedNode::new)
    }

    /// Adds a memcpy node that copies a 2D or 3D `region` of `src` into `dst`
    /// (`cuGraphAddMemcpyNode`): rows of a pitched array, or planes of them, checked against both
    /// buffers as [`Copy3d`](crate::Copy3d) says ([`Refusal::Size`] otherwise). The graph keeps
    /// both buffers alive.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::Copy3d;
    /// # fn f(def: &GraphDefinition, image: &DeviceBuffer<f32>, tile: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// // A 16 x 16 tile out of a 1024-wide image (tile.len() >= 256).
    /// def.add_memcpy_3d(&[], tile, image, Copy3d::rows(16, 16, 1024, 16))?;
    /// # Ok(()) }
    /// ```
    pub fn add_memcpy_3d<T: DeviceCopy>(
        &self,
        deps: &[&GraphNode],
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
        region: crate::Copy3d,
    ) -> Result<MemcpyNode> {
        let raw = region.check(src.len(), dst.len(), std::mem::size_of::<T>())?;
        self.same_device(dst.alloc.ctx.device, "destination buffer")?;
        self.same_device(src.alloc.ctx.device, "source buffer")?;
        let copy = driver::memory::copy3d(dst.device_ptr(), src.device_ptr(), &raw);
        let keep = |owners: &mut Owners| {
            owners.push(dst.alloc.clone());
            owners.push(src.alloc.clone());
        };
        let ctx = self.handle().ctx.raw;
        self.add_node_with(deps, &[], keep, |g, d, n, out| {
            // SAFETY: `g` is live and locked, `d` holds `n` checked nodes; both regions lie in
            // their buffers (checked above) and the graph keeps them alive.
            unsafe { driver::graph::add_memcpy_node(out, g, d, n, &copy, ctx) }
        })
        .map(TypedNode::new)
    }

    /// Adds an empty node (`cuGraphAddEmptyNode`): it does nothing but order `deps` before the
    /// nodes that depend on it.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let start = def.add_empty(&[])?;
    /// # Ok(()) }
    /// ```
    pub fn add_empty(&self, deps: &[&GraphNode]) -> Result<EmptyNode> {
        self.add_node_with(
            deps,
            &[],
            |_| {},
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes of it.
                unsafe { driver::graph::add_empty_node(out, g, d, n) }
            },
        )
        .map(TypedNode::new)
    }

    /// Adds an empty node after all of `nodes`: a fan-in point for what comes next.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, a: &GraphNode, b: &GraphNode) -> cuda_graph::Result<()> {
    /// let both = def.join(&[a, b])?;
    /// # Ok(()) }
    /// ```
    pub fn join(&self, nodes: &[&GraphNode]) -> Result<EmptyNode> {
        self.add_empty(nodes)
    }

    /// Adds a node that records `event` (`cuGraphAddEventRecordNode`); the event stays alive with
    /// the graph.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, event: &Event, k: &GraphNode) -> cuda_graph::Result<()> {
    /// def.add_event_record(&[k], event)?; // others can `stream.wait(event)` for `k`
    /// # Ok(()) }
    /// ```
    pub fn add_event_record(&self, deps: &[&GraphNode], event: &Event) -> Result<EventRecordNode> {
        self.same_device(event.handle.ctx.device, "event")?;
        let raw = event.handle.raw;
        self.add_node_with(
            deps,
            &[],
            |owners: &mut Owners| owners.push(event.handle.clone()),
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes; the graph keeps the
                // event alive.
                unsafe { driver::graph::add_event_record_node(out, g, d, n, raw) }
            },
        )
        .map(TypedNode::new)
    }

    /// Adds a node that waits for `event` (`cuGraphAddEventWaitNode`): the nodes after it run
    /// once the work recorded before the event's latest record has finished.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, event: &Event) -> cuda_graph::Result<()> {
    /// let ready = def.add_event_wait(&[], event)?;
    /// # Ok(()) }
    /// ```
    pub fn add_event_wait(&self, deps: &[&GraphNode], event: &Event) -> Result<EventWaitNode> {
        self.same_device(event.handle.ctx.device, "event")?;
        let raw = event.handle.raw;
        self.add_node_with(
            deps,
            &[],
            |owners: &mut Owners| owners.push(event.handle.clone()),
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes; the graph keeps the
                // event alive.
                unsafe { driver::graph::add_event_wait_node(out, g, d, n, raw) }
            },
        )
        .map(TypedNode::new)
    }

    /// Adds a host node that runs `f` on a driver thread once per launch (`cuGraphAddHostNode`),
    /// and returns it with an observer of the closure.
    ///
    /// As with [`GraphBuilder::add_host_callback`](crate::GraphBuilder::add_host_callback): `f` is kept alive with
    /// the graph and its execs, must not call CUDA, and a panic in it is caught (the closure is
    /// then not called again; [`HostCallback::panic_message`] reports it). Conditional bodies
    /// cannot hold host nodes: the driver refuses them there.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let (_node, cb) = def.add_host_callback(&[], || println!("reached"))?;
    /// # Ok(()) }
    /// ```
    pub fn add_host_callback<F>(
        &self,
        deps: &[&GraphNode],
        f: F,
    ) -> Result<(HostNode, HostCallback)>
    where
        F: FnMut() + Send + 'static,
    {
        let prepared = callback::prepare(f);
        let params = sys::CUDA_HOST_NODE_PARAMS {
            fn_: Some(prepared.func),
            userData: prepared.user_data,
        };
        let keep = prepared.keep.clone();
        let node = self.add_node_with(
            deps,
            &[],
            |owners| owners.push(keep),
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes; `userData` stays valid
                // while the graph holds the closure (moved in just before); the function never
                // unwinds and never calls CUDA.
                unsafe { driver::graph::add_host_node(out, g, d, n, &params) }
            },
        )?;
        Ok((TypedNode::new(node), prepared.observer))
    }

    /// Adds a child-graph node that runs a copy of `child` (`cuGraphAddChildGraphNode`): an ended
    /// primary builder or another definition. Later changes to `child` do not affect this graph;
    /// what `child`'s nodes use stays alive with this graph.
    ///
    /// A graph cannot be embedded into itself (or into one of its conditional bodies).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, step: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let first = def.add_child_graph(&[], step)?;
    /// let second = def.add_child_graph(&[&first], step)?;
    /// # Ok(()) }
    /// ```
    pub fn add_child_graph(
        &self,
        deps: &[&GraphNode],
        child: &impl FinishedGraph,
    ) -> Result<ChildGraphNode> {
        let child = child.finished_graph()?;
        let graph = self.handle();
        self.same_device(child.ctx.device, "child graph")?;
        if child.tree_id() == graph.tree_id() {
            return Err(Error::invalid(
                Refusal::Order,
                "a graph cannot be embedded into itself: embed a clone (`try_clone()`)",
            ));
        }
        graph.ctx.bind()?;
        let (mut tree, mut child_tree) = lock_two(graph, child);
        super::check_usable(graph, &tree)?;
        // A copy of programmatic edges is one too (see `TreeState::programmatic`).
        if child_tree.as_deref().is_some_and(|c| c.programmatic) {
            tree.programmatic = true;
        }
        // The copy keeps using what `child`'s nodes use now, after `child`'s nodes change or go.
        // What a node of `child` itself holds is held by that node's copy (so destroying the copy
        // through the node's `inspect` view releases it); the rest (captured operands, nodes of
        // nested graphs, copies the driver cannot name) by the child-graph node. `child` itself
        // is held only where its conditional handles may be in use (see
        // `TreeState::has_conditionals`).
        let mut embedded = Embedded::default();
        if let Some(c) = child_tree.as_deref_mut() {
            c.check_complete()?;
            embedded = Embedded::of(c, child);
        }
        let Embedded {
            mut owners,
            per_node,
            nested,
        } = embedded;
        let (mut room, mut spill) = (node::DEP_ROOM, Vec::new());
        let (raw_deps, n) = node::check_deps(&tree, graph.id, deps, &mut room, &mut spill)?;
        let mut out = std::ptr::null_mut();
        // SAFETY: both graphs are live and their trees locked; `raw_deps` holds `n` checked nodes of
        // `graph`; the driver copies `child`.
        unsafe {
            driver::graph::add_child_graph_node(&mut out, graph.raw, raw_deps, n, child.raw)
        }?;
        if !per_node.is_empty() {
            owners.extend(hold_in_copies(
                &mut tree, graph.id, out, child.id, &nested, per_node,
            ));
        }
        let mut released = Vec::new();
        let node = node::fresh(&mut tree, graph.id, out, &[], owners, &mut released);
        drop((tree, child_tree));
        drop(released);
        Ok(TypedNode::new(node))
    }
}

/// What a graph embedded by a child-graph node holds, read from its tree before the copy is
/// made: what the child-graph node itself holds (`owners`: the tree-wide chunks, and the child's
/// root where its conditional handles may be in use), and per node of the child what that node
/// uses (`per_node`), with the child's own embedded graphs (`nested`), for [`hold_in_copies`].
#[derive(Default)]
pub(crate) struct Embedded {
    pub(crate) owners: Owners,
    pub(crate) per_node: Vec<(u64, sys::CUgraphNode, Owners)>,
    pub(crate) nested: Vec<((u64, usize), u64)>,
}

impl Embedded {
    /// Reads what embedding `child` (its tree `c`, locked) must hold.
    pub(crate) fn of(c: &mut TreeState, child: &Arc<GraphHandle>) -> Embedded {
        let mut out = Embedded::default();
        if c.has_conditionals() {
            out.owners.push(child.root());
        }
        out.owners
            .extend(c.tree_wide_chunks().into_iter().map(|chunk| chunk as Owner));
        if let Some((chunk, index)) = c.nodes.owners_chunk_indexed() {
            for &((g, raw), start, len) in &index.nodes {
                let uses = &index.uses[start as usize..(start + len) as usize];
                let list = uses.iter().map(|&u| chunk[u as usize].clone());
                out.per_node
                    .push((g, raw as sys::CUgraphNode, list.collect()));
            }
        }
        out.nested.extend(c.embedded.iter().map(|(&k, &v)| (k, v)));
        out
    }
}

/// Registers what each node of an embedded graph held on that node's copy inside the new
/// child-graph node `child_node` of `graph`, so that destroying the copy through the node's
/// [`inspect`](GraphDefinition::inspect) view releases it. `per_node` lists `(graph id, raw
/// node, owners)` of the embedded tree: nodes of its root `root`, and of the graphs of its own
/// child-graph nodes (`nested`: `(graph id, raw child-graph node)` → the id of that node's
/// graph), at any depth. Each copy is found with `cuGraphNodeFindInClone` and checked to be of
/// the same type and, for a host node, to run the same closure. Returns the owners of the nodes
/// whose copy could not be named (nodes of conditional bodies among them): the child-graph node
/// holds those.
pub(crate) fn hold_in_copies(
    tree: &mut TreeState,
    graph: u64,
    child_node: sys::CUgraphNode,
    root: u64,
    nested: &[((u64, usize), u64)],
    per_node: Vec<(u64, sys::CUgraphNode, Owners)>,
) -> Owners {
    /// The copy of `original` in `copy_graph`, if the driver names one of the same type (and,
    /// for a host node, the same closure).
    ///
    /// # Safety
    /// `original` is a live node of a locked tree; `copy_graph` a live graph of a locked tree.
    unsafe fn copy_of(
        original: sys::CUgraphNode,
        copy_graph: sys::CUgraph,
    ) -> Option<sys::CUgraphNode> {
        // SAFETY: the caller's promise; every read below reads a live node of a locked tree.
        unsafe {
            let copy = driver::graph::node_find_in_clone(original, copy_graph).ok()?;
            let ty = driver::graph::node_type(original).ok()?;
            if driver::graph::node_type(copy).ok()? != ty {
                return None;
            }
            if NodeType::from_raw(ty) == NodeType::Host
                && driver::graph::host_node_get_params(copy).ok()?
                    != driver::graph::host_node_get_params(original).ok()?
            {
                return None;
            }
            Some(copy)
        }
    }
    // Embedded graph id → (its copy's raw graph, the id of the copy's view in `tree`), found
    // from the root down; `None` where a copy cannot be named.
    let mut copies: crate::driver::graph::IdMap<u64, Option<(sys::CUgraph, u64)>> =
        Default::default();
    // SAFETY: `child_node` is a live child-graph node of the locked tree.
    let top = unsafe { driver::graph::child_graph_node_get_graph(child_node) }.ok();
    let top_view = *tree
        .embedded
        .entry((graph, child_node as usize))
        .or_insert_with(crate::driver::graph::next_id);
    copies.insert(root, top.map(|g| (g, top_view)));
    fn resolve(
        tree: &mut TreeState,
        copies: &mut crate::driver::graph::IdMap<u64, Option<(sys::CUgraph, u64)>>,
        nested: &[((u64, usize), u64)],
        g: u64,
        depth: usize,
    ) -> Option<(sys::CUgraph, u64)> {
        if let Some(&known) = copies.get(&g) {
            return known;
        }
        let found = (|| {
            let &((parent, node), _) = nested.iter().find(|(_, id)| *id == g)?;
            if depth > 64 {
                return None;
            }
            let (parent_copy, parent_view) = resolve(tree, copies, nested, parent, depth + 1)?;
            // SAFETY: `node` is a live child-graph node of the embedded (locked) tree and
            // `parent_copy` a live graph of this locked tree (the copy of its graph).
            let copy = unsafe { copy_of(node as sys::CUgraphNode, parent_copy) }?;
            // SAFETY: `copy` is a live child-graph node (same type as `node`) of this tree.
            let copy_graph = unsafe { driver::graph::child_graph_node_get_graph(copy) }.ok()?;
            let view = *tree
                .embedded
                .entry((parent_view, copy as usize))
                .or_insert_with(crate::driver::graph::next_id);
            Some((copy_graph, view))
        })();
        copies.insert(g, found);
        found
    }
    let mut unnamed = Owners::new();
    for (g, original, owners) in per_node {
        let Some((copy_graph, view)) = resolve(tree, &mut copies, nested, g, 0) else {
            unnamed.extend(owners);
            continue;
        };
        // SAFETY: `original` is a live node of the embedded (locked) tree, `copy_graph` a live
        // graph of this locked tree.
        match unsafe { copy_of(original, copy_graph) } {
            Some(copy) => {
                let token = node::token(tree, view, copy);
                if let Some(before) =
                    tree.nodes
                        .replace_owners(view, token.raw, token.serial, owners)
                {
                    unnamed.extend(before);
                }
            }
            None => unnamed.extend(owners),
        }
    }
    unnamed
}

/// `config`'s launch attributes checked against the device and `function`, or `None` for a
/// plain launch.
#[inline]
fn attributes_of(function: &Function, config: &LaunchConfig) -> Result<Option<RawAttributes>> {
    if config.attributes.is_empty() {
        return Ok(None);
    }
    crate::runtime::launch::check_attributes(function, config).map(Some)
}
