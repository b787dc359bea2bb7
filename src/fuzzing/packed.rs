//! Internal: the model-checking harness of the packing layer, behind
//! `fuzz/` and the corpus replay; not covered by semver (feature
//! `fuzzing`).
//!
//! The `fuzz/` target `packed_ops`, the property test
//! `tests/it/packing_model.rs` and the stable corpus replay
//! (`tests/it/packing_corpus.rs`) all call [`packed_ops`] / [`run_packed`]
//! here, so the same checks run under libFuzzer and under `cargo test`.
//!
//! An input is a [`PackedConfig`] (a packing preset with small thresholds
//! and segments, so that a case is cheap; the cap fraction and device
//! capacity; a `FixedTime` period; the exact pool's size class; an
//! optional limit; an optional backing capacity so the out-of-memory
//! ladder runs; a palette of request sizes spanning small, medium and large
//! for the preset) followed by [`PackedOp`]s. They run against a
//! [`PackedPool`] over [`FailingAllocator`]`<`[`CheckingAllocator`]`>` in
//! address mode ([`CheckingAllocator::with_addresses`]: every backing block
//! is a distinct address range), optionally behind a [`SharedPool`] (the
//! same checks through [`Pooled`] handles).
//!
//! The harness keeps a picture of what the caller holds (each block's
//! address, size, packed or exact, and the backing block holding it; the
//! spans held in an ordered map; the segments holding packed blocks with
//! their counts; running sums of the sizes, extents and oversize bytes) and
//! of the live backing blocks (from the calls that went through), all kept
//! step by step. A packed block spans its size rounded to the granularity,
//! an exact block the backing block it is.
//!
//! After every step (each allocation of a burst and each release counts
//! as one) it checks, in `O(1)` or `O(log n)`:
//! - the block just handed out: it lies inside a live backing block (an
//!   exact block is a whole one, of its class or of a larger class it may
//!   reuse), it overlaps neither neighbour among the spans held (so none),
//!   it is not an exact block where a segment is nor carved from an exact
//!   block held; a request above the medium threshold is never carved, and
//!   one request is counted for it;
//! - every backing block handed out or freed in the step: handed out once,
//!   freed once with its size, and holding no block held (so every block
//!   held stays inside its backing block until it goes back);
//! - every byte is accounted, against the running sums: `bytes_requested`
//!   is the sum of the sizes held, `packed_bytes` the sum of their rounded
//!   sizes, `packed_blocks` their count, `oversize_bytes` the exact blocks'
//!   bytes beyond their classes, `segment_bytes = packed_bytes +
//!   free_segment_bytes`, `requests = carved + exact + exact_fallbacks`,
//!   `segments = segments_created − segments_released`; hits + misses are
//!   the requests, the caller's misses the pool's, and a miss one backing
//!   call;
//! - every segment is in the exact pool exactly once: the backing blocks
//!   holding packed blocks are as many as the segments (`Σ their sizes ≥
//!   segment_bytes`, `=` with exact classes); the pool's blocks in use are
//!   the segments plus the exact blocks held, and its bytes in use those
//!   segments' bytes plus the exact blocks'; the live backing blocks are
//!   the pool's blocks in use plus cached, and their bytes its bytes
//!   reserved;
//! - with a limit, `bytes_reserved` never exceeds it; with no limit, no
//!   capacity and no injected failure, no request of a valid size fails;
//!   with nothing held and no injected failure, a request whose class fits
//!   under the limit and the capacity succeeds (no fragmentation failure);
//!   a failed request changes neither `requests` nor `bytes_requested`.
//!
//! Every 32 steps' checks, after a new pool, after every step where a
//! request failed or an injected failure was consumed, after the last
//! operation (before the blocks go back) and after the final collect or
//! trim, the whole-pool check runs too (`O(n log n)` in the blocks held):
//! - the layer's own `validate()`, and the exact pool's;
//! - the backing calls seen against the checking allocator's own log, and
//!   its live blocks against the live backing blocks;
//! - the picture rebuilt from scratch and compared with the one kept:
//!   every block held checked again against the live backing blocks (and
//!   its extent and backing block unchanged), all of them sorted and
//!   checked for overlaps, the segments and their counts, no segment an
//!   exact block held, and every running sum.
//!
//! At the end every block goes back: no segment is left, the pool holds
//! nothing in use, and after the period has passed a `collect` (or a
//! `trim`) brings the reserved bytes to zero; dropping the pool then frees
//! every backing block exactly once (the checking allocator panics on a
//! double or foreign free, and its live count must be zero).
//!
//! # Input layout
//!
//! Every field is read from one byte (missing bytes read as zero): see
//! [`PackedConfig`] and [`PackedOp`].
//!
//! # Examples
//!
//! ```
//! // Preset 0, cap 1/1, no device capacity, ttl PACKED_PERIODS[2], exact
//! // classes, no limit, no capacity, not shared, palette [100, 3000],
//! // flags 0, drop seed 0.
//! let mut input = vec![0, 0, 0, 2, 0, 0, 0, 0, 1, 3, 14, 0, 0];
//! // Allocate 100, allocate 3000, release the first block.
//! input.extend([0, 0, 0, 1, 11, 0]);
//! let summary = decaying_pool::fuzzing::packed::packed_ops(&input).unwrap();
//! assert_eq!(summary.carved, 2);
//! ```

use core::cell::RefCell;
use core::fmt;
use core::mem::ManuallyDrop;
use core::time::Duration;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arbitrary::{Arbitrary, Unstructured};

use crate::SizeClass;
use crate::clock::ManualClock;
use crate::error::PoolError;
use crate::packing::{Packable, PackedPool, Packing, PackingStats};
use crate::policy::FixedTime;
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;
use crate::shared::{Pooled, SharedPool};
use crate::stats::Stats;
use crate::testing::{Call, CheckingAllocator, FailingAllocator, TestError};

/// Operations run per input at most.
pub const MAX_PACKED_OPS: usize = 512;

/// One tick of the harness clock: 1 ms.
const TICK: Duration = Duration::from_millis(1);

/// A packing preset: `(small_threshold, medium_threshold, small_segment,
/// medium_segment, max_segment, growth, segment_multiple, granularity,
/// large_rounding)`.
pub type Preset = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
);

