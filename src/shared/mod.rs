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

use core::any::Any;
use core::fmt;
use core::mem::{ManuallyDrop, MaybeUninit};
use core::ops::Deref;
use core::sync::atomic::{AtomicUsize, Ordering};
use core::time::Duration;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread::{self, JoinHandle};

mod barrier;
mod lock;
#[cfg(panic = "unwind")]
mod split;
mod thread_cache;

use crate::cache::{Cache, Retry};
use crate::class::SizeClass;
use crate::clock::{Clock, MonotonicClock};
use crate::error::PoolError;
use crate::local::HostMemory;
use crate::observe::{Reason, Request, RequestHook};
use crate::packing::{Packable, PackedPool, PackingStats};
use crate::pages::MappedStats;
use crate::policy::{FixedTime, Policy, Reuse};
use crate::pool::DecayingPool;
use crate::raw::{RawAllocator, SendBlock};
use crate::stats::{ClassStats, Stats};
use lock::{CacheLock, Guard as LockGuard};
use thread_cache::{Found, MAGAZINE, MagCounts, Magazine, Miss};

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
    inner: Arc<Inner<A, P, C>>,
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

/// The shared state: the two halves of the pool, each behind its lock.
/// `None` only while [`SharedPool::with`] has put them back together, and
/// always in a packed pool, whose whole [`PackedPool`] is in `packed`.
struct Inner<A: RawAllocator, P: Policy, C: Clock> {
    cache: CacheLock<Slot<A, P, C>>,
    alloc: Mutex<Option<A>>,
    /// A pool from [`SharedPool::packed`]: every call goes to it.
    packed: Option<Layer<A, P, C>>,
    /// Live [`SharedPool`] handles (not counting the [`Pooled`] blocks'
    /// own views of the pool, nor the reaper's passing references).
    handles: AtomicUsize,
    /// The thread caches' settings, for a pool from
    /// [`SharedPool::with_thread_caches`] that uses them.
    tc: Option<ThreadCaches<C>>,
    /// The request hook taken over from the pool (see
    /// [`DecayingPool::log_requests`]), told of the callers' requests.
    requests: Option<Box<Mutex<RequestHook<A::Block>>>>,
    /// The allocator's page figures as `stats` last read them: `stats`
    /// does not wait for a miss inside the backing allocator, and answers
    /// with these while one is.
    pages: Mutex<Option<MappedStats>>,
}

/// The settings the thread caches of a pool work with, read without the
/// cache lock.
struct ThreadCaches<C> {
    /// A clone of the pool's clock (it tells the same time), read by every
    /// thread at once: only set for a clock that is `Sync`.
    clock: C,
    /// The [`FixedTime`] time to live, in nanoseconds.
    ttl: u64,
    size_class: SizeClass,
    /// The most blocks a magazine holds at first: [`MAGAZINE`], fewer in
    /// the fuzz harness (which then reaches full magazines, grows them
    /// and passes them by). It grows to eight times as many.
    magazine: usize,
}

impl<C: Clock> ThreadCaches<C> {
    /// The class of `size`, `None` for a request the cache must refuse.
    #[inline(always)]
    fn round(&self, size: usize) -> Option<usize> {
        match self.size_class {
            SizeClass::Exact => (size != 0).then_some(size),
            sc => sc.round(size),
        }
    }
}

/// What the cache lock guards: the cache and the count of [`Pooled`]
/// blocks of a plain pool, which keep the pool alive all together through
/// one reference (`held`) rather than one each.
///
/// A `Pooled` of a plain pool touches no shared reference count: it is
/// counted in `lent` under the cache lock it takes anyway. `held` is a
/// strong reference taken when a block is lent while none is held; it is
/// let go (outside the lock) when no block is lent and no handle is left:
/// by the last `Pooled` when no handle is left, or by the last handle when
/// no block is lent. Both decide under this lock, the handle after
/// lowering `handles`, so exactly one of them lets it go. While handles
/// live it stays, so a steady allocate-and-drop loop never touches it.
struct Slot<A: RawAllocator, P: Policy, C: Clock> {
    /// `None` only while [`SharedPool::with`] has put the pool together,
    /// and always in a packed pool.
    cache: Option<Cache<A::Block, P, C>>,
    lending: Lending<A, P, C>,
}

/// The lent blocks of a plain pool and the reference they share.
struct Lending<A: RawAllocator, P: Policy, C: Clock> {
    /// Live `Pooled` blocks of a plain pool, less those the magazines count
    /// (`lent` plus the magazines' `lent` is the number of live blocks;
    /// each part alone may be negative).
    lent: isize,
    /// The reference the lent blocks keep the pool alive through.
    held: Option<Arc<Inner<A, P, C>>>,
    /// Every thread's magazine for this pool, visited under the cache lock
    /// (`thread_cache::visit`; where magazines are locked, the lock order
    /// is the cache lock, then a magazine's).
    mags: Vec<Arc<Magazine<A::Block>>>,
    /// The hit counters of magazines dropped from `mags`.
    retired: MagCounts,
}

/// A strong reference to a pool that a call let go of, to drop once no
/// lock and no borrow of the pool is left (it may be the last one).
type Held<A, P, C> = Option<Arc<Inner<A, P, C>>>;

impl<A: RawAllocator, P: Policy, C: Clock> Lending<A, P, C> {
    /// Counts a block lent out; `arc` is the pool this slot belongs to.
    #[inline(always)]
    fn lend(&mut self, arc: &Arc<Inner<A, P, C>>) {
        self.lent += 1;
        if self.held.is_none() {
            self.held = Some(Arc::clone(arc));
        }
    }

    /// Counts a lent block back; hands out `held` when it must go.
    #[inline(always)]
    fn give_back(&mut self, handles: &AtomicUsize) -> Held<A, P, C> {
        self.lent -= 1;
        if handles.load(Ordering::Acquire) == 0 {
            self.let_go_if_idle()
        } else {
            None
        }
    }

    /// Hands out `held` when no block is lent (the caller has seen no
    /// handle left).
    fn let_go_if_idle(&mut self) -> Held<A, P, C> {
        let mut in_mags = 0isize;
        thread_cache::visit(&mut self.mags, |m| in_mags += m.lent);
        if self.lent + in_mags == 0 {
            self.held.take()
        } else {
            None
        }
    }

    /// Frees the blocks of every magazine that `pick` (given a block's
    /// release time) chooses, counted for `reason`; then drops from the
    /// list the magazines of exited threads that are empty. Returns the
    /// class bytes freed. `pick` chooses every time before one it chooses:
    /// a magazine whose bound of the release times it does not choose is
    /// not scanned (`MagState::remove_where`).
    fn drain_mags(
        &mut self,
        cache: &mut Cache<A::Block, P, C>,
        mut pick: impl FnMut(u64) -> bool,
        reason: Reason,
        free: &mut (impl FnMut(A::Block, usize) + ?Sized),
    ) -> (usize, usize) {
        let (mut blocks, mut bytes) = (0, 0);
        thread_cache::visit(&mut self.mags, |m| {
            m.remove_where(&mut pick, |block, class| {
                blocks += 1;
                bytes += class;
                cache.free_lent(block, class, reason, free);
            });
        });
        self.prune();
        (blocks, bytes)
    }

    /// Caches again every block of every magazine, as released at `now`.
    fn flush_mags(
        &mut self,
        cache: &mut Cache<A::Block, P, C>,
        now: u64,
        free: &mut (impl FnMut(A::Block, usize) + ?Sized),
    ) {
        thread_cache::visit(&mut self.mags, |m| {
            m.drain(|block, class, _| cache.release(block, class, now, free));
        });
        self.prune();
    }

    /// The magazine of an exited thread that holds the most blocks, if any,
    /// for a thread that takes up the pool: a new reference to it, so that
    /// no other thread adopts it and `prune` keeps it. Its blocks keep
    /// their release times (they decay when they would have), and its
    /// owner's counts of misses start again ([`Magazine::hand_over`]).
    ///
    /// So threads that come and go (a thread for each task) reuse the
    /// blocks of those before them, where each would otherwise miss at
    /// every class while the blocks of its predecessors wait out their
    /// time in magazines no thread reaches. O(magazines in the list), once
    /// for each thread that takes up the pool.
    fn adopt(&mut self) -> Option<Arc<Magazine<A::Block>>> {
        let mut most: Option<(usize, usize)> = None;
        for (i, mag) in self.mags.iter_mut().enumerate() {
            // Only this list holds it: its thread's table dropped it.
            let Some(mag) = Arc::get_mut(mag) else {
                continue;
            };
            let len = mag.get_mut().len();
            if most.is_none_or(|(_, m)| len > m) {
                most = Some((i, len));
            }
        }
        let (i, _) = most?;
        let mag = &mut self.mags[i];
        Arc::get_mut(mag)?.hand_over();
        Some(Arc::clone(mag))
    }

    /// Drops from the list the magazines no thread holds any more (their
    /// thread exited) once they are empty, keeping their counts.
    fn prune(&mut self) {
        let Lending {
            lent,
            mags,
            retired,
            ..
        } = self;
        mags.retain_mut(|mag| {
            // Only this list holds it: its thread's table dropped it.
            let Some(mag) = Arc::get_mut(mag) else {
                return true;
            };
            let m = mag.get_mut();
            if m.len() != 0 {
                return true;
            }
            *lent += m.lent;
            retired.add(m.counts);
            false
        });
    }

