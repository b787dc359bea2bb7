//! The fixed-capacity store, used by [`FixedCapacity`](crate::FixedCapacity).
//!
//! One open-addressing table of `slots` entries, allocated once and never
//! grown. A class hashes to a home slot and a 6-bit tag; its blocks live in
//! the probe window of `window = min(slots, per_size)` slots from home,
//! wrapping past the last slot to the first (`per_size` is
//! `FixedCapacity::WINDOW` unless the policy says otherwise), so that
//! every slot belongs to `window` windows. The hot paths take a window of
//! one group (sixteen slots on x86-64, eight elsewhere) that does not wrap
//! (all but `window - 1` homes of a table):
//! a slot's index is then home plus its place in the window, with no
//! wrapping to compute on each candidate. A window that wraps, or spans
//! several groups, takes a slower path out of line, group by group: a
//! window that wraps is two runs of groups, from home to the last slot
//! and from the first, each still without a wrap per candidate.
//! Every lookup scans the whole window, so removing an entry simply empties
//! it: no tombstones, no backward shift, and every operation costs at most
//! one window scan, O(1) in the worst case.
//!
//! The scan reads tag bytes, not entries: one byte per slot, empty (high
//! bit set) or six bits of the class's hash and a mark (below), kept in an
//! array of its own and compared a group at a time, as hashbrown compares
//! its control bytes: sixteen with SSE2 on x86-64 (one compare and one
//! movemask a match), eight in one `u64` elsewhere (exactly: no byte
//! matches by a borrow from its neighbour). A window of up to a group is
//! one unaligned load and a few operations; only the entries whose tag
//! matches are read.
//!
//! Under LIFO a hit takes its class's newest block. Rather than read every
//! block of the class in the window to compare their stamps, the newest
//! block of a class carries the `NEWEST` bit in its tag whenever it is
//! known: a release marks the block it caches (and unmarks the block marked
//! before, found the same way), and a hit looks for the marked block first,
//! one match that reads one entry. A hit that takes the marked block leaves
//! its class with none marked; the next hit of the class, unless a release
//! comes first, then follows its class's chain (below), and only when
//! that fails compares the stamps of all its candidates, as every FIFO hit
//! does (no tag is marked under FIFO). A steady round trip finds its block
//! marked each time: the release after the hit marks it again.
//!
//! The chain: each slot has a link (`below`) to the slot of the block that
//! was its class's newest when the slot's block was released (the one it
//! unmarked), or to none. The slot a LIFO hit empties keeps the tag
//! `EMPTY | NEWEST | hash`, a ghost that still names its class through
//! the entry's class and its link; the next hit of the class, finding no
//! block marked, takes the block the ghost's link names if that slot still
//! holds an unmarked block of the class (which is then the class's newest:
//! see `below_of`), and its slot becomes the ghost. So batches that take
//! several blocks of a class before giving them back go down the chain one
//! match at a time; a release that finds no mark links its block to what
//! the ghost names. A class has at most one ghost, and none beside a
//! marked block: a release uses its class's ghost up, and an empty slot
//! filled by any class is no ghost any more. `check` verifies both, and
//! that a link that holds names the newest of the class's other blocks.
//!
//! Batches: a round trip's hit always finds its class's block marked (the
//! release before marked it), but when several blocks of a class are
//! taken before they are given back, a hit finds the mark or the ghost
//! about as often, and so does a release, which unmarks the one or uses
//! the other up: a branch on which it is would be mispredicted every other
//! time. A release without the hint finds either in one scan
//! (`Group::match_newest`: a class has at most one of either, never both)
//! and chooses what to write and which chain link to keep with masks. A
//! hit does the same while the store's hits go through a ghost one time in
//! eight or more (`FixedStore::branch`, measured as the timed store
//! measures its batches); else it branches, so that a round trip's hit
//! does not wait for the ghost's link it does not need.
//!
//! The tag array ends with a group of padding that stays empty, so a
//! group of a window that ends near the last slot is still one load (the
//! positions past the window are masked off). The tag is also the only
//! record of which slots hold a block (the block itself is a
//! `MaybeUninit`, initialised exactly when the tag is not empty: a ghost
//! is empty). A hit
//! leaves the slot where a release of its class would go, so the release
//! that follows (a steady workload's round trip) neither hashes nor scans.
//!
//! Occupied slots are also linked, oldest first, into one age list, closed
//! by a sentinel so that linking and unlinking never branch, so `trim`,
//! the limit and the out-of-memory retry free the globally oldest block in
//! O(1). Each slot carries a release stamp (a counter) to compare ages
//! within a window. The stamp and the links (16 bytes) sit beside the
//! slot's entry (the block and its class: 16 bytes for a pointer-sized
//! block) in one record aligned to 32 bytes, so that a hit reads and
//! writes its slot's entry, stamp and links in one cache line; relinking
//! then touches the two neighbours' records, each a line of its own. (Kept
//! in an array of their own until 2026-11-28, the links were a line apart
//! from the entry: at 4096 × 4 a round trip missed the first-level cache
//! 5.7 times against 4.6, and took 16.9 against 15.2–15.5 ns.) The chain
//! links are a third array (4 bytes a slot), read and written only off the
//! round trip's path (a release through the hint keeps its slot's link: the
//! block released there takes the place of the block the hit took). A slot
//! costs its record, `size_of::<B>() + 8` (class) `+ 16` (stamp, links)
//! rounded up to a multiple of 32 (32 for a block of up to 8 bytes, 64
//! up to 40), `+ 4` (chain) `+ 1` (tag) bytes, allocated once.

mod group;

use core::mem::MaybeUninit;

use self::group::{EMPTY, Group, Mask, NEWEST, WIDTH};
use super::{Store, TakenBytes};
use crate::policy::{FixedCapacity, Policy, Reuse, sealed};

/// No slot.
const NONE: usize = usize::MAX;

/// Hits served through a ghost (see [`FixedStore::branch`]) per choice,
/// and the fewest per hit that make a store choose with masks: one in this
/// many.
const GHOST_HITS: u64 = 8;

/// Hits a store chooses with masks before it measures again.
const MASKED_HITS: u64 = 1024;

/// What one scan of a class's window finds: the class's block marked
/// newest, its ghost, and the window's first empty slot (each `NONE` if
/// none; no mark or ghost under FIFO).
struct Found {
    marked: usize,
    ghost: usize,
    free: usize,
}

