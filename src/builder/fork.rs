//! Fork/join across streams: `split::<N>()` and `join(forks)`.

use super::core::Core;
use super::kind::{Forked, Kind};
use super::state::IsCapturing;
use super::state::State;
use super::GraphBuilder;
use crate::error::{Error, Result};
use crate::runtime::Stream;

/// The number of forks in `split::<N>()`, as a type, so that `N < 2` is a compile error.
#[derive(Debug)]
pub struct Forks<const N: usize>;

/// Fork counts `split` accepts: 2 to 32.
#[diagnostic::on_unimplemented(
    message = "`split::<N>()` needs at least 2 forks, but `{Self}` asks for fewer (or more than 32)",
    label = "a split into fewer than 2 forks is not a fork",
    note = "to keep recording on one stream, use the builder itself; to branch, use `split::<2>()` or more"
)]
pub trait AtLeastTwo {}

macro_rules! at_least_two {
    ($($n:literal)*) => { $( impl AtLeastTwo for Forks<$n> {} )* };
}
at_least_two!(2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);

/// While capturing: forks and joins.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Forks the capture into `N` builders of kind [`Forked`], each capturing on a stream of its
    /// own that first waits for everything recorded on this builder so far.
    ///
    /// The forks borrow this builder, so it cannot end its capture until every fork is joined
    /// ([`join`](Self::join)) or dropped (which joins it): `end_building()` with a fork alive is
    /// the compile error E0505, "cannot move out of `parent` because it is borrowed", pointing
    /// at this `split`. Forks can split again.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(device: &Device, k: &Function, a: &DeviceBuffer<i32>, b: &DeviceBuffer<i32>) -> cuda_graph::Result<()> {
    /// let builder = device.create_graph_builder()?.begin_building(Global)?;
    /// let [left, right] = builder.split::<2>()?;
    /// unsafe {
    ///     left.launch_unchecked(k, LaunchConfig::single(), &KernelArgs::new().arg(a))?;
    ///     right.launch_unchecked(k, LaunchConfig::single(), &KernelArgs::new().arg(b))?;
    /// }
    /// builder.join([left, right])?;
    /// let graph = builder.end_building()?.instantiate()?;
    /// # Ok(()) }
    /// ```
    pub fn split<const N: usize>(&self) -> Result<[GraphBuilder<Forked<'_>, S>; N]>
    where
        S: IsCapturing,
        Forks<N>: AtLeastTwo,
    {
        let device = self.core.stream.device();
        let event = device.pooled_event()?;
        self.core.stream.record(&event)?;
        let mut forks = Vec::with_capacity(N);
        for _ in 0..N {
            let stream: Stream = device.pooled_stream()?;
            // The stream joins the capture by waiting on an event recorded in it.
            stream.wait(&event)?;
            let mut core = Core::new(stream);
            core.graph = self.core.graph.clone();
            core.joined = self.core.own_capture().map(|c| c.id);
            core.capturing = true;
            core.join_into = Some(self.core.stream.clone());
            forks.push(GraphBuilder {
                core,
                kind: Forked {
                    _parent: std::marker::PhantomData,
                },
                state: <S as super::state::sealed::Fresh>::fresh(),
            });
        }
        forks
            .try_into()
            .map_err(|_| Error::Internal("split made the wrong number of forks".into()))
    }

    /// Joins forks back: this builder's stream waits for each fork's work, and the forks end.
    ///
    /// If joining one fork fails, its error is returned and the remaining forks are still joined
    /// as they drop, so the capture is never left with an unjoined stream.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let forks = b.split::<3>()?;
    /// // ... record into each fork ...
    /// b.join(forks)?; // the parent continues after all three
    /// # Ok(()) }
    /// ```
    pub fn join<'a, I>(&self, forks: I) -> Result<()>
    where
        S: IsCapturing,
        I: IntoIterator<Item = GraphBuilder<Forked<'a>, S>>,
    {
        let mut first_error = None;
        for mut fork in forks {
            if let Err(e) = fork.core.finish_fork() {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
