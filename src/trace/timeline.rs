//! The event recorder: a pool's stats over time, as counter tracks and
//! instant events.

use core::time::Duration;

use crate::Stats;

/// The counters of one moment, as a [`StatsTimeline`] keeps them.
///
/// [`Sample::from_stats`] fills the figures a pool's [`Stats`] has; the
/// bands that need more than the pool knows (`bytes_live`,
/// `bytes_free_in_segments`) are zero there, and whoever knows them sets
/// them and records the sample with [`StatsTimeline::record_sample`] or
/// [`StatsTimeline::record_with`] (the replayer does).
///
/// # Examples
///
/// ```
/// let s = decaying_pool::trace::Sample::default();
/// assert_eq!(s.bytes_reserved, s.bytes_in_use + s.bytes_cached);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// When.
    pub time: Duration,
    /// [`Stats::bytes_in_use`].
    pub bytes_in_use: usize,
    /// [`Stats::bytes_cached`]: the cached blocks.
    pub bytes_cached: usize,
    /// [`Stats::bytes_reserved`].
    pub bytes_reserved: usize,
    /// [`Stats::bytes_from_pool`] (cumulative).
    pub bytes_from_pool: usize,
    /// [`Stats::bytes_from_backing`] (cumulative).
    pub bytes_from_backing: usize,
    /// Bytes the live blocks' requests asked for (a part of
    /// `bytes_in_use`: the rest is rounding and free space inside
    /// segments); 0 when not known, as [`Sample::from_stats`] leaves it.
    pub bytes_live: usize,
    /// Free space inside the segments a packed pool holds
    /// ([`PackingStats::free_segment_bytes`](crate::PackingStats::free_segment_bytes)),
    /// a part of `bytes_in_use` when the counters are the exact pool's,
    /// where a segment is one block in use; 0 for a plain pool, and as
    /// [`Sample::from_stats`] leaves it.
    pub bytes_free_in_segments: usize,
    /// [`Stats::bytes_spare`]: pages of the backing allocator that no block
    /// touches, counted in neither `bytes_in_use` nor `bytes_cached`.
    pub bytes_spare: usize,
}

impl Sample {
    /// The sample of `stats` at `time`: the figures [`Stats`] has, with
    /// `bytes_live` and `bytes_free_in_segments` 0 (not known).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::{trace::Sample, Stats};
    /// let mut stats = Stats::default();
    /// stats.bytes_in_use = 4096;
    /// stats.bytes_reserved = 4096;
    /// stats.bytes_spare = 512;
    /// let s = Sample::from_stats(Duration::from_millis(3), &stats);
    /// assert_eq!((s.bytes_in_use, s.bytes_reserved, s.bytes_spare), (4096, 4096, 512));
    /// assert_eq!((s.bytes_live, s.bytes_free_in_segments), (0, 0));
    /// ```
    pub fn from_stats(time: Duration, s: &Stats) -> Self {
        Sample {
            time,
            bytes_in_use: s.bytes_in_use,
            bytes_cached: s.bytes_cached,
            bytes_reserved: s.bytes_reserved,
            bytes_from_pool: s.bytes_from_pool,
            bytes_from_backing: s.bytes_from_backing,
            bytes_live: 0,
            bytes_free_in_segments: 0,
            bytes_spare: s.bytes_spare,
        }
    }

    fn same_values(&self, o: &Sample) -> bool {
        let values = |s: &Sample| {
            (
                s.bytes_in_use,
                s.bytes_cached,
                s.bytes_reserved,
                s.bytes_from_pool,
                s.bytes_from_backing,
                s.bytes_live,
                s.bytes_free_in_segments,
                s.bytes_spare,
            )
        };
        values(self) == values(o)
    }
}

/// What an [`Instant`] event marks.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::InstantKind;
/// assert_eq!(InstantKind::Eviction.name(), "eviction");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstantKind {
    /// Cached blocks freed by the policy ([`Stats::evictions`] grew).
    Eviction,
    /// Cached blocks freed by `trim`, the limit or the out-of-memory retry
    /// ([`Stats::trimmed`] grew).
    Trim,
    /// Backing allocations failed ([`Stats::backing_failures`] grew).
    BackingFailure,
}

impl InstantKind {
    /// The event's name in exports.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::InstantKind;
    /// assert_eq!(InstantKind::BackingFailure.name(), "backing_failure");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            InstantKind::Eviction => "eviction",
            InstantKind::Trim => "trim",
            InstantKind::BackingFailure => "backing_failure",
        }
    }
}

