use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let graph = device
        .create_graph_builder()?
        .begin_building(Global)?
        .end_building()?
        .instantiate()?;
    let stream = device.create_stream()?;
    drop(graph);
    graph.launch(&stream)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