/// One slot of the table.
struct Entry<B> {
    /// The cached block: initialised exactly when the slot's tag is not
    /// [`EMPTY`].
    block: MaybeUninit<B>,
    class: usize,
}

impl<B> Entry<B> {
    const VACANT: Self = Entry {
        block: MaybeUninit::uninit(),
        class: 0,
    };
}

/// A slot's release stamp and its neighbours in the age list, or the
/// list's sentinel (the last record's): beside the slot's entry in its
/// [`Slot`] record. Meaningless for an empty slot (and the sentinel's
/// stamp).
#[derive(Clone, Copy)]
struct Link {
    stamp: u64,
    older: u32,
    newer: u32,
}

/// A slot's entry and its age-list links, side by side: a hit reads
/// and writes both in one cache line (aligned to 32 bytes, a record of a
/// pointer-sized block never straddles two). The last record is the
/// sentinel's (its entry unused).
#[repr(C, align(32))]
struct Slot<B> {
    entry: Entry<B>,
    link: Link,
}

/// The fixed-capacity store: see the module documentation.
pub struct FixedStore<B> {
    /// One tag per slot, then `WIDTH` bytes of padding that stay
    /// [`EMPTY`]: `slots + WIDTH` bytes, or none. A slot
    /// holds a block exactly when its tag is not [`EMPTY`].
    tags: Box<[u8]>,
    /// Each slot's entry and its links in the age list (oldest first),
    /// then the sentinel's links (whose `newer` is the oldest slot and
    /// `older` the newest): `slots + 1`, or none.
    table: Box<[Slot<B>]>,
    /// Each slot's link down its class's chain (LIFO): the slot of the
    /// block that was its class's newest when the slot's block was
    /// released, or `slots` for none known (see [`below_of`](Self::below_of)).
    /// Kept when the block leaves, for the ghost the slot becomes. `slots`
    /// entries, or none.
    below: Box<[u32]>,
    /// The number of slots (the sentinel's index).
    slots: usize,
    window: usize,
    /// The homes below this have a window of one group that does not
    /// wrap (the hot paths' case): `slots - window + 1` when the window is
    /// one group, else 0 (a window of several groups, or a table of no
    /// slots).
    fast_homes: usize,
    /// The window's positions in its first group.
    live: Mask,
    /// What a hit's stamps are XORed with before taking the largest: 0
    /// under LIFO (the newest), all ones under FIFO (the oldest).
    flip: u64,
    /// [`NEWEST`] under LIFO, where the newest block of each class carries
    /// it in its tag when known; 0 under FIFO, where no tag does.
    newest: u8,
    /// LIFO and branching: a hit in a window of one group looks for its
    /// class's marked block first, and for its ghost only when there is
    /// none (a round trip always finds the mark: the release before
    /// marked it, and the hit never waits for the ghost's link). In
    /// batches, where a class's hits find its ghost as often as its mark,
    /// that branch goes either way at random; a store whose hits go
    /// through a ghost at least one time in [`GHOST_HITS`] (counted every
    /// [`GHOST_HITS`] of them) stops branching for [`MASKED_HITS`] hits:
    /// a hit then finds the mark or the ghost in one scan and chooses the
    /// block with masks (`find_masked`), and then measures again. Under
    /// FIFO, always false.
    branch: bool,
    /// Branching: hits served through a ghost, and `taken` at the last
    /// choice. Choosing with masks: `taken` at which to branch again.
    ghost_hits: u64,
    mark: u64,
    /// Where a release of class `hint_class` goes, left by the hit that
    /// just took a block of it (0, a class no block has: nowhere). Any
    /// other change to the table clears it. A hit followed by the release
    /// of its class (the round trip of a steady workload) then neither
    /// hashes the class again nor reloads the tags that the hit just wrote.
    hint_class: usize,
    /// The slot and the tag for `hint_class`.
    hint_slot: u32,
    hint_tag: u8,
    /// The stamp of the next block cached: the number cached so far.
    next_stamp: u64,
    /// The number of blocks evicted or trimmed: `next_stamp - taken -
    /// evicted` are cached. Counted apart from `next_stamp` rather than as
    /// a length that both change, so that a hit and the release after it
    /// do not write and then read one word (or a pair of adjacent words,
    /// which the compiler may update as one vector: a store-forwarding
    /// stall on every round trip); and apart from `taken`, which a hit
    /// counts anyway, so that a hit updates one count of blocks, not two.
    evicted: u64,
    bytes: usize,
    /// Blocks taken by hits, and their bytes (saturating): the pool's
    /// `hits` and `bytes_from_pool`.
    taken: u64,
    taken_bytes: TakenBytes,
}

/// The tag array and the entries of a table of `slots`, allocated
/// fallibly: `None` when either cannot be.
#[allow(clippy::type_complexity)]
fn try_table<B>(slots: usize) -> Option<(Box<[u8]>, Box<[Slot<B>]>, Box<[u32]>)> {
    if slots == 0 {
        // Zero slots allocate nothing.
        return Some(Default::default());
    }
    let mut table = Vec::new();
    table.try_reserve_exact(slots + 1).ok()?;
    let mut tags = Vec::new();
    tags.try_reserve_exact(slots + WIDTH).ok()?;
    let mut below = Vec::new();
    below.try_reserve_exact(slots).ok()?;
    // The sentinel of an empty age list points at itself.
    let own = Link {
        stamp: 0,
        older: slots as u32,
        newer: slots as u32,
    };
    table.resize_with(slots + 1, || Slot {
        entry: Entry::VACANT,
        link: own,
    });
    tags.resize(slots + WIDTH, EMPTY);
    below.resize(slots, slots as u32);
    Some((
        tags.into_boxed_slice(),
        table.into_boxed_slice(),
        below.into_boxed_slice(),
    ))
}

/// The hash of a class: one 64x64 -> 128-bit multiply, folded.
#[inline(always)]
fn hash(class: usize) -> u64 {
    let p = u128::from(class as u64) * 0x9E37_79B9_7F4A_7C15;
    (p as u64) ^ ((p >> 64) as u64)
}

/// The tag of a class with hash `h`: its low six bits (the home slot
/// comes from the high bits), without the [`NEWEST`] mark.
#[inline(always)]
fn tag_of(h: u64) -> u8 {
    (h & u64::from(NEWEST - 1)) as u8
}

