//! Tests: limit_retry.
//!
//! The byte limit and the out-of-memory retry ladder (docs/ARCHITECTURE.md,
//! "Rules every pool keeps"; `docs/pool.md`), through the public
//! API: when a request is refused, which cached blocks are freed
//! and in what order, how many backing attempts are made, and that the
//! statistics stay true and no block is lost on any path.

use crate::support::{a, d, get, ms, put};
use crate::test_rng::rng;
use core::time::Duration;

use decaying_pool::testing::{Call, CheckingAllocator, FailingAllocator, TestError};
use decaying_pool::{
    DecayingPool, FixedTime, ManualClock, PoolError, RawAllocator, Reuse, SizeClass, Stats,
};

// ------------------------------------------------------------------ helpers

type LPool = DecayingPool<CheckingAllocator, FixedTime, ManualClock>;
type FPool = DecayingPool<FailingAllocator, FixedTime, ManualClock>;

const TTL: Duration = Duration::from_secs(60);

fn limited(limit: usize, size_class: SizeClass) -> (LPool, CheckingAllocator, ManualClock) {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(TTL))
        .clock(clock.clone())
        .size_class(size_class)
        .limit(limit)
        .build();
    assert_eq!(pool.limit(), Some(limit));
    (pool, alloc, clock)
}

/// A pool over a [`FailingAllocator`] with `capacity` (or none), and a
/// handle on the checking allocator inside it.
fn failing(capacity: Option<usize>) -> (FPool, FailingAllocator, CheckingAllocator, ManualClock) {
    let fail = FailingAllocator::new(CheckingAllocator::new());
    fail.set_capacity(capacity);
    let inner = fail.inner().clone();
    let clock = ManualClock::new();
    let pool = DecayingPool::builder(fail.clone())
        .policy(FixedTime::new(TTL))
        .clock(clock.clone())
        .build();
    (pool, fail, inner, clock)
}

/// Allocates blocks of `sizes` and releases them in order, 1 ms apart, so
/// the first is the oldest. Returns their ids.
fn cache<A: RawAllocator<Block = u64>>(
    pool: &mut DecayingPool<A, FixedTime, ManualClock>,
    clock: &ManualClock,
    sizes: &[usize],
) -> Vec<u64> {
    let blocks: Vec<u64> = sizes.iter().map(|&s| get(pool, s)).collect();
    for (&b, &s) in blocks.iter().zip(sizes) {
        clock.advance(ms(1));
        put(pool, b, s);
    }
    blocks
}

fn check<A: RawAllocator>(
    pool: &DecayingPool<A, FixedTime, ManualClock>,
    alloc: &CheckingAllocator,
) {
    let s = pool.stats();
    assert_eq!(s.misses, s.backing_allocs, "{s:?}");
    assert_eq!(s.backing_allocs, alloc.allocs(), "{s:?}");
    assert_eq!(s.backing_deallocs, alloc.deallocs(), "{s:?}");
    assert_eq!(s.backing_deallocs, s.evictions + s.trimmed, "{s:?}");
    assert_eq!(alloc.live_bytes(), s.bytes_reserved, "{s:?}");
    assert_eq!(
        alloc.live() as u64,
        s.blocks_in_use + s.blocks_cached,
        "{s:?}"
    );
    if let Some(limit) = pool.limit() {
        assert!(s.bytes_reserved <= limit, "{s:?}");
        assert!(s.peak_bytes_reserved <= limit, "{s:?}");
    }
    pool.validate();
}

// -------------------------------------------------------------------- limit

