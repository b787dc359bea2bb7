//! A trace replayed on the GPU: the backing calls each pool really makes,
//! and what they really cost, beside what the replay's model says.
//!
//! ```text
//! cargo run --release --example cuda_replay --features cuda,trace -- TRACE [PASSES [FACTOR]]
//! ```
//!
//! It reads `TRACE` (any format the replay tool reads) and replays it
//! `PASSES` times (default 1) through three configurations over
//! `DeviceAllocator` (`cuMemAlloc` / `cuMemFree` on device 0): no pool, the
//! exact pool (`FixedTime` 1 s) and the packed pool (default `Packing` over
//! it), each on its own. Time is the trace's, as in the replay tool: a
//! `ManualClock` set to each event's time, so each pool decides exactly as
//! its modelled twin does, and the live blocks of a pass are released at
//! its end. Each backing call and each pool call is timed with the wall
//! clock. The model's row (the same configuration through
//! `trace::Replayer`, `CostModel::cuda`) comes first, the device's second.
//! Without a CUDA driver and device only the model's rows are printed.
//!
//! With `FACTOR` (say `1.1`), the two pools are built with a byte limit of
//! `FACTOR` times the trace's peak live bytes
//! ([`Builder::limit`](decaying_pool::Builder::limit)), as on a
//! device that small: a request the limit refuses is counted as a failure
//! and the replay goes on (`benches/gpu/torch_replay.py TRACE PASSES FACTOR`
//! gives PyTorch the same bound).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUdeviceptr;
use decaying_pool::cuda::{self, CudaError, DeviceAllocator};
use decaying_pool::trace::{
    Config, Event, Op, PolicyKind, ReadOptions, ReplayOptions, Replayer, TraceReader,
};
use decaying_pool::{
    DecayingPool, FixedTime, ManualClock, Packable, Packing, PoolError, RawAllocator, Stats,
};

/// `DeviceAllocator`, counting and timing its calls.
struct Timed {
    inner: DeviceAllocator,
    allocs: u64,
    frees: u64,
    alloc_time: Duration,
    free_time: Duration,
    reserved: usize,
    peak_reserved: usize,
}

impl RawAllocator for Timed {
    type Block = CUdeviceptr;
    type Error = CudaError;

    fn allocate(&mut self, size: usize) -> Result<CUdeviceptr, CudaError> {
        let t = Instant::now();
        let b = self.inner.allocate(size);
        self.alloc_time += t.elapsed();
        if b.is_ok() {
            self.allocs += 1;
            self.reserved += size;
            self.peak_reserved = self.peak_reserved.max(self.reserved);
        }
        b
    }

    unsafe fn deallocate(&mut self, block: CUdeviceptr, size: usize) {
        let t = Instant::now();
        // SAFETY: forwarded: `block` came from `self.inner` at `size` and is
        // freed once (the caller's contract).
        unsafe { self.inner.deallocate(block, size) };
        self.free_time += t.elapsed();
        self.frees += 1;
        self.reserved -= size;
    }
}

impl Packable for Timed {
    fn carve(segment: &CUdeviceptr, offset: usize) -> CUdeviceptr {
        <DeviceAllocator as Packable>::carve(segment, offset)
    }

    fn address(block: &CUdeviceptr) -> usize {
        <DeviceAllocator as Packable>::address(block)
    }
}

/// One configuration on the device.
trait Pool {
    fn allocate(&mut self, size: usize) -> Result<CUdeviceptr, PoolError<CudaError>>;
    /// # Safety
    ///
    /// `block` came from `allocate(size)` and is released once.
    unsafe fn release(&mut self, block: CUdeviceptr, size: usize);
    fn backing(&self) -> &Timed;
    fn stats(&self) -> Option<Stats>;
}

impl Pool for Timed {
    fn allocate(&mut self, size: usize) -> Result<CUdeviceptr, PoolError<CudaError>> {
        RawAllocator::allocate(self, size).map_err(PoolError::Backing)
    }
    unsafe fn release(&mut self, block: CUdeviceptr, size: usize) {
        // SAFETY: forwarded (the caller's contract).
        unsafe { self.deallocate(block, size) }
    }
    fn backing(&self) -> &Timed {
        self
    }
    fn stats(&self) -> Option<Stats> {
        None
    }
}

