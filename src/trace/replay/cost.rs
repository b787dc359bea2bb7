//! The cost model: what a backing allocator's calls cost by size, and
//! [`ModelledAllocator`], which charges it.

use core::fmt;
use core::time::Duration;

use crate::RawAllocator;

/// A cost as a function of size: piecewise linear between points, flat
/// below the first, proportional to size beyond the last.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::CostCurve;
/// let c = CostCurve::new([(1000, Duration::from_micros(10)), (3000, Duration::from_micros(30))]);
/// assert_eq!(c.cost(10), Duration::from_micros(10));
/// assert_eq!(c.cost(2000), Duration::from_micros(20));
/// assert_eq!(c.cost(6000), Duration::from_micros(60));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CostCurve {
    /// (size in bytes, seconds), sorted by size.
    points: Vec<(f64, f64)>,
}

const KB: usize = 1000;
const KIB: usize = 1 << 10;
const MB: usize = 1000 * KB;
pub(super) const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// A curve through measured points (size in bytes, nanoseconds).
fn measured(points: &[(usize, u64)]) -> CostCurve {
    CostCurve::new(points.iter().map(|&(s, ns)| (s, Duration::from_nanos(ns))))
}

/// A curve through the device allocator's medians at
/// `CostCurve::DEVICE_SIZES` (nanoseconds).
fn device(ns: [u64; 11]) -> CostCurve {
    CostCurve::new(
        CostCurve::DEVICE_SIZES
            .into_iter()
            .zip(ns)
            .map(|(s, ns)| (s, Duration::from_nanos(ns))),
    )
}

impl CostCurve {
    /// The sizes the measured device curves ([`cu_mem_alloc_h200`],
    /// [`cu_mem_alloc_h100`] and their `cuMemFree` twins) have a point at:
    /// the sizes `examples/cuda_costs.rs` times `cuMemAlloc` and `cuMemFree`
    /// at, the published figures' sizes, PyTorch's segment sizes (2 MiB, 20
    /// MiB) and a few more.
    ///
    /// [`cu_mem_alloc_h200`]: Self::cu_mem_alloc_h200
    /// [`cu_mem_alloc_h100`]: Self::cu_mem_alloc_h100
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::CostCurve;
    /// assert_eq!(CostCurve::DEVICE_SIZES[0], 512);
    /// assert!(CostCurve::DEVICE_SIZES.is_sorted());
    /// ```
    pub const DEVICE_SIZES: [usize; 11] = [
        512,
        64 * KB,
        MB,
        2 * MIB,
        16 * MB,
        20 * MIB,
        64 * MB,
        256 * MB,
        512 * MB,
        GIB,
        GIB.saturating_mul(4),
    ];

    /// A curve through `points` (size in bytes, cost). An empty curve costs
    /// nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::CostCurve;
    /// assert_eq!(CostCurve::new([]).cost(1 << 20), core::time::Duration::ZERO);
    /// ```
    pub fn new(points: impl IntoIterator<Item = (usize, Duration)>) -> Self {
        let mut points: Vec<(f64, f64)> = points
            .into_iter()
            .map(|(s, d)| (s as f64, d.as_secs_f64()))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        CostCurve { points }
    }

    /// The same cost for every size.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::CostCurve;
    /// let c = CostCurve::constant(Duration::from_micros(2));
    /// assert_eq!(c.cost(1 << 30), Duration::from_micros(2));
    /// ```
    pub fn constant(cost: Duration) -> Self {
        CostCurve {
            points: vec![(f64::MAX, cost.as_secs_f64())],
        }
    }

    /// `cudaMalloc`, from the published figures: ~180 µs at 64 KB, ~520 µs
    /// at 1 MB, ~0.9 ms at 16 MB, ~1.2 ms at 64 MB, ~12.5 ms at 512 MB,
    /// ~32 ms at 1 GiB.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cuda_malloc();
    /// assert_eq!(c.cost(512_000_000), Duration::from_micros(12_500));
    /// assert_eq!(c.cost(512), Duration::from_micros(180));
    /// ```
    pub fn cuda_malloc() -> Self {
        let us = Duration::from_micros;
        CostCurve::new([
            (64 * KB, us(180)),
            (MB, us(520)),
            (16 * MB, us(900)),
            (64 * MB, us(1_200)),
            (512 * MB, us(12_500)),
            (GIB, us(32_000)),
        ])
    }

