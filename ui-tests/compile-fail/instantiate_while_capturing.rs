use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(Global)?;
    let _graph = capturing.instantiate()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
