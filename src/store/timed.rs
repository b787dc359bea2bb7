//! The timed store, used by every [`EvictionPolicy`].
//!
//! - **Classes**: a size-keyed multimap (`hashbrown`) of cache-line
//!   buckets, class size → that class's cached blocks in release order,
//!   each with its release time and release number. The newest block lives
//!   in the bucket itself, the older ones in a ring buffer (`ring::Ring`),
//!   oldest at the front. A hit takes from the back (LIFO) or the front
//!   (FIFO) in O(1); a LIFO round trip on a class touches its bucket only.
//!   The release right after a hit of the same size reaches the bucket
//!   through a pointer the hit's lookup left (see `classes::Classes`, which
//!   keeps that pointer's invariant in its own module); ring first (below),
//!   where a release seldom follows a hit of its size, it looks its class
//!   up instead.
//! - **Bucket first or ring first** (`Mode`): a release puts a class's
//!   newest block in its bucket, so a LIFO round trip touches the bucket
//!   only; but in batches (several blocks of a class taken, then released)
//!   the newest block is then sometimes in the bucket and sometimes in the
//!   ring, a branch that the hits mispredict. A store whose hits often
//!   switch from a bucket to a ring goes *ring first* for a while: a
//!   release then appends to the class's ring (unless the class is empty),
//!   so a class's hits all find their block in the ring.
//! - **Eviction order**: a binary min-heap with one *token* per class that
//!   holds blocks, keyed by a release sequence number that is never later
//!   than the class's oldest block. The token with the smallest key whose
//!   key is its class's oldest block names the oldest cached block of all:
//!   every other class's oldest block is at least as late as its token,
//!   which is at least as late as this one.
//!
//! A hit or a release changes the heap only when a class gains its first
//! block and has no token (a push at the largest key: one comparison). A
//! hit that moves a class's oldest block (FIFO reuse, or a LIFO hit that
//! empties the class) leaves its token behind as a lower bound: nothing to
//! mark, nothing to compact. The token is brought up to date, in
//! O(log classes), only when it reaches the top of the heap while the
//! store looks for the oldest block: for an eviction check whose deadline
//! has passed, a trim, the limit or the out-of-memory retry. A token whose
//! class is empty when it reaches the top is dropped.
//!
//! The fast path of an eviction check is one comparison: the policy's
//! [deadline](EvictionPolicy::provisional_deadline) for the oldest block,
//! cached until a block is freed or the policy reports it
//! [stale](EvictionPolicy::deadline_stale) after a release or a hit (as
//! `Exponential` does when a release brings it forward). It also covers
//! any later block that becomes the oldest, so a hit needs no reset of its
//! own. For a policy without deadlines, the
//! store remembers which class holds the oldest block until a hit moves
//! that class's oldest block or a block is freed, so the check reads no
//! class.
//!
//! A class whose queue empties keeps its buffer and token, so a size that
//! comes back costs no allocation and a hit updates no count of empty
//! classes. Empty classes are swept (dropped, with their tokens, in one
//! O(classes) pass) when a new class would take the number of classes past
//! twice what was left after the last sweep plus `SWEEP_SLACK` (so the
//! sweep is paid for by the insertions since, O(1) amortised, and classes
//! stay within twice the peak of live ones), when an eviction or trim
//! empties a class and leaves fewer blocks than half the classes (paid for
//! by the frees since the last sweep), and when the cache decays to
//! nothing.
//!
//! Bookkeeping follows the cache down, never on the hit path: a sweep
//! shrinks the table and the heap to fit once the classes left fill a
//! quarter of them or less (down to room for `SWEEP_SLACK` classes), and an
//! eviction or trim shrinks a class's ring buffer to twice its blocks once
//! a quarter of it or less is used. After a million distinct sizes decay or are trimmed, a few
//! kilobytes stay (they held 161 MB).

use core::cmp::Ordering;
use core::mem::MaybeUninit;
use core::time::Duration;
use std::collections::BinaryHeap;
use std::collections::binary_heap::PeekMut;

use hashbrown::HashMap;

use super::classes::{Classes, Keyed};
use super::ring::Ring;
use super::{Store, TakenBytes};
use crate::policy::{EvictionPolicy, FreeReason, Oldest, Policy, Reuse, sealed};

/// Classes added beyond twice the number left by the last sweep before the
/// next one.
const SWEEP_SLACK: usize = 64;

/// A time as nanoseconds since the clock's origin (saturating: 584 years).
#[inline]
fn nanos(t: Duration) -> u64 {
    t.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(t.subsec_nanos()))
}

/// A cached block, when it was released, and its release number.
struct Item<B> {
    block: B,
    at: u64,
    seq: u64,
}

/// A size class: its cached blocks in release order.
///
/// Aligned to a cache line (64 bytes for a pointer-sized block), so a
/// bucket of the table is one line: with the newest block kept in the
/// bucket itself, a LIFO round trip on a class touches that line and
/// nothing else.
#[repr(align(64))]
struct Class<B> {
    size: usize,
    items: Blocks<B>,
}

const _: () = assert!(core::mem::size_of::<Class<usize>>() == 64);
// `examples/metadata.rs` prints the layout's floor from these sizes.
const _: () = assert!(core::mem::size_of::<Item<usize>>() == 24);
const _: () = assert!(core::mem::size_of::<Token>() == 24);

