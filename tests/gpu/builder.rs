//! The typestate builder: capture, end, complete, launch, update, DOT, faults, threads.

use cuda_graph::prelude::*;

use cuda_graph::GraphDebugPrintOptions;
use cuda_graph::Refusal;

use crate::args;
use crate::support::{eventually, one, Gpu, Needs, TestResult};

crate::gpu_tests! {
    "builder";
    Needs::Gpu =>
        straight_capture_of_three_kernels,
        add_one_captured_once_launched_three_times,
        one_ended_builder_completes_several_times,
        stream_builder_captures_on_that_stream,
        captured_memset_and_memcpy,
        update_with_new_kernel_arguments,
        update_with_changed_topology_fails_and_old_exec_works,
        all_three_capture_modes,
        each_complete_option,
        upload_then_launch,
        dot_file_is_written,
        dot_print_to_unwritable_path_is_an_error,
        drop_mid_capture_leaves_stream_usable,
        panic_while_capturing_unwinds_cleanly,
        invalidated_capture_is_an_error_and_stream_recovers,
        refused_begin_leaves_other_capture_alone,
        relaxed_capture_ends_on_another_thread,
        graph_outlives_builder_and_buffer_handles,
        releases_do_not_invalidate_a_global_capture,
        held_owners_live_as_long_as_the_graph_and_its_execs;
}

fn capture_add_one(
    gpu: &Gpu,
    buf: &DeviceBuffer<i32>,
) -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
    let add_one = gpu.f("add_one");
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { b.launch_unchecked(&add_one, one(), &args![buf])? };
    b.end_building()
}

fn straight_capture_of_three_kernels(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    for (m, c) in [(2i32, 1i32), (3, 0), (1, 5)] {
        // SAFETY: affine(int*, int, int).
        unsafe { b.launch_unchecked(&affine, one(), &args![&buf, m, c])? };
    }
    // Nothing ran yet: capture only records.
    let graph = b.end_building()?.instantiate()?;
    assert_eq!(buf.to_vec()?, [0]);
    let s = gpu.stream();
    graph.launch(&s)?;
    s.synchronize()?;
    // ((0*2+1)*3+0)*1+5 = 8: the three kernels ran in order.
    assert_eq!(buf.to_vec()?, [8]);
    Ok(())
}

fn add_one_captured_once_launched_three_times(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let graph = capture_add_one(gpu, &buf)?.instantiate()?;
    let s = gpu.stream();
    for _ in 0..3 {
        graph.launch(&s)?;
    }
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [3]);
    Ok(())
}

fn one_ended_builder_completes_several_times(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let ended = capture_add_one(gpu, &buf)?;
    let g1 = ended.instantiate()?;
    let g2 = ended.instantiate()?;
    let s = gpu.stream();
    g1.launch(&s)?;
    g2.launch(&s)?;
    g2.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [3]);
    Ok(())
}

fn stream_builder_captures_on_that_stream(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
    assert!(s.is_capturing()?);
    // Work issued on the stream itself is captured too.
    // SAFETY: add_one(int*).
    unsafe { s.launch_unchecked(&add_one, one(), &args![&buf])? };
    unsafe { b.launch_unchecked(&add_one, one(), &args![&buf])? };
    let g = b.end_building()?.instantiate()?;
    assert!(!s.is_capturing()?);
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [2]);
    Ok(())
}

fn captured_memset_and_memcpy(gpu: &Gpu) -> TestResult {
    let a = gpu.device.alloc_zeroed::<i32>(64)?;
    let b = gpu.device.alloc_zeroed::<i32>(64)?;
    let builder = gpu.device.create_graph_builder()?.begin_building(Global)?;
    builder.memset_d32(&a, 9)?;
    builder.memcpy_dtod(&b, &a)?;
    builder.memset_d8(&a, 0)?;
    // A host-to-device copy cannot be captured: refused, not recorded.
    assert!(matches!(
        builder.stream().memcpy_htod(&a, &[1; 64]),
        Err(e) if e.refusal() == Some(Refusal::Capture)
    ));
    builder.capture_status()?;
    let g = builder.end_building()?.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(b.to_vec()?, vec![9; 64]);
    assert_eq!(a.to_vec()?, vec![0; 64]);
    Ok(())
}

