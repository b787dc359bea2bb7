//! The host backend (Linux): pages are slots of a `memfd` file, mapped with
//! `MAP_FIXED | MAP_SHARED` into `PROT_NONE` reservations.

use core::fmt;
use core::ptr::NonNull;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use fixedbitset::FixedBitSet;

use super::slots::{Slots, first_run, trailing_ones};
use super::{PageBackend, PageCounts, PageError, check_size, next_owner};

/// Physical host memory in pages, on Linux: one `memfd_create` file whose
/// slots of [`granularity`](PageBackend::granularity) bytes are the pages.
///
/// - A page is a slot of the file. The file grows with `ftruncate` (which
///   allocates nothing: the new slots are holes); a released page's slot is
///   punched out (`fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`),
///   so its memory really goes back, and is reused by the next page created.
/// - A reservation is `mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS |
///   MAP_NORESERVE)`, aligned to the granularity: address space only.
/// - [`map`](PageBackend::map) is `mmap(MAP_FIXED | MAP_SHARED, PROT_READ |
///   PROT_WRITE)` of the pages' file offsets over the reservation, one call
///   for each run of pages at consecutive file offsets;
///   [`unmap`](PageBackend::unmap) maps `PROT_NONE` anonymous memory over
///   the slots again (`MAP_FIXED`), so the reservation stays whole; the
///   pages keep their bytes in the file.
///
/// **Mappings.** Linux caps a process's mappings (`vm.max_map_count`,
/// 65 530 by default). Pages side by side in a range whose file offsets are
/// consecutive make one kernel mapping, so the backend hands out file
/// offsets in runs: [`create_pages`](PageBackend::create_pages) takes the
/// first run of free slots long enough (else grows the file at its end),
/// and [`create_page`](PageBackend::create_page) the lowest free slot,
/// which keeps the file compact. Pages ordered by [`HostPage`]'s `Ord` (by
/// file offset) and mapped in that order merge best. The unmapped slots of
/// a range are anonymous `PROT_NONE` memory, which merges with its
/// neighbours too: a range costs about two mappings a run of pages mapped.
///
/// The backend checks the caller's side of the contract where it can: a
/// page released while mapped is refused (and kept, its slot never reused).
/// Dropping the backend leaves the ranges not released mapped (the kernel
/// keeps the file while they are): release them first.
///
/// # After `fork`
///
/// The file is shared with a child process, so a backend belongs to the
/// process that made it. In a child, every call that would change the file
/// or the mappings over it (`create_page`, `create_pages`,
/// `release_page`, `map`, `reserve`) fails with [`HostPageError::Forked`]:
/// the child's pool cannot punch holes under the parent's live blocks, nor
/// take slots the parent will hand out. Mapped pages are not inherited
/// (`MADV_DONTFORK`): a child that touches a block mapped before the fork
/// faults instead of writing into the parent's memory. A child that needs
/// host pages makes its own backend.
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{HostPages, PageBackend};
///
/// let mut b = HostPages::new(64 << 10)?;
/// let mut range = b.reserve(1 << 20)?;
/// assert_eq!(range.as_ptr() as usize % (64 << 10), 0);
/// let mut pages = Vec::new();
/// b.create_pages(4, &mut pages)?;
/// b.map(&mut range, 0, &pages)?;
/// // SAFETY: the first four slots (256 KiB) are mapped, readable and writable.
/// unsafe { range.as_ptr().write_bytes(1, 256 << 10) };
/// assert_eq!(b.file_bytes()?, 256 << 10);
/// // SAFETY: nothing uses the range; the pages are unmapped with it.
/// unsafe {
///     b.release_range(range)?;
///     for p in pages {
///         b.release_page(p)?;
///     }
/// }
/// assert_eq!(b.file_bytes()?, 0); // the memory went back
/// # Ok::<(), decaying_pool::pages::HostPageError>(())
/// ```
#[derive(Debug)]
pub struct HostPages {
    owner: u64,
    /// The fork generation of the process that made it ([`forks`]).
    generation: u64,
    fd: OwnedFd,
    granularity: usize,
    counts: PageCounts,
    /// Bit `i`: slot `i` of the file is free (a hole). Its length is the
    /// file's, in slots.
    free: FixedBitSet,
    /// Bit `i`: the page in slot `i` is mapped.
    mapped: FixedBitSet,
}

