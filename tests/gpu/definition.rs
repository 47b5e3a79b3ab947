//! The explicit API: every node type, topology families, mutation, conditionals, hybrid bodies,
//! update from a definition, and the lifetimes of everything a node uses.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cuda_graph::prelude::*;

use cuda_graph::Refusal;
use cuda_graph::{
    DriverVersion, GraphDebugPrintOptions, MemAllocOptions, Memset2d, NodeType, PeerAccess,
};

use crate::args;
use crate::support::{eventually, launch, one, run, stays, Gpu, Needs, TestResult, KERNELS};

const GPU: Needs = Needs::Gpu;
const V12_3: Needs = Needs::Conditional(DriverVersion::V12_3);
const V12_8: Needs = Needs::Conditional(DriverVersion::V12_8);

crate::gpu_tests! {
    "definition";
    GPU =>
        kernel_node_runs,
        memset_nodes_of_1_2_and_4_byte_values,
        memset_2d_sets_only_the_rectangle,
        memcpy_node_copies_between_buffers,
        empty_node_orders_its_dependencies,
        event_record_node_records_after_its_dependencies,
        event_wait_node_waits_for_other_stream_work,
        host_callback_node_runs_once_per_launch,
        child_graph_nodes_embed_copies,
        mem_alloc_and_free_nodes,
        topology_single,
        topology_chain,
        topology_fan_out,
        topology_fan_in_via_join,
        topology_diamond,
        topology_disconnected,
        node_types_predecessors_and_successors,
        mutation_destroy_a_node,
        mutation_insert_a_node_into_a_chain,
        mutation_rewire_a_chain_into_a_fan_in,
        bad_nodes_and_edges_are_errors,
        bad_node_arguments_are_errors;
    V12_3 => if_node;
    V12_8 => if_else_node;
    V12_3 => while_node;
    V12_8 =>
        switch_node,
        switch_with_zero_branches_is_an_error;
    V12_3 =>
        foreign_conditional_handle_is_an_error,
        conditional_body_cannot_stand_alone,
        destroyed_conditional_node_kills_its_bodies;
    GPU => view_of_an_ended_builder_sees_and_extends_the_capture;
    V12_3 =>
        hybrid_body_captured_then_extended,
        hybrid_body_never_captured,
        body_definition_refused_while_the_body_captures;
    GPU =>
        update_an_exec_from_a_definition,
        failed_update_from_a_definition_adopts_nothing,
        an_update_releases_a_source_never_launched_at_once,
        embed_a_definition_in_a_capture,
        clone_is_independent_and_keeps_operands_alive,
        exec_runs_after_definition_and_operands_are_dropped,
        operands_released_after_last_definition_and_exec,
        nothing_released_while_a_launch_runs,
        an_exec_whose_launches_ended_releases_as_it_is_dropped;
    V12_3 => body_operands_live_as_long_as_the_exec;
    GPU =>
        mem_alloc_options,
        destroying_a_node_releases_what_it_used,
        clones_children_and_updated_execs_keep_a_destroyed_nodes_operands;
    V12_3 => destroying_a_conditional_node_releases_its_bodies_operands;
    GPU =>
        concurrent_additions_from_threads,
        dot_print_of_a_definition;
}

/// A kernel node; each call site names the kernel's parameters it matches.
fn k(
    def: &GraphDefinition,
    deps: &[&GraphNode],
    f: &Function,
    config: LaunchConfig,
    args: KernelArgs,
) -> cuda_graph::Result<KernelNode> {
    // SAFETY: every caller passes arguments matching the kernel's parameters and in-bounds
    // buffers (see the comment at each call).
    unsafe { def.add_kernel_unchecked(deps, f, config, &args) }
}

fn counts(def: &GraphDefinition) -> cuda_graph::Result<(usize, usize)> {
    Ok((def.nodes()?.len(), def.edges()?.len()))
}

// ---- every node type -------------------------------------------------------------------------

fn kernel_node_runs(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // affine(int*, int, int)
    let n = k(&def, &[], &gpu.f("affine"), one(), args![&buf, 1i32, 5i32])?;
    assert_eq!(def.node_type(&n)?, NodeType::Kernel);
    let g = def.instantiate()?;
    launch(gpu, &g)?;
    launch(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [10]);
    Ok(())
}

fn memset_nodes_of_1_2_and_4_byte_values(gpu: &Gpu) -> TestResult {
    let b8 = gpu.device.alloc_zeroed::<u8>(5)?;
    let b16 = gpu.device.alloc_zeroed::<u16>(3)?;
    let b32 = gpu.device.alloc_zeroed::<u32>(3)?;
    let bi = gpu.device.alloc_zeroed::<i32>(2)?;
    let bf = gpu.device.alloc_zeroed::<f32>(2)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let m = def.add_memset(&[], &b8, 0xabu8)?;
    def.add_memset(&[], &b16, 0xbeefu16)?;
    def.add_memset(&[], &b32, 0xdead_beefu32)?;
    def.add_memset(&[], &bi, -7i32)?;
    def.add_memset(&[], &bf, 1.5f32)?;
    assert_eq!(def.node_type(&m)?, NodeType::Memset);
    assert_eq!(counts(&def)?, (5, 0));
    run(gpu, &def)?;
    assert_eq!(b8.to_vec()?, [0xab; 5]);
    assert_eq!(b16.to_vec()?, [0xbeef; 3]);
    assert_eq!(b32.to_vec()?, [0xdead_beef; 3]);
    assert_eq!(bi.to_vec()?, [-7, -7]);
    assert_eq!(bf.to_vec()?, [1.5, 1.5]);
    Ok(())
}

fn memset_2d_sets_only_the_rectangle(gpu: &Gpu) -> TestResult {
    // 4 rows of pitch 8; set 3 elements in each of the first 2 rows.
    let buf = gpu.device.alloc_zeroed::<u16>(32)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let shape = Memset2d {
        width: 3,
        height: 2,
        pitch: 8,
    };
    def.add_memset_2d(&[], &buf, 9u16, shape)?;
    run(gpu, &def)?;
    let got = buf.to_vec()?;
    for (i, v) in got.iter().enumerate() {
        let inside = i / 8 < 2 && i % 8 < 3;
        assert_eq!(*v, if inside { 9 } else { 0 }, "element {i}: {got:?}");
    }
    Ok(())
}

fn memcpy_node_copies_between_buffers(gpu: &Gpu) -> TestResult {
    let src = gpu.device.htod(&[1i32, 2, 3, 4])?;
    let dst = gpu.device.alloc_zeroed::<i32>(4)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let c = def.add_memcpy(&[], &dst, &src)?;
    assert_eq!(def.node_type(&c)?, NodeType::Memcpy);
    run(gpu, &def)?;
    assert_eq!(dst.to_vec()?, [1, 2, 3, 4]);
    Ok(())
}

fn empty_node_orders_its_dependencies(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // affine(int*, int, int): +1, then (only through the empty node) *10.
    let plus = k(&def, &[], &affine, one(), args![&buf, 1i32, 1i32])?;
    let e = def.add_empty(&[&plus])?;
    let times = k(&def, &[&e], &affine, one(), args![&buf, 10i32, 0i32])?;
    assert_eq!(def.node_type(&e)?, NodeType::Empty);
    let mut edges = def.edges()?;
    edges.sort_by_key(|(from, _)| *from != *plus);
    assert_eq!(edges, [(*plus, *e), (*e, *times)]);
    run(gpu, &def)?;
    assert_eq!(
        buf.to_vec()?,
        [10],
        "(0 + 1) * 10: the kernel after the empty node ran last"
    );
    Ok(())
}

