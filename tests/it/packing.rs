//! The packing layer: carving, coalescing, segments in and out of the
//! exact pool, caps, fallback, accounting, bad input.
//!
//! `the_packed_row_meets_its_targets_on_the_shared_traces` replays the
//! training and inference traces the repository ships in `cli/traces`
//! (not in the packaged library crate, where the test is skipped with a
//! note).

use core::time::Duration;
use std::panic::{AssertUnwindSafe, catch_unwind};

use decaying_pool::testing::{CheckingAllocator, FailingAllocator};
use decaying_pool::{
    DecayingPool, FixedTime, ManualClock, PackedPool, Packing, PoolError, SystemAllocator,
};

use crate::support::{Rng, freed_ids};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

type Checked = PackedPool<CheckingAllocator, FixedTime, ManualClock>;

fn packed(packing: Packing) -> (Checked, CheckingAllocator, ManualClock) {
    let alloc = CheckingAllocator::with_addresses();
    let clock = ManualClock::new();
    let pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone())
        .packing(packing)
        .build();
    (pool, alloc, clock)
}

#[test]
fn small_requests_are_carved_side_by_side_from_one_segment() {
    let (mut pool, alloc, _) = packed(Packing::default());
    let a = pool.allocate(100).unwrap();
    let b = pool.allocate(1000).unwrap();
    let c = pool.allocate(512).unwrap();
    assert_eq!(alloc.allocs(), 1, "one segment serves all three");
    let seg = a;
    assert_eq!(alloc.size_of(seg), Some(2 * MIB), "a 2 MiB small segment");
    assert_eq!(
        (b - a, c - b),
        (512, 1024),
        "rounded to 512 B, packed in order"
    );
    let s = pool.packing_stats();
    assert_eq!((s.carved, s.segments, s.packed_blocks), (3, 1, 3));
    assert_eq!(s.packed_bytes, 512 + 1024 + 512);
    assert_eq!(s.bytes_requested, 1612);
    pool.validate();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(a, 100);
        pool.release(b, 1000);
        pool.release(c, 512);
    }
    pool.validate();
}

#[test]
fn freed_ranges_coalesce_and_serve_any_packed_size() {
    let (mut pool, alloc, _) = packed(Packing::default());
    // Fill most of a 2 MiB segment with 64 KiB blocks, keep one at the end.
    let blocks: Vec<u64> = (0..32).map(|_| pool.allocate(64 * KIB).unwrap()).collect();
    assert_eq!(alloc.allocs(), 1);
    for &b in &blocks[..31] {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, 64 * KIB) };
    }
    pool.validate();
    // The 31 freed neighbours merged: one 1 MiB block fits at the start.
    let big = pool.allocate(MIB).unwrap();
    assert_eq!(big, blocks[0], "the coalesced range is reused at once");
    assert_eq!(alloc.allocs(), 1, "no new segment");
    // And a medium-sized neighbour of other sizes still fits the rest.
    let odd = pool.allocate(700 * KIB).unwrap();
    assert_eq!(odd, blocks[0] + MIB as u64);
    assert_eq!(alloc.allocs(), 1);
    pool.validate();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(big, MIB);
        pool.release(odd, 700 * KIB);
        pool.release(blocks[31], 64 * KIB);
    }
    assert_eq!(pool.packing_stats().segments, 0);
    pool.validate();
}

#[test]
fn requests_above_the_medium_threshold_are_exact_blocks() {
    let (mut pool, alloc, _) = packed(Packing::default().medium_threshold(8 * MIB));
    let big = pool.allocate(8 * MIB + 1).unwrap();
    assert_eq!(
        alloc.size_of(big),
        Some(10 * MIB),
        "its own block, 2 MiB pages"
    );
    let medium = pool.allocate(8 * MIB).unwrap();
    assert_ne!(
        alloc.size_of(medium),
        Some(8 * MIB),
        "carved from a segment"
    );
    let s = pool.packing_stats();
    assert_eq!((s.exact, s.carved), (1, 1));
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(big, 8 * MIB + 1);
        pool.release(medium, 8 * MIB);
    }
    // The exact block went back to the pool's cache as itself.
    assert_eq!(pool.stats().blocks_cached, 2);
    // A size a few bytes off shares the cached block.
    let again = pool.allocate(9 * MIB).unwrap();
    assert_eq!(again, big, "an exact hit");
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(again, 9 * MIB) };
    pool.validate();
    // Exact to the byte when asked.
    let (mut pool, alloc, _) = packed(
        Packing::default()
            .medium_threshold(8 * MIB)
            .large_rounding(1),
    );
    let big = pool.allocate(8 * MIB + 1).unwrap();
    assert_eq!(alloc.size_of(big), Some(8 * MIB + 1));
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(big, 8 * MIB + 1) };
    pool.validate();
}

