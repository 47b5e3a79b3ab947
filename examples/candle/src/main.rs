//! candle work captured through cuda-graph: a small network's forward pass written with candle
//! ops (two matmuls through cuBLAS, a ReLU, a softmax made of candle's reductions), captured once
//! on candle's own stream, replayed with new inputs written between replays, and compared with
//! the same forward pass run eagerly by candle.
//!
//! ```text
//! scripts/candle-env.sh cargo run --release --manifest-path examples/candle/Cargo.toml
//! ```
//!
//! The path, step by step:
//! 1. A candle device with a stream of its own (`Device::new_cuda_with_stream`): candle's
//!    everyday `Device::new_cuda` runs on cudarc's per-thread default stream, whose handle names
//!    a different stream on every thread, so this crate refuses it (`--per-thread` shows the
//!    error).
//! 2. This crate's `Device` and `Stream` for candle's context and stream (`from_cudarc`). The
//!    stream's constructor is `unsafe`: its promise is that what other code records into a
//!    capture on it (here, every candle op) uses only memory that outlives the graph's
//!    replays, which `GraphBuilder::hold` makes true for the tensors handed to it.
//! 3. One eager forward pass first, inside candle's `enable_cuda_graph_htod_cache` guard: it
//!    loads candle's kernels, sets up cuBLAS, and fills candle's caches of the small host
//!    copies (shapes, strides) its kernels take, which a capture could not make.
//! 4. The capture: the forward pass writes its result into a tensor made before the capture
//!    (`slice_set`), so every tensor allocated inside the capture is freed inside it too
//!    (a memory allocation node and its free node); the inputs, weights and output are handed
//!    to the graph with `hold`.
//!
//! cudarc's event tracking (on for a device with its own stream) makes every candle op wait on
//! events recorded by earlier ops, which a capture cannot take from before it began; candle's
//! `disable_event_tracking` turns it off for tensors made afterwards. `--event-tracking` keeps
//! it on, to show what the capture then says (candle's cuBLAS matmul fails with
//! `CUBLAS_STATUS_EXECUTION_FAILED`, and the program exits with status 1).

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use candle_core::{DType, Device as CandleDevice, Tensor, D};
use cuda_graph::prelude::*;
use cuda_graph::{EventOptions, NodeType};

mod checkpoint;
mod llama;
mod reference;

const BATCH: usize = 8;
const D_IN: usize = 256;
const D_HIDDEN: usize = 1024;
const D_OUT: usize = 128;
const REPLAYS: usize = 16;
const TIMED: usize = 200;

