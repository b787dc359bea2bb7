//! Tests: semantics.
//!
//! The pool's rules (docs/ARCHITECTURE.md, "Rules every pool keeps";
//! `docs/pool.md`), through the public API only: hit and miss, the statistics, reuse order, fixed-time decay, lazy
//! eviction on every call, `collect`, `trim`, drop, stacked pools and the
//! zero-size error. The backing calls are checked exactly through
//! [`CheckingAllocator::calls`].

use crate::support::Rng;
use crate::support::{Pool, a, d, get, ms, pool_with, put};
use core::convert::Infallible;
use core::time::Duration;
use std::collections::{HashMap, HashSet};

use decaying_pool::testing::CheckingAllocator;
use decaying_pool::{
    AnyPolicy, Clock, DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, PoolError,
    RawAllocator, Reuse, SizeClass, Stats,
};

const TTL: Duration = Duration::from_secs(1);
const NS: Duration = Duration::from_nanos(1);

/// A LIFO pool of exact sizes with a one-second time-to-live.
fn pool() -> (Pool, CheckingAllocator, ManualClock) {
    pool_with(Reuse::Lifo, SizeClass::Exact, TTL)
}

/// The identities between the counters (docs/ARCHITECTURE.md, `Stats`), and agreement with
/// what the backing allocator saw.
fn check_consistent(pool: &Pool, alloc: &CheckingAllocator) {
    let s = pool.stats();
    assert_eq!(
        s.misses, s.backing_allocs,
        "misses == backing_allocs: {s:?}"
    );
    assert_eq!(s.bytes_reserved, s.bytes_in_use + s.bytes_cached, "{s:?}");
    assert_eq!(
        s.backing_allocs - s.backing_deallocs,
        s.blocks_in_use + s.blocks_cached,
        "{s:?}"
    );
    assert_eq!(s.backing_deallocs, s.evictions + s.trimmed, "{s:?}");
    assert_eq!(s.backing_allocs, alloc.allocs(), "{s:?}");
    assert_eq!(s.backing_deallocs, alloc.deallocs(), "{s:?}");
    assert_eq!(
        alloc.live() as u64,
        s.blocks_in_use + s.blocks_cached,
        "{s:?}"
    );
    assert_eq!(alloc.live_bytes(), s.bytes_reserved, "{s:?}");
    assert!(s.peak_bytes_reserved >= s.bytes_reserved, "{s:?}");
    assert!(s.peak_bytes_in_use >= s.bytes_in_use, "{s:?}");
    pool.validate();
}

// ---------------------------------------------------------------- hit / miss

#[test]
fn miss_calls_backing_then_hit_returns_same_block_without_a_call() {
    let (mut pool, alloc, _clock) = pool();
    let b = get(&mut pool, 4096);
    assert_eq!(alloc.calls(), vec![a(1, 4096)]);
    put(&mut pool, b, 4096);
    assert_eq!(
        alloc.calls(),
        vec![a(1, 4096)],
        "release makes no backing call"
    );
    let again = get(&mut pool, 4096);
    assert_eq!(again, b);
    assert_eq!(
        alloc.calls(),
        vec![a(1, 4096)],
        "a hit makes no backing call"
    );
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.backing_allocs), (1, 1, 1));
    put(&mut pool, again, 4096);
    check_consistent(&pool, &alloc);
}

#[test]
fn fresh_pool_has_zero_stats_and_makes_no_call() {
    let (mut pool, alloc, clock) = pool();
    assert_eq!(pool.stats(), Stats::default());
    clock.advance(ms(5000));
    assert_eq!(pool.collect(), 0);
    assert_eq!(pool.trim(), 0);
    assert_eq!(pool.stats(), Stats::default());
    drop(pool);
    assert!(alloc.calls().is_empty());
}

