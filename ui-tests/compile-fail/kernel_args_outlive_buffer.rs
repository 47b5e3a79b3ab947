use cuda_graph::prelude::*;

// `KernelArgs` borrows the buffers given to it: they must outlive the arguments. (What a launch,
// node or `NodeParams` made from them uses, it holds itself.)
fn flow(device: &Device, stream: &Stream, add_one: &Function) -> cuda_graph::Result<()> {
    let args = {
        let buf = device.alloc_zeroed::<i32>(1)?;
        KernelArgs::new().arg(&buf)
    };
    // SAFETY: add_one takes one int*.
    unsafe { stream.launch_unchecked(add_one, LaunchConfig::single(), &args)? };
    Ok(())
}

fn main() {
    let _ = flow;
}
