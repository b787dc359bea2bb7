//! Tests: packing through `SharedPool` (`SharedPool::packed`), with
//! threads, and the reaper bringing a packed pool's reserved bytes to zero
//! once the workload stops.

use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use decaying_pool::testing::CheckingAllocator;
use decaying_pool::{
    DecayingPool, FixedTime, ManualClock, Packable, Packing, Pooled, SharedPool, SystemAllocator,
};

use crate::support::Rng;

/// Small thresholds and segments, so a few thousand requests carve many
/// segments: small up to 1 KiB in 8 KiB segments, medium up to 16 KiB.
fn packing() -> Packing {
    Packing::default()
        .small_threshold(1024)
        .medium_threshold(16 << 10)
        .small_segment(8 << 10)
        .medium_segment(32 << 10)
        .max_segment(64 << 10)
        .granularity(64)
}

/// Sizes spanning small, medium and large (exact) for [`packing`].
fn size(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0..=5 => 1 + rng.below(1024) as usize,
        6..=8 => 1025 + rng.below(15 << 10) as usize,
        _ => (16 << 10) + 1 + rng.below(48 << 10) as usize,
    }
}

/// The spans of the blocks held by every thread at once; panics on an
/// overlap.
#[derive(Default)]
struct Spans(Mutex<BTreeMap<usize, usize>>);

impl Spans {
    fn insert(&self, at: usize, len: usize) {
        let mut m = self.0.lock().unwrap();
        if let Some((&s, &l)) = m.range(..=at).next_back() {
            assert!(
                s + l <= at,
                "[{at:#x}, +{len}) overlaps [{s:#x}, +{l}) held"
            );
        }
        if let Some((&s, _)) = m.range(at..).next() {
            assert!(
                at + len <= s,
                "[{at:#x}, +{len}) overlaps a block at {s:#x} held"
            );
        }
        m.insert(at, len);
    }

    fn remove(&self, at: usize) {
        assert!(self.0.lock().unwrap().remove(&at).is_some());
    }
}

/// Four threads allocate and drop `Pooled` blocks of mixed sizes from one
/// packed pool, holding up to 16 each: no two blocks held at once overlap
/// (across threads), every request is served, and once they stop no
/// segment is left, a trim frees everything and every backing block is
/// freed exactly once.
#[test]
#[cfg_attr(miri, ignore)] // thousands of requests on four threads
fn packed_shared_pool_serves_threads_without_overlap() {
    let alloc = CheckingAllocator::with_addresses();
    let pool = SharedPool::packed(
        DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(Duration::from_secs(3600)))
            .clock(ManualClock::new())
            .packing(packing())
            .build(),
    );
    let spans = Spans::default();
    let start = Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (pool, spans, start) = (pool.clone(), &spans, &start);
            s.spawn(move || {
                let mut rng = Rng(0x5EED + t);
                let mut held: Vec<Pooled<CheckingAllocator, FixedTime, ManualClock>> = Vec::new();
                start.wait();
                for _ in 0..2000 {
                    if held.len() < 16 && rng.below(3) != 0 {
                        let n = size(&mut rng);
                        let b = pool.allocate(n).expect("no limit: every request is served");
                        spans.insert(CheckingAllocator::address(&b), n);
                        held.push(b);
                    } else if !held.is_empty() {
                        let b = held.swap_remove(rng.below(held.len() as u64) as usize);
                        spans.remove(CheckingAllocator::address(&b));
                        drop(b);
                    }
                }
                for b in held.drain(..) {
                    spans.remove(CheckingAllocator::address(&b));
                }
            });
        }
    });
    pool.validate();
    let ps = pool.packing_stats().expect("a packed pool");
    assert!(ps.carved > 1000, "{ps:?}");
    assert!(ps.exact > 0, "{ps:?}");
    assert!(ps.segments_created > 1, "{ps:?}");
    assert_eq!(
        (ps.segments, ps.packed_blocks, ps.bytes_requested),
        (0, 0, 0),
        "{ps:?}"
    );
    assert_eq!(pool.stats().blocks_in_use, 0);
    // Far fewer backing calls than requests: segments and exact blocks are
    // served again from the exact pool's cache.
    assert!(
        pool.stats().backing_allocs * 10 < ps.requests,
        "{:?} {ps:?}",
        pool.stats()
    );
    pool.trim();
    assert_eq!(pool.stats().bytes_reserved, 0);
    drop(pool);
    alloc.assert_all_freed();
}

