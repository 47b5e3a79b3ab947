//! Names for the CUDA version features (cudarc's binding sets, forwarded under the same names), so
//! that the source says `#[cfg(cuda_before_12_8)]` once instead of listing every feature below
//! 12.8 at each use. Adding a `cuda-*` feature means adding it to the chain here (a new newest
//! version: a `cuda_before_` alias for the one before it, and `cuda_version_chosen`).

use cfg_aliases::cfg_aliases;

fn main() {
    cfg_aliases! {
        // `cuda_before_X_Y`: the chosen bindings are older than CUDA X.Y. Each version feature is
        // named once, in this chain.
        cuda_before_12_4: { feature = "cuda-12030" },
        cuda_before_12_8: { any(cuda_before_12_4, feature = "cuda-12040", feature = "cuda-12050", feature = "cuda-12060") },
        cuda_before_12_9: { any(cuda_before_12_8, feature = "cuda-12080") },
        cuda_before_13_0: { any(cuda_before_12_9, feature = "cuda-12090") },
        cuda_before_13_1: { any(cuda_before_13_0, feature = "cuda-13000") },
        cuda_before_13_2: { any(cuda_before_13_1, feature = "cuda-13010") },
        cuda_before_13_3: { any(cuda_before_13_2, feature = "cuda-13020") },
        cuda_before_13_4: { any(cuda_before_13_3, feature = "cuda-13030") },
        // The bindings of some CUDA version are chosen (the crate needs exactly one).
        cuda_version_chosen: { any(cuda_before_13_4, feature = "cuda-13040") },
        // The CUDA 13 bindings (any minor version).
        cuda_13: { all(cuda_version_chosen, not(cuda_before_13_0)) },
    }
}
