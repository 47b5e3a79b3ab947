use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(Relaxed)?;
    let ended = std::thread::spawn(move || capturing.end_building()).join().expect("thread")?;
    let _graph = ended.instantiate()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
