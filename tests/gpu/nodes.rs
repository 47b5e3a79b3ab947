//! Typed nodes and per-node updates: of definitions, of execs (parameters, enabled), refusals,
//! the lifetimes of replaced parameters, and the update-or-instantiate cache.

use cuda_graph::prelude::*;

use cuda_graph::{Copy3d, Memset2d, NodeType, Refusal};

use crate::args;
use crate::support::{eventually, launch, one, run, stays, Gpu, Needs, TestResult};

const GPU: Needs = Needs::Gpu;

crate::gpu_tests! {
    "nodes";
    GPU =>
        typed_nodes_read_back_with_their_kind,
        definition_update_changes_later_instantiations_only,
        definition_update_releases_replaced_owners_after_older_execs,
        exec_update_changes_the_next_launch,
        exec_update_releases_replaced_owners_after_launches,
        disabled_node_does_not_run,
        refused_updates_change_nothing,
        captured_nodes_update_an_exec,
        host_callback_updates,
        child_graph_exec_update,
        child_graph_definition_update,
        cache_updates_or_instantiates,
        per_node_updates_name_nodes_of_the_latest_source,
        per_node_updates_through_a_changed_or_older_source_are_refused,
        per_node_updates_pair_by_structure_and_refuse_what_is_uncertain,
        per_node_updates_refuse_the_instantiation_graph_once_updated_from_it_rearranged,
        per_node_updates_pair_look_alike_dependencies_as_the_driver_does,
        region_copies_in_every_front_end;
}

/// A kernel node; each call site names the kernel's parameters it matches.
pub(crate) fn k(
    def: &GraphDefinition,
    deps: &[&GraphNode],
    f: &Function,
    args: KernelArgs,
) -> cuda_graph::Result<KernelNode> {
    // SAFETY: every caller passes arguments matching the kernel's parameters and in-bounds
    // buffers (see the comment at each call).
    unsafe { def.add_kernel_unchecked(deps, f, one(), &args) }
}

/// Kernel parameters; each call site names the kernel's parameters it matches.
fn kp(f: &Function, args: KernelArgs) -> NodeParams<cuda_graph::node_kind::Kernel> {
    // SAFETY: as for `k`.
    unsafe { NodeParams::kernel_unchecked(f, one(), args) }
}

fn typed_nodes_read_back_with_their_kind(gpu: &Gpu) -> TestResult {
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let m = def.add_memset(&[], &buf, 1i32)?;
    // add_one(int*)
    let kn = k(&def, &[&m], &gpu.f("add_one"), args![&buf])?;
    let untyped: GraphNode = kn.into();
    assert_eq!(def.kernel_node(&untyped)?, kn);
    assert_eq!(def.memset_node(&m)?, m);
    match def.memset_node(&untyped) {
        Err(Error::WrongNodeType {
            expected: NodeType::Memset,
            found: NodeType::Kernel,
        }) => {}
        r => return Err(format!("expected a wrong-kind error, got {r:?}").into()),
    }
    let kernels: Vec<KernelNode> = def
        .nodes()?
        .iter()
        .filter_map(|n| def.kernel_node(n).ok())
        .collect();
    assert_eq!(kernels, [kn]);
    let other = GraphDefinition::new(&gpu.device)?;
    assert!(matches!(
        other.kernel_node(&untyped),
        Err(Error::ForeignNode)
    ));
    run(gpu, &def)?;
    assert_eq!(buf.to_vec()?, [2]);
    Ok(())
}

fn definition_update_changes_later_instantiations_only(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let m = def.add_memset(&[], &a, 5i32)?;
    // affine(int*, int, int): a = 5 * 2 + 1
    let kn = k(&def, &[&m], &affine, args![&a, 2i32, 1i32])?;
    let before = def.instantiate()?;
    launch(gpu, &before)?;
    assert_eq!(a.to_vec()?, [11]);
    def.set_params(&m, NodeParams::memset(&a, 7i32)?)?;
    // affine(int*, int, int): a = 7 * 3 + 1
    def.set_params(&kn, kp(&affine, args![&a, 3i32, 1i32]))?;
    run(gpu, &def)?;
    assert_eq!(a.to_vec()?, [22], "a new exec runs the new parameters");
    launch(gpu, &before)?;
    assert_eq!(
        a.to_vec()?,
        [11],
        "an exec made before keeps its parameters"
    );
    Ok(())
}

fn definition_update_releases_replaced_owners_after_older_execs(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let (old, new) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let watch_old = old.release_observer();
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    let kn = k(&def, &[], &add_one, args![&old])?;
    let g = def.instantiate()?;
    drop(old);
    // add_one(int*)
    def.set_params(&kn, kp(&add_one, args![&new]))?;
    assert!(
        stays(|| !watch_old.is_released()),
        "the old buffer was released while an exec made before still uses it"
    );
    launch(gpu, &g)?;
    run(gpu, &def)?;
    assert_eq!(new.to_vec()?, [1]);
    drop(g);
    assert!(
        eventually(|| watch_old.is_released()),
        "the replaced buffer outlived the last exec that used it ({} owners)",
        watch_old.share_count()
    );
    // With no exec made before, the replaced buffer goes with the update.
    let x = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch_x = x.release_observer();
    // add_one(int*)
    def.set_params(&kn, kp(&add_one, args![&x]))?;
    drop(x);
    assert!(stays(|| !watch_x.is_released()), "the node holds x");
    // add_one(int*)
    def.set_params(&kn, kp(&add_one, args![&new]))?;
    assert!(
        eventually(|| watch_x.is_released()),
        "x outlived the update that replaced it ({} owners)",
        watch_x.share_count()
    );
    Ok(())
}

