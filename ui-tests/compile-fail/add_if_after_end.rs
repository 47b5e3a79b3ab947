use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let handle = builder.create_conditional_handle(Some(1))?;
    let ended = builder.end_building()?;
    let _body = ended.add_if(&handle)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