#[test]
fn stats_are_exact_after_a_mixed_sequence() {
    let (mut pool, alloc, clock) = pool();

    let b1 = get(&mut pool, 100);
    let b2 = get(&mut pool, 200);
    assert_eq!((b1, b2), (1, 2));
    assert_eq!(
        pool.stats(),
        stats! {
            misses: 2,
            backing_allocs: 2,
            blocks_in_use: 2,
            bytes_in_use: 300,
            bytes_reserved: 300,
            peak_bytes_reserved: 300,
            peak_bytes_in_use: 300,
            bytes_from_backing: 300,
            bytes_requested: 300,
        }
    );

    clock.advance(ms(10));
    put(&mut pool, b1, 100);
    assert_eq!(
        pool.stats(),
        stats! {
            misses: 2,
            backing_allocs: 2,
            blocks_in_use: 1,
            blocks_cached: 1,
            bytes_in_use: 200,
            bytes_cached: 100,
            bytes_reserved: 300,
            peak_bytes_reserved: 300,
            peak_bytes_in_use: 300,
            bytes_from_backing: 300,
            bytes_requested: 300,
        }
    );

    clock.advance(ms(10));
    let b3 = get(&mut pool, 100); // hit
    assert_eq!(b3, b1);
    let b4 = get(&mut pool, 100); // miss: the only cached 100 is in use
    assert_eq!(b4, 3);
    let b5 = get(&mut pool, 50); // miss
    assert_eq!(b5, 4);
    assert_eq!(
        pool.stats(),
        stats! {
            hits: 1,
            misses: 4,
            backing_allocs: 4,
            blocks_in_use: 4,
            bytes_in_use: 450,
            bytes_reserved: 450,
            peak_bytes_reserved: 450,
            peak_bytes_in_use: 450,
            bytes_from_pool: 100,
            bytes_from_backing: 450,
            bytes_requested: 550,
        }
    );

    put(&mut pool, b2, 200);
    put(&mut pool, b3, 100);
    put(&mut pool, b4, 100);
    let b6 = get(&mut pool, 200); // hit
    assert_eq!(b6, b2);
    put(&mut pool, b6, 200);
    put(&mut pool, b5, 50);
    assert_eq!(
        pool.stats(),
        stats! {
            hits: 2,
            misses: 4,
            backing_allocs: 4,
            blocks_cached: 4,
            bytes_cached: 450,
            bytes_reserved: 450,
            peak_bytes_reserved: 450,
            peak_bytes_in_use: 450,
            bytes_from_pool: 300,
            bytes_from_backing: 450,
            bytes_requested: 750,
        }
    );
    check_consistent(&pool, &alloc);

    assert_eq!(pool.trim(), 450);
    assert_eq!(
        pool.stats(),
        stats! {
            hits: 2,
            misses: 4,
            trimmed: 4,
            backing_allocs: 4,
            backing_deallocs: 4,
            peak_bytes_reserved: 450,
            peak_bytes_in_use: 450,
            bytes_from_pool: 300,
            bytes_from_backing: 450,
            bytes_requested: 750,
        }
    );
    assert_eq!(
        alloc.calls(),
        vec![
            a(1, 100),
            a(2, 200),
            a(3, 100),
            a(4, 50),
            // trim frees oldest first, by last release: 1, 3, 2 (re-released
            // after its hit), then 4.
            d(1, 100),
            d(3, 100),
            d(2, 200),
            d(4, 50),
        ]
    );
    check_consistent(&pool, &alloc);
}

#[test]
fn peaks_track_the_highest_values_not_the_current_ones() {
    let (mut pool, alloc, _clock) = pool();
    let x = get(&mut pool, 1000);
    let y = get(&mut pool, 500);
    put(&mut pool, x, 1000);
    // 1500 reserved, 500 in use.
    let z = get(&mut pool, 700); // miss: reserved 2200, in use 1200
    let s = pool.stats();
    assert_eq!((s.peak_bytes_reserved, s.peak_bytes_in_use), (2200, 1500));
    put(&mut pool, y, 500);
    put(&mut pool, z, 700);
    assert_eq!(pool.trim(), 2200);
    let x2 = get(&mut pool, 10);
    let s = pool.stats();
    assert_eq!((s.bytes_reserved, s.bytes_in_use), (10, 10));
    assert_eq!((s.peak_bytes_reserved, s.peak_bytes_in_use), (2200, 1500));
    put(&mut pool, x2, 10);
    check_consistent(&pool, &alloc);
}

#[test]
fn hits_raise_the_peak_in_use() {
    let (mut pool, alloc, _clock) = pool();
    let x = get(&mut pool, 100);
    put(&mut pool, x, 100);
    let y = get(&mut pool, 200); // a miss: 300 reserved, 200 in use
    put(&mut pool, y, 200);
    assert_eq!(pool.stats().peak_bytes_in_use, 200);
    let x = get(&mut pool, 100); // hits only from here
    let y = get(&mut pool, 200);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (2, 2));
    assert_eq!((s.peak_bytes_in_use, s.peak_bytes_reserved), (300, 300));
    put(&mut pool, x, 100);
    put(&mut pool, y, 200);
    check_consistent(&pool, &alloc);
}

// ------------------------------------------------------------ FixedTime(ttl)

#[test]
fn fixed_time_idle_exactly_ttl_is_expired_ttl_minus_1ns_is_not() {
    let (mut pool, alloc, clock) = pool();
    clock.set(Duration::from_secs(5)); // a non-zero origin
    let b = get(&mut pool, 64);
    put(&mut pool, b, 64);
    clock.advance(TTL - NS);
    assert_eq!(pool.collect(), 0, "idle ttl - 1ns is kept");
    assert_eq!(pool.stats().blocks_cached, 1);
    clock.advance(NS);
    assert_eq!(pool.collect(), 1, "idle exactly ttl is freed");
    let s = pool.stats();
    assert_eq!((s.evictions, s.trimmed, s.blocks_cached), (1, 0, 0));
    assert_eq!(alloc.calls(), vec![a(1, 64), d(1, 64)]);
    check_consistent(&pool, &alloc);
}

#[test]
fn fixed_time_boundary_seen_by_allocate() {
    let (mut pool, alloc, clock) = pool();
    let b = get(&mut pool, 64);
    put(&mut pool, b, 64);
    clock.advance(TTL - NS);
    let hit = get(&mut pool, 64);
    assert_eq!(hit, b, "at ttl - 1ns the block is still served");
    put(&mut pool, hit, 64); // released again at ttl - 1ns
    clock.advance(TTL);
    // Idle exactly ttl: freed before the lookup, so this is a miss.
    let fresh = get(&mut pool, 64);
    assert_eq!(fresh, 2);
    assert_eq!(alloc.calls(), vec![a(1, 64), d(1, 64), a(2, 64)]);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.evictions), (1, 2, 1));
    put(&mut pool, fresh, 64);
    check_consistent(&pool, &alloc);
}

