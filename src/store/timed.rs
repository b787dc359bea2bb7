//! The timed store, used by every [`EvictionPolicy`].
//!
//! Three structures, all indexed by small dense slot ids:
//!
//! - **slots**: a slab of cached blocks with a free list threaded through
//!   the vacant entries. Each cached slot is also a node of a doubly linked
//!   list: the queue of its size class, oldest at the head;
//! - **classes**: a size-keyed multimap, class size → (head, tail) of that
//!   class's queue, so a hit takes from either end in O(1);
//! - **queue**: the eviction deque of (release time, slot id), oldest
//!   first, and **reused**: a bitset over slot ids. A hit only marks its
//!   slot in `reused`; the slot stays reserved until its stale deque entry
//!   reaches the front and is dropped there, without calling the
//!   deallocator (when it is the newest entry, it is dropped from the back
//!   at once). A slot id is thus never reused while an entry for it is
//!   queued, so an entry can never be confused with a later occupant.
//!
//! Nothing is removed from the middle of the deque. When stale entries
//! outnumber live ones by more than `COMPACT_SLACK` the deque is
//! rebuilt without them, in order: the rebuild is paid for by the stale
//! entries it drops, so every operation stays O(1) amortised and the deque
//! stays within twice the number of cached blocks.

use core::time::Duration;

use fixedbitset::FixedBitSet;
use hashbrown::HashMap;

use super::Store;
use crate::policy::{EvictionPolicy, FreeReason, Oldest, Reuse};

/// "No slot": the end of a list.
const NIL: u32 = u32::MAX;

/// Stale deque entries tolerated beyond the number of cached blocks before
/// the deque is compacted.
const COMPACT_SLACK: usize = 64;

enum Slot<B> {
    /// A cached block, linked into the queue of its class.
    Cached {
        block: B,
        class: usize,
        prev: u32,
        next: u32,
    },
    /// Free (in the free list), or reused (bit set in `reused`, awaiting its
    /// deque entry).
    Vacant { next: u32 },
}

/// The ends of a class's queue, oldest at `head`.
#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
}

/// A deque entry: when `slot` was released.
#[derive(Clone, Copy, Debug)]
struct Entry {
    secs: u64,
    nanos: u32,
    slot: u32,
}

impl Entry {
    #[inline]
    fn released_at(&self) -> Duration {
        Duration::new(self.secs, self.nanos)
    }
}

/// The timed store: see the module documentation.
pub struct TimedStore<B, P> {
    policy: P,
    reuse: Reuse,
    slots: Vec<Slot<B>>,
    free_head: u32,
    classes: HashMap<usize, Ends>,
    queue: std::collections::VecDeque<Entry>,
    reused: FixedBitSet,
    len: usize,
    bytes: usize,
    /// Stale entries in `queue`.
    stale: usize,
    /// The policy's deadline for the oldest block when it was last
    /// checked: nothing is due before it. Reset whenever the front entry is
    /// removed; a hit on the oldest block leaves it (too early is safe).
    not_before: Duration,
}

impl<B, P: EvictionPolicy> TimedStore<B, P> {
    pub(crate) fn new(policy: P, reuse: Reuse) -> Self {
        TimedStore {
            policy,
            reuse,
            slots: Vec::new(),
            free_head: NIL,
            classes: HashMap::new(),
            queue: std::collections::VecDeque::new(),
            reused: FixedBitSet::new(),
            len: 0,
            bytes: 0,
            stale: 0,
            not_before: Duration::ZERO,
        }
    }

    #[inline]
    fn alloc_slot(&mut self, slot: Slot<B>) -> u32 {
        if self.free_head != NIL {
            let id = self.free_head;
            let old = core::mem::replace(&mut self.slots[id as usize], slot);
            self.free_head = match old {
                Slot::Vacant { next } => next,
                Slot::Cached { .. } => unreachable!("free list points at a cached slot"),
            };
            id
        } else {
            let id = self.slots.len();
            assert!(id < NIL as usize, "more than 2^32 - 1 cached blocks");
            self.slots.push(slot);
            if self.reused.len() < self.slots.capacity() {
                self.reused.grow(self.slots.capacity());
            }
            id as u32
        }
    }

    /// Returns a vacant slot to the free list.
    #[inline]
    fn free_slot(&mut self, id: u32) {
        self.slots[id as usize] = Slot::Vacant {
            next: self.free_head,
        };
        self.free_head = id;
    }

    #[inline]
    fn set_next(&mut self, id: u32, to: u32) {
        if let Slot::Cached { next, .. } = &mut self.slots[id as usize] {
            *next = to;
        }
    }

    #[inline]
    fn set_prev(&mut self, id: u32, to: u32) {
        if let Slot::Cached { prev, .. } = &mut self.slots[id as usize] {
            *prev = to;
        }
    }

