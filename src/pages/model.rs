//! The modelled backend: page calls counted and charged, at fake addresses.

use core::fmt;
use core::time::Duration;

use fixedbitset::FixedBitSet;

use super::slots::Slots;
use super::{PageBackend, PageCosts, PageCounts, PageError, check_size, next_owner};

/// Where the first reservation starts (fake addresses, as `cca_sim.py`'s).
const FIRST_ADDRESS: usize = 1 << 40;

/// A [`PageBackend`] that only counts: pages are numbers, reservations fake
/// addresses, and every call is charged at [`PageCosts`] (by default the
/// published figures [`PageCosts::PUBLISHED`], as `cca_sim.py` charges
/// expandable segments). For the replay, on every platform; it makes the
/// same checks as a real backend, and checks the caller's side of the
/// `unsafe` contract too (a page released while mapped is refused and kept),
/// so [`validate_released`](Self::validate_released) finds what a caller
/// lost.
///
/// Reservations are laid out one after another from 2⁴⁰, aligned to the
/// granularity, with one granularity of gap between them.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::pages::{ModelPages, PageBackend};
///
/// let mut b = ModelPages::new(2 << 20)?.with_capacity(4 << 20);
/// let mut range = b.reserve(16 << 20)?;
/// let (p, q) = (b.create_page()?, b.create_page()?);
/// assert!(b.create_page().is_err()); // the capacity holds two pages
/// b.map(&mut range, 0, &[p])?;
/// assert_eq!(b.counts().maps, 1);
/// // 19 µs reserve, 2 × 193 µs create, 1.45 µs map, 36 µs set access.
/// assert_eq!(b.modelled_time(), Duration::from_nanos(19_000 + 2 * 193_000 + 1_450 + 36_000));
/// // SAFETY: nothing uses the range; `q` was never mapped.
/// unsafe {
///     b.release_range(range)?;
///     b.release_page(q)?;
/// }
/// assert!(b.validate_released().is_err()); // `p` is still live
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ModelPages {
    owner: u64,
    granularity: usize,
    capacity: Option<usize>,
    costs: PageCosts,
    counts: PageCounts,
    /// Bit `i`: page `i` is live.
    live: FixedBitSet,
    /// Bit `i`: page `i` is mapped.
    mapped: FixedBitSet,
    /// Numbers of released pages, for reuse.
    free_ids: Vec<u32>,
    live_pages: usize,
    live_ranges: usize,
    /// Slots mapped over all live ranges.
    mapped_slots: usize,
    next_address: usize,
    /// The modelled stream: fences taken so far (the last ticket).
    tickets: u64,
    /// Work queued on the modelled stream and not waited on:
    /// `(address, len, ticket)`, done once a wait covers `ticket`.
    queued: Vec<(usize, usize, u64)>,
    /// Unmaps refused because queued work could still use the addresses.
    unsafe_unmaps: u64,
}

/// A page of a [`ModelPages`]: a number.
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{ModelPages, PageBackend};
/// let mut b = ModelPages::new(4096)?;
/// let p = b.create_page()?;
/// assert_eq!(p.index(), 0);
/// // SAFETY: `p` is not mapped.
/// unsafe { b.release_page(p)? };
/// # Ok::<(), decaying_pool::pages::PageError>(())
/// ```
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelPage {
    owner: u64,
    id: u32,
}

impl ModelPage {
    /// The page's number (numbers of released pages are reused).
    pub fn index(&self) -> u32 {
        self.id
    }
}

/// A reservation of a [`ModelPages`]: fake addresses and the state of its
/// slots.
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{ModelPages, PageBackend};
/// let mut b = ModelPages::new(4096)?;
/// let r = b.reserve(3 * 4096)?;
/// assert_eq!((r.address(), r.len(), r.mapped_pages()), (1 << 40, 3 * 4096, 0));
/// // SAFETY: nothing uses the range.
/// unsafe { b.release_range(r)? };
/// # Ok::<(), decaying_pool::pages::PageError>(())
/// ```
#[derive(Debug)]
pub struct ModelRange {
    owner: u64,
    address: usize,
    slots: Slots,
}