/// A page of a [`HostPages`]: a slot of its file. Ordered by file offset.
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{HostPages, PageBackend};
/// let mut b = HostPages::with_os_pages()?;
/// let mut pages = Vec::new();
/// b.create_pages(2, &mut pages)?;
/// assert_eq!(pages[1].file_offset(), pages[0].file_offset() + b.granularity() as u64);
/// # for p in pages { unsafe { b.release_page(p)? } }
/// # Ok::<(), decaying_pool::pages::HostPageError>(())
/// ```
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPage {
    // `slot` first: the order is the file's.
    slot: u32,
    owner: u64,
    granularity: usize,
}

impl HostPage {
    /// Where the page lies in the backend's file, in bytes.
    pub fn file_offset(&self) -> u64 {
        u64::from(self.slot) * self.granularity as u64
    }
}

/// A reservation of a [`HostPages`]: address space, and which of its slots
/// show which page.
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{HostPages, PageBackend};
/// let mut b = HostPages::with_os_pages()?;
/// let r = b.reserve(4 * b.granularity())?;
/// assert_eq!((r.len(), r.mapped_pages()), (4 * b.granularity(), 0));
/// // SAFETY: nothing uses the range.
/// unsafe { b.release_range(r)? };
/// # Ok::<(), decaying_pool::pages::HostPageError>(())
/// ```
#[derive(Debug)]
pub struct HostRange {
    owner: u64,
    base: NonNull<u8>,
    slots: Slots,
}

// SAFETY: a `HostRange` is an address and bookkeeping; it gives no access
// to the memory by itself (every access goes through a raw pointer the
// caller dereferences under its own contract), so moving or sharing the
// handle between threads is sound.
unsafe impl Send for HostRange {}
// SAFETY: as for `Send`: `&HostRange` only reads the address and the slots.
unsafe impl Sync for HostRange {}

impl HostRange {
    /// The first address of the reservation.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The length in bytes.
    #[allow(clippy::len_without_is_empty)] // a reservation is never empty
    pub fn len(&self) -> usize {
        self.slots.len_bytes()
    }

    /// How many of its slots are mapped.
    pub fn mapped_pages(&self) -> usize {
        self.slots.mapped_count()
    }

    /// The runs of consecutive mapped slots, as `(offset, pages)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{HostPages, PageBackend};
    /// let mut b = HostPages::with_os_pages()?;
    /// let g = b.granularity();
    /// let mut r = b.reserve(4 * g)?;
    /// let mut pages = Vec::new();
    /// b.create_pages(2, &mut pages)?;
    /// b.map(&mut r, g, &pages)?;
    /// assert_eq!(r.mapped_runs(), vec![(g, 2)]);
    /// # unsafe { b.release_range(r)?; for p in pages { b.release_page(p)? } }
    /// # Ok::<(), decaying_pool::pages::HostPageError>(())
    /// ```
    pub fn mapped_runs(&self) -> Vec<(usize, usize)> {
        self.slots.mapped_runs()
    }
}

/// Why a [`HostPages`] call failed.
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{HostPageError, HostPages, PageBackend, PageError};
/// let mut b = HostPages::with_os_pages()?;
/// let err = b.reserve(1).unwrap_err();
/// assert!(matches!(err, HostPageError::Invalid(PageError::NotAligned { value: 1, .. })));
/// # Ok::<(), HostPageError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum HostPageError {
    /// The call was refused before reaching the OS.
    Invalid(PageError),
    /// A call in a child process on a backend its parent made (see
    /// [`HostPages`], "After `fork`").
    Forked,
    /// The OS refused.
    Os {
        /// The system call (`mmap`, `fallocate`, ...).
        call: &'static str,
        /// What it said.
        source: io::Error,
    },
}

impl HostPageError {
    fn os(call: &'static str) -> Self {
        HostPageError::Os {
            call,
            source: io::Error::last_os_error(),
        }
    }
}

impl From<PageError> for HostPageError {
    fn from(e: PageError) -> Self {
        HostPageError::Invalid(e)
    }
}

impl fmt::Display for HostPageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPageError::Invalid(e) => e.fmt(f),
            HostPageError::Forked => f.write_str(
                "host pages made before a fork belong to the parent process: \
                 a child makes its own backend",
            ),
            HostPageError::Os { call, source } => write!(f, "{call} failed: {source}"),
        }
    }
}

impl std::error::Error for HostPageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HostPageError::Invalid(e) => Some(e),
            HostPageError::Forked => None,
            HostPageError::Os { source, .. } => Some(source),
        }
    }
}

