//! The library's overhead: each graph operation through the crate beside the same work through raw
//! driver calls (`cudarc::driver::sys`), in one process, interleaved, for graphs of n = 10, 100,
//! 1000 and 10 000 nodes.
//!
//! ```text
//! cargo bench --bench overhead                       # the whole table (about a minute on an H200)
//! cargo bench --bench overhead -- capture/Global     # only rows whose name contains the text
//! OVERHEAD_REPS=200 cargo bench --bench overhead     # fewer rounds: quicker, noisier
//! OVERHEAD_ALLOC=1 cargo bench --bench overhead      # also Rust heap allocations per node
//! BENCH=1 bash gpu-bundle/run-all.sh                 # from the GPU bundle (runs it with --bench)
//! gpu-bundle/bench-overhead --bench                  # the bundled binary alone
//! ```
//!
//! Without `--bench` (as `cargo test --benches` runs it) it only checks that every case works once
//! at the smallest n on each side. Without a CUDA driver or GPU (`Device::new(0)` fails) it prints
//! one line saying it is skipped and exits with status 0. Exit status 1: a case failed (the line
//! says which side and why) or the setup failed.
//!
//! # Cases
//!
//! Every case does the same driver work on both sides; the library side is what a user writes.
//!
//! | case | library | raw driver calls |
//! | --- | --- | --- |
//! | `capture/Global`, `/ThreadLocal`, `/Relaxed` | `stream.create_graph_builder().begin_building(M)` on an existing stream, n × `launch(empty_kernel)`, `end_building()`, drop | `cuStreamBeginCapture_v2(M)` (the fastest raw path: the driver makes the graph), n × `cuLaunchKernel`, `cuStreamEndCapture`, `cuGraphDestroy` |
//! | `capture+buf/Global` | the same with `add_one(int*)`, `&KernelArgs::new().arg(&buf)` per launch (one buffer for all) | the same with a one-entry `kernelParams` array |
//! | `capture+typed/Global` | the same through the typed kernel: `launch(&add_one, config, &buf)`, the buffer borrowed (no `KernelArgs`) | as `capture+buf` |
//! | `floor:capture/Global` | not the library: the raw calls of `capture/Global` with what [`Floor`] adds to each launch (a lock taken and released, the thread's bound-context note and the last kept module compared) | as `capture/Global` |
//! | `paths:capture/Global`, `/ThreadLocal`, `/Relaxed` | not the library: the raw calls of `capture/M` into a graph made first (`cuGraphCreate` + `cuStreamBeginCaptureToGraph`, the library's path for every capture) | as `capture/M`: what a graph made beforehand costs the driver |
//! | `instantiate` | `ended.instantiate()` of a captured n-node graph, drop the `Graph` | `cuGraphInstantiateWithParams`, `cuGraphExecDestroy` |
//! | `replay` | `graph.launch(&stream)`, `stream.synchronize()` (n-node exec) | `cuGraphLaunch`, `cuStreamSynchronize` |
//! | `update` | `graph.update(&other)`, alternately from two ended builders of n `add_one` launches on two buffers (same topology) | `cuGraphExecUpdate_v2`, alternately from two graphs |
//! | `explicit` | `GraphDefinition::new`, n × `add_kernel(&[&previous], empty_kernel)` (a chain), drop | `cuGraphCreate`, n × `cuGraphAddKernelNode_v2` (a chain), `cuGraphDestroy` |
//! | `floor:explicit` | not the library: the raw calls of `explicit` with what [`Floor`] adds to each node (`cuCtxGetCurrent`, a lock taken and released, the dependency's record read, a 32-byte record pushed) | as `explicit` |
//! | `stream-launch` | n × `stream.launch(empty_kernel)`, `stream.synchronize()` | n × `cuLaunchKernel`, `cuStreamSynchronize` |
//!
//! Each side has its own stream, module and buffers (the raw side retains the same primary
//! context and loads the same fatbin); the graphs that `instantiate`, `replay` and `update` use
//! are built once per row, outside the timings. The raw side makes its context current once per
//! sample, outside the timing; the library binds it on each call, as it always does (that is part
//! of its cost).
//!
//! # How it measures
//!
//! One row is one (case, n). After a few warm-up rounds, it runs rounds of one library sample and
//! one raw sample, alternating which goes first, and times each sample with `Instant`. A sample is
//! the whole operation over n nodes (for `capture`: begin, n launches, end, destroy). Rounds per
//! row: `OVERHEAD_REPS` (default 1000) for n ≤ 100, a fifth of it for n ≤ 1000, a thirtieth
//! above (at least 5); a row stops early after `OVERHEAD_ROW_SECS` (default 4 s) once it has 5
//! rounds, and says so. The default run takes about a minute, at most about 3 minutes.
//!
//! # How to read it
//!
//! ```text
//! capture/Global/1000        lib     1.021 µs/node  raw     0.990 µs/node  ratio  1.03  (+0.031 µs/node; per-round ratios 0.98–1.08 middle half; 200 rounds)
//! ```
//!
//! - `lib`, `raw`: the median sample divided by n, in µs per node;
//! - `ratio`: median lib ÷ median raw. 1.00: the library adds nothing measurable; 1.20: it takes
//!   20 % longer than the raw calls for the same work;
//! - `+x µs/node`: lib − raw per node, the library's own cost per node (locks, keep-set inserts,
//!   argument storage, context binds, its checks);
//! - `per-round ratios`: the middle half (first to third quartile) of lib ÷ raw within each
//!   round; a wide range means a noisy machine, not a verdict.
//!
//! The `floor:` rows measure the least that any wrapper with the library's guarantees (thread-safe
//! graphs, what each node uses released with it, no crash when other code left no context
//! current) adds to the same raw calls; their ratio is that floor's, and the summary's last table
//! divides the library's ratio by it (`capture/Global` ÷ `floor:capture/Global`, `explicit` ÷
//! `floor:explicit`): what the library adds beyond the floor.
//!
//! `replay` and `stream-launch` include the GPU running the kernels and the synchronisation, so
//! their ratios sit near 1 unless the library's per-call cost is large. After the rows come two
//! tables, ratio and extra µs per node, one line per case and one column per n.
//!
//! With `OVERHEAD_ALLOC=1` a last section counts Rust heap allocations per node (all threads,
//! through a counting `#[global_allocator]`; the driver's own mallocs are not seen, so the raw
//! side shows 0): the fewest over 3 samples after 2 warm-up samples, for every case.
//!
//! # Settings (environment)
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `OVERHEAD_REPS` | 1000 | rounds per row for n ≤ 100 (scaled down for larger n, see above) |
//! | `OVERHEAD_ROW_SECS` | 4 | time limit per row, in seconds |
//! | `OVERHEAD_SIZES` | `10,100,1000,10000` | the n to measure, comma-separated |
//! | `OVERHEAD_ALLOC` | off | `1`: also count allocations per node |
//! | `OVERHEAD_CRITERION` | off | `1`: instead of the paired table, each side as its own criterion benchmark (`iter_custom` over the same samples; not interleaved, but with criterion's statistics and baselines) |
//!
//! The first argument that is not a flag filters rows by name (`capture`, `update/1000`, ...).

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_void, CStr};
use std::io::Write;
use std::process::ExitCode;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use cuda_graph::prelude::*;
use cuda_graph::{driver_version, CaptureMode, DriverVersion};
use cudarc::driver::sys;

