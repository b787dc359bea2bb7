//! Tests: size_class.
//!
//! How requests are rounded before lookup (`SizeClass`), seen through the
//! pool: `class_size`, the size the backing allocator is asked for, the
//! sizes the statistics count, which requests share a cached block, and
//! `TooLarge` (never a panic) when rounding would overflow.

use crate::support::{Pool, get, pool_with, put};
use core::time::Duration;

use decaying_pool::testing::{Call, CheckingAllocator};
use decaying_pool::{DecayingPool, PoolError, Reuse, SizeClass, Stats};

const BIG: usize = 1 << (usize::BITS - 1); // the largest power of two

fn pool(size_class: SizeClass) -> (Pool, CheckingAllocator) {
    let (pool, alloc, _) = pool_with(Reuse::Lifo, size_class, Duration::from_secs(1));
    assert_eq!(pool.size_class(), size_class);
    (pool, alloc)
}

/// Asserts `class_size(request) == class` for every pair, both through the
/// pool and through `SizeClass::round`.
fn assert_classes(size_class: SizeClass, pairs: &[(usize, Option<usize>)]) {
    let (pool, _) = pool(size_class);
    for &(request, class) in pairs {
        assert_eq!(pool.class_size(request), class, "{size_class:?}: {request}");
        assert_eq!(
            size_class.round(request),
            class,
            "{size_class:?}: {request}"
        );
    }
}

/// Allocating `request` asks the backing allocator for exactly its class,
/// counts the class in the statistics, and a release caches the class.
fn assert_served_with_class(size_class: SizeClass, request: usize, class: usize) {
    let (mut pool, alloc) = pool(size_class);
    let b = get(&mut pool, request);
    assert_eq!(
        alloc.calls(),
        vec![Call::Allocate {
            block: b,
            size: class
        }]
    );
    let s = pool.stats();
    assert_eq!(
        (
            s.bytes_in_use,
            s.bytes_reserved,
            s.bytes_from_backing,
            s.peak_bytes_in_use
        ),
        (class, class, class, class),
        "{size_class:?}: {request}"
    );
    put(&mut pool, b, request);
    assert_eq!(pool.stats().bytes_cached, class);
    assert_eq!(get(&mut pool, request), b);
    assert_eq!(pool.stats().bytes_from_pool, class);
    put(&mut pool, b, request);
    assert_eq!(pool.trim(), class);
    assert_eq!(
        alloc.calls(),
        vec![
            Call::Allocate {
                block: b,
                size: class
            },
            Call::Deallocate {
                block: b,
                size: class
            },
        ]
    );
    pool.validate();
}

/// A request too large for its class fails with `TooLarge`, counts
/// nothing and makes no backing call.
fn assert_too_large(size_class: SizeClass, request: usize) {
    let (mut pool, alloc) = pool(size_class);
    assert_eq!(pool.class_size(request), None, "{size_class:?}: {request}");
    assert_eq!(
        pool.allocate(request),
        Err(PoolError::TooLarge { requested: request }),
        "{size_class:?}"
    );
    assert_eq!(pool.stats(), Stats::default());
    assert!(alloc.calls().is_empty());
}

// ---------------------------------------------------------------- Exact

#[test]
fn exact_keeps_every_size() {
    assert_eq!(SizeClass::default(), SizeClass::Exact);
    assert_classes(
        SizeClass::Exact,
        &[
            (0, None),
            (1, Some(1)),
            (3, Some(3)),
            (1000, Some(1000)),
            (1025, Some(1025)),
            (usize::MAX, Some(usize::MAX)),
        ],
    );
    assert_served_with_class(SizeClass::Exact, 1000, 1000);
}

#[test]
fn default_size_class_is_exact() {
    let pool = DecayingPool::builder(CheckingAllocator::new()).build();
    assert_eq!(pool.size_class(), SizeClass::Exact);
    assert_eq!(pool.class_size(1001), Some(1001));
}

