//! Beginning and ending a capture, and recording work while capturing.

use super::kind::{Kind, OwnsCapture, StandsAlone};
use super::state::{CaptureMode, Capturing, Ended, IsCapturing, IsEnded, State, Unstarted};
use super::GraphBuilder;
use crate::definition::GraphAllocation;
use crate::error::{Error, Refusal, Result};
use crate::graph::{Graph, GraphDebugPrintOptions, InstantiateOptions};
use crate::runtime::{DeviceBuffer, DeviceCopy, Function, KernelArgs, LaunchConfig, Stream};

/// `NotStarted` → `Capturing<M>`.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Begins stream capture in `mode` ([`Global`](super::Global),
    /// [`ThreadLocal`](super::ThreadLocal) or [`Relaxed`](super::Relaxed)); the next state is
    /// `Capturing<M>`.
    ///
    /// If the driver refuses (for example because the stream is already capturing for another
    /// builder), the error is returned and no capture is left running for this builder.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let builder = device.create_graph_builder()?; // NotStarted
    /// let capturing = builder.begin_building(Relaxed)?; // Capturing<Relaxed>: Send
    /// let ended = capturing.end_building()?;
    /// # let _ = ended;
    /// # Ok(()) }
    /// ```
    pub fn begin_building<M: CaptureMode>(
        mut self,
        mode: M,
    ) -> Result<GraphBuilder<K, Capturing<M>>>
    where
        S: Unstarted,
    {
        let into = self.core.graph.clone();
        self.core
            .begin(super::state::sealed::RawMode::raw(mode), into)?;
        Ok(self.into_state(Capturing::new()))
    }
}

