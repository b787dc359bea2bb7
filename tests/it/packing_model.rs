//! Tests: the packing layer against a model of the blocks held, on random
//! operation sequences.
//!
//! The checks live in `decaying_pool::fuzzing_packed` (feature `fuzzing`),
//! shared with the `packed_ops` fuzz target and its corpus replay: a
//! `PackedPool` (or a `SharedPool` holding one) over
//! `FailingAllocator<CheckingAllocator::with_addresses()>`, whose blocks
//! are distinct address ranges. After every step what the step touched,
//! and every 32 steps, after every failure and at the end the whole pool:
//! the layer's and the exact pool's `validate()`; no two held blocks
//! overlap; every packed
//! block lies inside a live backing block counted as a segment, every
//! exact block is a whole backing block; every byte accounted
//! (`PackingStats` against the model: bytes requested, packed blocks and
//! bytes, free bytes inside segments, segments = created − released);
//! every segment in the exact pool once (its blocks in use are the
//! segments plus the exact blocks held); never over the limit; no failure
//! without a limit, a capacity or an injected failure, nor with nothing
//! held for a request that fits. At the end: every segment returned,
//! reserved bytes back to zero once the period passes (or on trim), and
//! every backing block freed exactly once at drop.
//!
//! Here proptest draws the configurations (small thresholds and segments,
//! so cases are cheap) and the operations, and shrinks a failure.

use decaying_pool::SizeClass;
use decaying_pool::fuzzing_packed::{
    CAP_FRACTIONS, DEVICE_CAPACITIES, PACKED_CAPACITIES, PACKED_LIMITS, PACKED_PERIODS,
    PACKED_SIZES, PRESETS, PackedConfig, PackedInput, PackedOp, preset, run_packed,
};
use decaying_pool::fuzzing_packed::{MAX_PACKED_OPS, PACKED_HUGE};
use proptest::prelude::*;
use proptest::sample::select;

fn config() -> impl Strategy<Value = PackedConfig> {
    (
        0..PRESETS.len() as u8,
        select(CAP_FRACTIONS.to_vec()),
        prop::option::weighted(0.25, select(DEVICE_CAPACITIES.to_vec())),
        select(PACKED_PERIODS.to_vec()),
        prop_oneof![
            3 => Just(SizeClass::Exact),
            1 => Just(SizeClass::PowerOfTwo),
            1 => Just(SizeClass::Multiple(1000)),
        ],
        prop::option::weighted(0.3, select(PACKED_LIMITS.to_vec())),
        prop::option::weighted(0.3, select(PACKED_CAPACITIES.to_vec())),
        any::<bool>(),
        prop::collection::vec(select(PACKED_SIZES.to_vec()), 1..=6),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(
            |(
                preset_index,
                cap,
                device,
                ttl,
                size_class,
                limit,
                capacity,
                shared,
                palette,
                trim_at_end,
                drop_seed,
            )| PackedConfig {
                packing: preset(preset_index, cap, device),
                ttl,
                size_class,
                limit,
                capacity,
                shared,
                palette,
                trim_at_end,
                drop_seed,
            },
        )
}

fn op() -> impl Strategy<Value = PackedOp> {
    prop_oneof![
        30 => any::<u8>().prop_map(PackedOp::Allocate),
        1 => Just(PackedOp::AllocateZero),
        1 => (0..PACKED_HUGE.len() as u8).prop_map(PackedOp::AllocateHuge),
        22 => any::<u8>().prop_map(PackedOp::Release),
        8 => any::<u8>().prop_map(PackedOp::ReleaseAllocate),
        6 => (any::<u8>(), any::<u8>()).prop_map(|(size, n)| PackedOp::Burst { size, n }),
        3 => any::<u8>().prop_map(PackedOp::ReleaseAlternate),
        8 => (0u8..80).prop_map(PackedOp::Advance),
        3 => (0u32..=3).prop_map(PackedOp::FailNext),
        4 => Just(PackedOp::Collect),
        2 => Just(PackedOp::Trim),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 1 } else { 400 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The packing layer keeps every invariant on random workloads.
    #[test]
    fn packed_pool_matches_model(cfg in config(), ops in prop::collection::vec(op(), 50..250)) {
        let n = ops.len().min(MAX_PACKED_OPS);
        let summary = run_packed(&PackedInput { config: cfg, ops });
        prop_assert_eq!(summary.ops, n);
    }
}

/// A hand-made case: many small blocks carved from one segment, holes
/// left by releasing every other one, a medium request reusing the holes'
/// neighbour, and everything back to zero at the end.
#[test]
fn holes_are_reused_and_everything_returns() {
    let cfg = PackedConfig {
        packing: preset(0, 1, None),
        ttl: 4,
        size_class: SizeClass::Exact,
        limit: None,
        capacity: None,
        shared: false,
        palette: vec![100, 3000],
        trim_at_end: false,
        drop_seed: 7,
    };
    let mut ops = vec![PackedOp::Burst { size: 0, n: 7 }; 2];
    ops.push(PackedOp::ReleaseAlternate(0));
    ops.push(PackedOp::Burst { size: 0, n: 3 });
    ops.push(PackedOp::Allocate(1));
    let summary = run_packed(&PackedInput { config: cfg, ops });
    assert_eq!(summary.carved, 21);
    assert_eq!(summary.exact + summary.exact_fallbacks, 0);
    assert!(summary.peak_blocks_per_segment >= 8, "{summary:?}");
}
