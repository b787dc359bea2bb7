//! The replayer: a trace through several pool configurations at once, on
//! trace time, over a cost-model allocator.

use core::fmt;
use core::time::Duration;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::{human_bytes, json_escape, Event, Op, Recorder};
use crate::policy::Policy;
use crate::{
    DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, PackedPool, Packing,
    RawAllocator, Reuse, SizeClass, Stats,
};

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
const MB: usize = 1000 * KB;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

impl CostCurve {
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
        }
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

/// The eviction rule of a [`Config`].
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::PolicyKind;
/// assert_eq!(PolicyKind::FixedTime(Duration::from_millis(100)).label(), "fixed-time 100ms");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// No pool: every request goes to the backing allocator and every free
    /// back to it (run as [`FixedCapacity::new(0)`](crate::FixedCapacity)).
    NoPool,
    /// A cache that never evicts ([`FixedTime`] with an infinite time-to-live).
    KeepAll,
    /// [`FixedTime`] with this time-to-live.
    FixedTime(Duration),
    /// [`Exponential`] with this half-life.
    Exponential(Duration),
    /// [`FixedCapacity`] with this many slots.
    FixedCapacity(usize),
}

impl PolicyKind {
    /// A short name: `no-pool`, `keep-all`, `fixed-time 100ms`,
    /// `exponential 50ms`, `fixed-capacity 256`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::PolicyKind;
    /// assert_eq!(PolicyKind::FixedCapacity(256).label(), "fixed-capacity 256");
    /// ```
    pub fn label(&self) -> String {
        match self {
            PolicyKind::NoPool => "no-pool".into(),
            PolicyKind::KeepAll => "keep-all".into(),
            PolicyKind::FixedTime(d) => format!("fixed-time {d:?}"),
            PolicyKind::Exponential(d) => format!("exponential {d:?}"),
            PolicyKind::FixedCapacity(n) => format!("fixed-capacity {n}"),
        }
    }
}

/// One pool configuration to replay.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{Config, PolicyKind};
/// use decaying_pool::SizeClass;
/// let c = Config::new(PolicyKind::FixedTime(Duration::from_millis(100)))
///     .size_class(SizeClass::PowerOfTwoDivisions(4));
/// assert_eq!(c.name, "fixed-time 100ms, pow2/4");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The name in reports.
    pub name: String,
    /// The eviction rule.
    pub policy: PolicyKind,
    /// How requests are rounded (default exact).
    pub size_class: SizeClass,
    /// Which cached block a hit hands out (default LIFO).
    pub reuse: Reuse,
    /// Pack small and medium requests into segments ([`PackedPool`]) as
    /// this says (default: no packing). A setting without a
    /// [`capacity`](Packing::capacity) gets the replay's device capacity
    /// ([`CostModel::capacity`]), if any.
    pub packing: Option<Packing>,
    /// The pool's byte limit ([`Builder::limit`](crate::Builder::limit)):
    /// requests beyond it fail and count as failures (default: none).
    pub limit: Option<usize>,
}

impl Config {
    /// `policy` with exact sizes and LIFO reuse, named after the policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Config, PolicyKind};
    /// assert_eq!(Config::new(PolicyKind::KeepAll).name, "keep-all");
    /// ```
    pub fn new(policy: PolicyKind) -> Self {
        Config {
            name: policy.label(),
            policy,
            size_class: SizeClass::Exact,
            reuse: Reuse::Lifo,
            packing: None,
            limit: None,
        }
    }

    /// The same with packing as `packing` says; the name is unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::{Config, PolicyKind};
    /// use decaying_pool::Packing;
    /// let c = Config::new(PolicyKind::FixedTime(Duration::from_secs(1)))
    ///     .packing(Packing::default())
    ///     .named("packed");
    /// assert_eq!(c.packing, Some(Packing::default()));
    /// ```
    pub fn packing(mut self, packing: Packing) -> Self {
        self.packing = Some(packing);
        self
    }

