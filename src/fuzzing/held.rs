//! The handles and live blocks of a `shared_ops` run, which its two
//! harnesses (`shared`, the model's; `cached`, the thread caches') share.

use crate::policy::Policy;
use crate::shared::{Pooled, SharedPool};

use super::{Clock, Injecting};

/// The pool of a `shared_ops` run.
pub(super) type Shared<P> = SharedPool<Injecting, P, Clock>;

/// A live block of a `shared_ops` run.
pub(super) enum Holder<P: Policy> {
    Pooled(Pooled<Injecting, P, Clock>),
    /// Taken out with `into_raw` or allocated through `with`.
    Raw(u64, usize),
}

impl<P: Policy> Holder<P> {
    /// The size the block was allocated with.
    pub(super) fn size(&self) -> usize {
        match self {
            Holder::Pooled(p) => p.size(),
            Holder::Raw(_, size) => *size,
        }
    }
}

/// The handles and live blocks of a `shared_ops` run (the model's run and
/// the thread-cached one), and the steps on them both runs take alike.
pub(super) struct Held<P: Policy> {
    /// The handles; the first stays until the end.
    pub(super) handles: Vec<Shared<P>>,
    /// The live blocks, in the order the run keeps them.
    pub(super) slots: Vec<Holder<P>>,
}

impl<P: Policy> Drop for Held<P> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failed check: dropping the pool could panic again.
            core::mem::forget(core::mem::take(&mut self.handles));
            core::mem::forget(core::mem::take(&mut self.slots));
        }
    }
}

impl<P: Policy> Held<P> {
    /// The first handle, and no block yet.
    pub(super) fn new(pool: Shared<P>) -> Self {
        Held {
            handles: vec![pool],
            slots: Vec::new(),
        }
    }

    /// Some handle to the pool, if any is left.
    pub(super) fn handle(&self) -> Option<&Shared<P>> {
        self.handles.first().or_else(|| {
            self.slots.iter().find_map(|s| match s {
                Holder::Pooled(p) => Some(p.pool()),
                Holder::Raw(..) => None,
            })
        })
    }

    /// Takes the i-th block out of its `Pooled` with `into_raw`, if it is
    /// in one.
    pub(super) fn make_raw(&mut self, i: usize) {
        if matches!(self.slots[i], Holder::Pooled(_)) {
            let Holder::Pooled(p) = core::mem::replace(&mut self.slots[i], Holder::Raw(0, 0))
            else {
                unreachable!()
            };
            let (block, size) = p.into_raw();
            self.slots[i] = Holder::Raw(block, size);
        }
    }

    /// Puts the i-th block back into a `Pooled` of the first handle with
    /// `from_raw`, if it is raw.
    pub(super) fn make_pooled(&mut self, i: usize) {
        if let Holder::Raw(block, size) = self.slots[i] {
            // SAFETY: `block` came from this pool with `size` (through
            // `into_raw` or a raw `allocate`); the slot owned it alone and
            // now the `Pooled` does.
            self.slots[i] =
                Holder::Pooled(unsafe { Pooled::from_raw(&self.handles[0], block, size) });
        }
    }

    /// Clones the last handle (a clone of a clone), up to eight handles.
    pub(super) fn clone_handle(&mut self) {
        if self.handles.len() < 8 {
            let h = self.handles[self.handles.len() - 1].clone();
            assert!(h.ptr_eq(&self.handles[0]));
            self.handles.push(h);
        }
    }

    /// Drops a handle other than the first (the `i`-th of them, modulo
    /// their count), if there is one.
    pub(super) fn drop_handle(&mut self, i: u8) {
        if self.handles.len() > 1 {
            let i = 1 + usize::from(i) % (self.handles.len() - 1);
            drop(self.handles.remove(i));
        }
    }

    /// Puts every raw block back into a `Pooled` (for the end of a run).
    pub(super) fn all_pooled(&mut self) {
        for i in 0..self.slots.len() {
            self.make_pooled(i);
        }
    }
}
