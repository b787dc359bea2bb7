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
