//! [`Exponential`]: the idle stock decays by half per half-life.

use core::time::Duration;

use super::{EvictionPolicy, FreeReason, Oldest};

// For the documentation's links.
#[cfg(doc)]
use super::FixedTime;

/// Decays the idle stock like a radioactive sample: deterministically,
/// oldest first, half of it per half-life.
///
/// The policy keeps an allowance `L` of idle bytes that decays
/// continuously, `L(t) = L(t0) * 2^(-(t - t0) / half_life)`. A release adds
/// the block's size to `L`; a hit scales `L` by `bytes_cached_after /
/// bytes_cached_before`, so the stock keeps its decayed fraction; after
/// `trim`, the limit or the out-of-memory retry free blocks, `L` is clamped
/// to `bytes_cached`. A collection frees the oldest block while
/// `bytes_cached - L >= size_of_oldest / 2`.
///
/// A lone block therefore lives one half-life, and of `N` equal blocks
/// released together `round_half_down(N * 2^(-t / half_life))` remain at
/// time `t`, however often the pool collects in between:
///
/// | N \ t | 0.5 h | 1 h | 2 h | 3 h | 4 h |
/// |------:|------:|----:|----:|----:|----:|
/// |     1 |     1 |   0 |   0 |   0 |   0 |
/// |     2 |     1 |   1 |   0 |   0 |   0 |
/// |     4 |     3 |   2 |   1 |   0 |   0 |
/// |     8 |     6 |   4 |   2 |   1 |   0 |
/// |    16 |    11 |   8 |   4 |   2 |   1 |
///
/// At an exact halfway point the block goes: a lone block is freed at
/// exactly one half-life, since `round_half_down(0.5) = 0` (floating-point
/// rounding decides such exact instants).
///
/// **Blocks the decay itself frees.** Stopping at `bytes_cached - L <
/// size_of_oldest / 2` leaves `L` up to half a block above `bytes_cached`:
/// that rounding residue is what makes the table hold whatever the
/// collection frequency, so the decay does not clamp `L` to
/// `bytes_cached`. Instead, every collection first clamps `L` to
/// `bytes_cached + size_of_oldest / 2`, and an emptied cache resets `L` to
/// zero. For equal blocks that bound never binds (the table is exact); for
/// mixed sizes it stops the allowance of a large decayed block from keeping
/// small younger ones alive: they then live at most `log2(3) ≈ 1.58`
/// half-lives after it.
///
/// **How it is computed.** The policy keeps `L` as a ratio of the bytes
/// cached, `L = ratio * bytes_cached`: a hit, which scales `L` with the
/// bytes, leaves the ratio as it is and computes nothing; a release sets
/// it to `ratio + (1 - ratio) * (size / after)`, which is `(ratio *
/// before + size) / after` and leaves a ratio of exactly 1 (every block
/// released since the clock last moved, none decayed) as it is; a ratio
/// a release takes within `2^-40` of 1 becomes exactly 1 (releases alone
/// take it there in exact arithmetic, though without end), so that the
/// releases after it compute nothing: the allowance moves by `2^-40` of
/// the bytes cached at most. The rules above are what it computes, each
/// operation rounded as an `f64`.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, Exponential, ManualClock};
///
/// let clock = ManualClock::new();
/// let mut pool = DecayingPool::builder(CheckingAllocator::new())
///     .policy(Exponential::new(Duration::from_secs(1)))
///     .clock(clock.clone())
///     .build();
/// let blocks: Vec<_> = (0..8).map(|_| pool.allocate(1024).unwrap()).collect();
/// for b in blocks {
///     unsafe { pool.release(b, 1024) };
/// }
/// clock.advance(Duration::from_secs(1));
/// pool.collect();
/// assert_eq!(pool.stats().blocks_cached, 4);
/// clock.advance(Duration::from_secs(1));
/// pool.collect();
/// assert_eq!(pool.stats().blocks_cached, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exponential {
    half_life: Duration,
    /// `1 / half_life` in seconds (infinite for a zero half-life).
    rate: f64,
    /// What a release adds to the allowance per byte: 1, or 0 for a zero
    /// half-life, which keeps no allowance (a multiplication where a test
    /// of `rate` would take a branch and four more instructions).
    gain: f64,
    /// The allowance as a share of the bytes cached, at `at`: `L` is
    /// `ratio * bytes_cached`, rounded. A hit scales `L` by `after /
    /// before`, which leaves the ratio as it is, so a hit computes
    /// nothing; a release adds its size (see `release_at`), which leaves
    /// a ratio of exactly 1 as it is. Zero while a zero half-life keeps no
    /// allowance, and after a free empties the cache.
    ratio: f64,
    at: Duration,
    /// `at` in nanoseconds, saturating: the hooks' test whether the clock
    /// moved is then one comparison (exact below 584 years; above,
    /// `rebase_later` compares the durations).
    at_nanos: u64,
    /// The deadline last planned (see [`Exponential::plan`]) and what keeps
    /// it: it holds while `L > (bytes - half) * watch`, where `half` is
    /// half the size of the oldest block it was planned for (or of the
    /// smallest block cached, once that block may be gone) and `watch` is
    /// `2^((due - at) / half_life)` times a safety margin.
    due: Duration,
    watch: f64,
    half: f64,
    /// At a ratio of exactly 1, the bytes cached from which the watch no
    /// longer holds (`L = bytes` then); zero at any other ratio. A release
    /// below it leaves the ratio at 1 and the watch held: it compares the
    /// bytes cached with it, and computes nothing.
    limit: usize,
    /// The bytes cached below which a release changes nothing but the
    /// ratio: `release_at` then stores the ratio and returns. `set_limit`
    /// sets it whenever the ratio, the watch or `half` change other than
    /// by a release, for every ratio a release can leave from there on
    /// (with `gain` 1; with a `gain` of 0 the ratio is always 0):
    ///
    /// - below a ratio of 1, releases raise the ratio, up to 1 at most;
    ///   the allowance grows with the ratio, so the watch holds below the
    ///   bytes from which it no longer holds at the ratio `steady` was set
    ///   for, and up to 1 `hit_check` is off and the clamp cannot bind;
    /// - from a ratio of 1 up, releases lower the ratio, down to 1 at
    ///   least: `steady` is the least of the bytes from which the watch no
    ///   longer holds at a ratio of 1, and those from which the allowance
    ///   at the ratio it was set for may round over the clamp or a hit
    ///   must check it (see `steady_above`).
    ///
    /// Near 1 is where a real clock keeps the ratio of a cache in steady
    /// use: every tick decays it below 1, the blocks the decay frees may
    /// leave it above, and releases take it back towards 1.
    steady: usize,
    /// Whether a hit must check the allowance against the clamp: only
    /// above a ratio of 1, and only where the bytes cached when it was
    /// last set were so many beside `half` that rounding could take the
    /// allowance over the clamp (see `set_hit_check`). Fewer bytes cached
    /// (hits) and a decayed ratio keep it valid.
    ///
    /// Kept as the bytes left by a hit at or below which the hit goes
    /// out of line (`try_on_hit` answers `false`): `usize::MAX` while a
    /// hit must check, else 0 (a hit that empties the cache goes out of
    /// line too). One comparison then tests both.
    hit_floor: usize,
    /// The size of the oldest block the deadline was planned for: a hit of
    /// that size may take it, leaving a successor of any size cached. Zero
    /// once that may have happened: `half` then covers any successor.
    oldest_size: usize,
    /// The smallest size released since the cache was last empty
    /// (`usize::MAX` when empty): no cached block is smaller.
    min_size: usize,
    /// Whether `due` may no longer hold ([`EvictionPolicy::deadline_stale`]).
    stale: bool,
    /// Whether a release or a hit made the last deadline stale before the
    /// pool next asked `must_evict` (the plan saved no collection).
    killed: bool,
    /// When the last plan was made.
    planned_at: Duration,
    /// The last decay computed: `2^(-decay_span / half_life)`. A
    /// collection and the hook after it, at the same time, decay the same
    /// span: the second reuses the first's exponential.
    decay_span: Duration,
    decay: f64,
    /// How many of the next `must_evict` calls that find nothing due make
    /// no plan, and the backoff that set it (see `replan`).
    skip: u32,
    backoff: u32,
}

