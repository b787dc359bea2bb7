//! The lock around a [`SharedPool`](crate::SharedPool)'s cache.
//!
//! The cache lock is taken twice per round trip (an `allocate` and the
//! release of its block), and only for a store lookup and a policy check:
//! no backing call ever runs under it. Taking it costs one atomic
//! read-modify-write and releasing it a plain store, against two
//! read-modify-writes for [`std::sync::Mutex`] (whose release must learn
//! whether to wake a sleeper). A waiter spins a little, then yields, then
//! sleeps in short naps, so a lock held for long (inside
//! [`SharedPool::with`](crate::SharedPool::with)) costs its waiters little
//! processor time, and each sees it free at most one nap late.
//!
//! A panic under the lock releases it (the guard is dropped on unwinding):
//! there is no poisoning, as the pool recovers from panics under its locks
//! anyway.

use core::cell::UnsafeCell;
use core::hint::spin_loop;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::thread;

/// See the module documentation.
pub(super) struct CacheLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one thread at a time (the flag is
// taken with an acquiring read-modify-write and released with a releasing
// store), so sharing the lock only moves `T` between threads: `T: Send`.
unsafe impl<T: Send> Sync for CacheLock<T> {}

/// Spins before the first yield.
const SPINS: u32 = 64;
/// Yields before the first nap.
const YIELDS: u32 = 64;
/// The longest nap.
const MAX_NAP: Duration = Duration::from_micros(50);

impl<T> CacheLock<T> {
    pub(super) const fn new(value: T) -> Self {
        CacheLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting as long as it takes.
    #[inline(always)]
    pub(super) fn lock(&self) -> Guard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        Guard {
            lock: self,
            _not_shared: PhantomData,
        }
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
            round = round.saturating_add(1);
            if round < SPINS {
                spin_loop();
            } else if round < SPINS + YIELDS {
                thread::yield_now();
            } else {
                let naps = round - SPINS - YIELDS;
                let nap = Duration::from_micros(1u64 << naps.min(6));
                thread::sleep(nap.min(MAX_NAP));
            }
        }
    }

    /// Takes the lock if it is free.
    pub(super) fn try_lock(&self) -> Option<Guard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Guard {
                lock: self,
                _not_shared: PhantomData,
            })
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
/// `T: Sync`, a bound the lock does not ask for.
pub(super) struct Guard<'a, T> {
    lock: &'a CacheLock<T>,
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
        self.lock.locked.store(false, Ordering::Release);
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
                        let mut g = lock.lock();
                        let v = *g;
                        spin_loop();
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(*lock.lock(), 3 * rounds);
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
