use cuda_graph::prelude::*;
use cuda_graph::DependentKernel;

fn flow(
    stream: &Stream,
    produce: &Kernel<(*mut f32, u32)>,
    scale: &DependentKernel<(*mut f32, u32)>,
    buf: &DeviceBuffer<f32>,
) -> cuda_graph::Result<()> {
    let config = LaunchConfig::for_num_elems(buf.len() as u32);
    stream.launch(produce, config, (buf, 1))?;
    stream.launch_dependent(scale, config, (buf, 1))?;
    let builder = stream.create_graph_builder().begin_building(Global)?;
    builder.launch(produce, config, (buf, 1))?;
    builder.launch_dependent(scale, config, (buf, 1))?;
    let def = builder.end_building()?.graph_definition()?;
    let first = def.add_kernel(&[], produce, config, (buf, 1))?;
    let then = def.add_dependent_kernel(&[&first], scale, config, (buf, 1))?;
    def.set_params(&then, NodeParams::dependent_kernel(scale, config, (buf, 2))?)?;
    // A plain launch of the same kernel is always allowed.
    stream.launch(scale.kernel(), config.with_priority(0), (buf, 1))?;
    Ok(())
}

fn main() {
    let _ = flow;
}
