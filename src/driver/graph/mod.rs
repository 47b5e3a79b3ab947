//! Graph and graph-exec handles.
//!
//! - [`node_table`]: the live nodes of a tree that this crate handed out tokens for, and what
//!   each uses.
//! - [`tree`]: the graph and exec handles, and the state a tree's lock guards.
//! - [`calls`]: thin wrappers of the graph, node and exec entry points.
//! - [`pairing`]: the pairing of an update's source with an exec's nodes.

use cudarc::driver::sys;

mod calls;
pub(crate) mod ledger;
mod node_table;
pub(crate) mod pairing;
mod tree;

pub(crate) use calls::*;
pub(crate) use node_table::{
    search_owners, IdMap, IdSet, KeepChunk, NodeOwnersIndex, Owner, Owners, Reserved, SharedRef,
};
pub use tree::GraphHandle;
pub(crate) use tree::{lock_two, next_id, CondRecord, ExecHandle, ExecRef, TreeState, UserGraph};

/// A node list the driver fills (`cuGraphGetNodes`, `cuGraphNodeGetDependencies`, ...): `fill`
/// is called with a null array to get the count, then with room for that many. The caller holds
/// the tree's lock, so the count does not change in between.
pub(crate) fn node_list(
    mut fill: impl FnMut(*mut sys::CUgraphNode, *mut usize) -> crate::error::Result<()>,
) -> crate::error::Result<Vec<sys::CUgraphNode>> {
    let mut n = 0usize;
    fill(std::ptr::null_mut(), &mut n)?;
    let mut out = vec![std::ptr::null_mut(); n];
    if n > 0 {
        fill(out.as_mut_ptr(), &mut n)?;
        out.truncate(n);
    }
    Ok(out)
}
