//! NCCL, opened at run time (`libnccl`), and the communicator handle.
//!
//! The library is opened with `libloading` on first use, not through cudarc's loader: cudarc's
//! `nccl::sys::culib()` panics when the library is missing, and it looks for `libnccl.so` and
//! CUDA-versioned names but not NCCL's soname, `libnccl.so.2` (what the `libnccl2` package and
//! the `nvidia-nccl` wheels install without a development symlink). The types of the calls
//! (`ncclUniqueId`, `ncclComm_t`) are cudarc's bindings'; every `ncclResult_t` is read as the
//! integer it is, as NVRTC's results are (a result a newer NCCL adds is never an invalid enum).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys as cu;
use cudarc::nccl::sys;

use super::context::PrimaryContext;
use super::release;
use crate::error::{Error, Result};

type VersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type UniqueIdFn = unsafe extern "C" fn(*mut sys::ncclUniqueId) -> c_int;
type InitRankFn =
    unsafe extern "C" fn(*mut sys::ncclComm_t, c_int, sys::ncclUniqueId, c_int) -> c_int;
type InitAllFn = unsafe extern "C" fn(*mut sys::ncclComm_t, c_int, *const c_int) -> c_int;
type DestroyFn = unsafe extern "C" fn(sys::ncclComm_t) -> c_int;
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    sys::ncclComm_t,
    *mut c_void,
) -> c_int;
type GatherFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    sys::ncclComm_t,
    *mut c_void,
) -> c_int;
type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    sys::ncclComm_t,
    *mut c_void,
) -> c_int;
type GroupFn = unsafe extern "C" fn() -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type LastErrorFn = unsafe extern "C" fn(sys::ncclComm_t) -> *const c_char;

/// The entry points this crate calls, resolved once.
struct Nccl {
    version: VersionFn,
    unique_id: UniqueIdFn,
    init_rank: InitRankFn,
    init_all: InitAllFn,
    destroy: DestroyFn,
    all_reduce: ReduceFn,
    all_gather: GatherFn,
    reduce_scatter: ReduceFn,
    broadcast: BroadcastFn,
    group_start: GroupFn,
    group_end: GroupFn,
    error_string: ErrorStringFn,
    /// `ncclGetLastError` (NCCL 2.13 and newer); `None` on older libraries.
    last_error: Option<LastErrorFn>,
    /// Keeps the library loaded (the function pointers above point into it).
    _lib: libloading::Library,
}

/// The library names tried, in order: NCCL's soname first, then the development name.
pub(crate) fn candidates() -> Vec<String> {
    if cfg!(windows) {
        vec!["nccl.dll".to_string()]
    } else {
        vec!["libnccl.so.2".to_string(), "libnccl.so".to_string()]
    }
}

static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();

fn open() -> std::result::Result<Nccl, String> {
    let names = candidates();
    let mut last = String::new();
    for name in &names {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(lib) => lib,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        // SAFETY: each symbol is looked up with the C signature nccl.h declares for it, with
        // `ncclResult_t`, `ncclDataType_t` and `ncclRedOp_t` as the `int`s they are and
        // `cudaStream_t` as a pointer.
        let nccl = unsafe {
            (|| -> std::result::Result<Nccl, libloading::Error> {
                Ok(Nccl {
                    version: *lib.get::<VersionFn>(b"ncclGetVersion\0")?,
                    unique_id: *lib.get::<UniqueIdFn>(b"ncclGetUniqueId\0")?,
                    init_rank: *lib.get::<InitRankFn>(b"ncclCommInitRank\0")?,
                    init_all: *lib.get::<InitAllFn>(b"ncclCommInitAll\0")?,
                    destroy: *lib.get::<DestroyFn>(b"ncclCommDestroy\0")?,
                    all_reduce: *lib.get::<ReduceFn>(b"ncclAllReduce\0")?,
                    all_gather: *lib.get::<GatherFn>(b"ncclAllGather\0")?,
                    reduce_scatter: *lib.get::<ReduceFn>(b"ncclReduceScatter\0")?,
                    broadcast: *lib.get::<BroadcastFn>(b"ncclBroadcast\0")?,
                    group_start: *lib.get::<GroupFn>(b"ncclGroupStart\0")?,
                    group_end: *lib.get::<GroupFn>(b"ncclGroupEnd\0")?,
                    error_string: *lib.get::<ErrorStringFn>(b"ncclGetErrorString\0")?,
                    last_error: lib
                        .get::<LastErrorFn>(b"ncclGetLastError\0")
                        .ok()
                        .map(|f| *f),
                    _lib: lib,
                })
            })()
        };
        match nccl {
            Ok(n) => return Ok(n),
            Err(e) => last = format!("{name}: {e}"),
        }
    }
    Err(format!("{}; last error: {last}", names.join(", ")))
}

