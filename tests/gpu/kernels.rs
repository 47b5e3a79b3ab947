//! Typed kernels: declarations checked against the kernel, safe launches in every front end.

use cuda_graph::prelude::*;

use cuda_graph::Refusal;
use cuda_graph::{DeviceGraph, DriverVersion};

use crate::support::{eventually, one, Gpu, Needs, TestResult};

crate::gpu_tests! {
    "kernels";
    Needs::Gpu =>
        typed_launches_in_every_front_end,
        declarations_are_checked_against_the_kernel,
        typed_launches_keep_their_buffers_alive,
        untyped_arguments_borrow_and_what_is_made_from_them_holds,
        one_argument_list_read_by_threads_capturing_at_once,
        slices_carry_their_length,
        graph_allocations_as_buffers,
        graph_buffers_are_safe_views_checked_in_order,
        updates_from_graphs_whose_kernels_used_their_freed_graph_memory_are_refused,
        borrowed_memory_outlives_the_stream_work_that_uses_it;
    Needs::Conditional(DriverVersion::V12_3) => typed_kernels_set_conditions;
}

type Affine = Kernel<(*mut i32, i32, i32)>;

fn affine(gpu: &Gpu) -> cuda_graph::Result<Affine> {
    // SAFETY: affine(int* p, int m, int b) writes p[0] only.
    unsafe { gpu.module.kernel("affine") }
}

fn typed_launches_in_every_front_end(gpu: &Gpu) -> TestResult {
    let affine = affine(gpu)?;
    // SAFETY: add_one(int* p) writes p[0] only.
    let add_one = unsafe { gpu.module.kernel::<(*mut i32,)>("add_one")? };
    // SAFETY: copy_i32(const int* src, int* dst, int n) copies n elements: every use below
    // passes n equal to both buffers' length.
    let copy = unsafe {
        gpu.module
            .kernel::<(*const i32, *mut i32, i32)>("copy_i32")?
    };
    let s = gpu.stream();
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    // Stream: buf[0] = 0 * 2 + 5, then + 1; a view's first element is buf[2].
    s.launch(&affine, one(), (&buf, 2, 5))?;
    s.launch(&add_one, one(), &buf)?;
    s.launch(&add_one, one(), &buf.slice(2..)?)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [6, 0, 1, 0]);
    // Capture: buf[0] = 6 * 10 + 1.
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    b.launch(&affine, one(), (&buf, 10, 1))?;
    let g = b.end_building()?.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?[0], 61);
    // Definition: buf[0] = 61 * 1 - 60, copied into `dst`.
    let dst = gpu.device.alloc_zeroed::<i32>(4)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let k = def.add_kernel(&[], &affine, one(), (&buf, 1, -60))?;
    let c = def.add_kernel(&[&k], &copy, one(), (&buf, &dst, 4))?;
    let exec = def.instantiate()?;
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(dst.to_vec()?, [1, 0, 1, 0]);
    // Per-node updates with typed parameters: the exec's, then the definition's.
    exec.set_params(&k, NodeParams::kernel(&affine, one(), (&buf, 0, 9))?)?;
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(dst.to_vec()?, [9, 0, 1, 0]);
    def.set_params(&c, NodeParams::kernel(&copy, one(), (&dst, &buf, 4))?)?;
    let info = def.inspect(&c)?;
    assert!(format!("{info:?}").contains("copy_i32"), "{info:?}");
    Ok(())
}