impl Pool for DecayingPool<Timed, FixedTime, ManualClock> {
    fn allocate(&mut self, size: usize) -> Result<CUdeviceptr, PoolError<CudaError>> {
        DecayingPool::allocate(self, size)
    }
    unsafe fn release(&mut self, block: CUdeviceptr, size: usize) {
        // SAFETY: forwarded (the caller's contract).
        unsafe { DecayingPool::release(self, block, size) }
    }
    fn backing(&self) -> &Timed {
        self.allocator()
    }
    fn stats(&self) -> Option<Stats> {
        Some(DecayingPool::stats(self))
    }
}

impl Pool for decaying_pool::PackedPool<Timed, FixedTime, ManualClock> {
    fn allocate(&mut self, size: usize) -> Result<CUdeviceptr, PoolError<CudaError>> {
        decaying_pool::PackedPool::allocate(self, size)
    }
    unsafe fn release(&mut self, block: CUdeviceptr, size: usize) {
        // SAFETY: forwarded (the caller's contract).
        unsafe { decaying_pool::PackedPool::release(self, block, size) }
    }
    fn backing(&self) -> &Timed {
        self.pool().allocator()
    }
    fn stats(&self) -> Option<Stats> {
        Some(decaying_pool::PackedPool::stats(self))
    }
}

/// What one configuration did on the device.
struct Measured {
    failures: u64,
    pool_time: Duration,
    calls: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Replays `events` `passes` times on `pool`, on trace time, as
/// `trace::Replayer` does (no gap between passes, no reaper).
fn replay(pool: &mut dyn Pool, clock: &ManualClock, events: &[Event], passes: u32) -> Measured {
    let mut live: HashMap<u64, (CUdeviceptr, usize)> = HashMap::new();
    let mut m = Measured {
        failures: 0,
        pool_time: Duration::ZERO,
        calls: 0,
    };
    let (mut now, mut offset) = (0u64, 0u64);
    for _ in 0..passes {
        let origin = events.first().map_or(0, |e| nanos(e.time));
        for e in events {
            now = now.max(offset.saturating_add(nanos(e.time).saturating_sub(origin)));
            clock.set(Duration::from_nanos(now));
            let size = usize::try_from(e.size).unwrap_or(usize::MAX);
            match e.op {
                Op::Alloc => {
                    let t = Instant::now();
                    let b = pool.allocate(size);
                    m.pool_time += t.elapsed();
                    m.calls += 1;
                    match b {
                        Ok(b) => {
                            live.insert(e.addr, (b, size));
                        }
                        Err(_) => m.failures += 1,
                    }
                }
                Op::Free => {
                    if let Some((b, size)) = live.remove(&e.addr) {
                        let t = Instant::now();
                        // SAFETY: `b` came from `allocate(size)` and leaves
                        // `live` here, so it is released once.
                        unsafe { pool.release(b, size) };
                        m.pool_time += t.elapsed();
                        m.calls += 1;
                    }
                }
            }
        }
        // The pass ends: what it left live goes back, in ascending order
        // of trace address, as `trace::Replayer` releases it.
        let mut left: Vec<_> = live.drain().collect();
        left.sort_unstable_by_key(|&(addr, _)| addr);
        for (_, (b, size)) in left {
            // SAFETY: as above.
            unsafe { pool.release(b, size) };
        }
        offset = now;
    }
    m
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: cuda_replay TRACE [PASSES [FACTOR]]  (a trace the replay tool reads)")?;
    let passes: u32 = match args.next() {
        Some(p) => p
            .parse()
            .map_err(|_| format!("PASSES: not a number: {p}"))?,
        None => 1,
    };
    let factor: Option<f64> = match args.next() {
        Some(f) => match f.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Some(x),
            _ => return Err(format!("FACTOR: not a positive number: {f}").into()),
        },
        None => None,
    };
    // Frees of blocks allocated before the trace began are skipped, as
    // the replay tool's `--lenient` does.
    let options = ReadOptions {
        lenient_frees: true,
        ..ReadOptions::default()
    };
    let events: Vec<Event> = TraceReader::open(&path, options)?.collect::<Result<_, _>>()?;
    let live_peak = {
        let (mut live, mut peak, mut sizes) = (0usize, 0usize, HashMap::new());
        for e in &events {
            let size = usize::try_from(e.size).unwrap_or(usize::MAX);
            match e.op {
                Op::Alloc => {
                    sizes.insert(e.addr, size);
                    live += size;
                    peak = peak.max(live);
                }
                Op::Free => live -= sizes.remove(&e.addr).unwrap_or(0),
            }
        }
        peak
    };
    // The limit in bytes: `FACTOR` times the peak live bytes, rounded up.
    let limit = factor.map(|f| (f * live_peak as f64).ceil() as usize);
    println!(
        "{path}: {} events, {passes} pass(es), peak live {:.1} MiB{}",
        events.len(),
        mib(live_peak),
        limit.map_or(String::new(), |l| format!(
            ", pools limited to {:.1} MiB",
            mib(l)
        ))
    );

