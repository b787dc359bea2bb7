//! The input layout: the tables, [`Config`], [`Op`] and [`SharedOp`],
//! parsed from bytes.

use core::time::Duration;

use arbitrary::{Arbitrary, Unstructured};

use crate::SizeClass;
use crate::policy::Reuse;

/// One tick of the harness clock: 1/512 s, so every time is an exact
/// binary fraction of a second and `Duration::as_secs_f64` is exact.
pub const TICK_NS: u64 = 1_953_125;

/// Operations run per input at most (the rest of a longer input is
/// ignored), so each execution stays fast.
pub const MAX_OPS: usize = 1024;

pub(super) fn ticks(n: u64) -> Duration {
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

/// `FixedCapacity` slot counts (some above
/// [`FixedCapacity::WINDOW`](crate::FixedCapacity::WINDOW)).
pub const SLOTS: [usize; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 64, 3];

/// Thread caches' magazine sizes at first, in blocks (flags bits 3 and 4
/// of a [`Config`]): the pool's own, and smaller ones, which the few
/// blocks of a run fill, and which then grow (to eight times as many at
/// most) or whose thread passes them by.
pub const MAGAZINES: [usize; 4] = [64, 1, 2, 8];

/// Limit choices (byte 5 of a [`Config`], when `>= 128`).
pub const LIMITS: [usize; 8] = [0, 1, 100, 1000, 4096, 10_000, 50_000, 2000];

/// Backing capacity choices (byte 6 of a [`Config`], when `>= 128`).
pub const CAPACITIES: [usize; 8] = [0, 64, 1000, 5000, 20_000, 100_000, 2500, 8192];

/// `SizeClass::Multiple` parameters.
pub const MULTIPLES: [usize; 8] = [0, 1, 2, 3, 8, 100, 256, 1000];

/// `SizeClass::PowerOfTwoDivisions` parameters.
pub const DIVISIONS: [u32; 9] = [0, 1, 2, 3, 4, 5, 7, 8, 16];

/// A call the harness can make panic (see [`Common::Inject`]).
///
/// An injected panic is a `String` payload starting with
/// [`PanicSwitch::MESSAGE`](crate::testing::PanicSwitch::MESSAGE); the
/// harness catches it around the pool operation, checks that the model
/// expected it there, then checks the whole state as after any step. Any
/// other panic is a failure.
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
    /// `Exponential::new(half_life ticks)`.
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
/// `& 2`: panic injection, see [`Common::Inject`]; `& 4`: thread caches,
/// for a `shared_ops` run with `FixedTime`; `>> 3 & 3`: their magazines'
/// size, an index into [`MAGAZINES`]); drop-order seed.
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
    /// A `shared_ops` run with a `FixedTime` policy drives a pool from
    /// [`SharedPool::with_thread_caches`](crate::SharedPool::with_thread_caches)
    /// (flag `& 4`; ignored elsewhere).
    pub thread_caches: bool,
    /// The most blocks each of its magazines holds (flags `>> 3 & 3`, an
    /// index into [`MAGAZINES`]).
    pub magazine: usize,
}

fn byte(u: &mut Unstructured<'_>) -> arbitrary::Result<u8> {
    u8::arbitrary(u)
}

pub(super) fn pick<T: Copy>(table: &[T], b: u8) -> T {
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
        let thread_caches = flags & 4 == 4;
        let magazine = pick(&MAGAZINES, flags >> 3 & 3);
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
            thread_caches,
            magazine,
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

impl Size {
    /// The bytes requested, with `palette` the configuration's sizes.
    pub(super) fn bytes(self, palette: &[usize]) -> usize {
        match self {
            Size::Palette(i) => pick(palette, i),
            Size::Zero => 0,
            Size::Huge(k) => pick(&HUGE, k),
        }
    }
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
    /// A step on the harness rather than on the pool.
    Common(Common),
    /// `collect`.
    Collect,
    /// `trim`.
    Trim,
}

/// The steps both harnesses take on their clock, backing allocator and
/// panic switches rather than on the pool ([`Op::Common`],
/// [`SharedOp::Common`]), read the same way by both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Common {
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
}

impl Common {
    /// An advance's arguments: quarters (`% 17`), jitter (`% 3 - 1`).
    fn advance(u: &mut Unstructured<'_>) -> arbitrary::Result<Self> {
        let quarters = byte(u)? % 17;
        // 0, 1 or 2, minus one: fits.
        let jitter = (byte(u)? % 3) as i8 - 1;
        Ok(Common::Advance { quarters, jitter })
    }

    /// A fail-next operation's argument: fail the next `n % 4` backing
    /// calls, or (with panic injection on and `n >= 128`) inject
    /// `FAULTS[(n - 128) % 8]` on the `1 + m % 4`-th call from now, `m` the
    /// next byte.
    fn fail_or_inject(u: &mut Unstructured<'_>, faults: bool) -> arbitrary::Result<Self> {
        let n = byte(u)?;
        Ok(if faults && n >= 128 {
            let fault = FAULTS[usize::from(n - 128) % FAULTS.len()];
            Common::Inject {
                fault,
                nth: 1 + byte(u)? % 4,
            }
        } else {
            Common::FailNext(u32::from(n % 4))
        })
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
            22..=26 => Op::Common(Common::advance(u)?),
            27..=28 => Op::Common(Common::fail_or_inject(u, faults)?),
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

/// A `shared_ops` operation on a [`SharedPool`](crate::SharedPool).
///
/// Layout: a tag byte, `% 32`, then its arguments, one byte each:
/// `0..=8` allocate a [`Pooled`](crate::Pooled) (handle index, palette index), `9`
/// allocate zero bytes (`0`) or a huge size (index `- 1`), `10..=14` give
/// back the i-th live block (index, how), `15..=16` [`Pooled::into_raw`](crate::Pooled::into_raw)
/// (index), `17` [`Pooled::from_raw`](crate::Pooled::from_raw) (index), `18` a raw `allocate`
/// through [`SharedPool::with`](crate::SharedPool::with) (palette index), `19` release the i-th
/// live block then allocate its size again (index), `20..=22` advance the
/// clock (as [`Op`]), `23` fail next or inject (as [`Op`]), `24..=25`
/// collect, `26` trim, `27`
/// clone a handle, `28` drop an extra handle (index), `29..=31` allocate
/// through a block's own [`Pooled::pool`](crate::Pooled::pool) handle (palette index).
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
    /// A step on the harness, as [`Op::Common`].
    Common(Common),
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
            20..=22 => SharedOp::Common(Common::advance(u)?),
            23 => SharedOp::Common(Common::fail_or_inject(u, faults)?),
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
