//! Cache stores: where idle blocks wait, and in what order they leave.
//!
//! Implementation detail of [`Policy`](crate::policy::Policy); public only
//! because the policy trait names it. The stores implement `Policy` for the
//! policies they run (the policy module knows only the [`Store`] trait, in
//! its own leaf module), so `policy` and `store` do not import each other.

pub mod any;
mod classes;
pub mod fixed;
mod ring;
pub mod timed;

pub use crate::store_api::Store;

/// The bytes that hits took (the pool's `bytes_from_pool`), saturating at
/// `u64::MAX`: a hit adds with one instruction and a branch never taken
/// before 2^64 bytes. (A `u128` needed no test, but its high word's
/// add-with-carry cost a round trip about 0.6 ns at 64 classes on the
/// development machine, a second memory update on every hit;
/// `saturating_add` a conditional move on the value the next hit adds to.)
#[derive(Default)]
pub(crate) struct TakenBytes {
    sum: u64,
    /// The sum overflowed: it reads `u64::MAX` from then on.
    saturated: bool,
}

impl TakenBytes {
    /// Counts a hit of `bytes`.
    #[inline(always)]
    pub(crate) fn add(&mut self, bytes: usize) {
        let (sum, over) = self.sum.overflowing_add(bytes as u64);
        self.sum = sum;
        if over {
            self.saturated = true;
        }
    }

    /// The bytes counted, or `u64::MAX` once they no longer fit.
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        if self.saturated { u64::MAX } else { self.sum }
    }
}

/// Steps a test's fixed pseudo-random sequence (a 64-bit linear
/// congruential generator, whose high bits are the random ones).
#[cfg(test)]
fn lcg(x: &mut u64) {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
}

#[cfg(test)]
mod tests {
    use super::TakenBytes;

    #[test]
    fn taken_bytes_add_up_then_saturate_and_stay() {
        let mut t = TakenBytes::default();
        t.add(usize::MAX);
        t.add(0);
        assert_eq!(t.get(), usize::MAX as u64);
        t.add(1);
        if usize::BITS == 64 {
            // Past 2^64 - 1: saturated, also once the wrapped sum would
            // read small again.
            assert_eq!(t.get(), u64::MAX);
            t.add(5);
            assert_eq!(t.get(), u64::MAX);
        } else {
            assert_eq!(t.get(), u64::from(u32::MAX) + 1);
        }
        let mut u = TakenBytes::default();
        for b in [3, 0, 7, 1 << 20] {
            u.add(b);
        }
        assert_eq!(u.get(), 10 + (1 << 20));
    }
}
