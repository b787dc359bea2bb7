//! Tests: `SharedPool`, `Pooled` and the reaper.
//!
//! Threads against one pool on real host memory (no two live handles alias
//! a block, every backing allocation freed exactly once), the reaper with a
//! real clock, prompt joins, recovery from panics inside the lock, and the
//! promised `Send`/`Sync` bounds.

use crate::support::Rng;
use crate::support::{assert_send, churn, quiet};
use core::convert::Infallible;
use core::ptr::NonNull;
use core::time::Duration;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Instant;

use decaying_pool::policy::{EvictionPolicy, Oldest};
use decaying_pool::testing::CheckingAllocator;
use decaying_pool::{
    Builder, DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, MonotonicClock,
    PoolError, Pooled, RawAllocator, Reaper, SharedPool, SystemAllocator,
};

// ---------------------------------------------------------------------------
// A counting allocator over real host memory (`SystemAllocator` blocks are
// `SendBlock`, so the pool is shared between threads as it is).

#[derive(Default)]
struct Ledger {
    live: HashMap<usize, usize>,
    allocs: u64,
    deallocs: u64,
    errors: Vec<String>,
}

/// `SystemAllocator` that records every block and flags double frees,
/// foreign blocks and wrong sizes.
#[derive(Clone, Default)]
struct CountingSystem {
    inner: SystemAllocator,
    ledger: Arc<Mutex<Ledger>>,
}

impl CountingSystem {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RawAllocator for CountingSystem {
    type Block = NonNull<u8>;
    type Error = <SystemAllocator as RawAllocator>::Error;

    fn allocate(&mut self, size: usize) -> Result<NonNull<u8>, Self::Error> {
        let p = self.inner.allocate(size)?;
        let mut l = self.ledger();
        if l.live.insert(p.as_ptr() as usize, size).is_some() {
            l.errors.push(format!("{p:p} handed out twice"));
        }
        l.allocs += 1;
        Ok(p)
    }

    unsafe fn deallocate(&mut self, block: NonNull<u8>, size: usize) {
        {
            let mut l = self.ledger();
            match l.live.remove(&(block.as_ptr() as usize)) {
                Some(s) if s == size => {}
                Some(s) => {
                    l.errors
                        .push(format!("{:p}: {s} bytes freed as {size}", block));
                    return; // do not free with a wrong layout
                }
                None => {
                    l.errors
                        .push(format!("{:p}: double or foreign free", block));
                    return;
                }
            }
            l.deallocs += 1;
        }
        // SAFETY: the ledger shows `block` live with this size, from `inner`.
        unsafe { self.inner.deallocate(block, size) }
    }
}

fn write_tag(p: NonNull<u8>, size: usize, tag: u64) {
    // SAFETY: the block is `size >= 16` bytes, live and owned by the caller;
    // unaligned writes need no alignment.
    unsafe {
        p.as_ptr().cast::<u64>().write_unaligned(tag);
        p.as_ptr().add(size - 8).cast::<u64>().write_unaligned(tag);
    }
}

fn read_tags(p: NonNull<u8>, size: usize) -> (u64, u64) {
    // SAFETY: as in `write_tag`.
    unsafe {
        (
            p.as_ptr().cast::<u64>().read_unaligned(),
            p.as_ptr().add(size - 8).cast::<u64>().read_unaligned(),
        )
    }
}

const SIZES: [usize; 6] = [16, 64, 100, 4096, 10_000, 1 << 16];

/// `threads` threads each run `ops` random allocate/drop operations on
/// `pool`, tagging every block and checking its tag before dropping it;
/// a shared set checks that no block is held by two handles at once.
/// Returns the number of successful allocations.
fn hammer<P>(pool: &SharedPool<CountingSystem, P>, threads: u64, ops: u64) -> u64
where
    P: decaying_pool::Policy + 'static,
    SharedPool<CountingSystem, P>: Send + Sync,
{
    let live: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let start = Arc::new(Barrier::new(threads as usize));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let pool = pool.clone();
            let live = Arc::clone(&live);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                let mut rng =
                    Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93));
                let mut held: Vec<(Pooled<CountingSystem, P>, u64)> = Vec::new();
                let mut allocated = 0u64;
                let check_and_drop = |(b, tag): (Pooled<CountingSystem, P>, u64)| {
                    assert_eq!(
                        read_tags(*b, b.size()),
                        (tag, tag),
                        "block {:?} was overwritten",
                        *b
                    );
                    assert!(live.lock().unwrap().remove(&(b.as_ptr() as usize)));
                    drop(b);
                };
                start.wait();
                for i in 0..ops {
                    if held.is_empty() || (held.len() < 24 && rng.below(100) < 55) {
                        let size = SIZES[rng.below(SIZES.len() as u64) as usize];
                        let b = pool.allocate(size).expect("host allocation");
                        assert_eq!(b.size(), size);
                        assert!(
                            live.lock().unwrap().insert(b.as_ptr() as usize),
                            "block {:?} handed to two live handles",
                            *b
                        );
                        let tag = (t << 40) | i;
                        write_tag(*b, size, tag);
                        held.push((b, tag));
                        allocated += 1;
                    } else {
                        let k = rng.below(held.len() as u64) as usize;
                        check_and_drop(held.swap_remove(k));
                    }
                    if i % 64 == 0 {
                        thread::yield_now();
                    }
                }
                for h in held.drain(..) {
                    check_and_drop(h);
                }
                allocated
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).sum()
}

fn assert_ledger_clean(alloc: &CountingSystem) {
    let l = alloc.ledger();
    assert!(l.errors.is_empty(), "allocator misuse: {:?}", l.errors);
    assert!(l.live.is_empty(), "{} blocks never freed", l.live.len());
    assert_eq!(l.allocs, l.deallocs, "every allocation freed exactly once");
}

/// Threads and operations per thread of the hammer tests: a few under
/// Miri, which runs every interleaving point on one core (and checks each
/// access for data races).
const THREADS: u64 = if cfg!(miri) { 3 } else { 4 };

fn ops(native: u64) -> u64 {
    if cfg!(miri) { 60 } else { native }
}

#[test]
fn stress_threads_never_alias_and_free_everything_once() {
    let alloc = CountingSystem::default();
    // A short time-to-live so evictions race with hits, and a reaper too.
    let pool = SharedPool::new(DecayingPool::new(
        alloc.clone(),
        FixedTime::new(Duration::from_millis(2)),
    ));
    let reaper = pool.spawn_reaper(Duration::from_millis(1));
    let allocated = hammer(&pool, THREADS, ops(5_000));
    drop(reaper);

    pool.with(|p| p.validate());
    let s = pool.stats();
    assert_eq!(s.hits + s.misses, allocated);
    assert_eq!(s.misses, alloc.ledger().allocs);
    assert_eq!((s.blocks_in_use, s.bytes_in_use), (0, 0));
    // Under Miri the clock runs fast against so few operations: every
    // block may expire before it is asked for again.
    assert!(s.hits > 0 || cfg!(miri), "the cache served nothing: {s:?}");
    let cached = s.bytes_cached;
    assert_eq!(pool.trim(), cached);
    assert_eq!(pool.stats().bytes_reserved, 0);
    drop(pool);
    assert_ledger_clean(&alloc);
}

#[test]
fn stress_with_a_long_ttl_mostly_hits() {
    let alloc = CountingSystem::default();
    let pool = SharedPool::new(DecayingPool::new(
        alloc.clone(),
        FixedTime::new(Duration::from_secs(60)),
    ));
    let allocated = hammer(&pool, THREADS, ops(4_000));
    let s = pool.stats();
    assert_eq!(s.hits + s.misses, allocated);
    // At most 24 held blocks of each size per thread ever exist at once.
    assert!(s.misses <= THREADS * 24 * SIZES.len() as u64, "{s:?}");
    assert_eq!(s.blocks_in_use, 0);
    pool.trim();
    assert_eq!(pool.stats().bytes_reserved, 0);
    drop(pool);
    assert_ledger_clean(&alloc);
}

