//! The typestate layer: [`GraphBuilder<K, S>`] and its kind and state markers.
//!
//! See [`GraphBuilder`] for the state machine.

use std::sync::Arc;

use crate::driver::graph::GraphHandle;
use crate::error::Result;
use crate::runtime::{Device, Stream};

mod callback;
mod capture;
mod conditional;
pub(crate) mod core;
mod definition;
mod embed;
mod fork;
pub mod kind;
pub mod state;

pub use crate::core::callback::HostCallback;
pub use crate::core::conditional::{ConditionalHandle, MAX_SWITCH_BODIES};
pub use fork::{AtLeastTwo, Forks};
pub use kind::{
    ConditionalBody, Forked, HasGraphDefinition, Kind, OwnsCapture, Primary, StandsAlone,
};
pub use state::{
    BoundToCapturingThread, CaptureMode, Capturing, Ended, Global, IsCapturing, IsEnded,
    NotCapturing, NotStarted, Relaxed, State, ThreadLocal, Unstarted,
    UseRelaxedModeToMoveACaptureToAnotherThread,
};

use self::core::Core;

/// Records GPU work into a CUDA graph by stream capture, with the capture's state machine in the
/// type: `GraphBuilder<K, S>` has a kind `K` and a state `S`, and a method exists only where it
/// is legal.
///
#[doc = include_str!("../../docs/state-machine.rustdoc.html")]
///
/// ## The decisions, in order
///
/// 1. **Where to capture.** [`Device::create_graph_builder`] makes a builder with a stream of its
///    own; [`Stream::create_graph_builder`] captures on a stream you have. Either gives a
///    `GraphBuilder<Primary, NotStarted>`.
/// 2. **The capture mode.** [`begin_building`](GraphBuilder::begin_building) takes
///    [`Global`], [`ThreadLocal`] or [`Relaxed`] and returns a `GraphBuilder<Primary,
///    Capturing<M>>`. Global and thread-local captures are `!Send`: they end on their thread.
/// 3. **What to record.** While `Capturing`: [`launch`](GraphBuilder::launch) kernels,
///    `memset_d8`/`memset_d32`/`memcpy_dtod` buffers, work on [`stream`](GraphBuilder::stream),
///    [`split`](GraphBuilder::split) into forks and [`join`](GraphBuilder::join) them,
///    [`add_child_graph`](GraphBuilder::add_child_graph) a child graph, add a [`add_host_callback`](GraphBuilder::add_host_callback),
///    or branch with conditional nodes ([`add_if`](GraphBuilder::add_if),
///    [`add_if_else`](GraphBuilder::add_if_else), [`add_switch`](GraphBuilder::add_switch),
///    [`add_while`](GraphBuilder::add_while)), whose bodies are builders of kind
///    [`ConditionalBody`].
/// 4. **End.** [`end_building`](GraphBuilder::end_building) gives a `GraphBuilder<Primary, Ended>`.
///    It does not compile while a fork or a conditional body still borrows the builder.
/// 5. **Use the graph.** [`instantiate`](GraphBuilder::instantiate) instantiates a
///    [`Graph`](crate::Graph) (as often as you like);
///    [`debug_dot_print`](GraphBuilder::debug_dot_print) writes it as DOT; an ended builder is
///    also a source for [`Graph::update`](crate::Graph::update) and for `add_child_graph`.
///
/// ```no_run
/// use cuda_graph::prelude::*;
/// # fn main() -> cuda_graph::Result<()> {
/// # let device = Device::new(0)?;
/// # let module = device.load_ptx("")?;
/// // SAFETY: add_one(int* p) increments p[0]: its parameter list, within any buffer.
/// let add_one = unsafe { module.kernel::<(*mut i32,)>("add_one")? };
/// let counter = device.alloc_zeroed::<i32>(1)?;
///
/// let builder = device.create_graph_builder()?;          // Primary, NotStarted
/// let builder = builder.begin_building(Global)?;          // Primary, Capturing<Global>
/// builder.launch(&add_one, LaunchConfig::single(), &counter)?; // typed: checked at compile time
/// let builder = builder.end_building()?;                  // Primary, Ended
/// let graph = builder.instantiate()?;
/// # Ok(()) }
/// ```
///
/// Illegal transitions do not compile, and the error says what to call instead:
///
/// ```compile_fail
/// # use cuda_graph::prelude::*;
/// # fn f(device: &Device) -> cuda_graph::Result<()> {
/// let builder = device.create_graph_builder()?.begin_building(Global)?;
/// let graph = builder.instantiate()?; // not Ended yet
/// # Ok(()) }
/// ```
///
/// ## At run time
/// What the driver decides stays a [`Result`]: an invalidated capture, a refused
/// instantiation, a driver too old for a feature. Dropping a builder mid-capture (also by a
/// panic) ends its capture and leaves its stream usable.
///
/// ## Threads
/// `GraphBuilder<_, Capturing<Global>>` and `GraphBuilder<_, Capturing<ThreadLocal>>` are
/// `!Send`; every other builder is `Send`. All builders are `Sync`.
pub struct GraphBuilder<K: Kind, S: State> {
    pub(crate) core: Core,
    pub(crate) kind: K,
    pub(crate) state: S,
}

