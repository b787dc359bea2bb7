//! Per-thread caches ("magazines") in front of a
//! [`SharedPool`](crate::SharedPool)'s cache, for pools from
//! [`SharedPool::with_thread_caches`](crate::SharedPool::with_thread_caches).
//!
//! Each thread that allocates from such a pool gets a magazine for it: up
//! to [`MAGAZINE`] idle blocks with their release times at first, in a
//! small table keyed by class ([`MagState`]). The pool keeps
//! every magazine in a list under its cache lock; the thread keeps a table
//! from pool to magazine, which holds the pool weakly (it never keeps a
//! pool alive) and the magazine strongly.
//!
//! The blocks of a magazine are counted in use by the pool's cache: the
//! pool's statistics move them to the cached counts when read. A thread
//! that exits leaves its magazine in the pool's list, where `collect`,
//! `trim`, the limit, the out-of-memory retry and the pool's drop reach it;
//! the next thread to take up the pool adopts it, blocks and all (the one
//! with the most blocks, if several wait), and `collect` drops it from
//! the list once it is empty if none did. A magazine has one owner at a
//! time: it is adopted only while the pool's list alone holds it
//! (`Arc::get_mut`, under the cache lock), so its old owner's table has
//! let it go, and the new owner's reference keeps any other thread from
//! adopting it.
//!
//! A thread that uses more classes than its magazine holds misses in it at
//! many calls, and would pay for the magazine on top of the shared cache:
//! when its misses less its hits and releases taken (weighed by
//! [`MISS_WEIGHT`]) come to [`MISSES_BEFORE_SKIP`], the magazine doubles
//! if a quarter of those misses or more were allocations that found it
//! full, up to [`MAGAZINE_MOST`] blocks; else (or at its most) the thread
//! passes the magazine by for its next [`SKIPPED_OPERATIONS`] calls, then
//! tries it again (see `Skip` and [`Magazine::missed`]). So two threads
//! over a few hundred classes each keep off the shared cache's lock, as
//! over a few dozen; a thread that only releases other threads' blocks
//! keeps a magazine of [`MAGAZINE`] blocks, not more.
//!
//! # Who touches a magazine, and how
//!
//! Two kinds of access reach a magazine's state ([`MagState`]):
//!
//! - the *owner*, the thread whose table holds it, on its `allocate` and
//!   release ([`Magazine::owned`]): the hot path;
//! - *visitors*, any thread (the owner too) inside a pool call that holds
//!   the pool's cache lock, or the pool's drop (`collect`, the reaper,
//!   `trim`, the limit, the retry, `with`, `stats`, the last handle's
//!   drop): [`visit`]. They take `&mut` of the pool's list of magazines,
//!   which the cache lock (or the drop's `&mut`) makes exclusive, so two
//!   visitors never meet on a magazine: each magazine is in one list.
//!
//! Where [`barrier::available`](super::barrier::available) (Linux, not
//! under Miri or the ThreadSanitizer build), the owner takes no lock and
//! does no atomic read-modify-write, only plain loads and stores and a
//! compiler fence, and the visitors pay instead (an asymmetric Dekker
//! handshake):
//!
//! ```text
//! owner                                   visitor
//! busy = true        (relaxed store)      claimed = true     (relaxed store)
//! compiler fence                          membarrier         (barrier::heavy)
//! if claimed (acquire load): give up      wait until !busy   (acquire load)
//! ... work on the state ...               ... work on the state ...
//! busy = false       (release store)      claimed = false    (release store)
//! ```
//!
//! The system call runs a full memory barrier on the owner's processor
//! (or the owner passes one when it is next scheduled) at some point of
//! its instruction stream, after the visitor's `claimed = true` is
//! visible. If that point comes before the owner's `busy = true`, the
//! owner's later load sees `claimed` set (or the visitor's release of it,
//! which it then synchronises with) and it gives up: the call goes to the
//! shared cache, as if the magazine could not serve it. If the point comes
//! after, `busy = true` is visible to the visitor when the call returns,
//! and the visitor waits until the owner's releasing `busy = false`, which
//! its acquiring load synchronises with, so it sees the owner's writes.
//! Either way the two never work on the state at once, and each sees the
//! other's writes. The compiler fence keeps the compiler from moving the
//! owner's load of `claimed` above its store of `busy` (the processor may,
//! through its store buffer; the barrier is what rules that out). The
//! owner never waits, so a visitor waits at most for one owner operation;
//! a visitor waits for nothing but owners. Visiting several magazines at
//! once claims them all, then makes one system call.
//!
//! Where the barrier is not available, owner and visitors alike take the
//! magazine's lock (one atomic read-modify-write each), and neither
//! `busy` nor `claimed` is used. The choice is made for each magazine when
//! it is made ([`Magazine::new`]) and never changes; in a process it is the
//! same for every magazine.

use core::cell::{Cell, RefCell};
use core::hint::spin_loop;
use core::mem::ManuallyDrop;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering, compiler_fence};
use std::sync::{Arc, Weak};
use std::thread;

use super::barrier;
use super::lock::CacheLock;

/// The most blocks a magazine holds at first (the fuzz harness asks for
/// fewer: [`Magazine::new`]).
pub(super) const MAGAZINE: usize = 64;

/// The most blocks a magazine grows to: a thread whose allocations miss
/// in its magazine while it is full (more classes in use than it holds)
/// doubles it, up to this many, before it passes it by (see
/// [`Magazine::missed`]).
pub(super) const MAGAZINE_MOST: usize = 512;

/// Slots of a magazine's table per block it may hold (rounded up to a
/// power of two): a table a quarter full when the magazine is, so that
/// most classes find their blocks at their home slot.
const SLOTS_PER_BLOCK: usize = 4;

/// Misses in a row (allocations the magazine has no block for, releases
/// it is too full to take) after which its owner grows it or passes it
/// by: twice the blocks it holds at first (a batch that fills the
/// magazine misses half as many times, then its releases are taken).
/// Each hit and each release taken counts [`MISS_WEIGHT`] times less than
/// a miss: a run in which the magazine serves fewer than 8 calls in 9
/// grows it or passes it by too.
pub(super) const MISSES_BEFORE_SKIP: u32 = 2 * MAGAZINE as u32;

/// How many hits or releases taken make up for one miss.
///
/// A magazine that serves most calls but not nearly all costs more than
/// none: the processor mispredicts whether a call hits there (over 100
/// classes in a random order, one thread through a magazine that served
/// about two calls in three took twice the time of one through the shared
/// cache alone, and two threads more than the shared cache's time too;
/// `docs/PERFORMANCE.md`, "Tried and dropped").
pub(super) const MISS_WEIGHT: u32 = 8;

/// How many of its owner's operations pass a magazine by, once its count
/// of misses came to [`MISSES_BEFORE_SKIP`].
pub(super) const SKIPPED_OPERATIONS: u32 = 16384;

