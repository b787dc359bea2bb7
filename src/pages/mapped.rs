//! [`Mapped`]: a [`RawAllocator`] of blocks carved from reserved virtual
//! ranges, with pages of a [`PageBackend`] mapped under them as needed.

use core::fmt;
use std::collections::{BTreeMap, BTreeSet};

use fixedbitset::FixedBitSet;

use core::time::Duration;
use std::panic::AssertUnwindSafe;

use super::PageBackend;
use crate::clock::{Clock, MonotonicClock};
use crate::packing::Packable;
use crate::raw::RawAllocator;

/// The alignment of the blocks [`Mapped`] hands out, unless set: 512 bytes,
/// as CUDA's allocators align theirs.
pub const DEFAULT_ALIGN: usize = 512;

/// The page size the replay's `mapped` row uses, and the one recommended
/// for device memory: 20 MiB, the page of PyTorch's expandable segments
/// for large blocks (a multiple of CUDA's 2 MiB granularity). Each page
/// created is a backing call, so pages much smaller make more calls (2 MiB
/// pages: ten times the modelled seconds on a serving trace;
/// `docs/PERFORMANCE.md`, "Tried and dropped").
pub const RECOMMENDED_PAGE: usize = 20 << 20;

/// The page size for a device of `capacity` bytes: [`RECOMMENDED_PAGE`],
/// or on a device under 64 such pages (1.25 GiB) the largest power of two
/// at most a 64th of it (at least 4 KiB). A block boundary strands at most
/// a page, so pages that small keep what a few boundaries strand to a few
/// per cent of the device (on a real GPU, pages cannot go below CUDA's
/// granularity, 2 MiB).
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{page_size_for, RECOMMENDED_PAGE};
/// assert_eq!(page_size_for(None), RECOMMENDED_PAGE);
/// assert_eq!(page_size_for(Some(80 << 30)), RECOMMENDED_PAGE);
/// assert_eq!(page_size_for(Some(37 << 20)), 512 << 10);
/// assert_eq!(page_size_for(Some(0)), 4096);
/// ```
pub fn page_size_for(capacity: Option<usize>) -> usize {
    match capacity {
        Some(c) if c / 64 < RECOMMENDED_PAGE => {
            let f = (c / 64).max(4096);
            1 << f.ilog2()
        }
        _ => RECOMMENDED_PAGE,
    }
}

/// The largest power of two that divides `n` (a page: the alignment every
/// reservation has).
fn largest_power_of_two_dividing(n: usize) -> usize {
    if n == 0 { 1 } else { n & n.wrapping_neg() }
}

/// The reservation [`Mapped`] makes unless told otherwise: 64 GiB of
/// address space, or 65 536 pages if that is less (its slot table costs
/// tens of bytes a page, resident).
fn default_reservation(page: usize) -> usize {
    (64usize << 30).min(page.saturating_mul(1 << 16))
}

/// How long [`Mapped`] keeps spare pages unless told otherwise: ten
/// seconds, ten times the pool's default for idle blocks. A spare page
/// serves a request of any size (an idle block only its class), and giving
/// it back is a device call that waits for the work queued before it
/// (`cuMemUnmap`, `cuMemRelease`), so it is kept on the time scale host
/// allocators keep unused pages on (jemalloc's `dirty_decay_ms`: 10 s).
/// On the 30 serving traces of `benches/traces/mapped_sweep.py` (each 0.4
/// to 1.8 s long) a 1 s time-to-live gave 85 pages back in 8 batches
/// while the traces ran, 37 of them made again, for the same peak.
pub const DEFAULT_SPARE_TTL: Duration = Duration::from_secs(10);

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
}

/// The calls a [`Mapped`] allocator made of its backend, and what it holds.
///
/// # Examples
///
/// ```
/// use decaying_pool::pages::{Mapped, ModelPages};
/// use decaying_pool::RawAllocator;
///
/// let mut m = Mapped::new(ModelPages::new(2 << 20)?);
/// let a = m.allocate(3 << 20)?;
/// let s = m.stats();
/// assert_eq!((s.pages_created, s.maps, s.mapped_bytes, s.blocks), (2, 1, 4 << 20, 1));
/// # // SAFETY: `a` came from `allocate(3 << 20)`, given back once.
/// # unsafe { m.deallocate(a, 3 << 20) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MappedStats {
    /// Pages created (backing allocations).
    pub pages_created: u64,
    /// Pages released (memory given back to the backend's platform).
    pub pages_released: u64,
    /// Times memory was given back: each run of pages unmapped and
    /// released together, and each batch of unmapped pages released, counts
    /// one (as one free of a block would).
    pub release_calls: u64,
    /// Runs of pages mapped (`map` calls).
    pub maps: u64,
    /// Runs of pages unmapped (`unmap` calls).
    pub unmaps: u64,
    /// Blocks handed out from mapped free space alone, with no call.
    pub reused: u64,
    /// Reservations made.
    pub reserves: u64,
    /// Blocks handed out and not given back.
    pub blocks: usize,
    /// Bytes of those blocks (rounded to the alignment).
    pub block_bytes: usize,
    /// Bytes of pages created and not released (the physical footprint).
    pub page_bytes: usize,
    /// The most `page_bytes` at once.
    pub peak_page_bytes: usize,
    /// Bytes of pages mapped.
    pub mapped_bytes: usize,
    /// Bytes of pages no block touches, mapped or not: what
    /// [`RawAllocator::spare`] reports.
    pub spare_bytes: usize,
    /// Bytes of address space reserved.
    pub reserved_bytes: usize,
}