    /// `cuMemFree`: published as 50–180 µs and synchronous; modelled as
    /// 50 µs up to 1 MB rising to 180 µs at 1 GiB (an assumption: the
    /// figures do not say which sizes cost what).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cuda_free();
    /// assert_eq!(c.cost(4096), Duration::from_micros(50));
    /// assert_eq!(c.cost(1 << 30), Duration::from_micros(180));
    /// ```
    pub fn cuda_free() -> Self {
        let us = Duration::from_micros;
        CostCurve::new([(MB, us(50)), (GIB, us(180))])
    }

    /// `cudaHostAlloc` (pinned host memory): ~2.3 ms up to 1 MB, ~11.6 ms
    /// at 32 MB, ~61 ms at 512 MB.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cuda_host_alloc();
    /// assert_eq!(c.cost(4096), Duration::from_micros(2_300));
    /// ```
    pub fn cuda_host_alloc() -> Self {
        let us = Duration::from_micros;
        CostCurve::new([
            (MB, us(2_300)),
            (32 * MB, us(11_600)),
            (512 * MB, us(61_000)),
        ])
    }

    /// `cuMemAlloc` measured on an idle NVIDIA H200 (driver 580.159.04) by
    /// `examples/cuda_costs.rs`, medians: 1.3 µs up to 64 KB (the driver
    /// serves small requests from memory it holds), 18.4 µs at 1 MB, 37–38
    /// µs from 16 MB to 64 MB, 69.3 µs at 512 MB, 75.2 µs at 1 GiB, 169.6
    /// µs at 4 GiB. Another machine of the same kind measured up to 1.5x
    /// these (1.9x for [`cu_mem_free_h200`](Self::cu_mem_free_h200)'s). A
    /// busy device adds waiting the figures leave out.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cu_mem_alloc_h200();
    /// assert_eq!(c.cost(1_000_000), Duration::from_nanos(18_400));
    /// assert!(c.cost(512_000_000) < decaying_pool::trace::CostCurve::cuda_malloc().cost(512_000_000) / 100);
    /// ```
    pub fn cu_mem_alloc_h200() -> Self {
        device([
            1_300, 1_200, 18_400, 33_000, 36_900, 36_000, 37_900, 59_500, 69_300, 75_200, 169_600,
        ])
    }

    /// `cuMemFree` measured on an idle NVIDIA H200, as
    /// [`cu_mem_alloc_h200`](Self::cu_mem_alloc_h200): 1.2–1.3 µs up to 64
    /// KB, 17.6 µs at 1 MB, 47.3 µs at 64 MB, 165 µs at 512 MB, 321.6 µs
    /// at 1 GiB, 1.24 ms at 4 GiB. On a busy device a `cuMemFree` also
    /// waits for the queued work (7.5 ms with 7.5 ms queued, measured).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cu_mem_free_h200();
    /// assert_eq!(c.cost(1 << 30), Duration::from_nanos(321_600));
    /// ```
    pub fn cu_mem_free_h200() -> Self {
        device([
            1_300, 1_200, 17_600, 29_600, 35_100, 37_300, 47_300, 100_700, 165_000, 321_600,
            1_239_600,
        ])
    }

    /// `cuMemAlloc` measured on an idle NVIDIA H100 80GB HBM3 (driver
    /// 580.159.04) by `examples/cuda_costs.rs`, medians of 16 calls in a
    /// row (6 from 256 MB, 3 at 4 GiB): 1.3–1.4 µs up to 64 KB, 20.2 µs at
    /// 1 MB, 37.6–39.0 µs from 2 MiB to 64 MB, 80.5 µs at 256 MB, 138.8 µs
    /// at 512 MB, 123.8 µs at 1 GiB, 180.7 µs at 4 GiB. From one run; a
    /// busy device adds waiting the figures leave out.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cu_mem_alloc_h100();
    /// assert_eq!(c.cost(1_000_000), Duration::from_nanos(20_200));
    /// assert!(c.cost(512_000_000) < decaying_pool::trace::CostCurve::cuda_malloc().cost(512_000_000) / 50);
    /// ```
    pub fn cu_mem_alloc_h100() -> Self {
        device([
            1_300, 1_400, 20_200, 37_700, 37_600, 38_200, 39_000, 80_500, 138_800, 123_800, 180_700,
        ])
    }

