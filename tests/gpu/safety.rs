//! Attacks on the safe API: threads, `mem::forget`, re-entrancy, invalidated bodies, huge counts,
//! leaks. Each test names the hole it closes; each failed (crashed, hung or leaked) before.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_graph::prelude::*;

use cuda_graph::Refusal;
use cuda_graph::{DriverVersion, GraphDebugPrintOptions, MemAllocOptions, NodeType};

use crate::args;
use crate::support::{
    eventually, global_captures_beside_drops, one, stays, within, Gpu, Needs, TestResult,
};

crate::gpu_tests! {
    "safety";
    Needs::Gpu =>
        a_node_destroyed_inside_an_embedded_copy_releases_what_it_used,
        a_per_node_update_of_an_exec_releases_what_the_node_was_instantiated_with,
        a_whole_graph_update_releases_what_the_exec_was_instantiated_with,
        graphs_embedding_their_own_clones_are_released,
        a_device_graph_in_its_own_source_definition_is_released,
        an_outer_exec_dropped_while_it_runs_releases_the_inner_exec,
        an_upload_stream_that_captures_is_refused_before_instantiation,
        exec_updates_in_a_host_callback_are_refused,
        captures_left_open_at_process_exit,
        stream_work_racing_captures_on_the_same_stream,
        four_threads_record_into_one_capture,
        forks_record_from_their_own_threads;
    Needs::Conditional(DriverVersion::V12_3) =>
        invalidated_body_then_parent_ends_completes_and_drops,
        invalidated_body_dropped_without_ending;
    Needs::Gpu =>
        a_drop_on_the_release_thread_may_begin_a_capture,
        a_refused_per_node_update_drops_its_parameters_with_the_exec_unlocked,
        a_stream_launched_on_before_drops_its_owner_with_the_exec_unlocked,
        owners_dropped_in_a_host_callback_are_dropped_off_its_thread,
        a_stream_ordered_free_drops_a_borrowed_streams_owner_outside_its_destroy;
    Needs::Conditional(DriverVersion::V12_8) =>
        switch_with_a_huge_count_is_refused_at_once,
        switch_bodies_cost_no_stream_until_captured;
    Needs::Gpu =>
        buffer_dropped_inside_a_callback_is_freed,
        unfreed_graph_allocation_is_freed_with_its_exec,
        frees_during_relaxed_and_thread_local_captures_keep_them_valid,
        drops_on_another_thread_never_invalidate_a_global_capture,
        exec_drops_on_another_thread_never_invalidate_a_global_capture;
    Needs::Conditional(DriverVersion::V12_3) => conditional_exec_drops_beside_global_captures;
    Needs::Gpu =>
        a_relaxed_builder_dropped_in_a_host_callback_ends_its_capture,
        a_callback_waiting_on_an_event_another_thread_records_is_refused_not_deadlocked,
        a_builders_launch_inside_a_host_callback_is_an_error,
        crate_calls_inside_a_host_callback_are_errors,
        a_graph_dropped_while_its_stream_captures_waits_for_its_launch_beside_a_capture_loop,
        one_graph_launched_from_four_threads,
        launching_a_graph_into_a_capture_is_refused,
        update_sources_are_released_once_their_launches_end,
        replaced_operands_outlive_every_earlier_launch_on_every_stream,
        everything_dropped_while_an_outer_launch_runs_releases_the_inner_exec,
        definitions_dropped_after_an_update_release_their_operands,
        a_host_node_destroyed_in_a_builders_embedded_copy_releases_its_closure,
        launches_on_two_streams_run_in_order_and_wait_for_the_one_before,
        updates_set_the_parameters_of_disabled_nodes_too,
        a_memset_node_is_never_toggled;
    Needs::Conditional(DriverVersion::V12_3) =>
        conditional_execs_dropped_right_after_their_launch,
        conditional_execs_updated_while_their_launches_run;
    // Last: these leak captures on purpose (CUDA then refuses context-wide synchronisation
    // until they end), and end them with raw driver calls when done.
    Needs::Conditional(DriverVersion::V12_3) => forgotten_body_blocks_complete_and_node_destruction;
    Needs::Gpu =>
        forgotten_fork_fails_the_end_cleanly,
        forgotten_relaxed_or_thread_local_capture_does_not_pin_releases;
}

/// Ends a capture that a test leaked on purpose (its builder was `mem::forget`-ten), with a raw
/// driver call, so later tests run in a clean process.
fn end_leaked(s: &Stream) {
    let mut g = std::ptr::null_mut();
    // SAFETY: the stream is live; the graph returned (the crate's own, captured into) is left
    // alone.
    let _ = unsafe { cudarc::driver::sys::cuStreamEndCapture(s.as_raw(), &mut g) };
}

/// Device memory in use, in bytes.
fn used(gpu: &Gpu) -> usize {
    gpu.device
        .memory_info()
        .map(|(free, total)| total - free)
        .unwrap_or(0)
}

/// Whether device memory in use comes back to within 16 MiB of `baseline` (bounded wait).
fn back_to(gpu: &Gpu, baseline: usize) -> bool {
    eventually(|| used(gpu) <= baseline + (16 << 20))
}

const BIG: usize = 64 << 20; // 64 Mi ints = 256 MiB

/// Launches `graph` on `stream` and waits for it on a thread, failing if that does not finish
/// within 20 s (a callback in the graph that hangs becomes a failure).
fn launch_within(
    what: &str,
    graph: Graph,
    stream: Stream,
) -> Result<(), Box<dyn std::error::Error>> {
    within(20, what, move || {
        graph.launch(&stream).map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())
    })
}

fn complete(b: GraphBuilder<Primary, Ended>) -> cuda_graph::Result<Graph> {
    b.instantiate()
}

/// After a test broke a capture on `stream`: the stream captures again, and the graph it
/// captures (one `add_one` on `buf`, still zero) runs.
fn captures_again(stream: &Stream, add_one: &Function, buf: &DeviceBuffer<i32>) -> TestResult {
    let again = stream.create_graph_builder().begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { again.launch_unchecked(add_one, one(), &args![buf])? };
    let g = complete(again.end_building()?)?;
    g.launch(stream)?;
    stream.synchronize()?;
    assert_eq!(buf.to_vec()?, [1]);
    Ok(())
}

/// Item 4: one thread issues work on a stream and drops its buffer while another begins and
/// ends captures on the same stream. Work that lands in a capture keeps its buffer alive.
fn stream_work_racing_captures_on_the_same_stream(gpu: &Gpu) -> TestResult {
    let stream = gpu.stream();
    let device = gpu.device.clone();
    let add_one = gpu.f("add_one");
    let counter = device.alloc_zeroed::<i32>(1)?;
    // Launched on the stream by the worker: each launch runs once, on the stream or, when it
    // fell into one of the captures, in that capture's graph (each launched once, on the same
    // stream, so that no two increments run at once).
    let launched = device.alloc_zeroed::<i32>(1)?;
    std::thread::scope(|scope| -> TestResult {
        let s = stream.clone();
        let (add, launched) = (add_one.clone(), &launched);
        let worker = scope.spawn(move || -> cuda_graph::Result<()> {
            for i in 0..2000u32 {
                let buf = device.alloc_zeroed::<u8>(4096)?;
                s.memset_d8(&buf, (i % 255) as u8)?;
                drop(buf);
                // SAFETY: add_one(int*) writes p[0]; the buffer holds one int.
                unsafe { s.launch_unchecked(&add, one(), &KernelArgs::new().arg(launched))? };
            }
            Ok(())
        });
        for _ in 0..300 {
            let b = stream.create_graph_builder().begin_building(Relaxed)?;
            // SAFETY: add_one(int*).
            unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
            let g = complete(b.end_building()?)?;
            g.launch(&stream)?;
            stream.synchronize()?;
        }
        worker
            .join()
            .map_err(|_| "worker panicked")?
            .map_err(|e| e.to_string())?;
        Ok(())
    })?;
    stream.synchronize()?;
    assert_eq!(counter.to_vec()?, [300]);
    assert_eq!(launched.to_vec()?, [2000]);
    Ok(())
}

