//! A binary module image can crash the driver itself: loading one is `unsafe`. PTX text loads
//! safely (`load_ptx`).
use cuda_graph::prelude::*;

fn flow(device: &Device, image: &[u8]) -> cuda_graph::Result<()> {
    let _module = device.load_module(image)?;
    let _ptx = device.load_ptx(".version 7.0")?; // safe
    Ok(())
}

fn main() {
    let _ = flow;
}
