//! Stream-ordered memory, pinned host buffers, copies that do not synchronise the context, the
//! graph memory pool's usage, and event options (issue "Live alongside cudarc", items 5 and 6).

use cuda_graph::prelude::*;

use cuda_graph::EventOptions;
use cuda_graph::Refusal;

use crate::args;
use crate::support::{eventually, one, stays, Gpu, Needs, TestResult};

crate::gpu_tests! {
    "memory";
    Needs::Gpu =>
        slices_are_views_that_keep_their_allocation,
        captured_alloc_and_free_run_in_every_launch,
        a_captured_allocation_left_unfreed_is_freed_with_the_exec,
        an_exec_dropped_with_allocations_left_does_not_trim_memory_other_execs_keep,
        misused_stream_ordered_memory_is_an_error,
        stream_alloc_async_is_a_device_buffer,
        a_stream_ordered_buffer_that_outlives_its_stream_is_freed,
        a_pinned_buffer_waits_for_copies_on_streams_that_share_a_raw_handle,
        graphs_wait_for_the_stream_ordered_memory_they_use,
        pinned_round_trip,
        a_pinned_buffer_dropped_in_a_host_callback_is_freed,
        pinned_copies_are_refused_in_a_capture,
        synchronous_copies_work_while_another_stream_captures,
        graph_memory_usage_rises_and_falls,
        graphs_with_memory_nodes_refuse_removals,
        event_timing,
        a_free_of_another_graphs_allocation_is_a_foreign_graph_refusal,
        the_graph_memory_and_free_async_doc_examples_run,
        updates_between_graphs_with_memory_nodes_are_refused,
        graph_sets_capture_once_per_key_and_evict_safely;
}

const N: i32 = 1000;

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems(N as u32)
}

/// A graph that allocates scratch memory, fills it with `v`, copies it into `out` and frees it.
fn scratch_graph(gpu: &Gpu, out: &DeviceBuffer<i32>, v: i32) -> cuda_graph::Result<Graph> {
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let scratch = b.alloc_async(N as usize * 4)?;
    // SAFETY: fill(int*, int, int) and copy_i32(const int*, int*, int); scratch and out hold N
    // ints, scratch between its allocation and free.
    unsafe {
        b.launch_unchecked(&gpu.f("fill"), cfg(), &args![&scratch, N, v])?;
        b.launch_unchecked(&gpu.f("copy_i32"), cfg(), &args![&scratch, out, N])?;
    }
    b.free_async(scratch)?;
    b.end_building()?.instantiate()
}

fn captured_alloc_and_free_run_in_every_launch(gpu: &Gpu) -> TestResult {
    let out = gpu.device.alloc_zeroed::<i32>(N as usize)?;
    let g = scratch_graph(gpu, &out, 7)?;
    let s = gpu.stream();
    for launch in 0..3 {
        out.copy_from(&vec![0; N as usize])?;
        g.launch(&s)?;
        s.synchronize()?;
        assert_eq!(out.to_vec()?, vec![7; N as usize], "launch {launch}");
    }
    let held = gpu.device.graph_memory_usage()?;
    assert!(held.used_current >= N as u64 * 4, "{held:?}");
    drop(g);
    assert!(eventually(|| {
        let _ = gpu.device.trim_graph_memory();
        matches!(gpu.device.graph_memory_usage(), Ok(u) if u.reserved_current < held.reserved_current)
    }));
    Ok(())
}

fn a_captured_allocation_left_unfreed_is_freed_with_the_exec(gpu: &Gpu) -> TestResult {
    gpu.device.trim_graph_memory()?;
    let before = gpu.device.graph_memory_in_use()?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let kept = b.alloc_async(1 << 20)?;
    // SAFETY: fill(int*, int, int); kept holds 2^18 ints.
    unsafe { b.launch_unchecked(&gpu.f("fill"), cfg(), &args![&kept, N, 1])? };
    let g = b.end_building()?.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert!(gpu.device.graph_memory_in_use()? >= before + (1 << 20));
    drop(g);
    assert!(
        eventually(|| gpu.device.graph_memory_in_use().ok() == Some(before)),
        "the exec frees and trims what its graph left allocated"
    );
    Ok(())
}