#[test]
fn segments_are_capped_by_the_limit_and_by_the_device() {
    // A 64 MiB limit: no segment above 2 MiB (1/32).
    let alloc = CheckingAllocator::with_addresses();
    let mut pool = DecayingPool::builder(alloc.clone())
        .limit(64 * MIB)
        .packing(Packing::default())
        .build();
    assert_eq!(pool.segment_cap(), 2 * MIB);
    let a = pool.allocate(1536 * KIB).unwrap(); // medium, fits a 2 MiB segment
    let b = pool.allocate(3 * MIB).unwrap(); // no allowed segment holds it: exact
    assert_eq!(alloc.size_of(a), Some(2 * MIB));
    assert_eq!(alloc.size_of(b), Some(3 * MIB));
    assert_eq!(pool.packing_stats().exact, 1);
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(a, 1536 * KIB);
        pool.release(b, 3 * MIB);
    }
    // A device capacity set on the packing wins over the limit.
    let mut pool = DecayingPool::builder(CheckingAllocator::with_addresses())
        .limit(64 * MIB)
        .packing(Packing::default().capacity(8 << 30))
        .build();
    assert_eq!(pool.segment_cap(), 256 * MIB);
    let c = pool.allocate(40 * MIB).unwrap();
    // A limit that is no power of two: 5 GiB / 32 = 160 MiB, rounded down,
    // so segments hold whole numbers of power-of-two tensors.
    let five = DecayingPool::builder(CheckingAllocator::with_addresses())
        .limit(5 << 30)
        .packing(Packing::default())
        .build();
    assert_eq!(five.segment_cap(), 128 * MIB);
    pool.validate();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(c, 40 * MIB) };
}

#[test]
fn a_tight_device_never_fails_for_want_of_a_whole_segment() {
    // 48 MiB device: the cap is 2 MiB (1/32 is less: small segments keep
    // their size) and segments shrink with the room left; every request
    // that fits the device is served.
    let dev = FailingAllocator::new(CheckingAllocator::with_addresses());
    dev.set_capacity(Some(48 * MIB));
    let mut pool = DecayingPool::builder(dev.clone())
        .packing(Packing::default().capacity(48 * MIB))
        .build();
    let mut live = Vec::new();
    let mut total = 0;
    for size in [700 * KIB, 3 * MIB, 5 * MIB, 100 * KIB, 9 * MIB, 20 * MIB] {
        live.push((pool.allocate(size).unwrap(), size));
        total += size;
    }
    assert!(total < 48 * MIB);
    assert!(pool.stats().bytes_reserved <= 48 * MIB);
    pool.validate();
    for (b, s) in live {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, s) };
    }
    pool.validate();
    drop(pool);
    dev.inner().assert_all_freed();
}

#[test]
fn a_small_workload_reserves_a_small_footprint() {
    // ~34 MiB live, like the ctx128 inference trace: 2 and 8 MiB
    // activations and small buffers. Reserved must stay near 64 MiB, not
    // grow to a large segment.
    let (mut pool, _, _) = packed(Packing::default());
    let mut live = Vec::new();
    for _ in 0..3 {
        for &s in &[2 * MIB, 2 * MIB, 8 * MIB, 8 * MIB, 2 * KIB, 32 * KIB, MIB] {
            live.push((pool.allocate(s).unwrap(), s));
        }
        for (b, s) in live.drain(..) {
            // SAFETY: each block came from this pool with this size and is released once.
            unsafe { pool.release(b, s) };
        }
    }
    for &s in &[
        8 * MIB,
        8 * MIB,
        8 * MIB,
        2 * MIB,
        2 * MIB,
        2 * MIB,
        4 * MIB,
    ] {
        live.push((pool.allocate(s).unwrap(), s));
    }
    let s = pool.stats();
    assert!(
        s.peak_bytes_reserved <= 72 * MIB,
        "peak reserved {} MiB",
        s.peak_bytes_reserved / MIB
    );
    assert!(
        s.backing_allocs <= 4,
        "{} backing allocations",
        s.backing_allocs
    );
    for (b, s) in live {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, s) };
    }
    pool.validate();
}

#[test]
fn a_segment_the_device_refuses_falls_back_to_an_exact_block() {
    let dev = FailingAllocator::new(CheckingAllocator::with_addresses());
    let mut pool = DecayingPool::builder(dev.clone())
        .packing(Packing::default())
        .build();
    // The device has room for the request but not for a 32 MiB segment.
    dev.set_capacity(Some(10 * MIB));
    let b = pool.allocate(6 * MIB).unwrap();
    assert_eq!(dev.inner().size_of(b), Some(6 * MIB), "an exact block");
    let s = pool.packing_stats();
    assert_eq!((s.exact_fallbacks, s.segments, s.carved), (1, 0, 0));
    // The device reports its capacity: the segment above it was refused
    // with no backing call, and the request served exactly.
    assert_eq!(dev.failures(), 0);
    assert_eq!(pool.stats().backing_allocs, 1);
    // A request nothing can serve is an error, not a panic.
    assert!(matches!(pool.allocate(5 * MIB), Err(PoolError::Backing(_))));
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(b, 6 * MIB) };
    pool.validate();
    drop(pool);
    dev.inner().assert_all_freed();
}

