//! Hit round trip through `SharedPool` against the plain pool and against
//! the plain pool behind a `std::sync::Mutex`, uncontended and with two
//! threads hammering one pool, without and with thread caches
//! (`SharedPool::with_thread_caches`); the same over 64 classes drawn at
//! random (as many blocks as a thread's cache holds at first) and over
//! 256, on one thread and on two threads with as many classes each; and a
//! `stats` call on a pool with thread caches, which visits every thread's
//! cache.
//!
//! ```text
//! cargo bench --bench shared_pool
//! ```
//!
//! The run ends with the ratios side by side: each estimate over the plain
//! pool's from the same run (with two threads, wall time per operation;
//! over many classes, the plain pool's over the same classes).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use decaying_pool::{DecayingPool, FixedTime, ManualClock, SharedPool};

// (Its hand-written cache is the hit path benchmark's, not used here.)
#[allow(dead_code)]
#[path = "workload/mod.rs"]
mod workload;
use workload::{fill, order, sizes};

mod common;
use common::Null;
mod ratios;

fn pool() -> DecayingPool<Null, FixedTime, ManualClock> {
    DecayingPool::builder(Null::default())
        .policy(FixedTime::new(Duration::from_secs(3600)))
        .clock(ManualClock::new())
        .build()
}

/// A shared pool (`thread_caches`: with a cache per thread) with one
/// cached block of each of `classes`.
fn filled_shared(
    classes: &[usize],
    thread_caches: bool,
) -> SharedPool<Null, FixedTime, ManualClock> {
    let mut filled = pool();
    fill(&mut filled, classes, 1);
    if thread_caches {
        SharedPool::with_thread_caches(filled)
    } else {
        SharedPool::new(filled)
    }
}

fn shared_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("shared_hit_round_trip");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));

    let mut plain = pool();
    g.bench_function("plain_pool", |b| {
        b.iter(|| {
            let block = plain.allocate(black_box(4096)).unwrap();
            // SAFETY: from this pool with this size, released once.
            unsafe { plain.release(black_box(block), 4096) };
        })
    });

    // What a program would write without `SharedPool`: the plain pool
    // behind `std::sync::Mutex`, released by hand.
    let locked = std::sync::Mutex::new(pool());
    g.bench_function("mutex_pool_1_thread", |b| {
        b.iter(|| {
            let block = locked.lock().unwrap().allocate(black_box(4096)).unwrap();
            let block = black_box(block);
            // SAFETY: from this pool with this size, released once.
            unsafe { locked.lock().unwrap().release(block, 4096) };
        })
    });

    let shared = SharedPool::new(pool());
    g.bench_function("shared_pool_1_thread", |b| {
        b.iter(|| drop(black_box(shared.allocate(black_box(4096)).unwrap())))
    });

    // Two threads, each its own size class, on one pool: time per
    // operation = wall time / total operations.
    g.bench_function("shared_pool_2_threads", |b| {
        b.iter_custom(|iters| two_threads(&shared, iters))
    });

    // The same with a cache per thread in front of the shared one.
    let cached = SharedPool::with_thread_caches(pool());
    g.bench_function("thread_caches_1_thread", |b| {
        b.iter(|| drop(black_box(cached.allocate(black_box(4096)).unwrap())))
    });
    g.bench_function("thread_caches_2_threads", |b| {
        b.iter_custom(|iters| {
            let t = two_threads(&cached, iters);
            // The magazines of the threads that exited go back to the
            // shared cache and leave the pool's list (`with` flushes
            // them), untimed: else `thread_caches_stats` below would
            // visit one per thread every sample of this bench started.
            cached.with(|_| ());
            t
        })
    });
    // One thread over 64 classes, one block each, drawn at random (as
    // many blocks as a thread cache holds at first), and over 256 (more);
    // then two threads, each over as many classes of its own, one block
    // each, in the same random order: time per operation = wall time /
    // total operations, against one thread over as many classes of the
    // plain pool.
    for n in [64, 256] {
        let classes = sizes(n);
        let walk = order(classes.len(), 4096);
        let mut plain = pool();
        fill(&mut plain, &classes, 1);
        let mut i = 0;
        g.bench_function(format!("plain_pool_{n}_classes"), |b| {
            b.iter(|| {
                let s = classes[walk[i]];
                i = (i + 1) % walk.len();
                let block = plain.allocate(black_box(s)).unwrap();
                // SAFETY: from this pool with this size, released once.
                unsafe { plain.release(black_box(block), s) };
            })
        });
        for (name, thread_caches) in [("shared_pool", false), ("thread_caches", true)] {
            let name = format!("{name}_{n}_classes");
            let shared = filled_shared(&classes, thread_caches);
            let mut i = 0;
            g.bench_function(&name, |b| {
                b.iter(|| {
                    let s = classes[walk[i]];
                    i = (i + 1) % walk.len();
                    drop(black_box(shared.allocate(black_box(s)).unwrap()))
                })
            });
            assert_eq!(
                shared.stats().misses,
                n as u64,
                "{name}: every round trip hits"
            );
        }
        let both = sizes(2 * n);
        for (name, thread_caches) in [("shared_pool", false), ("thread_caches", true)] {
            let name = format!("{name}_{n}_classes_2_threads");
            let shared = filled_shared(&both, thread_caches);
            let size = |thread: usize, k: usize| both[thread * n + walk[k % walk.len()]];
            g.bench_function(&name, |b| {
                b.iter_custom(|iters| {
                    let t = two_threads_with(&shared, iters, size);
                    // The magazines of the threads that exited go back to
                    // the shared cache (`with` puts them there), untimed.
                    shared.with(|_| ());
                    t
                })
            });
            assert_eq!(
                shared.stats().misses,
                2 * n as u64,
                "{name}: every round trip hits"
            );
        }
    }

    // What the owners' lock-free path costs the calls that visit every
    // magazine (on Linux, one `membarrier` system call each). This thread
    // has a magazine (with one block) whichever benches ran before.
    drop(cached.allocate(4096).unwrap());
    g.bench_function("thread_caches_stats", |b| {
        b.iter(|| black_box(cached.stats()))
    });
    g.finish();
}

