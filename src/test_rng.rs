//! The tests' random numbers: the unit tests' module, which the
//! integration tests include by path (`tests/it/main.rs`).

/// A xorshift generator from `seed` (not zero): each call gives a number
/// below its argument.
pub(crate) fn rng(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}
