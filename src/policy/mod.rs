//! Eviction policies: when an idle block must go back.
//!
//! A [`DecayingPool`](crate::DecayingPool) is generic over a [`Policy`]. Two
//! kinds exist:
//!
//! - timed policies, any type implementing [`EvictionPolicy`] ([`FixedTime`],
//!   [`Exponential`], or your own). They run on the timed store: cached
//!   blocks in release order, and at every collection the policy decides
//!   whether the oldest must go;
//! - [`FixedCapacity`], which runs on a fixed table of slots with no clock.

use core::time::Duration;

use crate::store_api::Store;

/// Which cached block of a size class a hit hands out.
///
/// # Examples
///
/// ```
/// use decaying_pool::Reuse;
/// assert_eq!(Reuse::default(), Reuse::Lifo);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reuse {
    /// The most recently released block (the default): surplus blocks of a
    /// class sit untouched at the old end of the queue, so they age and decay.
    #[default]
    Lifo,
    /// The oldest block of the class. Under steady demand this keeps every
    /// surplus block young, so none is ever freed.
    Fifo,
}

/// The oldest cached block, as a timed policy sees it.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::policy::Oldest;
/// let oldest = Oldest { released_at: Duration::from_millis(5), size: 4096 };
/// assert_eq!(oldest.idle(Duration::from_millis(8)), Duration::from_millis(3));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oldest {
    /// When it was released into the cache.
    pub released_at: Duration,
    /// Its class size in bytes.
    pub size: usize,
}

impl Oldest {
    /// How long it has been idle at `now` (zero if `now` is earlier).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::policy::Oldest;
    /// let o = Oldest { released_at: Duration::from_secs(1), size: 8 };
    /// assert_eq!(o.idle(Duration::from_secs(3)), Duration::from_secs(2));
    /// assert_eq!(o.idle(Duration::ZERO), Duration::ZERO);
    /// ```
    #[inline]
    pub fn idle(&self, now: Duration) -> Duration {
        now.saturating_sub(self.released_at)
    }
}

/// Why a cached block left the cache other than by a hit.
///
/// # Examples
///
/// ```
/// use decaying_pool::policy::FreeReason;
/// // A policy that only cares about its own decisions:
/// fn counts(reason: FreeReason) -> bool { reason == FreeReason::Expired }
/// assert!(!counts(FreeReason::Trimmed));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FreeReason {
    /// The policy's own [`EvictionPolicy::must_evict`] chose it.
    Expired,
    /// `trim`, the byte limit or the out-of-memory retry freed it.
    Trimmed,
}

/// A timed eviction policy: told of releases, hits and frees, it decides at
/// each collection whether the oldest cached block must go.
///
/// The pool calls [`must_evict`](Self::must_evict) with the oldest block
/// again and again, freeing it each time the answer is `true`, until the
/// answer is `false` or the cache is empty. That happens before every
/// `allocate`, `release` and `collect`, so keep `must_evict` cheap: it runs
/// on every hit.
///
/// # Examples
///
/// A policy that keeps at most `max` idle bytes:
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::policy::{EvictionPolicy, Oldest};
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, ManualClock};
///
/// struct MaxIdle { max: usize }
///
/// impl EvictionPolicy for MaxIdle {
///     fn must_evict(&mut self, _now: Duration, _oldest: Oldest, bytes_cached: usize) -> bool {
///         bytes_cached > self.max
///     }
/// }
///
/// let mut pool = DecayingPool::builder(CheckingAllocator::new())
///     .policy(MaxIdle { max: 250 })
///     .clock(ManualClock::new())
///     .build();
/// let blocks: Vec<_> = (0..3).map(|_| pool.allocate(100).unwrap()).collect();
/// for b in blocks {
///     unsafe { pool.release(b, 100) };
/// }
/// pool.collect();
/// assert_eq!(pool.stats().bytes_cached, 200);
/// # Ok(())
/// # }
/// ```
pub trait EvictionPolicy {
    /// A block of `size` bytes entered the cache at `now`;
    /// `bytes_cached` includes it.
    #[inline]
    fn on_release(&mut self, now: Duration, size: usize, bytes_cached: usize) {
        let _ = (now, size, bytes_cached);
    }

    /// A hit at `now` took a block of `size` bytes out of the cache, whose
    /// idle bytes went from `bytes_cached_before` to `bytes_cached_after`.
    #[inline]
    fn on_hit(
        &mut self,
        now: Duration,
        size: usize,
        bytes_cached_before: usize,
        bytes_cached_after: usize,
    ) {
        let _ = (now, size, bytes_cached_before, bytes_cached_after);
    }

    /// [`on_hit`](Self::on_hit) on the pool's inlined hit path: either
    /// does exactly what `on_hit` would and answers `true`, or changes
    /// nothing and answers `false`, and the pool then calls `on_hit` from
    /// a function out of line. The default calls `on_hit` and answers
    /// `true`.
    ///
    /// For a policy whose `on_hit` calls a function on its rare paths (a
    /// logarithm, an exponential, anything not inlined): a call anywhere
    /// in the inlined hit path makes the compiler save and restore
    /// registers at every hit, taken or not. Answering `false` on those
    /// paths leaves the hit path calling nothing. [`Exponential`] answers
    /// `false` when the hit may take the block its deadline was planned
    /// for, when it empties the cache, or when its allowance sits so
    /// close to its clamp that rounding must be checked; else its
    /// `on_hit` changes nothing (a hit decays nothing either: the ratio
    /// of its allowance to the bytes cached stays), and `try_on_hit`
    /// answers `true` having computed nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{EvictionPolicy, Exponential};
    ///
    /// let t = Duration::from_secs(1);
    /// let mut p = Exponential::new(Duration::from_secs(10));
    /// p.on_release(t, 64, 64);
    /// p.on_release(t, 32, 96);
    /// let mut q = p;
    /// // With the 64-byte block still cached: inline, even a second later.
    /// assert!(p.try_on_hit(t * 2, 32, 96, 64));
    /// q.on_hit(t * 2, 32, 96, 64);
    /// assert_eq!(p, q);
    /// // A hit that empties the cache: out of line, unchanged.
    /// assert!(!p.try_on_hit(t * 2, 64, 64, 0));
    /// assert_eq!(p, q);
    /// ```
    #[inline(always)]
    fn try_on_hit(
        &mut self,
        now: Duration,
        size: usize,
        bytes_cached_before: usize,
        bytes_cached_after: usize,
    ) -> bool {
        self.on_hit(now, size, bytes_cached_before, bytes_cached_after);
        true
    }

