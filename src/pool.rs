//! The pool: a cache of idle blocks in front of a costly allocator.

use core::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use crate::cache::{Cache, FirstPanic, Retry};
use crate::class::SizeClass;
use crate::clock::{Clock, MonotonicClock};
use crate::error::PoolError;
use crate::observe::{Event, Extras, Observer, Reason, Request, RequestHook};
use crate::policy::{FixedTime, Policy, Reuse};
use crate::raw::{RawAllocator, SendBlock};
use crate::stats::{ClassStats, Stats};

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
/// # Panics inside the pool
///
/// The backing allocator, the clock and a user
/// [`EvictionPolicy`](crate::EvictionPolicy) may panic; the pool passes
/// the panic on, stays usable, loses no block and keeps its counters and
/// its limit true:
///
/// - a block being released is cached, or given back when the clock
///   panicked ([`release`](Self::release));
/// - a miss whose backing `allocate` (or the out-of-memory retry's frees)
///   panics drops its booking against the limit;
/// - blocks taken out of the cache are counted as freed when handed to
///   `deallocate`, whether or not it returns;
/// - on drop, every cached block is offered to `deallocate` even when one
///   call panics, and no panic aborts the process (see `Drop`).
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
    cache: Cache<A::Block, P, C>,
    /// Debug builds: the size each block in use was allocated with, by
    /// [`RawAllocator::block_key`], to check releases.
    #[cfg(debug_assertions)]
    handed: std::collections::HashMap<usize, usize>,
    /// The hook told of every request ([`DecayingPool::log_requests`]).
    requests: Option<RequestHook<A::Block>>,
}

// SAFETY: a pool owns its allocator, policy and clock (each `Send`) and the
// blocks it caches; `SendBlock` says a block may move to another thread and
// be given back to the allocator from there. The pool keeps no thread-local
// state and no reference shared with another owner (the `Cell` used while
// dropping lives on the stack of `drop`), so moving the whole pool moves
// everything it reaches. It is not `Sync`: every method that touches the
// cache takes `&mut self`, or reads plain counters.
unsafe impl<A, P, C> Send for DecayingPool<A, P, C>
where
    A: RawAllocator + Send,
    A::Block: SendBlock,
    P: Policy + Send,
    C: Clock + Send,
{
}

/// Configures a [`DecayingPool`]; from [`DecayingPool::builder`].
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, Exponential, ManualClock, Reuse, SizeClass};
///
/// let clock = ManualClock::new();
/// let pool = DecayingPool::builder(CheckingAllocator::new())
///     .policy(Exponential::new(Duration::from_secs(1)))
///     .clock(clock.clone())
///     .size_class(SizeClass::PowerOfTwo)
///     .reuse(Reuse::Lifo)
///     .limit(8 << 30)
///     .build();
/// assert_eq!(pool.class_size(3000), Some(4096));
/// assert_eq!(pool.limit(), Some(8 << 30));
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder<A, P = FixedTime, C = MonotonicClock> {
    alloc: A,
    policy: P,
    clock: C,
    size_class: SizeClass,
    reuse: Reuse,
    limit: Option<usize>,
    gc_threshold: Option<f64>,
    observer: Option<Observer>,
    by_class: bool,
}

impl<A, P, C> Builder<A, P, C> {
    /// The eviction policy (default: [`FixedTime`] of one second).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedCapacity};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).policy(FixedCapacity::new(16)).build();
    /// # drop(pool);
    /// # Ok(())
    /// # }
    /// ```
    pub fn policy<Q: Policy>(self, policy: Q) -> Builder<A, Q, C> {
        Builder {
            alloc: self.alloc,
            policy,
            clock: self.clock,
            size_class: self.size_class,
            reuse: self.reuse,
            limit: self.limit,
            gc_threshold: self.gc_threshold,
            observer: self.observer,
            by_class: self.by_class,
        }
    }

