//! Panics from the backing allocator, the clock or the policy, at every
//! point where the pool holds a block or a booking: no block is lost, the
//! counters and the limit stay true, the first panic is passed on, and no
//! panic ever aborts the process. Also the bounds of the public API
//! (`SharedPool::with`, `FixedCapacity::new`, `validate` under a clock set
//! back).

use crate::support::quiet;
use core::time::Duration;
use std::any::Any;

use decaying_pool::policy::TooManySlots;
use decaying_pool::testing::{
    CheckingAllocator, FailingAllocator, PanicSwitch, PanickingAllocator, PanickingClock,
    PanickingPolicy, PolicySwitches,
};
use decaying_pool::{
    DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, Policy, RawAllocator, Reuse,
    SharedPool,
};

/// The message of a panic payload.
fn message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("<not a string>")
}

/// Asserts that `r` is a panic injected by a `PanicSwitch`.
#[track_caller]
fn assert_injected<R>(r: std::thread::Result<R>) {
    match r {
        Ok(_) => panic!("expected an injected panic, got none"),
        Err(p) => assert!(
            message(&*p).starts_with(PanicSwitch::MESSAGE),
            "expected an injected panic, got {:?}",
            message(&*p)
        ),
    }
}

const SECOND: Duration = Duration::from_secs(1);

/// A pool over a checking allocator and a manual clock (at zero) whose
/// one-second `FixedTime` policy panics on demand; with the allocator, the
/// clock and the policy's switches.
fn policy_panicking_pool() -> (
    DecayingPool<CheckingAllocator, PanickingPolicy<FixedTime>, ManualClock>,
    CheckingAllocator,
    ManualClock,
    PolicySwitches,
) {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let policy = PanickingPolicy::new(FixedTime::new(SECOND));
    let switches = policy.switches();
    let pool = DecayingPool::builder(alloc.clone())
        .policy(policy)
        .clock(clock.clone())
        .build();
    (pool, alloc, clock, switches)
}

/// Caches a block of 10 bytes and lets it fall due (a one-second
/// time-to-live), then releases a block of 20 bytes with a panic armed by
/// `arm`: asserts that the release passed the injected panic on and that
/// the pool still validates. Returns the block of 10 bytes.
fn release_beside_a_due_block<A, P>(
    pool: &mut DecayingPool<A, P, ManualClock>,
    clock: &ManualClock,
    arm: impl FnOnce(),
) -> u64
where
    A: RawAllocator<Block = u64>,
    A::Error: core::fmt::Debug,
    P: Policy,
{
    let (a, b) = (pool.allocate(10).unwrap(), pool.allocate(20).unwrap());
    // SAFETY: every block here came from this pool with this size, released once.
    unsafe { pool.release(a, 10) };
    clock.advance(SECOND);
    arm();
    // SAFETY: as above.
    assert_injected(quiet(|| unsafe { pool.release(b, 20) }));
    pool.validate();
    a
}

// ---------------------------------------------------------------------------
// A panic during `release`

/// The clock panics as `release` reads it: the block is given back to the
/// backing allocator (the pool knows no time to cache it at), counted as
/// trimmed, and the limit gets its room back.
#[test]
fn a_release_whose_clock_panics_frees_the_block() {
    let alloc = CheckingAllocator::new();
    let clock = PanickingClock::new(ManualClock::new());
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(SECOND))
        .clock(clock.clone())
        .limit(100)
        .build();
    let b = pool.allocate(100).unwrap();
    clock.switch().panic_on(1);
    // SAFETY: `b` came from this pool with this size, released once.
    assert_injected(quiet(|| unsafe { pool.release(b, 100) }));
    pool.validate();
    let s = pool.stats();
    assert_eq!(
        (s.blocks_in_use, s.blocks_cached, s.bytes_reserved),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!((s.backing_deallocs, s.trimmed), (1, 1));
    assert_eq!(alloc.live(), 0, "the block went back to the allocator");
    // The whole limit is free again.
    let b = pool.allocate(100).unwrap();
    // SAFETY: as above.
    unsafe { pool.release(b, 100) };
    drop(pool);
    alloc.assert_all_freed();
}

