use cuda_graph::prelude::*;
use cuda_graph::GraphDebugPrintOptions;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let not_started = device.create_graph_builder()?;
    not_started.debug_dot_print("graph.dot", &GraphDebugPrintOptions::default())?;
    Ok(())
}

fn main() {
    let _ = flow;
}
