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
    // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
    let module = unsafe { device.load_module(KERNELS)? };
    // SAFETY (all four): each is the kernel's parameter list, and each kernel stays within the
    // buffers it is given — the slice kernels loop to the length they receive, `add_one` and
    // `affine` touch element 0 only (and no buffer is empty).
    let (fill, add_one, copy, affine) = unsafe {
        (
            module.kernel::<(Slice<i32>, i32)>("fill_slice")?, // p[i] = v for i < p.len
            module.kernel::<(*mut i32,)>("add_one")?,          // p[0] += 1
            module.kernel::<(Slice<i32>, Slice<i32>)>("copy_slice_i32")?, // dst[i] = src[i]
            module.kernel::<(*mut i32, i32, i32)>("affine")?,  // p[0] = p[0] * m + b
        )
    };
    let work = device.alloc_zeroed::<i32>(2)?;
    let result = device.alloc_zeroed::<i32>(2)?;
    let one = LaunchConfig::single();

    let def = GraphDefinition::new(&device)?;
    let top = def.add_kernel(&[], &fill, one, (&work, 1))?;
    // Each side of the diamond increments one element: a one-element view of `work`.
    let left = def.add_kernel(&[&top], &add_one, one, &work.slice(0..1)?)?;
    let right = def.add_kernel(&[&top], &add_one, one, &work.slice(1..2)?)?;
    let bottom = def.add_kernel(&[&left, &right], &copy, one, (&work, &result))?;

    // After the diamond: an IF node whose condition defaults to 1, so its body runs.
    let always = def.create_conditional_handle(Some(1))?;
    let (_if_node, body) = def.add_if(&[&bottom], &always)?;
    body.add_kernel(&[], &affine, one, (&result, 10, 0))?;

    let (nodes, edges) = (def.nodes()?.len(), def.edges()?.len());
    let graph = def.instantiate()?;
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
