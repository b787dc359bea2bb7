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
//! backing allocations, while large requests stay exact blocks.
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
