use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let [_only] = builder.split::<1>()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
