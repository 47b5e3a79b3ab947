use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let [left, right] = builder.split::<2>()?;
    let _def = left.graph_definition()?;
    builder.join([left, right])?;
    Ok(())
}

fn main() {
    let _ = flow;
}
