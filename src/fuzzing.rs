//! A model-checking harness for fuzzing (feature `fuzzing`).
//!
//! The `fuzz/` targets `pool_ops` and `shared_ops` and the stable-Rust
//! corpus replay (`tests/it/fuzz_corpus.rs`) all call [`pool_ops`] and
//! [`shared_ops`] here, so the same checks run under libFuzzer and under
//! `cargo test`.
//!
//! An input is an [`Arbitrary`] configuration (policy and its parameter,
//! [`Reuse`], [`SizeClass`], an optional limit, an optional backing
//! capacity so the out-of-memory retry ladder runs) followed by
//! operations. Each is run against the real pool over
//! [`FailingAllocator`]`<`[`CheckingAllocator`]`>` next to a reference model
//! of the design document (plain `Vec`s, linear scans). After every step
//! the harness checks the block handed out (or the exact error), the whole
//! [`Stats`], the backing call log, the failing allocator's counters, and
//! runs `validate()`; at the end every block goes back and the pool is
//! dropped, after which every backing block must have been freed exactly
//! once.
//!
//! The model:
//! - the cache is a `Vec` of (block, class, release time), oldest first;
//!   a hit takes the newest (`Lifo`) or oldest (`Fifo`) block of its class;
//! - before every `allocate`, `release` and `collect` the policy runs at
//!   `now` and frees the oldest block while it says so (`trim` does not);
//! - `FixedTime(ttl)`: due when `now - released >= ttl`;
//! - `Exponential(h)`: the allowance rule documented on
//!   [`Exponential`]: decayed by `2^(-dt/h)`, raised by a release, scaled by
//!   `after / before` on a hit, clamped to the cached bytes after
//!   trim / limit / retry frees, held to at most `bytes_cached + oldest / 2`
//!   before each decision, reset when the decay empties the cache. Times
//!   lie on a 1/512 s grid, so the `f64` arithmetic is exact and the model
//!   rounds as the pool does;
//! - `FixedCapacity(slots)`: no clock; with at most
//!   [`FixedCapacity::WINDOW`] slots the window is the whole table and the
//!   victim of a release into a full table is predicted exactly (the
//!   oldest block); with more slots the harness learns the victim from the
//!   call log and checks it may be the one (it was cached with that size,
//!   its window could be full, it is the oldest of its class when it shares
//!   the released block's class);
//! - the limit rule, then the out-of-memory retry ladder, on a miss.
//!
//! # Input layout
//!
//! Every field is read from one byte (missing bytes read as zero), so
//! seeds are easy to write by hand: see [`Config`], [`Op`] and [`SharedOp`].
//!
//! # Examples
//!
//! ```
//! // FixedTime (ttl: PERIODS[4] = 4 ticks), Lifo, Exact, no limit, no
//! // capacity, palette [SIZES[6] = 64], no final trim, drop seed 0.
//! let mut input = vec![0, 4, 0, 0, 0, 0, 0, 0, 6, 0, 0];
//! // Allocate palette[0], release it, advance one period, collect.
//! input.extend([0, 0, 12, 0, 22, 4, 1, 29]);
//! let summary = decaying_pool::fuzzing::pool_ops(&input).unwrap();
//! assert_eq!(summary.stats.evictions, 1);
//! ```

use core::fmt;
use core::mem::ManuallyDrop;
use core::time::Duration;

use arbitrary::{Arbitrary, Unstructured};

use crate::clock::ManualClock;
use crate::error::PoolError;
use crate::policy::{Exponential, FixedCapacity, FixedTime, Policy, Reuse};
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;
use crate::shared::{Pooled, SharedPool};
use crate::stats::Stats;
use crate::testing::{Call, CheckingAllocator, FailingAllocator, TestError};
use crate::SizeClass;

/// One tick of the harness clock: 1/512 s, so every time is an exact
/// binary fraction of a second and `Duration::as_secs_f64` is exact.
pub const TICK_NS: u64 = 1_953_125;

/// Operations run per input at most (the rest of a longer input is
/// ignored), so each execution stays fast.
pub const MAX_OPS: usize = 1024;

fn ticks(n: u64) -> Duration {
    Duration::from_nanos(n * TICK_NS)
}

/// Request sizes a configuration draws its palette from.
pub const SIZES: [usize; 18] = [
    1, 2, 3, 7, 8, 9, 64, 100, 127, 128, 129, 500, 512, 1000, 1024, 1025, 3000, 4096,
];

/// Requests that overflow or nearly overflow.
pub const HUGE: [usize; 4] = [usize::MAX, usize::MAX - 3, (usize::MAX >> 1) + 2, 1 << 40];

/// Time-to-live and half-life choices, in ticks.
pub const PERIODS: [u64; 12] = [0, 1, 2, 3, 4, 8, 16, 64, 100, 512, 1024, 5];

/// `FixedCapacity` slot counts (some above [`FixedCapacity::WINDOW`]).
pub const SLOTS: [usize; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 64, 3];

/// Limit choices (byte 5 of a [`Config`], when `>= 128`).
pub const LIMITS: [usize; 8] = [0, 1, 100, 1000, 4096, 10_000, 50_000, 2000];

/// Backing capacity choices (byte 6 of a [`Config`], when `>= 128`).
pub const CAPACITIES: [usize; 8] = [0, 64, 1000, 5000, 20_000, 100_000, 2500, 8192];

/// `SizeClass::Multiple` parameters.
pub const MULTIPLES: [usize; 8] = [0, 1, 2, 3, 8, 100, 256, 1000];

/// `SizeClass::PowerOfTwoDivisions` parameters.
pub const DIVISIONS: [u32; 9] = [0, 1, 2, 3, 4, 5, 7, 8, 16];

/// The eviction policy of a run; periods in ticks of [`TICK_NS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `FixedTime::new(ttl ticks)`.
    FixedTime {
        /// Time-to-live in ticks.
        ttl: u64,
    },
    /// `Exponential::half_life(half_life ticks)`.
    Exponential {
        /// Half-life in ticks.
        half_life: u64,
    },
    /// `FixedCapacity::new(slots)`.
    FixedCapacity {
        /// Table entries.
        slots: usize,
    },
}

