//! The state of a reservation's slots, shared by the backends: which slots
//! are mapped (a bitset) and which page each shows.

use fixedbitset::FixedBitSet;

use super::PageError;

/// No page in a slot.
const EMPTY: u32 = u32::MAX;

/// The slots of one reservation.
#[derive(Debug)]
pub(super) struct Slots {
    /// Bit `i`: slot `i` is mapped.
    mapped: FixedBitSet,
    /// The page (its backend's index) each slot shows, `EMPTY` if none;
    /// made as far as the last slot ever mapped (a reservation is tens of
    /// thousands of slots, most never used).
    page: Vec<u32>,
    /// How many slots.
    count: usize,
    granularity: usize,
}

impl Slots {
    pub(super) fn new(count: usize, granularity: usize) -> Self {
        Slots {
            mapped: FixedBitSet::with_capacity(count),
            page: Vec::new(),
            count,
            granularity,
        }
    }

    /// The length in bytes.
    pub(super) fn len_bytes(&self) -> usize {
        self.count * self.granularity
    }

    /// How many slots are mapped.
    pub(super) fn mapped_count(&self) -> usize {
        self.mapped.count_ones(..)
    }

    /// The first slot of a run of `count` slots at byte `offset`, checked
    /// to lie inside the range.
    pub(super) fn run(&self, offset: usize, count: usize) -> Result<usize, PageError> {
        if count == 0 {
            return Err(PageError::ZeroSize);
        }
        let g = self.granularity;
        if offset % g != 0 {
            return Err(PageError::NotAligned {
                value: offset,
                granularity: g,
            });
        }
        let first = offset / g;
        if first.checked_add(count).is_none_or(|end| end > self.count) {
            return Err(PageError::OutOfRange {
                offset,
                count,
                len: self.len_bytes(),
            });
        }
        Ok(first)
    }

    /// Checks that slots `first..first + count` are all unmapped.
    pub(super) fn check_unmapped(&self, first: usize, count: usize) -> Result<(), PageError> {
        match self.mapped.ones_in(first, count) {
            Some(slot) => Err(PageError::SlotMapped {
                offset: slot * self.granularity,
            }),
            None => Ok(()),
        }
    }

    /// Checks that slots `first..first + count` are all mapped.
    pub(super) fn check_mapped(&self, first: usize, count: usize) -> Result<(), PageError> {
        match (first..first + count).find(|&s| !self.mapped.contains(s)) {
            Some(slot) => Err(PageError::SlotUnmapped {
                offset: slot * self.granularity,
            }),
            None => Ok(()),
        }
    }

    /// Records `pages` in the slots from `first` on.
    pub(super) fn set(&mut self, first: usize, pages: impl IntoIterator<Item = u32>) {
        for (i, p) in pages.into_iter().enumerate() {
            if first + i >= self.page.len() {
                self.page.resize(first + i + 1, EMPTY);
            }
            self.mapped.insert(first + i);
            self.page[first + i] = p;
        }
    }

    /// Clears slots `first..first + count` and calls `f` with each page they
    /// showed.
    pub(super) fn clear(&mut self, first: usize, count: usize, mut f: impl FnMut(u32)) {
        let made = self.page.len();
        for s in first..(first + count).min(made) {
            let p = core::mem::replace(&mut self.page[s], EMPTY);
            if p != EMPTY {
                f(p);
            }
        }
        self.mapped.remove_range(first..first + count);
    }

    /// How many slots.
    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// The runs of consecutive mapped slots, as `(offset in bytes, count)`.
    pub(super) fn mapped_runs(&self) -> Vec<(usize, usize)> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for s in self.mapped.ones() {
            match runs.last_mut() {
                Some((first, count)) if *first + *count == s => *count += 1,
                _ => runs.push((s, 1)),
            }
        }
        runs.into_iter()
            .map(|(s, n)| (s * self.granularity, n))
            .collect()
    }
}

