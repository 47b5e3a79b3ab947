//! The driver version type, below both the driver layer and the error type.

use std::fmt;

/// A CUDA driver version as `cuDriverGetVersion` reports it (`1000 * major + 10 * minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion(pub i32);

impl DriverVersion {
    /// CUDA 12.0: `cuGraphInstantiateWithParams`, `cuGraphExecUpdate_v2`.
    pub const V12_0: DriverVersion = DriverVersion(12000);
    /// CUDA 12.2: `cuGraphAddNode`/`cuGraphNodeSetParams` (complete per-node parameters).
    pub const V12_2: DriverVersion = DriverVersion(12020);
    /// CUDA 12.3: conditional handles, IF and WHILE nodes, `cuStreamBeginCaptureToGraph`.
    pub const V12_3: DriverVersion = DriverVersion(12030);
    /// CUDA 12.4: `cuFuncGetParamInfo` (reading kernel arguments back).
    pub const V12_4: DriverVersion = DriverVersion(12040);
    /// CUDA 12.8: IF with ELSE, SWITCH nodes.
    pub const V12_8: DriverVersion = DriverVersion(12080);
    /// CUDA 13.0: managed memory in graph allocations.
    pub const V13_0: DriverVersion = DriverVersion(13000);
    /// CUDA 13.2: `cuGraphNodeGetParams` (reading any node back).
    pub const V13_2: DriverVersion = DriverVersion(13020);

    /// The major version (`12` for 12.8).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// let v = cuda_graph::driver_version()?;
    /// println!("CUDA {}.{}", v.major(), v.minor());
    /// # Ok(()) }
    /// ```
    pub fn major(self) -> i32 {
        self.0 / 1000
    }
    /// The minor version (`8` for 12.8).
    ///
    /// ```no_run
    /// # use cuda_graph::prelude::*;
    /// # use cuda_graph::*;
    /// # fn f() -> cuda_graph::Result<()> {
    /// assert_eq!(DriverVersion(12080).minor(), 8);
    /// # Ok(()) }
    /// ```
    pub fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}