#[test]
fn limit_exceeded_when_in_use_plus_class_is_over_the_limit() {
    let (mut pool, alloc, clock) = limited(1000, SizeClass::Exact);
    let in_use = get(&mut pool, 600);
    cache(&mut pool, &clock, &[300]);
    let before = pool.stats();
    let calls = alloc.calls();
    // 600 + 401 > 1000: could never fit, even with an empty cache.
    assert_eq!(
        pool.allocate(401),
        Err(PoolError::LimitExceeded {
            requested: 401,
            limit: 1000,
            reserved: 900,
        })
    );
    assert_eq!(
        pool.stats(),
        before,
        "the cache is left alone, nothing counted"
    );
    assert_eq!(alloc.calls(), calls, "no backing call");
    // A request that fits once the cache is freed is served.
    let b = get(&mut pool, 400);
    assert_eq!(alloc.calls()[2..], [d(2, 300), a(3, 400)]);
    put(&mut pool, b, 400);
    put(&mut pool, in_use, 600);
    check(&pool, &alloc);
}

#[test]
fn limit_exceeded_fields_and_message() {
    let (mut pool, _alloc, _clock) = limited(1000, SizeClass::Exact);
    let err = pool.allocate(1001).unwrap_err();
    assert_eq!(
        err,
        PoolError::LimitExceeded {
            requested: 1001,
            limit: 1000,
            reserved: 0,
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("1001") && msg.contains("1000"), "{msg}");
    assert_eq!(pool.stats(), Stats::default());
}

#[test]
fn limit_frees_cached_blocks_oldest_first_until_the_request_fits() {
    let (mut pool, alloc, clock) = limited(1000, SizeClass::Exact);
    let in_use = get(&mut pool, 300); // block 1
    cache(&mut pool, &clock, &[200, 300, 100]); // blocks 2, 3, 4; 2 oldest
    assert_eq!(pool.stats().bytes_reserved, 900);
    // 300 + 400 <= 1000 fits in principle; 900 + 400 > 1000: free 2 (1100),
    // then 3 (800 <= 1000), and keep 4.
    let b = get(&mut pool, 400);
    assert_eq!(b, 5);
    assert_eq!(
        alloc.calls()[4..],
        [d(2, 200), d(3, 300), a(5, 400)],
        "frees come before the backing call"
    );
    let s = pool.stats();
    assert_eq!(
        s,
        stats! {
            misses: 5,
            backing_allocs: 5,
            backing_deallocs: 2,
            trimmed: 2,
            blocks_in_use: 2,
            blocks_cached: 1,
            bytes_in_use: 700,
            bytes_cached: 100,
            bytes_reserved: 800,
            peak_bytes_reserved: 900,
            peak_bytes_in_use: 900,
            bytes_from_backing: 1300,
            bytes_requested: 1300,
        }
    );
    put(&mut pool, b, 400);
    put(&mut pool, in_use, 300);
    check(&pool, &alloc);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn limit_is_inclusive_reserved_may_equal_it() {
    let (mut pool, alloc, clock) = limited(1000, SizeClass::Exact);
    let x = get(&mut pool, 600);
    cache(&mut pool, &clock, &[100, 300]);
    // 1000 reserved already. 600 + 400 == 1000: fits once everything cached goes.
    let y = get(&mut pool, 400);
    let s = pool.stats();
    assert_eq!(
        (s.bytes_reserved, s.bytes_in_use, s.trimmed),
        (1000, 1000, 2)
    );
    assert_eq!(alloc.calls()[3..], [d(2, 100), d(3, 300), a(4, 400)]);
    // Exactly at the limit, not a byte more.
    assert!(matches!(
        pool.allocate(1),
        Err(PoolError::LimitExceeded { .. })
    ));
    put(&mut pool, y, 400);
    // 600 in use + 400 cached: a request of 400 hits, 401 does not fit.
    assert_eq!(
        pool.allocate(401),
        Err(PoolError::LimitExceeded {
            requested: 401,
            limit: 1000,
            reserved: 1000,
        })
    );
    assert_eq!(get(&mut pool, 400), y);
    put(&mut pool, y, 400);
    put(&mut pool, x, 600);
    check(&pool, &alloc);
}

#[test]
fn limit_frees_only_as_much_as_needed_with_no_cache_pressure() {
    let (mut pool, alloc, clock) = limited(1000, SizeClass::Exact);
    cache(&mut pool, &clock, &[100, 200]);
    // 300 + 700 == 1000: nothing needs to go.
    let b = get(&mut pool, 700);
    assert_eq!(pool.stats().trimmed, 0);
    assert_eq!(alloc.deallocs(), 0);
    put(&mut pool, b, 700);
    // 1000 cached; 150 needs 150 freed: the oldest (100) is not enough, the
    // next (200) is, and 700 stays.
    let c = get(&mut pool, 150);
    assert_eq!(alloc.calls()[3..], [d(1, 100), d(2, 200), a(4, 150)]);
    let s = pool.stats();
    assert_eq!((s.trimmed, s.bytes_cached, s.bytes_reserved), (2, 700, 850));
    put(&mut pool, c, 150);
    check(&pool, &alloc);
}

#[test]
fn a_hit_is_served_at_the_limit() {
    let (mut pool, alloc, clock) = limited(500, SizeClass::Exact);
    cache(&mut pool, &clock, &[200, 300]);
    assert_eq!(pool.stats().bytes_reserved, 500);
    let b = get(&mut pool, 300);
    assert_eq!(b, 2);
    let c = get(&mut pool, 200);
    assert_eq!(c, 1);
    assert_eq!(alloc.calls().len(), 2, "no frees, no new allocation");
    assert_eq!(pool.stats().hits, 2);
    put(&mut pool, b, 300);
    put(&mut pool, c, 200);
    check(&pool, &alloc);
}

#[test]
fn limit_applies_to_class_sizes() {
    let (mut pool, alloc, _clock) = limited(1000, SizeClass::PowerOfTwo);
    // 1000 rounds to 1024 > 1000.
    assert_eq!(
        pool.allocate(1000),
        Err(PoolError::LimitExceeded {
            requested: 1000,
            limit: 1000,
            reserved: 0,
        })
    );
    let b = get(&mut pool, 500); // 512
    assert_eq!(
        pool.allocate(300), // 512: 512 + 512 > 1000
        Err(PoolError::LimitExceeded {
            requested: 300,
            limit: 1000,
            reserved: 512,
        })
    );
    let c = get(&mut pool, 250); // 256
    assert_eq!(pool.stats().bytes_reserved, 768);
    put(&mut pool, b, 500);
    put(&mut pool, c, 250);
    assert!(
        alloc
            .calls()
            .iter()
            .all(|c| matches!(c, Call::Allocate { .. }))
    );
    check(&pool, &alloc);
}

#[test]
fn limit_zero_refuses_every_request_without_a_call() {
    let (mut pool, alloc, _clock) = limited(0, SizeClass::Exact);
    for size in [1, 2, 4096] {
        assert_eq!(
            pool.allocate(size),
            Err(PoolError::LimitExceeded {
                requested: size,
                limit: 0,
                reserved: 0,
            })
        );
    }
    assert_eq!(pool.allocate(0), Err(PoolError::ZeroSize));
    assert_eq!(pool.stats(), Stats::default());
    assert!(alloc.calls().is_empty());
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn limit_is_never_exceeded_over_a_long_sequence() {
    let limit = 10_000;
    let (mut pool, alloc, clock) = limited(limit, SizeClass::Multiple(100));
    let mut rand = rng(0x1234_5678_9ABC_DEF1u64);
    let mut held: Vec<(u64, usize)> = Vec::new();
    let mut refused = 0;
    for step in 0..3000 {
        match rand(3) {
            0 | 1 => {
                let size = 1 + rand(3000) as usize;
                let class = pool.class_size(size).unwrap();
                let s = pool.stats();
                match pool.allocate(size) {
                    Ok(b) => {
                        assert!(s.bytes_in_use + class <= limit, "step {step}");
                        held.push((b, size));
                    }
                    Err(PoolError::LimitExceeded {
                        requested,
                        limit: l,
                        reserved,
                    }) => {
                        assert_eq!((requested, l, reserved), (size, limit, s.bytes_reserved));
                        assert!(
                            s.bytes_in_use + class > limit,
                            "step {step}: refused but fits"
                        );
                        assert_eq!(pool.stats(), s, "step {step}: a refusal changes nothing");
                        refused += 1;
                    }
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            _ if !held.is_empty() => {
                let (b, size) = held.swap_remove(rand(held.len() as u64) as usize);
                put(&mut pool, b, size);
            }
            _ => clock.advance(ms(rand(10_000))),
        }
        check(&pool, &alloc);
    }
    assert!(refused > 10, "the limit was reached: {refused} refusals");
    assert!(pool.stats().trimmed > 0, "the limit freed cached blocks");
    for (b, size) in held {
        put(&mut pool, b, size);
    }
    pool.trim();
    drop(pool);
    alloc.assert_all_freed();
}

// ------------------------------------------------------- out-of-memory retry

#[test]
fn backing_failure_with_an_empty_cache_makes_exactly_one_attempt() {
    let (mut pool, fail, inner, _clock) = failing(Some(100));
    // Above the capacity the allocator reports: refused without a call.
    assert_eq!(
        pool.allocate(200),
        Err(PoolError::TooLarge { requested: 200 })
    );
    assert_eq!(fail.failures(), 0);
    assert_eq!(pool.stats(), Stats::default(), "nothing counted");
    // An allocator that tells nothing is asked, once.
    fail.set_reporting(false);
    assert_eq!(
        pool.allocate(200),
        Err(PoolError::Backing(TestError::OutOfMemory {
            requested: 200,
            used: 0,
            capacity: 100,
        }))
    );
    assert_eq!(fail.failures(), 1);
    assert_eq!(
        pool.stats(),
        stats! {
            backing_failures: 1,
        },
        "neither a hit nor a miss"
    );
    assert!(inner.calls().is_empty());

    // Injected failures: same, one attempt each.
    fail.fail_next(5);
    assert_eq!(
        pool.allocate(10),
        Err(PoolError::Backing(TestError::Injected))
    );
    assert_eq!(fail.failures(), 2);
    assert_eq!(pool.stats().backing_failures, 2);
    // Four injected failures are left; they are consumed one per allocate.
    for _ in 0..4 {
        assert_eq!(
            pool.allocate(10),
            Err(PoolError::Backing(TestError::Injected))
        );
    }
    let b = get(&mut pool, 10);
    assert_eq!(pool.stats().backing_failures, 6);
    assert_eq!((pool.stats().misses, pool.stats().hits), (1, 0));
    put(&mut pool, b, 10);
    check(&pool, &inner);
}

#[test]
fn first_retry_frees_oldest_until_the_class_size_is_freed() {
    let (mut pool, fail, inner, clock) = failing(None);
    cache(&mut pool, &clock, &[100, 200, 300, 50]); // blocks 1..=4, 1 oldest
    fail.fail_next(1);
    // 250 bytes: free 1 (100 < 250), then 2 (300 >= 250), and retry.
    let b = get(&mut pool, 250);
    assert_eq!(b, 5);
    assert_eq!(inner.calls()[4..], [d(1, 100), d(2, 200), a(5, 250)]);
    assert_eq!(
        pool.stats(),
        stats! {
            misses: 5,
            trimmed: 2,
            backing_allocs: 5,
            backing_deallocs: 2,
            backing_failures: 1,
            blocks_in_use: 1,
            blocks_cached: 2,
            bytes_in_use: 250,
            bytes_cached: 350,
            bytes_reserved: 600,
            peak_bytes_reserved: 650,
            peak_bytes_in_use: 650,
            bytes_from_backing: 900,
            bytes_requested: 900,
        }
    );
    assert_eq!(fail.failures(), 1);
    put(&mut pool, b, 250);
    check(&pool, &inner);
}

#[test]
fn first_retry_stops_at_exactly_the_class_size() {
    let (mut pool, fail, inner, clock) = failing(None);
    cache(&mut pool, &clock, &[100, 150, 300]);
    fail.fail_next(1);
    let b = get(&mut pool, 250); // 100 + 150 == 250: enough
    assert_eq!(inner.calls()[3..], [d(1, 100), d(2, 150), a(4, 250)]);
    assert_eq!(pool.stats().bytes_cached, 300);
    put(&mut pool, b, 250);
    check(&pool, &inner);
}

#[test]
fn second_retry_frees_every_cached_block() {
    let (mut pool, fail, inner, clock) = failing(None);
    cache(&mut pool, &clock, &[100, 200, 300, 50]);
    fail.fail_next(2);
    let b = get(&mut pool, 250);
    assert_eq!(
        inner.calls()[4..],
        [d(1, 100), d(2, 200), d(3, 300), d(4, 50), a(5, 250)]
    );
    let s = pool.stats();
    assert_eq!(
        (s.backing_failures, s.trimmed, s.evictions, s.misses, s.hits),
        (2, 4, 0, 5, 0)
    );
    assert_eq!((s.blocks_cached, s.bytes_reserved), (0, 250));
    assert_eq!(fail.failures(), 2);
    put(&mut pool, b, 250);
    check(&pool, &inner);
}

#[test]
fn all_three_attempts_fail_then_backing_error_and_empty_cache() {
    let (mut pool, fail, inner, clock) = failing(None);
    cache(&mut pool, &clock, &[100, 200, 300, 50]);
    let before = pool.stats();
    fail.fail_next(3);
    assert_eq!(
        pool.allocate(250),
        Err(PoolError::Backing(TestError::Injected))
    );
    assert_eq!(fail.failures(), 3);
    assert_eq!(
        inner.calls()[4..],
        [d(1, 100), d(2, 200), d(3, 300), d(4, 50)],
        "no allocation reached the inner allocator"
    );
    assert_eq!(
        pool.stats(),
        {
            let mut s = before;
            s.backing_failures = 3;
            s.trimmed = 4;
            s.backing_deallocs = 4;
            s.blocks_cached = 0;
            s.bytes_cached = 0;
            s.bytes_reserved = 0;
            s
        },
        "hits and misses unchanged, the frees counted"
    );
    // A fourth attempt would have succeeded: exactly three were made.
    let b = get(&mut pool, 250);
    assert_eq!(pool.stats().backing_failures, 3);
    put(&mut pool, b, 250);
    check(&pool, &inner);
    drop(pool);
    inner.assert_all_freed();
}

#[test]
fn no_third_attempt_when_the_first_retry_emptied_the_cache() {
    let (mut pool, fail, inner, clock) = failing(None);
    cache(&mut pool, &clock, &[100]);
    fail.fail_next(2);
    assert_eq!(
        pool.allocate(250),
        Err(PoolError::Backing(TestError::Injected))
    );
    assert_eq!(fail.failures(), 2, "initial attempt and one retry");
    assert_eq!(pool.stats().backing_failures, 2);
    assert_eq!(pool.stats().trimmed, 1);
    assert_eq!(inner.calls(), vec![a(1, 100), d(1, 100)]);
    // The next allocation succeeds on its first attempt.
    let b = get(&mut pool, 250);
    assert_eq!(pool.stats().backing_failures, 2);
    put(&mut pool, b, 250);
    check(&pool, &inner);
}

#[test]
fn retry_under_a_capacity_frees_just_enough() {
    let (mut pool, fail, inner, clock) = failing(Some(700));
    cache(&mut pool, &clock, &[300, 200, 100]); // 600 of 700 used
    // 600 + 250 > 700 fails; freeing 300 (>= 250) leaves 300 + 250 <= 700.
    let b = get(&mut pool, 250);
    assert_eq!(inner.calls()[3..], [d(1, 300), a(4, 250)]);
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.bytes_cached), (1, 1, 300));
    assert_eq!(fail.used(), 550);
    put(&mut pool, b, 250);
    check(&pool, &inner);
}

#[test]
fn retry_under_a_capacity_frees_all_when_memory_is_taken_elsewhere() {
    let (mut pool, fail, inner, clock) = failing(Some(1000));
    cache(&mut pool, &clock, &[300, 300, 300]);
    // Someone else now holds part of the device.
    let mut other = fail.clone();
    let foreign = other.allocate(100).unwrap(); // block 4
    // ... and the device shrinks: 1000 of 800 used.
    fail.set_capacity(Some(800));
    // Attempt 1: 1000 + 250 > 800. Free 1 (300 >= 250) -> 700 + 250 > 800,
    // attempt 2 fails. Free 2, 3 -> 100 + 250 <= 800, attempt 3 succeeds.
    let b = get(&mut pool, 250);
    assert_eq!(b, 5);
    assert_eq!(
        inner.calls()[4..],
        [d(1, 300), d(2, 300), d(3, 300), a(5, 250)]
    );
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.blocks_cached), (2, 3, 0));
    assert_eq!(fail.failures(), 2);
    put(&mut pool, b, 250);
    // SAFETY: `foreign` came from `other.allocate(100)`.
    unsafe { other.deallocate(foreign, 100) };
    // (`check` does not apply: the inner allocator also served `other`.)
    pool.validate();
    assert_eq!(inner.live_bytes(), pool.stats().bytes_reserved);
    drop(pool);
    inner.assert_all_freed();
}

#[test]
fn out_of_memory_error_carries_the_last_failure() {
    let (mut pool, fail, inner, clock) = failing(Some(500));
    cache(&mut pool, &clock, &[200, 100]);
    let x = get(&mut pool, 150); // 450 of 500 used
    fail.set_capacity(Some(100));
    // Told the capacity, the pool would refuse 120 > 100 at once; an
    // allocator that tells nothing runs the whole ladder.
    fail.set_reporting(false);
    // Every attempt fails; the last one sees 150 in use after freeing all.
    assert_eq!(
        pool.allocate(120),
        Err(PoolError::Backing(TestError::OutOfMemory {
            requested: 120,
            used: 150,
            capacity: 100,
        }))
    );
    let s = pool.stats();
    assert_eq!(
        (
            s.backing_failures,
            s.trimmed,
            s.blocks_cached,
            s.blocks_in_use
        ),
        (3, 2, 0, 1)
    );
    assert_eq!(inner.calls()[3..], [d(1, 200), d(2, 100)]);
    put(&mut pool, x, 150);
    check(&pool, &inner);
}

#[test]
fn a_failed_allocate_counts_neither_a_hit_nor_a_miss() {
    let (mut pool, fail, inner, clock) = failing(None);
    cache(&mut pool, &clock, &[64]);
    let b = get(&mut pool, 64); // a hit
    put(&mut pool, b, 64);
    let s0 = pool.stats();
    assert_eq!((s0.hits, s0.misses), (1, 1));
    fail.fail_next(10);
    assert!(pool.allocate(32).is_err());
    let s1 = pool.stats();
    assert_eq!((s1.hits, s1.misses, s1.backing_allocs), (1, 1, 1));
    assert_eq!(
        (s1.bytes_from_pool, s1.bytes_from_backing),
        (s0.bytes_from_pool, s0.bytes_from_backing)
    );
    assert_eq!((s1.blocks_in_use, s1.bytes_in_use), (0, 0));
    assert_eq!(
        s1.backing_failures, 2,
        "one attempt, one retry after freeing the only block"
    );
    fail.fail_next(0);
    check(&pool, &inner);
}

#[test]
fn limit_trim_then_backing_failure_then_retry() {
    // The limit frees first (trimmed), then the backing allocator fails and
    // the retry frees more (also trimmed).
    let fail = FailingAllocator::new(CheckingAllocator::new());
    let inner = fail.inner().clone();
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(fail.clone())
        .policy(FixedTime::new(TTL))
        .clock(clock.clone())
        .limit(1000)
        .build();
    cache(&mut pool, &clock, &[400, 300, 200]); // 900 reserved
    fail.fail_next(1);
    // Limit: 900 + 250 > 1000: free 1 (400) -> 500 + 250 <= 1000.
    // Attempt 1 fails: free 2 (300 >= 250), attempt 2 succeeds.
    let b = get(&mut pool, 250);
    assert_eq!(inner.calls()[3..], [d(1, 400), d(2, 300), a(4, 250)]);
    let s = pool.stats();
    assert_eq!(
        (s.trimmed, s.backing_failures, s.bytes_reserved),
        (2, 1, 450)
    );
    put(&mut pool, b, 250);
    check(&pool, &inner);
}

#[test]
fn retry_frees_oldest_first_across_classes_and_reuse_orders() {
    // Blocks 1 (64 B), 2 (128), 3 (64), 4 (128) released in that order; a
    // hit takes one 64-byte block (3 under Lifo, 1 under Fifo) and releases
    // it again, so it becomes the youngest. Then a 200-byte request fails
    // once: the retry frees oldest first until >= 200 bytes are freed.
    for (reuse, hit, freed) in [
        (Reuse::Lifo, 3, [d(1, 64), d(2, 128), d(4, 128)]),
        (Reuse::Fifo, 1, [d(2, 128), d(3, 64), d(4, 128)]),
    ] {
        let fail = FailingAllocator::new(CheckingAllocator::new());
        let inner = fail.inner().clone();
        let clock = ManualClock::new();
        let mut pool = DecayingPool::builder(fail.clone())
            .policy(FixedTime::new(TTL))
            .clock(clock.clone())
            .reuse(reuse)
            .build();
        cache(&mut pool, &clock, &[64, 128, 64, 128]);
        let b = get(&mut pool, 64);
        assert_eq!(b, hit, "{reuse:?}");
        clock.advance(ms(1));
        put(&mut pool, b, 64);
        fail.fail_next(1);
        let c = get(&mut pool, 200);
        let mut want = freed.to_vec();
        want.push(a(5, 200));
        assert_eq!(inner.calls()[4..], want[..], "{reuse:?}");
        let s = pool.stats();
        assert_eq!(
            (s.trimmed, s.backing_failures, s.blocks_cached),
            (3, 1, 1),
            "{reuse:?}"
        );
        put(&mut pool, c, 200);
        check(&pool, &inner);
        drop(pool);
        inner.assert_all_freed();
    }
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn no_block_is_lost_under_random_failures() {
    let (mut pool, fail, inner, clock) = failing(Some(20_000));
    let mut rand = rng(0xDEAD_BEEF_CAFE_F00Du64);
    let mut held: Vec<(u64, usize)> = Vec::new();
    let (mut ok, mut failed) = (0u64, 0u64);
    for step in 0..3000 {
        match rand(10) {
            0..=4 => {
                if rand(8) == 0 {
                    fail.fail_next(rand(4) as u32);
                }
                let size = 1 + rand(4000) as usize;
                let s = pool.stats();
                match pool.allocate(size) {
                    Ok(b) => {
                        ok += 1;
                        held.push((b, size));
                    }
                    Err(PoolError::Backing(_)) => {
                        failed += 1;
                        let t = pool.stats();
                        assert_eq!((t.hits, t.misses), (s.hits, s.misses), "step {step}");
                        assert!(t.backing_failures > s.backing_failures, "step {step}");
                        assert!(t.backing_failures - s.backing_failures <= 3, "step {step}");
                        assert_eq!(t.bytes_in_use, s.bytes_in_use);
                    }
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            5..=8 if !held.is_empty() => {
                let (b, size) = held.swap_remove(rand(held.len() as u64) as usize);
                put(&mut pool, b, size);
            }
            _ => clock.advance(Duration::from_secs(rand(30))),
        }
        let s = pool.stats();
        assert_eq!(s.hits + s.misses, ok, "step {step}");
        assert_eq!(s.backing_failures, fail.failures(), "step {step}");
        assert_eq!(fail.used(), s.bytes_reserved, "step {step}");
        check(&pool, &inner);
    }
    assert!(failed > 20 && ok > 500, "{failed} failed, {ok} ok");
    for (b, size) in held {
        put(&mut pool, b, size);
    }
    let cached = pool.stats().bytes_cached;
    assert_eq!(pool.trim(), cached);
    assert_eq!(fail.used(), 0);
    drop(pool);
    inner.assert_all_freed();
}
