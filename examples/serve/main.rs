//! Continuous batching on graph buckets, as an inference server runs it: a seeded stream of
//! requests with different prompt and generation lengths arrives and leaves a GPT-style decoder
//! (random fp32 weights made on the device, the decode example's "tiny" shape); each step runs
//! the active sequences padded to a batch bucket (1, 2, 4, 8, 16, 32, 64), and a finished
//! sequence's slot goes to the next request.
//!
//! ```text
//! cargo run --release --example serve --features nvrtc [-- REQUESTS [SEED]]
//! ```
//!
//! Three runs, each checked request by request:
//! 1. **alone**: each request decoded at batch 1 (the bucket-1 graph), one after another: the
//!    tokens every other run must reproduce;
//! 2. **eager**: the continuous-batching loop, every kernel launched on the stream;
//! 3. **graphs**: the same loop, each step one launch of its bucket's graph from a
//!    [`GraphSet`] keyed by bucket, captured the first time the bucket is used.
//!
//! Each row of a step reads its slot from `rows_slot` (device memory the host writes before the
//! step), so one graph per bucket serves any set of slots; padding rows get slots of their own.
//! Prints start-up (capturing and instantiating every bucket), tokens per second of each loop,
//! the graph set's counters, and whether every request's tokens match its run alone.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use cuda_graph::prelude::*;
use cuda_graph::GraphSet;

const KERNELS: &str = include_str!("kernels.cu");
const BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Batch rows at most (the largest bucket) and slots for sequences.
const ROWS: usize = 64;
const SLOTS: usize = 64;
/// Positions per slot: the longest prompt plus the longest generation.
const MAX_T: usize = 96;
const D: usize = 512;
const LAYERS: usize = 8;
const HEADS: usize = 8;
const MLP: usize = 1408;
const VOCAB: usize = 32_000;

type K1 = Kernel<(
    *const f32,
    *const i32,
    *const i32,
    *const i32,
    *mut f32,
    i32,
    i32,
)>;
type Gemv = Kernel<(*const f32, *const f32, *mut f32, i32, i32, i32, i32)>;
type RopeAppend = Kernel<(
    *mut f32,
    *const i32,
    *const i32,
    *mut f32,
    *mut f32,
    i32,
    i32,
    i32,
)>;
type Attention = Kernel<(
    *const f32,
    *const i32,
    *const i32,
    *const f32,
    *const f32,
    *mut f32,
    i32,
    i32,
    i32,
)>;
type ArgmaxNext = Kernel<(
    *const f32,
    *const i32,
    *const i32,
    *mut i32,
    *mut i32,
    i32,
    i32,
)>;

struct Kernels {
    init_uniform: Kernel<(*mut f32, u64, u32, f32)>,
    fill: Kernel<(*mut f32, u64, f32)>,
    embed: K1,
    rmsnorm: Kernel<(*const f32, *const f32, *mut f32, i32)>,
    gemv: Gemv,
    rope_append: RopeAppend,
    attention: Attention,
    silu_mul: Kernel<(*const f32, *mut f32, i32)>,
    argmax_next: ArgmaxNext,
}

struct Layer {
    attn_norm: DeviceBuffer<f32>,
    wqkv: DeviceBuffer<f32>,
    wo: DeviceBuffer<f32>,
    mlp_norm: DeviceBuffer<f32>,
    w_gate_up: DeviceBuffer<f32>,
    w_down: DeviceBuffer<f32>,
    k_cache: DeviceBuffer<f32>,
    v_cache: DeviceBuffer<f32>,
}

/// The model and the serving state: per slot its tokens (prompt, then generated), position and
/// prompt length; per row of a step its slot.
struct Model {
    embedding: DeviceBuffer<f32>,
    layers: Vec<Layer>,
    final_norm: DeviceBuffer<f32>,
    lm_head: DeviceBuffer<f32>,
    x: DeviceBuffer<f32>,
    xn: DeviceBuffer<f32>,
    qkv: DeviceBuffer<f32>,
    attn: DeviceBuffer<f32>,
    gu: DeviceBuffer<f32>,
    act: DeviceBuffer<f32>,
    logits: DeviceBuffer<f32>,
    tokens: DeviceBuffer<i32>,
    pos: DeviceBuffer<i32>,
    prompt_len: DeviceBuffer<i32>,
    rows_slot: DeviceBuffer<i32>,
}