/// The OS page size.
fn os_page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// The number of `fork`s this process descends from since the first
/// backend was made: a child's count is its parent's plus one (a
/// `pthread_atfork` handler, registered once, counts in the child).
fn forks() -> u64 {
    use std::sync::Once;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static FORKS: AtomicU64 = AtomicU64::new(0);
    static REGISTER: Once = Once::new();
    extern "C" fn in_child() {
        FORKS.fetch_add(1, Relaxed);
    }
    REGISTER.call_once(|| {
        // SAFETY: `in_child` is a plain function that only touches an
        // atomic, which is async-signal-safe, as a fork handler must be. A
        // failure to register (no memory) leaves fork undetected, as it was
        // before: the mappings still are not inherited (`MADV_DONTFORK`).
        let _ = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    FORKS.load(Relaxed)
}

/// `bytes` as a file offset.
fn off(bytes: u64) -> Result<libc::off_t, HostPageError> {
    libc::off_t::try_from(bytes).map_err(|_| {
        HostPageError::Invalid(PageError::TooLarge {
            bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
        })
    })
}

/// Maps inaccessible, unreserved-swap anonymous memory over `len` bytes at
/// `addr` (or anywhere with a null `addr` and no `MAP_FIXED`).
///
/// # Safety
///
/// With `fixed`, `addr..addr + len` lies in a reservation of this backend
/// and nothing uses it.
unsafe fn map_none(addr: *mut u8, len: usize, fixed: bool) -> *mut libc::c_void {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let flags = if fixed {
        flags | libc::MAP_FIXED
    } else {
        flags
    };
    // SAFETY: a fresh anonymous mapping, at the kernel's choice of address,
    // aliases nothing; with `MAP_FIXED` it replaces only memory of our own
    // reservation that nothing uses (the caller's contract).
    unsafe { libc::mmap(addr.cast(), len, libc::PROT_NONE, flags, -1, 0) }
}

impl HostPages {
    /// A backend of pages of the OS page size.
    ///
    /// # Errors
    ///
    /// `memfd_create` failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{HostPages, PageBackend};
    /// assert!(HostPages::with_os_pages()?.granularity().is_power_of_two());
    /// # Ok::<(), decaying_pool::pages::HostPageError>(())
    /// ```
    pub fn with_os_pages() -> Result<Self, HostPageError> {
        Self::new(os_page())
    }

    /// A backend of pages of `granularity` bytes, a multiple of the OS page
    /// size (2 MiB, CUDA's, lets transparent huge pages back them where the
    /// system allows). As [`ModelPages::new`](super::ModelPages::new) takes
    /// its granularity, so does this.
    ///
    /// # Errors
    ///
    /// A granularity of zero, or not a multiple of the OS page;
    /// `memfd_create` failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{HostPageError, HostPages, PageBackend, PageError};
    /// assert_eq!(HostPages::new(2 << 20)?.granularity(), 2 << 20);
    /// assert!(matches!(HostPages::new(0), Err(HostPageError::Invalid(PageError::ZeroSize))));
    /// assert!(HostPages::new(1000).is_err());
    /// # Ok::<(), HostPageError>(())
    /// ```
    pub fn new(granularity: usize) -> Result<Self, HostPageError> {
        if granularity == 0 {
            return Err(PageError::ZeroSize.into());
        }
        let page = os_page();
        if granularity % page != 0 {
            return Err(PageError::NotAligned {
                value: granularity,
                granularity: page,
            }
            .into());
        }
        // SAFETY: the name is a NUL-terminated string; the flags are valid.
        let fd = unsafe { libc::memfd_create(c"decaying-pool-pages".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(HostPageError::os("memfd_create"));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(HostPages {
            owner: next_owner(),
            generation: forks(),
            fd,
            granularity,
            counts: PageCounts::default(),
            free: FixedBitSet::new(),
            mapped: FixedBitSet::new(),
        })
    }

    /// The calls made so far (counted as for [`ModelPages`](super::ModelPages)).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{HostPages, PageBackend};
    /// let mut b = HostPages::with_os_pages()?;
    /// let p = b.create_page()?;
    /// // SAFETY: `p` is not mapped.
    /// unsafe { b.release_page(p)? };
    /// assert_eq!((b.counts().created, b.counts().released), (1, 1));
    /// # Ok::<(), decaying_pool::pages::HostPageError>(())
    /// ```
    pub fn counts(&self) -> PageCounts {
        self.counts
    }

    /// The memory the file holds, in bytes (`st_blocks`): the pages written
    /// to and not released.
    ///
    /// # Errors
    ///
    /// `fstat` failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::HostPages;
    /// assert_eq!(HostPages::with_os_pages()?.file_bytes()?, 0);
    /// # Ok::<(), decaying_pool::pages::HostPageError>(())
    /// ```
    pub fn file_bytes(&self) -> Result<u64, HostPageError> {
        let mut st = core::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: the descriptor is open (owned by `self`); `st` has room
        // for a `stat`.
        let rc = unsafe { libc::fstat(self.fd.as_raw_fd(), st.as_mut_ptr()) };
        if rc != 0 {
            return Err(HostPageError::os("fstat"));
        }
        // SAFETY: `fstat` succeeded, so it filled `st`.
        let st = unsafe { st.assume_init() };
        Ok(u64::try_from(st.st_blocks).unwrap_or(0) * 512)
    }

    /// The file's length, in bytes (its holes included).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{HostPages, PageBackend};
    /// let mut b = HostPages::with_os_pages()?;
    /// let p = b.create_page()?;
    /// assert!(b.file_len() >= b.granularity() as u64);
    /// # unsafe { b.release_page(p)? };
    /// # Ok::<(), decaying_pool::pages::HostPageError>(())
    /// ```
    pub fn file_len(&self) -> u64 {
        self.free.len() as u64 * self.granularity as u64
    }

    /// `Err(Forked)` in a child process of the one that made the backend.
    #[inline]
    fn same_process(&self) -> Result<(), HostPageError> {
        if forks() == self.generation {
            Ok(())
        } else {
            Err(HostPageError::Forked)
        }
    }

    fn own_range(&self, range: &HostRange) -> Result<(), PageError> {
        if range.owner == self.owner {
            Ok(())
        } else {
            Err(PageError::ForeignHandle)
        }
    }

    /// A page's slot, checked to be this backend's and live.
    fn slot(&self, page: &HostPage) -> Result<usize, PageError> {
        let s = page.slot as usize;
        if page.owner == self.owner && s < self.free.len() && !self.free.contains(s) {
            Ok(s)
        } else {
            Err(PageError::ForeignHandle)
        }
    }

    /// Grows the file to `slots` slots (holes; no memory).
    fn grow(&mut self, slots: usize) -> Result<(), HostPageError> {
        let old = self.free.len();
        let bytes = (slots as u64).checked_mul(self.granularity as u64);
        let len = off(bytes.unwrap_or(u64::MAX))?;
        // SAFETY: the descriptor is open; growing a file touches no memory.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), len) } != 0 {
            return Err(HostPageError::os("ftruncate"));
        }
        self.free.grow(slots);
        self.mapped.grow(slots);
        self.free.insert_range(old..slots);
        Ok(())
    }

    /// The slot of `count` free slots in a row, the file grown if needed.
    fn take_run(&mut self, count: usize) -> Result<usize, HostPageError> {
        let start = match first_run(&self.free, count) {
            Some(start) => start,
            None => {
                let len = self.free.len();
                let start = len - trailing_ones(&self.free);
                let end = start.checked_add(count).ok_or(PageError::TooManyPages)?;
                // Doubling keeps `ftruncate` calls few: holes cost nothing.
                let target = end.max(len.saturating_mul(2)).min(u32::MAX as usize);
                if end > target {
                    return Err(PageError::TooManyPages.into());
                }
                self.grow(target)?;
                start
            }
        };
        self.free.remove_range(start..start + count);
        Ok(start)
    }

    fn page(&self, slot: usize) -> HostPage {
        // `take_run` keeps every slot below `u32::MAX`.
        HostPage {
            slot: slot as u32,
            owner: self.owner,
            granularity: self.granularity,
        }
    }
}

/// Blocks of [`Mapped`](super::Mapped) over host pages are host memory:
/// [`LocalBlock`](crate::LocalBlock) and [`Pooled`](crate::Pooled) give
/// their safe byte views (`as_uninit`, `as_uninit_mut`, `fill`).
///
/// ```
/// use decaying_pool::pages::{HostPages, Mapped};
/// use decaying_pool::{DecayingPool, FixedCapacity, LocalPool, Packing, SharedPool};
/// let pool = LocalPool::new(DecayingPool::new(Mapped::new(HostPages::new(2 << 20)?), FixedCapacity::new(8)));
/// let mut block = pool.allocate(100)?;
/// assert_eq!(block.fill(7)[99], 7);
/// // Packed, between threads:
/// let packed = DecayingPool::builder(Mapped::new(HostPages::new(2 << 20)?)).packing(Packing::mapped()).build();
/// let shared = SharedPool::packed(packed);
/// assert_eq!(shared.allocate(3 << 20)?.fill(1).len(), 3 << 20);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
// SAFETY: `Mapped` hands out addresses inside a reservation of this
// backend (`range_address` above is `base as usize`, a cast that exposes
// the mapping's provenance, which `with_exposed_provenance_mut` takes
// back), and a live block of `size` bytes lies on pages it mapped read and
// write for the block's life, in no other live block (the mapped layer's
// contract, checked by its model in the `mapped` fuzz target); the
// reservation is not at address zero, where `mmap` places nothing.
unsafe impl<C: crate::Clock> crate::HostMemory for super::Mapped<HostPages, C> {
    #[inline]
    fn host_ptr(block: &usize) -> NonNull<u8> {
        let p = core::ptr::with_exposed_provenance_mut::<u8>(*block);
        // SAFETY: a block's address is inside a reservation, never zero
        // (see the `impl`).
        unsafe { NonNull::new_unchecked(p) }
    }
}

impl PageBackend for HostPages {
    type Range = HostRange;
    type Page = HostPage;
    type Error = HostPageError;

    /// The machine's memory as [`SystemAllocator`](crate::SystemAllocator)
    /// sees it (RAM and swap under the kernel's overcommit rules, the
    /// process's address-space limit, the address space).
    fn capacity(&self) -> Option<usize> {
        Some(crate::backend::host::capacity())
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn reserve(&mut self, bytes: usize) -> Result<HostRange, HostPageError> {
        self.same_process()?;
        let count = check_size(bytes, self.granularity)?;
        let g = self.granularity;
        // Room to align the start to the granularity (`check_size` left it).
        let extra = g - os_page().min(g);
        let len = bytes + extra;
        // SAFETY: no `MAP_FIXED`: the kernel picks free address space.
        let p = unsafe { map_none(core::ptr::null_mut(), len, false) };
        if p == libc::MAP_FAILED {
            return Err(HostPageError::os("mmap"));
        }
        let p = p.cast::<u8>();
        let head = (p as usize).next_multiple_of(g) - p as usize;
        let tail = extra - head;
        // SAFETY: the head and tail lie in the mapping just made, which
        // nothing else knows of.
        unsafe {
            if head > 0 {
                libc::munmap(p.cast(), head);
            }
            if tail > 0 {
                libc::munmap(p.add(head + bytes).cast(), tail);
            }
        }
        // SAFETY: `head < len`, so the pointer stays in the mapping, which
        // `mmap` did not place at address zero.
        let base = unsafe { NonNull::new_unchecked(p.add(head)) };
        self.counts.reserves += 1;
        Ok(HostRange {
            owner: self.owner,
            base,
            slots: Slots::new(count, g),
        })
    }

    fn range_address(&self, range: &HostRange) -> usize {
        range.base.as_ptr() as usize
    }

    fn range_len(&self, range: &HostRange) -> usize {
        range.len()
    }

    unsafe fn release_range(&mut self, mut range: HostRange) -> Result<(), HostPageError> {
        self.own_range(&range)?;
        let len = range.len();
        // SAFETY: the range is a reservation of this backend (checked),
        // which nothing uses any more (the caller's contract).
        if unsafe { libc::munmap(range.base.as_ptr().cast(), len) } != 0 {
            return Err(HostPageError::os("munmap"));
        }
        let n = range.slots.mapped_count();
        if n > 0 {
            let mapped = &mut self.mapped;
            range
                .slots
                .clear(0, range.slots.count(), |s| mapped.remove(s as usize));
            self.counts.unmaps += n as u64;
            self.counts.unmap_calls += 1;
        }
        self.counts.range_frees += 1;
        Ok(())
    }

    fn create_page(&mut self) -> Result<HostPage, HostPageError> {
        self.same_process()?;
        let slot = self.take_run(1)?;
        self.counts.created += 1;
        Ok(self.page(slot))
    }

    /// Takes `count` consecutive slots of the file: the first free run long
    /// enough, else the free end of the file, grown.
    fn create_pages(&mut self, count: usize, out: &mut Vec<HostPage>) -> Result<(), HostPageError> {
        self.same_process()?;
        if count == 0 {
            return Ok(());
        }
        let start = self.take_run(count)?;
        out.extend((start..start + count).map(|s| self.page(s)));
        self.counts.created += count as u64;
        Ok(())
    }

    unsafe fn release_page(&mut self, page: HostPage) -> Result<(), HostPageError> {
        // In a child, a hole punched in the shared file would zero the
        // parent's blocks: the page is kept (the child's copy leaks).
        self.same_process()?;
        let s = self.slot(&page)?;
        if self.mapped.contains(s) {
            // The caller broke the contract: keep the slot, never reuse it.
            return Err(PageError::PageMapped.into());
        }
        let at = off(page.file_offset())?;
        let len = off(self.granularity as u64)?;
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: the descriptor is open; the slot is not mapped anywhere
        // (checked), so dropping its contents changes no memory in use.
        if unsafe { libc::fallocate(self.fd.as_raw_fd(), mode, at, len) } != 0 {
            // Its contents stay: not reused, as a new page must read zero.
            return Err(HostPageError::os("fallocate"));
        }
        self.free.insert(s);
        self.counts.released += 1;
        Ok(())
    }

    fn map(
        &mut self,
        range: &mut HostRange,
        offset: usize,
        pages: &[HostPage],
    ) -> Result<(), HostPageError> {
        self.same_process()?;
        self.own_range(range)?;
        let first = range.slots.run(offset, pages.len())?;
        range.slots.check_unmapped(first, pages.len())?;
        let mut seen = FixedBitSet::with_capacity(self.free.len());
        for p in pages {
            let s = self.slot(p)?;
            if self.mapped.contains(s) || seen.put(s) {
                return Err(PageError::PageMapped.into());
            }
        }
        let g = self.granularity;
        let mut k = 0;
        while k < pages.len() {
            // A run of pages at consecutive file offsets: one mapping.
            let mut n = 1;
            while k + n < pages.len() && pages[k + n].slot == pages[k].slot + n as u32 {
                n += 1;
            }
            let at = off(pages[k].file_offset())?;
            // SAFETY: slots `first + k ..` lie in `range`, a reservation of
            // this backend (checked), and are unmapped (checked), so
            // nothing uses them; `MAP_FIXED` replaces only them. The file
            // range is pages of this backend (checked), mapped nowhere else.
            let p = unsafe {
                libc::mmap(
                    range.base.as_ptr().add((first + k) * g).cast(),
                    n * g,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    self.fd.as_raw_fd(),
                    at,
                )
            };
            if p == libc::MAP_FAILED {
                let err = HostPageError::os("mmap");
                if k > 0 {
                    // SAFETY: the slots this call mapped: nobody has seen them.
                    unsafe { map_none(range.base.as_ptr().add(first * g), k * g, true) };
                }
                return Err(err);
            }
            // Not inherited by a child process (see "After `fork`"); a
            // mapping fresh over a `MAP_FIXED` range takes the flag anew.
            // SAFETY: `p` is the mapping just made, `n * g` bytes; the
            // advice changes no content.
            unsafe { libc::madvise(p, n * g, libc::MADV_DONTFORK) };
            k += n;
        }
        for p in pages {
            self.mapped.insert(p.slot as usize);
        }
        range.slots.set(first, pages.iter().map(|p| p.slot));
        self.counts.maps += pages.len() as u64;
        self.counts.set_access += 1;
        Ok(())
    }

    unsafe fn unmap(
        &mut self,
        range: &mut HostRange,
        offset: usize,
        count: usize,
    ) -> Result<(), HostPageError> {
        self.own_range(range)?;
        let first = range.slots.run(offset, count)?;
        range.slots.check_mapped(first, count)?;
        let g = self.granularity;
        // SAFETY: the slots lie in a reservation of this backend (checked)
        // and nothing uses them any more (the caller's contract).
        let p = unsafe { map_none(range.base.as_ptr().add(first * g), count * g, true) };
        if p == libc::MAP_FAILED {
            return Err(HostPageError::os("mmap"));
        }
        let mapped = &mut self.mapped;
        range
            .slots
            .clear(first, count, |s| mapped.remove(s as usize));
        self.counts.unmaps += count as u64;
        self.counts.unmap_calls += 1;
        Ok(())
    }
}