/// Why [`Mapped::allocate`] failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MappedError<E> {
    /// A request of zero bytes.
    ZeroSize,
    /// A request too large for the address space once rounded.
    TooLarge {
        /// The size asked for.
        requested: usize,
    },
    /// The backend refused a call (out of memory, most often); nothing was
    /// handed out.
    Backend(E),
}

impl<E: fmt::Display> fmt::Display for MappedError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MappedError::ZeroSize => f.write_str("a request of zero bytes"),
            MappedError::TooLarge { requested } => {
                write!(f, "{requested} bytes is too large to map")
            }
            MappedError::Backend(e) => write!(f, "page backend: {e}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for MappedError<E> {}

/// The mapped slots no block touches, a bitset per arena.
#[derive(Default)]
struct SpareSlots {
    bits: Vec<FixedBitSet>,
    count: usize,
}

impl SpareSlots {
    fn grow(&mut self, slots: usize) {
        self.bits.push(FixedBitSet::with_capacity(slots));
    }
    fn len(&self) -> usize {
        self.count
    }
    fn contains(&self, a: usize, s: usize) -> bool {
        self.bits[a].contains(s)
    }
    fn insert(&mut self, a: usize, s: usize) {
        if !self.bits[a].put(s) {
            self.count += 1;
        }
    }
    fn remove(&mut self, a: usize, s: usize) {
        if self.bits[a].contains(s) {
            self.bits[a].set(s, false);
            self.count -= 1;
        }
    }
    /// The first spare slot at or after `(arena, slot)`.
    fn next_from(&self, (a, s): (usize, usize)) -> Option<(usize, usize)> {
        if self.count == 0 {
            return None;
        }
        let mut from = s;
        for (ai, bits) in self.bits.iter().enumerate().skip(a) {
            if let Some(i) = super::slots::next_one(bits, from) {
                return Some((ai, i));
            }
            from = 0;
        }
        None
    }
}

/// One reservation and the state of its slots.
struct Arena<B: PageBackend> {
    /// `None` once given back (at drop).
    range: Option<B::Range>,
    base: usize,
    /// Slots in the reservation.
    count: usize,
    /// The state of slots `0..slots.len()`, made when a block first
    /// reaches them (`made`): the slots past it were never touched (no
    /// page, no user, no stamp, no fence). A reservation is 32 768 slots
    /// of 2 MiB by default, and what is made, walked and dropped follows
    /// the slots blocks used, not the address space reserved.
    slots: Vec<Slot<B::Page>>,
}

impl<B: PageBackend> Arena<B> {
    /// Makes the state of slots `..end`. `false` when the table cannot
    /// grow (the allocation failed).
    fn made(&mut self, end: usize) -> bool {
        debug_assert!(end <= self.count);
        let len = self.slots.len();
        if end <= len {
            return true;
        }
        if self.slots.try_reserve(end - len).is_err() {
            return false;
        }
        self.slots.resize_with(end, || Slot {
            page: None,
            users: 0,
            since: 0,
            fence: 0,
        });
        true
    }

    /// The slots of `first..end` whose state was made.
    fn made_in(&self, first: usize, end: usize) -> &[Slot<B::Page>] {
        let len = self.slots.len();
        &self.slots[first.min(len)..end.min(len)]
    }
}

struct Slot<P> {
    /// The page mapped here.
    page: Option<P>,
    /// Blocks handed out that touch this slot.
    users: u32,
    /// When the slot's page last became spare (clock nanoseconds).
    since: u64,
    /// The backend's fence ticket taken when the slot last became free:
    /// waited on before its page is unmapped.
    fence: u64,
}

/// A [`RawAllocator`] whose blocks are carved from reserved virtual ranges,
/// with the pages of a [`PageBackend`] mapped under them as they need.
///
/// Physical memory is never stranded by the shape of the blocks: a block
/// pins only the pages it touches, and the pages no block touches are
/// *spare*, wherever they sit. A block given back keeps its pages mapped
/// (free mapped space, reused by the next block that fits there with no
/// call at all); a block that does not fit in mapped free space takes
/// pages in this order: unmapped spare pages, spare pages mapped elsewhere
/// (unmapped and mapped again where needed), new pages. Spare pages go back
/// to the backend only on [`release_spare`](RawAllocator::release_spare)
/// (a pool calls it when its policy frees blocks) or at drop.
///
/// Under a [`DecayingPool`](crate::DecayingPool) (or a
/// [`PackedPool`](crate::PackedPool)), the pool's cache makes requests of a
/// size seen before hits; a miss first gives idle blocks back oldest first
/// while this allocator's spare memory is less than the request
/// ([`RawAllocator::spare`]), so their pages serve it instead of new ones.
///
/// Blocks are addresses (`usize`), aligned to [`DEFAULT_ALIGN`] unless
/// [`with_align`](Self::with_align) says otherwise; sizes are rounded up to
/// the alignment. New ranges are reserved of
/// [`with_reservation`](Self::with_reservation) bytes (64 GiB by default,
/// address space only) or of the request's size if larger.
///
/// # Examples
///
/// Blocks of changing sizes on the modelled backend: the memory of the
/// blocks given back serves the next, without new pages.
///
/// ```
/// use decaying_pool::pages::{Mapped, ModelPages};
/// use decaying_pool::{DecayingPool, FixedTime, RawAllocator};
///
/// let mut pool = DecayingPool::new(Mapped::new(ModelPages::new(2 << 20)?), FixedTime::default());
/// for step in 1..=32usize {
///     let kv = pool.allocate(step << 20)?; // one MiB longer every step
///     // SAFETY: `kv` came from this pool with this size, released once.
///     unsafe { pool.release(kv, step << 20) };
/// }
/// let s = pool.allocator().stats();
/// // 32 MiB is the largest block: 16 pages of 2 MiB, each created once.
/// assert_eq!(s.pages_created, 16);
/// assert_eq!(s.pages_released, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Mapped<B: PageBackend, C: Clock = MonotonicClock> {
    backend: B,
    clock: C,
    /// Spare pages older than this go back (nanoseconds; `u64::MAX`: never).
    ttl: u64,
    /// When spare pages were last swept.
    swept: u64,
    /// The largest fence ticket taken (`u64::MAX` once one failed).
    fenced: u64,
    /// The largest ticket waited on (never `u64::MAX`).
    waited: u64,
    page: usize,
    align: usize,
    reservation: usize,
    capacity: Option<usize>,
    arenas: Vec<Arena<B>>,
    /// Arena base address → index.
    by_base: BTreeMap<usize, usize>,
    /// Free virtual extents: start → (length, arena).
    free: BTreeMap<usize, (usize, usize)>,
    /// The same, by (length, start).
    by_len: BTreeSet<(usize, usize)>,
    /// Mapped slots that no block touches: (arena, slot).
    free_mapped: SpareSlots,
    /// Pages created and not mapped.
    idle: Vec<B::Page>,
    /// When each idle page became spare (`idle_since[i]` for `idle[i]`;
    /// shorter only after a backend panicked inside `create_pages`: see
    /// `settle_idle`).
    idle_since: Vec<u64>,
    stats: MappedStats,
}

