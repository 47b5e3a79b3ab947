//! Typed kernels: a kernel's parameter list declared once (`unsafe`), then checked launches.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use smallvec::SmallVec;

use super::{DeviceBuffer, DeviceCopy, Function, KernelArg, KernelArgs, Module};
use crate::driver;
use crate::driver::graph::Owner;
use crate::driver::memory::DeviceAlloc;
use crate::error::{Error, Refusal, Result};

/// The traits that keep [`Signature`], [`KernelParam`], [`ArgFor`] and [`ArgsFor`] closed: the
/// safety of a typed launch rests on every argument being one this crate knows how to pass.
pub(crate) mod sealed {
    use super::KernelArgs;

    /// Seals [`WaitsForPredecessor`](super::WaitsForPredecessor).
    pub trait Waits {}

    /// A parameter type and its size in the kernel's parameter buffer.
    pub trait Param {
        /// `sizeof` of the C parameter type.
        const SIZE: usize;
    }

    /// A tuple of parameter types.
    pub trait Signature {
        /// The size of each parameter, in order.
        const SIZES: &'static [usize];
    }

    /// A value that may be passed for a parameter of type `P`.
    pub trait ArgFor<P> {
        /// Appends this value as a `P` parameter.
        fn push_as<'a>(self, args: &mut KernelArgs<'a>)
        where
            Self: 'a;
        /// Points `refs` at this value's bytes as a `P` parameter, and at what it keeps alive.
        fn refs_as<'a>(&'a self, refs: &mut super::ArgRefs<'a>);
    }

    /// A tuple of arguments for the signature `S`.
    pub trait ArgsFor<S> {
        /// Appends every argument, in order.
        fn push_all<'a>(self, args: &mut KernelArgs<'a>)
        where
            Self: 'a;
        /// Points `refs` at every argument, in order.
        fn refs_all<'a>(&'a self, refs: &mut super::ArgRefs<'a>);
    }
}

/// A type that can appear in a kernel's parameter list ([`Kernel`]), as the C++ kernel declares
/// it:
///
/// | C++ parameter | Rust type | the argument given for it |
/// | --- | --- | --- |
/// | `int`, `float`, `unsigned long long`, a `struct` by value … | the [`DeviceCopy`] type (`i32`, `f32`, `u64`, your `#[repr(C)]` struct) | the value |
/// | `bool` | `bool` | a `bool` |
/// | `T*`, `const T*` | `*mut T`, `*const T` | `&DeviceBuffer<T>` (or a [`slice`](DeviceBuffer::slice) of one), or in a graph a `&`[`GraphBuffer<T>`](crate::GraphBuffer) |
/// | `Slice<T>` (`{ T* ptr; unsigned long long len; }`) | [`Slice<T>`] | `&DeviceBuffer<T>` or `&GraphBuffer<T>`: its address and length |
/// | `ConstSlice<T>` (`{ const T* ptr; unsigned long long len; }`) | [`ConstSlice<T>`] | as for `Slice<T>` |
/// | `cudaGraphConditionalHandle` | [`ConditionalHandle`](crate::ConditionalHandle) | the handle |
/// | `cudaGraphExec_t` | [`DeviceGraph`](crate::DeviceGraph) | the device graph (by value or reference) |
///
/// Sealed: the safety of a typed launch rests on each argument being one the crate can pass.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kernel parameter type",
    label = "not a kernel parameter type",
    note = "parameter types are `DeviceCopy` values (`i32`, `f32`, `#[repr(C)]` structs), `bool`, `*mut T` / `*const T` / `Slice<T>` / `ConstSlice<T>` (given a `&DeviceBuffer<T>`), `ConditionalHandle` and `DeviceGraph`"
)]
pub trait KernelParam: sealed::Param {}

impl<T: DeviceCopy> sealed::Param for T {
    const SIZE: usize = std::mem::size_of::<T>();
}
impl<T: DeviceCopy> KernelParam for T {}
impl<T: DeviceCopy> sealed::Param for *mut T {
    const SIZE: usize = std::mem::size_of::<u64>();
}
impl<T: DeviceCopy> KernelParam for *mut T {}
impl<T: DeviceCopy> sealed::Param for *const T {
    const SIZE: usize = std::mem::size_of::<u64>();
}
impl<T: DeviceCopy> KernelParam for *const T {}
impl sealed::Param for bool {
    const SIZE: usize = 1;
}
impl KernelParam for bool {}

/// A value that can be given for a kernel parameter of type `P` (see [`KernelParam`] for the
/// table). Sealed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be passed for a kernel parameter of type `{P}`",
    label = "expected an argument for a `{P}` parameter",
    note = "a `*mut T` / `*const T` parameter takes a `&DeviceBuffer<T>` of the same `T`; a value parameter takes a value of exactly its type (write `3u32`, not `3i32`, for a `u32`)"
)]
pub trait ArgFor<P: KernelParam>: KernelArg + sealed::ArgFor<P> {}

