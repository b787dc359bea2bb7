//! A packed [`SharedPool`](super::SharedPool)'s backing calls, outside its
//! packing lock.
//!
//! The packing layer of a packed pool is one [`PackedPool`] behind one
//! lock. Over the caller's allocator it would make its backing calls (a new
//! segment, an exact block: milliseconds on a device) with that lock held,
//! and every other thread's hit would wait for them. So the layer runs over
//! a [`Split`] instead: an allocator of the same blocks that makes no call.
//! Its `allocate` hands over a block the shared pool fetched beforehand,
//! outside the lock, for the class the pool asks for; with none, it notes
//! the class and defers the request: it returns [`SplitError::Need`],
//! which [`RawAllocator::is_deferral`] tells apart from a failure, so the
//! pools above pass it up as it is (no retry, nothing freed, nothing
//! counted; the exact pool's booking guard drops the miss's booking). The
//! shared pool reads the class, lets go of the lock, makes the backing
//! call, and runs the attempt again with the block ready. Its `deallocate`
//! keeps the blocks the pool lets go, for the shared pool to give back
//! after the lock. The caller's allocator itself stays outside the layer,
//! behind the shared pool's allocator lock.
//!
//! The miss is a value all the way up: nothing unwinds, so a build with
//! `panic = "abort"` takes the same path, and a panic hook or a debugger
//! sees no panic where none happened.

use core::any::Any;
use core::fmt;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, Ordering};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;

use super::packed_layer::{PackedLayer, Ready};
use super::{Frees, recover};
use crate::clock::Clock;
use crate::error::PoolError;
use crate::packing::{Packable, PackedPool, PackingStats};
use crate::policy::Policy;
use crate::raw::RawAllocator;
use crate::stats::{ClassStats, Stats};

/// What a [`Split`]'s `allocate` returns in place of a block.
#[derive(Debug)]
pub(super) enum SplitError<E> {
    /// The caller's allocator failed, outside the lock.
    Backing(E),
    /// A backing block the shared pool has not fetched yet is needed (its
    /// class is in [`Handoff::need`]): a deferral, not a failure.
    Need,
}

impl<E: fmt::Display> fmt::Display for SplitError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitError::Backing(e) => e.fmt(f),
            SplitError::Need => f.write_str("a backing block is needed first"),
        }
    }
}

/// The error of the packed pool over a [`Split`], as the shared pool's
/// callers see it (a [`SplitError::Need`] never gets here: the layer
/// answers it with the class).
fn unsplit<E>(e: PoolError<SplitError<E>>) -> Result<PoolError<E>, ()> {
    Ok(match e {
        PoolError::ZeroSize => PoolError::ZeroSize,
        PoolError::TooLarge { requested } => PoolError::TooLarge { requested },
        PoolError::LimitExceeded {
            requested,
            limit,
            reserved,
        } => PoolError::LimitExceeded {
            requested,
            limit,
            reserved,
        },
        PoolError::Backing(SplitError::Backing(e)) => PoolError::Backing(e),
        PoolError::Backing(SplitError::Need) => return Err(()),
    })
}

/// What a [`Split`] and its shared pool hand each other, under the packing
/// lock.
struct Handoff<B, E> {
    /// Outcomes of backing calls made outside the lock for this attempt, by
    /// class, with what the allocator said was available after a failure.
    ready: Ready<B, E>,
    /// The class the attempt needed and found no outcome for.
    need: Option<usize>,
    /// Blocks the pool let go, to deallocate once the lock is released.
    frees: Frees<B>,
}

/// An allocator that makes no backing call: see the module's documentation.
pub(super) struct Split<A: RawAllocator> {
    handoff: Mutex<Handoff<A::Block, A::Error>>,
    /// Whether `handoff.frees` holds a block (read on every call without
    /// the mutex: one load on the hit path).
    frees: AtomicBool,
    /// The caller's allocator's capacity, read when the pool was made.
    capacity: Option<usize>,
    /// What the last failed backing call's allocator said was available.
    available: Option<usize>,
    _alloc: PhantomData<fn() -> A>,
}

impl<A: RawAllocator> Split<A> {
    fn new(capacity: Option<usize>) -> Self {
        Split {
            handoff: Mutex::new(Handoff {
                ready: Vec::new(),
                need: None,
                frees: Vec::new(),
            }),
            frees: AtomicBool::new(false),
            capacity,
            available: None,
            _alloc: PhantomData,
        }
    }
}

impl<A: RawAllocator> RawAllocator for Split<A> {
    type Block = A::Block;
    type Error = SplitError<A::Error>;

