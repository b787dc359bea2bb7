//! The interface between a policy and the cache it runs: the [`Store`]
//! trait. A leaf module: [`policy`](crate::policy) names it, the stores in
//! `store` implement it, and neither of those imports the other.

/// A cache of idle blocks keyed by class size.
///
/// Not meant to be implemented outside this crate.
/// Times are in nanoseconds since the clock's origin
/// ([`Clock::now_nanos`](crate::Clock::now_nanos)).
pub trait Store<B> {
    /// Whether the store needs the clock; a pool over an untimed store
    /// never reads it.
    const TIMED: bool;

    /// Whether this store reads the clock: [`Store::TIMED`], unless the
    /// store is chosen at run time.
    #[inline(always)]
    fn timed(&self) -> bool {
        Self::TIMED
    }

    /// Takes a cached block of `class` bytes (a hit), choosing by the
    /// store's reuse order. `None` for class 0, which no block has (the
    /// pool's inlined hit path asks for it when the request is for zero
    /// bytes, and sends the miss to the path that reports the error).
    fn take(&mut self, class: usize, now: u64) -> Option<B>;

    /// [`take`](Self::take) on the pool's inlined hit path: `None` also
    /// when the policy's hook would call a function
    /// ([`EvictionPolicy::try_on_hit`](crate::EvictionPolicy::try_on_hit)
    /// answered `false`), with nothing changed; the pool then calls `take`
    /// from out of line.
    #[inline(always)]
    fn take_inline(&mut self, class: usize, now: u64) -> Option<B> {
        self.take(class, now)
    }

    /// Whether the pool's inlined hit path takes its hits through
    /// [`take_inline`](Self::take_inline): `false` sends every hit to a
    /// function out of line that calls [`take`](Self::take), for a store
    /// whose `take_inline` would mostly answer `None` (or need registers
    /// that the usual hits would save and restore).
    #[inline(always)]
    fn hits_inline(&self) -> bool {
        true
    }

    /// Caches `block` of `class` bytes, released at `now`. Returns a block
    /// the store displaced to make room (possibly `block` itself), which the
    /// caller must free: that is an eviction. `class` is never 0 (the cache
    /// refuses a release of zero bytes before it gets here).
    fn put(&mut self, block: B, class: usize, now: u64) -> Option<(B, usize)>;

    /// Removes the oldest block if the policy says it must go at `now`.
    fn evict_due(&mut self, now: u64) -> Option<(B, usize)>;

    /// Whether [`evict_due`](Store::evict_due) may free a block at `now`:
    /// `false` only when it certainly frees none (the one comparison its
    /// fast path makes), so that a release can skip the collection, and
    /// the guard that keeps its block safe from a policy or a backing
    /// allocator that unwinds there.
    #[inline(always)]
    fn may_evict(&self, now: u64) -> bool {
        let _ = now;
        true
    }

    /// [`evict_due`](Store::evict_due), for a caller that is itself out
    /// of line (a release's collection, once [`may_evict`](Store::may_evict)
    /// said yes): the store may inline its slow path there.
    #[inline(always)]
    fn evict_due_inline(&mut self, now: u64) -> Option<(B, usize)> {
        self.evict_due(now)
    }

    /// Debug builds, before a collection at `now`: when the policy's
    /// deadline lets the collection skip the policy, asks it anyway and
    /// panics if it wants the oldest block freed (a deadline later than
    /// `must_evict` allows would silently delay evictions).
    #[cfg(debug_assertions)]
    fn check_deadline(&mut self, now: u64) {
        let _ = now;
    }

    /// Removes the oldest block whatever the policy says (trim, limit, retry).
    fn pop_oldest(&mut self, now: u64) -> Option<(B, usize)>;

    /// Removes the oldest block without telling the policy: for dropping
    /// the pool after the policy panicked.
    fn pop_untold(&mut self) -> Option<(B, usize)>;

    /// Cached blocks.
    fn len(&self) -> usize;

    /// Whether the store holds no block.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cached bytes.
    fn bytes(&self) -> usize;

    /// Cached blocks of `class` (for statistics: not on the hot path).
    fn cached_of(&self, class: usize) -> usize;

    /// Blocks taken by hits so far, and their bytes (saturating): the pool's
    /// `hits` and `bytes_from_pool`, counted where the hit happens.
    fn taken(&self) -> (u64, u64);

    /// Bytes of heap memory the store's own structures hold (its
    /// bookkeeping, not the cached blocks).
    #[cfg(any(test, feature = "testing"))]
    fn footprint(&self) -> usize;

    /// Checks every internal invariant; panics with a description of the
    /// first one broken.
    fn check(&self);
}
