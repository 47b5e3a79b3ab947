//! Handles this crate did not make: a raw `CUstream` and a raw `CUfunction`, wrapped with an
//! owner value the crate keeps alive for as long as anything uses them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cuda_graph::prelude::*;
use cudarc::driver::sys;

use crate::args;
use crate::support::{eventually, one, Gpu, Needs, TestResult, KERNELS};

pub const TESTS: &[(&str, Needs, crate::TestFn)] = &[
    (
        "interop::capture_on_a_raw_stream_keeps_its_owner_until_the_last_use",
        Needs::Gpu,
        capture_on_a_raw_stream_keeps_its_owner_until_the_last_use,
    ),
    (
        "interop::raw_kernel_in_a_capture_and_a_definition",
        Needs::Gpu,
        raw_kernel_in_a_capture_and_a_definition,
    ),
];

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
    unsafe { b.launch(&add_one, one(), &args![&buf])? };
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
    let g = b.end_building()?.complete(&Default::default())?;
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
    unsafe { b.launch(&k, one(), &args![&buf])? };
    let captured = b.end_building()?.complete(&Default::default())?;
    let def = GraphDefinition::new(&gpu.device)?;
    // SAFETY: add_one(int*).
    unsafe { def.add_kernel(&[], &k, one(), &args![&buf])? };
    let explicit = def.instantiate(&Default::default())?;
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
