//! Tests: exponential.
//!
//! The `Exponential` policy through the public API only: a `ManualClock`
//! drives time, a `CheckingAllocator` records (and checks) every backing
//! call, and the expectations come from the formulas of the `Exponential`
//! documentation (summarised in docs/ARCHITECTURE.md):
//!
//! - an allowance `L` of idle bytes decays as `L(t0) * 2^(-(t - t0) / h)`;
//! - a release adds the block's size to `L`;
//! - a hit scales `L` by `bytes_cached_after / bytes_cached_before`;
//! - trim (and the limit, and the out-of-memory retry) clamp `L` to
//!   `bytes_cached`; the policy's own decay does not;
//! - a collection frees the oldest block while
//!   `bytes_cached - L >= size_of_oldest / 2`.
//!
//! Hence `round_half_down(N * 2^(-t / h))` of `N` equal blocks released
//! together remain at time `t`, however often the pool collects.

use crate::support::{Lcg, freed_ids};
use crate::support::{ms, put};
use core::time::Duration;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use decaying_pool::policy::{EvictionPolicy, FreeReason, Oldest};
use decaying_pool::testing::{Call, CheckingAllocator, FailingAllocator};
use decaying_pool::{DecayingPool, Exponential, ManualClock, PoolError, Reuse};

type ExpPool = DecayingPool<CheckingAllocator, Exponential, ManualClock>;

/// A pool with the given half-life, its allocator and its clock (at zero).
fn exp_pool(h: Duration) -> (ExpPool, CheckingAllocator, ManualClock) {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let pool = DecayingPool::builder(alloc.clone())
        .policy(Exponential::new(h))
        .clock(clock.clone())
        .reuse(Reuse::Lifo)
        .build();
    (pool, alloc, clock)
}

/// Allocates `n` blocks of `size` (ids come out in order) and releases them
/// in allocation order, all at the clock's current time.
fn release_together(pool: &mut ExpPool, n: usize, size: usize) -> Vec<u64> {
    let blocks: Vec<u64> = (0..n).map(|_| pool.allocate(size).unwrap()).collect();
    for &b in &blocks {
        put(pool, b, size);
    }
    blocks
}

/// `round_half_down(x)`: the nearest integer, halves rounded down.
fn round_half_down(x: f64) -> usize {
    (x - 0.5).ceil().max(0.0) as usize
}

/// Whether `x` lies (within floating-point noise) on a halfway point
/// `k + 0.5`, where the documented rounding is decided by float error.
fn near_halfway(x: f64) -> bool {
    ((x - x.floor()) - 0.5).abs() < 1e-9
}

/// `2^(-t / h)`.
fn decay(t: Duration, h: Duration) -> f64 {
    (-(t.as_secs_f64() / h.as_secs_f64())).exp2()
}

// ---------------------------------------------------------------------------
// The half-life table
// ---------------------------------------------------------------------------

/// The table printed in the `Exponential` documentation, half-life 1 s,
/// checked both with one collection at `t` and by collecting every 1 ms.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn documented_table_holds() {
    let h = Duration::from_secs(1);
    // (N, [remaining at 0.5 h, 1 h, 2 h, 3 h, 4 h])
    let table: [(usize, [usize; 5]); 5] = [
        (1, [1, 0, 0, 0, 0]),
        (2, [1, 1, 0, 0, 0]),
        (4, [3, 2, 1, 0, 0]),
        (8, [6, 4, 2, 1, 0]),
        (16, [11, 8, 4, 2, 1]),
    ];
    let times = [ms(500), ms(1000), ms(2000), ms(3000), ms(4000)];
    for (n, row) in table {
        // One collection per fresh pool.
        for (&t, &want) in times.iter().zip(row.iter()) {
            let (mut pool, _alloc, clock) = exp_pool(h);
            release_together(&mut pool, n, 4096);
            clock.set(t);
            pool.collect();
            assert_eq!(
                pool.stats().blocks_cached as usize,
                want,
                "N = {n}, t = {t:?}, one collection"
            );
        }
        // One pool collecting every millisecond.
        let (mut pool, _alloc, clock) = exp_pool(h);
        release_together(&mut pool, n, 4096);
        let mut row_iter = times.iter().zip(row.iter()).peekable();
        for step in 1..=4000u64 {
            clock.set(ms(step));
            pool.collect();
            if let Some(&(&t, &want)) = row_iter.peek() {
                if t == ms(step) {
                    assert_eq!(
                        pool.stats().blocks_cached as usize,
                        want,
                        "N = {n}, t = {t:?}, collecting every ms"
                    );
                    row_iter.next();
                }
            }
        }
        assert!(row_iter.next().is_none());
    }
}

/// For N in 1..=16 and every millisecond up to 7 half-lives (off the exact
/// halfway points), `round_half_down(N * 2^(-t/h))` blocks remain: on a
/// fresh pool collected once at `t`, and on one pool collected every 1 ms.
/// The two agree, and the freed blocks are the oldest, in release order.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn half_life_table_one_collection_and_stepping_agree() {
    let h = ms(100);
    let size = 1000;
    let horizon = 700u64; // 7 half-lives: 16 * 2^-7 < 0.5, so all are gone.
    let mut checked = 0usize;
    for n in 1..=16usize {
        let (mut stepped, alloc, clock) = exp_pool(h);
        let ids = release_together(&mut stepped, n, size);
        for t_ms in 0..=horizon {
            let t = ms(t_ms);
            clock.set(t);
            stepped.collect();
            let x = n as f64 * decay(t, h);
            if near_halfway(x) {
                continue;
            }
            let want = round_half_down(x);
            let got_stepped = stepped.stats().blocks_cached as usize;

            let (mut fresh, fresh_alloc, fresh_clock) = exp_pool(h);
            release_together(&mut fresh, n, size);
            fresh_clock.set(t);
            let evicted = fresh.collect();
            let got_fresh = fresh.stats().blocks_cached as usize;

            assert_eq!(got_fresh, want, "N = {n}, t = {t_ms} ms, one collection");
            assert_eq!(got_stepped, want, "N = {n}, t = {t_ms} ms, stepping");
            assert_eq!(evicted, n - want, "collect returns the blocks evicted");
            // Oldest first: the freed ids are a prefix of the release order.
            assert_eq!(freed_ids(&fresh_alloc), ids[..n - want].to_vec());
            assert_eq!(freed_ids(&alloc), ids[..n - want].to_vec());
            let s = stepped.stats();
            assert_eq!(s.evictions as usize, n - want);
            assert_eq!(s.backing_deallocs as usize, n - want);
            assert_eq!(s.bytes_cached, want * size);
            checked += 1;
        }
        assert_eq!(stepped.stats().blocks_cached, 0);
        alloc.assert_all_freed();
        stepped.validate();
    }
    // Only a handful of instants are exact halfway points.
    assert!(checked > 16 * 690, "{checked}");
}

