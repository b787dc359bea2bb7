//! Internal: the model-checking harness of the page layer's
//! [`Mapped`] allocator, behind `fuzz/` and the corpus replay; not covered
//! by semver (feature `fuzzing`).
//!
//! The `fuzz/` target `mapped`, the property test `tests/it/mapped.rs` and
//! the stable corpus replay there all call [`mapped_ops`] / [`run_mapped`]
//! here, so the same checks run under libFuzzer and under `cargo test`.
//!
//! An input is a [`MappedConfig`] (a page size, an alignment, a reservation
//! of a few pages, a time-to-live for spare pages, an optional capacity
//! told to [`Mapped`] and an optional capacity of the modelled device, a
//! palette of request sizes in eighths of a page) followed by
//! [`MappedOp`]s. They run against a
//! `Mapped<`[`SharedModel`]`, ManualClock>`: [`ModelPages`] behind a
//! handle that the harness keeps too, which logs every call the allocator
//! makes of its backend ([`PageEvent`]) and fails the calls the input says.
//!
//! From the log the harness keeps its own picture of the backend: the live
//! reservations (and the sum of their lengths), which page each slot
//! shows, the live pages and, for each page, when it last became spare (the
//! allocator's rule: when the last block touching its slot went back; a
//! page created and not yet under a block counts as spare since time zero).
//! Of the caller it keeps the blocks held (in an ordered map too, and the
//! sum of their lengths), how many held blocks touch each slot, and the
//! spare pages ordered by when they became spare. All of it is kept step by
//! step, each change in `O(log n)`.
//!
//! After every step (each allocation of a burst and each deallocation
//! counts as one) it checks, in `O(1)` or `O(log n)` per block, slot, page
//! or reservation the step touched:
//! - the calls read from the log: a reservation aligned to the page and
//!   overlapping no other; a page created while not live, mapped only while
//!   live, into an empty slot and into one slot at a time, released once
//!   and never while mapped; a slot unmapped or a reservation freed only if
//!   mapped or live;
//! - the block just handed out: aligned, inside a live reservation,
//!   overlapping neither neighbour among the blocks held (so none), every
//!   slot it touches showing a page; every slot of a held block that the
//!   step unmapped shows a page again by its end, and no held block lies in
//!   a reservation the step freed unless in a live one;
//! - every byte is accounted: the allocator's [`MappedStats`] against the
//!   picture (blocks, block bytes, page bytes, mapped bytes, spare bytes,
//!   reserved bytes, pages created and released, maps and unmaps, reserves,
//!   allocations in place), its spare bytes against the spare pages, and
//!   the backend's live bytes against the page bytes (no page leaked, none
//!   counted that the backend does not hold); the device's capacity holds;
//! - a request of zero bytes fails with [`MappedError::ZeroSize`], one too
//!   large with [`MappedError::TooLarge`] or the backend's refusal of the
//!   reservation, and a refused request changes nothing; a request from the
//!   palette fails only for the modelled device's capacity or an injected
//!   failure, and never with nothing held when the device has room for one
//!   page more than the block spans;
//! - spare pages move (are unmapped to be mapped elsewhere) only when the
//!   capacity told to the allocator would not hold new ones, or creating
//!   one failed; pages are created past that capacity only once no spare
//!   page is left; an allocation never gives a page back;
//! - decay: `collect_spare` (and the sweep `deallocate` makes at most eight
//!   times a time-to-live) gives back only pages spare for at least the
//!   time-to-live, and every such page; `release_spare` every spare page;
//!   nothing else gives a page back (the due pages are a range of the spare
//!   pages ordered by time).
//!
//! Every 32 steps' checks, after a new allocator, after every step where a
//! request failed or a backend call failed (an injected failure included),
//! after the last operation (before the blocks go back) and after the
//! final decay, the whole check runs too (`O(n log n)` in what is held):
//! - [`Mapped::validate`] and [`ModelPages::validate`];
//! - the picture of the caller rebuilt from scratch and compared with the
//!   one kept: the blocks held sorted and checked for overlaps, each
//!   aligned and inside a live reservation, the slots they touch and how
//!   many touch each (every one showing a page), the sums, and the spare
//!   pages recomputed from the live pages, the slots and the blocks held.
//!
//! At the end the failures are disarmed and either every block goes back
//! (in an order the input chooses), the spare pages go (by
//! `release_spare`, or by a `collect_spare` once the time-to-live has
//! passed), and dropping the allocator frees every reservation, after which
//! [`ModelPages::validate_released`] must pass; or (flag `& 2`) the
//! allocator is dropped with blocks still held, which must give back the
//! spare pages only: the held blocks' pages stay mapped, their
//! reservations live (leaked, never unmapped under them).
//!
//! # Input layout
//!
//! Every field is read from one byte (missing bytes read as zero): see
//! [`MappedConfig`] and [`MappedOp`].
//!
//! # Examples
//!
//! ```
//! // Pages of 4096 bytes, align 512, reservations of 4 pages, ttl 4 ticks,
//! // no capacities, palette [1 page, 3/8 page], flags 1 (release_spare at
//! // the end), drop seed 0.
//! let mut input = vec![0, 0, 1, 3, 0, 0, 1, 5, 2, 1, 0];
//! // Allocate both, give the first back, advance 4 ticks, collect.
//! input.extend([0, 0, 0, 1, 5, 0, 10, 4, 12]);
//! let summary = decaying_pool::fuzzing::mapped::mapped_ops(&input).unwrap();
//! assert_eq!((summary.allocated, summary.decayed), (2, 1));
//! ```

use core::cell::RefCell;
use core::fmt;
use core::mem::ManuallyDrop;
use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use arbitrary::{Arbitrary, Unstructured};
// Hashed with foldhash, not SipHash: the harness hashes a slot or a page
// on every step, and SipHash, instrumented by the fuzzer, cost most of it.
use hashbrown::HashMap;

use crate::clock::ManualClock;
use crate::pages::{Mapped, MappedError, MappedStats, ModelPage, ModelPages, ModelRange};
use crate::pages::{PageBackend, PageError};
use crate::raw::RawAllocator;
use crate::testing::PanicSwitch;

/// Operations run per input at most.
pub const MAX_MAPPED_OPS: usize = 256;

/// One tick of the harness clock, in nanoseconds.
pub const MAPPED_TICK_NS: u64 = 1000;

/// When a run starts on the harness clock, in nanoseconds: one second,
/// well past every time-to-live, so that no block goes back at time zero
/// (the allocator counts pages created and never under a block as spare
/// since time zero: due at once).
pub const MAPPED_START_NS: u64 = 1_000_000_000;

/// Page sizes (byte 0 of a [`MappedConfig`]).
pub const MAPPED_PAGES: [usize; 5] = [4096, 512, 65_536, 2 << 20, 1024];

/// Alignments asked for (byte 1), which [`Mapped::with_align`] caps at the
/// page.
pub const MAPPED_ALIGNS: [usize; 5] = [512, 1, 64, 4096, 1 << 20];

/// Reservations, in pages (byte 2).
pub const MAPPED_RESERVATIONS: [usize; 6] = [1, 4, 16, 64, 3, 256];

/// Times-to-live of spare pages, in ticks (byte 3; `None`: kept until
/// `release_spare`).
pub const MAPPED_TTLS: [Option<u64>; 6] = [None, Some(0), Some(1), Some(4), Some(16), Some(64)];

/// Capacities, in pages (bytes 4 and 5, when `>= 128`).
pub const MAPPED_CAPACITIES: [usize; 8] = [0, 1, 2, 3, 4, 8, 16, 64];

/// Request sizes, in eighths of a page (palette entries; see
/// [`palette_size`]).
pub const MAPPED_EIGHTHS: [usize; 24] = [
    0, 1, 3, 4, 7, 8, 8, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 40, 64, 100, 127, 129, 256, 513,
];

