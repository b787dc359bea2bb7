//! Tests: backends.
//!
//! The host backing allocators (`SystemAllocator`, and `MmapAllocator` on
//! unix) on their own and under a `DecayingPool`: alignment, usable memory,
//! errors (never panics) for zero and absurd sizes, a real hit returning
//! the same pointer, decay and trim.

use core::ptr::NonNull;
use core::time::Duration;

use decaying_pool::backend::AllocError;
use decaying_pool::{
    DecayingPool, FixedTime, ManualClock, PoolError, RawAllocator, SizeClass, SystemAllocator,
};

/// Sizes no allocator can serve: past `isize::MAX`, or far past any
/// address space (but a valid `Layout` and page multiple).
const ABSURD: [usize; 3] = [usize::MAX, isize::MAX as usize, 1 << 62];

/// Fills `len` bytes at `p` with a pattern and reads them back.
///
/// # Safety
///
/// `p` is valid for reads and writes of `len` bytes.
unsafe fn write_and_check(p: NonNull<u8>, len: usize, seed: u8) {
    // SAFETY: the caller guarantees `len` writable bytes at `p`.
    let bytes = unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), len) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    for (i, b) in bytes.iter().enumerate() {
        assert_eq!(
            *b,
            (i as u8).wrapping_mul(31).wrapping_add(seed),
            "byte {i}"
        );
    }
}

fn clocked<A: RawAllocator>(alloc: A) -> (DecayingPool<A, FixedTime, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let pool = DecayingPool::builder(alloc)
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone())
        .build();
    (pool, clock)
}

// ----------------------------------------------------------- SystemAllocator

#[test]
#[cfg_attr(miri, ignore)] // writes and reads back ~1.7 MB byte by byte: too slow
fn system_allocator_honours_every_alignment_and_memory_is_usable() {
    for align in [1usize, 2, 8, 16, 64, 256, 4096, 1 << 16] {
        let mut a = SystemAllocator::with_align(align).unwrap();
        assert_eq!(a.align(), align);
        let sizes = [1usize, 7, 100, 4097, 100_000];
        let blocks: Vec<_> = sizes.iter().map(|&s| (a.allocate(s).unwrap(), s)).collect();
        for (i, &(p, size)) in blocks.iter().enumerate() {
            assert_eq!(p.as_ptr() as usize % align, 0, "align {align}, size {size}");
            // SAFETY: `p` is a live block of `size` bytes.
            unsafe { write_and_check(p, size, i as u8) };
        }
        for (p, size) in blocks {
            // SAFETY: `p` came from `a.allocate(size)` and is not used again.
            unsafe { a.deallocate(p, size) };
        }
    }
}

#[test]
fn system_allocator_default_alignment_is_a_cache_line() {
    assert_eq!(
        SystemAllocator::new().align(),
        SystemAllocator::DEFAULT_ALIGN
    );
    assert_eq!(SystemAllocator::default().align(), 64);
    let mut a = SystemAllocator::new();
    let blocks: Vec<_> = (1..20)
        .map(|s| (a.allocate(s * 3).unwrap(), s * 3))
        .collect();
    for &(p, s) in &blocks {
        assert_eq!(p.as_ptr() as usize % 64, 0, "size {s}");
    }
    for (p, s) in blocks {
        // SAFETY: `p` came from `a.allocate(s)` and is not used again.
        unsafe { a.deallocate(p, s) };
    }
}

#[test]
fn system_allocator_rejects_alignments_that_are_not_powers_of_two() {
    for align in [0usize, 3, 6, 48, 100, usize::MAX] {
        assert!(SystemAllocator::with_align(align).is_none(), "{align}");
    }
}

#[test]
fn system_allocator_zero_size_is_an_error_not_a_panic() {
    let mut a = SystemAllocator::with_align(16).unwrap();
    let err = a.allocate(0).unwrap_err();
    assert_eq!(err, AllocError { size: 0, align: 16 });
    assert!(err.to_string().contains('0'));
}

#[test]
#[cfg_attr(miri, ignore)] // Miri aborts on a huge allocation instead of failing it
fn system_allocator_absurd_sizes_are_errors() {
    for align in [8usize, 64, 4096] {
        let mut a = SystemAllocator::with_align(align).unwrap();
        for size in ABSURD {
            assert_eq!(a.allocate(size), Err(AllocError { size, align }), "{size}");
        }
    }
}

