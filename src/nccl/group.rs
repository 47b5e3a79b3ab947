//! [`group`]: several collectives launched together (`ncclGroupStart` / `ncclGroupEnd`).

use std::cell::RefCell;

use std::sync::Arc;

use crate::driver::graph::Owner;
use crate::driver::nccl::CommHandle;
use crate::error::Result;
use crate::Stream;

/// The groups open on this thread: their depth, and what their collectives use, per stream, held
/// until the outermost group has ended (NCCL launches grouped collectives only then).
#[derive(Default)]
struct Open {
    depth: usize,
    held: Vec<(Stream, Vec<Owner>)>,
    /// The communicators this thread's open group has claimed, released at its end.
    claimed: Vec<Arc<CommHandle>>,
}

thread_local! {
    static OPEN: RefCell<Open> = RefCell::new(Open::default());
}

/// Whether a group is open on this thread.
pub(super) fn open() -> bool {
    OPEN.with(|o| o.borrow().depth > 0)
}

/// Claims `comm` for the open group on this thread until its outermost group has ended (NCCL
/// uses grouped collectives' communicators until then); a communicator the group already holds
/// is not claimed again.
pub(super) fn claim(comm: &Arc<CommHandle>) -> Result<()> {
    OPEN.with(|o| {
        let mut o = o.borrow_mut();
        if o.claimed.iter().any(|c| Arc::ptr_eq(c, comm)) {
            return Ok(());
        }
        comm.claim()?;
        o.claimed.push(comm.clone());
        Ok(())
    })
}

/// Holds `owners`, used by a collective issued on `stream` inside the open group, until the
/// outermost group has ended and the stream's work has run.
pub(super) fn hold(stream: &Stream, owners: impl IntoIterator<Item = Owner>) {
    OPEN.with(|o| {
        let mut o = o.borrow_mut();
        let at = match o
            .held
            .iter()
            .position(|(s, _)| std::sync::Arc::ptr_eq(&s.handle, &stream.handle))
        {
            Some(i) => i,
            None => {
                o.held.push((stream.clone(), Vec::new()));
                o.held.len() - 1
            }
        };
        o.held[at].1.extend(owners);
    });
}

/// Runs `f`, which issues collectives, as one NCCL group: NCCL launches them together when `f`
/// returns (`ncclGroupStart`, `f`, `ncclGroupEnd`, even when `f` fails). Needed where one thread
/// issues the collectives of several ranks (the communicators of
/// [`Communicator::for_devices`](super::Communicator::for_devices)): without it the first would
/// wait for the others. Groups nest; the outermost one launches.
///
/// Inside a group, collectives run on plain streams only: one on a capturing stream or builder
/// is refused (NCCL records grouped work at the group's end, where the crate cannot hold the
/// capture's lock). Capture each rank's collectives from a thread of its own instead. What the
/// grouped collectives use (communicators, buffers) is held until the group has ended and each
/// stream's work has run.
///
/// `f`'s error, else `ncclGroupEnd`'s, is returned.
///
/// ```no_run
/// use cuda_graph::nccl::{self, Communicator, ReduceOp};
/// use cuda_graph::prelude::*;
/// # fn f(comms: &[Communicator], streams: &[Stream], xs: &[DeviceBuffer<f32>]) -> cuda_graph::Result<()> {
/// nccl::group(|| {
///     for ((comm, stream), x) in comms.iter().zip(streams).zip(xs) {
///         comm.all_reduce(stream, x, x, ReduceOp::Sum)?;
///     }
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    crate::driver::nccl::group_start()?;
    OPEN.with(|o| o.borrow_mut().depth += 1);
    // Closes the group even if `f` panics, so the thread's depth and NCCL's stay in step.
    struct Close;
    impl Drop for Close {
        fn drop(&mut self) {
            let ended = crate::driver::nccl::group_end();
            let (held, claimed) = OPEN.with(|o| {
                let mut o = o.borrow_mut();
                o.depth -= 1;
                if o.depth == 0 {
                    (std::mem::take(&mut o.held), std::mem::take(&mut o.claimed))
                } else {
                    (Vec::new(), Vec::new())
                }
            });
            for comm in claimed {
                comm.unclaim();
            }
            for (stream, owners) in held {
                // Until the work NCCL just launched on the stream has run (the host function
                // queued behind it, or a wait for the stream).
                let _ = stream.hold_until_run(owners.into_iter().collect());
            }
            ENDED.with(|e| *e.borrow_mut() = Some(ended));
        }
    }
    let close = Close;
    let out = f();
    drop(close);
    let ended = ENDED.with(|e| e.borrow_mut().take()).unwrap_or(Ok(()));
    let out = out?;
    ended?;
    Ok(out)
}

thread_local! {
    /// `ncclGroupEnd`'s result, from the closing guard to [`group`].
    static ENDED: RefCell<Option<Result<()>>> = const { RefCell::new(None) };
}
