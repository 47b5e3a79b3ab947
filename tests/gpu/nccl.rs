//! NCCL collectives (feature `nccl`): a one-rank communicator's collectives on a stream and
//! replayed from graphs, the communicator and buffers held by a graph after the user dropped
//! them, the refusals; and, where two GPUs are present, collectives across them.

use cuda_graph::nccl::{self, Communicator, ReduceOp};
use cuda_graph::prelude::*;
use cuda_graph::Refusal;

use crate::args;
use crate::support::{eventually, one, stays, Gpu, Needs, TestResult};

crate::gpu_tests! {
    "nccl";
    Needs::Nccl(1) =>
        one_rank_collectives_run_on_a_stream,
        one_rank_collectives_replay_from_a_graph,
        graph_keeps_communicator_and_buffers_alive,
        refusals_leave_the_capture_usable,
        groups_run_on_plain_streams_only,
        a_communicator_takes_one_threads_calls_at_a_time;
    Needs::Nccl(2) =>
        two_devices_all_reduce_in_graphs,
        stream_of_another_device_is_refused;
}

fn refusal<T: std::fmt::Debug>(r: cuda_graph::Result<T>) -> Refusal {
    match r {
        Err(e) => e
            .refusal()
            .unwrap_or_else(|| panic!("expected a refusal, got {e}")),
        Ok(v) => panic!("expected a refusal, got Ok({v:?})"),
    }
}

fn one_rank_collectives_run_on_a_stream(gpu: &Gpu) -> TestResult {
    println!("    NCCL {}", nccl::version()?);
    let comm = Communicator::for_device(&gpu.device)?;
    assert_eq!((comm.rank(), comm.ranks()), (0, 1));
    assert_eq!(comm.device().ordinal(), gpu.device.ordinal());
    let s = gpu.stream();
    let x = gpu.device.htod(&[1.5f32, -2.0, 3.25, 4.0])?;
    let y = gpu.device.alloc_zeroed::<f32>(4)?;
    comm.all_reduce(&s, &x, &y, ReduceOp::Sum)?;
    s.synchronize()?;
    assert_eq!(y.to_vec()?, x.to_vec()?);
    // In place, and every element type of the suite's interest.
    let d = gpu.device.htod(&[7.0f64, 8.0])?;
    comm.all_reduce(&s, &d, &d, ReduceOp::Max)?;
    let b = gpu.device.htod(&[1u8, 2, 3])?;
    let b2 = gpu.device.alloc_zeroed::<u8>(3)?;
    comm.all_gather(&s, &b, &b2)?;
    let i = gpu.device.htod(&[5i32, 6])?;
    let i2 = gpu.device.alloc_zeroed::<i32>(2)?;
    comm.reduce_scatter(&s, &i, &i2, ReduceOp::Min)?;
    let i3 = gpu.device.alloc_zeroed::<i32>(2)?;
    comm.broadcast(&s, &i2, &i3, 0)?;
    s.synchronize()?;
    assert_eq!(d.to_vec()?, [7.0, 8.0]);
    assert_eq!(b2.to_vec()?, [1, 2, 3]);
    assert_eq!(i3.to_vec()?, [5, 6]);
    Ok(())
}

