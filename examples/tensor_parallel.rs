//! A tensor-parallel MLP step over every GPU of the machine: the hidden layer is split by
//! columns across the GPUs (each computes its slice of `relu(W1 · x)`), the output projection by
//! rows (each multiplies its slice by its rows of `W2`), and one NCCL all-reduce sums the partial
//! outputs, so every GPU ends with `y = W2 · relu(W1 · x)`. The step runs eagerly, then is
//! captured once per GPU (each on a thread of its own: one graph per GPU holding its kernels and
//! its part of the all-reduce) and replayed; both are checked against the same math on the host
//! and timed.
//!
//! ```text
//! cargo run --release --example tensor_parallel --features nccl,nvrtc [-- STEPS]
//! ```
//!
//! With one GPU the communicator has one rank and the all-reduce copies. Needs a CUDA driver,
//! NVRTC and libnccl (`libnccl.so.2` on the library path, e.g. the `nvidia-nccl` wheel's `lib`
//! folder); without them it prints one line and exits with status 1.

use std::process::ExitCode;
use std::time::Instant;

use cuda_graph::nccl::{self, Communicator, ReduceOp};
use cuda_graph::prelude::*;
use cuda_graph::LaunchConfig;

/// Model width and hidden width (split across the GPUs; a multiple of their count).
const D: usize = 1024;
const H: usize = 4096;

const SOURCE: &str = r#"
// h[j] = relu(sum_i w1[j * d + i] * x[i]) for this GPU's hidden rows j < rows.
extern "C" __global__ void up_relu(const float* w1, const float* x, float* h, int rows, int d) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= rows) return;
    float s = 0.0f;
    for (int i = 0; i < d; i++) s += w1[(long long)j * d + i] * x[i];
    h[j] = s > 0.0f ? s : 0.0f;
}
// y[r] = sum_j w2[r * cols + j] * h[j]: this GPU's part of the output (its columns of W2).
extern "C" __global__ void down(const float* w2, const float* h, float* y, int d, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= d) return;
    float s = 0.0f;
    for (int j = 0; j < cols; j++) s += w2[(long long)r * cols + j] * h[j];
    y[r] = s;
}
"#;

type UpRelu = Kernel<(*const f32, *const f32, *mut f32, i32, i32)>;
type Down = Kernel<(*const f32, *const f32, *mut f32, i32, i32)>;

/// What one GPU holds: its shards, its buffers, its kernels and stream.
struct Rank {
    comm: Communicator,
    stream: Stream,
    up: UpRelu,
    down: Down,
    w1: DeviceBuffer<f32>,
    w2: DeviceBuffer<f32>,
    x: DeviceBuffer<f32>,
    h: DeviceBuffer<f32>,
    y: DeviceBuffer<f32>,
    rows: usize,
}

impl Rank {
    /// One step on `s` (a stream, or a builder's): the two kernels and the all-reduce.
    fn step(&self, s: &Stream) -> cuda_graph::Result<()> {
        let grid = |n: usize| LaunchConfig {
            grid: (n.div_ceil(256) as u32, 1, 1),
            block: (256, 1, 1),
            shared_mem_bytes: 0,
            ..LaunchConfig::single()
        };
        let (rows, d) = (self.rows as i32, D as i32);
        s.launch(
            &self.up,
            grid(self.rows),
            (&self.w1, &self.x, &self.h, rows, d),
        )?;
        s.launch(&self.down, grid(D), (&self.w2, &self.h, &self.y, d, rows))?;
        Ok(())
    }
}

/// A value of W1 (H × D) or W2 (D × H) at (row, col), the same on the host and every GPU.
fn weight(seed: u64, row: usize, col: usize) -> f32 {
    let mut z = seed ^ ((row as u64) << 32 | col as u64);
    z = z.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z ^= z >> 29;
    ((z % 2001) as f32 / 1000.0 - 1.0) / 32.0
}