/// Item 5: a shared `&GraphBuilder` records from four threads at once, while a fifth records on
/// its stream directly.
fn four_threads_record_into_one_capture(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let counter = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    // A fifth thread records on the builder's stream itself (not through the builder), so work
    // that takes the stream's capture slot races work recorded through the builder.
    let stream = b.stream().clone();
    std::thread::scope(|scope| {
        let mut handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| -> cuda_graph::Result<()> {
                    for _ in 0..200 {
                        let own = gpu.device.alloc_zeroed::<i32>(1)?;
                        // SAFETY: add_one(int*).
                        unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
                        unsafe { b.launch_unchecked(&add_one, one(), &args![&own])? };
                        b.memset_d32(&own, 0)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.push(scope.spawn(|| -> cuda_graph::Result<()> {
            for _ in 0..200 {
                let own = gpu.device.alloc_zeroed::<i32>(1)?;
                // SAFETY: add_one(int*).
                unsafe { stream.launch_unchecked(&add_one, one(), &args![&counter])? };
                unsafe { stream.launch_unchecked(&add_one, one(), &args![&own])? };
            }
            Ok(())
        }));
        for h in handles {
            h.join().expect("no panic")?;
        }
        Ok::<_, Error>(())
    })?;
    drop(stream);
    let g = complete(b.end_building()?)?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(counter.to_vec()?, [1000]);
    Ok(())
}

/// Item 5: forks of one capture (`Capturing<Relaxed>` forks are `Send`) record from threads of
/// their own while the parent records too.
fn forks_record_from_their_own_threads(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let bufs: Vec<_> = (0..4)
        .map(|_| gpu.device.alloc_zeroed::<i32>(1))
        .collect::<cuda_graph::Result<_>>()?;
    let parent_buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    let forks = b.split::<4>()?;
    let forks = std::thread::scope(|scope| {
        let handles: Vec<_> = forks
            .into_iter()
            .zip(&bufs)
            .map(|(fork, buf)| {
                let add_one = add_one.clone();
                scope.spawn(move || -> cuda_graph::Result<_> {
                    for _ in 0..100 {
                        // SAFETY: add_one(int*).
                        unsafe { fork.launch_unchecked(&add_one, one(), &args![buf])? };
                    }
                    Ok(fork)
                })
            })
            .collect();
        for _ in 0..100 {
            // SAFETY: add_one(int*).
            unsafe { b.launch_unchecked(&add_one, one(), &args![&parent_buf])? };
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect::<cuda_graph::Result<Vec<_>>>()
    })?;
    b.join(forks)?;
    let g = complete(b.end_building()?)?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    for buf in &bufs {
        assert_eq!(buf.to_vec()?, [100]);
    }
    assert_eq!(parent_buf.to_vec()?, [100]);
    Ok(())
}

/// Item 6: a body whose capture is invalidated (a synchronize on its stream). The driver
/// destroys the body graph that the parent's node owns; instantiating the parent, or destroying
/// it, then crashed inside the driver. Now the parent ends, `complete` is an error naming the
/// cause, and dropping everything is safe. The stream is usable afterwards.
fn invalidated_body_then_parent_ends_completes_and_drops(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let stream = gpu.stream();
    let p = stream.create_graph_builder().begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { p.launch_unchecked(&add_one, one(), &args![&buf])? };
    let h = p.create_conditional_handle(Some(1))?;
    let body = p.add_if(&h)?.begin_building(Relaxed)?;
    // SAFETY: add_one(int*).
    unsafe { body.launch_unchecked(&add_one, one(), &args![&buf])? };
    assert!(body.stream().synchronize().is_err());
    match body.end_building() {
        Err(Error::CaptureInvalidated(_)) => {}
        other => return Err(format!("body end: {other:?}").into()),
    }
    // SAFETY: add_one(int*).
    unsafe { p.launch_unchecked(&add_one, one(), &args![&buf])? };
    let ended = p.end_building()?;
    match ended.instantiate() {
        Err(e) if e.refusal() == Some(Refusal::Broken) => {}
        other => return Err(format!("complete: {other:?}").into()),
    }
    // The driver freed the body the conditional node names: printing would walk into it.
    let dot = std::env::temp_dir().join(format!("cuda-graph-broken-{}.dot", std::process::id()));
    match ended.debug_dot_print(&dot, &GraphDebugPrintOptions::all()) {
        Err(e) if e.refusal() == Some(Refusal::Broken) => {}
        other => return Err(format!("dot print: {other:?}").into()),
    }
    let def = ended.graph_definition()?;
    assert!(def.nodes().is_err(), "the broken graph is refused");
    let child_parent = gpu.device.create_graph_builder()?.begin_building(Global)?;
    assert!(
        child_parent.add_child_graph(&ended).is_err(),
        "embedding it is refused"
    );
    drop(child_parent);
    drop(def);
    drop(ended);
    // The stream captures again.
    captures_again(&stream, &add_one, &buf)
}

/// Item 6, other order: the invalidated body is dropped (not ended) and the parent is dropped
/// mid-capture.
fn invalidated_body_dropped_without_ending(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    for parent_ends in [false, true] {
        let p = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
        let h = p.create_conditional_handle(Some(1))?;
        let body = p.add_if(&h)?.begin_building(Relaxed)?;
        // SAFETY: add_one(int*).
        unsafe { body.launch_unchecked(&add_one, one(), &args![&buf])? };
        let _ = body.stream().synchronize();
        drop(body);
        if parent_ends {
            let ended = p.end_building()?;
            assert!(ended.instantiate().is_err());
        } else {
            drop(p);
        }
    }
    Ok(())
}

struct CapturesOnDrop {
    stream: Stream,
    k: Function,
    buf: Arc<DeviceBuffer<i32>>,
    done: mpsc::Sender<cuda_graph::Result<()>>,
}

impl Drop for CapturesOnDrop {
    fn drop(&mut self) {
        let r = (|| {
            let b = self.stream.create_graph_builder().begin_building(Global)?;
            // SAFETY: add_one(int*).
            unsafe { b.launch_unchecked(&self.k, one(), &args![&*self.buf])? };
            let g = b.end_building()?.instantiate()?;
            g.launch(&self.stream)?;
            self.stream.synchronize()
        })();
        let _ = self.done.send(r);
    }
}

/// Item 8: a value a graph released (a callback closure it held) whose `Drop` begins, ends and
/// launches a capture. It deadlocked the release thread and every later `begin_building`. Both
/// places a release runs are tried: the release thread (the graph is dropped while its launch
/// still runs) and the dropping thread (dropped after a synchronize).
fn a_drop_on_the_release_thread_may_begin_a_capture(gpu: &Gpu) -> TestResult {
    for still_running in [true, false] {
        let (tx, rx) = mpsc::channel();
        let buf = Arc::new(gpu.device.alloc_zeroed::<i32>(1)?);
        let on_drop = CapturesOnDrop {
            stream: gpu.stream(),
            k: gpu.f("add_one"),
            buf: buf.clone(),
            done: tx,
        };
        {
            let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
            if still_running {
                // SAFETY: spin(unsigned long long ns).
                unsafe { b.launch_unchecked(&gpu.f("spin"), one(), &args![200_000_000u64])? };
            }
            b.add_host_callback(move || {
                let _ = &on_drop;
            })?;
            let g = complete(b.end_building()?)?;
            let s = gpu.stream();
            g.launch(&s)?;
            if !still_running {
                s.synchronize()?;
            }
        }
        // The closure (and the value) is dropped where the release runs, which captures.
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(r) => r?,
            Err(_) => {
                return Err(format!(
                    "a release that captures in a Drop hung (graph dropped while running: {still_running})"
                )
                .into())
            }
        }
        assert_eq!(buf.to_vec()?, [1]);
        // And a capture on this thread still begins.
        let device = gpu.device.clone();
        within(20, "begin_building after a release captured", move || {
            let b = device
                .create_graph_builder()
                .and_then(|b| b.begin_building(Global))
                .map_err(|e| e.to_string())?;
            b.end_building().map(|_| ()).map_err(|e| e.to_string())
        })?;
    }
    Ok(())
}

/// A value held by the closure of a host callback's parameters, whose `Drop` asks `graph` about
/// one of its nodes (the exec's lock) and reports the answer.
struct AsksOnDrop {
    graph: Arc<Graph>,
    node: KernelNode,
    done: mpsc::Sender<cuda_graph::Result<bool>>,
}

impl Drop for AsksOnDrop {
    fn drop(&mut self) {
        let _ = self.done.send(self.graph.is_enabled(&self.node));
    }
}

/// A per-node update the exec refuses (a node of another graph) drops the parameters it was
/// given. It dropped them with the exec's lock held: a closure's value whose `Drop` calls back
/// into the same exec hung (or, in a debug build, panicked on the lock order).
fn a_refused_per_node_update_drops_its_parameters_with_the_exec_unlocked(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    let kernel = unsafe { def.add_kernel_unchecked(&[], &gpu.f("add_one"), one(), &args![&buf])? };
    def.add_host_callback(&[&kernel], || {})?;
    let graph = Arc::new(def.instantiate()?);
    let other = GraphDefinition::new(&gpu.device)?;
    let (foreign, _) = other.add_host_callback(&[], || {})?;
    let (tx, rx) = mpsc::channel();
    let asks = AsksOnDrop {
        graph: graph.clone(),
        node: kernel,
        done: tx,
    };
    let (params, _observer) = NodeParams::host_callback(move || {
        let _ = &asks;
    });
    let refusal = within(
        20,
        "a refused set_params whose parameters call back into the exec",
        move || {
            Ok(graph
                .set_params(&foreign, params)
                .err()
                .map(|e| e.to_string()))
        },
    )?;
    assert_eq!(refusal, Some(Error::ForeignNode.to_string()));
    assert!(
        rx.recv_timeout(Duration::from_secs(5))??,
        "the Drop found the kernel node enabled"
    );
    Ok(())
}

/// The owner of a stream made with `Stream::from_raw` whose `Drop` launches `graph` and reports
/// the result.
struct LaunchesOnDrop {
    graph: Arc<Graph>,
    stream: Stream,
    done: mpsc::Sender<cuda_graph::Result<()>>,
}

impl Drop for LaunchesOnDrop {
    fn drop(&mut self) {
        let r = self.graph.launch(&self.stream);
        let _ = self.done.send(r);
    }
}

/// An exec keeps the stream it was last launched on; a launch on another stream drops it. Where
/// that was the last handle of a stream made from the caller's (`Stream::from_raw`), its owner's
/// `Drop` ran under the exec's lock: one that launched the same exec hung.
fn a_stream_launched_on_before_drops_its_owner_with_the_exec_unlocked(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    unsafe { def.add_kernel_unchecked(&[], &gpu.f("add_one"), one(), &args![&buf])? };
    let graph = Arc::new(def.instantiate()?);
    let inner = gpu.stream();
    let (tx, rx) = mpsc::channel();
    let owner = LaunchesOnDrop {
        graph: graph.clone(),
        stream: inner.clone(),
        done: tx,
    };
    // SAFETY: `inner` is a stream of the device's primary context, kept alive by the owner's
    // clone below for as long as the borrowed stream lives.
    let borrowed = unsafe { Stream::from_raw(&gpu.device, inner.as_raw(), (owner, inner.clone())) };
    graph.launch(&borrowed)?;
    borrowed.synchronize()?;
    drop(borrowed);
    let other = gpu.stream();
    let on_other = other.clone();
    let g = graph.clone();
    within(
        20,
        "a launch that drops a borrowed stream whose owner launches the exec",
        move || g.launch(&on_other).map_err(|e| e.to_string()),
    )?;
    rx.recv_timeout(Duration::from_secs(5))??;
    other.synchronize()?;
    inner.synchronize()?;
    // Launched on the borrowed stream, on the other, and by the owner's drop.
    assert_eq!(buf.to_vec()?, [3]);
    Ok(())
}

/// Reports the thread it is dropped on.
struct ThreadOnDrop(mpsc::Sender<std::thread::ThreadId>);

impl Drop for ThreadOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(std::thread::current().id());
    }
}

/// A buffer, a stream and a kernel made from the caller's (`from_raw`, `from_cudarc`), dropped
/// inside a host callback: an owner's drop may call the driver (a cudarc slice frees its memory,
/// a cudarc module unloads), which a host callback must not. The owners were dropped on the
/// callback's thread; they go to the release thread.
fn owners_dropped_in_a_host_callback_are_dropped_off_its_thread(gpu: &Gpu) -> TestResult {
    let mem = gpu.device.alloc_zeroed::<i32>(1)?;
    let keep = gpu.stream();
    let (owner_tx, owner_rx) = mpsc::channel();
    // SAFETY: `mem` is an allocation of the device's primary context that outlives the buffer
    // (the test holds it until the end).
    let buffer = unsafe {
        DeviceBuffer::<i32>::from_raw(
            &gpu.device,
            mem.device_ptr(),
            1,
            ThreadOnDrop(owner_tx.clone()),
        )?
    };
    // SAFETY: `keep` is a stream of the device's primary context, held by the owner.
    let stream = unsafe {
        Stream::from_raw(
            &gpu.device,
            keep.as_raw(),
            (ThreadOnDrop(owner_tx.clone()), keep.clone()),
        )
    };
    let loaded = gpu.f("add_one");
    // SAFETY: `loaded` is a kernel of a module loaded in the device's primary context, kept
    // loaded by the owner.
    let kernel = unsafe {
        Function::from_raw(
            &gpu.device,
            loaded.as_raw(),
            "add_one",
            (ThreadOnDrop(owner_tx), loaded.clone()),
        )
    };
    let (cb_tx, cb_rx) = mpsc::channel();
    let mut held = Some((buffer, stream, kernel));
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    b.add_host_callback(move || {
        let _ = cb_tx.send(std::thread::current().id());
        drop(held.take());
    })?;
    let g = b.end_building()?.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    let callback = cb_rx.recv_timeout(Duration::from_secs(5))?;
    for what in ["an owner", "another owner", "the third owner"] {
        let dropped_on = owner_rx.recv_timeout(Duration::from_secs(10))?;
        assert_ne!(
            dropped_on, callback,
            "{what} was dropped on the host callback's thread"
        );
    }
    drop(mem);
    Ok(())
}

/// The owner of a stream made with `Stream::from_raw` whose `Drop` begins and ends a `Global`
/// capture and reports the result.
struct CapturesGlobalOnDrop {
    device: Device,
    done: mpsc::Sender<cuda_graph::Result<()>>,
}

impl Drop for CapturesGlobalOnDrop {
    fn drop(&mut self) {
        let r = self
            .device
            .create_graph_builder()
            .and_then(|b| b.begin_building(Global))
            .and_then(|b| b.end_building())
            .map(|_| ());
        let _ = self.done.send(r);
    }
}