/// The half-life itself does not matter, only `t / h`.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn half_life_table_scales_with_the_half_life() {
    for h in [
        Duration::from_micros(250),
        ms(7),
        ms(1300),
        Duration::from_secs(3600),
    ] {
        for n in [3usize, 10, 16] {
            // Fractions of a half-life chosen off every halfway point for these N.
            for frac in [0.1, 0.37, 0.8, 1.2, 1.9, 2.6, 3.3, 4.45] {
                let t = h.mul_f64(frac);
                let x = n as f64 * (-frac).exp2();
                assert!(!near_halfway(x));
                let (mut pool, alloc, clock) = exp_pool(h);
                release_together(&mut pool, n, 512);
                clock.set(t);
                pool.collect();
                assert_eq!(
                    pool.stats().blocks_cached as usize,
                    round_half_down(x),
                    "h = {h:?}, N = {n}, t = {frac} h"
                );
                drop(pool);
                alloc.assert_all_freed();
            }
        }
    }
}

// ---------------------------------------------------------------------------
// A lone block
// ---------------------------------------------------------------------------

#[test]
fn lone_block_lives_one_half_life() {
    for h in [
        Duration::from_micros(10),
        ms(1),
        ms(100),
        Duration::from_secs(1),
        Duration::from_secs(600),
    ] {
        let (mut pool, alloc, clock) = exp_pool(h);
        clock.set(Duration::from_secs(5)); // an arbitrary origin
        let b = pool.allocate(1 << 20).unwrap();
        put(&mut pool, b, 1 << 20);

        clock.set(Duration::from_secs(5) + h.mul_f64(0.99));
        assert_eq!(pool.collect(), 0, "h = {h:?}: alive at 0.99 h");
        assert_eq!(pool.stats().blocks_cached, 1);
        assert!(freed_ids(&alloc).is_empty());

        clock.set(Duration::from_secs(5) + h.mul_f64(1.01));
        assert_eq!(pool.collect(), 1, "h = {h:?}: gone at 1.01 h");
        let s = pool.stats();
        assert_eq!((s.blocks_cached, s.bytes_cached, s.evictions), (0, 0, 1));
        assert_eq!(freed_ids(&alloc), vec![b]);
        alloc.assert_all_freed();
    }
}

/// An expired block is never handed out: the allocate that comes after a
/// half-life first frees it, then misses.
#[test]
fn expired_lone_block_is_not_handed_out() {
    let (mut pool, alloc, clock) = exp_pool(ms(10));
    let b = pool.allocate(64).unwrap();
    put(&mut pool, b, 64);
    clock.advance(Duration::from_micros(10_100));
    let c = pool.allocate(64).unwrap();
    assert_ne!(b, c);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.evictions), (0, 2, 1));
    assert_eq!(freed_ids(&alloc), vec![b]);
    put(&mut pool, c, 64);
}

/// A zero half-life keeps no allowance: like `FixedTime(0)`, every cached
/// block goes at the next call, even at the same instant.
#[test]
fn zero_half_life_frees_at_the_next_collection() {
    let (mut pool, alloc, _clock) = exp_pool(Duration::ZERO);
    let ids = release_together(&mut pool, 3, 100);
    // Each release first collected the blocks released before it.
    assert_eq!(freed_ids(&alloc), ids[..2].to_vec());
    assert_eq!(pool.stats().blocks_cached, 1);
    assert_eq!(pool.collect(), 1);
    assert_eq!(freed_ids(&alloc), ids);
    assert_eq!(pool.stats().bytes_cached, 0);
}

// ---------------------------------------------------------------------------
// Mixed sizes
// ---------------------------------------------------------------------------