/// The configuration of a run.
///
/// Layout, one byte each: `kind % 3` (FixedTime, Exponential,
/// FixedCapacity); the parameter (an index into [`PERIODS`] or [`SLOTS`]);
/// reuse (`& 1`: Lifo, Fifo); size class `% 4` (Exact, PowerOfTwo,
/// Multiple, PowerOfTwoDivisions); its parameter (an index into
/// [`MULTIPLES`] or [`DIVISIONS`]); limit (`< 128`: none, else an index
/// into [`LIMITS`]); capacity (`< 128`: none, else an index into
/// [`CAPACITIES`]); palette length (`1 + b % 5`); that many palette
/// entries (indices into [`SIZES`]); flags (`& 1`: trim before the drop);
/// drop-order seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The policy.
    pub kind: Kind,
    /// Which cached block of a class is handed out.
    pub reuse: Reuse,
    /// The rounding rule.
    pub size_class: SizeClass,
    /// The pool's byte limit.
    pub limit: Option<usize>,
    /// The backing allocator's byte capacity.
    pub capacity: Option<usize>,
    /// The request sizes operations choose from (1 to 5 of them).
    pub palette: Vec<usize>,
    /// Trim once everything is released, before dropping the pool.
    pub trim_before_drop: bool,
    /// Chooses the order handles and blocks are dropped in at the end of a
    /// `shared_ops` run.
    pub drop_seed: u8,
}

fn byte(u: &mut Unstructured<'_>) -> arbitrary::Result<u8> {
    u8::arbitrary(u)
}

fn pick<T: Copy>(table: &[T], b: u8) -> T {
    table[usize::from(b) % table.len()]
}

impl<'a> Arbitrary<'a> for Config {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let kind = byte(u)?;
        let param = byte(u)?;
        let kind = match kind % 3 {
            0 => Kind::FixedTime {
                ttl: pick(&PERIODS, param),
            },
            1 => Kind::Exponential {
                half_life: pick(&PERIODS, param),
            },
            _ => Kind::FixedCapacity {
                slots: pick(&SLOTS, param),
            },
        };
        let reuse = if byte(u)? & 1 == 0 {
            Reuse::Lifo
        } else {
            Reuse::Fifo
        };
        let class = byte(u)?;
        let class_param = byte(u)?;
        let size_class = match class % 4 {
            0 => SizeClass::Exact,
            1 => SizeClass::PowerOfTwo,
            2 => SizeClass::Multiple(pick(&MULTIPLES, class_param)),
            _ => SizeClass::PowerOfTwoDivisions(pick(&DIVISIONS, class_param)),
        };
        let limit = byte(u)?;
        let limit = (limit >= 128).then(|| pick(&LIMITS, limit));
        let capacity = byte(u)?;
        let capacity = (capacity >= 128).then(|| pick(&CAPACITIES, capacity));
        let len = 1 + usize::from(byte(u)?) % 5;
        let mut palette = Vec::with_capacity(len);
        for _ in 0..len {
            palette.push(pick(&SIZES, byte(u)?));
        }
        let trim_before_drop = byte(u)? & 1 == 1;
        let drop_seed = byte(u)?;
        Ok(Config {
            kind,
            reuse,
            size_class,
            limit,
            capacity,
            palette,
            trim_before_drop,
            drop_seed,
        })
    }
}

/// The size an allocation asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// `palette[i % palette.len()]`.
    Palette(u8),
    /// Zero bytes.
    Zero,
    /// `HUGE[i % HUGE.len()]`.
    Huge(u8),
}

/// A `pool_ops` operation.
///
/// Layout: a tag byte, `% 32`, then its arguments, one byte each:
/// `0..=9` allocate (palette index), `10` allocate zero, `11` allocate
/// huge (index), `12..=18` release the i-th live block (index),
/// `19..=21` release the i-th live block and allocate its size again
/// (index), `22..=26` advance the clock (quarters of the policy's period
/// `% 17`, jitter `% 3 - 1` ticks), `27..=28` fail the next `n % 4` backing
/// calls, `29..=30` collect, `31` trim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `allocate`.
    Allocate(Size),
    /// Releases the i-th live block (modulo the live count).
    Release(u8),
    /// Releases the i-th live block, then allocates its size again.
    ReleaseAllocate(u8),
    /// Advances the clock by `quarters / 4` of the policy's period, plus
    /// `jitter` ticks.
    Advance {
        /// Quarter periods.
        quarters: u8,
        /// -1, 0 or 1 tick.
        jitter: i8,
    },
    /// `FailingAllocator::fail_next(n)`.
    FailNext(u32),
    /// `collect`.
    Collect,
    /// `trim`.
    Trim,
}

fn advance(u: &mut Unstructured<'_>) -> arbitrary::Result<(u8, i8)> {
    let quarters = byte(u)? % 17;
    // 0, 1 or 2, minus one: fits.
    let jitter = (byte(u)? % 3) as i8 - 1;
    Ok((quarters, jitter))
}

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match byte(u)? % 32 {
            0..=9 => Op::Allocate(Size::Palette(byte(u)?)),
            10 => Op::Allocate(Size::Zero),
            11 => Op::Allocate(Size::Huge(byte(u)?)),
            12..=18 => Op::Release(byte(u)?),
            19..=21 => Op::ReleaseAllocate(byte(u)?),
            22..=26 => {
                let (quarters, jitter) = advance(u)?;
                Op::Advance { quarters, jitter }
            }
            27..=28 => Op::FailNext(u32::from(byte(u)? % 4)),
            29..=30 => Op::Collect,
            _ => Op::Trim,
        })
    }
}

/// A `pool_ops` input: a [`Config`], then [`Op`]s to the end of the data
/// (at most [`MAX_OPS`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PoolInput {
    /// The configuration.
    pub config: Config,
    /// The operations.
    pub ops: Vec<Op>,
}

fn ops_to_end<'a, T: Arbitrary<'a>>(u: &mut Unstructured<'a>) -> arbitrary::Result<Vec<T>> {
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < MAX_OPS {
        ops.push(T::arbitrary(u)?);
    }
    Ok(ops)
}

impl<'a> Arbitrary<'a> for PoolInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(PoolInput {
            config: Config::arbitrary(u)?,
            ops: ops_to_end(u)?,
        })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        Self::arbitrary(&mut u)
    }
}

