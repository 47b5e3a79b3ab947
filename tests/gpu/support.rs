//! Shared helpers for the GPU suite.

use cuda_graph::prelude::*;

use cuda_graph::DriverVersion;

/// The test kernels (see tests/kernels/README.md).
pub const KERNELS: &[u8] = include_bytes!("../kernels/kernels.fatbin");

/// What every GPU test gets.
pub struct Gpu {
    pub device: Device,
    pub module: Module,
}

impl Gpu {
    pub fn f(&self, name: &str) -> Function {
        self.module
            .function(name)
            .expect("kernel present in the fatbin")
    }
    pub fn stream(&self) -> Stream {
        self.device.create_stream().expect("stream")
    }
}

/// Why a GPU test cannot run here, if it cannot.
pub fn open() -> Result<Gpu, String> {
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(Error::DriverNotFound) => {
            return Err("GPU test skipped: no CUDA driver (libcuda) on this machine".into())
        }
        Err(Error::InvalidDevice { .. }) => {
            return Err("GPU test skipped: no CUDA device on this machine".into())
        }
        Err(e) => {
            return Err(format!(
                "GPU test skipped: the CUDA device cannot be opened: {e}"
            ))
        }
    };
    // A device that cannot load the kernels is a failure, not a skip (e.g. a context left broken
    // by an earlier test): panic so the test fails.
    // SAFETY: the fatbin nvcc built from tests/kernels/kernels.cu, unmodified.
    let module = unsafe { device.load_module(KERNELS) }
        .unwrap_or_else(|e| panic!("the test kernels do not load: {e}"));
    Ok(Gpu { device, module })
}

/// Requirements beyond a GPU, checked before a test runs.
#[derive(Clone, Copy)]
pub enum Needs {
    Gpu,
    /// Conditional nodes: compute capability 9.0 and the given driver.
    Conditional(DriverVersion),
    /// libcublas, opened by cudarc's loader.
    Cublas,
    /// libnvrtc (`Device::compile`).
    #[allow(dead_code)] // used by the `nvrtc` feature's tests only
    Nvrtc,
    /// libnvrtc and compute capability 9.0 (clusters, programmatic dependent launch).
    #[allow(dead_code)] // used by the `nvrtc` feature's tests only
    Hopper,
    /// libnccl (`cuda_graph::nccl`), and at least this many devices.
    #[allow(dead_code)] // used by the `nccl` feature's tests only
    Nccl(usize),
}

/// Why libcublas cannot be used here, if it cannot (checked without panicking: cudarc's loader
/// panics when a cuBLAS function is called and the library is missing).
pub fn cublas_missing() -> Option<String> {
    #[cfg(feature = "dynamic-loading")]
    {
        // SAFETY: only tries to open the library (and closes it again).
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Some(format!(
                "GPU test skipped: libcublas could not be loaded (cudarc tried {}); with a CUDA toolkit in /usr/local/cuda, run with LD_LIBRARY_PATH=/usr/local/cuda/lib64",
                cudarc::get_lib_name_candidates("cublas").join(", ")
            ));
        }
    }
    None
}