/// Blocks of different sizes go oldest first (release order, not id or size
/// order), each when `bytes_cached - L >= size_of_oldest / 2`.
///
/// Sizes released together at t = 0, oldest first: 400, 100, 300, 200
/// (1000 bytes, so `L(t) = 1000 * 2^(-t/h)`):
///
/// - 400 goes when `1000 - L >= 200`, i.e. `t >= log2(1.25) h  ~ 0.322 h`;
/// - 100 goes when ` 600 - L >=  50`, i.e. `t >= log2(1/0.55) h ~ 0.863 h`;
/// - 300 goes when ` 500 - L >= 150`, i.e. `t >= log2(1/0.35) h ~ 1.515 h`;
/// - 200 goes when ` 200 - L >= 100`, i.e. `t >= log2(10) h     ~ 3.322 h`.
#[test]
fn mixed_sizes_are_freed_oldest_first() {
    let h = ms(1000);
    let sizes_by_id = [(1u64, 300usize), (2, 100), (3, 400), (4, 200)];
    // Release order (oldest first): 3 (400), 2 (100), 1 (300), 4 (200).
    let release_order = [3u64, 2, 1, 4];
    let checkpoints: [(f64, &[u64]); 8] = [
        (0.30, &[]),
        (0.34, &[3]),
        (0.85, &[3]),
        (0.88, &[3, 2]),
        (1.50, &[3, 2]),
        (1.53, &[3, 2, 1]),
        (3.30, &[3, 2, 1]),
        (3.35, &[3, 2, 1, 4]),
    ];
    let setup = || {
        let (mut pool, alloc, clock) = exp_pool(h);
        for &(id, size) in &sizes_by_id {
            assert_eq!(pool.allocate(size).unwrap(), id);
        }
        for id in release_order {
            let size = sizes_by_id.iter().find(|p| p.0 == id).unwrap().1;
            put(&mut pool, id, size);
        }
        (pool, alloc, clock)
    };

    // One collection per checkpoint on a fresh pool, and one pool stepped
    // through all checkpoints every millisecond: the same blocks go.
    let (mut stepped, stepped_alloc, stepped_clock) = setup();
    let mut step = 0u64;
    for (frac, want) in checkpoints {
        let t = h.mul_f64(frac);
        let (mut pool, alloc, clock) = setup();
        clock.set(t);
        pool.collect();
        assert_eq!(freed_ids(&alloc), want, "one collection at {frac} h");
        let cached: usize = sizes_by_id
            .iter()
            .filter(|(id, _)| !want.contains(id))
            .map(|p| p.1)
            .sum();
        assert_eq!(pool.stats().bytes_cached, cached);

        while ms(step) <= t {
            stepped_clock.set(ms(step));
            stepped.collect();
            step += 1;
        }
        // Stepping frees in the same order, never later: once the 400-byte
        // block is gone, each collection clamps `L` to `bytes_cached +
        // size_of_oldest / 2`, so with mixed sizes frequent collection may
        // free the smaller blocks earlier than one late collection does.
        let stepped_freed = freed_ids(&stepped_alloc);
        assert!(
            stepped_freed.len() >= want.len() && stepped_freed[..want.len()] == *want,
            "stepping to {frac} h freed {stepped_freed:?}, one collection {want:?}"
        );
        assert_eq!(stepped_freed[..], [3, 2, 1, 4][..stepped_freed.len()]);
    }
    // The backing allocator saw each block back with its own size.
    let deallocs: Vec<Call> = stepped_alloc
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Deallocate { .. }))
        .collect();
    assert_eq!(
        deallocs,
        vec![
            Call::Deallocate {
                block: 3,
                size: 400
            },
            Call::Deallocate {
                block: 2,
                size: 100
            },
            Call::Deallocate {
                block: 1,
                size: 300
            },
            Call::Deallocate {
                block: 4,
                size: 200
            },
        ]
    );
    stepped_alloc.assert_all_freed();
}

/// A small block released after a large one is kept while the large one
/// decays: the large block goes first (oldest first) even though it is
/// larger, and the small one then lives on the allowance.
#[test]
fn large_oldest_block_goes_before_younger_small_ones() {
    let h = ms(100);
    let (mut pool, alloc, clock) = exp_pool(h);
    let big = pool.allocate(1000).unwrap();
    let small = pool.allocate(10).unwrap();
    put(&mut pool, big, 1000);
    put(&mut pool, small, 10);
    // L = 1010 * 2^(-t/h); big goes when 1010 - L >= 500: L <= 510,
    // t >= log2(1010/510) h ~ 0.986 h.
    clock.set(ms(97));
    pool.collect();
    assert!(freed_ids(&alloc).is_empty());
    clock.set(ms(100));
    pool.collect();
    assert_eq!(freed_ids(&alloc), vec![big]);
    assert_eq!(pool.stats().bytes_cached, 10);
}

// ---------------------------------------------------------------------------
// Hits
// ---------------------------------------------------------------------------

/// A hit scales `L` by `after / before`: the stock keeps its decayed
/// fraction. Eight blocks released at 0; at h/2 two hits take two back
/// (`8 * 2^-0.5 = 5.66`: 6 remain, then 5, then 4, with `L` scaled by 5/6
/// and 4/5). From then on `round_half_down(8 * 4/6 * 2^(-t/h))` remain.
/// Without the scaling, `round_half_down(8 * 2^(-t/h))` (capped at 4)
/// would remain: at `t = h` that is 4, not 3.
#[test]
fn hits_scale_the_allowance() {
    let h = ms(100);
    let size = 1000;
    let (mut pool, alloc, clock) = exp_pool(h);
    let ids = release_together(&mut pool, 8, size);

    clock.set(ms(50));
    let x = 8.0 * decay(ms(50), h);
    assert_eq!(round_half_down(x), 6);
    // The first allocate frees the two oldest, then hits (LIFO: the newest).
    let h1 = pool.allocate(size).unwrap();
    assert_eq!(freed_ids(&alloc), ids[..2].to_vec());
    assert_eq!(h1, ids[7]);
    let h2 = pool.allocate(size).unwrap();
    assert_eq!(h2, ids[6]);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), (2, 8, 4));

    // Survivors (ids[2..6]) follow the scaled formula.
    let stock = 8.0 * 4.0 / 6.0;
    let mut at_100 = None;
    for t_ms in 50..=150u64 {
        clock.set(ms(t_ms));
        pool.collect();
        let x = stock * decay(ms(t_ms), h);
        if near_halfway(x) {
            continue;
        }
        let want = round_half_down(x);
        assert_eq!(pool.stats().blocks_cached as usize, want, "t = {t_ms} ms");
        assert_eq!(freed_ids(&alloc), ids[..2 + (4 - want)].to_vec());
        if t_ms == 100 {
            at_100 = Some(want);
        }
    }
    assert_eq!(at_100, Some(3), "the hits decayed the stock faster");

    // Releasing the two blocks back at 150 ms adds their size to L:
    // L = stock * 2^-1.5 + 2 (in blocks); the oldest survivors go first.
    let l150 = stock * decay(ms(150), h);
    let cached150 = pool.stats().blocks_cached as usize;
    assert_eq!(cached150, round_half_down(l150));
    put(&mut pool, h2, size);
    put(&mut pool, h1, size);
    let release_order: Vec<u64> = ids[..6].iter().copied().chain([h2, h1]).collect();
    for t_ms in 150..=800u64 {
        clock.set(ms(t_ms));
        pool.collect();
        let x = (l150 + 2.0) * decay(ms(t_ms - 150), h);
        if near_halfway(x) {
            continue;
        }
        let want = round_half_down(x);
        assert_eq!(pool.stats().blocks_cached as usize, want, "t = {t_ms} ms");
        let freed = release_order.len() - want;
        assert_eq!(freed_ids(&alloc), release_order[..freed].to_vec());
    }
    alloc.assert_all_freed();
    pool.validate();
}