/// A class's cached blocks in release order: the newest in the class
/// itself, the older ones in a ring buffer that a LIFO round trip does not
/// touch.
struct Blocks<B> {
    older: Ring<Item<B>>,
    /// The newest block, initialised when `state` has [`NEWEST`].
    newest: MaybeUninit<Item<B>>,
    /// [`NEWEST`], [`TOKEN`] and [`IN_RING`]: in one byte, so that a
    /// release tests with one comparison that the class has its token and
    /// no block in itself (a round trip's release).
    state: u8,
    /// The class is in a FIFO store: read by a release that finds a block
    /// in the class itself or in its ring (`push_back`). Kept here, in the
    /// bucket's padding, rather than read from the store, so that a
    /// round trip's release does not keep it in a register.
    fifo: bool,
}

/// `Blocks::state`: the newest block is in the class itself.
const NEWEST: u8 = 1;
/// `Blocks::state`: the class has a token in the heap.
const TOKEN: u8 = 2;
/// `Blocks::state`: a FIFO class keeps its blocks in its ring, so a
/// release there appends to the ring (see `Blocks::push_back`). Never
/// with [`NEWEST`]; it may outlast the ring's last block (the next
/// release then finds the ring empty).
const IN_RING: u8 = 4;

impl<B> Blocks<B> {
    /// An empty class's blocks, in a FIFO store if `fifo`.
    fn new(fifo: bool) -> Self {
        Blocks {
            older: Ring::new(),
            newest: MaybeUninit::uninit(),
            state: 0,
            fifo,
        }
    }

    /// Whether the newest block is in the class itself.
    #[inline(always)]
    fn has_newest(&self) -> bool {
        self.state & NEWEST != 0
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        // One test of one word.
        (self.older.len() | usize::from(self.state & NEWEST)) == 0
    }

    /// The number of blocks.
    #[inline]
    fn len(&self) -> usize {
        usize::from(self.state & NEWEST) + self.older.len()
    }

    /// The newest block, if it is in the class itself.
    #[inline(always)]
    fn newest(&self) -> Option<&Item<B>> {
        // SAFETY: `newest` is initialised while `state` has `NEWEST`.
        self.has_newest()
            .then(|| unsafe { self.newest.assume_init_ref() })
    }

    /// Takes the newest block out of the class itself.
    #[inline(always)]
    fn take_newest(&mut self) -> Option<Item<B>> {
        if !self.has_newest() {
            return None;
        }
        // A class that holds a block has its token (every release gives
        // it one, and the heap drops only those of empty classes): one
        // store.
        debug_assert!(self.has_token(), "a class with blocks has its token");
        self.state = TOKEN;
        // SAFETY: `newest` was initialised (`NEWEST`), and is read out
        // once: `state` no longer has `NEWEST`.
        Some(unsafe { self.newest.assume_init_read() })
    }

    /// Appends the newest block and gives the class a token: answers
    /// whether it had one (if not, the caller pushes it).
    ///
    /// LIFO, in the class itself. FIFO (`Blocks::fifo`), in the class itself
    /// only if the class is empty, else in the ring with the others (the
    /// class's block moves there too, and the state gets [`IN_RING`]): so
    /// a FIFO class's block in the class itself is its only one, and a
    /// hit that finds a block there takes it whatever the reuse order.
    #[inline(always)]
    fn push_back(&mut self, item: Item<B>) -> bool {
        let had_token = if self.state == TOKEN {
            // The round trip's release (a token, no block in the class
            // itself, and for FIFO none in the ring, or the state would
            // have `IN_RING`): one comparison, and nothing moves.
            true
        } else {
            if self.fifo && (self.has_newest() || !self.older.is_empty()) {
                if let Some(before) = self.take_newest() {
                    self.older.push_back(before);
                }
                self.older.push_back(item);
                self.state = TOKEN | IN_RING;
                return true;
            }
            if let Some(before) = self.take_newest() {
                self.older.push_back(before);
            }
            self.has_token()
        };
        self.newest = MaybeUninit::new(item);
        self.state = NEWEST | TOKEN;
        had_token
    }

    /// Appends the newest block in the ring, unless the class has no token
    /// (see [`Mode`]): a class that keeps its blocks in its ring finds the
    /// newest one there at each hit, where `push_back` would move it to the
    /// class itself and back. Gives the class a token, as `push_back`.
    #[inline(always)]
    fn push_back_ring_first(&mut self, item: Item<B>) -> bool {
        // A token and no block in the class itself (a batch's release):
        // one comparison. The ring may be empty (the class emptied, its
        // token still queued); the block then opens it.
        if self.state == TOKEN {
            self.older.push_back_lifo(item);
            return true;
        }
        if let Some(before) = self.take_newest() {
            self.older.push_back_lifo(before);
            self.older.push_back_lifo(item);
            return true;
        }
        // In a LIFO store, no token, so no block: the class itself holds
        // it, as `push_back` would. (A FIFO class's state, which a LIFO
        // store never has, may have a token and blocks in the ring; the
        // block goes after them all the same.)
        let had_token = self.has_token();
        self.newest = MaybeUninit::new(item);
        self.state = NEWEST | TOKEN;
        had_token
    }

    /// Removes the oldest block.
    #[inline(always)]
    fn pop_front(&mut self) -> Option<Item<B>> {
        if self.older.is_empty() {
            self.take_newest()
        } else {
            self.older.pop_front()
        }
    }

    /// The oldest block.
    #[inline]
    fn front(&self) -> Option<&Item<B>> {
        self.older.front().or(self.newest())
    }

    /// The blocks, oldest first.
    fn iter(&self) -> impl Iterator<Item = &Item<B>> {
        self.older.iter().chain(self.newest())
    }

    /// Whether the class has a token in the heap.
    #[inline(always)]
    fn has_token(&self) -> bool {
        self.state & TOKEN != 0
    }

    /// The class's token left the heap.
    #[inline(always)]
    fn lose_token(&mut self) {
        self.state &= !TOKEN;
    }
}

impl<B> Drop for Blocks<B> {
    fn drop(&mut self) {
        drop(self.take_newest());
    }
}