fn event_record_node_records_after_its_dependencies(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let event = gpu.device.create_event()?;
    let def = GraphDefinition::new(&gpu.device)?;
    // spin(unsigned long long ns), fill(int*, int n, int v)
    let s = k(&def, &[], &gpu.f("spin"), one(), args![200_000_000u64])?;
    let f = k(&def, &[&s], &gpu.f("fill"), one(), args![&buf, 1i32, 7i32])?;
    let r = def.add_event_record(&[&f], &event)?;
    assert_eq!(def.node_type(&r)?, NodeType::EventRecord);
    let g = def.instantiate()?;
    let (s1, s2) = (gpu.stream(), gpu.stream());
    g.launch(&s1)?;
    // Work on another stream that waits for the event runs after the fill (200 ms in): it
    // doubles 7. Had the event not been recorded after the fill, it would run at once (0 * 2)
    // and the fill would leave 7.
    s2.wait(&event)?;
    // SAFETY: affine(int*, int, int) on one int.
    unsafe { s2.launch_unchecked(&gpu.f("affine"), one(), &args![&buf, 2i32, 0i32])? };
    s2.synchronize()?;
    s1.synchronize()?;
    assert_eq!(buf.to_vec()?, [14], "the event was recorded after the fill");
    Ok(())
}

fn event_wait_node_waits_for_other_stream_work(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let event = gpu.device.create_event()?;
    let def = GraphDefinition::new(&gpu.device)?;
    let w = def.add_event_wait(&[], &event)?;
    // affine(int*, int, int): doubles what the other stream wrote.
    k(
        &def,
        &[&w],
        &gpu.f("affine"),
        one(),
        args![&buf, 2i32, 0i32],
    )?;
    assert_eq!(def.node_type(&w)?, NodeType::EventWait);
    let g = def.instantiate()?;
    let (s1, s2) = (gpu.stream(), gpu.stream());
    // SAFETY: spin(unsigned long long), fill(int*, int, int) with one element.
    unsafe {
        s1.launch_unchecked(&gpu.f("spin"), one(), &args![200_000_000u64])?;
        s1.launch_unchecked(&gpu.f("fill"), one(), &args![&buf, 1i32, 7i32])?;
    }
    s1.record(&event)?;
    g.launch(&s2)?;
    s2.synchronize()?;
    s1.synchronize()?;
    assert_eq!(
        buf.to_vec()?,
        [14],
        "the graph's kernel ran after the fill on the other stream"
    );
    Ok(())
}

fn host_callback_node_runs_once_per_launch(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    let a = k(&def, &[], &gpu.f("add_one"), one(), args![&buf])?;
    let (h, cb) = def.add_host_callback(&[&a], move || {
        seen.fetch_add(1, Ordering::SeqCst);
    })?;
    assert_eq!(def.node_type(&h)?, NodeType::Host);
    let g = def.instantiate()?;
    launch(gpu, &g)?;
    launch(gpu, &g)?;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(cb.calls(), Some(2));
    cb.check()?;
    assert_eq!(buf.to_vec()?, [2]);
    Ok(())
}

fn child_graph_nodes_embed_copies(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    // A captured child (+1) and an explicit child (*10).
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: affine(int*, int, int).
    unsafe { b.launch_unchecked(&affine, one(), &args![&buf, 1i32, 1i32])? };
    let captured = b.end_building()?;
    let explicit = GraphDefinition::new(&gpu.device)?;
    k(&explicit, &[], &affine, one(), args![&buf, 10i32, 0i32])?;
    let outer = GraphDefinition::new(&gpu.device)?;
    let c1 = outer.add_child_graph(&[], &captured)?;
    outer.add_child_graph(&[&c1], &explicit)?;
    assert_eq!(outer.node_type(&c1)?, NodeType::Child);
    // The child is a copy: changing `explicit` afterwards does not change `outer`.
    k(&explicit, &[], &affine, one(), args![&buf, 1i32, 100i32])?;
    run(gpu, &outer)?;
    assert_eq!(buf.to_vec()?, [10], "(0 + 1) * 10, without the later +100");
    // Embedding a graph into itself is refused.
    assert!(matches!(
        outer.add_child_graph(&[], &outer),
        Err(e) if e.refusal() == Some(Refusal::Order)
    ));
    Ok(())
}

fn mem_alloc_and_free_nodes(gpu: &Gpu) -> TestResult {
    const N: i32 = 1000;
    let out = gpu.device.alloc_zeroed::<i32>(N as usize)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let (a, scratch) = def.add_mem_alloc(&[], N as usize * 4)?;
    assert_eq!(scratch.byte_len(), N as usize * 4);
    assert_ne!(scratch.device_ptr(), 0);
    let cfg = LaunchConfig::for_num_elems(N as u32);
    // fill(int*, int, int) and copy_i32(const int*, int*, int) over N ints of `scratch`, which
    // exists between the allocation and the free.
    let f = k(&def, &[&a], &gpu.f("fill"), cfg, args![&scratch, N, 5i32])?;
    let c = k(
        &def,
        &[&f],
        &gpu.f("copy_i32"),
        cfg,
        args![&scratch, &out, N],
    )?;
    let free = def.add_mem_free(&[&c], scratch)?;
    assert_eq!(def.node_type(&a)?, NodeType::MemAlloc);
    assert_eq!(def.node_type(&free)?, NodeType::MemFree);
    let g = def.instantiate()?;
    launch(gpu, &g)?;
    launch(gpu, &g)?; // freed inside the graph, so it can run again
    assert_eq!(out.to_vec()?, vec![5; N as usize]);
    Ok(())
}

/// A graph allocation made with `options`, filled and copied out by kernels, run twice.
fn alloc_with_options_runs(gpu: &Gpu, options: &MemAllocOptions) -> TestResult {
    const N: i32 = 256;
    let out = gpu.device.alloc_zeroed::<i32>(N as usize)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let (a, scratch) = def.add_mem_alloc_with(&[], N as usize * 4, options)?;
    let cfg = LaunchConfig::for_num_elems(N as u32);
    // fill(int*, int, int) and copy_i32(const int*, int*, int) over N ints of `scratch`.
    let f = k(&def, &[&a], &gpu.f("fill"), cfg, args![&scratch, N, 7i32])?;
    let c = k(
        &def,
        &[&f],
        &gpu.f("copy_i32"),
        cfg,
        args![&scratch, &out, N],
    )?;
    def.add_mem_free(&[&c], scratch)?;
    let g = def.instantiate()?;
    launch(gpu, &g)?;
    launch(gpu, &g)?;
    assert_eq!(out.to_vec()?, vec![7; N as usize]);
    Ok(())
}