#[test]
fn threads_with_the_checking_allocator_account_exactly() {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let pool = SharedPool::new(
        DecayingPool::builder(alloc.clone())
            .policy(Exponential::new(Duration::from_millis(50)))
            .clock(clock.clone())
            .build(),
    );
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let pool = pool.clone();
            let clock = clock.clone();
            thread::spawn(move || churn(&pool, &clock, t * 7919 + 1, ops(3_000), 8, 5))
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    pool.with(|p| p.validate());
    let s = pool.stats();
    assert_eq!(s.blocks_in_use, 0);
    assert_eq!(s.backing_allocs, alloc.allocs());
    assert_eq!(s.backing_deallocs, alloc.deallocs());
    assert_eq!(s.bytes_cached, alloc.live_bytes());
    drop(pool);
    alloc.assert_all_freed();
}

// ---------------------------------------------------------------------------
// Pooled

#[test]
fn a_pooled_block_releases_on_drop_and_keeps_its_pool_alive() {
    let alloc = CheckingAllocator::new();
    let pool = SharedPool::new(DecayingPool::new(alloc.clone(), FixedTime::default()));
    let a = pool.allocate(100).unwrap();
    let b = pool.allocate(200).unwrap();
    assert_eq!((a.size(), b.size()), (100, 200));
    assert_ne!(*a, *b);
    let a_id = *a;
    drop(a);
    assert_eq!(pool.stats().blocks_cached, 1);
    let again = pool.allocate(100).unwrap();
    assert_eq!(*again, a_id, "a hit hands the released block back");
    drop(again);
    // The last handle goes first: `b` keeps the pool alive.
    drop(pool);
    assert_eq!(alloc.live(), 2);
    drop(b);
    alloc.assert_all_freed();
}

// The blocks of a plain pool keep it alive all together, through a count
// under the cache lock rather than a reference count each: the pool goes
// exactly when the last handle and the last block are gone, in any order,
// on any thread. (A long time-to-live: nothing expires however slowly the
// test runs.)

fn long_ttl() -> FixedTime {
    FixedTime::new(Duration::from_secs(3600))
}

#[test]
fn blocks_dropped_on_other_threads_after_the_last_handle_drop_the_pool_once() {
    for round in 0..ops(20).min(20) {
        let alloc = CheckingAllocator::new();
        let mut pool = Some(SharedPool::new(DecayingPool::new(
            alloc.clone(),
            long_ttl(),
        )));
        let p = pool.as_ref().unwrap();
        let blocks: Vec<_> = (0..4).map(|i| p.allocate(64 << i).unwrap()).collect();
        drop(p.allocate(8).unwrap()); // one cached block, freed with the pool
        if round % 2 == 0 {
            pool = None;
        }
        let workers: Vec<_> = blocks
            .into_iter()
            .map(|b| thread::spawn(move || drop(b)))
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        if round % 2 == 0 {
            // The last block took the pool with it.
            alloc.assert_all_freed();
        } else {
            assert_eq!(alloc.live(), 5, "the handle keeps every block cached");
            drop(pool);
            alloc.assert_all_freed();
        }
    }
}

#[test]
fn a_handle_cloned_from_a_block_keeps_the_pool_alive() {
    let alloc = CheckingAllocator::new();
    let pool = SharedPool::new(DecayingPool::new(alloc.clone(), long_ttl()));
    let a = pool.allocate(100).unwrap();
    drop(pool);
    let revived = a.pool().clone();
    drop(a);
    assert_eq!(alloc.live(), 1, "the revived handle keeps the cached block");
    assert_eq!(revived.stats().blocks_cached, 1);
    // A block allocated through a block's view of the pool, with no handle
    // left, keeps the pool alive too.
    let b = revived.allocate(100).unwrap();
    let c = b.pool().allocate(200).unwrap();
    drop(revived);
    drop(b);
    assert_eq!(alloc.live(), 2);
    assert_eq!(c.pool().stats().blocks_cached, 1);
    drop(c);
    alloc.assert_all_freed();
}

#[test]
fn into_raw_of_the_last_block_lets_the_pool_go() {
    let alloc = CheckingAllocator::new();
    let pool = SharedPool::new(DecayingPool::new(alloc.clone(), long_ttl()));
    let a = pool.allocate(100).unwrap();
    drop(pool.allocate(300).unwrap());
    drop(pool);
    // A raw block does not keep its pool: the cached block goes with it.
    let (raw, size) = a.into_raw();
    assert_eq!(size, 100);
    assert_eq!(alloc.live(), 1);
    assert_eq!(alloc.size_of(raw), Some(100));
}

#[test]
fn handles_and_blocks_dropped_concurrently_free_everything_once() {
    let threads = if cfg!(miri) { 2 } else { 4 };
    // Fewer rounds under Miri (each explores one random interleaving).
    for _ in 0..if cfg!(miri) { 20 } else { 50 } {
        let alloc = CheckingAllocator::new();
        let pool = SharedPool::new(DecayingPool::new(alloc.clone(), long_ttl()));
        let start = Arc::new(Barrier::new(threads));
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (pool, start) = (pool.clone(), Arc::clone(&start));
                thread::spawn(move || {
                    let mine: Vec<_> = (0..3)
                        .map(|i| pool.allocate(8 << (i + t)).unwrap())
                        .collect();
                    start.wait();
                    // Drop the handle between the blocks, or after them.
                    let mut pool = Some(pool);
                    for (i, b) in mine.into_iter().enumerate() {
                        if i == t % 3 {
                            pool = None;
                        }
                        drop(b);
                    }
                    drop(pool);
                })
            })
            .collect();
        drop(pool);
        for w in workers {
            w.join().unwrap();
        }
        alloc.assert_all_freed();
    }
}

#[test]
fn into_raw_and_from_raw_round_trip() {
    let alloc = CheckingAllocator::new();
    let pool = SharedPool::new(DecayingPool::new(alloc.clone(), FixedTime::default()));
    let (block, size) = pool.allocate(300).unwrap().into_raw();
    assert_eq!(size, 300);
    let s = pool.stats();
    assert_eq!((s.blocks_in_use, s.blocks_cached), (1, 0));
    // SAFETY: from `into_raw` on this pool, given back once.
    let back = unsafe { Pooled::from_raw(&pool.clone(), block, size) };
    assert_eq!((*back, back.size()), (block, 300));
    drop(back);
    let s = pool.stats();
    assert_eq!((s.blocks_in_use, s.blocks_cached), (0, 1));
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn errors_pass_through_and_hand_out_nothing() {
    let pool = SharedPool::new(
        DecayingPool::builder(CheckingAllocator::new())
            .limit(1000)
            .build(),
    );
    assert!(matches!(pool.allocate(0), Err(PoolError::ZeroSize)));
    assert!(matches!(
        pool.allocate(1001),
        Err(PoolError::LimitExceeded { .. })
    ));
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_in_use), (0, 0, 0));
}

// ---------------------------------------------------------------------------
// The reaper

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        thread::sleep(Duration::from_millis(2));
    }
    done()
}

#[test]
#[cfg_attr(miri, ignore)] // a reaper thread, sleeps and a real clock
fn the_reaper_frees_idle_blocks_without_other_calls() {
    let alloc = CheckingAllocator::new();
    let pool: SharedPool<_, FixedTime, MonotonicClock> = SharedPool::new(DecayingPool::new(
        alloc.clone(),
        FixedTime::new(Duration::from_millis(20)),
    ));
    let reaper = pool.spawn_reaper(Duration::from_millis(5));
    let blocks: Vec<_> = (1..=3).map(|i| pool.allocate(i * 1000).unwrap()).collect();
    drop(blocks);
    // Only reads of the counters from here on; `with` is not a pool call.
    assert!(
        wait_until(Duration::from_secs(2), || alloc.live() == 0),
        "the reaper did not free the idle blocks: {:?}",
        pool.stats()
    );
    let s = pool.stats();
    assert_eq!(
        (s.evictions, s.backing_deallocs, s.blocks_cached),
        (3, 3, 0)
    );
    assert!(reaper.is_running());
    drop(reaper);
}