/// A graph of a kernel and the four collectives, replayed: each replay sees the kernel's new
/// value through every collective.
fn one_rank_collectives_replay_from_a_graph(gpu: &Gpu) -> TestResult {
    let comm = Communicator::for_device(&gpu.device)?;
    let add_one = gpu.f("add_one");
    let s = gpu.stream();
    let x = gpu.device.htod(&[1i32, 2, 3, 4])?;
    let y = gpu.device.alloc_zeroed::<i32>(4)?;
    let z = gpu.device.alloc_zeroed::<i32>(4)?;
    let w = gpu.device.alloc_zeroed::<i32>(4)?;
    let v = gpu.device.alloc_zeroed::<i32>(4)?;
    // Warm-up: NCCL connects on first use, with calls a Global capture forbids.
    comm.all_reduce(&s, &x, &y, ReduceOp::Sum)?;
    comm.all_gather(&s, &y, &z)?;
    comm.reduce_scatter(&s, &z, &w, ReduceOp::Max)?;
    comm.broadcast(&s, &w, &v, 0)?;
    s.synchronize()?;
    assert_eq!(v.to_vec()?, [1, 2, 3, 4]);

    let b = s.create_graph_builder().begin_building(Global)?;
    // SAFETY: add_one(int*) increments x[0].
    unsafe { b.launch_unchecked(&add_one, one(), &args![&x])? };
    comm.all_reduce(&b, &x, &y, ReduceOp::Sum)?;
    comm.all_gather(&b, &y, &z)?;
    comm.reduce_scatter(&b, &z, &w, ReduceOp::Max)?;
    comm.broadcast(&b, &w, &v, 0)?;
    let g = b.end_building()?.instantiate()?;
    for k in 1..=3 {
        g.launch(&s)?;
        s.synchronize()?;
        let want = [1 + k, 2, 3, 4];
        assert_eq!(x.to_vec()?, want, "replay {k}");
        for (name, buf) in [("all_reduce", &y), ("all_gather", &z)] {
            assert_eq!(buf.to_vec()?, want, "{name} after replay {k}");
        }
        assert_eq!(w.to_vec()?, want, "reduce_scatter after replay {k}");
        assert_eq!(v.to_vec()?, want, "broadcast after replay {k}");
    }
    // A second exec of the same graph, on another stream.
    let s2 = gpu.stream();
    g.launch(&s2)?;
    s2.synchronize()?;
    assert_eq!(v.to_vec()?, [5, 2, 3, 4]);
    Ok(())
}

/// The communicator and both buffers of a captured all-reduce, dropped by the user, stay alive
/// while the graph and its exec live: replays still give the right values, and the release
/// observers see them go only after the graph and exec are dropped.
fn graph_keeps_communicator_and_buffers_alive(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let s = gpu.stream();
    let out = gpu.device.alloc_zeroed::<i32>(3)?;
    let (g, watches) = {
        let comm = Communicator::for_device(&gpu.device)?;
        let x = gpu.device.htod(&[5i32, 6, 7])?;
        let y = gpu.device.alloc_zeroed::<i32>(3)?;
        comm.all_reduce(&s, &x, &y, ReduceOp::Sum)?; // warm-up
        s.synchronize()?;
        let b = s.create_graph_builder().begin_building(Global)?;
        // SAFETY: add_one(int*) increments x[0].
        unsafe { b.launch_unchecked(&add_one, one(), &args![&x])? };
        comm.all_reduce(&b, &x, &y, ReduceOp::Sum)?;
        b.memcpy_dtod(&out, &y)?;
        let ended = b.end_building()?;
        let g = ended.instantiate()?;
        let watches = [
            comm.release_observer(),
            x.release_observer(),
            y.release_observer(),
        ];
        (g, watches)
        // comm, x, y, the ended builder: dropped here.
    };
    assert!(
        stays(|| watches.iter().all(|w| !w.is_released())),
        "the exec holds the communicator and both buffers"
    );
    for k in 1..=2 {
        g.launch(&s)?;
        s.synchronize()?;
        assert_eq!(out.to_vec()?, [5 + k, 6, 7], "replay {k}");
    }
    drop(g);
    assert!(
        eventually(|| watches.iter().all(|w| w.is_released())),
        "released once the exec is gone"
    );
    Ok(())
}

