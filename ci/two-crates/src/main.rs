//! Uses cudarc (its safe driver API and cuBLAS) and cuda-graph in one program, both built against
//! the CUDA 13.0 bindings. Building it is the check; without a driver it prints one line.

use cuda_graph::Device;
use cudarc::driver::CudaContext;

/// A cudarc type from a feature cuda-graph does not use.
type Blas = cudarc::cublas::CudaBlas;

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