/// Requests that must fail: zero, sizes whose rounding overflows or passes
/// `isize::MAX`, and sizes whose reservation the modelled backend refuses
/// (every page size here rounds them to 2⁶³).
pub const MAPPED_HUGE: [usize; 7] = [
    0,
    usize::MAX,
    usize::MAX - 1,
    1 << 63,
    isize::MAX as usize,
    isize::MAX as usize - 200,
    usize::MAX - 4095,
];

/// The size of palette entry `b` on pages of `page` bytes:
/// `MAPPED_EIGHTHS[b % 24]` eighths of a page, then one byte less, the
/// same, or one byte more (`b / 24 % 3`), at least one byte.
///
/// # Examples
///
/// ```
/// use decaying_pool::fuzzing::mapped::palette_size;
/// assert_eq!(palette_size(5, 4096), 4096);
/// assert_eq!(palette_size(5 + 24, 4096), 4097);
/// assert_eq!(palette_size(5 + 48, 4096), 4095);
/// assert_eq!(palette_size(0, 4096), 1);
/// ```
pub fn palette_size(b: u8, page: usize) -> usize {
    let eighths = MAPPED_EIGHTHS[usize::from(b) % MAPPED_EIGHTHS.len()];
    let base = eighths * page / 8;
    let size = match usize::from(b) / MAPPED_EIGHTHS.len() % 3 {
        0 => base,
        1 => base + 1,
        _ => base.saturating_sub(1),
    };
    size.max(1)
}

// --- the backend ------------------------------------------------------------

/// A call of a [`SharedModel`], for injected failures and panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageCall {
    /// [`PageBackend::reserve`].
    Reserve,
    /// [`PageBackend::create_page`].
    Create,
    /// [`PageBackend::map`].
    Map,
    /// [`PageBackend::unmap`].
    Unmap,
    /// [`PageBackend::fence`].
    Fence,
    /// [`PageBackend::wait`].
    Wait,
    /// [`PageBackend::release_page`].
    ReleasePage,
    /// [`PageBackend::release_range`].
    ReleaseRange,
}

/// Every [`PageCall`], in the order of [`MappedOp::Fail`]'s selector.
pub const PAGE_CALLS: [PageCall; 8] = [
    PageCall::Reserve,
    PageCall::Create,
    PageCall::Map,
    PageCall::Unmap,
    PageCall::Fence,
    PageCall::Wait,
    PageCall::ReleasePage,
    PageCall::ReleaseRange,
];

impl PageCall {
    fn index(self) -> usize {
        self as usize
    }
}

/// What a [`SharedModel`] did, in call order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageEvent {
    /// A reservation made.
    Reserved {
        /// Its first address.
        address: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A page created.
    Created {
        /// Its number.
        page: u32,
    },
    /// A run of pages mapped.
    Mapped {
        /// The address of the run's first slot.
        address: usize,
        /// The pages, slot by slot.
        pages: Vec<u32>,
    },
    /// A run of slots unmapped.
    Unmapped {
        /// The address of the run's first slot.
        address: usize,
        /// How many slots.
        count: usize,
    },
    /// A page released.
    ReleasedPage {
        /// Its number.
        page: u32,
    },
    /// A reservation freed (its mapped slots unmapped with it).
    ReleasedRange {
        /// Its first address.
        address: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A wait on a fence's ticket ([`PageBackend::wait`]).
    Waited {
        /// The ticket (`u64::MAX`: all the work queued).
        ticket: u64,
    },
    /// A call refused, by an injected failure or by the model.
    Failed {
        /// The call.
        call: PageCall,
        /// Why.
        error: SharedModelError,
    },
}

/// Why a [`SharedModel`] call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedModelError {
    /// A failure injected by [`SharedModel::fail_next`]; the call did
    /// nothing.
    Injected(PageCall),
    /// The model refused.
    Model(PageError),
}

impl fmt::Display for SharedModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedModelError::Injected(call) => write!(f, "injected failure of {call:?}"),
            SharedModelError::Model(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SharedModelError {}

#[derive(Debug)]
struct ModelState {
    pages: ModelPages,
    log: Vec<PageEvent>,
    fail: [u32; PAGE_CALLS.len()],
    /// Panic on this call from now (1: the next), counting every call.
    panic_in: Option<u32>,
    /// The call an injected panic hit, once it did.
    panicked: Option<PageCall>,
    calls: u64,
}

/// A [`PageBackend`]: [`ModelPages`] behind a shared handle, so that the
/// [`ModelPages`] can be checked while (and after) a [`Mapped`] owns the
/// backend. Every call is logged ([`PageEvent`]); calls can be made to
/// fail ([`fail_next`](Self::fail_next)) or to panic
/// ([`panic_on_call`](Self::panic_on_call)). An injected failure or panic
/// comes before the call reaches the model: the call does nothing.
///
/// # Examples
///
/// ```
/// use decaying_pool::fuzzing::mapped::{PageCall, SharedModel};
/// use decaying_pool::pages::{Mapped, MappedError, ModelPages};
/// use decaying_pool::RawAllocator;
///
/// let backend = SharedModel::new(ModelPages::new(4096)?);
/// let mut m = Mapped::new(backend.clone());
/// backend.fail_next(PageCall::Create, 1);
/// assert!(matches!(m.allocate(100), Err(MappedError::Backend(_))));
/// let a = m.allocate(100)?;
/// // SAFETY: `a` came from `allocate(100)`, given back once.
/// unsafe { m.deallocate(a, 100) };
/// drop(m);
/// backend.with_pages(|p| p.validate_released())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct SharedModel {
    state: Rc<RefCell<ModelState>>,
}

impl SharedModel {
    /// `pages` behind a shared handle, nothing armed.
    pub fn new(pages: ModelPages) -> Self {
        SharedModel {
            state: Rc::new(RefCell::new(ModelState {
                pages,
                log: Vec::new(),
                fail: [0; PAGE_CALLS.len()],
                panic_in: None,
                panicked: None,
                calls: 0,
            })),
        }
    }

    /// Makes the next `n` calls of `call` fail (replacing what was armed
    /// for it).
    pub fn fail_next(&self, call: PageCall, n: u32) {
        self.state.borrow_mut().fail[call.index()] = n;
    }

    /// Disarms every injected failure.
    pub fn disarm(&self) {
        let mut s = self.state.borrow_mut();
        s.fail = [0; PAGE_CALLS.len()];
        s.panic_in = None;
    }

    /// Makes the `nth` call from now (`Some(1)`: the next), of any kind,
    /// panic before it reaches the model; `None` disarms. The panic's
    /// message starts with [`PanicSwitch::MESSAGE`], and the panic hook
    /// keeps quiet about it.
    pub fn panic_on_call(&self, nth: Option<u32>) {
        super::quiet_injected_panics();
        self.state.borrow_mut().panic_in = nth.filter(|&n| n > 0);
    }

    /// The call an injected panic hit, if one did.
    pub fn panicked(&self) -> Option<PageCall> {
        self.state.borrow().panicked
    }

    /// The calls made so far (those that failed or panicked included; the
    /// accessors `granularity`, `range_address` and `range_len` not).
    pub fn calls(&self) -> u64 {
        self.state.borrow().calls
    }

    /// Takes the log of the calls made since the last time.
    pub fn take_log(&self) -> Vec<PageEvent> {
        core::mem::take(&mut self.state.borrow_mut().log)
    }

    /// [`ModelPages::queue_work`] on the model.
    pub fn queue_work(&self, address: usize, len: usize) {
        self.state.borrow_mut().pages.queue_work(address, len);
    }

    /// Runs `f` on the model.
    pub fn with_pages<R>(&self, f: impl FnOnce(&ModelPages) -> R) -> R {
        f(&self.state.borrow().pages)
    }

    /// Counts a call; panics if armed to; fails it if armed to.
    fn enter(&self, call: PageCall) -> Result<(), SharedModelError> {
        let panic = {
            let mut s = self.state.borrow_mut();
            s.calls += 1;
            match s.panic_in {
                Some(1) => {
                    s.panic_in = None;
                    s.panicked = Some(call);
                    true
                }
                Some(n) => {
                    s.panic_in = Some(n - 1);
                    false
                }
                None => false,
            }
        };
        if panic {
            panic!("{} (page backend, {call:?})", PanicSwitch::MESSAGE);
        }
        let mut s = self.state.borrow_mut();
        let pending = &mut s.fail[call.index()];
        if *pending > 0 {
            *pending -= 1;
            let error = SharedModelError::Injected(call);
            s.log.push(PageEvent::Failed { call, error });
            return Err(error);
        }
        Ok(())
    }

