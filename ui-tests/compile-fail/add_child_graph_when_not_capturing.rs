use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let child = device.create_graph_builder()?.begin_building(Global)?.end_building()?;
    let parent = device.create_graph_builder()?;
    parent.add_child_graph(&child)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
