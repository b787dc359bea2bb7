//! The allocator-free half of a pool: the cache store, the clock, the
//! rules (size classes, limit, retry ladder) and the counters.
//!
//! A [`Cache`] never calls the backing allocator. Every block it lets go is
//! handed to a `free` callback, already counted as deallocated; the caller
//! deallocates it. [`DecayingPool`](crate::DecayingPool) deallocates at
//! once; [`SharedPool`](crate::SharedPool) collects the blocks under its
//! cache lock and deallocates them after releasing it, so a slow backing
//! call never holds up other threads' hits.

use core::any::Any;
use core::cell::Cell;
use core::mem::ManuallyDrop;
use core::ptr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::class::{SizeClass, Steps};
use crate::clock::Clock;
use crate::error::PoolError;
use crate::observe::{Event, Extras, Reason};
use crate::policy::{Policy, Reuse};
use crate::stats::{ClassStats, Stats};
use crate::store::Store;

/// The counters a pool keeps; cached counts come from the store.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    misses: u64,
    evictions: u64,
    trimmed: u64,
    backing_allocs: u64,
    backing_deallocs: u64,
    backing_failures: u64,
    /// Class bytes held from the backing allocator (in use + cached); the
    /// counts in use are derived from it and the store's, so a hit or a
    /// release updates no counter of its own here.
    bytes_reserved: usize,
    peak_bytes_reserved: usize,
    /// The peak of the bytes in use up to the last change of
    /// `bytes_reserved` (or reset of the peaks): the peak so far is the
    /// larger of this and `bytes_reserved - low_cached` (see
    /// [`Cache::peak_bytes_in_use`]).
    peak_bytes_in_use: usize,
    /// The fewest bytes cached since `bytes_reserved` last changed (or the
    /// peaks were reset). While the bytes reserved stay the same, the bytes
    /// in use (reserved less cached) peak where the bytes cached are
    /// fewest, so a hit compares the bytes it leaves cached with this, one
    /// comparison against a value it has in hand, where keeping the peak
    /// itself took a subtraction from a counter it would load.
    low_cached: usize,
    bytes_from_backing: usize,
    /// Class bytes minus requested bytes, summed over successful
    /// allocations; counted only when sizes are rounded.
    waste: usize,
}

/// What to do after a failed backing allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Cached blocks were freed: call the backing allocator again.
    Again,
    /// Return the backing allocator's error.
    GiveUp,
}

/// See the module documentation.
pub(crate) struct Cache<B, P: Policy, C> {
    store: P::Store<B>,
    clock: C,
    size_class: SizeClass,
    /// Whether `size_class` rounds nothing: the hit path skips its `match`.
    exact: bool,
    /// Whether `exact` and no `extras`: a release then tests this one
    /// flag, and the rest take [`Cache::release_class`].
    plain: bool,
    /// `size_class` as shifts, when its steps are powers of two: the
    /// inlined hit path's rounding, without a `match`. (A release rounds
    /// with `SizeClass::round`: with these shifts, batches of releases
    /// took 25.8 ns a block against 20.2, for fewer instructions;
    /// `docs/PERFORMANCE.md`, "Tried and dropped".)
    steps: Option<Steps>,
    /// The size of the last request that `allocate` rounded on its inlined
    /// path, and its class (`round_remembered`): a release of that size
    /// (the round trip's) takes its class from here rather than rounding
    /// again. Rounding depends on the size alone, so the pair never goes
    /// stale. `(0, usize::MAX)` at first, a class no release passes the
    /// check of (a release of zero bytes must fail).
    last_rounded: (usize, usize),
    reuse: Reuse,
    limit: Option<usize>,
    stats: Counters,
    /// Class bytes of misses between `make_room` and their outcome: counted
    /// against the limit, not yet in `bytes_reserved`.
    pending: usize,
    /// Whether `set_limit` left more reserved than the limit (blocks in use
    /// above it); cleared once a miss fits under it again.
    over_limit: bool,
    /// The observer and the statistics by class, when asked for.
    extras: Option<Box<Extras>>,
    /// The backing allocator's [`capacity`](crate::RawAllocator::capacity)
    /// as the last miss read it: what [`make_room`](Self::make_room)
    /// checks a request against when its caller cannot read the allocator
    /// (a [`SharedPool`](crate::SharedPool) holds the cache lock there).
    capacity: Option<usize>,
    /// PyTorch's `garbage_collection_threshold`: a fraction in `(0, 1]` of
    /// the limit (or, without one, of `capacity`) that a miss frees cached
    /// blocks oldest first to stay under ([`make_room`](Self::make_room)).
    gc_threshold: Option<f64>,
}

