//! cuBLAS inside a graph: one capture records a kernel of this crate, a cuBLAS SGEMM and another
//! kernel of this crate; the graph is replayed with new inputs written between replays, and each
//! result is compared with a CPU reference.
//!
//! ```text
//! LD_LIBRARY_PATH=/usr/local/cuda/lib64 cargo run --example cublas_capture --features cudarc
//! ```
//!
//! libcublas is opened at run time by cudarc's loader, which tries fixed names (`libcublas.so`,
//! `libcublas.so.12`, ... for the default CUDA 12.8 bindings; `libcublas.so.13` with `cuda-13*`)
//! on the library path and cannot be given a directory: a toolkit in `/usr/local/cuda` needs
//! `LD_LIBRARY_PATH=/usr/local/cuda/lib64`. Without libcublas the example prints one line saying
//! so and exits with status 0; without a CUDA driver it prints one line and exits with status 1.
//!
//! The cudarc side: the context, the capturing stream and matrix B are cudarc's
//! (`CudaContext`, `CudaStream`, `CudaSlice`), brought in with the `cudarc` feature's adapters.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;

use cuda_graph::prelude::*;
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::CudaContext;

/// The test kernels: `copy_slice_f32(Slice<const float> src, Slice<float> dst)` and
/// `heat_step_slice(Slice<const float> in, Slice<float> out, float alpha)`
/// (tests/kernels/kernels.cu).
const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");

/// C (M×N) = A (M×K) · B (K×N), column-major.
const M: usize = 64;
const N: usize = 48;
const K: usize = 32;
const ALPHA_HEAT: f32 = 0.25;
const REPLAYS: u32 = 4;

/// Why libcublas cannot be used here, if it cannot (checked without panicking: cudarc's loader
/// panics when a cuBLAS function is called and the library is missing).
fn cublas_missing() -> Option<String> {
    #[cfg(feature = "dynamic-loading")]
    {
        // SAFETY: only tries to open the library (and closes it again).
        if !unsafe { blas_sys::is_culib_present() } {
            return Some(format!(
                "libcublas could not be loaded (cudarc tried {}); with a CUDA toolkit in /usr/local/cuda, run with LD_LIBRARY_PATH=/usr/local/cuda/lib64",
                cudarc::get_lib_name_candidates("cublas").join(", ")
            ));
        }
    }
    None
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

/// What the graph computes: `heat_step(A·B)` over C's M·N elements, in column-major order.
fn reference(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; M * N];
    for j in 0..N {
        for i in 0..M {
            c[i + j * M] = (0..K).map(|p| a[i + p * M] * b[p + j * K]).sum();
        }
    }
    let mut out = c.clone();
    for i in 1..c.len() - 1 {
        out[i] = c[i] + ALPHA_HEAT * (c[i - 1] - 2.0 * c[i] + c[i + 1]);
    }
    out
}

/// A cuBLAS handle, destroyed on drop.
struct Cublas(blas_sys::cublasHandle_t);

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: created in `run`, destroyed once, here, after the work using it has finished.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

