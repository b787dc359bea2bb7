//! Tests: a panic inside the pool (the clock, here) while the packing layer
//! works loses no segment: every backing block still goes back exactly once.

use std::panic::{AssertUnwindSafe, catch_unwind};

use decaying_pool::testing::{CheckingAllocator, PanickingClock};
use decaying_pool::{DecayingPool, FixedTime, ManualClock, PackedPool, Packing};

/// A packed pool (default packing and policy) over a checking allocator
/// that hands out addresses, on a clock that panics on demand; with the
/// allocator and the clock.
fn packed_pool() -> (
    PackedPool<CheckingAllocator, FixedTime, PanickingClock>,
    CheckingAllocator,
    PanickingClock,
) {
    let alloc = CheckingAllocator::with_addresses();
    let clock = PanickingClock::new(ManualClock::new());
    let pool = DecayingPool::builder(alloc.clone())
        .clock(clock.clone())
        .packing(Packing::default())
        .build();
    (pool, alloc, clock)
}

/// A clock panic on each of the calls a medium allocate makes (the policy
/// run, the segment's miss): the layer stays consistent, and every block
/// is freed at drop.
#[test]
fn clock_panics_in_packed_allocate_lose_no_segment() {
    let (mut pool, alloc, clock) = packed_pool();
    let b = pool.allocate(100).unwrap();
    let mut panicked = 0;
    for n in 1..6 {
        clock.switch().panic_on(n);
        let r = catch_unwind(AssertUnwindSafe(|| pool.allocate(5 << 20)));
        clock.switch().panic_on(0);
        match r {
            // SAFETY: from this pool with this size, released once.
            Ok(Ok(x)) => unsafe { pool.release(x, 5 << 20) },
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => panicked += 1,
        }
        pool.validate();
    }
    assert!(panicked > 0);
    // SAFETY: from this pool with this size, released once.
    unsafe { pool.release(b, 100) };
    pool.validate();
    drop(pool);
    alloc.assert_all_freed();
}

/// A clock panic while a carved block is released: the block must still
/// go back to its segment, so that the segment empties and is freed.
/// (Found here: the layer used to take the block out of its table before
/// running the policy, and a panic there stranded the segment.)
#[test]
fn clock_panic_in_packed_release_loses_no_segment() {
    let (mut pool, alloc, clock) = packed_pool();
    let a = pool.allocate(100).unwrap();
    let b = pool.allocate(100).unwrap();
    clock.switch().panic_on(1);
    // SAFETY: from this pool with this size, released once (the panic does
    // not hand it back).
    let r = catch_unwind(AssertUnwindSafe(|| unsafe { pool.release(a, 100) }));
    assert!(r.is_err());
    pool.validate();
    // SAFETY: from this pool with this size, released once.
    unsafe { pool.release(b, 100) };
    assert_eq!(
        pool.packing_stats().segments,
        0,
        "{:?}",
        pool.packing_stats()
    );
    drop(pool);
    alloc.assert_all_freed();
}