    /// Unlinks the oldest cached slot `id` from its class queue and leaves
    /// it vacant (not in the free list). Returns the block and its class.
    /// Removes the class's map entry when the queue empties.
    #[inline]
    fn unlink(&mut self, id: u32) -> (B, usize) {
        let old = core::mem::replace(&mut self.slots[id as usize], Slot::Vacant { next: NIL });
        let Slot::Cached {
            block,
            class,
            prev,
            next,
        } = old
        else {
            unreachable!("unlinking a vacant slot")
        };
        if prev != NIL {
            self.set_next(prev, next);
        }
        if next != NIL {
            self.set_prev(next, prev);
        }
        if prev == NIL && next == NIL {
            self.classes.remove(&class);
        } else if let Some(ends) = self.classes.get_mut(&class) {
            if prev == NIL {
                ends.head = next;
            }
            if next == NIL {
                ends.tail = prev;
            }
        }
        self.len -= 1;
        self.bytes -= class;
        (block, class)
    }

    /// Drops stale entries at the front of the deque; returns the first
    /// live one.
    #[inline]
    fn front(&mut self) -> Option<Entry> {
        loop {
            let entry = *self.queue.front()?;
            if !self.reused.contains(entry.slot as usize) {
                return Some(entry);
            }
            self.queue.pop_front();
            self.reused.set(entry.slot as usize, false);
            self.stale -= 1;
            self.free_slot(entry.slot);
        }
    }

    /// Removes the oldest block, which `front` returned, whose class is
    /// `class`. The policy is told first, so a panic in it changes nothing.
    #[inline]
    fn remove_front(
        &mut self,
        entry: Entry,
        class: usize,
        now: Duration,
        reason: FreeReason,
    ) -> (B, usize) {
        self.policy.on_free(now, class, self.bytes - class, reason);
        self.not_before = Duration::ZERO;
        self.queue.pop_front();
        let removed = self.unlink(entry.slot);
        self.free_slot(entry.slot);
        removed
    }

    /// The class of the block in cached slot `id`.
    #[inline]
    fn class_at(&self, id: u32) -> usize {
        match &self.slots[id as usize] {
            Slot::Cached { class, .. } => *class,
            Slot::Vacant { .. } => unreachable!("live deque entry for a vacant slot"),
        }
    }

    /// Rebuilds the deque without its stale entries, freeing their slots.
    #[cold]
    fn compact(&mut self) {
        let Self {
            queue,
            reused,
            slots,
            free_head,
            ..
        } = self;
        let entries = queue.make_contiguous();
        let mut kept = 0;
        for read in 0..entries.len() {
            let e = entries[read];
            let id = e.slot as usize;
            if reused.contains(id) {
                reused.set(id, false);
                if let Slot::Vacant { next } = &mut slots[id] {
                    *next = *free_head;
                }
                *free_head = e.slot;
            } else {
                entries[kept] = e;
                kept += 1;
            }
        }
        queue.truncate(kept);
        self.stale = 0;
    }
}

impl<B, P: EvictionPolicy> Store<B> for TimedStore<B, P> {
    const TIMED: bool = true;

    #[inline]
    fn take(&mut self, class: usize, now: Duration) -> Option<B> {
        // One map lookup: the class's ends are fixed up in place.
        let ends = self.classes.get_mut(&class)?;
        let id = match self.reuse {
            Reuse::Lifo => ends.tail,
            Reuse::Fifo => ends.head,
        };
        if id == NIL {
            return None;
        }
        // Told first, so a panic in the policy changes nothing.
        let before = self.bytes;
        self.policy.on_hit(now, class, before, before - class);
        let old = core::mem::replace(&mut self.slots[id as usize], Slot::Vacant { next: NIL });
        let Slot::Cached {
            block, prev, next, ..
        } = old
        else {
            unreachable!("class queue reaches a vacant slot")
        };
        if prev == NIL {
            ends.head = next;
        } else if let Slot::Cached { next: n, .. } = &mut self.slots[prev as usize] {
            *n = next;
        }
        if next == NIL {
            ends.tail = prev;
        } else if let Slot::Cached { prev: p, .. } = &mut self.slots[next as usize] {
            *p = prev;
        }
        self.len -= 1;
        self.bytes -= class;
        if self.queue.back().is_some_and(|e| e.slot == id) {
            // The newest entry is this block's (a release taken straight
            // back): drop it from the back, no stale entry is left behind.
            self.queue.pop_back();
            self.free_slot(id);
        } else {
            self.reused.insert(id as usize);
            self.stale += 1;
        }
        Some(block)
    }

