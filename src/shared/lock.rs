//! The lock around a [`SharedPool`](crate::SharedPool)'s cache.
//!
//! The cache lock is taken twice per round trip (an `allocate` and the
//! release of its block), and only for a store lookup and a policy check:
//! no backing call ever runs under it. Taking it costs one atomic
//! read-modify-write and releasing it a plain store, against two
//! read-modify-writes for [`std::sync::Mutex`] (whose release must learn
//! whether to wake a sleeper). A waiter spins a little (in rounds that
//! double, so that it leaves a busy holder alone longer and longer), then
//! yields, then sleeps in short naps, so a lock held for long (inside
//! [`SharedPool::with`](crate::SharedPool::with)) costs its waiters little
//! processor time, and each sees it free at most one nap late.
//!
//! # Bias
//!
//! A pool is often used by one thread at a time for long stretches, and
//! the read-modify-write is most of what sharing it costs. A lock made
//! with [`CacheLock::biased`] is *biased* to the first thread that takes
//! it, the *owner*, on a 64-bit target where the thread caches' barrier
//! is available ([`barrier::available`]: Linux, not under Miri or the
//! ThreadSanitizer build). Threads are told apart by a token each gets
//! once ([`token`]), never reused. The owner then takes and releases it with plain loads and
//! stores and a compiler fence, and any other thread, a *visitor*, takes
//! the flag as before and then revokes the bias, with the same asymmetric
//! handshake as the thread caches (`super::thread_cache`):
//!
//! ```text
//! owner                                   visitor (holding `locked`)
//! busy = true        (relaxed store)      bias = NONE        (relaxed store)
//! compiler fence                          membarrier         (barrier::heavy)
//! if bias != me (acquire load): undo,     wait until !busy   (acquire load)
//!   take `locked` as a visitor does
//! ... work on the value ...               ... work on the value ...
//! busy = false       (release store)      locked = false     (release store)
//! ```
//!
//! The system call puts a full barrier in the owner's instruction stream
//! after the visitor's store is visible: before the owner's `busy = true`,
//! and the owner reads the bias revoked and takes the flag instead (which
//! the visitor holds); after it, and the visitor sees `busy` set and waits
//! for the owner's release. The owner's writes are visible to the visitor
//! through the acquiring load of `busy`, the visitor's to the owner
//! through the acquiring read-modify-write of `locked` (an owner only ever
//! gets its bias, again, under the flag).
//!
//! A visit costs a system call, so a bias once revoked is not given back
//! at once: the lock has no owner until one thread takes the flag
//! [`REBIAS_AFTER`] times in a row (no other thread in between), which
//! then owns it. Two threads sharing the work keep it unbiased; one left
//! alone (a reaper's `collect` on a timer, a `stats` now and then) earns
//! it back. The system calls cost at most one per `REBIAS_AFTER`
//! operations.
//!
//! # A stale owner
//!
//! `busy` is one flag, which every owner the lock ever has writes. An
//! owner that read the bias as its own and was then preempted before its
//! store of `busy = true` is *stale*: a visit meanwhile saw `busy` clear
//! and revoked the bias without waiting for it. When it runs again it
//! stores `busy = true`, reads the bias revoked and stores `busy = false`
//! as it backs out, harmless while the lock has no owner; but had another
//! thread earned the bias meanwhile and been inside its fast path then,
//! that `false` would let the next visitor in beside it (two threads
//! alternating on a pool, preempted on a loaded machine, lost updates
//! this way: `cargo bench --bench shared_pool -- 64_classes_2_threads`
//! next to other processes). So after a revocation the lock takes no
//! new owner until the revoked one has taken the flag (then its window
//! is behind it: it backs out before it takes the flag): the lock
//! remembers it (`revoked`), under the flag. The revoked owner itself
//! may earn the bias back at once; an owner that exits or leaves the
//! pool for good keeps the lock unbiased, which costs the other threads
//! the flag's read-modify-write, not correctness.
//!
//! A panic under the lock releases it (the guard is dropped on unwinding):
//! there is no poisoning, as the pool recovers from panics under its locks
//! anyway.

