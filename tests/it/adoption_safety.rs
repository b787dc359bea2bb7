//! Tests: host pools cross threads (`Send`), and `SharedPool` over them,
//! stacked ones included, is `Send + Sync` and gets a reaper.

use crate::support::assert_send;
use core::time::Duration;
use std::sync::Mutex;
use std::thread;

#[cfg(unix)]
use decaying_pool::MmapAllocator;
use decaying_pool::{
    DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, SharedPool, SystemAllocator,
};

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
    let mut pool = DecayingPool::new(
        SystemAllocator::new(),
        FixedTime::new(Duration::from_secs(60)),
    );
    let b = pool.allocate(4096).unwrap();
    // SAFETY: `b` came from this pool with this size and is not used again.
    unsafe { pool.release(b, 4096) };
    let addr = b.as_ptr() as usize;
    let mut pool = thread::spawn(move || {
        let again = pool.allocate(4096).unwrap();
        assert_eq!(
            again.as_ptr() as usize,
            addr,
            "the block cached on the first thread is a hit here"
        );
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
    // The reaper frees outside the cache lock: stopping it (a join) lets
    // a free that the outer count no longer shows reach the inner pool.
    drop(reaper);
    let inner_cached = shared.with(|p| p.allocator().stats().blocks_cached);
    assert_eq!(inner_cached, 1);
}

// ---------------------------------------------------------------------------
// A custom policy whose `deadline` disagrees with `must_evict`.

/// Frees a block idle for a second, but claims nothing is due for an hour.
/// (Only debug builds check a deadline against `must_evict`.)
#[cfg(debug_assertions)]
struct LateDeadline;

#[cfg(debug_assertions)]
impl decaying_pool::policy::EvictionPolicy for LateDeadline {
    fn must_evict(
        &mut self,
        now: Duration,
        oldest: decaying_pool::policy::Oldest,
        _bytes_cached: usize,
    ) -> bool {
        oldest.idle(now) >= Duration::from_secs(1)
    }

    fn deadline(&self, oldest: decaying_pool::policy::Oldest) -> Option<Duration> {
        Some(oldest.released_at + Duration::from_secs(3600))
    }
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "EvictionPolicy::deadline disagrees with must_evict")]
fn a_deadline_later_than_must_evict_allows_is_caught_in_debug_builds() {
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(decaying_pool::testing::CheckingAllocator::new())
        .policy(LateDeadline)
        .clock(clock.clone())
        .build();
    let a = pool.allocate(64).unwrap();
    let b = pool.allocate(64).unwrap();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 64) };
    // The policy is asked here (no deadline yet) and answers with its hour.
    // SAFETY: as above.
    unsafe { pool.release(b, 64) };
    clock.advance(Duration::from_secs(2));
    // Without the check this returns 0: nothing is evicted for an hour.
    pool.collect();
}

/// The crate's own policies pass the debug check: collections every 7 ms
/// across their whole decay never panic.
#[test]
fn the_crate_policies_deadlines_agree_with_must_evict() {
    fn run<P: decaying_pool::Policy>(policy: P) {
        let clock = ManualClock::new();
        let mut pool = DecayingPool::builder(decaying_pool::testing::CheckingAllocator::new())
            .policy(policy)
            .clock(clock.clone())
            .build();
        let blocks: Vec<_> = (1..=16)
            .map(|i| (pool.allocate(i * 100).unwrap(), i * 100))
            .collect();
        for (b, size) in blocks {
            // SAFETY: each block came from this pool with this size and is released once.
            unsafe { pool.release(b, size) };
            clock.advance(Duration::from_millis(3));
        }
        for _ in 0..2000 {
            clock.advance(Duration::from_millis(7));
            pool.collect();
        }
        assert_eq!(pool.stats().blocks_cached, 0);
    }
    run(FixedTime::new(Duration::from_secs(1)));
    run(Exponential::new(Duration::from_secs(1)));
}

// ---------------------------------------------------------------------------
// `FixedCapacity`: the per-size bound is explicit.

fn cache_24_same_size(policy: FixedCapacity) -> (u64, u64, u64) {
    let alloc = decaying_pool::testing::CheckingAllocator::new();
    let mut pool = DecayingPool::new(alloc.clone(), policy);
    for _round in 0..3 {
        let blocks: Vec<_> = (0..24).map(|_| pool.allocate(4096).unwrap()).collect();
        for b in blocks {
            // SAFETY: each block came from this pool with this size and is released once.
            unsafe { pool.release(b, 4096) };
        }
    }
    pool.validate();
    let s = pool.stats();
    drop(pool);
    alloc.assert_all_freed();
    (s.blocks_cached, s.evictions, s.misses)
}

#[test]
fn twenty_four_same_size_blocks_fit_when_the_per_size_bound_says_so() {
    let policy = FixedCapacity::new(256).per_size(24);
    assert_eq!(policy.max_per_size(), 24);
    // Three rounds of 24: one round of misses, then hits only.
    assert_eq!(cache_24_same_size(policy), (24, 0, 24));
}