#[test]
fn exact_too_large_when_reserved_bytes_would_overflow() {
    // Exact rounding never overflows, but counting a second huge block in
    // `bytes_reserved` would: that is `TooLarge`, not a panic.
    let (mut pool, alloc) = pool(SizeClass::Exact);
    let huge = get(&mut pool, usize::MAX);
    let before = pool.stats();
    assert_eq!(pool.allocate(1), Err(PoolError::TooLarge { requested: 1 }));
    assert_eq!(pool.stats(), before);
    assert_eq!(alloc.allocs(), 1);
    put(&mut pool, huge, usize::MAX);
    assert_eq!(pool.trim(), usize::MAX);
    let b = get(&mut pool, 1);
    put(&mut pool, b, 1);
    pool.validate();
}

// ----------------------------------------------------------- PowerOfTwo

#[test]
fn power_of_two_rounds_up() {
    assert_classes(
        SizeClass::PowerOfTwo,
        &[
            (0, None),
            (1, Some(1)),
            (2, Some(2)),
            (3, Some(4)),
            (1000, Some(1024)),
            (1024, Some(1024)),
            (1025, Some(2048)),
            (3000, Some(4096)),
            (BIG - 1, Some(BIG)),
            (BIG, Some(BIG)),
            (BIG + 1, None),
            (usize::MAX, None),
        ],
    );
    assert_served_with_class(SizeClass::PowerOfTwo, 1000, 1024);
    assert_served_with_class(SizeClass::PowerOfTwo, 5, 8);
}

#[test]
fn power_of_two_too_large() {
    assert_too_large(SizeClass::PowerOfTwo, usize::MAX);
    assert_too_large(SizeClass::PowerOfTwo, BIG + 1);
}

// ------------------------------------------------------------- Multiple

#[test]
fn multiple_rounds_up_to_a_multiple() {
    assert_classes(
        SizeClass::Multiple(512),
        &[
            (0, None),
            (1, Some(512)),
            (512, Some(512)),
            (513, Some(1024)),
            (1000, Some(1024)),
            (usize::MAX - 511, Some(usize::MAX - 511)),
            (usize::MAX - 510, None),
            (usize::MAX, None),
        ],
    );
    assert_classes(
        SizeClass::Multiple(3),
        &[
            (1, Some(3)),
            (3, Some(3)),
            (10, Some(12)),
            (usize::MAX, Some(usize::MAX)),
        ],
    );
    assert_served_with_class(SizeClass::Multiple(512), 1000, 1024);
    assert_served_with_class(SizeClass::Multiple(100), 1, 100);
}

#[test]
fn multiple_zero_and_one_mean_exact() {
    for n in [0, 1] {
        assert_classes(
            SizeClass::Multiple(n),
            &[
                (0, None),
                (1, Some(1)),
                (7, Some(7)),
                (1000, Some(1000)),
                (1025, Some(1025)),
                (usize::MAX, Some(usize::MAX)),
            ],
        );
        assert_served_with_class(SizeClass::Multiple(n), 1001, 1001);
    }
}

#[test]
fn multiple_too_large() {
    assert_too_large(SizeClass::Multiple(4096), usize::MAX);
    assert_too_large(SizeClass::Multiple(4096), usize::MAX - 4094);
    assert_too_large(SizeClass::Multiple(BIG), BIG + 1);
}

// -------------------------------------------------- PowerOfTwoDivisions

#[test]
fn divisions_k4_split_each_octave_in_four() {
    assert_classes(
        SizeClass::PowerOfTwoDivisions(4),
        &[
            (0, None),
            (1, Some(1)),
            (5, Some(5)),
            (1024, Some(1024)),
            (1025, Some(1280)),
            (1100, Some(1280)),
            (1280, Some(1280)),
            (1281, Some(1536)),
            (1537, Some(1792)),
            (1792, Some(1792)),
            (1793, Some(2048)),
            (2048, Some(2048)),
            (BIG, Some(BIG)),
            (BIG + 1, Some(BIG + BIG / 4)),
            (BIG + BIG / 2 + BIG / 4, Some(BIG + BIG / 2 + BIG / 4)),
            (BIG + BIG / 2 + BIG / 4 + 1, None),
            (usize::MAX, None),
        ],
    );
    assert_served_with_class(SizeClass::PowerOfTwoDivisions(4), 1100, 1280);
}

