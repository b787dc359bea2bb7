//! Requests the backing allocator can never serve: above its capacity
//! (`RawAllocator::capacity`), or more than what it has free plus every
//! cached byte (`RawAllocator::available`). They fail at once and keep the
//! cache, on every kind of pool; `usize::MAX`-class sizes are `TooLarge`
//! over the host allocators. Requests within reach still run the retry
//! ladder (`limit_retry`).

use core::time::Duration;

use decaying_pool::testing::{CheckingAllocator, FailingAllocator, TestError};
use decaying_pool::{
    DecayingPool, FixedTime, LocalPool, ManualClock, Packing, PoolError, RawAllocator, SharedPool,
    Stats, SystemAllocator,
};

const MIB: usize = 1 << 20;
const TTL: Duration = Duration::from_secs(3600);

type Pool = DecayingPool<FailingAllocator, FixedTime, ManualClock>;

/// A pool over a simulated device of `capacity` bytes, the device, and
/// the checking allocator inside it.
fn device(capacity: usize) -> (Pool, FailingAllocator, CheckingAllocator) {
    let dev = FailingAllocator::new(CheckingAllocator::with_addresses());
    dev.set_capacity(Some(capacity));
    let inner = dev.inner().clone();
    let pool = DecayingPool::builder(dev.clone())
        .policy(FixedTime::new(TTL))
        .clock(ManualClock::new())
        .build();
    (pool, dev, inner)
}

/// Allocates blocks of `sizes`, then releases them all.
fn cache<A: RawAllocator>(pool: &mut DecayingPool<A, FixedTime, ManualClock>, sizes: &[usize])
where
    A::Error: core::fmt::Debug,
{
    let blocks: Vec<_> = sizes.iter().map(|&s| pool.allocate(s).unwrap()).collect();
    for (b, &s) in blocks.into_iter().zip(sizes) {
        // SAFETY: `b` came from this pool with `s` bytes, released once.
        unsafe { pool.release(b, s) };
    }
}

#[test]
fn above_capacity_fails_at_once_and_keeps_the_cache() {
    let (mut pool, dev, inner) = device(64 * MIB);
    cache(&mut pool, &[8 * MIB, 8 * MIB, 16 * MIB]);
    let before = pool.stats();
    let calls = inner.calls().len();
    for size in [64 * MIB + 1, 1 << 40, isize::MAX as usize + 1, usize::MAX] {
        assert_eq!(
            pool.allocate(size),
            Err(PoolError::TooLarge { requested: size })
        );
    }
    assert_eq!(pool.stats(), before, "nothing freed, nothing counted");
    assert_eq!(before.bytes_cached, 32 * MIB);
    assert_eq!(inner.calls().len(), calls, "no backing call");
    assert_eq!(dev.failures(), 0);
    // The whole device is within reach: the ladder frees the cache for it.
    let b = pool.allocate(64 * MIB).unwrap();
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.bytes_cached), (1, 3, 0));
    // SAFETY: `b` came from this pool with 64 MiB, released once.
    unsafe { pool.release(b, 64 * MIB) };
    pool.validate();
    drop(pool);
    inner.assert_all_freed();
}

#[test]
fn more_than_free_plus_cached_fails_after_one_call_and_keeps_the_cache() {
    let (mut pool, dev, inner) = device(100 * MIB);
    let held = pool.allocate(60 * MIB).unwrap();
    cache(&mut pool, &[10 * MIB, 10 * MIB]);
    // 20 MiB free and 20 cached: 50 MiB cannot be had by freeing.
    assert_eq!(dev.available(), Some(20 * MIB));
    assert!(matches!(
        pool.allocate(50 * MIB),
        Err(PoolError::Backing(TestError::OutOfMemory { .. }))
    ));
    let s = pool.stats();
    assert_eq!(
        (s.backing_failures, s.trimmed, s.bytes_cached, s.misses),
        (1, 0, 20 * MIB, 3)
    );
    assert_eq!(dev.failures(), 1, "one backing call, no retry");
    // Memory taken elsewhere counts too: with 15 MiB of it gone, 30 MiB
    // is out of reach (5 free + 20 cached).
    let mut other = dev.clone();
    let foreign = other.allocate(15 * MIB).unwrap();
    assert!(matches!(
        pool.allocate(30 * MIB),
        Err(PoolError::Backing(_))
    ));
    assert_eq!((pool.stats().trimmed, dev.failures()), (0, 2));
    // SAFETY: `foreign` came from `other.allocate(15 MiB)`, freed once.
    unsafe { other.deallocate(foreign, 15 * MIB) };
    // 35 MiB is within reach (20 free + 20 cached): the ladder runs.
    let b = pool.allocate(35 * MIB).unwrap();
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.bytes_cached), (3, 2, 0));
    // SAFETY: each block came from this pool with its size, released once.
    unsafe {
        pool.release(b, 35 * MIB);
        pool.release(held, 60 * MIB);
    }
    pool.validate();
    drop(pool);
    inner.assert_all_freed();
}