/// A stream-ordered buffer that outlives every `Stream` of its stream drops the stream's last
/// handle when it is freed. Where that stream was made from the caller's, its owner's `Drop` ran
/// inside the free's destroy job (under the destroy order lock and the capture gate's read
/// side): one that began a `Global` capture hung.
fn a_stream_ordered_free_drops_a_borrowed_streams_owner_outside_its_destroy(
    gpu: &Gpu,
) -> TestResult {
    let inner = gpu.stream();
    let (tx, rx) = mpsc::channel();
    let owner = CapturesGlobalOnDrop {
        device: gpu.device.clone(),
        done: tx,
    };
    // SAFETY: `inner` is a stream of the device's primary context, kept alive by the owner's
    // clone for as long as the borrowed stream lives.
    let borrowed = unsafe { Stream::from_raw(&gpu.device, inner.as_raw(), (owner, inner.clone())) };
    let buf = borrowed.alloc_async::<i32>(16)?;
    borrowed.synchronize()?;
    drop(borrowed);
    within(
        20,
        "a stream-ordered free that drops a borrowed stream's owner",
        move || {
            drop(buf);
            Ok(())
        },
    )?;
    rx.recv_timeout(Duration::from_secs(20))??;
    Ok(())
}

/// Item 9: `switch(&h, 1 << 20)` never returned (a stream per body). Counts past the crate's
/// limit are refused before any driver work.
fn switch_with_a_huge_count_is_refused_at_once(gpu: &Gpu) -> TestResult {
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(0))?;
    let t = Instant::now();
    for n in [1 << 20, u32::MAX, cuda_graph::MAX_SWITCH_BODIES + 1] {
        match p.add_switch(&h, n) {
            Err(e) if e.refusal() == Some(Refusal::Size) => {}
            other => return Err(format!("switch({n}): {:?}", other.map(|v| v.len())).into()),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let def = GraphDefinition::new(&gpu.device)?;
    let dh = def.create_conditional_handle(Some(0))?;
    assert!(def.add_switch(&[], &dh, 1 << 20).is_err());
    // The handle must be used for the graph to instantiate.
    let bodies = p.add_switch(&h, 2)?;
    drop(bodies);
    drop(complete(p.end_building()?)?);
    Ok(())
}

/// Item 9: bodies get their stream when their capture begins: 4096 bodies are quick to make,
/// and one of them captures and runs.
fn switch_bodies_cost_no_stream_until_captured(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let set = gpu.f("set_condition");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(0))?;
    // SAFETY: set_condition(handle, unsigned).
    unsafe { p.launch_unchecked(&set, one(), &args![h, 4095u32])? };
    let t = Instant::now();
    let mut bodies = p.add_switch(&h, 4096)?;
    let made = t.elapsed();
    let last = bodies.pop().ok_or("no bodies")?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { last.launch_unchecked(&add_one, one(), &args![&buf])? };
    last.end_building()?;
    drop(bodies);
    let g = complete(p.end_building()?)?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1]);
    println!("    4096 switch bodies made in {made:?}");
    assert!(made < Duration::from_secs(5), "{made:?}");
    Ok(())
}

/// Item 10: a buffer that a callback's closure owns and drops while it runs (on the driver's
/// thread, where `cuMemFree` is refused) was never freed.
fn buffer_dropped_inside_a_callback_is_freed(gpu: &Gpu) -> TestResult {
    let baseline = used(gpu);
    let owned = gpu.device.alloc_zeroed::<i32>(BIG)?;
    let watch = owned.release_observer();
    let mut slot = Some(owned);
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let cb = b.add_host_callback(move || drop(slot.take()))?;
    let g = complete(b.end_building()?)?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert!(eventually(|| cb.calls() == Some(1)));
    assert!(eventually(|| watch.is_released()));
    assert!(
        back_to(gpu, baseline),
        "the 256 MiB dropped in the callback are freed (later, off the driver's thread): {} MiB over",
        (used(gpu).saturating_sub(baseline)) >> 20
    );
    Ok(())
}

/// Item 11: a graph allocation with no free node stayed allocated after its exec and definition
/// were gone (256 MiB each time). The exec now frees it after its last launch, with and without
/// `auto_free_on_launch`.
fn unfreed_graph_allocation_is_freed_with_its_exec(gpu: &Gpu) -> TestResult {
    let fill = gpu.f("fill");
    let before = gpu.device.graph_memory_in_use()?;
    for auto_free in [false, true] {
        let def = GraphDefinition::new(&gpu.device)?;
        let n = 64 << 20; // 64 Mi ints = 256 MiB
        let (alloc, scratch) = def.add_mem_alloc(&[], n * 4)?;
        // SAFETY: fill(int*, int n, int v); scratch holds n ints while the graph runs.
        unsafe {
            def.add_kernel_unchecked(
                &[&alloc],
                &fill,
                LaunchConfig::for_num_elems(n as u32),
                &args![&scratch, n as i32, 7i32],
            )?
        };
        let _no_free_node = scratch;
        let options = InstantiateOptions::new().auto_free_on_launch(auto_free);
        let g = def.instantiate_with(&options)?;
        let s = gpu.stream();
        g.launch(&s)?;
        if auto_free {
            g.launch(&s)?;
            g.launch(&s)?;
        }
        s.synchronize()?;
        let during = gpu.device.graph_memory_in_use()?;
        let ours = (n as u64) * 4;
        assert!(during >= ours, "{during} in use after the launch");
        drop(g);
        drop(def);
        assert!(
            eventually(|| gpu.device.graph_memory_in_use().ok() <= Some(during - ours)),
            "graph memory down from {during} by {ours} (auto_free_on_launch: {auto_free}; before: {before}), now {:?}",
            gpu.device.graph_memory_in_use()
        );
    }
    Ok(())
}

/// Item 12: a body builder leaked mid-capture (`mem::forget`) let the parent complete a graph
/// still being captured into, and `destroy_node` free the body under the live capture.
fn forgotten_body_blocks_complete_and_node_destruction(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    let h = p.create_conditional_handle(Some(1))?;
    let body = p.add_if(&h)?.begin_building(Relaxed)?;
    // SAFETY: add_one(int*).
    unsafe { body.launch_unchecked(&add_one, one(), &args![&buf])? };
    let body_stream = body.stream().clone();
    std::mem::forget(body);
    let ended = p.end_building()?;
    match ended.instantiate() {
        Err(e) if e.refusal() == Some(Refusal::Capture) => {}
        other => return Err(format!("complete: {other:?}").into()),
    }
    let def = ended.graph_definition()?;
    let cond = def
        .nodes()?
        .into_iter()
        .find(|n| def.node_type(n).ok() == Some(NodeType::Conditional))
        .ok_or("no conditional node")?;
    assert!(def.destroy_node(cond).is_err(), "the body still captures");
    assert!(def.try_clone().is_err());
    let host = GraphDefinition::new(&gpu.device)?;
    match host.add_child_graph(&[], &ended) {
        Err(e) if e.refusal() == Some(Refusal::Capture) => {}
        other => return Err(format!("embedding: {other:?}").into()),
    }
    let other = complete({
        let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
        // SAFETY: add_one(int*).
        unsafe { b.launch_unchecked(&add_one, one(), &args![&buf])? };
        b.end_building()?
    })?;
    assert!(other.update(&ended).is_err());
    end_leaked(&body_stream);
    Ok(())
}

/// Item 12: a fork leaked mid-capture: the parent's end fails (unjoined) and everything after is
/// usable.
fn forgotten_fork_fails_the_end_cleanly(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let stream = gpu.stream();
    let p = stream.create_graph_builder().begin_building(Relaxed)?;
    let [a, b] = p.split::<2>()?;
    // SAFETY: add_one(int*).
    unsafe { a.launch_unchecked(&add_one, one(), &args![&buf])? };
    std::mem::forget(a);
    p.join([b])?;
    assert!(p.end_building().is_err(), "an unjoined fork fails the end");
    captures_again(&stream, &add_one, &buf)
}

/// Item 13: a leaked capturing builder pinned a process-wide counter, so every later destroy was
/// deferred forever. Relaxed captures forbid no frees; a leaked thread-local capture defers only
/// its own thread's frees, which the release thread then makes.
fn forgotten_relaxed_or_thread_local_capture_does_not_pin_releases(gpu: &Gpu) -> TestResult {
    let stream = gpu.stream();
    let b = stream.create_graph_builder().begin_building(Relaxed)?;
    std::mem::forget(b);
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = buf.release_observer();
    drop(buf);
    assert!(
        watch.is_released(),
        "freed at once beside a leaked Relaxed capture"
    );
    end_leaked(&stream);

    // A thread leaks a ThreadLocal capture and stays alive; this thread frees at once.
    let (to_main, from_thread) = mpsc::channel();
    let (to_thread, from_main) = mpsc::channel::<()>();
    let device = gpu.device.clone();
    let t = std::thread::spawn(move || {
        let s = device.create_stream().expect("stream");
        let b = s
            .create_graph_builder()
            .begin_building(ThreadLocal)
            .expect("begin");
        std::mem::forget(b);
        // Its own drops are deferred (freeing here would invalidate its capture).
        let own = device.alloc_zeroed::<i32>(1);
        let _ = to_main.send(own.is_err());
        let _ = from_main.recv_timeout(Duration::from_secs(20));
        end_leaked(&s);
    });
    let alloc_refused = from_thread
        .recv_timeout(Duration::from_secs(20))
        .map_err(|_| "thread-local leak: no answer")?;
    assert!(
        alloc_refused,
        "CUDA refuses allocation on the capturing thread"
    );
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = buf.release_observer();
    drop(buf);
    assert!(watch.is_released(), "other threads free at once");
    let _ = to_thread.send(());
    t.join().map_err(|_| "thread panicked")?;
    Ok(())
}

/// Item 13: frees made during Relaxed captures (any thread) and ThreadLocal captures (other
/// threads) happen at once and leave the capture valid; on the capturing thread of a
/// ThreadLocal capture they are deferred, and the capture stays valid.
fn frees_during_relaxed_and_thread_local_captures_keep_them_valid(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let counter = gpu.device.alloc_zeroed::<i32>(1)?;
    for thread_local in [false, true] {
        let baseline = used(gpu);
        let spare = gpu.device.alloc_zeroed::<i32>(BIG)?;
        let other = gpu.device.alloc_zeroed::<i32>(BIG)?;
        let s = gpu.stream();
        let g = if thread_local {
            let b = s.create_graph_builder().begin_building(ThreadLocal)?;
            // SAFETY: add_one(int*).
            unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
            drop(spare); // this thread: deferred until the capture ends
            std::thread::spawn(move || drop(other)).join().ok();
            assert!(
                eventually(|| used(gpu) <= baseline + BIG * 4 + (16 << 20)),
                "another thread frees during a ThreadLocal capture"
            );
            unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
            complete(b.end_building()?)?
        } else {
            let b = s.create_graph_builder().begin_building(Relaxed)?;
            // SAFETY: add_one(int*).
            unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
            drop(spare);
            std::thread::spawn(move || drop(other)).join().ok();
            assert!(
                back_to(gpu, baseline),
                "both freed during a Relaxed capture"
            );
            unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
            complete(b.end_building()?)?
        };
        g.launch(&s)?;
        s.synchronize()?;
        drop(g);
        assert!(back_to(gpu, baseline), "all freed after the capture");
    }
    assert_eq!(counter.to_vec()?, [4]);
    Ok(())
}