fn declarations_are_checked_against_the_kernel(gpu: &Gpu) -> TestResult {
    // Right declarations of every parameter kind are accepted.
    // SAFETY (all): the declarations are the test kernels' own (never launched here).
    unsafe {
        gpu.module.kernel::<()>("empty_kernel")?;
        gpu.module.kernel::<(*mut i32, i32)>("add_one_at")?;
        gpu.module
            .kernel::<(ConditionalHandle, u32)>("set_condition")?;
        gpu.module
            .kernel::<(DeviceGraph, *mut i32)>("launch_graph")?;
        gpu.module.kernel::<(u64,)>("spin")?;
        gpu.module
            .kernel::<(*const f32, *mut f32, i32, f32)>("heat_step")?;
    }
    let driver = cuda_graph::driver_version()?;
    // SAFETY (all): wrong on purpose; refused before any launch.
    let wrong = unsafe {
        [
            gpu.module.kernel::<(*mut i32, i32)>("add_one").map(drop),
            gpu.module.kernel::<()>("add_one").map(drop),
            gpu.module
                .kernel::<(*mut i32, i64, i32)>("affine")
                .map(drop),
            gpu.module.kernel::<(*mut i32, i32)>("affine").map(drop),
            gpu.module.kernel::<(u32,)>("spin").map(drop),
        ]
    };
    if driver < DriverVersion(12040) {
        // The driver cannot report parameters: the declaration is the caller's promise alone.
        assert!(wrong.iter().all(|r| r.is_ok()));
        return Ok(());
    }
    let texts: Vec<String> = wrong
        .into_iter()
        .map(|r| match r {
            Err(Error::InvalidArgument(t)) if t.kind() == Refusal::Declaration => {
                t.message().to_string()
            }
            other => panic!("expected a refused declaration, got {other:?}"),
        })
        .collect();
    assert!(
        texts[0].contains("`add_one` takes 1 parameter"),
        "{}",
        texts[0]
    );
    assert!(
        texts[1].contains("`add_one` takes more parameters"),
        "{}",
        texts[1]
    );
    assert!(
        texts[2].contains("parameter 1 is 4 bytes") && texts[2].contains("makes it 8"),
        "{}",
        texts[2]
    );
    assert!(texts[3].contains("takes more parameters"), "{}", texts[3]);
    assert!(texts[4].contains("parameter 0 is 8 bytes"), "{}", texts[4]);
    // The raw function of a typed kernel is the same kernel.
    let a = affine(gpu)?;
    assert_eq!(a.function().name(), "affine");
    // SAFETY: the declaration is affine's own.
    let again: Affine = unsafe { gpu.f("affine").typed()? };
    assert!(format!("{again:?}").contains("(*mut i32, i32, i32)"));
    Ok(())
}

fn typed_launches_keep_their_buffers_alive(gpu: &Gpu) -> TestResult {
    let affine = affine(gpu)?;
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = buf.release_observer();
    let out = gpu.device.alloc_zeroed::<i32>(1)?;
    // SAFETY: copy_i32(const int* src, int* dst, int n): n = 1, both buffers hold 1.
    let copy = unsafe {
        gpu.module
            .kernel::<(*const i32, *mut i32, i32)>("copy_i32")?
    };
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    b.launch(&affine, one(), (&buf, 1, 7))?;
    b.launch(&copy, one(), (&buf, &out, 1))?;
    let g = b.end_building()?.instantiate()?;
    drop(buf);
    assert!(!watch.is_released(), "the graph holds the buffer");
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(out.to_vec()?, [7]);
    drop(g);
    assert!(
        eventually(|| watch.is_released()),
        "the buffer outlived the graph"
    );
    Ok(())
}

