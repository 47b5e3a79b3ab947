use cuda_graph::prelude::*;

fn flow(module: &Module) -> cuda_graph::Result<()> {
    // A `Vec` is not a kernel parameter type.
    // SAFETY: (never runs).
    let _k = unsafe { module.kernel::<(Vec<i32>, u32)>("fill")? };
    Ok(())
}

fn main() {
    let _ = flow;
}
