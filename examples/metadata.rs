//! Metadata overhead: bytes of pool bookkeeping per
//! cached block at 1 000 000 cached blocks, counted by a counting global
//! allocator.
//!
//! ```text
//! cargo run --release --example metadata
//! ```
//!
//! For each policy and class mix, it reads the bytes allocated on the heap
//! before building the pool, then after allocating and releasing 1 000 000
//! blocks over a backing allocator that does nothing (the test's own `Vec`
//! of blocks dropped first), and divides the difference by the blocks
//! cached. It does it again after a hit round trip over every block, which
//! leaves stale entries behind in the timed policies' queues. Last, it
//! trims the pool and reports the bookkeeping bytes still held (the timed
//! store gives its table, heap and queues back as the cache empties; the
//! `FixedCapacity` table is allocated once at its full size and kept).
//!
//! The `fixed_time_fifo` rows are `FixedTime` under `Reuse::Fifo`, whose
//! classes of two blocks or more keep them all in their rings.
//!
//! Beside each LIFO timed row of exact classes it prints the floor of the
//! timed store's layout for that mix: what its table, tokens and rings take with
//! no slack but the table's (see [`floor`]). The measured bytes are within
//! a few percent of it, so what is left at few blocks a class is the
//! layout's, not waste.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use decaying_pool::{
    DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, Policy, Reuse, SizeClass,
};

/// `std::alloc::System`, keeping count of the bytes currently allocated.
struct Counting;

/// Bytes currently allocated through [`Counting`].
static CURRENT: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the same arguments; the
// counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            CURRENT.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            CURRENT.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            CURRENT.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Every heap allocation of this program goes through the counter.
#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes allocated on the heap right now.
fn current() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

// The benchmarks' backing allocator that does nothing: hands out numbers,
// no heap.
#[path = "../benches/common/mod.rs"]
mod common;
use common::Null;

/// Blocks in every measurement.
const BLOCKS: usize = 1_000_000;

/// What one measurement found.
struct Row {
    /// Blocks cached at the end.
    cached: u64,
    /// Heap bytes per cached block after filling.
    filled: f64,
    /// Heap bytes per cached block after a hit round trip over every block.
    after_hits: f64,
    /// Heap bytes held once the pool is trimmed (empty, not dropped).
    after_trim: usize,
}

/// Bytes of a bucket of the timed store's table: a class (a cache line,
/// holding its size, its newest block and its ring) and its control byte.
const BUCKET: usize = 64 + 1;
/// Bytes of a block in a class's ring, and of a class's token in the heap
/// (the store checks both sizes at compile time).
const ITEM: usize = 24;
const TOKEN: usize = 24;

/// The buckets of a `hashbrown` table grown one insertion at a time to
/// `classes` entries: the fewest, a power of two, whose capacity (seven
/// eighths of them from 16 up, one fewer below) holds them.
fn buckets(classes: usize) -> usize {
    let mut b = 4;
    while (if b <= 8 { b - 1 } else { b / 8 * 7 }) < classes {
        b *= 2;
    }
    b
}

/// The timed store's bytes per cached block for `classes` classes of
/// `per` blocks, with no slack but the table's: the table's buckets (and
/// its trailing group of 16 control bytes), one token a class and one ring
/// slot for each block but a class's newest (which is in its bucket).
fn floor(classes: usize, per: usize) -> f64 {
    let bytes = buckets(classes) * BUCKET + 16 + classes * (TOKEN + (per - 1) * ITEM);
    bytes as f64 / (classes * per) as f64
}

/// `classes` distinct sizes, each requested `BLOCKS / classes` times.
fn requests(classes: usize) -> Vec<usize> {
    let per = BLOCKS / classes;
    (0..classes)
        .flat_map(|c| std::iter::repeat_n(256 + c * 16, per))
        .collect()
}

