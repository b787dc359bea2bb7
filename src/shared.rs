//! A thread-safe handle around a [`DecayingPool`], self-releasing blocks,
//! and a background reaper.
//!
//! - [`SharedPool`]: a cheap, cloneable handle (an [`Arc`] around a
//!   [`Mutex`] around the pool) that every thread can allocate from;
//! - [`Pooled`]: a block handed out by a `SharedPool`; it derefs to the
//!   block, knows its size, and gives itself back to the pool when dropped;
//! - [`Reaper`]: a background thread from [`SharedPool::spawn_reaper`] that
//!   calls [`collect`](SharedPool::collect) on a period, so an idle program
//!   still gives memory back.
//!
//! [`SharedPool`]'s documentation describes what runs under its lock and
//! how it recovers from a panic inside the pool.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ops::Deref;
use core::time::Duration;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::{self, JoinHandle};

use crate::clock::{Clock, MonotonicClock};
use crate::error::PoolError;
use crate::policy::{FixedTime, Policy};
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;
use crate::stats::Stats;

/// A thread-safe, cheaply cloneable handle to a [`DecayingPool`].
///
/// Clones share one pool behind one lock. `SharedPool` is `Send` and `Sync`
/// whenever the pool is `Send`, that is whenever the backing allocator, its
/// blocks, the policy (its cache store) and the clock are `Send`. The pool
/// is dropped — every cached block going back through the backing
/// allocator — when the last handle and the last [`Pooled`] block are
/// dropped.
///
/// The host allocators' blocks ([`SystemAllocator`](crate::SystemAllocator),
/// `MmapAllocator`) are `NonNull<u8>`, which is not `Send`, so a
/// `SharedPool` over them is not `Send` either: to share host memory between
/// threads, wrap the allocator in one whose block type is a `Send` newtype
/// around the pointer.
///
/// # What runs under the lock
///
/// One [`Mutex`] guards the whole [`DecayingPool`], and every operation
/// (`allocate`, the release in [`Pooled`]'s drop, `collect`, `trim`,
/// `stats`, `with`) holds it for the duration of the corresponding
/// `DecayingPool` call. A hit is a store lookup plus the policy check, so
/// its critical section is short. But the pool *owns* its backing
/// allocator, so the backing calls run under the lock too:
///
/// - a **miss** calls the backing allocator's `allocate` (and, under memory
///   pressure, its `deallocate` for the blocks the limit or the
///   out-of-memory retry frees) with the lock held;
/// - blocks the policy **evicts** on the way into any call are handed to the
///   backing `deallocate` with the lock held.
///
/// So while one thread's miss is inside `cudaMalloc`, other threads' hits
/// wait for it. Taking the backing calls out of the lock needs the backing
/// allocator behind a lock of its own, separate from the cache store and
/// counters; `DecayingPool` keeps them in one value, so this handle cannot
/// split them without restructuring the pool. Until then, a program whose
/// misses are slow and contended can keep the miss rate down (a longer
/// time-to-live, size classes) or give each thread its own
/// [`DecayingPool`].
///
/// # Panics inside the lock
///
/// A panic while the lock is held — inside the backing allocator, inside a
/// user [`EvictionPolicy`](crate::EvictionPolicy), or inside a closure
/// passed to [`SharedPool::with`] — poisons the [`Mutex`]. This handle
/// recovers deliberately ([`PoisonError::into_inner`]) rather than make the
/// pool unusable, because `DecayingPool` keeps its invariants across such a
/// panic:
///
/// - it removes a block from the cache and counts it as freed *before*
///   calling the backing `deallocate`, so a `deallocate` that panics leaves
///   the cache and the counters consistent, and the block counts as given
///   back (whether the allocator really freed it is up to the allocator);
///   blocks the policy had not yet reached stay cached and are freed later;
/// - a backing `allocate` that panics hands out nothing and counts nothing;
/// - a releasing [`Pooled`] caches its block even when the policy run that
///   precedes the release panics (the panic is passed on after the block is
///   cached), so a panic while evicting does not lose it;
/// - a panicking `EvictionPolicy::must_evict` runs before the cache is
///   changed, so nothing is lost.
///
/// One case is not covered: the cache store calls a policy's
/// `on_hit`/`on_free` callbacks *after* taking the block out of its
/// structures, so a panic in one of those callbacks drops that one block
/// (it is neither cached nor counted in use, and is never deallocated).
/// The built-in policies never panic there. Nor is the pool's own drop:
/// if a backing `deallocate` panics while the last handle drops the pool,
/// the blocks still cached after it are not freed.
///
/// A [`Pooled`] dropped while its thread is already unwinding releases its
/// block with any panic from the pool caught and discarded, so a second
/// panic does not abort the process.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedTime, SharedPool};
///
/// let pool = SharedPool::new(DecayingPool::new(
///     CheckingAllocator::new(),
///     FixedTime::new(Duration::from_secs(1)),
/// ));
/// let workers: Vec<_> = (0..4)
///     .map(|_| {
///         let pool = pool.clone();
///         std::thread::spawn(move || {
///             for _ in 0..100 {
///                 let block = pool.allocate(4096).unwrap();
///                 assert_eq!(block.size(), 4096);
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
    inner: Arc<Mutex<DecayingPool<A, P, C>>>,
}

