//! A set of execs keyed by shape (batch bucket, sequence bucket, …), as servers keep them.

use std::collections::HashMap;
use std::hash::Hash;

use super::{CacheOutcome, Graph, GraphCache, InstantiateOptions};
use crate::core::source::FinishedGraph;
use crate::error::{Error, Refusal, Result};
use crate::runtime::Stream;

/// Execs keyed by shape: one [`GraphCache`] per key (a batch-size bucket, a `(batch, context)`
/// pair), captured the first time a key is asked for and replayed after, with an optional bound
/// on how many are kept (the least recently used goes first) and counters of what happened.
///
/// [`get_or_capture`](Self::get_or_capture) is the server's step: a hit returns the key's exec;
/// a miss runs the capture closure, instantiates what it returns and keeps it. A capture that
/// fails returns its error and keeps nothing. [`refresh`](Self::refresh) hands a key a new
/// graph (an update in place where the driver takes it, as [`GraphCache::refresh`] does).
/// An evicted or removed exec is dropped as any [`Graph`] is: what it uses, graph memory
/// included, is released after its last launch, so evicting a key whose exec still runs is safe.
/// Graph memory of every exec comes from the device's one pool;
/// [`Device::trim_graph_memory`](crate::Device::trim_graph_memory) gives back what evicted execs
/// no longer use.
///
/// `Send` and `Sync` when the key is; the methods that change it take `&mut self` (put it behind
/// a `Mutex` to share it between threads).
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::GraphSet;
/// # fn step(b: &GraphBuilder<Primary, Capturing<ThreadLocal>>, batch: usize) -> cuda_graph::Result<()> { Ok(()) }
/// # fn f(stream: &Stream, batches: &[usize]) -> cuda_graph::Result<()> {
/// // Batch sizes padded to a bucket; at most 8 execs kept.
/// let mut graphs = GraphSet::new(InstantiateOptions::default()).with_max_entries(8)?;
/// for &batch in batches {
///     let bucket = batch.next_power_of_two();
///     let graph = graphs.get_or_capture(bucket, || {
///         let b = stream.create_graph_builder().begin_building(ThreadLocal)?;
///         step(&b, bucket)?;
///         b.end_building()
///     })?;
///     graph.launch(stream)?;
/// }
/// let stats = graphs.stats();
/// println!("{} hits, {} captures, {} evictions", stats.hits, stats.captures, stats.evictions);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GraphSet<K> {
    options: InstantiateOptions,
    entries: HashMap<K, Entry>,
    max_entries: Option<usize>,
    /// Counts uses: an entry's `last_used` is the count at its latest use.
    clock: u64,
    stats: GraphSetStats,
}

#[derive(Debug)]
struct Entry {
    cache: GraphCache,
    last_used: u64,
}

/// What a [`GraphSet`] did so far ([`GraphSet::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphSetStats {
    /// [`get_or_capture`](GraphSet::get_or_capture) calls that found their key.
    pub hits: u64,
    /// Captures run for keys not held (each a miss).
    pub captures: u64,
    /// Captures or refreshes that failed (nothing was kept for them).
    pub failures: u64,
    /// Refreshes that updated a key's exec in place.
    pub updates: u64,
    /// Execs instantiated (first captures and refused updates).
    pub instantiations: u64,
    /// Execs dropped to keep within the bound.
    pub evictions: u64,
}

impl<K: Eq + Hash + Clone> GraphSet<K> {
    /// An empty set; execs are instantiated with `options`. No bound on how many it keeps.
    ///
    /// ```
    /// # use cuda_graph::prelude::*;
    /// let set: cuda_graph::GraphSet<usize> = cuda_graph::GraphSet::new(InstantiateOptions::default());
    /// assert!(set.is_empty());
    /// ```
    pub fn new(options: InstantiateOptions) -> GraphSet<K> {
        GraphSet {
            options,
            entries: HashMap::new(),
            max_entries: None,
            clock: 0,
            stats: GraphSetStats::default(),
        }
    }

    /// This set keeping at most `n` execs: before a new key's exec is kept past `n`, the least
    /// recently used one is dropped. `n = 0` is refused ([`Refusal::Size`]): a set that can
    /// keep nothing would capture at every step.
    ///
    /// ```
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::GraphSet;
    /// assert!(GraphSet::<u32>::new(InstantiateOptions::default()).with_max_entries(0).is_err());
    /// ```
    pub fn with_max_entries(mut self, n: usize) -> Result<GraphSet<K>> {
        if n == 0 {
            return Err(Error::invalid(
                Refusal::Size,
                "a GraphSet bounded to 0 execs keeps nothing: give it room for at least one",
            ));
        }
        self.max_entries = Some(n);
        Ok(self)
    }

