//! The reference model that both harnesses check the pool against: the
//! documented contract (the rules listed under "Rules every pool keeps" in
//! `docs/ARCHITECTURE.md`, and the item docs of the pool, the policies and
//! `SizeClass`), written as plainly as possible.

use crate::SizeClass;
use crate::error::PoolError;
use crate::policy::{FixedCapacity, NEAR_ONE, Reuse, clamp_ratio};
use crate::stats::Stats;
use crate::testing::{Call, TestError};

use super::input::{Config, Fault, Kind, TICK_NS, ticks};
use super::{Answer, Answers, Summary, lock_answers};

/// The size-class rule, written from the `SizeClass` docs (not from
/// `SizeClass::round`): the model's rounding.
///
/// # Examples
///
/// ```
/// use decaying_pool::{fuzzing::model_round, SizeClass};
/// assert_eq!(model_round(SizeClass::PowerOfTwoDivisions(4), 1100), Some(1280));
/// assert_eq!(model_round(SizeClass::PowerOfTwoDivisions(3), 3), Some(3));
/// ```
pub fn model_round(rule: SizeClass, size: usize) -> Option<usize> {
    fn next_pow2(size: usize) -> Option<usize> {
        let mut p: usize = 1;
        while p < size {
            p = p.checked_mul(2)?;
        }
        Some(p)
    }
    if size == 0 {
        return None;
    }
    match rule {
        SizeClass::Exact => Some(size),
        SizeClass::PowerOfTwo => next_pow2(size),
        SizeClass::Multiple(n) if n <= 1 => Some(size),
        SizeClass::Multiple(n) => match size % n {
            0 => Some(size),
            r => size.checked_add(n - r),
        },
        SizeClass::PowerOfTwoDivisions(k) => {
            if size.is_power_of_two() {
                return Some(size);
            }
            if k <= 1 {
                return next_pow2(size);
            }
            let mut floor: u128 = 1;
            while floor * 2 <= size as u128 {
                floor *= 2;
            }
            let k = u128::from(k);
            (1..=k)
                .map(|i| floor + (i * floor).div_ceil(k))
                .find(|&step| step >= size as u128)
                .and_then(|step| usize::try_from(step).ok())
        }
    }
}

/// A block the model holds, counted by its class.
pub(super) trait Classed {
    fn class(&self) -> usize;
}

/// A `Vec` of the model's blocks that keeps the sum of their classes as it
/// changes, so the byte totals every step's check reads cost O(1) (the
/// periodic check recounts them: [`Model::assert_consistent`]). Reads go
/// through the slice; every change goes through a method here.
#[derive(Clone, Debug)]
pub(super) struct Blocks<T> {
    items: Vec<T>,
    bytes: usize,
}

impl<T: Classed> Blocks<T> {
    fn new() -> Self {
        Blocks {
            items: Vec::new(),
            bytes: 0,
        }
    }

    fn push(&mut self, block: T) {
        self.bytes += block.class();
        self.items.push(block);
    }

    fn remove(&mut self, i: usize) -> T {
        let block = self.items.remove(i);
        self.bytes -= block.class();
        block
    }

    fn pop(&mut self) -> Option<T> {
        let block = self.items.pop()?;
        self.bytes -= block.class();
        Some(block)
    }

    /// The sum of the classes, as kept.
    fn bytes(&self) -> usize {
        self.bytes
    }

    /// The sum of the classes, recounted.
    fn recount(&self) -> usize {
        self.items.iter().map(T::class).sum()
    }
}

impl<T> core::ops::Deref for Blocks<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.items
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Idle {
    pub(super) block: u64,
    class: usize,
    released: u64,
}

/// What the cache step of an `allocate` chose.
enum Chosen {
    /// A cached block, now in use.
    Hit(u64),
    /// A miss of this class, with room made under the limit.
    Miss(usize),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Live {
    pub(super) block: u64,
    pub(super) size: usize,
    class: usize,
}

impl Classed for Idle {
    fn class(&self) -> usize {
        self.class
    }
}

impl Classed for Live {
    fn class(&self) -> usize {
        self.class
    }
}

type Outcome = Result<u64, PoolError<TestError>>;

/// An injected panic, where the model expects one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Injected;

/// What the model does with an injected panic: `Err(Injected)`.
pub(super) type Step<T = ()> = Result<T, Injected>;

/// How the pool being checked hands blocks to the backing `deallocate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Frees {
    /// At once, as the cache lets each go (`DecayingPool`): a panicking
    /// `deallocate` stops the operation there.
    Immediate,
    /// Collected under the cache lock and offered after the cache step
    /// (`SharedPool`): a panicking `deallocate` stops nothing, every block
    /// is offered, the panic is passed on after.
    Deferred,
}

