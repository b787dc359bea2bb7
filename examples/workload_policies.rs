//! Replays a real PyTorch CUDA allocation trace through every eviction
//! policy and prints what each would have cost: hits, backing calls, peak
//! memory and idle byte-seconds.
//!
//! ```text
//! cargo run --release --example workload_policies [TRACE.csv]
//! ```
//!
//! The trace defaults to
//! `../shared/workloads/pytorch_cs336_medium_ctx128_training.csv` next to
//! the crate: a `torch.cuda.memory._record_memory_history` snapshot
//! converted to CSV (`device,time_us,action,addr,size,stream`). `alloc` is
//! an allocation, `free_completed` the moment the block is reusable; other
//! actions (PyTorch's own segment calls, `free_requested`) are ignored, and
//! so are frees of addresses allocated before the trace began.
//!
//! The replay runs on trace time: a `ManualClock` is set to each event's
//! `time_us` before the pool is called, so decay happens exactly as it
//! would have in the traced program. The backing allocator is a
//! `CheckingAllocator` (numbered blocks, no real memory).

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use decaying_pool::policy::Policy;
use decaying_pool::testing::CheckingAllocator;
use decaying_pool::{
    DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, Reuse, SizeClass, Stats,
};

const DEFAULT_TRACE: &str = "../shared/workloads/pytorch_cs336_medium_ctx128_training.csv";
const MIB: f64 = (1u64 << 20) as f64;

/// One event of the trace that the replay acts on.
#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc { size: usize },
    Free,
}

#[derive(Clone, Copy, Debug)]
struct Event {
    time_us: u64,
    /// (device, address): the key a free is matched on.
    key: (u32, u64),
    op: Op,
}

/// A malformed line.
#[derive(Debug)]
struct ParseError {
    line: usize,
    what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

impl Error for ParseError {}

/// What the file held, besides the events replayed.
#[derive(Debug, Default)]
struct TraceInfo {
    lines: usize,
    other_actions: usize,
}

fn parse(text: &str) -> Result<(Vec<Event>, TraceInfo), ParseError> {
    let mut events = Vec::new();
    let mut info = TraceInfo::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("device,") {
            continue;
        }
        info.lines += 1;
        let err = |what: String| ParseError { line: i + 1, what };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() < 5 {
            return Err(err(format!("expected 6 fields, found {}", fields.len())));
        }
        let op = match fields[2] {
            "alloc" => {
                let size = fields[4]
                    .parse::<usize>()
                    .map_err(|e| err(format!("size {:?}: {e}", fields[4])))?;
                Op::Alloc { size }
            }
            "free_completed" => Op::Free,
            _ => {
                info.other_actions += 1;
                continue;
            }
        };
        let device = fields[0]
            .parse::<u32>()
            .map_err(|e| err(format!("device {:?}: {e}", fields[0])))?;
        let time_us = fields[1]
            .parse::<u64>()
            .map_err(|e| err(format!("time_us {:?}: {e}", fields[1])))?;
        let hex = fields[3].trim_start_matches("0x").trim_start_matches("0X");
        let addr =
            u64::from_str_radix(hex, 16).map_err(|e| err(format!("addr {:?}: {e}", fields[3])))?;
        events.push(Event {
            time_us,
            key: (device, addr),
            op,
        });
    }
    Ok((events, info))
}

/// The outcome of one policy over the trace.
struct Row {
    policy: String,
    stats: Stats,
    /// Integral of `bytes_cached` over trace time, in byte-microseconds.
    idle_byte_us: u128,
    /// Frees of addresses the trace never allocated (ignored).
    unknown_frees: u64,
    /// Allocations of an address already live (the earlier block is
    /// released first).
    double_allocs: u64,
    /// Allocations of zero bytes (skipped).
    zero_allocs: u64,
}

fn replay<P: Policy>(name: &str, policy: P, events: &[Event]) -> Result<Row, Box<dyn Error>> {
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(CheckingAllocator::new())
        .policy(policy)
        .clock(clock.clone())
        .size_class(SizeClass::Exact)
        .reuse(Reuse::Lifo)
        .build();
    let mut live: HashMap<(u32, u64), (u64, usize)> = HashMap::new();
    let mut row = Row {
        policy: name.to_owned(),
        stats: Stats::default(),
        idle_byte_us: 0,
        unknown_frees: 0,
        double_allocs: 0,
        zero_allocs: 0,
    };
    let mut last_us = events.first().map_or(0, |e| e.time_us);
    for ev in events {
        // The pool changes only when called: between two events it holds
        // what it held after the first.
        let dt = ev.time_us.saturating_sub(last_us);
        row.idle_byte_us += pool.stats().bytes_cached as u128 * u128::from(dt);
        last_us = last_us.max(ev.time_us);
        clock.set(Duration::from_micros(ev.time_us));
        match ev.op {
            Op::Alloc { size } => {
                if size == 0 {
                    row.zero_allocs += 1;
                    continue;
                }
                let block = pool.allocate(size).map_err(|e| format!("{name}: {e}"))?;
                if let Some((old, old_size)) = live.insert(ev.key, (block, size)) {
                    row.double_allocs += 1;
                    // SAFETY: `old` came from `pool.allocate(old_size)` and
                    // is dropped from the live map, so it is not used again.
                    unsafe { pool.release(old, old_size) };
                }
            }
            Op::Free => match live.remove(&ev.key) {
                // SAFETY: `block` came from `pool.allocate(size)` and was
                // just removed from the live map, so it is released once.
                Some((block, size)) => unsafe { pool.release(block, size) },
                None => row.unknown_frees += 1,
            },
        }
    }
    pool.collect();
    row.stats = pool.stats();
    Ok(row)
}