/// Something that happened at one moment: `count` blocks evicted, trimmed,
/// or backing calls failed.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::{Instant, InstantKind};
/// let i = Instant { time: Default::default(), kind: InstantKind::Trim, count: 2 };
/// assert_eq!(i.count, 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instant {
    /// When.
    pub time: Duration,
    /// What.
    pub kind: InstantKind,
    /// How many blocks (or failed calls) since the previous record.
    pub count: u64,
}

/// Records a pool's counters over time, built outside the pool: feed it
/// `(time, pool.stats())` after each call. It keeps a [`Sample`] whenever a
/// counter changed and derives [`Instant`] events from the growth of
/// `evictions`, `trimmed` and `backing_failures`. A pool that is not
/// recorded pays nothing.
///
/// With a resolution, samples closer together than it are merged into one
/// per interval (the one with the most bytes reserved, so peaks survive)
/// and instants into one per kind and interval: a long trace then costs
/// memory proportional to its duration, not its length.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::trace::{InstantKind, StatsTimeline};
/// use decaying_pool::{Clock, DecayingPool, FixedTime, ManualClock};
///
/// let clock = ManualClock::new();
/// let mut pool = DecayingPool::builder(CheckingAllocator::new())
///     .policy(FixedTime::new(Duration::from_millis(10)))
///     .clock(clock.clone())
///     .build();
/// let mut rec = StatsTimeline::new("fixed-time 10ms");
/// let b = pool.allocate(4096).unwrap();
/// rec.record(clock.now(), &pool.stats());
/// unsafe { pool.release(b, 4096) };
/// rec.record(clock.now(), &pool.stats());
/// clock.advance(Duration::from_millis(10));
/// pool.collect();
/// rec.record(clock.now(), &pool.stats());
///
/// assert_eq!(rec.samples().len(), 3);
/// assert_eq!(rec.samples()[1].bytes_cached, 4096);
/// assert_eq!(rec.instants()[0].kind, InstantKind::Eviction);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct StatsTimeline {
    name: String,
    resolution: Duration,
    samples: Vec<Sample>,
    instants: Vec<Instant>,
    prev: Option<Stats>,
    bucket_start: usize,
}

