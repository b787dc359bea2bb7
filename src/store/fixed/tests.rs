//! The unit tests of the fixed-capacity store.

use super::*;

/// Two classes of one home slot and one tag: the first pair found.
fn colliding(store: &FixedStore<u64>) -> (usize, usize) {
    let mut seen = std::collections::HashMap::new();
    for class in 1.. {
        if let Some(&other) = seen.get(&store.locate(class)) {
            return (other, class);
        }
        seen.insert(store.locate(class), class);
    }
    unreachable!()
}

#[test]
fn classes_of_one_tag_and_home_keep_their_own_blocks() {
    for reuse in [Reuse::Lifo, Reuse::Fifo] {
        let mut store = FixedStore::<u64>::new(64, FixedCapacity::WINDOW, reuse);
        let (a, b) = colliding(&store);
        assert_ne!(a, b);
        assert_eq!(store.locate(a), store.locate(b));
        assert_eq!(store.put(1, a, 0), None);
        assert_eq!(store.put(2, b, 0), None);
        assert_eq!(store.put(3, a, 0), None);
        store.check();
        assert_eq!(store.cached_of(a), 2);
        assert_eq!(store.cached_of(b), 1);
        let (first, second) = match reuse {
            Reuse::Lifo => (3, 1),
            Reuse::Fifo => (1, 3),
        };
        assert_eq!(store.take(b, 0), Some(2));
        assert_eq!(store.take(b, 0), None);
        assert_eq!(store.take(a, 0), Some(first));
        store.check();
        assert_eq!(store.take(a, 0), Some(second));
        assert_eq!(store.take(a, 0), None);
        assert_eq!(store.len(), 0);
        store.check();
    }
}

#[test]
fn dropping_the_table_drops_each_block_it_holds_once() {
    use std::rc::Rc;
    let marker = Rc::new(());
    let mut store = FixedStore::<Rc<()>>::new(16, FixedCapacity::WINDOW, Reuse::Lifo);
    let mut displaced = Vec::new();
    for class in 1..=6 {
        for _ in 0..3 {
            displaced.extend(store.put(Rc::clone(&marker), class * 64, 0));
        }
    }
    store.check();
    let taken = store.take(64, 0);
    store.check();
    let cached = store.len();
    assert!(cached > 0);
    assert_eq!(
        Rc::strong_count(&marker),
        1 + cached + displaced.len() + usize::from(taken.is_some())
    );
    drop(store);
    // The blocks the table held are dropped, and only those.
    assert_eq!(
        Rc::strong_count(&marker),
        1 + displaced.len() + usize::from(taken.is_some())
    );
}

#[test]
fn bytes_per_slot() {
    // What the policy's documentation says a slot costs.
    assert_eq!(core::mem::size_of::<Entry<core::ptr::NonNull<u8>>>(), 16);
    assert_eq!(core::mem::size_of::<Entry<u64>>(), 16);
    assert_eq!(core::mem::size_of::<Link>(), 16);
    assert_eq!(core::mem::size_of::<Slot<u64>>(), 32);
    assert_eq!(core::mem::size_of::<Slot<core::ptr::NonNull<u8>>>(), 32);
    // A larger block rounds its record up to the alignment.
    assert_eq!(core::mem::size_of::<Slot<[u64; 2]>>(), 64);
    let store = FixedStore::<u64>::new(1 << 12, FixedCapacity::WINDOW, Reuse::Lifo);
    // The records (entry and links) and the sentinel's, the tags and
    // their padding, the chain links.
    assert_eq!(
        store.footprint(),
        ((1 << 12) + 1) * 32 + (1 << 12) + WIDTH + (1 << 12) * 4
    );
}

#[test]
fn a_table_of_no_slots_gives_every_block_back() {
    for reuse in [Reuse::Lifo, Reuse::Fifo] {
        let mut store = FixedStore::<u64>::new(0, FixedCapacity::WINDOW, reuse);
        for class in 1..40 {
            assert_eq!(
                store.put(class as u64, class, 0),
                Some((class as u64, class))
            );
            assert_eq!(store.take(class, 0), None);
            assert_eq!(store.pop_oldest(0), None);
            store.check();
        }
        assert_eq!((store.len(), store.bytes(), store.footprint()), (0, 0, 0));
    }
}

