//! Tests: the CUDA backing allocators (feature `cuda`).
//!
//! The first group runs everywhere. The device tests print a notice and
//! return when `cuda::available()` is false; on a machine with a GPU they
//! exercise the device.

use core::time::Duration;

use cudarc::driver::DriverError;
use cudarc::driver::sys::CUresult;
use decaying_pool::cuda::{
    self, CudaError, DeviceAllocator, PinnedHostAllocator, SlicePool, StreamAllocator,
};
use decaying_pool::testing::CheckingAllocator;
use decaying_pool::{
    DecayingPool, FixedTime, ManualClock, Packing, PoolError, RawAllocator, SharedPool,
};

fn skip(test: &str) -> bool {
    if cuda::available() {
        return false;
    }
    println!("{test}: no CUDA driver or device here; skipping the device part");
    true
}

#[test]
fn available_answers_without_panicking_and_consistently() {
    let a = cuda::available();
    assert_eq!(a, cuda::available());
    if !a {
        assert_eq!(DeviceAllocator::new(0).unwrap_err(), CudaError::Unavailable);
        assert_eq!(
            PinnedHostAllocator::new(0).unwrap_err(),
            CudaError::Unavailable
        );
    }
}

#[test]
fn out_of_memory_maps_to_its_own_variant_and_others_keep_the_code() {
    let oom = CudaError::from_driver(4096, DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(oom, CudaError::OutOfMemory { size: 4096 });
    assert!(oom.is_out_of_memory());
    assert_eq!(oom.to_string(), "CUDA out of memory allocating 4096 bytes");

    let other = CudaError::from_driver(8, DriverError(CUresult::CUDA_ERROR_INVALID_VALUE));
    assert!(!other.is_out_of_memory());
    assert!(matches!(
        other,
        CudaError::Driver { size: 8, error } if error.0 == CUresult::CUDA_ERROR_INVALID_VALUE
    ));
    // Formatting needs no driver.
    assert!(other.to_string().contains("CUDA_ERROR_INVALID_VALUE"));
    assert!(format!("{other:?}").contains("CUDA_ERROR_INVALID_VALUE"));
    assert_eq!(
        CudaError::Unavailable.to_string(),
        "no CUDA driver or device"
    );
}

/// A device that refuses past a capacity with the driver's out-of-memory
/// code, as `DeviceAllocator` maps it: the pool's retry ladder sees it.
struct FakeDevice {
    inner: CheckingAllocator,
    capacity: usize,
    used: usize,
}

impl RawAllocator for FakeDevice {
    type Block = u64;
    type Error = CudaError;

    fn allocate(&mut self, size: usize) -> Result<u64, CudaError> {
        if self.used + size > self.capacity {
            return Err(CudaError::from_driver(
                size,
                DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            ));
        }
        self.used += size;
        Ok(self.inner.allocate(size).unwrap())
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        self.used -= size;
        // SAFETY: passed through unchanged from the pool.
        unsafe { self.inner.deallocate(block, size) }
    }
}

#[test]
fn the_retry_ladder_frees_the_cache_on_a_mapped_out_of_memory() {
    let checker = CheckingAllocator::new();
    let device = FakeDevice {
        inner: checker.clone(),
        capacity: 1000,
        used: 0,
    };
    let mut pool = DecayingPool::builder(device)
        .policy(FixedTime::new(Duration::from_secs(60)))
        .clock(ManualClock::new())
        .build();
    let a = pool.allocate(600).unwrap();
    // SAFETY: from this pool with this size.
    unsafe { pool.release(a, 600) };
    // 600 cached + 700 > 1000: the device refuses, the pool frees its cache
    // and retries.
    let b = pool.allocate(700).unwrap();
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.misses), (1, 1, 2));
    // With nothing cached, a request that cannot fit is the device's error.
    assert_eq!(
        pool.allocate(400).unwrap_err(),
        PoolError::Backing(CudaError::OutOfMemory { size: 400 })
    );
    // SAFETY: from this pool with this size.
    unsafe { pool.release(b, 700) };
    drop(pool);
    checker.assert_all_freed();
}