/// A `shared_ops` operation on a [`SharedPool`].
///
/// Layout: a tag byte, `% 32`, then its arguments, one byte each:
/// `0..=8` allocate a [`Pooled`] (handle index, palette index), `9`
/// allocate zero bytes (`0`) or a huge size (index `- 1`), `10..=14` give
/// back the i-th live block (index, how), `15..=16` [`Pooled::into_raw`]
/// (index), `17` [`Pooled::from_raw`] (index), `18` a raw `allocate`
/// through [`SharedPool::with`] (palette index), `19` release the i-th
/// live block then allocate its size again (index), `20..=22` advance the
/// clock (as [`Op`]), `23` fail next, `24..=25` collect, `26` trim, `27`
/// clone a handle, `28` drop an extra handle (index), `29..=31` allocate
/// through a block's own [`Pooled::pool`] handle (palette index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedOp {
    /// `SharedPool::allocate` through a handle.
    Allocate {
        /// Which handle (modulo the handles held).
        handle: u8,
        /// The size.
        size: Size,
    },
    /// Allocates through the `pool()` of the last live `Pooled` (or the
    /// first handle).
    AllocateViaBlock(u8),
    /// A raw block from `with(|p| p.allocate(size))`.
    WithAllocate(u8),
    /// Gives back the i-th live block: drops a `Pooled`; a raw block goes
    /// back through `from_raw` then drop (`how` even) or
    /// `with(|p| p.release(..))` (`how` odd).
    Release {
        /// Which live block.
        index: u8,
        /// How a raw block is given back.
        how: u8,
    },
    /// Releases the i-th live block, then allocates its size again.
    ReleaseAllocate(u8),
    /// `Pooled::into_raw` on the i-th live block, if it is a `Pooled`.
    IntoRaw(u8),
    /// `Pooled::from_raw` on the i-th live block, if it is raw.
    FromRaw(u8),
    /// Advances the clock as [`Op::Advance`].
    Advance {
        /// Quarter periods.
        quarters: u8,
        /// -1, 0 or 1 tick.
        jitter: i8,
    },
    /// `FailingAllocator::fail_next(n)`.
    FailNext(u32),
    /// `SharedPool::collect`.
    Collect,
    /// `SharedPool::trim`.
    Trim,
    /// Clones a handle.
    CloneHandle,
    /// Drops the i-th extra handle (one handle always stays until the end).
    DropHandle(u8),
}

impl<'a> Arbitrary<'a> for SharedOp {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match byte(u)? % 32 {
            0..=8 => SharedOp::Allocate {
                handle: byte(u)?,
                size: Size::Palette(byte(u)?),
            },
            9 => SharedOp::Allocate {
                handle: 0,
                size: match byte(u)? {
                    0 => Size::Zero,
                    k => Size::Huge(k - 1),
                },
            },
            10..=14 => SharedOp::Release {
                index: byte(u)?,
                how: byte(u)?,
            },
            15..=16 => SharedOp::IntoRaw(byte(u)?),
            17 => SharedOp::FromRaw(byte(u)?),
            18 => SharedOp::WithAllocate(byte(u)?),
            19 => SharedOp::ReleaseAllocate(byte(u)?),
            20..=22 => {
                let (quarters, jitter) = advance(u)?;
                SharedOp::Advance { quarters, jitter }
            }
            23 => SharedOp::FailNext(u32::from(byte(u)? % 4)),
            24..=25 => SharedOp::Collect,
            26 => SharedOp::Trim,
            27 => SharedOp::CloneHandle,
            28 => SharedOp::DropHandle(byte(u)?),
            _ => SharedOp::AllocateViaBlock(byte(u)?),
        })
    }
}

/// A `shared_ops` input: a [`Config`], then [`SharedOp`]s to the end of
/// the data (at most [`MAX_OPS`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SharedInput {
    /// The configuration.
    pub config: Config,
    /// The operations.
    pub ops: Vec<SharedOp>,
}

impl<'a> Arbitrary<'a> for SharedInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(SharedInput {
            config: Config::arbitrary(u)?,
            ops: ops_to_end(u)?,
        })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        Self::arbitrary(&mut u)
    }
}

/// What a run reached, for corpus coverage checks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The policy.
    pub kind: Kind,
    /// The pool's counters once every block was given back, before the
    /// final trim and drop.
    pub stats: Stats,
    /// Operations run.
    pub ops: usize,
    /// Misses whose backing call failed with blocks cached, so the retry
    /// ladder's first rung ran (free the oldest blocks, retry).
    pub retries: u64,
    /// Misses that reached the ladder's second rung (free everything,
    /// retry once more).
    pub second_rung: u64,
    /// Most blocks live at once.
    pub peak_live: usize,
}

// --- the reference model -----------------------------------------------------

