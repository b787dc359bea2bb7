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
//! # Injected panics
//!
//! With flag `& 2` in the [`Config`], an [`Op::Inject`] arms one
//! [`Fault`]: the backing `allocate` (which then allocates nothing), the
//! backing `deallocate` (after the block is given back), the clock, or an
//! `EvictionPolicy` hook (the policy runs behind
//! [`PanickingPolicy`]) panics on the n-th such call from then on. The
//! harness catches the panic around the pool operation; the model counts
//! the same calls, so it says which operation must panic and what that
//! leaves, and the usual checks (the whole [`Stats`], the backing call log,
//! `validate()`, which holds `bytes_reserved + pending <= limit`) follow.
//! What the model expects is the pool's documented behaviour under panics:
//! a release's block is cached, or freed (counted trimmed) when the clock
//! panicked; a miss's booking against the limit is dropped; blocks freed on
//! the way count as freed; a policy hook that panics changes nothing; a
//! `SharedPool` handle operation finishes its cache step and offers every
//! block it let go before passing the panic on; dropping the pool offers
//! every block. A fault may stay armed through the final releases, trim and
//! drop of a `pool_ops` run. A panic that is not injected (a failed check,
//! a double free) is never caught. See [`SHARED_ALLOCATE_DEALLOCATE_PANICS`]
//! for the one fault held back.
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
//! - the limit rule, then the out-of-memory retry ladder, on a miss;
//! - the calls the pool makes, for the fault countdowns: one clock read
//!   per operation (timed policies only); `must_evict` for each eviction
//!   check not skipped by the cached deadline (`FixedTime`: the oldest
//!   block's release plus the ttl, reset by every free), `deadline` when it
//!   says no, `on_free` before every free, `on_hit` before a hit takes its
//!   block, `on_release` after a release caches it.
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

pub mod packed;

use core::any::Any;
use core::fmt;
use core::mem::ManuallyDrop;
use core::time::Duration;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Once;

use arbitrary::{Arbitrary, Unstructured};

use crate::clock::ManualClock;
use crate::error::PoolError;
use crate::policy::{Exponential, FixedCapacity, FixedTime, Policy, Reuse};
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;
use crate::shared::{Pooled, SharedPool};
use crate::stats::Stats;
use crate::testing::{
    Call, CheckingAllocator, FailingAllocator, PanicSwitch, PanickingClock, PanickingPolicy,
    PolicySwitches, TestError,
};
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

/// A call the harness can make panic (see [`Op::Inject`]).
///
/// An injected panic is a `String` payload starting with
/// [`PanicSwitch::MESSAGE`]; the harness catches it around the pool
/// operation, checks that the model expected it there, then checks the
/// whole state as after any step. Any other panic is a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The backing `allocate`, before allocating.
    Allocate,
    /// The backing `deallocate`, after freeing (the block is given back).
    Deallocate,
    /// A clock read.
    Clock,
    /// `EvictionPolicy::on_release`.
    OnRelease,
    /// `EvictionPolicy::on_hit`.
    OnHit,
    /// `EvictionPolicy::on_free`.
    OnFree,
    /// `EvictionPolicy::must_evict`.
    MustEvict,
    /// `EvictionPolicy::deadline`.
    Deadline,
}

/// Every [`Fault`], in the order an inject operation's byte picks from.
pub const FAULTS: [Fault; 8] = [
    Fault::Allocate,
    Fault::Deallocate,
    Fault::Clock,
    Fault::OnRelease,
    Fault::OnHit,
    Fault::OnFree,
    Fault::MustEvict,
    Fault::Deadline,
];

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
/// entries (indices into [`SIZES`]); flags (`& 1`: trim before the drop;
/// `& 2`: panic injection, see [`Op::Inject`]); drop-order seed.
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
    /// Panic injection: a fail-next operation whose argument byte is 128
    /// or more arms a [`Fault`] instead.
    pub faults: bool,
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
        let flags = byte(u)?;
        let trim_before_drop = flags & 1 == 1;
        let faults = flags & 2 == 2;
        let drop_seed = byte(u)?;
        Ok(Config {
            kind,
            reuse,
            size_class,
            limit,
            capacity,
            palette,
            trim_before_drop,
            faults,
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
/// calls (with panic injection on and `n >= 128`: inject
/// `FAULTS[(n - 128) % 8]` on the `1 + m % 4`-th call from now, `m` the
/// next byte), `29..=30` collect, `31` trim.
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
    /// Makes the `nth` call of a kind from now panic (and disarms every
    /// other fault).
    Inject {
        /// Which call.
        fault: Fault,
        /// 1 to 4: the next such call, or a later one.
        nth: u8,
    },
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

/// A fail-next operation's argument: fail the next `n % 4` backing calls,
/// or (with panic injection on and `n >= 128`) inject a fault.
fn fail_or_inject(
    u: &mut Unstructured<'_>,
    faults: bool,
) -> arbitrary::Result<Result<u32, (Fault, u8)>> {
    let n = byte(u)?;
    if faults && n >= 128 {
        let fault = FAULTS[usize::from(n - 128) % FAULTS.len()];
        Ok(Err((fault, 1 + byte(u)? % 4)))
    } else {
        Ok(Ok(u32::from(n % 4)))
    }
}

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Op::decode(u, false)
    }
}

