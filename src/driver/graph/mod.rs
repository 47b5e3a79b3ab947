//! Graph and graph-exec handles.
//!
//! - [`node_table`]: the live nodes of a tree that this crate handed out tokens for, and what
//!   each uses.
//! - [`tree`]: the graph and exec handles, and the state a tree's lock guards.
//! - [`calls`]: thin wrappers of the graph, node and exec entry points.
//! - [`pairing`]: the pairing of an update's source with an exec's nodes.

mod calls;
mod node_table;
pub(crate) mod pairing;
mod tree;

pub(crate) use calls::*;
pub(crate) use node_table::{
    search_owners, IdMap, IdSet, KeepChunk, NodeOwnersIndex, Owner, Owners, Reserved, SharedRef,
};
pub use tree::GraphHandle;
pub(crate) use tree::{lock_two, next_id, CondRecord, ExecHandle, TreeState};
