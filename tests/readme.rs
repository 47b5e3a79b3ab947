//! The README's quick start is `examples/quickstart.rs`, word for word (from `use` on), so the
//! program a reader pastes is the one the GPU bundle runs.

#[test]
fn readme_quick_start_is_the_quickstart_example() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/quickstart.rs");
    let start = readme
        .find("```rust,no_run\n")
        .expect("the README has a rust block")
        + "```rust,no_run\n".len();
    let block = &readme[start..];
    let block = &block[..block.find("```").expect("the block ends")];
    let body = &example[example
        .find("use cuda_graph::prelude::*;")
        .expect("the example starts with its use line")..];
    assert_eq!(
        block, body,
        "README.md's quick start differs from examples/quickstart.rs"
    );
}
