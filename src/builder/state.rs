//! Capture states and capture modes.
//!
//! A builder starts [`NotStarted`], becomes [`Capturing<M>`] with `begin_building(mode)` and
//! [`Ended`] with `end_building()`. The traits here are sealed: only these states exist.

use std::marker::PhantomData;

use cudarc::driver::sys::CUstreamCaptureMode;

pub(crate) mod sealed {
    pub trait Sealed {}

    /// Carries [`IsCapturing`](super::IsCapturing)'s one method, out of the public API.
    pub trait Fresh {
        /// A new value of this state (for the forks of a capturing builder).
        fn fresh() -> Self;
    }

    /// Carries [`CaptureMode`](super::CaptureMode)'s one method, out of the public API.
    pub trait RawMode {
        /// The driver's mode value.
        fn raw(self) -> cudarc::driver::sys::CUstreamCaptureMode;
    }
}

/// A capture state: [`NotStarted`], [`Capturing<M>`] or [`Ended`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a capture state",
    note = "the states are `NotStarted`, `Capturing<Global | ThreadLocal | Relaxed>` and `Ended`"
)]
pub trait State: sealed::Sealed {}

/// The state of a builder that has not begun capturing: call `begin_building(mode)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct NotStarted;

/// The state of a builder that is capturing in mode `M`: issue work, then `end_building()`.
///
/// `Capturing<Global>` and `Capturing<ThreadLocal>` are `!Send`: CUDA requires that such a capture
/// ends on the thread that began it. `Capturing<Relaxed>` is `Send`.
pub struct Capturing<M: CaptureMode> {
    _mode: PhantomData<M>,
    _thread: M::ThreadBinding,
}

impl<M: CaptureMode> std::fmt::Debug for Capturing<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Capturing<{}>", M::NAME)
    }
}

impl<M: CaptureMode> Capturing<M> {
    pub(crate) fn new() -> Self {
        Capturing {
            _mode: PhantomData,
            _thread: M::ThreadBinding::default(),
        }
    }
}

/// The state of a builder whose capture has ended: instantiate it into a `Graph`, print it, add it as a child graph,
/// or use it to update an exec.
#[derive(Debug, Default, Clone, Copy)]
pub struct Ended;

impl sealed::Sealed for NotStarted {}
impl<M: CaptureMode> sealed::Sealed for Capturing<M> {}
impl sealed::Sealed for Ended {}
impl State for NotStarted {}
impl<M: CaptureMode> State for Capturing<M> {}
impl State for Ended {}

/// States from which `begin_building` is legal: only [`NotStarted`].
#[diagnostic::on_unimplemented(
    message = "a builder that is `{Self}` cannot begin building",
    label = "`begin_building` needs a `NotStarted` builder",
    note = "a `Capturing` builder is already building: issue work, then call `end_building()`",
    note = "an `Ended` builder cannot resume capturing: create a new builder with `create_graph_builder()`"
)]
pub trait Unstarted: State {}
impl Unstarted for NotStarted {}

/// States in which work can be recorded: [`Capturing<M>`] for any mode.
#[diagnostic::on_unimplemented(
    message = "a builder that is `{Self}` is not capturing",
    label = "this needs a `Capturing` builder",
    note = "call `begin_building(Global)` (or `ThreadLocal` / `Relaxed`) first; an `Ended` builder cannot record more work"
)]
pub trait IsCapturing: State + sealed::Fresh {
    /// The capture mode.
    type Mode: CaptureMode;
}
impl<M: CaptureMode> IsCapturing for Capturing<M> {
    type Mode = M;
}
impl<M: CaptureMode> sealed::Fresh for Capturing<M> {
    fn fresh() -> Self {
        Capturing::new()
    }
}

/// States whose graph is finished: only [`Ended`].
#[diagnostic::on_unimplemented(
    message = "a builder that is `{Self}` has not ended its capture",
    label = "this needs an `Ended` builder",
    note = "call `end_building()` on the capturing builder first (and `begin_building(mode)` before that)"
)]
pub trait IsEnded: State {}
impl IsEnded for Ended {}