impl<B> FixedStore<B> {
    /// A table of `slots` entries (at most `FixedCapacity::MAX_SLOTS`), or
    /// the largest of `slots / 2`, `slots / 4`, … that can be allocated.
    /// Its probe window is `min(slots, window)`.
    pub(crate) fn new(slots: usize, window: usize, reuse: Reuse) -> Self {
        // Slot indices and the sentinel's fit the age list's links.
        const { assert!(FixedCapacity::MAX_SLOTS < u32::MAX as usize) };
        let mut slots = slots.min(FixedCapacity::MAX_SLOTS);
        let (tags, table, below) = loop {
            // Fallible: a table too large for memory is refused here
            // instead of aborting.
            if let Some(table) = try_table(slots) {
                break table;
            }
            slots /= 2;
        };
        let window = slots.min(window.max(1));
        FixedStore {
            window,
            fast_homes: if (1..=WIDTH).contains(&window) {
                slots - window + 1
            } else {
                0
            },
            live: Mask::first(window.min(WIDTH)),
            tags,
            table,
            below,
            slots,
            flip: match reuse {
                Reuse::Lifo => 0,
                Reuse::Fifo => u64::MAX,
            },
            newest: match reuse {
                Reuse::Lifo => NEWEST,
                Reuse::Fifo => 0,
            },
            branch: reuse == Reuse::Lifo,
            ghost_hits: 0,
            mark: 0,
            hint_class: 0,
            hint_slot: 0,
            hint_tag: EMPTY,
            next_stamp: 0,
            evicted: 0,
            bytes: 0,
            taken: 0,
            taken_bytes: TakenBytes::default(),
        }
    }

    /// The home slot (the first slot, 0, in a table of none) and the tag
    /// of a class.
    #[inline(always)]
    fn locate(&self, class: usize) -> (usize, u8) {
        let h = hash(class);
        let home = ((u128::from(h) * self.slots as u128) >> 64) as usize;
        (home, tag_of(h))
    }

    /// Whether slot `i` holds a block.
    #[inline(always)]
    fn is_occupied(&self, i: usize) -> bool {
        self.tags[i] & EMPTY == 0
    }