/// A hit that empties the cache leaves no allowance behind: a block
/// released afterwards is a lone block and lives one half-life.
#[test]
fn hit_emptying_the_cache_zeroes_the_allowance() {
    let h = ms(100);
    let (mut pool, alloc, clock) = exp_pool(h);
    let ids = release_together(&mut pool, 4, 100);
    clock.set(ms(10));
    let taken: Vec<u64> = (0..4).map(|_| pool.allocate(100).unwrap()).collect();
    assert_eq!(pool.stats().hits, 4);
    assert!(freed_ids(&alloc).is_empty());
    // Release one back: L = 0 * ... + 100.
    put(&mut pool, taken[0], 100);
    clock.set(ms(10 + 99));
    assert_eq!(pool.collect(), 0);
    clock.set(ms(10 + 101));
    assert_eq!(pool.collect(), 1);
    assert_eq!(freed_ids(&alloc), vec![taken[0]]);
    for &b in &taken[1..] {
        put(&mut pool, b, 100);
    }
    drop(pool);
    let mut all = freed_ids(&alloc);
    all.sort_unstable();
    assert_eq!(all, ids);
    alloc.assert_all_freed();
}

// ---------------------------------------------------------------------------
// Clamping by trim, the limit and the out-of-memory retry
// ---------------------------------------------------------------------------

/// `trim` clamps `L` to `bytes_cached` (zero): a block released afterwards
/// is a lone block, alive just before one half-life and gone just after.
/// Without the clamp the four trimmed blocks' allowance (`4 * 2^-0.2`)
/// would keep it for more than three half-lives.
#[test]
fn trim_clamps_the_allowance() {
    let h = ms(100);
    let size = 256;
    let (mut pool, alloc, clock) = exp_pool(h);
    let ids = release_together(&mut pool, 4, size);
    clock.set(ms(20));
    assert_eq!(pool.trim(), 4 * size);
    assert_eq!(freed_ids(&alloc), ids);
    assert_eq!(pool.stats().trimmed, 4);
    assert_eq!(pool.stats().evictions, 0);

    let b = pool.allocate(size).unwrap();
    put(&mut pool, b, size);
    for t_ms in 20..=400u64 {
        clock.set(ms(t_ms));
        pool.collect();
        // A lone block after the clamp: round_half_down(2^(-(t - 20)/h)).
        let x = decay(ms(t_ms - 20), h);
        if near_halfway(x) {
            continue;
        }
        assert_eq!(
            pool.stats().blocks_cached as usize,
            round_half_down(x),
            "t = {t_ms} ms"
        );
    }
    // Spot checks: kept at 0.99 h after its release, gone at 1.01 h.
    let (mut pool, alloc, clock) = exp_pool(h);
    release_together(&mut pool, 4, size);
    clock.set(ms(20));
    pool.trim();
    let b = pool.allocate(size).unwrap();
    put(&mut pool, b, size);
    clock.set(ms(20) + h.mul_f64(0.99));
    assert_eq!(pool.collect(), 0);
    assert_eq!(pool.stats().blocks_cached, 1);
    clock.set(ms(20) + h.mul_f64(1.01));
    assert_eq!(pool.collect(), 1);
    assert_eq!(freed_ids(&alloc).last(), Some(&b));
}

/// The limit frees blocks (oldest first) and clamps `L` to what is left:
/// four 100-byte blocks released at 0 (`L = 400`), then a 200-byte miss
/// under a 400-byte limit frees the two oldest, so `L = 200` and the two
/// survivors follow `round_half_down(2 * 2^(-t/h))` (at 1.3 h: 1; without
/// the clamp, 2).
#[test]
fn limit_clamps_the_allowance() {
    let h = ms(100);
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(Exponential::new(h))
        .clock(clock.clone())
        .limit(400)
        .build();
    let ids: Vec<u64> = (0..4).map(|_| pool.allocate(100).unwrap()).collect();
    for &b in &ids {
        put(&mut pool, b, 100);
    }
    let big = pool.allocate(200).unwrap();
    assert_eq!(freed_ids(&alloc), ids[..2].to_vec());
    let s = pool.stats();
    assert_eq!(
        (s.trimmed, s.evictions, s.bytes_cached, s.bytes_reserved),
        (2, 0, 200, 400)
    );

    let mut at_130 = None;
    for t_ms in 0..=400u64 {
        clock.set(ms(t_ms));
        pool.collect();
        let x = 2.0 * decay(ms(t_ms), h);
        if near_halfway(x) {
            continue;
        }
        let want = round_half_down(x);
        assert_eq!(pool.stats().blocks_cached as usize, want, "t = {t_ms} ms");
        assert_eq!(freed_ids(&alloc), ids[..4 - want].to_vec());
        if t_ms == 130 {
            at_130 = Some(want);
        }
    }
    assert_eq!(at_130, Some(1));
    put(&mut pool, big, 200);
    drop(pool);
    alloc.assert_all_freed();
}

/// The out-of-memory retry frees blocks (oldest first) and clamps `L`
/// likewise.
#[test]
fn oom_retry_clamps_the_allowance() {
    let h = ms(100);
    let alloc = FailingAllocator::with_capacity(500);
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(Exponential::new(h))
        .clock(clock.clone())
        .build();
    let ids: Vec<u64> = (0..4).map(|_| pool.allocate(100).unwrap()).collect();
    for &b in &ids {
        put(&mut pool, b, 100);
    }
    // 400 used of 500: a 200-byte request fails, the retry frees the two
    // oldest (at least the class size) and succeeds.
    let big = pool.allocate(200).unwrap();
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.blocks_cached), (1, 2, 2));
    assert_eq!(freed_ids(alloc.inner()), ids[..2].to_vec());
    clock.set(ms(130));
    pool.collect();
    assert_eq!(pool.stats().blocks_cached, 1, "L was clamped to 200 bytes");
    clock.set(ms(190));
    pool.collect();
    assert_eq!(pool.stats().blocks_cached, 1);
    clock.set(ms(210));
    pool.collect();
    assert_eq!(pool.stats().blocks_cached, 0);
    assert_eq!(freed_ids(alloc.inner()), ids);
    // And a request that can never fit fails, with nothing lost.
    alloc.set_capacity(Some(450));
    put(&mut pool, big, 200);
    // (Above the capacity the allocator reports: refused without a call.)
    assert!(matches!(
        pool.allocate(500),
        Err(PoolError::TooLarge { requested: 500 })
    ));
    drop(pool);
    alloc.inner().assert_all_freed();
}

