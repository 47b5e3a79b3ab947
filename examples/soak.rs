//! A leak soak: each kind of graph cycle run many times through the crate, and the same cycle
//! through raw driver calls (`cudarc::driver::sys`), as the control. Each loop's two sides run
//! in fresh processes of this binary, one each (`--side`, internal), so neither side runs in
//! memory the other freed: measured one after the other in one process, the raw control of
//! `edit` looked flat while it grows alone as much as the crate's side (`--in-process` keeps
//! the old way).
//!
//! ```text
//! cargo run --release --example soak                       # 2000 cycles per loop (SOAK_CYCLES unset)
//! cargo run --release --example soak -- --cycles 100000    # the full soak
//! cargo run --release --example soak -- --only fork_join   # one loop
//! SOAK_CYCLES=100000 gpu-bundle/example-soak               # the full soak from the GPU bundle
//! ```
//!
//! Options: `--cycles N` (else the env var `SOAK_CYCLES`, else 2000), `--warmup N` (default 200),
//! `--only NAME` (one of `capture`, `explicit`, `fork_join`, `conditional`, `failed_update`,
//! `panic_callback`, `edit`), `--report-only` (growth does not fail the run: for runs under
//! compute-sanitizer, where memory figures mean nothing), `--raw-node-ctx` (the raw side's kernel
//! nodes name their context in `CUDA_KERNEL_NODE_PARAMS::ctx`, as the crate's do, instead of
//! null), `--raw-free-elsewhere` (the raw `edit` loop frees its replaced buffers on a second
//! thread, as the crate's release thread may), `--raw-host-func` (the raw side queues a no-op
//! host function after each graph launch, as the crate's dropped execs did), `--raw-only` (only
//! the raw control runs: to tell the driver's behaviour from the crate's under a tool such as
//! compute-sanitizer), `--in-process` (both sides in this process, crate first), `--help`.
//! Exit status: 0 when every loop
//! is flat (or the soak is skipped because there is no driver or GPU), 1 when a loop grows or
//! fails, 2 for a bad command line.
//!
//! # What one cycle is
//!
//! Every cycle creates and drops everything it uses; only the device, the module, a 64-int buffer
//! and one launch stream per loop live across cycles. Each kind runs first through the crate, then
//! through the raw driver API (the control):
//!
//! | loop | crate | raw control |
//! | --- | --- | --- |
//! | `capture` | `stream.create_graph_builder()`, `begin_building(Global)`, 3 × `add_one`, end, complete, launch, sync | `cuStreamBeginCapture_v2` (global), 3 × `cuLaunchKernel`, `cuStreamEndCapture`, `cuGraphInstantiateWithParams`, `cuGraphLaunch`, `cuStreamSynchronize`, destroy exec and graph |
//! | `explicit` | `GraphDefinition`: memset → `add_one` → `add_one`, instantiate, launch, sync | `cuGraphCreate`, `cuGraphAddMemsetNode`, 2 × `cuGraphAddKernelNode_v2`, instantiate, launch, sync, destroy |
//! | `fork_join` | `split::<2>()`, `add_one_at` on each fork, `join`, end, complete, launch, sync | 3 streams and 3 events made per cycle; record/wait to fork, a launch per fork stream, record/wait to join; end, instantiate, launch, sync, destroy all |
//! | `conditional` | capture with an IF node (`create_conditional_handle(Some(1))`, `if_then`, body: `add_one`), end, complete, launch, sync | capture; `cuStreamGetCaptureInfo_v3`, `cuGraphConditionalHandleCreate` (default 1), `cuGraphAddNode_v2` (IF), `cuStreamUpdateCaptureDependencies_v2`; the body captured on its own stream with `cuStreamBeginCaptureToGraph` (`add_one`); end, instantiate, launch, sync, destroy |
//! | `failed_update` | capture A (1 launch), complete; capture B (2 launches); `graph.update(&b)` must fail; launch A, sync | the same with `cuGraphExecUpdate_v2`, which must fail |
//! | `edit` | one long-lived `GraphDefinition`: each cycle allocates a 64-int buffer, adds an `add_one` node on it, destroys the previous cycle's node, drops the buffer handle; instantiate, launch, sync | one long-lived graph: `cuMemAlloc_v2` + `cuMemsetD8_v2`, `cuGraphAddKernelNode_v2`, `cuGraphDestroyNode` of the previous node and `cuMemFree_v2` of its buffer; instantiate, launch, sync, destroy the exec |
//! | `panic_callback` | capture `callback(\|\| panic!("soak"))` + `add_one`, complete, launch, sync; `check()` must report the panic | capture `cuLaunchHostFunc` of an `extern "C"` no-op + `add_one`; instantiate, launch, sync, destroy |
//!
//! Where the crate makes a stream per builder (`device.create_graph_builder()`, forks, conditional
//! bodies), the raw cycle makes and destroys the same streams. Both sides begin a primary capture
//! with `cuStreamBeginCapture_v2` (the driver makes the graph); only conditional bodies are
//! captured into an existing graph (`cuStreamBeginCaptureToGraph`).
//!
//! # What is measured
//!
//! Each loop warms up (`--warmup` cycles of each side), then runs N crate cycles and N raw cycles.
//! Before and after each run of N it synchronizes, sleeps 200 ms (the crate releases graph-owned
//! values on a background thread) until the Rust heap stops changing, and reads:
//!
//! - host RSS: resident pages from `/proc/self/statm` × the page size;
//! - device memory in use: `cuMemGetInfo_v2` total − free. This is device-wide, so other processes
//!   on the same GPU disturb it: run on an otherwise idle GPU;
//! - the live Rust heap: bytes allocated minus bytes freed through the Rust global allocator (a
//!   counting wrapper around the system allocator), crate side only. Driver allocations never go
//!   through it, so it tells Rust-side growth (the crate, or closures it keeps) from driver-side
//!   growth (driver objects that are never destroyed).
//!
//! # How to read it
//!
//! Each line gives the growth per 1000 cycles for the crate and for the raw control:
//!
//! ```text
//! capture         crate: rss +0 B/1000  dev +0 B/1000  heap +0 B/1000 | raw: rss +0 B/1000  dev +0 B/1000 | flat
//! ```
//!
//! A loop is **flat** when the crate's growth is within 1 KiB per 1000 cycles of the raw control's,
//! for host RSS and for device memory. RSS moves in whole pages, so over short runs the RSS
//! allowance is at least one page over the run (with 4 KiB pages that matters below 4000 cycles).
//! Device memory moves in large steps (pools of often 2 MiB), so a loop that is not flat is
//! measured a second time: a leak grows again, a one-off step does not, and the verdict is the
//! second measurement's. The raw control growing too points at the driver, not the crate. The last
//! line sums up: `soak: 7 loops, 7 flat, 0 growing` (with failed and skipped loops, if any).
//!
//! Without a CUDA driver or GPU (`Device::new(0)` fails) it prints one line saying why the soak is
//! skipped and exits with status 0. The conditional loop needs driver 12.3 and, as in the GPU test
//! suite, compute capability 9.0; elsewhere it is skipped with the reason.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_void, CStr};
use std::io::Write;
use std::process::ExitCode;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use cuda_graph::prelude::*;
use cuda_graph::{DriverVersion, HostCallback};
use cudarc::driver::sys;

/// Test kernels shipped with the crate (see tests/kernels/README.md): `add_one(int* p)` does
/// `p[0] += 1`, `add_one_at(int* p, int i)` does `p[i] += 1`.
const KERNELS: &[u8] = include_bytes!("../tests/kernels/kernels.fatbin");
/// Ints in the long-lived buffer (the memset node clears all of them).
const BUF_LEN: usize = 64;
const DEFAULT_CYCLES: u64 = 2000;
const DEFAULT_WARMUP: u64 = 200;
/// The allowed excess of the crate over the raw control, per 1000 cycles.
const TOLERANCE_PER_1000: f64 = 1024.0;
/// How long to wait before a reading, for the crate's release thread.
const SETTLE: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------------------------------------
// The live Rust heap.