pub fn unmet(gpu: &Gpu, needs: Needs) -> Option<String> {
    match needs {
        Needs::Gpu => None,
        Needs::Cublas => cublas_missing(),
        #[cfg(feature = "nvrtc")]
        Needs::Nvrtc => match gpu.device.compile("extern \"C\" __global__ void probe() {}") {
            Err(Error::NvrtcNotFound { tried }) => Some(format!(
                "GPU test skipped: libnvrtc could not be loaded (tried {tried}); with a CUDA toolkit in /usr/local/cuda, run with LD_LIBRARY_PATH=/usr/local/cuda/lib64"
            )),
            _ => None,
        },
        #[cfg(not(feature = "nvrtc"))]
        Needs::Nvrtc => Some("GPU test skipped: built without the `nvrtc` feature".into()),
        Needs::Hopper => {
            if let Some(reason) = unmet(gpu, Needs::Nvrtc) {
                return Some(reason);
            }
            let cc = gpu.device.compute_capability().ok()?;
            (cc < (9, 0)).then(|| format!("needs compute capability 9.0 (this device: {}.{})", cc.0, cc.1))
        }
        #[cfg(feature = "nccl")]
        Needs::Nccl(gpus) => {
            let present = Device::count().ok()?;
            if present < gpus {
                return Some(format!("needs {gpus} GPUs ({present} present)"));
            }
            match cuda_graph::nccl::version() {
                Err(Error::NcclNotFound { tried }) => Some(format!(
                    "GPU test skipped: libnccl could not be loaded (tried {tried}); install NCCL (libnccl2, or pip's nvidia-nccl-cu12 / -cu13) and put the directory of libnccl.so.2 on LD_LIBRARY_PATH"
                )),
                _ => None,
            }
        }
        #[cfg(not(feature = "nccl"))]
        Needs::Nccl(_) => Some("GPU test skipped: built without the `nccl` feature".into()),
        Needs::Conditional(v) => {
            let cc = gpu.device.compute_capability().ok()?;
            if cc < (9, 0) {
                return Some(format!(
                    "GPU test skipped: conditional-node tests need compute capability 9.0, this device is {}.{}",
                    cc.0, cc.1
                ));
            }
            let driver = cuda_graph::driver_version().ok()?;
            if driver < v {
                return Some(format!(
                    "GPU test skipped: needs CUDA driver {v}, this one is {driver}"
                ));
            }
            None
        }
    }
}

/// `KernelArgs` from a list: `args![&buf, 3i32]`.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut a = cuda_graph::KernelArgs::new();
        $( a.push($a); )*
        a
    }};
}

pub fn one() -> LaunchConfig {
    LaunchConfig::single()
}

/// Waits (bounded) until `cond` holds; for releases that happen on the release thread.
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    cond()
}

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Launches `g` on a new stream and waits for it.
pub fn launch(gpu: &Gpu, g: &Graph) -> TestResult {
    let s = gpu.stream();
    g.launch(&s)?;
    s.synchronize()?;
    Ok(())
}

/// Instantiates `def`, launches it once and waits.
pub fn run(gpu: &Gpu, def: &GraphDefinition) -> TestResult {
    launch(gpu, &def.instantiate()?)
}

/// Holds `cond` true for a while: for "not released yet" checks (releases are asynchronous).
pub fn stays(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..20 {
        if !cond() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

/// Drops `values` one by one on a second thread while this one runs Global captures (an
/// `add_one` launch each, instantiated and launched), until the dropper is done and at least 50
/// captures ran. Every capture must stay valid (a drop that makes a call CUDA forbids during a
/// Global capture invalidates it, and the capture's `end_building` fails) and run once.
/// Returns how many ran.
pub fn global_captures_beside_drops<T: Send + 'static>(
    gpu: &Gpu,
    values: Vec<T>,
) -> Result<i32, Box<dyn std::error::Error>> {
    let add_one = gpu.f("add_one");
    let counter = gpu.device.alloc_zeroed::<i32>(1)?;
    let s = gpu.stream();
    let dropper = std::thread::spawn(move || {
        for v in values {
            drop(v);
            std::thread::yield_now();
        }
    });
    let mut cycles = 0;
    while !dropper.is_finished() || cycles < 50 {
        let b = s.create_graph_builder().begin_building(Global)?;
        // SAFETY: add_one(int*).
        unsafe { b.launch_unchecked(&add_one, one(), &crate::args![&counter])? };
        b.end_building()?.instantiate()?.launch(&s)?;
        cycles += 1;
    }
    s.synchronize()?;
    dropper.join().map_err(|_| "the dropping thread panicked")?;
    assert_eq!(counter.to_vec()?, [cycles], "every capture ran once");
    Ok(cycles)
}

/// Runs `f` on a thread and fails if it does not finish within `secs` (a hang becomes a failure).
pub fn within<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, Box<dyn std::error::Error>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(r) => Ok(r?),
        Err(_) => Err(format!("{what}: did not finish within {secs} s (hang)").into()),
    }
}