/// Where a LIFO store's releases put a class's newest block: in the class
/// itself (*bucket first*, the default: a round trip then touches the
/// class's bucket only), or, while that would make the hits' choice
/// between the bucket and the ring unpredictable, as in batches, in the
/// class's ring (*ring first*: `Blocks::push_back_ring_first`, where a
/// class's hits all find their block).
///
/// Bucket first, a store counts the hits served from a ring right after a
/// hit served from a class itself: switches that a predictor cannot see
/// coming when they are frequent (a round trip is always served from the
/// class itself and counts nothing). Every [`SWITCHES`] of them it goes
/// ring first if they were at least one hit in [`SWITCHES`] since it last
/// chose. Ring first, it counts nothing, and after [`RING_FIRST_HITS`]
/// hits served from rings it goes bucket first again, to measure afresh.
/// (Ring first, a hit finds its block in the class itself only if the
/// class had lost its token when it was last released to: once in a
/// while at most.)
struct Mode {
    ring_first: bool,
    /// While ring first, the hits served from rings left before the store
    /// goes bucket first again (counted down: one instruction and a branch
    /// a hit).
    left: u64,
    /// While bucket first: switches counted, the hit count after the last
    /// hit served from a ring, and the hit count at the last choice.
    switches: u64,
    after_ring: u64,
    mark: u64,
}

/// Switches (see [`Mode`]) per choice, and the fewest per hit that make a
/// store go ring first: one in this many.
const SWITCHES: u64 = 8;

/// Hits a store stays ring first before it measures again.
const RING_FIRST_HITS: u64 = 1024;

impl Mode {
    /// A store that has measured nothing.
    fn new() -> Self {
        Mode {
            ring_first: false,
            left: 0,
            switches: 0,
            after_ring: 0,
            mark: 0,
        }
    }

    /// A hit served from a ring while branching; `taken` counts the hits
    /// before this one.
    #[inline(always)]
    fn ring_hit(&mut self, taken: u64) {
        if taken != self.after_ring {
            self.switches += 1;
            if self.switches % SWITCHES == 0 {
                self.choose(taken + 1);
            }
        }
        self.after_ring = taken + 1;
    }

    /// Goes ring first if the switches since the last choice were one hit in
    /// [`SWITCHES`] or more; `taken` counts the hits, this one included.
    // Inlined, though rare: a call on the hit path would make it keep its
    // values where the call cannot clobber them, at every hit.
    #[inline(always)]
    fn choose(&mut self, taken: u64) {
        let hits = taken - self.mark;
        self.mark = taken;
        if SWITCHES * SWITCHES >= hits {
            self.ring_first = true;
            self.left = RING_FIRST_HITS;
        }
    }

    /// Goes bucket first again after a spell ring first, to measure afresh; `taken`
    /// counts the hits before this one.
    // Inlined, though rare: a call on the hit path would make it keep its
    // values where the call cannot clobber them, at every hit.
    #[inline(always)]
    fn measure(&mut self, taken: u64) {
        self.ring_first = false;
        self.mark = taken;
        self.after_ring = taken;
    }
}

/// Forgets the store's planned deadline (`TimedStore::not_before`) and
/// stops planning (`TimedStore::untold`) when dropped. Armed while a policy
/// hook runs and disarmed (`mem::forget`) once it returns: a hook that
/// unwinds may leave the policy's view of the cache apart from the store's
/// (a released block stays cached although the policy never counted it),
/// and a deadline planned on either view could then skip an eviction or a
/// correction of the policy that is due. Asking the policy at every check
/// is always safe.
struct Replan<'a> {
    not_before: &'a mut u64,
    untold: &'a mut bool,
}

impl Drop for Replan<'_> {
    #[cold]
    fn drop(&mut self) {
        *self.not_before = 0;
        *self.untold = true;
    }
}

/// A class's place in the eviction order: no later than its oldest block.
#[derive(Clone, Copy, Debug)]
struct Token {
    seq: u64,
    at: u64,
    size: usize,
}

// The heap is a max-heap: the earliest release number is the greatest.
impl Ord for Token {
    fn cmp(&self, other: &Self) -> Ordering {
        other.seq.cmp(&self.seq)
    }
}

impl PartialOrd for Token {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}

impl Eq for Token {}

impl<B> Keyed for Class<B> {
    #[inline(always)]
    fn size(&self) -> usize {
        self.size
    }

    fn sentinel() -> Self {
        Class {
            size: 0,
            items: Blocks::new(false),
        }
    }
}

/// The timed store: see the module documentation.
///
/// `repr(C)` keeps the counters a hit and a release both update apart:
/// laid out side by side, the compiler updates them with one 16-byte access
/// in one call and two 8-byte ones in the other, and the wide load that
/// follows narrow stores cannot be forwarded (a stall on every round trip).
#[repr(C)]
pub struct TimedStore<B, P> {
    /// Blocks taken by hits, and their bytes (saturating): the pool's
    /// `hits` and `bytes_from_pool`. The number of cached blocks is
    /// `puts - taken - popped`, so a hit writes three counters and a
    /// release two.
    taken: u64,
    taken_bytes: TakenBytes,
    classes: Classes<Class<B>>,
    /// Blocks released into the store (the next release number).
    puts: u64,
    heap: BinaryHeap<Token>,
    /// Cached bytes (apart from `puts`, which a release also updates).
    bytes: usize,
    /// Blocks evicted or trimmed.
    popped: u64,
    /// The policy's deadline (nanoseconds) for the oldest block when it was
    /// last checked: nothing is due before it. Reset whenever a block is
    /// freed, and after a release or a hit that the policy says made it
    /// stale; a hit on the oldest block leaves it (too early is safe).
    not_before: u64,
    /// A policy hook unwound, so the policy may not have counted every
    /// cached block: no deadline is planned (every check asks the policy)
    /// until the cache next empties through frees, when both views agree
    /// again.
    untold: bool,
    /// The number of classes at which the next insertion first sweeps the
    /// empty ones.
    sweep_at: usize,
    /// The class of the top token when it is known to name that class's
    /// oldest block (the oldest of all); 0 when not known. Known only
    /// while no deadline is planned (`not_before` is 0): a policy with
    /// deadlines comes to the oldest block once per deadline, a policy
    /// without at every operation. So a hit that finds a deadline ahead
    /// of it has nothing to forget, and the pool's inline hit, which has
    /// just compared the time with `not_before`, tests nothing for it.
    top_class: usize,
    /// Where releases put a class's newest block.
    mode: Mode,
    reuse: Reuse,
    policy: P,
}

