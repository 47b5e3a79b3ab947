use cuda_graph::prelude::*;

fn flow(device: &Device, handle: ConditionalHandle) -> cuda_graph::Result<()> {
    let not_started = device.create_graph_builder()?;
    let _body = not_started.add_while(&handle)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