#[test]
fn an_emptied_segment_goes_back_to_the_pool_exactly_once() {
    let (mut pool, alloc, clock) = packed(Packing::default());
    let a = pool.allocate(4 * KIB).unwrap();
    let b = pool.allocate(8 * KIB).unwrap();
    let seg = a;
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 4 * KIB) };
    assert_eq!(pool.stats().blocks_in_use, 1, "still carved from");
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(b, 8 * KIB) };
    let (s, ps) = (pool.stats(), pool.packing_stats());
    assert_eq!(
        (s.blocks_in_use, s.blocks_cached),
        (0, 1),
        "cached in the pool"
    );
    assert_eq!((ps.segments_released, ps.segments), (1, 0));
    // A later segment of the same size is a hit on it.
    let c = pool.allocate(100).unwrap();
    assert_eq!(c, seg);
    assert_eq!(alloc.allocs(), 1);
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(c, 100) };
    // It decays like any cached block, freed once.
    clock.advance(Duration::from_secs(1));
    assert_eq!(pool.collect(), 1);
    assert_eq!(freed_ids(&alloc), vec![seg]);
    assert_eq!(pool.trim(), 0);
    drop(pool);
    assert_eq!(freed_ids(&alloc), vec![seg]);
    alloc.assert_all_freed();
}

/// A random mix of small, medium and large requests, validated after each
/// step; returns the pool's allocator for the caller's checks.
fn churn(seed: u64, steps: usize, pool: &mut Checked) {
    let mut rng = Rng(seed);
    let mut live: Vec<(u64, usize)> = Vec::new();
    for step in 0..steps {
        if live.is_empty() || rng.below(100) < 55 {
            let size = match rng.below(10) {
                0..=5 => 1 + rng.below(MIB as u64) as usize,
                6..=8 => MIB + 1 + rng.below(40 * MIB as u64) as usize,
                _ => 128 * MIB + 1 + rng.below(128 * MIB as u64) as usize,
            };
            let b = pool.allocate(size).unwrap();
            live.push((b, size));
        } else {
            let i = rng.below(live.len() as u64) as usize;
            let (b, s) = live.swap_remove(i);
            // SAFETY: each block came from this pool with this size and is released once.
            unsafe { pool.release(b, s) };
        }
        if step % 7 == 0 {
            pool.validate();
        }
    }
    pool.validate();
    for (b, s) in live {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, s) };
    }
    pool.validate();
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn random_churn_keeps_blocks_disjoint_and_every_byte_accounted() {
    for seed in 1..=4 {
        let (mut pool, alloc, _) = packed(Packing::default());
        churn(seed, 600, &mut pool);
        let (s, ps) = (pool.stats(), pool.packing_stats());
        assert_eq!(ps.segments, 0, "every segment emptied and went back");
        assert_eq!(ps.segments_created, ps.segments_released);
        assert_eq!(
            (ps.packed_blocks, ps.packed_bytes, ps.bytes_requested),
            (0, 0, 0)
        );
        assert_eq!(ps.requests, ps.carved + ps.exact + ps.exact_fallbacks);
        assert!(ps.carved > 0 && ps.exact > 0);
        assert_eq!(s.blocks_in_use, 0);
        assert!(
            s.backing_allocs < ps.requests / 4,
            "packing saves backing calls"
        );
        drop(pool);
        alloc.assert_all_freed();
        assert_eq!(alloc.allocs(), alloc.deallocs());
    }
}

#[test]
#[cfg_attr(miri, ignore)] // writes megabytes byte by byte: too slow
fn carved_host_memory_is_disjoint() {
    // Real memory: each live block is filled with its own byte; none is
    // overwritten by a neighbour.
    let mut pool = DecayingPool::builder(SystemAllocator::new())
        .packing(Packing::default())
        .build();
    let mut rng = Rng(7);
    let mut live: Vec<(core::ptr::NonNull<u8>, usize, u8)> = Vec::new();
    for i in 0..400u32 {
        if live.is_empty() || rng.below(3) != 0 {
            let size = 1 + rng.below(3 * MIB as u64) as usize;
            let p = pool.allocate(size).unwrap();
            let tag = (i % 251) as u8;
            // SAFETY: `p` is a live block of `size` bytes handed to us.
            unsafe { p.as_ptr().write_bytes(tag, size) };
            live.push((p, size, tag));
        } else {
            let (p, size, tag) = live.swap_remove(rng.below(live.len() as u64) as usize);
            // SAFETY: `p` is still live, `size` bytes long.
            let bytes = unsafe { core::slice::from_raw_parts(p.as_ptr(), size) };
            assert!(bytes.iter().all(|&x| x == tag), "a block was overwritten");
            // SAFETY: from this pool with this size, released once.
            unsafe { pool.release(p, size) };
        }
    }
    for (p, size, tag) in live {
        // SAFETY: as above.
        let bytes = unsafe { core::slice::from_raw_parts(p.as_ptr(), size) };
        assert!(bytes.iter().all(|&x| x == tag));
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(p, size) };
    }
    assert_eq!(pool.packing_stats().segments, 0);
}

