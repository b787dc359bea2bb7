//! Tests: the fuzz corpus, replayed on stable.
//!
//! Every file under `fuzz/corpus/pool_ops/` and `fuzz/corpus/shared_ops/`
//! runs through the same checking harness as the `cargo fuzz` targets
//! (`decaying_pool::fuzzing`), so `cargo test` covers the fuzz logic even
//! where nightly is absent. The hand-written seeds are built here (see
//! [`pool_seeds`] and [`shared_seeds`]); the committed corpus must hold
//! each of them, byte for byte. To rewrite them after changing a seed:
//!
//! ```text
//! DECAYING_POOL_WRITE_CORPUS=1 cargo test --test it fuzz_corpus::write_seed_corpus -- --ignored
//! ```

use crate::support::{assert_corpus_holds, noise, replay_corpus, write_corpus};
use std::path::Path;

use decaying_pool::FixedCapacity;
use decaying_pool::fuzzing::{self, FAULTS, Kind, Summary};

// --- the input layout (see `decaying_pool::fuzzing::{Config, Op, SharedOp}`) ---

/// A configuration, byte by byte.
#[derive(Clone)]
struct Cfg {
    /// 0 FixedTime, 1 Exponential, 2 FixedCapacity.
    kind: u8,
    /// Index into `PERIODS` or `SLOTS`.
    param: u8,
    /// 0 Lifo, 1 Fifo.
    reuse: u8,
    /// 0 Exact, 1 PowerOfTwo, 2 Multiple, 3 PowerOfTwoDivisions.
    class: u8,
    class_param: u8,
    /// Index into `LIMITS`.
    limit: Option<u8>,
    /// Index into `CAPACITIES`.
    capacity: Option<u8>,
    /// Indices into `SIZES` (1 to 5).
    palette: Vec<u8>,
    trim_before_drop: bool,
    /// Panic injection on.
    faults: bool,
    drop_seed: u8,
    /// `shared_ops` with `FixedTime`: a thread-cached pool.
    thread_caches: bool,
    /// Index into `MAGAZINES`: its magazines' size.
    magazine: u8,
}

/// Indices into `SIZES`.
const S1: u8 = 0;
const S8: u8 = 4;
const S64: u8 = 6;
const S100: u8 = 7;
const S128: u8 = 9;
const S129: u8 = 10;
const S500: u8 = 11;
const S1000: u8 = 13;
const S1025: u8 = 15;
const S3000: u8 = 16;
const S4096: u8 = 17;

/// Indices into `PERIODS`: 0, 1, 4, 16, 64 ticks.
const P0: u8 = 0;
const P1: u8 = 1;
const P4: u8 = 4;
const P16: u8 = 6;
const P64: u8 = 7;

fn cfg(kind: u8, param: u8) -> Cfg {
    Cfg {
        kind,
        param,
        reuse: 0,
        class: 0,
        class_param: 0,
        limit: None,
        capacity: None,
        palette: vec![S64, S100, S1000],
        trim_before_drop: false,
        faults: false,
        drop_seed: 0,
        thread_caches: false,
        magazine: 0,
    }
}

impl Cfg {
    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![
            self.kind,
            self.param,
            self.reuse,
            self.class,
            self.class_param,
            self.limit.map_or(0, |i| 128 + i),
            self.capacity.map_or(0, |i| 128 + i),
            (self.palette.len() - 1) as u8,
        ];
        b.extend(&self.palette);
        b.push(
            u8::from(self.trim_before_drop)
                | u8::from(self.faults) << 1
                | u8::from(self.thread_caches) << 2
                | self.magazine << 3,
        );
        b.push(self.drop_seed);
        b
    }
    fn fifo(mut self) -> Self {
        self.reuse = 1;
        self
    }
    fn class(mut self, class: u8, param: u8) -> Self {
        (self.class, self.class_param) = (class, param);
        self
    }
    fn limit(mut self, i: u8) -> Self {
        self.limit = Some(i);
        self
    }
    fn capacity(mut self, i: u8) -> Self {
        self.capacity = Some(i);
        self
    }
    fn palette(mut self, p: &[u8]) -> Self {
        self.palette = p.to_vec();
        self
    }
    fn trim(mut self) -> Self {
        self.trim_before_drop = true;
        self
    }
    fn faults(mut self) -> Self {
        self.faults = true;
        self
    }
    fn drop_seed(mut self, s: u8) -> Self {
        self.drop_seed = s;
        self
    }
    fn thread_caches(mut self) -> Self {
        self.thread_caches = true;
        self
    }
    /// Thread caches whose magazines hold `MAGAZINES[i]` blocks.
    fn magazine(mut self, i: u8) -> Self {
        self.thread_caches = true;
        self.magazine = i;
        self
    }
}

/// `pool_ops` operations.
mod op {
    pub(super) fn alloc(i: u8) -> Vec<u8> {
        vec![0, i]
    }
    pub(super) fn zero() -> Vec<u8> {
        vec![10]
    }
    pub(super) fn huge(k: u8) -> Vec<u8> {
        vec![11, k]
    }
    pub(super) fn release(i: u8) -> Vec<u8> {
        vec![12, i]
    }
    pub(super) fn release_alloc(i: u8) -> Vec<u8> {
        vec![19, i]
    }
    /// `quarters` of the policy's period, plus `jitter` (-1, 0, 1) ticks.
    pub(super) fn advance(quarters: u8, jitter: i8) -> Vec<u8> {
        vec![22, quarters, (jitter + 1) as u8]
    }
    pub(super) fn fail(n: u8) -> Vec<u8> {
        vec![27, n]
    }
    /// Panic injection: `fault` (an index into `FAULTS`) on the `nth`
    /// call from now.
    pub(super) fn inject(fault: u8, nth: u8) -> Vec<u8> {
        vec![27, 128 + fault, nth - 1]
    }
    pub(super) fn collect() -> Vec<u8> {
        vec![29]
    }
    pub(super) fn trim() -> Vec<u8> {
        vec![31]
    }
}