/// Implements [`ArgFor`] by the argument's [`KernelArg`] form. (`ArgFor` keeps `KernelArg` as a
/// supertrait: it lets coherence see that a one-tuple is never itself an argument, so a
/// one-parameter kernel takes its argument bare or in a tuple.)
macro_rules! arg_for {
    ($( [$($g:tt)*] $a:ty => $p:ty, |$this:ident, $refs:ident| $body:expr; )*) => {$(
        impl<$($g)*> $crate::runtime::kernel_sealed::ArgFor<$p> for $a {
            fn push_as<'a>(self, args: &mut $crate::KernelArgs<'a>)
            where
                Self: 'a,
            {
                $crate::KernelArg::push_to(self, args);
            }
            fn refs_as<'a>(&'a self, $refs: &mut $crate::runtime::ArgRefs<'a>) {
                let $this = self;
                $body
            }
        }
        impl<$($g)*> $crate::ArgFor<$p> for $a {}
    )*};
}
pub(crate) use arg_for;

arg_for! {
    // A value is passed from where it is: the caller's tuple, alive until the call returns.
    [T: DeviceCopy] T => T, |v, r| r.value(v);
    // A C++ `bool` is one byte, 0 or 1: Rust's `bool` exactly.
    [] bool => bool, |v, r| r.value(v);
    [T: DeviceCopy] &DeviceBuffer<T> => *mut T, |b, r| r.buffer(&b.alloc);
    [T: DeviceCopy] &DeviceBuffer<T> => *const T, |b, r| r.buffer(&b.alloc);
    [T: DeviceCopy] &mut DeviceBuffer<T> => *mut T, |b, r| r.buffer(&b.alloc);
    [T: DeviceCopy] &mut DeviceBuffer<T> => *const T, |b, r| r.buffer(&b.alloc);
}

/// A buffer passed with its length: the kernel parameter
/// `template <typename T> struct Slice { T* ptr; unsigned long long len; };` (16 bytes), for
/// kernels that must know how many elements they may touch. A typed kernel whose bounds depend
/// on a separate length argument (`fill(int* p, int n, int v)`) cannot promise to stay in bounds
/// of every buffer and `n` it is given; one that takes a `Slice<int>` and loops to `p.len` can.
/// The argument is a `&DeviceBuffer<T>` (or a [`slice`](DeviceBuffer::slice) of one).
///
/// A marker type: it appears in signatures, never as a value.
///
/// ```text
/// template <typename T> struct Slice { T* ptr; unsigned long long len; };
/// extern "C" __global__ void fill(Slice<int> p, int v) {
///     for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < p.len;
///          i += blockDim.x * gridDim.x)
///         p.ptr[i] = v;
/// }
/// ```
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(module: &Module, device: &Device, stream: &Stream) -> cuda_graph::Result<()> {
/// // SAFETY: `fill` (above) writes p.ptr[i] for i < p.len only.
/// let fill = unsafe { module.kernel::<(Slice<i32>, i32)>("fill")? };
/// let buf = device.alloc_zeroed::<i32>(1000)?;
/// stream.launch(&fill, LaunchConfig::for_num_elems(1000), (&buf, 7))?;
/// stream.launch(&fill, LaunchConfig::for_num_elems(100), (&buf.slice(..100)?, 8))?;
/// # Ok(()) }
/// ```
pub struct Slice<T>(PhantomData<fn() -> T>, std::convert::Infallible);

impl<T> std::fmt::Debug for Slice<T> {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {}
    }
}

/// The bytes of a `Slice<T>` argument.
#[derive(Clone, Copy)]
#[repr(C)]
struct RawSlice {
    ptr: u64,
    len: u64,
}
// SAFETY: two integers, `#[repr(C)]`, no padding; the C struct `{ T* ptr; unsigned long long
// len; }` on the 64-bit targets CUDA supports.
unsafe impl DeviceCopy for RawSlice {}

impl<T: DeviceCopy> sealed::Param for Slice<T> {
    const SIZE: usize = std::mem::size_of::<RawSlice>();
}
impl<T: DeviceCopy> KernelParam for Slice<T> {}
impl<T: DeviceCopy> sealed::ArgFor<Slice<T>> for &DeviceBuffer<T> {
    fn push_as<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        args.push_value(RawSlice {
            ptr: self.device_ptr(),
            len: self.len() as u64,
        });
        args.keep_borrowed(OwnerRef::Alloc(&self.alloc));
    }
    fn refs_as<'a>(&'a self, refs: &mut ArgRefs<'a>) {
        refs.slice(&self.alloc, self.len());
    }
}
impl<T: DeviceCopy> ArgFor<Slice<T>> for &DeviceBuffer<T> {}
impl<T: DeviceCopy> sealed::ArgFor<Slice<T>> for &mut DeviceBuffer<T> {
    fn push_as<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        sealed::ArgFor::<Slice<T>>::push_as(&*self, args);
    }
    fn refs_as<'a>(&'a self, refs: &mut ArgRefs<'a>) {
        refs.slice(&self.alloc, self.len());
    }
}
impl<T: DeviceCopy> ArgFor<Slice<T>> for &mut DeviceBuffer<T> {}

