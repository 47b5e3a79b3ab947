//! Graph memory: allocation and free nodes, [`GraphAllocation`] and its typed view
//! [`GraphBuffer`], and the ordering checks that make the view safe to pass to kernels.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys;

use super::node::{self, GraphNode};
use super::typed::{MemAllocNode, MemFreeNode, TypedNode};
use super::GraphDefinition;
use crate::driver;
use crate::driver::compat;
use crate::driver::context::PrimaryContext;
use crate::driver::graph::ledger::capture_dependencies;
use crate::error::{Error, Refusal, Result};
use crate::runtime::{
    kernel_sealed, ArgRefs, ConstSlice, DeviceBuffer, DeviceCopy, GraphUse, KernelArg, KernelArgs,
    Recording, Slice,
};
use crate::DriverVersion;

/// Checks an allocation size.
pub(crate) fn check_alloc_size(bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Err(Error::invalid(
            Refusal::Size,
            "a memory allocation node cannot allocate 0 bytes",
        ));
    }
    Ok(())
}

/// How other devices may access a graph allocation ([`MemAllocOptions::peer_access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerAccess {
    /// Reads only (`CU_MEM_ACCESS_FLAGS_PROT_READ`).
    Read,
    /// Reads and writes (`CU_MEM_ACCESS_FLAGS_PROT_READWRITE`).
    ReadWrite,
}

/// Options of a memory allocation node ([`GraphDefinition::add_mem_alloc_with`]). The default:
/// pinned device memory on the graph's device, no peers.
///
/// ```
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::{MemAllocOptions, PeerAccess};
/// let options = MemAllocOptions::new().on_device(0).peer_access(1, PeerAccess::Read);
/// assert_eq!(options.device(), Some(0));
/// assert_eq!(options.peers(), &[(1, PeerAccess::Read)]);
/// assert!(!options.is_managed());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemAllocOptions {
    device: Option<usize>,
    peers: Vec<(usize, PeerAccess)>,
    managed: bool,
}

impl MemAllocOptions {
    /// The defaults (see the type).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let options = MemAllocOptions::new().on_device(0);
    /// let (node, alloc) = def.add_mem_alloc_with(&[], 4096, &options)?;
    /// def.add_mem_free(&[&node], alloc)?;
    /// # Ok(()) }
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocates on device `ordinal` instead of the graph's device.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let (node, alloc) = def.add_mem_alloc_with(&[], 4096, &MemAllocOptions::new().on_device(1))?;
    /// # let _ = (node, alloc);
    /// # Ok(()) }
    /// ```
    pub fn on_device(mut self, ordinal: usize) -> Self {
        self.device = Some(ordinal);
        self
    }

    /// Lets device `ordinal` access the memory (`accessDescs`); a later call for the same
    /// device replaces the earlier one.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let options = MemAllocOptions::new().peer_access(1, PeerAccess::ReadWrite);
    /// let (node, alloc) = def.add_mem_alloc_with(&[], 4096, &options)?;
    /// # let _ = (node, alloc);
    /// # Ok(()) }
    /// ```
    pub fn peer_access(mut self, ordinal: usize, access: PeerAccess) -> Self {
        self.peers.retain(|(o, _)| *o != ordinal);
        self.peers.push((ordinal, access));
        self
    }

    /// Managed (unified) memory instead of pinned device memory (`CU_MEM_ALLOCATION_TYPE_MANAGED`,
    /// CUDA 13).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// let options = MemAllocOptions::new().managed(true); // needs a cuda-13* feature
    /// assert!(options.is_managed());
    /// # Ok(()) }
    /// ```
    pub fn managed(mut self, managed: bool) -> Self {
        self.managed = managed;
        self
    }

    /// The device asked for (`None`: the graph's).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// assert_eq!(MemAllocOptions::new().device(), None); // the graph's device
    /// assert_eq!(MemAllocOptions::new().on_device(2).device(), Some(2));
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Option<usize> {
        self.device
    }

    /// The peers and their access.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// let options = MemAllocOptions::new().peer_access(1, PeerAccess::Read);
    /// assert_eq!(options.peers(), &[(1, PeerAccess::Read)]);
    /// # Ok(()) }
    /// ```
    pub fn peers(&self) -> &[(usize, PeerAccess)] {
        &self.peers
    }

