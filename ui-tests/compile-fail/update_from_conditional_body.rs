use cuda_graph::prelude::*;

fn flow(device: &Device, graph: &mut Graph) -> cuda_graph::Result<()> {
    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let handle = parent.create_conditional_handle(Some(1))?;
    let body = parent.add_if(&handle)?.begin_building(Global)?.end_building()?;
    graph.update(&body)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
