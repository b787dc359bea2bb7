//! [`FixedTime`]: a block goes back once idle for a time-to-live.

use core::time::Duration;

use super::{EvictionPolicy, Oldest};

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
