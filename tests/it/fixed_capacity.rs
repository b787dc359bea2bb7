//! Tests: fixed_capacity.
//!
//! `FixedCapacity(slots)` through the public API: a table of `slots`
//! entries that never grows, needs no clock, and evicts the oldest entry of
//! a full probe window (of `min(slots, FixedCapacity::WINDOW)` slots) on a
//! release. With `slots <= WINDOW` the window is the whole table, so the
//! store behaves exactly like "evict the globally oldest when full", which
//! the tests below model exactly; larger tables are checked for their
//! invariants.

use crate::support::Lcg;
use crate::support::freed_ids;
use crate::support::put;
use core::time::Duration;
use std::collections::{HashMap, VecDeque};

use decaying_pool::testing::{Call, CheckingAllocator, FailingAllocator, TestError};
use decaying_pool::{Clock, DecayingPool, FixedCapacity, ManualClock, PoolError, Reuse, SizeClass};

type FixedPool = DecayingPool<CheckingAllocator, FixedCapacity>;

fn fixed_pool(slots: usize, reuse: Reuse) -> (FixedPool, CheckingAllocator) {
    let alloc = CheckingAllocator::new();
    let pool = DecayingPool::builder(alloc.clone())
        .policy(FixedCapacity::new(slots))
        .reuse(reuse)
        .build();
    (pool, alloc)
}

/// The last block given back, with its size.
fn last_dealloc(alloc: &CheckingAllocator) -> Option<(u64, usize)> {
    alloc.calls().into_iter().rev().find_map(|c| match c {
        Call::Deallocate { block, size } => Some((block, size)),
        Call::Allocate { .. } => None,
    })
}

/// A clock that must never be read.
struct PanicClock;

impl Clock for PanicClock {
    fn now(&self) -> Duration {
        panic!("a FixedCapacity pool read its clock")
    }
}

// ---------------------------------------------------------------------------
// Random sequences: capacity, evictions, exactly-once frees
// ---------------------------------------------------------------------------

/// Random allocate / release sequences over many classes and table sizes.
/// Tracks which blocks must be cached and checks after every operation:
/// never more than `slots` cached; a hit hands out a cached block of the
/// class; a release either caches its block or displaces exactly one cached
/// block, which is deallocated (once: the CheckingAllocator panics on a
/// double free) and counted in `evictions`; under LIFO the block just
/// released is what the next allocate of its class returns. Ends with trim
/// and drop, after which every block was freed.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn random_sequences_respect_capacity_and_free_exactly_once() {
    let slot_counts = [1usize, 2, 3, 5, 7, 8, 9, 15, 16, 33, 64, 100, 257];
    for (k, &slots) in slot_counts.iter().enumerate() {
        for reuse in [Reuse::Lifo, Reuse::Fifo] {
            let mut rng = Lcg(0x5EED + k as u64 * 31 + reuse as u64);
            let (mut pool, alloc) = fixed_pool(slots, reuse);
            let n_classes = 1 + rng.below(3 * slots as u64 + 4);
            let mut cached: HashMap<u64, usize> = HashMap::new();
            let mut held: Vec<(u64, usize)> = Vec::new();
            let mut evictions = 0u64;
            for _ in 0..3000 {
                let before = pool.stats();
                if held.is_empty() || rng.below(2) == 0 {
                    let size = 64 * (1 + rng.below(n_classes) as usize);
                    let b = pool.allocate(size).unwrap();
                    let after = pool.stats();
                    if after.hits == before.hits + 1 {
                        assert_eq!(
                            cached.remove(&b),
                            Some(size),
                            "a hit hands out a cached block of the class"
                        );
                        assert_eq!(after.misses, before.misses);
                    } else {
                        assert_eq!(after.misses, before.misses + 1);
                        assert!(
                            !cached.values().any(|&c| c == size),
                            "a miss although a block of the class was cached"
                        );
                        assert_eq!(alloc.size_of(b), Some(size));
                    }
                    held.push((b, size));
                } else {
                    let (b, size) = held.swap_remove(rng.below(held.len() as u64) as usize);
                    let deallocs = alloc.deallocs();
                    put(&mut pool, b, size);
                    let after = pool.stats();
                    if alloc.deallocs() == deallocs + 1 {
                        let (gone, gone_size) = last_dealloc(&alloc).unwrap();
                        assert_eq!(
                            cached.remove(&gone),
                            Some(gone_size),
                            "an eviction frees a cached block"
                        );
                        assert_ne!(gone, b, "the released block itself is cached");
                        evictions += 1;
                        assert_eq!(after.blocks_cached, before.blocks_cached);
                    } else {
                        assert_eq!(alloc.deallocs(), deallocs);
                        assert_eq!(after.blocks_cached, before.blocks_cached + 1);
                    }
                    cached.insert(b, size);
                    // Under LIFO the next allocate of its class finds it.
                    if reuse == Reuse::Lifo && rng.below(3) == 0 {
                        assert_eq!(pool.allocate(size).unwrap(), b, "slots {slots}");
                        cached.remove(&b);
                        held.push((b, size));
                    }
                }
                let s = pool.stats();
                assert!(
                    s.blocks_cached as usize <= slots,
                    "{} cached in {slots} slots",
                    s.blocks_cached
                );
                assert_eq!(s.blocks_cached as usize, cached.len());
                assert_eq!(s.bytes_cached, cached.values().sum::<usize>());
                assert_eq!(s.evictions, evictions);
                assert_eq!(s.backing_deallocs, evictions);
                assert_eq!(s.trimmed, 0);
                pool.validate();
            }
            assert!(
                evictions > 0,
                "slots {slots}: the sequence never filled a window"
            );
            assert!(
                pool.stats().hits > 0,
                "slots {slots}: the sequence never hit"
            );
            for (b, size) in held.drain(..) {
                put(&mut pool, b, size);
            }
            let cached_bytes = pool.stats().bytes_cached;
            assert_eq!(pool.trim(), cached_bytes);
            assert_eq!(pool.stats().bytes_reserved, 0);
            drop(pool);
            alloc.assert_all_freed();
            assert_eq!(alloc.allocs(), alloc.deallocs());
        }
    }
}