/// Every refusal comes before any NCCL call: the capture goes on, ends, and replays.
fn refusals_leave_the_capture_usable(gpu: &Gpu) -> TestResult {
    let comm = Communicator::for_device(&gpu.device)?;
    let s = gpu.stream();
    let x = gpu.device.htod(&[1.0f32, 2.0, 3.0, 4.0])?;
    let y = gpu.device.alloc_zeroed::<f32>(4)?;
    let short = gpu.device.alloc_zeroed::<f32>(3)?;
    comm.all_reduce(&s, &x, &y, ReduceOp::Sum)?; // warm-up
    s.synchronize()?;
    // A stream-ordered buffer of another stream, on a plain stream.
    let other = gpu.stream();
    let ordered = other.alloc_async::<f32>(4)?;
    assert_eq!(
        refusal(comm.all_reduce(&s, &ordered, &y, ReduceOp::Sum)),
        Refusal::Order
    );
    other.synchronize()?;

    let b = s.create_graph_builder().begin_building(Global)?;
    assert_eq!(
        refusal(comm.all_reduce(&b, &x, &short, ReduceOp::Sum)),
        Refusal::Size
    );
    // One rank: all-gather and reduce-scatter need equal lengths.
    assert_eq!(refusal(comm.all_gather(&b, &x, &short)), Refusal::Size);
    assert_eq!(
        refusal(comm.reduce_scatter(&b, &short, &x, ReduceOp::Sum)),
        Refusal::Size
    );
    assert_eq!(refusal(comm.broadcast(&b, &x, &y, 1)), Refusal::Size);
    // A collective inside a group on a capturing builder.
    assert_eq!(
        refusal(nccl::group(|| comm.all_reduce(&b, &x, &y, ReduceOp::Sum))),
        Refusal::Capture
    );
    b.capture_status()?;
    comm.all_reduce(&b, &x, &y, ReduceOp::Sum)?;
    let g = b.end_building()?.instantiate()?;
    y.copy_from(&[0.0; 4])?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(y.to_vec()?, [1.0, 2.0, 3.0, 4.0]);
    Ok(())
}

/// A group on plain streams launches its collectives at its end; nested groups launch at the
/// outermost end; a buffer dropped inside the group is held until the work has run.
fn groups_run_on_plain_streams_only(gpu: &Gpu) -> TestResult {
    let comm = Communicator::for_device(&gpu.device)?;
    let s = gpu.stream();
    let x = gpu.device.htod(&[3i32, 1, 4, 1, 5])?;
    let y = gpu.device.alloc_zeroed::<i32>(5)?;
    let watch = nccl::group(|| {
        let tmp = gpu.device.htod(&[9i32, 2, 6, 5, 3])?;
        nccl::group(|| comm.all_reduce(&s, &x, &y, ReduceOp::Sum))?;
        comm.all_reduce(&s, &tmp, &tmp, ReduceOp::Sum)?;
        Ok(tmp.release_observer())
        // `tmp` is dropped before the group ends, so before NCCL launches its all-reduce.
    })?;
    s.synchronize()?;
    assert_eq!(y.to_vec()?, [3, 1, 4, 1, 5]);
    assert!(eventually(|| watch.is_released()));
    // A failing closure still ends the group; its error is returned.
    let e = nccl::group(|| comm.broadcast(&s, &x, &y, 7)).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Size));
    comm.all_reduce(&s, &x, &y, ReduceOp::Sum)?; // outside any group again
    s.synchronize()?;
    Ok(())
}

/// NCCL's calls on one communicator are not thread-safe: while a group on one thread holds the
/// communicator, a call from another thread is refused (not let in), and goes through once the
/// group has ended.
fn a_communicator_takes_one_threads_calls_at_a_time(gpu: &Gpu) -> TestResult {
    let comm = Communicator::for_device(&gpu.device)?;
    let (sa, sb) = (gpu.stream(), gpu.stream());
    let x = gpu.device.htod(&[2i32, 3])?;
    let (ya, yb) = (
        gpu.device.alloc_zeroed::<i32>(2)?,
        gpu.device.alloc_zeroed::<i32>(2)?,
    );
    let inside = std::sync::Barrier::new(2);
    let tried = std::sync::Barrier::new(2);
    std::thread::scope(|scope| -> TestResult {
        let holder = scope.spawn(|| -> cuda_graph::Result<()> {
            nccl::group(|| {
                comm.all_reduce(&sa, &x, &ya, ReduceOp::Sum)?;
                inside.wait();
                tried.wait();
                Ok(())
            })
        });
        inside.wait();
        let refused = comm.all_reduce(&sb, &x, &yb, ReduceOp::Sum);
        tried.wait();
        holder.join().expect("the group's thread")?;
        let e = refused.expect_err("a call while another thread's group holds the communicator");
        assert_eq!(e.refusal(), Some(Refusal::Busy), "{e}");
        Ok(())
    })?;
    // Free again: the same call goes through.
    comm.all_reduce(&sb, &x, &yb, ReduceOp::Sum)?;
    sa.synchronize()?;
    sb.synchronize()?;
    assert_eq!(ya.to_vec()?, [2, 3]);
    assert_eq!(yb.to_vec()?, [2, 3]);
    Ok(())
}

