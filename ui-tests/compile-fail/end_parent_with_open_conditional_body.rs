use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let handle = parent.create_conditional_handle(Some(1))?;
    let body = parent.add_if(&handle)?.begin_building(Global)?;
    let _ended = parent.end_building()?;
    body.end_building()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
