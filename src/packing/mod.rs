//! Packing: small and medium requests carved from segments of the exact
//! pool, large requests exact.
//!
//! ```text
//! caller ─▶ PackedPool ─ size ≤ medium threshold ─▶ carve from a segment (O(1) sub-allocator)
//!              │                                      │ segment needed / emptied
//!              │ size > medium threshold              ▼
//!              └─────────────────────────────────▶ DecayingPool (exact, never split) ─▶ RawAllocator
//! ```

mod carve;
mod config;
mod index;
mod segment;
mod stats;

use core::fmt;
use std::collections::BTreeMap;

use hashbrown::HashMap;
use offset_allocator::{Allocation, Allocator};

pub use carve::Packable;
#[cfg(any(feature = "testing", feature = "trace"))]
pub(crate) use carve::{address_u64, carve_u64};
pub use config::{Packing, ParsePackingError};
use index::{FitIndex, bin_round_down, bin_round_up};
use segment::{Segment, sub_allocator};
pub use stats::PackingStats;

use crate::clock::{Clock, MonotonicClock};
use crate::error::PoolError;
use crate::observe::{Request, RequestHook};
use crate::policy::{FixedTime, Policy};
use crate::pool::{Builder, DecayingPool};
use crate::raw::RawAllocator;
use crate::stats::Stats;

const SMALL: usize = 0;
const MEDIUM: usize = 1;
/// Empty sub-allocators kept for the next segment of the same size.
const SPARES: usize = 4;
/// Sizes of recently emptied segments remembered (likely still cached in
/// the pool). A training step that ends with its segments empty makes the
/// next step take them back: on the shared training trace, three passes
/// peak at 1.17x peak live with 64 remembered, 1.48x with 16.
const RECENT: usize = 64;
/// Distinct large class sizes remembered as given back to the pool (see
/// `PackedPool::larger`); past it, the smallest is forgotten.
const LARGER: usize = 64;

/// A [`DecayingPool`] with packing: requests up to a threshold are carved
/// from *segments* (blocks of the pool), larger ones are the pool's exact
/// blocks, never split (rounded up to [`Packing::large_rounding`], 2 MiB by
/// default). From [`Builder::packing`].
///
/// - requests up to [`Packing::small_threshold`] are carved from small
///   segments, those up to [`Packing::medium_threshold`] from medium
///   segments: the segment whose largest free range fits most tightly,
///   then within it by an O(1) two-level bins sub-allocator
///   ([`offset-allocator`](https://crates.io/crates/offset-allocator));
///   freed ranges coalesce at once and are reusable by any size;
/// - a segment that empties goes back to the pool, where it decays like
///   any cached block (and is trimmed, or freed by the out-of-memory
///   retry); a later segment of the same size is a cache hit;
/// - a large request whose class has nothing cached takes the smallest
///   cached large block up to [`Packing::large_fit`] larger, whole (not
///   split: it goes back to the pool whole);
/// - segments grow with the footprint and are capped by
///   [`Packing::segment_cap`]; when the pool cannot supply a segment (the
///   backing allocator fails after the pool's retry ladder, or the limit
///   refuses it) the request falls back to an exact block.
///
/// On drop, segments with no block handed out go back to the pool, which
/// frees its cache; as with [`DecayingPool`], blocks still handed out (and
/// so their segments) are not freed: release every block first.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::{DecayingPool, FixedTime, ManualClock, Packing, SystemAllocator};
///
/// let clock = ManualClock::new();
/// let mut pool = DecayingPool::builder(SystemAllocator::new())
///     .policy(FixedTime::new(Duration::from_secs(1)))
///     .clock(clock.clone())
///     .packing(Packing::default())
///     .build();
/// let sizes = [100, 7_000, 300_000, 3 << 20, 200 << 20];
/// let blocks: Vec<_> = sizes.iter().map(|&s| pool.allocate(s)).collect::<Result<_, _>>()?;
/// // one small segment, one medium segment, one exact block
/// assert_eq!(pool.stats().backing_allocs, 3);
/// for (b, s) in blocks.into_iter().zip(sizes) {
///     // SAFETY: each block came from this pool with this size and is not used again.
///     unsafe { pool.release(b, s) };
/// }
/// clock.advance(Duration::from_secs(1));
/// pool.collect();
/// assert_eq!(pool.stats().bytes_reserved, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A packed pool is `Send` under the bounds of [`DecayingPool`]: its
/// allocator, policy and clock are `Send` and its blocks are
/// [`SendBlock`](crate::SendBlock). So a packed host pool moves to another
/// thread, or goes behind a `Mutex` or a [`SharedPool`](crate::SharedPool):
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use decaying_pool::{DecayingPool, MmapAllocator, Packing};
///
/// let pool = DecayingPool::builder(MmapAllocator::new()).packing(Packing::default()).build();
/// let pool = Arc::new(Mutex::new(pool));
/// let other = Arc::clone(&pool);
/// std::thread::spawn(move || {
///     let mut p = other.lock().unwrap();
///     let block = p.allocate(4096).unwrap();
///     // SAFETY: `block` came from this pool with this size and is not used again.
///     unsafe { p.release(block, 4096) };
/// })
/// .join()
/// .unwrap();
/// let s = pool.lock().unwrap().stats();
/// assert_eq!(s.hits + s.misses, 1);
/// ```
///
/// A policy (or clock, or allocator) that cannot cross threads is refused
/// at compile time, and the error names only your type and public ones
/// ("`Rc<()>` cannot be sent between threads safely … required for
/// `PackedPool<SystemAllocator, NotSend>` to implement `Send`"):
///
/// ```compile_fail,E0277
/// use core::time::Duration;
/// use std::rc::Rc;
/// use decaying_pool::policy::{EvictionPolicy, Oldest};
/// use decaying_pool::{DecayingPool, Packing, SystemAllocator};
///
/// struct NotSend(Rc<()>);
/// impl EvictionPolicy for NotSend {
///     fn must_evict(&mut self, _: Duration, _: Oldest, _: usize) -> bool { false }
/// }
/// fn needs_send<T: Send>(_: T) {}
/// let pool = DecayingPool::builder(SystemAllocator::new())
///     .policy(NotSend(Rc::new(())))
///     .packing(Packing::default())
///     .build();
/// needs_send(pool);
/// ```
pub struct PackedPool<A: Packable, P: Policy = FixedTime, C: Clock = MonotonicClock> {
    pool: DecayingPool<A, P, C>,
    packing: Packing,
    /// log2 of the granularity.
    shift: u32,
    /// The largest segment, bytes.
    cap: usize,
    slots: Vec<Option<Segment<A::Block>>>,
    free_slots: Vec<u32>,
    /// Per kind: the segments by their largest free range.
    index: [FitIndex; 2],
    /// Per kind: bytes in segments.
    kind_bytes: [usize; 2],
    /// Emptied sub-allocators, with their segments' kind, for the next
    /// segment of the same kind and size.
    spares: Vec<(usize, Allocator)>,
    /// Sizes of segments given back to the pool since it last freed a
    /// cached block: a new segment of one of them is a cache hit.
    recent: Vec<usize>,
    /// The pool's `evictions + trimmed` when `recent` was last checked.
    freed_mark: u64,
    /// Carved blocks handed out, by address.
    live: HashMap<usize, Live>,
    /// Class sizes of large blocks given back to the pool, with how many:
    /// likely still cached there (a class whose block the pool no longer
    /// holds is dropped when a request finds it gone). Ordered, so that a
    /// large request finds the smallest class at least its own.
    larger: BTreeMap<usize, u32>,
    /// Large blocks handed out from a larger class than their request's,
    /// by address: the class taken and the request's class.
    swapped: HashMap<usize, (usize, usize)>,
    st: PackingStats,
    /// The caller's requests, as [`PackedPool::stats`] reports them.
    req: Requests,
    /// The hook told of every request ([`PackedPool::log_requests`]).
    requests: Option<RequestHook<A::Block>>,
}

