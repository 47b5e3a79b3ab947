use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let handle = parent.create_conditional_handle(Some(1))?;
    let body = parent.add_if(&handle)?;
    let _graph = parent.end_building()?.instantiate()?;
    let _ = body.begin_building(Global)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
