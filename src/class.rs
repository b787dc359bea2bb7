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
            SizeClass::PowerOfTwoDivisions(k) => match u32::try_from(size) {
                Ok(narrow) => divisions(narrow, k),
                Err(_) => divisions_wide(size, k),
            },
        }
    }

    /// [`round`](Self::round) where it calls nothing: `None` also for the
    /// sizes over `u32::MAX` that [`SizeClass::PowerOfTwoDivisions`]
    /// rounds in 128-bit arithmetic (a call to the compiler's division
    /// routine). The pool's hit paths round with it and leave every `None`
    /// to their slow path, so that they call nothing.
    #[inline(always)]
    pub(crate) fn round_inline(self, size: usize) -> Option<usize> {
        match self {
            SizeClass::PowerOfTwoDivisions(k) => match u32::try_from(size) {
                Ok(0) | Err(_) => None,
                Ok(narrow) => divisions(narrow, k),
            },
            _ => self.round(size),
        }
    }
}

/// [`SizeClass::PowerOfTwoDivisions`] for a nonzero size under 2^32, in
/// 64-bit arithmetic (every product stays under 2^63), so its divisions
/// are instructions, not calls.
#[inline(always)]
fn divisions(size: u32, k: u32) -> Option<usize> {
    let size = u64::from(size);
    let class = if size.is_power_of_two() {
        size
    } else if k <= 1 {
        size.next_power_of_two()
    } else {
        let log = 63 - size.leading_zeros();
        let (p, k, over) = (1u64 << log, u64::from(k), size - (1u64 << log));
        // The smallest step i with ceil(i * p / k) >= over, i.e. i * p > (over - 1) * k
        // (`over >= 1`: a power of two returned above); `i <= k`.
        let i = (((over - 1) * k) >> log) + 1;
        let up = if k.is_power_of_two() {
            // A shift where PyTorch's divisions (powers of two) round.
            (i * p + (k - 1)) >> k.trailing_zeros()
        } else {
            (i * p).div_ceil(k)
        };
        p + up
    };
    // At most 2^32: over `usize::MAX` on 32-bit targets only.
    usize::try_from(class).ok()
}

/// [`SizeClass::PowerOfTwoDivisions`] for a size of 2^32 or more, in
/// 128-bit arithmetic.
#[inline(never)]
fn divisions_wide(size: usize, k: u32) -> Option<usize> {
    if size.is_power_of_two() {
        return Some(size);
    }
    if k <= 1 {
        return size.checked_next_power_of_two();
    }
    let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let (p, k, over) = (floor as u128, u128::from(k), (size - floor) as u128);
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
                assert_eq!(
                    SizeClass::PowerOfTwoDivisions(k).round(size),
                    Some(expect),
                    "size {size} k {k}"
                );
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

    #[test]
    fn divisions_agree_in_64_and_128_bits() {
        // Sizes around every power of two under 2^32 and a spread between,
        // with divisions from none to u32::MAX.
        let mut sizes = vec![1u32, 2, 3, u32::MAX, u32::MAX - 1];
        for log in 1..32 {
            let p = 1u32 << log;
            sizes.extend([p - 1, p, p + 1, p + p / 3, p + (p - 1) / 2 * 2 - 1]);
        }
        let mut x = 0x9e37_79b9u32;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            sizes.push(x);
        }
        for k in [
            0u32,
            1,
            2,
            3,
            4,
            5,
            7,
            8,
            100,
            1 << 20,
            (1 << 31) + 1,
            u32::MAX,
        ] {
            for &size in &sizes {
                assert_eq!(
                    divisions(size, k),
                    divisions_wide(size as usize, k),
                    "size {size} k {k}"
                );
            }
        }
    }

    #[test]
    fn round_inline_rounds_as_round_or_leaves_it_to_round() {
        let classes = [
            SizeClass::Exact,
            SizeClass::PowerOfTwo,
            SizeClass::Multiple(0),
            SizeClass::Multiple(96),
            SizeClass::PowerOfTwoDivisions(0),
            SizeClass::PowerOfTwoDivisions(4),
            SizeClass::PowerOfTwoDivisions(7),
        ];
        let sizes = [0, 1, 1000, 1 << 20, u32::MAX as usize, usize::MAX];
        for class in classes {
            for size in sizes {
                let inline = class.round_inline(size);
                let wide =
                    matches!(class, SizeClass::PowerOfTwoDivisions(_)) && size > u32::MAX as usize;
                if wide {
                    assert_eq!(inline, None, "{class:?} {size}");
                } else {
                    assert_eq!(inline, class.round(size), "{class:?} {size}");
                }
            }
        }
        #[cfg(target_pointer_width = "64")]
        assert_eq!(
            SizeClass::PowerOfTwoDivisions(4).round((1 << 32) + 1),
            Some((1 << 32) + (1 << 30))
        );
    }
}
