//! Tests: the run-time knobs and figures — `set_limit`, `reset_peaks`,
//! `Stats`' summary, statistics by class, the observer, policies chosen at
//! run time, and serde.

use core::time::Duration;
use std::sync::{Arc, Mutex};

use decaying_pool::policy::{AnyPolicy, BoxedPolicy};
use decaying_pool::testing::{CheckingAllocator, FailingAllocator};
use decaying_pool::{
    ClassStats, DecayingPool, Event, EvictionPolicy, Exponential, FixedCapacity, FixedTime,
    ManualClock, PoolError, Reason, SharedPool, SizeClass, Stats,
};

use crate::support::{freed_ids, put};

fn events() -> (Arc<Mutex<Vec<Event>>>, impl FnMut(Event) + Send + 'static) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    (seen, move |e| log.lock().unwrap().push(e))
}

#[test]
fn lowering_the_limit_frees_cached_blocks_oldest_first_and_misses_fail_until_released() {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let (seen, observer) = events();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::from_secs(60)))
        .clock(clock.clone())
        .observer(observer)
        .build();
    // Blocks 1..=4 of 100, 200, 300, 400 bytes; 1, 2, 3 cached in that order.
    let blocks: Vec<_> = [100, 200, 300, 400]
        .iter()
        .map(|&s| (pool.allocate(s).unwrap(), s))
        .collect();
    for &(b, s) in &blocks[..3] {
        clock.advance(Duration::from_millis(1));
        put(&mut pool, b, s);
    }
    // 1000 reserved; a limit of 750 frees the two oldest (100, 200): 700 left.
    assert_eq!(pool.set_limit(Some(750)), 300);
    assert_eq!(pool.limit(), Some(750));
    assert_eq!(freed_ids(&alloc), [blocks[0].0, blocks[1].0]);
    let s = pool.stats();
    assert_eq!(
        (s.bytes_reserved, s.bytes_cached, s.blocks_cached, s.trimmed),
        (700, 300, 1, 2)
    );
    assert_eq!(
        *seen.lock().unwrap(),
        [
            Event::Freed {
                size: 100,
                reason: Reason::Limit
            },
            Event::Freed {
                size: 200,
                reason: Reason::Limit
            },
        ]
    );
    pool.validate();

    // A limit below the 400 bytes in use: the cache empties, misses fail.
    assert_eq!(pool.set_limit(Some(350)), 300);
    let s = pool.stats();
    assert_eq!(
        (s.bytes_reserved, s.bytes_in_use, s.blocks_cached),
        (400, 400, 0)
    );
    pool.validate();
    match pool.allocate(8) {
        Err(PoolError::LimitExceeded {
            requested: 8,
            limit: 350,
            reserved: 400,
        }) => {}
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    assert_eq!(alloc.allocs(), 4, "no backing call for a refused miss");
    // Released: it is cached (over the limit until a miss needs room) ...
    put(&mut pool, blocks[3].0, 400);
    assert_eq!(pool.stats().bytes_cached, 400);
    pool.validate();
    // ... and a hit still works ...
    let again = pool.allocate(400).unwrap();
    assert_eq!(again, blocks[3].0);
    put(&mut pool, again, 400);
    // ... and the next miss frees it to make room.
    let small = pool.allocate(300).unwrap();
    let s = pool.stats();
    assert_eq!(
        (s.bytes_reserved, s.bytes_cached, s.misses, s.hits),
        (300, 0, 5, 1)
    );
    assert_eq!(
        seen.lock().unwrap().last(),
        Some(&Event::Freed {
            size: 400,
            reason: Reason::Limit
        })
    );
    pool.validate();
    // Raising (or removing) the limit frees nothing.
    assert_eq!(pool.set_limit(None), 0);
    assert_eq!(pool.limit(), None);
    put(&mut pool, small, 300);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn set_limit_and_reset_peaks_through_the_shared_pool_and_its_lock() {
    let alloc = CheckingAllocator::new();
    let pool = SharedPool::new(DecayingPool::new(alloc.clone(), FixedTime::default()));
    let a = pool.allocate(1000).unwrap();
    drop(pool.allocate(3000).unwrap());
    assert_eq!(pool.stats().peak_bytes_in_use, 4000);
    assert_eq!(pool.set_limit(Some(2000)), 3000);
    assert_eq!(pool.limit(), Some(2000));
    assert_eq!(alloc.deallocs(), 1);
    pool.reset_peaks();
    let s = pool.stats();
    assert_eq!((s.peak_bytes_reserved, s.peak_bytes_in_use), (1000, 1000));
    drop(a);
    pool.with(|p| {
        assert_eq!(p.set_limit(Some(0)), 1000);
        p.reset_peaks();
    });
    let s = pool.stats();
    assert_eq!((s.peak_bytes_reserved, s.peak_bytes_in_use), (0, 0));
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn reset_peaks_sets_each_peak_to_its_current_value() {
    let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    let a = pool.allocate(1 << 20).unwrap();
    let b = pool.allocate(2 << 20).unwrap();
    put(&mut pool, b, 2 << 20);
    let s = pool.stats();
    assert_eq!(
        (s.peak_bytes_reserved, s.peak_bytes_in_use),
        (3 << 20, 3 << 20)
    );
    pool.reset_peaks();
    let s = pool.stats();
    assert_eq!(
        (s.peak_bytes_reserved, s.peak_bytes_in_use),
        (3 << 20, 1 << 20)
    );
    pool.trim();
    pool.reset_peaks();
    let s = pool.stats();
    assert_eq!(
        (s.peak_bytes_reserved, s.peak_bytes_in_use),
        (1 << 20, 1 << 20)
    );
    // Peaks grow again from there.
    let c = pool.allocate(4 << 20).unwrap();
    assert_eq!(pool.stats().peak_bytes_in_use, 5 << 20);
    pool.validate();
    put(&mut pool, a, 1 << 20);
    put(&mut pool, c, 4 << 20);
}

#[test]
fn stats_display_shows_humanised_figures_and_the_rounding_waste() {
    let mut pool = DecayingPool::builder(CheckingAllocator::new())
        .size_class(SizeClass::PowerOfTwo)
        .build();
    let a = pool.allocate(3 << 20).unwrap(); // 4 MiB class
    let b = pool.allocate(1536).unwrap(); // 2 KiB class
    put(&mut pool, b, 1536);
    let b = pool.allocate(1500).unwrap(); // a hit, 2 KiB class
    let s = pool.stats();
    assert_eq!(s.bytes_requested, (3 << 20) + 1536 + 1500);
    assert_eq!(s.bytes_served(), (4 << 20) + 4096);
    assert_eq!(s.rounding_waste(), (1 << 20) + 512 + 548);
    let text = s.to_string();
    for want in [
        "reserved         4.00 MiB     4.00 MiB",
        "in use           4.00 MiB     4.00 MiB",
        "cached                0 B",
        "blocks: 2 in use, 0 cached",
        "allocations: 3 (1 hits, 2 misses, hit rate 33.3%)",
        "served: 4.00 MiB in classes for 3.00 MiB requested, rounding waste 1.00 MiB (25.0%)",
        "served from: cache 2.00 KiB, backing 4.00 MiB",
        "freed from the cache: 0 evicted, 0 trimmed",
        "backing calls: 2 allocs, 0 deallocs, 0 failures",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    put(&mut pool, a, 3 << 20);
    put(&mut pool, b, 1500);
    // Exact sizes waste nothing.
    let mut exact = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    let c = exact.allocate(1000).unwrap();
    let s = exact.stats();
    assert_eq!((s.bytes_requested, s.rounding_waste()), (1000, 0));
    assert!(
        s.to_string()
            .contains("1000 B requested, rounding waste 0 B (0.0%)")
    );
    put(&mut exact, c, 1000);
}

#[test]
fn class_stats_are_exact_after_a_scripted_sequence_in_first_seen_order() {
    let clock = ManualClock::new();
    let alloc = FailingAllocator::new(CheckingAllocator::new());
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone())
        .size_class(SizeClass::PowerOfTwo)
        .class_stats(true)
        .build();
    assert_eq!(pool.class_stats(), Some(vec![]));
    // 4096 first, then 128, then 65536.
    let a = pool.allocate(3000).unwrap(); // miss 4096
    let b = pool.allocate(100).unwrap(); // miss 128
    let c = pool.allocate(4000).unwrap(); // miss 4096
    put(&mut pool, a, 3000);
    let a = pool.allocate(4096).unwrap(); // hit 4096
    let d = pool.allocate(40_000).unwrap(); // miss 65536
    put(&mut pool, a, 4096);
    put(&mut pool, d, 40_000);
    clock.advance(Duration::from_secs(1));
    assert_eq!(pool.collect(), 2); // 4096 and 65536 expire
    put(&mut pool, b, 100);
    pool.trim(); // the 128 is trimmed
    let classes = pool.class_stats().unwrap();
    assert_eq!(
        classes,
        [
            ClassStats {
                size: 4096,
                blocks_in_use: 1,
                bytes_in_use: 4096,
                blocks_cached: 0,
                bytes_cached: 0,
                hits: 1,
                misses: 2,
                evictions: 1,
                trimmed: 0,
            },
            ClassStats {
                size: 128,
                misses: 1,
                trimmed: 1,
                ..Default::default()
            },
            ClassStats {
                size: 65536,
                misses: 1,
                evictions: 1,
                ..Default::default()
            },
        ]
    );
    pool.validate();
    // An out-of-memory retry frees the cached 4096 block.
    put(&mut pool, c, 4000);
    alloc.fail_next(1);
    let e = pool.allocate(100).unwrap();
    let classes = pool.class_stats().unwrap();
    assert_eq!((classes[0].blocks_cached, classes[0].trimmed), (0, 1));
    assert_eq!((classes[1].misses, classes[1].blocks_in_use), (2, 1));
    pool.validate();
    put(&mut pool, e, 100);
    // Not kept unless asked for.
    let plain = DecayingPool::new(CheckingAllocator::new(), FixedTime::default());
    assert_eq!(plain.class_stats(), None);
}

#[test]
fn observer_hears_every_reason_with_the_class_size_and_backing_failures() {
    let clock = ManualClock::new();
    let alloc = FailingAllocator::new(CheckingAllocator::new());
    let (seen, observer) = events();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone())
        .size_class(SizeClass::Multiple(100))
        .observer(observer)
        .build();
    let take = |seen: &Arc<Mutex<Vec<Event>>>| core::mem::take(&mut *seen.lock().unwrap());

    // Expired.
    let a = pool.allocate(150).unwrap();
    put(&mut pool, a, 150);
    clock.advance(Duration::from_secs(1));
    pool.collect();
    assert_eq!(
        take(&seen),
        [Event::Freed {
            size: 200,
            reason: Reason::Expired
        }]
    );
    // Trimmed.
    let a = pool.allocate(250).unwrap();
    put(&mut pool, a, 250);
    pool.trim();
    assert_eq!(
        take(&seen),
        [Event::Freed {
            size: 300,
            reason: Reason::Trimmed
        }]
    );
    // Out of memory: the first failure frees the cached 400, the retry works.
    let a = pool.allocate(400).unwrap();
    put(&mut pool, a, 400);
    alloc.fail_next(1);
    let b = pool.allocate(500).unwrap();
    assert_eq!(
        take(&seen),
        [
            Event::BackingFailed {
                size: 500,
                attempt: 1
            },
            Event::Freed {
                size: 400,
                reason: Reason::OutOfMemory
            },
        ]
    );
    // A failure with nothing cached: told, then given up.
    alloc.fail_next(1);
    assert!(matches!(pool.allocate(600), Err(PoolError::Backing(_))));
    assert_eq!(
        take(&seen),
        [Event::BackingFailed {
            size: 600,
            attempt: 1
        }]
    );
    // Limit.
    put(&mut pool, b, 500);
    pool.set_limit(Some(100));
    assert_eq!(
        take(&seen),
        [Event::Freed {
            size: 500,
            reason: Reason::Limit
        }]
    );
    pool.set_limit(None);
    // Dropped.
    let a = pool.allocate(700).unwrap();
    put(&mut pool, a, 700);
    drop(pool);
    assert_eq!(
        take(&seen),
        [Event::Freed {
            size: 700,
            reason: Reason::Dropped
        }]
    );
    alloc.inner().assert_all_freed();

    // Displaced, under FixedCapacity.
    let (seen, observer) = events();
    let mut pool = DecayingPool::builder(CheckingAllocator::new())
        .policy(FixedCapacity::new(1))
        .observer(observer)
        .build();
    let (a, b) = (pool.allocate(64).unwrap(), pool.allocate(64).unwrap());
    put(&mut pool, a, 64);
    put(&mut pool, b, 64);
    assert_eq!(
        take(&seen),
        [Event::Freed {
            size: 64,
            reason: Reason::Displaced
        }]
    );
}

#[test]
fn observer_on_a_shared_pool_hears_its_frees() {
    let clock = ManualClock::new();
    let (seen, observer) = events();
    let pool = SharedPool::new(
        DecayingPool::builder(CheckingAllocator::new())
            .policy(FixedTime::new(Duration::from_secs(1)))
            .clock(clock.clone())
            .observer(observer)
            .build(),
    );
    drop(pool.allocate(64).unwrap());
    clock.advance(Duration::from_secs(1));
    assert_eq!(pool.collect(), 1);
    assert_eq!(
        *seen.lock().unwrap(),
        [Event::Freed {
            size: 64,
            reason: Reason::Expired
        }]
    );
}

/// A policy of the user's own, boxed.
struct KeepTwo;

impl EvictionPolicy for KeepTwo {
    fn must_evict(
        &mut self,
        _now: Duration,
        _oldest: decaying_pool::policy::Oldest,
        cached: usize,
    ) -> bool {
        cached > 2 * 64
    }
}

/// What a config file or flag picks, all in one pool type.
fn pool_from_config(name: &str) -> DecayingPool<CheckingAllocator, AnyPolicy, ManualClock> {
    let policy = match name {
        "fixed_capacity" => AnyPolicy::from(FixedCapacity::new(2)),
        "exponential" => AnyPolicy::timed(Exponential::new(Duration::from_secs(1))),
        "keep_two" => AnyPolicy::from(Box::new(KeepTwo) as BoxedPolicy),
        _ => AnyPolicy::timed(FixedTime::new(Duration::from_secs(1))),
    };
    DecayingPool::builder(CheckingAllocator::new())
        .policy(policy)
        .clock(ManualClock::new())
        .build()
}

#[test]
fn policies_chosen_at_run_time_share_one_pool_type() {
    // Releasing three 64-byte blocks: FixedCapacity(2) and KeepTwo keep
    // two, FixedTime and Exponential keep three until they decay.
    for (name, cached, evicted) in [
        ("fixed_capacity", 2, 1),
        ("keep_two", 2, 1),
        ("fixed_time", 3, 0),
        ("exponential", 3, 0),
    ] {
        let mut pool = pool_from_config(name);
        let blocks: Vec<_> = (0..3).map(|_| pool.allocate(64).unwrap()).collect();
        for b in blocks {
            put(&mut pool, b, 64);
        }
        // A timed policy runs at the start of each call.
        pool.collect();
        let s = pool.stats();
        assert_eq!((s.blocks_cached, s.evictions), (cached, evicted), "{name}");
        let b = pool.allocate(64).unwrap();
        assert_eq!(pool.stats().hits, 1, "{name}");
        put(&mut pool, b, 64);
        pool.clock().advance(Duration::from_secs(10));
        let decayed = pool.collect();
        // Only the timed policies decay.
        assert_eq!(
            decayed > 0,
            matches!(name, "fixed_time" | "exponential"),
            "{name}"
        );
        pool.validate();
    }
    // A boxed policy is a policy on its own too.
    let policy: BoxedPolicy = Box::new(FixedTime::new(Duration::from_secs(1)));
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(CheckingAllocator::new())
        .policy(policy)
        .clock(clock.clone())
        .build();
    let b = pool.allocate(8).unwrap();
    put(&mut pool, b, 8);
    clock.advance(Duration::from_secs(1));
    assert_eq!(pool.collect(), 1);
}

#[cfg(feature = "serde")]
#[test]
fn stats_class_stats_events_and_reports_round_trip_through_serde_json() {
    use decaying_pool::trace::{Config, Event as TraceEvent, PolicyKind, ReplayOptions, Replayer};
    let mut pool = DecayingPool::builder(CheckingAllocator::new())
        .size_class(SizeClass::PowerOfTwo)
        .class_stats(true)
        .build();
    let a = pool.allocate(3000).unwrap();
    let b = pool.allocate(100).unwrap();
    put(&mut pool, b, 100);
    let stats = pool.stats();
    let json = serde_json::to_string(&stats).unwrap();
    assert!(json.contains("\"bytes_requested\":3100"), "{json}");
    assert_eq!(serde_json::from_str::<Stats>(&json).unwrap(), stats);
    // Fields missing from an older snapshot read as zero.
    let old: Stats = serde_json::from_str(r#"{"hits": 3, "misses": 1}"#).unwrap();
    assert_eq!(
        old,
        stats! {
            hits: 3,
            misses: 1,
        }
    );

    let classes = pool.class_stats().unwrap();
    let json = serde_json::to_string(&classes).unwrap();
    assert_eq!(
        serde_json::from_str::<Vec<ClassStats>>(&json).unwrap(),
        classes
    );

    let e = Event::Freed {
        size: 4096,
        reason: Reason::OutOfMemory,
    };
    let json = serde_json::to_string(&e).unwrap();
    assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), e);
    put(&mut pool, a, 3000);

    let mut r = Replayer::new(&[Config::new(PolicyKind::NoPool)], ReplayOptions::default());
    r.event(&TraceEvent::alloc(Duration::ZERO, 1, 1_000_000));
    r.event(&TraceEvent::free(Duration::from_secs(1), 1, 1_000_000));
    let report = r.finish("w").remove(0);
    let json = serde_json::to_string(&report).unwrap();
    let back: decaying_pool::trace::Report = serde_json::from_str(&json).unwrap();
    assert_eq!(
        (back.workload.as_str(), back.backing_allocs, back.stats),
        ("w", 1, report.stats)
    );
    assert_eq!(
        back.modelled_backing_seconds,
        report.modelled_backing_seconds
    );
}

