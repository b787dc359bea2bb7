//! Time sources for decay.

use core::time::Duration;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
/// A read is one atomic load of a process-wide time that a background
/// thread (`decaying-pool-clock`) publishes every millisecond from
/// `CLOCK_MONOTONIC` (on other systems, [`std::time::Instant`]). So a
/// reading lags real time by less than [`MonotonicClock::resolution`]
/// (1 ms) plus however long the scheduler keeps that thread waiting: blocks
/// decay that much late, never early. That is ample for time-to-live values
/// of tens of milliseconds and up, which is what decay of costly memory
/// uses; for sub-millisecond decay use [`PreciseClock`].
///
/// The thread starts on the first read, sleeps between ticks, and parks
/// itself after 100 ms without a read; the next read reads the system clock
/// directly and wakes it. In a child process after `fork` (where the thread
/// does not exist), and under Miri, every read goes to the system clock.
/// Readings never go backwards.
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
    /// How far a reading of [`MonotonicClock`] can lag the system clock,
    /// beyond scheduling delays: the publishing thread's tick, 1 ms.
    ///
    /// # Examples
    ///
    /// ```
    /// let res = decaying_pool::MonotonicClock::resolution();
    /// assert_eq!(res, core::time::Duration::from_millis(1));
    /// ```
    pub fn resolution() -> Duration {
        ticker::TICK
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }

    #[inline]
    fn now_nanos(&self) -> u64 {
        ticker::now()
    }
}

/// The system's monotonic clock, read directly, in nanoseconds.
fn system_nanos() -> u64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists
        // on every Linux and cannot fail with a valid pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        PreciseClock.now_nanos()
    }
}

/// The published time behind [`MonotonicClock`].
///
/// `NOW` holds the latest time in nanoseconds, a multiple of 4, with bit 0
/// set while the ticker thread is publishing and bit 1 set by each tick
/// until a reader clears it (so the ticker knows it was read). It only
/// grows (`fetch_max`), except for clearing those bits, so readings (with
/// both bits masked) never go backwards. A read is one load and one
/// comparison, except the first of each tick, which clears bit 1. A reader
/// that finds bit 0 clear reads the system clock, publishes that, and wakes
/// the ticker.
mod ticker {
    use core::time::Duration;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::thread::{self, Thread};

    /// How often the ticker publishes.
    pub(super) const TICK: Duration = Duration::from_millis(1);

    /// Ticks without a read before the ticker parks.
    const IDLE_TICKS: u32 = 100;

    static NOW: AtomicU64 = AtomicU64::new(0);
    /// Bit 0 of `NOW`: the ticker is publishing.
    const TICKING: u64 = 1;
    /// Bit 1 of `NOW`: not read since the last tick.
    const UNREAD: u64 = 2;
    /// Both.
    const FLAGS: u64 = TICKING | UNREAD;
    /// No ticker in this process (a forked child, or it could not start).
    static DISABLED: AtomicBool = AtomicBool::new(cfg!(miri));
    static TICKER: OnceLock<Option<Thread>> = OnceLock::new();

    #[inline(always)]
    pub(super) fn now() -> u64 {
        let v = NOW.load(Relaxed);
        if v & FLAGS == TICKING {
            return v & !FLAGS;
        }
        first_read(v)
    }

    /// A read that found `v` unread since the last tick, or not published
    /// by the ticker.
    #[cold]
    #[inline(never)]
    fn first_read(v: u64) -> u64 {
        if v & TICKING != 0 {
            NOW.fetch_and(!UNREAD, Relaxed);
            return v & !FLAGS;
        }
        read_system()
    }

    /// Reads the system clock, publishes it and wakes the ticker.
    #[cold]
    #[inline(never)]
    fn read_system() -> u64 {
        let t = super::system_nanos() & !FLAGS;
        let before = NOW.fetch_max(t, Relaxed) & !FLAGS;
        if !DISABLED.load(Relaxed) {
            match TICKER.get_or_init(start) {
                Some(ticker) => ticker.unpark(),
                None => DISABLED.store(true, Relaxed),
            }
        }
        t.max(before)
    }

    fn start() -> Option<Thread> {
        #[cfg(unix)]
        {
            extern "C" fn in_child() {
                DISABLED.store(true, Relaxed);
                NOW.fetch_and(!TICKING, Relaxed);
            }
            // SAFETY: `in_child` is a plain function that only touches
            // atomics, which is async-signal-safe, as a fork handler must be.
            if unsafe { libc::pthread_atfork(None, None, Some(in_child)) } != 0 {
                return None;
            }
        }
        thread::Builder::new()
            .name("decaying-pool-clock".into())
            .spawn(run)
            .ok()
            .map(|handle| handle.thread().clone())
    }

    /// The ticker thread: publishes every tick, parks when nobody reads.
    fn run() {
        let mut idle = 0;
        loop {
            NOW.fetch_max((super::system_nanos() & !FLAGS) | FLAGS, Relaxed);
            thread::sleep(TICK);
            // A reader cleared `UNREAD`, or read the system clock and
            // published a later time without it.
            if NOW.load(Relaxed) & UNREAD == 0 {
                idle = 0;
            } else {
                idle += 1;
                if idle >= IDLE_TICKS {
                    // Readers now read the system clock and unpark us.
                    NOW.fetch_and(!TICKING, Relaxed);
                    thread::park();
                    idle = 0;
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Readings never go backwards and are never ahead of the system
    /// clock, from several threads at once, across the ticker's start.
    #[test]
    fn monotonic_clock_is_monotonic_and_never_ahead() {
        let threads: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    let mut last = 0;
                    for i in 0..20_000u32 {
                        let t = MonotonicClock.now_nanos();
                        assert!(t >= last, "went back from {last} to {t}");
                        assert!(t <= system_nanos(), "ahead of the system clock");
                        last = t;
                        if i % 5_000 == 0 {
                            std::thread::sleep(Duration::from_millis(3));
                        }
                    }
                    last
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().expect("a reader panicked") > 0);
        }
    }

    /// The reading follows real time: it covers 40 ms of a sleep well
    /// within 10 s (a loaded machine may delay the ticker, not stop it).
    #[test]
    fn monotonic_clock_follows_real_time() {
        let a = MonotonicClock.now();
        let start = std::time::Instant::now();
        while MonotonicClock.now() - a < Duration::from_millis(40) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the clock stopped at {:?}",
                MonotonicClock.now()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn now_nanos_agrees_with_now() {
        let clock = ManualClock::new();
        clock.set(Duration::new(3, 5));
        assert_eq!(clock.now_nanos(), 3_000_000_005);
        assert_eq!(Clock::now(&clock), Duration::new(3, 5));
        assert_eq!(Clock::now_nanos(&&clock), 3_000_000_005);
        assert_eq!(Arc::new(clock).now_nanos(), 3_000_000_005);
    }
}