    /// The slots that hold a block (not on the hot path).
    fn occupied(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.slots).filter(|&i| self.is_occupied(i))
    }

    /// `i` (below twice the slot count) brought into the table.
    #[inline(always)]
    fn wrap(&self, i: usize) -> usize {
        if i >= self.slots { i - self.slots } else { i }
    }

    /// The slots of the window starting at `home` (not on the hot path).
    fn window(&self, home: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.window).map(move |k| self.wrap(home + k))
    }

    /// The tags of slots `at..at + WIDTH` (the padding's for those beyond
    /// the last slot).
    ///
    /// # Safety
    ///
    /// `at < slots`.
    #[inline(always)]
    unsafe fn group(&self, at: usize) -> Group {
        debug_assert!(at < self.slots);
        // SAFETY: `at < slots` (caller), and a table of at least one slot
        // has `slots + WIDTH` tags.
        unsafe { Group::load_unchecked(&self.tags, at) }
    }

    /// The entry of slot `i`.
    ///
    /// # Safety
    ///
    /// `i < slots`.
    #[inline(always)]
    unsafe fn entry(&self, i: usize) -> &Entry<B> {
        debug_assert!(i < self.slots);
        // SAFETY: the caller's promise: the entries are `slots`.
        unsafe { &self.table.get_unchecked(i).entry }
    }

    /// The entry of slot `i`, mutably.
    ///
    /// # Safety
    ///
    /// `i < slots`.
    #[inline(always)]
    unsafe fn entry_mut(&mut self, i: usize) -> &mut Entry<B> {
        debug_assert!(i < self.slots);
        // SAFETY: the caller's promise: the entries are `slots`.
        unsafe { &mut self.table.get_unchecked_mut(i).entry }
    }

    /// The age-list links of slot `i`, or the sentinel's (`i == slots`).
    ///
    /// # Safety
    ///
    /// `i <= slots` in a table of at least one slot.
    #[inline(always)]
    unsafe fn link(&self, i: usize) -> &Link {
        debug_assert!(i < self.table.len());
        // SAFETY: the caller's promise: the links are `slots + 1`.
        unsafe { &self.table.get_unchecked(i).link }
    }

    /// The age-list links of slot `i`, or the sentinel's, mutably.
    ///
    /// # Safety
    ///
    /// As [`link`](Self::link).
    #[inline(always)]
    unsafe fn link_mut(&mut self, i: usize) -> &mut Link {
        debug_assert!(i < self.table.len());
        // SAFETY: the caller's promise: the links are `slots + 1`.
        unsafe { &mut self.table.get_unchecked_mut(i).link }
    }

    /// Sets the tag of slot `i`.
    ///
    /// # Safety
    ///
    /// `i < slots`.
    #[inline(always)]
    unsafe fn set_tag(&mut self, i: usize, tag: u8) {
        debug_assert!(i < self.slots);
        // SAFETY: `i < slots`, inside the tag array.
        unsafe { *self.tags.get_unchecked_mut(i) = tag };
    }

    /// Empties occupied slot `i`, leaving it tag `left` (an empty one:
    /// [`EMPTY`], or a hit's ghost), and returns its block and class. The
    /// caller counts the block gone: `taken` for a hit, `evicted` else.
    ///
    /// # Safety
    ///
    /// `i < slots`, slot `i` holds a block, and `left & EMPTY != 0`.
    #[inline(always)]
    unsafe fn remove(&mut self, i: usize, left: u8) -> (B, usize) {
        debug_assert!(left & EMPTY != 0);
        debug_assert!(i < self.slots && self.is_occupied(i));
        // SAFETY: `i` is a slot (caller); an occupied slot's block is
        // initialised, and its empty tag (set below) says it no longer is,
        // so it is read out once.
        let (block, class) = unsafe {
            let e = self.entry(i);
            (e.block.assume_init_read(), e.class)
        };
        // SAFETY: `i` is a slot; an occupied slot's neighbours in the age
        // list are slots or the sentinel.
        unsafe {
            self.set_tag(i, left);
            let Link { older, newer, .. } = *self.link(i);
            self.link_mut(older as usize).newer = newer;
            self.link_mut(newer as usize).older = older;
        }
        self.bytes -= class;
        // Last, after the stores through pointers: a hit's own hint then
        // overwrites this store, which the compiler drops.
        self.hint_class = 0;
        (block, class)
    }

    /// Fills empty slot `i`, the newest entry.
    ///
    /// # Safety
    ///
    /// `i < slots` and slot `i` is empty.
    #[inline(always)]
    unsafe fn insert(&mut self, i: usize, tag: u8, block: B, class: usize) {
        debug_assert!(i < self.slots && !self.is_occupied(i));
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.hint_class = 0;
        let sentinel = self.slots;
        // SAFETY: `i` is a slot (caller), and the sentinel's older
        // neighbour is a slot or the sentinel. Overwriting the empty
        // slot's entry drops nothing (its block is not initialised).
        unsafe {
            *self.entry_mut(i) = Entry {
                block: MaybeUninit::new(block),
                class,
            };
            let newest = self.link(sentinel).older;
            *self.link_mut(i) = Link {
                stamp,
                older: newest,
                newer: sentinel as u32,
            };
            self.link_mut(newest as usize).newer = i as u32;
            self.link_mut(sentinel).older = i as u32;
            self.set_tag(i, tag);
        }
        self.bytes += class;
    }

    /// A hit's end: takes the block of slot `best`, of `class` (whose tag
    /// is `tag`), and leaves the release hint.
    ///
    /// # Safety
    ///
    /// `best` is a slot whose entry has the class (an empty slot's tag
    /// matches no class's, so a lookup's answer is one).
    #[inline(always)]
    unsafe fn take_slot(&mut self, best: usize, class: usize, tag: u8) -> B {
        let hint_tag = tag | self.newest;
        // Under LIFO the slot becomes its class's ghost (`EMPTY | NEWEST |
        // tag`): its chain link names the class's newest block now, if
        // that link still holds; the class had no other ghost (a marked
        // block has none beside it, and `unmarked` used it up). Under FIFO
        // it is `EMPTY | tag`, an empty slot nothing looks for.
        // SAFETY: `best` is a slot whose entry has the class (caller).
        let (block, _) = unsafe { self.remove(best, EMPTY | hint_tag) };
        // A release of this class now goes back to the slot just emptied
        // (any empty slot of the window would do): its entry and links are
        // the ones the hit just read, and its chain link is the one the
        // block released there needs.
        // The block released there is its class's newest, and the class
        // has no other block marked (the hit took it, or there was none).
        (self.hint_class, self.hint_slot, self.hint_tag) = (class, best as u32, hint_tag);
        self.taken += 1;
        self.taken_bytes.add(class);
        block
    }

    /// A hit's lookup in a window of one group that does not wrap (`home`
    /// below `fast_homes`): the slot of the best entry of `class`, if
    /// any. `INLINE`, a LIFO class none of whose blocks is marked also
    /// gives `None`, where `unmarked` would be called (which changes the
    /// table): nothing is changed either way.
    ///
    /// An `Option` rather than `NONE`: where the marked block is found
    /// (every round trip's hit), the caller's test that a slot was found
    /// then folds away, which a comparison of the slot with `NONE` (or
    /// with `slots`, for a chain link that names none) did not: 142 → 138
    /// instructions a round trip at 64 × 1 (`examples/instructions.rs
    /// fixed_capacity`), 238 → 234 a batched block.
    #[inline(always)]
    fn find_in_group<const INLINE: bool>(
        &mut self,
        home: usize,
        class: usize,
        tag: u8,
    ) -> Option<usize> {
        // SAFETY: `home` is a slot (`locate`).
        let group = unsafe { self.group(home) };
        // The inline LIFO hit (`hits_inline`) chooses with masks in
        // batches (see `branch`); what it leaves to `take` branches.
        // (`branch` is false under FIFO, whose hits the pool takes out of
        // line.)
        if INLINE && !self.branch && self.newest != 0 {
            let s = self.find_masked(home, group, class, tag);
            return (s != NONE).then_some(s);
        }
        if self.newest != 0 {
            // LIFO, branching: the block marked newest, if its class has
            // one.
            for k in group.match_tag(tag | NEWEST).and(self.live) {
                let i = home + k;
                // SAFETY: `k` is a position of the window (`live`), which
                // does not wrap (caller).
                if unsafe { self.entry(i) }.class == class {
                    return Some(i);
                }
            }
            if INLINE {
                // `unmarked`, when the ghost's link holds (a batch's second
                // block of a class); else `NONE`, with nothing changed.
                let ghosts = group.match_tag(EMPTY | NEWEST | tag).and(self.live);
                let ghost = self.first_of(home, ghosts, class);
                if ghost == NONE {
                    return None;
                }
                // SAFETY: `ghost` is a slot of the window (`first_of`).
                let below = unsafe { self.below_of(ghost, class, tag) };
                if below == self.slots {
                    // The link no longer holds: `take` finds the newest
                    // by stamp.
                    return None;
                }
                // `use_ghost`, whose test of the link does not read the
                // ghost's own tag (a link never names its slot).
                // SAFETY: `ghost` is a slot.
                unsafe { self.set_tag(ghost, EMPTY) };
                self.count_ghost_hit();
                return Some(below);
            }
            let best = self.unmarked(home, class, tag);
            return (best != NONE).then_some(best);
        }
        // FIFO: the oldest.
        let (mut best, mut best_key) = (NONE, 0u64);
        for k in group.match_hash(tag).and(self.live) {
            let i = home + k;
            // SAFETY: `k` is a position of the window (`live`), which does
            // not wrap (caller).
            let (e, link) = unsafe { (self.entry(i), self.link(i)) };
            // The tag may match another class (six bits of hash): the entry
            // decides. Chosen without branching on the key.
            let key = link.stamp ^ self.flip;
            if (e.class == class) & (key >= best_key) {
                (best, best_key) = (i, key);
            }
        }
        (best != NONE).then_some(best)
    }

    /// Counts a hit served through a ghost while branching (see
    /// [`branch`](FixedStore::branch)), and every [`GHOST_HITS`] of them
    /// stops branching if they were one hit in [`GHOST_HITS`] or more since
    /// the last choice. `taken` counts the hits before this one.
    // Inlined, though rare: a call on the hit path would make it keep its
    // values where the call cannot clobber them, at every hit.
    #[inline(always)]
    fn count_ghost_hit(&mut self) {
        self.ghost_hits += 1;
        if self.ghost_hits % GHOST_HITS == 0 {
            let hits = self.taken + 1 - self.mark;
            self.mark = self.taken + 1;
            if GHOST_HITS * GHOST_HITS >= hits {
                self.branch = false;
                self.mark = self.taken + MASKED_HITS;
            }
        }
    }

    /// [`find_in_group`](Self::find_in_group)'s inline LIFO hit while the
    /// store chooses with masks (see [`branch`](FixedStore::branch)): the
    /// same answer, the same change to the table.
    #[inline(always)]
    fn find_masked(&mut self, home: usize, group: Group, class: usize, tag: u8) -> usize {
        if self.taken >= self.mark {
            // Measure again, from the next hit on.
            self.branch = true;
            self.mark = self.taken;
            self.ghost_hits = 0;
        }
        // The class's block marked newest, or else its ghost (a class has
        // at most one of either, and never both), in one scan.
        let s = self.first_of(home, group.match_newest(tag).and(self.live), class);
        if s == NONE {
            // Neither: the newest by stamp, if any, which `take` finds.
            return NONE;
        }
        // SAFETY: `s` is a slot of the window (`first_of`).
        let t = unsafe { *self.tags.get_unchecked(s) };
        // All ones for a ghost, zero for a marked block.
        let ghost = usize::from(t >> 7).wrapping_neg();
        // The block: the marked one, or the one the ghost's chain link
        // names if that link holds (see `below_of`), chosen with masks.
        // SAFETY: `s < slots`, and there are `slots` links.
        let p = unsafe { *self.below.get_unchecked(s) } as usize;
        let best = s ^ ((s ^ p) & ghost);
        // Its tag if it holds: the marked block's own, or an unmarked
        // block of the class's.
        let want = t ^ ((t ^ tag) & ghost as u8);
        // SAFETY: `best <= slots` (a link is a slot or `slots`), and there
        // are `slots + WIDTH` tags; `slots` names the padding's first tag,
        // which is empty, so a tag equal to `want` (never empty) is a
        // slot's, whose entry is read.
        let holds =
            unsafe { *self.tags.get_unchecked(best) == want && self.entry(best).class == class };
        if !holds {
            // A ghost whose link no longer holds (a marked block always
            // does): `take` finds the newest by stamp.
            return NONE;
        }
        // The ghost is used up; a marked block's tag is stored as it was,
        // for `take_slot` to replace.
        // SAFETY: `s` is a slot.
        unsafe { self.set_tag(s, t ^ ((t ^ EMPTY) & ghost as u8)) };
        best
    }

    /// [`find_in_group`](Self::find_in_group) for any other window (of
    /// several groups, or one that wraps) in a table of at least one slot.
    #[inline(never)]
    fn find_slow(&mut self, home: usize, class: usize, tag: u8) -> usize {
        if self.newest == 0 {
            return self.best_by_stamp(home, class, tag);
        }
        let found = self.scan(home, class, tag);
        if found.marked != NONE {
            return found.marked;
        }
        self.unmarked_with(home, class, tag, found.ghost)
    }

    /// A LIFO hit of a class none of whose blocks is marked newest, in a
    /// window of one group that does not wrap: see
    /// [`unmarked_with`](Self::unmarked_with).
    #[inline(never)]
    fn unmarked(&mut self, home: usize, class: usize, tag: u8) -> usize {
        let ghost = self.matching(home, EMPTY | NEWEST | tag, class);
        self.unmarked_with(home, class, tag, ghost)
    }

    /// A LIFO hit of a class none of whose blocks is marked newest, whose
    /// ghost is `ghost` (`NONE`: none): the block the ghost's chain link
    /// names, if the link still holds, else the newest by stamp (`NONE`:
    /// the class has no block). Uses the ghost up.
    #[inline(always)]
    fn unmarked_with(&mut self, home: usize, class: usize, tag: u8, ghost: usize) -> usize {
        if ghost != NONE {
            let below = self.use_ghost(ghost, class, tag);
            if below != self.slots {
                return below;
            }
        }
        self.best_by_stamp(home, class, tag)
    }

    /// Empties `ghost`, the ghost of `class` (a class never has more than
    /// one, nor one beside a marked block), and gives the slot of the
    /// class's newest block as the ghost's chain link names it, or `slots`
    /// if the link no longer holds (see [`below_of`](Self::below_of)).
    #[inline(always)]
    fn use_ghost(&mut self, ghost: usize, class: usize, tag: u8) -> usize {
        self.tags[ghost] = EMPTY;
        // SAFETY: `ghost` is a slot (its tag was just set).
        unsafe { self.below_of(ghost, class, tag) }
    }

    /// A window that is not of one group that does not wrap, in a table of
    /// at least one slot, scanned once for `class`: see [`Found`].
    #[inline(always)]
    fn scan(&self, home: usize, class: usize, tag: u8) -> Found {
        let mut found = Found {
            marked: NONE,
            ghost: NONE,
            free: NONE,
        };
        let lifo = self.newest != 0;
        self.each_group(home, |at, group, live| {
            if lifo {
                if found.marked == NONE {
                    let marked = group.match_tag(tag | NEWEST).and(live);
                    found.marked = self.first_of(at, marked, class);
                }
                if found.ghost == NONE {
                    let ghosts = group.match_tag(EMPTY | NEWEST | tag).and(live);
                    found.ghost = self.first_of(at, ghosts, class);
                }
            }
            if found.free == NONE {
                // (Not a let chain: the crate builds on Rust 1.85.)
                if let Some(k) = group.match_empty().and(live).lowest() {
                    found.free = at + k;
                }
            }
        });
        found
    }

    /// Calls `f` with each group of the window at `home`, in a table of at
    /// least one slot, in the window's order: its first slot, the group's
    /// tags, and the positions of the window in it. A window that wraps is
    /// two runs of groups, from `home` to the last slot and from slot 0
    /// (a group that starts near the end reads the padding, masked off).
    #[inline(always)]
    fn each_group(&self, home: usize, mut f: impl FnMut(usize, Group, Mask)) {
        debug_assert!(home < self.slots);
        let first = self.window.min(self.slots - home);
        let mut run = |at: usize, len: usize| {
            let mut start = 0;
            while start < len {
                let live = Mask::first((len - start).min(WIDTH));
                // SAFETY: `at + start < at + len <= slots`.
                f(at + start, unsafe { self.group(at + start) }, live);
                start += WIDTH;
            }
        };
        run(home, first);
        if first < self.window {
            run(0, self.window - first);
        }
    }

    /// The first of the slots `at + k`, for the positions `k` in `mask`,
    /// whose entry has `class`, or `NONE`.
    #[inline(always)]
    fn first_of(&self, at: usize, mask: Mask, class: usize) -> usize {
        for k in mask {
            let i = at + k;
            // SAFETY: the caller's positions are of slots: a group's
            // positions in a window run (`each_group`) or one group's window
            // that does not wrap.
            if unsafe { self.entry(i) }.class == class {
                return i;
            }
        }
        NONE
    }

    /// The slot that slot `i`'s chain link names, if it still holds the
    /// block it named there, else `slots`.
    ///
    /// Slot `i` holds the block `X` of `class` marked newest, or is the
    /// class's ghost: it held `X` until a hit took it as the newest, and no
    /// block of the class has been released since. Its link names the
    /// block `P` that was the class's newest when `X` was released (marked
    /// then, or named by the class's ghost then), or `slots`. Every block
    /// of the class cached now other than `X` was released before `X`, so
    /// `P` is the newest of them if it is still cached. It is if its slot
    /// holds a block of the class, unmarked: a block of the class cached
    /// there after `P` left would have been released after `X`, and then
    /// either taken before `X` (emptying the slot) or still there, which
    /// would make it, not `X`, the newest (marked, or the slot the ghost
    /// is).
    ///
    /// # Safety
    ///
    /// `i < slots`. (Every chain link is a slot or `slots`.)
    #[inline(always)]
    unsafe fn below_of(&self, i: usize, class: usize, tag: u8) -> usize {
        debug_assert!(i < self.slots);
        // SAFETY: `i < slots` (caller), and there are `slots` links.
        let p = unsafe { *self.below.get_unchecked(i) } as usize;
        debug_assert!(p <= self.slots);
        // SAFETY: `p <= slots` (a link is a slot or `slots`) and there are
        // `slots + WIDTH` tags in a table of at least one slot (which `i`
        // is in).
        let t = unsafe { *self.tags.get_unchecked(p) };
        // `slots` (none) names the padding's first tag, which is empty:
        // a tag equal to a class's (never `EMPTY`) is a slot's.
        // SAFETY: then `p < slots`.
        if t == tag && unsafe { self.entry(p) }.class == class {
            debug_assert!(self.table[p].link.stamp < self.table[i].link.stamp);
            p
        } else {
            self.slots
        }
    }

    /// The slot of the window at `home`, of one group that does not wrap,
    /// whose tag is `t` and whose entry has `class` (an empty slot's entry
    /// keeps the class of the block it held), or `NONE`.
    #[inline(always)]
    fn matching(&self, home: usize, t: u8, class: usize) -> usize {
        debug_assert!(home < self.fast_homes);
        // SAFETY: `home` is a slot.
        let group = unsafe { self.group(home) };
        self.first_of(home, group.match_tag(t).and(self.live), class)
    }

    /// The best block of `class` in the window at `home` by its stamp (the
    /// newest under LIFO, the oldest under FIFO), or `NONE`, in a table of
    /// at least one slot.
    fn best_by_stamp(&self, home: usize, class: usize, tag: u8) -> usize {
        let (mut best, mut best_key) = (NONE, 0u64);
        self.each_group(home, |at, group, live| {
            for k in group.match_hash(tag).and(live) {
                let i = at + k;
                // SAFETY: `k` is a position of the window in this group
                // (`live`), whose slots run from `at`.
                let (e, link) = unsafe { (self.entry(i), self.link(i)) };
                let key = link.stamp ^ self.flip;
                if (e.class == class) & (key >= best_key) {
                    (best, best_key) = (i, key);
                }
            }
        });
        best
    }

    /// A release into a full window: the window's oldest entry makes room.
    /// `below` is the new block's chain link.
    #[inline(never)]
    fn displace(
        &mut self,
        home: usize,
        tag: u8,
        block: B,
        class: usize,
        below: usize,
    ) -> Option<(B, usize)> {
        let mut oldest: Option<(usize, u64)> = None;
        for i in self.window(home) {
            let s = self.table[i].link.stamp;
            if oldest.is_none_or(|(_, o)| s < o) {
                oldest = Some((i, s));
            }
        }
        // A full window is all occupied; only a table of no slots has an
        // empty window, and then the block goes back.
        let Some((i, _)) = oldest else {
            return Some((block, class));
        };
        if !self.is_occupied(i) {
            return Some((block, class));
        }
        // SAFETY: `i` is an occupied slot of the window; once emptied, it
        // is an empty slot.
        let evicted = unsafe {
            let evicted = self.remove(i, EMPTY);
            self.evicted += 1;
            self.insert(i, tag, block, class);
            evicted
        };
        // A block does not lie below itself (the class's newest was the
        // oldest of the window).
        self.below[i] = if below == i { self.slots } else { below } as u32;
        Some(evicted)
    }
}