/// An exec that left an allocation frees it when dropped, but trims the device's graph memory
/// pool only when no other exec with memory nodes is alive: the pool keeps their memory for
/// their next launches.
fn an_exec_dropped_with_allocations_left_does_not_trim_memory_other_execs_keep(
    gpu: &Gpu,
) -> TestResult {
    gpu.device.trim_graph_memory()?;
    let out = gpu.device.alloc_zeroed::<i32>(N as usize)?;
    let keeper = scratch_graph(gpu, &out, 7)?;
    let s = gpu.stream();
    keeper.launch(&s)?;
    s.synchronize()?;
    let kept = gpu.device.graph_memory_usage()?.reserved_current;
    assert!(kept >= N as u64 * 4, "{kept}");
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let left = b.alloc_async(1 << 20)?;
    // SAFETY: fill(int*, int, int); left holds 2^18 ints.
    unsafe { b.launch_unchecked(&gpu.f("fill"), cfg(), &args![&left, N, 1])? };
    let leaver = b.end_building()?.instantiate()?;
    leaver.launch(&s)?;
    s.synchronize()?;
    // Idle: released on this thread, now (the allocation freed, the pool left alone).
    drop(leaver);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let now = gpu.device.graph_memory_usage()?;
    assert!(
        now.reserved_current >= kept,
        "the pool kept the other exec's memory: {now:?}, {kept} before"
    );
    // The kept memory serves the other exec's next launch.
    keeper.launch(&s)?;
    s.synchronize()?;
    assert_eq!(out.to_vec()?, vec![7; N as usize]);
    drop(keeper);
    assert!(
        eventually(
            || matches!(gpu.device.graph_memory_usage(), Ok(u) if u.reserved_current < kept)
        ),
        "the last exec with memory nodes trims the pool"
    );
    Ok(())
}