use core::cell::{Cell, UnsafeCell};
use core::hint::spin_loop;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering, compiler_fence};
use core::time::Duration;
use std::thread;

use super::barrier;

/// See the module documentation.
pub(super) struct CacheLock<T> {
    locked: AtomicBool,
    /// The owner's [`token`], [`FIRST`] until a first thread
    /// takes a biased lock, [`NONE`] between owners, or [`PLAIN`].
    bias: AtomicUsize,
    /// Set by the owner while it holds the lock through its fast path.
    busy: AtomicBool,
    /// The last thread that took the flag, and how many times in a row:
    /// written and read under the flag.
    streak_token: AtomicUsize,
    streak: AtomicU32,
    /// The owner whose bias was revoked last, until it takes the flag
    /// ([`NONE`] then): until it does, it may still be inside the window
    /// of its fast path, and no other thread may own the lock (see
    /// "A stale owner" in the module documentation). Written and read
    /// under the flag.
    revoked: AtomicUsize,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one thread at a time (the flag is
// taken with an acquiring read-modify-write and released with a releasing
// store; the owner of a bias excludes the flag's holders through the
// handshake of the module documentation), so sharing the lock only moves
// `T` between threads: `T: Send`.
unsafe impl<T: Send> Sync for CacheLock<T> {}

/// Rounds of doubling spins, plus one, before the first yield (see
/// `back_off`).
const SPINS: u32 = 10;
/// Yields before the first nap.
const YIELDS: u32 = 64;
/// The longest nap.
const MAX_NAP: Duration = Duration::from_micros(50);

/// A biased lock no thread took yet: the first to take it owns it.
const FIRST: usize = 1;
/// A biased lock without an owner, since a visit revoked its bias.
const NONE: usize = 0;
/// A lock without bias ([`CacheLock::new`]). (No thread's token.)
const PLAIN: usize = usize::MAX;
/// How many times in a row one thread takes the flag of a biased lock
/// without an owner before it owns it.
pub(super) const REBIAS_AFTER: u32 = 4096;

/// The token of a thread whose thread-locals are gone: it never owns a
/// lock.
const NO_THREAD: usize = 2;
/// The next thread's token.
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(NO_THREAD + 1);

/// The calling thread's token, given on its first call and never given to
/// another thread (a 64-bit count: only 64-bit targets bias their locks),
/// or [`NO_THREAD`] once its thread-locals are gone.
#[inline(always)]
fn token() -> usize {
    thread_local!(static TOKEN: Cell<usize> = const { Cell::new(0) });
    TOKEN
        .try_with(|t| match t.get() {
            0 => {
                let new = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
                t.set(new);
                new
            }
            token => token,
        })
        .unwrap_or(NO_THREAD)
}

/// Waits with the contended lock's back-off: spin, yield, then nap.
///
/// The spins double: the `r`-th round spins `2^r` times (2, 4, … 512;
/// 1022 in all, about 26 µs on the AMD EPYC this project is measured on,
/// where one spin takes about 25 ns) before looking at the lock again. A
/// waiter that looked after every spin took the lock back from a busy
/// holder within a few operations, and the lock and the pool's lines
/// crossed between the processors at each turn: two threads on one
/// `SharedPool::new` did 127 to 175 ns per operation against 44 to 62 ns
/// with the doubling (`cargo bench --bench shared_pool --
/// shared_pool_2`, three runs of each, alternating).
#[inline]
fn back_off(round: &mut u32) {
    *round = round.saturating_add(1);
    if *round < SPINS {
        for _ in 0..1u32 << *round {
            spin_loop();
        }
    } else if *round < SPINS + YIELDS {
        thread::yield_now();
    } else {
        let naps = *round - SPINS - YIELDS;
        let nap = Duration::from_micros(1u64 << naps.min(6));
        thread::sleep(nap.min(MAX_NAP));
    }
}

impl<T> CacheLock<T> {
    /// A lock without bias: every thread takes the flag.
    pub(super) const fn new(value: T) -> Self {
        CacheLock {
            locked: AtomicBool::new(false),
            bias: AtomicUsize::new(PLAIN),
            busy: AtomicBool::new(false),
            streak_token: AtomicUsize::new(NONE),
            streak: AtomicU32::new(0),
            revoked: AtomicUsize::new(NONE),
            value: UnsafeCell::new(value),
        }
    }

    /// A lock biased to the first thread that takes it, where the barrier
    /// is available (module documentation); else as [`new`](Self::new).
    pub(super) fn biased(value: T) -> Self {
        let lock = Self::new(value);
        if cfg!(target_pointer_width = "64") && barrier::available() {
            lock.bias.store(FIRST, Ordering::Relaxed);
        }
        lock
    }

    /// Takes the lock, waiting as long as it takes.
    #[inline(always)]
    pub(super) fn lock(&self) -> Guard<'_, T> {
        let me = token();
        if self.bias.load(Ordering::Relaxed) == me && !self.busy.load(Ordering::Relaxed) {
            // (`busy` set by this thread: `lock` re-entered, which waits
            // below for ever, as with the flag.)
            if let Some(guard) = self.try_owner(me) {
                return guard;
            }
        }
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        self.holding_flag(me, true)
            .expect("a visitor that waits gets the lock")
    }

    /// The owner's fast path: `None` when a visitor revoked the bias
    /// meanwhile (then `busy` is clear again).
    #[inline(always)]
    fn try_owner(&self, me: usize) -> Option<Guard<'_, T>> {
        self.busy.store(true, Ordering::Relaxed);
        // Keeps the compiler from moving the load of the bias above the
        // store of `busy`; the visitor's barrier does the processor's part.
        compiler_fence(Ordering::SeqCst);
        if self.bias.load(Ordering::Acquire) != me {
            self.busy.store(false, Ordering::Release);
            return None;
        }
        Some(Guard {
            lock: self,
            owner: true,
            _not_shared: PhantomData,
        })
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut round = 0u32;
        loop {
            if !self.locked.load(Ordering::Relaxed)
                && self
                    .locked
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            back_off(&mut round);
        }
    }

