//! The packing layer of a packed [`SharedPool`] ([`PackedLayer`]), and the
//! calls of the shared state that go through it.

use core::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;

use super::inner::Inner;
use super::{Frees, recover};
use crate::clock::Clock;
use crate::error::PoolError;
use crate::packing::PackingStats;
use crate::policy::Policy;
use crate::raw::RawAllocator;
use crate::stats::{ClassStats, Stats};

// For the documentation's links.
#[cfg(doc)]
use super::handle::SharedPool;
#[cfg(doc)]
use crate::packing::{Packable, PackedPool};

/// The packing layer of a packed pool, behind its lock.
pub(super) type Layer<A, P, C> = Mutex<Box<dyn PackedLayer<A, P, C>>>;

/// Outcomes of backing calls a packed pool made outside its packing lock,
/// for the attempt that needed them: the class, the outcome, and (after a
/// failure) what the allocator said was available.
pub(super) type Ready<B, E> = Vec<(usize, Result<B, E>, Option<usize>)>;

/// A [`PackedPool`] seen from a [`SharedPool`], whose allocator type need
/// not be [`Packable`]: the calls a packed `SharedPool` forwards to it.
///
/// `split::SplitLayer` implements it: its pool makes no backing call (the
/// shared pool makes them outside the lock, and gives back what the pool
/// let go after it).
pub(super) trait PackedLayer<A: RawAllocator, P: Policy, C: Clock> {
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
    /// Runs `f` on the packing layer under its lock, if the pool is packed.
    ///
    /// The blocks the pool let go are given back after the lock. If `f`
    /// panics they stay with the layer, for the next call (or the drop) to
    /// give back.
    #[inline]
    pub(super) fn packed<R>(
        &self,
        f: impl FnOnce(&mut dyn PackedLayer<A, P, C>) -> R,
    ) -> Option<R> {
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
    pub(super) fn allocate_packed(
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

    /// Releases `block` to the packing layer of a packed pool.
    /// The blocks the pool lets go are given back after the lock.
    pub(super) fn release_packed(&self, layer: &Layer<A, P, C>, block: A::Block, size: usize) {
        let frees = {
            let mut guard = recover(layer.lock());
            // SAFETY: `block` came from this pool's `allocate(size)` and is
            // released once (`Pooled`'s invariant, or `from_raw`'s contract).
            unsafe { guard.release(block, size) };
            take_frees(&mut **guard)
        };
        self.deallocate(frees);
    }
}
