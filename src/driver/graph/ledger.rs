//! The one owner of the graph-memory ordering rules: graph memory (a `GraphBuffer` of an
//! allocation node) exists only between its allocation node and its free node, so a kernel
//! that uses it must come after the allocation node, and the free node after every such kernel.
//! The explicit path (`definition`) and the captured path (`runtime`'s launches into a capture)
//! both check and record through here, against the tree's `memory_users`.

use cudarc::driver::sys;

use super::{IdSet, TreeState};
use crate::driver;
use crate::error::{Error, Refusal, Result};

/// A kernel argument's use of graph memory ([`GraphBuffer`](crate::GraphBuffer)): the graph and
/// its allocation node (raw handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GraphUse {
    pub(crate) graph: u64,
    pub(crate) alloc: usize,
}

/// Visits `from` and every node they depend on, directly or not (each once), until `visit`
/// returns `true`; returns whether it did.
///
/// # Safety
/// `from` are live nodes of one graph whose tree is locked, or of a capture's graph whose
/// stream's slot and tree are held.
unsafe fn walk_up(from: &[sys::CUgraphNode], mut visit: impl FnMut(usize) -> bool) -> Result<bool> {
    let mut seen: IdSet<usize> = IdSet::default();
    let mut work: Vec<sys::CUgraphNode> = from.to_vec();
    let mut deps: Vec<sys::CUgraphNode> = Vec::new();
    while let Some(n) = work.pop() {
        if !seen.insert(n as usize) {
            continue;
        }
        if visit(n as usize) {
            return Ok(true);
        }
        let mut count = 0usize;
        // SAFETY: `n` is a live node of the locked graph (the caller's, and edges lead only to
        // nodes of the same graph); the first call only counts.
        unsafe { driver::graph::node_dependencies(n, std::ptr::null_mut(), &mut count) }?;
        if count == 0 {
            continue;
        }
        deps.clear();
        deps.resize(count, std::ptr::null_mut());
        // SAFETY: as above; `deps` has room for `count` nodes.
        unsafe { driver::graph::node_dependencies(n, deps.as_mut_ptr(), &mut count) }?;
        work.extend_from_slice(&deps[..count.min(deps.len())]);
    }
    Ok(false)
}

/// Refuses a kernel whose dependencies `deps` do not reach the allocation node of each use
/// (it could run before the memory exists). `graph` is the graph the kernel goes into.
///
/// # Safety
/// As [`walk_up`].
pub(crate) unsafe fn check_after_allocations(
    graph: u64,
    deps: &[sys::CUgraphNode],
    uses: &[GraphUse],
) -> Result<()> {
    for u in uses {
        if u.graph != graph {
            return Err(Error::invalid(
                Refusal::ForeignGraph,
                "a GraphBuffer is used in another graph than the one that allocates it: graph memory exists only inside its own graph",
            ));
        }
        // SAFETY: the caller's promise.
        if !unsafe { walk_up(deps, |n| n == u.alloc) }? {
            return Err(Error::invalid(
                Refusal::Order,
                "a kernel using a GraphBuffer must run after its allocation node: make the allocation node (or a node after it) one of the kernel's dependencies",
            ));
        }
    }
    Ok(())
}

/// The nodes the next operation captured on `stream` will depend on
/// (`cuStreamGetCaptureInfo`), copied out.
pub(crate) fn capture_dependencies(stream: sys::CUstream) -> Result<Vec<sys::CUgraphNode>> {
    let mut status = 0u32;
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut n = 0usize;
    // SAFETY: the stream is live (the caller's); the out pointers are valid (the status through
    // `status_out`, as a `u32`); the other outputs are not asked for.
    unsafe {
        driver::stream::capture_info(
            stream,
            driver::stream::status_out(&mut status),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut deps,
            std::ptr::null_mut(),
            &mut n,
        )
    }?;
    if n == 0 || deps.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: the driver returned `n` nodes at `deps`, valid until the next capture call on
    // this stream (none in between).
    Ok(unsafe { std::slice::from_raw_parts(deps, n) }.to_vec())
}

/// Records `node` as a user of each use's allocation, for the check of its free node.
pub(crate) fn note_users(tree: &mut TreeState, node: usize, uses: &[GraphUse]) {
    for u in uses {
        let users = tree.memory_users.entry((u.graph, u.alloc)).or_default();
        if !users.contains(&node) {
            users.push(node);
        }
    }
}

/// Refuses a free node of the allocation `(graph, alloc)` whose dependencies `deps` do not reach
/// every kernel that used it through a [`GraphBuffer`].
///
/// # Safety
/// As [`walk_up`].
pub(crate) unsafe fn check_free_after_users(
    tree: &TreeState,
    graph: u64,
    alloc: usize,
    deps: &[sys::CUgraphNode],
) -> Result<()> {
    let Some(users) = tree.memory_users.get(&(graph, alloc)) else {
        return Ok(());
    };
    let mut missing = users.len();
    let mut left: IdSet<usize> = users.iter().copied().collect();
    // SAFETY: the caller's promise.
    unsafe {
        walk_up(deps, |n| {
            if left.remove(&n) {
                missing -= 1;
            }
            missing == 0
        })
    }?;
    if missing > 0 {
        return Err(Error::invalid(Refusal::Order, format!(
            "the free node must run after every kernel that uses the allocation through a GraphBuffer, and {missing} of them do not come before its dependencies: add edges (or join the streams) first; the allocation stays allocated until the exec frees it"
        )));
    }
    Ok(())
}