/// `x` as the nearest `f64`, exactly as `x as f64`: through the signed
/// conversion, one instruction where x86-64 takes several for the unsigned
/// one. Above `i64::MAX`, halving with the low bit kept (round to odd)
/// and doubling rounds the same.
#[inline(always)]
fn float(x: usize) -> f64 {
    let x = x as u64;
    if (x as i64) >= 0 {
        x as i64 as f64
    } else {
        ((x >> 1) | (x & 1)) as i64 as f64 * 2.0
    }
}

/// The ratio that clamps an allowance to `bound` with `bytes` cached: the
/// largest `f64` whose product with `bytes` (rounded) is not above
/// `bound`, so that the clamped allowance, computed again from the ratio,
/// is within the clamp. `bound / bytes`, or an ulp or two below it.
/// `bytes` and `bound` are above zero.
pub(crate) fn clamp_ratio(bound: f64, bytes: f64) -> f64 {
    let mut ratio = bound / bytes;
    while ratio * bytes > bound {
        // One ulp down: `ratio` is positive and finite.
        ratio = f64::from_bits(ratio.to_bits() - 1);
    }
    ratio
}

/// Relative safety margin of a planned deadline: the allowance must exceed
/// the eviction threshold by this factor at the deadline. Far above the
/// rounding of the few floating-point operations involved (about 1e-15).
const MARGIN: f64 = 1e-12;