impl ModelRange {
    /// The (fake) first address.
    pub fn address(&self) -> usize {
        self.address
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
    /// use decaying_pool::pages::{ModelPages, PageBackend};
    /// let mut b = ModelPages::new(4096)?;
    /// let mut r = b.reserve(4 * 4096)?;
    /// let p = b.create_page()?;
    /// b.map(&mut r, 4096, core::slice::from_ref(&p))?;
    /// assert_eq!(r.mapped_runs(), vec![(4096, 1)]);
    /// # unsafe { b.release_range(r)?; b.release_page(p)? };
    /// # Ok::<(), decaying_pool::pages::PageError>(())
    /// ```
    pub fn mapped_runs(&self) -> Vec<(usize, usize)> {
        self.slots.mapped_runs()
    }
}

impl ModelPages {
    /// A modelled backend of pages of `granularity` bytes, without a
    /// capacity, charged at [`PageCosts::PUBLISHED`].
    ///
    /// # Errors
    ///
    /// [`PageError::ZeroSize`] for a zero granularity.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{ModelPages, PageBackend, PageError};
    /// assert_eq!(ModelPages::new(20 << 20)?.granularity(), 20 << 20);
    /// assert_eq!(ModelPages::new(0).unwrap_err(), PageError::ZeroSize);
    /// # Ok::<(), PageError>(())
    /// ```
    pub fn new(granularity: usize) -> Result<Self, PageError> {
        if granularity == 0 {
            return Err(PageError::ZeroSize);
        }
        Ok(ModelPages {
            owner: next_owner(),
            granularity,
            capacity: None,
            costs: PageCosts::PUBLISHED,
            counts: PageCounts::default(),
            live: FixedBitSet::new(),
            mapped: FixedBitSet::new(),
            free_ids: Vec::new(),
            live_pages: 0,
            live_ranges: 0,
            mapped_slots: 0,
            next_address: FIRST_ADDRESS,
            tickets: 0,
            queued: Vec::new(),
            unsafe_unmaps: 0,
        })
    }

    /// At most `bytes` of live pages: a page past it is refused with
    /// [`PageError::OutOfMemory`], as a full device refuses `cuMemCreate`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{ModelPages, PageBackend, PageError};
    /// let mut b = ModelPages::new(4096)?.with_capacity(4096);
    /// let _p = b.create_page()?;
    /// assert_eq!(b.create_page().unwrap_err(), PageError::OutOfMemory { capacity: 4096 });
    /// # Ok::<(), PageError>(())
    /// ```
    #[must_use]
    pub fn with_capacity(mut self, bytes: usize) -> Self {
        self.capacity = Some(bytes);
        self
    }

    /// Charges the calls at `costs` instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::pages::{ModelPages, PageBackend, PageCosts};
    /// let free = PageCosts { reserve: Duration::ZERO, ..PageCosts::PUBLISHED };
    /// let mut b = ModelPages::new(4096)?.with_costs(free);
    /// let r = b.reserve(4096)?;
    /// assert_eq!(b.modelled_time(), Duration::ZERO);
    /// # unsafe { b.release_range(r)? };
    /// # Ok::<(), decaying_pool::pages::PageError>(())
    /// ```
    #[must_use]
    pub fn with_costs(mut self, costs: PageCosts) -> Self {
        self.costs = costs;
        self
    }

    /// The calls made so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{ModelPages, PageBackend};
    /// let mut b = ModelPages::new(4096)?;
    /// let p = b.create_page()?;
    /// assert_eq!(b.counts().created, 1);
    /// # unsafe { b.release_page(p)? };
    /// # Ok::<(), decaying_pool::pages::PageError>(())
    /// ```
    pub fn counts(&self) -> PageCounts {
        self.counts
    }

    /// The calls' time at the backend's [`PageCosts`].
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::ModelPages;
    /// assert_eq!(ModelPages::new(4096)?.modelled_time(), core::time::Duration::ZERO);
    /// # Ok::<(), decaying_pool::pages::PageError>(())
    /// ```
    pub fn modelled_time(&self) -> Duration {
        self.costs.charge(&self.counts)
    }

    /// Models work queued on the device that uses `len` bytes from
    /// `address` (a kernel writing a block): it is done once a
    /// [`wait`](PageBackend::wait) covers the next [`fence`](PageBackend::fence)
    /// taken, and until then an [`unmap`](PageBackend::unmap) (or a
    /// [`release_range`](PageBackend::release_range)) of any of those
    /// addresses is refused with [`PageError::QueuedWork`] and counted as an
    /// error of the caller's (see [`validate`](Self::validate)). This is how
    /// the tests check that [`Mapped`](super::Mapped) never unmaps a page
    /// that work queued before its block's release may still use.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{ModelPages, PageBackend, PageError};
    /// let mut b = ModelPages::new(4096)?;
    /// let mut r = b.reserve(4096)?;
    /// let p = b.create_page()?;
    /// b.map(&mut r, 0, core::slice::from_ref(&p))?;
    /// b.queue_work(r.address(), 100); // a kernel writes the page
    /// let t = b.fence()?; // the block is given back
    /// // SAFETY: the model checks it (and refuses): the work is not done.
    /// let e = unsafe { b.unmap(&mut r, 0, 1) }.unwrap_err();
    /// assert_eq!(e, PageError::QueuedWork { address: r.address() });
    /// assert!(b.validate().is_err());
    /// b.wait(t)?;
    /// // SAFETY: the work before the fence is done.
    /// unsafe { b.unmap(&mut r, 0, 1)?; b.release_range(r)?; b.release_page(p)? };
    /// # Ok::<(), PageError>(())
    /// ```
    pub fn queue_work(&mut self, address: usize, len: usize) {
        self.queued.push((address, len, self.tickets + 1));
    }