/// `shared_ops` operations.
mod sop {
    pub(super) fn alloc(handle: u8, i: u8) -> Vec<u8> {
        vec![0, handle, i]
    }
    pub(super) fn zero() -> Vec<u8> {
        vec![9, 0]
    }
    pub(super) fn huge(k: u8) -> Vec<u8> {
        vec![9, k + 1]
    }
    pub(super) fn release(i: u8, how: u8) -> Vec<u8> {
        vec![10, i, how]
    }
    pub(super) fn into_raw(i: u8) -> Vec<u8> {
        vec![15, i]
    }
    pub(super) fn from_raw(i: u8) -> Vec<u8> {
        vec![17, i]
    }
    pub(super) fn with_alloc(i: u8) -> Vec<u8> {
        vec![18, i]
    }
    pub(super) fn release_alloc(i: u8) -> Vec<u8> {
        vec![19, i]
    }
    pub(super) fn advance(quarters: u8, jitter: i8) -> Vec<u8> {
        vec![20, quarters, (jitter + 1) as u8]
    }
    pub(super) fn fail(n: u8) -> Vec<u8> {
        vec![23, n]
    }
    /// As `op::inject`.
    pub(super) fn inject(fault: u8, nth: u8) -> Vec<u8> {
        vec![23, 128 + fault, nth - 1]
    }
    pub(super) fn collect() -> Vec<u8> {
        vec![24]
    }
    pub(super) fn trim() -> Vec<u8> {
        vec![26]
    }
    pub(super) fn clone_handle() -> Vec<u8> {
        vec![27]
    }
    pub(super) fn drop_handle(i: u8) -> Vec<u8> {
        vec![28, i]
    }
    pub(super) fn via_block(i: u8) -> Vec<u8> {
        vec![29, i]
    }
}

fn seed(cfg: &Cfg, ops: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut b = cfg.bytes();
    b.extend(ops.into_iter().flatten());
    b
}

/// Allocate `n` blocks of palette entries `0..n % len`, release them all
/// (newest first when `reverse`).
fn burst(n: u8, reverse: bool) -> Vec<Vec<u8>> {
    let mut ops: Vec<_> = (0..n).map(op::alloc).collect();
    for i in 0..n {
        ops.push(op::release(if reverse { n - 1 - i } else { 0 }));
    }
    ops
}

/// A steady loop: two live blocks, released and asked for again while
/// time passes, with surplus blocks that decay.
fn steady(rounds: u8) -> Vec<Vec<u8>> {
    let mut ops = vec![op::alloc(0), op::alloc(1), op::alloc(2), op::release(2)];
    for r in 0..rounds {
        ops.push(op::release_alloc(r % 2));
        ops.push(op::advance(1 + r % 3, 0));
        if r % 4 == 3 {
            ops.push(op::collect());
        }
    }
    ops
}

/// Blocks released, then the clock run past their decay in steps.
fn decay() -> Vec<Vec<u8>> {
    let mut ops = burst(8, false);
    for q in [1u8, 2, 3, 4, 4, 8, 16] {
        ops.push(op::advance(q, 0));
        ops.push(op::collect());
        ops.push(op::alloc(q));
    }
    ops.push(op::advance(16, 1));
    ops.push(op::collect());
    ops.push(op::trim());
    ops
}

/// A step of the out-of-memory script, for either target.
#[derive(Clone, Copy)]
enum L {
    Alloc(u8),
    Release(u8),
    Fail(u8),
    Trim,
}

/// The out-of-memory ladder, with a backing capacity of 1000 bytes and a
/// palette of 500, 100, 1000: the first rung (free the oldest blocks until
/// the class size is freed, retry), the second (free everything, retry
/// once more), the whole ladder failing, and a failure with an empty cache
/// (no retry).
const OOM: [L; 32] = [
    // Cached 500, 100; 1000 does not fit: rung one frees both; success.
    L::Alloc(0),
    L::Alloc(1),
    L::Release(0),
    L::Release(0),
    L::Alloc(2),
    L::Release(0),
    // Cached 1000; 500 does not fit: rung one frees it; success.
    L::Alloc(0),
    L::Alloc(0),
    L::Release(0),
    L::Release(0),
    // Cached 500, 500; two injected failures: rung two; success.
    L::Fail(2),
    L::Alloc(1),
    // An empty cache: the second 500 fails at once.
    L::Alloc(0),
    L::Alloc(0),
    L::Release(1),
    L::Release(0),
    // A hit, then a miss that rung one serves.
    L::Alloc(0),
    L::Alloc(0),
    L::Release(0),
    L::Release(0),
    // Three injected failures: the whole ladder fails.
    L::Fail(3),
    L::Alloc(1),
    // An injected failure and an empty cache: no retry.
    L::Trim,
    L::Fail(1),
    L::Alloc(1),
    L::Alloc(1),
    L::Alloc(0),
    L::Alloc(2),
    L::Release(0),
    L::Release(0),
    L::Alloc(2),
    L::Release(0),
];

