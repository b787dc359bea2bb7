//! Physical memory in equal pages, mapped into reserved virtual ranges.
//!
//! The layer under page-mapped segments and large blocks (the design's
//! "Page-mapped large blocks"): a [`PageBackend`] creates physical pages of
//! one [granularity](PageBackend::granularity), reserves address space, and
//! maps pages into it and out of it again. A page keeps its bytes while it
//! moves from one virtual range to another, so a pool can give a block's
//! memory to another block without a copy, and without freeing anything.
//!
//! | backend | page | reservation | map / unmap |
//! |---|---|---|---|
//! | [`HostPages`] (Linux) | a slot of a `memfd` file | `mmap(PROT_NONE)` | `mmap(MAP_FIXED \| MAP_SHARED)` / `PROT_NONE` over it |
//! | [`ModelPages`] (everywhere) | a number | fake addresses | counted and charged at [`PageCosts::PUBLISHED`] |
//! | `CudaPages` (feature **`cuda`**) | `cuMemCreate` | `cuMemAddressReserve` | `cuMemMap` + `cuMemSetAccess` / `cuMemUnmap` |
//!
//! # The contract
//!
//! What may break memory safety is making memory that someone may still use
//! inaccessible, or letting one physical page back two places at once:
//!
//! - [`map`](PageBackend::map) is safe: it only makes inaccessible slots
//!   accessible, and a backend refuses to map over a mapped slot or to map a
//!   page that is mapped already, so no page ever shows at two addresses;
//! - [`unmap`](PageBackend::unmap) and
//!   [`release_range`](PageBackend::release_range) are `unsafe`: the caller
//!   promises that nothing uses those addresses any more (on a GPU: that
//!   the work queued before the block's release is done);
//! - [`release_page`](PageBackend::release_page) is `unsafe`: the page must
//!   not be mapped, for a backend may hand its memory out again at once.
//!   The host and modelled backends check it anyway and refuse.
//!
//! # Examples
//!
//! ```
//! use decaying_pool::pages::{ModelPages, PageBackend};
//!
//! let mut b = ModelPages::new(2 << 20)?;
//! let mut range = b.reserve(8 << 20)?;
//! let mut pages = Vec::new();
//! b.create_pages(2, &mut pages)?;
//! b.map(&mut range, 0, &pages)?;
//! // The same two pages move to the back of the range.
//! // SAFETY: nothing uses the range's addresses.
//! unsafe { b.unmap(&mut range, 0, 2)? };
//! b.map(&mut range, 4 << 20, &pages)?;
//! // SAFETY: nothing uses the range; the pages are unmapped with it.
//! unsafe {
//!     b.release_range(range)?;
//!     for p in pages {
//!         b.release_page(p)?;
//!     }
//! }
//! b.validate_released()?;
//! let c = b.counts();
//! assert_eq!((c.created, c.maps, c.unmaps, c.set_access), (2, 4, 4, 2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::fmt;
use core::time::Duration;

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(target_os = "linux")]
mod host;
mod mapped;
mod model;
mod slots;

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use cuda::{CudaPage, CudaPageError, CudaPages, CudaRange};
#[cfg(target_os = "linux")]
#[cfg_attr(docsrs, doc(cfg(target_os = "linux")))]
pub use host::{HostPage, HostPageError, HostPages, HostRange};
pub use mapped::{
    DEFAULT_ALIGN, DEFAULT_SPARE_TTL, Mapped, MappedError, MappedStats, RECOMMENDED_PAGE,
    page_size_for,
};
pub use model::{ModelPage, ModelPages, ModelRange};