// ---------------------------------------------------------------------------
// On a device

#[test]
fn device_blocks_are_reused_and_decay() {
    if skip("device_blocks_are_reused_and_decay") {
        return;
    }
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(DeviceAllocator::new(0).unwrap())
        .policy(FixedTime::new(Duration::from_secs(1)))
        .clock(clock.clone())
        .build();
    let p = pool.allocate(8 << 20).unwrap();
    assert_ne!(p, 0);
    // SAFETY: from this pool with this size, not used again.
    unsafe { pool.release(p, 8 << 20) };
    let q = pool.allocate(8 << 20).unwrap();
    assert_eq!(q, p, "a hit hands out the same device pointer");
    // SAFETY: as above.
    unsafe { pool.release(q, 8 << 20) };
    clock.advance(Duration::from_secs(1));
    assert_eq!(pool.collect(), 1);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.backing_deallocs), (1, 1, 1));
}

#[test]
fn stream_ordered_blocks_are_reused() {
    if skip("stream_ordered_blocks_are_reused") {
        return;
    }
    let stream = cudarc::driver::CudaContext::new(0)
        .unwrap()
        .new_stream()
        .unwrap();
    let mut pool = DecayingPool::builder(StreamAllocator::new(stream.clone()))
        .clock(ManualClock::new())
        .build();
    let p = pool.allocate(1 << 20).unwrap();
    // SAFETY: from this pool with this size; used on its stream only.
    unsafe { pool.release(p, 1 << 20) };
    assert_eq!(pool.allocate(1 << 20).unwrap(), p);
    // SAFETY: as above.
    unsafe { pool.release(p, 1 << 20) };
    assert_eq!(pool.trim(), 1 << 20);
    stream.synchronize().unwrap();
}

#[test]
fn typed_slices_round_trip_through_the_host_and_go_back_to_the_pool() {
    if skip("typed_slices_round_trip_through_the_host_and_go_back_to_the_pool") {
        return;
    }
    let alloc = DeviceAllocator::new(0).unwrap();
    let stream = alloc.context().default_stream();
    let pool = SharedPool::new(
        DecayingPool::builder(alloc)
            .policy(FixedTime::new(Duration::from_secs(60)))
            .clock(ManualClock::new())
            .build(),
    );
    let slices = SlicePool::new(pool.clone(), stream.clone());
    let data: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let mut x = slices.alloc::<f32>(4096).unwrap();
    assert_eq!(x.len(), 4096);
    stream.memcpy_htod(&data, &mut x).unwrap();
    assert_eq!(stream.clone_dtoh(&*x).unwrap(), data);
    drop(x);
    assert_eq!(pool.stats().blocks_cached, 1);
    let y = slices.alloc::<u32>(4096).unwrap(); // same byte size: a hit
    assert_eq!(pool.stats().hits, 1);
    drop(y);
    assert!(matches!(slices.alloc::<f32>(0), Err(PoolError::ZeroSize)));
    assert!(matches!(
        slices.alloc::<f64>(usize::MAX),
        Err(PoolError::TooLarge { .. })
    ));
}

#[test]
fn pinned_host_blocks_are_writable_and_reused() {
    if skip("pinned_host_blocks_are_writable_and_reused") {
        return;
    }
    let mut pool = DecayingPool::builder(PinnedHostAllocator::new(0).unwrap())
        .clock(ManualClock::new())
        .build();
    let p = pool.allocate(1 << 20).unwrap();
    // SAFETY: the block is 1 MiB of host memory, ours alone.
    unsafe { p.as_ptr().write_bytes(0xAB, 1 << 20) };
    // SAFETY: from this pool with this size.
    unsafe { pool.release(p, 1 << 20) };
    let q = pool.allocate(1 << 20).unwrap();
    assert_eq!(q, p);
    // SAFETY: still ours; the contents survive reuse.
    assert_eq!(unsafe { q.as_ptr().add(12345).read() }, 0xAB);
    // SAFETY: from this pool with this size.
    unsafe { pool.release(q, 1 << 20) };
}

