//! `pool_ops`: a [`DecayingPool`] against the model.

use core::fmt;
use core::mem::ManuallyDrop;

use arbitrary::{Arbitrary, Unstructured};

use crate::policy::Policy;
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;

use super::input::{Config, HUGE, MAX_OPS, Op, PoolInput, Size, pick};
use super::model::{Live, Model};
use super::{
    Clock, Injecting, Parts, Probe, Summary, apply_common, build, catching, check_common,
    new_parts, quiet_injected_panics, with_policy,
};

/// Parses `data` as a [`PoolInput`] and runs it with [`run_pool`].
/// Returns `None` when the data cannot be parsed (never, with this
/// layout: missing bytes read as zero).
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn pool_ops(data: &[u8]) -> Option<Summary> {
    let input = PoolInput::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    Some(run_pool(&input))
}

/// Runs `input` against a [`DecayingPool`] and the model, checking every
/// step. An injected panic is caught around the operation it interrupts;
/// the model says where it must happen and what state it leaves.
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn run_pool(input: &PoolInput) -> Summary {
    quiet_injected_panics();
    let cfg = input.config.clone();
    with_policy!(cfg.kind, run_pool_with(cfg, &input.ops))
}

struct PoolHarness<P: Policy> {
    /// Never dropped on a failed check: dropping a pool whose state is off
    /// could panic again while unwinding and abort.
    pool: ManuallyDrop<DecayingPool<Injecting, P, Clock>>,
    parts: Parts,
    model: Model,
    step: usize,
}

impl<P: Policy> PoolHarness<P> {
    /// The per-step checks, and the whole-pool ones when due (see
    /// [`FULL_CHECK_EVERY`](super::FULL_CHECK_EVERY)).
    fn check(&mut self, what: &dyn fmt::Debug) {
        self.check_at(what, false);
    }

    /// The per-step checks and the whole-pool ones.
    fn check_full(&mut self, what: &dyn fmt::Debug) {
        self.check_at(what, true);
    }

    fn check_at(&mut self, what: &dyn fmt::Debug, force: bool) {
        let stats = self.pool.stats();
        if check_common(stats, &self.model, &mut self.parts, what, self.step, force) {
            self.pool.validate();
        }
    }

    /// Allocates; returns whether it panicked.
    fn allocate(&mut self, size: usize) -> bool {
        assert_eq!(
            self.pool.class_size(size),
            self.model.class(size),
            "class of {size}"
        );
        // Every other step goes through the pool's `RawAllocator` face.
        let pool = &mut *self.pool;
        let got = catching(|| {
            if self.step % 2 == 0 {
                pool.allocate(size)
            } else {
                RawAllocator::allocate(pool, size)
            }
        });
        let want = self.model.allocate(size);
        assert_eq!(got, want, "allocate({size}) at step {}", self.step);
        self.check(&format_args!(
            "allocate({size}), panicked: {}",
            got.is_err()
        ));
        got.is_err()
    }

    /// Releases the i-th live block; returns its size and whether the
    /// release panicked.
    fn release(&mut self, i: usize) -> (usize, bool) {
        let Live { block, size, .. } = self.model.live[i];
        let before = self.parts.checking.calls_len();
        let pool = &mut *self.pool;
        let step = self.step;
        let got = catching(|| {
            // SAFETY: `block` came from `pool.allocate(size)` (the model
            // predicted it and the pool returned it), is live and is not
            // used again: a release that panics still takes it.
            unsafe {
                if step % 2 == 0 {
                    pool.release(block, size);
                } else {
                    RawAllocator::deallocate(pool, block, size);
                }
            }
        });
        let observed = self.parts.checking.calls_since(before);
        let want = self.model.release(i, &observed);
        assert_eq!(got, want, "release(block {block}, {size}) at step {step}");
        self.check(&format_args!(
            "release(block {block}, {size}), panicked: {}",
            got.is_err()
        ));
        (size, got.is_err())
    }

    fn apply(&mut self, op: Op) {
        let live = self.model.live.len();
        match op {
            Op::Allocate(Size::Palette(i)) => {
                self.allocate(pick(&self.model.cfg.palette, i));
            }
            Op::Allocate(Size::Zero) => {
                self.allocate(0);
            }
            Op::Allocate(Size::Huge(k)) => {
                self.allocate(pick(&HUGE, k));
            }
            Op::Release(i) if live > 0 => {
                self.release(usize::from(i) % live);
            }
            Op::ReleaseAllocate(i) if live > 0 => {
                let (size, released_panicked) = self.release(usize::from(i) % live);
                let cached = self.model.idle.last().map(|b| b.block);
                let panicked = self.allocate(size);
                let tail = self.model.live.last().map(|b| b.block);
                if self.model.reuses_at_once() && !released_panicked && !panicked {
                    assert!(cached.is_some() && tail == cached, "release then allocate");
                }
            }
            Op::Release(_) | Op::ReleaseAllocate(_) => {}
            Op::Common(step) => {
                apply_common(step, &self.parts, &mut self.model);
                self.check(&op);
            }
            Op::Collect => {
                let pool = &mut *self.pool;
                let got = catching(|| pool.collect());
                let want = self.model.collect();
                assert_eq!(got, want, "collect at step {}", self.step);
                self.check(&op);
            }
            Op::Trim => {
                let pool = &mut *self.pool;
                let got = catching(|| pool.trim());
                let want = self.model.trim();
                assert_eq!(got, want, "trim at step {}", self.step);
                self.check(&op);
            }
        }
    }
}

fn run_pool_with<P: Policy>(policy: P, probe: Probe, cfg: Config, ops: &[Op]) -> Summary {
    let parts = new_parts(&cfg, probe.switches);
    let pool = build(policy, &cfg, &parts);
    let trim_before_drop = cfg.trim_before_drop;
    let mut h = PoolHarness {
        pool: ManuallyDrop::new(pool),
        parts,
        model: Model::new(cfg, probe.answers),
        step: 0,
    };
    h.check_full(&"a new pool");
    for &op in ops.iter().take(MAX_OPS) {
        h.step += 1;
        h.apply(op);
    }
    // Give everything back, then trim (or not) and drop; an armed fault
    // stays armed, so the last releases, the trim and the drop may panic.
    h.parts.failing.fail_next(0);
    h.model.fail_next = 0;
    while !h.model.live.is_empty() {
        h.step += 1;
        h.release(0);
    }
    h.check_full(&"every block given back");
    let mut summary = h.model.summary(h.pool.stats(), ops.len().min(MAX_OPS));
    if trim_before_drop {
        h.step += 1;
        let want = h.model.trim();
        let pool = &mut *h.pool;
        let got = catching(|| pool.trim());
        assert_eq!(got, want, "final trim");
        h.check_full(&"final trim");
        if got.is_ok() {
            assert_eq!(h.pool.stats().bytes_reserved, 0);
        }
    }
    let PoolHarness {
        pool,
        parts,
        mut model,
        ..
    } = h;
    let got = catching(move || drop(ManuallyDrop::into_inner(pool)));
    let want = model.drop_pool();
    assert_eq!(got, want, "drop");
    parts.checking.with_calls(|calls| {
        assert_eq!(calls, model.calls(), "backing calls after drop");
    });
    parts.checking.assert_all_freed();
    assert_eq!(parts.checking.live(), 0);
    assert_eq!(parts.failing.used(), 0);
    summary.injected = model.injected;
    summary
}
