//! `pages::Mapped` over the modelled page backend (`ModelPages` behind a
//! shared, logging, failing handle) and a manual clock, checked by the
//! harness in `decaying_pool::fuzzing::mapped` (what a step touched after
//! every step, the whole allocator every 32 steps, after every failure and
//! at the end): both sides' `validate()`, blocks disjoint, aligned, inside
//! a reservation and backed by pages of their own, every byte accounted
//! against the backend's log, spare pages moved only under a capacity and
//! decayed on time, nothing left in the backend after the drop.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    decaying_pool::fuzzing::mapped::mapped_ops(data);
});
