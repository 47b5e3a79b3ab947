//! Builder kinds: [`Primary`], [`Forked`] and [`ConditionalBody`].

use std::marker::PhantomData;

use super::core::Core;
use super::state::sealed::Sealed;

/// A builder kind: [`Primary`], [`Forked`] or [`ConditionalBody`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a builder kind",
    note = "the kinds are `Primary`, `Forked<'_>` and `ConditionalBody<'_>`"
)]
pub trait Kind: Sealed {}

/// A top-level builder: its capture becomes a graph of its own, which can be instantiated into a
/// `Graph`, printed, embedded in another capture, or used to update an exec.
#[derive(Debug, Default, Clone, Copy)]
pub struct Primary;

/// A builder forked off a capturing builder by `split`: it records on a stream of its own into
/// the parent's capture, and borrows the parent until it is joined (or dropped, which joins it).
pub struct Forked<'p> {
    pub(crate) _parent: PhantomData<&'p Core>,
}

impl std::fmt::Debug for Forked<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Forked")
    }
}

/// The body of a conditional node (`add_if`, `add_if_else`, `add_switch`, `add_while`): it captures into
/// the node's body graph and borrows the parent until it is dropped, so the parent cannot end its
/// capture while a body is open.
pub struct ConditionalBody<'p> {
    pub(crate) _parent: PhantomData<&'p Core>,
}

impl std::fmt::Debug for ConditionalBody<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConditionalBody")
    }
}

impl Sealed for Primary {}
impl Sealed for Forked<'_> {}
impl Sealed for ConditionalBody<'_> {}
impl Kind for Primary {}
impl Kind for Forked<'_> {}
impl Kind for ConditionalBody<'_> {}

/// Kinds that own their capture and can end it: [`Primary`] and [`ConditionalBody`].
#[diagnostic::on_unimplemented(
    message = "a `{Self}` builder cannot end the capture",
    label = "forks record into their parent's capture; they do not own one",
    note = "join the forks into their parent with `parent.join(forks)` (or drop them), then call `end_building()` on the parent"
)]
pub trait OwnsCapture: Kind {}
impl OwnsCapture for Primary {}
impl OwnsCapture for ConditionalBody<'_> {}

/// Kinds whose ended graph stands alone: only [`Primary`].
#[diagnostic::on_unimplemented(
    message = "a `{Self}` builder cannot be used as a graph of its own",
    label = "only an ended `Primary` builder can be instantiated, added as a child graph or used as an update source",
    note = "a conditional body or fork becomes part of its parent's graph: instantiate the parent (the `Primary` builder) instead"
)]
pub trait StandsAlone: Kind {}
impl StandsAlone for Primary {}

/// Kinds whose graph can be viewed as a definition in state `S`: [`Primary`] once `Ended`, and
/// [`ConditionalBody`] in any state that is not capturing. (A `Capturing` state is ruled out by
/// [`NotCapturing`](super::state::NotCapturing), with its own message, so `Primary` implements
/// this for `Capturing` too: then only that message shows.)
#[diagnostic::on_unimplemented(
    message = "a `{Self}` builder that is `{S}` has no graph to view as a definition",
    label = "`graph_definition()` needs an ended `Primary` builder, or a `ConditionalBody` builder",
    note = "a `Primary` builder that is `NotStarted` has no graph yet: call `begin_building(mode)`, record, `end_building()`, then `graph_definition()`; or build explicitly from `GraphDefinition::new(&device)`",
    note = "a `Forked` builder records into its parent's graph: join it (`parent.join(forks)`), end the parent, and call `graph_definition()` on the parent"
)]
pub trait HasGraphDefinition<S: super::state::State>: Kind {}
impl HasGraphDefinition<super::state::Ended> for Primary {}
impl<M: super::state::CaptureMode> HasGraphDefinition<super::state::Capturing<M>> for Primary {}
impl<S: super::state::State> HasGraphDefinition<S> for ConditionalBody<'_> {}