#[test]
#[cfg_attr(miri, ignore)] // a reaper thread, sleeps and a real clock
fn dropping_the_reaper_joins_promptly() {
    let pool = SharedPool::new(DecayingPool::new(
        CheckingAllocator::new(),
        FixedTime::default(),
    ));
    let reaper = pool.spawn_reaper(Duration::from_secs(10));
    thread::sleep(Duration::from_millis(20)); // let it reach its wait
    let start = Instant::now();
    drop(reaper);
    let took = start.elapsed();
    assert!(took < Duration::from_millis(500), "join took {took:?}");
}

#[test]
#[cfg_attr(miri, ignore)] // a reaper thread, sleeps and a real clock
fn the_reaper_exits_when_every_handle_is_dropped() {
    let alloc = CheckingAllocator::new();
    let pool = SharedPool::new(DecayingPool::new(alloc.clone(), FixedTime::default()));
    drop(pool.allocate(64).unwrap());
    let reaper = pool.spawn_reaper(Duration::from_millis(5));
    drop(pool);
    assert!(
        wait_until(Duration::from_secs(2), || !reaper.is_running()),
        "the reaper outlived its pool"
    );
    // The pool is gone (it held only a weak reference), cache and all.
    alloc.assert_all_freed();
    let start = Instant::now();
    drop(reaper);
    assert!(start.elapsed() < Duration::from_millis(500));
}

#[test]
#[should_panic(expected = "period must not be zero")]
fn a_zero_reaper_period_panics() {
    let pool = SharedPool::new(DecayingPool::new(
        CheckingAllocator::new(),
        FixedTime::default(),
    ));
    let _reaper = pool.spawn_reaper(Duration::ZERO);
}

// ---------------------------------------------------------------------------
// Panics inside the lock

/// `CheckingAllocator` whose next `deallocate` panics after freeing the
/// block (so the block is not leaked by the allocator itself), or whose
/// next `allocate` panics before allocating.
#[derive(Clone, Default)]
struct Panicky {
    inner: CheckingAllocator,
    panic_dealloc: Arc<AtomicBool>,
    panic_alloc: Arc<AtomicBool>,
}

impl RawAllocator for Panicky {
    type Block = u64;
    type Error = Infallible;

    fn allocate(&mut self, size: usize) -> Result<u64, Infallible> {
        if self.panic_alloc.swap(false, Ordering::SeqCst) {
            panic!("injected allocate panic");
        }
        self.inner.allocate(size)
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        // SAFETY: passed through unchanged from the pool.
        unsafe { self.inner.deallocate(block, size) };
        if self.panic_dealloc.swap(false, Ordering::SeqCst) {
            panic!("injected deallocate panic");
        }
    }
}

/// A fresh [`Panicky`], a manual clock at zero, and a builder over them
/// with one-second fixed-time decay.
fn panicky() -> (
    Panicky,
    ManualClock,
    Builder<Panicky, FixedTime, ManualClock>,
) {
    let alloc = Panicky::default();
    let clock = ManualClock::new();
    let builder = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone());
    (alloc, clock, builder)
}

#[test]
fn a_panicking_deallocator_poisons_nothing_and_loses_nothing() {
    let (alloc, clock, builder) = panicky();
    let pool = SharedPool::new(builder.build());

    // 1. A panic in `trim`.
    drop(pool.allocate(10).unwrap());
    drop(pool.allocate(20).unwrap());
    alloc.panic_dealloc.store(true, Ordering::SeqCst);
    assert!(quiet(|| pool.trim()).is_err());
    pool.with(|p| p.validate());
    // Both blocks left the cache under the lock and were both offered to
    // `deallocate`, although the first call panicked.
    assert_eq!(pool.stats().blocks_cached, 0);
    assert_eq!(alloc.inner.live(), 0, "no block lost");
    assert_eq!(pool.trim(), 0);

    // 2. A panic while a dropped `Pooled` evicts an expired block first:
    //    the released block must still be cached, not lost.
    let old = pool.allocate(30).unwrap();
    let young = pool.allocate(40).unwrap();
    drop(old);
    clock.advance(Duration::from_secs(1));
    alloc.panic_dealloc.store(true, Ordering::SeqCst);
    assert!(quiet(move || drop(young)).is_err());
    pool.with(|p| p.validate());
    let s = pool.stats();
    assert_eq!(
        (s.blocks_in_use, s.blocks_cached, s.bytes_cached),
        (0, 1, 40)
    );

    // 3. A panic in the reaper's `collect`: the reaper survives.
    clock.advance(Duration::from_secs(1));
    alloc.panic_dealloc.store(true, Ordering::SeqCst);
    let reaper = pool.spawn_reaper(Duration::from_millis(1));
    assert!(wait_until(Duration::from_secs(2), || pool
        .stats()
        .blocks_cached
        == 0));
    assert!(reaper.is_running());
    drop(reaper);

    // 4. A panic in the backing `allocate` hands out and counts nothing.
    alloc.panic_alloc.store(true, Ordering::SeqCst);
    assert!(quiet(|| pool.allocate(50).map(drop)).is_err());
    let s = pool.stats();
    assert_eq!((s.blocks_in_use, s.backing_allocs), (0, s.backing_deallocs));

    // 5. A panic inside `with`.
    assert!(quiet(|| pool.with(|_| panic!("user code"))).is_err());

    // The pool still works, and every block is accounted for.
    let b = pool.allocate(60).unwrap();
    drop(b);
    assert_eq!(*pool.allocate(60).unwrap(), alloc.inner.allocs());
    pool.with(|p| p.validate());
    drop(pool);
    alloc.inner.assert_all_freed();
}

/// Found by the fuzz harness's injected panics (`shared_ops` seeds
/// `seed-panic-allocate-{hit,miss}-eviction-deallocate`): a handle's
/// `allocate` offers the expired blocks its cache step let go to
/// `deallocate` after that step; when one of those calls panics, the block
/// the step took for a hit must not be lost, and a miss's booking against
/// the limit must not stay.
#[test]
fn a_deallocate_panic_inside_allocate_loses_no_block_and_no_booking() {
    let (alloc, clock, builder) = panicky();
    let pool = SharedPool::new(builder.limit(2000).build());
    // A hit on 200 after the expired 100 is evicted.
    drop(pool.allocate(100).unwrap());
    clock.advance(Duration::from_millis(500));
    drop(pool.allocate(200).unwrap());
    clock.advance(Duration::from_millis(500));
    alloc.panic_dealloc.store(true, Ordering::SeqCst);
    assert!(quiet(|| pool.allocate(200).map(drop)).is_err());
    pool.with(|p| p.validate());
    let s = pool.stats();
    assert_eq!(s.blocks_in_use, 0, "the hit's block was lost: {s:?}");
    // A miss of 1000 after an expired block is evicted.
    drop(pool.allocate(300).unwrap());
    clock.advance(Duration::from_secs(1));
    alloc.panic_dealloc.store(true, Ordering::SeqCst);
    assert!(quiet(|| pool.allocate(1000).map(drop)).is_err());
    pool.with(|p| p.validate());
    // Two blocks of 1000 fit the limit of 2000 only if nothing stays booked.
    let a = pool.allocate(1000).unwrap();
    let b = pool
        .allocate(1000)
        .expect("the panicked miss is still booked");
    drop((a, b));
    pool.with(|p| p.validate());
    drop(pool);
    alloc.inner.assert_all_freed();
}

#[test]
fn a_pooled_dropped_while_unwinding_does_not_abort() {
    let (alloc, clock, builder) = panicky();
    let pool = SharedPool::new(builder.build());
    drop(pool.allocate(10).unwrap());
    let held = pool.allocate(20).unwrap();
    clock.advance(Duration::from_secs(1));
    alloc.panic_dealloc.store(true, Ordering::SeqCst);
    // `held` is dropped during unwinding; its release panics again inside
    // the pool, which must be swallowed rather than abort the process.
    let r = quiet(move || {
        let _held = held;
        panic!("user panic");
    });
    assert!(r.is_err());
    pool.with(|p| p.validate());
    let s = pool.stats();
    assert_eq!((s.blocks_in_use, s.blocks_cached), (0, 1));
    drop(pool);
    alloc.inner.assert_all_freed();
}