    /// `cuMemFree` measured on an idle NVIDIA H100, as
    /// [`cu_mem_alloc_h100`](Self::cu_mem_alloc_h100): 1.3 µs up to 64
    /// KB, 16.8 µs at 1 MB, 49.6 µs at 64 MB, 352.6 µs at 512 MB, 339.0 µs
    /// at 1 GiB, 1.24 ms at 4 GiB. On a busy device a `cuMemFree` also
    /// waits for the queued work (10.6 ms with 10.5 ms queued, measured).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cu_mem_free_h100();
    /// assert_eq!(c.cost(1 << 30), Duration::from_nanos(339_000));
    /// ```
    pub fn cu_mem_free_h100() -> Self {
        device([
            1_300, 1_300, 16_800, 29_400, 36_800, 39_900, 49_600, 182_900, 352_600, 339_000,
            1_235_500,
        ])
    }

    /// `cuMemHostAlloc` (pinned host memory) measured on an H200 machine, as
    /// [`cu_mem_alloc_h200`](Self::cu_mem_alloc_h200): 1.9–2.3 µs up to 64
    /// KB, 282 µs at 1 MB, 13.9 ms at 32 MB, 41.6 ms at 128 MB, 197 ms at
    /// 512 MB.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cu_mem_host_alloc_h200();
    /// assert_eq!(c.cost(512_000_000), Duration::from_micros(196_727));
    /// ```
    pub fn cu_mem_host_alloc_h200() -> Self {
        measured(&[
            (512, 1_900),
            (64 * KB, 2_300),
            (MB, 282_100),
            (32 * MB, 13_851_900),
            (128 * MB, 41_610_600),
            (512 * MB, 196_727_000),
        ])
    }

    /// `cuMemFreeHost` measured on an H200 machine: 1.5–1.6 µs up to 64
    /// KB, 103 µs at 1 MB, 2.6 ms at 32 MB, 17.0 ms at 128 MB, 42.6 ms at
    /// 512 MB.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cu_mem_free_host_h200();
    /// assert_eq!(c.cost(1_000_000), Duration::from_nanos(102_500));
    /// ```
    pub fn cu_mem_free_host_h200() -> Self {
        measured(&[
            (512, 1_500),
            (64 * KB, 1_600),
            (MB, 102_500),
            (32 * MB, 2_645_700),
            (128 * MB, 16_977_700),
            (512 * MB, 42_568_500),
        ])
    }

    /// An anonymous private `mmap` of `size` bytes plus the first write to
    /// each of its 4 KiB pages (where the kernel finds and zeroes them),
    /// measured on a 2-core "AMD EPYC" virtual machine (Linux) by
    /// `cargo run --release --example host_costs`, medians: 6.0 µs at 4
    /// KiB, 50.8 µs at 64 KiB, 816 µs at 1 MiB, 11.0 ms at 16 MiB, 47.0 ms
    /// at 64 MiB, 223 ms at 256 MiB, 439 ms at 512 MiB, 2.04 s at 1 GiB
    /// (0.77–2.45 s over its three regions). Nearly all of it is the first
    /// touch, 2.7–3.4 µs a page up to 512 MiB (7.8 µs at 1 GiB); the
    /// `mmap` call itself took 2.7–26 µs. From one run on one machine (an
    /// earlier run gave 0.86–1.43 times these): another machine's differ.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::mmap_host();
    /// assert_eq!(c.cost(1 << 20), Duration::from_nanos(816_000));
    /// assert!(c.cost(1 << 20) > decaying_pool::trace::CostCurve::cuda_malloc().cost(1 << 20));
    /// ```
    pub fn mmap_host() -> Self {
        measured(&[
            (4 * KIB, 6_000),
            (64 * KIB, 50_800),
            (MIB, 816_000),
            (2 * MIB, 1_610_600),
            (16 * MIB, 11_016_600),
            (64 * MIB, 46_975_800),
            (256 * MIB, 222_533_100),
            (512 * MIB, 439_246_900),
            (GIB, 2_037_107_900),
        ])
    }

