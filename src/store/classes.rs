//! The timed store's size classes: a `hashbrown` table keyed by class
//! size, and a pointer to the class the last lookup found, so that the
//! release right after a hit of the same size (the common round trip)
//! reaches its class without hashing.
//!
//! That pointer is the module's only `unsafe`, and its invariant is kept
//! here, behind a safe API: the rest of the store cannot touch the table
//! or the pointer except through [`Classes`]' methods, each of which
//! either leaves every class in place or forgets the pointer first. A
//! forgotten pointer names a class of size 0 that the module owns (no
//! lookup asks for size 0), so the release's test is of the size alone.

use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

use hashbrown::HashTable;

/// A value keyed by its class size.
pub(super) trait Keyed {
    /// The class size: its key in the table.
    fn size(&self) -> usize;

    /// A value of size 0, which no lookup asks for: what the pointer to
    /// the last class found names when it names no class.
    fn sentinel() -> Self;
}

/// The hash of a class size: one folded multiply (the high and low halves
/// of a 128-bit product), so both ends of the hash, which the table uses
/// for the bucket and for its tag, depend on every bit of the size. Not
/// seeded: class sizes come from the program, not from an adversary.
#[inline(always)]
fn hash_size(size: usize) -> u64 {
    let product = u128::from(size as u64) * 0x9E37_79B9_7F4A_7C15;
    (product as u64) ^ ((product >> 64) as u64)
}

/// The classes, keyed by size, and the class the last lookup found.
///
/// # The pointer to the last class found
///
/// [`find`](Classes::find) remembers the class it returns in `last`;
/// [`get_mut`](Classes::get_mut) reaches the class of the same size
/// through it. It stays valid as long as no class moves or is removed and
/// no reference to a class made otherwise is used in between, which the
/// methods guarantee: each one that moves, removes or hands out a class
/// other than through `last` ([`get`](Classes::get),
/// [`iter`](Classes::iter), [`insert`](Classes::insert),
/// [`retain`](Classes::retain), [`shrink_to`](Classes::shrink_to)) forgets
/// it first; [`len`](Classes::len) and [`capacity`](Classes::capacity) read
/// only the table's counts and leave it. A lookup reads, through the table,
/// the size of each class whose tag matches its own: one that finds its
/// class then remembers that class instead, and one that finds nothing
/// forgets the pointer, which may name a class it read. It is an `AtomicPtr` only so that
/// the `&self` methods can forget it while `Classes` stays `Send` and
/// `Sync` like the table.
///
/// Forgotten, it names `sentinel`, a value of size 0 on the heap that
/// nothing else reaches: no lookup asks for size 0 (the store's class
/// sizes are never 0), so [`get_mut`](Classes::get_mut) tests the size
/// it reads through the pointer and nothing else, where a null pointer
/// would take a test of its own on every release.
pub(super) struct Classes<C> {
    table: HashTable<C>,
    /// The class the last lookup found, or `sentinel`.
    last: AtomicPtr<C>,
    /// `Box::into_raw` of a value of size 0, freed on drop; reached only
    /// through `last`. An `AtomicPtr` for the same reason as `last`.
    sentinel: AtomicPtr<C>,
}

impl<C: Keyed> Classes<C> {
    /// No classes; allocates the sentinel (a class's bytes) only.
    pub(super) fn new() -> Self {
        let sentinel = Box::into_raw(Box::new(C::sentinel()));
        Classes {
            table: HashTable::new(),
            last: AtomicPtr::new(sentinel),
            sentinel: AtomicPtr::new(sentinel),
        }
    }

    /// The number of classes.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// The number of classes the table holds without growing.
    #[inline]
    pub(super) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Forgets the last class found, before the table is touched otherwise.
    #[inline(always)]
    fn forget_last(&self) {
        self.last.store(self.sentinel.load(Relaxed), Relaxed);
    }