    /// The same with a byte limit on the pool (the name says it).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
    /// let c = Config::new(PolicyKind::KeepAll).limit(1000);
    /// assert_eq!(c.name, "keep-all, limit 1000 B");
    /// let mut r = Replayer::new(&[c], ReplayOptions::default());
    /// r.event(&Event::alloc(Default::default(), 1, 2000));
    /// assert_eq!(r.finish("w")[0].failures, 1);
    /// ```
    pub fn limit(mut self, bytes: usize) -> Self {
        self.limit = Some(bytes);
        self.name = format!("{}, limit {}", self.name, super::human_bytes(bytes as f64));
        self
    }

    /// The same with requests rounded by `size_class` (the name says how).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Config, PolicyKind};
    /// use decaying_pool::SizeClass;
    /// let c = Config::new(PolicyKind::KeepAll).size_class(SizeClass::PowerOfTwo);
    /// assert_eq!(c.name, "keep-all, pow2");
    /// ```
    pub fn size_class(mut self, size_class: SizeClass) -> Self {
        self.size_class = size_class;
        let suffix = match size_class {
            SizeClass::Exact => return self,
            SizeClass::PowerOfTwo => "pow2".to_string(),
            SizeClass::Multiple(n) => format!("x{n}"),
            SizeClass::PowerOfTwoDivisions(k) => format!("pow2/{k}"),
        };
        self.name = format!("{}, {suffix}", self.policy.label());
        self
    }

    /// The same with a name of your own.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Config, PolicyKind};
    /// assert_eq!(Config::new(PolicyKind::KeepAll).named("mine").name, "mine");
    /// ```
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The configurations the replay example compares: `no-pool`,
    /// `keep-all`, `fixed-time` 10 ms and 100 ms (about the p90 and p99 of
    /// the gap from a free to the reuse of its size in PyTorch traces) and
    /// 1 s (the crate's default), `exponential` with a 100 ms half-life,
    /// `fixed-capacity` 256 slots, `fixed-time 1s` over PyTorch-style
    /// size classes (`pow2/4`, [`SizeClass::PowerOfTwoDivisions`]), and
    /// `packed`: the default [`Packing`] over the default policy
    /// (`fixed-time 1s`).
    ///
    /// # Examples
    ///
    /// ```
    /// let names: Vec<String> = decaying_pool::trace::Config::defaults().into_iter().map(|c| c.name).collect();
    /// assert_eq!(names[..3], ["no-pool", "keep-all", "fixed-time 10ms"]);
    /// assert_eq!(names.len(), 9);
    /// assert_eq!(names[8], "packed");
    /// ```
    pub fn defaults() -> Vec<Config> {
        let ms = Duration::from_millis;
        vec![
            Config::new(PolicyKind::NoPool),
            Config::new(PolicyKind::KeepAll),
            Config::new(PolicyKind::FixedTime(ms(10))),
            Config::new(PolicyKind::FixedTime(ms(100))),
            Config::new(PolicyKind::FixedTime(ms(1000))),
            Config::new(PolicyKind::Exponential(ms(100))),
            Config::new(PolicyKind::FixedCapacity(256)),
            Config::new(PolicyKind::FixedTime(ms(1000)))
                .size_class(SizeClass::PowerOfTwoDivisions(4)),
            Config::new(PolicyKind::FixedTime(ms(1000)))
                .packing(Packing::default())
                .named("packed"),
        ]
    }
}