    /// The outcome fetched for `size` (a class), else
    /// [`SplitError::Need`] after noting the class.
    fn allocate(&mut self, size: usize) -> Result<A::Block, Self::Error> {
        let h = recover(self.handoff.get_mut());
        if let Some(i) = h.ready.iter().position(|(class, ..)| *class == size) {
            let (_, outcome, available) = h.ready.swap_remove(i);
            if outcome.is_err() {
                self.available = available;
            }
            return outcome.map_err(SplitError::Backing);
        }
        h.need = Some(size);
        Err(SplitError::Need)
    }

    fn is_deferral(error: &Self::Error) -> bool {
        matches!(error, SplitError::Need)
    }

    /// Keeps the block for the shared pool to give back after the lock.
    unsafe fn deallocate(&mut self, block: A::Block, size: usize) {
        recover(self.handoff.get_mut()).frees.push((block, size));
        *self.frees.get_mut() = true;
    }

    fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    fn available(&self) -> Option<usize> {
        self.available
    }
}

impl<A: Packable> Packable for Split<A> {
    #[inline]
    fn carve(segment: &A::Block, offset: usize) -> A::Block {
        A::carve(segment, offset)
    }

    #[inline]
    fn address(block: &A::Block) -> usize {
        A::address(block)
    }
}

/// The packing layer over a [`Split`]; `None` only while
/// [`with_pool`](PackedLayer::with_pool) has it over the caller's
/// allocator.
pub(super) struct SplitLayer<A: Packable, P: Policy, C: Clock> {
    pool: Option<PackedPool<Split<A>, P, C>>,
}

impl<A: Packable, P: Policy, C: Clock> SplitLayer<A, P, C> {
    /// The layer of `pool`, whose allocator goes to the shared pool.
    pub(super) fn new(pool: PackedPool<A, P, C>) -> (Self, A) {
        let mut alloc = None;
        let pool = pool.map_allocator(|a| {
            let capacity = a.capacity();
            alloc = Some(a);
            Split::new(capacity)
        });
        let alloc = alloc.expect("map_allocator calls its function once");
        (SplitLayer { pool: Some(pool) }, alloc)
    }

    fn pool(&self) -> &PackedPool<Split<A>, P, C> {
        self.pool
            .as_ref()
            .expect("SharedPool: the packed pool is taken apart (re-entered from `with_packed`?)")
    }

    fn pool_mut(&mut self) -> &mut PackedPool<Split<A>, P, C> {
        self.pool
            .as_mut()
            .expect("SharedPool: the packed pool is taken apart (re-entered from `with_packed`?)")
    }

    fn split(&self) -> &Split<A> {
        self.pool().pool().allocator()
    }

