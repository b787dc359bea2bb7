//! The mapped round trip: allocate + release of medium and large requests
//! through the `mapped` configuration (a pool that keeps no block of its
//! own over `pages::Mapped` on the modelled page backend), in steady state,
//! with 16, 256 and 4096 blocks held, beside the exact pool's hit. The
//! mapped path is a best fit in the free extents (B-tree lookups), so it
//! grows with the logarithm of the extents; it makes no page call once the
//! pages are in place (the counts printed after each run say so).
//!
//! ```text
//! cargo bench --bench mapped
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use decaying_pool::pages::{Mapped, ModelPages};
use decaying_pool::{DecayingPool, FixedCapacity, FixedTime, ManualClock, Packing};

mod common;
use common::{NullAddresses, sizes};

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("mapped_round_trip");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for (scale, lo, hi) in [
        ("medium", (1 << 20) + 1, 32 << 20),
        ("large", 64 << 20, 512 << 20),
    ] {
        let walk = sizes(1 << 12, lo, hi, 0x2545_F491_4F6C_DD1D);
        for held in [16usize, 256, 4096] {
            let clock = ManualClock::new();
            let mapped = Mapped::with_clock(ModelPages::new(20 << 20).unwrap(), clock.clone());
            let mut pool = DecayingPool::builder(mapped)
                .policy(FixedCapacity::new(0))
                .clock(clock)
                .packing(Packing::mapped())
                .build();
            let keep: Vec<_> = walk
                .iter()
                .cycle()
                .take(held)
                .map(|&s| (pool.allocate(s).unwrap(), s))
                .collect();
            for &s in &walk {
                let b = pool.allocate(s).unwrap();
                // SAFETY: from this pool with this size, released once.
                unsafe { pool.release(b, s) };
            }
            let before = pool.pool().allocator().stats();
            let mut i = 0;
            g.bench_function(
                BenchmarkId::new(format!("mapped_{held}_held"), scale),
                |b| {
                    b.iter(|| {
                        let s = walk[i];
                        i = (i + 1) % walk.len();
                        let block = pool.allocate(black_box(s)).unwrap();
                        // SAFETY: from this pool with this size, released once.
                        unsafe { pool.release(black_box(block), s) };
                    })
                },
            );
            let after = pool.pool().allocator().stats();
            eprintln!(
                "mapped_{held}_held/{scale}: {} pages created, {} maps, {} unmaps while timed",
                after.pages_created - before.pages_created,
                after.maps - before.maps,
                after.unmaps - before.unmaps
            );
            for (b, s) in keep {
                // SAFETY: from this pool with this size, released once.
                unsafe { pool.release(b, s) };
            }
        }

        // The exact pool's hit over a 64-size walk, for scale.
        let exact_walk = &walk[..64];
        let mut exact = DecayingPool::builder(NullAddresses::default())
            .policy(FixedTime::new(Duration::from_secs(3600)))
            .clock(ManualClock::new())
            .build();
        for &s in exact_walk {
            let b = exact.allocate(s).unwrap();
            // SAFETY: from this pool with this size, released once.
            unsafe { exact.release(b, s) };
        }
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
    }
    g.finish();
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