#[test]
fn the_default_per_size_bound_is_the_documented_window() {
    let policy = FixedCapacity::new(256);
    assert_eq!(policy.max_per_size(), FixedCapacity::WINDOW);
    // 8 of the 24 stay cached; each round misses 16 and evicts 16.
    assert_eq!(cache_24_same_size(policy), (8, 48, 56));
}

// ---------------------------------------------------------------------------
// `LocalPool`: a safe handle for one thread.

mod local {
    use core::mem::MaybeUninit;
    use core::time::Duration;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use decaying_pool::testing::CheckingAllocator;
    use decaying_pool::{DecayingPool, FixedTime, LocalPool, SystemAllocator};

    #[test]
    fn a_dropped_guard_returns_its_block_with_its_size() {
        let alloc = CheckingAllocator::new();
        let pool = LocalPool::new(DecayingPool::new(
            alloc.clone(),
            FixedTime::new(Duration::from_secs(60)),
        ));
        let a = pool.allocate(100).unwrap();
        let b = pool.allocate(300).unwrap();
        let s = pool.stats();
        assert_eq!((s.blocks_in_use, s.bytes_in_use), (2, 400));
        drop(a);
        let s = pool.stats();
        assert_eq!(
            (s.blocks_in_use, s.blocks_cached, s.bytes_cached),
            (1, 1, 100)
        );
        drop(b);
        let again = pool.allocate(300).unwrap();
        assert_eq!(pool.stats().hits, 1);
        drop(again);
        pool.with(|p| p.validate());
        drop(pool);
        // Every block went back with the size it was allocated with.
        alloc.assert_all_freed();
    }

    #[test]
    fn a_panic_in_user_code_still_returns_the_block() {
        let alloc = CheckingAllocator::new();
        let pool = LocalPool::new(DecayingPool::new(
            alloc.clone(),
            FixedTime::new(Duration::from_secs(60)),
        ));
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _block = pool.allocate(64).unwrap();
            panic!("user code fails while holding a block");
        }));
        assert!(r.is_err());
        let s = pool.stats();
        assert_eq!((s.blocks_in_use, s.blocks_cached), (0, 1));
        drop(pool);
        alloc.assert_all_freed();
    }

    #[test]
    fn blocks_outlive_the_pool_handle() {
        let alloc = CheckingAllocator::new();
        let pool = LocalPool::new(DecayingPool::new(alloc.clone(), FixedTime::default()));
        let block = pool.allocate(8).unwrap();
        let other = pool.clone();
        drop(pool);
        drop(block);
        assert_eq!(other.trim(), 8);
        drop(other);
        alloc.assert_all_freed();
    }

    #[test]
    fn a_guard_dropped_while_the_pool_is_borrowed_is_never_freed_twice() {
        let alloc = CheckingAllocator::new();
        let pool = LocalPool::new(DecayingPool::new(alloc.clone(), FixedTime::default()));
        let block = pool.allocate(8).unwrap();
        pool.with(|_| drop(block));
        assert_eq!(pool.stats().blocks_in_use, 1, "kept in use, not released");
    }

    #[test]
    fn host_byte_views_cover_the_requested_size_and_a_hit_keeps_the_bytes() {
        let pool = LocalPool::new(DecayingPool::new(
            SystemAllocator::new(),
            FixedTime::default(),
        ));
        let mut a = pool.allocate(1000).unwrap();
        assert_eq!(a.as_uninit().len(), 1000);
        let bytes = a.fill(0xAB);
        assert_eq!(bytes.len(), 1000);
        bytes[999] = 1;
        let addr = a.as_ptr() as usize;
        drop(a);
        // A hit returns the previous user's bytes.
        let mut b = pool.allocate(1000).unwrap();
        assert_eq!(b.as_ptr() as usize, addr);
        let view = b.as_uninit_mut();
        // SAFETY: the previous user initialised every byte.
        let (first, last) = unsafe { (view[0].assume_init(), view[999].assume_init()) };
        assert_eq!((first, last), (0xAB, 1));
        view[0] = MaybeUninit::new(2);
    }
}

// ---------------------------------------------------------------------------
// Debug builds catch a release whose size is not the allocated one.

#[test]
#[cfg(debug_assertions)]
fn a_release_with_the_wrong_size_is_caught_and_loses_nothing() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let alloc = decaying_pool::testing::CheckingAllocator::new();
    let mut pool = DecayingPool::new(alloc.clone(), FixedTime::new(Duration::from_secs(60)));
    let a = pool.allocate(100).unwrap();
    let keep = pool.allocate(300).unwrap();
    let err = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: deliberately wrong size; the debug check catches it
        // before anything reaches the backing allocator with it.
        unsafe { pool.release(a, 200) }
    }))
    .unwrap_err();
    let msg = err.downcast_ref::<String>().expect("a formatted message");
    assert!(msg.contains("allocated with size 100"), "{msg}");
    assert!(msg.contains("released with size 200"), "{msg}");
    // The block went back with its true size: cached as a 100-byte block.
    let s = pool.stats();
    assert_eq!(
        (s.blocks_cached, s.bytes_cached, s.bytes_in_use),
        (1, 100, 300)
    );
    // SAFETY: `keep` came from this pool with this size.
    unsafe { pool.release(keep, 300) };
    pool.validate();
    drop(pool);
    alloc.assert_all_freed();
}