/// The size-class rule, written from the design document and the
/// `SizeClass` docs (not from `SizeClass::round`): the model's rounding.
///
/// # Examples
///
/// ```
/// use decaying_pool::{fuzzing::model_round, SizeClass};
/// assert_eq!(model_round(SizeClass::PowerOfTwoDivisions(4), 1100), Some(1280));
/// assert_eq!(model_round(SizeClass::PowerOfTwoDivisions(3), 3), Some(3));
/// ```
pub fn model_round(rule: SizeClass, size: usize) -> Option<usize> {
    fn next_pow2(size: usize) -> Option<usize> {
        let mut p: usize = 1;
        while p < size {
            p = p.checked_mul(2)?;
        }
        Some(p)
    }
    if size == 0 {
        return None;
    }
    match rule {
        SizeClass::Exact => Some(size),
        SizeClass::PowerOfTwo => next_pow2(size),
        SizeClass::Multiple(n) if n <= 1 => Some(size),
        SizeClass::Multiple(n) => match size % n {
            0 => Some(size),
            r => size.checked_add(n - r),
        },
        SizeClass::PowerOfTwoDivisions(k) => {
            if size.is_power_of_two() {
                return Some(size);
            }
            if k <= 1 {
                return next_pow2(size);
            }
            let mut floor: u128 = 1;
            while floor * 2 <= size as u128 {
                floor *= 2;
            }
            let k = u128::from(k);
            (1..=k)
                .map(|i| floor + (i * floor).div_ceil(k))
                .find(|&step| step >= size as u128)
                .and_then(|step| usize::try_from(step).ok())
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Idle {
    block: u64,
    class: usize,
    released: u64,
}

#[derive(Clone, Copy, Debug)]
struct Live {
    block: u64,
    size: usize,
    class: usize,
}

type Outcome = Result<u64, PoolError<TestError>>;

struct Model {
    cfg: Config,
    now: u64,
    idle: Vec<Idle>,
    live: Vec<Live>,
    issued: u64,
    fail_next: u32,
    calls: Vec<Call>,
    allowance: f64,
    allowance_at: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    trimmed: u64,
    backing_failures: u64,
    retries: u64,
    second_rung: u64,
    peak_reserved: usize,
    peak_in_use: usize,
    peak_live: usize,
    from_pool: usize,
    from_backing: usize,
    /// Class minus requested bytes over successful allocations (saturating).
    waste: usize,
}

impl Model {
    fn new(cfg: Config) -> Self {
        Model {
            cfg,
            now: 0,
            idle: Vec::new(),
            live: Vec::new(),
            issued: 0,
            fail_next: 0,
            calls: Vec::new(),
            allowance: 0.0,
            allowance_at: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            trimmed: 0,
            backing_failures: 0,
            retries: 0,
            second_rung: 0,
            peak_reserved: 0,
            peak_in_use: 0,
            peak_live: 0,
            from_pool: 0,
            from_backing: 0,
            waste: 0,
        }
    }

    fn class(&self, size: usize) -> Option<usize> {
        model_round(self.cfg.size_class, size)
    }

    fn bytes_cached(&self) -> usize {
        self.idle.iter().map(|b| b.class).sum()
    }

    fn bytes_in_use(&self) -> usize {
        self.live.iter().map(|b| b.class).sum()
    }

    fn reserved(&self) -> usize {
        self.bytes_in_use() + self.bytes_cached()
    }

    fn stats(&self) -> Stats {
        let count = |f: fn(&Call) -> bool| self.calls.iter().filter(|c| f(c)).count() as u64;
        let (in_use, cached) = (self.bytes_in_use(), self.bytes_cached());
        Stats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            trimmed: self.trimmed,
            backing_allocs: count(|c| matches!(c, Call::Allocate { .. })),
            backing_deallocs: count(|c| matches!(c, Call::Deallocate { .. })),
            backing_failures: self.backing_failures,
            blocks_in_use: self.live.len() as u64,
            blocks_cached: self.idle.len() as u64,
            bytes_in_use: in_use,
            bytes_cached: cached,
            bytes_reserved: in_use + cached,
            peak_bytes_reserved: self.peak_reserved,
            peak_bytes_in_use: self.peak_in_use,
            bytes_from_pool: self.from_pool,
            bytes_from_backing: self.from_backing,
            bytes_requested: self
                .from_pool
                .saturating_add(self.from_backing)
                .saturating_sub(self.waste),
        }
    }

    fn update_peaks(&mut self) {
        self.peak_reserved = self.peak_reserved.max(self.reserved());
        self.peak_in_use = self.peak_in_use.max(self.bytes_in_use());
        self.peak_live = self.peak_live.max(self.live.len());
    }

    fn allowance_now(&self, half_life: u64) -> f64 {
        if self.now <= self.allowance_at {
            return self.allowance;
        }
        let dt = ticks(self.now - self.allowance_at).as_secs_f64();
        let halvings = dt * (1.0 / ticks(half_life).as_secs_f64());
        self.allowance * (-halvings).exp2()
    }

    fn rebase(&mut self) -> Option<()> {
        let Kind::Exponential { half_life } = self.cfg.kind else {
            return None;
        };
        self.allowance = self.allowance_now(half_life);
        self.allowance_at = self.now;
        Some(())
    }

    fn deallocate(&mut self, block: u64, size: usize) {
        self.calls.push(Call::Deallocate { block, size });
    }

    fn backing(&mut self, class: usize) -> Result<u64, TestError> {
        if self.fail_next > 0 {
            self.fail_next -= 1;
            self.backing_failures += 1;
            return Err(TestError::Injected);
        }
        let used = self.reserved();
        let capacity = self.cfg.capacity.unwrap_or(usize::MAX);
        match used.checked_add(class) {
            Some(total) if total <= capacity => {
                self.issued += 1;
                self.calls.push(Call::Allocate {
                    block: self.issued,
                    size: class,
                });
                Ok(self.issued)
            }
            _ => {
                self.backing_failures += 1;
                Err(TestError::OutOfMemory {
                    requested: class,
                    used,
                    capacity,
                })
            }
        }
    }

    fn run_policy(&mut self) -> usize {
        let mut freed = 0;
        while let Some(oldest) = self.idle.first().copied() {
            let due = match self.cfg.kind {
                Kind::FixedTime { ttl } => self.now.saturating_sub(oldest.released) >= ttl,
                Kind::Exponential { half_life } => {
                    let half = oldest.class as f64 / 2.0;
                    let bound = self.bytes_cached() as f64 + half;
                    let mut allowance = self.allowance_now(half_life);
                    if allowance > bound {
                        allowance = bound;
                        self.allowance = bound;
                        self.allowance_at = self.now;
                    }
                    self.bytes_cached() as f64 - allowance >= half
                }
                Kind::FixedCapacity { .. } => false,
            };
            if !due {
                break;
            }
            self.idle.remove(0);
            self.evictions += 1;
            self.deallocate(oldest.block, oldest.class);
            freed += 1;
            if self.idle.is_empty() && self.rebase().is_some() {
                self.allowance = 0.0;
            }
        }
        freed
    }

    fn free_oldest(&mut self) -> Option<usize> {
        if self.idle.is_empty() {
            return None;
        }
        let oldest = self.idle.remove(0);
        self.trimmed += 1;
        self.deallocate(oldest.block, oldest.class);
        if self.rebase().is_some() {
            self.allowance = self.allowance.min(self.bytes_cached() as f64);
        }
        Some(oldest.class)
    }

    fn allocate(&mut self, size: usize) -> Outcome {
        self.run_policy();
        let out = self.serve(size);
        self.update_peaks();
        out
    }

    fn serve(&mut self, size: usize) -> Outcome {
        let Some(class) = self.class(size) else {
            return Err(if size == 0 {
                PoolError::ZeroSize
            } else {
                PoolError::TooLarge { requested: size }
            });
        };
        let same = |b: &Idle| b.class == class;
        let found = match self.cfg.reuse {
            Reuse::Lifo => self.idle.iter().rposition(same),
            Reuse::Fifo => self.idle.iter().position(same),
        };
        if let Some(i) = found {
            let before = self.bytes_cached();
            let hit = self.idle.remove(i);
            let after = self.bytes_cached();
            if self.rebase().is_some() {
                self.allowance *= after as f64 / before as f64;
            }
            self.hits += 1;
            self.from_pool = self.from_pool.saturating_add(class);
            self.waste = self.waste.saturating_add(class - size);
            self.live.push(Live {
                block: hit.block,
                size,
                class,
            });
            return Ok(hit.block);
        }
        let reserved = self.reserved();
        if reserved.checked_add(class).is_none() {
            return Err(PoolError::TooLarge { requested: size });
        }
        if let Some(limit) = self.cfg.limit {
            if self.bytes_in_use() + class > limit {
                return Err(PoolError::LimitExceeded {
                    requested: size,
                    limit,
                    reserved,
                });
            }
            while self.reserved() + class > limit && self.free_oldest().is_some() {}
        }
        let mut result = self.backing(class);
        if result.is_err() && !self.idle.is_empty() {
            self.retries += 1;
            let mut freed = 0;
            while freed < class {
                match self.free_oldest() {
                    Some(c) => freed += c,
                    None => break,
                }
            }
            result = self.backing(class);
            if result.is_err() && !self.idle.is_empty() {
                self.second_rung += 1;
                while self.free_oldest().is_some() {}
                result = self.backing(class);
            }
        }
        let block = result.map_err(PoolError::Backing)?;
        self.misses += 1;
        self.from_backing = self.from_backing.saturating_add(class);
        self.waste = self.waste.saturating_add(class - size);
        self.live.push(Live { block, size, class });
        Ok(block)
    }

    /// Releases `self.live[i]`; `observed` is what the pool called on the
    /// backing allocator during the release.
    fn release(&mut self, i: usize, observed: &[Call]) {
        self.run_policy();
        let block = self.live.remove(i);
        let idle = Idle {
            block: block.block,
            class: block.class,
            released: self.now,
        };
        match self.cfg.kind {
            Kind::FixedTime { .. } | Kind::Exponential { .. } => {
                self.idle.push(idle);
                if self.rebase().is_some() && self.cfg.kind != (Kind::Exponential { half_life: 0 })
                {
                    self.allowance += block.class as f64;
                }
            }
            Kind::FixedCapacity { slots: 0 } => {
                self.evictions += 1;
                self.deallocate(block.block, block.class);
            }
            Kind::FixedCapacity { slots } => {
                if let Some(v) = self.fixed_victim(slots, block.class, observed) {
                    let v = self.idle.remove(v);
                    self.evictions += 1;
                    self.deallocate(v.block, v.class);
                }
                self.idle.push(idle);
            }
        }
        self.update_peaks();
    }

    fn fixed_victim(&self, slots: usize, class: usize, observed: &[Call]) -> Option<usize> {
        let window = slots.min(FixedCapacity::WINDOW);
        if slots <= FixedCapacity::WINDOW {
            return (self.idle.len() == slots).then_some(0);
        }
        match observed {
            [] => {
                assert!(
                    self.idle.len() < slots,
                    "a release into a full table of {slots} slots evicted nothing"
                );
                None
            }
            [Call::Deallocate { block, size }] => {
                let Some(v) = self.idle.iter().position(|b| b.block == *block) else {
                    panic!("a release evicted block {block}, which was not cached");
                };
                assert_eq!(self.idle[v].class, *size, "evicted block {block}'s size");
                assert!(
                    self.idle.len() >= window,
                    "a release evicted block {block} with only {} blocks cached: \
                     its window of {window} slots cannot be full",
                    self.idle.len()
                );
                if self.idle[v].class == class {
                    assert_eq!(
                        self.idle.iter().position(|b| b.class == class),
                        Some(v),
                        "a release evicted block {block}, not the oldest of its window"
                    );
                }
                Some(v)
            }
            other => panic!("a release made unexpected backing calls: {other:?}"),
        }
    }

    fn collect(&mut self) -> usize {
        self.run_policy()
    }

    fn trim(&mut self) -> usize {
        let mut bytes = 0;
        while let Some(class) = self.free_oldest() {
            bytes += class;
        }
        bytes
    }

    fn drop_pool(&mut self) {
        while self.free_oldest().is_some() {}
    }

    fn advance(&mut self, quarters: u8, jitter: i8) -> u64 {
        let period = match self.cfg.kind {
            Kind::FixedTime { ttl } => ttl,
            Kind::Exponential { half_life } => half_life,
            Kind::FixedCapacity { .. } => 4,
        }
        .max(1);
        let dt = (u64::from(quarters) * period / 4).saturating_add_signed(jitter.into());
        self.now += dt;
        dt
    }

    fn summary(&self, stats: Stats, ops: usize) -> Summary {
        Summary {
            kind: self.cfg.kind,
            stats,
            ops,
            retries: self.retries,
            second_rung: self.second_rung,
            peak_live: self.peak_live,
        }
    }

    /// Whether a release then an allocation of the same size must hand the
    /// just-released block back.
    fn reuses_at_once(&self) -> bool {
        self.cfg.reuse == Reuse::Lifo
            && !matches!(
                self.cfg.kind,
                Kind::FixedCapacity { slots: 0 }
                    | Kind::FixedTime { ttl: 0 }
                    | Kind::Exponential { half_life: 0 }
            )
    }
}

/// The backing allocator of every run.
type Backing = FailingAllocator<CheckingAllocator>;

/// Checks shared by both harnesses: stats, calls, failing counters.
fn check_common(
    stats: Stats,
    model: &Model,
    checking: &CheckingAllocator,
    failing: &Backing,
    what: &dyn fmt::Debug,
    step: usize,
) {
    assert_eq!(stats, model.stats(), "stats after step {step}: {what:?}");
    assert_eq!(
        checking.calls(),
        model.calls,
        "backing calls after step {step}: {what:?}"
    );
    assert_eq!(
        failing.failures(),
        model.backing_failures,
        "failures, step {step}"
    );
    assert_eq!(
        failing.used(),
        model.reserved(),
        "backing bytes, step {step}"
    );
    if let Kind::FixedCapacity { slots } = model.cfg.kind {
        assert!(
            stats.blocks_cached <= slots as u64,
            "more blocks than slots"
        );
    }
}

fn new_backing(cfg: &Config) -> (CheckingAllocator, Backing) {
    let checking = CheckingAllocator::new();
    let failing = FailingAllocator::new(checking.clone());
    failing.set_capacity(cfg.capacity);
    (checking, failing)
}

fn build<P: Policy>(
    policy: P,
    cfg: &Config,
    failing: &Backing,
    clock: &ManualClock,
) -> DecayingPool<Backing, P, ManualClock> {
    let mut builder = DecayingPool::builder(failing.clone())
        .policy(policy)
        .clock(clock.clone())
        .size_class(cfg.size_class)
        .reuse(cfg.reuse)
        // `validate` then checks the statistics by class against the totals.
        .class_stats(true);
    if let Some(limit) = cfg.limit {
        builder = builder.limit(limit);
    }
    builder.build()
}

/// Calls `run` with the policy `kind` describes.
macro_rules! with_policy {
    ($kind:expr, $run:ident($($arg:expr),*)) => {
        match $kind {
            Kind::FixedTime { ttl } => $run(FixedTime::new(ticks(ttl)), $($arg),*),
            Kind::Exponential { half_life } => {
                $run(Exponential::half_life(ticks(half_life)), $($arg),*)
            }
            Kind::FixedCapacity { slots } => $run(FixedCapacity::new(slots), $($arg),*),
        }
    };
}

// --- pool_ops -----------------------------------------------------------------

/// Parses `data` as a [`PoolInput`] and runs it with [`run_pool`].
/// Returns `None` when the data cannot be parsed (never, with this
/// layout: missing bytes read as zero).
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn pool_ops(data: &[u8]) -> Option<Summary> {
    let input = PoolInput::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    Some(run_pool(&input))
}

/// Runs `input` against a [`DecayingPool`] and the model, checking every
/// step.
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn run_pool(input: &PoolInput) -> Summary {
    let cfg = input.config.clone();
    with_policy!(cfg.kind, run_pool_with(cfg, &input.ops))
}

struct PoolHarness<P: Policy> {
    /// Never dropped on a failed check: dropping a pool whose state is off
    /// could panic again while unwinding and abort.
    pool: ManuallyDrop<DecayingPool<Backing, P, ManualClock>>,
    failing: Backing,
    checking: CheckingAllocator,
    clock: ManualClock,
    model: Model,
    step: usize,
}

impl<P: Policy> PoolHarness<P> {
    fn check(&mut self, what: &dyn fmt::Debug) {
        let stats = self.pool.stats();
        check_common(
            stats,
            &self.model,
            &self.checking,
            &self.failing,
            what,
            self.step,
        );
        self.pool.validate();
    }

    fn allocate(&mut self, size: usize) {
        assert_eq!(
            self.pool.class_size(size),
            self.model.class(size),
            "class of {size}"
        );
        // Every other step goes through the pool's `RawAllocator` face.
        let got = if self.step % 2 == 0 {
            self.pool.allocate(size)
        } else {
            RawAllocator::allocate(&mut *self.pool, size)
        };
        let want = self.model.allocate(size);
        assert_eq!(got, want, "allocate({size}) at step {}", self.step);
        self.check(&format_args!("allocate({size})"));
    }

    fn release(&mut self, i: usize) -> usize {
        let Live { block, size, .. } = self.model.live[i];
        let before = self.model.calls.len();
        // SAFETY: `block` came from `self.pool.allocate(size)` (the model
        // predicted it and the pool returned it), is live and is not used
        // again.
        unsafe {
            if self.step % 2 == 0 {
                self.pool.release(block, size);
            } else {
                RawAllocator::deallocate(&mut *self.pool, block, size);
            }
        }
        let calls = self.checking.calls();
        self.model.release(i, &calls[before.min(calls.len())..]);
        self.check(&format_args!("release(block {block}, {size})"));
        size
    }

    fn apply(&mut self, op: Op) {
        let live = self.model.live.len();
        match op {
            Op::Allocate(Size::Palette(i)) => self.allocate(pick(&self.model.cfg.palette, i)),
            Op::Allocate(Size::Zero) => self.allocate(0),
            Op::Allocate(Size::Huge(k)) => self.allocate(pick(&HUGE, k)),
            Op::Release(i) if live > 0 => {
                self.release(usize::from(i) % live);
            }
            Op::ReleaseAllocate(i) if live > 0 => {
                let size = self.release(usize::from(i) % live);
                let cached = self.model.idle.last().map(|b| b.block);
                self.allocate(size);
                let tail = self.model.live.last().map(|b| b.block);
                if self.model.reuses_at_once() {
                    assert!(cached.is_some() && tail == cached, "release then allocate");
                }
            }
            Op::Release(_) | Op::ReleaseAllocate(_) => {}
            Op::Advance { quarters, jitter } => {
                let dt = self.model.advance(quarters, jitter);
                self.clock.advance(ticks(dt));
                self.check(&op);
            }
            Op::FailNext(n) => {
                self.failing.fail_next(n);
                self.model.fail_next = n;
                self.check(&op);
            }
            Op::Collect => {
                let got = self.pool.collect();
                let want = self.model.collect();
                assert_eq!(got, want, "collect at step {}", self.step);
                self.check(&op);
            }
            Op::Trim => {
                let got = self.pool.trim();
                let want = self.model.trim();
                assert_eq!(got, want, "trim at step {}", self.step);
                self.check(&op);
            }
        }
    }
}

fn run_pool_with<P: Policy>(policy: P, cfg: Config, ops: &[Op]) -> Summary {
    let (checking, failing) = new_backing(&cfg);
    let clock = ManualClock::new();
    let pool = build(policy, &cfg, &failing, &clock);
    let trim_before_drop = cfg.trim_before_drop;
    let mut h = PoolHarness {
        pool: ManuallyDrop::new(pool),
        failing,
        checking,
        clock,
        model: Model::new(cfg),
        step: 0,
    };
    h.check(&"a new pool");
    for &op in ops.iter().take(MAX_OPS) {
        h.step += 1;
        h.apply(op);
    }
    // Give everything back, then trim (or not) and drop.
    h.failing.fail_next(0);
    h.model.fail_next = 0;
    while !h.model.live.is_empty() {
        h.step += 1;
        h.release(0);
    }
    let summary = h.model.summary(h.pool.stats(), ops.len().min(MAX_OPS));
    if trim_before_drop {
        h.step += 1;
        let want = h.model.trim();
        assert_eq!(h.pool.trim(), want, "final trim");
        h.check(&"final trim");
        assert_eq!(h.pool.stats().bytes_reserved, 0);
    }
    let PoolHarness {
        pool,
        checking,
        failing,
        mut model,
        ..
    } = h;
    drop(ManuallyDrop::into_inner(pool));
    model.drop_pool();
    assert_eq!(checking.calls(), model.calls, "backing calls after drop");
    checking.assert_all_freed();
    assert_eq!(checking.live(), 0);
    assert_eq!(failing.used(), 0);
    summary
}

// --- shared_ops ---------------------------------------------------------------

/// Parses `data` as a [`SharedInput`] and runs it with [`run_shared`].
/// Returns `None` when the data cannot be parsed (never, with this
/// layout).
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn shared_ops(data: &[u8]) -> Option<Summary> {
    let input = SharedInput::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    Some(run_shared(&input))
}

/// Runs `input` against a [`SharedPool`], single-threaded, and the model,
/// checking every step; then drops the handles and blocks in an order the
/// input chooses and checks that the pool is dropped (every block freed)
/// exactly when the last of them goes.
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn run_shared(input: &SharedInput) -> Summary {
    let cfg = input.config.clone();
    with_policy!(cfg.kind, run_shared_with(cfg, &input.ops))
}

type Shared<P> = SharedPool<Backing, P, ManualClock>;

/// A live block of a `shared_ops` run.
enum Holder<P: Policy> {
    Pooled(Pooled<Backing, P, ManualClock>),
    /// Taken out with `into_raw` or allocated through `with`.
    Raw(u64, usize),
}

struct SharedHarness<P: Policy> {
    /// The handles; the first stays until the end.
    handles: Vec<Shared<P>>,
    /// The live blocks, in the model's `live` order.
    slots: Vec<Holder<P>>,
    failing: Backing,
    checking: CheckingAllocator,
    clock: ManualClock,
    model: Model,
    step: usize,
}

impl<P: Policy> Drop for SharedHarness<P> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failed check: dropping the pool could panic again.
            core::mem::forget(core::mem::take(&mut self.handles));
            core::mem::forget(core::mem::take(&mut self.slots));
        }
    }
}