/// What a watch is multiplied by, besides the decay, when the clock moves
/// (`Exponential::rebase_later`): above the relative rounding of that
/// update (about 1.6e-14 at worst), so the watch never falls below its
/// exact value.
const WATCH_ROUNDING: f64 = 1.0 + 1e-13;

/// The most collections that plan no deadline after plans that saved
/// nothing (see `Exponential::replan`).
const MAX_BACKOFF: u32 = 63;

/// The share of the time left until the allowance reaches the threshold
/// that a plan's deadline covers (see `Exponential::plan`). Stopping an
/// eighth short leaves the allowance that eighth of its lead (in
/// halvings) above the threshold at the deadline, which the releases
/// until then eat into (each by its size times `watch - 1`) before one
/// makes the deadline stale; with a deadline planned to the last instant
/// each release of a cache sitting just above its threshold (as a decay
/// leaves it, between two ticks of the clock) did, and each collection
/// planned again. The cost: a deadline reached with nothing due, a plan
/// of an eighth of the time left again, a few more plans per eviction.
const SHORT: f64 = 0.875;

/// How close to 1 a release's ratio becomes exactly 1 (`2^-40`, about
/// `9.1e-13`; see `Exponential::release_at`).
///
/// Releases take the ratio towards 1 (each by `(1 - ratio) * size /
/// bytes`), in exact arithmetic without reaching it; rounded, the steps
/// stop short of it, where one is under half an ulp of the ratio. After
/// a tick of a millisecond decayed the ratio to `1 - 6.9e-4` (a
/// half-life of a second), releases each of a 64th of the bytes cached
/// came to rest `3.6e-15` below 1 after 1 643 of them, and every release
/// after that still computed its share; within `NEAR_ONE` after 1 299,
/// and at exactly 1 a release computes nothing (`limit`). Releases of at
/// least `2^-14` of the bytes cached come within `NEAR_ONE` before their
/// steps stop (smaller ones may stop short of it, and compute as before).
/// The allowance moves by at most `NEAR_ONE` of the bytes cached, under
/// the deadlines' margin (`MARGIN`, 1e-12): up from below 1 that only
/// delays evictions, and down from above, the watch is checked.
pub(crate) const NEAR_ONE: f64 = 1.0 / (1u64 << 40) as f64;

impl Exponential {
    /// Decays the idle stock by half every `half_life` (as
    /// [`FixedTime::new`] takes its time-to-live).
    ///
    /// A zero half-life keeps no allowance: every block is freed at the
    /// next collection, as with `FixedTime::new(Duration::ZERO)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let p = decaying_pool::Exponential::new(Duration::from_millis(500));
    /// assert_eq!(p.half_life(), Duration::from_millis(500));
    /// ```
    pub fn new(half_life: Duration) -> Self {
        let h = half_life;
        let rate = 1.0 / h.as_secs_f64();
        Exponential {
            half_life: h,
            rate,
            gain: if rate.is_finite() { 1.0 } else { 0.0 },
            ratio: 0.0,
            at: Duration::ZERO,
            at_nanos: 0,
            due: Duration::ZERO,
            watch: f64::INFINITY,
            half: 0.0,
            // An infinite watch holds for no bytes.
            limit: 0,
            steady: 0,
            hit_floor: 0,
            oldest_size: 0,
            min_size: usize::MAX,
            stale: true,
            killed: false,
            planned_at: Duration::ZERO,
            decay_span: Duration::ZERO,
            decay: 1.0,
            skip: 0,
            backoff: 0,
        }
    }

