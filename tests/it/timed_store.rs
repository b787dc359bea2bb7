//! Tests: the timed store's own paths, which the model's small palette of
//! sizes does not reach: hundreds of classes emptied and swept, class
//! tokens that lag behind their class (FIFO hits, emptied classes), and
//! oldest-first order across classes when the tokens are brought up to
//! date. Every step is followed by `validate()` (every eighth under
//! Miri), which checks the store's invariants (one token per class with
//! blocks, never later than its oldest block; counts; release order within
//! each class).

use core::time::Duration;

use crate::support::freed_ids;
use decaying_pool::testing::CheckingAllocator;
use decaying_pool::{DecayingPool, FixedTime, ManualClock, Reuse};

type Pool = DecayingPool<CheckingAllocator, FixedTime, ManualClock>;

const TTL: Duration = Duration::from_secs(1);

fn pool(reuse: Reuse) -> (Pool, CheckingAllocator, ManualClock) {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let pool = DecayingPool::builder(alloc.clone())
        .policy(FixedTime::new(TTL))
        .clock(clock.clone())
        .reuse(reuse)
        .build();
    (pool, alloc, clock)
}

fn put(pool: &mut Pool, block: u64, size: usize) {
    // SAFETY: every caller passes a block this pool handed out for `size`
    // and does not use it again (a `u64` block cannot be misused).
    unsafe { pool.release(block, size) };
    step_validate(pool);
}

fn get(pool: &mut Pool, size: usize) -> u64 {
    let b = pool
        .allocate(size)
        .expect("the checking allocator never fails");
    step_validate(pool);
    b
}

/// `validate()` after a step: every step, or every eighth under Miri
/// (where a check of hundreds of classes costs seconds; Miri is there for
/// the store's pointers, which every step still exercises).
fn step_validate(pool: &Pool) {
    thread_local!(static STEP: core::cell::Cell<u32> = const { core::cell::Cell::new(0) });
    let step = STEP.with(|s| {
        s.set(s.get().wrapping_add(1));
        s.get()
    });
    if !cfg!(miri) || step % 8 == 0 {
        pool.validate();
    }
}

#[test]
fn hundreds_of_emptied_classes_are_swept_and_every_block_comes_back_once() {
    let (mut pool, alloc, clock) = pool(Reuse::Lifo);
    // Fewer under Miri (every step validates the whole store); still enough
    // for the new classes to sweep the empty ones (the first sweep comes
    // when a new class takes the count past `SWEEP_SLACK`, 64).
    let (n, m) = if cfg!(miri) { (24, 48) } else { (500, 600) };
    let sizes: Vec<usize> = (1..=n).map(|i| i * 48).collect();
    let blocks: Vec<u64> = sizes.iter().map(|&s| get(&mut pool, s)).collect();
    for (&b, &s) in blocks.iter().zip(&sizes) {
        put(&mut pool, b, s);
    }
    assert_eq!(pool.stats().blocks_cached, n as u64);
    pool.validate();
    // Take every class back: each empties and keeps its buffer.
    let again: Vec<u64> = sizes.iter().map(|&s| get(&mut pool, s)).collect();
    pool.validate();
    assert_eq!(again, blocks, "every request is a hit on its own class");
    assert_eq!(pool.stats().hits, n as u64);
    assert_eq!(pool.stats().blocks_cached, 0);
    // New sizes: the new classes sweep the empty ones on the way.
    let other: Vec<usize> = (1..=m).map(|i| i * 48 + 7).collect();
    let more: Vec<u64> = other.iter().map(|&s| get(&mut pool, s)).collect();
    pool.validate();
    for (&b, &s) in more.iter().zip(&other) {
        put(&mut pool, b, s);
    }
    pool.validate();
    // The swept classes come back as new ones; nothing is lost or doubled.
    for (&b, &s) in again.iter().zip(&sizes).rev() {
        put(&mut pool, b, s);
    }
    assert_eq!(pool.stats().blocks_cached, (n + m) as u64);
    clock.advance(TTL);
    assert_eq!(pool.collect(), n + m);
    pool.validate();
    assert_eq!(alloc.deallocs(), (n + m) as u64);
    assert_eq!(alloc.live(), 0);
    // Freed in release order: the new sizes, then the first ones reversed.
    let mut want = more.clone();
    want.extend(blocks.iter().rev());
    assert_eq!(freed_ids(&alloc), want);
}