#[test]
fn pool_over_system_allocator_hits_with_the_same_pointer_and_trims() {
    let (mut pool, clock) = clocked(SystemAllocator::with_align(256).unwrap());
    let p = pool.allocate(10_000).unwrap();
    assert_eq!(p.as_ptr() as usize % 256, 0);
    // SAFETY: `p` is a live block of 10 000 bytes.
    unsafe { write_and_check(p, 10_000, 1) };
    // SAFETY: `p` came from `pool.allocate(10_000)` and is not used again.
    unsafe { pool.release(p, 10_000) };
    let q = pool.allocate(10_000).unwrap();
    assert_eq!(q, p, "a hit hands back the very same memory");
    // SAFETY: `q` is a live block of 10 000 bytes.
    unsafe { write_and_check(q, 10_000, 2) };
    let r = pool.allocate(10_000).unwrap();
    assert_ne!(r, q, "a second block of the class is a miss");
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.bytes_reserved), (1, 2, 20_000));
    // SAFETY: both came from `pool.allocate(10_000)` and are not used again.
    unsafe {
        pool.release(q, 10_000);
        pool.release(r, 10_000);
    }
    clock.advance(Duration::from_millis(500));
    assert_eq!(pool.trim(), 20_000);
    let s = pool.stats();
    assert_eq!((s.trimmed, s.backing_deallocs, s.bytes_reserved), (2, 2, 0));
    pool.validate();
}

#[test]
fn pool_over_system_allocator_decays_back() {
    let (mut pool, clock) = clocked(SystemAllocator::new());
    let blocks: Vec<_> = [64usize, 4096, 1 << 20]
        .iter()
        .map(|&s| (pool.allocate(s).unwrap(), s))
        .collect();
    for &(p, s) in &blocks {
        // SAFETY: `p` came from `pool.allocate(s)` and is not used again.
        unsafe { pool.release(p, s) };
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(pool.collect(), 3);
    let s = pool.stats();
    assert_eq!(
        (s.evictions, s.backing_deallocs, s.bytes_reserved),
        (3, 3, 0)
    );
}

#[test]
#[cfg_attr(miri, ignore)] // Miri aborts on a huge allocation instead of failing it
fn pool_over_system_allocator_reports_errors_without_panicking() {
    let (mut pool, _clock) = clocked(SystemAllocator::new());
    assert_eq!(pool.allocate(0), Err(PoolError::ZeroSize));
    // Above the machine's memory (`RawAllocator::capacity`): refused
    // without a backing call.
    assert_eq!(
        pool.allocate(1 << 62),
        Err(PoolError::TooLarge { requested: 1 << 62 })
    );
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.hits, s.misses), (0, 0, 0));

    let mut p2 = DecayingPool::builder(SystemAllocator::new())
        .clock(ManualClock::new())
        .size_class(SizeClass::PowerOfTwo)
        .build();
    assert_eq!(
        p2.allocate(usize::MAX),
        Err(PoolError::TooLarge {
            requested: usize::MAX,
        })
    );
    // A request no backing call can serve keeps the cache.
    let b = p2.allocate(100).unwrap();
    // SAFETY: `b` came from `p2.allocate(100)` and is not used again.
    unsafe { p2.release(b, 100) };
    assert!(matches!(
        p2.allocate(1 << 61),
        Err(PoolError::TooLarge { .. })
    ));
    let s = p2.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.bytes_cached), (0, 0, 128));
    p2.validate();
}

// ------------------------------------------------------------- MmapAllocator

#[cfg(unix)]
mod mmap {
    use super::*;
    use decaying_pool::MmapAllocator;
    use decaying_pool::backend::MmapError;

    fn page() -> usize {
        MmapAllocator::page_size()
    }

    #[test]
    fn page_size_is_a_sane_power_of_two() {
        let p = page();
        assert!(p.is_power_of_two() && p >= 4096, "{p}");
    }