#[test]
fn zero_ttl_frees_at_the_next_call() {
    let (mut pool, alloc, _clock) = pool_with(Reuse::Lifo, SizeClass::Exact, Duration::ZERO);
    let b = get(&mut pool, 8);
    put(&mut pool, b, 8);
    assert_eq!(pool.stats().blocks_cached, 1);
    // Same instant: idle 0 >= ttl 0.
    let c = get(&mut pool, 8);
    assert_eq!(c, 2);
    assert_eq!(alloc.calls(), vec![a(1, 8), d(1, 8), a(2, 8)]);
    put(&mut pool, c, 8);
    check_consistent(&pool, &alloc);
}

#[test]
fn reuse_restarts_the_idle_time_and_stale_entries_free_nothing() {
    let (mut pool, alloc, clock) = pool();
    let b = get(&mut pool, 128);
    put(&mut pool, b, 128); // released at 0
    clock.set(ms(900));
    assert_eq!(get(&mut pool, 128), b);
    put(&mut pool, b, 128); // released again at 900 ms
    clock.set(ms(1000)); // the entry from t=0 is due, but stale
    assert_eq!(pool.collect(), 0);
    clock.set(ms(1899));
    assert_eq!(pool.collect(), 0);
    assert_eq!(alloc.calls(), vec![a(1, 128)]);
    clock.set(ms(1900));
    assert_eq!(pool.collect(), 1);
    assert_eq!(alloc.calls(), vec![a(1, 128), d(1, 128)]);
    check_consistent(&pool, &alloc);
}

#[test]
fn many_reuses_of_one_block_do_not_disturb_decay_of_another() {
    let (mut pool, alloc, clock) = pool();
    let old = get(&mut pool, 1);
    let hot = get(&mut pool, 2);
    put(&mut pool, old, 1); // at 0
    put(&mut pool, hot, 2);
    // Thousands of stale entries for `hot` pile up behind `old`'s entry
    // (hundreds under Miri, past the ring's first growths).
    let steps = if cfg!(miri) { 299 } else { 999u64 };
    for step in 1..=steps {
        clock.set(Duration::from_micros(step * 1000));
        let h = get(&mut pool, 2);
        assert_eq!(h, hot);
        put(&mut pool, h, 2);
        assert_eq!(pool.stats().blocks_cached, 2, "step {step}");
    }
    assert_eq!(alloc.calls(), vec![a(1, 1), a(2, 2)]);
    clock.set(TTL); // `old` idle exactly ttl, `hot` idle 1 ms
    let h = get(&mut pool, 2);
    assert_eq!(h, hot);
    assert_eq!(alloc.calls(), vec![a(1, 1), a(2, 2), d(1, 1)]);
    put(&mut pool, h, 2);
    clock.set(TTL + TTL);
    assert_eq!(pool.collect(), 1);
    assert_eq!(alloc.calls(), vec![a(1, 1), a(2, 2), d(1, 1), d(2, 2)]);
    let s = pool.stats();
    assert_eq!(
        (s.hits, s.misses, s.evictions, s.blocks_cached),
        (steps + 1, 2, 2, 0)
    );
    check_consistent(&pool, &alloc);
}

// ------------------------------------------------------------ lazy eviction

/// Caches blocks 1 (100 B), 2 (200 B), 3 (300 B), released at 0, 100 and 200 ms.
fn three_staggered(pool: &mut Pool, clock: &ManualClock) {
    let blocks: Vec<_> = [100, 200, 300].iter().map(|&s| (get(pool, s), s)).collect();
    for (i, &(b, s)) in blocks.iter().enumerate() {
        clock.set(ms(100 * i as u64));
        put(pool, b, s);
    }
}

#[test]
fn allocate_evicts_expired_blocks_first_oldest_first() {
    let (mut pool, alloc, clock) = pool();
    three_staggered(&mut pool, &clock);
    clock.set(ms(1150)); // 1 and 2 are due, 3 (idle 950 ms) is not
    let b = get(&mut pool, 400);
    assert_eq!(
        alloc.calls(),
        vec![
            a(1, 100),
            a(2, 200),
            a(3, 300),
            d(1, 100),
            d(2, 200),
            a(4, 400)
        ]
    );
    let s = pool.stats();
    assert_eq!(
        (s.evictions, s.trimmed, s.blocks_cached, s.bytes_cached),
        (2, 0, 1, 300)
    );
    put(&mut pool, b, 400);
    check_consistent(&pool, &alloc);
}

#[test]
fn a_hit_also_runs_the_policy_first() {
    let (mut pool, alloc, clock) = pool();
    three_staggered(&mut pool, &clock);
    clock.set(ms(1100)); // 1 and 2 are due
    let b = get(&mut pool, 300);
    assert_eq!(b, 3, "a hit");
    assert_eq!(
        alloc.calls(),
        vec![a(1, 100), a(2, 200), a(3, 300), d(1, 100), d(2, 200)]
    );
    assert_eq!(pool.stats().evictions, 2);
    put(&mut pool, b, 300);
    check_consistent(&pool, &alloc);
}

