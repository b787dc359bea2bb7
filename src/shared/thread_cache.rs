//! Per-thread caches ("magazines") in front of a
//! [`SharedPool`](crate::SharedPool)'s cache, for pools from
//! [`SharedPool::with_thread_caches`](crate::SharedPool::with_thread_caches).
//!
//! Each thread that allocates from such a pool gets a magazine for it: up
//! to [`MAGAZINE`] idle blocks with their release times, behind a lock of
//! their own that only this thread takes on its operations (other threads
//! take it only to drain the magazine or read its counters). The pool
//! keeps every magazine in a list under its cache lock; the thread keeps a
//! table from pool to magazine, which holds the pool weakly (it never keeps
//! a pool alive) and the magazine strongly.
//!
//! The blocks of a magazine are counted in use by the pool's cache: the
//! pool's statistics move them to the cached counts when read. A thread
//! that exits leaves its magazine in the pool's list, where `collect`,
//! `trim`, the limit, the out-of-memory retry and the pool's drop reach it;
//! `collect` drops it from the list once it is empty.

use core::cell::RefCell;
use core::mem::ManuallyDrop;
use std::sync::{Arc, Weak};

use super::lock::CacheLock;

/// The most blocks a magazine holds.
pub(super) const MAGAZINE: usize = 8;

/// A magazine and its counters, behind its own lock.
pub(super) type Magazine<B> = CacheLock<MagState<B>>;

/// What a magazine's lock guards. Aligned to a cache line pair, so that
/// two threads' magazines (and their locks) never share a line.
#[repr(align(128))]
pub(super) struct MagState<B> {
    /// Idle blocks: the block, its class and the time it was released at,
    /// oldest first (each release pushes at the end).
    pub(super) blocks: Vec<(B, usize, u64)>,
    /// Blocks lent through this magazine less those given back through it
    /// (negative when its thread gives back blocks lent elsewhere).
    pub(super) lent: isize,
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

    /// The most recently released block of `class`, if any.
    #[inline(always)]
    pub(super) fn take(&mut self, class: usize) -> Option<B> {
        let i = self.blocks.iter().rposition(|&(_, c, _)| c == class)?;
        Some(self.blocks.remove(i).0)
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
        for e in self.0.drain(..) {
            // SAFETY: the entry's pointers came from `into_raw` of the types
            // `drop_refs` was instantiated with, and are dropped once here.
            unsafe { (e.drop_refs)(e.pool, e.mag) };
        }
    }
}

thread_local! {
    static TABLE: RefCell<Table> = const { RefCell::new(Table(Vec::new())) };
}

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
    let f = |table: &RefCell<Table>| {
        let Ok(mut table) = table.try_borrow_mut() else {
            return Found::Unavailable;
        };
        let entries = &mut table.0;
        let Some(i) = entries.iter().position(|e| e.pool == pool) else {
            return Found::Missing;
        };
        if i != 0 {
            // The last pool used comes first: its lookup is one comparison.
            entries.swap(0, i);
        }
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
        true
    };
    TABLE.try_with(f).unwrap_or(false)
}