#[test]
#[cfg_attr(miri, ignore)] // hundreds of steps: too slow under Miri
fn after_the_workload_stops_reserved_bytes_decay_to_zero() {
    let (mut pool, alloc, clock) = packed(Packing::default());
    let mut rng = Rng(3);
    let mut live: Vec<(u64, usize)> = Vec::new();
    for _ in 0..300 {
        clock.advance(Duration::from_millis(1));
        if live.len() < 40 && rng.below(2) == 0 {
            let size = 1 + rng.below(20 * MIB as u64) as usize;
            live.push((pool.allocate(size).unwrap(), size));
        } else if let Some((b, s)) = live.pop() {
            // SAFETY: each block came from this pool with this size and is released once.
            unsafe { pool.release(b, s) };
        }
    }
    for (b, s) in live.drain(..) {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, s) };
    }
    assert!(
        pool.stats().bytes_reserved > 0,
        "segments cached in the pool"
    );
    clock.advance(Duration::from_secs(1));
    pool.collect();
    assert_eq!(pool.stats().bytes_reserved, 0);
    assert_eq!(alloc.live(), 0);
    pool.validate();
}

#[test]
#[cfg_attr(miri, ignore)] // hundreds of steps: too slow under Miri
fn dropping_the_pool_frees_every_segment_exactly_once() {
    let (mut pool, alloc, _) = packed(Packing::default());
    churn(11, 300, &mut pool);
    // Leave a few blocks of each kind cached in the pool.
    let blocks: Vec<(u64, usize)> = [10, 2 * MIB, 200 * MIB]
        .iter()
        .map(|&s| (pool.allocate(s).unwrap(), s))
        .collect();
    for (b, s) in blocks {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, s) };
    }
    drop(pool); // CheckingAllocator panics on a double free
    alloc.assert_all_freed();
    assert_eq!(alloc.allocs(), alloc.deallocs());
}

#[test]
fn stats_agree_with_each_other_and_with_the_pool() {
    let (mut pool, _, _) = packed(Packing::default());
    let a = pool.allocate(3000).unwrap();
    let b = pool.allocate(5 * MIB).unwrap();
    let c = pool.allocate(200 * MIB).unwrap();
    let (s, ps) = (pool.stats(), pool.packing_stats());
    assert_eq!(ps.requests, 3);
    assert_eq!((ps.carved, ps.exact, ps.exact_fallbacks), (2, 1, 0));
    assert_eq!(ps.segments, 2, "a small and a medium segment");
    assert_eq!(ps.packed_bytes, 3072 + 5 * MIB);
    assert_eq!(ps.segment_bytes, ps.packed_bytes + ps.free_segment_bytes);
    assert_eq!(ps.bytes_requested, 3000 + 5 * MIB + 200 * MIB);
    assert_eq!(ps.peak_bytes_requested, ps.bytes_requested);
    // The caller's view: three requests, each a miss (two segments and an
    // exact block), three blocks in use holding their own bytes; the free
    // space inside the segments is idle.
    assert_eq!((s.hits, s.misses, s.backing_allocs), (0, 3, 3));
    assert_eq!(s.blocks_in_use, 3);
    assert_eq!(s.bytes_in_use, ps.packed_bytes + 200 * MIB);
    assert_eq!(s.bytes_cached, ps.free_segment_bytes);
    assert_eq!(s.bytes_reserved, s.bytes_in_use + s.bytes_cached);
    assert_eq!(s.bytes_requested, 3000 + 5 * MIB + 200 * MIB);
    assert_eq!(s.bytes_from_backing, s.bytes_in_use);
    // The exact pool's view: two segments and a block in use.
    let p = pool.pool().stats();
    assert_eq!(p.bytes_in_use, ps.segment_bytes + 200 * MIB);
    assert_eq!((p.blocks_in_use, p.misses), (3, 3));
    // A fourth request carved from the small segment is a hit.
    let d = pool.allocate(100).unwrap();
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.blocks_in_use), (1, 3, 4));
    assert_eq!(s.bytes_from_pool, 512);
    assert_eq!(pool.pool().stats().blocks_in_use, 3);
    // SAFETY: `d` came from this pool with this size and is released once.
    unsafe { pool.release(d, 100) };
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(a, 3000);
        pool.release(b, 5 * MIB);
        pool.release(c, 200 * MIB);
    }
    let ps = pool.packing_stats();
    assert_eq!(
        (ps.segment_bytes, ps.free_segment_bytes, ps.bytes_requested),
        (0, 0, 0)
    );
    assert_eq!(ps.peak_segment_bytes, 2 * MIB + 32 * MIB);
    pool.validate();
}

