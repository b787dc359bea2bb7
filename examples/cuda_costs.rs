//! What the CUDA backing allocators cost on this machine, by size, beside
//! the published figures the replay's cost model uses
//! ([`CostCurve::cuda_malloc`](decaying_pool::trace::CostCurve::cuda_malloc)),
//! and what a pool hit costs in front of them.
//!
//! ```text
//! cargo run --release --example cuda_costs --features cuda,trace
//! ```
//!
//! For each size it allocates a few blocks in a row through
//! `DeviceAllocator` (`cuMemAlloc`), then frees them (`cuMemFree`), timing
//! each call, and prints the median, least and most. The same for pinned
//! host memory (`PinnedHostAllocator`, `cuMemHostAlloc`) and for the
//! driver's stream-ordered allocator (`StreamAllocator`): there "cold" is
//! an allocation after the stream was synchronised (the driver's pool gives
//! its memory back then, by default) and "warm" one that its pool serves.
//! Last, the round trip of a hit of a `DecayingPool` and of a packed pool
//! over the device, and `cuMemFree` while work is queued on the device (it
//! waits for that work) beside a pool's release. The `CostCurve` lines at
//! the end are the measured medians in the form `CostCurve::new` takes.
//! Without a CUDA driver and device it says so and exits.

use std::time::{Duration, Instant};

use decaying_pool::cuda::{self, DeviceAllocator, PinnedHostAllocator, StreamAllocator};
use decaying_pool::trace::CostCurve;
use decaying_pool::{DecayingPool, FixedTime, Packing, RawAllocator};

const KB: usize = 1000;
const MB: usize = 1000 * KB;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// The sizes the crate's measured device curves have a point at.
const DEVICE_SIZES: &[usize] = &CostCurve::DEVICE_SIZES;
const PINNED_SIZES: &[usize] = &[512, 64 * KB, MB, 32 * MB, 128 * MB, 512 * MB];

/// Blocks allocated in a row at `size` (fewer when large).
fn reps(size: usize) -> usize {
    match size {
        s if s <= 64 * MB => 16,
        s if s <= GIB => 6,
        _ => 3,
    }
}

/// Median, least and most of `samples`, in µs.
fn summary(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let n = samples.len();
    let median = if n % 2 == 1 {
        us(samples[n / 2])
    } else {
        (us(samples[n / 2 - 1]) + us(samples[n / 2])) / 2.0
    };
    (median, us(samples[0]), us(samples[n - 1]))
}

fn size_label(size: usize) -> String {
    match size {
        s if s >= GIB && s % GIB == 0 => format!("{} GiB", s / GIB),
        s if s >= MIB && s % MIB == 0 => format!("{} MiB", s / MIB),
        s if s >= MB && s % MB == 0 => format!("{} MB", s / MB),
        s if s >= KB && s % KB == 0 => format!("{} KB", s / KB),
        s => format!("{s} B"),
    }
}

/// Allocates `reps(size)` blocks in a row, then frees them; the times of
/// each allocation and each free.
fn time_in_a_row<A: RawAllocator>(
    alloc: &mut A,
    size: usize,
) -> Result<(Vec<Duration>, Vec<Duration>), A::Error> {
    let n = reps(size);
    let mut blocks = Vec::with_capacity(n);
    let mut allocs = Vec::with_capacity(n);
    let mut frees = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let b = alloc.allocate(size);
        allocs.push(t.elapsed());
        match b {
            Ok(b) => blocks.push(b),
            Err(e) => {
                for b in blocks {
                    // SAFETY: allocated above at `size`, freed once.
                    unsafe { alloc.deallocate(b, size) };
                }
                return Err(e);
            }
        }
    }
    for b in blocks {
        let t = Instant::now();
        // SAFETY: allocated above at `size`, freed once; nothing uses it.
        unsafe { alloc.deallocate(b, size) };
        frees.push(t.elapsed());
    }
    Ok((allocs, frees))
}

