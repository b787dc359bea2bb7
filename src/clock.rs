//! Time sources for decay.

use core::time::Duration;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A monotonic time source with an arbitrary origin.
///
/// The pool reads it at most once per `allocate`, `release` or `collect`.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::Clock;
///
/// struct Frozen(Duration);
/// impl Clock for Frozen {
///     fn now(&self) -> Duration { self.0 }
/// }
/// assert_eq!(Frozen(Duration::from_secs(3)).now(), Duration::from_secs(3));
/// ```
pub trait Clock {
    /// The current time. Never goes backwards.
    fn now(&self) -> Duration;

    /// The current time in whole nanoseconds since the clock's origin,
    /// saturating at `u64::MAX` (584 years): what the pool reads.
    ///
    /// The default converts [`now`](Clock::now). A clock that counts
    /// nanoseconds natively overrides it and spares the pool's hot path two
    /// conversions; both must tell the same time.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::Clock;
    ///
    /// struct Frozen(Duration);
    /// impl Clock for Frozen {
    ///     fn now(&self) -> Duration { self.0 }
    /// }
    /// assert_eq!(Frozen(Duration::from_millis(3)).now_nanos(), 3_000_000);
    /// ```
    #[inline]
    fn now_nanos(&self) -> u64 {
        saturating_nanos(self.now())
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Duration {
        (**self).now()
    }

    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> Duration {
        (**self).now()
    }

    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }
}

/// Real monotonic time, cheap to read: the default clock.
///
/// On Linux and Android this is `CLOCK_MONOTONIC_COARSE`, read from the vDSO
/// in a few nanoseconds; its resolution is the kernel tick (1 to 4 ms on
/// common kernels; [`MonotonicClock::resolution`] tells). That is ample for
/// time-to-live values of tens of milliseconds and up, which is what decay
/// of costly memory uses. Elsewhere it is [`std::time::Instant`] measured
/// from the first read in the process. For sub-millisecond decay use
/// [`PreciseClock`].
///
/// # Examples
///
/// ```
/// use decaying_pool::{Clock, MonotonicClock};
///
/// let a = MonotonicClock.now();
/// let b = MonotonicClock.now();
/// assert!(b >= a);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonotonicClock;

impl MonotonicClock {
    /// The granularity of [`MonotonicClock::now`] on this machine.
    ///
    /// # Examples
    ///
    /// ```
    /// let res = decaying_pool::MonotonicClock::resolution();
    /// assert!(res <= core::time::Duration::from_millis(100));
    /// ```
    pub fn resolution() -> Duration {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec; the clock id is a
            // constant the kernel knows.
            let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
            if rc == 0 {
                return Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
            }
            Duration::from_nanos(1)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            Duration::from_nanos(1)
        }
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }

    #[inline]
    fn now_nanos(&self) -> u64 {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC_COARSE
            // exists on every Linux since 2.6.32 and cannot fail with a valid pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
            (ts.tv_sec as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(ts.tv_nsec as u64)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            PreciseClock.now_nanos()
        }
    }
}

/// Monotonic time from [`std::time::Instant`], measured from the first read
/// in the process: nanosecond resolution, about 20 ns a read.
///
/// # Examples
///
/// ```
/// use decaying_pool::{Clock, PreciseClock};
///
/// let a = PreciseClock.now();
/// std::thread::sleep(std::time::Duration::from_millis(1));
/// assert!(PreciseClock.now() > a);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreciseClock;

impl Clock for PreciseClock {
    #[inline]
    fn now(&self) -> Duration {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(std::time::Instant::now).elapsed()
    }
}

/// A clock that moves only when told: a shared handle for tests, replays
/// and simulations.
///
/// Clones share the same time, so a test keeps one handle and gives the
/// pool another. It starts at zero; the time is kept in whole nanoseconds
/// (up to about 584 years) and saturates beyond.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let seen_by_pool = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(seen_by_pool.now(), Duration::from_millis(1500));
/// clock.set(Duration::from_secs(10));
/// assert_eq!(seen_by_pool.now(), Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl ManualClock {
    /// A new clock at time zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{Clock, ManualClock};
    /// assert_eq!(ManualClock::new().now(), core::time::Duration::ZERO);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves every clone of this clock forward by `by`.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{Clock, ManualClock};
    /// let c = ManualClock::new();
    /// c.advance(Duration::from_secs(1));
    /// c.advance(Duration::from_secs(1));
    /// assert_eq!(c.now(), Duration::from_secs(2));
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets every clone of this clock to `to`.
    ///
    /// A clock is monotonic: setting it back in time is allowed (for tests)
    /// but a pool treats blocks released "in the future" as idle for zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{Clock, ManualClock};
    /// let c = ManualClock::new();
    /// c.set(Duration::from_millis(250));
    /// assert_eq!(c.now(), Duration::from_millis(250));
    /// ```
    pub fn set(&self, to: Duration) {
        self.nanos.store(saturating_nanos(to), Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }

    #[inline]
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::Relaxed)
    }
}
