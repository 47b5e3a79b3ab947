//! Which exec nodes the driver lets a program enable and disable between launches, probed with
//! raw driver calls (no part of this crate), each case in a child process of its own so that a
//! case that ends the context leaves the others alone.
//!
//! ```text
//! cargo run --release --example toggle_probe            # every case, one line each
//! cargo run --release --example toggle_probe -- memset-same
//! ```
//!
//! A case builds `fill kernel -> X` (X a memset or a device-to-device memcpy node, or a second
//! kernel), instantiates it and, for a few seconds, launches it while `cuGraphNodeSetEnabled`
//! flips X. `-cross` cases launch on one thread and toggle on another, every call under one lock;
//! `-same` cases alternate toggle and launch on one thread. A case passes when the last
//! synchronize succeeds and X's target holds what X writes when it ran last enabled.
//! `Graph::set_enabled` refuses the node types whose cases fail here.

use cudarc::driver::sys;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CASES: [&str; 6] = [
    "kernel-cross",
    "kernel-same",
    "memcpy-cross",
    "memcpy-same",
    "memset-cross",
    "memset-same",
];

fn check(r: sys::CUresult, what: &str) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

struct Raw(sys::CUgraphExec, sys::CUgraphNode, sys::CUstream);
// SAFETY: driver handles; every call on them below is made under one mutex.
unsafe impl Send for Raw {}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = std::env::var("TOGGLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    if let Some(case) = args.get(1) {
        return match run(case, secs) {
            Ok(line) => {
                println!("{case}: ok, {line}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                println!("{case}: FAILED, {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let mut failed = 0;
    for case in CASES {
        let out = std::process::Command::new(&args[0]).arg(case).output();
        match out {
            Ok(o) => {
                print!("{}", String::from_utf8_lossy(&o.stdout));
                if !o.status.success() {
                    failed += 1;
                    if o.stdout.is_empty() {
                        println!("{case}: FAILED, exit {:?}", o.status);
                    }
                }
            }
            Err(e) => {
                println!("{case}: could not start: {e}");
                failed += 1;
            }
        }
    }
    println!("toggle_probe: {failed} of {} cases failed", CASES.len());
    std::process::ExitCode::SUCCESS
}

fn run(case: &str, secs: u64) -> Result<String, String> {
    let (kind, cross) = case
        .split_once('-')
        .map(|(k, m)| (k.to_string(), m == "cross"))
        .ok_or("unknown case")?;
    let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| e.to_string())?;
    ctx.bind_to_thread().map_err(|e| e.to_string())?;
    let fatbin = std::fs::read(
        std::env::var("TOGGLE_FATBIN").unwrap_or_else(|_| "tests/kernels/kernels.fatbin".into()),
    )
    .map_err(|e| format!("kernels.fatbin: {e}"))?;
    // SAFETY: each call below gets valid out-pointers and handles made just before it; the
    // kernel `fill(int* p, int n, int v)` writes p[0..n), and every buffer has 4 ints.
    unsafe {
        let mut module = std::ptr::null_mut();
        check(
            sys::cuModuleLoadData(&mut module, fatbin.as_ptr().cast()),
            "load",
        )?;
        let mut fill = std::ptr::null_mut();
        check(
            sys::cuModuleGetFunction(&mut fill, module, c"fill".as_ptr()),
            "function",
        )?;
        let mut bufs = [0u64; 2];
        for b in &mut bufs {
            check(sys::cuMemAlloc_v2(b, 16), "alloc")?;
            check(sys::cuMemsetD32_v2(*b, 0, 4), "memset")?;
        }
        let mut graph = std::ptr::null_mut();
        check(sys::cuGraphCreate(&mut graph, 0), "graph")?;
        let kernel = |dst: &mut u64,
                      v: i32,
                      deps: &[sys::CUgraphNode]|
         -> Result<sys::CUgraphNode, String> {
            let mut n = 4i32;
            let mut v = v;
            let mut args: [*mut std::ffi::c_void; 3] = [
                (dst as *mut u64).cast(),
                (&mut n as *mut i32).cast(),
                (&mut v as *mut i32).cast(),
            ];
            let p = sys::CUDA_KERNEL_NODE_PARAMS {
                func: fill,
                gridDimX: 1,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: 32,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: args.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            let mut node = std::ptr::null_mut();
            check(
                sys::cuGraphAddKernelNode_v2(&mut node, graph, deps.as_ptr(), deps.len(), &p),
                "kernel node",
            )?;
            Ok(node)
        };
        let mut b0 = bufs[0];
        let mut b1 = bufs[1];
        let k = kernel(&mut b0, 7, &[])?;
        let mut x = std::ptr::null_mut();
        let expect = match kind.as_str() {
            "kernel" => {
                x = kernel(&mut b1, 9, &[k])?;
                9
            }
            "memset" => {
                let p = sys::CUDA_MEMSET_NODE_PARAMS {
                    dst: b1,
                    pitch: 16,
                    value: 5,
                    elementSize: 4,
                    width: 4,
                    height: 1,
                };
                check(
                    sys::cuGraphAddMemsetNode(&mut x, graph, &k, 1, &p, ctx.cu_ctx()),
                    "memset node",
                )?;
                5
            }
            "memcpy" => {
                let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
                let c = sys::CUDA_MEMCPY3D {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcZ: 0,
                    srcLOD: 0,
                    srcMemoryType: device,
                    srcHost: std::ptr::null(),
                    srcDevice: b0,
                    srcArray: std::ptr::null_mut(),
                    reserved0: std::ptr::null_mut(),
                    srcPitch: 16,
                    srcHeight: 1,
                    dstXInBytes: 0,
                    dstY: 0,
                    dstZ: 0,
                    dstLOD: 0,
                    dstMemoryType: device,
                    dstHost: std::ptr::null_mut(),
                    dstDevice: b1,
                    dstArray: std::ptr::null_mut(),
                    reserved1: std::ptr::null_mut(),
                    dstPitch: 16,
                    dstHeight: 1,
                    WidthInBytes: 16,
                    Height: 1,
                    Depth: 1,
                };
                check(
                    sys::cuGraphAddMemcpyNode(&mut x, graph, &k, 1, &c, ctx.cu_ctx()),
                    "memcpy node",
                )?;
                7
            }
            _ => return Err("unknown node kind".into()),
        };
        let mut exec = std::ptr::null_mut();
        check(
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            "instantiate",
        )?;
        let mut stream = std::ptr::null_mut();
        check(
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
            "stream",
        )?;
        let lock = Mutex::new(Raw(exec, x, stream));
        let end = Instant::now() + Duration::from_secs(secs);
        let (mut launches, mut toggles) = (0u64, 0u64);
        if cross {
            let r: Result<(u64, u64), String> = std::thread::scope(|s| {
                let t = s.spawn(|| -> Result<u64, String> {
                    ctx.bind_to_thread().map_err(|e| e.to_string())?;
                    let mut n = 0u64;
                    while Instant::now() < end {
                        let g = lock.lock().unwrap();
                        check(
                            sys::cuGraphNodeSetEnabled(g.0, g.1, (n % 2) as u32),
                            "toggle",
                        )?;
                        n += 1;
                    }
                    let g = lock.lock().unwrap();
                    check(sys::cuGraphNodeSetEnabled(g.0, g.1, 1), "enable")?;
                    Ok(n)
                });
                let mut l = 0u64;
                while Instant::now() < end {
                    let g = lock.lock().unwrap();
                    check(sys::cuGraphLaunch(g.0, g.2), "launch")?;
                    l += 1;
                    if l.is_multiple_of(64) {
                        check(sys::cuStreamSynchronize(g.2), "synchronize")?;
                    }
                }
                Ok((l, t.join().map_err(|_| "toggle thread panicked")??))
            });
            (launches, toggles) = r?;
        } else {
            let g = lock.lock().unwrap();
            while Instant::now() < end {
                check(
                    sys::cuGraphNodeSetEnabled(g.0, g.1, (toggles % 2) as u32),
                    "toggle",
                )?;
                toggles += 1;
                check(sys::cuGraphLaunch(g.0, g.2), "launch")?;
                launches += 1;
                if launches.is_multiple_of(64) {
                    check(sys::cuStreamSynchronize(g.2), "synchronize")?;
                }
            }
            check(sys::cuGraphNodeSetEnabled(g.0, g.1, 1), "enable")?;
        }
        // One launch with X enabled, so X's target must hold what X writes.
        check(sys::cuMemsetD32_v2(b1, 0, 4), "clear")?;
        check(sys::cuGraphLaunch(exec, stream), "last launch")?;
        check(sys::cuStreamSynchronize(stream), "last synchronize")?;
        let mut host = [0i32; 4];
        check(
            sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), b1, 16),
            "read",
        )?;
        if host != [expect; 4] {
            return Err(format!("target holds {host:?}, expected {expect}"));
        }
        Ok(format!("{launches} launches, {toggles} toggles"))
    }
}
