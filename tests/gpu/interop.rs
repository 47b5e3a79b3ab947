//! Handles this crate did not make: a raw `CUstream`, a raw `CUfunction` and raw device memory,
//! wrapped with an owner value the crate keeps alive for as long as anything uses them; and
//! cuBLAS captured between two of the crate's kernels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cuda_graph::prelude::*;

use cuda_graph::NodeType;
use cudarc::driver::sys;

use crate::args;
use crate::support::{eventually, one, Gpu, Needs, TestResult, KERNELS};
use cudarc::cublas::{result as blas, sys as blas_sys};

crate::gpu_tests! {
    "interop";
    Needs::Gpu =>
        capture_on_a_raw_stream_keeps_its_owner_until_the_last_use,
        raw_kernel_in_a_capture_and_a_definition,
        raw_buffer_is_held_like_an_allocation_until_the_last_use,
        kernel_nodes_are_made_after_other_code_left_no_context_current,
        every_operation_survives_other_code_leaving_no_context_current,
        every_operation_survives_other_code_leaving_another_context_current,
        the_legacy_default_stream_is_bound_even_after_other_code_bound_another_context;
    Needs::Cublas => cublas_gemm_between_two_kernels_in_one_graph;
}

/// Makes device 0's primary context current for raw calls (retained once more; released by
/// the guard).
struct Current;

impl Current {
    fn new() -> Result<Self, String> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the crate opened device 0, so the driver is loaded and the entry points exist.
        let r = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, 0) };
        check(r, "cuDevicePrimaryCtxRetain")?;
        // SAFETY: `ctx` was just retained.
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
        Ok(Current)
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        // SAFETY: retained in `new`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(0) };
    }
}

fn check(r: sys::CUresult, call: &str) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}"))
    }
}

/// A raw stream that the test owns: destroyed (and noted) when the owner value is dropped.
struct RawStream {
    raw: usize,
    dropped: Arc<AtomicBool>,
}

impl Drop for RawStream {
    fn drop(&mut self) {
        // SAFETY: created by the test, destroyed once, here; the driver lets pending work finish.
        unsafe { sys::cuStreamDestroy_v2(self.raw as sys::CUstream) };
        self.dropped.store(true, Ordering::SeqCst);
    }
}

