//! Watching a pool: an observer told of every block the pool frees and of
//! every failed backing allocation, and statistics by size class.

use core::fmt;

use crate::stats::ClassStats;

/// Why the pool gave a block back to the backing allocator, as an
/// [`Event::Freed`] tells an observer. `Serialize`/`Deserialize` with the
/// **`serde`** feature.
///
/// # Examples
///
/// ```
/// use decaying_pool::Reason;
/// assert!(Reason::Expired.is_eviction());
/// assert!(!Reason::Limit.is_eviction());
/// assert_eq!(Reason::OutOfMemory.to_string(), "out of memory");
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Reason {
    /// The timed policy said the idle block must go (it decayed).
    Expired,
    /// A release into a full [`FixedCapacity`](crate::FixedCapacity)
    /// window displaced it.
    Displaced,
    /// [`trim`](crate::DecayingPool::trim) freed it (or a release whose
    /// clock panicked gave it back at once).
    Trimmed,
    /// The byte limit: a miss needed room, or
    /// [`set_limit`](crate::DecayingPool::set_limit) lowered it.
    Limit,
    /// The out-of-memory retry freed it after a failed backing allocation.
    OutOfMemory,
    /// The pool was dropped.
    Dropped,
    /// The garbage-collection threshold
    /// ([`Builder::gc_threshold`](crate::Builder::gc_threshold), PyTorch's
    /// `garbage_collection_threshold`): a miss would have brought the
    /// bytes reserved past it, and idle blocks went back oldest first.
    /// An eviction ([`is_eviction`](Self::is_eviction)): the pool chose
    /// to free the block before any hard bound forced it.
    GcThreshold,
    /// A miss took its memory: the backing allocator moves memory between
    /// blocks ([`RawAllocator::spare`](crate::RawAllocator::spare), pages
    /// mapped into virtual ranges) and held too little spare, so idle
    /// blocks went back oldest first and their pages serve the request.
    /// An eviction.
    Remapped,
}

impl Reason {
    /// Whether the pool chose the block of its own accord, by its policy
    /// or its garbage-collection threshold (counted in
    /// [`Stats::evictions`](crate::Stats::evictions)); the other reasons
    /// (a caller's trim, the hard limit, a failure, the drop) are counted
    /// in [`Stats::trimmed`](crate::Stats::trimmed).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(decaying_pool::Reason::Displaced.is_eviction());
    /// assert!(decaying_pool::Reason::GcThreshold.is_eviction());
    /// ```
    pub fn is_eviction(self) -> bool {
        matches!(
            self,
            Reason::Expired | Reason::Displaced | Reason::GcThreshold | Reason::Remapped
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Expired => "expired",
            Reason::Displaced => "displaced",
            Reason::Trimmed => "trimmed",
            Reason::Limit => "limit",
            Reason::OutOfMemory => "out of memory",
            Reason::Dropped => "dropped",
            Reason::GcThreshold => "gc threshold",
            Reason::Remapped => "remapped",
        })
    }
}

/// What a pool tells its observer ([`Builder::observer`](crate::Builder::observer)).
/// `Serialize`/`Deserialize` with the **`serde`** feature.
///
/// # Examples
///
/// ```
/// use decaying_pool::{Event, Reason};
/// let e = Event::Freed { size: 4096, reason: Reason::Expired };
/// assert_eq!(e.size(), 4096);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Event {
    /// A cached block of `size` class bytes went back to the backing
    /// allocator (see [`Builder::observer`](crate::Builder::observer) for
    /// when exactly).
    Freed {
        /// The block's class size.
        size: usize,
        /// Why.
        reason: Reason,
    },
    /// A backing `allocate` of `size` class bytes failed; `attempt` counts
    /// the failures of this miss (1, 2, 3: see the out-of-memory retry of
    /// [`DecayingPool::allocate`](crate::DecayingPool::allocate)).
    BackingFailed {
        /// The class size asked for.
        size: usize,
        /// Which failure of this miss: 1 for the first.
        attempt: u32,
    },
}

