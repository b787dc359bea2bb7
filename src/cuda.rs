//! CUDA: the backing allocators of [`backend::cuda`](crate::backend::cuda)
//! and [`SlicePool`], typed `cudarc` slices from a pool (feature `cuda`).
//!
//! See [`backend::cuda`](crate::backend::cuda) for what the caller
//! guarantees before a block is reused or freed; [`SlicePool`] satisfies it
//! by construction (one stream).

pub use crate::backend::cuda::*;
pub use crate::cuda_slice::{PooledSlice, SlicePool};