impl<B, P: EvictionPolicy> TimedStore<B, P> {
    /// The policy, read-only.
    pub(crate) fn policy(&self) -> &P {
        &self.policy
    }

    pub(crate) fn new(policy: P, reuse: Reuse) -> Self {
        TimedStore {
            policy,
            reuse,
            classes: Classes::new(),
            sweep_at: SWEEP_SLACK,
            heap: BinaryHeap::new(),
            puts: 0,
            bytes: 0,
            popped: 0,
            taken: 0,
            taken_bytes: TakenBytes::default(),
            not_before: 0,
            untold: false,
            top_class: 0,
            mode: Mode::new(),
        }
    }

    /// Adds the class of `size`, first sweeping the empty classes when
    /// there are twice as many classes as after the last sweep (plus
    /// `SWEEP_SLACK`): the sweep is paid for by the insertions since.
    #[cold]
    #[inline(never)]
    fn new_class(&mut self, size: usize) -> &mut Class<B> {
        if self.classes.len() >= self.sweep_at {
            self.sweep();
        }
        let fifo = self.reuse == Reuse::Fifo;
        self.classes.insert(Class {
            size,
            items: Blocks::new(fifo),
        })
    }

    /// Drops every empty class, with its buffer and its token; then gives
    /// back the table's and the heap's capacity if they are more than
    /// four times what the classes left need (the cache shrank far below
    /// its peak).
    #[cold]
    #[inline(never)]
    fn sweep(&mut self) {
        self.classes.retain(|class| !class.items.is_empty());
        let classes = &self.classes;
        self.heap.retain(|t| classes.get(t.size).is_some());
        let live = self.classes.len();
        self.sweep_at = live * 2 + SWEEP_SLACK;
        self.top_class = 0;
        // Shrunk to fit the classes left (at least `SWEEP_SLACK`) once
        // they fill a quarter of it or less: the next shrink takes half of
        // them to go first, and regrowing is paid for by the insertions.
        let keep = live.max(SWEEP_SLACK);
        if self.classes.capacity() > keep * 4 {
            self.classes.shrink_to(keep);
        }
        if self.heap.capacity() > keep * 4 {
            self.heap.shrink_to(keep);
        }
    }

    /// The class size and release time of the oldest cached block: brings
    /// stale tokens at the top of the heap up to date and drops those of
    /// empty classes.
    #[inline]
    fn oldest(&mut self) -> Option<(usize, u64)> {
        if self.top_class != 0 {
            return self.heap.peek().map(|t| (t.size, t.at));
        }
        loop {
            let mut top = self.heap.peek_mut()?;
            let class = self
                .classes
                .get_mut(top.size)
                .expect("a token for a class that is gone");
            match class.items.front() {
                Some(front) if front.seq == top.seq => {
                    if self.not_before == 0 {
                        self.top_class = top.size;
                    }
                    return Some((top.size, top.at));
                }
                Some(front) => {
                    // Dropping `top` restores the heap order.
                    top.seq = front.seq;
                    top.at = front.at;
                }
                None => {
                    class.items.lose_token();
                    PeekMut::pop(top);
                }
            }
        }
    }

    /// Frees the oldest block, of class `size`, which [`oldest`] found.
    /// The policy is told first, so a panic in it changes nothing.
    #[inline]
    fn remove_oldest(&mut self, size: usize, now: u64, reason: FreeReason) -> (B, usize) {
        let now = Duration::from_nanos(now);
        self.policy.on_free(now, size, self.bytes() - size, reason);
        let freed = self.remove_oldest_untold(size);
        if self.len() == 0 {
            // Every block left through a told free: the policy's view of
            // the (empty) cache and the store's agree again.
            self.untold = false;
        }
        freed
    }

    /// `remove_oldest` without telling the policy.
    #[inline]
    fn remove_oldest_untold(&mut self, size: usize) -> (B, usize) {
        self.not_before = 0;
        self.top_class = 0;
        let items = &mut self
            .classes
            .get_mut(size)
            .expect("the oldest block's class is gone")
            .items;
        let item = items
            .pop_front()
            .expect("the oldest block's class is empty");
        let emptied = items.is_empty();
        // A class's buffer shrinks to twice its blocks once a quarter of
        // it or less is used.
        items.older.shrink();
        self.popped += 1;
        self.bytes -= size;
        let (len, classes) = (self.len(), self.classes.len());
        if len == 0 || (emptied && classes > SWEEP_SLACK && classes > len * 2) {
            // Decayed to nothing, or to fewer blocks than half the
            // classes: the empty classes go, and the table and heap shrink.
            // After a sweep every class holds a block, so the next one
            // here takes half of them to empty first (or new classes, each
            // paid for by its release): O(1) amortised.
            self.sweep();
        }
        (item.block, size)
    }