impl<B> Drop for FixedStore<B> {
    fn drop(&mut self) {
        // The blocks still cached (a pool frees them first; a store
        // dropped on its own drops them, as a collection would).
        for i in 0..self.slots {
            if self.is_occupied(i) {
                self.tags[i] = EMPTY;
                // SAFETY: an occupied slot's block is initialised; its tag
                // now says it is not, so it is dropped once even if a drop
                // below panics.
                unsafe { self.table[i].entry.block.assume_init_drop() };
            }
        }
    }
}

impl<B> Store<B> for FixedStore<B> {
    const TIMED: bool = false;

    // Always inlined, as the timed store's: the hit path is short and a
    // call would cost a good share of it.
    #[inline(always)]
    fn take(&mut self, class: usize, _now: u64) -> Option<B> {
        let (home, tag) = self.locate(class);
        // One test on the usual path; a table of no slots (which caches
        // nothing) is told apart only past it.
        let best = if home < self.fast_homes {
            self.find_in_group::<false>(home, class, tag)?
        } else if self.slots == 0 {
            return None;
        } else {
            let best = self.find_slow(home, class, tag);
            if best == NONE {
                return None;
            }
            best
        };
        // SAFETY: `best` is a slot whose entry has the class.
        Some(unsafe { self.take_slot(best, class, tag) })
    }