/// While `Capturing<M>`: recording work.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// The stream being captured: work issued on it is recorded into the graph.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, buf: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// // Work issued on the builder's stream is captured too.
    /// b.stream().memset_d8(buf, 0)?;
    /// # Ok(()) }
    /// ```
    pub fn stream(&self) -> &Stream
    where
        S: IsCapturing,
    {
        &self.core.stream
    }

    /// `Ok(())` while the capture is active; [`Error::CaptureInvalidated`] once an illegal call
    /// (such as a synchronous copy in `Global` mode) has invalidated it.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// b.capture_status()?; // Err(Error::CaptureInvalidated(..)) once the capture broke
    /// # Ok(()) }
    /// ```
    pub fn capture_status(&self) -> Result<()>
    where
        S: IsCapturing,
    {
        self.core.status()
    }

    /// Records a launch of a typed `kernel` with `args`, one per parameter of its signature,
    /// checked at compile time. The kernel's module and every buffer given stay alive as long as
    /// the graph and its execs.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, affine: &Kernel<(*mut i32, i32, i32)>, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// b.launch(affine, LaunchConfig::single(), (buf, 2, 1))?; // buf[0] = buf[0] * 2 + 1
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn launch<Sig: crate::Signature>(
        &self,
        kernel: &crate::Kernel<Sig>,
        config: LaunchConfig,
        args: impl crate::ArgsFor<Sig>,
    ) -> Result<()>
    where
        S: IsCapturing,
    {
        self.core
            .stream
            .launch_via(self.core.own_capture(), kernel, config, args)
    }

    /// Records a programmatic dependent launch of a [`DependentKernel`](crate::DependentKernel)
    /// ([`Stream::launch_dependent`]): its node's edge from the kernel node before it is
    /// programmatic, so at each replay it may begin before that kernel has ended.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, first: &Kernel<(*mut f32,)>, then: &DependentKernel<(*mut f32,)>, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// b.launch(first, LaunchConfig::for_num_elems(1024), buf)?;
    /// b.launch_dependent(then, LaunchConfig::for_num_elems(1024), buf)?;
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn launch_dependent<D: crate::WaitsForPredecessor>(
        &self,
        kernel: &D,
        config: LaunchConfig,
        args: impl crate::ArgsFor<D::Sig>,
    ) -> Result<()>
    where
        S: IsCapturing,
    {
        let mut config = config;
        config.attributes = config.attributes.set_dependent(true);
        self.core.stream.launch_via(
            self.core.own_capture(),
            kernel.waiting_kernel(),
            config,
            args,
        )
    }

    /// Records a launch of an untyped `function`: the raw form of [`launch`](Self::launch). The
    /// function's module and every buffer in `args` stay alive as long as the graph and its execs.
    ///
    /// # Safety
    /// As [`Stream::launch_unchecked`]: `args` must match the kernel's parameters, and the kernel must stay
    /// in bounds of the buffers it is given.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, add_one: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// // SAFETY: add_one takes one int*, and `buf` holds it.
    /// unsafe { b.launch_unchecked(add_one, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    /// # Ok(()) }
    /// ```
    #[inline]
    pub unsafe fn launch_unchecked(
        &self,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()>
    where
        S: IsCapturing,
    {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.core
                .stream
                .launch_unchecked_via(self.core.own_capture(), function, config, args)
        }
    }

    /// Holds `owner` as long as the graph this capture records into, every copy and embedding of
    /// it, and every exec made from any of them: for what work recorded here by **other code**
    /// reads or writes. A library that issues its own kernels on the capturing stream (cuBLAS, a
    /// framework such as candle, raw launches on [`Stream::as_raw`]) records them into this graph,
    /// but the crate never sees their operands; what they use must outlive every replay, so
    /// hand its owner here: a candle `Tensor`, a cudarc `CudaSlice`, an `Arc` of anything.
    ///
    /// Work the crate records itself holds its operands already (buffers, modules, callbacks).
    /// Holding more than needed is never wrong; holding less is what the `unsafe` of the foreign
    /// stream's constructor ([`Stream::from_raw`], or `Stream::from_cudarc` with the `cudarc`
    /// feature) promises not to do; the guide's page on other libraries' work
    /// ([`docs::foreign`](crate::docs::foreign)) walks through cuBLAS and candle.
    /// The owner is dropped on whatever thread lets the last of those go (the release thread
    /// among them), so it is `Send + Sync`.
    ///
    /// An error where the capture no longer records (the driver invalidated it): the owner is
    /// dropped here.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<ThreadLocal>>) -> cuda_graph::Result<()> {
    /// // Memory another library's kernels, recorded into this capture, read and write.
    /// let workspace: std::sync::Arc<Vec<u8>> = std::sync::Arc::new(vec![0; 16]);
    /// b.hold(workspace.clone())?; // lives as long as the graph and its execs
    /// # Ok(()) }
    /// ```
    pub fn hold<T: Send + Sync + 'static>(&self, owner: T) -> Result<()>
    where
        S: IsCapturing,
    {
        let owner = std::sync::Arc::new(owner);
        self.core.stream.enqueue(|rec| {
            if !rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Broken,
                    "this builder's stream no longer records into its capture (the driver invalidated it): nothing can be held for a graph that will not end",
                ));
            }
            rec.keep(&owner);
            Ok(())
        })
    }

    /// Records a memset of every byte of `buf` to `value`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, buf: &DeviceBuffer<u8>) -> cuda_graph::Result<()> {
    /// b.memset_d8(buf, 0xff)?; // every byte
    /// # Ok(()) }
    /// ```
    pub fn memset_d8<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, value: u8) -> Result<()>
    where
        S: IsCapturing,
    {
        self.core.stream.memset_d8(buf, value)
    }

    /// Records a memset of every 32-bit word of `buf` to `value`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// b.memset_d32(buf, 1.0f32.to_bits())?; // every 4-byte word
    /// # Ok(()) }
    /// ```
    pub fn memset_d32<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>, value: u32) -> Result<()>
    where
        S: IsCapturing,
    {
        self.core.stream.memset_d32(buf, value)
    }

    /// Records a device-to-device copy of `src` into `dst`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, dst: &DeviceBuffer<i32>, src: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// b.memcpy_dtod(dst, src)?; // same length
    /// # Ok(()) }
    /// ```
    pub fn memcpy_dtod<T: DeviceCopy>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
    ) -> Result<()>
    where
        S: IsCapturing,
    {
        self.core.stream.memcpy_dtod(dst, src)
    }

    /// Records a copy of a 2D or 3D `region` of `src` into `dst` ([`Stream::memcpy_3d`]): a
    /// memcpy node.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::Copy3d;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>, image: &DeviceBuffer<f32>, tile: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// b.memcpy_3d(tile, image, Copy3d::rows(8, 8, 256, 8))?;
    /// # Ok(()) }
    /// ```
    pub fn memcpy_3d<T: DeviceCopy>(
        &self,
        dst: &DeviceBuffer<T>,
        src: &DeviceBuffer<T>,
        region: crate::Copy3d,
    ) -> Result<()>
    where
        S: IsCapturing,
    {
        self.core.stream.memcpy_3d(dst, src, region)
    }

    /// Records a stream-ordered allocation of `bytes` bytes (`cuMemAllocAsync` on the capturing
    /// stream): a memory allocation node. The memory exists **only while the graph runs**, from
    /// this point until the [`free_async`](Self::free_async) that consumes the returned
    /// [`GraphAllocation`], so it is a graph allocation, never a [`DeviceBuffer`]: typed kernels
    /// captured here take its [`view`](GraphAllocation::view), checked to run after this
    /// allocation, and the free is checked to run after them. Not freed in the capture, it stays allocated after a launch and is
    /// handled as for [`GraphDefinition::add_mem_alloc`](crate::GraphDefinition::add_mem_alloc)
    /// (the exec frees it when dropped).
    ///
    /// `bytes == 0` is an [`Error::InvalidArgument`]. The driver refuses memory nodes in
    /// conditional bodies.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, fill: &Kernel<(Slice<i32>, i32)>) -> cuda_graph::Result<()> {
    /// let b = device.create_graph_builder()?.begin_building(Global)?;
    /// let scratch = b.alloc_async(256 * 4)?;
    /// b.launch(fill, LaunchConfig::for_num_elems(256), (&scratch.view::<i32>()?, 1))?;
    /// b.free_async(scratch)?;
    /// let graph = b.end_building()?.instantiate()?;
    /// # Ok(()) }
    /// ```
    pub fn alloc_async(&self, bytes: usize) -> Result<GraphAllocation>
    where
        S: IsCapturing,
    {
        let stream = &self.core.stream;
        stream.enqueue(|rec| GraphAllocation::capture(rec, stream.raw(), &stream.handle.ctx, bytes))
    }

    /// Records the free of `allocation` (`cuMemFreeAsync` on the capturing stream): a memory
    /// free node, after the work recorded so far on this builder's stream (join forks that use
    /// the memory first). The allocation must come from this capture's graph and not be freed
    /// yet, else [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let scratch = b.alloc_async(1 << 20)?;
    /// b.free_async(scratch)?;
    /// # Ok(()) }
    /// ```
    pub fn free_async(&self, allocation: GraphAllocation) -> Result<()>
    where
        S: IsCapturing,
    {
        let stream = &self.core.stream;
        stream.enqueue(|rec| allocation.capture_free(rec, stream.raw()))
    }
}

