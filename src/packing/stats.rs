//! Counters of what the packing layer did.

use core::fmt;

use crate::stats::HumanBytes;

/// A snapshot of a [`PackedPool`](crate::PackedPool)'s packing counters:
/// the segment-level figures, beside the caller-level
/// [`Stats`](crate::Stats) of [`PackedPool::stats`](crate::PackedPool::stats)
/// (the exact pool underneath, where segments and large blocks are its
/// blocks, has its own: `pool().stats()`).
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

/// A summary a person reads, beside the caller-level
/// [`Stats`](crate::Stats) of the same pool: requests by how they were
/// served, the segments held (current and peak bytes), how full they are,
/// and the large blocks served from a larger class.
///
/// # Examples
///
/// ```
/// use decaying_pool::{DecayingPool, Packing, SystemAllocator};
///
/// let mut pool = DecayingPool::builder(SystemAllocator::new()).packing(Packing::default()).build();
/// let a = pool.allocate(1000)?;
/// let text = pool.packing_stats().to_string();
/// assert!(text.contains("requests: 1 (1 carved, 0 exact, 0 exact fallbacks)"), "{text}");
/// assert!(text.contains("segments: 1 held (1 created, 0 released)"), "{text}");
/// assert!(text.contains("carved: 1 blocks in 1.00 KiB"), "{text}");
/// assert!(text.contains("requested by the blocks held: 1000 B (peak 1000 B)"), "{text}");
/// // SAFETY: `a` came from this pool with this size and is not used again.
/// unsafe { pool.release(a, 1000) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl fmt::Display for PackingStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = HumanBytes;
        let full = if self.segment_bytes == 0 {
            0.0
        } else {
            self.packed_bytes as f64 * 100.0 / self.segment_bytes as f64
        };
        writeln!(f, "PackedPool packing statistics")?;
        writeln!(
            f,
            "  requests: {} ({} carved, {} exact, {} exact fallbacks)",
            self.requests, self.carved, self.exact, self.exact_fallbacks
        )?;
        writeln!(
            f,
            "  segments: {} held ({} created, {} released), {} (peak {})",
            self.segments,
            self.segments_created,
            self.segments_released,
            h(self.segment_bytes),
            h(self.peak_segment_bytes)
        )?;
        writeln!(
            f,
            "  carved: {} blocks in {}, free inside segments {} ({full:.1}% full)",
            self.packed_blocks,
            h(self.packed_bytes),
            h(self.free_segment_bytes)
        )?;
        writeln!(
            f,
            "  requested by the blocks held: {} (peak {})",
            h(self.bytes_requested),
            h(self.peak_bytes_requested)
        )?;
        write!(
            f,
            "  large blocks from a larger class: {} served, {} beyond their classes held",
            self.larger_reuses,
            h(self.oversize_bytes)
        )
    }
}
