//! `shared_ops` on a pool from
//! [`SharedPool::with_thread_caches`]: per-thread magazines in front of the
//! shared cache (a [`Config`] with flag `& 4` and a `FixedTime` policy).
//!
//! The blocks in magazines are cached blocks the shared cache does not
//! see, so the step-by-step model does not follow them (which magazine a
//! block sits in, which of them `with`, the limit or the out-of-memory
//! retry flush). The run checks instead what the documentation promises
//! whatever the magazines hold, after every step:
//!
//! - the counts in use are exactly the blocks the harness holds (a block
//!   idle in a magazine counts as cached), and every backing block is in
//!   use or cached: `blocks_in_use + blocks_cached` and `bytes_reserved`
//!   are the backing allocator's live blocks and bytes;
//! - the counters add up: hits and misses are the allocations that
//!   succeeded, misses the backing allocations, `bytes_from_pool +
//!   bytes_from_backing` their classes, `bytes_requested` their sizes,
//!   every backing free an eviction or a trim, the backing calls, failures
//!   and bytes as the allocators counted them;
//! - `peak_bytes_in_use` is at least every in-use total seen (an upper
//!   bound on a thread-cached pool) and at most `peak_bytes_reserved`,
//!   which is at least the backing allocator's peak; the limit holds;
//! - decay stays exact: once a time-to-live has passed since the last step
//!   that could cache a block, a `collect` leaves nothing cached, the
//!   magazines of exited threads included;
//! - at the end, every backing block was freed exactly once.
//!
//! Operations run on the main thread, except [`SharedOp::AllocateViaBlock`],
//! which here runs a short-lived scoped thread: it releases a block the
//! main thread held (into its own magazine), allocates and releases a few
//! palette sizes, hands one block back to the main thread, and exits,
//! leaving its magazine to `collect`, `trim` and the pool's drop. No panic
//! is injected (the pool holds a bare `FixedTime`; an inject step
//! disarms), `fail_next` and the capacity still fail backing calls.

use core::fmt;

use crate::error::PoolError;
use crate::policy::{FixedTime, Reuse};
use crate::pool::DecayingPool;
use crate::shared::{Pooled, SharedPool};

use super::held::Held;
use super::input::{Common, Config, Kind, MAX_OPS, SharedOp, pick, ticks};
use super::model::model_round;
use super::{Clock, DropOrder, FULL_CHECK_EVERY, Injecting, Parts, Summary, new_parts};

type Shared = SharedPool<Injecting, FixedTime, Clock>;
type Block = Pooled<Injecting, FixedTime, Clock>;

/// The stack of each short-lived thread: ample for its few pool calls
/// (under AddressSanitizer too), and an eighth of the default 2 MiB. The
/// fuzz targets' AddressSanitizer maps, shadows and clears memory for each
/// thread in proportion to its stack (its fake stacks), and with a thread
/// for every `AllocateViaBlock` that system time was a large share of a
/// thread-cached run: this stack cut the `shared_ops` target's system time
/// by a fifth.
const THREAD_STACK: usize = 256 << 10;

/// A live block of the run.
type Holder = super::held::Holder<FixedTime>;

/// What the successful allocations add up to.
#[derive(Clone, Copy, Debug, Default)]
struct Served {
    count: u64,
    classes: usize,
    sizes: usize,
}

struct CachedHarness {
    held: Held<FixedTime>,
    parts: Parts,
    cfg: Config,
    ttl: u64,
    /// The clock, in ticks.
    now: u64,
    /// The time of the last step that could cache a block.
    busy_at: u64,
    served: Served,
    /// The most bytes in use seen.
    peak_in_use: usize,
    /// The classes of the blocks the harness holds, summed as they come
    /// and go (every [`FULL_CHECK_EVERY`] steps and at the end, recounted).
    in_use: usize,
    /// The step of the last recount.
    full_at: usize,
    step: usize,
}

impl CachedHarness {
    fn class(&self, size: usize) -> usize {
        model_round(self.cfg.size_class, size).expect("a block's size has a class")
    }

    /// The bytes in use, recounted from the blocks held.
    fn live_bytes(&self) -> usize {
        self.held
            .slots
            .iter()
            .fold(0usize, |sum, h| sum.saturating_add(self.class(h.size())))
    }

    /// Holds one more block.
    fn push_slot(&mut self, holder: Holder) {
        self.in_use = self.in_use.saturating_add(self.class(holder.size()));
        self.held.slots.push(holder);
    }

