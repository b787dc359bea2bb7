//! Internal: the model-checking harness behind `fuzz/` and the corpus
//! replay; not covered by semver (feature `fuzzing`).
//!
//! The harness checks [`DecayingPool`] and
//! [`SharedPool`](crate::SharedPool) here, the packing layer in [`packed`],
//! the page layer's [`Mapped`](crate::pages::Mapped) allocator in
//! [`mapped`].
//! The code is split as follows: `input` parses the bytes ([`Config`],
//! [`Op`], [`SharedOp`], the [`Common`] steps of both), `model` is the
//! reference model, `pool` and `shared` run the two harnesses, `cached`
//! runs `shared_ops` on a pool from
//! [`SharedPool::with_thread_caches`](crate::SharedPool::with_thread_caches)
//! (with short-lived threads, against the invariants the magazines leave
//! exact rather than the model: see [`run_shared`]), and this module holds
//! what they share (the panic switches, the backing allocator, the policy
//! wrappers, the common checks).
//!
//! The `fuzz/` targets `pool_ops` and `shared_ops` and the stable-Rust
//! corpus replay (`tests/it/fuzz_corpus.rs`) all call [`pool_ops`] and
//! [`shared_ops`] here, so the same checks run under libFuzzer and under
//! `cargo test`; with feature `pickle`, the target `snapshot` and its
//! replay call `snapshot`, which runs any bytes as a PyTorch snapshot
//! pickle.
//!
//! An input is an [`Arbitrary`](arbitrary::Arbitrary) configuration (policy and its parameter,
//! [`Reuse`](crate::Reuse), [`SizeClass`](crate::SizeClass), an optional limit, an optional backing
//! capacity so the out-of-memory retry ladder runs) followed by
//! operations. Each is run against the real pool over
//! [`FailingAllocator`]`<`[`CheckingAllocator`]`>` next to a reference model
//! of the documented contract (plain `Vec`s, linear scans; the rules are
//! listed in `docs/ARCHITECTURE.md` and below).
//!
//! After every step the harness checks, each in O(1) amortised (the
//! model keeps its totals as it goes): the block handed out (or the exact
//! error), the whole [`Stats`], the backing calls made since the last
//! check against the model's, the failing allocator's counters (failures,
//! bytes outstanding), and that the policy gave no answer the model did
//! not take; `shared_ops` also compares the stats read through `with`, the
//! number of live blocks, and the live blocks the step handed out or
//! touched against the model's. The whole-pool checks, O(n) each, follow
//! every [`FULL_CHECK_EVERY`] steps, every step in which an injected panic
//! fired or a backing call failed, and at the end of a run (`pool_ops`:
//! once every block is back, and after the final trim; `shared_ops`: once
//! every block is in a `Pooled` again, after the final trim, and at the
//! last check before the pool's drop): `validate()`, the whole backing call
//! log against the model's, the model's recount of the totals it keeps
//! and, in `shared_ops`, every live block against the model's. Then the
//! pool is dropped, the whole call log compared once more, and every
//! backing block must have been freed exactly once. (A thread-cached
//! `shared_ops` run checks what [`run_shared`] lists after every step; it
//! keeps the bytes in use as they go and recounts them on the same
//! schedule.)
//!
//! # Injected panics
//!
//! With flag `& 2` in the [`Config`], a [`Common::Inject`] step arms one
//! [`Fault`]: the backing `allocate` (which then allocates nothing), the
//! backing `deallocate` (after the block is given back), the clock, or an
//! `EvictionPolicy` hook (the policy runs behind
//! [`PanickingPolicy`](crate::testing::PanickingPolicy)) panics on the
//! n-th such call from then on. The harness catches the panic around the
//! pool operation; the model counts the same calls, so it says which
//! operation must panic and what that leaves, and the usual checks follow,
//! the whole-pool ones included (the whole [`Stats`], the whole backing
//! call log, `validate()`, which holds `bytes_reserved + pending <=
//! limit`). What the model expects is the pool's documented behaviour
//! under panics: a release's block is cached, or freed (counted trimmed)
//! when the clock panicked; a miss's booking against the limit is dropped;
//! blocks freed on the way count as freed; a policy hook that panics
//! changes nothing; a `SharedPool` handle operation finishes its cache
//! step and offers every block it let go before passing the panic on;
//! dropping the pool offers every block. A fault may
//! stay armed through the final releases, trim and drop of a `pool_ops` run.
//! A panic that is not injected (a failed check, a double free) is never
//! caught. See [`SHARED_ALLOCATE_DEALLOCATE_PANICS`] for the one fault held
//! back.
//!
//! The model:
//! - the cache is a `Vec` of (block, class, release time), oldest first;
//!   a hit takes the newest (`Lifo`) or oldest (`Fifo`) block of its class;
//! - before every `allocate`, `release` and `collect` the policy runs at
//!   `now` and frees the oldest block while it says so (`trim` does not);
//! - `FixedTime(ttl)`: due when `now - released >= ttl`;
//! - `Exponential(h)`: the allowance rule documented on
//!   [`Exponential`](crate::Exponential): decayed by `2^(-dt/h)`, raised by a release, scaled by
//!   `after / before` on a hit, clamped to the cached bytes after
//!   trim / limit / retry frees, held to at most `bytes_cached + oldest / 2`
//!   before each decision, reset when the decay empties the cache. Like
//!   the policy, the model keeps the allowance as a ratio of the bytes
//!   cached (a hit leaves it, a release at a ratio of exactly 1 leaves
//!   it) and rounds each step as the policy does; times lie on a 1/512 s
//!   grid, so the times' arithmetic is exact;
//! - `FixedCapacity(slots)`: no clock; with at most
//!   [`FixedCapacity::WINDOW`](crate::FixedCapacity::WINDOW) slots the
//!   window is the whole table and the victim of a release into a full
//!   table is predicted exactly (the oldest block); with more slots the
//!   harness learns the victim from the call log and checks it may be the
//!   one (it was cached with that size, its window could be full, it is the
//!   oldest of its class when it shares the released block's class);
//! - the limit rule, then the out-of-memory retry ladder, on a miss;
//! - the calls the pool makes, for the fault countdowns: one clock read
//!   per operation (timed policies only); `must_evict` for each eviction
//!   check not skipped by the cached deadline, `provisional_deadline`
//!   when it says no, `on_free` before every free, `on_hit` before a hit
//!   takes its block, `on_release` after a release caches it;
//! - the cached deadline: the policy's `provisional_deadline` after a
//!   `must_evict` that said no, dropped by every free and when
//!   `deadline_stale` says so after a release or a hit. The model learns
//!   these answers from a log the policy's wrapper keeps (it cannot plan
//!   `Exponential`'s deadline itself), checks `FixedTime`'s (the oldest
//!   block's release plus the ttl, never stale), and checks every check
//!   the pool skips: nothing due, and no clamp of `Exponential`'s
//!   allowance skipped.
//!
//! # Input layout
//!
//! Every field is read from one byte (missing bytes read as zero), so
//! seeds are easy to write by hand: see [`Config`], [`Op`] and [`SharedOp`].
//!
//! # Examples
//!
//! ```
//! // FixedTime (ttl: PERIODS[4] = 4 ticks), Lifo, Exact, no limit, no
//! // capacity, palette [SIZES[6] = 64], no final trim, drop seed 0.
//! let mut input = vec![0, 4, 0, 0, 0, 0, 0, 0, 6, 0, 0];
//! // Allocate palette[0], release it, advance one period, collect.
//! input.extend([0, 0, 12, 0, 22, 4, 1, 29]);
//! let summary = decaying_pool::fuzzing::pool_ops(&input).unwrap();
//! assert_eq!(summary.stats.evictions, 1);
//! ```