/// A policy that panics in `must_evict` on demand.
struct PanicPolicy(Arc<AtomicBool>);

impl EvictionPolicy for PanicPolicy {
    fn must_evict(&mut self, _now: Duration, _oldest: Oldest, _bytes_cached: usize) -> bool {
        if self.0.swap(false, Ordering::SeqCst) {
            panic!("injected policy panic");
        }
        false
    }
}

#[test]
fn a_panicking_policy_leaves_the_pool_usable() {
    let alloc = CheckingAllocator::new();
    let trigger = Arc::new(AtomicBool::new(false));
    let pool = SharedPool::new(
        DecayingPool::builder(alloc.clone())
            .policy(PanicPolicy(Arc::clone(&trigger)))
            .clock(ManualClock::new())
            .build(),
    );
    drop(pool.allocate(8).unwrap());
    let held = pool.allocate(16).unwrap();
    trigger.store(true, Ordering::SeqCst);
    assert!(quiet(|| pool.allocate(8).map(drop)).is_err());
    trigger.store(true, Ordering::SeqCst);
    assert!(quiet(move || drop(held)).is_err());
    pool.with(|p| p.validate());
    let s = pool.stats();
    assert_eq!((s.blocks_in_use, s.blocks_cached), (0, 2));
    assert_eq!(pool.collect(), 0);
    drop(pool);
    alloc.assert_all_freed();
}

// ---------------------------------------------------------------------------
// Send and Sync

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn shared_pools_and_blocks_are_send_and_sync() {
    assert_send_sync::<SharedPool<CheckingAllocator>>();
    assert_send_sync::<SharedPool<CheckingAllocator, Exponential, ManualClock>>();
    assert_send_sync::<SharedPool<CheckingAllocator, FixedCapacity>>();
    assert_send_sync::<SharedPool<CountingSystem, FixedTime, MonotonicClock>>();
    assert_send_sync::<Pooled<CheckingAllocator>>();
    assert_send_sync::<Pooled<CountingSystem, Exponential>>();
    assert_send_sync::<SharedPool<SystemAllocator>>();
    assert_send_sync::<Pooled<SystemAllocator, FixedCapacity>>();
    #[cfg(unix)]
    assert_send_sync::<SharedPool<decaying_pool::MmapAllocator, Exponential>>();
    assert_send::<Pooled<CheckingAllocator, FixedCapacity, ManualClock>>();
    assert_send_sync::<Reaper>();
    // A SharedPool moves into a thread and a Pooled moves back out.
    let pool = SharedPool::new(DecayingPool::new(
        CheckingAllocator::new(),
        FixedTime::default(),
    ));
    let p = pool.clone();
    let block = thread::spawn(move || p.allocate(8).unwrap())
        .join()
        .unwrap();
    assert_eq!(block.size(), 8);
}

// ---------------------------------------------------------------------------
// Backing calls outside the cache lock

/// An allocator whose `allocate` of `slow_size` bytes blocks until the
/// test opens the gate, like a `cudaMalloc` that takes milliseconds.
#[derive(Clone)]
struct Gated {
    inner: CheckingAllocator,
    slow_size: usize,
    entered: Arc<Barrier>,
    gate: Arc<Barrier>,
}

impl RawAllocator for Gated {
    type Block = u64;
    type Error = Infallible;

    fn allocate(&mut self, size: usize) -> Result<u64, Infallible> {
        if size == self.slow_size {
            self.entered.wait();
            self.gate.wait();
        }
        self.inner.allocate(size)
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        // SAFETY: passed through unchanged from the pool.
        unsafe { self.inner.deallocate(block, size) }
    }
}

fn gated(limit: Option<usize>) -> (SharedPool<Gated>, Gated) {
    let alloc = Gated {
        inner: CheckingAllocator::new(),
        slow_size: 1000,
        entered: Arc::new(Barrier::new(2)),
        gate: Arc::new(Barrier::new(2)),
    };
    let mut b = DecayingPool::builder(alloc.clone());
    if let Some(limit) = limit {
        b = b.limit(limit);
    }
    (SharedPool::new(b.build()), alloc)
}

#[test]
fn hits_go_on_while_a_miss_is_inside_the_backing_allocator() {
    let hits = ops(1000);
    let (pool, alloc) = gated(None);
    drop(pool.allocate(64).unwrap()); // one cached block of another class
    let slow = {
        let pool = pool.clone();
        thread::spawn(move || pool.allocate(1000).map(|b| *b))
    };
    alloc.entered.wait(); // the miss is now inside `allocate`
    // Hits, collect and stats need only the cache lock: they complete while
    // the miss still waits in the backing allocator.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let hitter = {
        let pool = pool.clone();
        thread::spawn(move || {
            for _ in 0..hits {
                drop(pool.allocate(64).unwrap());
            }
            pool.collect();
            done_tx.send(pool.stats()).unwrap();
        })
    };
    let stats = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("hits were blocked by a miss in the backing allocator");
    assert_eq!((stats.hits, stats.misses), (hits, 1));
    alloc.gate.wait(); // let the slow miss finish
    hitter.join().unwrap();
    let block = slow.join().unwrap().unwrap();
    let s = pool.stats();
    assert_eq!((s.misses, s.blocks_in_use, s.bytes_in_use), (2, 0, 0));
    // The slow thread copied the block id out and dropped its `Pooled`,
    // which released the block.
    assert_eq!(block, 2);
    assert_eq!(pool.stats().blocks_cached, 2);
    pool.with(|p| p.validate());
}

#[test]
fn the_limit_counts_misses_in_flight() {
    let (pool, alloc) = gated(Some(1500));
    let slow = {
        let pool = pool.clone();
        thread::spawn(move || pool.allocate(1000).map(|b| b.size()))
    };
    alloc.entered.wait();
    // 1000 bytes are booked for the miss in flight: 1000 + 600 > 1500 can
    // never fit, although nothing is in use or cached yet.
    match pool.allocate(600) {
        Err(PoolError::LimitExceeded {
            requested: 600,
            limit: 1500,
            reserved: 0,
        }) => {}
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    alloc.gate.wait();
    assert_eq!(slow.join().unwrap().unwrap(), 1000);
    // Now 1000 are cached: 500 fits beside them.
    drop(pool.allocate(500).unwrap());
    let s = pool.stats();
    assert!(s.peak_bytes_reserved <= 1500, "{s:?}");
    assert_eq!(s.bytes_reserved, 1500);
    pool.with(|p| p.validate());
    drop(pool);
    alloc.inner.assert_all_freed();
}

#[test]
fn calls_wait_for_with_and_go_on_after_it() {
    let alloc = CheckingAllocator::new();
    let pool = SharedPool::new(DecayingPool::new(alloc.clone(), long_ttl()));
    drop(pool.allocate(64).unwrap());
    let inside = Arc::new(Barrier::new(2));
    let done = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (pool, inside, done) = (pool.clone(), Arc::clone(&inside), Arc::clone(&done));
        thread::spawn(move || {
            inside.wait();
            // The cache lock is held by `with` on the other thread.
            let block = pool.allocate(64).unwrap();
            done.store(true, Ordering::SeqCst);
            *block
        })
    };
    let raced = pool.with(|p| {
        inside.wait();
        // Give the waiter time to spin, yield and nap on the lock.
        thread::sleep(Duration::from_millis(if cfg!(miri) { 1 } else { 20 }));
        let raced = done.load(Ordering::SeqCst);
        assert_eq!(p.stats().blocks_cached, 1);
        raced
    });
    assert!(!raced, "a call went on while `with` held the pool");
    let block = waiter.join().unwrap();
    assert_eq!(block, 1, "the waiter's call was a hit once `with` returned");
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), (1, 1, 1));
    drop(pool);
    alloc.assert_all_freed();
}

// ---------------------------------------------------------------------------
// Thread caches (`SharedPool::with_thread_caches`)

type Tc<A = CheckingAllocator> = SharedPool<A, FixedTime, ManualClock>;