    /// A cached block of `size` bytes was freed at (or, for `trim`, no
    /// earlier than) `now`, leaving `bytes_cached_after` idle bytes.
    #[inline]
    fn on_free(
        &mut self,
        now: Duration,
        size: usize,
        bytes_cached_after: usize,
        reason: FreeReason,
    ) {
        let _ = (now, size, bytes_cached_after, reason);
    }

    /// Whether the `oldest` cached block must be freed at `now`, with
    /// `bytes_cached` idle bytes in the cache.
    fn must_evict(&mut self, now: Duration, oldest: Oldest, bytes_cached: usize) -> bool;

    /// A time before which [`must_evict`](Self::must_evict) answers `false`
    /// for `oldest`, and for any block released after it that becomes the
    /// oldest (a hit may take `oldest`), whatever is released or hit
    /// meanwhile; `None` (the default) when there is no such time. The pool
    /// asks (through [`provisional_deadline`](Self::provisional_deadline),
    /// which defaults to this) after a collection's `must_evict` answers
    /// `false`, and asks again after it frees a block.
    ///
    /// The pool then skips the policy check until that time: on the hit
    /// path it becomes one comparison. A deadline that is too early only
    /// costs a check; one that is too late delays evictions. A policy whose
    /// deadline a release or a hit can bring forward (as [`Exponential`]'s)
    /// answers `None` here and gives its deadline through
    /// [`provisional_deadline`](Self::provisional_deadline) instead.
    ///
    /// # Panics (debug builds)
    ///
    /// In debug builds (`debug_assertions`), every collection
    /// ([`collect`](crate::DecayingPool::collect), the reaper) that the
    /// deadline would let skip the policy asks
    /// [`must_evict`](Self::must_evict) anyway, and panics with a message
    /// naming both times when it answers `true` before the deadline: such a
    /// policy would otherwise silently never evict. `must_evict` must
    /// therefore tolerate being asked at any time (the crate's policies
    /// do). Release builds skip the check.
    ///
    /// ```should_panic
    /// # #[cfg(not(debug_assertions))] panic!("EvictionPolicy::deadline disagrees with must_evict");
    /// use core::time::Duration;
    /// use decaying_pool::policy::{EvictionPolicy, Oldest};
    /// use decaying_pool::{DecayingPool, ManualClock, SystemAllocator};
    ///
    /// /// Evicts after a second of idleness, but claims nothing is due for an hour.
    /// struct Inconsistent;
    /// impl EvictionPolicy for Inconsistent {
    ///     fn must_evict(&mut self, now: Duration, oldest: Oldest, _: usize) -> bool {
    ///         oldest.idle(now) >= Duration::from_secs(1)
    ///     }
    ///     fn deadline(&self, oldest: Oldest) -> Option<Duration> {
    ///         Some(oldest.released_at + Duration::from_secs(3600))
    ///     }
    /// }
    ///
    /// let clock = ManualClock::new();
    /// let mut pool = DecayingPool::builder(SystemAllocator::new())
    ///     .policy(Inconsistent)
    ///     .clock(clock.clone())
    ///     .build();
    /// let (a, b) = (pool.allocate(64)?, pool.allocate(64)?);
    /// // SAFETY: each block came from this pool with this size, released once.
    /// unsafe { pool.release(a, 64); pool.release(b, 64) };
    /// clock.advance(Duration::from_secs(2));
    /// pool.collect(); // panics: "EvictionPolicy::deadline disagrees with must_evict: …"
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    fn deadline(&self, oldest: Oldest) -> Option<Duration> {
        let _ = oldest;
        None
    }

    /// A deadline as [`deadline`](Self::deadline)'s, except that it holds
    /// only until [`deadline_stale`](Self::deadline_stale) answers `true`:
    /// a time before which [`must_evict`](Self::must_evict) answers `false`
    /// for `oldest`, and for any block that becomes the oldest, as long as
    /// the releases and hits meanwhile leave `deadline_stale` `false`. The
    /// default is [`deadline`](Self::deadline), which holds whatever
    /// happens. This is the method the pool calls.
    ///
    /// Implement both methods or neither: a policy that wraps another and
    /// forwards its calls forwards both, or its deadlines are held across
    /// releases that make them stale. A wrapper written before these
    /// methods existed forwards neither, and then gets the wrapped policy's
    /// [`deadline`](Self::deadline), which holds whatever happens (for
    /// [`Exponential`], none: the pool asks `must_evict` at every
    /// collection).
    ///
    /// # Panics (debug builds)
    ///
    /// As [`deadline`](Self::deadline): a collection that the deadline
    /// would let skip the policy asks `must_evict` anyway, and panics when
    /// it answers `true`.
    #[inline]
    fn provisional_deadline(&self, oldest: Oldest) -> Option<Duration> {
        self.deadline(oldest)
    }

    /// Whether the last [`provisional_deadline`](Self::provisional_deadline)
    /// may no longer hold: a release or a hit since the last
    /// [`must_evict`](Self::must_evict) brought forward the time the
    /// oldest block is due, or took that block and left a successor that
    /// may be due sooner. `false` (the default) for a policy whose
    /// deadline holds whatever is released or hit, as [`FixedTime`]'s.
    ///
    /// The pool asks after every [`on_release`](Self::on_release) and
    /// [`on_hit`](Self::on_hit); once the answer is `true`, its next
    /// collection asks `must_evict` (and then `provisional_deadline`)
    /// again. Answering `true` too often only costs checks; a policy whose
    /// deadline a release or a hit brings forward must answer `true` then,
    /// or its evictions are delayed.
    ///
    /// [`Exponential`] uses it: a release adds its size both to the idle
    /// bytes and to the allowance, which then decays faster in bytes, so
    /// the oldest block is due sooner. Rather than solve for the deadline
    /// on every release, it checks that the allowance still clears the
    /// eviction threshold at the deadline it gave (a multiplication and a
    /// comparison), and answers `true` when it does not.
    #[inline]
    fn deadline_stale(&self) -> bool {
        false
    }
}

