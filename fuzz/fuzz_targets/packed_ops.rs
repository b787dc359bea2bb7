//! A `PackedPool` (or a `SharedPool` holding one) over an addressed
//! checking, failing allocator, checked by the harness in
//! `decaying_pool::fuzzing::packed` (what a step touched after every step,
//! the whole pool every 32 steps, after every failure and at the end): no
//! two live blocks overlap, every block inside a live segment or an exact
//! block, every byte and segment accounted, the limit held, nothing leaked
//! at drop.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    decaying_pool::fuzzing_packed::packed_ops(data);
});