impl Op {
    /// Reads one operation; `faults`: panic injection is on.
    fn decode(u: &mut Unstructured<'_>, faults: bool) -> arbitrary::Result<Self> {
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
            27..=28 => match fail_or_inject(u, faults)? {
                Ok(n) => Op::FailNext(n),
                Err((fault, nth)) => Op::Inject { fault, nth },
            },
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

fn ops_to_end<'a, T>(
    u: &mut Unstructured<'a>,
    faults: bool,
    decode: fn(&mut Unstructured<'a>, bool) -> arbitrary::Result<T>,
) -> arbitrary::Result<Vec<T>> {
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < MAX_OPS {
        ops.push(decode(u, faults)?);
    }
    Ok(ops)
}

impl<'a> Arbitrary<'a> for PoolInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let config = Config::arbitrary(u)?;
        let faults = config.faults;
        Ok(PoolInput {
            config,
            ops: ops_to_end(u, faults, Op::decode)?,
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
/// clock (as [`Op`]), `23` fail next or inject (as [`Op`]), `24..=25`
/// collect, `26` trim, `27`
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
    /// As [`Op::Inject`].
    Inject {
        /// Which call.
        fault: Fault,
        /// 1 to 4: the next such call, or a later one.
        nth: u8,
    },
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
        SharedOp::decode(u, false)
    }
}

impl SharedOp {
    /// Reads one operation; `faults`: panic injection is on.
    fn decode(u: &mut Unstructured<'_>, faults: bool) -> arbitrary::Result<Self> {
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
            23 => match fail_or_inject(u, faults)? {
                Ok(n) => SharedOp::FailNext(n),
                Err((fault, nth)) => SharedOp::Inject { fault, nth },
            },
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
        let config = Config::arbitrary(u)?;
        let faults = config.faults;
        Ok(SharedInput {
            config,
            ops: ops_to_end(u, faults, SharedOp::decode)?,
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
    /// Injected panics caught, by [`Fault`] (in [`FAULTS`] order), the
    /// final drop's included.
    pub injected: [u64; 8],
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

/// What the cache step of an `allocate` chose.
enum Chosen {
    /// A cached block, now in use.
    Hit(u64),
    /// A miss of this class, with room made under the limit.
    Miss(usize),
}

#[derive(Clone, Copy, Debug)]
struct Live {
    block: u64,
    size: usize,
    class: usize,
}

type Outcome = Result<u64, PoolError<TestError>>;

/// An injected panic, where the model expects one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Injected;

/// What the model does with an injected panic: `Err(Injected)`.
type Step<T = ()> = Result<T, Injected>;

/// How the pool being checked hands blocks to the backing `deallocate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frees {
    /// At once, as the cache lets each go (`DecayingPool`): a panicking
    /// `deallocate` stops the operation there.
    Immediate,
    /// Collected under the cache lock and offered after the cache step
    /// (`SharedPool`): a panicking `deallocate` stops nothing, every block
    /// is offered, the panic is passed on after.
    Deferred,
}

#[derive(Clone)]
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
    /// Calls left before each fault fires (0: disarmed), as the switches'.
    armed: [u64; 8],
    /// Injected panics fired, by fault.
    injected: [u64; 8],
    /// The timed store's cached deadline (ticks): no eviction check calls
    /// the policy before it.
    not_before: u64,
    frees: Frees,
    /// Blocks let go in a deferred cache step, to offer after it.
    deferred: Vec<(u64, usize)>,
    /// The deallocate switch is disarmed for now (see
    /// [`SHARED_ALLOCATE_DEALLOCATE_PANICS`]): calls do not count down.
    mute_deallocate: bool,
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
            armed: [0; 8],
            injected: [0; 8],
            not_before: 0,
            frees: Frees::Immediate,
            deferred: Vec::new(),
            mute_deallocate: false,
            waste: 0,
        }
    }

    /// Whether the pool reads the clock and has an `EvictionPolicy`.
    fn timed(&self) -> bool {
        !matches!(self.cfg.kind, Kind::FixedCapacity { .. })
    }

    /// Arms `fault` on the `nth` call from now, disarming the others.
    fn inject(&mut self, fault: Fault, nth: u8) {
        self.armed = [0; 8];
        self.armed[fault as usize] = u64::from(nth);
    }

    /// A call through `fault`'s switch: counts it down, `Err` when it fires.
    fn fire(&mut self, fault: Fault) -> Step {
        if fault == Fault::Deallocate && self.mute_deallocate {
            return Ok(());
        }
        let left = &mut self.armed[fault as usize];
        match *left {
            0 => Ok(()),
            1 => {
                *left = 0;
                self.injected[fault as usize] += 1;
                Err(Injected)
            }
            _ => {
                *left -= 1;
                Ok(())
            }
        }
    }

    /// A call of the clock or the policy: only a timed store makes it.
    fn hook(&mut self, fault: Fault) -> Step {
        if self.timed() {
            self.fire(fault)
        } else {
            Ok(())
        }
    }

    /// Offers the blocks a deferred cache step let go, every one even when
    /// a `deallocate` panics.
    fn flush(&mut self) -> Step {
        let mut out = Ok(());
        for (block, size) in core::mem::take(&mut self.deferred) {
            self.calls.push(Call::Deallocate { block, size });
            if self.fire(Fault::Deallocate).is_err() {
                out = Err(Injected);
            }
        }
        out
    }

    /// Whether a `SharedPool` handle's `allocate` of `size` would have a
    /// `deallocate` panic among the blocks its cache step lets go (the
    /// fault [`SHARED_ALLOCATE_DEALLOCATE_PANICS`] holds back).
    fn cache_step_frees_panic(&self, size: usize) -> bool {
        if self.armed[Fault::Deallocate as usize] == 0 {
            return false;
        }
        let mut m = self.clone();
        m.frees = Frees::Deferred;
        let before = m.injected[Fault::Deallocate as usize];
        let _ = (|| {
            m.hook(Fault::Clock)?;
            m.run_policy()?;
            m.choose(size)
        })();
        let _ = m.flush();
        m.injected[Fault::Deallocate as usize] > before
    }

    /// A cache step of a `SharedPool` handle operation: `f`, then the
    /// blocks it let go are offered; the first panic is passed on.
    fn section<T>(&mut self, f: impl FnOnce(&mut Self) -> Step<T>) -> Step<T> {
        let out = f(self);
        let flushed = self.flush();
        let out = out?;
        flushed.map(|()| out)
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

    /// The cache lets a block go: deallocated at once (a panic there stops
    /// the operation), or collected for the end of the cache step.
    fn deallocate(&mut self, block: u64, size: usize) -> Step {
        match self.frees {
            Frees::Immediate => {
                self.calls.push(Call::Deallocate { block, size });
                self.fire(Fault::Deallocate)
            }
            Frees::Deferred => {
                self.deferred.push((block, size));
                Ok(())
            }
        }
    }

    /// The backing `allocate`: `Err` when it panics.
    fn backing(&mut self, class: usize) -> Step<Result<u64, TestError>> {
        self.fire(Fault::Allocate)?;
        Ok(self.backing_call(class))
    }

    fn backing_call(&mut self, class: usize) -> Result<u64, TestError> {
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

    /// Debug builds: a collection first holds the policy's deadline for
    /// the oldest block against `must_evict` while the cached deadline
    /// lies ahead (a `deadline` call, then a `must_evict` call when that
    /// deadline is still ahead of the clock).
    fn check_deadline(&mut self) -> Step {
        if !cfg!(debug_assertions) || !self.timed() || self.now >= self.not_before {
            return Ok(());
        }
        let Some(oldest) = self.idle.first().copied() else {
            return Ok(());
        };
        self.fire(Fault::Deadline)?;
        if let Kind::FixedTime { ttl } = self.cfg.kind {
            if oldest.released.saturating_add(ttl) > self.now {
                self.fire(Fault::MustEvict)?;
            }
        }
        Ok(())
    }

    fn run_policy(&mut self) -> Step<usize> {
        let mut freed = 0;
        if !self.timed() {
            return Ok(0);
        }
        while let Some(oldest) = self.idle.first().copied() {
            if self.now < self.not_before {
                break;
            }
            self.fire(Fault::MustEvict)?;
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
                self.fire(Fault::Deadline)?;
                self.not_before = match self.cfg.kind {
                    Kind::FixedTime { ttl } => oldest.released + ttl,
                    _ => 0,
                };
                break;
            }
            // The policy is told first: a panic there leaves the block.
            self.fire(Fault::OnFree)?;
            self.idle.remove(0);
            self.evictions += 1;
            self.not_before = 0;
            freed += 1;
            if self.idle.is_empty() && self.rebase().is_some() {
                self.allowance = 0.0;
            }
            self.deallocate(oldest.block, oldest.class)?;
        }
        Ok(freed)
    }

    fn free_oldest(&mut self) -> Step<Option<usize>> {
        let Some(oldest) = self.idle.first().copied() else {
            return Ok(None);
        };
        self.hook(Fault::OnFree)?;
        self.idle.remove(0);
        self.trimmed += 1;
        self.not_before = 0;
        if self.rebase().is_some() {
            self.allowance = self.allowance.min(self.bytes_cached() as f64);
        }
        self.deallocate(oldest.block, oldest.class)?;
        Ok(Some(oldest.class))
    }

    /// `DecayingPool::allocate` (and through `SharedPool::with`).
    fn allocate(&mut self, size: usize) -> Step<Outcome> {
        let out = (|| {
            self.hook(Fault::Clock)?;
            self.run_policy()?;
            match self.choose(size)? {
                Ok(Chosen::Hit(block)) => Ok(Ok(block)),
                Ok(Chosen::Miss(class)) => self.miss(size, class),
                Err(e) => Ok(Err(e)),
            }
        })();
        self.update_peaks();
        out
    }

    /// `SharedPool::allocate`: the cache step (policy, hit or limit and
    /// booking) under the lock, its frees offered after it, then the
    /// backing calls.
    fn shared_allocate(&mut self, size: usize) -> Step<Outcome> {
        let out = (|| {
            let chosen = (|| {
                self.hook(Fault::Clock)?;
                self.run_policy()?;
                self.choose(size)
            })();
            let flushed = self.flush();
            let chosen = match (chosen, flushed) {
                (Err(Injected), _) => return Err(Injected),
                (Ok(chosen), Ok(())) => chosen,
                (Ok(Ok(Chosen::Hit(_))), Err(Injected)) => {
                    // The hit's block goes back into the cache.
                    let block = self.live.pop().expect("the hit's block");
                    let _ = self.section(|m| m.put(block, &[]));
                    return Err(Injected);
                }
                // A miss's booking is dropped.
                (Ok(_), Err(Injected)) => return Err(Injected),
            };
            match chosen {
                Ok(Chosen::Hit(block)) => Ok(Ok(block)),
                Ok(Chosen::Miss(class)) => self.miss(size, class),
                Err(e) => Ok(Err(e)),
            }
        })();
        self.update_peaks();
        out
    }

    /// A hit, or a miss with room made under the limit.
    fn choose(&mut self, size: usize) -> Step<Result<Chosen, PoolError<TestError>>> {
        let Some(class) = self.class(size) else {
            return Ok(Err(if size == 0 {
                PoolError::ZeroSize
            } else {
                PoolError::TooLarge { requested: size }
            }));
        };
        let same = |b: &Idle| b.class == class;
        let found = match self.cfg.reuse {
            Reuse::Lifo => self.idle.iter().rposition(same),
            Reuse::Fifo => self.idle.iter().position(same),
        };
        if let Some(i) = found {
            // Told first: a panic leaves the block cached.
            self.hook(Fault::OnHit)?;
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
            return Ok(Ok(Chosen::Hit(hit.block)));
        }
        let reserved = self.reserved();
        if reserved.checked_add(class).is_none() {
            return Ok(Err(PoolError::TooLarge { requested: size }));
        }
        if let Some(limit) = self.cfg.limit {
            if self.bytes_in_use() + class > limit {
                return Ok(Err(PoolError::LimitExceeded {
                    requested: size,
                    limit,
                    reserved,
                }));
            }
            while self.reserved() + class > limit && self.free_oldest()?.is_some() {}
        }
        Ok(Ok(Chosen::Miss(class)))
    }

    /// The backing calls of a miss and the out-of-memory ladder; in a
    /// `SharedPool` each rung's frees are a cache step of their own.
    fn miss(&mut self, size: usize, class: usize) -> Step<Outcome> {
        let deferred = self.frees == Frees::Deferred;
        let rung = |m: &mut Self, f: fn(&mut Self, usize) -> Step| {
            if deferred {
                m.section(|m| f(m, class))
            } else {
                f(m, class)
            }
        };
        let mut result = self.backing(class)?;
        if result.is_err() && !self.idle.is_empty() {
            self.retries += 1;
            rung(self, |m, class| {
                let mut freed = 0;
                while freed < class {
                    match m.free_oldest()? {
                        Some(c) => freed += c,
                        None => break,
                    }
                }
                Ok(())
            })?;
            result = self.backing(class)?;
            if result.is_err() && !self.idle.is_empty() {
                self.second_rung += 1;
                rung(self, |m, _| {
                    while m.free_oldest()?.is_some() {}
                    Ok(())
                })?;
                result = self.backing(class)?;
            }
        }
        let block = match result {
            Ok(block) => block,
            Err(e) => return Ok(Err(PoolError::Backing(e))),
        };
        self.misses += 1;
        self.from_backing = self.from_backing.saturating_add(class);
        self.waste = self.waste.saturating_add(class - size);
        self.live.push(Live { block, size, class });
        Ok(Ok(block))
    }

    /// Releases `self.live[i]`; `observed` is what the pool called on the
    /// backing allocator during the release. The block is never lost: when
    /// the clock panics it is freed (counted trimmed), when the policy run
    /// before it panics it is cached all the same; then the panic goes on.
    fn release(&mut self, i: usize, observed: &[Call]) -> Step {
        let block = self.live.remove(i);
        let out = match self.frees {
            Frees::Immediate => self.release_block(block, observed),
            Frees::Deferred => self.section(|m| m.release_block(block, observed)),
        };
        self.update_peaks();
        out
    }

    fn release_block(&mut self, block: Live, observed: &[Call]) -> Step {
        if self.hook(Fault::Clock).is_err() {
            // No time to cache it at: given back (a second panic there is
            // discarded).
            self.trimmed += 1;
            let _ = self.deallocate(block.block, block.class);
            return Err(Injected);
        }
        if self.run_policy().is_err() {
            // Cached at the time read (a second panic there is discarded).
            let _ = self.put(block, observed);
            return Err(Injected);
        }
        self.put(block, observed)
    }

    /// Caches a released block at `now`.
    fn put(&mut self, block: Live, observed: &[Call]) -> Step {
        let idle = Idle {
            block: block.block,
            class: block.class,
            released: self.now,
        };
        match self.cfg.kind {
            Kind::FixedTime { .. } | Kind::Exponential { .. } => {
                // The policy is told last: a panic there leaves it cached.
                self.idle.push(idle);
                self.fire(Fault::OnRelease)?;
                if self.rebase().is_some() && self.cfg.kind != (Kind::Exponential { half_life: 0 })
                {
                    self.allowance += block.class as f64;
                }
                Ok(())
            }
            Kind::FixedCapacity { slots: 0 } => {
                self.evictions += 1;
                self.deallocate(block.block, block.class)
            }
            Kind::FixedCapacity { slots } => {
                let victim = self.fixed_victim(slots, block.class, observed);
                let victim = victim.map(|v| self.idle.remove(v));
                self.idle.push(idle);
                if let Some(v) = victim {
                    self.evictions += 1;
                    self.deallocate(v.block, v.class)?;
                }
                Ok(())
            }
        }
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

    fn collect(&mut self) -> Step<usize> {
        let step = |m: &mut Self| {
            m.hook(Fault::Clock)?;
            m.check_deadline()?;
            m.run_policy()
        };
        match self.frees {
            Frees::Immediate => step(self),
            Frees::Deferred => self.section(step),
        }
    }

    fn trim(&mut self) -> Step<usize> {
        let step = |m: &mut Self| {
            m.hook(Fault::Clock)?;
            let mut bytes = 0;
            while let Some(class) = m.free_oldest()? {
                bytes += class;
            }
            Ok(bytes)
        };
        match self.frees {
            Frees::Immediate => step(self),
            Frees::Deferred => self.section(step),
        }
    }

    /// Dropping the pool: every cached block is offered to `deallocate`
    /// even when it, the clock or the policy panics (once the clock or the
    /// policy has panicked, the rest go without telling the policy).
    /// `Err` when a panic is passed on.
    fn drop_pool(&mut self) -> Step {
        self.frees = Frees::Immediate;
        let mut out = Ok(());
        let mut told = self.hook(Fault::Clock).is_ok();
        if !told {
            out = Err(Injected);
        }
        while let Some(oldest) = self.idle.first().copied() {
            if told && self.hook(Fault::OnFree).is_err() {
                told = false;
                out = Err(Injected);
            }
            self.idle.remove(0);
            self.trimmed += 1;
            if told && self.rebase().is_some() {
                self.allowance = self.allowance.min(self.bytes_cached() as f64);
            }
            if self.deallocate(oldest.block, oldest.class).is_err() {
                out = Err(Injected);
            }
        }
        out
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
            injected: self.injected,
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

/// The failing and checking allocators under every run.
type Backing = FailingAllocator<CheckingAllocator>;

/// The backing allocator as the pool sees it: [`Backing`] behind two
/// panic switches. `allocate` panics before allocating; `deallocate`
/// panics after the block is given back, so the checking allocator's log
/// shows every block the pool offered, exactly once.
#[derive(Clone, Debug)]
struct Injecting {
    inner: Backing,
    on_allocate: PanicSwitch,
    on_deallocate: PanicSwitch,
}

impl RawAllocator for Injecting {
    type Block = u64;
    type Error = TestError;

    fn allocate(&mut self, size: usize) -> Result<u64, TestError> {
        self.on_allocate.hit();
        self.inner.allocate(size)
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.inner.deallocate(block, size) };
        self.on_deallocate.hit();
    }
}

/// The clock of every run: a `ManualClock` whose reads can panic.
type Clock = PanickingClock<ManualClock>;

/// Every panic switch of a run.
#[derive(Clone, Debug)]
struct Switches {
    allocate: PanicSwitch,
    deallocate: PanicSwitch,
    clock: PanicSwitch,
    /// Never hit under `FixedCapacity` (no `EvictionPolicy`).
    policy: PolicySwitches,
}

impl Switches {
    fn get(&self, fault: Fault) -> &PanicSwitch {
        match fault {
            Fault::Allocate => &self.allocate,
            Fault::Deallocate => &self.deallocate,
            Fault::Clock => &self.clock,
            Fault::OnRelease => &self.policy.on_release,
            Fault::OnHit => &self.policy.on_hit,
            Fault::OnFree => &self.policy.on_free,
            Fault::MustEvict => &self.policy.must_evict,
            Fault::Deadline => &self.policy.deadline,
        }
    }

    /// Arms `fault` on the `nth` call from now; disarms the others.
    fn inject(&self, fault: Fault, nth: u8) {
        for f in FAULTS {
            self.get(f).panic_on(0);
        }
        self.get(fault).panic_on(u64::from(nth));
    }

    fn disarm(&self) {
        for f in FAULTS {
            self.get(f).panic_on(0);
        }
    }
}

/// Whether a panic payload is one a [`PanicSwitch`] injected.
fn is_injected(payload: &(dyn Any + Send)) -> bool {
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied());
    message.is_some_and(|m| m.starts_with(PanicSwitch::MESSAGE))
}

/// Runs `f`, catching an injected panic as `Err(Injected)`; any other
/// panic (a failed check, a double free) goes on.
fn catching<T>(f: impl FnOnce() -> T) -> Step<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(t) => Ok(t),
        Err(panic) if is_injected(&*panic) => Err(Injected),
        Err(panic) => resume_unwind(panic),
    }
}

/// Installs, once, a panic hook that keeps quiet about injected panics
/// and passes every other panic to the hook before it (libFuzzer's aborts
/// on any panic, caught or not).
fn quiet_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !is_injected(info.payload()) {
                previous(info);
            }
        }));
    });
}

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

