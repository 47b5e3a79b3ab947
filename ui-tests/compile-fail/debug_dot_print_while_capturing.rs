use cuda_graph::prelude::*;
use cuda_graph::GraphDebugPrintOptions;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(Global)?;
    capturing.debug_dot_print("graph.dot", &GraphDebugPrintOptions::default())?;
    Ok(())
}

fn main() {
    let _ = flow;
}
