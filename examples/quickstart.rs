//! The quick start: capture a few kernels into a CUDA graph, instantiate it, launch it, print
//! the result.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Without a CUDA driver it prints one line naming the problem and exits with status 1.

use std::process::ExitCode;

use cuda_graph::prelude::*;

/// Test kernels shipped with the crate: `affine(int* p, int m, int b)` computes `p[0] = p[0]*m + b`.
const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");

fn run() -> cuda_graph::Result<()> {
    let device = Device::new(0)?;
    let module = device.load_module(KERNELS)?;
    let affine = module.function("affine")?;
    let value = device.alloc_zeroed::<i32>(1)?;

    // Record three kernels once...
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    for (m, b) in [(1, 1), (10, 0), (1, 2)] {
        // SAFETY: affine takes (int*, int, int) and `value` holds one int.
        unsafe {
            builder.launch(
                &affine,
                LaunchConfig::single(),
                &KernelArgs::new().arg(&value).arg(m).arg(b),
            )?
        };
    }
    let graph = builder
        .end_building()?
        .complete(&GraphCompleteOptions::default())?;

    // ...and replay them as one launch, twice.
    let stream = device.create_stream()?;
    graph.launch(&stream)?;
    graph.launch(&stream)?;
    stream.synchronize()?;

    let result = value.to_vec()?[0];
    println!(
        "{} (driver {}): two launches of a 3-kernel graph turned 0 into {result}",
        device.name()?,
        cuda_graph::driver_version()?
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: {e}");
            ExitCode::FAILURE
        }
    }
}