#[test]
fn a_token_left_behind_by_fifo_hits_still_finds_the_oldest_block() {
    let (mut pool, alloc, clock) = pool(Reuse::Fifo);
    // Class 100 gets three blocks at t = 0, 10, 20 ms; class 200 one at 15 ms.
    let a: Vec<u64> = (0..3).map(|_| get(&mut pool, 100)).collect();
    let b = get(&mut pool, 200);
    put(&mut pool, a[0], 100);
    clock.advance(Duration::from_millis(10));
    put(&mut pool, a[1], 100);
    clock.advance(Duration::from_millis(5));
    put(&mut pool, b, 200);
    clock.advance(Duration::from_millis(5));
    put(&mut pool, a[2], 100);
    // A FIFO hit takes class 100's oldest (t = 0): its token now lags.
    assert_eq!(get(&mut pool, 100), a[0]);
    // The oldest cached block is a[1] (10 ms), then b (15 ms), then a[2].
    assert_eq!(pool.trim(), 400, "bytes freed");
    pool.validate();
    assert_eq!(freed_ids(&alloc), vec![a[1], b, a[2]]);
}

#[test]
fn expiry_is_exact_when_tokens_lag_behind_their_classes() {
    let (mut pool, alloc, clock) = pool(Reuse::Lifo);
    let x = get(&mut pool, 64);
    let y = get(&mut pool, 64);
    let z = get(&mut pool, 128);
    put(&mut pool, x, 64); // t = 0
    clock.advance(Duration::from_millis(400));
    put(&mut pool, z, 128); // t = 400 ms
    clock.advance(Duration::from_millis(100));
    // Empty class 64 (its token stays at t = 0) and refill it at 500 ms.
    assert_eq!(get(&mut pool, 64), x);
    put(&mut pool, y, 64); // t = 500 ms

    // At 1 s the stale token comes up; nothing is due until 1.4 s.
    clock.set(TTL);
    assert_eq!(pool.collect(), 0);
    pool.validate();
    clock.set(Duration::from_millis(1399));
    assert_eq!(pool.collect(), 0);
    clock.set(Duration::from_millis(1400));
    assert_eq!(pool.collect(), 1);
    assert_eq!(freed_ids(&alloc), vec![z]);
    clock.set(Duration::from_millis(1499));
    assert_eq!(pool.collect(), 0);
    clock.set(Duration::from_millis(1500));
    assert_eq!(pool.collect(), 1);
    pool.validate();
    assert_eq!(freed_ids(&alloc), vec![z, y]);
    // x is in use: the pool holds nothing, and gives x back on release.
    assert_eq!(pool.stats().blocks_cached, 0);
    put(&mut pool, x, 64);
    drop(pool);
    alloc.assert_all_freed();
}

#[test]
fn a_class_that_keeps_emptying_costs_one_buffer_not_one_per_round_trip() {
    let (mut pool, alloc, _clock) = pool(Reuse::Lifo);
    let b = get(&mut pool, 4096);
    for _ in 0..10_000 {
        // SAFETY: `b` came from this pool with this size.
        unsafe { pool.release(b, 4096) };
        assert_eq!(pool.allocate(4096).unwrap(), b);
    }
    pool.validate();
    assert_eq!(pool.stats().hits, 10_000);
    assert_eq!(alloc.allocs(), 1);
}

/// A backing allocator that hands out numbers and keeps no record, so a
/// million blocks cost the test nothing but the pool's own bookkeeping.
#[derive(Default)]
struct Numbers(u64);

impl decaying_pool::RawAllocator for Numbers {
    type Block = u64;
    type Error = core::convert::Infallible;

    fn allocate(&mut self, _size: usize) -> Result<u64, Self::Error> {
        self.0 += 1;
        Ok(self.0)
    }

    unsafe fn deallocate(&mut self, _block: u64, _size: usize) {}
}

/// Distinct sizes in the bookkeeping tests.
const DISTINCT: usize = 1_000_000;

/// Bookkeeping left once the cache is empty: the table and heap keep room
/// for 64 to 256 classes (they shrink once a quarter full), at most 23 KB.
const NEAR_ZERO: usize = 32 << 10;

fn numbers_pool() -> (DecayingPool<Numbers, FixedTime, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let pool = DecayingPool::builder(Numbers::default())
        .policy(FixedTime::new(TTL))
        .clock(clock.clone())
        .build();
    (pool, clock)
}

/// Allocates one block of each size in `sizes`, then releases them all.
fn fill(
    pool: &mut DecayingPool<Numbers, FixedTime, ManualClock>,
    sizes: impl Iterator<Item = usize>,
) {
    let held: Vec<(u64, usize)> = sizes.map(|s| (pool.allocate(s).unwrap(), s)).collect();
    for (b, s) in held {
        // SAFETY: each block came from this pool with this size, once.
        unsafe { pool.release(b, s) };
    }
}