/// A stacked pool's capacity is its allocator's, or its limit when lower;
/// what it has available counts its cached bytes. The outer pool refuses
/// a request the inner one can never serve, keeping both caches.
#[test]
fn a_pool_reports_its_capacity_and_what_it_could_free() {
    let dev = FailingAllocator::with_capacity(100 * MIB);
    let mut inner = DecayingPool::builder(dev.clone())
        .clock(ManualClock::new())
        .policy(FixedTime::new(TTL))
        .limit(50 * MIB)
        .build();
    assert_eq!(inner.capacity(), Some(50 * MIB));
    cache(&mut inner, &[10 * MIB]);
    let held = inner.allocate(5 * MIB).unwrap();
    // 50 MiB limit less 15 reserved, plus 10 cached: 45 (the device has 85 free).
    assert_eq!(inner.available(), Some(45 * MIB));
    // SAFETY: `held` came from `inner` with 5 MiB, released once.
    unsafe { inner.release(held, 5 * MIB) };
    inner.set_limit(None);
    assert_eq!(inner.capacity(), Some(100 * MIB));
    assert_eq!(inner.available(), Some(100 * MIB), "85 free + 15 cached");
    inner.set_limit(Some(50 * MIB));

    let mut outer = DecayingPool::builder(inner)
        .clock(ManualClock::new())
        .policy(FixedTime::new(TTL))
        .build();
    cache(&mut outer, &[20 * MIB]);
    let (before, inner_before) = (outer.stats(), outer.allocator().stats());
    assert_eq!(
        outer.allocate(60 * MIB),
        Err(PoolError::TooLarge {
            requested: 60 * MIB
        })
    );
    assert_eq!(outer.stats(), before);
    assert_eq!(outer.allocator().stats(), inner_before);
    assert_eq!(dev.failures(), 0);
}

/// The shared pool's misses run outside its cache lock; they refuse the
/// same requests, with the same counts, with and without thread caches.
#[test]
fn shared_pools_refuse_the_same_requests() {
    for thread_caches in [false, true] {
        let (pool, dev, _inner) = device(100 * MIB);
        let pool = if thread_caches {
            SharedPool::with_thread_caches(pool)
        } else {
            SharedPool::new(pool)
        };
        let held = pool.allocate(60 * MIB).unwrap();
        drop((
            pool.allocate(10 * MIB).unwrap(),
            pool.allocate(10 * MIB).unwrap(),
        ));
        let before = pool.stats();
        assert_eq!(before.bytes_cached, 20 * MIB);
        for size in [100 * MIB + 1, isize::MAX as usize + 1, usize::MAX] {
            assert_eq!(
                pool.allocate(size).err(),
                Some(PoolError::TooLarge { requested: size }),
                "thread caches: {thread_caches}"
            );
        }
        assert_eq!(pool.stats(), before);
        assert_eq!(dev.failures(), 0);
        assert!(matches!(
            pool.allocate(50 * MIB).err(),
            Some(PoolError::Backing(TestError::OutOfMemory { .. }))
        ));
        let s = pool.stats();
        assert_eq!(
            (s.backing_failures, s.trimmed, s.bytes_cached),
            (1, 0, 20 * MIB)
        );
        // Within reach: the ladder frees the cache (thread caches included).
        let b = pool.allocate(35 * MIB).unwrap();
        let s = pool.stats();
        assert_eq!((s.backing_failures, s.trimmed, s.bytes_cached), (2, 2, 0));
        drop((b, held));
        pool.validate();
    }
}

/// A limit above the device's capacity: the refusal comes before the
/// limit frees anything, in a plain and in a shared pool (which checks the
/// capacity its last miss read).
#[test]
fn above_capacity_under_a_larger_limit_frees_nothing() {
    let (mut plain, _dev, _inner) = device(100 * MIB);
    plain.set_limit(Some(150 * MIB));
    cache(&mut plain, &[20 * MIB, 20 * MIB]);
    assert!(matches!(
        plain.allocate(120 * MIB),
        Err(PoolError::TooLarge { .. })
    ));
    assert_eq!(
        (plain.stats().trimmed, plain.stats().bytes_cached),
        (0, 40 * MIB)
    );

    let pool = SharedPool::new(plain);
    let before = pool.stats();
    assert!(matches!(
        pool.allocate(120 * MIB).err(),
        Some(PoolError::TooLarge { .. })
    ));
    assert_eq!(pool.stats(), before);
    pool.validate();
}