    /// Logs `event` for an `Ok`, a `Failed` for an `Err`.
    fn log<T>(
        &self,
        call: PageCall,
        result: Result<T, PageError>,
        event: impl FnOnce(&T) -> PageEvent,
    ) -> Result<T, SharedModelError> {
        let mut s = self.state.borrow_mut();
        match result {
            Ok(v) => {
                s.log.push(event(&v));
                Ok(v)
            }
            Err(e) => {
                let error = SharedModelError::Model(e);
                s.log.push(PageEvent::Failed { call, error });
                Err(error)
            }
        }
    }
}

impl PageBackend for SharedModel {
    type Range = ModelRange;
    type Page = ModelPage;
    type Error = SharedModelError;

    fn granularity(&self) -> usize {
        self.state.borrow().pages.granularity()
    }

    fn reserve(&mut self, bytes: usize) -> Result<ModelRange, SharedModelError> {
        self.enter(PageCall::Reserve)?;
        let r = self.state.borrow_mut().pages.reserve(bytes);
        self.log(PageCall::Reserve, r, |r| PageEvent::Reserved {
            address: r.address(),
            len: r.len(),
        })
    }

    fn range_address(&self, range: &ModelRange) -> usize {
        range.address()
    }

    fn range_len(&self, range: &ModelRange) -> usize {
        range.len()
    }

    unsafe fn release_range(&mut self, range: ModelRange) -> Result<(), SharedModelError> {
        self.enter(PageCall::ReleaseRange)?;
        let (address, len) = (range.address(), range.len());
        // SAFETY: the caller's contract, passed on unchanged.
        let r = unsafe { self.state.borrow_mut().pages.release_range(range) };
        self.log(PageCall::ReleaseRange, r, |()| PageEvent::ReleasedRange {
            address,
            len,
        })
    }

    fn create_page(&mut self) -> Result<ModelPage, SharedModelError> {
        self.enter(PageCall::Create)?;
        let r = self.state.borrow_mut().pages.create_page();
        self.log(PageCall::Create, r, |p| PageEvent::Created {
            page: p.index(),
        })
    }

    unsafe fn release_page(&mut self, page: ModelPage) -> Result<(), SharedModelError> {
        self.enter(PageCall::ReleasePage)?;
        let id = page.index();
        // SAFETY: the caller's contract, passed on unchanged.
        let r = unsafe { self.state.borrow_mut().pages.release_page(page) };
        self.log(PageCall::ReleasePage, r, |()| PageEvent::ReleasedPage {
            page: id,
        })
    }

    fn map(
        &mut self,
        range: &mut ModelRange,
        offset: usize,
        pages: &[ModelPage],
    ) -> Result<(), SharedModelError> {
        self.enter(PageCall::Map)?;
        let r = self.state.borrow_mut().pages.map(range, offset, pages);
        self.log(PageCall::Map, r, |()| PageEvent::Mapped {
            address: range.address() + offset,
            pages: pages.iter().map(ModelPage::index).collect(),
        })
    }

    unsafe fn unmap(
        &mut self,
        range: &mut ModelRange,
        offset: usize,
        count: usize,
    ) -> Result<(), SharedModelError> {
        self.enter(PageCall::Unmap)?;
        // SAFETY: the caller's contract, passed on unchanged.
        let r = unsafe { self.state.borrow_mut().pages.unmap(range, offset, count) };
        self.log(PageCall::Unmap, r, |()| PageEvent::Unmapped {
            address: range.address() + offset,
            count,
        })
    }

    fn fence(&mut self) -> Result<u64, SharedModelError> {
        self.enter(PageCall::Fence)?;
        let r = self.state.borrow_mut().pages.fence();
        r.map_err(SharedModelError::Model)
    }

    fn wait(&mut self, ticket: u64) -> Result<(), SharedModelError> {
        self.enter(PageCall::Wait)?;
        let r = self.state.borrow_mut().pages.wait(ticket);
        self.log(PageCall::Wait, r, |()| PageEvent::Waited { ticket })
    }
}

// --- the input ----------------------------------------------------------------

/// The configuration of a run.
///
/// Layout, one byte each: page size (index into [`MAPPED_PAGES`]);
/// alignment (index into [`MAPPED_ALIGNS`]); reservation (index into
/// [`MAPPED_RESERVATIONS`], in pages); time-to-live (index into
/// [`MAPPED_TTLS`]); the capacity told to [`Mapped`] (`< 128`: none, else
/// an index into [`MAPPED_CAPACITIES`], in pages); the modelled device's
/// capacity (the same); palette length (`1 + b % 6`); that many palette
/// entries (see [`palette_size`]); flags (`& 1`: `release_spare` at the
/// end instead of letting the time-to-live pass; `& 2`: drop the allocator
/// with the blocks still held); drop-order seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedConfig {
    /// The page size in bytes.
    pub page: usize,
    /// The alignment asked for ([`Mapped::with_align`]).
    pub align: usize,
    /// The reservation in bytes ([`Mapped::with_reservation`]).
    pub reservation: usize,
    /// How long spare pages are kept, in ticks.
    pub ttl: Option<u64>,
    /// The capacity told to the allocator ([`Mapped::with_capacity`]), in
    /// bytes.
    pub capacity: Option<usize>,
    /// The modelled device's capacity ([`ModelPages::with_capacity`]), in
    /// bytes.
    pub device: Option<usize>,
    /// The request sizes operations choose from, in bytes.
    pub palette: Vec<usize>,
    /// `release_spare` at the end, instead of a `collect_spare` once the
    /// time-to-live has passed.
    pub release_at_end: bool,
    /// Drop the allocator with the blocks still held.
    pub leak_at_end: bool,
    /// Chooses the order blocks are given back at the end.
    pub drop_seed: u8,
}

fn byte(u: &mut Unstructured<'_>) -> arbitrary::Result<u8> {
    u8::arbitrary(u)
}

fn pick<T: Copy>(table: &[T], b: u8) -> T {
    table[usize::from(b) % table.len()]
}

impl<'a> Arbitrary<'a> for MappedConfig {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let page = pick(&MAPPED_PAGES, byte(u)?);
        let align = pick(&MAPPED_ALIGNS, byte(u)?);
        let reservation = pick(&MAPPED_RESERVATIONS, byte(u)?) * page;
        let ttl = pick(&MAPPED_TTLS, byte(u)?);
        let capacity = byte(u)?;
        let capacity = (capacity >= 128).then(|| pick(&MAPPED_CAPACITIES, capacity) * page);
        let device = byte(u)?;
        let device = (device >= 128).then(|| pick(&MAPPED_CAPACITIES, device) * page);
        let len = 1 + usize::from(byte(u)?) % 6;
        let mut palette = Vec::with_capacity(len);
        for _ in 0..len {
            palette.push(palette_size(byte(u)?, page));
        }
        let flags = byte(u)?;
        let drop_seed = byte(u)?;
        Ok(MappedConfig {
            page,
            align,
            reservation,
            ttl,
            capacity,
            device,
            palette,
            release_at_end: flags & 1 == 1,
            leak_at_end: flags & 2 == 2,
            drop_seed,
        })
    }
}