/// A read-only buffer passed with its length: the kernel parameter
/// `template <typename T> struct ConstSlice { const T* ptr; unsigned long long len; };` (16
/// bytes), the `const` twin of [`Slice<T>`]. Declared in a signature as `ConstSlice<T>` and
/// given a `&DeviceBuffer<T>` (or a [`GraphBuffer`](crate::GraphBuffer)).
///
/// ```cuda
/// template <typename T> struct ConstSlice { const T* ptr; unsigned long long len; };
/// extern "C" __global__ void sum(ConstSlice<float> x, float* out) { /* reads x.ptr[i], i < x.len */ }
/// ```
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(module: &Module, x: &DeviceBuffer<f32>, out: &DeviceBuffer<f32>, stream: &Stream) -> cuda_graph::Result<()> {
/// // SAFETY: `sum` (above) reads x.ptr[i] for i < x.len and writes out[0].
/// let sum = unsafe { module.kernel::<(ConstSlice<f32>, *mut f32)>("sum")? };
/// stream.launch(&sum, LaunchConfig::single(), (x, out))?;
/// # Ok(()) }
/// ```
pub struct ConstSlice<T>(PhantomData<fn() -> T>, std::convert::Infallible);

impl<T> std::fmt::Debug for ConstSlice<T> {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {}
    }
}

impl<T: DeviceCopy> sealed::Param for ConstSlice<T> {
    const SIZE: usize = std::mem::size_of::<RawSlice>();
}
impl<T: DeviceCopy> KernelParam for ConstSlice<T> {}
impl<T: DeviceCopy> sealed::ArgFor<ConstSlice<T>> for &DeviceBuffer<T> {
    fn push_as<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        sealed::ArgFor::<Slice<T>>::push_as(self, args);
    }
    fn refs_as<'a>(&'a self, refs: &mut ArgRefs<'a>) {
        refs.slice(&self.alloc, self.len());
    }
}
impl<T: DeviceCopy> ArgFor<ConstSlice<T>> for &DeviceBuffer<T> {}
impl<T: DeviceCopy> sealed::ArgFor<ConstSlice<T>> for &mut DeviceBuffer<T> {
    fn push_as<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        sealed::ArgFor::<Slice<T>>::push_as(&*self, args);
    }
    fn refs_as<'a>(&'a self, refs: &mut ArgRefs<'a>) {
        refs.slice(&self.alloc, self.len());
    }
}
impl<T: DeviceCopy> ArgFor<ConstSlice<T>> for &mut DeviceBuffer<T> {}

pub(crate) use crate::driver::graph::ledger::GraphUse;

/// The bytes of a `Slice<T>` or `ConstSlice<T>` argument pushed as a value (the untyped path
/// of typed arguments).
pub(crate) fn push_slice(args: &mut KernelArgs<'_>, ptr: u64, len: usize) {
    args.push_value(RawSlice {
        ptr,
        len: len as u64,
    });
}

/// A kernel's parameter list: a tuple of [`KernelParam`] types, `()` to `(P1, …, P12)`. Sealed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kernel signature",
    label = "expected a tuple of parameter types",
    note = "write the kernel's parameters as a tuple in order: `Kernel<(*mut f32, *const f32, u32)>` for `(float* y, const float* x, unsigned n)`, `Kernel<(*mut i32,)>` for one"
)]
pub trait Signature: sealed::Signature {}

/// Arguments for a kernel with the signature `S`: a tuple with one [`ArgFor`] value per
/// parameter, in order (a single argument may also be given without the tuple). Sealed.
#[diagnostic::on_unimplemented(
    message = "these arguments do not match the kernel's parameters `{S}`",
    label = "expected one argument per parameter of `{S}`, in order",
    note = "give a tuple with one argument per parameter: `(&y, &x, n)`; a `*mut T` parameter takes a `&DeviceBuffer<T>`, a value parameter its exact type; memory that exists only while a graph runs (`GraphAllocation`) is passed as its `view::<T>()`"
)]
pub trait ArgsFor<S: Signature>: sealed::ArgsFor<S> {}

macro_rules! signatures {
    ($( ( $($p:ident $a:ident),* ) )*) => {$(
        impl<$($p: KernelParam),*> sealed::Signature for ($($p,)*) {
            const SIZES: &'static [usize] = &[$(<$p as sealed::Param>::SIZE),*];
        }
        impl<$($p: KernelParam),*> Signature for ($($p,)*) {}
        impl<$($p: KernelParam, $a: ArgFor<$p>),*> sealed::ArgsFor<($($p,)*)> for ($($a,)*) {
            #[allow(non_snake_case, unused_variables)]
            fn push_all<'a>(self, args: &mut KernelArgs<'a>)
            where
                Self: 'a,
            {
                let ($($a,)*) = self;
                $( sealed::ArgFor::<$p>::push_as($a, args); )*
            }
            #[allow(non_snake_case, unused_variables)]
            fn refs_all<'a>(&'a self, refs: &mut ArgRefs<'a>) {
                let ($($a,)*) = self;
                $( sealed::ArgFor::<$p>::refs_as($a, refs); )*
            }
        }
        impl<$($p: KernelParam, $a: ArgFor<$p>),*> ArgsFor<($($p,)*)> for ($($a,)*) {}
    )*};
}

