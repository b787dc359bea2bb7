//! The configurations a [`Replayer`](super::Replayer) runs and its options.

use core::time::Duration;

use crate::trace::human_bytes;
use crate::{Packing, Reuse, SizeClass};

use super::cost::CostModel;

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
    /// A cache that never evicts ([`FixedTime`](crate::FixedTime) with an infinite time-to-live).
    KeepAll,
    /// [`FixedTime`](crate::FixedTime) with this time-to-live.
    FixedTime(Duration),
    /// [`Exponential`](crate::Exponential) with this half-life.
    Exponential(Duration),
    /// [`FixedCapacity`](crate::FixedCapacity) with this many slots.
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
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The name in reports.
    pub name: String,
    /// The eviction rule.
    pub policy: PolicyKind,
    /// How requests are rounded (default exact).
    pub size_class: SizeClass,
    /// Which cached block a hit hands out (default LIFO).
    pub reuse: Reuse,
    /// Pack small and medium requests into segments ([`PackedPool`](crate::PackedPool)) as
    /// this says (default: no packing). A setting without a
    /// [`capacity`](Packing::capacity) gets the replay's device capacity
    /// ([`CostModel::capacity`]), if any.
    pub packing: Option<Packing>,
    /// The pool's byte limit ([`Builder::limit`](crate::Builder::limit)):
    /// requests beyond it fail and count as failures (default: none).
    pub limit: Option<usize>,
    /// The pool's garbage-collection threshold
    /// ([`Builder::gc_threshold`](crate::Builder::gc_threshold), PyTorch's
    /// `garbage_collection_threshold`): a fraction in `(0, 1]` of the
    /// limit or, without one, of the device capacity
    /// ([`CostModel::capacity`]); with neither it does nothing (default:
    /// none). [`Replayer::new`](super::Replayer::new) panics on a fraction
    /// outside `(0, 1]`.
    pub gc_threshold: Option<f64>,
    /// Blocks on pages of this many bytes mapped into virtual ranges
    /// ([`Mapped`](crate::pages::Mapped) over the modelled
    /// [`ModelPages`](crate::pages::ModelPages), charged at
    /// [`PageCosts::PUBLISHED`](crate::pages::PageCosts::PUBLISHED), with
    /// the replay's device capacity) instead of the modelled allocator
    /// (default: none). The report then counts pages: backing allocations
    /// are pages created, backing frees the times pages went back, the
    /// peak reserved the most bytes of pages at once.
    pub pages: Option<PageSize>,
    /// On pages: how long a spare page is kept before it goes back
    /// ([`Mapped::with_spare_ttl`](crate::pages::Mapped::with_spare_ttl));
    /// `None` (the default) for [`DEFAULT_SPARE_TTL`](crate::pages::DEFAULT_SPARE_TTL),
    /// `Some(Duration::MAX)` for never.
    pub spare_ttl: Option<Duration>,
}

/// The page size of a [`Config::pages`] configuration.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::{Config, PageSize};
/// assert_eq!(Config::mapped().pages, Some(PageSize::ForDevice));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSize {
    /// [`page_size_for`](crate::pages::page_size_for) the replay's device
    /// capacity: 20 MiB on a device of 1.25 GiB or more.
    ForDevice,
    /// This many bytes.
    Bytes(usize),
}

impl PageSize {
    /// The page in bytes on a device of `capacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::PageSize;
    /// assert_eq!(PageSize::Bytes(4096).bytes(Some(1 << 20)), 4096);
    /// assert_eq!(PageSize::ForDevice.bytes(None), 20 << 20);
    /// ```
    pub fn bytes(self, capacity: Option<usize>) -> usize {
        match self {
            PageSize::ForDevice => crate::pages::page_size_for(capacity),
            PageSize::Bytes(n) => n,
        }
    }
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
            gc_threshold: None,
            pages: None,
            spare_ttl: None,
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

    /// `mapped`, the recommended configuration for dynamic shapes: blocks
    /// on pages of [`RECOMMENDED_PAGE`](crate::pages::RECOMMENDED_PAGE)
    /// bytes (smaller on a device under 1.25 GiB: [`PageSize::ForDevice`]) ([`pages::Mapped`](crate::pages::Mapped), whose spare pages
    /// decay after [`DEFAULT_SPARE_TTL`](crate::pages::DEFAULT_SPARE_TTL)),
    /// small requests packed into segments ([`Packing::mapped`]), and a
    /// pool that keeps no block of its own (`fixed-capacity 0`): the free
    /// space of the mapped ranges is the cache, reused by best fit with
    /// no call, as expandable segments reuse theirs.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = decaying_pool::trace::Config::mapped();
    /// assert_eq!(c.name, "mapped");
    /// ```
    pub fn mapped() -> Config {
        Config::new(PolicyKind::FixedCapacity(0))
            .packing(Packing::mapped())
            .with_pages(PageSize::ForDevice)
            .named("mapped")
    }