impl<A: RawAllocator, P: Policy, C: Clock> SharedPool<A, P, C> {
    /// Wraps `pool` for sharing between threads.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.stats().bytes_reserved, 0);
    /// ```
    pub fn new(pool: DecayingPool<A, P, C>) -> Self {
        SharedPool {
            inner: Arc::new(Mutex::new(pool)),
        }
    }

    /// Locks the pool, recovering it from poisoning: see "Panics inside the
    /// lock" in the type's documentation for why the pool is consistent.
    #[inline]
    fn lock(&self) -> MutexGuard<'_, DecayingPool<A, P, C>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands out a block of at least `size` bytes, which goes back to the
    /// pool when the returned [`Pooled`] is dropped.
    ///
    /// This is [`DecayingPool::allocate`] under the lock: a miss calls the
    /// backing allocator with the lock held.
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
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, PoolError, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let block = pool.allocate(100)?;
    /// assert_eq!(block.size(), 100);
    /// assert_eq!(pool.stats().blocks_in_use, 1);
    /// drop(block);
    /// assert_eq!(pool.stats().blocks_cached, 1);
    /// assert!(matches!(pool.allocate(0), Err(PoolError::ZeroSize)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allocate(&self, size: usize) -> Result<Pooled<A, P, C>, PoolError<A::Error>> {
        let block = self.lock().allocate(size)?;
        Ok(Pooled {
            block: ManuallyDrop::new(block),
            size,
            pool: self.clone(),
        })
    }

    /// A snapshot of the pool's counters ([`DecayingPool::stats`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let b = pool.allocate(64)?;
    /// assert_eq!(pool.stats().bytes_in_use, 64);
    /// # drop(b);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// Runs the policy now ([`DecayingPool::collect`]); returns the number
    /// of blocks freed.
    ///
    /// # Examples
    ///
    /// ```
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
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn collect(&self) -> usize {
        self.lock().collect()
    }

    /// Frees every cached block ([`DecayingPool::trim`]); returns the bytes
    /// freed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// drop(pool.allocate(64)?);
    /// assert_eq!(pool.trim(), 64);
    /// assert_eq!(pool.stats().bytes_reserved, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trim(&self) -> usize {
        self.lock().trim()
    }

    /// Runs `f` on the pool with the lock held, for anything this handle
    /// does not offer directly (the limit, the size classes, the backing
    /// allocator, a raw `allocate`/`release`).
    ///
    /// Every other thread using the pool waits until `f` returns, so keep
    /// it short.
    ///
    /// # Panics
    ///
    /// When `f` panics (the panic is passed on). The lock is poisoned but
    /// the pool stays usable: later calls recover it. Any state `f` left
    /// half-done is the caller's business, as with any `&mut` access.
    ///
    /// Calling a method of this `SharedPool` (or dropping a [`Pooled`] from
    /// it) inside `f` deadlocks, as the lock is already held.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(
    ///     DecayingPool::builder(CheckingAllocator::new()).limit(1 << 20).build(),
    /// );
    /// assert_eq!(pool.with(|p| p.limit()), Some(1 << 20));
    /// assert_eq!(pool.with(|p| p.allocator().allocs()), 0);
    /// ```
    pub fn with<R>(&self, f: impl FnOnce(&mut DecayingPool<A, P, C>) -> R) -> R {
        f(&mut self.lock())
    }

    /// Whether `self` and `other` are handles to the same pool.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let a = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let b = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// assert!(a.ptr_eq(&a.clone()));
    /// assert!(!a.ptr_eq(&b));
    /// ```
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
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
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawn_reaper(&self, period: Duration) -> Reaper
    where
        DecayingPool<A, P, C>: Send + 'static,
    {
        assert!(
            !period.is_zero(),
            "SharedPool::spawn_reaper: the period must not be zero"
        );
        let weak = Arc::downgrade(&self.inner);
        let stop = Arc::new(Stop::default());
        let thread_stop = Arc::clone(&stop);
        let handle = thread::Builder::new()
            .name("decaying-pool-reaper".into())
            .spawn(move || reap(weak, period, &thread_stop))
            .expect("SharedPool::spawn_reaper: cannot start the reaper thread");
        Reaper {
            stop,
            handle: Some(handle),
        }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Clone for SharedPool<A, P, C> {
    /// Another handle to the same pool.
    fn clone(&self) -> Self {
        SharedPool {
            inner: Arc::clone(&self.inner),
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
        match self.inner.try_lock() {
            Ok(pool) => d.field("stats", &pool.stats()),
            Err(std::sync::TryLockError::Poisoned(e)) => d.field("stats", &e.into_inner().stats()),
            Err(std::sync::TryLockError::WouldBlock) => d.field("stats", &"<locked>"),
        };
        d.finish_non_exhaustive()
    }
}

/// The reaper thread's body.
fn reap<A, P, C>(weak: Weak<Mutex<DecayingPool<A, P, C>>>, period: Duration, stop: &Stop)
where
    A: RawAllocator,
    P: Policy,
    C: Clock,
{
    loop {
        if stop.wait(period) {
            return;
        }
        let Some(pool) = weak.upgrade() else {
            return;
        };
        // A panic inside `collect` (backing allocator, user policy) is
        // reported by the panic hook; the pool recovers from the poisoned
        // lock on its next use, so the reaper carries on.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            pool.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .collect()
        }));
        drop(pool);
    }
}