    /// The half-life.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let p = decaying_pool::Exponential::new(Duration::from_secs(3));
    /// assert_eq!(p.half_life(), Duration::from_secs(3));
    /// ```
    pub const fn half_life(&self) -> Duration {
        self.half_life
    }

    /// The ratio `L / bytes` at `now`.
    #[inline]
    fn ratio_at(&mut self, now: Duration) -> f64 {
        if now <= self.at || self.ratio == 0.0 {
            return self.ratio;
        }
        self.ratio * self.decay_over(now - self.at)
    }

    /// `2^(-span / half_life)` for a `span` above zero, as `exp2`
    /// computes it: the same bits whether computed now or remembered from
    /// the last call.
    #[inline]
    fn decay_over(&mut self, span: Duration) -> f64 {
        debug_assert!(!span.is_zero(), "a decay over no time");
        if span != self.decay_span {
            self.decay_span = span;
            self.decay = (-(span.as_secs_f64() * self.rate)).exp2();
        }
        self.decay
    }

    /// Sets the time the allowance is known at.
    #[inline]
    fn set_at(&mut self, at: Duration) {
        self.at = at;
        self.at_nanos = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
    }

    /// Decays the allowance to `now` (when later than the last time).
    #[inline(always)]
    fn rebase(&mut self, now: Duration) {
        // One comparison: the pool's times are whole nanoseconds, which
        // `as_nanos` gives back without arithmetic.
        let nanos = now.as_nanos();
        if nanos > u128::from(self.at_nanos) {
            self.rebase_nanos(nanos);
        }
    }

    /// `rebase_later` from the time in nanoseconds (so that the hooks
    /// convert nothing unless the clock moved).
    #[cold]
    #[inline(never)]
    fn rebase_nanos(&mut self, nanos: u128) {
        let now = match u64::try_from(nanos) {
            Ok(n) => Duration::from_nanos(n),
            Err(_) => {
                let secs = nanos / 1_000_000_000;
                match u64::try_from(secs) {
                    Ok(s) => Duration::new(s, (nanos % 1_000_000_000) as u32),
                    Err(_) => Duration::MAX,
                }
            }
        };
        self.rebase_later(now);
    }

    /// `rebase` once the clock has moved: with a coarse clock, at most once
    /// per tick. The ratio decays exactly as [`ratio_at`](Self::ratio_at)
    /// computes it; a deadline still ahead keeps its watch, scaled by the
    /// same decay (rounded up).
    #[inline]
    fn rebase_later(&mut self, now: Duration) {
        if now <= self.at {
            // Only above 584 years, where `at_nanos` saturates.
            return;
        }
        let decays = self.ratio != 0.0;
        if decays || !self.stale {
            let factor = self.decay_over(now - self.at);
            if decays {
                self.ratio *= factor;
                self.set_limit();
            }
            if !self.stale {
                if now >= self.due {
                    self.stale = true;
                } else {
                    // `2^((due - now) / h)` is `2^((due - at) / h)` times
                    // `factor`, up to the rounding of `halvings` (less
                    // than 65 of them before `due`), of `exp2` and of the
                    // product: far below `WATCH_ROUNDING`, which keeps
                    // the watch on the safe (high) side.
                    self.set_watch(self.watch * factor * WATCH_ROUNDING);
                }
            }
        }
        self.set_at(now);
    }

    /// Sets the watch, and the limit that stands for it at a ratio of 1.
    #[inline]
    fn set_watch(&mut self, watch: f64) {
        self.watch = watch;
        self.set_limit();
    }

