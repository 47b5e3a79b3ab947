use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(ThreadLocal)?;
    std::thread::scope(|s| {
        s.spawn(|| capturing.capture_status());
    });
    let _ended = capturing.end_building()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
