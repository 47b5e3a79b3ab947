//! Programmatic dependent launch and launch attributes, against raw driver calls in the same
//! process, interleaved, medians:
//!
//! - **chain**: a graph of N one-thread kernels, each after the one before (each adds 1 to one
//!   int, after `griddepcontrol.wait`): GPU time per kernel with plain edges (the crate), with
//!   programmatic edges (the crate's `add_dependent_kernel`), and with programmatic edges made
//!   by raw calls (`cuGraphAddNode_v2` with edge data). Prints pdl/plain and crate/raw.
//! - **launch+attr**: host time of a stream launch with a priority attribute, the crate's
//!   `Stream::launch` against `cuLaunchKernelEx`.
//! - **node+attr**: host time to add a kernel node with a priority, the crate's `add_kernel`
//!   against `cuGraphAddKernelNode` + `cuGraphKernelNodeSetAttribute`.
//!
//! `cargo bench --bench pdl` (compute capability 9.0; elsewhere it says it skipped).
//! `PDL_CHAIN=64`, `PDL_RUNS=31` change the chain length and the number of runs.

use std::time::Instant;

use cuda_graph::prelude::*;
use cuda_graph::{DependentKernel, EventOptions};
use cudarc::driver::sys;

/// `tick(int* p)`: lets its dependents begin, waits for the kernel before it, then p[0] += 1.
const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64
.visible .entry tick(.param .u64 p)
{
    .reg .b64 %rd<3>;
    .reg .b32 %r<3>;
    griddepcontrol.launch_dependents;
    griddepcontrol.wait;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    ld.global.u32 %r1, [%rd2];
    add.s32 %r2, %r1, 1;
    st.global.u32 [%rd2], %r2;
    ret;
}
"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn check(r: sys::CUresult, what: &str) -> cuda_graph::Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cuda_graph::Error::invalid(
            cuda_graph::Refusal::Other,
            format!("{what}: {r:?}"),
        ))
    }
}