/// Suspected bug: the allowance left over by a block the policy's own decay
/// freed is not clamped, so it carries over to unrelated blocks released
/// afterwards. A 1 GiB block decays (at one half-life `L` is still 0.5
/// GiB); a 1 MiB block released just after lives on that leftover for
/// about ten half-lives instead of one. The `Exponential` docs: "a lone
/// block therefore lives one half-life", and every collection first clamps
/// `L` to `bytes_cached + size_of_oldest / 2` (an emptied cache resets it).
#[test]
fn allowance_of_a_decayed_block_does_not_outlive_the_cache() {
    let h = ms(100);
    let (mut pool, alloc, clock) = exp_pool(h);
    let big = pool.allocate(1 << 30).unwrap();
    put(&mut pool, big, 1 << 30);
    clock.set(ms(101));
    assert_eq!(pool.collect(), 1);
    assert_eq!(pool.stats().bytes_cached, 0);
    let small = pool.allocate(1 << 20).unwrap();
    put(&mut pool, small, 1 << 20);
    clock.set(ms(101 + 99));
    assert_eq!(pool.collect(), 0, "alive just before one half-life");
    clock.set(ms(101 + 101));
    assert_eq!(pool.collect(), 1, "a lone block lives one half-life");
    assert_eq!(freed_ids(&alloc), vec![big, small]);
}

// ---------------------------------------------------------------------------
// A reference model of the documented rules, on random workloads
// ---------------------------------------------------------------------------

/// The rules of the `Exponential` docs, with a record of how close a
/// decision came to its threshold (so that runs where float rounding could
/// decide are recognised).
struct Model {
    h: f64,
    l: f64,
    at: f64,
    /// (id, size), oldest first.
    cached: VecDeque<(u64, usize)>,
    bytes: usize,
    /// The smallest |margin| of any eviction decision, in bytes.
    closest: f64,
}

impl Model {
    fn new(h: Duration) -> Self {
        Model {
            h: h.as_secs_f64(),
            l: 0.0,
            at: 0.0,
            cached: VecDeque::new(),
            bytes: 0,
            closest: f64::INFINITY,
        }
    }

    fn allowance(&self, now: f64) -> f64 {
        if now <= self.at {
            self.l
        } else {
            self.l * (-(now - self.at) / self.h).exp2()
        }
    }

    fn rebase(&mut self, now: f64) {
        self.l = self.allowance(now);
        self.at = self.at.max(now);
    }

    /// Frees the oldest while `bytes - L >= oldest / 2`; returns freed ids.
    fn collect(&mut self, now: f64) -> Vec<u64> {
        let mut freed = Vec::new();
        while let Some(&(id, size)) = self.cached.front() {
            // Every decision first clamps L to bytes + oldest / 2.
            let bound = self.bytes as f64 + size as f64 / 2.0;
            if self.allowance(now) > bound {
                self.l = bound;
                self.at = self.at.max(now);
            }
            let margin = self.bytes as f64 - self.allowance(now) - size as f64 / 2.0;
            self.closest = self.closest.min(margin.abs());
            if margin >= 0.0 {
                self.cached.pop_front();
                self.bytes -= size;
                freed.push(id);
                if self.bytes == 0 {
                    // An emptied cache resets the allowance.
                    self.rebase(now);
                    self.l = 0.0;
                }
            } else {
                break;
            }
        }
        freed
    }

    fn release(&mut self, now: f64, id: u64, size: usize) {
        self.rebase(now);
        self.l += size as f64;
        self.cached.push_back((id, size));
        self.bytes += size;
    }

    /// A LIFO hit on `size`, if cached.
    fn hit(&mut self, now: f64, size: usize) -> Option<u64> {
        let pos = self.cached.iter().rposition(|&(_, s)| s == size)?;
        let (id, _) = self.cached.remove(pos).unwrap();
        let before = self.bytes;
        self.bytes -= size;
        self.rebase(now);
        self.l *= self.bytes as f64 / before as f64;
        Some(id)
    }

    /// Frees everything; each block freed clamps `L` (an empty cache frees
    /// nothing, so clamps nothing).
    fn trim(&mut self, now: f64) -> Vec<u64> {
        let freed: Vec<u64> = self.cached.drain(..).map(|p| p.0).collect();
        if !freed.is_empty() {
            self.rebase(now);
            self.l = self.l.min(0.0);
        }
        self.bytes = 0;
        freed
    }
}

/// Random allocate / release / collect / trim on a ManualClock, against the
/// reference model: the same hits, the same blocks freed in the same order.
/// A run in which some decision came within float noise of its threshold
/// stops being compared at that point.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn random_workloads_follow_the_reference_model() {
    let sizes = [100usize, 250, 1000, 4096];
    let mut fully_compared = 0;
    for seed in 0..60u64 {
        let mut rng = Lcg(seed * 7919 + 1);
        let h = ms(1 + rng.below(200));
        let (mut pool, alloc, clock) = exp_pool(h);
        let mut model = Model::new(h);
        let mut held: Vec<(u64, usize)> = Vec::new();
        let mut now = Duration::ZERO;
        let mut model_freed: Vec<u64> = Vec::new();
        let mut diverged = false;
        for _ in 0..400 {
            now += Duration::from_micros(rng.below(30_000));
            clock.set(now);
            let t = now.as_secs_f64();
            match rng.below(10) {
                0..=3 => {
                    let size = sizes[rng.below(sizes.len() as u64) as usize];
                    model_freed.extend(model.collect(t));
                    let want = model.hit(t, size);
                    let got = pool.allocate(size).unwrap();
                    if let Some(id) = want {
                        if model.closest > 1e-6 {
                            assert_eq!(got, id, "seed {seed}: a hit on the newest block");
                        }
                    }
                    held.push((got, size));
                }
                4..=7 if !held.is_empty() => {
                    let (id, size) = held.swap_remove(rng.below(held.len() as u64) as usize);
                    model_freed.extend(model.collect(t));
                    model.release(t, id, size);
                    put(&mut pool, id, size);
                }
                8 => {
                    model_freed.extend(model.collect(t));
                    pool.collect();
                }
                _ => {
                    if rng.below(4) == 0 {
                        model_freed.extend(model.trim(t));
                        pool.trim();
                    }
                }
            }
            if model.closest <= 1e-6 {
                diverged = true;
                break;
            }
            assert_eq!(freed_ids(&alloc), model_freed, "seed {seed}: blocks freed");
            assert_eq!(pool.stats().bytes_cached, model.bytes, "seed {seed}");
            pool.validate();
        }
        if !diverged {
            fully_compared += 1;
        }
        for (id, size) in held.drain(..) {
            put(&mut pool, id, size);
        }
        drop(pool);
        alloc.assert_all_freed();
    }
    assert!(
        fully_compared >= 50,
        "only {fully_compared} of 60 runs compared fully"
    );
}