/// The caller-level counters of a packed pool (the exact pool underneath
/// counts segments and exact blocks).
#[derive(Clone, Copy, Default)]
struct Requests {
    /// Requests served with no backing allocation.
    hits: u64,
    /// Requests that made one (a new segment or an exact block).
    misses: u64,
    bytes_from_pool: usize,
    bytes_from_backing: usize,
    /// What callers asked for, over every successful request.
    bytes_requested: usize,
    /// Exact blocks handed out and not yet released, and their bytes (the
    /// pool's class sizes).
    exact_blocks: u64,
    exact_bytes: usize,
    /// The highest bytes in use (carved and exact) seen.
    peak_in_use: usize,
}

// SAFETY: a packed pool owns its exact pool (`Send` under these same
// bounds), its segments (each holding one block of that pool: a
// `SendBlock`, movable to another thread and given back from there) and
// plain bookkeeping (sub-allocators, maps of addresses and counters, none
// shared with another owner, nothing thread-local). Moving the whole
// packed pool moves everything it reaches. It is not `Sync`: every method
// that touches a segment takes `&mut self`.
unsafe impl<A, P, C> Send for PackedPool<A, P, C>
where
    A: Packable + Send,
    A::Block: crate::raw::SendBlock,
    P: Policy + Send,
    C: Clock + Send,
{
}

#[derive(Clone, Copy)]
struct Live {
    slot: u32,
    units: u32,
    size: usize,
    alloc: Allocation,
}

/// Configures a [`PackedPool`]; from [`Builder::packing`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct PackedBuilder<A, P = FixedTime, C = MonotonicClock> {
    inner: Builder<A, P, C>,
    packing: Packing,
}

impl<A, P, C> Builder<A, P, C> {
    /// Packs small and medium requests into segments as `packing` says:
    /// `build` then makes a [`PackedPool`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let pool = DecayingPool::builder(CheckingAllocator::with_addresses())
    ///     .limit(1 << 30)
    ///     .packing(Packing::default())
    ///     .build();
    /// assert_eq!(pool.segment_cap(), 32 << 20); // 1/32 of the limit
    /// # Ok(())
    /// # }
    /// ```
    pub fn packing(self, packing: Packing) -> PackedBuilder<A, P, C> {
        PackedBuilder {
            inner: self,
            packing,
        }
    }
}

impl<A: Packable, P: Policy, C: Clock> PackedBuilder<A, P, C> {
    /// Builds the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let pool = DecayingPool::builder(CheckingAllocator::with_addresses()).packing(Packing::default()).build();
    /// assert_eq!(pool.packing_stats().segments, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn build(self) -> PackedPool<A, P, C> {
        PackedPool::from_pool(self.inner.build(), self.packing)
    }
}

impl<A: Packable, P: Policy, C: Clock> PackedPool<A, P, C> {
    /// Packing over an existing pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, PackedPool, Packing};
    /// let pool = DecayingPool::new(CheckingAllocator::with_addresses(), FixedTime::default());
    /// let packed = PackedPool::from_pool(pool, Packing::default());
    /// assert_eq!(packed.packing(), Packing::default());
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_pool(mut pool: DecayingPool<A, P, C>, packing: Packing) -> Self {
        // The caller's requests are this layer's: the pool's hook moves here.
        let requests = pool.take_request_hook();
        let normal = packing.normalised();
        let shift = normal.granularity.trailing_zeros();
        // A segment's size in units fits the sub-allocator's u32 offsets.
        let unit_max = (u32::MAX as usize).saturating_mul(normal.granularity);
        let cap = normal
            .segment_cap(pool.limit())
            .min(unit_max)
            .min(usize::MAX >> 1);
        let cap = cap >> shift << shift;
        PackedPool {
            pool,
            packing,
            shift,
            cap,
            slots: Vec::new(),
            free_slots: Vec::new(),
            index: [FitIndex::new(), FitIndex::new()],
            kind_bytes: [0, 0],
            spares: Vec::new(),
            recent: Vec::new(),
            freed_mark: 0,
            live: HashMap::new(),
            larger: BTreeMap::new(),
            swapped: HashMap::new(),
            st: PackingStats::default(),
            req: Requests::default(),
            requests,
        }
    }

    /// Hands out a block of at least `size` bytes: carved from a segment
    /// when `size` is at most the medium threshold (rounded up to the
    /// granularity), else an exact block of the pool.
    ///
    /// # Errors
    ///
    /// As [`DecayingPool::allocate`]: [`PoolError::ZeroSize`] for `size ==
    /// 0`, and the pool's errors for the segment or exact block it needs
    /// (only when the exact fallback fails too).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing, PoolError};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::with_addresses()).packing(Packing::default()).build();
    /// let a = pool.allocate(100).unwrap();
    /// let b = pool.allocate(100).unwrap();
    /// assert_eq!(b - a, 512); // carved side by side from one segment
    /// assert!(matches!(pool.allocate(0), Err(PoolError::ZeroSize)));
    /// unsafe { pool.release(a, 100); pool.release(b, 100) };
    /// # Ok(())
    /// # }
    /// ```
    pub fn allocate(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        if self.requests.is_some() {
            return self.allocate_logged(size);
        }
        self.serve(size)
    }

