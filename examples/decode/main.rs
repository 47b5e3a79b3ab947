//! A transformer decode loop on CUDA graphs: a GPT-style decoder (random weights made on the
//! device from a fixed seed) generates tokens four ways, which must agree token for token:
//!
//! 1. **eager** — every kernel and GEMV launched on a stream;
//! 2. **capture per step** — each step captured again and handed to a [`GraphCache`], which
//!    updates its exec in place (or instantiates when the topology changed);
//! 3. **static graph** — one step captured once; the position lives in device memory, so every
//!    step is one `Graph::launch`;
//! 4. **on the device** — one graph launch generates every token: a WHILE node whose body is
//!    [`BODY_STEPS`] steps, the argmax feeding the next step and ending the loop when the cache
//!    is full (the steps left over run before the loop, in the same graph).
//!
//! ```text
//! cargo run --release --example decode --features nvrtc [-- tiny|small|all [RUNS] [--kernels cublas|fused|both] [--pdl on|off]]
//! ```
//!
//! Per layer: RMSNorm, fused QKV projection, rotary embedding with the K/V cache append,
//! attention of the new token over the cache, output projection with the residual, RMSNorm, a
//! SiLU-gated MLP (fused gate/up projection) with the residual; then the final norm, the LM head
//! and the argmax on the device. Two kernel sets do that math (`--kernels`, default `both`):
//!
//! - **cublas** — the GEMVs are cuBLAS's (`cublasSgemv`, on the crate's stream: captured with
//!   everything else), the other kernels typed [`Kernel`]s compiled by NVRTC; 3 + 9 · layers
//!   kernels per token, the structure of the PyTorch peer.
//! - **fused** — typed [`Kernel`]s only, no cuBLAS: each RMSNorm folded into the GEMV that reads
//!   it, the SiLU into the gate/up GEMV, each residual into its GEMV, the rotary embedding and the
//!   cache append into the attention, the argmax into the LM head; 2 + 5 · layers kernels.
//! - **fused+pdl** — the fused kernels as programmatic dependent launches
//!   ([`Stream::launch_dependent`], on by default on compute capability 9.0, `--pdl off` to
//!   skip): each kernel lets the next begin at once and waits for the one before it before it
//!   touches global memory (compiled with `-DPDL`), so launch gaps overlap kernel tails.
//!
//! fp32, batch 1, a 16-token prompt fed token by token, 256 tokens generated. The four modes
//! must generate the same tokens within a kernel set; the two sets sum in different orders, so
//! their tokens may differ from each other.
//!
//! Prints one CSV row per configuration, mode and kernel set (`decode,<config>,<mode>,...`):
//! tokens per second, host time to issue one token (µs), GPU time per token (µs, events), kernels
//! per token, a checksum of the tokens and the kernel set; the medians of RUNS runs (default 5).
//! Needs a CUDA driver, NVRTC and, for the cublas set, cuBLAS
//! (`LD_LIBRARY_PATH=/usr/local/cuda/lib64`); without them it prints one line and exits with
//! status 1.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use cuda_graph::prelude::*;

use cuda_graph::{DependentKernel, EventOptions};
use cudarc::cublas::{result as blas, sys as blas_sys};

