//! Conditional nodes: if, if/else, switch, while, nested, in forks, device-side loops.

use cuda_graph::prelude::*;

use cuda_graph::DriverVersion;
use cuda_graph::Refusal;

use crate::args;
use crate::support::{one, Gpu, Needs, TestResult};

const V12_3: Needs = Needs::Conditional(DriverVersion::V12_3);
const V12_8: Needs = Needs::Conditional(DriverVersion::V12_8);

crate::gpu_tests! {
    "conditional";
    V12_3 =>
        if_true_and_false,
        if_with_default_value;
    V12_8 =>
        if_else_both_ways,
        switch_0_1_2_and_out_of_range;
    V12_3 =>
        while_countdown_runs_k_times,
        while_with_false_default_runs_zero_times,
        conditional_on_a_forked_builder,
        if_nested_in_an_if,
        body_forks_and_joins_inside,
        empty_body_is_valid,
        later_parent_work_runs_after_the_conditional,
        heat_diffusion_loop_converges_on_device,
        foreign_handle_is_an_error,
        unused_handle_is_refused_at_instantiation;
    V12_8 => switch_with_zero_branches_is_an_error;
    V12_3 => callback_in_a_body_is_refused_or_runs;
}

fn launch(gpu: &Gpu, g: &Graph) -> TestResult {
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    Ok(())
}

/// IF on a value set by a kernel in the same graph; the body adds one.
fn if_graph(gpu: &Gpu, buf: &DeviceBuffer<i32>, value: u32) -> cuda_graph::Result<Graph> {
    let (set, add_one) = (gpu.f("set_condition"), gpu.f("add_one"));
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(None)?;
    // SAFETY: set_condition(handle, unsigned), add_one(int*).
    unsafe { p.launch_unchecked(&set, one(), &args![h, value])? };
    {
        let body = p.add_if(&h)?.begin_building(Global)?;
        unsafe { body.launch_unchecked(&add_one, one(), &args![buf])? };
        body.end_building()?;
    }
    p.end_building()?.instantiate()
}

fn if_true_and_false(gpu: &Gpu) -> TestResult {
    for (value, expect) in [(1, 1), (0, 0), (5, 1)] {
        let buf = gpu.device.alloc_zeroed::<i32>(1)?;
        launch(gpu, &if_graph(gpu, &buf, value)?)?;
        assert_eq!(buf.to_vec()?, [expect], "condition {value}");
    }
    Ok(())
}

fn if_with_default_value(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    for (default, expect) in [(1, 2), (0, 0)] {
        let buf = gpu.device.alloc_zeroed::<i32>(1)?;
        let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
        let h = p.create_conditional_handle(Some(default))?;
        {
            let body = p.add_if(&h)?.begin_building(Global)?;
            // SAFETY: add_one(int*).
            unsafe { body.launch_unchecked(&add_one, one(), &args![&buf])? };
            body.end_building()?;
        }
        let g = p.end_building()?.instantiate()?;
        launch(gpu, &g)?;
        launch(gpu, &g)?;
        assert_eq!(buf.to_vec()?, [expect], "default {default}, two launches");
    }
    Ok(())
}

fn if_else_both_ways(gpu: &Gpu) -> TestResult {
    let (set, add_one_at) = (gpu.f("set_condition"), gpu.f("add_one_at"));
    for (value, expect) in [(1u32, [1, 0]), (0, [0, 1])] {
        let buf = gpu.device.alloc_zeroed::<i32>(2)?;
        let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
        let h = p.create_conditional_handle(None)?;
        // SAFETY: set_condition(handle, unsigned), add_one_at(int*, int) with i < 2.
        unsafe { p.launch_unchecked(&set, one(), &args![h, value])? };
        {
            let (then_b, else_b) = p.add_if_else(&h)?;
            let t = then_b.begin_building(Global)?;
            unsafe { t.launch_unchecked(&add_one_at, one(), &args![&buf, 0i32])? };
            t.end_building()?;
            let e = else_b.begin_building(Global)?;
            unsafe { e.launch_unchecked(&add_one_at, one(), &args![&buf, 1i32])? };
            e.end_building()?;
        }
        launch(gpu, &p.end_building()?.instantiate()?)?;
        assert_eq!(buf.to_vec()?, expect, "condition {value}");
    }
    Ok(())
}