signatures! {
    ()
    (P1 A1)
    (P1 A1, P2 A2)
    (P1 A1, P2 A2, P3 A3)
    (P1 A1, P2 A2, P3 A3, P4 A4)
    (P1 A1, P2 A2, P3 A3, P4 A4, P5 A5)
    (P1 A1, P2 A2, P3 A3, P4 A4, P5 A5, P6 A6)
    (P1 A1, P2 A2, P3 A3, P4 A4, P5 A5, P6 A6, P7 A7)
    (P1 A1, P2 A2, P3 A3, P4 A4, P5 A5, P6 A6, P7 A7, P8 A8)
    (P1 A1, P2 A2, P3 A3, P4 A4, P5 A5, P6 A6, P7 A7, P8 A8, P9 A9)
    (P1 A1, P2 A2, P3 A3, P4 A4, P5 A5, P6 A6, P7 A7, P8 A8, P9 A9, P10 A10)
    (P1 A1, P2 A2, P3 A3, P4 A4, P5 A5, P6 A6, P7 A7, P8 A8, P9 A9, P10 A10, P11 A11)
    (P1 A1, P2 A2, P3 A3, P4 A4, P5 A5, P6 A6, P7 A7, P8 A8, P9 A9, P10 A10, P11 A11, P12 A12)
}

/// A single argument for a one-parameter kernel, without the tuple: `launch(&k, cfg, &buf)`.
impl<P: KernelParam, A: ArgFor<P>> sealed::ArgsFor<(P,)> for A {
    fn push_all<'a>(self, args: &mut KernelArgs<'a>)
    where
        Self: 'a,
    {
        sealed::ArgFor::<P>::push_as(self, args);
    }
    fn refs_all<'a>(&'a self, refs: &mut ArgRefs<'a>) {
        sealed::ArgFor::<P>::refs_as(self, refs);
    }
}
impl<P: KernelParam, A: ArgFor<P>> ArgsFor<(P,)> for A {}

/// A kernel whose parameter list is declared: `Kernel<(*mut f32, *const f32, u32)>` for
/// `__global__ void saxpy(float* y, const float* x, unsigned n)`. Launching it
/// ([`Stream::launch`](crate::Stream::launch), a capture's
/// [`launch`](crate::GraphBuilder::launch), [`GraphDefinition::add_kernel`](crate::GraphDefinition::add_kernel),
/// [`NodeParams::kernel`](crate::NodeParams::kernel)) is safe: the arguments are checked against
/// the declaration at compile time, buffers passed are kept alive by every graph that uses
/// them, and a buffer (or the kernel's module) of another device than the stream's or graph's is
/// an [`Error::InvalidArgument`] (peer access is not assumed).
///
/// Made by [`Module::kernel`] or [`Function::typed`] — the one `unsafe` step, where the caller
/// promises that the declaration is the kernel's and that the kernel stays within what it is
/// given. Where the driver can tell (12.4+), the declaration is also checked against the
/// kernel's parameter count and sizes. See [`KernelParam`] for the parameter types.
///
/// `Clone`, `Send + Sync`; it keeps its module loaded.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(module: &Module, stream: &Stream) -> cuda_graph::Result<()> {
/// // SAFETY: `affine(int* p, int m, int b)` sets p[0] = p[0] * m + b: one element.
/// let affine = unsafe { module.kernel::<(*mut i32, i32, i32)>("affine")? };
/// let buf = stream.device().alloc_zeroed::<i32>(1)?;
/// stream.launch(&affine, LaunchConfig::single(), (&buf, 3, 1))?;
/// // stream.launch(&affine, LaunchConfig::single(), (&buf, 3))?; // does not compile
/// # Ok(()) }
/// ```
pub struct Kernel<S> {
    function: Function,
    sig: PhantomData<fn(S)>,
}

impl<S> Clone for Kernel<S> {
    fn clone(&self) -> Self {
        Kernel {
            function: self.function.clone(),
            sig: PhantomData,
        }
    }
}

impl<S> std::fmt::Debug for Kernel<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.function.name())
            .field("signature", &std::any::type_name::<S>())
            .finish()
    }
}

impl<S: Signature> Kernel<S> {
    /// The untyped function, for [`launch_unchecked`](crate::Stream::launch_unchecked) and
    /// read-back comparisons.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(k: &Kernel<(*mut i32,)>) {
    /// println!("{}", k.function().name());
    /// # }
    /// ```
    pub fn function(&self) -> &Function {
        &self.function
    }

    /// The arguments `args` collected as [`KernelArgs`] (for the `unchecked` entry points, or to
    /// inspect them).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(k: &Kernel<(*mut i32, i32)>, buf: &DeviceBuffer<i32>) {
    /// let args = k.args((buf, 7));
    /// assert_eq!(args.len(), 2);
    /// # }
    /// ```
    pub fn args<'a>(&self, args: impl ArgsFor<S> + 'a) -> KernelArgs<'a> {
        collect(args)
    }
}