impl<P: Policy> SharedHarness<P> {
    /// Some handle to the pool, if any is left.
    fn handle(&self) -> Option<&Shared<P>> {
        self.handles.first().or_else(|| {
            self.slots.iter().find_map(|s| match s {
                Holder::Pooled(p) => Some(p.pool()),
                Holder::Raw(..) => None,
            })
        })
    }

    fn check(&mut self, what: &dyn fmt::Debug) {
        let Some(pool) = self.handle() else {
            return;
        };
        let stats = pool.stats();
        check_common(
            stats,
            &self.model,
            &self.checking,
            &self.failing,
            what,
            self.step,
        );
        pool.with(|p| {
            assert_eq!(p.stats(), stats, "stats through `with`");
            p.validate();
        });
        for (slot, live) in self.slots.iter().zip(&self.model.live) {
            match slot {
                Holder::Pooled(p) => {
                    assert_eq!((**p, p.size()), (live.block, live.size), "a Pooled");
                    assert!(p.pool().ptr_eq(pool), "a Pooled's pool");
                }
                Holder::Raw(block, size) => {
                    assert_eq!((*block, *size), (live.block, live.size), "a raw block");
                }
            }
        }
    }

    fn allocate(&mut self, pool: Shared<P>, size: usize, raw: bool) {
        let got = if raw {
            pool.with(|p| p.allocate(size))
                .map(|b| Holder::Raw(b, size))
        } else {
            pool.allocate(size).map(Holder::Pooled)
        };
        let want = self.model.allocate(size);
        match (got, want) {
            (Ok(holder), Ok(block)) => {
                if let Holder::Pooled(p) = &holder {
                    assert_eq!(**p, block, "allocate({size}) at step {}", self.step);
                    assert_eq!(p.size(), size);
                    assert!(p.pool().ptr_eq(&pool));
                }
                self.slots.push(holder);
            }
            (Err(got), Err(want)) => {
                assert_eq!(got, want, "allocate({size}) at step {}", self.step);
            }
            (got, want) => panic!(
                "allocate({size}) at step {}: got {:?}, want {want:?}",
                self.step,
                got.map(|h| match h {
                    Holder::Pooled(p) => *p,
                    Holder::Raw(b, _) => b,
                })
            ),
        }
        drop(pool);
        self.check(&format_args!("allocate({size}), raw: {raw}"));
    }