#[test]
fn out_of_memory_on_the_device_frees_the_cache_and_retries() {
    if skip("out_of_memory_on_the_device_frees_the_cache_and_retries") {
        return;
    }
    let alloc = DeviceAllocator::new(0).unwrap();
    let (free, _total) = alloc.context().mem_get_info().unwrap();
    let chunk = (free / 8).max(1 << 20);
    let mut pool = DecayingPool::builder(alloc)
        .policy(FixedTime::new(Duration::from_secs(3600)))
        .clock(ManualClock::new())
        .build();
    // Allocate until the device refuses, then cache everything.
    let mut held = Vec::new();
    loop {
        match pool.allocate(chunk) {
            Ok(p) => held.push(p),
            Err(PoolError::Backing(e)) => {
                assert!(e.is_out_of_memory(), "{e}");
                break;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(held.len() < 64, "the device never refused");
    }
    assert!(!held.is_empty());
    for p in held.drain(..) {
        // SAFETY: from this pool with this size.
        unsafe { pool.release(p, chunk) };
    }
    // A request of another class only fits once cached blocks are freed.
    let big = pool
        .allocate(chunk * 2)
        .expect("the retry ladder frees the cache");
    let s = pool.stats();
    assert!(s.backing_failures >= 2, "{s:?}");
    assert!(s.trimmed >= 1, "{s:?}");
    // SAFETY: from this pool with this size.
    unsafe { pool.release(big, chunk * 2) };
}

/// Typed slices from a packed pool: small slices are carved side by side
/// from one device segment, keep their own contents, and the segment goes
/// back to the pool when they are dropped.
#[test]
fn packed_slice_pool_carves_slices_from_one_segment() {
    if skip("packed_slice_pool_carves_slices_from_one_segment") {
        return;
    }
    let alloc = DeviceAllocator::new(0).unwrap();
    let stream = alloc.context().default_stream();
    let pool = SharedPool::packed(
        DecayingPool::builder(alloc)
            .clock(ManualClock::new())
            .packing(Packing::default())
            .build(),
    );
    let slices = SlicePool::new(pool.clone(), stream.clone());
    let mut xs = Vec::new();
    for k in 0..8u32 {
        let mut x = slices.alloc::<u32>(1000).unwrap();
        stream.memcpy_htod(&vec![k; 1000], &mut x).unwrap();
        xs.push(x);
    }
    assert_eq!(pool.stats().backing_allocs, 1, "one segment");
    let ps = pool.packing_stats().unwrap();
    assert_eq!((ps.carved, ps.segments), (8, 1), "{ps:?}");
    for (k, x) in xs.iter().enumerate() {
        assert_eq!(stream.clone_dtoh(&**x).unwrap(), vec![k as u32; 1000]);
    }
    drop(xs);
    assert_eq!(pool.packing_stats().unwrap().segments, 0);
    assert_eq!(pool.trim(), 2 << 20);
}

#[test]
fn memory_fraction_is_a_share_of_the_device_and_sets_the_limit() {
    if skip("memory_fraction") {
        return;
    }
    let alloc = DeviceAllocator::new(0).unwrap();
    let total = alloc.context().total_mem().unwrap();
    assert_eq!(cuda::memory_fraction(alloc.context(), 1.0).unwrap(), total);
    assert_eq!(cuda::memory_fraction(alloc.context(), 2.0).unwrap(), total);
    assert_eq!(cuda::memory_fraction(alloc.context(), f64::NAN).unwrap(), 0);
    assert_eq!(cuda::memory_fraction(alloc.context(), -1.0).unwrap(), 0);
    let half = cuda::memory_fraction(alloc.context(), 0.5).unwrap();
    assert!(half <= total / 2 + 1 && half + 1 >= total / 2);
    let mut pool = DecayingPool::new(alloc, FixedTime::default());
    let b = pool.allocate(1 << 20).unwrap();
    pool.set_limit(Some(1 << 20));
    assert!(matches!(
        pool.allocate(1),
        Err(PoolError::LimitExceeded { .. })
    ));
    // SAFETY: `b` came from this pool with this size.
    unsafe { pool.release(b, 1 << 20) };
    pool.set_limit(Some(half));
    let b = pool.allocate(1 << 20).unwrap();
    // SAFETY: as above.
    unsafe { pool.release(b, 1 << 20) };
}

/// The CUDA page backend's errors format without a driver, and without a
/// device it refuses at construction.
#[test]
fn cuda_pages_refuse_without_a_device_and_errors_format() {
    use decaying_pool::pages::{CudaPageError, CudaPages, PageError};

    fn send_sync<T: Send + Sync>() {}
    send_sync::<CudaPages>();
    send_sync::<decaying_pool::pages::CudaRange>();
    send_sync::<decaying_pool::pages::CudaPage>();
    if !cuda::available() {
        assert_eq!(CudaPages::new(0).unwrap_err(), CudaPageError::Unavailable);
    }
    let oom = CudaPageError::Driver {
        call: "cuMemCreate",
        error: DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
    };
    assert!(oom.is_out_of_memory());
    assert_eq!(
        oom.to_string(),
        "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert!(format!("{oom:?}").contains("CUDA_ERROR_OUT_OF_MEMORY"));
    let map = CudaPageError::Driver {
        call: "cuMemMap",
        error: DriverError(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    assert!(!map.is_out_of_memory());
    let invalid = CudaPageError::from(PageError::SlotMapped { offset: 4096 });
    assert_eq!(
        invalid.to_string(),
        "the slot at offset 4096 is mapped already"
    );
    assert!(std::error::Error::source(&invalid).is_some());
    assert_eq!(
        CudaPageError::Unavailable.to_string(),
        "no CUDA driver or device"
    );
    assert!(
        CudaPageError::Unsupported { ordinal: 3 }
            .to_string()
            .contains("device 3")
    );
}

/// Device pages (CUDA virtual memory management): a run mapped into one
/// range is written with a cudarc copy, unmapped, mapped in the other
/// order into a second range, and reads back the same bytes, page by page;
/// the refusals of the contract; the counts the replay's model keeps.
#[test]
fn cuda_pages_move_between_ranges_with_their_bytes() {
    use decaying_pool::pages::{CudaPageError, CudaPages, PageBackend, PageError};

    if skip("cuda_pages_move_between_ranges_with_their_bytes") {
        return;
    }
    let mut b = CudaPages::new(0).unwrap();
    let g = b.granularity();
    let min = b.minimum_granularity();
    assert!(g >= min && g % min == 0, "granularity {g}, minimum {min}");
    let stream = b.context().default_stream();

    // Sizes are checked before the driver sees them.
    let invalid = |e: CudaPageError| match e {
        CudaPageError::Invalid(e) => e,
        e => panic!("{e}"),
    };
    assert_eq!(invalid(b.reserve(0).unwrap_err()), PageError::ZeroSize);
    assert_eq!(
        invalid(b.reserve(g + 1).unwrap_err()),
        PageError::NotAligned {
            value: g + 1,
            granularity: g
        }
    );
    let huge = usize::MAX / g * g;
    assert_eq!(
        invalid(b.reserve(huge).unwrap_err()),
        PageError::TooLarge { bytes: huge }
    );

    let mut first = b.reserve(4 * g).unwrap();
    let mut second = b.reserve(3 * g).unwrap();
    assert_eq!(first.device_ptr() % g as u64, 0);
    assert_eq!(b.range_len(&second), 3 * g);
    let mut pages = Vec::new();
    b.create_pages(2, &mut pages).unwrap();
    b.map(&mut first, g, &pages).unwrap();
    assert_eq!(first.mapped_runs(), vec![(g, 2)]);

    // Refusals, with no effect.
    let extra = b.create_page().unwrap();
    assert_eq!(
        invalid(
            b.map(&mut first, 2 * g, std::slice::from_ref(&extra))
                .unwrap_err()
        ),
        PageError::SlotMapped { offset: 2 * g }
    );
    assert_eq!(
        invalid(b.map(&mut second, 0, &pages[..1]).unwrap_err()),
        PageError::PageMapped
    );
    assert_eq!(
        invalid(b.map(&mut second, 0, &[]).unwrap_err()),
        PageError::ZeroSize
    );
    assert!(matches!(
        invalid(b.map(&mut first, 3 * g, &pages).unwrap_err()),
        PageError::OutOfRange { .. }
    ));
    // SAFETY: a refused call touches nothing.
    let e = unsafe { b.unmap(&mut first, 0, 1) }.unwrap_err();
    assert_eq!(invalid(e), PageError::SlotUnmapped { offset: 0 });
    let mut other = CudaPages::new(0).unwrap();
    let mut foreign = other.reserve(other.granularity()).unwrap();
    assert_eq!(
        invalid(
            b.map(&mut foreign, 0, std::slice::from_ref(&extra))
                .unwrap_err()
        ),
        PageError::ForeignHandle
    );
    // SAFETY: nothing uses `foreign`.
    unsafe { other.release_range(foreign) }.unwrap();
    assert_eq!(first.mapped_pages(), 2);

    // Write the two pages through `first` with a cudarc copy. The view is
    // leaked before it drops (its drop would `cuMemFree` the range).
    let data: Vec<u8> = (0..2 * g).map(|i| (i % 251) as u8).collect();
    // SAFETY: slots 1 and 2 of `first` are mapped, 2 * g bytes, read-write
    // for the device; the view is leaked, never freed.
    let mut view = unsafe { stream.upgrade_device_ptr::<u8>(first.device_ptr() + g as u64, 2 * g) };
    stream.memcpy_htod(&data, &mut view).unwrap();
    view.leak();
    stream.synchronize().unwrap();
    // SAFETY: the copy is done (the stream synchronised); nothing else
    // uses `first`.
    unsafe { b.unmap(&mut first, g, 2) }.unwrap();
    assert_eq!(first.mapped_pages(), 0);

    // The same pages, the other way round, at the start of `second`.
    pages.reverse();
    b.map(&mut second, 0, &pages).unwrap();
    let mut back = vec![0u8; 2 * g];
    // SAFETY: slots 0 and 1 of `second` are mapped (2 * g bytes); the
    // context is current (the backend bound it on this thread).
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut back, second.device_ptr()) }.unwrap();
    assert!(
        back[..g] == data[g..],
        "the second page moved with its bytes"
    );
    assert!(
        back[g..] == data[..g],
        "the first page moved with its bytes"
    );

    // A page released while mapped is refused (and kept by the backend).
    b.map(&mut second, 2 * g, std::slice::from_ref(&extra))
        .unwrap();
    assert_eq!(second.mapped_runs(), vec![(0, 3)]);
    // SAFETY: refused: `extra` is mapped.
    let e = unsafe { b.release_page(extra) }.unwrap_err();
    assert_eq!(invalid(e), PageError::PageMapped);

    // SAFETY: nothing uses either range (the copies were synchronous);
    // their pages are unmapped with them.
    unsafe {
        b.release_range(first).unwrap();
        b.release_range(second).unwrap();
        for p in pages {
            b.release_page(p).unwrap();
        }
    }
    let c = b.counts();
    assert_eq!(
        (c.created, c.released, c.maps, c.unmaps),
        (3, 2, 5, 5),
        "{c}"
    );
    assert_eq!(
        (c.set_access, c.unmap_calls, c.reserves, c.range_frees),
        (3, 2, 2, 2),
        "{c}"
    );
    assert_eq!((c.mapped_pages(), c.live_ranges()), (0, 0));
    // The page refused above is still the backend's: its drop releases it.
    assert_eq!(c.live_pages(), 1);
    drop(b);
    stream.synchronize().unwrap();
}

/// The bytes of a block written with `seed`.
fn device_pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8 ^ (i >> 8) as u8))
        .collect()
}

