use std::alloc::Layout;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;

use super::{DeviceBuffer, DeviceCopy, OwnerRef};
use crate::driver::graph::Owner;

/// Grid and block dimensions, dynamic shared memory and [launch attributes](LaunchAttributes)
/// for a kernel launch.
///
/// ```
/// use cuda_graph::LaunchConfig;
/// // 8 blocks of 128 threads in clusters of 2, at the context's highest priority but one.
/// let config = LaunchConfig { grid: (8, 1, 1), block: (128, 1, 1), ..LaunchConfig::single() }
///     .with_cluster((2, 1, 1))
///     .with_priority(-1);
/// assert_eq!(config.attributes.cluster(), Some((2, 1, 1)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid, `(x, y, z)`.
    pub grid: (u32, u32, u32),
    /// Threads in a block, `(x, y, z)`.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
    /// Thread-block clusters, priority and cooperative launch (none by default: a plain grid).
    pub attributes: LaunchAttributes,
}

/// What a launch asks of the device beyond its grid (`CUlaunchAttribute`s): thread-block
/// clusters, a priority, a cooperative grid. The same attributes apply to a stream launch
/// (`cuLaunchKernelEx`), a captured launch and a kernel node of a definition (set on the node
/// with `cuGraphKernelNodeSetAttribute`; [`GraphDefinition::inspect`] and
/// [`node_info`](crate::GraphDefinition::node_info) read them back in the node's
/// [`KernelInfo::config`](crate::KernelInfo::config)).
///
/// Each is checked against the device before the driver sees it, and refused with
/// [`Refusal::Attribute`](crate::Refusal::Attribute), saying why. Programmatic dependent launch, whose safety depends on the kernel's code, is not an
/// attribute here: see [`Kernel::dependent`](crate::Kernel::dependent).
///
/// [`GraphDefinition::inspect`]: crate::GraphDefinition::inspect
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LaunchAttributes {
    // Packed so that a plain launch tests one byte (`flags == 0`) and a `LaunchConfig` stays
    // small on the hot paths. Values outside the fields' range saturate, and every saturated
    // value is one the checks refuse (a cluster dimension past 8, a priority past the range).
    cluster: [u16; 3],
    priority: i16,
    flags: u8,
}

const CLUSTER: u8 = 1;
const PRIORITY: u8 = 2;
const COOPERATIVE: u8 = 4;
const PROGRAMMATIC: u8 = 8;

/// `v` in a `u16`, saturating.
const fn sat_u16(v: u32) -> u16 {
    if v > u16::MAX as u32 {
        u16::MAX
    } else {
        v as u16
    }
}

impl std::fmt::Debug for LaunchAttributes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchAttributes")
            .field("cluster", &self.cluster())
            .field("priority", &self.priority())
            .field("cooperative", &self.cooperative())
            .field("dependent", &self.is_dependent())
            .finish()
    }
}

impl LaunchAttributes {
    /// No attributes: a plain launch.
    pub const NONE: LaunchAttributes = LaunchAttributes {
        cluster: [0; 3],
        priority: 0,
        flags: 0,
    };

    /// Blocks per thread-block cluster, `(x, y, z)` (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`),
    /// if set ([`LaunchConfig::with_cluster`]): needs compute capability 9.0; each dimension
    /// divides the grid's, and a cluster holds at most 8 blocks (the portable size).
    ///
    /// ```
    /// let c = cuda_graph::LaunchConfig::single().with_cluster((2, 1, 1));
    /// assert_eq!(c.attributes.cluster(), Some((2, 1, 1)));
    /// ```
    #[inline]
    pub const fn cluster(&self) -> Option<(u32, u32, u32)> {
        if self.flags & CLUSTER == 0 {
            return None;
        }
        let [x, y, z] = self.cluster;
        Some((x as u32, y as u32, z as u32))
    }

    /// The launch's priority (`CU_LAUNCH_ATTRIBUTE_PRIORITY`), if set
    /// ([`LaunchConfig::with_priority`]): within the context's range
    /// ([`Device::stream_priority_range`](crate::Device::stream_priority_range): lower numbers
    /// are higher priorities). A graph honours its nodes' priorities when instantiated with
    /// [`InstantiateOptions::use_node_priority`](crate::InstantiateOptions::use_node_priority).
    #[inline]
    pub const fn priority(&self) -> Option<i32> {
        if self.flags & PRIORITY == 0 {
            return None;
        }
        Some(self.priority as i32)
    }

    /// Whether the launch is cooperative (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`,
    /// [`LaunchConfig::with_cooperative`]): every block of the grid is resident at once, so the
    /// grid may synchronise as a whole (`grid.sync()`); the grid must fit the device at once
    /// (checked with the kernel's occupancy).
    #[inline]
    pub const fn cooperative(&self) -> bool {
        self.flags & COOPERATIVE != 0
    }

    /// Whether the launch may begin before the kernel it depends on has ended (programmatic
    /// dependent launch: `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, a
    /// programmatic edge in a graph). Set by the dependent launches
    /// ([`Stream::launch_dependent`](crate::Stream::launch_dependent) and the builder's and
    /// definition's), or by the `unsafe` [`LaunchConfig::with_dependent_launch`].
    ///
    /// ```
    /// assert!(!cuda_graph::LaunchConfig::single().attributes.is_dependent());
    /// ```
    #[inline]
    pub const fn is_dependent(&self) -> bool {
        self.flags & PROGRAMMATIC != 0
    }