fn capture_on_a_raw_stream_keeps_its_owner_until_the_last_use(gpu: &Gpu) -> TestResult {
    let _current = Current::new()?;
    let add_one = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let mut raw = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: the context is current; `raw` is a valid out pointer.
    check(
        unsafe { sys::cuStreamCreate(&mut raw, flags) },
        "cuStreamCreate",
    )?;
    let dropped = Arc::new(AtomicBool::new(false));
    let owner = RawStream {
        raw: raw as usize,
        dropped: dropped.clone(),
    };
    // SAFETY: `raw` is a stream of device 0's primary context, destroyed only by `owner`.
    let stream = unsafe { Stream::from_raw(&gpu.device, raw, owner) };
    assert_eq!(stream.as_raw(), raw);

    let b = stream.create_graph_builder().begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { b.launch_unchecked(&add_one, one(), &args![&buf])? };
    // Work issued on the raw handle behind the crate's back is recorded too (its operands are
    // the caller's to keep alive: `buf` outlives the graph here).
    let mut p = buf.device_ptr();
    let mut params = [(&mut p as *mut u64).cast::<std::ffi::c_void>()];
    // SAFETY: add_one(int*) with a live buffer; the stream is capturing.
    let r = unsafe {
        sys::cuLaunchKernel(
            add_one.as_raw(),
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream.as_raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check(r, "cuLaunchKernel")?;
    let g = b.end_building()?.instantiate()?;
    g.launch(&stream)?;
    g.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(
        buf.to_vec()?,
        [4],
        "two launches of a graph of two add_one nodes"
    );
    drop(stream);
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the graph's last launch stream still holds the owner"
    );
    drop(g);
    assert!(
        eventually(|| dropped.load(Ordering::SeqCst)),
        "the owner is dropped after the last use"
    );
    Ok(())
}

/// A raw module the test owns: unloaded (and noted) when the owner value is dropped.
struct RawModule {
    raw: usize,
    dropped: Arc<AtomicBool>,
}

impl Drop for RawModule {
    fn drop(&mut self) {
        // SAFETY: loaded by the test, unloaded once, here, after everything that launches its
        // kernels is gone.
        unsafe { sys::cuModuleUnload(self.raw as sys::CUmodule) };
        self.dropped.store(true, Ordering::SeqCst);
    }
}

fn raw_kernel_in_a_capture_and_a_definition(gpu: &Gpu) -> TestResult {
    let _current = Current::new()?;
    let mut image = vec![0u64; KERNELS.len() / 8 + 1];
    // SAFETY: `image` holds at least `KERNELS.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(KERNELS.as_ptr(), image.as_mut_ptr().cast(), KERNELS.len())
    };
    let mut module = std::ptr::null_mut();
    // SAFETY: the context is current; `image` is the shipped fatbin, 8-byte aligned.
    let r = unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) };
    check(r, "cuModuleLoadData")?;
    let mut f = std::ptr::null_mut();
    // SAFETY: `module` is loaded; the name is NUL-terminated.
    let r = unsafe { sys::cuModuleGetFunction(&mut f, module, c"add_one".as_ptr()) };
    check(r, "cuModuleGetFunction")?;
    let dropped = Arc::new(AtomicBool::new(false));
    let owner = RawModule {
        raw: module as usize,
        dropped: dropped.clone(),
    };
    // SAFETY: `f` is a kernel of a module loaded in device 0's primary context, which `owner`
    // keeps loaded.
    let k = unsafe { Function::from_raw(&gpu.device, f, "add_one", owner) };
    assert_eq!((k.name(), k.as_raw()), ("add_one", f));

    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    // SAFETY: add_one(int*).
    unsafe { b.launch_unchecked(&k, one(), &args![&buf])? };
    let captured = b.end_building()?.instantiate()?;
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    unsafe { def.add_kernel_unchecked(&[], &k, one(), &args![&buf])? };
    let explicit = def.instantiate()?;
    drop((k, def));
    let s = gpu.stream();
    captured.launch(&s)?;
    explicit.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [2]);
    assert!(!dropped.load(Ordering::SeqCst), "the execs still launch it");
    drop((captured, explicit));
    assert!(
        eventually(|| dropped.load(Ordering::SeqCst)),
        "the module's owner is dropped after the last exec"
    );
    Ok(())
}

/// The context current when this was made, made current again when it is dropped (also when a
/// test fails halfway), so that later tests on this thread start as they would have.
struct RestoreCurrent(usize);

impl RestoreCurrent {
    fn new() -> Result<Self, String> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out pointer.
        check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
        Ok(RestoreCurrent(ctx as usize))
    }
}

impl Drop for RestoreCurrent {
    fn drop(&mut self) {
        // SAFETY: the context was current when this was made and is retained by the crate's
        // handles (the test's `Gpu`), which outlive this guard.
        unsafe { sys::cuCtxSetCurrent(self.0 as sys::CUcontext) };
    }
}

/// A context the test made (`cuCtxCreate`), destroyed when dropped.
struct OtherContext(usize);