fn main() -> Result<(), Box<dyn Error>> {
    let path: PathBuf = match std::env::args_os().nth(1) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_TRACE),
    };
    if !path.exists() {
        println!(
            "workload_policies: trace {} not found; nothing to replay.\n\
             Pass a trace path as the first argument \
             (columns device,time_us,action,addr,size,stream).",
            path.display()
        );
        return Ok(());
    }
    let text = std::fs::read_to_string(&path)?;
    let (events, info) = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;

    let allocs = events
        .iter()
        .filter(|e| matches!(e.op, Op::Alloc { .. }))
        .count();
    let mut sizes: Vec<usize> = events
        .iter()
        .filter_map(|e| match e.op {
            Op::Alloc { size } => Some(size),
            Op::Free => None,
        })
        .collect();
    let requested: u128 = sizes.iter().map(|&s| s as u128).sum();
    sizes.sort_unstable();
    sizes.dedup();
    let span_us = match (events.first(), events.last()) {
        (Some(a), Some(b)) => b.time_us.saturating_sub(a.time_us),
        _ => 0,
    };
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    println!("trace: {name}");
    println!(
        "  {} records: {allocs} alloc, {} free_completed, {} other actions ignored",
        info.lines,
        events.len() - allocs,
        info.other_actions
    );
    println!(
        "  {} distinct sizes, {:.1} MiB requested in total, {:.3} s of trace time",
        sizes.len(),
        requested as f64 / MIB,
        span_us as f64 / 1e6
    );
    println!(
        "  replay: ManualClock on trace time, CheckingAllocator, SizeClass::Exact, Reuse::Lifo"
    );
    println!();

    let ms = Duration::from_millis;
    let rows = vec![
        replay(
            "keep-all (FixedTime ∞)",
            FixedTime::new(Duration::MAX),
            &events,
        )?,
        replay("FixedTime 1 ms", FixedTime::new(ms(1)), &events)?,
        replay("FixedTime 10 ms", FixedTime::new(ms(10)), &events)?,
        replay("FixedTime 100 ms", FixedTime::new(ms(100)), &events)?,
        replay("Exponential 1 ms", Exponential::half_life(ms(1)), &events)?,
        replay("Exponential 10 ms", Exponential::half_life(ms(10)), &events)?,
        replay(
            "Exponential 100 ms",
            Exponential::half_life(ms(100)),
            &events,
        )?,
        replay("FixedCapacity 64", FixedCapacity::new(64), &events)?,
        replay("FixedCapacity 256", FixedCapacity::new(256), &events)?,
        replay("FixedCapacity 1024", FixedCapacity::new(1024), &events)?,
    ];

    println!(
        "{:<24} {:>7} {:>7} {:>7} {:>8} {:>10} {:>10} {:>11} {:>9}",
        "policy", "hits", "misses", "hit %", "b.frees", "peak res", "peak use", "idle", "evictions"
    );
    println!(
        "{:<24} {:>7} {:>7} {:>7} {:>8} {:>10} {:>10} {:>11} {:>9}",
        "", "", "=allocs", "", "", "MiB", "MiB", "MiB·s", ""
    );
    println!("{}", "-".repeat(24 + 8 * 3 + 9 + 11 * 2 + 12 + 10));
    for r in &rows {
        let s = &r.stats;
        assert_eq!(s.misses, s.backing_allocs);
        println!(
            "{:<24} {:>7} {:>7} {:>7.2} {:>8} {:>10.1} {:>10.1} {:>11.3} {:>9}",
            r.policy,
            s.hits,
            s.misses,
            100.0 * s.hit_rate(),
            s.backing_deallocs,
            s.peak_bytes_reserved as f64 / MIB,
            s.peak_bytes_in_use as f64 / MIB,
            r.idle_byte_us as f64 / 1e6 / MIB,
            s.evictions
        );
    }
    let first = &rows[0];
    println!();
    println!(
        "idle = integral of bytes_cached over trace time; b.frees = backing deallocations \
         (before the pool is dropped); collect() ran at the trace's last timestamp."
    );
    println!(
        "{} frees of addresses allocated before the trace began were ignored; \
         {} blocks still in use at the end ({:.1} MiB).",
        first.unknown_frees,
        first.stats.blocks_in_use,
        first.stats.bytes_in_use as f64 / MIB
    );
    if first.double_allocs > 0 || first.zero_allocs > 0 {
        println!(
            "anomalies: {} allocations of a live address (earlier block released), \
             {} zero-size allocations skipped.",
            first.double_allocs, first.zero_allocs
        );
    }
    Ok(())
}