/// Packing presets (see [`Preset`]). Small numbers, so that a case carves
/// many blocks from few, small segments.
pub const PRESETS: [Preset; 8] = [
    (256, 4096, 2048, 8192, 16384, 4, 4, 64, 1),
    (512, 8192, 4096, 16384, 65536, 2, 4, 512, 4096),
    (1000, 3000, 1024, 4096, 8192, 1, 1, 256, 1000),
    (0, 4096, 4096, 4096, 4096, 4, 1, 512, 512),
    (256, 256, 1024, 1024, 1024, 4, 4, 128, 1),
    (0, 0, 2048, 2048, 2048, 4, 4, 512, 2048),
    (4096, 65536, 2048, 8192, 32768, 4, 2, 512, 8192),
    (300, 5000, 1000, 2000, 3000, 3, 3, 100, 3000),
];

/// Cap fractions (a segment is at most the capacity or limit over this).
pub const CAP_FRACTIONS: [usize; 4] = [1, 2, 4, 32];

/// Device capacities told to the packing layer (byte 2 of a
/// [`PackedConfig`], when `>= 128`).
pub const DEVICE_CAPACITIES: [usize; 4] = [16_384, 65_536, 1 << 20, 4096];

/// `FixedTime` periods, in ticks.
pub const PACKED_PERIODS: [u64; 6] = [0, 1, 4, 16, 64, 1024];

/// Limit choices (byte 5, when `>= 128`).
pub const PACKED_LIMITS: [usize; 8] = [1000, 4096, 10_000, 50_000, 200_000, 0, 20_000, 8192];

/// Backing capacity choices (byte 6, when `>= 128`).
pub const PACKED_CAPACITIES: [usize; 6] = [4096, 16_384, 50_000, 200_000, 0, 30_000];

/// Request sizes a palette draws from: around every preset's thresholds
/// and segment sizes.
pub const PACKED_SIZES: [usize; 28] = [
    1, 7, 64, 100, 255, 256, 257, 511, 512, 513, 1000, 1023, 2047, 2048, 3000, 4095, 4096, 4097,
    5000, 8192, 8193, 10_000, 16_384, 30_000, 65_536, 65_537, 100_000, 300,
];

/// Requests that overflow or nearly overflow.
pub const PACKED_HUGE: [usize; 3] = [usize::MAX, usize::MAX - 3, (usize::MAX >> 1) + 2];

/// The configuration of a run.
///
/// Layout, one byte each: preset (index into [`PRESETS`]); cap fraction
/// (index into [`CAP_FRACTIONS`]); device capacity (`< 128`: none, else an
/// index into [`DEVICE_CAPACITIES`]); period (index into
/// [`PACKED_PERIODS`]); size class `% 3` (Exact, PowerOfTwo,
/// Multiple(1000)); limit (`< 128`: none, else an index into
/// [`PACKED_LIMITS`]); backing capacity (`< 128`: none, else an index into
/// [`PACKED_CAPACITIES`]); shared (`& 1`: through a [`SharedPool`]);
/// palette length (`1 + b % 6`); that many palette entries (indices into
/// [`PACKED_SIZES`]); flags (`& 1`: trim at the end instead of letting the
/// period pass); drop-order seed.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedConfig {
    /// The packing layer's settings.
    pub packing: Packing,
    /// The `FixedTime` period in ticks (1 ms).
    pub ttl: u64,
    /// The exact pool's size classes.
    pub size_class: SizeClass,
    /// The pool's byte limit.
    pub limit: Option<usize>,
    /// The backing allocator's byte capacity.
    pub capacity: Option<usize>,
    /// Run through a [`SharedPool`] and [`Pooled`] handles.
    pub shared: bool,
    /// The request sizes operations choose from.
    pub palette: Vec<usize>,
    /// Trim at the end, instead of advancing the clock and collecting.
    pub trim_at_end: bool,
    /// Chooses the order blocks are given back at the end.
    pub drop_seed: u8,
}

fn byte(u: &mut Unstructured<'_>) -> arbitrary::Result<u8> {
    u8::arbitrary(u)
}

fn pick<T: Copy>(table: &[T], b: u8) -> T {
    table[usize::from(b) % table.len()]
}

/// [`Packing::large_fit`] values, chosen by bits 3 and 4 of the preset
/// byte (so that the inputs written before the setting keep the default).
pub const LARGE_FITS: [usize; 4] = [2, 0, 1, 8];

/// The packing settings of preset `i` (`i % 8` into [`PRESETS`], `i / 8`
/// into [`LARGE_FITS`]) with the cap fraction and device capacity given.
pub fn preset(i: u8, cap_fraction: usize, device: Option<usize>) -> Packing {
    let (small, medium, small_seg, medium_seg, max_seg, growth, multiple, granularity, large) =
        pick(&PRESETS, i);
    let p = Packing::default()
        .small_threshold(small)
        .medium_threshold(medium)
        .small_segment(small_seg)
        .medium_segment(medium_seg)
        .max_segment(max_seg)
        .growth(growth)
        .segment_multiple(multiple)
        .large_rounding(large)
        .large_fit(pick(&LARGE_FITS, i / 8))
        .granularity(granularity)
        .cap_fraction(cap_fraction);
    match device {
        Some(d) => p.capacity(d),
        None => p,
    }
}

impl<'a> Arbitrary<'a> for PackedConfig {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let preset_index = byte(u)?;
        let cap = pick(&CAP_FRACTIONS, byte(u)?);
        let device = byte(u)?;
        let device = (device >= 128).then(|| pick(&DEVICE_CAPACITIES, device));
        let ttl = pick(&PACKED_PERIODS, byte(u)?);
        let size_class = match byte(u)? % 3 {
            0 => SizeClass::Exact,
            1 => SizeClass::PowerOfTwo,
            _ => SizeClass::Multiple(1000),
        };
        let limit = byte(u)?;
        let limit = (limit >= 128).then(|| pick(&PACKED_LIMITS, limit));
        let capacity = byte(u)?;
        let capacity = (capacity >= 128).then(|| pick(&PACKED_CAPACITIES, capacity));
        let shared = byte(u)? & 1 == 1;
        let len = 1 + usize::from(byte(u)?) % 6;
        let mut palette = Vec::with_capacity(len);
        for _ in 0..len {
            palette.push(pick(&PACKED_SIZES, byte(u)?));
        }
        let trim_at_end = byte(u)? & 1 == 1;
        let drop_seed = byte(u)?;
        Ok(PackedConfig {
            packing: preset(preset_index, cap, device),
            ttl,
            size_class,
            limit,
            capacity,
            shared,
            palette,
            trim_at_end,
            drop_seed,
        })
    }
}