#[test]
fn an_observer_and_class_stats_keep_the_pool_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    // The observer is boxed inside the pool whatever its closure type.
    send_sync::<DecayingPool<CheckingAllocator, FixedTime, ManualClock>>();
    // A boxed policy is `Send` only: the pool is, and a `SharedPool` of it
    // is `Send + Sync`.
    send::<DecayingPool<CheckingAllocator, AnyPolicy, ManualClock>>();
    send_sync::<SharedPool<CheckingAllocator, AnyPolicy, ManualClock>>();
    send_sync::<SharedPool<CheckingAllocator, BoxedPolicy, ManualClock>>();
}

#[test]
fn a_panicking_observer_loses_no_block_and_keeps_the_counters_true() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let clock = ManualClock::new();
    let alloc = CheckingAllocator::new();
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    let told = Arc::new(AtomicU32::new(0));
    let count = told.clone();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone())
        .class_stats(true)
        .observer(move |_| {
            if count.fetch_add(1, Relaxed) < 2 {
                panic!("observer panics on its first two events");
            }
        })
        .build();
    let (a, b) = (pool.allocate(100).unwrap(), pool.allocate(200).unwrap());
    put(&mut pool, a, 100);
    clock.advance(Duration::from_secs(1));
    // The release runs the policy first: the 100 expires, the observer
    // panics, and `b` is still cached.
    let r = catch_unwind(AssertUnwindSafe(|| put(&mut pool, b, 200)));
    assert!(r.is_err());
    let s = pool.stats();
    assert_eq!(
        (s.evictions, s.backing_deallocs, s.blocks_cached),
        (1, 1, 1)
    );
    pool.validate();
    assert_eq!(alloc.deallocs(), 1);
    // Dropping the pool: the observer panics again, every block goes back,
    // the panic is passed on.
    let r = catch_unwind(AssertUnwindSafe(|| drop(pool)));
    assert!(r.is_err());
    alloc.assert_all_freed();
    assert_eq!(told.load(Relaxed), 2);
}

