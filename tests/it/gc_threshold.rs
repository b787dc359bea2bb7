//! Tests: the garbage-collection threshold (`Builder::gc_threshold`,
//! PyTorch's `garbage_collection_threshold`): a miss that would bring the
//! bytes reserved past a fraction of the limit (or of the backing
//! capacity) first frees cached blocks oldest first; every pool kind
//! honours it, and the replay shows its effect.

use core::time::Duration;
use std::sync::{Arc, Mutex};

use decaying_pool::testing::{CheckingAllocator, FailingAllocator};
use decaying_pool::trace::{Config, PolicyKind, ReadOptions, ReplayOptions, Replayer, TraceReader};
use decaying_pool::{
    DecayingPool, Event, FixedTime, ManualClock, Packing, PoolError, Reason, SharedPool,
};

use crate::support::{freed_ids, put};

/// The pool these tests check, over a checking allocator.
type Pool = DecayingPool<CheckingAllocator, FixedTime, ManualClock>;

/// What the pool's observer saw.
type Seen = Arc<Mutex<Vec<Event>>>;

/// A pool that never decays (so only the threshold and the limit free),
/// over `alloc`, with a limit of 100 bytes and a threshold of 0.5; and the
/// events its observer saw.
fn keep_all(alloc: &CheckingAllocator) -> (Pool, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::MAX))
        .clock(ManualClock::new())
        .limit(100)
        .gc_threshold(0.5)
        .observer(move |e| log.lock().unwrap().push(e))
        .build();
    (pool, seen)
}

fn gc(size: usize) -> Event {
    Event::Freed {
        size,
        reason: Reason::GcThreshold,
    }
}

#[test]
fn a_miss_past_the_threshold_frees_cached_blocks_oldest_first() {
    let alloc = CheckingAllocator::new();
    let (mut pool, seen) = keep_all(&alloc);
    assert_eq!(pool.gc_threshold(), Some(0.5));
    // 10, 20, 15 cached in that order: 45 reserved, under 50.
    let blocks: Vec<_> = [10, 20, 15]
        .iter()
        .map(|&s| (pool.allocate(s).unwrap(), s))
        .collect();
    for &(b, s) in &blocks {
        put(&mut pool, b, s);
    }
    // A miss of 5: 45 + 5 = 50, at the threshold, not past it: nothing freed.
    let five = pool.allocate(5).unwrap();
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(pool.stats().bytes_reserved, 50);
    // A miss of 12: 50 + 12 = 62 > 50: the oldest (10) goes, 52 still
    // past it, then 20: 32 + 12 = 44.
    let twelve = pool.allocate(12).unwrap();
    assert_eq!(freed_ids(&alloc), [blocks[0].0, blocks[1].0]);
    assert_eq!(*seen.lock().unwrap(), [gc(10), gc(20)]);
    let s = pool.stats();
    assert_eq!(
        (s.evictions, s.trimmed, s.bytes_reserved, s.bytes_cached),
        (2, 0, 32, 15)
    );
    // The newest, 15, is still cached: a hit, which frees nothing.
    let fifteen = pool.allocate(15).unwrap();
    assert_eq!(fifteen, blocks[2].0);
    assert_eq!(pool.stats().evictions, 2);
    pool.validate();
    put(&mut pool, five, 5);
    put(&mut pool, twelve, 12);
    put(&mut pool, fifteen, 15);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn below_the_threshold_nothing_is_freed() {
    let alloc = CheckingAllocator::new();
    let (mut pool, seen) = keep_all(&alloc);
    for size in [10, 11, 12, 13] {
        let b = pool.allocate(size).unwrap();
        put(&mut pool, b, size);
    }
    // 46 reserved, all cached, every miss stayed at or under 50.
    let s = pool.stats();
    assert_eq!((s.evictions, s.trimmed, s.bytes_cached), (0, 0, 46));
    assert!(seen.lock().unwrap().is_empty());
    // Hits never look at the threshold.
    for size in [10, 11, 12, 13] {
        let b = pool.allocate(size).unwrap();
        put(&mut pool, b, size);
    }
    assert_eq!(pool.stats().hits, 4);
    assert_eq!(alloc.deallocs(), 0);
    pool.validate();
}

#[test]
fn above_the_threshold_a_miss_still_succeeds_and_the_limit_still_refuses() {
    let alloc = CheckingAllocator::new();
    let (mut pool, seen) = keep_all(&alloc);
    let a = pool.allocate(40).unwrap();
    let b = pool.allocate(30).unwrap(); // 70 > 50, nothing cached: served
    assert_eq!(pool.stats().bytes_reserved, 70);
    // With 40 cached past the threshold, a miss the limit refuses (30 in
    // use + 71 > 100) frees nothing.
    put(&mut pool, a, 40);
    assert!(matches!(
        pool.allocate(71),
        Err(PoolError::LimitExceeded {
            requested: 71,
            limit: 100,
            reserved: 70
        })
    ));
    assert_eq!(pool.stats().bytes_cached, 40);
    assert!(seen.lock().unwrap().is_empty());
    // One that fits (95, under the limit) frees the cache to get under
    // the threshold (it cannot: 30 + 25 are still past 50), and is served.
    let c = pool.allocate(25).unwrap();
    assert_eq!(*seen.lock().unwrap(), [gc(40)]);
    assert_eq!(pool.stats().bytes_reserved, 55);
    let d = pool.allocate(45).unwrap(); // 100: at the limit
    assert!(matches!(
        pool.allocate(1),
        Err(PoolError::LimitExceeded {
            requested: 1,
            limit: 100,
            reserved: 100
        })
    ));
    let s = pool.stats();
    assert_eq!((s.evictions, s.trimmed, s.misses), (1, 0, 4));
    pool.validate();
    put(&mut pool, b, 30);
    put(&mut pool, c, 25);
    put(&mut pool, d, 45);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn without_a_limit_the_threshold_is_a_fraction_of_the_backing_capacity() {
    let alloc = FailingAllocator::with_capacity(100);
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::MAX))
        .clock(ManualClock::new())
        .gc_threshold(0.5)
        .build();
    let a = pool.allocate(30).unwrap();
    let b = pool.allocate(20).unwrap();
    put(&mut pool, a, 30);
    put(&mut pool, b, 20);
    // 50 + 10 > 50 of the capacity of 100: the oldest (30) goes.
    let c = pool.allocate(10).unwrap();
    let s = pool.stats();
    assert_eq!((s.evictions, s.bytes_reserved, s.bytes_cached), (1, 30, 20));
    put(&mut pool, c, 10);
    pool.validate();
    drop(pool);

    // An allocator that reports no capacity: nothing to take a fraction of.
    let alloc = FailingAllocator::with_capacity(100);
    alloc.set_reporting(false);
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::MAX))
        .clock(ManualClock::new())
        .gc_threshold(0.5)
        .build();
    let a = pool.allocate(30).unwrap();
    let b = pool.allocate(20).unwrap();
    put(&mut pool, a, 30);
    put(&mut pool, b, 20);
    let c = pool.allocate(10).unwrap();
    assert_eq!(pool.stats().evictions, 0);
    put(&mut pool, c, 10);
    drop(pool);

    // A limit wins over the capacity: 0.5 of 60, not of 100.
    let alloc = FailingAllocator::with_capacity(100);
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::MAX))
        .clock(ManualClock::new())
        .limit(60)
        .gc_threshold(0.5)
        .build();
    let a = pool.allocate(25).unwrap();
    put(&mut pool, a, 25);
    let b = pool.allocate(10).unwrap(); // 35 > 30
    assert_eq!(pool.stats().evictions, 1);
    put(&mut pool, b, 10);
}