/// A run's allocators, clock and switches.
struct Parts {
    checking: CheckingAllocator,
    failing: Backing,
    backing: Injecting,
    clock: Clock,
    switches: Switches,
}

fn new_parts(cfg: &Config, policy: PolicySwitches) -> Parts {
    let checking = CheckingAllocator::new();
    let failing = FailingAllocator::new(checking.clone());
    failing.set_capacity(cfg.capacity);
    let clock = PanickingClock::new(ManualClock::new());
    let switches = Switches {
        allocate: PanicSwitch::new(),
        deallocate: PanicSwitch::new(),
        clock: clock.switch().clone(),
        policy,
    };
    let backing = Injecting {
        inner: failing.clone(),
        on_allocate: switches.allocate.clone(),
        on_deallocate: switches.deallocate.clone(),
    };
    Parts {
        checking,
        failing,
        backing,
        clock,
        switches,
    }
}

fn build<P: Policy>(policy: P, cfg: &Config, parts: &Parts) -> DecayingPool<Injecting, P, Clock> {
    let mut builder = DecayingPool::builder(parts.backing.clone())
        .policy(policy)
        .clock(parts.clock.clone())
        .size_class(cfg.size_class)
        .reuse(cfg.reuse)
        // `validate` then checks the statistics by class against the totals.
        .class_stats(true);
    if let Some(limit) = cfg.limit {
        builder = builder.limit(limit);
    }
    builder.build()
}