/// Test kernels shipped with the crate (see tests/kernels/README.md): `empty_kernel()` does
/// nothing, `add_one(int* p)` does `p[0] += 1`.
const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");
const SIZES: [usize; 4] = [10, 100, 1000, 10_000];
const DEFAULT_REPS: usize = 1000;
const DEFAULT_ROW_SECS: f64 = 4.0;
/// A row never stops early with fewer rounds than this.
const MIN_ROUNDS: usize = 5;

// ---------------------------------------------------------------------------------------------
// Counting allocations (OVERHEAD_ALLOC=1). Off, the cost is one relaxed load per allocation.

/// The system allocator, counting allocations while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

#[inline]
fn note_alloc(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        ALLOC_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the same arguments, so `System`'s guarantees
// hold; the counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc(new_size);
        // SAFETY: forwarded as is; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`, counting the allocations (and bytes allocated) of all threads meanwhile.
fn count_allocs<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    ALLOCS.store(0, Ordering::SeqCst);
    ALLOC_BYTES.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r = f();
    COUNTING.store(false, Ordering::SeqCst);
    (
        r,
        ALLOCS.load(Ordering::SeqCst),
        ALLOC_BYTES.load(Ordering::SeqCst),
    )
}

// ---------------------------------------------------------------------------------------------
// Settings.

struct Options {
    /// Invoked with `--bench` (else: one smoke sample per case).
    bench: bool,
    filter: Option<String>,
    reps: usize,
    row_budget: Duration,
    sizes: Vec<usize>,
    alloc: bool,
    criterion: bool,
    /// Settings that were ignored, and why; printed once a device is open.
    notes: Vec<String>,
}

fn env_flag(name: &str) -> bool {
    matches!(
        std::env::var(name).as_deref().map(str::trim),
        Ok("1") | Ok("true") | Ok("yes") | Ok("on")
    )
}

fn options() -> Options {
    let mut notes = Vec::new();
    let mut bench = false;
    let mut filter = None;
    for a in std::env::args().skip(1) {
        if a == "--bench" {
            bench = true;
        } else if a.starts_with('-') {
            notes.push(format!("ignoring the argument `{a}`"));
        } else if filter.is_none() {
            filter = Some(a);
        } else {
            notes.push(format!("ignoring the extra filter `{a}`"));
        }
    }
    let reps = match std::env::var("OVERHEAD_REPS") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                notes.push(format!(
                    "OVERHEAD_REPS=`{v}` is not a positive integer; using {DEFAULT_REPS}"
                ));
                DEFAULT_REPS
            }
        },
        Err(_) => DEFAULT_REPS,
    };
    let row_secs = match std::env::var("OVERHEAD_ROW_SECS") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => s,
            _ => {
                notes.push(format!(
                    "OVERHEAD_ROW_SECS=`{v}` is not a positive number; using {DEFAULT_ROW_SECS}"
                ));
                DEFAULT_ROW_SECS
            }
        },
        Err(_) => DEFAULT_ROW_SECS,
    };
    let sizes = match std::env::var("OVERHEAD_SIZES") {
        Ok(v) => {
            let parsed: Option<Vec<usize>> = v
                .split(',')
                .map(|s| s.trim().parse::<usize>().ok().filter(|&n| n > 0))
                .collect();
            match parsed {
                Some(s) if !s.is_empty() => s,
                _ => {
                    notes.push(format!(
                        "OVERHEAD_SIZES=`{v}` is not a comma-separated list of positive integers; using {SIZES:?}"
                    ));
                    SIZES.to_vec()
                }
            }
        }
        Err(_) => SIZES.to_vec(),
    };
    Options {
        bench,
        filter,
        reps,
        row_budget: Duration::from_secs_f64(row_secs),
        sizes,
        alloc: env_flag("OVERHEAD_ALLOC"),
        criterion: env_flag("OVERHEAD_CRITERION"),
        notes,
    }
}

/// Rounds for a row of `n` nodes.
fn rounds_for(reps: usize, n: usize) -> usize {
    let r = if n <= 100 {
        reps
    } else if n <= 1000 {
        reps / 5
    } else {
        reps / 30
    };
    r.max(MIN_ROUNDS)
}

// ---------------------------------------------------------------------------------------------
// Cases.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Global,
    ThreadLocal,
    Relaxed,
}

impl Mode {
    fn raw(self) -> sys::CUstreamCaptureMode {
        use sys::CUstreamCaptureMode as M;
        match self {
            Mode::Global => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
            Mode::ThreadLocal => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            Mode::Relaxed => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Capture(Mode),
    CaptureBuffer,
    CaptureTyped,
    /// Raw captured launches plus the least a safe wrapper adds (see [`Floor`]).
    FloorCapture,
    /// Two raw capture paths: into a graph made first (the library's) against the driver's own.
    PathCapture(Mode),
    Instantiate,
    Replay,
    Update,
    Explicit,
    /// Raw explicit nodes plus the least a safe wrapper adds (see [`Floor`]).
    FloorExplicit,
    StreamLaunch,
}

const CASES: [Case; 15] = [
    Case::Capture(Mode::Global),
    Case::Capture(Mode::ThreadLocal),
    Case::Capture(Mode::Relaxed),
    Case::CaptureBuffer,
    Case::CaptureTyped,
    Case::FloorCapture,
    Case::PathCapture(Mode::Global),
    Case::PathCapture(Mode::ThreadLocal),
    Case::PathCapture(Mode::Relaxed),
    Case::Instantiate,
    Case::Replay,
    Case::Update,
    Case::Explicit,
    Case::FloorExplicit,
    Case::StreamLaunch,
];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Capture(Mode::Global) => "capture/Global",
            Case::Capture(Mode::ThreadLocal) => "capture/ThreadLocal",
            Case::Capture(Mode::Relaxed) => "capture/Relaxed",
            Case::CaptureBuffer => "capture+buf/Global",
            Case::CaptureTyped => "capture+typed/Global",
            Case::FloorCapture => "floor:capture/Global",
            Case::PathCapture(Mode::Global) => "paths:capture/Global",
            Case::PathCapture(Mode::ThreadLocal) => "paths:capture/ThreadLocal",
            Case::PathCapture(Mode::Relaxed) => "paths:capture/Relaxed",
            Case::Instantiate => "instantiate",
            Case::Replay => "replay",
            Case::Update => "update",
            Case::Explicit => "explicit",
            Case::FloorExplicit => "floor:explicit",
            Case::StreamLaunch => "stream-launch",
        }
    }

    /// Whether the case (or its setup) captures a stream.
    fn captures(self) -> bool {
        !matches!(
            self,
            Case::Explicit | Case::FloorExplicit | Case::StreamLaunch
        )
    }
}

fn row_name(case: Case, n: usize) -> String {
    format!("{}/{n}", case.name())
}

// ---------------------------------------------------------------------------------------------
// The library side.

