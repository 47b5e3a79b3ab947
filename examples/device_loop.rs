//! A loop that runs on the GPU until its condition clears: 1D heat diffusion iterated by a
//! conditional WHILE node until the largest change per step falls below a tolerance, with no host
//! round trip — timed against the same loop driven from the host (launch one step, copy the
//! change back, decide on the CPU).
//!
//! ```text
//! cargo run --release --example device_loop
//! ```
//! Needs driver 12.3+ (conditional WHILE nodes).

use std::process::ExitCode;
use std::time::Instant;

use cuda_graph::prelude::*;

const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");
const N: usize = 4096;
const ALPHA: f32 = 0.25;
const TOL: f32 = 1e-3;
const MAX_ITER: i32 = 1_000_000;

fn initial() -> Vec<f32> {
    (0..N)
        .map(|i| {
            if i == 0 {
                100.0
            } else if (N / 3..2 * N / 3).contains(&i) {
                80.0
            } else {
                0.0
            }
        })
        .collect()
}

fn run() -> cuda_graph::Result<()> {
    let device = Device::new(0)?;
    // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
    let module = unsafe { device.load_module(KERNELS)? };
    // SAFETY: the kernels' parameter lists (tests/kernels/kernels.cu). The slice kernels touch
    // no element past the lengths they are given; `max_abs_diff_slice` writes result[0] and
    // `converged_check` diff_bits[0] and iterations[0] only (no buffer is empty).
    let (step, maxdiff, check, copy) = unsafe {
        (
            module.kernel::<(Slice<f32>, Slice<f32>, f32)>("heat_step_slice")?,
            module.kernel::<(Slice<f32>, Slice<f32>, *mut u32)>("max_abs_diff_slice")?,
            module
                .kernel::<(ConditionalHandle, *mut u32, f32, *mut i32, i32)>("converged_check")?,
            module.kernel::<(Slice<f32>, Slice<f32>)>("copy_slice_f32")?,
        )
    };
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let stream = device.create_stream()?;

    // On the device: one graph launch runs the whole loop.
    let (u, v) = (device.htod(&initial())?, device.htod(&initial())?);
    let diff = device.alloc_zeroed::<u32>(1)?;
    let iters = device.alloc_zeroed::<i32>(1)?;
    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let h = parent.create_conditional_handle(Some(1))?;
    {
        let body = parent.add_while(&h)?.begin_building(Global)?;
        body.launch(&step, cfg, (&u, &v, ALPHA))?;
        body.launch(&maxdiff, cfg, (&u, &v, &diff))?;
        body.launch(&copy, cfg, (&v, &u))?;
        body.launch(
            &check,
            LaunchConfig::single(),
            (h, &diff, TOL, &iters, MAX_ITER),
        )?;
        body.end_building()?;
    }
    let graph = parent
        .end_building()?
        .instantiate_with(&InstantiateOptions::new().upload_on(&stream))?;
    stream.synchronize()?;
    let t = Instant::now();
    graph.launch(&stream)?;
    stream.synchronize()?;
    let device_time = t.elapsed();
    let device_iters = iters.to_vec()?[0];
    let device_field = u.to_vec()?;

    // From the host: the same step, but the decision needs the change copied back each time.
    let (u2, v2) = (device.htod(&initial())?, device.htod(&initial())?);
    let diff2 = device.alloc_zeroed::<u32>(1)?;
    let t = Instant::now();
    let mut host_iters = 0;
    loop {
        stream.launch(&step, cfg, (&u2, &v2, ALPHA))?;
        stream.launch(&maxdiff, cfg, (&u2, &v2, &diff2))?;
        stream.launch(&copy, cfg, (&v2, &u2))?;
        stream.synchronize()?;
        let d = f32::from_bits(diff2.to_vec()?[0]);
        stream.memset_d32(&diff2, 0)?;
        host_iters += 1;
        if !(d > TOL && host_iters < MAX_ITER) {
            break;
        }
    }
    let host_time = t.elapsed();
    let worst = device_field
        .iter()
        .zip(u2.to_vec()?)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!(
        "device-side WHILE loop: {device_iters} iterations in {device_time:.2?} (one graph launch)"
    );
    println!("host-driven loop:       {host_iters} iterations in {host_time:.2?}");
    println!(
        "speed-up {:.1}x; fields differ by at most {worst}",
        host_time.as_secs_f64() / device_time.as_secs_f64()
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("device_loop: {e}");
            ExitCode::FAILURE
        }
    }
}
