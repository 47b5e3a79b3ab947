use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?;
    let _capturing = builder.begin_building(Global)?;
    let _again = builder.begin_building(Relaxed)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
