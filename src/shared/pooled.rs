//! [`Pooled`]: a block handed out by a [`SharedPool`], and its way back
//! to the pool when dropped.

use core::fmt;
use core::mem::{ManuallyDrop, MaybeUninit};
use core::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::thread::{self};

use super::handle::SharedPool;
use super::inner::Inner;
use super::lending::{Slot, with_lending, with_slot};
use super::{Frees, recover};
use crate::clock::{Clock, MonotonicClock};
use crate::local::HostMemory;
use crate::observe::Request;
use crate::policy::{FixedTime, Policy};
use crate::raw::RawAllocator;

// For the documentation's links.
#[cfg(doc)]
use super::locked_pool::LockedPool;
#[cfg(doc)]
use crate::packing::PackedPool;
#[cfg(doc)]
use crate::pool::DecayingPool;

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
    pub(super) block: ManuallyDrop<A::Block>,
    pub(super) size: usize,
    /// From [`SharedPool::view`]: keeps the pool alive through the count of
    /// lent blocks (plain pool) or a reference of its own (packed pool),
    /// without touching the handles' shared reference count.
    pub(super) pool: ManuallyDrop<SharedPool<A, P, C>>,
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
        unsafe { core::slice::from_raw_parts(A::host_ptr(&self.block).as_ptr().cast(), self.size) }
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
        unsafe {
            core::slice::from_raw_parts_mut(A::host_ptr(&self.block).as_ptr().cast(), self.size)
        }
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
        let ptr = A::host_ptr(&self.block).as_ptr();
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
