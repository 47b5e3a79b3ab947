//! `KernelArgs` borrows buffers (no reference counting per launch); what is made from it holds
//! its own: `NodeParams` outlive the buffer variable, and a device graph given by value is held.
use cuda_graph::prelude::*;

fn params(device: &Device, add_one: &Function) -> cuda_graph::Result<NodeParams<cuda_graph::node_kind::Kernel>> {
    let buf = device.alloc_zeroed::<i32>(1)?;
    // SAFETY: add_one takes one int*.
    let p = unsafe { NodeParams::kernel_unchecked(add_one, LaunchConfig::single(), KernelArgs::new().arg(&buf)) };
    drop(buf);
    Ok(p)
}

fn per_launch(b: &GraphBuilder<Primary, Capturing<Relaxed>>, add_one: &Function, bufs: &[DeviceBuffer<i32>], g: &Graph) -> cuda_graph::Result<()> {
    for buf in bufs {
        // SAFETY: add_one takes one int* (the second argument is ignored).
        unsafe { b.launch_unchecked(add_one, LaunchConfig::single(), &KernelArgs::new().arg(buf).arg(g.device_handle()?))? };
    }
    let mut args = KernelArgs::new();
    for buf in bufs {
        args.push(buf).push(buf.len() as u32);
    }
    let _ = args;
    Ok(())
}

fn main() {
    let _ = (params, per_launch);
}