/// Writes `seed`'s pattern into `len` bytes of device memory at `ptr`.
///
/// # Safety
///
/// `ptr..ptr + len` is mapped, read-write for the device of `ctx`, and the
/// caller's alone.
unsafe fn device_fill(ctx: &cudarc::driver::CudaContext, ptr: usize, len: usize, seed: u8) {
    ctx.bind_to_thread().unwrap();
    let data = device_pattern(len, seed);
    // SAFETY: the range is mapped, read-write and ours (the caller's
    // contract); `data` holds `len` bytes; the context is current (bound
    // above).
    unsafe { cudarc::driver::result::memcpy_htod_sync(ptr as u64, &data) }.unwrap();
    // A copy from pageable memory may return before its DMA ends: wait, so
    // the block may be given back (and its pages unmapped) at once.
    ctx.synchronize().unwrap();
}

/// Whether `len` bytes of device memory at `ptr` hold `seed`'s pattern.
///
/// # Safety
///
/// As for [`device_fill`]: mapped, readable by the device, the caller's.
unsafe fn device_holds(
    ctx: &cudarc::driver::CudaContext,
    ptr: usize,
    len: usize,
    seed: u8,
) -> bool {
    ctx.bind_to_thread().unwrap();
    let mut back = vec![0u8; len];
    // SAFETY: the range is mapped and readable (the caller's contract);
    // `back` holds `len` bytes; a copy to pageable memory returns once the
    // bytes are there; the context is current (bound above).
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut back, ptr as u64) }.unwrap();
    back == device_pattern(len, seed)
}

