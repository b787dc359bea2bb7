//! Counters of what a pool did.

use core::fmt;

/// A snapshot of a pool's counters, from [`DecayingPool::stats`](crate::DecayingPool::stats).
///
/// Sizes are class sizes (what the backing allocator was asked for), not
/// the sizes callers requested. The counters always agree:
/// `hits + misses` is the number of successful `allocate` calls, `misses ==
/// backing_allocs`, `bytes_reserved == bytes_in_use + bytes_cached`, and
/// `backing_allocs - backing_deallocs == blocks_in_use + blocks_cached`.
///
/// `Display` prints a summary for people (see the `impl Display`).
/// With the **`serde`** feature, `Stats` is `Serialize` and `Deserialize`;
/// a field missing from an older snapshot reads as zero.
///
/// `Stats` is `#[non_exhaustive]`: later versions add counters. Read its
/// fields; to build one (a test's expected value), start from
/// `Stats::default()` and set the fields you need.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
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
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Stats {
    /// Successful `allocate` calls served from the cache.
    pub hits: u64,
    /// Successful `allocate` calls served by the backing allocator.
    pub misses: u64,
    /// Cached blocks freed by the eviction policy (decay, or a full
    /// fixed-capacity window) or by the garbage-collection threshold
    /// ([`Builder::gc_threshold`](crate::Builder::gc_threshold)).
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
    /// Bytes the callers asked for, summed over all successful `allocate`
    /// calls: `bytes_from_pool + bytes_from_backing - bytes_requested` is
    /// what rounding to size classes wasted.
    pub bytes_requested: usize,
    /// Pages the backing allocator created ([`MappedStats::pages_created`](crate::pages::MappedStats::pages_created)).
    /// Zero unless the backing allocator maps pages
    /// ([`pages::Mapped`](crate::pages::Mapped)).
    pub pages_created: u64,
    /// Pages the backing allocator released, their memory given back
    /// ([`MappedStats::pages_released`](crate::pages::MappedStats::pages_released)).
    /// Zero unless the backing allocator maps pages
    /// ([`pages::Mapped`](crate::pages::Mapped)).
    pub pages_released: u64,
    /// Runs of pages the backing allocator mapped
    /// ([`MappedStats::maps`](crate::pages::MappedStats::maps)).
    /// Zero unless the backing allocator maps pages
    /// ([`pages::Mapped`](crate::pages::Mapped)).
    pub page_maps: u64,
    /// Runs of pages the backing allocator unmapped
    /// ([`MappedStats::unmaps`](crate::pages::MappedStats::unmaps)).
    /// Zero unless the backing allocator maps pages
    /// ([`pages::Mapped`](crate::pages::Mapped)).
    pub page_unmaps: u64,
    /// Bytes of the backing allocator's pages that no block touches, mapped
    /// or not ([`MappedStats::spare_bytes`](crate::pages::MappedStats::spare_bytes)):
    /// memory held below the pool, counted in neither `bytes_in_use` nor
    /// `bytes_cached`. Zero unless the backing allocator maps pages
    /// ([`pages::Mapped`](crate::pages::Mapped)).
    pub bytes_spare: usize,
}

impl Stats {
    /// Fills the page figures from an allocator's
    /// [`pages`](crate::RawAllocator::pages) (nothing for `None`).
    pub(crate) fn set_pages(&mut self, pages: Option<crate::pages::MappedStats>) {
        if let Some(p) = pages {
            self.pages_created = p.pages_created;
            self.pages_released = p.pages_released;
            self.page_maps = p.maps;
            self.page_unmaps = p.unmaps;
            self.bytes_spare = p.spare_bytes;
        }
    }

    /// The fraction of successful allocations served from the cache, or 0
    /// when nothing was allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut s = decaying_pool::Stats::default();
    /// s.hits = 3;
    /// s.misses = 1;
    /// assert_eq!(s.hit_rate(), 0.75);
    /// ```
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits as f64 + self.misses as f64;
        if total == 0.0 {
            0.0
        } else {
            self.hits as f64 / total
        }
    }

    /// Class bytes served, hits and misses together:
    /// `bytes_from_pool + bytes_from_backing` (saturating).
    ///
    /// # Examples
    ///
    /// ```
    /// let mut s = decaying_pool::Stats::default();
    /// s.bytes_from_pool = 3;
    /// s.bytes_from_backing = 1;
    /// assert_eq!(s.bytes_served(), 4);
    /// ```
    pub fn bytes_served(&self) -> usize {
        self.bytes_from_pool.saturating_add(self.bytes_from_backing)
    }

    /// Bytes served beyond what was requested: the cost of rounding to
    /// size classes (zero under [`SizeClass::Exact`](crate::SizeClass::Exact)).
    ///
    /// # Examples
    ///
    /// ```
    /// let mut s = decaying_pool::Stats::default();
    /// s.bytes_from_backing = 4096;
    /// s.bytes_requested = 3000;
    /// assert_eq!(s.rounding_waste(), 1096);
    /// ```
    pub fn rounding_waste(&self) -> usize {
        self.bytes_served().saturating_sub(self.bytes_requested)
    }
}