impl<S: Signature> Kernel<S> {
    /// This kernel declared as one that waits for its predecessor, so that it may be launched
    /// as a programmatic dependent launch ([`Stream::launch_dependent`](crate::Stream::launch_dependent),
    /// [`GraphBuilder::launch_dependent`](crate::GraphBuilder::launch_dependent),
    /// [`GraphDefinition::add_dependent_kernel`](crate::GraphDefinition::add_dependent_kernel)):
    /// it may then begin while the kernel before it still runs, and its prologue overlaps that
    /// kernel's tail. Needs compute capability 9.0 (checked at the launch).
    ///
    /// # Safety
    /// Every thread block of the kernel calls `cudaGridDependencySynchronize()` (PTX
    /// `griddepcontrol.wait`) before it exits, and before its first read of memory a preceding
    /// kernel writes and its first write to memory a preceding kernel reads or writes: until
    /// that call returns, the kernel it depends on may still be running. (The wait before exit
    /// is what lets work ordered after the dependent kernel, a graph's later nodes and the free
    /// of memory the predecessor used, count on the predecessor having ended too. Calling
    /// `cudaTriggerProgrammaticLaunchCompletion()` in the predecessor is optional: it only lets
    /// the dependent begin earlier.)
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(module: &Module, stream: &Stream, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// // SAFETY: scale(float* p, unsigned n) writes p[0..n).
    /// let produce = unsafe { module.kernel::<(*mut f32, u32)>("produce")? };
    /// // SAFETY: as above; and `scale` calls cudaGridDependencySynchronize() before it touches p.
    /// let scale = unsafe { module.kernel::<(*mut f32, u32)>("scale")?.dependent() };
    /// let n = buf.len() as u32;
    /// stream.launch(&produce, LaunchConfig::for_num_elems(n), (buf, n))?;
    /// stream.launch_dependent(&scale, LaunchConfig::for_num_elems(n), (buf, n))?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn dependent(self) -> DependentKernel<S> {
        DependentKernel { kernel: self }
    }
}

/// A [`Kernel`] declared to wait for its predecessor before touching what the predecessor
/// touches ([`Kernel::dependent`], `unsafe`): only such a kernel can be a programmatic
/// dependent launch, whose beginning overlaps the end of the kernel before it. `Clone`,
/// `Send + Sync`.
///
/// ```compile_fail
/// # use cuda_graph::prelude::*;
/// # fn f(stream: &Stream, plain: &Kernel<(*mut i32,)>, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
/// // A kernel that has not declared the wait cannot be launched early:
/// stream.launch_dependent(plain, LaunchConfig::single(), buf)?;
/// # Ok(()) }
/// ```
pub struct DependentKernel<S> {
    kernel: Kernel<S>,
}

impl<S> Clone for DependentKernel<S> {
    fn clone(&self) -> Self {
        DependentKernel {
            kernel: self.kernel.clone(),
        }
    }
}

impl<S> std::fmt::Debug for DependentKernel<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DependentKernel")
            .field("kernel", &self.kernel)
            .finish()
    }
}

impl<S: Signature> DependentKernel<S> {
    /// The kernel itself, for plain (not programmatic) launches.
    pub fn kernel(&self) -> &Kernel<S> {
        &self.kernel
    }
}

/// A kernel that waits for its predecessor: what the `launch_dependent` methods take. Only
/// [`DependentKernel`] is one (made by the `unsafe` [`Kernel::dependent`]); sealed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has not declared that it waits for the kernel before it",
    label = "a programmatic dependent launch needs a `DependentKernel`",
    note = "a dependent launch begins before the kernel it follows has ended; declare the kernel's wait (cudaGridDependencySynchronize() before its first dependent access) with `unsafe {{ kernel.dependent() }}`, or launch it with `launch`"
)]
pub trait WaitsForPredecessor: sealed::Waits {
    /// The kernel's parameter list.
    type Sig: Signature;
    /// The kernel.
    fn waiting_kernel(&self) -> &Kernel<Self::Sig>;
}

impl<S: Signature> sealed::Waits for DependentKernel<S> {}
impl<S: Signature> WaitsForPredecessor for DependentKernel<S> {
    type Sig = S;
    fn waiting_kernel(&self) -> &Kernel<S> {
        &self.kernel
    }
}

/// What owns an argument's memory, borrowed for one launch or node.
#[derive(Clone, Copy)]
pub enum OwnerRef<'a> {
    /// A buffer's allocation.
    Alloc(&'a Arc<DeviceAlloc>),
    /// Anything else (a device graph's exec, an untyped argument's owner).
    Other(&'a Owner),
}

impl<'a> OwnerRef<'a> {
    /// The device allocation this is, if it is one.
    pub(crate) fn alloc(&self) -> Option<&'a DeviceAlloc> {
        match *self {
            OwnerRef::Alloc(alloc) => Some(alloc),
            OwnerRef::Other(owner) => owner.downcast_ref::<DeviceAlloc>(),
        }
    }

    /// The owner as a graph's shared entries take it
    /// ([`SharedRef`](crate::driver::graph::SharedRef)).
    #[inline]
    pub(crate) fn shared(&self) -> crate::driver::graph::SharedRef<'a> {
        match *self {
            OwnerRef::Alloc(alloc) => crate::driver::graph::SharedRef::new(alloc),
            OwnerRef::Other(owner) => crate::driver::graph::SharedRef::new(owner),
        }
    }

    /// A strong reference to the owner.
    pub(crate) fn owner(&self) -> Owner {
        match *self {
            OwnerRef::Alloc(alloc) => alloc.clone(),
            OwnerRef::Other(owner) => owner.clone(),
        }
    }
}

