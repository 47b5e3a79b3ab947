//! Typed kernels launch safely in every front end, with values, buffers, views, handles.
use cuda_graph::prelude::*;

fn flow(device: &Device, module: &Module, stream: &Stream) -> cuda_graph::Result<()> {
    // SAFETY: (never runs) the signatures of the test kernels.
    let add_one = unsafe { module.kernel::<(*mut i32,)>("add_one")? };
    let affine = unsafe { module.kernel::<(*mut i32, i32, i32)>("affine")? };
    let copy = unsafe { module.kernel::<(*const f32, *mut f32, i32)>("copy_f32")? };
    let set = unsafe { module.kernel::<(ConditionalHandle, u32)>("set_condition")? };
    let empty = unsafe { module.kernel::<()>("empty_kernel")? };
    let mut buf = device.alloc_zeroed::<i32>(4)?;
    let (a, b) = (device.alloc_zeroed::<f32>(8)?, device.alloc_zeroed::<f32>(8)?);
    let cfg = LaunchConfig::single();
    stream.launch(&add_one, cfg, &buf)?;
    stream.launch(&add_one, cfg, (&buf,))?;
    stream.launch(&add_one, cfg, &mut buf)?;
    stream.launch(&add_one, cfg, &buf.slice(1..3)?)?;
    stream.launch(&affine, cfg, (&buf, 2, -1))?;
    stream.launch(&copy, cfg, (&a, &b, 8))?;
    stream.launch(&empty, cfg, ())?;
    let builder = device.create_graph_builder()?.begin_building(Global)?;
    let h = builder.create_conditional_handle(Some(0))?;
    builder.launch(&set, cfg, (h, 1))?;
    builder.launch(&affine, cfg, (&buf, 3, 0))?;
    let graph = builder.end_building()?.instantiate()?;
    let def = GraphDefinition::new(device)?;
    let k = def.add_kernel(&[], &affine, cfg, (&buf, 1, 1))?;
    def.set_params(&k, NodeParams::kernel(&affine, cfg, (&buf, 1, 2))?)?;
    let _ = (graph, k);
    Ok(())
}

fn main() {
    let _ = flow;
}