    // The hit path with no call in it, under LIFO (`hits_inline`): a
    // window of several groups or one that wraps (`find_slow`), or a class
    // with no block marked whose ghost's link does not hold, goes to
    // `take`, out of line.
    #[inline(always)]
    fn take_inline(&mut self, class: usize, _now: u64) -> Option<B> {
        let (home, tag) = self.locate(class);
        if home >= self.fast_homes {
            return None;
        }
        let best = self.find_in_group::<true>(home, class, tag)?;
        // SAFETY: `best` is a slot whose entry has the class.
        Some(unsafe { self.take_slot(best, class, tag) })
    }

    // FIFO's hits compare stamps, with registers that LIFO's hit path
    // would save and restore at every hit: they are taken out of line,
    // with one call (where `take_inline` answering `None` would look the
    // class up twice).
    #[inline(always)]
    fn hits_inline(&self) -> bool {
        self.newest != 0
    }

    #[inline(always)]
    fn put(&mut self, block: B, class: usize, _now: u64) -> Option<(B, usize)> {
        // No block has class 0 (`Store::put`), the hint's class when there
        // is none; nor does a table of no slots take the hint, as no hit
        // leaves one (`put_scan` then gives the block back).
        debug_assert_ne!(class, 0, "a release of zero bytes reached the store");
        if self.hint_class == class {
            // SAFETY: the hint names an empty slot: the hit that left it
            // emptied it or found it empty, and any other change since
            // would have cleared the hint.
            unsafe { self.insert(self.hint_slot as usize, self.hint_tag, block, class) };
            return None;
        }
        self.put_scan(block, class)
    }