/// A magazine: its state, and the flags of the owner's lock-free access
/// (see the module documentation). Aligned to a cache line pair, so that
/// two threads' magazines never share a line.
#[repr(align(128))]
pub(super) struct Magazine<B> {
    /// The state; its lock is taken only where `fast` is `false`.
    state: CacheLock<MagState<B>>,
    /// Whether the owner uses the lock-free protocol.
    fast: bool,
    /// Set by the owner while it works on the state (`fast` only).
    busy: AtomicBool,
    /// Set by a visitor while it works on the state (`fast` only).
    claimed: AtomicBool,
    /// How the magazine has served its owner lately: read and written by
    /// the owner alone, outside the protocol (see [`Skip`]).
    skip: Skip,
    /// The count of misses (in [`Skip`]'s units) that passes the magazine
    /// by: [`MISSES_BEFORE_SKIP`] for a magazine of [`MAGAZINE`] blocks,
    /// as many per block for a smaller one.
    skip_after: u32,
    /// The most blocks the magazine grows to.
    most: usize,
    /// Allocations that missed while the magazine was full, since the
    /// count of misses last came to `skip_after`: owner only, as `skip`.
    full_misses: AtomicU32,
    /// Whether the magazine grew: owner only, as `skip`.
    grown: AtomicBool,
}

/// Whether a magazine is worth its owner's time: a thread that uses many
/// more classes than a magazine holds misses in it at most allocations
/// and finds it full at most releases, and pays for both on top of the
/// shared cache's own work (and for the branches that the mix of hits and
/// misses makes the processor mispredict). Each miss counts
/// [`MISS_WEIGHT`] up, each hit and each release taken one down (not below
/// zero); when the count comes to [`MISSES_BEFORE_SKIP`] misses' worth (as
/// many misses in a row, or a longer run in which the magazine serves
/// fewer than 8 calls in 9), the magazine grows if its allocations found
/// it full (see [`Magazine::missed`]), and else its next
/// [`SKIPPED_OPERATIONS`] operations pass it by:
/// allocations and releases go to the shared cache at once, with one test
/// of this word. The blocks the magazine still holds
/// are not stranded: an allocation that the shared cache cannot serve
/// looks in its thread's magazine before it asks the backing allocator
/// (out of line: see `SharedPool`'s `allocate_locked`), and `collect`
/// frees them when due; the thread's requests for their classes take them
/// there, and release them to the shared cache. Then the magazine is
/// tried again.
///
/// One word, which only the owner reads and writes (a relaxed atomic,
/// plain loads and stores, only so that the magazine stays `Sync`): zero
/// (no miss counted, not passed by) on the hot path, which then tests one
/// word per call.
#[derive(Default)]
struct Skip(AtomicU32);

impl Skip {
    /// One miss (the count of misses, in hits: bits 0 to 10).
    const MISS: u32 = MISS_WEIGHT;
    /// The bits of the misses.
    const MISSES: u32 = 0x7ff;
    /// One operation left to pass the magazine by (the bits above).
    const LEFT: u32 = 1 << 11;
}

const _: () = assert!(MISSES_BEFORE_SKIP * Skip::MISS <= Skip::MISSES);
const _: () = assert!(SKIPPED_OPERATIONS <= u32::MAX / Skip::LEFT);

/// What a magazine missed ([`Magazine::missed`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Miss {
    /// An allocation, which found no block of its class and room for more.
    Room,
    /// An allocation, which found no block of its class and no room.
    Full,
    /// A release, which found no room.
    Release,
}

/// A magazine's blocks and counters.
///
/// The blocks are in a small open-addressing table keyed by class
/// (linear probing over [`SLOTS_PER_BLOCK`] slots per block it may hold),
/// so that a thread that keeps many
/// classes in use finds its block of a class with one hash and a probe or
/// two, where a list would be scanned. A slot keeps its class when its
/// block is taken: the release that follows puts the block back where it
/// was, and a round trip moves nothing. So the blocks of a class lie
/// along its probe sequence; an allocation takes the first, a release
/// fills the first slot of its class left empty (or a free slot after
/// them all). A class's blocks are reused front first, and those at the
/// back, which stay idle while the class needs fewer blocks, are the ones
/// that decay.
///
/// At most `cap` blocks, and at most half the slots with a class (so
/// every probe ends at a free slot within a few steps): a release that
/// needs a free slot when that many have a class empties the slots with
/// no block first ([`purge`](MagState::purge), out of the hot path, in
/// place). A magazine that grows ([`grow`](MagState::grow)) gets a
/// larger table.
///
/// In this order (`repr(C)`), so that no two adjacent fields are each
/// written by both an `allocate` and a release: the compiler merges two
/// adjacent updates of one path into one 16-byte load and store, and that
/// load waits for the other path's 8-byte stores to leave the store
/// buffer (a failed store-to-load forwarding: about a third of a hit's
/// time). A hit writes `lent`, `len` and the counters; a release `lent`,
/// `len` and `oldest`.
#[repr(C)]
pub(super) struct MagState<B> {
    /// Blocks lent through this magazine less those given back through it
    /// (negative when its thread gives back blocks lent elsewhere).
    pub(super) lent: isize,
    /// Slots with a class (at most half the table).
    keyed: usize,
    /// Blocks held (at most `cap`).
    len: usize,
    /// The most blocks it holds now: [`MAGAZINE`] at first (fewer in the
    /// fuzz harness), more once it grew.
    cap: usize,
    /// At or before the release time of every block held (`u64::MAX` when
    /// none has been since a collection looked): a hit leaves it as it
    /// was, so it may be older than the oldest block; a collection that
    /// looks sets it right.
    oldest: u64,
    /// The counters of the hits served here.
    pub(super) counts: MagCounts,
    /// The table's length less one (a power of two less one).
    mask: usize,
    /// The slots: a power of two of them, [`SLOTS_PER_BLOCK`] per block
    /// it may hold, at least.
    table: Box<[Slot<B>]>,
}

/// A slot of a magazine's table.
struct Slot<B> {
    /// The slot's class, 0 for a free slot (no block has class 0).
    class: usize,
    /// The slot's block, if it has one, and the time it was released at
    /// (`None` in a free slot).
    entry: Option<(B, u64)>,
}

impl<B> Slot<B> {
    const FREE: Self = Slot {
        class: 0,
        entry: None,
    };
}

/// The slots of the largest table, and the bits of a hash that choose
/// among them.
const MOST_SLOTS: usize = (SLOTS_PER_BLOCK * MAGAZINE_MOST).next_power_of_two();
const HASH_SHIFT: u32 = u64::BITS - MOST_SLOTS.trailing_zeros();

/// A table for a magazine of up to `cap` blocks (at most
/// [`MAGAZINE_MOST`]), and its mask (see [`MagState::mask`]).
fn table_for<B>(cap: usize) -> (usize, Box<[Slot<B>]>) {
    let slots = (SLOTS_PER_BLOCK * cap.max(1)).next_power_of_two();
    debug_assert!(slots <= MOST_SLOTS);
    let table = (0..slots).map(|_| Slot::FREE).collect();
    (slots - 1, table)
}