fn switch_0_1_2_and_out_of_range(gpu: &Gpu) -> TestResult {
    let (set, add_one_at) = (gpu.f("set_condition"), gpu.f("add_one_at"));
    for (value, expect) in [
        (0u32, [1, 0, 0]),
        (1, [0, 1, 0]),
        (2, [0, 0, 1]),
        (3, [0, 0, 0]),
        (1000, [0, 0, 0]),
    ] {
        let buf = gpu.device.alloc_zeroed::<i32>(3)?;
        let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
        let h = p.create_conditional_handle(None)?;
        // SAFETY: set_condition(handle, unsigned), add_one_at(int*, int) with i < 3.
        unsafe { p.launch_unchecked(&set, one(), &args![h, value])? };
        for (i, body) in p.add_switch(&h, 3)?.into_iter().enumerate() {
            let b = body.begin_building(Global)?;
            unsafe { b.launch_unchecked(&add_one_at, one(), &args![&buf, i as i32])? };
            b.end_building()?;
        }
        launch(gpu, &p.end_building()?.instantiate()?)?;
        assert_eq!(buf.to_vec()?, expect, "switch value {value}");
    }
    Ok(())
}

fn while_countdown_runs_k_times(gpu: &Gpu) -> TestResult {
    let countdown = gpu.f("countdown");
    for k in [1, 5, 37] {
        let counter = gpu.device.htod(&[k])?;
        let iterations = gpu.device.alloc_zeroed::<i32>(1)?;
        let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
        let h = p.create_conditional_handle(Some(1))?;
        {
            let body = p.add_while(&h)?.begin_building(Global)?;
            // SAFETY: countdown(handle, int*, int*).
            unsafe { body.launch_unchecked(&countdown, one(), &args![h, &counter, &iterations])? };
            body.end_building()?;
        }
        launch(gpu, &p.end_building()?.instantiate()?)?;
        assert_eq!(iterations.to_vec()?, [k], "k = {k}");
        assert_eq!(counter.to_vec()?, [0]);
    }
    Ok(())
}

fn while_with_false_default_runs_zero_times(gpu: &Gpu) -> TestResult {
    let countdown = gpu.f("countdown");
    let counter = gpu.device.htod(&[10])?;
    let iterations = gpu.device.alloc_zeroed::<i32>(1)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(0))?;
    {
        let body = p.add_while(&h)?.begin_building(Global)?;
        // SAFETY: countdown(handle, int*, int*).
        unsafe { body.launch_unchecked(&countdown, one(), &args![h, &counter, &iterations])? };
        body.end_building()?;
    }
    launch(gpu, &p.end_building()?.instantiate()?)?;
    assert_eq!((iterations.to_vec()?[0], counter.to_vec()?[0]), (0, 10));
    Ok(())
}

fn conditional_on_a_forked_builder(gpu: &Gpu) -> TestResult {
    let (set, add_one_at) = (gpu.f("set_condition"), gpu.f("add_one_at"));
    let buf = gpu.device.alloc_zeroed::<i32>(2)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h_yes = p.create_conditional_handle(None)?;
    let h_no = p.create_conditional_handle(None)?;
    let [a, b] = p.split::<2>()?;
    // SAFETY: set_condition(handle, unsigned), add_one_at(int*, int) with i < 2.
    unsafe {
        a.launch_unchecked(&set, one(), &args![h_yes, 1u32])?;
        b.launch_unchecked(&set, one(), &args![h_no, 0u32])?;
    }
    for (fork, h, i) in [(&a, h_yes, 0i32), (&b, h_no, 1i32)] {
        let body = fork.add_if(&h)?.begin_building(Global)?;
        unsafe { body.launch_unchecked(&add_one_at, one(), &args![&buf, i])? };
        body.end_building()?;
    }
    p.join([a, b])?;
    launch(gpu, &p.end_building()?.instantiate()?)?;
    assert_eq!(buf.to_vec()?, [1, 0]);
    Ok(())
}

fn if_nested_in_an_if(gpu: &Gpu) -> TestResult {
    let (set, add_one_at) = (gpu.f("set_condition"), gpu.f("add_one_at"));
    for (outer, inner, expect) in [(1u32, 1u32, [1, 1]), (1, 0, [1, 0]), (0, 1, [0, 0])] {
        let buf = gpu.device.alloc_zeroed::<i32>(2)?;
        let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
        let h = p.create_conditional_handle(None)?;
        // SAFETY: set_condition(handle, unsigned), add_one_at(int*, int) with i < 2.
        unsafe { p.launch_unchecked(&set, one(), &args![h, outer])? };
        {
            let body = p.add_if(&h)?.begin_building(Global)?;
            unsafe { body.launch_unchecked(&add_one_at, one(), &args![&buf, 0i32])? };
            let h2 = body.create_conditional_handle(None)?;
            unsafe { body.launch_unchecked(&set, one(), &args![h2, inner])? };
            {
                let nested = body.add_if(&h2)?.begin_building(Global)?;
                unsafe { nested.launch_unchecked(&add_one_at, one(), &args![&buf, 1i32])? };
                nested.end_building()?;
            }
            body.end_building()?;
        }
        launch(gpu, &p.end_building()?.instantiate()?)?;
        assert_eq!(buf.to_vec()?, expect, "outer {outer}, inner {inner}");
    }
    Ok(())
}