/// What a table whose window is the whole table does: a hit takes the
/// newest (`Lifo`) or oldest (`Fifo`) cached block of its class, a release
/// into a full table evicts the globally oldest block.
struct OldestFirst {
    slots: usize,
    reuse: Reuse,
    /// The cached blocks (id, class), oldest first.
    cached: VecDeque<(u64, usize)>,
    /// The blocks evicted, in order.
    freed: Vec<u64>,
}

impl OldestFirst {
    fn new(slots: usize, reuse: Reuse) -> Self {
        OldestFirst {
            slots,
            reuse,
            cached: VecDeque::new(),
            freed: Vec::new(),
        }
    }

    /// The block a request of `size` must hit, taken out of the cache
    /// (`None`: a miss).
    fn hit(&mut self, size: usize) -> Option<u64> {
        match self.reuse {
            Reuse::Lifo => self.cached.iter().rposition(|e| e.1 == size),
            Reuse::Fifo => self.cached.iter().position(|e| e.1 == size),
        }
        .map(|i| self.cached.remove(i).unwrap().0)
    }

    /// A release of `b`: into a full table, the oldest block goes first.
    fn release(&mut self, b: u64, size: usize) {
        if self.cached.len() == self.slots {
            self.freed.push(self.cached.pop_front().unwrap().0);
        }
        self.cached.push_back((b, size));
    }

    /// 2000 random steps on `pool` (over `alloc`), checked against the
    /// model after each: an allocation of `100 * (1 + k)` bytes (`k` below
    /// `kinds`), or the release of a held block. Checks the block each hit
    /// hands out, the blocks evicted and the count cached, and validates
    /// the pool. Returns the blocks still held.
    fn walk(
        &mut self,
        pool: &mut FixedPool,
        alloc: &CheckingAllocator,
        seed: u64,
        kinds: u64,
    ) -> Vec<(u64, usize)> {
        let (slots, reuse) = (self.slots, self.reuse);
        let mut rng = Lcg(seed);
        let mut held: Vec<(u64, usize)> = Vec::new();
        for _ in 0..2000 {
            if held.is_empty() || rng.below(2) == 0 {
                let size = 100 * (1 + rng.below(kinds) as usize);
                let want = self.hit(size);
                let got = pool.allocate(size).unwrap();
                if let Some(id) = want {
                    assert_eq!(got, id, "slots {slots}, {reuse:?}");
                }
                held.push((got, size));
            } else {
                let (b, size) = held.swap_remove(rng.below(held.len() as u64) as usize);
                self.release(b, size);
                put(pool, b, size);
            }
            assert_eq!(freed_ids(alloc), self.freed, "slots {slots}, {reuse:?}");
            assert_eq!(pool.stats().blocks_cached as usize, self.cached.len());
            pool.validate();
        }
        held
    }
}

