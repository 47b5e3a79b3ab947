use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let [left, _right] = builder.split::<2>()?;
    let _graph = left.instantiate()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