    /// Whether no attribute is set.
    ///
    /// ```
    /// assert!(cuda_graph::LaunchAttributes::default().is_empty());
    /// ```
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.flags == 0
    }

    /// These attributes with clusters of `dims` blocks (or none).
    pub(crate) const fn set_cluster(mut self, dims: Option<(u32, u32, u32)>) -> Self {
        match dims {
            Some((x, y, z)) => {
                self.cluster = [sat_u16(x), sat_u16(y), sat_u16(z)];
                self.flags |= CLUSTER;
            }
            None => {
                self.cluster = [0; 3];
                self.flags &= !CLUSTER;
            }
        }
        self
    }

    /// These attributes at `priority` (or none).
    pub(crate) const fn set_priority(mut self, priority: Option<i32>) -> Self {
        match priority {
            Some(p) => {
                self.priority = if p > i16::MAX as i32 {
                    i16::MAX
                } else if p < i16::MIN as i32 {
                    i16::MIN
                } else {
                    p as i16
                };
                self.flags |= PRIORITY;
            }
            None => {
                self.priority = 0;
                self.flags &= !PRIORITY;
            }
        }
        self
    }

    /// These attributes cooperative, or not.
    pub(crate) const fn set_cooperative(mut self, on: bool) -> Self {
        if on {
            self.flags |= COOPERATIVE;
        } else {
            self.flags &= !COOPERATIVE;
        }
        self
    }

    /// These attributes as a dependent launch, or not.
    pub(crate) const fn set_dependent(mut self, on: bool) -> Self {
        if on {
            self.flags |= PROGRAMMATIC;
        } else {
            self.flags &= !PROGRAMMATIC;
        }
        self
    }
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self::single()
    }
}

impl LaunchConfig {
    /// A kernel node's parameters (`CUDA_KERNEL_NODE_PARAMS`) for `function` with this
    /// configuration; `params` points at the argument pointers (null for none) and must stay
    /// valid until the driver call that takes them returns. No context is named: the driver
    /// ignores the field when `func` is set and takes the function's (the raw calls the bench
    /// compares with pass none either).
    pub(crate) fn kernel_node_params(
        &self,
        function: &super::Function,
        params: *mut *mut std::ffi::c_void,
    ) -> cudarc::driver::sys::CUDA_KERNEL_NODE_PARAMS {
        cudarc::driver::sys::CUDA_KERNEL_NODE_PARAMS {
            func: function.raw,
            gridDimX: self.grid.0,
            gridDimY: self.grid.1,
            gridDimZ: self.grid.2,
            blockDimX: self.block.0,
            blockDimY: self.block.1,
            blockDimZ: self.block.2,
            sharedMemBytes: self.shared_mem_bytes,
            kernelParams: params,
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }
}

impl LaunchConfig {
    /// One block of one thread.
    pub const fn single() -> Self {
        LaunchConfig {
            grid: (1, 1, 1),
            block: (1, 1, 1),
            shared_mem_bytes: 0,
            attributes: LaunchAttributes::NONE,
        }
    }

    /// Enough 256-thread blocks to give each of `n` elements a thread (at least one block).
    pub const fn for_num_elems(n: u32) -> Self {
        let blocks = n.div_ceil(256);
        LaunchConfig {
            grid: (if blocks == 0 { 1 } else { blocks }, 1, 1),
            block: (256, 1, 1),
            shared_mem_bytes: 0,
            attributes: LaunchAttributes::NONE,
        }
    }

    /// This configuration with thread-block clusters of `dims` blocks
    /// ([`LaunchAttributes::cluster`]).
    pub const fn with_cluster(mut self, dims: (u32, u32, u32)) -> Self {
        self.attributes = self.attributes.set_cluster(Some(dims));
        self
    }

    /// This configuration at `priority` ([`LaunchAttributes::priority`]).
    pub const fn with_priority(mut self, priority: i32) -> Self {
        self.attributes = self.attributes.set_priority(Some(priority));
        self
    }

    /// This configuration launched cooperatively, or not ([`LaunchAttributes::cooperative`]).
    pub const fn with_cooperative(mut self, on: bool) -> Self {
        self.attributes = self.attributes.set_cooperative(on);
        self
    }

    /// This configuration as a programmatic dependent launch: the kernel may begin before the
    /// kernel it depends on (the stream's previous kernel, or a graph's dependency) has ended.
    /// The safe way is a [`DependentKernel`](crate::DependentKernel) and the `launch_dependent`
    /// methods; this is for untyped launches ([`Stream::launch_unchecked`](crate::Stream::launch_unchecked)).
    /// Needs compute capability 9.0.
    ///
    /// # Safety
    /// Every kernel launched with this configuration keeps
    /// [`Kernel::dependent`](crate::Kernel::dependent)'s promise: each of its thread blocks
    /// waits for the predecessor (`cudaGridDependencySynchronize()`, PTX
    /// `griddepcontrol.wait`) before it exits, before its first access to memory the
    /// predecessor writes, and before its first write to memory the predecessor reads: the
    /// predecessor may still be running until then.
    pub const unsafe fn with_dependent_launch(mut self) -> Self {
        self.attributes = self.attributes.set_dependent(true);
        self
    }
}

/// A value that can be passed to a kernel: numbers by value, buffers by device address.
///
/// `push_to` takes the value itself: a reference (`&DeviceBuffer<T>`) is given by value, and
/// [`KernelArgs`] borrows what it refers to; the arguments live no longer than the reference
/// (`Self: 'a`).
/// Implement it for a type of your own by pushing its parts:
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::*;
/// /// A `(float* data, int n)` pair, as a kernel takes it.
/// struct Span<'b>(&'b DeviceBuffer<f32>);
///
/// impl KernelArg for Span<'_> {
///     fn push_to<'a>(self, args: &mut KernelArgs<'a>)
///     where
///         Self: 'a,
///     {
///         args.push(self.0).push(self.0.len() as i32);
///     }
/// }
/// # fn f(buf: &DeviceBuffer<f32>) {
/// let args = KernelArgs::new().arg(Span(buf));
/// assert_eq!(args.len(), 2);
/// # }
/// ```
pub trait KernelArg {
    /// Appends this argument to `args`.
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a;
}

/// What an argument keeps alive: borrowed while the arguments are (a buffer given by
/// reference), or held by them (a [`DeviceGraph`](crate::DeviceGraph) given by value, boxed so
/// that an entry takes 16 bytes: the usual list's entries fit its first cache line).
enum Held<'a> {
    Borrowed(OwnerRef<'a>),
    Owned(Box<Owner>),
}

const _: () = assert!(std::mem::size_of::<Held<'static>>() == 16);

impl<'a> Held<'a> {
    #[inline]
    fn as_ref(&self) -> OwnerRef<'_> {
        match self {
            Held::Borrowed(r) => *r,
            Held::Owned(o) => OwnerRef::Other(o),
        }
    }
}

/// Arguments a list stores in place, before it moves them all to the heap.
const INLINE_VALUES: usize = 8;
/// Owners a list names in place, before it moves them all to the heap.
const INLINE_KEEP: usize = 3;
/// The count of a list whose elements were moved to [`More`].
const SPILLED: u8 = u8::MAX;

/// A list's elements past its room in place (all of them, once it overflowed).
struct More<'a> {
    values: Vec<ArgValue>,
    keep: Vec<Held<'a>>,
}

