//! [`InstantiateOptions`]: the flags an instantiation takes, and the stream it uploads on.

use cudarc::driver::sys;

use crate::runtime::Stream;

/// Options for instantiating a graph (`CUgraphInstantiate_flags`). All off by default: start
/// from [`InstantiateOptions::new`] (or `default()`) and turn on what you need, so that a flag
/// a newer CUDA adds is a new setter, not a breaking change.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(ended: &GraphBuilder<Primary, Ended>, stream: &Stream) -> cuda_graph::Result<()> {
/// let options = InstantiateOptions::new()
///     .auto_free_on_launch(true)
///     .upload_on(stream);
/// let graph = ended.instantiate_with(&options)?;
/// assert!(options.is_auto_free_on_launch());
/// # let _ = graph;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct InstantiateOptions {
    pub(super) auto_free_on_launch: bool,
    pub(super) upload_stream: Option<Stream>,
    pub(super) device_launch: bool,
    pub(super) use_node_priority: bool,
}

impl InstantiateOptions {
    /// Every option off (the same as `default()`).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(ended: &GraphBuilder<Primary, Ended>) -> cuda_graph::Result<()> {
    /// let graph = ended.instantiate_with(&InstantiateOptions::new())?;
    /// # let _ = graph;
    /// # Ok(()) }
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`: free memory allocated by the graph's
    /// allocation nodes that is still unfreed when the graph is launched again.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// let options = InstantiateOptions::new().auto_free_on_launch(true);
    /// ```
    #[must_use = "the setter returns the changed options"]
    pub fn auto_free_on_launch(mut self, on: bool) -> Self {
        self.auto_free_on_launch = on;
        self
    }

    /// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`: upload the exec on `stream` as part of
    /// instantiation, so the first launch does not pay for it.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(stream: &Stream) {
    /// let options = InstantiateOptions::new().upload_on(stream);
    /// # }
    /// ```
    #[must_use = "the setter returns the changed options"]
    pub fn upload_on(mut self, stream: &Stream) -> Self {
        self.upload_stream = Some(stream.clone());
        self
    }

    /// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`: make the exec launchable from device code
    /// ([`Graph::device_handle`](crate::Graph::device_handle)). The driver restricts which nodes such a graph may hold.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// let options = InstantiateOptions::new().device_launch(true);
    /// ```
    #[must_use = "the setter returns the changed options"]
    pub fn device_launch(mut self, on: bool) -> Self {
        self.device_launch = on;
        self
    }

    /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`: launch each kernel node with its own
    /// priority attribute instead of the launch stream's.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// let options = InstantiateOptions::new().use_node_priority(true);
    /// ```
    #[must_use = "the setter returns the changed options"]
    pub fn use_node_priority(mut self, on: bool) -> Self {
        self.use_node_priority = on;
        self
    }

    /// Whether unfreed graph allocations are freed at the next launch.
    ///
    /// ```
    /// # use cuda_graph::prelude::*;
    /// assert!(!InstantiateOptions::new().is_auto_free_on_launch());
    /// ```
    pub fn is_auto_free_on_launch(&self) -> bool {
        self.auto_free_on_launch
    }

    /// The stream the exec is uploaded on at instantiation, if any.
    ///
    /// ```
    /// # use cuda_graph::prelude::*;
    /// assert!(InstantiateOptions::new().upload_stream().is_none());
    /// ```
    pub fn upload_stream(&self) -> Option<&Stream> {
        self.upload_stream.as_ref()
    }

    /// Whether the exec is made launchable from device code.
    ///
    /// ```
    /// # use cuda_graph::prelude::*;
    /// assert!(InstantiateOptions::new().device_launch(true).is_device_launch());
    /// ```
    pub fn is_device_launch(&self) -> bool {
        self.device_launch
    }

    /// Whether kernel nodes launch with their own priority.
    ///
    /// ```
    /// # use cuda_graph::prelude::*;
    /// assert!(!InstantiateOptions::new().is_use_node_priority());
    /// ```
    pub fn is_use_node_priority(&self) -> bool {
        self.use_node_priority
    }
}

impl InstantiateOptions {
    pub(super) fn flags(&self) -> u64 {
        type F = sys::CUgraphInstantiate_flags_enum;
        [
            (
                self.auto_free_on_launch,
                F::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            ),
            (
                self.upload_stream.is_some(),
                F::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD,
            ),
            (
                self.device_launch,
                F::CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH,
            ),
            (
                self.use_node_priority,
                F::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY,
            ),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0u64, |acc, (_, f)| acc | f.0 as u64)
    }
}
