use cuda_graph::prelude::*;
use cuda_graph::GraphDebugPrintOptions;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let [left, _right] = builder.split::<2>()?;
    left.debug_dot_print("graph.dot", &GraphDebugPrintOptions::default())?;
    Ok(())
}

fn main() {
    let _ = flow;
}