/// `KernelArgs` borrows its buffers (no count taken per launch); the capture, the node and the
/// `NodeParams` made from it each hold the buffer themselves, past the arguments and the
/// caller's handle.
fn untyped_arguments_borrow_and_what_is_made_from_them_holds(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch_buf = buf.release_observer();
    let args = KernelArgs::new().arg(&buf);
    assert_eq!(buf.share_count(), 1, "the arguments borrow the buffer");
    let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    // SAFETY: add_one(int*) writes p[0]; the buffer holds one int.
    unsafe { b.launch_unchecked(&add_one, one(), &args)? };
    drop(args);
    let graph = b.end_building()?.instantiate()?;
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: as above.
    let k =
        unsafe { def.add_kernel_unchecked(&[], &add_one, one(), &KernelArgs::new().arg(&buf))? };
    let exec = def.instantiate()?;
    // Parameters made from borrowed arguments outlive the buffer's handle.
    let (params, other_watch) = {
        let other = gpu.device.alloc_zeroed::<i32>(1)?;
        let watch = other.release_observer();
        // SAFETY: as above.
        let p =
            unsafe { NodeParams::kernel_unchecked(&add_one, one(), KernelArgs::new().arg(&other)) };
        (p, watch)
    };
    assert!(!other_watch.is_released(), "the parameters hold the buffer");
    exec.set_params(&k, params)?;
    drop(buf);
    assert!(
        !watch_buf.is_released(),
        "the graph and the definition hold the buffer"
    );
    let s = gpu.stream();
    graph.launch(&s)?;
    exec.launch(&s)?;
    s.synchronize()?;
    drop((graph, exec));
    assert!(
        !watch_buf.is_released(),
        "the definition's node still holds the buffer"
    );
    drop(def);
    assert!(
        eventually(|| watch_buf.is_released() && other_watch.is_released()),
        "the buffers outlived the graphs and the definition"
    );
    Ok(())
}

/// One `KernelArgs` (it is `Sync`) read at once by threads that each capture into a graph of
/// their own on a stream of their own: every graph holds the buffer the arguments borrow, past
/// the arguments, the streams and the caller's handle.
fn one_argument_list_read_by_threads_capturing_at_once(gpu: &Gpu) -> TestResult {
    const THREADS: usize = 4;
    const LAUNCHES: usize = 50;
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = buf.release_observer();
    let args = KernelArgs::new().arg(&buf);
    let graphs = std::thread::scope(|scope| {
        let capturing: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| -> cuda_graph::Result<Graph> {
                    let s = gpu.device.create_stream()?;
                    let b = s.create_graph_builder().begin_building(Relaxed)?;
                    for _ in 0..LAUNCHES {
                        // SAFETY: add_one(int*) writes p[0]; the buffer holds one int.
                        unsafe { b.launch_unchecked(&add_one, one(), &args)? };
                    }
                    b.end_building()?.instantiate()
                })
            })
            .collect();
        capturing
            .into_iter()
            .map(|t| t.join().expect("a capturing thread panicked"))
            .collect::<cuda_graph::Result<Vec<Graph>>>()
    })?;
    drop(args);
    assert!(
        buf.share_count() > THREADS,
        "each graph holds the buffer ({} holders)",
        buf.share_count()
    );
    let s = gpu.stream();
    for g in &graphs {
        g.launch(&s)?;
    }
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [(THREADS * LAUNCHES) as i32]);
    drop(buf);
    assert!(!watch.is_released(), "the graphs hold the buffer");
    drop(graphs);
    assert!(
        eventually(|| watch.is_released()),
        "the buffer outlived its graphs"
    );
    Ok(())
}