/// Two ranks on two devices of this process: each device's graph holds its part of the
/// all-reduce, captured on a thread of its own, and the graphs' replays sum across devices.
fn two_devices_all_reduce_in_graphs(gpu: &Gpu) -> TestResult {
    let devices = [gpu.device.clone(), Device::new(1)?];
    let comms = Communicator::for_devices(&devices)?;
    let streams = devices
        .iter()
        .map(Device::create_stream)
        .collect::<Result<Vec<_>>>()?;
    let xs = [
        devices[0].htod(&[1.0f32, 2.0, 3.0])?,
        devices[1].htod(&[10.0f32, 20.0, 30.0])?,
    ];
    let ys = [
        devices[0].alloc_zeroed::<f32>(3)?,
        devices[1].alloc_zeroed::<f32>(3)?,
    ];
    // Warm-up from one thread: a group.
    nccl::group(|| {
        for ((comm, s), (x, y)) in comms.iter().zip(&streams).zip(xs.iter().zip(&ys)) {
            comm.all_reduce(s, x, y, ReduceOp::Sum)?;
        }
        Ok(())
    })?;
    for s in &streams {
        s.synchronize()?;
    }
    for y in &ys {
        assert_eq!(y.to_vec()?, [11.0, 22.0, 33.0]);
    }
    // Capture each rank on its own thread (no group inside captures).
    let graphs = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter()
            .zip(&streams)
            .zip(xs.iter().zip(&ys))
            .map(|((comm, s), (x, y))| {
                scope.spawn(move || -> Result<Graph> {
                    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
                    comm.all_reduce(&b, x, y, ReduceOp::Sum)?;
                    b.end_building()?.instantiate()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("capture thread"))
            .collect::<Result<Vec<_>>>()
    })?;
    for y in &ys {
        y.copy_from(&[0.0; 3])?;
    }
    for _ in 0..3 {
        for (g, s) in graphs.iter().zip(&streams) {
            g.launch(s)?;
        }
    }
    for s in &streams {
        s.synchronize()?;
    }
    for y in &ys {
        assert_eq!(y.to_vec()?, [11.0, 22.0, 33.0]);
    }
    Ok(())
}

/// A communicator of device 0 with a stream (or builder) of device 1: refused before NCCL is
/// asked.
fn stream_of_another_device_is_refused(gpu: &Gpu) -> TestResult {
    let comm = Communicator::for_device(&gpu.device)?;
    let d1 = Device::new(1)?;
    let s1 = d1.create_stream()?;
    let x0 = gpu.device.alloc_zeroed::<f32>(4)?;
    let x1 = d1.alloc_zeroed::<f32>(4)?;
    assert_eq!(
        refusal(comm.all_reduce(&s1, &x1, &x1, ReduceOp::Sum)),
        Refusal::OtherDevice
    );
    let b = s1.create_graph_builder().begin_building(Global)?;
    assert_eq!(refusal(comm.all_gather(&b, &x1, &x1)), Refusal::OtherDevice);
    b.end_building()?;
    // A buffer of another device than the stream's.
    let s0 = gpu.stream();
    assert_eq!(
        refusal(comm.broadcast(&s0, &x0, &x1, 0)),
        Refusal::OtherDevice
    );
    Ok(())
}