fn exec_update_changes_the_next_launch(gpu: &Gpu) -> TestResult {
    let affine = gpu.f("affine");
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let def = GraphDefinition::new(&gpu.device)?;
    let m = def.add_memset(&[], &a, 5i32)?;
    // affine(int*, int, int): a = 5 * 2 + 1
    let kn = k(&def, &[&m], &affine, args![&a, 2i32, 1i32])?;
    let g = def.instantiate()?;
    g.set_params(&m, NodeParams::memset(&a, 7i32)?)?;
    // affine(int*, int, int): a = 7 * 3 + 1
    g.set_params(&kn, kp(&affine, args![&a, 3i32, 1i32]))?;
    launch(gpu, &g)?;
    assert_eq!(a.to_vec()?, [22]);
    run(gpu, &def)?;
    assert_eq!(a.to_vec()?, [11], "the definition is unchanged");
    // affine(int*, int, int): b = 0 * 1 + 4
    g.set_params(&kn, kp(&affine, args![&b, 1i32, 4i32]))?;
    launch(gpu, &g)?;
    assert_eq!((a.to_vec()?, b.to_vec()?), (vec![7], vec![4]));
    Ok(())
}

fn exec_update_releases_replaced_owners_after_launches(gpu: &Gpu) -> TestResult {
    let copy = gpu.f("copy_i32");
    let dst = gpu.device.alloc_zeroed::<i32>(1)?;
    let (src1, src2, src3) = (
        gpu.device.htod(&[1i32])?,
        gpu.device.htod(&[2i32])?,
        gpu.device.htod(&[3i32])?,
    );
    let watch2 = src2.release_observer();
    let def = GraphDefinition::new(&gpu.device)?;
    // spin(unsigned long long ns), then copy_i32(const int*, int*, int)
    let s = k(&def, &[], &gpu.f("spin"), args![300_000_000u64])?;
    let c = k(&def, &[&s], &copy, args![&src1, &dst, 1i32])?;
    let g = def.instantiate()?;
    // copy_i32(const int*, int*, int)
    g.set_params(&c, kp(&copy, args![&src2, &dst, 1i32]))?;
    drop(src2);
    let stream = gpu.stream();
    g.launch(&stream)?;
    // copy_i32(const int*, int*, int)
    g.set_params(&c, kp(&copy, args![&src3, &dst, 1i32]))?;
    assert!(
        stays(|| !watch2.is_released()),
        "a replaced buffer was released while a launch that reads it was running"
    );
    stream.synchronize()?;
    assert_eq!(dst.to_vec()?, [2]);
    assert!(
        eventually(|| watch2.is_released()),
        "the replaced buffer outlived the launches that used it ({} owners)",
        watch2.share_count()
    );
    launch(gpu, &g)?;
    assert_eq!(dst.to_vec()?, [3]);
    // A whole-exec update replaces per-node parameters too: src3 goes after it.
    let watch3 = src3.release_observer();
    drop(src3);
    assert!(stays(|| !watch3.is_released()), "the exec holds src3");
    g.update(&def)?;
    assert!(
        eventually(|| watch3.is_released()),
        "src3 outlived the update that replaced it ({} owners)",
        watch3.share_count()
    );
    launch(gpu, &g)?;
    assert_eq!(dst.to_vec()?, [1], "the definition's parameters again");
    Ok(())
}

fn disabled_node_does_not_run(gpu: &Gpu) -> TestResult {
    // A kernel and a copy after it (memset nodes are refused toggles: see
    // `safety::a_memset_node_is_never_toggled`).
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    let kn = k(&def, &[], &gpu.f("add_one"), args![&a])?;
    let m = def.add_memcpy(&[&kn], &b, &a)?;
    let g = def.instantiate()?;
    g.set_enabled(&m, false)?;
    assert!(g.is_enabled(&kn)? && !g.is_enabled(&m)?);
    launch(gpu, &g)?;
    assert_eq!(
        (a.to_vec()?, b.to_vec()?),
        (vec![1], vec![0]),
        "the copy is disabled"
    );
    g.set_enabled(&kn, false)?;
    launch(gpu, &g)?;
    assert_eq!(
        (a.to_vec()?, b.to_vec()?),
        (vec![1], vec![0]),
        "both are disabled"
    );
    g.set_enabled(&kn, true)?;
    launch(gpu, &g)?;
    launch(gpu, &g)?;
    assert_eq!(
        (a.to_vec()?, b.to_vec()?),
        (vec![3], vec![0]),
        "the kernel runs again"
    );
    g.set_enabled(&m, true)?;
    assert!(g.is_enabled(&m)?);
    launch(gpu, &g)?;
    assert_eq!(
        (a.to_vec()?, b.to_vec()?),
        (vec![4], vec![4]),
        "the copy runs again"
    );
    Ok(())
}

