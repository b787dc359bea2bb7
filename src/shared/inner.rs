//! The state every handle and block of a [`SharedPool`] shares ([`Inner`]):
//! the cache and the backing allocator, each behind its lock, and the
//! calls of a plain pool through them.

use core::sync::atomic::AtomicUsize;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex};
use std::thread::{self};

use super::lending::{Held, Lending, Slot, with_lending, with_slot};
use super::lock::{CacheLock, Guard as LockGuard};
use super::magazine_path::ThreadCaches;
use super::packed_layer::Layer;
use super::thread_cache::MagCounts;
use super::{Frees, recover};
use crate::cache::{Cache, Retry};
use crate::clock::Clock;
use crate::error::PoolError;
use crate::observe::{Reason, RequestHook};
use crate::pages::MappedStats;
use crate::policy::Policy;
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;

// For the documentation's links.
#[cfg(doc)]
use super::handle::SharedPool;
#[cfg(doc)]
use super::pooled::Pooled;
#[cfg(doc)]
use crate::packing::PackedPool;

/// The shared state: the two halves of the pool, each behind its lock.
/// `None` only while [`SharedPool::with`] has put them back together, and
/// always in a packed pool, whose whole [`PackedPool`] is in `packed`.
pub(super) struct Inner<A: RawAllocator, P: Policy, C: Clock> {
    pub(super) cache: CacheLock<Slot<A, P, C>>,
    pub(super) alloc: Mutex<Option<A>>,
    /// A pool from [`SharedPool::packed`]: every call goes to it.
    pub(super) packed: Option<Layer<A, P, C>>,
    /// Live [`SharedPool`] handles (not counting the [`Pooled`] blocks'
    /// own views of the pool, nor the reaper's passing references).
    pub(super) handles: AtomicUsize,
    /// The thread caches' settings, for a pool from
    /// [`SharedPool::with_thread_caches`] that uses them.
    pub(super) tc: Option<ThreadCaches<C>>,
    /// The request hook taken over from the pool (see
    /// [`DecayingPool::log_requests`]), told of the callers' requests.
    pub(super) requests: Option<Box<Mutex<RequestHook<A::Block>>>>,
    /// The allocator's page figures as `stats` last read them: `stats`
    /// does not wait for a miss inside the backing allocator, and answers
    /// with these while one is.
    pages: Mutex<Option<MappedStats>>,
}

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

impl<A: RawAllocator, P: Policy, C: Clock> Inner<A, P, C> {
    /// The state of a new pool with one handle and no block lent: a plain
    /// pool has `cache` and `alloc` (and `tc` for thread caches), a packed
    /// one only `packed`.
    pub(super) fn new(
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
    pub(super) fn pages(&self) -> Option<MappedStats> {
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

    /// Runs `f` on the cache under its lock.
    #[inline]
    pub(super) fn cache<R>(&self, f: impl FnOnce(&mut Cache<A::Block, P, C>) -> R) -> R {
        self.slot(|cache, _| f(cache))
    }

    /// Runs `f` on the cache and the lent blocks' count under the cache
    /// lock.
    #[inline]
    pub(super) fn slot<R>(
        &self,
        f: impl FnOnce(&mut Cache<A::Block, P, C>, &mut Lending<A, P, C>) -> R,
    ) -> R {
        with_slot(&self.cache, f)
    }

    /// Runs `f` on the backing allocator under its lock.
    #[inline]
    pub(super) fn alloc<R>(&self, f: impl FnOnce(&mut A) -> R) -> R {
        let mut guard = recover(self.alloc.lock());
        f(guard
            .as_mut()
            .expect("SharedPool: the pool is taken apart (re-entered from `with`?)"))
    }

    /// Runs `f` on the cache, collecting the blocks it lets go, then
    /// deallocates them outside the cache lock, even when `f` panicked.
    #[inline]
    pub(super) fn cache_then_free<R>(
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

    /// Gives blocks back to the backing allocator. Every block is offered
    /// even if a `deallocate` panics; the first panic is passed on after.
    #[inline]
    pub(super) fn deallocate(&self, frees: Frees<A::Block>) {
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
    pub(super) fn allocate(
        &self,
        this: &Arc<Self>,
        size: usize,
    ) -> Result<A::Block, PoolError<A::Error>> {
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

    /// Runs `f` on the lent blocks' count under the cache lock (whether or
    /// not [`SharedPool::with`] holds the cache).
    pub(super) fn lending<R>(&self, f: impl FnOnce(&mut Lending<A, P, C>) -> R) -> R {
        with_lending(&self.cache, f)
    }

    pub(super) fn collect(&self) -> usize {
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

    pub(super) fn set_limit(&self, limit: Option<usize>) -> usize {
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

    pub(super) fn trim(&self) -> usize {
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