impl Event {
    /// The block size the event is about.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::Event::BackingFailed { size: 8, attempt: 1 }.size(), 8);
    /// ```
    pub fn size(&self) -> usize {
        match *self {
            Event::Freed { size, .. } | Event::BackingFailed { size, .. } => size,
        }
    }
}

/// A caller's request, as a pool tells the hook given to its
/// `log_requests` ([`DecayingPool::log_requests`](crate::DecayingPool::log_requests),
/// [`PackedPool::log_requests`](crate::PackedPool::log_requests); a
/// [`SharedPool`](crate::SharedPool) takes over the hook of the pool it is
/// made from): every successful `allocate` and every release of a block
/// handed out, at the level the caller sees (a packed pool's carved
/// blocks, not its segments; a thread cache's hits too). What
/// `trace::RequestLog` (feature **`trace`**)
/// writes to a trace file, for `decaying-pool replay`.
///
/// # Examples
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use decaying_pool::{DecayingPool, FixedTime, Request, SystemAllocator};
///
/// let log = Arc::new(Mutex::new(Vec::new()));
/// let mut pool = DecayingPool::new(SystemAllocator::new(), FixedTime::default());
/// let sink = Arc::clone(&log);
/// pool.log_requests(move |r: Request<'_, _>| sink.lock().unwrap().push((r.is_allocation(), r.size())));
/// let b = pool.allocate(64)?;
/// // SAFETY: `b` came from this pool with this size and is not used again.
/// unsafe { pool.release(b, 64) };
/// assert_eq!(*log.lock().unwrap(), [(true, 64), (false, 64)]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Debug)]
pub enum Request<'a, B> {
    /// `allocate(size)` handed out `block`.
    Allocated {
        /// The block handed out.
        block: &'a B,
        /// The size asked for.
        size: usize,
    },
    /// `block`, allocated with `size`, is being released.
    Released {
        /// The block given back.
        block: &'a B,
        /// The size it was allocated with.
        size: usize,
    },
}

impl<B> Request<'_, B> {
    /// The block the request is about.
    ///
    /// # Examples
    ///
    /// ```
    /// let r = decaying_pool::Request::Allocated { block: &7u64, size: 8 };
    /// assert_eq!(*r.block(), 7);
    /// ```
    pub fn block(&self) -> &B {
        match *self {
            Request::Allocated { block, .. } | Request::Released { block, .. } => block,
        }
    }

    /// The size asked for (for a release: the size it was allocated with).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::Request::Released { block: &7u64, size: 8 }.size(), 8);
    /// ```
    pub fn size(&self) -> usize {
        match *self {
            Request::Allocated { size, .. } | Request::Released { size, .. } => size,
        }
    }

    /// Whether it is an allocation (else a release).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(decaying_pool::Request::Allocated { block: &7u64, size: 8 }.is_allocation());
    /// ```
    pub fn is_allocation(&self) -> bool {
        matches!(self, Request::Allocated { .. })
    }
}

/// The boxed request hook of a pool (see [`Request`]).
/// The callback of a [`RequestHook`].
type HookFn<B> = dyn FnMut(Request<'_, B>) + Send;

pub(crate) struct RequestHook<B>(Box<HookFn<B>>);

// SAFETY: the callback is only ever reached through `&mut RequestHook`
// (`call`; it is `FnMut`), so sharing `&RequestHook` between threads gives
// access to nothing.
unsafe impl<B> Sync for RequestHook<B> {}

impl<B> RequestHook<B> {
    pub(crate) fn new(f: impl FnMut(Request<'_, B>) + Send + 'static) -> Self {
        RequestHook(Box::new(f))
    }

    /// Tells the hook of `request`.
    #[inline]
    pub(crate) fn call(&mut self, request: Request<'_, B>) {
        (self.0)(request)
    }

    /// Tells the hook of `request`, catching its panic: the caller puts
    /// the block where it belongs first, then resumes the panic.
    pub(crate) fn call_caught(
        &mut self,
        request: Request<'_, B>,
    ) -> Option<Box<dyn core::any::Any + Send>> {
        std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| self.call(request))).err()
    }
}