const KERNELS: &str = include_str!("kernels.cu");
const PROMPT: usize = 16;
const GENERATE: usize = 256;
/// Cache rows: every position a step reads or writes.
const MAX_T: usize = PROMPT + GENERATE;
/// Steps: each consumes the token at its position and yields the next (the prompt's last step
/// yields the first generated token).
const STEPS: usize = PROMPT + GENERATE - 1;
/// Steps per iteration of the on-device mode's WHILE node. Each iteration costs the node a few
/// microseconds of its own (evaluating the condition, launching the body), so the body holds
/// several steps and that cost is paid once per eight tokens; `STEPS % BODY_STEPS` steps run
/// before the loop, in the same graph. The loop's condition is set by the body's last step.
const BODY_STEPS: usize = 8;

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
    /// Kernels per step. cublas: embed; per layer 2 norms, 4 GEMVs, rope, attention, silu;
    /// final norm, LM head, argmax. fused: embed; per layer norm + QKV, rope + attention, output
    /// projection + residual, norm + gate/up + SiLU, down projection + residual; norm + LM head +
    /// argmax.
    /// On the device the cublas set adds its loop-condition kernel once per WHILE iteration
    /// ([`BODY_STEPS`] steps); the fused set's LM head sets the condition itself.
    fn kernels_per_token(&self, set: KernelSet, mode: Mode) -> f64 {
        let condition = if mode == Mode::OnDevice && set == KernelSet::Cublas {
            1.0 / BODY_STEPS as f64
        } else {
            0.0
        };
        condition
            + match set {
                KernelSet::Cublas => 1 + self.layers * 9 + 3,
                KernelSet::Fused | KernelSet::FusedPdl => 1 + self.layers * 5 + 1,
            } as f64
    }
}

/// Which kernels do a step's math.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KernelSet {
    /// cuBLAS GEMVs between NVRTC kernels: the PyTorch peer's structure.
    Cublas,
    /// NVRTC kernels only, norms, activations, residuals and the argmax fused into the GEMVs.
    Fused,
    /// The fused kernels as programmatic dependent launches (`--pdl on`, compute capability
    /// 9.0): each may begin while the one before it ends.
    FusedPdl,
}

impl KernelSet {
    fn name(self) -> &'static str {
        match self {
            KernelSet::Cublas => "cublas",
            KernelSet::Fused => "fused",
            KernelSet::FusedPdl => "fused+pdl",
        }
    }
}

/// Threads per block of the fused GEMVs: 8 warps, a warp to a row at a time.
const GEMV_THREADS: u32 = 256;
/// Blocks at most of a fused GEMV: 4 per SM of an H100 (132 SMs), as many as stay resident at
/// the kernels' register use; more rows are taken in turn by the same warps. Also the length of
/// the LM head's per-block partials.
const GEMV_MAX_BLOCKS: usize = 4 * 132;
/// Threads of the fused attention's block (one block per head): 32 warps, so that each walks
/// few cache rows (a head's block is alone on its SM; 8 warps took about 27 µs a layer on small).
const ATTENTION_THREADS: u32 = 1024;

/// The fused set's launches for one configuration, checked once on the host: row lengths that
/// are multiples of 4 (float4 loads), shared memory within the 48 KiB a launch gets without
/// opting in, sizes that fit the kernels' `int`s.
struct Fused {
    qkv: LaunchConfig,
    gate_up: LaunchConfig,
    wo: LaunchConfig,
    down: LaunchConfig,
    attention: LaunchConfig,
    lm_head: LaunchConfig,
}

impl Fused {
    fn new(c: &Config) -> Result<Fused, Box<dyn Error>> {
        if !c.d.is_multiple_of(4) || !c.mlp.is_multiple_of(4) {
            return Err(format!(
                "{}: the fused kernels read rows as float4: d ({}) and mlp ({}) must be multiples of 4",
                c.name, c.d, c.mlp
            )
            .into());
        }
        if c.heads == 0 || !c.d.is_multiple_of(c.heads) {
            return Err(format!(
                "{}: d ({}) is not a multiple of heads ({})",
                c.name, c.d, c.heads
            )
            .into());
        }
        for (what, n) in [("3·d", 3 * c.d), ("2·mlp", 2 * c.mlp), ("vocab", c.vocab)] {
            if i32::try_from(n).is_err() {
                return Err(format!("{}: {what} ({n}) exceeds the kernels' int", c.name).into());
            }
        }
        Ok(Fused {
            qkv: rows_launch(3 * c.d, c.d)?,
            gate_up: rows_launch(c.mlp, c.d)?,
            wo: rows_launch(c.d, 0)?,
            down: rows_launch(c.d, 0)?,
            attention: LaunchConfig {
                grid: (u32::try_from(c.heads)?, 1, 1),
                block: (ATTENTION_THREADS, 1, 1),
                shared_mem_bytes: shared_bytes(MAX_T)?,
                ..LaunchConfig::single()
            },
            lm_head: rows_launch(c.vocab, c.d)?,
        })
    }
}