/// The stop flag a [`Reaper`] shares with its thread.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Waits up to `period`; returns whether a stop was requested.
    fn wait(&self, period: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        let (stopped, _) = self
            .wake
            .wait_timeout_while(stopped, period, |stopped| !*stopped)
            .unwrap_or_else(PoisonError::into_inner);
        *stopped
    }

    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_all();
    }
}

/// A background thread that calls [`SharedPool::collect`] on a period;
/// from [`SharedPool::spawn_reaper`].
///
/// Dropping it stops the thread and joins it, promptly: the thread is woken
/// rather than left to finish its period.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
///
/// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// let reaper = pool.spawn_reaper(Duration::from_secs(60));
/// let start = std::time::Instant::now();
/// drop(reaper);
/// assert!(start.elapsed() < Duration::from_secs(5));
/// ```
#[must_use = "dropping the Reaper stops the thread at once"]
pub struct Reaper {
    stop: Arc<Stop>,
    handle: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Whether the thread is still running: `false` once it has exited
    /// because every handle to its pool was dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    ///
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let reaper = pool.spawn_reaper(Duration::from_millis(1));
    /// assert!(reaper.is_running());
    /// drop(pool);
    /// let start = std::time::Instant::now();
    /// while reaper.is_running() && start.elapsed() < Duration::from_secs(5) {
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert!(!reaper.is_running());
    /// ```
    pub fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(handle) = self.handle.take() {
            // The thread catches panics from `collect`; a failure here would
            // only be from dropping the pool on the reaper thread. Do not
            // pass it on from a destructor.
            let _ = handle.join();
        }
    }
}

impl fmt::Debug for Reaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reaper")
            .field("running", &self.is_running())
            .finish()
    }
}

/// A block from a [`SharedPool`]: derefs to the block, knows the size it
/// was requested with, and gives itself back to the pool when dropped.
///
/// It keeps its pool alive. It is `Send` when the block and the pool are
/// (see [`SharedPool`]), and `Sync` when, in addition, the block is `Sync`.
///
/// # Examples
///
/// ```
/// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
/// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// let block = pool.allocate(256)?;
/// let id: u64 = *block; // CheckingAllocator blocks are numbers
/// assert_eq!(id, 1);
/// drop(block);
/// assert_eq!(*pool.allocate(256)?, 1); // a hit: the same block again
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Pooled<A: RawAllocator, P: Policy = FixedTime, C: Clock = MonotonicClock> {
    block: ManuallyDrop<A::Block>,
    size: usize,
    pool: SharedPool<A, P, C>,
}