fn update_with_new_kernel_arguments(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.alloc_zeroed::<i32>(1)?;
    let capture = |buf: &DeviceBuffer<i32>,
                   m: i32,
                   c: i32|
     -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
        let bld = gpu.device.create_graph_builder()?.begin_building(Global)?;
        // SAFETY: affine(int*, int, int).
        unsafe { bld.launch_unchecked(&affine, one(), &args![buf, m, c])? };
        bld.end_building()
    };
    let graph = capture(&a, 1, 10)?.instantiate()?;
    let s = gpu.stream();
    graph.launch(&s)?;
    s.synchronize()?;
    assert_eq!((a.to_vec()?[0], b.to_vec()?[0]), (10, 0));
    {
        let source = capture(&b, 1, 5)?;
        graph.update(&source)?;
    }
    // The source builder and its `b` handle share are gone; the exec keeps `b` alive.
    graph.launch(&s)?;
    s.synchronize()?;
    assert_eq!((a.to_vec()?[0], b.to_vec()?[0]), (10, 5));
    Ok(())
}

fn update_with_changed_topology_fails_and_old_exec_works(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let graph = capture_add_one(gpu, &a)?.instantiate()?;
    let other = gpu.device.alloc_zeroed::<i32>(1)?;
    let bld = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe {
        bld.launch_unchecked(&add_one, one(), &args![&other])?;
        bld.launch_unchecked(&add_one, one(), &args![&other])?;
    }
    let source = bld.end_building()?;
    match graph.update(&source) {
        Err(e @ Error::Update { .. }) => {
            println!("{e}");
            assert!(
                matches!(
                    e,
                    Error::Update {
                        reason: cuda_graph::UpdateFailure::TopologyChanged,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("topology changed"), "{e}");
        }
        other => return Err(format!("expected a topology update failure, got {other:?}").into()),
    }
    let s = gpu.stream();
    graph.launch(&s)?;
    s.synchronize()?;
    assert_eq!(
        (a.to_vec()?[0], other.to_vec()?[0]),
        (1, 0),
        "the old exec still writes the old buffer"
    );
    Ok(())
}

fn all_three_capture_modes(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    // SAFETY (all three): add_one(int*).
    let g = gpu.device.create_graph_builder()?.begin_building(Global)?;
    unsafe { g.launch_unchecked(&add_one, one(), &args![&buf])? };
    g.end_building()?.instantiate()?.launch(&s)?;
    let t = gpu
        .device
        .create_graph_builder()?
        .begin_building(ThreadLocal)?;
    unsafe { t.launch_unchecked(&add_one, one(), &args![&buf])? };
    t.end_building()?.instantiate()?.launch(&s)?;
    let r = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    unsafe { r.launch_unchecked(&add_one, one(), &args![&buf])? };
    r.end_building()?.instantiate()?.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [3]);
    Ok(())
}

fn each_complete_option(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let ended = capture_add_one(gpu, &buf)?;
    let s = gpu.stream();
    let options = [
        InstantiateOptions::new().auto_free_on_launch(true),
        InstantiateOptions::new().upload_on(&gpu.stream()),
        InstantiateOptions::new().device_launch(true),
        InstantiateOptions::new().use_node_priority(true),
    ];
    for (i, o) in options.iter().enumerate() {
        let g = ended
            .instantiate_with(o)
            .map_err(|e| format!("option {i}: {e}"))?;
        if let Some(up) = o.upload_stream() {
            up.synchronize()?;
        }
        if o.is_device_launch() {
            g.upload(&s)?;
        }
        g.launch(&s).map_err(|e| format!("option {i}: {e}"))?;
        s.synchronize()?;
        assert_eq!(buf.to_vec()?, [i as i32 + 1], "option {i}");
    }
    Ok(())
}

fn upload_then_launch(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let g = capture_add_one(gpu, &buf)?.instantiate()?;
    let s = gpu.stream();
    g.upload(&s)?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1]);
    Ok(())
}