    #[inline]
    fn put(&mut self, block: B, class: usize, now: Duration) -> Option<(B, usize)> {
        if self.stale > self.len + COMPACT_SLACK {
            self.compact();
        }
        let id = self.alloc_slot(Slot::Cached {
            block,
            class,
            prev: NIL,
            next: NIL,
        });
        let ends = self.classes.entry(class).or_insert(Ends {
            head: NIL,
            tail: NIL,
        });
        let tail = ends.tail;
        ends.tail = id;
        if tail == NIL {
            ends.head = id;
        } else {
            self.set_next(tail, id);
            self.set_prev(id, tail);
        }
        self.queue.push_back(Entry {
            secs: now.as_secs(),
            nanos: now.subsec_nanos(),
            slot: id,
        });
        self.len += 1;
        self.bytes += class;
        self.policy.on_release(now, class, self.bytes);
        None
    }

    #[inline]
    fn evict_due(&mut self, now: Duration) -> Option<(B, usize)> {
        if now < self.not_before {
            return None;
        }
        let entry = self.front()?;
        let size = self.class_at(entry.slot);
        let oldest = Oldest {
            released_at: entry.released_at(),
            size,
        };
        if self.policy.must_evict(now, oldest, self.bytes) {
            Some(self.remove_front(entry, size, now, FreeReason::Expired))
        } else {
            self.not_before = self.policy.deadline(oldest).unwrap_or(Duration::ZERO);
            None
        }
    }

    fn pop_oldest(&mut self, now: Duration) -> Option<(B, usize)> {
        let entry = self.front()?;
        let class = self.class_at(entry.slot);
        Some(self.remove_front(entry, class, now, FreeReason::Trimmed))
    }

    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn check(&self) {
        let n = self.slots.len();
        // Free list: vacant, unmarked, no cycle.
        let mut in_free = FixedBitSet::with_capacity(n);
        let mut id = self.free_head;
        while id != NIL {
            let i = id as usize;
            assert!(i < n, "free list leaves the slab");
            assert!(!in_free.put(i), "free list has a cycle at {i}");
            assert!(!self.reused.contains(i), "free slot {i} is marked reused");
            match &self.slots[i] {
                Slot::Vacant { next } => id = *next,
                Slot::Cached { .. } => panic!("free list reaches cached slot {i}"),
            }
        }
        // Class queues: every cached slot exactly once, in its own class.
        let mut in_class = FixedBitSet::with_capacity(n);
        let (mut len, mut bytes) = (0usize, 0usize);
        for (&class, ends) in &self.classes {
            let (mut id, mut prev_id) = (ends.head, NIL);
            while id != NIL {
                let i = id as usize;
                assert!(!in_class.put(i), "slot {i} is queued twice");
                let Slot::Cached {
                    class: c,
                    prev,
                    next,
                    ..
                } = &self.slots[i]
                else {
                    panic!("class {class} queue reaches vacant slot {i}")
                };
                assert_eq!(*c, class, "slot {i} queued under the wrong class");
                assert_eq!(*prev, prev_id, "slot {i} has a wrong back link");
                len += 1;
                bytes += class;
                prev_id = id;
                id = *next;
            }
            assert_eq!(
                ends.tail, prev_id,
                "class {class} tail is not its last slot"
            );
        }
        assert_eq!(len, self.len, "cached block count");
        assert_eq!(bytes, self.bytes, "cached byte count");
        // Deque: one entry per cached or reused slot, release times in order.
        let mut queued = FixedBitSet::with_capacity(n);
        let (mut stale, mut live_order) = (0usize, Vec::new());
        for e in &self.queue {
            let i = e.slot as usize;
            assert!(i < n, "deque entry beyond the slab");
            assert!(!queued.put(i), "slot {i} has two deque entries");
            if self.reused.contains(i) {
                stale += 1;
                assert!(
                    matches!(self.slots[i], Slot::Vacant { .. }),
                    "reused slot {i} still holds a block"
                );
            } else {
                assert!(
                    in_class.contains(i),
                    "live deque entry for uncached slot {i}"
                );
                live_order.push(e.slot);
            }
        }
        assert_eq!(stale, self.stale, "stale entry count");
        assert_eq!(
            live_order.len(),
            self.len,
            "every cached block has an entry"
        );
        for i in 0..n {
            let accounted = in_free.contains(i)
                || in_class.contains(i)
                || (self.reused.contains(i) && queued.contains(i));
            assert!(accounted, "slot {i} is lost");
        }
        // Within a class, queue order is release order.
        let mut rank = vec![0usize; n];
        for (r, &id) in live_order.iter().enumerate() {
            rank[id as usize] = r;
        }
        for ends in self.classes.values() {
            let mut id = ends.head;
            let mut last = None;
            while id != NIL {
                if let Some(l) = last {
                    assert!(rank[id as usize] > l, "class queue out of release order");
                }
                last = Some(rank[id as usize]);
                id = match &self.slots[id as usize] {
                    Slot::Cached { next, .. } => *next,
                    Slot::Vacant { .. } => NIL,
                };
            }
        }
    }
}