impl OtherContext {
    fn new() -> Result<Self, String> {
        let mut raw = std::ptr::null_mut();
        // Made and pushed (the thread's context stack one deeper), then popped again below: the
        // tests make it current by replacing the top, as other libraries do.
        // The 12.x bindings declare `cuCtxCreate_v2`, the 13.x ones only `cuCtxCreate_v4`.
        #[cfg(any(
            feature = "cuda-12030",
            feature = "cuda-12040",
            feature = "cuda-12050",
            feature = "cuda-12060",
            feature = "cuda-12080",
            feature = "cuda-12090"
        ))]
        // SAFETY: `raw` is a valid out pointer; device 0 exists (the crate opened it).
        let r = unsafe { sys::cuCtxCreate_v2(&mut raw, 0, 0) };
        #[cfg(not(any(
            feature = "cuda-12030",
            feature = "cuda-12040",
            feature = "cuda-12050",
            feature = "cuda-12060",
            feature = "cuda-12080",
            feature = "cuda-12090"
        )))]
        // SAFETY: as above; zeroed creation parameters ask for a plain context.
        let r = unsafe {
            let mut params: sys::CUctxCreateParams = std::mem::zeroed();
            sys::cuCtxCreate_v4(&mut raw, &mut params, 0, 0)
        };
        check(r, "cuCtxCreate")?;
        let mut popped = std::ptr::null_mut();
        // SAFETY: the context just made is current (pushed); `popped` is a valid out pointer.
        check(
            unsafe { sys::cuCtxPopCurrent_v2(&mut popped) },
            "cuCtxPopCurrent",
        )?;
        assert_eq!(popped, raw, "the new context was on top");
        Ok(OtherContext(raw as usize))
    }

    /// Makes it current on this thread, behind the crate's back.
    fn make_current(&self) -> TestResult {
        // SAFETY: the context lives until `self` is dropped.
        check(
            unsafe { sys::cuCtxSetCurrent(self.0 as sys::CUcontext) },
            "cuCtxSetCurrent",
        )?;
        assert_eq!(current()? as usize, self.0, "the other context is current");
        Ok(())
    }
}

impl Drop for OtherContext {
    fn drop(&mut self) {
        // SAFETY: made by the test, used by nothing of the crate's, destroyed once.
        unsafe { sys::cuCtxDestroy_v2(self.0 as sys::CUcontext) };
    }
}

/// Leaves no context current on this thread, as a library that destroyed or popped its own
/// context does, behind the crate's record of what it bound last.
fn unset_current() -> TestResult {
    // Setting none pops the top of the thread's context stack: pop until none is current.
    for _ in 0..16 {
        if current()?.is_null() {
            return Ok(());
        }
        // SAFETY: setting no context is always allowed.
        check(
            unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) },
            "cuCtxSetCurrent",
        )?;
    }
    Err("a context stayed current".into())
}

/// The thread's current context.
fn current() -> Result<sys::CUcontext, String> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out pointer.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    Ok(ctx)
}

fn kernel_nodes_are_made_after_other_code_left_no_context_current(gpu: &Gpu) -> TestResult {
    // The driver crashes making a kernel node with no context current (driver 13.0), so the
    // crate asks the driver for it instead of trusting its own record on this path.
    let _restore = RestoreCurrent::new()?;
    let k = gpu.f("add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let typed = {
        // SAFETY: add_one(int*) touches p[0] of the one-int buffer.
        unsafe { gpu.module.kernel::<(*mut i32,)>("add_one")? }
    };
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    let first = unsafe { def.add_kernel_unchecked(&[], &k, one(), &args![&buf])? };
    unset_current()?;
    // SAFETY: as above.
    let second = unsafe { def.add_kernel_unchecked(&[&first], &k, one(), &args![&buf])? };
    unset_current()?;
    let third = def.add_kernel(&[&second], &typed, one(), &buf)?;
    unset_current()?;
    // SAFETY: as above.
    def.set_params(&third, unsafe {
        NodeParams::kernel_unchecked(&k, one(), args![&buf])
    })?;
    unset_current()?;
    let g = def.instantiate()?;
    unset_current()?;
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [3], "each of the three nodes ran once");
    Ok(())
}

fn every_operation_survives_other_code_leaving_no_context_current(gpu: &Gpu) -> TestResult {
    // Another library destroyed or popped its own context before each operation.
    let _restore = RestoreCurrent::new()?;
    every_operation_after(gpu, "no context current", &unset_current)
}

fn every_operation_survives_other_code_leaving_another_context_current(gpu: &Gpu) -> TestResult {
    // Another library made its own context current before each operation.
    let _restore = RestoreCurrent::new()?;
    // Dropped before `_restore`: destroyed (popped), then the old context made current.
    let other = OtherContext::new()?;
    let leave = || other.make_current();
    every_operation_after(gpu, "another context current", &leave)
}

