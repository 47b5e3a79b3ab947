use cuda_graph::prelude::*;

fn flow(device: &Device, graph: &mut Graph) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(Global)?;
    graph.update(&capturing)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
