//! A threaded program records its own requests, and the replay says what
//! every pool configuration would have cost on them.
//!
//! Four threads share a packed pool over `mmap` (a host tensor library's
//! shape: buffers of 1 KiB to 8 MiB whose sizes change from step to step)
//! and log every request through one `trace::RequestLog`:
//!
//! ```sh
//! cargo run --release --features trace --example record_threads -- threads.csv
//! cargo run --release -p decaying-pool-cli -- replay threads.csv
//! ```

use std::time::Duration;

use decaying_pool::trace::RequestLog;
use decaying_pool::{DecayingPool, FixedTime, MmapAllocator, Packing, SharedPool};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "threads.csv".into());
    let log = RequestLog::create(&path)?;
    let mut pool = DecayingPool::builder(MmapAllocator::new())
        .policy(FixedTime::new(Duration::from_millis(200)))
        .packing(Packing::default())
        .build();
    pool.log_requests(log.sink()); // the one line that records
    let pool = SharedPool::packed(pool);
    let _reaper = pool.spawn_reaper(Duration::from_millis(50));

    std::thread::scope(|s| {
        for t in 0..4u64 {
            let pool = pool.clone();
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ t;
                for step in 0..50 {
                    // A step's buffers: a few of changing size, held together.
                    let held: Vec<_> = (0..6)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let size = 1024 << (x % 14); // 1 KiB .. 8 MiB
                            let mut b = pool.allocate(size + (step % 3) * 4096).unwrap();
                            b.fill(0);
                            b
                        })
                        .collect();
                    std::thread::sleep(Duration::from_millis(2));
                    drop(held);
                }
            });
        }
    });
    log.finish()?;
    let s = pool.stats();
    println!(
        "{} requests ({} hits, {} misses) logged to {path}: {} events",
        s.hits + s.misses,
        s.hits,
        s.misses,
        log.events()
    );
    println!("replay them: cargo run --release -p decaying-pool-cli -- replay {path}");
    Ok(())
}
