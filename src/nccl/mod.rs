//! NCCL collectives on streams and captured into graphs (feature `nccl`).
//!
//! A [`Communicator`] is one rank of an NCCL communicator, on one device. Its collectives —
//! [`all_reduce`](Communicator::all_reduce), [`all_gather`](Communicator::all_gather),
//! [`reduce_scatter`](Communicator::reduce_scatter), [`broadcast`](Communicator::broadcast) —
//! run on a [`Stream`] or are recorded by a capturing
//! [`GraphBuilder`], so each GPU's graph holds its part of the collective
//! and a multi-GPU step is one graph launch per GPU. A graph that recorded a collective holds the
//! communicator and the buffers as long as the graph and its execs live, as it holds what a
//! captured kernel uses.
//!
//! Communicators come three ways:
//! - [`Communicator::for_devices`]: one per device of this process (`ncclCommInitAll`); a single
//!   device gives a one-rank communicator (the one-GPU case);
//! - [`Communicator::for_rank`]: this process's rank of a communicator that spans processes and
//!   machines (`ncclCommInitRank`), named by a [`UniqueId`] that one process makes
//!   ([`UniqueId::new`]) and sends to the others ([`UniqueId::as_bytes`] /
//!   [`UniqueId::from_bytes`]);
//! - clones of either, which share the communicator.
//!
//! **The library.** libnccl is opened when first used: NCCL's soname `libnccl.so.2` first, then
//! the names cudarc tries (`libnccl.so`, …), through the library path (`LD_LIBRARY_PATH`, the
//! `ldconfig` cache). A machine without it gets [`Error::NcclNotFound`](crate::Error::NcclNotFound),
//! never a panic; a failed NCCL call is [`Error::Nccl`](crate::Error::Nccl).
//!
//! **Before capturing**, run each collective once on a plain stream: NCCL sets up a
//! communicator's connections on its first use of them, with calls that a `Global` capture
//! forbids.
//!
//! ```no_run
//! use cuda_graph::nccl::{Communicator, ReduceOp};
//! use cuda_graph::prelude::*;
//!
//! # fn main() -> cuda_graph::Result<()> {
//! let device = Device::new(0)?;
//! let comm = Communicator::for_device(&device)?; // one rank
//! let x = device.htod(&[1.0f32, 2.0, 3.0])?;
//! let stream = device.create_stream()?;
//! comm.all_reduce(&stream, &x, &x, ReduceOp::Sum)?; // warm-up, in place
//! stream.synchronize()?;
//!
//! let builder = stream.create_graph_builder().begin_building(Global)?;
//! comm.all_reduce(&builder, &x, &x, ReduceOp::Sum)?;
//! let graph = builder.end_building()?.instantiate()?;
//! graph.launch(&stream)?;
//! stream.synchronize()?;
//! # Ok(()) }
//! ```
//!
//! The design, and how a multi-process, multi-node program uses this, is in
//! [the NCCL design notes](crate::docs::design::nccl).

use std::fmt;

use crate::builder::{IsCapturing, Kind};
use crate::error::Result;
use crate::{DeviceCopy, GraphBuilder, Stream};

mod comm;
mod group;
#[cfg(test)]
mod tests;

pub use comm::Communicator;
pub use group::group;

static_assertions::assert_impl_all!(Communicator: Send, Sync, Clone, fmt::Debug);
static_assertions::assert_impl_all!(UniqueId: Send, Sync, Copy, fmt::Debug);

/// An element type NCCL reduces and moves: its `ncclDataType_t` ([`DataType`]).
///
/// Implemented for `i8`, `u8`, `i32`, `u32`, `i64`, `u64`, `f32`, `f64`, and with the feature
/// `half`, `half::f16` and `half::bf16`. Sealed.
///
/// ```
/// use cuda_graph::nccl::{DataType, NcclType};
/// assert_eq!(f32::DATA_TYPE, DataType::Float32);
/// ```
pub trait NcclType: DeviceCopy + sealed::Sealed {
    /// The NCCL type of the elements.
    const DATA_TYPE: DataType;
}

/// NCCL's element types (`ncclDataType_t`), as nccl.h numbers them.
///
/// ```
/// use cuda_graph::nccl::DataType;
/// assert_eq!(DataType::Float16.raw(), 6); // ncclFloat16
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataType {
    /// `ncclInt8`.
    Int8,
    /// `ncclUint8`.
    Uint8,
    /// `ncclInt32`.
    Int32,
    /// `ncclUint32`.
    Uint32,
    /// `ncclInt64`.
    Int64,
    /// `ncclUint64`.
    Uint64,
    /// `ncclFloat16` (`half::f16`).
    Float16,
    /// `ncclFloat32`.
    Float32,
    /// `ncclFloat64`.
    Float64,
    /// `ncclBfloat16` (`half::bf16`; NCCL 2.10 and newer).
    Bfloat16,
}

