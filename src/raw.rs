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
}

impl<A: RawAllocator + ?Sized> RawAllocator for &mut A {
    type Block = A::Block;
    type Error = A::Error;

    #[inline]
    fn allocate(&mut self, size: usize) -> Result<Self::Block, Self::Error> {
        (**self).allocate(size)
    }

    #[inline]
    unsafe fn deallocate(&mut self, block: Self::Block, size: usize) {
        // SAFETY: the caller upholds `deallocate`'s contract for the same allocator.
        unsafe { (**self).deallocate(block, size) }
    }
}

impl<A: RawAllocator + ?Sized> RawAllocator for Box<A> {
    type Block = A::Block;
    type Error = A::Error;

    #[inline]
    fn allocate(&mut self, size: usize) -> Result<Self::Block, Self::Error> {
        (**self).allocate(size)
    }

    #[inline]
    unsafe fn deallocate(&mut self, block: Self::Block, size: usize) {
        // SAFETY: the caller upholds `deallocate`'s contract for the same allocator.
        unsafe { (**self).deallocate(block, size) }
    }
}