    let ttl = Duration::from_secs(1);
    let bounded = |c: Config| match limit {
        Some(l) => c.limit(l),
        None => c,
    };
    let configs = [
        Config::new(PolicyKind::NoPool),
        bounded(Config::new(PolicyKind::FixedTime(ttl))),
        bounded(Config::new(PolicyKind::FixedTime(ttl)).packing(Packing::default()))
            .named("packed"),
    ];
    let mut model = Replayer::new(&configs, ReplayOptions::default());
    for _ in 0..passes {
        model.begin_pass();
        for e in &events {
            model.event(e);
        }
    }
    let reports = model.finish(&path);

    let device = if cuda::available() {
        Some(DeviceAllocator::new(0)?)
    } else {
        println!("no CUDA driver or device here: the model's rows only");
        None
    };
    if let Some(d) = &device {
        println!("device: {}", d.context().name().unwrap_or_default());
    }
    println!(
        "\n{:<16} {:<6} {:>8} {:>8} {:>10} {:>7} {:>10} {:>10} {:>12} {:>8}",
        "config",
        "row",
        "b.allocs",
        "b.frees",
        "peak res",
        "÷live",
        "b.alloc s",
        "b.free s",
        "pool µs/call",
        "failures"
    );
    for (config, report) in configs.iter().zip(&reports) {
        println!(
            "{:<16} {:<6} {:>8} {:>8} {:>6.1} MiB {:>7.2} {:>21.4} {:>12} {:>8}",
            config.name,
            "model",
            report.backing_allocs,
            report.backing_frees,
            mib(report.peak_reserved_bytes),
            report.reserved_over_live(),
            report.modelled_backing_seconds,
            "",
            report.failures
        );
        let Some(device) = &device else { continue };
        let clock = ManualClock::new();
        let timed = Timed {
            inner: device.clone(),
            allocs: 0,
            frees: 0,
            alloc_time: Duration::ZERO,
            free_time: Duration::ZERO,
            reserved: 0,
            peak_reserved: 0,
        };
        let builder = |timed| {
            let b = DecayingPool::builder(timed)
                .policy(FixedTime::new(ttl))
                .clock(clock.clone());
            match limit {
                Some(l) => b.limit(l),
                None => b,
            }
        };
        let mut exact;
        let mut packed;
        let mut direct;
        let pool: &mut dyn Pool = match config.policy {
            PolicyKind::NoPool => {
                direct = timed;
                &mut direct
            }
            _ if config.packing.is_some() => {
                packed = builder(timed).packing(Packing::default()).build();
                &mut packed
            }
            _ => {
                exact = builder(timed).build();
                &mut exact
            }
        };
        let m = replay(pool, &clock, &events, passes);
        let b = pool.backing();
        let peak = pool
            .stats()
            .map_or(b.peak_reserved, |s| s.peak_bytes_reserved);
        let (backing_allocs, backing_frees, alloc_s, free_s) =
            (b.allocs, b.frees, b.alloc_time, b.free_time);
        println!(
            "{:<16} {:<6} {:>8} {:>8} {:>6.1} MiB {:>7.2} {:>10.4} {:>10.4} {:>12.2} {:>8}",
            "",
            "device",
            backing_allocs,
            backing_frees,
            mib(peak),
            peak as f64 / live_peak.max(1) as f64,
            alloc_s.as_secs_f64(),
            free_s.as_secs_f64(),
            m.pool_time.as_secs_f64() * 1e6 / m.calls.max(1) as f64,
            m.failures
        );
    }
    println!(
        "\nb.allocs / b.frees: cuMemAlloc / cuMemFree calls during the replay (the pools' final drop not counted);\n\
         model: CostModel::cuda (published cudaMalloc / cuMemFree figures), b.alloc s = allocate and free together;\n\
         device: wall time in the calls; pool µs/call: every allocate and release, backing calls included"
    );
    Ok(())
}