impl DataType {
    /// The `ncclDataType_t` value.
    ///
    /// ```
    /// assert_eq!(cuda_graph::nccl::DataType::Float32.raw(), 7); // ncclFloat32
    /// ```
    pub fn raw(self) -> i32 {
        match self {
            DataType::Int8 => 0,
            DataType::Uint8 => 1,
            DataType::Int32 => 2,
            DataType::Uint32 => 3,
            DataType::Int64 => 4,
            DataType::Uint64 => 5,
            DataType::Float16 => 6,
            DataType::Float32 => 7,
            DataType::Float64 => 8,
            DataType::Bfloat16 => 9,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! nccl_type {
    ($($t:ty => $d:ident),* $(,)?) => { $(
        impl sealed::Sealed for $t {}
        impl NcclType for $t {
            const DATA_TYPE: DataType = DataType::$d;
        }
    )* };
}

nccl_type!(
    i8 => Int8, u8 => Uint8, i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64,
    f32 => Float32, f64 => Float64,
);
#[cfg(feature = "half")]
nccl_type!(half::f16 => Float16, half::bf16 => Bfloat16);

/// The reduction of [`Communicator::all_reduce`] and [`Communicator::reduce_scatter`]
/// (`ncclRedOp_t`).
///
/// ```
/// use cuda_graph::nccl::ReduceOp;
/// assert_eq!(ReduceOp::Max.raw(), 2); // ncclMax
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`: the sum divided by the number of ranks (NCCL 2.10 and newer).
    Avg,
}

impl ReduceOp {
    /// The `ncclRedOp_t` value.
    ///
    /// ```
    /// assert_eq!(cuda_graph::nccl::ReduceOp::Sum.raw(), 0); // ncclSum
    /// ```
    pub fn raw(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
        }
    }
}

/// The id that names one communicator across processes (`ncclUniqueId`, 128 bytes): made once by
/// one process ([`new`](Self::new)), sent to every other rank's process by the program (over
/// MPI, a TCP socket, a file, an environment variable…), and passed to
/// [`Communicator::for_rank`] by every rank.
///
/// ```no_run
/// use cuda_graph::nccl::UniqueId;
/// # fn main() -> cuda_graph::Result<()> {
/// let id = UniqueId::new()?; // on rank 0
/// let bytes: [u8; 128] = *id.as_bytes(); // send these to the other ranks
/// let same = UniqueId::from_bytes(bytes); // on the other ranks
/// assert_eq!(id, same);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    bytes: [u8; 128],
}

impl UniqueId {
    /// A new id (`ncclGetUniqueId`). NCCL's bootstrap listens on this machine for the ranks that
    /// join with it; make one per communicator.
    ///
    /// [`Error::NcclNotFound`](crate::Error::NcclNotFound) where libnccl cannot be loaded.
    ///
    /// ```no_run
    /// # fn main() -> cuda_graph::Result<()> {
    /// let id = cuda_graph::nccl::UniqueId::new()?;
    /// # let _ = id;
    /// # Ok(()) }
    /// ```
    pub fn new() -> Result<UniqueId> {
        let raw = crate::driver::nccl::unique_id()?;
        Ok(UniqueId {
            bytes: raw.internal.map(|c| c as u8),
        })
    }

    /// The id from the 128 bytes another process sent ([`as_bytes`](Self::as_bytes) there).
    ///
    /// ```
    /// let id = cuda_graph::nccl::UniqueId::from_bytes([0; 128]);
    /// assert_eq!(id.as_bytes(), &[0; 128]);
    /// ```
    pub fn from_bytes(bytes: [u8; 128]) -> UniqueId {
        UniqueId { bytes }
    }

    /// The id's 128 bytes, to send to the other ranks' processes.
    ///
    /// ```no_run
    /// # fn main() -> cuda_graph::Result<()> {
    /// let id = cuda_graph::nccl::UniqueId::new()?;
    /// std::fs::write("/shared/nccl-id", id.as_bytes()).ok();
    /// # Ok(()) }
    /// ```
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.bytes
    }

    pub(crate) fn raw(&self) -> cudarc::nccl::sys::ncclUniqueId {
        cudarc::nccl::sys::ncclUniqueId {
            internal: self.bytes.map(|b| b as std::ffi::c_char),
        }
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The first bytes tell ids apart; all 128 would flood a log.
        write!(f, "UniqueId(")?;
        for b in &self.bytes[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// The loaded NCCL's version as `ncclGetVersion` gives it: `major * 10000 + minor * 100 +
/// patch` (e.g. `22304` for 2.23.4). [`Error::NcclNotFound`](crate::Error::NcclNotFound) where
/// libnccl cannot be loaded.
///
/// ```
/// match cuda_graph::nccl::version() {
///     Ok(v) => println!("NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100),
///     Err(e) => println!("no NCCL: {e}"),
/// }
/// ```
pub fn version() -> Result<i32> {
    crate::driver::nccl::version()
}

/// Where a collective runs: a [`Stream`] (the collective runs there, or is recorded into the
/// capture the stream takes part in), or a capturing [`GraphBuilder`] (the collective is
/// recorded into its graph). Sealed.
///
/// A builder that is not capturing does not compile:
///
/// ```compile_fail
/// # use cuda_graph::nccl::{Communicator, ReduceOp};
/// # use cuda_graph::prelude::*;
/// # fn f(comm: &Communicator, device: &Device, x: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
/// let builder = device.create_graph_builder()?; // NotStarted
/// comm.all_reduce(&builder, x, x, ReduceOp::Sum)?;
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "a collective runs on a `Stream` or records into a capturing `GraphBuilder`, not on `{Self}`",
    label = "not a stream or a capturing builder",
    note = "call `begin_building(Global)` (or `ThreadLocal` / `Relaxed`) on the builder first; an `Ended` builder records no more work"
)]
pub trait CollectiveStream: on::Sealed {
    /// The stream the collective is issued on.
    #[doc(hidden)]
    fn collective_stream(&self) -> &Stream;
}

mod on {
    pub trait Sealed {}
}

impl on::Sealed for Stream {}
impl CollectiveStream for Stream {
    fn collective_stream(&self) -> &Stream {
        self
    }
}

impl<K: Kind, S: IsCapturing> on::Sealed for GraphBuilder<K, S> {}
impl<K: Kind, S: IsCapturing> CollectiveStream for GraphBuilder<K, S> {
    fn collective_stream(&self) -> &Stream {
        self.stream()
    }
}