impl<B: PageBackend, C: Clock> fmt::Debug for Mapped<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapped")
            .field("page", &self.page)
            .field("align", &self.align)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<B: PageBackend> Mapped<B> {
    /// Blocks on `backend`'s pages, with spare pages kept for
    /// [`DEFAULT_SPARE_TTL`] on the monotonic clock.
    pub fn new(backend: B) -> Self {
        Mapped::with_clock(backend, MonotonicClock)
    }
}

impl<B: PageBackend, C: Clock> Mapped<B, C> {
    /// Blocks on `backend`'s pages, with spare pages kept for
    /// [`DEFAULT_SPARE_TTL`] on `clock`.
    ///
    /// # Examples
    ///
    /// Spare pages go back one time-to-live after their block:
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::pages::{Mapped, ModelPages};
    /// use decaying_pool::{ManualClock, RawAllocator};
    ///
    /// let clock = ManualClock::new();
    /// let mut m = Mapped::with_clock(ModelPages::new(2 << 20)?, clock.clone());
    /// let a = m.allocate(8 << 20)?;
    /// // SAFETY: `a` came from `allocate(8 << 20)`, given back once.
    /// unsafe { m.deallocate(a, 8 << 20) };
    /// assert_eq!(m.spare(), Some(8 << 20)); // kept: the next block maps nothing
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(m.collect_spare(), 0); // not due yet
    /// clock.advance(Duration::from_secs(9));
    /// assert_eq!(m.collect_spare(), 8 << 20);
    /// assert_eq!(m.stats().page_bytes, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_clock(backend: B, clock: C) -> Self {
        let page = backend.granularity();
        let capacity = backend.capacity();
        let now = clock.now_nanos();
        Mapped {
            backend,
            clock,
            ttl: duration_nanos(DEFAULT_SPARE_TTL),
            swept: now,
            fenced: 0,
            waited: 0,
            page,
            align: DEFAULT_ALIGN.min(largest_power_of_two_dividing(page)),
            reservation: default_reservation(page),
            capacity,
            arenas: Vec::new(),
            by_base: BTreeMap::new(),
            free: BTreeMap::new(),
            by_len: BTreeSet::new(),
            free_mapped: SpareSlots::default(),
            idle: Vec::new(),
            idle_since: Vec::new(),
            stats: MappedStats::default(),
        }
    }

    /// Aligns blocks to `align` bytes: raised to a power of two, and
    /// capped at the largest power of two that divides the page (every
    /// reservation is aligned to the page, so to that).
    ///
    /// # Examples
    ///
    /// ```
    /// # use decaying_pool::pages::{Mapped, ModelPages};
    /// let m = Mapped::new(ModelPages::new(4096)?).with_align(100);
    /// assert_eq!(m.align(), 128);
    /// # Ok::<(), decaying_pool::pages::PageError>(())
    /// ```
    #[must_use]
    pub fn with_align(mut self, align: usize) -> Self {
        self.align = align
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .min(largest_power_of_two_dividing(self.page));
        self
    }

    /// Keeps spare pages for `ttl` after they last held a block (`None`:
    /// until [`release_spare`](RawAllocator::release_spare) or the drop).
    #[must_use]
    pub fn with_spare_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl.map_or(u64::MAX, duration_nanos);
        self
    }

    /// How long spare pages are kept (`None`: until released by hand).
    pub fn spare_ttl(&self) -> Option<Duration> {
        (self.ttl != u64::MAX).then(|| Duration::from_nanos(self.ttl))
    }

    /// Reserves new ranges of `bytes` (rounded up to the page; a request
    /// larger than it gets a range of its own size).
    #[must_use]
    pub fn with_reservation(mut self, bytes: usize) -> Self {
        self.reservation = bytes.max(1);
        self
    }

    /// Reports `bytes` as its [`capacity`](RawAllocator::capacity) (the
    /// device's memory), for a pool's limit and threshold.
    #[must_use]
    pub fn with_capacity(mut self, bytes: usize) -> Self {
        self.capacity = Some(bytes);
        self
    }

    /// The block alignment.
    pub fn align(&self) -> usize {
        self.align
    }

    /// The page size.
    pub fn page_size(&self) -> usize {
        self.page
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The calls made and what is held.
    pub fn stats(&self) -> MappedStats {
        let mut s = self.stats;
        s.spare_bytes = self.spare_bytes();
        s
    }

    fn spare_bytes(&self) -> usize {
        (self.free_mapped.len() + self.idle.len()) * self.page
    }

    /// Checks the bookkeeping: free extents inside their arenas, disjoint
    /// and not adjacent; the slot users against the blocks; the free mapped
    /// slots against the slots; the pages against the counts.
    ///
    /// # Errors
    ///
    /// What does not add up, in words.
    pub fn validate(&self) -> Result<(), String> {
        if self.by_len.len() != self.free.len() {
            return Err("free extents: the two indexes differ".into());
        }
        let mut free_bytes = 0usize;
        let mut last: Option<(usize, usize, usize)> = None;
        for (&start, &(len, arena)) in &self.free {
            if !self.by_len.contains(&(len, start)) {
                return Err(format!("free extent {start:#x} missing by length"));
            }
            let a = self.arenas.get(arena).ok_or("free extent of no arena")?;
            if start < a.base || start + len > a.base + a.count * self.page {
                return Err(format!("free extent {start:#x} outside its arena"));
            }
            if let Some((s, l, ar)) = last {
                if s + l > start || (s + l == start && ar == arena) {
                    return Err(format!(
                        "free extents at {s:#x} and {start:#x} overlap or touch"
                    ));
                }
            }
            last = Some((start, len, arena));
            free_bytes += len;
        }
        let total: usize = self.arenas.iter().map(|a| a.count * self.page).sum();
        if total - free_bytes != self.stats.block_bytes {
            return Err(format!(
                "{} bytes not free against {} bytes of blocks",
                total - free_bytes,
                self.stats.block_bytes
            ));
        }
        let mut mapped = 0usize;
        for (ai, a) in self.arenas.iter().enumerate() {
            // The arena's free extents in address order, swept along its
            // slots: one pass, not a search per slot.
            let end = a.base + a.count * self.page;
            let mut extents = self.free.range(a.base..end).map(|(&s, &(l, _))| (s, s + l));
            let mut extent = extents.next();
            for (si, s) in a.slots.iter().enumerate() {
                let lo = a.base + si * self.page;
                let hi = lo + self.page;
                while extent.is_some_and(|(_, e)| e <= lo) {
                    extent = extents.next();
                }
                // A slot is touched by a block unless free extents cover it
                // (free extents never touch within an arena, so one does).
                let covered = extent.is_some_and(|(s, e)| s <= lo && e >= hi);
                if (s.users == 0) != covered {
                    return Err(format!(
                        "slot {si} of arena {ai}: {} users, covered {covered}",
                        s.users
                    ));
                }
                if s.page.is_some() {
                    mapped += 1;
                }
                if (s.page.is_some() && s.users == 0) != self.free_mapped.contains(ai, si) {
                    return Err(format!("slot {si} of arena {ai}: free-mapped index wrong"));
                }
            }
            // The slots never made: no user (one free extent covers them
            // all, to the arena's end) and no page.
            let made = a.slots.len();
            if made < a.count {
                let lo = a.base + made * self.page;
                while extent.is_some_and(|(_, e)| e <= lo) {
                    extent = extents.next();
                }
                if !extent.is_some_and(|(s, e)| s <= lo && e >= end) {
                    return Err(format!(
                        "arena {ai}: slots {made}.. were never made, yet a block touches them"
                    ));
                }
                if let Some(si) = self
                    .free_mapped
                    .next_from((ai, made))
                    .filter(|&(x, _)| x == ai)
                {
                    return Err(format!(
                        "slot {} of arena {ai}: never made, yet spare mapped",
                        si.1
                    ));
                }
            }
        }
        // Pages a panicking `create_pages` left in `idle` are counted at
        // the next call (`settle_idle`).
        let Some(pending) = self.idle.len().checked_sub(self.idle_since.len()) else {
            return Err("more stamps than idle pages".into());
        };
        let pages = self.stats.pages_created + pending as u64 - self.stats.pages_released;
        if self.stats.mapped_bytes != mapped * self.page {
            return Err(format!(
                "{mapped} slots mapped against {} bytes counted",
                self.stats.mapped_bytes
            ));
        }
        if pages != (mapped + self.idle.len()) as u64
            || self.stats.page_bytes + pending * self.page != (mapped + self.idle.len()) * self.page
        {
            return Err(format!(
                "{pages} pages live against {mapped} mapped and {} idle",
                self.idle.len()
            ));
        }
        Ok(())
    }

    /// The arena holding `addr`.
    fn arena_of(&self, addr: usize) -> Option<usize> {
        let (&base, &i) = self.by_base.range(..=addr).next_back()?;
        (addr < base + self.arenas[i].count * self.page).then_some(i)
    }

    /// Slots `first..end` of arena `a` that `start..start + n` touches.
    fn slot_span(&self, a: usize, start: usize, n: usize) -> (usize, usize) {
        let base = self.arenas[a].base;
        let first = (start - base) / self.page;
        let end = (start - base + n).div_ceil(self.page);
        (first, end)
    }

    fn unmapped_in(&self, a: usize, start: usize, n: usize) -> usize {
        let (first, end) = self.slot_span(a, start, n);
        let made = self.arenas[a].made_in(first, end);
        // The slots never made hold no page.
        let never = (end - first) - made.len();
        made.iter().filter(|s| s.page.is_none()).count() + never
    }

    fn remove_free(&mut self, start: usize) -> (usize, usize) {
        let (len, arena) = self.free.remove(&start).expect("a free extent");
        self.by_len.remove(&(len, start));
        (len, arena)
    }

    fn insert_free(&mut self, start: usize, len: usize, arena: usize) {
        if len > 0 {
            self.free.insert(start, (len, arena));
            self.by_len.insert((len, start));
        }
    }

    /// The place for a block of `n` bytes: (arena, start, unmapped slots).
    /// Fewest unmapped slots first, then the tightest extent.
    fn place(&self, n: usize) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize, usize)> = None; // (need, len, start, arena)
        for &(len, start) in self.by_len.range((n, 0)..) {
            let arena = self.free[&start].1;
            let tail = (start + len - n) & !(self.align - 1);
            for at in [start, tail.max(start)] {
                let need = self.unmapped_in(arena, at, n);
                if best.is_none_or(|(bn, bl, _, _)| (need, len) < (bn, bl)) {
                    best = Some((need, len, at, arena));
                }
            }
            if best.is_some_and(|(need, ..)| need == 0) {
                break;
            }
        }
        best.map(|(need, _, at, arena)| (arena, at, need))
    }

    /// Reserves a new arena of at least `n` bytes.
    fn grow(&mut self, n: usize) -> Result<(), MappedError<B::Error>> {
        let bytes = n
            .max(self.reservation)
            .checked_next_multiple_of(self.page)
            .ok_or(MappedError::TooLarge { requested: n })?;
        let count = bytes / self.page;
        // The spare-slot bitset is made whole (a bit a slot); the slots'
        // state only as blocks reach them (`Arena::made`).
        let mut bits: Vec<usize> = Vec::new();
        bits.try_reserve_exact(count.div_ceil(usize::BITS as usize))
            .map_err(|_| MappedError::TooLarge { requested: n })?;
        drop(bits);
        let range = self.backend.reserve(bytes).map_err(MappedError::Backend)?;
        let base = self.backend.range_address(&range);
        let i = self.arenas.len();
        self.arenas.push(Arena {
            range: Some(range),
            base,
            count,
            slots: Vec::new(),
        });
        self.by_base.insert(base, i);
        self.free_mapped.grow(count);
        self.insert_free(base, bytes, i);
        self.stats.reserves += 1;
        self.stats.reserved_bytes += bytes;
        Ok(())
    }

    /// Unmaps runs of the free mapped slots outside `keep` (arena, first
    /// slot, end slot) until `idle` holds `need` pages or none is left.
    fn reclaim(&mut self, need: usize, keep: (usize, usize, usize)) -> Result<(), B::Error> {
        let kept = |a: usize, s: usize| a == keep.0 && s >= keep.1 && s < keep.2;
        while self.idle.len() < need {
            let mut at = (0, 0);
            let (a, first) = loop {
                match self.free_mapped.next_from(at) {
                    None => return Ok(()),
                    Some((a, s)) if kept(a, s) => at = (a, keep.2),
                    Some(found) => break found,
                }
            };
            // The run of free mapped slots from `first` on.
            let want = first + (need - self.idle.len());
            let mut end = first + 1;
            while end < want && self.free_mapped.contains(a, end) && !kept(a, end) {
                end += 1;
            }
            self.unmap_run(a, first, end)?;
        }
        Ok(())
    }

    /// Unmaps slots `first..end` of arena `a` (free mapped ones) into `idle`.
    fn unmap_run(&mut self, a: usize, first: usize, end: usize) -> Result<(), B::Error> {
        let fence = self.arenas[a]
            .made_in(first, end)
            .iter()
            .map(|s| s.fence)
            .max()
            .unwrap_or(0);
        self.wait_for(fence)?;
        let arena = &mut self.arenas[a];
        let range = arena.range.as_mut().expect("a live arena");
        // SAFETY: no block handed out touches these slots (their users are
        // zero); every block that did was given back, which promises that
        // the host uses its addresses no more, and the fence taken when the
        // last of them went back has been waited on, so no work queued
        // before that may still use them.
        unsafe { self.backend.unmap(range, first * self.page, end - first)? };
        self.stats.mapped_bytes -= (end - first) * self.page;
        for s in first..end {
            let slot = &mut arena.slots[s];
            let page = slot.page.take().expect("a mapped slot");
            self.idle.push(page);
            self.idle_since.push(slot.since);
            self.free_mapped.remove(a, s);
        }
        self.stats.unmaps += 1;
        Ok(())
    }

    /// Waits on the backend until the work marked by `ticket` is done
    /// (nothing when that wait was made already).
    fn wait_for(&mut self, ticket: u64) -> Result<(), B::Error> {
        if ticket <= self.waited {
            return Ok(());
        }
        self.backend.wait(ticket)?;
        if ticket != u64::MAX {
            self.waited = ticket;
        }
        Ok(())
    }

    /// Maps idle pages into every unmapped slot of `first..end` of arena
    /// `a` (there are enough idle pages).
    fn map_span(&mut self, a: usize, first: usize, end: usize) -> Result<(), B::Error> {
        let mut s = first;
        while s < end {
            if self.arenas[a].slots[s].page.is_some() {
                s += 1;
                continue;
            }
            let mut e = s + 1;
            while e < end && self.arenas[a].slots[e].page.is_none() {
                e += 1;
            }
            // The pages stay in `idle` until the map succeeded, so a map
            // that fails, or panics, loses none.
            let from = self.idle.len() - (e - s);
            let arena = &mut self.arenas[a];
            let range = arena.range.as_mut().expect("a live arena");
            self.backend.map(range, s * self.page, &self.idle[from..])?;
            let pages = self.idle.drain(from..);
            let sinces = self.idle_since.drain(from..);
            for ((slot, page), since) in (s..e).zip(pages).zip(sinces) {
                arena.slots[slot].page = Some(page);
                arena.slots[slot].since = since;
                // Free mapped until the block takes it.
                self.free_mapped.insert(a, slot);
            }
            self.stats.maps += 1;
            self.stats.mapped_bytes += (e - s) * self.page;
            s = e;
        }
        Ok(())
    }

    /// Creates pages until `idle` holds `need`.
    fn create(&mut self, need: usize) -> Result<(), B::Error> {
        if self.idle.len() >= need {
            return Ok(());
        }
        // Straight into `idle`: the pages made before a failure, or a
        // panic, are kept (`settle_idle` counts them).
        let result = self
            .backend
            .create_pages(need - self.idle.len(), &mut self.idle);
        self.settle_idle();
        result
    }

    /// Counts the idle pages without a stamp: made by a `create_pages`
    /// (that returned, or panicked) and not counted yet.
    fn settle_idle(&mut self) {
        let made = self.idle.len().saturating_sub(self.idle_since.len());
        if made > 0 {
            // Stamped 0: a page made and left unmapped (its request
            // failed) is due at the next sweep.
            self.idle_since.resize(self.idle.len(), 0);
            self.stats.pages_created += made as u64;
            self.stats.page_bytes += made * self.page;
            self.stats.peak_page_bytes = self.stats.peak_page_bytes.max(self.stats.page_bytes);
        }
    }
    /// Releases the idle pages that became spare at or before `before`.
    fn release_idle(&mut self, before: u64) -> usize {
        let mut released = 0;
        let mut i = 0;
        self.settle_idle();
        while i < self.idle.len() {
            if self.idle_since[i] > before {
                i += 1;
                continue;
            }
            let page = self.idle.swap_remove(i);
            self.idle_since.swap_remove(i);
            // Counted gone before the call: a refusal (or a panic) leaves
            // the page with the backend, never reused.
            self.stats.pages_released += 1;
            self.stats.page_bytes -= self.page;
            released += 1;
            // SAFETY: idle pages are not mapped anywhere.
            let _ = unsafe { self.backend.release_page(page) };
        }
        released * self.page
    }

    /// Gives back the spare pages that became spare at or before `before`:
    /// free mapped runs unmapped and released, then idle pages.
    fn release_before(&mut self, before: u64) -> usize {
        self.settle_idle();
        let mut bytes = 0;
        let mut runs = 0;
        let mut next = (0, 0);
        while let Some((a, first)) = self.free_mapped.next_from(next) {
            if self.arenas[a].slots[first].since > before {
                next = (a, first + 1);
                continue;
            }
            let mut end = first + 1;
            while self.free_mapped.contains(a, end) && self.arenas[a].slots[end].since <= before {
                end += 1;
            }
            next = (a, end);
            if self.unmap_run(a, first, end).is_err() {
                // The platform refused: those pages stay mapped and spare.
                continue;
            }
            bytes += self.release_idle(before);
            runs += 1;
        }
        let idle = self.release_idle(before);
        if idle > 0 {
            bytes += idle;
            runs += 1;
        }
        self.stats.release_calls += runs;
        bytes
    }

    /// Sweeps spare pages past their time-to-live, at most eight times a
    /// time-to-live.
    fn maybe_sweep(&mut self, now: u64) {
        if self.ttl != u64::MAX && now.saturating_sub(self.swept) >= (self.ttl / 8).max(1) {
            self.swept = now;
            // Before one time-to-live has passed on the clock, nothing is due.
            if let Some(before) = now.checked_sub(self.ttl) {
                self.release_before(before);
            }
        }
    }

    /// Removes the free extent holding `at`: ((start, len), arena).
    fn remove_free_containing(&mut self, at: usize) -> ((usize, usize), usize) {
        let (&s, _) = self.free.range(..=at).next_back().expect("a free extent");
        let (l, a) = self.remove_free(s);
        ((s, l), a)
    }
}