/// With `slots <= WINDOW` the window is the whole table: a release into a
/// full table evicts the globally oldest block, and a hit takes the newest
/// (LIFO) or oldest (FIFO) block of its class. An exact model, on random
/// sequences: the same hits, the same blocks evicted in the same order.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn small_tables_evict_the_oldest_block() {
    for slots in 1..=FixedCapacity::WINDOW {
        for reuse in [Reuse::Lifo, Reuse::Fifo] {
            let (mut pool, alloc) = fixed_pool(slots, reuse);
            let mut model = OldestFirst::new(slots, reuse);
            let held = model.walk(&mut pool, &alloc, slots as u64 * 1009 + reuse as u64, 4);
            // Trim frees oldest first, too.
            for (b, size) in held {
                model.release(b, size);
                put(&mut pool, b, size);
            }
            pool.trim();
            model.freed.extend(model.cached.drain(..).map(|e| e.0));
            assert_eq!(freed_ids(&alloc), model.freed);
            drop(pool);
            alloc.assert_all_freed();
        }
    }
}

// ---------------------------------------------------------------------------
// Directed cases
// ---------------------------------------------------------------------------

/// A release into a table with free slots in its window is cached, and the
/// next allocate of its class hands the same block back, under either reuse
/// order, with no backing call.
#[test]
fn release_into_a_free_slot_is_found_again() {
    for reuse in [Reuse::Lifo, Reuse::Fifo] {
        let (mut pool, alloc) = fixed_pool(1024, reuse);
        // A few other classes cached around it.
        let others: Vec<(u64, usize)> = (1..=5)
            .map(|k| (pool.allocate(k * 1000).unwrap(), k * 1000))
            .collect();
        let b = pool.allocate(4096).unwrap();
        for &(o, size) in &others {
            put(&mut pool, o, size);
        }
        put(&mut pool, b, 4096);
        let s = pool.stats();
        assert_eq!(
            (s.blocks_cached, s.evictions, s.backing_deallocs),
            (6, 0, 0)
        );
        let calls = alloc.calls().len();
        assert_eq!(pool.allocate(4096).unwrap(), b);
        assert_eq!(alloc.calls().len(), calls, "a hit makes no backing call");
        let s = pool.stats();
        assert_eq!((s.hits, s.misses, s.blocks_cached), (1, 6, 5));
        // Each of the others is found again, too.
        for &(o, size) in &others {
            assert_eq!(pool.allocate(size).unwrap(), o);
        }
        assert_eq!(pool.stats().blocks_cached, 0);
        put(&mut pool, b, 4096);
        for &(o, size) in &others {
            put(&mut pool, o, size);
        }
        drop(pool);
        alloc.assert_all_freed();
    }
}

/// LIFO hands out the most recently released block of a class, FIFO the
/// oldest; other classes in between do not matter.
#[test]
fn lifo_and_fifo_choose_among_same_class_entries() {
    for (reuse, want) in [(Reuse::Lifo, [1u64, 3, 2]), (Reuse::Fifo, [2u64, 3, 1])] {
        let (mut pool, alloc) = fixed_pool(64, reuse);
        let ids: Vec<u64> = (0..3).map(|_| pool.allocate(512).unwrap()).collect();
        assert_eq!(ids, [1, 2, 3]);
        let other = pool.allocate(256).unwrap();
        // Released in the order 2, 3, (other), 1.
        put(&mut pool, 2, 512);
        put(&mut pool, 3, 512);
        put(&mut pool, other, 256);
        put(&mut pool, 1, 512);
        let got: Vec<u64> = (0..3).map(|_| pool.allocate(512).unwrap()).collect();
        assert_eq!(got, want, "{reuse:?}");
        assert_eq!(pool.stats().hits, 3);
        assert_eq!(pool.allocate(256).unwrap(), other);
        for b in got {
            put(&mut pool, b, 512);
        }
        put(&mut pool, other, 256);
        drop(pool);
        alloc.assert_all_freed();
    }
}