/// A `mapped` operation.
///
/// Layout: a tag byte, `% 16`, then its arguments, one byte each:
/// `0..=3` allocate (palette index), `4` allocate a size of
/// [`MAPPED_HUGE`] (index), `5..=7` deallocate the i-th held block
/// (index), `8` deallocate the i-th held block and allocate its size again
/// (index), `9` allocate a burst of `1 + n % 8` blocks of one palette size
/// (palette index, n), `10..=11` advance the clock (ticks `% 80`), `12`
/// `collect_spare`, `13` `release_spare`, `14` fail the next `n` calls of
/// one kind (`b % 4`: reserve, create, map, unmap; `n = b / 4 % 4`), `15`
/// deallocate every other held block (offset `& 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappedOp {
    /// `allocate(palette[i])`.
    Allocate(u8),
    /// `allocate(MAPPED_HUGE[i])`.
    AllocateHuge(u8),
    /// Deallocates the i-th held block (modulo the count).
    Deallocate(u8),
    /// Deallocates the i-th held block, then allocates its size again.
    Reallocate(u8),
    /// Allocates `1 + n % 8` blocks of `palette[i]`.
    Burst {
        /// Palette index.
        size: u8,
        /// Count, `1 + n % 8`.
        n: u8,
    },
    /// Advances the clock by this many ticks.
    Advance(u8),
    /// `collect_spare`.
    Collect,
    /// `release_spare`.
    ReleaseSpare,
    /// Fails the next `n` calls of `PAGE_CALLS[call]` (`call < 4`).
    Fail {
        /// Index into [`PAGE_CALLS`].
        call: u8,
        /// How many.
        n: u8,
    },
    /// Deallocates every other held block (starting at `offset & 1`).
    DeallocateAlternate(u8),
}

impl<'a> Arbitrary<'a> for MappedOp {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match byte(u)? % 16 {
            0..=3 => MappedOp::Allocate(byte(u)?),
            4 => MappedOp::AllocateHuge(byte(u)?),
            5..=7 => MappedOp::Deallocate(byte(u)?),
            8 => MappedOp::Reallocate(byte(u)?),
            9 => MappedOp::Burst {
                size: byte(u)?,
                n: byte(u)?,
            },
            10..=11 => MappedOp::Advance(byte(u)? % 80),
            12 => MappedOp::Collect,
            13 => MappedOp::ReleaseSpare,
            14 => {
                let b = byte(u)?;
                MappedOp::Fail {
                    call: b % 4,
                    n: b / 4 % 4,
                }
            }
            _ => MappedOp::DeallocateAlternate(byte(u)?),
        })
    }
}

/// A `mapped` input: a [`MappedConfig`], then [`MappedOp`]s to the end of
/// the data (at most [`MAX_MAPPED_OPS`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedInput {
    /// The configuration.
    pub config: MappedConfig,
    /// The operations.
    pub ops: Vec<MappedOp>,
}

impl<'a> Arbitrary<'a> for MappedInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let config = MappedConfig::arbitrary(u)?;
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_MAPPED_OPS {
            ops.push(MappedOp::arbitrary(u)?);
        }
        Ok(MappedInput { config, ops })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        Self::arbitrary(&mut u)
    }
}

/// What a run reached, for corpus coverage checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappedSummary {
    /// Operations run.
    pub ops: usize,
    /// Blocks handed out.
    pub allocated: u64,
    /// Blocks given back (the final ones included).
    pub deallocated: u64,
    /// Requests refused as zero or too large ([`MappedError::ZeroSize`],
    /// [`MappedError::TooLarge`], or the backend's refusal to reserve).
    pub refused: u64,
    /// Requests that failed for the modelled device's capacity.
    pub out_of_memory: u64,
    /// Requests that failed by an injected failure.
    pub injected: u64,
    /// Pages created.
    pub pages_created: u64,
    /// Pages released (the final ones included).
    pub pages_released: u64,
    /// Pages released by decay (`collect_spare` or the sweep in
    /// `deallocate`).
    pub decayed: u64,
    /// Deallocations whose sweep released pages.
    pub inline_sweeps: u64,
    /// Allocations that moved spare pages (unmapped them to map them
    /// under the block).
    pub moves: u64,
    /// Allocations served without a page created.
    pub reused: u64,
    /// Allocations that mapped spare pages (idle or moved) under the block.
    pub remapped: u64,
    /// Most blocks held at once.
    pub peak_blocks: usize,
    /// Most slots touched by two held blocks at once.
    pub peak_shared_slots: usize,
    /// Most bytes of pages at once.
    pub peak_page_bytes: usize,
    /// Reservations made.
    pub reserves: u64,
    /// The allocator was dropped with blocks held.
    pub leaked_at_drop: bool,
}

/// Parses `data` as a [`MappedInput`] and runs it with [`run_mapped`].
/// Returns `None` when the data cannot be parsed (never, with this
/// layout).
///
/// # Panics
///
/// When a check fails.
pub fn mapped_ops(data: &[u8]) -> Option<MappedSummary> {
    let input = MappedInput::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    Some(run_mapped(&input))
}

// --- the harness ----------------------------------------------------------------

/// Whether an allocation past all memory fails here, as the allocator
/// expects when it asks for the slot table of a reservation too large to
/// map: not under Miri (which reports resource exhaustion) nor under
/// `cargo fuzz` (whose sanitizer and libFuzzer's malloc limit abort), where
/// the harness makes no such request.
#[allow(unexpected_cfgs)] // `fuzzing`: set by `cargo fuzz`
fn huge_allocations_fail() -> bool {
    !cfg!(miri) && !cfg!(fuzzing)
}

type Subject = Mapped<SharedModel, ManualClock>;

/// How many steps' checks run between two whole checks.
///
/// A whole check ([`Harness::check_whole`]) walks every block held, slot,
/// page and reservation, both sides' `validate()` included: `O(n log n)`
/// in what is held, so running it after every step made a run of `n` steps
/// cost `O(n²)` (`mapped` ran about 830 inputs a second). The checks of one
/// step ([`Harness::check`]) are `O(1)` or `O(log n)` per block, slot or
/// page the step touched and catch at once what a step breaks in the
/// counters or in what it touched; the whole check, once in 32 checks
/// (besides after every failure and at the end of the run), still catches
/// what they cannot see (the allocator's inner bookkeeping, a drift of the
/// incremental picture) within 32 steps of its cause, at about the cost of
/// the per-step checks.
const FULL_CHECK_EVERY: usize = 32;

/// A block the caller holds.
#[derive(Clone, Copy, Debug)]
struct Held {
    block: usize,
    size: usize,
    /// Its size rounded to the alignment.
    len: usize,
}

/// What one operation's calls did, read from the log.
#[derive(Debug, Default)]
struct Effects {
    created: u64,
    released: Vec<u32>,
    maps: u64,
    unmaps: u64,
    reserves: u64,
    failed: Vec<(PageCall, SharedModelError)>,
    /// Pages mapped by this operation that were live before it.
    remapped: u64,
    /// Waits on fences.
    waits: u64,
}

impl Effects {
    fn failed(&self, call: PageCall) -> bool {
        self.failed.iter().any(|&(c, _)| c == call)
    }

    fn injected(&self) -> bool {
        self.failed
            .iter()
            .any(|(_, e)| matches!(e, SharedModelError::Injected(_)))
    }
}

/// The pages a decay may give back: the spare ones spare since `cutoff`
/// or earlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    /// Nothing may go back.
    None,
    /// Pages spare since this time (nanoseconds) or earlier, and all of them.
    Due(u64),
    /// Every spare page.
    All,
}

struct Harness {
    /// Never dropped on a failed check: dropping an allocator whose state
    /// is off could panic again while unwinding and abort.
    mapped: ManuallyDrop<Subject>,
    backend: SharedModel,
    clock: ManualClock,
    cfg: MappedConfig,
    /// The alignment the allocator uses.
    align: usize,
    ttl: Option<u64>,
    held: Vec<Held>,
    /// The blocks held, address → length: a new block's neighbours are
    /// found in `O(log n)`.
    spans: BTreeMap<usize, usize>,
    /// Σ the lengths of the blocks held.
    block_bytes: usize,
    /// Slots (address / page) touched by held blocks → how many.
    pinned: HashMap<usize, usize>,
    /// Slots touched by two held blocks or more.
    shared_slots: usize,
    /// Σ the lengths of the live reservations.
    reserved_bytes: usize,
    /// The spare pages (live, under no held block), by when they became
    /// spare: the due ones are a range.
    spare: BTreeSet<(u64, u32)>,
    /// Slots of held blocks unmapped by this step: each must show a page
    /// again by its end.
    unmapped_pinned: Vec<usize>,
    /// Reservations freed by this step: no block held may lie in one but
    /// inside a live reservation.
    freed_ranges: Vec<(usize, usize)>,
    /// Checks run (per step), for [`FULL_CHECK_EVERY`].
    checks: usize,
    /// Live reservations: address → length.
    ranges: BTreeMap<usize, usize>,
    /// Mapped slots: address → page.
    slots: BTreeMap<usize, u32>,
    /// Where each mapped page shows.
    slot_of: HashMap<u32, usize>,
    /// Live pages → when they last became spare (nanoseconds).
    since: HashMap<u32, u64>,
    /// When the allocator last swept (nanoseconds).
    swept: u64,
    created: u64,
    released: u64,
    maps: u64,
    unmaps: u64,
    /// Allocations that mapped nothing (free mapped space only).
    in_place: u64,
    step: usize,
    summary: MappedSummary,
}

