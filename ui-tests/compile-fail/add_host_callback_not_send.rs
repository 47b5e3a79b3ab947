use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let shared = std::rc::Rc::new(std::cell::Cell::new(0));
    let inner = shared.clone();
    builder.add_host_callback(move || inner.set(inner.get() + 1))?;
    Ok(())
}

fn main() {
    let _ = flow;
}