#[derive(Clone)]
pub(super) struct Model {
    pub(super) cfg: Config,
    now: u64,
    pub(super) idle: Blocks<Idle>,
    pub(super) live: Blocks<Live>,
    issued: u64,
    pub(super) fail_next: u32,
    /// The backing calls the pool must have made, in order: push with
    /// [`record`](Self::record), which counts them.
    calls: Vec<Call>,
    /// The `Allocate` and `Deallocate` calls in `calls`.
    allocs: u64,
    deallocs: u64,
    /// `Exponential`'s allowance as a share of the bytes cached (the
    /// allowance is `ratio * bytes_cached`), as of tick `allowance_at`.
    ratio: f64,
    allowance_at: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    trimmed: u64,
    pub(super) backing_failures: u64,
    retries: u64,
    second_rung: u64,
    peak_reserved: usize,
    peak_in_use: usize,
    peak_live: usize,
    from_pool: usize,
    from_backing: usize,
    /// Calls left before each fault fires (0: disarmed), as the switches'.
    pub(super) armed: [u64; 8],
    /// Injected panics fired, by fault.
    pub(super) injected: [u64; 8],
    /// The timed store's cached deadline (nanoseconds): no eviction check
    /// calls the policy before it. Learned from the policy's answers: its
    /// `provisional_deadline` after a `must_evict` that said no, dropped on
    /// every free and when `deadline_stale` says so after a release or a
    /// hit.
    not_before: u64,
    /// Where the policy's answers are logged; `None` in a speculative copy
    /// (see [`Model::cache_step_frees_panic`]), which assumes no deadline.
    answers: Option<Answers>,
    /// Eviction checks skipped before the cached deadline.
    deadline_skips: u64,
    /// A policy hook panicked, so the policy may not have counted every
    /// cached block: the pool plans no deadline until the cache next
    /// empties through frees.
    untold: bool,
    pub(super) frees: Frees,
    /// Blocks let go in a deferred cache step, to offer after it.
    deferred: Vec<(u64, usize)>,
    /// The deallocate switch is disarmed for now (see
    /// [`SHARED_ALLOCATE_DEALLOCATE_PANICS`](super::SHARED_ALLOCATE_DEALLOCATE_PANICS)):
    /// calls do not count down.
    pub(super) mute_deallocate: bool,
    /// Class minus requested bytes over successful allocations (saturating).
    waste: usize,
}

impl Model {
    pub(super) fn new(cfg: Config, answers: Answers) -> Self {
        Model {
            cfg,
            now: 0,
            idle: Blocks::new(),
            live: Blocks::new(),
            issued: 0,
            fail_next: 0,
            calls: Vec::new(),
            allocs: 0,
            deallocs: 0,
            ratio: 0.0,
            allowance_at: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            trimmed: 0,
            backing_failures: 0,
            retries: 0,
            second_rung: 0,
            peak_reserved: 0,
            peak_in_use: 0,
            peak_live: 0,
            from_pool: 0,
            from_backing: 0,
            armed: [0; 8],
            injected: [0; 8],
            not_before: 0,
            answers: Some(answers),
            untold: false,
            deadline_skips: 0,
            frees: Frees::Immediate,
            deferred: Vec::new(),
            mute_deallocate: false,
            waste: 0,
        }
    }

    /// Whether the pool reads the clock and has an `EvictionPolicy`.
    fn timed(&self) -> bool {
        !matches!(self.cfg.kind, Kind::FixedCapacity { .. })
    }

    /// Arms `fault` on the `nth` call from now, disarming the others.
    pub(super) fn inject(&mut self, fault: Fault, nth: u8) {
        self.armed = [0; 8];
        self.armed[fault as usize] = u64::from(nth);
    }

    /// A call through `fault`'s switch: counts it down, `Err` when it fires.
    fn fire(&mut self, fault: Fault) -> Step {
        if fault == Fault::Deallocate && self.mute_deallocate {
            return Ok(());
        }
        let left = &mut self.armed[fault as usize];
        match *left {
            0 => Ok(()),
            1 => {
                *left = 0;
                self.injected[fault as usize] += 1;
                Err(Injected)
            }
            _ => {
                *left -= 1;
                Ok(())
            }
        }
    }

    /// A call of the clock or the policy: only a timed store makes it.
    fn hook(&mut self, fault: Fault) -> Step {
        if self.timed() {
            self.fire(fault)
        } else {
            Ok(())
        }
    }