    /// [`allocate`](Self::allocate) with a request hook, out of line. A
    /// hook that panics loses no block: it goes back (unlogged) before the
    /// panic goes on.
    #[cold]
    #[inline(never)]
    fn allocate_logged(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        let block = self.serve(size)?;
        if let Some(panic) = self.tell_allocated(&block, size) {
            // SAFETY: `block` came from `serve(size)` just now and never
            // reached the caller.
            unsafe { self.give_back(block, size) };
            std::panic::resume_unwind(panic);
        }
        Ok(block)
    }

    /// Tells the request hook of a block handed out (out of line, so a pool
    /// without one pays a test of one pointer); the hook's panic, if any.
    #[cold]
    #[inline(never)]
    fn tell_allocated(
        &mut self,
        block: &A::Block,
        size: usize,
    ) -> Option<Box<dyn core::any::Any + Send>> {
        let hook = self.requests.as_mut()?;
        let told = Request::Allocated { block, size };
        hook.call_caught(told)
    }

    /// [`release`](Self::release) with a request hook, out of line.
    ///
    /// # Safety
    ///
    /// As [`release`](Self::release).
    #[cold]
    #[inline(never)]
    unsafe fn release_logged(&mut self, block: A::Block, size: usize) {
        // A hook that panics loses no block: it goes back first.
        let hook_panic = self.requests.as_mut().and_then(|hook| {
            let told = Request::Released {
                block: &block,
                size,
            };
            hook.call_caught(told)
        });
        // SAFETY: the caller's contract.
        unsafe { self.give_back(block, size) };
        if let Some(panic) = hook_panic {
            std::panic::resume_unwind(panic);
        }
    }

