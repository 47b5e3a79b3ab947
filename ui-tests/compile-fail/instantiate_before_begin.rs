use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let not_started = device.create_graph_builder()?;
    let _graph = not_started.instantiate()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