impl<B, P: Policy, C: Clock> Cache<B, P, C> {
    pub(crate) fn new(
        policy: P,
        clock: C,
        size_class: SizeClass,
        reuse: Reuse,
        limit: Option<usize>,
        extras: Option<Box<Extras>>,
    ) -> Self {
        Cache {
            store: policy.into_store(reuse),
            clock,
            size_class,
            exact: matches!(size_class, SizeClass::Exact | SizeClass::Multiple(0 | 1)),
            plain: matches!(size_class, SizeClass::Exact | SizeClass::Multiple(0 | 1))
                && extras.is_none(),
            steps: Steps::of(size_class),
            last_rounded: (0, usize::MAX),
            reuse,
            limit,
            stats: Counters::default(),
            pending: 0,
            over_limit: false,
            extras,
            capacity: None,
            gc_threshold: None,
        }
    }

    /// The time the policy runs at, in nanoseconds (zero for an untimed store, whose pool
    /// never reads the clock).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        if self.store.timed() {
            self.clock.now_nanos()
        } else {
            0
        }
    }

    /// A collection: [`run_policy`](Self::run_policy), after checking in
    /// debug builds that the policy's deadline agrees with `must_evict`.
    pub(crate) fn collect(
        &mut self,
        now: u64,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) -> usize {
        #[cfg(debug_assertions)]
        self.store.check_deadline(now);
        // Nothing due (the common case of a timer's or a reaper's call):
        // one comparison, with the loop's registers saved only when it
        // runs.
        if !self.store.may_evict(now) {
            return 0;
        }
        self.collect_due(now, free)
    }

    /// [`collect`](Self::collect) once a block may be due: out of line.
    #[inline(never)]
    fn collect_due(&mut self, now: u64, free: &mut (impl FnMut(B, usize) + ?Sized)) -> usize {
        self.run_policy(now, free)
    }

    /// Frees every block the policy says must go at `now`; returns how many.
    #[inline(always)]
    pub(crate) fn run_policy(
        &mut self,
        now: u64,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) -> usize {
        let mut freed = 0;
        while let Some((block, class)) = self.store.evict_due(now) {
            self.let_go(block, class, Reason::Expired, free);
            freed += 1;
        }
        freed
    }

    /// [`run_policy`](Self::run_policy) for a release's collection, which
    /// runs out of line: the store's slow path is inlined here
    /// (`Store::evict_due_inline`), so the release pays one call, not two.
    #[inline(always)]
    fn run_policy_inline(&mut self, now: u64, free: &mut (impl FnMut(B, usize) + ?Sized)) {
        while let Some((block, class)) = self.store.evict_due_inline(now) {
            self.let_go(block, class, Reason::Expired, free);
        }
    }

    /// Whether [`run_policy`](Self::run_policy) may free a block at `now`
    /// ([`Store::may_evict`]): `false` only when it certainly frees none.
    #[inline(always)]
    pub(crate) fn may_evict(&self, now: u64) -> bool {
        self.store.may_evict(now)
    }

    /// The class of a request, or why it cannot have one.
    #[inline(always)]
    pub(crate) fn class_of<E>(&self, size: usize) -> Result<usize, PoolError<E>> {
        match self.round(size) {
            Some(class) => Ok(class),
            None if size == 0 => Err(PoolError::ZeroSize),
            None => Err(PoolError::TooLarge { requested: size }),
        }
    }

    /// Whether the pool's inlined hit path takes the hit: the store takes
    /// its hits inline ([`Store::hits_inline`]).
    #[inline(always)]
    pub(crate) fn hits_inline(&self) -> bool {
        self.store.hits_inline()
    }

    /// Whether every size is its own class.
    #[inline(always)]
    pub(crate) fn exact(&self) -> bool {
        self.exact
    }

    /// `round_inline`, remembering the class for the release of the same
    /// size (see `last_rounded`).
    #[inline(always)]
    pub(crate) fn round_remembered(&mut self, size: usize) -> Option<usize> {
        let class = self.round_inline(size)?;
        self.last_rounded = (size, class);
        Some(class)
    }

    /// [`round`](Self::round) without a call: `None` also where it would
    /// take 128-bit divisions ([`SizeClass::round_inline`]). For hit paths,
    /// which leave every `None` to their slow path.
    #[inline(always)]
    pub(crate) fn round_inline(&self, size: usize) -> Option<usize> {
        if self.exact {
            (size != 0).then_some(size)
        } else if let Some(steps) = self.steps {
            steps.round(size)
        } else {
            self.size_class.round_inline(size)
        }
    }

    /// The class of `size`: [`SizeClass::round`].
    #[inline(always)]
    fn round(&self, size: usize) -> Option<usize> {
        if self.exact {
            (size != 0).then_some(size)
        } else {
            self.size_class.round(size)
        }
    }

    /// Blocks handed out and not released.
    #[inline]
    fn blocks_in_use(&self) -> u64 {
        self.stats.backing_allocs - self.stats.backing_deallocs - self.store.len() as u64
    }

    /// Class bytes handed out and not released.
    #[inline]
    fn bytes_in_use(&self) -> usize {
        self.stats.bytes_reserved - self.store.bytes()
    }

    /// Counts a block the cache lets go (for `reason`) as freed, hands it
    /// to `free`, then tells the observer.
    #[inline(always)]
    fn let_go(
        &mut self,
        block: B,
        class: usize,
        reason: Reason,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) {
        if reason.is_eviction() {
            self.stats.evictions += 1;
        } else {
            self.stats.trimmed += 1;
        }
        self.stats.backing_deallocs += 1;
        self.unreserve(class);
        if let Some(x) = self.extras.as_deref_mut() {
            x.freeing(class, reason);
        }
        free(block, class);
        if let Some(x) = self.extras.as_deref_mut() {
            x.tell(Event::Freed {
                size: class,
                reason,
            });
        }
    }

    /// A hit: a cached block of `class` for a request of `size` bytes,
    /// counted in use.
    #[inline(always)]
    pub(crate) fn take(&mut self, size: usize, class: usize, now: u64) -> Option<B> {
        let block = self.store.take(class, now)?;
        self.count_taken(size, class);
        Some(block)
    }

    /// [`take`](Self::take) on the pool's inlined hit path: `None` also
    /// when the hit must go out of line ([`Store::take_inline`]), with
    /// nothing changed.
    #[inline(always)]
    pub(crate) fn take_inline(&mut self, size: usize, class: usize, now: u64) -> Option<B> {
        let block = self.store.take_inline(class, now)?;
        self.count_taken(size, class);
        Some(block)
    }

    /// Counts a hit of `class` for a request of `size` bytes.
    #[inline(always)]
    fn count_taken(&mut self, size: usize, class: usize) {
        self.count_request(size, class);
        let cached = self.store.bytes();
        if cached < self.stats.low_cached {
            // Tested first: a steady workload stores nothing here.
            self.stats.low_cached = cached;
        }
    }

    /// The peak of the bytes in use: the bytes reserved have not changed
    /// since `low_cached` was set, so the bytes in use peaked since at the
    /// bytes reserved less the fewest bytes cached.
    #[inline]
    fn peak_bytes_in_use(&self) -> usize {
        let s = &self.stats;
        s.peak_bytes_in_use.max(s.bytes_reserved - s.low_cached)
    }

    /// Before the bytes reserved change: folds the peak in use since the
    /// last change into `peak_bytes_in_use`.
    #[inline]
    fn settle_peak(&mut self) {
        self.stats.peak_bytes_in_use = self.peak_bytes_in_use();
    }

    /// `class` bytes are no longer reserved (their block was freed, or
    /// is being freed); the store no longer holds them.
    #[inline]
    fn unreserve(&mut self, class: usize) {
        self.settle_peak();
        self.stats.bytes_reserved -= class;
        self.stats.low_cached = self.store.bytes();
    }

    /// Counts the rounding of a request of `size` bytes served with `class`.
    #[inline(always)]
    fn count_request(&mut self, size: usize, class: usize) {
        if !self.exact {
            self.stats.waste = self.stats.waste.saturating_add(class - size);
        }
    }

    /// Before a miss calls the backing allocator: refuses a request that
    /// no backing call can ever serve (above the backing allocator's
    /// capacity as last read: [`Cache::capacity`]) and one that cannot fit
    /// the limit even with an empty cache, frees
    /// cached blocks oldest first until it fits, then, with a
    /// garbage-collection threshold, until the bytes reserved and booked
    /// with `class` are under it (or the cache is empty:
    /// [`collect_garbage`](Self::collect_garbage)), and books `class` bytes
    /// as pending. A refusal frees nothing.
    pub(crate) fn make_room<E>(
        &mut self,
        size: usize,
        class: usize,
        now: u64,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) -> Result<(), PoolError<E>> {
        let committed = self.bytes_in_use() + self.pending;
        if committed
            .checked_add(self.store.bytes())
            .and_then(|r| r.checked_add(class))
            .is_none()
        {
            return Err(PoolError::TooLarge { requested: size });
        }
        if let Some(limit) = self.limit {
            if committed + class > limit {
                return Err(PoolError::LimitExceeded {
                    requested: size,
                    limit,
                    reserved: self.stats.bytes_reserved,
                });
            }
        }
        if self.capacity.is_some_and(|c| class > c) {
            return Err(PoolError::TooLarge { requested: size });
        }
        if let Some(limit) = self.limit {
            while committed + self.store.bytes() + class > limit {
                if !self.trim_oldest(now, Reason::Limit, free) {
                    break;
                }
            }
            self.over_limit = false;
        }
        if self.gc_threshold.is_some() {
            self.collect_garbage(committed + class, now, free);
        }
        self.pending += class;
        Ok(())
    }

    /// The garbage-collection threshold of a miss that leaves `wanted`
    /// bytes reserved or booked besides the cache: while those and the
    /// bytes cached would pass the threshold's fraction of the limit (or,
    /// without one, of the capacity the last miss read), frees cached
    /// blocks oldest first ([`Reason::GcThreshold`]). Out of line: a pool
    /// without a threshold pays one test on its misses.
    #[inline(never)]
    fn collect_garbage(
        &mut self,
        wanted: usize,
        now: u64,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) {
        let Some(bytes) = self.gc_bytes() else { return };
        while wanted + self.store.bytes() > bytes {
            if !self.trim_oldest(now, Reason::GcThreshold, free) {
                break;
            }
        }
    }

    /// The threshold in bytes: the fraction of the limit, or of the
    /// capacity without one; `None` without a threshold or either figure.
    fn gc_bytes(&self) -> Option<usize> {
        let fraction = self.gc_threshold?;
        let of = self.limit.or(self.capacity)?;
        // Exact below 2^53 bytes; `as` saturates, and a fraction of at
        // most 1 never rounds past `of`.
        Some(((of as f64) * fraction).min(of as f64) as usize)
    }

    /// The garbage-collection threshold, a fraction in `(0, 1]`, if any.
    #[inline]
    pub(crate) fn gc_threshold(&self) -> Option<f64> {
        self.gc_threshold
    }

    /// Sets the garbage-collection threshold (checked by the caller: a
    /// fraction in `(0, 1]`); it acts from the next miss on.
    pub(crate) fn set_gc_threshold(&mut self, fraction: Option<f64>) {
        debug_assert!(fraction.is_none_or(|f| f > 0.0 && f <= 1.0));
        self.gc_threshold = fraction;
    }

    /// Notes the backing allocator's
    /// [`capacity`](crate::RawAllocator::capacity), as a miss just read
    /// it, for [`make_room`](Self::make_room).
    #[inline]
    pub(crate) fn set_capacity(&mut self, capacity: Option<usize>) {
        self.capacity = capacity;
    }

    /// What the pool could hand out now from a backing allocator that has
    /// `available` bytes free: those plus every cached byte, and no more
    /// than the limit leaves; `None` when neither is known.
    pub(crate) fn reach(&self, available: Option<usize>) -> Option<usize> {
        let freeable = available.map(|a| a.saturating_add(self.store.bytes()));
        let room = self
            .limit
            .map(|l| l.saturating_sub(self.bytes_in_use() + self.pending));
        match (freeable, room) {
            (Some(f), Some(r)) => Some(f.min(r)),
            (f, r) => f.or(r),
        }
    }

    /// The backing allocator served a pending miss of `size` bytes.
    #[inline]
    pub(crate) fn miss_done(&mut self, size: usize, class: usize) {
        self.pending -= class;
        self.count_request(size, class);
        if let Some(x) = self.extras.as_deref_mut() {
            x.miss(class);
        }
        let s = &mut self.stats;
        s.misses += 1;
        s.backing_allocs += 1;
        s.bytes_from_backing = s.bytes_from_backing.saturating_add(class);
        self.settle_peak();
        let s = &mut self.stats;
        s.bytes_reserved += class;
        s.peak_bytes_reserved = s.peak_bytes_reserved.max(s.bytes_reserved);
        s.low_cached = self.store.bytes();
    }

    /// The out-of-memory ladder, after the `attempt`-th failed backing call
    /// for a pending miss of `class` bytes: the first failure frees cached
    /// blocks oldest first until `class` bytes are freed, the second frees
    /// every cached block, the third gives up; so does any failure with an
    /// empty cache, and one that freeing the cache cannot help: `class`
    /// above the `available` bytes the backing allocator reported just
    /// after the failure plus every cached byte. Giving up drops the
    /// pending booking.
    pub(crate) fn after_failure(
        &mut self,
        attempt: u32,
        class: usize,
        available: Option<usize>,
        now: u64,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) -> Retry {
        self.stats.backing_failures += 1;
        if let Some(x) = self.extras.as_deref_mut() {
            x.tell(Event::BackingFailed {
                size: class,
                attempt,
            });
        }
        let hopeless = available.is_some_and(|a| class > a.saturating_add(self.store.bytes()));
        if attempt >= 3 || self.store.is_empty() || hopeless {
            self.pending -= class;
            return Retry::GiveUp;
        }
        if attempt == 1 {
            let mut freed = 0usize;
            while freed < class {
                let before = self.store.bytes();
                if !self.trim_oldest(now, Reason::OutOfMemory, free) {
                    break;
                }
                freed += before - self.store.bytes();
            }
        } else {
            self.trim_all(now, Reason::OutOfMemory, free);
        }
        Retry::Again
    }

    /// Drops a pending booking whose miss was abandoned (a panic in the
    /// backing allocator).
    pub(crate) fn abandon(&mut self, class: usize) {
        self.pending -= class;
    }

    /// A whole release: reads the clock, runs the policy, then caches
    /// `block` ([`Cache::release`]).
    ///
    /// The block is never lost to a panic: if the clock panics, the block
    /// is counted as trimmed and handed to `free` (the pool knows no time
    /// to cache it at); if the policy or `free` panics during the policy
    /// run, the block is cached at the time read. Then the panic goes on.
    /// A second panic while doing so is discarded (the first is already
    /// unwinding). A guard does this on unwinding only: nothing is paid
    /// when nothing panics.
    ///
    /// # Panics
    ///
    /// As [`Cache::release`], and when the clock, the policy or `free`
    /// panics.
    #[inline(always)]
    pub(crate) fn release_now<F: FnMut(B, usize)>(&mut self, block: B, size: usize, free: F) {
        let mut guard = Releasing {
            cache: self,
            free,
            block: ManuallyDrop::new(block),
            size,
            now: None,
        };
        let now = guard.cache.now();
        guard.now = Some(now);
        if guard.cache.store.may_evict(now) {
            guard.collect_then_finish(now);
        } else {
            // Nothing here unwinds (but a clock that may), so the guard
            // costs nothing: its block and size need not be kept where a
            // landing pad would find them across a collection.
            guard.finish(now);
        }
    }

    /// Counts a block of `size` requested bytes out of use and caches it;
    /// frees whatever the store displaces to make room.
    ///
    /// # Panics
    ///
    /// When `size` could not have been allocated, or more is released than
    /// is in use.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn release(
        &mut self,
        block: B,
        size: usize,
        now: u64,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) {
        let class = if self.plain {
            self.exact_class(size)
        } else {
            self.release_class(size)
        };
        if let Some((block, class)) = self.store.put(block, class, now) {
            self.let_go(block, class, Reason::Displaced, free);
        }
    }

    /// The class of a release of `size` bytes where every size is its own
    /// class: `size`, checked.
    ///
    /// # Panics
    ///
    /// When `size` could not have been allocated, or more is released
    /// than is in use.
    #[inline(always)]
    #[track_caller]
    fn exact_class(&self, size: usize) -> usize {
        // `size - 1 < bytes in use`, wrapping: one comparison tells a size
        // of zero (which wraps to the largest) and one larger than the
        // bytes in use. Every block in use has at least one byte: enough
        // bytes in use means a block in use.
        if size.wrapping_sub(1) >= self.bytes_in_use() {
            release_mismatch(size)
        }
        size
    }

    /// The class of a release of `size` bytes for a pool that is not
    /// [`plain`](Cache::plain) (its classes round, or it keeps an observer
    /// or statistics by class, which hear of it here), checked.
    ///
    /// # Panics
    ///
    /// As [`exact_class`](Cache::exact_class).
    #[inline(always)]
    #[track_caller]
    fn release_class(&mut self, size: usize) -> usize {
        let class = if self.exact {
            self.exact_class(size)
        } else {
            // The class of the last request rounded, when this is its
            // size (the release after a hit): no rounding.
            let class = if size == self.last_rounded.0 {
                Some(self.last_rounded.1)
            } else {
                self.round(size)
            };
            match class {
                Some(class) if self.bytes_in_use() >= class => class,
                _ => release_mismatch(size),
            }
        };
        if let Some(x) = self.extras.as_deref_mut() {
            x.released(class);
        }
        class
    }

    /// Where a release that unwinds before caching leaves its block: cached
    /// at `now` when the release read the time, else counted as trimmed
    /// and handed to `free`. A panic on the way is discarded: the caller is
    /// already unwinding.
    #[cold]
    #[inline(never)]
    fn rescue<F: FnMut(B, usize) + ?Sized>(
        &mut self,
        block: B,
        size: usize,
        now: Option<u64>,
        free: &mut F,
    ) {
        let _ = catch_unwind(AssertUnwindSafe(|| match now {
            Some(now) => self.release(block, size, now, free),
            None => {
                let class = match self.round(size) {
                    Some(class) if self.bytes_in_use() >= class => class,
                    // Not a block of this pool: nothing to count or free.
                    _ => return,
                };
                if let Some(x) = self.extras.as_deref_mut() {
                    x.released(class);
                }
                self.let_go(block, class, Reason::Trimmed, free);
            }
        }));
    }

    /// Frees every cached block, for dropping the pool: like
    /// [`Cache::trim_all`], but a panic from the clock or the policy stops
    /// neither: the blocks left are then freed without telling the policy.
    /// Such a panic is kept in `first`; `free` must not unwind (the caller
    /// catches the backing allocator's panics there, into `first` too).
    pub(crate) fn free_all(
        &mut self,
        first: &FirstPanic,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) {
        match catch_unwind(AssertUnwindSafe(|| self.now())) {
            Ok(now) => {
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| {
                    self.trim_all(now, Reason::Dropped, free)
                })) {
                    first.keep(panic);
                }
            }
            Err(panic) => first.keep(panic),
        }
        // Not told to the observer either: it may be what panicked.
        while let Some((block, class)) = self.store.pop_untold() {
            if let Some(x) = self.extras.as_deref_mut() {
                x.freeing(class, Reason::Dropped);
            }
            self.stats.trimmed += 1;
            self.stats.backing_deallocs += 1;
            self.unreserve(class);
            free(block, class);
        }
    }

    /// Frees the oldest cached block (counted as trimmed, for `reason`);
    /// `false` when the cache is empty.
    pub(crate) fn trim_oldest(
        &mut self,
        now: u64,
        reason: Reason,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) -> bool {
        match self.store.pop_oldest(now) {
            Some((block, class)) => {
                self.let_go(block, class, reason, free);
                true
            }
            None => false,
        }
    }

    /// Frees every cached block (counted as trimmed, for `reason`);
    /// returns the bytes freed.
    pub(crate) fn trim_all(
        &mut self,
        now: u64,
        reason: Reason,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) -> usize {
        let before = self.store.bytes();
        while self.trim_oldest(now, reason, free) {}
        before
    }

    /// Sets the byte limit; lowering it frees cached blocks oldest first
    /// until the bytes reserved fit (or the cache is empty). Returns the
    /// bytes freed.
    pub(crate) fn set_limit(
        &mut self,
        limit: Option<usize>,
        now: u64,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) -> usize {
        self.limit = limit;
        self.over_limit = false;
        let Some(limit) = limit else { return 0 };
        let before = self.store.bytes();
        while self.stats.bytes_reserved + self.pending > limit {
            if !self.trim_oldest(now, Reason::Limit, free) {
                self.over_limit = true;
                break;
            }
        }
        before - self.store.bytes()
    }

    /// Sets every peak to its current value.
    pub(crate) fn reset_peaks(&mut self) {
        self.stats.peak_bytes_reserved = self.stats.bytes_reserved;
        self.stats.peak_bytes_in_use = self.bytes_in_use();
        self.stats.low_cached = self.store.bytes();
    }

    /// The statistics by class, in first-seen order, when kept.
    pub(crate) fn class_stats(&self) -> Option<Vec<ClassStats>> {
        self.extras
            .as_deref()?
            .class_stats(|class| self.store.cached_of(class))
    }

    /// The misses so far (a packed pool tells its requests' hits from
    /// misses by them), without building a whole [`Stats`].
    #[inline]
    pub(crate) fn miss_count(&self) -> u64 {
        self.stats.misses
    }

    pub(crate) fn stats(&self) -> Stats {
        let c = &self.stats;
        let bytes_cached = self.store.bytes();
        Stats {
            hits: self.store.taken().0,
            misses: c.misses,
            evictions: c.evictions,
            trimmed: c.trimmed,
            backing_allocs: c.backing_allocs,
            backing_deallocs: c.backing_deallocs,
            backing_failures: c.backing_failures,
            blocks_in_use: self.blocks_in_use(),
            blocks_cached: self.store.len() as u64,
            bytes_in_use: self.bytes_in_use(),
            bytes_cached,
            bytes_reserved: c.bytes_reserved,
            peak_bytes_reserved: c.peak_bytes_reserved,
            peak_bytes_in_use: self.peak_bytes_in_use(),
            bytes_from_pool: usize::try_from(self.store.taken().1).unwrap_or(usize::MAX),
            bytes_from_backing: c.bytes_from_backing,
            bytes_requested: {
                let from_pool = usize::try_from(self.store.taken().1).unwrap_or(usize::MAX);
                from_pool
                    .saturating_add(c.bytes_from_backing)
                    .saturating_sub(c.waste)
            },
            // The backing allocator's page figures: the cache has no
            // allocator (`DecayingPool::stats` fills them in).
            pages_created: 0,
            pages_released: 0,
            page_maps: 0,
            page_unmaps: 0,
            bytes_spare: 0,
        }
    }

    /// The store, read-only (a [`SharedPool`](crate::SharedPool) reads its
    /// policy's settings to set up its thread caches).
    pub(crate) fn store(&self) -> &P::Store<B> {
        &self.store
    }

    /// Whether an observer or the statistics by class are on.
    pub(crate) fn has_extras(&self) -> bool {
        self.extras.is_some()
    }

    /// Frees a block the cache counts in use but that is idle elsewhere (in
    /// a [`SharedPool`](crate::SharedPool)'s thread cache): counted as
    /// freed for `reason` and handed to `free`.
    pub(crate) fn free_lent(
        &mut self,
        block: B,
        class: usize,
        reason: Reason,
        free: &mut (impl FnMut(B, usize) + ?Sized),
    ) {
        self.let_go(block, class, reason, free);
    }

    pub(crate) fn size_class(&self) -> SizeClass {
        self.size_class
    }

    pub(crate) fn reuse(&self) -> Reuse {
        self.reuse
    }

    /// The bytes counted against the limit: handed out, booked by misses
    /// under way, and cached.
    pub(crate) fn held_bytes(&self) -> usize {
        self.bytes_in_use() + self.pending + self.store.bytes()
    }

    pub(crate) fn limit(&self) -> Option<usize> {
        self.limit
    }

    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn footprint(&self) -> usize {
        self.store.footprint()
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn validate(&self) {
        self.store.check();
        let s = self.stats();
        assert_eq!(s.misses, s.backing_allocs, "misses == backing_allocs");
        assert_eq!(
            s.backing_allocs - s.backing_deallocs,
            s.blocks_in_use + s.blocks_cached,
            "every backing block is in use or cached"
        );
        assert!(s.peak_bytes_reserved >= s.bytes_reserved, "peak reserved");
        assert!(s.peak_bytes_in_use >= s.bytes_in_use, "peak in use");
        if let Some(limit) = self.limit {
            assert!(
                self.over_limit || s.bytes_reserved + self.pending <= limit,
                "reserved over the limit"
            );
        }
        if let Some(classes) = self.class_stats() {
            let sum = |f: fn(&ClassStats) -> u64| classes.iter().map(f).sum::<u64>();
            assert_eq!(
                sum(|c| c.blocks_in_use),
                s.blocks_in_use,
                "class blocks in use"
            );
            assert_eq!(
                sum(|c| c.blocks_cached),
                s.blocks_cached,
                "class blocks cached"
            );
            assert_eq!(sum(|c| c.hits), s.hits, "class hits");
            assert_eq!(sum(|c| c.misses), s.misses, "class misses");
            assert_eq!(sum(|c| c.evictions), s.evictions, "class evictions");
            assert_eq!(sum(|c| c.trimmed), s.trimmed, "class trimmed");
        }
        assert_eq!(
            s.blocks_in_use == 0,
            s.bytes_in_use == 0,
            "blocks and bytes in use"
        );
    }
}