    /// Lets go of the i-th block held.
    fn remove_slot(&mut self, i: usize) -> Holder {
        let holder = self.held.slots.remove(i);
        // Exact unless the sum saturated, which the recount then shows.
        self.in_use = self.in_use.saturating_sub(self.class(holder.size()));
        holder
    }

    fn handle(&self) -> Option<&Shared> {
        self.held.handle()
    }

    fn serve(&mut self, size: usize) {
        self.served.count += 1;
        // Saturating, as the pool's byte counters (a huge request served
        // by an allocator without a capacity counts).
        self.served.classes = self.served.classes.saturating_add(self.class(size));
        self.served.sizes = self.served.sizes.saturating_add(size);
    }

    /// The checks after every step; every [`FULL_CHECK_EVERY`] steps and
    /// when `force`d, the bytes in use recounted too.
    fn check_at(&mut self, what: &dyn fmt::Debug, force: bool) {
        if force || self.step >= self.full_at + FULL_CHECK_EVERY {
            self.full_at = self.step;
            assert_eq!(
                self.in_use,
                self.live_bytes(),
                "the bytes in use, as kept and recounted"
            );
        }
        let in_use = self.in_use;
        self.peak_in_use = self.peak_in_use.max(in_use);
        let Some(pool) = self.handle() else {
            return;
        };
        let s = pool.stats();
        let step = self.step;
        let at = |field: &str| format!("{field} after step {step} ({what:?}): {s:?}");
        let c = &self.parts.checking;
        assert_eq!(
            s.blocks_in_use,
            self.held.slots.len() as u64,
            "{}",
            at("blocks_in_use")
        );
        assert_eq!(s.bytes_in_use, in_use, "{}", at("bytes_in_use"));
        assert_eq!(
            s.blocks_in_use + s.blocks_cached,
            c.live() as u64,
            "{}",
            at("blocks in use and cached against the backing blocks")
        );
        assert_eq!(
            s.bytes_reserved,
            s.bytes_in_use + s.bytes_cached,
            "{}",
            at("bytes_reserved")
        );
        assert_eq!(s.bytes_reserved, c.live_bytes(), "{}", at("backing bytes"));
        assert_eq!(self.parts.failing.used(), c.live_bytes(), "failing.used");
        assert_eq!(s.backing_allocs, c.allocs(), "{}", at("backing_allocs"));
        assert_eq!(
            s.backing_deallocs,
            c.deallocs(),
            "{}",
            at("backing_deallocs")
        );
        assert_eq!(
            s.backing_failures,
            self.parts.failing.failures(),
            "{}",
            at("backing_failures")
        );
        assert_eq!(
            s.evictions + s.trimmed,
            s.backing_deallocs,
            "{}",
            at("every free an eviction or a trim")
        );
        assert_eq!(
            s.hits + s.misses,
            self.served.count,
            "{}",
            at("hits + misses")
        );
        assert_eq!(s.misses, s.backing_allocs, "{}", at("misses"));
        // Exact while nothing saturates.
        if self.served.classes < usize::MAX / 2 {
            assert_eq!(
                s.bytes_from_pool.saturating_add(s.bytes_from_backing),
                self.served.classes,
                "{}",
                at("bytes served")
            );
            assert_eq!(
                s.bytes_requested,
                self.served.sizes,
                "{}",
                at("bytes_requested")
            );
        }
        assert!(
            s.peak_bytes_in_use >= self.peak_in_use,
            "{}",
            at("peak_bytes_in_use below a total seen")
        );
        assert!(
            s.peak_bytes_in_use <= s.peak_bytes_reserved,
            "{}",
            at("peak_bytes_in_use above peak_bytes_reserved")
        );
        assert!(
            s.peak_bytes_reserved >= c.peak_live_bytes(),
            "{}",
            at("peak_bytes_reserved below the backing peak")
        );
        if let Some(limit) = self.cfg.limit {
            assert!(s.peak_bytes_reserved <= limit, "{}", at("the limit"));
        }
    }

    /// Allocates `size` on this thread (raw: through `with`).
    fn allocate(&mut self, pool: Shared, size: usize, raw: bool) {
        let got = if raw {
            // `with` has put the magazines' blocks back into the shared
            // cache: the whole pool is there to validate.
            pool.with(|p| {
                p.validate();
                p.allocate(size)
            })
            .map(|b| Holder::Raw(b, size))
        } else {
            pool.allocate(size).map(Holder::Pooled)
        };
        if let Ok(holder) = got {
            self.serve(size);
            self.push_slot(holder);
        } else if size == 0 {
            assert!(matches!(got, Err(PoolError::ZeroSize)));
        }
    }