/// Item 14: buffers dropped on another thread while this one runs Global captures: a free that
/// fell between the check "no Global capture" and the free invalidated the capture.
fn drops_on_another_thread_never_invalidate_a_global_capture(gpu: &Gpu) -> TestResult {
    let bufs: Vec<_> = (0..3000)
        .map(|_| gpu.device.alloc_zeroed::<u8>(512))
        .collect::<cuda_graph::Result<_>>()?;
    let watches: Vec<_> = bufs.iter().map(|b| b.release_observer()).collect();
    let cycles = global_captures_beside_drops(gpu, bufs)?;
    assert!(eventually(|| watches.iter().all(|w| w.is_released())));
    println!("    {cycles} Global captures beside 3000 drops on another thread");
    Ok(())
}

/// Item 14, for execs: graphs launched and synchronized, then dropped on another thread while
/// this one runs Global captures. A drop asks the driver whether the launch's stream is idle
/// (`cuStreamQuery`) and destroys the exec at once if so — a query and destroys that must wait
/// while a Global capture records, or the capture is invalidated.
fn exec_drops_on_another_thread_never_invalidate_a_global_capture(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let other = gpu.stream();
    let mut graphs = Vec::new();
    let mut watches = Vec::new();
    for _ in 0..300 {
        let buf = gpu.device.alloc_zeroed::<i32>(1)?;
        watches.push(buf.release_observer());
        let def = GraphDefinition::new(&gpu.device)?;
        // SAFETY: add_one(int*).
        unsafe { def.add_kernel_unchecked(&[], &add_one, one(), &args![&buf])? };
        let g = def.instantiate()?;
        g.launch(&other)?;
        graphs.push(g);
    }
    other.synchronize()?;
    let cycles = global_captures_beside_drops(gpu, graphs)?;
    assert!(eventually(|| watches.iter().all(|w| w.is_released())));
    println!("    {cycles} Global captures beside 300 exec drops on another thread");
    Ok(())
}

/// Execs with a conditional node, dropped on one thread (after their launch ended, or never
/// launched) while another runs Global captures: an exec's destroy deferred by a capture and its
/// source graph's destroy made at once when the capture ended ran on two threads at the same
/// time, which driver 13.0 crashed on for conditional execs. Destroys now run one at a time, in
/// the order asked.
fn conditional_exec_drops_beside_global_captures(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let counter = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    let mut graphs = Vec::new();
    for i in 0..300 {
        let def = GraphDefinition::new(&gpu.device)?;
        let h = def.create_conditional_handle(Some(1))?;
        let (_node, body) = def.add_if(&[], &h)?;
        // SAFETY: add_one(int*).
        unsafe { body.add_kernel_unchecked(&[], &add_one, one(), &args![&counter])? };
        let g = def.instantiate()?;
        if i % 2 == 0 {
            g.launch(&s)?;
        }
        graphs.push(g);
    }
    s.synchronize()?;
    assert_eq!(counter.to_vec()?, [150]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let capturer = {
        let (device, add_one, stop) = (gpu.device.clone(), add_one.clone(), stop.clone());
        std::thread::spawn(move || -> Result<i32, String> {
            let run = || -> cuda_graph::Result<i32> {
                let s = device.create_stream()?;
                let counter = device.alloc_zeroed::<i32>(1)?;
                let mut cycles = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || cycles < 20 {
                    let b = s.create_graph_builder().begin_building(Global)?;
                    // SAFETY: add_one(int*).
                    unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
                    b.end_building()?.instantiate()?.launch(&s)?;
                    cycles += 1;
                }
                s.synchronize()?;
                let n = counter.to_vec()?[0];
                Ok(if n == cycles { cycles } else { -n })
            };
            match run() {
                Ok(c) if c >= 0 => Ok(c),
                Ok(n) => Err(format!("the captures ran {} times", -n)),
                Err(e) => Err(e.to_string()),
            }
        })
    };
    for g in graphs {
        drop(g);
        std::thread::yield_now();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cycles = capturer.join().map_err(|_| "capturer panicked")??;
    println!("    300 conditional execs dropped beside {cycles} Global captures");
    Ok(())
}

/// Inside a host callback (a driver thread) CUDA calls are refused or deadlock — a synchronize
/// of the callback's own stream waits for the callback. Every operation of the crate there is
/// an error instead, and a `Graph` dropped there (the callback takes it out of shared state) is
/// released off that thread, once its launch has run, without touching the stream's lock.
fn crate_calls_inside_a_host_callback_are_errors(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = buf.release_observer();
    let inner = {
        let def = GraphDefinition::new(&gpu.device)?;
        // SAFETY: add_one(int*).
        unsafe { def.add_kernel_unchecked(&[], &gpu.f("add_one"), one(), &args![&buf])? };
        def.instantiate()?
    };
    drop(buf);
    let s = gpu.stream();
    inner.launch(&s)?;
    let holder = Arc::new(std::sync::Mutex::new(Some(inner)));
    // A device of its own (its own retain of the context, its own setup stream), whose last
    // handle the callback drops: destroyed on the release thread, not on the driver's.
    let spare = Device::new(gpu.device.ordinal())?;
    drop(spare.alloc_zeroed::<u8>(1)?);
    let spare = Arc::new(std::sync::Mutex::new(Some(spare)));
    let (tx, rx) = mpsc::channel();
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let def = Arc::new(GraphDefinition::new(&gpu.device)?);
    {
        let (holder, s, tx, def) = (holder.clone(), s.clone(), tx.clone(), def.clone());
        let spare = spare.clone();
        b.add_host_callback(move || {
            drop(holder.lock().unwrap_or_else(|p| p.into_inner()).take());
            let _ = tx.send(format!("{:?}", s.synchronize()));
            // Refused before it asks the driver about devices.
            let far = MemAllocOptions::new().on_device(99);
            let made = def.add_mem_alloc_with(&[], 1024, &far).map(|_| ());
            let _ = tx.send(format!("{made:?}"));
            let _ = tx.send(format!("{:?}", Device::count()));
            let _ = tx.send(format!("{:?}", Device::new(0).map(|_| ())));
            drop(spare.lock().unwrap_or_else(|p| p.into_inner()).take());
        })?;
    }
    let outer = complete(b.end_building()?)?;
    launch_within("a callback calling into the crate", outer, s.clone())?;
    for _ in 0..4 {
        let said = rx.recv_timeout(Duration::from_secs(10))?;
        assert!(said.contains("inside a host callback"), "{said}");
    }
    assert!(spare.lock().unwrap_or_else(|p| p.into_inner()).is_none());
    assert!(def.nodes()?.is_empty(), "nothing was added");
    assert!(holder.lock().unwrap_or_else(|p| p.into_inner()).is_none());
    assert!(
        eventually(|| watch.is_released()),
        "the graph dropped in the callback is released"
    );
    Ok(())
}

/// A graph dropped while its launch stream captures is released by a fence thread once the
/// stream is idle. The fence used to check for a capture and then synchronize, unlocked: a
/// capture begun in between was invalidated, and the graph's operands were released while its
/// launch still ran. Here the stream begins and ends captures back to back the whole time.
fn a_graph_dropped_while_its_stream_captures_waits_for_its_launch_beside_a_capture_loop(
    gpu: &Gpu,
) -> TestResult {
    let s = gpu.stream();
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = buf.release_observer();
    let g = {
        let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
        // SAFETY: spin(ns) reads the clock; add_one(int*) writes p[0] of the one-int buffer.
        unsafe {
            b.launch_unchecked(&gpu.f("spin"), one(), &args![100_000_000u64])?;
            b.launch_unchecked(&gpu.f("add_one"), one(), &args![&buf])?;
        }
        complete(b.end_building()?)?
    };
    drop(buf);
    g.launch(&s)?;
    let done = gpu.device.create_event()?;
    s.record(&done)?;
    // More graphs launched on the stream, each with a fence of its own: more chances to catch
    // a fence between its check and its wait.
    let mut others = Vec::new();
    for _ in 0..40 {
        let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
        // SAFETY: empty_kernel().
        unsafe { b.launch_unchecked(&gpu.f("empty_kernel"), one(), &KernelArgs::new())? };
        let other = complete(b.end_building()?)?;
        other.launch(&s)?;
        others.push(other);
    }
    let mut b = s.create_graph_builder().begin_building(Relaxed)?;
    drop(g);
    drop(others);
    let start = Instant::now();
    let mut ends = 0;
    while start.elapsed() < Duration::from_millis(300) {
        // SAFETY: empty_kernel().
        unsafe { b.launch_unchecked(&gpu.f("empty_kernel"), one(), &KernelArgs::new())? };
        b.end_building()?;
        ends += 1;
        assert!(
            !watch.is_released() || done.is_complete()?,
            "the graph's buffer was released while its launch ran"
        );
        b = s.create_graph_builder().begin_building(Relaxed)?;
    }
    b.end_building()?;
    assert!(ends > 10, "{ends} captures");
    assert!(
        eventually(|| watch.is_released()),
        "released once the launch ran"
    );
    Ok(())
}

/// A builder shared with a host callback (a `Relaxed` one is `Send` and `Sync`): launching
/// through it inside the callback, on the driver's thread, is refused like any other call
/// there, and the builder records nothing.
fn a_builders_launch_inside_a_host_callback_is_an_error(gpu: &Gpu) -> TestResult {
    // SAFETY: add_one(int*) touches p[0] of the one-int buffer.
    let k = unsafe { gpu.module.kernel::<(*mut i32,)>("add_one")? };
    let buf = Arc::new(gpu.device.alloc_zeroed::<i32>(1)?);
    let shared = Arc::new(
        gpu.stream()
            .create_graph_builder()
            .begin_building(Relaxed)?,
    );
    let (tx, rx) = mpsc::channel();
    let outer = {
        let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
        let (inner, k, buf) = (shared.clone(), k.clone(), buf.clone());
        b.add_host_callback(move || {
            let _ = tx.send(format!("{:?}", inner.launch(&k, one(), &*buf)));
        })?;
        complete(b.end_building()?)?
    };
    launch_within(
        "a callback launching through a builder",
        outer,
        gpu.device.create_stream()?,
    )?;
    let said = rx.recv_timeout(Duration::from_secs(10))?;
    assert!(said.contains("inside a host callback"), "{said}");
    // The callback's state (holding a reference) goes with its exec, on the release thread.
    assert!(
        eventually(|| Arc::strong_count(&shared) == 1),
        "the callback's reference is dropped with its exec"
    );
    let ended = Arc::into_inner(shared)
        .ok_or("the builder is still shared")?
        .end_building()?;
    let graph = ended.instantiate()?;
    let s = gpu.stream();
    graph.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [0], "the refused launch was not recorded");
    Ok(())
}

/// A `Relaxed` builder is `Send`: a host callback can own it and drop it, or end it, on the
/// driver's thread, where no CUDA call may be made. Its capture must still end (on the release
/// thread), with its graph alive until then: a builder whose end was refused there dropped its
/// graph while the driver still captured into it, and the stream's later work went to the freed
/// graph.
fn a_relaxed_builder_dropped_in_a_host_callback_ends_its_capture(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    for end_it in [false, true] {
        let s = gpu.device.create_stream()?;
        let b = s.create_graph_builder().begin_building(Relaxed)?;
        b.memset_d32(&buf, 1)?;
        let held = Arc::new(std::sync::Mutex::new(Some(b)));
        let (tx, rx) = mpsc::channel();
        let outer = {
            let o = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
            let held = held.clone();
            o.add_host_callback(move || {
                let taken = held.lock().map(|mut h| h.take()).ok().flatten();
                let said = match taken {
                    Some(b) if end_it => format!("{:?}", b.end_building().map(|_| ())),
                    Some(b) => {
                        drop(b);
                        "dropped".to_string()
                    }
                    None => "no builder".to_string(),
                };
                let _ = tx.send(said);
            })?;
            complete(o.end_building()?)?
        };
        launch_within(
            "a callback dropping a capturing builder",
            outer,
            gpu.device.create_stream()?,
        )?;
        let said = rx.recv_timeout(Duration::from_secs(10))?;
        if end_it {
            assert!(said.contains("host callback"), "{said}");
        } else {
            assert_eq!(said, "dropped");
        }
        assert!(
            eventually(|| matches!(s.is_capturing(), Ok(false))),
            "the dropped builder's capture ended (end_building: {end_it})"
        );
        // The stream works again, outside any capture; the discarded capture's memset never ran.
        s.memset_d32(&buf, 5)?;
        s.synchronize()?;
        assert_eq!(buf.to_vec()?, [5]);
    }
    Ok(())
}

/// Every crate call inside a host callback is an error, also one that takes a lock first: here a
/// callback's `wait` on an event meets the event's lock held by a thread recording it on the
/// callback's own stream, which waits for that stream's slot, held by a third thread's
/// synchronous copy, which waits for the callback. The callback must be refused before it
/// takes the lock (it once waited for it: all three hung).
fn a_callback_waiting_on_an_event_another_thread_records_is_refused_not_deadlocked(
    gpu: &Gpu,
) -> TestResult {
    let s = gpu.device.create_stream()?;
    let other = gpu.device.create_stream()?;
    let event = gpu.device.create_event()?;
    let (tx, rx) = mpsc::channel();
    let pinned = Arc::new(gpu.device.alloc_pinned::<i32>(4)?);
    let g = {
        let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
        let (other, event, pinned) = (other.clone(), event.clone(), pinned.clone());
        b.add_host_callback(move || {
            // Until the recording thread holds the event's lock and waits for the stream.
            std::thread::sleep(Duration::from_millis(400));
            let _ = tx.send(format!("{:?}", other.wait(&event)));
            // Another lock taken before the bind, refused the same way.
            let _ = tx.send(format!("{:?}", pinned.synchronize()));
        })?;
        complete(b.end_building()?)?
    };
    let buf = gpu.device.alloc_zeroed::<i32>(64)?;
    let (s2, s3, event2) = (s.clone(), s.clone(), event.clone());
    within(
        30,
        "a callback waiting on an event being recorded",
        move || {
            g.launch(&s2).map_err(|e| e.to_string())?;
            // Holds the stream's slot while it waits for the stream, so for the callback.
            let copier = std::thread::spawn(move || {
                s3.memcpy_htod(&buf, &[1; 64]).map_err(|e| e.to_string())
            });
            std::thread::sleep(Duration::from_millis(100));
            // Holds the event's lock while it waits for the slot.
            let recorder =
                std::thread::spawn(move || s2.record(&event2).map_err(|e| e.to_string()));
            copier.join().map_err(|_| "the copy panicked")??;
            recorder.join().map_err(|_| "the record panicked")??;
            Ok(())
        },
    )?;
    for _ in 0..2 {
        let said = rx.recv_timeout(Duration::from_secs(10))?;
        assert!(said.contains("host callback"), "{said}");
    }
    s.synchronize()?;
    Ok(())
}

/// Item 16: launches of one exec from four threads are serialised (CUDA does not synchronise an
/// exec object) and all run.
fn one_graph_launched_from_four_threads(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let counter = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
    let g = complete(b.end_building()?)?;
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| -> cuda_graph::Result<()> {
                let s = gpu.device.create_stream()?;
                for _ in 0..100 {
                    g.launch(&s)?;
                    g.upload(&s)?;
                }
                s.synchronize()
            });
        }
    });
    gpu.device.synchronize()?;
    assert_eq!(counter.to_vec()?, [400]);
    Ok(())
}