    /// Runs `f` on the pool over the caller's allocator, `alloc` (taken out
    /// and put back, with the blocks kept for freeing given back through it
    /// first), even when `f` panics; the panic then goes on.
    fn over<R>(
        &mut self,
        alloc: &mut Option<A>,
        f: impl FnOnce(&mut PackedPool<A, P, C>) -> R,
    ) -> R {
        let pool = self
            .pool
            .take()
            .expect("SharedPool: the packed pool is taken apart (re-entered from `with_packed`?)");
        let capacity = pool.pool().allocator().capacity;
        let mut a = alloc
            .take()
            .expect("SharedPool: the allocator is taken apart (re-entered from `with_packed`?)");
        let mut kept_panic = None;
        let mut whole = pool.map_allocator(|split| {
            kept_panic = free_kept(split, &mut a);
            a
        });
        if let Some(panic) = kept_panic {
            self.pool = Some(whole.map_allocator(|a| {
                *alloc = Some(a);
                Split::new(capacity)
            }));
            resume_unwind(panic);
        }
        let r = catch_unwind(AssertUnwindSafe(|| f(&mut whole)));
        self.pool = Some(whole.map_allocator(|a| {
            *alloc = Some(a);
            Split::new(capacity)
        }));
        match r {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }
}

impl<A, P, C> PackedLayer<A, P, C> for SplitLayer<A, P, C>
where
    A: Packable + 'static,
    P: Policy + 'static,
    C: Clock + 'static,
{
    fn allocate(
        &mut self,
        size: usize,
        ready: &mut Ready<A::Block, A::Error>,
    ) -> Result<Result<A::Block, usize>, PoolError<A::Error>> {
        let given = !ready.is_empty();
        if given {
            recover(self.split().handoff.lock()).ready.append(ready);
        }
        // Guards the user's code the attempt runs (clock, policy): should
        // it panic, the outcomes handed over go back to the caller, who
        // gives their blocks back, before the panic goes on.
        let attempt = catch_unwind(AssertUnwindSafe(|| self.pool_mut().allocate(size)));
        // A hit with nothing handed over leaves the handoff as it was: the
        // hit path takes no lock of it.
        let need = if given || !matches!(attempt, Ok(Ok(_))) {
            let mut h = recover(self.split().handoff.lock());
            // The outcomes not taken stay the caller's (a block fetched
            // for a class the attempt did not need in the end), to offer
            // again or give back.
            ready.append(&mut h.ready);
            h.need.take()
        } else {
            None
        };
        match attempt {
            Ok(Ok(block)) => Ok(Ok(block)),
            Ok(Err(e)) => match (unsplit(e), need) {
                (Ok(e), _) => Err(e),
                (Err(()), Some(class)) => Ok(Err(class)),
                (Err(()), None) => unreachable!("a deferred request names its class"),
            },
            Err(panic) => resume_unwind(panic),
        }
    }

    unsafe fn release(&mut self, block: A::Block, size: usize) {
        // SAFETY: the caller upholds `PackedPool::release`'s contract.
        unsafe { self.pool_mut().release(block, size) }
    }

    fn collect(&mut self) -> usize {
        self.pool_mut().collect()
    }

    fn trim(&mut self) -> usize {
        self.pool_mut().trim()
    }

    fn set_limit(&mut self, limit: Option<usize>) -> usize {
        self.pool_mut().set_limit(limit)
    }

    fn limit(&self) -> Option<usize> {
        self.pool().pool().limit()
    }

    fn reset_peaks(&mut self) {
        self.pool_mut().reset_peaks();
    }

    fn class_stats(&self) -> Option<Vec<ClassStats>> {
        self.pool().pool().class_stats()
    }

    fn stats(&self) -> Stats {
        self.pool().stats()
    }

    fn packing_stats(&self) -> PackingStats {
        self.pool().packing_stats()
    }

    #[inline(always)]
    fn frees_pending(&self) -> bool {
        self.split().frees.load(Ordering::Relaxed)
    }

    fn take_frees(&mut self) -> Frees<A::Block> {
        let split = self.split();
        let mut h = recover(split.handoff.lock());
        split.frees.store(false, Ordering::Relaxed);
        core::mem::take(&mut h.frees)
    }

    fn with_pool(&mut self, alloc: &mut Option<A>, f: &mut dyn FnMut(&mut dyn Any)) {
        self.over(alloc, |pool| f(pool));
    }

    fn allocate_locked(
        &mut self,
        size: usize,
        alloc: &mut Option<A>,
    ) -> Result<A::Block, PoolError<A::Error>> {
        self.over(alloc, |pool| pool.allocate(size))
    }

    fn finish(mut self: Box<Self>, alloc: Option<A>) {
        if let (Some(pool), Some(mut a)) = (self.pool.take(), alloc) {
            // Over the caller's allocator, dropped: every cached block and
            // emptied segment goes back through it.
            let mut kept_panic = None;
            drop(pool.map_allocator(|split| {
                kept_panic = free_kept(split, &mut a);
                a
            }));
            if let Some(panic) = kept_panic {
                if !std::thread::panicking() {
                    resume_unwind(panic);
                }
            }
        }
    }

    #[cfg(feature = "testing")]
    fn validate(&self) {
        self.pool().validate();
    }
}

/// Gives the blocks `split` kept for freeing back through `alloc`, the
/// caller's allocator, every one even if a `deallocate` panics; the first
/// panic is returned, for the caller to pass on.
#[must_use]
fn free_kept<A: RawAllocator>(split: Split<A>, alloc: &mut A) -> Option<Box<dyn Any + Send>> {
    let mut split = split;
    let h = recover(split.handoff.get_mut());
    let kept = core::mem::take(&mut h.frees);
    // Outcomes fetched and never offered cannot be left here (an attempt
    // hands them back), but would be given back too.
    let fetched = h
        .ready
        .drain(..)
        .filter_map(|(class, r, _)| r.ok().map(|b| (b, class)));
    let all: Frees<A::Block> = kept.into_iter().chain(fetched).collect();
    let mut first = None;
    for (block, class) in all {
        // SAFETY: every block a `Split` keeps or holds came from `alloc`'s
        // `allocate(class)` (fetched for the pool outside its lock) and was
        // let go by the pool, or never handed to it, once.
        let r = catch_unwind(AssertUnwindSafe(|| unsafe {
            alloc.deallocate(block, class)
        }));
        if let Err(p) = r {
            first.get_or_insert(p);
        }
    }
    first
}