impl<A: RawAllocator, P: Policy, C: Clock> Pooled<A, P, C> {
    /// The size the block was requested with (its class size may be
    /// larger: see [`DecayingPool::class_size`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, SharedPool, SizeClass};
    /// let pool = SharedPool::new(
    ///     DecayingPool::builder(CheckingAllocator::new()).size_class(SizeClass::PowerOfTwo).build(),
    /// );
    /// let block = pool.allocate(3000)?;
    /// assert_eq!(block.size(), 3000);
    /// assert_eq!(pool.stats().bytes_in_use, 4096);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn size(&self) -> usize {
        self.size
    }

    /// The pool the block belongs to.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let block = pool.allocate(8)?;
    /// assert!(block.pool().ptr_eq(&pool));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pool(&self) -> &SharedPool<A, P, C> {
        &self.pool
    }

    /// Takes the block out of its handle without releasing it, for
    /// handing it across an FFI boundary: returns the block and the size it
    /// was requested with. The pool still counts it in use.
    ///
    /// Give it back with [`Pooled::from_raw`] (then drop that), or with
    /// [`DecayingPool::release`] through [`SharedPool::with`]; a block never
    /// given back is never freed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, Pooled, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let (block, size) = pool.allocate(512)?.into_raw();
    /// assert_eq!(pool.stats().blocks_in_use, 1);
    /// // ... the block travels through foreign code and comes back ...
    /// // SAFETY: `block` came from `pool` with `size`, through `into_raw`, and
    /// // is given back once.
    /// let back = unsafe { Pooled::from_raw(&pool, block, size) };
    /// drop(back);
    /// assert_eq!(pool.stats().blocks_cached, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_raw(self) -> (A::Block, usize) {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped nor used again, so the block is
        // taken out exactly once and not released by `Pooled::drop`.
        let block = unsafe { ManuallyDrop::take(&mut this.block) };
        // SAFETY: as above, the pool handle is read out exactly once and
        // dropped here, so the reference count stays right.
        drop(unsafe { core::ptr::read(&this.pool) });
        (block, this.size)
    }

    /// Wraps a block that [`Pooled::into_raw`] took out, so that dropping
    /// the result releases it to `pool`.
    ///
    /// # Safety
    ///
    /// - `block` and `size` are exactly what [`Pooled::into_raw`] returned
    ///   for a `Pooled` of this same pool (`pool`, or a clone of it); a block
    ///   from [`DecayingPool::allocate`] on this pool, with the `size` passed
    ///   to it, is fine too;
    /// - the block has not been given back since (by another `from_raw`, or
    ///   by [`DecayingPool::release`]), and is not used after the returned
    ///   `Pooled` is dropped or given back;
    /// - no other live `Pooled` or other owner still uses the block.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, Pooled, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let (block, size) = pool.allocate(100)?.into_raw();
    /// // SAFETY: `block` and `size` came from `into_raw` on this pool, once.
    /// let again = unsafe { Pooled::from_raw(&pool, block, size) };
    /// assert_eq!((*again, again.size()), (block, 100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn from_raw(pool: &SharedPool<A, P, C>, block: A::Block, size: usize) -> Self {
        Pooled {
            block: ManuallyDrop::new(block),
            size,
            pool: pool.clone(),
        }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Deref for Pooled<A, P, C> {
    type Target = A::Block;

    #[inline]
    fn deref(&self) -> &A::Block {
        &self.block
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Drop for Pooled<A, P, C> {
    /// Releases the block to the pool.
    ///
    /// If the thread is already panicking, a panic from the pool during the
    /// release (a panicking backing `deallocate` or policy) is caught and
    /// discarded rather than abort the process.
    fn drop(&mut self) {
        // SAFETY: `drop` runs once and `self.block` is not used afterwards.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        let size = self.size;
        let release = || {
            // SAFETY: `block` came from this pool's `allocate(size)` (through
            // `SharedPool::allocate`, or `from_raw`, whose contract says so),
            // and this handle owned it alone, so it is released once.
            unsafe { self.pool.lock().release_unwind_safe(block, size) }
        };
        if thread::panicking() {
            let _ = catch_unwind(AssertUnwindSafe(release));
        } else {
            release();
        }
    }
}

impl<A, P, C> fmt::Debug for Pooled<A, P, C>
where
    A: RawAllocator,
    A::Block: fmt::Debug,
    P: Policy,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pooled")
            .field("block", &*self.block)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}