    /// Bytes of heap memory the store's structures hold (approximate for
    /// the table: its buckets and control bytes).
    #[cfg(any(test, feature = "testing"))]
    fn heap_bytes(&self) -> usize {
        let cap = self.classes.capacity();
        let buckets = match cap {
            0 => 0,
            1..8 => (cap + 1).next_power_of_two(),
            _ => (cap * 8 / 7).next_power_of_two(),
        };
        let table = match buckets {
            0 => 0,
            // Each bucket holds a class and a control byte; one more group
            // of control bytes mirrors the first.
            b => b * (core::mem::size_of::<Class<B>>() + 1) + 16,
        };
        let heap = self.heap.capacity() * core::mem::size_of::<Token>();
        let rings: usize = self
            .classes
            .iter()
            .map(|c| c.items.older.capacity() * core::mem::size_of::<Item<B>>())
            .sum();
        table + heap + rings
    }
}

impl<B, P: EvictionPolicy> TimedStore<B, P> {
    /// `take`, whose hook is `on_hit` or, `INLINE`, `try_on_hit`, which
    /// may answer that the hit goes out of line (then `None`, with nothing
    /// changed).
    #[inline(always)]
    fn take_hooked<const INLINE: bool>(&mut self, class: usize, now: u64) -> Option<B> {
        // A deadline ahead: the oldest class is not known (`top_class`).
        // Read first, so that the pool's inline hit folds it into its own
        // eviction check.
        let planned = now < self.not_before;
        let before = self.bytes();
        let cls = self.classes.find(class)?;
        let now = Duration::from_nanos(now);
        // Tells the policy of the hit, or returns `None` when `try_on_hit`
        // sends it out of line (nothing changed). Told before the take, so
        // a panic in the policy changes nothing in the store but its
        // planned deadline, which it forgets.
        //
        // A macro, written out in both branches below: the test of the
        // newest block then both finds the class not empty and chooses
        // the take. Told once before that choice, the test was made again
        // after the policy's tests (`Exponential`: 129 against 127
        // instructions a round trip, `examples/instructions.rs`); a
        // function taking the fields by reference cost more (138).
        macro_rules! tell {
            () => {{
                let replan = Replan {
                    not_before: &mut self.not_before,
                    untold: &mut self.untold,
                };
                if INLINE {
                    if !self.policy.try_on_hit(now, class, before, before - class) {
                        // Nothing changed: the pool takes it from out of line.
                        core::mem::forget(replan);
                        return None;
                    }
                } else {
                    self.policy.on_hit(now, class, before, before - class);
                }
                if self.policy.deadline_stale() {
                    *replan.not_before = 0;
                }
                core::mem::forget(replan);
            }};
        }
        // The newest block first: a class holding it in the class itself
        // (as every round trip's does) is known not to be empty with one
        // test, and its block is taken whatever the reuse order (a FIFO
        // class holds one there only when it is its only block,
        // `Blocks::push_back`). The block is taken before the mode counts
        // the hit, so that no store comes between the test that the class
        // is not empty and the take, which then tests nothing again. In
        // the ring, the mode is tested first (a batch's hit, ring first).
        let item = if cls.items.has_newest() {
            tell!();
            cls.items.take_newest()
        } else {
            if cls.items.older.is_empty() {
                return None;
            }
            tell!();
            if self.mode.ring_first {
                let item = cls.items.older.pop_back();
                self.mode.left -= 1;
                if self.mode.left == 0 {
                    self.mode.measure(self.taken);
                }
                item
            } else if self.reuse == Reuse::Lifo {
                // Bucket first.
                let item = cls.items.older.pop_back();
                self.mode.ring_hit(self.taken);
                item
            } else {
                cls.items.pop_front()
            }
        };
        let Some(item) = item else {
            unreachable!("a non-empty class has a block")
        };
        if !planned
            && self.top_class == class
            && (cls.items.is_empty() || self.reuse == Reuse::Fifo)
        {
            // The oldest block of all moved (tested first: no store on the
            // hit path when there is nothing to forget).
            self.top_class = 0;
        }
        self.taken += 1;
        self.taken_bytes.add(class);
        self.bytes = before - class;
        Some(item.block)
    }
}

impl<B, P: EvictionPolicy> Store<B> for TimedStore<B, P> {
    const TIMED: bool = true;

    // Always inlined: the hit path is a handful of loads and stores, and
    // a call would cost as much again.
    #[inline(always)]
    fn take(&mut self, class: usize, now: u64) -> Option<B> {
        self.take_hooked::<false>(class, now)
    }

    #[inline(always)]
    fn take_inline(&mut self, class: usize, now: u64) -> Option<B> {
        self.take_hooked::<true>(class, now)
    }

    // Always inlined: the hit path is a handful of loads and stores, and
    // a call would cost as much again.
    #[inline(always)]
    fn put(&mut self, block: B, class: usize, now: u64) -> Option<(B, usize)> {
        let seq = self.puts;
        self.puts += 1;
        self.bytes += class;
        let at = now;
        // One test of the mode for both the lookup and the append.
        let had_token = if self.mode.ring_first {
            // Ring first (batches), a release rarely follows a hit of its
            // size, and a test of the last class found would be
            // mispredicted whenever it does: the release looks its class
            // up.
            let cls = match self.classes.find(class) {
                Some(cls) => cls,
                None => self.new_class(class),
            };
            cls.items.push_back_ring_first(Item { block, at, seq })
        } else {
            let cls = match self.classes.get_mut(class) {
                Some(cls) => cls,
                None => self.new_class(class),
            };
            cls.items.push_back(Item { block, at, seq })
        };
        if !had_token {
            // The largest key yet: one comparison to place it.
            self.heap.push(Token {
                seq,
                at,
                size: class,
            });
        }
        // The block stays cached if the policy panics here, unknown to it:
        // the deadline planned without it is forgotten.
        let bytes = self.bytes;
        let replan = Replan {
            not_before: &mut self.not_before,
            untold: &mut self.untold,
        };
        self.policy
            .on_release(Duration::from_nanos(now), class, bytes);
        if self.policy.deadline_stale() {
            *replan.not_before = 0;
        }
        core::mem::forget(replan);
        None
    }