/// A `packed_ops` operation.
///
/// Layout: a tag byte, `% 32`, then its arguments, one byte each:
/// `0..=9` allocate (palette index), `10` allocate zero (`0`) or a huge
/// size (index `- 1`), `11..=17` release the i-th held block (index),
/// `18..=20` release the i-th held block and allocate its size again
/// (index), `21..=23` allocate a burst of `1 + n % 8` blocks of one
/// palette size (palette index, n), `24..=26` advance the clock (ticks `%
/// 80`), `27` fail the next `n % 4` backing calls, `28..=29` collect, `30`
/// trim, `31` release every other held block (offset `& 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedOp {
    /// `allocate(palette[i])`.
    Allocate(u8),
    /// `allocate(0)`.
    AllocateZero,
    /// `allocate(PACKED_HUGE[i])`.
    AllocateHuge(u8),
    /// Releases the i-th held block (modulo the count).
    Release(u8),
    /// Releases the i-th held block, then allocates its size again.
    ReleaseAllocate(u8),
    /// Allocates `1 + n % 8` blocks of `palette[i]`.
    Burst {
        /// Palette index.
        size: u8,
        /// Count, `1 + n % 8`.
        n: u8,
    },
    /// Advances the clock by this many ticks.
    Advance(u8),
    /// `FailingAllocator::fail_next(n)`.
    FailNext(u32),
    /// `collect`.
    Collect,
    /// `trim`.
    Trim,
    /// Releases every other held block (starting at `offset & 1`), to
    /// leave holes in the segments.
    ReleaseAlternate(u8),
}

impl<'a> Arbitrary<'a> for PackedOp {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match byte(u)? % 32 {
            0..=9 => PackedOp::Allocate(byte(u)?),
            10 => match byte(u)? {
                0 => PackedOp::AllocateZero,
                k => PackedOp::AllocateHuge(k - 1),
            },
            11..=17 => PackedOp::Release(byte(u)?),
            18..=20 => PackedOp::ReleaseAllocate(byte(u)?),
            21..=23 => PackedOp::Burst {
                size: byte(u)?,
                n: byte(u)?,
            },
            24..=26 => PackedOp::Advance(byte(u)? % 80),
            27 => PackedOp::FailNext(u32::from(byte(u)? % 4)),
            28..=29 => PackedOp::Collect,
            30 => PackedOp::Trim,
            _ => PackedOp::ReleaseAlternate(byte(u)?),
        })
    }
}

/// A `packed_ops` input: a [`PackedConfig`], then [`PackedOp`]s to the
/// end of the data (at most [`MAX_PACKED_OPS`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedInput {
    /// The configuration.
    pub config: PackedConfig,
    /// The operations.
    pub ops: Vec<PackedOp>,
}

impl<'a> Arbitrary<'a> for PackedInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let config = PackedConfig::arbitrary(u)?;
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_PACKED_OPS {
            ops.push(PackedOp::arbitrary(u)?);
        }
        Ok(PackedInput { config, ops })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        Self::arbitrary(&mut u)
    }
}

/// What a run reached, for corpus coverage checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackedSummary {
    /// Operations run.
    pub ops: usize,
    /// Requests carved from a segment.
    pub carved: u64,
    /// Requests served as exact blocks (above the medium threshold, or
    /// larger than any allowed segment).
    pub exact: u64,
    /// Packable requests served as exact blocks for want of a segment.
    pub exact_fallbacks: u64,
    /// Segments taken from the pool.
    pub segments_created: u64,
    /// Emptied segments given back to the pool.
    pub segments_released: u64,
    /// Most segments held at once.
    pub peak_segments: u64,
    /// Most packed blocks inside one segment at once.
    pub peak_blocks_per_segment: usize,
    /// Requests refused (limit, backing failure, invalid size).
    pub failures: u64,
    /// Segments the exact pool served from its cache (a hit).
    pub pool_hits: u64,
    /// Large requests served by a cached block of a larger class.
    pub larger_reuses: u64,
    /// Blocks the exact pool's policy evicted.
    pub evictions: u64,
    /// Whether the run went through a `SharedPool`.
    pub shared: bool,
}

/// Parses `data` as a [`PackedInput`] and runs it with [`run_packed`].
/// Returns `None` when the data cannot be parsed (never, with this
/// layout).
///
/// # Panics
///
/// When a check fails.
pub fn packed_ops(data: &[u8]) -> Option<PackedSummary> {
    let input = PackedInput::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    Some(run_packed(&input))
}

/// `allocate(size)`, as a step's checks name it (a `format_args!` kept in
/// a variable needs Rust 1.89; the library's minimum is 1.85).
struct Allocate(usize);

impl fmt::Debug for Allocate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "allocate({})", self.0)
    }
}

/// How many steps' checks run between two whole-pool checks.
///
/// A whole-pool check ([`Harness::check_whole`]) walks every block held,
/// segment and backing block (the pool's `validate()` included): `O(n log
/// n)` in the blocks held, so running it after every step made a run of `n`
/// steps cost `O(n²)` (`packed_ops` ran about 76 inputs a second). The
/// checks of one step ([`Harness::check`]) are `O(1)` or `O(log n)` and
/// catch at once what a step breaks in the counters or in the block it
/// touched; the whole-pool check, once in 32 checks (besides after every
/// failure and at the end of the run), still catches what they cannot see
/// (the layer's inner bookkeeping, a drift of the incremental picture)
/// within 32 steps of its cause, at about the cost of the per-step checks.
const FULL_CHECK_EVERY: usize = 32;

/// The backing allocator: a [`FailingAllocator`] (capacity) over an
/// addressed [`CheckingAllocator`], with failures injected here so that the
/// harness knows how many are still pending, and the calls that went
/// through kept here too, so that a step reads only its own
/// ([`CheckingAllocator::calls`] copies the whole log; the whole-pool check
/// compares the two).
#[derive(Clone, Debug)]
struct Backing {
    inner: FailingAllocator<CheckingAllocator>,
    pending: Arc<AtomicU32>,
    /// The calls that reached the checking allocator, since the harness
    /// last took them.
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Backing {
    fn fail_next(&self, n: u32) {
        self.pending.store(n, Ordering::Relaxed);
    }

    fn pending(&self) -> u32 {
        self.pending.load(Ordering::Relaxed)
    }

    fn log(&self) -> MutexGuard<'_, Vec<Call>> {
        // A panic inside a check poisons the lock; the log is still whole.
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Swaps the calls made since the last time into `into` (empty).
    fn take_calls(&self, into: &mut Vec<Call>) {
        core::mem::swap(&mut *self.log(), into);
    }
}

impl RawAllocator for Backing {
    type Block = u64;
    type Error = TestError;