/// A byte count for people: `512 B`, `1.50 KiB`, `64.00 MiB`, `2.00 GiB`
/// (binary units, two decimals).
///
/// # Examples
///
/// ```
/// use decaying_pool::HumanBytes;
/// assert_eq!(HumanBytes(512).to_string(), "512 B");
/// assert_eq!(HumanBytes(1536).to_string(), "1.50 KiB");
/// assert_eq!(HumanBytes(64 << 20).to_string(), "64.00 MiB");
/// assert_eq!(HumanBytes(3 << 30).to_string(), "3.00 GiB");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanBytes(pub usize);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let b = self.0;
        if b < 1024 {
            let s = format!("{b} B");
            return f.pad(&s);
        }
        let mut v = b as f64 / 1024.0;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        let s = format!("{v:.2} {}", UNITS[unit]);
        f.pad(&s)
    }
}

/// A summary a person reads, in the manner of
/// `torch.cuda.memory_summary()`: current and peak bytes with binary
/// units, block counts, hits and misses, class bytes served beside the
/// bytes requested (the rounding waste), the backing calls, and, over an
/// allocator of mapped pages, a line of page figures.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedTime, SizeClass};
///
/// let mut pool = DecayingPool::builder(CheckingAllocator::new())
///     .size_class(SizeClass::PowerOfTwo)
///     .build();
/// let b = pool.allocate(3 << 20)?; // served with a 4 MiB block
/// let text = pool.stats().to_string();
/// assert!(text.contains("in use           4.00 MiB     4.00 MiB"), "{text}");
/// assert!(text.contains("4.00 MiB in classes for 3.00 MiB requested"), "{text}");
/// assert!(text.contains("rounding waste 1.00 MiB (25.0%)"), "{text}");
/// unsafe { pool.release(b, 3 << 20) };
/// # Ok(())
/// # }
/// ```
impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = HumanBytes;
        writeln!(f, "DecayingPool statistics")?;
        writeln!(f, "  {:<12} {:>12} {:>12}", "", "current", "peak")?;
        writeln!(
            f,
            "  {:<12} {:>12} {:>12}",
            "reserved",
            h(self.bytes_reserved),
            h(self.peak_bytes_reserved)
        )?;
        writeln!(
            f,
            "  {:<12} {:>12} {:>12}",
            "in use",
            h(self.bytes_in_use),
            h(self.peak_bytes_in_use)
        )?;
        writeln!(f, "  {:<12} {:>12}", "cached", h(self.bytes_cached))?;
        writeln!(
            f,
            "  blocks: {} in use, {} cached",
            self.blocks_in_use, self.blocks_cached
        )?;
        writeln!(
            f,
            "  allocations: {} ({} hits, {} misses, hit rate {:.1}%)",
            self.hits.saturating_add(self.misses),
            self.hits,
            self.misses,
            self.hit_rate() * 100.0
        )?;
        let served = self.bytes_served();
        let waste = self.rounding_waste();
        let pct = if served == 0 {
            0.0
        } else {
            waste as f64 * 100.0 / served as f64
        };
        writeln!(
            f,
            "  served: {} in classes for {} requested, rounding waste {} ({pct:.1}%)",
            h(served),
            h(self.bytes_requested),
            h(waste)
        )?;
        writeln!(
            f,
            "  served from: cache {}, backing {}",
            h(self.bytes_from_pool),
            h(self.bytes_from_backing)
        )?;
        writeln!(
            f,
            "  freed from the cache: {} evicted, {} trimmed",
            self.evictions, self.trimmed
        )?;
        write!(
            f,
            "  backing calls: {} allocs, {} deallocs, {} failures",
            self.backing_allocs, self.backing_deallocs, self.backing_failures
        )?;
        if self.pages_created > 0 {
            write!(
                f,
                "\n  pages: {} created, {} released, {} runs mapped, {} unmapped, {} spare",
                self.pages_created,
                self.pages_released,
                self.page_maps,
                self.page_unmaps,
                h(self.bytes_spare)
            )?;
        }
        Ok(())
    }
}

/// The counters of one size class, from
/// [`DecayingPool::class_stats`](crate::DecayingPool::class_stats) (kept
/// when the pool was built with
/// [`Builder::class_stats`](crate::Builder::class_stats)).
///
/// Counts are blocks; the byte figures are the counts times `size`. With
/// the **`serde`** feature, `ClassStats` is `Serialize` and `Deserialize`.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{ClassStats, DecayingPool};
///
/// let mut pool = DecayingPool::builder(CheckingAllocator::new()).class_stats(true).build();
/// let b = pool.allocate(256)?;
/// let classes = pool.class_stats().unwrap();
/// assert_eq!(classes[0], ClassStats { size: 256, blocks_in_use: 1, bytes_in_use: 256, misses: 1, ..Default::default() });
/// unsafe { pool.release(b, 256) };
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct ClassStats {
    /// The class size in bytes.
    pub size: usize,
    /// Blocks of this class handed out and not yet released.
    pub blocks_in_use: u64,
    /// Their bytes.
    pub bytes_in_use: usize,
    /// Blocks of this class idle in the cache.
    pub blocks_cached: u64,
    /// Their bytes.
    pub bytes_cached: usize,
    /// Requests of this class served from the cache.
    pub hits: u64,
    /// Requests of this class served by the backing allocator.
    pub misses: u64,
    /// Cached blocks of this class the policy freed (expired or displaced).
    pub evictions: u64,
    /// Cached blocks of this class freed by `trim`, the limit, the
    /// out-of-memory retry or dropping the pool.
    pub trimmed: u64,
}