fn body_forks_and_joins_inside(gpu: &Gpu) -> TestResult {
    let add_one_at = gpu.f("add_one_at");
    let buf = gpu.device.alloc_zeroed::<i32>(3)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(1))?;
    {
        let body = p.add_if(&h)?.begin_building(Global)?;
        let [x, y] = body.split::<2>()?;
        // SAFETY: add_one_at(int*, int) with i < 3.
        unsafe {
            x.launch_unchecked(&add_one_at, one(), &args![&buf, 0i32])?;
            y.launch_unchecked(&add_one_at, one(), &args![&buf, 1i32])?;
        }
        body.join([x, y])?;
        unsafe { body.launch_unchecked(&add_one_at, one(), &args![&buf, 2i32])? };
        body.end_building()?;
    }
    launch(gpu, &p.end_building()?.instantiate()?)?;
    assert_eq!(buf.to_vec()?, [1, 1, 1]);
    Ok(())
}

fn empty_body_is_valid(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(1))?;
    drop(p.add_if(&h)?); // never started
    let h2 = p.create_conditional_handle(Some(1))?;
    p.add_if(&h2)?.begin_building(Global)?.end_building()?; // started, nothing recorded
                                                            // SAFETY: add_one(int*).
    unsafe { p.launch_unchecked(&add_one, one(), &args![&buf])? };
    launch(gpu, &p.end_building()?.instantiate()?)?;
    assert_eq!(buf.to_vec()?, [1]);
    Ok(())
}

fn later_parent_work_runs_after_the_conditional(gpu: &Gpu) -> TestResult {
    let (affine, countdown) = (gpu.f("affine"), gpu.f("countdown"));
    let counter = gpu.device.htod(&[4])?;
    let iterations = gpu.device.alloc_zeroed::<i32>(1)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(1))?;
    {
        let body = p.add_while(&h)?.begin_building(Global)?;
        // SAFETY: countdown(handle, int*, int*), affine(int*, int, int).
        unsafe { body.launch_unchecked(&countdown, one(), &args![h, &counter, &iterations])? };
        body.end_building()?;
    }
    // Doubles the iteration count: only right if it runs after the loop.
    unsafe { p.launch_unchecked(&affine, one(), &args![&iterations, 10i32, 1i32])? };
    launch(gpu, &p.end_building()?.instantiate()?)?;
    assert_eq!(iterations.to_vec()?, [41]);
    Ok(())
}

