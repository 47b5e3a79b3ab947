use cuda_graph::prelude::*;

fn flow(def: &GraphDefinition, fill: &Kernel<(*mut i32, u32, i32)>, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    // `n` is an `unsigned`: a `usize` is not converted silently.
    let n: usize = buf.len();
    def.add_kernel(&[], fill, LaunchConfig::single(), (buf, n, 7))?;
    Ok(())
}

fn main() {
    let _ = flow;
}
