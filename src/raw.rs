//! The costly allocator a pool sits in front of.

/// A costly allocator: CUDA device memory, pinned host memory, `mmap`
/// regions, or anything else whose allocate and free take micro- to
/// milliseconds.
///
/// A [`DecayingPool`](crate::DecayingPool) owns one and calls it only on a
/// miss (`allocate`) and when a cached block leaves the cache (`deallocate`).
/// The pool implements this trait itself, so pools and adaptors stack.
///
/// # Examples
///
/// A toy allocator that hands out offsets into an address space:
///
/// ```
/// use decaying_pool::RawAllocator;
///
/// struct Bump { next: usize }
///
/// impl RawAllocator for Bump {
///     type Block = usize;
///     type Error = &'static str;
///     fn allocate(&mut self, size: usize) -> Result<usize, Self::Error> {
///         let at = self.next;
///         self.next = self.next.checked_add(size).ok_or("address space exhausted")?;
///         Ok(at)
///     }
///     unsafe fn deallocate(&mut self, _block: usize, _size: usize) {}
/// }
///
/// let mut bump = Bump { next: 0 };
/// assert_eq!(bump.allocate(16), Ok(0));
/// assert_eq!(bump.allocate(16), Ok(16));
/// ```
pub trait RawAllocator {
    /// What `allocate` hands out: a pointer, a device pointer, a handle, an offset…
    type Block;
    /// Why `allocate` failed.
    type Error: core::fmt::Debug + core::fmt::Display;

    /// Allocates a block of `size` bytes.
    ///
    /// # Errors
    ///
    /// Whatever the allocator reports; a pool treats every error as "out of
    /// memory" and runs its retry ladder before passing it on.
    fn allocate(&mut self, size: usize) -> Result<Self::Block, Self::Error>;

    /// Gives `block` back.
    ///
    /// # Safety
    ///
    /// - `block` came from `self.allocate(size)`, with this same `size`;
    /// - `block` has not been deallocated since, and is not used again.
    unsafe fn deallocate(&mut self, block: Self::Block, size: usize);

    /// A number that identifies a live `block` (its address), or `None`
    /// (the default). Debug builds of a
    /// [`DecayingPool`](crate::DecayingPool) use it to check that every
    /// block is released with the size it was allocated with, and panic,
    /// naming both sizes, when it is not.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{RawAllocator, SystemAllocator};
    /// let mut alloc = SystemAllocator::new();
    /// let block = alloc.allocate(8)?;
    /// assert_eq!(alloc.block_key(&block), Some(block.as_ptr() as usize));
    /// // SAFETY: `block` came from `alloc.allocate(8)` and is not used again.
    /// unsafe { alloc.deallocate(block, 8) };
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    fn block_key(&self, block: &Self::Block) -> Option<usize> {
        let _ = block;
        None
    }

    /// The most bytes this allocator could ever have handed out at once,
    /// if it knows a bound (the default: `None`, no known bound): a
    /// device's total memory, a byte limit, the machine's memory. A request
    /// above it can never succeed, however much is given back first.
    ///
    /// A [`DecayingPool`](crate::DecayingPool) reads it on every miss,
    /// before it frees anything for the request: a class above it fails at
    /// once with [`PoolError::TooLarge`](crate::PoolError::TooLarge), no
    /// backing call made and the cache kept. So it must be cheap (read a
    /// number, not a file), and it must never be below what `allocate`
    /// could serve, or the pool refuses requests the allocator would have
    /// served. The host allocators report the machine's memory as Linux
    /// bounds it (see [`SystemAllocator`](crate::SystemAllocator)); the
    /// CUDA allocators the device's total memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::RawAllocator;
    ///
    /// /// A device with 1 KiB of memory.
    /// struct Tiny { used: usize }
    ///
    /// impl RawAllocator for Tiny {
    ///     type Block = usize;
    ///     type Error = &'static str;
    ///     fn allocate(&mut self, size: usize) -> Result<usize, Self::Error> {
    ///         if self.used + size > 1024 { return Err("out of memory") }
    ///         self.used += size;
    ///         Ok(self.used - size)
    ///     }
    ///     unsafe fn deallocate(&mut self, _block: usize, size: usize) { self.used -= size }
    ///     fn capacity(&self) -> Option<usize> { Some(1024) }
    ///     fn available(&self) -> Option<usize> { Some(1024 - self.used) }
    /// }
    ///
    /// let tiny = Tiny { used: 0 };
    /// assert_eq!((tiny.capacity(), tiny.available()), (Some(1024), Some(1024)));
    /// ```
    #[inline]
    fn capacity(&self) -> Option<usize> {
        None
    }

