//! Segments by the size of their largest free range: best fit across
//! segments in O(1).
//!
//! The sub-allocator files free ranges under bins that are a float with a
//! 3-bit mantissa, and a request of `n` units fits a segment exactly when
//! the bin `n` rounds up to is at most the bin of the segment's largest free
//! range. This index files each segment under that bin too, with a bitmap of
//! the bins in use: the segment that fits most tightly is the first in the
//! lowest bin in use at or above the request's, one bit scan away.

/// Bins of a `u32` as a float with a 3-bit mantissa (at most 240).
const BINS: usize = 256;

/// The bin `size` rounds up to: every range of a bin at least this fits it.
#[inline]
pub(crate) fn bin_round_up(size: u32) -> u32 {
    if size < 8 {
        return size;
    }
    let start = 31 - size.leading_zeros() - 3;
    let mantissa = (size >> start) & 7;
    let up = u32::from(size & ((1 << start) - 1) != 0);
    // `+` lets the mantissa carry into the exponent.
    ((start + 1) << 3) + mantissa + up
}

/// The bin `size` is filed under (the largest bin whose value is at most
/// `size`).
#[inline]
pub(crate) fn bin_round_down(size: u32) -> u32 {
    if size < 8 {
        return size;
    }
    let start = 31 - size.leading_zeros() - 3;
    ((start + 1) << 3) | ((size >> start) & 7)
}

/// The segments of one kind, by bin.
pub(crate) struct FitIndex {
    used: [u64; BINS / 64],
    bins: Vec<Vec<u32>>,
    len: usize,
}

impl FitIndex {
    pub(crate) fn new() -> Self {
        FitIndex {
            used: [0; BINS / 64],
            bins: (0..BINS).map(|_| Vec::new()).collect(),
            len: 0,
        }
    }

    /// Files `slot` under `bin`; returns its position there.
    #[inline]
    pub(crate) fn insert(&mut self, bin: u32, slot: u32) -> u32 {
        let list = &mut self.bins[bin as usize];
        list.push(slot);
        self.used[bin as usize / 64] |= 1 << (bin % 64);
        self.len += 1;
        (list.len() - 1) as u32
    }

    /// Removes the entry at `pos` of `bin`; returns the slot that moved
    /// into `pos`, if any (its position must be updated).
    #[inline]
    pub(crate) fn remove(&mut self, bin: u32, pos: u32) -> Option<u32> {
        let list = &mut self.bins[bin as usize];
        list.swap_remove(pos as usize);
        if list.is_empty() {
            self.used[bin as usize / 64] &= !(1 << (bin % 64));
        }
        self.len -= 1;
        list.get(pos as usize).copied()
    }

    /// The slot in the lowest bin in use at or above `min_bin`.
    #[inline]
    pub(crate) fn find(&self, min_bin: u32) -> Option<u32> {
        let mut word = min_bin as usize / 64;
        if word >= self.used.len() {
            return None;
        }
        let mut bits = self.used[word] & (u64::MAX << (min_bin % 64));
        loop {
            if bits != 0 {
                let bin = word * 64 + bits.trailing_zeros() as usize;
                return self.bins[bin].last().copied();
            }
            word += 1;
            if word == self.used.len() {
                return None;
            }
            bits = self.used[word];
        }
    }

    /// Segments filed.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))] // read by validate()
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The slot at `pos` of `bin` (for validation).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn at(&self, bin: u32, pos: u32) -> Option<u32> {
        self.bins.get(bin as usize)?.get(pos as usize).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_agree_with_the_sub_allocator() {
        for size in (0..5000u32).chain([1 << 20, (1 << 20) + 1, 3 << 20, u32::MAX / 2]) {
            let up = bin_round_up(size);
            let down = bin_round_down(size);
            assert!(down <= up && up <= down + 1, "{size}");
            // A fresh sub-allocator of `size` units reports its largest
            // free range as the value of the bin `size` rounds down to.
            if size > 0 && size < 5000 {
                let a = offset_allocator::Allocator::<u32>::with_max_allocs(size, 4);
                let largest = a.storage_report().largest_free_region;
                assert_eq!(bin_round_down(largest), down, "{size}");
                assert_eq!(bin_round_up(largest), down, "{size}");
            }
            let min = offset_allocator::ext::min_allocator_size(size);
            assert_eq!(bin_round_down(min), up, "{size}");
        }
    }

    #[test]
    fn find_takes_the_lowest_bin_at_or_above() {
        let mut ix = FitIndex::new();
        assert_eq!(ix.find(0), None);
        ix.insert(70, 1);
        let p = ix.insert(130, 2);
        ix.insert(130, 3);
        assert_eq!(ix.find(0), Some(1));
        assert_eq!(ix.find(70), Some(1));
        assert_eq!(ix.find(71), Some(3));
        assert_eq!(ix.find(131), None);
        assert_eq!(ix.remove(130, p), Some(3));
        assert_eq!(ix.find(71), Some(3));
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.find(255), None);
    }
}
