//! Device queries: count, ordinals, name, attributes, memory, the graph memory pool.
//!
//! The queries that take no context (count, ordinals, peer access, name, attributes) refuse a
//! host callback's thread themselves (`refuse_in_host_callback`): the others bind a context,
//! which refuses it.

use std::ffi::c_char;

use cudarc::driver::sys;

use super::drv;
use crate::error::Result;

/// The number of CUDA devices (`cuDeviceGetCount`).
pub(crate) fn count() -> Result<i32> {
    super::context::refuse_in_host_callback()?;
    let mut n = 0;
    // SAFETY: `drv!` loads and initialises the driver first; `n` is a valid out pointer.
    unsafe { drv!(cuDeviceGetCount(&mut n)) }?;
    Ok(n)
}

/// The device with ordinal `ordinal` (`cuDeviceGet`); the driver refuses an ordinal out of range.
pub(crate) fn get(ordinal: i32) -> Result<sys::CUdevice> {
    super::context::refuse_in_host_callback()?;
    let mut dev = 0;
    // SAFETY: `dev` is a valid out pointer; any ordinal is checked by the driver.
    unsafe { drv!(cuDeviceGet(&mut dev, ordinal)) }?;
    Ok(dev)
}

/// Whether device `device` can access memory of device `peer` (`cuDeviceCanAccessPeer`).
pub(crate) fn can_access_peer(device: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    super::context::refuse_in_host_callback()?;
    let mut can = 0;
    // SAFETY: both came from `cuDeviceGet`; `can` is a valid out pointer.
    unsafe { drv!(cuDeviceCanAccessPeer(&mut can, device, peer)) }?;
    Ok(can != 0)
}

/// Writes the device's name into `buf`, NUL-terminated, truncated to fit (`cuDeviceGetName`).
pub(crate) fn name(buf: &mut [c_char], device: sys::CUdevice) -> Result<()> {
    super::context::refuse_in_host_callback()?;
    // SAFETY: `buf` holds `buf.len()` bytes and the driver writes at most `len` including the NUL.
    unsafe { drv!(cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, device)) }
}

/// A device attribute (`cuDeviceGetAttribute`).
pub(crate) fn attribute(attr: sys::CUdevice_attribute, device: sys::CUdevice) -> Result<i32> {
    super::context::refuse_in_host_callback()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out pointer; `attr` is a valid attribute (a value of the enum).
    unsafe { drv!(cuDeviceGetAttribute(&mut v, attr, device)) }?;
    Ok(v)
}

/// The current context's device's free and total memory in bytes (`cuMemGetInfo_v2`).
///
/// # Safety
/// A context is current on the calling thread.
pub(crate) unsafe fn memory_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: the context is current (the caller's promise); both out pointers are valid.
    unsafe { drv!(cuMemGetInfo_v2(&mut free, &mut total)) }?;
    Ok((free, total))
}

/// A 64-bit attribute of the device's graph memory pool (`cuDeviceGetGraphMemAttribute`).
///
/// # Safety
/// The device's context is current, and `attr` is one of the attributes whose value is 64 bits.
pub(crate) unsafe fn graph_mem_attribute_u64(
    device: sys::CUdevice,
    attr: sys::CUgraphMem_attribute,
) -> Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the context is current (the caller's promise); this attribute is a 64-bit value
    // written into `v`.
    unsafe {
        drv!(cuDeviceGetGraphMemAttribute(
            device,
            attr,
            (&mut v as *mut u64).cast()
        ))
    }?;
    Ok(v)
}

/// Gives the device's graph memory pool's unused memory back to the device
/// (`cuDeviceGraphMemTrim`).
///
/// # Safety
/// The device's context is current.
pub(crate) unsafe fn graph_mem_trim(device: sys::CUdevice) -> Result<()> {
    // SAFETY: the context is current (the caller's promise); trimming releases only memory no
    // graph uses.
    unsafe { drv!(cuDeviceGraphMemTrim(device)) }
}

/// Resets a high-water attribute of the device's graph memory pool to 0
/// (`cuDeviceSetGraphMemAttribute`).
///
/// # Safety
/// The device's context is current, and `attr` is `USED_MEM_HIGH` or `RESERVED_MEM_HIGH` (the
/// only settable ones, whose value is 64 bits).
pub(crate) unsafe fn reset_graph_mem_high(
    device: sys::CUdevice,
    attr: sys::CUgraphMem_attribute,
) -> Result<()> {
    let mut zero: u64 = 0;
    // SAFETY: the context is current (the caller's promise); the driver reads a 64-bit 0.
    unsafe {
        drv!(cuDeviceSetGraphMemAttribute(
            device,
            attr,
            (&mut zero as *mut u64).cast()
        ))
    }
}
