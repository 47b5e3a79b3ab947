//! Build a CUDA graph explicitly, node by node: a diamond (one node fans out to two, which join
//! into a fourth), followed by a conditional IF node whose body is itself a definition.
//!
//! ```text
//! cargo run --example explicit
//! ```
//!
//! Without a CUDA driver it prints one line naming the problem and exits with status 1.

use std::process::ExitCode;

use cuda_graph::prelude::*;

/// Test kernels shipped with the crate (see tests/kernels/README.md).
const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");

fn run() -> cuda_graph::Result<()> {
    let device = Device::new(0)?;
    let module = device.load_module(KERNELS)?;
    let (fill, add_one_at, copy, affine) = (
        module.function("fill")?,       // p[i] = v for i < n
        module.function("add_one_at")?, // p[i] += 1
        module.function("copy_i32")?,   // dst[i] = src[i] for i < n
        module.function("affine")?,     // p[0] = p[0] * m + b
    );
    let work = device.alloc_zeroed::<i32>(2)?;
    let result = device.alloc_zeroed::<i32>(2)?;
    let one = LaunchConfig::single();

    let def = GraphDefinition::new(&device)?;
    // SAFETY (all four kernels): the arguments match each kernel's parameters, and every index
    // stays below the buffers' length of 2.
    let bottom = unsafe {
        let top = def.add_kernel_unchecked(
            &[],
            &fill,
            one,
            &KernelArgs::new().arg(&work).arg(2i32).arg(1i32),
        )?;
        let left = def.add_kernel_unchecked(
            &[&top],
            &add_one_at,
            one,
            &KernelArgs::new().arg(&work).arg(0i32),
        )?;
        let right = def.add_kernel_unchecked(
            &[&top],
            &add_one_at,
            one,
            &KernelArgs::new().arg(&work).arg(1i32),
        )?;
        def.add_kernel_unchecked(
            &[&left, &right],
            &copy,
            one,
            &KernelArgs::new().arg(&work).arg(&result).arg(2i32),
        )?
    };

    // After the diamond: an IF node whose condition defaults to 1, so its body runs.
    let always = def.create_conditional_handle(Some(1))?;
    let (_if_node, body) = def.add_if(&[&bottom], &always)?;
    // SAFETY: affine takes (int*, int, int); `result` holds two ints.
    unsafe {
        body.add_kernel_unchecked(
            &[],
            &affine,
            one,
            &KernelArgs::new().arg(&result).arg(10i32).arg(0i32),
        )?
    };

    let (nodes, edges) = (def.nodes()?.len(), def.edges()?.len());
    let graph = def.instantiate(&GraphCompleteOptions::default())?;
    drop(def); // the exec keeps everything it uses alive

    let stream = device.create_stream()?;
    graph.launch(&stream)?;
    stream.synchronize()?;
    println!(
        "{} (driver {}): a diamond then an IF ({nodes} nodes, {edges} edges) turned [0, 0] into {:?} (expected [20, 2])",
        device.name()?,
        cuda_graph::driver_version()?,
        result.to_vec()?
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("explicit: {e}");
            ExitCode::FAILURE
        }
    }
}
