//! The graph core: what the capture builder, the explicit definition and the executable graph
//! share — host-callback preparation, conditional-node parameters and bodies, and the one sealed
//! trait for finished graphs. (The graph handle with its tree lock and keep set lives with the
//! driver handles, `driver::graph`, because streams — one layer down — take the tree lock.)

pub(crate) mod callback;
pub(crate) mod conditional;
pub(crate) mod source;
