use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(Global)?;
    let _def = capturing.graph_definition()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
