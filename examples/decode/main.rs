//! A transformer decode loop on CUDA graphs: a GPT-style decoder (random weights made on the
//! device from a fixed seed) generates tokens four ways, which must agree token for token:
//!
//! 1. **eager** — every kernel and GEMV launched on a stream;
//! 2. **capture per step** — each step captured again and handed to a [`GraphCache`], which
//!    updates its exec in place (or instantiates when the topology changed);
//! 3. **static graph** — one step captured once; the position lives in device memory, so every
//!    step is one `Graph::launch`;
//! 4. **on the device** — one graph launch generates every token: a WHILE node whose body is the
//!    step, the argmax feeding the next step, a countdown ending the loop.
//!
//! ```text
//! cargo run --release --example decode --features nvrtc [-- tiny|small|all [RUNS]]
//! ```
//!
//! Per layer: RMSNorm, fused QKV projection, rotary embedding with the K/V cache append,
//! attention of the new token over the cache, output projection with the residual, RMSNorm, a
//! SiLU-gated MLP (fused gate/up projection) with the residual; then the final norm, the LM head
//! and the argmax on the device. The GEMVs are cuBLAS's (`cublasSgemv`, on the crate's stream:
//! captured with everything else); the other kernels are typed [`Kernel`]s compiled by NVRTC.
//! fp32, batch 1, a 16-token prompt fed token by token, 256 tokens generated.
//!
//! Prints one CSV row per mode and configuration (`decode,<config>,<mode>,...`): tokens per
//! second, host time to issue one token (µs), GPU time per token (µs, events), kernels per token
//! and a checksum of the tokens; the medians of RUNS runs (default 5). Needs a CUDA driver, NVRTC
//! and cuBLAS (`LD_LIBRARY_PATH=/usr/local/cuda/lib64`); without them it prints one line and
//! exits with status 1.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use cuda_graph::prelude::*;
use cudarc::cublas::{result as blas, sys as blas_sys};

const KERNELS: &str = include_str!("kernels.cu");
const PROMPT: usize = 16;
const GENERATE: usize = 256;
/// Cache rows: every position a step reads or writes.
const MAX_T: usize = PROMPT + GENERATE;
/// Steps: each consumes the token at its position and yields the next (the prompt's last step
/// yields the first generated token).
const STEPS: usize = PROMPT + GENERATE - 1;

#[derive(Debug, Clone, Copy)]
struct Config {
    name: &'static str,
    d: usize,
    layers: usize,
    heads: usize,
    mlp: usize,
    vocab: usize,
}

const TINY: Config = Config {
    name: "tiny",
    d: 512,
    layers: 8,
    heads: 8,
    mlp: 1408,
    vocab: 32_000,
};
const SMALL: Config = Config {
    name: "small",
    d: 2048,
    layers: 16,
    heads: 16,
    mlp: 5632,
    vocab: 32_000,
};

impl Config {
    fn head_dim(&self) -> usize {
        self.d / self.heads
    }
    /// Weight bytes read per token (every matrix once, fp32; the embedding row aside).
    fn weight_bytes(&self) -> usize {
        let per_layer = 3 * self.d * self.d + self.d * self.d + 3 * self.mlp * self.d + 2 * self.d;
        4 * (self.layers * per_layer + self.vocab * self.d + self.d)
    }
    /// Kernels per step: embed; per layer 2 norms, 4 GEMVs, rope, attention, silu; final norm,
    /// LM head, argmax.
    fn kernels_per_token(&self) -> usize {
        1 + self.layers * 9 + 3
    }
}