/// A full probe window evicts its oldest entry. One class's blocks share a
/// window of `WINDOW` slots: in a large table the `WINDOW + 1`-th block of
/// a class displaces the first one released, even though the table has
/// plenty of free slots.
#[test]
fn full_window_evicts_its_oldest_entry() {
    let w = FixedCapacity::WINDOW;
    let (mut pool, alloc) = fixed_pool(1024, Reuse::Lifo);
    let ids: Vec<u64> = (0..w + 3).map(|_| pool.allocate(777).unwrap()).collect();
    for (i, &b) in ids.iter().enumerate() {
        put(&mut pool, b, 777);
        let s = pool.stats();
        let displaced = (i + 1).saturating_sub(w);
        assert_eq!(s.evictions as usize, displaced);
        assert_eq!(s.blocks_cached as usize, (i + 1).min(w));
    }
    // The three oldest went, in release order, each with its size.
    assert_eq!(
        alloc
            .calls()
            .into_iter()
            .filter(|c| matches!(c, Call::Deallocate { .. }))
            .collect::<Vec<_>>(),
        ids[..3]
            .iter()
            .map(|&block| Call::Deallocate { block, size: 777 })
            .collect::<Vec<_>>()
    );
    // The survivors are the newest WINDOW, handed out newest first.
    let got: Vec<u64> = (0..w).map(|_| pool.allocate(777).unwrap()).collect();
    let mut want: Vec<u64> = ids[3..].to_vec();
    want.reverse();
    assert_eq!(got, want);
    for b in got {
        put(&mut pool, b, 777);
    }
    drop(pool);
    alloc.assert_all_freed();
}

/// A lookup compares seven bits of each size's hash before the size
/// itself: with a thousand sizes over a 16-slot table, many sizes share a
/// window and a tag, and a hit still hands out a block of its own size
/// only, the newest of them (LIFO).
#[test]
fn sizes_sharing_a_tag_keep_their_own_blocks() {
    let (mut pool, alloc) = fixed_pool(16, Reuse::Lifo);
    // Fewer sizes under Miri, and the table validated every eighth step
    // there (and at the end of each phase): still about a dozen sizes
    // whose tag matches a cached block of another size in their window.
    let n = if cfg!(miri) { 160 } else { 1000 };
    let every = if cfg!(miri) { 16 } else { 1 };
    let sizes: Vec<usize> = (1..=n).map(|k| 48 * k).collect();
    let blocks: Vec<u64> = sizes.iter().map(|&s| pool.allocate(s).unwrap()).collect();
    for (i, (&b, &s)) in blocks.iter().zip(&sizes).enumerate() {
        put(&mut pool, b, s);
        if i % every == 0 {
            pool.validate();
        }
    }
    pool.validate();
    assert_eq!(pool.stats().blocks_cached, 16);
    // Every size asked once (held, so nothing more is evicted): each of
    // the 16 cached blocks is found by its own size, no other size finds
    // one.
    let mut held = Vec::new();
    for &s in &sizes {
        let before = pool.stats().hits;
        let b = pool.allocate(s).unwrap();
        assert_eq!(alloc.size_of(b), Some(s), "size {s} was handed block {b}");
        if pool.stats().hits > before {
            // The block released for this size, not another one.
            assert_eq!(b, blocks[s / 48 - 1]);
        }
        held.push((b, s));
        if held.len() % every == 0 {
            pool.validate();
        }
    }
    pool.validate();
    assert_eq!(pool.stats().hits, 16);
    assert_eq!(pool.stats().blocks_cached, 0);
    for (b, s) in held {
        put(&mut pool, b, s);
    }
    drop(pool);
    alloc.assert_all_freed();
}