/// Appends `item` to a list past its room in place (`inline`, of which the first `n` are
/// initialised, or none once `n` is [`SPILLED`]): the first time, the inline elements are moved
/// to `heap` and `n` set to `SPILLED`.
fn push_spilled<T, const N: usize>(
    n: &mut u8,
    inline: &[MaybeUninit<T>; N],
    heap: &mut Vec<T>,
    item: T,
) {
    if *n != SPILLED {
        // Reserved first, so nothing can unwind between moving the elements out and marking the
        // list spilled (which would drop them twice).
        heap.reserve(N * 2);
        for v in &inline[..usize::from(*n)] {
            // SAFETY: `inline[..n]` are initialised; each is read once, and `n` is set to
            // `SPILLED` below, so the inline copies are never read or dropped again.
            heap.push(unsafe { v.assume_init_read() });
        }
        *n = SPILLED;
    }
    heap.push(item);
}

/// `more`, made on first use.
fn more_of<'m, 'a>(more: &'m mut Option<Box<More<'a>>>) -> &'m mut More<'a> {
    more.get_or_insert_with(|| {
        Box::new(More {
            values: Vec::new(),
            keep: Vec::new(),
        })
    })
}

/// The arguments of one kernel launch, in order, and what they refer to.
///
/// A buffer passed as an argument is borrowed (`KernelArgs<'a>` lives no longer than the
/// buffers in it). A capture, a kernel node or [`NodeParams`](crate::NodeParams) made from the
/// arguments takes its own hold on each, so every graph that uses the launch keeps the buffer
/// alive; a launch on a stream outside a capture needs none (see
/// [`Stream::launch_unchecked`](crate::Stream::launch_unchecked)). Building a `KernelArgs` per
/// launch costs no reference counting.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(buf: &DeviceBuffer<i32>) {
/// let args = KernelArgs::new().arg(buf).arg(3i32).arg(4i32);
/// # }
/// ```
///
/// Arguments of up to 16 bytes and alignment are stored inline (8 of them before the list
/// allocates); a larger or more aligned one in an allocation of its own with its type's layout,
/// so a `#[repr(C, align(64))]` [`DeviceCopy`] argument is as aligned as its type requires while
/// the driver reads it.
#[repr(C, align(64))]
pub struct KernelArgs<'a> {
    // The first cache line: the counts, the flag, the spill and three owners. A launch with a
    // buffer argument or two touches this line and the next (its first values); a layout with a
    // `SmallVec` per list put each list's count after its inline room, four lines in all.
    /// Values stored in `values`, or [`SPILLED`] when all are in `more`.
    nvalues: u8,
    /// Owners named in `keep`, or [`SPILLED`] when all are in `more`.
    nkeep: u8,
    /// Whether dropping the list has anything to free: a value stored on the heap, an owner
    /// held, or `more`. `Drop` returns at once without (inline, in the caller).
    owns: bool,
    /// The lists once either outgrew its room.
    more: ManuallyDrop<Option<Box<More<'a>>>>,
    /// What the arguments refer to: `keep[..nkeep]` are initialised.
    keep: [MaybeUninit<Held<'a>>; INLINE_KEEP],
    /// Each argument's bytes, with its type's alignment: `values[..nvalues]` are initialised.
    values: [MaybeUninit<ArgValue>; INLINE_VALUES],
}

const _: () = assert!(std::mem::offset_of!(KernelArgs<'static>, values) == 64);

impl Default for KernelArgs<'_> {
    #[inline]
    fn default() -> Self {
        KernelArgs {
            nvalues: 0,
            nkeep: 0,
            owns: false,
            more: ManuallyDrop::new(None),
            keep: [const { MaybeUninit::uninit() }; INLINE_KEEP],
            values: [const { MaybeUninit::uninit() }; INLINE_VALUES],
        }
    }
}

impl Drop for KernelArgs<'_> {
    /// A list that holds nothing to free (inline values, borrowed owners, nothing spilled) is
    /// done here, inline in the caller: the usual launch's arguments, built per launch. Others
    /// are dropped out of line (see docs/design/performance.md, "Counting the crate's own
    /// instructions").
    #[inline]
    fn drop(&mut self) {
        if self.owns {
            self.drop_slow();
        }
    }
}