mod cached;
mod held;
mod input;
pub mod mapped;
mod model;
pub mod packed;
mod pool;
mod shared;
#[cfg(feature = "pickle")]
mod snapshot;

pub use input::{
    CAPACITIES, Common, Config, DIVISIONS, FAULTS, Fault, HUGE, Kind, LIMITS, MAGAZINES, MAX_OPS,
    MULTIPLES, Op, PERIODS, PoolInput, SIZES, SLOTS, SharedInput, SharedOp, Size, TICK_NS,
};
pub use model::model_round;
pub use pool::{pool_ops, run_pool};
pub use shared::{SHARED_ALLOCATE_DEALLOCATE_PANICS, run_shared, shared_ops};
#[cfg(feature = "pickle")]
#[cfg_attr(docsrs, doc(cfg(feature = "pickle")))]
pub use snapshot::{SnapshotSummary, snapshot};

use core::any::Any;
use core::fmt;
use core::time::Duration;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, Once};

use crate::clock::ManualClock;
use crate::policy::{EvictionPolicy, FreeReason, Oldest, Policy};
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;
use crate::stats::Stats;
use crate::testing::{
    CheckingAllocator, FailingAllocator, PanicSwitch, PanickingClock, PolicySwitches, TestError,
};

use model::{Injected, Model, Step};