#[test]
#[cfg_attr(miri, ignore)] // a million classes; the ring's shrinking is checked below
fn bookkeeping_shrinks_after_a_million_distinct_sizes_decay_or_are_trimmed() {
    let (mut pool, clock) = numbers_pool();
    assert_eq!(pool.bookkeeping_bytes(), 0);
    fill(&mut pool, 1..=DISTINCT);
    let peak = pool.bookkeeping_bytes();
    // A 64-byte bucket per class at least.
    assert!(peak >= DISTINCT * 64, "{peak} bytes for {DISTINCT} classes");
    clock.advance(TTL);
    assert_eq!(pool.collect(), DISTINCT);
    pool.validate();
    let decayed = pool.bookkeeping_bytes();
    assert!(
        decayed <= NEAR_ZERO,
        "{decayed} bytes of bookkeeping left after every class decayed (peak {peak})"
    );
    // The same through `trim` (a quarter as many sizes: debug builds are
    // slow).
    fill(&mut pool, 1..=DISTINCT / 4);
    assert!(pool.bookkeeping_bytes() >= DISTINCT / 4 * 64);
    pool.trim();
    pool.validate();
    let trimmed = pool.bookkeeping_bytes();
    assert!(
        trimmed <= NEAR_ZERO,
        "{trimmed} bytes of bookkeeping left after a trim (peak {peak})"
    );
}

#[test]
#[cfg_attr(miri, ignore)] // a quarter of a million classes
fn bookkeeping_follows_a_partial_decay_down() {
    let sizes = DISTINCT / 4;
    let (mut pool, clock) = numbers_pool();
    // Seven eighths of the classes released at 0, the rest half a TTL
    // later: the first decay leaves an eighth.
    fill(&mut pool, 1..=sizes / 8 * 7);
    let early = pool.bookkeeping_bytes();
    clock.advance(TTL / 2);
    fill(&mut pool, sizes / 8 * 7 + 1..=sizes);
    let peak = pool.bookkeeping_bytes();
    assert!(peak >= early);
    clock.advance(TTL / 2);
    assert_eq!(pool.collect(), sizes / 8 * 7);
    pool.validate();
    let left = pool.bookkeeping_bytes();
    assert!(
        left <= peak / 3,
        "{left} bytes of bookkeeping for an eighth of the classes (peak {peak})"
    );
    // The cache still serves what it holds.
    let b = pool.allocate(sizes).unwrap();
    assert_eq!(pool.stats().hits, 1);
    // SAFETY: `b` came from this pool with this size.
    unsafe { pool.release(b, sizes) };
    pool.validate();
}

#[test]
fn a_class_queue_shrinks_as_its_blocks_decay() {
    let (mut pool, clock) = numbers_pool();
    let n = if cfg!(miri) { 200 } else { DISTINCT / 10 };
    // One size, n blocks, released a tick apart.
    let held: Vec<u64> = (0..n).map(|_| pool.allocate(100).unwrap()).collect();
    let step = TTL / (2 * n as u32);
    for b in held {
        // SAFETY: each block came from this pool with size 100, once.
        unsafe { pool.release(b, 100) };
        clock.advance(step);
    }
    let peak = pool.bookkeeping_bytes();
    assert!(peak >= n * 16, "{peak} bytes for {n} queued blocks");
    // Past the TTL of all but the last few.
    clock.advance(TTL - step * 8);
    let freed = pool.collect();
    assert!(freed >= n - 10 && freed < n, "{freed} of {n} freed");
    pool.validate();
    let left = pool.bookkeeping_bytes();
    assert!(
        left <= NEAR_ZERO,
        "{left} bytes of bookkeeping for {} blocks (peak {peak})",
        n - freed
    );
}

/// A class of up to nine blocks costs its bucket and one ring slot for
/// each block but its newest, no more: its ring grows a slot at a time
/// that far (then by half). The bookkeeping per cached block at many
/// classes of few blocks rests on it (`examples/metadata.rs`).
#[test]
fn a_small_class_rings_its_older_blocks_in_as_many_slots() {
    // A block's ring slot: the block, its release time and number.
    const SLOT: usize = 24;
    let with = |blocks: usize| {
        let (mut pool, _clock) = numbers_pool();
        fill(&mut pool, core::iter::repeat_n(4096, blocks));
        assert_eq!(pool.stats().blocks_cached, blocks as u64);
        pool.validate();
        pool.bookkeeping_bytes()
    };
    let one = with(1);
    for blocks in 2..=10 {
        assert_eq!(
            with(blocks) - one,
            (blocks - 1) * SLOT,
            "{blocks} blocks of a class"
        );
    }
    // Past nine older blocks the ring grows by half: 13 slots for 10.
    assert_eq!(with(11) - one, 13 * SLOT);
}