fn the_legacy_default_stream_is_bound_even_after_other_code_bound_another_context(
    gpu: &Gpu,
) -> TestResult {
    // The legacy default stream's handle names the legacy stream of whichever context is
    // current: work on it must bind the stream's own context, even where the crate's record says
    // it is bound and another library has since made its own context current.
    let _restore = RestoreCurrent::new()?;
    let other = OtherContext::new()?;
    // SAFETY: add_one(int*) touches p[0] of the one-int buffer.
    let k = unsafe { gpu.module.kernel::<(*mut i32,)>("add_one")? };
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    // SAFETY: handle 1 is `CU_STREAM_LEGACY`; with device 0's primary context current (the crate
    // binds it for work on the stream) it names that context's legacy default stream, which
    // lives as long as the context; it is never captured.
    let s = unsafe { Stream::from_raw(&gpu.device, 1 as sys::CUstream, ()) };
    s.synchronize()?;
    other.make_current()?;
    s.launch(&k, one(), &buf)?;
    other.make_current()?;
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [1], "the launch ran in the stream's context");
    Ok(())
}

/// Runs every kind of operation, each after `leave` changed the current context behind the
/// crate's back: each must work (or return an error), never crash. A crash kills the suite; the
/// last step printed names the operation.
fn every_operation_after(gpu: &Gpu, what: &str, leave: &dyn Fn() -> TestResult) -> TestResult {
    let step = |op: &str| -> TestResult {
        eprintln!("{what}: {op}");
        leave()
    };
    // SAFETY: add_one(int*) touches p[0] of the buffers it is given.
    let typed = unsafe { gpu.module.kernel::<(*mut i32,)>("add_one")? };
    let k = gpu.f("add_one");
    let s = gpu.stream();
    step("alloc")?;
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    let other = gpu.device.alloc_zeroed::<i32>(4)?;
    step("event")?;
    let event = gpu.device.create_event()?;
    step("launch")?;
    s.launch(&typed, one(), &buf)?;
    step("launch_unchecked")?;
    // SAFETY: add_one(int*).
    unsafe { s.launch_unchecked(&k, one(), &args![&buf])? };
    step("memset")?;
    s.memset_d8(&other, 0)?;
    step("memcpy_dtod")?;
    s.memcpy_dtod(&other, &buf)?;
    step("record")?;
    s.record(&event)?;
    step("wait")?;
    s.wait(&event)?;
    step("synchronize")?;
    s.synchronize()?;
    step("to_vec")?;
    assert_eq!(buf.to_vec()?[0], 2);
    step("capture")?;
    let b = s.create_graph_builder().begin_building(Relaxed)?;
    step("captured launch")?;
    b.launch(&typed, one(), &buf)?;
    step("captured memset")?;
    b.memset_d8(&other, 0)?;
    step("captured memcpy")?;
    b.memcpy_dtod(&other, &buf)?;
    step("split")?;
    let [left, right] = b.split::<2>()?;
    step("a fork's launch")?;
    left.launch(&typed, one(), &other)?;
    step("the other fork's launch")?;
    right.launch(&typed, one(), &other)?;
    step("join")?;
    b.join([left, right])?;
    step("captured host callback")?;
    let _calls = b.add_host_callback(|| {})?;
    step("captured child graph")?;
    let small = GraphDefinition::new(&gpu.device)?;
    small.add_empty(&[])?;
    b.add_child_graph(&small)?;
    step("captured conditional")?;
    // Conditional nodes need driver 12.3: an older driver's error is fine here.
    if let Ok(handle) = b.create_conditional_handle(Some(0)) {
        step("captured add_if")?;
        let body = b.add_if(&handle)?;
        step("a body's capture")?;
        let body = body.begin_building(Relaxed)?;
        step("a body's launch")?;
        body.launch(&typed, one(), &other)?;
        step("a body's end")?;
        body.end_building()?;
    }
    step("end capture")?;
    let captured = b.end_building()?;
    step("instantiate the capture")?;
    let captured = captured.instantiate()?;

    step("definition")?;
    let def = GraphDefinition::new(&gpu.device)?;
    step("add_kernel")?;
    let a = def.add_kernel(&[], &typed, one(), &buf)?;
    step("add_memset")?;
    let m = def.add_memset(&[&a], &other, 0)?;
    step("add_memcpy")?;
    let c = def.add_memcpy(&[&m], &other, &buf)?;
    step("add_empty")?;
    let e = def.add_empty(&[&c])?;
    step("join")?;
    let j = def.join(&[&e, &c])?;
    step("add_event_record")?;
    let r = def.add_event_record(&[&j], &event)?;
    step("add_event_wait")?;
    let w = def.add_event_wait(&[&r], &event)?;
    step("add_host_callback")?;
    let (h, _calls) = def.add_host_callback(&[&w], || {})?;
    step("add_child_graph")?;
    let child = GraphDefinition::new(&gpu.device)?;
    child.add_kernel(&[], &typed, one(), &buf)?;
    def.add_child_graph(&[&h], &child)?;
    step("add_edge")?;
    let spare = def.add_empty(&[])?;
    def.add_edge(&spare, &a)?;
    step("remove_edge")?;
    def.remove_edge(&spare, &a)?;
    step("destroy_node")?;
    def.destroy_node(spare)?;
    step("nodes")?;
    assert_eq!(def.nodes()?.len(), 9);
    step("set_params")?;
    def.set_params(&m, NodeParams::memset(&other, 0)?)?;
    for n in def.nodes()? {
        step("inspect")?;
        def.inspect(&n)?;
    }
    step("node_info")?;
    let info = def.node_info(&a)?;
    assert_eq!(info.arg::<u64>(0), Some(buf.device_ptr()));
    step("instantiate")?;
    let g = def.instantiate()?;
    step("exec set_params")?;
    g.set_params(&a, NodeParams::kernel(&typed, one(), &buf)?)?;
    step("upload")?;
    g.upload(&s)?;
    step("graph launch")?;
    g.launch(&s)?;
    step("captured graph launch")?;
    captured.launch(&s)?;
    step("update")?;
    let copy = def.try_clone()?;
    g.update(&copy)?;
    step("graph launch after update")?;
    g.launch(&s)?;
    step("a second definition")?;
    let mem = GraphDefinition::new(&gpu.device)?;
    step("add_mem_alloc")?;
    let (alloc_node, alloc) = mem.add_mem_alloc(&[], 256)?;
    step("add_mem_free")?;
    let free = mem.add_mem_free(&[&alloc_node], alloc)?;
    step("create_conditional_handle")?;
    // Conditional nodes need driver 12.3: an older driver's error is fine here.
    if let Ok(handle) = mem.create_conditional_handle(Some(0)) {
        step("add_if")?;
        let (_cond, body) = mem.add_if(&[&free], &handle)?;
        step("a body's add_kernel")?;
        body.add_kernel(&[], &typed, one(), &buf)?;
    }
    for n in mem.nodes()? {
        step("inspect the second's nodes")?;
        mem.inspect(&n)?;
    }
    step("instantiate the second")?;
    let mem = mem.instantiate()?;
    step("launch the second")?;
    mem.launch(&s)?;
    step("synchronize")?;
    s.synchronize()?;
    step("read back")?;
    assert!(buf.to_vec()?[0] > 2, "the graphs ran");
    Ok(())
}

