//! Reading nodes back (every kind, captured and copied graphs, a child-graph node's graph),
//! conditional handles of a graph used in its bodies and children (a bisection root-finder),
//! and device graph launch.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cuda_graph::prelude::*;

use cuda_graph::Refusal;
use cuda_graph::{ConditionalKind, MemoryKind, NodeInfo};
use cuda_graph::{DriverVersion, NodeType};

use crate::args;
use crate::nodes::k;
use crate::support::{eventually, launch, one, run, stays, Gpu, Needs, TestResult};

const GPU: Needs = Needs::Gpu;
const V12_3: Needs = Needs::Conditional(DriverVersion::V12_3);
const V12_8: Needs = Needs::Conditional(DriverVersion::V12_8);

crate::gpu_tests! {
    "inspect";
    V12_3 => every_node_kind_reads_back_what_was_set;
    GPU =>
        captured_and_copied_nodes_read_back,
        updated_parameters_read_back,
        child_graph_view_extends_the_node_and_dies_with_it;
    V12_8 => bisection_while_body_decides_with_the_top_level_handle;
    V12_3 =>
        captured_body_tests_the_parent_handle,
        conditional_in_a_child_graph_tests_the_outer_handle;
    GPU => replacing_a_child_graph_retires_its_views;
    V12_3 => nested_nodes_die_with_the_node_above_them;
    GPU => device_launch_runs_a_graph_from_a_kernel;
}

fn every_node_kind_reads_back_what_was_set(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(8)?;
    let src = gpu.device.htod(&[1i32, 2, 3, 4, 5, 6, 7, 8])?;
    let event = gpu.device.create_event()?;
    let child = GraphDefinition::new(&gpu.device)?;
    child.add_empty(&[])?;
    child.add_empty(&[])?;
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one_at(int* p, int i)
    let cfg = LaunchConfig {
        grid: (2, 1, 1),
        block: (32, 1, 1),
        shared_mem_bytes: 64,
        ..LaunchConfig::single()
    };
    // SAFETY: add_one_at(int*, int) with i = 3 < 8; only thread 0 acts.
    let kernel =
        unsafe { def.add_kernel_unchecked(&[], &gpu.f("add_one_at"), cfg, &args![&buf, 3i32])? };
    let memset = def.add_memset(&[&kernel], &buf, 7i32)?;
    let memcpy = def.add_memcpy(&[&memset], &buf, &src)?;
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let (host, observer) = def.add_host_callback(&[&memcpy], move || {
        seen.fetch_add(1, Ordering::SeqCst);
    })?;
    let embedded = def.add_child_graph(&[&host], &child)?;
    let empty = def.add_empty(&[&embedded])?;
    let record = def.add_event_record(&[&empty], &event)?;
    let wait = def.add_event_wait(&[&record], &event)?;
    let (alloc_node, scratch) = def.add_mem_alloc(&[&wait], 4096)?;
    let (scratch_ptr, scratch_len) = (scratch.device_ptr(), scratch.byte_len());
    let free = def.add_mem_free(&[&alloc_node], scratch)?;
    let h = def.create_conditional_handle(Some(0))?;
    let (cond, body) = def.add_if(&[&free], &h)?;
    body.add_empty(&[])?;

    // Typed read-back, kind by kind.
    let ki = def.node_info(&kernel)?;
    assert_eq!(ki.config, cfg);
    assert_eq!(ki.name.as_deref(), Some("add_one_at"));
    assert!(
        ki.function.is_some(),
        "the kernel's module is held by the node"
    );
    assert_eq!(ki.args.len(), 2);
    assert_eq!(ki.arg::<u64>(0), Some(buf.device_ptr()));
    assert_eq!(ki.arg::<i32>(1), Some(3));
    let mi = def.node_info(&memset)?;
    assert_eq!(
        (mi.dst, mi.value, mi.element_size, mi.width, mi.height),
        (buf.device_ptr(), 7, 4, 8, 1)
    );
    let ci = def.node_info(&memcpy)?;
    assert_eq!(
        (ci.src_kind, ci.dst_kind),
        (MemoryKind::Device, MemoryKind::Device)
    );
    assert_eq!(
        (ci.src, ci.dst, ci.bytes()),
        (src.device_ptr(), buf.device_ptr(), 32)
    );
    let hi = def.node_info(&host)?;
    let cb = hi.callback.expect("the crate's callback is found");
    let ei = def.node_info(&record)?;
    assert_eq!(ei.raw, event.as_raw());
    assert_eq!(ei.event.as_ref().map(Event::as_raw), Some(event.as_raw()));
    let wi = def.node_info(&wait)?;
    assert_eq!(wi.event.map(|e| e.as_raw()), Some(event.as_raw()));
    let ai = def.node_info(&alloc_node)?;
    assert_eq!((ai.device_ptr, ai.bytes), (scratch_ptr, scratch_len));
    assert_eq!(ai.device, 0);
    assert_eq!(def.node_info(&free)?.device_ptr, scratch_ptr);
    def.node_info(&empty)?;
    let gi = def.node_info(&embedded)?;
    assert_eq!(gi.graph.nodes()?.len(), 2, "the child's two empty nodes");
    assert!(!gi.graph.is_conditional_body());
    let qi = def.node_info(&cond)?;
    assert_eq!(qi.handle, h);
    assert_eq!(qi.kind, ConditionalKind::If);
    assert_eq!(qi.bodies.len(), 1);
    assert_eq!(qi.bodies[0].nodes()?.len(), 1);
    assert!(qi.bodies[0].is_conditional_body());

    // Every listed node reads back as its own kind.
    let listed = def.nodes()?;
    assert_eq!(listed.len(), 11);
    for n in &listed {
        let info = def.inspect(n)?;
        assert_eq!(info.node(), *n);
        assert!(!matches!(info, NodeInfo::Other(..)), "{info:?}");
    }

    // The callback read back is the node's: it counts the node's calls.
    run(gpu, &def)?;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(cb.calls(), Some(1));
    assert_eq!(observer.calls(), Some(1));
    assert_eq!(buf.to_vec()?, [1, 2, 3, 4, 5, 6, 7, 8]);
    Ok(())
}

