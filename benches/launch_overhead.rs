//! Launch overhead: N kernels launched one by one on a stream (the baseline) against the same N
//! kernels captured once and replayed as one graph launch, measured in the same run. Prints the
//! ratio graph/stream per N at the end; below 1.0 means the graph is cheaper.
//!
//! `cargo bench --bench launch_overhead` (on a machine with a GPU; elsewhere it says it skipped).

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use cuda_graph::prelude::*;

const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");
const SIZES: [usize; 3] = [8, 32, 128];

struct Setup {
    stream: Stream,
    empty: Function,
    graphs: Vec<(usize, Graph)>,
}

fn setup() -> cuda_graph::Result<Setup> {
    let device = Device::new(0)?;
    // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
    let module = unsafe { device.load_module(KERNELS)? };
    let empty = module.function("empty_kernel")?;
    let stream = device.create_stream()?;
    let mut graphs = Vec::new();
    for n in SIZES {
        let b = device.create_graph_builder()?.begin_building(Global)?;
        for _ in 0..n {
            // SAFETY: empty_kernel takes no arguments.
            unsafe { b.launch_unchecked(&empty, LaunchConfig::single(), &KernelArgs::new())? };
        }
        let g = b.end_building()?.instantiate()?;
        g.upload(&stream)?;
        graphs.push((n, g));
    }
    stream.synchronize()?;
    Ok(Setup {
        stream,
        empty,
        graphs,
    })
}

fn stream_launches(s: &Setup, n: usize) {
    for _ in 0..n {
        // SAFETY: empty_kernel takes no arguments.
        unsafe {
            s.stream
                .launch_unchecked(&s.empty, LaunchConfig::single(), &KernelArgs::new())
        }
        .expect("launch");
    }
    s.stream.synchronize().expect("sync");
}

fn graph_launch(s: &Setup, g: &Graph) {
    g.launch(&s.stream).expect("graph launch");
    s.stream.synchronize().expect("sync");
}

/// Median seconds per call of `f` over `reps` calls.
fn median(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

fn main() {
    let s = match setup() {
        Ok(s) => s,
        Err(e) => {
            println!("launch_overhead: skipped: {e}");
            return;
        }
    };
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    {
        let mut group = c.benchmark_group("launch_overhead");
        for (n, g) in &s.graphs {
            group.bench_with_input(BenchmarkId::new("stream", n), n, |b, &n| {
                b.iter(|| stream_launches(&s, n))
            });
            group.bench_with_input(BenchmarkId::new("graph", n), g, |b, g| {
                b.iter(|| graph_launch(&s, g))
            });
        }
        group.finish();
    }
    c.final_summary();
    println!("ratio graph/stream (median of 200, same run):");
    for (n, g) in &s.graphs {
        let base = median(200, || stream_launches(&s, *n));
        let graph = median(200, || graph_launch(&s, g));
        println!(
            "  {n:>4} kernels: stream {:>8.1} us, graph {:>8.1} us, ratio {:.2}",
            base * 1e6,
            graph * 1e6,
            graph / base
        );
    }
}
