use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let capturing = device.create_graph_builder()?.begin_building(Global)?;
    let [left, right] = capturing.split::<2>()?;
    std::thread::scope(|s| {
        s.spawn(move || drop(left));
    });
    drop(right);
    Ok(())
}

fn main() {
    let _ = flow;
}
