//! A `SharedPool`, single-threaded (handles, `Pooled` blocks, `into_raw` /
//! `from_raw`, `with`, drop order), run step by step against the reference
//! model in `decaying_pool::fuzzing`, with injected panics as `pool_ops`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    decaying_pool::fuzzing::shared_ops(data);
});