fn refused_updates_change_nothing(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let a = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.alloc_zeroed::<i32>(4)?;
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    let kn = k(&def, &[], &add_one, args![&a])?;
    let m = def.add_memset(&[], &b, 0i32)?;
    let g = def.instantiate()?;
    let x = gpu.device.alloc_zeroed::<i32>(4)?;
    let watch_x = x.release_observer();
    let other = GraphDefinition::new(&gpu.device)?;
    // add_one(int*)
    let foreign = k(&other, &[], &add_one, args![&a])?;
    // add_one(int*) on x: never applied below.
    match g.set_params(&foreign, kp(&add_one, args![&x])) {
        Err(Error::ForeignNode) => {}
        r => return Err(format!("exec: expected ForeignNode, got {r:?}").into()),
    }
    match def.set_params(&foreign, kp(&add_one, args![&x])) {
        Err(Error::ForeignNode) => {}
        r => return Err(format!("definition: expected ForeignNode, got {r:?}").into()),
    }
    // add_one(int*)
    let later = k(&def, &[&kn], &add_one, args![&a])?;
    match g.set_params(&later, kp(&add_one, args![&x])) {
        Err(Error::NodeNotInExec) => {}
        r => return Err(format!("expected NodeNotInExec, got {r:?}").into()),
    }
    assert!(matches!(
        g.set_enabled(&later, false),
        Err(Error::NodeNotInExec)
    ));
    def.destroy_node(later)?;
    match g.set_params(&later, kp(&add_one, args![&x])) {
        Err(Error::DestroyedNode) => {}
        r => return Err(format!("expected DestroyedNode, got {r:?}").into()),
    }
    // The driver refuses a 2D memset in an exec's 1D memset node.
    let shape = Memset2d {
        width: 2,
        height: 2,
        pitch: 2,
    };
    match g.set_params(&m, NodeParams::memset_2d(&x, 9i32, shape)?) {
        Err(Error::Driver(_)) => {}
        r => return Err(format!("expected the driver's refusal, got {r:?}").into()),
    }
    drop(x);
    assert!(
        eventually(|| watch_x.is_released()),
        "refused parameters were kept ({} owners)",
        watch_x.share_count()
    );
    b.copy_from(&[5, 5, 5, 5])?;
    launch(gpu, &g)?;
    assert_eq!(a.to_vec()?, [1], "only the original kernel ran");
    assert_eq!(b.to_vec()?, [0, 0, 0, 0], "the original memset ran");
    Ok(())
}

fn captured_nodes_update_an_exec(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let bld = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { bld.launch_unchecked(&add_one, one(), &args![&a])? };
    let ended = bld.end_building()?;
    let g = ended.instantiate()?;
    let view = ended.graph_definition()?;
    let nodes = view.nodes()?;
    assert_eq!(nodes.len(), 1);
    let kn = view.kernel_node(&nodes[0])?;
    // add_one(int*)
    g.set_params(&kn, kp(&add_one, args![&b]))?;
    launch(gpu, &g)?;
    assert_eq!((a.to_vec()?, b.to_vec()?), (vec![0], vec![1]));
    Ok(())
}

fn host_callback_updates(gpu: &Gpu) -> TestResult {
    let def = GraphDefinition::new(&gpu.device)?;
    let (h, first) = def.add_host_callback(&[], || {})?;
    let g = def.instantiate()?;
    let (p, second) = NodeParams::host_callback(|| {});
    g.set_params(&h, p)?;
    launch(gpu, &g)?;
    assert_eq!((first.calls(), second.calls()), (Some(0), Some(1)));
    assert!(!first.is_released(), "the definition's node still holds it");
    let (p, third) = NodeParams::host_callback(|| {});
    def.set_params(&h, p)?;
    run(gpu, &def)?;
    launch(gpu, &g)?;
    // The first callback is used by nothing now: the exec let it go at its own update, the
    // definition at this one.
    assert!(
        eventually(|| first.is_released()),
        "the replaced callback outlived the last node using it"
    );
    assert_eq!((second.calls(), third.calls()), (Some(2), Some(1)));
    drop(g);
    assert!(
        eventually(|| second.is_released()),
        "the exec's callback outlived it"
    );
    assert!(!third.is_released(), "the definition's node holds it");
    drop(def);
    assert!(eventually(|| third.is_released()));
    Ok(())
}

/// A child definition that sets `buf` to `value`.
fn memset_child(
    gpu: &Gpu,
    buf: &DeviceBuffer<i32>,
    value: i32,
) -> cuda_graph::Result<GraphDefinition> {
    let child = GraphDefinition::new(&gpu.device)?;
    child.add_memset(&[], buf, value)?;
    Ok(child)
}

