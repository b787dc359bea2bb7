//! A hit's latency on one thread while another thread's misses each spend
//! 5 ms in the backing allocator (a `cuMemAlloc` or `cuMemFree` that waits
//! for a busy device): percentiles of allocate + release round trips of a
//! 256-byte block, for the pool kinds a multi-threaded caller shares.
//!
//! - `plain`: `SharedPool::new` (misses call the allocator outside the
//!   cache lock);
//! - `packed`: `SharedPool::packed` (misses call it outside the packing
//!   lock);
//! - `packed, one mutex`: a `PackedPool` behind one `Mutex`, the lock held
//!   across every backing call (what a caller writes by hand, and what a
//!   packed `SharedPool` did before): the hit waits for the miss.
//!
//! `cargo bench --bench contention` (a few seconds per kind; prints a
//! table). Not a criterion bench: the figure is a tail percentile under a
//! second thread, which criterion's mean-centred statistics do not give.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use decaying_pool::{
    DecayingPool, FixedTime, Packable, PackedPool, Packing, RawAllocator, SharedPool,
    SystemAllocator,
};

/// The backing call of every miss at or above this size sleeps.
const SLOW_FROM: usize = 1 << 20;
/// The second thread's sizes: past the default packing's medium threshold
/// (128 MiB), so exact blocks in every pool kind.
const LARGE: usize = 129 << 20;
const SLOW: Duration = Duration::from_millis(5);
/// How long each kind is measured.
const RUN: Duration = Duration::from_secs(3);

/// The system allocator, whose large allocations and frees take 5 ms.
#[derive(Default)]
struct Slow(SystemAllocator);

impl RawAllocator for Slow {
    type Block = NonNull<u8>;
    type Error = <SystemAllocator as RawAllocator>::Error;

    fn allocate(&mut self, size: usize) -> Result<NonNull<u8>, Self::Error> {
        if size >= SLOW_FROM {
            thread::sleep(SLOW);
        }
        self.0.allocate(size)
    }

    unsafe fn deallocate(&mut self, block: NonNull<u8>, size: usize) {
        if size >= SLOW_FROM {
            thread::sleep(SLOW);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.deallocate(block, size) }
    }
}

impl Packable for Slow {
    fn carve(segment: &NonNull<u8>, offset: usize) -> NonNull<u8> {
        <SystemAllocator as Packable>::carve(segment, offset)
    }
    fn address(block: &NonNull<u8>) -> usize {
        <SystemAllocator as Packable>::address(block)
    }
}

/// One pool kind as the two threads see it.
trait Subject: Sync {
    /// A round trip of `size` bytes.
    fn round_trip(&self, size: usize);
}

impl Subject for SharedPool<Slow> {
    fn round_trip(&self, size: usize) {
        drop(black_box(self.allocate(size).expect("allocate")));
    }
}

struct OneMutex(Mutex<PackedPool<Slow>>);

// SAFETY: the pool's blocks are host pointers into memory the pool owns,
// used by one thread at a time under the mutex.
unsafe impl Sync for OneMutex {}

impl Subject for OneMutex {
    fn round_trip(&self, size: usize) {
        let block = self.0.lock().unwrap().allocate(size).expect("allocate");
        black_box(block);
        // SAFETY: `block` came from this pool with this size, released once.
        unsafe { self.0.lock().unwrap().release(block, size) };
    }
}

/// A pool whose idle blocks live 1 ms: the second thread's requests miss
/// again and again (each miss and each free of a large block takes 5 ms).
fn builder() -> decaying_pool::Builder<Slow, FixedTime> {
    DecayingPool::builder(Slow::default()).policy(FixedTime::new(Duration::from_millis(1)))
}

/// The hit latencies (ns) of one thread while another misses, and the
/// number of misses made meanwhile.
fn measure(subject: &dyn Subject) -> (Vec<u64>, u64) {
    // Warm: the 256-byte class cached (packed: its segment held).
    subject.round_trip(256);
    let stop = AtomicBool::new(false);
    let misses = AtomicU64::new(0);
    let mut lat = Vec::with_capacity(1 << 22);
    thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // Larger every time: no cached block serves it, every call
                // misses (and the idle ones are freed as they expire).
                subject.round_trip(LARGE + i * 4096);
                misses.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
        let start = Instant::now();
        while start.elapsed() < RUN && lat.len() < lat.capacity() {
            let t = Instant::now();
            subject.round_trip(256);
            lat.push(t.elapsed().as_nanos() as u64);
        }
        stop.store(true, Ordering::Relaxed);
    });
    lat.sort_unstable();
    (lat, misses.into_inner())
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once
    // quickly with no argument of its own.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let kinds: Vec<(&str, Box<dyn Subject>)> = vec![
        ("plain", Box::new(SharedPool::new(builder().build()))),
        (
            "packed",
            Box::new(SharedPool::packed(
                builder().packing(Packing::default()).build(),
            )),
        ),
        (
            "packed, one mutex",
            Box::new(OneMutex(Mutex::new(
                builder().packing(Packing::default()).build(),
            ))),
        ),
    ];
    println!(
        "hit round trips (256 B) on one thread while another's misses take {} ms each, {} s a kind",
        SLOW.as_millis(),
        RUN.as_secs()
    );
    println!(
        "{:<18} {:>10} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "pool", "hits", "misses", "p50 ns", "p99 ns", "p99.9 ns", "max ns"
    );
    for (name, subject) in &kinds {
        let (lat, misses) = measure(subject.as_ref());
        println!(
            "{:<18} {:>10} {:>9} {:>9} {:>9} {:>11} {:>11}",
            name,
            lat.len(),
            misses,
            percentile(&lat, 0.50),
            percentile(&lat, 0.99),
            percentile(&lat, 0.999),
            lat.last().copied().unwrap_or(0)
        );
    }
}