    fn allocate(&mut self, size: usize) -> Result<u64, TestError> {
        let injected = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if injected {
            return Err(TestError::Injected);
        }
        // No device has this much: refuse, so that addresses never wrap.
        if size > 1 << 40 {
            return Err(TestError::OutOfMemory {
                requested: size,
                used: self.inner.used(),
                capacity: 1 << 40,
            });
        }
        let block = self.inner.allocate(size)?;
        self.log().push(Call::Allocate { block, size });
        Ok(block)
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract, passed through unchanged.
        unsafe { self.inner.deallocate(block, size) };
        self.log().push(Call::Deallocate { block, size });
    }
}

impl Packable for Backing {
    fn carve(segment: &u64, offset: usize) -> u64 {
        <FailingAllocator<CheckingAllocator> as Packable>::carve(segment, offset)
    }

    fn address(block: &u64) -> usize {
        <FailingAllocator<CheckingAllocator> as Packable>::address(block)
    }
}

type Packed = PackedPool<Backing, FixedTime, ManualClock>;
type Shared = SharedPool<Backing, FixedTime, ManualClock>;
type Handle = Pooled<Backing, FixedTime, ManualClock>;

/// A block the caller holds.
struct Held {
    block: u64,
    size: usize,
    /// Carved from a segment (else an exact block).
    packed: bool,
    /// The bytes it spans, fixed while it is held: its size rounded to the
    /// granularity (packed), or the backing block it is (exact).
    extent: usize,
    /// The live backing block holding it: its segment, or itself.
    backing: u64,
    /// An exact block's bytes beyond its own class (a larger class reused);
    /// zero for a packed block.
    oversize: usize,
    /// Tells apart spans that start and end at one address.
    id: u64,
    /// The `Pooled` handle, in a shared run.
    handle: Option<Handle>,
}

/// Sums over the blocks held: kept step by step, rebuilt from scratch by
/// the whole-pool check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    /// Σ sizes asked for.
    requested: usize,
    /// Packed blocks.
    packed: u64,
    /// Σ their extents.
    packed_bytes: usize,
    /// Exact blocks.
    exact: u64,
    /// Σ their extents.
    exact_bytes: usize,
    /// Σ their bytes beyond their classes.
    oversize: usize,
    /// Σ the sizes of the backing blocks holding packed blocks.
    in_segments: usize,
}

/// The pool under test: a `PackedPool`, or a `SharedPool` holding one.
enum Subject {
    Plain(Box<Packed>),
    Shared(Shared),
}

struct Harness {
    /// Never dropped on a failed check: dropping a pool whose state is off
    /// could panic again while unwinding and abort.
    subject: ManuallyDrop<Subject>,
    cfg: PackedConfig,
    packing: Packing,
    failing: Backing,
    checking: CheckingAllocator,
    clock: ManualClock,
    held: Vec<Held>,
    /// The pool's classes of the sizes asked so far.
    classes: RefCell<BTreeMap<usize, Option<usize>>>,
    /// The spans of the blocks held, `(start, end, id)` → packed, kept
    /// disjoint: a new block's neighbours are found in `O(log n)`.
    spans: BTreeMap<(u64, u64, u64), bool>,
    /// The backing blocks holding packed blocks held (the segments):
    /// address → (size, packed blocks held in it).
    segments: BTreeMap<u64, (usize, usize)>,
    tally: Tally,
    /// Live backing blocks: address → size, kept from the call log.
    backing: BTreeMap<u64, usize>,
    /// Σ the sizes of `backing`.
    backing_bytes: usize,
    /// The calls read since the last whole-pool check, which compares
    /// them with the checking allocator's own log from `seen_calls`.
    unverified: Vec<Call>,
    seen_calls: usize,
    /// A buffer for the calls of one step (swapped with the backing's).
    calls: Vec<Call>,
    next_id: u64,
    /// Checks run (per step), for [`FULL_CHECK_EVERY`].
    checks: usize,
    fail_next: u32,
    step: usize,
    summary: PackedSummary,
}

fn round_up(size: usize, to: usize) -> usize {
    size.div_ceil(to) * to
}

impl Harness {
    fn stats(&self) -> (Stats, PackingStats) {
        match &*self.subject {
            Subject::Plain(p) => (p.stats(), p.packing_stats()),
            Subject::Shared(s) => (s.stats(), s.packing_stats().expect("a packed shared pool")),
        }
    }

    /// The exact pool's own counters (segments and exact blocks are its
    /// blocks).
    fn pool_stats(&self) -> Stats {
        match &*self.subject {
            Subject::Plain(p) => p.pool().stats(),
            Subject::Shared(s) => s
                .with_packed(|p| p.pool().stats())
                .expect("a packed shared pool"),
        }
    }

    fn validate(&self) {
        match &*self.subject {
            Subject::Plain(p) => p.validate(),
            Subject::Shared(s) => s.validate(),
        }
    }

    /// The pool's class for `size`, asked once per size (through a
    /// shared pool, asking takes its lock and more).
    fn class_size(&self, size: usize) -> Option<usize> {
        if let Some(&class) = self.classes.borrow().get(&size) {
            return class;
        }
        let class = self.pool_class_size(size);
        self.classes.borrow_mut().insert(size, class);
        class
    }

    fn pool_class_size(&self, size: usize) -> Option<usize> {
        match &*self.subject {
            Subject::Plain(p) => p.pool().class_size(size),
            Subject::Shared(s) => s
                .with_packed(|p| p.pool().class_size(size))
                .expect("a packed shared pool"),
        }
    }

