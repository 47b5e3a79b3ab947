//! The guides, as rustdoc: a tour of the crate, building graphs explicitly, and the design
//! (why the crate is built the way it is). The same texts are `docs/*.md` in the repository.

#[doc = include_str!("../docs/GUIDE.md")]
pub mod guide {}

#[doc = include_str!("../docs/DEFINITION.md")]
pub mod definitions {}

#[doc = include_str!("../docs/DESIGN.md")]
pub mod design {}