#[test]
fn the_threshold_can_be_changed_at_run_time_and_acts_on_the_next_miss() {
    let alloc = CheckingAllocator::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::MAX))
        .clock(ManualClock::new())
        .limit(100)
        .build();
    assert_eq!(pool.gc_threshold(), None);
    let a = pool.allocate(60).unwrap();
    put(&mut pool, a, 60);
    let b = pool.allocate(30).unwrap(); // no threshold: 90 fits the limit
    assert_eq!(pool.stats().bytes_cached, 60);
    pool.set_gc_threshold(Some(0.8));
    assert_eq!(pool.stats().bytes_cached, 60, "setting it frees nothing");
    let c = pool.allocate(1).unwrap(); // 91 > 80: the 60 go
    assert_eq!(
        (pool.stats().evictions, pool.stats().bytes_reserved),
        (1, 31)
    );
    pool.set_gc_threshold(None);
    put(&mut pool, b, 30);
    put(&mut pool, c, 1);
    let d = pool.allocate(70).unwrap(); // 101 > 100: the limit frees the oldest (30)
    let s = pool.stats();
    assert_eq!((s.evictions, s.trimmed, s.bytes_reserved), (1, 1, 71));
    put(&mut pool, d, 70);
    pool.validate();
}

#[test]
fn a_fraction_outside_zero_to_one_is_refused() {
    for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        let r = std::panic::catch_unwind(|| {
            DecayingPool::builder(CheckingAllocator::new()).gc_threshold(bad)
        });
        assert!(r.is_err(), "{bad} accepted");
    }
    let pool = DecayingPool::builder(CheckingAllocator::new())
        .gc_threshold(1.0)
        .build();
    assert_eq!(pool.gc_threshold(), Some(1.0));
    let mut pool = pool;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.set_gc_threshold(Some(0.0))
    }));
    assert!(r.is_err());
    assert_eq!(
        pool.gc_threshold(),
        Some(1.0),
        "a refused setting changes nothing"
    );
}