/// `Capturing<M>` → `Ended`, for kinds that own their capture.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Ends the capture; the next state is `Ended`.
    ///
    /// Does not compile while a fork or conditional body still borrows this builder: rustc then
    /// says `cannot move out of `parent` because it is borrowed` (E0505) and points at the
    /// `split` or `add_if`/`add_while`/... that made it. Join the forks first
    /// ([`join`](Self::join), or drop them), and end every body (`end_building()` on it, or drop
    /// it). If the capture was invalidated, returns [`Error::CaptureInvalidated`]; the capture is
    /// over either way and the stream is usable.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let b = device.create_graph_builder()?.begin_building(Global)?;
    /// let ended = b.end_building()?;
    /// let graph = ended.instantiate()?;
    /// # let _ = graph;
    /// # Ok(()) }
    /// ```
    pub fn end_building(mut self) -> Result<GraphBuilder<K, Ended>>
    where
        S: IsCapturing,
        K: OwnsCapture,
    {
        self.core.end()?;
        Ok(self.into_state(Ended))
    }
}

/// `Ended`: using the finished graph.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Writes the graph as Graphviz DOT to `path` (`cuGraphDebugDotPrint`).
    ///
    /// An unwritable path is an [`Error::Io`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(ended: &GraphBuilder<Primary, Ended>) -> cuda_graph::Result<()> {
    /// ended.debug_dot_print(std::env::temp_dir().join("graph.dot"), &GraphDebugPrintOptions::all())?;
    /// # Ok(()) }
    /// ```
    pub fn debug_dot_print(
        &self,
        path: impl AsRef<std::path::Path>,
        options: &GraphDebugPrintOptions,
    ) -> Result<()>
    where
        K: OwnsCapture,
        S: IsEnded,
    {
        let graph = self.ended_graph()?;
        crate::graph::dot_print(graph, path.as_ref(), options, |tree| tree.check_complete())
    }

    pub(crate) fn ended_graph(&self) -> Result<&std::sync::Arc<crate::driver::graph::GraphHandle>>
    where
        S: IsEnded,
    {
        self.graph_handle()
            .ok_or_else(|| Error::Internal("the builder has no graph".into()))
    }
}

/// `Primary` + `Ended` → [`Graph`].
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Instantiates the captured graph into an executable [`Graph`] with the default options
    /// (`cuGraphInstantiateWithParams`): [`instantiate_with`](Self::instantiate_with) and
    /// [`InstantiateOptions::default`]. An ended builder can be instantiated any number of times.
    ///
    /// A refusal is an [`Error::Instantiate`] naming the driver's reason.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(ended: &GraphBuilder<Primary, Ended>, stream: &Stream) -> cuda_graph::Result<()> {
    /// let graph = ended.instantiate()?;
    /// let again = ended.instantiate()?; // as often as you like
    /// graph.launch(stream)?;
    /// # let _ = again;
    /// # Ok(()) }
    /// ```
    pub fn instantiate(&self) -> Result<Graph>
    where
        S: IsEnded,
        K: StandsAlone,
    {
        Graph::instantiate(self.ended_graph()?, &InstantiateOptions::default())
    }

    /// Instantiates the captured graph into an executable [`Graph`] with `options` (uploads,
    /// auto-free, device launch, node priorities).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(ended: &GraphBuilder<Primary, Ended>, stream: &Stream) -> cuda_graph::Result<()> {
    /// let graph = ended.instantiate_with(&InstantiateOptions::new().upload_on(stream))?;
    /// # Ok(()) }
    /// ```
    pub fn instantiate_with(&self, options: &InstantiateOptions) -> Result<Graph>
    where
        S: IsEnded,
        K: StandsAlone,
    {
        Graph::instantiate(self.ended_graph()?, options)
    }
}
