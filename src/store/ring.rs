//! A ring buffer: the queue of one size class's older blocks.
//!
//! `std::collections::VecDeque` would do, but its capacity checks and its
//! larger state cost the pool's hit path; here the whole state is one boxed
//! slice and two `u32`s, and the only `unsafe` is reading slots that the
//! head and length say are initialised.
//!
//! The capacity grows by one slot up to [`Ring::EXACT`] slots (0, 1, 2,
//! …, 9) and by half from there (13, 19, 28, …), not by doubling, and
//! need not be a power of two, so an index wraps with a comparison and a
//! subtraction rather than a mask (a LIFO round trip does not touch the
//! ring at all: its block is in the class's bucket). The back of a LIFO
//! ring, which wraps only once a pop from the front has moved the head,
//! takes a branch marked cold instead ([`Ring::back_slot`]): two
//! instructions fewer per access than the select a FIFO ring keeps. With powers of two, a class whose older blocks
//! were just past one (9 in 16 slots, 17 in 32, 33 in 64) left nearly half
//! of its ring empty, which took the timed store to 48.5–50.2 bytes a
//! cached block with 10 to 34 blocks a class (31.2–34.7 now). A small
//! ring, the common case where classes are many, fits its blocks exactly:
//! growing by half there left 5 blocks in 6 slots and 7 in 9. A ring
//! grows only on a release that finds it full, out of line, so the few
//! more reallocations while a class first reaches nine blocks cost the
//! hit path nothing.

use core::mem::MaybeUninit;

/// `i` wrapped into a ring of `cap` slots, on a path marked cold: see
/// [`Ring::back_slot`].
#[cold]
#[inline]
fn wrap(i: usize, cap: usize) -> usize {
    i - cap
}

/// A double-ended queue of `T` in a boxed slice of up to about 2^30 slots:
/// 24 bytes in all.
///
/// Slots `head, head + 1, …, head + len - 1` (modulo the capacity) hold
/// initialised values; the others are uninitialised.
pub(crate) struct Ring<T> {
    buf: Box<[MaybeUninit<T>]>,
    /// The front slot.
    head: u32,
    len: u32,
}

impl<T> Ring<T> {
    /// An empty ring; allocates nothing.
    pub(crate) fn new() -> Self {
        Ring {
            buf: Box::new([]),
            head: 0,
            len: 0,
        }
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot `k` places after the head, for `k` at most the capacity
    /// (the head is below it, so one subtraction wraps); 0 in a ring of no
    /// slots.
    #[inline(always)]
    fn slot(&self, k: usize) -> usize {
        let (i, cap) = (self.head as usize + k, self.buf.len());
        if i >= cap { i - cap } else { i }
    }

    /// [`slot`](Self::slot), for the back of a LIFO ring: only a pop from
    /// the front moves the head, which a LIFO class does only when its
    /// oldest block is freed, so the back rarely wraps. The wrap is then a
    /// comparison and a branch the predictor gets right (the subtraction
    /// marked cold, so the compiler keeps the branch), where `slot`'s
    /// select (right for a FIFO ring, whose back wraps at every turn)
    /// costs two instructions more. (Out of line, the subtraction was a
    /// call that made `SharedPool`'s round trip 6 instructions longer.)
    #[inline(always)]
    fn back_slot(&self, k: usize) -> usize {
        let (i, cap) = (self.head as usize + k, self.buf.len());
        if i >= cap { wrap(i, cap) } else { i }
    }

    /// Appends `value` at the back; grows the capacity by half (at least
    /// one slot) when full.
    ///
    /// # Panics
    ///
    /// When the ring already holds 2^30 values, its largest capacity.
    #[inline(always)]
    pub(crate) fn push_back(&mut self, value: T) {
        self.push_at_back::<false>(value);
    }

    /// [`push_back`](Self::push_back) for a LIFO ring, whose back rarely
    /// wraps (see [`back_slot`](Self::back_slot)).
    ///
    /// # Panics
    ///
    /// When the ring already holds 2^30 values, its largest capacity.
    #[inline(always)]
    pub(crate) fn push_back_lifo(&mut self, value: T) {
        self.push_at_back::<true>(value);
    }

    /// `push_back`, its index wrapped as `back_slot` does if `LIFO`, else
    /// as `slot` does.
    #[inline(always)]
    fn push_at_back<const LIFO: bool>(&mut self, value: T) {
        if self.len as usize == self.buf.len() {
            self.grow();
        }
        let k = self.len as usize;
        let i = if LIFO {
            self.back_slot(k)
        } else {
            self.slot(k)
        };
        // SAFETY: after `grow`, `len` is below the capacity, so the
        // wrapped index `i` (`slot` and `back_slot` compute the same one)
        // is a slot, in bounds.
        unsafe { self.buf.get_unchecked_mut(i) }.write(value);
        self.len += 1;
    }

    /// Removes the value at the back (used by LIFO rings only, so the
    /// back rarely wraps: see [`back_slot`](Self::back_slot)).
    #[inline(always)]
    pub(crate) fn pop_back(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        let i = self.back_slot(self.len as usize);
        // SAFETY: `len` was positive and at most the capacity, so slot
        // `len - 1` after the head (wrapped once, as the head is below the
        // capacity) is an in-bounds index `i`; it was the last of the
        // initialised slots and is now outside them, so it is read once.
        Some(unsafe { self.buf.get_unchecked(i).assume_init_read() })
    }

    /// Removes the value at the front.
    #[inline(always)]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let i = self.slot(0);
        self.head = self.slot(1) as u32;
        self.len -= 1;
        // SAFETY: `len > 0`, so the capacity is positive and the head `i`,
        // below it, is the in-bounds index of an initialised slot; the head
        // has moved past it, so it is read once.
        Some(unsafe { self.buf.get_unchecked(i).assume_init_read() })
    }