fn child_graph_exec_update(gpu: &Gpu) -> TestResult {
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let def = GraphDefinition::new(&gpu.device)?;
    let ch = def.add_child_graph(&[], &memset_child(gpu, &a, 1)?)?;
    let g = def.instantiate()?;
    let watch_b = b.release_observer();
    g.set_params(&ch, NodeParams::child_graph(&memset_child(gpu, &b, 2)?)?)?;
    let b_copy = b.clone();
    drop(b);
    launch(gpu, &g)?;
    assert_eq!((a.to_vec()?, b_copy.to_vec()?), (vec![0], vec![2]));
    drop(b_copy);
    assert!(
        stays(|| !watch_b.is_released()),
        "the exec's new child uses b"
    );
    drop(g);
    assert!(eventually(|| watch_b.is_released()));
    Ok(())
}

fn child_graph_definition_update(gpu: &Gpu) -> TestResult {
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let def = GraphDefinition::new(&gpu.device)?;
    let ch = def.add_child_graph(&[], &memset_child(gpu, &a, 1)?)?;
    def.set_params(&ch, NodeParams::child_graph(&memset_child(gpu, &b, 2)?)?)?;
    run(gpu, &def)?;
    assert_eq!((a.to_vec()?, b.to_vec()?), (vec![0], vec![2]));
    Ok(())
}

fn cache_updates_or_instantiates(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let (a, b) = (
        gpu.device.alloc_zeroed::<i32>(1)?,
        gpu.device.alloc_zeroed::<i32>(1)?,
    );
    let stream = gpu.stream();
    let mut cache = GraphCache::new(Default::default());
    // `n` add_one launches on `buf`.
    let step = |n: usize, buf: &DeviceBuffer<i32>| -> cuda_graph::Result<_> {
        let bld = gpu.device.create_graph_builder()?.begin_building(Global)?;
        for _ in 0..n {
            // SAFETY: add_one(int*).
            unsafe { bld.launch_unchecked(&add_one, one(), &args![buf])? };
        }
        bld.end_building()
    };
    assert!(cache.launch(&stream).is_err(), "nothing cached yet");
    assert_eq!(
        cache.refresh(&step(1, &a)?)?,
        CacheOutcome::Instantiated { refused: None }
    );
    cache.launch(&stream)?;
    // Same topology, another buffer, which only the cache holds.
    let watch_b = b.release_observer();
    let b_copy = b.clone();
    assert_eq!(cache.refresh(&step(1, &b)?)?, CacheOutcome::Updated);
    drop(b);
    cache.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(b_copy.to_vec()?, [1]);
    drop(b_copy);
    assert!(stays(|| !watch_b.is_released()), "the updated exec uses b");
    // Another topology: instantiated again, saying why; the replaced exec lets b go.
    assert_eq!(
        cache.refresh(&step(2, &a)?)?,
        CacheOutcome::Instantiated {
            refused: Some(cuda_graph::UpdateFailure::TopologyChanged)
        }
    );
    cache.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(a.to_vec()?, [3]);
    assert_eq!((cache.updates(), cache.instantiations()), (1, 2));
    assert!(
        eventually(|| watch_b.is_released()),
        "b outlived the exec replaced by the cache ({} owners)",
        watch_b.share_count()
    );
    // A definition works as a source too.
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*), twice in a chain, as the capture of two launches.
    let first = k(&def, &[], &add_one, args![&a])?;
    k(&def, &[&first], &add_one, args![&a])?;
    assert_eq!(cache.refresh(&def)?, CacheOutcome::Updated);
    cache.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(a.to_vec()?, [5]);
    Ok(())
}

/// `n` one-int device counters, zeroed.
fn counters(gpu: &Gpu, n: usize) -> cuda_graph::Result<Vec<DeviceBuffer<i32>>> {
    (0..n).map(|_| gpu.device.alloc_zeroed::<i32>(1)).collect()
}

/// Whether `r` is a [`Refusal::ForeignGraph`]: how an exec refuses a node of its latest update's
/// source that it cannot pair.
fn foreign_graph<T>(r: cuda_graph::Result<T>) -> bool {
    matches!(r, Err(ref e) if e.refusal() == Some(Refusal::ForeignGraph))
}

/// Three `add_one` launches in a chain, captured: on `bufs[0]`, `bufs[1]`, `bufs[2]`.
fn chain3(
    gpu: &Gpu,
    add_one: &Function,
    bufs: [&DeviceBuffer<i32>; 3],
) -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
    let bld = gpu.device.create_graph_builder()?.begin_building(Global)?;
    for buf in bufs {
        // SAFETY: add_one(int*).
        unsafe { bld.launch_unchecked(add_one, one(), &args![buf])? };
    }
    bld.end_building()
}

