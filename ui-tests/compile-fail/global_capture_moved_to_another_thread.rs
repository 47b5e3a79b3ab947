use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(Global)?;
    std::thread::spawn(move || capturing.end_building().map(drop));
    Ok(())
}

fn main() {
    let _ = flow;
}
