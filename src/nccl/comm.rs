//! [`Communicator`]: one rank of an NCCL communicator, and its collectives.

use std::fmt;
use std::sync::Arc;

use super::{group, CollectiveStream, NcclType, ReduceOp, UniqueId};
use crate::driver::nccl::{self as raw, CommHandle, Op};
use crate::error::{Error, Refusal, Result};
use crate::runtime::OwnerRef;
use crate::{Device, DeviceBuffer, ReleaseObserver, Stream};

/// One rank of an NCCL communicator, on one device. Clones share it.
///
/// The communicator is destroyed (`ncclCommDestroy`) when the last clone, and the last graph and
/// exec that recorded a collective on it, are gone — after those graphs and execs themselves.
/// `Send + Sync`; NCCL requires that a rank's collectives be issued in the same order on every
/// rank.
///
/// ```no_run
/// use cuda_graph::nccl::{Communicator, ReduceOp};
/// use cuda_graph::prelude::*;
/// # fn main() -> cuda_graph::Result<()> {
/// let device = Device::new(0)?;
/// let comm = Communicator::for_device(&device)?;
/// assert_eq!((comm.rank(), comm.ranks()), (0, 1));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Communicator {
    handle: Arc<CommHandle>,
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("device", &self.handle.ctx.ordinal)
            .field("rank", &self.handle.rank)
            .field("ranks", &self.handle.nranks)
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// One communicator per device of `devices`, rank `i` on `devices[i]`
    /// (`ncclCommInitAll`): the ranks of one process. One device gives a one-rank communicator.
    ///
    /// An empty list, or a device listed twice, is an [`Error::InvalidArgument`]; where libnccl
    /// cannot be loaded, [`Error::NcclNotFound`].
    ///
    /// Issue the collectives of several ranks from one thread inside [`group`](super::group), or
    /// from one thread per device.
    ///
    /// ```no_run
    /// use cuda_graph::nccl::Communicator;
    /// use cuda_graph::prelude::*;
    /// # fn main() -> cuda_graph::Result<()> {
    /// let devices = (0..Device::count()?).map(Device::new).collect::<Result<Vec<_>>>()?;
    /// let comms = Communicator::for_devices(&devices)?;
    /// # let _ = comms;
    /// # Ok(()) }
    /// ```
    pub fn for_devices(devices: &[Device]) -> Result<Vec<Communicator>> {
        check_devices(&devices.iter().map(Device::ordinal).collect::<Vec<_>>())?;
        let ctxs: Vec<_> = devices.iter().map(|d| d.ctx.clone()).collect();
        Ok(raw::init_all(&ctxs)?
            .into_iter()
            .map(|handle| Communicator { handle })
            .collect())
    }

    /// A one-rank communicator on `device`: [`for_devices`](Self::for_devices) of one device.
    /// Its collectives copy (or reduce over one rank, which is a copy too): the one-GPU case of
    /// a program written for many.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let comm = cuda_graph::nccl::Communicator::for_device(device)?;
    /// # let _ = comm;
    /// # Ok(()) }
    /// ```
    pub fn for_device(device: &Device) -> Result<Communicator> {
        let mut comms = Self::for_devices(std::slice::from_ref(device))?;
        comms
            .pop()
            .ok_or_else(|| Error::Internal("ncclCommInitAll made no communicator".into()))
    }

    /// This process's rank `rank` of the `ranks` ranks of the communicator `id` names, on
    /// `device` (`ncclCommInitRank`): one process per GPU, on one machine or many. Blocks until
    /// every rank has joined. Every rank passes the same `id` (made by one of them with
    /// [`UniqueId::new`]) and `ranks`, and its own `rank`.
    ///
    /// `rank >= ranks` or `ranks == 0` is an [`Error::InvalidArgument`], refused before NCCL
    /// is asked.
    ///
    /// ```no_run
    /// use cuda_graph::nccl::{Communicator, UniqueId};
    /// use cuda_graph::prelude::*;
    /// # fn receive_from_rank_0() -> [u8; 128] { [0; 128] }
    /// # fn main() -> cuda_graph::Result<()> {
    /// let (rank, ranks) = (1, 8); // from the launcher, e.g. RANK and WORLD_SIZE
    /// let id = UniqueId::from_bytes(receive_from_rank_0());
    /// let device = Device::new(0)?; // this process's GPU
    /// let comm = Communicator::for_rank(&device, &id, rank, ranks)?;
    /// # let _ = comm;
    /// # Ok(()) }
    /// ```
    pub fn for_rank(
        device: &Device,
        id: &UniqueId,
        rank: usize,
        ranks: usize,
    ) -> Result<Communicator> {
        check_rank(rank, ranks)?;
        Ok(Communicator {
            handle: raw::init_rank(&device.ctx, ranks, id.raw(), rank)?,
        })
    }

    /// This communicator's rank.
    ///
    /// ```no_run
    /// # fn f(comm: &cuda_graph::nccl::Communicator) {
    /// println!("rank {} of {}", comm.rank(), comm.ranks());
    /// # }
    /// ```
    pub fn rank(&self) -> usize {
        self.handle.rank
    }

    /// How many ranks the communicator has.
    ///
    /// ```no_run
    /// # fn f(comm: &cuda_graph::nccl::Communicator) {
    /// let share = 4096 / comm.ranks();
    /// # let _ = share;
    /// # }
    /// ```
    pub fn ranks(&self) -> usize {
        self.handle.nranks
    }

    /// The device of this rank.
    ///
    /// ```no_run
    /// # fn f(comm: &cuda_graph::nccl::Communicator) -> cuda_graph::Result<()> {
    /// let stream = comm.device().create_stream()?;
    /// # let _ = stream;
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        Device::from_ctx(&self.handle.ctx)
    }

    /// Watches the communicator without keeping it alive: released once every clone, graph and
    /// exec that held it is gone (and it was destroyed).
    ///
    /// ```no_run
    /// # fn f(comm: cuda_graph::nccl::Communicator) {
    /// let watch = comm.release_observer();
    /// drop(comm);
    /// assert!(watch.is_released()); // no graph recorded a collective on it
    /// # }
    /// ```
    pub fn release_observer(&self) -> ReleaseObserver {
        ReleaseObserver::new(&self.handle)
    }

    /// Reduces `send` over every rank with `op` into `recv` on every rank (`ncclAllReduce`).
    /// `send` and `recv` have the same length, and may be the same buffer (in place).
    ///
    /// `on` is a [`Stream`] (the collective runs there) or a capturing
    /// [`GraphBuilder`](crate::GraphBuilder) (it is recorded; the graph holds the communicator
    /// and both buffers). Refused before NCCL is asked, with an [`Error::InvalidArgument`]: a
    /// stream of another device than the communicator's, a buffer of another device, lengths
    /// that differ.
    ///
    /// ```no_run
    /// use cuda_graph::nccl::{Communicator, ReduceOp};
    /// # use cuda_graph::prelude::*;
    /// # fn f(comm: &Communicator, b: &GraphBuilder<Primary, Capturing<Global>>, x: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// comm.all_reduce(b, x, x, ReduceOp::Sum)?; // recorded: x = sum of every rank's x
    /// # Ok(()) }
    /// ```
    pub fn all_reduce<T: NcclType>(
        &self,
        on: &impl CollectiveStream,
        send: &DeviceBuffer<T>,
        recv: &DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = counts("all_reduce", send.len(), recv.len(), 1, 1)?;
        self.issue(
            on.collective_stream(),
            Op::AllReduce { op: op.raw() },
            send,
            recv,
            count,
        )
    }

    /// Gathers every rank's `send` into `recv`, rank by rank (`ncclAllGather`): `recv.len() ==
    /// send.len() * ranks()`. In place where `send` is rank `r`'s part of `recv`
    /// (`recv.slice(r * n..(r + 1) * n)`).
    ///
    /// Refusals and `on` as for [`all_reduce`](Self::all_reduce).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(comm: &cuda_graph::nccl::Communicator, stream: &Stream, part: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// let whole = stream.device().alloc_zeroed::<f32>(part.len() * comm.ranks())?;
    /// comm.all_gather(stream, part, &whole)?;
    /// # Ok(()) }
    /// ```
    pub fn all_gather<T: NcclType>(
        &self,
        on: &impl CollectiveStream,
        send: &DeviceBuffer<T>,
        recv: &DeviceBuffer<T>,
    ) -> Result<()> {
        let count = counts("all_gather", send.len(), recv.len(), 1, self.ranks())?;
        self.issue(on.collective_stream(), Op::AllGather, send, recv, count)
    }

    /// Reduces `send` over every rank with `op` and leaves rank `r` part `r` of the result in
    /// `recv` (`ncclReduceScatter`): `send.len() == recv.len() * ranks()`.
    ///
    /// Refusals and `on` as for [`all_reduce`](Self::all_reduce).
    ///
    /// ```no_run
    /// use cuda_graph::nccl::ReduceOp;
    /// # use cuda_graph::prelude::*;
    /// # fn f(comm: &cuda_graph::nccl::Communicator, stream: &Stream, whole: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// let part = stream.device().alloc_zeroed::<f32>(whole.len() / comm.ranks())?;
    /// comm.reduce_scatter(stream, whole, &part, ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter<T: NcclType>(
        &self,
        on: &impl CollectiveStream,
        send: &DeviceBuffer<T>,
        recv: &DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = counts("reduce_scatter", send.len(), recv.len(), self.ranks(), 1)?;
        self.issue(
            on.collective_stream(),
            Op::ReduceScatter { op: op.raw() },
            send,
            recv,
            count,
        )
    }

    /// Copies rank `root`'s `send` into `recv` on every rank (`ncclBroadcast`); `send` is read
    /// on `root` only, and may be `recv` (in place). The lengths are the same.
    ///
    /// `root >= ranks()` is an [`Error::InvalidArgument`]; other refusals and `on` as for
    /// [`all_reduce`](Self::all_reduce).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(comm: &cuda_graph::nccl::Communicator, stream: &Stream, weights: &DeviceBuffer<f32>) -> cuda_graph::Result<()> {
    /// comm.broadcast(stream, weights, weights, 0)?; // everyone gets rank 0's weights
    /// # Ok(()) }
    /// ```
    pub fn broadcast<T: NcclType>(
        &self,
        on: &impl CollectiveStream,
        send: &DeviceBuffer<T>,
        recv: &DeviceBuffer<T>,
        root: usize,
    ) -> Result<()> {
        let count = counts("broadcast", send.len(), recv.len(), 1, 1)?;
        let root = check_root(root, self.ranks())?;
        self.issue(
            on.collective_stream(),
            Op::Broadcast { root },
            send,
            recv,
            count,
        )
    }

    /// Issues `op` on `stream` after the checks every collective makes: the stream's device is
    /// the communicator's, and both buffers are of that device. The work goes through
    /// [`Stream::enqueue`]: in a capture, the tree's keep set holds the communicator and both
    /// buffers; on a plain stream, borrowed memory is held until the work has run.
    fn issue<T: NcclType>(
        &self,
        stream: &Stream,
        op: Op,
        send: &DeviceBuffer<T>,
        recv: &DeviceBuffer<T>,
        count: usize,
    ) -> Result<()> {
        check_same_device(self.handle.ctx.ordinal, stream.handle.ctx.ordinal)?;
        stream.same_context(send)?;
        stream.same_context(recv)?;
        let grouped = group::open();
        stream.enqueue(|rec| {
            if grouped && rec.capturing() {
                return Err(Error::invalid(
                    Refusal::Capture,
                    "a collective inside `nccl::group` on a capturing stream: NCCL records grouped collectives at the group's end, outside the capture's lock; capture each rank's collectives from its own thread, without a group",
                ));
            }
            stream.after_allocation(rec, send)?;
            stream.after_allocation(rec, recv)?;
            // One thread's calls at a time on a communicator: a group holds its claim until it
            // ends; a lone call until it returns (`_claim`'s drop).
            let _claim = if grouped {
                group::claim(&self.handle)?;
                None
            } else {
                self.handle.claim()?;
                Some(Unclaim(&self.handle))
            };
            rec.keep(&self.handle);
            rec.keep(&send.alloc);
            rec.keep(&recv.alloc);
            // SAFETY: the communicator is live and of the stream's device (checked above), whose
            // context `enqueue` bound; `send` and `recv` are allocations of that device holding
            // what `op` reads and writes (`counts` checked the lengths), kept by the caller's
            // borrow until this call returns, then by the capture's keep set, by the group's
            // hold until its end, or (borrowed memory) until the work has run.
            unsafe {
                raw::collective(
                    &self.handle,
                    op,
                    send.device_ptr(),
                    recv.device_ptr(),
                    count,
                    T::DATA_TYPE.raw(),
                    stream.raw(),
                )
            }?;
            if grouped {
                group::hold(
                    stream,
                    [
                        self.handle.clone() as crate::driver::graph::Owner,
                        send.alloc.clone(),
                        recv.alloc.clone(),
                    ],
                );
                return Ok(());
            }
            stream.hold_borrowed(rec, [OwnerRef::Alloc(&send.alloc), OwnerRef::Alloc(&recv.alloc)])
        })
    }
}

