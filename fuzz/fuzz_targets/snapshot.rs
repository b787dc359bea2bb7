//! Any bytes as a PyTorch snapshot pickle (`trace::snapshot_to_csv`): a
//! conversion or an error, never a panic, a stack overflow or memory
//! beyond a constant times the input; a conversion reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decaying_pool::fuzzing::snapshot(data);
});