/// A typed launch's arguments as the driver takes them, gathered without allocating: a pointer
/// per parameter into the arguments themselves (or into `slices`, for `Slice<T>` headers), and
/// the owners to keep alive, borrowed. Made and used on one stack frame
/// ([`with_refs`]): the pointers are valid while the arguments and this value are.
pub struct ArgRefs<'a> {
    /// One pointer per parameter, the first `len` written (the driver reads as many as the
    /// kernel has parameters, which the signature makes `len`; the rest stay unwritten, as
    /// zeroing them cost a dozen stores per launch).
    ptrs: [std::mem::MaybeUninit<*mut c_void>; MAX_PARAMS],
    len: usize,
    /// Where the `Slice<T>` headers go: `MAX_PARAMS` of them in [`with_refs`]'s frame, only ever
    /// reached through this one raw pointer (so every header pointer handed to the driver stays
    /// valid); the first `nslices` written.
    slices: *mut RawSlice,
    nslices: usize,
    pub(crate) owners: SmallVec<[OwnerRef<'a>; 4]>,
    /// The graphs of the conditional handles among the arguments.
    handles: SmallVec<[u64; 1]>,
    /// The device the kernel runs on, and the first argument found on another (its device and
    /// what it is).
    device: i32,
    elsewhere: Option<(i32, &'static str)>,
    /// Whether an argument (a device graph, graph memory) may only be passed to a kernel in a
    /// graph.
    needs_graph: bool,
    /// The graph memory among the arguments.
    memory: SmallVec<[GraphUse; 1]>,
}

impl std::fmt::Debug for ArgRefs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArgRefs")
            .field("params", &self.len)
            .field("owners", &self.owners.len())
            .finish()
    }
}

/// The most parameters a typed kernel has (the largest [`Signature`] tuple).
const MAX_PARAMS: usize = 12;

impl<'a> ArgRefs<'a> {
    /// A parameter whose bytes are `value`'s.
    #[inline]
    pub(crate) fn value<T>(&mut self, value: &'a T) {
        self.push((value as *const T).cast_mut().cast());
    }

    /// A `T*` parameter: the address stored in the allocation, which the graph keeps.
    #[inline]
    pub(crate) fn buffer(&mut self, alloc: &'a Arc<DeviceAlloc>) {
        self.push((&alloc.ptr as *const u64).cast_mut().cast());
        self.on_device(alloc.ctx.device, "a buffer");
        self.owners.push(OwnerRef::Alloc(alloc));
    }

    /// Notes an argument on `device`.
    fn on_device(&mut self, device: i32, what: &'static str) {
        if device != self.device && self.elsewhere.is_none() {
            self.elsewhere = Some((device, what));
        }
    }

    /// A `Slice<T>` parameter: address and length, in a header kept here.
    #[inline]
    fn slice(&mut self, alloc: &'a Arc<DeviceAlloc>, len: usize) {
        self.header(alloc.ptr, len);
        self.on_device(alloc.ctx.device, "a buffer");
        self.owners.push(OwnerRef::Alloc(alloc));
    }

    /// A `Slice<T>` header of `ptr` and `len`, kept here, as the next parameter.
    #[inline]
    fn header(&mut self, ptr: u64, len: usize) {
        let i = self.nslices.min(MAX_PARAMS - 1);
        // SAFETY: `slices` points at `MAX_PARAMS` headers in `with_refs`'s frame, which outlive
        // this value; `i < MAX_PARAMS`.
        let header = unsafe { self.slices.add(i) };
        // SAFETY: as above; a `RawSlice` is plain data, written whole.
        unsafe {
            header.write(RawSlice {
                ptr,
                len: len as u64,
            })
        };
        self.nslices = i + 1;
        self.push(header.cast());
    }

    /// A parameter with bytes of its own and an owner on `device` that is not a buffer.
    #[inline]
    pub(crate) fn other(&mut self, value: &'a u64, owner: &'a Owner, device: i32) {
        self.push((value as *const u64).cast_mut().cast());
        self.on_device(device, "a device graph");
        self.needs_graph = true;
        self.owners.push(OwnerRef::Other(owner));
    }

    /// A `T*` parameter in graph memory (a [`GraphBuffer`](crate::GraphBuffer)) on `device`.
    pub(crate) fn graph_memory(&mut self, value: &'a u64, used: GraphUse, device: i32) {
        self.push((value as *const u64).cast_mut().cast());
        self.note_graph_memory(used, device);
    }

    /// A `Slice<T>` parameter in graph memory, as [`graph_memory`](Self::graph_memory).
    pub(crate) fn graph_memory_slice(&mut self, ptr: u64, len: usize, used: GraphUse, device: i32) {
        self.header(ptr, len);
        self.note_graph_memory(used, device);
    }

    fn note_graph_memory(&mut self, used: GraphUse, device: i32) {
        self.on_device(device, "graph memory");
        self.needs_graph = true;
        if !self.memory.contains(&used) {
            self.memory.push(used);
        }
    }

    /// Whether graph memory is among the arguments.
    #[inline]
    pub(crate) fn uses_graph_memory(&self) -> bool {
        !self.memory.is_empty()
    }

    /// The graph memory among the arguments.
    pub(crate) fn graph_uses(&self) -> &[GraphUse] {
        &self.memory
    }