    /// `munmap` of a region of `size` bytes whose every page was touched,
    /// measured as [`mmap_host`](Self::mmap_host), medians: 6.7 µs at 4
    /// KiB, 11.1 µs at 64 KiB, 139 µs at 1 MiB, 1.81 ms at 16 MiB, 7.48 ms
    /// at 64 MiB, 30.8 ms at 256 MiB, 44.9 ms at 512 MiB, 112 ms at 1 GiB.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::munmap_host();
    /// assert_eq!(c.cost(1 << 30), Duration::from_nanos(112_267_700));
    /// ```
    pub fn munmap_host() -> Self {
        measured(&[
            (4 * KIB, 6_700),
            (64 * KIB, 11_100),
            (MIB, 139_300),
            (2 * MIB, 213_100),
            (16 * MIB, 1_811_800),
            (64 * MIB, 7_477_900),
            (256 * MIB, 30_764_300),
            (512 * MIB, 44_947_900),
            (GIB, 112_267_700),
        ])
    }

    /// The cost of a call for `size` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let c = decaying_pool::trace::CostCurve::cuda_malloc();
    /// assert!(c.cost(2 << 30) > Duration::from_millis(60));
    /// ```
    pub fn cost(&self, size: usize) -> Duration {
        Duration::try_from_secs_f64(self.seconds(size)).unwrap_or(Duration::MAX)
    }

    fn seconds(&self, size: usize) -> f64 {
        let x = size as f64;
        let p = &self.points;
        match p.iter().position(|&(s, _)| s >= x) {
            None => match p.last() {
                // beyond the last point: proportional to size
                Some(&(s, c)) if s > 0.0 => c * x / s,
                Some(&(_, c)) => c,
                None => 0.0,
            },
            Some(0) => p[0].1,
            Some(i) => {
                let (x0, y0) = p[i - 1];
                let (x1, y1) = p[i];
                y0 + (y1 - y0) * (x - x0) / (x1 - x0)
            }
        }
    }
}

/// Backing allocate and free costs, and an optional device capacity.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::{CostCurve, CostModel};
/// let pinned = CostModel::new(CostCurve::cuda_host_alloc(), CostCurve::cuda_free());
/// let device = CostModel::cuda().with_capacity(8 << 30);
/// assert_eq!(device.capacity(), Some(8 << 30));
/// assert_eq!(pinned.capacity(), None);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    alloc: CostCurve,
    free: CostCurve,
    capacity: Option<usize>,
}

impl Default for CostModel {
    /// [`CostModel::cuda`].
    fn default() -> Self {
        CostModel::cuda()
    }
}

impl CostModel {
    /// The given curves, no capacity.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::{CostCurve, CostModel};
    /// let free = CostModel::new(CostCurve::constant(Duration::ZERO), CostCurve::constant(Duration::ZERO));
    /// assert_eq!(free.alloc_cost(1 << 20), Duration::ZERO);
    /// ```
    pub fn new(alloc: CostCurve, free: CostCurve) -> Self {
        CostModel {
            alloc,
            free,
            capacity: None,
        }
    }

    /// `cudaMalloc` / `cuMemFree` ([`CostCurve::cuda_malloc`],
    /// [`CostCurve::cuda_free`]), no capacity: the default.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let m = decaying_pool::trace::CostModel::cuda();
    /// assert_eq!(m.alloc_cost(1_000_000), Duration::from_micros(520));
    /// ```
    pub fn cuda() -> Self {
        CostModel::new(CostCurve::cuda_malloc(), CostCurve::cuda_free())
    }

    /// `cuMemAlloc` / `cuMemFree` as measured on an idle NVIDIA H200
    /// ([`CostCurve::cu_mem_alloc_h200`], [`CostCurve::cu_mem_free_h200`]),
    /// no capacity: what the calls themselves cost there, 10 to 400 times
    /// less than the published figures of [`cuda`](Self::cuda), which the
    /// replay keeps as its default. Neither counts a free's wait for the
    /// work queued on a busy device.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let m = decaying_pool::trace::CostModel::h200();
    /// assert_eq!(m.alloc_cost(64_000_000), Duration::from_nanos(37_900));
    /// assert_eq!(m.capacity(), None);
    /// ```
    pub fn h200() -> Self {
        CostModel::new(
            CostCurve::cu_mem_alloc_h200(),
            CostCurve::cu_mem_free_h200(),
        )
    }

