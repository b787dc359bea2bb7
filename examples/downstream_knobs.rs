//! A downstream crate's tensor cache, through the public API only: the
//! run-time knobs and figures — a policy picked from a config string
//! (`AnyPolicy`), statistics by size class, an observer, a limit changed at
//! run time, `reset_peaks`, the `Stats` summary and (with `--features
//! serde`) a JSON snapshot.
//!
//! ```text
//! cargo run --example downstream_knobs -- exponential
//! cargo run --example downstream_knobs --features serde -- fixed_capacity
//! ```

use core::time::Duration;
use std::sync::{Arc, Mutex};

use decaying_pool::{
    AnyPolicy, DecayingPool, Event, Exponential, FixedCapacity, FixedTime, HumanBytes, ManualClock,
    PoolError, Reason, SharedPool, SizeClass, SystemAllocator,
};

const KIB: usize = 1 << 10;

/// What a config file or a command-line flag names.
fn policy_from_config(name: &str) -> AnyPolicy {
    match name {
        "fixed_capacity" => AnyPolicy::from(FixedCapacity::new(64)),
        "exponential" => AnyPolicy::timed(Exponential::half_life(Duration::from_millis(500))),
        _ => AnyPolicy::timed(FixedTime::new(Duration::from_secs(1))),
    }
}

/// A tensor's buffer: `numel` f32 elements.
fn tensor_bytes(numel: usize) -> usize {
    numel * 4
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fixed_time".into());
    let clock = ManualClock::new();
    let freed = Arc::new(Mutex::new(Vec::<(usize, Reason)>::new()));
    let failures = Arc::new(Mutex::new(0u32));
    let (log, fails) = (freed.clone(), failures.clone());
    let pool = SharedPool::new(
        DecayingPool::builder(SystemAllocator::new())
            .policy(policy_from_config(&name))
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

    // Warm-up: a few "layers", each with weights, activations and a scratch
    // buffer whose size does not round well.
    for step in 0..20 {
        let weights = pool.allocate(tensor_bytes(256 * 256))?;
        let activations = pool.allocate(tensor_bytes(64 * 1000))?;
        let scratch = pool.allocate(tensor_bytes(3000 + step % 3 * 100))?;
        drop((weights, activations, scratch));
        clock.advance(Duration::from_millis(50));
    }
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
