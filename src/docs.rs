//! The guides, as rustdoc: a tour of the crate, building graphs explicitly, capturing other
//! libraries' work (cuBLAS, candle), and the design
//! (why the crate is built the way it is). The same texts are `docs/*.md` and
//! `docs/design/*.md` in the repository; `build.rs` turns their links to one another into links
//! to these modules.

#[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/GUIDE.md"))]
pub mod guide {}

#[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/DEFINITION.md"))]
pub mod definitions {}

#[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/FOREIGN.md"))]
pub mod foreign {}

#[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/DESIGN.md"))]
pub mod design {
    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/architecture.md"))]
    pub mod architecture {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/captures.md"))]
    pub mod captures {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/ownership.md"))]
    pub mod ownership {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/destruction.md"))]
    pub mod destruction {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/definitions.md"))]
    pub mod definitions {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/conditionals.md"))]
    pub mod conditionals {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/memory.md"))]
    pub mod memory {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/kernels.md"))]
    pub mod kernels {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/host-callbacks.md"))]
    pub mod host_callbacks {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/performance.md"))]
    pub mod performance {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/nccl.md"))]
    pub mod nccl {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/docs/design/adding-a-node-kind.md"))]
    pub mod adding_a_node_kind {}
}
