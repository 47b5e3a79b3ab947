use cuda_graph::prelude::*;

fn flow(device: &Device, graph: &mut Graph) -> cuda_graph::Result<()> {
    let not_started = device.create_graph_builder()?;
    graph.update(&not_started)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