impl Harness {
    fn page(&self) -> usize {
        self.cfg.page
    }

    fn now(&self) -> u64 {
        crate::clock::Clock::now_nanos(&self.clock)
    }

    /// The slot addresses `[block, block + len)` touches.
    fn slots_of(&self, block: usize, len: usize) -> core::ops::Range<usize> {
        let g = self.page();
        block / g..(block + len).div_ceil(g)
    }

    /// Reads the log into the picture of the backend.
    fn sync(&mut self) -> Effects {
        let g = self.page();
        let mut fx = Effects::default();
        // Pages created by this operation (the others mapped were live).
        let mut new = BTreeSet::new();
        for event in self.backend.take_log() {
            match event {
                PageEvent::Reserved { address, len } => {
                    assert_eq!(address % g, 0, "a reservation not aligned to the page");
                    if let Some((&a, &l)) = self.ranges.range(..address + len).next_back() {
                        assert!(a + l <= address, "reservations overlap");
                    }
                    self.ranges.insert(address, len);
                    self.reserved_bytes += len;
                    fx.reserves += 1;
                }
                PageEvent::Created { page } => {
                    assert!(
                        self.since.insert(page, 0).is_none(),
                        "page {page} created while live"
                    );
                    self.respare(page);
                    new.insert(page);
                    fx.created += 1;
                }
                PageEvent::Mapped { address, pages } => {
                    for (i, &p) in pages.iter().enumerate() {
                        let at = address + i * g;
                        assert!(self.since.contains_key(&p), "page {p} mapped, not live");
                        assert!(
                            self.slots.insert(at, p).is_none(),
                            "slot {at:#x} mapped twice"
                        );
                        assert!(
                            self.slot_of.insert(p, at).is_none(),
                            "page {p} mapped in two slots"
                        );
                        // A page shown in no slot was spare; it stays so
                        // unless its new slot is a held block's.
                        if self.pinned.contains_key(&(at / g)) {
                            self.unspare(p);
                        }
                        if !new.contains(&p) {
                            fx.remapped += 1;
                        }
                    }
                    fx.maps += 1;
                }
                PageEvent::Unmapped { address, count } => {
                    for i in 0..count {
                        assert!(
                            self.unmap_slot(address + i * g),
                            "an unmapped slot was mapped"
                        );
                    }
                    fx.unmaps += 1;
                }
                PageEvent::ReleasedPage { page } => {
                    assert!(
                        !self.slot_of.contains_key(&page),
                        "page {page} released while mapped"
                    );
                    self.unspare(page);
                    assert!(
                        self.since.remove(&page).is_some(),
                        "page {page} released twice"
                    );
                    fx.released.push(page);
                }
                PageEvent::ReleasedRange { address, len } => {
                    assert_eq!(self.ranges.remove(&address), Some(len), "range freed twice");
                    self.reserved_bytes -= len;
                    self.freed_ranges.push((address, len));
                    let gone: Vec<usize> = self
                        .slots
                        .range(address..address + len)
                        .map(|(&a, _)| a)
                        .collect();
                    for a in gone {
                        assert!(self.unmap_slot(a), "a mapped slot");
                    }
                }
                PageEvent::Waited { .. } => fx.waits += 1,
                PageEvent::Failed { call, error } => fx.failed.push((call, error)),
            }
        }
        self.created += fx.created;
        self.released += fx.released.len() as u64;
        self.maps += fx.maps;
        self.unmaps += fx.unmaps;
        self.summary.pages_created += fx.created;
        self.summary.pages_released += fx.released.len() as u64;
        self.summary.reserves += fx.reserves;
        fx
    }

    /// Takes slot `at` out of the picture (unmapped); whether it showed a
    /// page. A slot of a held block is noted, to be checked at the end of
    /// the step.
    fn unmap_slot(&mut self, at: usize) -> bool {
        let Some(p) = self.slots.remove(&at) else {
            return false;
        };
        self.slot_of.remove(&p);
        // A page unmapped from a held block's slot becomes spare; from any
        // other slot, it was spare and stays so.
        let s = at / self.page();
        if self.pinned.contains_key(&s) {
            self.respare(p);
            self.unmapped_pinned.push(s);
        }
        true
    }

    /// Whether live page `p` is spare: shown in no slot of a held block.
    fn is_spare(&self, p: u32) -> bool {
        let g = self.page();
        self.slot_of
            .get(&p)
            .is_none_or(|&at| !self.pinned.contains_key(&(at / g)))
    }

    /// Takes page `p` out of the spare set, before what makes it spare or
    /// not changes.
    fn unspare(&mut self, p: u32) {
        if let Some(&t) = self.since.get(&p) {
            self.spare.remove(&(t, p));
        }
    }

    /// Puts page `p` back into the spare set if it is live and spare, after
    /// what makes it spare or not changed.
    fn respare(&mut self, p: u32) {
        if let Some(&t) = self.since.get(&p) {
            if self.is_spare(p) {
                self.spare.insert((t, p));
            }
        }
    }

    /// The spare pages (live, under no held block) and when each became
    /// spare, from scratch.
    fn spare_pages(&self) -> Vec<(u32, u64)> {
        let g = self.page();
        self.since
            .iter()
            .filter(|&(p, _)| {
                self.slot_of
                    .get(p)
                    .is_none_or(|&at| !self.pinned.contains_key(&(at / g)))
            })
            .map(|(&p, &t)| (p, t))
            .collect()
    }

    /// Checks the pages given back by one operation against what it may
    /// give back, and what is left.
    fn check_releases(
        &self,
        what: &dyn fmt::Debug,
        fx: &Effects,
        due: &BTreeSet<u32>,
        rule: Release,
    ) {
        let step = self.step;
        match rule {
            Release::None => assert!(
                fx.released.is_empty(),
                "step {step} ({what:?}): pages {:?} given back",
                fx.released
            ),
            Release::Due(cutoff) => {
                for p in &fx.released {
                    assert!(
                        due.contains(p),
                        "step {step} ({what:?}): page {p} given back before its time-to-live"
                    );
                }
                if !fx.failed(PageCall::Unmap) && !fx.failed(PageCall::Wait) {
                    // The spare set is ordered by time: the first is the
                    // oldest.
                    assert!(
                        self.spare.first().is_none_or(|&(t, _)| t > cutoff),
                        "step {step} ({what:?}): spare pages past their time-to-live left \
                         (cutoff {cutoff}): {:?}",
                        self.spare.range(..=(cutoff, u32::MAX)).collect::<Vec<_>>()
                    );
                }
            }
            Release::All => {
                if !fx.failed(PageCall::Unmap) && !fx.failed(PageCall::Wait) {
                    assert!(
                        self.spare.is_empty(),
                        "step {step} ({what:?}): spare pages left after release_spare: {:?}",
                        self.spare
                    );
                }
            }
        }
    }