    /// Brings the map of live backing blocks up to date with the calls
    /// made since the last time: a block handed out is new, one freed was
    /// live with that size, and neither holds a block the caller holds (so
    /// every block held stays inside the live backing block it was found
    /// in when handed out).
    fn sync_backing(&mut self, what: &dyn fmt::Debug) {
        let step = self.step;
        let mut calls = core::mem::take(&mut self.calls);
        self.failing.take_calls(&mut calls);
        for &call in &calls {
            match call {
                Call::Allocate { block, size } => {
                    assert!(
                        self.backing.insert(block, size).is_none(),
                        "backing block {block:#x} handed out twice"
                    );
                    self.backing_bytes += size;
                    if let Some((a, b)) = self.held_in(block, size) {
                        panic!(
                            "backing block {block:#x} ({size} bytes) handed out over the \
                             block [{a:#x}, {b:#x}) held, after {what:?} at step {step}"
                        );
                    }
                }
                Call::Deallocate { block, size } => {
                    assert_eq!(
                        self.backing.remove(&block),
                        Some(size),
                        "backing block {block:#x} freed with a wrong size or twice"
                    );
                    self.backing_bytes -= size;
                    if let Some((a, b)) = self.held_in(block, size) {
                        panic!(
                            "backing block {block:#x} ({size} bytes) freed under the block \
                             [{a:#x}, {b:#x}) held, after {what:?} at step {step}"
                        );
                    }
                }
            }
            self.unverified.push(call);
        }
        calls.clear();
        self.calls = calls;
    }

    /// A span held that meets `[at, at + len)` (a zero-length one inside it
    /// included), if any: `O(log n)`, the spans being disjoint.
    fn held_in(&self, at: u64, len: usize) -> Option<(u64, u64)> {
        let end = at + len as u64;
        // The spans are disjoint: the last one starting before `end` ends
        // last of those.
        let (&(s, e, _), _) = self.spans.range(..(end, 0, 0)).next_back()?;
        (e > at || s >= at).then_some((s, e))
    }

    /// The live backing block holding `[at, at + len)`, if any.
    fn backing_holding(&self, at: u64, len: usize) -> Option<(u64, usize)> {
        let (&start, &size) = self.backing.range(..=at).next_back()?;
        (at + len as u64 <= start + size as u64).then_some((start, size))
    }

    /// Whether an exact block held starts at `at`.
    fn exact_at(&self, at: u64) -> bool {
        self.spans
            .range((at, 0, 0)..(at + 1, 0, 0))
            .any(|(_, &packed)| !packed)
    }

    /// The bytes a block held spans, from scratch.
    fn extent(&self, size: usize, packed: bool, block: u64) -> usize {
        if packed {
            round_up(size, self.packing.granularity.max(1).next_power_of_two())
        } else {
            // Its class, or a larger one it was swapped for (see
            // `Packing::large_fit`): the backing block it starts, checked
            // against the bounds in `check_block`.
            let class = self.class_size(self.exact_bytes(size));
            self.backing
                .get(&block)
                .copied()
                .or(class)
                .expect("a block held has a class")
        }
    }

    /// The class an exact block of a request of `size` may have been taken
    /// from: its own, or up to `1 / large_fit` larger above the medium
    /// threshold.
    fn exact_classes(&self, size: usize) -> (usize, usize) {
        let class = self
            .class_size(self.exact_bytes(size))
            .expect("a block held has a class");
        let fit = self.packing.large_fit;
        if size > self.packing.medium_threshold && fit > 0 {
            (class, class.saturating_add(class / fit))
        } else {
            (class, class)
        }
    }

    /// What an exact block of a request of `size` asks of the pool: above
    /// the medium threshold, `size` rounded up to `large_rounding`.
    fn exact_bytes(&self, size: usize) -> usize {
        if size > self.packing.medium_threshold {
            size.checked_next_multiple_of(self.packing.large_rounding.max(1))
                .unwrap_or(size)
        } else {
            size
        }
    }

    /// Checks one block held against the live backing blocks: a packed
    /// block lies inside one, an exact block is a whole one of its class
    /// (or of a larger one it may reuse). Returns the backing block and
    /// the block's bytes beyond its class.
    fn check_block(
        &self,
        block: u64,
        size: usize,
        packed: bool,
        extent: usize,
        what: &dyn fmt::Debug,
    ) -> ((u64, usize), usize) {
        let step = self.step;
        let Some((start, bsize)) = self.backing_holding(block, extent) else {
            panic!(
                "block {block:#x} ({size} bytes, packed: {packed}) lies in no live backing \
                 block, after {what:?} at step {step}"
            );
        };
        if packed {
            return ((start, bsize), 0);
        }
        assert_eq!(
            start, block,
            "exact block {block:#x} is not a whole backing block, after {what:?} at step {step}"
        );
        let (least, most) = self.exact_classes(size);
        assert!(
            (least..=most).contains(&bsize),
            "exact block {block:#x} for {size} bytes is a block of {bsize} bytes, not of \
             {least}..={most}, after {what:?} at step {step}"
        );
        ((start, bsize), extent - least)
    }

    /// Checks the block just handed out and adds it to the picture, in
    /// `O(log n)`: inside a live backing block (a whole one for an exact
    /// block), not overlapping its neighbours, not an exact block where a
    /// segment is nor carved from an exact block held.
    fn hold(&mut self, block: u64, size: usize, packed: bool, handle: Option<Handle>) {
        let what = Allocate(size);
        let step = self.step;
        let extent = self.extent(size, packed, block);
        let ((start, bsize), oversize) = self.check_block(block, size, packed, extent, &what);
        if packed {
            assert!(
                !self.exact_at(start),
                "segment {start:#x} is also an exact block held, after {what:?} at step {step}"
            );
        } else {
            assert!(
                !self.segments.contains_key(&block),
                "segment {block:#x} is also an exact block held, after {what:?} at step {step}"
            );
        }
        let id = self.next_id;
        self.next_id += 1;
        let end = block + extent as u64;
        let key = (block, end, id);
        // The spans held are disjoint: the new one overlaps none if it
        // overlaps neither neighbour.
        if let Some((&(s, e, _), _)) = self.spans.range(..key).next_back() {
            assert!(
                e <= block,
                "blocks [{s:#x}, {e:#x}) and [{block:#x}, {end:#x}) overlap, after {what:?} at \
                 step {step}"
            );
        }
        if let Some((&(s, e, _), _)) = self.spans.range(key..).next() {
            assert!(
                end <= s,
                "blocks [{block:#x}, {end:#x}) and [{s:#x}, {e:#x}) overlap, after {what:?} at \
                 step {step}"
            );
        }
        self.spans.insert(key, packed);
        let t = &mut self.tally;
        t.requested += size;
        if packed {
            t.packed += 1;
            t.packed_bytes += extent;
            let seg = self.segments.entry(start).or_insert_with(|| {
                t.in_segments += bsize;
                (bsize, 0)
            });
            seg.1 += 1;
            let sum = &mut self.summary;
            sum.peak_blocks_per_segment = sum.peak_blocks_per_segment.max(seg.1);
        } else {
            t.exact += 1;
            t.exact_bytes += extent;
            t.oversize += oversize;
        }
        self.held.push(Held {
            block,
            size,
            packed,
            extent,
            backing: start,
            oversize,
            id,
            handle,
        });
    }

