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

/// A [`SizeClass`] whose steps are powers of two, as shifts: every size
/// class but a [`SizeClass::Multiple`] of a number that is no power of
/// two and [`SizeClass::PowerOfTwoDivisions`] into a number of steps that
/// is no power of two. Rounds any size as [`SizeClass::round`] does, with
/// a mask: a few instructions and no branch on the kind of class
/// ([`round`](Self::round)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Steps {
    /// `log2(k)` of `k` divisions of each power of two, or `usize::BITS`
    /// (no division: a class of the size itself, before `least`).
    split: u32,
    /// `log2(n)` of a multiple of `n` (zero but for `Multiple`).
    least: u32,
}

impl Steps {
    /// The steps of `class`, or `None` when they are not all powers of two.
    pub(crate) fn of(class: SizeClass) -> Option<Steps> {
        let (split, least) = match class {
            SizeClass::Exact | SizeClass::Multiple(0) => (usize::BITS, 0),
            SizeClass::Multiple(n) if n.is_power_of_two() => (usize::BITS, n.trailing_zeros()),
            SizeClass::PowerOfTwo | SizeClass::PowerOfTwoDivisions(0) => (0, 0),
            SizeClass::PowerOfTwoDivisions(k) if k.is_power_of_two() => (k.trailing_zeros(), 0),
            SizeClass::Multiple(_) | SizeClass::PowerOfTwoDivisions(_) => return None,
        };
        Some(Steps { split, least })
    }

    /// [`SizeClass::round`] of the class these are the steps of: a size in
    /// `[2^m, 2^(m+1))` rounds up to a multiple of `2^max(m - split,
    /// least)` (`k = 2^split` steps of `2^(m - split)` from `2^m`, which is
    /// one of them), or `None` for zero or past `usize::MAX`.
    #[inline(always)]
    pub(crate) fn round(self, size: usize) -> Option<usize> {
        let top = size.checked_ilog2()?;
        let shift = top.saturating_sub(self.split).max(self.least);
        // `shift < usize::BITS`: `top` is, and so is `least`.
        let mask = (1usize << shift) - 1;
        Some(size.checked_add(mask)? & !mask)
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
    fn steps_round_as_their_class_rounds() {
        let mut sizes = vec![0usize, 1, 2, 3, usize::MAX, usize::MAX - 1];
        for log in 1..usize::BITS {
            let p = 1usize << log;
            sizes.extend([
                p - 1,
                p,
                p + 1,
                p + p / 3,
                p + p / 2,
                p + (p - 1) / 2 * 2 - 1,
            ]);
            sizes.extend([p.wrapping_mul(3) / 2 + 1, p | (p - 1)]);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..if cfg!(miri) { 50 } else { 3000 } {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            sizes.push(x as usize >> (x % 64));
        }
        let mut classes = vec![
            SizeClass::Exact,
            SizeClass::PowerOfTwo,
            SizeClass::Multiple(0),
            SizeClass::Multiple(1),
            SizeClass::Multiple(1 << (usize::BITS - 1)),
            SizeClass::PowerOfTwoDivisions(0),
            SizeClass::PowerOfTwoDivisions(1),
            SizeClass::PowerOfTwoDivisions(1 << 31),
        ];
        for log in 1..8 {
            classes.push(SizeClass::Multiple(1 << log));
            classes.push(SizeClass::PowerOfTwoDivisions(1 << log));
        }
        for class in classes {
            let steps = Steps::of(class).expect("steps of powers of two");
            for &size in &sizes {
                assert_eq!(steps.round(size), class.round(size), "{class:?} {size}");
            }
        }
        for class in [
            SizeClass::Multiple(96),
            SizeClass::Multiple(usize::MAX),
            SizeClass::PowerOfTwoDivisions(3),
            SizeClass::PowerOfTwoDivisions(u32::MAX),
        ] {
            assert_eq!(Steps::of(class), None, "{class:?}");
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