    /// Whether managed memory was asked for.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// assert!(!MemAllocOptions::new().is_managed());
    /// # Ok(()) }
    /// ```
    pub fn is_managed(&self) -> bool {
        self.managed
    }
}

/// Device memory allocated by a memory allocation node ([`GraphDefinition::add_mem_alloc`]).
///
/// The address is fixed when the node is added, but the memory exists **only while the graph
/// runs**, from the allocation node until the free node that consumes this value
/// ([`GraphDefinition::add_mem_free`]).
///
/// **With no free node**, the memory stays allocated after a launch (a kernel of a later launch
/// may read it), and the rules are:
/// - a second launch of the exec fails while the memory is still allocated, unless the exec was
///   made with [`auto_free_on_launch`](crate::InstantiateOptions::auto_free_on_launch), which
///   frees it at the start of each launch;
/// - the [`Graph`](crate::Graph) exec frees whatever is still allocated when it is dropped,
///   after its last launch has finished, and trims the device's graph memory pool (so nothing
///   leaks when the exec and the definition are gone;
///   [`Device::graph_memory_in_use`](crate::Device::graph_memory_in_use) shows it).
///
/// Pass it to kernels
/// that the graph orders between the two nodes (`&allocation` is a kernel argument: its device
/// address); there is nothing to read from the host. Not `Clone`: the free node takes it, so it
/// is freed once. `Send + Sync`.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(def: &GraphDefinition, fill: &Function) -> cuda_graph::Result<()> {
/// let (alloc_node, scratch) = def.add_mem_alloc(&[], 1024 * 4)?;
/// // SAFETY: fill takes (int*, int n, int v) and scratch holds 1024 ints while the graph runs.
/// let use_it = unsafe {
///     def.add_kernel_unchecked(&[&alloc_node], fill, LaunchConfig::for_num_elems(1024), &KernelArgs::new().arg(&scratch).arg(1024i32).arg(7i32))?
/// };
/// def.add_mem_free(&[&use_it], scratch)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GraphAllocation {
    ptr: u64,
    bytes: usize,
    node: MemAllocNode,
    ctx: Arc<PrimaryContext>,
    /// The device the memory lives on (the graph's, unless `MemAllocOptions::on_device` named
    /// another).
    device: sys::CUdevice,
}

impl GraphAllocation {
    /// The device address (valid only while the graph runs, between the allocation and its
    /// free).
    ///
    /// ```no_run
    /// # fn f(a: &cuda_graph::GraphAllocation) {
    /// println!("{:#x}", a.device_ptr());
    /// # }
    /// ```
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The size in bytes.
    ///
    /// ```no_run
    /// # fn f(a: &cuda_graph::GraphAllocation) {
    /// let ints = a.byte_len() / 4;
    /// # }
    /// ```
    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// The allocation node.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::NodeType;
    /// # fn f(def: &GraphDefinition, a: &GraphAllocation) -> cuda_graph::Result<()> {
    /// assert_eq!(def.node_type(&a.node())?, NodeType::MemAlloc);
    /// # Ok(()) }
    /// ```
    pub fn node(&self) -> MemAllocNode {
        self.node
    }