/// The chain with raw calls: programmatic edges from each kernel node to the next.
fn raw_chain(
    f: sys::CUfunction,
    p: &DeviceBuffer<i32>,
    n: usize,
) -> cuda_graph::Result<sys::CUgraphExec> {
    let mut ptr = p.as_raw();
    let mut args = [(&mut ptr as *mut u64).cast::<std::ffi::c_void>()];
    // SAFETY: raw driver calls on handles made here; `tick` takes one int*, `p` holds one int.
    unsafe {
        let mut graph = std::ptr::null_mut();
        check(sys::cuGraphCreate(&mut graph, 0), "cuGraphCreate")?;
        let mut prev: sys::CUgraphNode = std::ptr::null_mut();
        let edge = sys::CUgraphEdgeData {
            from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
            to_port: 0,
            type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
            reserved: [0; 5],
        };
        for _ in 0..n {
            let mut params: sys::CUgraphNodeParams = std::mem::zeroed();
            params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL;
            params.__bindgen_anon_1.kernel = sys::CUDA_KERNEL_NODE_PARAMS_v3 {
                func: f,
                gridDimX: 1,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: 1,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: args.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            let mut node = std::ptr::null_mut();
            let (deps, edges, k) = if prev.is_null() {
                (std::ptr::null(), std::ptr::null(), 0)
            } else {
                (
                    &prev as *const sys::CUgraphNode,
                    &edge as *const sys::CUgraphEdgeData,
                    1,
                )
            };
            check(
                sys::cuGraphAddNode_v2(&mut node, graph, deps, edges, k, &mut params),
                "cuGraphAddNode_v2",
            )?;
            prev = node;
        }
        let mut exec = std::ptr::null_mut();
        check(
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            "instantiate",
        )?;
        sys::cuGraphDestroy(graph);
        Ok(exec)
    }
}

fn run() -> cuda_graph::Result<()> {
    let device = Device::new(0)?;
    if device.compute_capability()? < (9, 0) {
        println!("pdl: skipped (needs compute capability 9.0)");
        return Ok(());
    }
    let n = env("PDL_CHAIN", 64);
    let runs = env("PDL_RUNS", 31);
    let module = device.load_ptx(PTX)?;
    // SAFETY: tick(int* p) touches p[0] only, after griddepcontrol.wait.
    let tick: Kernel<(*mut i32,)> = unsafe { module.kernel("tick")? };
    // SAFETY: as above: it waits before its only access.
    let dependent: DependentKernel<(*mut i32,)> = unsafe { tick.clone().dependent() };
    let p = device.alloc_zeroed::<i32>(1)?;
    let s = device.create_stream()?;
    let one = LaunchConfig::single();

    let plain = GraphDefinition::new(&device)?;
    let pdl = GraphDefinition::new(&device)?;
    let (mut a, mut b) = (
        plain.add_kernel(&[], &tick, one, &p)?,
        pdl.add_kernel(&[], &tick, one, &p)?,
    );
    for _ in 1..n {
        a = plain.add_kernel(&[&a], &tick, one, &p)?;
        b = pdl.add_dependent_kernel(&[&b], &dependent, one, &p)?;
    }
    let (plain, pdl) = (plain.instantiate()?, pdl.instantiate()?);
    let raw = raw_chain(tick.function().as_raw(), &p, n)?;
    let timing = EventOptions::default().timing(true);
    let (e0, e1) = (
        device.create_event_with(&timing)?,
        device.create_event_with(&timing)?,
    );
    let time = |launch: &dyn Fn() -> cuda_graph::Result<()>| -> cuda_graph::Result<f64> {
        s.record(&e0)?;
        launch()?;
        s.record(&e1)?;
        e1.synchronize()?;
        Ok(e0.elapsed_ms(&e1)? as f64 * 1e3 / n as f64)
    };
    let raw_launch = || {
        // SAFETY: a live exec of this context and a live stream.
        check(
            unsafe { sys::cuGraphLaunch(raw, s.as_raw()) },
            "cuGraphLaunch",
        )
    };
    let (mut t_plain, mut t_pdl, mut t_raw) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        plain.launch(&s)?;
        pdl.launch(&s)?;
        raw_launch()?;
    }
    for _ in 0..runs {
        t_plain.push(time(&|| plain.launch(&s))?);
        t_pdl.push(time(&|| pdl.launch(&s))?);
        t_raw.push(time(&raw_launch)?);
    }
    s.synchronize()?;
    let done = p.to_vec()?[0] as usize;
    let want = n * (3 + runs) * 3;
    if done != want {
        return Err(cuda_graph::Error::invalid(
            cuda_graph::Refusal::Other,
            format!("the chains added {done}, not {want}"),
        ));
    }
    let (tp, td, tr) = (median(t_plain), median(t_pdl), median(t_raw));
    println!("chain of {n} kernels, GPU us per kernel (median of {runs}): plain {tp:.2}, pdl {td:.2}, raw pdl {tr:.2}");
    println!("ratio chain:pdl/plain {:.2}", td / tp);
    println!("ratio chain:crate/raw {:.2}", td / tr);

    // Host cost of launches and nodes with an attribute.
    let (_, greatest) = device.stream_priority_range()?;
    let cfg = one.with_priority(greatest);
    let reps = 1000;
    let f = tick.function().as_raw();
    let (mut lib, mut rawv) = (Vec::new(), Vec::new());
    // SAFETY: a plain C struct of integers and a union of integers: all-zero is valid.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attr.value.priority = greatest;
    let mut ptr = p.as_raw();
    let mut args = [(&mut ptr as *mut u64).cast::<std::ffi::c_void>()];
    for _ in 0..runs {
        let t = Instant::now();
        for _ in 0..reps {
            s.launch(&tick, cfg, &p)?;
        }
        lib.push(t.elapsed().as_secs_f64());
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..reps {
            let lc = sys::CUlaunchConfig {
                gridDimX: 1,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: 1,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: s.as_raw(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: `tick` takes one int*; `args` points at it; the context is current.
            check(
                unsafe { sys::cuLaunchKernelEx(&lc, f, args.as_mut_ptr(), std::ptr::null_mut()) },
                "cuLaunchKernelEx",
            )?;
        }
        rawv.push(t.elapsed().as_secs_f64());
        s.synchronize()?;
    }
    println!(
        "ratio launch+attr:crate/raw {:.2}",
        median(lib) / median(rawv)
    );

    let (mut lib, mut rawv) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let def = GraphDefinition::new(&device)?;
        let t = Instant::now();
        for _ in 0..reps {
            def.add_kernel(&[], &tick, cfg, &p)?;
        }
        lib.push(t.elapsed().as_secs_f64());
        drop(def);
        // SAFETY: raw calls on a graph made and destroyed here; the parameters as above.
        unsafe {
            let mut g = std::ptr::null_mut();
            check(sys::cuGraphCreate(&mut g, 0), "cuGraphCreate")?;
            let params = sys::CUDA_KERNEL_NODE_PARAMS {
                func: f,
                gridDimX: 1,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: 1,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: args.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            let t = Instant::now();
            for _ in 0..reps {
                let mut node = std::ptr::null_mut();
                check(
                    sys::cuGraphAddKernelNode_v2(&mut node, g, std::ptr::null(), 0, &params),
                    "cuGraphAddKernelNode",
                )?;
                check(
                    sys::cuGraphKernelNodeSetAttribute(node, attr.id, &attr.value),
                    "cuGraphKernelNodeSetAttribute",
                )?;
            }
            rawv.push(t.elapsed().as_secs_f64());
            sys::cuGraphDestroy(g);
        }
    }
    println!(
        "ratio node+attr:crate/raw {:.2}",
        median(lib) / median(rawv)
    );
    // SAFETY: the exec is idle (the stream was synchronized) and not used again.
    unsafe { sys::cuGraphExecDestroy(raw) };
    Ok(())
}

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if let Err(e) = run() {
        println!("pdl: skipped ({e})");
    }
}