    /// Moves the magazines' blocks from the counts in use to the cached
    /// ones, and adds their hits.
    fn add_mag_stats(&mut self, s: &mut Stats) {
        let mut counts = self.retired;
        thread_cache::visit(&mut self.mags, |m| {
            let (blocks, bytes) = m.held();
            s.blocks_in_use -= blocks;
            s.blocks_cached += blocks;
            s.bytes_in_use -= bytes;
            s.bytes_cached += bytes;
            counts.add(m.counts);
        });
        let from_pool = usize::try_from(counts.from_pool).unwrap_or(usize::MAX);
        let waste = usize::try_from(counts.waste).unwrap_or(usize::MAX);
        s.hits += counts.hits;
        s.bytes_from_pool = s.bytes_from_pool.saturating_add(from_pool);
        s.bytes_requested = s
            .bytes_requested
            .saturating_add(from_pool.saturating_sub(waste));
    }
}

/// The packing layer of a packed pool, behind its lock.
type Layer<A, P, C> = Mutex<Box<dyn PackedLayer<A, P, C>>>;

/// Outcomes of backing calls a packed pool made outside its packing lock,
/// for the attempt that needed them: the class, the outcome, and (after a
/// failure) what the allocator said was available.
type Ready<B, E> = Vec<(usize, Result<B, E>, Option<usize>)>;

/// A [`PackedPool`] seen from a [`SharedPool`], whose allocator type need
/// not be [`Packable`]: the calls a packed `SharedPool` forwards to it.
///
/// Two layers implement it: `split::SplitLayer`, whose pool makes no
/// backing call (the shared pool makes them outside the lock, and gives
/// back what the pool let go after it), and, where a build cannot unwind
/// (`panic = "abort"`), the [`PackedPool`] over the caller's allocator.
trait PackedLayer<A: RawAllocator, P: Policy, C: Clock> {
    /// An attempt at an allocation of `size`, with the outcomes of backing
    /// calls made for it in `ready` (those not taken are left there): the
    /// block, or `Err(class)` when it needs a backing block of `class`
    /// first.
    fn allocate(
        &mut self,
        size: usize,
        ready: &mut Ready<A::Block, A::Error>,
    ) -> Result<Result<A::Block, usize>, PoolError<A::Error>>;
    /// # Safety
    ///
    /// As [`PackedPool::release`].
    unsafe fn release(&mut self, block: A::Block, size: usize);
    fn collect(&mut self) -> usize;
    fn trim(&mut self) -> usize;
    fn set_limit(&mut self, limit: Option<usize>) -> usize;
    fn limit(&self) -> Option<usize>;
    fn reset_peaks(&mut self);
    fn class_stats(&self) -> Option<Vec<ClassStats>>;
    fn stats(&self) -> Stats;
    fn packing_stats(&self) -> PackingStats;
    /// Whether the pool let go of blocks to give back after the lock.
    fn frees_pending(&self) -> bool;
    /// The blocks to give back (through the shared pool's allocator).
    fn take_frees(&mut self) -> Frees<A::Block>;
    /// Runs `f` on the `PackedPool<A, P, C>` itself, over the caller's
    /// allocator `alloc` (the shared pool's), for
    /// [`SharedPool::with_packed`].
    fn with_pool(&mut self, alloc: &mut Option<A>, f: &mut dyn FnMut(&mut dyn Any));
    /// An allocation over the caller's allocator `alloc`, with the lock
    /// held across its backing calls: the fallback of an allocation whose
    /// attempts keep needing other blocks.
    fn allocate_locked(
        &mut self,
        size: usize,
        alloc: &mut Option<A>,
    ) -> Result<A::Block, PoolError<A::Error>>;
    /// Drops the pool, giving every block it holds back through `alloc`.
    fn finish(self: Box<Self>, alloc: Option<A>);
    #[cfg(feature = "testing")]
    fn validate(&self);
}

impl<A, P, C> PackedLayer<A, P, C> for PackedPool<A, P, C>
where
    A: Packable + 'static,
    P: Policy + 'static,
    C: Clock + 'static,
{
    fn allocate(
        &mut self,
        size: usize,
        _ready: &mut Ready<A::Block, A::Error>,
    ) -> Result<Result<A::Block, usize>, PoolError<A::Error>> {
        PackedPool::allocate(self, size).map(Ok)
    }
    unsafe fn release(&mut self, block: A::Block, size: usize) {
        // SAFETY: the caller upholds `PackedPool::release`'s contract.
        unsafe { PackedPool::release(self, block, size) }
    }
    fn collect(&mut self) -> usize {
        PackedPool::collect(self)
    }
    fn trim(&mut self) -> usize {
        PackedPool::trim(self)
    }
    fn set_limit(&mut self, limit: Option<usize>) -> usize {
        PackedPool::set_limit(self, limit)
    }
    fn limit(&self) -> Option<usize> {
        self.pool().limit()
    }
    fn reset_peaks(&mut self) {
        PackedPool::reset_peaks(self);
    }
    fn class_stats(&self) -> Option<Vec<ClassStats>> {
        self.pool().class_stats()
    }
    fn stats(&self) -> Stats {
        PackedPool::stats(self)
    }
    fn packing_stats(&self) -> PackingStats {
        PackedPool::packing_stats(self)
    }
    fn frees_pending(&self) -> bool {
        false
    }
    fn take_frees(&mut self) -> Frees<A::Block> {
        Vec::new()
    }
    fn with_pool(&mut self, _alloc: &mut Option<A>, f: &mut dyn FnMut(&mut dyn Any)) {
        f(self);
    }
    fn allocate_locked(
        &mut self,
        size: usize,
        _alloc: &mut Option<A>,
    ) -> Result<A::Block, PoolError<A::Error>> {
        PackedPool::allocate(self, size)
    }
    fn finish(self: Box<Self>, _alloc: Option<A>) {}
    #[cfg(feature = "testing")]
    fn validate(&self) {
        PackedPool::validate(self);
    }
}

/// Blocks taken out of the cache, to deallocate once the cache lock is
/// released. Empty (and allocation-free) on the hit path.
type Frees<B> = Vec<(B, usize)>;

/// What the cache decided for an `allocate`.
enum Step<B> {
    Hit(B),
    /// `room`: with a limit, the bytes it leaves beside those held
    /// (the miss's booked), for the allocator's spare memory.
    Miss {
        size: usize,
        class: usize,
        now: u64,
        room: Option<usize>,
    },
}

/// Runs `f` on the cache and the lent blocks' count under `lock`.
///
/// A function of the lock alone, not a method of [`Inner`]: once a call
/// counts back the last lent block, another thread may drop the pool as
/// soon as the lock is released, so nothing may borrow the pool beyond the
/// lock itself then (a borrow of the lock, all atomics and `UnsafeCell`,
/// does not pin the memory as a borrow of the whole pool would).
#[inline(always)]
fn with_slot<A: RawAllocator, P: Policy, C: Clock, R>(
    lock: &CacheLock<Slot<A, P, C>>,
    f: impl FnOnce(&mut Cache<A::Block, P, C>, &mut Lending<A, P, C>) -> R,
) -> R {
    let mut guard = lock.lock();
    let Slot { cache, lending } = &mut *guard;
    f(
        cache
            .as_mut()
            .expect("SharedPool: the pool is taken apart (re-entered from `with`?)"),
        lending,
    )
}

/// Runs `f` on the lent blocks' count under `lock`, whether or not
/// [`SharedPool::with`] holds the cache; a function of the lock alone, as
/// [`with_slot`].
#[inline]
fn with_lending<A: RawAllocator, P: Policy, C: Clock, R>(
    lock: &CacheLock<Slot<A, P, C>>,
    f: impl FnOnce(&mut Lending<A, P, C>) -> R,
) -> R {
    f(&mut lock.lock().lending)
}

fn recover<T>(r: Result<T, PoisonError<T>>) -> T {
    r.unwrap_or_else(PoisonError::into_inner)
}

