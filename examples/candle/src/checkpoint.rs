//! llama2.c's `.bin` checkpoints: a header of seven little-endian `i32`s (dim, hidden_dim,
//! n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means the classifier
//! is not shared with the token embedding), then fp32 tensors in a fixed order. Every size is
//! checked before it is used: a truncated file, a header that does not describe a model, or sizes
//! whose products overflow are errors, never a panic or a huge allocation.

use std::fmt;

/// The model's shape, from the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub dim: usize,
    pub hidden_dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub vocab_size: usize,
    pub seq_len: usize,
    /// Whether the classifier is the token embedding (a positive vocab_size in the file).
    pub shared_classifier: bool,
}

impl Config {
    pub fn head_size(&self) -> usize {
        self.dim / self.n_heads
    }
    pub fn kv_dim(&self) -> usize {
        self.dim / self.n_heads * self.n_kv_heads
    }
}

/// The weights, row-major as in the file: `wq[l]` is `dim × dim` (output rows), `wk[l]`/`wv[l]`
/// `kv_dim × dim`, `w1[l]`/`w3[l]` `hidden × dim`, `w2[l]` `dim × hidden`.
#[derive(Clone)]
pub struct Weights {
    pub config: Config,
    pub token_embedding: Vec<f32>,
    pub rms_att: Vec<Vec<f32>>,
    pub wq: Vec<Vec<f32>>,
    pub wk: Vec<Vec<f32>>,
    pub wv: Vec<Vec<f32>>,
    pub wo: Vec<Vec<f32>>,
    pub rms_ffn: Vec<Vec<f32>>,
    pub w1: Vec<Vec<f32>>,
    pub w2: Vec<Vec<f32>>,
    pub w3: Vec<Vec<f32>>,
    pub rms_final: Vec<f32>,
    pub freq_cis_real: Vec<f32>,
    pub freq_cis_imag: Vec<f32>,
    pub classifier: Vec<f32>,
}

impl fmt::Debug for Weights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Weights")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Why a checkpoint cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCheckpoint(pub String);

impl fmt::Display for BadCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a llama2.c checkpoint: {}", self.0)
    }
}

impl std::error::Error for BadCheckpoint {}

fn bad(why: impl Into<String>) -> BadCheckpoint {
    BadCheckpoint(why.into())
}

/// Largest model accepted: a bound on what one file may make the reader allocate (4 Gi floats).
const MAX_FLOATS: usize = 1 << 32;

impl Config {
    /// Reads and checks the header (28 bytes).
    pub fn parse(bytes: &[u8]) -> Result<Config, BadCheckpoint> {
        if bytes.len() < 28 {
            return Err(bad(format!(
                "{} bytes, shorter than the 28-byte header",
                bytes.len()
            )));
        }
        let field = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        let names = [
            "dim",
            "hidden_dim",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "vocab_size",
            "seq_len",
        ];
        let mut v = [0usize; 7];
        let mut shared = true;
        for (i, name) in names.iter().enumerate() {
            let raw = field(i);
            let raw = if i == 5 && raw < 0 {
                shared = false;
                raw.checked_neg()
                    .ok_or_else(|| bad("vocab_size is i32::MIN"))?
            } else {
                raw
            };
            if raw <= 0 {
                return Err(bad(format!("header field {name} is {raw}, not positive")));
            }
            v[i] = raw as usize;
        }
        let c = Config {
            dim: v[0],
            hidden_dim: v[1],
            n_layers: v[2],
            n_heads: v[3],
            n_kv_heads: v[4],
            vocab_size: v[5],
            seq_len: v[6],
            shared_classifier: shared,
        };
        if c.dim % c.n_heads != 0 {
            return Err(bad(format!(
                "dim {} is not a multiple of n_heads {}",
                c.dim, c.n_heads
            )));
        }
        if c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0 {
            return Err(bad(format!(
                "n_heads {} is not a multiple of n_kv_heads {}",
                c.n_heads, c.n_kv_heads
            )));
        }
        if c.head_size() % 2 != 0 {
            return Err(bad(format!(
                "head size {} is odd (rotary pairs)",
                c.head_size()
            )));
        }
        Ok(c)
    }

