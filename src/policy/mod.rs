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

mod any;
mod exponential;
mod fixed_capacity;
mod fixed_time;

pub use any::{AnyPolicy, BoxedPolicy};
pub use exponential::Exponential;
// The fuzzing model (`fuzzing::model`) computes the ratio as the policy does.
#[cfg(feature = "fuzzing")]
pub(crate) use exponential::{NEAR_ONE, clamp_ratio};
pub use fixed_capacity::{FixedCapacity, TooManySlots};
pub use fixed_time::FixedTime;

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