impl StatsTimeline {
    /// A recorder that keeps every change; `name` labels its tracks.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::trace::StatsTimeline::new("keep-all").name(), "keep-all");
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        Self::with_resolution(name, Duration::ZERO)
    }

    /// A recorder that keeps at most one sample per `resolution` of time.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::StatsTimeline;
    /// use decaying_pool::Stats;
    /// let mut r = StatsTimeline::with_resolution("p", Duration::from_millis(1));
    /// for us in 0..10u64 {
    ///     let mut s = Stats::default();
    ///     s.bytes_in_use = us as usize;
    ///     s.bytes_reserved = us as usize;
    ///     r.record(Duration::from_micros(us * 300), &s);
    /// }
    /// // one per interval [0,1), [1,2), [2,3) ms: the peak (here also the last state)
    /// assert_eq!(r.samples().len(), 3);
    /// assert_eq!(r.samples()[0].bytes_in_use, 3);
    /// ```
    pub fn with_resolution(name: impl Into<String>, resolution: Duration) -> Self {
        StatsTimeline {
            name: name.into(),
            resolution,
            samples: Vec::new(),
            instants: Vec::new(),
            prev: None,
            bucket_start: 0,
        }
    }

    /// The label of this recorder's tracks.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::trace::StatsTimeline::new("x").name(), "x");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Records the pool's `stats` at `time` (times should not go
    /// backwards): the instant events their counters' growth tells, and
    /// their [`Sample::from_stats`] as [`record_sample`](Self::record_sample)
    /// does.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{trace::StatsTimeline, Stats};
    /// let mut r = StatsTimeline::new("p");
    /// r.record(Default::default(), &Stats::default());
    /// r.record(Default::default(), &Stats::default()); // nothing changed
    /// assert_eq!(r.samples().len(), 1);
    /// ```
    pub fn record(&mut self, time: Duration, stats: &Stats) {
        self.record_with(stats, Sample::from_stats(time, stats));
    }

    /// Records the pool's `stats` with a sample of its own: the instant
    /// events the counters' growth tells, at `sample.time`, and `sample`
    /// as [`record_sample`](Self::record_sample) does. For a sample that
    /// carries what [`Sample::from_stats`] does not know (the live bytes,
    /// free space inside segments).
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::{InstantKind, Sample, StatsTimeline};
    /// use decaying_pool::Stats;
    /// let mut r = StatsTimeline::new("p");
    /// let mut stats = Stats::default();
    /// stats.bytes_in_use = 4096;
    /// stats.bytes_reserved = 4096;
    /// stats.evictions = 1;
    /// let t = Duration::from_millis(1);
    /// r.record_with(&stats, Sample { bytes_live: 3000, ..Sample::from_stats(t, &stats) });
    /// assert_eq!(r.samples()[0].bytes_live, 3000);
    /// assert_eq!((r.instants()[0].kind, r.instants()[0].time), (InstantKind::Eviction, t));
    /// ```
    pub fn record_with(&mut self, stats: &Stats, sample: Sample) {
        let time = sample.time;
        let prev = self.prev.unwrap_or_default();
        for (kind, now, before) in [
            (InstantKind::Eviction, stats.evictions, prev.evictions),
            (InstantKind::Trim, stats.trimmed, prev.trimmed),
            (
                InstantKind::BackingFailure,
                stats.backing_failures,
                prev.backing_failures,
            ),
        ] {
            if now > before {
                self.instant(Instant {
                    time,
                    kind,
                    count: now - before,
                });
            }
        }
        self.prev = Some(*stats);
        self.record_sample(sample);
    }

    /// Records `sample` (times should not go backwards): kept when a value
    /// changed since the last one kept; with a resolution, merged into its
    /// interval (the interval's peak of bytes reserved and its last state
    /// survive). It derives no instant events (a sample has no counts of
    /// evictions): [`record`](Self::record) and
    /// [`record_with`](Self::record_with) do.
    ///
    /// # Examples
    ///
    /// ```
    /// use core::time::Duration;
    /// use decaying_pool::trace::{Sample, StatsTimeline};
    /// let mut r = StatsTimeline::new("p");
    /// let s = Sample { time: Duration::from_millis(1), bytes_in_use: 4096, bytes_reserved: 4096,
    ///                  bytes_live: 3000, ..Default::default() };
    /// r.record_sample(s);
    /// r.record_sample(Sample { time: Duration::from_millis(2), ..s }); // nothing changed
    /// r.record_sample(Sample { time: Duration::from_millis(3), bytes_live: 2000, ..s });
    /// assert_eq!(r.samples().len(), 2);
    /// assert_eq!(r.samples()[1].bytes_live, 2000);
    /// assert!(r.instants().is_empty());
    /// ```
    pub fn record_sample(&mut self, sample: Sample) {
        let time = sample.time;
        if !self.resolution.is_zero() {
            if let Some(peak) = self.samples.get(self.bucket_start).copied() {
                if self.same_bucket(peak.time, time) {
                    // Keep the bucket's peak at its start and its last state.
                    if sample.bytes_reserved >= peak.bytes_reserved {
                        self.samples[self.bucket_start] = Sample {
                            time: peak.time,
                            ..sample
                        };
                        self.samples.truncate(self.bucket_start + 1);
                    } else if self.samples.len() == self.bucket_start + 2 {
                        self.samples[self.bucket_start + 1] = sample;
                    } else {
                        self.samples.push(sample);
                    }
                    return;
                }
            }
        }
        if let Some(last) = self.samples.last() {
            if last.same_values(&sample) {
                return;
            }
        }
        self.bucket_start = self.samples.len();
        self.samples.push(sample);
    }

    fn same_bucket(&self, a: Duration, b: Duration) -> bool {
        if self.resolution.is_zero() {
            return a == b;
        }
        let r = self.resolution.as_nanos();
        a.as_nanos() / r == b.as_nanos() / r
    }

    fn instant(&mut self, i: Instant) {
        let bucket = self.resolution;
        if let Some(last) = self
            .instants
            .iter_mut()
            .rev()
            .take(3)
            .find(|l| l.kind == i.kind)
        {
            let same = if bucket.is_zero() {
                last.time == i.time
            } else {
                last.time.as_nanos() / bucket.as_nanos() == i.time.as_nanos() / bucket.as_nanos()
            };
            if same {
                last.count += i.count;
                return;
            }
        }
        self.instants.push(i);
    }

    /// The samples, in time order: one per change of the counters.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(decaying_pool::trace::StatsTimeline::new("p").samples().is_empty());
    /// ```
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The instant events, in time order.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(decaying_pool::trace::StatsTimeline::new("p").instants().is_empty());
    /// ```
    pub fn instants(&self) -> &[Instant] {
        &self.instants
    }
}