/// The mapped layer on device pages: a pool caching nothing
/// (`FixedCapacity::new(0)`, so every release reaches the allocator) over
/// `Mapped::new(CudaPages::new(0))`, told the device holds 8 pages so that
/// spare pages move (unmapped where they were, mapped where a block needs
/// them) rather than new ones being made. Blocks of several sizes are
/// written with cudarc copies, some freed, blocks of other sizes allocated;
/// every block still held reads back its bytes, and `Mapped::validate()`
/// holds, after each step. Then a page moving alone: a block's page taken
/// by a block elsewhere shows the first block's bytes at its new address.
#[test]
fn mapped_device_pages_keep_block_bytes_while_pages_move() {
    use decaying_pool::FixedCapacity;
    use decaying_pool::pages::{CudaPages, Mapped, PageBackend};

    if skip("mapped_device_pages_keep_block_bytes_while_pages_move") {
        return;
    }
    let backend = CudaPages::new(0).unwrap();
    let g = backend.granularity();
    let ctx = backend.context().clone();
    let mapped = Mapped::new(backend)
        .with_spare_ttl(None)
        .with_reservation(32 * g)
        .with_capacity(8 * g);
    let mut pool = DecayingPool::new(mapped, FixedCapacity::new(0));
    // (block, size, seed) of the blocks held.
    let mut held: Vec<(usize, usize, u8)> = Vec::new();
    let check = |pool: &DecayingPool<Mapped<CudaPages>, FixedCapacity>,
                 held: &[(usize, usize, u8)],
                 step: &str| {
        for &(b, size, seed) in held {
            // SAFETY: `b` is a block of `size` bytes the pool handed out and
            // not given back: mapped, read-write, ours.
            let ok = unsafe { device_holds(&ctx, b, size, seed) };
            assert!(ok, "{step}: block {b:#x} of {size} bytes lost its bytes");
        }
        pool.allocator().validate().unwrap();
    };
    let mut seed = 0u8;
    let mut take = |pool: &mut DecayingPool<Mapped<CudaPages>, FixedCapacity>,
                    held: &mut Vec<(usize, usize, u8)>,
                    size: usize| {
        let b = pool.allocate(size).unwrap();
        assert_eq!(b % 512, 0, "blocks are aligned as CUDA's");
        seed = seed.wrapping_add(1);
        // SAFETY: `b` was just handed out for `size` bytes: mapped,
        // read-write, ours alone.
        unsafe { device_fill(&ctx, b, size, seed) };
        held.push((b, size, seed));
    };
    let give = |pool: &mut DecayingPool<Mapped<CudaPages>, FixedCapacity>,
                held: &mut Vec<(usize, usize, u8)>,
                i: usize| {
        let (b, size, _) = held.remove(i);
        // SAFETY: `b` came from `pool.allocate(size)`, released once; the
        // copies into it were synchronous and waited for, so nothing on the
        // device uses it.
        unsafe { pool.release(b, size) };
    };

    // 1. Blocks of several sizes, side by side, some sharing pages.
    for size in [100, g + 1, 3 * g - 7, 5000, 2 * g] {
        take(&mut pool, &mut held, size);
    }
    check(&pool, &held, "after the first blocks");
    let s = pool.allocator().stats();
    assert_eq!((s.blocks, s.unmaps), (5, 0), "{s:?}");
    assert!(s.page_bytes <= 8 * g, "{s:?}");

    // 2. The middle two freed: their pages no other block touches stay
    //    mapped, spare.
    give(&mut pool, &mut held, 2);
    give(&mut pool, &mut held, 1);
    check(&pool, &held, "after freeing two");
    let spare = pool.allocator().stats().spare_bytes;
    assert!(spare >= g, "the freed blocks leave spare pages: {spare}");

    // 3. Blocks of other sizes: the first does not fit the hole, and new
    //    pages would pass the capacity, so the spare pages move under it.
    for size in [4 * g + 513, 3 * g, 700] {
        take(&mut pool, &mut held, size);
        check(&pool, &held, &format!("after a block of {size}"));
    }
    let s = pool.allocator().stats();
    assert!(s.unmaps > 0, "no page moved: {s:?}");
    assert!(s.maps > s.unmaps, "{s:?}");

    // 4. All but the block of two pages freed, then a large block that
    //    fits in no mapped free run: pages move again.
    let keep = held.iter().position(|&(_, size, _)| size == 2 * g).unwrap();
    held.swap(0, keep);
    while held.len() > 1 {
        let last = held.len() - 1;
        give(&mut pool, &mut held, last);
        check(&pool, &held, "while freeing");
    }
    let before = pool.allocator().stats().unmaps;
    take(&mut pool, &mut held, 6 * g + 3);
    check(&pool, &held, "after the large block");
    let s = pool.allocator().stats();
    assert!(s.unmaps > before, "{s:?}");
    assert!(s.peak_page_bytes <= 12 * g, "{s:?}");

    // 5. Everything back: the pool trims the pages to the device.
    while !held.is_empty() {
        give(&mut pool, &mut held, 0);
    }
    pool.allocator().validate().unwrap();
    let s = pool.allocator().stats();
    assert_eq!((s.blocks, s.pages_released), (0, 0), "{s:?}");
    assert_eq!(pool.trim(), s.page_bytes);
    let s = pool.allocator().stats();
    assert_eq!((s.page_bytes, s.mapped_bytes), (0, 0), "{s:?}");
    pool.allocator().validate().unwrap();
    let c = pool.allocator().backend().counts();
    assert_eq!((c.live_pages(), c.mapped_pages()), (0, 0), "{c}");
    assert_eq!(c.created, c.released, "{c}");
    assert_eq!(c.maps, c.unmaps, "{c}");
    drop(pool);

    // A page moving alone: three pages of capacity, blocks of one page
    // each, the middle one given back.
    let mapped = Mapped::new(CudaPages::with_context(ctx.clone()).unwrap())
        .with_spare_ttl(None)
        .with_reservation(8 * g)
        .with_capacity(3 * g)
        .with_align(g);
    let mut pool = DecayingPool::new(mapped, FixedCapacity::new(0));
    let pin = pool.allocate(g).unwrap();
    let a = pool.allocate(g).unwrap();
    let pin2 = pool.allocate(g).unwrap();
    // SAFETY: `a` was just handed out for `g` bytes.
    unsafe { device_fill(&ctx, a, g, 9) };
    // SAFETY: from this pool with this size; the copy was waited for.
    unsafe { pool.release(a, g) };
    pool.allocator().validate().unwrap();
    // Two pages side by side do not fit `a`'s hole: they go after `pin2`,
    // with `a`'s page moved under one of them (a fourth page would pass
    // the capacity) and a new one under the other.
    let b = pool.allocate(2 * g).unwrap();
    assert_ne!(b, a);
    pool.allocator().validate().unwrap();
    let s = pool.allocator().stats();
    assert_eq!((s.unmaps, s.pages_created), (1, 4), "a's page moved: {s:?}");
    // SAFETY: `b` is a block of `2 * g` bytes, handed out and held.
    let shows = (0..2).any(|k| unsafe { device_holds(&ctx, b + k * g, g, 9) });
    assert!(shows, "the moved page keeps a's bytes at its new address");
    // SAFETY: each block came from this pool with its size, given back
    // once; nothing on the device uses them (the copies were synchronous).
    unsafe {
        pool.release(b, 2 * g);
        pool.release(pin, g);
        pool.release(pin2, g);
    }
    pool.allocator().validate().unwrap();
    assert_eq!(pool.trim(), 4 * g);
    let c = pool.allocator().backend().counts();
    assert_eq!((c.live_pages(), c.mapped_pages()), (0, 0), "{c}");
}