fn tc_pool(ttl: Duration) -> (Tc, CheckingAllocator, ManualClock) {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let pool = SharedPool::with_thread_caches(
        DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(ttl))
            .clock(clock.clone())
            .build(),
    );
    (pool, alloc, clock)
}

/// On a thread of its own, allocates blocks of `sizes` all at once, then
/// drops them (into that thread's magazine), and exits.
fn cache_on_a_thread<A>(pool: &SharedPool<A, FixedTime, ManualClock>, sizes: &[usize])
where
    A: RawAllocator + Send + 'static,
    A::Block: decaying_pool::SendBlock,
    A::Error: core::fmt::Debug,
{
    let pool = pool.clone();
    let sizes = sizes.to_vec();
    thread::spawn(move || {
        let blocks: Vec<_> = sizes.iter().map(|&s| pool.allocate(s).unwrap()).collect();
        drop(blocks);
    })
    .join()
    .unwrap();
}

/// Gives this thread its magazine (a request of one byte, a miss cached
/// there), so that it adopts no exited thread's magazine later: its
/// requests then show what the other magazines keep.
fn take_up<A>(pool: &SharedPool<A, FixedTime, ManualClock>)
where
    A: RawAllocator,
    A::Error: core::fmt::Debug,
{
    drop(pool.allocate(1).unwrap());
}

#[test]
fn a_threads_released_blocks_stay_in_its_own_cache() {
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(1));
    take_up(&pool);
    cache_on_a_thread(&pool, &[64, 128]);
    let s = pool.stats();
    assert_eq!((s.misses, s.blocks_cached, s.bytes_cached), (3, 3, 193));
    assert_eq!(
        (s.blocks_in_use, s.bytes_in_use, s.bytes_reserved),
        (0, 0, 193)
    );
    // Another thread, which has its magazine, does not see them: its own
    // request misses.
    drop(pool.allocate(64).unwrap());
    // Its own release goes to its own magazine, and its next request hits.
    drop(pool.allocate(64).unwrap());
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), (1, 4, 4));
    assert_eq!(s.backing_allocs, alloc.allocs());
    assert_eq!(s.bytes_cached, alloc.live_bytes());
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn an_exited_threads_blocks_expire_on_time_through_collect() {
    let (pool, alloc, clock) = tc_pool(Duration::from_secs(1));
    cache_on_a_thread(&pool, &[64, 100, 3000]);
    clock.advance(Duration::from_millis(999));
    assert_eq!(pool.collect(), 0);
    assert_eq!(alloc.live(), 3);
    clock.advance(Duration::from_millis(1));
    assert_eq!(pool.collect(), 3);
    assert_eq!(alloc.live(), 0);
    let s = pool.stats();
    assert_eq!(
        (s.evictions, s.backing_deallocs, s.blocks_cached),
        (3, 3, 0)
    );
    assert_eq!((s.bytes_reserved, s.blocks_in_use), (0, 0));
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn an_idle_threads_blocks_expire_on_time() {
    let (pool, alloc, clock) = tc_pool(Duration::from_secs(1));
    let (cached, go) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let worker = {
        let (pool, cached, go) = (pool.clone(), Arc::clone(&cached), Arc::clone(&go));
        thread::spawn(move || {
            drop(pool.allocate(64).unwrap());
            cached.wait();
            go.wait(); // idle, alive, its magazine full of a due block
            drop(pool);
        })
    };
    cached.wait();
    clock.advance(Duration::from_secs(1));
    assert_eq!(pool.collect(), 1);
    assert_eq!(alloc.live(), 0);
    assert_eq!(pool.stats().evictions, 1);
    go.wait();
    worker.join().unwrap();
    drop(pool);
    alloc.assert_all_freed();
}

/// Distinct sizes that a thread asks for at once to make it pass its
/// magazine by: more than the 128 misses in a row after which it does
/// (twice the 64 blocks a magazine holds).
const WIDE: u64 = 160;

/// On a thread of its own: allocates `wide` distinct sizes at once (its
/// magazine misses at every one), drops them, then makes `round_trips`
/// round trips of 64 bytes.
fn miss_wide_then_round_trips(pool: &Tc, wide: usize, round_trips: usize) {
    let pool = pool.clone();
    thread::spawn(move || {
        let blocks: Vec<_> = (1..=wide).map(|i| pool.allocate(64 * i).unwrap()).collect();
        drop(blocks);
        for _ in 0..round_trips {
            drop(pool.allocate(64).unwrap());
        }
    })
    .join()
    .unwrap();
}

#[test]
fn a_thread_whose_cache_keeps_missing_passes_it_by_for_a_while() {
    // 160 sizes at once: after 128 misses the thread passes its magazine
    // by, so its releases go to the shared cache, where another thread
    // finds them (the magazine would have kept the first 64 released).
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(3600));
    miss_wide_then_round_trips(&pool, WIDE as usize, 0);
    let s = pool.stats();
    assert_eq!((s.misses, s.blocks_cached), (WIDE, WIDE));
    for i in 1..=8 {
        drop(pool.allocate(64 * i).unwrap());
    }
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (8, WIDE), "served by the shared cache");
    assert_eq!(s.backing_allocs, alloc.allocs());
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
#[cfg_attr(miri, ignore)] // 10 000 round trips; the paths run in the test above
fn a_cache_passed_by_is_tried_again_and_serves_its_thread() {
    // Then 10 000 round trips of one size: past the 16 384 operations the
    // magazine is passed by, it takes the block again and serves the
    // rest, so the block ends in that thread's magazine, not in the
    // shared cache: another thread's request of that size misses.
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(3600));
    take_up(&pool);
    miss_wide_then_round_trips(&pool, WIDE as usize, 10_000);
    let s = pool.stats();
    assert_eq!(
        (s.hits, s.misses, s.blocks_cached),
        (10_000, WIDE + 1, WIDE + 1)
    );
    drop(pool.allocate(64).unwrap());
    assert_eq!(
        pool.stats().misses,
        WIDE + 2,
        "the block is in the other thread's cache"
    );
    for i in 2..=WIDE as usize {
        drop(pool.allocate(64 * i).unwrap());
    }
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (10_000 + WIDE - 1, WIDE + 2));
    assert_eq!(s.bytes_cached, alloc.live_bytes());
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
#[cfg_attr(miri, ignore)] // hundreds of calls, a minute under Miri; safe paths (the table, the skip word)
fn a_thread_over_more_classes_than_its_magazine_holds_grows_it() {
    // Three rounds of round trips over 100 sizes: the magazine keeps the
    // first 64 and serves them (two calls in three hit there), and half
    // of its misses are allocations that find it full: it grows to 128
    // blocks instead of being passed by, and keeps all 100 blocks, which
    // another thread's requests then miss.
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(3600));
    take_up(&pool);
    let worker = pool.clone();
    thread::spawn(move || {
        for _ in 0..3 {
            for i in 1..=100 {
                drop(worker.allocate(64 * i).unwrap());
            }
        }
    })
    .join()
    .unwrap();
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), (200, 101, 101));
    let blocks: Vec<_> = (1..=100).map(|i| pool.allocate(64 * i).unwrap()).collect();
    let s = pool.stats();
    assert_eq!(
        (s.hits, s.misses),
        (200, 201),
        "all in the exited thread's magazine"
    );
    drop(blocks);
    assert_eq!(alloc.allocs(), 201);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn a_thread_that_only_releases_keeps_its_magazine_as_it_was() {
    // A thread that allocated once (so it has a magazine, with that
    // block), then releases another thread's 200 blocks of as many
    // sizes: the magazine takes 63 and finds itself full at the other
    // releases, but never at an allocation, so it does not grow; the
    // rest go to the shared cache, where their thread finds them.
    // (Under Miri 80 blocks: still more than the magazine takes.)
    let n: u64 = if cfg!(miri) { 80 } else { 200 };
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(3600));
    let blocks: Vec<_> = (1..=n as usize)
        .map(|i| pool.allocate(64 * i).unwrap())
        .collect();
    let consumer = pool.clone();
    thread::spawn(move || {
        drop(consumer.allocate(64 * 2000).unwrap());
        drop(blocks);
    })
    .join()
    .unwrap();
    let again: Vec<_> = (1..=n as usize)
        .map(|i| pool.allocate(64 * i).unwrap())
        .collect();
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (n - 63, n + 1 + 63));
    drop(again);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of calls, minutes under Miri; safe paths (the skip word)