fn table<A: RawAllocator>(
    title: &str,
    alloc: &mut A,
    sizes: &[usize],
    published: Option<&CostCurve>,
) -> Vec<(usize, f64, f64)>
where
    A::Error: std::fmt::Display,
{
    println!("\n{title}: µs per call, median (least–most) of the blocks allocated in a row");
    println!(
        "{:>9} {:>4} {:>26} {:>26} {:>10}",
        "size", "n", "allocate", "free", "published"
    );
    let mut medians = Vec::new();
    for &size in sizes {
        match time_in_a_row(alloc, size) {
            Ok((mut a, mut f)) => {
                let (am, alo, ahi) = summary(&mut a);
                let (fm, flo, fhi) = summary(&mut f);
                let published = published.map_or(String::new(), |c| {
                    format!("{:.0}", c.cost(size).as_secs_f64() * 1e6)
                });
                println!(
                    "{:>9} {:>4} {:>9.1} ({:>6.1}–{:>7.1}) {:>9.1} ({:>6.1}–{:>7.1}) {:>10}",
                    size_label(size),
                    a.len(),
                    am,
                    alo,
                    ahi,
                    fm,
                    flo,
                    fhi,
                    published
                );
                medians.push((size, am, fm));
            }
            Err(e) => println!("{:>9}  failed: {e}", size_label(size)),
        }
    }
    medians
}

/// `cuMemAllocAsync` after a synchronise (cold) and from the driver's pool
/// (warm), and `cuMemFreeAsync`.
fn stream_table(alloc: &mut StreamAllocator) {
    println!("\nStreamAllocator (cuMemAllocAsync / cuMemFreeAsync): µs per call, median of 16");
    println!(
        "{:>9} {:>12} {:>12} {:>12}",
        "size", "cold alloc", "warm alloc", "free"
    );
    for &size in &[512, 64 * KB, MB, 16 * MB, 64 * MB, 512 * MB] {
        let (mut cold, mut warm, mut free) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..16 {
            if alloc.stream().synchronize().is_err() {
                println!("{:>9}  synchronize failed", size_label(size));
                return;
            }
            for samples in [&mut cold, &mut warm] {
                let t = Instant::now();
                let Ok(b) = alloc.allocate(size) else {
                    println!("{:>9}  allocation failed", size_label(size));
                    return;
                };
                samples.push(t.elapsed());
                let t = Instant::now();
                // SAFETY: allocated above on this stream, freed once, unused.
                unsafe { alloc.deallocate(b, size) };
                free.push(t.elapsed());
            }
        }
        println!(
            "{:>9} {:>12.1} {:>12.1} {:>12.1}",
            size_label(size),
            summary(&mut cold).0,
            summary(&mut warm).0,
            summary(&mut free).0
        );
    }
    let _ = alloc.stream().synchronize();
}

/// ns per hit round trip (allocate + release) of a pool over the device.
fn hit_round_trips(device: &DeviceAllocator) -> Result<(), Box<dyn std::error::Error>> {
    const N: u32 = 1_000_000;
    let ttl = FixedTime::new(Duration::from_secs(10));
    let mut exact = DecayingPool::new(device.clone(), ttl);
    let mut packed = DecayingPool::builder(device.clone())
        .policy(ttl)
        .packing(Packing::default())
        .build();
    println!("\npool hits over the device: ns per round trip (allocate + release), {N} in a row");
    for size in [4096, MB, 64 * MB] {
        let e = round_trip(&mut exact, size, N)?;
        // Alone, the block's segment empties at each release and goes
        // back to the exact pool: each round trip takes it again.
        let alone = round_trip(&mut packed, size, N)?;
        // With a neighbour held, the segment stays: carve and free only.
        let neighbour = packed.allocate(size)?;
        let kept = round_trip(&mut packed, size, N)?;
        // SAFETY: allocated just above at `size`; nothing uses it.
        unsafe { packed.release(neighbour, size) };
        println!(
            "{:>9}  DecayingPool {e:>6.1} ns   packed: segment kept {kept:>6.1} ns, segment taken each time {alone:>6.1} ns",
            size_label(size)
        );
    }
    Ok(())
}