/// The policy panics in the run that precedes caching: the block is
/// cached at the time the release read, and the expired block the policy
/// was looking at stays cached (it goes at the next run).
#[test]
fn a_release_whose_policy_panics_caches_the_block() {
    let (mut pool, alloc, clock, switches) = policy_panicking_pool();
    release_beside_a_due_block(&mut pool, &clock, || switches.must_evict.panic_on(1));
    let s = pool.stats();
    assert_eq!(
        (s.blocks_in_use, s.blocks_cached, s.bytes_cached),
        (0, 2, 30)
    );
    // The block of 10 is due, that of 20 was cached at the release's time.
    assert_eq!(pool.collect(), 1);
    assert_eq!(pool.stats().bytes_cached, 20);
    clock.advance(SECOND);
    assert_eq!(pool.collect(), 1);
    pool.validate();
    drop(pool);
    alloc.assert_all_freed();
}

/// `on_free` panics while the release's policy run evicts: same outcome.
#[test]
fn a_release_whose_on_free_panics_caches_the_block() {
    let (mut pool, alloc, clock, switches) = policy_panicking_pool();
    release_beside_a_due_block(&mut pool, &clock, || switches.on_free.panic_on(1));
    let s = pool.stats();
    assert_eq!((s.blocks_in_use, s.blocks_cached), (0, 2), "{s:?}");
    drop(pool);
    alloc.assert_all_freed();
}

/// The backing `deallocate` panics on the block the release's policy run
/// evicts: that block was offered (and counted freed), the released block
/// is cached.
#[test]
fn a_release_whose_eviction_deallocate_panics_caches_the_block() {
    let alloc = PanickingAllocator::new(CheckingAllocator::new());
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(SECOND))
        .clock(clock.clone())
        .build();
    let a = release_beside_a_due_block(&mut pool, &clock, || alloc.on_deallocate().panic_on(1));
    let s = pool.stats();
    assert_eq!(
        (
            s.blocks_in_use,
            s.blocks_cached,
            s.bytes_cached,
            s.evictions
        ),
        (0, 1, 20, 1),
        "{s:?}"
    );
    drop(pool);
    // Only `a`, whose `deallocate` panicked before freeing it, is left.
    assert_eq!(alloc.inner().live(), 1);
    assert_eq!(alloc.inner().size_of(a), Some(10));
}

/// `on_release` panics after the store took the block, and `on_hit`
/// before it gave one: either way the block is where the counters say.
#[test]
fn panics_in_on_release_and_on_hit_keep_the_block_accounted() {
    let (mut pool, alloc, _, switches) = policy_panicking_pool();
    let b = pool.allocate(10).unwrap();
    switches.on_release.panic_on(1);
    // SAFETY: `b` came from this pool with this size, released once.
    assert_injected(quiet(|| unsafe { pool.release(b, 10) }));
    pool.validate();
    assert_eq!(pool.stats().blocks_cached, 1);
    switches.on_hit.panic_on(1);
    assert_injected(quiet(|| pool.allocate(10).map(drop)));
    pool.validate();
    let s = pool.stats();
    assert_eq!((s.blocks_cached, s.blocks_in_use, s.hits), (1, 0, 0));
    assert_eq!(pool.allocate(10).unwrap(), b);
    // SAFETY: as above.
    unsafe { pool.release(b, 10) };
    drop(pool);
    alloc.assert_all_freed();
}

/// Under `FixedCapacity`, the block a release displaces from a full window
/// is offered to `deallocate` after the released block is in the table: a
/// panic there loses neither.
#[test]
fn a_fixed_capacity_release_whose_displaced_block_panics_keeps_the_block() {
    let alloc = PanickingAllocator::new(CheckingAllocator::new());
    let mut pool = DecayingPool::new(alloc.clone(), FixedCapacity::new(1));
    let (a, b) = (pool.allocate(10).unwrap(), pool.allocate(10).unwrap());
    // SAFETY: every block here came from this pool with this size, released once.
    unsafe { pool.release(a, 10) };
    alloc.on_deallocate().panic_on(1);
    // SAFETY: as above.
    assert_injected(quiet(|| unsafe { pool.release(b, 10) }));
    pool.validate();
    let s = pool.stats();
    assert_eq!((s.blocks_cached, s.blocks_in_use, s.evictions), (1, 0, 1));
    assert_eq!(pool.allocate(10).unwrap(), b);
    // SAFETY: as above.
    unsafe { pool.release(b, 10) };
    drop(pool);
    // Only `a`, whose `deallocate` panicked before freeing it, is left.
    assert_eq!(alloc.inner().live(), 1);
    assert_eq!(alloc.inner().size_of(a), Some(10));
}