/// Refuses an empty device list or a device listed twice.
pub(super) fn check_devices(ordinals: &[usize]) -> Result<()> {
    if ordinals.is_empty() {
        return Err(Error::invalid(
            Refusal::Size,
            "a communicator needs at least one device",
        ));
    }
    for (i, o) in ordinals.iter().enumerate() {
        if ordinals[..i].contains(o) {
            return Err(Error::invalid(
                Refusal::OtherDevice,
                format!("device {o} is listed twice: one rank per device"),
            ));
        }
    }
    Ok(())
}

/// Refuses `rank >= ranks` (and so `ranks == 0`).
pub(super) fn check_rank(rank: usize, ranks: usize) -> Result<()> {
    if rank >= ranks {
        return Err(Error::invalid(
            Refusal::Size,
            format!("rank {rank} of a communicator of {ranks} ranks: ranks are 0..{ranks}"),
        ));
    }
    Ok(())
}

/// Refuses a root out of `0..ranks`; the root as NCCL takes it.
pub(super) fn check_root(root: usize, ranks: usize) -> Result<i32> {
    match i32::try_from(root) {
        Ok(r) if root < ranks => Ok(r),
        _ => Err(Error::invalid(
            Refusal::Size,
            format!("broadcast from root {root} of a communicator of {ranks} ranks: the root is one of 0..{ranks}"),
        )),
    }
}