/// Physical memory in pages of one granularity, mapped into reserved
/// virtual ranges.
///
/// Offsets and lengths of ranges are bytes, multiples of
/// [`granularity`](Self::granularity); counts of pages are pages. A
/// reservation is divided into *slots* of one granularity each, each either
/// unmapped (inaccessible) or showing one page.
///
/// Handles are not `Clone`: a page or range is released once, by value.
/// Implementations must refuse, with an error and no effect: sizes that are
/// zero, not a multiple of the granularity, or that overflow; offsets
/// outside the range; mapping over a mapped slot; mapping a page that is
/// mapped already (anywhere); unmapping a slot that is not mapped; handles
/// of another backend. A failed [`map`](Self::map) leaves nothing mapped.
///
/// # Examples
///
/// A run of pages mapped, written, and moved into another range, where the
/// same bytes show (Linux, the host backend):
///
/// ```
/// # #[cfg(target_os = "linux")] {
/// use decaying_pool::pages::{HostPages, PageBackend};
///
/// let mut b = HostPages::with_os_pages()?;
/// let g = b.granularity();
/// let (mut first, mut second) = (b.reserve(4 * g)?, b.reserve(4 * g)?);
/// let mut pages = Vec::new();
/// b.create_pages(2, &mut pages)?;
/// b.map(&mut first, g, &pages)?;
/// let p = b.range_address(&first) as *mut u8;
/// // SAFETY: slots 1 and 2 of `first` are mapped, readable and writable.
/// unsafe { p.add(g).write_bytes(7, 2 * g) };
/// // SAFETY: nothing uses `first`'s addresses any more.
/// unsafe { b.unmap(&mut first, g, 2)? };
/// b.map(&mut second, 0, &pages)?;
/// let q = b.range_address(&second) as *const u8;
/// // SAFETY: slot 1 of `second` is mapped; it shows the second page.
/// assert_eq!(unsafe { q.add(g + 5).read() }, 7);
/// // SAFETY: nothing uses either range; their pages are unmapped with them.
/// unsafe {
///     b.release_range(first)?;
///     b.release_range(second)?;
///     for p in pages {
///         b.release_page(p)?;
///     }
/// }
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait PageBackend {
    /// A reservation of address space (with the state of its slots).
    type Range;
    /// One physical page of [`granularity`](Self::granularity) bytes.
    type Page;
    /// Why a call failed.
    type Error: fmt::Debug + fmt::Display;

    /// The size of every page, in bytes (a multiple of the OS page; 2 MiB
    /// for CUDA's recommended granularity).
    fn granularity(&self) -> usize;

    /// The most bytes of pages the backend could ever hold at once, when
    /// known: the device's memory, the machine's for host pages, a model's
    /// capacity. [`Mapped`] takes it as its
    /// [`capacity`](crate::RawAllocator::capacity) (unless told another
    /// with [`with_capacity`](crate::pages::Mapped::with_capacity)), so a
    /// request above it is refused at once as too large, before any
    /// address space is reserved. `None` (the default): unknown.
    fn capacity(&self) -> Option<usize> {
        None
    }

    /// Reserves `bytes` of address space, none of it mapped. The address is
    /// aligned to the granularity.
    ///
    /// # Errors
    ///
    /// `bytes` zero, not a multiple of the granularity, or too large; the
    /// platform's refusal.
    fn reserve(&mut self, bytes: usize) -> Result<Self::Range, Self::Error>;

    /// The first address of `range`.
    fn range_address(&self, range: &Self::Range) -> usize;

    /// The length of `range` in bytes.
    fn range_len(&self, range: &Self::Range) -> usize;

    /// Unmaps whatever is still mapped in `range` (the pages stay the
    /// caller's, unmapped) and frees the reservation.
    ///
    /// # Errors
    ///
    /// A range of another backend; the platform's refusal (the reservation
    /// may then be lost, never reused).
    ///
    /// # Safety
    ///
    /// As for [`unmap`](Self::unmap) over the whole range: nothing uses any
    /// address of `range` any more, nor will.
    unsafe fn release_range(&mut self, range: Self::Range) -> Result<(), Self::Error>;

    /// Creates one physical page of [`granularity`](Self::granularity)
    /// bytes (zero-filled on the host).
    ///
    /// # Errors
    ///
    /// Out of memory, or the platform's refusal.
    fn create_page(&mut self) -> Result<Self::Page, Self::Error>;

    /// Creates `count` pages and appends them to `out`, as a run that a
    /// backend keeps together where it can (the host backend takes
    /// consecutive offsets of its file, so mapping them side by side makes
    /// one kernel mapping). The default creates them one by one.
    ///
    /// # Errors
    ///
    /// As [`create_page`](Self::create_page); the pages created before the
    /// failure are in `out`, the caller's to release.
    fn create_pages(&mut self, count: usize, out: &mut Vec<Self::Page>) -> Result<(), Self::Error> {
        out.reserve(count);
        for _ in 0..count {
            out.push(self.create_page()?);
        }
        Ok(())
    }

    /// Gives `page` back: its memory returns to the platform.
    ///
    /// # Errors
    ///
    /// A page of another backend, or (where the backend checks) a page
    /// still mapped, which is then kept, never reused; the platform's
    /// refusal.
    ///
    /// # Safety
    ///
    /// `page` is not mapped (every map of it was unmapped). A backend may
    /// hand the page's memory out again at once (the host backend gives its
    /// file offset to the next page it creates), so a page released while
    /// mapped would show one piece of memory at two addresses.
    unsafe fn release_page(&mut self, page: Self::Page) -> Result<(), Self::Error>;

    /// Maps `pages` into consecutive slots of `range` from `offset` (bytes)
    /// on, readable and writable: `pages[i]` shows at
    /// `range_address + offset + i * granularity`. One call maps a run (and
    /// sets its access once, where the platform needs that step: CUDA's
    /// `cuMemSetAccess`).
    ///
    /// # Errors
    ///
    /// No pages; `offset` not a multiple of the granularity, or the run
    /// past the end of `range`; a slot of the run mapped already; a page
    /// mapped already or named twice; a handle of another backend; the
    /// platform's refusal. On error nothing is mapped.
    fn map(
        &mut self,
        range: &mut Self::Range,
        offset: usize,
        pages: &[Self::Page],
    ) -> Result<(), Self::Error>;

    /// Unmaps `count` slots of `range` from `offset` (bytes) on; they become
    /// inaccessible again, their pages (still the caller's) keep their bytes.
    /// The slots may have been mapped by different calls.
    ///
    /// # Errors
    ///
    /// `count` zero; `offset` not a multiple of the granularity, or the run
    /// past the end of `range`; a slot of the run not mapped; the
    /// platform's refusal.
    ///
    /// # Safety
    ///
    /// Nothing uses those addresses any more: no reference into them lives,
    /// no pointer into them is read or written after the call, and on a GPU
    /// no work queued before the call may still touch them.
    unsafe fn unmap(
        &mut self,
        range: &mut Self::Range,
        offset: usize,
        count: usize,
    ) -> Result<(), Self::Error>;

    /// Marks the work queued so far on the memory's users and returns a
    /// ticket for it: [`Mapped`] takes one when a block is given back and
    /// [`wait`](Self::wait)s on the ticket before it unmaps a page the
    /// block touched, so that no page is unmapped while work queued before
    /// the release may still use it. Tickets grow: waiting on one covers
    /// every earlier one.
    ///
    /// The default returns 0, for memory whose users are done with a block
    /// when they give it back (host memory). The CUDA backend records an
    /// event on its stream (`cuEventRecord`).
    ///
    /// # Errors
    ///
    /// The platform's refusal; [`Mapped`] then waits for all the work
    /// queued (`wait(u64::MAX)`) before it unmaps the block's pages.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{ModelPages, PageBackend};
    /// // The modelled device numbers its fences (a real one's tickets grow too).
    /// let mut b = ModelPages::new(4096)?;
    /// let (t1, t2) = (b.fence()?, b.fence()?);
    /// assert!(t1 < t2);
    /// b.wait(t2)?; // covers t1
    /// assert_eq!(b.counts().fences, 2);
    /// # Ok::<(), decaying_pool::pages::PageError>(())
    /// ```
    #[inline]
    fn fence(&mut self) -> Result<u64, Self::Error> {
        Ok(0)
    }

    /// Returns once the work marked by `ticket` (a [`fence`](Self::fence)'s
    /// ticket, or any smaller number) is done; `u64::MAX` waits for all the
    /// work queued. The default returns at once.
    ///
    /// # Errors
    ///
    /// The platform's refusal; [`Mapped`] then leaves the pages mapped.
    #[inline]
    fn wait(&mut self, ticket: u64) -> Result<(), Self::Error> {
        let _ = ticket;
        Ok(())
    }
}

