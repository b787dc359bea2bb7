//! What the cache lock guards ([`Slot`]): the cache, and the count of the
//! blocks a plain pool lent out with the reference they share
//! ([`Lending`]), which also keeps every thread's magazine.

use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::inner::Inner;
use super::lock::CacheLock;
use super::thread_cache::{self, MagCounts, Magazine};
use crate::cache::Cache;
use crate::clock::Clock;
use crate::observe::Reason;
use crate::policy::Policy;
use crate::raw::RawAllocator;
use crate::stats::Stats;

// For the documentation's links.
#[cfg(doc)]
use super::handle::SharedPool;
#[cfg(doc)]
use super::pooled::Pooled;

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
pub(super) struct Slot<A: RawAllocator, P: Policy, C: Clock> {
    /// `None` only while [`SharedPool::with`] has put the pool together,
    /// and always in a packed pool.
    pub(super) cache: Option<Cache<A::Block, P, C>>,
    pub(super) lending: Lending<A, P, C>,
}

/// The lent blocks of a plain pool and the reference they share.
pub(super) struct Lending<A: RawAllocator, P: Policy, C: Clock> {
    /// Live `Pooled` blocks of a plain pool, less those the magazines count
    /// (`lent` plus the magazines' `lent` is the number of live blocks;
    /// each part alone may be negative).
    pub(super) lent: isize,
    /// The reference the lent blocks keep the pool alive through.
    pub(super) held: Option<Arc<Inner<A, P, C>>>,
    /// Every thread's magazine for this pool, visited under the cache lock
    /// (`thread_cache::visit`; where magazines are locked, the lock order
    /// is the cache lock, then a magazine's).
    pub(super) mags: Vec<Arc<Magazine<A::Block>>>,
    /// The hit counters of magazines dropped from `mags`.
    pub(super) retired: MagCounts,
}

/// A strong reference to a pool that a call let go of, to drop once no
/// lock and no borrow of the pool is left (it may be the last one).
pub(super) type Held<A, P, C> = Option<Arc<Inner<A, P, C>>>;

impl<A: RawAllocator, P: Policy, C: Clock> Lending<A, P, C> {
    /// Counts a block lent out; `arc` is the pool this slot belongs to.
    #[inline(always)]
    pub(super) fn lend(&mut self, arc: &Arc<Inner<A, P, C>>) {
        self.lent += 1;
        if self.held.is_none() {
            self.held = Some(Arc::clone(arc));
        }
    }

    /// Counts a lent block back; hands out `held` when it must go.
    #[inline(always)]
    pub(super) fn give_back(&mut self, handles: &AtomicUsize) -> Held<A, P, C> {
        self.lent -= 1;
        if handles.load(Ordering::Acquire) == 0 {
            self.let_go_if_idle()
        } else {
            None
        }
    }

    /// Hands out `held` when no block is lent (the caller has seen no
    /// handle left).
    pub(super) fn let_go_if_idle(&mut self) -> Held<A, P, C> {
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
    pub(super) fn drain_mags(
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
    pub(super) fn flush_mags(
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
    pub(super) fn adopt(&mut self) -> Option<Arc<Magazine<A::Block>>> {
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
    pub(super) fn add_mag_stats(&mut self, s: &mut Stats) {
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

/// Runs `f` on the cache and the lent blocks' count under `lock`.
///
/// A function of the lock alone, not a method of [`Inner`]: once a call
/// counts back the last lent block, another thread may drop the pool as
/// soon as the lock is released, so nothing may borrow the pool beyond the
/// lock itself then (a borrow of the lock, all atomics and `UnsafeCell`,
/// does not pin the memory as a borrow of the whole pool would).
#[inline(always)]
pub(super) fn with_slot<A: RawAllocator, P: Policy, C: Clock, R>(
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
pub(super) fn with_lending<A: RawAllocator, P: Policy, C: Clock, R>(
    lock: &CacheLock<Slot<A, P, C>>,
    f: impl FnOnce(&mut Lending<A, P, C>) -> R,
) -> R {
    f(&mut lock.lock().lending)
}
