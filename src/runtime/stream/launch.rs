//! Kernel launches on a stream or into its capture, and what a captured launch keeps alive.

use super::*;

impl Stream {
    /// Launches a typed `kernel` on this stream (or into its capture) with `args`, one per
    /// parameter of its signature, checked at compile time. Buffers given are kept alive by any
    /// graph that captures the launch.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream, fill: &Kernel<(*mut i32, i32, i32)>, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let n = buf.len() as i32;
    /// stream.launch(fill, LaunchConfig::for_num_elems(n as u32), (buf, n, 7))?;
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn launch<S: crate::Signature>(
        &self,
        kernel: &crate::Kernel<S>,
        config: LaunchConfig,
        args: impl crate::ArgsFor<S>,
    ) -> Result<()> {
        self.launch_via(None, kernel, config, args)
    }

    /// [`launch`](Self::launch), recorded through `own` when the caller is a builder whose
    /// capture this stream records into (see [`OwnCapture`]).
    pub(crate) fn launch_via<S: crate::Signature>(
        &self,
        own: Option<OwnCapture<'_>>,
        kernel: &crate::Kernel<S>,
        config: LaunchConfig,
        args: impl crate::ArgsFor<S>,
    ) -> Result<()> {
        let function = kernel.function();
        let device = self.handle.ctx.device;
        if function.device != device {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                format!(
                    "kernel `{}` is loaded on device {}, but the stream is on device {device}",
                    function.name(),
                    function.device
                ),
            ));
        }
        crate::runtime::with_refs(&args, device, |refs| {
            refs.check_device("stream")?;
            if refs.uses_graph_memory() {
                return self.launch_with_graph_memory(function, &config, refs);
            }
            let params = refs.params();
            // SAFETY: `params` points at one pointer per parameter, each at argument bytes that
            // live until the call returns; `Kernel`'s maker promised its signature and bounds,
            // and the arguments match the signature (checked by `ArgsFor`).
            unsafe {
                self.launch_recorded(
                    own,
                    function,
                    &config,
                    params,
                    refs.owners.iter().copied(),
                    |graph| refs.check_target(graph),
                )
            }
        })
    }

    /// A typed launch whose arguments include graph memory ([`GraphBuffer`](crate::GraphBuffer)):
    /// only into a capture of the graph that allocates it, after the allocation node (the
    /// capture's dependencies reach it), and recorded as a user of each allocation for the check
    /// of its free. The stream's slot and the capture's tree stay held from the check to the
    /// record (`enqueue`), so no other work on the stream comes between.
    #[cold]
    #[inline(never)]
    fn launch_with_graph_memory(
        &self,
        function: &Function,
        config: &LaunchConfig,
        refs: &mut crate::runtime::ArgRefs<'_>,
    ) -> Result<()> {
        self.enqueue(|rec| {
            refs.check_target(rec.capture.map(|(graph, _)| &**graph))?;
            let (Some(graph), Some(tree)) = (rec.graph_id(), rec.tree.as_deref_mut()) else {
                // `check_target` refused a stream outside a capture.
                return Err(Error::invalid(
                    Refusal::Capture,
                    "a GraphBuffer is used outside a capture",
                ));
            };
            let stream = self.raw();
            let deps = crate::definition::capture_dependencies(stream)?;
            // SAFETY: the capture's dependencies are live nodes of its graph, whose tree is
            // locked and whose stream's slot is held (`rec`).
            unsafe { crate::definition::check_after_allocations(graph, &deps, refs.graph_uses()) }?;
            tree.keep(&function.module);
            for o in refs.owners.iter().copied() {
                match o {
                    crate::runtime::OwnerRef::Alloc(alloc) => tree.keep(alloc),
                    crate::runtime::OwnerRef::Other(owner) => tree.keep_dyn(owner),
                }
            }
            let params = refs.params();
            // SAFETY: the stream's context is bound (by `enqueue`); `params` points at one
            // pointer per parameter, each at argument bytes that live until the call returns;
            // `Kernel`'s maker promised its signature and bounds, and the graph memory among the
            // arguments exists when the node runs (checked above, and at its free).
            unsafe { self.launch_here(function, config, params) }?;
            match crate::definition::capture_dependencies(stream)?.as_slice() {
                [node] => {
                    crate::definition::note_users(tree, *node as usize, refs.graph_uses());
                    Ok(())
                }
                // The launch is in the graph, but its node cannot be named: the free node could
                // not be checked against it.
                other => {
                    tree.break_with(|| format!("a captured launch using graph memory left the capture with {} dependencies instead of its node, so its free cannot be checked", other.len()));
                    Err(Error::invalid(Refusal::Order, "after a captured launch using a GraphBuffer the capture does not end in its node"))
                }
            }
        })
    }

    /// Launches an untyped `function` on this stream (or into its capture): the raw form of
    /// [`launch`](Self::launch), for kernels without a declared [`Kernel`](crate::Kernel) signature.
    ///
    /// What `args` borrows is held as long as the launch needs it: in a capture, by the graph
    /// (and every exec made from it); outside one, the crate's own buffers need no hold (freeing
    /// one waits for the device), and memory borrowed from elsewhere
    /// ([`DeviceBuffer::from_raw`](crate::DeviceBuffer::from_raw), cudarc's) is held until the
    /// stream has run the launch.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and type, and the kernel
    /// must only access memory that is valid for it (in bounds of the buffers it is given).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream, add_one: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// // SAFETY: add_one takes one int*, and `buf` holds it.
    /// unsafe { stream.launch_unchecked(add_one, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    #[inline]
    pub unsafe fn launch_unchecked(
        &self,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_unchecked_via(None, function, config, args) }
    }

    /// [`launch_unchecked`](Self::launch_unchecked), recorded through `own` when the caller is a
    /// builder whose capture this stream records into (see [`OwnCapture`]).
    ///
    /// # Safety
    /// As [`launch_unchecked`](Self::launch_unchecked).
    pub(crate) unsafe fn launch_unchecked_via(
        &self,
        own: Option<OwnCapture<'_>>,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        let (mut ptrs, mut spill) = (crate::runtime::launch::NO_POINTERS, Vec::new());
        let params = args.fill_pointers(&mut ptrs, &mut spill);
        let owners = args.owners();
        // SAFETY: `params` points at `args.len()` pointers to argument storage that lives until
        // the call returns; the caller promises the arguments match the kernel.
        unsafe { self.launch_recorded(own, function, &config, params, owners, |_| Ok(())) }
    }

    /// The part of a launch both forms share: `check` (given the graph captured into, if any),
    /// the stream checks of the buffers among `owners`, the owners kept by the capture (if
    /// any), the launch, and the hold on borrowed memory outside a capture.
    ///
    /// Through a builder (`own`, its capture), all of it runs in this one frame under the
    /// capture's tree lock alone. The stream's capture slot is not needed: it guards against a
    /// capture beginning or ending on the stream in the middle of the operation, and neither
    /// can happen to a capture whose builder is borrowed for it (ending consumes the builder;
    /// beginning another on a capturing stream is refused by the driver without touching this
    /// tree). Work on the stream from other threads takes the slot and then the same tree
    /// lock, so it is serialised with this. The builder's launch is the per-node path of a
    /// capture: going through [`enqueue`](Self::enqueue)'s closure and a [`Recording`] cost 214
    /// instructions per launch with the stub driver, this 187 (one buffer argument: 261, 234;
    /// a typed launch: 366, 300; `scripts/check-instructions.sh` keeps the
    /// current counts). Other launches take the stream's capture slot.
    ///
    /// # Safety
    /// `params` points at one pointer per kernel parameter, each at argument bytes that live
    /// until this returns and match the kernel's parameter; the kernel stays within the memory
    /// it is given.
    unsafe fn launch_recorded<'a>(
        &self,
        own: Option<OwnCapture<'_>>,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
        owners: impl Iterator<Item = crate::runtime::OwnerRef<'a>> + Clone,
        check: impl FnOnce(Option<&GraphHandle>) -> Result<()>,
    ) -> Result<()> {
        if let Some(own) = own {
            check(Some(own.graph))?;
            // Binding also refuses a host callback's thread: a builder can be there (a
            // `Relaxed` one is `Send` and `Sync`, a `Global` one `Sync`).
            self.bind_for_work()?;
            let mut tree = own.graph.lock();
            // Only the builder's own end removes its capture, and it is borrowed for this.
            debug_assert!(tree.captures().contains_key(&own.id));
            if tree.is_dead(own.graph) {
                return Err(dead_capture());
            }
            tree.keep(&function.module);
            for o in owners {
                match o {
                    crate::runtime::OwnerRef::Alloc(alloc) => tree.keep(alloc),
                    crate::runtime::OwnerRef::Other(owner) => tree.keep_dyn(owner),
                }
            }
            // SAFETY: the stream's context is bound (`bind_for_work`: a stream of its own names
            // it, a special handle was bound as the driver reported); `params` is the caller's
            // promise.
            return unsafe { self.launch_here(function, config, params) };
        }
        // A stream of its own with no capture linked in its slot is not capturing: a capture of
        // this crate begins and links itself there under the slot's lock (`Core::begin`), and so
        // does a stream joining one (`wait`), and no other code captures on a stream it does not
        // hold. The launch runs here, with the slot held so that no capture can begin in
        // between, without `enqueue`'s general path (two calls and a `Recording`: about 70
        // instructions per launch under the stub driver). A borrowed stream, whose capture
        // status only the driver knows, and a stream linked to a capture take the general path.
        if !self.handle.is_borrowed() {
            self.bind_for_work()?;
            let slot = self.handle.slot();
            if slot.is_none() {
                // SAFETY: the stream's context is bound (`bind_for_work`, a stream of its own)
                // and its slot held; `params` is the caller's promise.
                let launched =
                    unsafe { self.launch_uncaptured(function, config, params, owners, check) };
                drop(slot);
                return launched;
            }
        }
        self.enqueue_out_of_line(|rec| {
            if !rec.capturing() {
                // SAFETY: the stream's context is bound and its slot held (by `enqueue`);
                // `params` is the caller's promise.
                return unsafe { self.launch_uncaptured(function, config, params, owners, check) };
            }
            check(rec.capture.map(|(graph, _)| &**graph))?;
            rec.keep(&function.module);
            for o in owners {
                match o {
                    crate::runtime::OwnerRef::Alloc(alloc) => rec.keep(alloc),
                    crate::runtime::OwnerRef::Other(owner) => rec.keep_dyn(owner),
                }
            }
            // SAFETY: the stream's context is bound (by `enqueue`); `params` is the caller's
            // promise.
            unsafe { self.launch_here(function, config, params) }
        })
    }

    /// A launch on this stream outside any capture, for both paths of
    /// [`launch_recorded`](Self::launch_recorded) that find none: `check`, the stream checks of
    /// the buffers among `owners`, the launch, and the hold on borrowed memory.
    ///
    /// # Safety
    /// As [`launch_here`](Self::launch_here), with the stream's slot held by the caller (so no
    /// capture begins on the stream meanwhile) and the stream not capturing.
    #[inline(always)]
    unsafe fn launch_uncaptured<'a>(
        &self,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
        owners: impl Iterator<Item = crate::runtime::OwnerRef<'a>> + Clone,
        check: impl FnOnce(Option<&GraphHandle>) -> Result<()>,
    ) -> Result<()> {
        check(None)?;
        for alloc in owners.clone().filter_map(|o| o.alloc()) {
            alloc.check_stream(self.raw())?;
        }
        // SAFETY: the caller's promise above.
        unsafe { self.launch_here(function, config, params) }?;
        self.hold_borrowed_now(owners)
    }

    /// The driver's launch of `function` on this stream, written once for the three paths of
    /// [`launch_recorded`](Self::launch_recorded) and inlined into each (a shared closure cost
    /// 8 instructions per launch).
    ///
    /// # Safety
    /// As `driver::stream::launch_kernel`: the stream's context is bound on this thread, which
    /// is not a host callback's (`bind_for_work` ensures both), and `function` belongs to that
    /// context (the callers' device check); `params` points at one pointer per kernel parameter,
    /// each at argument bytes that live until this returns and match the kernel's parameter (the
    /// driver copies them during the call); the kernel stays within the memory it is given.
    #[inline(always)]
    unsafe fn launch_here(
        &self,
        function: &Function,
        config: &LaunchConfig,
        params: *mut *mut std::ffi::c_void,
    ) -> Result<()> {
        // SAFETY: the caller's promise above; the stream is live while `self` is.
        unsafe {
            driver::stream::launch_kernel(
                &self.handle.ctx,
                function.raw,
                config.grid,
                config.block,
                config.shared_mem_bytes,
                self.raw(),
                params,
            )
        }
    }

    /// Outside a capture, refuses work on `buf` when it is a stream-ordered allocation of another
    /// stream ([`alloc_async`](Self::alloc_async)): its memory is freed in its own stream's order
    /// when it is dropped, and this crate cannot order that free after work on other streams.
    /// (In a capture the graph runs at launch, and the graph holds the buffer until its launches
    /// have finished.)
    pub(super) fn after_allocation<T: DeviceCopy>(
        &self,
        rec: &Recording<'_>,
        buf: &DeviceBuffer<T>,
    ) -> Result<()> {
        if rec.capturing() {
            return Ok(());
        }
        buf.alloc.check_stream(self.raw())
    }

    /// Outside a capture, keeps the owners of borrowed memory among `owners` (made by
    /// [`DeviceBuffer::from_raw`] or a cudarc adapter) until the work just queued on this stream
    /// has run: their owners may free the memory on a stream of their own the moment they are
    /// dropped (cudarc frees a slice with `cuMemFreeAsync` on its stream), unordered with this
    /// stream's work. The crate's own allocations need nothing: `cuMemFree` waits for the device.
    /// Called after the operation is queued; where the driver refuses to queue the host function
    /// that releases them, waits for the stream instead. (A host callback's thread never gets
    /// here: binding refuses it first.)
    #[inline]
    pub(super) fn hold_borrowed<'a, I>(&self, rec: &Recording<'_>, owners: I) -> Result<()>
    where
        I: IntoIterator<Item = crate::runtime::OwnerRef<'a>>,
        I::IntoIter: Clone,
    {
        if rec.capturing() {
            return Ok(());
        }
        self.hold_borrowed_now(owners)
    }

    /// [`hold_borrowed`](Self::hold_borrowed) outside a capture.
    #[inline(always)]
    pub(super) fn hold_borrowed_now<'a, I>(&self, owners: I) -> Result<()>
    where
        I: IntoIterator<Item = crate::runtime::OwnerRef<'a>>,
        I::IntoIter: Clone,
    {
        let owners = owners.into_iter();
        let borrowed =
            |o: &crate::runtime::OwnerRef<'a>| o.alloc().is_some_and(DeviceAlloc::is_borrowed);
        // The usual case, no borrowed memory: a plain loop, no list built and no call made
        // (building and dropping an empty list were two calls per launch; an iterator adapter
        // here was one).
        let mut any = false;
        for o in owners.clone() {
            if borrowed(&o) {
                any = true;
                break;
            }
        }
        if !any {
            return Ok(());
        }
        self.hold_until_run(owners.filter(borrowed).map(|o| o.owner()).collect())
    }

    /// Holds `held` until the work queued on this stream so far has run (see
    /// [`hold_borrowed`](Self::hold_borrowed)).
    #[inline(never)]
    pub(super) fn hold_until_run(
        &self,
        held: smallvec::SmallVec<[crate::driver::graph::Owner; 2]>,
    ) -> Result<()> {
        match crate::driver::release::after_stream(self.raw(), Box::new(move || drop(held))) {
            Ok(()) => Ok(()),
            Err((_, job)) => {
                let waited = driver::stream::synchronize(&self.handle);
                if waited.is_ok() {
                    drop(job);
                } else {
                    // The work may not have run: leak what it uses rather than free it early.
                    std::mem::forget(job);
                }
                waited
            }
        }
    }
}