/// A boxed policy is a policy: `Box<dyn EvictionPolicy + Send>` picks a
/// timed policy at run time without changing the pool's type.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::policy::BoxedPolicy;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, EvictionPolicy, Exponential, FixedTime};
///
/// let from_config = "exponential";
/// let policy: BoxedPolicy = match from_config {
///     "exponential" => Box::new(Exponential::new(Duration::from_secs(1))),
///     _ => Box::new(FixedTime::new(Duration::from_secs(1))),
/// };
/// let mut pool: DecayingPool<CheckingAllocator, BoxedPolicy> =
///     DecayingPool::new(CheckingAllocator::new(), policy);
/// let b = pool.allocate(64)?;
/// unsafe { pool.release(b, 64) };
/// # Ok(())
/// # }
/// ```
impl<P: EvictionPolicy + ?Sized> EvictionPolicy for Box<P> {
    #[inline]
    fn on_release(&mut self, now: Duration, size: usize, bytes_cached: usize) {
        (**self).on_release(now, size, bytes_cached)
    }

    #[inline]
    fn on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) {
        (**self).on_hit(now, size, before, after)
    }

    #[inline]
    fn try_on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) -> bool {
        (**self).try_on_hit(now, size, before, after)
    }

    #[inline]
    fn on_free(&mut self, now: Duration, size: usize, after: usize, reason: FreeReason) {
        (**self).on_free(now, size, after, reason)
    }

    #[inline]
    fn must_evict(&mut self, now: Duration, oldest: Oldest, bytes_cached: usize) -> bool {
        (**self).must_evict(now, oldest, bytes_cached)
    }

    #[inline]
    fn deadline(&self, oldest: Oldest) -> Option<Duration> {
        (**self).deadline(oldest)
    }

    #[inline]
    fn provisional_deadline(&self, oldest: Oldest) -> Option<Duration> {
        (**self).provisional_deadline(oldest)
    }

    #[inline]
    fn deadline_stale(&self) -> bool {
        (**self).deadline_stale()
    }
}

/// A timed policy chosen at run time.
pub type BoxedPolicy = Box<dyn EvictionPolicy + Send>;

/// Any policy, chosen at run time (from a config file or a flag), in one
/// pool type: a boxed timed policy or a [`FixedCapacity`] table.
///
/// A pool over `AnyPolicy` running a `FixedCapacity` table never reads the
/// clock either, but every store operation dispatches on the variant: pick
/// the concrete policy type where it is known at compile time.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::policy::AnyPolicy;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedCapacity, FixedTime};
///
/// fn pool_for(flag: &str) -> DecayingPool<CheckingAllocator, AnyPolicy> {
///     let policy = match flag {
///         "fixed" => AnyPolicy::from(FixedCapacity::new(64)),
///         _ => AnyPolicy::timed(FixedTime::new(Duration::from_secs(2))),
///     };
///     DecayingPool::new(CheckingAllocator::new(), policy)
/// }
/// let mut fixed = pool_for("fixed");
/// let mut timed = pool_for("ttl");
/// for pool in [&mut fixed, &mut timed] {
///     let b = pool.allocate(100)?;
///     unsafe { pool.release(b, 100) };
///     assert_eq!(pool.stats().blocks_cached, 1);
/// }
/// # Ok(())
/// # }
/// ```
pub enum AnyPolicy {
    /// A timed policy ([`FixedTime`], [`Exponential`], your own), boxed.
    Timed(BoxedPolicy),
    /// A fixed table of slots.
    Fixed(FixedCapacity),
}

impl AnyPolicy {
    /// Boxes a timed policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{policy::AnyPolicy, FixedTime};
    /// assert!(matches!(AnyPolicy::timed(FixedTime::default()), AnyPolicy::Timed(_)));
    /// ```
    pub fn timed(policy: impl EvictionPolicy + Send + 'static) -> Self {
        AnyPolicy::Timed(Box::new(policy))
    }
}

impl From<FixedCapacity> for AnyPolicy {
    fn from(policy: FixedCapacity) -> Self {
        AnyPolicy::Fixed(policy)
    }
}

impl From<BoxedPolicy> for AnyPolicy {
    fn from(policy: BoxedPolicy) -> Self {
        AnyPolicy::Timed(policy)
    }
}

impl core::fmt::Debug for AnyPolicy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AnyPolicy::Timed(_) => f.write_str("AnyPolicy::Timed(..)"),
            AnyPolicy::Fixed(p) => f.debug_tuple("AnyPolicy::Fixed").field(p).finish(),
        }
    }
}

/// Frees a block once it has been idle for the time-to-live or longer
/// (`now - released >= ttl`).
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedTime, ManualClock};
///
/// let clock = ManualClock::new();
/// let mut pool = DecayingPool::builder(CheckingAllocator::new())
///     .policy(FixedTime::new(Duration::from_secs(2)))
///     .clock(clock.clone())
///     .build();
/// let b = pool.allocate(4096).unwrap();
/// unsafe { pool.release(b, 4096) };
/// clock.advance(Duration::from_millis(1999));
/// assert_eq!(pool.collect(), 0);
/// clock.advance(Duration::from_millis(1));
/// assert_eq!(pool.collect(), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedTime {
    ttl: Duration,
}

impl FixedTime {
    /// Frees blocks idle for `ttl` or longer.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let p = decaying_pool::FixedTime::new(Duration::from_secs(1));
    /// assert_eq!(p.ttl(), Duration::from_secs(1));
    /// ```
    pub const fn new(ttl: Duration) -> Self {
        FixedTime { ttl }
    }

    /// The time-to-live.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// assert_eq!(decaying_pool::FixedTime::default().ttl(), Duration::from_secs(1));
    /// ```
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }
}

impl Default for FixedTime {
    /// One second.
    fn default() -> Self {
        FixedTime::new(Duration::from_secs(1))
    }
}

impl EvictionPolicy for FixedTime {
    #[inline]
    fn must_evict(&mut self, now: Duration, oldest: Oldest, _bytes_cached: usize) -> bool {
        oldest.idle(now) >= self.ttl
    }

