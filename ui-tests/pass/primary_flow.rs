//! The primary builder's legal flow, start to finish.
use cuda_graph::prelude::*;
use cuda_graph::GraphDebugPrintOptions;

fn flow(device: &Device, f: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?;
    let builder = builder.begin_building(Global)?;
    // SAFETY: the kernel takes one int*.
    unsafe { builder.launch_unchecked(f, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    builder.capture_status()?;
    let ended = builder.end_building()?;
    ended.debug_dot_print("/tmp/g.dot", &GraphDebugPrintOptions::all())?;
    let graph = ended.instantiate()?;
    let again = ended.instantiate_with(&InstantiateOptions::new().use_node_priority(true))?;
    let stream = device.create_stream()?;
    graph.launch(&stream)?;
    again.upload(&stream)?;
    graph.update(&ended)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
