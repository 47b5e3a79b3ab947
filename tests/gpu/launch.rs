//! Launch attributes and programmatic dependent launch (feature `nvrtc`: the kernels are compiled
//! for the device): thread-block clusters, priorities and cooperative grids on stream launches,
//! captured launches and definition nodes, read back; dependent launches that overlap the kernel
//! before them; and the refusals of what the device cannot take.

use cuda_graph::prelude::*;
use cuda_graph::{DependentKernel, LaunchAttributes, NodeInfo, Refusal};

use crate::support::{Gpu, Needs, TestResult};

crate::gpu_tests! {
    "launch";
    Needs::Nvrtc =>
        attribute_values_the_device_cannot_take_are_refused;
    Needs::Hopper =>
        clusters_run_and_read_back_in_every_front_end,
        cooperative_grids_synchronise_as_a_whole,
        priorities_read_back_and_instantiate_with_node_priority,
        dependent_launches_overlap_the_kernel_before,
        programmatic_edges_stay_with_their_kernels,
        an_exec_keeps_its_attributes;
}

const SOURCE: &str = r#"
// out[block] = 100 * (rank in the cluster) + (blocks in the cluster).
extern "C" __global__ void cluster_rank(int* out) {
    unsigned rank, size;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    if (threadIdx.x == 0) out[blockIdx.x] = 100 * rank + size;
}

// Each block adds its number to `sum`, waits until every block has (a barrier that only a
// cooperative launch guarantees to end), then writes the total it sees.
extern "C" __global__ void grid_total(int* sum, unsigned* arrived, int* out) {
    if (threadIdx.x == 0) {
        atomicAdd(sum, (int)blockIdx.x);
        __threadfence();
        atomicAdd(arrived, 1u);
        while (atomicAdd(arrived, 0u) < gridDim.x) {}
        out[blockIdx.x] = atomicAdd(sum, 0);
    }
}

// The kernel before a dependent one: lets its dependents begin at once, then waits (up to about
// `limit` clock cycles) for `flag`, which only a dependent running at the same time can set.
// out[0] = 1 when it saw the flag, 2 when it gave up.
extern "C" __global__ void wait_for_flag(volatile int* flag, int* out, long long limit) {
    asm volatile("griddepcontrol.launch_dependents;");
    long long t0 = clock64();
    while (*flag == 0 && clock64() - t0 < limit) {}
    out[0] = *flag ? 1 : 2;
}

// The dependent: sets the flag before it waits (a deliberate handshake through a volatile
// flag), then waits for the kernel before it and reads what it wrote.
extern "C" __global__ void set_flag_then_wait(volatile int* flag, int* out) {
    *flag = 1;
    __threadfence_system();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    out[1] = out[0] + 10;
}

// p[0] += 1 after waiting for the kernel before (a dependent kernel that keeps its promise).
extern "C" __global__ void add_one_after_wait(int* p) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    p[0] += 1;
}

extern "C" __global__ void add_one(int* p) { p[0] += 1; }
"#;

struct Kernels {
    _module: Module,
    cluster_rank: Kernel<(*mut i32,)>,
    grid_total: Kernel<(*mut i32, *mut u32, *mut i32)>,
    wait_for_flag: Kernel<(*mut i32, *mut i32, i64)>,
    set_flag_then_wait: DependentKernel<(*mut i32, *mut i32)>,
    add_one_after_wait: DependentKernel<(*mut i32,)>,
    add_one: Kernel<(*mut i32,)>,
}

fn kernels(gpu: &Gpu) -> cuda_graph::Result<Kernels> {
    let module = gpu.device.compile(SOURCE)?;
    // SAFETY (each): the declarations are the kernels' parameter lists above; each kernel
    // touches only the elements the tests give it (out has one int per block, flag and p one,
    // out two for the handshake); the two dependent kernels wait (`griddepcontrol.wait`) before
    // their first access to what the kernel before them touches, but for the handshake's flag,
    // which both sides access through volatile loads and stores on purpose.
    unsafe {
        Ok(Kernels {
            cluster_rank: module.kernel("cluster_rank")?,
            grid_total: module.kernel("grid_total")?,
            wait_for_flag: module.kernel("wait_for_flag")?,
            set_flag_then_wait: module.kernel("set_flag_then_wait")?.dependent(),
            add_one_after_wait: module.kernel("add_one_after_wait")?.dependent(),
            add_one: module.kernel("add_one")?,
            _module: module,
        })
    }
}

