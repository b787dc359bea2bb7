//! The hit path's round trips, for an instruction counter: the same
//! workload as `cargo bench --bench hit_path`, run a given number of
//! times, so that a tool such as Valgrind's `cachegrind` counts the
//! instructions one round trip takes. Unlike a time, the count is the
//! same on a busy or a quiet machine, so it compares two checkouts where
//! the timings are noisy.
//!
//! ```text
//! cargo build --release --example instructions
//! valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
//!     target/release/examples/instructions fixed_time 64x1 200000
//! ```
//!
//! Run it at two counts and divide the difference of the totals by the
//! difference of the counts: the setup (filling the pool, the walk) then
//! cancels out. `benches/instructions.sh` does that for every row.
//!
//! Arguments: the cache (`map`, the hand-written map of vectors;
//! `fixed_time`, `exponential` or `fixed_capacity`, over `ManualClock`;
//! `rounded`, `fixed_time` with classes `SizeClass::PowerOfTwoDivisions(4)`;
//! `fixed_capacity_fifo`, `fixed_capacity` with `Reuse::Fifo`;
//! `shared` or `thread_caches`, a `FixedTime` pool behind
//! `SharedPool::new` or `SharedPool::with_thread_caches`, on one thread),
//! the scale (`CLASSESxPER`, such as `1x1`, `64x1`, `4096x4` or
//! `100000x2`; or `batch`: 16 blocks allocated from 8 classes of 16, then
//! released, as the benchmark's batches, not for the shared pools) and
//! the number of round trips (of batches for `batch`).

use std::hint::black_box;
use std::time::Duration;

use decaying_pool::{
    DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, Policy, Reuse, SharedPool,
    SizeClass,
};

#[path = "../benches/common/mod.rs"]
mod common;
#[path = "../benches/workload/mod.rs"]
mod workload;

use common::Null;
use workload::{HandWritten, fill, order, sizes};

/// Blocks a batch allocates before it releases them.
const BATCH: usize = 16;

/// What to run: parsed from the command line.
struct Run {
    cache: String,
    classes: usize,
    per: usize,
    batch: bool,
    count: usize,
}

/// Parses the arguments, or says how to call.
fn parse() -> Result<Run, String> {
    let usage = "usage: instructions \
                 <map|fixed_time|rounded|exponential|fixed_capacity|fixed_capacity_fifo|shared|thread_caches> \
                 <CLASSESxPER|batch> <count>";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cache, scale, count] = args.as_slice() else {
        return Err(usage.into());
    };
    let (classes, per, batch) = match scale.as_str() {
        "batch" => (8, 16, true),
        s => {
            let (c, p) = s.split_once('x').ok_or(usage)?;
            let c = c.parse().map_err(|_| usage)?;
            let p = p.parse().map_err(|_| usage)?;
            (c, p, false)
        }
    };
    let count = count.parse().map_err(|_| usage)?;
    Ok(Run {
        cache: cache.clone(),
        classes,
        per,
        batch,
        count,
    })
}

/// A cache the round trips go through.
trait Cache {
    /// A block of `size`.
    fn get(&mut self, size: usize) -> usize;
    /// Gives back `block`, of `size`.
    fn put(&mut self, block: usize, size: usize);
}

impl Cache for HandWritten {
    fn get(&mut self, size: usize) -> usize {
        self.allocate(size)
    }
    fn put(&mut self, block: usize, size: usize) {
        self.release(block, size)
    }
}

impl<P: Policy> Cache for DecayingPool<Null, P, ManualClock> {
    fn get(&mut self, size: usize) -> usize {
        self.allocate(size).unwrap()
    }
    fn put(&mut self, block: usize, size: usize) {
        // SAFETY: every block `trips` gives back came from `get` on this
        // pool, with the same size.
        unsafe { self.release(block, size) }
    }
}

