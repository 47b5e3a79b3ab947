use cuda_graph::prelude::*;

fn flow(device: &Device, kernel: &Function, a: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let handle = parent.create_conditional_handle(None)?;
    {
        let body = parent.add_if(&handle)?.begin_building(Global)?;
        let inner = body.create_conditional_handle(Some(0))?;
        let nested = body.add_while(&inner)?.begin_building(Global)?;
        // SAFETY: the kernel takes one int*.
        unsafe { nested.launch_unchecked(kernel, LaunchConfig::single(), &KernelArgs::new().arg(a))? };
        nested.end_building()?;
        body.end_building()?;
    }
    {
        let h2 = parent.create_conditional_handle(Some(1))?;
        let (then_body, _else_body_left_empty) = parent.add_if_else(&h2)?;
        then_body.begin_building(Global)?.end_building()?;
        let h3 = parent.create_conditional_handle(Some(1))?;
        for body in parent.add_switch(&h3, 3)? {
            let [_f1, _f2] = body.begin_building(Global)?.split::<2>()?;
        }
    }
    let _graph = parent.end_building()?.instantiate()?;
    Ok(())
}

fn main() {
    let _ = flow;
}