impl KernelArgs<'_> {
    /// Drops what the list holds (only from `drop`).
    #[inline(never)]
    fn drop_slow(&mut self) {
        if self.nvalues != SPILLED {
            for v in &mut self.values[..usize::from(self.nvalues)] {
                // SAFETY: `values[..nvalues]` are initialised, and dropped once: here, after
                // which the list is gone.
                unsafe { v.assume_init_drop() };
            }
        }
        if self.nkeep != SPILLED {
            for k in &mut self.keep[..usize::from(self.nkeep)] {
                // SAFETY: as above, for `keep[..nkeep]`.
                unsafe { k.assume_init_drop() };
            }
        }
        // Spilled lists drop with their `Vec`s.
        // SAFETY: dropped once, here, after which the list is gone.
        unsafe { ManuallyDrop::drop(&mut self.more) };
    }

    /// The argument values, in order.
    #[inline(always)]
    fn value_slice(&self) -> &[ArgValue] {
        let n = usize::from(self.nvalues);
        if n <= INLINE_VALUES {
            // SAFETY: `values[..nvalues]` are initialised while the list is not spilled, and
            // `MaybeUninit<T>` has `T`'s layout.
            unsafe { std::slice::from_raw_parts(self.values.as_ptr().cast(), n) }
        } else {
            self.more.as_ref().map_or(&[], |m| &m.values[..])
        }
    }

    /// What the arguments refer to.
    #[inline(always)]
    fn keep_slice(&self) -> &[Held<'_>] {
        let n = usize::from(self.nkeep);
        if n <= INLINE_KEEP {
            // SAFETY: as in `value_slice`, for `keep[..nkeep]`.
            unsafe { std::slice::from_raw_parts(self.keep.as_ptr().cast(), n) }
        } else {
            self.more.as_ref().map_or(&[], |m| &m.keep[..])
        }
    }
}

impl std::fmt::Debug for KernelArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelArgs")
            .field("count", &self.len())
            .field("keeps", &self.keep_slice().len())
            .finish_non_exhaustive()
    }
}

/// Room for the argument pointers of a launch of up to 16 arguments, filled by
/// [`KernelArgs::fill_pointers`].
pub(crate) type ArgPointers = [std::mem::MaybeUninit<*mut std::ffi::c_void>; 16];

/// An [`ArgPointers`] to fill.
pub(crate) const NO_POINTERS: ArgPointers = [std::mem::MaybeUninit::uninit(); 16];

impl<'a> KernelArgs<'a> {
    /// No arguments.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let args = KernelArgs::new().arg(buf).arg(16i32);
    /// assert_eq!(args.len(), 2);
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an argument.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// let args = KernelArgs::new().arg(buf).arg(buf.len() as i32).arg(0.5f32);
    /// # let _ = args;
    /// # Ok(()) }
    /// ```
    #[must_use = "`arg` returns the arguments with the new one; use `push` to add in place"]
    #[inline(always)]
    pub fn arg(mut self, value: impl KernelArg + 'a) -> Self {
        value.push_to(&mut self);
        self
    }

    /// Appends an argument in place.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(bufs: &[DeviceBuffer<f32>]) -> cuda_graph::Result<()> {
    /// let mut args = KernelArgs::new();
    /// for b in bufs {
    ///     args.push(b);
    /// }
    /// args.push(bufs.len() as i32);
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn push(&mut self, value: impl KernelArg + 'a) -> &mut Self {
        value.push_to(self);
        self
    }

    /// The number of arguments.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// assert_eq!(KernelArgs::new().arg(1u32).arg(2u64).len(), 2);
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn len(&self) -> usize {
        self.value_slice().len()
    }

