//! Host callbacks: `callback(closure)` records a host function node.

use super::kind::Kind;
use super::state::IsCapturing;
use super::state::State;
use super::GraphBuilder;
use crate::core::callback::{prepare, HostCallback, PreparedCallback};
use crate::driver;
use crate::error::{Error, Refusal, Result};

/// While capturing: host callbacks.
impl<K: Kind, S: State> GraphBuilder<K, S> {
    /// Records a host function node that runs `f` on a driver thread, once per launch, after the
    /// work recorded before it (`cuLaunchHostFunc`).
    ///
    /// `f` must be `Send + 'static`: it outlives this call and runs on another thread. It is kept
    /// alive until the last graph and exec holding it are dropped. It must not call CUDA.
    /// Conditional bodies cannot hold host nodes: there the driver refuses the callback.
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # fn f(b: &GraphBuilder<Primary, Capturing<Global>>) -> cuda_graph::Result<()> {
    /// let cb = b.add_host_callback(|| println!("the graph reached this point"))?;
    /// # Ok(()) }
    /// ```
    pub fn add_host_callback<F>(&self, f: F) -> Result<HostCallback>
    where
        S: IsCapturing,
        F: FnMut() + Send + 'static,
    {
        let PreparedCallback {
            keep: state,
            observer,
            func,
            user_data: ptr,
        } = prepare(f);
        let stream = &self.core.stream;
        stream.enqueue(|rec| {
            if !rec.capturing() {
                // Not capturing any more (invalidated): nothing would own the closure.
                self.core.status()?;
                return Err(Error::invalid(
                    Refusal::Capture,
                    "the builder's stream is not capturing",
                ));
            }
            rec.keep_dyn(&state);
            // SAFETY: `ptr` stays valid as long as the graph holds the state (above); the
            // trampoline never unwinds and never calls CUDA.
            unsafe { driver::stream::launch_host_func(stream.raw(), Some(func), ptr) }
        })?;
        Ok(observer)
    }
}