/// The forward pass: softmax(relu(x · w1) · w2) over the last dimension.
fn forward(x: &Tensor, w1: &Tensor, w2: &Tensor) -> candle_core::Result<Tensor> {
    let h = x.matmul(w1)?.relu()?;
    let y = h.matmul(w2)?;
    let m = y.max_keepdim(D::Minus1)?;
    let e = y.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Deterministic inputs in [-1, 1) for replay `seed`.
fn inputs(len: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("decode") {
        return decode(&args[1..]);
    }
    let per_thread = args.iter().any(|a| a == "--per-thread");
    let event_tracking = args.iter().any(|a| a == "--event-tracking");

    // This crate first: without a driver it returns an error where candle and cudarc would panic.
    cuda_graph::driver_version()?;
    let dev = if per_thread {
        CandleDevice::new_cuda(0)?
    } else {
        CandleDevice::new_cuda_with_stream(0)?
    };
    let cuda = dev.as_cuda_device()?;
    if !event_tracking {
        // SAFETY: every tensor below lives on this one stream (candle's), so no tensor needs
        // events to order its use on another stream.
        unsafe { cuda.disable_event_tracking() };
    }
    let cu_stream = cuda.cuda_stream();
    let device = Device::from_cudarc(cu_stream.context())?;
    // SAFETY: no capture is begun on candle's stream except through this crate, and what candle
    // records into this crate's capture uses only tensors handed to the graph with `hold` (the
    // inputs, weights and output) or allocated and freed inside the capture.
    let stream = unsafe { Stream::from_cudarc(&device, &cu_stream)? };

    let x = Tensor::zeros((BATCH, D_IN), DType::F32, &dev)?;
    let w1 =
        Tensor::from_vec(inputs(D_IN * D_HIDDEN, 1), (D_IN, D_HIDDEN), &dev)?.affine(0.05, 0.0)?;
    let w2 = Tensor::from_vec(inputs(D_HIDDEN * D_OUT, 2), (D_HIDDEN, D_OUT), &dev)?
        .affine(0.05, 0.0)?;
    let out = Tensor::zeros((BATCH, D_OUT), DType::F32, &dev)?;

    // candle's cache of small host copies serves them while the guard lives (this thread).
    let _htod_cache = cuda.enable_cuda_graph_htod_cache();
    out.slice_set(&forward(&x, &w1, &w2)?, 0, 0)?;
    dev.synchronize()?;

    let builder = stream.create_graph_builder().begin_building(ThreadLocal)?;
    // Every tensor made in here is dropped in here: allocated and freed inside the graph.
    let recorded = forward(&x, &w1, &w2).and_then(|y| out.slice_set(&y, 0, 0));
    if let Err(e) = recorded {
        // The builder ends the capture when dropped; the stream stays usable.
        drop(builder);
        return Err(format!("a candle op could not be captured: {e}").into());
    }
    builder.hold((x.clone(), w1.clone(), w2.clone(), out.clone()))?;
    let ended = builder.end_building()?;
    let nodes = ended.graph_definition()?.nodes()?.len();
    let graph = ended.instantiate()?;
    drop(ended);

    let mut worst = 0f32;
    for replay in 0..REPLAYS {
        let host = inputs(BATCH * D_IN, 100 + replay as u32);
        x.slice_set(&Tensor::from_vec(host, (BATCH, D_IN), &dev)?, 0, 0)?;
        graph.launch(&stream)?;
        stream.synchronize()?;
        let got = out.flatten_all()?.to_vec1::<f32>()?;
        let want = forward(&x, &w1, &w2)?.flatten_all()?.to_vec1::<f32>()?;
        for (g, w) in got.iter().zip(&want) {
            worst = worst.max((g - w).abs());
        }
    }
    println!(
        "candle forward captured: {nodes} nodes; {REPLAYS} replays with new inputs, max |graph - eager| = {worst:e}"
    );
    if worst != 0.0 {
        return Err(
            format!("the graph's result differs from candle's eager result by {worst:e}").into(),
        );
    }

    // Host and wall time per forward pass: candle eager beside the graph, interleaved.
    let (mut eager, mut replay) = (Vec::new(), Vec::new());
    for _ in 0..TIMED {
        let t = Instant::now();
        let y = forward(&x, &w1, &w2)?;
        out.slice_set(&y, 0, 0)?;
        drop(y);
        dev.synchronize()?;
        eager.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        graph.launch(&stream)?;
        stream.synchronize()?;
        replay.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (e, r) = (median(eager), median(replay));
    println!(
        "per forward pass (median of {TIMED}, launch to synchronized): candle eager {e:.1} us, graph replay {r:.1} us, eager/graph {:.2}",
        e / r
    );
    Ok(())
}

/// The value after `flag` in `args`.
fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Greedy decoding from BOS: the plain-Rust reference, candle eager, and (on a GPU) one captured
/// step replayed per token; every mode's token ids must be the same.
///
/// `decode [--checkpoint FILE | --random 15m|110m] [--steps N] [--cpu] [--save-checkpoint FILE]
/// [--save-tokens FILE]`: the last two write the weights (llama2.c format) and the reference's
/// token ids (one a line), for the PyTorch peer (`benches/peers/torch_llama2c.py`).
fn decode(args: &[String]) -> Result<(), Box<dyn Error>> {
    let steps: usize = value(args, "--steps").unwrap_or("256").parse()?;
    let weights = match value(args, "--random") {
        Some(shape) => {
            let (dim, hidden, layers, heads, vocab) = match shape {
                "15m" => (288, 768, 6, 6, 32_000),
                "110m" => (768, 2048, 12, 12, 32_000),
                other => return Err(format!("--random takes 15m or 110m, not {other}").into()),
            };
            let config = checkpoint::Config {
                dim,
                hidden_dim: hidden,
                n_layers: layers,
                n_heads: heads,
                n_kv_heads: heads,
                vocab_size: vocab,
                seq_len: steps.max(1),
                shared_classifier: true,
            };
            checkpoint::Weights::random(config, 7)
        }
        None => {
            let path = value(args, "--checkpoint").unwrap_or("../shared/data/stories260K.bin");
            let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
            checkpoint::Weights::parse(&bytes).map_err(|e| format!("{path}: {e}"))?
        }
    };
    if let Some(path) = value(args, "--save-checkpoint") {
        std::fs::write(path, weights.to_bytes()).map_err(|e| format!("{path}: {e}"))?;
    }
    let steps = steps.min(weights.config.seq_len);
    println!("model: {:?}; {steps} tokens from BOS", weights.config);

    let t = Instant::now();
    let (want, gaps) = reference::generate(&weights, steps);
    let mut sorted = gaps.clone();
    sorted.sort_by(f32::total_cmp);
    println!(
        "reference (plain Rust, CPU): {:.1} ms; first tokens {:?}; top-two logit gap: smallest {:e}, median {:e}",
        t.elapsed().as_secs_f64() * 1e3,
        &want[..want.len().min(16)],
        sorted.first().copied().unwrap_or(0.0),
        sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
    );
    if let Some(path) = value(args, "--save-tokens") {
        let text: String = want.iter().map(|t| format!("{t}\n")).collect();
        std::fs::write(path, text).map_err(|e| format!("{path}: {e}"))?;
    }
    let check = |mode: &str, got: &[u32]| -> Result<(), Box<dyn Error>> {
        match got.iter().zip(&want).position(|(a, b)| a != b) {
            None => {
                println!("{mode}: {} tokens identical to the reference", got.len());
                Ok(())
            }
            Some(i) => Err(format!(
                "{mode}: token {i} is {} where the reference has {} (the reference's top-two logit gap there: {:e})",
                got[i], want[i], gaps[i]
            )
            .into()),
        }
    };

    let cpu = args.iter().any(|a| a == "--cpu");
    let dev = if cpu {
        CandleDevice::Cpu
    } else {
        cuda_graph::driver_version()?;
        CandleDevice::new_cuda_with_stream(0)?
    };
    if let Ok(cuda) = dev.as_cuda_device() {
        // SAFETY: every tensor lives on this one stream.
        unsafe { cuda.disable_event_tracking() };
    }
    let model = llama::Model::new(&weights, &dev)?;
    let _htod_cache = dev
        .as_cuda_device()
        .ok()
        .map(|c| c.enable_cuda_graph_htod_cache());
    let Ok(cuda) = dev.as_cuda_device() else {
        model.reset()?;
        let t = Instant::now();
        for _ in 0..steps {
            model.step()?;
        }
        let s = t.elapsed().as_secs_f64();
        check("candle eager (CPU)", &model.tokens(steps)?)?;
        println!("candle eager (CPU): {:.0} tok/s", steps as f64 / s);
        // The step the growing-cache mode captures, eagerly: same tokens.
        model.reset()?;
        for p in 0..steps {
            model.step_growing(p + 1)?;
        }
        check("candle eager, growing cache (CPU)", &model.tokens(steps)?)?;
        return Ok(());
    };
    let cu_stream = cuda.cuda_stream();
    let device = Device::from_cudarc(cu_stream.context())?;
    // SAFETY: no capture is begun on candle's stream except through this crate, and what candle
    // records into this crate's captures uses the model's tensors (held by each graph) or
    // tensors allocated and freed inside the capture.
    let stream = unsafe { Stream::from_cudarc(&device, &cu_stream)? };
    let timer = Timer::new(&device)?;
    let mut rows = Vec::new();

    // Candle eager, once untimed (kernels load, cuBLAS sets up, the htod cache fills), then timed.
    for timed in [false, true] {
        model.reset()?;
        stream.synchronize()?;
        let mut host = 0.0;
        timer.start(&stream)?;
        for _ in 0..steps {
            let t = Instant::now();
            model.step()?;
            host += t.elapsed().as_secs_f64();
        }
        let row = timer.stop(&stream, "candle eager", steps, host)?;
        if timed {
            check("candle eager", &model.tokens(steps)?)?;
            rows.push(row);
        }
    }

    // The growing-cache mode's steps have shapes of their own at every position: each runs once
    // eagerly first, so that candle's htod cache holds the small host arrays (shapes, strides)
    // of every one of them (a capture cannot make them: "h2d param cache miss").
    model.reset()?;
    for p in 0..steps {
        model.step_growing(p + 1)?;
    }
    check("candle eager, growing cache", &model.tokens(steps)?)?;

    // Every step captured anew, with a KV cache as long as the position (shapes change every
    // step), through a GraphCache: the exec is updated when the driver takes the new graph,
    // instantiated again when it refuses.
    let capture_step = |rows: Option<usize>| -> Result<GraphBuilder<Primary, Ended>, Box<dyn Error>> {
        let builder = stream.create_graph_builder().begin_building(ThreadLocal)?;
        let recorded = match rows {
            Some(r) => model.step_growing(r),
            None => model.step(),
        };
        if let Err(e) = recorded {
            drop(builder);
            return Err(format!(
                "a candle op of the decode step could not be captured ({e}); run it once eagerly first, inside enable_cuda_graph_htod_cache"
            )
            .into());
        }
        builder.hold(model.tensors())?;
        Ok(builder.end_building()?)
    };
    {
        model.reset()?;
        stream.synchronize()?;
        let mut cache = GraphCache::new(InstantiateOptions::new());
        let (mut host, mut updates_s, mut inst_s) = (0.0, 0.0, 0.0);
        let mut refusals = std::collections::BTreeMap::<String, u64>::new();
        timer.start(&stream)?;
        for p in 0..steps {
            let t = Instant::now();
            let ended = capture_step(Some(p + 1))?;
            let r = Instant::now();
            let outcome = cache.refresh(&ended)?;
            let took = r.elapsed().as_secs_f64();
            match outcome {
                CacheOutcome::Updated => updates_s += took,
                CacheOutcome::Instantiated { refused } => {
                    inst_s += took;
                    if let Some(why) = refused {
                        *refusals.entry(format!("{why:?}")).or_default() += 1;
                    }
                }
            }
            cache.launch(&stream)?;
            host += t.elapsed().as_secs_f64();
        }
        let mut row = timer.stop(&stream, "captured per step, growing cache (GraphCache)", steps, host)?;
        check("captured per step, growing cache", &model.tokens(steps)?)?;
        let (u, i) = (cache.updates(), cache.instantiations());
        row.note = format!(
            "{u} updates ({:.0} us each), {i} instantiations ({:.0} us each); refusals {refusals:?}",
            1e6 * updates_s / u.max(1) as f64,
            1e6 * inst_s / i.max(1) as f64
        );
        rows.push(row);
    }

    // The whole generation in one graph: `steps` static steps captured back to back, one launch.
    {
        model.reset()?;
        stream.synchronize()?;
        let t = Instant::now();
        let builder = stream.create_graph_builder().begin_building(ThreadLocal)?;
        for _ in 0..steps {
            if let Err(e) = model.step() {
                drop(builder);
                return Err(format!("a candle op could not be captured: {e}").into());
            }
        }
        builder.hold(model.tensors())?;
        let graph = builder.end_building()?.instantiate()?;
        let prepare = t.elapsed().as_secs_f64();
        timer.start(&stream)?;
        let t = Instant::now();
        graph.launch(&stream)?;
        let host = t.elapsed().as_secs_f64();
        let mut row = timer.stop(&stream, "whole generation, one graph", steps, host)?;
        check("whole generation, one graph", &model.tokens(steps)?)?;
        row.note = format!("captured and instantiated in {:.0} ms", prepare * 1e3);
        rows.push(row);
    }

    // One static step captured once and launched per token. The model and the candle device are
    // dropped before the launches: the graph holds every tensor it uses.
    let kernels;
    {
        model.reset()?;
        stream.synchronize()?;
        let ended = capture_step(None)?;
        let def = ended.graph_definition()?;
        let nodes = def.nodes()?;
        kernels = nodes
            .iter()
            .filter(|n| matches!(def.node_type(n), Ok(NodeType::Kernel)))
            .count();
        let graph = ended.instantiate()?;
        drop((ended, def));
        let history = model.history.clone();
        drop(model);
        drop(_htod_cache);
        drop(dev);
        let mut host = 0.0;
        timer.start(&stream)?;
        for _ in 0..steps {
            let t = Instant::now();
            graph.launch(&stream)?;
            host += t.elapsed().as_secs_f64();
        }
        let mut row = timer.stop(&stream, "static step, captured once", steps, host)?;
        let got = history.narrow(0, 0, steps)?.to_vec1::<u32>()?;
        check("static step, captured once (model and candle device dropped)", &got)?;
        row.note = format!("{} nodes", nodes.len());
        rows.push(row);
    }

    println!("| mode | tok/s | host us/token | GPU us/token | x eager | |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let eager = rows[0].tok_s;
    for r in &rows {
        println!(
            "| {} | {:.0} | {:.1} | {:.1} | {:.2} | {} |",
            r.mode,
            r.tok_s,
            r.host_us,
            r.gpu_us,
            r.tok_s / eager,
            r.note
        );
    }
    println!("kernels per token: {kernels}");
    Ok(())
}

/// One mode's figures: tokens per second (first launch to the stream's end), host time spent in
/// the mode's calls per token, and GPU time per token (events on the stream).
struct Row {
    mode: &'static str,
    tok_s: f64,
    host_us: f64,
    gpu_us: f64,
    note: String,
}

struct Timer {
    start: Event,
    end: Event,
    wall: std::cell::Cell<Option<Instant>>,
}

impl Timer {
    fn new(device: &Device) -> cuda_graph::Result<Timer> {
        Ok(Timer {
            start: device.create_event_with(&EventOptions::default().timing(true))?,
            end: device.create_event_with(&EventOptions::default().timing(true))?,
            wall: std::cell::Cell::new(None),
        })
    }

    fn start(&self, stream: &Stream) -> cuda_graph::Result<()> {
        self.wall.set(Some(Instant::now()));
        stream.record(&self.start)
    }

    fn stop(
        &self,
        stream: &Stream,
        mode: &'static str,
        steps: usize,
        host_s: f64,
    ) -> cuda_graph::Result<Row> {
        stream.record(&self.end)?;
        stream.synchronize()?;
        let wall = self.wall.take().map_or(0.0, |t| t.elapsed().as_secs_f64());
        let gpu_ms = self.start.elapsed_ms(&self.end)? as f64;
        let n = steps.max(1) as f64;
        Ok(Row {
            mode,
            tok_s: n / wall,
            host_us: 1e6 * host_s / n,
            gpu_us: 1e3 * gpu_ms / n,
            note: String::new(),
        })
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("candle-capture: {e}");
            ExitCode::FAILURE
        }
    }
}