/// `ones_in`: the first set bit of a window.
trait OnesIn {
    fn ones_in(&self, first: usize, count: usize) -> Option<usize>;
}

impl OnesIn for FixedBitSet {
    fn ones_in(&self, first: usize, count: usize) -> Option<usize> {
        if !self.contains_any_in_range(first..first + count) {
            return None;
        }
        (first..first + count).find(|&s| self.contains(s))
    }
}

/// The first run of `count` consecutive set bits of `bits` (a free list),
/// as its first index.
pub(super) fn first_run(bits: &FixedBitSet, count: usize) -> Option<usize> {
    let (mut start, mut len) = (0, 0);
    for i in bits.ones() {
        if len > 0 && start + len == i {
            len += 1;
        } else {
            start = i;
            len = 1;
        }
        if len == count {
            return Some(start);
        }
    }
    None
}

/// The first set bit of `bits` at or after `from`, found a word at a
/// time (a bit at a time, a release on a reservation of millions of slots
/// took minutes).
pub(super) fn next_one(bits: &FixedBitSet, from: usize) -> Option<usize> {
    const W: usize = usize::BITS as usize;
    let words = bits.as_slice();
    let mut w = from / W;
    let mut word = *words.get(w)? & (usize::MAX << (from % W));
    loop {
        if word != 0 {
            let i = w * W + word.trailing_zeros() as usize;
            return (i < bits.len()).then_some(i);
        }
        w += 1;
        word = *words.get(w)?;
    }
}

/// How many set bits end `bits` (a free tail to grow from).
pub(super) fn trailing_ones(bits: &FixedBitSet) -> usize {
    let n = bits.len();
    (0..n).rev().take_while(|&i| bits.contains(i)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_checks() {
        let mut s = Slots::new(8, 10);
        assert_eq!(s.run(0, 0), Err(PageError::ZeroSize));
        assert_eq!(
            s.run(5, 1),
            Err(PageError::NotAligned {
                value: 5,
                granularity: 10
            })
        );
        assert_eq!(
            s.run(70, 2),
            Err(PageError::OutOfRange {
                offset: 70,
                count: 2,
                len: 80
            })
        );
        assert_eq!(
            s.run(10, usize::MAX).unwrap_err(),
            PageError::OutOfRange {
                offset: 10,
                count: usize::MAX,
                len: 80
            }
        );
        s.set(2, [7, 8]);
        assert_eq!(
            s.check_unmapped(0, 3),
            Err(PageError::SlotMapped { offset: 20 })
        );
        assert_eq!(
            s.check_mapped(2, 3),
            Err(PageError::SlotUnmapped { offset: 40 })
        );
        s.set(5, [9]);
        assert_eq!(s.mapped_runs(), vec![(20, 2), (50, 1)]);
        let mut seen = Vec::new();
        s.clear(0, 8, |p| seen.push(p));
        assert_eq!((seen, s.mapped_count()), (vec![7, 8, 9], 0));
    }

    #[test]
    fn free_runs() {
        let mut b = FixedBitSet::with_capacity(10);
        b.insert_range(1..3);
        b.insert_range(5..10);
        assert_eq!(first_run(&b, 2), Some(1));
        assert_eq!(first_run(&b, 3), Some(5));
        assert_eq!(first_run(&b, 6), None);
        assert_eq!(trailing_ones(&b), 5);
    }

    #[test]
    fn next_ones_agree_with_a_scan() {
        let mut b = FixedBitSet::with_capacity(200);
        for i in [0, 1, 63, 64, 65, 127, 128, 190, 199] {
            b.insert(i);
        }
        for from in 0..=210 {
            assert_eq!(
                next_one(&b, from),
                b.ones().find(|&i| i >= from),
                "from {from}"
            );
        }
        assert_eq!(next_one(&FixedBitSet::with_capacity(0), 0), None);
    }
}
