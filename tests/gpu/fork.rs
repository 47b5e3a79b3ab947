//! Forks and joins, child graphs, host callbacks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use cuda_graph::prelude::*;

use cuda_graph::HostCallback;

use crate::args;
use crate::support::{eventually, one, Gpu, Needs, TestResult};

crate::gpu_tests! {
    "fork";
    Needs::Gpu =>
        fork_join_two_branches,
        fork_join_three_branches,
        fork_of_a_fork,
        fork_dropped_without_join_gives_a_valid_graph,
        builder_owned_streams_live_as_long_as_needed,
        child_graph_embedded_between_two_kernels,
        embedded_child_outlives_its_builder,
        callback_runs_once_per_launch_and_outlives_other_references,
        callback_state_released_after_last_graph_and_exec,
        callback_panic_is_caught,
        callback_may_observe_itself,
        failed_join_leaves_nothing_dangling;
}

fn run(gpu: &Gpu, g: &Graph) -> TestResult {
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    Ok(())
}

fn fork_join_two_branches(gpu: &Gpu) -> TestResult {
    let (affine, add_one) = (gpu.f("affine"), gpu.f("add_one"));
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*), affine(int*, int, int).
    unsafe { p.launch_unchecked(&add_one, one(), &args![&a])? }; // a = 1 before the fork
    let [l, r] = p.split::<2>()?;
    unsafe {
        l.launch_unchecked(&affine, one(), &args![&a, 10i32, 0i32])?; // a = 10, after the parent's add
        r.launch_unchecked(&affine, one(), &args![&b, 1i32, 7i32])?; // b = 7
    }
    p.join([l, r])?;
    unsafe { p.launch_unchecked(&add_one, one(), &args![&a])? }; // after the join: a = 11
    let g = p.end_building()?.instantiate()?;
    run(gpu, &g)?;
    assert_eq!((a.to_vec()?[0], b.to_vec()?[0]), (11, 7));
    Ok(())
}

fn fork_join_three_branches(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let bufs: Vec<_> = (0..3)
        .map(|_| gpu.device.alloc_zeroed::<i32>(1))
        .collect::<Result<_, _>>()?;
    let p = gpu
        .device
        .create_graph_builder()?
        .begin_building(ThreadLocal)?;
    let forks = p.split::<3>()?;
    for (i, f) in forks.iter().enumerate() {
        // SAFETY: affine(int*, int, int).
        unsafe {
            f.launch_unchecked(&affine, one(), &args![&bufs[i], 1i32, (i as i32 + 1) * 100])?
        };
    }
    p.join(forks)?;
    let g = p.end_building()?.instantiate()?;
    run(gpu, &g)?;
    let got: Vec<i32> = bufs
        .iter()
        .map(|b| b.to_vec().map(|v| v[0]))
        .collect::<Result<_, _>>()?;
    assert_eq!(got, [100, 200, 300]);
    Ok(())
}

fn fork_of_a_fork(gpu: &Gpu) -> TestResult {
    let add_one_at = gpu.f("add_one_at");
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let [a, b] = p.split::<2>()?;
    {
        let [a1, a2] = a.split::<2>()?;
        // SAFETY: add_one_at(int*, int) with i < 4.
        unsafe {
            a1.launch_unchecked(&add_one_at, one(), &args![&buf, 0i32])?;
            a2.launch_unchecked(&add_one_at, one(), &args![&buf, 1i32])?;
        }
        a.join([a1, a2])?;
    }
    unsafe {
        a.launch_unchecked(&add_one_at, one(), &args![&buf, 2i32])?;
        b.launch_unchecked(&add_one_at, one(), &args![&buf, 3i32])?;
    }
    p.join([a, b])?;
    let g = p.end_building()?.instantiate()?;
    run(gpu, &g)?;
    run(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [2, 2, 2, 2]);
    Ok(())
}