    /// Takes block `i` out of the picture.
    fn unhold(&mut self, i: usize) -> Held {
        let h = self.held.remove(i);
        let key = (h.block, h.block + h.extent as u64, h.id);
        assert_eq!(self.spans.remove(&key), Some(h.packed), "a span held");
        let t = &mut self.tally;
        t.requested -= h.size;
        if h.packed {
            t.packed -= 1;
            t.packed_bytes -= h.extent;
            let seg = self.segments.get_mut(&h.backing).expect("a segment held");
            seg.1 -= 1;
            if seg.1 == 0 {
                t.in_segments -= seg.0;
                self.segments.remove(&h.backing);
            }
        } else {
            t.exact -= 1;
            t.exact_bytes -= h.extent;
            t.oversize -= h.oversize;
        }
        h
    }

    /// The checks after a step: `O(1)` or `O(log n)` (see the module
    /// documentation); the whole-pool check too after an eventful step (a
    /// failure, an injected one included), and once in
    /// [`FULL_CHECK_EVERY`] checks.
    fn check(&mut self, what: &dyn fmt::Debug, eventful: bool) {
        self.sync_backing(what);
        self.checks += 1;
        if eventful || self.checks % FULL_CHECK_EVERY == 0 {
            self.check_whole(what);
        }
        self.check_counters(what);
    }

    /// The counters against themselves, the exact pool's, the backing
    /// blocks' and the incremental picture of the blocks held: `O(1)`.
    fn check_counters(&mut self, what: &dyn fmt::Debug) {
        let step = self.step;
        let ctx = || format!("after {what:?} at step {step}");
        let (user, ps) = self.stats();
        let s = self.pool_stats();
        let t = self.tally;

        // The caller's counters: one per request, a miss its backing call.
        assert_eq!(
            user.hits + user.misses,
            ps.requests,
            "hits + misses = requests, {}",
            ctx()
        );
        assert_eq!(
            (user.misses, user.backing_allocs),
            (s.misses, s.backing_allocs),
            "a request's miss is the pool's, {}",
            ctx()
        );
        assert_eq!(s.misses, s.backing_allocs, "{}", ctx());
        assert_eq!(
            user.blocks_in_use,
            self.held.len() as u64,
            "blocks in use = the caller's blocks held, {}",
            ctx()
        );
        assert_eq!(
            user.bytes_reserved,
            user.bytes_in_use + user.bytes_cached,
            "reserved = in use + idle, {}",
            ctx()
        );
        assert!(
            user.bytes_in_use >= t.requested,
            "bytes in use cover the requests held, {}",
            ctx()
        );
        assert!(user.peak_bytes_in_use >= user.bytes_in_use, "{}", ctx());

        // The layer's counters agree with themselves.
        assert_eq!(
            ps.segment_bytes,
            ps.packed_bytes + ps.free_segment_bytes,
            "segment bytes = packed + free, {}",
            ctx()
        );
        assert_eq!(
            ps.requests,
            ps.carved + ps.exact + ps.exact_fallbacks,
            "requests, {}",
            ctx()
        );
        assert_eq!(
            ps.segments,
            ps.segments_created - ps.segments_released,
            "segments held, {}",
            ctx()
        );
        assert!(ps.peak_segment_bytes >= ps.segment_bytes, "{}", ctx());
        assert!(ps.peak_bytes_requested >= ps.bytes_requested, "{}", ctx());

        // Every byte the caller holds is accounted.
        assert_eq!(
            ps.bytes_requested,
            t.requested,
            "bytes requested, {}",
            ctx()
        );
        assert_eq!(ps.packed_blocks, t.packed, "packed blocks, {}", ctx());
        assert_eq!(ps.packed_bytes, t.packed_bytes, "packed bytes, {}", ctx());
        assert_eq!(
            ps.oversize_bytes,
            t.oversize,
            "oversize bytes: exact blocks beyond their classes, {}",
            ctx()
        );

        // Every segment is in the exact pool once, in use.
        assert_eq!(
            s.blocks_in_use,
            ps.segments + t.exact,
            "pool blocks in use = segments + exact blocks, {}",
            ctx()
        );
        assert_eq!(
            self.backing.len() as u64,
            s.blocks_in_use + s.blocks_cached,
            "backing blocks live = pool blocks in use + cached, {}",
            ctx()
        );
        assert_eq!(
            self.backing_bytes,
            s.bytes_reserved,
            "backing bytes live = pool bytes reserved, {}",
            ctx()
        );
        if let Some(limit) = self.cfg.limit {
            assert!(
                s.bytes_reserved <= limit,
                "{} bytes reserved over the limit {limit}, {}",
                s.bytes_reserved,
                ctx()
            );
        }

        // An emptied segment goes back at once: the backing blocks holding
        // packed blocks are exactly the segments, each the pool's block of
        // its class size.
        assert_eq!(
            self.segments.len() as u64,
            ps.segments,
            "backing blocks holding packed blocks = segments held, {}",
            ctx()
        );
        assert!(t.in_segments >= ps.segment_bytes, "{}", ctx());
        if self.cfg.size_class == SizeClass::Exact {
            assert_eq!(t.in_segments, ps.segment_bytes, "segment bytes, {}", ctx());
        }
        assert_eq!(
            s.bytes_in_use,
            t.in_segments + t.exact_bytes,
            "pool bytes in use = segments + exact blocks, {}",
            ctx()
        );
        let sum = &mut self.summary;
        sum.peak_segments = sum.peak_segments.max(ps.segments);
    }

