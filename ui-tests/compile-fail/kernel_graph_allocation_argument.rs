use cuda_graph::prelude::*;

fn flow(def: &GraphDefinition, add_one: &Kernel<(*mut i32,)>, scratch: &GraphAllocation) -> cuda_graph::Result<()> {
    // Memory that exists only while the graph runs goes through `add_kernel_unchecked`.
    def.add_kernel(&[], add_one, LaunchConfig::single(), scratch)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
