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
//! After every step the harness checks, against a model of the blocks the
//! caller holds (address, size, packed or exact):
//! - the layer's own `validate()`, and the exact pool's;
//! - no two live blocks overlap (packed blocks by their size rounded to the
//!   granularity, exact blocks by their class size);
//! - every packed block lies inside a live backing block, every exact
//!   block starts one; the backing blocks that hold packed blocks are all
//!   counted as segments (`Σ their sizes ≤ segment_bytes`);
//! - every byte is accounted: `bytes_requested` is the sum of the sizes
//!   held, `packed_bytes` the sum of their rounded sizes, `packed_blocks`
//!   their count, `segment_bytes = packed_bytes + free_segment_bytes`,
//!   `requests = carved + exact + exact_fallbacks`,
//!   `segments = segments_created − segments_released`;
//! - every segment is in the exact pool exactly once: the pool's blocks in
//!   use are the segments plus the exact blocks held, and its bytes in use
//!   `segment_bytes` plus the exact blocks' class sizes; the backing
//!   allocator's live blocks are the pool's blocks in use plus cached;
//! - with a limit, `bytes_reserved` never exceeds it; with no limit, no
//!   capacity and no injected failure, no request of a valid size fails;
//!   with nothing held and no injected failure, a request whose class fits
//!   under the limit and the capacity succeeds (no fragmentation failure);
//! - a request above the medium threshold is never carved.
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

use core::fmt;
use core::mem::ManuallyDrop;
use core::time::Duration;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

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

/// The backing allocator: a [`FailingAllocator`] (capacity) over an
/// addressed [`CheckingAllocator`], with failures injected here so that the
/// harness knows how many are still pending.
#[derive(Clone, Debug)]
struct Backing {
    inner: FailingAllocator<CheckingAllocator>,
    pending: Arc<AtomicU32>,
}

impl Backing {
    fn fail_next(&self, n: u32) {
        self.pending.store(n, Ordering::Relaxed);
    }