    /// The checks after a step: `O(1)`, plus `O(log n)` per slot or
    /// reservation the step unmapped or freed (see the module
    /// documentation); the whole check too after an eventful step (a
    /// failure, an injected one included), and once in
    /// [`FULL_CHECK_EVERY`] checks.
    fn check(&mut self, what: &dyn fmt::Debug, eventful: bool) {
        let step = self.step;
        let g = self.page();
        // The slots of held blocks unmapped by the step show a page again.
        for s in core::mem::take(&mut self.unmapped_pinned) {
            assert!(
                !self.pinned.contains_key(&s) || self.slots.contains_key(&(s * g)),
                "step {step} ({what:?}): slot {:#x} of a held block shows no page",
                s * g
            );
        }
        // No held block lies in a reservation the step freed, unless in a
        // live one (made again by the step).
        for (a, len) in core::mem::take(&mut self.freed_ranges) {
            for (&block, &blen) in self.spans.range(..a + len).rev() {
                if block + blen <= a {
                    break;
                }
                self.check_inside(block, blen, what);
            }
        }
        self.checks += 1;
        if eventful || self.checks % FULL_CHECK_EVERY == 0 {
            self.check_whole(what);
        }
        self.summary.peak_shared_slots = self.summary.peak_shared_slots.max(self.shared_slots);
        // Every byte accounted.
        let s: MappedStats = self.mapped.stats();
        let live = self.since.len();
        // The held blocks' slots all show pages, each its own: the rest
        // are spare.
        let spare = live - self.pinned.len();
        assert_eq!(
            self.spare.len(),
            spare,
            "step {step} ({what:?}): spare pages against live pages less the held blocks' slots"
        );
        let expected = (
            s.blocks,
            s.block_bytes,
            s.page_bytes,
            s.mapped_bytes,
            s.spare_bytes,
            s.reserved_bytes,
            s.pages_created,
            s.pages_released,
            s.maps,
            s.unmaps,
            s.reserves,
            s.reused,
        );
        let picture = (
            self.held.len(),
            self.block_bytes,
            live * g,
            self.slots.len() * g,
            spare * g,
            self.reserved_bytes,
            self.created,
            self.released,
            self.maps,
            self.unmaps,
            self.ranges.len() as u64,
            self.in_place,
        );
        assert_eq!(
            expected, picture,
            "step {step} ({what:?}): (blocks, block bytes, page bytes, mapped bytes, spare bytes, \
             reserved bytes, created, released, maps, unmaps, reserves, reused in place) against \
             the backend's log"
        );
        assert_eq!(self.mapped.spare(), Some(spare * g));
        assert_eq!(
            self.backend.with_pages(ModelPages::live_bytes),
            s.page_bytes,
            "step {step} ({what:?}): the backend's live bytes against the allocator's pages"
        );
        if let Some(device) = self.cfg.device {
            assert!(
                s.page_bytes <= device,
                "step {step}: past the device's capacity"
            );
        }
        self.summary.peak_page_bytes = self.summary.peak_page_bytes.max(s.page_bytes);
        assert_eq!(
            s.peak_page_bytes, self.summary.peak_page_bytes,
            "step {step} ({what:?}): the peak of page bytes"
        );
        self.summary.peak_blocks = self.summary.peak_blocks.max(self.held.len());
    }

    /// Checks that the held block of `len` bytes at `block` lies inside a
    /// live reservation.
    fn check_inside(&self, block: usize, len: usize, what: &dyn fmt::Debug) {
        let step = self.step;
        let inside = self
            .ranges
            .range(..=block)
            .next_back()
            .is_some_and(|(&a, &l)| block + len <= a + l);
        assert!(
            inside,
            "step {step} ({what:?}): block {block:#x} ({len} bytes) outside every reservation"
        );
    }

    /// Checks the block just handed out and adds it to the picture, in
    /// `O(log n)` per slot it touches: aligned, inside a live reservation,
    /// overlapping neither neighbour among the blocks held (so none), every
    /// slot it touches showing a page.
    fn hold(&mut self, h: Held, what: &dyn fmt::Debug) {
        let step = self.step;
        let g = self.page();
        assert_eq!(
            h.block % self.align,
            0,
            "step {step} ({what:?}): block {h:?} not aligned to {}",
            self.align
        );
        self.check_inside(h.block, h.len, what);
        if let Some((&b, &l)) = self.spans.range(..=h.block).next_back() {
            assert!(
                b + l <= h.block,
                "step {step} ({what:?}): blocks [{b:#x}, {:#x}) and {h:?} overlap",
                b + l
            );
        }
        if let Some((&b, &l)) = self.spans.range(h.block + 1..).next() {
            assert!(
                h.block + h.len <= b,
                "step {step} ({what:?}): blocks {h:?} and [{b:#x}, {:#x}) overlap",
                b + l
            );
        }
        self.spans.insert(h.block, h.len);
        self.block_bytes += h.len;
        for s in self.slots_of(h.block, h.len) {
            let users = self.pinned.entry(s).or_insert(0);
            *users += 1;
            match *users {
                1 => {
                    // Its page, if any, is under a held block now.
                    if let Some(&p) = self.slots.get(&(s * g)) {
                        self.unspare(p);
                    }
                }
                2 => self.shared_slots += 1,
                _ => {}
            }
            assert!(
                self.slots.contains_key(&(s * g)),
                "step {step} ({what:?}): slot {:#x} of a held block shows no page",
                s * g
            );
        }
        self.held.push(h);
    }

    /// The whole check: both sides' `validate()`, and the picture rebuilt
    /// from scratch: the blocks held sorted and checked for overlaps, each
    /// aligned and inside a live reservation, every slot they touch showing
    /// a page and counted, the sums, and the spare pages. `O(n log n)`.
    fn check_whole(&mut self, what: &dyn fmt::Debug) {
        let step = self.step;
        let g = self.page();
        if let Err(e) = self.mapped.validate() {
            panic!("step {step} ({what:?}): Mapped::validate: {e}");
        }
        if let Err(e) = self.backend.with_pages(ModelPages::validate) {
            panic!("step {step} ({what:?}): ModelPages::validate: {e}");
        }
        // The blocks held: disjoint, aligned, inside a live reservation.
        let mut blocks: Vec<Held> = self.held.clone();
        blocks.sort_by_key(|h| h.block);
        for w in blocks.windows(2) {
            assert!(
                w[0].block + w[0].len <= w[1].block,
                "step {step} ({what:?}): blocks {:?} and {:?} overlap",
                w[0],
                w[1]
            );
        }
        let mut pinned: HashMap<usize, usize> = HashMap::new();
        for h in &blocks {
            assert_eq!(
                h.block % self.align,
                0,
                "step {step} ({what:?}): block {h:?} not aligned to {}",
                self.align
            );
            self.check_inside(h.block, h.len, what);
            for s in self.slots_of(h.block, h.len) {
                *pinned.entry(s).or_insert(0) += 1;
            }
        }
        assert!(
            blocks
                .iter()
                .map(|h| (h.block, h.len))
                .eq(self.spans.iter().map(|(&b, &l)| (b, l))),
            "step {step} ({what:?}): the blocks held against their spans"
        );
        assert_eq!(
            blocks.iter().map(|h| h.len).sum::<usize>(),
            self.block_bytes,
            "step {step} ({what:?}): the bytes of the blocks held"
        );
        assert_eq!(
            pinned, self.pinned,
            "step {step} ({what:?}): the slots of the blocks held"
        );
        // Every slot a held block touches shows a page.
        for &s in pinned.keys() {
            assert!(
                self.slots.contains_key(&(s * g)),
                "step {step} ({what:?}): slot {:#x} of a held block shows no page",
                s * g
            );
        }
        assert_eq!(
            pinned.values().filter(|&&n| n > 1).count(),
            self.shared_slots,
            "step {step} ({what:?}): the slots shared by held blocks"
        );
        assert_eq!(
            self.ranges.values().sum::<usize>(),
            self.reserved_bytes,
            "step {step} ({what:?}): the bytes of the reservations"
        );
        let spare: BTreeSet<(u64, u32)> = self
            .spare_pages()
            .into_iter()
            .map(|(p, t)| (t, p))
            .collect();
        assert_eq!(spare, self.spare, "step {step} ({what:?}): the spare pages");
    }

