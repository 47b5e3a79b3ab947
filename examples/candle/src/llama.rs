//! The llama2.c model in candle ops, shaped for capture: a static KV cache of `seq_len` rows per
//! layer, and the token and position in device tensors. One `step` reads the token and position,
//! writes the layer's key and value rows at the position (`scatter_set`, in place), attends over
//! every row with the rows past the position masked, picks the next token greedily on the device
//! (`argmax`), and writes it, the next position and the token history in place. Nothing in a step
//! depends on a host value that changes from step to step, so one captured step replays as every
//! step.

use candle_core::{DType, Device, Result, Tensor, D};

use crate::checkpoint::Weights;

struct Layer {
    rms_att: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    rms_ffn: Tensor,
    w1: Tensor,
    w2: Tensor,
    w3: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
}

/// The model and its decode state, all on one device.
pub struct Model {
    cfg: crate::checkpoint::Config,
    embedding: Tensor,
    classifier: Tensor,
    rms_final: Tensor,
    cos: Tensor,
    sin: Tensor,
    layers: Vec<Layer>,
    /// 0, 1, …, seq_len - 1 (u32): compared with the position for the mask.
    positions: Tensor,
    neg_inf: Tensor,
    one: Tensor,
    /// The current token and position (u32, one element each), and the tokens generated so far
    /// (u32, seq_len: entry p is the token generated at position p).
    pub token: Tensor,
    pub pos: Tensor,
    pub history: Tensor,
}

/// `w` (rows × cols, row-major: out × in) as the right-hand side of `x · wᵀ` (in × out).
fn linear(w: &[f32], rows: usize, cols: usize, dev: &Device) -> Result<Tensor> {
    Tensor::from_vec(w.to_vec(), (rows, cols), dev)?
        .t()?
        .contiguous()
}

fn rmsnorm(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let ss = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ss + 1e-5)?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)?.broadcast_mul(w)
}