fn run(steps: usize) -> Result<(), Box<dyn std::error::Error>> {
    let count = Device::count()?;
    if count == 0 {
        return Err("no GPU".into());
    }
    if !H.is_multiple_of(count) {
        return Err(format!("the hidden width {H} does not split over {count} GPUs").into());
    }
    let devices = (0..count)
        .map(Device::new)
        .collect::<cuda_graph::Result<Vec<_>>>()?;
    let comms = Communicator::for_devices(&devices)?;
    let rows = H / count;
    let x_host: Vec<f32> = (0..D).map(|i| ((i % 7) as f32 - 3.0) / 4.0).collect();
    let mut ranks = Vec::new();
    for (rank, (device, comm)) in devices.iter().zip(comms).enumerate() {
        let module = device.compile(SOURCE)?;
        // SAFETY: the parameter lists of SOURCE's kernels; `step` gives each the buffers its
        // sizes were made for (w1: rows × D, w2: D × rows, x: D, h: rows, y: D).
        let (up, down) = unsafe { (module.kernel("up_relu")?, module.kernel("down")?) };
        let w1: Vec<f32> = (0..rows * D)
            .map(|k| weight(1, rank * rows + k / D, k % D))
            .collect();
        let w2: Vec<f32> = (0..D * rows)
            .map(|k| weight(2, k / rows, rank * rows + k % rows))
            .collect();
        ranks.push(Rank {
            comm,
            stream: device.create_stream()?,
            up,
            down,
            w1: device.htod(&w1)?,
            w2: device.htod(&w2)?,
            x: device.htod(&x_host)?,
            h: device.alloc_zeroed(rows)?,
            y: device.alloc_zeroed(D)?,
            rows,
        });
    }
    // The reference on the host.
    let h_ref: Vec<f64> = (0..H)
        .map(|j| {
            let s: f64 = (0..D)
                .map(|i| weight(1, j, i) as f64 * x_host[i] as f64)
                .sum();
            s.max(0.0)
        })
        .collect();
    let y_ref: Vec<f64> = (0..D)
        .map(|r| (0..H).map(|j| weight(2, r, j) as f64 * h_ref[j]).sum())
        .collect();
    let check = |what: &str| -> Result<(), Box<dyn std::error::Error>> {
        for (rank, r) in ranks.iter().enumerate() {
            let y = r.y.to_vec()?;
            let worst = y
                .iter()
                .zip(&y_ref)
                .map(|(a, b)| (*a as f64 - b).abs())
                .fold(0.0, f64::max);
            if worst > 1e-3 {
                return Err(format!("{what}: GPU {rank} differs from the host by {worst}").into());
            }
        }
        Ok(())
    };

    // Eager: each GPU's kernels, then the all-reduce of every rank in one NCCL group (one thread
    // issues every rank's part). Also the warm-up NCCL needs before a capture.
    let eager_step = || -> cuda_graph::Result<()> {
        for r in &ranks {
            r.step(&r.stream)?;
        }
        nccl::group(|| {
            for r in &ranks {
                r.comm.all_reduce(&r.stream, &r.y, &r.y, ReduceOp::Sum)?;
            }
            Ok(())
        })
    };
    let sync =
        || -> cuda_graph::Result<()> { ranks.iter().try_for_each(|r| r.stream.synchronize()) };
    // One checked step, then `steps` timed ones, checked again: seconds per step.
    let timed = |what: &str,
                 step: &dyn Fn() -> cuda_graph::Result<()>|
     -> Result<f64, Box<dyn std::error::Error>> {
        step()?;
        sync()?;
        check(what)?;
        let t = Instant::now();
        for _ in 0..steps {
            step()?;
        }
        sync()?;
        let per_step = t.elapsed().as_secs_f64() / steps as f64;
        check(what)?;
        Ok(per_step)
    };
    let eager = timed("eager", &eager_step)?;

    // Graphs: each GPU's step captured on a thread of its own (a capture records its rank's
    // part of the all-reduce; NCCL groups stay outside captures), then one launch per GPU.
    let graphs = std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|r| {
                scope.spawn(move || -> cuda_graph::Result<Graph> {
                    let b = r
                        .stream
                        .create_graph_builder()
                        .begin_building(ThreadLocal)?;
                    r.step(b.stream())?;
                    r.comm.all_reduce(&b, &r.y, &r.y, ReduceOp::Sum)?;
                    b.end_building()?.instantiate()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(cuda_graph::Error::invalid(
                        cuda_graph::Refusal::Other,
                        "a capture thread panicked",
                    ))
                })
            })
            .collect::<cuda_graph::Result<Vec<_>>>()
    })?;
    let replay = || -> cuda_graph::Result<()> {
        graphs
            .iter()
            .zip(&ranks)
            .try_for_each(|(g, r)| g.launch(&r.stream))
    };
    let graph = timed("graphs", &replay)?;
    println!(
        "tensor-parallel MLP ({D} -> {H} -> {D}, fp32) over {count} GPU(s), NCCL {}: eager {:.1} µs/step, graphs {:.1} µs/step ({:.2}x); values match the host",
        nccl::version()?,
        eager * 1e6,
        graph * 1e6,
        eager / graph
    );
    Ok(())
}

fn main() -> ExitCode {
    let steps = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    match run(steps) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("tensor_parallel: {e}");
            ExitCode::FAILURE
        }
    }
}