/// What a run reached, for corpus coverage checks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The policy.
    pub kind: Kind,
    /// The pool's counters once every block was given back, before the
    /// final trim and drop.
    pub stats: Stats,
    /// Operations run.
    pub ops: usize,
    /// Misses whose backing call failed with blocks cached, so the retry
    /// ladder's first rung ran (free the oldest blocks, retry).
    pub retries: u64,
    /// Misses that reached the ladder's second rung (free everything,
    /// retry once more).
    pub second_rung: u64,
    /// Most blocks live at once.
    pub peak_live: usize,
    /// Injected panics caught, by [`Fault`] (in [`FAULTS`] order), the
    /// final drop's included.
    pub injected: [u64; 8],
    /// Eviction checks the pool skipped because the policy's deadline
    /// (its `provisional_deadline`) lay ahead, each one checked against the
    /// model (nothing due, and for `Exponential` no clamp of the allowance
    /// skipped).
    pub deadline_skips: u64,
    /// The run drove a [`SharedPool::with_thread_caches`](crate::SharedPool::with_thread_caches)
    /// pool (`shared_ops` only).
    pub thread_cached: bool,
}

// --- what both harnesses share ---------------------------------------------

/// The failing and checking allocators under every run.
type Backing = FailingAllocator<CheckingAllocator>;

/// The backing allocator as the pool sees it: [`Backing`] behind two
/// panic switches. `allocate` panics before allocating; `deallocate`
/// panics after the block is given back, so the checking allocator's log
/// shows every block the pool offered, exactly once.
#[derive(Clone, Debug)]
struct Injecting {
    inner: Backing,
    on_allocate: PanicSwitch,
    on_deallocate: PanicSwitch,
}

impl RawAllocator for Injecting {
    type Block = u64;
    type Error = TestError;

    fn allocate(&mut self, size: usize) -> Result<u64, TestError> {
        self.on_allocate.hit();
        self.inner.allocate(size)
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.inner.deallocate(block, size) };
        self.on_deallocate.hit();
    }
}

/// The clock of every run: a `ManualClock` whose reads can panic.
type Clock = PanickingClock<ManualClock>;

/// A deadline answer the policy gave the pool, in call order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// `provisional_deadline` returned this.
    Deadline(Option<Duration>),
    /// `deadline_stale` returned this.
    Stale(bool),
}

/// The answers of a run's policy, for the model to learn from.
type Answers = Arc<Mutex<VecDeque<Answer>>>;

fn lock_answers(answers: &Answers) -> std::sync::MutexGuard<'_, VecDeque<Answer>> {
    answers.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wraps the run's policy (inside its