    /// The next answer the policy gave the pool, which must be of the kind
    /// the contract says the pool asks for here.
    fn answer(&mut self, what: &str) -> Option<Answer> {
        let answers = self.answers.as_ref()?;
        let got = lock_answers(answers).pop_front();
        assert!(
            got.is_some(),
            "the pool did not ask the policy's {what} where the contract says it does \
             (is every defaulted EvictionPolicy method forwarded by the wrappers?)"
        );
        got
    }

    /// The deadline the policy gives the pool for `oldest`, after a
    /// `must_evict` that said no, as nanoseconds (0: none).
    fn deadline_answer(&mut self, oldest: Idle) -> u64 {
        let due = match self.answer("provisional_deadline") {
            None => return 0,
            Some(Answer::Deadline(due)) => due,
            Some(other) => panic!("wanted a provisional_deadline answer, got {other:?}"),
        };
        if let Kind::FixedTime { ttl } = self.cfg.kind {
            assert_eq!(
                due,
                Some(ticks(oldest.released.saturating_add(ttl))),
                "FixedTime's deadline: the oldest block's release plus the ttl"
            );
        }
        due.map_or(0, |d| {
            d.as_secs()
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::from(d.subsec_nanos()))
        })
    }

    /// After a release or a hit told the policy: the pool asks whether its
    /// deadline went stale, and drops it if so.
    fn stale_answer(&mut self) {
        if !self.timed() {
            return;
        }
        let stale = match self.answer("deadline_stale") {
            None => true,
            Some(Answer::Stale(stale)) => stale,
            Some(other) => panic!("wanted a deadline_stale answer, got {other:?}"),
        };
        if matches!(self.cfg.kind, Kind::FixedTime { .. }) {
            assert!(!stale, "FixedTime's deadline never goes stale");
        }
        if stale {
            self.not_before = 0;
        }
    }

    /// Every answer the pool got was one the model expected.
    pub(super) fn assert_answers_taken(&self) {
        if let Some(answers) = &self.answers {
            let left = lock_answers(answers);
            assert!(
                left.is_empty(),
                "the policy answered calls the model does not expect: {left:?}"
            );
        }
    }

    /// The clock as the pool reads it, in nanoseconds.
    fn now_nanos(&self) -> u64 {
        self.now.saturating_mul(TICK_NS)
    }

    /// An eviction check the pool skipped before its cached deadline: the
    /// model must find nothing due (else the deadline was too late), and,
    /// since the policy is not asked, no clamp of `Exponential`'s
    /// allowance skipped (else the skip changed what the policy decides
    /// later).
    fn skipped_check(&mut self, oldest: Idle) {
        self.deadline_skips += 1;
        match self.cfg.kind {
            Kind::FixedTime { ttl } => assert!(
                self.now.saturating_sub(oldest.released) < ttl,
                "the pool skipped the eviction of a due block (FixedTime, released at \
                 tick {}, ttl {ttl}, now {})",
                oldest.released,
                self.now
            ),
            Kind::Exponential { half_life } => {
                let half = oldest.class as f64 / 2.0;
                let bytes = self.bytes_cached() as f64;
                let allowance = self.ratio_now(half_life) * bytes;
                assert!(
                    allowance <= bytes + half,
                    "the pool skipped a collection that clamps Exponential's allowance \
                     ({allowance} > {bytes} + {half}) at tick {}",
                    self.now
                );
                assert!(
                    bytes - allowance < half,
                    "the pool skipped the eviction of a due block (Exponential: {bytes} \
                     cached, allowance {allowance}, oldest {} bytes) at tick {}",
                    oldest.class,
                    self.now
                );
            }
            Kind::FixedCapacity { .. } => unreachable!("no deadline without a clock"),
        }
    }

    /// Offers the blocks a deferred cache step let go, every one even when
    /// a `deallocate` panics.
    fn flush(&mut self) -> Step {
        let mut out = Ok(());
        for (block, size) in core::mem::take(&mut self.deferred) {
            self.record(Call::Deallocate { block, size });
            if self.fire(Fault::Deallocate).is_err() {
                out = Err(Injected);
            }
        }
        out
    }

    /// Whether a `SharedPool` handle's `allocate` of `size` would have a
    /// `deallocate` panic among the blocks its cache step lets go (the
    /// fault
    /// [`SHARED_ALLOCATE_DEALLOCATE_PANICS`](super::SHARED_ALLOCATE_DEALLOCATE_PANICS)
    /// holds back).
    pub(super) fn cache_step_frees_panic(&self, size: usize) -> bool {
        if self.armed[Fault::Deallocate as usize] == 0 {
            return false;
        }
        let mut m = self.clone();
        m.answers = None;
        m.frees = Frees::Deferred;
        let before = m.injected[Fault::Deallocate as usize];
        let _ = (|| {
            m.hook(Fault::Clock)?;
            m.run_policy()?;
            m.choose(size)
        })();
        let _ = m.flush();
        m.injected[Fault::Deallocate as usize] > before
    }

    /// A cache step of a `SharedPool` handle operation: `f`, then the
    /// blocks it let go are offered; the first panic is passed on.
    fn section<T>(&mut self, f: impl FnOnce(&mut Self) -> Step<T>) -> Step<T> {
        let out = f(self);
        let flushed = self.flush();
        let out = out?;
        flushed.map(|()| out)
    }

    pub(super) fn class(&self, size: usize) -> Option<usize> {
        model_round(self.cfg.size_class, size)
    }

    fn bytes_cached(&self) -> usize {
        self.idle.bytes()
    }

    fn bytes_in_use(&self) -> usize {
        self.live.bytes()
    }

    /// The backing calls the pool must have made so far, in order.
    pub(super) fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// A backing call the pool must make now.
    fn record(&mut self, call: Call) {
        match call {
            Call::Allocate { .. } => self.allocs += 1,
            Call::Deallocate { .. } => self.deallocs += 1,
        }
        self.calls.push(call);
    }

    /// Recounts what the model keeps as it goes (the bytes cached and in
    /// use, the backing calls by kind) from its blocks and its call log:
    /// O(n), for the periodic whole-pool check.
    pub(super) fn assert_consistent(&self) {
        assert_eq!(
            self.idle.bytes(),
            self.idle.recount(),
            "model: bytes cached"
        );
        assert_eq!(
            self.live.bytes(),
            self.live.recount(),
            "model: bytes in use"
        );
        let count = |f: fn(&Call) -> bool| self.calls.iter().filter(|c| f(c)).count() as u64;
        assert_eq!(
            (self.allocs, self.deallocs),
            (
                count(|c| matches!(c, Call::Allocate { .. })),
                count(|c| matches!(c, Call::Deallocate { .. }))
            ),
            "model: backing calls by kind"
        );
    }

    pub(super) fn reserved(&self) -> usize {
        self.bytes_in_use() + self.bytes_cached()
    }

    pub(super) fn stats(&self) -> Stats {
        let (in_use, cached) = (self.bytes_in_use(), self.bytes_cached());
        Stats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            trimmed: self.trimmed,
            backing_allocs: self.allocs,
            backing_deallocs: self.deallocs,
            backing_failures: self.backing_failures,
            blocks_in_use: self.live.len() as u64,
            blocks_cached: self.idle.len() as u64,
            bytes_in_use: in_use,
            bytes_cached: cached,
            bytes_reserved: in_use + cached,
            peak_bytes_reserved: self.peak_reserved,
            peak_bytes_in_use: self.peak_in_use,
            bytes_from_pool: self.from_pool,
            bytes_from_backing: self.from_backing,
            bytes_requested: self
                .from_pool
                .saturating_add(self.from_backing)
                .saturating_sub(self.waste),
            // The model's allocators map no pages.
            pages_created: 0,
            pages_released: 0,
            page_maps: 0,
            page_unmaps: 0,
            bytes_spare: 0,
        }
    }

    fn update_peaks(&mut self) {
        self.peak_reserved = self.peak_reserved.max(self.reserved());
        self.peak_in_use = self.peak_in_use.max(self.bytes_in_use());
        self.peak_live = self.peak_live.max(self.live.len());
    }

    fn ratio_now(&self, half_life: u64) -> f64 {
        if self.now <= self.allowance_at {
            return self.ratio;
        }
        let dt = ticks(self.now - self.allowance_at).as_secs_f64();
        let halvings = dt * (1.0 / ticks(half_life).as_secs_f64());
        self.ratio * (-halvings).exp2()
    }

    /// Whether the policy is `Exponential`.
    fn timed_exponential(&self) -> bool {
        matches!(self.cfg.kind, Kind::Exponential { .. })
    }

    /// After a trim freed a block (the ratio rebased): the allowance, that
    /// of `before` bytes, clamped to the bytes left, as their ratio (zero
    /// once none are).
    fn clamp_to_bytes(&mut self, before: f64) {
        let after = self.bytes_cached() as f64;
        let allowance = (self.ratio * before).min(after);
        self.ratio = if after == 0.0 { 0.0 } else { allowance / after };
    }

    fn rebase(&mut self) -> Option<()> {
        let Kind::Exponential { half_life } = self.cfg.kind else {
            return None;
        };
        self.ratio = self.ratio_now(half_life);
        self.allowance_at = self.now;
        Some(())
    }

    /// The cache lets a block go: deallocated at once (a panic there stops
    /// the operation), or collected for the end of the cache step.
    fn deallocate(&mut self, block: u64, size: usize) -> Step {
        match self.frees {
            Frees::Immediate => {
                self.record(Call::Deallocate { block, size });
                self.fire(Fault::Deallocate)
            }
            Frees::Deferred => {
                self.deferred.push((block, size));
                Ok(())
            }
        }
    }

    /// The backing `allocate`: `Err` when it panics.
    fn backing(&mut self, class: usize) -> Step<Result<u64, TestError>> {
        self.fire(Fault::Allocate)?;
        Ok(self.backing_call(class))
    }

    fn backing_call(&mut self, class: usize) -> Result<u64, TestError> {
        if self.fail_next > 0 {
            self.fail_next -= 1;
            self.backing_failures += 1;
            return Err(TestError::Injected);
        }
        let used = self.reserved();
        let capacity = self.cfg.capacity.unwrap_or(usize::MAX);
        match used.checked_add(class) {
            Some(total) if total <= capacity => {
                self.issued += 1;
                self.record(Call::Allocate {
                    block: self.issued,
                    size: class,
                });
                Ok(self.issued)
            }
            _ => {
                self.backing_failures += 1;
                Err(TestError::OutOfMemory {
                    requested: class,
                    used,
                    capacity,
                })
            }
        }
    }

    /// Debug builds: a collection first holds the policy's deadline for
    /// the oldest block against `must_evict` while the cached deadline
    /// lies ahead (a `deadline` call, then a `must_evict` call when that
    /// deadline is still ahead of the clock, and then a `deadline` call
    /// again, whose answer the store keeps: `must_evict` planned anew).
    fn check_deadline(&mut self) -> Step {
        if !cfg!(debug_assertions) || !self.timed() || self.now_nanos() >= self.not_before {
            return Ok(());
        }
        let Some(oldest) = self.idle.first().copied() else {
            return Ok(());
        };
        self.fire(Fault::Deadline)?;
        let due = match self.answer("provisional_deadline") {
            Some(Answer::Deadline(due)) => due,
            None => None,
            Some(other) => panic!("wanted a provisional_deadline answer, got {other:?}"),
        };
        if due.is_some_and(|d| d > ticks(self.now)) {
            self.fire(Fault::MustEvict)?;
            // `must_evict` answers no (the pool panics otherwise), after
            // clamping the allowance as every decision does.
            if let Kind::Exponential { half_life } = self.cfg.kind {
                let bytes = self.bytes_cached() as f64;
                let bound = bytes + oldest.class as f64 / 2.0;
                if self.ratio_now(half_life) * bytes > bound {
                    self.ratio = clamp_ratio(bound, bytes);
                    self.allowance_at = self.now;
                }
            }
            // `must_evict` planned again: the store forgets its deadline
            // and keeps the policy's new one (a second `deadline` call).
            self.not_before = 0;
            self.fire(Fault::Deadline)?;
            let deadline = self.deadline_answer(oldest);
            if !self.untold {
                self.not_before = deadline;
            }
        }
        Ok(())
    }

    fn run_policy(&mut self) -> Step<usize> {
        let mut freed = 0;
        if !self.timed() {
            return Ok(0);
        }
        while let Some(oldest) = self.idle.first().copied() {
            if self.now_nanos() < self.not_before {
                self.skipped_check(oldest);
                break;
            }
            self.fire(Fault::MustEvict)?;
            let due = match self.cfg.kind {
                Kind::FixedTime { ttl } => self.now.saturating_sub(oldest.released) >= ttl,
                Kind::Exponential { half_life } => {
                    let half = oldest.class as f64 / 2.0;
                    let bytes = self.bytes_cached() as f64;
                    let bound = bytes + half;
                    let mut allowance = self.ratio_now(half_life) * bytes;
                    if allowance > bound {
                        allowance = bound;
                        self.ratio = clamp_ratio(bound, bytes);
                        self.allowance_at = self.now;
                    }
                    self.bytes_cached() as f64 - allowance >= half
                }
                Kind::FixedCapacity { .. } => false,
            };
            if !due {
                self.fire(Fault::Deadline)?;
                let deadline = self.deadline_answer(oldest);
                if !self.untold {
                    self.not_before = deadline;
                }
                break;
            }
            // The policy is told first: a panic there leaves the block.
            self.fire(Fault::OnFree)?;
            let before = self.bytes_cached() as f64;
            self.idle.remove(0);
            self.evictions += 1;
            self.not_before = 0;
            self.untold &= !self.idle.is_empty();
            freed += 1;
            if self.idle.is_empty() {
                if self.rebase().is_some() {
                    self.ratio = 0.0;
                }
            } else if self.timed_exponential() {
                // The allowance stays: a ratio of fewer bytes.
                self.ratio = self.ratio * before / self.bytes_cached() as f64;
            }
            self.deallocate(oldest.block, oldest.class)?;
        }
        Ok(freed)
    }

    fn free_oldest(&mut self) -> Step<Option<usize>> {
        let Some(oldest) = self.idle.first().copied() else {
            return Ok(None);
        };
        self.hook(Fault::OnFree)?;
        let before = self.bytes_cached() as f64;
        self.idle.remove(0);
        self.trimmed += 1;
        self.not_before = 0;
        self.untold &= !self.idle.is_empty();
        if self.rebase().is_some() {
            self.clamp_to_bytes(before);
        }
        self.deallocate(oldest.block, oldest.class)?;
        Ok(Some(oldest.class))
    }

    /// `DecayingPool::allocate` (and through `SharedPool::with`).
    pub(super) fn allocate(&mut self, size: usize) -> Step<Outcome> {
        let out = (|| {
            self.hook(Fault::Clock)?;
            self.run_policy()?;
            match self.choose(size)? {
                Ok(Chosen::Hit(block)) => Ok(Ok(block)),
                Ok(Chosen::Miss(class)) => self.miss(size, class),
                Err(e) => Ok(Err(e)),
            }
        })();
        self.update_peaks();
        out
    }

    /// `SharedPool::allocate`: the cache step (policy, hit or limit and
    /// booking) under the lock, its frees offered after it, then the
    /// backing calls.
    pub(super) fn shared_allocate(&mut self, size: usize) -> Step<Outcome> {
        let out = (|| {
            let chosen = (|| {
                self.hook(Fault::Clock)?;
                self.run_policy()?;
                self.choose(size)
            })();
            let flushed = self.flush();
            let chosen = match (chosen, flushed) {
                (Err(Injected), _) => return Err(Injected),
                (Ok(chosen), Ok(())) => chosen,
                (Ok(Ok(Chosen::Hit(_))), Err(Injected)) => {
                    // The hit's block goes back into the cache, released
                    // as any block is (the clock read, the policy run,
                    // then the put); the pool counted it in use in
                    // between, in its peak too.
                    self.update_peaks();
                    let block = self.live.pop().expect("the hit's block");
                    let _ = self.section(|m| m.release_block(block, &[]));
                    return Err(Injected);
                }
                // A miss's booking is dropped.
                (Ok(_), Err(Injected)) => return Err(Injected),
            };
            match chosen {
                Ok(Chosen::Hit(block)) => Ok(Ok(block)),
                Ok(Chosen::Miss(class)) => self.miss(size, class),
                Err(e) => Ok(Err(e)),
            }
        })();
        self.update_peaks();
        out
    }

    /// A hit, or a miss with room made under the limit.
    fn choose(&mut self, size: usize) -> Step<Result<Chosen, PoolError<TestError>>> {
        let Some(class) = self.class(size) else {
            return Ok(Err(if size == 0 {
                PoolError::ZeroSize
            } else {
                PoolError::TooLarge { requested: size }
            }));
        };
        let same = |b: &Idle| b.class == class;
        let found = match self.cfg.reuse {
            Reuse::Lifo => self.idle.iter().rposition(same),
            Reuse::Fifo => self.idle.iter().position(same),
        };
        if let Some(i) = found {
            // Told first: a panic leaves the block cached, and the store
            // forgets its planned deadline.
            if let Err(e) = self.hook(Fault::OnHit) {
                self.not_before = 0;
                self.untold = true;
                return Err(e);
            }
            self.stale_answer();
            let before = self.bytes_cached();
            let hit = self.idle.remove(i);
            let after = self.bytes_cached();
            // The allowance scales with the bytes cached: the ratio stays
            // (as of the time it was last decayed to: a hit decays nothing).
            let _ = (before, after);
            self.hits += 1;
            self.from_pool = self.from_pool.saturating_add(class);
            self.waste = self.waste.saturating_add(class - size);
            self.live.push(Live {
                block: hit.block,
                size,
                class,
            });
            return Ok(Ok(Chosen::Hit(hit.block)));
        }
        let reserved = self.reserved();
        if reserved.checked_add(class).is_none() {
            return Ok(Err(PoolError::TooLarge { requested: size }));
        }
        if let Some(limit) = self.cfg.limit {
            if self.bytes_in_use() + class > limit {
                return Ok(Err(PoolError::LimitExceeded {
                    requested: size,
                    limit,
                    reserved,
                }));
            }
            while self.reserved() + class > limit && self.free_oldest()?.is_some() {}
        }
        Ok(Ok(Chosen::Miss(class)))
    }

    /// The backing calls of a miss and the out-of-memory ladder; in a
    /// `SharedPool` each rung's frees are a cache step of their own.
    fn miss(&mut self, size: usize, class: usize) -> Step<Outcome> {
        let deferred = self.frees == Frees::Deferred;
        let rung = |m: &mut Self, f: fn(&mut Self, usize) -> Step| {
            if deferred {
                m.section(|m| f(m, class))
            } else {
                f(m, class)
            }
        };
        let mut result = self.backing(class)?;
        if result.is_err() && !self.idle.is_empty() {
            self.retries += 1;
            rung(self, |m, class| {
                let mut freed = 0;
                while freed < class {
                    match m.free_oldest()? {
                        Some(c) => freed += c,
                        None => break,
                    }
                }
                Ok(())
            })?;
            result = self.backing(class)?;
            if result.is_err() && !self.idle.is_empty() {
                self.second_rung += 1;
                rung(self, |m, _| {
                    while m.free_oldest()?.is_some() {}
                    Ok(())
                })?;
                result = self.backing(class)?;
            }
        }
        let block = match result {
            Ok(block) => block,
            Err(e) => return Ok(Err(PoolError::Backing(e))),
        };
        self.misses += 1;
        self.from_backing = self.from_backing.saturating_add(class);
        self.waste = self.waste.saturating_add(class - size);
        self.live.push(Live { block, size, class });
        Ok(Ok(block))
    }

    /// Releases `self.live[i]`; `observed` is what the pool called on the
    /// backing allocator during the release. The block is never lost: when
    /// the clock panics it is freed (counted trimmed), when the policy run
    /// before it panics it is cached all the same; then the panic goes on.
    pub(super) fn release(&mut self, i: usize, observed: &[Call]) -> Step {
        let block = self.live.remove(i);
        let out = match self.frees {
            Frees::Immediate => self.release_block(block, observed),
            Frees::Deferred => self.section(|m| m.release_block(block, observed)),
        };
        self.update_peaks();
        out
    }

    fn release_block(&mut self, block: Live, observed: &[Call]) -> Step {
        if self.hook(Fault::Clock).is_err() {
            // No time to cache it at: given back (a second panic there is
            // discarded).
            self.trimmed += 1;
            let _ = self.deallocate(block.block, block.class);
            return Err(Injected);
        }
        if self.run_policy().is_err() {
            // Cached at the time read (a second panic there is discarded).
            let _ = self.put(block, observed);
            return Err(Injected);
        }
        self.put(block, observed)
    }

    /// Caches a released block at `now`.
    fn put(&mut self, block: Live, observed: &[Call]) -> Step {
        let idle = Idle {
            block: block.block,
            class: block.class,
            released: self.now,
        };
        match self.cfg.kind {
            Kind::FixedTime { .. } | Kind::Exponential { .. } => {
                // The policy is told last: a panic there leaves it cached.
                self.idle.push(idle);
                if self.fire(Fault::OnRelease).is_err() {
                    // The store forgets the deadline it planned without
                    // this block, and plans none while the policy's view
                    // lacks it.
                    self.not_before = 0;
                    self.untold = true;
                    return Err(Injected);
                }
                if self.rebase().is_some() {
                    // The release adds its size to the allowance (nothing
                    // with a zero half-life): `(ratio * before + class *
                    // gain) / after`, in the policy's order of operations.
                    let after = self.bytes_cached() as f64;
                    let gain = if self.cfg.kind == (Kind::Exponential { half_life: 0 }) {
                        0.0
                    } else {
                        1.0
                    };
                    let ratio = self.ratio + (gain - self.ratio) * (block.class as f64 / after);
                    // A ratio within `NEAR_ONE` of 1 becomes 1 (tested as
                    // the policy tests it).
                    self.ratio = if (1.0 - NEAR_ONE..=1.0 + NEAR_ONE).contains(&ratio) {
                        1.0
                    } else {
                        ratio
                    };
                }
                self.stale_answer();
                Ok(())
            }
            Kind::FixedCapacity { slots: 0 } => {
                self.evictions += 1;
                self.deallocate(block.block, block.class)
            }
            Kind::FixedCapacity { slots } => {
                let victim = self.fixed_victim(slots, block.class, observed);
                let victim = victim.map(|v| self.idle.remove(v));
                self.idle.push(idle);
                if let Some(v) = victim {
                    self.evictions += 1;
                    self.deallocate(v.block, v.class)?;
                }
                Ok(())
            }
        }
    }

    fn fixed_victim(&self, slots: usize, class: usize, observed: &[Call]) -> Option<usize> {
        let window = slots.min(FixedCapacity::WINDOW);
        if slots <= FixedCapacity::WINDOW {
            return (self.idle.len() == slots).then_some(0);
        }
        match observed {
            [] => {
                assert!(
                    self.idle.len() < slots,
                    "a release into a full table of {slots} slots evicted nothing"
                );
                None
            }
            [Call::Deallocate { block, size }] => {
                let Some(v) = self.idle.iter().position(|b| b.block == *block) else {
                    panic!("a release evicted block {block}, which was not cached");
                };
                assert_eq!(self.idle[v].class, *size, "evicted block {block}'s size");
                assert!(
                    self.idle.len() >= window,
                    "a release evicted block {block} with only {} blocks cached: \
                     its window of {window} slots cannot be full",
                    self.idle.len()
                );
                if self.idle[v].class == class {
                    assert_eq!(
                        self.idle.iter().position(|b| b.class == class),
                        Some(v),
                        "a release evicted block {block}, not the oldest of its window"
                    );
                }
                Some(v)
            }
            other => panic!("a release made unexpected backing calls: {other:?}"),
        }
    }

    pub(super) fn collect(&mut self) -> Step<usize> {
        let step = |m: &mut Self| {
            m.hook(Fault::Clock)?;
            m.check_deadline()?;
            m.run_policy()
        };
        match self.frees {
            Frees::Immediate => step(self),
            Frees::Deferred => self.section(step),
        }
    }

    pub(super) fn trim(&mut self) -> Step<usize> {
        let step = |m: &mut Self| {
            m.hook(Fault::Clock)?;
            let mut bytes = 0;
            while let Some(class) = m.free_oldest()? {
                bytes += class;
            }
            Ok(bytes)
        };
        match self.frees {
            Frees::Immediate => step(self),
            Frees::Deferred => self.section(step),
        }
    }

    /// Dropping the pool: every cached block is offered to `deallocate`
    /// even when it, the clock or the policy panics (once the clock or the
    /// policy has panicked, the rest go without telling the policy).
    /// `Err` when a panic is passed on.
    pub(super) fn drop_pool(&mut self) -> Step {
        self.frees = Frees::Immediate;
        let mut out = Ok(());
        let mut told = self.hook(Fault::Clock).is_ok();
        if !told {
            out = Err(Injected);
        }
        while let Some(oldest) = self.idle.first().copied() {
            if told && self.hook(Fault::OnFree).is_err() {
                told = false;
                out = Err(Injected);
            }
            let before = self.bytes_cached() as f64;
            self.idle.remove(0);
            self.trimmed += 1;
            if told && self.rebase().is_some() {
                self.clamp_to_bytes(before);
            }
            if self.deallocate(oldest.block, oldest.class).is_err() {
                out = Err(Injected);
            }
        }
        out
    }

    pub(super) fn advance(&mut self, quarters: u8, jitter: i8) -> u64 {
        let period = match self.cfg.kind {
            Kind::FixedTime { ttl } => ttl,
            Kind::Exponential { half_life } => half_life,
            Kind::FixedCapacity { .. } => 4,
        }
        .max(1);
        let dt = (u64::from(quarters) * period / 4).saturating_add_signed(jitter.into());
        self.now += dt;
        dt
    }

    pub(super) fn summary(&self, stats: Stats, ops: usize) -> Summary {
        Summary {
            kind: self.cfg.kind,
            stats,
            ops,
            retries: self.retries,
            second_rung: self.second_rung,
            peak_live: self.peak_live,
            injected: self.injected,
            deadline_skips: self.deadline_skips,
            thread_cached: false,
        }
    }

    /// Whether a release then an allocation of the same size must hand the
    /// just-released block back.
    pub(super) fn reuses_at_once(&self) -> bool {
        self.cfg.reuse == Reuse::Lifo
            && !matches!(
                self.cfg.kind,
                Kind::FixedCapacity { slots: 0 }
                    | Kind::FixedTime { ttl: 0 }
                    | Kind::Exponential { half_life: 0 }
            )
    }
}
