use cuda_graph::prelude::*;

fn flow(stream: &Stream, def: &GraphDefinition, scale: &Kernel<(*mut f32, u32)>, buf: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    // A dependent launch may begin before the kernel it follows has ended: only a kernel that
    // declared its wait (`unsafe { kernel.dependent() }`) can be one.
    stream.launch_dependent(scale, LaunchConfig::single(), (buf, 1))?;
    let first = def.add_kernel(&[], scale, LaunchConfig::single(), (buf, 1))?;
    def.add_dependent_kernel(&[&first], scale, LaunchConfig::single(), (buf, 1))?;
    Ok(())
}

fn main() {
    let _ = flow;
}