fn dot_file_is_written(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let ended = capture_add_one(gpu, &buf)?;
    let dir = std::env::temp_dir().join(format!("cuda-graph-dot-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for (name, opts) in [
        ("plain.dot", GraphDebugPrintOptions::default()),
        ("all.dot", GraphDebugPrintOptions::all()),
    ] {
        let path = dir.join(name);
        ended.debug_dot_print(&path, &opts)?;
        let text = std::fs::read_to_string(&path)?;
        assert!(text.contains("digraph"), "{name}: {text}");
        assert!(text.contains("add_one"), "{name} names the kernel: {text}");
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn dot_print_to_unwritable_path_is_an_error(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let ended = capture_add_one(gpu, &buf)?;
    match ended.debug_dot_print("/nonexistent-dir/x/graph.dot", &Default::default()) {
        Err(Error::Io { path, .. }) => assert!(path.contains("nonexistent-dir")),
        other => return Err(format!("expected an Io error, got {other:?}").into()),
    }
    Ok(())
}

fn stream_works(gpu: &Gpu, s: &Stream) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    // SAFETY: add_one(int*).
    unsafe { s.launch_unchecked(&add_one, one(), &args![&buf])? };
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1], "the stream runs work again");
    assert!(!s.is_capturing()?);
    Ok(())
}

fn drop_mid_capture_leaves_stream_usable(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    for mode in 0..3 {
        match mode {
            0 => drop(s.create_graph_builder().begin_building(Global)?),
            1 => drop(s.create_graph_builder().begin_building(ThreadLocal)?),
            _ => {
                let b = s.create_graph_builder().begin_building(Relaxed)?;
                // SAFETY: add_one(int*).
                unsafe { b.launch_unchecked(&add_one, one(), &args![&buf])? };
                let [f1, _f2] = b.split::<2>()?;
                unsafe { f1.launch_unchecked(&add_one, one(), &args![&buf])? };
                // forks and parent dropped mid-capture, in reverse order
            }
        }
        assert!(!s.is_capturing()?, "mode {mode}");
    }
    stream_works(gpu, &s)?;
    assert_eq!(buf.to_vec()?, [0], "discarded captures never ran");
    Ok(())
}

fn panic_while_capturing_unwinds_cleanly(gpu: &Gpu) -> TestResult {
    let s = gpu.stream();
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let b = s.create_graph_builder().begin_building(Global).unwrap();
        // SAFETY: add_one(int*).
        unsafe { b.launch_unchecked(&add_one, one(), &args![&buf]).unwrap() };
        panic!("user code failed mid-capture");
    }));
    assert!(caught.is_err());
    stream_works(gpu, &s)?;
    assert_eq!(buf.to_vec()?, [0]);
    Ok(())
}

fn invalidated_capture_is_an_error_and_stream_recovers(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    let s = gpu.stream();
    let b = s.create_graph_builder().begin_building(Global)?;
    b.memset_d32(&buf, 1)?;
    b.capture_status()?;
    // Synchronising a capturing stream is illegal: it invalidates the capture.
    let sync = b.stream().synchronize();
    assert!(sync.is_err(), "synchronising a capturing stream is refused");
    match b.capture_status() {
        Err(Error::CaptureInvalidated(_)) => {}
        other => {
            return Err(format!("status should report the invalidation, got {other:?}").into())
        }
    }
    match b.end_building() {
        Err(e @ Error::CaptureInvalidated(_)) => println!("{e}"),
        other => return Err(format!("expected CaptureInvalidated, got {other:?}").into()),
    }
    stream_works(gpu, &s)?;
    // A new capture on the same stream works.
    let g = capture_add_one(gpu, &buf)?.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?[0], 1);
    Ok(())
}