/// The blocks a packing layer let go, to give back once its lock is
/// released (none, without an allocation, on the hit path).
#[inline(always)]
fn take_frees<A: RawAllocator, P: Policy, C: Clock>(
    layer: &mut dyn PackedLayer<A, P, C>,
) -> Frees<A::Block> {
    if layer.frees_pending() {
        layer.take_frees()
    } else {
        Vec::new()
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Inner<A, P, C> {
    /// The state of a new pool with one handle and no block lent: a plain
    /// pool has `cache` and `alloc` (and `tc` for thread caches), a packed
    /// one only `packed`.
    fn new(
        cache: Option<Cache<A::Block, P, C>>,
        alloc: Option<A>,
        packed: Option<Layer<A, P, C>>,
        tc: Option<ThreadCaches<C>>,
        requests: Option<RequestHook<A::Block>>,
    ) -> Self {
        Inner {
            cache: CacheLock::biased(Slot {
                cache,
                lending: Lending {
                    lent: 0,
                    held: None,
                    mags: Vec::new(),
                    retired: MagCounts::default(),
                },
            }),
            alloc: Mutex::new(alloc),
            packed,
            handles: AtomicUsize::new(1),
            tc,
            requests: requests.map(|hook| Box::new(Mutex::new(hook))),
            pages: Mutex::new(None),
        }
    }

    /// The allocator's page figures: read now, or, while the allocator's
    /// lock is held (a miss inside the backing allocator), the last ones
    /// read.
    fn pages(&self) -> Option<MappedStats> {
        let mut last = recover(self.pages.lock());
        let now = match self.alloc.try_lock() {
            Ok(guard) => Some(guard.as_ref().and_then(RawAllocator::pages)),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                Some(p.into_inner().as_ref().and_then(RawAllocator::pages))
            }
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(now) = now {
            *last = now;
        }
        *last
    }

    /// Runs `f` on the packing layer under its lock, if the pool is packed.
    ///
    /// The blocks the pool let go are given back after the lock. If `f`
    /// panics they stay with the layer, for the next call (or the drop) to
    /// give back.
    #[inline]
    fn packed<R>(&self, f: impl FnOnce(&mut dyn PackedLayer<A, P, C>) -> R) -> Option<R> {
        let layer = self.packed.as_ref()?;
        let (r, frees) = {
            let mut guard = recover(layer.lock());
            let r = f(&mut **guard);
            (r, take_frees(&mut **guard))
        };
        self.deallocate(frees);
        Some(r)
    }

    /// An allocation from a packed pool's `layer`, whose backing calls run
    /// outside the packing lock: each attempt either serves the request
    /// (a hit, or with a block fetched for it) or names the class of the
    /// backing block it needs, which is then fetched with only the
    /// allocator's lock held, and the request tried again.
    ///
    /// An attempt may, after another thread changed the pool, need another
    /// class than the block fetched for it: blocks fetched and not taken
    /// are offered to the next attempt, then given back. A request whose
    /// attempts needed a block `MAX_NEEDS` times (the pool changing under
    /// it each time) is served with the lock held across its backing
    /// calls, so every request ends.
    #[inline(always)]
    fn allocate_packed(
        &self,
        layer: &Layer<A, P, C>,
        size: usize,
    ) -> Result<A::Block, PoolError<A::Error>> {
        /// Gives blocks fetched and not taken back, also when the request
        /// unwinds.
        struct Fetched<'a, A: RawAllocator, P: Policy, C: Clock> {
            inner: &'a Inner<A, P, C>,
            ready: Ready<A::Block, A::Error>,
        }
        impl<A: RawAllocator, P: Policy, C: Clock> Drop for Fetched<'_, A, P, C> {
            fn drop(&mut self) {
                if !self.ready.is_empty() {
                    let left = self.ready.drain(..);
                    let frees = left.filter_map(|(class, r, _)| r.ok().map(|b| (b, class)));
                    self.inner.deallocate(frees.collect());
                }
            }
        }
        const MAX_NEEDS: u32 = 8;
        let mut fetched = Fetched {
            inner: self,
            ready: Vec::new(),
        };
        let mut needs = 0;
        loop {
            let (step, frees) = {
                let mut guard = recover(layer.lock());
                let step = if needs < MAX_NEEDS {
                    guard.allocate(size, &mut fetched.ready)
                } else {
                    let mut alloc = recover(self.alloc.lock());
                    guard.allocate_locked(size, &mut alloc).map(Ok)
                };
                (step, take_frees(&mut **guard))
            };
            match step {
                Ok(Ok(block)) => {
                    let freed = catch_unwind(AssertUnwindSafe(|| self.deallocate(frees)));
                    if let Err(panic) = freed {
                        // A `deallocate` of a block the pool let go panicked:
                        // the block served goes back rather than be lost.
                        let back = catch_unwind(AssertUnwindSafe(|| {
                            self.release_packed(layer, block, size)
                        }));
                        drop(back);
                        resume_unwind(panic);
                    }
                    return Ok(block);
                }
                Ok(Err(class)) => {
                    self.deallocate(frees);
                    needs += 1;
                    let (outcome, available) = self.alloc(|alloc| {
                        let outcome = alloc.allocate(class);
                        let available = if outcome.is_err() {
                            alloc.available()
                        } else {
                            None
                        };
                        (outcome, available)
                    });
                    fetched.ready.push((class, outcome, available));
                }
                Err(e) => {
                    self.deallocate(frees);
                    return Err(e);
                }
            }
        }
    }

    /// Runs `f` on the cache under its lock.
    #[inline]
    fn cache<R>(&self, f: impl FnOnce(&mut Cache<A::Block, P, C>) -> R) -> R {
        self.slot(|cache, _| f(cache))
    }

    /// Runs `f` on the cache and the lent blocks' count under the cache
    /// lock.
    #[inline]
    fn slot<R>(&self, f: impl FnOnce(&mut Cache<A::Block, P, C>, &mut Lending<A, P, C>) -> R) -> R {
        with_slot(&self.cache, f)
    }

    /// Runs `f` on the backing allocator under its lock.
    #[inline]
    fn alloc<R>(&self, f: impl FnOnce(&mut A) -> R) -> R {
        let mut guard = recover(self.alloc.lock());
        f(guard
            .as_mut()
            .expect("SharedPool: the pool is taken apart (re-entered from `with`?)"))
    }

    /// Runs `f` on the cache, collecting the blocks it lets go, then
    /// deallocates them outside the cache lock, even when `f` panicked.
    #[inline]
    fn cache_then_free<R>(
        &self,
        f: impl FnOnce(&mut Cache<A::Block, P, C>, &mut dyn FnMut(A::Block, usize)) -> R,
    ) -> R {
        let mut frees: Frees<A::Block> = Vec::new();
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.cache(|cache| f(cache, &mut |block, class| frees.push((block, class))))
        }));
        self.deallocate(frees);
        match result {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }

    /// [`cache_then_free`](Self::cache_then_free) with the lent blocks'
    /// count (and the magazines) too.
    fn slot_then_free<R>(
        &self,
        f: impl FnOnce(
            &mut Cache<A::Block, P, C>,
            &mut Lending<A, P, C>,
            &mut dyn FnMut(A::Block, usize),
        ) -> R,
    ) -> R {
        let mut frees: Frees<A::Block> = Vec::new();
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.slot(|cache, lending| {
                f(cache, lending, &mut |block, class| {
                    frees.push((block, class))
                })
            })
        }));
        self.deallocate(frees);
        match result {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }

    /// Frees blocks taken out of a magazine as due (counted as expired).
    #[cold]
    #[inline(never)]
    fn free_due(&self, due: Vec<(A::Block, usize)>) {
        self.cache_then_free(|cache, free| {
            for (block, class) in due {
                cache.free_lent(block, class, Reason::Expired, free);
            }
        });
    }

    /// Gives this thread a magazine for the pool: the one an exited thread
    /// left with the most blocks, if any (see [`Lending::adopt`]), else a
    /// new one; `false` when it cannot have one now.
    #[cold]
    #[inline(never)]
    fn register(&self, this: &Arc<Self>) -> bool {
        let (mag, adopted) = match self.slot(|_, lending| lending.adopt()) {
            Some(mag) => (mag, true),
            None => {
                let blocks = self.tc.as_ref().map_or(MAGAZINE, |tc| tc.magazine);
                (Arc::new(Magazine::new(blocks, 8 * blocks)), false)
            }
        };
        if !thread_cache::register(this, &mag) {
            // An adopted magazine stays in the list, its thread's again
            // once `mag` drops.
            return false;
        }
        if !adopted {
            self.slot(|_, lending| lending.mags.push(mag));
        }
        true
    }

    /// An `allocate` served by this thread's magazine, if it can be.
    ///
    /// The hot path: one look at the magazine that returns nothing larger
    /// than a block; anything else (a due block, no magazine yet) goes to
    /// [`allocate_cached_slow`](Self::allocate_cached_slow).
    #[inline(always)]
    fn allocate_cached(
        &self,
        this: &Arc<Self>,
        tc: &ThreadCaches<C>,
        size: usize,
    ) -> Option<A::Block> {
        let class = tc.round(size)?;
        let key = Arc::as_ptr(this).cast::<()>();
        // SAFETY: `key` is this live pool, whose magazines hold its blocks.
        let mag = unsafe { thread_cache::last::<A::Block>(key) };
        if mag.is_null() {
            // Another pool used last, or no magazine yet.
            let now = tc.clock.now_nanos();
            return self.allocate_cached_slow(this, tc, size, class, now);
        }
        // SAFETY: this thread's table keeps the magazine alive, and this
        // call neither registers a magazine nor exits the thread before
        // it is done with it (`last`).
        let mag = unsafe { &*mag };
        let mut word = mag.skip_word();
        if word != 0 {
            // Passed by: the shared cache serves this call (and looks in
            // the magazine before a backing call: `allocate_locked`).
            word = mag.pass_by(word)?;
        }
        let now = tc.clock.now_nanos();
        // `Err(None)`: a block is due; `Err(Some(miss))`: no block of the
        // class, with the magazine full or not.
        let found = mag.owned(|m| {
            if m.oldest_due(now, tc.ttl) {
                return Err(None);
            }
            match m.take_hit(class, size) {
                Some(block) => Ok(block),
                None if m.has_room() => Err(Some(Miss::Room)),
                None => Err(Some(Miss::Full)),
            }
        });
        match found {
            Some(Ok(block)) => {
                mag.served(word);
                Some(block)
            }
            // A due block first.
            Some(Err(None)) => self.allocate_cached_slow(this, tc, size, class, now),
            // No block of the class: the shared cache serves this call.
            Some(Err(Some(miss))) => {
                mag.missed(word, miss);
                None
            }
            // A visitor holds the magazine (`collect`, `stats` on another
            // thread): the shared cache serves this call.
            None => None,
        }
    }

    /// [`allocate_cached`](Self::allocate_cached) when the magazine has a
    /// due block or there is none yet: frees the due blocks, registers a
    /// magazine, and tries again.
    #[cold]
    #[inline(never)]
    fn allocate_cached_slow(
        &self,
        this: &Arc<Self>,
        tc: &ThreadCaches<C>,
        size: usize,
        class: usize,
        now: u64,
    ) -> Option<A::Block> {
        let key = Arc::as_ptr(this).cast::<()>();
        let mut registered = false;
        loop {
            // SAFETY: `key` is this live pool, whose magazines hold its blocks.
            let found = unsafe {
                thread_cache::with_magazine::<A::Block, _>(key, |mag| {
                    mag.owned(|m| {
                        if m.oldest_due(now, tc.ttl) {
                            return Err(Some(m.take_due(now, tc.ttl)));
                        }
                        m.take_hit(class, size).ok_or(None)
                    })
                })
            };
            match found {
                Found::Ran(Some(Ok(block))) => return Some(block),
                Found::Ran(Some(Err(Some(due)))) => self.free_due(due),
                // `None`: a visitor holds the magazine (`collect`, `stats`
                // on another thread): the shared cache serves this call.
                Found::Ran(None | Some(Err(None))) | Found::Unavailable => return None,
                Found::Missing if !registered && self.register(this) => registered = true,
                Found::Missing => return None,
            }
        }
    }

    /// Before the shared cache's miss goes to the backing allocator: a
    /// block of `size`'s class from this thread's magazine, if it has one
    /// (a thread that passes its magazine by does not look there; see
    /// `thread_cache::Skip`), after freeing the magazine's blocks due at
    /// `now` (to `free`, as evictions), as its hot path would. `cache` is
    /// the shared cache, under its lock: no visitor holds the magazine.
    #[cold]
    #[inline(never)]
    fn take_own(
        &self,
        this: &Arc<Self>,
        cache: &mut Cache<A::Block, P, C>,
        size: usize,
        now: u64,
        free: &mut (impl FnMut(A::Block, usize) + ?Sized),
    ) -> Option<A::Block> {
        let tc = self.tc.as_ref()?;
        let class = tc.round(size)?;
        let key = Arc::as_ptr(this).cast::<()>();
        // SAFETY: `key` is this live pool, whose magazines hold its blocks.
        let found = unsafe {
            thread_cache::with_magazine::<A::Block, _>(key, |mag| {
                mag.owned(|m| {
                    if m.oldest_due(now, tc.ttl) {
                        for (block, class) in m.take_due(now, tc.ttl) {
                            cache.free_lent(block, class, Reason::Expired, free);
                        }
                    }
                    m.take_hit(class, size)
                })
            })
        };
        match found {
            Found::Ran(Some(block)) => block,
            Found::Ran(None) | Found::Missing | Found::Unavailable => None,
        }
    }

    /// The hot path of a release to this thread's magazine: the block
    /// goes in if the magazine has room and nothing due, else it comes
    /// back (and [`Pooled`]'s drop takes the whole path) with whether the
    /// whole path may still put it in the magazine: `false` when the
    /// magazine was seen full with nothing due, or with no handle left,
    /// or held by a visitor, where [`release_cached`](Self::release_cached)
    /// would only find the same and give it back again (a thread that
    /// releases more classes than a magazine holds would otherwise look at
    /// its magazine twice for every release that goes to the shared cache).
    ///
    /// As [`release_cached`](Self::release_cached), it reaches the pool
    /// only through `pool` and `handles`, and only while the block is
    /// still counted lent: once it returns `Ok`, the pool may be gone.
    ///
    /// # Safety
    ///
    /// As [`release_cached`](Self::release_cached).
    #[inline(always)]
    unsafe fn release_cached_fast(
        pool: *const Self,
        handles: &AtomicUsize,
        tc: &ThreadCaches<C>,
        size: usize,
        block: A::Block,
    ) -> Result<(), (A::Block, bool)> {
        // SAFETY: `pool` is alive while the block is counted lent (the
        // caller's promise), and its magazines hold its blocks.
        let mag = unsafe { thread_cache::last::<A::Block>(pool.cast()) };
        if mag.is_null() {
            return Err((block, true));
        }
        // SAFETY: this thread's table keeps the magazine alive (also once
        // the pool is gone), and this call neither registers a magazine
        // nor exits the thread (`last`).
        let mag = unsafe { &*mag };
        let mut word = mag.skip_word();
        if word != 0 {
            match mag.pass_by(word) {
                Some(w) => word = w,
                // Passed by: the shared cache takes the block.
                None => return Err((block, false)),
            }
        }
        let Some(class) = tc.round(size) else {
            return Err((block, true));
        };
        // A clock that panics: the whole path reads it again, and knows
        // what to do with the block then.
        let Ok(now) = catch_unwind(AssertUnwindSafe(|| tc.clock.now_nanos())) else {
            return Err((block, true));
        };
        let ttl = tc.ttl;
        // Inlined by force: `owned_with` calls it at two sites (with and
        // without the magazine's lock), and the compiler would rather call
        // it out of line, which costs the hot path a fifth of its time.
        let put = mag.owned_with(
            block,
            #[inline(always)]
            |m, block| m.put_fast(block, class, now, ttl, handles),
        );
        match put {
            Ok(Ok(())) => {
                mag.stocked(Some(word));
                Ok(())
            }
            Ok(Err((block, due))) => {
                if !due {
                    // Full (or no handle left).
                    mag.missed(word, Miss::Release);
                }
                Err((block, due))
            }
            // A visitor holds the magazine: the shared cache takes the block.
            Err(block) => Err((block, false)),
        }
    }

    /// A release of a lent `block` of `class` at `now` to this thread's
    /// magazine for the pool at `pool`, freeing the magazine's due blocks
    /// first; gives the block back when the magazine cannot take it (none,
    /// full, or no handle left: the caller then counts the block back under
    /// the cache lock).
    ///
    /// Once it returns `Ok`, the pool may be gone: so it borrows nothing of
    /// the pool but the `handles` atomic, and reaches the pool through
    /// `pool` only while the block is still counted lent.
    ///
    /// A panic of a `deallocate` of due blocks on the way is kept in
    /// `panic` (the first one), and the release goes on.
    ///
    /// # Safety
    ///
    /// `pool` points to a live pool in which `block` is counted lent, and
    /// `handles` is its count of handles.
    #[inline(never)]
    unsafe fn release_cached(
        pool: *const Self,
        handles: &AtomicUsize,
        ttl: u64,
        class: usize,
        now: u64,
        block: A::Block,
        panic: &mut Option<Box<dyn Any + Send>>,
    ) -> Result<(), A::Block> {
        let key: *const () = pool.cast();
        let mut block = Some(block);
        loop {
            // SAFETY: `key` is this pool, alive while the block is counted
            // lent, whose magazines hold its blocks.
            let found = unsafe {
                thread_cache::with_magazine::<A::Block, _>(key, |mag| {
                    mag.owned(|m| {
                        if m.oldest_due(now, ttl) {
                            return Some(m.take_due(now, ttl));
                        }
                        // With no handle left, the last block counted back
                        // must see the whole count (under the cache lock):
                        // the caller's path. A handle dropped after this
                        // check counts the magazines as their visitor, so
                        // sees this release.
                        if m.has_room() && handles.load(Ordering::Acquire) > 0 {
                            if let Some(b) = block.take() {
                                match m.push(b, class, now) {
                                    Ok(()) => {
                                        m.lent -= 1;
                                        mag.stocked(None);
                                    }
                                    // Not reached (there is room).
                                    Err(b) => block = Some(b),
                                }
                            }
                        }
                        None
                    })
                })
            };
            match found {
                Found::Ran(Some(Some(due))) => {
                    // SAFETY: the block is still counted lent: the pool lives.
                    let freed = catch_unwind(AssertUnwindSafe(|| unsafe { (*pool).free_due(due) }));
                    if let Err(p) = freed {
                        panic.get_or_insert(p);
                    }
                }
                // `None`: a visitor holds the magazine; the block, not
                // taken, goes to the shared cache.
                Found::Ran(Some(None) | None) => return block.map_or(Ok(()), Err),
                Found::Missing | Found::Unavailable => {
                    return Err(block.take().expect("the block is still ours"));
                }
            }
        }
    }

    /// Gives blocks back to the backing allocator. Every block is offered
    /// even if a `deallocate` panics; the first panic is passed on after.
    #[inline]
    fn deallocate(&self, frees: Frees<A::Block>) {
        // The hit path's case, without a call.
        if !frees.is_empty() {
            self.deallocate_some(frees);
        }
    }

    /// [`deallocate`](Self::deallocate) of at least one block.
    #[inline(never)]
    fn deallocate_some(&self, frees: Frees<A::Block>) {
        let mut first_panic = None;
        self.alloc(|alloc| {
            for (block, class) in frees {
                // SAFETY: every block the cache lets go came from this
                // allocator's `allocate(class)` and leaves the cache once.
                let r = catch_unwind(AssertUnwindSafe(|| unsafe {
                    alloc.deallocate(block, class)
                }));
                if let Err(panic) = r {
                    first_panic.get_or_insert(panic);
                }
            }
        });
        if let Some(panic) = first_panic {
            resume_unwind(panic);
        }
    }

    /// A block for a [`Pooled`]: a plain pool's block is counted lent
    /// (`this` is the pool itself, for the reference the lent blocks hold).
    #[inline(always)]
    fn allocate(&self, this: &Arc<Self>, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        // A packed pool has no thread caches.
        if let Some(tc) = &self.tc {
            if let Some(block) = self.allocate_cached(this, tc, size) {
                return Ok(block);
            }
        }
        self.allocate_shared(this, size)
    }

    /// [`allocate`](Self::allocate) past the thread caches.
    ///
    /// A hit with nothing due frees nothing, so it needs none of the
    /// unwinding care of [`allocate_locked`](Self::allocate_locked): a
    /// panic of the clock or the policy there only unlocks the cache,
    /// with nothing taken. Always inlined, as the plain pool's hit path
    /// is: the call cost a tenth of a shared round trip's instructions.
    #[inline(always)]
    fn allocate_shared(
        &self,
        this: &Arc<Self>,
        size: usize,
    ) -> Result<A::Block, PoolError<A::Error>> {
        if let Some(layer) = &self.packed {
            return self.allocate_packed(layer, size);
        }
        let mut guard = self.cache.lock();
        let Slot { cache, lending } = &mut *guard;
        let cache = cache
            .as_mut()
            .expect("SharedPool: the pool is taken apart (re-entered from `with`?)");
        // Read under the lock (again, after a thread cache's miss), so
        // that the store sees its times in order.
        let now = cache.now();
        if !cache.may_evict(now) {
            let class = cache.class_of(size)?;
            if let Some(block) = cache.take(size, class, now) {
                lending.lend(this);
                return Ok(block);
            }
        }
        self.allocate_locked(this, guard, size, now)
    }

    /// [`allocate_shared`](Self::allocate_shared) past its hit: a
    /// collection, a miss, an error; the clock was read at `now` under
    /// `guard`, the cache lock, which this lets go before any backing call.
    #[inline(never)]
    fn allocate_locked(
        &self,
        this: &Arc<Self>,
        guard: LockGuard<'_, Slot<A, P, C>>,
        size: usize,
        now: u64,
    ) -> Result<A::Block, PoolError<A::Error>> {
        let mut frees: Frees<A::Block> = Vec::new();
        let step = catch_unwind(AssertUnwindSafe(|| {
            let mut guard = guard;
            let Slot { cache, lending } = &mut *guard;
            let cache = cache
                .as_mut()
                .expect("SharedPool: the pool is taken apart (re-entered from `with`?)");
            let free = &mut |block, class| frees.push((block, class));
            cache.run_policy(now, free);
            let class = cache.class_of(size)?;
            if let Some(block) = cache.take(size, class, now) {
                lending.lend(this);
                return Ok(Step::Hit(block));
            }
            // Counted lent by the magazine, as its hits are.
            if let Some(block) = self.take_own(this, cache, size, now, free) {
                return Ok(Step::Hit(block));
            }
            cache.make_room(size, class, now, free)?;
            let room = cache
                .limit()
                .map(|limit| limit.saturating_sub(cache.held_bytes()));
            Ok(Step::Miss {
                size,
                class,
                now,
                room,
            })
        }));
        let freed = catch_unwind(AssertUnwindSafe(|| self.deallocate(frees)));
        let step = match step {
            Ok(step) => step,
            // The cache step panicked (clock or policy): nothing was taken
            // or booked; its panic comes first.
            Err(panic) => resume_unwind(panic),
        };
        if let Err(panic) = freed {
            // A `deallocate` of a block the policy let go panicked after the
            // cache step served this request: undo the step, so that the
            // hit's block is cached again and the miss's booking dropped,
            // then pass the panic on. A second panic while undoing is
            // discarded (the release keeps its block: `release_now`).
            match step {
                Ok(Step::Hit(block)) => {
                    let mut held = None;
                    let _ = catch_unwind(AssertUnwindSafe(|| self.release(block, size, &mut held)));
                    // Not the last reference: `this` is one.
                    drop(held);
                }
                Ok(Step::Miss { class, .. }) => self.cache(|cache| cache.abandon(class)),
                Err(_) => {}
            }
            resume_unwind(panic);
        }
        match step? {
            Step::Hit(block) => Ok(block),
            Step::Miss {
                size,
                class,
                now,
                room,
            } => self.miss(this, size, class, now, room),
        }
    }

    /// A miss whose class is booked: the backing calls and the retry
    /// ladder, with the cache lock released around every backing call.
    #[inline(never)]
    fn miss(
        &self,
        this: &Arc<Self>,
        size: usize,
        class: usize,
        now: u64,
        mut room: Option<usize>,
    ) -> Result<A::Block, PoolError<A::Error>> {
        /// Drops the booking if the backing allocator panics.
        struct Booking<'a, A: RawAllocator, P: Policy, C: Clock> {
            inner: &'a Inner<A, P, C>,
            class: usize,
        }
        impl<A: RawAllocator, P: Policy, C: Clock> Drop for Booking<'_, A, P, C> {
            fn drop(&mut self) {
                self.inner.cache(|cache| cache.abandon(self.class));
            }
        }
        let booking = Booking { inner: self, class };
        let mut attempt = 0;
        // The allocator's capacity, read with the first backing call (the
        // cache lock could not read it: `Cache::make_room` checked the
        // figure the last miss left).
        let mut capacity = None;
        // Memory that moves between blocks (pages): while the allocator's
        // spare memory is short of the class, idle blocks' memory goes
        // back, oldest first, before new memory is made (as
        // `DecayingPool`'s miss does).
        let mut remap = true;
        loop {
            let first = attempt == 0;
            let outcome = self.alloc(|alloc| {
                if first {
                    capacity = alloc.capacity();
                    if capacity.is_some_and(|c| class > c) {
                        return None;
                    }
                }
                if remap {
                    if let Some(spare) = alloc.spare().filter(|&spare| spare < class) {
                        return Some(Err(Err(class - spare)));
                    }
                }
                // The limit covers the spare memory too: what would keep
                // it past the limit goes back first (as in `DecayingPool`).
                if let (Some(room), Some(spare)) = (room, alloc.spare()) {
                    if spare > room {
                        alloc.release_spare();
                    }
                }
                // What is free is read only after a failure, for the ladder.
                Some(
                    alloc
                        .allocate(class)
                        .map_err(|e| Ok((e, alloc.available()))),
                )
            });
            let (err, available) = match outcome {
                Some(Err(Err(short))) => {
                    // Cached blocks of at least `short` bytes, oldest first.
                    let freed = self.slot_then_free(|cache, _, free| {
                        let freed = core::cell::Cell::new(0usize);
                        let mut count = |block, class: usize| {
                            freed.set(freed.get().saturating_add(class));
                            free(block, class);
                        };
                        while freed.get() < short
                            && cache.trim_oldest(now, Reason::Remapped, &mut count)
                        {
                        }
                        freed.get()
                    });
                    remap = freed > 0;
                    // The cached bytes given back leave the limit that room.
                    room = room.map(|r| r.saturating_add(freed));
                    continue;
                }
                Some(Err(Ok(failed))) => failed,
                Some(Ok(block)) => {
                    core::mem::forget(booking);
                    self.slot(|cache, lending| {
                        cache.set_capacity(capacity);
                        cache.miss_done(size, class);
                        lending.lend(this);
                    });
                    return Ok(block);
                }
                // No backing call can serve it: refused, the cache kept.
                None => {
                    core::mem::forget(booking);
                    self.cache(|cache| {
                        cache.set_capacity(capacity);
                        cache.abandon(class);
                    });
                    return Err(PoolError::TooLarge { requested: size });
                }
            };
            attempt += 1;
            let retry = self.slot_then_free(|cache, lending, free| {
                // Blocks idle in thread caches go back to the cache first,
                // where the ladder frees them oldest first.
                lending.flush_mags(cache, now, free);
                cache.after_failure(attempt, class, available, now, free)
            });
            if retry == Retry::GiveUp {
                core::mem::forget(booking);
                return Err(PoolError::Backing(err));
            }
        }
    }

    /// Runs the policy, then caches `block` of a lent [`Pooled`] of a plain
    /// pool; a panic of the clock, the policy or a `deallocate` loses no
    /// block ([`DecayingPool::release`]). The block is counted back first,
    /// so `held` is set (to drop once no borrow of the pool is left) even
    /// when the call panics.
    ///
    /// Only for a caller that holds a reference to the pool of its own
    /// (`allocate` undoing a hit): this borrows the pool after counting the
    /// block back. `Pooled::drop` counts back last instead.
    fn release(&self, block: A::Block, size: usize, held: &mut Held<A, P, C>) {
        let mut frees: Frees<A::Block> = Vec::new();
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.slot(|cache, lending| {
                *held = lending.give_back(&self.handles);
                cache.release_now(block, size, |block, class| frees.push((block, class)))
            })
        }));
        self.deallocate(frees);
        if let Err(panic) = result {
            resume_unwind(panic);
        }
    }

    /// Releases `block` to the packing layer of a packed pool.
    /// The blocks the pool lets go are given back after the lock.
    fn release_packed(&self, layer: &Layer<A, P, C>, block: A::Block, size: usize) {
        let frees = {
            let mut guard = recover(layer.lock());
            // SAFETY: `block` came from this pool's `allocate(size)` and is
            // released once (`Pooled`'s invariant, or `from_raw`'s contract).
            unsafe { guard.release(block, size) };
            take_frees(&mut **guard)
        };
        self.deallocate(frees);
    }

    /// Runs `f` on the lent blocks' count under the cache lock (whether or
    /// not [`SharedPool::with`] holds the cache).
    fn lending<R>(&self, f: impl FnOnce(&mut Lending<A, P, C>) -> R) -> R {
        with_lending(&self.cache, f)
    }

    fn collect(&self) -> usize {
        let n = self.packed(|p| p.collect()).unwrap_or_else(|| {
            let ttl = self.tc.as_ref().map(|tc| tc.ttl);
            self.slot_then_free(|cache, lending, free| {
                let now = cache.now();
                let mut n = 0;
                if let Some(ttl) = ttl {
                    let due = |at: u64| now.saturating_sub(at) >= ttl;
                    n = lending.drain_mags(cache, due, Reason::Expired, free).0;
                }
                n + cache.collect(now, free)
            })
        });
        // An allocator that keeps the memory of blocks given back
        // (`RawAllocator::spare`) decays it too.
        self.backing_spare(RawAllocator::collect_spare);
        n
    }

    /// Runs `f` on the backing allocator when this handle holds it (not
    /// while [`SharedPool::with`] has taken the pool apart, nor where a
    /// packed layer owns it: that layer's own pool calls it), and only if
    /// no miss is inside it: `collect` and `trim` need only the cache lock,
    /// and the next `collect` (the reaper's) tries again.
    fn backing_spare(&self, f: impl FnOnce(&mut A) -> usize) -> usize {
        let mut guard = match self.alloc.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return 0,
        };
        guard.as_mut().map_or(0, f)
    }

    fn set_limit(&self, limit: Option<usize>) -> usize {
        if let Some(n) = self.packed(|p| p.set_limit(limit)) {
            return n;
        }
        let freed = self.slot_then_free(|cache, lending, free| {
            let now = cache.now();
            if limit.is_some() {
                // Blocks idle in thread caches count against the limit:
                // back to the cache, where it frees them oldest first.
                lending.flush_mags(cache, now, free);
            }
            cache.set_limit(limit, now, free)
        });
        // The allocator's spare memory counts against the limit too.
        let Some(limit) = limit else { return freed };
        let held = self.cache(|cache| cache.held_bytes());
        let spare = self.alloc(|alloc| match alloc.spare() {
            Some(spare) if held.saturating_add(spare) > limit => alloc.release_spare(),
            _ => 0,
        });
        freed.saturating_add(spare)
    }

    fn trim(&self) -> usize {
        let n = self.packed(|p| p.trim()).unwrap_or_else(|| {
            self.slot_then_free(|cache, lending, free| {
                let now = cache.now();
                lending.drain_mags(cache, |_| true, Reason::Trimmed, free).1
                    + cache.trim_all(now, Reason::Trimmed, free)
            })
        });
        n + self.backing_spare(RawAllocator::release_spare)
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Drop for Inner<A, P, C> {
    fn drop(&mut self) {
        if let Some(layer) = self.packed.take() {
            // The packed pool, dropped over the caller's allocator: every
            // block it holds goes back.
            let alloc = recover(self.alloc.get_mut()).take();
            recover(layer.into_inner()).finish(alloc);
            return;
        }
        let slot = self.cache.get_mut();
        let cache = slot.cache.take();
        let alloc = recover(self.alloc.get_mut()).take();
        if let (Some(mut cache), Some(mut alloc)) = (cache, alloc) {
            // The blocks idle in thread caches first (exited threads' too;
            // a live thread's table holds only an empty magazine then).
            let mut frees: Frees<A::Block> = Vec::new();
            slot.lending.drain_mags(
                &mut cache,
                |_| true,
                Reason::Dropped,
                &mut |block, class| frees.push((block, class)),
            );
            let mut first_panic = None;
            for (block, class) in frees {
                // SAFETY: every block of a magazine came from this
                // allocator's `allocate(class)` and left the magazine once.
                let r = catch_unwind(AssertUnwindSafe(|| unsafe {
                    alloc.deallocate(block, class)
                }));
                if let Err(panic) = r {
                    first_panic.get_or_insert(panic);
                }
            }
            // Dropping the pool frees every cached block.
            drop(DecayingPool::from_parts(alloc, cache));
            if let Some(panic) = first_panic {
                if !thread::panicking() {
                    resume_unwind(panic);
                }
            }
        }
    }
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
    /// left), so [`Stats::backing_failures`] may count more. In a build
    /// with `panic = "abort"` (the layer finds its way out of a try by
    /// unwinding) the packing lock is held across backing calls instead.
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
        // Backing calls outside the packing lock (`split`), where the build
        // can unwind; else the layer is the pool itself, over the allocator.
        #[cfg(panic = "unwind")]
        let (layer, alloc): (Box<dyn PackedLayer<A, P, C>>, _) = {
            let (layer, alloc) = split::SplitLayer::new(pool);
            (Box::new(layer), Some(alloc))
        };
        #[cfg(not(panic = "unwind"))]
        let (layer, alloc): (Box<dyn PackedLayer<A, P, C>>, _) = (Box::new(pool), None);
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
    fn view(&self) -> ManuallyDrop<Self> {
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
    unsafe fn unview(view: ManuallyDrop<Self>) {
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
        let weak = WeakPool(Arc::downgrade(&self.inner));
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

/// The pool inside [`SharedPool::with`], with both locks held.
///
/// It derefs to `&DecayingPool` for the read-only getters
/// ([`stats`](DecayingPool::stats), [`limit`](DecayingPool::limit),
/// [`class_size`](DecayingPool::class_size),
/// [`allocator`](DecayingPool::allocator), …) and offers the operations
/// that keep the pool in place: [`allocate`](Self::allocate),
/// [`release`](Self::release) (unsafe, as on [`DecayingPool`]),
/// [`collect`](Self::collect) and [`trim`](Self::trim). It never hands out
/// `&mut DecayingPool`: safe code must not be able to move the pool out or
/// another pool in, as the [`Pooled`] blocks of the handle go back to
/// whatever pool it holds.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
/// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// drop(pool.allocate(100)?);
/// let (cached, trimmed) = pool.with(|p| (p.stats().bytes_cached, p.trim()));
/// assert_eq!((cached, trimmed), (100, 100));
/// # Ok(())
/// # }
/// ```
///
/// The pool cannot be replaced (when `with` handed out `&mut
/// DecayingPool`, this compiled, and `block` went back to `other`, to be
/// freed by its allocator):
///
/// ```compile_fail,E0596
/// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
/// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// let block = pool.allocate(3000).unwrap();
/// let other = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
/// let old = pool.with(|p| {
///     let p: &mut DecayingPool<_, _, _> = &mut *p; // no `DerefMut`
///     core::mem::replace(p, other)
/// });
/// drop(block);
/// ```
///
/// nor swapped with another shared pool's:
///
/// ```compile_fail,E0521
/// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
/// let a = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// let b = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// a.with(|x| b.with(|y| core::mem::swap(x, y)));
/// ```
pub struct LockedPool<'a, A: RawAllocator, P: Policy = FixedTime, C: Clock = MonotonicClock> {
    pool: &'a mut DecayingPool<A, P, C>,
    /// The shared pool's request hook, told of raw blocks too.
    requests: Option<&'a Mutex<RequestHook<A::Block>>>,
}

impl<A: RawAllocator, P: Policy, C: Clock> LockedPool<'_, A, P, C> {
    /// A raw block of at least `size` bytes ([`DecayingPool::allocate`]),
    /// not wrapped in a [`Pooled`]: give it back with
    /// [`release`](Self::release) or [`Pooled::from_raw`].
    ///
    /// # Errors
    ///
    /// As [`DecayingPool::allocate`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, Pooled, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let raw = pool.with(|p| p.allocate(8))?;
    /// // SAFETY: `raw` came from this pool with 8 bytes, and is given back once.
    /// drop(unsafe { Pooled::from_raw(&pool, raw, 8) });
    /// # Ok(())
    /// # }
    /// ```
    pub fn allocate(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        let block = self.pool.allocate(size)?;
        if let Some(hook) = self.requests {
            let told = Request::Allocated {
                block: &block,
                size,
            };
            let panic = recover(hook.lock()).call_caught(told);
            if let Some(panic) = panic {
                // SAFETY: `block` came from `self.pool.allocate(size)` just
                // now and was never handed out: it goes back once.
                unsafe { self.pool.release(block, size) };
                resume_unwind(panic);
            }
        }
        Ok(block)
    }

    /// Puts a raw block back into the cache ([`DecayingPool::release`]).
    ///
    /// # Safety
    ///
    /// As [`DecayingPool::release`]: `block` came from this pool (through
    /// [`allocate`](Self::allocate), or [`Pooled::into_raw`] of a block of
    /// this pool) with this same `size`; it has not been given back since,
    /// and is not used after this call.
    ///
    /// # Panics
    ///
    /// As [`DecayingPool::release`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let (block, size) = pool.allocate(8)?.into_raw();
    /// // SAFETY: `block` came from this pool with `size`, through `into_raw`, once.
    /// pool.with(|p| unsafe { p.release(block, size) });
    /// # Ok(())
    /// # }
    /// ```
    pub unsafe fn release(&mut self, block: A::Block, size: usize) {
        // A hook that panics loses no block: it goes back first.
        let panic = self.requests.and_then(|hook| {
            let told = Request::Released {
                block: &block,
                size,
            };
            recover(hook.lock()).call_caught(told)
        });
        // SAFETY: the caller upholds `DecayingPool::release`'s contract.
        unsafe { self.pool.release(block, size) };
        if let Some(panic) = panic {
            resume_unwind(panic);
        }
    }

    /// Runs the policy now ([`DecayingPool::collect`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.with(|p| p.collect()), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn collect(&mut self) -> usize {
        self.pool.collect()
    }

    /// Frees every cached block ([`DecayingPool::trim`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// drop(pool.allocate(8)?);
    /// assert_eq!(pool.with(|p| p.trim()), 8);
    /// # Ok(())
    /// # }
    /// ```
    pub fn trim(&mut self) -> usize {
        self.pool.trim()
    }

    /// Changes the byte limit ([`DecayingPool::set_limit`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// drop(pool.allocate(8)?);
    /// assert_eq!(pool.with(|p| p.set_limit(Some(0))), 8);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_limit(&mut self, limit: Option<usize>) -> usize {
        self.pool.set_limit(limit)
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
    /// drop(pool.allocate(8)?);
    /// pool.with(|p| p.reset_peaks());
    /// assert_eq!(pool.stats().peak_bytes_in_use, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reset_peaks(&mut self) {
        self.pool.reset_peaks()
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Deref for LockedPool<'_, A, P, C> {
    type Target = DecayingPool<A, P, C>;

    /// The pool, read-only.
    #[inline]
    fn deref(&self) -> &DecayingPool<A, P, C> {
        self.pool
    }
}

impl<A, P, C> fmt::Debug for LockedPool<'_, A, P, C>
where
    A: RawAllocator + fmt::Debug,
    P: Policy,
    C: Clock + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockedPool").field(&*self.pool).finish()
    }
}

