use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let mut count = 0;
    builder.add_host_callback(|| count += 1)?;
    println!("{count}");
    Ok(())
}

fn main() {
    let _ = flow;
}
