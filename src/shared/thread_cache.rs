//! Per-thread caches ("magazines") in front of a
//! [`SharedPool`](crate::SharedPool)'s cache, for pools from
//! [`SharedPool::with_thread_caches`](crate::SharedPool::with_thread_caches).
//!
//! Each thread that allocates from such a pool gets a magazine for it: up
//! to [`MAGAZINE`] idle blocks with their release times. The pool keeps
//! every magazine in a list under its cache lock; the thread keeps a table
//! from pool to magazine, which holds the pool weakly (it never keeps a
//! pool alive) and the magazine strongly.
//!
//! The blocks of a magazine are counted in use by the pool's cache: the
//! pool's statistics move them to the cached counts when read. A thread
//! that exits leaves its magazine in the pool's list, where `collect`,
//! `trim`, the limit, the out-of-memory retry and the pool's drop reach it;
//! `collect` drops it from the list once it is empty.
//!
//! A thread that uses more classes than its magazine holds misses in it at
//! most calls, and would pay for the magazine on top of the shared cache:
//! after [`MISSES_BEFORE_SKIP`] misses with no hit and no release taken in
//! between, it passes the magazine by for its next [`SKIPPED_OPERATIONS`] calls,
//! then tries it again (see `Skip`).
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

/// The most blocks a magazine holds.
pub(super) const MAGAZINE: usize = 8;

/// Misses (allocations the magazine has no block for, releases it is too
/// full to take) with no hit and no release taken in between, after which
/// its owner passes it by.
pub(super) const MISSES_BEFORE_SKIP: u32 = 2 * MAGAZINE as u32;

/// How many of its owner's operations pass a magazine by, once it missed
/// [`MISSES_BEFORE_SKIP`] times with no hit and no release taken in
/// between.
pub(super) const SKIPPED_OPERATIONS: u32 = 1024;

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
}

/// Whether a magazine is worth its owner's time: a thread that uses more
/// classes than a magazine holds misses in it at almost every allocation
/// and finds it full at almost every release, and paid for both on top of
/// the shared cache's own work. After [`MISSES_BEFORE_SKIP`] misses with
/// no hit and no release taken in between (each hit restarts the count:
/// under contention a hit saves a turn of the shared lock, worth more than
/// the magazine costs), its next [`SKIPPED_OPERATIONS`] operations pass
/// the magazine by: allocations and releases go to the shared cache at
/// once, with one test of this word. The blocks the magazine still holds
/// are not stranded: an allocation that the shared cache cannot serve
/// looks in its thread's magazine before it asks the backing allocator
/// (out of line: see `SharedPool`'s `allocate_locked`), and `collect`
/// frees them when due. Then the magazine is tried again.
///
/// One word, which only the owner reads and writes (a relaxed atomic,
/// plain loads and stores, only so that the magazine stays `Sync`): zero
/// (no miss since the last hit or release taken, not passed by) on the
/// hot path, which then tests one word per call.
#[derive(Default)]
struct Skip(AtomicU32);

impl Skip {
    /// One miss (the misses since the last hit or release taken: bits 0
    /// to 4).
    const MISS: u32 = 1;
    /// The bits of the misses.
    const MISSES: u32 = 0x1f;
    /// One operation left to pass the magazine by (the bits above).
    const LEFT: u32 = 1 << 5;
}

const _: () = assert!(MISSES_BEFORE_SKIP * Skip::MISS <= Skip::MISSES);