/// The same chain as [`chain3`], built as a definition: the definition and its nodes in order.
fn defined_chain3(
    gpu: &Gpu,
    add_one: &Function,
    bufs: [&DeviceBuffer<i32>; 3],
) -> cuda_graph::Result<(GraphDefinition, [KernelNode; 3])> {
    let def = GraphDefinition::new(&gpu.device)?;
    // add_one(int*) on bufs[0], then bufs[1], then bufs[2].
    let n0 = k(&def, &[], add_one, args![bufs[0]])?;
    let n1 = k(&def, &[&n0], add_one, args![bufs[1]])?;
    let n2 = k(&def, &[&n1], add_one, args![bufs[2]])?;
    Ok((def, [n0, n1, n2]))
}

/// The first, middle and last node of a captured chain of three, found by their edges (not by
/// the order the driver lists them in).
fn chain_nodes(ended: &GraphBuilder<Primary, Ended>) -> cuda_graph::Result<[KernelNode; 3]> {
    let view = ended.graph_definition()?;
    let nodes = view.nodes()?;
    let mut first = None;
    let mut middle = None;
    let mut last = None;
    for n in &nodes {
        match (
            view.predecessors(n)?.is_empty(),
            view.successors(n)?.is_empty(),
        ) {
            (true, _) => first = Some(view.kernel_node(n)?),
            (false, false) => middle = Some(view.kernel_node(n)?),
            (false, true) => last = Some(view.kernel_node(n)?),
        }
    }
    match (first, middle, last) {
        (Some(a), Some(b), Some(c)) if nodes.len() == 3 => Ok([a, b, c]),
        _ => panic!("not a chain of three: {nodes:?}"),
    }
}

/// After `GraphCache::refresh` updated its exec from a new capture, per-node updates take that
/// capture's nodes: each names the exec node it was paired with, parameters and enabled state
/// alike, and what the new parameters use stays until the next `set_params` replaced them.
fn per_node_updates_name_nodes_of_the_latest_source(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let bufs = counters(gpu, 7)?;
    let [a, b, c, d, e, f, x] = &bufs[..] else {
        unreachable!()
    };
    let stream = gpu.stream();
    let mut cache = GraphCache::new(Default::default());
    cache.refresh(&chain3(gpu, &add_one, [a, b, c])?)?;
    let step = chain3(gpu, &add_one, [d, e, f])?;
    assert_eq!(cache.refresh(&step)?, CacheOutcome::Updated);
    let [first, middle, last] = chain_nodes(&step)?;
    let g = cache.graph().expect("refreshed");
    // The middle node now adds to x (held by the exec alone once dropped here), the last is off.
    let spare = gpu.device.alloc_zeroed::<i32>(1)?;
    let watch = spare.release_observer();
    g.set_params(&middle, kp(&add_one, args![&spare]))?;
    drop(spare);
    g.set_enabled(&last, false)?;
    assert!(!g.is_enabled(&last)? && g.is_enabled(&first)?);
    cache.launch(&stream)?;
    stream.synchronize()?;
    let read = |bs: [&DeviceBuffer<i32>; 4]| -> cuda_graph::Result<Vec<i32>> {
        bs.iter().map(|b| Ok(b.to_vec()?[0])).collect()
    };
    assert_eq!(
        read([a, b, c, x])?,
        [0, 0, 0, 0],
        "the first capture's buffers"
    );
    assert_eq!(
        read([d, e, f, x])?,
        [1, 0, 0, 0],
        "d ran; e's node was moved, f's is off"
    );
    assert!(
        stays(|| !watch.is_released()),
        "the exec's middle node uses the spare buffer"
    );
    // The set_params went to the middle node: re-enabling the last gives d, f one more each.
    g.set_params(&middle, kp(&add_one, args![x]))?;
    g.set_enabled(&last, true)?;
    cache.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(read([d, e, f, x])?, [2, 0, 1, 1]);
    assert!(
        eventually(|| watch.is_released()),
        "the spare buffer outlived the parameters that used it"
    );
    // Each refresh pairs anew: the next capture's middle node names the same exec node.
    let next = chain3(gpu, &add_one, [a, b, c])?;
    assert_eq!(cache.refresh(&next)?, CacheOutcome::Updated);
    let g = cache.graph().expect("refreshed");
    g.set_params(&chain_nodes(&next)?[1], kp(&add_one, args![x]))?;
    assert!(
        g.set_params(&middle, kp(&add_one, args![x])).is_err(),
        "a node of the source before the latest"
    );
    cache.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(read([a, b, c, x])?, [1, 0, 1, 2]);
    Ok(())
}

