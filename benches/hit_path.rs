//! Hit round trip (allocate + release of a cached class) of the pool
//! against a hand-written `hashbrown` map-of-vectors cache, at several
//! scales, in one run; and batches (allocate 16, then release them).
//!
//! ```text
//! cargo bench --bench hit_path
//! ```
//!
//! The run ends with the ratios side by side: each policy's estimate over
//! the map of vectors' from the same run.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group};
use decaying_pool::{
    Clock, DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, MonotonicClock, Policy,
};

mod common;
use common::Null;
mod ratios;
mod workload;
use workload::{HandWritten, fill, order, sizes};

fn bench_pool<P: Policy, C: Clock>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    scale: &str,
    mut pool: DecayingPool<Null, P, C>,
    sizes: &[usize],
    per: usize,
    walk: &[usize],
) {
    fill(&mut pool, sizes, per);
    let filled = pool.stats().misses;
    let mut i = 0;
    c.bench_function(BenchmarkId::new(name, scale), |b| {
        b.iter(|| {
            let s = sizes[walk[i]];
            i = (i + 1) % walk.len();
            let block = pool.allocate(black_box(s)).unwrap();
            // SAFETY: `block` came from this pool with size `s`.
            unsafe { pool.release(black_box(block), s) };
        })
    });
    // Every measured round trip was a hit (the fixed table may displace a
    // few blocks whose windows collided while filling).
    let s = pool.stats();
    assert!(
        s.misses - filled <= filled / 100,
        "{name} {scale}: {} misses while measuring",
        s.misses - filled
    );
}

fn hit_round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("hit_round_trip");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    let ttl = Duration::from_secs(3600);
    for (classes, per) in [(64usize, 1usize), (4096, 4), (100_000, 2)] {
        let scale = format!("{classes}x{per}");
        let sizes = sizes(classes);
        let walk = order(sizes.len(), 1 << 16);

        let mut hand = HandWritten::filled(&sizes, per);
        let mut i = 0;
        g.bench_function(BenchmarkId::new("hashbrown_map_of_vecs", &scale), |b| {
            b.iter(|| {
                let s = sizes[walk[i]];
                i = (i + 1) % walk.len();
                let block = hand.allocate(black_box(s));
                hand.release(black_box(block), s);
            })
        });

        let manual = ManualClock::new();
        let build = |p| DecayingPool::builder(Null::default()).policy(p);
        bench_pool(
            &mut g,
            "fixed_time_manual",
            &scale,
            build(FixedTime::new(ttl)).clock(manual.clone()).build(),
            &sizes,
            per,
            &walk,
        );
        bench_pool(
            &mut g,
            "fixed_time_monotonic",
            &scale,
            build(FixedTime::new(ttl)).clock(MonotonicClock).build(),
            &sizes,
            per,
            &walk,
        );
        bench_pool(
            &mut g,
            "exponential_manual",
            &scale,
            DecayingPool::builder(Null::default())
                .policy(Exponential::new(ttl))
                .clock(manual.clone())
                .build(),
            &sizes,
            per,
            &walk,
        );
        bench_pool(
            &mut g,
            "exponential_monotonic",
            &scale,
            DecayingPool::builder(Null::default())
                .policy(Exponential::new(ttl))
                .clock(MonotonicClock)
                .build(),
            &sizes,
            per,
            &walk,
        );
        bench_pool(
            &mut g,
            "fixed_capacity",
            &scale,
            DecayingPool::builder(Null::default())
                .policy(FixedCapacity::new(sizes.len() * per * 4))
                .build(),
            &sizes,
            per,
            &walk,
        );
    }
    g.finish();
}

