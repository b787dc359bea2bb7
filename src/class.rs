//! Size classes: how a request is rounded before lookup.

/// How a request is rounded before the cache is searched and before the
/// backing allocator is called. A block serves exactly the requests of its
/// class; blocks are never split or merged.
///
/// # Examples
///
/// ```
/// use decaying_pool::SizeClass;
///
/// assert_eq!(SizeClass::Exact.round(1000), Some(1000));
/// assert_eq!(SizeClass::PowerOfTwo.round(1000), Some(1024));
/// assert_eq!(SizeClass::Multiple(512).round(1000), Some(1024));
/// assert_eq!(SizeClass::PowerOfTwoDivisions(4).round(1100), Some(1280));
/// assert_eq!(SizeClass::PowerOfTwo.round(usize::MAX), None);
/// assert_eq!(SizeClass::Exact.round(0), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SizeClass {
    /// Every size is its own class (the default): no memory wasted to
    /// rounding, reuse only for repeated sizes.
    #[default]
    Exact,
    /// Round up to the next power of two: at most 2x waste, few classes.
    PowerOfTwo,
    /// Round up to a multiple of `n` bytes (`Multiple(0)` and `Multiple(1)`
    /// are `Exact`).
    Multiple(usize),
    /// Split every interval `[2^m, 2^(m+1)]` into `k` near-equal steps at
    /// `2^m + ceil(i * 2^m / k)` and round up to the next step, as PyTorch's
    /// `roundup_power2_divisions` does (for a power-of-two `k` the steps are
    /// exact). Waste is at most `1/k` of the request; `0` and `1` mean
    /// [`SizeClass::PowerOfTwo`].
    PowerOfTwoDivisions(u32),
}

impl SizeClass {
    /// The class size a request of `size` bytes is served with, or `None`
    /// when `size` is zero or rounding would overflow `usize`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::SizeClass;
    /// assert_eq!(SizeClass::Multiple(256).round(1), Some(256));
    /// assert_eq!(SizeClass::Multiple(256).round(usize::MAX), None);
    /// ```
    #[inline]
    pub fn round(self, size: usize) -> Option<usize> {
        if size == 0 {
            return None;
        }
        match self {
            SizeClass::Exact => Some(size),
            SizeClass::PowerOfTwo => size.checked_next_power_of_two(),
            SizeClass::Multiple(n) => {
                if n <= 1 {
                    Some(size)
                } else {
                    size.checked_next_multiple_of(n)
                }
            }
            SizeClass::PowerOfTwoDivisions(k) => divisions(size, k),
        }
    }
}

fn divisions(size: usize, k: u32) -> Option<usize> {
    if size.is_power_of_two() {
        return Some(size);
    }
    if k <= 1 {
        return size.checked_next_power_of_two();
    }
    let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let (p, k, over) = (floor as u128, u128::from(k), (size - floor) as u128);
    // The smallest step i with ceil(i * p / k) >= over, i.e. i * p > (over - 1) * k
    // (`over >= 1`: a power of two returned above).
    let i = (over - 1) * k / p + 1;
    let class = p + (i * p).div_ceil(k);
    usize::try_from(class).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisions_match_pytorch_for_power_of_two_k() {
        // PyTorch: floor + ceil((size - floor) / (floor / k)) * (floor / k).
        for k in [2u32, 4, 8, 16] {
            for size in (k as usize + 1)..5000 {
                let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
                let step = floor / k as usize;
                let expect = if size.is_power_of_two() {
                    size
                } else {
                    floor + (size - floor).div_ceil(step) * step
                };
                assert_eq!(divisions(size, k), Some(expect), "size {size} k {k}");
            }
        }
    }

    #[test]
    fn divisions_are_monotone_and_cover() {
        for k in [0u32, 1, 3, 5, 7, 64, u32::MAX] {
            let mut last = 0;
            for size in 1..3000usize {
                let c = SizeClass::PowerOfTwoDivisions(k).round(size).unwrap();
                assert!(c >= size && c >= last, "size {size} k {k} class {c}");
                assert_eq!(
                    SizeClass::PowerOfTwoDivisions(k).round(c),
                    Some(c),
                    "stable"
                );
                assert!(c <= size.next_power_of_two());
                last = c;
            }
        }
        assert_eq!(SizeClass::PowerOfTwoDivisions(4).round(usize::MAX), None);
        assert_eq!(
            SizeClass::PowerOfTwoDivisions(4).round((1 << 63) + 1),
            Some((1 << 63) + (1 << 61))
        );
    }
}