/// `run.count` round trips (or batches) through `cache`.
fn trips(cache: &mut impl Cache, run: &Run, sizes: &[usize], walk: &[usize]) {
    let mut i = 0;
    let mut held = [(0usize, 0usize); BATCH];
    for _ in 0..run.count {
        if run.batch {
            for slot in held.iter_mut() {
                let s = sizes[walk[i]];
                i = (i + 1) % walk.len();
                *slot = (cache.get(black_box(s)), s);
            }
            for &(block, s) in &held {
                cache.put(black_box(block), s);
            }
        } else {
            let s = sizes[walk[i]];
            i = (i + 1) % walk.len();
            let block = cache.get(black_box(s));
            cache.put(black_box(block), s);
        }
    }
}

/// `run.count` round trips (or batches) through a pool with `policy`,
/// filled first; checks that they hit.
fn pool<P: Policy>(
    policy: P,
    class: SizeClass,
    reuse: Reuse,
    run: &Run,
    sizes: &[usize],
    walk: &[usize],
) {
    let mut pool = DecayingPool::builder(Null::default())
        .policy(policy)
        .size_class(class)
        .reuse(reuse)
        .clock(ManualClock::new())
        .build();
    fill(&mut pool, sizes, run.per);
    let filled = pool.stats().misses;
    trips(&mut pool, run, sizes, walk);
    let misses = pool.stats().misses - filled;
    assert!(misses <= filled / 100, "{misses} misses while measuring");
}

/// `run.count` round trips through a `SharedPool` over `FixedTime`
/// (`thread_caches`: with a cache per thread), filled first; checks that
/// they hit. Each round trip allocates and drops a `Pooled` block.
fn shared(thread_caches: bool, run: &Run, sizes: &[usize], walk: &[usize]) {
    let mut pool = DecayingPool::builder(Null::default())
        .policy(FixedTime::new(Duration::from_secs(3600)))
        .clock(ManualClock::new())
        .build();
    fill(&mut pool, sizes, run.per);
    let filled = pool.stats().misses;
    let shared = if thread_caches {
        SharedPool::with_thread_caches(pool)
    } else {
        SharedPool::new(pool)
    };
    let mut i = 0;
    for _ in 0..run.count {
        let s = sizes[walk[i]];
        i = (i + 1) % walk.len();
        drop(black_box(shared.allocate(black_box(s)).unwrap()));
    }
    let misses = shared.stats().misses - filled;
    assert!(misses <= filled / 100, "{misses} misses while measuring");
}

fn main() {
    let run = match parse() {
        Ok(run) => run,
        Err(usage) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let sizes = sizes(run.classes);
    let walk = order(sizes.len(), 1 << 16);
    let ttl = Duration::from_secs(3600);
    match run.cache.as_str() {
        "map" => trips(
            &mut HandWritten::filled(&sizes, run.per),
            &run,
            &sizes,
            &walk,
        ),
        "fixed_time" => pool(
            FixedTime::new(ttl),
            SizeClass::Exact,
            Reuse::Lifo,
            &run,
            &sizes,
            &walk,
        ),
        // Classes that round, as PyTorch's `roundup_power2_divisions`.
        "rounded" => pool(
            FixedTime::new(ttl),
            SizeClass::PowerOfTwoDivisions(4),
            Reuse::Lifo,
            &run,
            &sizes,
            &walk,
        ),
        "exponential" => pool(
            Exponential::new(ttl),
            SizeClass::Exact,
            Reuse::Lifo,
            &run,
            &sizes,
            &walk,
        ),
        // As sized in the benchmark: four slots per cached block, and a
        // window that holds a class's blocks (the batches' 16 a class are
        // more than the default window of 8).
        "fixed_capacity" | "fixed_capacity_fifo" => pool(
            FixedCapacity::new(sizes.len() * run.per * 4)
                .per_size(run.per.max(FixedCapacity::WINDOW)),
            SizeClass::Exact,
            if run.cache == "fixed_capacity" {
                Reuse::Lifo
            } else {
                Reuse::Fifo
            },
            &run,
            &sizes,
            &walk,
        ),
        "shared" | "thread_caches" if !run.batch => {
            shared(run.cache == "thread_caches", &run, &sizes, &walk)
        }
        other => {
            eprintln!(
                "unknown cache {other:?} (or a batch through a shared pool): map, \
                 fixed_time, rounded, exponential, fixed_capacity, fixed_capacity_fifo, shared or \
                 thread_caches"
            );
            std::process::exit(2);
        }
    }
}