/// The same with real host memory: each thread fills its blocks with its
/// own pattern and checks it before dropping them, so two blocks sharing a
/// byte would show.
#[test]
#[cfg_attr(miri, ignore)] // thousands of requests on four threads
fn packed_shared_pool_blocks_hold_their_own_bytes() {
    let pool = SharedPool::packed(
        DecayingPool::builder(SystemAllocator::new())
            .policy(FixedTime::new(Duration::from_secs(3600)))
            .packing(packing())
            .build(),
    );
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let pool = pool.clone();
            s.spawn(move || {
                let mut rng = Rng(0xB10C + u64::from(t));
                let mut held = Vec::new();
                for i in 0..1500u32 {
                    if held.len() < 12 && rng.below(3) != 0 {
                        let n = size(&mut rng);
                        let b = pool.allocate(n).unwrap();
                        let tag = t.wrapping_mul(64).wrapping_add(i as u8);
                        // SAFETY: the block is `n` writable bytes, ours alone.
                        unsafe { b.as_ptr().write_bytes(tag, n) };
                        held.push((b, tag));
                    } else if !held.is_empty() {
                        let (b, tag) = held.swap_remove(rng.below(held.len() as u64) as usize);
                        // SAFETY: the block is `b.size()` bytes we wrote.
                        let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.size()) };
                        assert!(bytes.iter().all(|&x| x == tag), "a block was overwritten");
                    }
                }
            });
        }
    });
    let ps = pool.packing_stats().unwrap();
    assert!(ps.carved > 500 && ps.segments == 0, "{ps:?}");
    pool.validate();
}

/// A block allocated on one thread and dropped on another goes back to
/// its segment; `into_raw` / `from_raw` work on a packed pool.
#[test]
fn packed_blocks_cross_threads_and_ffi() {
    let alloc = CheckingAllocator::with_addresses();
    let pool = SharedPool::packed(
        DecayingPool::builder(alloc.clone())
            .packing(packing())
            .build(),
    );
    let a = pool.allocate(100).unwrap();
    let b = pool.allocate(5000).unwrap();
    let c = pool.allocate(40_000).unwrap(); // exact
    assert_eq!(pool.packing_stats().unwrap().packed_blocks, 2);
    std::thread::spawn(move || drop((a, b))).join().unwrap();
    let ps = pool.packing_stats().unwrap();
    assert_eq!(
        (ps.packed_blocks, ps.segments, ps.segments_released),
        (0, 0, 2)
    );
    let (raw, size) = c.into_raw();
    assert_eq!(pool.stats().blocks_in_use, 1);
    // SAFETY: `raw` and `size` came from `into_raw` on this pool, once.
    drop(unsafe { Pooled::from_raw(&pool, raw, size) });
    assert_eq!(pool.stats().blocks_in_use, 0);
    assert_eq!(pool.with_packed(|p| p.packing_stats().requests), Some(3));
    let shown = format!("{pool:?}");
    assert!(shown.contains("packing_stats"), "{shown}");
    pool.validate();
    drop(pool);
    alloc.assert_all_freed();
}

/// `with` hands out the exact pool of a plain `SharedPool` only: on a
/// packed one it refuses (a raw release there would bypass the segments).
#[test]
#[should_panic(expected = "with_packed")]
fn with_refuses_a_packed_pool() {
    let pool = SharedPool::packed(
        DecayingPool::builder(CheckingAllocator::with_addresses())
            .packing(packing())
            .build(),
    );
    pool.with(|p| p.limit());
}

/// After the workload stops, the reaper brings a packed pool's reserved
/// bytes to zero: emptied segments go back to the exact pool at once, and
/// decay there once the period passes (a manual clock, moved past the
/// period; the reaper runs every millisecond).
#[test]
#[cfg_attr(miri, ignore)] // a reaper thread and a wait loop
fn reaper_brings_a_packed_pool_to_zero() {
    let alloc = CheckingAllocator::with_addresses();
    let clock = ManualClock::new();
    let pool = SharedPool::packed(
        DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(Duration::from_secs(2)))
            .clock(clock.clone())
            .packing(packing())
            .build(),
    );
    let reaper = pool.spawn_reaper(Duration::from_millis(1));
    let pools: Vec<_> = (0..2).map(|_| pool.clone()).collect();
    std::thread::scope(|s| {
        for (t, pool) in pools.into_iter().enumerate() {
            s.spawn(move || {
                let mut rng = Rng(77 + t as u64);
                let mut held = Vec::new();
                for _ in 0..500 {
                    held.push(pool.allocate(size(&mut rng)).unwrap());
                    if held.len() > 10 {
                        held.swap_remove(rng.below(11) as usize);
                    }
                }
            });
        }
    });
    // The workload has stopped: nothing is held, no segment is left, and
    // what is reserved is cached in the exact pool, young.
    let ps = pool.packing_stats().unwrap();
    assert_eq!((ps.segments, ps.packed_blocks), (0, 0), "{ps:?}");
    let s = pool.stats();
    assert_eq!(s.blocks_in_use, 0);
    assert!(
        s.bytes_reserved > 0 && s.bytes_reserved == s.bytes_cached,
        "{s:?}"
    );
    clock.advance(Duration::from_secs(2));
    let start = Instant::now();
    while pool.stats().bytes_reserved > 0 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(pool.stats().bytes_reserved, 0, "{:?}", pool.stats());
    drop(reaper);
    drop(pool);
    alloc.assert_all_freed();
}