    /// `cuMemAlloc` / `cuMemFree` as measured on an idle NVIDIA H100
    /// ([`CostCurve::cu_mem_alloc_h100`], [`CostCurve::cu_mem_free_h100`]),
    /// no capacity, as [`h200`](Self::h200) is for an H200.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let m = decaying_pool::trace::CostModel::h100();
    /// assert_eq!(m.alloc_cost(64_000_000), Duration::from_nanos(39_000));
    /// assert_eq!(m.free_cost(64_000_000), Duration::from_nanos(49_600));
    /// assert_eq!(m.capacity(), None);
    /// ```
    pub fn h100() -> Self {
        CostModel::new(
            CostCurve::cu_mem_alloc_h100(),
            CostCurve::cu_mem_free_h100(),
        )
    }

    /// A host `mmap` allocator (`MmapAllocator`): an anonymous `mmap` plus
    /// the first touch of every page to allocate, `munmap` to free
    /// ([`CostCurve::mmap_host`], [`CostCurve::munmap_host`], measured by
    /// `examples/host_costs.rs`), no capacity. For host workloads, where
    /// the CUDA figures of [`cuda`](Self::cuda) say nothing: here a miss
    /// of 1 MiB costs 816 µs (its pages' first touch), not 520 µs.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let m = decaying_pool::trace::CostModel::host();
    /// assert_eq!(m.alloc_cost(4096), Duration::from_micros(6));
    /// assert_eq!(m.free_cost(1 << 20), Duration::from_nanos(139_300));
    /// assert_eq!(m.capacity(), None);
    /// ```
    pub fn host() -> Self {
        CostModel::new(CostCurve::mmap_host(), CostCurve::munmap_host())
    }

    /// The same model on a device of `bytes`: an allocation that would take
    /// the bytes allocated over it fails.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = decaying_pool::trace::CostModel::cuda().with_capacity(1 << 30);
    /// assert_eq!(m.capacity(), Some(1 << 30));
    /// ```
    pub fn with_capacity(mut self, bytes: usize) -> Self {
        self.capacity = Some(bytes);
        self
    }

    /// The device capacity, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::trace::CostModel::cuda().capacity(), None);
    /// ```
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// The modelled cost of allocating `size` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let m = decaying_pool::trace::CostModel::cuda();
    /// assert_eq!(m.alloc_cost(64_000_000), Duration::from_micros(1200));
    /// ```
    pub fn alloc_cost(&self, size: usize) -> Duration {
        self.alloc.cost(size)
    }

    /// The modelled cost of freeing `size` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// let m = decaying_pool::trace::CostModel::cuda();
    /// assert_eq!(m.free_cost(100), Duration::from_micros(50));
    /// ```
    pub fn free_cost(&self, size: usize) -> Duration {
        self.free.cost(size)
    }
}

/// A backing allocator that allocates nothing: it hands out addresses
/// (512-aligned, never reused, so blocks can be carved: it is
/// [`Packable`](crate::Packable)), keeps
/// count, charges every call the [`CostModel`]'s cost and fails past the
/// model's capacity.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::{CostModel, ModelledAllocator};
/// use decaying_pool::RawAllocator;
/// let mut a = ModelledAllocator::new(CostModel::cuda().with_capacity(1 << 20));
/// let b = a.allocate(1_000_000).unwrap();
/// assert!(a.allocate(100_000).is_err());
/// unsafe { a.deallocate(b, 1_000_000) };
/// assert!((a.modelled_seconds() - (520e-6 + 50e-6)).abs() < 1e-9);
/// assert_eq!((a.allocs(), a.frees(), a.failures(), a.used()), (1, 1, 1, 0));
/// ```
#[derive(Clone, Debug)]
pub struct ModelledAllocator {
    model: CostModel,
    next: u64,
    used: usize,
    seconds: f64,
    allocs: u64,
    frees: u64,
    failures: u64,
    /// Whether [`RawAllocator::capacity`] reports the model's capacity
    /// (`reporting_capacity`): only for the replay's configurations with a
    /// garbage-collection threshold, which take a fraction of it; the
    /// others replay as they always have.
    reports_capacity: bool,
}

/// A [`ModelledAllocator`] ran out of its capacity.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::{CostModel, ModelledAllocator};
/// use decaying_pool::RawAllocator;
/// let mut a = ModelledAllocator::new(CostModel::cuda().with_capacity(100));
/// let e = a.allocate(200).unwrap_err();
/// assert_eq!(e.to_string(), "out of memory: 200 bytes requested, 0 of 100 in use");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The size asked for.
    pub requested: usize,
    /// Bytes allocated at the time.
    pub used: usize,
    /// The capacity.
    pub capacity: usize,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory: {} bytes requested, {} of {} in use",
            self.requested, self.used, self.capacity
        )
    }
}