fn a_thread_whose_cache_serves_most_calls_but_not_nearly_all_passes_it_by() {
    // Round trips over 1000 sizes, more than a magazine grows to hold: in
    // the first round the magazine fills, grows (64, 128, 256, then 512
    // blocks: each time its allocations found it full), fills again, and
    // keeps 512 blocks, which another thread's requests miss. In the
    // rounds after, it serves about half of the calls, fewer than 8 in 9:
    // the thread passes it by, and its requests for the sizes it holds
    // take their blocks from it and release them to the shared cache,
    // where another thread finds them all.
    const SIZES: usize = 1000;
    for (rounds, kept) in [(1, 512), (3, 0)] {
        let (pool, alloc, _clock) = tc_pool(Duration::from_secs(3600));
        take_up(&pool);
        let worker = pool.clone();
        thread::spawn(move || {
            for _ in 0..rounds {
                for i in 1..=SIZES {
                    drop(worker.allocate(64 * i).unwrap());
                }
            }
        })
        .join()
        .unwrap();
        let s = pool.stats();
        let served = (rounds * SIZES) as u64;
        assert_eq!(
            (s.hits, s.misses, s.blocks_cached),
            (served - 1000, 1001, 1001)
        );
        let blocks: Vec<_> = (1..=SIZES)
            .map(|i| pool.allocate(64 * i).unwrap())
            .collect();
        let s = pool.stats();
        assert_eq!(
            (s.hits, s.misses),
            (served - kept, 1001 + kept),
            "{kept} in the exited thread's magazine after {rounds} rounds"
        );
        drop(blocks);
        drop(pool);
        alloc.assert_all_freed();
    }
}

#[test]
#[cfg_attr(miri, ignore)] // hundreds of calls, a minute under Miri; safe paths (the table, the skip word)
fn a_thread_cache_whose_slots_keep_classes_it_no_longer_holds_makes_room() {
    // A magazine's slot keeps its class when its block is taken. Five
    // times, the thread caches 26 blocks of new sizes in its magazine,
    // takes them back and drops them on another thread: 130 slots would
    // keep a class with no block, more than half the table. A release
    // that needs a slot for a new class then builds the table again
    // without those, and the 26 blocks of a last round stay in the
    // magazine (another thread's requests for them miss). (26 a round:
    // the magazine serves a third of these calls, and 156 rounds' worth
    // of misses would have it passed by.)
    const ROUND: usize = 26;
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(3600));
    take_up(&pool);
    let size = |round: usize, i: usize| 64 * (100 * round + i);
    let worker = pool.clone();
    thread::spawn(move || {
        for round in 0..6 {
            let blocks: Vec<_> = (1..=ROUND)
                .map(|i| worker.allocate(size(round, i)).unwrap())
                .collect();
            drop(blocks); // to the magazine
            if round < 5 {
                let hits: Vec<_> = (1..=ROUND)
                    .map(|i| worker.allocate(size(round, i)).unwrap())
                    .collect();
                thread::spawn(move || drop(hits)).join().unwrap();
            }
        }
    })
    .join()
    .unwrap();
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), (130, 157, 157));
    let last: Vec<_> = (1..=ROUND)
        .map(|i| pool.allocate(size(5, i)).unwrap())
        .collect();
    assert_eq!(
        pool.stats().misses,
        157 + ROUND as u64,
        "the last round's blocks are in its magazine"
    );
    drop(last);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn blocks_left_in_a_cache_passed_by_still_expire_on_time() {
    // The magazine holds a block when the misses start; the thread passes
    // it by and exits; the block still goes at its time.
    let (pool, alloc, clock) = tc_pool(Duration::from_secs(1));
    let worker = pool.clone();
    thread::spawn(move || {
        drop(worker.allocate(10).unwrap());
        let blocks: Vec<_> = (1..=WIDE as usize)
            .map(|i| worker.allocate(64 * i).unwrap())
            .collect();
        drop(blocks);
    })
    .join()
    .unwrap();
    assert_eq!(pool.stats().blocks_cached, WIDE + 1);
    clock.advance(Duration::from_millis(999));
    assert_eq!(pool.collect(), 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(pool.collect() as u64, WIDE + 1);
    let s = pool.stats();
    assert_eq!(
        (s.evictions, s.blocks_cached, alloc.live()),
        (WIDE + 1, 0, 0)
    );
    drop(pool);
    alloc.assert_all_freed();
}

/// On a thread of its own: caches a block of 10 bytes in its magazine,
/// then (after `wait`) misses there `WIDE` times at once, which makes it pass
/// its magazine by, drops those blocks, waits `wait` again and asks for
/// 10 bytes: the shared cache has none.
fn pass_by_with_a_block_left(pool: &Tc, clock: &ManualClock, wait: Duration) {
    let (pool, clock) = (pool.clone(), clock.clone());
    thread::spawn(move || {
        drop(pool.allocate(10).unwrap());
        clock.advance(wait);
        let blocks: Vec<_> = (1..=WIDE as usize)
            .map(|i| pool.allocate(64 * i).unwrap())
            .collect();
        drop(blocks);
        clock.advance(wait);
        drop(pool.allocate(10).unwrap());
    })
    .join()
    .unwrap();
}

#[test]
fn a_thread_that_passes_its_cache_by_takes_its_block_before_a_backing_call() {
    // The request for 10 bytes passes the magazine by and misses in the
    // shared cache; the block idle in its own magazine serves it.
    let (pool, alloc, clock) = tc_pool(Duration::from_secs(1));
    pass_by_with_a_block_left(&pool, &clock, Duration::ZERO);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.evictions), (1, WIDE + 1, 0));
    assert_eq!((alloc.allocs(), s.blocks_cached), (WIDE + 1, WIDE + 1));
    assert_eq!(s.bytes_cached, alloc.live_bytes());
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn a_due_block_of_a_cache_passed_by_is_freed_not_reused() {
    // The same, but the block has been idle for its time-to-live when the
    // request comes (the 20 others for half of it): it goes, as an
    // eviction, and the request goes to the backing allocator.
    let (pool, alloc, clock) = tc_pool(Duration::from_secs(1));
    pass_by_with_a_block_left(&pool, &clock, Duration::from_millis(500));
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.evictions), (0, WIDE + 2, 1));
    assert_eq!(
        (alloc.allocs(), alloc.live(), s.blocks_cached),
        (WIDE + 2, WIDE as usize + 1, WIDE + 1)
    );
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn a_due_block_of_the_threads_own_cache_is_not_reused() {
    let (pool, alloc, clock) = tc_pool(Duration::from_secs(1));
    drop(pool.allocate(64).unwrap());
    clock.advance(Duration::from_secs(1));
    drop(pool.allocate(64).unwrap());
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.evictions), (0, 2, 1));
    assert_eq!((s.blocks_cached, alloc.live()), (1, 1));
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn trim_frees_an_exited_threads_blocks_once() {
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(1));
    cache_on_a_thread(&pool, &[64, 100]);
    drop(pool.allocate(300).unwrap());
    assert_eq!(pool.trim(), 464);
    assert_eq!(alloc.live(), 0);
    let s = pool.stats();
    assert_eq!((s.trimmed, s.blocks_cached, s.bytes_reserved), (3, 0, 0));
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn dropping_the_pool_frees_an_exited_threads_blocks_once() {
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(1));
    cache_on_a_thread(&pool, &[64, 100]);
    assert_eq!(alloc.live(), 2);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn the_pool_dropped_while_a_thread_still_holds_its_cache() {
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(1));
    let (cached, dropped) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let worker = {
        let (pool, cached, dropped) = (pool.clone(), Arc::clone(&cached), Arc::clone(&dropped));
        thread::spawn(move || {
            drop(pool.allocate(64).unwrap());
            drop(pool);
            cached.wait();
            dropped.wait();
            // A new pool on this thread, at any address: its own magazine.
            let (other, other_alloc, _) = tc_pool(Duration::from_secs(1));
            drop(other.allocate(64).unwrap());
            drop(other.allocate(64).unwrap());
            assert_eq!(other.stats().hits, 1);
            drop(other);
            other_alloc.assert_all_freed();
        })
    };
    cached.wait();
    drop(pool); // the last handle: frees the worker's cached block
    alloc.assert_all_freed();
    dropped.wait();
    worker.join().unwrap();
}