    #[test]
    #[cfg_attr(miri, ignore)] // mmap
    fn mappings_are_page_aligned_zeroed_and_writable_over_the_whole_size() {
        let mut m = MmapAllocator::new();
        let p = page();
        for (i, size) in [1, p - 1, p, p + 1, 3 * p + 5, 1 << 20]
            .into_iter()
            .enumerate()
        {
            let b = m.allocate(size).unwrap();
            assert_eq!(b.as_ptr() as usize % p, 0, "size {size}");
            // SAFETY: a fresh mapping of at least `size` bytes.
            let bytes = unsafe { core::slice::from_raw_parts(b.as_ptr(), size) };
            assert!(
                bytes.iter().all(|&x| x == 0),
                "size {size}: fresh mappings are zero"
            );
            // SAFETY: as above, readable and writable.
            unsafe { write_and_check(b, size, i as u8) };
            // SAFETY: `b` came from `m.allocate(size)` and is not used again.
            unsafe { m.deallocate(b, size) };
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // mmap
    fn zero_and_huge_sizes_are_errors_not_panics() {
        let mut m = MmapAllocator::new();
        let err: MmapError = m.allocate(0).unwrap_err();
        assert_eq!(err.size, 0);
        assert!(err.os.is_none());
        assert!(!err.to_string().is_empty());
        for size in ABSURD {
            let err = m.allocate(size).unwrap_err();
            assert_eq!(err.size, size);
        }
        // Past the address space but a valid length: the OS refuses.
        let err = m.allocate(1 << 62).unwrap_err();
        assert!(err.os.is_some(), "{err}");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    #[cfg_attr(miri, ignore)] // mmap
    fn pool_over_mmap_hits_with_the_same_mapping_and_trims() {
        let (mut pool, clock) = clocked(MmapAllocator::new());
        let size = 5 * page() + 123;
        let b = pool.allocate(size).unwrap();
        // SAFETY: a live mapping of at least `size` bytes.
        unsafe { write_and_check(b, size, 9) };
        // SAFETY: `b` came from `pool.allocate(size)` and is not used again.
        unsafe { pool.release(b, size) };
        clock.advance(Duration::from_millis(999));
        let again = pool.allocate(size).unwrap();
        assert_eq!(again, b, "a hit hands back the same mapping");
        // The contents survived in the cache (the pool never touches them).
        // SAFETY: a live mapping of at least `size` bytes.
        let first = unsafe { *again.as_ptr() };
        assert_eq!(first, 9);
        let other = pool.allocate(page()).unwrap();
        // SAFETY: both came from this pool with these sizes and are not used again.
        unsafe {
            pool.release(again, size);
            pool.release(other, page());
        }
        let s = pool.stats();
        assert_eq!((s.hits, s.misses, s.bytes_cached), (1, 2, size + page()));
        assert_eq!(pool.trim(), size + page());
        let s = pool.stats();
        assert_eq!((s.trimmed, s.backing_deallocs, s.bytes_reserved), (2, 2, 0));
        pool.validate();
    }

    #[test]
    #[cfg_attr(miri, ignore)] // mmap
    fn pool_over_mmap_decays_and_reports_errors() {
        let (mut pool, clock) = clocked(MmapAllocator::new());
        let b = pool.allocate(1 << 16).unwrap();
        // SAFETY: `b` came from `pool.allocate(1 << 16)` and is not used again.
        unsafe { pool.release(b, 1 << 16) };
        clock.advance(Duration::from_secs(1));
        // Above the machine's memory: refused without a backing call.
        assert!(matches!(
            pool.allocate(1 << 62),
            Err(PoolError::TooLarge { .. })
        ));
        let s = pool.stats();
        // The policy freed the expired block before the refusal.
        assert_eq!((s.evictions, s.trimmed, s.backing_failures), (1, 0, 0));
        assert!(matches!(pool.allocate(0), Err(PoolError::ZeroSize)));
        assert_eq!(pool.stats().backing_failures, 0);
        pool.validate();
    }
}

/// A logging adaptor forwards every call to the allocator it wraps and
/// gives each block back exactly once (in memory, so Miri runs it: the
/// `logging` tests write files).
#[test]
fn a_logging_adaptor_forwards_every_call() {
    use decaying_pool::testing::CheckingAllocator;
    use decaying_pool::trace::LoggingAllocator;
    let checking = CheckingAllocator::new();
    let mut logged = LoggingAllocator::new(checking.clone(), Vec::new()).unwrap();
    let a = logged.allocate(64).unwrap();
    let b = logged.allocate(4096).unwrap();
    assert_eq!(checking.live(), 2);
    // SAFETY: each block came from `logged.allocate` with this size and is
    // given back once.
    unsafe {
        logged.deallocate(a, 64);
        logged.deallocate(b, 4096);
    }
    let (_inner, log) = logged.finish().unwrap();
    checking.assert_all_freed();
    let text = String::from_utf8(log).unwrap();
    assert!(text.lines().count() >= 4, "four calls logged:\n{text}");
}
