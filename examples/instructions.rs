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
//! `fixed_time_fifo` and `fixed_capacity_fifo`, `fixed_time` and
//! `fixed_capacity` with `Reuse::Fifo`;
//! `exponential_moved`, `exponential` with the clock moved on a
//! millisecond once the pool is filled, as between two ticks of
//! `MonotonicClock`; `fixed_time_monotonic` and `exponential_monotonic`,
//! over `MonotonicClock`, the default clock, whose time moves on every
//! millisecond while they run;
//! `shared` or `thread_caches`, a `FixedTime` pool behind
//! `SharedPool::new` or `SharedPool::with_thread_caches`, on one thread),
//! the scale (`CLASSESxPER`, such as `1x1`, `64x1`, `4096x4` or
//! `100000x2`; or `batch`: 16 blocks allocated from 8 classes of 16, then
//! released, as the benchmark's batches, not for the shared pools) and
//! the number of round trips (of batches for `batch`).
//!
//! With `--time` first, it times round trips instead, of every cache named
//! after the count, at one scale:
//!
//! ```text
//! target/release/examples/instructions --time 64x1 20000 map fixed_time exponential
//! ```
//!
//! It fills each cache, then runs `count` round trips through each in
//! turn, [`SAMPLES`] times over, and prints for each cache the fastest of
//! its runs in nanoseconds per round trip (per block for `batch`). The
//! fastest of many short runs is what the code costs when nothing else
//! (another process, an interrupt, the host of a virtual machine) takes
//! the processor meanwhile, and taking the caches' runs in turn puts the
//! same quiet moments within reach of each: their ratios hold from one
//! run to the next on a machine whose criterion medians move by more than
//! the gaps they should show. `bash benches/instructions.sh --time`
//! prints the tables of them.

use std::hint::black_box;
use std::time::{Duration, Instant};

use decaying_pool::{
    Clock, DecayingPool, Exponential, FixedCapacity, FixedTime, ManualClock, MonotonicClock,
    Policy, Reuse, SharedPool, SizeClass,
};

#[path = "../benches/common/mod.rs"]
mod common;
#[path = "../benches/workload/mod.rs"]
mod workload;

use common::Null;
use workload::{HandWritten, fill, order, sizes};

/// Blocks a batch allocates before it releases them.
const BATCH: usize = 16;

/// Timed runs of each cache with `--time`, of which the fastest counts.
const SAMPLES: usize = 300;

/// The caches a run can name.
const CACHES: &str = "map, fixed_time, fixed_time_fifo, fixed_time_monotonic, rounded, \
                      exponential, exponential_moved, exponential_monotonic, fixed_capacity, \
                      fixed_capacity_fifo, shared or thread_caches";

/// The scale of a run: parsed from the command line.
struct Scale {
    classes: usize,
    per: usize,
    batch: bool,
    count: usize,
}

/// What to run: parsed from the command line.
struct Run {
    caches: Vec<String>,
    scale: Scale,
    /// `--time`: time the round trips rather than run them once.
    time: bool,
}

/// Parses the arguments, or says how to call.
fn parse() -> Result<Run, String> {
    let usage = format!(
        "usage: instructions <cache> <CLASSESxPER|batch> <count>\n   \
         or: instructions --time <CLASSESxPER|batch> <count> <cache>...\n\
         (a cache: {CACHES})"
    );
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (time, caches, scale, count) = match args.as_slice() {
        [flag, scale, count, caches @ ..] if flag == "--time" && !caches.is_empty() => {
            (true, caches.to_vec(), scale, count)
        }
        [cache, scale, count] => (false, vec![cache.clone()], scale, count),
        _ => return Err(usage),
    };
    let (classes, per, batch) = match scale.as_str() {
        "batch" => (8, 16, true),
        s => {
            let (c, p) = s.split_once('x').ok_or(&usage)?;
            let c = c.parse().map_err(|_| &usage)?;
            let p = p.parse().map_err(|_| &usage)?;
            (c, p, false)
        }
    };
    let count = count.parse().map_err(|_| &usage)?;
    Ok(Run {
        caches,
        scale: Scale {
            classes,
            per,
            batch,
            count,
        },
        time,
    })
}

/// A cache the round trips go through. Its methods are inlined into the
/// loop of [`trips`], as `DecayingPool::allocate` and `release` are into
/// a program's loop (and the closure of `cargo bench --bench hit_path`):
/// a call to a pool's method of its own would save and restore the
/// registers its body uses at every call, which neither pays.
trait Cache {
    /// A block of `size`.
    fn get(&mut self, size: usize) -> usize;
    /// Gives back `block`, of `size`.
    fn put(&mut self, block: usize, size: usize);
}