fn typed_kernels_set_conditions(gpu: &Gpu) -> TestResult {
    // SAFETY: set_condition(cudaGraphConditionalHandle h, unsigned value) touches no memory.
    let set = unsafe {
        gpu.module
            .kernel::<(ConditionalHandle, u32)>("set_condition")?
    };
    // SAFETY: add_one(int* p) writes p[0] only.
    let add_one = unsafe { gpu.module.kernel::<(*mut i32,)>("add_one")? };
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    for (value, expect) in [(0u32, 0), (1, 1)] {
        let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
        let h = b.create_conditional_handle(Some(0))?;
        b.launch(&set, one(), (h, value))?;
        let body = b.add_if(&h)?.begin_building(Global)?;
        body.launch(&add_one, one(), &buf)?;
        body.end_building()?;
        let g = b.end_building()?.instantiate()?;
        buf.copy_from(&[0])?;
        g.launch(&s)?;
        s.synchronize()?;
        assert_eq!(buf.to_vec()?, [expect], "condition {value}");
    }
    // A handle works only in its graph: refused on a plain stream, in another capture, and in
    // another definition (directly and as node parameters).
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = b.create_conditional_handle(Some(0))?;
    match s.launch(&set, one(), (h, 1)) {
        Err(e) if e.refusal() == Some(Refusal::Capture) => {}
        r => return Err(format!("a handle on a plain stream: {r:?}").into()),
    }
    let other = gpu.device.create_graph_builder()?.begin_building(Global)?;
    assert!(matches!(
        other.launch(&set, one(), (h, 1)),
        Err(Error::ForeignConditionalHandle)
    ));
    drop(other);
    let def = GraphDefinition::new(&gpu.device)?;
    assert!(matches!(
        def.add_kernel(&[], &set, one(), (h, 1)),
        Err(Error::ForeignConditionalHandle)
    ));
    let own = def.create_conditional_handle(Some(0))?;
    let k = def.add_kernel(&[], &set, one(), (own, 1))?;
    assert!(matches!(
        def.set_params(&k, NodeParams::kernel(&set, one(), (h, 1))?),
        Err(Error::ForeignConditionalHandle)
    ));
    drop(b);
    Ok(())
}

fn slices_carry_their_length(gpu: &Gpu) -> TestResult {
    // SAFETY: fill_slice(Slice<int> p, int v) writes p.ptr[i] for i < p.len only.
    let fill = unsafe { gpu.module.kernel::<(Slice<i32>, i32)>("fill_slice")? };
    // SAFETY: copy_slice_i32(Slice<const int>, Slice<int>) copies min(len) elements.
    let copy = unsafe {
        gpu.module
            .kernel::<(Slice<i32>, Slice<i32>)>("copy_slice_i32")?
    };
    let buf = gpu.device.alloc_zeroed::<i32>(1000)?;
    let s = gpu.stream();
    // A grid far larger than the data: the kernel stops at the length it is given.
    let big = LaunchConfig::for_num_elems(4096);
    s.launch(&fill, big, (&buf.slice(10..20)?, 7))?;
    s.synchronize()?;
    let v = buf.to_vec()?;
    assert!(v[10..20].iter().all(|&x| x == 7), "{:?}", &v[..30]);
    assert_eq!(v.iter().filter(|&&x| x != 0).count(), 10);
    // In a capture and in a definition, with the view's length.
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    b.launch(&fill, big, (&buf, 1))?;
    b.launch(&fill, big, (&buf.slice(..3)?, 2))?;
    let g = b.end_building()?.instantiate()?;
    g.launch(&s)?;
    let dst = gpu.device.alloc_zeroed::<i32>(5)?;
    let def = GraphDefinition::new(&gpu.device)?;
    def.add_kernel(&[], &copy, big, (&buf, &dst))?;
    let exec = def.instantiate()?;
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(dst.to_vec()?, [2, 2, 2, 1, 1]);
    // Declared with pointers, a slice kernel is refused: its parameters are 16 bytes.
    if cuda_graph::driver_version()? >= DriverVersion(12040) {
        // SAFETY: wrong on purpose; refused before any launch.
        let wrong = unsafe { gpu.module.kernel::<(*mut i32, i32)>("fill_slice") };
        match wrong {
            Err(Error::InvalidArgument(t)) if t.kind() == Refusal::Declaration => {
                assert!(t.contains("parameter 0 is 16 bytes"), "{t}")
            }
            other => return Err(format!("expected a refused declaration, got {other:?}").into()),
        }
    }
    Ok(())
}

