//! A caching allocator that sits in front of a *costly* allocator — CUDA
//! device memory, pinned host memory, large `mmap` regions — keeps freed
//! blocks for reuse, and lets idle blocks **decay** back to it.
//!
//! `cudaMalloc` of 512 MB costs about 12.5 ms against about 1 µs for a host
//! `malloc`, and `cuMemFree` synchronises the device. Training loops ask for
//! the same few sizes every iteration, so a cache removes almost every
//! backing call; but memory is at a premium, so a cache that never gives
//! back starves the next stage of the pipeline. A [`DecayingPool`] serves
//! repeated sizes from its cache and hands blocks that stay idle back to the
//! backing allocator, as an eviction policy decides: [`FixedTime`],
//! [`Exponential`], [`FixedCapacity`] or your own
//! [`EvictionPolicy`]. It never splits a block, so
//! it never fragments the backing allocator.
//!
//! With [`Builder::packing`], a [`PackedPool`] carves small and medium
//! requests from segments (blocks of the pool) in O(1), so they share
//! backing allocations, while large requests stay exact blocks. Where the
//! large sizes change every step (serving, a growing key/value cache),
//! [`pages::Mapped`] under [`Packing::mapped`] maps equal physical pages
//! into reserved address space, so a freed block's pages serve the next
//! block of any size. [`SharedPool`] shares a pool between threads, with
//! per-thread caches and a [`Reaper`] that decays idle blocks on a timer.
//!
//! # Choosing a configuration
//!
//! | your workload | use |
//! |---|---|
//! | the same few sizes every step | [`DecayingPool::new`] with [`FixedTime`] |
//! | many small and medium sizes (training) | [`Builder::packing`] with [`Packing::default`] |
//! | large sizes that change every step | [`pages::Mapped`] under [`Packing::mapped`] |
//! | a memory budget | [`Builder::limit`], [`DecayingPool::set_limit`] |
//! | several threads | [`SharedPool::with_thread_caches`], [`SharedPool::packed`] |
//!
//! The command-line tool of the repository (`cli/`) replays a recorded
//! trace (a PyTorch snapshot, an RMM log, or this crate's own) through every
//! configuration and recommends one:
//! `cargo run --release -p decaying-pool-cli -- replay TRACE`.
//!
//! # Guides
//!
//! The repository's `docs/` holds one guide a topic, each example a doc test
//! of this crate:
//! [the pool and its policies](https://github.com/decaying-pool/decaying-pool/blob/main/docs/pool.md),
//! [packing and page-mapped blocks](https://github.com/decaying-pool/decaying-pool/blob/main/docs/packing.md),
//! [threads](https://github.com/decaying-pool/decaying-pool/blob/main/docs/threads.md),
//! [CUDA](https://github.com/decaying-pool/decaying-pool/blob/main/docs/cuda.md),
//! [the replay tool](https://github.com/decaying-pool/decaying-pool/blob/main/docs/replay.md),
//! [Python and C](https://github.com/decaying-pool/decaying-pool/blob/main/docs/python.md),
//! [how the crate is verified](https://github.com/decaying-pool/decaying-pool/blob/main/docs/verification.md);
//! [performance](https://github.com/decaying-pool/decaying-pool/blob/main/docs/PERFORMANCE.md)
//! has one table per claim with its command, and
//! [the architecture](https://github.com/decaying-pool/decaying-pool/blob/main/docs/ARCHITECTURE.md)
//! the invariants and every `unsafe` block's argument.
//!
//! # Features
//!
//! None is on by default; docs.rs documents them all, each item marked with
//! the feature it needs.
//!
//! | feature | adds |
//! |---|---|
//! | `cuda` | CUDA backing allocators through `cudarc`, loading libcuda at run time (builds and tests pass without CUDA): module `cuda`, `cuda::SlicePool`, `pages::CudaPages` |
//! | `trace` | module `trace`: trace readers and writers, the replayer and its cost model, request recording, Chrome-trace and SVG output, built-in workloads |
//! | `pickle` | PyTorch snapshot pickles in `trace` (implies `trace`) |
//! | `serde` | `Serialize`/`Deserialize` for [`Stats`], [`ClassStats`], [`Event`], [`Reason`] and, with `trace`, the replay reports |
//! | `testing` | module `testing`: test doubles (checking, failing, panicking allocators, clocks, policies) and `validate()` |
//! | `fuzzing` | internal, not covered by semver: module `fuzzing`, the model-checking harness behind the fuzz targets |
//!
//! Minimum supported Rust: 1.85, and 1.88 with `cuda`.
//!
//! # Examples
//!
//! ```
//! use core::time::Duration;
//! use decaying_pool::{DecayingPool, FixedTime, ManualClock, SystemAllocator};
//!
//! let clock = ManualClock::new();
//! let mut pool = DecayingPool::builder(SystemAllocator::new())
//!     .policy(FixedTime::new(Duration::from_secs(2)))
//!     .clock(clock.clone())
//!     .build();
//!
//! for _step in 0..10 {
//!     let activations = pool.allocate(64 << 20)?;
//!     let gradients = pool.allocate(16 << 20)?;
//!     // ... use them ...
//!     // SAFETY: each block came from this pool with this size and is not used again.
//!     unsafe {
//!         pool.release(gradients, 16 << 20);
//!         pool.release(activations, 64 << 20);
//!     }
//!     clock.advance(Duration::from_millis(200));
//! }
//! let s = pool.stats();
//! assert_eq!((s.misses, s.hits), (2, 18));
//!
//! // Idle for the time-to-live: both blocks go back to the system allocator.
//! clock.advance(Duration::from_secs(2));
//! assert_eq!(pool.collect(), 2);
//! assert_eq!(pool.stats().bytes_reserved, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod cache;
mod class;
mod clock;
mod error;
#[cfg(feature = "fuzzing")]
#[cfg_attr(docsrs, doc(cfg(feature = "fuzzing")))]
pub mod fuzzing;
/// The packing layer's model-checking harness, [`fuzzing::packed`], under
/// its former path.
#[cfg(feature = "fuzzing")]
#[cfg_attr(docsrs, doc(cfg(feature = "fuzzing")))]
pub use fuzzing::packed as fuzzing_packed;
mod local;
mod observe;
mod packing;
pub mod pages;
pub mod policy;
mod pool;
mod raw;
mod shared;
mod stats;
#[doc(hidden)]
pub mod store;
mod store_api;
#[cfg(test)]
mod test_rng;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
#[cfg(feature = "trace")]
#[cfg_attr(docsrs, doc(cfg(feature = "trace")))]
pub mod trace;

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_slice;
#[cfg(unix)]
pub use backend::MmapAllocator;
pub use backend::SystemAllocator;
pub use class::SizeClass;
pub use clock::{Clock, ManualClock, MonotonicClock, PreciseClock};
pub use error::PoolError;
pub use local::{HostMemory, LocalBlock, LocalPool};
pub use observe::{Event, Reason, Request};
pub use packing::{Packable, PackedBuilder, PackedPool, Packing, PackingStats, ParsePackingError};
pub use pages::PageBackend;
pub use policy::{
    AnyPolicy, BoxedPolicy, EvictionPolicy, Exponential, FixedCapacity, FixedTime, Policy, Reuse,
};
pub use pool::{Builder, DecayingPool};
pub use raw::{RawAllocator, SendBlock};
pub use shared::{LockedPool, Pooled, Reaper, SharedPool};
pub use stats::{ClassStats, HumanBytes, Stats};

// The README's Rust examples run as doc tests (`cargo test --doc`), so the
// front page cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The guides' examples likewise (`docs/*.md`).
#[cfg(doctest)]
mod guides;