    /// Sets `limit` and `steady` for the ratio, the watch and `half`, and
    /// below a ratio of 1 turns `hit_check` off (a decay can take a ratio
    /// above 1 below it, where a hit needs no check).
    #[inline]
    fn set_limit(&mut self) {
        self.set_limit_at_one();
        let r = self.ratio;
        self.steady = if r < 1.0 {
            self.hit_floor = 0;
            limit(self.watch, self.half, r)
        } else {
            self.steady_above()
        };
    }

    /// Sets `limit` for the ratio, the watch and `half`.
    #[inline]
    fn set_limit_at_one(&mut self) {
        self.limit = if self.ratio == 1.0 {
            limit(self.watch, self.half, 1.0)
        } else {
            0
        };
    }

    /// `steady` from a ratio of 1 up (zero for a NaN ratio): the least of
    /// `limit` at a ratio of 1 and the bytes from which `(ratio - 1) *
    /// bytes + 2e-14 * bytes` reaches `half`. Below the latter, at this
    /// ratio or any lower one, the allowance `ratio * bytes` stays under
    /// the clamp `bytes + half` by far more than its rounding, and
    /// `set_hit_check` (whose slack is `1e-14 * bytes`) answers no check.
    /// (`ratio - 1` is exact up to a ratio of 2, and at least half the
    /// ratio above it.)
    #[inline(never)]
    fn steady_above(&self) -> usize {
        let clamp = (self.half / ((self.ratio - 1.0) + 2e-14) * (1.0 - 1e-12)) as usize;
        limit(self.watch, self.half, 1.0).min(clamp)
    }

    /// A release that `limit` did not let through, leaving `bytes` cached:
    /// the ratio becomes `ratio + (gain - ratio) * (size / bytes)`, which
    /// is `(ratio * before + size * gain) / bytes` rounded differently
    /// (the quotient, which does not depend on the ratio, is off the chain
    /// of operations from one release's ratio to the next). It leaves a
    /// ratio of exactly 1 (`gain` is then 1) at 1, and makes it exactly 1
    /// when nothing was cached before (`size / bytes` is then 1 and
    /// `1 - ratio` is exact for a ratio from 0.5 to 2, and rounds back to
    /// 1 with the ratio below that).
    ///
    /// A ratio that comes within [`NEAR_ONE`] of 1 becomes exactly 1
    /// ([`reach_one`](Self::reach_one)), where the next releases compute
    /// nothing (`limit`). Else, with fewer bytes cached than `steady`,
    /// which holds near a ratio of 1, the release changes the ratio alone,
    /// and returns after the arithmetic.
    ///
    /// Out of line: inlined (with the test near 1), the release's fast
    /// path took two more instructions a round trip (136 against 134,
    /// `examples/instructions.rs exponential 64x1`), and no fewer with a
    /// clock that moved since the pool filled (159 at 4096 × 4, against
    /// 157 out of line without the test).
    #[inline(never)]
    fn release_at(&mut self, size: usize, bytes: usize) {
        if bytes != 0 {
            // A release adds `size` to both sides of `L > bytes - half`:
            // as `L` then decays faster in bytes, the deadline may come
            // sooner.
            let b = float(bytes);
            let ratio = self.ratio + (self.gain - self.ratio) * (float(size) / b);
            // Two comparisons (one where the ratio is below), where an
            // absolute value takes five instructions.
            if (1.0 - NEAR_ONE..=1.0 + NEAR_ONE).contains(&ratio) {
                self.reach_one(bytes);
                return;
            }
            self.ratio = ratio;
            if bytes < self.steady {
                // Nothing else changes (see `steady`).
                return;
            }
            // Losing the watch sets `steady` again; else it holds for the
            // ratio, which stays on the side of 1 it was on (see
            // `steady`).
            self.keep_watch(self.ratio * b, b);
            self.set_limit_at_one();
            self.set_hit_check(bytes);
        }
    }

    /// A release took the ratio within [`NEAR_ONE`] of 1, or left it at 1,
    /// with `bytes` cached: the ratio becomes exactly 1 (the allowance
    /// moves by at most `NEAR_ONE` of the bytes), the watch is checked,
    /// and `limit` (the comparison that spares the next releases their
    /// arithmetic), `steady` and the hit check are set for it. A ratio
    /// near 1 has `gain` 1: the ratio of a zero half-life stays 0.
    #[cold]
    #[inline(never)]
    fn reach_one(&mut self, bytes: usize) {
        debug_assert!(self.gain == 1.0, "a ratio near 1 with a zero half-life");
        self.ratio = 1.0;
        let b = float(bytes);
        self.keep_watch(b, b);
        self.set_limit();
        self.set_hit_check(bytes);
    }