    /// This graph memory as a typed, safe [`GraphBuffer`] of `byte_len() / size_of::<T>()`
    /// elements, borrowed from the allocation: pass it to typed kernels
    /// ([`Stream::launch`](crate::Stream::launch) on the capturing stream,
    /// [`add_kernel`](GraphDefinition::add_kernel)) for `*mut T`, `*const T`, `Slice<T>` and
    /// `ConstSlice<T>` parameters. Every such launch is checked to run after the allocation
    /// node, and the free node ([`add_mem_free`](GraphDefinition::add_mem_free), the builder's
    /// `free_async`) is checked to run after every such launch, so a kernel never sees the
    /// memory outside the time it exists. A size that is not a whole number of `T`s, or a
    /// zero-sized `T`, is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, out: &DeviceBuffer<i32>, fill: &Kernel<(Slice<i32>, i32)>, copy: &Kernel<(ConstSlice<i32>, *mut i32)>) -> cuda_graph::Result<()> {
    /// let (alloc_node, scratch) = def.add_mem_alloc(&[], 1024 * 4)?;
    /// let tmp = scratch.view::<i32>()?;
    /// let set = def.add_kernel(&[&alloc_node], fill, LaunchConfig::for_num_elems(1024), (&tmp, 7))?;
    /// let copied = def.add_kernel(&[&set], copy, LaunchConfig::for_num_elems(1024), (&tmp, out))?;
    /// def.add_mem_free(&[&copied], scratch)?;
    /// # Ok(()) }
    /// ```
    pub fn view<T: DeviceCopy>(&self) -> Result<GraphBuffer<'_, T>> {
        let len = self.elements::<T>()?;
        Ok(GraphBuffer {
            ptr: self.ptr,
            len,
            alloc: self,
            _t: PhantomData,
        })
    }

    /// The number of `T`s the allocation holds, refusing a size that is not a whole number.
    fn elements<T>(&self) -> Result<usize> {
        let size = std::mem::size_of::<T>();
        if size == 0 || !self.bytes.is_multiple_of(size) {
            return Err(Error::invalid(
                Refusal::Size,
                format!(
                    "a graph allocation of {} bytes is not a whole number of `{}`s",
                    self.bytes,
                    std::any::type_name::<T>()
                ),
            ));
        }
        Ok(self.bytes / size)
    }

    /// This graph memory as a [`DeviceBuffer`] of `byte_len() / size_of::<T>()` elements, for
    /// the graph operations that take buffers but not a [`GraphBuffer`] (memset and memcpy
    /// nodes, captured or added); typed kernels take the safe [`view`](Self::view) instead.
    /// The buffer never frees anything:
    /// the graph allocated the memory and frees it (at its free node, or when the exec is
    /// dropped). A size that is not a whole number of `T`s is an [`Error::InvalidArgument`].
    ///
    /// # Safety
    /// The memory exists only while the graph runs, between the allocation node and its free.
    /// The caller promises that the buffer (and every slice or clone of it) is used only
    /// - in operations of this allocation's graph (nodes added to it, or work captured into it),
    ///   never on a stream outside such a capture and never by the host (`to_vec`, `copy_from`
    ///   and the like would touch memory that is not mapped);
    /// - by nodes that run after the allocation node and before the free node, if the graph has
    ///   one (a path of dependencies both ways).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, out: &DeviceBuffer<i32>, copy: &Kernel<(Slice<i32>, Slice<i32>)>) -> cuda_graph::Result<()> {
    /// let (alloc_node, scratch) = def.add_mem_alloc(&[], 1024 * 4)?;
    /// // SAFETY: used only by the two nodes below, which run after `alloc_node` and before the
    /// // free node.
    /// let tmp = unsafe { scratch.as_buffer::<i32>()? };
    /// let set = def.add_memset(&[&alloc_node], &tmp, 7i32)?;
    /// let copied = def.add_kernel(&[&set], copy, LaunchConfig::for_num_elems(1024), (&tmp, out))?;
    /// def.add_mem_free(&[&copied], scratch)?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn as_buffer<T: DeviceCopy>(&self) -> Result<DeviceBuffer<T>> {
        let len = self.elements::<T>()?;
        let device = crate::Device::from_ctx(&self.ctx);
        // SAFETY: the memory is an allocation of this context, mapped while the graph runs, and
        // freed by the graph, not by the buffer (its owner is `()`); where and when it is used
        // is the caller's promise above.
        unsafe { DeviceBuffer::from_raw(&device, self.ptr, len, ()) }
    }
}