    #[inline]
    fn evict_due(&mut self, _now: u64) -> Option<(B, usize)> {
        None
    }

    #[inline(always)]
    fn may_evict(&self, _now: u64) -> bool {
        false
    }

    fn pop_oldest(&mut self, _now: u64) -> Option<(B, usize)> {
        if self.len() == 0 {
            return None;
        }
        let oldest = self.table[self.slots].link.newer as usize;
        self.evicted += 1;
        // SAFETY: a non-empty age list's first entry is an occupied slot.
        Some(unsafe { self.remove(oldest, EMPTY) })
    }

    fn pop_untold(&mut self) -> Option<(B, usize)> {
        // No policy to tell.
        self.pop_oldest(0)
    }

    #[inline]
    fn len(&self) -> usize {
        (self.next_stamp - self.taken - self.evicted) as usize
    }

    #[inline]
    fn bytes(&self) -> usize {
        self.bytes
    }

    #[inline]
    fn taken(&self) -> (u64, u64) {
        (self.taken, self.taken_bytes.get())
    }

    /// The table, allocated once at its full size: it never grows, so
    /// there is nothing to shrink.
    #[cfg(any(test, feature = "testing"))]
    fn footprint(&self) -> usize {
        core::mem::size_of_val(&*self.table)
            + core::mem::size_of_val(&*self.tags)
            + core::mem::size_of_val(&*self.below)
    }

    fn cached_of(&self, class: usize) -> usize {
        self.occupied()
            .filter(|&i| self.table[i].entry.class == class)
            .count()
    }

    fn check(&self) {
        let n = self.slots;
        if n == 0 {
            assert!(self.tags.is_empty(), "tags of an empty table");
            assert!(self.table.is_empty(), "records of an empty table");
            assert_eq!((self.len(), self.bytes), (0, 0), "counts of an empty table");
            return;
        }
        assert_eq!(self.table.len(), n + 1, "record array length");
        assert_eq!(self.tags.len(), n + WIDTH, "tag array length");
        for j in 0..WIDTH {
            assert_eq!(self.tags[n + j], EMPTY, "padding tag {j}");
        }
        assert!(
            (1..=n).contains(&self.window),
            "window of {} slots in a table of {n}",
            self.window
        );
        let fast = if (1..=WIDTH).contains(&self.window) {
            n - self.window + 1
        } else {
            0
        };
        assert_eq!(self.fast_homes, fast, "homes of the fast path");
        let (mut len, mut bytes) = (0usize, 0usize);
        for i in self.occupied() {
            let e = &self.table[i].entry;
            len += 1;
            bytes += e.class;
            let (home, tag) = self.locate(e.class);
            assert_eq!(self.tags[i] & !self.newest, tag, "tag of slot {i}");
            assert!(
                self.window(home).any(|w| w == i),
                "entry {i} of class {} is outside its window",
                e.class
            );
            assert!(
                self.table[i].link.stamp < self.next_stamp,
                "stamp of slot {i}"
            );
        }
        assert_eq!(self.below.len(), n, "chain link array length");
        for i in 0..n {
            let t = self.tags[i];
            assert!(self.below[i] as usize <= n, "chain link of slot {i}");
            if t & EMPTY == 0 {
                continue;
            }
            // An empty slot: plainly empty, a LIFO ghost, or (FIFO) the
            // hash bits of the block a hit took.
            if self.newest == 0 {
                assert_eq!(t & NEWEST, 0, "tag {t:#x} of empty slot {i} under FIFO");
            } else {
                assert!(
                    t == EMPTY || t & NEWEST != 0,
                    "tag {t:#x} of empty slot {i}"
                );
            }
        }
        // Every link is a slot or `slots` (`below_of` reads by it).
        assert!(
            self.below.iter().all(|&p| p as usize <= self.slots),
            "a chain link past the sentinel"
        );
        // Under LIFO, a block marked newest is the newest of its class
        // (which makes it the only one marked); under FIFO none is marked.
        // Its chain link, if it holds, names the newest of the others.
        for i in self.occupied().filter(|&i| self.tags[i] & NEWEST != 0) {
            let class = self.table[i].entry.class;
            assert_ne!(self.newest, 0, "a block of class {class} marked under FIFO");
            let newer = self.window(self.locate(class).0).any(|j| {
                j != i
                    && self.is_occupied(j)
                    && self.table[j].entry.class == class
                    && self.table[j].link.stamp > self.table[i].link.stamp
            });
            assert!(!newer, "a block of class {class} marked but not its newest");
            self.check_below(i, class);
        }
        // Under LIFO, a ghost (an empty slot whose tag has the mark) is the
        // only one of its class, whose blocks none is marked, in the
        // class's window; its chain link, if it holds, names the newest.
        if self.newest != 0 {
            let ghost = |i: usize| self.tags[i] & (EMPTY | NEWEST) == EMPTY | NEWEST;
            for i in (0..n).filter(|&i| ghost(i)) {
                let class = self.table[i].entry.class;
                let (home, tag) = self.locate(class);
                assert_eq!(self.tags[i], EMPTY | NEWEST | tag, "ghost {i}'s tag");
                assert!(
                    self.window(home).any(|w| w == i),
                    "ghost {i} of class {class} outside its window"
                );
                let others = self.window(home).filter(|&j| {
                    j != i
                        && self.table[j].entry.class == class
                        && (ghost(j) || self.tags[j] == tag | NEWEST)
                });
                assert_eq!(
                    others.count(),
                    0,
                    "ghost {i} of class {class} beside another ghost or a marked block"
                );
                self.check_below(i, class);
            }
        }
        assert_eq!(len, self.len(), "cached block count");
        assert_eq!(bytes, self.bytes, "cached byte count");
        assert!(len <= n, "more blocks than slots");
        if self.hint_class != 0 {
            assert!(
                !self.is_occupied(self.hint_slot as usize),
                "the hint names an occupied slot"
            );
        }
        // The age list visits every occupied slot once, stamps increasing,
        // from the sentinel back to it.
        let (mut at, mut prev, mut seen, mut last) =
            (self.table[n].link.newer as usize, n, 0usize, None);
        while at != n {
            assert!(at < n, "age list link {at} out of the table");
            assert!(self.is_occupied(at), "age list reaches empty slot {at}");
            let link = self.table[at].link;
            assert_eq!(link.older as usize, prev, "age list back link");
            if let Some(s) = last {
                assert!(link.stamp > s, "age list out of order");
            }
            last = Some(link.stamp);
            seen += 1;
            assert!(seen <= len, "age list has a cycle");
            prev = at;
            at = link.newer as usize;
        }
        assert_eq!(self.table[n].link.older as usize, prev, "age list tail");
        assert_eq!(seen, len, "age list length");
    }
}