/// The typed kernels.
struct Kernels {
    init_uniform: Kernel<(*mut f32, u64, u32, f32)>,
    fill: Kernel<(*mut f32, u64, f32)>,
    embed: Kernel<(*const f32, *const i32, *const i32, *mut f32, i32)>,
    rmsnorm: Kernel<(*const f32, *const f32, *mut f32, i32)>,
    rope_append: Kernel<(*mut f32, *const i32, *mut f32, *mut f32, i32, i32)>,
    attention: Kernel<(
        *const f32,
        *const f32,
        *const f32,
        *const i32,
        *mut f32,
        i32,
        i32,
    )>,
    silu_mul: Kernel<(*const f32, *mut f32, i32)>,
    argmax_next: Kernel<(*const f32, i32, *mut i32, *mut i32, i32)>,
    countdown: Kernel<(ConditionalHandle, *mut i32)>,
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

/// The model and the step's working buffers, on the device.
struct Model {
    cfg: Config,
    layers: Vec<Layer>,
    embedding: DeviceBuffer<f32>,
    final_norm: DeviceBuffer<f32>,
    lm_head: DeviceBuffer<f32>,
    x: DeviceBuffer<f32>,
    h: DeviceBuffer<f32>,
    qkv: DeviceBuffer<f32>,
    attn: DeviceBuffer<f32>,
    gu: DeviceBuffer<f32>,
    act: DeviceBuffer<f32>,
    logits: DeviceBuffer<f32>,
    tokens: DeviceBuffer<i32>,
    pos: DeviceBuffer<i32>,
    remaining: DeviceBuffer<i32>,
}

/// A cuBLAS handle, destroyed on drop.
struct Cublas(blas_sys::cublasHandle_t);

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: made by `create_handle`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

impl Cublas {
    /// Directs the handle's work to `stream` (a capture's stream records it).
    fn on(&self, stream: &Stream) -> Result<(), Box<dyn Error>> {
        // SAFETY: the handle is live; the stream outlives the work issued on it.
        unsafe { blas::set_stream(self.0, stream.as_raw() as blas_sys::cudaStream_t)? };
        Ok(())
    }