impl<B: PageBackend, C: Clock> RawAllocator for Mapped<B, C> {
    type Block = usize;
    type Error = MappedError<B::Error>;

    fn allocate(&mut self, size: usize) -> Result<usize, Self::Error> {
        if size == 0 {
            return Err(MappedError::ZeroSize);
        }
        // Above the capacity (the backend's, or the one given) no page
        // could ever be made for it: refused before anything is reserved.
        let n = size
            .checked_next_multiple_of(self.align)
            .filter(|&n| n <= isize::MAX as usize && self.capacity.is_none_or(|c| n <= c))
            .ok_or(MappedError::TooLarge { requested: size })?;
        self.settle_idle();
        let (arena, start, need) = match self.place(n) {
            Some(p) => p,
            None => {
                self.grow(n)?;
                self.place(n).expect("a new range fits")
            }
        };
        let (first, end) = self.slot_span(arena, start, n);
        if !self.arenas[arena].made(end) {
            return Err(MappedError::TooLarge { requested: size });
        }
        if need == 0 {
            self.stats.reused += 1;
        } else {
            // Spare pages mapped elsewhere move (unmapped there, mapped
            // here) only when new ones would not fit on the device: a move
            // costs a fraction of a page made, but is paid each time,
            // where a page is made once (and decays when unused).
            let short = need.saturating_sub(self.idle.len());
            let room = self
                .capacity
                .is_none_or(|c| self.stats.page_bytes + short * self.page <= c);
            if short > 0 && !room {
                self.reclaim(need, (arena, first, end))
                    .map_err(MappedError::Backend)?;
            }
            if let Err(e) = self.create(need) {
                // The device is fuller than the capacity says: move what
                // is spare.
                self.reclaim(need, (arena, first, end))
                    .map_err(MappedError::Backend)?;
                if self.idle.len() < need {
                    return Err(MappedError::Backend(e));
                }
            }
            self.map_span(arena, first, end)
                .map_err(MappedError::Backend)?;
        }
        for s in first..end {
            let slot = &mut self.arenas[arena].slots[s];
            slot.users += 1;
            if slot.users == 1 {
                self.free_mapped.remove(arena, s);
            }
        }
        let ((fs, fl), _) = self.remove_free_containing(start);
        self.insert_free(fs, start - fs, arena);
        self.insert_free(start + n, fs + fl - (start + n), arena);
        self.stats.blocks += 1;
        self.stats.block_bytes += n;
        Ok(start)
    }