    /// Refuses an unmap of `len` bytes from `address` that queued work may
    /// still use.
    fn check_queued(&mut self, address: usize, len: usize) -> Result<(), PageError> {
        let end = address.saturating_add(len);
        let hit = self
            .queued
            .iter()
            .filter(|&&(a, l, _)| a < end && address < a.saturating_add(l))
            .map(|&(a, ..)| a.max(address))
            .min();
        match hit {
            Some(address) => {
                self.unsafe_unmaps += 1;
                Err(PageError::QueuedWork { address })
            }
            None => Ok(()),
        }
    }

    /// The bytes of live pages (created, not released).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{ModelPages, PageBackend};
    /// let mut b = ModelPages::new(4096)?;
    /// let p = b.create_page()?;
    /// assert_eq!(b.live_bytes(), 4096);
    /// # unsafe { b.release_page(p)? };
    /// # Ok::<(), decaying_pool::pages::PageError>(())
    /// ```
    pub fn live_bytes(&self) -> usize {
        self.live_pages * self.granularity
    }

    /// Checks the bookkeeping: the live and mapped pages against the
    /// counts, no page mapped that is not live, the mapped slots of the
    /// live ranges against the mapped pages (so no page shows twice), the
    /// live ranges against the counts.
    ///
    /// # Errors
    ///
    /// What does not add up, in words.
    ///
    /// # Examples
    ///
    /// ```
    /// let b = decaying_pool::pages::ModelPages::new(4096)?;
    /// b.validate()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        let c = &self.counts;
        let live = self.live.count_ones(..);
        let mapped = self.mapped.count_ones(..);
        let checks = [
            (live == self.live_pages, "live pages against the bitset"),
            (
                c.live_pages() == live as u64,
                "live pages against created - released",
            ),
            (
                self.mapped.is_subset(&self.live),
                "a mapped page is not live",
            ),
            (
                c.mapped_pages() == mapped as u64,
                "mapped pages against maps - unmaps",
            ),
            (
                self.mapped_slots == mapped,
                "mapped slots against mapped pages",
            ),
            (
                c.live_ranges() == self.live_ranges as u64,
                "live ranges against reserves - range frees",
            ),
            (
                c.released <= c.created && c.unmaps <= c.maps,
                "more released or unmapped than created or mapped",
            ),
            (
                self.unsafe_unmaps == 0,
                "an unmap of addresses that queued work may still use",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, what)) => Err(format!("{what} ({c}; {live} live, {mapped} mapped)")),
            None => Ok(()),
        }
    }

    /// [`validate`](Self::validate), and nothing left: every page released,
    /// every reservation freed.
    ///
    /// # Errors
    ///
    /// What does not add up or is left, in words.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::pages::{ModelPages, PageBackend};
    /// let mut b = ModelPages::new(4096)?;
    /// let r = b.reserve(4096)?;
    /// assert!(b.validate_released().is_err());
    /// // SAFETY: nothing uses the range.
    /// unsafe { b.release_range(r)? };
    /// b.validate_released()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn validate_released(&self) -> Result<(), String> {
        self.validate()?;
        if self.live_pages != 0 || self.live_ranges != 0 {
            return Err(format!(
                "{} pages and {} reservations left ({})",
                self.live_pages, self.live_ranges, self.counts
            ));
        }
        Ok(())
    }

    fn own_range(&self, range: &ModelRange) -> Result<(), PageError> {
        if range.owner == self.owner {
            Ok(())
        } else {
            Err(PageError::ForeignHandle)
        }
    }

    fn page_index(&self, page: &ModelPage) -> Result<usize, PageError> {
        let i = page.id as usize;
        if page.owner == self.owner && self.live.contains(i) {
            Ok(i)
        } else {
            Err(PageError::ForeignHandle)
        }
    }
}

impl PageBackend for ModelPages {
    type Range = ModelRange;
    type Page = ModelPage;
    type Error = PageError;

