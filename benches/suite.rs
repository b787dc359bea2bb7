//! The pool's costs off the hit path, one criterion group each (the hit
//! round trip against a map of vectors is `benches/hit_path.rs`, the
//! `SharedPool` round trip `benches/shared_pool.rs`, the packed round trip
//! `benches/packing.rs`, the bookkeeping per cached block
//! `examples/metadata.rs`; `benches/README.md` lists them all):
//!
//! - `miss_path`: allocate + release that always misses, against the
//!   backing allocator called directly;
//! - `eviction`: `collect()` with nothing due, and the cost per evicted block;
//! - `scaling`: the hit round trip from 10 to 1 000 000 cached blocks;
//! - `mmap_64mib`: a real costly allocator, pooled against direct;
//! - `replay_throughput`: a real training trace through each policy, per
//!   event. It reads `cli/traces/training.csv` (the command-line tool's
//!   copy of the training trace, in the repository but not in the packaged
//!   library crate); when that file is absent the group prints a notice and
//!   measures nothing.
//!
//! ```text
//! cargo bench --bench suite
//! ```

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use decaying_pool::trace::{Event, Op, ReadOptions, TraceReader};
use decaying_pool::{
    Clock, DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, Packing, Policy,
    RawAllocator,
};

mod common;
use common::{Null, NullAddresses};

/// A time-to-live long enough that nothing decays during a benchmark.
const LONG: Duration = Duration::from_secs(3600);

/// A benchmark group with the suite's short settings (the whole `cargo
/// bench` must stay under 10 minutes on 2 cores).
fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_millis(1500));
    g
}

/// The next value of a fixed LCG (so every run draws the same numbers).
#[inline]
fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

/// `n` distinct pseudo-random sizes between 256 bytes and 16 MiB.
fn sizes(n: usize) -> Vec<usize> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut seen = std::collections::HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let s = 256 + (lcg(&mut x) as usize % (1 << 24));
        if seen.insert(s) {
            out.push(s);
        }
    }
    out
}

/// The order requests come in: a random walk over `classes` classes.
fn order(classes: usize, len: usize) -> Vec<usize> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len).map(|_| lcg(&mut x) as usize % classes).collect()
}

/// A pool over [`Null`] with `policy` and a clone of `clock`.
fn pool<P: Policy>(policy: P, clock: &ManualClock) -> DecayingPool<Null, P, ManualClock> {
    DecayingPool::builder(Null::default())
        .policy(policy)
        .clock(clock.clone())
        .build()
}

/// Caches `per` blocks of each of `sizes` in `pool`: allocates them all,
/// then releases them all.
fn fill<P: Policy, C: Clock>(pool: &mut DecayingPool<Null, P, C>, sizes: &[usize], per: usize) {
    let mut held = Vec::with_capacity(sizes.len() * per);
    for &s in sizes {
        for _ in 0..per {
            held.push((pool.allocate(s).unwrap(), s));
        }
    }
    for (b, s) in held {
        // SAFETY: each block came from this pool with this size.
        unsafe { pool.release(b, s) };
    }
}

/// `miss_path`: a round trip that always misses, against the direct call.
fn miss_path(c: &mut Criterion) {
    let mut g = group(c, "miss_path");
    let clock = ManualClock::new();

    let mut direct = Null::default();
    g.bench_function("null_direct", |b| {
        b.iter(|| {
            let block = direct.allocate(black_box(4096)).unwrap();
            // SAFETY: `block` came from `direct` with this size.
            unsafe { direct.deallocate(black_box(block), 4096) };
        })
    });

    let mut never = pool(FixedCapacity::new(0), &clock);
    g.bench_function("fixed_capacity_0", |b| {
        b.iter(|| {
            let block = never.allocate(black_box(4096)).unwrap();
            // SAFETY: `block` came from this pool with this size.
            unsafe { never.release(black_box(block), 4096) };
        })
    });
    assert_eq!(never.stats().hits, 0);

    // Each request a class not cached: the zero ttl frees the previous
    // block at the next call, so the cache stays one block deep while the
    // sizes cycle through 65 536 classes.
    let classes = sizes(1 << 16);
    let mut fresh = pool(FixedTime::new(Duration::ZERO), &clock);
    let mut i = 0;
    g.bench_function("fixed_time_new_class", |b| {
        b.iter(|| {
            let s = classes[i];
            i = (i + 1) % classes.len();
            let block = fresh.allocate(black_box(s)).unwrap();
            // SAFETY: `block` came from this pool with size `s`.
            unsafe { fresh.release(black_box(block), s) };
        })
    });
    assert_eq!(fresh.stats().hits, 0);

    // A full fixed table: every release of a new class displaces the
    // oldest block of its window.
    let mut full = pool(FixedCapacity::new(4096), &clock);
    fill(&mut full, &sizes(4096), 1);
    let mut i = 0;
    g.bench_function("fixed_capacity_displace", |b| {
        b.iter(|| {
            let s = classes[i];
            i = (i + 1) % classes.len();
            let block = full.allocate(black_box(s)).unwrap();
            // SAFETY: `block` came from this pool with size `s`.
            unsafe { full.release(black_box(block), s) };
        })
    });
    g.finish();
}