    /// Gives back the i-th live block; returns its size.
    fn release(&mut self, i: usize, how: u8) -> usize {
        let before = self.checking.calls().len();
        let size = match self.slots.remove(i) {
            Holder::Pooled(p) => {
                let size = p.size();
                drop(p);
                size
            }
            Holder::Raw(block, size) => {
                let pool = self.handle().expect("a handle").clone();
                if how % 2 == 0 {
                    // SAFETY: `block` came from this pool with `size`
                    // (through `into_raw` or a raw `allocate`), and is
                    // given back once.
                    drop(unsafe { Pooled::from_raw(&pool, block, size) });
                } else {
                    // SAFETY: as above.
                    pool.with(|p| unsafe { p.release(block, size) });
                }
                size
            }
        };
        let calls = self.checking.calls();
        self.model.release(i, &calls[before.min(calls.len())..]);
        self.check(&format_args!("release #{i} ({size} bytes)"));
        size
    }

    fn apply(&mut self, op: SharedOp) {
        let live = self.slots.len();
        let palette = |i: u8| pick(&self.model.cfg.palette, i);
        match op {
            SharedOp::Allocate { handle, size } => {
                let size = match size {
                    Size::Palette(i) => palette(i),
                    Size::Zero => 0,
                    Size::Huge(k) => pick(&HUGE, k),
                };
                let pool = self.handles[usize::from(handle) % self.handles.len()].clone();
                self.allocate(pool, size, false);
            }
            SharedOp::AllocateViaBlock(i) => {
                let size = palette(i);
                let pool = self
                    .slots
                    .iter()
                    .rev()
                    .find_map(|s| match s {
                        Holder::Pooled(p) => Some(p.pool().clone()),
                        Holder::Raw(..) => None,
                    })
                    .unwrap_or_else(|| self.handles[0].clone());
                self.allocate(pool, size, false);
            }
            SharedOp::WithAllocate(i) => {
                let pool = self.handles[0].clone();
                self.allocate(pool, palette(i), true);
            }
            SharedOp::Release { index, how } if live > 0 => {
                self.release(usize::from(index) % live, how);
            }
            SharedOp::ReleaseAllocate(i) if live > 0 => {
                let size = self.release(usize::from(i) % live, 0);
                let cached = self.model.idle.last().map(|b| b.block);
                let pool = self.handles[0].clone();
                self.allocate(pool, size, false);
                let tail = self.model.live.last().map(|b| b.block);
                if self.model.reuses_at_once() {
                    assert!(cached.is_some() && tail == cached, "release then allocate");
                }
            }
            SharedOp::Release { .. } | SharedOp::ReleaseAllocate(_) => {}
            SharedOp::IntoRaw(i) if live > 0 => {
                let i = usize::from(i) % live;
                if matches!(self.slots[i], Holder::Pooled(_)) {
                    let Holder::Pooled(p) =
                        core::mem::replace(&mut self.slots[i], Holder::Raw(0, 0))
                    else {
                        unreachable!()
                    };
                    let (block, size) = p.into_raw();
                    self.slots[i] = Holder::Raw(block, size);
                }
                self.check(&op);
            }
            SharedOp::FromRaw(i) if live > 0 => {
                let i = usize::from(i) % live;
                if let Holder::Raw(block, size) = self.slots[i] {
                    let pool = self.handles[0].clone();
                    // SAFETY: `block` came from this pool with `size` and is
                    // not given back elsewhere: the slot now owns it.
                    self.slots[i] = Holder::Pooled(unsafe { Pooled::from_raw(&pool, block, size) });
                }
                self.check(&op);
            }
            SharedOp::IntoRaw(_) | SharedOp::FromRaw(_) => {}
            SharedOp::Advance { quarters, jitter } => {
                let dt = self.model.advance(quarters, jitter);
                self.clock.advance(ticks(dt));
                self.check(&op);
            }
            SharedOp::FailNext(n) => {
                self.failing.fail_next(n);
                self.model.fail_next = n;
                self.check(&op);
            }
            SharedOp::Collect => {
                let got = self.handles[0].collect();
                let want = self.model.collect();
                assert_eq!(got, want, "collect at step {}", self.step);
                self.check(&op);
            }
            SharedOp::Trim => {
                let got = self.handles[0].trim();
                let want = self.model.trim();
                assert_eq!(got, want, "trim at step {}", self.step);
                self.check(&op);
            }
            SharedOp::CloneHandle => {
                if self.handles.len() < 8 {
                    let h = self.handles[self.handles.len() - 1].clone();
                    assert!(h.ptr_eq(&self.handles[0]));
                    self.handles.push(h);
                }
                self.check(&op);
            }
            SharedOp::DropHandle(i) => {
                if self.handles.len() > 1 {
                    let i = 1 + usize::from(i) % (self.handles.len() - 1);
                    drop(self.handles.remove(i));
                }
                self.check(&op);
            }
        }
    }
}