    /// The exec for `key`: the one kept, or (a miss) the graph `capture` returns, instantiated
    /// and kept (the least recently used exec dropped first where the bound is reached). A
    /// capture or instantiation that fails returns its error; nothing is kept for the key, and
    /// the set stays as it was.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::GraphSet;
    /// # fn f(set: &mut GraphSet<u32>, def: &GraphDefinition, stream: &Stream) -> cuda_graph::Result<()> {
    /// set.get_or_capture(4, || def.try_clone())?.launch(stream)?;
    /// # Ok(()) }
    /// ```
    pub fn get_or_capture<G: FinishedGraph>(
        &mut self,
        key: K,
        capture: impl FnOnce() -> Result<G>,
    ) -> Result<&Graph> {
        self.clock += 1;
        let now = self.clock;
        if self.entries.contains_key(&key) {
            self.stats.hits += 1;
            let entry = self.entries.get_mut(&key).expect("checked just above");
            entry.last_used = now;
            return entry.cache.graph().ok_or_else(empty_entry);
        }
        self.stats.captures += 1;
        let mut cache = GraphCache::new(self.options.clone());
        let made = capture().and_then(|source| cache.refresh(&source));
        if let Err(e) = made {
            self.stats.failures += 1;
            return Err(e);
        }
        self.stats.instantiations += 1;
        self.make_room();
        let entry = self.entries.entry(key).or_insert(Entry {
            cache,
            last_used: now,
        });
        entry.cache.graph().ok_or_else(empty_entry)
    }

    /// Makes `key`'s exec run `source`: updates it in place where the driver takes the update,
    /// else instantiates `source` (as [`GraphCache::refresh`]); a key not held gets a new exec.
    /// An error leaves the key's exec as it was.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::GraphSet;
    /// # fn f(set: &mut GraphSet<u32>, def: &GraphDefinition) -> cuda_graph::Result<()> {
    /// match set.refresh(4, def)? {
    ///     CacheOutcome::Updated => {}
    ///     CacheOutcome::Instantiated { refused } => println!("instantiated ({refused:?})"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn refresh(&mut self, key: K, source: &impl FinishedGraph) -> Result<CacheOutcome> {
        self.clock += 1;
        let now = self.clock;
        let fresh = !self.entries.contains_key(&key);
        if fresh {
            let mut cache = GraphCache::new(self.options.clone());
            let outcome = cache
                .refresh(source)
                .inspect_err(|_| self.stats.failures += 1)?;
            self.stats.instantiations += 1;
            self.make_room();
            self.entries.insert(
                key,
                Entry {
                    cache,
                    last_used: now,
                },
            );
            return Ok(outcome);
        }
        let entry = self.entries.get_mut(&key).expect("checked just above");
        let outcome = entry
            .cache
            .refresh(source)
            .inspect_err(|_| self.stats.failures += 1)?;
        // A use only when it worked: a failed refresh leaves the eviction order as it was.
        entry.last_used = now;
        match outcome {
            CacheOutcome::Updated => self.stats.updates += 1,
            CacheOutcome::Instantiated { .. } => self.stats.instantiations += 1,
        }
        Ok(outcome)
    }

    /// Launches `key`'s exec on `stream` (a use, for the eviction order); an
    /// [`Error::InvalidArgument`] ([`Refusal::Missing`]) for a key not held.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::GraphSet;
    /// # fn f(set: &mut GraphSet<u32>, stream: &Stream) -> cuda_graph::Result<()> {
    /// set.launch(&8, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn launch(&mut self, key: &K, stream: &Stream) -> Result<()> {
        self.clock += 1;
        let now = self.clock;
        let entry = self.entries.get_mut(key).ok_or_else(|| {
            Error::invalid(
                Refusal::Missing,
                "this GraphSet holds no exec for the key: capture it first (get_or_capture)",
            )
        })?;
        entry.last_used = now;
        entry.cache.launch(stream)
    }

    /// `key`'s exec, if held (not a use: the eviction order does not change).
    pub fn get(&self, key: &K) -> Option<&Graph> {
        self.entries.get(key).and_then(|e| e.cache.graph())
    }

    /// Whether an exec is held for `key`.
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Drops `key`'s exec (released after its last launch) and returns it, if held.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::GraphSet;
    /// # fn f(set: &mut GraphSet<u32>) {
    /// drop(set.remove(&64));
    /// # }
    /// ```
    pub fn remove(&mut self, key: &K) -> Option<Graph> {
        self.entries.remove(key).and_then(|mut e| e.cache.take())
    }

    /// How many execs the set holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the set holds no exec.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The keys held, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }

    /// What the set did so far.
    pub fn stats(&self) -> GraphSetStats {
        self.stats
    }

    /// The bound on how many execs are kept, if any.
    pub fn max_entries(&self) -> Option<usize> {
        self.max_entries
    }

    /// Drops least recently used execs until one more fits under the bound.
    fn make_room(&mut self) {
        let Some(max) = self.max_entries else {
            return;
        };
        while self.entries.len() >= max {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            self.entries.remove(&oldest);
            self.stats.evictions += 1;
        }
    }
}

fn empty_entry() -> Error {
    Error::Internal("a GraphSet entry holds no exec".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    static_assertions::assert_impl_all!(GraphSet<u64>: Send, Sync, std::fmt::Debug);

    #[test]
    fn a_bound_of_zero_is_refused() {
        let e = GraphSet::<u8>::new(InstantiateOptions::default())
            .with_max_entries(0)
            .unwrap_err();
        assert_eq!(e.refusal(), Some(Refusal::Size));
        let s = GraphSet::<u8>::new(InstantiateOptions::default())
            .with_max_entries(3)
            .unwrap();
        assert_eq!(s.max_entries(), Some(3));
    }
}