// ---------------------------------------------------------------------------
// A policy defined outside the crate
// ---------------------------------------------------------------------------

/// What a user policy was told.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Told {
    Release {
        now: Duration,
        size: usize,
        bytes_cached: usize,
    },
    Hit {
        now: Duration,
        size: usize,
        before: usize,
        after: usize,
    },
    Free {
        now: Duration,
        size: usize,
        after: usize,
        reason: FreeReason,
    },
    MustEvict {
        now: Duration,
        oldest: Oldest,
        bytes_cached: usize,
        answer: bool,
    },
}

/// The frees a user policy was told of, in order.
fn frees(log: &RefCell<Vec<Told>>) -> Vec<Told> {
    log.borrow()
        .iter()
        .copied()
        .filter(|t| matches!(t, Told::Free { .. }))
        .collect()
}

/// Keeps at most `max` idle bytes, and records every call it receives.
struct MaxIdle {
    max: usize,
    log: Rc<RefCell<Vec<Told>>>,
}

impl EvictionPolicy for MaxIdle {
    fn on_release(&mut self, now: Duration, size: usize, bytes_cached: usize) {
        self.log.borrow_mut().push(Told::Release {
            now,
            size,
            bytes_cached,
        });
    }

    fn on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) {
        self.log.borrow_mut().push(Told::Hit {
            now,
            size,
            before,
            after,
        });
    }

    fn on_free(&mut self, now: Duration, size: usize, after: usize, reason: FreeReason) {
        self.log.borrow_mut().push(Told::Free {
            now,
            size,
            after,
            reason,
        });
    }

    fn must_evict(&mut self, now: Duration, oldest: Oldest, bytes_cached: usize) -> bool {
        let answer = bytes_cached > self.max;
        self.log.borrow_mut().push(Told::MustEvict {
            now,
            oldest,
            bytes_cached,
            answer,
        });
        answer
    }
}

#[test]
fn user_policy_plugs_in_and_is_told_everything() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(MaxIdle {
            max: 250,
            log: log.clone(),
        })
        .clock(clock.clone())
        .build();

    // Misses on an empty cache: the policy hears nothing.
    let a = pool.allocate(100).unwrap();
    let b = pool.allocate(100).unwrap();
    let c = pool.allocate(100).unwrap();
    let d = pool.allocate(50).unwrap();
    assert!(log.borrow().is_empty());

    clock.set(ms(1));
    put(&mut pool, a, 100);
    clock.set(ms(2));
    put(&mut pool, b, 100);
    clock.set(ms(3));
    put(&mut pool, c, 100);
    // 300 > 250 idle bytes, but nothing runs the policy until the next call.
    assert_eq!(pool.stats().blocks_cached, 3);
    clock.set(ms(4));
    let hit = pool.allocate(100).unwrap(); // frees a, then hits c (LIFO)
    assert_eq!(hit, c);
    clock.set(ms(5));
    put(&mut pool, d, 50);
    clock.set(ms(6));
    assert_eq!(pool.collect(), 0);
    clock.set(ms(7));
    assert_eq!(pool.trim(), 150);
    clock.set(ms(8));
    put(&mut pool, hit, 100);
    let before_drop = log.borrow().len();
    drop(pool);

    let oldest = |released: u64, size: usize| Oldest {
        released_at: ms(released),
        size,
    };
    use FreeReason::{Expired, Trimmed};
    use Told::*;
    let want = vec![
        Release {
            now: ms(1),
            size: 100,
            bytes_cached: 100,
        },
        MustEvict {
            now: ms(2),
            oldest: oldest(1, 100),
            bytes_cached: 100,
            answer: false,
        },
        Release {
            now: ms(2),
            size: 100,
            bytes_cached: 200,
        },
        MustEvict {
            now: ms(3),
            oldest: oldest(1, 100),
            bytes_cached: 200,
            answer: false,
        },
        Release {
            now: ms(3),
            size: 100,
            bytes_cached: 300,
        },
        MustEvict {
            now: ms(4),
            oldest: oldest(1, 100),
            bytes_cached: 300,
            answer: true,
        },
        Free {
            now: ms(4),
            size: 100,
            after: 200,
            reason: Expired,
        },
        MustEvict {
            now: ms(4),
            oldest: oldest(2, 100),
            bytes_cached: 200,
            answer: false,
        },
        Hit {
            now: ms(4),
            size: 100,
            before: 200,
            after: 100,
        },
        MustEvict {
            now: ms(5),
            oldest: oldest(2, 100),
            bytes_cached: 100,
            answer: false,
        },
        Release {
            now: ms(5),
            size: 50,
            bytes_cached: 150,
        },
        MustEvict {
            now: ms(6),
            oldest: oldest(2, 100),
            bytes_cached: 150,
            answer: false,
        },
        Free {
            now: ms(7),
            size: 100,
            after: 50,
            reason: Trimmed,
        },
        Free {
            now: ms(7),
            size: 50,
            after: 0,
            reason: Trimmed,
        },
        Release {
            now: ms(8),
            size: 100,
            bytes_cached: 100,
        },
        // Drop frees the cached block.
        Free {
            now: ms(8),
            size: 100,
            after: 0,
            reason: Trimmed,
        },
    ];
    assert_eq!(*log.borrow(), want);
    assert_eq!(before_drop, want.len() - 1);
    assert_eq!(freed_ids(&alloc), vec![a, b, d, c]);
    alloc.assert_all_freed();
}

