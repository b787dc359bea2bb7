//! `trace::RequestLog` and the pools' request hooks: every pool a user runs
//! (plain, packed, shared, shared packed, thread-cached, the raw blocks of
//! `SharedPool::with`) logs its callers' requests, from many threads, to a
//! trace that reads back balanced and replays; a hook that panics loses no
//! block.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::Duration;

use decaying_pool::testing::CheckingAllocator;
use decaying_pool::trace::{Op, RequestLog, TraceReader};
use decaying_pool::{
    DecayingPool, FixedTime, MmapAllocator, Packing, Pooled, Request, SharedPool, SystemAllocator,
};

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("decaying-pool-{name}-{}.trace", std::process::id()))
}

/// Reads a trace back: every free matches a live allocation of its size,
/// nothing is live at the end, the times never go back; returns the
/// number of allocations.
fn read_balanced(path: &PathBuf) -> u64 {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut allocs, mut last) = (0, Duration::ZERO);
    for e in TraceReader::new(file).unwrap() {
        let e = e.unwrap();
        assert!(e.time >= last, "events in time order");
        last = e.time;
        match e.op {
            Op::Alloc => {
                allocs += 1;
                assert!(
                    live.insert(e.addr, e.size).is_none(),
                    "{:#x} handed out twice",
                    e.addr
                );
            }
            Op::Free => assert_eq!(live.remove(&e.addr), Some(e.size), "free of {:#x}", e.addr),
        }
    }
    assert!(live.is_empty(), "{} blocks never released", live.len());
    std::fs::remove_file(path).unwrap();
    allocs
}

fn sizes(t: usize) -> impl Iterator<Item = usize> {
    (0..60).map(move |i| [64, 700, 5000, 3 << 20, 100 << 10][(i * 7 + t) % 5] + i)
}

/// Four threads allocate from `pool`, keeping a few blocks at a time.
fn churn<A>(pool: &SharedPool<A>)
where
    A: decaying_pool::RawAllocator + Send + 'static,
    A::Block: decaying_pool::SendBlock,
{
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                let mut held: Vec<Pooled<A>> = Vec::new();
                for size in sizes(t) {
                    held.push(pool.allocate(size).unwrap());
                    if held.len() > 3 {
                        held.remove(0);
                    }
                }
            });
        }
    });
}

#[test]
fn a_shared_packed_pool_over_mmap_records_its_threads_requests() {
    let path = temp("shared-packed");
    let log = RequestLog::create(&path).unwrap();
    let mut pool = DecayingPool::builder(MmapAllocator::new())
        .policy(FixedTime::new(Duration::from_secs(1)))
        .packing(Packing::default())
        .build();
    pool.log_requests(log.sink());
    let pool = SharedPool::packed(pool);
    churn(&pool);
    assert_eq!(pool.stats().hits + pool.stats().misses, 240);
    log.finish().unwrap();
    assert_eq!(log.events(), 480);
    assert_eq!(read_balanced(&path), 240);
}

#[test]
fn shared_and_thread_cached_pools_record_every_request() {
    for cached in [false, true] {
        let path = temp(if cached { "thread-cached" } else { "shared" });
        let log = RequestLog::create(&path).unwrap();
        let mut pool = DecayingPool::new(
            SystemAllocator::new(),
            FixedTime::new(Duration::from_secs(1)),
        );
        pool.log_requests(log.sink());
        let pool = if cached {
            SharedPool::with_thread_caches(pool)
        } else {
            SharedPool::new(pool)
        };
        churn(&pool);
        // Raw blocks through `with`, and one through `into_raw`.
        let raw = pool.with(|p| p.allocate(4096)).unwrap();
        // SAFETY: `raw` came from this pool with 4096 bytes and is released once.
        pool.with(|p| unsafe { p.release(raw, 4096) });
        let (b, size) = pool.allocate(100).unwrap().into_raw();
        // SAFETY: `b` came from this pool with `size`, through `into_raw`, once.
        drop(unsafe { Pooled::from_raw(&pool, b, size) });
        log.finish().unwrap();
        assert_eq!(read_balanced(&path), 242, "thread caches: {cached}");
    }
}

#[test]
fn plain_and_packed_pools_log_the_callers_blocks_not_segments() {
    let path = temp("plain-packed");
    let log = RequestLog::create(&path).unwrap();
    let mut plain = DecayingPool::new(SystemAllocator::new(), FixedTime::default());
    plain.log_requests(log.sink());
    let mut packed = DecayingPool::builder(SystemAllocator::new())
        .packing(Packing::default())
        .build();
    packed.log_requests(log.sink());
    for size in [100, 200, 300] {
        let (a, b) = (
            plain.allocate(size).unwrap(),
            packed.allocate(size).unwrap(),
        );
        // SAFETY: each block came from its pool with this size and is not used again.
        unsafe {
            plain.release(a, size);
            packed.release(b, size);
        }
    }
    assert_eq!(packed.stats().backing_allocs, 1, "one segment");
    log.finish().unwrap();
    assert_eq!(
        read_balanced(&path),
        6,
        "three requests each, the segment not logged"
    );
}

#[test]
fn a_panicking_hook_loses_no_block() {
    let alloc = CheckingAllocator::new();
    let mut pool = DecayingPool::new(alloc.clone(), FixedTime::default());
    pool.log_requests(|r: Request<'_, u64>| {
        if !r.is_allocation() {
            panic!("hook");
        }
    });
    let b = pool.allocate(64).unwrap();
    // SAFETY: `b` came from this pool with this size and is not used again.
    let released = catch_unwind(AssertUnwindSafe(|| unsafe { pool.release(b, 64) }));
    assert!(released.is_err(), "the hook's panic reaches the caller");
    assert_eq!(pool.stats().blocks_cached, 1, "the block went back first");

    // A shared pool: the hook panics on allocation; the block goes back.
    let mut inner = DecayingPool::new(alloc.clone(), FixedTime::default());
    inner.log_requests(|r: Request<'_, u64>| {
        if r.is_allocation() {
            panic!("hook");
        }
    });
    let shared = SharedPool::new(inner);
    assert!(catch_unwind(AssertUnwindSafe(|| shared.allocate(64))).is_err());
    assert_eq!(shared.stats().blocks_in_use, 0);
    assert!(catch_unwind(AssertUnwindSafe(|| shared.with(|p| p.allocate(64)))).is_err());
    assert_eq!(shared.stats().blocks_in_use, 0);
    drop((pool, shared));
    alloc.assert_all_freed();
}

#[test]
fn a_write_error_stops_the_log_and_finish_reports_it() {
    struct Full;
    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    assert!(
        RequestLog::new(Full).is_err(),
        "the header cannot be written"
    );
    // A writer that takes the header (25 bytes), then fails.
    struct Budget(usize);
    impl std::io::Write for Budget {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if b.len() > self.0 {
                return Err(std::io::Error::other("disk full"));
            }
            self.0 -= b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = RequestLog::new(Budget("time_ns,action,addr,size\n".len())).unwrap();
    let mut pool = DecayingPool::new(SystemAllocator::new(), FixedTime::default());
    pool.log_requests(log.sink());
    let b = pool.allocate(64).unwrap();
    // SAFETY: `b` came from this pool with this size and is not used again.
    unsafe { pool.release(b, 64) };
    assert_eq!(log.events(), 0);
    assert!(log.finish().unwrap_err().to_string().contains("disk full"));
    assert!(log.finish().is_err(), "still stopped");
    assert_eq!(
        pool.stats().hits + pool.stats().misses,
        1,
        "the pool kept working"
    );
}
