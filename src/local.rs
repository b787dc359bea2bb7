//! [`LocalPool`]: a pool for one thread whose blocks release themselves.

use core::cell::RefCell;
use core::fmt;
use core::mem::{ManuallyDrop, MaybeUninit};
use core::ops::Deref;
use core::ptr::NonNull;
use std::rc::Rc;

use crate::clock::{Clock, MonotonicClock};
use crate::error::PoolError;
use crate::policy::{FixedTime, Policy};
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;
use crate::stats::Stats;

/// A [`DecayingPool`] for one thread, whose blocks release themselves: the
/// single-threaded counterpart of [`SharedPool`](crate::SharedPool).
///
/// [`allocate`](Self::allocate) returns a [`LocalBlock`] guard that gives
/// the block back, with the size it was allocated with, when it is dropped
/// (a panic unwinding through its owner included), so safe code can
/// neither forget a block nor release it with a wrong size. Any number of
/// blocks may be held at once: each guard keeps a reference-counted handle
/// to the pool (an `Rc<RefCell<…>>`, no lock), and the pool lives until the
/// last handle and the last block are gone. Neither `LocalPool` nor
/// `LocalBlock` is `Send`; use `SharedPool` to share a pool between
/// threads.
///
/// A hit hands back a block as its previous user left it: its bytes are
/// whatever was written there last (an `mmap` block is zero-filled only on
/// the miss that maps it). The byte views of host blocks
/// ([`LocalBlock::as_uninit`]) are therefore `MaybeUninit`;
/// [`LocalBlock::fill`] initialises them.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
///
/// let pool = LocalPool::new(DecayingPool::new(
///     SystemAllocator::new(),
///     FixedTime::new(Duration::from_secs(2)),
/// ));
/// for _step in 0..3 {
///     let mut a = pool.allocate(4096)?;
///     let b = pool.allocate(4096)?; // two blocks held at once
///     a.fill(7)[0] = 1; // a safe `&mut [u8]` over the block
///     assert_eq!(b.size(), 4096);
/// } // both blocks go back to the pool here
/// let s = pool.stats();
/// assert_eq!((s.misses, s.hits, s.blocks_in_use), (2, 4, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LocalPool<A: RawAllocator, P: Policy = FixedTime, C: Clock = MonotonicClock> {
    pool: Rc<RefCell<DecayingPool<A, P, C>>>,
}

impl<A: RawAllocator, P: Policy, C: Clock> LocalPool<A, P, C> {
    /// Wraps a pool.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.stats().blocks_in_use, 0);
    /// ```
    pub fn new(pool: DecayingPool<A, P, C>) -> Self {
        LocalPool {
            pool: Rc::new(RefCell::new(pool)),
        }
    }

    /// Allocates a block of `size` bytes ([`DecayingPool::allocate`]),
    /// released when the returned guard is dropped.
    ///
    /// # Errors
    ///
    /// As [`DecayingPool::allocate`].
    ///
    /// # Panics
    ///
    /// As [`DecayingPool::allocate`] (a panicking clock, policy or backing
    /// allocator; the pool stays usable), or when called from inside this
    /// pool's own backing allocator or policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// let block = pool.allocate(100)?;
    /// assert_eq!(pool.stats().bytes_in_use, 100);
    /// drop(block);
    /// assert_eq!(pool.stats().blocks_cached, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allocate(&self, size: usize) -> Result<LocalBlock<A, P, C>, PoolError<A::Error>> {
        let block = self.pool.borrow_mut().allocate(size)?;
        Ok(LocalBlock {
            pool: Rc::clone(&self.pool),
            block: ManuallyDrop::new(block),
            size,
        })
    }

    /// Runs `f` on the pool: statistics, `collect`, `trim`, configuration.
    ///
    /// # Panics
    ///
    /// When a [`LocalBlock`] of this pool is dropped inside `f`, or `f` is
    /// called from inside this pool's backing allocator or policy (the pool
    /// is borrowed); when `f` panics.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// drop(pool.allocate(64)?);
    /// assert_eq!(pool.with(|p| p.trim()), 64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with<R>(&self, f: impl FnOnce(&mut DecayingPool<A, P, C>) -> R) -> R {
        f(&mut self.pool.borrow_mut())
    }

    /// The pool's statistics ([`DecayingPool::stats`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.stats().misses, 0);
    /// ```
    pub fn stats(&self) -> Stats {
        self.pool.borrow().stats()
    }

    /// Runs the policy now ([`DecayingPool::collect`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.collect(), 0);
    /// ```
    pub fn collect(&self) -> usize {
        self.pool.borrow_mut().collect()
    }

    /// Frees every cached block ([`DecayingPool::trim`]); returns the bytes
    /// freed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// drop(pool.allocate(10)?);
    /// assert_eq!(pool.trim(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trim(&self) -> usize {
        self.pool.borrow_mut().trim()
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Clone for LocalPool<A, P, C> {
    /// Another handle to the same pool.
    fn clone(&self) -> Self {
        LocalPool {
            pool: Rc::clone(&self.pool),
        }
    }
}

impl<A, P, C> fmt::Debug for LocalPool<A, P, C>
where
    A: RawAllocator + fmt::Debug,
    P: Policy,
    C: Clock + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pool.try_borrow() {
            Ok(pool) => f.debug_tuple("LocalPool").field(&*pool).finish(),
            Err(_) => f.write_str("LocalPool(<borrowed>)"),
        }
    }
}

/// A block from a [`LocalPool`], given back to it, with the size it was
/// allocated with, when dropped. Derefs to the block handle.
///
/// # Examples
///
/// ```
/// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
/// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
/// let block = pool.allocate(16)?;
/// let ptr: core::ptr::NonNull<u8> = *block;
/// assert_eq!(block.size(), 16);
/// # let _ = ptr;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LocalBlock<A: RawAllocator, P: Policy = FixedTime, C: Clock = MonotonicClock> {
    pool: Rc<RefCell<DecayingPool<A, P, C>>>,
    block: ManuallyDrop<A::Block>,
    size: usize,
}

