use core::fmt;
use core::ptr::NonNull;
use std::alloc::{Layout, alloc, dealloc};

use crate::raw::RawAllocator;

/// The global allocator (`std::alloc`) with a chosen alignment.
///
/// Blocks are uninitialised `NonNull<u8>` of exactly the size asked for,
/// aligned to [`align`](Self::align) (64 bytes, a cache line, by default).
///
/// # Examples
///
/// ```
/// use decaying_pool::{RawAllocator, SystemAllocator};
///
/// let mut a = SystemAllocator::with_align(4096).unwrap();
/// let p = a.allocate(10_000).unwrap();
/// assert_eq!(p.as_ptr() as usize % 4096, 0);
/// // SAFETY: `p` came from `a.allocate(10_000)` and is not used again.
/// unsafe { a.deallocate(p, 10_000) };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SystemAllocator {
    align: usize,
}

/// Why [`SystemAllocator::allocate`] failed.
///
/// # Examples
///
/// ```
/// use decaying_pool::{backend::AllocError, RawAllocator, SystemAllocator};
/// let err = SystemAllocator::new().allocate(0).unwrap_err();
/// assert_eq!(err, AllocError { size: 0, align: 64 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocError {
    /// The size asked for.
    pub size: usize,
    /// The alignment.
    pub align: usize,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot allocate {} bytes aligned to {} bytes",
            self.size, self.align
        )
    }
}

impl std::error::Error for AllocError {}

impl SystemAllocator {
    /// The default alignment: one cache line.
    pub const DEFAULT_ALIGN: usize = 64;

    /// Blocks aligned to [`Self::DEFAULT_ALIGN`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::SystemAllocator::new().align(), 64);
    /// ```
    pub const fn new() -> Self {
        SystemAllocator {
            align: Self::DEFAULT_ALIGN,
        }
    }

    /// Blocks aligned to `align`, or `None` unless `align` is a power of two.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::SystemAllocator;
    /// assert!(SystemAllocator::with_align(256).is_some());
    /// assert!(SystemAllocator::with_align(3).is_none());
    /// ```
    pub const fn with_align(align: usize) -> Option<Self> {
        if align.is_power_of_two() {
            Some(SystemAllocator { align })
        } else {
            None
        }
    }

    /// The alignment of every block.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::SystemAllocator::with_align(8).unwrap().align(), 8);
    /// ```
    pub const fn align(&self) -> usize {
        self.align
    }
}

impl Default for SystemAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl RawAllocator for SystemAllocator {
    type Block = NonNull<u8>;
    type Error = AllocError;

    /// Fails for a zero size, a size too large for a [`Layout`], or when the
    /// global allocator returns null.
    fn allocate(&mut self, size: usize) -> Result<NonNull<u8>, AllocError> {
        let err = AllocError {
            size,
            align: self.align,
        };
        if size == 0 {
            return Err(err);
        }
        let layout = Layout::from_size_align(size, self.align).map_err(|_| err)?;
        // SAFETY: `layout` has a non-zero size.
        NonNull::new(unsafe { alloc(layout) }).ok_or(err)
    }

    unsafe fn deallocate(&mut self, block: NonNull<u8>, size: usize) {
        // SAFETY: `block` came from `allocate(size)`, which built this same
        // layout successfully, and is freed once (the caller's contract).
        unsafe {
            dealloc(
                block.as_ptr(),
                Layout::from_size_align_unchecked(size, self.align),
            )
        }
    }

    #[inline]
    fn block_key(&self, block: &Self::Block) -> Option<usize> {
        Some(block.as_ptr() as usize)
    }

    /// The machine's memory as Linux bounds one allocation: RAM plus swap
    /// under the default overcommit heuristic (`vm.overcommit_memory =
    /// 0`, which refuses any larger mapping), `CommitLimit` under strict
    /// accounting (`2`), and never more than `RLIMIT_AS` nor the user
    /// address space (47 bits on x86-64, 48 on AArch64). Read once per
    /// process. Elsewhere `isize::MAX`, which no Rust allocation (and no
    /// mapping) exceeds.
    ///
    /// No `available`: an overcommitting host says little about what a
    /// request can get now.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{SystemAllocator, RawAllocator};
    /// let bytes = SystemAllocator::new().capacity().unwrap();
    /// assert!(bytes >= 1 << 20 && bytes <= isize::MAX as usize);
    /// ```
    #[inline]
    fn capacity(&self) -> Option<usize> {
        Some(super::host::capacity())
    }
}