fn oom_ladder() -> Vec<Vec<u8>> {
    OOM.iter()
        .map(|step| match *step {
            L::Alloc(i) => op::alloc(i),
            L::Release(i) => op::release(i),
            L::Fail(n) => op::fail(n),
            L::Trim => op::trim(),
        })
        .collect()
}

fn shared_oom_ladder() -> Vec<Vec<u8>> {
    OOM.iter()
        .enumerate()
        .map(|(n, step)| match *step {
            L::Alloc(i) => sop::alloc(n as u8, i),
            L::Release(i) => sop::release(i, 0),
            L::Fail(n) => sop::fail(n),
            L::Trim => sop::trim(),
        })
        .collect()
}

/// A byte limit: misses free cached blocks to fit, requests that can
/// never fit fail at once.
fn limited() -> Vec<Vec<u8>> {
    // Palette: 1000, 3000, 4096 under a limit of 4096.
    vec![
        op::alloc(0),
        op::alloc(0),
        op::release(0),
        op::alloc(1),
        op::alloc(2),
        op::release(0),
        op::release(0),
        op::alloc(2),
        op::alloc(0),
        op::release(0),
        op::advance(2, 0),
        op::alloc(1),
        op::alloc(0),
        op::release(1),
        op::collect(),
    ]
}

/// Errors: zero and overflowing requests.
fn errors() -> Vec<Vec<u8>> {
    vec![
        op::zero(),
        op::huge(0),
        op::huge(1),
        op::huge(2),
        op::huge(3),
        op::alloc(0),
        op::huge(3),
        op::release(0),
        op::huge(2),
    ]
}

/// Indices into `FAULTS`.
const ALLOCATE: u8 = 0;
const DEALLOCATE: u8 = 1;
const CLOCK: u8 = 2;
const ON_RELEASE: u8 = 3;
const ON_HIT: u8 = 4;
const ON_FREE: u8 = 5;
const MUST_EVICT: u8 = 6;
const DEADLINE: u8 = 7;

/// Two blocks, the first released and expired: the next release runs the
/// policy, which evicts it, before caching the second.
fn release_after_expiry(fault: u8) -> Vec<Vec<u8>> {
    vec![
        op::alloc(0),
        op::alloc(1),
        op::release(0),
        op::advance(4, 0),
        op::inject(fault, 1),
        op::release(0),
        op::alloc(1),
        op::collect(),
    ]
}

/// The `pool_ops` seeds that reach each injected panic, by name.
fn pool_panic_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let ft = || cfg(0, P4).faults();
    let limit_1000 = || ft().limit(4).palette(&[S1000]);
    let oom = |limit: u8, fault: u8| {
        seed(
            &ft().capacity(2).limit(limit).palette(&[S500, S100, S1000]),
            [
                op::alloc(0),
                op::alloc(1),
                op::release(0),
                op::release(0),
                op::inject(fault, 1),
                op::alloc(2),
                op::alloc(2),
            ],
        )
    };
    let burst_then = |c: Cfg, fault: u8, nth: u8, tail: Vec<Vec<u8>>| {
        seed(
            &c,
            [burst(4, false), vec![op::inject(fault, nth)], tail].concat(),
        )
    };
    vec![
        // The booking of a miss whose backing allocate panics is dropped:
        // four more blocks of 1000 fit a limit of 4096.
        (
            "panic-allocate-limit",
            seed(
                &limit_1000(),
                [vec![op::inject(ALLOCATE, 1)], vec![op::alloc(0); 5]].concat(),
            ),
        ),
        // A release whose clock panics frees its block: room under the
        // limit again.
        (
            "panic-release-clock",
            seed(
                &limit_1000(),
                [
                    vec![op::alloc(0); 4],
                    vec![op::inject(CLOCK, 1), op::release(0), op::alloc(0)],
                ]
                .concat(),
            ),
        ),
        // A release whose policy run panics caches its block.
        (
            "panic-release-deallocate",
            seed(&ft(), release_after_expiry(DEALLOCATE)),
        ),
        (
            "panic-release-must-evict",
            seed(&ft(), release_after_expiry(MUST_EVICT)),
        ),
        (
            "panic-release-on-free",
            seed(&ft(), release_after_expiry(ON_FREE)),
        ),
        (
            "panic-release-exponential-on-free",
            seed(&cfg(1, P4).faults(), release_after_expiry(ON_FREE)),
        ),
        (
            "panic-on-release",
            seed(
                &ft(),
                [
                    op::inject(ON_RELEASE, 1),
                    op::alloc(0),
                    op::release(0),
                    op::alloc(0),
                ],
            ),
        ),
        (
            "panic-on-hit",
            seed(
                &cfg(1, P16).faults(),
                [
                    op::alloc(0),
                    op::release(0),
                    op::inject(ON_HIT, 1),
                    op::alloc(0),
                    op::alloc(0),
                ],
            ),
        ),
        (
            "panic-collect-deadline",
            seed(
                &ft(),
                [
                    op::alloc(0),
                    op::release(0),
                    op::inject(DEADLINE, 1),
                    op::collect(),
                    op::collect(),
                    op::advance(4, 0),
                    op::collect(),
                ],
            ),
        ),
        (
            "panic-collect-exponential-must-evict",
            burst_then(
                cfg(1, P16).faults(),
                MUST_EVICT,
                2,
                vec![op::advance(8, 0), op::collect(), op::collect()],
            ),
        ),
        // The limit frees a cached block to make room; `on_free` panics:
        // nothing is booked.
        ("panic-limit-on-free", oom(3, ON_FREE)),
        // The out-of-memory retry frees cached blocks; they panic: the
        // booking is dropped.
        ("panic-oom-retry-on-free", oom(7, ON_FREE)),
        ("panic-oom-retry-deallocate", oom(7, DEALLOCATE)),
        (
            "panic-trim-deallocate",
            burst_then(ft(), DEALLOCATE, 2, vec![op::trim(), op::trim()]),
        ),
        (
            "panic-fixed-capacity-eviction-deallocate",
            seed(
                &cfg(2, 3).faults(),
                [
                    vec![op::alloc(0), op::alloc(1), op::alloc(2), op::alloc(0)],
                    vec![op::release(0); 3],
                    vec![op::inject(DEALLOCATE, 1), op::release(0), op::alloc(0)],
                ]
                .concat(),
            ),
        ),
        // Dropping the pool: every block offered though one panics.
        (
            "panic-drop-deallocate",
            burst_then(cfg(0, P64).faults(), DEALLOCATE, 2, vec![]),
        ),
        (
            "panic-drop-on-free",
            burst_then(cfg(1, P64).faults(), ON_FREE, 2, vec![]),
        ),
        (
            "panic-drop-clock",
            burst_then(cfg(0, P64).faults(), CLOCK, 1, vec![]),
        ),
    ]
}