/// One step of [`limits_set_at_run_time_keep_every_invariant`].
#[derive(Clone, Debug)]
enum Step {
    Allocate(usize),
    Release(usize),
    SetLimit(Option<usize>),
    Advance(u64),
    Trim,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => proptest::sample::select(vec![100usize, 200, 300, 1000, 1500]).prop_map(Step::Allocate),
        3 => any::<usize>().prop_map(Step::Release),
        1 => proptest::option::of(0usize..4000).prop_map(Step::SetLimit),
        1 => (0u64..1500).prop_map(Step::Advance),
        1 => Just(Step::Trim),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: if cfg!(miri) { 1 } else { 300 },
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Limits changed at run time, with class statistics and an observer:
    /// the pool validates after every step (class sums included), the
    /// observer hears of every backing free, `bytes_reserved` never grows
    /// while above the limit, and every block goes back once.
    #[test]
    fn limits_set_at_run_time_keep_every_invariant(
        steps in proptest::collection::vec(step(), 1..if cfg!(miri) { 50 } else { 120 }),
        fifo in proptest::prelude::any::<bool>(),
    ) {
        let clock = ManualClock::new();
        let alloc = CheckingAllocator::new();
        let (seen, observer) = events();
        let mut pool = DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(Duration::from_secs(1)))
            .clock(clock.clone())
            .size_class(SizeClass::Multiple(256))
            .reuse(if fifo { decaying_pool::Reuse::Fifo } else { decaying_pool::Reuse::Lifo })
            .class_stats(true)
            .observer(observer)
            .build();
        let mut live = Vec::new();
        for step in steps {
            let before = pool.stats().bytes_reserved;
            match step {
                Step::Allocate(size) => {
                    if let Ok(b) = pool.allocate(size) {
                        live.push((b, size));
                    }
                    if let Some(limit) = pool.limit() {
                        let after = pool.stats().bytes_reserved;
                        assert!(after <= limit || after <= before, "{after} > {limit}, {before}");
                    }
                }
                Step::Release(i) if !live.is_empty() => {
                    let (b, size) = live.swap_remove(i % live.len());
                    put(&mut pool, b, size);
                    assert!(pool.stats().bytes_reserved <= before);
                }
                Step::Release(_) => {}
                Step::SetLimit(limit) => {
                    pool.set_limit(limit);
                    let s = pool.stats();
                    if let Some(limit) = limit {
                        // Down to the limit, or to the bytes in use.
                        assert!(s.bytes_reserved <= limit.max(s.bytes_in_use));
                        assert!(s.bytes_reserved <= limit || s.blocks_cached == 0);
                    }
                }
                Step::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                Step::Trim => {
                    pool.trim();
                }
            }
            pool.validate();
            let s = pool.stats();
            let freed = seen
                .lock()
                .unwrap()
                .iter()
                .filter(|e| matches!(e, Event::Freed { .. }))
                .count() as u64;
            assert_eq!(freed, s.backing_deallocs);
            let classes = pool.class_stats().unwrap();
            let cached: usize = classes.iter().map(|c| c.bytes_cached).sum();
            let in_use: usize = classes.iter().map(|c| c.bytes_in_use).sum();
            assert_eq!((cached, in_use), (s.bytes_cached, s.bytes_in_use));
        }
        for (b, size) in live {
            put(&mut pool, b, size);
        }
        drop(pool);
        alloc.assert_all_freed();
    }
}

#[test]
fn a_run_time_fixed_capacity_never_reads_the_clock_and_a_timed_one_does() {
    use decaying_pool::testing::PanickingClock;
    for (policy, timed) in [
        (AnyPolicy::from(FixedCapacity::new(4)), false),
        (AnyPolicy::timed(FixedTime::default()), true),
    ] {
        let clock = PanickingClock::new(ManualClock::new());
        let mut pool = DecayingPool::builder(CheckingAllocator::new())
            .policy(policy)
            .clock(clock.clone())
            .build();
        let b = pool.allocate(64).unwrap();
        put(&mut pool, b, 64);
        pool.collect();
        assert_eq!(clock.switch().calls() > 0, timed);
    }
}

#[test]
fn any_stats_display_without_panicking() {
    let s = stats! {
        hits: u64::MAX,
        misses: u64::MAX,
        bytes_from_pool: usize::MAX,
        bytes_from_backing: usize::MAX,
        bytes_reserved: usize::MAX,
    };
    let text = s.to_string();
    assert!(text.contains("allocations: 18446744073709551615"), "{text}");
    assert!(text.contains("16.00 EiB"), "{text}");
    assert_eq!(s.hit_rate(), 0.5);
}