    /// Sets `hit_check` for the ratio, `half` and `bytes` cached.
    ///
    /// A hit leaves the ratio, so with `a <= bytes` left cached the
    /// allowance is `ratio * a`, which in exact arithmetic stays within
    /// the clamp `a + half` once `(ratio - 1) * bytes <= half`. Rounded,
    /// `float(a)`, the product and the sum each err by half an ulp
    /// (`2^-53` relative): with the ratio at most 2 (a clamp allows
    /// `bytes + half` at most, `half` at most half the bytes), a slack of
    /// `1e-14 * bytes` is far more than those errors together, and than
    /// those of this test. A hit then needs no check; else it checks the
    /// rounded product itself, out of line. At a ratio of 1 or less the
    /// allowance is at most the bytes: no check.
    #[inline]
    fn set_hit_check(&mut self, bytes: usize) {
        let check = self.ratio > 1.0 && {
            let b = float(bytes);
            (self.ratio - 1.0) * b + b * 1e-14 > self.half
        };
        self.hit_floor = if check { usize::MAX } else { 0 };
    }

    /// What keeps a deadline `due` from a state at `at`: `2^((due - at) /
    /// half_life)` with the safety margin.
    #[inline]
    fn watch_at(&self, due: Duration, at: Duration) -> f64 {
        ((due - at).as_secs_f64() * self.rate).exp2() * (1.0 + MARGIN)
    }

    /// Whether an allowance of `allowance` with `bytes` (as a float)
    /// cached still keeps the planned deadline; marks it stale when not.
    ///
    /// Kept means both: above the threshold with the watch's margin, and
    /// not above the clamp (`bytes + half`) that the collections skipped
    /// until the deadline would apply. A release adds its size to both
    /// sides of the clamp and a hit scales both, so in exact arithmetic
    /// neither can make it bind; but the allowance is rounded (a ratio
    /// times the bytes), and where the bytes cached dwarf `half` (2^63
    /// bytes against a block of 2^40: an ulp is 2048) it can come out an
    /// ulp above a clamp it sat on.
    #[inline(always)]
    fn keep_watch(&mut self, allowance: f64, bytes: f64) {
        if !self.keeps(allowance, bytes) {
            self.lose_watch();
        }
    }

    /// The test of [`keep_watch`](Self::keep_watch), written so that a
    /// NaN counts as stale.
    #[inline(always)]
    fn keeps(&self, allowance: f64, bytes: f64) -> bool {
        allowance > (bytes - self.half) * self.watch && allowance <= bytes + self.half
    }

    /// A release or a hit brought the deadline forward (or the deadline
    /// was already stale). The watch then becomes zero, which any positive
    /// allowance keeps: while no deadline holds, the hooks do not come
    /// here again (the next plan sets a watch).
    #[cold]
    #[inline(never)]
    fn lose_watch(&mut self) {
        if !self.stale {
            self.stale = true;
            self.killed = true;
        }
        self.set_watch(0.0);
    }

    /// A hit may have taken the oldest block the deadline was planned for.
    /// Its successor, of any cached size, is due no sooner than a block of
    /// the smallest size, so the deadline holds if it holds for that size.
    /// Since the successor may be smaller, the collections skipped must
    /// also not clamp the allowance (to `bytes + successor / 2`): else the
    /// deadline is stale.
    #[cold]
    #[inline(never)]
    fn lose_oldest(&mut self, bytes: usize) {
        self.oldest_size = 0;
        self.cover(self.min_size, bytes);
    }

    /// Covers any oldest block of `size` bytes or more (see `lose_oldest`),
    /// with `bytes` cached. (When the watch holds for `size`, the clamp
    /// cannot bind as long as the deadline was planned at the exact time
    /// the allowance reaches the threshold; the plan stops short of it,
    /// so this is checked too.)
    fn cover(&mut self, size: usize, bytes: usize) {
        self.half = float(size) / 2.0;
        self.set_watch(self.watch);
        self.set_hit_check(bytes);
        let b = float(bytes);
        self.keep_watch(self.ratio * b, b);
    }

