use cuda_graph::prelude::*;

fn flow(stream: &Stream, affine: &Kernel<(*mut i32, i32, i32)>, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    // `affine` takes an `int*`: a buffer of `f32` is refused.
    stream.launch(affine, LaunchConfig::single(), (buf, 2, 1))?;
    Ok(())
}

fn main() {
    let _ = flow;
}