    #[inline]
    fn deadline(&self, oldest: Oldest) -> Option<Duration> {
        Some(oldest.released_at.saturating_add(self.ttl))
    }
}

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

    /// The half-life: the old name of [`half_life`](Self::half_life).
    #[deprecated(
        since = "0.1.0",
        note = "renamed to `half_life` (no `get_` prefix on getters)"
    )]
    pub const fn get_half_life(&self) -> Duration {
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
/// A fixed table of `slots` cached blocks that never grows and needs no
/// clock: once full, every release evicts the oldest block of its probe
/// window.
///
/// The table is one open-addressing array of `slots` entries, allocated
/// when the pool is built. It has at most [`FixedCapacity::MAX_SLOTS`]
/// entries ([`new`](Self::new) clamps, [`try_new`](Self::try_new)
/// refuses), and building a pool never aborts for want of memory: if the
/// table cannot be allocated, the pool gets the largest of `slots / 2`,
/// `slots / 4`, … that can be (down to none, which caches nothing). A class
/// hashes to a home slot; its blocks live in the window of up to
/// [`FixedCapacity::WINDOW`] slots from there. Lookups always scan the
/// whole window, so a hit simply empties its entry (no tombstones, no
/// backward shift), and every operation is O(1) in the worst case. The scan
/// reads one tag byte per slot (six bits of the size's hash, and a mark on
/// the newest block of each size), sixteen at a time with SSE2 on x86-64
/// (eight in one word elsewhere), and only the entries whose tag matches;
/// under LIFO a hit after a hit of its size follows a link from the block
/// taken to the size's next newest, where it would compare stamps. `collect` is a
/// no-op; `trim` empties the table; `FixedCapacity::new(0)` caches nothing.
///
/// Each slot costs a record of the block, its size (8), a release stamp
/// and the two links of the age list (16), rounded up to a multiple of 32
/// bytes so that a hit touches one cache line for it; then the link to
/// its size's next newest block (4), and a tag byte, which also says
/// whether the slot holds a block: 37 bytes for a `NonNull` block or a
/// `u64` device pointer (every backend of this crate), 69 for a block of
/// 9 to 40 bytes.
///
/// # Blocks of one size
///
/// `slots` bounds the whole table; the window bounds each size class: at
/// most [`max_per_size`](Self::max_per_size) blocks of one class are
/// cached, by default `min(slots, WINDOW)` = 8. A 24th block of a size
/// released into `FixedCapacity::new(256)` evicts that class's oldest.
/// When a workload keeps many buffers of the same shape, raise the bound
/// with [`per_size`](Self::per_size) (each operation scans that many slots):
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedCapacity};
///
/// let policy = FixedCapacity::new(256).per_size(32);
/// assert_eq!(policy.max_per_size(), 32);
/// let mut pool = DecayingPool::new(CheckingAllocator::new(), policy);
/// let blocks: Vec<_> = (0..24).map(|_| pool.allocate(1 << 20).unwrap()).collect();
/// for b in blocks {
///     unsafe { pool.release(b, 1 << 20) };
/// }
/// assert_eq!((pool.stats().blocks_cached, pool.stats().evictions), (24, 0));
/// # Ok(())
/// # }
/// ```
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedCapacity};
///
/// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedCapacity::new(2));
/// let blocks: Vec<_> = (0..3).map(|_| pool.allocate(64).unwrap()).collect();
/// for b in blocks {
///     unsafe { pool.release(b, 64) };
/// }
/// let s = pool.stats();
/// assert_eq!((s.blocks_cached, s.evictions), (2, 1));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedCapacity {
    slots: usize,
    per_size: usize,
}

impl FixedCapacity {
    /// The default probe window: a class's blocks live within this many
    /// slots of its home slot, so at most this many blocks of one size are
    /// cached unless [`per_size`](Self::per_size) says otherwise.
    pub const WINDOW: usize = 8;

    /// The most entries a table may have: 2^20 (1,048,576), a table of
    /// tens of MiB. A fixed table this large would hold a million idle
    /// blocks of a costly allocator; a timed policy suits such a cache
    /// better.
    pub const MAX_SLOTS: usize = 1 << 20;

    /// A table of `slots` entries, at most [`FixedCapacity::MAX_SLOTS`]
    /// (a larger `slots` is clamped to it).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::FixedCapacity;
    /// assert_eq!(FixedCapacity::new(64).slots(), 64);
    /// assert_eq!(FixedCapacity::new(1 << 40).slots(), FixedCapacity::MAX_SLOTS);
    /// ```
    pub const fn new(slots: usize) -> Self {
        let slots = if slots > Self::MAX_SLOTS {
            Self::MAX_SLOTS
        } else {
            slots
        };
        FixedCapacity {
            slots,
            per_size: Self::WINDOW,
        }
    }

    /// A table of `slots` entries.
    ///
    /// # Errors
    ///
    /// [`TooManySlots`] when `slots` exceeds [`FixedCapacity::MAX_SLOTS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{policy::TooManySlots, FixedCapacity};
    /// assert_eq!(FixedCapacity::try_new(64).map(|p| p.slots()), Ok(64));
    /// assert_eq!(FixedCapacity::try_new(1 << 40), Err(TooManySlots { requested: 1 << 40 }));
    /// ```
    pub const fn try_new(slots: usize) -> Result<Self, TooManySlots> {
        if slots > Self::MAX_SLOTS {
            Err(TooManySlots { requested: slots })
        } else {
            Ok(FixedCapacity {
                slots,
                per_size: Self::WINDOW,
            })
        }
    }

    /// The number of entries in the table.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::FixedCapacity::new(0).slots(), 0);
    /// ```
    pub const fn slots(&self) -> usize {
        self.slots
    }

    /// Sets the most blocks of one size class the table holds: its probe
    /// window, [`WINDOW`](Self::WINDOW) (8) by default, at least 1 and at
    /// most `slots` (clamped). Every allocate and release scans the tags
    /// of this many slots, a group at a time (sixteen in one SSE2
    /// comparison on x86-64, eight in one word elsewhere), so past a group
    /// it is a cost as well as a bound: a window of one group takes the
    /// inlined path, a larger one a path out of line.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::FixedCapacity;
    /// assert_eq!(FixedCapacity::new(256).max_per_size(), 8);
    /// assert_eq!(FixedCapacity::new(256).per_size(24).max_per_size(), 24);
    /// assert_eq!(FixedCapacity::new(16).per_size(24).max_per_size(), 16);
    /// assert_eq!(FixedCapacity::new(16).per_size(0).max_per_size(), 1);
    /// ```
    #[must_use]
    pub const fn per_size(self, blocks: usize) -> Self {
        FixedCapacity {
            slots: self.slots,
            per_size: if blocks == 0 { 1 } else { blocks },
        }
    }