impl<B> FixedStore<B> {
    /// [`check`](Store::check)'s test of the chain link of slot `i`, which
    /// holds the newest block of `class` or is its ghost: if the link holds,
    /// it names the newest of the class's other blocks.
    fn check_below(&self, i: usize, class: usize) {
        let (_, tag) = self.locate(class);
        assert!(i < self.slots, "slot {i} of {}", self.slots);
        // SAFETY: `i` is a slot (asserted).
        let p = unsafe { self.below_of(i, class, tag) };
        if p == self.slots {
            return;
        }
        let newer = self.window(self.locate(class).0).any(|j| {
            j != i
                && j != p
                && self.is_occupied(j)
                && self.table[j].entry.class == class
                && self.table[j].link.stamp > self.table[p].link.stamp
        });
        assert!(
            !newer,
            "slot {i}'s chain link to {p} holds but misses a newer block"
        );
    }

    /// A release without the hint: the first empty slot of the window, or
    /// the displacement of its oldest entry.
    #[inline(always)]
    fn put_scan(&mut self, block: B, class: usize) -> Option<(B, usize)> {
        let (home, tag) = self.locate(class);
        // The block released becomes its class's newest (LIFO): the one
        // marked so far loses the mark, and the new block's chain link
        // names it (or, with none marked, what the class's ghost names).
        let (free, below) = if home < self.fast_homes {
            // One group that does not wrap: loaded once for both searches
            // (the mark that is cleared, and the ghost that is emptied, do
            // not change which slots are empty).
            // SAFETY: `home` is a slot (`locate`).
            let group = unsafe { self.group(home) };
            let mut below = self.slots;
            if self.newest != 0 {
                // The class's block marked newest, or else its ghost (a
                // class has at most one of either, and never both), in one
                // scan.
                let s = self.first_of(home, group.match_newest(tag).and(self.live), class);
                if s != NONE {
                    // SAFETY: `s` is a slot of the window (`first_of`).
                    let t = unsafe { *self.tags.get_unchecked(s) };
                    // All ones for a ghost, zero for a marked block: a
                    // batch's releases find one as often as the other, so
                    // what follows chooses with masks, where a branch would
                    // be mispredicted every other release.
                    let ghost = usize::from(t >> 7).wrapping_neg();
                    // The marked block loses its mark; the ghost is used
                    // up (`use_ghost`).
                    // SAFETY: as above.
                    unsafe { self.set_tag(s, tag ^ ((tag ^ EMPTY) & ghost as u8)) };
                    // The new block's chain link: the block that was
                    // marked, or the one the ghost's link names if that
                    // link holds (see `below_of`): an unmarked block of
                    // the class either way, tag `tag` now.
                    // SAFETY: `s < slots`, and there are `slots` links.
                    let p = unsafe { *self.below.get_unchecked(s) } as usize;
                    let c = s ^ ((s ^ p) & ghost);
                    // SAFETY: `c <= slots` (a link is a slot or `slots`),
                    // and there are `slots + WIDTH` tags; `slots` names the
                    // padding's first tag, which is empty, so a tag equal
                    // to `tag` is a slot's, whose entry is read.
                    let holds = unsafe {
                        *self.tags.get_unchecked(c) == tag && self.entry(c).class == class
                    };
                    if holds {
                        below = c;
                    }
                }
            }
            let free = group
                .match_empty()
                .and(self.live)
                .lowest()
                .map(|k| home + k);
            (free, below)
        } else if self.slots == 0 {
            // A table of no slots caches nothing.
            return Some((block, class));
        } else {
            self.unmark_slow(home, class, tag)
        };
        let tag = tag | self.newest;
        match free {
            Some(i) => {
                // SAFETY: `i` is a slot whose tag is empty.
                unsafe { self.insert(i, tag, block, class) };
                self.below[i] = below as u32;
                None
            }
            None => self.displace(home, tag, block, class, below),
        }
    }

    /// `put_scan`'s searches for any other window (of several groups, or
    /// one that wraps) in a table of at least one slot: unmarks the block
    /// of `class` marked newest, if any, and gives the window's first
    /// empty slot, if any, and the released block's chain link.
    #[inline(never)]
    fn unmark_slow(&mut self, home: usize, class: usize, tag: u8) -> (Option<usize>, usize) {
        let found = self.scan(home, class, tag);
        let below = if found.marked != NONE {
            // SAFETY: `marked` is a slot of the window.
            unsafe { self.set_tag(found.marked, tag) };
            found.marked
        } else if found.ghost != NONE {
            // The first empty slot may be the ghost: it stays empty.
            self.use_ghost(found.ghost, class, tag)
        } else {
            self.slots
        };
        ((found.free != NONE).then_some(found.free), below)
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

#[cfg(test)]
mod tests;
