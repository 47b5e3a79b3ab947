//! llama2.c's forward pass on the CPU in plain Rust (a port of `run.c`, grouped-query attention
//! included): the independent check of the candle model's tokens.

use crate::checkpoint::Weights;

fn matvec(out: &mut [f32], w: &[f32], x: &[f32]) {
    let n = x.len();
    for (i, o) in out.iter_mut().enumerate() {
        *o = w[i * n..(i + 1) * n]
            .iter()
            .zip(x)
            .map(|(a, b)| a * b)
            .sum();
    }
}

fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32]) {
    let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + 1e-5;
    let inv = 1.0 / ss.sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = g * (inv * v);
    }
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// Greedy generation of `steps` tokens after BOS (token 1): the token ids, and for each step the
/// gap between the two largest logits (to tell a near tie from a real difference).
pub fn generate(w: &Weights, steps: usize) -> (Vec<u32>, Vec<f32>) {
    let c = w.config;
    let (d, hs, kv) = (c.dim, c.head_size(), c.kv_dim());
    let group = c.n_heads / c.n_kv_heads;
    let steps = steps.min(c.seq_len);
    let mut key_cache = vec![0f32; c.n_layers * c.seq_len * kv];
    let mut value_cache = vec![0f32; c.n_layers * c.seq_len * kv];
    let (mut x, mut xb, mut xb2) = (vec![0f32; d], vec![0f32; d], vec![0f32; d]);
    let (mut q, mut k, mut v) = (vec![0f32; d], vec![0f32; kv], vec![0f32; kv]);
    let (mut hb, mut hb2) = (vec![0f32; c.hidden_dim], vec![0f32; c.hidden_dim]);
    let mut att = vec![0f32; c.seq_len];
    let mut logits = vec![0f32; c.vocab_size];
    let mut token = 1usize;
    let (mut tokens, mut gaps) = (Vec::new(), Vec::new());
    for pos in 0..steps {
        x.copy_from_slice(&w.token_embedding[token * d..(token + 1) * d]);
        for l in 0..c.n_layers {
            rmsnorm(&mut xb, &x, &w.rms_att[l]);
            matvec(&mut q, &w.wq[l], &xb);
            matvec(&mut k, &w.wk[l], &xb);
            matvec(&mut v, &w.wv[l], &xb);
            let half = hs / 2;
            for (vec, n) in [(&mut q, d), (&mut k, kv)] {
                for i in (0..n).step_by(2) {
                    let j = (i % hs) / 2;
                    let (fr, fi) = (
                        w.freq_cis_real[pos * half + j],
                        w.freq_cis_imag[pos * half + j],
                    );
                    let (v0, v1) = (vec[i], vec[i + 1]);
                    vec[i] = v0 * fr - v1 * fi;
                    vec[i + 1] = v0 * fi + v1 * fr;
                }
            }
            let base = l * c.seq_len * kv;
            key_cache[base + pos * kv..base + (pos + 1) * kv].copy_from_slice(&k);
            value_cache[base + pos * kv..base + (pos + 1) * kv].copy_from_slice(&v);
            for h in 0..c.n_heads {
                let qh = &q[h * hs..(h + 1) * hs];
                let kvh = h / group;
                for t in 0..=pos {
                    let kt = &key_cache[base + t * kv + kvh * hs..base + t * kv + (kvh + 1) * hs];
                    att[t] =
                        qh.iter().zip(kt).map(|(a, b)| a * b).sum::<f32>() / (hs as f32).sqrt();
                }
                softmax(&mut att[..=pos]);
                let out = &mut xb[h * hs..(h + 1) * hs];
                out.fill(0.0);
                for t in 0..=pos {
                    let vt = &value_cache[base + t * kv + kvh * hs..base + t * kv + (kvh + 1) * hs];
                    for (o, vv) in out.iter_mut().zip(vt) {
                        *o += att[t] * vv;
                    }
                }
            }
            matvec(&mut xb2, &w.wo[l], &xb);
            for (a, b) in x.iter_mut().zip(&xb2) {
                *a += b;
            }
            rmsnorm(&mut xb, &x, &w.rms_ffn[l]);
            matvec(&mut hb, &w.w1[l], &xb);
            matvec(&mut hb2, &w.w3[l], &xb);
            for (a, b) in hb.iter_mut().zip(&hb2) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
            matvec(&mut xb, &w.w2[l], &hb);
            for (a, b) in x.iter_mut().zip(&xb) {
                *a += b;
            }
        }
        let xf = x.clone();
        rmsnorm(&mut x, &xf, &w.rms_final);
        matvec(&mut logits, &w.classifier, &x);
        let (mut best, mut second) = (0usize, f32::NEG_INFINITY);
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                second = logits[best];
                best = i;
            } else if i != best && l > second {
                second = l;
            }
        }
        gaps.push(logits[best] - second);
        tokens.push(best as u32);
        token = best;
    }
    (tokens, gaps)
}
