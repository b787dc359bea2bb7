//! [`Replayer`]: one trace through every configuration at once.

use core::fmt;
use core::time::Duration;
use std::collections::{HashMap, HashSet};

use crate::packing::Packable;
use crate::pages::{Mapped, MappedStats, ModelPages};
use crate::policy::Policy;
use crate::trace::{Event, Op, Sample, StatsTimeline};
use crate::{DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, PackedPool, Stats};

use super::config::{Config, PolicyKind, ReplayOptions};
use super::cost::ModelledAllocator;
use super::report::Report;

/// One configuration under replay (object-safe, so pools of different
/// policy types sit in one list).
trait Sim {
    fn alloc(&mut self, addr: u64, size: usize);
    fn free(&mut self, addr: u64);
    fn collect(&mut self);
    /// Whether a collection now would free nothing: the policy never
    /// frees on a collection, or nothing is cached.
    fn quiet(&self) -> bool;
    fn release_all(&mut self);
    fn stats(&self) -> Stats;
    /// The counters at `time` with the timeline's bands: `stats()` as the
    /// sample's base, the live bytes, free space inside segments, and on
    /// pages the spare bytes apart from the cached blocks.
    fn sample(&self, stats: &Stats, time: Duration) -> Sample;
    fn state(&mut self) -> &mut SimState;
    /// The counters, the modelled backing seconds, the hits, the pages.
    fn report(&mut self) -> (Stats, f64, u64, Option<MappedStats>);
}

#[derive(Default)]
struct SimState {
    name: String,
    allocs: u64,
    failures: u64,
    live_bytes: usize,
    peak_live_bytes: usize,
    idle_byte_seconds: f64,
    recorder: Option<StatsTimeline>,
    /// The policy frees blocks on a collection (a time-to-live or a
    /// half-life; not keep-all, no pool or a fixed capacity).
    decays: bool,
}

/// What a [`PoolSim`] needs of its backing allocator: the modelled
/// allocator, or pages mapped on the modelled page backend (whose page
/// figures come from [`RawAllocator::pages`](crate::RawAllocator::pages)).
trait SimBacking: Packable + 'static {
    fn id(block: Self::Block) -> u64;
    fn block(id: u64) -> Self::Block;
    fn modelled_seconds(&self) -> f64;
    /// The pool's counters as the backing allocator sees them: on pages,
    /// the bytes reserved are the pages', the spare pages count as cached,
    /// the backing calls are pages created and times pages went back.
    fn backing_view(&self, stats: Stats) -> Stats {
        stats
    }
}

impl SimBacking for ModelledAllocator {
    fn id(block: u64) -> u64 {
        block
    }
    fn block(id: u64) -> u64 {
        id
    }
    fn modelled_seconds(&self) -> f64 {
        ModelledAllocator::modelled_seconds(self)
    }
}

impl SimBacking for Mapped<ModelPages, ManualClock> {
    fn id(block: usize) -> u64 {
        block as u64
    }
    fn block(id: u64) -> usize {
        // Ids are the addresses this allocator handed out.
        id as usize
    }
    fn modelled_seconds(&self) -> f64 {
        self.backend().modelled_time().as_secs_f64()
    }
    fn backing_view(&self, mut stats: Stats) -> Stats {
        let p = self.stats();
        stats.bytes_reserved = p.page_bytes;
        stats.peak_bytes_reserved = p.peak_page_bytes;
        stats.bytes_cached += p.spare_bytes;
        stats.backing_allocs = p.pages_created;
        stats.backing_deallocs = p.release_calls;
        // A request the mapped free space served made no call: a hit.
        stats.hits += p.reused;
        stats
    }
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
    fn pages(&self) -> Option<MappedStats>;
    /// Free space inside the segments a packed pool holds (0 for a plain
    /// pool): a part of the bytes in use of `stats()`, the exact pool's.
    fn free_segment_bytes(&self) -> usize;
}

impl<A: SimBacking, P: Policy> SimPool for DecayingPool<A, P, ManualClock> {
    fn allocate(&mut self, size: usize) -> Option<u64> {
        DecayingPool::allocate(self, size).ok().map(A::id)
    }
    unsafe fn release(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract.
        unsafe { DecayingPool::release(self, A::block(block), size) }
    }
    fn collect(&mut self) {
        DecayingPool::collect(self);
    }
    fn stats(&self) -> Stats {
        self.allocator().backing_view(DecayingPool::stats(self))
    }
    fn hits(&self) -> u64 {
        self.stats().hits
    }
    fn modelled_seconds(&self) -> f64 {
        self.allocator().modelled_seconds()
    }
    fn pages(&self) -> Option<MappedStats> {
        self.allocator().pages()
    }
    fn free_segment_bytes(&self) -> usize {
        0
    }
}