#[test]
#[cfg_attr(miri, ignore)] // Miri aborts on a huge allocation instead of failing it
fn bad_input_gives_errors_not_panics() {
    let (mut pool, _, _) = packed(Packing::default());
    assert!(matches!(pool.allocate(0), Err(PoolError::ZeroSize)));
    let mut sys = DecayingPool::builder(SystemAllocator::new())
        .packing(Packing::default())
        .build();
    assert!(matches!(
        sys.allocate(usize::MAX),
        Err(PoolError::TooLarge { .. })
    ));
    assert!(sys.allocate(isize::MAX as usize).is_err());
    // Degenerate settings are made usable, not trusted.
    let odd = Packing::default()
        .granularity(0)
        .growth(0)
        .segment_multiple(0)
        .cap_fraction(0)
        .medium_threshold(usize::MAX)
        .small_threshold(usize::MAX);
    let mut sys = DecayingPool::builder(SystemAllocator::new())
        .packing(odd)
        .build();
    let b = sys.allocate(1000).unwrap();
    assert!(sys.allocate(usize::MAX).is_err());
    assert!(sys.allocate(usize::MAX / 2).is_err());
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { sys.release(b, 1000) };
    // Packing off: every request exact.
    let (mut off, alloc, _) = packed(Packing::off());
    let b = off.allocate(100).unwrap();
    assert_eq!(alloc.size_of(b), Some(100));
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { off.release(b, 100) };
}

/// Large requests whose sizes vary take a cached block up to
/// `1 / large_fit` larger than their class, whole, and give it back whole.
#[test]
fn a_large_request_takes_a_somewhat_larger_cached_block_whole() {
    let large = || {
        Packing::default()
            .medium_threshold(4 * KIB)
            .large_rounding(1)
    };
    let (mut pool, alloc, _) = packed(large());
    assert_eq!(large().large_fit, 2, "the default: up to half again");
    let a = pool.allocate(10_000).unwrap();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 10_000) };
    // 8000 bytes take the cached 10 000-byte block (at most 12 000).
    let b = pool.allocate(8_000).unwrap();
    assert_eq!((b, alloc.size_of(b)), (a, Some(10_000)));
    let s = pool.packing_stats();
    assert_eq!((s.larger_reuses, s.oversize_bytes, s.exact), (1, 2_000, 2));
    assert_eq!(pool.stats().backing_allocs, 1);
    pool.validate();
    // Another 8000 misses: the block is in use.
    let c = pool.allocate(8_000).unwrap();
    assert_eq!(alloc.size_of(c), Some(8_000));
    // Released with the size it was asked for: it goes back as the 10 000
    // bytes it is.
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(b, 8_000);
        pool.release(c, 8_000);
    }
    assert_eq!(pool.packing_stats().oversize_bytes, 0);
    assert_eq!(pool.stats().bytes_cached, 18_000);
    pool.validate();
    // 6000 bytes may take up to 9000: the 8000-byte block, not the other.
    let d = pool.allocate(6_000).unwrap();
    assert_eq!((d, pool.packing_stats().oversize_bytes), (c, 2_000));
    // A request above every cached class within its bound misses.
    let e = pool.allocate(12_001).unwrap();
    assert_eq!(alloc.size_of(e), Some(12_001));
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(d, 6_000);
        pool.release(e, 12_001);
    }
    assert_eq!(pool.stats().backing_allocs, 3);
    pool.validate();
    drop(pool);
    alloc.assert_all_freed();

    // Off: exact classes only.
    let (mut pool, alloc, _) = packed(large().large_fit(0));
    let a = pool.allocate(10_000).unwrap();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 10_000) };
    let b = pool.allocate(8_000).unwrap();
    assert_eq!(alloc.size_of(b), Some(8_000));
    assert_eq!(pool.packing_stats().larger_reuses, 0);
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(b, 8_000) };
    drop(pool);
    alloc.assert_all_freed();
}

/// On a known capacity, what larger blocks hold beyond their requests stays
/// within the slack budget; a block the pool freed meanwhile is skipped; a
/// wrong size at release is refused.
#[test]
fn reusing_larger_blocks_keeps_to_the_room_and_to_the_cache() {
    let large = |capacity| {
        Packing::default()
            .medium_threshold(4 * KIB)
            .large_rounding(1)
            .large_fit(1)
            .capacity(capacity)
    };
    // Capacity 16 000: a slack budget of 250 bytes (1/64), so 6000 bytes
    // may take at most 6250, not the 10 000 cached.
    let (mut pool, alloc, _) = packed(large(16_000));
    let a = pool.allocate(10_000).unwrap();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 10_000) };
    let b = pool.allocate(6_000).unwrap();
    assert_ne!(b, a);
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(b, 6_000) };
    drop(pool);
    alloc.assert_all_freed();
    // With a budget of 16 KiB (1 MiB / 64) it does.
    let (mut pool, alloc, clock) = packed(large(1 << 20));
    let a = pool.allocate(10_000).unwrap();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 10_000) };
    let b = pool.allocate(6_000).unwrap();
    assert_eq!(b, a);
    // A release with a size of another class is refused, and nothing is lost.
    // SAFETY: the wrong size is refused before anything is touched.
    let err = catch_unwind(AssertUnwindSafe(|| unsafe { pool.release(b, 5_000) })).unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("class of 6000 bytes released as 5000"),
        "{msg}"
    );
    pool.validate();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(b, 6_000) };
    // The cached block decays; the next request misses rather than take a
    // freed block.
    clock.advance(Duration::from_secs(1));
    pool.collect();
    assert_eq!(pool.stats().blocks_cached, 0);
    misses_then_frees_all(pool, &alloc, 6_000, 1);
}

