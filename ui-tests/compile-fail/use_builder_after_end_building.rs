use cuda_graph::prelude::*;

fn flow(device: &Device, kernel: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(Global)?;
    let _ended = capturing.end_building()?;
    // SAFETY: not reached.
    unsafe { capturing.launch_unchecked(kernel, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    Ok(())
}

fn main() {
    let _ = flow;
}