fn captured_and_copied_nodes_read_back(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: fill(int* p, int n, int v) over 4 ints of `buf`.
    unsafe { b.launch_unchecked(&gpu.f("fill"), one(), &args![&buf, 4i32, 9i32])? };
    let ended = b.end_building()?;
    let view = ended.graph_definition()?;
    let nodes = view.nodes()?;
    assert_eq!(nodes.len(), 1);
    let NodeInfo::Kernel(kn, info) = view.inspect(&nodes[0])? else {
        panic!("a captured launch is a kernel node");
    };
    assert_eq!(kn, nodes[0]);
    assert_eq!(info.name.as_deref(), Some("fill"));
    assert!(
        info.function.is_some(),
        "found among the capture's operands"
    );
    assert_eq!(info.arg::<u64>(0), Some(buf.device_ptr()));
    assert_eq!((info.arg::<i32>(1), info.arg::<i32>(2)), (Some(4), Some(9)));

    // A copy's nodes: their operands are held per graph, and still found.
    let def = GraphDefinition::new(&gpu.device)?;
    let event = gpu.device.create_event()?;
    def.add_event_record(&[], &event)?;
    // fill(int* p, int n, int v)
    k(&def, &[], &gpu.f("fill"), args![&buf, 4i32, 2i32])?;
    let copy = def.try_clone()?;
    drop(def);
    let mut seen = (false, false);
    for n in copy.nodes()? {
        match copy.inspect(&n)? {
            NodeInfo::EventRecord(_, e) => {
                assert_eq!(e.event.map(|e| e.as_raw()), Some(event.as_raw()));
                seen.0 = true;
            }
            NodeInfo::Kernel(_, k) => {
                assert!(k.function.is_some(), "found among the copy's operands");
                assert_eq!(k.arg::<i32>(2), Some(2));
                seen.1 = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, (true, true));
    Ok(())
}

fn updated_parameters_read_back(gpu: &Gpu) -> TestResult {
    let a = gpu.device.alloc_zeroed::<i32>(4)?;
    let b = gpu.device.alloc_zeroed::<i32>(4)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // fill(int* p, int n, int v)
    let f = k(&def, &[], &gpu.f("fill"), args![&a, 4i32, 1i32])?;
    // SAFETY: fill(int*, int, int) over 2 ints of `b`.
    let params =
        unsafe { NodeParams::kernel_unchecked(&gpu.f("fill"), one(), args![&b, 2i32, 5i32]) };
    def.set_params(&f, params)?;
    let info = def.node_info(&f)?;
    assert_eq!(info.arg::<u64>(0), Some(b.device_ptr()));
    assert_eq!((info.arg::<i32>(1), info.arg::<i32>(2)), (Some(2), Some(5)));
    // A kernel node without arguments.
    let e = k(&def, &[], &gpu.f("empty_kernel"), args![])?;
    let info = def.node_info(&e)?;
    assert!(info.args.is_empty());
    assert_eq!(info.name.as_deref(), Some("empty_kernel"));
    // A node of another graph, and a destroyed node, are refused.
    let other = GraphDefinition::new(&gpu.device)?;
    assert!(matches!(other.inspect(&f), Err(Error::ForeignNode)));
    def.destroy_node(e)?;
    assert!(matches!(def.inspect(&e), Err(Error::DestroyedNode)));
    Ok(())
}

fn child_graph_view_extends_the_node_and_dies_with_it(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let child = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    k(&child, &[], &gpu.f("add_one"), args![&buf])?;
    let parent = GraphDefinition::new(&gpu.device)?;
    let node = parent.add_child_graph(&[], &child)?;
    let view = parent.node_info(&node)?.graph;
    let listed = view.nodes()?;
    assert_eq!(listed.len(), 1);
    // A second look is the same graph: its tokens work in the first view.
    let again = parent.node_info(&node)?.graph;
    assert_eq!(again.nodes()?, listed);
    assert_eq!(view.node_type(&again.nodes()?[0])?, NodeType::Kernel);
    // Extending the node's graph changes what the node runs (the original child is unchanged).
    let second = k(
        &view,
        &listed.iter().collect::<Vec<_>>(),
        &gpu.f("add_one"),
        args![&buf],
    )?;
    assert_eq!(child.nodes()?.len(), 1);
    run(gpu, &parent)?;
    assert_eq!(buf.to_vec()?, [2]);
    assert!(matches!(view.inspect(&second)?, NodeInfo::Kernel(..)));
    // It is part of the parent: not instantiated, cloned or embedded on its own.
    assert!(matches!(view.instantiate(), Err(e) if e.refusal() == Some(Refusal::Unsupported)));
    assert!(matches!(view.try_clone(), Err(e) if e.refusal() == Some(Refusal::Unsupported)));
    // An exec update of a node inside it is refused (the child-graph node is the unit).
    let g = parent.instantiate()?;
    // SAFETY: add_one(int*).
    let params = unsafe { NodeParams::kernel_unchecked(&gpu.f("add_one"), one(), args![&buf]) };
    assert!(g.set_params(&second, params).is_err());
    launch(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [4]);
    // Destroying the node frees its graph: the views are refused from then on, and the buffer
    // the view's kernel used is released once the exec is gone too.
    let watch = buf.release_observer();
    drop(buf);
    drop(child);
    parent.destroy_node(node)?;
    assert!(view.nodes().is_err());
    assert!(again.add_empty(&[]).is_err());
    assert!(stays(|| !watch.is_released()), "the exec still uses it");
    drop(g);
    assert!(eventually(|| watch.is_released()));
    Ok(())
}

/// `set_params` with a new child graph replaces the node's graph contents: a view made before,
/// and its node tokens, may refer to nodes the driver freed, so they are refused; a new view
/// shows the new contents.
fn replacing_a_child_graph_retires_its_views(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let first = GraphDefinition::new(&gpu.device)?;
    first.add_memset(&[], &buf, 1i32)?;
    let parent = GraphDefinition::new(&gpu.device)?;
    let node = parent.add_child_graph(&[], &first)?;
    let view = parent.node_info(&node)?.graph;
    let old = view.nodes()?[0];
    let second = GraphDefinition::new(&gpu.device)?;
    second.add_memset(&[], &buf, 2i32)?;
    parent.set_params(&node, NodeParams::child_graph(&second)?)?;
    assert!(view.inspect(&old).is_err(), "a token of a replaced node");
    assert!(view.nodes().is_err() && view.add_empty(&[&old]).is_err());
    let fresh = parent.node_info(&node)?.graph;
    assert!(matches!(
        fresh.inspect(&fresh.nodes()?[0])?,
        NodeInfo::Memset(..)
    ));
    run(gpu, &parent)?;
    assert_eq!(buf.to_vec()?, [2], "the node runs the new child graph");
    Ok(())
}

/// A conditional node inside a child-graph node's graph, and one inside another's body: when
/// the node above is destroyed, the driver frees everything below it, at any depth. Tokens of
/// those nodes must be refused by the execs made before (their per-node calls would hand the
/// driver freed nodes), and the handle that drove the nested conditional node is free again.
fn nested_nodes_die_with_the_node_above_them(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let parent = GraphDefinition::new(&gpu.device)?;
    let h = parent.create_conditional_handle(Some(1))?;
    let node = parent.add_child_graph(&[], &GraphDefinition::new(&gpu.device)?)?;
    let view = parent.node_info(&node)?.graph;
    let (_c, body) = view.add_if(&[], &h)?;
    let inner = body.add_memset(&[], &buf, 1i32)?;
    let h2 = parent.create_conditional_handle(Some(1))?;
    let (outer_if, outer_body) = parent.add_if(&[], &h2)?;
    let h3 = parent.create_conditional_handle(Some(1))?;
    let (_c2, inner_body) = outer_body.add_if(&[], &h3)?;
    let deepest = inner_body.add_memset(&[], &buf, 2i32)?;
    let g = parent.instantiate()?;
    parent.destroy_node(node)?;
    parent.destroy_node(outer_if)?;
    for (what, r) in [
        (
            "set_enabled in a child graph's body",
            g.set_enabled(&inner, false),
        ),
        (
            "set_enabled in a body's body",
            g.set_enabled(&deepest, false),
        ),
        ("is_enabled", g.is_enabled(&deepest).map(|_| ())),
        (
            "set_params",
            g.set_params(&deepest, NodeParams::memset(&buf, 3i32)?),
        ),
    ] {
        assert!(
            matches!(r, Err(Error::DestroyedNode)),
            "{what} on a freed nested node: {r:?}"
        );
    }
    assert!(body.nodes().is_err() && inner_body.nodes().is_err());
    launch(gpu, &g)?;
    Ok(())
}

/// Bisection for the cube root of 2 on [0, 2]: a WHILE node (handle `loop_h`) whose body
/// evaluates the midpoint and decides with an IF/ELSE node (handle `branch`) — both handles
/// created on the top-level graph, the IF/ELSE sitting in the WHILE's body.
fn bisection_while_body_decides_with_the_top_level_handle(gpu: &Gpu) -> TestResult {
    let state = gpu.device.htod(&[0.0f32, 2.0, 0.0])?;
    let iterations = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let loop_h = def.create_conditional_handle(Some(1))?;
    let branch = def.create_conditional_handle(None)?;
    let (_w, body) = def.add_while(&[], &loop_h)?;
    // bisect_eval(handle branch, float* state)
    let eval = k(&body, &[], &gpu.f("bisect_eval"), args![branch, &state])?;
    let (_d, then_b, else_b) = body.add_if_else(&[&eval], &branch)?;
    // bisect_take(float* state, int which): mid^3 > 2 -> hi = mid, else lo = mid
    k(&then_b, &[], &gpu.f("bisect_take"), args![&state, 1i32])?;
    k(&else_b, &[], &gpu.f("bisect_take"), args![&state, 0i32])?;
    let decide = body
        .nodes()?
        .into_iter()
        .find(|n| body.node_type(n).ok() == Some(NodeType::Conditional));
    let decide = decide.expect("the IF/ELSE node");
    // bisect_continue(handle loop, const float* state, int* iterations, float tol, int max)
    k(
        &body,
        &[&decide],
        &gpu.f("bisect_continue"),
        args![loop_h, &state, &iterations, 1e-5f32, 100i32],
    )?;
    run(gpu, &def)?;
    let s = state.to_vec()?;
    let root = 0.5 * (s[0] + s[1]);
    let iters = iterations.to_vec()?[0];
    println!(
        "    root {root} after {iters} iterations (cbrt 2 = {})",
        2f32.cbrt()
    );
    assert!((root - 2f32.cbrt()).abs() < 1e-4, "{s:?}");
    assert!(s[1] - s[0] <= 1e-5, "{s:?}");
    assert!((15..100).contains(&iters), "{iters}");
    // The handle of an unrelated graph stays refused in a body.
    let other = GraphDefinition::new(&gpu.device)?;
    let foreign = other.create_conditional_handle(Some(1))?;
    assert!(matches!(
        body.add_if(&[], &foreign),
        Err(Error::ForeignConditionalHandle)
    ));
    // ... and a body's handle is refused in its parent.
    let inner = body.create_conditional_handle(Some(1))?;
    assert!(matches!(
        def.add_if(&[], &inner),
        Err(Error::ForeignConditionalHandle)
    ));
    Ok(())
}

fn captured_body_tests_the_parent_handle(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let add_one = gpu.f("add_one");
    let p = gpu.device.create_graph_builder()?.begin_building(Global)?;
    let h = p.create_conditional_handle(Some(1))?;
    let h_inner = p.create_conditional_handle(Some(1))?;
    {
        let outer = p.add_if(&h)?.begin_building(Global)?;
        {
            // The body's IF tests a handle of the top-level graph.
            let inner = outer.add_if(&h_inner)?.begin_building(Global)?;
            // SAFETY: add_one(int*).
            unsafe { inner.launch_unchecked(&add_one, one(), &args![&buf])? };
            inner.end_building()?;
        }
        outer.end_building()?;
    }
    let g = p.end_building()?.instantiate()?;
    launch(gpu, &g)?;
    launch(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [2]);
    Ok(())
}

fn conditional_in_a_child_graph_tests_the_outer_handle(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let parent = GraphDefinition::new(&gpu.device)?;
    let h = parent.create_conditional_handle(Some(1))?;
    let empty = GraphDefinition::new(&gpu.device)?;
    let node = parent.add_child_graph(&[], &empty)?;
    let view = parent.node_info(&node)?.graph;
    // The child's IF tests the outer graph's handle (the handle must be used in the graph
    // instantiated, which it is: the child is part of it).
    let (_n, body) = view.add_if(&[], &h)?;
    // add_one(int*)
    let inner = k(&body, &[], &gpu.f("add_one"), args![&buf])?;
    let g = parent.instantiate()?;
    launch(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [1]);
    // A node in a body inside the child's graph is not the exec's to update on its own.
    // SAFETY: add_one(int*).
    let params = unsafe { NodeParams::kernel_unchecked(&gpu.f("add_one"), one(), args![&buf]) };
    match g.set_params(&inner, params) {
        Err(e) if e.refusal() == Some(Refusal::Unsupported) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    launch(gpu, &g)?;
    assert_eq!(buf.to_vec()?, [2]);
    Ok(())
}

fn device_launch_runs_a_graph_from_a_kernel(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let status = gpu.device.htod(&[-1i32])?;
    let inner_def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    k(&inner_def, &[], &gpu.f("add_one"), args![&buf])?;
    let watch = inner_def.release_observer();
    // Not instantiated for device launch: no handle.
    let plain = inner_def.instantiate()?;
    assert!(matches!(
        plain.device_handle(),
        Err(e) if e.refusal() == Some(Refusal::Unsupported)
    ));
    drop(plain);
    let options = InstantiateOptions::new().device_launch(true);
    let inner = inner_def.instantiate_with(&options)?;
    let handle = inner.device_handle()?;
    assert_eq!(handle.raw(), inner.device_handle()?.raw());
    // Once a handle exists, updates are refused (device code may be launching it).
    assert!(matches!(
        inner.update(&inner_def),
        Err(e) if e.refusal() == Some(Refusal::Unsupported)
    ));
    let outer_def = GraphDefinition::new(&gpu.device)?;
    // launch_graph(cudaGraphExec_t g, int* status); runs in a graph, as device launch requires.
    k(
        &outer_def,
        &[],
        &gpu.f("launch_graph"),
        args![&handle, &status],
    )?;
    let outer = outer_def.instantiate()?;
    drop((handle, inner_def));
    launch(gpu, &outer)?;
    assert_eq!(
        status.to_vec()?,
        [0],
        "cudaGraphLaunch on the device returned cudaSuccess"
    );
    assert_eq!(buf.to_vec()?, [1]);
    // The host may launch it too.
    launch(gpu, &inner)?;
    assert_eq!(buf.to_vec()?, [2]);
    // The outer graph keeps the inner exec alive without the `Graph` (the launches below add
    // through it); not its source definition, which a parked exec holds weakly (a definition
    // holding a handle of its own exec would otherwise hold itself).
    drop(inner);
    assert!(eventually(|| watch.is_released()));
    let s = gpu.stream();
    for _ in 0..3 {
        outer.launch(&s)?;
    }
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [5]);
    drop((outer, outer_def));
    assert!(eventually(|| watch.is_released()));

    // A cache whose exec handed out a handle instantiates again instead of updating it.
    let def = GraphDefinition::new(&gpu.device)?;
    k(&def, &[], &gpu.f("add_one"), args![&buf])?;
    let mut cache = GraphCache::new(options);
    assert_eq!(
        cache.refresh(&def)?,
        CacheOutcome::Instantiated { refused: None }
    );
    assert_eq!(cache.refresh(&def)?, CacheOutcome::Updated);
    let held = cache.graph().expect("an exec").device_handle()?;
    assert!(cache.graph().is_some_and(Graph::has_device_handle));
    // Not asked to update: the exec handed out a device handle.
    assert_eq!(
        cache.refresh(&def)?,
        CacheOutcome::Instantiated { refused: None }
    );
    assert!(!cache.graph().is_some_and(Graph::has_device_handle));
    drop(held);

    // A device graph given to `KernelArgs` by value is held by the arguments (the one argument
    // they hold themselves), then by the node made from them.
    // Watched through a buffer only this exec uses (the exec holds its operands; its source
    // definition it holds weakly once parked).
    let def = GraphDefinition::new(&gpu.device)?;
    let own = gpu.device.alloc_zeroed::<i32>(1)?;
    k(&def, &[], &gpu.f("add_one"), args![&buf])?;
    k(&def, &[], &gpu.f("add_one"), args![&own])?;
    let watch = own.release_observer();
    drop(own);
    let exec = def.instantiate_with(&InstantiateOptions::new().device_launch(true))?;
    let args = KernelArgs::new().arg(exec.device_handle()?).arg(&status);
    drop((exec, def));
    assert!(
        stays(|| !watch.is_released()),
        "the arguments hold the exec"
    );
    let outer_def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: launch_graph(cudaGraphExec_t g, int* status), in a graph.
    unsafe { outer_def.add_kernel_unchecked(&[], &gpu.f("launch_graph"), one(), &args)? };
    drop(args);
    let outer = outer_def.instantiate()?;
    launch(gpu, &outer)?;
    assert_eq!(buf.to_vec()?, [6]);
    assert!(stays(|| !watch.is_released()), "the node holds the exec");
    drop((outer, outer_def));
    assert!(eventually(|| watch.is_released()));
    Ok(())
}
