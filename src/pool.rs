//! The pool: a cache of idle blocks in front of a costly allocator.

use core::fmt;
use core::time::Duration;

use crate::class::SizeClass;
use crate::clock::{Clock, MonotonicClock};
use crate::error::PoolError;
use crate::policy::{FixedTime, Policy, Reuse};
use crate::raw::RawAllocator;
use crate::stats::Stats;
use crate::store::Store;

/// A caching allocator in front of a costly [`RawAllocator`], whose idle
/// blocks decay back to it.
///
/// `allocate` rounds a request to its [`SizeClass`] and hands out a cached
/// block of that class (a hit) or calls the backing allocator (a miss).
/// `release` puts a block back into the cache. Before doing its own work,
/// every `allocate`, `release` and `collect` brings the eviction policy up
/// to the clock's current time and frees, oldest first, every block the
/// policy says must go. Blocks are never split or merged.
///
/// On drop, every cached block goes back through the backing allocator's
/// `deallocate`, exactly once. Blocks still handed out when the pool drops
/// are not freed (the pool no longer exists to take them back): release
/// every block before dropping the pool.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::{DecayingPool, FixedTime, SystemAllocator};
///
/// let mut pool = DecayingPool::new(SystemAllocator::new(), FixedTime::new(Duration::from_secs(2)));
/// let block = pool.allocate(1 << 20)?;            // a miss: the system allocator is called
/// // SAFETY: `block` came from this pool with this size and is not used again.
/// unsafe { pool.release(block, 1 << 20) };
/// let again = pool.allocate(1 << 20)?;            // a hit: served from the cache
/// assert_eq!(again, block);
/// assert_eq!((pool.stats().hits, pool.stats().misses), (1, 1));
/// unsafe { pool.release(again, 1 << 20) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DecayingPool<A: RawAllocator, P: Policy = FixedTime, C: Clock = MonotonicClock> {
    alloc: A,
    store: P::Store<A::Block>,
    clock: C,
    size_class: SizeClass,
    reuse: Reuse,
    limit: Option<usize>,
    stats: Counters,
}

/// The counters the pool keeps; cached counts come from the store.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    hits: u64,
    misses: u64,
    evictions: u64,
    trimmed: u64,
    backing_allocs: u64,
    backing_deallocs: u64,
    backing_failures: u64,
    blocks_in_use: u64,
    bytes_in_use: usize,
    peak_bytes_reserved: usize,
    peak_bytes_in_use: usize,
    bytes_from_pool: usize,
    bytes_from_backing: usize,
}

/// Configures a [`DecayingPool`]; from [`DecayingPool::builder`].
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, Exponential, ManualClock, Reuse, SizeClass};
///
/// let clock = ManualClock::new();
/// let pool = DecayingPool::builder(CheckingAllocator::new())
///     .policy(Exponential::half_life(Duration::from_secs(1)))
///     .clock(clock.clone())
///     .size_class(SizeClass::PowerOfTwo)
///     .reuse(Reuse::Lifo)
///     .limit(8 << 30)
///     .build();
/// assert_eq!(pool.class_size(3000), Some(4096));
/// assert_eq!(pool.limit(), Some(8 << 30));
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder<A, P = FixedTime, C = MonotonicClock> {
    alloc: A,
    policy: P,
    clock: C,
    size_class: SizeClass,
    reuse: Reuse,
    limit: Option<usize>,
}

impl<A, P, C> Builder<A, P, C> {
    /// The eviction policy (default: [`FixedTime`] of one second).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedCapacity};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).policy(FixedCapacity::new(16)).build();
    /// # drop(pool);
    /// ```
    pub fn policy<Q: Policy>(self, policy: Q) -> Builder<A, Q, C> {
        Builder {
            alloc: self.alloc,
            policy,
            clock: self.clock,
            size_class: self.size_class,
            reuse: self.reuse,
            limit: self.limit,
        }
    }