impl<A: SimBacking, P: Policy> SimPool for PackedPool<A, P, ManualClock> {
    fn allocate(&mut self, size: usize) -> Option<u64> {
        PackedPool::allocate(self, size).ok().map(A::id)
    }
    unsafe fn release(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract.
        unsafe { PackedPool::release(self, A::block(block), size) }
    }
    fn collect(&mut self) {
        PackedPool::collect(self);
    }
    fn stats(&self) -> Stats {
        // The exact pool's counters: the backing calls, the bytes reserved,
        // and as idle bytes the blocks it caches (free space inside held
        // segments is not counted idle).
        self.pool().allocator().backing_view(self.pool().stats())
    }
    fn hits(&self) -> u64 {
        PackedPool::stats(self).hits + self.pool().allocator().pages().map_or(0, |p| p.reused)
    }
    fn modelled_seconds(&self) -> f64 {
        self.pool().allocator().modelled_seconds()
    }
    fn pages(&self) -> Option<MappedStats> {
        self.pool().allocator().pages()
    }
    fn free_segment_bytes(&self) -> usize {
        self.packing_stats().free_segment_bytes
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

    fn quiet(&self) -> bool {
        (!self.st.decays || self.pool.stats().bytes_cached == 0)
            && self.pool.pages().is_none_or(|p| p.spare_bytes == 0)
    }

    fn release_all(&mut self) {
        // In ascending order of trace address: the order decides what a
        // policy keeps, and a replay must not depend on a hash seed.
        let mut addrs: Vec<u64> = self.live.keys().copied().collect();
        addrs.sort_unstable();
        for a in addrs {
            self.free(a);
        }
        self.failed.clear();
    }

    fn stats(&self) -> Stats {
        self.pool.stats()
    }

    fn sample(&self, stats: &Stats, time: Duration) -> Sample {
        let mut sample = Sample::from_stats(time, stats);
        sample.bytes_live = self.st.live_bytes;
        sample.bytes_free_in_segments = self.pool.free_segment_bytes();
        if let Some(p) = self.pool.pages() {
            // `backing_view` counts the spare pages as cached (for the
            // tables); the timeline draws them as a band of their own.
            sample.bytes_cached = stats.bytes_cached.saturating_sub(p.spare_bytes);
            sample.bytes_spare = p.spare_bytes;
        }
        sample
    }

    fn state(&mut self) -> &mut SimState {
        &mut self.st
    }

    fn report(&mut self) -> (Stats, f64, u64, Option<MappedStats>) {
        (
            self.pool.stats(),
            self.pool.modelled_seconds(),
            self.pool.hits(),
            self.pool.pages(),
        )
    }
}

fn sim<P: Policy + 'static>(
    policy: P,
    config: &Config,
    clock: &ManualClock,
    options: &ReplayOptions,
) -> Box<dyn Sim> {
    if let Some(page) = config.pages {
        let page = page.bytes(options.cost.capacity()).max(1);
        let mut backend = ModelPages::new(page).expect("a page of at least one byte");
        if let Some(capacity) = options.cost.capacity() {
            backend = backend.with_capacity(capacity);
        }
        let mut alloc = Mapped::with_clock(backend, clock.clone());
        if let Some(capacity) = options.cost.capacity() {
            alloc = alloc.with_capacity(capacity);
        }
        if let Some(ttl) = config.spare_ttl {
            alloc = alloc.with_spare_ttl((ttl != Duration::MAX).then_some(ttl));
        }
        return sim_on(alloc, policy, config, clock, options);
    }
    let mut alloc = ModelledAllocator::new(options.cost.clone());
    if config.gc_threshold.is_some() {
        // The threshold takes a fraction of the device without a limit.
        alloc = alloc.reporting_capacity();
    }
    sim_on(alloc, policy, config, clock, options)
}

fn sim_on<A: SimBacking, P: Policy + 'static>(
    alloc: A,
    policy: P,
    config: &Config,
    clock: &ManualClock,
    options: &ReplayOptions,
) -> Box<dyn Sim> {
    let mut builder = DecayingPool::builder(alloc)
        .policy(policy)
        .clock(clock.clone())
        .size_class(config.size_class)
        .reuse(config.reuse);
    if let Some(limit) = config.limit {
        builder = builder.limit(limit);
    }
    if let Some(fraction) = config.gc_threshold {
        builder = builder.gc_threshold(fraction);
    }
    let st = SimState {
        name: config.name.clone(),
        recorder: options
            .record
            .then(|| StatsTimeline::with_resolution(&config.name, options.record_resolution)),
        decays: matches!(
            config.policy,
            PolicyKind::FixedTime(_) | PolicyKind::Exponential(_)
        ),
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
/// live are released at its end (the program's iteration ends), in
/// ascending order of their trace addresses, so they sit idle in the cache
/// during the gap. Nothing in a replay depends on a hash seed: the same
/// trace and options give the same reports.
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
                PolicyKind::Exponential(h) => sim(Exponential::new(h), c, &clock, &options),
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
    ///
    /// Once no pool holds a block that a collection could free, the ticks
    /// left before `now` would change nothing, and are passed over at
    /// once: a trace whose clock jumps by years (or `--gap` of years)
    /// costs a few ticks, not one per period. `next_tick` is `u64::MAX`
    /// when no tick is left (none at 584 years).
    fn at(&mut self, now: u64) {
        let period = self.options.reaper.map_or(u64::MAX, duration_nanos).max(1);
        while self.next_tick <= now && self.next_tick != u64::MAX {
            let tick = self.next_tick;
            if self.sims.iter().all(|s| s.quiet()) {
                // The first tick after `now`.
                let ticks = (now - tick) / period + 1;
                self.next_tick = ticks
                    .checked_mul(period)
                    .and_then(|d| tick.checked_add(d))
                    .unwrap_or(u64::MAX);
                break;
            }
            self.advance(tick);
            for s in &mut self.sims {
                s.collect();
            }
            self.after_step();
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
            let sample = s.sample(&stats, t);
            if let Some(r) = s.state().recorder.as_mut() {
                r.record_with(&stats, sample);
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
                let (stats, seconds, hits, pages) = s.report();
                let st = std::mem::take(s.state());
                let p = pages.unwrap_or_default();
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
                    pages_created: p.pages_created,
                    pages_released: p.pages_released,
                    maps: p.maps,
                    unmaps: p.unmaps,
                    peak_live_bytes: st.peak_live_bytes,
                    idle_byte_seconds: st.idle_byte_seconds,
                    modelled_backing_seconds: seconds,
                    failures: st.failures,
                    span_seconds: span,
                    stats,
                    timeline: st.recorder,
                }
            })
            .collect()
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