/// Two threads doing `iters` round trips in all, each its own size class:
/// the wall time per operation, scaled to `iters`.
fn two_threads(shared: &SharedPool<Null, FixedTime, ManualClock>, iters: u64) -> Duration {
    two_threads_with(shared, iters, |thread, _| 4096 + thread)
}

/// Two threads doing `iters` round trips in all, the `k`-th of thread `t`
/// of `size(t, k)` bytes: the wall time per operation, scaled to `iters`.
fn two_threads_with(
    shared: &SharedPool<Null, FixedTime, ManualClock>,
    iters: u64,
    size: impl Fn(usize, usize) -> usize + Sync,
) -> Duration {
    let start = Barrier::new(2);
    let per_thread = iters.div_ceil(2);
    let t = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|i| {
                let (start, size) = (&start, &size);
                s.spawn(move || {
                    start.wait();
                    let t = Instant::now();
                    for k in 0..per_thread {
                        let s = size(i, k as usize);
                        drop(black_box(shared.allocate(black_box(s)).unwrap()));
                    }
                    t.elapsed()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .max()
            .unwrap()
    });
    t.mul_f64(iters as f64 / (2 * per_thread) as f64)
}

criterion_group!(benches, shared_pool);

fn main() {
    let started = std::time::SystemTime::now();
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratios::Table {
        title: "hit round trip: ratio to",
        baseline: ("plain DecayingPool", "shared_hit_round_trip/plain_pool"),
        rows: &[
            ("std::sync::Mutex", "shared_hit_round_trip/mutex_pool_{}"),
            ("SharedPool::new", "shared_hit_round_trip/shared_pool_{}"),
            (
                "with_thread_caches",
                "shared_hit_round_trip/thread_caches_{}",
            ),
        ],
        columns: &["1_thread", "2_threads"],
    }
    .print(started);
    ratios::Table {
        title: "64 classes (a thread): ratio to",
        baseline: (
            "plain DecayingPool",
            "shared_hit_round_trip/plain_pool_64_classes",
        ),
        rows: &[
            ("SharedPool::new", "shared_hit_round_trip/shared_pool_{}"),
            (
                "with_thread_caches",
                "shared_hit_round_trip/thread_caches_{}",
            ),
        ],
        columns: &["64_classes", "64_classes_2_threads"],
    }
    .print(started);
    ratios::Table {
        title: "256 classes (a thread): ratio to",
        baseline: (
            "plain DecayingPool",
            "shared_hit_round_trip/plain_pool_256_classes",
        ),
        rows: &[
            ("SharedPool::new", "shared_hit_round_trip/shared_pool_{}"),
            (
                "with_thread_caches",
                "shared_hit_round_trip/thread_caches_{}",
            ),
        ],
        columns: &["256_classes", "256_classes_2_threads"],
    }
    .print(started);
}