    // Always inlined: the hit path is a handful of loads and stores, and
    // a call would cost as much again.
    #[inline(always)]
    fn evict_due(&mut self, now: u64) -> Option<(B, usize)> {
        if now < self.not_before {
            return None;
        }
        self.evict_due_slow(now)
    }

    #[inline(always)]
    fn may_evict(&self, now: u64) -> bool {
        now >= self.not_before
    }

    #[inline(always)]
    fn evict_due_inline(&mut self, now: u64) -> Option<(B, usize)> {
        if now < self.not_before {
            return None;
        }
        self.check_policy(now)
    }

    #[cfg(debug_assertions)]
    fn check_deadline(&mut self, now: u64) {
        if now >= self.not_before {
            // The collection asks the policy itself.
            return;
        }
        let Some((size, at)) = self.oldest() else {
            return;
        };
        let oldest = Oldest {
            released_at: Duration::from_nanos(at),
            size,
        };
        let now_d = Duration::from_nanos(now);
        // The cached deadline may be stale after the clock was set back (a
        // block released "later" at an earlier time): only the policy's
        // deadline for the block now oldest is held against it.
        let Some(deadline) = self
            .policy
            .provisional_deadline(oldest)
            .filter(|&d| d > now_d)
        else {
            return;
        };
        if self.policy.must_evict(now_d, oldest, self.bytes()) {
            panic!(
                "EvictionPolicy::deadline disagrees with must_evict: the policy's deadline \
                 was {deadline:?}, yet at {now_d:?} must_evict wants the oldest block \
                 ({size} bytes, released at {:?}) freed; the pool skips must_evict until \
                 the deadline, so this block would not be evicted. `deadline` must return \
                 a time before which `must_evict` answers false (or None, the default)",
                oldest.released_at
            );
        }
        // `must_evict` planned again (an `Exponential` sets its watch for
        // the plan it makes): the deadline kept is the policy's new one, as
        // after any check, else a later release is held against a watch
        // for a deadline other than the one the store keeps (a debug build
        // then skipped the eviction of a due block). Forgotten first, so
        // that a policy that panics here leaves none.
        self.not_before = 0;
        let deadline = self.policy.provisional_deadline(oldest).map_or(0, nanos);
        if !self.untold {
            self.not_before = deadline;
            if deadline != 0 {
                self.top_class = 0;
            }
        }
    }

    fn pop_oldest(&mut self, now: u64) -> Option<(B, usize)> {
        let (size, _) = self.oldest()?;
        Some(self.remove_oldest(size, now, FreeReason::Trimmed))
    }

    fn pop_untold(&mut self) -> Option<(B, usize)> {
        let (size, _) = self.oldest()?;
        Some(self.remove_oldest_untold(size))
    }

    #[inline]
    fn len(&self) -> usize {
        (self.puts - self.taken - self.popped) as usize
    }

    #[inline]
    fn bytes(&self) -> usize {
        self.bytes
    }

    #[inline]
    fn taken(&self) -> (u64, u64) {
        (self.taken, self.taken_bytes.get())
    }

    #[cfg(any(test, feature = "testing"))]
    fn footprint(&self) -> usize {
        self.heap_bytes()
    }

    fn cached_of(&self, class: usize) -> usize {
        self.classes.get(class).map_or(0, |c| c.items.len())
    }

    fn check(&self) {
        assert!(
            self.classes.len() <= self.sweep_at,
            "empty classes were not swept"
        );
        assert!(
            self.reuse == Reuse::Lifo || !self.mode.ring_first,
            "a FIFO store ring first"
        );
        // Blocks: counted, in release order within each class.
        let (mut len, mut bytes) = (0usize, 0usize);
        let mut sizes = HashMap::new();
        for class in self.classes.iter() {
            let size = class.size;
            assert!(size > 0, "a class of zero bytes");
            if self.reuse == Reuse::Fifo && class.items.has_newest() {
                // A hit takes the block in the class itself, whatever the
                // reuse order.
                assert!(
                    class.items.older.is_empty(),
                    "a FIFO class of {size} bytes with blocks both in itself and in its ring"
                );
            }
            assert!(
                class.items.state & (NEWEST | IN_RING) != NEWEST | IN_RING,
                "class {size} is marked in its ring with a block in itself"
            );
            assert!(
                sizes.insert(size, ()).is_none(),
                "two classes of {size} bytes"
            );
            let mut last: Option<&Item<B>> = None;
            for item in class.items.iter() {
                assert!(item.seq < self.puts, "release number from the future");
                if let Some(l) = last {
                    assert!(item.seq > l.seq, "class queue out of release order");
                }
                last = Some(item);
                len += 1;
                bytes += size;
            }
        }
        assert_eq!(len, self.len(), "cached block count");
        assert_eq!(bytes, self.bytes(), "cached byte count");
        // Tokens: one per queued class, never later than its oldest block;
        // every class with blocks is queued.
        let mut tokens = HashMap::new();
        for t in self.heap.iter() {
            assert!(
                tokens.insert(t.size, *t).is_none(),
                "class {} has two tokens",
                t.size
            );
            let class = self
                .classes
                .get(t.size)
                .unwrap_or_else(|| panic!("token for class {} that is gone", t.size));
            assert!(
                class.items.has_token(),
                "token for unqueued class {}",
                t.size
            );
            if let Some(front) = class.items.front() {
                assert!(t.seq <= front.seq, "token of class {} is late", t.size);
                // A stale token's time means nothing (a clock set back may
                // have released later blocks at earlier times); an up to
                // date one carries its block's.
                if t.seq == front.seq {
                    assert_eq!(t.at, front.at, "token time of class {}", t.size);
                }
            }
        }
        if self.top_class != 0 {
            assert_eq!(
                self.not_before, 0,
                "the top class is known under a deadline"
            );
            let top = self
                .heap
                .peek()
                .expect("a valid top token in an empty heap");
            assert_eq!(top.size, self.top_class, "the top token's class");
            let front = self
                .classes
                .get(top.size)
                .expect("the top token's class is gone")
                .items
                .front();
            assert_eq!(
                front.map(|f| (f.seq, f.at)),
                Some((top.seq, top.at)),
                "the top token is marked up to date but is not"
            );
        }
        for class in self.classes.iter() {
            let size = class.size;
            assert_eq!(
                class.items.has_token(),
                tokens.contains_key(&size),
                "class {size} token mark"
            );
            if !class.items.is_empty() {
                assert!(
                    class.items.has_token(),
                    "class {size} holds blocks but has no token"
                );
            }
        }
    }
}