impl Cache for HandWritten {
    #[inline(always)]
    fn get(&mut self, size: usize) -> usize {
        self.allocate(size)
    }
    #[inline(always)]
    fn put(&mut self, block: usize, size: usize) {
        self.release(block, size)
    }
}

impl<P: Policy, C: Clock> Cache for DecayingPool<Null, P, C> {
    #[inline(always)]
    fn get(&mut self, size: usize) -> usize {
        self.allocate(size).unwrap()
    }
    #[inline(always)]
    fn put(&mut self, block: usize, size: usize) {
        // SAFETY: every block `trips` gives back came from `get` on this
        // pool, with the same size.
        unsafe { self.release(block, size) }
    }
}

/// `scale.count` round trips (or batches) through `cache`, taking sizes
/// from `walk` at `at` on (and leaving `at` where they stopped).
fn trips(cache: &mut impl Cache, scale: &Scale, sizes: &[usize], walk: &[usize], at: &mut usize) {
    let mut i = *at;
    let mut held = [(0usize, 0usize); BATCH];
    for _ in 0..scale.count {
        if scale.batch {
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
    *at = i;
}

/// One cache, filled, ready to run: each call runs `count` round trips
/// (or batches) and answers the time they took.
type Runner<'a> = Box<dyn FnMut() -> Duration + 'a>;

/// The hand-written map of vectors, filled.
fn map<'a>(scale: &'a Scale, sizes: &'a [usize], walk: &'a [usize]) -> Runner<'a> {
    let mut hand = HandWritten::filled(sizes, scale.per);
    let mut i = 0;
    Box::new(move || {
        let start = Instant::now();
        trips(&mut hand, scale, sizes, walk, &mut i);
        start.elapsed()
    })
}

/// A pool with `policy`, filled; each run checks that its round trips hit.
/// The clock moves on by `moved` once the pool is filled (and then stops
/// again): with a `moved` above zero a policy's state is that of a clock
/// that moved since the blocks were cached, as a real clock's between two
/// of its ticks.
fn pool<'a, P: Policy + 'a>(
    policy: P,
    class: SizeClass,
    reuse: Reuse,
    moved: Duration,
    scale: &'a Scale,
    sizes: &'a [usize],
    walk: &'a [usize],
) -> Runner<'a> {
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(Null::default())
        .policy(policy)
        .size_class(class)
        .reuse(reuse)
        .clock(clock.clone())
        .build();
    fill(&mut pool, sizes, scale.per);
    clock.advance(moved);
    measured(pool, scale, sizes, walk)
}

/// A pool with `policy` over the default clock, `MonotonicClock` (whose
/// time moves on every millisecond while the round trips run), filled;
/// each run checks that its round trips hit.
fn pool_monotonic<'a, P: Policy + 'a>(
    policy: P,
    scale: &'a Scale,
    sizes: &'a [usize],
    walk: &'a [usize],
) -> Runner<'a> {
    let mut pool = DecayingPool::builder(Null::default())
        .policy(policy)
        .clock(MonotonicClock)
        .build();
    fill(&mut pool, sizes, scale.per);
    measured(pool, scale, sizes, walk)
}

/// The runner of `pool`, already filled: each run checks that its round
/// trips hit.
fn measured<'a, P: Policy + 'a, C: Clock + 'a>(
    mut pool: DecayingPool<Null, P, C>,
    scale: &'a Scale,
    sizes: &'a [usize],
    walk: &'a [usize],
) -> Runner<'a> {
    let filled = pool.stats().misses;
    let mut i = 0;
    Box::new(move || {
        let start = Instant::now();
        trips(&mut pool, scale, sizes, walk, &mut i);
        let took = start.elapsed();
        let misses = pool.stats().misses - filled;
        assert!(misses <= filled / 100, "{misses} misses while measuring");
        took
    })
}