impl GraphAllocation {
    /// Records a stream-ordered allocation of `bytes` into the capture of `stream`
    /// (`cuMemAllocAsync` on a capturing stream: a memory allocation node). Call inside
    /// [`Stream::enqueue`](crate::Stream) on that stream, with its [`Recording`].
    pub(crate) fn capture(
        rec: &mut Recording<'_>,
        stream: sys::CUstream,
        ctx: &Arc<PrimaryContext>,
        bytes: usize,
    ) -> Result<GraphAllocation> {
        check_alloc_size(bytes)?;
        let (Some(graph), Some(tree)) = (rec.graph_id(), rec.tree.as_deref_mut()) else {
            return Err(Error::invalid(
                Refusal::Capture,
                "the builder's stream is not capturing",
            ));
        };
        let mut ptr = 0;
        // SAFETY: the stream is live and captures into a graph whose tree is locked (`rec`).
        unsafe { driver::stream::mem_alloc_async(&mut ptr, bytes, stream) }?;
        // The allocation node is now the capture's only dependency.
        let deps = capture_dependencies(stream)?;
        let [raw] = deps[..] else {
            // The allocation node is in the graph all the same, and each launch of an exec
            // allocates its memory: record it for the execs to free. Its key cannot name a node
            // (a device address, which unified addressing keeps apart from the host addresses
            // node handles are), so no free node can take it.
            tree.note_allocation(graph, ptr as usize, ptr);
            return Err(Error::invalid(Refusal::Order, format!(
                "after a captured allocation the capture has {} dependencies instead of its allocation node",
                deps.len()
            )));
        };
        let node = TypedNode::new(node::token(tree, graph, raw));
        tree.note_allocation(graph, node.raw, ptr);
        Ok(GraphAllocation {
            ptr,
            bytes,
            node,
            ctx: ctx.clone(),
            device: ctx.device,
        })
    }

    /// Records the free of this allocation into the capture of `stream` (`cuMemFreeAsync` on a
    /// capturing stream: a memory free node). The allocation must be one of the captured graph,
    /// not freed yet.
    pub(crate) fn capture_free(self, rec: &mut Recording<'_>, stream: sys::CUstream) -> Result<()> {
        let (Some(graph), Some(tree)) = (rec.graph_id(), rec.tree.as_deref_mut()) else {
            return Err(Error::invalid(
                Refusal::Capture,
                "the builder's stream is not capturing",
            ));
        };
        let key = (self.node.graph, self.node.raw);
        if self.node.graph != graph
            || node::check(tree, graph, self.node.as_ref()).is_err()
            || tree.unfreed.get(&key) != Some(&self.ptr)
        {
            return Err(Error::invalid(
                Refusal::ForeignGraph,
                "free_async of a graph allocation that this capture's graph did not allocate (or already freed): free it in the graph that allocated it",
            ));
        }
        if tree.memory_users.contains_key(&key) {
            let deps = capture_dependencies(stream)?;
            // SAFETY: the capture's dependencies are live nodes of its graph, whose tree is
            // locked and whose stream's slot is held (`rec`).
            unsafe {
                crate::driver::graph::ledger::check_free_after_users(
                    tree,
                    graph,
                    self.node.raw,
                    &deps,
                )
            }?;
        }
        // SAFETY: the stream is live and captures into `graph`, whose tree is locked; `ptr` is an
        // allocation of that graph still allocated in it (checked above), freed once.
        unsafe { driver::stream::mem_free_async(self.ptr, stream) }?;
        tree.unfreed.remove(&key);
        tree.memory_users.remove(&key);
        Ok(())
    }
}

impl KernelArg for &GraphAllocation {
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(self.ptr);
    }
}

/// A typed view of a [`GraphAllocation`]: `len()` elements of `T` that exist only while the
/// graph runs, between the allocation node and its free, borrowed from the allocation
/// ([`GraphAllocation::view`]).
///
/// Typed kernels take `&GraphBuffer<T>` where they take a `&DeviceBuffer<T>` (`*mut T`,
/// `*const T`, [`Slice<T>`](crate::Slice) and [`ConstSlice<T>`](crate::ConstSlice)
/// parameters), in two places only, each checked:
/// - a launch on a stream that captures into the allocation's graph, after the allocation node
///   (the capture's current dependencies reach it);
/// - a kernel node added to the allocation's [`GraphDefinition`], whose dependencies reach the
///   allocation node.
///
/// Anywhere else (a stream outside a capture, another graph, [`NodeParams`](crate::NodeParams))
/// it is refused with an [`Error::InvalidArgument`]. The free node must then run after every
/// such kernel: [`add_mem_free`](GraphDefinition::add_mem_free) and the builder's `free_async`
/// refuse dependencies that do not reach each of them (add the missing edges or joins first).
/// A graph holding memory nodes cannot lose nodes or edges, so an order checked once holds.
/// The view borrows the allocation, so it is gone before the free node takes the allocation.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(def: &GraphDefinition, fill: &Kernel<(*mut f32, u32)>) -> cuda_graph::Result<()> {
/// let (alloc_node, scratch) = def.add_mem_alloc(&[], 256 * 4)?;
/// let tmp = scratch.view::<f32>()?;
/// let first = def.add_kernel(&[&alloc_node], fill, LaunchConfig::for_num_elems(128), (&tmp.slice(..128)?, 128u32))?;
/// // Not after the allocation node: refused.
/// assert!(def.add_kernel(&[], fill, LaunchConfig::for_num_elems(256), (&tmp, 256u32)).is_err());
/// def.add_mem_free(&[&first], scratch)?;
/// # Ok(()) }
/// ```
pub struct GraphBuffer<'a, T> {
    ptr: u64,
    len: usize,
    alloc: &'a GraphAllocation,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for GraphBuffer<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for GraphBuffer<'_, T> {}