/// Windows wrap the end of the table, so every slot lies in as many
/// windows as the others: a small table given one block each of many
/// sizes fills every slot, the first and last ones included.
#[test]
fn every_slot_of_a_small_table_takes_blocks() {
    // Under Miri the smallest and largest tables.
    let tables: &[usize] = if cfg!(miri) { &[16, 32] } else { &[16, 24, 32] };
    for &slots in tables {
        for reuse in [Reuse::Lifo, Reuse::Fifo] {
            let (mut pool, alloc) = fixed_pool(slots, reuse);
            // Sizes whose homes (without wrapping windows) left 2, 3 and
            // 5 slots of these tables empty.
            let sizes: Vec<usize> = (1..=4 * slots).map(|k| 48 * k).collect();
            let blocks: Vec<u64> = sizes.iter().map(|&s| pool.allocate(s).unwrap()).collect();
            for (&b, &s) in blocks.iter().zip(&sizes) {
                put(&mut pool, b, s);
            }
            pool.validate();
            assert_eq!(
                pool.stats().blocks_cached as usize,
                slots,
                "{slots} slots, {reuse:?}"
            );
            drop(pool);
            alloc.assert_all_freed();
        }
    }
}

/// `per_size` above `WINDOW` makes the window span several groups of
/// tags: all its blocks are found, in reuse order, and the block past the
/// bound evicts the oldest.
#[test]
fn per_size_beyond_one_group_of_tags() {
    for (reuse, per) in [(Reuse::Lifo, 20usize), (Reuse::Fifo, 20), (Reuse::Lifo, 64)] {
        let alloc = CheckingAllocator::new();
        let mut pool = DecayingPool::builder(alloc.clone())
            // A smaller table under Miri (each step validates all of it).
            .policy(FixedCapacity::new(if cfg!(miri) { 128 } else { 1000 }).per_size(per))
            .reuse(reuse)
            .build();
        let ids: Vec<u64> = (0..per + 3).map(|_| pool.allocate(4096).unwrap()).collect();
        // Under Miri the table is validated every fourth step and at the
        // end.
        for (i, &b) in ids.iter().enumerate() {
            put(&mut pool, b, 4096);
            if !cfg!(miri) || i % 4 == 0 {
                pool.validate();
            }
        }
        pool.validate();
        let s = pool.stats();
        assert_eq!((s.blocks_cached as usize, s.evictions), (per, 3));
        assert_eq!(freed_ids(&alloc), ids[..3]);
        let got: Vec<u64> = (0..per).map(|_| pool.allocate(4096).unwrap()).collect();
        let mut want = ids[3..].to_vec();
        if reuse == Reuse::Lifo {
            want.reverse();
        }
        assert_eq!(got, want, "{reuse:?}, per_size {per}");
        assert_eq!(pool.stats().misses as usize, per + 3);
        for b in got {
            put(&mut pool, b, 4096);
        }
        drop(pool);
        alloc.assert_all_freed();
    }
}

/// A window as large as the table (`per_size(slots)`, here over several
/// groups of tags and wrapping the table's end from any home slot) is the
/// whole table: a release into a full table evicts the globally oldest
/// block and a hit takes the newest (LIFO) or oldest (FIFO) of its class,
/// as with tables of at most `WINDOW` slots. An exact model.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps: too slow under Miri
fn whole_table_windows_of_several_groups_evict_the_oldest_block() {
    for slots in [9usize, 12, 16, 17, 24] {
        for reuse in [Reuse::Lifo, Reuse::Fifo] {
            let alloc = CheckingAllocator::new();
            let mut pool = DecayingPool::builder(alloc.clone())
                .policy(FixedCapacity::new(slots).per_size(slots))
                .reuse(reuse)
                .build();
            let mut model = OldestFirst::new(slots, reuse);
            let held = model.walk(&mut pool, &alloc, slots as u64 * 7919 + reuse as u64, 6);
            for (b, size) in held {
                put(&mut pool, b, size);
            }
            drop(pool);
            alloc.assert_all_freed();
        }
    }
}

