//! `GraphSet` without a GPU: a capture that fails keeps nothing and is counted.

use cuda_graph::prelude::*;
use cuda_graph::{GraphSet, Refusal};

#[test]
fn a_failed_capture_keeps_nothing() {
    let mut set = GraphSet::<u8>::new(InstantiateOptions::default());
    let r = set.get_or_capture(1, || -> cuda_graph::Result<GraphDefinition> {
        Err(Error::invalid(
            Refusal::Size,
            "the kernels take no batch of 1",
        ))
    });
    assert_eq!(r.err().and_then(|e| e.refusal()), Some(Refusal::Size));
    assert!(set.is_empty() && !set.contains(&1) && set.get(&1).is_none());
    let stats = set.stats();
    assert_eq!(
        (
            stats.captures,
            stats.failures,
            stats.instantiations,
            stats.hits
        ),
        (1, 1, 0, 0)
    );
    assert!(set.remove(&1).is_none());
    assert_eq!(set.keys().count(), 0);
}