/// Bytes of `floats` f32s of dynamic shared memory, at most the 48 KiB any launch may ask for.
fn shared_bytes(floats: usize) -> Result<u32, Box<dyn Error>> {
    floats
        .checked_mul(4)
        .filter(|&b| b <= 48 << 10)
        .and_then(|b| u32::try_from(b).ok())
        .ok_or_else(|| format!("{floats} floats of shared memory exceed 48 KiB").into())
}

/// A fused GEMV over `rows` rows (a warp to a row, up to [`GEMV_MAX_BLOCKS`] blocks) keeping
/// `shared_floats` floats in shared memory.
fn rows_launch(rows: usize, shared_floats: usize) -> Result<LaunchConfig, Box<dyn Error>> {
    let warps = (GEMV_THREADS / 32) as usize;
    let blocks = rows.div_ceil(warps).clamp(1, GEMV_MAX_BLOCKS);
    Ok(LaunchConfig {
        grid: (u32::try_from(blocks)?, 1, 1),
        block: (GEMV_THREADS, 1, 1),
        shared_mem_bytes: shared_bytes(shared_floats)?,
        ..LaunchConfig::single()
    })
}

/// The kernels a step runs: cuBLAS's GEMVs with the set's other kernels, or the fused set.
#[derive(Clone, Copy)]
enum Path<'a> {
    Cublas(&'a Cublas),
    /// The fused kernels' launches, and their dependent forms where they are launched so.
    Fused(&'a Fused, Option<&'a PdlKernels>),
}

impl Path<'_> {
    /// Directs cuBLAS's work to `stream`, where this path uses cuBLAS.
    fn on(&self, stream: &Stream) -> Result<(), Box<dyn Error>> {
        match self {
            Path::Cublas(blas) => blas.on(stream),
            Path::Fused(..) => Ok(()),
        }
    }
}

/// `rope_attention(qkv, pos, k_cache, v_cache, out, d, head_dim, max_t)`.
type RopeAttention = Kernel<RopeAttentionSig>;
type RopeAttentionSig = (
    *const f32,
    *const i32,
    *mut f32,
    *mut f32,
    *mut f32,
    i32,
    i32,
    i32,
);
/// `lm_head_argmax(w, x, norm_w, vocab, cols, part_v, part_i, tokens, pos, prompt_len, max_t)`.
type LmHeadArgmax = Kernel<LmHeadArgmaxSig>;
type LmHeadArgmaxSig = (
    *const f32,
    *const f32,
    *const f32,
    i32,
    i32,
    *mut f32,
    *mut i32,
    *mut i32,
    *mut i32,
    i32,
    i32,
);
/// `lm_head_argmax_while`: `lm_head_argmax`'s parameters and the WHILE node's handle.
type LmHeadArgmaxWhile = Kernel<LmHeadArgmaxWhileSig>;
type LmHeadArgmaxWhileSig = (
    *const f32,
    *const f32,
    *const f32,
    i32,
    i32,
    *mut f32,
    *mut i32,
    *mut i32,
    *mut i32,
    i32,
    i32,
    ConditionalHandle,
);

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
    /// Sets a WHILE node's condition: true while the cache has a row for the next step.
    while_room: Kernel<(ConditionalHandle, *const i32, i32)>,
    /// `y = W · (rmsnorm(x) ∘ norm_w)`: (w, x, norm_w, y, rows, cols).
    rms_gemv: Kernel<(*const f32, *const f32, *const f32, *mut f32, i32, i32)>,
    /// `act = silu(W_gate h) ∘ (W_up h)`, `h = rmsnorm(x) ∘ norm_w`: (w_gate_up, x, norm_w, act,
    /// mlp, cols).
    rms_gate_up_silu: Kernel<(*const f32, *const f32, *const f32, *mut f32, i32, i32)>,
    /// `x += W a`: (w, a, x, rows, cols).
    gemv_residual: Kernel<(*const f32, *const f32, *mut f32, i32, i32)>,
    /// rope_append + attention: (qkv, pos, k_cache, v_cache, out, d, head_dim, max_t).
    rope_attention: RopeAttention,
    /// Final norm, LM head and argmax_next: (w, x, norm_w, vocab, cols, part_v, part_i,
    /// tokens, pos, prompt_len, max_t); `part_i`'s entry past the grid counts arriving blocks.
    lm_head_argmax: LmHeadArgmax,
    /// `lm_head_argmax` ending a WHILE body: it also sets the loop's condition.
    lm_head_argmax_while: LmHeadArgmaxWhile,
}

