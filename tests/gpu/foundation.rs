//! The driver handle and runtime layer.

use cuda_graph::prelude::*;

use cuda_graph::DriverVersion;
use cuda_graph::Refusal;

use crate::args;
use crate::support::{one, Gpu, Needs, TestResult};

crate::gpu_tests! {
    "foundation";
    Needs::Gpu =>
        device_query,
        alloc_and_copy_round_trip,
        bad_allocations_are_errors,
        module_load_and_add_one_launch,
        bad_module_image_gives_the_driver_error,
        ptx_text_loads_safely_and_runs,
        stream_event_ordering_across_two_streams;
    Needs::Conditional(DriverVersion::V12_3) => raw_driver_conditional_obeys_kernel_set_value;
}

/// Runs everywhere: without libcuda `Device::new(0)` is `DriverNotFound`; with it, it opens.
pub fn no_driver_gives_an_error() -> TestResult {
    // SAFETY: only probes whether the library can be opened.
    #[cfg(feature = "dynamic-loading")]
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    // Linked at build time (`dynamic-linking`): the test could not have started without libcuda.
    #[cfg(not(feature = "dynamic-loading"))]
    let present = true;
    match Device::new(0) {
        Err(Error::DriverNotFound) => {
            assert!(!present, "libcuda is present but was reported missing")
        }
        Ok(_) => assert!(present),
        Err(Error::InvalidDevice { count: 0, .. }) => assert!(present),
        // A driver without a usable device (e.g. a container without the GPU passed through).
        Err(Error::Driver(d)) if d.call() == "cuInit" => assert!(present, "{d}"),
        Err(e) => return Err(format!("unexpected error: {e}").into()),
    }
    if !present {
        assert!(matches!(Device::count(), Err(Error::DriverNotFound)));
        assert!(matches!(
            cuda_graph::driver_version(),
            Err(Error::DriverNotFound)
        ));
        let msg = Error::DriverNotFound.to_string();
        assert!(msg.contains("libcuda"), "{msg}");
    }
    Ok(())
}

fn device_query(gpu: &Gpu) -> TestResult {
    let n = Device::count()?;
    assert!(n >= 1);
    let name = gpu.device.name()?;
    assert!(!name.is_empty());
    let cc = gpu.device.compute_capability()?;
    assert!(cc >= (7, 5), "{cc:?}");
    let v = cuda_graph::driver_version()?;
    assert!(v >= DriverVersion::V12_0, "{v}");
    println!(
        "device 0: {name}, sm_{}{}, driver {v}, {n} device(s)",
        cc.0, cc.1
    );
    match Device::new(n) {
        Err(Error::InvalidDevice { ordinal, count }) => assert_eq!((ordinal, count), (n, n)),
        other => return Err(format!("expected InvalidDevice, got {other:?}").into()),
    }
    Ok(())
}