    /// The same with spare pages kept `ttl` before they go back
    /// ([`Duration::MAX`]: never); see [`spare_ttl`](Self::spare_ttl).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::Config;
    /// let c = Config::mapped().with_spare_ttl(Duration::MAX);
    /// assert_eq!(c.spare_ttl, Some(Duration::MAX));
    /// ```
    pub fn with_spare_ttl(mut self, ttl: Duration) -> Self {
        self.spare_ttl = Some(ttl);
        self
    }

    /// The same on pages of that size (see [`pages`](Self::pages)).
    pub fn with_pages(mut self, page: PageSize) -> Self {
        self.pages = Some(page);
        self
    }

    /// The same on pages of `page` bytes mapped into virtual ranges (see
    /// [`pages`](Self::pages)); the name is unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
    /// use decaying_pool::Packing;
    ///
    /// let mapped = Config::new(PolicyKind::FixedTime(Duration::from_secs(1)))
    ///     .packing(Packing::default())
    ///     .pages(20 << 20)
    ///     .named("mapped");
    /// let mut r = Replayer::new(&[mapped], ReplayOptions::default());
    /// let ms = Duration::from_millis;
    /// // A cache one step longer every step: the pages move, none is added
    /// // past the largest.
    /// for step in 1..=50u64 {
    ///     r.event(&Event::alloc(ms(step), 0x10, (200 + step) << 20));
    ///     r.event(&Event::free(ms(step), 0x10, (200 + step) << 20));
    /// }
    /// let rep = &r.finish("grow")[0];
    /// assert_eq!(rep.pages_created, 13); // 250 MiB in pages of 20 MiB
    /// assert_eq!(rep.failures, 0);
    /// ```
    pub fn pages(mut self, page: usize) -> Self {
        self.pages = Some(PageSize::Bytes(page));
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
        self.name = format!("{}, limit {}", self.name, human_bytes(bytes as f64));
        self
    }

    /// The same with a garbage-collection threshold, a fraction in
    /// `(0, 1]` of the limit or of the device capacity (the name says it:
    /// `gc 0.8`). Once a miss would bring the bytes reserved past it, idle
    /// blocks go back oldest first until they are under it
    /// ([`Builder::gc_threshold`](crate::Builder::gc_threshold)).
    ///
    /// # Panics
    ///
    /// When `fraction` is not in `(0, 1]` (NaN included).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
    /// let c = Config::new(PolicyKind::KeepAll).limit(1000).gc_threshold(0.5);
    /// assert_eq!(c.name, "keep-all, limit 1000 B, gc 0.5");
    /// let mut r = Replayer::new(&[Config::new(PolicyKind::KeepAll).limit(1000), c], ReplayOptions::default());
    /// r.event(&Event::alloc(Default::default(), 1, 400));
    /// r.event(&Event::free(Default::default(), 1, 400));
    /// r.event(&Event::alloc(Default::default(), 2, 300)); // 700 > 500: the 400 go back
    /// let reports = r.finish("w");
    /// assert_eq!((reports[0].peak_reserved_bytes, reports[0].evictions), (700, 0));
    /// assert_eq!((reports[1].peak_reserved_bytes, reports[1].evictions), (400, 1));
    /// ```
    #[track_caller]
    pub fn gc_threshold(mut self, fraction: f64) -> Self {
        assert!(
            fraction > 0.0 && fraction <= 1.0,
            "gc_threshold: {fraction} is not a fraction in (0, 1]"
        );
        self.gc_threshold = Some(fraction);
        self.name = format!("{}, gc {fraction}", self.name);
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
    /// (`fixed-time 1s`), and `mapped` ([`Config::mapped`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let names: Vec<String> = decaying_pool::trace::Config::defaults().into_iter().map(|c| c.name).collect();
    /// assert_eq!(names[..3], ["no-pool", "keep-all", "fixed-time 10ms"]);
    /// assert_eq!(names.len(), 10);
    /// assert_eq!(names[8..], ["packed", "mapped"]);
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
            Config::mapped(),
        ]
    }
}

/// How a [`Replayer`](super::Replayer) runs.
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
    /// Keep a [`StatsTimeline`](crate::trace::StatsTimeline) per configuration (default `false`: no cost).
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
