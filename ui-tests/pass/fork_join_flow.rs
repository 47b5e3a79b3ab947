use cuda_graph::prelude::*;

fn flow(device: &Device, kernel: &Function, a: &DeviceBuffer<i32>, b: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let [left, right] = parent.split::<2>()?;
    {
        // Forks can split again, and a fork dropped without `join` is joined.
        let [_x, _y] = right.split::<2>()?;
    }
    // SAFETY: the kernel takes one int*.
    unsafe {
        left.launch_unchecked(kernel, LaunchConfig::single(), &KernelArgs::new().arg(a))?;
        right.launch_unchecked(kernel, LaunchConfig::single(), &KernelArgs::new().arg(b))?;
    }
    parent.join([left, right])?;
    let child = device.create_graph_builder()?.begin_building(Relaxed)?.end_building()?;
    parent.add_child_graph(&child)?;
    let _cb = parent.add_host_callback(|| println!("host"))?;
    let graph = parent.end_building()?.instantiate()?;
    graph.launch(&device.create_stream()?)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
