use core::fmt;
use core::ptr::NonNull;

use crate::raw::RawAllocator;

/// Anonymous private `mmap` regions: page-aligned, zero-filled on first
/// touch, and really returned to the OS (`munmap`) on deallocate.
///
/// The costly allocator of the host: mapping is cheap but the first touch
/// of every page faults, and unmapping shoots down TLB entries. Sizes are
/// rounded up to whole pages internally; the block is valid for the size
/// asked for.
///
/// # Examples
///
/// ```
/// use decaying_pool::{MmapAllocator, RawAllocator};
///
/// let mut m = MmapAllocator::new();
/// let p = m.allocate(1 << 20).unwrap();
/// assert_eq!(p.as_ptr() as usize % MmapAllocator::page_size(), 0);
/// // SAFETY: the mapping is 1 MiB, readable and writable.
/// unsafe { p.as_ptr().write_bytes(7, 1 << 20) };
/// // SAFETY: `p` came from `m.allocate(1 << 20)` and is not used again.
/// unsafe { m.deallocate(p, 1 << 20) };
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MmapAllocator;

/// Why [`MmapAllocator::allocate`] failed.
///
/// # Examples
///
/// ```
/// use decaying_pool::{MmapAllocator, RawAllocator};
/// let err = MmapAllocator::new().allocate(0).unwrap_err();
/// assert_eq!(err.size, 0);
/// assert!(err.os.is_none());
/// ```
#[derive(Debug)]
pub struct MmapError {
    /// The size asked for.
    pub size: usize,
    /// What the OS said (`None` for a zero or overflowing size).
    pub os: Option<std::io::Error>,
}

impl fmt::Display for MmapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.os {
            Some(e) => write!(f, "cannot map {} bytes: {e}", self.size),
            None => write!(f, "cannot map {} bytes: invalid size", self.size),
        }
    }
}

impl std::error::Error for MmapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.os.as_ref().map(|e| e as _)
    }
}

impl MmapAllocator {
    /// A new mmap allocator.
    ///
    /// # Examples
    ///
    /// ```
    /// let _m = decaying_pool::MmapAllocator::new();
    /// ```
    pub const fn new() -> Self {
        MmapAllocator
    }

    /// The OS page size, to which every mapping is rounded.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(decaying_pool::MmapAllocator::page_size().is_power_of_two());
    /// ```
    pub fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 { p as usize } else { 4096 }
    }

    fn mapped_len(size: usize) -> Option<usize> {
        if size == 0 {
            return None;
        }
        let len = size.checked_next_multiple_of(Self::page_size())?;
        (len <= isize::MAX as usize).then_some(len)
    }
}

impl RawAllocator for MmapAllocator {
    type Block = NonNull<u8>;
    type Error = MmapError;

    fn allocate(&mut self, size: usize) -> Result<NonNull<u8>, MmapError> {
        let Some(len) = Self::mapped_len(size) else {
            return Err(MmapError { size, os: None });
        };
        // SAFETY: a fresh anonymous private mapping at an address of the
        // kernel's choosing aliases nothing; `len` is non-zero.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(MmapError {
                size,
                os: Some(std::io::Error::last_os_error()),
            });
        }
        NonNull::new(p.cast::<u8>()).ok_or(MmapError { size, os: None })
    }

    unsafe fn deallocate(&mut self, block: NonNull<u8>, size: usize) {
        let len = Self::mapped_len(size).expect("the size was valid at allocate");
        // SAFETY: `block` is the start of a mapping of `len` bytes made by
        // `allocate(size)` and not unmapped since (the caller's contract).
        let rc = unsafe { libc::munmap(block.as_ptr().cast(), len) };
        debug_assert_eq!(rc, 0, "munmap failed: {}", std::io::Error::last_os_error());
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
    /// use decaying_pool::{MmapAllocator, RawAllocator};
    /// let bytes = MmapAllocator::new().capacity().unwrap();
    /// assert!(bytes >= 1 << 20 && bytes <= isize::MAX as usize);
    /// ```
    #[inline]
    fn capacity(&self) -> Option<usize> {
        Some(super::host::capacity())
    }
}