    /// The most blocks of one size class the table holds:
    /// `min(slots, per_size)` (see [`per_size`](Self::per_size)).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::FixedCapacity;
    /// assert_eq!(FixedCapacity::new(4).max_per_size(), 4);
    /// assert_eq!(FixedCapacity::new(1024).max_per_size(), FixedCapacity::WINDOW);
    /// ```
    pub const fn max_per_size(&self) -> usize {
        if self.per_size < self.slots {
            self.per_size
        } else {
            self.slots
        }
    }
}

/// Why [`FixedCapacity::try_new`] refused: more slots than
/// [`FixedCapacity::MAX_SLOTS`].
///
/// # Examples
///
/// ```
/// use decaying_pool::FixedCapacity;
/// let err = FixedCapacity::try_new(usize::MAX).unwrap_err();
/// assert_eq!(err.requested, usize::MAX);
/// assert!(err.to_string().contains("at most"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TooManySlots {
    /// The slot count asked for.
    pub requested: usize,
}

impl core::fmt::Display for TooManySlots {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "a FixedCapacity table of {} slots: at most {} are allowed",
            self.requested,
            FixedCapacity::MAX_SLOTS
        )
    }
}

impl std::error::Error for TooManySlots {}

/// Implemented by the stores for the policies they run (`store::timed`,
/// `store::fixed`).
pub(crate) mod sealed {
    pub trait Sealed {}
}

/// What a [`DecayingPool`](crate::DecayingPool) can run: every
/// [`EvictionPolicy`] (on the timed store) and [`FixedCapacity`] (on its
/// fixed table). Sealed: implement [`EvictionPolicy`] for a policy of your own.
pub trait Policy: sealed::Sealed {
    /// The cache store this policy runs on.
    #[doc(hidden)]
    type Store<B>: Store<B>;

    /// Builds the store.
    #[doc(hidden)]
    fn into_store<B>(self, reuse: Reuse) -> Self::Store<B>;
}

#[cfg(test)]
mod tests {
    use super::{EvictionPolicy, Exponential, Oldest, float};
    use core::time::Duration;

    /// A hit leaves the ratio as it is; a release sets it to `ratio + (1 -
    /// ratio) * (size / after)`, which leaves a ratio of 1 (the allowance
    /// is then the bytes cached) and makes one after an empty cache.
    #[test]
    fn a_hit_keeps_the_ratio_and_a_release_adds_its_size() {
        let mut p = Exponential::new(Duration::from_secs(1));
        let t = Duration::from_millis(3);
        p.on_release(Duration::ZERO, 3, 3);
        p.on_release(Duration::ZERO, 7, 10);
        p.on_release(Duration::ZERO, 11, 21);
        assert_eq!(p.ratio, 1.0);
        // A hit decays nothing: the ratio stays as of the last release.
        p.on_hit(t, 7, 21, 14);
        p.on_hit(t, 11, 14, 3);
        assert_eq!(p.ratio, 1.0);
        assert_eq!(p.at, Duration::ZERO);
        // The release decays it first, to no round number, then adds.
        p.on_release(t, 11, 14);
        let r = (-0.003f64).exp2();
        let expected = r + (1.0 - r) * (float(11) / float(14));
        assert_eq!(p.ratio.to_bits(), expected.to_bits());
        // Hits keep that ratio too.
        p.on_hit(t, 11, 14, 3);
        assert_eq!(p.ratio.to_bits(), expected.to_bits());
        // A hit that empties the cache, then a release: a ratio of 1.
        p.on_hit(t, 3, 3, 0);
        p.on_release(t, 5, 5);
        assert_eq!(p.ratio, 1.0);
        p.on_release(t, 1 << 40, (1 << 40) + 5);
        assert_eq!(p.ratio, 1.0);
    }

    /// Round trips at a stopped clock after a tick decayed the ratio take
    /// it back towards 1; the release that brings it within `NEAR_ONE`
    /// makes it exactly 1, where the releases after it compute nothing.
    /// (Rounded, the steps would stop `3.6e-15` below 1, short of it.)
    #[test]
    fn releases_take_a_decayed_ratio_to_exactly_one() {
        use super::NEAR_ONE;
        let (size, n) = (1024usize, 64usize);
        let bytes = size * n;
        let mut p = Exponential::new(Duration::from_secs(1));
        for i in 1..=n {
            p.on_release(Duration::ZERO, size, size * i);
        }
        assert_eq!(p.ratio, 1.0);
        let t = Duration::from_millis(1);
        let mut releases = 0;
        p.on_hit(t, size, bytes, bytes - size);
        // The next release would decay it first (a hit decays nothing).
        p.rebase(t);
        assert!(p.ratio < 1.0 - 1e-4, "decayed by a tick");
        while p.ratio != 1.0 {
            if releases > 0 {
                p.on_hit(t, size, bytes, bytes - size);
            }
            let before = p.ratio;
            p.on_release(t, size, bytes);
            releases += 1;
            let step = before + (1.0 - before) * (float(size) / float(bytes));
            if p.ratio == 1.0 {
                assert!(1.0 - step <= NEAR_ONE, "made 1 from {before:e}");
            } else {
                assert_eq!(p.ratio.to_bits(), step.to_bits(), "release {releases}");
                assert!(
                    p.ratio > before,
                    "release {releases}: stopped at {before:e}"
                );
            }
            assert!(
                releases < 2000,
                "{releases} releases: still at {:e}",
                p.ratio
            );
        }
        assert_eq!(releases, 1299);
        // At 1 the release compares the bytes with `limit`, and nothing more.
        assert!(p.limit > bytes);
        for _ in 0..10 {
            p.on_hit(t, size, bytes, bytes - size);
            p.on_release(t, size, bytes);
            assert_eq!(p.ratio, 1.0);
        }
    }