/// A `Pooled` dropped while the clock panics: the block is freed, and the
/// limit capacity it held is not lost.
#[test]
fn a_pooled_whose_clock_panics_gives_its_block_back() {
    let alloc = CheckingAllocator::new();
    let clock = PanickingClock::new(ManualClock::new());
    let pool = SharedPool::new(
        DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(SECOND))
            .clock(clock.clone())
            .limit(100)
            .build(),
    );
    let held = pool.allocate(100).unwrap();
    clock.switch().panic_on(1);
    assert_injected(quiet(move || drop(held)));
    let s = pool.stats();
    assert_eq!(
        (s.blocks_in_use, s.blocks_cached, s.bytes_reserved),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!(alloc.live(), 0);
    drop(pool.allocate(100).expect("the limit has its room back"));
    drop(pool);
    alloc.assert_all_freed();
}

/// The hit path of a `SharedPool` (nothing due, a block cached) with a
/// clock, then a policy, that panics there: the cache lock is let go, the
/// block stays cached, and the next allocate hits it on this thread and on
/// another (a lock left held would hang it). Then the release path, with
/// a policy that panics once the block is cached: the block stays cached
/// and is counted back.
#[test]
fn a_shared_hit_whose_clock_or_policy_panics_keeps_its_block() {
    let alloc = CheckingAllocator::new();
    let clock = PanickingClock::new(ManualClock::new());
    let policy = PanickingPolicy::new(FixedTime::new(SECOND));
    let switches = policy.switches();
    let pool = SharedPool::new(
        DecayingPool::builder(alloc.clone())
            .policy(policy)
            .clock(clock.clone())
            .build(),
    );
    // A miss, then a hit, whose collection plans the deadline: from then
    // on nothing is due, and a hit takes the shortest path.
    drop(pool.allocate(100).unwrap());
    drop(pool.allocate(100).unwrap());
    for switch in [clock.switch(), &switches.on_hit] {
        switch.panic_on(1);
        assert_injected(quiet(|| pool.allocate(100).map(drop)));
        let s = pool.stats();
        assert_eq!(
            (s.blocks_in_use, s.blocks_cached, s.hits, s.misses),
            (0, 1, 1, 1),
            "{s:?}"
        );
        pool.with(|p| p.validate());
    }
    let other = pool.clone();
    std::thread::spawn(move || drop(other.allocate(100).unwrap()))
        .join()
        .unwrap();
    drop(pool.allocate(100).unwrap());
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_cached), (3, 1, 1), "{s:?}");
    let block = pool.allocate(100).unwrap();
    switches.on_release.panic_on(1);
    assert_injected(quiet(move || drop(block)));
    let s = pool.stats();
    assert_eq!((s.blocks_in_use, s.blocks_cached), (0, 1), "{s:?}");
    pool.with(|p| p.validate());
    // The panicked hits and release counted no block lent: the last lent
    // block lets the pool go, with its cached blocks (else it stays, and
    // they too).
    let kept = pool.allocate(50).unwrap();
    drop(pool);
    assert_eq!(alloc.live(), 2);
    drop(kept);
    alloc.assert_all_freed();
}

// ---------------------------------------------------------------------------
// A panicking miss

/// The backing `allocate` panics: the miss's booking against the limit is
/// dropped, so the whole limit is still available.
#[test]
fn a_panicking_backing_allocate_drops_its_booking() {
    let alloc = PanickingAllocator::new(CheckingAllocator::new());
    let mut pool = DecayingPool::builder(alloc.clone())
        .clock(ManualClock::new())
        .limit(100)
        .build();
    alloc.on_allocate().panic_on(1);
    assert_injected(quiet(|| pool.allocate(100).map(drop)));
    pool.validate();
    let s = pool.stats();
    assert_eq!((s.misses, s.backing_allocs, s.bytes_reserved), (0, 0, 0));
    let b = pool.allocate(100).expect("the booking was dropped");
    // SAFETY: `b` came from this pool with this size, released once.
    unsafe { pool.release(b, 100) };
    drop(pool);
    alloc.inner().assert_all_freed();
}