    unsafe fn deallocate(&mut self, block: usize, size: usize) {
        let n = size.max(1).next_multiple_of(self.align);
        let Some(arena) = self.arena_of(block) else {
            debug_assert!(
                false,
                "Mapped::deallocate: {block:#x} is not a block of this allocator"
            );
            return;
        };
        // A clock that panics must not keep the block out: its pages are
        // stamped with the last sweep instead (and no sweep runs).
        let clock = &self.clock;
        let read = std::panic::catch_unwind(AssertUnwindSafe(|| clock.now_nanos()));
        let now = *read.as_ref().unwrap_or(&self.swept);
        let (first, end) = self.slot_span(arena, block, n);
        // The slots that become free take a fence: work queued before this
        // release may still use them, and their pages may be unmapped
        // later. A fence that fails (or panics) stands for all the work
        // queued.
        let fence = if self.arenas[arena].slots[first..end]
            .iter()
            .any(|s| s.users == 1)
        {
            let backend = &mut self.backend;
            let t = std::panic::catch_unwind(AssertUnwindSafe(|| backend.fence()))
                .ok()
                .and_then(Result::ok)
                .unwrap_or(u64::MAX);
            self.fenced = self.fenced.max(t);
            t
        } else {
            0
        };
        for s in first..end {
            let slot = &mut self.arenas[arena].slots[s];
            slot.users -= 1;
            if slot.users == 0 {
                slot.since = now;
                slot.fence = fence;
                if slot.page.is_some() {
                    self.free_mapped.insert(arena, s);
                }
            }
        }
        let (mut start, mut len) = (block, n);
        if let Some((&ps, &(pl, pa))) = self.free.range(..block).next_back() {
            if pa == arena && ps + pl == block {
                self.remove_free(ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&(nl, na)) = self.free.get(&(block + n)) {
            if na == arena {
                self.remove_free(block + n);
                len += nl;
            }
        }
        self.insert_free(start, len, arena);
        self.stats.blocks -= 1;
        self.stats.block_bytes -= n;
        if read.is_ok() {
            self.maybe_sweep(now);
        }
    }

    fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    fn spare(&self) -> Option<usize> {
        Some(self.spare_bytes())
    }

    fn release_spare(&mut self) -> usize {
        self.release_before(u64::MAX)
    }

    fn collect_spare(&mut self) -> usize {
        if self.ttl == u64::MAX || self.spare_bytes() == 0 {
            return 0;
        }
        let now = self.clock.now_nanos();
        self.swept = now;
        now.checked_sub(self.ttl)
            .map_or(0, |before| self.release_before(before))
    }

    fn pages(&self) -> Option<MappedStats> {
        Some(self.stats())
    }
}

impl<B: PageBackend, C: Clock> Packable for Mapped<B, C> {
    #[inline]
    fn carve(segment: &usize, offset: usize) -> usize {
        segment
            .checked_add(offset)
            .expect("carving a block past the end of the address space")
    }

    #[inline]
    fn address(block: &usize) -> usize {
        *block
    }
}

impl<B: PageBackend, C: Clock> Drop for Mapped<B, C> {
    fn drop(&mut self) {
        self.settle_idle();
        self.release_spare();
        if self.stats.blocks > 0 {
            // Blocks still handed out may be in use: their pages and
            // ranges are leaked, never unmapped under them.
            return;
        }
        if self.wait_for(self.fenced).is_err() {
            // Work queued before a release may still use the ranges: they
            // and their pages are leaked, never unmapped under it.
            return;
        }
        for arena in &mut self.arenas {
            if let Some(range) = arena.range.take() {
                // SAFETY: no block is handed out, so the host uses the range
                // no more, and every fence taken has been waited on, so no
                // queued work does; pages a refused unmap left mapped are
                // unmapped with it, then leaked below (never released while
                // mapped).
                let _ = unsafe { self.backend.release_range(range) };
            }
            for s in &mut arena.slots {
                core::mem::forget(s.page.take());
            }
        }
    }
}