fn misused_stream_ordered_memory_is_an_error(gpu: &Gpu) -> TestResult {
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    assert!(matches!(b.alloc_async(0), Err(e) if e.refusal() == Some(Refusal::Size)));
    assert!(matches!(
        b.stream().alloc_async::<i32>(4),
        Err(e) if e.refusal() == Some(Refusal::Capture)
    ));
    let mine = b.alloc_async(64)?;
    b.end_building()?;
    // An allocation of another graph cannot be freed in this one.
    let other = gpu.device.create_graph_builder()?.begin_building(Global)?;
    assert!(matches!(
        other.free_async(mine),
        Err(e) if e.refusal() == Some(Refusal::ForeignGraph)
    ));
    other.end_building()?;
    let s = gpu.stream();
    assert!(matches!(
        s.alloc_async::<i32>(0),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    assert!(matches!(
        s.alloc_async::<u64>(usize::MAX / 4),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    Ok(())
}

fn stream_alloc_async_is_a_device_buffer(gpu: &Gpu) -> TestResult {
    let (a, b) = (gpu.stream(), gpu.stream());
    for _ in 0..3 {
        let buf = a.alloc_async::<i32>(N as usize)?;
        // Zeroed, and readable without waiting for `a` (to_vec waits for the allocation).
        assert_eq!(buf.to_vec()?, vec![0; N as usize]);
        // SAFETY: fill(int*, int, int); buf holds N ints.
        unsafe { a.launch_unchecked(&gpu.f("fill"), cfg(), &args![&buf, N, 3])? };
        a.synchronize()?;
        assert_eq!(buf.to_vec()?, vec![3; N as usize]);
        // Another stream may not use it (its free is ordered on `a` only): refused, not raced.
        assert!(matches!(
            b.memset_d32(&buf, 9),
            Err(e) if e.refusal() == Some(Refusal::Order)
        ));
        // SAFETY: fill(int*, int, int); buf holds N ints.
        let on_b = unsafe { b.launch_unchecked(&gpu.f("fill"), cfg(), &args![&buf, N, 5]) };
        assert!(matches!(on_b, Err(e) if e.refusal() == Some(Refusal::Order)));
        a.memset_d32(&buf, 9)?;
        a.synchronize()?;
        assert_eq!(buf.to_vec()?[N as usize - 1], 9);
        a.memset_d32(&buf, 4)?;
        a.free_async(buf)?;
    }
    a.synchronize()?;
    b.synchronize()?;
    Ok(())
}

/// A buffer from `alloc_async` holds its stream; dropped after every `Stream` of it, its free
/// drops the stream's last handle, whose destroy is asked for while the free runs. That nested
/// destroy once waited for the lock the free held (the release path's order lock): the drop
/// never returned, and no destroy in the process ran again. Run on a thread of its own, so a
/// hang fails the test instead of stopping the suite.
fn a_stream_ordered_buffer_that_outlives_its_stream_is_freed(gpu: &Gpu) -> TestResult {
    let device = gpu.device.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let run = || -> cuda_graph::Result<()> {
            for _ in 0..3 {
                // The `Stream` is dropped at the end of the statement: the buffer holds the last
                // handle of its stream.
                let buf = device.create_stream()?.alloc_async::<u8>(4096)?;
                drop(buf);
                // The same through a graph: the capture's keep set holds the buffer, and the
                // graph outlives the builder, the stream and the buffer's own handle.
                let s = device.create_stream()?;
                let kept = s.alloc_async::<u8>(4096)?;
                let b = s.create_graph_builder().begin_building(Relaxed)?;
                b.memset_d8(&kept, 1)?;
                let graph = b.end_building()?.instantiate()?;
                drop((s, kept));
                drop(graph);
            }
            // Destroys still run afterwards (the graph's keep set may have been dropped on the
            // release thread: a hang there blocks every later destroy, this stream's too).
            let s = device.create_stream()?;
            let buf = s.alloc_async::<i32>(N as usize)?;
            s.memset_d32(&buf, 7)?;
            let back = buf.to_vec()?;
            drop(s);
            drop(buf);
            assert_eq!(back, vec![7; N as usize]);
            Ok(())
        };
        let _ = tx.send(run().map_err(|e| e.to_string()));
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(done) => Ok(done?),
        Err(_) => Err("dropping a stream-ordered buffer after its stream hung".into()),
    }
}

fn pinned_round_trip(gpu: &Gpu) -> TestResult {
    let s = gpu.stream();
    let mut host = gpu.device.alloc_pinned::<i32>(N as usize)?;
    assert_eq!(host.as_slice()?, vec![0; N as usize]);
    for (i, v) in host.as_mut_slice()?.iter_mut().enumerate() {
        *v = i as i32;
    }
    let dev = gpu.device.alloc_zeroed::<i32>(N as usize)?;
    s.memcpy_htod_async(&dev, &host)?;
    // SAFETY: add_one(int*): dev[0] += 1.
    unsafe { s.launch_unchecked(&gpu.f("add_one"), one(), &args![&dev])? };
    let mut back = gpu.device.alloc_pinned::<i32>(N as usize)?;
    s.memcpy_dtoh_async(&mut back, &dev)?;
    // No synchronize: as_slice waits for the copy.
    let got = back.as_slice()?;
    assert_eq!(got[0], 1);
    assert!(got[1..].iter().enumerate().all(|(i, &v)| v == i as i32 + 1));
    // Lengths must match; zero and overflowing sizes are errors.
    let short = gpu.device.alloc_zeroed::<i32>(3)?;
    assert!(matches!(
        s.memcpy_htod_async(&short, &host),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    assert!(matches!(
        gpu.device.alloc_pinned::<i32>(0),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    assert!(matches!(
        gpu.device.alloc_pinned::<u64>(usize::MAX / 2),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    // An element type aligned more strictly than the driver aligned the memory is refused
    // (a slice of it would be misaligned); where the memory happens to be aligned, it works.
    #[derive(Clone, Copy)]
    #[repr(C, align(33554432))]
    struct Huge([u8; 1 << 25]);
    // SAFETY: plain bytes.
    unsafe impl DeviceCopy for Huge {}
    match gpu.device.alloc_pinned::<Huge>(1) {
        Err(e) if e.refusal() == Some(Refusal::Size) => {}
        Ok(b) => assert!(b.as_slice()?.as_ptr().cast::<u8>().align_offset(1 << 25) == 0),
        Err(e) => return Err(e.into()),
    }
    // Dropped right after queuing a copy: the drop waits for it.
    let tmp = gpu.device.alloc_pinned::<i32>(N as usize)?;
    s.memcpy_htod_async(&dev, &tmp)?;
    drop(tmp);
    s.synchronize()?;
    assert_eq!(dev.to_vec()?, vec![0; N as usize]);
    Ok(())
}

/// A stream made after another was dropped can get the dropped one's raw handle while the old
/// stream's copy still runs: a pinned buffer that told its copies' streams apart by raw value
/// waited only for the newer one.
fn a_pinned_buffer_waits_for_copies_on_streams_that_share_a_raw_handle(gpu: &Gpu) -> TestResult {
    let late = gpu.device.htod(&[7; 4])?;
    let early = gpu.device.htod(&[1; 4])?;
    let mut host = gpu.device.alloc_pinned::<i32>(4)?;
    let mut reused = 0;
    for _ in 0..4 {
        let a = gpu.device.create_stream()?;
        let raw = a.as_raw();
        // SAFETY: spin(ns) only reads the clock.
        unsafe { a.launch_unchecked(&gpu.f("spin"), one(), &args![100_000_000u64])? };
        a.memcpy_dtoh_async(&mut host, &late)?;
        let a_done = gpu.device.create_event()?;
        a.record(&a_done)?;
        drop(a);
        let mut made = Vec::new();
        for _ in 0..8 {
            let s = gpu.device.create_stream()?;
            let same = s.as_raw() == raw;
            made.push(s);
            if same {
                reused += 1;
                break;
            }
        }
        let b = made.last().ok_or("no stream made")?;
        b.memcpy_dtoh_async(&mut host, &early)?;
        let seen = host.as_slice()?.to_vec();
        assert!(
            a_done.is_complete()?,
            "host access waited for the first stream's copy too"
        );
        // Both copies wrote it, in either order (compute-sanitizer runs streams one by one).
        assert!(seen == [7; 4] || seen == [1; 4], "{seen:?}");
    }
    println!("a dropped stream's raw handle was handed out again {reused} of 4 times");
    Ok(())
}

fn pinned_copies_are_refused_in_a_capture(gpu: &Gpu) -> TestResult {
    let mut host = gpu.device.alloc_pinned::<i32>(4)?;
    let dev = gpu.device.alloc_zeroed::<i32>(4)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    assert!(matches!(
        b.stream().memcpy_htod_async(&dev, &host),
        Err(e) if e.refusal() == Some(Refusal::Capture)
    ));
    assert!(matches!(
        b.stream().memcpy_dtoh_async(&mut host, &dev),
        Err(e) if e.refusal() == Some(Refusal::Capture)
    ));
    b.capture_status()?;
    b.end_building()?;
    assert_eq!(host.as_slice()?, [0; 4]);
    Ok(())
}

fn synchronous_copies_work_while_another_stream_captures(gpu: &Gpu) -> TestResult {
    let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    // SAFETY: empty_kernel().
    unsafe { b.launch_unchecked(&gpu.f("empty_kernel"), one(), &KernelArgs::new())? };
    let buf = gpu.device.htod(&[1, 2, 3])?;
    assert_eq!(buf.to_vec()?, [1, 2, 3]);
    buf.copy_from(&[4, 5, 6])?;
    assert_eq!(buf.to_vec()?, [4, 5, 6]);
    let other = gpu.stream();
    let ordered = other.alloc_async::<i32>(3)?;
    assert_eq!(ordered.to_vec()?, [0, 0, 0]);
    b.capture_status()?;
    b.end_building()?;
    Ok(())
}

fn graph_memory_usage_rises_and_falls(gpu: &Gpu) -> TestResult {
    const BYTES: usize = 8 << 20;
    gpu.device.trim_graph_memory()?;
    gpu.device.reset_graph_memory_high_watermarks()?;
    let start = gpu.device.graph_memory_usage()?;
    assert_eq!(start.used_high, start.used_current);
    let def = GraphDefinition::new(&gpu.device)?;
    let (alloc, mem) = def.add_mem_alloc(&[], BYTES)?;
    def.add_mem_free(&[&alloc], mem)?;
    let g = def.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    let after = gpu.device.graph_memory_usage()?;
    assert!(
        after.used_high >= start.used_current + BYTES as u64,
        "{after:?}"
    );
    assert!(after.reserved_current >= BYTES as u64, "{after:?}");
    assert!(after.reserved_high >= after.reserved_current);
    drop(g);
    drop(def);
    gpu.device.trim_graph_memory()?;
    let trimmed = gpu.device.graph_memory_usage()?;
    assert!(
        trimmed.reserved_current < after.reserved_current,
        "{trimmed:?}"
    );
    gpu.device.reset_graph_memory_high_watermarks()?;
    let reset = gpu.device.graph_memory_usage()?;
    assert!(reset.used_high < after.used_high, "{reset:?}");
    Ok(())
}

/// CUDA forbids deleting nodes or edges of a graph holding memory allocation or free nodes:
/// `destroy_node` and `remove_edge` refuse it (destroying the free node would also have left
/// its allocation to no one). The graph is unchanged: it runs twice (a graph whose allocation
/// is still live cannot be launched again) and gives its memory back when dropped.
fn graphs_with_memory_nodes_refuse_removals(gpu: &Gpu) -> TestResult {
    const BYTES: usize = 64 << 20;
    gpu.device.trim_graph_memory()?;
    let def = GraphDefinition::new(&gpu.device)?;
    let (alloc, mem) = def.add_mem_alloc(&[], BYTES)?;
    let free = def.add_mem_free(&[&alloc], mem)?;
    let refused = |r: cuda_graph::Result<()>| matches!(r, Err(e) if e.refusal() == Some(Refusal::Unsupported));
    assert!(refused(def.destroy_node(free)), "destroying the free node");
    assert!(
        refused(def.destroy_node(alloc)),
        "destroying the allocation node"
    );
    assert!(
        refused(def.remove_edge(&alloc, &free)),
        "removing their edge"
    );
    let g = def.instantiate()?;
    let s = gpu.stream();
    for _ in 0..2 {
        g.launch(&s)?;
        s.synchronize()?;
    }
    let after = gpu.device.graph_memory_usage()?;
    assert!(after.reserved_current >= BYTES as u64, "{after:?}");
    drop(g);
    drop(def);
    gpu.device.trim_graph_memory()?;
    let trimmed = gpu.device.graph_memory_usage()?;
    assert!(
        trimmed.reserved_current < after.reserved_current,
        "the graph gave its memory back: {after:?} then {trimmed:?}"
    );
    Ok(())
}

fn event_timing(gpu: &Gpu) -> TestResult {
    let timing = EventOptions::default().timing(true);
    let (start, end) = (
        gpu.device.create_event_with(&timing)?,
        gpu.device.create_event_with(&timing.blocking_sync(true))?,
    );
    assert_eq!(start.options(), timing);
    assert!(end.options().has_blocking_sync());
    let plain = gpu.device.create_event()?;
    assert_eq!(plain.options(), EventOptions::default());
    let s = gpu.stream();
    s.record(&start)?;
    // SAFETY: spin(unsigned long long ns): 2 ms.
    unsafe { s.launch_unchecked(&gpu.f("spin"), one(), &args![2_000_000u64])? };
    s.record(&end)?;
    s.record(&plain)?;
    end.synchronize()?;
    let ms = start.elapsed_ms(&end)?;
    assert!((1.5..1000.0).contains(&ms), "{ms} ms");
    assert!(matches!(
        start.elapsed_ms(&plain),
        Err(e) if e.refusal() == Some(Refusal::Unsupported)
    ));
    assert!(matches!(
        plain.elapsed_ms(&end),
        Err(e) if e.refusal() == Some(Refusal::Unsupported)
    ));
    Ok(())
}

/// `DeviceBuffer::slice`: a view at an offset, usable as a kernel argument, a memset and copy
/// operand and for `to_vec`, that keeps the whole allocation alive; out-of-range slices are
/// refused; a part of a stream-ordered buffer stays on its stream.
fn slices_are_views_that_keep_their_allocation(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.htod(&[0i32, 1, 2, 3, 4, 5, 6, 7])?;
    let mid = buf.slice(2..6)?;
    assert_eq!(mid.len(), 4);
    assert_eq!(mid.device_ptr(), buf.device_ptr() + 8);
    let s = gpu.stream();
    s.memset_d32(&mid, 9)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [0, 1, 9, 9, 9, 9, 6, 7]);
    assert_eq!(mid.to_vec()?, [9; 4]);
    assert_eq!(buf.slice(..=1)?.to_vec()?, [0, 1]);
    // A graph that uses only a slice keeps the whole allocation.
    let watch = buf.release_observer();
    let tail = buf.slice(6..)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: fill(int* p, int n, int v) over the 2 ints of `tail`.
    unsafe { b.launch_unchecked(&gpu.f("fill"), one(), &args![&tail, 2i32, 5i32])? };
    let g = b.end_building()?.instantiate()?;
    let copy = buf.clone();
    drop((buf, mid, tail));
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(copy.to_vec()?, [0, 1, 9, 9, 9, 9, 5, 5]);
    drop(copy);
    assert!(
        stays(|| !watch.is_released()),
        "the graph holds the slice's allocation"
    );
    drop(g);
    assert!(eventually(|| watch.is_released()));
    // Empty and out-of-range slices are refused.
    let small = gpu.device.alloc_zeroed::<i32>(4)?;
    for bad in [small.slice(3..3), small.slice(2..5), small.slice(4..)] {
        assert!(matches!(bad, Err(e) if e.refusal() == Some(Refusal::Size)));
    }
    // A part of a stream-ordered buffer stays on its stream.
    let (a, other) = (gpu.stream(), gpu.stream());
    let ordered = a.alloc_async::<i32>(16)?;
    let part = ordered.slice(4..8)?;
    assert!(matches!(
        other.memset_d32(&part, 1),
        Err(e) if e.refusal() == Some(Refusal::Order)
    ));
    a.memset_d32(&part, 1)?;
    a.synchronize()?;
    assert_eq!(ordered.to_vec()?[3..9], [0, 1, 1, 1, 1, 0]);
    drop(part);
    a.free_async(ordered)?;
    a.synchronize()?;
    Ok(())
}

/// `Stream::alloc_async` queues the allocation and its zeroing on its stream, here behind a
/// 200 ms kernel. A graph that writes the buffer may launch on any stream; its first launch
/// must wait for them, or the zeroing runs after the graph's write and wipes it (and before the
/// allocation was made the memory was not the buffer's yet). Built both ways: a definition
/// node, and a per-node update of another exec's parameters to the new buffer.
fn graphs_wait_for_the_stream_ordered_memory_they_use(gpu: &Gpu) -> TestResult {
    // SAFETY: fill(int* p, int n, int v) writes p[0..n); spin(unsigned long long ns).
    let fill: Kernel<(*mut i32, i32, i32)> = unsafe { gpu.module.kernel("fill")? };
    let spin: Kernel<(u64,)> = unsafe { gpu.module.kernel("spin")? };
    let a = gpu.stream();
    let c = gpu.stream();

    a.launch(&spin, one(), 200_000_000u64)?;
    let buf = a.alloc_async::<i32>(4)?;
    let def = GraphDefinition::new(&gpu.device)?;
    def.add_kernel(&[], &fill, one(), (&buf, 4, 7))?;
    def.instantiate()?.launch(&c)?;
    c.synchronize()?;
    a.synchronize()?;
    assert_eq!(
        buf.to_vec()?,
        [7; 4],
        "the graph ran before the allocation's zeroing"
    );

    let other = gpu.device.alloc_zeroed::<i32>(4)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let node = def.add_kernel(&[], &fill, one(), (&other, 4, 1))?;
    let g = def.instantiate()?;
    g.launch(&c)?;
    c.synchronize()?;
    a.launch(&spin, one(), 200_000_000u64)?;
    let fresh = a.alloc_async::<i32>(4)?;
    g.set_params(&node, NodeParams::kernel(&fill, one(), (&fresh, 4, 9))?)?;
    g.launch(&c)?;
    c.synchronize()?;
    a.synchronize()?;
    assert_eq!(
        fresh.to_vec()?,
        [9; 4],
        "the updated exec ran before the allocation's zeroing"
    );
    Ok(())
}

/// Whether `ptr` is page-locked memory the driver still knows (`cuMemHostGetFlags`): `false`
/// once it was freed.
fn is_pinned(gpu: &Gpu, ptr: *const u8) -> bool {
    use cudarc::driver::sys;
    let _ = gpu.device.memory_info(); // makes the device's context current on this thread
    let mut flags = 0u32;
    // SAFETY: a query about an address; `flags` is a valid out pointer.
    let r = unsafe { sys::cuMemHostGetFlags(&mut flags, ptr as *mut std::ffi::c_void) };
    r == sys::CUresult::CUDA_SUCCESS
}

/// A 256 MiB pinned buffer dropped inside a host callback is freed: both when its copy finished
/// long before (it was leaked: the drop's wait is refused there) and while one is pending (freed
/// only after that copy, which reads what the buffer held).
fn a_pinned_buffer_dropped_in_a_host_callback_is_freed(gpu: &Gpu) -> TestResult {
    const LEN: usize = 256 << 20;
    for pending in [false, true] {
        let s = gpu.device.create_stream()?;
        let mut host = gpu.device.alloc_pinned::<u8>(LEN)?;
        host.as_mut_slice()?.fill(3);
        let ptr = host.as_slice()?.as_ptr();
        assert!(is_pinned(gpu, ptr));
        let dev = gpu.device.alloc_zeroed::<u8>(LEN)?;
        if pending {
            // SAFETY: spin(ns) only reads the clock.
            unsafe { s.launch_unchecked(&gpu.f("spin"), one(), &args![300_000_000u64])? };
        }
        s.memcpy_htod_async(&dev, &host)?;
        if !pending {
            s.synchronize()?;
        }
        let held = std::sync::Arc::new(std::sync::Mutex::new(Some(host)));
        let (tx, rx) = std::sync::mpsc::channel();
        let graph = {
            let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
            let held = held.clone();
            b.add_host_callback(move || {
                drop(held.lock().ok().and_then(|mut h| h.take()));
                let _ = tx.send(());
            })?;
            b.end_building()?.instantiate()?
        };
        let other = gpu.device.create_stream()?;
        graph.launch(&other)?;
        other.synchronize()?;
        rx.recv_timeout(std::time::Duration::from_secs(10))?;
        if pending {
            // The copy behind the 300 ms spin still reads it.
            assert!(is_pinned(gpu, ptr), "freed while its copy was pending");
        }
        assert!(
            eventually(|| !is_pinned(gpu, ptr)),
            "the buffer dropped in a callback is freed (copy pending: {pending})"
        );
        s.synchronize()?;
        let back = dev.to_vec()?;
        assert!(
            back.iter().all(|&b| b == 3),
            "the copy read the buffer's bytes"
        );
    }
    Ok(())
}

/// `add_mem_free` of an allocation another definition made is the refusal
/// `Refusal::ForeignGraph`'s docs name (not a foreign node), and changes neither graph.
fn a_free_of_another_graphs_allocation_is_a_foreign_graph_refusal(gpu: &Gpu) -> TestResult {
    let a = GraphDefinition::new(&gpu.device)?;
    let b = GraphDefinition::new(&gpu.device)?;
    let (_node, alloc) = a.add_mem_alloc(&[], 4096)?;
    let e = b
        .add_mem_free(&[], alloc)
        .err()
        .ok_or("a foreign free was taken")?;
    assert_eq!(e.refusal(), Some(Refusal::ForeignGraph), "{e}");
    assert!(b.nodes()?.is_empty(), "the refused free added no node");
    Ok(())
}

/// The examples of `GraphBuffer::is_empty` and `Stream::free_async`, run: each does what its
/// comments say.
fn the_graph_memory_and_free_async_doc_examples_run(gpu: &Gpu) -> TestResult {
    // GraphBuffer::is_empty.
    let def = GraphDefinition::new(&gpu.device)?;
    let (_node, alloc) = def.add_mem_alloc(&[], 4096)?;
    let v = alloc.view::<f32>()?;
    assert!(!v.is_empty());
    assert!(v.slice(..0).is_err(), "an empty view cannot be made");
    // Stream::free_async.
    let (a, b) = (gpu.stream(), gpu.stream());
    let tmp = a.alloc_async::<u8>(4096)?;
    let def = GraphDefinition::new(&gpu.device)?;
    def.add_memset(&[], &tmp, 1u8)?;
    def.instantiate()?.launch(&b)?;
    drop(def);
    b.free_async(tmp)?;
    b.synchronize()?;
    a.synchronize()?;
    Ok(())
}

/// An exec whose allocation node has no free node, updated from another definition with its own
/// unfreed allocation: the driver took the update, after which the exec allocated the other
/// graph's address (its drop then freed its own, not that one: 32 MiB stayed allocated) and the
/// other graph's own exec failed to launch. Graph memory belongs to one graph and its exec, so
/// such updates are refused before the driver is asked, both ways; the exec's own graph is fine.
fn updates_between_graphs_with_memory_nodes_are_refused(gpu: &Gpu) -> TestResult {
    const BYTES: usize = 32 << 20;
    let with_alloc = || -> cuda_graph::Result<GraphDefinition> {
        let def = GraphDefinition::new(&gpu.device)?;
        // No free node: a launch leaves it allocated until the exec goes.
        def.add_mem_alloc(&[], BYTES)?;
        Ok(def)
    };
    let refused = |r: cuda_graph::Result<()>, what: &str| -> TestResult {
        match r {
            Err(cuda_graph::Error::Update {
                reason: cuda_graph::UpdateFailure::GraphMemory,
                ..
            }) => Ok(()),
            other => Err(format!("{what}: {other:?}").into()),
        }
    };
    let (a, b) = (with_alloc()?, with_alloc()?);
    let (exec_a, exec_b) = (a.instantiate()?, b.instantiate()?);
    let plain = GraphDefinition::new(&gpu.device)?;
    plain.add_empty(&[])?;
    let exec_plain = plain.instantiate()?;
    let s = gpu.stream();
    s.synchronize()?;
    let before = gpu.device.graph_memory_usage()?.used_current;
    refused(
        exec_a.update(&b),
        "an update from another graph's allocation",
    )?;
    refused(
        exec_plain.update(&a),
        "an update of an exec without memory nodes from one with",
    )?;
    refused(
        exec_a.update(&plain),
        "an update of an exec with memory nodes from another graph",
    )?;
    exec_a.update(&a)?;
    exec_a.launch(&s)?;
    s.synchronize()?;
    exec_b.launch(&s)?;
    s.synchronize()?;
    let during = gpu.device.graph_memory_usage()?.used_current;
    assert!(
        during >= before + 2 * BYTES as u64,
        "both execs hold their own allocation: {before} -> {during}"
    );
    drop((exec_a, exec_b));
    assert!(
        eventually(|| gpu
            .device
            .graph_memory_usage()
            .is_ok_and(|u| u.used_current <= before)),
        "the execs freed what their launches left allocated"
    );
    Ok(())
}

/// A `GraphSet` keyed by a value to add: each key captured once, the least recently used exec
/// evicted past the bound, a failed capture kept out; and an exec evicted (and the pool trimmed)
/// while its launch, which uses graph memory, still runs behind a spin: its result still lands.
fn graph_sets_capture_once_per_key_and_evict_safely(gpu: &Gpu) -> TestResult {
    use cuda_graph::GraphSet;
    let out = gpu.device.alloc_zeroed::<i32>(N as usize)?;
    let total = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    let mut set = GraphSet::new(InstantiateOptions::default()).with_max_entries(2)?;
    let capture = |v: i32| -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
        let b = s.create_graph_builder().begin_building(ThreadLocal)?;
        // SAFETY: affine(int* p, int m, int b) on total[0].
        unsafe {
            b.launch_unchecked(&gpu.f("affine"), one(), &args![&total, 1i32, v])?;
        }
        b.end_building()
    };
    for key in [1, 2, 1, 3, 1, 2] {
        set.get_or_capture(key, || capture(key))?.launch(&s)?;
    }
    s.synchronize()?;
    assert_eq!(total.to_vec()?, [10]);
    let st = set.stats();
    println!("    {st:?}");
    assert_eq!(
        (st.captures, st.hits, st.evictions, st.instantiations),
        (4, 2, 2, 4)
    );
    assert_eq!(set.len(), 2);
    assert!(set.contains(&1) && set.contains(&2) && !set.contains(&3));
    // A capture that fails keeps nothing, and the set goes on.
    let failed = set.get_or_capture(9, || -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
        Err(Error::invalid(Refusal::Size, "no such shape"))
    });
    assert!(failed.is_err() && !set.contains(&9) && set.len() == 2);
    // Eviction while the exec runs: a spin, then scratch graph memory filled and copied out.
    let mut scratch = GraphSet::new(InstantiateOptions::default()).with_max_entries(1)?;
    let slow = |v: i32| -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
        let b = s.create_graph_builder().begin_building(ThreadLocal)?;
        let mem = b.alloc_async(N as usize * 4)?;
        // SAFETY: spin(ns); fill(int*, int, int) and copy_i32(const int*, int*, int) over N
        // ints of `mem` (between its allocation and free) and `out`.
        unsafe {
            b.launch_unchecked(&gpu.f("spin"), one(), &args![200_000_000u64])?;
            b.launch_unchecked(&gpu.f("fill"), cfg(), &args![&mem, N, v])?;
            b.launch_unchecked(&gpu.f("copy_i32"), cfg(), &args![&mem, &out, N])?;
        }
        b.free_async(mem)?;
        b.end_building()
    };
    scratch.get_or_capture(5, || slow(5))?.launch(&s)?;
    // Another key evicts the running exec; the pool is trimmed meanwhile.
    scratch.get_or_capture(6, || slow(6))?;
    assert_eq!(scratch.stats().evictions, 1);
    gpu.device.trim_graph_memory()?;
    s.synchronize()?;
    assert_eq!(out.to_vec()?, vec![5; N as usize]);
    scratch.launch(&6, &s)?;
    s.synchronize()?;
    assert_eq!(out.to_vec()?, vec![6; N as usize]);
    Ok(())
}