impl<B, P: EvictionPolicy> TimedStore<B, P> {
    /// The eviction check once its deadline has passed (every call, for a
    /// policy without deadlines): out of line, as the allocations' path
    /// calls it.
    #[inline(never)]
    fn evict_due_slow(&mut self, now: u64) -> Option<(B, usize)> {
        self.check_policy(now)
    }

    /// The body of [`evict_due_slow`](Self::evict_due_slow), inlined into
    /// a release's collection (`Store::evict_due_inline`), itself out of
    /// line.
    #[inline(always)]
    fn check_policy(&mut self, now: u64) -> Option<(B, usize)> {
        let (size, at) = self.oldest()?;
        let oldest = Oldest {
            released_at: Duration::from_nanos(at),
            size,
        };
        if self
            .policy
            .must_evict(Duration::from_nanos(now), oldest, self.bytes())
        {
            Some(self.remove_oldest(size, now, FreeReason::Expired))
        } else {
            // Asked even when not kept, so the policy sees the same calls.
            let deadline = self.policy.provisional_deadline(oldest).map_or(0, nanos);
            if !self.untold {
                self.not_before = deadline;
                if deadline != 0 {
                    self.top_class = 0;
                }
            }
            None
        }
    }
}

impl<P: EvictionPolicy> sealed::Sealed for P {}

/// Every timed policy runs on the timed store.
impl<P: EvictionPolicy> Policy for P {
    type Store<B> = TimedStore<B, P>;

    fn into_store<B>(self, reuse: Reuse) -> Self::Store<B> {
        TimedStore::new(self, reuse)
    }
}

#[cfg(test)]
mod tests {
    use super::{Blocks, Item, RING_FIRST_HITS, Store, TimedStore};
    use crate::policy::{FixedTime, Reuse};
    use core::time::Duration;
    use std::collections::VecDeque;
    use std::rc::Rc;

    fn item(n: u64, alive: &Rc<()>) -> Item<(u64, Rc<()>)> {
        Item {
            block: (n, Rc::clone(alive)),
            at: n,
            seq: n,
        }
    }

    /// A class's blocks against `VecDeque` over a fixed pseudo-random mix
    /// of releases and hits, bucket first and ring first (the ring both
    /// full and not), with blocks that count their drops, and its token
    /// mark against a flag.
    #[test]
    fn a_class_keeps_release_order_bucket_first_and_ring_first() {
        let alive = Rc::new(());
        let mut blocks = Blocks::new(false);
        let mut model = VecDeque::new();
        // Whether the class has a token: every release gives it one (and
        // answers whether it had one); the heap takes it from an empty
        // class only.
        let mut token = false;
        let mut x: u64 = 11;
        let steps = if cfg!(miri) { 2_000 } else { 20_000 };
        for n in 0..steps {
            crate::store::lcg(&mut x);
            // More releases than hits, so the ring fills and grows too.
            match (x >> 59) % 8 {
                0 | 1 => {
                    // Both appends of the bucket-first store, LIFO and
                    // FIFO, mixed: either keeps the release order.
                    blocks.fifo = x & (1 << 30) != 0;
                    assert_eq!(blocks.push_back(item(n, &alive)), token);
                    token = true;
                    model.push_back(n);
                }
                2..=4 => {
                    assert_eq!(blocks.push_back_ring_first(item(n, &alive)), token);
                    token = true;
                    model.push_back(n);
                }
                5 | 6 => {
                    // A LIFO hit: the class itself first, else the ring.
                    let got = blocks.take_newest().or_else(|| blocks.older.pop_back());
                    assert_eq!(got.map(|i| i.block.0), model.pop_back());
                }
                _ => assert_eq!(blocks.pop_front().map(|i| i.block.0), model.pop_front()),
            }
            if n % 256 == 255 {
                // Now and then the class empties (and may lose its token),
                // so that releases to an empty class with and without
                // one come up under both modes.
                while let Some(i) = blocks.pop_front() {
                    assert_eq!(Some(i.block.0), model.pop_front());
                }
            }
            if model.is_empty() && x & (1 << 20) != 0 {
                blocks.lose_token();
                token = false;
            }
            assert_eq!(blocks.has_token(), token, "token at step {n}");
            assert_eq!(blocks.len(), model.len());
            assert_eq!(blocks.is_empty(), model.is_empty());
            assert_eq!(blocks.front().map(|i| i.block.0), model.front().copied());
            assert_eq!(Rc::strong_count(&alive), model.len() + 1);
        }
        assert!(blocks.iter().map(|i| i.block.0).eq(model.iter().copied()));
        drop(blocks);
        assert_eq!(Rc::strong_count(&alive), 1, "each block dropped once");
    }