/// How a [`Replayer`] runs.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{CostModel, ReplayOptions};
/// let opts = ReplayOptions {
///     cost: CostModel::cuda().with_capacity(8 << 30),
///     gap: Duration::from_secs(1),
///     reaper: Some(Duration::from_millis(10)),
///     record: true,
///     ..ReplayOptions::default()
/// };
/// assert!(opts.record);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayOptions {
    /// The backing allocator's costs and capacity (default [`CostModel::cuda`]).
    pub cost: CostModel,
    /// Idle time inserted between passes of a repeated trace (default 0).
    pub gap: Duration,
    /// Call `collect` on every pool at each multiple of this period, as
    /// [`SharedPool::spawn_reaper`](crate::SharedPool::spawn_reaper) would,
    /// so pools decay while the trace is quiet (default: never; a pool then
    /// decays only when the trace calls it).
    pub reaper: Option<Duration>,
    /// Keep a [`Recorder`] per configuration (default `false`: no cost).
    pub record: bool,
    /// The recorders' resolution (default 0: every change).
    pub record_resolution: Duration,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            cost: CostModel::cuda(),
            gap: Duration::ZERO,
            reaper: None,
            record: false,
            record_resolution: Duration::ZERO,
        }
    }
}

/// What one configuration did over a replay.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
/// let mut r = Replayer::new(&[Config::new(PolicyKind::NoPool)], ReplayOptions::default());
/// r.event(&Event::alloc(Duration::ZERO, 1, 1_000_000));
/// r.event(&Event::free(Duration::from_secs(1), 1, 1_000_000));
/// let rep = &r.finish("w")[0];
/// assert_eq!((rep.backing_allocs, rep.backing_frees, rep.hits), (1, 1, 0));
/// assert!((rep.modelled_backing_seconds - 570e-6).abs() < 1e-9);
/// assert_eq!(rep.reserved_over_live(), 1.0);
/// ```
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Report {
    /// The workload's name.
    pub workload: String,
    /// The configuration's name.
    pub policy: String,
    /// Allocation requests in the trace (all passes).
    pub allocs: u64,
    /// Requests served from the cache.
    pub hits: u64,
    /// Backing allocations.
    pub backing_allocs: u64,
    /// Backing frees during the replay (the pool's final drop not counted).
    pub backing_frees: u64,
    /// Cached blocks freed by the policy.
    pub evictions: u64,
    /// Cached blocks freed by the out-of-memory retry.
    pub trimmed: u64,
    /// The most bytes held from the backing allocator at once.
    pub peak_reserved_bytes: usize,
    /// The most bytes the trace held live at once (requested sizes).
    pub peak_live_bytes: usize,
    /// Integral of the pool's cached bytes over trace time, byte-seconds.
    pub idle_byte_seconds: f64,
    /// Modelled time spent in the backing allocator, seconds.
    pub modelled_backing_seconds: f64,
    /// Requests that failed (device full even after the pool emptied its
    /// cache); their frees are skipped.
    pub failures: u64,
    /// Trace time replayed, gaps included, seconds.
    pub span_seconds: f64,
    /// The pool's final counters.
    pub stats: Stats,
    /// The recording, when [`ReplayOptions::record`] was set (not
    /// serialized: write it with its own exporters).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub recording: Option<Recorder>,
}

impl Report {
    /// Peak reserved over peak live bytes (1.0 = no memory held beyond need;
    /// 0 when nothing was live).
    ///
    /// # Examples
    ///
    /// ```
    /// # use decaying_pool::trace::{Config, PolicyKind, Replayer, ReplayOptions};
    /// let r = &Replayer::new(&Config::defaults(), ReplayOptions::default()).finish("empty")[0];
    /// assert_eq!(r.reserved_over_live(), 0.0);
    /// ```
    pub fn reserved_over_live(&self) -> f64 {
        if self.peak_live_bytes == 0 {
            0.0
        } else {
            self.peak_reserved_bytes as f64 / self.peak_live_bytes as f64
        }
    }

