use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let not_started = device.create_graph_builder()?;
    let _h = not_started.create_conditional_handle(Some(1))?;
    Ok(())
}

fn main() {
    let _ = flow;
}