    /// How many bytes `allocate` could hand out now, without anything
    /// given back to it first, if it can tell (the default: `None`): a
    /// device's free memory.
    ///
    /// A [`DecayingPool`](crate::DecayingPool) reads it only after a
    /// backing `allocate` failed, before its retry ladder frees anything:
    /// when the class is more than this plus every byte the pool has
    /// cached, freeing the cache cannot help, so the pool returns the
    /// backing error at once and keeps its cache. It may be an estimate,
    /// but should not be below the truth (a low figure makes the pool give
    /// up where freeing its cache would have let the retry succeed). Where
    /// the figure is unreliable, as on a host that overcommits memory,
    /// report `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{RawAllocator, SystemAllocator};
    /// // Linux overcommits host memory: what is free says little.
    /// assert_eq!(SystemAllocator::new().available(), None);
    /// ```
    #[inline]
    fn available(&self) -> Option<usize> {
        None
    }

    /// For an allocator whose memory moves between blocks (pages mapped
    /// into virtual ranges, [`pages::Mapped`](crate::pages::Mapped)): the
    /// bytes it holds and could hand out again without asking its own
    /// backing for more, memory of blocks given back to it. `None` (the
    /// default) for an allocator whose blocks are its backing's own.
    ///
    /// A [`DecayingPool`](crate::DecayingPool) reads it on a miss: while
    /// the spare bytes are fewer than the request's class, it gives cached
    /// blocks back oldest first ([`Reason::Remapped`](crate::Reason::Remapped))
    /// so that their memory serves the request instead of new memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{RawAllocator, SystemAllocator};
    /// assert_eq!(SystemAllocator::new().spare(), None);
    /// ```
    #[inline]
    fn spare(&self) -> Option<usize> {
        None
    }

    /// Gives all the [`spare`](Self::spare) memory back to the allocator's
    /// own backing; returns the bytes given back (the default: 0). A
    /// [`DecayingPool`](crate::DecayingPool) calls it on
    /// [`trim`](crate::DecayingPool::trim).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{RawAllocator, SystemAllocator};
    /// assert_eq!(SystemAllocator::new().release_spare(), 0);
    /// ```
    #[inline]
    fn release_spare(&mut self) -> usize {
        0
    }

    /// Gives back the [`spare`](Self::spare) memory that the allocator's
    /// own decay says is due (for [`pages::Mapped`](crate::pages::Mapped):
    /// spare for longer than its time-to-live); returns the bytes (the
    /// default: 0). A [`DecayingPool`](crate::DecayingPool) calls it on
    /// every [`collect`](crate::DecayingPool::collect), so a reaper drives
    /// it.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{RawAllocator, SystemAllocator};
    /// assert_eq!(SystemAllocator::new().collect_spare(), 0);
    /// ```
    #[inline]
    fn collect_spare(&mut self) -> usize {
        0
    }

    /// For an allocator of mapped pages ([`pages::Mapped`](crate::pages::Mapped)):
    /// its page figures, which a [`DecayingPool`](crate::DecayingPool)'s
    /// [`Stats`](crate::Stats) carry (pages created and released, maps,
    /// unmaps, spare bytes). `None` (the default) for any other allocator.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{RawAllocator, SystemAllocator};
    /// assert_eq!(SystemAllocator::new().pages(), None);
    /// ```
    #[inline]
    fn pages(&self) -> Option<crate::pages::MappedStats> {
        None
    }

    /// Internal, not covered by semver: whether `error` defers the request
    /// rather than fails it. The allocator made no call and changed
    /// nothing, and asks its caller to come back once it has what the
    /// request needs. A [`DecayingPool`](crate::DecayingPool) (and a
    /// [`PackedPool`](crate::PackedPool) above it) passes such an error up
    /// at once, as it left the allocator: no retry, nothing freed for it,
    /// nothing counted. The packing layer of a
    /// [`SharedPool`](crate::SharedPool) takes its backing blocks this way,
    /// to make the call outside its lock. `false` (the default) for every
    /// other allocator.
    #[doc(hidden)]
    #[inline]
    fn is_deferral(error: &Self::Error) -> bool
    where
        Self: Sized,
    {
        let _ = error;
        false
    }
}