struct Lib {
    device: Device,
    stream: Stream,
    empty: Function,
    add_one: Function,
    add_one_typed: Kernel<(*mut i32,)>,
    buf_a: DeviceBuffer<i32>,
    buf_b: DeviceBuffer<i32>,
}

/// What each captured launch runs.
#[derive(Clone, Copy)]
enum Work<'a> {
    Empty,
    AddOne(&'a DeviceBuffer<i32>),
    /// `add_one` through its typed kernel: the buffer is borrowed, no `KernelArgs` is built.
    Typed(&'a DeviceBuffer<i32>),
}

impl Lib {
    fn new(device: Device) -> cuda_graph::Result<Lib> {
        // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
        let module = unsafe { device.load_module(KERNELS)? };
        Ok(Lib {
            stream: device.create_stream()?,
            empty: module.function("empty_kernel")?,
            add_one: module.function("add_one")?,
            // SAFETY: add_one(int* p) writes p[0]; every buffer given holds one int.
            add_one_typed: unsafe { module.kernel::<(*mut i32,)>("add_one")? },
            buf_a: device.alloc_zeroed::<i32>(1)?,
            buf_b: device.alloc_zeroed::<i32>(1)?,
            device,
        })
    }

    fn capture(
        &self,
        mode: Mode,
        n: usize,
        work: Work<'_>,
    ) -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
        match mode {
            Mode::Global => self.capture_in(Global, n, work),
            Mode::ThreadLocal => self.capture_in(ThreadLocal, n, work),
            Mode::Relaxed => self.capture_in(Relaxed, n, work),
        }
    }

    /// Captures n launches on the long-lived stream.
    fn capture_in<M: CaptureMode>(
        &self,
        mode: M,
        n: usize,
        work: Work<'_>,
    ) -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
        let b = self.stream.create_graph_builder().begin_building(mode)?;
        for _ in 0..n {
            match work {
                // SAFETY: empty_kernel takes no arguments.
                Work::Empty => unsafe {
                    b.launch_unchecked(&self.empty, LaunchConfig::single(), &KernelArgs::new())?
                },
                // SAFETY: add_one takes one int* and writes p[0]; the buffer holds one int.
                Work::AddOne(buf) => unsafe {
                    b.launch_unchecked(
                        &self.add_one,
                        LaunchConfig::single(),
                        &KernelArgs::new().arg(buf),
                    )?
                },
                Work::Typed(buf) => b.launch(&self.add_one_typed, LaunchConfig::single(), buf)?,
            }
        }
        b.end_building()
    }

    /// A chain of n `empty_kernel` nodes, each after the previous one; dropped at the end.
    fn explicit_chain(&self, n: usize) -> cuda_graph::Result<()> {
        let def = GraphDefinition::new(&self.device)?;
        let mut prev: Option<GraphNode> = None;
        for _ in 0..n {
            let deps: &[&GraphNode] = match &prev {
                Some(p) => &[p],
                None => &[],
            };
            // SAFETY: empty_kernel takes no arguments.
            let node = unsafe {
                def.add_kernel_unchecked(
                    deps,
                    &self.empty,
                    LaunchConfig::single(),
                    &KernelArgs::new(),
                )?
            };
            prev = Some(node.node());
        }
        drop(def);
        Ok(())
    }

    fn stream_launches(&self, n: usize) -> cuda_graph::Result<()> {
        for _ in 0..n {
            // SAFETY: empty_kernel takes no arguments.
            unsafe {
                self.stream.launch_unchecked(
                    &self.empty,
                    LaunchConfig::single(),
                    &KernelArgs::new(),
                )?
            };
        }
        self.stream.synchronize()
    }
}

// ---------------------------------------------------------------------------------------------
// The raw side (the patterns of examples/soak.rs).

#[path = "support/raw.rs"]
mod raw;
use raw::{has_symbol, ok, require_symbols};

/// Every entry point the raw side calls, checked before the first call (cudarc panics on a
/// missing symbol), except the capture one, checked on its own (see `capture_unavailable`).
const RAW_SYMBOLS: &[&str] = &[
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamEndCapture",
    "cuStreamBeginCapture_v2",
    "cuLaunchKernel",
    "cuGraphCreate",
    "cuGraphDestroy",
    "cuGraphAddKernelNode_v2",
    "cuGraphInstantiateWithParams",
    "cuGraphExecDestroy",
    "cuGraphLaunch",
    "cuGraphExecUpdate_v2",
];
const CAPTURE_SYMBOL: &str = "cuStreamBeginCaptureToGraph";

/// A raw graph, destroyed on drop.
struct RawGraph(sys::CUgraph);

impl RawGraph {
    fn create() -> Result<RawGraph, String> {
        let mut g = null_mut();
        // SAFETY: the context is current; `g` is a valid out pointer.
        ok("cuGraphCreate", unsafe { sys::cuGraphCreate(&mut g, 0) })?;
        Ok(RawGraph(g))
    }

    /// Destroys the graph, checking the result.
    fn destroy(self) -> Result<(), String> {
        let g = self.0;
        std::mem::forget(self);
        // SAFETY: `g` is a live graph of ours, destroyed once (the guard is forgotten).
        ok("cuGraphDestroy", unsafe { sys::cuGraphDestroy(g) })
    }
}

impl Drop for RawGraph {
    fn drop(&mut self) {
        // SAFETY: a live graph of ours, destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(self.0) };
    }
}

/// A raw exec, destroyed on drop.
struct RawExec(sys::CUgraphExec);

impl RawExec {
    fn destroy(self) -> Result<(), String> {
        let e = self.0;
        std::mem::forget(self);
        // SAFETY: `e` is a live exec of ours with no launch pending, destroyed once.
        ok("cuGraphExecDestroy", unsafe { sys::cuGraphExecDestroy(e) })
    }
}

impl Drop for RawExec {
    fn drop(&mut self) {
        // SAFETY: a live exec of ours, destroyed once; the driver waits for pending launches.
        let _ = unsafe { sys::cuGraphExecDestroy(self.0) };
    }
}