#[test]
fn release_evicts_expired_blocks_first_oldest_first() {
    let (mut pool, alloc, clock) = pool();
    let x = get(&mut pool, 50); // block 1
    three_staggered(&mut pool, &clock); // blocks 2, 3, 4 at 0, 100, 200 ms
    clock.set(ms(1199)); // 2 (idle 1199 ms) and 3 (1099) are due, 4 (999) is not
    put(&mut pool, x, 50);
    assert_eq!(
        alloc.calls(),
        vec![
            a(1, 50),
            a(2, 100),
            a(3, 200),
            a(4, 300),
            d(2, 100),
            d(3, 200)
        ]
    );
    let s = pool.stats();
    assert_eq!((s.evictions, s.blocks_cached, s.bytes_cached), (2, 2, 350));
    // The block just released is not due with them: released now.
    clock.set(ms(1200));
    assert_eq!(pool.collect(), 1); // 4
    clock.set(ms(2198));
    assert_eq!(pool.collect(), 0);
    clock.set(ms(2199));
    assert_eq!(pool.collect(), 1); // 1
    assert_eq!(alloc.calls()[6..], [d(4, 300), d(1, 50)]);
    check_consistent(&pool, &alloc);
}

#[test]
fn a_failed_zero_size_allocate_still_runs_the_policy() {
    let (mut pool, alloc, clock) = pool();
    let b = get(&mut pool, 10);
    put(&mut pool, b, 10);
    clock.advance(TTL);
    assert_eq!(pool.allocate(0), Err(PoolError::ZeroSize));
    assert_eq!(alloc.calls(), vec![a(1, 10), d(1, 10)]);
    assert_eq!(pool.stats().evictions, 1);
    check_consistent(&pool, &alloc);
}

#[test]
fn an_expired_block_is_never_handed_out() {
    for reuse in [Reuse::Lifo, Reuse::Fifo] {
        let (mut pool, alloc, clock) = pool_with(reuse, SizeClass::Exact, TTL);
        let b1 = get(&mut pool, 64);
        let b2 = get(&mut pool, 64);
        put(&mut pool, b1, 64); // at 0
        clock.set(ms(500));
        put(&mut pool, b2, 64); // at 500 ms
        clock.set(TTL); // b1 idle exactly ttl, b2 idle 500 ms
        // Fifo would pick b1, Lifo b2: either way b1 is gone first.
        assert_eq!(get(&mut pool, 64), b2, "{reuse:?}");
        assert_eq!(
            get(&mut pool, 64),
            3,
            "{reuse:?}: a miss, not the expired block"
        );
        assert_eq!(
            alloc.calls(),
            vec![a(1, 64), a(2, 64), d(1, 64), a(3, 64)],
            "{reuse:?}"
        );
        put(&mut pool, 2, 64);
        put(&mut pool, 3, 64);
        check_consistent(&pool, &alloc);
    }
}

// --------------------------------------------------------------- reuse order

/// Blocks 1, 2, 3 of 256 bytes, released in that order at 0, 1, 2 ms.
fn three_of_a_class(reuse: Reuse) -> (Pool, CheckingAllocator, ManualClock) {
    let (mut pool, alloc, clock) = pool_with(reuse, SizeClass::Exact, TTL);
    let blocks: Vec<_> = (0..3).map(|_| get(&mut pool, 256)).collect();
    assert_eq!(blocks, [1, 2, 3]);
    for (i, b) in blocks.into_iter().enumerate() {
        clock.set(ms(i as u64));
        put(&mut pool, b, 256);
    }
    (pool, alloc, clock)
}

#[test]
fn lifo_hands_out_the_most_recently_released_block() {
    let (mut pool, alloc, _clock) = three_of_a_class(Reuse::Lifo);
    assert_eq!(pool.reuse(), Reuse::Lifo);
    assert_eq!(get(&mut pool, 256), 3);
    assert_eq!(get(&mut pool, 256), 2);
    put(&mut pool, 3, 256);
    assert_eq!(get(&mut pool, 256), 3);
    assert_eq!(get(&mut pool, 256), 1);
    assert_eq!(alloc.allocs(), 3);
    for b in 1..=3 {
        put(&mut pool, b, 256);
    }
    check_consistent(&pool, &alloc);
}

#[test]
fn fifo_hands_out_the_oldest_block() {
    let (mut pool, alloc, _clock) = three_of_a_class(Reuse::Fifo);
    assert_eq!(pool.reuse(), Reuse::Fifo);
    assert_eq!(get(&mut pool, 256), 1);
    assert_eq!(get(&mut pool, 256), 2);
    put(&mut pool, 1, 256); // now the youngest
    assert_eq!(get(&mut pool, 256), 3);
    assert_eq!(get(&mut pool, 256), 1);
    assert_eq!(alloc.allocs(), 3);
    for b in 1..=3 {
        put(&mut pool, b, 256);
    }
    check_consistent(&pool, &alloc);
}

#[test]
fn default_reuse_is_lifo() {
    let alloc = CheckingAllocator::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .clock(ManualClock::new())
        .build();
    assert_eq!(pool.reuse(), Reuse::Lifo);
    let (x, y) = (pool.allocate(8).unwrap(), pool.allocate(8).unwrap());
    // SAFETY: both came from this pool with size 8.
    unsafe {
        pool.release(x, 8);
        pool.release(y, 8);
    }
    assert_eq!(pool.allocate(8).unwrap(), y);
    // SAFETY: as above.
    unsafe { pool.release(y, 8) };
}

