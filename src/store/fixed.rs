//! The fixed-capacity store, used by [`FixedCapacity`](crate::FixedCapacity).
//!
//! One open-addressing table of `slots` entries, allocated once and never
//! grown. A class hashes to a home slot; its blocks live in the probe
//! window of `min(slots, per_size)` slots from home (wrapping;
//! `per_size` is `FixedCapacity::WINDOW` unless the policy says otherwise). Every lookup
//! scans the whole window, so removing an entry simply empties it: no
//! tombstones, no backward shift, and every operation costs at most one
//! window scan, O(1) in the worst case.
//!
//! Entries are also linked, oldest first, into one age list threaded
//! through the table, so `trim`, the limit and the out-of-memory retry free
//! the globally oldest block in O(1). Each entry carries a release stamp
//! (a counter) to compare ages within a window.

use super::Store;
use crate::policy::{sealed, FixedCapacity, Policy, Reuse};

const NIL: u32 = u32::MAX;

struct Entry<B> {
    block: B,
    class: usize,
    stamp: u64,
    older: u32,
    newer: u32,
}

/// The fixed-capacity store: see the module documentation.
pub struct FixedStore<B> {
    table: Box<[Option<Entry<B>>]>,
    window: usize,
    reuse: Reuse,
    next_stamp: u64,
    oldest: u32,
    newest: u32,
    len: usize,
    bytes: usize,
    taken: u64,
    taken_bytes: u64,
}

impl<B> FixedStore<B> {
    /// A table of `slots` entries (at most `FixedCapacity::MAX_SLOTS`), or
    /// the largest of `slots / 2`, `slots / 4`, … that can be allocated.
    /// Its probe window is `min(slots, window)`.
    pub(crate) fn new(slots: usize, window: usize, reuse: Reuse) -> Self {
        const { assert!(FixedCapacity::MAX_SLOTS < NIL as usize) };
        let mut slots = slots.min(FixedCapacity::MAX_SLOTS);
        let table = loop {
            let mut table = Vec::new();
            // Fallible: a table too large for memory is refused here
            // instead of aborting. Zero slots allocate nothing.
            if table.try_reserve_exact(slots).is_ok() {
                table.resize_with(slots, || None);
                break table.into_boxed_slice();
            }
            slots /= 2;
        };
        FixedStore {
            window: table.len().min(window.max(1)),
            table,
            reuse,
            next_stamp: 0,
            oldest: NIL,
            newest: NIL,
            len: 0,
            bytes: 0,
            taken: 0,
            taken_bytes: 0,
        }
    }

    /// The home slot of a class.
    #[inline]
    fn home(&self, class: usize) -> usize {
        let h = (class as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let h = h ^ (h >> 29);
        ((u128::from(h) * self.table.len() as u128) >> 64) as usize
    }

    /// The slots of the window starting at `home`.
    #[inline]
    fn window(&self, home: usize) -> impl Iterator<Item = usize> {
        let n = self.table.len();
        (0..self.window).map(move |k| {
            let i = home + k;
            if i >= n {
                i - n
            } else {
                i
            }
        })
    }

    #[inline]
    fn set_newer(&mut self, at: u32, to: u32) {
        if at == NIL {
            self.oldest = to;
        } else if let Some(e) = &mut self.table[at as usize] {
            e.newer = to;
        }
    }

    #[inline]
    fn set_older(&mut self, at: u32, to: u32) {
        if at == NIL {
            self.newest = to;
        } else if let Some(e) = &mut self.table[at as usize] {
            e.older = to;
        }
    }

    #[inline]
    fn remove(&mut self, i: usize) -> (B, usize) {
        let e = self.table[i].take().expect("removing an empty entry");
        self.set_newer(e.older, e.newer);
        self.set_older(e.newer, e.older);
        self.len -= 1;
        self.bytes -= e.class;
        (e.block, e.class)
    }

    #[inline]
    fn insert(&mut self, i: usize, block: B, class: usize) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let older = self.newest;
        self.table[i] = Some(Entry {
            block,
            class,
            stamp,
            older,
            newer: NIL,
        });
        self.set_newer(older, i as u32);
        self.newest = i as u32;
        self.len += 1;
        self.bytes += class;
    }
}