    /// The value at the front.
    #[inline]
    pub(crate) fn front(&self) -> Option<&T> {
        if self.len == 0 {
            return None;
        }
        // SAFETY: the head slot is initialised since `len > 0`.
        Some(unsafe { self.buf[self.slot(0)].assume_init_ref() })
    }

    /// The values, front to back.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        (0..self.len()).map(move |k| {
            // SAFETY: slot `k < len` after the head is initialised.
            unsafe { self.buf[self.slot(k)].assume_init_ref() }
        })
    }

    /// Slots allocated.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Grows the capacity by one slot below [`Ring::EXACT`] slots, else
    /// by half, moving the values to the front of the new buffer.
    ///
    /// # Panics
    ///
    /// When the capacity is already 2^30.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = self.buf.len();
        assert!(cap < 1 << 30, "more than 2^30 cached blocks of one size");
        self.resize(if cap < Self::EXACT {
            cap + 1
        } else {
            cap + cap / 2
        });
    }

    /// Up to this many slots, a ring grows one slot at a time, so that it
    /// holds a few values in as many slots. (From 9, growing by half
    /// reaches 13, 19, 28, …, the capacities it reached before.) At least
    /// 2, so that growing by half adds a slot.
    pub(crate) const EXACT: usize = 9;

    /// Shrinks the capacity to twice the values held once a quarter of it
    /// or less is used (down to [`Ring::MIN_KEPT`] slots, or none when
    /// empty); O(len), so a caller
    /// that shrinks after each removal pays for it with the removals since
    /// the ring was last resized. Returns whether it reallocated.
    #[inline]
    pub(crate) fn shrink(&mut self) -> bool {
        let (cap, len) = (self.buf.len(), self.len());
        if cap <= Self::MIN_KEPT || len * 4 > cap {
            return false;
        }
        self.shrink_now();
        true
    }

    #[cold]
    #[inline(never)]
    fn shrink_now(&mut self) {
        let len = self.len();
        let new = if len == 0 {
            0
        } else {
            (len * 2).max(Self::MIN_KEPT)
        };
        self.resize(new);
    }

    /// A ring this small is never shrunk.
    pub(crate) const MIN_KEPT: usize = 8;

    /// Moves the contents into a new buffer of `cap` slots (at least
    /// `len`), oldest at slot 0.
    fn resize(&mut self, cap: usize) {
        debug_assert!(cap >= self.len());
        let mut buf = Box::new_uninit_slice(cap);
        for (k, new) in buf.iter_mut().enumerate().take(self.len()) {
            let i = self.slot(k);
            // SAFETY: slot `k < len` after the head is initialised; the old
            // buffer is dropped below without dropping its contents, so
            // each value is moved exactly once.
            *new = MaybeUninit::new(unsafe { self.buf[i].assume_init_read() });
        }
        self.buf = buf;
        self.head = 0;
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        while self.pop_front().is_some() {}
    }
}

const _: () = assert!(Ring::<u8>::EXACT >= 2);

#[cfg(test)]
mod tests {
    use super::Ring;
    use std::collections::VecDeque;
    use std::rc::Rc;