    /// With the flag taken by the thread `me`: settles the bias (keeps
    /// its owner out, or gives it to `me`) and returns the guard. `None`
    /// when `wait` is false and the owner is inside its fast path (the
    /// flag is then released and the bias left as it was).
    #[inline(always)]
    fn holding_flag(&self, me: usize, wait: bool) -> Option<Guard<'_, T>> {
        let bias = self.bias.load(Ordering::Relaxed);
        if bias == PLAIN {
            return Some(self.flag_guard());
        }
        self.settle_bias(me, bias, wait)
    }

    #[cold]
    #[inline(never)]
    fn settle_bias(&self, me: usize, bias: usize, wait: bool) -> Option<Guard<'_, T>> {
        let mut round = 0u32;
        if bias == me {
            // The owner, come by the flag (a visit revoked its bias while
            // it checked, or `lock` re-entered): only it sets `busy`, so
            // this waits only on a re-entered lock, for ever, as the flag
            // would.
            while self.busy.load(Ordering::Acquire) {
                if !wait {
                    self.locked.store(false, Ordering::Release);
                    return None;
                }
                back_off(&mut round);
            }
            return Some(self.flag_guard());
        }
        if bias != FIRST && bias != NONE {
            // A visitor: keep the owner out (module documentation).
            self.bias.store(NONE, Ordering::Relaxed);
            barrier::heavy();
            while self.busy.load(Ordering::Acquire) {
                if !wait {
                    // Back as it was: an owner that saw the bias revoked
                    // waits for the flag, which it takes once released.
                    self.bias.store(bias, Ordering::Release);
                    self.locked.store(false, Ordering::Release);
                    return None;
                }
                back_off(&mut round);
            }
            // A bias is given only while no revoked owner is pending.
            debug_assert_eq!(self.revoked.load(Ordering::Relaxed), NONE);
            self.revoked.store(bias, Ordering::Relaxed);
        }
        // The last owner, come by the flag: it is past its fast path's
        // window (it took the flag after it), so another thread may own
        // the lock now.
        if self.revoked.load(Ordering::Relaxed) == me {
            self.revoked.store(NONE, Ordering::Relaxed);
        }
        // No owner now: the first taker, or one with a long enough streak,
        // becomes it (no fast path to exclude; the flag's release
        // publishes the bias with the value).
        let streak = if self.streak_token.load(Ordering::Relaxed) == me {
            self.streak.load(Ordering::Relaxed).saturating_add(1)
        } else {
            self.streak_token.store(me, Ordering::Relaxed);
            1
        };
        self.streak.store(streak, Ordering::Relaxed);
        let stale = self.revoked.load(Ordering::Relaxed) != NONE;
        if me != NO_THREAD && (bias == FIRST || (streak >= REBIAS_AFTER && !stale)) {
            self.bias.store(me, Ordering::Relaxed);
        }
        Some(self.flag_guard())
    }

    #[inline(always)]
    fn flag_guard(&self) -> Guard<'_, T> {
        Guard {
            lock: self,
            owner: false,
            _not_shared: PhantomData,
        }
    }

    /// Takes the lock if it is free (a visitor does not wait for the
    /// owner's fast path either).
    pub(super) fn try_lock(&self) -> Option<Guard<'_, T>> {
        let me = token();
        if self.bias.load(Ordering::Relaxed) == me {
            if self.busy.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(guard) = self.try_owner(me) {
                return Some(guard);
            }
        }
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        self.holding_flag(me, false)
    }

    /// The value, through exclusive access to the lock.
    pub(super) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    /// A pointer to the value, for a caller that excludes every other
    /// access by other means than the lock (the thread caches' asymmetric
    /// protocol): dereferencing it is the caller's responsibility.
    #[inline(always)]
    pub(super) fn as_ptr(&self) -> *mut T {
        self.value.get()
    }
}