/// The mapped layer's fences on a stream: a block written by an
/// asynchronous memset queued on the backend's stream is given back at
/// once, with the work in flight; the fence its release records is waited
/// on before its pages are unmapped (`release_spare`). Without a stream,
/// the backend's wait synchronises the context instead.
#[test]
fn mapped_device_pages_wait_on_the_release_event_before_unmapping() {
    use cudarc::driver::sys;
    use decaying_pool::RawAllocator;
    use decaying_pool::pages::{CudaPages, Mapped, PageBackend};

    if skip("mapped_device_pages_wait_on_the_release_event_before_unmapping") {
        return;
    }
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let backend = CudaPages::with_context(ctx.clone())
        .unwrap()
        .on_stream(stream.clone());
    let g = backend.granularity();
    let mut m = Mapped::new(backend).with_spare_ttl(None);
    let size = 64 * g;
    let b = m.allocate(size).unwrap();
    ctx.bind_to_thread().unwrap();
    // SAFETY: `b` is a block of `size` bytes, mapped read-write; the memset
    // is queued on the backend's stream, which the release's fence covers.
    let r = unsafe { sys::cuMemsetD8Async(b as u64, 0x5A, size, stream.cu_stream()) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    // SAFETY: `b` came from `allocate(size)`, given back once; the host
    // uses it no more, and the queued memset is the fence's to wait for.
    unsafe { m.deallocate(b, size) };
    assert_eq!(m.backend().counts().fences, 1);
    assert_eq!(m.release_spare(), size);
    let c = m.backend().counts();
    assert_eq!((c.waits, c.unmaps), (1, 64), "{c}");
    m.validate().unwrap();
    // Without a stream: a fence is a number, a wait synchronises.
    let mut plain = Mapped::new(CudaPages::with_context(ctx.clone()).unwrap());
    let b = plain.allocate(g).unwrap();
    // SAFETY: as above; nothing was queued on `b`.
    unsafe { plain.deallocate(b, g) };
    assert_eq!(plain.release_spare(), g);
    let c = plain.backend().counts();
    assert_eq!((c.fences, c.waits), (1, 1), "{c}");
}
