//! Fork/join across streams: one capture splits into three forks that fill different buffers
//! concurrently, joins them, and sums the results in the parent.
//!
//! ```text
//! cargo run --example fork_join
//! ```

use std::process::ExitCode;

use cuda_graph::prelude::*;

use cuda_graph::GraphDebugPrintOptions;

const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");
const N: usize = 1 << 20;

fn run() -> cuda_graph::Result<()> {
    let device = Device::new(0)?;
    // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
    let module = unsafe { device.load_module(KERNELS)? };
    // SAFETY: the kernels' parameter lists; `fill_slice` writes p.ptr[i] for i < p.len only,
    // `add_one` p[0] only.
    let (fill, add_one) = unsafe {
        (
            module.kernel::<(Slice<i32>, i32)>("fill_slice")?,
            module.kernel::<(*mut i32,)>("add_one")?,
        )
    };
    let bufs = [
        device.alloc_zeroed::<i32>(N)?,
        device.alloc_zeroed::<i32>(N)?,
        device.alloc_zeroed::<i32>(N)?,
    ];
    let counter = device.alloc_zeroed::<i32>(1)?;
    let cfg = LaunchConfig::for_num_elems(N as u32);

    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let forks = parent.split::<3>()?;
    for (i, (fork, buf)) in forks.iter().zip(&bufs).enumerate() {
        fork.launch(&fill, cfg, (buf, i as i32 + 1))?;
    }
    // The parent cannot end its capture until the forks are joined (or dropped).
    parent.join(forks)?;
    // Runs after all three fills.
    parent.launch(&add_one, LaunchConfig::single(), &counter)?;
    let ended = parent.end_building()?;
    let dot = std::env::temp_dir().join("fork_join.dot");
    ended.debug_dot_print(&dot, &GraphDebugPrintOptions::default())?;
    let graph = ended.instantiate()?;

    let stream = device.create_stream()?;
    graph.launch(&stream)?;
    stream.synchronize()?;
    let firsts: Vec<i32> = bufs
        .iter()
        .map(|b| b.to_vec().map(|v| v[N - 1]))
        .collect::<Result<_, _>>()?;
    println!(
        "three forks filled {N} ints each with {firsts:?}; the join ran after them ({} time); DOT at {}",
        counter.to_vec()?[0],
        dot.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fork_join: {e}");
            ExitCode::FAILURE
        }
    }
}