/// `(w, x, norm_w, y, rows, cols)`: `rms_gemv` and `rms_gate_up_silu`.
type RmsGemvSig = (*const f32, *const f32, *const f32, *mut f32, i32, i32);

/// The fused step's kernels from the module compiled with `-DPDL` (`--pdl on`): each waits for
/// the kernel before it before touching global memory (`pdl_entry` in kernels.cu), so each may
/// be a programmatic dependent launch.
struct PdlKernels {
    embed: DependentKernel<(*const f32, *const i32, *const i32, *mut f32, i32)>,
    rms_gemv: DependentKernel<RmsGemvSig>,
    rms_gate_up_silu: DependentKernel<RmsGemvSig>,
    gemv_residual: DependentKernel<(*const f32, *const f32, *mut f32, i32, i32)>,
    rope_attention: DependentKernel<RopeAttentionSig>,
    lm_head_argmax: DependentKernel<LmHeadArgmaxSig>,
    lm_head_argmax_while: DependentKernel<LmHeadArgmaxWhileSig>,
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
    /// The fused LM head's best value per block ([`GEMV_MAX_BLOCKS`]).
    part_v: DeviceBuffer<f32>,
    /// The fused LM head's best index per block, then its count of finished blocks (at the
    /// grid's size; zero between launches: its last block sets it back).
    part_i: DeviceBuffer<i32>,
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
        ..LaunchConfig::single()
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
            part_v: device.alloc_zeroed(GEMV_MAX_BLOCKS)?,
            part_i: device.alloc_zeroed(GEMV_MAX_BLOCKS + 1)?,
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
        Ok(())
    }

    /// One step — the token at `pos` in, the next token and `pos + 1` out — issued on `s`
    /// (a plain stream, or a capture's or a body's stream) with the path's kernels.
    fn step(&self, k: &Kernels, path: Path<'_>, s: &Stream) -> Result<(), Box<dyn Error>> {
        match path {
            Path::Cublas(blas) => self.step_cublas(k, blas, s),
            Path::Fused(f, pdl) => self.step_fused(k, f, pdl, s, None),
        }
    }

    /// [`Model::step`] as a WHILE body (on a body's stream): it also sets the loop's condition
    /// through `h`, true while the cache has a row for the next step. The fused set does it in
    /// its last kernel; the cublas set launches `while_room` after the step.
    fn step_in_while(
        &self,
        k: &Kernels,
        path: Path<'_>,
        s: &Stream,
        h: ConditionalHandle,
    ) -> Result<(), Box<dyn Error>> {
        match path {
            Path::Cublas(blas) => {
                self.step_cublas(k, blas, s)?;
                s.launch(
                    &k.while_room,
                    LaunchConfig::single(),
                    (h, &self.pos, MAX_T as i32),
                )?;
                Ok(())
            }
            Path::Fused(f, pdl) => self.step_fused(k, f, pdl, s, Some(h)),
        }
    }

    /// [`Model::step`] with the fused kernels: 2 + 5 · layers launches, no cuBLAS. With
    /// `until`, the last kernel also sets that WHILE node's condition.
    fn step_fused(
        &self,
        k: &Kernels,
        f: &Fused,
        pdl: Option<&PdlKernels>,
        s: &Stream,
        until: Option<ConditionalHandle>,
    ) -> Result<(), Box<dyn Error>> {
        // Each launch plain, or as a dependent launch of the kernel's waiting form.
        macro_rules! go {
            ($name:ident, $cfg:expr, $args:expr) => {
                match pdl {
                    Some(p) => s.launch_dependent(&p.$name, $cfg, $args),
                    None => s.launch(&k.$name, $cfg, $args),
                }
            };
        }
        let c = self.cfg;
        let (d, hd, mlp) = (c.d as i32, c.head_dim() as i32, c.mlp as i32);
        go!(
            embed,
            cfg1(256),
            (&self.embedding, &self.tokens, &self.pos, &self.x, d)
        )?;
        for l in &self.layers {
            go!(
                rms_gemv,
                f.qkv,
                (&l.wqkv, &self.x, &l.attn_norm, &self.qkv, 3 * d, d)
            )?;
            go!(
                rope_attention,
                f.attention,
                (
                    &self.qkv,
                    &self.pos,
                    &l.k_cache,
                    &l.v_cache,
                    &self.attn,
                    d,
                    hd,
                    MAX_T as i32,
                )
            )?;
            go!(gemv_residual, f.wo, (&l.wo, &self.attn, &self.x, d, d))?;
            go!(
                rms_gate_up_silu,
                f.gate_up,
                (&l.w_gate_up, &self.x, &l.mlp_norm, &self.act, mlp, d)
            )?;
            go!(
                gemv_residual,
                f.down,
                (&l.w_down, &self.act, &self.x, d, mlp)
            )?;
        }
        let blocks = f.lm_head.grid.0 as usize;
        if blocks > self.part_v.len() || blocks >= self.part_i.len() {
            return Err("the LM head's grid exceeds its partials".into());
        }
        let (w, x, norm, vocab) = (&self.lm_head, &self.x, &self.final_norm, c.vocab as i32);
        let (pv, pi, tokens, pos) = (&self.part_v, &self.part_i, &self.tokens, &self.pos);
        let (prompt, max_t) = (PROMPT as i32, MAX_T as i32);
        match until {
            None => go!(
                lm_head_argmax,
                f.lm_head,
                (w, x, norm, vocab, d, pv, pi, tokens, pos, prompt, max_t)
            )?,
            Some(h) => go!(
                lm_head_argmax_while,
                f.lm_head,
                (w, x, norm, vocab, d, pv, pi, tokens, pos, prompt, max_t, h)
            )?,
        }
        Ok(())
    }

    /// [`Model::step`] with cuBLAS's GEMVs.
    fn step_cublas(&self, k: &Kernels, blas: &Cublas, s: &Stream) -> Result<(), Box<dyn Error>> {
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
            ..LaunchConfig::single()
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
    stream: Stream,
    start: Event,
    end: Event,
}

