//! `shared_ops`: a [`SharedPool`] through its handles against the model.

use core::fmt;

use arbitrary::{Arbitrary, Unstructured};

use crate::policy::{FixedCapacity, Policy};
use crate::shared::{Pooled, SharedPool};

use super::held::{Held, Holder, Shared};
use super::input::{Config, Fault, Kind, MAX_OPS, SharedInput, SharedOp, pick};
use super::model::{Frees, Injected, Model};
use super::{
    DropOrder, Parts, Probe, Summary, apply_common, build, catching, check_common, new_parts,
    quiet_injected_panics, with_policy,
};

/// Whether `shared_ops` lets a backing `deallocate` panic on a block that
/// the cache step of [`SharedPool::allocate`] let go (expired blocks, room
/// made under the limit: a `SharedPool` hands them to `deallocate` after
/// that step, outside the cache lock). On: the model expects what the pool
/// does, the hit's block goes back into the cache (a release at the same
/// time, the policy told), nothing stays booked against the limit, and the
/// panic is passed on (`tests/it/shared.rs`,
/// `a_deallocate_panic_inside_allocate_loses_no_block_and_no_booking`).
/// Off: when the model predicts that panic, the harness disarms the
/// deallocate switch for that `allocate` (the countdown resumes after it);
/// a switch kept to isolate a regression there.
pub const SHARED_ALLOCATE_DEALLOCATE_PANICS: bool = true;

/// Parses `data` as a [`SharedInput`] and runs it with [`run_shared`].
/// Returns `None` when the data cannot be parsed (never, with this
/// layout).
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn shared_ops(data: &[u8]) -> Option<Summary> {
    let input = SharedInput::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    Some(run_shared(&input))
}

/// Runs `input` against a [`SharedPool`], single-threaded, and the model,
/// checking every step (injected panics as in [`run_pool`](super::run_pool)); then drops
/// the handles and blocks in an order the input chooses and checks that
/// the pool is dropped (every block freed) exactly when the last of them
/// goes. With thread caches chosen (flag `& 4`) and a `FixedTime` policy,
/// the pool comes from [`SharedPool::with_thread_caches`] and short-lived
/// threads take part; the checks are then those the magazines leave exact
/// (the counts in use, the backing blocks, the counters, decay, nothing
/// lost), not the step-by-step model.
///
/// # Panics
///
/// When the pool departs from the model, or a check fails.
pub fn run_shared(input: &SharedInput) -> Summary {
    quiet_injected_panics();
    let cfg = input.config.clone();
    if cfg.thread_caches && matches!(cfg.kind, Kind::FixedTime { .. }) {
        return super::cached::run_thread_cached(cfg, &input.ops);
    }
    with_policy!(cfg.kind, run_shared_with(cfg, &input.ops))
}

struct SharedHarness<P: Policy> {
    /// The handles and the live blocks, in the model's `live` order.
    held: Held<P>,
    parts: Parts,
    model: Model,
    step: usize,
    /// The live block the step turned raw or back into a `Pooled`, for the
    /// next check to compare with the model's.
    touched: Option<usize>,
}

impl<P: Policy> SharedHarness<P> {
    fn handle(&self) -> Option<&Shared<P>> {
        self.held.handle()
    }

    /// The per-step checks, and the whole-pool ones when due (see
    /// [`FULL_CHECK_EVERY`](super::FULL_CHECK_EVERY)): with them, every
    /// live block against the model's; without, the last one (where an
    /// allocation puts its block) and the one the step touched.
    fn check(&mut self, what: &dyn fmt::Debug) {
        self.check_at(what, false);
    }

    /// The per-step checks and the whole-pool ones.
    fn check_full(&mut self, what: &dyn fmt::Debug) {
        self.check_at(what, true);
    }

    fn check_at(&mut self, what: &dyn fmt::Debug, force: bool) {
        let touched = self.touched.take();
        let Some(pool) = self.held.handle() else {
            return;
        };
        let stats = pool.stats();
        let full = check_common(stats, &self.model, &mut self.parts, what, self.step, force);
        pool.with(|p| {
            assert_eq!(p.stats(), stats, "stats through `with`");
            if full {
                p.validate();
            }
        });
        let (slots, live) = (&self.held.slots, &self.model.live);
        assert_eq!(slots.len(), live.len(), "live blocks");
        let check_slot = |i: usize| match &slots[i] {
            Holder::Pooled(p) => {
                assert_eq!((**p, p.size()), (live[i].block, live[i].size), "a Pooled");
                assert!(p.pool().ptr_eq(pool), "a Pooled's pool");
            }
            Holder::Raw(block, size) => {
                assert_eq!(
                    (*block, *size),
                    (live[i].block, live[i].size),
                    "a raw block"
                );
            }
        };
        if full {
            (0..slots.len()).for_each(check_slot);
        } else {
            slots.len().checked_sub(1).into_iter().for_each(check_slot);
            touched
                .filter(|&i| i < slots.len())
                .into_iter()
                .for_each(check_slot);
        }
    }