    /// A conditional handle of the graph `graph`.
    pub(crate) fn handle(&mut self, value: &'a u64, graph: u64) {
        self.push((value as *const u64).cast_mut().cast());
        self.handles.push(graph);
    }

    /// The graphs of the conditional handles among the arguments.
    pub(crate) fn handle_graphs(&self) -> &[u64] {
        &self.handles
    }

    /// Refuses arguments that only a kernel in a graph may take, when the kernel goes to a plain
    /// stream (`target` is `None`), and conditional handles of graphs outside `target`'s chain
    /// (the graph, and the graphs whose body or child it is).
    #[inline]
    pub(crate) fn check_target(
        &self,
        target: Option<&crate::driver::graph::GraphHandle>,
    ) -> Result<()> {
        if !self.needs_graph && self.handles.is_empty() {
            return Ok(());
        }
        match target {
            None if !self.memory.is_empty() => Err(Error::invalid(
                Refusal::Capture,
                "a GraphBuffer exists only while its graph runs: use it in kernels captured into, or added to, the graph that allocates it (after the allocation), not on a plain stream",
            )),
            None if self.needs_graph || !self.handles.is_empty() => {
                Err(Error::invalid(
                    Refusal::Capture,
                    "a kernel that takes a conditional handle or a device graph runs only inside a graph: record it into a capture or add it to a definition",
                ))
            }
            Some(g) if self.memory.iter().any(|m| m.graph != g.id) => Err(Error::invalid(
                Refusal::ForeignGraph,
                "a GraphBuffer is used in another graph than the one that allocates it (a conditional body or child graph included): graph memory exists only inside its own graph",
            )),
            Some(g) if self.handles.iter().any(|&h| !g.any_in_chain(|id| id == h)) => {
                Err(Error::ForeignConditionalHandle)
            }
            _ => Ok(()),
        }
    }

    #[inline]
    fn push(&mut self, p: *mut c_void) {
        // A signature has at most `MAX_PARAMS` parameters (the tuples implemented).
        if let Some(slot) = self.ptrs.get_mut(self.len) {
            slot.write(p);
            self.len += 1;
        }
    }

    /// Refuses arguments in memory of another device than the kernel's (a kernel would
    /// dereference an address that is not valid where it runs); `what` names where it runs.
    #[inline]
    pub(crate) fn check_device(&self, what: &str) -> Result<()> {
        match self.elsewhere {
            Some((theirs, kind)) => Err(Self::elsewhere(theirs, kind, what, self.device)),
            None => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn elsewhere(theirs: i32, kind: &str, what: &str, device: i32) -> Error {
        Error::invalid(
            Refusal::OtherDevice,
            format!(
                "a kernel argument is {kind} of device {theirs}, but the {what} is on device {device}"
            ),
        )
    }

    /// The `void**` the driver takes: null without parameters.
    pub(crate) fn params(&mut self) -> *mut *mut c_void {
        if self.len == 0 {
            std::ptr::null_mut()
        } else {
            self.ptrs.as_mut_ptr().cast()
        }
    }
}

/// Runs `f` with `args` gathered as [`ArgRefs`] on this stack frame, for a kernel on `device`.
#[inline]
pub(crate) fn with_refs<S: Signature, R>(
    args: &impl ArgsFor<S>,
    device: i32,
    f: impl FnOnce(&mut ArgRefs<'_>) -> R,
) -> R {
    let mut headers = [std::mem::MaybeUninit::<RawSlice>::uninit(); MAX_PARAMS];
    let mut refs = ArgRefs {
        ptrs: [std::mem::MaybeUninit::uninit(); MAX_PARAMS],
        len: 0,
        // Taken once; `headers` is not touched again while `refs` lives.
        slices: headers.as_mut_ptr().cast(),
        nslices: 0,
        owners: SmallVec::new(),
        handles: SmallVec::new(),
        device,
        elsewhere: None,
        needs_graph: false,
        memory: SmallVec::new(),
    };
    sealed::ArgsFor::refs_all(args, &mut refs);
    f(&mut refs)
}

/// Collects typed arguments into [`KernelArgs`].
pub(crate) fn collect<'a, S: Signature>(args: impl ArgsFor<S> + 'a) -> KernelArgs<'a> {
    let mut out = KernelArgs::new();
    sealed::ArgsFor::push_all(args, &mut out);
    out
}

impl Function {
    /// This kernel with its parameter list declared as `S` (see [`Kernel`]).
    ///
    /// Where the driver reports a kernel's parameters (`cuFuncGetParamInfo`, driver 12.4+), a
    /// declaration with another number of parameters, or a parameter of another size, is an
    /// [`Error::InvalidArgument`] naming it. (Equal sizes do not prove equal types: that part
    /// stays the caller's promise.)
    ///
    /// # Safety
    /// `S` is the kernel's parameter list, in order, each Rust type standing for the C++ type the
    /// [`KernelParam`] table gives (an array `[T; N]` stands for a struct holding `T[N]` by
    /// value, not for a `T*`); and the kernel, given *any* arguments of those types, accesses
    /// only memory valid for it — in bounds of the buffers it is given, whatever its launch
    /// configuration and its other arguments (a kernel whose bounds come from a separate length
    /// cannot promise that: give it a [`Slice<T>`] instead). Safe code may pass the same memory
    /// for several parameters and use it from other streams meanwhile, so the kernel must not
    /// rely on `__restrict__` or on exclusive access for anything but the values it computes.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(module: &Module) -> cuda_graph::Result<()> {
    /// let f = module.function("add_one")?;
    /// // SAFETY: `add_one(int* p)` increments p[0]: one element.
    /// let add_one: Kernel<(*mut i32,)> = unsafe { f.typed()? };
    /// # Ok(()) }
    /// ```
    pub unsafe fn typed<S: Signature>(&self) -> Result<Kernel<S>> {
        check_signature(
            self,
            <S as sealed::Signature>::SIZES,
            std::any::type_name::<S>(),
        )?;
        Ok(Kernel {
            function: self.clone(),
            sig: PhantomData,
        })
    }
}

impl Module {
    /// Looks up the kernel `name` with its parameter list declared as `S`:
    /// [`function`](Self::function) then [`Function::typed`].
    ///
    /// # Safety
    /// As [`Function::typed`]: `S` is the kernel's parameter list, and the kernel stays within
    /// the memory it is given.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(module: &Module) -> cuda_graph::Result<()> {
    /// // SAFETY: `fill_slice(Slice<int> p, int v)` writes p.ptr[i] = v for i < p.len only.
    /// let fill = unsafe { module.kernel::<(Slice<i32>, i32)>("fill_slice")? };
    /// # Ok(()) }
    /// ```
    pub unsafe fn kernel<S: Signature>(&self, name: &str) -> Result<Kernel<S>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.function(name)?.typed() }
    }
}