/// A user policy also hears of blocks the limit and the out-of-memory retry
/// free (as `Trimmed`).
#[test]
fn user_policy_hears_of_limit_and_retry_frees() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let alloc = FailingAllocator::with_capacity(10_000);
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(MaxIdle {
            max: 1000,
            log: log.clone(),
        })
        .clock(clock.clone())
        .limit(500)
        .build();
    let blocks: Vec<u64> = (0..4).map(|_| pool.allocate(100).unwrap()).collect();
    for &b in &blocks {
        put(&mut pool, b, 100);
    }
    log.borrow_mut().clear();
    // 400 cached + 200 > 500: the limit frees the oldest block.
    clock.set(ms(1));
    let big = pool.allocate(200).unwrap();
    assert_eq!(
        frees(&log),
        vec![Told::Free {
            now: ms(1),
            size: 100,
            after: 300,
            reason: FreeReason::Trimmed
        }]
    );
    // 200 in use + 300 cached + 50 > 500: the limit frees the oldest; then
    // an injected failure: the retry frees the next oldest and succeeds.
    log.borrow_mut().clear();
    alloc.fail_next(1);
    clock.set(ms(2));
    let other = pool.allocate(50).unwrap();
    assert_eq!(
        frees(&log),
        vec![
            Told::Free {
                now: ms(2),
                size: 100,
                after: 200,
                reason: FreeReason::Trimmed
            },
            Told::Free {
                now: ms(2),
                size: 100,
                after: 100,
                reason: FreeReason::Trimmed
            }
        ]
    );
    let s = pool.stats();
    assert_eq!((s.trimmed, s.evictions, s.backing_failures), (3, 0, 1));
    assert_eq!(freed_ids(alloc.inner()), blocks[..3].to_vec());
    put(&mut pool, big, 200);
    put(&mut pool, other, 50);
    drop(pool);
    alloc.inner().assert_all_freed();
}

// ---------------------------------------------------------------------------
// The provisional deadline: the pool skips `must_evict` until it, and the
// policy reports it stale when a release or a hit brings it forward.
// ---------------------------------------------------------------------------

/// `Exponential` as a policy written before provisional deadlines: it
/// forwards only the hooks, `must_evict` and `deadline` (which is `None`),
/// so the pool asks `must_evict` at every collection. Counts those calls.
struct Legacy {
    inner: Exponential,
    asked: Rc<RefCell<u64>>,
}

impl EvictionPolicy for Legacy {
    fn on_release(&mut self, now: Duration, size: usize, bytes_cached: usize) {
        self.inner.on_release(now, size, bytes_cached)
    }
    fn on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) {
        self.inner.on_hit(now, size, before, after)
    }
    fn on_free(&mut self, now: Duration, size: usize, after: usize, reason: FreeReason) {
        self.inner.on_free(now, size, after, reason)
    }
    fn must_evict(&mut self, now: Duration, oldest: Oldest, bytes_cached: usize) -> bool {
        *self.asked.borrow_mut() += 1;
        self.inner.must_evict(now, oldest, bytes_cached)
    }
    fn deadline(&self, oldest: Oldest) -> Option<Duration> {
        self.inner.deadline(oldest)
    }
}

/// `Exponential` forwarded whole, counting `must_evict` calls.
struct Counted {
    inner: Exponential,
    asked: Rc<RefCell<u64>>,
}

impl EvictionPolicy for Counted {
    fn on_release(&mut self, now: Duration, size: usize, bytes_cached: usize) {
        self.inner.on_release(now, size, bytes_cached)
    }
    fn on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) {
        self.inner.on_hit(now, size, before, after)
    }
    fn on_free(&mut self, now: Duration, size: usize, after: usize, reason: FreeReason) {
        self.inner.on_free(now, size, after, reason)
    }
    fn must_evict(&mut self, now: Duration, oldest: Oldest, bytes_cached: usize) -> bool {
        *self.asked.borrow_mut() += 1;
        self.inner.must_evict(now, oldest, bytes_cached)
    }
    fn deadline(&self, oldest: Oldest) -> Option<Duration> {
        self.inner.deadline(oldest)
    }
    fn provisional_deadline(&self, oldest: Oldest) -> Option<Duration> {
        self.inner.provisional_deadline(oldest)
    }
    fn deadline_stale(&self) -> bool {
        self.inner.deadline_stale()
    }
}

