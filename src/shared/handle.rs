//! [`SharedPool`]: the handle, its constructors and the calls it forwards
//! to the shared state ([`Inner`]).

use core::fmt;
use core::mem::ManuallyDrop;
use core::sync::atomic::Ordering;
use core::time::Duration;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex};

use super::inner::Inner;
use super::lending::{Slot, with_lending};
use super::locked_pool::LockedPool;
use super::magazine_path::ThreadCaches;
use super::packed_layer::PackedLayer;
use super::pooled::Pooled;
use super::reaper::{self, Reaper};
use super::split;
use super::thread_cache::MAGAZINE;
use super::{Frees, recover};
use crate::clock::{Clock, MonotonicClock};
use crate::error::PoolError;
use crate::observe::Request;
use crate::packing::{Packable, PackedPool, PackingStats};
use crate::policy::{FixedTime, Policy, Reuse};
use crate::pool::DecayingPool;
use crate::raw::{RawAllocator, SendBlock};
use crate::stats::{ClassStats, Stats};

// For the documentation's links.
#[cfg(doc)]
use super::lending::Lending;
#[cfg(doc)]
use std::sync::PoisonError;

/// A thread-safe, cheaply cloneable handle to a [`DecayingPool`].
///
/// Clones share one pool. `SharedPool` and [`Pooled`] are `Send` and `Sync`
/// whenever the backing allocator, the policy and the clock are `Send` and
/// the blocks are [`SendBlock`] (integers and pointers are, so the host
/// allocators, the test doubles and device-pointer allocators qualify). The
/// pool is dropped — every cached block going back through the backing
/// allocator — when the last handle and the last [`Pooled`] block are
/// dropped.
///
/// # What runs under which lock
///
/// The pool is split in two, each behind its own lock: the *cache* (the
/// store of idle blocks, the policy, the clock and the counters) and the
/// *backing allocator* (a [`Mutex`]). No thread ever holds both, except
/// inside [`SharedPool::with`]. (A pool from [`SharedPool::packed`] keeps
/// its packing layer behind one lock instead of the cache lock, and makes
/// its backing calls outside it too: see there.)
///
/// The cache lock is held only briefly (no backing call runs under it), so
/// it is a lighter lock than a `Mutex`: one atomic read-modify-write to
/// take it, a plain store to release it. A thread that finds it taken
/// spins, then yields, then naps (at most 50 µs at a time) until it is
/// free; inside [`with`](Self::with), which holds it for as long as its
/// closure runs, other threads' calls nap.
///
/// On 64-bit Linux the cache lock is also *biased* to the thread that
/// uses the pool alone: the first thread to take it, or later one that
/// takes it 4096 times in a row, takes and releases it with plain loads
/// and stores, no read-modify-write. Another thread's call (a second worker, the
/// reaper, `stats`) revokes the bias first, with one `membarrier` system
/// call, as the thread caches' visitors do (see
/// [`with_thread_caches`](Self::with_thread_caches)); threads that take
/// turns at the pool keep it unbiased. Where the system call is not
/// available, the lock is never biased.
///
/// A [`Pooled`] block does not keep its pool alive through a reference
/// count of its own (one shared counter written by every thread): the
/// blocks lent out are counted under the cache lock, which a round trip
/// takes anyway, and keep the pool alive all together.
///
/// - A **hit** holds the cache lock for the store lookup and the policy
///   check, and never touches the allocator.
/// - A **miss** books its class size against the limit under the cache
///   lock, releases it, and only then calls the backing allocator under the
///   allocator lock; it takes the cache lock again to count the new block.
///   While one thread's miss is inside `cudaMalloc`, other threads' hits go
///   on. (Misses of different threads still take turns at the backing
///   allocator, which owns its state through `&mut self`.)
/// - Blocks the cache lets go — expired by the policy, displaced from a
///   full [`FixedCapacity`](crate::FixedCapacity) window, freed by the
///   limit, the out-of-memory retry or `trim` — are taken out and counted
///   as freed under the cache lock, then handed to the backing
///   `deallocate` after it is released.
///
/// So [`stats`](Self::stats) counts a block as freed (and a miss's bytes as
/// not yet reserved) a moment before the backing allocator sees the call.
/// The limit counts in-flight misses, so `bytes_reserved` never exceeds it.
///
/// A pool from [`SharedPool::with_thread_caches`] serves most round trips
/// of a thread from a small cache of its own, without a lock on Linux:
/// see there.
///
/// # Panics inside the pool
///
/// A panic inside the backing allocator, the clock, a user
/// [`EvictionPolicy`](crate::EvictionPolicy) or a closure passed to
/// [`SharedPool::with`] does not make the pool unusable or lose blocks:
///
/// - a poisoned lock is recovered ([`PoisonError::into_inner`]), and the
///   cache lock is released on unwinding (it knows no poisoning): the
///   cache store tells the policy of a change before making it, so a
///   panicking policy leaves it as it was;
/// - blocks taken out of the cache are deallocated even when a policy
///   panics later in the same call, and every block of a batch is offered
///   to `deallocate` even when one call panics (the first panic is passed
///   on afterwards);
/// - a miss whose backing `allocate` panics drops its booking against the
///   limit;
/// - a releasing [`Pooled`] caches its block even when the policy run that
///   precedes the release panics, or a `deallocate` of a block that run
///   evicts (the panic is passed on after the block is cached); when the
///   clock panics, the block goes back through the backing `deallocate`
///   instead (counted in `trimmed`), so it never stays counted in use or
///   against the limit; when its thread is already unwinding, a panic
///   from the pool is caught and discarded rather than abort the process;
/// - dropping the pool (the last handle and the last `Pooled`) offers every
///   cached block to `deallocate` even when one call, the clock or the
///   policy panics, and passes the first panic on, unless the thread is
///   already unwinding (then it is discarded: no abort).
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::{DecayingPool, FixedTime, SharedPool, SystemAllocator};
///
/// let pool = SharedPool::new(DecayingPool::new(
///     SystemAllocator::new(),
///     FixedTime::new(Duration::from_secs(1)),
/// ));
/// let workers: Vec<_> = (0..4)
///     .map(|i| {
///         let pool = pool.clone();
///         std::thread::spawn(move || {
///             for _ in 0..100 {
///                 let block = pool.allocate(4096).unwrap();
///                 // SAFETY: the block is 4096 writable bytes, ours alone.
///                 unsafe { block.as_ptr().write(i) };
///             } // each block goes back to the pool here
///         })
///     })
///     .collect();
/// for w in workers {
///     w.join().unwrap();
/// }
/// let s = pool.stats();
/// assert_eq!(s.hits + s.misses, 400);
/// assert!(s.misses <= 4);
/// ```
pub struct SharedPool<A: RawAllocator, P: Policy = FixedTime, C: Clock = MonotonicClock> {
    pub(super) inner: Arc<Inner<A, P, C>>,
}