/// A `SharedPool` over `FixedTime` (`thread_caches`: with a cache per
/// thread), filled; each round trip allocates and drops a `Pooled` block,
/// and each run checks that they hit.
fn shared<'a>(
    thread_caches: bool,
    scale: &'a Scale,
    sizes: &'a [usize],
    walk: &'a [usize],
) -> Runner<'a> {
    let mut pool = DecayingPool::builder(Null::default())
        .policy(FixedTime::new(Duration::from_secs(3600)))
        .clock(ManualClock::new())
        .build();
    fill(&mut pool, sizes, scale.per);
    let filled = pool.stats().misses;
    let shared = if thread_caches {
        SharedPool::with_thread_caches(pool)
    } else {
        SharedPool::new(pool)
    };
    let mut i = 0;
    Box::new(move || {
        let start = Instant::now();
        for _ in 0..scale.count {
            let s = sizes[walk[i]];
            i = (i + 1) % walk.len();
            drop(black_box(shared.allocate(black_box(s)).unwrap()));
        }
        let took = start.elapsed();
        let misses = shared.stats().misses - filled;
        assert!(misses <= filled / 100, "{misses} misses while measuring");
        took
    })
}

/// The cache named `name`, filled for `scale`, or `None` for a name it
/// does not know (or a batch through a shared pool).
fn runner<'a>(
    name: &str,
    scale: &'a Scale,
    sizes: &'a [usize],
    walk: &'a [usize],
) -> Option<Runner<'a>> {
    let ttl = Duration::from_secs(3600);
    let (exact, lifo, still) = (SizeClass::Exact, Reuse::Lifo, Duration::ZERO);
    Some(match name {
        "map" => map(scale, sizes, walk),
        "fixed_time" => pool(FixedTime::new(ttl), exact, lifo, still, scale, sizes, walk),
        "fixed_time_fifo" => pool(
            FixedTime::new(ttl),
            exact,
            Reuse::Fifo,
            still,
            scale,
            sizes,
            walk,
        ),
        // Classes that round, as PyTorch's `roundup_power2_divisions`.
        "rounded" => pool(
            FixedTime::new(ttl),
            SizeClass::PowerOfTwoDivisions(4),
            lifo,
            still,
            scale,
            sizes,
            walk,
        ),
        "fixed_time_monotonic" => pool_monotonic(FixedTime::new(ttl), scale, sizes, walk),
        "exponential_monotonic" => pool_monotonic(Exponential::new(ttl), scale, sizes, walk),
        "exponential" => pool(
            Exponential::new(ttl),
            exact,
            lifo,
            still,
            scale,
            sizes,
            walk,
        ),
        // The clock moved a millisecond (`MonotonicClock`'s tick) after
        // the pool was filled: the allowance has decayed below the bytes
        // cached, so each release computes its share.
        "exponential_moved" => pool(
            Exponential::new(ttl),
            exact,
            lifo,
            Duration::from_millis(1),
            scale,
            sizes,
            walk,
        ),
        // As sized in the benchmark: four slots per cached block, and a
        // window that holds a class's blocks (the batches' 16 a class are
        // more than the default window of 8).
        "fixed_capacity" | "fixed_capacity_fifo" => pool(
            FixedCapacity::new(sizes.len() * scale.per * 4)
                .per_size(scale.per.max(FixedCapacity::WINDOW)),
            exact,
            if name == "fixed_capacity" {
                lifo
            } else {
                Reuse::Fifo
            },
            still,
            scale,
            sizes,
            walk,
        ),
        "shared" | "thread_caches" if !scale.batch => {
            shared(name == "thread_caches", scale, sizes, walk)
        }
        _ => return None,
    })
}

fn main() {
    let run = match parse() {
        Ok(run) => run,
        Err(usage) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let scale = &run.scale;
    let sizes = sizes(scale.classes);
    let walk = order(sizes.len(), 1 << 16);
    let mut runners = Vec::new();
    for name in &run.caches {
        match runner(name, scale, &sizes, &walk) {
            Some(r) => runners.push(r),
            None => {
                eprintln!("unknown cache {name:?} (or a batch through a shared pool): {CACHES}");
                std::process::exit(2);
            }
        }
    }
    if !run.time {
        runners[0]();
        return;
    }
    // The caches' runs in turn, so that each meets the machine's quiet
    // moments as often as the others.
    let mut best = vec![Duration::MAX; runners.len()];
    for _ in 0..SAMPLES {
        for (r, best) in runners.iter_mut().zip(&mut best) {
            *best = (*best).min(r());
        }
    }
    let per_run = (scale.count * if scale.batch { BATCH } else { 1 }) as f64;
    for (name, best) in run.caches.iter().zip(best) {
        println!("{name} {:.2}", best.as_secs_f64() * 1e9 / per_run);
    }
}