    /// Above a ratio of 1, with so many bytes cached beside `half` that the
    /// rounded allowance of a hit may come out over the clamp, a hit goes
    /// out of line (`try_on_hit` answers `false`) and `on_hit` checks the
    /// rounded product: here `(1 + 2^-52) * 2^60` rounds to `2^60 + 256`,
    /// over the clamp `2^60 + 64`, so the deadline is stale. At a ratio of
    /// 1 only a hit that empties the cache goes out of line.
    #[test]
    fn a_hit_near_the_clamp_goes_out_of_line_and_checks_it() {
        let t = Duration::ZERO;
        let bytes = 1usize << 60;
        let mut p = Exponential::new(Duration::from_secs(1));
        p.ratio = 1.0 + f64::EPSILON;
        p.half = 64.0;
        p.watch = 0.5;
        p.stale = false;
        p.oldest_size = 4096;
        p.set_hit_check(bytes + 128);
        assert!(!p.try_on_hit(t, 128, bytes + 128, bytes));
        p.on_hit(t, 128, bytes + 128, bytes);
        assert!(p.stale, "the rounded allowance is over the clamp");
        // At a ratio of 1 a hit computes nothing, unless it empties the
        // cache.
        p.ratio = 1.0;
        p.set_hit_check(bytes + 128);
        assert!(p.try_on_hit(t, 128, bytes + 128, bytes));
        assert!(!p.try_on_hit(t, 128, 128, 0));
    }

    /// A hit reported with nothing cached before it (which the pool never
    /// reports: a hit takes a cached block) has a ratio of NaN, which keeps
    /// no watch: `try_on_hit` leaves it to `on_hit` and changes nothing,
    /// whatever the watch.
    #[test]
    fn try_on_hit_leaves_a_hit_from_nothing_cached_to_on_hit() {
        let t = Duration::from_secs(1);
        let mut fresh = Exponential::new(Duration::from_secs(1));
        fresh.set_at(t);
        let mut planned = fresh;
        planned.on_release(t, 64, 64);
        planned.on_release(t, 64, 128);
        assert!(!planned.must_evict(
            t,
            Oldest {
                released_at: t,
                size: 64
            },
            128
        ));
        assert!(!planned.deadline_stale(), "a deadline planned");
        for p in [fresh, planned] {
            let mut q = p;
            assert!(!q.try_on_hit(t, 8, 0, 0));
            assert_eq!(q, p);
        }
    }

    /// `try_on_hit` either does what `on_hit` does, to the bit, or changes
    /// nothing and answers `false`; over random releases, hits,
    /// collections and clock steps (a stopped clock between most of them,
    /// so that deadlines are planned and hits take both answers).
    #[test]
    fn try_on_hit_does_what_on_hit_does_or_nothing() {
        use super::FreeReason;
        let mut next = crate::test_rng::rng(0x9e37_79b9_7f4a_7c15u64);
        let sizes = [8, 16, 64, 100, 4096];
        let (mut inline, mut out_of_line) = (0, 0);
        for half_life in [Duration::from_millis(5), Duration::from_secs(1)] {
            let mut p = Exponential::new(half_life);
            let mut q = p;
            let mut cached: Vec<Oldest> = Vec::new();
            let mut bytes = 0;
            let mut now = Duration::ZERO;
            for _ in 0..20_000 {
                match next(10) {
                    0..=3 => {
                        let size = sizes[next(sizes.len() as u64) as usize];
                        cached.push(Oldest {
                            released_at: now,
                            size,
                        });
                        bytes += size;
                        p.on_release(now, size, bytes);
                        q.on_release(now, size, bytes);
                    }
                    4..=7 if !cached.is_empty() => {
                        let block = cached.remove(next(cached.len() as u64) as usize);
                        let before = bytes;
                        bytes -= block.size;
                        p.on_hit(now, block.size, before, bytes);
                        let untouched = q;
                        if q.try_on_hit(now, block.size, before, bytes) {
                            inline += 1;
                        } else {
                            assert_eq!(q, untouched, "a `false` changed the policy");
                            q.on_hit(now, block.size, before, bytes);
                            out_of_line += 1;
                        }
                    }
                    8 => {
                        while let Some(&oldest) = cached.first() {
                            let due = p.must_evict(now, oldest, bytes);
                            assert_eq!(due, q.must_evict(now, oldest, bytes));
                            if !due {
                                break;
                            }
                            cached.remove(0);
                            bytes -= oldest.size;
                            p.on_free(now, oldest.size, bytes, FreeReason::Expired);
                            q.on_free(now, oldest.size, bytes, FreeReason::Expired);
                        }
                    }
                    _ => now += Duration::from_micros(next(300)),
                }
                assert_eq!(p, q);
                assert_eq!(p.ratio.to_bits(), q.ratio.to_bits());
            }
        }
        assert!(
            inline > 1000 && out_of_line > 1000,
            "{inline} / {out_of_line}"
        );
    }

    /// A long half-life, so that the deadlines of [`clamped`] (a 2^-23 of
    /// it ahead) are far more than a nanosecond.
    const LONG: Duration = Duration::from_secs(1 << 20);

    /// Blocks of `x`, `a` and `big` bytes released at one time, the first
    /// evicted half a half-life ([`LONG`]) later; the allowance is then
    /// clamped to `bytes + a / 2` (the next oldest is `a`), nothing is due,
    /// and a deadline is planned. Returns the policy, the bytes cached,
    /// the time and the oldest block.
    fn clamped(x: usize, a: usize, big: usize) -> (Exponential, usize, Duration, Oldest) {
        use super::FreeReason;
        let t0 = Duration::from_secs(1);
        let mut p = Exponential::new(LONG);
        p.set_at(t0);
        let mut bytes = 0;
        for size in [x, a, big] {
            bytes += size;
            p.on_release(t0, size, bytes);
        }
        let t1 = t0 + LONG / 2;
        let oldest = |size| Oldest {
            released_at: t0,
            size,
        };
        assert!(p.must_evict(t1, oldest(x), bytes));
        bytes -= x;
        p.on_free(t1, x, bytes, FreeReason::Expired);
        assert!(!p.must_evict(t1, oldest(a), bytes));
        let bound = bytes as f64 + (a / 2) as f64;
        assert_eq!(p.ratio, super::clamp_ratio(bound, bytes as f64));
        assert!(p.ratio * bytes as f64 <= bound);
        assert!(
            p.provisional_deadline(oldest(a))
                .is_some_and(|due| due > t1)
        );
        (p, bytes, t1, oldest(a))
    }