impl std::error::Error for OutOfMemory {}

impl ModelledAllocator {
    /// An allocator following `model`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{CostModel, ModelledAllocator};
    /// assert_eq!(ModelledAllocator::new(CostModel::cuda()).allocs(), 0);
    /// ```
    pub fn new(model: CostModel) -> Self {
        ModelledAllocator {
            model,
            next: 1 << 21,
            used: 0,
            seconds: 0.0,
            allocs: 0,
            frees: 0,
            failures: 0,
            reports_capacity: false,
        }
    }

    /// The same, reporting the model's capacity through
    /// [`RawAllocator::capacity`] (see `reports_capacity`).
    pub(crate) fn reporting_capacity(mut self) -> Self {
        self.reports_capacity = true;
        self
    }

    /// Total modelled time of every call so far, in seconds (failed calls
    /// cost nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{CostModel, ModelledAllocator};
    /// assert_eq!(ModelledAllocator::new(CostModel::cuda()).modelled_seconds(), 0.0);
    /// ```
    pub fn modelled_seconds(&self) -> f64 {
        self.seconds
    }

    /// Successful allocations.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{CostModel, ModelledAllocator};
    /// use decaying_pool::RawAllocator;
    /// let mut a = ModelledAllocator::new(CostModel::cuda());
    /// a.allocate(8).unwrap();
    /// assert_eq!(a.allocs(), 1);
    /// ```
    pub fn allocs(&self) -> u64 {
        self.allocs
    }

    /// Frees.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{CostModel, ModelledAllocator};
    /// assert_eq!(ModelledAllocator::new(CostModel::cuda()).frees(), 0);
    /// ```
    pub fn frees(&self) -> u64 {
        self.frees
    }

    /// Failed allocations.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{CostModel, ModelledAllocator};
    /// use decaying_pool::RawAllocator;
    /// let mut a = ModelledAllocator::new(CostModel::cuda().with_capacity(0));
    /// assert!(a.allocate(1).is_err());
    /// assert_eq!(a.failures(), 1);
    /// ```
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Bytes allocated and not freed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{CostModel, ModelledAllocator};
    /// use decaying_pool::RawAllocator;
    /// let mut a = ModelledAllocator::new(CostModel::cuda());
    /// a.allocate(8).unwrap();
    /// assert_eq!(a.used(), 8);
    /// ```
    pub fn used(&self) -> usize {
        self.used
    }
}

impl RawAllocator for ModelledAllocator {
    type Block = u64;
    type Error = OutOfMemory;

    /// The model's capacity, for the replay's configurations with a
    /// garbage-collection threshold (a fraction of it when they have no
    /// limit); `None` otherwise: a pool over it then learns the capacity
    /// only by failing, as every replay did before the threshold.
    fn capacity(&self) -> Option<usize> {
        if self.reports_capacity {
            self.model.capacity
        } else {
            None
        }
    }

    fn allocate(&mut self, size: usize) -> Result<u64, OutOfMemory> {
        if let Some(capacity) = self.model.capacity {
            if size > capacity.saturating_sub(self.used) {
                self.failures += 1;
                return Err(OutOfMemory {
                    requested: size,
                    used: self.used,
                    capacity,
                });
            }
        }
        self.used = self.used.saturating_add(size);
        self.allocs += 1;
        self.seconds += self.model.alloc.seconds(size);
        // Blocks are addresses, 512-aligned and disjoint, so the packing
        // layer can carve them.
        let at = self.next;
        self.next = at.saturating_add((size.max(1) as u64).div_ceil(512).saturating_mul(512));
        Ok(at)
    }

    unsafe fn deallocate(&mut self, _block: u64, size: usize) {
        self.used = self.used.saturating_sub(size);
        self.frees += 1;
        self.seconds += self.model.free.seconds(size);
    }
}

impl crate::Packable for ModelledAllocator {
    fn carve(segment: &u64, offset: usize) -> u64 {
        crate::packing::carve_u64(segment, offset)
    }

    fn address(block: &u64) -> usize {
        crate::packing::address_u64(block)
    }
}
