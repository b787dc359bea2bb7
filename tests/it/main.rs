//! The crate's integration tests: one binary, a module per area.

mod backends;
#[cfg(feature = "cuda")]
mod cuda;
mod exponential;
mod fixed_capacity;
mod limit_retry;
mod model;
mod semantics;
mod shared;
mod size_class;
mod support;
mod trace;