/// The counters of the hits a magazine served.
#[derive(Clone, Copy, Default)]
pub(super) struct MagCounts {
    pub(super) hits: u64,
    /// Class bytes handed out by these hits.
    pub(super) from_pool: u64,
    /// Class bytes minus requested bytes of these hits.
    pub(super) waste: u64,
}

impl MagCounts {
    pub(super) fn add(&mut self, other: MagCounts) {
        self.hits += other.hits;
        self.from_pool = self.from_pool.saturating_add(other.from_pool);
        self.waste = self.waste.saturating_add(other.waste);
    }
}

/// Clears `busy` when dropped, also on unwinding (a visitor would wait
/// for ever on a flag left set).
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Releasing: a visitor that reads `false` sees the owner's writes.
        self.0.store(false, Ordering::Release);
    }
}

impl<B> Magazine<B> {
    /// An empty magazine for up to `blocks` blocks at first (1 to
    /// [`MAGAZINE`]; out of range, the nearest), which grows to `most`
    /// (`blocks` to [`MAGAZINE_MOST`]), lock-free for its owner where the
    /// barrier is available.
    pub(super) fn new(blocks: usize, most: usize) -> Self {
        let blocks = blocks.clamp(1, MAGAZINE);
        Magazine {
            state: CacheLock::new(MagState::new(blocks)),
            fast: barrier::available(),
            busy: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            skip: Skip::default(),
            skip_after: MISSES_BEFORE_SKIP * Skip::MISS / MAGAZINE as u32 * blocks as u32,
            most: most.clamp(blocks, MAGAZINE_MOST),
            full_misses: AtomicU32::new(0),
            grown: AtomicBool::new(false),
        }
    }

    /// For the owner: the magazine's skip word, zero on the hot path
    /// (see [`Skip`]); hand it to [`pass_by`](Self::pass_by) when it is
    /// not.
    #[inline(always)]
    pub(super) fn skip_word(&self) -> u32 {
        self.skip.0.load(Ordering::Relaxed)
    }

    /// For the owner, before an allocation or a release, with a skip
    /// `word` that is not zero: the word to hand to
    /// [`served`](Self::served), [`stocked`](Self::stocked) or
    /// [`missed`](Self::missed), or `None` when the call goes straight to
    /// the shared cache (the magazine is passed by).
    #[inline(always)]
    pub(super) fn pass_by(&self, word: u32) -> Option<u32> {
        if word < Skip::LEFT {
            return Some(word);
        }
        self.skip.0.store(word - Skip::LEFT, Ordering::Relaxed);
        None
    }

    /// For the owner: the magazine served an allocation, which takes one
    /// off its count of misses; `word` as [`skip_word`](Self::skip_word) or
    /// [`pass_by`](Self::pass_by) gave it.
    #[inline(always)]
    pub(super) fn served(&self, word: u32) {
        // (A word that passes the magazine by, which a release's whole
        // path may read, is left as it is.)
        if word != 0 && word < Skip::LEFT {
            self.skip.0.store(word - 1, Ordering::Relaxed);
        }
    }

    /// For the owner: the magazine took a released block, which takes one
    /// off its count of misses; `word` as [`served`](Self::served) takes it,
    /// or `None` to read it.
    #[inline(always)]
    pub(super) fn stocked(&self, word: Option<u32>) {
        let word = word.unwrap_or_else(|| self.skip.0.load(Ordering::Relaxed));
        self.served(word);
    }

    /// For the owner: the magazine had no block for an allocation, or no
    /// room for a release (`miss`); `word` as [`stocked`](Self::stocked)
    /// takes it. When the misses come to [`MISSES_BEFORE_SKIP`] (less hits
    /// and releases taken, [`MISS_WEIGHT`] of which make up for one), the
    /// magazine grows if a quarter of those misses or more were
    /// allocations that found it full (its thread uses more classes than
    /// it holds) and it is not at its most; else it is passed by for a
    /// while.
    ///
    /// Once the magazine grew, an allocation that finds it with room
    /// counts as much as a hit ([`Miss::Room`]): the magazine is filling
    /// the room it grew for, where at eight times the weight the misses
    /// of the classes it did not hold yet would have it passed by before
    /// it is full (and so before it could grow again). A thread that only
    /// releases blocks (the consumer of another's) finds its magazine
    /// full at its releases, never at allocations: its magazine does not
    /// grow.
    #[inline(never)]
    pub(super) fn missed(&self, word: u32, miss: Miss) {
        let full = miss == Miss::Full;
        let filling = miss == Miss::Room && self.grown.load(Ordering::Relaxed);
        let mut word = word + if filling { 1 } else { Skip::MISS };
        let full_misses = self.full_misses.load(Ordering::Relaxed) + u32::from(full);
        if (word & Skip::MISSES) >= self.skip_after {
            self.full_misses.store(0, Ordering::Relaxed);
            // (Not when none was: with a small magazine, a quarter of
            // its misses may round to none.)
            let quarter = full_misses > 0 && 4 * full_misses >= self.skip_after / Skip::MISS;
            word = if quarter && self.grow() {
                0
            } else {
                SKIPPED_OPERATIONS * Skip::LEFT
            };
        } else if full {
            self.full_misses.store(full_misses, Ordering::Relaxed);
        }
        self.skip.0.store(word, Ordering::Relaxed);
    }

    /// For the owner, out of [`owned`](Self::owned): doubles the blocks
    /// the magazine may hold, up to its most; `false` when it is at its
    /// most, or a visitor holds it.
    #[cold]
    fn grow(&self) -> bool {
        let most = self.most;
        self.owned(|m| {
            let more = m.cap < most;
            if more {
                m.grow((2 * m.cap).min(most));
                self.grown.store(true, Ordering::Relaxed);
            }
            more
        }) == Some(true)
    }

    /// Runs `f` on the state for the owner; `None` (without running it)
    /// when a visitor holds the magazine: the caller goes to the shared
    /// cache instead.
    ///
    /// Only the owner calls it: the thread whose table holds the
    /// magazine, never from inside `f` nor from inside [`visit`]. (The
    /// lock-free protocol has one owner per magazine; [`with_magazine`]
    /// and [`last`] reach a magazine only through this thread's table.)
    #[inline(always)]
    pub(super) fn owned<R>(&self, f: impl FnOnce(&mut MagState<B>) -> R) -> Option<R> {
        self.owned_with((), |m, ()| f(m)).ok()
    }