/// Why a page call was refused: the checks every backend makes (the
/// modelled backend's error, and [`HostPageError::Invalid`]).
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{ModelPages, PageBackend, PageError};
///
/// let mut b = ModelPages::new(4096)?;
/// assert_eq!(b.reserve(0).unwrap_err(), PageError::ZeroSize);
/// assert_eq!(
///     b.reserve(5000).unwrap_err(),
///     PageError::NotAligned { value: 5000, granularity: 4096 }
/// );
/// assert_eq!(b.reserve(usize::MAX - 4095).unwrap_err(), PageError::TooLarge { bytes: usize::MAX - 4095 });
/// # Ok::<(), PageError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PageError {
    /// A size or count of zero (a granularity, a reservation, a run).
    ZeroSize,
    /// A size or offset that is not a multiple of the granularity.
    NotAligned {
        /// The size or offset.
        value: usize,
        /// The granularity it should be a multiple of.
        granularity: usize,
    },
    /// A size too large for the address space (or that overflows).
    TooLarge {
        /// The size asked for.
        bytes: usize,
    },
    /// A run that reaches past the end of its range.
    OutOfRange {
        /// Where the run starts, in bytes.
        offset: usize,
        /// How many pages it has.
        count: usize,
        /// The range's length, in bytes.
        len: usize,
    },
    /// Mapping over a slot that is mapped already.
    SlotMapped {
        /// The slot's offset in its range, in bytes.
        offset: usize,
    },
    /// Unmapping a slot that is not mapped.
    SlotUnmapped {
        /// The slot's offset in its range, in bytes.
        offset: usize,
    },
    /// Mapping a page that is mapped already (or named twice in one run),
    /// or releasing a page that is still mapped.
    PageMapped,
    /// A handle of another backend.
    ForeignHandle,
    /// The modelled device's capacity is taken by live pages.
    OutOfMemory {
        /// The capacity, in bytes.
        capacity: usize,
    },
    /// More pages than the backend can number (2³² − 1 at once).
    TooManyPages,
    /// Unmapping addresses that work queued on the modelled device may
    /// still use ([`ModelPages::queue_work`]): no fence taken after the
    /// work has been waited on. On a real device this would be undefined
    /// behaviour; the model refuses it and counts it.
    QueuedWork {
        /// The first address the work and the unmapped slots share.
        address: usize,
    },
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PageError::ZeroSize => f.write_str("a size or count of zero"),
            PageError::NotAligned { value, granularity } => {
                write!(
                    f,
                    "{value} is not a multiple of the page granularity {granularity}"
                )
            }
            PageError::TooLarge { bytes } => write!(f, "{bytes} bytes is too large"),
            PageError::OutOfRange { offset, count, len } => write!(
                f,
                "{count} pages at offset {offset} reach past the end of a range of {len} bytes"
            ),
            PageError::SlotMapped { offset } => {
                write!(f, "the slot at offset {offset} is mapped already")
            }
            PageError::SlotUnmapped { offset } => {
                write!(f, "the slot at offset {offset} is not mapped")
            }
            PageError::PageMapped => f.write_str("the page is mapped (already, or still)"),
            PageError::ForeignHandle => f.write_str("a handle of another page backend"),
            PageError::OutOfMemory { capacity } => {
                write!(
                    f,
                    "out of memory: the capacity of {capacity} bytes is taken by live pages"
                )
            }
            PageError::TooManyPages => f.write_str("too many pages to number"),
            PageError::QueuedWork { address } => write!(
                f,
                "unmapping {address:#x}, which work queued before the last fence waited on may still use"
            ),
        }
    }
}