/// A magazine's blocks and counters.
///
/// In this order (`repr(C)`): `lent`, which a release writes, is not next
/// to the hit counters, which an `allocate` updates; adjacent, the two
/// updates are merged into one 16-byte load and store, and that load waits
/// for the release's 8-byte store to leave the store buffer (a failed
/// store-to-load forwarding: about a third of a hit's time).
#[repr(C)]
pub(super) struct MagState<B> {
    /// Blocks lent through this magazine less those given back through it
    /// (negative when its thread gives back blocks lent elsewhere).
    pub(super) lent: isize,
    /// Idle blocks: the block, its class and the time it was released at,
    /// oldest first (each release pushes at the end).
    pub(super) blocks: Vec<(B, usize, u64)>,
    /// The counters of the hits served here.
    pub(super) counts: MagCounts,
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
    /// An empty magazine, lock-free for its owner where the barrier is
    /// available.
    pub(super) fn new() -> Self {
        Magazine {
            state: CacheLock::new(MagState::new()),
            fast: barrier::available(),
            busy: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            skip: Skip::default(),
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

    /// For the owner: the magazine served an allocation, which ends a run
    /// of misses; `word` as [`skip_word`](Self::skip_word) or
    /// [`pass_by`](Self::pass_by) gave it (only misses are left in such
    /// a word).
    #[inline(always)]
    pub(super) fn served(&self, word: u32) {
        if word != 0 {
            self.skip.0.store(0, Ordering::Relaxed);
        }
    }

    /// For the owner: the magazine took a released block, which ends a
    /// run of misses; `word` as [`served`](Self::served) takes it, or
    /// `None` to read it.
    #[inline(always)]
    pub(super) fn stocked(&self, word: Option<u32>) {
        let word = word.unwrap_or_else(|| self.skip.0.load(Ordering::Relaxed));
        self.served(word);
    }

    /// For the owner: the magazine had no block for an allocation, or no
    /// room for a release; `word` as [`stocked`](Self::stocked) takes it.
    /// After [`MISSES_BEFORE_SKIP`] of them with no hit and no release
    /// taken in between, it is passed by for a while.
    #[inline(never)]
    pub(super) fn missed(&self, word: u32) {
        let mut word = word + Skip::MISS;
        if (word & Skip::MISSES) >= MISSES_BEFORE_SKIP * Skip::MISS {
            word = SKIPPED_OPERATIONS * Skip::LEFT;
        }
        self.skip.0.store(word, Ordering::Relaxed);
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
    pub(super) fn new() -> Self {
        MagState {
            blocks: Vec::with_capacity(MAGAZINE),
            lent: 0,
            counts: MagCounts::default(),
        }
    }

    /// Whether the oldest block is due at `now` (released `ttl` or more
    /// ago).
    #[inline(always)]
    pub(super) fn oldest_due(&self, now: u64, ttl: u64) -> bool {
        match self.blocks.first() {
            Some(&(_, _, at)) => now.saturating_sub(at) >= ttl,
            None => false,
        }
    }

    /// Takes out every block due at `now`.
    #[cold]
    pub(super) fn take_due(&mut self, now: u64, ttl: u64) -> Vec<(B, usize)> {
        let due = self
            .blocks
            .iter()
            .take_while(|&&(_, _, at)| now.saturating_sub(at) >= ttl)
            .count();
        self.blocks.drain(..due).map(|(b, c, _)| (b, c)).collect()
    }

    /// The hot path of a release to the magazine: `block` of `class`,
    /// released at `now`, goes in if nothing is due (by `ttl`) and there
    /// is room and a handle left; else it comes back, with `true` when a
    /// block is due (the whole path frees it, and may take this one).
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
        } else if self.blocks.len() < MAGAZINE && handles.load(Ordering::Acquire) > 0 {
            self.blocks.push((block, class, now));
            self.lent -= 1;
            Ok(())
        } else {
            Err((block, false))
        }
    }

    /// A hit: the most recently released block of `class` for a request
    /// of `size`, lent and counted, if the magazine has one.
    #[inline(always)]
    pub(super) fn take_hit(&mut self, class: usize, size: usize) -> Option<B> {
        let block = self.take(class)?;
        self.count_hit(class, size);
        Some(block)
    }

    /// The most recently released block of `class`, if any.
    #[inline(always)]
    fn take(&mut self, class: usize) -> Option<B> {
        let i = self.blocks.iter().rposition(|&(_, c, _)| c == class)?;
        if i + 1 == self.blocks.len() {
            // The usual case: the last block released is reused.
            return self.blocks.pop().map(|(b, _, _)| b);
        }
        Some(self.blocks.remove(i).0)
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
        let bytes = self.blocks.iter().map(|&(_, c, _)| c).sum();
        (self.blocks.len() as u64, bytes)
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

    #[test]
    fn an_owner_gives_up_while_a_visitor_holds_the_magazine() {
        let mag = Arc::new(Magazine::<u64>::new());
        let mut list = vec![Arc::clone(&mag)];
        let (inside, done) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let owner = {
            let (mag, inside, done) = (Arc::clone(&mag), Arc::clone(&inside), Arc::clone(&done));
            thread::spawn(move || {
                inside.wait();
                // The visitor is inside its visit: the owner must not get in.
                let during = mag.owned(|m| m.blocks.push((1, 8, 0)));
                done.wait();
                (during, mag.owned(|m| m.blocks.len()))
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
            m.blocks.push((2, 8, 0));
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
        let mag = Arc::new(Magazine::<u64>::new());
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
                    m.blocks.push((7, 8, 0));
                    m.lent -= 1;
                    step.store(1, Ordering::SeqCst);
                })
            })
        };
        inside.wait();
        let mut seen = None;
        visit(&mut list, |m| {
            seen = Some((step.load(Ordering::SeqCst), m.blocks.len(), m.lent));
        });
        assert_eq!(owner.join().unwrap(), Some(()));
        assert_eq!(seen, Some((1, 1, -1)));
    }
}