    /// One JSON object with the report's figures (not the recording).
    ///
    /// # Examples
    ///
    /// ```
    /// # use decaying_pool::trace::{Config, PolicyKind, Replayer, ReplayOptions};
    /// let r = &Replayer::new(&[Config::new(PolicyKind::KeepAll)], ReplayOptions::default()).finish("w")[0];
    /// assert!(r.to_json().starts_with(r#"{"workload":"w","policy":"keep-all","#));
    /// ```
    pub fn to_json(&self) -> String {
        format!(
            concat!(
                "{{\"workload\":\"{}\",\"policy\":\"{}\",\"allocs\":{},\"hits\":{},",
                "\"backing_allocs\":{},\"backing_frees\":{},\"evictions\":{},\"trimmed\":{},",
                "\"peak_reserved_bytes\":{},\"peak_live_bytes\":{},\"reserved_over_live\":{},",
                "\"idle_byte_seconds\":{},\"modelled_backing_seconds\":{},\"failures\":{},",
                "\"span_seconds\":{}}}"
            ),
            json_escape(&self.workload),
            json_escape(&self.policy),
            self.allocs,
            self.hits,
            self.backing_allocs,
            self.backing_frees,
            self.evictions,
            self.trimmed,
            self.peak_reserved_bytes,
            self.peak_live_bytes,
            json_f64(self.reserved_over_live()),
            json_f64(self.idle_byte_seconds),
            json_f64(self.modelled_backing_seconds),
            self.failures,
            json_f64(self.span_seconds),
        )
    }
}

fn json_f64(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

/// A JSON array of [`Report::to_json`] objects.
///
/// # Examples
///
/// ```
/// # use decaying_pool::trace::{reports_to_json, Config, Replayer, ReplayOptions};
/// let reports = Replayer::new(&Config::defaults(), ReplayOptions::default()).finish("w");
/// let json = reports_to_json(&reports);
/// assert!(json.starts_with("[{") && json.ends_with("}]"));
/// ```
pub fn reports_to_json(reports: &[Report]) -> String {
    let mut s = String::from("[");
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&r.to_json());
    }
    s.push(']');
    s
}