#[test]
fn a_block_dropped_after_the_last_handle_lets_the_pool_go() {
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(1));
    drop(pool.allocate(64).unwrap()); // this thread has a magazine
    let block = pool.allocate(64).unwrap(); // a hit from it
    drop(pool);
    assert_eq!(alloc.live(), 1);
    drop(block); // the last lent block: the pool goes
    alloc.assert_all_freed();
}

#[test]
fn set_limit_reaches_the_thread_caches() {
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(1));
    cache_on_a_thread(&pool, &[64, 100]);
    assert_eq!(pool.set_limit(Some(50)), 164);
    assert_eq!(alloc.live(), 0);
    let s = pool.stats();
    assert_eq!((s.trimmed, s.bytes_reserved), (2, 0));
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn the_out_of_memory_retry_reaches_the_thread_caches() {
    use decaying_pool::testing::FailingAllocator;
    let alloc = FailingAllocator::with_capacity(4096);
    let pool = SharedPool::with_thread_caches(
        DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(Duration::from_secs(1)))
            .clock(ManualClock::new())
            .build(),
    );
    cache_on_a_thread(&pool, &[1000, 2000]);
    // 3000 bytes idle in the exited thread's magazine, which this thread
    // adopts; 3000 more fit only once the retry frees some.
    let b = pool.allocate(3000).unwrap();
    let s = pool.stats();
    assert_eq!(s.backing_failures, 1);
    assert!(s.trimmed >= 1);
    assert_eq!(s.bytes_reserved, alloc.used());
    drop(b);
    drop(pool);
    alloc.inner().assert_all_freed();
}

#[test]
fn with_sees_the_thread_caches_drained() {
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(1));
    cache_on_a_thread(&pool, &[64]);
    drop(pool.allocate(100).unwrap());
    assert_eq!(pool.with(|p| p.stats().blocks_cached), 2);
    // Back in the shared cache: another thread's request hits.
    drop(pool.allocate(64).unwrap());
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (1, 2));
    pool.with(|p| p.validate());
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn stats_are_exact_across_threads_with_thread_caches() {
    let (pool, alloc, clock) = tc_pool(Duration::from_millis(20));
    let rounds = if cfg!(miri) { 20 } else { 2_000 };
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let (pool, clock) = (pool.clone(), clock.clone());
            thread::spawn(move || churn(&pool, &clock, t * 7919 + 1, rounds, 10, 4))
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let s = pool.stats();
    assert_eq!(s.hits + s.misses, alloc.allocs() + s.hits);
    assert_eq!(s.blocks_in_use, 0);
    assert_eq!(s.backing_allocs, alloc.allocs());
    assert_eq!(s.backing_deallocs, alloc.deallocs());
    assert_eq!(s.bytes_cached, alloc.live_bytes());
    assert_eq!(s.blocks_cached, alloc.live() as u64);
    assert!(s.peak_bytes_in_use <= s.peak_bytes_reserved);
    pool.with(|p| p.validate());
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn thread_caches_stay_off_with_class_statistics() {
    let alloc = CheckingAllocator::new();
    let pool = SharedPool::with_thread_caches(
        DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(Duration::from_secs(1)))
            .clock(ManualClock::new())
            .class_stats(true)
            .build(),
    );
    cache_on_a_thread(&pool, &[64]);
    drop(pool.allocate(64).unwrap()); // the shared cache serves it
    assert_eq!(pool.stats().hits, 1);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
#[cfg_attr(miri, ignore)] // a reaper thread, sleeps and a real clock
fn the_reaper_frees_an_exited_threads_cached_blocks() {
    let alloc = CheckingAllocator::new();
    let pool: SharedPool<_, FixedTime, MonotonicClock> = SharedPool::with_thread_caches(
        DecayingPool::new(alloc.clone(), FixedTime::new(Duration::from_millis(20))),
    );
    let reaper = pool.spawn_reaper(Duration::from_millis(5));
    {
        let pool = pool.clone();
        thread::spawn(move || drop(pool.allocate(64).unwrap()))
            .join()
            .unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(2), || alloc.live() == 0),
        "the reaper did not free the cached block: {:?}",
        pool.stats()
    );
    assert_eq!(pool.stats().evictions, 1);
    drop(reaper);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn a_panic_freeing_a_due_block_of_a_thread_cache_loses_no_block() {
    let (alloc, clock, builder) = panicky();
    let pool = SharedPool::with_thread_caches(builder.build());
    // A release whose magazine first lets a due block go.
    let old = pool.allocate(30).unwrap();
    let young = pool.allocate(40).unwrap();
    drop(old); // into this thread's magazine
    clock.advance(Duration::from_secs(1));
    alloc.panic_dealloc.store(true, Ordering::SeqCst);
    assert!(quiet(move || drop(young)).is_err());
    let s = pool.stats();
    assert_eq!(
        (
            s.blocks_in_use,
            s.blocks_cached,
            s.bytes_cached,
            s.evictions
        ),
        (0, 1, 40, 1)
    );
    assert_eq!(alloc.inner.live(), 1);
    // An allocate that lets a due block go first.
    clock.advance(Duration::from_secs(1));
    alloc.panic_dealloc.store(true, Ordering::SeqCst);
    assert!(quiet(|| pool.allocate(40).map(drop)).is_err());
    let s = pool.stats();
    assert_eq!(
        (s.blocks_in_use, s.blocks_cached, alloc.inner.live()),
        (0, 0, 0)
    );
    // Still usable, and every block accounted for.
    drop(pool.allocate(40).unwrap());
    pool.with(|p| p.validate());
    drop(pool);
    alloc.inner.assert_all_freed();
}

#[test]
fn visitors_meet_owners_at_work_and_every_block_is_accounted_once() {
    // Three threads do round trips through their magazines while a fourth
    // visits every magazine over and over (`stats`, `collect`, `trim`,
    // `set_limit`): each visit claims the magazines while their owners
    // work on them, so both sides of the handshake run many times.
    let (pool, alloc, clock) = tc_pool(Duration::from_millis(5));
    let rounds = if cfg!(miri) { 30 } else { 50_000 };
    let stop = Arc::new(AtomicBool::new(false));
    // The visits so far. On a loaded machine the visitor may not be
    // scheduled before the owners finish: each owner waits for a first
    // visit before its round trips, and for two more after them, so
    // that at least one whole visit meets it at work (holding blocks and
    // its magazine) whatever the scheduler does.
    let visited = Arc::new(AtomicU64::new(0));
    let wait_for = |visited: &AtomicU64, n: u64| {
        while visited.load(Ordering::Acquire) < n {
            thread::yield_now();
        }
    };
    let owners: Vec<_> = (0..3u64)
        .map(|t| {
            let (pool, clock, visited) = (pool.clone(), clock.clone(), Arc::clone(&visited));
            thread::spawn(move || {
                let mut rng = Rng(t * 104_729 + 3);
                let mut held = Vec::new();
                wait_for(&visited, 1);
                for _ in 0..rounds {
                    if held.len() < 12 && rng.below(3) != 0 {
                        let block = pool.allocate(64 << rng.below(3)).unwrap();
                        held.push(block);
                    } else if !held.is_empty() {
                        let k = rng.below(held.len() as u64) as usize;
                        held.swap_remove(k);
                    }
                    if rng.below(64) == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                }
                let seen = visited.load(Ordering::Acquire);
                wait_for(&visited, seen + 2);
                held.len()
            })
        })
        .collect();
    let visitor = {
        let (pool, stop, visited) = (pool.clone(), Arc::clone(&stop), Arc::clone(&visited));
        thread::spawn(move || {
            let mut visits = 0u64;
            let mut last_hits = 0;
            while !stop.load(Ordering::Relaxed) {
                let s = pool.stats();
                // Every snapshot adds up: each block the pool holds is in
                // use or cached, once.
                assert_eq!(
                    s.blocks_in_use + s.blocks_cached,
                    s.backing_allocs - s.backing_deallocs,
                    "{s:?}"
                );
                assert_eq!(s.bytes_in_use + s.bytes_cached, s.bytes_reserved, "{s:?}");
                assert!(s.hits >= last_hits, "hits went back: {s:?}");
                last_hits = s.hits;
                match visits % 8 {
                    0 => drop(pool.trim()),
                    1 => drop(pool.set_limit(None)),
                    _ => drop(pool.collect()),
                }
                visits += 1;
                visited.store(visits, Ordering::Release);
            }
            visits
        })
    };
    for o in owners {
        // Some round trips left blocks held when the last visits met it.
        assert!(o.join().unwrap() > 0);
    }
    stop.store(true, Ordering::Relaxed);
    // A first visit before any round trip, and two after each owner's.
    assert!(visitor.join().unwrap() >= 3);
    let s = pool.stats();
    assert_eq!(s.blocks_in_use, 0);
    assert_eq!(s.hits + s.misses, 2 * s.hits + alloc.allocs() - s.hits);
    assert_eq!(s.backing_allocs, alloc.allocs());
    assert_eq!(s.backing_deallocs, alloc.deallocs());
    assert_eq!(s.blocks_cached, alloc.live() as u64);
    assert_eq!(s.bytes_cached, alloc.live_bytes());
    pool.with(|p| p.validate());
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn one_thread_alternating_between_pools_hits_in_each_magazine() {
    // The hot path finds the magazine of the pool used last with one
    // comparison; switching pools must find each pool's own magazine.
    let (a, alloc_a, _clock_a) = tc_pool(Duration::from_secs(1));
    let (b, alloc_b, _clock_b) = tc_pool(Duration::from_secs(1));
    for _ in 0..10 {
        drop(a.allocate(64).unwrap());
        drop(b.allocate(64).unwrap());
        drop(b.allocate(128).unwrap());
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.hits, sa.misses, sa.blocks_cached), (9, 1, 1));
    assert_eq!((sb.hits, sb.misses, sb.blocks_cached), (18, 2, 2));
    // A pool dropped and another made (perhaps at the same address): the
    // new one starts with an empty magazine of its own.
    drop(a);
    alloc_a.assert_all_freed();
    let (c, alloc_c, _clock_c) = tc_pool(Duration::from_secs(1));
    drop(c.allocate(64).unwrap());
    drop(c.allocate(64).unwrap());
    let sc = c.stats();
    assert_eq!((sc.hits, sc.misses, sc.blocks_cached), (1, 1, 1));
    drop((b, c));
    alloc_b.assert_all_freed();
    alloc_c.assert_all_freed();
}

#[test]
fn threads_that_come_and_go_reuse_the_blocks_of_those_before() {
    // Ten threads one after another, each caching blocks of three sizes in
    // its magazine and exiting: each one after the first adopts the
    // magazine its predecessor left, with its blocks, and hits. (Before
    // magazines were adopted: 30 misses, 30 backing allocations, 30
    // blocks cached.)
    const SIZES: [usize; 3] = [64, 4096, 1 << 20];
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(1));
    for _ in 0..10 {
        cache_on_a_thread(&pool, &SIZES);
    }
    ends_with(pool, &alloc, (27, 3, 3));
}