/// The lock, held; released when dropped.
///
/// Neither `Send` nor `Sync` (the marker), as `std`'s guard: shared
/// between threads it would hand out `&T` to two at once, which needs
/// `T: Sync`, a bound the lock does not ask for. (Nor may it be sent: the
/// owner's fast path is released by its owner.)
pub(super) struct Guard<'a, T> {
    lock: &'a CacheLock<T>,
    /// Held through the owner's fast path (`busy`), not the flag.
    owner: bool,
    _not_shared: PhantomData<*mut T>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock: no other reference to the value
        // exists until it is dropped.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`; `&mut self` makes this reference unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.owner {
            self.lock.busy.store(false, Ordering::Release);
        } else {
            self.lock.locked.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_take_turns() {
        let lock = Arc::new(CacheLock::new(0u64));
        let rounds = if cfg!(miri) { 20 } else { 10_000 };
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let lock = Arc::clone(&lock);
                thread::spawn(move || {
                    for _ in 0..rounds {
                        bump(&lock);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(*lock.lock(), 3 * rounds);
    }

    /// Whether this process has the barrier the bias needs (else the
    /// bias tests check that a biased lock works as a plain one).
    fn biasable() -> bool {
        barrier::available()
    }

    /// Adds one to the value under the lock, as a read, a pause and a
    /// write (an update lost to two holders at once would show).
    fn bump(lock: &CacheLock<u64>) -> Guard<'_, u64> {
        let mut g = lock.lock();
        let v = *g;
        spin_loop();
        *g = v + 1;
        g
    }

    #[test]
    fn the_owner_takes_a_biased_lock_without_the_flag() {
        let lock = CacheLock::biased(0u64);
        // The first taker gets the bias, through the flag.
        let g = lock.lock();
        assert!(!g.owner);
        drop(g);
        for _ in 0..3 {
            let mut g = lock.lock();
            *g += 1;
            if biasable() {
                assert!(g.owner);
                assert!(
                    !lock.locked.load(Ordering::Relaxed),
                    "the flag is not taken"
                );
                assert!(lock.busy.load(Ordering::Relaxed));
            } else {
                assert!(!g.owner);
            }
        }
        assert!(!lock.busy.load(Ordering::Relaxed));
        assert_eq!(*lock.lock(), 3);
        // An unbiased lock never is.
        let plain = CacheLock::new(());
        drop(plain.lock());
        assert!(!plain.lock().owner);
    }

    #[test]
    fn a_visit_revokes_the_bias_and_a_streak_earns_it_back() {
        if !biasable() {
            return;
        }
        let lock = CacheLock::biased(0u32);
        drop(lock.lock());
        let me = token();
        assert_eq!(lock.bias.load(Ordering::Relaxed), me);
        thread::scope(|s| {
            s.spawn(|| {
                let mut g = lock.lock();
                assert!(!g.owner);
                assert_eq!(lock.bias.load(Ordering::Relaxed), NONE, "revoked");
                *g += 1;
            });
        });
        assert_eq!(lock.bias.load(Ordering::Relaxed), NONE);
        // The flag, in a row, until the streak gives the bias back.
        for k in 1..=REBIAS_AFTER {
            let mut g = lock.lock();
            assert!(!g.owner, "owner again after {k} takes");
            *g += 1;
        }
        assert_eq!(lock.bias.load(Ordering::Relaxed), me);
        assert!(lock.lock().owner);
        // Another thread in the middle of a streak breaks it.
        thread::scope(|s| {
            s.spawn(|| *lock.lock() += 1);
        });
        for _ in 0..REBIAS_AFTER - 1 {
            *lock.lock() += 1;
        }
        thread::scope(|s| {
            s.spawn(|| *lock.lock() += 1);
        });
        *lock.lock() += 1;
        assert_eq!(
            lock.bias.load(Ordering::Relaxed),
            NONE,
            "no streak: no owner"
        );
        assert_eq!(*lock.lock(), 2 * REBIAS_AFTER + 3);
    }

    #[test]
    fn no_other_thread_owns_the_lock_until_the_revoked_owner_takes_the_flag() {
        if !biasable() {
            return;
        }
        let lock = CacheLock::biased(0u32);
        drop(lock.lock());
        // A visitor revokes this thread's bias, then takes the flag twice
        // the streak in a row: this thread might still be inside its fast
        // path's window (a stale owner), so no bias for the visitor.
        thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..2 * REBIAS_AFTER {
                    *lock.lock() += 1;
                }
            });
        });
        assert_eq!(lock.bias.load(Ordering::Relaxed), NONE, "a stale owner");
        // Once the revoked owner has taken the flag, a streak earns it.
        *lock.lock() += 1;
        let other = thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..REBIAS_AFTER {
                    *lock.lock() += 1;
                }
                token()
            })
            .join()
            .unwrap()
        });
        assert_eq!(lock.bias.load(Ordering::Relaxed), other);
        assert_eq!(*lock.lock(), 3 * REBIAS_AFTER + 1);
    }

    #[test]
    fn a_visitor_waits_for_the_owner_inside_its_fast_path() {
        let lock = CacheLock::biased(Vec::<u32>::new());
        drop(lock.lock());
        let mut g = lock.lock();
        thread::scope(|s| {
            let visitor = s.spawn(|| {
                let mut v = lock.lock();
                v.push(2);
            });
            // However long the owner holds it, the visitor waits.
            thread::sleep(Duration::from_millis(50));
            g.push(1);
            assert!(!visitor.is_finished());
            drop(g);
            visitor.join().unwrap();
        });
        assert_eq!(*lock.lock(), [1, 2]);
    }

    #[test]
    fn try_lock_neither_waits_for_the_owner_nor_loses_its_bias() {
        let lock = CacheLock::biased(0u8);
        drop(lock.lock());
        let owner = lock.bias.load(Ordering::Relaxed);
        let g = lock.lock();
        // The owner itself (re-entered) and another thread: both refused.
        assert!(lock.try_lock().is_none());
        thread::scope(|s| {
            s.spawn(|| assert!(lock.try_lock().is_none()));
        });
        assert_eq!(lock.bias.load(Ordering::Relaxed), owner);
        // Held through the owner's path, with a bias; else the flag.
        assert_eq!(lock.locked.load(Ordering::Relaxed), !biasable());
        drop(g);
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn owner_and_visitors_take_turns_with_the_bias_coming_and_going() {
        // The owner works on and on; a visitor comes now and then (each
        // visit revokes the bias, which the owner's streak earns back
        // before the next), then shares the work (no streak: no owner).
        let lock = CacheLock::biased(0u64);
        drop(lock.lock());
        let rounds: u64 = if cfg!(miri) { 50 } else { 200_000 };
        let visits: u64 = if cfg!(miri) { 3 } else { 20 };
        let done = AtomicBool::new(false);
        let visitor_rounds = thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..rounds {
                    bump(&lock);
                }
                done.store(true, Ordering::Release);
            });
            let visitor = s.spawn(|| {
                let mut n = 0u64;
                for _ in 0..visits {
                    thread::sleep(Duration::from_millis(2));
                    bump(&lock);
                    n += 1;
                }
                // Then at work beside the owner until it is done.
                while !done.load(Ordering::Acquire) {
                    bump(&lock);
                    n += 1;
                }
                n
            });
            visitor.join().unwrap()
        });
        assert_eq!(*lock.lock(), rounds + visitor_rounds, "an update was lost");
    }

    #[test]
    fn revocations_in_a_tight_loop_lose_no_update() {
        // Every visit hands the bias back to the owner before it lets go
        // (as the owner's streak would, much later), so the owner meets
        // revocations between its first check of the bias and its store
        // of `busy` again and again: the check after the store is what
        // keeps it out then. The visitor yields between visits, so that
        // the owner gets on even on a loaded machine.
        let lock = CacheLock::biased(0u64);
        drop(lock.lock());
        let owner = lock.bias.load(Ordering::Relaxed);
        let visits: u64 = if cfg!(miri) { 20 } else { 2_000 };
        let min_rounds: u64 = if cfg!(miri) { 20 } else { 10_000 };
        let done = AtomicBool::new(false);
        let rounds = thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..visits {
                    let g = bump(&lock);
                    if biasable() {
                        // Releasing, under the flag: the owner that reads
                        // it back sees our writes. (As the owner's streak
                        // would: it took the flag in between.)
                        lock.revoked.store(NONE, Ordering::Relaxed);
                        lock.bias.store(owner, Ordering::Release);
                    }
                    drop(g);
                    thread::yield_now();
                }
                done.store(true, Ordering::Release);
            });
            let mut rounds = 0u64;
            while rounds < min_rounds || !done.load(Ordering::Acquire) {
                bump(&lock);
                rounds += 1;
            }
            rounds
        });
        assert_eq!(*lock.lock(), rounds + visits, "an update was lost");
    }

    #[test]
    fn try_lock_fails_while_held_and_a_panic_releases() {
        let lock = CacheLock::new(1);
        let g = lock.lock();
        assert!(lock.try_lock().is_none());
        drop(g);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = lock.lock();
            panic!("under the lock");
        }));
        assert!(r.is_err());
        assert_eq!(lock.try_lock().map(|g| *g), Some(1));
    }
}