/// Item 16: an exec launched into a capture kept its update sources forever; such a launch is
/// refused, with the way to do it instead.
fn launching_a_graph_into_a_capture_is_refused(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let counter = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
    let g = complete(b.end_building()?)?;
    let c = gpu.device.create_graph_builder()?.begin_building(Global)?;
    match g.launch(c.stream()) {
        Err(e) if e.refusal() == Some(Refusal::Capture) => {}
        other => return Err(format!("launch into a capture: {other:?}").into()),
    }
    assert!(g.upload(c.stream()).is_err());
    c.end_building()?;
    Ok(())
}

fn one_launch_graph(
    gpu: &Gpu,
    buf: &DeviceBuffer<i32>,
) -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { b.launch_unchecked(&gpu.f("add_one"), one(), &args![buf])? };
    b.end_building()
}

/// Item 16: an update's source stays alive while launches that use it may run, and is released
/// once they have finished — not kept for the exec's life.
fn update_sources_are_released_once_their_launches_end(gpu: &Gpu) -> TestResult {
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let g = complete(one_launch_graph(gpu, &a)?)?;
    let s = gpu.stream();
    let b = gpu.device.alloc_zeroed::<i32>(1)?;
    let wb = b.release_observer();
    g.update(&one_launch_graph(gpu, &b)?)?;
    drop(b);
    g.launch(&s)?;
    g.launch(&s)?;
    assert!(!wb.is_released(), "b is in use by the exec");
    s.synchronize()?;
    let c = gpu.device.alloc_zeroed::<i32>(1)?;
    let wc = c.release_observer();
    g.update(&one_launch_graph(gpu, &c)?)?;
    g.launch(&s)?;
    s.synchronize()?;
    assert!(
        eventually(|| wb.is_released()),
        "b is released once the launches that used it ended"
    );
    assert_eq!(c.to_vec()?, [1]);
    drop(c);
    assert!(!wc.is_released());
    drop(g);
    assert!(
        eventually(|| wc.is_released()),
        "c is released with the exec"
    );
    assert_eq!(a.to_vec()?, [0]);
    Ok(())
}

/// An IF graph (default 1) whose body adds one to `buf`, ended (not completed).
fn if_default_one(
    gpu: &Gpu,
    buf: &DeviceBuffer<i32>,
) -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
    let add_one = gpu.f("add_one");
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(1))?;
    {
        let body = p.add_if(&h)?.begin_building(Global)?;
        // SAFETY: add_one(int*).
        unsafe { body.launch_unchecked(&add_one, one(), &args![buf])? };
        body.end_building()?;
    }
    p.end_building()
}

/// Execs with a conditional node dropped right after a launch. Driver 13.0 crashed in
/// `cuGraphExecDestroy` when the exec was destroyed on one thread while its source graph was
/// destroyed on another (the exec's release ran beside it); both now go in order on one thread.
fn conditional_execs_dropped_right_after_their_launch(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    const CYCLES: i32 = 2000;
    for _ in 0..CYCLES {
        let g = if_default_one(gpu, &buf)?.instantiate()?;
        g.launch(&s)?;
        s.synchronize()?;
        drop(g);
    }
    assert_eq!(buf.to_vec()?, [CYCLES]);
    Ok(())
}

/// An exec with a conditional node updated from new conditional graphs while its earlier
/// launches still run (each spins first), the sources it replaces released behind them.
///
/// Under compute-sanitizer memcheck (driver 13.0) the launch after such an update fails with
/// `CUDA_ERROR_ILLEGAL_ADDRESS` and no memcheck error, also with every source kept alive and with
/// nothing but `cuGraphExecUpdate` and `cuGraphLaunch` between launches; with a synchronize
/// between launches it passes. Without the tool it passes: `run-all.sh` skips this test under
/// the sanitizer (docs/design/performance.md, "Running under compute-sanitizer").
fn conditional_execs_updated_while_their_launches_run(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    let spin = gpu.f("spin");
    let spinning = || -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
        let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
        let h = p.create_conditional_handle(Some(1))?;
        {
            let body = p.add_if(&h)?.begin_building(Global)?;
            // SAFETY: spin(unsigned long long ns), add_one(int*).
            unsafe {
                body.launch_unchecked(&spin, one(), &args![100_000u64])?;
                body.launch_unchecked(&gpu.f("add_one"), one(), &args![&buf])?;
            }
            body.end_building()?;
        }
        p.end_building()
    };
    const CYCLES: i32 = 500;
    let g = spinning()?.instantiate()?;
    for _ in 0..CYCLES {
        g.update(&spinning()?)?;
        g.launch(&s)?;
    }
    s.synchronize()?;
    drop(g);
    assert_eq!(buf.to_vec()?, [CYCLES]);
    let g = if_default_one(gpu, &buf)?.instantiate()?;
    for _ in 0..CYCLES {
        g.update(&if_default_one(gpu, &buf)?)?;
        g.launch(&s)?;
    }
    s.synchronize()?;
    drop(g);
    assert_eq!(buf.to_vec()?, [2 * CYCLES]);
    Ok(())
}

/// The environment variable that makes the suite's binary run [`child`] instead of the tests.
pub const CHILD: &str = "CUDA_GRAPH_TEST_CHILD";

/// A process that leaves captures open and exits: a `Global` capture with a launch and a fork,
/// a `Relaxed` one with a conditional body (all leaked with `mem::forget`), and a graph still
/// running. It must exit normally and promptly (no hang in the crate's release thread or in the
/// driver's teardown, no crash). Returns the exit code.
pub fn child(what: &str) -> i32 {
    if what != "open_captures" {
        eprintln!("unknown child {what:?}");
        return 2;
    }
    let run = || -> cuda_graph::Result<()> {
        let device = Device::new(0)?;
        // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
        let module = unsafe { device.load_module(crate::support::KERNELS)? };
        let add_one = module.function("add_one")?;
        let buf = device.alloc_zeroed::<i32>(1)?;
        let relaxed = device.create_graph_builder()?.begin_building(Relaxed)?;
        let h = relaxed.create_conditional_handle(Some(1))?;
        let body = relaxed.add_if(&h)?.begin_building(Relaxed)?;
        // SAFETY: add_one(int*).
        unsafe { body.launch_unchecked(&add_one, one(), &args![&buf])? };
        let global = device.create_graph_builder()?.begin_building(Global)?;
        // SAFETY: add_one(int*).
        unsafe { global.launch_unchecked(&add_one, one(), &args![&buf])? };
        let forks = global.split::<2>()?;
        // SAFETY: add_one(int*).
        unsafe { forks[0].launch_unchecked(&add_one, one(), &args![&buf])? };
        std::mem::forget(forks);
        std::mem::forget(body);
        std::mem::forget(relaxed);
        std::mem::forget(global);
        // Dropped while the leaked Global capture lives: the release is deferred, forever.
        drop(buf);
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("child: {e}");
            3
        }
    }
}

