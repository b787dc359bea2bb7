//! The guides in `docs/` run their Rust examples as doc tests
//! (`cargo test --doc`), as the README's do, so that no guide can drift from
//! the API. Compiled only under `cfg(doctest)`.

/// `docs/pool.md`: the pool and its policies.
#[doc = include_str!("../docs/pool.md")]
pub struct Pool;

/// `docs/packing.md`: packing and page-mapped blocks.
#[doc = include_str!("../docs/packing.md")]
pub struct Packing;

/// `docs/threads.md`: threads, `SharedPool`, thread caches and the reaper.
#[doc = include_str!("../docs/threads.md")]
pub struct Threads;

/// `docs/cuda.md`: the CUDA backends.
#[doc = include_str!("../docs/cuda.md")]
pub struct Cuda;

/// `docs/replay.md`: the replay tool.
#[doc = include_str!("../docs/replay.md")]
pub struct Replay;

/// `docs/python.md`: Python and C.
#[doc = include_str!("../docs/python.md")]
pub struct Python;

/// `docs/verification.md`: how the crate is verified.
#[doc = include_str!("../docs/verification.md")]
pub struct Verification;
