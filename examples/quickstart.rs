//! The quick start, exactly as the README shows it: compile a kernel from CUDA C++ source, record
//! three launches of it into a CUDA graph, and replay the graph as one launch, twice.
//!
//! ```text
//! cargo run --example quickstart --features nvrtc
//! ```
//!
//! It needs a CUDA driver and NVRTC (`libnvrtc`, from the CUDA toolkit, on the library path);
//! without either it prints the error and exits with status 1.

use cuda_graph::prelude::*;

const SOURCE: &str = r#"
extern "C" __global__ void affine(int* p, int m, int b) {
    if (threadIdx.x == 0 && blockIdx.x == 0) p[0] = p[0] * m + b;
}
"#;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> cuda_graph::Result<()> {
    let device = Device::new(0)?;
    let module = device.compile(SOURCE)?;
    // SAFETY: this is `affine`'s parameter list, and it touches only p[0]: the one element of
    // any buffer it is given.
    let affine = unsafe { module.kernel::<(*mut i32, i32, i32)>("affine")? };
    let value = device.alloc_zeroed::<i32>(1)?;

    // Record three launches once...
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    for (m, b) in [(1, 1), (10, 0), (1, 2)] {
        builder.launch(&affine, LaunchConfig::single(), (&value, m, b))?;
    }
    let graph = builder.end_building()?.instantiate()?;

    // ...and replay them as one launch, twice: 0 becomes 12, then 132.
    let stream = device.create_stream()?;
    graph.launch(&stream)?;
    graph.launch(&stream)?;
    stream.synchronize()?;
    let result = value.to_vec()?[0];
    assert_eq!(result, 132);
    println!(
        "{}: two launches of a 3-kernel graph turned 0 into {result}",
        device.name()?
    );
    Ok(())
}