/// A process may end with captures still open (builders leaked with `mem::forget`, a buffer
/// whose release waits for a `Global` capture that never ends): it exits with its own status,
/// promptly, without a crash or a hang.
fn captures_left_open_at_process_exit(_gpu: &Gpu) -> TestResult {
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .env(CHILD, "open_captures")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err("the process with open captures did not exit within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "exit status {status:?}; stderr: {err}");
    Ok(())
}

/// `InstantiateOptions::upload_on` with a stream that is capturing is refused before the
/// driver, as `Graph::upload` refuses it: the instantiation used to fail inside the driver and
/// invalidate the user's capture on that stream.
fn an_upload_stream_that_captures_is_refused_before_instantiation(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let other = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.device.create_stream()?;
    let b = s.create_graph_builder().begin_building(Relaxed)?;
    b.memset_d32(&buf, 1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    def.add_memset(&[], &other, 2i32)?;
    match def.instantiate_with(&InstantiateOptions::new().upload_on(&s)) {
        Err(e) if e.refusal() == Some(Refusal::Capture) => {}
        other => return Err(format!("expected a refusal, got {other:?}").into()),
    }
    // The capture is intact.
    let g = b.end_building()?.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1]);
    // And an idle upload stream works.
    let up = def.instantiate_with(&InstantiateOptions::new().upload_on(&s))?;
    up.launch(&s)?;
    s.synchronize()?;
    assert_eq!(other.to_vec()?, [2]);
    Ok(())
}

/// `Graph::set_params`, `set_enabled` and `update` refuse a host callback's thread before they
/// take the exec's lock or call the driver, as `launch` and `is_enabled` do.
fn exec_updates_in_a_host_callback_are_refused(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let node = def.add_memset(&[], &buf, 1i32)?;
    let exec = Arc::new(std::sync::Mutex::new(def.instantiate()?));
    let params = std::sync::Mutex::new(Some(NodeParams::memset(&buf, 3i32)?));
    let (tx, rx) = mpsc::channel();
    let outer = {
        let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
        let (exec, def, node) = (exec.clone(), def.try_clone()?, node);
        b.add_host_callback(move || {
            let Ok(g) = exec.lock() else { return };
            let Some(params) = params.lock().ok().and_then(|mut p| p.take()) else {
                return;
            };
            let said = [
                ("set_params", g.set_params(&node, params).map(|_| ())),
                ("set_enabled", g.set_enabled(&node, false)),
                ("update", g.update(&def)),
            ]
            .map(|(what, r)| format!("{what}: {r:?}"));
            let _ = tx.send(said);
        })?;
        complete(b.end_building()?)?
    };
    launch_within(
        "a callback updating an exec",
        outer,
        gpu.device.create_stream()?,
    )?;
    for said in rx.recv_timeout(Duration::from_secs(10))? {
        assert!(said.contains("host callback"), "{said}");
    }
    // The exec was left as it was: it still sets 1.
    let s = gpu.device.create_stream()?;
    exec.lock().map_err(|e| e.to_string())?.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1]);
    Ok(())
}

/// What the refusal of self-embedding recommends — embed a clone — leaks nothing: a graph that
/// embeds its own clone, and two graphs that embed each other's clones (through definitions and
/// through a capture), are released with everything they hold once the user's handles go.
fn graphs_embedding_their_own_clones_are_released(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let add_one = gpu.f("add_one");
    let made = |n: i32| -> cuda_graph::Result<GraphDefinition> {
        let def = GraphDefinition::new(&gpu.device)?;
        for _ in 0..n {
            // SAFETY: add_one(int*).
            unsafe { def.add_kernel_unchecked(&[], &add_one, one(), &args![&buf])? };
        }
        Ok(def)
    };
    // One graph embedding its own clone: it runs its node and the clone's.
    let a = made(1)?;
    let watch_a = a.release_observer();
    let clone = a.try_clone()?;
    let watch_clone = clone.release_observer();
    a.add_child_graph(&[], &clone)?;
    let g = a.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [2]);
    drop((g, a, clone));
    assert!(
        eventually(|| watch_a.is_released() && watch_clone.is_released()),
        "a graph embedding its own clone is released"
    );
    // Two graphs embedding each other's clones.
    let (b, c) = (made(1)?, made(2)?);
    let (watch_b, watch_c) = (b.release_observer(), c.release_observer());
    b.add_child_graph(&[], &c.try_clone()?)?;
    c.add_child_graph(&[], &b.try_clone()?)?;
    drop((b, c));
    assert!(
        eventually(|| watch_b.is_released() && watch_c.is_released()),
        "graphs embedding each other's clones are released"
    );
    // A capture embedding a clone of a graph that holds the capture's own earlier result.
    let first = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    // SAFETY: add_one(int*).
    unsafe { first.launch_unchecked(&add_one, one(), &args![&buf])? };
    let first = first.end_building()?;
    let def = first.graph_definition()?;
    let watch_first = def.release_observer();
    def.add_child_graph(&[], &def.try_clone()?)?;
    let second = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
    second.add_child_graph(&def.try_clone()?)?;
    let second = second.end_building()?;
    drop((first, def, second));
    assert!(
        eventually(|| watch_first.is_released()),
        "a captured graph embedding its own clone is released"
    );
    // What they held goes with them: the buffer is held by nothing else now.
    let watch_buf = buf.release_observer();
    drop(buf);
    assert!(
        eventually(|| watch_buf.is_released()),
        "the buffer is freed"
    );
    Ok(())
}

/// A kernel that device-launches an exec, added to the very definition that exec was
/// instantiated from: the definition holds the exec's keep-alive, whose parked release held the
/// definition — a cycle that leaked both. Everything is released once the user's handles go.
fn a_device_graph_in_its_own_source_definition_is_released(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let status = gpu.device.htod(&[-1i32])?;
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    let first = unsafe { def.add_kernel_unchecked(&[], &gpu.f("add_one"), one(), &args![&buf])? };
    let watch = def.release_observer();
    let exec = def.instantiate_with(&InstantiateOptions::new().device_launch(true))?;
    let handle = exec.device_handle()?;
    // SAFETY: launch_graph(cudaGraphExec_t g, int* status), in a graph.
    unsafe {
        def.add_kernel_unchecked(
            &[&first],
            &gpu.f("launch_graph"),
            one(),
            &args![handle, &status],
        )?
    };
    // The definition's new exec adds one and device-launches the first exec, which adds one.
    let launcher = def.instantiate()?;
    let s = gpu.stream();
    launcher.launch(&s)?;
    s.synchronize()?;
    assert_eq!(status.to_vec()?, [0], "cudaGraphLaunch on the device");
    assert!(eventually(|| buf.to_vec().ok() == Some(vec![2])));
    drop((launcher, exec));
    assert!(
        stays(|| !watch.is_released()),
        "the definition is still the user's"
    );
    drop(def);
    assert!(
        eventually(|| watch.is_released()),
        "the definition and the exec it holds are released"
    );
    Ok(())
}

/// An outer graph whose kernel device-launches an inner exec: the inner `Graph` is dropped
/// first, then the outer exec while its launch still runs. The inner exec, its source and its
/// operands are released once the outer launch has finished.
fn an_outer_exec_dropped_while_it_runs_releases_the_inner_exec(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch_buf = buf.release_observer();
    let status = gpu.device.htod(&[-1i32])?;
    let inner_def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    unsafe { inner_def.add_kernel_unchecked(&[], &gpu.f("add_one"), one(), &args![&buf])? };
    let watch_inner = inner_def.release_observer();
    let inner = inner_def.instantiate_with(&InstantiateOptions::new().device_launch(true))?;
    let outer_def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: spin(ns) only reads the clock; launch_graph(cudaGraphExec_t, int*), in a graph.
    unsafe {
        let spin =
            outer_def.add_kernel_unchecked(&[], &gpu.f("spin"), one(), &args![1_000_000_000u64])?;
        outer_def.add_kernel_unchecked(
            &[&spin],
            &gpu.f("launch_graph"),
            one(),
            &args![inner.device_handle()?, &status],
        )?;
    }
    let outer = outer_def.instantiate()?;
    drop((inner, inner_def, outer_def, buf));
    let s = gpu.stream();
    outer.launch(&s)?;
    drop(outer); // its launch spins for a second yet
    assert!(
        stays(|| !watch_buf.is_released()),
        "the inner exec's buffer is held while the launch runs"
    );
    s.synchronize()?;
    assert_eq!(status.to_vec()?, [0], "cudaGraphLaunch on the device");
    assert!(
        eventually(|| watch_inner.is_released() && watch_buf.is_released()),
        "the inner exec, its source and its buffer are released after the outer launch"
    );
    Ok(())
}

/// A whole-graph `Graph::update` sets every node's parameters, so what the exec was instantiated
/// with (a host callback's closure here) is released once no launch that used it is pending —
/// not kept until the exec is dropped.
fn a_whole_graph_update_releases_what_the_exec_was_instantiated_with(gpu: &Gpu) -> TestResult {
    let made = |token: Arc<()>| -> cuda_graph::Result<GraphDefinition> {
        let def = GraphDefinition::new(&gpu.device)?;
        def.add_host_callback(&[], move || {
            let _ = &token;
        })?;
        Ok(def)
    };
    let (first, second) = (Arc::new(()), Arc::new(()));
    let (watch_first, watch_second) = (Arc::downgrade(&first), Arc::downgrade(&second));
    let a = made(first)?;
    let exec = a.instantiate()?;
    drop(a);
    let s = gpu.stream();
    exec.launch(&s)?;
    let b = made(second)?;
    exec.update(&b)?;
    drop(b);
    s.synchronize()?;
    assert!(
        eventually(|| watch_first.upgrade().is_none()),
        "the first callback is released after the launch that used it"
    );
    assert!(
        watch_second.upgrade().is_some(),
        "the exec runs the second now"
    );
    exec.launch(&s)?;
    s.synchronize()?;
    drop(exec);
    assert!(eventually(|| watch_second.upgrade().is_none()));
    Ok(())
}

/// `Graph::set_params` replaces one node's parameters: what that node was instantiated with (a
/// buffer, a host callback's closure) is released once no launch that used it is pending, with
/// the definition dropped — while what other nodes of the exec still use (the kernel's module,
/// another node's buffer) stays.
fn a_per_node_update_of_an_exec_releases_what_the_node_was_instantiated_with(
    gpu: &Gpu,
) -> TestResult {
    let add_one = gpu.f("add_one");
    let (a, b, c) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let (watch_a, watch_c) = (a.release_observer(), c.release_observer());
    let token = Arc::new(());
    let watch_token = Arc::downgrade(&token);
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    let (on_a, _on_c) = unsafe {
        (
            def.add_kernel_unchecked(&[], &add_one, one(), &args![&a])?,
            def.add_kernel_unchecked(&[], &add_one, one(), &args![&c])?,
        )
    };
    let (host, _) = def.add_host_callback(&[], move || {
        let _ = &token;
    })?;
    let exec = def.instantiate()?;
    drop(def);
    let s = gpu.stream();
    exec.launch(&s)?;
    // SAFETY: add_one(int*).
    exec.set_params(&on_a, unsafe {
        NodeParams::kernel_unchecked(&add_one, one(), args![&b])
    })?;
    let (params, _observer) = NodeParams::host_callback(|| {});
    exec.set_params(&host, params)?;
    drop(a);
    s.synchronize()?;
    assert!(
        eventually(|| watch_a.is_released() && watch_token.upgrade().is_none()),
        "the replaced buffer and closure are released after the launch that used them"
    );
    assert!(
        stays(|| !watch_c.is_released()),
        "the other node's buffer is the exec's still"
    );
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!((b.to_vec()?, c.to_vec()?), (vec![1], vec![2]));
    drop((exec, c));
    assert!(eventually(|| watch_c.is_released()));
    Ok(())
}