    fn store() -> TimedStore<u64, FixedTime> {
        TimedStore::new(FixedTime::new(Duration::from_secs(3600)), Reuse::Lifo)
    }

    /// A store with 8 classes of 16 blocks, and a stack per class of the
    /// blocks it holds (newest last).
    fn filled() -> (TimedStore<u64, FixedTime>, Vec<Vec<u64>>) {
        let mut s = store();
        let mut model: Vec<Vec<u64>> = vec![Vec::new(); 8];
        let mut next = 0;
        for (c, stack) in model.iter_mut().enumerate() {
            for _ in 0..16 {
                assert!(s.put(next, class(c), 0).is_none());
                stack.push(next);
                next += 1;
            }
        }
        (s, model)
    }

    fn class(c: usize) -> usize {
        64 * (c + 1)
    }

    /// Takes then releases a block of each class of `classes` in turn,
    /// checking that each hit hands out its class's newest block.
    fn run(s: &mut TimedStore<u64, FixedTime>, model: &mut [Vec<u64>], classes: &[usize]) {
        let mut held = Vec::new();
        for &c in classes {
            let b = s.take(class(c), 0).expect("a cached block");
            assert_eq!(Some(b), model[c].pop(), "the newest block of its class");
            held.push((b, c));
        }
        for (b, c) in held {
            assert!(s.put(b, class(c), 0).is_none());
            model[c].push(b);
        }
    }

    /// Batches (16 hits over 8 classes, then their releases) make a store
    /// go ring first, where each class keeps its newest block in its ring;
    /// round trips make it go bucket first once it measures again; the
    /// newest block of a class comes back first either way.
    #[test]
    fn batches_go_ring_first_and_round_trips_bucket_first() {
        let (mut s, mut model) = filled();
        let mut x: u64 = 5;
        let mut batch = || -> Vec<usize> {
            (0..16)
                .map(|_| {
                    crate::store::lcg(&mut x);
                    (x >> 33) as usize % 8
                })
                .collect()
        };
        assert!(!s.mode.ring_first, "a new store goes bucket first");
        for _ in 0..8 {
            run(&mut s, &mut model, &batch());
        }
        assert!(s.mode.ring_first, "batches go ring first");
        let in_buckets = |s: &TimedStore<u64, FixedTime>| {
            s.classes.iter().filter(|c| c.items.has_newest()).count()
        };
        assert_eq!(
            in_buckets(&s),
            0,
            "every class hit since holds its blocks in its ring"
        );
        s.check();
        // A spell ring first lasts `RING_FIRST_HITS` hits; round trips count no
        // switch when measured again.
        for n in 0..RING_FIRST_HITS as usize + 100 {
            run(&mut s, &mut model, &[n % 8]);
        }
        assert!(!s.mode.ring_first, "round trips go bucket first again");
        assert_eq!(
            in_buckets(&s),
            8,
            "each class's newest block is in its bucket"
        );
        for _ in 0..8 {
            run(&mut s, &mut model, &batch());
        }
        assert!(s.mode.ring_first, "and batches ring first again");
        s.check();
        assert_eq!(s.len(), 8 * 16);
    }

    /// A FIFO class holds a block in its bucket only when it is its only
    /// one (so a hit that finds one there takes it without testing the
    /// reuse order); from two blocks, all are in its ring, and hits take
    /// them oldest first.
    #[test]
    fn a_fifo_class_of_two_blocks_or_more_keeps_them_in_its_ring() {
        let mut s: TimedStore<u64, FixedTime> =
            TimedStore::new(FixedTime::new(Duration::from_secs(3600)), Reuse::Fifo);
        let items = |s: &TimedStore<u64, FixedTime>, size: usize| {
            let c = s.classes.get(size).expect("the class");
            (c.items.has_newest(), c.items.older.len())
        };
        assert!(s.put(1, 64, 0).is_none());
        assert_eq!(items(&s, 64), (true, 0), "an only block in the bucket");
        assert!(s.put(2, 64, 0).is_none());
        assert_eq!(items(&s, 64), (false, 2), "two blocks in the ring");
        assert!(s.put(3, 64, 0).is_none());
        assert_eq!(items(&s, 64), (false, 3));
        s.check();
        // Round trips take the oldest and append to the ring.
        for (n, oldest) in (1..=6).enumerate() {
            assert_eq!(s.take(64, 0), Some(oldest));
            assert!(s.put(oldest + 3, 64, 0).is_none());
            assert_eq!(items(&s, 64), (false, 3), "round trip {n}");
        }
        // Emptied, the class takes its next block in its bucket again.
        for oldest in 7..=9 {
            assert_eq!(s.take(64, 0), Some(oldest));
        }
        assert_eq!(items(&s, 64), (false, 0));
        assert!(s.put(10, 64, 0).is_none());
        assert_eq!(items(&s, 64), (true, 0));
        assert_eq!(s.take(64, 0), Some(10));
        s.check();
    }

    /// Hits served from a ring in long runs (eight round trips, then eight
    /// blocks of one class) keep a store bucket first: its hits' choice is
    /// predictable there, however many hits the rings serve.
    #[test]
    fn runs_of_ring_hits_stay_bucket_first() {
        let (mut s, mut model) = filled();
        for n in 0..64 {
            for c in 0..8 {
                run(&mut s, &mut model, &[c]);
            }
            run(&mut s, &mut model, &[n % 8; 8]);
            assert!(!s.mode.ring_first);
        }
        s.check();
    }
}
