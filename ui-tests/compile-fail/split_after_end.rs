use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let ended = device.create_graph_builder()?.begin_building(Global)?.end_building()?;
    let [_a, _b] = ended.split::<2>()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