    /// Whether there are no arguments.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// assert!(KernelArgs::new().is_empty());
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.nvalues == 0
    }

    /// Appends the bytes of a plain value, stored with `T`'s alignment.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// #[derive(Clone, Copy)]
    /// #[repr(C)]
    /// struct Params { n: u32, scale: f32 }
    /// // SAFETY: plain numbers, `#[repr(C)]`, the kernel's `struct Params { unsigned n; float scale; }`.
    /// unsafe impl DeviceCopy for Params {}
    /// let mut args = KernelArgs::new();
    /// args.push_value(Params { n: 4, scale: 0.5 });
    /// # Ok(()) }
    /// ```
    #[inline(always)]
    pub fn push_value<T: DeviceCopy>(&mut self, value: T) {
        let value = ArgValue::new(value);
        self.owns |= matches!(value, ArgValue::Heap { .. });
        let n = usize::from(self.nvalues);
        if n < INLINE_VALUES {
            self.values[n].write(value);
            self.nvalues += 1;
        } else {
            self.push_value_spilled(value);
        }
    }

    /// Appends a value past the list's room, moving the values to the heap the first time.
    #[inline(never)]
    fn push_value_spilled(&mut self, value: ArgValue) {
        self.owns = true;
        let more = more_of(&mut self.more);
        push_spilled(&mut self.nvalues, &self.values, &mut more.values, value);
    }

    /// Appends an owner to `keep`.
    #[inline(always)]
    fn push_keep(&mut self, held: Held<'a>) {
        let n = usize::from(self.nkeep);
        if n < INLINE_KEEP {
            self.keep[n].write(held);
            self.nkeep += 1;
        } else {
            self.push_keep_spilled(held);
        }
    }

    /// Appends an owner past the list's room, moving the owners to the heap the first time.
    #[inline(never)]
    fn push_keep_spilled(&mut self, held: Held<'a>) {
        self.owns = true;
        let more = more_of(&mut self.more);
        push_spilled(&mut self.nkeep, &self.keep, &mut more.keep, held);
    }

    /// Borrows `owner` for as long as the arguments live: what uses them takes its own hold.
    #[inline(always)]
    pub(crate) fn keep_borrowed(&mut self, owner: OwnerRef<'a>) {
        self.push_keep(Held::Borrowed(owner));
    }

    /// Holds `owner` with the arguments (an argument given by value).
    pub(crate) fn keep_owned(&mut self, owner: Owner) {
        self.owns = true;
        self.push_keep(Held::Owned(Box::new(owner)));
    }

    /// What the arguments refer to, borrowed.
    #[inline]
    pub(crate) fn owners(&self) -> impl Iterator<Item = OwnerRef<'_>> + Clone {
        self.keep_slice().iter().map(Held::as_ref)
    }

    /// The one thing the arguments refer to, if there is exactly one.
    #[inline]
    pub(crate) fn only_owner(&self) -> Option<OwnerRef<'_>> {
        match self.keep_slice() {
            [one] => Some(one.as_ref()),
            _ => None,
        }
    }

    /// The argument values alone, for parameters kept past the call that made them
    /// ([`NodeParams`](crate::NodeParams), which holds the owners itself): what they refer to is
    /// let go (borrowed entries) or dropped (held ones).
    pub(crate) fn into_values(mut self) -> KernelArgs<'static> {
        let mut out = KernelArgs::default();
        match (&mut *self.more, self.nvalues) {
            (Some(more), SPILLED) => {
                more_of(&mut out.more).values = std::mem::take(&mut more.values);
                out.nvalues = SPILLED;
                out.owns = true;
            }
            (_, n) => {
                let n = usize::from(n).min(INLINE_VALUES);
                for (o, v) in out.values.iter_mut().zip(&self.values[..n]) {
                    // SAFETY: `values[..n]` are initialised; each is moved once, and `self`'s
                    // count is cleared below, so `self` neither reads nor drops them again.
                    let v = unsafe { v.assume_init_read() };
                    out.owns |= matches!(v, ArgValue::Heap { .. });
                    o.write(v);
                }
                self.nvalues = 0;
                // `out.nvalues` only now that all are written: nothing above can unwind.
                out.nvalues = n as u8;
            }
        }
        // `self` drops what it refers to as it goes.
        out
    }

    /// Writes the `void**` array `cuLaunchKernel` and kernel nodes take into `out` (up to 16
    /// arguments, no allocation) or `spill`, and returns it: null without arguments, else valid
    /// while `self`, `out` and `spill` are borrowed. Only the arguments' entries of `out` are
    /// written (the array starts uninitialised: zeroing 128 bytes per launch showed up in the
    /// instruction counts).
    #[inline]
    pub(crate) fn fill_pointers(
        &self,
        out: &mut ArgPointers,
        spill: &mut Vec<*mut std::ffi::c_void>,
    ) -> *mut *mut std::ffi::c_void {
        let values = self.value_slice();
        let n = values.len();
        if n == 0 {
            std::ptr::null_mut()
        } else if n <= out.len() {
            for (o, v) in out.iter_mut().zip(values) {
                o.write(v.ptr());
            }
            out.as_mut_ptr().cast()
        } else {
            spill.extend(values.iter().map(ArgValue::ptr));
            spill.as_mut_ptr()
        }
    }

    /// The argument pointers, collected (for tests).
    #[cfg(test)]
    pub(crate) fn pointers(&self) -> Vec<*mut std::ffi::c_void> {
        self.value_slice().iter().map(|v| v.ptr()).collect()
    }
}

/// One argument's bytes: inline when the type fits 16 bytes at an alignment of at most 16 (every
/// primitive, pointer and `float4`-like type), else in an allocation with the type's layout.
enum ArgValue {
    Inline(Inline),
    Heap { ptr: NonNull<u8>, layout: Layout },
}

/// Inline storage for a small argument. Bytes, not `u8`s: a value's padding bytes are
/// uninitialised after it is written, and a list moves its values (copying a `[u8; 16]` with
/// uninitialised bytes would be undefined behaviour; `MaybeUninit` bytes may be).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Inline([MaybeUninit<u8>; 16]);

impl ArgValue {
    fn new<T: DeviceCopy>(value: T) -> Self {
        let t = Layout::new::<T>();
        if t.size() <= std::mem::size_of::<Inline>() && t.align() <= std::mem::align_of::<Inline>()
        {
            let mut inline = Inline([MaybeUninit::new(0); 16]);
            // SAFETY: `inline` holds 16 bytes aligned to 16, enough for `T` (checked above).
            unsafe { inline.0.as_mut_ptr().cast::<T>().write(value) };
            return ArgValue::Inline(inline);
        }
        // A zero-sized `T` gets the layout of `(T, u8)`: at least one byte, aligned for `T`.
        let layout = if t.size() == 0 {
            Layout::new::<(T, u8)>()
        } else {
            t
        };
        // SAFETY: `layout` has a non-zero size (ensured above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        debug_assert!(layout.size() >= t.size() && layout.align() >= t.align());
        // SAFETY: `ptr` is a fresh allocation of at least `size_of::<T>()` bytes, aligned to
        // `align_of::<T>()` (its layout was made from `T`'s), so it is valid for writing a `T`.
        unsafe { ptr.as_ptr().cast::<T>().write(value) };
        ArgValue::Heap { ptr, layout }
    }

    /// Where the argument's bytes are, for the driver (valid while `self` is not moved).
    fn ptr(&self) -> *mut std::ffi::c_void {
        match self {
            ArgValue::Inline(i) => i.0.as_ptr() as *mut std::ffi::c_void,
            ArgValue::Heap { ptr, .. } => ptr.as_ptr().cast(),
        }
    }
}

impl Drop for ArgValue {
    fn drop(&mut self) {
        if let ArgValue::Heap { ptr, layout } = self {
            // SAFETY: `ptr` was allocated in `new` with exactly `layout` and is freed once, here.
            // The value in it is `DeviceCopy`, hence `Copy`: it has no destructor to run.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), *layout) };
        }
    }
}

