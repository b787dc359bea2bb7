//! A `DecayingPool` over a checking, failing allocator, run step by step
//! against the reference model in `decaying_pool::fuzzing`; the allocator,
//! the clock and the policy panic where the input says (the harness catches
//! those panics and keeps quiet about them; any other panic aborts, as
//! libFuzzer expects).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    decaying_pool::fuzzing::pool_ops(data);
});
