// An untyped `GraphNode` takes no parameters: read it back as a typed node first
// (`def.kernel_node(&node)?`), which checks its kind.
use cuda_graph::prelude::*;

fn flow(def: &GraphDefinition, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    let node: GraphNode = def.nodes()?[0];
    def.set_params(&node, NodeParams::memset(buf, 1i32)?)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