    /// What `allocate(size)` must fail with before any page call, if
    /// anything: `Some(Ok(e))` an error of the allocator, `Some(Err(e))`
    /// the backend's refusal to reserve.
    fn refusal(&self, size: usize) -> Option<Result<MappedError<SharedModelError>, PageError>> {
        if size == 0 {
            return Some(Ok(MappedError::ZeroSize));
        }
        // Above the capacity the allocator was told (or its backend's), as
        // above `isize::MAX`: refused before any call.
        let capacity = RawAllocator::capacity(&*self.mapped);
        let Some(n) = size
            .checked_next_multiple_of(self.align)
            .filter(|&n| n <= isize::MAX as usize && capacity.is_none_or(|c| n <= c))
        else {
            return Some(Ok(MappedError::TooLarge { requested: size }));
        };
        let g = self.page();
        let bytes = n.max(self.cfg.reservation).checked_next_multiple_of(g)?;
        (bytes > isize::MAX as usize - g).then_some(Err(PageError::TooLarge { bytes }))
    }

    fn allocate(&mut self, size: usize, what: &dyn fmt::Debug) {
        let step = self.step;
        let g = self.page();
        let held_before = self.held.len();
        let refusal = self.refusal(size);
        if refusal.is_none() && size > 1 << 40 {
            // Not in the tables: the bookkeeping of so large a reservation
            // would not fit in memory.
            return;
        }
        if matches!(refusal, Some(Err(_))) && !huge_allocations_fail() {
            return;
        }
        let result = self.mapped.allocate(size);
        let fx = self.sync();
        assert!(
            fx.released.is_empty(),
            "step {step} ({what:?}): an allocation gave pages back"
        );
        match (&result, refusal) {
            (Err(e), Some(Ok(want))) => {
                assert_eq!(*e, want, "step {step} ({what:?}) of {size}");
                assert!(
                    fx.failed.is_empty() && fx.created + fx.maps + fx.unmaps + fx.reserves == 0,
                    "step {step}: a refused request called the backend: {fx:?}"
                );
                self.summary.refused += 1;
            }
            (Err(e), Some(Err(want))) => {
                // The reservation was asked for and refused (or failed by
                // an injected failure).
                match e {
                    MappedError::Backend(SharedModelError::Model(got)) => {
                        assert_eq!(*got, want, "step {step} ({what:?}) of {size}");
                        self.summary.refused += 1;
                    }
                    MappedError::Backend(SharedModelError::Injected(PageCall::Reserve)) => {
                        self.summary.injected += 1;
                    }
                    // Refused before the reservation: its slot table
                    // could not be allocated.
                    MappedError::TooLarge { .. } => {
                        self.summary.refused += 1;
                    }
                    other => panic!("step {step} ({what:?}) of {size}: {other:?}"),
                }
                assert_eq!(fx.created + fx.maps + fx.unmaps + fx.reserves, 0);
            }
            (Ok(_), Some(_)) => panic!("step {step} ({what:?}): {size} bytes handed out"),
            (Err(e), None) => match e {
                MappedError::Backend(SharedModelError::Model(PageError::OutOfMemory {
                    ..
                })) => {
                    assert!(
                        self.cfg.device.is_some(),
                        "step {step} ({what:?}): out of memory without a device capacity"
                    );
                    let span = size.next_multiple_of(self.align).div_ceil(g) + 1;
                    let room = self.cfg.device.map_or(usize::MAX, |d| d / g);
                    assert!(
                        held_before > 0 || fx.injected() || room < span,
                        "step {step} ({what:?}): {size} bytes refused with nothing held \
                             and room for {room} pages"
                    );
                    self.summary.out_of_memory += 1;
                }
                MappedError::Backend(SharedModelError::Injected(_)) => {
                    assert!(fx.injected(), "step {step}: an injected failure not logged");
                    self.summary.injected += 1;
                }
                other => panic!("step {step} ({what:?}): {size} bytes: {other:?}"),
            },
            (Ok(block), None) => {
                let len = size.next_multiple_of(self.align);
                self.hold(
                    Held {
                        block: *block,
                        size,
                        len,
                    },
                    what,
                );
                self.summary.allocated += 1;
                if fx.created == 0 {
                    self.summary.reused += 1;
                }
                if fx.maps == 0 {
                    assert_eq!(fx.unmaps, 0, "step {step}: a move with nothing mapped");
                    self.in_place += 1;
                }
                if fx.remapped > 0 {
                    self.summary.remapped += 1;
                }
            }
        }
        // Spare pages move only when new ones would not fit the capacity
        // told, or could not be created.
        if fx.unmaps > 0 {
            assert!(
                self.cfg.capacity.is_some() || fx.failed(PageCall::Create),
                "step {step} ({what:?}): spare pages moved without a capacity: {fx:?}"
            );
            self.summary.moves += 1;
        }
        let after = self.mapped.stats();
        if let (Some(c), true, true) = (self.cfg.capacity, fx.created > 0, result.is_ok()) {
            assert!(
                after.page_bytes <= c || after.spare_bytes == 0,
                "step {step} ({what:?}): pages created past the capacity {c} while \
                 {} bytes of spare pages were left",
                after.spare_bytes
            );
        }
        self.check(what, result.is_err() || !fx.failed.is_empty());
    }

    /// Gives back held block `i`.
    fn deallocate(&mut self, i: usize, what: &dyn fmt::Debug) {
        let h = self.held.swap_remove(i);
        assert_eq!(self.spans.remove(&h.block), Some(h.len), "a block held");
        self.block_bytes -= h.len;
        let now = self.now();
        // The pages under slots no other held block touches become spare.
        let g = self.page();
        for s in self.slots_of(h.block, h.len) {
            let users = self.pinned.get_mut(&s).expect("a pinned slot");
            *users -= 1;
            match *users {
                0 => {
                    self.pinned.remove(&s);
                    let p = self.slots[&(s * g)];
                    self.unspare(p);
                    self.since.insert(p, now);
                    self.respare(p);
                }
                1 => self.shared_slots -= 1,
                _ => {}
            }
        }
        let rule = match self.ttl {
            Some(ttl) if now.saturating_sub(self.swept) >= (ttl / 8).max(1) => {
                self.swept = now;
                Release::Due(now.saturating_sub(ttl))
            }
            _ => Release::None,
        };
        let due = self.due(rule);
        // Work queued on the modelled device uses the block until the
        // fence its release takes has been waited on: the model refuses
        // (and `check` reports) an unmap of its pages before that.
        self.backend.queue_work(h.block, h.len);
        // SAFETY: `h.block` was handed out by `allocate(h.size)` and is
        // given back once; the host uses its addresses no more.
        unsafe { self.mapped.deallocate(h.block, h.size) };
        let fx = self.sync();
        self.note_decay(&fx, rule);
        if rule != Release::None && !fx.released.is_empty() {
            self.summary.inline_sweeps += 1;
        }
        self.check_releases(what, &fx, &due, rule);
        self.summary.deallocated += 1;
        self.check(what, !fx.failed.is_empty());
    }

    fn note_decay(&mut self, fx: &Effects, rule: Release) {
        if matches!(rule, Release::Due(_)) {
            self.summary.decayed += fx.released.len() as u64;
        }
    }

    /// The pages `rule` lets go, before an operation: for a decay, the
    /// spare pages spare since its cutoff or earlier (a range of the spare
    /// set, ordered by time).
    fn due(&self, rule: Release) -> BTreeSet<u32> {
        let cutoff = match rule {
            Release::None => return BTreeSet::new(),
            Release::Due(cutoff) => cutoff,
            Release::All => u64::MAX,
        };
        self.spare
            .range(..=(cutoff, u32::MAX))
            .map(|&(_, p)| p)
            .collect()
    }