/// The boxed observer callback.
pub(crate) struct Observer(Box<dyn FnMut(Event) + Send>);

// SAFETY: the callback is only ever reached through `&mut Observer` (it is
// `FnMut`, and `Observer` offers nothing through `&Observer`), so sharing
// `&Observer` between threads gives access to nothing.
unsafe impl Sync for Observer {}

impl Observer {
    pub(crate) fn new(f: impl FnMut(Event) + Send + 'static) -> Self {
        Observer(Box::new(f))
    }
}

/// Per-class counters, in blocks. Hits are not counted (the hit path
/// stays as it is): every block released into the cache left it by a hit
/// or a free, or is still there, so `hits = released - evictions -
/// trimmed - cached`, with `cached` asked of the store; then `in_use =
/// misses + hits - released`.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    misses: u64,
    released: u64,
    evictions: u64,
    trimmed: u64,
}

type Classes = indexmap::IndexMap<usize, Counts, hashbrown::DefaultHashBuilder>;

/// What a pool keeps beyond its counters when asked to: boxed, so a pool
/// without them tests one pointer.
#[derive(Default)]
pub(crate) struct Extras {
    observer: Option<Observer>,
    classes: Option<Classes>,
}

impl Extras {
    pub(crate) fn new(observer: Option<Observer>, by_class: bool) -> Option<Box<Self>> {
        if observer.is_none() && !by_class {
            return None;
        }
        Some(Box::new(Extras {
            observer,
            classes: by_class.then(Classes::default),
        }))
    }

    #[inline]
    fn class(&mut self, class: usize) -> Option<&mut Counts> {
        self.classes.as_mut().and_then(|c| c.get_mut(&class))
    }

    /// A miss on `class`, served. The only place a class is added (every
    /// block the pool knows of was a miss first), so it is the only place
    /// the table may allocate.
    #[cold]
    pub(crate) fn miss(&mut self, class: usize) {
        if let Some(classes) = &mut self.classes {
            classes.entry(class).or_default().misses += 1;
        }
    }

    /// A block of `class` released into the cache.
    #[inline]
    pub(crate) fn released(&mut self, class: usize) {
        if let Some(c) = self.class(class) {
            c.released += 1;
        }
    }

    /// A cached block of `class` is about to be freed for `reason`.
    #[cold]
    pub(crate) fn freeing(&mut self, class: usize, reason: Reason) {
        if let Some(c) = self.class(class) {
            if reason.is_eviction() {
                c.evictions += 1;
            } else {
                c.trimmed += 1;
            }
        }
    }

    /// Tells the observer, if any.
    #[cold]
    pub(crate) fn tell(&mut self, event: Event) {
        if let Some(Observer(f)) = &mut self.observer {
            f(event);
        }
    }

    /// The table by class, in first-seen order, given the number of
    /// blocks cached of each class; `None` when not kept.
    pub(crate) fn class_stats(
        &self,
        cached_of: impl Fn(usize) -> usize,
    ) -> Option<Vec<ClassStats>> {
        let classes = self.classes.as_ref()?;
        Some(
            classes
                .iter()
                .map(|(&size, c)| {
                    let cached = cached_of(size) as u64;
                    let hits = c.released - c.evictions - c.trimmed - cached;
                    let in_use = c.misses + hits - c.released;
                    ClassStats {
                        size,
                        blocks_in_use: in_use,
                        bytes_in_use: size.saturating_mul(in_use as usize),
                        blocks_cached: cached,
                        bytes_cached: size.saturating_mul(cached as usize),
                        hits,
                        misses: c.misses,
                        evictions: c.evictions,
                        trimmed: c.trimmed,
                    }
                })
                .collect(),
        )
    }
}
