use cuda_graph::prelude::*;

fn flow(stream: &Stream, affine: &Kernel<(*mut i32, i32, i32)>, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    // Three parameters, two arguments.
    stream.launch(affine, LaunchConfig::single(), (buf, 2))?;
    Ok(())
}

fn main() {
    let _ = flow;
}
