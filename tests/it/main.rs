//! The crate's integration tests: one binary, a module per area.
//!
//! They use the crate's test doubles, model checker and trace tooling: the
//! features `testing`, `fuzzing` and `trace`, which the crate's
//! dev-dependency on itself turns on in a checkout. A packaged crate has no
//! such dependency: there the binary is empty unless run with
//! `cargo test --all-features`.

#![cfg(all(feature = "testing", feature = "fuzzing", feature = "trace"))]

mod adoption_safety;
mod backends;
#[cfg(feature = "cuda")]
mod cuda;
mod exponential;
mod fixed_capacity;
mod fuzz_corpus;
mod knobs;
mod limit_retry;
mod model;
mod packing;
mod packing_corpus;
mod packing_model;
mod packing_robust;
mod packing_shared;
#[cfg(not(miri))]
mod recording;
mod robustness;
mod semantics;
mod shared;
mod size_class;
mod support;
mod timed_store;
// The trace tests read files and replay whole traces: too slow for Miri and
// blocked by its isolation.
#[cfg(not(miri))]
mod trace;
#[cfg(not(miri))]
mod trace_input;
