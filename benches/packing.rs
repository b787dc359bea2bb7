//! The packed allocate + release round trip, in steady state (a working set
//! of blocks held, so segments never empty), against the exact pool's hit
//! round trip and against the sub-allocator alone (`offset-allocator`'s
//! allocate + free, in granularity units, as the layer calls it).
//!
//! ```text
//! cargo bench --bench packing
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use decaying_pool::{
    Clock, DecayingPool, FixedTime, ManualClock, MonotonicClock, PackedPool, Packing, Policy,
};

mod common;
use common::{NullAddresses, sizes};

const TTL: Duration = Duration::from_secs(3600);

fn packed<C: Clock>(clock: C) -> PackedPool<NullAddresses, FixedTime, C> {
    DecayingPool::builder(NullAddresses::default())
        .policy(FixedTime::new(TTL))
        .clock(clock)
        .packing(Packing::default())
        .build()
}

/// Holds `held` blocks of the walk's sizes (so segments stay in use), then
/// times allocate + release of the walk's next size.
fn bench_packed<P: Policy, C: Clock>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    param: &str,
    mut pool: PackedPool<NullAddresses, P, C>,
    walk: &[usize],
    held: usize,
) {
    let keep: Vec<_> = walk
        .iter()
        .take(held)
        .map(|&s| (pool.allocate(s).unwrap(), s))
        .collect();
    // Warm every size once, so the segments the walk needs exist.
    for &s in walk {
        let b = pool.allocate(s).unwrap();
        // SAFETY: from this pool with this size, released once.
        unsafe { pool.release(b, s) };
    }
    let segments = pool.packing_stats().segments_created;
    let mut i = 0;
    let mut n = 0u64;
    g.bench_function(BenchmarkId::new(name, param), |b| {
        b.iter(|| {
            let s = walk[i];
            i = (i + 1) % walk.len();
            n += 1;
            let block = pool.allocate(black_box(s)).unwrap();
            // SAFETY: from this pool with this size, released once.
            unsafe { pool.release(black_box(block), s) };
        })
    });
    // How often a round trip had to make a segment (from the exact pool's
    // cache, mostly: one that emptied on the previous release).
    let st = pool.packing_stats();
    let made = st.segments_created - segments;
    eprintln!(
        "{name}/{param}: a segment made in {:.1}% of {n} round trips",
        100.0 * made as f64 / n.max(1) as f64
    );
    assert_eq!(st.exact + st.exact_fallbacks, 0, "{name}: all carved");
    for (b, s) in keep {
        // SAFETY: from this pool with this size, released once.
        unsafe { pool.release(b, s) };
    }
}

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("packing_round_trip");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    let granularity = Packing::default().granularity;

    // Sizes drawn at random among small requests, among medium ones (whose
    // holes often miss the next size: a segment comes and goes), and one
    // medium size over and over.
    for (scale, lo, hi) in [
        ("small", 64usize, 1 << 20),
        ("medium", (1 << 20) + 1, 32 << 20),
        ("medium_one_size", 3 << 20, (3 << 20) + 1),
    ] {
        let walk = sizes(1 << 12, lo, hi, 0x2545_F491_4F6C_DD1D);

        // The exact pool's hit: one cached block per size of a 64-size walk.
        let exact_walk = &walk[..64];
        let mut exact = DecayingPool::builder(NullAddresses::default())
            .policy(FixedTime::new(TTL))
            .clock(ManualClock::new())
            .build();
        for &s in exact_walk {
            let b = exact.allocate(s).unwrap();
            // SAFETY: from this pool with this size, released once.
            unsafe { exact.release(b, s) };
        }
        let misses = exact.stats().misses;
        let mut i = 0;
        g.bench_function(BenchmarkId::new("exact_pool_hit", scale), |b| {
            b.iter(|| {
                let s = exact_walk[i];
                i = (i + 1) % exact_walk.len();
                let block = exact.allocate(black_box(s)).unwrap();
                // SAFETY: from this pool with this size, released once.
                unsafe { exact.release(black_box(block), s) };
            })
        });
        assert_eq!(exact.stats().misses, misses, "an exact round trip missed");

        // The packed round trip, 64 blocks held.
        bench_packed(
            &mut g,
            "packed_manual_clock",
            scale,
            packed(ManualClock::new()),
            &walk,
            64,
        );
        bench_packed(
            &mut g,
            "packed_monotonic_clock",
            scale,
            packed(MonotonicClock),
            &walk,
            64,
        );

        // The sub-allocator alone: one segment's allocator with 64 ranges
        // held, allocate + free of the same sizes in units.
        let units: Vec<u32> = walk
            .iter()
            .map(|&s| s.div_ceil(granularity) as u32)
            .collect();
        let total: u32 = units.iter().take(64).sum::<u32>() * 4;
        let mut sub: offset_allocator::Allocator =
            offset_allocator::Allocator::new(total.max(1 << 16));
        let keep: Vec<_> = units
            .iter()
            .take(64)
            .map(|&u| sub.allocate(u).unwrap())
            .collect();
        let mut i = 0;
        g.bench_function(BenchmarkId::new("offset_allocator_alone", scale), |b| {
            b.iter(|| {
                let u = units[i];
                i = (i + 1) % units.len();
                let a = sub.allocate(black_box(u)).unwrap();
                sub.free(black_box(a));
            })
        });
        for a in keep {
            sub.free(a);
        }
    }

    // Nothing held: each release empties the block's segment, which goes
    // back to the exact pool, and each allocate makes a segment again (an
    // exact-pool hit and a sub-allocator): what a segment coming and going
    // costs. One size (its emptied sub-allocator is reused) and eight
    // medium sizes in turn, whose segments differ in size (a fresh
    // sub-allocator each time).
    let mib = 1usize << 20;
    let churn: [(&str, &[usize]); 3] = [
        ("small", &[4096]),
        ("medium", &[3 * mib]),
        (
            "medium_8_sizes",
            &[
                3 * mib,
                5 * mib,
                9 * mib,
                13 * mib,
                17 * mib,
                25 * mib,
                33 * mib,
                48 * mib,
            ],
        ),
    ];
    for (scale, walk) in churn {
        bench_packed(
            &mut g,
            "packed_segment_churn",
            scale,
            packed(ManualClock::new()),
            walk,
            0,
        );
    }

    // An exact block through the packing layer (above the medium
    // threshold): the layer's overhead on the exact path.
    let big = sizes(64, (64 << 20) + 1, 1 << 30, 0x9E37_79B9_7F4A_7C15);
    let mut pool = packed(ManualClock::new());
    for &s in &big {
        let b = pool.allocate(s).unwrap();
        // SAFETY: from this pool with this size, released once.
        unsafe { pool.release(b, s) };
    }
    let mut i = 0;
    g.bench_function(BenchmarkId::new("packed_exact_hit", "large"), |b| {
        b.iter(|| {
            let s = big[i];
            i = (i + 1) % big.len();
            let block = pool.allocate(black_box(s)).unwrap();
            // SAFETY: from this pool with this size, released once.
            unsafe { pool.release(black_box(block), s) };
        })
    });
    g.finish();
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