/// With a real clock too: a short period, and a generous bounded wait.
#[test]
#[cfg_attr(miri, ignore)] // a reaper thread and a wait loop
fn reaper_brings_a_packed_pool_to_zero_on_a_real_clock() {
    let alloc = CheckingAllocator::with_addresses();
    let pool = SharedPool::packed(
        DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(Duration::from_millis(20)))
            .packing(packing())
            .build(),
    );
    let reaper = pool.spawn_reaper(Duration::from_millis(5));
    let mut rng = Rng(9);
    let held: Vec<_> = (0..64)
        .map(|_| pool.allocate(size(&mut rng)).unwrap())
        .collect();
    drop(held);
    let start = Instant::now();
    while pool.stats().bytes_reserved > 0 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(pool.stats().bytes_reserved, 0, "{:?}", pool.stats());
    assert!(reaper.is_running());
    drop(reaper);
    drop(pool);
    alloc.assert_all_freed();
}

/// Carved host blocks are real, disjoint memory (small enough for Miri,
/// which checks the pointers' provenance through the carving).
#[test]
fn carved_host_blocks_are_usable_memory() {
    let pool = SharedPool::packed(
        DecayingPool::builder(SystemAllocator::new())
            .packing(packing())
            .build(),
    );
    let sizes = [1usize, 100, 1000, 3000, 20_000];
    let blocks: Vec<_> = sizes.iter().map(|&n| pool.allocate(n).unwrap()).collect();
    for (k, b) in blocks.iter().enumerate() {
        // SAFETY: the block is `b.size()` writable bytes, ours alone.
        unsafe { b.as_ptr().write_bytes(k as u8 + 1, b.size()) };
    }
    for (k, b) in blocks.iter().enumerate() {
        // SAFETY: the block is `b.size()` bytes we wrote.
        let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.size()) };
        assert!(bytes.iter().all(|&x| x == k as u8 + 1));
    }
    let ps = pool.packing_stats().unwrap();
    assert_eq!((ps.carved, ps.exact), (4, 1), "{ps:?}");
    drop(blocks);
    assert!(pool.trim() > 0);
    assert_eq!(pool.stats().bytes_reserved, 0);
}

/// A packed pool's `Stats` count the caller's requests, not its segments:
/// after 151 requests from four threads (carved small and medium blocks and
/// exact large ones), `hits + misses` is 151, `misses` is the backing
/// allocations, and the blocks in use are the caller's; the exact pool
/// underneath counts fewer blocks (segments). The plain packed pool agrees,
/// and `PackingStats` prints the segment figures.
#[test]
fn a_packed_pools_stats_count_the_callers_requests() {
    let pool = SharedPool::packed(
        DecayingPool::builder(SystemAllocator::new())
            .policy(FixedTime::new(Duration::from_secs(60)))
            .packing(packing())
            .build(),
    );
    let sizes = |t: usize| (0..38).map(move |i| [100, 700, 3000, 9000, 100 << 10][(i + t) % 5]);
    let held: Vec<Vec<Pooled<SystemAllocator>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let pool = pool.clone();
                s.spawn(move || {
                    // 38 requests on three threads, 37 on the fourth: 151.
                    let n = if t == 3 { 37 } else { 38 };
                    sizes(t)
                        .take(n)
                        .map(|size| pool.allocate(size).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let s = pool.stats();
    let ps = pool.packing_stats().unwrap();
    assert_eq!(s.hits + s.misses, 151, "{s:?}");
    assert_eq!(ps.requests, 151);
    assert_eq!(s.misses, s.backing_allocs);
    assert!(
        s.hits > s.misses,
        "most requests carved from held segments: {s:?}"
    );
    assert_eq!(s.blocks_in_use, 151);
    let held_bytes: usize = held.iter().flatten().map(Pooled::size).sum();
    assert!(s.bytes_in_use >= held_bytes);
    assert_eq!(s.bytes_reserved, s.bytes_in_use + s.bytes_cached);
    let under = pool.with_packed(|p| p.pool().stats()).unwrap();
    assert_eq!(under.blocks_in_use, ps.segments + (151 - ps.carved));
    assert!(s.to_string().contains("allocations: 151 ("), "{s}");
    assert!(ps.to_string().contains("requests: 151 ("), "{ps}");
    drop(held);
    let s = pool.stats();
    assert_eq!((s.blocks_in_use, s.bytes_in_use), (0, 0));
    assert_eq!(s.bytes_cached, s.bytes_reserved);
    pool.trim();
    assert_eq!(pool.stats().bytes_reserved, 0);
}