fn fork_dropped_without_join_gives_a_valid_graph(gpu: &Gpu) -> TestResult {
    let add_one_at = gpu.f("add_one_at");
    let buf = gpu.device.alloc_zeroed::<i32>(2)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    {
        let [x, y] = p.split::<2>()?;
        // SAFETY: add_one_at(int*, int) with i < 2.
        unsafe {
            x.launch_unchecked(&add_one_at, one(), &args![&buf, 0i32])?;
            y.launch_unchecked(&add_one_at, one(), &args![&buf, 1i32])?;
        }
        // no join: dropping x and y joins them
    }
    let g = p.end_building()?.instantiate()?;
    run(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [1, 1]);
    Ok(())
}

fn builder_owned_streams_live_as_long_as_needed(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let graph = {
        let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
        {
            let forks = p.split::<4>()?;
            // Only one fork writes: the forks run concurrently and add_one is not atomic.
            // SAFETY: add_one(int*).
            unsafe { forks[0].launch_unchecked(&add_one, one(), &args![&buf])? };
            drop(forks); // the fork streams must stay alive until the capture ends
        }
        unsafe { p.launch_unchecked(&add_one, one(), &args![&buf])? };
        p.end_building()?.instantiate()?
        // the builder and its own stream drop here
    };
    run(gpu, &graph)?;
    assert_eq!(buf.to_vec()?, [2]);
    Ok(())
}

fn child_graph_embedded_between_two_kernels(gpu: &Gpu) -> TestResult {
    let add_one_at = gpu.f("add_one_at");
    let a = gpu.device.alloc_zeroed::<i32>(2)?;
    let child = gpu.device.create_graph_builder()?.begin_building(Global)?;
    for _ in 0..3 {
        // SAFETY: add_one_at(int*, int) with i < 2.
        unsafe { child.launch_unchecked(&add_one_at, one(), &args![&a, 1i32])? };
    }
    let child = child.end_building()?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    unsafe { p.launch_unchecked(&add_one_at, one(), &args![&a, 0i32])? };
    p.add_child_graph(&child)?;
    unsafe { p.launch_unchecked(&add_one_at, one(), &args![&a, 0i32])? };
    let g = p.end_building()?.instantiate()?;
    run(gpu, &g)?;
    assert_eq!(a.to_vec()?, [2, 3]);
    Ok(())
}

fn embedded_child_outlives_its_builder(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let inner = gpu.device.alloc_zeroed::<i32>(1)?;
    let child = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe {
        child.launch_unchecked(&add_one, one(), &args![&inner])?;
        child.launch_unchecked(&add_one, one(), &args![&a])?;
    }
    let child = child.end_building()?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    p.add_child_graph(&child)?;
    let ended = p.end_building()?;
    // The child builder and the `inner` handle go; the parent's graph keeps what they held.
    drop(child);
    drop(inner);
    let g = ended.instantiate()?;
    drop(ended);
    run(gpu, &g)?;
    assert_eq!(a.to_vec()?, [1]);
    Ok(())
}

fn callback_runs_once_per_launch_and_outlives_other_references(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let counter = Arc::new(AtomicUsize::new(0));
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { p.launch_unchecked(&add_one, one(), &args![&buf])? };
    let c = counter.clone();
    let cb = p.add_host_callback(move || {
        c.fetch_add(1, Ordering::SeqCst);
    })?;
    let graph = p.end_building()?.instantiate()?;
    let weak: Weak<AtomicUsize> = Arc::downgrade(&counter);
    drop(counter); // only the closure holds the counter now
    let s = gpu.stream();
    for _ in 0..4 {
        graph.launch(&s)?;
    }
    s.synchronize()?;
    let counter = weak
        .upgrade()
        .ok_or("the closure's state was released while the exec holds it")?;
    assert_eq!(counter.load(Ordering::SeqCst), 4, "once per launch");
    assert_eq!(cb.calls(), Some(4));
    assert!(cb.panic_message().is_none());
    Ok(())
}