    fn pending(&self) -> u32 {
        self.pending.load(Ordering::Relaxed)
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
        self.inner.allocate(size)
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract, passed through unchanged.
        unsafe { self.inner.deallocate(block, size) }
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
    /// The `Pooled` handle, in a shared run.
    handle: Option<Handle>,
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
    /// Live backing blocks: address → size, kept from the call log.
    backing: BTreeMap<u64, usize>,
    seen_calls: usize,
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

    fn class_size(&self, size: usize) -> Option<usize> {
        match &*self.subject {
            Subject::Plain(p) => p.pool().class_size(size),
            Subject::Shared(s) => s
                .with_packed(|p| p.pool().class_size(size))
                .expect("a packed shared pool"),
        }
    }

    /// Brings the map of live backing blocks up to date with the call log.
    fn sync_backing(&mut self) {
        let calls = self.checking.calls();
        for call in &calls[self.seen_calls..] {
            match *call {
                Call::Allocate { block, size } => {
                    assert!(
                        self.backing.insert(block, size).is_none(),
                        "backing block {block:#x} handed out twice"
                    );
                }
                Call::Deallocate { block, size } => {
                    assert_eq!(
                        self.backing.remove(&block),
                        Some(size),
                        "backing block {block:#x} freed with a wrong size or twice"
                    );
                }
            }
        }
        self.seen_calls = calls.len();
    }

    /// The live backing block holding `[at, at + len)`, if any.
    fn backing_holding(&self, at: u64, len: usize) -> Option<(u64, usize)> {
        let (&start, &size) = self.backing.range(..=at).next_back()?;
        (at + len as u64 <= start + size as u64).then_some((start, size))
    }

    fn extent(&self, h: &Held) -> usize {
        if h.packed {
            round_up(h.size, self.packing.granularity.max(1).next_power_of_two())
        } else {
            // Its class, or a larger one it was swapped for (see
            // `Packing::large_fit`): the backing block it starts, checked
            // against the bounds in `check`.
            let class = self.class_size(self.exact_bytes(h.size));
            self.backing
                .get(&h.block)
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

    fn check(&mut self, what: &dyn fmt::Debug) {
        let step = self.step;
        let ctx = || format!("after {what:?} at step {step}");
        self.sync_backing();
        self.validate();
        let (user, ps) = self.stats();
        let s = self.pool_stats();

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
            user.bytes_in_use >= self.held.iter().map(|h| h.size).sum::<usize>(),
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
        let requested: usize = self.held.iter().map(|h| h.size).sum();
        assert_eq!(ps.bytes_requested, requested, "bytes requested, {}", ctx());
        let packed: Vec<&Held> = self.held.iter().filter(|h| h.packed).collect();
        let packed_bytes: usize = packed.iter().map(|h| self.extent(h)).sum();
        assert_eq!(
            ps.packed_blocks,
            packed.len() as u64,
            "packed blocks, {}",
            ctx()
        );
        assert_eq!(ps.packed_bytes, packed_bytes, "packed bytes, {}", ctx());
        let exact: Vec<&Held> = self.held.iter().filter(|h| !h.packed).collect();
        let exact_bytes: usize = exact.iter().map(|h| self.extent(h)).sum();
        let oversize: usize = exact
            .iter()
            .map(|h| self.extent(h) - self.exact_classes(h.size).0)
            .sum();
        assert_eq!(
            ps.oversize_bytes,
            oversize,
            "oversize bytes: exact blocks beyond their classes, {}",
            ctx()
        );

        // Every segment is in the exact pool once, in use.
        assert_eq!(
            s.blocks_in_use,
            ps.segments + exact.len() as u64,
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
            self.backing.values().sum::<usize>(),
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

        // No two held blocks overlap.
        let mut spans: Vec<(u64, u64, bool)> = self
            .held
            .iter()
            .map(|h| (h.block, h.block + self.extent(h) as u64, h.packed))
            .collect();
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

        // Every packed block lies inside a live backing block, which is a
        // segment; every exact block is a backing block.
        let mut segments: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        for h in &self.held {
            let len = self.extent(h);
            let Some((start, size)) = self.backing_holding(h.block, len) else {
                panic!(
                    "block {:#x} ({} bytes, packed: {}) lies in no live backing block, {}",
                    h.block,
                    h.size,
                    h.packed,
                    ctx()
                );
            };
            if h.packed {
                segments.entry(start).or_insert((size, 0)).1 += 1;
            } else {
                assert_eq!(
                    start,
                    h.block,
                    "exact block {:#x} is not a whole backing block, {}",
                    h.block,
                    ctx()
                );
                let (least, most) = self.exact_classes(h.size);
                assert!(
                    (least..=most).contains(&size),
                    "exact block {:#x} for {} bytes is a block of {size} bytes, not of \
                     {least}..={most}, {}",
                    h.block,
                    h.size,
                    ctx()
                );
            }
        }
        for &start in segments.keys() {
            assert!(
                !self.held.iter().any(|h| !h.packed && h.block == start),
                "segment {start:#x} is also an exact block held, {}",
                ctx()
            );
        }
        // An emptied segment goes back at once: the backing blocks holding
        // packed blocks are exactly the segments, each the pool's block of
        // its class size.
        assert_eq!(
            segments.len() as u64,
            ps.segments,
            "backing blocks holding packed blocks = segments held, {}",
            ctx()
        );
        let in_segments: usize = segments.values().map(|&(size, _)| size).sum();
        assert!(in_segments >= ps.segment_bytes, "{}", ctx());
        if self.cfg.size_class == SizeClass::Exact {
            assert_eq!(in_segments, ps.segment_bytes, "segment bytes, {}", ctx());
        }
        assert_eq!(
            s.bytes_in_use,
            in_segments + exact_bytes,
            "pool bytes in use = segments + exact blocks, {}",
            ctx()
        );
        let most = segments.values().map(|&(_, n)| n).max().unwrap_or(0);
        let sum = &mut self.summary;
        sum.peak_blocks_per_segment = sum.peak_blocks_per_segment.max(most);
        sum.peak_segments = sum.peak_segments.max(ps.segments);
    }

    fn allocate(&mut self, size: usize) {
        let (before, ps_before) = self.stats();
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
        let _ = before;
        let step = self.step;
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
                self.held.push(Held {
                    block,
                    size,
                    packed,
                    handle,
                });
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
        self.fail_next = self.failing.pending();
        self.check(&format_args!("allocate({size})"));
    }

    fn release(&mut self, i: usize) -> usize {
        let h = self.held.remove(i);
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
        self.check(&format_args!("release(block {:#x}, {size})", h.block));
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
                self.check(&op);
            }
            PackedOp::FailNext(n) => {
                self.failing.fail_next(n);
                self.fail_next = n;
                self.check(&op);
            }
            PackedOp::Collect => {
                match &mut *self.subject {
                    Subject::Plain(p) => p.collect(),
                    Subject::Shared(s) => s.collect(),
                };
                self.check(&op);
            }
            PackedOp::Trim => {
                match &mut *self.subject {
                    Subject::Plain(p) => p.trim(),
                    Subject::Shared(s) => s.trim(),
                };
                self.check(&op);
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
/// one), checking every step; then gives every block back, lets the
/// period pass (or trims), checks that nothing is reserved, drops the pool
/// and checks that every backing block was freed exactly once.
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
        backing: BTreeMap::new(),
        seen_calls: 0,
        fail_next: 0,
        step: 0,
        summary: PackedSummary {
            shared: cfg.shared,
            ..PackedSummary::default()
        },
        cfg,
    };
    h.check(&"a new pool");
    let ops = &input.ops[..input.ops.len().min(MAX_PACKED_OPS)];
    for &op in ops {
        h.step += 1;
        h.apply(op);
    }

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
        h.check(&"final trim");
    } else {
        h.clock.advance(TICK * (h.cfg.ttl as u32 + 1));
        match &mut *h.subject {
            Subject::Plain(p) => p.collect(),
            Subject::Shared(s) => s.collect(),
        };
        h.check(&"final collect");
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