    /// Gives back the i-th live block on this thread; returns its size.
    fn release(&mut self, i: usize, how: u8) -> usize {
        let holder = self.remove_slot(i);
        let size = holder.size();
        match holder {
            Holder::Pooled(p) => drop(p),
            Holder::Raw(block, size) => {
                let pool = self.handle().expect("a handle").clone();
                if how % 2 == 0 {
                    // SAFETY: `block` came from this pool with `size` and is
                    // given back once.
                    drop(unsafe { Pooled::from_raw(&pool, block, size) });
                } else {
                    pool.with(|p| {
                        p.validate();
                        // SAFETY: as above.
                        unsafe { p.release(block, size) }
                    });
                }
            }
        }
        size
    }

    /// A short-lived thread: takes the last live `Pooled` (when `b` is odd)
    /// and releases it there, allocates `1 + (b / 2) % 4` palette sizes,
    /// releases all but the first, allocates the second size again (a hit
    /// in its own magazine, when that block went there), releases it, hands
    /// the first block back and exits.
    fn thread_run(&mut self, b: u8) {
        let give = if b % 2 == 1 {
            let last = self
                .held
                .slots
                .iter()
                .rposition(|s| matches!(s, Holder::Pooled(_)));
            last.map(|i| self.remove_slot(i))
        } else {
            None
        };
        let palette = self.cfg.palette.clone();
        let pool = self.held.handles[0].clone();
        let n = 1 + usize::from(b / 2) % 4;
        let main_bytes = self.in_use;
        let rule = self.cfg.size_class;
        let class = move |size| model_round(rule, size).expect("a class");
        /// The thread's allocations: what it holds, the sizes served, the
        /// most bytes it held at once.
        struct Run {
            held: Vec<Block>,
            served: Vec<usize>,
            most: usize,
        }
        impl Run {
            fn take(&mut self, pool: &Shared, size: usize, class: impl Fn(usize) -> usize) {
                if let Ok(p) = pool.allocate(size) {
                    self.served.push(size);
                    self.held.push(p);
                    let bytes = self.held.iter().map(|p| class(p.size())).sum();
                    self.most = self.most.max(bytes);
                }
            }
        }
        let (kept, served, most) = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .stack_size(THREAD_STACK)
                .spawn_scoped(scope, move || {
                    drop(give);
                    let mut run = Run {
                        held: Vec::new(),
                        served: Vec::new(),
                        most: 0,
                    };
                    for k in 0..n {
                        run.take(&pool, pick(&palette, b.wrapping_add(k as u8)), class);
                    }
                    let first = (!run.held.is_empty()).then(|| run.held.remove(0));
                    let again = run.held.first().map(|p| p.size());
                    run.held.clear();
                    if let Some(size) = again {
                        run.take(&pool, size, class);
                        run.held.clear();
                    }
                    (first, run.served, run.most)
                })
                .expect("a thread spawns")
                .join()
                .expect("the thread's steps do not panic")
        });
        for size in served {
            self.serve(size);
        }
        self.peak_in_use = self.peak_in_use.max(main_bytes.saturating_add(most));
        if let Some(p) = kept {
            self.push_slot(Holder::Pooled(p));
        }
    }

    fn apply(&mut self, op: SharedOp) {
        let live = self.held.slots.len();
        let palette = |i: u8| pick(&self.cfg.palette, i);
        let caches = !matches!(
            op,
            SharedOp::Common(_)
                | SharedOp::Collect
                | SharedOp::Trim
                | SharedOp::CloneHandle
                | SharedOp::DropHandle(_)
                | SharedOp::IntoRaw(_)
                | SharedOp::FromRaw(_)
        );
        if caches {
            self.busy_at = self.now;
        }
        match op {
            SharedOp::Allocate { handle, size } => {
                let size = size.bytes(&self.cfg.palette);
                let pool = self.held.handles[usize::from(handle) % self.held.handles.len()].clone();
                self.allocate(pool, size, false);
            }
            SharedOp::AllocateViaBlock(b) => self.thread_run(b),
            SharedOp::WithAllocate(i) => {
                let pool = self.held.handles[0].clone();
                self.allocate(pool, palette(i), true);
            }
            SharedOp::Release { index, how } if live > 0 => {
                self.release(usize::from(index) % live, how);
            }
            SharedOp::ReleaseAllocate(i) if live > 0 => {
                let size = self.release(usize::from(i) % live, 0);
                let pool = self.held.handles[0].clone();
                self.allocate(pool, size, false);
            }
            SharedOp::Release { .. } | SharedOp::ReleaseAllocate(_) => {}
            SharedOp::IntoRaw(i) if live > 0 => self.held.make_raw(usize::from(i) % live),
            SharedOp::FromRaw(i) if live > 0 => self.held.make_pooled(usize::from(i) % live),
            SharedOp::IntoRaw(_) | SharedOp::FromRaw(_) => {}
            SharedOp::Common(Common::Advance { quarters, jitter }) => {
                let dt = (u64::from(quarters) * self.ttl.max(1) / 4)
                    .saturating_add_signed(jitter.into());
                self.now += dt;
                self.parts.clock.inner().advance(ticks(dt));
            }
            SharedOp::Common(Common::FailNext(n)) => self.parts.failing.fail_next(n),
            SharedOp::Common(Common::Inject { .. }) => {}
            SharedOp::Collect => {
                self.held.handles[0].collect();
                if self.now.saturating_sub(self.busy_at) >= self.ttl {
                    let s = self.held.handles[0].stats();
                    assert_eq!(
                        (s.blocks_cached, s.bytes_cached),
                        (0, 0),
                        "a collection a time-to-live after the last release left blocks \
                         cached (step {})",
                        self.step
                    );
                }
            }
            SharedOp::Trim => {
                self.held.handles[0].trim();
                let s = self.held.handles[0].stats();
                assert_eq!(s.blocks_cached, 0, "trim leaves nothing cached");
            }
            SharedOp::CloneHandle => self.held.clone_handle(),
            SharedOp::DropHandle(i) => self.held.drop_handle(i),
        }
        self.check_at(&op, false);
    }
}

