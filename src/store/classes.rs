//! The timed store's size classes: an open-addressing table keyed by
//! class size, probed linearly, and a pointer to the class the last
//! lookup found, so that the release right after a hit of the same size
//! (the common round trip) reaches its class without hashing.
//!
//! The table holds the classes themselves, one cache line each, in a
//! power-of-two array at most three quarters full; a bucket whose class
//! has size 0 (no class does) is vacant. A lookup hashes the size to a
//! home bucket and compares sizes from there until it finds the class or
//! a vacant bucket: no control bytes, so a hit at its home bucket (most
//! of them) reads one line and compares once. Classes leave only in bulk
//! ([`Classes::retain`]), each gap closed by shifting the classes after
//! it back (Knuth's algorithm R), so there are no tombstones.
//!
//! The pointer is the module's only `unsafe`, and its invariant is kept
//! here, behind a safe API: the rest of the store cannot touch the table
//! or the pointer except through [`Classes`]' methods, each of which
//! either leaves every class in place or forgets the pointer first.

use core::ptr;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

/// A value keyed by its class size.
pub(super) trait Keyed {
    /// The class size: its key in the table; never 0 for a class.
    fn size(&self) -> usize;

    /// The value of a vacant bucket: size 0, owning nothing (making and
    /// dropping it allocate and free nothing).
    fn vacant() -> Self;
}