/// The graph a child-graph node runs, as its `inspect` view.
fn child_view(def: &GraphDefinition, node: &GraphNode) -> Result<GraphDefinition, String> {
    match def.inspect(node).map_err(|e| e.to_string())? {
        cuda_graph::NodeInfo::ChildGraph(_, info) => Ok(info.graph),
        other => Err(format!("expected a child-graph node, got {other:?}")),
    }
}

/// The first node of `def` of type `ty`.
fn node_of(def: &GraphDefinition, ty: NodeType) -> Result<GraphNode, String> {
    for n in def.nodes().map_err(|e| e.to_string())? {
        if def.node_type(&n).map_err(|e| e.to_string())? == ty {
            return Ok(n);
        }
    }
    Err(format!("no {ty:?} node"))
}

/// What a node of an embedded graph used is held by that node's copy inside the child-graph
/// node: destroying the copy (through `inspect`) releases it, nested two deep too, while what
/// the copy's other nodes use stays until the child-graph node goes.
fn a_node_destroyed_inside_an_embedded_copy_releases_what_it_used(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch_buf = buf.release_observer();
    let (token, nested_token) = (Arc::new(()), Arc::new(()));
    let (watch_token, watch_nested) = (Arc::downgrade(&token), Arc::downgrade(&nested_token));
    // inner: a host callback (holding `nested_token`); middle: a kernel on `buf`, a host
    // callback (holding `token`) and inner embedded; outer: middle embedded.
    let inner = GraphDefinition::new(&gpu.device)?;
    inner.add_host_callback(&[], move || {
        let _ = &nested_token;
    })?;
    let middle = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    unsafe { middle.add_kernel_unchecked(&[], &add_one, one(), &args![&buf])? };
    middle.add_host_callback(&[], move || {
        let _ = &token;
    })?;
    middle.add_child_graph(&[], &inner)?;
    drop(inner);
    let outer = GraphDefinition::new(&gpu.device)?;
    let embedded = outer.add_child_graph(&[], &middle)?;
    drop((middle, buf));
    // Everything is held by outer's copy now.
    assert!(stays(|| watch_token.upgrade().is_some()
        && watch_nested.upgrade().is_some()
        && !watch_buf.is_released()));
    let copy = child_view(&outer, &embedded)?;
    copy.destroy_node(node_of(&copy, NodeType::Host)?)?;
    assert!(
        eventually(|| watch_token.upgrade().is_none()),
        "the destroyed host node's closure is released"
    );
    let nested = child_view(&copy, &node_of(&copy, NodeType::Child)?)?;
    nested.destroy_node(node_of(&nested, NodeType::Host)?)?;
    assert!(
        eventually(|| watch_nested.upgrade().is_none()),
        "the closure of a host node two copies deep is released"
    );
    assert!(
        stays(|| !watch_buf.is_released()),
        "the kernel's buffer is the copy's still"
    );
    // The copy still runs its kernel.
    let exec = outer.instantiate()?;
    let s = gpu.stream();
    exec.launch(&s)?;
    s.synchronize()?;
    drop(exec);
    outer.destroy_node(embedded)?;
    assert!(eventually(|| watch_buf.is_released()));
    Ok(())
}

/// Six threads on one exec for a few seconds: launches on two streams; per-node updates with
/// fresh buffers dropped at once (kernel and memset nodes); enable toggles; whole-graph updates
/// from two other definitions, each followed by a per-node update through its node; and a thread
/// allocating sentinel buffers all the while, which take the addresses of replaced buffers as
/// soon as those are freed. A replaced buffer freed while a launch that uses it is still queued
/// (on either stream) shows as a sentinel the exec's kernels or memsets wrote. Every release of
/// what an update replaced waits for the latest launch, which the crate orders after every
/// earlier launch of the exec, on whatever stream.
/// A thread's loop of [`replaced_operands_outlive_every_earlier_launch_on_every_stream`]: until
/// `stop`, an update `set` with a fresh buffer, dropped at once; its release observer goes to `tx`.
fn replacing<'a>(
    stop: &'a std::sync::atomic::AtomicBool,
    alloc: &'a (dyn Fn() -> cuda_graph::Result<DeviceBuffer<i32>> + Sync),
    tx: mpsc::Sender<cuda_graph::ReleaseObserver>,
    mut set: impl FnMut(usize, &DeviceBuffer<i32>) -> cuda_graph::Result<()> + Send + 'a,
) -> impl FnOnce() -> cuda_graph::Result<usize> + Send + 'a {
    move || {
        let mut n = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let f = alloc()?;
            set(n, &f)?;
            let _ = tx.send(f.release_observer());
            drop(f);
            n += 1;
        }
        Ok(n)
    }
}

/// Six threads on one exec: launches on two streams; kernel and memset per-node updates with
/// fresh buffers dropped at once; whole-graph updates from two definitions, each followed by a
/// per-node update through the source's node; the kernel node disabled and enabled (memset
/// nodes are refused that, see `a_memset_node_is_never_toggled`). Sentinel buffers allocated as
/// soon as a replaced buffer is released are never written: no launch used a released buffer.
fn replaced_operands_outlive_every_earlier_launch_on_every_stream(gpu: &Gpu) -> TestResult {
    use std::sync::atomic::{AtomicBool, Ordering};
    const N: i32 = 256;
    const SECONDS: u64 = 8;
    const MAX_SENTINELS: usize = 60_000;
    // SAFETY: fill(int* p, int n, int v) writes p[0..n).
    let fill: Kernel<(*mut i32, i32, i32)> = unsafe { gpu.module.kernel("fill")? };
    let spin = gpu.f("spin");
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let alloc = || gpu.device.alloc_zeroed::<i32>(N as usize);
    // spin (50 us) -> fill(buf, v) -> memset(mbuf, v + 100): launches stay queued a while.
    let make =
        |v: i32| -> cuda_graph::Result<(GraphDefinition, KernelNode, cuda_graph::MemsetNode)> {
            let def = GraphDefinition::new(&gpu.device)?;
            let (buf, mbuf) = (alloc()?, alloc()?);
            // SAFETY: spin(unsigned long long ns) only reads the clock.
            let sp = unsafe { def.add_kernel_unchecked(&[], &spin, one(), &args![50_000u64])? };
            let k = def.add_kernel(&[&sp], &fill, cfg, (&buf, N, v))?;
            let m = def.add_memset(&[&k], &mbuf, v + 100)?;
            Ok((def, k, m))
        };
    let (a, ka, ma) = make(1)?;
    let (b, kb, _) = make(2)?;
    let (c, kc, _) = make(3)?;
    let exec = a.instantiate()?;
    drop(a);
    let stop = AtomicBool::new(false);
    // `CUDA_GRAPH_STRESS_OFF=toggles,updates,kernels,memsets,stream2` leaves those threads out
    // (for narrowing a failure down on the GPU machine); unset, all run.
    let off_list = std::env::var("CUDA_GRAPH_STRESS_OFF").unwrap_or_default();
    let off = |name: &str| off_list.split(',').any(|t| t.trim() == name);
    let stopped = AtomicBool::new(true);
    let stop_of = |name: &str| if off(name) { &stopped } else { &stop };
    let (s1, s2) = (gpu.stream(), gpu.stream());
    // Replaced buffers' observers: the sentinel thread allocates as soon as one is released, so
    // the allocator tends to hand out that very memory.
    let (watch_tx, watch_rx) = mpsc::channel::<cuda_graph::ReleaseObserver>();
    let launcher = |s: &Stream, stop: &AtomicBool| -> cuda_graph::Result<usize> {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            exec.launch(s)?;
            n += 1;
            if n % 64 == 0 {
                s.synchronize()?;
            }
        }
        s.synchronize()?;
        Ok(n)
    };
    let mut sentinels = Vec::new();
    let counts = std::thread::scope(|scope| -> Result<[usize; 6], String> {
        let launches = [
            scope.spawn(|| launcher(&s1, &stop)),
            scope.spawn(|| launcher(&s2, stop_of("stream2"))),
        ];
        let (kernels_stop, memsets_stop) = (stop_of("kernels"), stop_of("memsets"));
        let (updates_stop, toggles_stop) = (stop_of("updates"), stop_of("toggles"));
        // The threads below take their channel ends and references to the rest.
        let (stop, exec, fill, alloc) = (&stop, &exec, &fill, &alloc);
        let (ka, ma, kb, kc, b, c) = (&ka, &ma, &kb, &kc, &b, &c);
        // Per-node updates with a fresh buffer each, dropped at once and watched.
        let kernels = scope.spawn(replacing(
            kernels_stop,
            alloc,
            watch_tx.clone(),
            move |_, f: &DeviceBuffer<i32>| {
                exec.set_params(ka, NodeParams::kernel(fill, cfg, (f, N, 7))?)
            },
        ));
        let memsets = scope.spawn(replacing(
            memsets_stop,
            alloc,
            watch_tx.clone(),
            move |_, f: &DeviceBuffer<i32>| exec.set_params(ma, NodeParams::memset(f, 9)?),
        ));
        // Whole-graph updates, each followed by a per-node update through the source's node.
        let updates = scope.spawn(replacing(
            updates_stop,
            alloc,
            watch_tx.clone(),
            move |n: usize, f: &DeviceBuffer<i32>| {
                let (def, k) = if n.is_multiple_of(2) {
                    (b, kb)
                } else {
                    (c, kc)
                };
                exec.update(def)?;
                exec.set_params(k, NodeParams::kernel(fill, cfg, (f, N, 11))?)
            },
        ));
        let toggles = scope.spawn(move || -> cuda_graph::Result<usize> {
            let mut n = 0;
            while !toggles_stop.load(Ordering::Relaxed) {
                exec.set_enabled(ka, n % 2 == 1)?;
                n += 1;
                std::thread::yield_now();
            }
            exec.set_enabled(ka, true)?;
            Ok(n)
        });
        drop(watch_tx);
        let deadline = Instant::now() + Duration::from_secs(SECONDS);
        let mut pending = Vec::new();
        while Instant::now() < deadline && sentinels.len() < MAX_SENTINELS {
            pending.extend(watch_rx.try_iter());
            let before = pending.len();
            pending.retain(|w: &cuda_graph::ReleaseObserver| !w.is_released());
            for _ in 0..(before - pending.len()).max(1) {
                match alloc() {
                    Ok(buf) => sentinels.push(buf),
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        return Err(format!("sentinel allocation: {e}"));
                    }
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let join = |h: std::thread::ScopedJoinHandle<'_, cuda_graph::Result<usize>>| {
            h.join()
                .map_err(|_| "a thread panicked".to_string())?
                .map_err(|e| e.to_string())
        };
        let [l1, l2] = launches;
        Ok([
            join(l1)? + join(l2)?,
            join(kernels)?,
            join(memsets)?,
            join(updates)?,
            join(toggles)?,
            sentinels.len(),
        ])
    })?;
    gpu.device.synchronize()?;
    let mut written = 0;
    let mut seen = std::collections::BTreeSet::new();
    for sentinel in &sentinels {
        let v = sentinel.to_vec()?;
        if v.iter().any(|&x| x != 0) {
            written += 1;
            seen.extend(v.into_iter().filter(|&x| x != 0));
        }
    }
    println!(
        "    {} launches, {} kernel and {} memset per-node updates, {} whole-graph updates, {} enable toggles, {} sentinels, {written} written",
        counts[0], counts[1], counts[2], counts[3], counts[4], counts[5]
    );
    let ran = [
        true,
        !off("kernels"),
        !off("memsets"),
        !off("updates"),
        !off("toggles"),
        true,
    ];
    assert!(
        counts.iter().zip(ran).all(|(&n, on)| !on || n > 0),
        "every thread that ran did some work: {counts:?}"
    );
    if !off_list.is_empty() {
        println!("    threads left out: {off_list}");
    }
    assert_eq!(
        written, 0,
        "sentinel buffers written by the exec (values {seen:?}): a replaced buffer was freed while a launch using it was queued"
    );
    Ok(())
}