/// Refuses a stream of another device than the communicator's.
pub(super) fn check_same_device(comm: usize, stream: usize) -> Result<()> {
    if comm != stream {
        return Err(Error::invalid(
            Refusal::OtherDevice,
            format!("a collective of a communicator of device {comm} on a stream of device {stream}: use a stream (or builder) of the communicator's device"),
        ));
    }
    Ok(())
}

/// The count NCCL takes for lengths `send` and `recv` where `send * send_times == recv *
/// recv_times` must hold (the gathering side is multiplied by the ranks): the shorter side's
/// length. Refuses lengths that do not fit.
pub(super) fn counts(
    what: &str,
    send: usize,
    recv: usize,
    send_parts: usize,
    recv_parts: usize,
) -> Result<usize> {
    // all_gather: recv == send * ranks (recv_parts = ranks); reduce_scatter: send == recv *
    // ranks (send_parts = ranks); the others: send == recv.
    let (expect_send, expect_recv) = (recv.checked_mul(send_parts), send.checked_mul(recv_parts));
    let fits = match (send_parts, recv_parts) {
        (1, 1) => send == recv,
        (1, n) => expect_recv == Some(recv) && n > 0,
        (n, 1) => expect_send == Some(send) && n > 0,
        _ => false,
    };
    if !fits {
        let want = match (send_parts, recv_parts) {
            (1, 1) => "the same length".to_string(),
            (1, n) => format!("a receive buffer of the send length times the {n} ranks"),
            (n, _) => format!("a send buffer of the receive length times the {n} ranks"),
        };
        return Err(Error::invalid(
            Refusal::Size,
            format!("{what} from {send} elements into {recv}: it needs {want}"),
        ));
    }
    Ok(if send_parts > 1 { recv } else { send })
}

/// Ends a communicator's claim when dropped (after the call, or on an error or panic).
struct Unclaim<'a>(&'a crate::driver::nccl::CommHandle);

impl Drop for Unclaim<'_> {
    fn drop(&mut self) {
        self.0.unclaim();
    }
}