/// Raw device memory that the test owns: freed (and noted) when the owner value is dropped.
struct RawMemory {
    ptr: u64,
    ctx: usize,
    freed: Arc<AtomicBool>,
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        // SAFETY: `ctx` is device 0's primary context, retained by the crate's handles for as long
        // as any of them lives (this owner is dropped by one of them); `ptr` was allocated by the
        // test and is freed once, here, after the last graph launch that used it.
        let r = unsafe {
            sys::cuCtxSetCurrent(self.ctx as sys::CUcontext);
            sys::cuMemFree_v2(self.ptr)
        };
        self.freed
            .store(r == sys::CUresult::CUDA_SUCCESS, Ordering::SeqCst);
    }
}

fn raw_buffer_is_held_like_an_allocation_until_the_last_use(gpu: &Gpu) -> TestResult {
    let _current = Current::new()?;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: a valid out pointer.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    let mut ptr = 0;
    // SAFETY: the context is current; `ptr` is a valid out pointer.
    check(unsafe { sys::cuMemAlloc_v2(&mut ptr, 16) }, "cuMemAlloc_v2")?;
    let freed = Arc::new(AtomicBool::new(false));
    let owner = RawMemory {
        ptr,
        ctx: ctx as usize,
        freed: freed.clone(),
    };
    // SAFETY: 16 bytes (4 i32) at `ptr` in device 0's primary context, freed only by `owner`.
    let buf = unsafe { DeviceBuffer::<i32>::from_raw(&gpu.device, ptr, 4, owner) }?;
    assert_eq!((buf.as_raw(), buf.len(), buf.byte_len()), (ptr, 4, 16));
    assert!(buf.is_borrowed());
    let watch = buf.release_observer();
    let copy = gpu.device.alloc_zeroed::<i32>(4)?;
    assert!(!copy.is_borrowed());

    // Plain stream work and the synchronous copies.
    buf.copy_from(&[1, 2, 3, 4])?;
    let s = gpu.stream();
    s.memcpy_dtod(&copy, &buf)?;
    s.memset_d32(&buf, 9)?;
    s.synchronize()?;
    assert_eq!(
        (copy.to_vec()?, buf.to_vec()?),
        (vec![1, 2, 3, 4], vec![9; 4])
    );

    // A capture: memset, kernel argument, memcpy source.
    let add_one_at = gpu.f("add_one_at");
    let b = gpu.device.create_graph_builder()?.begin_building(Global)?;
    b.memset_d32(&buf, 5)?;
    // SAFETY: add_one_at(int*, int) with index 1 of 4.
    unsafe { b.launch_unchecked(&add_one_at, one(), &args![&buf, 1i32])? };
    b.memcpy_dtod(&copy, &buf)?;
    let captured = b.end_building()?.instantiate()?;

    // A definition, through a clone: kernel argument and memcpy destination.
    let clone = buf.clone();
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one_at(int*, int) with index 3 of 4.
    let k = unsafe { def.add_kernel_unchecked(&[], &add_one_at, one(), &args![&clone, 3i32])? };
    def.add_memcpy(&[&k], &copy, &clone)?;
    let explicit = def.instantiate()?;

    drop((buf, clone, def));
    assert!(
        !watch.is_released() && !freed.load(Ordering::SeqCst),
        "the graphs hold the owner"
    );
    captured.launch(&s)?;
    explicit.launch(&s)?;
    s.synchronize()?;
    assert_eq!(
        copy.to_vec()?,
        [5, 6, 5, 6],
        "memset, +1 at 1, then +1 at 3"
    );
    drop(captured);
    assert!(
        !freed.load(Ordering::SeqCst),
        "the explicit exec still holds the owner"
    );
    drop(explicit);
    assert!(
        eventually(|| freed.load(Ordering::SeqCst)),
        "the owner is dropped (and frees the memory) after the last exec"
    );
    assert!(watch.is_released());
    Ok(())
}