    /// The whole-pool check: the layer's and the exact pool's
    /// `validate()`, the backing blocks against the checking allocator's
    /// own log, and the picture of the blocks held (spans, segments, sums)
    /// rebuilt from scratch, every block checked again against the live
    /// backing blocks and all of them for overlaps. `O(n log n)`.
    fn check_whole(&mut self, what: &dyn fmt::Debug) {
        let step = self.step;
        let ctx = || format!("after {what:?} at step {step}");
        self.validate();

        // The calls seen against the checking allocator's log.
        let calls = self.checking.calls();
        assert_eq!(
            calls.get(self.seen_calls..),
            Some(&self.unverified[..]),
            "the backing calls seen against the checking allocator's log, {}",
            ctx()
        );
        self.seen_calls = calls.len();
        self.unverified.clear();
        assert_eq!(self.checking.live(), self.backing.len(), "{}", ctx());
        assert_eq!(
            self.backing.values().sum::<usize>(),
            self.backing_bytes,
            "{}",
            ctx()
        );

        // Every packed block lies inside a live backing block, which is a
        // segment; every exact block is a backing block.
        let mut tally = Tally::default();
        let mut segments: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        let mut spans: Vec<(u64, u64, bool)> = Vec::with_capacity(self.held.len());
        let mut exact_starts = std::collections::BTreeSet::new();
        for h in &self.held {
            let extent = self.extent(h.size, h.packed, h.block);
            assert_eq!(
                extent,
                h.extent,
                "block {:#x}: its extent changed while held, {}",
                h.block,
                ctx()
            );
            let ((start, size), oversize) =
                self.check_block(h.block, h.size, h.packed, extent, what);
            assert_eq!(
                (start, oversize),
                (h.backing, h.oversize),
                "block {:#x}: its backing block changed while held, {}",
                h.block,
                ctx()
            );
            spans.push((h.block, h.block + extent as u64, h.packed));
            tally.requested += h.size;
            if h.packed {
                tally.packed += 1;
                tally.packed_bytes += extent;
                segments.entry(start).or_insert((size, 0)).1 += 1;
            } else {
                tally.exact += 1;
                tally.exact_bytes += extent;
                tally.oversize += oversize;
                exact_starts.insert(h.block);
            }
        }
        for &start in segments.keys() {
            assert!(
                !exact_starts.contains(&start),
                "segment {start:#x} is also an exact block held, {}",
                ctx()
            );
        }
        tally.in_segments = segments.values().map(|&(size, _)| size).sum();

        // No two held blocks overlap.
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "blocks [{:#x}, {:#x}) and [{:#x}, {:#x}) overlap, {}",
                w[0].0,
                w[0].1,
                w[1].0,
                w[1].1,
                ctx()
            );
        }

        // The incremental picture is the one rebuilt.
        assert_eq!(
            tally,
            self.tally,
            "the sums over the blocks held, {}",
            ctx()
        );
        assert_eq!(segments, self.segments, "the segments held, {}", ctx());
        let mut kept: Vec<(u64, u64, bool)> = self
            .spans
            .iter()
            .map(|(&(s, e, _), &p)| (s, e, p))
            .collect();
        kept.sort_unstable();
        assert_eq!(spans, kept, "the spans held, {}", ctx());
    }

    fn allocate(&mut self, size: usize) {
        let ps_before = self.stats().1;
        let live_before = self.held.len();
        let injected = self.fail_next > 0;
        let result: Result<(u64, Option<Handle>), PoolError<_>> = match &mut *self.subject {
            Subject::Plain(p) => {
                // Every other step goes through the `RawAllocator` face.
                if self.step % 2 == 0 {
                    p.allocate(size).map(|b| (b, None))
                } else {
                    RawAllocator::allocate(p, size).map(|b| (b, None))
                }
            }
            Subject::Shared(s) => s.allocate(size).map(|h| (*h, Some(h))),
        };
        let (after, ps) = self.stats();
        let step = self.step;
        let what = Allocate(size);
        self.sync_backing(&what);
        let failed = result.is_err();
        match result {
            Ok((block, handle)) => {
                let packed = ps.carved == ps_before.carved + 1;
                assert_eq!(
                    ps.requests,
                    ps_before.requests + 1,
                    "one request counted for allocate({size}) at step {step}"
                );
                if size > self.packing.medium_threshold {
                    assert!(
                        !packed,
                        "allocate({size}) above the medium threshold was carved"
                    );
                }
                if let Some(h) = &handle {
                    assert_eq!(h.size(), size);
                }
                self.hold(block, size, packed, handle);
            }
            Err(e) => {
                self.summary.failures += 1;
                assert_eq!(
                    ps.bytes_requested, ps_before.bytes_requested,
                    "a failed allocate({size}) changed bytes requested at step {step}"
                );
                assert_eq!(
                    ps.requests, ps_before.requests,
                    "a failed request was counted"
                );
                let class = self.class_size(self.exact_bytes(size));
                let valid = class.is_some() && size > 0;
                let unconstrained =
                    self.cfg.limit.is_none() && self.cfg.capacity.is_none() && !injected;
                assert!(
                    !(valid && unconstrained && size <= 1 << 40),
                    "allocate({size}) failed with no limit, no capacity and no injected \
                     failure at step {step}: {e}"
                );
                // Nothing held: every byte of the pool can be freed, so a
                // request whose class fits must succeed.
                if let Some(class) = class {
                    let fits = class <= 1 << 40
                        && self.cfg.limit.is_none_or(|l| class <= l)
                        && self.cfg.capacity.is_none_or(|c| class <= c);
                    assert!(
                        !(live_before == 0 && !injected && fits),
                        "allocate({size}) (class {class}) failed with nothing held at step \
                         {step}: {e}; stats {after:?}, packing {ps:?}"
                    );
                }
            }
        }
        // Injected failures are consumed by backing calls; read back what is left.
        let pending = self.failing.pending();
        let fault = pending != self.fail_next;
        self.fail_next = pending;
        self.check(&what, failed || fault);
    }

    fn release(&mut self, i: usize) -> usize {
        let h = self.unhold(i);
        let size = h.size;
        match (&mut *self.subject, h.handle) {
            (_, Some(handle)) => drop(handle),
            (Subject::Plain(p), None) => {
                // SAFETY: `h.block` came from `p.allocate(size)`, is held by
                // this harness alone and is not used again.
                unsafe {
                    if self.step % 2 == 0 {
                        p.release(h.block, size);
                    } else {
                        RawAllocator::deallocate(p, h.block, size);
                    }
                }
            }
            (Subject::Shared(_), None) => unreachable!("a shared run holds handles"),
        }
        self.check(
            &format_args!("release(block {:#x}, {size})", h.block),
            false,
        );
        size
    }

    fn apply(&mut self, op: PackedOp) {
        let live = self.held.len();
        match op {
            PackedOp::Allocate(i) => self.allocate(pick(&self.cfg.palette, i)),
            PackedOp::AllocateZero => self.allocate(0),
            PackedOp::AllocateHuge(k) => self.allocate(pick(&PACKED_HUGE, k)),
            PackedOp::Release(i) if live > 0 => {
                self.release(usize::from(i) % live);
            }
            PackedOp::ReleaseAllocate(i) if live > 0 => {
                let size = self.release(usize::from(i) % live);
                self.allocate(size);
            }
            PackedOp::Release(_) | PackedOp::ReleaseAllocate(_) => {}
            PackedOp::Burst { size, n } => {
                let size = pick(&self.cfg.palette, size);
                for _ in 0..=(n % 8) {
                    self.allocate(size);
                }
            }
            PackedOp::ReleaseAlternate(offset) => {
                let mut i = usize::from(offset & 1);
                while i < self.held.len() {
                    self.release(i);
                    i += 1;
                }
            }
            PackedOp::Advance(t) => {
                self.clock.advance(TICK * u32::from(t));
                self.check(&op, false);
            }
            PackedOp::FailNext(n) => {
                self.failing.fail_next(n);
                self.fail_next = n;
                self.check(&op, false);
            }
            PackedOp::Collect => {
                match &mut *self.subject {
                    Subject::Plain(p) => p.collect(),
                    Subject::Shared(s) => s.collect(),
                };
                self.check(&op, false);
            }
            PackedOp::Trim => {
                match &mut *self.subject {
                    Subject::Plain(p) => p.trim(),
                    Subject::Shared(s) => s.trim(),
                };
                self.check(&op, false);
            }
        }
    }
}