/// On a known capacity more than twice the largest live set seen, a larger
/// block may pin up to half of what lies beyond twice that set, more than
/// the 1/64 slack budget; as the live set grows, that share shrinks.
#[test]
fn on_a_roomy_device_larger_blocks_may_pin_more_than_the_slack() {
    let (mut pool, alloc, _) = packed(
        Packing::default()
            .medium_threshold(4 * KIB)
            .large_rounding(1)
            .large_fit(1)
            .capacity(64_000),
    );
    // The peak so far is 10 000 bytes: half of 64 000 - 20 000 is 22 000,
    // so 6000 bytes may take the cached 10 000 (the slack, 1000, would not).
    let a = pool.allocate(10_000).unwrap();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 10_000) };
    let b = pool.allocate(6_000).unwrap();
    assert_eq!(b, a);
    assert_eq!(pool.packing_stats().oversize_bytes, 4_000);
    pool.validate();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(b, 6_000) };
    // A peak of 30 000 leaves half of 64 000 - 60 000: 2000, and the
    // 10 000 block is no longer taken for 6000 bytes.
    let x = pool.allocate(30_000).unwrap();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(x, 30_000) };
    misses_then_frees_all(pool, &alloc, 6_000, 1);
}

/// A large request of `size` bytes takes a new exact block (no cached
/// larger one: `larger_reuses` stays `reuses`); then every block goes back.
fn misses_then_frees_all(mut pool: Checked, alloc: &CheckingAllocator, size: usize, reuses: u64) {
    let c = pool.allocate(size).unwrap();
    assert_eq!(alloc.size_of(c), Some(size));
    assert_eq!(pool.packing_stats().larger_reuses, reuses);
    // SAFETY: `c` came from this pool with this size and is released once.
    unsafe { pool.release(c, size) };
    pool.validate();
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn releasing_a_carved_block_with_the_wrong_size_is_refused() {
    let (mut pool, alloc, _) = packed(Packing::default());
    let a = pool.allocate(100).unwrap();
    // SAFETY: the wrong size is refused before anything is touched.
    let err = catch_unwind(AssertUnwindSafe(|| unsafe { pool.release(a, 200) })).unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("carved for 100 bytes released as 200"),
        "{msg}"
    );
    // Nothing was corrupted: the right release still works.
    pool.validate();
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 100) };
    pool.validate();
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn packings_parse_from_key_value_lists() {
    let p: Packing = "medium=128M, max_segment=512MiB,growth=4,cap=16,capacity=8G,small=4096B"
        .parse()
        .unwrap();
    assert_eq!(
        p,
        Packing::default()
            .medium_threshold(128 * MIB)
            .max_segment(512 * MIB)
            .growth(4)
            .cap_fraction(16)
            .capacity(8 << 30)
            .small_threshold(4096)
    );
    assert_eq!("off".parse::<Packing>().unwrap(), Packing::off());
    assert_eq!("".parse::<Packing>().unwrap(), Packing::default());
    for bad in [
        "medium",
        "medium=",
        "medium=-1",
        "medium=1X",
        "colour=red",
        "growth=nan",
        // What the docs forbid: a bare number for a size, a count of 0 or
        // with a unit, a granularity not a power of two, small above medium.
        "small=4096",
        "capacity=8",
        "growth=0",
        "growth=4K",
        "cap=0",
        "granularity=768B",
        "granularity=0B",
        "small=2M,medium=1M",
    ] {
        assert!(bad.parse::<Packing>().is_err(), "{bad}");
    }
}

#[test]
fn a_packed_pool_stacks_over_a_pool_and_as_an_allocator() {
    use decaying_pool::RawAllocator;
    let alloc = CheckingAllocator::with_addresses();
    let inner = DecayingPool::new(alloc.clone(), FixedTime::default());
    let mut outer = DecayingPool::builder(inner)
        .packing(Packing::default())
        .build();
    let as_raw: &mut dyn RawAllocator<Block = u64, Error = _> = &mut outer;
    let b = as_raw.allocate(1000).unwrap();
    // SAFETY: `b` came from `as_raw.allocate(1000)`, released once.
    unsafe { as_raw.deallocate(b, 1000) };
    drop(outer);
    alloc.assert_all_freed();
}