/// Two blocks of a class; then `steps` rounds of: advance 400 ms, take one
/// block and give it back. Demand is one block, so one block is surplus.
fn steady_demand(reuse: Reuse, steps: u64) -> (Pool, CheckingAllocator) {
    let (mut pool, alloc, clock) = pool_with(reuse, SizeClass::Exact, TTL);
    let (x, y) = (get(&mut pool, 64), get(&mut pool, 64));
    put(&mut pool, x, 64);
    put(&mut pool, y, 64);
    for _ in 0..steps {
        clock.advance(ms(400));
        let b = get(&mut pool, 64);
        put(&mut pool, b, 64);
    }
    (pool, alloc)
}

#[test]
fn lifo_lets_the_surplus_decay_under_steady_demand() {
    let (pool, alloc) = steady_demand(Reuse::Lifo, 30);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (30, 2));
    // Block 1 sat idle from 0 and was freed at 1200 ms, by the third step.
    assert_eq!((s.evictions, s.blocks_cached, s.bytes_cached), (1, 1, 64));
    assert_eq!(alloc.calls(), vec![a(1, 64), a(2, 64), d(1, 64)]);
    check_consistent(&pool, &alloc);
}

#[test]
fn fifo_keeps_every_block_alive_under_steady_demand() {
    let (pool, alloc) = steady_demand(Reuse::Fifo, 30);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (30, 2));
    // Each block alternates, idle 800 ms < ttl each time: none is ever freed.
    assert_eq!((s.evictions, s.blocks_cached, s.bytes_cached), (0, 2, 128));
    assert_eq!(alloc.calls(), vec![a(1, 64), a(2, 64)]);
    check_consistent(&pool, &alloc);
}

// ----------------------------------------------------------- collect / trim

#[test]
fn collect_returns_the_number_of_blocks_evicted() {
    let (mut pool, alloc, clock) = pool();
    three_staggered(&mut pool, &clock); // released at 0, 100, 200 ms
    clock.set(ms(999));
    assert_eq!(pool.collect(), 0);
    clock.set(ms(1000));
    assert_eq!(pool.collect(), 1);
    assert_eq!(pool.collect(), 0, "nothing more is due at the same instant");
    clock.set(ms(5000));
    assert_eq!(pool.collect(), 2);
    assert_eq!(pool.collect(), 0);
    let s = pool.stats();
    assert_eq!((s.evictions, s.trimmed, s.backing_deallocs), (3, 0, 3));
    assert_eq!(
        alloc.calls(),
        vec![
            a(1, 100),
            a(2, 200),
            a(3, 300),
            d(1, 100),
            d(2, 200),
            d(3, 300)
        ]
    );
    check_consistent(&pool, &alloc);
}

#[test]
fn trim_returns_bytes_freed_counts_trimmed_and_spares_blocks_in_use() {
    let (mut pool, alloc, clock) = pool_with(Reuse::Lifo, SizeClass::PowerOfTwo, TTL);
    let x = get(&mut pool, 1000); // 1024
    let y = get(&mut pool, 3000); // 4096
    let z = get(&mut pool, 17); // 32, stays in use
    put(&mut pool, y, 3000);
    clock.advance(ms(1));
    put(&mut pool, x, 1000);
    assert_eq!(pool.trim(), 1024 + 4096, "class sizes, not request sizes");
    assert_eq!(pool.trim(), 0);
    let s = pool.stats();
    assert_eq!(
        (
            s.trimmed,
            s.evictions,
            s.blocks_cached,
            s.blocks_in_use,
            s.bytes_in_use
        ),
        (2, 0, 0, 1, 32)
    );
    assert_eq!(
        alloc.calls(),
        vec![a(1, 1024), a(2, 4096), a(3, 32), d(2, 4096), d(1, 1024)]
    );
    put(&mut pool, z, 17);
    assert_eq!(pool.trim(), 32);
    assert_eq!(pool.stats().trimmed, 3);
    check_consistent(&pool, &alloc);
    alloc.assert_all_freed();
}

#[test]
fn trim_frees_blocks_the_policy_would_also_free() {
    let (mut pool, alloc, clock) = pool();
    three_staggered(&mut pool, &clock);
    clock.set(ms(5000)); // all due
    assert_eq!(pool.trim(), 600);
    let s = pool.stats();
    assert_eq!(s.backing_deallocs, 3);
    assert_eq!(s.evictions + s.trimmed, 3);
    assert_eq!(pool.collect(), 0);
    check_consistent(&pool, &alloc);
    alloc.assert_all_freed();
}

// ---------------------------------------------------------------------- drop