    /// A block smaller than any cached was released, leaving `bytes`.
    #[cold]
    #[inline(never)]
    fn smaller(&mut self, size: usize, bytes: usize) {
        self.min_size = size;
        if self.oldest_size == 0 && !self.stale {
            self.cover(size, bytes);
        }
    }

    /// After `must_evict` found nothing due at `now` with `bytes` cached:
    /// plans a deadline for `oldest`, unless the last plans saved nothing.
    ///
    /// A plan costs a logarithm and an exponential. When the clock moves
    /// between nearly every operation and each release makes the deadline
    /// stale before the next collection, planning at every collection
    /// costs more than the checks it saves. So a plan that a release or a
    /// hit made stale before the pool asked again, with the clock moved
    /// since it was made, doubles a backoff (1, 3, 7, … up to
    /// `MAX_BACKOFF`); that many collections less one then plan nothing. A
    /// plan that lasts until the pool asks again (its deadline passed, or
    /// a block was freed) resets the backoff. At a frozen clock, as in
    /// round trips, every collection that finds nothing due plans.
    #[inline]
    fn replan(&mut self, now: Duration, oldest: Oldest, bytes: usize) {
        if !self.stale {
            // The deadline lasted until the pool asked again.
            self.backoff = 0;
        } else if self.killed {
            self.killed = false;
            if now > self.planned_at {
                self.backoff = (self.backoff * 2 + 1).min(MAX_BACKOFF);
                self.skip = self.backoff - 1;
            }
        }
        if self.skip > 0 {
            self.skip -= 1;
            self.stale = true;
            return;
        }
        self.planned_at = now;
        match self.plan(oldest, bytes) {
            Some((due, watch)) => {
                self.due = due;
                self.half = float(oldest.size) / 2.0;
                self.set_watch(watch);
                self.set_hit_check(bytes);
                self.oldest_size = oldest.size;
                self.stale = false;
            }
            None => self.stale = true,
        }
    }

    /// A deadline for `oldest` from the current state, with `bytes`
    /// cached: a time before which the allowance, undisturbed, stays above
    /// `bytes - size / 2` with the safety margin, and the `watch` that
    /// keeps it; `None` when there is no such time after `at` (or no
    /// allowance).
    ///
    /// Undisturbed, `L(t) = L(at) * 2^(-(t - at) / h)` reaches the
    /// threshold `T = bytes - size / 2` after `log2(L(at) / T)`
    /// half-lives; the plan stops an eighth of that short (`SHORT`), less
    /// a hair for rounding, and then checks exactly that the margin holds
    /// at the planned time. Since `L` only
    /// falls as time passes, `must_evict` answers `false` before it.
    fn plan(&self, oldest: Oldest, bytes: usize) -> Option<(Duration, f64)> {
        let half = float(oldest.size) / 2.0;
        let b = float(bytes);
        let threshold = b - half;
        // As `must_evict` would clamp it.
        let allowance = (self.ratio * b).min(b + half);
        let ahead = threshold > 0.0 && allowance > threshold && self.rate.is_finite();
        if !ahead {
            return None;
        }
        // Short of the exact `log2(L / T)` by an eighth (`SHORT`), and by
        // `log2(1 + MARGIN)` (1.44e-12) and a little more for rounding;
        // the check below decides. (A cache of more than about 10^11 times
        // its smallest block may find no such time: it is then checked at
        // every collection.)
        let halvings = (allowance / threshold).log2() * SHORT - 2e-12;
        let later = halvings > 0.0;
        if !later {
            return None;
        }
        let span = Duration::try_from_secs_f64(halvings * self.half_life.as_secs_f64()).ok()?;
        let due = self.at.checked_add(span)?;
        let watch = self.watch_at(due, self.at);
        (allowance > threshold * watch).then_some((due, watch))
    }
}