/// The packing guide's claims (`docs/packing.md`) on the shared traces,
/// through the replay's `packed` row: fewer backing allocations than PyTorch's allocator (280 on
/// training, 5 on inference), peak reserved within 1.10x PyTorch's + 64
/// MiB, and no failed request on a device of 1.10x or 1.05x peak live.
#[cfg(not(miri))]
#[test]
fn the_packed_row_meets_its_targets_on_the_shared_traces() {
    use decaying_pool::trace::{
        Config, CostModel, ReadOptions, ReplayOptions, Replayer, Report, TraceReader,
    };
    use std::collections::HashMap;
    // The shared traces, shipped in `cli/traces` (see its NOTICE).
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cli/traces");
    // (trace, PyTorch's cudaMalloc calls, PyTorch's peak reserved MiB)
    let targets = [("training.csv", 280, 5060), ("inference.csv", 5, 64)];
    let packed = Config::defaults()
        .into_iter()
        .find(|c| c.name == "packed")
        .unwrap();
    assert_eq!(packed.name, "packed");
    let run = |path: &std::path::Path, cost: CostModel| -> Report {
        let opts = ReplayOptions {
            cost,
            reaper: Some(Duration::from_millis(1)),
            ..ReplayOptions::default()
        };
        let mut r = Replayer::new(core::slice::from_ref(&packed), opts);
        let read = ReadOptions {
            lenient_frees: true,
            ..ReadOptions::default()
        };
        for e in TraceReader::open(path, read).unwrap() {
            r.event(&e.unwrap());
        }
        r.finish("t").pop().unwrap()
    };
    let mut seen = HashMap::new();
    for (name, torch_allocs, torch_peak_mib) in targets {
        let path = dir.join(name);
        if !path.exists() {
            println!("note: {} absent; skipped", path.display());
            continue;
        }
        let r = run(&path, CostModel::cuda());
        assert!(
            r.backing_allocs <= torch_allocs,
            "{name}: {}",
            r.backing_allocs
        );
        let bound = (torch_peak_mib as f64 * 1.10 + 64.0) * MIB as f64;
        assert!(
            (r.peak_reserved_bytes as f64) <= bound,
            "{name}: peak reserved {} MiB",
            r.peak_reserved_bytes / MIB
        );
        assert_eq!(r.failures, 0);
        for factor in [1.10, 1.05] {
            let cap = (r.peak_live_bytes as f64 * factor) as usize;
            let t = run(&path, CostModel::cuda().with_capacity(cap));
            assert_eq!(t.failures, 0, "{name} at {factor}x peak live");
            assert!(t.peak_reserved_bytes <= cap);
        }
        seen.insert(name, r.backing_allocs);
    }
    println!("{seen:?}");
}

/// A training step repeated, as a training loop runs it: the segments a
/// pass empties stay cached, and the next pass takes them again rather than
/// new ones of other sizes, so peak reserved stays near one pass's (1.07x
/// peak live; 1.48x after three passes when only 16 emptied segment sizes
/// were remembered) and the backing allocations below PyTorch's 280.
#[cfg(not(miri))]
#[test]
fn a_repeated_training_step_takes_back_the_segments_it_emptied() {
    use decaying_pool::trace::{Config, ReadOptions, ReplayOptions, Replayer, TraceReader};
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cli/traces/training.csv");
    if !path.exists() {
        println!("note: {} absent; skipped", path.display());
        return;
    }
    let read = ReadOptions {
        lenient_frees: true,
        ..ReadOptions::default()
    };
    let events: Vec<_> = TraceReader::open(&path, read)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let packed = Config::defaults().pop().unwrap();
    let opts = ReplayOptions {
        reaper: Some(Duration::from_millis(1)),
        ..ReplayOptions::default()
    };
    let mut r = Replayer::new(core::slice::from_ref(&packed), opts);
    for _ in 0..3 {
        r.begin_pass();
        for e in &events {
            r.event(e);
        }
    }
    let rep = r.finish("training x3").pop().unwrap();
    assert!(
        rep.reserved_over_live() <= 1.25,
        "peak reserved {:.2}x peak live",
        rep.reserved_over_live()
    );
    assert!(rep.backing_allocs < 280, "{}", rep.backing_allocs);
}

#[test]
fn a_new_segment_reuses_one_lately_emptied_before_asking_for_more() {
    let (mut pool, alloc, _) = packed(Packing::default().growth(1).segment_multiple(1));
    let a = pool.allocate(32 * MIB).unwrap(); // segment 1: 32 MiB
    let b = pool.allocate(32 * MIB).unwrap(); // segment 2: 32 MiB (= the footprint)
    let c = pool.allocate(32 * MIB).unwrap(); // segment 3: 64 MiB
    let d = pool.allocate(32 * MIB).unwrap(); // the rest of segment 3
    assert_eq!(alloc.allocs(), 3);
    assert_eq!(alloc.size_of(c), Some(64 * MIB));
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe { pool.release(a, 32 * MIB) }; // segment 1 empties, cached in the pool
    // The footprint would ask for a 96 MiB segment; the cached 32 MiB one
    // serves the request without a backing call.
    let e = pool.allocate(32 * MIB).unwrap();
    assert_eq!(e, a);
    assert_eq!(alloc.allocs(), 3);
    pool.validate();
    for x in [b, c, d, e] {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(x, 32 * MIB) };
    }
}

