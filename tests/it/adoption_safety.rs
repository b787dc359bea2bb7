//! Tests: host pools cross threads (`Send`), and `SharedPool` over them,
//! stacked ones included, is `Send + Sync` and gets a reaper.

use core::time::Duration;
use std::sync::Mutex;
use std::thread;

#[cfg(unix)]
use decaying_pool::MmapAllocator;
use decaying_pool::{
    DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, SharedPool, SystemAllocator,
};

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}

#[test]
fn host_pools_are_send() {
    assert_send::<DecayingPool<SystemAllocator>>();
    assert_send::<DecayingPool<SystemAllocator, Exponential, ManualClock>>();
    assert_send::<DecayingPool<SystemAllocator, FixedCapacity>>();
    #[cfg(unix)]
    assert_send::<DecayingPool<MmapAllocator>>();
    assert_send::<DecayingPool<DecayingPool<SystemAllocator>>>();
    // What a downstream device type does: a pool in a `Mutex`, shared.
    assert_send::<Mutex<DecayingPool<SystemAllocator>>>();
    assert_sync::<Mutex<DecayingPool<SystemAllocator>>>();
}

#[test]
fn shared_pools_over_host_pools_are_send_and_sync() {
    assert_send::<SharedPool<SystemAllocator>>();
    assert_sync::<SharedPool<SystemAllocator>>();
    #[cfg(unix)]
    {
        assert_send::<SharedPool<MmapAllocator>>();
        assert_sync::<SharedPool<MmapAllocator>>();
    }
    assert_send::<SharedPool<DecayingPool<SystemAllocator>>>();
    assert_sync::<SharedPool<DecayingPool<SystemAllocator>>>();
}

#[test]
fn a_host_pool_moves_to_another_thread_and_back() {
    let mut pool = DecayingPool::new(SystemAllocator::new(), FixedTime::new(Duration::from_secs(60)));
    let b = pool.allocate(4096).unwrap();
    // SAFETY: `b` came from this pool with this size and is not used again.
    unsafe { pool.release(b, 4096) };
    let addr = b.as_ptr() as usize;
    let mut pool = thread::spawn(move || {
        let again = pool.allocate(4096).unwrap();
        assert_eq!(again.as_ptr() as usize, addr, "the block cached on the first thread is a hit here");
        // SAFETY: as above.
        unsafe { pool.release(again, 4096) };
        pool
    })
    .join()
    .unwrap();
    assert_eq!((pool.stats().hits, pool.stats().misses), (1, 1));
    assert_eq!(pool.trim(), 4096);
}

#[test]
fn a_stacked_host_pool_gets_a_reaper() {
    let clock = ManualClock::new();
    let inner = DecayingPool::builder(SystemAllocator::new())
        .policy(FixedTime::new(Duration::from_secs(600)))
        .build();
    let outer = DecayingPool::builder(inner)
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone())
        .build();
    let shared = SharedPool::new(outer);
    let reaper = shared.spawn_reaper(Duration::from_millis(1));
    {
        let block = shared.allocate(1 << 16).unwrap();
        drop(block);
    }
    assert_eq!(shared.stats().blocks_cached, 1);
    clock.advance(Duration::from_secs(1));
    // The reaper frees the idle block into the inner pool, whose cache now
    // holds it.
    let mut spins = 0;
    while shared.stats().blocks_cached != 0 {
        thread::sleep(Duration::from_millis(1));
        spins += 1;
        assert!(spins < 10_000, "the reaper never collected");
    }
    let inner_cached = shared.with(|p| p.allocator().stats().blocks_cached);
    assert_eq!(inner_cached, 1);
    drop(reaper);
}
