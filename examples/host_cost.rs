//! The host work the crate adds per node, for counting instructions with callgrind over a stub
//! driver (`scripts/count-instructions.sh`): builds a chain of N kernel nodes, or captures N
//! launches, through the crate or through raw driver calls.
//!
//! ```text
//! scripts/count-instructions.sh            # instructions per node, crate and raw, no GPU needed
//! cargo run --release --example host_cost -- explicit 1000   # on a GPU: just runs the case
//! ```
//!
//! Cases: `explicit`, `explicit-buf` (one buffer argument, its `KernelArgs` built per node, as
//! for `capture-buf` per launch), `explicit-typed`, `capture`,
//! `capture-buf`, `capture-typed`, `stream` (launches on a stream, not captured), `cycle` (N
//! captures of one launch each: begin, launch, end, drop), `raw-explicit`, `raw-capture`,
//! `raw-cycle`.

use std::process::ExitCode;

use cuda_graph::prelude::*;
use cuda_graph::Refusal;
use cudarc::driver::sys;

const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");

fn run(case: &str, n: usize) -> cuda_graph::Result<()> {
    let device = Device::new(0)?;
    // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
    let module = unsafe { device.load_module(KERNELS)? };
    let f = module.function("empty_kernel")?;
    let buf = device.alloc_zeroed::<i32>(64)?;
    // The arguments are built per launch or node, as a caller usually does.
    let with_buf = case.ends_with("-buf");
    let args = || {
        if with_buf {
            KernelArgs::new().arg(&buf)
        } else {
            KernelArgs::new()
        }
    };
    match case {
        "explicit" | "explicit-buf" => {
            let def = GraphDefinition::new(&device)?;
            let mut prev: Option<GraphNode> = None;
            for _ in 0..n {
                let deps: &[&GraphNode] = match &prev {
                    Some(p) => &[p],
                    None => &[],
                };
                // SAFETY: empty_kernel ignores its (absent or extra) arguments and touches no
                // memory; an extra argument is passed but never read.
                let node = unsafe { def.add_kernel_unchecked(deps, &f, LaunchConfig::single(), &args())? };
                prev = Some(node.node());
            }
        }
        "capture" | "capture-buf" => {
            let stream = device.create_stream()?;
            let b = stream.create_graph_builder().begin_building(Relaxed)?;
            for _ in 0..n {
                // SAFETY: as above.
                unsafe { b.launch_unchecked(&f, LaunchConfig::single(), &args())? };
            }
            b.end_building()?;
        }
        "explicit-typed" => {
            // SAFETY: add_one(int* p) touches p[0] of the 64-int buffer.
            let k = unsafe { module.kernel::<(*mut i32,)>("add_one")? };
            let def = GraphDefinition::new(&device)?;
            let mut prev: Option<GraphNode> = None;
            for _ in 0..n {
                let deps: &[&GraphNode] = match &prev {
                    Some(p) => &[p],
                    None => &[],
                };
                prev = Some(def.add_kernel(deps, &k, LaunchConfig::single(), &buf)?.node());
            }
        }
        "capture-typed" => {
            // SAFETY: as above.
            let k = unsafe { module.kernel::<(*mut i32,)>("add_one")? };
            let stream = device.create_stream()?;
            let b = stream.create_graph_builder().begin_building(Relaxed)?;
            for _ in 0..n {
                b.launch(&k, LaunchConfig::single(), &buf)?;
            }
            b.end_building()?;
        }
        "stream" => {
            let stream = device.create_stream()?;
            for _ in 0..n {
                // SAFETY: as above.
                unsafe { stream.launch_unchecked(&f, LaunchConfig::single(), &args())? };
            }
            stream.synchronize()?;
        }
        "cycle" => {
            let stream = device.create_stream()?;
            for _ in 0..n {
                let b = stream.create_graph_builder().begin_building(Relaxed)?;
                // SAFETY: as above.
                unsafe { b.launch_unchecked(&f, LaunchConfig::single(), &args())? };
                drop(b.end_building()?);
            }
        }
        "raw-cycle" => {
            let stream = device.create_stream()?;
            for _ in 0..n {
                raw_capture_on(stream.as_raw(), &f, 1)?;
            }
        }
        "raw-explicit" => raw_explicit(&f, n)?,
        "raw-capture" => raw_capture(&device, &f, n)?,
        other => {
            return Err(Error::invalid(Refusal::Other, format!(
                "unknown case {other:?}: explicit, explicit-buf, explicit-typed, capture, capture-buf, capture-typed, stream, cycle, raw-explicit, raw-capture, raw-cycle"
            )))
        }
    }
    Ok(())
}