// SAFETY: an `ArgValue` owns its allocation alone and holds the bytes of a `DeviceCopy` value,
// which is `Send + Sync` and has no interior mutability; it is only read through `&self`.
unsafe impl Send for ArgValue {}
// SAFETY: as above.
unsafe impl Sync for ArgValue {}

impl<T: DeviceCopy> KernelArg for T {
    #[inline]
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(self);
    }
}

/// A C++ `bool` parameter: one byte, 0 or 1.
impl KernelArg for bool {
    #[inline]
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(u8::from(self));
    }
}

impl<T: DeviceCopy> KernelArg for &DeviceBuffer<T> {
    #[inline(always)]
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(self.device_ptr());
        args.keep_borrowed(OwnerRef::Alloc(&self.alloc));
    }
}

impl<T: DeviceCopy> KernelArg for &mut DeviceBuffer<T> {
    #[inline]
    fn push_to<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        (&*self).push_to(args);
    }
}

/// Checks `config`'s attributes (a programmatic dependent launch among them) against the device and `function`, and returns them in the driver's terms (see
/// [`LaunchAttributes`] for what is refused). Binds the function's context.
#[cold]
#[inline(never)]
pub(crate) fn check_attributes(
    function: &super::Function,
    config: &LaunchConfig,
) -> crate::Result<crate::driver::launch::RawAttributes> {
    use crate::driver::device::attribute;
    use crate::error::{Error, Refusal};
    use cudarc::driver::sys::CUdevice_attribute::*;
    let refuse = |why: String| {
        Err(Error::invalid(
            Refusal::Attribute,
            format!("kernel `{}`: {why}", function.name()),
        ))
    };
    let ctx = &function.module.ctx;
    ctx.bind()?;
    let device = function.device;
    let a = config.attributes;
    let programmatic = a.is_dependent();
    let major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)?;
    if let Some((x, y, z)) = a.cluster() {
        if major < 9 {
            return refuse(format!(
                "thread-block clusters need compute capability 9.0; this device has {major}.x"
            ));
        }
        let (gx, gy, gz) = config.grid;
        if x == 0 || y == 0 || z == 0 || gx % x != 0 || gy % y != 0 || gz % z != 0 {
            return refuse(format!(
                "a cluster of {:?} blocks does not divide the grid {:?}: each cluster dimension must be at least 1 and divide the grid's",
                (x, y, z),
                config.grid
            ));
        }
        let blocks = u64::from(x) * u64::from(y) * u64::from(z);
        if blocks > 8 {
            return refuse(format!(
                "a cluster of {blocks} blocks is more than the portable 8"
            ));
        }
    }
    if let Some(p) = a.priority() {
        // SAFETY: the context is bound above.
        let (least, greatest) = unsafe { crate::driver::launch::priority_range(ctx) }?;
        if p < greatest || p > least {
            return refuse(format!(
                "priority {p} is outside the context's range {greatest} (highest) ..= {least} (lowest)"
            ));
        }
    }
    if a.cooperative() {
        if attribute(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, device)? == 0 {
            return refuse("this device cannot launch cooperative grids".into());
        }
        let threads =
            u64::from(config.block.0) * u64::from(config.block.1) * u64::from(config.block.2);
        let blocks = u64::from(config.grid.0) * u64::from(config.grid.1) * u64::from(config.grid.2);
        let sms = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)?.max(0) as u64;
        let per_sm = match u32::try_from(threads) {
            // SAFETY: the function is live (its module is held by `function`) and its context
            // is bound above.
            Ok(t) => u64::from(unsafe {
                crate::driver::launch::blocks_per_multiprocessor(
                    function.raw,
                    t,
                    config.shared_mem_bytes,
                )
            }?),
            Err(_) => 0,
        };
        if blocks > per_sm * sms {
            return refuse(format!(
                "a cooperative grid of {blocks} blocks does not fit the device at once: it holds {per_sm} blocks of {threads} threads per multiprocessor, {} in all",
                per_sm * sms
            ));
        }
    }
    if programmatic && major < 9 {
        return refuse(format!(
            "programmatic dependent launch needs compute capability 9.0; this device has {major}.x"
        ));
    }
    Ok(crate::driver::launch::RawAttributes {
        cluster: a.cluster(),
        priority: a.priority(),
        cooperative: a.cooperative(),
        programmatic,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn attributes_become_the_drivers_array() {
        use cudarc::driver::sys::CUlaunchAttributeID::*;
        let plain = LaunchConfig::single();
        assert!(plain.attributes.is_empty());
        assert_eq!(plain.attributes, LaunchAttributes::default());
        let c = LaunchConfig::for_num_elems(1024)
            .with_cluster((2, 1, 1))
            .with_priority(-3)
            .with_cooperative(true);
        assert!(!c.attributes.is_empty() && !c.attributes.is_dependent());
        let raw = crate::driver::launch::RawAttributes {
            cluster: c.attributes.cluster(),
            priority: c.attributes.priority(),
            cooperative: c.attributes.cooperative(),
            programmatic: true,
        };
        let (array, n) = raw.to_array();
        assert_eq!(n, 4);
        let ids: Vec<_> = array[..n].iter().map(|a| a.id).collect();
        assert_eq!(
            ids,
            [
                CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                CU_LAUNCH_ATTRIBUTE_PRIORITY,
                CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            ]
        );
        // SAFETY: each entry's value was written through the field its id names.
        unsafe {
            assert_eq!(array[0].value.clusterDim.x, 2);
            assert_eq!(array[0].value.clusterDim.y, 1);
            assert_eq!(array[1].value.priority, -3);
            assert_eq!(array[2].value.cooperative, 1);
            assert_eq!(array[3].value.programmaticStreamSerializationAllowed, 1);
        }
        let (_, none) = crate::driver::launch::RawAttributes::default().to_array();
        assert_eq!(none, 0);
        // SAFETY: no kernel is launched with it; the flag only.
        let dependent = unsafe { LaunchConfig::single().with_dependent_launch() };
        assert!(dependent.attributes.is_dependent() && !dependent.attributes.is_empty());
    }

    use super::*;

    #[test]
    fn dropped_arguments_release_what_they_hold() {
        // What `Drop` must free in its slow path: kept owners (inline and spilled), arguments
        // stored on the heap, and a spilled list of values.
        for (owners, values) in [(1usize, 0usize), (3, 0), (4, 0), (0, 9), (2, 12), (5, 12)] {
            let held: Owner = std::sync::Arc::new(0u8);
            let mut args = KernelArgs::new();
            for _ in 0..owners {
                args.keep_owned(held.clone());
            }
            for i in 0..values {
                args.push_value(i as u64);
            }
            // One argument too large to store inline (heap-stored), when there are values.
            if values > 0 {
                args.push_value([7u64; 8]);
            }
            assert_eq!(std::sync::Arc::strong_count(&held), 1 + owners);
            drop(args);
            assert_eq!(
                std::sync::Arc::strong_count(&held),
                1,
                "{owners} owners, {values} values: the owners were not released"
            );
        }
        // An empty list takes the inline path and holds nothing.
        let empty = KernelArgs::new();
        assert!(empty.is_empty() && empty.keep_slice().is_empty() && !empty.owns);
        drop(empty);
    }

    #[test]
    fn borrowed_owners_are_counted_by_no_one_and_values_outlive_them() {
        let held: Owner = std::sync::Arc::new(0u8);
        let kept: Owner = std::sync::Arc::new(1u8);
        let mut args = KernelArgs::new();
        args.keep_borrowed(OwnerRef::Other(&held));
        args.push_value(1u32);
        assert!(!args.owns, "borrowing alone leaves nothing to free");
        assert_eq!(
            std::sync::Arc::strong_count(&held),
            1,
            "borrowing counts nothing"
        );
        assert!(args.only_owner().is_some());
        args.keep_owned(kept.clone());
        assert!(args.owns && args.only_owner().is_none());
        assert_eq!(args.owners().count(), 2);
        let values = args.into_values();
        assert_eq!((values.len(), values.owners().count()), (1, 0));
        assert_eq!(
            std::sync::Arc::strong_count(&kept),
            1,
            "the held owner was dropped"
        );
        // SAFETY: the one pointer points at the `u32` pushed.
        assert_eq!(unsafe { *(values.pointers()[0] as *const u32) }, 1);
    }

    #[test]
    fn an_argument_that_panics_while_pushed_leaves_the_list_to_unwinding() {
        struct Bad<'b>(&'b Owner);
        impl KernelArg for Bad<'_> {
            fn push_to<'a>(self, args: &mut KernelArgs<'a>)
            where
                Self: 'a,
            {
                args.keep_owned(self.0.clone());
                args.push_value([1u64; 8]);
                panic!("an argument's push_to panicked");
            }
        }
        let held: Owner = std::sync::Arc::new(0u8);
        let pushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            KernelArgs::new().arg(1u32).arg(Bad(&held))
        }));
        assert!(pushed.is_err());
        assert_eq!(
            std::sync::Arc::strong_count(&held),
            1,
            "unwinding dropped the arguments and what they held"
        );
    }

    #[test]
    fn a_value_stored_on_the_heap_is_freed_by_a_list_that_did_not_spill() {
        let mut args = KernelArgs::new();
        args.push_value(1u8);
        assert!(!args.owns);
        args.push_value([7u64; 8]);
        assert!(args.nvalues != SPILLED && args.more.is_none());
        // Without the flag `Drop` would skip the list and leak the value's allocation.
        assert!(args.owns, "a heap-stored value marks the list as owning");
        assert!(
            args.into_values().owns,
            "and so do the values taken out of it"
        );
    }

    #[test]
    fn lists_past_their_room_keep_order_owners_and_values_taken_out() {
        let held: Owner = std::sync::Arc::new(0u8);
        let other: Owner = std::sync::Arc::new(1u8);
        for (values, owners) in [(8usize, 3usize), (9, 3), (8, 4), (20, 7)] {
            let mut args = KernelArgs::new();
            for i in 0..values {
                args.push_value(i as u32);
                if i == 1 {
                    // A heap-stored value among them, moved with the rest when they spill.
                    args.push_value([9u64; 4]);
                }
            }
            for i in 0..owners {
                if i % 2 == 0 {
                    args.keep_borrowed(OwnerRef::Other(&held));
                } else {
                    args.keep_owned(other.clone());
                }
            }
            assert_eq!((args.len(), args.owners().count()), (values + 1, owners));
            assert_eq!(args.nvalues == SPILLED, values + 1 > INLINE_VALUES);
            assert_eq!(args.nkeep == SPILLED, owners > INLINE_KEEP);
            let read = |a: &KernelArgs<'_>| {
                let p = a.pointers();
                // SAFETY: the pointers point at the values pushed, in order: `u32`s with the
                // array second.
                unsafe {
                    assert_eq!(*(p[2] as *const [u64; 4]), [9; 4]);
                    let mut got: Vec<u32> = vec![*(p[0] as *const u32), *(p[1] as *const u32)];
                    got.extend(p[3..].iter().map(|q| *(*q as *const u32)));
                    got
                }
            };
            assert_eq!(read(&args), (0..values as u32).collect::<Vec<_>>());
            let taken = args.into_values();
            assert_eq!(read(&taken), (0..values as u32).collect::<Vec<_>>());
            assert_eq!(taken.owners().count(), 0);
            assert_eq!(
                std::sync::Arc::strong_count(&other),
                1,
                "{values} values, {owners} owners: the held owners were dropped with the list"
            );
        }
    }

    #[test]
    fn wider_argument_types_are_stored_as_their_c_types() {
        let args = KernelArgs::new()
            .arg(true)
            .arg(false)
            .arg(usize::MAX)
            .arg(-3isize)
            .arg([1u32, 2, 3]);
        let p = args.pointers();
        // SAFETY: each pointer points at the value stored for it, of the C type named.
        unsafe {
            assert_eq!(*(p[0] as *const u8), 1);
            assert_eq!(*(p[1] as *const u8), 0);
            assert_eq!(*(p[2] as *const usize), usize::MAX);
            assert_eq!(*(p[3] as *const isize), -3);
            assert_eq!(*(p[4] as *const [u32; 3]), [1, 2, 3]);
        }
    }

    #[cfg(feature = "half")]
    #[test]
    fn half_floats_are_their_16_bits() {
        let args = KernelArgs::new()
            .arg(half::f16::from_f32(1.5))
            .arg(half::bf16::from_f32(-2.0));
        let p = args.pointers();
        // SAFETY: each pointer points at the 2-byte value stored for it.
        unsafe {
            assert_eq!(*(p[0] as *const u16), half::f16::from_f32(1.5).to_bits());
            assert_eq!(*(p[1] as *const u16), half::bf16::from_f32(-2.0).to_bits());
        }
    }

    #[test]
    fn filled_pointers_are_null_on_the_stack_or_spilled() {
        let mut out = NO_POINTERS;
        let mut spill = Vec::new();
        assert!(KernelArgs::new()
            .fill_pointers(&mut out, &mut spill)
            .is_null());
        let few = KernelArgs::new().arg(1u32).arg(2u64);
        let p = few.fill_pointers(&mut out, &mut spill);
        assert_eq!(p, out.as_mut_ptr().cast());
        // SAFETY: `fill_pointers` wrote the first two entries.
        let written = unsafe { [out[0].assume_init(), out[1].assume_init()] };
        assert_eq!(&written[..], &few.pointers()[..]);
        assert!(spill.is_empty());
        let mut many = KernelArgs::new();
        for i in 0..20u32 {
            many.push(i);
        }
        let p = many.fill_pointers(&mut out, &mut spill);
        assert_eq!(p, spill.as_mut_ptr());
        assert_eq!(&spill[..], &many.pointers()[..]);
        // SAFETY: each pointer points at the u32 stored for it.
        let read: Vec<u32> = spill
            .iter()
            .map(|q| unsafe { *(*q as *const u32) })
            .collect();
        assert_eq!(read, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn values_are_stored_in_order() {
        let args = KernelArgs::new().arg(7i32).arg(2.5f32).arg(u64::MAX);
        assert_eq!(args.len(), 3);
        let p = args.pointers();
        unsafe {
            assert_eq!(*(p[0] as *const i32), 7);
            assert_eq!(*(p[1] as *const f32), 2.5);
            assert_eq!(*(p[2] as *const u64), u64::MAX);
        }
    }

    /// A device type with a 64-byte alignment, as a `__align__(64)` CUDA struct.
    #[derive(Debug, Clone, Copy, PartialEq)]
    #[repr(C, align(64))]
    struct Wide {
        a: [u64; 3],
        b: f32,
    }
    // SAFETY: plain numbers (every bit pattern valid), no pointers, `#[repr(C)]`; the padding is
    // never read as a value.
    unsafe impl DeviceCopy for Wide {}

    /// A 16-byte-aligned type, as CUDA's `float4`.
    #[derive(Debug, Clone, Copy, PartialEq)]
    #[repr(C, align(16))]
    struct Float4([f32; 4]);
    // SAFETY: as above.
    unsafe impl DeviceCopy for Float4 {}

    #[test]
    fn over_aligned_values_are_stored_aligned() {
        let wide = Wide {
            a: [1, u64::MAX, 3],
            b: -0.5,
        };
        let f4 = Float4([1.0, 2.0, 3.0, 4.0]);
        // Several rounds, so a misaligned slot cannot pass by chance.
        let mut args = KernelArgs::new();
        for _ in 0..8 {
            args.push(7u8).push(wide).push(3u16).push(f4);
        }
        assert_eq!(args.len(), 32);
        let p = args.pointers();
        for chunk in p.chunks(4) {
            assert_eq!(
                chunk[1] as usize % 64,
                0,
                "a 64-aligned argument at {:p}",
                chunk[1]
            );
            assert_eq!(
                chunk[3] as usize % 16,
                0,
                "a 16-aligned argument at {:p}",
                chunk[3]
            );
            // SAFETY: each pointer points at the argument pushed in that place, aligned for its
            // type (asserted above) and alive while `args` is.
            unsafe {
                assert_eq!(*(chunk[0] as *const u8), 7);
                assert_eq!(*(chunk[1] as *const Wide), wide);
                assert_eq!(*(chunk[2] as *const u16), 3);
                assert_eq!(*(chunk[3] as *const Float4), f4);
            }
        }
    }

    #[test]
    fn zero_sized_values_get_a_valid_pointer() {
        #[derive(Clone, Copy)]
        struct Nothing;
        // SAFETY: a zero-sized type has no bytes to be invalid.
        unsafe impl DeviceCopy for Nothing {}
        let args = KernelArgs::new().arg(Nothing).arg(5i64);
        let p = args.pointers();
        assert!(!p[0].is_null());
        // SAFETY: the pointer points at the `i64` pushed second.
        assert_eq!(unsafe { *(p[1] as *const i64) }, 5);
    }

    #[test]
    fn config_covers_elements() {
        assert_eq!(LaunchConfig::for_num_elems(1000).grid.0, 4);
        assert_eq!(LaunchConfig::for_num_elems(0).grid.0, 1);
    }
}