fn run_shared_with<P: Policy>(policy: P, cfg: Config, ops: &[SharedOp]) -> Summary {
    let (checking, failing) = new_backing(&cfg);
    let clock = ManualClock::new();
    let pool = SharedPool::new(build(policy, &cfg, &failing, &clock));
    let (trim_before_drop, mut seed) = (cfg.trim_before_drop, u64::from(cfg.drop_seed));
    let mut h = SharedHarness {
        handles: vec![pool],
        slots: Vec::new(),
        failing,
        checking,
        clock,
        model: Model::new(cfg),
        step: 0,
    };
    h.check(&"a new pool");
    for &op in ops.iter().take(MAX_OPS) {
        h.step += 1;
        h.apply(op);
    }
    h.failing.fail_next(0);
    h.model.fail_next = 0;
    // Every raw block goes back into a `Pooled`.
    for i in 0..h.slots.len() {
        if let Holder::Raw(block, size) = h.slots[i] {
            // SAFETY: `block` came from this pool with `size`; the slot
            // owned it alone and now the `Pooled` does.
            h.slots[i] = Holder::Pooled(unsafe { Pooled::from_raw(&h.handles[0], block, size) });
        }
    }
    let summary = h
        .model
        .summary(h.handles[0].stats(), ops.len().min(MAX_OPS));
    if trim_before_drop {
        h.step += 1;
        let want = h.model.trim();
        assert_eq!(h.handles[0].trim(), want, "final trim");
        h.check(&"final trim");
    }
    // Drop handles and blocks in a seeded order; the pool goes with the last.
    let big_table =
        matches!(h.model.cfg.kind, Kind::FixedCapacity { slots } if slots > FixedCapacity::WINDOW);
    loop {
        let (handles, blocks) = (h.handles.len(), h.slots.len());
        let total = handles + blocks;
        if total == 0 {
            break;
        }
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let mut k = (seed >> 33) as usize % total;
        // With a table larger than its window, the model learns a release's
        // victim from the call log, which the pool's own drop would muddle:
        // the last handle then goes last.
        if big_table && k < handles && handles == 1 && blocks > 0 {
            k = handles + k % blocks;
        }
        h.step += 1;
        let before = h.checking.calls().len();
        if k < handles {
            drop(h.handles.remove(k));
            if total == 1 {
                h.model.drop_pool();
            } else {
                assert_eq!(h.checking.calls().len(), before, "dropping a handle freed");
            }
        } else {
            let i = k - handles;
            let Holder::Pooled(p) = h.slots.remove(i) else {
                unreachable!("every raw block is a Pooled again")
            };
            drop(p);
            let calls = h.checking.calls();
            h.model.release(i, &calls[before..]);
            if total == 1 {
                h.model.drop_pool();
            }
        }
        if total == 1 {
            assert_eq!(
                h.checking.calls(),
                h.model.calls,
                "backing calls after drop"
            );
        } else {
            h.check(&"the end: a drop");
        }
    }
    h.checking.assert_all_freed();
    assert_eq!(h.checking.live(), 0);
    assert_eq!(h.failing.used(), 0);
    summary
}