/// Times `collect()` on `pool` holding cached blocks none of which is due.
fn bench_collect_idle<P: Policy>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    mut pool: DecayingPool<Null, P, ManualClock>,
    sizes: &[usize],
    per: usize,
) {
    fill(&mut pool, sizes, per);
    let cached = pool.stats().blocks_cached;
    g.bench_function(BenchmarkId::new("collect_nothing_due", name), |b| {
        b.iter(|| black_box(pool.collect()))
    });
    assert_eq!(pool.stats().blocks_cached, cached, "{name}: evicted");
}

/// Times `collect()` evicting every one of `sizes.len() * per` blocks,
/// reported per block.
fn bench_evict_all<P: Policy + Clone>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    policy: P,
    sizes: &[usize],
    per: usize,
) {
    let n = sizes.len() * per;
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function(BenchmarkId::new("evict_per_block", name), |b| {
        b.iter_batched(
            || {
                let clock = ManualClock::new();
                let mut p = pool(policy.clone(), &clock);
                fill(&mut p, sizes, per);
                // Past any ttl, and a thousand half-lives.
                clock.advance(LONG * 1000);
                p
            },
            |mut p| {
                let evicted = p.collect();
                debug_assert_eq!(evicted, n);
                p
            },
            BatchSize::LargeInput,
        )
    });
}

/// `eviction`: `collect()` when nothing is due, and per evicted block.
fn eviction(c: &mut Criterion) {
    let mut g = group(c, "eviction");
    // 4096 cached blocks: 512 classes x 8.
    let (classes, per) = (sizes(512), 8);
    let clock = ManualClock::new();
    bench_collect_idle(
        &mut g,
        "fixed_time",
        pool(FixedTime::new(LONG), &clock),
        &classes,
        per,
    );
    bench_collect_idle(
        &mut g,
        "exponential",
        pool(Exponential::new(LONG), &clock),
        &classes,
        per,
    );

    // Check once that collect frees them all (the routine only
    // debug-asserts it).
    for evicted in [
        {
            let clock = ManualClock::new();
            let mut p = pool(FixedTime::new(LONG), &clock);
            fill(&mut p, &classes, per);
            clock.advance(LONG * 1000);
            p.collect()
        },
        {
            let clock = ManualClock::new();
            let mut p = pool(Exponential::new(LONG), &clock);
            fill(&mut p, &classes, per);
            clock.advance(LONG * 1000);
            p.collect()
        },
    ] {
        assert_eq!(evicted, classes.len() * per);
    }
    bench_evict_all(&mut g, "fixed_time", FixedTime::new(LONG), &classes, per);
    bench_evict_all(&mut g, "exponential", Exponential::new(LONG), &classes, per);
    g.finish();
}

/// `scaling`: the hit round trip (`FixedTime`, `ManualClock`) as the cache
/// grows from 10 to 1 000 000 blocks.
fn scaling(c: &mut Criterion) {
    let mut g = group(c, "scaling");
    for (classes, per) in [(1usize, 10usize), (100, 10), (10_000, 10), (100_000, 10)] {
        let blocks = classes * per;
        let sizes = sizes(classes);
        let walk = order(classes, 1 << 16);
        let clock = ManualClock::new();
        let mut p = pool(FixedTime::new(LONG), &clock);
        fill(&mut p, &sizes, per);
        let misses = p.stats().misses;
        let mut i = 0;
        g.bench_function(
            BenchmarkId::new(
                "fixed_time_manual",
                format!("{blocks}_blocks_{classes}_sizes"),
            ),
            |b| {
                b.iter(|| {
                    let s = sizes[walk[i]];
                    i = (i + 1) % walk.len();
                    let block = p.allocate(black_box(s)).unwrap();
                    // SAFETY: `block` came from this pool with size `s`.
                    unsafe { p.release(black_box(block), s) };
                })
            },
        );
        assert_eq!(p.stats().misses, misses, "a miss while measuring");
    }
    g.finish();
}

/// `mmap_64mib`: 64 MiB buffers from the mmap allocator, every page
/// touched, pooled against direct map-touch-unmap.
#[cfg(unix)]
fn mmap_64mib(c: &mut Criterion) {
    use core::ptr::NonNull;
    use decaying_pool::{MmapAllocator, MonotonicClock};

    /// The buffer's size.
    const SIZE: usize = 64 << 20;

    /// Writes one byte into every 4 KiB of the buffer at `p`.
    fn touch(p: NonNull<u8>) {
        for off in (0..SIZE).step_by(4096) {
            // SAFETY: `p` is a live writable mapping of `SIZE` bytes and
            // `off < SIZE`.
            unsafe { p.as_ptr().add(off).write_volatile(off as u8) };
        }
    }

    let mut g = group(c, "mmap_64mib");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(2));

    let mut pooled: DecayingPool<MmapAllocator, FixedTime, MonotonicClock> =
        DecayingPool::builder(MmapAllocator::new())
            .policy(FixedTime::new(Duration::from_secs(60)))
            .clock(MonotonicClock)
            .build();
    g.bench_function("pooled_fixed_time_60s", |b| {
        b.iter(|| {
            let p = pooled.allocate(SIZE).unwrap();
            touch(p);
            // SAFETY: `p` came from this pool with size `SIZE`.
            unsafe { pooled.release(p, SIZE) };
        })
    });
    // One mapping served every round trip (none when a filter skipped the
    // bench).
    assert!(pooled.stats().backing_allocs <= 1);

    let mut direct = MmapAllocator::new();
    g.bench_function("direct_map_unmap", |b| {
        b.iter(|| {
            let p = direct.allocate(SIZE).unwrap();
            touch(p);
            // SAFETY: `p` came from `direct` with size `SIZE`.
            unsafe { direct.deallocate(p, SIZE) };
        })
    });
    g.finish();
}

