use cuda_graph::prelude::*;

fn flow(device: &Device, kernel: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let [left, right] = parent.split::<2>()?;
    let _ended = parent.end_building()?;
    // SAFETY: not reached; the fork is still in use below.
    unsafe { left.launch_unchecked(kernel, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    parent_join_later(left, right);
    Ok(())
}

fn parent_join_later<T, U>(_a: T, _b: U) {}

fn main() {
    let _ = flow;
}
