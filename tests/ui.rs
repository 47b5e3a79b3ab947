//! Compile-fail tests: each illegal use of the builders is a compile error with a message that
//! says what to do instead (see ui-tests/README.md). Compile-pass tests show the legal flows.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui-tests/compile-fail/*.rs");
    t.pass("ui-tests/pass/*.rs");
}