impl std::error::Error for PageError {}

/// The page calls a backend made, counted as the CUDA driver calls they
/// stand for (`cuMemCreate`, `cuMemMap`, ...).
///
/// `maps` and `unmaps` count pages (CUDA maps and unmaps one physical handle
/// a call); `set_access` and `unmap_calls` count runs, one a
/// [`map`](PageBackend::map) or [`unmap`](PageBackend::unmap) call (with
/// the implicit unmap of a [`release_range`](PageBackend::release_range)):
/// `cca_sim.py`'s `maps` and `unmaps` for expandable segments count runs, so
/// compare them with `set_access` and `unmap_calls`.
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::PageCounts;
/// let c = PageCounts { created: 2, maps: 2, set_access: 1, ..PageCounts::default() };
/// assert_eq!(
///     c.to_string(),
///     "created 2, released 0, maps 2, unmaps 0, set_access 1, unmap_calls 0, reserves 0, range_frees 0, fences 0, waits 0"
/// );
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PageCounts {
    /// Pages created (`cuMemCreate`).
    pub created: u64,
    /// Pages released (`cuMemRelease`).
    pub released: u64,
    /// Pages mapped (`cuMemMap`, one a page).
    pub maps: u64,
    /// Pages unmapped (`cuMemUnmap`, one a page).
    pub unmaps: u64,
    /// Runs mapped, whose access is set once each (`cuMemSetAccess`).
    pub set_access: u64,
    /// Runs unmapped: `unmap` calls, and `release_range` calls that found
    /// pages still mapped.
    pub unmap_calls: u64,
    /// Reservations made (`cuMemAddressReserve`).
    pub reserves: u64,
    /// Reservations freed (`cuMemAddressFree`).
    pub range_frees: u64,
    /// Fences taken ([`PageBackend::fence`]: `cuEventRecord`).
    pub fences: u64,
    /// Waits that had to wait ([`PageBackend::wait`]: `cuEventSynchronize`,
    /// or a stream or context synchronised).
    pub waits: u64,
}

