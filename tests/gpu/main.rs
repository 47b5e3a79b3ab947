//! The GPU suite: one binary, run by `cargo test`. Each test reports itself ignored, with the
//! reason, where it cannot run (no driver, no device, a device or driver too old), never passed.
//! Tests run one at a time: a `Global` capture in one test would make another test's unsafe calls
//! fail.

/// A module's table of tests, `pub const TESTS`, each test named once, as `module::function`:
/// ```ignore
/// gpu_tests! {
///     "kernels";
///     Needs::Gpu => typed_launches_in_every_front_end, graph_allocations_as_buffers;
///     Needs::Conditional(DriverVersion::V12_3) => typed_kernels_set_conditions;
/// }
/// ```
/// The tests run in the order written: groups of the same `Needs` follow one another as listed.
#[macro_export]
macro_rules! gpu_tests {
    ($module:literal; $($needs:expr => $($test:ident),+ $(,)?);* $(;)?) => {
        pub const TESTS: &[(&str, $crate::support::Needs, $crate::TestFn)] = &[
            $($((concat!($module, "::", stringify!($test)), $needs, $test),)+)*
        ];
    };
}

mod support;

mod builder;
mod conditional;
#[cfg(feature = "cudarc")]
mod cudarc_adapters;
mod definition;
mod fork;
mod foundation;
mod inspect;
mod interop;
mod kernels;
#[cfg(feature = "nvrtc")]
mod launch;
mod memory;
#[cfg(feature = "nccl")]
mod nccl;
mod nodes;
#[cfg(feature = "nvrtc")]
mod nvrtc;
mod safety;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use support::{Gpu, Needs, TestResult};

type TestFn = fn(&Gpu) -> TestResult;

fn trial(name: &'static str, needs: Needs, f: TestFn) -> Trial {
    Trial::ignorable_test(name, move || {
        let gpu = match support::open() {
            Ok(g) => g,
            Err(reason) => return Ok(Completion::ignored_with(reason)),
        };
        if let Some(reason) = support::unmet(&gpu, needs) {
            return Ok(Completion::ignored_with(reason));
        }
        f(&gpu).map_err(|e| Failed::from(e.to_string()))?;
        Ok(Completion::Completed)
    })
}

fn main() {
    // The suite's binary also plays the processes that some tests start.
    if let Ok(what) = std::env::var(safety::CHILD) {
        std::process::exit(safety::child(&what));
    }
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let mut tests = vec![Trial::test("foundation::no_driver_gives_an_error", || {
        foundation::no_driver_gives_an_error().map_err(|e| Failed::from(e.to_string()))
    })];
    // The cudarc adapters' tests exist with the `cudarc` feature (the GPU bundle enables it).
    #[cfg(feature = "cudarc")]
    let adapters = cudarc_adapters::TESTS;
    #[cfg(not(feature = "cudarc"))]
    let adapters: &[(&str, Needs, TestFn)] = &[];
    // The NVRTC tests exist with the `nvrtc` feature (the GPU bundle enables it).
    #[cfg(feature = "nvrtc")]
    let compiled = nvrtc::TESTS.iter().chain(launch::TESTS);
    #[cfg(not(feature = "nvrtc"))]
    let compiled: &[(&str, Needs, TestFn)] = &[];
    // The NCCL tests exist with the `nccl` feature.
    #[cfg(feature = "nccl")]
    let collectives = nccl::TESTS;
    #[cfg(not(feature = "nccl"))]
    let collectives: &[(&str, Needs, TestFn)] = &[];
    for (name, needs, f) in foundation::TESTS
        .iter()
        .chain(builder::TESTS)
        .chain(fork::TESTS)
        .chain(conditional::TESTS)
        .chain(definition::TESTS)
        .chain(nodes::TESTS)
        .chain(inspect::TESTS)
        .chain(interop::TESTS)
        .chain(adapters)
        .chain(compiled)
        .chain(collectives)
        .chain(safety::TESTS)
        .chain(memory::TESTS)
        .chain(kernels::TESTS)
    {
        tests.push(trial(name, *needs, *f));
    }
    libtest_mimic::run(&args, tests).exit();
}
