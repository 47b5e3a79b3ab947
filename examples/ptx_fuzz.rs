//! Fuzzes the driver's PTX path, which `Device::load_ptx` leaves to the driver as safe code: real
//! PTX files, truncated and with bytes changed, each loaded in a child process so that a crash
//! is counted rather than fatal.
//!
//! ```text
//! cargo run --release --example ptx_fuzz                      # 300 cases
//! PTX_FUZZ_CASES=5000 cargo run --release --example ptx_fuzz  # the full run
//! ```
//!
//! The PTX files: a hand-written one (ISA 7.0) and, where NVRTC is on the library path, the
//! kernels below compiled by NVRTC. Each case is one of them with a seeded change: cut at a
//! random length, one byte replaced by printable ASCII or a line end, or three bytes replaced.
//! Only text `load_ptx` accepts is made (no NUL, no control characters), so every case reaches
//! the driver. Prints how many cases loaded, how many the driver refused and how many crashed
//! the process; exits with status 1 on any crash, and without a driver prints one line and
//! exits with status 1.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use cuda_graph::prelude::*;

/// The hand-written PTX (the GPU test `foundation::ptx_text_loads_safely_and_runs` runs it).
const STORE7_PTX: &str = include_str!("../tests/kernels/store7.ptx");

/// Kernels with loops, shared memory, atomics and branches, for NVRTC to make a larger PTX of.
const SOURCE: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, s[0]);
}
extern "C" __global__ void argmax(const float* x, int n, int* out) {
    float best = -1e30f; int at = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) if (x[i] > best) { best = x[i]; at = i; }
    if (threadIdx.x == 0) *out = at;
}
"#;

fn bases() -> Vec<String> {
    let mut bases = vec![STORE7_PTX.to_string()];
    // NVRTC is optional: without it the hand-written file alone is fuzzed.
    if let Ok(ptx) = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx(SOURCE)) {
        match ptx {
            Ok(ptx) => bases.push(ptx.to_src()),
            Err(e) => eprintln!("NVRTC refused the source: {e:?}"),
        }
    } else {
        eprintln!("NVRTC not found: fuzzing the hand-written PTX only");
    }
    bases
}

/// splitmix64: the case's own sequence of random numbers, the same in every process.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Printable ASCII, or a tab or line end: text `load_ptx` accepts.
    fn text_byte(&mut self) -> u8 {
        match self.below(100) {
            0..=2 => b'\n',
            3 => b'\t',
            _ => 0x20 + self.below(95) as u8,
        }
    }
}

/// Case `i`: which base it changes, and the changed text.
fn case(bases: &[String], i: usize) -> String {
    let base = bases[i % bases.len()].as_bytes();
    let mut rng = Rng(0x5EED ^ (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut bytes = base.to_vec();
    match (i / bases.len()) % 3 {
        0 => bytes.truncate(rng.below(base.len())),
        1 => {
            let at = rng.below(bytes.len());
            bytes[at] = rng.text_byte();
        }
        _ => {
            for _ in 0..3 {
                let at = rng.below(bytes.len());
                bytes[at] = rng.text_byte();
            }
        }
    }
    String::from_utf8(bytes).expect("only ASCII replaced ASCII")
}

/// The child: loads cases `from..to`, printing `i ok` or `i err` after each.
fn child(from: usize, to: usize) -> cuda_graph::Result<()> {
    let device = Device::new(0)?;
    let bases = bases();
    let mut out = std::io::stdout().lock();
    for i in from..to {
        let verdict = match device.load_ptx(&case(&bases, i)) {
            Ok(_) => "ok",
            Err(_) => "err",
        };
        let _ = writeln!(out, "{i} {verdict}");
        let _ = out.flush();
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--child" {
        let (from, to) = (args[2].parse().unwrap_or(0), args[3].parse().unwrap_or(0));
        if let Err(e) = child(from, to) {
            eprintln!("ptx_fuzz child: {e}");
            std::process::exit(2);
        }
        return;
    }
    if let Err(e) = Device::new(0) {
        println!("ptx_fuzz: no CUDA device: {e}");
        std::process::exit(1);
    }
    let cases: usize = std::env::var("PTX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let n_bases = bases().len();
    let exe = std::env::current_exe().expect("the example's own path");
    let (mut loaded, mut refused, mut crashed) = (0usize, 0usize, Vec::new());
    let mut next = 0;
    let started = std::time::Instant::now();
    while next < cases {
        let mut proc = match Command::new(&exe)
            .args(["--child", &next.to_string(), &cases.to_string()])
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(p) => p,
            Err(e) => {
                println!("ptx_fuzz: cannot start a child: {e}");
                std::process::exit(1);
            }
        };
        let mut last = None;
        for line in BufReader::new(proc.stdout.take().expect("piped")).lines() {
            let Ok(line) = line else { break };
            let mut it = line.split(' ');
            let (Some(i), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            let Ok(i) = i.parse::<usize>() else { continue };
            match v {
                "ok" => loaded += 1,
                _ => refused += 1,
            }
            last = Some(i);
        }
        let status = proc.wait().expect("the child's status");
        let after = last.map_or(next, |l| l + 1);
        if status.success() && after >= cases {
            break;
        }
        if !status.success() && status.code() == Some(2) && last.is_none() {
            println!("ptx_fuzz: the child could not start: {status}");
            std::process::exit(1);
        }
        // The child died in case `after` (a signal, or an abort inside the driver).
        println!("case {after} crashed the process: {status}");
        crashed.push(after);
        next = after + 1;
    }
    println!(
        "ptx_fuzz: {cases} cases over {n_bases} PTX files in {:.1} s: {loaded} loaded, {refused} refused by the driver, {} crashed",
        started.elapsed().as_secs_f64(),
        crashed.len()
    );
    if !crashed.is_empty() {
        std::process::exit(1);
    }
}