    /// The clock the policy reads (default: [`MonotonicClock`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, ManualClock};
    /// let clock = ManualClock::new();
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).clock(clock.clone()).build();
    /// # drop(pool);
    /// # Ok(())
    /// # }
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> Builder<A, P, D> {
        Builder {
            alloc: self.alloc,
            policy: self.policy,
            clock,
            size_class: self.size_class,
            reuse: self.reuse,
            limit: self.limit,
            gc_threshold: self.gc_threshold,
            observer: self.observer,
            by_class: self.by_class,
        }
    }

    /// How requests are rounded (default: [`SizeClass::Exact`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, SizeClass};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).size_class(SizeClass::Multiple(512)).build();
    /// assert_eq!(pool.class_size(1), Some(512));
    /// # Ok(())
    /// # }
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
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Reuse};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).reuse(Reuse::Fifo).build();
    /// assert_eq!(pool.reuse(), Reuse::Fifo);
    /// # Ok(())
    /// # }
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
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, PoolError};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::new()).limit(1000).build();
    /// assert!(matches!(pool.allocate(1001), Err(PoolError::LimitExceeded { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn limit(mut self, bytes: usize) -> Self {
        self.limit = Some(bytes);
        self
    }

    /// PyTorch's `garbage_collection_threshold`: once a miss would bring
    /// the bytes reserved (in use and cached, with the miss's class) past
    /// `fraction` of the [`limit`](Self::limit) (or, without a limit, of
    /// the backing allocator's [`capacity`](RawAllocator::capacity), as the
    /// last miss read it), the miss first gives cached blocks back oldest
    /// first until the bytes reserved with its class are at most that
    /// fraction, or the cache is empty. Then it goes on as before: it
    /// still succeeds under the limit, even above the threshold, and the
    /// limit still refuses what cannot fit. Default: none.
    ///
    /// Only misses pay for it (a hit or a release never looks at it), and
    /// each block it frees was allocated by an earlier miss, so it is O(1)
    /// amortised. A pool with neither a limit nor a backing capacity has
    /// nothing to take a fraction of: the threshold then does nothing. The
    /// blocks freed are told to an [`observer`](Self::observer) with
    /// [`Reason::GcThreshold`] and counted in
    /// [`Stats::evictions`](crate::Stats::evictions). A
    /// [`SharedPool`](crate::SharedPool) made from the pool and a
    /// [`PackedPool`](crate::PackedPool) built over it keep the threshold
    /// (a shared pool's thread caches are not reached: their blocks count
    /// in use until they come back to the shared cache). The threshold of
    /// a built pool: [`DecayingPool::gc_threshold`],
    /// [`DecayingPool::set_gc_threshold`]. `decaying-pool replay
    /// --gc-threshold` replays its effect on a trace first.
    ///
    /// # Panics
    ///
    /// When `fraction` is not in `(0, 1]` (zero, negative, above one or
    /// NaN): a programming error, as PyTorch refuses such a setting.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// use core::time::Duration;
    ///
    /// let mut pool = DecayingPool::builder(CheckingAllocator::new())
    ///     .policy(FixedTime::new(Duration::MAX)) // keeps every idle block
    ///     .limit(1000)
    ///     .gc_threshold(0.5) // stay under 500 bytes when a miss can
    ///     .build();
    /// let a = pool.allocate(200)?;
    /// let b = pool.allocate(200)?;
    /// unsafe { pool.release(a, 200) }; // a, then b, cached: 400 reserved
    /// unsafe { pool.release(b, 200) };
    /// let c = pool.allocate(300)?; // 400 + 300 > 500: the oldest, a, goes back
    /// let s = pool.stats();
    /// assert_eq!((s.evictions, s.bytes_cached, s.bytes_reserved), (1, 200, 500));
    /// let d = pool.allocate(400)?; // b goes back; 700 > 500, under the limit: served
    /// let s = pool.stats();
    /// assert_eq!((s.evictions, s.bytes_cached, s.bytes_reserved), (2, 0, 700));
    /// assert_eq!(pool.gc_threshold(), Some(0.5));
    /// # unsafe { pool.release(c, 300); pool.release(d, 400) };
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn gc_threshold(mut self, fraction: f64) -> Self {
        self.gc_threshold = Some(check_gc_threshold(fraction));
        self
    }

    /// A callback told of every block the pool gives back to the backing
    /// allocator, with its size and [`Reason`], and of every failed backing
    /// allocation ([`Event`]): moka's eviction listener, RMM's failure
    /// callback. Default: none, and a pool without one pays nothing for it
    /// on the hit path (the release path tests one pointer).
    ///
    /// The callback runs inside the pool's call (for a
    /// [`SharedPool`](crate::SharedPool), under its cache lock): keep it
    /// short, and do not call the pool from it. A `Freed` event comes after
    /// the backing `deallocate` returned (a `SharedPool` deallocates once
    /// its cache lock is released: there the event comes just before). A panic in the callback is passed
    /// on like a panic of the backing allocator (the pool loses no block
    /// and its counters stay true); if it panics while the pool drops, the
    /// frees left are made without telling it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use std::sync::{Arc, Mutex};
    /// use decaying_pool::testing::CheckingAllocator;
    /// use decaying_pool::{DecayingPool, Event, Reason};
    ///
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// let mut pool = DecayingPool::builder(CheckingAllocator::new())
    ///     .observer(move |e: Event| log.lock().unwrap().push(e))
    ///     .build();
    /// let b = pool.allocate(4096)?;
    /// unsafe { pool.release(b, 4096) };
    /// pool.trim();
    /// assert_eq!(*seen.lock().unwrap(), [Event::Freed { size: 4096, reason: Reason::Trimmed }]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn observer(mut self, observer: impl FnMut(Event) + Send + 'static) -> Self {
        self.observer = Some(Observer::new(observer));
        self
    }

    /// Whether to keep statistics by size class
    /// ([`DecayingPool::class_stats`]; default: no). They cost a table
    /// lookup on every release (hits are derived from releases, frees and
    /// what is cached), so they are opt-in.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).class_stats(true).build();
    /// assert_eq!(pool.class_stats(), Some(vec![]));
    /// # Ok(())
    /// # }
    /// ```
    pub fn class_stats(mut self, keep: bool) -> Self {
        self.by_class = keep;
        self
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Builder<A, P, C> {
    /// Builds the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).build();
    /// assert_eq!(pool.stats().bytes_reserved, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn build(self) -> DecayingPool<A, P, C> {
        let mut cache = Cache::new(
            self.policy,
            self.clock,
            self.size_class,
            self.reuse,
            self.limit,
            Extras::new(self.observer, self.by_class),
        );
        cache.set_gc_threshold(self.gc_threshold);
        DecayingPool {
            #[cfg(debug_assertions)]
            handed: std::collections::HashMap::new(),
            requests: None,
            alloc: self.alloc,
            cache,
        }
    }
}