/// Batches: allocate 16 blocks (classes drawn at random among 8 classes of
/// 16 cached blocks), then release them; time per block (one allocate and
/// one release).
fn batch_round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch_round_trip");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    const BATCH: usize = 16;
    g.throughput(criterion::Throughput::Elements(BATCH as u64));
    let (classes, per) = (8usize, 16usize);
    let sizes = sizes(classes);
    let walk = order(sizes.len(), 1 << 16);

    let mut hand = HandWritten::filled(&sizes, per);
    let mut held = [(0usize, 0usize); BATCH];
    let mut i = 0;
    g.bench_function("hashbrown_map_of_vecs/8x16", |b| {
        b.iter(|| {
            for slot in held.iter_mut() {
                let s = sizes[walk[i]];
                i = (i + 1) % walk.len();
                *slot = (hand.allocate(black_box(s)), s);
            }
            for &(block, s) in &held {
                hand.release(black_box(block), s);
            }
        })
    });

    let ttl = Duration::from_secs(3600);
    batch_pool(
        &mut g,
        "fixed_time_manual/8x16",
        FixedTime::new(ttl),
        &sizes,
        per,
        &walk,
    );
    batch_pool(
        &mut g,
        "exponential_manual/8x16",
        Exponential::new(ttl),
        &sizes,
        per,
        &walk,
    );
    // Four slots per cached block, as in `hit_round_trip`, and a window
    // that holds a class's 16 blocks.
    batch_pool(
        &mut g,
        "fixed_capacity/8x16",
        FixedCapacity::new(classes * per * 4).per_size(per),
        &sizes,
        per,
        &walk,
    );
    g.finish();
}

/// One pool's batches (see `batch_round_trip`).
fn batch_pool<P: Policy>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    policy: P,
    sizes: &[usize],
    per: usize,
    walk: &[usize],
) {
    const BATCH: usize = 16;
    let mut held = [(0usize, 0usize); BATCH];
    let mut i = 0;
    let mut pool = DecayingPool::builder(Null::default())
        .policy(policy)
        .clock(ManualClock::new())
        .build();
    fill(&mut pool, sizes, per);
    let filled = pool.stats().misses;
    g.bench_function(name, |b| {
        b.iter(|| {
            for slot in held.iter_mut() {
                let s = sizes[walk[i]];
                i = (i + 1) % walk.len();
                *slot = (pool.allocate(black_box(s)).unwrap(), s);
            }
            for &(block, s) in &held {
                // SAFETY: `block` came from this pool with size `s`.
                unsafe { pool.release(black_box(block), s) };
            }
        })
    });
    assert_eq!(pool.stats().misses, filled, "{name}: a batch missed");
}

criterion_group!(benches, hit_round_trip, batch_round_trip);

fn main() {
    let started = std::time::SystemTime::now();
    benches();
    Criterion::default().configure_from_args().final_summary();
    let map = "hashbrown_map_of_vecs";
    ratios::Table {
        title: "hit round trip: ratio to",
        baseline: (map, "hit_round_trip/hashbrown_map_of_vecs/{}"),
        rows: &[
            ("fixed_time_manual", "hit_round_trip/fixed_time_manual/{}"),
            (
                "fixed_time_monotonic",
                "hit_round_trip/fixed_time_monotonic/{}",
            ),
            ("exponential_manual", "hit_round_trip/exponential_manual/{}"),
            (
                "exponential_monotonic",
                "hit_round_trip/exponential_monotonic/{}",
            ),
            ("fixed_capacity", "hit_round_trip/fixed_capacity/{}"),
        ],
        columns: &["64x1", "4096x4", "100000x2"],
    }
    .print(started);
    ratios::Table {
        title: "batch: ratio to",
        baseline: (map, "batch_round_trip/hashbrown_map_of_vecs_{}"),
        rows: &[
            ("fixed_time_manual", "batch_round_trip/fixed_time_manual_{}"),
            (
                "exponential_manual",
                "batch_round_trip/exponential_manual_{}",
            ),
            ("fixed_capacity", "batch_round_trip/fixed_capacity_{}"),
        ],
        columns: &["8x16"],
    }
    .print(started);
}