/// The latest source's nodes are refused once that graph changed, and an older source's
/// nodes always; the exec is left as it was.
fn per_node_updates_through_a_changed_or_older_source_are_refused(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let bufs = counters(gpu, 4)?;
    let [a, b, c, x] = &bufs[..] else {
        unreachable!()
    };
    let (first, [_, n1, _]) = defined_chain3(gpu, &add_one, [a, b, c])?;
    let g = first.instantiate()?;
    let older = chain3(gpu, &add_one, [a, b, c])?;
    g.update(&older)?;
    let [_, older_middle, _] = chain_nodes(&older)?;
    g.set_params(&older_middle, kp(&add_one, args![x]))?;
    let latest = first.try_clone()?;
    g.update(&latest)?;
    assert!(
        matches!(
            g.set_params(&older_middle, kp(&add_one, args![x])),
            Err(Error::ForeignNode)
        ),
        "a node of a source two updates old"
    );
    // Nodes of the latest source (a clone of the definition) are paired...
    let latest_nodes = latest.nodes()?;
    let middle = latest_nodes
        .iter()
        .find(|n| {
            !latest.predecessors(n).unwrap().is_empty() && !latest.successors(n).unwrap().is_empty()
        })
        .copied()
        .expect("a middle node");
    g.set_enabled(&middle, false)?;
    // ... until it changes: an added node, a removed edge, a destroyed node.
    latest.add_empty(&[])?;
    assert!(foreign_graph(g.set_enabled(&middle, true)), "a node added");
    assert!(foreign_graph(g.is_enabled(&middle)));
    let middle_of =
        |def: &GraphDefinition| -> cuda_graph::Result<(GraphNode, GraphNode, GraphNode)> {
            let nodes = def.nodes()?;
            let find = |want: (bool, bool)| -> cuda_graph::Result<GraphNode> {
                for n in &nodes {
                    if (
                        def.predecessors(n)?.is_empty(),
                        def.successors(n)?.is_empty(),
                    ) == want
                    {
                        return Ok(*n);
                    }
                }
                Err(Error::ForeignNode)
            };
            Ok((
                find((true, false))?,
                find((false, false))?,
                find((false, true))?,
            ))
        };
    let edged = first.try_clone()?;
    g.update(&edged)?;
    let (head, mid, _) = middle_of(&edged)?;
    g.set_enabled(&mid, false)?;
    edged.remove_edge(&head, &mid)?;
    assert!(foreign_graph(g.set_enabled(&mid, false)), "an edge removed");
    let cut = first.try_clone()?;
    g.update(&cut)?;
    let (_, mid, tail) = middle_of(&cut)?;
    g.set_enabled(&mid, false)?;
    cut.destroy_node(tail)?;
    assert!(
        foreign_graph(g.set_enabled(&mid, false)),
        "a node destroyed"
    );
    // The instantiation graph's own node still names its exec node.
    assert!(
        !g.is_enabled(&n1)?,
        "the middle node was disabled through the clone's"
    );
    launch(gpu, &g)?;
    let read = |bs: [&DeviceBuffer<i32>; 4]| -> cuda_graph::Result<Vec<i32>> {
        bs.iter().map(|b| Ok(b.to_vec()?[0])).collect()
    };
    assert_eq!(read([a, b, c, x])?, [1, 0, 1, 0]);
    Ok(())
}

/// The pairing follows the graphs' structure, not the order their nodes were made in; it is
/// refused where the driver's pairing cannot be known (two look-alike sinks), after the
/// instantiation graph changed, and for nodes inside the source's child graphs.
fn per_node_updates_pair_by_structure_and_refuse_what_is_uncertain(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let bufs = counters(gpu, 5)?;
    let [a, b, c, x, y] = &bufs[..] else {
        unreachable!()
    };
    // A chain a -> b -> c made last node first, its edges added afterwards: listed c, b, a,
    // where the captured chain the exec came from lists a, b, c.
    let captured = chain3(gpu, &add_one, [a, b, c])?;
    let g = captured.instantiate()?;
    let backwards = GraphDefinition::new(&gpu.device)?;
    // add_one(int*) on c, b, a.
    let on_c = k(&backwards, &[], &add_one, args![c])?;
    let on_b = k(&backwards, &[], &add_one, args![b])?;
    let on_a = k(&backwards, &[], &add_one, args![a])?;
    backwards.add_edge(&on_a, &on_b)?;
    backwards.add_edge(&on_b, &on_c)?;
    g.update(&backwards)?;
    // The head of the chain (listed last) names the exec's head: a stays, x is counted.
    g.set_params(&on_a, kp(&add_one, args![x]))?;
    launch(gpu, &g)?;
    let read = |bs: [&DeviceBuffer<i32>; 4]| -> cuda_graph::Result<Vec<i32>> {
        bs.iter().map(|b| Ok(b.to_vec()?[0])).collect()
    };
    assert_eq!(read([a, b, c, x])?, [0, 1, 1, 1]);

    // Two unconnected kernels: the driver may pair them either way, so neither is named.
    let pair_of = |p: &DeviceBuffer<i32>, q: &DeviceBuffer<i32>| -> cuda_graph::Result<_> {
        let def = GraphDefinition::new(&gpu.device)?;
        // add_one(int*) on p, and on q.
        let first = k(&def, &[], &add_one, args![p])?;
        k(&def, &[], &add_one, args![q])?;
        Ok((def, first))
    };
    let (two, _) = pair_of(a, b)?;
    let g2 = two.instantiate()?;
    let (other, first) = pair_of(x, y)?;
    g2.update(&other)?;
    assert!(foreign_graph(g2.set_params(&first, kp(&add_one, args![c]))));
    assert!(foreign_graph(g2.set_enabled(&first, false)));

    // The instantiation graph changed after the exec was made: nothing can be paired with it.
    let (def, [n0, ..]) = defined_chain3(gpu, &add_one, [a, b, c])?;
    let g3 = def.instantiate()?;
    let step = chain3(gpu, &add_one, [x, y, c])?;
    g3.update(&step)?;
    let [head, ..] = chain_nodes(&step)?;
    g3.set_enabled(&head, true)?;
    def.add_empty(&[])?;
    assert!(foreign_graph(g3.set_enabled(&head, true)));
    assert!(
        g3.set_enabled(&n0, true).is_ok(),
        "its own nodes still name the exec's"
    );

    // A node inside a child graph of the source is refused with its own reason; the child-graph
    // node itself is paired.
    let parent = |buf: &DeviceBuffer<i32>, v: i32| -> cuda_graph::Result<_> {
        let p = GraphDefinition::new(&gpu.device)?;
        let node = p.add_child_graph(&[], &memset_child(gpu, buf, v)?)?;
        Ok((p, node))
    };
    let (p1, _) = parent(a, 1)?;
    let g4 = p1.instantiate()?;
    let (p2, child) = parent(b, 2)?;
    g4.update(&p2)?;
    let view = p2.node_info(&child)?.graph;
    let inner = view.nodes()?[0];
    match g4.set_enabled(&inner, false) {
        Err(e) if e.refusal() == Some(Refusal::ForeignGraph) => {
            assert!(e.to_string().contains("child graph"), "{e}")
        }
        other => return Err(format!("a node inside the source's child graph: {other:?}").into()),
    }
    let before = read([a, b, c, y])?;
    g4.set_params(&child, NodeParams::child_graph(&memset_child(gpu, y, 7)?)?)?;
    launch(gpu, &g4)?;
    let after = read([a, b, c, y])?;
    assert_eq!(after, [before[0], before[1], before[2], 7]);
    Ok(())
}