/// An exec's device handle in an outer graph, and then everything — the inner exec, both
/// definitions, the outer exec, the inner exec's buffer and the stream — dropped while the outer
/// launch runs, in each order of the two execs: the inner exec, its source and its buffer are
/// released once the outer launch has ended.
fn everything_dropped_while_an_outer_launch_runs_releases_the_inner_exec(gpu: &Gpu) -> TestResult {
    for round in 0..8 {
        let (inner_first, captured) = (round % 2 == 0, round % 4 >= 2);
        // Half the rounds drop everything while the outer launch spins, half after it ended.
        let ns: u64 = if round < 4 { 100_000_000 } else { 0 };
        let buf = gpu.device.alloc_zeroed::<i32>(1)?;
        let watch_buf = buf.release_observer();
        let status = gpu.device.htod(&[-1i32])?;
        let inner_def = GraphDefinition::new(&gpu.device)?;
        // SAFETY: add_one(int*).
        unsafe { inner_def.add_kernel_unchecked(&[], &gpu.f("add_one"), one(), &args![&buf])? };
        let watch_inner = inner_def.release_observer();
        let inner = inner_def.instantiate_with(&InstantiateOptions::new().device_launch(true))?;
        let handle = inner.device_handle()?;
        // SAFETY: spin(ns) only reads the clock; launch_graph(cudaGraphExec_t, int*), in a graph.
        let outer = if captured {
            let b = gpu.device.create_graph_builder()?.begin_building(Relaxed)?;
            unsafe {
                b.launch_unchecked(&gpu.f("spin"), one(), &args![ns])?;
                b.launch_unchecked(&gpu.f("launch_graph"), one(), &args![handle, &status])?;
            }
            b.end_building()?.instantiate()?
        } else {
            let outer_def = GraphDefinition::new(&gpu.device)?;
            unsafe {
                let spin =
                    outer_def.add_kernel_unchecked(&[], &gpu.f("spin"), one(), &args![ns])?;
                outer_def.add_kernel_unchecked(
                    &[&spin],
                    &gpu.f("launch_graph"),
                    one(),
                    &args![handle, &status],
                )?;
            }
            outer_def.instantiate()?
        };
        let s = gpu.stream();
        outer.launch(&s)?;
        if inner_first {
            drop((inner, inner_def, buf, outer, s));
        } else {
            drop((outer, s, inner, inner_def, buf));
        }
        gpu.device.synchronize()?;
        assert_eq!(status.to_vec()?, [0], "cudaGraphLaunch on the device");
        assert!(
            eventually(|| watch_inner.is_released() && watch_buf.is_released()),
            "round {round} (inner first: {inner_first}, captured: {captured}): the inner exec's source released {}, its buffer {}",
            watch_inner.is_released(),
            watch_buf.is_released()
        );
    }
    Ok(())
}

/// An exec instantiated from definition A (a host callback), updated from B while both
/// definitions live, then both dropped: A's callback was kept until the exec went (the exec
/// holds A's graph, whose nodes name the exec's for per-node updates, and A's tree held what
/// its nodes used). Once only execs hold a graph, its tree lets go of that; A's nodes still name
/// the exec's nodes, and B's callback, which the exec runs, stays.
fn definitions_dropped_after_an_update_release_their_operands(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let counter = gpu.device.alloc_zeroed::<i32>(1)?;
    let made = |token: Arc<()>| -> cuda_graph::Result<(GraphDefinition, KernelNode)> {
        let def = GraphDefinition::new(&gpu.device)?;
        let (host, _) = def.add_host_callback(&[], move || {
            let _ = &token;
        })?;
        // SAFETY: add_one(int*).
        let k = unsafe { def.add_kernel_unchecked(&[&host], &add_one, one(), &args![&counter])? };
        Ok((def, k))
    };
    let (first, second) = (Arc::new(()), Arc::new(()));
    let (watch_first, watch_second) = (Arc::downgrade(&first), Arc::downgrade(&second));
    let (a, ka) = made(first)?;
    let (b, _) = made(second)?;
    let exec = a.instantiate()?;
    let s = gpu.stream();
    exec.launch(&s)?;
    exec.update(&b)?;
    s.synchronize()?;
    assert!(
        stays(|| watch_first.upgrade().is_some()),
        "A's definition still holds its callback"
    );
    drop((a, b));
    assert!(
        eventually(|| watch_first.upgrade().is_none()),
        "A's callback is released once A is dropped, while the exec updated from B lives"
    );
    assert!(
        stays(|| watch_second.upgrade().is_some()),
        "the exec runs B's callback"
    );
    // A's kernel node still names the exec's (now running B's kernel).
    exec.set_enabled(&ka, false)?;
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(
        counter.to_vec()?,
        [1],
        "the second launch ran without the disabled kernel"
    );
    drop(exec);
    assert!(
        eventually(|| watch_second.upgrade().is_none()),
        "B's callback is released with the exec"
    );
    Ok(())
}

/// A host node of a child graph that a builder embedded, destroyed through the captured
/// graph's `inspect` view of its copy: its closure was kept (the capture held the child's
/// whole snapshot); now each node's copy holds what that node used, as a definition's does.
fn a_host_node_destroyed_in_a_builders_embedded_copy_releases_its_closure(gpu: &Gpu) -> TestResult {
    let token = Arc::new(());
    let watch = Arc::downgrade(&token);
    let child = GraphDefinition::new(&gpu.device)?;
    child.add_host_callback(&[], move || {
        let _ = &token;
    })?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    b.add_child_graph(&child)?;
    let ended = b.end_building()?;
    drop(child);
    assert!(
        stays(|| watch.upgrade().is_some()),
        "the captured copy holds the closure"
    );
    let view = ended.graph_definition()?;
    let copy = child_view(&view, &node_of(&view, NodeType::Child)?)?;
    copy.destroy_node(node_of(&copy, NodeType::Host)?)?;
    assert!(
        eventually(|| watch.upgrade().is_none()),
        "the destroyed copy's closure is released"
    );
    let g = ended.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    Ok(())
}

/// Launches of one exec on two streams run in launch order: the second stream waits for the
/// first launch (a spin, then `affine` x -> 2x + 1; `affine` x -> 2x + 1 again on the second
/// stream gives 3 from 0 only in that order). A launch on another stream while the previous
/// launch's stream captures is refused (the event it records there would be captured), and
/// works once the capture ended.
fn launches_on_two_streams_run_in_order_and_wait_for_the_one_before(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: spin(ns) only reads the clock; affine(int* p, int m, int b) sets p[0] = m p[0] + b.
    unsafe {
        let spin = def.add_kernel_unchecked(&[], &gpu.f("spin"), one(), &args![100_000_000u64])?;
        def.add_kernel_unchecked(&[&spin], &gpu.f("affine"), one(), &args![&buf, 2i32, 1i32])?;
    }
    let g = def.instantiate()?;
    let (s1, s2) = (gpu.stream(), gpu.stream());
    g.launch(&s1)?;
    g.launch(&s2)?;
    s2.synchronize()?;
    assert_eq!(
        buf.to_vec()?,
        [3],
        "the launch on s2 ran after the one on s1"
    );
    let b = s2.create_graph_builder().begin_building(ThreadLocal)?;
    match g.launch(&s1) {
        Err(e) if e.refusal() == Some(Refusal::Capture) => {}
        other => {
            return Err(format!("a launch while the previous stream captures: {other:?}").into())
        }
    }
    drop(b.end_building()?);
    g.launch(&s1)?;
    s1.synchronize()?;
    assert_eq!(buf.to_vec()?, [7]);
    Ok(())
}

/// The release of what a whole-graph update replaced assumes the update set every node's
/// parameters, disabled nodes included. Checked against the driver: a kernel node disabled
/// while the exec is updated from another definition, then enabled, runs the new definition's
/// kernel parameters (writes B's buffer, not A's); likewise for a per-node update made while
/// the node is disabled.
fn updates_set_the_parameters_of_disabled_nodes_too(gpu: &Gpu) -> TestResult {
    // SAFETY: fill(int* p, int n, int v) writes p[0..n).
    let fill: Kernel<(*mut i32, i32, i32)> = unsafe { gpu.module.kernel("fill")? };
    let made = |v: i32| -> cuda_graph::Result<(GraphDefinition, KernelNode, DeviceBuffer<i32>)> {
        let buf = gpu.device.alloc_zeroed::<i32>(4)?;
        let def = GraphDefinition::new(&gpu.device)?;
        let k = def.add_kernel(&[], &fill, one(), (&buf, 4, v))?;
        Ok((def, k, buf))
    };
    let (a, ka, buf_a) = made(1)?;
    let (b, _, buf_b) = made(2)?;
    let exec = a.instantiate()?;
    exec.set_enabled(&ka, false)?;
    exec.update(&b)?;
    exec.set_enabled(&ka, true)?;
    let s = gpu.stream();
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(
        buf_a.to_vec()?,
        [0; 4],
        "the disabled node kept A's parameters"
    );
    assert_eq!(buf_b.to_vec()?, [2; 4]);
    let c = gpu.device.alloc_zeroed::<i32>(4)?;
    exec.set_enabled(&ka, false)?;
    exec.set_params(&ka, NodeParams::kernel(&fill, one(), (&c, 4, 3))?)?;
    exec.set_enabled(&ka, true)?;
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(
        c.to_vec()?,
        [3; 4],
        "a per-node update while disabled took effect"
    );
    Ok(())
}

/// Launches after a memset node of an exec was disabled and enabled again fail on driver 13.0
/// with CUDA_ERROR_LAUNCH_FAILED, which ends the context (seen with raw driver calls: launches on
/// one thread, toggles on another, each call under one lock). `set_enabled` refuses memset nodes, leaving the exec
/// as it was; kernel nodes still toggle, launch after launch.
fn a_memset_node_is_never_toggled(gpu: &Gpu) -> TestResult {
    // SAFETY: fill(int* p, int n, int v) writes p[0..n).
    let fill: Kernel<(*mut i32, i32, i32)> = unsafe { gpu.module.kernel("fill")? };
    let (buf, mbuf) = (
        gpu.device.alloc_zeroed::<i32>(4)?,
        gpu.device.alloc_zeroed::<i32>(4)?,
    );
    let def = GraphDefinition::new(&gpu.device)?;
    let k = def.add_kernel(&[], &fill, one(), (&buf, 4, 1))?;
    let m = def.add_memset(&[&k], &mbuf, 5i32)?;
    let exec = def.instantiate()?;
    for enabled in [false, true] {
        match exec.set_enabled(&m, enabled) {
            Err(e) if e.refusal() == Some(Refusal::Unsupported) => {}
            r => return Err(format!("expected an Unsupported refusal, got {r:?}").into()),
        }
    }
    assert!(exec.is_enabled(&m)?);
    let s = gpu.stream();
    for round in 0..256 {
        exec.set_enabled(&k, round % 2 == 0)?;
        exec.launch(&s)?;
        if round % 16 == 0 {
            s.synchronize()?;
        }
    }
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1; 4]);
    assert_eq!(mbuf.to_vec()?, [5; 4]);
    Ok(())
}
