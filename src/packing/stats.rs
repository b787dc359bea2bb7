//! Counters of what the packing layer did.

/// A snapshot of a [`PackedPool`](crate::PackedPool)'s packing counters,
/// beside the exact pool's [`Stats`](crate::Stats) (where segments and
/// large blocks are counted as blocks).
///
/// The counters agree: `requests == carved + exact + exact_fallbacks`,
/// `segments_created - segments_released == segments`,
/// `segment_bytes == packed_bytes + free_segment_bytes`, and
/// `bytes_requested` is the sum of the sizes callers asked for, over the
/// blocks they still hold (packed and exact).
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, Packing};
///
/// let mut pool = DecayingPool::builder(CheckingAllocator::with_addresses())
///     .packing(Packing::default())
///     .build();
/// let a = pool.allocate(1000)?;
/// let s = pool.packing_stats();
/// assert_eq!((s.carved, s.segments, s.packed_blocks), (1, 1, 1));
/// assert_eq!((s.bytes_requested, s.packed_bytes), (1000, 1024));
/// assert_eq!(s.segment_bytes, s.packed_bytes + s.free_segment_bytes);
/// unsafe { pool.release(a, 1000) };
/// assert_eq!(pool.packing_stats().segments, 0); // the empty segment went back to the pool
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PackingStats {
    /// Successful `allocate` calls.
    pub requests: u64,
    /// Requests carved from a segment.
    pub carved: u64,
    /// Requests above the medium threshold (or larger than any allowed
    /// segment), served as exact blocks of the pool.
    pub exact: u64,
    /// Packable requests served as exact blocks because no segment could
    /// be had (the backing allocator or the limit refused one).
    pub exact_fallbacks: u64,
    /// Segments taken from the pool.
    pub segments_created: u64,
    /// Emptied segments given back to the pool.
    pub segments_released: u64,
    /// Segments held now.
    pub segments: u64,
    /// Bytes in the segments held now.
    pub segment_bytes: usize,
    /// The highest `segment_bytes` seen.
    pub peak_segment_bytes: usize,
    /// Carved blocks handed out and not yet released.
    pub packed_blocks: u64,
    /// Bytes in carved blocks handed out (rounded to the granularity).
    pub packed_bytes: usize,
    /// Bytes inside segments not handed out: `segment_bytes - packed_bytes`
    /// (the fragmentation the packing costs).
    pub free_segment_bytes: usize,
    /// Bytes callers asked for, over the blocks they hold now (packed and
    /// exact).
    pub bytes_requested: usize,
    /// The highest `bytes_requested` seen.
    pub peak_bytes_requested: usize,
    /// Large requests served by a cached block of a larger class than
    /// their own (see [`Packing::large_fit`](crate::Packing::large_fit)).
    pub larger_reuses: u64,
    /// Bytes the large blocks handed out from a larger class hold beyond
    /// their requests' classes.
    pub oversize_bytes: usize,
}