/// Slots for padding rows: one each, after the sequences' slots.
const ALL_SLOTS: usize = SLOTS + ROWS;

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).clamp(1, 528) as u32
}

fn cfg(grid: (u32, u32, u32), threads: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid,
        block: (threads, 1, 1),
        shared_mem_bytes: shared,
        ..LaunchConfig::single()
    }
}

impl Model {
    fn new(device: &Device, k: &Kernels, s: &Stream) -> cuda_graph::Result<Model> {
        let mut seed = 1u32;
        let mut uniform = |n: usize, scale: f32| -> cuda_graph::Result<DeviceBuffer<f32>> {
            let b = device.alloc_zeroed::<f32>(n)?;
            seed += 1;
            s.launch(
                &k.init_uniform,
                cfg((blocks(n, 256), 1, 1), 256, 0),
                (&b, n as u64, seed, scale),
            )?;
            Ok(b)
        };
        let ones = |n: usize| -> cuda_graph::Result<DeviceBuffer<f32>> {
            let b = device.alloc_zeroed::<f32>(n)?;
            s.launch(
                &k.fill,
                cfg((blocks(n, 256), 1, 1), 256, 0),
                (&b, n as u64, 1.0f32),
            )?;
            Ok(b)
        };
        let w = 1.0 / (D as f32).sqrt();
        let mut layers = Vec::new();
        for _ in 0..LAYERS {
            layers.push(Layer {
                attn_norm: ones(D)?,
                wqkv: uniform(3 * D * D, w)?,
                wo: uniform(D * D, w)?,
                mlp_norm: ones(D)?,
                w_gate_up: uniform(2 * MLP * D, w)?,
                w_down: uniform(D * MLP, 1.0 / (MLP as f32).sqrt())?,
                k_cache: device.alloc_zeroed(ALL_SLOTS * MAX_T * D)?,
                v_cache: device.alloc_zeroed(ALL_SLOTS * MAX_T * D)?,
            });
        }
        Ok(Model {
            embedding: uniform(VOCAB * D, 1.0)?,
            layers,
            final_norm: ones(D)?,
            lm_head: uniform(VOCAB * D, w)?,
            x: device.alloc_zeroed(ROWS * D)?,
            xn: device.alloc_zeroed(ROWS * D)?,
            qkv: device.alloc_zeroed(ROWS * 3 * D)?,
            attn: device.alloc_zeroed(ROWS * D)?,
            gu: device.alloc_zeroed(ROWS * 2 * MLP)?,
            act: device.alloc_zeroed(ROWS * MLP)?,
            logits: device.alloc_zeroed(ROWS * VOCAB)?,
            tokens: device.alloc_zeroed(ALL_SLOTS * MAX_T)?,
            pos: device.alloc_zeroed(ALL_SLOTS)?,
            prompt_len: device.alloc_zeroed(ALL_SLOTS)?,
            rows_slot: device.alloc_zeroed(ROWS)?,
        })
    }

