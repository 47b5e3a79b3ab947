use cuda_graph::prelude::*;

fn flow(device: &Device, graph: &mut Graph) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let [left, _right] = builder.split::<2>()?;
    graph.update(&left)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