    /// `y = W x + beta y`, `W` row-major `rows × cols` (column-major `cols × rows`, transposed).
    fn gemv(
        &self,
        w: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        x: &DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        beta: f32,
    ) -> Result<(), Box<dyn Error>> {
        debug_assert!(w.len() == rows * cols && x.len() >= cols && y.len() >= rows);
        let one = 1f32;
        // SAFETY: the buffers hold the sizes asserted above and outlive every launch of the
        // graphs this is captured into (the model owns them); alpha and beta are read now.
        unsafe {
            blas_sys::cublasSgemv_v2(
                self.0,
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                cols as i32,
                rows as i32,
                &one,
                w.as_raw() as *const f32,
                cols as i32,
                x.as_raw() as *const f32,
                1,
                &beta,
                y.as_raw() as *mut f32,
                1,
            )
            .result()?;
        }
        Ok(())
    }
}

fn cfg1(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (1, 1, 1),
        block: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Model {
    fn new(
        device: &Device,
        k: &Kernels,
        cfg: Config,
        stream: &Stream,
    ) -> cuda_graph::Result<Model> {
        let d = cfg.d;
        let mut seed = 1u32;
        let mut random = |len: usize, scale: f32| -> cuda_graph::Result<DeviceBuffer<f32>> {
            let buf = device.alloc_zeroed::<f32>(len)?;
            seed += 1;
            stream.launch(
                &k.init_uniform,
                LaunchConfig::for_num_elems(len.min(1 << 24) as u32),
                (&buf, len as u64, seed, scale),
            )?;
            Ok(buf)
        };
        let ones = |len: usize| -> cuda_graph::Result<DeviceBuffer<f32>> {
            let buf = device.alloc_zeroed::<f32>(len)?;
            stream.launch(
                &k.fill,
                LaunchConfig::for_num_elems(len as u32),
                (&buf, len as u64, 1f32),
            )?;
            Ok(buf)
        };
        let w = 1.0 / (d as f32).sqrt();
        let mut layers = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            layers.push(Layer {
                attn_norm: ones(d)?,
                wqkv: random(3 * d * d, w)?,
                wo: random(d * d, w)?,
                mlp_norm: ones(d)?,
                w_gate_up: random(2 * cfg.mlp * d, w)?,
                w_down: random(d * cfg.mlp, 1.0 / (cfg.mlp as f32).sqrt())?,
                k_cache: device.alloc_zeroed::<f32>(MAX_T * d)?,
                v_cache: device.alloc_zeroed::<f32>(MAX_T * d)?,
            });
        }
        let model = Model {
            embedding: random(cfg.vocab * d, 1.0)?,
            final_norm: ones(d)?,
            lm_head: random(cfg.vocab * d, w)?,
            layers,
            x: device.alloc_zeroed(d)?,
            h: device.alloc_zeroed(d)?,
            qkv: device.alloc_zeroed(3 * d)?,
            attn: device.alloc_zeroed(d)?,
            gu: device.alloc_zeroed(2 * cfg.mlp)?,
            act: device.alloc_zeroed(cfg.mlp)?,
            logits: device.alloc_zeroed(cfg.vocab)?,
            tokens: device.alloc_zeroed(MAX_T)?,
            pos: device.alloc_zeroed(1)?,
            remaining: device.alloc_zeroed(1)?,
            cfg,
        };
        stream.synchronize()?;
        Ok(model)
    }

    /// Back to the prompt: position 0, the prompt's tokens, nothing generated.
    fn reset(&self) -> cuda_graph::Result<()> {
        let mut tokens = vec![0i32; MAX_T];
        for (i, t) in tokens.iter_mut().take(PROMPT).enumerate() {
            *t = ((i * 7919 + 13) % self.cfg.vocab) as i32;
        }
        self.tokens.copy_from(&tokens)?;
        self.pos.copy_from(&[0])?;
        self.remaining.copy_from(&[STEPS as i32])?;
        Ok(())
    }

    /// One step — the token at `pos` in, the next token and `pos + 1` out — issued on `s`
    /// (a plain stream, or a capture's or a body's stream).
    fn step(&self, k: &Kernels, blas: &Cublas, s: &Stream) -> Result<(), Box<dyn Error>> {
        let c = self.cfg;
        let (d, hd) = (c.d as i32, c.head_dim() as i32);
        s.launch(
            &k.embed,
            cfg1(256),
            (&self.embedding, &self.tokens, &self.pos, &self.x, d),
        )?;
        let attention = LaunchConfig {
            grid: (c.heads as u32, 1, 1),
            block: (256, 1, 1),
            shared_mem_bytes: (MAX_T * 4) as u32,
        };
        for l in &self.layers {
            s.launch(&k.rmsnorm, cfg1(1024), (&self.x, &l.attn_norm, &self.h, d))?;
            blas.gemv(&l.wqkv, 3 * c.d, c.d, &self.h, &self.qkv, 0.0)?;
            s.launch(
                &k.rope_append,
                cfg1(512),
                (&self.qkv, &self.pos, &l.k_cache, &l.v_cache, d, hd),
            )?;
            s.launch(
                &k.attention,
                attention,
                (
                    &self.qkv, &l.k_cache, &l.v_cache, &self.pos, &self.attn, d, hd,
                ),
            )?;
            blas.gemv(&l.wo, c.d, c.d, &self.attn, &self.x, 1.0)?; // + residual
            s.launch(&k.rmsnorm, cfg1(1024), (&self.x, &l.mlp_norm, &self.h, d))?;
            blas.gemv(&l.w_gate_up, 2 * c.mlp, c.d, &self.h, &self.gu, 0.0)?;
            s.launch(
                &k.silu_mul,
                LaunchConfig::for_num_elems(c.mlp as u32),
                (&self.gu, &self.act, c.mlp as i32),
            )?;
            blas.gemv(&l.w_down, c.d, c.mlp, &self.act, &self.x, 1.0)?; // + residual
        }
        s.launch(
            &k.rmsnorm,
            cfg1(1024),
            (&self.x, &self.final_norm, &self.h, d),
        )?;
        blas.gemv(&self.lm_head, c.vocab, c.d, &self.h, &self.logits, 0.0)?;
        s.launch(
            &k.argmax_next,
            cfg1(1024),
            (
                &self.logits,
                c.vocab as i32,
                &self.tokens,
                &self.pos,
                PROMPT as i32,
            ),
        )?;
        Ok(())
    }
}

/// One run of one mode: the generated tokens and the times.
struct Run {
    tokens: Vec<i32>,
    /// Wall time of the whole decode, issue to last token, seconds.
    wall: f64,
    /// Host time spent issuing the steps (capture, update, launch calls), seconds.
    host: f64,
    /// GPU time of the whole decode (events), milliseconds.
    gpu_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Eager,
    CapturePerStep,
    StaticGraph,
    OnDevice,
}

impl Mode {
    const ALL: [Mode; 4] = [
        Mode::Eager,
        Mode::CapturePerStep,
        Mode::StaticGraph,
        Mode::OnDevice,
    ];
    fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::CapturePerStep => "capture-per-step",
            Mode::StaticGraph => "static-graph",
            Mode::OnDevice => "on-device",
        }
    }
}