/// `FixedCapacity::new(0)` caches nothing: every allocate is a miss and
/// every release an eviction and a backing free, of that very block.
#[test]
fn zero_slots_cache_nothing() {
    let (mut pool, alloc) = fixed_pool(0, Reuse::Lifo);
    for round in 1..=20u64 {
        let size = 64 * round as usize;
        let b = pool.allocate(size).unwrap();
        put(&mut pool, b, size);
        assert_eq!(last_dealloc(&alloc), Some((b, size)));
        let s = pool.stats();
        assert_eq!(
            (s.hits, s.misses, s.evictions, s.backing_deallocs),
            (0, round, round, round)
        );
        assert_eq!(
            (s.blocks_cached, s.bytes_cached, s.bytes_reserved),
            (0, 0, 0)
        );
    }
    // The same size again: still a miss.
    let b = pool.allocate(64).unwrap();
    assert_eq!(pool.stats().misses, 21);
    put(&mut pool, b, 64);
    assert_eq!(pool.collect(), 0);
    assert_eq!(pool.trim(), 0);
    assert_eq!(pool.stats().trimmed, 0);
    alloc.assert_all_freed();
    drop(pool);
    assert_eq!(alloc.allocs(), 21);
    assert_eq!(alloc.deallocs(), 21);
}

/// `collect` is a no-op: it frees nothing and calls nothing, however far
/// the clock moves.
#[test]
fn collect_is_a_no_op_even_hours_later() {
    let alloc = CheckingAllocator::new();
    let clock = ManualClock::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedCapacity::new(16))
        .clock(clock.clone())
        .build();
    let blocks: Vec<(u64, usize)> = (1..=6)
        .map(|k| (pool.allocate(k * 100).unwrap(), k * 100))
        .collect();
    for &(b, size) in &blocks {
        put(&mut pool, b, size);
    }
    let stats = pool.stats();
    let calls = alloc.calls();
    for _ in 0..5 {
        clock.advance(Duration::from_secs(3600));
        assert_eq!(pool.collect(), 0);
        assert_eq!(alloc.calls(), calls);
        assert_eq!(pool.stats(), stats);
    }
    // Everything is still there to be hit, hours later.
    for &(b, size) in &blocks {
        assert_eq!(pool.allocate(size).unwrap(), b);
    }
    assert_eq!(pool.stats().hits, 6);
    for &(b, size) in &blocks {
        put(&mut pool, b, size);
    }
}

/// `trim` empties the table oldest first, returns the bytes freed and
/// counts them in `trimmed`, not `evictions`; the table is usable after.
#[test]
fn trim_empties_the_table() {
    let (mut pool, alloc) = fixed_pool(32, Reuse::Lifo);
    let blocks: Vec<(u64, usize)> = [300usize, 100, 200, 100, 50]
        .iter()
        .map(|&size| (pool.allocate(size).unwrap(), size))
        .collect();
    // Released in reverse allocation order.
    for &(b, size) in blocks.iter().rev() {
        put(&mut pool, b, size);
    }
    assert_eq!(pool.trim(), 750);
    let want: Vec<Call> = blocks
        .iter()
        .rev()
        .map(|&(block, size)| Call::Deallocate { block, size })
        .collect();
    let got: Vec<Call> = alloc
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Deallocate { .. }))
        .collect();
    assert_eq!(got, want);
    let s = pool.stats();
    assert_eq!(
        (s.trimmed, s.evictions, s.blocks_cached, s.bytes_cached),
        (5, 0, 0, 0)
    );
    assert_eq!(pool.trim(), 0);
    alloc.assert_all_freed();
    pool.validate();
    // Usable after a trim.
    let b = pool.allocate(300).unwrap();
    put(&mut pool, b, 300);
    assert_eq!(pool.allocate(300).unwrap(), b);
    put(&mut pool, b, 300);
    drop(pool);
    alloc.assert_all_freed();
}

