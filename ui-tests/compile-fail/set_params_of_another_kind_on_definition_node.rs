// Memset parameters for a kernel node: a `NodeParams<Memset>` fits only a `MemsetNode`.
use cuda_graph::prelude::*;

fn flow(def: &GraphDefinition, f: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    // SAFETY: the kernel takes one int*.
    let k: KernelNode =
        unsafe { def.add_kernel_unchecked(&[], f, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    def.set_params(&k, NodeParams::memset(buf, 1i32)?)?;
    Ok(())
}

fn main() {
    let _ = flow;
}