fn grid(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
        ..LaunchConfig::single()
    }
}

fn refusal<T: std::fmt::Debug>(r: cuda_graph::Result<T>) -> Option<Refusal> {
    match r {
        Err(e) => {
            println!("    refused: {e}");
            e.refusal()
        }
        Ok(v) => {
            println!("    accepted: {v:?}");
            None
        }
    }
}

fn attribute_values_the_device_cannot_take_are_refused(gpu: &Gpu) -> TestResult {
    let module = gpu.device.compile(
        r#"extern "C" __global__ void add_one(int* p) { if (threadIdx.x == 0) p[blockIdx.x] += 1; }"#,
    )?;
    // SAFETY: add_one(int* p) writes p[block] for each block: 64 blocks at most below.
    let add_one: Kernel<(*mut i32,)> = unsafe { module.kernel("add_one")? };
    let buf = gpu.device.alloc_zeroed::<i32>(1 << 20)?;
    let s = gpu.stream();
    let hopper = gpu.device.compute_capability()? >= (9, 0);
    let (least, greatest) = gpu.device.stream_priority_range()?;
    println!("    priorities {greatest} (highest) ..= {least}");
    let bad = [
        (
            "cluster not dividing the grid",
            grid(6, 32).with_cluster((4, 1, 1)),
        ),
        ("cluster of 0", grid(4, 32).with_cluster((0, 1, 1))),
        (
            "cluster of 16 blocks",
            grid(16, 32).with_cluster((16, 1, 1)),
        ),
        (
            "priority above the highest",
            grid(1, 32).with_priority(greatest - 1),
        ),
        (
            "priority below the lowest",
            grid(1, 32).with_priority(least + 1),
        ),
        (
            "cooperative grid too large",
            grid(1 << 20, 1024).with_cooperative(true),
        ),
    ];
    let def = GraphDefinition::new(&gpu.device)?;
    for (what, cfg) in bad {
        println!("  {what}");
        let launched = refusal(s.launch(&add_one, cfg, &buf));
        assert_eq!(launched, Some(Refusal::Attribute), "{what}");
        let added = refusal(def.add_kernel(&[], &add_one, cfg, &buf));
        assert_eq!(added, Some(Refusal::Attribute), "{what}");
    }
    assert!(def.nodes()?.is_empty(), "a refused node was added");
    if !hopper {
        let r = refusal(s.launch(&add_one, grid(2, 32).with_cluster((2, 1, 1)), &buf));
        assert_eq!(r, Some(Refusal::Attribute));
    }
    // The stream and context stay usable: a plain launch and a valid priority work.
    s.launch(&add_one, grid(1, 32).with_priority(greatest), &buf)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?[0], 1);
    Ok(())
}

fn clusters_run_and_read_back_in_every_front_end(gpu: &Gpu) -> TestResult {
    let k = kernels(gpu)?;
    let cfg = grid(8, 32).with_cluster((4, 1, 1));
    let want: Vec<i32> = (0..8).map(|b| 100 * (b % 4) + 4).collect();
    let s = gpu.stream();
    // A stream launch.
    let out = gpu.device.alloc_zeroed::<i32>(8)?;
    s.launch(&k.cluster_rank, cfg, &out)?;
    s.synchronize()?;
    assert_eq!(out.to_vec()?, want, "stream launch");
    // A captured launch: the node carries the cluster.
    let out = gpu.device.alloc_zeroed::<i32>(8)?;
    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
    b.launch(&k.cluster_rank, cfg, &out)?;
    let ended = b.end_building()?;
    let def = ended.graph_definition()?;
    let node = def.nodes()?[0];
    match def.inspect(&node)? {
        NodeInfo::Kernel(_, info) => assert_eq!(info.config.attributes.cluster(), Some((4, 1, 1))),
        other => panic!("expected a kernel node, got {other:?}"),
    }
    let g = ended.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(out.to_vec()?, want, "captured launch");
    // A definition's node, and a per-node update of the definition to clusters of 2.
    let out = gpu.device.alloc_zeroed::<i32>(8)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let n = def.add_kernel(&[], &k.cluster_rank, cfg, &out)?;
    let info = def.node_info(&n)?;
    assert_eq!(info.config.attributes.cluster(), Some((4, 1, 1)));
    let g = def.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(out.to_vec()?, want, "definition node");
    let two = grid(8, 32).with_cluster((2, 1, 1));
    def.set_params(&n, NodeParams::kernel(&k.cluster_rank, two, &out)?)?;
    assert_eq!(
        def.node_info(&n)?.config.attributes.cluster(),
        Some((2, 1, 1))
    );
    let g = def.instantiate()?;
    g.launch(&s)?;
    s.synchronize()?;
    let want2: Vec<i32> = (0..8).map(|b| 100 * (b % 2) + 2).collect();
    assert_eq!(out.to_vec()?, want2, "definition node after set_params");
    Ok(())
}