/// An update from the graph the exec was instantiated from, after its chain was rearranged into
/// the same topology, pairs the graph's nodes by their new places: a node no longer stands where
/// the exec node made from it does, and the graph's nodes are refused. Before that update they
/// still name the exec nodes made from them.
fn per_node_updates_refuse_the_instantiation_graph_once_updated_from_it_rearranged(
    gpu: &Gpu,
) -> TestResult {
    let add_one = gpu.f("add_one");
    let bufs = counters(gpu, 4)?;
    let [a, b, c, x] = &bufs[..] else {
        unreachable!()
    };
    let (def, [n0, n1, n2]) = defined_chain3(gpu, &add_one, [a, b, c])?;
    let g = def.instantiate()?;
    // a -> b -> c becomes b -> a -> c: the same topology with the first two nodes swapped.
    def.remove_edge(&n0, &n1)?;
    def.remove_edge(&n1, &n2)?;
    def.add_edge(&n1, &n0)?;
    def.add_edge(&n0, &n2)?;
    // Not updated from it yet: the exec keeps the chain it was made with, n0 its head.
    g.set_params(&n0, kp(&add_one, args![a]))?;
    assert!(g.is_enabled(&n1)?);
    g.update(&def)?;
    // The exec's head, made from n0, now runs what n1 does (b): n0 no longer names it.
    assert!(
        foreign_graph(g.set_params(&n0, kp(&add_one, args![x]))),
        "a node of the rearranged instantiation graph after an update from it"
    );
    assert!(foreign_graph(g.set_enabled(&n1, false)));
    assert!(foreign_graph(g.is_enabled(&n2)));
    launch(gpu, &g)?;
    let read = |bs: [&DeviceBuffer<i32>; 4]| -> cuda_graph::Result<Vec<i32>> {
        bs.iter().map(|b| Ok(b.to_vec()?[0])).collect()
    };
    assert_eq!(read([a, b, c, x])?, [1, 1, 1, 0]);
    Ok(())
}

/// Two look-alike nodes (same type, no dependencies) that one node depends on are told apart
/// only by their place in its dependency list. The crate pairs them in the order the driver lists
/// them; the driver must have paired them so too: the node the crate disables is the one that
/// runs the named node's work. The source's list is made in the other order than the
/// instantiation graph's, once by adding the edges backwards and once by removing an edge and
/// adding it again.
fn per_node_updates_pair_look_alike_dependencies_as_the_driver_does(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    let bufs = counters(gpu, 5)?;
    let [a, b, c, x, y] = &bufs[..] else {
        unreachable!()
    };
    let read = |bs: [&DeviceBuffer<i32>; 2]| -> cuda_graph::Result<Vec<i32>> {
        bs.iter().map(|b| Ok(b.to_vec()?[0])).collect()
    };
    // Instantiated: add_one on a and on b, then on c after both (listed a, b).
    let def = GraphDefinition::new(&gpu.device)?;
    let on_a = k(&def, &[], &add_one, args![a])?;
    let on_b = k(&def, &[], &add_one, args![b])?;
    k(&def, &[&on_a, &on_b], &add_one, args![c])?;
    for readded in [false, true] {
        let g = def.instantiate()?;
        // The source: add_one on x and on y, then on c after both, with c's dependencies listed
        // y, x.
        let source = GraphDefinition::new(&gpu.device)?;
        let on_x = k(&source, &[], &add_one, args![x])?;
        let on_y = k(&source, &[], &add_one, args![y])?;
        if readded {
            let on_c = k(&source, &[&on_x, &on_y], &add_one, args![c])?;
            source.remove_edge(&on_x, &on_c)?;
            source.add_edge(&on_x, &on_c)?;
        } else {
            let on_c = k(&source, &[&on_y], &add_one, args![c])?;
            source.add_edge(&on_x, &on_c)?;
        }
        g.update(&source)?;
        g.set_enabled(&on_x, false)?;
        let before = read([x, y])?;
        launch(gpu, &g)?;
        let after = read([x, y])?;
        assert_eq!(
            [after[0] - before[0], after[1] - before[1]],
            [0, 1],
            "the node disabled through x's ran (edge re-added: {readded})"
        );
    }
    Ok(())
}