/// The system allocator, counting live bytes.
struct Counting;

static LIVE_HEAP: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` with the same arguments, so `System`'s guarantees
// hold; the counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE_HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_HEAP.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_HEAP.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_heap() -> i64 {
    LIVE_HEAP.load(Ordering::Relaxed) as i64
}

// ---------------------------------------------------------------------------------------------
// Host RSS.

#[cfg(target_os = "linux")]
fn page_size() -> u64 {
    extern "C" {
        fn sysconf(name: std::ffi::c_int) -> std::ffi::c_long;
    }
    /// `_SC_PAGESIZE` in glibc and musl, on every Linux architecture.
    const SC_PAGESIZE: std::ffi::c_int = 30;
    // SAFETY: sysconf only reads a configuration value.
    let v = unsafe { sysconf(SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

#[cfg(not(target_os = "linux"))]
fn page_size() -> u64 {
    4096
}

/// Resident bytes, from /proc/self/statm; `None` where there is no /proc.
fn rss_bytes(page: u64) -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some((resident * page) as i64)
}

// ---------------------------------------------------------------------------------------------
// Command line.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Capture,
    Explicit,
    ForkJoin,
    Conditional,
    FailedUpdate,
    PanicCallback,
    Edit,
}

const KINDS: [Kind; 7] = [
    Kind::Capture,
    Kind::Explicit,
    Kind::ForkJoin,
    Kind::Conditional,
    Kind::FailedUpdate,
    Kind::PanicCallback,
    Kind::Edit,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Capture => "capture",
            Kind::Explicit => "explicit",
            Kind::ForkJoin => "fork_join",
            Kind::Conditional => "conditional",
            Kind::FailedUpdate => "failed_update",
            Kind::PanicCallback => "panic_callback",
            Kind::Edit => "edit",
        }
    }

    fn from_name(s: &str) -> Option<Kind> {
        let s = s.replace('-', "_");
        KINDS.into_iter().find(|k| k.name() == s)
    }

    /// The driver entry points the raw cycle calls (beyond those of `Raw::new`); checked first,
    /// because cudarc panics on a missing symbol.
    fn raw_symbols(self) -> &'static [&'static str] {
        match self {
            Kind::Capture => &[],
            Kind::Explicit => &[
                "cuGraphCreate",
                "cuGraphAddMemsetNode",
                "cuGraphAddKernelNode_v2",
            ],
            Kind::ForkJoin => &[
                "cuEventCreate",
                "cuEventDestroy_v2",
                "cuEventRecord",
                "cuStreamWaitEvent",
            ],
            Kind::Conditional => &[
                "cuStreamGetCaptureInfo_v3",
                "cuGraphConditionalHandleCreate",
                "cuGraphAddNode_v2",
                "cuStreamUpdateCaptureDependencies_v2",
                "cuStreamBeginCaptureToGraph",
            ],
            Kind::FailedUpdate => &["cuGraphExecUpdate_v2"],
            Kind::PanicCallback => &["cuLaunchHostFunc"],
            Kind::Edit => &[
                "cuGraphCreate",
                "cuGraphAddKernelNode_v2",
                "cuGraphDestroyNode",
            ],
        }
    }
}

struct Options {
    cycles: u64,
    warmup: u64,
    only: Option<Kind>,
    /// Growth is reported but does not fail the run (under compute-sanitizer, where host memory
    /// figures mean nothing); failed loops still do.
    report_only: bool,
    /// The raw side's kernel nodes name their context, as the crate's do.
    raw_node_ctx: bool,
    raw_free_elsewhere: bool,
    /// The raw side queues a host function after each graph launch, as the crate does when an
    /// exec is dropped (its release waits for the launch through `cuLaunchHostFunc`).
    raw_host_func: bool,
    /// Only the raw control runs (the crate side's cycles do nothing): to tell, under a tool such
    /// as compute-sanitizer, the driver's behaviour from the crate's.
    raw_only: bool,
    /// Both sides measured in this process, the crate's first (before stop 18 the only way; a
    /// side measured after the other can reuse memory the first freed, which hid the driver's
    /// own growth in the raw control of `edit`).
    in_process: bool,
    /// Internal: this process measures one side of the `--only` loop and prints its rounds.
    side: Option<Side>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Crate,
    Raw,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Crate => "crate",
            Side::Raw => "raw",
        }
    }
}

const USAGE: &str = "usage: soak [--cycles N] [--warmup N] [--only NAME] [--report-only]
  --cycles N     measured cycles per loop and side (default: $SOAK_CYCLES, else 2000)
  --warmup N     cycles per side before measuring (default 200)
  --only NAME    one loop: capture, explicit, fork_join, conditional, failed_update, panic_callback, edit
  --report-only  growth is reported but does not fail the run (for runs under compute-sanitizer)
  --raw-node-ctx the raw side's kernel nodes name their context, as the crate's do
  --raw-free-elsewhere the raw edit loop frees its replaced buffers on a second thread
  --raw-host-func the raw side queues a no-op host function after each graph launch
  --raw-only     only the raw control runs (the crate side's cycles do nothing)
  --in-process   measure both sides in this process (crate first) instead of one fresh
                 process per loop and side
  --side S       (internal) measure only side S (crate or raw) of the --only loop
Exit status: 0 all flat (or skipped: no driver/GPU), 1 a loop grows (unless --report-only) or
fails, 2 bad usage.";

fn positive(what: &str, v: &str) -> Result<u64, String> {
    match v.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{what} wants a positive integer, got `{v}`")),
    }
}

/// `Ok(None)` for `--help`.
fn parse_args() -> Result<Option<Options>, String> {
    let mut opts = Options {
        cycles: 0,
        warmup: DEFAULT_WARMUP,
        only: None,
        report_only: false,
        raw_node_ctx: false,
        raw_free_elsewhere: false,
        raw_host_func: false,
        raw_only: false,
        in_process: false,
        side: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = |flag: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--report-only" => opts.report_only = true,
            "--raw-node-ctx" => opts.raw_node_ctx = true,
            "--raw-free-elsewhere" => opts.raw_free_elsewhere = true,
            "--raw-host-func" => opts.raw_host_func = true,
            "--raw-only" => opts.raw_only = true,
            "--in-process" => opts.in_process = true,
            "--side" => {
                opts.side = Some(match value("--side")?.as_str() {
                    "crate" => Side::Crate,
                    "raw" => Side::Raw,
                    v => return Err(format!("--side wants crate or raw, got `{v}`")),
                })
            }
            "--cycles" => opts.cycles = positive("--cycles", &value("--cycles")?)?,
            "--warmup" => {
                opts.warmup = value("--warmup")?
                    .trim()
                    .parse()
                    .map_err(|_| "--warmup wants a non-negative integer".to_string())?
            }
            "--only" => {
                let v = value("--only")?;
                opts.only =
                    Some(Kind::from_name(&v).ok_or_else(|| format!("no loop named `{v}`"))?);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if opts.cycles == 0 {
        opts.cycles = match std::env::var("SOAK_CYCLES") {
            Ok(v) => positive("SOAK_CYCLES", &v)?,
            Err(_) => DEFAULT_CYCLES,
        };
    }
    if opts.side.is_some() && opts.only.is_none() {
        return Err("--side needs --only".into());
    }
    Ok(Some(opts))
}

// ---------------------------------------------------------------------------------------------
// The crate side.

struct CrateSide {
    device: Device,
    add_one: Function,
    add_one_at: Function,
    buf: DeviceBuffer<i32>,
    /// The `edit` loop's long-lived definition and its latest node.
    edited: std::sync::Mutex<Option<(GraphDefinition, Option<GraphNode>)>>,
}

impl CrateSide {
    fn new(device: Device) -> cuda_graph::Result<CrateSide> {
        // SAFETY: the fatbin nvcc built from the crate's kernels (tests/kernels), unmodified.
        let module = unsafe { device.load_module(KERNELS)? };
        Ok(CrateSide {
            add_one: module.function("add_one")?,
            add_one_at: module.function("add_one_at")?,
            buf: device.alloc_zeroed::<i32>(BUF_LEN)?,
            edited: std::sync::Mutex::new(None),
            device,
        })
    }

    fn cycle(&self, kind: Kind, stream: &Stream) -> Result<(), String> {
        let r = match kind {
            Kind::Capture => self.capture(stream),
            Kind::Explicit => self.explicit(stream),
            Kind::ForkJoin => self.fork_join(stream),
            Kind::Conditional => self.conditional(stream),
            Kind::FailedUpdate => return self.failed_update(stream),
            Kind::PanicCallback => return self.panic_callback(stream),
            Kind::Edit => self.edit(stream),
        };
        r.map_err(|e| format!("crate: {e}"))
    }

    fn add_one_args(&self) -> KernelArgs<'_> {
        KernelArgs::new().arg(&self.buf)
    }

    fn capture(&self, stream: &Stream) -> cuda_graph::Result<()> {
        let b = stream.create_graph_builder().begin_building(Global)?;
        for _ in 0..3 {
            // SAFETY: add_one takes one int*, and `buf` holds 64 ints.
            unsafe {
                b.launch_unchecked(&self.add_one, LaunchConfig::single(), &self.add_one_args())?
            };
        }
        let graph = b.end_building()?.instantiate()?;
        graph.launch(stream)?;
        stream.synchronize()
    }

    fn explicit(&self, stream: &Stream) -> cuda_graph::Result<()> {
        let def = GraphDefinition::new(&self.device)?;
        let clear = def.add_memset(&[], &self.buf, 0i32)?;
        // SAFETY: add_one takes one int*, and `buf` holds 64 ints.
        unsafe {
            let first = def.add_kernel_unchecked(
                &[&clear],
                &self.add_one,
                LaunchConfig::single(),
                &self.add_one_args(),
            )?;
            def.add_kernel_unchecked(
                &[&first],
                &self.add_one,
                LaunchConfig::single(),
                &self.add_one_args(),
            )?;
        }
        let graph = def.instantiate()?;
        graph.launch(stream)?;
        stream.synchronize()
    }

    fn edit(&self, stream: &Stream) -> cuda_graph::Result<()> {
        let mut edited = self.edited.lock().unwrap_or_else(|p| p.into_inner());
        if edited.is_none() {
            *edited = Some((GraphDefinition::new(&self.device)?, None));
        }
        let Some((def, last)) = edited.as_mut() else {
            unreachable!("set above")
        };
        let buf = self.device.alloc_zeroed::<i32>(BUF_LEN)?;
        // SAFETY: add_one takes one int*, and `buf` holds 64 ints.
        let node = unsafe {
            def.add_kernel_unchecked(
                &[],
                &self.add_one,
                LaunchConfig::single(),
                &KernelArgs::new().arg(&buf),
            )?
        };
        // The previous cycle's node goes, and with it (no exec uses it any more) its buffer.
        if let Some(previous) = last.replace(node.node()) {
            def.destroy_node(previous)?;
        }
        drop(buf);
        let graph = def.instantiate()?;
        graph.launch(stream)?;
        stream.synchronize()
    }

    fn fork_join(&self, stream: &Stream) -> cuda_graph::Result<()> {
        let p = self.device.create_graph_builder()?.begin_building(Global)?;
        let forks = p.split::<2>()?;
        for (i, fork) in forks.iter().enumerate() {
            // SAFETY: add_one_at takes (int*, int); index 0 or 1 of 64 ints.
            unsafe {
                fork.launch_unchecked(
                    &self.add_one_at,
                    LaunchConfig::single(),
                    &KernelArgs::new().arg(&self.buf).arg(i as i32),
                )?
            };
        }
        p.join(forks)?;
        let graph = p.end_building()?.instantiate()?;
        graph.launch(stream)?;
        stream.synchronize()
    }

    fn conditional(&self, stream: &Stream) -> cuda_graph::Result<()> {
        let p = self.device.create_graph_builder()?.begin_building(Global)?;
        let always = p.create_conditional_handle(Some(1))?;
        {
            let body = p.add_if(&always)?.begin_building(Global)?;
            // SAFETY: add_one takes one int*, and `buf` holds 64 ints.
            unsafe {
                body.launch_unchecked(&self.add_one, LaunchConfig::single(), &self.add_one_args())?
            };
            body.end_building()?;
        }
        let graph = p.end_building()?.instantiate()?;
        graph.launch(stream)?;
        stream.synchronize()
    }

    fn failed_update(&self, stream: &Stream) -> Result<(), String> {
        let crate_err = |e: Error| format!("crate: {e}");
        let capture = |launches: usize| -> cuda_graph::Result<GraphBuilder<Primary, Ended>> {
            let b = self.device.create_graph_builder()?.begin_building(Global)?;
            for _ in 0..launches {
                // SAFETY: add_one takes one int*, and `buf` holds 64 ints.
                unsafe {
                    b.launch_unchecked(&self.add_one, LaunchConfig::single(), &self.add_one_args())?
                };
            }
            b.end_building()
        };
        let graph = capture(1)
            .and_then(|a| a.instantiate())
            .map_err(crate_err)?;
        let other = capture(2).map_err(crate_err)?;
        if graph.update(&other).is_ok() {
            return Err(
                "crate: updating a 1-kernel exec from a 2-kernel graph succeeded; it must fail"
                    .into(),
            );
        }
        graph.launch(stream).map_err(crate_err)?;
        stream.synchronize().map_err(crate_err)
    }

    fn panic_callback(&self, stream: &Stream) -> Result<(), String> {
        let crate_err = |e: Error| format!("crate: {e}");
        let (graph, cb) = (|| -> cuda_graph::Result<(Graph, HostCallback)> {
            let b = self.device.create_graph_builder()?.begin_building(Global)?;
            let cb = b.add_host_callback(|| panic!("soak"))?;
            // SAFETY: add_one takes one int*, and `buf` holds 64 ints.
            unsafe {
                b.launch_unchecked(&self.add_one, LaunchConfig::single(), &self.add_one_args())?
            };
            let graph = b.end_building()?.instantiate()?;
            Ok((graph, cb))
        })()
        .map_err(crate_err)?;
        graph.launch(stream).map_err(crate_err)?;
        stream.synchronize().map_err(crate_err)?;
        // The callback ran on a driver thread before the synchronize returned; allow for the
        // report to become visible.
        let deadline = Instant::now() + Duration::from_secs(2);
        while cb.check().is_ok() {
            if Instant::now() > deadline {
                return Err(format!(
                    "crate: the panicking callback did not report its panic (calls: {:?})",
                    cb.calls()
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        drop(graph);
        Ok(())
    }
}

/// The intentional `panic!("soak")` of the callbacks is not printed; any other panic is.
fn quiet_soak_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        if msg != Some("soak") {
            default(info);
        }
    }));
}

// ---------------------------------------------------------------------------------------------
// The raw side.

#[path = "../benches/support/raw.rs"]
mod raw;
use raw::{ok, require_symbols};

/// The driver entry points every raw cycle and the setup use.
const RAW_COMMON_SYMBOLS: &[&str] = &[
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemGetInfo_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamIsCapturing",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuLaunchKernel",
    "cuGraphInstantiateWithParams",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// A driver object the raw side destroys.
enum Obj {
    /// A stream; `owns_capture`: a capture left running on it made a graph of its own (one begun
    /// with `cuStreamBeginCapture_v2`), not one owned by a conditional node.
    Stream {
        s: sys::CUstream,
        owns_capture: bool,
    },
    Event(sys::CUevent),
    Graph(sys::CUgraph),
    Exec(sys::CUgraphExec),
}

/// The driver objects of one raw cycle (or loop), destroyed in reverse order: checked by
/// [`Owned::destroy`] on the normal path, best effort on drop after an error (a stream left
/// capturing has its capture ended first, so a failed cycle never leaves a global capture behind).
#[derive(Default)]
struct Owned(Vec<Obj>);

impl Owned {
    fn stream(&mut self) -> Result<sys::CUstream, String> {
        self.new_stream(true)
    }

    /// A stream for capturing into a conditional body, which its node owns.
    fn body_stream(&mut self) -> Result<sys::CUstream, String> {
        self.new_stream(false)
    }

    fn new_stream(&mut self, owns_capture: bool) -> Result<sys::CUstream, String> {
        let mut s = null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; `s` is a valid out pointer.
        ok("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, flags)
        })?;
        self.0.push(Obj::Stream { s, owns_capture });
        Ok(s)
    }

    fn event(&mut self) -> Result<sys::CUevent, String> {
        let mut e = null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the context is current; `e` is a valid out pointer.
        ok("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, flags)
        })?;
        self.0.push(Obj::Event(e));
        Ok(e)
    }

    fn graph(&mut self, g: sys::CUgraph) -> sys::CUgraph {
        self.0.push(Obj::Graph(g));
        g
    }

    fn exec(&mut self, e: sys::CUgraphExec) -> sys::CUgraphExec {
        self.0.push(Obj::Exec(e));
        e
    }

    /// Destroys everything, newest first; the first failure is returned after all were tried.
    fn destroy(&mut self) -> Result<(), String> {
        let mut first = Ok(());
        while let Some(obj) = self.0.pop() {
            // SAFETY: each object was created by this `Owned` (or handed to it by the driver) and
            // is destroyed once, here; newest first, so an exec goes before its graph.
            let r = unsafe {
                match obj {
                    Obj::Exec(e) => ok("cuGraphExecDestroy", sys::cuGraphExecDestroy(e)),
                    Obj::Graph(g) => ok("cuGraphDestroy", sys::cuGraphDestroy(g)),
                    Obj::Event(e) => ok("cuEventDestroy_v2", sys::cuEventDestroy_v2(e)),
                    Obj::Stream { s, owns_capture } => {
                        abandon_capture(s, owns_capture);
                        ok("cuStreamDestroy_v2", sys::cuStreamDestroy_v2(s))
                    }
                }
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

/// Ends a capture left running on `s` by a failed cycle, and destroys the graph it made if that
/// graph is its own (`owns_capture`).
fn abandon_capture(s: sys::CUstream, owns_capture: bool) {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `s` is a live stream; `status` is a valid out pointer.
    let r = unsafe { sys::cuStreamIsCapturing(s, &mut status) };
    if r != sys::CUresult::CUDA_SUCCESS
        || status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    {
        return;
    }
    let mut g = null_mut();
    // SAFETY: `s` is capturing (from this thread); `g` is a valid out pointer. A graph handed back
    // by a `cuStreamBeginCapture_v2` capture is ours to destroy; a conditional body is its node's.
    unsafe {
        let _ = sys::cuStreamEndCapture(s, &mut g);
        if owns_capture && !g.is_null() {
            let _ = sys::cuGraphDestroy(g);
        }
    }
}

/// The raw control's long-lived objects: the primary context (shared with the crate), the module
/// and a 64-int buffer.
struct Raw {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    add_one: sys::CUfunction,
    add_one_at: sys::CUfunction,
    buf: sys::CUdeviceptr,
    /// The `edit` loop's long-lived graph, its latest node and that node's buffer.
    edited: std::cell::Cell<(sys::CUgraph, sys::CUgraphNode, sys::CUdeviceptr)>,
    /// Kernel nodes name their context (`CUDA_KERNEL_NODE_PARAMS::ctx`) as the crate's do,
    /// instead of null (`--raw-node-ctx`).
    node_ctx: bool,
    /// The `edit` loop's replaced buffers are freed on a second, long-lived thread, as the
    /// crate's release thread frees what an exec held (`--raw-free-elsewhere`).
    freer: Option<std::sync::mpsc::Sender<sys::CUdeviceptr>>,
    /// A no-op host function is queued after each graph launch (`--raw-host-func`).
    host_func: bool,
}

impl Raw {
    fn new(node_ctx: bool, free_elsewhere: bool, host_func: bool) -> Result<Raw, String> {
        require_symbols(RAW_COMMON_SYMBOLS)?;
        let (dev, ctx) = raw::retain_primary(0)?;
        let freer = free_elsewhere.then(|| {
            let (tx, rx) = std::sync::mpsc::channel::<sys::CUdeviceptr>();
            let ctx_addr = ctx as usize;
            std::thread::spawn(move || {
                // SAFETY: the primary context stays retained while the soak runs.
                unsafe { sys::cuCtxSetCurrent(ctx_addr as sys::CUcontext) };
                for ptr in rx {
                    // SAFETY: `ptr` is an allocation of this context no node or exec uses now.
                    unsafe { sys::cuMemFree_v2(ptr) };
                }
            });
            tx
        });
        let mut raw = Raw {
            dev,
            ctx,
            module: null_mut(),
            add_one: null_mut(),
            add_one_at: null_mut(),
            buf: 0,
            edited: std::cell::Cell::new((null_mut(), null_mut(), 0)),
            node_ctx,
            freer,
            host_func,
        };
        raw.bind()?;
        raw.module = raw::load_module(KERNELS)?;
        raw.add_one = raw.function(c"add_one")?;
        raw.add_one_at = raw.function(c"add_one_at")?;
        let bytes = BUF_LEN * std::mem::size_of::<i32>();
        // SAFETY: the context is current; `buf` is a valid out pointer; the memset stays inside
        // the allocation.
        unsafe {
            ok("cuMemAlloc_v2", sys::cuMemAlloc_v2(&mut raw.buf, bytes))?;
            ok("cuMemsetD8_v2", sys::cuMemsetD8_v2(raw.buf, 0, bytes))?;
        }
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

    /// Device memory in use, device-wide (`cuMemGetInfo_v2`: total - free).
    fn device_used(&self) -> Result<i64, String> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the context is current; both are valid out pointers.
        ok("cuMemGetInfo_v2", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(total as i64 - free as i64)
    }

    /// `add_one(buf)` on `s`, one thread.
    fn add_one(&self, s: sys::CUstream) -> Result<(), String> {
        let mut p = self.buf;
        // SAFETY: add_one takes one int*; the entry points at the device address of `buf`.
        unsafe { launch_single(self.add_one, s, &mut [&mut p as *mut u64 as *mut c_void]) }
    }

    /// `add_one_at(buf, i)` on `s`, one thread.
    fn add_one_at(&self, s: sys::CUstream, i: i32) -> Result<(), String> {
        assert!((i as usize) < BUF_LEN);
        let (mut p, mut i) = (self.buf, i);
        let mut params = [
            &mut p as *mut u64 as *mut c_void,
            &mut i as *mut i32 as *mut c_void,
        ];
        // SAFETY: add_one_at takes (int*, int); the entries point at the device address of `buf`
        // and at an index below its length.
        unsafe { launch_single(self.add_one_at, s, &mut params) }
    }

    fn begin_capture(&self, s: sys::CUstream) -> Result<(), String> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: `s` is a live stream that is not capturing.
        ok("cuStreamBeginCapture_v2", unsafe {
            sys::cuStreamBeginCapture_v2(s, mode)
        })
    }

    /// Ends the capture on `s`; the graph goes to `owned`.
    fn end_capture(&self, s: sys::CUstream, owned: &mut Owned) -> Result<sys::CUgraph, String> {
        let mut g = null_mut();
        // SAFETY: `s` is capturing, begun on this thread; `g` is a valid out pointer.
        let r = unsafe { sys::cuStreamEndCapture(s, &mut g) };
        if !g.is_null() {
            owned.graph(g);
        }
        ok("cuStreamEndCapture", r)?;
        Ok(g)
    }

    /// `cuGraphInstantiateWithParams` with `result_out` checked; the exec goes to `owned`.
    fn instantiate(&self, g: sys::CUgraph, owned: &mut Owned) -> Result<sys::CUgraphExec, String> {
        let mut params = sys::CUDA_GRAPH_INSTANTIATE_PARAMS {
            flags: 0,
            hUploadStream: null_mut(),
            hErrNode_out: null_mut(),
            result_out: sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS,
        };
        let mut exec = null_mut();
        // SAFETY: `g` is a live graph; `params` is fully initialised; `exec` is an out pointer.
        let r = unsafe { sys::cuGraphInstantiateWithParams(&mut exec, g, &mut params) };
        if !exec.is_null() {
            owned.exec(exec);
        }
        ok("cuGraphInstantiateWithParams", r)?;
        if params.result_out != sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS {
            return Err(format!(
                "raw: cuGraphInstantiateWithParams: {:?}",
                params.result_out
            ));
        }
        Ok(exec)
    }

    /// Launches `exec` on `s` and waits for it.
    fn launch_sync(&self, exec: sys::CUgraphExec, s: sys::CUstream) -> Result<(), String> {
        // SAFETY: `exec` and `s` are live.
        unsafe {
            ok("cuGraphLaunch", sys::cuGraphLaunch(exec, s))?;
            // (`raw_host_noop` touches nothing.)
            if self.host_func {
                ok(
                    "cuLaunchHostFunc",
                    sys::cuLaunchHostFunc(s, Some(raw_host_noop), null_mut()),
                )?;
            }
            ok("cuStreamSynchronize", sys::cuStreamSynchronize(s))
        }
    }

    /// One raw cycle of `kind`; `s` is the loop's launch stream.
    fn cycle(&self, kind: Kind, s: sys::CUstream) -> Result<(), String> {
        let mut owned = Owned::default();
        match kind {
            Kind::Capture => self.capture(s, &mut owned)?,
            Kind::Explicit => self.explicit(s, &mut owned)?,
            Kind::ForkJoin => self.fork_join(s, &mut owned)?,
            Kind::Conditional => self.conditional(s, &mut owned)?,
            Kind::FailedUpdate => self.failed_update(s, &mut owned)?,
            Kind::PanicCallback => self.host_func(s, &mut owned)?,
            Kind::Edit => self.edit(s, &mut owned)?,
        }
        owned.destroy()
    }

    fn capture(&self, s: sys::CUstream, owned: &mut Owned) -> Result<(), String> {
        self.begin_capture(s)?;
        for _ in 0..3 {
            self.add_one(s)?;
        }
        let g = self.end_capture(s, owned)?;
        let exec = self.instantiate(g, owned)?;
        self.launch_sync(exec, s)
    }

    fn edit(&self, s: sys::CUstream, owned: &mut Owned) -> Result<(), String> {
        let (mut g, previous, previous_buf) = self.edited.get();
        if g.is_null() {
            // SAFETY: the context is current; `g` is a valid out pointer.
            ok("cuGraphCreate", unsafe { sys::cuGraphCreate(&mut g, 0) })?;
            self.edited.set((g, null_mut(), 0));
        }
        let mut buf = 0;
        let bytes = BUF_LEN * std::mem::size_of::<i32>();
        // SAFETY: the context is current; the memset stays inside the new allocation.
        unsafe {
            ok("cuMemAlloc_v2", sys::cuMemAlloc_v2(&mut buf, bytes))?;
            ok("cuMemsetD8_v2", sys::cuMemsetD8_v2(buf, 0, bytes))?;
        }
        let node = self.kernel_node_on(g, &[], buf)?;
        self.edited.set((g, node, buf));
        if !previous.is_null() {
            // SAFETY: `previous` is a live node of `g`; no exec made from `g` is alive (each
            // cycle destroys its own after its launch finished), so its buffer is unused.
            unsafe { ok("cuGraphDestroyNode", sys::cuGraphDestroyNode(previous))? };
            match &self.freer {
                Some(tx) => tx.send(previous_buf).map_err(|e| e.to_string())?,
                // SAFETY: as above.
                None => ok("cuMemFree_v2", unsafe { sys::cuMemFree_v2(previous_buf) })?,
            }
        }
        let exec = self.instantiate(g, owned)?;
        self.launch_sync(exec, s)
    }

    fn kernel_node(
        &self,
        g: sys::CUgraph,
        deps: &[sys::CUgraphNode],
    ) -> Result<sys::CUgraphNode, String> {
        self.kernel_node_on(g, deps, self.buf)
    }

    /// An `add_one(buf)` kernel node in `g` after `deps`.
    fn kernel_node_on(
        &self,
        g: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        buf: sys::CUdeviceptr,
    ) -> Result<sys::CUgraphNode, String> {
        let mut p = buf;
        let mut args = [&mut p as *mut u64 as *mut c_void];
        let params = sys::CUDA_KERNEL_NODE_PARAMS {
            func: self.add_one,
            gridDimX: 1,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 1,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            kernelParams: args.as_mut_ptr(),
            extra: null_mut(),
            kern: null_mut(),
            ctx: if self.node_ctx { self.ctx } else { null_mut() },
        };
        let mut node = null_mut();
        // SAFETY: `g` is live and `deps` are nodes of it; add_one takes one int* and `args`
        // points at the device address of `buf`, alive during the call (the driver copies it).
        ok("cuGraphAddKernelNode_v2", unsafe {
            sys::cuGraphAddKernelNode_v2(&mut node, g, deps.as_ptr(), deps.len(), &params)
        })?;
        Ok(node)
    }

    fn explicit(&self, s: sys::CUstream, owned: &mut Owned) -> Result<(), String> {
        let mut g = null_mut();
        // SAFETY: the context is current; `g` is a valid out pointer.
        ok("cuGraphCreate", unsafe { sys::cuGraphCreate(&mut g, 0) })?;
        owned.graph(g);
        let memset = sys::CUDA_MEMSET_NODE_PARAMS {
            dst: self.buf,
            pitch: BUF_LEN * 4,
            value: 0,
            elementSize: 4,
            width: BUF_LEN,
            height: 1,
        };
        let mut clear = null_mut();
        // SAFETY: `g` is live; the memset covers exactly the 64 ints of `buf`.
        ok("cuGraphAddMemsetNode", unsafe {
            sys::cuGraphAddMemsetNode(&mut clear, g, null(), 0, &memset, self.ctx)
        })?;
        let first = self.kernel_node(g, &[clear])?;
        self.kernel_node(g, &[first])?;
        let exec = self.instantiate(g, owned)?;
        self.launch_sync(exec, s)
    }

    fn fork_join(&self, s: sys::CUstream, owned: &mut Owned) -> Result<(), String> {
        let cs = owned.stream()?;
        let forks = [owned.stream()?, owned.stream()?];
        let fork_event = owned.event()?;
        let join_events = [owned.event()?, owned.event()?];
        self.begin_capture(cs)?;
        // SAFETY: all streams and events are live; `cs` is capturing, so the forks join it by
        // waiting on an event recorded in it.
        unsafe {
            ok("cuEventRecord", sys::cuEventRecord(fork_event, cs))?;
            for f in forks {
                ok(
                    "cuStreamWaitEvent",
                    sys::cuStreamWaitEvent(f, fork_event, 0),
                )?;
            }
        }
        for (i, f) in forks.into_iter().enumerate() {
            self.add_one_at(f, i as i32)?;
        }
        // SAFETY: as above; the capture stream waits for both forks before it ends.
        unsafe {
            for (f, e) in forks.into_iter().zip(join_events) {
                ok("cuEventRecord", sys::cuEventRecord(e, f))?;
                ok("cuStreamWaitEvent", sys::cuStreamWaitEvent(cs, e, 0))?;
            }
        }
        let g = self.end_capture(cs, owned)?;
        let exec = self.instantiate(g, owned)?;
        self.launch_sync(exec, s)
    }

    fn conditional(&self, s: sys::CUstream, owned: &mut Owned) -> Result<(), String> {
        let cs = owned.stream()?;
        let body_stream = owned.body_stream()?;
        self.begin_capture(cs)?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut graph = null_mut();
        let mut deps_ptr: *const sys::CUgraphNode = null();
        let mut edges_ptr: *const sys::CUgraphEdgeData = null();
        let mut n = 0usize;
        // SAFETY: `cs` is capturing; all out pointers are valid.
        ok("cuStreamGetCaptureInfo_v3", unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                cs,
                &mut status,
                null_mut(),
                &mut graph,
                &mut deps_ptr,
                &mut edges_ptr,
                &mut n,
            )
        })?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            return Err(format!("raw: capture not active: {status:?}"));
        }
        // Copied at once: the driver's arrays are valid until the next capture call.
        let deps: Vec<sys::CUgraphNode> = if deps_ptr.is_null() || n == 0 {
            Vec::new()
        } else {
            // SAFETY: the driver returned `n` dependencies at `deps_ptr`.
            unsafe { std::slice::from_raw_parts(deps_ptr, n) }.to_vec()
        };
        let edges: Vec<sys::CUgraphEdgeData> = if edges_ptr.is_null() || n == 0 {
            Vec::new()
        } else {
            // SAFETY: as above, `n` edge data entries.
            unsafe { std::slice::from_raw_parts(edges_ptr, n) }.to_vec()
        };
        let mut handle = 0;
        // SAFETY: `graph` is the live capture graph; `handle` is a valid out pointer.
        ok("cuGraphConditionalHandleCreate", unsafe {
            sys::cuGraphConditionalHandleCreate(
                &mut handle,
                graph,
                self.ctx,
                1,
                sys::CU_GRAPH_COND_ASSIGN_DEFAULT,
            )
        })?;
        // SAFETY: zeroed node parameters are valid plain C data; the used fields are set below.
        let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
        params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
            handle,
            type_: sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
            size: 1,
            phGraph_out: null_mut(),
            ctx: self.ctx,
        };
        let mut node = null_mut();
        let edge_ptr = if edges.is_empty() {
            null()
        } else {
            edges.as_ptr()
        };
        // SAFETY: `graph` is the live capture graph; `deps`/`edges` hold `deps.len()` entries;
        // `params` is fully initialised.
        ok("cuGraphAddNode_v2", unsafe {
            sys::cuGraphAddNode_v2(
                &mut node,
                graph,
                deps.as_ptr(),
                edge_ptr,
                deps.len(),
                &mut params,
            )
        })?;
        let mut set = [node];
        let flags =
            sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32;
        // SAFETY: `set` holds one node of the capture graph.
        ok("cuStreamUpdateCaptureDependencies_v2", unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(cs, set.as_mut_ptr(), null(), 1, flags)
        })?;
        // SAFETY: after a successful add the driver set `phGraph_out` to the node's one body
        // graph, owned by the node.
        let body = unsafe {
            let out = params.__bindgen_anon_1.conditional.phGraph_out;
            if out.is_null() {
                return Err("raw: the driver returned no conditional body graph".into());
            }
            *out
        };
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: `body_stream` is live and not capturing; `body` is a live graph; no deps.
        ok("cuStreamBeginCaptureToGraph", unsafe {
            sys::cuStreamBeginCaptureToGraph(body_stream, body, null(), null(), 0, mode)
        })?;
        self.add_one(body_stream)?;
        let mut ended = null_mut();
        // SAFETY: `body_stream` is capturing into `body`, which the node owns (not destroyed here).
        ok("cuStreamEndCapture (body)", unsafe {
            sys::cuStreamEndCapture(body_stream, &mut ended)
        })?;
        let g = self.end_capture(cs, owned)?;
        let exec = self.instantiate(g, owned)?;
        self.launch_sync(exec, s)
    }

    fn failed_update(&self, s: sys::CUstream, owned: &mut Owned) -> Result<(), String> {
        let (cs_a, cs_b) = (owned.stream()?, owned.stream()?);
        self.begin_capture(cs_a)?;
        self.add_one(cs_a)?;
        let a = self.end_capture(cs_a, owned)?;
        let exec = self.instantiate(a, owned)?;
        self.begin_capture(cs_b)?;
        self.add_one(cs_b)?;
        self.add_one(cs_b)?;
        let b = self.end_capture(cs_b, owned)?;
        // SAFETY: a zeroed result info is a valid out parameter (plain C data).
        let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
        // SAFETY: `exec` and `b` are live; `info` is a valid out pointer.
        let r = unsafe { sys::cuGraphExecUpdate_v2(exec, b, &mut info) };
        if r == sys::CUresult::CUDA_SUCCESS {
            return Err(
                "raw: cuGraphExecUpdate_v2 from a 2-kernel graph into a 1-kernel exec succeeded"
                    .into(),
            );
        }
        self.launch_sync(exec, s)
    }

    fn host_func(&self, s: sys::CUstream, owned: &mut Owned) -> Result<(), String> {
        let cs = owned.stream()?;
        self.begin_capture(cs)?;
        // SAFETY: `cs` is capturing; `raw_host_noop` ignores its (null) argument and never calls
        // CUDA.
        ok("cuLaunchHostFunc", unsafe {
            sys::cuLaunchHostFunc(cs, Some(raw_host_noop), null_mut())
        })?;
        self.add_one(cs)?;
        let g = self.end_capture(cs, owned)?;
        let exec = self.instantiate(g, owned)?;
        self.launch_sync(exec, s)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.bind();
        let (g, _, buf) = self.edited.get();
        // SAFETY: the `edit` loop's graph and its latest buffer (if any); no exec of the graph
        // is alive.
        unsafe {
            if !g.is_null() {
                let _ = sys::cuGraphDestroy(g);
            }
            if buf != 0 {
                let _ = sys::cuMemFree_v2(buf);
            }
        }
        // SAFETY: `buf` and `module` were made in `new` (or are null/0 when it failed part-way),
        // and every graph using them is destroyed; the primary context was retained once.
        let results = unsafe {
            [
                (self.buf != 0).then(|| ok("cuMemFree_v2", sys::cuMemFree_v2(self.buf))),
                (!self.module.is_null())
                    .then(|| ok("cuModuleUnload", sys::cuModuleUnload(self.module))),
                Some(ok(
                    "cuDevicePrimaryCtxRelease_v2",
                    sys::cuDevicePrimaryCtxRelease_v2(self.dev),
                )),
            ]
        };
        for e in results.into_iter().flatten().filter_map(Result::err) {
            eprintln!("soak: cleanup: {e}");
        }
    }
}

unsafe extern "C" fn raw_host_noop(_user_data: *mut c_void) {}

/// Launches `f` on `s` with one block of one thread (`cuLaunchKernel`).
///
/// # Safety
///
/// `params` matches `f`'s parameters: one entry per parameter, each pointing at a value of its
/// type (the driver copies them during the call); `s` is a live stream.
unsafe fn launch_single(
    f: sys::CUfunction,
    s: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), String> {
    // SAFETY: the caller's contract.
    let r =
        unsafe { sys::cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.as_mut_ptr(), null_mut()) };
    ok("cuLaunchKernel", r)
}

// ---------------------------------------------------------------------------------------------
// Measurement.

#[derive(Debug, Clone, Copy)]
struct Reading {
    rss: Option<i64>,
    dev: i64,
    heap: i64,
}

/// Growth over one run of `n` cycles, in bytes over the whole run.
#[derive(Debug, Clone, Copy)]
struct Growth {
    n: u64,
    rss: Option<i64>,
    dev: i64,
    heap: i64,
    elapsed: Duration,
}

impl Growth {
    fn per_1000(&self, bytes: i64) -> f64 {
        bytes as f64 * 1000.0 / self.n as f64
    }
    fn micros_per_cycle(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e6 / self.n as f64
    }
}

/// Waits for the crate's release thread: a fixed pause, then until the Rust heap stops changing.
fn settle() {
    std::thread::sleep(SETTLE);
    let mut last = live_heap();
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(25));
        let now = live_heap();
        if now == last {
            break;
        }
        last = now;
    }
}

struct Meter<'a> {
    raw: &'a Raw,
    page: u64,
}

impl Meter<'_> {
    fn read(&self) -> Result<Reading, String> {
        Ok(Reading {
            rss: rss_bytes(self.page),
            dev: self.raw.device_used()?,
            heap: live_heap(),
        })
    }

    /// Runs `cycle` `n` times between two settled readings.
    fn measure(
        &self,
        n: u64,
        mut cycle: impl FnMut() -> Result<(), String>,
    ) -> Result<Growth, String> {
        settle();
        let before = self.read()?;
        let start = Instant::now();
        for i in 0..n {
            cycle().map_err(|e| format!("cycle {}: {e}", i + 1))?;
        }
        let elapsed = start.elapsed();
        settle();
        let after = self.read()?;
        Ok(Growth {
            n,
            rss: before.rss.zip(after.rss).map(|(b, a)| a - b),
            dev: after.dev - before.dev,
            heap: after.heap - before.heap,
            elapsed,
        })
    }
}

fn fmt_bytes(v: f64) -> String {
    let a = v.abs();
    let sign = if v < 0.0 && a >= 0.5 { '-' } else { '+' };
    if a < 1024.0 {
        format!("{sign}{a:.0} B")
    } else if a < 1024.0 * 1024.0 {
        format!("{sign}{:.1} KiB", a / 1024.0)
    } else {
        format!("{sign}{:.1} MiB", a / (1024.0 * 1024.0))
    }
}

/// A size without sign.
fn fmt_size(v: f64) -> String {
    fmt_bytes(v).trim_start_matches('+').to_string()
}

fn fmt_rss(g: &Growth) -> String {
    match g.rss {
        Some(r) => fmt_bytes(g.per_1000(r)),
        None => "n/a".into(),
    }
}

/// Whether the crate stays within the tolerance of the raw control, and why not.
fn judge(c: &Growth, r: &Growth, page: u64) -> (bool, Vec<String>) {
    let mut why = Vec::new();
    // RSS moves in pages: never ask for less than one page over the run.
    let rss_tol = TOLERANCE_PER_1000.max(c.per_1000(page as i64));
    if let (Some(cr), Some(rr)) = (c.rss, r.rss) {
        let excess = c.per_1000(cr) - r.per_1000(rr);
        if excess > rss_tol {
            why.push(format!(
                "host RSS grows {}/1000 more than the raw control (allowed: {}/1000)",
                fmt_bytes(excess),
                fmt_size(rss_tol)
            ));
        }
    }
    let excess = c.per_1000(c.dev) - r.per_1000(r.dev);
    if excess > TOLERANCE_PER_1000 {
        why.push(format!(
            "device memory grows {}/1000 more than the raw control (allowed: {}/1000)",
            fmt_bytes(excess),
            fmt_size(TOLERANCE_PER_1000)
        ));
    }
    (why.is_empty(), why)
}

fn line(kind: Kind, c: &Growth, r: &Growth, verdict: &str) -> String {
    format!(
        "{:<15} crate: rss {}/1000  dev {}/1000  heap {}/1000 | raw: rss {}/1000  dev {}/1000 | {verdict}",
        kind.name(),
        fmt_rss(c),
        fmt_bytes(c.per_1000(c.dev)),
        fmt_bytes(c.per_1000(c.heap)),
        fmt_rss(r),
        fmt_bytes(r.per_1000(r.dev)),
    )
}

/// What the growth points at, for a loop that is not flat.
fn diagnose(c: &Growth, r: &Growth, page: u64) -> Vec<String> {
    let mut notes = Vec::new();
    let heap = c.per_1000(c.heap);
    if heap > TOLERANCE_PER_1000 {
        notes.push(format!(
            "the crate side's live Rust heap grows {}/1000: Rust values (the crate's, or closures \
             it keeps) are never freed",
            fmt_bytes(heap)
        ));
    } else {
        notes.push(
            "the crate side's live Rust heap is flat: the growth is outside Rust, i.e. driver \
             objects (graphs, execs, streams, events, user objects) the crate does not destroy"
                .into(),
        );
    }
    let raw_grows = r
        .rss
        .is_some_and(|x| r.per_1000(x) > TOLERANCE_PER_1000.max(r.per_1000(page as i64)))
        || r.per_1000(r.dev) > TOLERANCE_PER_1000;
    if raw_grows {
        notes.push(
            "the raw control grows too: the driver itself keeps memory; the crate is judged \
             relative to it"
                .into(),
        );
    }
    notes
}

enum Verdict {
    Flat,
    Growing,
    Failed(String),
    Skipped(String),
}

struct Outcome {
    kind: Kind,
    verdict: Verdict,
    /// The last measurement: crate, raw.
    growth: Option<(Growth, Growth)>,
    rounds: u32,
}

fn say(s: impl AsRef<str>) {
    println!("{}", s.as_ref());
    let _ = std::io::stdout().flush();
}

/// Why `kind` cannot run here, if it cannot.
fn unavailable(kind: Kind, cs: &CrateSide) -> Option<String> {
    if kind != Kind::Conditional {
        return None;
    }
    match cuda_graph::driver_version() {
        Ok(v) if v < DriverVersion::V12_3 => {
            return Some(format!(
                "conditional nodes need driver 12.3, this one is {v}"
            ))
        }
        Ok(_) => {}
        Err(e) => return Some(format!("driver version unknown: {e}")),
    }
    match cs.device.compute_capability() {
        Ok(cc) if cc < (9, 0) => Some(format!(
            "as in the GPU suite, conditional nodes are soaked on compute capability 9.0+, this \
             device is {}.{}",
            cc.0, cc.1
        )),
        Ok(_) => None,
        Err(e) => Some(format!("compute capability unknown: {e}")),
    }
}

fn soak_loop(kind: Kind, cs: &CrateSide, raw: &Raw, opts: &Options, page: u64) -> Outcome {
    let mut outcome = Outcome {
        kind,
        verdict: Verdict::Flat,
        growth: None,
        rounds: 0,
    };
    if let Some(why) = unavailable(kind, cs) {
        say(format!("{:<15} skipped: {why}", kind.name()));
        outcome.verdict = Verdict::Skipped(why);
        return outcome;
    }
    match run_rounds(kind, cs, raw, opts, page, &mut outcome) {
        Ok(v) => outcome.verdict = v,
        Err(e) => {
            say(format!("{:<15} FAILED: {e}", kind.name()));
            outcome.verdict = Verdict::Failed(e);
        }
    }
    outcome
}

fn run_rounds(
    kind: Kind,
    cs: &CrateSide,
    raw: &Raw,
    opts: &Options,
    page: u64,
    outcome: &mut Outcome,
) -> Result<Verdict, String> {
    require_symbols(kind.raw_symbols())?;
    let stream = cs
        .device
        .create_stream()
        .map_err(|e| format!("crate: {e}"))?;
    raw.bind()?;
    let mut loop_owned = Owned::default();
    let rs = loop_owned.stream()?;
    let meter = Meter { raw, page };
    let crate_cycle = || {
        if opts.raw_only {
            return Ok(());
        }
        cs.cycle(kind, &stream)
    };
    let raw_cycle = || {
        raw.bind()?;
        raw.cycle(kind, rs)
    };

    if let Some(side) = opts.side {
        // A child: warm up and measure this side only, two rounds, and report them.
        for i in 0..opts.warmup {
            match side {
                Side::Crate => crate_cycle(),
                Side::Raw => raw_cycle(),
            }
            .map_err(|e| format!("warm-up cycle {}: {e}", i + 1))?;
        }
        for round in 1..=2 {
            let g = match side {
                Side::Crate => meter.measure(opts.cycles, crate_cycle)?,
                Side::Raw => meter.measure(opts.cycles, raw_cycle)?,
            };
            say(format!(
                "{SIDE_TAG} {round} {} {} {} {}",
                g.rss.map_or("-".to_string(), |v| v.to_string()),
                g.dev,
                g.heap,
                g.elapsed.as_nanos()
            ));
        }
        drop(stream);
        loop_owned.destroy()?;
        return Ok(Verdict::Flat);
    }
    let separate = if opts.in_process {
        for i in 0..opts.warmup {
            crate_cycle().map_err(|e| format!("warm-up cycle {}: {e}", i + 1))?;
        }
        raw.bind()?;
        for i in 0..opts.warmup {
            raw.cycle(kind, rs)
                .map_err(|e| format!("warm-up cycle {}: {e}", i + 1))?;
        }
        None
    } else {
        Some((
            measure_in_child(kind, Side::Crate, opts)?,
            measure_in_child(kind, Side::Raw, opts)?,
        ))
    };

    let mut verdict = Verdict::Growing;
    for round in 1..=2 {
        outcome.rounds = round;
        let (c, r) = match &separate {
            Some((c, r)) => (c[round as usize - 1], r[round as usize - 1]),
            None => (
                meter.measure(opts.cycles, crate_cycle)?,
                meter.measure(opts.cycles, raw_cycle)?,
            ),
        };
        outcome.growth = Some((c, r));
        let (flat, why) = judge(&c, &r, page);
        let text = match (flat, round) {
            (true, 1) => "flat".to_string(),
            (true, _) => "flat (the first measurement's growth was a one-off step)".to_string(),
            (false, 1) => {
                "not flat; measuring again to tell steady growth from a one-off step".to_string()
            }
            (false, _) => "GROWING (again)".to_string(),
        };
        say(line(kind, &c, &r, &text));
        if !flat {
            let notes = if round == 1 {
                Vec::new()
            } else {
                diagnose(&c, &r, page)
            };
            for w in why.iter().chain(notes.iter()) {
                say(format!("{:<15}   {w}", ""));
            }
        }
        if flat {
            verdict = Verdict::Flat;
            break;
        }
    }
    drop(stream);
    loop_owned.destroy()?;
    Ok(verdict)
}

/// What a child measuring one side prints per round: the tag, the round, then the RSS growth
/// (`-` when unreadable), device-memory growth and live-heap growth in bytes, and the elapsed
/// nanoseconds.
const SIDE_TAG: &str = "soak-side-round";

/// Measures one side of loop `kind` in a fresh process of this binary (`--side`), so neither
/// side runs in memory the other freed: two rounds of `opts.cycles` after `opts.warmup` cycles.
fn measure_in_child(kind: Kind, side: Side, opts: &Options) -> Result<[Growth; 2], String> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--only", kind.name(), "--side", side.name()])
        .args(["--cycles", &opts.cycles.to_string()])
        .args(["--warmup", &opts.warmup.to_string()]);
    if opts.raw_node_ctx {
        cmd.arg("--raw-node-ctx");
    }
    if opts.raw_free_elsewhere {
        cmd.arg("--raw-free-elsewhere");
    }
    if opts.raw_host_func {
        cmd.arg("--raw-host-func");
    }
    if opts.raw_only {
        cmd.arg("--raw-only");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("{} side: cannot start a child: {e}", side.name()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rounds = Vec::new();
    for l in text.lines().filter(|l| l.starts_with(SIDE_TAG)) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| -> Result<i64, String> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{} side: unreadable line `{l}`", side.name()))
        };
        rounds.push(Growth {
            n: opts.cycles,
            rss: f.get(2).and_then(|v| v.parse().ok()),
            dev: num(3)?,
            heap: num(4)?,
            elapsed: Duration::from_nanos(num(5)?.max(0) as u64),
        });
    }
    match <[Growth; 2]>::try_from(rounds) {
        Ok(r) if out.status.success() => Ok(r),
        _ => {
            // The child's own FAILED line says why; else what it wrote to stderr.
            let err = String::from_utf8_lossy(&out.stderr);
            let why = text
                .lines()
                .find_map(|l| l.split_once("FAILED: ").map(|(_, why)| why.to_string()))
                .or_else(|| {
                    err.lines()
                        .find(|l| !l.trim().is_empty())
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "no result".to_string());
            Err(format!(
                "{} side (child, {}): {why}",
                side.name(),
                out.status
            ))
        }
    }
}

fn summary(outcomes: &[Outcome], opts: &Options) {
    say("");
    say(format!(
        "summary ({} cycles per loop and side; growth per 1000 cycles; flat = crate within {}/1000 of raw, host RSS and device memory)",
        opts.cycles,
        fmt_size(TOLERANCE_PER_1000)
    ));
    say(format!(
        "{:<15} {:>11} {:>11} {:>11} | {:>11} {:>11} | {:>9} {:>9} | verdict",
        "loop", "crate rss", "crate dev", "crate heap", "raw rss", "raw dev", "crate µs", "raw µs"
    ));
    for o in outcomes {
        let verdict = match &o.verdict {
            Verdict::Flat if o.rounds > 1 => "flat (2nd measurement)".to_string(),
            Verdict::Flat => "flat".to_string(),
            Verdict::Growing => "GROWING".to_string(),
            Verdict::Failed(e) => format!("FAILED: {e}"),
            Verdict::Skipped(why) => format!("skipped: {why}"),
        };
        match &o.growth {
            Some((c, r)) => say(format!(
                "{:<15} {:>11} {:>11} {:>11} | {:>11} {:>11} | {:>9.1} {:>9.1} | {verdict}",
                o.kind.name(),
                fmt_rss(c),
                fmt_bytes(c.per_1000(c.dev)),
                fmt_bytes(c.per_1000(c.heap)),
                fmt_rss(r),
                fmt_bytes(r.per_1000(r.dev)),
                c.micros_per_cycle(),
                r.micros_per_cycle(),
            )),
            None => say(format!(
                "{:<15} {:>11} {:>11} {:>11} | {:>11} {:>11} | {:>9} {:>9} | {verdict}",
                o.kind.name(),
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-"
            )),
        }
    }
}

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("soak: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };

    // No `sys` call before this succeeds: cudarc's loader panics without libcuda.
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!("soak: skipped: no usable CUDA device ({e})");
            return ExitCode::SUCCESS;
        }
    };
    quiet_soak_panics();
    let cs = match CrateSide::new(device) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("soak: setup failed (crate side): {e}");
            return ExitCode::FAILURE;
        }
    };
    let raw = match Raw::new(
        opts.raw_node_ctx,
        opts.raw_free_elsewhere,
        opts.raw_host_func,
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soak: setup failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let page = page_size();

    let name = cs.device.name().unwrap_or_else(|e| format!("? ({e})"));
    let cc = cs
        .device
        .compute_capability()
        .map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_else(|_| "?".into());
    let driver = cuda_graph::driver_version()
        .map(|v| v.to_string())
        .unwrap_or_else(|_| "?".into());
    say(format!(
        "soak: {name} (compute capability {cc}), driver {driver}; {} measured cycles per loop and side after {} warm-up cycles",
        opts.cycles, opts.warmup
    ));
    say(format!(
        "soak: per loop, growth per 1000 cycles of host RSS, device memory (device-wide) and the crate side's live Rust heap; \
         flat = crate within {}/1000 of the raw driver control for RSS and device memory (RSS: at least one {} page over the run)",
        fmt_size(TOLERANCE_PER_1000),
        fmt_size(page as f64)
    ));
    if rss_bytes(page).is_none() {
        say("soak: /proc/self/statm is unreadable here: host RSS is not measured");
    }

    let started = Instant::now();
    let kinds: Vec<Kind> = match opts.only {
        Some(k) => vec![k],
        None => KINDS.to_vec(),
    };
    let outcomes: Vec<Outcome> = kinds
        .into_iter()
        .map(|k| soak_loop(k, &cs, &raw, &opts, page))
        .collect();
    summary(&outcomes, &opts);

    let count = |f: fn(&Verdict) -> bool| outcomes.iter().filter(|o| f(&o.verdict)).count();
    let flat = count(|v| matches!(v, Verdict::Flat));
    let growing = count(|v| matches!(v, Verdict::Growing));
    let failed = count(|v| matches!(v, Verdict::Failed(_)));
    let skipped = count(|v| matches!(v, Verdict::Skipped(_)));
    let mut last = format!(
        "soak: {} loops, {flat} flat, {growing} growing",
        outcomes.len()
    );
    if failed > 0 {
        last += &format!(", {failed} failed");
    }
    if skipped > 0 {
        last += &format!(", {skipped} skipped");
    }
    say(format!(
        "soak: took {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    say(last);

    drop(raw);
    drop(cs);
    let growing_fails = if opts.report_only { 0 } else { growing };
    if growing_fails + failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