    /// Allocates through `pool` (a handle's `allocate`, or a raw one
    /// through `with`); returns whether it panicked.
    fn allocate(&mut self, pool: Shared<P>, size: usize, raw: bool) -> bool {
        let mute =
            !raw && !SHARED_ALLOCATE_DEALLOCATE_PANICS && self.model.cache_step_frees_panic(size);
        if mute {
            self.parts.switches.deallocate.panic_on(0);
        }
        let got = catching(|| {
            if raw {
                pool.with(|p| p.allocate(size))
                    .map(|b| Holder::Raw(b, size))
            } else {
                pool.allocate(size).map(Holder::Pooled)
            }
        });
        let want = if raw {
            self.model.frees = Frees::Immediate;
            self.model.allocate(size)
        } else {
            self.model.frees = Frees::Deferred;
            self.model.mute_deallocate = mute;
            let want = self.model.shared_allocate(size);
            self.model.mute_deallocate = false;
            want
        };
        if mute {
            let left = self.model.armed[Fault::Deallocate as usize];
            self.parts.switches.deallocate.panic_on(left);
        }
        let panicked = got.is_err();
        match (got, want) {
            (Ok(Ok(holder)), Ok(Ok(block))) => {
                if let Holder::Pooled(p) = &holder {
                    assert_eq!(**p, block, "allocate({size}) at step {}", self.step);
                    assert_eq!(p.size(), size);
                    assert!(p.pool().ptr_eq(&pool));
                }
                self.held.slots.push(holder);
            }
            (Ok(Err(got)), Ok(Err(want))) => {
                assert_eq!(got, want, "allocate({size}) at step {}", self.step);
            }
            (Err(Injected), Err(Injected)) => {}
            (got, want) => panic!(
                "allocate({size}) at step {}: got {:?}, want {want:?}",
                self.step,
                got.map(|r| r.map(|h| match h {
                    Holder::Pooled(p) => *p,
                    Holder::Raw(b, _) => b,
                }))
            ),
        }
        drop(pool);
        self.check(&format_args!(
            "allocate({size}), raw: {raw}, panicked: {panicked}"
        ));
        panicked
    }

    /// Gives back the i-th live block; returns its size and whether that
    /// panicked.
    fn release(&mut self, i: usize, how: u8) -> (usize, bool) {
        let before = self.parts.checking.calls_len();
        let (size, got) = match self.held.slots.remove(i) {
            Holder::Pooled(p) => {
                self.model.frees = Frees::Deferred;
                let size = p.size();
                (size, catching(move || drop(p)))
            }
            Holder::Raw(block, size) => {
                let pool = self.handle().expect("a handle").clone();
                let got = if how % 2 == 0 {
                    self.model.frees = Frees::Deferred;
                    // SAFETY: `block` came from this pool with `size`
                    // (through `into_raw` or a raw `allocate`), and is
                    // given back once.
                    catching(|| drop(unsafe { Pooled::from_raw(&pool, block, size) }))
                } else {
                    self.model.frees = Frees::Immediate;
                    // SAFETY: as above.
                    catching(|| pool.with(|p| unsafe { p.release(block, size) }))
                };
                (size, got)
            }
        };
        let observed = self.parts.checking.calls_since(before);
        let want = self.model.release(i, &observed);
        assert_eq!(
            got, want,
            "release #{i} ({size} bytes) at step {}",
            self.step
        );
        self.check(&format_args!(
            "release #{i} ({size} bytes), panicked: {}",
            got.is_err()
        ));
        (size, got.is_err())
    }