/// Checks a thread-cached pool's hits, misses and blocks cached (`want`),
/// that it made one backing allocation a miss, then drops it: every
/// block goes back once.
fn ends_with(pool: Tc, alloc: &CheckingAllocator, want: (u64, u64, u64)) {
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), want);
    assert_eq!(alloc.allocs(), s.misses);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn an_adopted_magazines_blocks_expire_when_they_would_have() {
    // A block cached at 0 by a thread that exits; at 600 ms another
    // thread adopts its magazine and caches a block of its own there. At
    // 1 s the first block goes, at 1.6 s the second: adoption starts no
    // idle time again.
    let (pool, alloc, clock) = tc_pool(Duration::from_secs(1));
    cache_on_a_thread(&pool, &[64]);
    clock.advance(Duration::from_millis(600));
    cache_on_a_thread(&pool, &[128]);
    let s = pool.stats();
    assert_eq!((s.misses, s.blocks_cached), (2, 2));
    clock.advance(Duration::from_millis(399));
    assert_eq!(pool.collect(), 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(pool.collect(), 1);
    assert_eq!((alloc.live(), alloc.live_bytes()), (1, 128));
    clock.advance(Duration::from_millis(599));
    assert_eq!(pool.collect(), 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(pool.collect(), 1);
    let s = pool.stats();
    assert_eq!((s.evictions, s.blocks_cached, alloc.live()), (2, 0, 0));
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn a_thread_that_takes_up_the_pool_adopts_the_fullest_magazine_left() {
    // Two threads register at once, cache one and two blocks, and exit:
    // this thread adopts the magazine of two, whose sizes hit, and its
    // request of the other size misses (no other thread adopted that
    // magazine: it waits for one, or for its block to decay).
    let (pool, alloc, _clock) = tc_pool(Duration::from_secs(3600));
    let both = Barrier::new(2);
    thread::scope(|scope| {
        let threads: Vec<_> = [&[64][..], &[128, 256][..]]
            .into_iter()
            .map(|sizes| {
                let (pool, both) = (pool.clone(), &both);
                scope.spawn(move || {
                    let blocks: Vec<_> = sizes.iter().map(|&s| pool.allocate(s).unwrap()).collect();
                    both.wait(); // both have their magazines before either exits
                    drop(blocks);
                })
            })
            .collect();
        // Joined, so that their thread-local tables are gone too (the end
        // of the scope waits for the closures only).
        for t in threads {
            t.join().unwrap();
        }
    });
    for size in [128, 256, 64] {
        drop(pool.allocate(size).unwrap());
    }
    ends_with(pool, &alloc, (2, 4, 4));
}

#[test]
fn threads_that_come_and_go_while_others_collect_lose_nothing() {
    // Two threads each start short-lived threads one after another, which
    // churn blocks and exit (each new one adopting a magazine left), while
    // this thread collects and reads the statistics (visiting every
    // magazine, adopted or waiting): every count still adds up, and every
    // block goes back once.
    let (pool, alloc, clock) = tc_pool(Duration::from_millis(20));
    let done = AtomicBool::new(false);
    thread::scope(|scope| {
        let spawners: Vec<_> = (0..2u64)
            .map(|s| {
                let (pool, clock) = (pool.clone(), clock.clone());
                scope.spawn(move || {
                    for t in 0..if cfg!(miri) { 3 } else { 40 } {
                        let (pool, clock) = (pool.clone(), clock.clone());
                        thread::spawn(move || {
                            churn(&pool, &clock, 100 * s + t + 1, ops(300), 6, 5)
                        })
                        .join()
                        .unwrap();
                    }
                })
            })
            .collect();
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                pool.collect();
                let s = pool.stats();
                assert!(s.blocks_cached <= s.backing_allocs - s.backing_deallocs);
                thread::yield_now();
            }
        });
        for s in spawners {
            s.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let s = pool.stats();
    assert_eq!(s.blocks_in_use, 0);
    assert_eq!(
        (s.misses, s.backing_allocs),
        (alloc.allocs(), alloc.allocs())
    );
    assert_eq!(s.backing_deallocs, alloc.deallocs());
    assert_eq!(s.bytes_cached, alloc.live_bytes());
    clock.advance(Duration::from_millis(20));
    pool.collect();
    assert_eq!((pool.stats().blocks_cached, alloc.live()), (0, 0));
    drop(pool);
    alloc.assert_all_freed();
}
