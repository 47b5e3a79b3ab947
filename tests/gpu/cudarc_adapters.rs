//! The `cudarc` feature's adapters: cudarc's streams, slices and kernels in this crate's graphs,
//! held for as long as the graphs use them; foreign captures refused.

use std::sync::Arc;

use cuda_graph::prelude::*;
use cuda_graph::Refusal;
use cudarc::driver::{sys, CudaContext};
use cudarc::nvrtc::Ptx;

use crate::args;
use crate::support::{
    eventually, global_captures_beside_drops, one, Gpu, Needs, TestResult, KERNELS,
};

crate::gpu_tests! {
    "cudarc";
    Needs::Gpu =>
        capture_on_a_cudarc_stream_holds_its_slices_and_kernel,
        work_during_a_cudarc_capture_is_refused,
        a_converted_slice_is_ready_before_the_crate_uses_it,
        the_per_thread_default_stream_is_refused,
        slices_released_by_a_dropped_exec_never_invalidate_a_global_capture,
        dropped_cudarc_buffers_never_invalidate_captures;
}

/// cudarc allocates and zeroes a slice with stream-ordered calls on the slice's stream; this
/// crate's streams are not ordered after them. Here they queue behind a 200 ms kernel, and a
/// crate stream writes the converted slice at once: unless the conversion waited for the
/// slice's stream, cudarc's zeroing ran after the write and wiped it (and before the
/// allocation was made, the memory was not the slice's yet).
fn a_converted_slice_is_ready_before_the_crate_uses_it(gpu: &Gpu) -> TestResult {
    let ctx = CudaContext::new(gpu.device.ordinal())?;
    let device = Device::from_cudarc(&ctx)?;
    let cs = ctx.new_stream()?;
    // SAFETY: the cudarc stream is used by the crate only here, with no cudarc capture.
    let busy = unsafe { Stream::from_cudarc(&device, &cs)? };
    // SAFETY: spin(unsigned long long ns).
    unsafe { busy.launch_unchecked(&gpu.f("spin"), one(), &args![200_000_000u64])? };
    let slice = Arc::new(cs.alloc_zeros::<i32>(4)?);
    let buf = DeviceBuffer::from_cudarc(&device, slice)?;
    // SAFETY: fill(int* p, int n, int v) writes p[0..n).
    let fill: Kernel<(*mut i32, i32, i32)> = unsafe { gpu.module.kernel("fill")? };
    let s = gpu.stream();
    s.launch(&fill, one(), (&buf, 4, 7))?;
    s.synchronize()?;
    cs.synchronize()?;
    assert_eq!(
        buf.to_vec()?,
        [7; 4],
        "cudarc's zeroing ran after the crate's write"
    );
    Ok(())
}

/// A dropped exec releases what it held on the dropping thread once its launches have ended
/// (or at once, never launched) — here cudarc slices, whose `Drop` frees with driver calls that
/// CUDA counts as unsafe while a `Global` capture records. The release runs in `Relaxed`
/// capture interaction mode (as on the release thread), so another thread's `Global` captures
/// stay valid.
fn slices_released_by_a_dropped_exec_never_invalidate_a_global_capture(gpu: &Gpu) -> TestResult {
    let ctx = CudaContext::new(gpu.device.ordinal())?;
    let device = Device::from_cudarc(&ctx)?;
    let cs = ctx.default_stream();
    let mut graphs = Vec::new();
    for i in 0..200 {
        let slice = Arc::new(cs.alloc_zeros::<i32>(16)?);
        let buf = DeviceBuffer::from_cudarc(&device, slice)?;
        let def = GraphDefinition::new(&device)?;
        def.add_memset(&[], &buf, 1i32)?;
        let g = def.instantiate()?;
        if i % 2 == 0 {
            g.launch(&gpu.stream())?;
        }
        graphs.push(g);
    }
    gpu.device.synchronize()?;
    let cycles = global_captures_beside_drops(gpu, graphs)?;
    println!("    {cycles} Global captures beside 200 execs releasing cudarc slices");
    Ok(())
}