/// The library, opened once; [`Error::NcclNotFound`] when it cannot be.
fn nccl() -> Result<&'static Nccl> {
    NCCL.get_or_init(open)
        .as_ref()
        .map_err(|tried| Error::NcclNotFound {
            tried: tried.clone(),
        })
}

/// The names of the results nccl.h defines; others are named by `ncclGetErrorString`.
pub(crate) fn result_name(code: c_int) -> Option<&'static str> {
    Some(match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => return None,
    })
}

/// A C string NCCL returned (static or the communicator's), copied; empty for null.
///
/// # Safety
/// `p` is null or a NUL-terminated string that stays valid during the call.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: forwarded from the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Nccl {
    /// `Ok` for `ncclSuccess`, else [`Error::Nccl`] with NCCL's last message for `comm` (if
    /// given and the library has `ncclGetLastError`).
    fn check(&self, r: c_int, call: &'static str, comm: sys::ncclComm_t) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        let name = match result_name(r) {
            Some(n) => n.to_string(),
            // SAFETY: `ncclGetErrorString` returns a static string for any value.
            None => unsafe { c_string((self.error_string)(r)) },
        };
        let detail = match self.last_error {
            // SAFETY: `ncclGetLastError` takes a live communicator or null and returns a string
            // it keeps until the next call on this thread.
            Some(last) => unsafe { c_string(last(comm)) },
            None => String::new(),
        };
        Err(Error::Nccl {
            call,
            code: r,
            name,
            detail: if detail.is_empty() {
                detail
            } else {
                format!(": {detail}")
            },
        })
    }
}

/// The loaded library's version, as `ncclGetVersion` gives it (e.g. 22304 for 2.23.4).
pub(crate) fn version() -> Result<i32> {
    let n = nccl()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out pointer.
    n.check(
        unsafe { (n.version)(&mut v) },
        "ncclGetVersion",
        std::ptr::null_mut(),
    )?;
    Ok(v)
}

/// A new unique id (`ncclGetUniqueId`), for the ranks of one communicator to share.
pub(crate) fn unique_id() -> Result<sys::ncclUniqueId> {
    let n = nccl()?;
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out pointer to an `ncclUniqueId`.
    n.check(
        unsafe { (n.unique_id)(&mut id) },
        "ncclGetUniqueId",
        std::ptr::null_mut(),
    )?;
    Ok(id)
}

/// One NCCL communicator of one device, destroyed on drop (`ncclCommDestroy`, through
/// [`release::destroy`], after everything asked to be destroyed before it: the graphs and execs
/// that held it go first, so NCCL's resources of captured collectives are given back first).
#[derive(Debug)]
pub(crate) struct CommHandle {
    pub(crate) ctx: Arc<PrimaryContext>,
    pub(crate) raw: sys::ncclComm_t,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    /// Set while one thread's call (or open group) uses the communicator: NCCL's calls on one
    /// communicator are not thread-safe, so a second thread is refused, never let in.
    busy: AtomicBool,
}

impl CommHandle {
    /// Claims the communicator for this thread's NCCL calls until [`unclaim`](Self::unclaim);
    /// refused while another claim holds it.
    pub(crate) fn claim(&self) -> Result<()> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| {
                Error::invalid(
                    crate::error::Refusal::Busy,
                    "this communicator is in use on another thread (or by an open `nccl::group` there): NCCL takes one thread's calls on a communicator at a time; give each thread its own communicator, or order the calls",
                )
            })
    }

    /// Ends a [`claim`](Self::claim).
    pub(crate) fn unclaim(&self) {
        self.busy.store(false, Ordering::Release);
    }
}

// SAFETY: an NCCL communicator may be used from any thread, one thread's calls at a time: every
// call on it is made under a claim (`busy`), which a second thread cannot take.
unsafe impl Send for CommHandle {}
// SAFETY: as above.
unsafe impl Sync for CommHandle {}

impl Drop for CommHandle {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        release::destroy_in(&self.ctx, self.raw, |raw| {
            if let Ok(n) = nccl() {
                // SAFETY: the communicator was made by `ncclCommInit*` and is destroyed once,
                // here, after every graph, exec and stream operation that held it let go.
                let _ = unsafe { (n.destroy)(raw) };
            }
        });
    }
}