#[test]
fn a_window_wraps_the_end_of_the_table() {
    let slots = 64;
    let mut store = FixedStore::<u64>::new(slots, FixedCapacity::WINDOW, Reuse::Lifo);
    // A class whose window runs past the last slot.
    let class = (1..)
        .find(|&c| store.locate(c).0 > slots - FixedCapacity::WINDOW)
        .unwrap();
    let home = store.locate(class).0;
    for b in 0..FixedCapacity::WINDOW as u64 {
        assert_eq!(store.put(b, class, 0), None);
        store.check();
    }
    // The window is full: its slots from home to the end, then from 0.
    let want: Vec<usize> = (home..slots)
        .chain(0..FixedCapacity::WINDOW - (slots - home))
        .collect();
    let mut used: Vec<usize> = store.occupied().collect();
    used.sort_unstable();
    let mut want_sorted = want.clone();
    want_sorted.sort_unstable();
    assert_eq!(used, want_sorted);
    // The wrapped slots are found by the slow path, slot by slot.
    assert_eq!(store.cached_of(class), FixedCapacity::WINDOW);
    // One more evicts the oldest, block 0.
    assert_eq!(store.put(99, class, 0), Some((0, class)));
    store.check();
    let got: Vec<u64> = (0..FixedCapacity::WINDOW)
        .map(|_| store.take(class, 0).unwrap())
        .collect();
    assert_eq!(got, [99, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(store.take(class, 0), None);
    store.check();
}

/// `take_inline` takes what `take` takes, leaving the table as `take`
/// does, or answers `None` with nothing changed (the pool then calls
/// `take`): two tables driven by the same random puts and hits, one
/// through each.
#[test]
fn take_inline_takes_what_take_takes_or_nothing() {
    let mut next = crate::test_rng::rng(0x2545_f491_4f6c_dd1du64);
    let state = |s: &FixedStore<u64>| {
        (
            s.tags.clone(),
            s.below.clone(),
            (s.hint_class, s.hint_slot, s.hint_tag),
            (s.taken, s.bytes, s.len()),
        )
    };
    let (mut inline, mut out_of_line) = (0, 0);
    let (steps, least) = if cfg!(miri) { (100, 40) } else { (20_000, 100) };
    for (slots, window) in [(64, 8), (64, 16), (24, 20)] {
        for reuse in [Reuse::Lifo, Reuse::Fifo] {
            let mut a = FixedStore::<u64>::new(slots, window, reuse);
            let mut b = FixedStore::<u64>::new(slots, window, reuse);
            for id in 0..steps {
                let class = 1 + next(12) as usize;
                if next(2) == 0 {
                    assert_eq!(a.put(id, class, 0), b.put(id, class, 0));
                } else {
                    let before = state(&b);
                    let got = match b.take_inline(class, 0) {
                        Some(block) => {
                            inline += 1;
                            Some(block)
                        }
                        None => {
                            assert!(state(&b) == before, "a `None` changed the table");
                            out_of_line += 1;
                            b.take(class, 0)
                        }
                    };
                    assert_eq!(a.take(class, 0), got);
                }
                assert!(state(&a) == state(&b), "the tables parted at step {id}");
            }
            b.check();
        }
    }
    assert!(
        inline > least && out_of_line > least,
        "{inline} / {out_of_line}"
    );
}

#[test]
fn a_window_of_several_groups() {
    // A 20-slot window in a 24-slot table: three groups, the last one
    // partial, wrapping the end from most homes.
    for reuse in [Reuse::Lifo, Reuse::Fifo] {
        let mut store = FixedStore::<u64>::new(24, 20, reuse);
        // Fewer classes under Miri (safe code, checked after every put).
        for class in 1..if cfg!(miri) { 4 } else { 40usize } {
            for b in 0..21u64 {
                let evicted = store.put(b, class, 0);
                store.check();
                if b < 20 {
                    assert_eq!(evicted, None, "class {class}, block {b}");
                } else {
                    assert_eq!(evicted, Some((0, class)), "class {class}");
                }
            }
            let mut got: Vec<u64> = (0..20).map(|_| store.take(class, 0).unwrap()).collect();
            if reuse == Reuse::Lifo {
                got.reverse();
            }
            assert_eq!(got, (1..21).collect::<Vec<_>>(), "class {class}");
            assert_eq!(store.take(class, 0), None);
            store.check();
        }
    }
}

#[test]
fn the_hint_is_the_slot_the_hit_emptied() {
    // After every hit, the slot the hint names is the one the hit
    // emptied, inside the class's window; the release of the class that
    // follows fills it.
    for reuse in [Reuse::Lifo, Reuse::Fifo] {
        the_hint_is_the_slot_the_hit_emptied_under(reuse);
    }
}

fn the_hint_is_the_slot_the_hit_emptied_under(reuse: Reuse) {
    let mut store = FixedStore::<u64>::new(32, FixedCapacity::WINDOW, reuse);
    let mark = match reuse {
        Reuse::Lifo => NEWEST,
        Reuse::Fifo => 0,
    };
    let mut x = 7u64;
    let mut held: Vec<(u64, usize)> = Vec::new();
    // Fewer steps under Miri (safe code; the run is for its unsafe neighbours).
    for step in 0..if cfg!(miri) { 40 } else { 5000u64 } {
        crate::store::lcg(&mut x);
        let class = 1 + (x >> 33) as usize % 12;
        if (x >> 20) & 1 == 0 {
            let before: Vec<usize> = store.occupied().collect();
            if let Some(b) = store.take(class, 0) {
                let (home, tag) = store.locate(class);
                let slot = store.hint_slot as usize;
                let after: Vec<usize> = store.occupied().collect();
                let emptied: Vec<usize> =
                    before.into_iter().filter(|i| !after.contains(i)).collect();
                assert_eq!(emptied, [slot]);
                assert!(store.window(home).any(|i| i == slot));
                assert_eq!((store.hint_class, store.hint_tag), (class, tag | mark));
                if (x >> 40) & 1 == 0 {
                    // Straight back: into the same slot.
                    assert_eq!(store.put(b, class, 0), None);
                    assert_eq!(store.tags[slot], tag | mark);
                    assert_eq!(store.table[slot].entry.class, class);
                    assert_eq!(store.table[store.slots].link.older as usize, slot);
                } else {
                    held.push((b, class));
                }
            }
        } else if let Some((b, c)) = held.pop() {
            let _ = store.put(b, c, 0);
        } else {
            let _ = store.put(step, class, 0);
        }
        store.check();
    }
}

#[test]
fn hits_follow_the_chain_down_a_class() {
    // Under LIFO, a hit after a hit of its class (no block marked) takes
    // the block the ghost's chain link names, leaving its own ghost; a
    // release after them links its block to that chain again. In a
    // window of one group and in one of two.
    for window in [FixedCapacity::WINDOW, 16] {
        let mut store = FixedStore::<u64>::new(64, window, Reuse::Lifo);
        let class = 4096;
        let (_, tag) = store.locate(class);
        for b in 0..6 {
            assert_eq!(store.put(b, class, 0), None);
        }
        for round in 0..3 {
            for want in (0..6).rev() {
                assert_eq!(store.take(class, 0), Some(want), "window {window}");
                store.check();
                let ghost = store.hint_slot as usize;
                assert_eq!(store.tags[ghost], EMPTY | NEWEST | tag);
                assert!(ghost < store.slots);
                // SAFETY: `ghost` is a slot (asserted).
                let below = unsafe { store.below_of(ghost, class, tag) };
                if want == 0 {
                    assert_eq!(below, store.slots, "the chain ends");
                } else {
                    // The next block down is the one the link names.
                    assert_ne!(below, store.slots, "window {window}, round {round}");
                    assert_eq!(
                        // SAFETY: `below` holds a block (`below_of`).
                        unsafe { store.table[below].entry.block.assume_init_read() },
                        want - 1
                    );
                }
                // An interleaved class does not break the chain.
                assert_eq!(store.put(100, class + 64, 0), None);
                assert_eq!(store.take(class + 64, 0), Some(100));
            }
            assert_eq!(store.take(class, 0), None);
            for b in 0..6 {
                assert_eq!(store.put(b, class, 0), None);
                store.check();
            }
        }
        // The oldest block leaves (as a trim takes it): the chain that
        // names it no longer holds, and the hits still come newest first.
        assert_eq!(store.pop_oldest(0), Some((0, class)));
        let got: Vec<u64> = core::iter::from_fn(|| store.take(class, 0)).collect();
        assert_eq!(got, [5, 4, 3, 2, 1]);
        store.check();
    }
}

#[test]
fn batches_choose_with_masks_and_take_the_same_blocks() {
    // Batches (a few blocks of a few classes taken, then given back)
    // alternate with spells of round trips, through the pool's hit path
    // (`take_inline`, else `take`), with evictions now and then: every
    // hit takes its class's newest block, whether the store branches or
    // chooses with masks, and the store goes both ways. Fewer steps and
    // tables under Miri.
    // Rounds, of which the first `batches` of every `cycle` are
    // batches; a spell of round trips outlasts `MASKED_HITS`.
    let (rounds, cycle, batches, tables): (u64, u64, u64, &[usize]) = if cfg!(miri) {
        (40, 40, 20, &[24])
    } else {
        (4000, 2000, 300, &[16, 24, 64, 4096])
    };
    for &slots in tables {
        let mut store = FixedStore::<u64>::new(slots, FixedCapacity::WINDOW, Reuse::Lifo);
        let mut x = slots as u64;
        let mut next = 0u64;
        let (mut masked, mut branching, mut outlined) = (0u64, 0u64, [0u64; 2]);
        let mut switches = 0;
        for round in 0..rounds {
            crate::store::lcg(&mut x);
            let batch = round % cycle < batches;
            let n = if batch {
                1 + (x >> 40) as usize % 12
            } else {
                1
            };
            let mut held = Vec::new();
            for _ in 0..n {
                crate::store::lcg(&mut x);
                let class = 64 * (1 + (x >> 33) as usize % 6);
                let cached: Vec<u64> = store
                    .occupied()
                    .filter(|&i| store.table[i].entry.class == class)
                    // SAFETY: an occupied slot's block is initialised
                    // (a `u64`, copied).
                    .map(|i| unsafe { store.table[i].entry.block.assume_init_read() })
                    .collect();
                let was = store.branch;
                let inline = store.take_inline(class, 0);
                let got = inline.or_else(|| store.take(class, 0));
                assert_eq!(got.as_ref(), cached.iter().max(), "{slots} slots");
                // A hit left out of line: its class had no mark, and
                // no ghost whose link held.
                let out = u64::from(inline.is_none() && got.is_some());
                if was {
                    branching += 1;
                    outlined[0] += out;
                } else {
                    masked += 1;
                    outlined[1] += out;
                }
                switches += usize::from(was != store.branch);
                store.check();
                held.push(class);
            }
            // Blocks are numbered in release order.
            for class in held {
                let _ = store.put(next, class, 0);
                next += 1;
                store.check();
            }
            if x % 16 == 0 {
                let _ = store.pop_oldest(0);
                store.check();
            }
        }
        // Under Miri, the spell of masks outlasts the run.
        let (least, turns) = if cfg!(miri) { (10, 1) } else { (1000, 3) };
        assert!(
            masked >= least,
            "{slots} slots: {masked} hits chose with masks"
        );
        assert!(
            branching >= least,
            "{slots} slots: {branching} hits branched"
        );
        assert!(switches >= turns, "{slots} slots: {switches} switches");
        // Masks take inline what branches take inline (a class's mark,
        // or a ghost whose link holds): as few hits go out of line
        // either way (about a third with 16 slots, where blocks are
        // displaced all the time; none with 64).
        let [by_branch, by_mask] = outlined;
        assert!(
            by_mask * branching <= 2 * by_branch * masked + masked * masked / 100,
            "{slots} slots: out of line {by_branch} of {branching} hits branching, {by_mask} of {masked} with masks"
        );
    }
}

#[test]
fn every_hit_takes_its_class_s_newest_or_oldest_block() {
    // Random releases, hits and evictions in windows of one group or
    // several, wrapping or not, under both orders: a hit takes the
    // newest (LIFO) or oldest (FIFO) block of its class still cached,
    // whatever path found it (mark, chain, stamps). Blocks are numbered
    // in release order. Fewer steps and tables under Miri.
    let (steps, windows, tables): (u64, &[usize], &[usize]) = if cfg!(miri) {
        (80, &[17], &[24])
    } else {
        (3000, &[1, 3, 8, 13, 16, 17, 24, 40], &[16, 24, 64])
    };
    for &window in windows {
        for &slots in tables {
            for reuse in [Reuse::Lifo, Reuse::Fifo] {
                let mut store = FixedStore::<u64>::new(slots, window, reuse);
                let mut x = (window * 1000 + slots) as u64;
                let mut next = 0u64;
                for _ in 0..steps {
                    crate::store::lcg(&mut x);
                    let class = 64 * (1 + (x >> 33) as usize % 5);
                    match (x >> 20) % 8 {
                        0..=2 => {
                            let cached: Vec<u64> = store
                                .occupied()
                                .filter(|&i| store.table[i].entry.class == class)
                                // SAFETY: an occupied slot's block is
                                // initialised (a `u64`, copied).
                                .map(|i| unsafe { store.table[i].entry.block.assume_init_read() })
                                .collect();
                            let want = match reuse {
                                Reuse::Lifo => cached.iter().max(),
                                Reuse::Fifo => cached.iter().min(),
                            };
                            let got = store.take(class, 0);
                            assert_eq!(got.as_ref(), want, "window {window}, {slots} slots");
                        }
                        3 => {
                            let _ = store.pop_oldest(0);
                        }
                        _ => {
                            let _ = store.put(next, class, 0);
                            next += 1;
                        }
                    }
                    store.check();
                }
            }
        }
    }
}