/// `mmap_64mib` needs mmap: nothing to measure elsewhere.
#[cfg(not(unix))]
fn mmap_64mib(_c: &mut Criterion) {
    println!("mmap_64mib: skipped (not unix)");
}

/// The training trace the command-line tool ships, relative to the crate
/// (absent from the packaged library crate: the group is skipped).
const TRACE: &str = "cli/traces/training.csv";

/// Replays `events` through `pool` (any pool, as a `RawAllocator`), the
/// clock set to each event's time.
fn replay_on<A: RawAllocator<Block = usize>>(pool: &mut A, clock: &ManualClock, events: &[Event])
where
    A::Error: core::fmt::Debug,
{
    let mut live: HashMap<u64, (usize, usize)> = HashMap::with_capacity(1024);
    for e in events {
        clock.set(e.time);
        let size = e.size as usize;
        match e.op {
            Op::Alloc => {
                let b = pool.allocate(size).unwrap();
                live.insert(e.addr, (b, size));
            }
            Op::Free => {
                if let Some((b, s)) = live.remove(&e.addr) {
                    // SAFETY: `b` came from this pool with size `s` and is
                    // released once.
                    unsafe { pool.deallocate(b, s) };
                }
            }
        }
    }
}

/// Replays `events` through a fresh pool with `policy`. Returns the pool's
/// hits.
fn replay<P: Policy>(policy: P, events: &[Event]) -> u64 {
    let clock = ManualClock::new();
    let mut p = pool(policy, &clock);
    replay_on(&mut p, &clock, events);
    p.stats().hits
}

/// Replays `events` through the packed pool (default `Packing` over
/// `FixedTime` 1 s, the replay tool's `packed`); its hits.
fn replay_packed(events: &[Event]) -> u64 {
    let clock = ManualClock::new();
    let mut p = DecayingPool::builder(NullAddresses::default())
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone())
        .packing(Packing::default())
        .build();
    replay_on(&mut p, &clock, events);
    p.stats().hits
}

/// `replay_throughput`: time per event replaying the training trace
/// through each policy; skipped with a notice when the trace is absent.
fn replay_throughput(c: &mut Criterion) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE);
    if !path.exists() {
        println!("replay_throughput: skipped, {} not found", path.display());
        return;
    }
    let opts = ReadOptions {
        lenient_frees: true,
        ..ReadOptions::default()
    };
    let events: Vec<Event> = TraceReader::open(&path, opts)
        .expect("open the trace")
        .collect::<Result<_, _>>()
        .expect("read the trace");

    let mut g = group(c, "replay_throughput");
    g.throughput(Throughput::Elements(events.len() as u64));
    g.bench_function("no_pool_null", |b| {
        b.iter(|| {
            let mut null = Null::default();
            let mut live: HashMap<u64, (usize, usize)> = HashMap::with_capacity(1024);
            for e in &events {
                match e.op {
                    Op::Alloc => {
                        let size = e.size as usize;
                        live.insert(e.addr, (null.allocate(size).unwrap(), size));
                    }
                    Op::Free => {
                        if let Some((b, s)) = live.remove(&e.addr) {
                            // SAFETY: `b` came from `null` with size `s`.
                            unsafe { null.deallocate(b, s) };
                        }
                    }
                }
            }
        })
    });
    let ms = Duration::from_millis;
    g.bench_function("fixed_time_100ms", |b| {
        b.iter(|| replay(FixedTime::new(ms(100)), black_box(&events)))
    });
    g.bench_function("exponential_100ms", |b| {
        b.iter(|| replay(Exponential::new(ms(100)), black_box(&events)))
    });
    g.bench_function("fixed_capacity_256", |b| {
        b.iter(|| replay(FixedCapacity::new(256), black_box(&events)))
    });
    // The packed pool (default `Packing` over `FixedTime` 1 s, the replay
    // tool's `packed`): segments come and go with the trace.
    g.bench_function("packed_fixed_time_1s", |b| {
        b.iter(|| replay_packed(black_box(&events)))
    });
    g.finish();
}

criterion_group!(
    benches,
    miss_path,
    eviction,
    scaling,
    mmap_64mib,
    replay_throughput
);
criterion_main!(benches);