fn graph_allocations_as_buffers(gpu: &Gpu) -> TestResult {
    // SAFETY: copy_slice_i32(Slice<const int>, Slice<int>) copies min(len) elements.
    let copy = unsafe {
        gpu.module
            .kernel::<(Slice<i32>, Slice<i32>)>("copy_slice_i32")?
    };
    // SAFETY: fill_slice(Slice<int> p, int v) writes p.ptr[i] for i < p.len only.
    let fill = unsafe { gpu.module.kernel::<(Slice<i32>, i32)>("fill_slice")? };
    let s = gpu.stream();
    let big = LaunchConfig::for_num_elems(1024);
    // A definition: alloc -> memset -> fill half -> copy out -> free.
    let out = gpu.device.alloc_zeroed::<i32>(8)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let (alloc, scratch) = def.add_mem_alloc(&[], 8 * 4)?;
    // SAFETY: used only by the nodes below, each after `alloc` and before the free node.
    let tmp = unsafe { scratch.as_buffer::<i32>()? };
    assert_eq!(tmp.len(), 8);
    let set = def.add_memset(&[&alloc], &tmp, 5i32)?;
    let half = def.add_kernel(&[&set], &fill, big, (&tmp.slice(4..)?, 9))?;
    let copied = def.add_kernel(&[&half], &copy, big, (&tmp, &out))?;
    def.add_mem_free(&[&copied], scratch)?;
    let exec = def.instantiate()?;
    for _ in 0..3 {
        exec.launch(&s)?;
    }
    s.synchronize()?;
    assert_eq!(out.to_vec()?, [5, 5, 5, 5, 9, 9, 9, 9]);
    // A capture: alloc_async -> memset -> copy (memcpy) out -> free_async.
    let out2 = gpu.device.alloc_zeroed::<i32>(4)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let scratch = b.alloc_async(4 * 4)?;
    // SAFETY: used only in this capture, between its allocation and its free, on one stream.
    let tmp = unsafe { scratch.as_buffer::<i32>()? };
    b.memset_d32(&tmp, 3)?;
    b.launch(&fill, big, (&tmp.slice(..1)?, 1))?;
    b.memcpy_dtod(&out2, &tmp)?;
    b.free_async(scratch)?;
    let g = b.end_building()?.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(out2.to_vec()?, [1, 3, 3, 3]);
    // Sizes that are not a whole number of elements are refused.
    let def = GraphDefinition::new(&gpu.device)?;
    let (_, odd) = def.add_mem_alloc(&[], 6)?;
    // SAFETY: refused before any use.
    assert!(matches!(
        unsafe { odd.as_buffer::<i32>() },
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    Ok(())
}

/// `GraphAllocation::view`: typed kernels take the view (no `unsafe`) only where the graph
/// orders them after the allocation and before its free; everywhere else it is refused.
fn graph_buffers_are_safe_views_checked_in_order(gpu: &Gpu) -> TestResult {
    // SAFETY: copy_slice_i32(Slice<const int>, Slice<int>) copies min(len) elements.
    let copy = unsafe {
        gpu.module
            .kernel::<(ConstSlice<i32>, Slice<i32>)>("copy_slice_i32")?
    };
    // SAFETY: fill_slice(Slice<int> p, int v) writes p.ptr[i] for i < p.len only.
    let fill = unsafe { gpu.module.kernel::<(Slice<i32>, i32)>("fill_slice")? };
    // SAFETY: add_one(int* p) adds one to p[0].
    let add_one = unsafe { gpu.module.kernel::<(*mut i32,)>("add_one")? };
    let s = gpu.stream();
    let cfg = LaunchConfig::for_num_elems(64);
    let refused = |r: cuda_graph::Result<KernelNode>, kind: Refusal| -> TestResult {
        match r {
            Err(e) if e.refusal() == Some(kind) => Ok(()),
            other => Err(format!("expected a refusal of kind {kind:?}, got {other:?}").into()),
        }
    };

    // A definition: alloc -> fill -> (+1 at 0) -> copy out -> free.
    let out = gpu.device.alloc_zeroed::<i32>(8)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let (alloc, scratch) = def.add_mem_alloc(&[], 8 * 4)?;
    let tmp = scratch.view::<i32>()?;
    assert_eq!(tmp.len(), 8);
    let filled = def.add_kernel(&[&alloc], &fill, cfg, (&tmp, 6))?;
    let bumped = def.add_kernel(
        &[&filled],
        &add_one,
        LaunchConfig::single(),
        &tmp.slice(3..)?,
    )?;
    // Not after the allocation node: refused, with nothing added.
    let before = def.nodes()?.len();
    refused(def.add_kernel(&[], &fill, cfg, (&tmp, 1)), Refusal::Order)?;
    assert_eq!(def.nodes()?.len(), before);
    // In another graph: refused.
    let other = GraphDefinition::new(&gpu.device)?;
    refused(
        other.add_kernel(&[], &fill, cfg, (&tmp, 1)),
        Refusal::ForeignGraph,
    )?;
    // On a plain stream, and in node parameters: refused.
    match s.launch(&fill, cfg, (&tmp, 1)) {
        Err(e) if e.refusal() == Some(Refusal::Capture) => {}
        other => return Err(format!("a plain-stream launch of a GraphBuffer: {other:?}").into()),
    }
    assert!(matches!(
        NodeParams::kernel(&fill, cfg, (&tmp, 1)),
        Err(e) if e.refusal() == Some(Refusal::Order)
    ));
    // A second user beside the first: the free must come after both.
    let side = def.add_kernel(
        &[&filled],
        &add_one,
        LaunchConfig::single(),
        &tmp.slice(7..)?,
    )?;
    let copied = def.add_kernel(&[&bumped], &copy, cfg, (&tmp, &out))?;
    let copied_after_side = def.add_empty(&[&copied, &side])?;
    def.add_mem_free(&[&copied_after_side], scratch)?;
    let exec = def.instantiate()?;
    for _ in 0..3 {
        exec.launch(&s)?;
    }
    s.synchronize()?;
    let got = out.to_vec()?;
    // The side kernel and the copy are unordered (both after the fill): 6 or 7 at element 7;
    // everything else is exact.
    assert_eq!(&got[..7], &[6, 6, 6, 7, 6, 6, 6]);
    assert!(got[7] == 6 || got[7] == 7, "{got:?}");

    // A free whose dependencies miss a user is refused (the allocation stays allocated; the exec
    // frees it when dropped).
    let def2 = GraphDefinition::new(&gpu.device)?;
    let (alloc2, scratch2) = def2.add_mem_alloc(&[], 4 * 4)?;
    let v2 = scratch2.view::<i32>()?;
    let a = def2.add_kernel(&[&alloc2], &fill, cfg, (&v2, 2))?;
    let _b = def2.add_kernel(&[&alloc2], &fill, cfg, (&v2, 3))?;
    match def2.add_mem_free(&[&a], scratch2) {
        Err(e) if e.refusal() == Some(Refusal::Order) => {}
        other => return Err(format!("a free before a user: {other:?}").into()),
    }
    let exec2 = def2.instantiate()?;
    exec2.launch(&s)?;
    s.synchronize()?;
    drop(exec2);

    // An exec takes no update from another graph's views (its kernels would address memory this
    // exec does not map); its own source is fine.
    let twin = GraphDefinition::new(&gpu.device)?;
    let (ta, tscratch) = twin.add_mem_alloc(&[], 8 * 4)?;
    let tv = tscratch.view::<i32>()?;
    twin.add_kernel(&[&ta], &fill, cfg, (&tv, 1))?;
    let plain = GraphDefinition::new(&gpu.device)?;
    let (pa, _pscratch) = plain.add_mem_alloc(&[], 8 * 4)?;
    plain.add_empty(&[&pa])?;
    let pexec = plain.instantiate()?;
    match pexec.update(&twin) {
        Err(Error::Update {
            reason: cuda_graph::UpdateFailure::GraphMemory,
            ..
        }) => {}
        other => return Err(format!("an update from another graph's views: {other:?}").into()),
    }
    exec.update(&def)?;
    drop(pexec);

    // A capture: alloc_async -> fill -> copy out -> free_async, and the refusals there.
    let out2 = gpu.device.alloc_zeroed::<i32>(4)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    let [before_alloc, idle] = b.split::<2>()?;
    let scratch = b.alloc_async(4 * 4)?;
    let tmp = scratch.view::<i32>()?;
    // A fork made before the allocation does not run after it.
    match before_alloc.launch(&fill, cfg, (&tmp, 4)) {
        Err(e) if e.refusal() == Some(Refusal::Order) => {}
        other => return Err(format!("a fork older than the allocation: {other:?}").into()),
    }
    b.join([before_alloc, idle])?;
    b.launch(&fill, cfg, (&tmp, 4))?;
    b.launch(&add_one, LaunchConfig::single(), &tmp)?;
    let [late, idle2] = b.split::<2>()?;
    late.launch(&add_one, LaunchConfig::single(), &tmp.slice(1..)?)?;
    b.launch(&copy, cfg, (&tmp, &out2))?;
    b.join([late, idle2])?;
    b.free_async(scratch)?;
    let g = b.end_building()?.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    let got = out2.to_vec()?;
    assert_eq!(got[0], 5);
    assert!(got[1] == 4 || got[1] == 5, "{got:?}");
    assert_eq!(&got[2..], &[4, 4]);

    // A free on the primary stream while a fork's user is not joined yet: refused.
    let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    let scratch = b.alloc_async(4 * 4)?;
    let tmp = scratch.view::<i32>()?;
    let [user, idle] = b.split::<2>()?;
    user.launch(&fill, cfg, (&tmp, 1))?;
    match b.free_async(scratch) {
        Err(e) if e.refusal() == Some(Refusal::Order) => {}
        other => return Err(format!("a free before a fork's user: {other:?}").into()),
    }
    b.join([user, idle])?;
    let g = b.end_building()?.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    Ok(())
}

/// A use of a buffer on a stream.
type Use<'a> = &'a dyn Fn(&Stream, &DeviceBuffer<i32>) -> cuda_graph::Result<()>;

/// Notes when it is dropped: the owner of borrowed memory.
struct Owner(std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>);

impl Drop for Owner {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }
}

fn borrowed_memory_outlives_the_stream_work_that_uses_it(gpu: &Gpu) -> TestResult {
    // SAFETY: spin(unsigned long long ns) touches no memory; add_one touches p[0] only.
    let (spin, add_one) = unsafe {
        (
            gpu.module.kernel::<(u64,)>("spin")?,
            gpu.module.kernel::<(*mut i32,)>("add_one")?,
        )
    };
    let backing = gpu.device.alloc_zeroed::<i32>(4)?;
    let s = gpu.stream();
    let uses: [Use<'_>; 3] = [
        &|s, b| s.launch(&add_one, one(), b),
        &|s, b| s.memset_d32(b, 1),
        &|s, b| s.memcpy_dtod(b, &backing),
    ];
    const SPIN: std::time::Duration = std::time::Duration::from_millis(300);
    for (i, use_it) in uses.iter().enumerate() {
        let dropped_at = std::sync::Arc::new(std::sync::Mutex::new(None));
        // SAFETY: `backing` holds 4 ints of device 0 and outlives the owner, which frees
        // nothing; the test only watches when the owner is dropped.
        let borrowed = unsafe {
            DeviceBuffer::<i32>::from_raw(
                &gpu.device,
                backing.device_ptr(),
                4,
                Owner(dropped_at.clone()),
            )?
        };
        // The stream is busy for 300 ms, then the work that uses the borrowed memory runs: the
        // owner (which may free the memory on a stream of its own) must not go before that.
        let t0 = std::time::Instant::now();
        s.launch(&spin, one(), SPIN.as_nanos() as u64)?;
        use_it(&s, &borrowed)?;
        let queued = t0.elapsed();
        drop(borrowed);
        s.synchronize()?;
        let done = t0.elapsed();
        assert!(
            eventually(|| dropped_at.lock().map(|d| d.is_some()).unwrap_or(false)),
            "use {i}: the owner outlived the work"
        );
        let at = dropped_at
            .lock()
            .map_err(|_| "poisoned")?
            .map(|d| d.duration_since(t0))
            .ok_or("not dropped")?;
        eprintln!(
            "use {i}: queued in {queued:?}, stream done at {done:?}, owner dropped at {at:?}"
        );
        assert!(
            at >= SPIN.mul_f32(0.9),
            "use {i}: the owner went {at:?} after the launch, while the 300 ms kernel ahead of its work still ran"
        );
    }
    Ok(())
}

/// An exec takes no update from another graph whose kernels use that graph's own allocations
/// (their addresses are the source's, which the exec does not map), even where the source frees
/// them: the refusal saw only allocations not freed yet, and passed such an update to the driver.
/// A cache instantiates the source instead, and says why.
fn updates_from_graphs_whose_kernels_used_their_freed_graph_memory_are_refused(
    gpu: &Gpu,
) -> TestResult {
    // SAFETY: copy_slice_i32(Slice<const int>, Slice<int>) copies min(len) elements.
    let copy = unsafe {
        gpu.module
            .kernel::<(ConstSlice<i32>, Slice<i32>)>("copy_slice_i32")?
    };
    // SAFETY: fill_slice(Slice<int> p, int v) writes p.ptr[i] for i < p.len only.
    let fill = unsafe { gpu.module.kernel::<(Slice<i32>, i32)>("fill_slice")? };
    let cfg = LaunchConfig::for_num_elems(4);
    // alloc -> fill with v -> copy out -> free.
    let twin = |v: i32, out: &DeviceBuffer<i32>| -> cuda_graph::Result<GraphDefinition> {
        let def = GraphDefinition::new(&gpu.device)?;
        let (alloc, scratch) = def.add_mem_alloc(&[], 4 * 4)?;
        let tmp = scratch.view::<i32>()?;
        let filled = def.add_kernel(&[&alloc], &fill, cfg, (&tmp, v))?;
        let copied = def.add_kernel(&[&filled], &copy, cfg, (&tmp, out))?;
        def.add_mem_free(&[&copied], scratch)?;
        Ok(def)
    };
    let outs = [
        gpu.device.alloc_zeroed::<i32>(4)?,
        gpu.device.alloc_zeroed::<i32>(4)?,
    ];
    let a = twin(1, &outs[0])?;
    let b = twin(2, &outs[1])?;
    let s = gpu.stream();
    let exec = a.instantiate()?;
    match exec.update(&b) {
        Err(Error::Update {
            reason: cuda_graph::UpdateFailure::GraphMemory,
            ..
        }) => {}
        Ok(()) => {
            return Err("an update from a graph whose kernels use its own (freed) graph memory was passed to the driver".into())
        }
        other => return Err(format!("an update from another graph's views: {other:?}").into()),
    }
    // The exec is as it was.
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(outs[0].to_vec()?, [1; 4]);
    assert_eq!(outs[1].to_vec()?, [0; 4]);
    drop(exec);

    let c = twin(3, &outs[0])?;
    let d = twin(4, &outs[1])?;
    let mut cache = GraphCache::new(InstantiateOptions::new());
    cache.refresh(&c)?;
    match cache.refresh(&d)? {
        CacheOutcome::Instantiated {
            refused: Some(cuda_graph::UpdateFailure::GraphMemory),
        } => {}
        other => {
            return Err(format!("a cache refreshed from another graph's views: {other:?}").into())
        }
    }
    cache.launch(&s)?;
    s.synchronize()?;
    assert_eq!(outs[1].to_vec()?, [4; 4]);
    Ok(())
}