/// A weak reference to a pool, for the reaper thread.
struct WeakPool<A: RawAllocator, P: Policy, C: Clock>(Weak<Inner<A, P, C>>);

// SAFETY: it is only upgraded into a `SharedPool`, which `spawn_reaper`
// requires to be `Send + Sync`; the weak reference itself reaches nothing
// else.
unsafe impl<A: RawAllocator, P: Policy, C: Clock> Send for WeakPool<A, P, C> where
    SharedPool<A, P, C>: Send + Sync
{
}

/// The reaper thread's body.
fn reap<A, P, C>(weak: WeakPool<A, P, C>, period: Duration, stop: &Stop)
where
    A: RawAllocator,
    P: Policy,
    C: Clock,
{
    loop {
        if stop.wait(period) {
            return;
        }
        let Some(inner) = weak.0.upgrade() else {
            return;
        };
        // A panic inside `collect` (backing allocator, user policy) is
        // reported by the panic hook; the pool stays usable, so the reaper
        // carries on.
        let _ = catch_unwind(AssertUnwindSafe(|| inner.collect()));
        drop(inner);
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
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
///
/// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// let reaper = pool.spawn_reaper(Duration::from_secs(60));
/// let start = std::time::Instant::now();
/// drop(reaper);
/// assert!(start.elapsed() < Duration::from_secs(5));
/// # Ok(())
/// # }
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
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
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
    /// # Ok(())
    /// # }
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
/// It keeps its pool alive. It is `Send` and `Sync` when its
/// [`SharedPool`] is.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
/// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// let block = pool.allocate(256)?;
/// let id: u64 = *block; // CheckingAllocator blocks are numbers
/// assert_eq!(id, 1);
/// drop(block);
/// assert_eq!(*pool.allocate(256)?, 1); // a hit: the same block again
/// # Ok(())
/// # }
/// ```
pub struct Pooled<A: RawAllocator, P: Policy = FixedTime, C: Clock = MonotonicClock> {
    block: ManuallyDrop<A::Block>,
    size: usize,
    /// From [`SharedPool::view`]: keeps the pool alive through the count of
    /// lent blocks (plain pool) or a reference of its own (packed pool),
    /// without touching the handles' shared reference count.
    pool: ManuallyDrop<SharedPool<A, P, C>>,
}

// SAFETY: a `Pooled` is a `SendBlock` (movable and shareable across
// threads) plus a handle to a `Send + Sync` pool, which it releases the
// block to through the pool's locks.
unsafe impl<A: RawAllocator, P: Policy, C: Clock> Send for Pooled<A, P, C> where
    SharedPool<A, P, C>: Send + Sync
{
}

// SAFETY: `&Pooled` gives `&A::Block` (shareable: `SendBlock`) and `&SharedPool`
// (`Sync`).
unsafe impl<A: RawAllocator, P: Policy, C: Clock> Sync for Pooled<A, P, C> where
    SharedPool<A, P, C>: Send + Sync
{
}

impl<A: RawAllocator, P: Policy, C: Clock> Pooled<A, P, C> {
    /// The size the block was requested with (its class size may be
    /// larger: see [`DecayingPool::class_size`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, SharedPool, SizeClass};
    /// let pool = SharedPool::new(
    ///     DecayingPool::builder(CheckingAllocator::new()).size_class(SizeClass::PowerOfTwo).build(),
    /// );
    /// let block = pool.allocate(3000)?;
    /// assert_eq!(block.size(), 3000);
    /// assert_eq!(pool.stats().bytes_in_use, 4096);
    /// # Ok(())
    /// # }
    /// ```
    pub fn size(&self) -> usize {
        self.size
    }

    /// The pool the block belongs to.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let block = pool.allocate(8)?;
    /// assert!(block.pool().ptr_eq(&pool));
    /// # Ok(())
    /// # }
    /// ```
    pub fn pool(&self) -> &SharedPool<A, P, C> {
        &self.pool
    }

    /// Takes the block out of its handle without releasing it, for
    /// handing it across an FFI boundary: returns the block and the size it
    /// was requested with. The pool still counts it in use.
    ///
    /// Give it back with [`Pooled::from_raw`] (then drop that), or with
    /// [`LockedPool::release`] through [`SharedPool::with`]; a block never
    /// given back is never freed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
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
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_raw(self) -> (A::Block, usize) {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped nor used again, so the block is
        // taken out exactly once and not released by `Pooled::drop`.
        let block = unsafe { ManuallyDrop::take(&mut this.block) };
        let size = this.size;
        // SAFETY: as above, the view is read out exactly once; the block it
        // was made for is still counted lent, and is counted back here.
        unsafe { SharedPool::unview(core::ptr::read(&this.pool)) };
        (block, size)
    }

    /// Wraps a block that [`Pooled::into_raw`] took out, so that dropping
    /// the result releases it to `pool`.
    ///
    /// # Safety
    ///
    /// - `block` and `size` are exactly what [`Pooled::into_raw`] returned
    ///   for a `Pooled` of this same pool (`pool`, or a clone of it); a block
    ///   from [`LockedPool::allocate`] on this pool (or from
    ///   [`DecayingPool::allocate`] on the pool before it was shared), with
    ///   the `size` passed to it, is fine too;
    /// - the block has not been given back since (by another `from_raw`, or
    ///   by [`LockedPool::release`]), and is not used after the returned
    ///   `Pooled` is dropped or given back;
    /// - no other live `Pooled` or other owner still uses the block.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, Pooled, SharedPool};
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let (block, size) = pool.allocate(100)?.into_raw();
    /// // SAFETY: `block` and `size` came from `into_raw` on this pool, once.
    /// let again = unsafe { Pooled::from_raw(&pool, block, size) };
    /// assert_eq!((*again, again.size()), (block, 100));
    /// # Ok(())
    /// # }
    /// ```
    pub unsafe fn from_raw(pool: &SharedPool<A, P, C>, block: A::Block, size: usize) -> Self {
        if pool.inner.packed.is_none() {
            pool.inner.lending(|l| l.lend(&pool.inner));
        }
        Pooled {
            block: ManuallyDrop::new(block),
            size,
            pool: pool.view(),
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

/// Safe byte views of host blocks, as [`LocalBlock`](crate::LocalBlock)'s.
///
/// Every `Pooled` block came from its pool's `allocate(size)` with its
/// [`size`](Pooled::size): from the plain pool, a thread cache of it, or
/// the packed pool (through [`SharedPool::allocate`], or
/// [`Pooled::from_raw`], whose contract says so). With a [`HostMemory`]
/// allocator each is `size` bytes of host memory, valid for reads and
/// writes and this handle's alone until it is dropped: [`DecayingPool`]
/// and [`PackedPool`] are `HostMemory` over one.
impl<A: HostMemory, P: Policy, C: Clock> Pooled<A, P, C> {
    /// The block's bytes, possibly uninitialised (a hit returns the bytes
    /// the previous user left).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, SharedPool, SystemAllocator};
    /// let pool = SharedPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// let block = pool.allocate(8)?;
    /// assert_eq!(block.as_uninit().len(), 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_uninit(&self) -> &[MaybeUninit<u8>] {
        // SAFETY: the block is `size` bytes valid for reads, owned by this
        // handle (see the `impl`); `&self` allows no writer through it
        // meanwhile, and `MaybeUninit` admits any content.
        unsafe { core::slice::from_raw_parts(self.block.as_ptr().cast(), self.size) }
    }

    /// The block's bytes, possibly uninitialised, for writing.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::mem::MaybeUninit;
    /// use decaying_pool::{DecayingPool, FixedTime, SharedPool, SystemAllocator};
    /// let pool = SharedPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// let mut block = pool.allocate(8)?;
    /// block.as_uninit_mut()[0] = MaybeUninit::new(42);
    /// // SAFETY: byte 0 was just written.
    /// assert_eq!(unsafe { block.as_uninit()[0].assume_init() }, 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: as in `as_uninit`, for writes too, and `&mut self` makes
        // the view unique.
        unsafe { core::slice::from_raw_parts_mut(self.block.as_ptr().cast(), self.size) }
    }

    /// Sets every byte of the block to `byte` and returns it as an
    /// initialised slice.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, Packing, SharedPool, SystemAllocator};
    /// // A packed pool's carved blocks are host memory too.
    /// let packed = DecayingPool::builder(SystemAllocator::new()).packing(Packing::default()).build();
    /// let pool = SharedPool::packed(packed);
    /// let mut block = pool.allocate(4)?;
    /// let bytes: &mut [u8] = block.fill(0);
    /// bytes[1] = 9;
    /// assert_eq!(bytes, &[0, 9, 0, 0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fill(&mut self, byte: u8) -> &mut [u8] {
        let ptr = self.block.as_ptr();
        // SAFETY: as in `as_uninit_mut`; every byte is written before the
        // slice is formed, so it is initialised.
        unsafe {
            ptr.write_bytes(byte, self.size);
            core::slice::from_raw_parts_mut(ptr, self.size)
        }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Drop for Pooled<A, P, C> {
    /// Releases the block to the pool.
    ///
    /// If the thread is already panicking, a panic from the pool during the
    /// release (a panicking backing `deallocate` or policy) is caught and
    /// discarded rather than abort the process.
    #[inline]
    fn drop(&mut self) {
        // SAFETY: `drop` runs once and `self.block` is not used afterwards.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        let size = self.size;
        // SAFETY: `drop` runs once and `self.pool` is not used afterwards:
        // the view is read out once.
        let view = unsafe { core::ptr::read(&self.pool) };
        if view.inner.requests.is_some() {
            return release_logged(view, block, size);
        }
        release_pooled(view, block, size);
    }
}

/// A [`Pooled`]'s release with a request hook, out of line. A hook that
/// panics loses no block: it goes back first.
#[cold]
#[inline(never)]
fn release_logged<A: RawAllocator, P: Policy, C: Clock>(
    view: ManuallyDrop<SharedPool<A, P, C>>,
    block: A::Block,
    size: usize,
) {
    let panic = view.inner.requests.as_ref().and_then(|hook| {
        let told = Request::Released {
            block: &block,
            size,
        };
        recover(hook.lock()).call_caught(told)
    });
    release_pooled(view, block, size);
    if let Some(panic) = panic {
        if !thread::panicking() {
            resume_unwind(panic);
        }
    }
}

/// Gives a [`Pooled`]'s block back (its whole `drop` but the hook).
#[inline(always)]
fn release_pooled<A: RawAllocator, P: Policy, C: Clock>(
    view: ManuallyDrop<SharedPool<A, P, C>>,
    block: A::Block,
    size: usize,
) {
    // `block` came from this pool's `allocate(size)` (through
    // `SharedPool::allocate`, or `from_raw`, whose contract says so), and
    // this handle owned it alone, so it is released once.
    let (block, magazine) = match &view.inner.tc {
        Some(tc) => {
            let pool = Arc::as_ptr(&view.inner);
            // SAFETY: the block is counted lent in this live pool.
            match unsafe { Inner::release_cached_fast(pool, &view.inner.handles, tc, size, block) }
            {
                // The pool may be gone: nothing reaches it any more.
                Ok(()) => return,
                Err((block, true)) => (block, true),
                // To the shared cache (a thread-cached pool is plain),
                // inlined: the hot path of a thread whose magazine is
                // passed by (it kept missing).
                Err((block, false)) => return release_plain(view, block, size),
            }
        }
        None if view.inner.packed.is_none() => return release_plain(view, block, size),
        None => (block, false),
    };
    release_slow(view, block, size, magazine);
}

/// The whole release of a [`Pooled`]'s block, when the hot path (a thread
/// cache with room) did not take it; `magazine`: whether the thread's
/// magazine may still take it (see [`Inner::release_cached_fast`]).
#[inline(never)]
fn release_slow<A: RawAllocator, P: Policy, C: Clock>(
    view: ManuallyDrop<SharedPool<A, P, C>>,
    block: A::Block,
    size: usize,
    magazine: bool,
) {
    if view.inner.packed.is_some() {
        // Drops the view's reference last, also when the release unwinds.
        let view = Unview(view);
        let inner = &view.0.inner;
        let Some(layer) = &inner.packed else {
            unreachable!("a packed pool stays packed")
        };
        let release = || inner.release_packed(layer, block, size);
        if thread::panicking() {
            let _ = catch_unwind(AssertUnwindSafe(release));
        } else {
            release();
        }
    } else {
        // The block is counted back last: until then it keeps the pool
        // alive; from then on another thread may drop it as soon as the
        // lock is released, so only the lock is borrowed for that step,
        // and nothing reaches the pool afterwards.
        let mut block = block;
        let mut mag_panic = None;
        if let Some(tc) = view.inner.tc.as_ref().filter(|_| magazine) {
            let class = tc.round(size);
            let ttl = tc.ttl;
            // A clock that panics: the path below reads it again, and
            // knows what to do with the block then.
            let now = catch_unwind(AssertUnwindSafe(|| tc.clock.now_nanos())).ok();
            if let (Some(class), Some(now)) = (class, now) {
                let pool = Arc::as_ptr(&view.inner);
                // SAFETY: the block is counted lent in this live pool.
                let handles = &view.inner.handles;
                let panic = &mut mag_panic;
                // SAFETY: the block is counted lent in this live pool.
                match unsafe { Inner::release_cached(pool, handles, ttl, class, now, block, panic) }
                {
                    Ok(()) => {
                        // The pool may be gone: only the panic is left.
                        if let Some(panic) = mag_panic {
                            // Asked only now: a panic caught on the way counts no more.
                            if !thread::panicking() {
                                resume_unwind(panic);
                            }
                        }
                        return;
                    }
                    Err(b) => block = b,
                }
            }
        }
        let (lock, handles) = (&view.inner.cache, &view.inner.handles);
        let mut frees: Frees<A::Block> = Vec::new();
        let mut held = None;
        let mut counted = false;
        let cached = catch_unwind(AssertUnwindSafe(|| {
            with_slot(lock, |cache, lending| {
                // The clock is read again under the lock, so that the
                // store sees its times in order.
                cache.release_now(block, size, |block, class| frees.push((block, class)));
                if frees.is_empty() {
                    // The usual case: nothing to deallocate, so the
                    // block is counted back in this same step.
                    held = lending.give_back(handles);
                    counted = true;
                }
            })
        }));
        let mut freed = Ok(());
        if !counted {
            // The pool is alive: this block is still counted lent.
            let inner = &view.inner;
            freed = catch_unwind(AssertUnwindSafe(|| inner.deallocate(frees)));
            held = with_lending(lock, |l| l.give_back(handles));
        }
        // May drop the pool (`held` was its last reference).
        drop(held);
        // The first panic goes on, unless the thread is unwinding.
        let first = match mag_panic {
            Some(panic) => Err(panic),
            None => cached.and(freed),
        };
        if let Err(panic) = first {
            // Asked only when there is a panic to pass on: a panic caught
            // on the way no longer counts, so this is what it was on entry.
            if !thread::panicking() {
                resume_unwind(panic);
            }
        }
    }
}

/// The release of a [`Pooled`]'s block of a plain pool to the shared
/// cache (without thread caches, or past a magazine that cannot take the
/// block), when the thread is not unwinding (else [`release_slow`], which
/// keeps a panic from leaving a destructor that runs while unwinding): the
/// block is cached and counted back in one step under the cache lock,
/// unless the cache lets blocks go first, which are freed outside it
/// while the block still keeps the pool alive. A panic of the clock, the
/// policy or a `deallocate` leaves the rest to [`Settle`] as the release
/// unwinds, so the hit path needs no `catch_unwind`. Always inlined, as
/// the plain pool's `release` is.
#[inline(always)]
fn release_plain<A: RawAllocator, P: Policy, C: Clock>(
    view: ManuallyDrop<SharedPool<A, P, C>>,
    block: A::Block,
    size: usize,
) {
    if thread::panicking() {
        return release_slow(view, block, size, false);
    }
    let mut settle = Settle {
        pool: Arc::as_ptr(&view.inner),
        frees: Vec::new(),
        counted: false,
    };
    let held = {
        // SAFETY: the block is counted lent until `settle.counted` is set,
        // which keeps the pool alive, and nothing below reaches the pool
        // through `inner` once it is set.
        let inner = unsafe { &*settle.pool };
        let mut guard = inner.cache.lock();
        let Slot { cache, lending } = &mut *guard;
        let cache = cache
            .as_mut()
            .expect("SharedPool: the pool is taken apart (re-entered from `with`?)");
        // The clock is read under the lock, so that the store sees its
        // times in order.
        let frees = &mut settle.frees;
        cache.release_now(block, size, |block, class| frees.push((block, class)));
        if !settle.frees.is_empty() {
            // `settle` frees them, then counts the block back.
            drop(guard);
            return drop(settle);
        }
        // The usual case: nothing to free, so the block is counted back
        // in this same step.
        settle.counted = true;
        lending.give_back(&inner.handles)
    };
    // The pool may be gone. `settle` has nothing left to do, and owns no
    // memory: nothing was pushed to its list.
    debug_assert!(settle.counted && settle.frees.capacity() == 0);
    core::mem::forget(settle);
    // May drop the pool (`held` was its last reference).
    drop(held);
}

/// What a [`release_plain`] leaves to do once the cache lock is let go,
/// also when the release unwinds: while the block is not yet counted back
/// (`counted`), free the blocks the cache let go (`frees`), then count the
/// block back. A panic of a `deallocate` is passed on, unless the thread
/// is unwinding (from a panic of the release itself, which goes on).
struct Settle<A: RawAllocator, P: Policy, C: Clock> {
    /// The pool: alive while the block is counted lent.
    pool: *const Inner<A, P, C>,
    frees: Frees<A::Block>,
    counted: bool,
}

impl<A: RawAllocator, P: Policy, C: Clock> Drop for Settle<A, P, C> {
    fn drop(&mut self) {
        if self.counted {
            return;
        }
        // SAFETY: the block is not counted back yet: the pool is alive.
        let inner = unsafe { &*self.pool };
        let frees = core::mem::take(&mut self.frees);
        let freed = catch_unwind(AssertUnwindSafe(|| inner.deallocate(frees)));
        let held = with_lending(&inner.cache, |l| l.give_back(&inner.handles));
        self.counted = true;
        // May drop the pool (`held` was its last reference); a pool
        // dropped while unwinding discards the panics of its frees.
        drop(held);
        if let Err(panic) = freed {
            if !thread::panicking() {
                resume_unwind(panic);
            }
        }
    }
}

/// Drops a packed pool's [`SharedPool::view`] (its own reference) when
/// dropped, also on unwinding.
struct Unview<A: RawAllocator, P: Policy, C: Clock>(ManuallyDrop<SharedPool<A, P, C>>);

impl<A: RawAllocator, P: Policy, C: Clock> Drop for Unview<A, P, C> {
    fn drop(&mut self) {
        // SAFETY: the view came from `SharedPool::view` for a packed pool's
        // block, is this guard's alone, and is read out once here.
        unsafe { SharedPool::unview(core::ptr::read(&self.0)) };
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