// SAFETY: the handle only reaches the pool through its locks (the cache
// lock and the mutexes), which give one thread at a time access to the
// allocator, the policy, the clock (all `Send`) and the blocks
// (`SendBlock`: movable and shareable across threads, releasable from any
// thread).
unsafe impl<A, P, C> Send for SharedPool<A, P, C>
where
    A: RawAllocator + Send,
    A::Block: SendBlock,
    P: Policy + Send,
    C: Clock + Send,
{
}

// SAFETY: as for `Send`: every method takes `&self` and goes through the
// locks.
unsafe impl<A, P, C> Sync for SharedPool<A, P, C>
where
    A: RawAllocator + Send,
    A::Block: SendBlock,
    P: Policy + Send,
    C: Clock + Send,
{
}

impl<A: RawAllocator, P: Policy, C: Clock> SharedPool<A, P, C> {
    /// Wraps `pool` for sharing between threads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.stats().bytes_reserved, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(mut pool: DecayingPool<A, P, C>) -> Self {
        let requests = pool.take_request_hook();
        let (alloc, cache) = pool.into_parts();
        SharedPool {
            inner: Arc::new(Inner::new(Some(cache), Some(alloc), None, None, requests)),
        }
    }

    /// Wraps a [`PackedPool`] for sharing between threads: small and medium
    /// requests are carved from segments, larger ones are exact blocks,
    /// and the blocks are the same self-releasing [`Pooled`] handles.
    ///
    /// The packing layer (segments, carved blocks, the exact pool's cache)
    /// is behind one lock and the backing allocator behind another, as in a
    /// plain pool: a call that needs a new segment or an exact block fetches
    /// it with only the allocator's lock held, so other threads' hits and
    /// releases go on meanwhile, and the blocks the pool lets go are freed
    /// after the packing lock. Without backing failures the pool makes the
    /// same calls and hands out the same blocks as the `PackedPool` alone;
    /// after a failure the out-of-memory ladder starts again at its first
    /// rung at each try (cached blocks freed oldest first until none is
    /// left), so [`Stats::backing_failures`] may count more. A try that
    /// needs a backing block returns to the shared pool with its class (a
    /// value, not an unwinding), so builds with `panic = "abort"` take the
    /// same path.
    ///
    /// [`stats`](Self::stats) count the caller's requests
    /// ([`PackedPool::stats`]), [`packing_stats`](Self::packing_stats) the
    /// packing counters; [`with_packed`](Self::with_packed) reaches the
    /// `PackedPool` itself ([`with`](Self::with) panics on a packed pool). A
    /// panic inside the packed pool (backing allocator, clock, policy) is
    /// passed on and the lock recovered by the next call; the blocks it
    /// keeps are as [`PackedPool`] keeps them.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing, SharedPool};
    /// let pool = SharedPool::packed(
    ///     DecayingPool::builder(CheckingAllocator::with_addresses())
    ///         .packing(Packing::default())
    ///         .build(),
    /// );
    /// let (a, b) = (pool.allocate(100)?, pool.allocate(5000)?);
    /// assert_eq!(*b - *a, 512); // carved side by side from one segment
    /// assert_eq!(pool.stats().backing_allocs, 1);
    /// assert_eq!(pool.packing_stats().unwrap().packed_blocks, 2);
    /// drop((a, b)); // the emptied segment goes back to the exact pool
    /// assert_eq!(pool.packing_stats().unwrap().segments, 0);
    /// assert_eq!(pool.stats().blocks_cached, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn packed(pool: PackedPool<A, P, C>) -> Self
    where
        A: Packable + 'static,
        P: 'static,
        C: 'static,
    {
        let mut pool = pool;
        let requests = pool.take_request_hook();
        // Backing calls outside the packing lock (`split`), in every build.
        let (layer, alloc): (Box<dyn PackedLayer<A, P, C>>, _) = {
            let (layer, alloc) = split::SplitLayer::new(pool);
            (Box::new(layer), Some(alloc))
        };
        SharedPool {
            inner: Arc::new(Inner::new(
                None,
                alloc,
                Some(Mutex::new(layer)),
                None,
                requests,
            )),
        }
    }

    /// The packing counters of a pool from [`SharedPool::packed`]; `None`
    /// for a plain pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.packing_stats(), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn packing_stats(&self) -> Option<PackingStats> {
        self.inner.packed(|p| p.packing_stats())
    }

    /// Runs `f` on the [`PackedPool`] of a pool from
    /// [`SharedPool::packed`], under its lock; `None` for a plain pool.
    ///
    /// `f` sees the pool over the backing allocator, with the packing and
    /// allocator locks both held: its own calls reach the allocator
    /// directly, and every other thread using the pool waits until `f`
    /// returns. Using this pool inside `f` through a handle (or dropping a
    /// [`Pooled`] of it) deadlocks.
    ///
    /// # Panics
    ///
    /// When `f` panics (the pool is put back together first, and the lock
    /// recovered by the next call).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing, SharedPool};
    /// let pool = SharedPool::packed(
    ///     DecayingPool::builder(CheckingAllocator::with_addresses())
    ///         .limit(1 << 30)
    ///         .packing(Packing::default())
    ///         .build(),
    /// );
    /// assert_eq!(pool.with_packed(|p| p.segment_cap()), Some(32 << 20));
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_packed<R>(&self, f: impl FnOnce(&mut PackedPool<A, P, C>) -> R) -> Option<R>
    where
        A: Packable + 'static,
        P: 'static,
        C: 'static,
    {
        let layer = self.inner.packed.as_ref()?;
        let mut guard = recover(layer.lock());
        let mut alloc = recover(self.inner.alloc.lock());
        let (mut f, mut out) = (Some(f), None);
        guard.with_pool(&mut alloc, &mut |pool| {
            let pool = pool
                .downcast_mut::<PackedPool<A, P, C>>()
                .expect("a packed SharedPool holds a PackedPool of its own types");
            if let Some(f) = f.take() {
                out = Some(f(pool));
            }
        });
        out
    }

    /// Checks the pool's structures ([`DecayingPool::validate`], or
    /// [`PackedPool::validate`] for a packed pool).
    ///
    /// # Panics
    ///
    /// With a description of the first inconsistency found (a bug in this
    /// crate).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let b = pool.allocate(8)?;
    /// pool.validate();
    /// # drop(b);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "testing")]
    pub fn validate(&self) {
        if self.inner.packed(|p| p.validate()).is_none() {
            self.inner.cache(|cache| cache.validate());
        }
    }

    /// Hands out a block of at least `size` bytes, which goes back to the
    /// pool when the returned [`Pooled`] is dropped.
    ///
    /// Same rules as [`DecayingPool::allocate`]; a miss calls the backing
    /// allocator without holding the cache lock.
    ///
    /// # Errors
    ///
    /// As [`DecayingPool::allocate`]: [`PoolError::ZeroSize`],
    /// [`PoolError::TooLarge`], [`PoolError::LimitExceeded`] or
    /// [`PoolError::Backing`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, PoolError, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let block = pool.allocate(100)?;
    /// assert_eq!(block.size(), 100);
    /// assert_eq!(pool.stats().blocks_in_use, 1);
    /// drop(block);
    /// assert_eq!(pool.stats().blocks_cached, 1);
    /// assert!(matches!(pool.allocate(0), Err(PoolError::ZeroSize)));
    /// # Ok(())
    /// # }
    /// ```
    #[inline(always)]
    pub fn allocate(&self, size: usize) -> Result<Pooled<A, P, C>, PoolError<A::Error>> {
        let block = self.inner.allocate(&self.inner, size)?;
        if self.inner.requests.is_some() {
            return self.allocated_logged(block, size);
        }
        Ok(Pooled {
            block: ManuallyDrop::new(block),
            size,
            // The block was counted lent (plain pool) by `allocate`.
            pool: self.view(),
        })
    }

    /// Tells the request hook of `block`, just handed out: out of line, so
    /// a pool without a hook pays a test of one pointer.
    #[cold]
    #[inline(never)]
    fn allocated_logged(
        &self,
        block: A::Block,
        size: usize,
    ) -> Result<Pooled<A, P, C>, PoolError<A::Error>> {
        let pooled = Pooled {
            block: ManuallyDrop::new(block),
            size,
            // The block was counted lent (plain pool) by `allocate`.
            pool: self.view(),
        };
        if let Some(hook) = &self.inner.requests {
            // A hook that panics drops `pooled`, which gives the block back.
            recover(hook.lock()).call(Request::Allocated {
                block: &pooled.block,
                size,
            });
        }
        Ok(pooled)
    }

    /// A snapshot of the pool's counters ([`DecayingPool::stats`]). It
    /// waits for no miss inside the backing allocator: while one is, the
    /// page figures of an allocator of mapped pages are those of the last
    /// snapshot that could read them.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let b = pool.allocate(64)?;
    /// assert_eq!(pool.stats().bytes_in_use, 64);
    /// # drop(b);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        if let Some(stats) = self.inner.packed(|p| p.stats()) {
            return stats;
        }
        let mut s = self.inner.slot(|cache, lending| {
            let mut s = cache.stats();
            lending.add_mag_stats(&mut s);
            s
        });
        // The page figures, without waiting for a miss inside the backing
        // allocator (the cache lock released first).
        s.set_pages(self.inner.pages());
        s
    }

    /// Runs the policy now ([`DecayingPool::collect`]); returns the number
    /// of blocks freed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use core::time::Duration;
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, ManualClock, SharedPool};
    /// let clock = ManualClock::new();
    /// let pool = SharedPool::new(
    ///     DecayingPool::builder(CheckingAllocator::new())
    ///         .policy(FixedTime::new(Duration::from_secs(1)))
    ///         .clock(clock.clone())
    ///         .build(),
    /// );
    /// drop(pool.allocate(64)?);
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(pool.collect(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn collect(&self) -> usize {
        self.inner.collect()
    }

    /// Frees every cached block ([`DecayingPool::trim`]); returns the bytes
    /// freed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// drop(pool.allocate(64)?);
    /// assert_eq!(pool.trim(), 64);
    /// assert_eq!(pool.stats().bytes_reserved, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn trim(&self) -> usize {
        self.inner.trim()
    }

    /// Changes the byte limit ([`DecayingPool::set_limit`]); the blocks
    /// freed are deallocated outside the cache lock. Returns the bytes
    /// freed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// drop(pool.allocate(4096)?);
    /// assert_eq!(pool.set_limit(Some(1024)), 4096);
    /// assert_eq!(pool.limit(), Some(1024));
    /// assert!(pool.allocate(4096).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_limit(&self, limit: Option<usize>) -> usize {
        self.inner.set_limit(limit)
    }

    /// The byte limit, if any ([`DecayingPool::limit`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.limit(), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn limit(&self) -> Option<usize> {
        if let Some(limit) = self.inner.packed(|p| p.limit()) {
            return limit;
        }
        self.inner.cache(|cache| cache.limit())
    }

    /// Sets every peak to its current value ([`DecayingPool::reset_peaks`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// drop(pool.allocate(4096)?);
    /// pool.reset_peaks();
    /// assert_eq!(pool.stats().peak_bytes_in_use, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reset_peaks(&self) {
        if self.inner.packed(|p| p.reset_peaks()).is_some() {
            return;
        }
        self.inner.cache(|cache| cache.reset_peaks());
    }

    /// The statistics by size class ([`DecayingPool::class_stats`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::builder(CheckingAllocator::new()).class_stats(true).build());
    /// drop(pool.allocate(64)?);
    /// assert_eq!(pool.class_stats().unwrap()[0].blocks_cached, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn class_stats(&self) -> Option<Vec<ClassStats>> {
        if let Some(stats) = self.inner.packed(|p| p.class_stats()) {
            return stats;
        }
        self.inner.cache(|cache| cache.class_stats())
    }

    /// Runs `f` on the whole pool, with both locks held, for anything this
    /// handle does not offer directly (the limit, the size classes, the
    /// backing allocator, a raw `allocate`/`release`).
    ///
    /// `f` gets a [`LockedPool`]: the pool's read-only getters (through
    /// `Deref` to `&DecayingPool`) and the operations that keep the pool in
    /// place, but no `&mut DecayingPool`. With one, safe code could swap
    /// another pool in (`mem::replace`), and every live [`Pooled`] would
    /// then go back to, and be freed by, the wrong allocator.
    ///
    /// Every other thread using the pool waits until `f` returns, so keep
    /// it short.
    ///
    /// # Panics
    ///
    /// When `f` panics: the panic is passed on, after the pool is put back
    /// together, so it stays usable.
    ///
    /// Using this pool inside `f` through a handle (or dropping a
    /// [`Pooled`] of it, or passing one through [`Pooled::into_raw`] or
    /// [`Pooled::from_raw`]) deadlocks, as its locks are held.
    ///
    /// On a pool from [`SharedPool::packed`] it panics: use
    /// [`with_packed`](Self::with_packed).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(
    ///     DecayingPool::builder(CheckingAllocator::new()).limit(1 << 20).build(),
    /// );
    /// assert_eq!(pool.with(|p| p.limit()), Some(1 << 20));
    /// assert_eq!(pool.with(|p| p.allocator().allocs()), 0);
    /// // A raw block, outside any `Pooled`:
    /// let raw = pool.with(|p| p.allocate(64))?;
    /// // SAFETY: `raw` came from this pool with 64 bytes and is not used again.
    /// pool.with(|p| unsafe { p.release(raw, 64) });
    /// assert_eq!(pool.stats().blocks_cached, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with<R>(&self, f: impl FnOnce(&mut LockedPool<'_, A, P, C>) -> R) -> R {
        assert!(
            self.inner.packed.is_none(),
            "SharedPool::with: a packed pool; use `with_packed`"
        );
        let mut cache_slot = self.inner.cache.lock();
        let mut alloc_slot = recover(self.inner.alloc.lock());
        let (Some(mut cache), Some(mut alloc)) = (cache_slot.cache.take(), alloc_slot.take())
        else {
            panic!("SharedPool::with: the pool is taken apart (re-entered from `with`?)");
        };
        if !cache_slot.lending.mags.is_empty() {
            // The blocks idle in thread caches go back to the cache first,
            // as released now.
            let mut frees: Frees<A::Block> = Vec::new();
            let flushed = catch_unwind(AssertUnwindSafe(|| {
                let now = cache.now();
                cache_slot
                    .lending
                    .flush_mags(&mut cache, now, &mut |b, c| frees.push((b, c)));
            }));
            for (block, class) in frees {
                // SAFETY: the cache let these go, each once; they came from
                // this allocator's `allocate(class)`.
                let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
                    alloc.deallocate(block, class)
                }));
            }
            if let Err(panic) = flushed {
                cache_slot.cache = Some(cache);
                *alloc_slot = Some(alloc);
                drop((cache_slot, alloc_slot));
                resume_unwind(panic);
            }
        }
        let mut pool = DecayingPool::from_parts(alloc, cache);
        let result = catch_unwind(AssertUnwindSafe(|| {
            f(&mut LockedPool {
                pool: &mut pool,
                requests: self.inner.requests.as_deref(),
            })
        }));
        let (alloc, cache) = pool.into_parts();
        cache_slot.cache = Some(cache);
        *alloc_slot = Some(alloc);
        drop((cache_slot, alloc_slot));
        match result {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }

    /// Whether `self` and `other` are handles to the same pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let a = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let b = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// assert!(a.ptr_eq(&a.clone()));
    /// assert!(!a.ptr_eq(&b));
    /// # Ok(())
    /// # }
    /// ```
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The pool a new [`Pooled`] refers to. A packed pool's is a strong
    /// reference of its own (not a handle: `SharedPool::drop` never runs on
    /// it; [`SharedPool::unview`] drops the reference). A plain pool's owns
    /// nothing: the block must be counted lent ([`Lending::lend`]), which
    /// keeps the pool alive until [`SharedPool::unview`] counts it back.
    pub(super) fn view(&self) -> ManuallyDrop<Self> {
        let inner = if self.inner.packed.is_some() {
            Arc::clone(&self.inner)
        } else {
            // SAFETY: the pointer comes from an `Arc` of this same type, and
            // the `Arc` made from it is never dropped (`ManuallyDrop`, and
            // `unview` only reads the pointee), so no reference count
            // changes. The view is reached only through its `Pooled`, while
            // the block is counted lent, which keeps a strong reference
            // (`Lending::held`): the pool outlives every use of it.
            unsafe { Arc::from_raw(Arc::as_ptr(&self.inner)) }
        };
        ManuallyDrop::new(SharedPool { inner })
    }

    /// Ends what [`SharedPool::view`] started, for a block that is no
    /// longer lent (released, or taken out by [`Pooled::into_raw`]): counts
    /// it back and lets go of the reference that kept the pool alive if it
    /// must go; for a packed pool, drops the view's own reference. The pool
    /// may be gone afterwards.
    ///
    /// # Safety
    ///
    /// `view` came from [`SharedPool::view`] for this block, is used by no
    /// one else, and is not used afterwards; a plain pool's block is still
    /// counted lent.
    pub(super) unsafe fn unview(view: ManuallyDrop<Self>) {
        if view.inner.packed.is_some() {
            // SAFETY: a packed view owns one strong reference (`view`),
            // read out once here and dropped; `view` is not used again.
            drop(unsafe { core::ptr::read(&view.inner) });
        } else {
            let (lock, handles) = (&view.inner.cache, &view.inner.handles);
            let held = with_lending(lock, |l| l.give_back(handles));
            // The view owns no reference: the pool may be gone once the
            // lock is released (another thread may have let go of the last
            // reference), or be dropped here. Nothing reaches it afterwards.
            drop(held);
        }
    }

    /// Starts a background thread that calls [`collect`](Self::collect)
    /// every `period`, so that blocks decay even when the program stops
    /// calling the pool.
    ///
    /// The thread holds only a weak reference to the pool: once every
    /// `SharedPool` handle and every [`Pooled`] block is dropped, it exits
    /// at its next wake-up (it may drop the pool itself, freeing the cached
    /// blocks on the reaper thread). Dropping the returned [`Reaper`] stops
    /// the thread and joins it promptly, without waiting out the period
    /// (only for a `collect` already running).
    ///
    /// A panic inside a `collect` (from the backing allocator or a user
    /// policy) is caught: it is reported by the panic hook as usual, the
    /// pool recovers as described in [`SharedPool`]'s documentation, and the
    /// reaper keeps running.
    ///
    /// # Panics
    ///
    /// When `period` is zero, or when the operating system cannot start a
    /// thread.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use core::time::Duration;
    /// use decaying_pool::{DecayingPool, FixedTime, SharedPool, testing::CheckingAllocator};
    ///
    /// let pool = SharedPool::new(DecayingPool::new(
    ///     CheckingAllocator::new(),
    ///     FixedTime::new(Duration::from_millis(10)),
    /// ));
    /// let reaper = pool.spawn_reaper(Duration::from_millis(5));
    /// drop(pool.allocate(4096)?);
    /// // No further calls: the reaper frees the idle block.
    /// let start = std::time::Instant::now();
    /// while pool.stats().blocks_cached > 0 && start.elapsed() < Duration::from_secs(5) {
    ///     std::thread::sleep(Duration::from_millis(5));
    /// }
    /// assert_eq!(pool.stats().blocks_cached, 0);
    /// drop(reaper); // stops and joins the thread
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Host pools qualify, stacked ones too: a [`DecayingPool`] is `Send`
    /// when its allocator, policy and clock are and its blocks are
    /// [`SendBlock`](crate::SendBlock).
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{DecayingPool, FixedTime, SharedPool, SystemAllocator};
    ///
    /// let host = DecayingPool::new(SystemAllocator::new(), FixedTime::new(Duration::from_secs(60)));
    /// let pool = SharedPool::new(DecayingPool::new(host, FixedTime::new(Duration::from_secs(1))));
    /// let _reaper = pool.spawn_reaper(Duration::from_millis(100));
    /// ```
    ///
    /// A policy (or clock, or allocator) that cannot cross threads is
    /// refused at compile time, and the error names only your type and
    /// public ones ("`Rc<()>` cannot be sent between threads safely …
    /// required for `SharedPool<SystemAllocator, NotSend>` to implement
    /// `Send`"):
    ///
    /// ```compile_fail,E0277
    /// use core::time::Duration;
    /// use std::rc::Rc;
    /// use decaying_pool::policy::{EvictionPolicy, Oldest};
    /// use decaying_pool::{DecayingPool, SharedPool, SystemAllocator};
    ///
    /// struct NotSend(Rc<()>);
    /// impl EvictionPolicy for NotSend {
    ///     fn must_evict(&mut self, _: Duration, _: Oldest, _: usize) -> bool { false }
    /// }
    /// let pool = SharedPool::new(DecayingPool::new(SystemAllocator::new(), NotSend(Rc::new(()))));
    /// let _reaper = pool.spawn_reaper(Duration::from_secs(1));
    /// ```
    pub fn spawn_reaper(&self, period: Duration) -> Reaper
    where
        Self: Send + Sync + 'static,
    {
        assert!(
            !period.is_zero(),
            "SharedPool::spawn_reaper: the period must not be zero"
        );
        reaper::spawn(Arc::downgrade(&self.inner), period)
    }
}