/// The first of the panics caught while going on regardless (dropping a
/// pool), to pass on once done.
#[derive(Default)]
pub(crate) struct FirstPanic(Cell<Option<Box<dyn Any + Send>>>);

impl FirstPanic {
    /// Keeps `panic` if it is the first; a later one is discarded.
    pub(crate) fn keep(&self, panic: Box<dyn Any + Send>) {
        let first = self.0.take().unwrap_or(panic);
        self.0.set(Some(first));
    }

    /// The first panic kept, if any.
    pub(crate) fn into_inner(self) -> Option<Box<dyn Any + Send>> {
        self.0.into_inner()
    }
}

/// A block being released, held until it is cached; see
/// [`Cache::release_now`]. Dropped only when the release unwinds.
struct Releasing<'a, B, P: Policy, C: Clock, F: FnMut(B, usize)> {
    cache: &'a mut Cache<B, P, C>,
    free: F,
    block: ManuallyDrop<B>,
    size: usize,
    /// The time the release read, once it has.
    now: Option<u64>,
}

impl<B, P: Policy, C: Clock, F: FnMut(B, usize)> Releasing<'_, B, P, C, F> {
    /// Frees what the policy says must go at `now`, then caches the block:
    /// out of line, so that the guard's landing pad (a policy or a backing
    /// allocator may unwind here) costs the release nothing when nothing
    /// may be due.
    #[inline(never)]
    fn collect_then_finish(mut self, now: u64) {
        self.cache.run_policy_inline(now, &mut self.free);
        self.finish(now);
    }

    /// Caches the block at `now`; the guard is spent.
    #[inline(always)]
    fn finish(self, now: u64) {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped nor used again, so the block, the
        // reference and the callback are each moved out exactly once.
        let (cache, mut free, block) = unsafe {
            (
                ptr::read(&this.cache),
                ptr::read(&this.free),
                ManuallyDrop::take(&mut this.block),
            )
        };
        cache.release(block, this.size, now, &mut free);
    }
}

impl<B, P: Policy, C: Clock, F: FnMut(B, usize)> Drop for Releasing<'_, B, P, C, F> {
    // Inlined into the landing pads, so the guard's fields stay in
    // registers on the path that does not unwind; `rescue` is the cold call.
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `drop` runs once (`finish` forgets the guard instead), and
        // `self.block` is not used afterwards.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        self.cache
            .rescue(block, self.size, self.now, &mut self.free);
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn release_mismatch(size: usize) -> ! {
    panic!("DecayingPool::release: a block of {size} bytes was never handed out by this pool")
}
