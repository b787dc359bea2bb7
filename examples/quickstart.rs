//! Quick start: a training-like loop over real `mmap` memory, served by a
//! `DecayingPool`, then an idle phase in which the cache decays.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//!
//! Time is simulated with a `ManualClock` (100 ms per step) so the run is
//! short and repeatable; the memory and its first-touch cost are real.

use std::time::{Duration, Instant};

use decaying_pool::{DecayingPool, FixedTime, ManualClock, RawAllocator, Stats};

#[cfg(unix)]
type Backing = decaying_pool::MmapAllocator;
#[cfg(not(unix))]
type Backing = decaying_pool::SystemAllocator;

const MIB: usize = 1 << 20;
/// Buffers one step asks for: activations, gradients, and a workspace whose
/// size cycles through 4, 5 and 6 MiB for the first 15 steps, then stays at
/// 8 MiB (so the three old workspace blocks go idle and decay mid-run).
fn step_sizes(step: usize) -> [usize; 3] {
    let workspace = if step < 15 { 4 + step % 3 } else { 8 };
    [64 * MIB, 16 * MIB, workspace * MIB]
}

fn touch(block: *mut u8, size: usize) {
    // Write one byte per page, as a kernel writing its output would.
    for off in (0..size).step_by(4096) {
        // SAFETY: `block` is valid for `size` bytes (it came from an
        // allocator asked for `size` bytes) and nothing else uses it.
        unsafe { block.add(off).write_volatile(1) };
    }
}

fn row(label: &str, s: &Stats) {
    println!(
        "{label:<22} {:>5} {:>6} {:>6} {:>9} {:>9} {:>9} {:>10}",
        s.hits,
        s.misses,
        s.evictions,
        s.bytes_in_use / MIB,
        s.bytes_cached / MIB,
        s.bytes_reserved / MIB,
        s.bytes_from_pool / MIB,
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps = 30;
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(Backing::default())
        .policy(FixedTime::new(Duration::from_millis(500)))
        .clock(clock.clone())
        .build();

    println!(
        "decaying-pool quick start: {steps} steps of 100 ms, FixedTime(500 ms), mmap backing\n"
    );
    println!(
        "{:<22} {:>5} {:>6} {:>6} {:>9} {:>9} {:>9} {:>10}",
        "", "hits", "misses", "evict", "used MiB", "idle MiB", "held MiB", "pooled MiB"
    );

    let started = Instant::now();
    for step in 0..steps {
        let mut held = Vec::new();
        for size in step_sizes(step) {
            let block = pool.allocate(size)?;
            touch(block.as_ptr(), size);
            held.push((block, size));
        }
        for (block, size) in held.into_iter().rev() {
            // SAFETY: each block came from this pool with this size and is not used again.
            unsafe { pool.release(block, size) };
        }
        clock.advance(Duration::from_millis(100));
        if step % 5 == 4 {
            row(&format!("after step {}", step + 1), &pool.stats());
        }
    }
    let pooled = started.elapsed();

    clock.advance(Duration::from_millis(600));
    let freed = pool.collect();
    row("idle 600 ms, collect", &pool.stats());

    // The same loop with every buffer mapped and unmapped directly.
    let mut direct = Backing::default();
    let started = Instant::now();
    for step in 0..steps {
        for size in step_sizes(step) {
            let block = direct.allocate(size)?;
            touch(block.as_ptr(), size);
            // SAFETY: `block` came from `direct.allocate(size)` and is not used again.
            unsafe { direct.deallocate(block, size) };
        }
    }
    let unpooled = started.elapsed();

    let s = pool.stats();
    println!();
    println!(
        "hit rate {:.1} %: {} of {} requests served from the pool, {} backing allocations",
        100.0 * s.hit_rate(),
        s.hits,
        s.hits + s.misses,
        s.backing_allocs
    );
    println!(
        "peak reserved {} MiB; the idle phase freed {freed} blocks, {} MiB still held",
        s.peak_bytes_reserved / MIB,
        s.bytes_reserved / MIB
    );
    println!(
        "wall time: pooled {:.1} ms, direct map/touch/unmap {:.1} ms ({:.1}x)",
        pooled.as_secs_f64() * 1e3,
        unpooled.as_secs_f64() * 1e3,
        unpooled.as_secs_f64() / pooled.as_secs_f64()
    );
    Ok(())
}