/// Runs `ops` on a thread-cached pool (`cfg.kind` must be `FixedTime`).
pub(super) fn run_thread_cached(cfg: Config, ops: &[SharedOp]) -> Summary {
    let Kind::FixedTime { ttl } = cfg.kind else {
        unreachable!("thread caches are for FixedTime only")
    };
    let parts = new_parts(&cfg, crate::testing::PolicySwitches::default());
    let mut builder = DecayingPool::builder(parts.backing.clone())
        .policy(FixedTime::new(ticks(ttl)))
        .clock(parts.clock.clone())
        .size_class(cfg.size_class)
        // The magazines stay off under `Fifo`.
        .reuse(Reuse::Lifo);
    if let Some(limit) = cfg.limit {
        builder = builder.limit(limit);
    }
    let pool = SharedPool::with_magazines(builder.build(), cfg.magazine);
    let (trim_before_drop, mut order) = (cfg.trim_before_drop, DropOrder::new(cfg.drop_seed));
    let mut h = CachedHarness {
        held: Held::new(pool),
        parts,
        cfg,
        ttl,
        now: 0,
        busy_at: 0,
        served: Served::default(),
        peak_in_use: 0,
        in_use: 0,
        full_at: 0,
        step: 0,
    };
    h.check_at(&"a new pool", true);
    for &op in ops.iter().take(MAX_OPS) {
        h.step += 1;
        h.apply(op);
    }
    h.parts.failing.fail_next(0);
    h.held.all_pooled();
    h.check_at(&"the end: every block in a Pooled", true);
    let stats = h.held.handles[0].stats();
    if trim_before_drop {
        h.step += 1;
        h.apply(SharedOp::Trim);
    }
    // Drop handles and blocks in a seeded order; the pool goes with the last.
    loop {
        let (handles, blocks) = (h.held.handles.len(), h.held.slots.len());
        let total = handles + blocks;
        if total == 0 {
            break;
        }
        let k = order.next(total);
        h.step += 1;
        if k < handles {
            drop(h.held.handles.remove(k));
        } else {
            drop(h.remove_slot(k - handles));
        }
        h.check_at(&"the end: a drop", total == 2);
    }
    h.parts.checking.assert_all_freed();
    assert_eq!(h.parts.failing.used(), 0);
    Summary {
        kind: h.cfg.kind,
        stats,
        ops: ops.len().min(MAX_OPS),
        retries: 0,
        second_rung: 0,
        peak_live: 0,
        injected: [0; 8],
        deadline_skips: 0,
        thread_cached: true,
    }
}