#[test]
fn divisions_k0_and_k1_mean_power_of_two() {
    for k in [0, 1] {
        let sc = SizeClass::PowerOfTwoDivisions(k);
        for size in (1..3000).chain([BIG - 1, BIG, BIG + 1, usize::MAX]) {
            assert_eq!(
                sc.round(size),
                SizeClass::PowerOfTwo.round(size),
                "k {k}: {size}"
            );
        }
        assert_served_with_class(sc, 1100, 2048);
    }
}

#[test]
fn divisions_k8_and_k2() {
    assert_classes(
        SizeClass::PowerOfTwoDivisions(8),
        &[
            (1025, Some(1152)),
            (1100, Some(1152)),
            (1153, Some(1280)),
            (2000, Some(2048)),
        ],
    );
    assert_classes(
        SizeClass::PowerOfTwoDivisions(2),
        &[(1025, Some(1536)), (1536, Some(1536)), (1537, Some(2048))],
    );
}

#[test]
fn divisions_k3_steps_are_ceilings() {
    // [1024, 2048] in three steps at 1024 + ceil(i * 1024 / 3): 1366, 1707.
    assert_classes(
        SizeClass::PowerOfTwoDivisions(3),
        &[
            (1025, Some(1366)),
            (1100, Some(1366)),
            (1365, Some(1366)),
            (1367, Some(1707)),
            (1706, Some(1707)),
            (1708, Some(2048)),
        ],
    );
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn divisions_a_step_is_its_own_class() {
    // class.rs: steps at 2^m + ceil(i * 2^m / k), "round up to the next
    // step". 1366 = 1024 + ceil(1024 / 3) is a step, so it is its own class;
    // rounding must be idempotent, or a request for exactly a class size is
    // not served by a cached block of that class.
    assert_eq!(SizeClass::PowerOfTwoDivisions(3).round(1366), Some(1366));
    assert_eq!(SizeClass::PowerOfTwoDivisions(5).round(10), Some(10)); // 8 + ceil(8 / 5)
    for k in [3u32, 5, 6, 7, 12, 1000, u32::MAX] {
        let sc = SizeClass::PowerOfTwoDivisions(k);
        for size in 1..5000usize {
            let class = sc.round(size).unwrap();
            assert_eq!(sc.round(class), Some(class), "k {k}: {size} -> {class}");
        }
        // With the smallest step >= size, waste is at most 1/k (k=5: 3 -> 4
        // today, though 3 = 2 + ceil(2 / 5) is a step).
        assert_divisions_cover(k, true);
    }
    // Through the pool: a block of class 1366 serves a request of 1366.
    let (mut pool, alloc) = pool(SizeClass::PowerOfTwoDivisions(3));
    let b = get(&mut pool, 1100);
    put(&mut pool, b, 1100);
    assert_eq!(get(&mut pool, 1366), b);
    assert_eq!(alloc.allocs(), 1);
    put(&mut pool, b, 1366);
}

/// Class >= request, monotone, never past the next power of two, and (when
/// `waste` is set) wasting at most 1/k of the request.
fn assert_divisions_cover(k: u32, waste: bool) {
    let sc = SizeClass::PowerOfTwoDivisions(k);
    let mut last = 0;
    for size in 1..5000usize {
        let class = sc.round(size).unwrap();
        assert!(class >= size, "k {k}: {size} -> {class}");
        assert!(class >= last, "k {k}: not monotone at {size}");
        assert!(
            class <= size.next_power_of_two(),
            "k {k}: {size} -> {class}"
        );
        if waste {
            let over = (class - size) as u128 * u128::from(k);
            assert!(
                over <= size as u128,
                "k {k}: {size} -> {class} wastes over 1/k"
            );
        }
        last = class;
    }
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn divisions_cover_and_bound_the_waste() {
    for k in [2u32, 4, 8, 16, 1024, 1 << 31] {
        assert_divisions_cover(k, true);
    }
    for k in [3u32, 5, 6, 7, 12, 1000, u32::MAX] {
        assert_divisions_cover(k, false);
    }
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn divisions_for_power_of_two_k_match_pytorch() {
    for k in [2usize, 4, 8, 16] {
        let sc = SizeClass::PowerOfTwoDivisions(k as u32);
        for size in (k + 1)..5000 {
            let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
            let step = floor / k;
            let expect = if size.is_power_of_two() {
                size
            } else {
                floor + (size - floor).div_ceil(step) * step
            };
            assert_eq!(sc.round(size), Some(expect), "k {k}: {size}");
            assert_eq!(sc.round(expect), Some(expect), "k {k}: {expect} is a step");
        }
    }
}

#[test]
fn divisions_too_large() {
    assert_too_large(SizeClass::PowerOfTwoDivisions(4), usize::MAX);
    assert_too_large(
        SizeClass::PowerOfTwoDivisions(4),
        BIG + BIG / 2 + BIG / 4 + 1,
    );
    assert_too_large(SizeClass::PowerOfTwoDivisions(0), BIG + 1);
    assert_too_large(SizeClass::PowerOfTwoDivisions(3), usize::MAX);
    assert_too_large(SizeClass::PowerOfTwoDivisions(u32::MAX), usize::MAX);
}

// ------------------------------------------------------- sharing classes

#[test]
fn requests_of_one_class_share_a_cached_block() {
    let cases: [(SizeClass, &[usize]); 4] = [
        (SizeClass::PowerOfTwo, &[1000, 1024, 513, 600]),
        (SizeClass::Multiple(512), &[600, 1000, 1024, 513]),
        (SizeClass::PowerOfTwoDivisions(4), &[1100, 1280, 1025, 1200]),
        (SizeClass::Exact, &[777, 777, 777]),
    ];
    for (sc, sizes) in cases {
        let (mut pool, alloc) = pool(sc);
        let class = pool.class_size(sizes[0]).unwrap();
        let b = get(&mut pool, sizes[0]);
        put(&mut pool, b, sizes[0]);
        for &size in &sizes[1..] {
            assert_eq!(pool.class_size(size), Some(class), "{sc:?}: {size}");
            assert_eq!(
                get(&mut pool, size),
                b,
                "{sc:?}: {size} is served by the cached block"
            );
            put(&mut pool, b, size);
        }
        let n = sizes.len() as u64;
        let s = pool.stats();
        assert_eq!((s.hits, s.misses), (n - 1, 1), "{sc:?}");
        assert_eq!(s.bytes_from_pool, (n as usize - 1) * class, "{sc:?}");
        assert_eq!(s.bytes_from_backing, class, "{sc:?}");
        assert_eq!(
            alloc.calls(),
            vec![Call::Allocate {
                block: b,
                size: class
            }]
        );
        pool.validate();
    }
}

#[test]
fn blocks_of_different_classes_never_serve_each_other() {
    let cases: [(SizeClass, &[usize]); 4] = [
        (SizeClass::Exact, &[1000, 1001, 999, 2000, 500]),
        (SizeClass::PowerOfTwo, &[1024, 512, 2048, 3000, 4]),
        (SizeClass::Multiple(512), &[512, 1024, 1536, 2000, 2600]),
        (
            SizeClass::PowerOfTwoDivisions(4),
            &[1100, 1300, 1600, 1800, 2049],
        ),
    ];
    for (sc, sizes) in cases {
        let (mut pool, alloc) = pool(sc);
        let classes: Vec<usize> = sizes.iter().map(|&s| pool.class_size(s).unwrap()).collect();
        let mut distinct = classes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            classes.len(),
            "{sc:?}: test sizes in distinct classes"
        );
        // Cache one block of each class but the one requested; a larger or
        // smaller cached block is never split, merged or handed out.
        for (i, &size) in sizes.iter().enumerate() {
            let others: Vec<(u64, usize)> = sizes
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &s)| (get(&mut pool, s), s))
                .collect();
            for &(b, s) in &others {
                put(&mut pool, b, s);
            }
            let allocs = alloc.allocs();
            let b = get(&mut pool, size);
            assert_eq!(alloc.allocs(), allocs + 1, "{sc:?}: {size} must miss");
            assert_eq!(alloc.size_of(b), Some(classes[i]), "{sc:?}: {size}");
            put(&mut pool, b, size);
            pool.trim();
        }
        pool.validate();
        drop(pool);
        alloc.assert_all_freed();
    }
}