thread_local! {
    /// The context [`Floor::bind_noted`] last made current on this thread.
    static NOTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The least that any wrapper with the library's guarantees adds to each raw call, for the
/// `floor:` rows (their first column is the raw calls with this added):
///
/// - a lock around each mutation of a graph (CUDA graph objects are not thread-safe, and a
///   definition or builder can be shared by threads): one compare-and-swap to take, a store to
///   release;
/// - a captured launch: the thread's note of the bound context compared (binding it is also what
///   refuses a host callback's thread), and the launch's module compared with the one kept last
///   (a capture's keep set when nothing new is kept);
/// - an explicit kernel node: the current context asked of the driver (`cuCtxGetCurrent`; the
///   driver crashes adding a kernel node with none current, see DESIGN, "Which calls need a
///   current context"), its dependency's record read, and a 32-byte record per node (what a
///   node uses, released with the node).
///
/// Single-threaded here, so the lock never waits; its cost is the atomic operations.
struct Floor {
    locked: AtomicBool,
    /// The module kept last.
    recent: std::cell::Cell<usize>,
    /// One record per node, read and written only while `locked` is held.
    slots: std::cell::UnsafeCell<Vec<[usize; 4]>>,
}

impl Floor {
    fn new() -> Floor {
        Floor {
            locked: AtomicBool::new(false),
            recent: std::cell::Cell::new(0),
            slots: std::cell::UnsafeCell::new(Vec::new()),
        }
    }

    #[inline]
    fn lock(&self) {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    #[inline]
    fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// Binds `ctx` unless this thread's note says it is bound.
    #[inline]
    fn bind_noted(&self, ctx: sys::CUcontext) -> Result<(), String> {
        if NOTED.with(|n| n.get()) != ctx as usize {
            // SAFETY: `ctx` is the raw side's retained primary context.
            ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
            NOTED.with(|n| n.set(ctx as usize));
        }
        Ok(())
    }

    /// Binds `ctx` unless the driver says it is current.
    #[inline]
    fn bind_checked(&self, ctx: sys::CUcontext) -> Result<(), String> {
        let mut current = null_mut();
        // SAFETY: `current` is a valid out pointer.
        ok("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current != ctx {
            // SAFETY: `ctx` is the raw side's retained primary context.
            ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
        }
        Ok(())
    }

    /// Keeps `owner` unless it was kept last.
    #[inline]
    fn keep(&self, owner: usize) {
        if self.recent.get() != owner {
            self.recent.set(std::hint::black_box(owner));
        }
    }

    /// Whether record `i` names `node` (call with the lock held).
    #[inline]
    fn slot_names(&self, i: usize, node: sys::CUgraphNode) -> bool {
        // SAFETY: the lock is held, so nothing else reads or writes the records.
        let slots = unsafe { &*self.slots.get() };
        slots.get(i).is_some_and(|s| s[0] == node as usize)
    }

    /// Appends a node's record (call with the lock held).
    #[inline]
    fn record(&self, slot: [usize; 4]) {
        // SAFETY: as in `slot_names`.
        unsafe { (*self.slots.get()).push(slot) };
    }
}

/// What each raw captured launch runs.
#[derive(Clone, Copy)]
enum RawWork {
    Empty,
    AddOne(sys::CUdeviceptr),
}

/// The raw side's long-lived objects: the primary context (shared with the library), its own
/// module, two one-int buffers and a stream.
struct Raw {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    empty: sys::CUfunction,
    add_one: sys::CUfunction,
    buf_a: sys::CUdeviceptr,
    buf_b: sys::CUdeviceptr,
    stream: sys::CUstream,
}

impl Raw {
    fn new() -> Result<Raw, String> {
        require_symbols(RAW_SYMBOLS)?;
        let (dev, ctx) = raw::retain_primary(0)?;
        let mut raw = Raw {
            dev,
            ctx,
            module: null_mut(),
            empty: null_mut(),
            add_one: null_mut(),
            buf_a: 0,
            buf_b: 0,
            stream: null_mut(),
        };
        raw.bind()?;
        raw.module = raw::load_module(KERNELS)?;
        raw.empty = raw.function(c"empty_kernel")?;
        raw.add_one = raw.function(c"add_one")?;
        let bytes = std::mem::size_of::<i32>();
        // SAFETY: the context is current; the buffers are valid out pointers; each memset stays
        // inside its allocation.
        unsafe {
            ok("cuMemAlloc_v2", sys::cuMemAlloc_v2(&mut raw.buf_a, bytes))?;
            ok("cuMemAlloc_v2", sys::cuMemAlloc_v2(&mut raw.buf_b, bytes))?;
            ok("cuMemsetD8_v2", sys::cuMemsetD8_v2(raw.buf_a, 0, bytes))?;
            ok("cuMemsetD8_v2", sys::cuMemsetD8_v2(raw.buf_b, 0, bytes))?;
        }
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; `stream` is a valid out pointer.
        ok("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw.stream, flags)
        })?;
        Ok(raw)
    }

    fn function(&self, name: &CStr) -> Result<sys::CUfunction, String> {
        raw::function(self.module, name)
    }

    /// Makes the shared primary context current on this thread.
    fn bind(&self) -> Result<(), String> {
        // SAFETY: `ctx` is retained until `Drop`.
        ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// One launch of one thread on the raw stream.
    fn launch(&self, work: RawWork) -> Result<(), String> {
        let (f, mut p) = match work {
            RawWork::Empty => (self.empty, 0),
            RawWork::AddOne(buf) => (self.add_one, buf),
        };
        let mut args = [&mut p as *mut u64 as *mut c_void];
        let params = match work {
            RawWork::Empty => null_mut(),
            RawWork::AddOne(_) => args.as_mut_ptr(),
        };
        // SAFETY: the stream is live; empty_kernel takes no arguments (null `kernelParams`);
        // add_one takes one int* and its one entry points at the device address of a one-int
        // buffer, alive during the call (the driver copies it).
        ok("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, self.stream, params, null_mut())
        })
    }

    /// `cuStreamBeginCapture_v2(mode)` + n launches + `cuStreamEndCapture`, which hands back the
    /// graph the driver made: the fastest raw capture (no graph made beforehand). The capture is
    /// always ended; a failed end returns no graph.
    fn capture(&self, mode: Mode, n: usize, work: RawWork) -> Result<RawGraph, String> {
        self.capture_with(mode, n, |r| r.launch(work))
    }

    /// [`capture`](Self::capture) with `launch` making each launch.
    fn capture_with(
        &self,
        mode: Mode,
        n: usize,
        launch: impl Fn(&Raw) -> Result<(), String>,
    ) -> Result<RawGraph, String> {
        // SAFETY: the stream is live and not capturing.
        ok("cuStreamBeginCapture_v2", unsafe {
            sys::cuStreamBeginCapture_v2(self.stream, mode.raw())
        })?;
        // The driver's graph, owned from here on (destroyed on drop).
        self.launch_and_end(n, launch).map(RawGraph)
    }

    /// n × `launch` on the capturing stream, then `cuStreamEndCapture`, always: the captured
    /// graph, or the first error (a failed launch, then a failed end), with no graph.
    fn launch_and_end(
        &self,
        n: usize,
        launch: impl Fn(&Raw) -> Result<(), String>,
    ) -> Result<sys::CUgraph, String> {
        let mut launched = Ok(());
        for _ in 0..n {
            if let Err(e) = launch(self) {
                launched = Err(e);
                break;
            }
        }
        let mut out = null_mut();
        // SAFETY: the stream captures (begun by the caller, on this thread); `out` is a valid out
        // pointer.
        let ended = ok("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.stream, &mut out)
        });
        match (launched, ended) {
            (Ok(()), Ok(())) => Ok(out),
            (Err(first), Err(e)) => Err(format!("{first}; then {e}")),
            (Ok(()), Err(e)) => Err(e),
            // Ended, so the driver made a graph: destroy it, report the launch.
            (Err(first), Ok(())) => {
                drop(RawGraph(out));
                Err(first)
            }
        }
    }

    /// `cuGraphCreate` + `cuStreamBeginCaptureToGraph(mode)` + n empty launches +
    /// `cuStreamEndCapture`: a capture into a graph made first. The capture is always ended;
    /// when ending fails the graph is leaked, not destroyed (the driver may already have
    /// destroyed a graph whose capture failed).
    fn capture_to_graph(&self, mode: Mode, n: usize) -> Result<RawGraph, String> {
        let graph = RawGraph::create()?;
        // SAFETY: the stream is live and not capturing; `graph` is a live, empty graph; no
        // dependencies.
        ok("cuStreamBeginCaptureToGraph", unsafe {
            sys::cuStreamBeginCaptureToGraph(self.stream, graph.0, null(), null(), 0, mode.raw())
        })?;
        match self.launch_and_end(n, |r| r.launch(RawWork::Empty)) {
            Ok(_) => Ok(graph),
            // A failed launch after a good end: `launch_and_end` destroyed the ended graph, which
            // is this one. A failed end: the driver may have destroyed it; leak the handle.
            Err(e) => {
                std::mem::forget(graph);
                Err(e)
            }
        }
    }

    fn instantiate(&self, g: &RawGraph) -> Result<RawExec, String> {
        let mut params = sys::CUDA_GRAPH_INSTANTIATE_PARAMS {
            flags: 0,
            hUploadStream: null_mut(),
            hErrNode_out: null_mut(),
            result_out: sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS,
        };
        let mut exec = null_mut();
        // SAFETY: `g` is a live graph; `params` is fully initialised; `exec` is an out pointer.
        let r = unsafe { sys::cuGraphInstantiateWithParams(&mut exec, g.0, &mut params) };
        let guard = (!exec.is_null()).then_some(RawExec(exec));
        ok("cuGraphInstantiateWithParams", r)?;
        guard.ok_or_else(|| "raw: cuGraphInstantiateWithParams returned no exec".to_string())
    }

    /// Only the call's result is checked (a failed update returns an error code), so the
    /// driver-written `result` enum is never read.
    fn update(&self, exec: &RawExec, g: &RawGraph) -> Result<(), String> {
        // SAFETY: a zeroed result info is a valid out parameter (plain C data).
        let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
        // SAFETY: `exec` and `g` are live; `info` is a valid out pointer.
        ok("cuGraphExecUpdate_v2", unsafe {
            sys::cuGraphExecUpdate_v2(exec.0, g.0, &mut info)
        })
    }

    fn replay(&self, exec: &RawExec) -> Result<(), String> {
        // SAFETY: `exec` and the stream are live; the exec is launched from this thread only.
        unsafe {
            ok("cuGraphLaunch", sys::cuGraphLaunch(exec.0, self.stream))?;
            ok("cuStreamSynchronize", sys::cuStreamSynchronize(self.stream))
        }
    }

    /// A one-thread launch of `empty_kernel` as a kernel node's parameters, naming `ctx` (the
    /// driver takes the function's context when `func` is set, whatever `ctx` says).
    fn empty_node_params(&self, ctx: sys::CUcontext) -> sys::CUDA_KERNEL_NODE_PARAMS {
        sys::CUDA_KERNEL_NODE_PARAMS {
            func: self.empty,
            gridDimX: 1,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 1,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            kernelParams: null_mut(),
            extra: null_mut(),
            kern: null_mut(),
            ctx,
        }
    }

    fn explicit_chain(&self, n: usize) -> Result<(), String> {
        let graph = RawGraph::create()?;
        let params = self.empty_node_params(self.ctx);
        let mut prev: sys::CUgraphNode = null_mut();
        for i in 0..n {
            let (deps, count) = if i == 0 {
                (null(), 0)
            } else {
                (&prev as *const sys::CUgraphNode, 1)
            };
            let mut node = null_mut();
            // SAFETY: the graph is live and `deps` holds `count` nodes of it; empty_kernel takes
            // no arguments (null `kernelParams`).
            ok("cuGraphAddKernelNode_v2", unsafe {
                sys::cuGraphAddKernelNode_v2(&mut node, graph.0, deps, count, &params)
            })?;
            prev = node;
        }
        graph.destroy()
    }

    /// An empty-kernel launch with what [`Floor`] adds to a captured launch.
    fn launch_floor(&self, floor: &Floor) -> Result<(), String> {
        floor.bind_noted(self.ctx)?;
        floor.lock();
        floor.keep(self.module as usize);
        let r = self.launch(RawWork::Empty);
        floor.unlock();
        r
    }

    /// [`explicit_chain`](Self::explicit_chain) with what [`Floor`] adds to an explicit node.
    fn explicit_chain_floor(&self, floor: &Floor, n: usize) -> Result<(), String> {
        let graph = RawGraph::create()?;
        let params = self.empty_node_params(null_mut());
        let mut prev: sys::CUgraphNode = null_mut();
        for i in 0..n {
            floor.bind_checked(self.ctx)?;
            floor.lock();
            let (deps, count) = if i == 0 {
                (null(), 0)
            } else if floor.slot_names(i - 1, prev) {
                (&prev as *const sys::CUgraphNode, 1)
            } else {
                floor.unlock();
                return Err("floor: a dependency's slot does not name it".into());
            };
            let mut node = null_mut();
            // SAFETY: the graph is live and `deps` holds `count` nodes of it; empty_kernel takes
            // no arguments (null `kernelParams`); the context is current (checked above).
            let r = ok("cuGraphAddKernelNode_v2", unsafe {
                sys::cuGraphAddKernelNode_v2(&mut node, graph.0, deps, count, &params)
            });
            if r.is_ok() {
                floor.record([node as usize, i, self.module as usize, 0]);
            }
            floor.unlock();
            r?;
            prev = node;
        }
        graph.destroy()
    }

    fn stream_launches(&self, n: usize) -> Result<(), String> {
        for _ in 0..n {
            self.launch(RawWork::Empty)?;
        }
        // SAFETY: the stream is live.
        ok("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.bind();
        // SAFETY: every object was made in `new` (or is null/0 when it failed part-way) and no
        // graph of the raw side is left; the primary context was retained once.
        let results = unsafe {
            [
                (!self.stream.is_null()).then(|| {
                    let _ = sys::cuStreamSynchronize(self.stream);
                    ok("cuStreamDestroy_v2", sys::cuStreamDestroy_v2(self.stream))
                }),
                (self.buf_a != 0).then(|| ok("cuMemFree_v2", sys::cuMemFree_v2(self.buf_a))),
                (self.buf_b != 0).then(|| ok("cuMemFree_v2", sys::cuMemFree_v2(self.buf_b))),
                (!self.module.is_null())
                    .then(|| ok("cuModuleUnload", sys::cuModuleUnload(self.module))),
                Some(ok(
                    "cuDevicePrimaryCtxRelease_v2",
                    sys::cuDevicePrimaryCtxRelease_v2(self.dev),
                )),
            ]
        };
        for e in results.into_iter().flatten().filter_map(Result::err) {
            eprintln!("overhead: cleanup: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One row: a case at one n, with what both sides prepared outside the timings.

/// What a case needs besides the long-lived objects. Fields drop in order (execs before graphs).
enum Prepared {
    Nothing,
    Instantiate {
        lib: GraphBuilder<Primary, Ended>,
        raw: RawGraph,
    },
    Replay {
        lib: Graph,
        raw_exec: RawExec,
        _raw_graph: RawGraph,
    },
    Update {
        lib: Graph,
        lib_sources: [GraphBuilder<Primary, Ended>; 2],
        lib_next: usize,
        raw_exec: RawExec,
        raw_sources: [RawGraph; 2],
        raw_next: usize,
    },
}

struct Pair<'a> {
    case: Case,
    n: usize,
    lib: &'a Lib,
    raw: &'a Raw,
    prep: Prepared,
}

fn timed<E>(f: impl FnOnce() -> Result<(), E>) -> Result<Duration, E> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed())
}

fn lib_err(e: Error) -> String {
    format!("library: {e}")
}

impl<'a> Pair<'a> {
    fn new(case: Case, n: usize, lib: &'a Lib, raw: &'a Raw) -> Result<Pair<'a>, String> {
        let opts = InstantiateOptions::default();
        let prep = match case {
            Case::Instantiate => {
                let l = lib.capture(Mode::Global, n, Work::Empty).map_err(lib_err)?;
                raw.bind()?;
                Prepared::Instantiate {
                    lib: l,
                    raw: raw.capture(Mode::Global, n, RawWork::Empty)?,
                }
            }
            Case::Replay => {
                let l = lib
                    .capture(Mode::Global, n, Work::Empty)
                    .and_then(|b| b.instantiate_with(&opts))
                    .map_err(lib_err)?;
                raw.bind()?;
                let g = raw.capture(Mode::Global, n, RawWork::Empty)?;
                Prepared::Replay {
                    lib: l,
                    raw_exec: raw.instantiate(&g)?,
                    _raw_graph: g,
                }
            }
            Case::Update => {
                let a = lib
                    .capture(Mode::Global, n, Work::AddOne(&lib.buf_a))
                    .map_err(lib_err)?;
                let b = lib
                    .capture(Mode::Global, n, Work::AddOne(&lib.buf_b))
                    .map_err(lib_err)?;
                let l = a.instantiate_with(&opts).map_err(lib_err)?;
                raw.bind()?;
                let ra = raw.capture(Mode::Global, n, RawWork::AddOne(raw.buf_a))?;
                let rb = raw.capture(Mode::Global, n, RawWork::AddOne(raw.buf_b))?;
                Prepared::Update {
                    lib: l,
                    lib_sources: [a, b],
                    lib_next: 1,
                    raw_exec: raw.instantiate(&ra)?,
                    raw_sources: [ra, rb],
                    raw_next: 1,
                }
            }
            _ => Prepared::Nothing,
        };
        Ok(Pair {
            case,
            n,
            lib,
            raw,
            prep,
        })
    }

    /// One timed library sample.
    fn lib_sample(&mut self) -> Result<Duration, String> {
        let Pair {
            case, n, lib, prep, ..
        } = self;
        let (case, n, lib) = (*case, *n, *lib);
        let opts = InstantiateOptions::default();
        match (case, prep) {
            (Case::Capture(mode), _) => timed(|| lib.capture(mode, n, Work::Empty).map(drop)),
            (Case::CaptureBuffer, _) => timed(|| {
                lib.capture(Mode::Global, n, Work::AddOne(&lib.buf_a))
                    .map(drop)
            }),
            (Case::CaptureTyped, _) => timed(|| {
                lib.capture(Mode::Global, n, Work::Typed(&lib.buf_a))
                    .map(drop)
            }),
            (Case::Instantiate, Prepared::Instantiate { lib: ended, .. }) => {
                timed(|| ended.instantiate_with(&opts).map(drop))
            }
            (Case::Replay, Prepared::Replay { lib: graph, .. }) => timed(|| {
                graph.launch(&lib.stream)?;
                lib.stream.synchronize()
            }),
            (
                Case::Update,
                Prepared::Update {
                    lib: graph,
                    lib_sources,
                    lib_next,
                    ..
                },
            ) => {
                let source = &lib_sources[*lib_next];
                *lib_next ^= 1;
                timed(|| graph.update(source))
            }
            (Case::Explicit, _) => timed(|| lib.explicit_chain(n)),
            (Case::StreamLaunch, _) => timed(|| lib.stream_launches(n)),
            (Case::FloorCapture | Case::FloorExplicit, _) => return self.floor_sample(),
            (Case::PathCapture(mode), _) => {
                let (n, raw) = (self.n, self.raw);
                raw.bind()?;
                return timed(|| raw.capture_to_graph(mode, n)?.destroy());
            }
            (case, _) => {
                return Err(format!(
                    "internal: {} was not prepared for the library side",
                    case.name()
                ))
            }
        }
        .map_err(lib_err)
    }

    /// One timed sample of a `floor:` row's first side: the raw calls with what [`Floor`] adds.
    fn floor_sample(&mut self) -> Result<Duration, String> {
        let (case, n, raw) = (self.case, self.n, self.raw);
        raw.bind()?;
        let floor = Floor::new();
        match case {
            Case::FloorCapture => timed(|| {
                raw.capture_with(Mode::Global, n, |r| r.launch_floor(&floor))?
                    .destroy()
            }),
            _ => timed(|| raw.explicit_chain_floor(&floor, n)),
        }
    }

    /// One timed raw sample.
    fn raw_sample(&mut self) -> Result<Duration, String> {
        let Pair {
            case, n, raw, prep, ..
        } = self;
        let (case, n, raw) = (*case, *n, *raw);
        raw.bind()?;
        match (case, prep) {
            (Case::Capture(mode), _) => timed(|| raw.capture(mode, n, RawWork::Empty)?.destroy()),
            (Case::CaptureBuffer | Case::CaptureTyped, _) => timed(|| {
                raw.capture(Mode::Global, n, RawWork::AddOne(raw.buf_a))?
                    .destroy()
            }),
            (Case::Instantiate, Prepared::Instantiate { raw: g, .. }) => {
                timed(|| raw.instantiate(g)?.destroy())
            }
            (Case::Replay, Prepared::Replay { raw_exec, .. }) => timed(|| raw.replay(raw_exec)),
            (
                Case::Update,
                Prepared::Update {
                    raw_exec,
                    raw_sources,
                    raw_next,
                    ..
                },
            ) => {
                let source = &raw_sources[*raw_next];
                *raw_next ^= 1;
                timed(|| raw.update(raw_exec, source))
            }
            (Case::Explicit | Case::FloorExplicit, _) => timed(|| raw.explicit_chain(n)),
            (Case::StreamLaunch, _) => timed(|| raw.stream_launches(n)),
            (Case::FloorCapture, _) => {
                timed(|| raw.capture(Mode::Global, n, RawWork::Empty)?.destroy())
            }
            (Case::PathCapture(mode), _) => {
                timed(|| raw.capture(mode, n, RawWork::Empty)?.destroy())
            }
            (case, _) => Err(format!(
                "internal: {} was not prepared for the raw side",
                case.name()
            )),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Paired measurement.

struct Row {
    rounds: usize,
    planned: usize,
    /// Median seconds per sample.
    lib: f64,
    raw: f64,
    /// Quartiles of the per-round ratios lib/raw.
    q1: f64,
    q3: f64,
}

enum Outcome {
    Done(Row),
    /// The row's line says why.
    Failed,
    /// The row's line says why.
    Skipped,
}

/// The `q` quantile of sorted values, interpolated.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn measure(pair: &mut Pair<'_>, planned: usize, budget: Duration) -> Result<Row, String> {
    let warm = (planned / 10).clamp(1, 20);
    for _ in 0..warm {
        pair.lib_sample()?;
        pair.raw_sample()?;
    }
    let mut lib = Vec::with_capacity(planned);
    let mut raw = Vec::with_capacity(planned);
    let start = Instant::now();
    for i in 0..planned {
        let (l, r) = if i % 2 == 0 {
            let l = pair.lib_sample()?;
            (l, pair.raw_sample()?)
        } else {
            let r = pair.raw_sample()?;
            (pair.lib_sample()?, r)
        };
        lib.push(l.as_secs_f64());
        raw.push(r.as_secs_f64());
        if lib.len() >= MIN_ROUNDS && start.elapsed() > budget {
            break;
        }
    }
    let ratios = sorted(
        lib.iter()
            .zip(&raw)
            .map(|(l, r)| l / r.max(1e-12))
            .collect(),
    );
    let rounds = lib.len();
    Ok(Row {
        rounds,
        planned,
        lib: quantile(&sorted(lib), 0.5),
        raw: quantile(&sorted(raw), 0.5),
        q1: quantile(&ratios, 0.25),
        q3: quantile(&ratios, 0.75),
    })
}

fn say(s: impl AsRef<str>) {
    println!("{}", s.as_ref());
    let _ = std::io::stdout().flush();
}

fn us_per_node(seconds: f64, n: usize) -> f64 {
    seconds * 1e6 / n as f64
}

fn row_line(name: &str, n: usize, row: &Row, budget: Duration) -> String {
    let stopped = if row.rounds < row.planned {
        format!(
            ", stopped by the {:.0} s row limit (of {})",
            budget.as_secs_f64(),
            row.planned
        )
    } else {
        String::new()
    };
    format!(
        "{name:<26} lib {:>9.3} µs/node  raw {:>9.3} µs/node  ratio {:>5.2}  ({:+.3} µs/node; per-round ratios {:.2}–{:.2} middle half; {} rounds{stopped})",
        us_per_node(row.lib, n),
        us_per_node(row.raw, n),
        row.lib / row.raw,
        us_per_node(row.lib - row.raw, n),
        row.q1,
        row.q3,
        row.rounds,
    )
}

/// Why capture-based cases cannot run here, if they cannot.
fn capture_unavailable() -> Option<String> {
    let why = match driver_version() {
        Ok(v) if v < DriverVersion::V12_3 => {
            format!("capturing needs driver 12.3, this one is {v}")
        }
        Ok(_) if !has_symbol(CAPTURE_SYMBOL) => format!("the driver lacks {CAPTURE_SYMBOL}"),
        Ok(_) => return None,
        Err(e) => format!("driver version unknown: {e}"),
    };
    Some(why)
}

fn selected(opts: &Options, case: Case, n: usize) -> bool {
    opts.filter
        .as_deref()
        .is_none_or(|f| row_name(case, n).contains(f))
}

/// The paired table and its summaries; returns the number of failed rows.
fn run_table(lib: &Lib, raw: &Raw, opts: &Options, no_capture: &Option<String>) -> usize {
    let mut results: Vec<(Case, usize, Outcome)> = Vec::new();
    for &n in &opts.sizes {
        for case in CASES {
            if !selected(opts, case, n) {
                continue;
            }
            let name = row_name(case, n);
            let outcome = match no_capture.as_ref().filter(|_| case.captures()) {
                Some(why) => {
                    say(format!("{name:<26} skipped: {why}"));
                    Outcome::Skipped
                }
                None => {
                    let planned = rounds_for(opts.reps, n);
                    match Pair::new(case, n, lib, raw)
                        .and_then(|mut p| measure(&mut p, planned, opts.row_budget))
                    {
                        Ok(row) => {
                            say(row_line(&name, n, &row, opts.row_budget));
                            Outcome::Done(row)
                        }
                        Err(e) => {
                            say(format!("{name:<26} FAILED: {e}"));
                            Outcome::Failed
                        }
                    }
                }
            };
            results.push((case, n, outcome));
        }
    }
    if results.is_empty() {
        say(format!(
            "overhead: no row matches the filter `{}`",
            opts.filter.as_deref().unwrap_or("")
        ));
        return 0;
    }
    let sizes: Vec<usize> = opts
        .sizes
        .iter()
        .copied()
        .filter(|&n| results.iter().any(|(_, m, _)| *m == n))
        .collect();
    let cases: Vec<Case> = CASES
        .into_iter()
        .filter(|&c| results.iter().any(|(d, _, _)| *d == c))
        .collect();
    let table = |title: &str, cell: &dyn Fn(&Row, usize) -> String| {
        say("");
        say(title);
        let mut head = format!("{:<22}", "case");
        for n in &sizes {
            head += &format!(" {:>10}", format!("n={n}"));
        }
        say(head);
        for &case in &cases {
            let mut line = format!("{:<22}", case.name());
            for &n in &sizes {
                let text = match results.iter().find(|(c, m, _)| *c == case && *m == n) {
                    Some((_, _, Outcome::Done(row))) => cell(row, n),
                    Some((_, _, Outcome::Failed)) => "FAILED".into(),
                    Some((_, _, Outcome::Skipped)) => "skipped".into(),
                    None => "-".into(),
                };
                line += &format!(" {text:>10}");
            }
            say(line);
        }
    };
    table(
        "summary: ratio library/raw (median ÷ median; 1.00 = no measurable overhead, 1.20 = 20 % slower)",
        &|row, _| format!("{:.2}", row.lib / row.raw),
    );
    let ratio_of =
        |case: Case, n: usize| match results.iter().find(|(c, m, _)| *c == case && *m == n) {
            Some((_, _, Outcome::Done(row))) => Some(row.lib / row.raw),
            _ => None,
        };
    let beyond = [
        (Case::Capture(Mode::Global), Case::FloorCapture),
        (Case::Explicit, Case::FloorExplicit),
    ];
    if beyond
        .iter()
        .any(|&(c, f)| cases.contains(&c) && cases.contains(&f))
    {
        say("");
        say("summary: library ratio ÷ floor ratio (what the library adds beyond the least a safe wrapper adds)");
        let mut head = format!("{:<22}", "case");
        for n in &sizes {
            head += &format!(" {:>10}", format!("n={n}"));
        }
        say(head);
        for (case, floor) in beyond {
            let mut line = format!("{:<22}", case.name());
            for &n in &sizes {
                let text = match (ratio_of(case, n), ratio_of(floor, n)) {
                    (Some(l), Some(f)) => format!("{:.2}", l / f),
                    _ => "-".into(),
                };
                line += &format!(" {text:>10}");
            }
            say(line);
        }
    }
    table(
        "summary: library extra cost, µs per node (lib − raw)",
        &|row, n| format!("{:+.3}", us_per_node(row.lib - row.raw, n)),
    );
    table("summary: library, µs per node (median)", &|row, n| {
        format!("{:.3}", us_per_node(row.lib, n))
    });
    table(
        "summary: raw driver calls, µs per node (median)",
        &|row, n| format!("{:.3}", us_per_node(row.raw, n)),
    );
    let failed = results
        .iter()
        .filter(|(_, _, o)| matches!(o, Outcome::Failed))
        .count();
    let skipped = results
        .iter()
        .filter(|(_, _, o)| matches!(o, Outcome::Skipped))
        .count();
    say(format!(
        "overhead: {} rows, {} measured, {failed} failed, {skipped} skipped",
        results.len(),
        results.len() - failed - skipped
    ));
    failed
}

/// Allocations and bytes allocated by one sample.
type Counted = (u64, u64);

/// The fewest allocations of 3 samples per side, after 2 warm-up samples: (library, raw).
fn count_row(pair: &mut Pair<'_>) -> Result<(Counted, Counted), String> {
    for _ in 0..2 {
        pair.lib_sample()?;
        pair.raw_sample()?;
    }
    let mut best_lib = (u64::MAX, 0);
    let mut best_raw = (u64::MAX, 0);
    for _ in 0..3 {
        let (r, a, b) = count_allocs(|| pair.lib_sample());
        r?;
        best_lib = best_lib.min((a, b));
        let (r, a, b) = count_allocs(|| pair.raw_sample());
        r?;
        best_raw = best_raw.min((a, b));
    }
    Ok((best_lib, best_raw))
}

/// Allocations per node (OVERHEAD_ALLOC=1); returns the number of failed rows.
fn run_alloc(lib: &Lib, raw: &Raw, opts: &Options, no_capture: &Option<String>) -> usize {
    say("");
    say("allocations: Rust heap allocations per node and bytes allocated per node, all threads, through the global allocator (the driver's own mallocs are not seen: raw shows 0); fewest of 3 samples after 2 warm-up samples");
    let mut failed = 0;
    for &n in &opts.sizes {
        for case in CASES {
            if !selected(opts, case, n) || (case.captures() && no_capture.is_some()) {
                continue;
            }
            let name = row_name(case, n);
            let counted = Pair::new(case, n, lib, raw).and_then(|mut p| count_row(&mut p));
            match counted {
                Ok(((la, lb), (ra, _))) => say(format!(
                    "alloc {name:<26} lib {:>7.2} allocs/node {:>9.1} B/node  ({la} allocations, {lb} B per sample) | raw {:.2} allocs/node",
                    la as f64 / n as f64,
                    lb as f64 / n as f64,
                    ra as f64 / n as f64,
                )),
                Err(e) => {
                    failed += 1;
                    say(format!("alloc {name:<26} FAILED: {e}"));
                }
            }
        }
    }
    failed
}

/// Each side as its own criterion benchmark (OVERHEAD_CRITERION=1).
fn run_criterion(lib: &Lib, raw: &Raw, opts: &Options, no_capture: &Option<String>) -> usize {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let mut failed = 0;
    for case in CASES {
        if case.captures() {
            if let Some(why) = no_capture {
                say(format!("{:<22} skipped: {why}", case.name()));
                continue;
            }
        }
        let mut group = c.benchmark_group(case.name());
        group.sampling_mode(SamplingMode::Flat);
        for &n in &opts.sizes {
            let mut pair = match Pair::new(case, n, lib, raw) {
                Ok(p) => p,
                Err(e) => {
                    failed += 1;
                    say(format!("{} FAILED: {e}", row_name(case, n)));
                    continue;
                }
            };
            let name = row_name(case, n);
            group.throughput(Throughput::Elements(n as u64));
            group.bench_function(BenchmarkId::new("lib", n), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| pair.lib_sample().unwrap_or_else(|e| panic!("{name}: {e}")))
                        .sum()
                })
            });
            group.bench_function(BenchmarkId::new("raw", n), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| pair.raw_sample().unwrap_or_else(|e| panic!("{name}: {e}")))
                        .sum()
                })
            });
        }
        group.finish();
    }
    c.final_summary();
    failed
}