    /// The ring against `VecDeque` over a fixed pseudo-random mix of
    /// operations, with values that count their drops.
    #[test]
    fn behaves_like_a_vecdeque_and_drops_each_value_once() {
        let alive = Rc::new(());
        let mut ring = Ring::new();
        let mut model = VecDeque::new();
        let mut x: u64 = 7;
        // Fewer steps under Miri: the length still wanders past a few
        // doublings of the buffer and back.
        for step in 0..if cfg!(miri) { 2_000 } else { 20_000u32 } {
            crate::store::lcg(&mut x);
            match (x >> 60) % 4 {
                // Both appends, so that each wraps the back (the front
                // moves it) and grows a ring whose contents wrap.
                0 => {
                    ring.push_back((step, Rc::clone(&alive)));
                    model.push_back(step);
                }
                1 => {
                    ring.push_back_lifo((step, Rc::clone(&alive)));
                    model.push_back(step);
                }
                2 => assert_eq!(ring.pop_back().map(|v| v.0), model.pop_back()),
                _ => assert_eq!(ring.pop_front().map(|v| v.0), model.pop_front()),
            }
            assert_eq!(ring.len(), model.len());
            assert_eq!(ring.front().map(|v| v.0), model.front().copied());
            assert_eq!(Rc::strong_count(&alive), model.len() + 1);
        }
        assert!(ring.iter().map(|v| v.0).eq(model.iter().copied()));
        drop(ring);
        assert_eq!(
            Rc::strong_count(&alive),
            1,
            "dropping the ring drops each value"
        );
    }

    #[test]
    fn grows_a_slot_at_a_time_to_nine_then_by_half() {
        let mut ring = Ring::new();
        assert_eq!(ring.buf.len(), 0);
        let mut caps = Vec::new();
        for i in 0..13u8 {
            ring.push_back(i);
            if caps.last() != Some(&ring.buf.len()) {
                caps.push(ring.buf.len());
            }
        }
        assert_eq!(caps, [1, 2, 3, 4, 5, 6, 7, 8, 9, 13]);
        // Wrapped contents survive a grow in order: the head is at slot 3
        // of 4 when the fifth value comes, and at slot 1 of 9 when the
        // tenth does.
        let mut ring = Ring::new();
        for i in 1..=4u8 {
            ring.push_back(i);
        }
        for _ in 0..3 {
            let v = ring.pop_front().unwrap();
            ring.push_back(v + 4);
        }
        assert_eq!((ring.head, ring.buf.len()), (3, 4));
        ring.push_back(8);
        assert_eq!(ring.buf.len(), 5);
        assert!(ring.iter().copied().eq([4, 5, 6, 7, 8]));
        let mut wide = Ring::new();
        for i in 0..9u8 {
            wide.push_back(i);
        }
        assert_eq!(wide.pop_front(), Some(0));
        wide.push_back(9);
        assert_eq!((wide.head, wide.buf.len()), (1, 9));
        wide.push_back(10);
        assert_eq!(wide.buf.len(), 13);
        assert!(wide.iter().copied().eq(1..=10));
        assert_eq!(ring.pop_back(), Some(8));
        assert_eq!(ring.pop_front(), Some(4));
    }

    #[test]
    fn shrinks_below_a_quarter_to_twice_the_values_keeping_order() {
        let mut ring = Ring::new();
        for i in 0..1000u32 {
            ring.push_back(i);
        }
        // 1, 2, …, 9, 13, 19, …, 711, 1066.
        assert_eq!(ring.capacity(), 1066);
        // More than a quarter used: kept.
        while ring.len() > 267 {
            ring.pop_front();
        }
        assert!(!ring.shrink());
        assert_eq!(ring.capacity(), 1066);
        // A quarter or less: twice the values kept.
        ring.pop_front();
        assert!(ring.shrink());
        assert_eq!(ring.capacity(), 532);
        assert!(ring.iter().copied().eq(734..1000));
        while ring.len() > 3 {
            ring.pop_front();
            ring.shrink();
        }
        assert_eq!(ring.capacity(), Ring::<u32>::MIN_KEPT);
        assert!(ring.iter().copied().eq(997..1000));
        ring.push_back(1000);
        assert_eq!(ring.pop_back(), Some(1000));
        while ring.pop_back().is_some() {}
        assert!(!ring.shrink(), "a small ring is kept");
        assert_eq!(ring.capacity(), Ring::<u32>::MIN_KEPT);
        // A large ring emptied at once goes altogether.
        for i in 0..100 {
            ring.push_back(i);
        }
        while ring.pop_back().is_some() {}
        assert!(ring.shrink());
        assert_eq!(ring.capacity(), 0);
        ring.push_back(7);
        assert_eq!(ring.front(), Some(&7));
    }

    #[test]
    fn is_three_words() {
        assert_eq!(core::mem::size_of::<Ring<u64>>(), 24);
    }
}