/// Drives two pools with the same operations and checks that they make
/// the same backing calls in the same order: `Exponential` with its
/// provisional deadline, and the same policy asked at every collection.
/// Times are whole milliseconds and half-lives a few of them, so many
/// decisions fall on exact halfway points (the documented table's ties),
/// where only bit-identical allowances agree. Returns the `must_evict`
/// calls of each.
fn differential(seed: u64, reuse: Reuse) -> (u64, u64) {
    let mut rng = Lcg(seed * 104_729 + 17);
    let h = ms(1 + rng.below(40));
    let sizes: Vec<usize> = match seed % 3 {
        0 => vec![64],
        1 => vec![64, 128, 256],
        _ => vec![1, 64, 1000, 1 << 20],
    };
    let clock = ManualClock::new();
    let (fast_asked, slow_asked) = (Rc::new(RefCell::new(0)), Rc::new(RefCell::new(0)));
    let fast_alloc = CheckingAllocator::new();
    let slow_alloc = CheckingAllocator::new();
    let mut fast = DecayingPool::builder(fast_alloc.clone())
        .policy(Counted {
            inner: Exponential::new(h),
            asked: fast_asked.clone(),
        })
        .clock(clock.clone())
        .reuse(reuse)
        .build();
    let mut slow = DecayingPool::builder(slow_alloc.clone())
        .policy(Legacy {
            inner: Exponential::new(h),
            asked: slow_asked.clone(),
        })
        .clock(clock.clone())
        .reuse(reuse)
        .build();
    let mut now = ms(0);
    let mut held: Vec<(u64, u64, usize)> = Vec::new();
    for step in 0..600 {
        match rng.below(20) {
            0..=5 => now += ms(rng.below(3)),
            6 => now += ms(rng.below(4 * h.as_millis() as u64 + 1)),
            // The clock set back a little.
            7 if rng.below(4) == 0 => now = now.saturating_sub(ms(rng.below(3))),
            _ => {}
        }
        clock.set(now);
        match rng.below(10) {
            0..=3 => {
                let size = sizes[rng.below(sizes.len() as u64) as usize];
                let (a, b) = (fast.allocate(size).unwrap(), slow.allocate(size).unwrap());
                held.push((a, b, size));
            }
            4..=7 if !held.is_empty() => {
                // Mostly the newest (round trips), sometimes any.
                let i = if rng.below(3) == 0 {
                    rng.below(held.len() as u64) as usize
                } else {
                    held.len() - 1
                };
                let (a, b, size) = held.swap_remove(i);
                put(&mut fast, a, size);
                put(&mut slow, b, size);
            }
            8 => assert_eq!(fast.collect(), slow.collect(), "seed {seed} step {step}"),
            _ if rng.below(20) == 0 => assert_eq!(fast.trim(), slow.trim()),
            _ => {}
        }
        assert_eq!(
            fast_alloc.calls(),
            slow_alloc.calls(),
            "seed {seed} step {step}: the backing calls differ"
        );
        assert_eq!(fast.stats(), slow.stats(), "seed {seed} step {step}");
        fast.validate();
    }
    for (a, b, size) in held {
        put(&mut fast, a, size);
        put(&mut slow, b, size);
    }
    let asked = (*fast_asked.borrow(), *slow_asked.borrow());
    drop((fast, slow));
    fast_alloc.assert_all_freed();
    asked
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn the_provisional_deadline_changes_no_decision() {
    let (mut fast, mut slow) = (0, 0);
    for seed in 0..40 {
        for reuse in [Reuse::Lifo, Reuse::Fifo] {
            let (f, s) = differential(seed, reuse);
            fast += f;
            slow += s;
        }
    }
    // The deadline is used (this workload mostly defeats it: one size in a
    // third of the runs, so every hit may take the oldest block; see the
    // next test for round trips).
    assert!(
        fast < slow,
        "must_evict calls: {fast} with deadlines, {slow} without"
    );
}

/// Round trips on a cache of many classes at a frozen clock ask the policy
/// only when a hit takes the oldest block's class; a release of a block
/// far larger than the cache brings the deadline forward, which the policy
/// reports, and the pool then evicts on time.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn round_trips_skip_the_policy_and_a_large_release_brings_the_deadline_forward() {
    let asked = Rc::new(RefCell::new(0));
    let clock = ManualClock::new();
    let alloc = CheckingAllocator::new();
    // 64 classes of 64 to 4096 bytes, 133,120 in all, decay by about 92
    // bytes a second: the 64-byte oldest block is due in about 0.35 s.
    let h = Duration::from_secs(1000);
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(Counted {
            inner: Exponential::new(h),
            asked: asked.clone(),
        })
        .clock(clock.clone())
        .build();
    let sizes: Vec<usize> = (1..=64).map(|i| i * 64).collect();
    let blocks: Vec<u64> = sizes.iter().map(|&s| pool.allocate(s).unwrap()).collect();
    for (&b, &s) in blocks.iter().zip(&sizes) {
        put(&mut pool, b, s);
    }
    clock.set(ms(10));
    *asked.borrow_mut() = 0;
    for i in 0..6400 {
        // Never the oldest block's class (64 bytes, released first).
        let s = sizes[1 + i % 63];
        let b = pool.allocate(s).unwrap();
        put(&mut pool, b, s);
    }
    assert!(
        *asked.borrow() <= 2,
        "{} must_evict calls in 12800 operations",
        asked.borrow()
    );
    // One block of 1 GiB: the allowance now decays by 744,000 bytes a
    // second (2^30 * ln 2 / h), so the 32 bytes of headroom of the 64-byte
    // oldest block last about 43 microseconds.
    let big = pool.allocate(1 << 30).unwrap();
    put(&mut pool, big, 1 << 30);
    let freed_before = freed_ids(&alloc).len();
    clock.set(ms(20));
    pool.collect();
    assert!(
        freed_ids(&alloc).len() > freed_before,
        "the 64-byte oldest block is due 10 ms after a 1 GiB release"
    );
    assert_eq!(freed_ids(&alloc)[freed_before], blocks[0]);
}

/// A terabyte cached beside a 64-byte oldest block: the allowance is due
/// to fall below the threshold after about 4e-11 half-lives, and the
/// deadline still holds that close (round trips skip the policy).
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn a_terabyte_cache_still_gets_a_deadline_for_its_small_oldest_block() {
    let asked = Rc::new(RefCell::new(0));
    let clock = ManualClock::new();
    let alloc = CheckingAllocator::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(Counted {
            inner: Exponential::new(Duration::from_secs(3600)),
            asked: asked.clone(),
        })
        .clock(clock.clone())
        .build();
    let small = pool.allocate(64).unwrap();
    let huge = pool.allocate(1 << 40).unwrap();
    put(&mut pool, small, 64);
    put(&mut pool, huge, 1 << 40);
    *asked.borrow_mut() = 0;
    for _ in 0..1000 {
        let b = pool.allocate(1 << 40).unwrap();
        put(&mut pool, b, 1 << 40);
    }
    assert!(*asked.borrow() <= 2, "{} must_evict calls", asked.borrow());
    assert_eq!(pool.stats().blocks_cached, 2);
    // 64 * 2^-1 bytes of 2^40 decay in about 0.15 microseconds.
    clock.set(Duration::from_micros(1));
    assert_eq!(pool.collect(), 1);
    assert_eq!(freed_ids(&alloc), vec![small]);
}