    /// The class of `size`, if any, through the last class found when it
    /// is that size (a release after a hit), else looked up (and then
    /// remembered). `size` is not 0.
    #[inline(always)]
    pub(super) fn get_mut(&mut self, size: usize) -> Option<&mut C> {
        debug_assert_ne!(size, 0, "a lookup of size 0 would find the sentinel");
        let last = *self.last.get_mut();
        // SAFETY: `last` is the sentinel, which `new` allocated and only
        // `drop` frees, and which no reference but those made here and
        // ended reaches; or `find` set it from the `&mut` that `find_mut`
        // returned, and since then every method that moves or removes a
        // class, or makes a reference to one other than through `last`,
        // has forgotten it (see the type's documentation): the class is
        // where it was, alive, and no other reference to it exists (`&mut
        // self`, and the one `find` returned has ended).
        let class = unsafe { &mut *last };
        // The sentinel's size, 0, is no size asked for.
        if class.size() == size {
            return Some(class);
        }
        self.find(size)
    }

    /// The class of `size`, if any, looked up in the table (a hit, which
    /// rarely repeats the size before it); remembered for the release.
    #[inline(always)]
    pub(super) fn find(&mut self, size: usize) -> Option<&mut C> {
        let Some(found) = self.table.find_mut(hash_size(size), |c| c.size() == size) else {
            // The probe read the size of every class whose tag matched,
            // through the table: the last class found may be one of them,
            // and a pointer kept past such a read may not write any more
            // (under the tree borrows model). A miss, off the hit path.
            self.forget_last();
            return None;
        };
        // The same holds when the lookup succeeds: whatever the probe read
        // is no longer reached through `last`, which now names `found`.
        let found: *mut C = found;
        *self.last.get_mut() = found;
        // SAFETY: `found` comes from the `&mut` `find_mut` just returned;
        // deriving the result from the raw pointer keeps the pointer valid
        // for `get_mut`.
        Some(unsafe { &mut *found })
    }

    /// The class of `size`, if any.
    pub(super) fn get(&self, size: usize) -> Option<&C> {
        self.forget_last();
        self.table.find(hash_size(size), |c| c.size() == size)
    }

    /// Adds `class`, whose size is not in the table.
    #[cold]
    #[inline(never)]
    pub(super) fn insert(&mut self, class: C) -> &mut C {
        self.forget_last();
        let hash = hash_size(class.size());
        self.table
            .insert_unique(hash, class, |c| hash_size(c.size()))
            .into_mut()
    }

    /// Keeps only the classes `keep` approves.
    pub(super) fn retain(&mut self, keep: impl FnMut(&mut C) -> bool) {
        self.forget_last();
        self.table.retain(keep);
    }

    /// Shrinks the table to hold at least `min` classes (and those it has).
    pub(super) fn shrink_to(&mut self, min: usize) {
        self.forget_last();
        self.table.shrink_to(min, |c| hash_size(c.size()));
    }

    /// The classes, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &C> {
        self.forget_last();
        self.table.iter()
    }
}

impl<C> Drop for Classes<C> {
    fn drop(&mut self) {
        // SAFETY: the sentinel came from `Box::into_raw` in `new`, and is
        // freed here only; `last` may name it but is not used again.
        drop(unsafe { Box::from_raw(*self.sentinel.get_mut()) });
    }
}

#[cfg(test)]
mod tests {
    use super::{Classes, Keyed};

    struct C(usize, u32);

    impl Keyed for C {
        fn size(&self) -> usize {
            self.0
        }

        fn sentinel() -> Self {
            C(0, 0)
        }
    }

    /// The pointer to the last class found survives nothing that moves a
    /// class: growing, shrinking and sweeping the table between a lookup
    /// and the next reach the right class (Miri checks the pointer).
    #[test]
    fn the_last_class_found_is_forgotten_whenever_classes_move() {
        let mut classes = Classes::new();
        classes.insert(C(8, 0));
        for round in 0..200u32 {
            classes.find(8).unwrap().1 += 1;
            match round % 5 {
                0 => {
                    classes.insert(C(1000 + round as usize, round));
                }
                1 => classes.retain(|c| c.0 == 8 || c.1 % 2 == 0),
                2 => classes.shrink_to(0),
                3 => assert_eq!(classes.get(8).map(|c| c.0), Some(8)),
                _ => assert!(classes.iter().any(|c| c.0 == 8)),
            }
            let c = classes.get_mut(8).unwrap();
            c.1 += 1;
            assert_eq!(c.1, 2 * (round + 1));
            assert_eq!(classes.get_mut(7).map(|c| c.0), None);
        }
        assert!(classes.len() > 1 && classes.capacity() >= classes.len());
    }

