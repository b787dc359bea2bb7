//! The store of [`AnyPolicy`](crate::policy::AnyPolicy): a timed store
//! over a boxed policy, or a fixed table, chosen at run time.

use super::{Store, fixed::FixedStore, timed::TimedStore};
use crate::policy::BoxedPolicy;

/// Either store; every call dispatches on the variant.
pub enum AnyStore<B> {
    /// A timed policy's store.
    Timed(TimedStore<B, BoxedPolicy>),
    /// A fixed-capacity table.
    Fixed(FixedStore<B>),
}

macro_rules! dispatch {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Timed($s) => $e,
            AnyStore::Fixed($s) => $e,
        }
    };
}

impl<B> Store<B> for AnyStore<B> {
    // Either may be timed; `timed` tells which.
    const TIMED: bool = true;

    #[inline]
    fn timed(&self) -> bool {
        matches!(self, AnyStore::Timed(_))
    }

    #[inline]
    fn take(&mut self, class: usize, now: u64) -> Option<B> {
        dispatch!(self, s => s.take(class, now))
    }

    #[inline]
    fn take_inline(&mut self, class: usize, now: u64) -> Option<B> {
        dispatch!(self, s => s.take_inline(class, now))
    }

    #[inline]
    fn hits_inline(&self) -> bool {
        dispatch!(self, s => s.hits_inline())
    }

    #[inline]
    fn put(&mut self, block: B, class: usize, now: u64) -> Option<(B, usize)> {
        dispatch!(self, s => s.put(block, class, now))
    }

    #[inline]
    fn evict_due(&mut self, now: u64) -> Option<(B, usize)> {
        dispatch!(self, s => s.evict_due(now))
    }

    #[inline]
    fn may_evict(&self, now: u64) -> bool {
        dispatch!(self, s => s.may_evict(now))
    }

    #[inline]
    fn evict_due_inline(&mut self, now: u64) -> Option<(B, usize)> {
        dispatch!(self, s => s.evict_due_inline(now))
    }

    fn pop_oldest(&mut self, now: u64) -> Option<(B, usize)> {
        dispatch!(self, s => s.pop_oldest(now))
    }

    fn pop_untold(&mut self) -> Option<(B, usize)> {
        dispatch!(self, s => s.pop_untold())
    }

    #[inline]
    fn len(&self) -> usize {
        dispatch!(self, s => s.len())
    }

    #[inline]
    fn bytes(&self) -> usize {
        dispatch!(self, s => s.bytes())
    }

    fn cached_of(&self, class: usize) -> usize {
        dispatch!(self, s => s.cached_of(class))
    }

    #[inline]
    fn taken(&self) -> (u64, u64) {
        dispatch!(self, s => s.taken())
    }

    #[cfg(any(test, feature = "testing"))]
    fn footprint(&self) -> usize {
        dispatch!(self, s => s.footprint())
    }

    fn check(&self) {
        dispatch!(self, s => s.check())
    }
}

impl crate::policy::sealed::Sealed for crate::policy::AnyPolicy {}

impl crate::policy::Policy for crate::policy::AnyPolicy {
    type Store<B> = AnyStore<B>;

    fn into_store<B>(self, reuse: crate::policy::Reuse) -> Self::Store<B> {
        match self {
            crate::policy::AnyPolicy::Timed(p) => AnyStore::Timed(TimedStore::new(p, reuse)),
            crate::policy::AnyPolicy::Fixed(p) => {
                AnyStore::Fixed(crate::policy::Policy::into_store(p, reuse))
            }
        }
    }
}