#[test]
fn stats_count_class_sizes_not_request_sizes() {
    let (mut pool, alloc) = pool(SizeClass::PowerOfTwo);
    let x = get(&mut pool, 1000); // 1024
    let y = get(&mut pool, 100); // 128
    put(&mut pool, x, 1000);
    let z = get(&mut pool, 600); // 1024, a hit on x
    assert_eq!(z, x);
    put(&mut pool, y, 100);
    assert_eq!(
        pool.stats(),
        stats! {
            hits: 1,
            misses: 2,
            backing_allocs: 2,
            blocks_in_use: 1,
            blocks_cached: 1,
            bytes_in_use: 1024,
            bytes_cached: 128,
            bytes_reserved: 1152,
            peak_bytes_reserved: 1152,
            peak_bytes_in_use: 1152,
            bytes_from_pool: 1024,
            bytes_from_backing: 1152,
            bytes_requested: 1700, // 1000 + 100 + 600
        }
    );
    put(&mut pool, z, 600);
    assert_eq!(pool.trim(), 1152);
    assert_eq!(
        alloc.calls(),
        vec![
            Call::Allocate {
                block: 1,
                size: 1024
            },
            Call::Allocate {
                block: 2,
                size: 128
            },
            Call::Deallocate {
                block: 2,
                size: 128
            },
            Call::Deallocate {
                block: 1,
                size: 1024
            },
        ]
    );
}

