//! A thread-safe handle around a [`DecayingPool`], self-releasing blocks,
//! and a background reaper.
//!
//! - [`SharedPool`]: a cheap, cloneable handle that every thread can
//!   allocate from;
//! - [`Pooled`]: a block handed out by a `SharedPool`; it derefs to the
//!   block, knows its size, and gives itself back to the pool when dropped;
//! - [`Reaper`]: a background thread from [`SharedPool::spawn_reaper`] that
//!   calls [`collect`](SharedPool::collect) on a period, so an idle program
//!   still gives memory back.
//!
//! [`SharedPool`]'s documentation describes what runs under which lock and
//! how it recovers from a panic inside the pool;
//! [`SharedPool::with_thread_caches`] puts a small cache per thread in
//! front of the shared one. A `SharedPool` can also
//! hold a [`PackedPool`] ([`SharedPool::packed`]), with the same handle
//! and the same [`Pooled`] blocks.

use std::sync::PoisonError;

mod barrier;
mod handle;
mod inner;
mod lending;
mod lock;
mod locked_pool;
mod magazine_path;
mod packed_layer;
mod pooled;
mod reaper;
mod split;
mod thread_cache;

pub use handle::SharedPool;
pub use locked_pool::LockedPool;
pub use pooled::Pooled;
pub use reaper::Reaper;

// For the documentation's links.
#[cfg(doc)]
use crate::packing::PackedPool;
#[cfg(doc)]
use crate::pool::DecayingPool;

/// Blocks taken out of the cache, to deallocate once the cache lock is
/// released. Empty (and allocation-free) on the hit path.
type Frees<B> = Vec<(B, usize)>;

fn recover<T>(r: Result<T, PoisonError<T>>) -> T {
    r.unwrap_or_else(PoisonError::into_inner)
}
