//! The guides, as rustdoc: a tour of the crate, building graphs explicitly, and the design
//! (why the crate is built the way it is). The same texts are `docs/*.md` and
//! `docs/design/*.md` in the repository.

#[doc = include_str!("../docs/GUIDE.md")]
pub mod guide {}

#[doc = include_str!("../docs/DEFINITION.md")]
pub mod definitions {}

#[doc = include_str!("../docs/DESIGN.md")]
pub mod design {
    #[doc = include_str!("../docs/design/architecture.md")]
    pub mod architecture {}

    #[doc = include_str!("../docs/design/captures.md")]
    pub mod captures {}

    #[doc = include_str!("../docs/design/ownership.md")]
    pub mod ownership {}

    #[doc = include_str!("../docs/design/destruction.md")]
    pub mod destruction {}

    #[doc = include_str!("../docs/design/definitions.md")]
    pub mod definitions {}

    #[doc = include_str!("../docs/design/conditionals.md")]
    pub mod conditionals {}

    #[doc = include_str!("../docs/design/memory.md")]
    pub mod memory {}

    #[doc = include_str!("../docs/design/kernels.md")]
    pub mod kernels {}

    #[doc = include_str!("../docs/design/host-callbacks.md")]
    pub mod host_callbacks {}

    #[doc = include_str!("../docs/design/performance.md")]
    pub mod performance {}

    #[doc = include_str!("../docs/design/nccl.md")]
    pub mod nccl {}

    #[doc = include_str!("../docs/design/adding-a-node-kind.md")]
    pub mod adding_a_node_kind {}
}
