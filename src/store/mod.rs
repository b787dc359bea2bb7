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

/// Steps a test's fixed pseudo-random sequence (a 64-bit linear
/// congruential generator, whose high bits are the random ones).
#[cfg(test)]
fn lcg(x: &mut u64) {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
}