    /// The clock the policy reads (default: [`MonotonicClock`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, ManualClock};
    /// let clock = ManualClock::new();
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).clock(clock.clone()).build();
    /// # drop(pool);
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> Builder<A, P, D> {
        Builder {
            alloc: self.alloc,
            policy: self.policy,
            clock,
            size_class: self.size_class,
            reuse: self.reuse,
            limit: self.limit,
        }
    }

    /// How requests are rounded (default: [`SizeClass::Exact`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, SizeClass};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).size_class(SizeClass::Multiple(512)).build();
    /// assert_eq!(pool.class_size(1), Some(512));
    /// ```
    pub fn size_class(mut self, size_class: SizeClass) -> Self {
        self.size_class = size_class;
        self
    }

    /// Which cached block of a class a hit hands out (default: [`Reuse::Lifo`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Reuse};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).reuse(Reuse::Fifo).build();
    /// assert_eq!(pool.reuse(), Reuse::Fifo);
    /// ```
    pub fn reuse(mut self, reuse: Reuse) -> Self {
        self.reuse = reuse;
        self
    }

    /// The most bytes the pool may hold from the backing allocator, in use
    /// and cached together (default: no limit).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, PoolError};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::new()).limit(1000).build();
    /// assert!(matches!(pool.allocate(1001), Err(PoolError::LimitExceeded { .. })));
    /// ```
    pub fn limit(mut self, bytes: usize) -> Self {
        self.limit = Some(bytes);
        self
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Builder<A, P, C> {
    /// Builds the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).build();
    /// assert_eq!(pool.stats().bytes_reserved, 0);
    /// ```
    pub fn build(self) -> DecayingPool<A, P, C> {
        DecayingPool {
            alloc: self.alloc,
            store: self.policy.into_store(self.reuse),
            clock: self.clock,
            size_class: self.size_class,
            reuse: self.reuse,
            limit: self.limit,
            stats: Counters::default(),
        }
    }
}

impl<A: RawAllocator> DecayingPool<A, FixedTime, MonotonicClock> {
    /// A builder over `alloc`, with every option at its default.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{DecayingPool, FixedTime, SystemAllocator};
    /// let pool = DecayingPool::builder(SystemAllocator::new())
    ///     .policy(FixedTime::new(Duration::from_millis(500)))
    ///     .build();
    /// # drop(pool);
    /// ```
    pub fn builder(alloc: A) -> Builder<A> {
        Builder {
            alloc,
            policy: FixedTime::default(),
            clock: MonotonicClock,
            size_class: SizeClass::Exact,
            reuse: Reuse::Lifo,
            limit: None,
        }
    }
}

impl<A: RawAllocator, P: Policy> DecayingPool<A, P, MonotonicClock> {
    /// A pool over `alloc` with `policy` and every other option at its
    /// default (monotonic clock, exact sizes, LIFO reuse, no limit).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{DecayingPool, Exponential, SystemAllocator};
    /// let pool = DecayingPool::new(SystemAllocator::new(), Exponential::half_life(Duration::from_secs(1)));
    /// # drop(pool);
    /// ```
    pub fn new(alloc: A, policy: P) -> Self {
        DecayingPool::builder(alloc).policy(policy).build()
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> DecayingPool<A, P, C> {
    /// Hands out a block of at least `size` bytes (exactly its class size).
    ///
    /// First frees whatever the policy says must go at the current time,
    /// then serves the request from the cache if a block of its class is
    /// there, else from the backing allocator, subject to the byte limit and
    /// the out-of-memory retry: when the backing allocator fails, the pool
    /// frees cached blocks oldest first until at least the class size is
    /// freed and retries, then frees every cached block and retries once
    /// more.
    ///
    /// # Errors
    ///
    /// - [`PoolError::ZeroSize`] for `size == 0`;
    /// - [`PoolError::TooLarge`] when rounding `size` to its class, or
    ///   counting it in `bytes_reserved`, would overflow `usize`;
    /// - [`PoolError::LimitExceeded`] when the blocks in use plus this one
    ///   would exceed the limit (no backing call is made, the cache is left
    ///   alone);
    /// - [`PoolError::Backing`] when the backing allocator still fails after
    ///   the retries.
    ///
    /// A failed call hands out nothing and counts neither a hit nor a miss.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(256).unwrap();
    /// unsafe { pool.release(b, 256) };
    /// ```
    #[inline]
    pub fn allocate(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        let now = self.now();
        self.run_policy(now);
        let Some(class) = self.size_class.round(size) else {
            return Err(if size == 0 {
                PoolError::ZeroSize
            } else {
                PoolError::TooLarge { requested: size }
            });
        };
        if let Some(block) = self.store.take(class, now) {
            let s = &mut self.stats;
            s.hits += 1;
            s.bytes_from_pool = s.bytes_from_pool.saturating_add(class);
            s.blocks_in_use += 1;
            s.bytes_in_use += class;
            s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
            return Ok(block);
        }
        self.miss(size, class, now)
    }

    /// Puts `block` back into the cache.
    ///
    /// First frees whatever the policy says must go at the current time.
    /// Under [`FixedCapacity`](crate::FixedCapacity), a release into a full
    /// probe window evicts that window's oldest block.
    ///
    /// # Safety
    ///
    /// - `block` came from `self.allocate(size)` on this pool, with this
    ///   same `size`;
    /// - it has not been released since, and is not used after this call.
    ///
    /// # Panics
    ///
    /// When `size` could not have been allocated (zero, or too large for its
    /// class) or more is released than is in use: both break the safety
    /// contract, and the pool refuses rather than corrupt its cache.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(100).unwrap();
    /// // SAFETY: `b` came from `pool.allocate(100)` and is not used again.
    /// unsafe { pool.release(b, 100) };
    /// assert_eq!(pool.stats().blocks_cached, 1);
    /// ```
    #[inline]
    pub unsafe fn release(&mut self, block: A::Block, size: usize) {
        let now = self.now();
        self.run_policy(now);
        // SAFETY: the caller upholds this function's contract.
        unsafe { self.cache_released(block, size, now) }
    }

    /// Runs the policy now: frees every cached block it says must go.
    /// Returns the number of blocks freed.
    ///
    /// A pool decays only when it is called; a program that goes idle can
    /// call `collect` on a timer (or use a reaper thread) to give memory back.
    /// Under [`FixedCapacity`](crate::FixedCapacity) this is a no-op.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, ManualClock};
    /// let clock = ManualClock::new();
    /// let mut pool = DecayingPool::builder(CheckingAllocator::new())
    ///     .policy(FixedTime::new(Duration::from_secs(1)))
    ///     .clock(clock.clone())
    ///     .build();
    /// let b = pool.allocate(100).unwrap();
    /// unsafe { pool.release(b, 100) };
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(pool.collect(), 1);
    /// assert_eq!(pool.stats().backing_deallocs, 1);
    /// ```
    pub fn collect(&mut self) -> usize {
        let now = self.now();
        self.run_policy(now)
    }

    /// Frees every cached block, whatever the policy says. Returns the bytes
    /// freed. Blocks in use are not affected.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let (a, b) = (pool.allocate(100).unwrap(), pool.allocate(200).unwrap());
    /// unsafe { pool.release(a, 100); pool.release(b, 200) };
    /// assert_eq!(pool.trim(), 300);
    /// assert_eq!(pool.stats().trimmed, 2);
    /// ```
    pub fn trim(&mut self) -> usize {
        let now = self.now();
        let mut freed = 0usize;
        while let Some((block, class)) = self.store.pop_oldest(now) {
            freed += class;
            self.trim_one(block, class);
        }
        freed
    }

    /// A snapshot of the pool's counters.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.stats(), decaying_pool::Stats::default());
    /// ```
    pub fn stats(&self) -> Stats {
        let c = &self.stats;
        let bytes_cached = self.store.bytes();
        Stats {
            hits: c.hits,
            misses: c.misses,
            evictions: c.evictions,
            trimmed: c.trimmed,
            backing_allocs: c.backing_allocs,
            backing_deallocs: c.backing_deallocs,
            backing_failures: c.backing_failures,
            blocks_in_use: c.blocks_in_use,
            blocks_cached: self.store.len() as u64,
            bytes_in_use: c.bytes_in_use,
            bytes_cached,
            bytes_reserved: c.bytes_in_use + bytes_cached,
            peak_bytes_reserved: c.peak_bytes_reserved,
            peak_bytes_in_use: c.peak_bytes_in_use,
            bytes_from_pool: c.bytes_from_pool,
            bytes_from_backing: c.bytes_from_backing,
        }
    }

    /// The class size a request of `size` bytes is served with, or `None`
    /// when the request is invalid (zero, or rounding would overflow).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, SizeClass};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).size_class(SizeClass::PowerOfTwo).build();
    /// assert_eq!(pool.class_size(1025), Some(2048));
    /// assert_eq!(pool.class_size(0), None);
    /// ```
    pub fn class_size(&self, size: usize) -> Option<usize> {
        self.size_class.round(size)
    }

    /// The backing allocator.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(8).unwrap();
    /// assert_eq!(pool.allocator().allocs(), 1);
    /// unsafe { pool.release(b, 8) };
    /// ```
    pub fn allocator(&self) -> &A {
        &self.alloc
    }

    /// The size-class rule.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SizeClass};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.size_class(), SizeClass::Exact);
    /// ```
    pub fn size_class(&self) -> SizeClass {
        self.size_class
    }

    /// The reuse order.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, Reuse};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.reuse(), Reuse::Lifo);
    /// ```
    pub fn reuse(&self) -> Reuse {
        self.reuse
    }

    /// The byte limit, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.limit(), None);
    /// ```
    pub fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// The clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, Clock, DecayingPool, ManualClock};
    /// let clock = ManualClock::new();
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).clock(clock.clone()).build();
    /// assert_eq!(pool.clock().now(), clock.now());
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Checks that the cache store's structures and the counters agree.
    ///
    /// # Panics
    ///
    /// With a description of the first inconsistency found (which would be
    /// a bug in this crate).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(8).unwrap();
    /// pool.validate();
    /// unsafe { pool.release(b, 8) };
    /// pool.validate();
    /// ```
    #[cfg(any(test, feature = "testing"))]
    pub fn validate(&self) {
        self.store.check();
        let s = self.stats();
        assert_eq!(s.misses, s.backing_allocs, "misses == backing_allocs");
        assert_eq!(
            s.backing_allocs - s.backing_deallocs,
            s.blocks_in_use + s.blocks_cached,
            "every backing block is in use or cached"
        );
        assert!(s.peak_bytes_reserved >= s.bytes_reserved, "peak reserved");
        assert!(s.peak_bytes_in_use >= s.bytes_in_use, "peak in use");
        if let Some(limit) = self.limit {
            assert!(s.bytes_reserved <= limit, "reserved over the limit");
        }
        assert_eq!(
            s.blocks_in_use == 0,
            s.bytes_in_use == 0,
            "blocks and bytes in use"
        );
    }

    #[inline]
    fn now(&self) -> Duration {
        if <P::Store<A::Block> as Store<A::Block>>::TIMED {
            self.clock.now()
        } else {
            Duration::ZERO
        }
    }

    #[inline]
    fn run_policy(&mut self, now: Duration) -> usize {
        let mut freed = 0;
        while let Some((block, class)) = self.store.evict_due(now) {
            self.stats.evictions += 1;
            self.free_backing(block, class);
            freed += 1;
        }
        freed
    }

    #[inline]
    fn free_backing(&mut self, block: A::Block, class: usize) {
        self.stats.backing_deallocs += 1;
        // SAFETY: every block in the store came from `self.alloc.allocate(class)`
        // and left the store exactly once, here.
        unsafe { self.alloc.deallocate(block, class) };
    }

    fn trim_one(&mut self, block: A::Block, class: usize) {
        self.stats.trimmed += 1;
        self.free_backing(block, class);
    }

    fn reserved(&self) -> usize {
        self.stats.bytes_in_use + self.store.bytes()
    }

    /// Serves a request the cache could not: limit, backing call, retries.
    #[inline(never)]
    fn miss(
        &mut self,
        size: usize,
        class: usize,
        now: Duration,
    ) -> Result<A::Block, PoolError<A::Error>> {
        if self.reserved().checked_add(class).is_none() {
            return Err(PoolError::TooLarge { requested: size });
        }
        if let Some(limit) = self.limit {
            if self.stats.bytes_in_use + class > limit {
                return Err(PoolError::LimitExceeded {
                    requested: size,
                    limit,
                    reserved: self.reserved(),
                });
            }
            while self.reserved() + class > limit {
                let Some((block, c)) = self.store.pop_oldest(now) else {
                    break;
                };
                self.trim_one(block, c);
            }
        }
        let err = match self.try_backing(class) {
            Ok(block) => return Ok(block),
            Err(e) => e,
        };
        if self.store.is_empty() {
            return Err(PoolError::Backing(err));
        }
        // Retry 1: free the oldest blocks until the class size is freed.
        let mut freed = 0usize;
        while freed < class {
            let Some((block, c)) = self.store.pop_oldest(now) else {
                break;
            };
            freed += c;
            self.trim_one(block, c);
        }
        let err = match self.try_backing(class) {
            Ok(block) => return Ok(block),
            Err(e) => e,
        };
        if self.store.is_empty() {
            return Err(PoolError::Backing(err));
        }
        // Retry 2: free everything.
        while let Some((block, c)) = self.store.pop_oldest(now) {
            self.trim_one(block, c);
        }
        self.try_backing(class).map_err(PoolError::Backing)
    }

    /// One backing allocation, counted as a miss or a failure.
    fn try_backing(&mut self, class: usize) -> Result<A::Block, A::Error> {
        match self.alloc.allocate(class) {
            Ok(block) => Ok(self.record_miss(block, class)),
            Err(e) => {
                self.stats.backing_failures += 1;
                Err(e)
            }
        }
    }

    fn record_miss(&mut self, block: A::Block, class: usize) -> A::Block {
        let reserved = self.reserved() + class;
        let s = &mut self.stats;
        s.misses += 1;
        s.backing_allocs += 1;
        s.bytes_from_backing = s.bytes_from_backing.saturating_add(class);
        s.blocks_in_use += 1;
        s.bytes_in_use += class;
        s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
        s.peak_bytes_reserved = s.peak_bytes_reserved.max(reserved);
        block
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn release_mismatch(size: usize) -> ! {
    panic!("DecayingPool::release: a block of {size} bytes was never handed out by this pool")
}

impl<A: RawAllocator, P: Policy, C: Clock> Drop for DecayingPool<A, P, C> {
    fn drop(&mut self) {
        let now = self.now();
        while let Some((block, class)) = self.store.pop_oldest(now) {
            self.trim_one(block, class);
        }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> RawAllocator for DecayingPool<A, P, C> {
    type Block = A::Block;
    type Error = PoolError<A::Error>;

    #[inline]
    fn allocate(&mut self, size: usize) -> Result<Self::Block, Self::Error> {
        DecayingPool::allocate(self, size)
    }

    #[inline]
    unsafe fn deallocate(&mut self, block: Self::Block, size: usize) {
        // SAFETY: `deallocate`'s contract is `release`'s: the block came from
        // `self.allocate(size)` and is not used again.
        unsafe { self.release(block, size) }
    }
}

impl<A, P, C> fmt::Debug for DecayingPool<A, P, C>
where
    A: RawAllocator + fmt::Debug,
    P: Policy,
    C: Clock + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecayingPool")
            .field("alloc", &self.alloc)
            .field("clock", &self.clock)
            .field("size_class", &self.size_class)
            .field("reuse", &self.reuse)
            .field("limit", &self.limit)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Helpers for [`SharedPool`](crate::SharedPool): steps of the public
/// operations arranged so that a panic cannot lose a block.
impl<A: RawAllocator, P: Policy, C: Clock> DecayingPool<A, P, C> {
    /// [`release`](Self::release), except that when bringing the policy up
    /// to date panics (a panicking backing `deallocate` or user policy), the
    /// block is still counted out of use and cached before the panic goes
    /// on, instead of being dropped with the unwinding stack.
    ///
    /// Without a panic this is exactly `release`.
    ///
    /// # Safety
    ///
    /// As [`release`](Self::release).
    ///
    /// # Panics
    ///
    /// As [`release`](Self::release), and with the panic of a backing
    /// `deallocate` or policy call, after the block is cached.
    pub(crate) unsafe fn release_unwind_safe(&mut self, block: A::Block, size: usize) {
        let now = self.now();
        // The store and counters are consistent across a panic in the
        // policy run: every block leaves the store and is counted before
        // `deallocate` is called, and `must_evict` runs before any change.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_policy(now)));
        // SAFETY: the caller upholds `release`'s contract for `block`/`size`.
        unsafe { self.cache_released(block, size, now) };
        if let Err(payload) = ran {
            std::panic::resume_unwind(payload);
        }
    }

    /// The part of `release` after the policy run: counts the block out of
    /// use and caches it (freeing whatever the store displaces).
    ///
    /// # Safety
    ///
    /// As [`release`](Self::release).
    #[inline]
    unsafe fn cache_released(&mut self, block: A::Block, size: usize, now: Duration) {
        let class = self.size_class.round(size);
        let s = &mut self.stats;
        let class = match class {
            Some(class) if s.blocks_in_use > 0 && s.bytes_in_use >= class => class,
            _ => release_mismatch(size),
        };
        s.blocks_in_use -= 1;
        s.bytes_in_use -= class;
        if let Some((block, class)) = self.store.put(block, class, now) {
            self.stats.evictions += 1;
            self.free_backing(block, class);
        }
    }
}