#[test]
#[cfg_attr(miri, ignore)] // 800 blocks: too slow under Miri
fn segments_grow_with_the_footprint_up_to_the_largest() {
    let (mut pool, alloc, _) = packed(Packing::default());
    let blocks: Vec<u64> = (0..800).map(|_| pool.allocate(4 * MIB).unwrap()).collect();
    let sizes: Vec<usize> = alloc
        .calls()
        .iter()
        .filter_map(|c| match c {
            decaying_pool::testing::Call::Allocate { size, .. } => Some(*size),
            _ => None,
        })
        .collect();
    assert_eq!(
        sizes[0],
        32 * MIB,
        "the first medium segment is the smallest"
    );
    assert!(sizes.windows(2).all(|w| w[0] <= w[1]), "{sizes:?}");
    assert_eq!(*sizes.last().unwrap(), 256 * MIB, "capped at the largest");
    // 3.2 GiB in far fewer than 3.2 GiB / 32 MiB = 100 segments.
    assert!(sizes.len() <= 30, "{} segments", sizes.len());
    let s = pool.packing_stats();
    // Growth by an eighth keeps the unused tail small.
    assert!(s.free_segment_bytes * 8 <= s.segment_bytes, "{s:?}");
    for b in blocks {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, 4 * MIB) };
    }
}

#[test]
fn a_request_goes_to_the_segment_it_fits_most_tightly() {
    let (mut pool, alloc, _) = packed(Packing::default().segment_multiple(1));
    let a = pool.allocate(16 * MIB).unwrap(); // segment 1 (32 MiB): 16 MiB free
    let b = pool.allocate(24 * MIB).unwrap(); // segment 2 (32 MiB): 8 MiB free
    assert_eq!(alloc.allocs(), 2);
    // 8 MiB fits both; best fit takes segment 2's 8 MiB range and keeps
    // segment 1's 16 MiB whole for the next request.
    let c = pool.allocate(8 * MIB).unwrap();
    assert_eq!(c, b + 24 * MIB as u64);
    let d = pool.allocate(16 * MIB).unwrap();
    assert_eq!(d, a + 16 * MIB as u64);
    assert_eq!(alloc.allocs(), 2, "no third segment");
    // SAFETY: each block came from this pool with this size and is released once.
    unsafe {
        pool.release(a, 16 * MIB);
        pool.release(b, 24 * MIB);
        pool.release(c, 8 * MIB);
        pool.release(d, 16 * MIB);
    }
}

#[test]
fn near_a_full_device_segments_shrink_with_the_room_left() {
    // A 128 MiB device whose cap allows 64 MiB segments: each new segment
    // is at most half the room left (rounded down to a power of two), so
    // the last ones are small and strand little.
    let dev = FailingAllocator::new(CheckingAllocator::with_addresses());
    dev.set_capacity(Some(128 * MIB));
    let mut pool = DecayingPool::builder(dev.clone())
        .packing(
            Packing::default()
                .capacity(128 * MIB)
                .cap_fraction(2)
                .slack_fraction(1),
        )
        .build();
    assert_eq!(pool.segment_cap(), 64 * MIB);
    let blocks: Vec<u64> = (0..31).map(|_| pool.allocate(4 * MIB).unwrap()).collect();
    let mut reserved = 0;
    let mut sizes = Vec::new();
    for c in dev.inner().calls() {
        if let decaying_pool::testing::Call::Allocate { size, .. } = c {
            let room = (128 * MIB - reserved) / 2;
            let bound = (1usize << room.ilog2()).max(4 * MIB);
            assert!(
                size <= bound,
                "a {size} B segment with {reserved} B reserved"
            );
            reserved += size;
            sizes.push(size / MIB);
        }
    }
    assert_eq!(sizes, [32, 32, 32, 16, 8, 4], "{sizes:?}");
    assert_eq!(pool.packing_stats().exact_fallbacks, 0);
    pool.validate();
    for b in blocks {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, 4 * MIB) };
    }
    drop(pool);
    dev.inner().assert_all_freed();
}

#[test]
fn on_a_known_capacity_free_space_inside_segments_stays_within_the_slack() {
    // 1 GiB device, 1/64 of it (16 MiB) may sit free inside segments:
    // 24 MiB blocks leave 8 MiB in each 32 MiB segment, so the third
    // segment is cut to the request's size.
    let (mut pool, alloc, _) = packed(Packing::default().capacity(1 << 30).cap_fraction(8));
    let blocks: Vec<u64> = (0..3).map(|_| pool.allocate(24 * MIB).unwrap()).collect();
    let sizes: Vec<usize> = blocks
        .iter()
        .map(|&b| alloc.size_of(b).unwrap() / MIB)
        .collect();
    assert_eq!(sizes, [32, 32, 24]);
    assert_eq!(pool.packing_stats().free_segment_bytes, 16 * MIB);
    // Without a capacity, nothing is cut.
    let (mut free, alloc, _) = packed(Packing::default());
    let more: Vec<u64> = (0..3).map(|_| free.allocate(24 * MIB).unwrap()).collect();
    let sizes: Vec<usize> = more
        .iter()
        .map(|&b| alloc.size_of(b).unwrap() / MIB)
        .collect();
    assert_eq!(sizes, [32, 32, 64]);
    for b in blocks {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { pool.release(b, 24 * MIB) };
    }
    for b in more {
        // SAFETY: each block came from this pool with this size and is released once.
        unsafe { free.release(b, 24 * MIB) };
    }
    pool.validate();
    free.validate();
}