impl Bench<'_> {
    fn run(&self, m: &Model, mode: Mode, path: Path<'_>) -> Result<Run, Box<dyn Error>> {
        let s = &self.stream;
        m.reset()?;
        // What a mode prepares before its loop (captures, instantiation, upload) is not timed:
        // it is made once and replayed for every request.
        let prepared: Option<Graph> = match mode {
            Mode::StaticGraph => {
                let b = s.create_graph_builder().begin_building(ThreadLocal)?;
                path.on(b.stream())?;
                m.step(self.k, path, b.stream())?;
                let g = b
                    .end_building()?
                    .instantiate_with(&InstantiateOptions::new().upload_on(s))?;
                Some(g)
            }
            Mode::OnDevice => {
                let b = s.create_graph_builder().begin_building(ThreadLocal)?;
                path.on(b.stream())?;
                for _ in 0..STEPS % BODY_STEPS {
                    m.step(self.k, path, b.stream())?;
                }
                let h = b.create_conditional_handle(Some(1))?;
                {
                    let body = b.add_while(&h)?.begin_building(ThreadLocal)?;
                    path.on(body.stream())?;
                    for _ in 1..BODY_STEPS {
                        m.step(self.k, path, body.stream())?;
                    }
                    m.step_in_while(self.k, path, body.stream(), h)?;
                    body.end_building()?;
                }
                Some(
                    b.end_building()?
                        .instantiate_with(&InstantiateOptions::new().upload_on(s))?,
                )
            }
            _ => None,
        };
        path.on(s)?;
        s.synchronize()?;
        let mut cache = GraphCache::new(InstantiateOptions::new());
        let mut host = 0f64;
        let t0 = Instant::now();
        s.record(&self.start)?;
        match mode {
            Mode::Eager => {
                for _ in 0..STEPS {
                    let t = Instant::now();
                    m.step(self.k, path, s)?;
                    host += t.elapsed().as_secs_f64();
                }
            }
            Mode::CapturePerStep => {
                for _ in 0..STEPS {
                    let t = Instant::now();
                    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
                    path.on(b.stream())?;
                    m.step(self.k, path, b.stream())?;
                    let ended = b.end_building()?;
                    cache.refresh(&ended)?;
                    cache.launch(s)?;
                    host += t.elapsed().as_secs_f64();
                }
                path.on(s)?;
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

/// What the command line asks for: `[tiny|small|all] [RUNS] [--kernels cublas|fused|both]`.
struct Args {
    configs: Vec<Config>,
    runs: usize,
    sets: Vec<KernelSet>,
    /// `--pdl on|off`; `None`: on where the device has compute capability 9.0.
    pdl: Option<bool>,
}

const USAGE: &str =
    "usage: decode [tiny|small|all] [RUNS] [--kernels cublas|fused|both] [--pdl on|off]";

impl Args {
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, Box<dyn Error>> {
        let mut positional = Vec::new();
        let mut kernels: Option<String> = None;
        let mut pdl = None;
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            if a == "--pdl" || a.starts_with("--pdl=") {
                let v = match a.strip_prefix("--pdl=") {
                    Some(v) => v.to_string(),
                    None => args
                        .next()
                        .ok_or_else(|| format!("--pdl needs on or off; {USAGE}"))?,
                };
                pdl = Some(match v.as_str() {
                    "on" => true,
                    "off" => false,
                    other => {
                        return Err(format!("--pdl takes on or off, not {other:?}; {USAGE}").into())
                    }
                });
            } else if a == "--kernels" {
                kernels = Some(
                    args.next()
                        .ok_or_else(|| format!("--kernels needs a value; {USAGE}"))?,
                );
            } else if let Some(v) = a.strip_prefix("--kernels=") {
                kernels = Some(v.to_string());
            } else if a.starts_with("--") {
                return Err(format!("unknown option {a}; {USAGE}").into());
            } else {
                positional.push(a);
            }
        }
        let configs = match positional.first().map(String::as_str).unwrap_or("all") {
            "tiny" => vec![TINY],
            "small" => vec![SMALL],
            "all" => vec![TINY, SMALL],
            other => return Err(format!("unknown configuration {other:?}; {USAGE}").into()),
        };
        let runs = match positional.get(1) {
            None => 5,
            Some(r) => r
                .parse::<usize>()
                .map_err(|_| format!("RUNS must be a whole number, not {r:?}; {USAGE}"))?
                .max(1),
        };
        if positional.len() > 2 {
            return Err(format!("too many arguments; {USAGE}").into());
        }
        let sets = match kernels.as_deref().unwrap_or("both") {
            "cublas" => vec![KernelSet::Cublas],
            "fused" => vec![KernelSet::Fused],
            "both" => vec![KernelSet::Cublas, KernelSet::Fused],
            other => return Err(format!("unknown kernel set {other:?}; {USAGE}").into()),
        };
        Ok(Args {
            configs,
            runs,
            sets,
            pdl,
        })
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let Args {
        configs,
        runs,
        mut sets,
        pdl,
    } = Args::parse(std::env::args().skip(1))?;
    let device = Device::new(0)?;
    let use_cublas = sets.contains(&KernelSet::Cublas);
    #[cfg(feature = "dynamic-loading")]
    {
        // SAFETY: only asks whether the library can be opened.
        if use_cublas && !unsafe { blas_sys::is_culib_present() } {
            return Err(
                "libcublas could not be loaded: run with LD_LIBRARY_PATH=/usr/local/cuda/lib64 (or --kernels fused)"
                    .into(),
            );
        }
    }
    let (major, minor) = device.compute_capability()?;
    let module = device.compile_with(KERNELS, &["-std=c++17", "-default-device"])?;
    // The fused set again as dependent launches, where the device can (compute capability 9.0).
    let pdl = match pdl {
        Some(true) if major < 9 => {
            return Err(format!(
                "--pdl on needs compute capability 9.0; this device is sm_{major}{minor}"
            )
            .into())
        }
        Some(on) => on,
        None => major >= 9,
    };
    if pdl {
        if let Some(i) = sets.iter().position(|s| *s == KernelSet::Fused) {
            sets.insert(i + 1, KernelSet::FusedPdl);
        }
    }
    let pdl_kernels = if sets.contains(&KernelSet::FusedPdl) {
        let m = device.compile_with(KERNELS, &["-std=c++17", "-default-device", "-DPDL"])?;
        // SAFETY: as for `k` below, the parameter lists of kernels.cu; compiled with PDL, each
        // of these kernels begins with `pdl_entry`, which waits for the kernel before it
        // (`griddepcontrol.wait`) before its first access to global memory.
        Some(unsafe {
            PdlKernels {
                embed: m.kernel("embed")?.dependent(),
                rms_gemv: m.kernel("rms_gemv")?.dependent(),
                rms_gate_up_silu: m.kernel("rms_gate_up_silu")?.dependent(),
                gemv_residual: m.kernel("gemv_residual")?.dependent(),
                rope_attention: m.kernel("rope_attention")?.dependent(),
                lm_head_argmax: m.kernel("lm_head_argmax")?.dependent(),
                lm_head_argmax_while: m.kernel("lm_head_argmax_while")?.dependent(),
            }
        })
    } else {
        None
    };
    // SAFETY: these are the parameter lists of kernels.cu. Each kernel stays within the sizes
    // the model gives it (`Model::step` passes the buffers those sizes were made for; the fused
    // launches are `Fused`'s, checked against the configuration).
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
            while_room: module.kernel("while_room")?,
            rms_gemv: module.kernel("rms_gemv")?,
            rms_gate_up_silu: module.kernel("rms_gate_up_silu")?,
            gemv_residual: module.kernel("gemv_residual")?,
            rope_attention: module.kernel("rope_attention")?,
            lm_head_argmax: module.kernel("lm_head_argmax")?,
            lm_head_argmax_while: module.kernel("lm_head_argmax_while")?,
        }
    };
    // cuBLAS only where the cublas set runs: the fused set does without it.
    let blas = if use_cublas {
        Some(Cublas(blas::create_handle()?))
    } else {
        None
    };
    let workspace = device.alloc_zeroed::<u8>(32 << 20)?;
    if let Some(blas) = &blas {
        // SAFETY: a workspace of this size that outlives every cuBLAS call (graph captures need
        // one set, so that cuBLAS allocates nothing while capturing).
        unsafe {
            blas_sys::cublasSetWorkspace_v2(
                blas.0,
                workspace.as_raw() as *mut std::ffi::c_void,
                workspace.byte_len(),
            )
            .result()?;
        }
    }
    let timing = EventOptions::default().timing(true);
    let bench = Bench {
        device: &device,
        k: &k,
        stream: device.create_stream()?,
        start: device.create_event_with(&timing)?,
        end: device.create_event_with(&timing)?,
    };
    println!(
        "# {} (sm_{major}{minor}), driver {}; fp32, batch 1, {PROMPT}-token prompt + {GENERATE} generated, {STEPS} steps; medians of {runs} runs",
        device.name()?,
        cuda_graph::driver_version()?
    );
    println!(
        "config,mode,tok_per_s,host_us_per_token,gpu_us_per_token,kernels_per_token,checksum,kernels"
    );
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
        let mut checksums = Vec::new();
        let mut fused_tokens: Option<Vec<i32>> = None;
        for &set in &sets {
            let fused;
            let path = match set {
                KernelSet::Cublas => Path::Cublas(blas.as_ref().ok_or("cuBLAS was not set up")?),
                KernelSet::Fused => {
                    fused = Fused::new(&cfg)?;
                    Path::Fused(&fused, None)
                }
                KernelSet::FusedPdl => {
                    fused = Fused::new(&cfg)?;
                    Path::Fused(&fused, Some(pdl_kernels.as_ref().ok_or("no PDL kernels")?))
                }
            };
            // The tokens every mode of this set must generate: eager's.
            let mut reference: Option<Vec<i32>> = None;
            for mode in Mode::ALL {
                // Warm-up: cuBLAS's first calls, the module's first launches.
                if let Err(e) = bench.run(&model, mode, path) {
                    if set != KernelSet::FusedPdl {
                        return Err(e);
                    }
                    // Dependent launches are new: a mode the driver refuses them in is reported
                    // and skipped, and the other rows still print.
                    println!(
                        "decode,{},{},error: {e},,,,,{}",
                        cfg.name,
                        mode.name(),
                        set.name()
                    );
                    continue;
                }
                let mut results = Vec::new();
                for _ in 0..runs {
                    results.push(bench.run(&model, mode, path)?);
                }
                let tokens = results[0].tokens.clone();
                if results.iter().any(|r| r.tokens != tokens) {
                    return Err(format!(
                        "{} {} {}: runs generated different tokens",
                        cfg.name,
                        set.name(),
                        mode.name()
                    )
                    .into());
                }
                match &reference {
                    None => reference = Some(tokens.clone()),
                    Some(want) if *want != tokens => {
                        return Err(format!(
                            "{} {} {}: tokens differ from eager's (first at {})",
                            cfg.name,
                            set.name(),
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
                    "decode,{},{},{:.1},{:.2},{:.1},{},{:016x},{}",
                    cfg.name,
                    mode.name(),
                    steps / wall,
                    host / steps * 1e6,
                    gpu / steps * 1e3,
                    cfg.kernels_per_token(set, mode),
                    checksum(&tokens),
                    set.name()
                );
            }
            if let Some(tokens) = &reference {
                checksums.push(format!("{} {:016x}", set.name(), checksum(tokens)));
                // The same kernels as dependent launches: the same tokens.
                match set {
                    KernelSet::Fused => fused_tokens = Some(tokens.clone()),
                    KernelSet::FusedPdl if fused_tokens.as_ref().is_some_and(|f| f != tokens) => {
                        return Err(format!(
                            "{}: the fused kernels generated other tokens as dependent launches",
                            cfg.name
                        )
                        .into())
                    }
                    _ => {}
                }
            }
        }
        let limit = 3.35e12 / cfg.weight_bytes() as f64;
        println!(
            "# {}: {:.0} MB of weights per token; at 3.35 TB/s (H100) at most {:.0} tok/s",
            cfg.name,
            cfg.weight_bytes() as f64 / 1e6,
            limit
        );
        println!(
            "# {}: checksums {} (the same in all four modes of a set, and with and without PDL; the sets sum in different orders)",
            cfg.name,
            checksums.join(", ")
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
