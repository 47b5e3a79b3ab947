use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let not_started = device.create_graph_builder()?;
    let _def = not_started.graph_definition()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