    /// Tells `hook` of every caller's request from now on (carved and exact
    /// blocks, not the segments), as
    /// [`DecayingPool::log_requests`] does; replaces the hook set before
    /// (a pool's hook set before [`Builder::packing`] is taken over by the
    /// packed pool).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, Packing, Request, SystemAllocator};
    /// let mut pool = DecayingPool::builder(SystemAllocator::new()).packing(Packing::default()).build();
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// pool.log_requests(move |r: Request<'_, _>| tx.send((r.is_allocation(), r.size())).unwrap());
    /// let (a, b) = (pool.allocate(100)?, pool.allocate(200)?); // one segment, two requests
    /// // SAFETY: each block came from this pool with this size and is not used again.
    /// unsafe { pool.release(a, 100); pool.release(b, 200) };
    /// assert_eq!(rx.try_iter().collect::<Vec<_>>(), [(true, 100), (true, 200), (false, 100), (false, 200)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn log_requests(&mut self, hook: impl FnMut(Request<'_, A::Block>) + Send + 'static) {
        self.requests = Some(RequestHook::new(hook));
    }

    /// The request hook, taken out (a [`SharedPool`](crate::SharedPool)
    /// logs its callers' requests itself).
    pub(crate) fn take_request_hook(&mut self) -> Option<RequestHook<A::Block>> {
        self.requests.take()
    }

    /// [`allocate`](Self::allocate) less the request hook.
    #[inline(always)]
    fn serve(&mut self, size: usize) -> Result<A::Block, PoolError<A::Error>> {
        if size == 0 {
            return Err(PoolError::ZeroSize);
        }
        if size > self.packing.medium_threshold {
            let large = self.large_size(size);
            if let Some(block) = self.reuse_larger(large, size) {
                return Ok(block);
            }
            return self.exact(large, size, false);
        }
        let units = self.units_of(size);
        let Ok(units32) = u32::try_from(units) else {
            return self.exact(size, size, false);
        };
        if self.fitting(units) > self.cap {
            return self.exact(size, size, false);
        }
        // Bring decay up to date, as every pool call does.
        self.pool.collect();
        let kind = if size <= self.packing.small_threshold {
            SMALL
        } else {
            MEDIUM
        };
        let (slot, miss) = match self.best_fit(kind, units32) {
            Some(slot) => (slot, false),
            None => {
                let misses = self.pool.miss_count();
                match self.new_segment(kind, units)? {
                    Some(slot) => (slot, self.pool.miss_count() != misses),
                    None => return self.exact(size, size, true),
                }
            }
        };
        let Some(seg) = self.slots[slot as usize].as_mut() else {
            unreachable!("a listed segment is held")
        };
        let Some(alloc) = seg.carve(units32) else {
            // Not expected: a chosen segment's largest free range fits, and
            // a new segment is sized for the request. Stay correct anyway.
            debug_assert!(false, "a chosen segment could not serve the request");
            if seg.live == 0 {
                self.release_segment(slot);
            }
            return self.exact(size, size, true);
        };
        let offset = (alloc.offset as usize) << self.shift;
        let block = A::carve(&seg.block, offset);
        self.refile(slot);
        let bytes = units << self.shift;
        let prev = self.live.insert(
            A::address(&block),
            Live {
                slot,
                units: units32,
                size,
                alloc,
            },
        );
        debug_assert!(prev.is_none(), "two live carved blocks at one address");
        let st = &mut self.st;
        st.requests += 1;
        st.carved += 1;
        st.packed_blocks += 1;
        st.packed_bytes += bytes;
        st.free_segment_bytes -= bytes;
        self.requested(size, bytes, miss);
        Ok(block)
    }

    /// Gives `block` back: to its segment if it was carved (the segment
    /// goes back to the pool when it empties), else to the pool.
    ///
    /// # Safety
    ///
    /// - `block` came from `self.allocate(size)` on this pool, with this
    ///   same `size`;
    /// - it has not been released since, and is not used after this call.
    ///
    /// # Panics
    ///
    /// When `block` was carved with another size, or (as
    /// [`DecayingPool::release`]) when an exact block's `size` could not
    /// have been allocated or more is released than is in use: all break
    /// the safety contract, and the pool refuses rather than corrupt its
    /// state.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::with_addresses()).packing(Packing::default()).build();
    /// let a = pool.allocate(100).unwrap();
    /// // SAFETY: `a` came from `pool.allocate(100)` and is not used again.
    /// unsafe { pool.release(a, 100) };
    /// assert_eq!(pool.packing_stats().packed_blocks, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub unsafe fn release(&mut self, block: A::Block, size: usize) {
        if self.requests.is_some() {
            // SAFETY: the caller's contract.
            return unsafe { self.release_logged(block, size) };
        }
        // SAFETY: the caller's contract.
        unsafe { self.give_back(block, size) }
    }

    /// [`release`](Self::release) less the request hook.
    ///
    /// # Safety
    ///
    /// As [`release`](Self::release).
    #[inline(always)]
    unsafe fn give_back(&mut self, block: A::Block, size: usize) {
        let addr = A::address(&block);
        let Some(live) = self.live.remove(&addr) else {
            // An exact block: the pool checks the size.
            let large = size > self.packing.medium_threshold;
            let bytes = if large { self.large_size(size) } else { size };
            let bytes = match self.swapped.remove(&addr) {
                Some((taken, class)) if large && Some(class) == self.pool.class_size(bytes) => {
                    self.st.oversize_bytes -= taken - class;
                    taken
                }
                Some(wrong) => {
                    self.swapped.insert(addr, wrong);
                    panic!(
                        "PackedPool::release: a large block allocated for a class of {} bytes \
                         released as {size} bytes",
                        wrong.1
                    );
                }
                None => bytes,
            };
            // SAFETY: the caller's contract; the block was not carved, so it
            // came from `self.pool.allocate(bytes)` (`allocate` asks for
            // `large_size(size)` above the medium threshold), or from
            // `self.pool.take_cached(bytes)` when it was swapped for a
            // larger class.
            unsafe { self.pool.release(block, bytes) };
            self.st.bytes_requested = self.st.bytes_requested.saturating_sub(size);
            let class = self.pool.class_size(bytes).unwrap_or(bytes);
            self.req.exact_blocks = self.req.exact_blocks.saturating_sub(1);
            self.req.exact_bytes = self.req.exact_bytes.saturating_sub(class);
            if large && self.packing.large_fit > 0 {
                self.remember_larger(bytes);
            }
            return;
        };
        if live.size != size {
            self.live.insert(addr, live);
            panic!(
                "PackedPool::release: a block carved for {} bytes released as {size} bytes",
                live.size
            );
        }
        drop(block);
        // The range goes back first: a panic in the policy run below (a
        // clock's, a policy's) must not strand it.
        let Some(seg) = self.slots[live.slot as usize].as_mut() else {
            unreachable!("a live block's segment is held")
        };
        seg.free(live.alloc, live.units);
        let bytes = (live.units as usize) << self.shift;
        let st = &mut self.st;
        st.packed_blocks -= 1;
        st.packed_bytes -= bytes;
        st.free_segment_bytes += bytes;
        st.bytes_requested -= size;
        if seg.live == 0 {
            // Releasing the segment runs the policy.
            self.release_segment(live.slot);
        } else {
            self.refile(live.slot);
            // Bring decay up to date, as every pool call does.
            self.pool.collect();
        }
    }

    /// Runs the pool's policy now (see [`DecayingPool::collect`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::with_addresses()).packing(Packing::default()).build();
    /// assert_eq!(pool.collect(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn collect(&mut self) -> usize {
        self.pool.collect()
    }

    /// Frees every block cached in the pool, emptied segments included (see
    /// [`DecayingPool::trim`]). Returns the bytes freed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::with_addresses()).packing(Packing::default()).build();
    /// let a = pool.allocate(100).unwrap();
    /// unsafe { pool.release(a, 100) };
    /// assert_eq!(pool.trim(), 2 << 20); // the emptied 2 MiB segment
    /// # Ok(())
    /// # }
    /// ```
    pub fn trim(&mut self) -> usize {
        self.pool.trim()
    }

    /// The counters of the caller's requests, as [`DecayingPool::stats`]
    /// gives them for a plain pool: `hits + misses` is the number of
    /// successful `allocate` calls, and `misses` equals `backing_allocs`
    /// (a request makes at most one backing allocation: a new segment or an
    /// exact block).
    ///
    /// - `hits`: requests served with no backing call (carved from a
    ///   segment held, or a segment or large block the pool had cached);
    ///   `bytes_from_pool` / `bytes_from_backing`: the bytes hits / misses
    ///   handed to callers (a carved block's granularity-rounded size, an
    ///   exact block's class), and `bytes_requested` what callers asked for;
    /// - `blocks_in_use`, `bytes_in_use`, `peak_bytes_in_use`: the caller's
    ///   blocks (carved and exact) handed out;
    /// - `bytes_cached`: the idle bytes, `bytes_reserved - bytes_in_use`:
    ///   blocks cached in the pool (emptied segments, large blocks) and the
    ///   free space inside segments held
    ///   ([`PackingStats::free_segment_bytes`]); `blocks_cached` counts the
    ///   cached blocks;
    /// - the backing and freeing counters (`backing_*`, `evictions`,
    ///   `trimmed`), `bytes_reserved` and `peak_bytes_reserved` are the
    ///   pool's: what reached the backing allocator.
    ///
    /// The exact pool's own counters, where segments are blocks, are
    /// [`pool().stats()`](DecayingPool::stats); the segment figures are
    /// [`packing_stats`](Self::packing_stats).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, Packing, SystemAllocator};
    /// let mut pool = DecayingPool::builder(SystemAllocator::new()).packing(Packing::default()).build();
    /// let (a, b) = (pool.allocate(100)?, pool.allocate(200)?);
    /// let s = pool.stats();
    /// assert_eq!((s.hits, s.misses, s.backing_allocs), (1, 1, 1)); // one segment, carved twice
    /// assert_eq!((s.blocks_in_use, s.bytes_in_use), (2, 1024)); // two 512-byte units
    /// assert_eq!(s.bytes_cached, s.bytes_reserved - 1024); // the segment's free space
    /// assert_eq!(pool.pool().stats().blocks_in_use, 1); // the pool sees one segment
    /// // SAFETY: each block came from this pool with this size and is not used again.
    /// unsafe { pool.release(a, 100); pool.release(b, 200) };
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let mut s = self.pool.stats();
        let r = &self.req;
        let in_use = self.st.packed_bytes.saturating_add(r.exact_bytes);
        s.hits = r.hits;
        s.misses = r.misses;
        s.blocks_in_use = self.st.packed_blocks + r.exact_blocks;
        s.bytes_in_use = in_use;
        s.bytes_cached = s.bytes_reserved.saturating_sub(in_use);
        s.peak_bytes_in_use = r.peak_in_use;
        s.bytes_from_pool = r.bytes_from_pool;
        s.bytes_from_backing = r.bytes_from_backing;
        s.bytes_requested = r.bytes_requested;
        s
    }

    /// The packing counters.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let pool = DecayingPool::builder(CheckingAllocator::with_addresses()).packing(Packing::default()).build();
    /// assert_eq!(pool.packing_stats(), decaying_pool::PackingStats::default());
    /// # Ok(())
    /// # }
    /// ```
    pub fn packing_stats(&self) -> PackingStats {
        self.st
    }

    /// The exact pool underneath.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let pool = DecayingPool::builder(CheckingAllocator::with_addresses()).limit(1 << 30).packing(Packing::default()).build();
    /// assert_eq!(pool.pool().limit(), Some(1 << 30));
    /// # Ok(())
    /// # }
    /// ```
    pub fn pool(&self) -> &DecayingPool<A, P, C> {
        &self.pool
    }

    /// The packing setting, as given.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let p = Packing::default().medium_threshold(16 << 20);
    /// let pool = DecayingPool::builder(CheckingAllocator::with_addresses()).packing(p).build();
    /// assert_eq!(pool.packing(), p);
    /// # Ok(())
    /// # }
    /// ```
    pub fn packing(&self) -> Packing {
        self.packing
    }

    /// The largest segment this pool makes, bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let pool = DecayingPool::builder(CheckingAllocator::with_addresses())
    ///     .packing(Packing::default().capacity(8 << 30))
    ///     .build();
    /// assert_eq!(pool.segment_cap(), 256 << 20);
    /// # Ok(())
    /// # }
    /// ```
    pub fn segment_cap(&self) -> usize {
        self.cap
    }

    /// Changes the byte limit of the pool underneath
    /// ([`DecayingPool::set_limit`]: cached blocks, emptied segments
    /// included, are freed oldest first until the reserved bytes fit).
    /// Returns the bytes freed. The largest segment stays what the limit at
    /// construction made it ([`segment_cap`](Self::segment_cap)).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, Packing, SystemAllocator};
    /// let mut pool = DecayingPool::builder(SystemAllocator::new()).packing(Packing::default()).build();
    /// let a = pool.allocate(100)?;
    /// // SAFETY: `a` came from this pool with this size and is not used again.
    /// unsafe { pool.release(a, 100) };
    /// assert_eq!(pool.set_limit(Some(1 << 20)), 2 << 20); // the emptied 2 MiB segment
    /// assert_eq!(pool.pool().limit(), Some(1 << 20));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_limit(&mut self, limit: Option<usize>) -> usize {
        self.pool.set_limit(limit)
    }

    /// Sets every peak to its current value: the caller-level peak in use
    /// of [`stats`](Self::stats), the pool's peaks
    /// ([`DecayingPool::reset_peaks`]) and
    /// [`PackingStats::peak_segment_bytes`].
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{DecayingPool, Packing, SystemAllocator};
    /// let mut pool = DecayingPool::builder(SystemAllocator::new()).packing(Packing::default()).build();
    /// let a = pool.allocate(100)?;
    /// // SAFETY: `a` came from this pool with this size and is not used again.
    /// unsafe { pool.release(a, 100) };
    /// pool.reset_peaks();
    /// assert_eq!(pool.stats().peak_bytes_in_use, 0);
    /// assert_eq!(pool.packing_stats().peak_segment_bytes, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset_peaks(&mut self) {
        self.pool.reset_peaks();
        self.req.peak_in_use = self.st.packed_bytes.saturating_add(self.req.exact_bytes);
        self.st.peak_segment_bytes = self.st.segment_bytes;
    }

    /// The same pool over another allocator of the same blocks: every
    /// field moves over as it is, and `f` turns the exact pool's allocator
    /// into the new one (a [`SharedPool`](crate::SharedPool) swaps its own
    /// in, so that backing calls run outside the packing lock). The exact
    /// pool's debug record of blocks handed out starts afresh.
    pub(crate) fn map_allocator<B>(self, f: impl FnOnce(A) -> B) -> PackedPool<B, P, C>
    where
        B: Packable<Block = A::Block>,
    {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again (`ManuallyDrop`),
        // so each field is moved out exactly once, here.
        let pool = unsafe { core::ptr::read(&this.pool) };
        let (alloc, cache) = pool.into_parts();
        let pool = DecayingPool::from_parts(f(alloc), cache);
        // SAFETY: as above, each field read once.
        unsafe {
            PackedPool {
                pool,
                packing: core::ptr::read(&this.packing),
                shift: this.shift,
                cap: this.cap,
                slots: core::ptr::read(&this.slots),
                free_slots: core::ptr::read(&this.free_slots),
                index: core::ptr::read(&this.index),
                kind_bytes: this.kind_bytes,
                spares: core::ptr::read(&this.spares),
                recent: core::ptr::read(&this.recent),
                freed_mark: this.freed_mark,
                live: core::ptr::read(&this.live),
                larger: core::ptr::read(&this.larger),
                swapped: core::ptr::read(&this.swapped),
                st: core::ptr::read(&this.st),
                req: this.req,
                requests: core::ptr::read(&this.requests),
            }
        }
    }

    /// Checks that no two live carved blocks overlap, that every unit of
    /// every segment is either handed out or free in its sub-allocator, and
    /// that the counters agree with the structures (and the pool's own
    /// [`validate`](DecayingPool::validate)).
    ///
    /// # Panics
    ///
    /// With a description of the first inconsistency found (a bug in this
    /// crate).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, Packing};
    /// let mut pool = DecayingPool::builder(CheckingAllocator::with_addresses()).packing(Packing::default()).build();
    /// let a = pool.allocate(100).unwrap();
    /// pool.validate();
    /// unsafe { pool.release(a, 100) };
    /// pool.validate();
    /// ```
    #[cfg(any(test, feature = "testing"))]
    pub fn validate(&self) {
        self.pool.validate();
        let mut per_slot: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.slots.len()];
        let mut packed_bytes = 0usize;
        let mut requested_packed = 0usize;
        for (&addr, l) in &self.live {
            let seg = self.slots[l.slot as usize]
                .as_ref()
                .expect("a live block's segment is held");
            assert_eq!(
                A::address(&seg.block) + ((l.alloc.offset as usize) << self.shift),
                addr,
                "a live block's address is its segment's plus its offset"
            );
            assert_eq!(
                l.units as usize,
                self.units_of(l.size),
                "units match the size"
            );
            per_slot[l.slot as usize].push((l.alloc.offset, l.units));
            packed_bytes += (l.units as usize) << self.shift;
            requested_packed += l.size;
        }
        let mut segments = 0u64;
        let mut segment_bytes = 0usize;
        let mut kind_bytes = [0usize; 2];
        for (slot, s) in self.slots.iter().enumerate() {
            let Some(seg) = s else {
                assert!(per_slot[slot].is_empty());
                assert!(
                    self.free_slots.contains(&(slot as u32)),
                    "an empty slot is free"
                );
                continue;
            };
            segments += 1;
            segment_bytes += seg.bytes;
            kind_bytes[seg.kind] += seg.bytes;
            assert_eq!((seg.units as usize) << self.shift, seg.bytes);
            assert!(seg.bytes <= self.cap, "a segment within the cap");
            let ranges = &mut per_slot[slot];
            ranges.sort_unstable();
            let mut end = 0u64;
            let mut used = 0u64;
            for &(off, units) in ranges.iter() {
                assert!(
                    u64::from(off) >= end,
                    "two live blocks overlap in segment {slot}"
                );
                end = u64::from(off) + u64::from(units);
                used += u64::from(units);
            }
            assert!(
                end <= u64::from(seg.units),
                "a block past its segment's end"
            );
            assert_eq!(u64::from(seg.used), used, "segment {slot}: used units");
            assert_eq!(
                seg.live as usize,
                ranges.len(),
                "segment {slot}: live blocks"
            );
            assert!(seg.live > 0, "an empty segment is held");
            let report = seg.alloc.storage_report();
            assert_eq!(
                u64::from(report.total_free_space) + used,
                u64::from(seg.units),
                "segment {slot}: every unit used or free"
            );
            assert_eq!(
                seg.bin,
                bin_round_down(seg.largest_free()),
                "segment {slot}: its bin"
            );
            assert_eq!(
                self.index[seg.kind].at(seg.bin, seg.pos),
                Some(slot as u32),
                "segment {slot}: its index entry"
            );
        }
        assert_eq!(
            self.index[0].len() + self.index[1].len(),
            segments as usize,
            "every segment listed once"
        );
        assert_eq!(kind_bytes, self.kind_bytes);
        let st = &self.st;
        assert_eq!(st.segments, segments);
        assert_eq!(st.segment_bytes, segment_bytes);
        assert_eq!(st.packed_blocks, self.live.len() as u64);
        assert_eq!(st.packed_bytes, packed_bytes);
        assert_eq!(st.free_segment_bytes, segment_bytes - packed_bytes);
        assert!(st.bytes_requested >= requested_packed);
        assert_eq!(st.requests, st.carved + st.exact + st.exact_fallbacks);
        assert_eq!(st.segments_created - st.segments_released, segments);
        assert_eq!(
            st.oversize_bytes,
            self.swapped
                .values()
                .map(|&(taken, class)| taken - class)
                .sum::<usize>(),
            "oversize bytes: the excess of the large blocks swapped for a larger class"
        );
        assert!(st.larger_reuses >= self.swapped.len() as u64);
        assert!(self.larger.len() <= LARGER);
        assert!(
            self.swapped.keys().all(|a| !self.live.contains_key(a)),
            "a swapped large block is not carved"
        );
        let pool = self.pool.stats();
        assert!(pool.bytes_in_use >= segment_bytes);
        // The caller's counters: one pool miss at most a request, and the
        // pool's blocks in use are the segments and the exact blocks.
        let r = &self.req;
        assert_eq!(r.hits + r.misses, st.requests, "hits + misses = requests");
        assert_eq!(r.misses, pool.misses, "a miss is a request's pool miss");
        assert_eq!(r.exact_blocks + st.segments, pool.blocks_in_use);
        let segment_classes: usize = self
            .slots
            .iter()
            .flatten()
            .map(|s| self.pool.class_size(s.bytes).unwrap_or(s.bytes))
            .sum();
        assert_eq!(r.exact_bytes + segment_classes, pool.bytes_in_use);
        assert!(r.peak_in_use >= st.packed_bytes + r.exact_bytes);
        assert!(r.bytes_requested >= st.bytes_requested);
    }

    /// Per segment held: (medium?, bytes, bytes handed out, largest free
    /// range in bytes, blocks handed out). For diagnostics.
    #[doc(hidden)]
    pub fn segments(&self) -> Vec<(bool, usize, usize, usize, u32)> {
        self.slots
            .iter()
            .flatten()
            .map(|s| {
                (
                    s.kind == MEDIUM,
                    s.bytes,
                    (s.used as usize) << self.shift,
                    (s.largest_free() as usize) << self.shift,
                    s.live,
                )
            })
            .collect()
    }

    /// What a request above the medium threshold asks of the pool.
    #[inline]
    fn large_size(&self, size: usize) -> usize {
        size.checked_next_multiple_of(self.packing.large_rounding.max(1))
            .unwrap_or(size)
    }

    #[inline]
    /// The fewest units a block carved from a segment of `kind` takes: one
    /// for small segments, the units of a request just above the small
    /// threshold for medium ones.
    fn min_units(&self, kind: usize) -> u32 {
        if kind == SMALL {
            1
        } else {
            let above_small = self.packing.small_threshold.saturating_add(1);
            u32::try_from(self.units_of(above_small)).unwrap_or(u32::MAX)
        }
    }

    fn units_of(&self, size: usize) -> usize {
        let mask = (1usize << self.shift) - 1;
        (size >> self.shift) + usize::from(size & mask != 0)
    }

    /// A successful request of `size` bytes, served with `served` bytes
    /// (its carved units or its exact block's class), a miss when it made
    /// a backing allocation.
    fn requested(&mut self, size: usize, served: usize, miss: bool) {
        let st = &mut self.st;
        st.bytes_requested = st.bytes_requested.saturating_add(size);
        st.peak_bytes_requested = st.peak_bytes_requested.max(st.bytes_requested);
        let r = &mut self.req;
        if miss {
            r.misses += 1;
            r.bytes_from_backing = r.bytes_from_backing.saturating_add(served);
        } else {
            r.hits += 1;
            r.bytes_from_pool = r.bytes_from_pool.saturating_add(served);
        }
        r.bytes_requested = r.bytes_requested.saturating_add(size);
        let in_use = st.packed_bytes.saturating_add(r.exact_bytes);
        r.peak_in_use = r.peak_in_use.max(in_use);
    }

    /// An exact block of `bytes` for a request of `size`.
    fn exact(
        &mut self,
        bytes: usize,
        size: usize,
        fallback: bool,
    ) -> Result<A::Block, PoolError<A::Error>> {
        let misses = self.pool.miss_count();
        let block = self.pool.allocate(bytes)?;
        let miss = self.pool.miss_count() != misses;
        self.st.requests += 1;
        if fallback {
            self.st.exact_fallbacks += 1;
        } else {
            self.st.exact += 1;
        }
        let class = self.pool.class_size(bytes).unwrap_or(bytes);
        self.req.exact_blocks += 1;
        self.req.exact_bytes = self.req.exact_bytes.saturating_add(class);
        self.requested(size, class, miss);
        Ok(block)
    }

    /// A cached large block for a request of `size` bytes (`bytes` once
    /// rounded), of its class or up to `1 / large_fit` larger, if the pool
    /// holds one (see [`Packing::large_fit`]); `None` sends the request to
    /// the pool (a hit there, or a miss).
    ///
    /// The classes tried are those remembered as given back to the pool,
    /// smallest first; one the pool no longer holds is forgotten, so each
    /// remembered class costs one failed try at most (O(1) amortised, and
    /// O(log) for the ordered lookup).
    fn reuse_larger(&mut self, bytes: usize, size: usize) -> Option<A::Block> {
        let fit = self.packing.large_fit;
        if fit == 0 || self.larger.is_empty() {
            return None;
        }
        let class = self.pool.class_size(bytes)?;
        let most = class.saturating_add(class / fit);
        // On a known capacity (or limit), what larger blocks hold beyond
        // their requests is free space that live blocks pin, as inside
        // segments: the two stay within the slack budget together (a
        // larger one on a roomy device: `slack_left`).
        let budget = self
            .packing
            .capacity
            .or(self.pool.limit())
            .map_or(usize::MAX, |c| self.slack_left(c, true));
        let most = most.min(class.saturating_add(budget));
        loop {
            let (&taken, count) = self.larger.range_mut(class..=most).next()?;
            let block = self.pool.take_cached(taken);
            if block.is_none() || *count == 1 {
                self.larger.remove(&taken);
            } else {
                *count -= 1;
            }
            let Some(block) = block else {
                // Freed by the pool since: forgotten, try the next.
                continue;
            };
            let st = &mut self.st;
            st.requests += 1;
            st.exact += 1;
            if taken != class {
                st.larger_reuses += 1;
                st.oversize_bytes += taken - class;
                self.swapped.insert(A::address(&block), (taken, class));
            }
            self.req.exact_blocks += 1;
            self.req.exact_bytes = self.req.exact_bytes.saturating_add(taken);
            self.requested(size, taken, false);
            return Some(block);
        }
    }

    /// Remembers that a large block of `bytes` went back to the pool.
    fn remember_larger(&mut self, bytes: usize) {
        let Some(class) = self.pool.class_size(bytes) else {
            return;
        };
        if let Some(count) = self.larger.get_mut(&class) {
            *count = count.saturating_add(1);
            return;
        }
        if self.larger.len() == LARGER {
            self.larger.pop_first();
        }
        self.larger.insert(class, 1);
    }

    /// The segment of `kind` whose largest free range fits `units` most
    /// tightly (to the sub-allocator's bins), in O(1).
    #[inline]
    fn best_fit(&self, kind: usize, units: u32) -> Option<u32> {
        self.index[kind].find(bin_round_up(units))
    }

    /// Files a segment whose largest free range changed under its new bin.
    #[inline]
    fn refile(&mut self, slot: u32) {
        let Some(seg) = self.slots[slot as usize].as_mut() else {
            return;
        };
        let bin = bin_round_down(seg.largest_free());
        if bin == seg.bin {
            return;
        }
        let (kind, old, pos) = (seg.kind, seg.bin, seg.pos);
        let ix = &mut self.index[kind];
        seg.bin = bin;
        seg.pos = ix.insert(bin, slot);
        if let Some(moved) = ix.remove(old, pos) {
            if let Some(m) = self.slots[moved as usize].as_mut() {
                m.pos = pos;
            }
        }
    }

    /// The smallest segment, in bytes, whose sub-allocator serves a
    /// request of `units` (its bins are a 3-bit-mantissa float: a range is
    /// filed under the bin its size rounds down to).
    fn fitting(&self, units: usize) -> usize {
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        (offset_allocator::ext::min_allocator_size(units) as usize) << self.shift
    }

    /// The size of a new segment of `kind` for a request of `units`.
    fn segment_size(&self, kind: usize, units: usize) -> usize {
        let p = &self.packing;
        let need = self.fitting(units);
        let held = self.kind_bytes[kind];
        let grown = held / p.growth.max(1);
        // Room for a few such requests, as far as the footprint justifies.
        let several = need.saturating_mul(p.segment_multiple.max(1)).min(held);
        let floor = if kind == SMALL {
            p.small_segment
        } else {
            p.medium_segment
        };
        let want = floor.max(need).max(grown).max(several);
        // Four sizes per power of two: few distinct sizes (cache hits in
        // the pool), at most 25% over.
        let want = crate::SizeClass::PowerOfTwoDivisions(4)
            .round(want)
            .unwrap_or(usize::MAX);
        let size = want.min(self.cap).max(need);
        // Near a known capacity, segments shrink with the room left (half
        // of it, rounded down to a power of two): the last segments strand
        // little free space.
        let Some(c) = self.packing.capacity.or(self.pool.limit()) else {
            return size >> self.shift << self.shift;
        };
        let room = c.saturating_sub(self.pool.stats().bytes_reserved) / 2;
        let size = if size > room {
            config::floor_pow2(room).max(need)
        } else {
            size
        };
        // Free space inside segments is what can make a request fail on a
        // full device (live blocks cannot move): on a known capacity, new
        // segments shrink towards the request's size so that it stays
        // within 1/slack_fraction of the device.
        // (Large blocks handed out from a larger class pin their excess the
        // same way, and share the budget: `reuse_larger`.)
        let slack = self.slack_left(c, false);
        let size = size.min(need.saturating_add(slack)).max(need);
        size >> self.shift << self.shift
    }

    /// What is left of the slack budget on a device of `c` bytes: the
    /// bytes that free space inside segments and the excess of larger
    /// blocks may still grow by, together (see
    /// [`Packing::slack_fraction`] and [`Packing::large_fit`]).
    ///
    /// The budget is `c / slack_fraction`. For the excess of a larger
    /// block (`larger`) it is half of what the device holds beyond twice
    /// the peak of the bytes requested so far, when that is more: on a
    /// device more than twice the largest live set seen, such blocks may
    /// pin more. That share is a bet that the live bytes will not double:
    /// an excess granted when the peak was `p` keeps the pinned bytes
    /// within `(c - 2p) / 2`, so a request fails for it only once the live
    /// bytes pass `c - (c - 2p) / 2 = c / 2 + p`, more than `2p`. (Segments
    /// keep to `c / slack_fraction`: their free space grows after they are
    /// made, as their blocks go back, and measured on dynamic-shape traces
    /// the larger share failed more requests on tight devices.)
    fn slack_left(&self, c: usize, larger: bool) -> usize {
        let strict = c / self.packing.slack_fraction.max(1);
        let budget = if larger {
            let roomy = c.saturating_sub(self.st.peak_bytes_requested.saturating_mul(2)) / 2;
            strict.max(roomy)
        } else {
            strict
        };
        budget
            .saturating_sub(self.st.free_segment_bytes)
            .saturating_sub(self.st.oversize_bytes)
    }

    /// A segment size for `units` that the pool likely holds cached (a
    /// segment emptied lately): reusing it reserves nothing more. The
    /// largest that fits within the cap is taken.
    fn cached_size(&mut self, units: usize) -> Option<usize> {
        let s = self.pool.stats();
        let freed = s.evictions + s.trimmed;
        if freed != self.freed_mark {
            // The pool freed cached blocks: which ones is not known.
            self.freed_mark = freed;
            self.recent.clear();
        }
        let need = self.fitting(units);
        let (i, &size) = self
            .recent
            .iter()
            .enumerate()
            .filter(|&(_, &r)| r >= need && r <= self.cap)
            .max_by_key(|&(_, &r)| r)?;
        self.recent.swap_remove(i);
        Some(size)
    }

    /// Takes a new segment of `kind` from the pool, big enough for `units`;
    /// `None` when the pool refuses (the request then takes an exact
    /// block), an error when the backing allocator deferred the request
    /// ([`RawAllocator::is_deferral`]: passed up as it is).
    fn new_segment(
        &mut self,
        kind: usize,
        units: usize,
    ) -> Result<Option<u32>, PoolError<A::Error>> {
        let bytes = match self.cached_size(units) {
            Some(b) => b,
            None => self.segment_size(kind, units),
        };
        let Ok(seg_units) = u32::try_from(bytes >> self.shift) else {
            return Ok(None);
        };
        let block = match self.pool.allocate(bytes) {
            Ok(block) => block,
            Err(PoolError::Backing(e)) if A::is_deferral(&e) => {
                return Err(PoolError::Backing(e));
            }
            Err(_) => return Ok(None),
        };
        let alloc = match self
            .spares
            .iter()
            .position(|(k, a)| *k == kind && a.storage_report().total_free_space == seg_units)
        {
            Some(i) => self.spares.swap_remove(i).1,
            None => sub_allocator(seg_units, self.min_units(kind)),
        };
        let seg = Segment {
            block,
            bytes,
            units: seg_units,
            alloc,
            used: 0,
            live: 0,
            kind,
            bin: 0,
            pos: 0,
        };
        let bin = bin_round_down(seg.largest_free());
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(seg);
                s
            }
            None => {
                self.slots.push(Some(seg));
                (self.slots.len() - 1) as u32
            }
        };
        let pos = self.index[kind].insert(bin, slot);
        if let Some(seg) = self.slots[slot as usize].as_mut() {
            (seg.bin, seg.pos) = (bin, pos);
        }
        self.kind_bytes[kind] += bytes;
        let st = &mut self.st;
        st.segments_created += 1;
        st.segments += 1;
        st.segment_bytes += bytes;
        st.free_segment_bytes += bytes;
        st.peak_segment_bytes = st.peak_segment_bytes.max(st.segment_bytes);
        Ok(Some(slot))
    }

    /// Gives an emptied segment back to the pool.
    fn release_segment(&mut self, slot: u32) {
        let Some(seg) = self.slots[slot as usize].take() else {
            unreachable!("releasing a held segment")
        };
        debug_assert_eq!(seg.live, 0);
        self.free_slots.push(slot);
        if let Some(moved) = self.index[seg.kind].remove(seg.bin, seg.pos) {
            if let Some(m) = self.slots[moved as usize].as_mut() {
                m.pos = seg.pos;
            }
        }
        self.kind_bytes[seg.kind] -= seg.bytes;
        let st = &mut self.st;
        st.segments_released += 1;
        st.segments -= 1;
        st.segment_bytes -= seg.bytes;
        st.free_segment_bytes -= seg.bytes;
        if self.spares.len() < SPARES {
            self.spares.push((seg.kind, seg.alloc));
        }
        if self.recent.len() == RECENT {
            self.recent.remove(0);
        }
        self.recent.push(seg.bytes);
        // SAFETY: the segment came from `self.pool.allocate(seg.bytes)`, and
        // leaves the segment table here, once; no carved block of it is live.
        unsafe { self.pool.release(seg.block, seg.bytes) };
    }
}