/// Calls `run` with the policy `kind` describes (behind panic switches,
/// for an `EvictionPolicy`) and its switches.
macro_rules! with_policy {
    ($kind:expr, $run:ident($($arg:expr),*)) => {
        match $kind {
            Kind::FixedTime { ttl } => {
                let p = PanickingPolicy::new(FixedTime::new(ticks(ttl)));
                let switches = p.switches();
                $run(p, switches, $($arg),*)
            }
            Kind::Exponential { half_life } => {
                let p = PanickingPolicy::new(Exponential::half_life(ticks(half_life)));
                let switches = p.switches();
                $run(p, switches, $($arg),*)
            }
            Kind::FixedCapacity { slots } => {
                $run(FixedCapacity::new(slots), PolicySwitches::default(), $($arg),*)
            }
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
/// step. An injected panic is caught around the operation it interrupts;
/// the model says where it must happen and what state it leaves.
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn run_pool(input: &PoolInput) -> Summary {
    quiet_injected_panics();
    let cfg = input.config.clone();
    with_policy!(cfg.kind, run_pool_with(cfg, &input.ops))
}

struct PoolHarness<P: Policy> {
    /// Never dropped on a failed check: dropping a pool whose state is off
    /// could panic again while unwinding and abort.
    pool: ManuallyDrop<DecayingPool<Injecting, P, Clock>>,
    parts: Parts,
    model: Model,
    step: usize,
}

impl<P: Policy> PoolHarness<P> {
    fn check(&mut self, what: &dyn fmt::Debug) {
        let stats = self.pool.stats();
        check_common(
            stats,
            &self.model,
            &self.parts.checking,
            &self.parts.failing,
            what,
            self.step,
        );
        self.pool.validate();
    }

    /// Allocates; returns whether it panicked.
    fn allocate(&mut self, size: usize) -> bool {
        assert_eq!(
            self.pool.class_size(size),
            self.model.class(size),
            "class of {size}"
        );
        // Every other step goes through the pool's `RawAllocator` face.
        let pool = &mut *self.pool;
        let got = catching(|| {
            if self.step % 2 == 0 {
                pool.allocate(size)
            } else {
                RawAllocator::allocate(pool, size)
            }
        });
        let want = self.model.allocate(size);
        assert_eq!(got, want, "allocate({size}) at step {}", self.step);
        self.check(&format_args!(
            "allocate({size}), panicked: {}",
            got.is_err()
        ));
        got.is_err()
    }

    /// Releases the i-th live block; returns its size and whether the
    /// release panicked.
    fn release(&mut self, i: usize) -> (usize, bool) {
        let Live { block, size, .. } = self.model.live[i];
        let before = self.model.calls.len();
        let pool = &mut *self.pool;
        let step = self.step;
        let got = catching(|| {
            // SAFETY: `block` came from `pool.allocate(size)` (the model
            // predicted it and the pool returned it), is live and is not
            // used again: a release that panics still takes it.
            unsafe {
                if step % 2 == 0 {
                    pool.release(block, size);
                } else {
                    RawAllocator::deallocate(pool, block, size);
                }
            }
        });
        let calls = self.parts.checking.calls();
        let want = self.model.release(i, &calls[before.min(calls.len())..]);
        assert_eq!(got, want, "release(block {block}, {size}) at step {step}");
        self.check(&format_args!(
            "release(block {block}, {size}), panicked: {}",
            got.is_err()
        ));
        (size, got.is_err())
    }

    fn apply(&mut self, op: Op) {
        let live = self.model.live.len();
        match op {
            Op::Allocate(Size::Palette(i)) => {
                self.allocate(pick(&self.model.cfg.palette, i));
            }
            Op::Allocate(Size::Zero) => {
                self.allocate(0);
            }
            Op::Allocate(Size::Huge(k)) => {
                self.allocate(pick(&HUGE, k));
            }
            Op::Release(i) if live > 0 => {
                self.release(usize::from(i) % live);
            }
            Op::ReleaseAllocate(i) if live > 0 => {
                let (size, released_panicked) = self.release(usize::from(i) % live);
                let cached = self.model.idle.last().map(|b| b.block);
                let panicked = self.allocate(size);
                let tail = self.model.live.last().map(|b| b.block);
                if self.model.reuses_at_once() && !released_panicked && !panicked {
                    assert!(cached.is_some() && tail == cached, "release then allocate");
                }
            }
            Op::Release(_) | Op::ReleaseAllocate(_) => {}
            Op::Advance { quarters, jitter } => {
                let dt = self.model.advance(quarters, jitter);
                self.parts.clock.inner().advance(ticks(dt));
                self.check(&op);
            }
            Op::FailNext(n) => {
                self.parts.failing.fail_next(n);
                self.model.fail_next = n;
                self.check(&op);
            }
            Op::Inject { fault, nth } => {
                self.parts.switches.inject(fault, nth);
                self.model.inject(fault, nth);
                self.check(&op);
            }
            Op::Collect => {
                let pool = &mut *self.pool;
                let got = catching(|| pool.collect());
                let want = self.model.collect();
                assert_eq!(got, want, "collect at step {}", self.step);
                self.check(&op);
            }
            Op::Trim => {
                let pool = &mut *self.pool;
                let got = catching(|| pool.trim());
                let want = self.model.trim();
                assert_eq!(got, want, "trim at step {}", self.step);
                self.check(&op);
            }
        }
    }
}

fn run_pool_with<P: Policy>(
    policy: P,
    policy_switches: PolicySwitches,
    cfg: Config,
    ops: &[Op],
) -> Summary {
    let parts = new_parts(&cfg, policy_switches);
    let pool = build(policy, &cfg, &parts);
    let trim_before_drop = cfg.trim_before_drop;
    let mut h = PoolHarness {
        pool: ManuallyDrop::new(pool),
        parts,
        model: Model::new(cfg),
        step: 0,
    };
    h.check(&"a new pool");
    for &op in ops.iter().take(MAX_OPS) {
        h.step += 1;
        h.apply(op);
    }
    // Give everything back, then trim (or not) and drop; an armed fault
    // stays armed, so the last releases, the trim and the drop may panic.
    h.parts.failing.fail_next(0);
    h.model.fail_next = 0;
    while !h.model.live.is_empty() {
        h.step += 1;
        h.release(0);
    }
    let mut summary = h.model.summary(h.pool.stats(), ops.len().min(MAX_OPS));
    if trim_before_drop {
        h.step += 1;
        let want = h.model.trim();
        let pool = &mut *h.pool;
        let got = catching(|| pool.trim());
        assert_eq!(got, want, "final trim");
        h.check(&"final trim");
        if got.is_ok() {
            assert_eq!(h.pool.stats().bytes_reserved, 0);
        }
    }
    let PoolHarness {
        pool,
        parts,
        mut model,
        ..
    } = h;
    let got = catching(move || drop(ManuallyDrop::into_inner(pool)));
    let want = model.drop_pool();
    assert_eq!(got, want, "drop");
    assert_eq!(
        parts.checking.calls(),
        model.calls,
        "backing calls after drop"
    );
    parts.checking.assert_all_freed();
    assert_eq!(parts.checking.live(), 0);
    assert_eq!(parts.failing.used(), 0);
    summary.injected = model.injected;
    summary
}

// --- shared_ops ---------------------------------------------------------------

/// Whether `shared_ops` lets a backing `deallocate` panic on a block that
/// the cache step of [`SharedPool::allocate`] let go (expired blocks, room
/// made under the limit: a `SharedPool` hands them to `deallocate` after
/// that step, outside the cache lock). On: the model expects what the pool
/// does, the hit's block goes back into the cache (a release at the same
/// time, the policy told), nothing stays booked against the limit, and the
/// panic is passed on (`tests/it/shared.rs`,
/// `a_deallocate_panic_inside_allocate_loses_no_block_and_no_booking`).
/// Off: when the model predicts that panic, the harness disarms the
/// deallocate switch for that `allocate` (the countdown resumes after it);
/// a switch kept to isolate a regression there.
pub const SHARED_ALLOCATE_DEALLOCATE_PANICS: bool = true;

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
/// checking every step (injected panics as in [`run_pool`]); then drops
/// the handles and blocks in an order the input chooses and checks that
/// the pool is dropped (every block freed) exactly when the last of them
/// goes.
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn run_shared(input: &SharedInput) -> Summary {
    quiet_injected_panics();
    let cfg = input.config.clone();
    with_policy!(cfg.kind, run_shared_with(cfg, &input.ops))
}

type Shared<P> = SharedPool<Injecting, P, Clock>;

/// A live block of a `shared_ops` run.
enum Holder<P: Policy> {
    Pooled(Pooled<Injecting, P, Clock>),
    /// Taken out with `into_raw` or allocated through `with`.
    Raw(u64, usize),
}

struct SharedHarness<P: Policy> {
    /// The handles; the first stays until the end.
    handles: Vec<Shared<P>>,
    /// The live blocks, in the model's `live` order.
    slots: Vec<Holder<P>>,
    parts: Parts,
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
            &self.parts.checking,
            &self.parts.failing,
            what,
            self.step,
        );
        pool.with(|p| {
            assert_eq!(p.stats(), stats, "stats through `with`");
            p.validate();
        });
        assert_eq!(self.slots.len(), self.model.live.len(), "live blocks");
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

    /// Allocates through `pool` (a handle's `allocate`, or a raw one
    /// through `with`); returns whether it panicked.
    fn allocate(&mut self, pool: Shared<P>, size: usize, raw: bool) -> bool {
        let mute =
            !raw && !SHARED_ALLOCATE_DEALLOCATE_PANICS && self.model.cache_step_frees_panic(size);
        if mute {
            self.parts.switches.deallocate.panic_on(0);
        }
        let got = catching(|| {
            if raw {
                pool.with(|p| p.allocate(size))
                    .map(|b| Holder::Raw(b, size))
            } else {
                pool.allocate(size).map(Holder::Pooled)
            }
        });
        let want = if raw {
            self.model.frees = Frees::Immediate;
            self.model.allocate(size)
        } else {
            self.model.frees = Frees::Deferred;
            self.model.mute_deallocate = mute;
            let want = self.model.shared_allocate(size);
            self.model.mute_deallocate = false;
            want
        };
        if mute {
            let left = self.model.armed[Fault::Deallocate as usize];
            self.parts.switches.deallocate.panic_on(left);
        }
        let panicked = got.is_err();
        match (got, want) {
            (Ok(Ok(holder)), Ok(Ok(block))) => {
                if let Holder::Pooled(p) = &holder {
                    assert_eq!(**p, block, "allocate({size}) at step {}", self.step);
                    assert_eq!(p.size(), size);
                    assert!(p.pool().ptr_eq(&pool));
                }
                self.slots.push(holder);
            }
            (Ok(Err(got)), Ok(Err(want))) => {
                assert_eq!(got, want, "allocate({size}) at step {}", self.step);
            }
            (Err(Injected), Err(Injected)) => {}
            (got, want) => panic!(
                "allocate({size}) at step {}: got {:?}, want {want:?}",
                self.step,
                got.map(|r| r.map(|h| match h {
                    Holder::Pooled(p) => *p,
                    Holder::Raw(b, _) => b,
                }))
            ),
        }
        drop(pool);
        self.check(&format_args!(
            "allocate({size}), raw: {raw}, panicked: {panicked}"
        ));
        panicked
    }

    /// Gives back the i-th live block; returns its size and whether that
    /// panicked.
    fn release(&mut self, i: usize, how: u8) -> (usize, bool) {
        let before = self.parts.checking.calls().len();
        let (size, got) = match self.slots.remove(i) {
            Holder::Pooled(p) => {
                self.model.frees = Frees::Deferred;
                let size = p.size();
                (size, catching(move || drop(p)))
            }
            Holder::Raw(block, size) => {
                let pool = self.handle().expect("a handle").clone();
                let got = if how % 2 == 0 {
                    self.model.frees = Frees::Deferred;
                    // SAFETY: `block` came from this pool with `size`
                    // (through `into_raw` or a raw `allocate`), and is
                    // given back once.
                    catching(|| drop(unsafe { Pooled::from_raw(&pool, block, size) }))
                } else {
                    self.model.frees = Frees::Immediate;
                    // SAFETY: as above.
                    catching(|| pool.with(|p| unsafe { p.release(block, size) }))
                };
                (size, got)
            }
        };
        let calls = self.parts.checking.calls();
        let want = self.model.release(i, &calls[before.min(calls.len())..]);
        assert_eq!(
            got, want,
            "release #{i} ({size} bytes) at step {}",
            self.step
        );
        self.check(&format_args!(
            "release #{i} ({size} bytes), panicked: {}",
            got.is_err()
        ));
        (size, got.is_err())
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
                let (size, released_panicked) = self.release(usize::from(i) % live, 0);
                let cached = self.model.idle.last().map(|b| b.block);
                let pool = self.handles[0].clone();
                let panicked = self.allocate(pool, size, false);
                let tail = self.model.live.last().map(|b| b.block);
                if self.model.reuses_at_once() && !released_panicked && !panicked {
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
                self.parts.clock.inner().advance(ticks(dt));
                self.check(&op);
            }
            SharedOp::FailNext(n) => {
                self.parts.failing.fail_next(n);
                self.model.fail_next = n;
                self.check(&op);
            }
            SharedOp::Inject { fault, nth } => {
                self.parts.switches.inject(fault, nth);
                self.model.inject(fault, nth);
                self.check(&op);
            }
            SharedOp::Collect => {
                let pool = &self.handles[0];
                let got = catching(|| pool.collect());
                self.model.frees = Frees::Deferred;
                let want = self.model.collect();
                assert_eq!(got, want, "collect at step {}", self.step);
                self.check(&op);
            }
            SharedOp::Trim => {
                let pool = &self.handles[0];
                let got = catching(|| pool.trim());
                self.model.frees = Frees::Deferred;
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

fn run_shared_with<P: Policy>(
    policy: P,
    policy_switches: PolicySwitches,
    cfg: Config,
    ops: &[SharedOp],
) -> Summary {
    let parts = new_parts(&cfg, policy_switches);
    let pool = SharedPool::new(build(policy, &cfg, &parts));
    let (trim_before_drop, mut seed) = (cfg.trim_before_drop, u64::from(cfg.drop_seed));
    let mut h = SharedHarness {
        handles: vec![pool],
        slots: Vec::new(),
        parts,
        model: Model::new(cfg),
        step: 0,
    };
    h.check(&"a new pool");
    for &op in ops.iter().take(MAX_OPS) {
        h.step += 1;
        h.apply(op);
    }
    // The end runs without injected panics (the pool's drop under panics is
    // `pool_ops`'s, the same code).
    h.parts.failing.fail_next(0);
    h.model.fail_next = 0;
    h.parts.switches.disarm();
    h.model.armed = [0; 8];
    h.model.frees = Frees::Deferred;
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
        let want = h.model.trim().expect("nothing is armed");
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
        let before = h.parts.checking.calls().len();
        if k < handles {
            drop(h.handles.remove(k));
            if total == 1 {
                h.model.drop_pool().expect("nothing is armed");
            } else {
                assert_eq!(
                    h.parts.checking.calls().len(),
                    before,
                    "dropping a handle freed"
                );
            }
        } else {
            let i = k - handles;
            let Holder::Pooled(p) = h.slots.remove(i) else {
                unreachable!("every raw block is a Pooled again")
            };
            drop(p);
            let calls = h.parts.checking.calls();
            h.model
                .release(i, &calls[before..])
                .expect("nothing is armed");
            if total == 1 {
                h.model.drop_pool().expect("nothing is armed");
            }
        }
        if total == 1 {
            assert_eq!(
                h.parts.checking.calls(),
                h.model.calls,
                "backing calls after drop"
            );
        } else {
            h.check(&"the end: a drop");
        }
    }
    h.parts.checking.assert_all_freed();
    assert_eq!(h.parts.checking.live(), 0);
    assert_eq!(h.parts.failing.used(), 0);
    summary
}