/// A packed pool: its large requests and its segments go to the pool
/// underneath, which refuses what the device cannot hold, keeping the
/// segments and blocks it has cached.
#[test]
fn packed_pools_refuse_at_once_and_keep_the_cache() {
    let (pool, dev, _inner) = device(512 * MIB);
    let mut packed = DecayingPool::builder(pool.allocator().clone())
        .policy(FixedTime::new(TTL))
        .clock(ManualClock::new())
        .packing(Packing::default())
        .build();
    drop(pool);
    let small = packed.allocate(1000).unwrap();
    let large = packed.allocate(200 * MIB).unwrap();
    // SAFETY: each block came from this pool with its size, released once.
    unsafe {
        packed.release(small, 1000);
        packed.release(large, 200 * MIB);
    }
    let cached = packed.pool().stats().bytes_cached;
    assert!(cached >= 200 * MIB, "{cached}");
    for size in [512 * MIB + 1, isize::MAX as usize + 1, usize::MAX] {
        // (The size it names is the one asked of the pool underneath.)
        assert!(matches!(
            packed.allocate(size),
            Err(PoolError::TooLarge { requested }) if requested >= size
        ));
    }
    assert_eq!(packed.pool().stats().bytes_cached, cached);
    assert_eq!((packed.pool().stats().trimmed, dev.failures()), (0, 0));

    let shared = SharedPool::packed(packed);
    for size in [512 * MIB + 1, usize::MAX] {
        assert!(matches!(
            shared.allocate(size).err(),
            Some(PoolError::TooLarge { .. })
        ));
    }
    let inner = shared.with_packed(|p| p.pool().stats()).unwrap();
    assert_eq!((inner.bytes_cached, inner.trimmed), (cached, 0));
    assert_eq!(dev.failures(), 0);
}

/// Over the host allocators, sizes no allocation can have (above
/// `isize::MAX`, or above the machine's memory) are `TooLarge` on every
/// kind of pool, with a block cached that stays cached.
#[test]
fn host_pools_refuse_absurd_sizes_keeping_the_cache() {
    let cap = SystemAllocator::new().capacity().unwrap();
    assert!(cap <= isize::MAX as usize);
    let mut sizes = vec![usize::MAX, isize::MAX as usize + 1, cap + 1];
    if cap < 1 << 60 {
        sizes.push(1 << 60); // the request
    }
    let plain = || {
        DecayingPool::builder(SystemAllocator::new())
            .policy(FixedTime::new(TTL))
            .build()
    };
    let packed = || {
        DecayingPool::builder(SystemAllocator::new())
            .policy(FixedTime::new(TTL))
            .packing(Packing::default())
            .build()
    };
    // (A packed pool names the size it asked of the pool underneath: the
    // request rounded to `Packing::large_rounding`.)
    let too_large = |r: Result<(), PoolError<_>>, size: usize, kind: &str| match r {
        Err(PoolError::TooLarge { requested }) if requested >= size => {}
        other => panic!("{kind}: allocate({size}) gave {other:?}"),
    };
    let kept = |s: Stats, kind: &str| {
        assert_eq!((s.trimmed, s.backing_failures), (0, 0), "{kind}");
    };

    let mut p = plain();
    cache_host(&mut p);
    for &size in &sizes {
        too_large(p.allocate(size).map(drop), size, "plain");
    }
    kept(p.stats(), "plain");
    assert_eq!(p.stats().bytes_cached, 4096);

    let mut p = packed();
    let b = p.allocate(4096).unwrap();
    // SAFETY: `b` came from this pool with 4096 bytes, released once.
    unsafe { p.release(b, 4096) };
    let cached = p.pool().stats().bytes_cached;
    for &size in &sizes {
        too_large(p.allocate(size).map(drop), size, "packed");
    }
    kept(p.pool().stats(), "packed");
    assert_eq!(p.pool().stats().bytes_cached, cached);

    let shared_pools = [
        ("shared", SharedPool::new(plain())),
        ("thread caches", SharedPool::with_thread_caches(plain())),
    ];
    for (kind, pool) in shared_pools {
        drop(pool.allocate(4096).unwrap());
        for &size in &sizes {
            too_large(pool.allocate(size).map(drop), size, kind);
        }
        kept(pool.stats(), kind);
        assert_eq!(pool.stats().bytes_cached, 4096, "{kind}");
    }
    let pool = SharedPool::packed(packed());
    drop(pool.allocate(4096).unwrap());
    for &size in &sizes {
        too_large(pool.allocate(size).map(drop), size, "shared packed");
    }
    kept(
        pool.with_packed(|p| p.pool().stats()).unwrap(),
        "shared packed",
    );

    let local = LocalPool::new(plain());
    drop(local.allocate(4096).unwrap());
    for &size in &sizes {
        too_large(local.allocate(size).map(drop), size, "local");
    }
    kept(local.stats(), "local");
    assert_eq!(local.stats().bytes_cached, 4096);
}