impl<B> Store<B> for FixedStore<B> {
    const TIMED: bool = false;

    #[inline]
    fn take(&mut self, class: usize, _now: u64) -> Option<B> {
        if self.table.is_empty() {
            return None;
        }
        let mut best: Option<(usize, u64)> = None;
        for i in self.window(self.home(class)) {
            if let Some(e) = &self.table[i] {
                if e.class == class {
                    let better = match (best, self.reuse) {
                        (None, _) => true,
                        (Some((_, s)), Reuse::Lifo) => e.stamp > s,
                        (Some((_, s)), Reuse::Fifo) => e.stamp < s,
                    };
                    if better {
                        best = Some((i, e.stamp));
                    }
                }
            }
        }
        let (i, _) = best?;
        self.taken += 1;
        self.taken_bytes = self.taken_bytes.saturating_add(class as u64);
        Some(self.remove(i).0)
    }

    #[inline]
    fn put(&mut self, block: B, class: usize, _now: u64) -> Option<(B, usize)> {
        if self.table.is_empty() {
            return Some((block, class));
        }
        let mut oldest: Option<(usize, u64)> = None;
        for i in self.window(self.home(class)) {
            match &self.table[i] {
                None => {
                    self.insert(i, block, class);
                    return None;
                }
                Some(e) => {
                    if oldest.is_none_or(|(_, s)| e.stamp < s) {
                        oldest = Some((i, e.stamp));
                    }
                }
            }
        }
        let (i, _) = oldest.expect("a full window has an oldest entry");
        let evicted = self.remove(i);
        self.insert(i, block, class);
        Some(evicted)
    }

    #[inline]
    fn evict_due(&mut self, _now: u64) -> Option<(B, usize)> {
        None
    }

    fn pop_oldest(&mut self, _now: u64) -> Option<(B, usize)> {
        if self.oldest == NIL {
            return None;
        }
        Some(self.remove(self.oldest as usize))
    }

    fn pop_untold(&mut self) -> Option<(B, usize)> {
        // No policy to tell.
        self.pop_oldest(0)
    }

    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn bytes(&self) -> usize {
        self.bytes
    }

    #[inline]
    fn taken(&self) -> (u64, u64) {
        (self.taken, self.taken_bytes)
    }

    /// The table, allocated once at its full size: it never grows, so
    /// there is nothing to shrink.
    #[cfg(any(test, feature = "testing"))]
    fn footprint(&self) -> usize {
        core::mem::size_of_val(&*self.table)
    }

    fn cached_of(&self, class: usize) -> usize {
        self.table
            .iter()
            .flatten()
            .filter(|e| e.class == class)
            .count()
    }

    fn check(&self) {
        let (mut len, mut bytes) = (0usize, 0usize);
        for (i, e) in self.table.iter().enumerate() {
            if let Some(e) = e {
                len += 1;
                bytes += e.class;
                let home = self.home(e.class);
                assert!(
                    self.window(home).any(|w| w == i),
                    "entry {i} of class {} is outside its window",
                    e.class
                );
            }
        }
        assert_eq!(len, self.len, "cached block count");
        assert_eq!(bytes, self.bytes, "cached byte count");
        assert!(len <= self.table.len(), "more blocks than slots");
        // The age list visits every entry once, stamps increasing.
        let (mut at, mut prev, mut seen, mut last) = (self.oldest, NIL, 0usize, None);
        while at != NIL {
            let e = self.table[at as usize]
                .as_ref()
                .expect("age list reaches an empty slot");
            assert_eq!(e.older, prev, "age list back link");
            if let Some(s) = last {
                assert!(e.stamp > s, "age list out of order");
            }
            last = Some(e.stamp);
            seen += 1;
            assert!(seen <= len, "age list has a cycle");
            prev = at;
            at = e.newer;
        }
        assert_eq!(prev, self.newest, "age list tail");
        assert_eq!(seen, len, "age list length");
    }
}

impl sealed::Sealed for FixedCapacity {}

/// `FixedCapacity` runs on the fixed table.
impl Policy for FixedCapacity {
    type Store<B> = FixedStore<B>;

    fn into_store<B>(self, reuse: Reuse) -> Self::Store<B> {
        FixedStore::new(self.slots(), self.max_per_size(), reuse)
    }
}