impl PageCounts {
    /// Pages created and not released.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = decaying_pool::pages::PageCounts { created: 5, released: 2, ..Default::default() };
    /// assert_eq!(c.live_pages(), 3);
    /// ```
    pub const fn live_pages(&self) -> u64 {
        self.created.saturating_sub(self.released)
    }

    /// Pages mapped and not unmapped.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = decaying_pool::pages::PageCounts { maps: 5, unmaps: 5, ..Default::default() };
    /// assert_eq!(c.mapped_pages(), 0);
    /// ```
    pub const fn mapped_pages(&self) -> u64 {
        self.maps.saturating_sub(self.unmaps)
    }

    /// Reservations made and not freed.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = decaying_pool::pages::PageCounts { reserves: 1, ..Default::default() };
    /// assert_eq!(c.live_ranges(), 1);
    /// ```
    pub const fn live_ranges(&self) -> u64 {
        self.reserves.saturating_sub(self.range_frees)
    }
}

impl fmt::Display for PageCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "created {}, released {}, maps {}, unmaps {}, set_access {}, unmap_calls {}, reserves {}, range_frees {}, fences {}, waits {}",
            self.created,
            self.released,
            self.maps,
            self.unmaps,
            self.set_access,
            self.unmap_calls,
            self.reserves,
            self.range_frees,
            self.fences,
            self.waits
        )
    }
}

