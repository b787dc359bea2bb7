//! A downstream crate's view of the pool: a host tensor cache built only on
//! the public API, as a tensor library would adopt it.
//!
//! Each section exercises one thing such a crate needs; run it with
//! `cargo run --example downstream` (it also runs under `cargo test`).

use core::time::Duration;
use std::sync::{Arc, Mutex};
use std::thread;

use decaying_pool::{
    DecayingPool, Exponential, FixedCapacity, FixedTime, LocalPool, SharedPool, SystemAllocator,
};

// ---------------------------------------------------------------------------
// Host pools cross threads: a `Send + Sync` device type holding a pool.

/// What a tensor library's "host device" looks like: shared by every thread.
struct HostDevice {
    pool: Mutex<DecayingPool<SystemAllocator, Exponential>>,
}

fn host_pools_are_send() {
    let device = Arc::new(HostDevice {
        pool: Mutex::new(DecayingPool::new(
            SystemAllocator::new(),
            Exponential::half_life(Duration::from_secs(5)),
        )),
    });
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let device = Arc::clone(&device);
            thread::spawn(move || {
                let mut pool = device.pool.lock().unwrap();
                let block = pool.allocate(1 << 16).unwrap();
                // SAFETY: `block` came from this pool with this size and is not used again.
                unsafe { pool.release(block, 1 << 16) };
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let s = device.pool.lock().unwrap().stats();
    assert_eq!((s.misses, s.hits), (1, 3));

    // A stacked host pool behind a `SharedPool`, with a reaper thread.
    let inner = DecayingPool::new(
        SystemAllocator::new(),
        FixedTime::new(Duration::from_secs(60)),
    );
    let shared = SharedPool::new(DecayingPool::new(
        inner,
        FixedTime::new(Duration::from_secs(1)),
    ));
    let reaper = shared.spawn_reaper(Duration::from_millis(100));
    drop(shared.allocate(4096).unwrap());
    drop(reaper);
    println!("host pools are Send: {}", shared.stats().blocks_cached);
}

// ---------------------------------------------------------------------------
// Safe handles for one thread: blocks release themselves, byte views.

fn local_handles() {
    let pool = LocalPool::new(DecayingPool::new(
        SystemAllocator::new(),
        FixedCapacity::new(256).per_size(32),
    ));
    let mut tensors: Vec<_> = (0..24).map(|_| pool.allocate(4 << 10).unwrap()).collect();
    for (i, t) in tensors.iter_mut().enumerate() {
        t.fill(i as u8);
    }
    drop(tensors); // 24 same-size buffers, all cached (per_size 32)
    let s = pool.stats();
    assert_eq!((s.blocks_cached, s.evictions), (24, 0));
    // A hit hands back the previous user's bytes: initialise before reading.
    let mut again = pool.allocate(4 << 10).unwrap();
    let bytes = again.fill(0);
    assert!(bytes.iter().all(|&b| b == 0));
    println!("local handles: {} hits", pool.stats().hits);
}

fn main() {
    host_pools_are_send();
    local_handles();
}
