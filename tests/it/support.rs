//! Helpers shared by the test modules.

use core::fmt::Display;
use core::time::Duration;
use std::path::{Path, PathBuf};

use decaying_pool::testing::{Call, CheckingAllocator};
use decaying_pool::{
    Clock, DecayingPool, FixedTime, ManualClock, Policy, RawAllocator, Reuse, SharedPool, SizeClass,
};

/// `n` milliseconds.
pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The pool most tests check: fixed-time decay over a checking allocator,
/// on a manual clock.
pub(crate) type Pool = DecayingPool<CheckingAllocator, FixedTime, ManualClock>;

/// A [`Pool`] with this reuse order, size class and time-to-live, its
/// allocator and its clock (at zero).
pub(crate) fn pool_with(
    reuse: Reuse,
    size_class: SizeClass,
    ttl: Duration,
) -> (Pool, CheckingAllocator, ManualClock) {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(ttl))
        .clock(clock.clone())
        .size_class(size_class)
        .reuse(reuse)
        .build();
    (pool, alloc, clock)
}

/// Allocates `size` bytes from `pool`; panics (naming the size and the
/// error) when it fails.
pub(crate) fn get<A, P, C>(pool: &mut DecayingPool<A, P, C>, size: usize) -> A::Block
where
    A: RawAllocator,
    A::Error: Display,
    P: Policy,
    C: Clock,
{
    pool.allocate(size)
        .unwrap_or_else(|e| panic!("allocate({size}) failed: {e}"))
}

/// The backing call `Allocate { block, size }`.
pub(crate) fn a(block: u64, size: usize) -> Call {
    Call::Allocate { block, size }
}

/// The backing call `Deallocate { block, size }`.
pub(crate) fn d(block: u64, size: usize) -> Call {
    Call::Deallocate { block, size }
}

/// Runs `f`, catching its panic.
pub(crate) fn quiet<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

/// Compiles only when `T` is `Send`.
pub(crate) fn assert_send<T: Send>() {}

/// Releases `block` of `size` into `pool`.
pub(crate) fn put<A, P, C>(pool: &mut DecayingPool<A, P, C>, block: A::Block, size: usize)
where
    A: RawAllocator,
    P: Policy,
    C: Clock,
{
    // SAFETY: every caller passes a block this pool's `allocate(size)`
    // handed out, once, and does not use it afterwards.
    unsafe { pool.release(block, size) }
}

/// A small deterministic generator (64-bit LCG, high bits).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A small deterministic generator (xorshift64*).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One thread's random churn on a shared pool: `rounds` times, allocates
/// `1 + k * 512` bytes (`k` below `kinds`) while it holds fewer than
/// `most` blocks (on a coin toss), else drops a held block at random; one
/// round in sixteen advances `clock` by a millisecond. Drops what it still
/// holds at the end.
pub(crate) fn churn<A, P>(
    pool: &SharedPool<A, P, ManualClock>,
    clock: &ManualClock,
    seed: u64,
    rounds: u64,
    most: usize,
    kinds: u64,
) where
    A: RawAllocator,
    A::Error: core::fmt::Debug,
    P: Policy,
{
    let mut rng = Rng(seed);
    let mut held = Vec::new();
    for _ in 0..rounds {
        if held.len() < most && rng.below(2) == 0 {
            held.push(pool.allocate(1 + rng.below(kinds) as usize * 512).unwrap());
        } else if !held.is_empty() {
            let k = rng.below(held.len() as u64) as usize;
            held.swap_remove(k);
        }
        if rng.below(16) == 0 {
            clock.advance(Duration::from_millis(1));
        }
    }
}

/// The blocks the backing allocator was given back, in order.
pub(crate) fn freed_ids(alloc: &CheckingAllocator) -> Vec<u64> {
    alloc
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Deallocate { block, .. } => Some(block),
            Call::Allocate { .. } => None,
        })
        .collect()
}

/// `len` pseudo-random bytes from `state`: the high byte of each [`Lcg`]
/// state, for fuzz seeds that are plain noise.
pub(crate) fn noise(state: u64, len: usize) -> Vec<u8> {
    let mut lcg = Lcg(state);
    // `next` gives the state's top 31 bits; its top byte is the state's.
    (0..len).map(|_| (lcg.next() >> 23) as u8).collect()
}

/// A fuzz target's committed corpus: `fuzz/corpus/<target>`.
pub(crate) fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

/// Runs every file of a target's corpus, in name order, through `run`;
/// returns the summaries of the inputs that parse. A panic names the file
/// and goes on.
pub(crate) fn replay_corpus<S>(target: &str, run: fn(&[u8]) -> Option<S>) -> Vec<S> {
    let dir = corpus_dir(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .iter()
        .filter_map(|path| {
            let data = std::fs::read(path).expect("a corpus file");
            let out = std::panic::catch_unwind(|| run(&data));
            match out {
                Ok(summary) => summary,
                Err(panic) => {
                    eprintln!("corpus file {} failed", path.display());
                    std::panic::resume_unwind(panic)
                }
            }
        })
        .collect()
}

/// Checks that a target's committed corpus holds every seed, byte for
/// byte; `source` is the test file that builds the seeds (where to look to
/// regenerate them).
pub(crate) fn assert_corpus_holds(target: &str, seeds: &[(String, Vec<u8>)], source: &str) {
    for (name, bytes) in seeds {
        let path = corpus_dir(target).join(name);
        let on_disk = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (regenerate: see {source})", path.display()));
        assert!(
            on_disk == *bytes,
            "{} differs from its seed (regenerate: see {source})",
            path.display()
        );
    }
}

/// Writes each target's seeds into its corpus directory, when
/// `DECAYING_POOL_WRITE_CORPUS` is set (else says how to ask for it).
pub(crate) fn write_corpus<'a>(
    targets: impl IntoIterator<Item = (&'a str, Vec<(String, Vec<u8>)>)>,
) {
    if std::env::var_os("DECAYING_POOL_WRITE_CORPUS").is_none() {
        eprintln!("set DECAYING_POOL_WRITE_CORPUS=1 to write the seed corpus");
        return;
    }
    for (target, seeds) in targets {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("the corpus directory");
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).expect("a seed file");
        }
    }
}

/// Runs the test `name` again in a process of its own (that test alone,
/// on one thread), with the environment variable `var` set, and asserts
/// that it passed. Returns `true` in that child process, where the caller
/// goes on with the test's body, `false` in the parent once the child
/// passed: for a test that may abort, or that forks.
pub(crate) fn in_child_test(var: &str, name: &str) -> bool {
    if std::env::var_os(var).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            name,
            "--include-ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(var, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child test {name}: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test: {stdout}"
    );
    false
}