/// Runs the example; `Ok(Some(reason))` when it cannot run here.
fn run() -> Result<Option<String>, Box<dyn Error>> {
    // This crate first: without a driver it returns an error where cudarc would panic.
    let device = Device::new(0)?;
    if let Some(reason) = cublas_missing() {
        return Ok(Some(reason));
    }
    // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
    let module = unsafe { device.load_module(KERNELS)? };
    // SAFETY: the kernels' parameter lists (tests/kernels/kernels.cu); neither touches an
    // element past the lengths it is given.
    let (copy, heat_step) = unsafe {
        (
            module.kernel::<(Slice<f32>, Slice<f32>)>("copy_slice_f32")?,
            module.kernel::<(Slice<f32>, Slice<f32>, f32)>("heat_step_slice")?,
        )
    };

    // cudarc's context is the same primary context; its stream captures through this crate.
    let ctx = CudaContext::new(device.ordinal())?;
    let cu_stream = ctx.new_stream()?;
    // SAFETY: this program never begins a capture on `cu_stream` through cudarc.
    let stream = unsafe { Stream::from_cudarc(&device, &cu_stream)? };

    let a_in = device.alloc_zeroed::<f32>(M * K)?; // written between replays
    let a = device.alloc_zeroed::<f32>(M * K)?; // the GEMM's A, copied from `a_in` in the graph
    let b_slice = Arc::new(cu_stream.alloc_zeros::<f32>(K * N)?); // cudarc's, written between replays
    let b = DeviceBuffer::from_cudarc(&device, b_slice)?;
    let c = device.alloc_zeroed::<f32>(M * N)?;
    let out = device.alloc_zeroed::<f32>(M * N)?;
    // cuBLAS's workspace, ours: without one cuBLAS allocates its own on first use, and an
    // allocation is illegal inside a capture. 32 MiB is what NVIDIA recommends for Hopper.
    let workspace = device.alloc_zeroed::<u8>(32 << 20)?;

    let handle = Cublas(blas::create_handle()?);
    // SAFETY: the handle is live; the stream is a live stream of the current (primary) context,
    // and outlives the handle's use; the workspace outlives every GEMM run with it (it is dropped
    // after the graph, and the stream is synchronised before).
    unsafe {
        blas::set_stream(handle.0, stream.as_raw() as blas_sys::cudaStream_t)?;
        blas_sys::cublasSetWorkspace_v2(
            handle.0,
            workspace.as_raw() as *mut std::ffi::c_void,
            workspace.byte_len(),
        )
        .result()?;
    }
    let gemm = || -> Result<(), blas::CublasError> {
        let (one, zero) = (1f32, 0f32);
        // SAFETY: A is M×K (lda = M), B is K×N (ldb = K), C is M×N (ldc = M), all live device
        // buffers of this context; the scalars are host values read during the call.
        unsafe {
            blas::sgemm(
                handle.0,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                M as i32,
                N as i32,
                K as i32,
                &one,
                a.as_raw() as *const f32,
                M as i32,
                b.as_raw() as *const f32,
                K as i32,
                &zero,
                c.as_raw() as *mut f32,
                M as i32,
            )
        }
    };

    // Warm-up outside the capture: cuBLAS's first GEMM of a shape does one-time work (loading
    // its kernels, lazily with CUDA's lazy loading; setting up the handle) that includes calls
    // which are illegal while capturing and would invalidate it.
    gemm()?;
    stream.synchronize()?;

    // ThreadLocal: after the warm-up cuBLAS makes no unsafe calls on this thread, and one by
    // mistake would fail the capture instead of being baked in silently (Relaxed would allow
    // it); unlike Global, other threads (this crate's release thread, cudarc's drops) may still
    // allocate and free meanwhile.
    let builder = stream.create_graph_builder().begin_building(ThreadLocal)?;
    builder.launch(
        &copy,
        LaunchConfig::for_num_elems((M * K) as u32),
        (&a_in, &a),
    )?;
    // cuBLAS issues its kernels on the handle's stream, `stream.as_raw()`, which is capturing:
    // the driver records them into the graph after the copy. The graph does not hold B or the
    // workspace for them (only what goes through this crate); they live until the end of `run`.
    gemm()?;
    builder.launch(
        &heat_step,
        LaunchConfig::for_num_elems((M * N) as u32),
        (&c, &out, ALPHA_HEAT),
    )?;
    let graph = builder.end_building()?.instantiate()?;

    let mut worst = 0f32;
    for replay in 0..REPLAYS {
        let (a_host, b_host) = (inputs(M * K, 2 * replay), inputs(K * N, 2 * replay + 1));
        a_in.copy_from(&a_host)?;
        b.copy_from(&b_host)?;
        graph.launch(&stream)?;
        stream.synchronize()?;
        let got = out.to_vec()?;
        let want = reference(&a_host, &b_host);
        let err = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0f32, f32::max);
        worst = worst.max(err);
        if err > 1e-3 {
            return Err(
                format!("replay {replay}: max error {err} against the CPU reference").into(),
            );
        }
    }
    println!(
        "{} (driver {}): kernel → cuBLAS SGEMM {M}x{N}x{K} → kernel captured into one graph, {REPLAYS} replays with new inputs, max error {worst:e} against the CPU reference",
        device.name()?,
        cuda_graph::driver_version()?
    );
    Ok(None)
}

fn main() -> ExitCode {
    match run() {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(reason)) => {
            println!("cublas_capture skipped: {reason}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cublas_capture: {e}");
            ExitCode::FAILURE
        }
    }
}