/// Builds the pool of a run.
fn build(cfg: &PackedConfig, failing: &Backing, clock: &ManualClock) -> Packed {
    let builder = DecayingPool::builder(failing.clone())
        .policy(FixedTime::new(TICK * cfg.ttl as u32))
        .clock(clock.clone())
        .size_class(cfg.size_class);
    let builder = match cfg.limit {
        Some(limit) => builder.limit(limit),
        None => builder,
    };
    builder.packing(cfg.packing).build()
}

/// Runs `input` against a [`PackedPool`] (or a [`SharedPool`] holding
/// one), checking every step (see the [module documentation](self)); then
/// checks the whole pool, gives every block back, lets the period pass (or
/// trims), checks the whole pool again and that nothing is reserved, drops
/// the pool and checks that every backing block was freed exactly once.
///
/// # Panics
///
/// When a check fails.
pub fn run_packed(input: &PackedInput) -> PackedSummary {
    let cfg = input.config.clone();
    let checking = CheckingAllocator::with_addresses();
    let failing = Backing {
        inner: FailingAllocator::new(checking.clone()),
        pending: Arc::new(AtomicU32::new(0)),
        calls: Arc::new(Mutex::new(Vec::new())),
    };
    failing.inner.set_capacity(cfg.capacity);
    let clock = ManualClock::new();
    let pool = build(&cfg, &failing, &clock);
    let packing = pool.packing();
    let subject = if cfg.shared {
        Subject::Shared(SharedPool::packed(pool))
    } else {
        Subject::Plain(Box::new(pool))
    };
    let mut h = Harness {
        subject: ManuallyDrop::new(subject),
        packing,
        failing,
        checking,
        clock,
        held: Vec::new(),
        classes: RefCell::new(BTreeMap::new()),
        spans: BTreeMap::new(),
        calls: Vec::new(),
        segments: BTreeMap::new(),
        tally: Tally::default(),
        backing: BTreeMap::new(),
        backing_bytes: 0,
        unverified: Vec::new(),
        seen_calls: 0,
        next_id: 0,
        checks: 0,
        fail_next: 0,
        step: 0,
        summary: PackedSummary {
            shared: cfg.shared,
            ..PackedSummary::default()
        },
        cfg,
    };
    h.check(&"a new pool", true);
    let ops = &input.ops[..input.ops.len().min(MAX_PACKED_OPS)];
    for &op in ops {
        h.step += 1;
        h.apply(op);
    }
    // The whole pool, at the end of the operations.
    h.check(&"the last operation", true);

    // Give everything back, in an order the input chooses.
    h.failing.fail_next(0);
    h.fail_next = 0;
    let mut order = super::DropOrder::new(h.cfg.drop_seed);
    while !h.held.is_empty() {
        h.step += 1;
        let i = order.next(h.held.len());
        h.release(i);
    }
    let (s, ps) = h.stats();
    assert_eq!(
        ps.segments, 0,
        "a segment is left with nothing carved: {ps:?}"
    );
    assert_eq!((ps.segment_bytes, ps.packed_bytes), (0, 0), "{ps:?}");
    assert_eq!((s.blocks_in_use, s.bytes_in_use), (0, 0), "{s:?}");

    // The workload stops: the period passes and a collect (or a trim)
    // brings the reserved bytes to zero.
    h.step += 1;
    if h.cfg.trim_at_end {
        match &mut *h.subject {
            Subject::Plain(p) => p.trim(),
            Subject::Shared(s) => s.trim(),
        };
        h.check(&"final trim", true);
    } else {
        h.clock.advance(TICK * (h.cfg.ttl as u32 + 1));
        match &mut *h.subject {
            Subject::Plain(p) => p.collect(),
            Subject::Shared(s) => s.collect(),
        };
        h.check(&"final collect", true);
    }
    let (s, ps) = h.stats();
    assert_eq!(
        s.bytes_reserved, 0,
        "bytes reserved after the workload: {s:?}"
    );
    let mut summary = h.summary;
    summary.ops = ops.len();
    summary.carved = ps.carved;
    summary.exact = ps.exact;
    summary.exact_fallbacks = ps.exact_fallbacks;
    summary.segments_created = ps.segments_created;
    summary.segments_released = ps.segments_released;
    summary.pool_hits = h.pool_stats().hits;
    summary.larger_reuses = ps.larger_reuses;
    summary.evictions = s.evictions;

    let Harness {
        subject,
        checking,
        failing,
        ..
    } = h;
    drop(ManuallyDrop::into_inner(subject));
    checking.assert_all_freed();
    assert_eq!(checking.live(), 0);
    assert_eq!(failing.inner.used(), 0);
    summary
}
