//! The explicit definition's legal flows: built from scratch, viewed from an ended builder, and
//! as conditional bodies (never captured, and captured then extended).
use cuda_graph::prelude::*;
use cuda_graph::{GraphDebugPrintOptions, NodeType};

fn flow(device: &Device, f: &Function, buf: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    let args = KernelArgs::new().arg(buf);
    let def = GraphDefinition::new(device)?;
    let a = def.add_memset(&[], buf, 0i32)?;
    // SAFETY: the kernel takes one int*.
    let b = unsafe { def.add_kernel_unchecked(&[&a], f, LaunchConfig::single(), &args)? };
    let c = unsafe { def.add_kernel_unchecked(&[&a], f, LaunchConfig::single(), &args)? };
    let d = def.join(&[&b, &c])?;
    let (_alloc, scratch) = def.add_mem_alloc(&[&d], 64)?;
    def.add_mem_free(&[&d], scratch)?;
    let (_n, _cb) = def.add_host_callback(&[&d], || {})?;
    let h = def.create_conditional_handle(Some(1))?;
    let (_if, body) = def.add_if(&[&d], &h)?;
    unsafe { body.add_kernel_unchecked(&[], f, LaunchConfig::single(), &args)? };
    let _types: Vec<NodeType> = def
        .nodes()?
        .iter()
        .map(|n| def.node_type(n))
        .collect::<cuda_graph::Result<_>>()?;
    let _edges: Vec<(GraphNode, GraphNode)> = def.edges()?;
    def.debug_dot_print("/tmp/def.dot", &GraphDebugPrintOptions::default())?;
    let copy = def.try_clone()?;
    let graph = def.instantiate()?;
    graph.update(&copy)?;

    // A view of an ended builder, extended, used as a child and an update source.
    let ended = device.create_graph_builder()?.begin_building(Global)?.end_building()?;
    let view = ended.graph_definition()?;
    view.add_empty(&[])?;
    let outer = GraphDefinition::new(device)?;
    outer.add_child_graph(&[], &ended)?;
    outer.add_child_graph(&[], &view)?;
    let capturing = device.create_graph_builder()?.begin_building(Global)?;
    capturing.add_child_graph(&view)?;
    graph.update(&view)?;

    // Conditional bodies: never captured, and captured then extended.
    let parent = device.create_graph_builder()?.begin_building(Global)?;
    let h = parent.create_conditional_handle(Some(1))?;
    {
        let never_captured = parent.add_if(&h)?;
        let explicit = never_captured.graph_definition()?;
        unsafe { explicit.add_kernel_unchecked(&[], f, LaunchConfig::single(), &args)? };
        let (then_body, else_body) = parent.add_if_else(&h)?;
        let ended_body = then_body.begin_building(Global)?.end_building()?;
        let hybrid = ended_body.graph_definition()?;
        hybrid.add_empty(&[])?;
        drop(else_body);
    }
    let _graph = parent.end_building()?.instantiate()?;
    Ok(())
}

fn definitions_are_send_and_sync() {
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<GraphDefinition>();
    is_send_sync::<GraphNode>();
    is_send_sync::<GraphAllocation>();
}

fn main() {
    let _ = flow;
    let _ = definitions_are_send_and_sync;
}