    /// A lookup that finds nothing still reads, through the table, the
    /// size of every class whose tag matches its own, the last class found
    /// included: that class is then reached by a lookup again, not through
    /// the pointer (Miri's tree borrows model checks it).
    #[test]
    fn a_lookup_that_finds_nothing_forgets_the_class_its_probe_read() {
        let a = 1000;
        let tag = |s: usize| super::hash_size(s) >> 57;
        let b = (a + 1..).find(|&s| tag(s) == tag(a)).unwrap();
        let mut classes = Classes::new();
        classes.insert(C(a, 0));
        classes.find(a).unwrap().1 += 1;
        classes.get_mut(a).unwrap().1 += 1;
        // One group: the probe for `b` compares `a`'s size.
        assert!(classes.find(b).is_none());
        assert!(classes.get_mut(b).is_none());
        classes.get_mut(a).unwrap().1 += 1;
        assert_eq!(classes.get_mut(a).map(|c| c.1), Some(3));
    }

    /// Random lookups, writes, insertions, sweeps, shrinks and reads
    /// against a plain map, over sizes that come in groups sharing a tag
    /// (so that probes read other classes of their tag, the last found
    /// among them, and lookups of sizes not in the table find their tag's
    /// classes): every answer agrees with the map, and under Miri every
    /// write through the remembered pointer is checked.
    #[test]
    fn random_operations_agree_with_a_map_over_sizes_that_share_tags() {
        use std::collections::HashMap;
        let tag = |s: usize| super::hash_size(s) >> 57;
        // Three groups of six sizes, each group one tag.
        let mut sizes = Vec::new();
        for base in [100, 70_000, 1 << 30] {
            let t = tag(base);
            sizes.extend((base..).filter(|&s| tag(s) == t).take(6));
        }
        let mut next = crate::test_rng::rng(0x9e37_79b9_7f4a_7c15);
        let steps = if cfg!(miri) { 1_000 } else { 20_000 };
        let mut classes: Classes<C> = Classes::new();
        let mut model: HashMap<usize, u32> = HashMap::new();
        let (mut size, mut before) = (sizes[0], sizes[1]);
        for step in 0..steps {
            // Mostly the size of the step before (a release after its
            // hit) or of the one before that (a hit after a lookup of
            // another size).
            match next(4) {
                0 => {
                    before = core::mem::replace(&mut size, sizes[next(sizes.len() as u64) as usize])
                }
                1 => core::mem::swap(&mut size, &mut before),
                _ => {}
            }
            match next(100) {
                // A hit's lookup (`find`), or a release's (`get_mut`):
                // either writes to the class it reaches.
                op @ 0..=59 => {
                    let class = if op < 25 {
                        classes.find(size)
                    } else {
                        classes.get_mut(size)
                    };
                    let found = class.map(|c| {
                        c.1 += 1;
                        c.1
                    });
                    let expected = model.get_mut(&size).map(|v| {
                        *v += 1;
                        *v
                    });
                    assert_eq!(found, expected, "op {op} on {size} at step {step}");
                }
                60..=67 => {
                    if let std::collections::hash_map::Entry::Vacant(e) = model.entry(size) {
                        classes.insert(C(size, 0));
                        e.insert(0);
                    }
                }
                68..=77 => {
                    let odd = next(2) == 1;
                    classes.retain(|c| (c.1 % 2 == 1) == odd);
                    model.retain(|_, v| (*v % 2 == 1) == odd);
                }
                78..=81 => classes.shrink_to(0),
                82..=91 => {
                    assert_eq!(classes.get(size).map(|c| c.1), model.get(&size).copied());
                }
                _ => {
                    let mut all: Vec<_> = classes.iter().map(|c| (c.0, c.1)).collect();
                    all.sort_unstable();
                    let mut expected: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
                    expected.sort_unstable();
                    assert_eq!(all, expected, "classes at step {step}");
                }
            }
            assert_eq!(classes.len(), model.len());
        }
    }
}