/// A launch of `grid_total` on its three buffers, made one way or another.
type TotalLaunch<'a> = &'a dyn Fn(
    &DeviceBuffer<i32>,
    &DeviceBuffer<u32>,
    &DeviceBuffer<i32>,
) -> cuda_graph::Result<()>;

/// A grid this small would also stay resident without the attribute: the read-backs are what
/// show the attribute reached each front end; the barrier shows the launches run (a grid too
/// large to be resident is refused, `attribute_values_the_device_cannot_take_are_refused`).
fn cooperative_grids_synchronise_as_a_whole(gpu: &Gpu) -> TestResult {
    let k = kernels(gpu)?;
    let sms = 16u32;
    let blocks = sms * 2;
    let cfg = grid(blocks, 64).with_cooperative(true);
    let total: i32 = (0..blocks as i32).sum();
    let s = gpu.stream();
    let run = |how: &str, launch: TotalLaunch<'_>| -> TestResult {
        let (sum, arrived, out) = (
            gpu.device.alloc_zeroed::<i32>(1)?,
            gpu.device.alloc_zeroed::<u32>(1)?,
            gpu.device.alloc_zeroed::<i32>(blocks as usize)?,
        );
        launch(&sum, &arrived, &out)?;
        s.synchronize()?;
        assert_eq!(out.to_vec()?, vec![total; blocks as usize], "{how}");
        Ok(())
    };
    run("stream", &|sum, arrived, out| {
        s.launch(&k.grid_total, cfg, (sum, arrived, out))
    })?;
    run("captured", &|sum, arrived, out| {
        let b = s.create_graph_builder().begin_building(ThreadLocal)?;
        b.launch(&k.grid_total, cfg, (sum, arrived, out))?;
        let ended = b.end_building()?;
        let def = ended.graph_definition()?;
        let node = def.nodes()?[0];
        match def.inspect(&node)? {
            NodeInfo::Kernel(_, info) => {
                assert!(
                    info.config.attributes.cooperative(),
                    "captured node not cooperative"
                )
            }
            other => panic!("expected a kernel node, got {other:?}"),
        }
        ended.instantiate()?.launch(&s)
    })?;
    run("definition", &|sum, arrived, out| {
        let def = GraphDefinition::new(&gpu.device)?;
        let n = def.add_kernel(&[], &k.grid_total, cfg, (sum, arrived, out))?;
        assert!(def.node_info(&n)?.config.attributes.cooperative());
        def.instantiate()?.launch(&s)
    })?;
    Ok(())
}

fn priorities_read_back_and_instantiate_with_node_priority(gpu: &Gpu) -> TestResult {
    let k = kernels(gpu)?;
    let (_least, greatest) = gpu.device.stream_priority_range()?;
    let p = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let a = def.add_kernel(&[], &k.add_one, grid(1, 1).with_priority(greatest), &p)?;
    let b = def.add_kernel(&[&a], &k.add_one, grid(1, 1), &p)?;
    assert_eq!(
        def.node_info(&a)?.config.attributes.priority(),
        Some(greatest)
    );
    assert_eq!(
        def.node_info(&b)?.config.attributes,
        LaunchAttributes::default()
    );
    let s = gpu.stream();
    for options in [
        InstantiateOptions::new(),
        InstantiateOptions::new().use_node_priority(true),
    ] {
        def.instantiate_with(&options)?.launch(&s)?;
    }
    s.synchronize()?;
    assert_eq!(p.to_vec()?, [4]);
    Ok(())
}