fn check(r: sys::CUresult, what: &str) -> cuda_graph::Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::invalid(
            Refusal::Other,
            format!("{what} failed: {r:?}"),
        ))
    }
}

/// A chain of `n` kernel nodes through `cuGraphAddKernelNode_v2`.
fn raw_explicit(f: &Function, n: usize) -> cuda_graph::Result<()> {
    let mut g = std::ptr::null_mut();
    // SAFETY: the crate made the device's context current; `g` is a valid out pointer.
    check(unsafe { sys::cuGraphCreate(&mut g, 0) }, "cuGraphCreate")?;
    let mut prev: sys::CUgraphNode = std::ptr::null_mut();
    let params = sys::CUDA_KERNEL_NODE_PARAMS {
        func: f.as_raw(),
        gridDimX: 1,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 1,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    };
    for _ in 0..n {
        let mut out = std::ptr::null_mut();
        let (deps, count) = if prev.is_null() {
            (std::ptr::null(), 0)
        } else {
            (&prev as *const sys::CUgraphNode, 1)
        };
        // SAFETY: `g` is live, `deps` holds `count` nodes of it; empty_kernel takes no arguments.
        check(
            unsafe { sys::cuGraphAddKernelNode_v2(&mut out, g, deps, count, &params) },
            "cuGraphAddKernelNode_v2",
        )?;
        prev = out;
    }
    // SAFETY: `g` is ours and destroyed once.
    check(unsafe { sys::cuGraphDestroy(g) }, "cuGraphDestroy")
}

/// `n` launches of `f` on a stream capturing in relaxed mode.
fn raw_capture(device: &Device, f: &Function, n: usize) -> cuda_graph::Result<()> {
    let stream = device.create_stream()?;
    raw_capture_on(stream.as_raw(), f, n)
}

/// `n` launches captured on `s` (begin, launches, end, destroy).
fn raw_capture_on(s: sys::CUstream, f: &Function, n: usize) -> cuda_graph::Result<()> {
    use sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as RELAXED;
    // SAFETY: the stream is live and not capturing.
    check(
        unsafe { sys::cuStreamBeginCapture_v2(s, RELAXED) },
        "cuStreamBeginCapture_v2",
    )?;
    for _ in 0..n {
        // SAFETY: empty_kernel takes no arguments; the stream is live.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    f.as_raw(),
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    s,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )?;
    }
    let mut g = std::ptr::null_mut();
    // SAFETY: the stream is capturing; `g` is a valid out pointer.
    check(
        unsafe { sys::cuStreamEndCapture(s, &mut g) },
        "cuStreamEndCapture",
    )?;
    // SAFETY: the captured graph is ours and destroyed once.
    check(unsafe { sys::cuGraphDestroy(g) }, "cuGraphDestroy")
}

fn main() -> ExitCode {
    let mut a = std::env::args().skip(1);
    let case = a.next().unwrap_or_else(|| "explicit".into());
    let n = a.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    match run(&case, n) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::DriverNotFound) => {
            println!("host_cost: no CUDA driver here (run it under scripts/count-instructions.sh)");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("host_cost: {e}");
            ExitCode::FAILURE
        }
    }
}