/// The `pool_ops` seeds, by name.
fn pool_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| seeds.push((format!("seed-{name}"), bytes));
    let kinds: [(&str, u8, u8); 7] = [
        ("fixed-time-4", 0, P4),
        ("fixed-time-0", 0, P0),
        ("exponential-16", 1, P16),
        ("exponential-1", 1, P1),
        ("exponential-0", 1, P0),
        ("fixed-capacity-3", 2, 3),
        ("fixed-capacity-16", 2, 12),
    ];
    for (name, kind, param) in kinds {
        add(
            &format!("{name}-steady"),
            seed(&cfg(kind, param), steady(24)),
        );
        add(
            &format!("{name}-decay"),
            seed(&cfg(kind, param).fifo().palette(&[S64]), decay()),
        );
        add(
            &format!("{name}-oom"),
            seed(
                &cfg(kind, param).capacity(2).palette(&[S500, S100, S1000]),
                oom_ladder(),
            ),
        );
    }
    add(
        "exponential-64-mixed-sizes",
        seed(
            &cfg(1, P64).palette(&[S8, S1000, S129, S4096]),
            [burst(10, true), decay()].concat(),
        ),
    );
    add(
        "fixed-capacity-0",
        seed(&cfg(2, 0), [burst(4, false), steady(6)].concat()),
    );
    add(
        "fixed-capacity-64-same-class",
        seed(&cfg(2, 14).palette(&[S64]), burst(20, false)),
    );
    add(
        "fixed-capacity-9-window",
        seed(
            &cfg(2, 9).palette(&[S64, S1]),
            [burst(12, true), burst(12, false)].concat(),
        ),
    );
    add(
        "limit-fixed-time",
        seed(
            &cfg(0, P16).limit(4).palette(&[S1000, S3000, S4096]),
            limited(),
        ),
    );
    add(
        "limit-exponential-pow2",
        seed(
            &cfg(1, P16)
                .limit(4)
                .class(1, 0)
                .palette(&[S1000, S3000, S4096]),
            limited(),
        ),
    );
    add(
        "errors-multiple",
        seed(&cfg(0, P4).class(2, 5).trim(), errors()),
    );
    add(
        "errors-divisions",
        seed(&cfg(1, P4).class(3, 3).trim(), errors()),
    );
    add(
        "divisions-3-steady",
        seed(
            &cfg(0, P16).class(3, 3).palette(&[S1025, S3000, S129]),
            steady(16),
        ),
    );
    // Blocks of 2^63 + 1 bytes beside blocks of 2^40, 1025 and 128, with
    // a half-life of 4 ticks: where an ulp is 2048, the allowance and the
    // bytes cached round apart at each release (the allowance as a float
    // sum, the bytes as an integer), and the allowance came out an ulp
    // above the clamp of a collection that the deadline let the pool
    // skip (found by `cargo fuzz run pool_ops`).
    add(
        "exponential-clamp-rounding",
        seed(
            &cfg(1, P4)
                .palette(&[S1025, S128])
                .trim()
                .faults()
                .drop_seed(171),
            [
                op::huge(3),
                op::huge(3),
                op::huge(2),
                op::alloc(0),
                op::alloc(0),
                op::alloc(1),
                op::release(0),
                op::advance(4, 0),
                op::inject(ON_FREE, 1),
            ],
        ),
    );
    for (i, kind) in [0u8, 1, 2, 2].into_iter().enumerate() {
        let c = cfg(kind, [P4, P16, 7, 13][i])
            .capacity(3)
            .palette(&[S64, S500, S1000, S3000])
            .class(i as u8, 4);
        add(&format!("noise-{i}"), seed(&c, [noise(i as u64 + 1, 400)]));
        add(
            &format!("noise-panics-{i}"),
            seed(&c.faults(), [noise(i as u64 + 51, 400)]),
        );
    }
    for (name, bytes) in pool_panic_seeds() {
        add(name, bytes);
    }
    seeds
}

