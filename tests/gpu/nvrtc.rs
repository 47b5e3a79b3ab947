//! Kernels from CUDA C++ source (feature `nvrtc`): compiled for the device, run, and a refused
//! source's log.

use cuda_graph::prelude::*;
use cuda_graph::Refusal;

use crate::args;
use crate::support::{Gpu, Needs, TestResult};

crate::gpu_tests! {
    "nvrtc";
    Needs::Nvrtc =>
        compiled_kernel_runs_in_a_graph,
        refused_source_gives_the_compiler_log;
}

const SOURCE: &str = r#"
extern "C" __global__ void scale_add(int* p, int n, int m, int b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * m + b + OFFSET;
}
"#;

fn compiled_kernel_runs_in_a_graph(gpu: &Gpu) -> TestResult {
    let module = gpu.device.compile_with(SOURCE, &["-DOFFSET=100"])?;
    let f = module.function("scale_add")?;
    let buf = gpu.device.htod(&[1i32, 2, 3, 4])?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: scale_add(int* p, int n, int m, int b) over the 4 ints of `buf`.
    unsafe {
        b.launch_unchecked(
            &f,
            LaunchConfig::for_num_elems(4),
            &args![&buf, 4i32, 3i32, 1i32],
        )?
    };
    let g = b.end_building()?.instantiate()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [104, 107, 110, 113]);
    // Without the define the source does not compile.
    assert!(matches!(
        gpu.device.compile(SOURCE),
        Err(Error::Compile { .. })
    ));
    Ok(())
}

fn refused_source_gives_the_compiler_log(gpu: &Gpu) -> TestResult {
    match gpu
        .device
        .compile(r#"extern "C" __global__ void broken(int* p) { p[0] = undeclared_name; }"#)
    {
        Err(Error::Compile { result, log }) => {
            println!("    {result}: {}", log.lines().next().unwrap_or(""));
            assert!(log.contains("undeclared_name"), "{log}");
            assert!(result.contains("COMPILATION"), "{result}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // A NUL byte in the source is refused before NVRTC.
    assert!(matches!(
        gpu.device.compile("extern \"C\" __global__ void k() {}\0"),
        Err(e) if e.refusal() == Some(Refusal::Image)
    ));
    Ok(())
}