/// A release takes the class of its size whether or not it follows the
/// allocation of that size (the pool remembers the last request's class
/// for the release after it), and a release no allocation could have
/// made (zero bytes, or a class larger than the bytes in use) panics in a
/// pool that rounds as in one that does not, before or after the first
/// allocation.
#[test]
fn a_release_takes_its_class_whether_or_not_it_follows_its_allocation() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    for sc in [
        SizeClass::PowerOfTwo,
        SizeClass::PowerOfTwoDivisions(4),
        SizeClass::PowerOfTwoDivisions(3),
        SizeClass::Multiple(512),
        SizeClass::Multiple(100),
    ] {
        let (mut pool, alloc) = pool(sc);
        // A fresh pool: nothing remembered yet.
        let r = catch_unwind(AssertUnwindSafe(|| put(&mut pool, 7, 0)));
        assert!(r.is_err(), "{sc:?}: a release of zero bytes");
        let (a, b) = (get(&mut pool, 1000), get(&mut pool, 3000));
        let (ca, cb) = (
            pool.class_size(1000).unwrap(),
            pool.class_size(3000).unwrap(),
        );
        assert_ne!(ca, cb, "{sc:?}");
        // `a` is released after `b` was allocated: not the size remembered.
        put(&mut pool, a, 1000);
        put(&mut pool, b, 3000);
        let s = pool.stats();
        assert_eq!((s.blocks_cached, s.bytes_cached), (2, ca + cb), "{sc:?}");
        // Round trips of either size hit their own class.
        for _ in 0..3 {
            let x = get(&mut pool, 1000);
            assert_eq!(x, a, "{sc:?}");
            put(&mut pool, x, 1000);
            let y = get(&mut pool, 3000);
            assert_eq!(y, b, "{sc:?}");
            put(&mut pool, y, 3000);
        }
        assert_eq!(alloc.allocs(), 2, "{sc:?}");
        // With the 3000-byte request remembered and nothing in use, a
        // release of that size or of zero bytes was never handed out.
        for bad in [3000, 0] {
            let r = catch_unwind(AssertUnwindSafe(|| put(&mut pool, 7, bad)));
            assert!(r.is_err(), "{sc:?}: a release of {bad} bytes");
        }
        pool.validate();
        drop(pool);
        alloc.assert_all_freed();
    }
}