    /// Whether `p` holds a deadline for `oldest` at `now`; if so, asserts
    /// that a collection the pool skips then would have changed nothing:
    /// `must_evict` answers `false` and leaves the allowance as it was,
    /// unclamped (the model's check of every skipped collection).
    fn holds_and_skips_nothing(
        p: Exponential,
        now: Duration,
        oldest: Oldest,
        bytes: usize,
    ) -> bool {
        let Some(due) = p.provisional_deadline(oldest) else {
            return false;
        };
        assert!(now < due);
        let mut asked = p;
        assert!(!asked.must_evict(now, oldest, bytes));
        assert_eq!(
            asked.ratio.to_bits(),
            p.ratio.to_bits(),
            "with {bytes} bytes cached, a collection skipped until {due:?} clamps the ratio {} \
             to {}",
            p.ratio,
            asked.ratio
        );
        true
    }

    /// A clamp leaves the allowance on (or an ulp under) `bytes + half`
    /// with 2^63 bytes cached, where an ulp is 2048 bytes, and a deadline
    /// is planned; releases then move the ratio and round the allowance,
    /// which could leave it above the clamp. Two releases of each of many
    /// sizes from that state (300 under Miri, else 5000) either keep a
    /// deadline whose skipped collections would not clamp, or lose it.
    /// (With the allowance kept as a ratio, every one keeps it here; the
    /// allowance as a sum, before, lost it at the second release of 1025
    /// bytes.)
    #[test]
    fn a_release_from_a_clamped_allowance_keeps_only_a_deadline_that_holds() {
        let (p, bytes, now, oldest) = clamped(1 << 62, 1 << 40, (1 << 63) + 1);
        let (mut kept, mut lost) = (0, 0);
        // Fewer under Miri, which runs this a thousand times slower.
        let sizes = if cfg!(miri) { 300 } else { 5000 };
        for size in (1..=sizes).map(|i| 1000 + 7 * i) {
            let mut q = p;
            let mut b = bytes;
            let mut held = true;
            for _ in 0..2 {
                b += size;
                q.on_release(now, size, b);
                held &= holds_and_skips_nothing(q, now, oldest, b);
            }
            if held {
                kept += 1;
            } else {
                lost += 1;
            }
        }
        assert!(kept > 0, "{kept} kept, {lost} lost");
    }

    /// The same for a hit: with the allowance clamped to `bytes + half`,
    /// 2^61.7 bytes cached (an ulp of 512) and a `half` that is no
    /// multiple of an ulp, the ratio is above 1, so a hit checks the
    /// product of the ratio and the bytes left (rounded) against the clamp
    /// at `after`. Every hit of 1 byte to about 2^52 bytes (300 sizes
    /// under Miri, else 5000) from that state either keeps a deadline
    /// whose skipped collections would not clamp, or loses it. (The ratio
    /// is clamped so that its product with the bytes is within the clamp;
    /// in these runs every hit keeps the deadline.)
    #[test]
    fn a_hit_from_a_clamped_allowance_keeps_only_a_deadline_that_holds() {
        let (p, bytes, now, oldest) =
            clamped(1 << 62, 2_459_860_883_968, 3_768_991_187_054_580_519);
        let (mut kept, mut lost) = (0, 0);
        // Fewer under Miri, which runs this a thousand times slower.
        let sizes = if cfg!(miri) { 300 } else { 5000 };
        for i in 1..=sizes {
            // Sizes from one byte to about 2^52, where an ulp of the
            // product is no longer small beside the clamp's slack.
            let size = i * i * i * 1_000_000 / 31;
            let size = size.max(i);
            let mut q = p;
            let after = bytes - size;
            if !q.try_on_hit(now, size, bytes, after) {
                q.on_hit(now, size, bytes, after);
            }
            if holds_and_skips_nothing(q, now, oldest, after) {
                kept += 1;
            } else {
                lost += 1;
            }
        }
        assert!(kept > 0, "{kept} kept, {lost} lost");
    }

    /// Planning backs off while releases make each plan stale before the
    /// next collection with the clock moving, and plans again at every
    /// collection once a plan lasts.
    #[test]
    fn plans_back_off_while_releases_kill_them() {
        let h = Duration::from_secs(1000);
        let mut p = Exponential::new(h);
        let oldest = Oldest {
            released_at: Duration::ZERO,
            size: 4096,
        };
        let mut bytes = 4096;
        p.on_release(Duration::ZERO, 4096, bytes);
        let mut planned = Vec::new();
        for i in 1..=40u64 {
            let now = Duration::from_micros(i);
            assert!(!p.must_evict(now, oldest, bytes));
            planned.push(p.provisional_deadline(oldest).is_some());
            // A release of a block of a quarter of the cache or more: the
            // deadline comes sooner, by more than a plan leaves in hand.
            let size = (bytes / 4).max(1 << 20);
            bytes += size;
            p.on_release(now, size, bytes);
            assert!(p.deadline_stale());
        }
        let plans = planned.iter().filter(|&&x| x).count();
        assert!(planned[0] && planned[1], "{planned:?}");
        assert!(plans <= 8, "{plans} plans in 40 collections: {planned:?}");
        // Without releases, the plan made after the backoff lasts until
        // the pool asks again, which resets it: every collection plans.
        let mut now = Duration::from_micros(41);
        let mut lasted = 0;
        for _ in 0..200 {
            now += Duration::from_micros(1);
            if p.must_evict(now, oldest, bytes) {
                break;
            }
            if p.provisional_deadline(oldest).is_some() {
                lasted += 1;
                assert!(!p.deadline_stale());
                assert!(!p.must_evict(now, oldest, bytes));
                assert!(p.provisional_deadline(oldest).is_some());
            }
        }
        assert!(lasted > 100, "{lasted}");
    }