fn alloc_and_copy_round_trip(gpu: &Gpu) -> TestResult {
    let data: Vec<i32> = (0..10_000).map(|i| i * 3 - 7).collect();
    let a = gpu.device.htod(&data)?;
    assert_eq!(a.len(), data.len());
    assert_eq!(a.to_vec()?, data);
    let z = gpu.device.alloc_zeroed::<f32>(777)?;
    assert!(z.to_vec()?.iter().all(|&x| x == 0.0));

    let s = gpu.stream();
    let b = gpu.device.alloc_zeroed::<i32>(data.len())?;
    s.memcpy_dtod(&b, &a)?;
    s.synchronize()?;
    assert_eq!(b.to_vec()?, data);
    s.memset_d32(&b, 0x0101_0101)?;
    s.synchronize()?;
    assert!(b.to_vec()?.iter().all(|&x| x == 0x0101_0101));
    s.memset_d8(&b, 0)?;
    s.memcpy_htod(&b, &data)?;
    assert_eq!(b.to_vec()?, data);
    // Mismatched lengths are argument errors, not crashes.
    assert!(matches!(
        s.memcpy_dtod(&z.device().alloc_zeroed::<i32>(3)?, &a),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    assert!(matches!(
        a.copy_from(&[1, 2]),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    let odd = gpu.device.alloc_zeroed::<u8>(3)?;
    assert!(matches!(
        s.memset_d32(&odd, 1),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    Ok(())
}

fn bad_allocations_are_errors(gpu: &Gpu) -> TestResult {
    assert!(matches!(
        gpu.device.alloc_zeroed::<i32>(0),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    assert!(matches!(
        gpu.device.htod::<i32>(&[]),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    assert!(matches!(
        gpu.device.alloc_zeroed::<u64>(usize::MAX / 4),
        Err(e) if e.refusal() == Some(Refusal::Size)
    ));
    // 1 PiB: the driver refuses it.
    match gpu.device.alloc_zeroed::<u8>(1 << 50) {
        Err(e @ Error::Driver(_)) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2):"),
                "{msg}"
            );
        }
        other => return Err(format!("expected an out-of-memory error, got {other:?}").into()),
    }
    Ok(())
}

fn module_load_and_add_one_launch(gpu: &Gpu) -> TestResult {
    let add_one = gpu.f("add_one");
    assert_eq!(add_one.name(), "add_one");
    let buf = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    for _ in 0..3 {
        // SAFETY: add_one(int*) with a one-int buffer.
        unsafe { s.launch_unchecked(&add_one, one(), &args![&buf])? };
    }
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [3]);
    let affine = gpu.f("affine");
    // SAFETY: affine(int*, int, int).
    unsafe { s.launch_unchecked(&affine, one(), &args![&buf, 5i32, 2i32])? };
    s.synchronize()?;
    assert_eq!(buf.to_vec()?, [17]);
    match gpu.module.function("no_such_kernel") {
        Err(Error::FunctionNotFound(n)) => assert_eq!(n, "no_such_kernel"),
        other => return Err(format!("expected FunctionNotFound, got {other:?}").into()),
    }
    Ok(())
}

fn bad_module_image_gives_the_driver_error(gpu: &Gpu) -> TestResult {
    let err = gpu
        .device
        .load_ptx("this is not PTX")
        .expect_err("garbage must not load");
    let msg = err.to_string();
    println!("{msg}");
    assert!(
        msg.starts_with("cuModuleLoadData failed: CUDA_ERROR_"),
        "{msg}"
    );
    let code = err.code().ok_or("a driver error carries its code")?;
    assert!(
        code == 218 || code == 200,
        "INVALID_PTX or INVALID_IMAGE, got {code}"
    );
    // Text the driver would read differently from the caller: refused before it.
    for bad in ["store7\0 trailing", "\x01binary", "\x7fELF"] {
        assert!(
            matches!(gpu.device.load_ptx(bad), Err(e) if e.refusal() == Some(Refusal::Image)),
            "{bad:?} must be refused"
        );
    }
    // Truncated fatbin: refused by the container check before the driver reads past the end.
    let kernels = crate::support::KERNELS;
    // SAFETY: refused before the driver sees it (the check this test pins); never loaded.
    assert!(matches!(
        unsafe { gpu.device.load_module(&kernels[..100]) },
        Err(e) if e.refusal() == Some(Refusal::Image)
    ));
    // SAFETY: as above.
    assert!(matches!(
        unsafe { gpu.device.load_module(&[]) },
        Err(e) if e.refusal() == Some(Refusal::Image)
    ));
    Ok(())
}

/// A kernel in hand-written PTX (ISA 7.0, any GPU from sm_52: every supported driver JITs it):
/// `store7(int* p)` sets `p[0] = 7`.
const STORE7_PTX: &str = include_str!("../kernels/store7.ptx");

fn ptx_text_loads_safely_and_runs(gpu: &Gpu) -> TestResult {
    let module = gpu.device.load_ptx(STORE7_PTX)?;
    // SAFETY: store7's parameter list is one `int*`.
    let store7 = unsafe { module.kernel::<(*mut i32,)>("store7")? };
    let out = gpu.device.alloc_zeroed::<i32>(1)?;
    let stream = gpu.device.create_stream()?;
    stream.launch(&store7, LaunchConfig::single(), &out)?;
    stream.synchronize()?;
    assert_eq!(out.to_vec()?, [7]);
    Ok(())
}

fn stream_event_ordering_across_two_streams(gpu: &Gpu) -> TestResult {
    const N: usize = 1 << 24;
    let fill = gpu.f("fill");
    let a = gpu.device.alloc_zeroed::<i32>(N)?;
    let b = gpu.device.alloc_zeroed::<i32>(N)?;
    let (s1, s2) = (gpu.stream(), gpu.stream());
    let ev = gpu.device.create_event()?;
    // SAFETY: fill(int*, int n, int v) over N ints.
    unsafe {
        s1.launch_unchecked(
            &fill,
            LaunchConfig::for_num_elems(N as u32),
            &args![&a, N as i32, 7i32],
        )?
    };
    s1.record(&ev)?;
    s2.wait(&ev)?;
    s2.memcpy_dtod(&b, &a)?;
    s2.synchronize()?;
    assert!(ev.is_complete()?);
    let host = b.to_vec()?;
    assert!(
        host.iter().all(|&x| x == 7),
        "the copy ran before the fill finished"
    );
    Ok(())
}

/// The raw driver, no crate types: a kernel sets the condition, an IF node obeys it.
fn raw_driver_conditional_obeys_kernel_set_value(gpu: &Gpu) -> TestResult {
    use cudarc::driver::sys::{self, CUresult::CUDA_SUCCESS};
    use std::ptr::null_mut;
    gpu.device.synchronize()?; // makes the primary context current on this thread
    let run = |value: u32| -> Result<i32, String> {
        macro_rules! ok {
            ($e:expr) => {{
                let r = $e;
                if r != CUDA_SUCCESS {
                    return Err(format!("{} -> {:?}", stringify!($e), r));
                }
            }};
        }
        // SAFETY: plain driver calls with valid out pointers on the current context; every
        // object is destroyed before returning.
        unsafe {
            let mut ctx = null_mut();
            ok!(sys::cuCtxGetCurrent(&mut ctx));
            let image: Vec<u64> = {
                let k = crate::support::KERNELS;
                let mut v = vec![0u64; k.len() / 8 + 1];
                std::ptr::copy_nonoverlapping(k.as_ptr(), v.as_mut_ptr().cast::<u8>(), k.len());
                v
            };
            let mut module = null_mut();
            ok!(sys::cuModuleLoadData(&mut module, image.as_ptr().cast()));
            let (mut set, mut add) = (null_mut(), null_mut());
            ok!(sys::cuModuleGetFunction(
                &mut set,
                module,
                c"set_condition".as_ptr()
            ));
            ok!(sys::cuModuleGetFunction(
                &mut add,
                module,
                c"add_one".as_ptr()
            ));
            let mut dptr = 0;
            ok!(sys::cuMemAlloc_v2(&mut dptr, 4));
            ok!(sys::cuMemsetD32_v2(dptr, 0, 1));
            let mut graph = null_mut();
            ok!(sys::cuGraphCreate(&mut graph, 0));
            let mut handle = 0;
            ok!(sys::cuGraphConditionalHandleCreate(
                &mut handle,
                graph,
                ctx,
                0,
                0
            ));
            let kernel = |f, params: &mut [*mut std::ffi::c_void]| sys::CUDA_KERNEL_NODE_PARAMS {
                func: f,
                gridDimX: 1,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: 1,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: params.as_mut_ptr(),
                extra: null_mut(),
                kern: null_mut(),
                ctx: null_mut(),
            };
            let (mut h, mut v) = (handle, value);
            let mut p1 = [(&mut h as *mut u64).cast(), (&mut v as *mut u32).cast()];
            let mut n1 = null_mut();
            ok!(sys::cuGraphAddKernelNode_v2(
                &mut n1,
                graph,
                std::ptr::null(),
                0,
                &kernel(set, &mut p1)
            ));
            let mut cp: sys::CUgraphNodeParams = std::mem::zeroed();
            cp.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
            cp.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
                handle,
                type_: sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
                size: 1,
                phGraph_out: null_mut(),
                ctx,
            };
            let mut n2 = null_mut();
            // `_v2` (null edge data: default edges): the 13.x bindings have no `cuGraphAddNode`.
            ok!(sys::cuGraphAddNode_v2(
                &mut n2,
                graph,
                &n1,
                std::ptr::null(),
                1,
                &mut cp
            ));
            let body = *cp.__bindgen_anon_1.conditional.phGraph_out;
            let mut d = dptr;
            let mut p2 = [(&mut d as *mut u64).cast()];
            let mut n3 = null_mut();
            ok!(sys::cuGraphAddKernelNode_v2(
                &mut n3,
                body,
                std::ptr::null(),
                0,
                &kernel(add, &mut p2)
            ));
            let mut exec = null_mut();
            ok!(sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0));
            ok!(sys::cuGraphLaunch(exec, null_mut()));
            ok!(sys::cuCtxSynchronize());
            let mut out = 0i32;
            ok!(sys::cuMemcpyDtoH_v2((&mut out as *mut i32).cast(), dptr, 4));
            ok!(sys::cuGraphExecDestroy(exec));
            ok!(sys::cuGraphDestroy(graph));
            ok!(sys::cuMemFree_v2(dptr));
            ok!(sys::cuModuleUnload(module));
            Ok(out)
        }
    };
    assert_eq!(run(1)?, 1, "condition 1: the body must run");
    assert_eq!(run(0)?, 0, "condition 0: the body must not run");
    assert_eq!(run(7)?, 1, "any non-zero condition runs the body");
    Ok(())
}
