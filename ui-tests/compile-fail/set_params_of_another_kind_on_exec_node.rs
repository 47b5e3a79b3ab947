// Kernel parameters for a memset node of an exec: a `NodeParams<Kernel>` fits only a `KernelNode`.
use cuda_graph::prelude::*;
use cuda_graph::MemsetNode;

fn flow(def: &GraphDefinition, f: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    let m: MemsetNode = def.add_memset(&[], buf, 0i32)?;
    let mut graph = def.instantiate()?;
    // SAFETY: the kernel takes one int*.
    let p = unsafe { NodeParams::kernel_unchecked(f, LaunchConfig::single(), KernelArgs::new().arg(buf)) };
    graph.set_params(&m, p)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