/// The `shared_ops` seeds, by name.
fn shared_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| seeds.push((format!("seed-{name}"), bytes));
    let handles_and_raw = || {
        vec![
            sop::alloc(0, 0),
            sop::clone_handle(),
            sop::alloc(1, 1),
            sop::with_alloc(2),
            sop::into_raw(0),
            sop::via_block(0),
            sop::clone_handle(),
            sop::drop_handle(0),
            sop::from_raw(0),
            sop::release(2, 1),
            sop::release(0, 0),
            sop::into_raw(1),
            sop::advance(2, 0),
            sop::release_alloc(0),
            sop::collect(),
            sop::with_alloc(0),
            sop::advance(4, 1),
            sop::collect(),
            sop::alloc(1, 2),
            sop::zero(),
            sop::huge(0),
            sop::trim(),
        ]
    };
    let kinds: [(&str, u8, u8); 5] = [
        ("fixed-time-4", 0, P4),
        ("exponential-16", 1, P16),
        ("fixed-capacity-3", 2, 3),
        ("fixed-capacity-16", 2, 12),
        ("fixed-capacity-0", 2, 0),
    ];
    for (n, (name, kind, param)) in kinds.into_iter().enumerate() {
        add(
            &format!("{name}-handles"),
            seed(&cfg(kind, param).drop_seed(n as u8 * 37), handles_and_raw()),
        );
        add(
            &format!("{name}-oom"),
            seed(
                &cfg(kind, param)
                    .capacity(2)
                    .palette(&[S500, S100, S1000])
                    .drop_seed(n as u8 * 11 + 3),
                [
                    shared_oom_ladder(),
                    vec![sop::clone_handle(), sop::into_raw(0)],
                ]
                .concat(),
            ),
        );
    }
    add(
        "limit-trim",
        seed(
            &cfg(0, P16).limit(4).trim().palette(&[S1000, S3000, S4096]),
            [
                sop::alloc(0, 0),
                sop::alloc(0, 1),
                sop::release(0, 0),
                sop::alloc(0, 2),
                sop::release(0, 1),
                sop::alloc(0, 2),
                sop::alloc(0, 0),
            ],
        ),
    );
    for i in 0..6u8 {
        let c = cfg(i % 3, [P4, P16, 13][usize::from(i % 3)])
            .capacity(if i < 3 { 3 } else { 4 })
            .palette(&[S64, S500, S1000])
            .drop_seed(i.wrapping_mul(71))
            .fifo();
        add(
            &format!("noise-{i}"),
            seed(&c, [noise(u64::from(i) + 100, 300)]),
        );
        add(
            &format!("noise-panics-{i}"),
            seed(&c.clone().faults(), [noise(u64::from(i) + 150, 300)]),
        );
        if i % 3 == 0 {
            add(
                &format!("noise-thread-caches-{i}"),
                seed(&c.thread_caches(), [noise(u64::from(i) + 200, 300)]),
            );
        }
    }
    let ft = || cfg(0, P4).faults();
    let limit_1000 = || ft().limit(4).palette(&[S1000]);
    let panics: [(&str, Cfg, Vec<Vec<u8>>); 13] = [
        // A hit whose cache step evicted an expired block, whose
        // `deallocate` panics (reached only with
        // `SHARED_ALLOCATE_DEALLOCATE_PANICS` on).
        (
            "panic-allocate-hit-eviction-deallocate",
            ft().palette(&[S64, S100]),
            vec![
                sop::alloc(0, 0),
                sop::release(0, 0),
                sop::advance(2, 0),
                sop::alloc(0, 1),
                sop::release(0, 0),
                sop::advance(2, 0),
                sop::inject(DEALLOCATE, 1),
                sop::alloc(0, 1),
                sop::alloc(0, 1),
            ],
        ),
        // The same before a miss: its booking against the limit.
        (
            "panic-allocate-miss-eviction-deallocate",
            ft().limit(4).palette(&[S1000]),
            vec![
                sop::alloc(0, 0),
                sop::release(0, 0),
                sop::advance(4, 0),
                sop::inject(DEALLOCATE, 1),
                sop::alloc(0, 0),
                sop::alloc(0, 0),
                sop::alloc(0, 0),
                sop::alloc(0, 0),
                sop::alloc(0, 0),
            ],
        ),
        (
            "panic-allocate-limit",
            limit_1000(),
            [vec![sop::inject(ALLOCATE, 1)], vec![sop::alloc(0, 0); 5]].concat(),
        ),
        (
            "panic-pooled-clock",
            limit_1000(),
            [
                vec![sop::alloc(0, 0); 4],
                vec![sop::inject(CLOCK, 1), sop::release(0, 0), sop::alloc(0, 0)],
            ]
            .concat(),
        ),
        (
            "panic-pooled-must-evict",
            ft(),
            vec![
                sop::alloc(0, 0),
                sop::alloc(0, 1),
                sop::release(0, 0),
                sop::advance(4, 0),
                sop::inject(MUST_EVICT, 1),
                sop::release(0, 0),
                sop::collect(),
            ],
        ),
        (
            "panic-pooled-on-release",
            ft(),
            vec![
                sop::inject(ON_RELEASE, 1),
                sop::alloc(0, 0),
                sop::release(0, 0),
                sop::alloc(0, 0),
            ],
        ),
        (
            "panic-on-hit",
            cfg(1, P16).faults(),
            vec![
                sop::alloc(0, 0),
                sop::release(0, 0),
                sop::inject(ON_HIT, 1),
                sop::alloc(0, 0),
                sop::alloc(0, 0),
            ],
        ),
        (
            "panic-collect-deadline-on-free",
            ft(),
            vec![
                sop::alloc(0, 0),
                sop::release(0, 0),
                sop::inject(DEADLINE, 1),
                sop::collect(),
                sop::advance(4, 0),
                sop::inject(ON_FREE, 1),
                sop::collect(),
                sop::collect(),
            ],
        ),
        (
            "panic-trim-deallocate",
            ft(),
            vec![
                sop::alloc(0, 0),
                sop::alloc(0, 1),
                sop::alloc(0, 2),
                sop::release(0, 0),
                sop::release(0, 0),
                sop::release(0, 0),
                sop::inject(DEALLOCATE, 2),
                sop::trim(),
                sop::trim(),
            ],
        ),
        // Through `with`: the frees are not deferred.
        (
            "panic-with-release-deallocate",
            ft(),
            vec![
                sop::with_alloc(0),
                sop::with_alloc(1),
                sop::release(0, 1),
                sop::advance(4, 0),
                sop::inject(DEALLOCATE, 1),
                sop::release(0, 1),
                sop::with_alloc(1),
            ],
        ),
        (
            "panic-with-allocate-clock",
            ft(),
            vec![
                sop::inject(CLOCK, 1),
                sop::with_alloc(0),
                sop::with_alloc(0),
            ],
        ),
        (
            "panic-oom-retry-on-free",
            ft().capacity(2).limit(7).palette(&[S500, S100, S1000]),
            vec![
                sop::alloc(0, 0),
                sop::alloc(0, 1),
                sop::release(0, 0),
                sop::release(0, 0),
                sop::inject(ON_FREE, 1),
                sop::alloc(0, 2),
                sop::alloc(0, 2),
            ],
        ),
        // The retry's frees are offered after its cache step; one panics:
        // the booking is dropped.
        (
            "panic-oom-retry-deallocate",
            ft().capacity(2).limit(7).palette(&[S500, S100, S1000]),
            vec![
                sop::alloc(0, 0),
                sop::alloc(0, 1),
                sop::release(0, 0),
                sop::release(0, 0),
                sop::inject(DEALLOCATE, 1),
                sop::alloc(0, 2),
                sop::alloc(0, 2),
            ],
        ),
    ];
    for (name, c, ops) in panics {
        add(name, seed(&c, ops));
    }
    for (name, c, ops) in thread_cache_seeds() {
        add(name, seed(&c, ops));
    }
    seeds
}