/// A plain-text table of reports, one row per configuration.
///
/// # Examples
///
/// ```
/// # use decaying_pool::trace::{format_table, Config, Replayer, ReplayOptions};
/// let reports = Replayer::new(&Config::defaults(), ReplayOptions::default()).finish("w");
/// assert!(format_table(&reports).lines().nth(2).unwrap().starts_with("no-pool"));
/// ```
pub fn format_table(reports: &[Report]) -> String {
    let mut s = String::new();
    let w = reports
        .iter()
        .map(|r| r.policy.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    let _ = writeln!(
        s,
        "{:<w$} {:>9} {:>7} {:>9} {:>9} {:>11} {:>6} {:>11} {:>9} {:>8}",
        "policy",
        "hits",
        "hit %",
        "b.allocs",
        "b.frees",
        "peak res",
        "÷live",
        "idle",
        "backing",
        "failures"
    );
    let _ = writeln!(
        s,
        "{:<w$} {:>9} {:>7} {:>9} {:>9} {:>11} {:>6} {:>11} {:>9} {:>8}",
        "", "", "", "", "", "", "", "MiB·s", "s", ""
    );
    for r in reports {
        let hit = if r.allocs == 0 {
            0.0
        } else {
            100.0 * r.hits as f64 / r.allocs as f64
        };
        let _ = writeln!(
            s,
            "{:<w$} {:>9} {:>7.2} {:>9} {:>9} {:>11} {:>6.2} {:>11.3} {:>9.3} {:>8}",
            r.policy,
            r.hits,
            hit,
            r.backing_allocs,
            r.backing_frees,
            human_bytes(r.peak_reserved_bytes as f64),
            r.reserved_over_live(),
            r.idle_byte_seconds / MIB as f64,
            r.modelled_backing_seconds,
            r.failures
        );
    }
    s
}

/// One configuration under replay (object-safe, so pools of different
/// policy types sit in one list).
trait Sim {
    fn alloc(&mut self, addr: u64, size: usize);
    fn free(&mut self, addr: u64);
    fn collect(&mut self);
    fn release_all(&mut self);
    fn stats(&self) -> Stats;
    fn state(&mut self) -> &mut SimState;
    /// The counters, the modelled backing seconds, the hits.
    fn report(&mut self) -> (Stats, f64, u64);
}

#[derive(Default)]
struct SimState {
    name: String,
    allocs: u64,
    failures: u64,
    live_bytes: usize,
    peak_live_bytes: usize,
    idle_byte_seconds: f64,
    recorder: Option<Recorder>,
}

/// What a [`PoolSim`] needs of its pool: a plain or a packed one.
trait SimPool {
    fn allocate(&mut self, size: usize) -> Option<u64>;
    /// # Safety
    /// As `DecayingPool::release`.
    unsafe fn release(&mut self, block: u64, size: usize);
    fn collect(&mut self);
    fn stats(&self) -> Stats;
    /// Requests served without a backing call.
    fn hits(&self) -> u64;
    fn modelled_seconds(&self) -> f64;
}

impl<P: Policy> SimPool for DecayingPool<ModelledAllocator, P, ManualClock> {
    fn allocate(&mut self, size: usize) -> Option<u64> {
        DecayingPool::allocate(self, size).ok()
    }
    unsafe fn release(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract.
        unsafe { DecayingPool::release(self, block, size) }
    }
    fn collect(&mut self) {
        DecayingPool::collect(self);
    }
    fn stats(&self) -> Stats {
        DecayingPool::stats(self)
    }
    fn hits(&self) -> u64 {
        DecayingPool::stats(self).hits
    }
    fn modelled_seconds(&self) -> f64 {
        self.allocator().modelled_seconds()
    }
}

impl<P: Policy> SimPool for PackedPool<ModelledAllocator, P, ManualClock> {
    fn allocate(&mut self, size: usize) -> Option<u64> {
        PackedPool::allocate(self, size).ok()
    }
    unsafe fn release(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract.
        unsafe { PackedPool::release(self, block, size) }
    }
    fn collect(&mut self) {
        PackedPool::collect(self);
    }
    fn stats(&self) -> Stats {
        PackedPool::stats(self)
    }
    fn hits(&self) -> u64 {
        // Every successful request made at most one pool miss (a segment
        // or an exact block).
        self.packing_stats()
            .requests
            .saturating_sub(PackedPool::stats(self).misses)
    }
    fn modelled_seconds(&self) -> f64 {
        self.pool().allocator().modelled_seconds()
    }
}

struct PoolSim<T: SimPool> {
    pool: T,
    /// addr → (block, requested size)
    live: HashMap<u64, (u64, usize)>,
    /// addresses whose allocation failed: their frees are skipped
    failed: HashSet<u64>,
    st: SimState,
}

impl<T: SimPool> Sim for PoolSim<T> {
    fn alloc(&mut self, addr: u64, size: usize) {
        self.st.allocs += 1;
        // A live address allocated again (only possible when events are fed
        // by hand): the earlier block is released first.
        self.free(addr);
        match self.pool.allocate(size) {
            Some(block) => {
                self.live.insert(addr, (block, size));
                self.st.live_bytes = self.st.live_bytes.saturating_add(size);
                self.st.peak_live_bytes = self.st.peak_live_bytes.max(self.st.live_bytes);
            }
            None => {
                self.st.failures += 1;
                self.failed.insert(addr);
            }
        }
    }

    fn free(&mut self, addr: u64) {
        if let Some((block, size)) = self.live.remove(&addr) {
            self.st.live_bytes = self.st.live_bytes.saturating_sub(size);
            // SAFETY: `block` came from `self.pool.allocate(size)` and has
            // just left the live map, so it is released exactly once.
            unsafe { self.pool.release(block, size) };
        } else {
            self.failed.remove(&addr);
        }
    }

    fn collect(&mut self) {
        self.pool.collect();
    }

    fn release_all(&mut self) {
        let addrs: Vec<u64> = self.live.keys().copied().collect();
        for a in addrs {
            self.free(a);
        }
        self.failed.clear();
    }

    fn stats(&self) -> Stats {
        self.pool.stats()
    }

    fn state(&mut self) -> &mut SimState {
        &mut self.st
    }

    fn report(&mut self) -> (Stats, f64, u64) {
        (
            self.pool.stats(),
            self.pool.modelled_seconds(),
            self.pool.hits(),
        )
    }
}

fn sim<P: Policy + 'static>(
    policy: P,
    config: &Config,
    clock: &ManualClock,
    options: &ReplayOptions,
) -> Box<dyn Sim> {
    let mut builder = DecayingPool::builder(ModelledAllocator::new(options.cost.clone()))
        .policy(policy)
        .clock(clock.clone())
        .size_class(config.size_class)
        .reuse(config.reuse);
    if let Some(limit) = config.limit {
        builder = builder.limit(limit);
    }
    let st = SimState {
        name: config.name.clone(),
        recorder: options
            .record
            .then(|| Recorder::with_resolution(&config.name, options.record_resolution)),
        ..SimState::default()
    };
    match config.packing {
        None => Box::new(PoolSim {
            pool: builder.build(),
            live: HashMap::new(),
            failed: HashSet::new(),
            st,
        }),
        Some(mut packing) => {
            if packing.capacity.is_none() {
                packing.capacity = options.cost.capacity();
            }
            Box::new(PoolSim {
                pool: builder.packing(packing).build(),
                live: HashMap::new(),
                failed: HashSet::new(),
                st,
            })
        }
    }
}