fn refused_begin_leaves_other_capture_alone(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    let first = s.create_graph_builder().begin_building(Relaxed)?;
    let second = s.create_graph_builder().begin_building(Relaxed);
    assert!(
        second.is_err(),
        "a stream captures for one builder at a time"
    );
    drop(second);
    first.capture_status()?;
    // SAFETY: add_one(int*).
    unsafe { first.launch_unchecked(&add_one, one(), &args![&buf])? };
    let g = first.end_building()?.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1]);
    Ok(())
}

fn relaxed_capture_ends_on_another_thread(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    // SAFETY: add_one(int*).
    unsafe { b.launch_unchecked(&add_one, one(), &args![&buf])? };
    let ended = std::thread::spawn(move || {
        // SAFETY: as above.
        unsafe { b.launch_unchecked(&add_one, one(), &args![&buf])? };
        b.end_building().map(|e| (e, buf))
    })
    .join()
    .map_err(|_| "the capture thread panicked")??;
    let (ended, buf) = ended;
    let g = ended.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [2]);
    Ok(())
}

fn graph_outlives_builder_and_buffer_handles(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let witness = gpu.device.alloc_zeroed::<i32>(1)?;
    let graph = {
        let add_one = gpu.f("add_one");
        let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
        // SAFETY: add_one(int*).
        unsafe { b.launch_unchecked(&add_one, one(), &args![&buf])? };
        b.memcpy_dtod(&witness, &buf)?;
        b.end_building()?.instantiate()?
    };
    assert!(buf.share_count() >= 2, "the graph holds the buffer");
    drop(buf);
    let s = gpu.stream();
    graph.launch(&s)?;
    graph.launch(&s)?;
    s.synchronize()?;
    assert_eq!(witness.to_vec()?, [2]);
    Ok(())
}

/// Graph-owned resources are released on a background thread; that must never invalidate a
/// `Global` capture running at the same time.
fn releases_do_not_invalidate_a_global_capture(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let (old, probe) = {
        let doomed = gpu.device.alloc_zeroed::<i32>(1 << 20)?;
        let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
        b.memset_d32(&doomed, 1)?;
        let probe = b.add_host_callback(|| {})?;
        (b.end_building()?.instantiate()?, probe)
    };
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { p.launch_unchecked(&add_one, one(), &args![&buf])? };
    drop(old); // releases `doomed` (cuMemFree) on the release thread, possibly mid-capture
    std::thread::sleep(std::time::Duration::from_millis(200));
    let released_mid_capture = probe.is_released();
    p.capture_status()?;
    let g = p.end_building()?.instantiate()?;
    assert!(
        crate::support::eventually(|| probe.is_released()),
        "released after the capture at the latest"
    );
    println!("released while the capture was running: {released_mid_capture}");
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1]);
    Ok(())
}

/// Work recorded by other code (here a memset issued on the raw stream, which the crate never
/// sees) uses memory only `hold` keeps: it lives while the ended builder, the exec or a copy of
/// the graph does, through launches, and goes with the last of them; a second `hold` of the
/// same owner is one hold.
fn held_owners_live_as_long_as_the_graph_and_its_execs(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    let watch = buf.release_observer();
    let s = gpu.stream();
    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
    // SAFETY: a memset of the buffer's 4 words on the capturing stream: recorded into the graph.
    let r = unsafe { cudarc::driver::sys::cuMemsetD32Async(buf.as_raw(), 7, 4, s.as_raw()) };
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    b.hold(buf.clone())?;
    let ended = b.end_building()?;
    let copy = ended.graph_definition()?.try_clone()?;
    let graph = ended.instantiate()?;
    drop(ended);
    let out = buf.clone();
    drop(buf);
    graph.launch(&s)?;
    s.synchronize()?;
    assert_eq!(
        out.to_vec()?,
        [7; 4],
        "the foreign memset was recorded and replayed"
    );
    out.copy_from(&[0; 4])?;
    drop(out);
    assert!(!watch.is_released(), "held by the exec and the copy");
    graph.launch(&s)?;
    s.synchronize()?;
    drop(graph);
    assert!(!watch.is_released(), "held by the copy of the graph");
    drop(copy);
    assert!(
        eventually(|| watch.is_released()),
        "released once the graph, its copy and its exec are gone"
    );
    Ok(())
}
