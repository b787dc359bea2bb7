//! [`LockedPool`]: the pool inside [`SharedPool::with`], with both locks held.

use core::fmt;
use core::ops::Deref;
use std::panic::resume_unwind;
use std::sync::Mutex;

use super::recover;
use crate::clock::{Clock, MonotonicClock};
use crate::error::PoolError;
use crate::observe::{Request, RequestHook};
use crate::policy::{FixedTime, Policy};
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;

// For the documentation's links.
#[cfg(doc)]
use super::handle::SharedPool;
#[cfg(doc)]
use super::pooled::Pooled;

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
    pub(super) pool: &'a mut DecayingPool<A, P, C>,
    /// The shared pool's request hook, told of raw blocks too.
    pub(super) requests: Option<&'a Mutex<RequestHook<A::Block>>>,
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