/// Runs a trace through several configurations at once, on trace time.
///
/// Every configuration gets its own [`DecayingPool`] over its own
/// [`ModelledAllocator`]; all share one [`ManualClock`], set to each
/// event's time (measured from the first event) before the pools are
/// called, so decay happens as it would have in the traced program. The
/// trace is read once, whatever the number of configurations.
///
/// For a trace looped N times, call [`begin_pass`](Self::begin_pass)
/// before each pass: the next pass starts [`ReplayOptions::gap`] after the
/// last event of the previous one, and the blocks the previous pass left
/// live are released at its end (the program's iteration ends), so they
/// sit idle in the cache during the gap.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
///
/// let ms = Duration::from_millis;
/// let configs = [
///     Config::new(PolicyKind::KeepAll),
///     Config::new(PolicyKind::FixedTime(ms(100))),
/// ];
/// let opts = ReplayOptions { gap: Duration::from_secs(1), ..Default::default() };
/// let mut r = Replayer::new(&configs, opts);
/// for _pass in 0..3 {
///     r.begin_pass();
///     r.event(&Event::alloc(ms(0), 0x10, 1 << 20));
///     r.event(&Event::free(ms(5), 0x10, 1 << 20));
/// }
/// let reports = r.finish("loop");
/// assert_eq!(reports[0].backing_allocs, 1); // keep-all: one block, reused
/// assert_eq!(reports[1].backing_allocs, 3); // expired during each 1 s gap
/// ```
pub struct Replayer {
    sims: Vec<Box<dyn Sim>>,
    clock: ManualClock,
    options: ReplayOptions,
    /// Replay time of the last event, nanoseconds.
    now: u64,
    /// The next event starts a pass: its trace time maps to `offset`.
    pass_start: bool,
    passes: u64,
    origin: u64,
    offset: u64,
    next_tick: u64,
}

impl fmt::Debug for Replayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replayer")
            .field("configs", &self.sims.len())
            .field("now", &Duration::from_nanos(self.now))
            .finish_non_exhaustive()
    }
}