#[test]
fn drop_frees_every_cached_block_exactly_once() {
    let (mut pool, alloc, clock) = pool();
    let (x, y, z) = (
        get(&mut pool, 100),
        get(&mut pool, 200),
        get(&mut pool, 300),
    );
    put(&mut pool, x, 100);
    put(&mut pool, y, 200);
    put(&mut pool, z, 300);
    // Hits leave stale deque entries behind; drop must not free twice.
    clock.advance(ms(1));
    let y2 = get(&mut pool, 200);
    put(&mut pool, y2, 200);
    clock.advance(ms(1));
    let x2 = get(&mut pool, 100);
    put(&mut pool, x2, 100);
    assert_eq!(alloc.deallocs(), 0);
    drop(pool);
    assert_eq!(
        alloc.calls(),
        vec![
            a(1, 100),
            a(2, 200),
            a(3, 300),
            d(3, 300),
            d(2, 200),
            d(1, 100)
        ]
    );
    assert_eq!((alloc.allocs(), alloc.deallocs()), (3, 3));
    alloc.assert_all_freed();
}

#[test]
fn drop_after_evictions_frees_only_what_is_left() {
    let (mut pool, alloc, clock) = pool();
    three_staggered(&mut pool, &clock);
    clock.set(ms(1100)); // 1 and 2 due
    assert_eq!(pool.collect(), 2);
    drop(pool);
    assert_eq!(
        alloc.calls(),
        vec![
            a(1, 100),
            a(2, 200),
            a(3, 300),
            d(1, 100),
            d(2, 200),
            d(3, 300)
        ]
    );
    alloc.assert_all_freed();
}

#[test]
fn drop_of_an_empty_pool_makes_no_call() {
    let (mut pool, alloc, _clock) = pool();
    let b = get(&mut pool, 1);
    put(&mut pool, b, 1);
    pool.trim();
    let before = alloc.calls();
    drop(pool);
    assert_eq!(alloc.calls(), before);
    alloc.assert_all_freed();
}

// -------------------------------------------------------------- composition

type Inner = DecayingPool<CheckingAllocator, FixedTime, ManualClock>;
type Outer = DecayingPool<Inner, FixedTime, ManualClock>;

fn stacked(inner_limit: Option<usize>) -> (Outer, CheckingAllocator, ManualClock) {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let mut inner = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::from_secs(10)))
        .clock(clock.clone());
    if let Some(limit) = inner_limit {
        inner = inner.limit(limit);
    }
    let outer = DecayingPool::builder(inner.build())
        .policy(FixedTime::new(TTL))
        .clock(clock.clone())
        .build();
    (outer, alloc, clock)
}

fn put_outer(pool: &mut Outer, block: u64, size: usize) {
    // SAFETY: callers pass a block this pool handed out for `size`, once.
    unsafe { pool.release(block, size) }
}

#[test]
fn pools_stack_decay_flows_into_the_inner_pool() {
    let (mut outer, alloc, clock) = stacked(None);
    let b = outer.allocate(1000).unwrap();
    assert_eq!(alloc.calls(), vec![a(1, 1000)]);
    put_outer(&mut outer, b, 1000);
    assert_eq!(
        outer.allocator().stats().blocks_in_use,
        1,
        "cached in the outer pool"
    );

    clock.advance(TTL);
    assert_eq!(outer.collect(), 1);
    // The outer pool's eviction is a release into the inner pool.
    let inner = outer.allocator().stats();
    assert_eq!(
        (
            inner.blocks_in_use,
            inner.blocks_cached,
            inner.backing_deallocs
        ),
        (0, 1, 0)
    );
    assert_eq!(outer.stats().evictions, 1);

    // An outer miss is an inner hit: no backing call.
    let b2 = outer.allocate(1000).unwrap();
    assert_eq!(b2, b);
    assert_eq!(alloc.calls(), vec![a(1, 1000)]);
    let (o, i) = (outer.stats(), outer.allocator().stats());
    assert_eq!((o.hits, o.misses, i.hits, i.misses), (0, 2, 1, 1));

    put_outer(&mut outer, b2, 1000);
    assert_eq!(outer.trim(), 1000);
    assert_eq!(outer.allocator().stats().blocks_cached, 1);
    assert!(
        alloc.calls().len() == 1,
        "trim of the outer pool caches in the inner"
    );

    // Dropping the outer pool releases into the inner one, which then frees.
    let b3 = outer.allocate(1000).unwrap();
    put_outer(&mut outer, b3, 1000);
    drop(outer);
    assert_eq!(alloc.calls(), vec![a(1, 1000), d(1, 1000)]);
    alloc.assert_all_freed();
}

#[test]
fn stacked_errors_are_nested_and_retry_releases_into_the_inner_pool() {
    let (mut outer, alloc, _clock) = stacked(Some(1000));
    let err: PoolError<PoolError<Infallible>> = outer.allocate(0).unwrap_err();
    assert_eq!(err, PoolError::ZeroSize);

    let x = outer.allocate(600).unwrap(); // block 1
    let y = outer.allocate(300).unwrap(); // block 2
    put_outer(&mut outer, y, 300); // cached in the outer pool; inner: 900 in use
    // The inner pool refuses (900 + 400 > 1000), the outer pool retries: it
    // releases `y` into the inner pool, whose limit then trims it.
    let z = outer.allocate(400).unwrap();
    assert_eq!(z, 3);
    assert_eq!(
        alloc.calls(),
        vec![a(1, 600), a(2, 300), d(2, 300), a(3, 400)]
    );
    let o = outer.stats();
    assert_eq!(
        (
            o.misses,
            o.backing_failures,
            o.trimmed,
            o.blocks_cached,
            o.bytes_in_use
        ),
        (3, 1, 1, 0, 1000)
    );
    let i = outer.allocator().stats();
    assert_eq!(
        (i.misses, i.trimmed, i.backing_failures, i.bytes_reserved),
        (3, 1, 0, 1000)
    );

    // Now the inner limit refuses for good: outer cache empty, one attempt.
    match outer.allocate(1) {
        Err(PoolError::Backing(PoolError::LimitExceeded {
            requested,
            limit,
            reserved,
        })) => assert_eq!((requested, limit, reserved), (1, 1000, 1000)),
        other => panic!("expected a nested LimitExceeded, got {other:?}"),
    }
    assert_eq!(outer.stats().backing_failures, 2);
    put_outer(&mut outer, x, 600);
    put_outer(&mut outer, z, 400);
    outer.validate();
    outer.allocator().validate();
    drop(outer);
    alloc.assert_all_freed();
}