struct Bench<'a> {
    device: &'a Device,
    k: &'a Kernels,
    blas: &'a Cublas,
    stream: Stream,
    start: Event,
    end: Event,
}

impl Bench<'_> {
    fn run(&self, m: &Model, mode: Mode) -> Result<Run, Box<dyn Error>> {
        let s = &self.stream;
        m.reset()?;
        // What a mode prepares before its loop (captures, instantiation, upload) is not timed:
        // it is made once and replayed for every request.
        let prepared: Option<Graph> = match mode {
            Mode::StaticGraph => {
                let b = s.create_graph_builder().begin_building(ThreadLocal)?;
                self.blas.on(b.stream())?;
                m.step(self.k, self.blas, b.stream())?;
                let g = b
                    .end_building()?
                    .instantiate_with(&InstantiateOptions::new().upload_on(s))?;
                Some(g)
            }
            Mode::OnDevice => {
                let b = s.create_graph_builder().begin_building(ThreadLocal)?;
                let h = b.create_conditional_handle(Some(1))?;
                {
                    let body = b.add_while(&h)?.begin_building(ThreadLocal)?;
                    self.blas.on(body.stream())?;
                    m.step(self.k, self.blas, body.stream())?;
                    body.stream().launch(
                        &self.k.countdown,
                        LaunchConfig::single(),
                        (h, &m.remaining),
                    )?;
                    body.end_building()?;
                }
                Some(
                    b.end_building()?
                        .instantiate_with(&InstantiateOptions::new().upload_on(s))?,
                )
            }
            _ => None,
        };
        self.blas.on(s)?;
        s.synchronize()?;
        let mut cache = GraphCache::new(InstantiateOptions::new());
        let mut host = 0f64;
        let t0 = Instant::now();
        s.record(&self.start)?;
        match mode {
            Mode::Eager => {
                for _ in 0..STEPS {
                    let t = Instant::now();
                    m.step(self.k, self.blas, s)?;
                    host += t.elapsed().as_secs_f64();
                }
            }
            Mode::CapturePerStep => {
                for _ in 0..STEPS {
                    let t = Instant::now();
                    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
                    self.blas.on(b.stream())?;
                    m.step(self.k, self.blas, b.stream())?;
                    let ended = b.end_building()?;
                    cache.refresh(&ended)?;
                    cache.launch(s)?;
                    host += t.elapsed().as_secs_f64();
                }
                self.blas.on(s)?;
            }
            Mode::StaticGraph => {
                let g = prepared.as_ref().expect("captured above");
                for _ in 0..STEPS {
                    let t = Instant::now();
                    g.launch(s)?;
                    host += t.elapsed().as_secs_f64();
                }
            }
            Mode::OnDevice => {
                let t = Instant::now();
                prepared.as_ref().expect("captured above").launch(s)?;
                host += t.elapsed().as_secs_f64();
            }
        }
        s.record(&self.end)?;
        s.synchronize()?;
        let wall = t0.elapsed().as_secs_f64();
        let gpu_ms = f64::from(self.start.elapsed_ms(&self.end)?);
        if mode == Mode::CapturePerStep && cache.instantiations() != 1 {
            eprintln!(
                "decode: capture per step instantiated {} times, updated {}",
                cache.instantiations(),
                cache.updates()
            );
        }
        let _ = self.device;
        Ok(Run {
            tokens: m.tokens.to_vec()?,
            wall,
            host,
            gpu_ms,
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn checksum(tokens: &[i32]) -> u64 {
    tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ t as u32 as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map(String::as_str).unwrap_or("all");
    let runs: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(5).max(1);
    let configs: Vec<Config> = match which {
        "tiny" => vec![TINY],
        "small" => vec![SMALL],
        _ => vec![TINY, SMALL],
    };
    let device = Device::new(0)?;
    #[cfg(feature = "dynamic-loading")]
    {
        // SAFETY: only asks whether the library can be opened.
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(
                "libcublas could not be loaded: run with LD_LIBRARY_PATH=/usr/local/cuda/lib64"
                    .into(),
            );
        }
    }
    let (major, minor) = device.compute_capability()?;
    let module = device.compile_with(KERNELS, &["-std=c++17", "-default-device"])?;
    // SAFETY: these are the parameter lists of kernels.cu. Each kernel stays within the sizes
    // the model gives it (`Model::step` passes the buffers those sizes were made for).
    let k = unsafe {
        Kernels {
            init_uniform: module.kernel("init_uniform")?,
            fill: module.kernel("fill")?,
            embed: module.kernel("embed")?,
            rmsnorm: module.kernel("rmsnorm")?,
            rope_append: module.kernel("rope_append")?,
            attention: module.kernel("attention")?,
            silu_mul: module.kernel("silu_mul")?,
            argmax_next: module.kernel("argmax_next")?,
            countdown: module.kernel("countdown")?,
        }
    };
    let blas = Cublas(blas::create_handle()?);
    let workspace = device.alloc_zeroed::<u8>(32 << 20)?;
    // SAFETY: a workspace of this size that outlives every cuBLAS call (graph captures need one
    // set, so that cuBLAS allocates nothing while capturing).
    unsafe {
        blas_sys::cublasSetWorkspace_v2(
            blas.0,
            workspace.as_raw() as *mut std::ffi::c_void,
            workspace.byte_len(),
        )
        .result()?;
    }
    let timing = EventOptions::default().timing(true);
    let bench = Bench {
        device: &device,
        k: &k,
        blas: &blas,
        stream: device.create_stream()?,
        start: device.create_event_with(&timing)?,
        end: device.create_event_with(&timing)?,
    };
    println!(
        "# {} (sm_{major}{minor}), driver {}; fp32, batch 1, {PROMPT}-token prompt + {GENERATE} generated, {STEPS} steps; medians of {runs} runs",
        device.name()?,
        cuda_graph::driver_version()?
    );
    println!("config,mode,tok_per_s,host_us_per_token,gpu_us_per_token,kernels_per_token,checksum");
    for cfg in configs {
        if cfg.head_dim() > 128 || cfg.head_dim() % 2 != 0 {
            return Err(format!(
                "{}: heads of {} dimensions (the kernels take even ones up to 128)",
                cfg.name,
                cfg.head_dim()
            )
            .into());
        }
        let model = Model::new(&device, &k, cfg, &bench.stream)?;
        let mut reference: Option<Vec<i32>> = None;
        for mode in Mode::ALL {
            bench.run(&model, mode)?; // warm-up: cuBLAS's first calls, the module's first launches
            let mut results = Vec::new();
            for _ in 0..runs {
                results.push(bench.run(&model, mode)?);
            }
            let tokens = results[0].tokens.clone();
            if results.iter().any(|r| r.tokens != tokens) {
                return Err(format!(
                    "{} {}: runs generated different tokens",
                    cfg.name,
                    mode.name()
                )
                .into());
            }
            match &reference {
                None => reference = Some(tokens.clone()),
                Some(want) if *want != tokens => {
                    return Err(format!(
                        "{} {}: tokens differ from eager's (first at {})",
                        cfg.name,
                        mode.name(),
                        want.iter()
                            .zip(&tokens)
                            .position(|(a, b)| a != b)
                            .unwrap_or(0)
                    )
                    .into())
                }
                Some(_) => {}
            }
            let steps = STEPS as f64;
            let wall = median(results.iter().map(|r| r.wall).collect());
            let host = median(results.iter().map(|r| r.host).collect());
            let gpu = median(results.iter().map(|r| r.gpu_ms).collect());
            println!(
                "decode,{},{},{:.1},{:.2},{:.1},{},{:016x}",
                cfg.name,
                mode.name(),
                steps / wall,
                host / steps * 1e6,
                gpu / steps * 1e3,
                cfg.kernels_per_token(),
                checksum(&tokens)
            );
        }
        let limit = 3.35e12 / cfg.weight_bytes() as f64;
        println!(
            "# {}: {:.0} MB of weights per token; at 3.35 TB/s (H100) at most {:.0} tok/s",
            cfg.name,
            cfg.weight_bytes() as f64 / 1e6,
            limit
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("decode: {e}");
            ExitCode::FAILURE
        }
    }
}