/// `on_free` panics while the out-of-memory retry frees a cached block:
/// the booking is dropped too.
#[test]
fn a_panic_in_the_out_of_memory_retry_drops_the_booking() {
    let alloc = FailingAllocator::with_capacity(100);
    let policy = PanickingPolicy::new(FixedTime::new(10 * SECOND));
    let switches = policy.switches();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(policy)
        .clock(ManualClock::new())
        .limit(1000)
        .build();
    let a = pool.allocate(60).unwrap();
    // SAFETY: `a` came from this pool with this size, released once.
    unsafe { pool.release(a, 60) };
    // 60 + 70 > 100: the backing call fails, the retry frees `a` and
    // `on_free` panics.
    switches.on_free.panic_on(1);
    assert_injected(quiet(|| pool.allocate(70).map(drop)));
    pool.validate();
    assert_eq!(pool.stats().blocks_in_use, 0);
    alloc.set_capacity(None);
    // Nothing is in use: the whole limit must be available.
    let b = pool
        .allocate(1000)
        .expect("the panicking miss's booking was dropped");
    // SAFETY: `b` came from this pool with this size, released once.
    unsafe { pool.release(b, 1000) };
    pool.validate();
    drop(pool);
    alloc.inner().assert_all_freed();
}

/// `SharedPool` already dropped the booking of a panicking miss: keep it so.
#[test]
fn a_shared_pool_drops_the_booking_of_a_panicking_miss() {
    let alloc = PanickingAllocator::new(CheckingAllocator::new());
    let pool = SharedPool::new(
        DecayingPool::builder(alloc.clone())
            .clock(ManualClock::new())
            .limit(100)
            .build(),
    );
    alloc.on_allocate().panic_on(1);
    assert_injected(quiet(|| pool.allocate(100).map(drop)));
    drop(pool.allocate(100).expect("the booking was dropped"));
    drop(pool);
    alloc.inner().assert_all_freed();
}

// ---------------------------------------------------------------------------
// Dropping a pool

/// A pool with five cached blocks of 10, 20, …, 50 bytes (none in use).
/// Also returns the policy's switches.
fn five_cached<A: decaying_pool::RawAllocator<Block = u64>>(
    alloc: A,
    clock: PanickingClock,
) -> (
    DecayingPool<A, PanickingPolicy<FixedTime>, PanickingClock>,
    PolicySwitches,
) {
    let policy = PanickingPolicy::new(FixedTime::new(10 * SECOND));
    let switches = policy.switches();
    let mut pool = DecayingPool::builder(alloc)
        .policy(policy)
        .clock(clock)
        .build();
    let blocks: Vec<_> = (1..=5)
        .map(|i| (pool.allocate(i * 10).unwrap(), i * 10))
        .collect();
    for (b, size) in blocks {
        // SAFETY: every block came from this pool with this size, released once.
        unsafe { pool.release(b, size) };
    }
    assert_eq!(pool.stats().blocks_cached, 5);
    (pool, switches)
}

/// Drops `pool` (five blocks cached over `alloc`, the last handle) with
/// the first `deallocate` armed to panic: asserts that the panic is passed
/// on and the other four blocks are still freed.
fn assert_drop_offers_every_block<T>(pool: T, alloc: &PanickingAllocator<CheckingAllocator>) {
    alloc.on_deallocate().panic_on(1);
    assert_injected(quiet(move || drop(pool)));
    assert_eq!(alloc.on_deallocate().calls(), 5, "every block offered");
    assert_eq!(alloc.inner().deallocs(), 4, "the other four freed");
    assert_eq!(alloc.inner().live(), 1, "only the panicking call's block");
}

/// Drops `pool` (five blocks cached over `alloc`, the last handle) while
/// its thread unwinds from a user's panic, with the `nth` `deallocate`
/// armed to panic: asserts no abort, the user's panic goes on, every other
/// block is freed.
fn assert_drop_while_unwinding_does_not_abort<T>(
    pool: T,
    alloc: &PanickingAllocator<CheckingAllocator>,
    nth: u64,
) {
    alloc.on_deallocate().panic_on(nth);
    let r = quiet(move || {
        let _pool = pool;
        panic!("the user's panic");
    });
    assert_eq!(message(&*r.unwrap_err()), "the user's panic");
    assert_eq!(alloc.on_deallocate().calls(), 5);
    assert_eq!(alloc.inner().live(), 1);
}