#[test]
fn a_pool_is_a_raw_allocator() {
    fn through_trait<R: RawAllocator<Block = u64>>(r: &mut R) -> u64 {
        let b = r.allocate(77).unwrap();
        // SAFETY: `b` came from `r.allocate(77)`.
        unsafe { r.deallocate(b, 77) };
        r.allocate(77).unwrap()
    }
    let (mut pool, alloc, _clock) = pool();
    let b = through_trait(&mut pool);
    assert_eq!(b, 1, "deallocate is a release: the second allocate hits");
    assert_eq!((pool.stats().hits, pool.stats().misses), (1, 1));
    put(&mut pool, b, 77);
    drop(pool);
    alloc.assert_all_freed();
}

// -------------------------------------------------------------- zero size

#[test]
fn zero_size_is_an_error_that_counts_nothing() {
    let (mut pool, alloc, _clock) = pool();
    let b = get(&mut pool, 10);
    put(&mut pool, b, 10);
    let before = pool.stats();
    for _ in 0..3 {
        assert_eq!(pool.allocate(0), Err(PoolError::ZeroSize));
    }
    assert_eq!(pool.stats(), before);
    assert_eq!(alloc.calls(), vec![a(1, 10)]);
    assert_eq!(pool.class_size(0), None);
    // Same for every size class.
    for sc in [
        SizeClass::Exact,
        SizeClass::PowerOfTwo,
        SizeClass::Multiple(64),
        SizeClass::PowerOfTwoDivisions(4),
    ] {
        let (mut p, al, _c) = pool_with(Reuse::Lifo, sc, TTL);
        assert_eq!(p.allocate(0), Err(PoolError::ZeroSize), "{sc:?}");
        assert_eq!(p.stats(), Stats::default(), "{sc:?}");
        assert!(al.calls().is_empty());
    }
    check_consistent(&pool, &alloc);
}

/// A request for zero bytes goes down the inlined hit path as far as the
/// store's lookup, which finds no class 0 under any policy or reuse order,
/// whatever the store holds (LIFO `FixedCapacity` with its last hit's
/// empty slot still remembered, FIFO without): the error, with nothing
/// taken or counted.
#[test]
fn zero_size_finds_no_block_under_any_policy() {
    let minute = Duration::from_secs(60);
    for name in ["FixedTime", "Exponential", "FixedCapacity"] {
        let policy = || match name {
            "FixedTime" => AnyPolicy::timed(FixedTime::new(minute)),
            "Exponential" => AnyPolicy::timed(Exponential::new(minute)),
            _ => AnyPolicy::from(FixedCapacity::new(64)),
        };
        for reuse in [Reuse::Lifo, Reuse::Fifo] {
            let alloc = CheckingAllocator::new();
            let mut pool = DecayingPool::builder(alloc.clone())
                .policy(policy())
                .reuse(reuse)
                .clock(ManualClock::new())
                .build();
            let blocks: Vec<_> = [1, 1, 8, 4096]
                .iter()
                .map(|&s| (pool.allocate(s).unwrap(), s))
                .collect();
            for (b, s) in blocks {
                // SAFETY: from this pool with this size, released once.
                unsafe { pool.release(b, s) };
            }
            // A hit leaves its slot behind for the release after it.
            let hit = pool.allocate(8).unwrap();
            let before = pool.stats();
            assert_eq!(
                pool.allocate(0),
                Err(PoolError::ZeroSize),
                "{name} {reuse:?}"
            );
            assert_eq!(pool.stats(), before, "{name} {reuse:?}");
            // SAFETY: from this pool with this size, released once.
            unsafe { pool.release(hit, 8) };
            assert_eq!(
                pool.allocate(0),
                Err(PoolError::ZeroSize),
                "{name} {reuse:?}"
            );
            assert_eq!(pool.stats().blocks_cached, 4, "{name} {reuse:?}");
            assert_eq!(alloc.calls().len(), 4, "{name} {reuse:?}");
        }
    }
}

// ---------------------------------------------------- interleaved classes