impl Replayer {
    /// A replayer of `configs`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Config, Replayer, ReplayOptions};
    /// let r = Replayer::new(&Config::defaults(), ReplayOptions::default());
    /// assert_eq!(r.finish("nothing").len(), Config::defaults().len());
    /// ```
    pub fn new(configs: &[Config], options: ReplayOptions) -> Self {
        let clock = ManualClock::new();
        let sims = configs
            .iter()
            .map(|c| match c.policy {
                PolicyKind::NoPool => sim(FixedCapacity::new(0), c, &clock, &options),
                PolicyKind::KeepAll => sim(FixedTime::new(Duration::MAX), c, &clock, &options),
                PolicyKind::FixedTime(t) => sim(FixedTime::new(t), c, &clock, &options),
                PolicyKind::Exponential(h) => sim(Exponential::half_life(h), c, &clock, &options),
                PolicyKind::FixedCapacity(n) => sim(FixedCapacity::new(n), c, &clock, &options),
            })
            .collect();
        Replayer {
            sims,
            clock,
            next_tick: options.reaper.map_or(u64::MAX, duration_nanos),
            options,
            now: 0,
            pass_start: true,
            passes: 0,
            origin: 0,
            offset: 0,
        }
    }

    /// Adds a configuration that runs `policy`, a policy of your own (an
    /// [`EvictionPolicy`](crate::EvictionPolicy)), with `config`'s name,
    /// size classes, reuse and packing (`config.policy` is not used).
    /// Call it before the first event; its report comes after those of
    /// [`new`](Self::new)'s configurations.
    ///
    /// # Examples
    ///
    /// A policy that keeps at most 1 MiB idle, against keep-all:
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::policy::{EvictionPolicy, Oldest};
    /// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
    ///
    /// struct MaxIdle(usize);
    /// impl EvictionPolicy for MaxIdle {
    ///     fn must_evict(&mut self, _now: Duration, _oldest: Oldest, bytes_cached: usize) -> bool {
    ///         bytes_cached > self.0
    ///     }
    /// }
    ///
    /// let opts = ReplayOptions { reaper: Some(Duration::from_millis(1)), ..Default::default() };
    /// let mut r = Replayer::new(&[Config::new(PolicyKind::KeepAll)], opts);
    /// r.add_policy(&Config::new(PolicyKind::KeepAll).named("max-idle 1MiB"), MaxIdle(1 << 20));
    /// let ms = Duration::from_millis;
    /// for i in 0..4 {
    ///     r.event(&Event::alloc(ms(i), i, 1 << 20));
    /// }
    /// for i in 0..4 {
    ///     r.event(&Event::free(ms(10 + i), i, 1 << 20));
    /// }
    /// r.event(&Event::alloc(ms(20), 9, 64)); // the reaper has run since
    /// let reports = r.finish("w");
    /// assert_eq!(reports[1].policy, "max-idle 1MiB");
    /// assert_eq!(reports[0].evictions, 0);
    /// assert_eq!(reports[1].evictions, 3); // down to 1 MiB idle
    /// ```
    pub fn add_policy<P: Policy + 'static>(&mut self, config: &Config, policy: P) {
        self.sims
            .push(sim(policy, config, &self.clock, &self.options));
    }

    /// Starts a pass of a looped trace (the first call is optional).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
    /// let opts = ReplayOptions { gap: Duration::from_secs(2), ..Default::default() };
    /// let mut r = Replayer::new(&[Config::new(PolicyKind::KeepAll)], opts);
    /// for _ in 0..2 {
    ///     r.begin_pass();
    ///     r.event(&Event::alloc(Duration::from_secs(100), 1, 64));
    ///     r.event(&Event::free(Duration::from_secs(101), 1, 64));
    /// }
    /// assert_eq!(r.finish("w")[0].span_seconds, 4.0); // 1 s, 2 s gap, 1 s
    /// ```
    pub fn begin_pass(&mut self) {
        if self.passes > 0 && !self.pass_start {
            self.at(self.now);
            for s in &mut self.sims {
                s.release_all();
            }
            self.after_step();
            self.offset = self.now.saturating_add(duration_nanos(self.options.gap));
        }
        self.pass_start = true;
    }

    /// Replays one event. Times before the previous event's are taken as
    /// the previous event's (logs of several threads can be slightly out of
    /// order).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
    /// let mut r = Replayer::new(&[Config::new(PolicyKind::KeepAll)], ReplayOptions::default());
    /// r.event(&Event::alloc(Duration::ZERO, 1, 64));
    /// assert_eq!(r.finish("w")[0].peak_live_bytes, 64);
    /// ```
    pub fn event(&mut self, event: &Event) {
        let t = duration_nanos(event.time);
        if self.pass_start {
            self.pass_start = false;
            self.passes += 1;
            self.origin = t;
        }
        let now = self
            .offset
            .saturating_add(t.saturating_sub(self.origin))
            .max(self.now);
        self.at(now);
        let size = usize::try_from(event.size).unwrap_or(usize::MAX);
        for s in &mut self.sims {
            match event.op {
                Op::Alloc => s.alloc(event.addr, size),
                Op::Free => s.free(event.addr),
            }
        }
        self.after_step();
    }

    /// Moves time to `now`: integrates idle bytes, runs reaper ticks.
    fn at(&mut self, now: u64) {
        while self.next_tick <= now {
            let tick = self.next_tick;
            self.advance(tick);
            for s in &mut self.sims {
                s.collect();
            }
            self.after_step();
            let period = self.options.reaper.map_or(u64::MAX, duration_nanos).max(1);
            self.next_tick = tick.saturating_add(period);
        }
        self.advance(now);
    }

    fn advance(&mut self, now: u64) {
        let dt = now.saturating_sub(self.now) as f64 * 1e-9;
        if dt > 0.0 {
            for s in &mut self.sims {
                let cached = s.stats().bytes_cached as f64;
                s.state().idle_byte_seconds += cached * dt;
            }
        }
        self.now = self.now.max(now);
        self.clock.set(Duration::from_nanos(self.now));
    }

    fn after_step(&mut self) {
        if !self.options.record {
            return;
        }
        let t = Duration::from_nanos(self.now);
        for s in &mut self.sims {
            let stats = s.stats();
            if let Some(r) = s.state().recorder.as_mut() {
                r.record(t, &stats);
            }
        }
    }

    /// Replay time now: the last event's time from the start of the replay.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::{Config, Event, Replayer, ReplayOptions};
    /// let mut r = Replayer::new(&Config::defaults(), ReplayOptions::default());
    /// r.event(&Event::alloc(Duration::from_secs(5), 1, 8));
    /// r.event(&Event::free(Duration::from_secs(7), 1, 8));
    /// assert_eq!(r.now(), Duration::from_secs(2));
    /// ```
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now)
    }

    /// Ends the replay: one report per configuration, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Config, Replayer, ReplayOptions};
    /// let reports = Replayer::new(&Config::defaults(), ReplayOptions::default()).finish("w");
    /// assert!(reports.iter().all(|r| r.workload == "w" && r.hits == 0));
    /// ```
    pub fn finish(mut self, workload: &str) -> Vec<Report> {
        let span = self.now as f64 * 1e-9;
        self.sims
            .iter_mut()
            .map(|s| {
                let (stats, seconds, hits) = s.report();
                let st = std::mem::take(s.state());
                Report {
                    workload: workload.to_owned(),
                    policy: st.name,
                    allocs: st.allocs,
                    hits,
                    backing_allocs: stats.backing_allocs,
                    backing_frees: stats.backing_deallocs,
                    evictions: stats.evictions,
                    trimmed: stats.trimmed,
                    peak_reserved_bytes: stats.peak_bytes_reserved,
                    peak_live_bytes: st.peak_live_bytes,
                    idle_byte_seconds: st.idle_byte_seconds,
                    modelled_backing_seconds: seconds,
                    failures: st.failures,
                    span_seconds: span,
                    stats,
                    recording: st.recorder,
                }
            })
            .collect()
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