/// A thread's block left in its magazine: a short-lived thread (`via_block`
/// in a thread-cached run) allocates two sizes, hands the first back,
/// releases the second, allocates it again (a hit in its magazine),
/// releases it and exits; then the main thread asks for that size.
fn thread_leaves_a_block() -> Vec<Vec<u8>> {
    vec![
        sop::via_block(2),
        sop::alloc(0, 0),
        sop::release(0, 0),
        sop::release(0, 0),
    ]
}

/// `shared_ops` seeds on thread-cached pools (`FixedTime`): short-lived
/// threads whose magazines outlive them, decay, trim, the limit, the
/// out-of-memory retry and `with` flushing the magazines, drop orders.
fn thread_cache_seeds() -> Vec<(&'static str, Cfg, Vec<Vec<u8>>)> {
    let threads = || {
        vec![
            sop::alloc(0, 0),
            sop::alloc(0, 1),
            sop::release(0, 0),
            sop::via_block(1),
            sop::via_block(2),
            sop::via_block(5),
            sop::release_alloc(0),
            sop::clone_handle(),
            sop::via_block(7),
            sop::alloc(1, 2),
            sop::advance(2, 0),
            sop::collect(),
            sop::via_block(6),
            sop::into_raw(0),
            sop::via_block(3),
            sop::advance(4, 1),
            sop::collect(),
            sop::alloc(0, 0),
            sop::with_alloc(1),
            sop::from_raw(0),
            sop::release(1, 1),
            sop::via_block(4),
            sop::drop_handle(0),
            sop::release_alloc(1),
            sop::zero(),
            sop::huge(1),
        ]
    };
    let mut ops_for_limit = threads();
    ops_for_limit.extend([
        sop::trim(),
        sop::fail(2),
        sop::via_block(5),
        sop::alloc(0, 1),
    ]);
    let mut many = Vec::new();
    for i in 0..12u8 {
        many.extend([
            sop::via_block(2 * i + 1),
            sop::alloc(0, i),
            sop::release(i, 0),
        ]);
    }
    many.extend([
        sop::advance(3, 0),
        sop::collect(),
        sop::advance(2, 0),
        sop::collect(),
    ]);
    vec![
        ("thread-caches-ttl-4", cfg(0, P4).thread_caches(), threads()),
        (
            "thread-caches-ttl-0",
            cfg(0, P0).thread_caches().drop_seed(3),
            threads(),
        ),
        (
            "thread-caches-ttl-64-trim",
            cfg(0, P64).thread_caches().trim().drop_seed(7),
            threads(),
        ),
        (
            "thread-caches-limit",
            cfg(0, P16).thread_caches().limit(4).class(1, 0),
            ops_for_limit,
        ),
        (
            "thread-caches-oom",
            cfg(0, P16)
                .thread_caches()
                .capacity(3)
                .palette(&[S1000, S500, S1025, S64])
                .drop_seed(11),
            many.clone(),
        ),
        (
            "thread-caches-many-threads",
            cfg(0, P4).thread_caches(),
            many.clone(),
        ),
        (
            "thread-caches-magazine-outlives-thread",
            cfg(0, P64).thread_caches(),
            thread_leaves_a_block(),
        ),
        // Magazines of 1, 2 and 8 blocks (`MAGAZINES`), which a run's few
        // blocks fill, and which their threads pass by.
        (
            "thread-caches-magazine-1",
            cfg(0, P4).magazine(1),
            threads(),
        ),
        (
            "thread-caches-magazine-2-many-threads",
            cfg(0, P4).magazine(2).drop_seed(5),
            many.clone(),
        ),
        (
            "thread-caches-magazine-8-oom",
            cfg(0, P16)
                .magazine(3)
                .capacity(3)
                .palette(&[S1000, S500, S1025, S64])
                .drop_seed(13),
            many,
        ),
        // A one-block magazine that its thread's allocations find full:
        // it grows, to four blocks.
        (
            "thread-caches-magazine-1-grows",
            cfg(0, P64).magazine(1),
            rounds_over_three_sizes(),
        ),
    ]
}

