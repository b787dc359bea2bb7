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

/// Holds every `allocate` of at least `from` bytes while closed, counting
/// the calls inside.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, usize)>,
    changed: std::sync::Condvar,
}

impl Gate {
    fn set(&self, closed: bool) {
        self.state.lock().unwrap().0 = closed;
        self.changed.notify_all();
    }

    fn inside(&self) -> usize {
        self.state.lock().unwrap().1
    }

    /// Waits until `n` calls are held inside.
    fn wait_inside(&self, n: usize) {
        let mut s = self.state.lock().unwrap();
        while s.1 < n {
            s = self.changed.wait(s).unwrap();
        }
    }
}

/// A checking allocator behind a [`Gate`].
struct Gated {
    inner: CheckingAllocator,
    gate: std::sync::Arc<Gate>,
    from: usize,
}

impl decaying_pool::RawAllocator for Gated {
    type Block = u64;
    type Error = <CheckingAllocator as decaying_pool::RawAllocator>::Error;

    fn allocate(&mut self, size: usize) -> Result<u64, Self::Error> {
        if size >= self.from {
            let mut s = self.gate.state.lock().unwrap();
            s.1 += 1;
            self.gate.changed.notify_all();
            while s.0 {
                s = self.gate.changed.wait(s).unwrap();
            }
            s.1 -= 1;
        }
        self.inner.allocate(size)
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.deallocate(block, size) }
    }
}

impl Packable for Gated {
    fn carve(segment: &u64, offset: usize) -> u64 {
        <CheckingAllocator as Packable>::carve(segment, offset)
    }
    fn address(block: &u64) -> usize {
        <CheckingAllocator as Packable>::address(block)
    }
}

/// A packed `SharedPool` makes its backing calls outside its packing lock:
/// while one thread's miss is held inside the backing allocator, another
/// thread's hits (carved from a segment held) and releases go on.
#[test]
fn a_packed_pools_hits_never_wait_for_another_threads_backing_call() {
    let gate = std::sync::Arc::new(Gate::default());
    let checking = CheckingAllocator::with_addresses();
    let alloc = Gated {
        inner: checking.clone(),
        gate: gate.clone(),
        from: 4 << 20,
    };
    let pool = SharedPool::packed(
        DecayingPool::builder(alloc)
            .policy(FixedTime::new(Duration::from_secs(3600)))
            .packing(Packing::default())
            .build(),
    );
    // A 2 MiB segment, below the gate, held by `keep`.
    let keep = pool.allocate(100).unwrap();
    gate.set(true);
    let slow = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.allocate(64 << 20).map(|b| b.size()))
    };
    gate.wait_inside(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let fast = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            for i in 0..if cfg!(miri) { 50 } else { 1000 } {
                let b = pool.allocate(200 + i % 300).unwrap();
                drop(b);
            }
            tx.send(pool.stats()).unwrap();
        })
    };
    // Generous: a hit takes well under a microsecond; the bound only keeps
    // a regression (the lock held across the call) from hanging the test.
    let during = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("a hit waited for another thread's backing call");
    assert_eq!(
        gate.inside(),
        1,
        "the miss is still inside its backing call"
    );
    assert_eq!(during.backing_allocs, 1, "only the segment so far");
    assert!(during.hits >= if cfg!(miri) { 50 } else { 1000 });
    gate.set(false);
    assert_eq!(slow.join().unwrap().unwrap(), 64 << 20);
    fast.join().unwrap();
    let after = pool.stats();
    assert_eq!((after.backing_allocs, after.misses), (2, 2));
    pool.validate();
    drop(keep);
    drop(pool);
    checking.assert_all_freed();
}