fn callback_state_released_after_last_graph_and_exec(gpu: &Gpu) -> TestResult {
    let state = Arc::new(AtomicUsize::new(0));
    let weak = Arc::downgrade(&state);
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let cb = p.add_host_callback(move || {
        state.fetch_add(1, Ordering::SeqCst);
    })?;
    let ended = p.end_building()?;
    let g1 = ended.instantiate()?;
    let g2 = ended.instantiate()?;
    drop(ended);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(weak.upgrade().is_some(), "released while two execs hold it");
    drop(g1);
    let s = gpu.stream();
    g2.launch(&s)?;
    s.synchronize()?;
    assert_eq!(weak.upgrade().map(|s| s.load(Ordering::SeqCst)), Some(1));
    drop(g2);
    assert!(
        eventually(|| weak.upgrade().is_none()),
        "released after the last exec"
    );
    assert!(cb.is_released());
    assert_eq!(cb.calls(), None);
    Ok(())
}

fn callback_panic_is_caught(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let cb = p.add_host_callback(|| panic!("boom in a host callback"))?;
    // SAFETY: add_one(int*).
    unsafe { p.launch_unchecked(&add_one, one(), &args![&buf])? };
    let g = p.end_building()?.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    g.launch(&s)?;
    s.synchronize()?;
    // The GPU work after the callback ran both times; the closure ran once and is disabled.
    assert_eq!(buf.to_vec()?, [2]);
    assert_eq!(cb.calls(), Some(0));
    assert_eq!(
        cb.panic_message().as_deref(),
        Some("boom in a host callback")
    );
    assert!(matches!(cb.check(), Err(Error::CallbackPanicked(_))));
    Ok(())
}

/// A closure that calls its own observer's methods (it deadlocked the driver's callback thread
/// when the observer's lock was held while the closure ran). A hang fails after a timeout.
fn callback_may_observe_itself(gpu: &Gpu) -> TestResult {
    let me = Arc::new(OnceLock::<HostCallback>::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (inner, log) = (me.clone(), seen.clone());
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let cb = p.add_host_callback(move || {
        if let Some(me) = inner.get() {
            let entry = (me.check().is_ok(), me.panic_message(), me.calls());
            log.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
        }
    })?;
    let _ = me.set(cb.clone());
    let g = p.end_building()?.instantiate()?;
    let s = gpu.stream();
    for _ in 0..3 {
        g.launch(&s)?;
    }
    let (tx, rx) = mpsc::channel();
    let waiter = s.clone();
    std::thread::spawn(move || {
        let _ = tx.send(waiter.synchronize());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(r) => r?,
        Err(_) => return Err("the callback deadlocked observing itself".into()),
    }
    assert_eq!(
        *seen.lock().unwrap_or_else(|e| e.into_inner()),
        [
            (true, None, Some(0)),
            (true, None, Some(1)),
            (true, None, Some(2))
        ]
    );
    assert_eq!(cb.calls(), Some(3));
    cb.check()?;
    Ok(())
}

/// A join into an invalidated capture fails part-way: the error comes back, the other forks still
/// join as they drop, the parent's end reports the invalidation, and every stream works after.
fn failed_join_leaves_nothing_dangling(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    let p = s.create_graph_builder().begin_building(Global)?;
    let forks = p.split::<3>()?;
    let fork_streams: Vec<Stream> = forks.iter().map(|f| f.stream().clone()).collect();
    // SAFETY: add_one(int*).
    unsafe { forks[0].launch_unchecked(&add_one, one(), &args![&buf])? };
    // Synchronising a capturing stream invalidates the whole capture.
    assert!(p.stream().synchronize().is_err());
    let joined = p.join(forks);
    assert!(joined.is_err(), "joining into an invalidated capture fails");
    match p.end_building() {
        Err(Error::CaptureInvalidated(_)) => {}
        other => return Err(format!("expected CaptureInvalidated, got {other:?}").into()),
    }
    for st in fork_streams.iter().chain([&s]) {
        assert!(!st.is_capturing()?, "no stream is left capturing");
        // SAFETY: add_one(int*).
        unsafe { st.launch_unchecked(&add_one, one(), &args![&buf])? };
        st.synchronize()?;
    }
    assert_eq!(
        buf.to_vec()?,
        [4],
        "the discarded capture never ran; the four streams did"
    );
    Ok(())
}