/// The first of five `deallocate` calls panics as the pool drops: the
/// other four blocks are still freed, and the panic is passed on.
#[test]
fn dropping_a_pool_offers_every_block_when_a_deallocate_panics() {
    let alloc = PanickingAllocator::new(CheckingAllocator::new());
    let (pool, _) = five_cached(alloc.clone(), PanickingClock::default());
    assert_drop_offers_every_block(pool, &alloc);
}

/// The same through the last `SharedPool` handle.
#[test]
fn dropping_a_shared_pool_offers_every_block_when_a_deallocate_panics() {
    let alloc = PanickingAllocator::new(CheckingAllocator::new());
    let pool = SharedPool::new(five_cached(alloc.clone(), PanickingClock::default()).0);
    assert_drop_offers_every_block(pool, &alloc);
}

/// A pool dropped while its thread unwinds, whose `deallocate` panics:
/// no abort, the original panic goes on, every other block is freed.
#[test]
fn dropping_a_pool_while_unwinding_does_not_abort() {
    let alloc = PanickingAllocator::new(CheckingAllocator::new());
    let (pool, _) = five_cached(alloc.clone(), PanickingClock::default());
    assert_drop_while_unwinding_does_not_abort(pool, &alloc, 2);
}

/// The same for a `SharedPool` whose last handle drops during unwinding.
#[test]
fn dropping_a_shared_pool_while_unwinding_does_not_abort() {
    let alloc = PanickingAllocator::new(CheckingAllocator::new());
    let pool = SharedPool::new(five_cached(alloc.clone(), PanickingClock::default()).0);
    assert_drop_while_unwinding_does_not_abort(pool, &alloc, 1);
}

/// `on_free` panics as the pool drops: every block still goes back.
#[test]
fn dropping_a_pool_frees_every_block_when_the_policy_panics() {
    let alloc = CheckingAllocator::new();
    let (pool, switches) = five_cached(alloc.clone(), PanickingClock::default());
    switches.on_free.panic_on(2);
    assert_injected(quiet(move || drop(pool)));
    alloc.assert_all_freed();
}

/// The clock panics as the pool drops: every block still goes back.
#[test]
fn dropping_a_pool_frees_every_block_when_the_clock_panics() {
    let alloc = CheckingAllocator::new();
    let clock = PanickingClock::default();
    let (pool, _) = five_cached(alloc.clone(), clock.clone());
    clock.switch().panic_on(1);
    // Whether the drop reads the clock at all is the pool's business; if it
    // does, the panic is passed on.
    let _ = quiet(move || drop(pool));
    alloc.assert_all_freed();
}

// ---------------------------------------------------------------------------
// validate() under a clock set back

/// `ManualClock::set` may move the clock back; `validate` must accept
/// whatever the pool then does.
#[test]
fn validate_accepts_a_clock_set_back() {
    for reuse in [Reuse::Lifo, Reuse::Fifo] {
        let alloc = CheckingAllocator::new();
        let clock = ManualClock::new();
        let mut pool = DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(10 * SECOND))
            .clock(clock.clone())
            .reuse(reuse)
            .build();
        let blocks: Vec<_> = (0..4).map(|_| pool.allocate(8).unwrap()).collect();
        clock.set(5 * SECOND);
        for (i, b) in blocks.into_iter().enumerate() {
            // SAFETY: every block came from this pool with this size, released once.
            unsafe { pool.release(b, 8) };
            pool.validate();
            // Back a second after each release.
            clock.set((4 - i as u32) * SECOND);
        }
        // Hits from either end, then more releases and a collection.
        let b = pool.allocate(8).unwrap();
        pool.validate();
        clock.set(Duration::ZERO);
        // SAFETY: as above.
        unsafe { pool.release(b, 8) };
        pool.validate();
        let (c, d) = (pool.allocate(8).unwrap(), pool.allocate(8).unwrap());
        pool.validate();
        // SAFETY: as above.
        unsafe {
            pool.release(d, 8);
            pool.release(c, 8);
        }
        pool.validate();
        clock.set(12 * SECOND);
        pool.collect();
        pool.validate();
        clock.set(SECOND);
        pool.collect();
        pool.validate();
        drop(pool);
        alloc.assert_all_freed();
    }
}

// ---------------------------------------------------------------------------
// FixedCapacity bounds