/// Allocates one block per request, then releases them all; the `Vec`
/// holding them is gone on return.
fn round<P: Policy>(pool: &mut DecayingPool<Null, P, ManualClock>, requests: &[usize]) {
    let held: Vec<(usize, usize)> = requests
        .iter()
        .map(|&s| (pool.allocate(s).unwrap(), s))
        .collect();
    for (b, s) in held {
        // SAFETY: each block came from this pool with this size.
        unsafe { pool.release(b, s) };
    }
}

/// Measures the bookkeeping of a pool with `policy`, `class` and `reuse`
/// for `requests`.
fn measure<P: Policy>(policy: P, class: SizeClass, reuse: Reuse, requests: &[usize]) -> Row {
    let clock = ManualClock::new();
    let before = current();
    let mut pool = DecayingPool::builder(Null::default())
        .policy(policy)
        .clock(clock.clone())
        .size_class(class)
        .reuse(reuse)
        .build();
    round(&mut pool, requests);
    let filled = current() - before;
    let cached = pool.stats().blocks_cached;
    clock.advance(Duration::from_millis(1));
    round(&mut pool, requests);
    let after_hits = current() - before;
    assert_eq!(pool.stats().blocks_cached, cached);
    pool.trim();
    let after_trim = current() - before;
    drop(pool);
    Row {
        cached,
        filled: filled as f64 / cached as f64,
        after_hits: after_hits as f64 / cached as f64,
        after_trim,
    }
}

/// Prints the table.
fn main() {
    let huge = Duration::from_secs(1 << 40);
    println!(
        "{BLOCKS} blocks allocated then released over a no-op allocator; heap bytes per cached block"
    );
    println!(
        "{:<16} {:<26} {:>10} {:>12} {:>18} {:>16} {:>14}",
        "policy",
        "classes",
        "cached",
        "bytes/block",
        "after hit trip",
        "after trim (B)",
        "layout floor"
    );
    // Between one size and a million, mixes of 100 to 1 blocks a class
    // (at 34, 18 and 10 a class's older blocks are just past a power of
    // two, and its ring's capacity at its emptiest).
    // The last mix is the million sizes' requests rounded to PyTorch-style
    // size classes (four per power of two): 65 classes, the shape a
    // program that asks for a million distinct sizes can choose (its
    // blocks are then up to a quarter larger than asked).
    // Exact classes, by blocks a class (the sizes are `BLOCKS / per`);
    // then the rounded mix.
    let exact = [1_000_000, 100, 34, 18, 16, 10, 9, 8, 7, 6, 5, 4, 2, 1].map(|per| {
        let classes = BLOCKS / per;
        let noun = if classes == 1 { "size" } else { "sizes" };
        (
            format!("{classes} {noun} x {per}"),
            classes,
            SizeClass::Exact,
            format!("{:.1}", floor(classes, per)),
        )
    });
    let rounded = (
        format!("{BLOCKS} sizes, 4 per 2^k"),
        BLOCKS,
        SizeClass::PowerOfTwoDivisions(4),
        "-".to_string(),
    );
    for (label, classes, class, timed_floor) in exact.into_iter().chain([rounded]) {
        let reqs = requests(classes);
        let lifo = Reuse::Lifo;
        for (name, row) in [
            (
                "fixed_time",
                measure(FixedTime::new(huge), class, lifo, &reqs),
            ),
            (
                "fixed_time_fifo",
                measure(FixedTime::new(huge), class, Reuse::Fifo, &reqs),
            ),
            (
                "exponential",
                measure(Exponential::new(huge), class, lifo, &reqs),
            ),
            (
                "fixed_capacity",
                measure(FixedCapacity::new(BLOCKS), class, lifo, &reqs),
            ),
        ] {
            // The floor is a LIFO store's (a FIFO class of two blocks or
            // more keeps them all in its ring).
            let floor = if name == "fixed_capacity" || name == "fixed_time_fifo" {
                "-"
            } else {
                &timed_floor
            };
            println!(
                "{:<16} {:<26} {:>10} {:>12.1} {:>18.1} {:>16} {:>14}",
                name, label, row.cached, row.filled, row.after_hits, row.after_trim, floor
            );
        }
    }
}