/// [`PanickingPolicy`](crate::testing::PanickingPolicy)) and logs the
/// deadline answers the pool got. The model takes each answer where the
/// documented contract says the pool asks: its deadline for the oldest
/// block after a `must_evict` that said no (dropped on every free), and
/// whether that deadline went stale after every release and hit. It then
/// knows which eviction checks the pool skips, and checks each skip: the
/// model says nothing was due. (A `PanickingPolicy` that did not forward
/// these methods would leave the log empty: the model fails on the missing
/// answer.)
#[derive(Clone, Debug)]
pub(crate) struct Recording<P> {
    inner: P,
    answers: Answers,
}

impl<P: EvictionPolicy> EvictionPolicy for Recording<P> {
    fn on_release(&mut self, now: Duration, size: usize, bytes_cached: usize) {
        self.inner.on_release(now, size, bytes_cached);
    }

    fn on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) {
        self.inner.on_hit(now, size, before, after);
    }

    fn try_on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) -> bool {
        self.inner.try_on_hit(now, size, before, after)
    }

    fn on_free(&mut self, now: Duration, size: usize, after: usize, reason: FreeReason) {
        self.inner.on_free(now, size, after, reason);
    }

    fn must_evict(&mut self, now: Duration, oldest: Oldest, bytes_cached: usize) -> bool {
        self.inner.must_evict(now, oldest, bytes_cached)
    }

    fn deadline(&self, oldest: Oldest) -> Option<Duration> {
        self.inner.deadline(oldest)
    }

    fn provisional_deadline(&self, oldest: Oldest) -> Option<Duration> {
        let due = self.inner.provisional_deadline(oldest);
        lock_answers(&self.answers).push_back(Answer::Deadline(due));
        due
    }

    fn deadline_stale(&self) -> bool {
        let stale = self.inner.deadline_stale();
        lock_answers(&self.answers).push_back(Answer::Stale(stale));
        stale
    }
}

/// What a run's harness holds of its policy: the panic switches and the
/// log of deadline answers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Probe {
    switches: PolicySwitches,
    answers: Answers,
}

/// Every panic switch of a run.
#[derive(Clone, Debug)]
struct Switches {
    allocate: PanicSwitch,
    deallocate: PanicSwitch,
    clock: PanicSwitch,
    /// Never hit under `FixedCapacity` (no `EvictionPolicy`).
    policy: PolicySwitches,
}

impl Switches {
    fn get(&self, fault: Fault) -> &PanicSwitch {
        match fault {
            Fault::Allocate => &self.allocate,
            Fault::Deallocate => &self.deallocate,
            Fault::Clock => &self.clock,
            Fault::OnRelease => &self.policy.on_release,
            Fault::OnHit => &self.policy.on_hit,
            Fault::OnFree => &self.policy.on_free,
            Fault::MustEvict => &self.policy.must_evict,
            Fault::Deadline => &self.policy.deadline,
        }
    }

    /// Arms `fault` on the `nth` call from now; disarms the others.
    fn inject(&self, fault: Fault, nth: u8) {
        for f in FAULTS {
            self.get(f).panic_on(0);
        }
        self.get(fault).panic_on(u64::from(nth));
    }

    fn disarm(&self) {
        for f in FAULTS {
            self.get(f).panic_on(0);
        }
    }
}

/// Takes a [`Common`] step on the harness's clock, backing allocator and
/// switches, and on the model.
fn apply_common(step: Common, parts: &Parts, model: &mut Model) {
    match step {
        Common::Advance { quarters, jitter } => {
            let dt = model.advance(quarters, jitter);
            parts.clock.inner().advance(input::ticks(dt));
        }
        Common::FailNext(n) => {
            parts.failing.fail_next(n);
            model.fail_next = n;
        }
        Common::Inject { fault, nth } => {
            parts.switches.inject(fault, nth);
            model.inject(fault, nth);
        }
    }
}

/// Whether a panic payload is one a [`PanicSwitch`] injected.
fn is_injected(payload: &(dyn Any + Send)) -> bool {
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied());
    message.is_some_and(|m| m.starts_with(PanicSwitch::MESSAGE))
}