/// Without `--bench`: every case once per side at the smallest n.
fn run_smoke(lib: &Lib, raw: &Raw, opts: &Options, no_capture: &Option<String>) -> usize {
    let n = opts.sizes.iter().copied().min().unwrap_or(10);
    let (mut ran, mut failed) = (0, 0);
    for case in CASES {
        if case.captures() && no_capture.is_some() {
            continue;
        }
        let r = Pair::new(case, n, lib, raw).and_then(|mut p| {
            p.lib_sample()?;
            p.raw_sample()
        });
        match r {
            Ok(_) => ran += 1,
            Err(e) => {
                failed += 1;
                say(format!("{} FAILED: {e}", row_name(case, n)));
            }
        }
    }
    say(format!(
        "overhead: smoke test at n={n}: {ran} of {} cases ran once on both sides{} (run with --bench to measure)",
        CASES.len(),
        no_capture
            .as_ref()
            .map(|w| format!("; capture cases skipped: {w}"))
            .unwrap_or_default()
    ));
    failed
}

fn main() -> ExitCode {
    let opts = options();

    // No `sys` call before this succeeds: cudarc's loader panics without libcuda.
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!("overhead: skipped: no usable CUDA device ({e})");
            return ExitCode::SUCCESS;
        }
    };
    for note in &opts.notes {
        say(format!("overhead: {note}"));
    }
    let name = device.name().unwrap_or_else(|e| format!("? ({e})"));
    let cc = device
        .compute_capability()
        .map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_else(|_| "?".into());
    let lib = match Lib::new(device) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("overhead: setup failed (library side): {e}");
            return ExitCode::FAILURE;
        }
    };
    let raw = match Raw::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("overhead: setup failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let no_capture = capture_unavailable();
    let driver = driver_version()
        .map(|v| v.to_string())
        .unwrap_or_else(|_| "?".into());
    say(format!(
        "overhead: {name} (compute capability {cc}), driver {driver}, cuda-graph {}",
        env!("CARGO_PKG_VERSION")
    ));

    let started = Instant::now();
    let failed = if !opts.bench {
        run_smoke(&lib, &raw, &opts, &no_capture)
    } else if opts.criterion {
        say("overhead: OVERHEAD_CRITERION=1: each side as its own criterion benchmark (not interleaved)");
        run_criterion(&lib, &raw, &opts, &no_capture)
    } else {
        let rounds: Vec<String> = opts
            .sizes
            .iter()
            .map(|&n| format!("n={n}: {}", rounds_for(opts.reps, n)))
            .collect();
        say("overhead: the library beside the same work through raw driver calls, in one process; rounds of [lib, raw] and [raw, lib] alternately; median per side; µs per node; ratio = lib/raw (1.00 = no measurable overhead)");
        say(format!(
            "overhead: rounds per row: {} (OVERHEAD_REPS={}), at most {:.1} s per row (OVERHEAD_ROW_SECS){}",
            rounds.join(", "),
            opts.reps,
            opts.row_budget.as_secs_f64(),
            opts.filter
                .as_deref()
                .map(|f| format!("; rows matching `{f}`"))
                .unwrap_or_default()
        ));
        let mut failed = run_table(&lib, &raw, &opts, &no_capture);
        if opts.alloc {
            failed += run_alloc(&lib, &raw, &opts, &no_capture);
        }
        failed
    };
    say(format!(
        "overhead: took {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    drop(raw);
    drop(lib);
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