/// Ten rounds of round trips over three sizes on the main thread, then a
/// thread's request for the first size.
fn rounds_over_three_sizes() -> Vec<Vec<u8>> {
    let mut ops = Vec::new();
    for _ in 0..10 {
        for i in 0..3 {
            ops.push(sop::alloc(0, i));
            ops.push(sop::release(0, 0));
        }
    }
    ops.push(sop::via_block(0));
    ops
}

// --- replay -----------------------------------------------------------------

/// The committed corpus, checked to hold the seeds, replayed; in a packaged
/// crate, which has no `fuzz/` directory (a package of its own), the seeds
/// themselves.
fn corpus_or_seeds(
    target: &str,
    seeds: &[(String, Vec<u8>)],
    run: fn(&[u8]) -> Option<Summary>,
) -> Vec<Summary> {
    if Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").is_dir() {
        assert_corpus_holds(target, seeds, "tests/it/fuzz_corpus.rs");
        replay_corpus(target, run)
    } else {
        eprintln!("no fuzz/ directory (a packaged crate): replaying the {target} seeds only");
        seeds.iter().filter_map(|(_, bytes)| run(bytes)).collect()
    }
}

/// What a set of runs must reach: every policy evicting and serving hits,
/// a `FixedCapacity` window smaller than its table evicting, a zero-slot
/// table, both rungs of the retry ladder, and the limit freeing blocks.
fn assert_reaches_everything(summaries: &[Summary]) {
    let any = |what: &str, f: &dyn Fn(&Summary) -> bool| {
        assert!(summaries.iter().any(f), "no corpus input reaches {what}");
    };
    let fixed_time = |s: &Summary| matches!(s.kind, Kind::FixedTime { .. });
    let exponential = |s: &Summary| matches!(s.kind, Kind::Exponential { .. });
    let small = |s: &Summary| matches!(s.kind, Kind::FixedCapacity { slots } if (1..=FixedCapacity::WINDOW).contains(&slots));
    let big = |s: &Summary| matches!(s.kind, Kind::FixedCapacity { slots } if slots > FixedCapacity::WINDOW);
    any("FixedTime evictions", &|s| {
        fixed_time(s) && s.stats.evictions > 0 && s.stats.hits > 0
    });
    any("Exponential evictions", &|s| {
        exponential(s) && s.stats.evictions > 0 && s.stats.hits > 0
    });
    any("FixedCapacity (window = table) evictions", &|s| {
        small(s) && s.stats.evictions > 0 && s.stats.hits > 0
    });
    any("FixedCapacity (window < table) evictions", &|s| {
        big(s) && s.stats.evictions > 0
    });
    // The planned-deadline path: checks skipped before the policy's
    // deadline, each held against the model.
    any("FixedTime deadline skips", &|s| {
        fixed_time(s) && s.deadline_skips > 0
    });
    any("Exponential deadline skips", &|s| {
        exponential(s) && s.deadline_skips > 0 && s.stats.evictions > 0
    });
    any("FixedCapacity::new(0)", &|s| {
        s.kind == Kind::FixedCapacity { slots: 0 } && s.stats.evictions > 0
    });
    for (name, policy) in [
        ("FixedTime", &fixed_time as &dyn Fn(&Summary) -> bool),
        ("Exponential", &exponential),
        ("FixedCapacity", &small),
    ] {
        any(&format!("the retry ladder's second rung ({name})"), &|s| {
            policy(s) && s.retries > 0 && s.second_rung > 0 && s.stats.trimmed > 0
        });
    }
}

/// Every fault the harness can inject fires somewhere.
fn assert_injects_every_fault(summaries: &[Summary]) {
    for (i, fault) in FAULTS.iter().enumerate() {
        assert!(
            summaries.iter().any(|s| s.injected[i] > 0),
            "no corpus input injects a panic in {fault:?}"
        );
    }
}

#[test]
#[cfg_attr(miri, ignore)] // reads files: Miri isolates the file system
fn pool_ops_corpus_replays() {
    let seeds = pool_seeds();
    let summaries = corpus_or_seeds("pool_ops", &seeds, fuzzing::pool_ops);
    assert!(summaries.len() >= seeds.len());
    assert_reaches_everything(&summaries);
    assert_injects_every_fault(&summaries);
}

#[test]
#[cfg_attr(miri, ignore)] // reads files: Miri isolates the file system
fn shared_ops_corpus_replays() {
    let seeds = shared_seeds();
    let summaries = corpus_or_seeds("shared_ops", &seeds, fuzzing::shared_ops);
    assert!(summaries.len() >= seeds.len());
    assert!(summaries.iter().any(|s| s.second_rung > 0));
    assert!(
        summaries
            .iter()
            .any(|s| matches!(s.kind, Kind::Exponential { .. }) && s.deadline_skips > 0),
        "no shared_ops corpus input skips a check before Exponential's deadline"
    );
    assert!(
        summaries
            .iter()
            .any(|s| s.thread_cached && s.stats.hits > 0 && s.stats.evictions > 0),
        "no shared_ops corpus input drives a thread-cached pool that hits and decays"
    );
    assert!(
        summaries
            .iter()
            .any(|s| s.thread_cached && s.stats.backing_failures > 0 && s.stats.trimmed > 0),
        "no shared_ops corpus input runs a thread-cached pool out of memory"
    );
    assert_injects_every_fault(&summaries);
}