fn softmax(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Rotary embedding of `x` (1 × heads·hs) with `cos`/`sin` (1 × hs/2): pairs (2i, 2i+1).
fn rope(x: &Tensor, heads: usize, hs: usize, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let x = x.reshape((heads, hs / 2, 2))?;
    let (x0, x1) = (x.narrow(2, 0, 1)?, x.narrow(2, 1, 1)?);
    let cos = cos.reshape((1, hs / 2, 1))?;
    let sin = sin.reshape((1, hs / 2, 1))?;
    let r0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
    let r1 = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
    Tensor::cat(&[r0, r1], 2)?.reshape((1, heads * hs))
}

impl Model {
    pub fn new(w: &Weights, dev: &Device) -> Result<Model> {
        let c = w.config;
        let (d, h, kv) = (c.dim, c.hidden_dim, c.kv_dim());
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            layers.push(Layer {
                rms_att: Tensor::from_vec(w.rms_att[l].clone(), d, dev)?,
                wq: linear(&w.wq[l], d, d, dev)?,
                wk: linear(&w.wk[l], kv, d, dev)?,
                wv: linear(&w.wv[l], kv, d, dev)?,
                wo: linear(&w.wo[l], d, d, dev)?,
                rms_ffn: Tensor::from_vec(w.rms_ffn[l].clone(), d, dev)?,
                w1: linear(&w.w1[l], h, d, dev)?,
                w2: linear(&w.w2[l], d, h, dev)?,
                w3: linear(&w.w3[l], h, d, dev)?,
                k_cache: Tensor::zeros((c.seq_len, kv), DType::F32, dev)?,
                v_cache: Tensor::zeros((c.seq_len, kv), DType::F32, dev)?,
            });
        }
        let half = c.head_size() / 2;
        Ok(Model {
            cfg: c,
            embedding: Tensor::from_vec(w.token_embedding.clone(), (c.vocab_size, d), dev)?,
            classifier: linear(&w.classifier, c.vocab_size, d, dev)?,
            rms_final: Tensor::from_vec(w.rms_final.clone(), d, dev)?,
            cos: Tensor::from_vec(w.freq_cis_real.clone(), (c.seq_len, half), dev)?,
            sin: Tensor::from_vec(w.freq_cis_imag.clone(), (c.seq_len, half), dev)?,
            layers,
            positions: Tensor::arange(0u32, c.seq_len as u32, dev)?,
            neg_inf: Tensor::new(&[f32::NEG_INFINITY], dev)?,
            one: Tensor::new(&[1u32], dev)?,
            token: Tensor::new(&[1u32], dev)?,
            pos: Tensor::new(&[0u32], dev)?,
            history: Tensor::zeros(c.seq_len, DType::U32, dev)?,
        })
    }

    /// Back to the start: token BOS, position 0, empty caches and history (in place).
    pub fn reset(&self) -> Result<()> {
        let dev = self.token.device();
        self.token.slice_set(&Tensor::new(&[1u32], dev)?, 0, 0)?;
        self.pos.slice_set(&Tensor::new(&[0u32], dev)?, 0, 0)?;
        self.history
            .slice_set(&Tensor::zeros(self.cfg.seq_len, DType::U32, dev)?, 0, 0)?;
        for l in &self.layers {
            let z = Tensor::zeros(l.k_cache.shape(), DType::F32, dev)?;
            l.k_cache.slice_set(&z, 0, 0)?;
            l.v_cache.slice_set(&z, 0, 0)?;
        }
        Ok(())
    }

    /// Every tensor a step reads or writes, for the graph to hold.
    pub fn tensors(&self) -> Vec<Tensor> {
        let mut v = vec![
            self.embedding.clone(),
            self.classifier.clone(),
            self.rms_final.clone(),
            self.cos.clone(),
            self.sin.clone(),
            self.positions.clone(),
            self.neg_inf.clone(),
            self.one.clone(),
            self.token.clone(),
            self.pos.clone(),
            self.history.clone(),
        ];
        for l in &self.layers {
            v.extend([
                l.rms_att.clone(),
                l.wq.clone(),
                l.wk.clone(),
                l.wv.clone(),
                l.wo.clone(),
                l.rms_ffn.clone(),
                l.w1.clone(),
                l.w2.clone(),
                l.w3.clone(),
                l.k_cache.clone(),
                l.v_cache.clone(),
            ]);
        }
        v
    }

    /// One decode step (see the module documentation). Every tensor it makes is dropped before
    /// it returns.
    pub fn step(&self) -> Result<()> {
        self.step_over(None)
    }

    /// One decode step that attends over the first `rows` cache rows only (`rows` = position + 1,
    /// known on the host), with no mask: the shapes of its attention change with every step, as
    /// an eager decoder's growing KV cache does.
    pub fn step_growing(&self, rows: usize) -> Result<()> {
        self.step_over(Some(rows.clamp(1, self.cfg.seq_len)))
    }

    fn step_over(&self, rows: Option<usize>) -> Result<()> {
        let c = self.cfg;
        let (hs, kv) = (c.head_size(), c.kv_dim());
        let group = c.n_heads / c.n_kv_heads;
        let len = rows.unwrap_or(c.seq_len);
        let mut x = self.embedding.index_select(&self.token, 0)?; // 1 × dim
        let cos = self.cos.index_select(&self.pos, 0)?; // 1 × hs/2
        let sin = self.sin.index_select(&self.pos, 0)?;
        let row = self
            .pos
            .reshape((1, 1))?
            .broadcast_as((1, kv))?
            .contiguous()?;
        let scores_shape = (c.n_kv_heads, group, len);
        // The static step masks the rows past the position; the growing one has none.
        let mask = match rows {
            Some(_) => None,
            None => Some((
                self.positions
                    .broadcast_gt(&self.pos)?
                    .reshape((1, 1, len))?
                    .broadcast_as(scores_shape)?,
                self.neg_inf
                    .reshape((1, 1, 1))?
                    .broadcast_as(scores_shape)?,
            )),
        };
        for l in &self.layers {
            let xb = rmsnorm(&x, &l.rms_att)?;
            let q = rope(&xb.matmul(&l.wq)?, c.n_heads, hs, &cos, &sin)?;
            let k = rope(&xb.matmul(&l.wk)?, c.n_kv_heads, hs, &cos, &sin)?;
            let v = xb.matmul(&l.wv)?;
            l.k_cache.scatter_set(&row, &k, 0)?;
            l.v_cache.scatter_set(&row, &v, 0)?;
            // len × kv → n_kv × len × hs
            let keys = l
                .k_cache
                .narrow(0, 0, len)?
                .reshape((len, c.n_kv_heads, hs))?
                .transpose(0, 1)?
                .contiguous()?;
            let values = l
                .v_cache
                .narrow(0, 0, len)?
                .reshape((len, c.n_kv_heads, hs))?
                .transpose(0, 1)?
                .contiguous()?;
            let q = q.reshape((c.n_kv_heads, group, hs))?;
            let scores = (q.matmul(&keys.transpose(1, 2)?.contiguous()?)? / (hs as f64).sqrt())?;
            let scores = match &mask {
                Some((masked, neg_inf)) => masked.where_cond(neg_inf, &scores)?,
                None => scores,
            };
            let att = softmax(&scores)?.matmul(&values)?; // n_kv × group × hs
            x = (x + att.reshape((1, c.dim))?.matmul(&l.wo)?)?;
            let xb = rmsnorm(&x, &l.rms_ffn)?;
            let h = (xb.matmul(&l.w1)?.silu()? * xb.matmul(&l.w3)?)?;
            x = (x + h.matmul(&l.w2)?)?;
        }
        let logits = rmsnorm(&x, &self.rms_final)?.matmul(&self.classifier)?; // 1 × vocab
        let next = logits.argmax_keepdim(D::Minus1)?.reshape(1)?; // u32
        self.history.scatter_set(&self.pos, &next, 0)?;
        self.token.slice_set(&next, 0, 0)?;
        let next_pos = self.pos.broadcast_add(&self.one)?;
        self.pos.slice_set(&next_pos, 0, 0)?;
        Ok(())
    }

    /// The tokens generated so far (`n` of them).
    pub fn tokens(&self, n: usize) -> Result<Vec<u32>> {
        Ok(self.history.narrow(0, 0, n)?.to_vec1::<u32>()?)
    }
}