/// `fraction`, when it is a garbage-collection threshold: in `(0, 1]`.
///
/// # Panics
///
/// When it is not (NaN included).
#[track_caller]
fn check_gc_threshold(fraction: f64) -> f64 {
    assert!(
        fraction > 0.0 && fraction <= 1.0,
        "gc_threshold: {fraction} is not a fraction in (0, 1]"
    );
    fraction
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
            gc_threshold: None,
            observer: None,
            by_class: false,
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
    /// let pool = DecayingPool::new(SystemAllocator::new(), Exponential::new(Duration::from_secs(1)));
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
    /// the out-of-memory retry.
    ///
    /// # The retry ladder
    ///
    /// On a miss, a request the backing allocator can never serve (its
    /// class above [`RawAllocator::capacity`]) fails at once, before
    /// anything is freed. Otherwise, when the backing allocator fails, the
    /// pool frees cached blocks oldest first until at least the class size
    /// is freed and retries, then frees every cached block and retries
    /// once more; unless the class is more than the allocator reports free
    /// ([`RawAllocator::available`], read after each failure) plus every
    /// cached byte: freeing cannot help then, and the error is returned at
    /// once, the cache kept. So one impossible request costs no cache.
    ///
    /// # Errors
    ///
    /// - [`PoolError::ZeroSize`] for `size == 0`;
    /// - [`PoolError::TooLarge`] when rounding `size` to its class, or
    ///   counting it in `bytes_reserved`, would overflow `usize`, or when
    ///   the class is above the backing allocator's capacity (for the host
    ///   allocators, the machine's memory; always for sizes above
    ///   `isize::MAX`): no backing call is made, nothing is freed;
    /// - [`PoolError::LimitExceeded`] when the blocks in use plus this one
    ///   would exceed the limit (no backing call is made, the cache is left
    ///   alone);
    /// - [`PoolError::Backing`] when the backing allocator still fails after
    ///   the retries, or failed once with too little free for the retries
    ///   to help.
    ///
    /// A failed call hands out nothing and counts neither a hit nor a
    /// miss; each failed backing call counts in `backing_failures` (a
    /// refusal before any call counts nothing).
    ///
    /// A hit hands out a block as its previous user left it: its bytes are
    /// whatever was written there last, not zeroes (an `mmap` block is
    /// zero-filled only on the miss that maps it). [`LocalPool`](crate::LocalPool)
    /// offers safe `MaybeUninit` views of host blocks.
    ///
    /// # Panics
    ///
    /// When the clock, the policy or the backing allocator panics; the
    /// panic is passed on. Nothing is handed out, a miss's booking against
    /// the limit is dropped, and blocks freed on the way count as freed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(256).unwrap();
    /// unsafe { pool.release(b, 256) };
    /// # Ok(())
    /// # }
    /// ```
    // Always inlined: the hit path is short and a call would cost a good
    // share of it; the miss path is a separate function.
    #[inline(always)]
    pub fn allocate(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        if self.requests.is_some() {
            return self.allocate_logged(size);
        }
        self.allocate_tracked(size)
    }

    /// [`allocate`](Self::allocate) less the request hook.
    #[inline(always)]
    fn allocate_tracked(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        let result = self.allocate_unchecked(size);
        #[cfg(debug_assertions)]
        if let Ok(block) = &result {
            if let Some(key) = self.alloc.block_key(block) {
                self.handed.insert(key, size);
            }
        }
        result
    }

    /// [`allocate`](Self::allocate) with a request hook: out of line, so a
    /// pool without one pays a test of one pointer.
    #[cold]
    #[inline(never)]
    fn allocate_logged(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        let block = self.allocate_tracked(size)?;
        Ok(self.allocated_logged(block, size))
    }

    /// Tells the request hook of `block`, just handed out: out of line, so
    /// a pool without a hook pays a test of one pointer. A hook that panics
    /// loses no block: it goes back (unlogged) before the panic goes on.
    #[cold]
    #[inline(never)]
    fn allocated_logged(&mut self, block: A::Block, size: usize) -> A::Block {
        let Some(hook) = self.requests.as_mut() else {
            return block;
        };
        let told = Request::Allocated {
            block: &block,
            size,
        };
        if let Some(panic) = hook.call_caught(told) {
            // SAFETY: `block` came from this pool's allocate(size) just now
            // and never reached the caller.
            unsafe { self.release_unlogged(block, size) };
            std::panic::resume_unwind(panic);
        }
        block
    }

    /// Tells `hook` of every request from now on: each successful
    /// [`allocate`](Self::allocate) and each [`release`](Self::release)
    /// (before the block goes back), as a [`Request`]. Replaces the hook
    /// set before. `trace::RequestLog::sink` (feature **`trace`**)
    /// writes them to a trace the replay reads; a [`SharedPool`](crate::SharedPool)
    /// or [`PackedPool`](crate::PackedPool) made from this pool takes the
    /// hook over and tells it of its own callers' requests.
    ///
    /// The hook runs on the calling thread, inside the call: keep it short
    /// (a pool without one tests one pointer per call).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, Request, SystemAllocator};
    /// let mut pool = DecayingPool::new(SystemAllocator::new(), FixedTime::default());
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// pool.log_requests(move |r: Request<'_, _>| tx.send(r.size()).unwrap());
    /// let b = pool.allocate(4096)?;
    /// // SAFETY: `b` came from this pool with this size and is not used again.
    /// unsafe { pool.release(b, 4096) };
    /// assert_eq!(rx.try_iter().collect::<Vec<_>>(), [4096, 4096]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn log_requests(&mut self, hook: impl FnMut(Request<'_, A::Block>) + Send + 'static) {
        self.requests = Some(RequestHook::new(hook));
    }

    /// The request hook, taken out (for a layer that logs its own callers'
    /// requests instead).
    pub(crate) fn take_request_hook(&mut self) -> Option<RequestHook<A::Block>> {
        self.requests.take()
    }

    /// `allocate` without the debug bookkeeping.
    #[inline(always)]
    fn allocate_unchecked(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        let now = self.cache.now();
        if !self.cache.may_evict(now) {
            if !self.cache.hits_inline() {
                return self.allocate_outlined(size, now);
            }
            // A size of zero finds no class (`Store::take`) and goes on to
            // `allocate_slow`, which reports it.
            if self.cache.exact() {
                if let Some(block) = self.cache.take_inline(size, size, now) {
                    return Ok(block);
                }
            } else if let Some(class) = self.cache.round_remembered(size) {
                if let Some(block) = self.cache.take_inline(size, class, now) {
                    return Ok(block);
                }
            }
        }
        self.allocate_slow(size, now)
    }

    /// `allocate`'s hit path at `now` for a pool whose store takes its
    /// hits out of line (`Cache::hits_inline`), when no collection is due.
    /// Out of line: its hooks need registers (and calls) that the inlined
    /// hit path, which calls nothing, would otherwise save and restore at
    /// every hit. (Classes that round are rounded on the inlined path, in
    /// a few instructions when their steps are powers of two: `Steps`.)
    #[inline(never)]
    fn allocate_outlined(
        &mut self,
        size: usize,
        now: u64,
    ) -> Result<A::Block, PoolError<A::Error>> {
        if let Some(class) = self.cache.round_inline(size) {
            if let Some(block) = self.cache.take(size, class, now) {
                return Ok(block);
            }
        }
        self.allocate_slow(size, now)
    }

    /// `allocate` past its hit at `now`: a collection that is due, a bad
    /// size, a class with nothing cached, a hit whose policy hook goes out
    /// of line ([`try_on_hit`](crate::EvictionPolicy::try_on_hit)). Out of line, so that the hit
    /// path calls nothing and keeps its values in the registers a call
    /// would clobber.
    #[inline(never)]
    fn allocate_slow(&mut self, size: usize, now: u64) -> Result<A::Block, PoolError<A::Error>> {
        let Self { alloc, cache, .. } = self;
        // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
        cache.run_policy(now, &mut unsafe { backing_free(alloc) });
        let class = cache.class_of(size)?;
        if let Some(block) = cache.take(size, class, now) {
            return Ok(block);
        }
        self.miss(size, class, now)
    }

    /// The misses so far (see [`Cache::miss_count`]).
    #[inline]
    pub(crate) fn miss_count(&self) -> u64 {
        self.cache.miss_count()
    }

    /// A cached block of `class` (a class size of this pool), if the cache
    /// holds one once the policy has run: a hit for `class` bytes, to be
    /// released with `class` as its size. Never calls the backing
    /// allocator: for the packing layer, which serves a large request with
    /// a somewhat larger cached block before it would miss.
    pub(crate) fn take_cached(&mut self, class: usize) -> Option<A::Block> {
        let Self { alloc, cache, .. } = self;
        let now = cache.now();
        // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
        cache.run_policy(now, &mut unsafe { backing_free(alloc) });
        if cache.class_of::<A::Error>(class).ok()? != class {
            return None;
        }
        let block = cache.take(class, class, now)?;
        #[cfg(debug_assertions)]
        if let Some(key) = self.alloc.block_key(&block) {
            self.handed.insert(key, class);
        }
        Some(block)
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
    /// In debug builds, when the block was allocated with another size and
    /// the backing allocator identifies its blocks
    /// ([`RawAllocator::block_key`]: the host allocators and the test
    /// doubles do), with a message naming both sizes; the block is released
    /// with the size it was allocated with first, so nothing is lost.
    ///
    /// When the clock, the policy or the backing `deallocate` (freeing a
    /// block the policy evicts first) panics. The released block is not
    /// lost: if the clock panicked, the pool knows no time to cache it at
    /// and gives it back through the backing `deallocate` (counted in
    /// `trimmed`); otherwise it is cached at the time read. The counters
    /// and the limit stay true, and the panic is passed on afterwards (a
    /// second panic while doing so is discarded).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(100).unwrap();
    /// // SAFETY: `b` came from `pool.allocate(100)` and is not used again.
    /// unsafe { pool.release(b, 100) };
    /// assert_eq!(pool.stats().blocks_cached, 1);
    /// # Ok(())
    /// # }
    /// ```
    #[inline(always)]
    pub unsafe fn release(&mut self, block: A::Block, size: usize) {
        if self.requests.is_some() {
            // SAFETY: the caller's contract.
            return unsafe { self.release_logged(block, size) };
        }
        // SAFETY: the caller's contract.
        unsafe { self.release_unlogged(block, size) }
    }

    /// [`release`](Self::release) with a request hook: out of line, so a
    /// pool without one pays a test of one pointer.
    ///
    /// # Safety
    ///
    /// As [`release`](Self::release).
    #[cold]
    #[inline(never)]
    unsafe fn release_logged(&mut self, block: A::Block, size: usize) {
        // A hook that panics loses no block: it goes back first.
        let hook_panic = self.requests.as_mut().and_then(|hook| {
            let told = Request::Released {
                block: &block,
                size,
            };
            hook.call_caught(told)
        });
        // SAFETY: the caller's contract.
        unsafe { self.release_unlogged(block, size) };
        if let Some(panic) = hook_panic {
            std::panic::resume_unwind(panic);
        }
    }

    /// [`release`](Self::release) less the request hook.
    ///
    /// # Safety
    ///
    /// As [`release`](Self::release).
    #[inline(always)]
    unsafe fn release_unlogged(&mut self, block: A::Block, size: usize) {
        #[cfg(debug_assertions)]
        let (size, mismatch) = match self
            .alloc
            .block_key(&block)
            .and_then(|k| self.handed.remove(&k))
        {
            // Released with the size it was allocated with, so its class and
            // the counters stay true; the caller hears of it below.
            Some(handed) if handed != size => (handed, Some(size)),
            _ => (size, None),
        };
        let Self { alloc, cache, .. } = self;
        // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
        cache.release_now(block, size, unsafe { backing_free(alloc) });
        #[cfg(debug_assertions)]
        if let Some(wrong) = mismatch {
            panic!(
                "DecayingPool::release: a block allocated with size {size} was released \
                 with size {wrong}; a release must name the size the block was allocated \
                 with (the pool released it with {size})"
            );
        }
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
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
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
    /// # Ok(())
    /// # }
    /// ```
    pub fn collect(&mut self) -> usize {
        let Self { alloc, cache, .. } = self;
        let now = cache.now();
        // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
        let freed = cache.collect(now, &mut unsafe { backing_free(alloc) });
        // An allocator that keeps the memory of blocks given back
        // (`RawAllocator::spare`) decays it too.
        alloc.collect_spare();
        freed
    }

    /// Frees every cached block, whatever the policy says. Returns the bytes
    /// freed. Blocks in use are not affected.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let (a, b) = (pool.allocate(100).unwrap(), pool.allocate(200).unwrap());
    /// unsafe { pool.release(a, 100); pool.release(b, 200) };
    /// assert_eq!(pool.trim(), 300);
    /// assert_eq!(pool.stats().trimmed, 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn trim(&mut self) -> usize {
        let Self { alloc, cache, .. } = self;
        let now = cache.now();
        // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
        let cached = cache.trim_all(now, Reason::Trimmed, &mut unsafe { backing_free(alloc) });
        cached + alloc.release_spare()
    }

    /// A snapshot of the pool's counters.
    ///
    /// Over an allocator of mapped pages ([`pages::Mapped`](crate::pages::Mapped),
    /// [`RawAllocator::pages`]) the page figures come with them
    /// (`pages_created`, `pages_released`, `page_maps`, `page_unmaps`,
    /// `bytes_spare`); over any other allocator they are zero.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.stats(), decaying_pool::Stats::default());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Over mapped pages:
    ///
    /// ```
    /// use decaying_pool::pages::{Mapped, ModelPages};
    /// use decaying_pool::{DecayingPool, FixedCapacity};
    ///
    /// let mut pool = DecayingPool::builder(Mapped::new(ModelPages::new(2 << 20)?))
    ///     .policy(FixedCapacity::new(0)) // the free pages are the only cache
    ///     .build();
    /// let b = pool.allocate(3 << 20)?;
    /// // SAFETY: `b` came from `allocate(3 << 20)` and is not used again.
    /// unsafe { pool.release(b, 3 << 20) };
    /// let s = pool.stats();
    /// assert_eq!(s.pages_created, 2);
    /// assert_eq!(s.bytes_spare, pool.allocator().stats().spare_bytes);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let mut s = self.cache.stats();
        s.set_pages(self.alloc.pages());
        s
    }

    /// Changes the byte limit (`None`: no limit); returns the bytes freed.
    ///
    /// Lowering it frees cached blocks, oldest first, until the bytes
    /// reserved fit under the new limit (each told to the observer as
    /// [`Reason::Limit`]). When the blocks in use alone exceed it, the
    /// cache is emptied and every miss fails with
    /// [`PoolError::LimitExceeded`] until enough of them are released; the
    /// blocks released meanwhile are cached (hits still work), and the
    /// next miss that needs the room frees them.
    ///
    /// Over an allocator with spare memory ([`RawAllocator::spare`]: pages
    /// of [`pages::Mapped`](crate::pages::Mapped) that no block touches)
    /// the limit covers it too: setting the limit, and a miss, give the
    /// spare memory back ([`RawAllocator::release_spare`]) when it would
    /// keep the bytes held past the limit. Tell `Mapped` the same capacity
    /// ([`Mapped::with_capacity`](crate::pages::Mapped::with_capacity)) to
    /// have it move spare pages under a new block instead, which makes no
    /// page.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, PoolError};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let (a, b) = (pool.allocate(100)?, pool.allocate(200)?);
    /// unsafe { pool.release(a, 100) }; // cached, the oldest
    /// assert_eq!(pool.set_limit(Some(250)), 100);
    /// assert_eq!(pool.stats().bytes_reserved, 200);
    /// assert!(matches!(pool.allocate(100), Err(PoolError::LimitExceeded { .. })));
    /// unsafe { pool.release(b, 200) };
    /// let c = pool.allocate(100)?; // fits now: frees the cached 200 first
    /// assert_eq!(pool.stats().bytes_reserved, 100);
    /// # unsafe { pool.release(c, 100) };
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_limit(&mut self, limit: Option<usize>) -> usize {
        let Self { alloc, cache, .. } = self;
        let now = cache.now();
        // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
        let freed = cache.set_limit(limit, now, &mut unsafe { backing_free(alloc) });
        // The allocator's spare memory counts against the limit too.
        let spare = match (limit, alloc.spare()) {
            (Some(limit), Some(spare)) if cache.held_bytes().saturating_add(spare) > limit => {
                alloc.release_spare()
            }
            _ => 0,
        };
        freed.saturating_add(spare)
    }

    /// Sets every peak ([`Stats::peak_bytes_reserved`],
    /// [`Stats::peak_bytes_in_use`]) to its current value, to measure the
    /// peak of a phase (as `torch.cuda.reset_peak_memory_stats`).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(1000)?;
    /// unsafe { pool.release(b, 1000) };
    /// pool.reset_peaks();
    /// let s = pool.stats();
    /// assert_eq!((s.peak_bytes_reserved, s.peak_bytes_in_use), (1000, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn reset_peaks(&mut self) {
        self.cache.reset_peaks();
    }

    /// The statistics by size class, in the order the classes were first
    /// seen; `None` unless the pool was built with
    /// [`Builder::class_stats`]. What to look at to pick a size-class rule
    /// or a limit.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, SizeClass};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::new())
    ///     .size_class(SizeClass::PowerOfTwo)
    ///     .class_stats(true)
    ///     .build();
    /// let a = pool.allocate(3000)?;
    /// let b = pool.allocate(100)?;
    /// unsafe { pool.release(a, 3000) };
    /// let classes = pool.class_stats().unwrap();
    /// let sizes: Vec<_> = classes.iter().map(|c| c.size).collect();
    /// assert_eq!(sizes, [4096, 128]);
    /// assert_eq!((classes[0].blocks_cached, classes[1].blocks_in_use), (1, 1));
    /// # unsafe { pool.release(b, 100) };
    /// # Ok(())
    /// # }
    /// ```
    pub fn class_stats(&self) -> Option<Vec<ClassStats>> {
        self.cache.class_stats()
    }

    /// The class size a request of `size` bytes is served with, or `None`
    /// when the request is invalid (zero, or rounding would overflow).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, SizeClass};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).size_class(SizeClass::PowerOfTwo).build();
    /// assert_eq!(pool.class_size(1025), Some(2048));
    /// assert_eq!(pool.class_size(0), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn class_size(&self, size: usize) -> Option<usize> {
        self.cache.size_class().round(size)
    }

    /// The backing allocator.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(8).unwrap();
    /// assert_eq!(pool.allocator().allocs(), 1);
    /// unsafe { pool.release(b, 8) };
    /// # Ok(())
    /// # }
    /// ```
    pub fn allocator(&self) -> &A {
        &self.alloc
    }

    /// The size-class rule.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SizeClass};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.size_class(), SizeClass::Exact);
    /// # Ok(())
    /// # }
    /// ```
    pub fn size_class(&self) -> SizeClass {
        self.cache.size_class()
    }

    /// The reuse order.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, Reuse};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.reuse(), Reuse::Lifo);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reuse(&self) -> Reuse {
        self.cache.reuse()
    }

    /// The byte limit, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.limit(), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn limit(&self) -> Option<usize> {
        self.cache.limit()
    }

    /// The garbage-collection threshold, a fraction of the limit (or of
    /// the backing capacity), if any ([`Builder::gc_threshold`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool};
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).gc_threshold(0.8).build();
    /// assert_eq!(pool.gc_threshold(), Some(0.8));
    /// # Ok(())
    /// # }
    /// ```
    pub fn gc_threshold(&self) -> Option<f64> {
        self.cache.gc_threshold()
    }

    /// Changes the garbage-collection threshold (`None`: none); it acts
    /// from the next miss on, and frees nothing now (as PyTorch's, it is
    /// checked when memory is asked for). See [`Builder::gc_threshold`].
    ///
    /// # Panics
    ///
    /// When the fraction is not in `(0, 1]` (NaN included).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::new()).limit(1000).build();
    /// let a = pool.allocate(600)?;
    /// unsafe { pool.release(a, 600) };
    /// pool.set_gc_threshold(Some(0.5));
    /// assert_eq!(pool.stats().bytes_cached, 600); // nothing freed yet
    /// let b = pool.allocate(100)?; // 700 > 500: the cached 600 go back
    /// assert_eq!((pool.stats().evictions, pool.stats().bytes_reserved), (1, 100));
    /// pool.set_gc_threshold(None);
    /// assert_eq!(pool.gc_threshold(), None);
    /// # unsafe { pool.release(b, 100) };
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn set_gc_threshold(&mut self, fraction: Option<f64>) {
        if let Some(f) = fraction {
            check_gc_threshold(f);
        }
        self.cache.set_gc_threshold(fraction);
    }

    /// The clock.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, Clock, DecayingPool, ManualClock};
    /// let clock = ManualClock::new();
    /// let pool = DecayingPool::builder(CheckingAllocator::new()).clock(clock.clone()).build();
    /// assert_eq!(pool.clock().now(), clock.now());
    /// # Ok(())
    /// # }
    /// ```
    pub fn clock(&self) -> &C {
        self.cache.clock()
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
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// let b = pool.allocate(8).unwrap();
    /// pool.validate();
    /// unsafe { pool.release(b, 8) };
    /// pool.validate();
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(any(test, feature = "testing"))]
    pub fn validate(&self) {
        self.cache.validate();
    }

    /// Bytes of heap memory the pool's bookkeeping holds: the cache
    /// store's table, queues and eviction heap (not the cached blocks,
    /// which belong to the backing allocator). Approximate; for tests and
    /// the `metadata` example.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime};
    /// let pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    /// assert_eq!(pool.bookkeeping_bytes(), 0);
    /// ```
    #[cfg(any(test, feature = "testing"))]
    pub fn bookkeeping_bytes(&self) -> usize {
        self.cache.footprint()
    }

    /// Serves a request the cache could not: the limit, the backing call
    /// and the out-of-memory retry ladder.
    #[inline(never)]
    fn miss(
        &mut self,
        size: usize,
        class: usize,
        now: u64,
    ) -> Result<A::Block, PoolError<A::Error>> {
        /// Drops the miss's booking against the limit if the backing
        /// allocator, or the retry's frees, panic.
        struct Booking<'a, B, P: Policy, C: Clock> {
            cache: &'a mut Cache<B, P, C>,
            class: usize,
        }
        impl<B, P: Policy, C: Clock> Drop for Booking<'_, B, P, C> {
            fn drop(&mut self) {
                self.cache.abandon(self.class);
            }
        }
        impl<'a, B, P: Policy, C: Clock> Booking<'a, B, P, C> {
            /// The booking's outcome is counted: the guard is spent.
            fn settle(self) -> &'a mut Cache<B, P, C> {
                let this = core::mem::ManuallyDrop::new(self);
                // SAFETY: `this` is never dropped nor used again, so the
                // reference is moved out exactly once.
                unsafe { core::ptr::read(&this.cache) }
            }
        }

        let Self { alloc, cache, .. } = self;
        cache.set_capacity(alloc.capacity());
        // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
        cache.make_room(size, class, now, &mut unsafe { backing_free(alloc) })?;
        let booking = Booking { cache, class };
        // Memory that moves between blocks (pages): idle blocks' memory,
        // oldest first, before new memory.
        while alloc.spare().is_some_and(|spare| spare < class) {
            // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
            let free = &mut unsafe { backing_free(alloc) };
            if !booking.cache.trim_oldest(now, Reason::Remapped, free) {
                break;
            }
        }
        // The limit covers that memory too: where the spare memory, kept
        // beside what the miss takes, would pass it, it goes back first
        // (an allocator that moves its spare memory rather than make more,
        // such as `Mapped` told the same capacity, makes this rare).
        if let (Some(limit), Some(spare)) = (booking.cache.limit(), alloc.spare()) {
            if spare > 0 && booking.cache.held_bytes().saturating_add(spare) > limit {
                alloc.release_spare();
            }
        }
        let mut attempt = 0;
        loop {
            let err = match alloc.allocate(class) {
                Ok(block) => {
                    booking.settle().miss_done(size, class);
                    return Ok(block);
                }
                // Deferred (a packed `SharedPool` fetches the block outside
                // its lock, then asks again): up at once, the booking
                // dropped with its guard, nothing counted.
                Err(e) if A::is_deferral(&e) => return Err(PoolError::Backing(e)),
                Err(e) => e,
            };
            attempt += 1;
            let available = alloc.available();
            // SAFETY: only the cache calls it, as its free callback (`backing_free`'s contract).
            let free = &mut unsafe { backing_free(alloc) };
            let retry = booking
                .cache
                .after_failure(attempt, class, available, now, free);
            if retry == Retry::GiveUp {
                // `after_failure` dropped the booking.
                booking.settle();
                return Err(PoolError::Backing(err));
            }
        }
    }

    /// Splits the pool into its allocator and its cache, without freeing
    /// anything.
    pub(crate) fn into_parts(self) -> (A, Cache<A::Block, P, C>) {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so each field is
        // moved out exactly once.
        unsafe {
            #[cfg(debug_assertions)]
            drop(core::ptr::read(&this.handed));
            drop(core::ptr::read(&this.requests));
            (core::ptr::read(&this.alloc), core::ptr::read(&this.cache))
        }
    }

    /// Puts a pool back together from its parts.
    pub(crate) fn from_parts(alloc: A, cache: Cache<A::Block, P, C>) -> Self {
        DecayingPool {
            alloc,
            cache,
            #[cfg(debug_assertions)]
            handed: std::collections::HashMap::new(),
            requests: None,
        }
    }
}

