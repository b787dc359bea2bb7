//! The way of a thread-cached pool through this thread's magazine
//! ([`thread_cache`]): the thread caches' settings,
//! and the allocations and releases that a magazine serves before the
//! shared cache.

use core::any::Any;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::inner::Inner;
use super::thread_cache::{self, Found, MAGAZINE, Magazine, Miss};
use crate::cache::Cache;
use crate::class::SizeClass;
use crate::clock::Clock;
use crate::observe::Reason;
use crate::policy::Policy;
use crate::raw::RawAllocator;

// For the documentation's links.
#[cfg(doc)]
use super::lending::Lending;
#[cfg(doc)]
use super::pooled::Pooled;
#[cfg(doc)]
use crate::policy::FixedTime;

/// The settings the thread caches of a pool work with, read without the
/// cache lock.
pub(super) struct ThreadCaches<C> {
    /// A clone of the pool's clock (it tells the same time), read by every
    /// thread at once: only set for a clock that is `Sync`.
    pub(super) clock: C,
    /// The [`FixedTime`] time to live, in nanoseconds.
    pub(super) ttl: u64,
    pub(super) size_class: SizeClass,
    /// The most blocks a magazine holds at first: [`MAGAZINE`], fewer in
    /// the fuzz harness (which then reaches full magazines, grows them
    /// and passes them by). It grows to eight times as many.
    pub(super) magazine: usize,
}

impl<C: Clock> ThreadCaches<C> {
    /// The class of `size`, `None` for a request the cache must refuse.
    #[inline(always)]
    pub(super) fn round(&self, size: usize) -> Option<usize> {
        match self.size_class {
            SizeClass::Exact => (size != 0).then_some(size),
            sc => sc.round(size),
        }
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Inner<A, P, C> {
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
    pub(super) fn allocate_cached(
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
    pub(super) fn take_own(
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
    pub(super) unsafe fn release_cached_fast(
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
    pub(super) unsafe fn release_cached(
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
}