    /// The number of floats the tensors after the header take, or an error where it overflows
    /// or is past [`MAX_FLOATS`].
    pub fn floats(&self) -> Result<usize, BadCheckpoint> {
        let m = |a: usize, b: usize| a.checked_mul(b).ok_or_else(|| bad("sizes overflow"));
        let (l, d, h, kv) = (self.n_layers, self.dim, self.hidden_dim, self.kv_dim());
        let parts = [
            m(self.vocab_size, d)?,
            m(l, d)?,
            m(l, m(d, d)?)?,
            m(l, m(kv, d)?)?,
            m(l, m(kv, d)?)?,
            m(l, m(d, d)?)?,
            m(l, d)?,
            m(l, m(h, d)?)?,
            m(l, m(d, h)?)?,
            m(l, m(h, d)?)?,
            d,
            m(self.seq_len, self.head_size() / 2)?,
            m(self.seq_len, self.head_size() / 2)?,
            if self.shared_classifier {
                0
            } else {
                m(self.vocab_size, d)?
            },
        ];
        let total = parts
            .iter()
            .try_fold(0usize, |a, &b| a.checked_add(b))
            .ok_or_else(|| bad("sizes overflow"))?;
        if total > MAX_FLOATS {
            return Err(bad(format!(
                "the header describes {total} floats, more than this reader takes ({MAX_FLOATS})"
            )));
        }
        Ok(total)
    }
}

impl Weights {
    /// Parses a whole checkpoint file.
    pub fn parse(bytes: &[u8]) -> Result<Weights, BadCheckpoint> {
        let config = Config::parse(bytes)?;
        let floats = config.floats()?;
        let need = 28 + 4 * floats;
        if bytes.len() < need {
            return Err(bad(format!(
                "{} bytes, but the header describes {need} (truncated?)",
                bytes.len()
            )));
        }
        if bytes.len() > need {
            return Err(bad(format!(
                "{} bytes, but the header describes {need}: trailing data",
                bytes.len()
            )));
        }
        let mut at = 28;
        let mut take = |n: usize| -> Vec<f32> {
            let v = bytes[at..at + 4 * n]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            at += 4 * n;
            v
        };
        let (l, d, h, kv) = (
            config.n_layers,
            config.dim,
            config.hidden_dim,
            config.kv_dim(),
        );
        let token_embedding = take(config.vocab_size * d);
        let mut per_layer = |n: usize| (0..l).map(|_| take(n)).collect::<Vec<_>>();
        let rms_att = per_layer(d);
        let wq = per_layer(d * d);
        let wk = per_layer(kv * d);
        let wv = per_layer(kv * d);
        let wo = per_layer(d * d);
        let rms_ffn = per_layer(d);
        let w1 = per_layer(h * d);
        let w2 = per_layer(d * h);
        let w3 = per_layer(h * d);
        drop(per_layer);
        let rms_final = take(d);
        let half = config.head_size() / 2;
        let freq_cis_real = take(config.seq_len * half);
        let freq_cis_imag = take(config.seq_len * half);
        let classifier = if config.shared_classifier {
            token_embedding.clone()
        } else {
            take(config.vocab_size * d)
        };
        Ok(Weights {
            config,
            token_embedding,
            rms_att,
            wq,
            wk,
            wv,
            wo,
            rms_ffn,
            w1,
            w2,
            w3,
            rms_final,
            freq_cis_real,
            freq_cis_imag,
            classifier,
        })
    }