/// At a ratio `r` (the allowance is `r * b` with `b` bytes cached), the
/// least `b` for which the watch `w` with `half` no longer holds, rounded
/// down, so that `b < limit` implies `r * b > (b - half) * w` in exact
/// arithmetic: every `b` when `w <= r` (but for `w = r = 0`, where the
/// watch is already lost: `lose_watch` sets it to zero); else `b < half *
/// w / (w - r)`. (`w - r` is exact for `w` up to `2r`, by Sterbenz's
/// lemma, and more than `w / 2` above that, so its rounding, and the two
/// after it, are far within the `1e-12` taken off.) Zero, which no bytes
/// are below, for an infinite or NaN watch.
fn limit(w: f64, half: f64, r: f64) -> usize {
    if w <= r {
        return usize::MAX;
    }
    // A float-to-integer cast saturates, and takes NaN to zero.
    (half * w / (w - r) * (1.0 - 1e-12)) as usize
}

impl EvictionPolicy for Exponential {
    #[inline(always)]
    fn on_release(&mut self, now: Duration, size: usize, bytes_cached: usize) {
        self.rebase(now);
        // One comparison while the ratio stays 1 and the watch holds.
        if bytes_cached >= self.limit {
            self.release_at(size, bytes_cached);
        }
        if size < self.min_size {
            self.smaller(size, bytes_cached);
        }
    }

    #[inline(always)]
    fn on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) {
        // No decay to `now`: a hit leaves the ratio, and the watch and
        // the allowance it is held against are both as of `at` (as a
        // free by expiry leaves them), so they compare as they would
        // decayed; the next release or collection decays them.
        let _ = (now, before);
        if after == 0 {
            self.min_size = usize::MAX;
        }
        // A hit scales `L` and the bytes alike (the ratio stays), which
        // only delays the deadline: it leaves `L` above the watch, and
        // below the clamp (see `set_hit_check`; where rounding could take
        // it over, the rounded product is checked). A hit of the oldest
        // block's size may have taken the oldest block.
        if size == self.oldest_size {
            self.lose_oldest(after);
        } else if self.hit_floor == usize::MAX {
            let b = float(after);
            self.keep_watch(self.ratio * b, b);
        }
    }

    #[inline(always)]
    fn try_on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) -> bool {
        let _ = (now, before);
        // `on_hit` does nothing unless the hit may take the oldest block
        // (`lose_oldest`), it empties the cache, or it must check the
        // allowance against the clamp. (A hit's size is never zero, which
        // `oldest_size` is when unknown.)
        !(size == self.oldest_size || after <= self.hit_floor)
    }

    #[inline]
    fn on_free(&mut self, now: Duration, size: usize, after: usize, reason: FreeReason) {
        let clamp = reason == FreeReason::Trimmed || after == 0;
        if clamp {
            self.rebase(now);
        }
        // `L` as it was before the free, clamped to the bytes left after a
        // trim (or an emptied cache), and as a ratio of those bytes.
        let mut allowance = self.ratio * float(after.saturating_add(size));
        if clamp {
            allowance = allowance.min(float(after));
        }
        self.ratio = if after == 0 {
            self.min_size = usize::MAX;
            0.0
        } else {
            allowance / float(after)
        };
        self.set_limit();
        self.set_hit_check(after);
        self.stale = true;
    }

    #[inline]
    fn must_evict(&mut self, now: Duration, oldest: Oldest, bytes_cached: usize) -> bool {
        let half = float(oldest.size) / 2.0;
        let b = float(bytes_cached);
        let mut allowance = self.ratio_at(now) * b;
        let bound = b + half;
        if allowance > bound {
            allowance = bound;
            self.ratio = clamp_ratio(bound, b);
            self.set_limit();
            self.set_hit_check(bytes_cached);
            self.set_at(self.at.max(now));
        }
        let evict = b - allowance >= half;
        if evict {
            self.stale = true;
        } else {
            self.replan(now, oldest, bytes_cached);
        }
        evict
    }

    /// Seven eighths of the time until the allowance, undisturbed, first
    /// lets `oldest` go (less a hair); a release can bring it forward, which
    /// [`deadline_stale`](EvictionPolicy::deadline_stale) reports.
    /// ([`deadline`](EvictionPolicy::deadline), which must hold whatever is
    /// released, is `None`.)
    #[inline]
    fn provisional_deadline(&self, oldest: Oldest) -> Option<Duration> {
        // `must_evict` planned it, if planning paid (see `replan`).
        (!self.stale && oldest.size == self.oldest_size).then_some(self.due)
    }

    #[inline]
    fn deadline_stale(&self) -> bool {
        self.stale
    }
}

#[cfg(test)]
mod tests;