    /// The capacity given with [`with_capacity`](Self::with_capacity).
    fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn reserve(&mut self, bytes: usize) -> Result<ModelRange, PageError> {
        let count = check_size(bytes, self.granularity)?;
        let g = self.granularity;
        let too_large = PageError::TooLarge { bytes };
        let address = self
            .next_address
            .checked_next_multiple_of(g)
            .ok_or(too_large)?;
        let next = address
            .checked_add(bytes)
            .and_then(|end| end.checked_add(g))
            .ok_or(too_large)?;
        self.next_address = next;
        self.counts.reserves += 1;
        self.live_ranges += 1;
        Ok(ModelRange {
            owner: self.owner,
            address,
            slots: Slots::new(count, g),
        })
    }

    fn range_address(&self, range: &ModelRange) -> usize {
        range.address
    }

    fn range_len(&self, range: &ModelRange) -> usize {
        range.len()
    }

    unsafe fn release_range(&mut self, mut range: ModelRange) -> Result<(), PageError> {
        self.own_range(&range)?;
        let n = range.slots.mapped_count();
        if n > 0 {
            self.check_queued(range.address, range.len())?;
            let mapped = &mut self.mapped;
            range
                .slots
                .clear(0, range.slots.count(), |p| mapped.remove(p as usize));
            self.mapped_slots -= n;
            self.counts.unmaps += n as u64;
            self.counts.unmap_calls += 1;
        }
        self.counts.range_frees += 1;
        self.live_ranges -= 1;
        Ok(())
    }

    fn create_page(&mut self) -> Result<ModelPage, PageError> {
        if let Some(capacity) = self.capacity {
            if (self.live_pages + 1).saturating_mul(self.granularity) > capacity {
                return Err(PageError::OutOfMemory { capacity });
            }
        }
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None => {
                let id = u32::try_from(self.live.len())
                    .ok()
                    .filter(|&id| id != u32::MAX)
                    .ok_or(PageError::TooManyPages)?;
                self.live.grow(id as usize + 1);
                self.mapped.grow(id as usize + 1);
                id
            }
        };
        self.live.insert(id as usize);
        self.live_pages += 1;
        self.counts.created += 1;
        Ok(ModelPage {
            owner: self.owner,
            id,
        })
    }

    unsafe fn release_page(&mut self, page: ModelPage) -> Result<(), PageError> {
        let i = self.page_index(&page)?;
        if self.mapped.contains(i) {
            // The caller broke the contract: keep the page, never reuse it.
            return Err(PageError::PageMapped);
        }
        self.live.remove(i);
        self.free_ids.push(page.id);
        self.live_pages -= 1;
        self.counts.released += 1;
        Ok(())
    }

    fn map(
        &mut self,
        range: &mut ModelRange,
        offset: usize,
        pages: &[ModelPage],
    ) -> Result<(), PageError> {
        self.own_range(range)?;
        let first = range.slots.run(offset, pages.len())?;
        range.slots.check_unmapped(first, pages.len())?;
        for (k, p) in pages.iter().enumerate() {
            let i = self.page_index(p);
            let i = match i {
                Ok(i) if !self.mapped.contains(i) => Ok(i),
                Ok(_) => Err(PageError::PageMapped),
                Err(e) => Err(e),
            };
            match i {
                Ok(i) => self.mapped.insert(i),
                Err(e) => {
                    for q in &pages[..k] {
                        self.mapped.remove(q.id as usize);
                    }
                    return Err(e);
                }
            }
        }
        range.slots.set(first, pages.iter().map(|p| p.id));
        self.mapped_slots += pages.len();
        self.counts.maps += pages.len() as u64;
        self.counts.set_access += 1;
        Ok(())
    }

    unsafe fn unmap(
        &mut self,
        range: &mut ModelRange,
        offset: usize,
        count: usize,
    ) -> Result<(), PageError> {
        self.own_range(range)?;
        let first = range.slots.run(offset, count)?;
        range.slots.check_mapped(first, count)?;
        if !self.queued.is_empty() {
            self.check_queued(range.address + offset, count * self.granularity)?;
        }
        let mapped = &mut self.mapped;
        range
            .slots
            .clear(first, count, |p| mapped.remove(p as usize));
        self.mapped_slots -= count;
        self.counts.unmaps += count as u64;
        self.counts.unmap_calls += 1;
        Ok(())
    }

    fn fence(&mut self) -> Result<u64, PageError> {
        self.counts.fences += 1;
        self.tickets += 1;
        Ok(self.tickets)
    }

    fn wait(&mut self, ticket: u64) -> Result<(), PageError> {
        if self.queued.iter().any(|&(.., t)| t <= ticket) {
            self.counts.waits += 1;
            self.queued.retain(|&(.., t)| t > ticket);
        }
        Ok(())
    }
}

impl fmt::Display for ModelPages {
    /// The counts and the modelled time.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; modelled {:?}", self.counts, self.modelled_time())
    }
}