/// 1D heat diffusion iterated on the device until the largest change per step falls below a
/// tolerance, with no host round trip; checked against the same loop on the CPU.
fn heat_diffusion_loop_converges_on_device(gpu: &Gpu) -> TestResult {
    const N: usize = 256;
    const ALPHA: f32 = 0.25;
    const TOL: f32 = 1e-3;
    const MAX_ITER: i32 = 100_000;
    let mut init = vec![0f32; N];
    init[0] = 100.0;
    init[N - 1] = 50.0;
    for (i, v) in init.iter_mut().enumerate().take(N - 1).skip(1) {
        *v = if (N / 3..2 * N / 3).contains(&i) {
            80.0
        } else {
            0.0
        };
    }
    // CPU reference: the same step, the same stopping rule.
    let (mut a, mut b) = (init.clone(), init.clone());
    let mut cpu_iters = 0;
    loop {
        b[0] = a[0];
        b[N - 1] = a[N - 1];
        for i in 1..N - 1 {
            b[i] = a[i] + ALPHA * (a[i - 1] - 2.0 * a[i] + a[i + 1]);
        }
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        std::mem::swap(&mut a, &mut b);
        cpu_iters += 1;
        if !(diff > TOL && cpu_iters < MAX_ITER) {
            break;
        }
    }

    let (step, maxdiff, check, copy) = (
        gpu.f("heat_step"),
        gpu.f("max_abs_diff"),
        gpu.f("converged_check"),
        gpu.f("copy_f32"),
    );
    let u = gpu.device.htod(&init)?;
    let v = gpu.device.htod(&init)?;
    let diff_bits = gpu.device.alloc_zeroed::<u32>(1)?;
    let iters = gpu.device.alloc_zeroed::<i32>(1)?;
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let n = N as i32;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(1))?;
    {
        let body = p.add_while(&h)?.begin_building(Global)?;
        // SAFETY: heat_step(const float*, float*, int, float); max_abs_diff(const float*,
        // const float*, int, unsigned*); copy_f32(const float*, float*, int);
        // converged_check(handle, unsigned*, float, int*, int). All buffers hold N floats.
        unsafe {
            body.launch_unchecked(&step, cfg, &args![&u, &v, n, ALPHA])?;
            body.launch_unchecked(&maxdiff, cfg, &args![&u, &v, n, &diff_bits])?;
            body.launch_unchecked(&copy, cfg, &args![&v, &u, n])?;
            body.launch_unchecked(&check, one(), &args![h, &diff_bits, TOL, &iters, MAX_ITER])?;
        }
        body.end_building()?;
    }
    let g = p.end_building()?.instantiate()?;
    launch(gpu, &g)?;
    let gpu_iters = iters.to_vec()?[0];
    let result = u.to_vec()?;
    println!("heat diffusion: {gpu_iters} device iterations, {cpu_iters} on the CPU");
    assert_eq!(
        gpu_iters, cpu_iters,
        "the device loop stops where the CPU loop stops"
    );
    let worst = result
        .iter()
        .zip(&a)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "device and CPU fields differ by {worst}");
    assert!(gpu_iters > 10 && gpu_iters < MAX_ITER, "{gpu_iters}");
    Ok(())
}

fn foreign_handle_is_an_error(gpu: &Gpu) -> TestResult {
    let p1 = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let p2 = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h1 = p1.create_conditional_handle(Some(0))?;
    assert!(matches!(
        p2.add_if(&h1),
        Err(Error::ForeignConditionalHandle)
    ));
    // A handle drives one conditional node: a second (here in the body) is refused at once.
    let body = p1.add_if(&h1)?.begin_building(Global)?;
    match body.add_while(&h1) {
        Err(e) if e.refusal() == Some(Refusal::ForeignGraph) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    body.end_building()?;
    drop(p2);
    let _ = p1.end_building()?.instantiate()?;
    Ok(())
}

fn unused_handle_is_refused_at_instantiation(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let _unused = p.create_conditional_handle(Some(1))?;
    // SAFETY: add_one(int*).
    unsafe { p.launch_unchecked(&add_one, one(), &args![&buf])? };
    match p.end_building()?.instantiate() {
        Err(e @ Error::Instantiate { .. }) => {
            println!("{e}");
            assert!(
                matches!(
                    e,
                    Error::Instantiate {
                        reason: cuda_graph::InstantiateFailure::ConditionalHandleUnused,
                        ..
                    }
                ),
                "{e}"
            );
        }
        other => return Err(format!("expected an instantiation failure, got {other:?}").into()),
    }
    Ok(())
}

fn switch_with_zero_branches_is_an_error(gpu: &Gpu) -> TestResult {
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(0))?;
    assert!(matches!(
        p.add_switch(&h, 0),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    let _ = p.add_switch(&h, 1)?;
    Ok(())
}

/// Host nodes in conditional bodies: the driver decides. Whichever step refuses, it is an
/// `Error`; if the driver accepts them, the callback must run once per body execution.
fn callback_in_a_body_is_refused_or_runs(gpu: &Gpu) -> TestResult {
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(1))?;
    let body = p.add_if(&h)?.begin_building(Global)?;
    let cb = match body.add_host_callback(|| {}) {
        Ok(cb) => cb,
        Err(e) => {
            println!("callback in a body refused at capture: {e}");
            return Ok(());
        }
    };
    if let Err(e) = body.end_building() {
        println!("callback in a body refused at end: {e}");
        return Ok(());
    }
    let g = match p.end_building().and_then(|e| e.instantiate()) {
        Ok(g) => g,
        Err(e) => {
            println!("callback in a body refused at instantiation: {e}");
            return Ok(());
        }
    };
    launch(gpu, &g)?;
    launch(gpu, &g)?;
    println!(
        "callback in a body accepted by this driver; ran {:?} times",
        cb.calls()
    );
    assert_eq!(cb.calls(), Some(2));
    Ok(())
}