    /// [`owned`](Self::owned) with an argument that `f` consumes, handed
    /// back in `Err` when a visitor holds the magazine (a block to
    /// release, which must not be lost with the closure).
    #[inline(always)]
    pub(super) fn owned_with<T, R>(
        &self,
        arg: T,
        f: impl FnOnce(&mut MagState<B>, T) -> R,
    ) -> Result<R, T> {
        if !self.fast {
            return Ok(f(&mut self.state.lock(), arg));
        }
        self.busy.store(true, Ordering::Relaxed);
        let busy = Busy(&self.busy);
        // Keeps the compiler from moving the load of `claimed` above the
        // store of `busy`; the visitor's barrier does the processor's part.
        compiler_fence(Ordering::SeqCst);
        if self.claimed.load(Ordering::Acquire) {
            return Err(arg);
        }
        // SAFETY: no visitor works on the state until `busy` is cleared
        // (`busy` drops after `f`): one that claimed the magazine before
        // our store of `busy` was seen to us through its barrier (we read
        // `claimed` set, above), one that claims it later sees `busy` set
        // after its barrier and waits (module documentation). A visitor
        // that was done released `claimed` before we read it clear, so its
        // writes are visible. Other owners there are none: only this
        // thread reaches the magazine through its table, and `f` does not
        // re-enter.
        let r = f(unsafe { &mut *self.state.as_ptr() }, arg);
        drop(busy);
        Ok(r)
    }

    /// The state, for a magazine that no thread's table holds any more
    /// (its thread exited): only the pool's list reaches it.
    pub(super) fn get_mut(&mut self) -> &mut MagState<B> {
        self.state.get_mut()
    }

    /// Readies a magazine that no thread's table holds any more for a new
    /// owner: its count of misses starts again (a thread that passed it by
    /// left that to its successor), its blocks and its size stay.
    pub(super) fn hand_over(&mut self) {
        *self.skip.0.get_mut() = 0;
        *self.full_misses.get_mut() = 0;
    }
}

/// Clears the `claimed` flags of the visited magazines when dropped, also
/// on unwinding (their owners would otherwise give up for ever).
struct Claims<'a, B>(&'a [Arc<Magazine<B>>]);

impl<B> Drop for Claims<'_, B> {
    fn drop(&mut self) {
        for mag in self.0 {
            if mag.fast {
                // Releasing: an owner that reads `false` sees our writes.
                mag.claimed.store(false, Ordering::Release);
            }
        }
    }
}

/// Runs `f` on the state of every magazine of `mags`, as a visitor.
///
/// `&mut` of a pool's list (held under its cache lock, or in its drop) is
/// what makes the visit exclusive among visitors: every magazine is in
/// one list.
pub(super) fn visit<B>(mags: &mut [Arc<Magazine<B>>], mut f: impl FnMut(&mut MagState<B>)) {
    if mags.is_empty() {
        return;
    }
    let mags: &[Arc<Magazine<B>>] = mags;
    let mut fast = false;
    for mag in mags {
        if mag.fast {
            mag.claimed.store(true, Ordering::Relaxed);
            fast = true;
        }
    }
    let claims = Claims(mags);
    if fast {
        // Orders every owner's `busy` store against our `claimed` stores
        // (module documentation).
        barrier::heavy();
    }
    for mag in mags {
        if mag.fast {
            let mut round = 0u32;
            while mag.busy.load(Ordering::Acquire) {
                // An owner is inside one operation (a few instructions),
                // unless it was descheduled there.
                round = round.saturating_add(1);
                if round < 64 {
                    spin_loop();
                } else {
                    thread::yield_now();
                }
            }
            // SAFETY: the owner is not inside `owned`, and will not enter
            // it while `claimed` is set (module documentation); no other
            // visitor reaches this magazine (the `&mut` list); the owner's
            // writes are visible through the acquiring load of `busy`.
            f(unsafe { &mut *mag.state.as_ptr() });
        } else {
            f(&mut mag.state.lock());
        }
    }
    drop(claims);
}

impl<B> MagState<B> {
    /// An empty magazine's state, for up to `cap` blocks (at most
    /// [`MAGAZINE_MOST`]).
    pub(super) fn new(cap: usize) -> Self {
        debug_assert!(cap <= MAGAZINE_MOST);
        let (mask, table) = table_for(cap);
        MagState {
            lent: 0,
            len: 0,
            cap,
            oldest: u64::MAX,
            counts: MagCounts::default(),
            keyed: 0,
            mask,
            table,
        }
    }

