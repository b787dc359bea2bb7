//! A downstream crate's view of the pool: a host tensor cache built only on
//! the public API, as a tensor library would adopt it.
//!
//! Each section exercises one thing such a crate needs; run it with
//! `cargo run --example downstream` (it also runs under `cargo test`).

use core::time::Duration;
use std::sync::{Arc, Mutex};
use std::thread;

use decaying_pool::{
    AnyPolicy, DecayingPool, Event, Exponential, FixedCapacity, FixedTime, HumanBytes, LocalPool,
    ManualClock, PoolError, Reason, SharedPool, SizeClass, SystemAllocator,
};

// ---------------------------------------------------------------------------
// Host pools cross threads: a `Send + Sync` device type holding a pool.

/// What a tensor library's "host device" looks like: shared by every thread.
struct HostDevice {
    pool: Mutex<DecayingPool<SystemAllocator, Exponential>>,
}

fn host_pools_are_send() {
    let device = Arc::new(HostDevice {
        pool: Mutex::new(DecayingPool::new(
            SystemAllocator::new(),
            Exponential::new(Duration::from_secs(5)),
        )),
    });
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let device = Arc::clone(&device);
            thread::spawn(move || {
                let mut pool = device.pool.lock().unwrap();
                let block = pool.allocate(1 << 16).unwrap();
                // SAFETY: `block` came from this pool with this size and is not used again.
                unsafe { pool.release(block, 1 << 16) };
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let s = device.pool.lock().unwrap().stats();
    assert_eq!((s.misses, s.hits), (1, 3));

    // A stacked host pool behind a `SharedPool`, with a reaper thread.
    let inner = DecayingPool::new(
        SystemAllocator::new(),
        FixedTime::new(Duration::from_secs(60)),
    );
    let shared = SharedPool::new(DecayingPool::new(
        inner,
        FixedTime::new(Duration::from_secs(1)),
    ));
    let reaper = shared.spawn_reaper(Duration::from_millis(100));
    drop(shared.allocate(4096).unwrap());
    drop(reaper);
    println!("host pools are Send: {}", shared.stats().blocks_cached);
}

// ---------------------------------------------------------------------------
// Safe handles for one thread: blocks release themselves, byte views.

fn local_handles() {
    let pool = LocalPool::new(DecayingPool::new(
        SystemAllocator::new(),
        FixedCapacity::new(256).per_size(32),
    ));
    let mut tensors: Vec<_> = (0..24).map(|_| pool.allocate(4 << 10).unwrap()).collect();
    for (i, t) in tensors.iter_mut().enumerate() {
        t.fill(i as u8);
    }
    drop(tensors); // 24 same-size buffers, all cached (per_size 32)
    let s = pool.stats();
    assert_eq!((s.blocks_cached, s.evictions), (24, 0));
    // A hit hands back the previous user's bytes: initialise before reading.
    let mut again = pool.allocate(4 << 10).unwrap();
    let bytes = again.fill(0);
    assert!(bytes.iter().all(|&b| b == 0));
    println!("local handles: {} hits", pool.stats().hits);
}

// ---------------------------------------------------------------------------
// Run-time knobs and figures: a policy picked from a config string
// (`AnyPolicy`), statistics by size class, an observer, a limit changed at
// run time, `reset_peaks`, the `Stats` summary and (with the `serde`
// feature) a JSON snapshot. `cargo run --example downstream -- exponential`
// picks another policy.

const KIB: usize = 1 << 10;

/// What a config file or a command-line flag names.
fn policy_from_config(name: &str) -> AnyPolicy {
    match name {
        "fixed_capacity" => AnyPolicy::from(FixedCapacity::new(64)),
        "exponential" => AnyPolicy::timed(Exponential::new(Duration::from_millis(500))),
        _ => AnyPolicy::timed(FixedTime::new(Duration::from_secs(1))),
    }
}

/// A tensor's buffer: `numel` f32 elements.
fn tensor_bytes(numel: usize) -> usize {
    numel * 4
}

/// Warm-up: a few "layers", each with weights, activations and a scratch
/// buffer whose size does not round well.
fn warm_up(
    pool: &SharedPool<SystemAllocator, AnyPolicy, ManualClock>,
    clock: &ManualClock,
) -> Result<(), PoolError<decaying_pool::backend::AllocError>> {
    for step in 0..20 {
        let weights = pool.allocate(tensor_bytes(256 * 256))?;
        let activations = pool.allocate(tensor_bytes(64 * 1000))?;
        let scratch = pool.allocate(tensor_bytes(3000 + step % 3 * 100))?;
        drop((weights, activations, scratch));
        clock.advance(Duration::from_millis(50));
    }
    Ok(())
}

fn knobs(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new();
    let freed = Arc::new(Mutex::new(Vec::<(usize, Reason)>::new()));
    let failures = Arc::new(Mutex::new(0u32));
    let (log, fails) = (freed.clone(), failures.clone());
    let pool = SharedPool::new(
        DecayingPool::builder(SystemAllocator::new())
            .policy(policy_from_config(name))
            .clock(clock.clone())
            .size_class(SizeClass::PowerOfTwo)
            .class_stats(true)
            .observer(move |e: Event| match e {
                Event::Freed { size, reason } => log.lock().unwrap().push((size, reason)),
                Event::BackingFailed { .. } => *fails.lock().unwrap() += 1,
                _ => {}
            })
            .build(),
    );

    warm_up(&pool, &clock)?;
    println!("policy {name}: after warm-up\n{}\n", pool.stats());

    println!("by size class (first seen first):");
    for c in pool.class_stats().unwrap_or_default() {
        println!(
            "  {:>10}: {:>3} hits {:>2} misses, {} cached, {} evicted, {} trimmed",
            HumanBytes(c.size).to_string(),
            c.hits,
            c.misses,
            HumanBytes(c.bytes_cached),
            c.evictions,
            c.trimmed
        );
    }

    // Memory pressure elsewhere: lower the limit to 300 KiB at run time. The
    // cache shrinks oldest first; one 256 KiB tensor still fits.
    let freed_bytes = pool.set_limit(Some(300 * KIB));
    println!(
        "\nset_limit(300 KiB) freed {}; reserved now {}",
        HumanBytes(freed_bytes),
        HumanBytes(pool.stats().bytes_reserved)
    );
    let held = pool.allocate(tensor_bytes(256 * 256))?;
    match pool.allocate(tensor_bytes(64 * 1000)) {
        Err(PoolError::LimitExceeded { limit, .. }) => {
            println!("a second tensor is refused: limit {}", HumanBytes(limit))
        }
        other => println!("unexpected: {:?}", other.map(|b| b.size())),
    }
    drop(held);
    pool.set_limit(None);

    // Measure one phase's peak.
    pool.reset_peaks();
    let big = pool.allocate(1 << 20)?;
    drop(big);
    println!(
        "phase peak reserved: {}",
        HumanBytes(pool.stats().peak_bytes_reserved)
    );

    // Idle: the timed policies give everything back.
    clock.advance(Duration::from_secs(5));
    pool.collect();
    let by_reason = |r: Reason| freed.lock().unwrap().iter().filter(|f| f.1 == r).count();
    println!(
        "\nthe observer saw {} expired, {} displaced, {} limit frees and {} backing failures",
        by_reason(Reason::Expired),
        by_reason(Reason::Displaced),
        by_reason(Reason::Limit),
        failures.lock().unwrap()
    );
    println!("\nat the end\n{}", pool.stats());

    #[cfg(feature = "serde")]
    println!(
        "\nas JSON: {}",
        serde_json::to_string(&pool.stats()).expect("Stats serialize")
    );
    Ok(())
}

fn main() {
    host_pools_are_send();
    local_handles();
    let policy = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fixed_time".into());
    knobs(&policy).expect("the knobs section runs");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary `docs/pool.md` shows is what this example prints after
    /// its warm-up (the guide's block, checked against the output).
    #[test]
    fn the_pool_guide_shows_the_warm_up_summary() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/pool.md");
        let Ok(guide) = std::fs::read_to_string(path) else {
            eprintln!("skipped: {path} is absent (not in a checkout)");
            return;
        };
        let clock = ManualClock::new();
        let pool = SharedPool::new(
            DecayingPool::builder(SystemAllocator::new())
                .policy(policy_from_config("fixed_time"))
                .clock(clock.clone())
                .size_class(SizeClass::PowerOfTwo)
                .class_stats(true)
                .build(),
        );
        warm_up(&pool, &clock).unwrap();
        let shown: Vec<String> = pool
            .stats()
            .to_string()
            .lines()
            .map(|l| l.trim_end().to_owned())
            .collect();
        let lines: Vec<&str> = guide.lines().map(str::trim_end).collect();
        assert!(
            lines
                .windows(shown.len() + 1)
                .any(|w| w[0] == "```text" && w[1..] == shown[..]),
            "docs/pool.md does not show the warm-up summary:\n{}",
            shown.join("\n")
        );
    }
}