impl<K: Kind + std::fmt::Debug, S: State + std::fmt::Debug> std::fmt::Debug for GraphBuilder<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphBuilder")
            .field("kind", &self.kind)
            .field("state", &self.state)
            .field("stream", &self.core.stream)
            .finish()
    }
}

impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Moves the runtime part into a builder of another type (a transition).
    pub(crate) fn into_state<S2: State>(self, state: S2) -> GraphBuilder<K, S2> {
        GraphBuilder {
            core: self.core,
            kind: self.kind,
            state,
        }
    }

    /// The graph this builder captured into (or its finished graph).
    pub(crate) fn graph_handle(&self) -> Option<&Arc<GraphHandle>> {
        self.core.graph.as_ref()
    }
}

impl Device {
    /// A builder that captures on a new stream of its own:
    /// `GraphBuilder<Primary, NotStarted>`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(device: &Device) -> cuda_graph::Result<()> {
    /// let builder = device.create_graph_builder()?; // on a new stream of its own
    /// let capturing = builder.begin_building(Global)?;
    /// # let _ = capturing;
    /// # Ok(()) }
    /// ```
    pub fn create_graph_builder(&self) -> Result<GraphBuilder<Primary, NotStarted>> {
        Ok(self.create_stream()?.create_graph_builder())
    }
}

impl Stream {
    /// A builder that captures on this stream: `GraphBuilder<Primary, NotStarted>`.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f(stream: &Stream) -> cuda_graph::Result<()> {
    /// let capturing = stream.create_graph_builder().begin_building(ThreadLocal)?;
    /// # let _ = capturing;
    /// # Ok(()) }
    /// ```
    pub fn create_graph_builder(&self) -> GraphBuilder<Primary, NotStarted> {
        GraphBuilder {
            core: Core::new(self.clone()),
            kind: Primary,
            state: NotStarted,
        }
    }
}

static_assertions::assert_impl_all!(GraphBuilder<Primary, NotStarted>: Send, Sync);
static_assertions::assert_impl_all!(GraphBuilder<Primary, Capturing<Relaxed>>: Send, Sync);
static_assertions::assert_not_impl_any!(GraphBuilder<Primary, Capturing<Global>>: Send);
static_assertions::assert_not_impl_any!(GraphBuilder<Primary, Capturing<ThreadLocal>>: Send);
static_assertions::assert_impl_all!(GraphBuilder<Primary, Capturing<Global>>: Sync);
static_assertions::assert_impl_all!(GraphBuilder<Primary, Ended>: Send, Sync);
static_assertions::assert_impl_all!(GraphBuilder<Forked<'static>, Capturing<Relaxed>>: Send, Sync);
static_assertions::assert_not_impl_any!(GraphBuilder<Forked<'static>, Capturing<Global>>: Send);
static_assertions::assert_impl_all!(GraphBuilder<ConditionalBody<'static>, NotStarted>: Send, Sync);
static_assertions::assert_not_impl_any!(GraphBuilder<ConditionalBody<'static>, Capturing<Global>>: Send);