/// ns per round trip of `size` through `pool` (a pool, as a
/// `RawAllocator`), `n` times in a row.
fn round_trip<A: RawAllocator>(pool: &mut A, size: usize, n: u32) -> Result<f64, A::Error> {
    let b = pool.allocate(size)?;
    // SAFETY: allocated just above at `size`; nothing uses it.
    unsafe { pool.deallocate(b, size) };
    let t = Instant::now();
    for _ in 0..n {
        let b = pool.allocate(size)?;
        // SAFETY: as above.
        unsafe { pool.deallocate(std::hint::black_box(b), size) };
    }
    Ok(t.elapsed().as_secs_f64() * 1e9 / f64::from(n))
}

/// `cuMemFree` while the device is busy: it waits for the queued work,
/// where a pool's release does not.
fn free_while_busy(device: &mut DeviceAllocator) -> Result<(), Box<dyn std::error::Error>> {
    let stream = device.context().default_stream();
    let mut buf = stream.alloc_zeros::<u8>(4 * GIB)?;
    let mut pool = DecayingPool::new(device.clone(), FixedTime::new(Duration::from_secs(10)));
    let pooled = pool.allocate(2 * MIB)?;
    let block = device.allocate(2 * MIB)?;
    stream.synchronize()?;
    // Time the queued work alone first.
    let t = Instant::now();
    for _ in 0..8 {
        stream.memset_zeros(&mut buf)?;
    }
    stream.synchronize()?;
    let work = t.elapsed();
    for _ in 0..8 {
        stream.memset_zeros(&mut buf)?;
    }
    let t = Instant::now();
    // SAFETY: allocated above from the pool at this size; unused.
    unsafe { pool.release(pooled, 2 * MIB) };
    let release = t.elapsed();
    let t = Instant::now();
    // SAFETY: allocated above at this size, freed once; nothing uses it.
    unsafe { device.deallocate(block, 2 * MIB) };
    let free = t.elapsed();
    stream.synchronize()?;
    println!(
        "\nwith {:.1} ms of work queued on the device (8 memsets of 4 GiB): \
         cuMemFree of 2 MiB took {:.1} µs, the pool's release {:.2} µs",
        work.as_secs_f64() * 1e3,
        free.as_secs_f64() * 1e6,
        release.as_secs_f64() * 1e6
    );
    Ok(())
}

fn curve_line(name: &str, medians: &[(usize, f64, f64)], free: bool) {
    let points: Vec<String> = medians
        .iter()
        .map(|&(s, a, f)| format!("({s}, us({:.0}))", if free { f } else { a }))
        .collect();
    println!("{name}: CostCurve::new([{}])", points.join(", "));
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !cuda::available() {
        println!("cuda_costs: no CUDA driver or device here; nothing to measure");
        return Ok(());
    }
    let mut device = DeviceAllocator::new(0)?;
    // The first call creates the context; keep it out of the figures.
    let b = device.allocate(MIB)?;
    // SAFETY: allocated just above; freed once.
    unsafe { device.deallocate(b, MIB) };
    let name = device.context().name().unwrap_or_default();
    println!("cuda_costs on {name}");

    let published = CostCurve::cuda_malloc();
    let dev = table(
        "DeviceAllocator (cuMemAlloc / cuMemFree); published: cudaMalloc",
        &mut device,
        DEVICE_SIZES,
        Some(&published),
    );
    let mut pinned = PinnedHostAllocator::new(0)?;
    let pin = table(
        "PinnedHostAllocator (cuMemHostAlloc / cuMemFreeHost); published: cudaHostAlloc",
        &mut pinned,
        PINNED_SIZES,
        Some(&CostCurve::cuda_host_alloc()),
    );
    let mut stream = StreamAllocator::new(device.context().new_stream()?);
    stream_table(&mut stream);
    hit_round_trips(&device)?;
    free_while_busy(&mut device)?;

    println!(
        "\nmeasured medians, as the replay's cost model takes them (us = Duration::from_micros):"
    );
    curve_line("cuMemAlloc", &dev, false);
    curve_line("cuMemFree", &dev, true);
    curve_line("cuMemHostAlloc", &pin, false);
    curve_line("cuMemFreeHost", &pin, true);
    Ok(())
}
