//! A decode loop as inference engines run it: each step captures the step's work again (its
//! kernel arguments change every step, its topology now and then), and a [`GraphCache`] updates
//! the exec in place when the topology is unchanged and instantiates a new one when it changed.
//! Prints how many steps updated and how many instantiated, and the time per step against
//! instantiating every step.
//!
//! ```text
//! cargo run --release --example decode_loop [-- STEPS]
//! ```
//!
//! Each step launches one kernel per "layer" on the step's position of a buffer: the position
//! (a kernel argument) moves every step, and the number of layers switches between two values
//! every [`BUCKET`] steps (a new batch-size bucket), which changes the topology.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_graph::prelude::*;
use cuda_graph::Refusal;

const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");
/// Positions in the buffer (the "KV cache").
const POSITIONS: usize = 4096;
/// Steps between topology changes.
const BUCKET: usize = 64;

/// The layers step `step` runs: 16 or 20, switching every `BUCKET` steps.
fn layers(step: usize) -> usize {
    if (step / BUCKET).is_multiple_of(2) {
        16
    } else {
        20
    }
}

/// The step's position (a kernel argument that changes every step).
fn position(step: usize) -> usize {
    (step * 7) % POSITIONS
}

/// `add_one(int* p)`: p[0] += 1.
type AddOne = Kernel<(*mut i32,)>;

/// Captures step `step`: `layers(step)` launches of `add_one` on element `position(step)` of
/// `buf` (a one-element view: the argument that changes every step).
fn capture_step(
    device: &Device,
    add_one: &AddOne,
    buf: &DeviceBuffer<i32>,
    step: usize,
) -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
    let b = device.create_graph_builder()?.begin_building(Global)?;
    let p = position(step);
    let element = buf.slice(p..p + 1)?;
    for _ in 0..layers(step) {
        b.launch(add_one, LaunchConfig::single(), &element)?;
    }
    b.end_building()
}

/// What the buffer holds after `steps` steps.
fn expected(steps: usize) -> Vec<i32> {
    let mut v = vec![0i32; POSITIONS];
    for s in 0..steps {
        v[position(s)] += layers(s) as i32;
    }
    v
}

struct Run {
    elapsed: Duration,
    updates: u64,
    instantiations: u64,
}

/// `steps` steps through a cache (`cached`) or instantiating every step.
fn run_steps(
    device: &Device,
    add_one: &AddOne,
    steps: usize,
    cached: bool,
) -> cuda_graph::Result<Run> {
    let buf = device.alloc_zeroed::<i32>(POSITIONS)?;
    let stream = device.create_stream()?;
    let mut cache = GraphCache::new(InstantiateOptions::default());
    let start = Instant::now();
    let mut instantiations = 0;
    for step in 0..steps {
        let ended = capture_step(device, add_one, &buf, step)?;
        if cached {
            cache.refresh(&ended)?;
            cache.launch(&stream)?;
        } else {
            let graph = ended.instantiate()?;
            graph.launch(&stream)?;
            instantiations += 1;
        }
    }
    stream.synchronize()?;
    let elapsed = start.elapsed();
    if buf.to_vec()? != expected(steps) {
        return Err(Error::invalid(
            Refusal::Other,
            format!(
                "the {} loop computed the wrong result",
                if cached { "cached" } else { "instantiating" }
            ),
        ));
    }
    Ok(if cached {
        Run {
            elapsed,
            updates: cache.updates(),
            instantiations: cache.instantiations(),
        }
    } else {
        Run {
            elapsed,
            updates: 0,
            instantiations,
        }
    })
}

fn run() -> cuda_graph::Result<()> {
    let steps: usize = match std::env::args().nth(1) {
        Some(s) => s.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
            Error::invalid(
                Refusal::Size,
                format!("STEPS must be a positive integer, not {s:?}"),
            )
        })?,
        None => 2000,
    };
    let device = Device::new(0)?;
    // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
    let module = unsafe { device.load_module(KERNELS)? };
    // SAFETY: add_one's parameter list; it touches p[0] only, and no buffer is empty.
    let add_one: AddOne = unsafe { module.kernel("add_one")? };
    // Warm up both paths, then time each twice, interleaved, keeping the faster run of each.
    run_steps(&device, &add_one, 2 * BUCKET, true)?;
    run_steps(&device, &add_one, 2 * BUCKET, false)?;
    let mut cached: Option<Run> = None;
    let mut fresh: Option<Run> = None;
    for _ in 0..2 {
        let c = run_steps(&device, &add_one, steps, true)?;
        if cached.as_ref().is_none_or(|b| c.elapsed < b.elapsed) {
            cached = Some(c);
        }
        let f = run_steps(&device, &add_one, steps, false)?;
        if fresh.as_ref().is_none_or(|b| f.elapsed < b.elapsed) {
            fresh = Some(f);
        }
    }
    let (c, f) = (cached.expect("timed"), fresh.expect("timed"));
    let per_step = |r: &Run| r.elapsed.as_secs_f64() * 1e6 / steps as f64;
    println!(
        "decode_loop: {steps} steps of 16 or 20 kernels (topology changes every {BUCKET} steps), results checked"
    );
    println!(
        "  cache:              {} steps updated in place, {} re-instantiated; {:.1} µs/step",
        c.updates,
        c.instantiations,
        per_step(&c)
    );
    println!(
        "  instantiate always: {} instantiations; {:.1} µs/step",
        f.instantiations,
        per_step(&f)
    );
    println!(
        "  cache/instantiate-always time per step: {:.2}",
        per_step(&c) / per_step(&f)
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("decode_loop: {e}");
            ExitCode::FAILURE
        }
    }
}