    /// The weights as a llama2.c `.bin` file (what [`parse`](Self::parse) reads), so that
    /// another program (the PyTorch peer) can load the same random weights.
    pub fn to_bytes(&self) -> Vec<u8> {
        let c = self.config;
        let vocab = if c.shared_classifier {
            c.vocab_size as i32
        } else {
            -(c.vocab_size as i32)
        };
        let header = [
            c.dim as i32,
            c.hidden_dim as i32,
            c.n_layers as i32,
            c.n_heads as i32,
            c.n_kv_heads as i32,
            vocab,
            c.seq_len as i32,
        ];
        let mut out: Vec<u8> = header.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut put = |v: &[f32]| out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        put(&self.token_embedding);
        for group in [
            &self.rms_att,
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.rms_ffn,
            &self.w1,
            &self.w2,
            &self.w3,
        ] {
            for layer in group {
                put(layer);
            }
        }
        put(&self.rms_final);
        put(&self.freq_cis_real);
        put(&self.freq_cis_imag);
        if !c.shared_classifier {
            put(&self.classifier);
        }
        out
    }

    /// Seeded random weights of `config`'s shape (for shapes without a trained checkpoint).
    pub fn random(config: Config, seed: u64) -> Weights {
        let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let mut r = |n: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    s = s
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
                })
                .collect()
        };
        let (l, d, h, kv) = (
            config.n_layers,
            config.dim,
            config.hidden_dim,
            config.kv_dim(),
        );
        let sd = 1.0 / (d as f32).sqrt();
        let sh = 1.0 / (h as f32).sqrt();
        let token_embedding = r(config.vocab_size * d, 0.02);
        let mut layers = |n: usize, scale: f32| (0..l).map(|_| r(n, scale)).collect::<Vec<_>>();
        let ones = |n: usize| vec![1.0f32; n];
        let wq = layers(d * d, sd);
        let wk = layers(kv * d, sd);
        let wv = layers(kv * d, sd);
        let wo = layers(d * d, sd);
        let w1 = layers(h * d, sd);
        let w2 = layers(d * h, sh);
        let w3 = layers(h * d, sd);
        let half = config.head_size() / 2;
        let mut freq_cis_real = Vec::with_capacity(config.seq_len * half);
        let mut freq_cis_imag = Vec::with_capacity(config.seq_len * half);
        for pos in 0..config.seq_len {
            for i in 0..half {
                let f = 1.0 / 10000f32.powf(2.0 * i as f32 / config.head_size() as f32);
                let a = pos as f32 * f;
                freq_cis_real.push(a.cos());
                freq_cis_imag.push(a.sin());
            }
        }
        Weights {
            config: Config {
                shared_classifier: true,
                ..config
            },
            classifier: token_embedding.clone(),
            token_embedding,
            rms_att: (0..l).map(|_| ones(d)).collect(),
            wq,
            wk,
            wv,
            wo,
            rms_ffn: (0..l).map(|_| ones(d)).collect(),
            w1,
            w2,
            w3,
            rms_final: ones(d),
            freq_cis_real,
            freq_cis_imag,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(v: [i32; 7]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn written_weights_read_back_the_same() {
        let c = Config {
            dim: 16,
            hidden_dim: 24,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            vocab_size: 32,
            seq_len: 8,
            shared_classifier: true,
        };
        let w = Weights::random(c, 3);
        let bytes = w.to_bytes();
        let back = Weights::parse(&bytes).unwrap();
        assert_eq!(back.config, w.config);
        assert_eq!(back.wk, w.wk);
        assert_eq!(back.w2, w.w2);
        assert_eq!(back.freq_cis_imag, w.freq_cis_imag);
        assert_eq!(back.classifier, w.classifier);
        assert_eq!(back.to_bytes(), bytes);
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(Weights::parse(&[0u8; 10]).is_err());
        assert!(Weights::parse(&header([64, 172, 5, 8, 4, 512, 512])).is_err()); // truncated
        assert!(Weights::parse(&header([0, 172, 5, 8, 4, 512, 512])).is_err());
        assert!(Weights::parse(&header([64, 172, 5, 8, 3, 512, 512])).is_err());
        assert!(Weights::parse(&header([i32::MAX, i32::MAX, i32::MAX, 1, 1, 512, 512])).is_err());
        assert!(Weights::parse(&header([64, 172, 5, 8, 4, i32::MIN, 512])).is_err());
    }
}