fn cache_host(pool: &mut DecayingPool<SystemAllocator>) {
    let b = pool.allocate(4096).unwrap();
    // SAFETY: `b` came from this pool with 4096 bytes, released once.
    unsafe { pool.release(b, 4096) };
}

/// The case: a host tensor library on four threads, a shared
/// packed pool over `mmap`, a few hundred MiB cached; one impossible
/// shape costs no cache.
#[test]
#[cfg_attr(miri, ignore)] // mmap
#[cfg(unix)]
fn an_impossible_request_keeps_a_shared_mmap_cache() {
    use decaying_pool::MmapAllocator;
    let packed = DecayingPool::builder(MmapAllocator::new())
        .policy(FixedTime::new(TTL))
        .packing(Packing::default())
        .build();
    let pool = SharedPool::packed(packed);
    std::thread::scope(|s| {
        for t in 0..4 {
            let pool = pool.clone();
            s.spawn(move || {
                let blocks: Vec<_> = [1000, 300_000, 8 * MIB, 70 * MIB]
                    .iter()
                    .map(|&n| pool.allocate(n + t).unwrap())
                    .collect();
                drop(blocks);
            });
        }
    });
    let before = pool.with_packed(|p| p.pool().stats()).unwrap();
    // Threads that ran later reused the blocks of those before.
    assert!(before.bytes_cached >= 78 * MIB, "{before:?}");
    let cap = MmapAllocator::new().capacity().unwrap();
    for size in [usize::MAX, cap + 1] {
        assert!(matches!(
            pool.allocate(size).err(),
            Some(PoolError::TooLarge { .. })
        ));
    }
    assert_eq!(pool.with_packed(|p| p.pool().stats()).unwrap(), before);
    pool.trim();
    pool.validate();
}

/// On a CUDA device (skipped without one): the allocators report the
/// device's memory, and a request above it is refused with the cache kept.
#[test]
#[cfg(feature = "cuda")]
fn cuda_requests_above_the_device_are_refused() {
    use decaying_pool::cuda::{self, DeviceAllocator};
    if !cuda::available() {
        eprintln!("no CUDA device: skipping cuda_requests_above_the_device_are_refused");
        return;
    }
    let alloc = DeviceAllocator::new(0).unwrap();
    let total = alloc.context().total_mem().unwrap();
    assert_eq!(alloc.capacity(), Some(total));
    assert!(alloc.available().is_some_and(|free| free <= total));
    let mut pool = DecayingPool::new(alloc, FixedTime::new(TTL));
    let b = pool.allocate(MIB).unwrap();
    // SAFETY: `b` came from this pool with 1 MiB, released once.
    unsafe { pool.release(b, MIB) };
    let before = pool.stats();
    assert_eq!(
        pool.allocate(total + 1),
        Err(PoolError::TooLarge {
            requested: total + 1
        })
    );
    assert_eq!(pool.stats(), before);
}

/// Stacked on a packed pool or a logging adaptor, a pool sees the bound of
/// what is underneath: a request above it is refused at once.
#[test]
fn adaptors_forward_the_capacity() {
    use decaying_pool::trace::LoggingAllocator;
    use decaying_pool::{MmapAllocator, Packing, RawAllocator};
    let packed = DecayingPool::builder(MmapAllocator::new())
        .limit(1 << 30)
        .packing(Packing::default())
        .build();
    assert_eq!(RawAllocator::capacity(&packed), Some(1 << 30));
    let mut top = DecayingPool::new(packed, FixedTime::default());
    assert!(matches!(
        top.allocate(2 << 30),
        Err(PoolError::TooLarge { .. })
    ));
    let logged = LoggingAllocator::new(MmapAllocator::new(), std::io::sink()).unwrap();
    assert_eq!(logged.capacity(), MmapAllocator::new().capacity());
}