#[test]
fn many_interleaved_classes_are_kept_apart() {
    let (mut pool, alloc, clock) = pool();
    let sizes = [100usize, 200, 300, 4096, 7];
    let mut out = Vec::new();
    for _round in 0..4 {
        for &s in &sizes {
            out.push((get(&mut pool, s), s));
        }
    }
    // Release in a scrambled order, a tick apart.
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by_key(|&i| (i * 7) % out.len());
    for &i in &order {
        clock.advance(ms(1));
        put(&mut pool, out[i].0, out[i].1);
    }
    let s = pool.stats();
    assert_eq!(s.blocks_cached, 20);
    assert_eq!(s.bytes_cached, 4 * sizes.iter().sum::<usize>());
    // Every class gets back exactly its own four blocks, with no backing call.
    for &size in &sizes {
        let mine: HashSet<u64> = out
            .iter()
            .filter(|&&(_, s)| s == size)
            .map(|&(b, _)| b)
            .collect();
        let got: HashSet<u64> = (0..4).map(|_| get(&mut pool, size)).collect();
        assert_eq!(got, mine, "class {size}");
        for &b in &got {
            assert_eq!(alloc.size_of(b), Some(size));
        }
    }
    assert_eq!(alloc.allocs(), 20);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), (20, 20, 0));
    for &(b, s) in &out {
        put(&mut pool, b, s);
    }
    check_consistent(&pool, &alloc);
    drop(pool);
    alloc.assert_all_freed();
}

// --------------------------------------------------------- long sequence

#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn long_random_sequence_keeps_stats_true_and_ends_with_nothing_live() {
    for reuse in [Reuse::Lifo, Reuse::Fifo] {
        let (mut pool, alloc, clock) = pool_with(reuse, SizeClass::PowerOfTwo, ms(50));
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ reuse as u64);
        let sizes = [1usize, 3, 64, 100, 1000, 1024, 5000, 70_000];
        // Blocks handed out: id -> requested size.
        let mut in_use: Vec<(u64, usize)> = Vec::new();
        // Cached blocks as the test sees them: id -> release time.
        let mut released: HashMap<u64, Duration> = HashMap::new();
        let (mut hits, mut misses, mut from_pool, mut from_backing) = (0u64, 0u64, 0usize, 0usize);
        for step in 0..3000 {
            // Whether this step called the pool (so it decayed it).
            let mut called = true;
            match rng.below(10) {
                0..=4 => {
                    let size = sizes[rng.below(sizes.len() as u64) as usize];
                    let class = pool.class_size(size).unwrap();
                    let before = pool.stats();
                    let b = get(&mut pool, size);
                    let after = pool.stats();
                    assert!(
                        !in_use.iter().any(|&(x, _)| x == b),
                        "step {step}: {b} handed out twice"
                    );
                    assert_eq!(alloc.size_of(b), Some(class), "step {step}");
                    if after.hits == before.hits + 1 {
                        assert_eq!(after.misses, before.misses);
                        let at = released.remove(&b).expect("a hit hands out a cached block");
                        assert!(
                            clock.now() - at < ms(50),
                            "step {step}: expired block {b} handed out"
                        );
                        hits += 1;
                        from_pool += class;
                    } else {
                        assert_eq!(after.misses, before.misses + 1, "step {step}");
                        assert!(!released.contains_key(&b));
                        misses += 1;
                        from_backing += class;
                    }
                    in_use.push((b, size));
                }
                5..=8 if !in_use.is_empty() => {
                    let i = rng.below(in_use.len() as u64) as usize;
                    let (b, size) = in_use.swap_remove(i);
                    put(&mut pool, b, size);
                    released.insert(b, clock.now());
                }
                5..=8 => called = false,
                _ => {
                    if rng.below(20) == 0 {
                        pool.collect();
                    } else {
                        clock.advance(Duration::from_micros(rng.below(20_000)));
                        called = false;
                    }
                }
            }
            // Forget cached blocks the pool has freed.
            released.retain(|&b, _| alloc.size_of(b).is_some());
            let s = pool.stats();
            assert_eq!((s.hits, s.misses), (hits, misses), "step {step}");
            assert_eq!(
                (s.bytes_from_pool, s.bytes_from_backing),
                (from_pool, from_backing)
            );
            assert_eq!(s.blocks_in_use, in_use.len() as u64);
            let in_use_bytes: usize = in_use
                .iter()
                .map(|&(_, sz)| pool.class_size(sz).unwrap())
                .sum();
            assert_eq!(s.bytes_in_use, in_use_bytes, "step {step}");
            assert_eq!(s.blocks_cached, released.len() as u64, "step {step}");
            // Right after a call, nothing cached is past its time-to-live.
            if called {
                for (&b, &at) in &released {
                    assert!(
                        clock.now() - at < ms(50),
                        "step {step}: {b} outlived its ttl"
                    );
                }
            }
            check_consistent(&pool, &alloc);
        }
        assert!(
            hits > 100 && misses > 10,
            "{reuse:?}: {hits} hits, {misses} misses"
        );
        assert!(
            pool.stats().evictions > 0,
            "{reuse:?}: the clock moved, blocks decayed"
        );
        for (b, size) in in_use.drain(..) {
            put(&mut pool, b, size);
        }
        let cached = pool.stats().bytes_cached;
        assert_eq!(pool.trim(), cached);
        let s = pool.stats();
        assert_eq!(
            (s.bytes_reserved, s.blocks_cached, s.blocks_in_use),
            (0, 0, 0)
        );
        check_consistent(&pool, &alloc);
        drop(pool);
        assert_eq!(alloc.live(), 0);
        alloc.assert_all_freed();
    }
}