/// 2D and 3D copies of a pitched array: on a stream, captured, as a definition's node, and
/// through per-node updates of the definition and the exec; each copies exactly the region, and
/// a region that does not fit is refused before the driver.
fn region_copies_in_every_front_end(gpu: &Gpu) -> TestResult {
    // 3 planes of 4 rows of 16: element (z, y, x) holds z * 1000 + y * 100 + x.
    let host: Vec<i32> = (0..3 * 4 * 16)
        .map(|i| (i / 64) * 1000 + (i / 16 % 4) * 100 + i % 16)
        .collect();
    let src = gpu.device.htod(&host)?;
    let plane2d = Copy3d::rows(5, 3, 16, 5);
    let want2d: Vec<i32> = (0..3)
        .flat_map(|y| (0..5).map(move |x| y * 100 + x))
        .collect();
    let region3d = Copy3d {
        depth: 2,
        src_rows: 4,
        dst_rows: 3,
        ..plane2d
    };
    let want3d: Vec<i32> = (0..2)
        .flat_map(|z| (0..3).flat_map(move |y| (0..5).map(move |x| z * 1000 + y * 100 + x)))
        .collect();
    let s = gpu.stream();
    // A stream copy.
    let dst = gpu.device.alloc_zeroed::<i32>(15)?;
    s.memcpy_3d(&dst, &src, plane2d)?;
    s.synchronize()?;
    assert_eq!(dst.to_vec()?, want2d, "stream 2D");
    // A captured copy.
    let dst3 = gpu.device.alloc_zeroed::<i32>(30)?;
    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
    b.memcpy_3d(&dst3, &src, region3d)?;
    let g = b.end_building()?.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(dst3.to_vec()?, want3d, "captured 3D");
    // A definition's node, read back, then updated in the definition and in an exec.
    let def = GraphDefinition::new(&gpu.device)?;
    let a = gpu.device.alloc_zeroed::<i32>(30)?;
    let n = def.add_memcpy_3d(&[], &a, &src, plane2d)?;
    let info = def.node_info(&n)?;
    assert_eq!((info.width_bytes, info.height, info.depth), (20, 3, 1));
    let exec = def.instantiate()?;
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(&a.to_vec()?[..15], &want2d[..], "definition 2D");
    // An exec's memcpy node takes only 1D copies (the driver's rule): refused before it.
    let b2 = gpu.device.alloc_zeroed::<i32>(30)?;
    let e = exec
        .set_params(&n, NodeParams::memcpy_3d(&b2, &src, region3d)?)
        .expect_err("a 3D copy into an exec's memcpy node");
    assert_eq!(e.refusal(), Some(Refusal::Unsupported), "{e}");
    // The definition's node takes it, and an exec made from it runs it.
    def.set_params(&n, NodeParams::memcpy_3d(&b2, &src, region3d)?)?;
    assert_eq!(def.node_info(&n)?.depth, 2);
    def.instantiate()?.launch(&s)?;
    s.synchronize()?;
    assert_eq!(b2.to_vec()?, want3d, "definition updated to 3D");
    // Regions that do not fit: refused in every front end, nothing recorded or added.
    let small = gpu.device.alloc_zeroed::<i32>(14)?;
    let nodes = def.nodes()?.len();
    for r in [
        s.memcpy_3d(&small, &src, plane2d),
        def.add_memcpy_3d(&[], &small, &src, plane2d).map(|_| ()),
        NodeParams::memcpy_3d(&small, &src, plane2d).map(|_| ()),
        s.memcpy_3d(
            &dst,
            &src,
            Copy3d {
                src_pitch: 4,
                ..plane2d
            },
        ),
        s.memcpy_3d(
            &dst3,
            &src,
            Copy3d {
                depth: 4,
                ..region3d
            },
        ),
    ] {
        let e = r.expect_err("a region that does not fit");
        assert_eq!(e.refusal(), Some(Refusal::Size), "{e}");
    }
    assert_eq!(def.nodes()?.len(), nodes);
    Ok(())
}
