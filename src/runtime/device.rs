use std::sync::Arc;

use cudarc::driver::sys;

use super::{DeviceBuffer, DeviceCopy, Event, EventOptions, Module, PinnedBuffer, Stream};
use crate::driver;
use crate::driver::context::PrimaryContext;
use crate::driver::event::EventHandle;
use crate::driver::memory::DeviceAlloc;
use crate::driver::module::ModuleHandle;
use crate::driver::stream::StreamHandle;
use crate::error::{Error, Refusal, Result};

/// A CUDA device and its retained primary context.
///
/// Cloning is cheap and shares the context. Every call that needs a context makes this device's
/// primary context current on the calling thread first. `Send + Sync`.
///
/// ```no_run
/// use cuda_graph::prelude::*;
/// # fn main() -> cuda_graph::Result<()> {
/// let device = Device::new(0)?;
/// let (major, minor) = device.compute_capability()?;
/// println!("{} (sm_{major}{minor})", device.name()?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Device {
    pub(crate) ctx: Arc<PrimaryContext>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ctx.ordinal)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// The number of CUDA devices. Fails with [`Error::DriverNotFound`] without a driver.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// println!("{} CUDA device(s)", Device::count()?);
    /// # Ok(()) }
    /// ```
    pub fn count() -> Result<usize> {
        driver::loaded()?;
        let n = driver::device::count()?;
        Ok(n.max(0) as usize)
    }

    /// Opens device `ordinal` and retains its primary context.
    ///
    /// Fails with [`Error::DriverNotFound`] without a driver and [`Error::InvalidDevice`] for an
    /// ordinal past [`Device::count`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// let device = Device::new(0)?; // Error::DriverNotFound without a driver
    /// println!("{}", device.name()?);
    /// # Ok(()) }
    /// ```
    pub fn new(ordinal: usize) -> Result<Device> {
        let count = Self::count()?;
        if ordinal >= count {
            return Err(Error::InvalidDevice { ordinal, count });
        }
        let dev = driver::device::get(ordinal as i32)?;
        Ok(Device {
            ctx: PrimaryContext::retain(ordinal, dev)?,
        })
    }

    pub(crate) fn from_ctx(ctx: &Arc<PrimaryContext>) -> Device {
        Device { ctx: ctx.clone() }
    }

    /// The device's ordinal.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// assert_eq!(Device::new(device.ordinal())?.ordinal(), device.ordinal());
    /// # Ok(()) }
    /// ```
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal
    }

    /// The device's name, e.g. `NVIDIA H200`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// println!("{}", device.name()?); // e.g. NVIDIA H200
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> Result<String> {
        let mut buf = [0 as std::ffi::c_char; 256];
        driver::device::name(&mut buf, self.ctx.device)?;
        // SAFETY: the driver wrote a NUL-terminated string into `buf` (zero-initialised, so a NUL
        // is present even if it wrote nothing).
        let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    fn attribute(&self, attr: sys::CUdevice_attribute) -> Result<i32> {
        driver::device::attribute(attr, self.ctx.device)
    }

    /// The compute capability as `(major, minor)`, e.g. `(9, 0)` for Hopper.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let (major, minor) = device.compute_capability()?;
    /// println!("sm_{major}{minor}");
    /// # Ok(()) }
    /// ```
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        use sys::CUdevice_attribute::*;
        let major = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok((major as u32, minor as u32))
    }

    /// The context's launch and stream priorities as `(least, greatest)`: lower numbers are
    /// higher priorities, so `greatest <= least` (`cuCtxGetStreamPriorityRange`; `(0, -5)` on
    /// an H100). What [`LaunchConfig::with_priority`](crate::LaunchConfig::with_priority) takes.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let (least, greatest) = device.stream_priority_range()?;
    /// let urgent = LaunchConfig::single().with_priority(greatest);
    /// # Ok(()) }
    /// ```
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.ctx.bind()?;
        // SAFETY: the context is bound just above.
        unsafe { driver::launch::priority_range(&self.ctx) }
    }

    /// Creates a new non-blocking stream on this device.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let stream = device.create_stream()?;
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn create_stream(&self) -> Result<Stream> {
        Ok(Stream {
            handle: StreamHandle::new(&self.ctx)?,
        })
    }

    /// A stream from the context's pool, returned to it when dropped (forks, bodies).
    pub(crate) fn pooled_stream(&self) -> Result<Stream> {
        Ok(Stream {
            handle: StreamHandle::pooled(&self.ctx)?,
        })
    }

    /// An event from the context's pool, returned to it when dropped (forks, joins).
    pub(crate) fn pooled_event(&self) -> Result<Event> {
        Ok(Event {
            handle: EventHandle::pooled(&self.ctx)?,
        })
    }

    /// Creates an event (timing disabled).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device, stream: &Stream) -> cuda_graph::Result<()> {
    /// let done = device.create_event()?;
    /// stream.record(&done)?;
    /// done.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn create_event(&self) -> Result<Event> {
        Ok(Event {
            handle: EventHandle::new(&self.ctx)?,
        })
    }

    /// Creates an event with `options` (timing, blocking waits).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::EventOptions;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let event = device.create_event_with(&EventOptions::default().timing(true))?;
    /// # Ok(()) }
    /// ```
    pub fn create_event_with(&self, options: &EventOptions) -> Result<Event> {
        Ok(Event {
            handle: EventHandle::with_flags(&self.ctx, options.flags())?,
        })
    }

    /// Allocates `len` zeroed elements of `T` on the device.
    ///
    /// A zero length, or a size that overflows `usize`, is an [`Error::InvalidArgument`]; an
    /// allocation the device cannot hold is the driver's `CUDA_ERROR_OUT_OF_MEMORY`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let buf = device.alloc_zeroed::<u32>(1024)?;
    /// assert_eq!(buf.to_vec()?, vec![0; 1024]);
    /// # Ok(()) }
    /// ```
    pub fn alloc_zeroed<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = super::pinned::device_byte_size::<T>(len)?;
        Ok(DeviceBuffer::new(
            DeviceAlloc::zeroed(&self.ctx, bytes)?,
            len,
        ))
    }

    /// Allocates `len` zeroed elements of `T` in page-locked host memory, the host side of
    /// asynchronous copies ([`Stream::memcpy_htod_async`], [`Stream::memcpy_dtoh_async`]).
    ///
    /// A zero length, or a size that overflows `usize`, is an [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let mut host = device.alloc_pinned::<u32>(4096)?;
    /// host.as_mut_slice()?.fill(3);
    /// # Ok(()) }
    /// ```
    pub fn alloc_pinned<T: DeviceCopy>(&self, len: usize) -> Result<PinnedBuffer<T>> {
        PinnedBuffer::new(self, len)
    }

    /// Allocates a device buffer holding a copy of `data`: [`alloc_zeroed`](Self::alloc_zeroed)
    /// then [`DeviceBuffer::copy_from`]. It waits for its own zeroing and copy only (on a private
    /// stream of the context), not for other work, so it works while other streams capture.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let buf = device.htod(&[1.0f32, 2.0, 3.0])?;
    /// assert_eq!(buf.to_vec()?, [1.0, 2.0, 3.0]);
    /// # Ok(()) }
    /// ```
    pub fn htod<T: DeviceCopy>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let buf = self.alloc_zeroed::<T>(data.len())?;
        buf.copy_from(data)?;
        Ok(buf)
    }

    /// Loads a module from PTX text: the driver compiles it for this device (its JIT compiler),
    /// and the kernels it declares are then [`Module::function`]s.
    ///
    /// This is the safe way to load code built elsewhere. The driver's PTX path reads text up to
    /// its end and reports what it cannot compile as an error: fuzzing it with thousands of
    /// truncated and byte-changed PTX files gave errors or modules, never a crash (see
    /// `docs/design/kernels.md`, "Module images"; `examples/ptx_fuzz.rs` repeats the run). Text with a
    /// NUL or a control character other than tabs, line ends and form feeds is an
    /// [`Error::InvalidArgument`] before the driver sees it; PTX the driver refuses is its error,
    /// e.g. `cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation
    /// failed`. PTX made by a newer toolkit than the driver is refused that way too: ship PTX
    /// from a toolkit no newer than the oldest driver you support, or compile at run time
    /// (`Device::compile`, feature `nvrtc`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// # let ptx = String::new();
    /// // `ptx`: text read from a file, received from a user, or made by a compiler.
    /// let module = device.load_ptx(&ptx)?;
    /// let add_one = module.function("add_one")?;
    /// # let _ = add_one;
    /// # Ok(()) }
    /// ```
    pub fn load_ptx(&self, ptx: &str) -> Result<Module> {
        if let Some(at) = ptx.find('\0') {
            return Err(Error::invalid(
                Refusal::Image,
                format!(
                    "the PTX text holds a NUL at offset {at}: the driver would stop reading there"
                ),
            ));
        }
        super::image::check_ptx_text(ptx.as_bytes())?;
        // SAFETY: the image is PTX text (checked above), which the driver compiles and whose
        // errors it reports, whatever the text says (fuzzed: see `docs/design/kernels.md`, "Module images").
        unsafe { self.load_module(ptx.as_bytes()) }
    }

    /// Loads a module from a binary image (a cubin or fatbin) or PTX text.
    ///
    /// # Safety
    /// The driver parses a binary image far beyond any container check and crashes the process
    /// on some corrupt ones (a fatbin with one byte changed dies with `SIGSEGV` inside
    /// `cuModuleLoadData`, with or without this crate). So the caller promises that `image` is
    /// what a CUDA tool made, unmodified: a cubin or fatbin produced by nvcc, ptxas, nvlink,
    /// nvJitLink or NVRTC (for example read from a file your build wrote, or
    /// `include_bytes!`'d), or PTX text. Any bytes from elsewhere (downloaded, user-supplied,
    /// possibly truncated) must not be passed here; PTX from elsewhere goes through the safe
    /// [`load_ptx`](Self::load_ptx).
    ///
    /// The image is still checked before the driver sees it, as defence in depth and for clear
    /// errors, not as a guarantee: an empty image, or a cubin (ELF64) or fatbin whose headers,
    /// sections, segments, symbol or relocation tables or entries lie past the end of `image`
    /// (or are malformed), is an [`Error::InvalidArgument`] naming what is wrong; an
    /// uncompressed cubin inside a fatbin is checked the same way. Anything else that is neither
    /// ELF nor fatbin must be PTX text, passed NUL-terminated to the driver.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// # const KERNELS: &[u8] = &[];
    /// // KERNELS: `include_bytes!("../kernels/kernels.fatbin")`, which nvcc wrote at build time.
    /// // SAFETY: a fatbin nvcc made, unmodified.
    /// let module = unsafe { device.load_module(KERNELS)? };
    /// let add_one = module.function("add_one")?;
    /// # let _ = add_one;
    /// # Ok(()) }
    /// ```
    pub unsafe fn load_module(&self, image: &[u8]) -> Result<Module> {
        let aligned = super::image::prepare_image(image)?;
        // `aligned` is a u64 buffer, so the image is 8-byte aligned as fatbins require.
        // SAFETY: reinterpreting `[u64]` as bytes is always valid.
        let bytes =
            unsafe { std::slice::from_raw_parts(aligned.as_ptr().cast::<u8>(), aligned.len() * 8) };
        Ok(Module {
            handle: ModuleHandle::load(&self.ctx, bytes)?,
        })
    }

    /// Compiles CUDA C++ `source` for this device with NVRTC and loads it (feature `nvrtc`):
    /// the kernels it declares `extern "C"` are then [`Module::function`]s. It is compiled to
    /// a cubin for the device's architecture (`-arch=sm_XY`, from its compute capability), so
    /// the driver needs no PTX JIT; [`compile_with`](Self::compile_with) takes more options.
    ///
    /// NVRTC (`libnvrtc`, part of the CUDA toolkit) is opened on first use: without it this is
    /// [`Error::NvrtcNotFound`]. Source NVRTC refuses is [`Error::Compile`], with the compiler's
    /// log.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let module = device.compile(
    ///     r#"extern "C" __global__ void add_one(int* p) { p[threadIdx.x] += 1; }"#,
    /// )?;
    /// let add_one = module.function("add_one")?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "nvrtc")]
    pub fn compile(&self, source: &str) -> Result<Module> {
        self.compile_with(source, &[])
    }

    /// [`compile`](Self::compile) with NVRTC options besides the architecture (`-default-device`,
    /// `-std=c++17`, `-DNAME=value`, `-lineinfo`, ...; see NVRTC's documentation). Feature
    /// `nvrtc`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let module = device.compile_with(
    ///     r#"extern "C" __global__ void fill(int* p) { p[threadIdx.x] = VALUE; }"#,
    ///     &["-DVALUE=7"],
    /// )?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "nvrtc")]
    pub fn compile_with(&self, source: &str, options: &[&str]) -> Result<Module> {
        let (major, minor) = self.compute_capability()?;
        let mut opts = vec![format!("-arch=sm_{major}{minor}")];
        opts.extend(options.iter().map(|o| o.to_string()));
        let cubin = driver::nvrtc::compile_cubin(source, "cuda_graph.cu", &opts)?;
        // SAFETY: NVRTC made this cubin for this device, just now, and nothing changed it.
        unsafe { self.load_module(&cubin) }
    }

    /// The device's free and total memory in bytes (`cuMemGetInfo`), as the driver sees it now.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let (free, total) = device.memory_info()?;
    /// println!("{} of {} MiB free", free >> 20, total >> 20);
    /// # Ok(()) }
    /// ```
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx.bind()?;
        // SAFETY: the context is current.
        unsafe { driver::device::memory_info() }
    }

    /// Bytes of graph memory (from memory allocation nodes) the device's graph pool holds now,
    /// across all graphs (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`): allocated, or freed and kept in
    /// the pool until [`trim_graph_memory`](Self::trim_graph_memory).
    ///
    /// Memory a graph allocates without freeing it stays allocated after the launch; the
    /// [`Graph`](crate::Graph) frees it when dropped (see
    /// [`GraphDefinition::add_mem_alloc`](crate::GraphDefinition::add_mem_alloc)).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// println!("{} bytes of graph memory in use", device.graph_memory_in_use()?);
    /// # Ok(()) }
    /// ```
    pub fn graph_memory_in_use(&self) -> Result<u64> {
        self.ctx.bind()?;
        let attr = sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT;
        // SAFETY: the context is current; this attribute is a 64-bit value.
        unsafe { driver::device::graph_mem_attribute_u64(self.ctx.device, attr) }
    }

    /// The usage of the device's graph memory pool (`cuDeviceGetGraphMemAttribute`): memory
    /// in use by graph allocations and memory reserved by the pool, now and at their high-water
    /// marks.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let usage = device.graph_memory_usage()?;
    /// println!("{} of {} bytes reserved are in use", usage.used_current, usage.reserved_current);
    /// # Ok(()) }
    /// ```
    pub fn graph_memory_usage(&self) -> Result<GraphMemoryUsage> {
        use sys::CUgraphMem_attribute::*;
        self.ctx.bind()?;
        let get = |attr| {
            // SAFETY: the context is current; the four attributes read here are 64-bit values.
            unsafe { driver::device::graph_mem_attribute_u64(self.ctx.device, attr) }
        };
        Ok(GraphMemoryUsage {
            used_current: get(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            used_high: get(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
            reserved_current: get(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: get(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Resets the high-water marks of the device's graph memory pool
    /// ([`GraphMemoryUsage::used_high`] and [`GraphMemoryUsage::reserved_high`]) to 0
    /// (`cuDeviceSetGraphMemAttribute`); they then rise again with the next use.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// device.reset_graph_memory_high_watermarks()?;
    /// # Ok(()) }
    /// ```
    pub fn reset_graph_memory_high_watermarks(&self) -> Result<()> {
        use sys::CUgraphMem_attribute::*;
        self.ctx.bind()?;
        for attr in [
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        ] {
            // SAFETY: the context is current; both are the settable high-water attributes.
            unsafe { driver::device::reset_graph_mem_high(self.ctx.device, attr) }?;
        }
        Ok(())
    }

    /// Gives the device's graph memory pool's unused memory back to the device
    /// (`cuDeviceGraphMemTrim`): memory that graphs allocated and freed stays in the pool, for
    /// their next launches, until trimmed.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// device.trim_graph_memory()?;
    /// # Ok(()) }
    /// ```
    pub fn trim_graph_memory(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current; trimming releases only memory no graph uses.
        unsafe { driver::device::graph_mem_trim(self.ctx.device) }
    }

    /// Blocks until all work on this device is done.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// device.synchronize()?; // every stream of the device
    /// # Ok(()) }
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current.
        unsafe { driver::context::synchronize() }
    }
}

/// The usage of a device's graph memory pool, in bytes
/// ([`Device::graph_memory_usage`]): what memory allocation nodes use and what the pool
/// reserves from the device, now and at their high-water marks (since the pool was made or the
/// marks were last reset with [`Device::reset_graph_memory_high_watermarks`]).
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(device: &Device) -> cuda_graph::Result<()> {
/// let u = device.graph_memory_usage()?;
/// assert!(u.used_current <= u.used_high);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphMemoryUsage {
    /// Memory allocated by graphs now, or freed and kept in the pool
    /// (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`).
    pub used_current: u64,
    /// The high-water mark of `used_current` (`CU_GRAPH_MEM_ATTR_USED_MEM_HIGH`).
    pub used_high: u64,
    /// Memory the pool has reserved from the device now (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved_current: u64,
    /// The high-water mark of `reserved_current` (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH`).
    pub reserved_high: u64,
}