    /// One step of `rows` rows: 76 kernels (embed; per layer norm, QKV, rope + append,
    /// attention, output + residual, norm, gate/up, SiLU, down + residual; norm, LM head,
    /// argmax).
    fn step(&self, k: &Kernels, s: &Stream, rows: usize) -> cuda_graph::Result<()> {
        let (d, hd, mlp, b, t) = (
            D as i32,
            (D / HEADS) as i32,
            MLP as i32,
            rows as i32,
            MAX_T as i32,
        );
        let per_row = |threads| cfg((rows as u32, 1, 1), threads, 0);
        let gemv = |w: &DeviceBuffer<f32>,
                    x: &DeviceBuffer<f32>,
                    y: &DeviceBuffer<f32>,
                    out: usize,
                    cols: usize,
                    acc: i32| {
            s.launch(
                &k.gemv,
                cfg((blocks(out, 8), 1, 1), 256, 0),
                (w, x, y, out as i32, cols as i32, b, acc),
            )
        };
        s.launch(
            &k.embed,
            per_row(128),
            (
                &self.embedding,
                &self.rows_slot,
                &self.tokens,
                &self.pos,
                &self.x,
                d,
                t,
            ),
        )?;
        for l in &self.layers {
            s.launch(
                &k.rmsnorm,
                per_row(32),
                (&self.x, &l.attn_norm, &self.xn, d),
            )?;
            gemv(&l.wqkv, &self.xn, &self.qkv, 3 * D, D, 0)?;
            s.launch(
                &k.rope_append,
                per_row(128),
                (
                    &self.qkv,
                    &self.rows_slot,
                    &self.pos,
                    &l.k_cache,
                    &l.v_cache,
                    d,
                    hd,
                    t,
                ),
            )?;
            s.launch(
                &k.attention,
                cfg((HEADS as u32, rows as u32, 1), 64, (MAX_T * 4) as u32),
                (
                    &self.qkv,
                    &self.rows_slot,
                    &self.pos,
                    &l.k_cache,
                    &l.v_cache,
                    &self.attn,
                    d,
                    hd,
                    t,
                ),
            )?;
            gemv(&l.wo, &self.attn, &self.x, D, D, 1)?;
            s.launch(&k.rmsnorm, per_row(32), (&self.x, &l.mlp_norm, &self.xn, d))?;
            gemv(&l.w_gate_up, &self.xn, &self.gu, 2 * MLP, D, 0)?;
            s.launch(&k.silu_mul, per_row(256), (&self.gu, &self.act, mlp))?;
            gemv(&l.w_down, &self.act, &self.x, D, MLP, 1)?;
        }
        s.launch(
            &k.rmsnorm,
            per_row(32),
            (&self.x, &self.final_norm, &self.xn, d),
        )?;
        gemv(&self.lm_head, &self.xn, &self.logits, VOCAB, D, 0)?;
        s.launch(
            &k.argmax_next,
            per_row(256),
            (
                &self.logits,
                &self.rows_slot,
                &self.prompt_len,
                &self.tokens,
                &self.pos,
                VOCAB as i32,
                t,
            ),
        )
    }
}

/// A request: its prompt and how many tokens to generate.
#[derive(Debug, Clone)]
struct Request {
    prompt: Vec<i32>,
    generate: usize,
    /// The step (of the loop) at which it arrives.
    arrives: usize,
}

impl Request {
    /// Steps to decode it: each consumes the token at its position and yields the next.
    fn steps(&self) -> usize {
        self.prompt.len() + self.generate - 1
    }
}

/// Seeded requests: prompts of 4-16 tokens, 8-64 generated, arriving a few per step.
fn requests(n: usize, seed: u64) -> Vec<Request> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut next = |m: u64| {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (s >> 33) % m
    };
    let mut at = 0;
    (0..n)
        .map(|_| {
            at += next(3) as usize;
            let len = 4 + next(13) as usize;
            Request {
                prompt: (0..len).map(|_| next(VOCAB as u64) as i32).collect(),
                generate: 8 + next(57) as usize,
                arrives: at,
            }
        })
        .collect()
}

/// How a loop launches a step of `rows` rows.
enum Runner<'a> {
    Eager,
    Graphs(&'a mut GraphSet<usize>),
}

/// The smallest bucket that holds `n` rows.
fn bucket(n: usize) -> usize {
    BUCKETS.into_iter().find(|&b| b >= n).unwrap_or(ROWS)
}

/// Each request's tokens (prompt and generated), and the steps the loop ran on the GPU.
type Served = (Vec<Vec<i32>>, usize);

