use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let not_started = device.create_graph_builder()?;
    let [_a, _b] = not_started.split::<2>()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