impl<A: RawAllocator, C: Clock + Clone + Sync> SharedPool<A, FixedTime, C> {
    /// Wraps `pool` for sharing between threads, with a small cache per
    /// thread in front of the shared one, so that threads that each
    /// release and reuse their own blocks do not take turns at the cache
    /// lock.
    ///
    /// Each thread that allocates from the pool gets a *magazine*: up to
    /// 64 idle blocks it released at first, up to 512 once it grew (below),
    /// in a small table keyed by class (a class's blocks reused front
    /// first, so that those it needs no more decay; four slots per block
    /// it may hold, of a class, a block and its release time: 8 to 10 KiB
    /// for a block of 16 bytes, 64 to 80 KiB at 512 blocks). An
    /// `allocate` whose class is in the thread's magazine, and the release
    /// of a block to a magazine with room, take no shared lock; otherwise
    /// the call goes to the shared cache as with [`SharedPool::new`]. A
    /// block is released to the magazine of the thread that drops it (if
    /// that thread has one for this pool).
    ///
    /// A thread that exits leaves its magazine to the pool, and the next
    /// thread to take up the pool (at its first call that finds no
    /// magazine of its own) adopts it, blocks and all, with their release
    /// times: threads that come and go (one for each task) reuse the
    /// blocks of those before them rather than miss at every class while
    /// those blocks wait out their time in magazines no thread reaches.
    /// When several wait, the one with the most blocks is adopted (a look
    /// at each magazine in the pool's list, once for each thread); the
    /// others wait for the next thread, and their blocks decay on time
    /// meanwhile.
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let alloc = CheckingAllocator::new();
    /// let pool = SharedPool::with_thread_caches(DecayingPool::new(alloc.clone(), FixedTime::default()));
    /// for _ in 0..3 {
    ///     let pool = pool.clone();
    ///     // A thread for each task: each after the first adopts the
    ///     // magazine of the one before, and hits the block it left there.
    ///     std::thread::spawn(move || drop(pool.allocate(64).unwrap())).join().unwrap();
    /// }
    /// let s = pool.stats();
    /// assert_eq!((s.hits, s.misses, alloc.allocs()), (2, 1, 1));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Decay stays exact: a [`FixedTime`] block expires at its release
    /// time plus the time to live whoever holds it, so each operation
    /// that uses its magazine checks the magazine's oldest block against
    /// the time it reads (one clock read; one that goes on to the shared
    /// cache reads it again there, under the lock, so the shared cache
    /// sees its times in order), as does an allocation that the shared
    /// cache cannot serve before it asks the backing allocator, and
    /// [`collect`](Self::collect) (so the
    /// [reaper](Self::spawn_reaper)) frees the due blocks of every
    /// magazine, an idle or exited thread's too, counted as evictions. The
    /// blocks in magazines count as cached (and against the limit):
    /// [`trim`](Self::trim) and the pool's drop free them,
    /// [`set_limit`](Self::set_limit) (with a limit), the out-of-memory
    /// retry and [`with`](Self::with) first put them back into the shared
    /// cache (as released at the time of the call), where the limit, the
    /// retry ladder and the closure see them. A thread's table of
    /// magazines holds each pool weakly: it never keeps a pool alive.
    ///
    /// On Linux, a thread reaches its own magazine with plain loads and
    /// stores, no lock and no atomic read-modify-write: the calls that
    /// reach every magazine (`collect`, the reaper, `trim`, the limit, the
    /// retry, `with`, `stats`, the last handle's drop) pay instead, with
    /// one `membarrier` system call each (`MEMBARRIER_CMD_PRIVATE_EXPEDITED`,
    /// which interrupts the processors running this process's threads; the
    /// process registers for it once), then wait for any thread inside an
    /// operation on its magazine to finish it. A thread that finds its
    /// magazine held by such a call goes to the shared cache meanwhile.
    /// Where the system call is not available (another system, a kernel
    /// before 4.14 or a filter that refuses it, Miri, or a build with
    /// `--cfg decaying_pool_locked_magazines`, which ThreadSanitizer needs),
    /// each magazine has a lock that its thread takes on its operations.
    ///
    /// A thread that uses more classes than its magazine holds misses
    /// there at many calls, and a magazine that serves most calls but not
    /// nearly all costs more than none (the processor mispredicts where
    /// each call goes). So each miss counts 8 against the magazine, each
    /// hit and each release taken 1 for it: when the count comes to 128
    /// misses' worth (128 misses in a row, or a longer run in which the
    /// magazine serves fewer than 8 calls in 9), the magazine doubles if a
    /// quarter of those misses or more were allocations that found it
    /// full, up to 512 blocks (once it grew, an allocation that finds it
    /// with room counts as a hit: it fills the room it grew for). A thread
    /// that only releases blocks that other threads allocated never finds
    /// its magazine full at an allocation, so its magazine keeps 64 blocks
    /// at most and the rest go back to the shared cache, where the other
    /// threads find them. Otherwise, or at 512 blocks, its thread's next
    /// 16 384 calls pass it by (they go to the shared cache after one test
    /// of one word), then it tries the magazine again. Such a thread then
    /// pays little more than through [`SharedPool::new`]. The blocks its
    /// magazine still holds are not stranded meanwhile: an allocation that
    /// the shared cache cannot serve takes its thread's block of the
    /// class, if the magazine has one, before a backing call (and its
    /// release goes to the shared cache).
    ///
    /// [`stats`](Self::stats) adds the magazines up, so
    /// the counts stay exact, except `peak_bytes_in_use`, which counts
    /// blocks idle in magazines as in use: it is an upper bound of the true
    /// peak (and at least the bytes in use at any time).
    ///
    /// The thread caches stay off (the pool works as from
    /// [`SharedPool::new`]) when the pool has an observer or statistics by
    /// class, or reuses the oldest block first ([`Reuse::Fifo`]). Only for
    /// [`FixedTime`]: under other policies whether a block must go depends
    /// on the other blocks, which a thread cache does not see.
    ///
    /// The clock must be `Sync` and `Clone`, its clones telling the same
    /// time (as [`MonotonicClock`] and [`ManualClock`](crate::ManualClock)
    /// do): every thread reads a clone of it without the cache lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::with_thread_caches(DecayingPool::new(
    ///     CheckingAllocator::new(),
    ///     FixedTime::default(),
    /// ));
    /// drop(pool.allocate(64)?); // to this thread's magazine
    /// drop(pool.allocate(64)?); // a hit served there
    /// let s = pool.stats();
    /// assert_eq!((s.hits, s.misses, s.blocks_cached), (1, 1, 1));
    /// // Another thread's request misses: the block is in this thread's cache.
    /// let other = pool.clone();
    /// std::thread::spawn(move || drop(other.allocate(64).unwrap())).join().unwrap();
    /// assert_eq!(pool.stats().misses, 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_thread_caches(pool: DecayingPool<A, FixedTime, C>) -> Self {
        Self::with_magazines(pool, MAGAZINE)
    }

    /// [`with_thread_caches`](Self::with_thread_caches) with magazines of
    /// up to `blocks` blocks at first (1 to 64; they grow to eight times
    /// as many), for the fuzz harness.
    pub(crate) fn with_magazines(mut pool: DecayingPool<A, FixedTime, C>, blocks: usize) -> Self {
        let requests = pool.take_request_hook();
        let (alloc, cache) = pool.into_parts();
        let tc = (!cache.has_extras() && cache.reuse() == Reuse::Lifo).then(|| ThreadCaches {
            clock: cache.clock().clone(),
            ttl: u64::try_from(cache.store().policy().ttl().as_nanos()).unwrap_or(u64::MAX),
            size_class: cache.size_class(),
            magazine: blocks,
        });
        let inner = Arc::new(Inner::new(Some(cache), Some(alloc), None, tc, requests));
        // Held from the start: a magazine lends without the cache lock.
        // Let go, as always, once no handle and no lent block is left.
        inner.lending(|l| l.held = Some(Arc::clone(&inner)));
        SharedPool { inner }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Clone for SharedPool<A, P, C> {
    /// Another handle to the same pool.
    fn clone(&self) -> Self {
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        SharedPool {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Drop for SharedPool<A, P, C> {
    /// Drops the handle; the last one also lets go of the reference the
    /// lent blocks share when none is lent (see `Slot`).
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            let held = self.inner.lending(|l| l.let_go_if_idle());
            // Not the last reference: `self.inner` is one.
            drop(held);
        }
    }
}

impl<A, P, C> fmt::Debug for SharedPool<A, P, C>
where
    A: RawAllocator,
    P: Policy,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `try_lock`, so that formatting inside `with` does not deadlock.
        let mut d = f.debug_struct("SharedPool");
        if let Some(layer) = &self.inner.packed {
            let stats = match layer.try_lock() {
                Ok(p) => Some((p.stats(), p.packing_stats())),
                Err(std::sync::TryLockError::Poisoned(e)) => {
                    let p = e.into_inner();
                    Some((p.stats(), p.packing_stats()))
                }
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            match stats {
                Some((stats, packing)) => d.field("stats", &stats).field("packing_stats", &packing),
                None => d.field("stats", &"<locked>"),
            };
            return d.finish_non_exhaustive();
        }
        let stats = match self.inner.cache.try_lock() {
            Some(mut slot) => {
                let Slot { cache, lending } = &mut *slot;
                cache.as_ref().map(|cache| {
                    let mut s = cache.stats();
                    lending.add_mag_stats(&mut s);
                    s
                })
            }
            None => None,
        };
        match stats {
            Some(stats) => d.field("stats", &stats),
            None => d.field("stats", &"<locked>"),
        };
        d.finish_non_exhaustive()
    }
}
