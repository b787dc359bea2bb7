//! Counters of what a pool did.

/// A snapshot of a pool's counters, from [`DecayingPool::stats`](crate::DecayingPool::stats).
///
/// Sizes are class sizes (what the backing allocator was asked for), not
/// the sizes callers requested. The counters always agree:
/// `hits + misses` is the number of successful `allocate` calls, `misses ==
/// backing_allocs`, `bytes_reserved == bytes_in_use + bytes_cached`, and
/// `backing_allocs - backing_deallocs == blocks_in_use + blocks_cached`.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedTime};
/// use core::time::Duration;
///
/// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::new(Duration::from_secs(1)));
/// let a = pool.allocate(100).unwrap();
/// unsafe { pool.release(a, 100) };
/// let b = pool.allocate(100).unwrap();
/// let s = pool.stats();
/// assert_eq!((s.hits, s.misses, s.backing_allocs), (1, 1, 1));
/// assert_eq!((s.bytes_in_use, s.bytes_cached, s.bytes_reserved), (100, 0, 100));
/// unsafe { pool.release(b, 100) };
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Successful `allocate` calls served from the cache.
    pub hits: u64,
    /// Successful `allocate` calls served by the backing allocator.
    pub misses: u64,
    /// Cached blocks freed by the eviction policy (decay, or a full
    /// fixed-capacity window).
    pub evictions: u64,
    /// Cached blocks freed by `trim`, the byte limit or the out-of-memory retry.
    pub trimmed: u64,
    /// Successful backing `allocate` calls.
    pub backing_allocs: u64,
    /// Backing `deallocate` calls.
    pub backing_deallocs: u64,
    /// Backing `allocate` calls that failed.
    pub backing_failures: u64,
    /// Blocks handed out and not yet released.
    pub blocks_in_use: u64,
    /// Blocks idle in the cache.
    pub blocks_cached: u64,
    /// Bytes handed out and not yet released.
    pub bytes_in_use: usize,
    /// Bytes idle in the cache.
    pub bytes_cached: usize,
    /// Bytes held from the backing allocator: `bytes_in_use + bytes_cached`.
    pub bytes_reserved: usize,
    /// The highest `bytes_reserved` seen.
    pub peak_bytes_reserved: usize,
    /// The highest `bytes_in_use` seen.
    pub peak_bytes_in_use: usize,
    /// Bytes served by hits, summed over all hits.
    pub bytes_from_pool: usize,
    /// Bytes served by misses, summed over all misses.
    pub bytes_from_backing: usize,
}

impl Stats {
    /// The fraction of successful allocations served from the cache, or 0
    /// when nothing was allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// let s = decaying_pool::Stats { hits: 3, misses: 1, ..Default::default() };
    /// assert_eq!(s.hit_rate(), 0.75);
    /// ```
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}