/// The free callback every cache operation of a pool gets: it gives the
/// blocks the cache lets go back to the backing allocator, through
/// `alloc.deallocate(block, class)`.
///
/// # Safety
///
/// The closure must be called only by the [`Cache`] of the pool that owns
/// `alloc` (passed as the `free` argument of one of its operations), with
/// the block and class the cache gives it. Those meet `deallocate`'s
/// contract: the cache holds only blocks that `alloc.allocate(class)`
/// returned (a miss allocates at the class of the size, and `release`'s
/// contract brings a block back with that same size, hence class), and it
/// gives each block to its callback once, as the block leaves its
/// bookkeeping, never to hand it out again.
#[inline(always)]
unsafe fn backing_free<A: RawAllocator>(alloc: &mut A) -> impl FnMut(A::Block, usize) + '_ {
    move |block, class| {
        // SAFETY: `block` came from `alloc.allocate(class)` and is not used
        // again, as the caller's contract (the cache's) guarantees.
        unsafe { alloc.deallocate(block, class) }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Drop for DecayingPool<A, P, C> {
    /// Gives every cached block back through the backing `deallocate`.
    ///
    /// Every block is offered even when a `deallocate`, the clock or the
    /// policy panics (after such a panic the policy is no longer told of
    /// the frees). The first panic is then passed on, unless the thread is
    /// already unwinding: then every panic is discarded rather than abort
    /// the process.
    fn drop(&mut self) {
        let Self { alloc, cache, .. } = self;
        let first = FirstPanic::default();
        // SAFETY: only the cache's free callback below calls it, with what the
        // cache gives that callback (`backing_free`'s contract).
        let mut free = unsafe { backing_free(alloc) };
        cache.free_all(&first, &mut |block, class| {
            let r = catch_unwind(AssertUnwindSafe(|| free(block, class)));
            if let Err(panic) = r {
                first.keep(panic);
            }
        });
        if let Some(panic) = first.into_inner() {
            if !std::thread::panicking() {
                resume_unwind(panic);
            }
        }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> RawAllocator for DecayingPool<A, P, C> {
    type Block = A::Block;
    type Error = PoolError<A::Error>;

    #[inline]
    fn block_key(&self, block: &Self::Block) -> Option<usize> {
        self.alloc.block_key(block)
    }

    /// The backing allocator's capacity, or the pool's limit when that is
    /// lower (the pool never holds more).
    fn capacity(&self) -> Option<usize> {
        match (self.alloc.capacity(), self.cache.limit()) {
            (Some(c), Some(l)) => Some(c.min(l)),
            (c, l) => c.or(l),
        }
    }

    /// What the backing allocator has free plus every byte the pool has
    /// cached (it frees them for a request that needs them), and no more
    /// than the limit leaves over the blocks in use; `None` when neither
    /// is known.
    fn available(&self) -> Option<usize> {
        self.cache.reach(self.alloc.available())
    }

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
            .field("clock", self.cache.clock())
            .field("size_class", &self.cache.size_class())
            .field("reuse", &self.cache.reuse())
            .field("limit", &self.cache.limit())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
