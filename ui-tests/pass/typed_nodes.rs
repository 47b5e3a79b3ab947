//! Typed nodes: dependencies, reading back, per-node updates of definitions and execs, enabling,
//! and the update-or-instantiate cache.
use cuda_graph::prelude::*;
use cuda_graph::{EmptyNode, EventRecordNode, MemsetNode};

fn flow(device: &Device, f: &Function, buf: &DeviceBuffer<i32>, e: &Event) -> cuda_graph::Result<()> {
    let def = GraphDefinition::new(device)?;
    let m: MemsetNode = def.add_memset(&[], buf, 0i32)?;
    // SAFETY: the kernel takes one int*.
    let k: KernelNode =
        unsafe { def.add_kernel_unchecked(&[&m], f, LaunchConfig::single(), &KernelArgs::new().arg(buf))? };
    let r: EventRecordNode = def.add_event_record(&[&m, &k], e)?;
    let j: EmptyNode = def.join(&[&k, &r])?;
    let untyped: GraphNode = k.into();
    let again: KernelNode = def.kernel_node(&untyped)?;
    assert_eq!(again, k);
    assert_eq!(def.predecessors(&j)?, [*k, *r]);
    def.set_params(&m, NodeParams::memset(buf, 1i32)?)?;
    def.set_params(&r, NodeParams::event_record(e))?;
    let (p, _cb) = NodeParams::host_callback(|| {});
    let (h, _first) = def.add_host_callback(&[&j], || {})?;
    def.set_params(&h, p)?;
    let graph = def.instantiate()?;
    // SAFETY: as above.
    graph.set_params(&k, unsafe {
        NodeParams::kernel_unchecked(f, LaunchConfig::single(), KernelArgs::new().arg(buf))
    })?;
    graph.set_enabled(&k, false)?;
    let _on: bool = graph.is_enabled(&m)?;
    let mut cache = GraphCache::new(InstantiateOptions::default());
    let _outcome: CacheOutcome = cache.refresh(&def)?;
    let (_u, _i): (u64, u64) = (cache.updates(), cache.instantiations());
    Ok(())
}

fn main() {
    let _ = flow;
}
