//! A `DecayingPool` over a checking, failing allocator, run step by step
//! against the reference model in `decaying_pool::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    decaying_pool::fuzzing::pool_ops(data);
});