impl<T> std::fmt::Debug for GraphBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<'a, T: DeviceCopy> GraphBuffer<'a, T> {
    /// The number of elements.
    ///
    /// ```no_run
    /// # fn f(a: &cuda_graph::GraphAllocation) -> cuda_graph::Result<()> {
    /// assert_eq!(a.view::<f32>()?.len(), a.byte_len() / 4);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a view has at least one element (an allocation is never empty, and
    /// [`slice`](Self::slice) refuses an empty range).
    ///
    /// ```no_run
    /// # fn f(a: &cuda_graph::GraphAllocation) -> cuda_graph::Result<()> {
    /// let v = a.view::<f32>()?;
    /// assert!(!v.is_empty());
    /// assert!(v.slice(..0).is_err()); // an empty view cannot be made
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the first element (valid only while the graph runs, between the
    /// allocation and its free).
    ///
    /// ```no_run
    /// # fn f(a: &cuda_graph::GraphAllocation) -> cuda_graph::Result<()> {
    /// assert_eq!(a.view::<u8>()?.device_ptr(), a.device_ptr());
    /// # Ok(()) }
    /// ```
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The elements in `range`, as a view of the same allocation (checked the same way). A
    /// range outside `0..=len()`, or an empty one, is an [`Error::InvalidArgument`]
    /// ([`Refusal::Size`]).
    ///
    /// ```no_run
    /// # fn f(a: &cuda_graph::GraphAllocation) -> cuda_graph::Result<()> {
    /// let v = a.view::<f32>()?;
    /// let tail = v.slice(v.len() / 2..)?;
    /// # Ok(()) }
    /// ```
    pub fn slice(&self, range: impl std::ops::RangeBounds<usize>) -> Result<GraphBuffer<'a, T>> {
        let (start, end) = crate::runtime::bounds(&range, self.len)?;
        Ok(GraphBuffer {
            // In bounds of the allocation: `start <= len`, and `len` elements fit it.
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len: end - start,
            alloc: self.alloc,
            _t: PhantomData,
        })
    }

    /// The use this view makes of its allocation, for the launch checks.
    pub(crate) fn graph_use(&self) -> GraphUse {
        GraphUse {
            graph: self.alloc.node.graph,
            alloc: self.alloc.node.raw,
        }
    }

    /// The device the memory lives on.
    pub(crate) fn device(&self) -> sys::CUdevice {
        self.alloc.device
    }
}

impl<T: DeviceCopy> KernelArg for &GraphBuffer<'_, T> {
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(self.ptr);
    }
}

crate::runtime::arg_for! {
    [T: DeviceCopy] &GraphBuffer<'_, T> => *mut T, |b, r| r.graph_memory(&b.ptr, b.graph_use(), b.device());
    [T: DeviceCopy] &GraphBuffer<'_, T> => *const T, |b, r| r.graph_memory(&b.ptr, b.graph_use(), b.device());
}

impl<T: DeviceCopy> kernel_sealed::ArgFor<Slice<T>> for &GraphBuffer<'_, T> {
    fn push_as<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        crate::runtime::push_slice(args, self.ptr, self.len);
    }
    fn refs_as<'a>(&'a self, refs: &mut ArgRefs<'a>) {
        refs.graph_memory_slice(self.ptr, self.len, self.graph_use(), self.device());
    }
}
impl<T: DeviceCopy> crate::ArgFor<Slice<T>> for &GraphBuffer<'_, T> {}
impl<T: DeviceCopy> kernel_sealed::ArgFor<ConstSlice<T>> for &GraphBuffer<'_, T> {
    fn push_as<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        crate::runtime::push_slice(args, self.ptr, self.len);
    }
    fn refs_as<'a>(&'a self, refs: &mut ArgRefs<'a>) {
        refs.graph_memory_slice(self.ptr, self.len, self.graph_use(), self.device());
    }
}
impl<T: DeviceCopy> crate::ArgFor<ConstSlice<T>> for &GraphBuffer<'_, T> {}