/// One communicator per device of `ctxs`, in order (`ncclCommInitAll`): ranks 0.., one process.
pub(crate) fn init_all(ctxs: &[Arc<PrimaryContext>]) -> Result<Vec<Arc<CommHandle>>> {
    let n = nccl()?;
    let ndev = c_int::try_from(ctxs.len())
        .map_err(|_| Error::invalid(crate::error::Refusal::Size, "too many devices for NCCL"))?;
    let devs: Vec<c_int> = ctxs
        .iter()
        .map(|c| c_int::try_from(c.ordinal).unwrap_or(c_int::MAX))
        .collect();
    let mut raws: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); ctxs.len()];
    // SAFETY: `raws` and `devs` hold `ndev` elements each; NCCL makes each device current in
    // turn through the CUDA runtime (the primary contexts, the ones `ctxs` hold).
    let r = unsafe { (n.init_all)(raws.as_mut_ptr(), ndev, devs.as_ptr()) };
    n.check(r, "ncclCommInitAll", std::ptr::null_mut())?;
    Ok(raws
        .into_iter()
        .zip(ctxs)
        .enumerate()
        .map(|(rank, (raw, ctx))| {
            Arc::new(CommHandle {
                ctx: ctx.clone(),
                raw,
                rank,
                nranks: ctxs.len(),
                busy: AtomicBool::new(false),
            })
        })
        .collect())
}

/// This process's rank `rank` of `nranks` of the communicator `id` names, on `ctx`'s device
/// (`ncclCommInitRank`, which blocks until every rank has joined).
pub(crate) fn init_rank(
    ctx: &Arc<PrimaryContext>,
    nranks: usize,
    id: sys::ncclUniqueId,
    rank: usize,
) -> Result<Arc<CommHandle>> {
    let n = nccl()?;
    let too_many = || {
        Error::invalid(
            crate::error::Refusal::Size,
            "too many ranks for NCCL (an int)",
        )
    };
    let nr = c_int::try_from(nranks).map_err(|_| too_many())?;
    let rk = c_int::try_from(rank).map_err(|_| too_many())?;
    // NCCL takes the device from the CUDA runtime's current device: this context's.
    ctx.bind()?;
    let mut raw: sys::ncclComm_t = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out pointer; `id` is passed by value.
    let r = unsafe { (n.init_rank)(&mut raw, nr, id, rk) };
    n.check(r, "ncclCommInitRank", std::ptr::null_mut())?;
    Ok(Arc::new(CommHandle {
        ctx: ctx.clone(),
        raw,
        rank,
        nranks,
        busy: AtomicBool::new(false),
    }))
}

/// `ncclGroupStart`.
pub(crate) fn group_start() -> Result<()> {
    let n = nccl()?;
    // SAFETY: no arguments; groups nest.
    n.check(
        unsafe { (n.group_start)() },
        "ncclGroupStart",
        std::ptr::null_mut(),
    )
}

/// `ncclGroupEnd`: launches the collectives issued since the matching `ncclGroupStart`.
pub(crate) fn group_end() -> Result<()> {
    let n = nccl()?;
    // SAFETY: no arguments; called once per successful `group_start`.
    n.check(
        unsafe { (n.group_end)() },
        "ncclGroupEnd",
        std::ptr::null_mut(),
    )
}

/// Which collective, with what it needs beyond the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `ncclAllReduce` of `count` elements with the reduction.
    AllReduce { op: c_int },
    /// `ncclAllGather`, `count` elements sent by each rank.
    AllGather,
    /// `ncclReduceScatter`, `count` elements received by each rank.
    ReduceScatter { op: c_int },
    /// `ncclBroadcast` of `count` elements from rank `root`.
    Broadcast { root: c_int },
}

/// Issues the collective `op` on `stream`.
///
/// # Safety
/// - `comm` is live and of the context `stream` belongs to, which is current;
/// - `send` and `recv` are device addresses of that device holding what `op` reads and writes
///   (`count` elements of `data_type`, times the ranks where `op` gathers or scatters), and stay
///   allocated until the work has run (in a capture: as long as the graph and its execs).
pub(crate) unsafe fn collective(
    comm: &CommHandle,
    op: Op,
    send: u64,
    recv: u64,
    count: usize,
    data_type: c_int,
    stream: cu::CUstream,
) -> Result<()> {
    let n = nccl()?;
    let (s, r, st) = (
        send as usize as *const c_void,
        recv as usize as *mut c_void,
        stream.cast::<c_void>(),
    );
    // SAFETY: forwarded from the caller; each entry point has the signature nccl.h declares.
    let (res, call) = unsafe {
        match op {
            Op::AllReduce { op } => (
                (n.all_reduce)(s, r, count, data_type, op, comm.raw, st),
                "ncclAllReduce",
            ),
            Op::AllGather => (
                (n.all_gather)(s, r, count, data_type, comm.raw, st),
                "ncclAllGather",
            ),
            Op::ReduceScatter { op } => (
                (n.reduce_scatter)(s, r, count, data_type, op, comm.raw, st),
                "ncclReduceScatter",
            ),
            Op::Broadcast { root } => (
                (n.broadcast)(s, r, count, data_type, root, comm.raw, st),
                "ncclBroadcast",
            ),
        }
    };
    n.check(res, call, comm.raw)
}
