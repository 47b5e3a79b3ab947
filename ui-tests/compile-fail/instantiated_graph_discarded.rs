#![deny(unused_must_use)]
use cuda_graph::prelude::*;

fn flow(device: &Device) -> cuda_graph::Result<()> {
    let ended = device
        .create_graph_builder()?
        .begin_building(Global)?
        .end_building()?;
    // The exec is made and dropped at once: nothing ever launches it.
    ended.instantiate()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
