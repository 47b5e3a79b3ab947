use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let ended = device.create_graph_builder()?.begin_building(Global)?.end_building()?;
    ended.add_host_callback(|| println!("never"))?;
    Ok(())
}

fn main() {
    let _ = flow;
}