/// C (M×N) = A (M×K) · B (K×N), column-major; the graph computes heat_step(A·B).
const M: usize = 64;
const N: usize = 48;
const K: usize = 32;
const HEAT: f32 = 0.25;

fn inputs(len: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn gemm_then_heat(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; M * N];
    for j in 0..N {
        for i in 0..M {
            c[i + j * M] = (0..K).map(|p| a[i + p * M] * b[p + j * K]).sum();
        }
    }
    let mut out = c.clone();
    for i in 1..c.len() - 1 {
        out[i] = c[i] + HEAT * (c[i - 1] - 2.0 * c[i] + c[i + 1]);
    }
    out
}

/// A cuBLAS handle, destroyed on drop.
struct Cublas(blas_sys::cublasHandle_t);

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: created by the test, destroyed once, here, after its work has finished.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

fn cublas_gemm_between_two_kernels_in_one_graph(gpu: &Gpu) -> TestResult {
    let (copy_f32, heat_step) = (gpu.f("copy_f32"), gpu.f("heat_step"));
    let s = gpu.stream(); // binds the primary context, which cuBLAS then uses
    let a_in = gpu.device.alloc_zeroed::<f32>(M * K)?;
    let a = gpu.device.alloc_zeroed::<f32>(M * K)?;
    let b = gpu.device.alloc_zeroed::<f32>(K * N)?;
    let c = gpu.device.alloc_zeroed::<f32>(M * N)?;
    let out = gpu.device.alloc_zeroed::<f32>(M * N)?;
    // cuBLAS would allocate its own workspace on first use, which is illegal while capturing.
    let workspace = gpu.device.alloc_zeroed::<u8>(32 << 20)?;
    let handle = Cublas(blas::create_handle()?);
    // SAFETY: live handle, stream and workspace; the workspace outlives every GEMM that uses it
    // (dropped after the graph, once the stream is synchronised).
    unsafe {
        blas::set_stream(handle.0, s.as_raw() as blas_sys::cudaStream_t)?;
        blas_sys::cublasSetWorkspace_v2(
            handle.0,
            workspace.as_raw() as *mut std::ffi::c_void,
            workspace.byte_len(),
        )
        .result()?;
    }
    let gemm = || {
        let (one, zero) = (1f32, 0f32);
        // SAFETY: A is M×K (lda M), B is K×N (ldb K), C is M×N (ldc M), live buffers of this
        // context; the scalars are host values read during the call.
        unsafe {
            blas::sgemm(
                handle.0,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                M as i32,
                N as i32,
                K as i32,
                &one,
                a.as_raw() as *const f32,
                M as i32,
                b.as_raw() as *const f32,
                K as i32,
                &zero,
                c.as_raw() as *mut f32,
                M as i32,
            )
        }
    };
    // Warm-up outside the capture: cuBLAS's first GEMM loads kernels and sets up the handle,
    // which is illegal while capturing.
    gemm()?;
    s.synchronize()?;

    let builder = s.create_graph_builder().begin_building(ThreadLocal)?;
    let (na, nc) = ((M * K) as i32, (M * N) as i32);
    // SAFETY: copy_f32(const float*, float*, int) over M·K floats.
    unsafe {
        builder.launch_unchecked(
            &copy_f32,
            LaunchConfig::for_num_elems(na as u32),
            &args![&a_in, &a, na],
        )?
    };
    gemm()?; // on `s.as_raw()`, which is capturing: recorded into the graph
             // SAFETY: heat_step(const float*, float*, int, float) over M·N floats.
    unsafe {
        builder.launch_unchecked(
            &heat_step,
            LaunchConfig::for_num_elems(nc as u32),
            &args![&c, &out, nc, HEAT],
        )?
    };
    let ended = builder.end_building()?;
    let def = ended.graph_definition()?;
    let nodes = def.nodes()?;
    let kernels = nodes
        .iter()
        .filter(|n| matches!(def.node_type(n), Ok(NodeType::Kernel)))
        .count();
    assert!(
        kernels >= 3,
        "two kernels of ours and at least one of cuBLAS's, got {kernels} kernel nodes of {}",
        nodes.len()
    );
    drop(def);
    let graph = ended.instantiate()?;

    for replay in 0..3u32 {
        let (ah, bh) = (inputs(M * K, 2 * replay), inputs(K * N, 2 * replay + 1));
        a_in.copy_from(&ah)?;
        b.copy_from(&bh)?;
        graph.launch(&s)?;
        s.synchronize()?;
        let got = out.to_vec()?;
        let want = gemm_then_heat(&ah, &bh);
        let err = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0f32, f32::max);
        println!("replay {replay}: max error {err:e}");
        assert!(
            err <= 1e-3,
            "replay {replay}: max error {err} against the CPU reference"
        );
    }
    drop(graph);
    s.synchronize()?;
    Ok(())
}