fn dependent_launches_overlap_the_kernel_before(gpu: &Gpu) -> TestResult {
    let k = kernels(gpu)?;
    // About 0.2 s at the GPU's clock: long enough for a dependent to begin, short enough that a
    // serialised pair ends.
    let limit: i64 = 400_000_000;
    let s = gpu.stream();
    let check = |how: &str,
                 flag: &DeviceBuffer<i32>,
                 out: &DeviceBuffer<i32>,
                 overlap: bool|
     -> TestResult {
        s.synchronize()?;
        let got = out.to_vec()?;
        println!("    {how}: out = {got:?}");
        let first = if overlap { 1 } else { 2 };
        assert_eq!(got, [first, first + 10], "{how}");
        let _ = flag;
        Ok(())
    };
    let fresh = || -> cuda_graph::Result<(DeviceBuffer<i32>, DeviceBuffer<i32>)> {
        Ok((
            gpu.device.alloc_zeroed::<i32>(1)?,
            gpu.device.alloc_zeroed::<i32>(2)?,
        ))
    };
    // Stream launches: the dependent begins while the kernel before waits for it.
    let (flag, out) = fresh()?;
    s.launch(&k.wait_for_flag, grid(1, 1), (&flag, &out, limit))?;
    s.launch_dependent(&k.set_flag_then_wait, grid(1, 1), (&flag, &out))?;
    check("stream, dependent", &flag, &out, true)?;
    // The same kernel launched plainly waits for the end: the first gives up.
    let (flag, out) = fresh()?;
    s.launch(&k.wait_for_flag, grid(1, 1), (&flag, &out, limit))?;
    s.launch(k.set_flag_then_wait.kernel(), grid(1, 1), (&flag, &out))?;
    check("stream, plain", &flag, &out, false)?;
    // Captured: the edge is programmatic, and read back as such.
    let (flag, out) = fresh()?;
    let b = s.create_graph_builder().begin_building(ThreadLocal)?;
    b.launch(&k.wait_for_flag, grid(1, 1), (&flag, &out, limit))?;
    b.launch_dependent(&k.set_flag_then_wait, grid(1, 1), (&flag, &out))?;
    let ended = b.end_building()?;
    let def = ended.graph_definition()?;
    let dependent = def
        .nodes()?
        .into_iter()
        .filter(|n| match def.inspect(n) {
            Ok(NodeInfo::Kernel(_, info)) => info.dependent,
            _ => false,
        })
        .count();
    assert_eq!(dependent, 1, "one node follows its kernel programmatically");
    ended.instantiate()?.launch(&s)?;
    check("captured, dependent", &flag, &out, true)?;
    // A definition's programmatic edge.
    let (flag, out) = fresh()?;
    let def = GraphDefinition::new(&gpu.device)?;
    let a = def.add_kernel(&[], &k.wait_for_flag, grid(1, 1), (&flag, &out, limit))?;
    let b = def.add_dependent_kernel(&[&a], &k.set_flag_then_wait, grid(1, 1), (&flag, &out))?;
    assert!(def.node_info(&b)?.dependent);
    assert!(
        !def.node_info(&b)?.config.attributes.is_dependent(),
        "the flag stays out of the configuration"
    );
    assert!(!def.node_info(&a)?.dependent);
    def.instantiate()?.launch(&s)?;
    check("definition, dependent", &flag, &out, true)?;
    // A programmatic edge from a node that is not a kernel is refused, and nothing is added.
    let e = def.add_empty(&[])?;
    let before = def.nodes()?.len();
    let r =
        refusal(def.add_dependent_kernel(&[&e], &k.set_flag_then_wait, grid(1, 1), (&flag, &out)));
    assert_eq!(r, Some(Refusal::Attribute));
    assert_eq!(def.nodes()?.len(), before);
    Ok(())
}