/// What each page call costs, per call: the modelled backend's charges.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::pages::{PageCosts, PageCounts};
///
/// // Two pages created and mapped as one run.
/// let c = PageCounts { created: 2, maps: 2, set_access: 1, ..PageCounts::default() };
/// let t = PageCosts::PUBLISHED.charge(&c);
/// assert_eq!(t, Duration::from_nanos(2 * 193_000 + 2 * 1_450 + 36_000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageCosts {
    /// A page created (`cuMemCreate`).
    pub create: Duration,
    /// A page released (`cuMemRelease`).
    pub release: Duration,
    /// A page mapped (`cuMemMap`).
    pub map: Duration,
    /// A run's access set (`cuMemSetAccess`).
    pub set_access: Duration,
    /// A page unmapped (`cuMemUnmap`).
    pub unmap: Duration,
    /// A reservation (`cuMemAddressReserve`).
    pub reserve: Duration,
    /// A reservation freed (`cuMemAddressFree`).
    pub range_free: Duration,
}

impl PageCosts {
    /// The published per-call costs that `benches/peers/cca_sim.py`
    /// (`VMM_*`) charges PyTorch's expandable segments: kvcached's
    /// `benchmarks/bench_vmm` (an A100, one thread, 4096 pages of 2 MiB):
    /// `cuMemCreate` 193 µs, `cuMemMap` 1.45 µs, `cuMemSetAccess` 36 µs a
    /// range, `cuMemUnmap` 25.6 µs, `cuMemAddressReserve` 19 µs.
    /// `cuMemRelease` has no published figure and is charged as
    /// `cuMemUnmap`, as `cca_sim.py` does; `cuMemAddressFree` neither, and
    /// is charged nothing (`cca_sim.py` never frees a reservation).
    pub const PUBLISHED: PageCosts = PageCosts {
        create: Duration::from_nanos(193_000),
        release: Duration::from_nanos(25_600),
        map: Duration::from_nanos(1_450),
        set_access: Duration::from_nanos(36_000),
        unmap: Duration::from_nanos(25_600),
        reserve: Duration::from_nanos(19_000),
        range_free: Duration::ZERO,
    };

    /// The time `counts` cost at these prices (saturating).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{PageCosts, PageCounts};
    /// let c = PageCounts { reserves: 1, ..PageCounts::default() };
    /// assert_eq!(PageCosts::PUBLISHED.charge(&c).as_micros(), 19);
    /// ```
    pub fn charge(&self, counts: &PageCounts) -> Duration {
        let parts = [
            (self.create, counts.created),
            (self.release, counts.released),
            (self.map, counts.maps),
            (self.set_access, counts.set_access),
            (self.unmap, counts.unmaps),
            (self.reserve, counts.reserves),
            (self.range_free, counts.range_frees),
        ];
        let nanos = parts.iter().fold(0u128, |acc, &(cost, n)| {
            acc.saturating_add(cost.as_nanos().saturating_mul(u128::from(n)))
        });
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
        // The remainder is below 10⁹, so it fits a u32.
        Duration::new(secs, (nanos % 1_000_000_000) as u32)
    }
}

impl Default for PageCosts {
    /// [`PageCosts::PUBLISHED`].
    fn default() -> Self {
        PageCosts::PUBLISHED
    }
}

/// A number for each backend, so that handles of another one are refused.
fn next_owner() -> u64 {
    use core::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Checks a reservation's size: non-zero, a multiple of `granularity`, at
/// most `isize::MAX`.
fn check_size(bytes: usize, granularity: usize) -> Result<usize, PageError> {
    if bytes == 0 {
        return Err(PageError::ZeroSize);
    }
    if bytes % granularity != 0 {
        return Err(PageError::NotAligned {
            value: bytes,
            granularity,
        });
    }
    // Room for aligning the reservation too.
    if bytes > (isize::MAX as usize) - granularity {
        return Err(PageError::TooLarge { bytes });
    }
    Ok(bytes / granularity)
}