impl<A: Packable, P: Policy, C: Clock> Drop for PackedPool<A, P, C> {
    fn drop(&mut self) {
        // Segments still carved are leaked to the pool's in-use count, as
        // blocks handed out are; the others cannot exist (an emptied
        // segment goes back at once), but are returned if they did.
        for slot in 0..self.slots.len() as u32 {
            if self.slots[slot as usize]
                .as_ref()
                .is_some_and(|s| s.live == 0)
            {
                self.release_segment(slot);
            }
        }
    }
}

impl<A: Packable, P: Policy, C: Clock> RawAllocator for PackedPool<A, P, C> {
    type Block = A::Block;
    type Error = PoolError<A::Error>;

    #[inline]
    fn allocate(&mut self, size: usize) -> Result<Self::Block, Self::Error> {
        PackedPool::allocate(self, size)
    }

    /// The exact pool's (see `RawAllocator for DecayingPool`): what the
    /// backing allocator and the limit bound.
    fn capacity(&self) -> Option<usize> {
        RawAllocator::capacity(&self.pool)
    }

    /// The exact pool's: what is free behind it plus what it caches; free
    /// space inside segments is not counted (it serves packed sizes only).
    fn available(&self) -> Option<usize> {
        RawAllocator::available(&self.pool)
    }

    #[inline]
    unsafe fn deallocate(&mut self, block: Self::Block, size: usize) {
        // SAFETY: `deallocate`'s contract is `release`'s.
        unsafe { self.release(block, size) }
    }
}

impl<A, P, C> fmt::Debug for PackedPool<A, P, C>
where
    A: Packable + fmt::Debug,
    P: Policy,
    C: Clock + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PackedPool")
            .field("pool", &self.pool)
            .field("packing", &self.packing)
            .field("segment_cap", &self.cap)
            .field("packing_stats", &self.st)
            .finish_non_exhaustive()
    }
}
