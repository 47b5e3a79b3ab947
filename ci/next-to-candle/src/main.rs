//! Builds where a candle user's crate builds (cuda-graph checks at compile time that its bindings
//! and cudarc's are of one CUDA version), and opens the driver where there is one.
fn main() {
    println!(
        "bindings: CUDA {}",
        cudarc::driver::sys::CUDA_VERSION
    );
    match cuda_graph::driver_version() {
        Ok(v) => println!("driver {v}"),
        Err(e) => println!("{e}"),
    }
}
