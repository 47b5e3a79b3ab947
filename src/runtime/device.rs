use std::sync::Arc;

use cudarc::driver::sys;

use super::{DeviceBuffer, DeviceCopy, Event, Module, Stream};
use crate::driver;
use crate::driver::context::PrimaryContext;
use crate::driver::event::EventHandle;
use crate::driver::memory::DeviceAlloc;
use crate::driver::module::ModuleHandle;
use crate::driver::stream::StreamHandle;
use crate::error::{Error, Result};

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
    pub fn count() -> Result<usize> {
        driver::loaded()?;
        let n = driver::device::count()?;
        Ok(n.max(0) as usize)
    }

    /// Opens device `ordinal` and retains its primary context.
    ///
    /// Fails with [`Error::DriverNotFound`] without a driver and [`Error::InvalidDevice`] for an
    /// ordinal past [`Device::count`].
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
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal
    }

    /// The device's name, e.g. `NVIDIA H200`.
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
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        use sys::CUdevice_attribute::*;
        let major = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok((major as u32, minor as u32))
    }

    /// Creates a new non-blocking stream on this device.
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
    pub fn create_event(&self) -> Result<Event> {
        Ok(Event {
            handle: EventHandle::new(&self.ctx)?,
        })
    }

    /// Allocates `len` zeroed elements of `T` on the device.
    ///
    /// A zero length, or a size that overflows `usize`, is an [`Error::InvalidArgument`]; an
    /// allocation the device cannot hold is the driver's `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn alloc_zeroed<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot allocate a zero-length device buffer".into(),
            ));
        }
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{len} elements of {} bytes overflow the address space",
                std::mem::size_of::<T>()
            ))
        })?;
        Ok(DeviceBuffer::new(
            DeviceAlloc::zeroed(&self.ctx, bytes)?,
            len,
        ))
    }

    /// Allocates a device buffer holding a copy of `data` (synchronous).
    pub fn htod<T: DeviceCopy>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let buf = self.alloc_zeroed::<T>(data.len())?;
        buf.copy_from(data)?;
        Ok(buf)
    }

    /// Loads a module from a cubin, fatbin or PTX image.
    ///
    /// The image is checked before the driver sees it, since the driver takes no length: an
    /// empty image, or a cubin (ELF64) or fatbin whose headers, sections, segments or entries
    /// lie past the end of `image` (or are malformed), is an [`Error::InvalidArgument`] naming
    /// what is wrong; an uncompressed cubin inside a fatbin is checked the same way. Anything
    /// else that is neither ELF nor fatbin is passed as PTX text (NUL-terminated for the driver),
    /// so a bad image gives the driver's error, e.g.
    /// `cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed`.
    pub fn load_module(&self, image: &[u8]) -> Result<Module> {
        let aligned = super::image::prepare_image(image)?;
        // `aligned` is a u64 buffer, so the image is 8-byte aligned as fatbins require.
        // SAFETY: reinterpreting `[u64]` as bytes is always valid.
        let bytes =
            unsafe { std::slice::from_raw_parts(aligned.as_ptr().cast::<u8>(), aligned.len() * 8) };
        Ok(Module {
            handle: ModuleHandle::load(&self.ctx, bytes)?,
        })
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
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current.
        unsafe { driver::context::synchronize() }
    }
}