    /// The hooks tell a later time from an earlier one beyond 584 years,
    /// where whole nanoseconds no longer fit a `u64`.
    #[test]
    fn the_allowance_decays_beyond_584_years() {
        let mut p = Exponential::new(Duration::from_secs(1));
        let far = Duration::from_secs(u64::MAX / 2);
        p.on_release(far, 8, 8);
        p.on_release(far, 8, 16);
        assert_eq!(p.ratio * 16.0, 16.0);
        p.on_release(far + Duration::from_secs(1), 8, 24);
        assert_eq!(p.ratio * 24.0, 16.0);
        assert_eq!(p.at, far + Duration::from_secs(1));
        p.on_release(far + Duration::from_secs(1), 8, 32);
        assert_eq!(p.ratio * 32.0, 24.0);
    }

    /// The signed conversion rounds every `usize` as `as f64` does,
    /// including above `i64::MAX` and at the halfway points of `f64`.
    #[test]
    fn float_rounds_as_the_unsigned_conversion() {
        let mut edges = vec![0usize, 1, 2, (1 << 53) - 1, 1 << 53, (1 << 53) + 1];
        for top in [i64::MAX as usize, usize::MAX] {
            // Fewer under Miri, which runs this a thousand times slower.
            for d in 0..if cfg!(miri) { 16 } else { 2050usize } {
                edges.push(top - d);
            }
        }
        for k in 54..64 {
            let base = 1usize << k;
            let ulp = 1usize << (k - 52);
            for x in [
                base + ulp / 2,
                base + ulp / 2 + 1,
                base + ulp + ulp / 2,
                base - 1,
            ] {
                edges.push(x);
            }
        }
        let mut x: u64 = 1;
        for _ in 0..if cfg!(miri) { 500 } else { 100_000 } {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            edges.push(x as usize);
            edges.push((x >> (x % 64)) as usize);
        }
        for v in edges {
            assert_eq!(float(v).to_bits(), (v as f64).to_bits(), "{v}");
        }
    }

    /// A release below `steady` stores its ratio and nothing else, so the
    /// watch it keeps must still hold at the new ratio: after every
    /// operation of caches of a few thousand mixed blocks, a clock that
    /// ticks every few hundred round trips (decaying the ratio below 1,
    /// and the blocks that decay frees leaving it above 1), a watch still
    /// kept satisfies `ratio * bytes > (bytes - half) * watch` (up to the
    /// rounding of the test itself) and sits within the clamp, and every
    /// collection its deadline lets the pool skip decides nothing (a copy
    /// of the policy asked `must_evict` answers `false`). Also counts that
    /// releases took the early return both below and above a ratio of 1.
    #[test]
    #[cfg_attr(miri, ignore)] // thousands of steps of safe arithmetic: too slow under Miri
    fn a_kept_watch_holds_after_releases_near_a_ratio_of_one() {
        use super::FreeReason;
        use std::collections::VecDeque;
        let mut next = crate::test_rng::rng(0x2545_f491_4f6c_dd1du64);
        let (mut early_below, mut early_above, mut kept) = (0u32, 0u32, 0u32);
        // `steady` claims no more than it should: with a watch kept, the
        // watch holds just below it at the ratio now (below 1) or at 1
        // (from 1 up, where the allowance is also within the clamp).
        let steady_holds = |p: &Exponential, case: u32, step: u64| {
            if p.stale || p.steady == 0 || p.steady == usize::MAX {
                return;
            }
            let b = float(p.steady - 1);
            let at = p.ratio.min(1.0);
            assert!(
                at * b >= (b - p.half) * p.watch * (1.0 - 1e-14),
                "case {case} step {step}: the watch fails below `steady` \
                 (ratio {:e}, steady {}, half {}, watch {:e})",
                p.ratio,
                p.steady,
                p.half,
                p.watch
            );
            assert!((p.ratio - 1.0) * b + 1e-14 * b <= p.half);
        };
        for case in 0..24u32 {
            let mut p = Exponential::new(Duration::from_millis(100 + next(2000)));
            // Sizes oldest first (the policy reads only the oldest's size).
            let mut cache: VecDeque<usize> = VecDeque::new();
            let mut bytes = 0usize;
            let mut now = Duration::ZERO;
            for _ in 0..500 + next(3000) {
                let s = 512 + next(4096) as usize;
                bytes += s;
                cache.push_back(s);
                p.on_release(now, s, bytes);
            }
            let tick = 50 + next(500);
            for step in 0..6000u64 {
                if step % tick == 0 {
                    now += Duration::from_micros(200 + next(1000));
                }
                // Collect, as the pool does: skip while a deadline holds.
                while let Some(&size) = cache.front() {
                    let oldest = Oldest {
                        released_at: Duration::ZERO,
                        size,
                    };
                    if let Some(due) = p.provisional_deadline(oldest) {
                        if now < due {
                            let mut q = p;
                            assert!(
                                !q.must_evict(now, oldest, bytes),
                                "case {case} step {step}: a deadline skipped a due block"
                            );
                            break;
                        }
                    }
                    if !p.must_evict(now, oldest, bytes) {
                        break;
                    }
                    cache.pop_front();
                    bytes -= size;
                    p.on_free(now, size, bytes, FreeReason::Expired);
                }
                steady_holds(&p, case, step);
                // A hit of the newest block, then a release of another size.
                if let Some(s) = cache.pop_back() {
                    let before = bytes;
                    bytes -= s;
                    p.on_hit(now, s, before, bytes);
                }
                let s = 512 + next(4096) as usize;
                bytes += s;
                cache.push_back(s);
                let (ratio, steady) = (p.ratio, p.steady);
                p.on_release(now, s, bytes);
                if bytes < steady && p.at == now && ratio != p.ratio {
                    if ratio < 1.0 {
                        early_below += 1;
                    } else {
                        early_above += 1;
                    }
                }
                steady_holds(&p, case, step);
                if !p.stale {
                    kept += 1;
                    let b = float(bytes);
                    assert!(
                        p.ratio * b >= (b - p.half) * p.watch * (1.0 - 1e-14),
                        "case {case} step {step}: a kept watch that does not hold \
                         (ratio {:e}, bytes {bytes}, half {}, watch {:e})",
                        p.ratio,
                        p.half,
                        p.watch
                    );
                    assert!(p.ratio * b <= b + p.half, "case {case} step {step}");
                }
            }
        }
        assert!(
            early_below > 1000 && early_above > 1000 && kept > 10_000,
            "the releases took the early return {early_below} times below a ratio \
             of 1 and {early_above} above, with a watch kept {kept} times"
        );
    }
}