/// The hash of a class size: the size times 2^64 over the golden ratio
/// (Fibonacci hashing), whose top bits pick the home bucket. They depend
/// on every bit of the size below them, and spread sizes in an arithmetic
/// progression (multiples of an alignment, say) evenly over the buckets.
/// Not seeded: class sizes come from the program, not from an adversary.
#[inline(always)]
fn hash_size(size: usize) -> u64 {
    (size as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The shift that takes a hash to its home bucket in a table of `buckets`
/// (a power of two, or 0: then 63, and `get` finds nothing at bucket 0 or
/// 1).
fn shift_for(buckets: usize) -> u32 {
    if buckets == 0 {
        63
    } else {
        64 - buckets.trailing_zeros()
    }
}

/// The fewest buckets of a table that has any.
const MIN_BUCKETS: usize = 8;

/// The most classes a table of `buckets` holds: three quarters of them, so
/// a probe always ends at a vacant bucket and, at most that full, takes
/// 2.5 comparisons on average to find a class (one at a quarter full).
#[inline]
fn room(buckets: usize) -> usize {
    buckets - buckets / 4
}

/// The fewest buckets (0, or a power of two from [`MIN_BUCKETS`]) that
/// hold `classes`.
fn buckets_for(classes: usize) -> usize {
    if classes == 0 {
        return 0;
    }
    let mut n = MIN_BUCKETS;
    while room(n) < classes {
        n *= 2;
    }
    n
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
/// only counts and leave it. A lookup reads, through the table, the size
/// of each class it passes: one that finds its class then remembers that
/// class instead, and one that finds nothing forgets the pointer, which
/// may name a class it read. It is an `AtomicPtr` only so that the `&self`
/// methods can forget it while `Classes` stays `Send` and `Sync` like the
/// table.
pub(super) struct Classes<C> {
    /// No buckets, or a power of two of them, at most [`room`] of which
    /// hold a class; the others hold [`Keyed::vacant`]. A class sits at
    /// its home bucket (its hash masked) or after it, with no vacant bucket
    /// in between (cyclically).
    buckets: Box<[C]>,
    /// The number of classes.
    len: usize,
    /// [`shift_for`] the buckets.
    shift: u32,
    /// The class the last lookup found, or null.
    last: AtomicPtr<C>,
}

impl<C: Keyed> Classes<C> {
    /// No classes; allocates nothing.
    pub(super) fn new() -> Self {
        Classes {
            buckets: Box::new([]),
            len: 0,
            shift: shift_for(0),
            last: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The number of classes.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The number of classes the table holds without growing.
    #[inline]
    pub(super) fn capacity(&self) -> usize {
        if self.buckets.is_empty() {
            0
        } else {
            room(self.buckets.len())
        }
    }

    /// Bytes of the table's buckets.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn heap_bytes(&self) -> usize {
        core::mem::size_of_val(&*self.buckets)
    }

    /// Forgets the last class found, before the table is touched otherwise.
    #[inline(always)]
    fn forget_last(&self) {
        self.last.store(ptr::null_mut(), Relaxed);
    }

    /// The home bucket of `size` (0 or 1 in a table of no buckets).
    #[inline(always)]
    fn home(&self, size: usize) -> usize {
        (hash_size(size) >> self.shift) as usize
    }

    /// The bucket of the class of `size`, if any. A size of 0 finds
    /// nothing (vacant buckets are tested first).
    #[inline(always)]
    fn position(&self, size: usize) -> Option<usize> {
        // A table of no buckets: `get` finds nothing whatever the mask.
        let mask = self.buckets.len().wrapping_sub(1);
        let mut i = self.home(size);
        loop {
            let here = self.buckets.get(i)?.size();
            if here == 0 {
                return None;
            }
            if here == size {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The first vacant bucket from the home of `size` on, in a table
    /// with at least one vacant bucket.
    fn vacant_for(&self, size: usize) -> usize {
        let mask = self.buckets.len() - 1;
        let mut i = self.home(size);
        while self.buckets[i].size() != 0 {
            i = (i + 1) & mask;
        }
        i
    }

    /// Moves every class into a new table of `buckets` (at least
    /// [`buckets_for`] the classes).
    #[cold]
    fn rebuild(&mut self, buckets: usize) {
        debug_assert!(buckets >= buckets_for(self.len));
        let old = core::mem::replace(
            &mut self.buckets,
            (0..buckets).map(|_| C::vacant()).collect(),
        );
        self.shift = shift_for(buckets);
        for class in old.into_vec() {
            if class.size() != 0 {
                let i = self.vacant_for(class.size());
                self.buckets[i] = class;
            }
        }
    }

    /// The class of `size`, if any, through the last class found when it
    /// is that size (a release after a hit), else looked up (and then
    /// remembered).
    #[inline(always)]
    pub(super) fn get_mut(&mut self, size: usize) -> Option<&mut C> {
        let last = *self.last.get_mut();
        if !last.is_null() {
            // SAFETY: `last` is non-null, so `find` set it from the `&mut`
            // to a bucket it made, and since then every method that moves
            // or removes a class, or makes a reference to one other than
            // through `last`, has nulled it (see the type's
            // documentation): the class is where it was, alive, and no other
            // reference to it exists (`&mut self`, and the one `find`
            // returned has ended).
            let class = unsafe { &mut *last };
            if class.size() == size {
                return Some(class);
            }
        }
        self.find(size)
    }

    /// The class of `size`, if any, looked up in the table (a hit, which
    /// rarely repeats the size before it); remembered for the release.
    #[inline(always)]
    pub(super) fn find(&mut self, size: usize) -> Option<&mut C> {
        let Some(i) = self.position(size) else {
            // The probe read the size of every class it passed, through
            // the table: the last class found may be one of them, and a
            // pointer kept past such a read may not write any more (under
            // the tree borrows model). A miss, off the hit path.
            self.forget_last();
            return None;
        };
        // The same holds when the lookup succeeds: whatever the probe read
        // is no longer reached through `last`, which now names the class
        // found.
        let found: *mut C = &mut self.buckets[i];
        *self.last.get_mut() = found;
        // SAFETY: `found` comes from the `&mut` just made; deriving the
        // result from the raw pointer keeps the pointer valid for
        // `get_mut`.
        Some(unsafe { &mut *found })
    }

    /// The class of `size`, if any.
    pub(super) fn get(&self, size: usize) -> Option<&C> {
        self.forget_last();
        self.position(size).map(|i| &self.buckets[i])
    }

    /// Adds `class`, whose size is not 0 and not in the table; doubles the
    /// table first when it is full.
    #[cold]
    #[inline(never)]
    pub(super) fn insert(&mut self, class: C) -> &mut C {
        self.forget_last();
        debug_assert!(class.size() != 0 && self.position(class.size()).is_none());
        if self.len >= self.capacity() {
            self.rebuild(buckets_for(self.len + 1));
        }
        let i = self.vacant_for(class.size());
        self.buckets[i] = class;
        self.len += 1;
        &mut self.buckets[i]
    }

    /// Keeps only the classes `keep` approves (called once on each).
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&mut C) -> bool) {
        self.forget_last();
        if self.len == 0 {
            return;
        }
        let n = self.buckets.len();
        let mask = n - 1;
        // Start right after a vacant bucket: a gap's closing then moves
        // only classes later in the pass (their run ends at that bucket at
        // the latest), so each class is offered to `keep` once.
        let start = self
            .buckets
            .iter()
            .position(|c| c.size() == 0)
            .expect("a table is never full")
            + 1;
        let mut k = 0;
        while k < n {
            let i = (start + k) & mask;
            if self.buckets[i].size() != 0 && !keep(&mut self.buckets[i]) {
                self.buckets[i] = C::vacant();
                self.len -= 1;
                self.close_gap(i);
                // Bucket `i` may now hold a class from later in its run.
                continue;
            }
            k += 1;
        }
    }

    /// Closes the gap a class left at bucket `hole`: each class after it
    /// in its run whose home is not between the gap and itself moves back
    /// into the gap, which moves on to the bucket it left (Knuth's
    /// algorithm R), until a vacant bucket ends the run.
    fn close_gap(&mut self, mut hole: usize) {
        let mask = self.buckets.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let size = self.buckets[j].size();
            if size == 0 {
                return;
            }
            let home = self.home(size);
            // The class stays if its home is cyclically in `(hole, j]`.
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.buckets.swap(hole, j);
                hole = j;
            }
        }
    }

    /// Shrinks the table to hold at least `min` classes (and those it has).
    pub(super) fn shrink_to(&mut self, min: usize) {
        self.forget_last();
        let buckets = buckets_for(self.len.max(min));
        if buckets < self.buckets.len() {
            self.rebuild(buckets);
        }
    }

    /// The classes, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &C> {
        self.forget_last();
        self.buckets.iter().filter(|c| c.size() != 0)
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

        fn vacant() -> Self {
            C(0, 0)
        }
    }

    /// The home bucket of `s` in a table of 64 buckets: sizes of one
    /// value share their home in every table of 64 buckets or fewer (its
    /// top bits, `home(s) >> 3` in a table of 8).
    fn home(s: usize) -> u64 {
        super::hash_size(s) >> 58
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
    /// size of every class it passes, the last class found included: that
    /// class is then reached by a lookup again, not through the pointer
    /// (Miri's tree borrows model checks it).
    #[test]
    fn a_lookup_that_finds_nothing_forgets_the_class_its_probe_read() {
        let a = 1000;
        let b = (a + 1..).find(|&s| home(s) == home(a)).unwrap();
        let mut classes = Classes::new();
        classes.insert(C(a, 0));
        classes.find(a).unwrap().1 += 1;
        classes.get_mut(a).unwrap().1 += 1;
        // One home bucket: the probe for `b` compares `a`'s size.
        assert!(classes.find(b).is_none());
        assert!(classes.get_mut(b).is_none());
        classes.get_mut(a).unwrap().1 += 1;
        assert_eq!(classes.get_mut(a).map(|c| c.1), Some(3));
        // Size 0, a vacant bucket's, is no class.
        assert!(classes.get_mut(0).is_none() && classes.get(0).is_none());
    }

    /// Classes that share a home bucket form one run, which removing any
    /// of them (in every order) leaves findable: the gap closes, across the
    /// table's end too.
    #[test]
    fn removing_classes_from_a_run_keeps_the_others_findable() {
        // In a table of 8 buckets: five classes at home 6 fill 6, 7, 0, 1
        // and 2; one at home 0 goes to 3.
        let mut sizes: Vec<usize> = ((1 << 20)..)
            .filter(|&s| home(s) >> 3 == 6)
            .take(5)
            .collect();
        sizes.push(((1 << 20)..).find(|&s| home(s) >> 3 == 0).unwrap());
        let mut next = crate::test_rng::rng(7);
        for round in 0..if cfg!(miri) { 20 } else { 300 } {
            let mut classes = Classes::new();
            for &s in &sizes {
                classes.insert(C(s, 0));
            }
            assert_eq!(classes.buckets.len(), 8);
            let mut left = sizes.clone();
            while !left.is_empty() {
                let gone = left.swap_remove(next(left.len() as u64) as usize);
                let mut offered = 0;
                classes.retain(|c| {
                    offered += 1;
                    c.0 != gone
                });
                assert_eq!(offered, left.len() + 1, "round {round}: each offered once");
                assert_eq!(classes.len(), left.len());
                for &s in &left {
                    assert_eq!(classes.get(s).map(|c| c.0), Some(s), "round {round}");
                }
                assert!(classes.get(gone).is_none());
            }
        }
    }

    /// Random lookups, writes, insertions, sweeps, shrinks and reads
    /// against a plain map, over sizes that come in groups sharing a home
    /// bucket (so that probes read other classes of their group, the last
    /// found among them, lookups of sizes not in the table pass their
    /// group's classes, and sweeps close gaps in long runs): every answer
    /// agrees with the map, and under Miri every write through the
    /// remembered pointer is checked.
    #[test]
    fn random_operations_agree_with_a_map_over_sizes_that_share_home_buckets() {
        use std::collections::HashMap;
        // Three groups of six sizes, each group one home bucket.
        let mut sizes = Vec::new();
        for base in [100, 70_000, 1 << 30] {
            let h = home(base);
            sizes.extend((base..).filter(|&s| home(s) == h).take(6));
        }
        let mut next = crate::test_rng::rng(0x9e37_79b9_7f4a_7c15);
        let steps = if cfg!(miri) { 2_000 } else { 20_000 };
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