/// A zero-sized value that is `!Send` (it holds a raw pointer type), pinning a `Global` or
/// `ThreadLocal` capture to the thread that began it.
///
/// Moving such a builder to another thread is the compile error "`*const
/// UseRelaxedModeToMoveACaptureToAnotherThread` cannot be sent between threads safely": CUDA ties
/// `Global` and `ThreadLocal` captures to their thread. Begin the capture with `Relaxed` to move
/// it (or its forks) between threads.
#[derive(Debug, Default)]
pub struct BoundToCapturingThread(PhantomData<*const UseRelaxedModeToMoveACaptureToAnotherThread>);

/// Names, in the compile error, what to do when a `Global` or `ThreadLocal` capture is moved to
/// another thread (see [`BoundToCapturingThread`]). Never made.
#[derive(Debug)]
pub enum UseRelaxedModeToMoveACaptureToAnotherThread {}

// SAFETY: sharing `&Capturing<Global>` across threads is harmless (the builder's recording methods
// go to the driver, which checks the thread); only moving it, and so ending it elsewhere, is not.
unsafe impl Sync for BoundToCapturingThread {}

/// A stream capture mode (`CUstreamCaptureMode`), passed as a value to `begin_building`.
pub trait CaptureMode: sealed::Sealed + sealed::RawMode + Copy + Default + 'static {
    /// `BoundToCapturingThread` for `Global` and `ThreadLocal`, `()` for `Relaxed`.
    type ThreadBinding: Default + Sync;
    /// The mode's name.
    const NAME: &'static str;
}

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`: while capturing, potentially unsafe API calls from any thread
/// (e.g. a synchronous copy) invalidate the capture. The builder must stay on its thread.
///
/// A capturing `Global` builder that is leaked (`std::mem::forget`, or a reference cycle) never
/// ends its capture, and CUDA keeps refusing potentially unsafe calls — `cuMemAlloc`,
/// synchronous copies, module loads — from every thread of the process for as long as it runs,
/// like a lock guard that was forgotten. That is CUDA's rule, not undefined behaviour: the
/// calls fail with an error. Prefer [`ThreadLocal`] (only the capturing thread is restricted) or
/// [`Relaxed`] (nothing is) unless you need `Global`'s check that no other thread disturbs the
/// capture.
#[derive(Debug, Default, Clone, Copy)]
pub struct Global;

/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: only unsafe calls from this thread invalidate the
/// capture. The builder must stay on its thread.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadLocal;

/// `CU_STREAM_CAPTURE_MODE_RELAXED`: no calls are checked; the capture may end on another thread,
/// so a `Capturing<Relaxed>` builder is `Send`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Relaxed;

impl sealed::Sealed for Global {}
impl sealed::Sealed for ThreadLocal {}
impl sealed::Sealed for Relaxed {}

impl CaptureMode for Global {
    type ThreadBinding = BoundToCapturingThread;
    const NAME: &'static str = "Global";
}
impl sealed::RawMode for Global {
    fn raw(self) -> CUstreamCaptureMode {
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL
    }
}
impl CaptureMode for ThreadLocal {
    type ThreadBinding = BoundToCapturingThread;
    const NAME: &'static str = "ThreadLocal";
}
impl sealed::RawMode for ThreadLocal {
    fn raw(self) -> CUstreamCaptureMode {
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    }
}
impl CaptureMode for Relaxed {
    type ThreadBinding = ();
    const NAME: &'static str = "Relaxed";
}
impl sealed::RawMode for Relaxed {
    fn raw(self) -> CUstreamCaptureMode {
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED
    }
}

/// States in which a builder's graph can be viewed as a definition: [`NotStarted`] and
/// [`Ended`] (the kind decides further, see
/// [`HasGraphDefinition`](super::kind::HasGraphDefinition)).
#[diagnostic::on_unimplemented(
    message = "a builder that is `{Self}` cannot give a graph definition while it is capturing",
    label = "`graph_definition()` needs a builder that is not capturing",
    note = "a `Primary` or `ConditionalBody` builder: call `end_building()` first, then `graph_definition()` on the ended builder (the definition is a view of the finished graph)",
    note = "a `Forked` builder never ends on its own: join it (`parent.join(forks)`), end the parent, and call `graph_definition()` on the parent"
)]
pub trait NotCapturing: State {}
impl NotCapturing for NotStarted {}
impl NotCapturing for Ended {}