/// Compares a declared parameter list with what the driver reports for `function`, when it can.
fn check_signature(function: &Function, sizes: &[usize], declared: &str) -> Result<()> {
    function.module.ctx.bind()?;
    let name = function.name();
    for (i, &size) in sizes.iter().enumerate() {
        // SAFETY: `function` keeps its module loaded; the context is current.
        match unsafe { driver::compat::param_info(function.raw, i) } {
            Ok(Some((_, actual))) if actual == size => {}
            Ok(Some((_, actual))) => {
                return Err(Error::invalid(Refusal::Declaration, format!(
                    "kernel `{name}`: parameter {i} is {actual} bytes, but the declared signature `{declared}` makes it {size}"
                )))
            }
            Ok(None) => {
                return Err(Error::invalid(Refusal::Declaration, format!(
                    "kernel `{name}` takes {i} parameter(s), but the declared signature `{declared}` has {}",
                    sizes.len()
                )))
            }
            // The driver cannot tell (too old, or bindings without the call): the declaration
            // stays the caller's promise alone.
            Err(_) => return Ok(()),
        }
    }
    // SAFETY: as above.
    match unsafe { driver::compat::param_info(function.raw, sizes.len()) } {
        Ok(Some(_)) => Err(Error::invalid(
            Refusal::Declaration,
            format!(
                "kernel `{name}` takes more parameters than the declared signature `{declared}` ({})",
                sizes.len()
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes<S: Signature>() -> &'static [usize] {
        <S as sealed::Signature>::SIZES
    }

    #[test]
    fn signatures_give_the_c_sizes() {
        assert_eq!(sizes::<()>(), &[] as &[usize]);
        assert_eq!(sizes::<(*mut f32, *const u8, u32)>(), &[8, 8, 4]);
        assert_eq!(sizes::<(bool, u16, [f32; 3], f64)>(), &[1, 2, 12, 8]);
    }

    fn args_of<'a, S: Signature>(a: impl ArgsFor<S> + 'a) -> KernelArgs<'a> {
        collect(a)
    }

    #[test]
    fn arguments_are_pushed_in_order_and_literals_take_the_declared_type() {
        let a = args_of::<(u8, i64, f32, bool)>((7, -2, 0.5, true));
        let p = a.pointers();
        // SAFETY: each pointer points at the value pushed for it, of the declared C type.
        unsafe {
            assert_eq!(*(p[0] as *const u8), 7);
            assert_eq!(*(p[1] as *const i64), -2);
            assert_eq!(*(p[2] as *const f32), 0.5);
            assert_eq!(*(p[3] as *const u8), 1);
        }
        // The same arguments as the driver gets them on the launch path: pointers into the tuple.
        let t = (7u8, -2i64, 0.5f32, true);
        with_refs::<(u8, i64, f32, bool), _>(&t, 0, |r| {
            let p = r.params();
            assert!(r.owners.is_empty());
            // SAFETY: `p` holds 4 pointers, each at the tuple's element of the declared type.
            unsafe {
                assert_eq!(*(*p.add(0) as *const u8), 7);
                assert_eq!(*(*p.add(1) as *const i64), -2);
                assert_eq!(*(*p.add(2) as *const f32), 0.5);
                assert_eq!(*(*p.add(3) as *const u8), 1);
            }
        });
        with_refs::<(), _>(&(), 0, |r| assert!(r.params().is_null()));
        let one = args_of::<(u32,)>(9);
        assert_eq!(one.len(), 1);
        assert_eq!(args_of::<()>(()).len(), 0);
    }
}