/// The last handle of a `from_cudarc` buffer dropped by the user, with no exec involved: cudarc's
/// slice then waits on an event, frees its memory and destroys the event — calls CUDA forbids
/// while a `Global` capture records (on any thread in the default interaction mode) and while the
/// dropping thread's own `ThreadLocal` or `Global` capture records. The crate drops the slice
/// where a destroy may run, so another thread's `Global` captures and this thread's own captures
/// stay valid.
fn dropped_cudarc_buffers_never_invalidate_captures(gpu: &Gpu) -> TestResult {
    let ctx = CudaContext::new(gpu.device.ordinal())?;
    let device = Device::from_cudarc(&ctx)?;
    let cs = ctx.new_stream()?;
    let mut bufs = Vec::new();
    for _ in 0..200 {
        bufs.push(DeviceBuffer::from_cudarc(
            &device,
            Arc::new(cs.alloc_zeros::<i32>(16)?),
        )?);
    }
    cs.synchronize()?;
    // Another thread's drops beside this thread's Global captures.
    let cycles = global_captures_beside_drops(gpu, bufs)?;
    println!("    {cycles} Global captures beside 200 dropped cudarc buffers");
    // Drops inside this thread's own captures, in both modes that restrict this thread.
    let add_one = gpu.f("add_one");
    let counter = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    for _ in 0..4 {
        let buf = DeviceBuffer::from_cudarc(&device, Arc::new(cs.alloc_zeros::<i32>(16)?))?;
        cs.synchronize()?;
        let b = s.create_graph_builder().begin_building(ThreadLocal)?;
        // SAFETY: add_one(int*).
        unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
        drop(buf);
        b.end_building()?.instantiate()?.launch(&s)?;
        let buf = DeviceBuffer::from_cudarc(&device, Arc::new(cs.alloc_zeros::<i32>(16)?))?;
        cs.synchronize()?;
        let b = s.create_graph_builder().begin_building(Global)?;
        // SAFETY: add_one(int*).
        unsafe { b.launch_unchecked(&add_one, one(), &args![&counter])? };
        drop(buf);
        b.end_building()?.instantiate()?.launch(&s)?;
    }
    s.synchronize()?;
    assert_eq!(
        counter.to_vec()?,
        [8],
        "every capture stayed valid and ran once"
    );
    cs.synchronize()?;
    Ok(())
}

fn capture_on_a_cudarc_stream_holds_its_slices_and_kernel(gpu: &Gpu) -> TestResult {
    let ctx = CudaContext::new(gpu.device.ordinal())?;
    let device = Device::from_cudarc(&ctx)?;
    assert_eq!(device.ordinal(), gpu.device.ordinal());

    // Slices allocated on a stream of their own (event tracking on: two streams).
    let alloc_stream = ctx.new_stream()?;
    let slice = Arc::new(alloc_stream.clone_htod(&[10i32, 20, 30, 40])?);
    alloc_stream.synchronize()?;
    let slice_alive = Arc::downgrade(&slice);
    let whole = DeviceBuffer::from_cudarc(&device, slice.clone())?;
    let tail = DeviceBuffer::from_cudarc_range(&device, slice.clone(), 2..)?;
    assert_eq!((whole.len(), tail.len()), (4, 2));
    assert_eq!(tail.as_raw(), whole.as_raw() + 8);
    assert!(whole.is_borrowed());
    for bad in [
        DeviceBuffer::from_cudarc_range(&device, slice.clone(), 3..3),
        DeviceBuffer::from_cudarc_range(&device, slice.clone(), 0..5),
    ] {
        assert!(
            matches!(&bad, Err(e) if e.refusal() == Some(Refusal::Size)),
            "{bad:?}"
        );
    }
    drop(slice);

    // A cudarc kernel (its module loaded by cudarc from the shipped fatbin).
    let module = ctx.load_module(Ptx::from_binary(KERNELS.to_vec()))?;
    let module_alive = Arc::downgrade(&module);
    let f = module.load_function("add_one_at")?;
    // SAFETY: `f` comes from a module loaded by `CudaContext::new(0)`, device 0's primary context.
    let k = unsafe { Function::from_cudarc(&device, &f, "add_one_at") };
    assert_eq!(k.as_raw(), f.cu_function());
    drop((f, module));

    // The capture, on a cudarc stream.
    let cap = ctx.new_stream()?;
    let stream_alive = Arc::downgrade(&cap);
    // SAFETY: no cudarc capture is begun on `cap` while the crate uses it.
    let stream = unsafe { Stream::from_cudarc(&device, &cap)? };
    drop(cap);
    // Allocated before the capture: an allocation on the capturing thread would invalidate it.
    let crate_buf = gpu.device.alloc_zeroed::<i32>(2)?;
    let b = stream.create_graph_builder().begin_building(ThreadLocal)?;
    // SAFETY: add_one_at(int*, int) with indices inside each buffer.
    unsafe {
        b.launch_unchecked(&k, one(), &args![&whole, 0i32])?;
        b.launch_unchecked(&k, one(), &args![&tail, 1i32])?;
    }
    b.memcpy_dtod(&crate_buf, &tail)?;
    let graph = b.end_building()?.instantiate()?;
    let reader = whole.clone();
    drop((whole, tail, k, stream));
    assert!(
        eventually(|| stream_alive.upgrade().is_none()),
        "the capture stream is let go once the capture ended and the Stream is dropped"
    );

    let s = gpu.stream();
    graph.launch(&s)?;
    graph.launch(&s)?;
    s.synchronize()?;
    assert_eq!(reader.to_vec()?, [12, 20, 30, 42]);
    assert_eq!(crate_buf.to_vec()?, [30, 42]);
    drop(reader);
    assert!(
        slice_alive.upgrade().is_some() && module_alive.upgrade().is_some(),
        "the exec holds the slice and the kernel's module"
    );
    drop(graph);
    assert!(
        eventually(|| slice_alive.upgrade().is_none() && module_alive.upgrade().is_none()),
        "slice and module are dropped after the exec's last launch"
    );
    ctx.check_err()?; // cudarc's drops (free, unload) went well
    Ok(())
}

