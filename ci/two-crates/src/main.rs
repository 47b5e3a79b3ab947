//! Uses cudarc (its safe driver API and cuBLAS) and cuda-graph in one program, both built against
//! the CUDA 13.0 bindings, each glob-imported as a user of both would. Building it is the check;
//! without a driver it prints one line.

use cuda_graph::prelude::*;
use cudarc::driver::*;
// The one name both globs hold (each crate has its own launch configuration): an explicit import
// picks one, and beats both globs.
use cuda_graph::LaunchConfig;

/// A cudarc type from a feature cuda-graph does not use.
type Blas = cudarc::cublas::CudaBlas;

/// What a program using both names daily, unqualified: cudarc's context, stream and slices beside
/// cuda-graph's device, buffers, typed kernels, builders, definitions, execs and cache. Never
/// called (it needs a GPU); that it compiles is the check.
#[allow(dead_code)]
fn daily(
    ctx: &std::sync::Arc<CudaContext>,
    device: &Device,
    fill: &Kernel<(*mut i32, i32, i32)>,
) -> Result<()> {
    let theirs: CudaSlice<i32> = ctx.default_stream().alloc_zeros(64).expect("cudarc alloc");
    let stream: Stream = device.create_stream()?;
    let buf: DeviceBuffer<i32> = device.alloc_zeroed(64)?;
    let builder = stream.create_graph_builder().begin_building(Relaxed)?;
    builder.launch(fill, LaunchConfig::for_num_elems(64), (&buf, 64, 1))?;
    let graph: Graph = builder.end_building()?.instantiate()?;
    graph.launch(&stream)?;
    let def = GraphDefinition::new(device)?;
    let node = def.add_memset(&[], &buf, 0i32)?;
    let mut cache = GraphCache::new(InstantiateOptions::new());
    cache.refresh(&def)?;
    if let Some(exec) = cache.graph() {
        exec.set_params(&node, NodeParams::memset(&buf, 2i32)?)?;
    }
    stream.synchronize()?;
    let _: Result<()> = Err(Error::DriverNotFound);
    drop(theirs);
    Ok(())
}

fn main() {
    println!(
        "cudarc bindings: CUDA {}; cuBLAS handle type: {}",
        cudarc::driver::sys::CUDA_VERSION,
        std::any::type_name::<Blas>()
    );
    // cudarc's loader panics without libcuda: ask cuda-graph first.
    match cuda_graph::driver_version() {
        Err(e) => println!("no CUDA driver here: {e}"),
        Ok(v) => {
            let ctx = CudaContext::new(0).expect("cudarc: CudaContext::new(0)");
            let device = Device::new(0).expect("cuda-graph: Device::new(0)");
            println!(
                "driver {v}: cudarc context on device {}, cuda-graph device {} ({})",
                ctx.ordinal(),
                device.ordinal(),
                device.name().unwrap_or_default()
            );
        }
    }
}