/// The byte limit works over the fixed table: a miss frees cached blocks
/// oldest first until it fits, and a request that can never fit fails at
/// once with the cache left alone and no backing call.
#[test]
fn limit_works_with_fixed_capacity() {
    let alloc = CheckingAllocator::new();
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedCapacity::new(16))
        .limit(1000)
        .build();
    let ids: Vec<u64> = (0..3).map(|_| pool.allocate(300).unwrap()).collect();
    for &b in &ids {
        put(&mut pool, b, 300);
    }
    // 900 cached + 500 > 1000: the two oldest go (300 + 500 <= 1000).
    let big = pool.allocate(500).unwrap();
    assert_eq!(freed_ids(&alloc), ids[..2].to_vec());
    let s = pool.stats();
    assert_eq!(
        (s.trimmed, s.evictions, s.bytes_cached, s.bytes_reserved),
        (2, 0, 300, 800)
    );
    // 500 in use + 700 > 1000: refused, nothing freed, no backing call.
    let calls = alloc.calls();
    match pool.allocate(700) {
        Err(PoolError::LimitExceeded {
            requested: 700,
            limit: 1000,
            reserved: 800,
        }) => {}
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    assert_eq!(alloc.calls(), calls);
    assert_eq!(pool.stats().bytes_cached, 300);
    // The remaining cached block is still a hit.
    assert_eq!(pool.allocate(300).unwrap(), ids[2]);
    let s = pool.stats();
    assert!(s.peak_bytes_reserved <= 1000);
    assert_eq!((s.hits, s.misses), (1, 4));
    put(&mut pool, big, 500);
    put(&mut pool, ids[2], 300);
    drop(pool);
    alloc.assert_all_freed();
}

/// The out-of-memory retry works over the fixed table: oldest first until
/// the class size is freed, then everything, then `Backing`.
#[test]
fn oom_retry_works_with_fixed_capacity() {
    let alloc = FailingAllocator::with_capacity(1000);
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedCapacity::new(16))
        .build();
    let ids: Vec<u64> = (0..3).map(|_| pool.allocate(300).unwrap()).collect();
    for &b in &ids {
        put(&mut pool, b, 300);
    }
    // 900 used + 500 > 1000: fails; the retry frees the two oldest (600 >= 500).
    let a = pool.allocate(500).unwrap();
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.blocks_cached), (1, 2, 1));
    assert_eq!(freed_ids(alloc.inner()), ids[..2].to_vec());

    // Two injected failures: the retry frees what it needs, then everything.
    put(&mut pool, a, 500);
    let cached_before = pool.stats().blocks_cached;
    assert_eq!(cached_before, 2);
    alloc.fail_next(2);
    let b = pool.allocate(100).unwrap();
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.trimmed, s.blocks_cached), (3, 4, 0));
    assert_eq!(freed_ids(alloc.inner()), vec![ids[0], ids[1], ids[2], a]);

    // Nothing cached and the allocator refuses: Backing at once.
    alloc.fail_next(1);
    assert!(matches!(
        pool.allocate(100),
        Err(PoolError::Backing(TestError::Injected))
    ));
    let s = pool.stats();
    assert_eq!((s.backing_failures, s.hits, s.misses), (4, 0, 5));
    put(&mut pool, b, 100);
    drop(pool);
    alloc.inner().assert_all_freed();
}

/// The pool never reads the clock under `FixedCapacity`: not in allocate,
/// release, collect, trim, the limit, the retry or drop.
#[test]
fn fixed_capacity_never_reads_the_clock() {
    let alloc = FailingAllocator::with_capacity(2000);
    let mut pool = DecayingPool::builder(alloc.clone())
        .policy(FixedCapacity::new(4))
        .clock(PanicClock)
        .size_class(SizeClass::PowerOfTwo)
        .limit(1500)
        .build();
    let mut held = Vec::new();
    for k in 1..=6usize {
        held.push((pool.allocate(k * 40).unwrap(), k * 40));
    }
    for (b, size) in held.drain(..) {
        put(&mut pool, b, size); // 6 releases into 4 slots: evictions
    }
    assert_eq!(pool.stats().evictions, 2);
    assert_eq!(pool.collect(), 0);
    let big = pool.allocate(1024).unwrap(); // the limit frees cached blocks
    assert_eq!(pool.stats().trimmed, 3);
    alloc.fail_next(1);
    let other = pool.allocate(100).unwrap(); // the retry frees the last one
    assert_eq!(pool.stats().trimmed, 4);
    assert_eq!(pool.stats().backing_failures, 1);
    put(&mut pool, big, 1024);
    put(&mut pool, other, 100);
    assert!(pool.trim() > 0);
    let b = pool.allocate(64).unwrap();
    put(&mut pool, b, 64);
    pool.validate();
    drop(pool);
    alloc.inner().assert_all_freed();
}