fn programmatic_edges_stay_with_their_kernels(gpu: &Gpu) -> TestResult {
    let k = kernels(gpu)?;
    let p = gpu.device.alloc_zeroed::<i32>(1)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let a = def.add_kernel(&[], &k.add_one, grid(1, 1), &p)?;
    let b = def.add_dependent_kernel(&[&a], &k.add_one_after_wait, grid(1, 1), &p)?;
    let exec = def.instantiate()?;
    // The dependent node takes only a dependent kernel's parameters, in the definition and in
    // the exec; the kernel before it may change freely.
    let plain = NodeParams::kernel(&k.add_one, grid(1, 1), &p)?;
    assert_eq!(refusal(def.set_params(&b, plain)), Some(Refusal::Attribute));
    let plain = NodeParams::kernel(&k.add_one, grid(1, 1), &p)?;
    assert_eq!(
        refusal(exec.set_params(&b, plain)),
        Some(Refusal::Attribute)
    );
    exec.set_params(
        &b,
        NodeParams::dependent_kernel(&k.add_one_after_wait, grid(1, 1), &p)?,
    )?;
    def.set_params(&a, NodeParams::kernel(&k.add_one, grid(1, 1), &p)?)?;
    // The edge is not removed while both nodes live, nor is the kernel before it destroyed.
    assert_eq!(refusal(def.remove_edge(&a, &b)), Some(Refusal::Attribute));
    assert_eq!(refusal(def.destroy_node(a)), Some(Refusal::Attribute));
    // Whole-graph updates of an exec with programmatic edges are refused (the driver does not
    // compare edge kinds); a GraphCache instantiates instead.
    match exec.update(&def) {
        Err(cuda_graph::Error::Update { reason, .. }) => {
            assert_eq!(reason, cuda_graph::UpdateFailure::Programmatic)
        }
        other => panic!("expected a Programmatic update refusal, got {other:?}"),
    }
    let mut cache = GraphCache::new(InstantiateOptions::default());
    cache.refresh(&def)?;
    assert!(matches!(
        cache.refresh(&def)?,
        CacheOutcome::Instantiated {
            refused: Some(cuda_graph::UpdateFailure::Programmatic)
        }
    ));
    // Edges read back with their data: the queries work on a graph with programmatic edges.
    assert_eq!(def.edges()?.len(), 1);
    // A copy keeps the rule: its nodes are checked too.
    let copy = def.try_clone()?;
    let copied = copy.nodes()?;
    let dependent = copied
        .iter()
        .find(|n| matches!(copy.inspect(n), Ok(NodeInfo::Kernel(_, i)) if i.dependent))
        .copied()
        .ok_or("the copy lost its programmatic edge")?;
    let plain = NodeParams::kernel(&k.add_one, grid(1, 1), &p)?;
    let dep_kernel = copy.kernel_node(&dependent)?;
    assert_eq!(
        refusal(copy.set_params(&dep_kernel, plain)),
        Some(Refusal::Attribute)
    );
    // Destroying the dependent node itself is fine, and then the one before it too.
    def.destroy_node(b)?;
    def.destroy_node(a)?;
    let s = gpu.stream();
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(p.to_vec()?, [2]);
    Ok(())
}

fn an_exec_keeps_its_attributes(gpu: &Gpu) -> TestResult {
    let k = kernels(gpu)?;
    let out = gpu.device.alloc_zeroed::<i32>(8)?;
    let def = GraphDefinition::new(&gpu.device)?;
    let cfg = grid(8, 32).with_cluster((4, 1, 1));
    let n = def.add_kernel(&[], &k.cluster_rank, cfg, &out)?;
    let exec = def.instantiate()?;
    // An exec's node takes new arguments without attributes (keeping its own), and refuses
    // attributes, which the driver cannot change per node.
    let other = gpu.device.alloc_zeroed::<i32>(8)?;
    let plain = NodeParams::kernel(&k.cluster_rank, grid(8, 32), &other)?;
    exec.set_params(&n, plain)?;
    // The node's own attributes are taken (nothing changes); others are refused.
    exec.set_params(&n, NodeParams::kernel(&k.cluster_rank, cfg, &other)?)?;
    let two = grid(8, 32).with_cluster((2, 1, 1));
    let with = NodeParams::kernel(&k.cluster_rank, two, &other)?;
    assert_eq!(refusal(exec.set_params(&n, with)), Some(Refusal::Attribute));
    let s = gpu.stream();
    exec.launch(&s)?;
    s.synchronize()?;
    let want: Vec<i32> = (0..8).map(|b| 100 * (b % 4) + 4).collect();
    assert_eq!(other.to_vec()?, want, "the exec kept its clusters of 4");
    assert_eq!(out.to_vec()?, vec![0; 8]);
    Ok(())
}