/// Seeds Miri runs (it is too slow for all of them): every policy, both
/// retry rungs, `SharedPool` handles, raw blocks and drop order, and
/// panics unwinding through a release, a miss and a drop.
const MIRI_SEEDS: [&str; 9] = [
    "seed-fixed-time-4-oom",
    "seed-exponential-16-decay",
    "seed-fixed-capacity-3-oom",
    "seed-fixed-capacity-16-handles",
    "seed-exponential-16-handles",
    "seed-panic-release-deallocate",
    "seed-panic-oom-retry-on-free",
    "seed-panic-drop-on-free",
    "seed-panic-pooled-clock",
];

/// The hand-written seeds, without the file system (so Miri runs them,
/// a few of them, over the real pool and its unsafe code).
#[test]
fn seeds_pass_the_harness() {
    let chosen = |name: &String| !cfg!(miri) || MIRI_SEEDS.contains(&name.as_str());
    let pool: Vec<_> = pool_seeds()
        .iter()
        .filter(|(name, _)| chosen(name))
        .map(|(_, bytes)| fuzzing::pool_ops(bytes).expect("a seed parses"))
        .collect();
    if !cfg!(miri) {
        assert_reaches_everything(&pool);
    }
    for (_, bytes) in shared_seeds().iter().filter(|(name, _)| chosen(name)) {
        fuzzing::shared_ops(bytes).expect("a seed parses");
    }
}

/// The thread-cached runs reach the magazines: a short-lived thread's
/// round trip hits its own magazine, and the block it left there is not
/// the main thread's to hit (the main thread has its magazine first, a
/// block of 100 bytes, so it adopts none), yet it still goes back at the
/// end. Without that first request the main thread adopts the exited
/// thread's magazine and hits its block.
#[test]
fn thread_cached_runs_use_magazines() {
    let ops = [
        vec![sop::alloc(0, 1), sop::release(0, 0)],
        thread_leaves_a_block(),
    ]
    .concat();
    let plain = fuzzing::shared_ops(&seed(&cfg(0, P64), ops.clone())).expect("parses");
    let cached = fuzzing::shared_ops(&seed(&cfg(0, P64).thread_caches(), ops)).expect("parses");
    assert!(!plain.thread_cached && cached.thread_cached);
    assert_eq!(
        (cached.stats.hits, cached.stats.misses),
        (1, 4),
        "the thread hits its magazine; the main thread misses the block left there"
    );
    assert_eq!(
        cached.stats.blocks_cached, 4,
        "a block in each magazine, two more"
    );
    let adopted = fuzzing::shared_ops(&seed(&cfg(0, P64).thread_caches(), thread_leaves_a_block()))
        .expect("parses");
    assert_eq!(
        (adopted.stats.hits, adopted.stats.misses),
        (2, 2),
        "the main thread adopts the exited thread's magazine"
    );
    // The main thread caches a block of 64 bytes in its magazine; a
    // thread allocates four blocks (missing four times), hands one to the
    // main thread, releases three to its magazine and takes one back (a
    // hit); the main thread then asks for their three sizes: the 64 hits
    // its own magazine, the others miss, unless the magazines hold one
    // block only (the fuzz harness's small magazines: `MAGAZINES[1]`),
    // which the thread passes by after two misses in a row: its blocks
    // went to the shared cache, and the main thread hits them.
    let ops = [
        sop::alloc(0, 0),
        sop::release(0, 0),
        sop::via_block(6),
        sop::alloc(0, 1),
        sop::alloc(0, 2),
        sop::alloc(0, 0),
    ];
    for (magazine, main_hits) in [(0, 1), (1, 3)] {
        assert_hits_and_misses(magazine, &ops, (1 + main_hits, 8 - main_hits));
    }
}

/// Checks the hits and misses of a thread-cached run of `ops` with the
/// magazines `MAGAZINES[magazine]`.
fn assert_hits_and_misses(magazine: u8, ops: &[Vec<u8>], want: (u64, u64)) {
    let c = cfg(0, P64).magazine(magazine);
    let s = fuzzing::shared_ops(&seed(&c, ops.to_vec()))
        .expect("parses")
        .stats;
    assert_eq!(
        (s.hits, s.misses),
        want,
        "magazine {}",
        fuzzing::MAGAZINES[usize::from(magazine)]
    );
}

/// The thread-cached runs reach magazines that grow: ten rounds of round
/// trips over three sizes on the main thread, whose one-block magazine
/// (`MAGAZINES[1]`) finds itself full at allocations, so it grows (to two
/// blocks, then four) instead of being passed by, and ends with the three
/// blocks: a thread's request for the first size then misses, as with
/// the 64-block magazine.
#[test]
fn thread_cached_runs_grow_magazines() {
    let ops = rounds_over_three_sizes();
    for magazine in [0, 1] {
        assert_hits_and_misses(magazine, &ops, (27, 4));
    }
}

/// Writes the seeds into `fuzz/corpus/` (when `DECAYING_POOL_WRITE_CORPUS`
/// is set).
#[test]
#[ignore = "writes the seed corpus; run by hand"]
fn write_seed_corpus() {
    write_corpus([("pool_ops", pool_seeds()), ("shared_ops", shared_seeds())]);
}
