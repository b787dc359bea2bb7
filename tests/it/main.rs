//! The crate's integration tests: one binary, a module per area.
//!
//! They use the crate's test doubles, model checker and trace tooling: the
//! features `testing`, `fuzzing` and `trace`, which the crate's
//! dev-dependency on itself turns on in a checkout. A packaged crate has no
//! such dependency: there the binary is empty unless run with
//! `cargo test --all-features`.
//!
//! Where to look (the rules they check are listed in
//! `docs/ARCHITECTURE.md`, "Rules every pool keeps"):
//!
//! - the pool's rules: `semantics`, `limit_retry`, `unservable`
//!   (requests above the backing allocator's capacity or reach),
//!   `size_class`, `robustness` (panics in the allocator, clock or
//!   policy; `Pooled`'s byte views), `knobs` (run-time limit, figures,
//!   observer, serde), `gc_threshold` (the garbage-collection threshold,
//!   in every pool kind and in the replay);
//! - against a reference model: `model` (random sequences), `fuzz_corpus`
//!   and `packing_corpus` (the fuzz seed corpus on stable); and
//!   `snapshot_corpus`, the snapshot-pickle fuzz corpus;
//! - the policies and stores: `exponential`, `fixed_capacity`,
//!   `timed_store`;
//! - threads and handles: `shared`, `adoption_safety`;
//! - packing: `packing`, `packing_model`, `packing_robust`,
//!   `packing_shared`;
//! - backing allocators: `backends`, `cuda` (feature `cuda`; device tests
//!   skip without a GPU); `page_stats` (the page figures of `Stats`);
//! - trace tooling: `trace`, `trace_input`, `logging`;
//! - `support`: helpers the modules share.
//!
//! A few tests in `trace`, `logging` and `packing` also replay the real
//! traces of `../shared/workloads`, the project's shared folder beside the
//! repository (not in the packaged crate); without it they print a note
//! and check nothing more (each module's documentation names them).

#![cfg(all(feature = "testing", feature = "fuzzing", feature = "trace"))]

/// A `Stats` with the fields named and zero elsewhere (`Stats` is
/// `#[non_exhaustive]`: outside the crate it is built from its default).
macro_rules! stats {
    ($($field:ident: $value:expr),* $(,)?) => {{
        let mut s = decaying_pool::Stats::default();
        $(s.$field = $value;)*
        s
    }};
}

mod adoption_safety;
mod backends;
#[cfg(feature = "cuda")]
mod cuda;
mod exponential;
mod fixed_capacity;
mod fuzz_corpus;
mod gc_threshold;
mod knobs;
mod limit_retry;
#[cfg(not(miri))]
mod logging;
mod mapped;
// Every file with unsafe code has tests that Miri runs (`.ci/miri-coverage`).
mod miri_coverage;
mod model;
mod packing;
mod packing_corpus;
mod packing_model;
mod packing_robust;
mod packing_shared;
// Stats' page figures and the replay timeline's bands.
mod page_stats;
// The page layer: the host backend's tests are ignored under Miri (FFI).
mod pages;
// Writes trace files to the temporary directory: blocked by Miri's isolation.
#[cfg(not(miri))]
mod request_log;
mod robustness;
mod semantics;
mod shared;
mod size_class;
// Reads files: blocked by Miri's isolation.
#[cfg(all(not(miri), feature = "pickle"))]
mod snapshot_corpus;
mod support;
// The unit tests' generator, shared rather than copied.
#[path = "../../src/test_rng.rs"]
mod test_rng;
mod timed_store;
// The trace tests read files and replay whole traces: too slow for Miri and
// blocked by its isolation.
#[cfg(not(miri))]
mod trace;
#[cfg(not(miri))]
mod trace_input;
mod unservable;