impl GraphDefinition {
    /// Adds a memory allocation node (`cuGraphAddMemAllocNode`) of `bytes` bytes of device
    /// memory on the graph's device, and returns it with the [`GraphAllocation`]: pass that to the
    /// kernels that use the memory, then to [`add_mem_free`](Self::add_mem_free). The memory is
    /// valid only while the graph runs, between the two nodes. `bytes == 0` is an
    /// [`Error::InvalidArgument`]. [`add_mem_alloc_with`](Self::add_mem_alloc_with) takes options
    /// (another device, peer access, managed memory).
    ///
    /// The driver restricts graphs with memory nodes (they cannot sit in conditional bodies, and
    /// such a graph may have only one exec at a time).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// let (alloc, scratch) = def.add_mem_alloc(&[], 1 << 20)?;
    /// def.add_mem_free(&[&alloc], scratch)?;
    /// # Ok(()) }
    /// ```
    pub fn add_mem_alloc(
        &self,
        deps: &[&GraphNode],
        bytes: usize,
    ) -> Result<(MemAllocNode, GraphAllocation)> {
        self.add_mem_alloc_with(deps, bytes, &MemAllocOptions::default())
    }

    /// [`add_mem_alloc`](Self::add_mem_alloc) with options: the device the memory lives on,
    /// other devices that may access it, managed memory.
    ///
    /// Refused with an [`Error::InvalidArgument`]: a device ordinal that does not exist, a peer
    /// that cannot access the allocating device (`cuDeviceCanAccessPeer`), the allocating device
    /// listed as its own peer, managed memory in a build with CUDA 12 bindings (managed memory
    /// needs a `cuda-13*` feature, and driver 13.0: [`Error::Unsupported`] below it); what the
    /// driver itself refuses is its error.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::{MemAllocOptions, PeerAccess};
    /// # fn f(def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// // 1 MiB on device 0 that device 1 may read and write.
    /// let options = MemAllocOptions::new()
    ///     .on_device(0)
    ///     .peer_access(1, PeerAccess::ReadWrite);
    /// let (alloc, scratch) = def.add_mem_alloc_with(&[], 1 << 20, &options)?;
    /// def.add_mem_free(&[&alloc], scratch)?;
    /// # Ok(()) }
    /// ```
    pub fn add_mem_alloc_with(
        &self,
        deps: &[&GraphNode],
        bytes: usize,
        options: &MemAllocOptions,
    ) -> Result<(MemAllocNode, GraphAllocation)> {
        check_alloc_size(bytes)?;
        let ctx = &self.handle().ctx;
        let devices = driver::device::count()?.max(0) as usize;
        let exists = |ordinal: usize, what: &str| -> Result<sys::CUdevice> {
            if ordinal >= devices {
                return Err(Error::invalid(
                    Refusal::OtherDevice,
                    format!("{what} {ordinal} does not exist ({devices} device(s))"),
                ));
            }
            driver::device::get(ordinal as i32)
        };
        let (target_ordinal, target) = match options.device {
            Some(o) => (o, exists(o, "allocation device")?),
            None => (ctx.ordinal, ctx.device),
        };
        let mut access = Vec::with_capacity(options.peers.len());
        for &(peer, how) in &options.peers {
            let peer_dev = exists(peer, "peer device")?;
            if peer == target_ordinal {
                return Err(Error::invalid(Refusal::OtherDevice, format!(
                    "device {peer} allocates the memory and always has access: list only other devices as peers"
                )));
            }
            if !driver::device::can_access_peer(peer_dev, target)? {
                return Err(Error::invalid(Refusal::OtherDevice, format!(
                    "device {peer} cannot access memory of device {target_ordinal} (cuDeviceCanAccessPeer)"
                )));
            }
            access.push(sys::CUmemAccessDesc {
                location: compat::device_location(peer_dev),
                flags: match how {
                    PeerAccess::Read => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
                    PeerAccess::ReadWrite => {
                        sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                    }
                },
            });
        }
        let alloc_type = match compat::allocation_type(options.managed) {
            Some(t) => t,
            None => {
                return Err(Error::invalid(
                    Refusal::Unsupported,
                    "managed graph allocations need the CUDA 13 bindings: build cuda-graph with a `cuda-13*` feature (this build uses CUDA 12 bindings, which cannot name managed memory)",
                ))
            }
        };
        if options.managed {
            driver::require("managed graph allocations", DriverVersion::V13_0)?;
        }
        // SAFETY: zeroed allocation parameters are valid plain C data; the used fields are set
        // below.
        let mut params: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        params.poolProps.allocType = alloc_type;
        params.poolProps.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        params.poolProps.location = compat::device_location(target);
        params.bytesize = bytes;
        params.accessDescCount = access.len();
        params.accessDescs = if access.is_empty() {
            std::ptr::null()
        } else {
            access.as_ptr()
        };
        let dptr = std::cell::Cell::new(0);
        let node = self.add_node_then(
            deps,
            &[],
            &[],
            |_| {},
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes; `params` is fully
                // initialised, its access descriptors (`access`) alive during the call, and the
                // driver writes `dptr`.
                let r = unsafe { driver::graph::add_mem_alloc_node(out, g, d, n, &mut params) };
                dptr.set(params.dptr);
                r
            },
            // Recorded with the node, under the same lock: an instantiation on another thread
            // sees both or neither.
            |tree, node| tree.note_allocation(node.graph, node.raw, dptr.get()),
        )?;
        let node = MemAllocNode::new(node);
        Ok((
            node,
            GraphAllocation {
                ptr: params.dptr,
                bytes,
                node,
                ctx: self.handle().ctx.clone(),
                device: target,
            },
        ))
    }

    /// Adds a node that frees `allocation` (`cuGraphAddMemFreeNode`); it must run after every
    /// node that uses the memory. The allocation must come from this graph (an allocation of
    /// another graph is refused with [`Refusal::ForeignGraph`]), and its allocation node must
    /// not have been destroyed.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(def: &GraphDefinition, last_use: &GraphNode, scratch: GraphAllocation) -> cuda_graph::Result<()> {
    /// def.add_mem_free(&[last_use], scratch)?;
    /// # Ok(()) }
    /// ```
    pub fn add_mem_free(
        &self,
        deps: &[&GraphNode],
        allocation: GraphAllocation,
    ) -> Result<MemFreeNode> {
        let ptr = allocation.ptr;
        let alloc_node = allocation.node;
        if alloc_node.graph != self.handle().id {
            return Err(Error::invalid(
                Refusal::ForeignGraph,
                "add_mem_free of an allocation another graph made: a graph frees only its own allocations; free it in the graph whose add_mem_alloc made it",
            ));
        }
        let key = (alloc_node.graph, alloc_node.raw);
        let free = self.add_node_then_checked(
            deps,
            &[alloc_node.as_ref()],
            &[],
            |_| {},
            |tree, d, n| {
                // SAFETY: `d` holds `n` checked live nodes of this locked graph.
                let deps = unsafe { std::slice::from_raw_parts(d, n) };
                // SAFETY: as above.
                unsafe {
                    crate::driver::graph::ledger::check_free_after_users(tree, key.0, key.1, deps)
                }
            },
            |g, d, n, out| {
                // SAFETY: `g` is live and locked, `d` holds `n` checked nodes; `ptr` was returned by
                // a live allocation node of this graph (checked with the dependencies).
                unsafe { driver::graph::add_mem_free_node(out, g, d, n, ptr) }
            },
            // The graph frees it now.
            |tree, _| {
                tree.unfreed.remove(&key);
                tree.memory_users.remove(&key);
            },
        )?;
        Ok(TypedNode::new(free))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_byte_allocations_are_an_error() {
        assert!(matches!(
            check_alloc_size(0),
            Err(e) if e.refusal() == Some(Refusal::Size)
        ));
        assert!(check_alloc_size(1).is_ok());
    }
}