    fn apply(&mut self, op: SharedOp) {
        let live = self.held.slots.len();
        let palette = |i: u8| pick(&self.model.cfg.palette, i);
        match op {
            SharedOp::Allocate { handle, size } => {
                let size = size.bytes(&self.model.cfg.palette);
                let pool = self.held.handles[usize::from(handle) % self.held.handles.len()].clone();
                self.allocate(pool, size, false);
            }
            SharedOp::AllocateViaBlock(i) => {
                let size = palette(i);
                let pool = self
                    .held
                    .slots
                    .iter()
                    .rev()
                    .find_map(|s| match s {
                        Holder::Pooled(p) => Some(p.pool().clone()),
                        Holder::Raw(..) => None,
                    })
                    .unwrap_or_else(|| self.held.handles[0].clone());
                self.allocate(pool, size, false);
            }
            SharedOp::WithAllocate(i) => {
                let pool = self.held.handles[0].clone();
                self.allocate(pool, palette(i), true);
            }
            SharedOp::Release { index, how } if live > 0 => {
                self.release(usize::from(index) % live, how);
            }
            SharedOp::ReleaseAllocate(i) if live > 0 => {
                let (size, released_panicked) = self.release(usize::from(i) % live, 0);
                let cached = self.model.idle.last().map(|b| b.block);
                let pool = self.held.handles[0].clone();
                let panicked = self.allocate(pool, size, false);
                let tail = self.model.live.last().map(|b| b.block);
                if self.model.reuses_at_once() && !released_panicked && !panicked {
                    assert!(cached.is_some() && tail == cached, "release then allocate");
                }
            }
            SharedOp::Release { .. } | SharedOp::ReleaseAllocate(_) => {}
            SharedOp::IntoRaw(i) if live > 0 => {
                let i = usize::from(i) % live;
                self.held.make_raw(i);
                self.touched = Some(i);
                self.check(&op);
            }
            SharedOp::FromRaw(i) if live > 0 => {
                let i = usize::from(i) % live;
                self.held.make_pooled(i);
                self.touched = Some(i);
                self.check(&op);
            }
            SharedOp::IntoRaw(_) | SharedOp::FromRaw(_) => {}
            SharedOp::Common(step) => {
                apply_common(step, &self.parts, &mut self.model);
                self.check(&op);
            }
            SharedOp::Collect => {
                let pool = &self.held.handles[0];
                let got = catching(|| pool.collect());
                self.model.frees = Frees::Deferred;
                let want = self.model.collect();
                assert_eq!(got, want, "collect at step {}", self.step);
                self.check(&op);
            }
            SharedOp::Trim => {
                let pool = &self.held.handles[0];
                let got = catching(|| pool.trim());
                self.model.frees = Frees::Deferred;
                let want = self.model.trim();
                assert_eq!(got, want, "trim at step {}", self.step);
                self.check(&op);
            }
            SharedOp::CloneHandle => {
                self.held.clone_handle();
                self.check(&op);
            }
            SharedOp::DropHandle(i) => {
                self.held.drop_handle(i);
                self.check(&op);
            }
        }
    }
}

fn run_shared_with<P: Policy>(policy: P, probe: Probe, cfg: Config, ops: &[SharedOp]) -> Summary {
    let parts = new_parts(&cfg, probe.switches);
    let pool = SharedPool::new(build(policy, &cfg, &parts));
    let (trim_before_drop, mut order) = (cfg.trim_before_drop, DropOrder::new(cfg.drop_seed));
    let mut h = SharedHarness {
        held: Held::new(pool),
        parts,
        model: Model::new(cfg, probe.answers),
        step: 0,
        touched: None,
    };
    h.check_full(&"a new pool");
    for &op in ops.iter().take(MAX_OPS) {
        h.step += 1;
        h.apply(op);
    }
    // The end runs without injected panics (the pool's drop under panics is
    // `pool_ops`'s, the same code).
    h.parts.failing.fail_next(0);
    h.model.fail_next = 0;
    h.parts.switches.disarm();
    h.model.armed = [0; 8];
    h.model.frees = Frees::Deferred;
    h.held.all_pooled();
    h.check_full(&"the end: every block in a Pooled");
    let summary = h
        .model
        .summary(h.held.handles[0].stats(), ops.len().min(MAX_OPS));
    if trim_before_drop {
        h.step += 1;
        let want = h.model.trim().expect("nothing is armed");
        assert_eq!(h.held.handles[0].trim(), want, "final trim");
        h.check_full(&"final trim");
    }
    // Drop handles and blocks in a seeded order; the pool goes with the last.
    let big_table =
        matches!(h.model.cfg.kind, Kind::FixedCapacity { slots } if slots > FixedCapacity::WINDOW);
    loop {
        let (handles, blocks) = (h.held.handles.len(), h.held.slots.len());
        let total = handles + blocks;
        if total == 0 {
            break;
        }
        let mut k = order.next(total);
        // With a table larger than its window, the model learns a release's
        // victim from the call log, which the pool's own drop would muddle:
        // the last handle then goes last.
        if big_table && k < handles && handles == 1 && blocks > 0 {
            k = handles + k % blocks;
        }
        h.step += 1;
        let before = h.parts.checking.calls_len();
        if k < handles {
            drop(h.held.handles.remove(k));
            if total == 1 {
                h.model.drop_pool().expect("nothing is armed");
            } else {
                assert_eq!(
                    h.parts.checking.calls_len(),
                    before,
                    "dropping a handle freed"
                );
            }
        } else {
            let i = k - handles;
            let Holder::Pooled(p) = h.held.slots.remove(i) else {
                unreachable!("every raw block is a Pooled again")
            };
            drop(p);
            let observed = h.parts.checking.calls_since(before);
            h.model.release(i, &observed).expect("nothing is armed");
            if total == 1 {
                h.model.drop_pool().expect("nothing is armed");
            }
        }
        if total == 1 {
            h.parts.checking.with_calls(|calls| {
                assert_eq!(calls, h.model.calls(), "backing calls after drop");
            });
        } else if total == 2 {
            // The last check while the pool stands.
            h.check_full(&"the end: the last drop before the pool's");
        } else {
            h.check(&"the end: a drop");
        }
    }
    h.parts.checking.assert_all_freed();
    assert_eq!(h.parts.checking.live(), 0);
    assert_eq!(h.parts.failing.used(), 0);
    summary
}