#[test]
fn class_statistics_count_the_threshold_s_frees_as_evictions() {
    let alloc = CheckingAllocator::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::MAX))
        .clock(ManualClock::new())
        .limit(100)
        .gc_threshold(0.5)
        .class_stats(true)
        .build();
    let a = pool.allocate(40).unwrap();
    put(&mut pool, a, 40);
    let b = pool.allocate(20).unwrap();
    let classes = pool.class_stats().unwrap();
    let forty = classes.iter().find(|c| c.size == 40).unwrap();
    assert_eq!((forty.evictions, forty.trimmed), (1, 0));
    pool.validate();
    put(&mut pool, b, 20);
}

#[test]
fn a_shared_pool_keeps_the_threshold() {
    let alloc = CheckingAllocator::new();
    let (pool, seen) = keep_all(&alloc);
    let pool = SharedPool::new(pool);
    let a = pool.allocate(30).unwrap();
    let b = pool.allocate(15).unwrap();
    drop(a);
    drop(b);
    assert_eq!(pool.stats().bytes_cached, 45);
    // 45 + 10 > 50: the oldest (30) goes.
    let c = pool.allocate(10).unwrap();
    assert_eq!(*seen.lock().unwrap(), [gc(30)]);
    let s = pool.stats();
    assert_eq!((s.evictions, s.bytes_reserved, s.bytes_cached), (1, 25, 15));
    assert_eq!(pool.with(|p| p.gc_threshold()), Some(0.5));
    pool.with(|p| p.validate());
    drop(c);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn a_packed_pool_keeps_the_threshold() {
    const MIB: usize = 1 << 20;
    let alloc = CheckingAllocator::with_addresses();
    // Requests above the medium threshold (128 MiB) are exact blocks of
    // the pool under the packing.
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::MAX))
        .clock(ManualClock::new())
        .limit(1000 * MIB)
        .gc_threshold(0.5)
        .packing(Packing::default())
        .build();
    let a = pool.allocate(200 * MIB).unwrap();
    let b = pool.allocate(150 * MIB).unwrap();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(a, 200 * MIB);
        pool.release(b, 150 * MIB);
    }
    assert_eq!(pool.pool().stats().bytes_cached, 350 * MIB);
    // 350 + 300 > 500 MiB: the oldest (200 MiB) goes; 450 is under.
    let c = pool.allocate(300 * MIB).unwrap();
    let s = pool.pool().stats();
    assert_eq!(
        (s.evictions, s.bytes_reserved, s.bytes_cached),
        (1, 450 * MIB, 150 * MIB)
    );
    assert_eq!(freed_ids(&alloc), [a]);
    pool.validate();
    // SAFETY: as above.
    unsafe { pool.release(c, 300 * MIB) };
    drop(pool);
    alloc.assert_all_freed();
}

/// The shipped training trace on a device a little above its peak: a
/// threshold frees idle blocks before the pool grows, so the peak reserved
/// falls and the evictions rise, and nothing fails.
#[test]
#[cfg_attr(miri, ignore)] // reads a trace file
fn the_replay_of_a_shipped_trace_shows_the_threshold_s_effect() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cli/traces/training.csv");
    if !path.exists() {
        eprintln!(
            "note: {} not found (a packaged crate): skipped",
            path.display()
        );
        return;
    }
    let options = ReadOptions {
        lenient_frees: true,
        ..ReadOptions::default()
    };
    let events: Vec<decaying_pool::trace::Event> = TraceReader::open(&path, options)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let replay = |configs: &[Config]| {
        let mut r = Replayer::new(configs, ReplayOptions::default());
        for e in &events {
            r.event(e);
        }
        r.finish("training")
    };
    let base = replay(&[Config::new(PolicyKind::KeepAll)]);
    let peak = base[0].peak_reserved_bytes;
    let limit = peak + peak / 4;
    let reports = replay(&[
        Config::new(PolicyKind::KeepAll).limit(limit),
        Config::new(PolicyKind::KeepAll)
            .limit(limit)
            .gc_threshold(0.8),
        Config::new(PolicyKind::KeepAll)
            .limit(limit)
            .gc_threshold(0.5),
    ]);
    assert_eq!(reports[1].policy, format!("{}, gc 0.8", reports[0].policy));
    for r in &reports {
        assert_eq!(r.failures, 0, "{}", r.policy);
    }
    assert!(
        reports[1].peak_reserved_bytes <= reports[0].peak_reserved_bytes
            && reports[2].peak_reserved_bytes < reports[0].peak_reserved_bytes,
        "peaks {} {} {}",
        reports[0].peak_reserved_bytes,
        reports[1].peak_reserved_bytes,
        reports[2].peak_reserved_bytes
    );
    assert!(reports[2].peak_reserved_bytes <= limit / 2 || reports[2].evictions > 0);
    assert_eq!(reports[0].evictions, 0);
    assert!(reports[2].evictions >= reports[1].evictions && reports[2].evictions > 0);
}