/// Runs `f`, catching an injected panic as `Err(Injected)`; any other
/// panic (a failed check, a double free) goes on.
fn catching<T>(f: impl FnOnce() -> T) -> Step<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(t) => Ok(t),
        Err(panic) if is_injected(&*panic) => Err(Injected),
        Err(panic) => resume_unwind(panic),
    }
}

/// Installs, once, a panic hook that keeps quiet about injected panics
/// and passes every other panic to the hook before it (libFuzzer's aborts
/// on any panic, caught or not).
fn quiet_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !is_injected(info.payload()) {
                previous(info);
            }
        }));
    });
}

/// Steps between two whole-pool checks in `pool_ops` and `shared_ops`
/// (besides the ones after a step with an injected panic or a failed
/// backing call, and at the end of a run): `validate()`, the whole backing
/// call log against the model's, the model's recount of the totals it
/// keeps, and in `shared_ops` every live block against the model's.
///
/// Why 32: each of those checks walks the whole pool or the whole log,
/// O(n) in the blocks and calls of the run so far. Run after every step
/// (as they once were, with the per-step checks then O(n) too) they made a
/// run of n steps cost O(n²): the fuzz targets ran at about 530 and 280
/// inputs a second, and profiles showed the checks as the harness's
/// largest cost. Every 32 steps the whole checks take about 3 % of a
/// `pool_ops` fuzzing run (`validate()` most of it), and more than half of
/// them are the ones after a panic or a failure, which the period does not
/// change: every 16 steps would add about 1 %, every 64 save about half
/// that. The fuzzer's inputs run up to a few hundred steps (at most
/// [`MAX_OPS`]), so 32 still gives each several whole checks besides the
/// ones at its end. And little waits for them: the per-step checks (the
/// stats, the new backing calls, the failing allocator's counters) catch
/// most departures at the step that makes them; what only a whole check
/// sees (an internal structure that `validate()` walks, say) shows at most
/// 32 steps later, and at once where a panic or a failure struck, the
/// paths most likely to break one.
pub const FULL_CHECK_EVERY: usize = 32;

/// Where the checks of a run stand: what the last one covered.
#[derive(Debug, Default)]
struct Checked {
    /// Backing calls already compared with the model's.
    calls: usize,
    /// The step of the last whole-pool check.
    full_at: usize,
    /// Injected panics fired, all faults together, as of the last check.
    injected: u64,
    /// Failed backing calls as of the last check.
    failures: u64,
}

/// Checks shared by both harnesses, every step: answers taken, stats,
/// the backing calls since the last check, the failing allocator's
/// counters. Also the whole call log and the model's recount when a
/// whole-pool check is due (`force`, every [`FULL_CHECK_EVERY`] steps, or
/// after an injected panic or a failed backing call since the last check);
/// returns whether it was, for the caller to run `validate()` and its own
/// whole checks.
fn check_common(
    stats: Stats,
    model: &Model,
    parts: &mut Parts,
    what: &dyn fmt::Debug,
    step: usize,
    force: bool,
) -> bool {
    let (checking, failing) = (&parts.checking, &parts.failing);
    model.assert_answers_taken();
    assert_eq!(stats, model.stats(), "stats after step {step}: {what:?}");
    let from = parts.checked.calls;
    let new_calls = &model.calls()[from..];
    // Compared in place; copied out only to report a difference.
    if !checking.with_calls(|calls| calls.get(from..) == Some(new_calls)) {
        panic!(
            "backing calls from call {from} on, after step {step}: {what:?}\n  \
             got: {:?}\n want: {new_calls:?}",
            checking.calls_since(from)
        );
    }
    assert_eq!(
        failing.failures(),
        model.backing_failures,
        "failures, step {step}"
    );
    assert_eq!(
        failing.used(),
        model.reserved(),
        "backing bytes, step {step}"
    );
    if let Kind::FixedCapacity { slots } = model.cfg.kind {
        assert!(
            stats.blocks_cached <= slots as u64,
            "more blocks than slots"
        );
    }
    let injected = model.injected.iter().sum();
    let c = &mut parts.checked;
    let full = force
        || step >= c.full_at + FULL_CHECK_EVERY
        || injected != c.injected
        || model.backing_failures != c.failures;
    c.calls = model.calls().len();
    c.injected = injected;
    c.failures = model.backing_failures;
    if full {
        c.full_at = step;
        checking.with_calls(|calls| {
            assert_eq!(
                calls,
                model.calls(),
                "the whole backing call log after step {step}: {what:?}"
            );
        });
        model.assert_consistent();
    }
    full
}