    fn collect(&mut self, what: &dyn fmt::Debug) {
        let now = self.now();
        let spare_before = self.mapped.stats().spare_bytes;
        let rule = match self.ttl {
            Some(ttl) if spare_before > 0 => {
                self.swept = now;
                Release::Due(now.saturating_sub(ttl))
            }
            _ => Release::None,
        };
        let due = self.due(rule);
        let bytes = self.mapped.collect_spare();
        let fx = self.sync();
        assert_eq!(
            bytes,
            fx.released.len() * self.page(),
            "collect_spare's bytes"
        );
        self.note_decay(&fx, rule);
        self.check_releases(what, &fx, &due, rule);
        self.check(what, !fx.failed.is_empty());
    }

    fn release_spare(&mut self, what: &dyn fmt::Debug) {
        let due = self.due(Release::All);
        let bytes = self.mapped.release_spare();
        let fx = self.sync();
        assert_eq!(
            bytes,
            fx.released.len() * self.page(),
            "release_spare's bytes"
        );
        for p in &fx.released {
            assert!(
                due.contains(p),
                "release_spare gave back page {p}, not spare"
            );
        }
        self.check_releases(what, &fx, &due, Release::All);
        self.check(what, !fx.failed.is_empty());
    }

    fn apply(&mut self, op: MappedOp) {
        match op {
            MappedOp::Allocate(i) => {
                let size = pick(&self.cfg.palette, i);
                self.allocate(size, &op);
            }
            MappedOp::AllocateHuge(i) => self.allocate(pick(&MAPPED_HUGE, i), &op),
            MappedOp::Deallocate(i) => {
                if !self.held.is_empty() {
                    self.deallocate(usize::from(i) % self.held.len(), &op);
                }
            }
            MappedOp::Reallocate(i) => {
                if !self.held.is_empty() {
                    let i = usize::from(i) % self.held.len();
                    let size = self.held[i].size;
                    self.deallocate(i, &op);
                    self.allocate(size, &op);
                }
            }
            MappedOp::Burst { size, n } => {
                let size = pick(&self.cfg.palette, size);
                for _ in 0..=n % 8 {
                    self.allocate(size, &op);
                }
            }
            MappedOp::Advance(ticks) => {
                self.clock
                    .advance(Duration::from_nanos(u64::from(ticks) * MAPPED_TICK_NS));
                self.check(&op, false);
            }
            MappedOp::Collect => self.collect(&op),
            MappedOp::ReleaseSpare => self.release_spare(&op),
            MappedOp::Fail { call, n } => {
                let call = PAGE_CALLS[usize::from(call) % 6];
                self.backend.fail_next(call, u32::from(n));
            }
            MappedOp::DeallocateAlternate(offset) => {
                // Oldest first; every other one, from `offset & 1`.
                let mut k = usize::from(offset & 1);
                let mut taken = Vec::new();
                while k < self.held.len() {
                    taken.push(self.held[k].block);
                    k += 2;
                }
                for block in taken {
                    let i = self
                        .held
                        .iter()
                        .position(|h| h.block == block)
                        .expect("a held block");
                    self.deallocate(i, &op);
                }
            }
        }
    }
}

/// Runs `input` against a `Mapped<SharedModel, ManualClock>`, checking
/// every step (see the [module documentation](self)); then gives every
/// block back and the spare pages with them, drops the allocator and
/// checks that the backend holds nothing (or, with
/// [`MappedConfig::leak_at_end`], drops it with the blocks held and checks
/// that only the spare pages went back).
///
/// # Panics
///
/// When a check fails.
pub fn run_mapped(input: &MappedInput) -> MappedSummary {
    let cfg = input.config.clone();
    let pages = ModelPages::new(cfg.page).expect("a page size");
    let pages = match cfg.device {
        Some(d) => pages.with_capacity(d),
        None => pages,
    };
    let backend = SharedModel::new(pages);
    let clock = ManualClock::new();
    clock.advance(Duration::from_nanos(MAPPED_START_NS));
    let ttl = cfg.ttl.map(|t| t * MAPPED_TICK_NS);
    let mapped = Mapped::with_clock(backend.clone(), clock.clone())
        .with_align(cfg.align)
        .with_reservation(cfg.reservation)
        .with_spare_ttl(ttl.map(Duration::from_nanos));
    let mapped = match cfg.capacity {
        Some(c) => mapped.with_capacity(c),
        None => mapped,
    };
    assert_eq!(mapped.page_size(), cfg.page);
    assert_eq!(mapped.capacity(), cfg.capacity);
    assert_eq!(mapped.spare_ttl(), ttl.map(Duration::from_nanos));
    let align = mapped.align();
    assert!(
        align.is_power_of_two() && align <= cfg.page,
        "alignment {align} for pages of {}",
        cfg.page
    );
    let mut h = Harness {
        mapped: ManuallyDrop::new(mapped),
        backend,
        clock,
        align,
        ttl,
        held: Vec::new(),
        spans: BTreeMap::new(),
        block_bytes: 0,
        pinned: HashMap::new(),
        shared_slots: 0,
        reserved_bytes: 0,
        spare: BTreeSet::new(),
        unmapped_pinned: Vec::new(),
        freed_ranges: Vec::new(),
        checks: 0,
        ranges: BTreeMap::new(),
        slots: BTreeMap::new(),
        slot_of: HashMap::new(),
        since: HashMap::new(),
        swept: MAPPED_START_NS,
        created: 0,
        released: 0,
        maps: 0,
        unmaps: 0,
        in_place: 0,
        step: 0,
        summary: MappedSummary::default(),
        cfg,
    };
    h.check(&"a new allocator", true);
    let ops = &input.ops[..input.ops.len().min(MAX_MAPPED_OPS)];
    for &op in ops {
        h.step += 1;
        h.apply(op);
    }
    // The whole picture, at the end of the operations.
    h.check_whole(&"the last operation");
    h.backend.disarm();
    h.summary.ops = ops.len();

    if h.cfg.leak_at_end && !h.held.is_empty() {
        // Dropped with blocks held: the spare pages go back, the held
        // blocks' pages and every reservation stay.
        h.step += 1;
        let pinned = h.pinned.clone();
        let spare = h.spare_pages().len();
        // SAFETY: `h.mapped` is not used after this.
        drop(unsafe { ManuallyDrop::take(&mut h.mapped) });
        let fx = h.sync();
        assert_eq!(
            fx.released.len(),
            spare,
            "the drop gave back other than the spare pages"
        );
        assert_eq!(
            h.since.len(),
            pinned.len(),
            "pages left besides the held blocks' after the drop"
        );
        for &s in pinned.keys() {
            assert!(
                h.slots.contains_key(&(s * h.page())),
                "slot {:#x} of a held block unmapped by the drop",
                s * h.page()
            );
        }
        assert_eq!(
            h.backend.with_pages(|p| p.counts().live_ranges()),
            h.ranges.len() as u64,
            "a reservation freed under held blocks"
        );
        h.backend
            .with_pages(ModelPages::validate)
            .unwrap_or_else(|e| panic!("after the drop: {e}"));
        h.summary.leaked_at_drop = true;
        return h.summary;
    }

    // Give everything back, in an order the input chooses.
    let mut order = super::DropOrder::new(h.cfg.drop_seed);
    while !h.held.is_empty() {
        h.step += 1;
        let i = order.next(h.held.len());
        h.deallocate(i, &"the final deallocations");
    }
    h.step += 1;
    match h.ttl {
        Some(ttl) if !h.cfg.release_at_end => {
            h.clock.advance(Duration::from_nanos(ttl + 1));
            h.collect(&"the final collect");
        }
        _ => h.release_spare(&"the final release_spare"),
    }
    h.check_whole(&"the final decay");
    let s = h.mapped.stats();
    assert_eq!(
        (s.page_bytes, s.mapped_bytes, s.spare_bytes, s.blocks),
        (0, 0, 0, 0),
        "pages left once every block went back and the spare pages decayed: {s:?}"
    );
    // The drop frees every reservation.
    // SAFETY: `h.mapped` is not used after this.
    drop(unsafe { ManuallyDrop::take(&mut h.mapped) });
    h.sync();
    assert!(h.ranges.is_empty(), "reservations left after the drop");
    h.backend
        .with_pages(ModelPages::validate_released)
        .unwrap_or_else(|e| panic!("after the drop: {e}"));
    h.summary
}