/// Runs `reqs` through the continuous-batching loop.
fn serve(
    m: &Model,
    k: &Kernels,
    s: &Stream,
    reqs: &[Request],
    mut runner: Runner<'_>,
    max_rows: usize,
) -> Result<Served, Box<dyn Error>> {
    // Every slot at position 0; padding slots (prompt length 0) stay there.
    s.memcpy_htod(&m.pos, &vec![0i32; ALL_SLOTS])?;
    s.memcpy_htod(&m.prompt_len, &vec![0i32; ALL_SLOTS])?;
    let mut out = vec![Vec::new(); reqs.len()];
    // Per slot: the request in it and the steps it has left.
    let mut slots: Vec<Option<(usize, usize)>> = vec![None; SLOTS];
    let (mut next, mut done, mut step, mut ran) = (0, 0, 0, 0);
    while done < reqs.len() {
        // Admit arrived requests into free slots (at most `max_rows` active).
        let active = slots.iter().filter(|x| x.is_some()).count();
        let mut room = max_rows.saturating_sub(active);
        for (slot, state) in slots.iter_mut().enumerate() {
            if room == 0 || next == reqs.len() || reqs[next].arrives > step {
                break;
            }
            if state.is_none() {
                let r = &reqs[next];
                let mut row = vec![0i32; MAX_T];
                row[..r.prompt.len()].copy_from_slice(&r.prompt);
                s.memcpy_htod(&m.tokens.slice(slot * MAX_T..(slot + 1) * MAX_T)?, &row)?;
                s.memcpy_htod(&m.pos.slice(slot..slot + 1)?, &[0])?;
                s.memcpy_htod(
                    &m.prompt_len.slice(slot..slot + 1)?,
                    &[r.prompt.len() as i32],
                )?;
                *state = Some((next, r.steps()));
                next += 1;
                room -= 1;
            }
        }
        let live: Vec<usize> = (0..SLOTS).filter(|&i| slots[i].is_some()).collect();
        if live.is_empty() {
            // Nothing has arrived yet: time passes, no step runs.
            step += 1;
            continue;
        }
        ran += 1;
        let rows = bucket(live.len());
        let mut map: Vec<i32> = live.iter().map(|&i| i as i32).collect();
        map.extend((live.len()..ROWS).map(|r| (SLOTS + r) as i32));
        s.memcpy_htod(&m.rows_slot, &map)?;
        match &mut runner {
            Runner::Eager => m.step(k, s, rows)?,
            Runner::Graphs(set) => set
                .get_or_capture(rows, || -> cuda_graph::Result<_> {
                    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
                    m.step(k, b.stream(), rows)?;
                    b.end_building()
                })?
                .launch(s)?,
        }
        step += 1;
        for slot in live {
            let Some((req, left)) = slots[slot] else {
                continue;
            };
            if left > 1 {
                slots[slot] = Some((req, left - 1));
                continue;
            }
            // Finished: its tokens out, its slot free for the next request.
            s.synchronize()?;
            let end = reqs[req].prompt.len() + reqs[req].generate;
            out[req] = m.tokens.slice(slot * MAX_T..slot * MAX_T + end)?.to_vec()?;
            slots[slot] = None;
            done += 1;
        }
    }
    s.synchronize()?;
    Ok((out, ran))
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let n: usize = match args.first() {
        Some(v) => v
            .parse()
            .map_err(|_| format!("REQUESTS must be a whole number, not {v:?}"))?,
        None => 200,
    };
    let seed: u64 = match args.get(1) {
        Some(v) => v
            .parse()
            .map_err(|_| format!("SEED must be a whole number, not {v:?}"))?,
        None => 7,
    };
    let device = Device::new(0)?;
    let module = device.compile_with(KERNELS, &["-std=c++17"])?;
    // SAFETY: these are the parameter lists of kernels.cu. Each kernel stays within the sizes
    // `Model::new` allocates: rows < ROWS, slots < ALL_SLOTS, positions < MAX_T (argmax_next
    // holds a position at MAX_T - 1, and requests fit in MAX_T).
    let k = unsafe {
        Kernels {
            init_uniform: module.kernel("init_uniform")?,
            fill: module.kernel("fill")?,
            embed: module.kernel("embed")?,
            rmsnorm: module.kernel("rmsnorm")?,
            gemv: module.kernel("gemv")?,
            rope_append: module.kernel("rope_append")?,
            attention: module.kernel("attention")?,
            silu_mul: module.kernel("silu_mul")?,
            argmax_next: module.kernel("argmax_next")?,
        }
    };
    let s = device.create_stream()?;
    let m = Model::new(&device, &k, &s)?;
    s.synchronize()?;
    let reqs = requests(n, seed);
    if reqs.iter().any(|r| r.prompt.len() + r.generate > MAX_T) {
        return Err("a request does not fit its slot".into());
    }
    let generated: usize = reqs.iter().map(|r| r.generate).sum();
    println!(
        "# {}, driver {}; {n} requests (seed {seed}), {generated} tokens to generate; buckets {BUCKETS:?}",
        device.name()?,
        cuda_graph::driver_version()?
    );

    // Start-up: every bucket captured and instantiated, timed.
    let mut graphs = GraphSet::new(InstantiateOptions::new());
    let t = Instant::now();
    let mut per_bucket = Vec::new();
    for b in BUCKETS {
        let tb = Instant::now();
        graphs.get_or_capture(b, || -> cuda_graph::Result<_> {
            let builder = s.create_graph_builder().begin_building(ThreadLocal)?;
            m.step(&k, builder.stream(), b)?;
            builder.end_building()
        })?;
        per_bucket.push(format!("{b}: {:.2} ms", tb.elapsed().as_secs_f64() * 1e3));
    }
    let startup = t.elapsed().as_secs_f64();
    println!(
        "start-up: {} buckets captured and instantiated in {:.1} ms ({})",
        BUCKETS.len(),
        startup * 1e3,
        per_bucket.join(", ")
    );

    // Each request alone, at batch 1: the tokens to match.
    let t = Instant::now();
    let mut alone = Vec::with_capacity(n);
    for r in &reqs {
        let one = Request {
            arrives: 0,
            ..r.clone()
        };
        let (tokens, _) = serve(&m, &k, &s, &[one], Runner::Graphs(&mut graphs), 1)?;
        alone.push(tokens.into_iter().next().unwrap_or_default());
    }
    println!(
        "alone (batch 1, one request at a time): {:.0} tok/s",
        generated as f64 / t.elapsed().as_secs_f64()
    );

    let check = |name: &str, got: &[Vec<i32>]| -> Result<(), Box<dyn Error>> {
        match got.iter().zip(&alone).position(|(a, b)| a != b) {
            None => {
                println!(
                    "{name}: {} requests, every one's tokens identical to its run alone",
                    got.len()
                );
                Ok(())
            }
            Some(i) => {
                Err(format!("{name}: request {i} decoded other tokens batched than alone").into())
            }
        }
    };
    for (name, eager) in [("eager", true), ("graphs", false)] {
        let before = graphs.stats();
        let t = Instant::now();
        let (tokens, steps) = if eager {
            serve(&m, &k, &s, &reqs, Runner::Eager, ROWS)?
        } else {
            serve(&m, &k, &s, &reqs, Runner::Graphs(&mut graphs), ROWS)?
        };
        let secs = t.elapsed().as_secs_f64();
        check(name, &tokens)?;
        let after = graphs.stats();
        println!(
            "{name}: {steps} steps, {:.0} tok/s, {:.1} us per step{}",
            generated as f64 / secs,
            secs * 1e6 / steps as f64,
            if eager {
                String::new()
            } else {
                format!(
                    "; graph set: {} hits, {} captures, {} instantiations, {} evictions in the loop",
                    after.hits - before.hits,
                    after.captures - before.captures,
                    after.instantiations - before.instantiations,
                    after.evictions - before.evictions
                )
            }
        );
    }
    // Steady state per bucket: every row a sequence, 64 steps from position 0, one graph launch
    // per step (the bandwidth limit reads the weights once per step for the whole batch).
    let weights = 4 * (LAYERS * (3 * D * D + D * D + 3 * MLP * D) + VOCAB * D);
    let mut rows_line = Vec::new();
    for b in BUCKETS {
        s.memcpy_htod(&m.pos, &vec![0i32; ALL_SLOTS])?;
        s.memcpy_htod(&m.prompt_len, &vec![1i32; ALL_SLOTS])?;
        let map: Vec<i32> = (0..ROWS as i32).collect();
        s.memcpy_htod(&m.rows_slot, &map)?;
        let g = graphs.get(&b).ok_or("a bucket's graph went missing")?;
        g.launch(&s)?;
        s.synchronize()?;
        s.memcpy_htod(&m.pos, &vec![0i32; ALL_SLOTS])?;
        let t = Instant::now();
        for _ in 0..64 {
            g.launch(&s)?;
        }
        s.synchronize()?;
        let secs = t.elapsed().as_secs_f64();
        rows_line.push(format!(
            "| {b} | {:.0} | {:.1} | {:.0} |",
            (b * 64) as f64 / secs,
            secs * 1e6 / 64.0,
            weights as f64 * 64.0 / secs / 1e9
        ));
    }
    println!("| batch | tok/s | us per step | weight GB/s |");
    println!("| --- | --- | --- | --- |");
    for r in rows_line {
        println!("{r}");
    }
    let usage = device.graph_memory_usage()?;
    println!("graph memory: {usage:?}");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve: {e}");
            ExitCode::FAILURE
        }
    }
}