fn work_during_a_cudarc_capture_is_refused(gpu: &Gpu) -> TestResult {
    let ctx = CudaContext::new(gpu.device.ordinal())?;
    let device = Device::from_cudarc(&ctx)?;
    let cap = ctx.new_stream()?;
    // SAFETY: the cudarc capture below is begun and ended on this thread, between the crate's
    // operations, never during one.
    let stream = unsafe { Stream::from_cudarc(&device, &cap)? };
    let buf = gpu.device.alloc_zeroed::<i32>(4)?;
    stream.memset_d32(&buf, 1)?;
    stream.synchronize()?;

    cap.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let refused = stream.memset_d32(&buf, 2);
    let ended = cap.end_capture(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
    );
    assert!(
        matches!(&refused, Err(e) if e.refusal() == Some(Refusal::Capture)),
        "{refused:?}"
    );
    drop(ended?);

    // A slice converted while its own stream captures (event tracking on) is refused too.
    let slice = Arc::new(cap.alloc_zeros::<i32>(4)?);
    cap.synchronize()?;
    cap.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let converted = DeviceBuffer::from_cudarc(&device, slice.clone());
    let ended = cap.end_capture(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
    );
    assert!(ctx.is_managing_stream_synchronization());
    assert!(
        matches!(&converted, Err(e) if e.refusal() == Some(Refusal::Capture)),
        "{converted:?}"
    );
    drop(ended?);
    assert!(DeviceBuffer::from_cudarc(&device, slice)?.len() == 4);

    // Not capturing any more: work goes through again.
    stream.memset_d32(&buf, 3)?;
    stream.synchronize()?;
    assert_eq!(buf.to_vec()?, [3; 4]);
    Ok(())
}

/// cudarc's per-thread default stream names a different stream on each thread, and a `Stream`
/// is used from other threads: wrapping it is an error; the legacy default stream is taken.
fn the_per_thread_default_stream_is_refused(_gpu: &Gpu) -> TestResult {
    let ctx = CudaContext::new(0)?;
    let device = Device::from_cudarc(&ctx)?;
    // SAFETY: no capture is begun on these streams through cudarc.
    let refused = unsafe { Stream::from_cudarc(&device, &ctx.per_thread_stream()) };
    match refused {
        Err(e) if e.refusal() == Some(Refusal::Unsupported) => {}
        other => return Err(format!("expected a refusal, got {:?}", other.map(|_| ())).into()),
    }
    // SAFETY: as above.
    let legacy = unsafe { Stream::from_cudarc(&device, &ctx.default_stream())? };
    legacy.synchronize()?;
    // A slice of it: converted on another thread, the wait would be for that thread's stream.
    let slice = Arc::new(ctx.per_thread_stream().alloc_zeros::<u32>(16)?);
    match DeviceBuffer::from_cudarc(&device, slice) {
        Err(e) if e.refusal() == Some(Refusal::Unsupported) => {}
        other => return Err(format!("expected a refusal, got {:?}", other.map(|_| ())).into()),
    }
    Ok(())
}
