//! The cost of a release that fills a new class: nanoseconds per release
//! while 1 000 000 blocks, allocated first, are released into an empty
//! pool as classes of 2 to 34 blocks (the fastest of seven runs of each;
//! `FixedTime`, `ManualClock`, over a backing allocator that does
//! nothing). Each class's bucket is added and its ring grows as its
//! blocks come in: the work that the hit round trips' tables leave out.
//!
//! ```text
//! cargo run --release --example fill
//! ```

use std::time::{Duration, Instant};

use decaying_pool::{DecayingPool, FixedTime, ManualClock};

// The benchmarks' backing allocator that does nothing.
#[path = "../benches/common/mod.rs"]
mod common;
use common::Null;

/// Blocks in every run.
const BLOCKS: usize = 1_000_000;

fn main() {
    println!("{BLOCKS} blocks released into an empty pool; ns per release (fastest of 7)");
    for per in [2, 5, 7, 9, 34] {
        let classes = BLOCKS / per;
        let sizes: Vec<usize> = (0..classes)
            .flat_map(|c| std::iter::repeat_n(256 + c * 16, per))
            .collect();
        let mut best = f64::MAX;
        for _ in 0..7 {
            let mut pool = DecayingPool::builder(Null::default())
                .policy(FixedTime::new(Duration::from_secs(1 << 30)))
                .clock(ManualClock::new())
                .build();
            let held: Vec<(usize, usize)> = sizes
                .iter()
                .map(|&s| (pool.allocate(s).unwrap(), s))
                .collect();
            let start = Instant::now();
            for (block, size) in held {
                // SAFETY: each block came from this pool with this size.
                unsafe { pool.release(block, size) };
            }
            let ns = start.elapsed().as_secs_f64() * 1e9 / sizes.len() as f64;
            best = best.min(ns);
            assert_eq!(pool.stats().blocks_cached, sizes.len() as u64);
        }
        println!("{classes:>7} classes x {per:<2} {best:>7.1}");
    }
}