fn mem_alloc_options(gpu: &Gpu) -> TestResult {
    let here = gpu.device.ordinal();
    alloc_with_options_runs(gpu, &MemAllocOptions::new())?;
    alloc_with_options_runs(gpu, &MemAllocOptions::new().on_device(here))?;
    let def = GraphDefinition::new(&gpu.device)?;
    let refused = |options: MemAllocOptions| {
        matches!(
            def.add_mem_alloc_with(&[], 1024, &options),
            Err(e) if e.refusal() == Some(Refusal::OtherDevice)
        )
    };
    assert!(refused(MemAllocOptions::new().on_device(1000)));
    assert!(refused(
        MemAllocOptions::new().peer_access(1000, PeerAccess::Read)
    ));
    assert!(refused(
        MemAllocOptions::new().peer_access(here, PeerAccess::ReadWrite)
    ));
    assert_eq!(def.nodes()?.len(), 0, "refused options add no node");
    let devices = Device::count()?;
    if devices > 1 {
        let peer = (0..devices).find(|&d| d != here).unwrap_or(0);
        match def.add_mem_alloc_with(
            &[],
            1024,
            &MemAllocOptions::new().peer_access(peer, PeerAccess::ReadWrite),
        ) {
            Ok(_) => {}
            Err(e) if e.refusal() == Some(Refusal::OtherDevice) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Managed graph memory: the CUDA 13 bindings and driver 13.0; else refused (12.x bindings),
    // `Unsupported` (an older driver) or the driver's own error.
    match alloc_with_options_runs(gpu, &MemAllocOptions::new().managed(true)) {
        Ok(()) => println!("    managed graph allocation ran"),
        Err(e) => {
            let unsupported = e.downcast_ref::<Error>().is_some_and(|e| {
                matches!(e, Error::Unsupported { .. } | Error::Driver(_))
                    || e.refusal() == Some(Refusal::Unsupported)
            });
            assert!(unsupported, "managed allocation: {e}");
            println!("    managed graph allocation refused: {e}");
        }
    }
    Ok(())
}

// ---- topology families ----------------------------------------------------------------------

fn topology_single(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // affine(int*, int, int)
    k(&def, &[], &gpu.f("affine"), one(), args![&buf, 1i32, 3i32])?;
    assert_eq!(counts(&def)?, (1, 0));
    run(gpu, &def)?;
    assert_eq!(buf.to_vec()?, [3]);
    Ok(())
}

fn topology_chain(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // affine(int*, int, int): +1, *10, +2 in that order.
    let a = k(&def, &[], &affine, one(), args![&buf, 1i32, 1i32])?;
    let b = k(&def, &[&a], &affine, one(), args![&buf, 10i32, 0i32])?;
    k(&def, &[&b], &affine, one(), args![&buf, 1i32, 2i32])?;
    assert_eq!(counts(&def)?, (3, 2));
    run(gpu, &def)?;
    assert_eq!(buf.to_vec()?, [12]);
    Ok(())
}

fn topology_fan_out(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // fill(int*, 4, 1), then add_one_at(int*, i) for i in 1..=3, each after the fill.
    let root = k(&def, &[], &gpu.f("fill"), one(), args![&buf, 4i32, 1i32])?;
    for i in 1..=3i32 {
        k(&def, &[&root], &gpu.f("add_one_at"), one(), args![&buf, i])?;
    }
    assert_eq!(counts(&def)?, (4, 3));
    assert_eq!(def.successors(&root)?.len(), 3);
    run(gpu, &def)?;
    assert_eq!(buf.to_vec()?, [1, 2, 2, 2]);
    Ok(())
}

fn topology_fan_in_via_join(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(3)?;
    let out = gpu.device.alloc_zeroed::<i32>(3)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one_at(int*, i) for i < 3, joined, then copy_i32(const int*, int*, 3).
    let roots = (0..3i32)
        .map(|i| k(&def, &[], &gpu.f("add_one_at"), one(), args![&buf, i]))
        .collect::<cuda_graph::Result<Vec<_>>>()?;
    let j = def.join(&roots.iter().map(|r| r.as_ref()).collect::<Vec<_>>())?;
    k(
        &def,
        &[&j],
        &gpu.f("copy_i32"),
        one(),
        args![&buf, &out, 3i32],
    )?;
    assert_eq!(counts(&def)?, (5, 4));
    assert_eq!(def.predecessors(&j)?.len(), 3);
    run(gpu, &def)?;
    assert_eq!(out.to_vec()?, [1, 1, 1], "the copy ran after all three");
    Ok(())
}

fn topology_diamond(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(2)?;
    let out = gpu.device.alloc_zeroed::<i32>(2)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // fill(int*, 2, 1); add_one_at(int*, 0) and (int*, 1); copy_i32(const int*, int*, 2).
    let top = k(&def, &[], &gpu.f("fill"), one(), args![&buf, 2i32, 1i32])?;
    let left = k(
        &def,
        &[&top],
        &gpu.f("add_one_at"),
        one(),
        args![&buf, 0i32],
    )?;
    let right = k(
        &def,
        &[&top],
        &gpu.f("add_one_at"),
        one(),
        args![&buf, 1i32],
    )?;
    let bottom = k(
        &def,
        &[&left, &right],
        &gpu.f("copy_i32"),
        one(),
        args![&buf, &out, 2i32],
    )?;
    assert_eq!(counts(&def)?, (4, 4));
    assert_eq!(def.predecessors(&bottom)?.len(), 2);
    run(gpu, &def)?;
    assert_eq!(out.to_vec()?, [2, 2]);
    Ok(())
}

fn topology_disconnected(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let def = GraphDefinition::new(&gpu.device)?;
    // Two independent chains of affine(int*, int, int).
    let a1 = k(&def, &[], &affine, one(), args![&a, 1i32, 1i32])?;
    k(&def, &[&a1], &affine, one(), args![&a, 10i32, 0i32])?;
    let b1 = k(&def, &[], &affine, one(), args![&b, 1i32, 2i32])?;
    k(&def, &[&b1], &affine, one(), args![&b, 3i32, 0i32])?;
    assert_eq!(counts(&def)?, (4, 2));
    assert!(def.predecessors(&a1)?.is_empty() && def.predecessors(&b1)?.is_empty());
    run(gpu, &def)?;
    assert_eq!((a.to_vec()?, b.to_vec()?), (vec![10], vec![6]));
    Ok(())
}

fn node_types_predecessors_and_successors(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let m = def.add_memset(&[], &buf, 0i32)?;
    // add_one(int*)
    let kn = k(&def, &[&m], &gpu.f("add_one"), one(), args![&buf])?;
    let e = def.add_empty(&[&m, &kn])?;
    assert_eq!(def.predecessors(&e)?.len(), 2);
    assert_eq!(def.successors(&m)?.len(), 2);
    assert!(def.successors(&e)?.is_empty());
    assert_eq!(def.predecessors(&kn)?, [m]);
    let mut types: Vec<_> = def
        .nodes()?
        .iter()
        .map(|n| def.node_type(n))
        .collect::<cuda_graph::Result<_>>()?;
    types.sort_by_key(|t| format!("{t:?}"));
    assert_eq!(types, [NodeType::Empty, NodeType::Kernel, NodeType::Memset]);
    // Listing returns the same tokens the `add_*` calls did.
    let listed = def.nodes()?;
    assert!(listed.contains(&*m) && listed.contains(&*kn) && listed.contains(&*e));
    Ok(())
}

// ---- mutation -------------------------------------------------------------------------------

fn mutation_destroy_a_node(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // affine(int*, int, int): +1 -> *10 -> +2
    let a = k(&def, &[], &affine, one(), args![&buf, 1i32, 1i32])?;
    let b = k(&def, &[&a], &affine, one(), args![&buf, 10i32, 0i32])?;
    let c = k(&def, &[&b], &affine, one(), args![&buf, 1i32, 2i32])?;
    def.destroy_node(b)?;
    assert_eq!(
        counts(&def)?,
        (2, 0),
        "the node and both its edges are gone"
    );
    assert!(matches!(def.node_type(&b), Err(Error::DestroyedNode)));
    def.add_edge(&a, &c)?;
    assert_eq!(def.edges()?, [(*a, *c)]);
    run(gpu, &def)?;
    assert_eq!(buf.to_vec()?, [3], "0 + 1 + 2 without the *10");
    Ok(())
}

fn mutation_insert_a_node_into_a_chain(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // affine(int*, int, int): +1 -> +2, then *10 inserted between them.
    let a = k(&def, &[], &affine, one(), args![&buf, 1i32, 1i32])?;
    let c = k(&def, &[&a], &affine, one(), args![&buf, 1i32, 2i32])?;
    let b = k(&def, &[&a], &affine, one(), args![&buf, 10i32, 0i32])?;
    def.remove_edge(&a, &c)?;
    def.add_edge(&b, &c)?;
    assert_eq!(counts(&def)?, (3, 2));
    assert_eq!(def.predecessors(&c)?, [b]);
    assert_eq!(def.successors(&a)?, [b]);
    run(gpu, &def)?;
    assert_eq!(buf.to_vec()?, [12], "(0 + 1) * 10 + 2");
    Ok(())
}

fn mutation_rewire_a_chain_into_a_fan_in(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(3)?;
    let out = gpu.device.alloc_zeroed::<i32>(3)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one_at(int*, i) for i < 3 in a chain, then copy_i32(const int*, int*, 3).
    let n0 = k(&def, &[], &gpu.f("add_one_at"), one(), args![&buf, 0i32])?;
    let n1 = k(&def, &[&n0], &gpu.f("add_one_at"), one(), args![&buf, 1i32])?;
    let n2 = k(&def, &[&n1], &gpu.f("add_one_at"), one(), args![&buf, 2i32])?;
    let sink = k(
        &def,
        &[&n2],
        &gpu.f("copy_i32"),
        one(),
        args![&buf, &out, 3i32],
    )?;
    assert_eq!(counts(&def)?, (4, 3));
    def.remove_edge(&n0, &n1)?;
    def.remove_edge(&n1, &n2)?;
    def.add_edge(&n0, &sink)?;
    def.add_edge(&n1, &sink)?;
    assert_eq!(counts(&def)?, (4, 3));
    assert_eq!(def.predecessors(&sink)?.len(), 3);
    for n in [n0, n1, n2] {
        assert!(def.predecessors(&n)?.is_empty());
    }
    run(gpu, &def)?;
    assert_eq!(out.to_vec()?, [1, 1, 1]);
    Ok(())
}

fn bad_nodes_and_edges_are_errors(gpu: &Gpu) -> TestResult {
    let a_def = GraphDefinition::new(&gpu.device)?;
    let b_def = GraphDefinition::new(&gpu.device)?;
    let a = a_def.add_empty(&[])?;
    let a2 = a_def.add_empty(&[])?;
    let b = b_def.add_empty(&[])?;
    assert!(
        matches!(a_def.add_edge(&a, &b), Err(Error::ForeignNode)),
        "edge between two graphs"
    );
    assert!(matches!(a_def.add_empty(&[&b]), Err(Error::ForeignNode)));
    assert!(matches!(a_def.node_type(&b), Err(Error::ForeignNode)));
    assert!(
        matches!(a_def.add_edge(&a, &a), Err(e) if e.refusal() == Some(Refusal::Order)),
        "self edge"
    );
    a_def.destroy_node(a2)?;
    assert!(
        matches!(a_def.add_edge(&a, &a2), Err(Error::DestroyedNode)),
        "edge to a destroyed node"
    );
    assert!(matches!(a_def.destroy_node(a2), Err(Error::DestroyedNode)));
    assert!(matches!(a_def.successors(&a2), Err(Error::DestroyedNode)));
    // A new node may reuse the destroyed one's address; the old token stays dead.
    let fresh = a_def.add_empty(&[])?;
    assert!(matches!(a_def.node_type(&a2), Err(Error::DestroyedNode)));
    a_def.add_edge(&a, &fresh)?;
    assert!(
        a_def.add_edge(&a, &fresh).is_err(),
        "the driver refuses a duplicate edge"
    );
    // Tokens of the original are foreign to a clone.
    let clone = a_def.try_clone()?;
    assert!(matches!(clone.node_type(&a), Err(Error::ForeignNode)));
    assert_eq!(counts(&clone)?, counts(&a_def)?);
    Ok(())
}

fn bad_node_arguments_are_errors(gpu: &Gpu) -> TestResult {
    let def = GraphDefinition::new(&gpu.device)?;
    let wide = gpu.device.alloc_zeroed::<u64>(4)?;
    assert!(matches!(
        def.add_memset(&[], &wide, 1u64),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    let wide_f = gpu.device.alloc_zeroed::<f64>(4)?;
    assert!(matches!(
        def.add_memset(&[], &wide_f, 1.0),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    let small = gpu.device.alloc_zeroed::<u8>(16)?;
    let too_big = Memset2d {
        width: 4,
        height: 5,
        pitch: 4,
    };
    assert!(matches!(
        def.add_memset_2d(&[], &small, 0u8, too_big),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    assert!(matches!(
        def.add_mem_alloc(&[], 0),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    let other = gpu.device.alloc_zeroed::<u8>(8)?;
    assert!(matches!(
        def.add_memcpy(&[], &small, &other),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    let elsewhere = GraphDefinition::new(&gpu.device)?;
    let (_n, foreign_alloc) = elsewhere.add_mem_alloc(&[], 64)?;
    assert!(matches!(
        def.add_mem_free(&[], foreign_alloc),
        Err(e) if e.refusal() == Some(Refusal::ForeignGraph)
    ));
    assert_eq!(counts(&def)?, (0, 0), "no failed call left a node behind");
    Ok(())
}

// ---- conditional nodes ------------------------------------------------------------------------

fn if_node(gpu: &Gpu) -> TestResult {
    for (value, expect) in [(0u32, 0), (1, 1), (5, 1)] {
        let buf = gpu.device.alloc_zeroed::<i32>(1)?;
        let def = GraphDefinition::new(&gpu.device)?;
        let h = def.create_conditional_handle(None)?;
        // set_condition(handle, unsigned), add_one(int*)
        let set = k(&def, &[], &gpu.f("set_condition"), one(), args![h, value])?;
        let (node, body) = def.add_if(&[&set], &h)?;
        assert_eq!(def.node_type(&node)?, NodeType::Conditional);
        assert!(body.is_conditional_body());
        k(&body, &[], &gpu.f("add_one"), one(), args![&buf])?;
        assert_eq!(counts(&def)?, (2, 1));
        assert_eq!(counts(&body)?, (1, 0));
        run(gpu, &def)?;
        assert_eq!(buf.to_vec()?, [expect], "condition {value}");
    }
    Ok(())
}

fn if_else_node(gpu: &Gpu) -> TestResult {
    for (value, expect) in [(1u32, [1, 0]), (0, [0, 1])] {
        let buf = gpu.device.alloc_zeroed::<i32>(2)?;
        let def = GraphDefinition::new(&gpu.device)?;
        let h = def.create_conditional_handle(None)?;
        // set_condition(handle, unsigned), add_one_at(int*, int) with i < 2
        let set = k(&def, &[], &gpu.f("set_condition"), one(), args![h, value])?;
        let (_n, then_body, else_body) = def.add_if_else(&[&set], &h)?;
        k(
            &then_body,
            &[],
            &gpu.f("add_one_at"),
            one(),
            args![&buf, 0i32],
        )?;
        k(
            &else_body,
            &[],
            &gpu.f("add_one_at"),
            one(),
            args![&buf, 1i32],
        )?;
        run(gpu, &def)?;
        assert_eq!(buf.to_vec()?, expect, "condition {value}");
    }
    Ok(())
}

fn while_node(gpu: &Gpu) -> TestResult {
    for count in [1, 5, 37] {
        let counter = gpu.device.htod(&[count])?;
        let iterations = gpu.device.alloc_zeroed::<i32>(1)?;
        let def = GraphDefinition::new(&gpu.device)?;
        let h = def.create_conditional_handle(Some(1))?;
        let (_n, body) = def.add_while(&[], &h)?;
        // countdown(handle, int*, int*)
        k(
            &body,
            &[],
            &gpu.f("countdown"),
            one(),
            args![h, &counter, &iterations],
        )?;
        run(gpu, &def)?;
        assert_eq!(iterations.to_vec()?, [count]);
        assert_eq!(counter.to_vec()?, [0]);
    }
    Ok(())
}

fn switch_node(gpu: &Gpu) -> TestResult {
    for (value, expect) in [
        (0u32, [1, 0, 0]),
        (1, [0, 1, 0]),
        (2, [0, 0, 1]),
        (3, [0, 0, 0]),
    ] {
        let buf = gpu.device.alloc_zeroed::<i32>(3)?;
        let def = GraphDefinition::new(&gpu.device)?;
        let h = def.create_conditional_handle(None)?;
        // set_condition(handle, unsigned), add_one_at(int*, int) with i < 3
        let set = k(&def, &[], &gpu.f("set_condition"), one(), args![h, value])?;
        let (_n, cases) = def.add_switch(&[&set], &h, 3)?;
        assert_eq!(cases.len(), 3);
        for (i, case) in cases.iter().enumerate() {
            k(
                case,
                &[],
                &gpu.f("add_one_at"),
                one(),
                args![&buf, i as i32],
            )?;
        }
        run(gpu, &def)?;
        assert_eq!(buf.to_vec()?, expect, "switch value {value}");
    }
    Ok(())
}

fn switch_with_zero_branches_is_an_error(gpu: &Gpu) -> TestResult {
    let def = GraphDefinition::new(&gpu.device)?;
    let h = def.create_conditional_handle(Some(0))?;
    assert!(matches!(
        def.add_switch(&[], &h, 0),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    assert_eq!(counts(&def)?, (0, 0));
    Ok(())
}

fn foreign_conditional_handle_is_an_error(gpu: &Gpu) -> TestResult {
    let a = GraphDefinition::new(&gpu.device)?;
    let b = GraphDefinition::new(&gpu.device)?;
    let ha = a.create_conditional_handle(Some(1))?;
    assert!(matches!(
        b.add_if(&[], &ha),
        Err(Error::ForeignConditionalHandle)
    ));
    // A handle drives one conditional node: a second one (here in the body) is refused.
    let (_n, body) = a.add_if(&[], &ha)?;
    match body.add_while(&[], &ha) {
        Err(e) if e.refusal() == Some(Refusal::ForeignGraph) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A body's handle is foreign to its parent.
    let inner_only = body.create_conditional_handle(Some(0))?;
    assert!(matches!(
        a.add_while(&[], &inner_only),
        Err(Error::ForeignConditionalHandle)
    ));
    body.add_if(&[], &inner_only)?;
    let inner = body.create_conditional_handle(Some(0))?;
    body.add_while(&[], &inner)?;
    // A builder's handle is foreign to a definition.
    let capturing = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let hb = capturing.create_conditional_handle(Some(1))?;
    assert!(matches!(
        a.add_if(&[], &hb),
        Err(Error::ForeignConditionalHandle)
    ));
    drop(capturing);
    Ok(())
}

fn conditional_body_cannot_stand_alone(gpu: &Gpu) -> TestResult {
    let def = GraphDefinition::new(&gpu.device)?;
    let h = def.create_conditional_handle(Some(1))?;
    let (_n, body) = def.add_if(&[], &h)?;
    body.add_empty(&[])?;
    assert!(matches!(body.instantiate(), Err(e) if e.refusal() == Some(Refusal::Unsupported)));
    assert!(matches!(body.try_clone(), Err(e) if e.refusal() == Some(Refusal::Unsupported)));
    let outer = GraphDefinition::new(&gpu.device)?;
    assert!(matches!(
        outer.add_child_graph(&[], &body),
        Err(e) if e.refusal() == Some(Refusal::Unsupported)
    ));
    let g = def.instantiate()?;
    assert!(matches!(g.update(&body), Err(e) if e.refusal() == Some(Refusal::Unsupported)));
    // Nodes of the body are foreign to its parent, and the other way round.
    let in_body = body.add_empty(&[])?;
    let in_parent = def.add_empty(&[])?;
    assert!(matches!(
        def.add_edge(&in_parent, &in_body),
        Err(Error::ForeignNode)
    ));
    assert!(matches!(
        body.add_empty(&[&in_parent]),
        Err(Error::ForeignNode)
    ));
    Ok(())
}

fn destroyed_conditional_node_kills_its_bodies(gpu: &Gpu) -> TestResult {
    let def = GraphDefinition::new(&gpu.device)?;
    let h = def.create_conditional_handle(Some(1))?;
    let (node, body) = def.add_if(&[], &h)?;
    let inner_h = body.create_conditional_handle(Some(0))?;
    let (_inner_node, inner_body) = body.add_if(&[], &inner_h)?;
    body.add_empty(&[])?;
    def.destroy_node(node)?;
    for view in [&body, &inner_body] {
        assert!(matches!(
            view.add_empty(&[]),
            Err(e) if e.refusal() == Some(Refusal::Broken)
        ));
        assert!(matches!(view.nodes(), Err(e) if e.refusal() == Some(Refusal::Broken)));
    }
    assert_eq!(counts(&def)?, (0, 0));
    // Many more made and destroyed, their views dropped (the crate forgets those graphs once
    // no view of them is left): the views still held stay refused, and the definition works.
    for _ in 0..300 {
        let hk = def.create_conditional_handle(Some(0))?;
        let (n, b) = def.add_if(&[], &hk)?;
        b.add_empty(&[])?;
        def.destroy_node(n)?;
        assert!(b.add_empty(&[]).is_err());
    }
    for view in [&body, &inner_body] {
        assert!(matches!(
            view.add_empty(&[]),
            Err(e) if e.refusal() == Some(Refusal::Broken)
        ));
    }
    def.add_empty(&[])?;
    assert_eq!(counts(&def)?, (1, 0));
    Ok(())
}

// ---- views of builders, hybrid bodies ------------------------------------------------------------

fn view_of_an_ended_builder_sees_and_extends_the_capture(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: affine(int*, int, int).
    unsafe {
        b.launch_unchecked(&affine, one(), &args![&buf, 1i32, 1i32])?;
        b.launch_unchecked(&affine, one(), &args![&buf, 1i32, 1i32])?;
    }
    let ended = b.end_building()?;
    let def = ended.graph_definition()?;
    assert_eq!(
        counts(&def)?,
        (2, 1),
        "the capture recorded a chain of two kernels"
    );
    let nodes = def.nodes()?;
    let mut last = None;
    for n in &nodes {
        assert_eq!(def.node_type(n)?, NodeType::Kernel);
        if def.successors(n)?.is_empty() {
            last = Some(*n);
        }
    }
    let last = last.ok_or("no sink node")?;
    k(&def, &[&last], &affine, one(), args![&buf, 10i32, 0i32])?;
    // The builder's graph is the same graph: completing it runs the added kernel too.
    launch(gpu, &ended.instantiate()?)?;
    assert_eq!(buf.to_vec()?, [20], "(0 + 1 + 1) * 10");
    // The view outlives the builder.
    drop(ended);
    run(gpu, &def)?;
    assert_eq!(buf.to_vec()?, [220]);
    Ok(())
}

fn hybrid_body_captured_then_extended(gpu: &Gpu) -> TestResult {
    let (add_one, affine) = (gpu.f("add_one"), gpu.f("affine"));
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let parent = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = parent.create_conditional_handle(Some(1))?;
    let view = {
        let body = parent.add_if(&h)?.begin_building(Global)?;
        // SAFETY: add_one(int*).
        unsafe { body.launch_unchecked(&add_one, one(), &args![&buf])? };
        let ended = body.end_building()?;
        let view = ended.graph_definition()?;
        let captured = view.nodes()?;
        assert_eq!(captured.len(), 1);
        // affine(int*, int, int): *10 after the captured +1.
        k(
            &view,
            &[&captured[0]],
            &affine,
            one(),
            args![&buf, 10i32, 0i32],
        )?;
        view
    };
    let g = parent.end_building()?.instantiate()?;
    assert_eq!(counts(&view)?, (2, 1));
    launch(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [10], "(0 + 1) * 10 inside the IF body");
    Ok(())
}

fn hybrid_body_never_captured(gpu: &Gpu) -> TestResult {
    let (add_one, affine) = (gpu.f("add_one"), gpu.f("affine"));
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let parent = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = parent.create_conditional_handle(Some(1))?;
    {
        let body = parent.add_if(&h)?;
        let view = body.graph_definition()?;
        // add_one(int*), then affine(int*, int, int)
        let a = k(&view, &[], &add_one, one(), args![&buf])?;
        k(&view, &[&a], &affine, one(), args![&buf, 10i32, 0i32])?;
    }
    let g = parent.end_building()?.instantiate()?;
    launch(gpu, &g)?;
    launch(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [110], "((0 + 1) * 10 + 1) * 10");
    Ok(())
}

fn body_definition_refused_while_the_body_captures(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let parent = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = parent.create_conditional_handle(Some(1))?;
    {
        let body = parent.add_if(&h)?;
        let view = body.graph_definition()?;
        let capturing = body.begin_building(Global)?;
        assert!(matches!(
            view.add_empty(&[]),
            Err(e) if e.refusal() == Some(Refusal::Capture)
        ));
        assert!(matches!(view.nodes(), Err(e) if e.refusal() == Some(Refusal::Capture)));
        // SAFETY: add_one(int*).
        unsafe { capturing.launch_unchecked(&add_one, one(), &args![&buf])? };
        capturing.end_building()?;
        let captured = view.nodes()?;
        assert_eq!(captured.len(), 1, "usable again once the capture ended");
        k(&view, &[&captured[0]], &add_one, one(), args![&buf])?;
    }
    launch(gpu, &parent.end_building()?.instantiate()?)?;
    assert_eq!(buf.to_vec()?, [2]);
    Ok(())
}

// ---- update and embedding ---------------------------------------------------------------------

fn update_an_exec_from_a_definition(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let def_a = GraphDefinition::new(&gpu.device)?;
    // affine(int*, int, int)
    k(&def_a, &[], &affine, one(), args![&a, 1i32, 10i32])?;
    let g = def_a.instantiate()?;
    launch(gpu, &g)?;
    {
        let def_b = GraphDefinition::new(&gpu.device)?;
        k(&def_b, &[], &affine, one(), args![&b, 1i32, 5i32])?;
        g.update(&def_b)?;
    }
    launch(gpu, &g)?;
    assert_eq!((a.to_vec()?, b.to_vec()?), (vec![10], vec![5]));
    // From a view of an ended builder, too.
    let bld = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: affine(int*, int, int).
    unsafe { bld.launch_unchecked(&affine, one(), &args![&a, 1i32, 1i32])? };
    let view = bld.end_building()?.graph_definition()?;
    g.update(&view)?;
    launch(gpu, &g)?;
    assert_eq!((a.to_vec()?, b.to_vec()?), (vec![11], vec![5]));
    Ok(())
}

fn failed_update_from_a_definition_adopts_nothing(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    k(&def, &[], &add_one, one(), args![&a])?;
    let g = def.instantiate()?;
    let other = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = other.release_observer();
    {
        let changed = GraphDefinition::new(&gpu.device)?;
        let x = k(&changed, &[], &add_one, one(), args![&other])?;
        k(&changed, &[&x], &add_one, one(), args![&other])?;
        match g.update(&changed) {
            Err(Error::Update { .. }) => {}
            r => return Err(format!("expected an update failure, got {r:?}").into()),
        }
    }
    drop(other);
    assert!(
        eventually(|| watch.is_released()),
        "the failed update kept the source's buffer ({} owners)",
        watch.share_count()
    );
    launch(gpu, &g)?;
    assert_eq!(a.to_vec()?, [1], "the old exec still works");
    Ok(())
}

/// A source an exec was updated from and never launched with is let go by the next update,
/// on the updating thread (no launch can use it), not later on the release thread. (What the
/// exec was instantiated from it holds for its whole life.)
fn an_update_releases_a_source_never_launched_at_once(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let first = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    k(&def, &[], &add_one, one(), args![&first])?;
    let g = def.instantiate()?;
    let mid = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = mid.release_observer();
    {
        let src = GraphDefinition::new(&gpu.device)?;
        k(&src, &[], &add_one, one(), args![&mid])?;
        g.update(&src)?;
    }
    drop(mid);
    assert!(
        !watch.is_released(),
        "the exec holds its current source's buffer"
    );
    let last = gpu.device.alloc_zeroed::<i32>(1)?;
    let next = GraphDefinition::new(&gpu.device)?;
    k(&next, &[], &add_one, one(), args![&last])?;
    g.update(&next)?;
    assert!(
        watch.is_released(),
        "the update did not release the replaced source ({} owners)",
        watch.share_count()
    );
    launch(gpu, &g)?;
    assert_eq!(last.to_vec()?, [1], "the exec runs the new source");
    Ok(())
}

fn embed_a_definition_in_a_capture(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let child = GraphDefinition::new(&gpu.device)?;
    // affine(int*, int, int)
    k(&child, &[], &affine, one(), args![&buf, 1i32, 1i32])?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    b.add_child_graph(&child)?;
    // SAFETY: affine(int*, int, int).
    unsafe { b.launch_unchecked(&affine, one(), &args![&buf, 10i32, 0i32])? };
    drop(child);
    launch(gpu, &b.end_building()?.instantiate()?)?;
    assert_eq!(buf.to_vec()?, [10]);
    Ok(())
}

// ---- lifetimes ------------------------------------------------------------------------------------

fn clone_is_independent_and_keeps_operands_alive(gpu: &Gpu) -> TestResult {
    let src = gpu.device.htod(&[42i32])?;
    let dst = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = src.release_observer();
    let def = GraphDefinition::new(&gpu.device)?;
    // copy_i32(const int*, int*, int)
    k(
        &def,
        &[],
        &gpu.f("copy_i32"),
        one(),
        args![&src, &dst, 1i32],
    )?;
    let clone = def.try_clone()?;
    clone.add_empty(&[])?;
    assert_eq!(counts(&def)?.0, 1, "the original is unchanged");
    assert_eq!(counts(&clone)?.0, 2);
    drop(src);
    drop(def);
    assert!(
        stays(|| !watch.is_released()),
        "the clone keeps the buffer alive"
    );
    let g = clone.instantiate()?;
    drop(clone);
    assert!(
        stays(|| !watch.is_released()),
        "the clone's exec keeps the buffer alive"
    );
    launch(gpu, &g)?;
    assert_eq!(dst.to_vec()?, [42]);
    drop(g);
    assert!(
        eventually(|| watch.is_released()),
        "released after the last exec"
    );
    Ok(())
}

fn exec_runs_after_definition_and_operands_are_dropped(gpu: &Gpu) -> TestResult {
    let dst = gpu.device.alloc_zeroed::<i32>(3)?;
    let g;
    let cb;
    {
        let src = gpu.device.htod(&[1i32, 2, 3])?;
        let copy = gpu.f("copy_i32");
        let event = gpu.device.create_event()?;
        let def = GraphDefinition::new(&gpu.device)?;
        // copy_i32(const int*, int*, int)
        let c = k(&def, &[], &copy, one(), args![&src, &dst, 3i32])?;
        let r = def.add_event_record(&[&c], &event)?;
        let tmp = gpu.device.alloc_zeroed::<i32>(3)?;
        let m = def.add_memcpy(&[&r], &tmp, &src)?;
        let (_h, observer) = def.add_host_callback(&[&m], || {})?;
        cb = observer;
        g = def.instantiate()?;
        // `def`, `src`, `copy`, `event`, `tmp` and the closure's owner all go here.
    }
    launch(gpu, &g)?;
    launch(gpu, &g)?;
    assert_eq!(dst.to_vec()?, [1, 2, 3]);
    assert_eq!(cb.calls(), Some(2));
    drop(g);
    assert!(eventually(|| cb.is_released()));
    Ok(())
}

fn operands_released_after_last_definition_and_exec(gpu: &Gpu) -> TestResult {
    // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
    let module = unsafe { gpu.device.load_module(KERNELS)? }; // a module of its own, to watch it unload
    let add_one = module.function("add_one")?;
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let event = gpu.device.create_event()?;
    let child = GraphDefinition::new(&gpu.device)?;
    child.add_empty(&[])?;
    let watches = [
        ("buffer", buf.release_observer()),
        ("event", event.release_observer()),
        ("module", module.release_observer()),
    ];
    // The child-graph node holds what the child's nodes use, not the child definition itself
    // (a graph may embed its own clone without holding itself): the child goes with its handle.
    let watch_child = child.release_observer();
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    let a = k(&def, &[], &add_one, one(), args![&buf])?;
    let r = def.add_event_record(&[&a], &event)?;
    let c = def.add_child_graph(&[&r], &child)?;
    let (_h, cb) = def.add_host_callback(&[&c], || {})?;
    let (g1, g2) = (def.instantiate()?, def.instantiate()?);
    drop((module, add_one, buf, event, child));
    assert!(eventually(|| watch_child.is_released()));
    let alive = |what: &str| -> TestResult {
        for (name, w) in &watches {
            if !stays(|| !w.is_released()) {
                return Err(format!("the {name} was released early ({what})").into());
            }
        }
        if cb.is_released() {
            return Err(format!("the callback was released early ({what})").into());
        }
        Ok(())
    };
    alive("the definition and two execs hold it")?;
    drop(def);
    alive("two execs hold it")?;
    launch(gpu, &g1)?;
    drop(g1);
    alive("one exec holds it")?;
    launch(gpu, &g2)?;
    assert_eq!(cb.calls(), Some(2));
    drop(g2);
    for (name, w) in &watches {
        assert!(
            eventually(|| w.is_released()),
            "the {name} is released after the last exec"
        );
    }
    assert!(eventually(|| cb.is_released()));
    Ok(())
}

fn nothing_released_while_a_launch_runs(gpu: &Gpu) -> TestResult {
    let dst = gpu.device.alloc_zeroed::<i32>(1)?;
    let src = gpu.device.htod(&[42i32])?;
    let watch = src.release_observer();
    let def = GraphDefinition::new(&gpu.device)?;
    // spin(unsigned long long ns), then copy_i32(const int*, int*, int)
    let s = k(&def, &[], &gpu.f("spin"), one(), args![300_000_000u64])?;
    k(
        &def,
        &[&s],
        &gpu.f("copy_i32"),
        one(),
        args![&src, &dst, 1i32],
    )?;
    let g = def.instantiate()?;
    let stream = gpu.stream();
    g.launch(&stream)?;
    drop((g, def, src));
    // The launch is still spinning: the buffer it will read must not be freed yet.
    assert!(
        stays(|| !watch.is_released()),
        "the buffer was released while a launch that reads it was running"
    );
    stream.synchronize()?;
    assert_eq!(dst.to_vec()?, [42]);
    assert!(eventually(|| watch.is_released()));
    Ok(())
}

/// Synchronize, then drop: the exec and what it holds go before `drop` returns, on the dropping
/// thread, with nothing queued behind the stream's next work (a second thread destroying each
/// exec doubled the cost of a raw capture cycle on driver 13.0).
fn an_exec_whose_launches_ended_releases_as_it_is_dropped(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = buf.release_observer();
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    k(&def, &[], &gpu.f("add_one"), one(), args![&buf])?;
    let g = def.instantiate()?;
    let check = gpu.device.alloc_zeroed::<i32>(1)?;
    let copy = def_copy(gpu, &buf, &check)?;
    drop((def, buf));
    let stream = gpu.stream();
    g.launch(&stream)?;
    copy.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(check.to_vec()?, [1]);
    drop(copy);
    assert!(
        !watch.is_released(),
        "the first exec still holds the buffer"
    );
    drop(g);
    assert!(
        watch.is_released(),
        "an exec whose launches have ended releases what it holds before its drop returns"
    );
    Ok(())
}

/// An exec copying one int from `src` to `dst` (`copy_i32`).
fn def_copy(
    gpu: &Gpu,
    src: &DeviceBuffer<i32>,
    dst: &DeviceBuffer<i32>,
) -> Result<Graph, Box<dyn std::error::Error>> {
    let def = GraphDefinition::new(&gpu.device)?;
    // copy_i32(const int*, int*, int)
    k(&def, &[], &gpu.f("copy_i32"), one(), args![src, dst, 1i32])?;
    Ok(def.instantiate()?)
}

fn body_operands_live_as_long_as_the_exec(gpu: &Gpu) -> TestResult {
    let dst = gpu.device.alloc_zeroed::<i32>(1)?;
    let src = gpu.device.htod(&[42i32])?;
    let watch = src.release_observer();
    let def = GraphDefinition::new(&gpu.device)?;
    let h = def.create_conditional_handle(Some(1))?;
    let (_n, body) = def.add_if(&[], &h)?;
    // copy_i32(const int*, int*, int), inside the IF body.
    k(
        &body,
        &[],
        &gpu.f("copy_i32"),
        one(),
        args![&src, &dst, 1i32],
    )?;
    let g = def.instantiate()?;
    drop((body, def, src));
    assert!(
        stays(|| !watch.is_released()),
        "the exec must keep what its conditional body uses alive"
    );
    launch(gpu, &g)?;
    assert_eq!(dst.to_vec()?, [42]);
    drop(g);
    assert!(eventually(|| watch.is_released()));
    Ok(())
}

fn concurrent_additions_from_threads(gpu: &Gpu) -> TestResult {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 50;
    let def = GraphDefinition::new(&gpu.device)?;
    let tails = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| -> cuda_graph::Result<GraphNode> {
                    let mut last = def.add_empty(&[])?;
                    for _ in 1..PER_THREAD {
                        last = def.add_empty(&[&last])?;
                        def.nodes()?; // reads interleave with other threads' writes
                    }
                    Ok(*last)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "a thread panicked".to_string()))
            .collect::<Result<Vec<_>, _>>()
    })?
    .into_iter()
    .collect::<cuda_graph::Result<Vec<_>>>()?;
    def.join(&tails.iter().collect::<Vec<_>>())?;
    assert_eq!(
        counts(&def)?,
        (
            THREADS * PER_THREAD + 1,
            THREADS * (PER_THREAD - 1) + THREADS
        )
    );
    run(gpu, &def)?;
    Ok(())
}

fn dot_print_of_a_definition(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let m = def.add_memset(&[], &buf, 0i32)?;
    def.add_empty(&[&m])?;
    let path = std::env::temp_dir().join(format!("cuda-graph-def-{}.dot", std::process::id()));
    def.debug_dot_print(&path, &GraphDebugPrintOptions::all())?;
    let text = std::fs::read_to_string(&path)?;
    let _ = std::fs::remove_file(&path);
    assert!(text.contains("digraph"), "{text}");
    assert!(matches!(
        def.debug_dot_print("/nonexistent-dir/x.dot", &GraphDebugPrintOptions::default()),
        Err(Error::Io { .. })
    ));
    Ok(())
}

// ---- per-node ownership ----------------------------------------------------------------------

/// What a node uses goes when the node is destroyed — unless an exec made before still uses it,
/// and then when that exec goes.
fn destroying_a_node_releases_what_it_used(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let def = GraphDefinition::new(&gpu.device)?;
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let (wa, wb) = (a.release_observer(), b.release_observer());
    // add_one(int*) on a one-int buffer.
    let ka = k(&def, &[], &add_one, one(), args![&a])?;
    let mb = def.add_memset(&[], &b, 0x0101_0101i32)?;
    drop((a, b));
    assert!(stays(|| !wa.is_released()) && !wb.is_released());
    def.destroy_node(ka)?;
    assert!(
        eventually(|| wa.is_released()),
        "a is released with the node that used it, while the definition lives"
    );
    let exec = def.instantiate()?;
    def.destroy_node(mb)?;
    assert!(
        stays(|| !wb.is_released()),
        "the exec made before still uses b"
    );
    launch(gpu, &exec)?;
    drop(exec);
    assert!(
        eventually(|| wb.is_released()),
        "b goes with the last exec that used it"
    );
    assert_eq!(def.nodes()?.len(), 0);
    Ok(())
}

/// A clone, a child-graph node (nested two deep) and an exec updated from a definition each
/// keep what the source's nodes used when they were made, after the source's node is destroyed.
fn clones_children_and_updated_execs_keep_a_destroyed_nodes_operands(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let wa = a.release_observer();
    let source = GraphDefinition::new(&gpu.device)?;
    let ka = k(&source, &[], &add_one, one(), args![&a])?;
    let clone = source.try_clone()?;
    let parent = GraphDefinition::new(&gpu.device)?;
    let child_node = parent.add_child_graph(&[], &source)?;
    let grandparent = GraphDefinition::new(&gpu.device)?;
    let outer = grandparent.add_child_graph(&[], &parent)?;
    // An exec of the same shape (one add_one node) on another buffer, updated from `source`.
    let other = gpu.device.alloc_zeroed::<i32>(1)?;
    let shape = GraphDefinition::new(&gpu.device)?;
    k(&shape, &[], &add_one, one(), args![&other])?;
    let exec = shape.instantiate()?;
    exec.update(&source)?;
    source.destroy_node(ka)?;
    drop(source);
    // Each holder runs add_one on `a`: clone, grandparent (through parent), the exec.
    run(gpu, &clone)?;
    run(gpu, &grandparent)?;
    launch(gpu, &exec)?;
    assert_eq!(a.to_vec()?, [3], "every copy still adds to a");
    assert_eq!(
        other.to_vec()?,
        [0],
        "the updated exec no longer uses its first buffer"
    );
    drop(a);
    assert!(stays(|| !wa.is_released()), "the holders keep a");
    drop(clone);
    assert!(
        stays(|| !wa.is_released()),
        "the exec and the children keep a"
    );
    drop(exec);
    assert!(
        stays(|| !wa.is_released()),
        "the child-graph nodes still hold a"
    );
    parent.destroy_node(child_node)?;
    assert!(
        stays(|| !wa.is_released()),
        "the grandparent's copy of parent still holds a"
    );
    grandparent.destroy_node(outer)?;
    assert!(
        eventually(|| wa.is_released()),
        "a goes with the last child-graph node that used it"
    );
    drop((parent, grandparent));
    Ok(())
}

/// Destroying a conditional node frees its bodies in the driver; what the bodies' nodes used
/// goes with them.
fn destroying_a_conditional_node_releases_its_bodies_operands(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let def = GraphDefinition::new(&gpu.device)?;
    let h = def.create_conditional_handle(Some(1))?;
    let (node, body) = def.add_if(&[], &h)?;
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let wa = a.release_observer();
    k(&body, &[], &add_one, one(), args![&a])?;
    run(gpu, &def)?;
    assert_eq!(a.to_vec()?, [1]);
    drop(a);
    assert!(stays(|| !wa.is_released()), "the body's node holds a");
    def.destroy_node(node)?;
    assert!(
        eventually(|| wa.is_released()),
        "a goes with the conditional node's body"
    );
    drop(body);
    Ok(())
}