impl<A: RawAllocator, P: Policy, C: Clock> LocalBlock<A, P, C> {
    /// The size asked for.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// assert_eq!(pool.allocate(3)?.size(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn size(&self) -> usize {
        self.size
    }
}

/// A backing allocator whose blocks are host memory: each block names
/// ([`host_ptr`](HostMemory::host_ptr)) the first of as many bytes as it
/// was allocated with, valid for reads and writes, and owned by whoever
/// holds the block. [`LocalBlock`] and [`Pooled`](crate::Pooled) offer
/// safe byte views over such blocks.
///
/// The host allocators implement it, the pools over them, plain
/// ([`DecayingPool`]) and packed ([`PackedPool`](crate::PackedPool)), and
/// [`Mapped`](crate::pages::Mapped) over [`HostPages`](crate::pages::HostPages)
/// (whose blocks are addresses inside its reservation).
///
/// # Safety
///
/// For every block `allocate(size)` returns, `host_ptr(&block)` must point
/// to `size` bytes of memory that stay valid for reads and writes, and are
/// not accessed by anyone else in the process, until the block is given
/// back to `deallocate`.
pub unsafe trait HostMemory: RawAllocator {
    /// The block's first byte.
    fn host_ptr(block: &Self::Block) -> NonNull<u8>;
}

// SAFETY: `SystemAllocator` hands out `std::alloc` memory of the size asked for.
unsafe impl HostMemory for crate::backend::SystemAllocator {
    #[inline]
    fn host_ptr(block: &NonNull<u8>) -> NonNull<u8> {
        *block
    }
}
// SAFETY: `MmapAllocator` hands out private anonymous read-write mappings of
// at least the size asked for.
#[cfg(unix)]
unsafe impl HostMemory for crate::backend::MmapAllocator {
    #[inline]
    fn host_ptr(block: &NonNull<u8>) -> NonNull<u8> {
        *block
    }
}
// SAFETY: a pool hands out its backing allocator's blocks, allocated with
// the request's class size (at least the size asked for), to one user at a
// time.
unsafe impl<A: HostMemory, P: Policy, C: Clock> HostMemory for DecayingPool<A, P, C> {
    #[inline]
    fn host_ptr(block: &A::Block) -> NonNull<u8> {
        A::host_ptr(block)
    }
}
// SAFETY: a packed pool hands out either an exact block of its
// `DecayingPool<A>` (`HostMemory` above), allocated with at least the size
// asked for (the request rounded up, or a larger cached class), or a block
// carved from a segment: the segment is a block of that same pool, so
// `seg.bytes` of host memory, and the carved block is its address plus an
// offset (`Packable::carve`, whose `host_ptr` is the segment's plus that
// offset), spanning whole units of at least `size` bytes that lie inside
// the segment and overlap no other live carved block (the segment's free
// ranges hand each unit to one block at a time). Either way the memory is
// the caller's alone until it is released.
unsafe impl<A, P, C> HostMemory for crate::packing::PackedPool<A, P, C>
where
    A: HostMemory + crate::packing::Packable,
    P: Policy,
    C: Clock,
{
    #[inline]
    fn host_ptr(block: &A::Block) -> NonNull<u8> {
        A::host_ptr(block)
    }
}

impl<A: HostMemory, P: Policy, C: Clock> LocalBlock<A, P, C> {
    /// The block's bytes, possibly uninitialised (a hit returns the bytes
    /// the previous user left).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// let block = pool.allocate(8)?;
    /// assert_eq!(block.as_uninit().len(), 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_uninit(&self) -> &[MaybeUninit<u8>] {
        // SAFETY: `HostMemory`: the block points to `size` bytes valid for
        // reads and owned by this guard; `MaybeUninit` admits any content.
        unsafe { core::slice::from_raw_parts(A::host_ptr(&self.block).as_ptr().cast(), self.size) }
    }

    /// The block's bytes, possibly uninitialised, for writing.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::mem::MaybeUninit;
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
    /// let mut block = pool.allocate(8)?;
    /// block.as_uninit_mut()[0] = MaybeUninit::new(42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: as in `as_uninit`, and `&mut self` makes the view unique.
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
    /// use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};
    /// let pool = LocalPool::new(DecayingPool::new(SystemAllocator::new(), FixedTime::default()));
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

impl<A: RawAllocator, P: Policy, C: Clock> Deref for LocalBlock<A, P, C> {
    type Target = A::Block;

    fn deref(&self) -> &A::Block {
        &self.block
    }
}

impl<A: RawAllocator, P: Policy, C: Clock> Drop for LocalBlock<A, P, C> {
    /// Releases the block. If the pool is borrowed at that moment (the guard
    /// is dropped inside [`LocalPool::with`], or by the pool's own backing
    /// allocator or policy), the release cannot happen: the block stays
    /// counted in use and is leaked, never freed twice.
    fn drop(&mut self) {
        // SAFETY: `block` is taken exactly once, here.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        if let Ok(mut pool) = self.pool.try_borrow_mut() {
            // SAFETY: `block` came from `allocate(self.size)` on this pool
            // and the guard, its only owner, is gone.
            unsafe { pool.release(block, self.size) };
        }
    }
}

impl<A, P, C> fmt::Debug for LocalBlock<A, P, C>
where
    A: RawAllocator,
    A::Block: fmt::Debug,
    P: Policy,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBlock")
            .field("block", &*self.block)
            .field("size", &self.size)
            .finish()
    }
}