/// A huge slot count neither panics nor tries to allocate a table larger
/// than memory.
#[test]
#[cfg_attr(miri, ignore = "builds a table of a million slots")]
fn a_huge_fixed_capacity_builds_a_bounded_table() {
    for slots in [
        1usize << 40,
        u32::MAX as usize,
        (u32::MAX - 1) as usize,
        usize::MAX,
    ] {
        let alloc = CheckingAllocator::new();
        let mut pool = DecayingPool::new(alloc.clone(), FixedCapacity::new(slots));
        let b = pool.allocate(64).unwrap();
        // SAFETY: `b` came from this pool with this size, released once.
        unsafe { pool.release(b, 64) };
        assert_eq!(pool.stats().blocks_cached, 1);
        assert_eq!(pool.allocate(64).unwrap(), b);
        // SAFETY: as above.
        unsafe { pool.release(b, 64) };
        pool.validate();
        drop(pool);
        alloc.assert_all_freed();
    }
}

/// `try_new` refuses what `new` clamps.
#[test]
fn fixed_capacity_has_a_documented_bound() {
    assert_eq!(
        FixedCapacity::new(1 << 40).slots(),
        FixedCapacity::MAX_SLOTS
    );
    assert_eq!(
        FixedCapacity::new(FixedCapacity::MAX_SLOTS).slots(),
        FixedCapacity::MAX_SLOTS
    );
    assert_eq!(FixedCapacity::try_new(0).map(|p| p.slots()), Ok(0));
    assert_eq!(
        FixedCapacity::try_new(FixedCapacity::MAX_SLOTS).map(|p| p.slots()),
        Ok(FixedCapacity::MAX_SLOTS)
    );
    let err = FixedCapacity::try_new(FixedCapacity::MAX_SLOTS + 1).unwrap_err();
    assert_eq!(
        err,
        TooManySlots {
            requested: FixedCapacity::MAX_SLOTS + 1
        }
    );
}

// ---------------------------------------------------------------------------
// SharedPool::with

/// What `with` still offers: the getters, raw blocks and the collections,
/// all on the pool the handle holds (that the pool cannot be replaced is a
/// compile-fail doctest on `LockedPool`).
#[test]
fn with_offers_the_pool_in_place() {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let pool = SharedPool::new(
        DecayingPool::builder(alloc.clone())
            .policy(FixedTime::new(SECOND))
            .clock(clock.clone())
            .size_class(decaying_pool::SizeClass::PowerOfTwo)
            .limit(1 << 20)
            .build(),
    );
    let held = pool.allocate(3000).unwrap();
    let (limit, class, allocs) = pool.with(|p| {
        p.validate();
        (p.limit(), p.class_size(3000), p.allocator().allocs())
    });
    assert_eq!((limit, class, allocs), (Some(1 << 20), Some(4096), 1));

    // A raw block round trip, and one through `into_raw`.
    let raw = pool.with(|p| p.allocate(100)).unwrap();
    // SAFETY: `raw` came from this pool with 100 bytes, given back once.
    pool.with(|p| unsafe { p.release(raw, 100) });
    let (block, size) = pool.allocate(5000).unwrap().into_raw();
    // SAFETY: as above, through `into_raw`.
    pool.with(|p| unsafe { p.release(block, size) });
    assert_eq!(pool.stats().blocks_cached, 2);

    clock.advance(SECOND);
    assert_eq!(pool.with(|p| p.collect()), 2);
    drop(held);
    assert_eq!(pool.with(|p| p.trim()), 4096);
    pool.with(|p| {
        assert_eq!(p.stats().bytes_reserved, 0);
        assert!(format!("{p:?}").starts_with("LockedPool"));
    });
    drop(pool);
    alloc.assert_all_freed();
}