    /// The slot where `class`'s probe sequence starts: from a
    /// multiplicative hash's top bits (so that classes that are multiples
    /// of a power of two spread over the table), as many as the largest
    /// table needs, masked to this one's (a shift by a constant and a
    /// mask, where a shift by a variable takes more of the processor's
    /// time).
    #[inline(always)]
    fn home(&self, class: usize) -> usize {
        ((class as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> HASH_SHIFT) as usize & self.mask
    }

    /// The slot after `i`, wrapping.
    #[inline(always)]
    fn next(&self, i: usize) -> usize {
        (i + 1) & self.mask
    }

    /// Slot `i`, which [`home`](Self::home) or [`next`](Self::next) gave:
    /// without the bounds check that the compiler cannot drop, on the hot
    /// path.
    #[inline(always)]
    fn slot(&mut self, i: usize) -> &mut Slot<B> {
        debug_assert!(i < self.table.len());
        // SAFETY: `home` and `next` mask their slot with `mask`, the
        // table's length less one, a power of two less one (`table_for`
        // makes both, `new` and `grow` set them together): below the
        // length.
        unsafe { self.table.get_unchecked_mut(i) }
    }

    /// The most slots with a class: half the table.
    #[inline(always)]
    fn keyed_most(&self) -> usize {
        self.table.len() / 2
    }

    /// Blocks held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether a release may add a block.
    #[inline(always)]
    pub(super) fn has_room(&self) -> bool {
        self.len < self.cap
    }

    /// Whether a block may be due at `now` (released `ttl` or more ago):
    /// `false` means none is; `true`, that [`take_due`](Self::take_due)
    /// must look (it may find none, and then sets the bound right).
    #[inline(always)]
    pub(super) fn oldest_due(&self, now: u64, ttl: u64) -> bool {
        // `len` is tested second, and only when the bound is due: an empty
        // magazine's may be (a hit leaves the bound as it was, and with
        // `ttl` zero even `u64::MAX` is due).
        now.saturating_sub(self.oldest) >= ttl && self.len != 0
    }

    /// Takes out every block due at `now`.
    #[cold]
    pub(super) fn take_due(&mut self, now: u64, ttl: u64) -> Vec<(B, usize)> {
        let mut due = Vec::new();
        self.remove_where(
            |at| now.saturating_sub(at) >= ttl,
            |block, class| due.push((block, class)),
        );
        due
    }

    /// Takes out every block whose release time `pick` chooses, handing
    /// each with its class to `out`, and sets the bound of the release
    /// times right. `pick` chooses every time before one it chooses (a
    /// collection's "released `ttl` or more before now", or every time):
    /// when it does not choose the bound, no block is chosen, and the
    /// table is not scanned.
    pub(super) fn remove_where(
        &mut self,
        mut pick: impl FnMut(u64) -> bool,
        mut out: impl FnMut(B, usize),
    ) {
        if self.len == 0 || !pick(self.oldest) {
            return;
        }
        // The bound, set right: the oldest of the blocks kept.
        let mut oldest = u64::MAX;
        for slot in self.table.iter_mut() {
            match &mut slot.entry {
                Some((_, at)) if pick(*at) => {
                    if let Some((block, _)) = slot.entry.take() {
                        self.len -= 1;
                        out(block, slot.class);
                    }
                }
                Some((_, at)) => oldest = oldest.min(*at),
                None => {}
            }
        }
        self.oldest = oldest;
    }

    /// Takes out every block, handing each with its class and release
    /// time to `out`, and frees every slot.
    pub(super) fn drain(&mut self, mut out: impl FnMut(B, usize, u64)) {
        if self.keyed == 0 {
            return;
        }
        for slot in self.table.iter_mut() {
            if let Some((block, at)) = slot.entry.take() {
                out(block, slot.class, at);
            }
            slot.class = 0;
        }
        self.len = 0;
        self.keyed = 0;
        self.oldest = u64::MAX;
    }

    /// Adds `block` of `class` (not 0), released at `now`, to the first
    /// slot of its class with no block, or else to a free slot; gives it
    /// back when that needs a free slot and half the slots already have
    /// a class (then [`push`](Self::push) makes room). The caller saw
    /// [`has_room`](Self::has_room).
    #[inline(always)]
    pub(super) fn try_push(&mut self, block: B, class: usize, now: u64) -> Result<(), B> {
        debug_assert!(class != 0 && self.len < self.cap);
        let mut i = self.home(class);
        loop {
            let slot = self.slot(i);
            let c = slot.class;
            if c == class && slot.entry.is_none() {
                break;
            }
            if c == 0 {
                if self.keyed == self.keyed_most() {
                    return Err(block);
                }
                self.keyed += 1;
                self.slot(i).class = class;
                break;
            }
            i = self.next(i);
        }
        self.slot(i).entry = Some((block, now));
        self.len += 1;
        self.oldest = self.oldest.min(now);
        Ok(())
    }

    /// [`try_push`](Self::try_push), freeing the slots with no block
    /// first where it must; gives the block back only if the magazine is
    /// full (the caller saw [`has_room`](Self::has_room): never).
    #[inline(never)]
    pub(super) fn push(&mut self, block: B, class: usize, now: u64) -> Result<(), B> {
        if !self.has_room() {
            return Err(block);
        }
        match self.try_push(block, class, now) {
            Ok(()) => Ok(()),
            Err(block) => {
                self.purge();
                // Now at most `cap - 1` slots have a class, fewer than
                // half of them.
                self.try_push(block, class, now)
            }
        }
    }

    /// Frees the slots with no block, in place: the table is built again
    /// with the blocks alone, each class's in the order they had.
    ///
    /// From a slot that was free (there is one: at most half have a
    /// class), each class's probe sequence is met front first, since none
    /// crosses a free slot. Once the slots with no block are freed, each
    /// block met is taken out and put back at the first free slot from
    /// its class's home: at its own slot or before it along the sequence
    /// (the slots between were met before, and only fill), and behind the
    /// blocks of its class put back before it.
    #[cold]
    fn purge(&mut self) {
        let start = self.table.iter().position(|s| s.class == 0).unwrap_or(0);
        for slot in self.table.iter_mut() {
            if slot.entry.is_none() {
                slot.class = 0;
            }
        }
        let (len, oldest) = (self.len, self.oldest);
        self.keyed = len;
        let mask = self.mask;
        for k in 0..self.table.len() {
            let slot = &mut self.table[(start + k) & mask];
            if let Some((block, at)) = slot.entry.take() {
                let class = core::mem::take(&mut slot.class);
                self.keyed -= 1;
                self.len -= 1;
                // Not refused: fewer than half the slots have a class.
                let _ = self.try_push(block, class, at);
            }
        }
        debug_assert_eq!((self.len, self.keyed), (len, len));
        self.oldest = oldest;
    }

    /// Makes room for up to `cap` blocks (more than now), in a larger
    /// table, each class's blocks in the order they had.
    #[cold]
    pub(super) fn grow(&mut self, cap: usize) {
        debug_assert!(cap > self.cap);
        let (mask, table) = table_for(cap);
        let mut old = core::mem::replace(&mut self.table, table).into_vec();
        self.mask = mask;
        self.cap = cap;
        let (len, oldest) = (self.len, self.oldest);
        self.keyed = 0;
        self.len = 0;
        // From a free slot on: each class's probe sequence front first
        // (see `purge`), put back behind the blocks of its class.
        let start = old.iter().position(|s| s.class == 0).unwrap_or(0);
        let mask = old.len() - 1;
        for k in 0..old.len() {
            let slot = &mut old[(start + k) & mask];
            if let Some((block, at)) = slot.entry.take() {
                // Not refused: the new table has room for `cap` classes.
                let _ = self.try_push(block, slot.class, at);
            }
        }
        debug_assert_eq!(self.len, len);
        self.oldest = oldest;
    }

    /// The hot path of a release to the magazine: `block` of `class`,
    /// released at `now`, goes in if nothing is due (by `ttl`) and there
    /// is room and a handle left; else it comes back, with `true` when
    /// the whole path may still take it: a block is due (the whole path
    /// frees it first), or the table must be built again to make room.
    #[inline(always)]
    pub(super) fn put_fast(
        &mut self,
        block: B,
        class: usize,
        now: u64,
        ttl: u64,
        handles: &AtomicUsize,
    ) -> Result<(), (B, bool)> {
        if self.oldest_due(now, ttl) {
            Err((block, true))
        } else if self.has_room() && handles.load(Ordering::Acquire) > 0 {
            self.try_push(block, class, now).map_err(|b| (b, true))?;
            self.lent -= 1;
            Ok(())
        } else {
            Err((block, false))
        }
    }

    /// A hit: the first block of `class` for a request of `size`, lent and
    /// counted, if the magazine has one.
    #[inline(always)]
    pub(super) fn take_hit(&mut self, class: usize, size: usize) -> Option<B> {
        let block = self.take(class)?;
        self.count_hit(class, size);
        Some(block)
    }

    /// The first block of `class` along its probe sequence, if any; its
    /// slot keeps the class.
    #[inline(always)]
    fn take(&mut self, class: usize) -> Option<B> {
        let mut i = self.home(class);
        loop {
            let slot = self.slot(i);
            if slot.class == class {
                if let Some((block, _)) = slot.entry.take() {
                    // The bound stays (a collection sets it right).
                    self.len -= 1;
                    return Some(block);
                }
            } else if slot.class == 0 {
                return None;
            }
            i = self.next(i);
        }
    }

    /// Counts a hit of `class` for a request of `size` served here.
    #[inline(always)]
    fn count_hit(&mut self, class: usize, size: usize) {
        self.lent += 1;
        self.counts.hits += 1;
        // Saturating, as the pool's own counters: a class near
        // `usize::MAX` served twice would overflow.
        self.counts.from_pool = self.counts.from_pool.saturating_add(class as u64);
        self.counts.waste = self.counts.waste.saturating_add((class - size) as u64);
    }

    /// Blocks and class bytes held.
    pub(super) fn held(&self) -> (u64, usize) {
        if self.len == 0 {
            return (0, 0);
        }
        let bytes = self
            .table
            .iter()
            .filter(|slot| slot.entry.is_some())
            .map(|slot| slot.class)
            .sum();
        (self.len as u64, bytes)
    }
}

/// One pool this thread has a magazine for.
struct Entry {
    /// `Weak::into_raw` of the pool (also its address, the key).
    pool: *const (),
    /// `Arc::into_raw` of the magazine.
    mag: *const (),
    /// Drops both references.
    drop_refs: unsafe fn(*const (), *const ()),
    /// Whether the pool is still alive.
    alive: unsafe fn(*const ()) -> bool,
}

/// This thread's table; dropping it (at thread exit) drops its references.
struct Table(Vec<Entry>);

impl Drop for Table {
    fn drop(&mut self) {
        // The magazines may go below: `with_magazine` must not find one in
        // `LAST` any more (other thread-local destructors may still run
        // pool calls).
        LAST.set(NO_LAST);
        for e in self.0.drain(..) {
            // SAFETY: the entry's pointers came from `into_raw` of the types
            // `drop_refs` was instantiated with, and are dropped once here.
            unsafe { (e.drop_refs)(e.pool, e.mag) };
        }
    }
}

thread_local! {
    static TABLE: RefCell<Table> = const { RefCell::new(Table(Vec::new())) };
    /// The first entry of `TABLE` (the pool used last) as (pool, magazine),
    /// or [`NO_LAST`]: a copy that needs no borrow and no check of the
    /// table's state (it has no destructor), for the hot path's lookup.
    /// Every change of the table's first entry sets it.
    static LAST: Cell<(*const (), *const ())> = const { Cell::new(NO_LAST) };
}

/// `LAST` with no entry.
const NO_LAST: (*const (), *const ()) = (core::ptr::null(), core::ptr::null());

/// Drops an entry's references.
///
/// # Safety
///
/// `pool` came from `Weak::<T>::into_raw` and `mag` from
/// `Arc::<Magazine<B>>::into_raw`, and neither is used again. Dropping
/// them drops no `T` and no `B`: a pool is gone only after its drop
/// emptied every magazine in its list, and until then its list holds the
/// magazine, so this reference is not its last.
unsafe fn drop_refs<T, B>(pool: *const (), mag: *const ()) {
    // SAFETY: as the caller promises.
    unsafe {
        drop(Weak::from_raw(pool.cast::<T>()));
        drop(Arc::from_raw(mag.cast::<Magazine<B>>()));
    }
}

/// Whether the pool behind an entry is alive.
///
/// # Safety
///
/// `pool` came from `Weak::<T>::into_raw` and is still owned by its entry.
unsafe fn alive<T>(pool: *const ()) -> bool {
    // SAFETY: as the caller promises; the weak reference is only borrowed.
    let weak = ManuallyDrop::new(unsafe { Weak::from_raw(pool.cast::<T>()) });
    weak.strong_count() > 0
}

/// What [`with_magazine`] found.
pub(super) enum Found<R> {
    /// The magazine, and what `f` returned.
    Ran(R),
    /// This thread has no magazine for the pool.
    Missing,
    /// The table cannot be used now (its thread is exiting, or it is in use
    /// further up this thread's stack).
    Unavailable,
}

/// This thread's magazine for the pool at `pool` when it is the pool
/// this thread used last (one comparison, no borrow of the table); else
/// null, and [`with_magazine`] finds it (or not).
///
/// The magazine, if any, stays alive until this thread registers a
/// magazine or exits (the table holds it), so for the rest of a call that
/// does neither.
///
/// # Safety
///
/// `pool` is the address of a live pool whose magazines are
/// `Magazine<B>`.
#[inline(always)]
pub(super) unsafe fn last<B>(pool: *const ()) -> *const Magazine<B> {
    let (last_pool, last_mag) = LAST.get();
    if last_pool == pool {
        // The caller's pool is the entry's (a pool's address is not reused
        // while the entry holds a weak reference to it): its magazine is a
        // `Magazine<B>`.
        last_mag.cast()
    } else {
        core::ptr::null()
    }
}

/// Runs `f` on this thread's magazine for the pool at `pool`.
///
/// # Safety
///
/// `pool` is the address of a live pool whose magazines are
/// `Magazine<B>`.
#[inline(always)]
pub(super) unsafe fn with_magazine<B, R>(
    pool: *const (),
    f: impl FnOnce(&Magazine<B>) -> R,
) -> Found<R> {
    let (last_pool, last_mag) = LAST.get();
    if last_pool == pool {
        // SAFETY: `LAST` is a copy of the table's first entry, whose
        // magazine (a `Magazine<B>`, as below) the table keeps alive until
        // `LAST` is changed or cleared (`Table::drop`); `pool` is not null.
        return Found::Ran(f(unsafe { &*last_mag.cast::<Magazine<B>>() }));
    }
    // SAFETY: as the caller promises.
    unsafe { with_magazine_slow(pool, f) }
}

/// [`with_magazine`] when the pool is not the one used last.
///
/// # Safety
///
/// As [`with_magazine`].
#[inline(never)]
unsafe fn with_magazine_slow<B, R>(pool: *const (), f: impl FnOnce(&Magazine<B>) -> R) -> Found<R> {
    let f = |table: &RefCell<Table>| {
        let Ok(mut table) = table.try_borrow_mut() else {
            return Found::Unavailable;
        };
        let entries = &mut table.0;
        let Some(i) = entries.iter().position(|e| e.pool == pool) else {
            return Found::Missing;
        };
        // The last pool used comes first (and in `LAST`): its lookup is
        // one comparison.
        entries.swap(0, i);
        LAST.set((entries[0].pool, entries[0].mag));
        // SAFETY: the entry's magazine is a `Magazine<B>` (the caller's
        // pool is the entry's: a pool's address is not reused while the
        // entry holds a weak reference to it), kept alive by the entry.
        let mag = unsafe { &*entries[0].mag.cast::<Magazine<B>>() };
        Found::Ran(f(mag))
    };
    TABLE.try_with(f).unwrap_or(Found::Unavailable)
}

/// Adds this thread's magazine `mag` for `pool`, dropping the entries of
/// pools that are gone; `false` when the table cannot be used now.
pub(super) fn register<T, B>(pool: &Arc<T>, mag: &Arc<Magazine<B>>) -> bool {
    let f = |table: &RefCell<Table>| {
        let Ok(mut table) = table.try_borrow_mut() else {
            return false;
        };
        let entries = &mut table.0;
        // Entries (and their magazines) may go below; set again after.
        LAST.set(NO_LAST);
        entries.retain(|e| {
            // SAFETY: the entry owns its weak reference.
            let keep = unsafe { (e.alive)(e.pool) };
            if !keep {
                // SAFETY: the entry's own references, dropped once (the
                // entry is removed).
                unsafe { (e.drop_refs)(e.pool, e.mag) };
            }
            keep
        });
        entries.insert(
            0,
            Entry {
                pool: Weak::into_raw(Arc::downgrade(pool)).cast(),
                mag: Arc::into_raw(Arc::clone(mag)).cast(),
                drop_refs: drop_refs::<T, B>,
                alive: alive::<T>,
            },
        );
        LAST.set((entries[0].pool, entries[0].mag));
        true
    };
    TABLE.try_with(f).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicUsize;

    /// The blocks of `class` along its probe sequence, front first.
    fn chain(m: &MagState<u64>, class: usize) -> Vec<u64> {
        let (mut i, mut out) = (m.home(class), Vec::new());
        while m.table[i].class != 0 {
            if m.table[i].class == class {
                out.extend(m.table[i].entry.map(|(b, _)| b));
            }
            i = m.next(i);
        }
        out
    }

    /// The slot of `block`.
    fn slot_of(m: &MagState<u64>, block: u64) -> Option<usize> {
        m.table
            .iter()
            .position(|s| s.entry.is_some_and(|(b, _)| b == block))
    }

    /// Checks `m` against `model` (its blocks as (block, class, release
    /// time)): the blocks, the counts, the class bytes, the bound of the
    /// release times, and that every block lies on its class's probe
    /// sequence.
    fn check(m: &MagState<u64>, model: &[(u64, usize, u64)]) {
        assert_eq!(m.len(), model.len());
        let bytes: usize = model.iter().map(|&(_, c, _)| c).sum();
        assert_eq!(m.held(), (model.len() as u64, bytes));
        if let Some(min) = model.iter().map(|&(_, _, at)| at).min() {
            assert!(m.oldest <= min, "the bound {} above {min}", m.oldest);
        }
        let keyed = m.table.iter().filter(|s| s.class != 0).count();
        assert_eq!(m.keyed, keyed);
        assert!(keyed <= m.keyed_most());
        assert!(m.len <= m.cap && m.cap < m.keyed_most());
        assert_eq!(m.table.len(), (SLOTS_PER_BLOCK * m.cap).next_power_of_two());
        for (i, slot) in m.table.iter().enumerate() {
            let class = slot.class;
            assert!(
                class != 0 || slot.entry.is_none(),
                "a block in free slot {i}"
            );
            let Some((block, at)) = slot.entry else {
                continue;
            };
            assert!(
                model.contains(&(block, class, at)),
                "block {block} of {class}"
            );
            assert!(
                chain(m, class).contains(&block),
                "block {block} off its chain"
            );
        }
    }

    #[test]
    fn the_table_agrees_with_a_list_of_its_blocks() {
        // A magazine as the pool makes it, which grows twice; and one of
        // two blocks (as the fuzz harness makes), whose table of 8 slots
        // is built again all the time, and which grows to 8 blocks.
        the_table_agrees_with_a_list_of_its_blocks_from(MAGAZINE, 0x5eed_7ab1e);
        the_table_agrees_with_a_list_of_its_blocks_from(2, 0x5eed_0002);
    }

    fn the_table_agrees_with_a_list_of_its_blocks_from(cap: usize, seed: u64) {
        // Classes several of which share a home slot or neighbouring ones
        // of the first table (long probe sequences, wrapping around the
        // table's end), and more classes than the table keeps slots for:
        // it is built again now and then, also once it grew.
        let mut m = MagState::new(cap);
        let slots = m.table.len();
        let mut classes: Vec<usize> = Vec::new();
        let mut c = 1;
        while classes.len() < 12 {
            if m.home(c) >= slots - 3 {
                classes.push(c);
            }
            c += 1;
        }
        classes.extend((1..=600).map(|k| 64 * k));
        let mut rng = crate::test_rng::rng(seed);
        let mut model = Vec::new();
        let (mut next_block, mut now) = (0u64, 0u64);
        let (mut taken, mut rebuilt, mut full, mut grown) = (None, 0, 0, 0);
        for step in 0..40_000 {
            if step % 15_000 == 14_999 {
                // Grows, each class's blocks in their order.
                let chains =
                    |m: &MagState<u64>| classes.iter().map(|&c| chain(m, c)).collect::<Vec<_>>();
                let before = chains(&m);
                let bound = m.oldest;
                m.grow(2 * m.cap);
                assert_eq!(before, chains(&m), "step {step}");
                assert_eq!(m.oldest, bound);
                check(&m, &model);
                grown += 1;
                taken = None;
            }
            now += rng(3);
            // Mostly a few classes, now and then any.
            let n = if rng(8) == 0 { classes.len() } else { 20 };
            let class = classes[rng(n as u64) as usize];
            // Phases that fill the magazine, keep it as it is, empty it.
            let op = match (step / 2000) % 3 {
                0 => rng(16) / 2,
                1 => rng(16),
                _ => 7 + rng(9),
            };
            match op {
                0..=6 if m.has_room() => {
                    let chain_before = chain(&m, class);
                    // The first slot of the class with no block, else the
                    // free slot after them (when the table need not be
                    // built again).
                    let mut want = m.home(class);
                    while m.table[want].class != 0
                        && (m.table[want].class != class || m.table[want].entry.is_some())
                    {
                        want = m.next(want);
                    }
                    let built_again = m.table[want].class == 0 && m.keyed == m.keyed_most();
                    let chains = |m: &MagState<u64>| {
                        let others = classes.iter().filter(|&&c| c != class);
                        others.map(|&c| chain(m, c)).collect::<Vec<_>>()
                    };
                    let others_before = if built_again { chains(&m) } else { vec![] };
                    assert!(m.push(next_block, class, now).is_ok());
                    if built_again {
                        // Every class's blocks keep their order.
                        assert_eq!(others_before, chains(&m), "step {step}");
                    }
                    model.push((next_block, class, now));
                    if built_again {
                        rebuilt += 1;
                    } else {
                        assert_eq!(slot_of(&m, next_block), Some(want), "step {step}");
                    }
                    // A round trip puts the block back where it was (or
                    // before, where a block of its class was taken).
                    if let Some((slot, c)) = taken.take() {
                        if c == class && !built_again {
                            let from_home =
                                |i: usize| i.wrapping_sub(m.home(class)) & (m.table.len() - 1);
                            assert!(from_home(want) <= from_home(slot), "step {step}");
                        }
                    }
                    // Behind the blocks of its class, whose order holds
                    // (also when the table was built again).
                    let mut chain_after = chain(&m, class);
                    chain_after.retain(|&b| b != next_block);
                    assert_eq!(chain_before, chain_after, "step {step}");
                    next_block += 1;
                }
                0..=6 => {
                    assert!(m.push(next_block, class, now).is_err());
                    full += 1;
                }
                7..=13 => {
                    // The front block of the class, if any.
                    let want = chain(&m, class).first().copied();
                    assert_eq!(want.is_some(), model.iter().any(|&(_, c, _)| c == class));
                    let slot = want.and_then(|b| slot_of(&m, b));
                    let got = m.take(class);
                    assert_eq!(got, want, "step {step}");
                    model.retain(|&(b, ..)| Some(b) != got);
                    taken = slot.map(|s| (s, class));
                }
                14 => {
                    let ttl = rng(40);
                    let looks = m.oldest_due(now, ttl);
                    let mut due = m.take_due(now, ttl);
                    let mut want: Vec<_> = model
                        .iter()
                        .filter(|&&(_, _, at)| now - at >= ttl)
                        .map(|&(b, c, _)| (b, c))
                        .collect();
                    model.retain(|&(_, _, at)| now - at < ttl);
                    due.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(due, want);
                    assert!(!m.oldest_due(now, ttl));
                    // A collection that looked sets the bound right.
                    let min = model.iter().map(|&(_, _, at)| at).min();
                    if looks {
                        assert_eq!(m.oldest, min.unwrap_or(u64::MAX), "set right");
                    }
                }
                _ if rng(64) == 0 => {
                    let mut all = Vec::new();
                    m.drain(|b, c, at| all.push((b, c, at)));
                    all.sort_unstable();
                    model.sort_unstable();
                    assert_eq!(all, core::mem::take(&mut model));
                }
                _ => {}
            }
            check(&m, &model);
        }
        // The magazine was full, and the table built again.
        assert!(full > 0 && rebuilt > 0 && grown == 2, "{full} {rebuilt}");
    }

    #[test]
    fn a_magazine_that_grows_keeps_its_blocks_in_their_order() {
        // Few steps, for Miri: a magazine of two blocks grows to four and
        // eight, with blocks of classes that share their probe sequences.
        let mut m = MagState::new(2);
        let mut model = Vec::new();
        let classes = [8, 16, 24, 8 << 20, 16 << 20];
        for cap in [2, 4, 8] {
            if cap > m.cap {
                let before: Vec<_> = classes.iter().map(|&c| chain(&m, c)).collect();
                m.grow(cap);
                let after: Vec<_> = classes.iter().map(|&c| chain(&m, c)).collect();
                assert_eq!(before, after);
                check(&m, &model);
            }
            while m.has_room() {
                let (block, class) = (model.len() as u64, classes[model.len() % 5]);
                assert!(m.push(block, class, block).is_ok());
                model.push((block, class, block));
                check(&m, &model);
            }
            assert!(m.push(99, 8, 0).is_err(), "full at {cap}");
        }
        // The front block of each class first.
        assert_eq!(m.take(8), Some(0));
        assert_eq!(m.take(8), Some(5));
        model.retain(|&(b, ..)| b != 0 && b != 5);
        check(&m, &model);
        let mut all = Vec::new();
        m.drain(|b, c, at| all.push((b, c, at)));
        all.sort_unstable();
        assert_eq!(all, model);
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_magazine_of_16_byte_blocks_takes_8_to_10_kib_and_8_times_as_much_at_its_most() {
        // As `SharedPool::with_thread_caches` documents.
        fn footprint<B>(cap: usize) -> usize {
            let m = MagState::<B>::new(cap);
            size_of::<Magazine<B>>() + m.table.len() * size_of::<Slot<B>>()
        }
        type Niche = (core::ptr::NonNull<u8>, usize);
        for (most, kib) in [(MAGAZINE, 1), (MAGAZINE_MOST, 8)] {
            let (niche, plain) = (footprint::<Niche>(most), footprint::<[u64; 2]>(most));
            assert!(
                (8 * kib * 1024..=8 * kib * 1024 + 256).contains(&niche),
                "{niche}"
            );
            assert!(
                (10 * kib * 1024..=10 * kib * 1024 + 256).contains(&plain),
                "{plain}"
            );
        }
    }

    #[test]
    fn an_empty_magazine_has_nothing_due_even_with_no_time_to_live() {
        let mut m = MagState::new(MAGAZINE);
        assert!(!m.oldest_due(u64::MAX, 0));
        assert!(m.push(1u64, 8, 5).is_ok());
        assert!(m.oldest_due(5, 0) && !m.oldest_due(4, 2));
        assert_eq!(m.take(8), Some(1));
        // The bound stays at 5, but nothing is due in an empty magazine.
        assert!(!m.oldest_due(u64::MAX, 0) && !m.oldest_due(u64::MAX, 1));
        assert!(m.take_due(u64::MAX, 0).is_empty());
    }

    #[test]
    fn an_owner_gives_up_while_a_visitor_holds_the_magazine() {
        let mag = Arc::new(Magazine::<u64>::new(MAGAZINE, MAGAZINE_MOST));
        let mut list = vec![Arc::clone(&mag)];
        let (inside, done) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let owner = {
            let (mag, inside, done) = (Arc::clone(&mag), Arc::clone(&inside), Arc::clone(&done));
            thread::spawn(move || {
                inside.wait();
                // The visitor is inside its visit: the owner must not get in.
                let during = mag.owned(|m| assert!(m.push(1, 8, 0).is_ok()));
                done.wait();
                (during, mag.owned(|m| m.len()))
            })
        };
        let mut visits = 0;
        visit(&mut list, |m| {
            inside.wait();
            // Give the owner the time to try (it must not wait for us).
            thread::sleep(core::time::Duration::from_millis(if cfg!(miri) {
                1
            } else {
                20
            }));
            assert!(m.push(2, 8, 0).is_ok());
            visits += 1;
        });
        done.wait();
        let (during, after) = owner.join().unwrap();
        assert_eq!(visits, 1);
        // With the lock (no barrier here), the owner waited instead.
        if mag.fast {
            assert_eq!((during, after), (None, Some(1)));
        } else {
            assert_eq!((during, after), (Some(()), Some(2)));
        }
    }

    #[test]
    fn a_visitor_waits_for_an_owner_at_work_and_sees_its_writes() {
        let mag = Arc::new(Magazine::<u64>::new(MAGAZINE, MAGAZINE_MOST));
        let mut list = vec![Arc::clone(&mag)];
        let inside = Arc::new(Barrier::new(2));
        let step = Arc::new(AtomicUsize::new(0));
        let owner = {
            let (mag, inside, step) = (Arc::clone(&mag), Arc::clone(&inside), Arc::clone(&step));
            thread::spawn(move || {
                mag.owned(|m| {
                    inside.wait();
                    thread::sleep(core::time::Duration::from_millis(if cfg!(miri) {
                        1
                    } else {
                        20
                    }));
                    assert!(m.push(7, 8, 0).is_ok());
                    m.lent -= 1;
                    step.store(1, Ordering::SeqCst);
                })
            })
        };
        inside.wait();
        let mut seen = None;
        visit(&mut list, |m| {
            seen = Some((step.load(Ordering::SeqCst), m.len(), m.lent));
        });
        assert_eq!(owner.join().unwrap(), Some(()));
        assert_eq!(seen, Some((1, 1, -1)));
    }
}