/// The seeded order in which the end of a run gives back what it holds:
/// a linear congruential generator seeded with the input's `drop_seed`.
struct DropOrder(u64);

impl DropOrder {
    fn new(seed: u8) -> Self {
        DropOrder(u64::from(seed))
    }

    /// Which of `total` things (`total > 0`) goes next.
    fn next(&mut self, total: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as usize % total
    }
}

/// A run's allocators, clock and switches.
struct Parts {
    checking: CheckingAllocator,
    failing: Backing,
    backing: Injecting,
    clock: Clock,
    switches: Switches,
    checked: Checked,
}

fn new_parts(cfg: &Config, policy: PolicySwitches) -> Parts {
    let checking = CheckingAllocator::new();
    let failing = FailingAllocator::new(checking.clone());
    failing.set_capacity(cfg.capacity);
    let clock = PanickingClock::new(ManualClock::new());
    let switches = Switches {
        allocate: PanicSwitch::new(),
        deallocate: PanicSwitch::new(),
        clock: clock.switch().clone(),
        policy,
    };
    let backing = Injecting {
        inner: failing.clone(),
        on_allocate: switches.allocate.clone(),
        on_deallocate: switches.deallocate.clone(),
    };
    Parts {
        checking,
        failing,
        backing,
        clock,
        switches,
        checked: Checked::default(),
    }
}

fn build<P: Policy>(policy: P, cfg: &Config, parts: &Parts) -> DecayingPool<Injecting, P, Clock> {
    let mut builder = DecayingPool::builder(parts.backing.clone())
        .policy(policy)
        .clock(parts.clock.clone())
        .size_class(cfg.size_class)
        .reuse(cfg.reuse)
        // `validate` then checks the statistics by class against the totals.
        .class_stats(true);
    if let Some(limit) = cfg.limit {
        builder = builder.limit(limit);
    }
    builder.build()
}

/// Calls `run` with the policy `kind` describes (behind panic switches,
/// for an `EvictionPolicy`) and its switches.
macro_rules! with_policy {
    ($kind:expr, $run:ident($($arg:expr),*)) => {
        match $kind {
            $crate::fuzzing::Kind::FixedTime { ttl } => {
                let (p, probe) = $crate::fuzzing::probed($crate::policy::FixedTime::new(
                    $crate::fuzzing::input::ticks(ttl),
                ));
                $run(p, probe, $($arg),*)
            }
            $crate::fuzzing::Kind::Exponential { half_life } => {
                let half_life = $crate::fuzzing::input::ticks(half_life);
                let (p, probe) =
                    $crate::fuzzing::probed($crate::policy::Exponential::new(half_life));
                $run(p, probe, $($arg),*)
            }
            $crate::fuzzing::Kind::FixedCapacity { slots } => $run(
                $crate::policy::FixedCapacity::new(slots),
                $crate::fuzzing::Probe::default(),
                $($arg),*
            ),
        }
    };
}

/// `inner` behind the answer log and the panic switches, with its probe.
pub(crate) fn probed<P: EvictionPolicy>(
    inner: P,
) -> (crate::testing::PanickingPolicy<Recording<P>>, Probe) {
    let answers = Answers::default();
    let p = crate::testing::PanickingPolicy::new(Recording {
        inner,
        answers: Arc::clone(&answers),
    });
    let probe = Probe {
        switches: p.switches(),
        answers,
    };
    (p, probe)
}
use with_policy;