/// The same requests through a `PackedPool` and through a packed
/// `SharedPool` (whose backing calls run outside its lock and whose frees
/// come after it) give the same blocks back, the same counters at every
/// step, and every block back at the end; with backing failures injected
/// (`failures`), the shared pool's ladder may take other steps (each
/// attempt starts it again), so there each pool is checked on its own:
/// nothing lost, the counters consistent.
fn packed_shared_against_packed(failures: bool) {
    use decaying_pool::testing::FailingAllocator;
    let make = || {
        let checking = CheckingAllocator::with_addresses();
        let failing = FailingAllocator::new(checking.clone());
        let pool = DecayingPool::builder(failing.clone())
            .policy(FixedTime::new(Duration::from_millis(5)))
            .clock(ManualClock::new())
            .limit(64 << 20)
            .packing(packing())
            .build();
        (checking, failing, pool)
    };
    let (check_a, fail_a, mut alone) = make();
    let (check_b, fail_b, shared) = make();
    let shared = SharedPool::packed(shared);
    let clock_a = alone.pool().clock().clone();
    let clock_b = shared.with_packed(|p| p.pool().clock().clone()).unwrap();
    let mut rng = Rng(0x5EED_5A7E);
    let mut held_a: Vec<(u64, usize)> = Vec::new();
    let mut held_b: Vec<Pooled<FailingAllocator, FixedTime, ManualClock>> = Vec::new();
    // Fewer under Miri, which still sees every path (attempts that need a
    // block and unwind, frees after the lock, the ladder).
    let steps = if cfg!(miri) { 300 } else { 4000 };
    for step in 0..steps {
        match rng.below(10) {
            0..=5 => {
                let s = if rng.below(8) == 0 {
                    (1 << 20) + rng.below(8 << 20) as usize
                } else {
                    size(&mut rng)
                };
                if failures && rng.below(20) == 0 {
                    let n = 1 + rng.below(3) as u32;
                    fail_a.fail_next(n);
                    fail_b.fail_next(n);
                }
                let a = alone.allocate(s);
                let b = shared.allocate(s);
                if !failures {
                    match (&a, &b) {
                        (Ok(a), Ok(b)) => assert_eq!(*a, **b, "step {step}: the same block"),
                        (Err(a), Err(b)) => {
                            assert_eq!(a.to_string(), b.to_string(), "step {step}")
                        }
                        (a, b) => panic!("step {step}: {a:?} against {:?}", b.is_ok()),
                    }
                }
                held_a.extend(a.ok().map(|a| (a, s)));
                held_b.extend(b.ok());
            }
            6..=7 if !held_a.is_empty() => {
                let i = rng.below(held_a.len() as u64) as usize;
                let (a, s) = held_a.swap_remove(i);
                // SAFETY: `a` came from `alone.allocate(s)`, released once.
                unsafe { alone.release(a, s) };
                if !failures {
                    drop(held_b.swap_remove(i));
                }
            }
            8 if failures && !held_b.is_empty() => {
                let i = rng.below(held_b.len() as u64) as usize;
                drop(held_b.swap_remove(i));
            }
            _ => {
                let ms = rng.below(4);
                clock_a.advance(Duration::from_millis(ms));
                clock_b.advance(Duration::from_millis(ms));
                if rng.below(4) == 0 {
                    let (a, b) = (alone.collect(), shared.collect());
                    assert!(failures || a == b, "step {step}: {a} against {b}");
                }
            }
        }
        if failures {
            let (a, b) = (alone.stats(), shared.stats());
            assert_eq!(a.blocks_in_use as usize, held_a.len(), "step {step}");
            assert_eq!(b.blocks_in_use as usize, held_b.len(), "step {step}");
            assert_eq!(b.misses, b.backing_allocs, "step {step}");
            assert_eq!(
                b.bytes_reserved,
                b.bytes_in_use + b.bytes_cached,
                "step {step}"
            );
            assert_eq!(check_b.live_bytes(), b.bytes_reserved, "step {step}");
            if step % 64 == 0 {
                alone.validate();
                shared.validate();
            }
        } else {
            assert_eq!(alone.stats(), shared.stats(), "step {step}");
            assert_eq!(
                alone.packing_stats(),
                shared.packing_stats().unwrap(),
                "step {step}"
            );
            assert_eq!(check_a.live(), check_b.live(), "step {step}");
        }
    }
    shared.validate();
    let failed = (
        alone.stats().backing_failures,
        shared.stats().backing_failures,
    );
    assert!(
        !failures || (failed.0 > 0 && failed.1 > 0),
        "failures injected: {failed:?}"
    );
    for (a, s) in held_a {
        // SAFETY: as above.
        unsafe { alone.release(a, s) };
    }
    drop(held_b);
    let (a, b) = (alone.trim(), shared.trim());
    assert!(failures || a == b, "trim: {a} against {b}");
    drop((alone, shared));
    check_a.assert_all_freed();
    check_b.assert_all_freed();
}

#[test]
fn a_packed_shared_pool_counts_as_a_packed_pool_does() {
    packed_shared_against_packed(false);
}

#[test]
fn a_packed_shared_pool_loses_nothing_to_backing_failures() {
    packed_shared_against_packed(true);
}