/// The provided [`RawAllocator`] methods for spare memory and pages
/// ([`spare`](RawAllocator::spare), [`release_spare`](RawAllocator::release_spare),
/// [`collect_spare`](RawAllocator::collect_spare), [`pages`](RawAllocator::pages)),
/// passed on to the allocator in field `$inner`: for the wrappers that
/// hand out their inner allocator's blocks unchanged.
#[cfg(any(feature = "trace", feature = "testing"))]
macro_rules! forward_spare {
    ($inner:ident) => {
        #[inline]
        fn spare(&self) -> Option<usize> {
            self.$inner.spare()
        }

        #[inline]
        fn release_spare(&mut self) -> usize {
            self.$inner.release_spare()
        }

        #[inline]
        fn collect_spare(&mut self) -> usize {
            self.$inner.collect_spare()
        }

        #[inline]
        fn pages(&self) -> Option<crate::pages::MappedStats> {
            self.$inner.pages()
        }
    };
}
#[cfg(any(feature = "trace", feature = "testing"))]
pub(crate) use forward_spare;

/// Implements [`RawAllocator`] for a pointer type to an allocator by
/// forwarding every method to the allocator it points to.
macro_rules! forward_raw_allocator {
    ($($ptr:ty),+) => {$(
        impl<A: RawAllocator + ?Sized> RawAllocator for $ptr {
            type Block = A::Block;
            type Error = A::Error;

            #[inline]
            fn block_key(&self, block: &Self::Block) -> Option<usize> {
                (**self).block_key(block)
            }

            #[inline]
            fn capacity(&self) -> Option<usize> {
                (**self).capacity()
            }

            #[inline]
            fn available(&self) -> Option<usize> {
                (**self).available()
            }
            #[inline]
            fn spare(&self) -> Option<usize> {
                (**self).spare()
            }
            #[inline]
            fn release_spare(&mut self) -> usize {
                (**self).release_spare()
            }
            #[inline]
            fn collect_spare(&mut self) -> usize {
                (**self).collect_spare()
            }
            #[inline]
            fn pages(&self) -> Option<crate::pages::MappedStats> {
                (**self).pages()
            }

            #[inline]
            fn allocate(&mut self, size: usize) -> Result<Self::Block, Self::Error> {
                (**self).allocate(size)
            }

            #[inline]
            unsafe fn deallocate(&mut self, block: Self::Block, size: usize) {
                // SAFETY: the caller upholds `deallocate`'s contract for the
                // same allocator.
                unsafe { (**self).deallocate(block, size) }
            }
        }
    )+};
}

forward_raw_allocator!(&mut A, Box<A>);

/// A block handle that may be sent to, shared with, and released from any
/// thread: an address, an offset, a device pointer, an id.
///
/// A [`SharedPool`](crate::SharedPool) is `Send + Sync` when its
/// allocator, policy and clock are `Send` and its blocks are `SendBlock`.
/// Raw pointers are not `Send` in Rust, yet the pointer an allocator hands
/// out is only a number until someone dereferences it; this trait says so
/// for the crate's block types (integers, raw and `NonNull` pointers, and
/// tuples and arrays of them). Implement it for your own block type when
/// that holds for it.
///
/// # Safety
///
/// - moving a block of this type to another thread, and reading it from
///   several threads at once, must be sound (it has no thread affinity:
///   no `Rc`, no thread-local state);
/// - the allocator that hands it out must accept it back in `deallocate`
///   from any thread that owns the allocator at the time.
///
/// # Examples
///
/// ```
/// use decaying_pool::SendBlock;
///
/// /// An offset into a device arena.
/// #[derive(Clone, Copy)]
/// struct Offset(u64);
///
/// // SAFETY: an offset is a plain number with no thread affinity.
/// unsafe impl SendBlock for Offset {}
/// ```
pub unsafe trait SendBlock {}

macro_rules! send_block {
    ($($t:ty),*) => { $(
        // SAFETY: integers are plain values with no thread affinity.
        unsafe impl SendBlock for $t {}
    )* };
}
send_block!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

// SAFETY: a pointer handed out by an allocator is an address; the trait's
// contract on the allocator covers releasing it from another thread.
unsafe impl<T: ?Sized> SendBlock for core::ptr::NonNull<T> {}
// SAFETY: as for `NonNull`.
unsafe impl<T: ?Sized> SendBlock for *mut T {}
// SAFETY: as for `NonNull`.
unsafe impl<T: ?Sized> SendBlock for *const T {}
// SAFETY: a pair of sendable handles is sendable.
unsafe impl<T: SendBlock, U: SendBlock> SendBlock for (T, U) {}
// SAFETY: an array of sendable handles is sendable.
unsafe impl<T: SendBlock, const N: usize> SendBlock for [T; N] {}