/// `on_release` panics under `Exponential`, whose planned deadline a
/// release can bring forward: the block stays cached, unknown to the
/// policy, and the store forgets the deadline it planned without it, so
/// the next collection asks the policy instead of skipping a due eviction.
#[test]
fn a_release_whose_on_release_panics_forgets_the_planned_deadline() {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let policy = PanickingPolicy::new(Exponential::new(SECOND));
    let switches = policy.switches();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(policy)
        .clock(clock.clone())
        .build();
    let (a, b) = (pool.allocate(64).unwrap(), pool.allocate(64).unwrap());
    // SAFETY: every block here came from this pool with this size, released once.
    unsafe { pool.release(a, 64) };
    // Nothing due: the store plans the deadline of one 64-byte block.
    assert_eq!(pool.collect(), 0);
    switches.on_release.panic_on(1);
    // SAFETY: as above.
    assert_injected(quiet(|| unsafe { pool.release(b, 64) }));
    assert_eq!(pool.stats().blocks_cached, 2);
    // Before the planned deadline (one half-life), the policy is asked and
    // lets a block go: it holds 128 bytes against an allowance it keeps for
    // 64. (In debug builds a deadline kept in force panics here.)
    clock.advance(SECOND * 6 / 10);
    assert_eq!(pool.collect(), 1);
    pool.validate();
    drop(pool);
    alloc.assert_all_freed();
}

// ----------------------------------------------------- byte views of Pooled

/// `Pooled`'s byte views over host memory: each thread fills its own
/// blocks through `fill` and `as_uninit_mut` and reads them back through
/// `as_uninit`, on a plain, a thread-cached and a packed shared pool; the
/// blocks are distinct (no thread sees another's bytes), also when reused.
#[test]
fn pooled_byte_views_are_each_blocks_own() {
    use core::mem::MaybeUninit;
    use decaying_pool::{Packing, Pooled, SystemAllocator};

    fn exercise<P: Policy + Send, C: decaying_pool::Clock + Send>(
        pool: &SharedPool<SystemAllocator, P, C>,
        kind: &str,
    ) {
        std::thread::scope(|s| {
            for t in 0..2u8 {
                s.spawn(move || {
                    // Fewer, smaller blocks under Miri, which checks each byte.
                    let (rounds, medium, large) = if cfg!(miri) {
                        (2, 700, 1500)
                    } else {
                        (20, 3000, 70_000)
                    };
                    for round in 0..rounds {
                        let sizes = [24 + round, medium, large];
                        let mut held: Vec<Pooled<SystemAllocator, P, C>> =
                            sizes.iter().map(|&n| pool.allocate(n).unwrap()).collect();
                        for (i, block) in held.iter_mut().enumerate() {
                            let byte = t * 16 + i as u8;
                            assert_eq!(block.fill(byte).len(), block.size());
                            block.as_uninit_mut()[0] = MaybeUninit::new(0xff - byte);
                        }
                        std::thread::yield_now();
                        for (i, block) in held.iter().enumerate() {
                            let byte = t * 16 + i as u8;
                            let view = block.as_uninit();
                            assert_eq!(view.len(), block.size(), "{kind}");
                            // SAFETY: every byte was written by `fill` (the
                            // first again since), and `u8` has the layout of
                            // `MaybeUninit<u8>`.
                            let bytes = unsafe {
                                core::slice::from_raw_parts(view.as_ptr().cast::<u8>(), view.len())
                            };
                            assert_eq!(bytes[0], 0xff - byte, "{kind}");
                            assert!(bytes[1..].iter().all(|&b| b == byte), "{kind}: thread {t}");
                        }
                    }
                });
            }
        });
        pool.validate();
    }

    let plain = || DecayingPool::new(SystemAllocator::new(), FixedTime::default());
    exercise(&SharedPool::new(plain()), "plain");
    exercise(&SharedPool::with_thread_caches(plain()), "thread caches");
    let packed = DecayingPool::builder(SystemAllocator::new())
        .packing(Packing::default())
        .build();
    exercise(&SharedPool::packed(packed), "packed");
}

/// A `Pooled` is `Sync`: shared by reference, its bytes are read from
/// several threads at once.
#[test]
fn a_pooled_block_is_read_from_two_threads() {
    use decaying_pool::SystemAllocator;
    let pool = SharedPool::new(DecayingPool::new(
        SystemAllocator::new(),
        FixedTime::default(),
    ));
    let mut block = pool.allocate(256).unwrap();
    block.fill(7);
    let block = &block;
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(move || {
                let view = block.as_uninit();
                // SAFETY: every byte was written by `fill`, and `u8` has
                // the layout of `MaybeUninit<u8>`.
                let bytes =
                    unsafe { core::slice::from_raw_parts(view.as_ptr().cast::<u8>(), view.len()) };
                assert!(bytes.iter().all(|&b| b == 7));
            });
        }
    });
}
