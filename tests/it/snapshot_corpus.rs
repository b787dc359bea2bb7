//! Tests: the `snapshot` fuzz target's corpus, replayed on stable.
//!
//! Every file under `fuzz/corpus/snapshot/` runs through
//! `decaying_pool::fuzzing::snapshot`, as under libFuzzer: a conversion
//! or an error, never a panic or a stack overflow. The seeds are written
//! by Python's `pickle` (`python3 fuzz/snapshot_seeds.py`), and each must
//! convert to what is listed here.

use crate::support::corpus_dir;

use decaying_pool::fuzzing::{SnapshotSummary, snapshot};

#[test]
fn the_snapshot_corpus_converts_or_fails_cleanly() {
    let read = |seed: &str| {
        std::fs::read(corpus_dir("snapshot").join(seed))
            .unwrap_or_else(|e| panic!("{seed}: {e} (regenerate: python3 fuzz/snapshot_seeds.py)"))
    };
    // Device 0's rows: two allocations (streams 0 and 7) and a completed
    // free; its segment_alloc and free_requested are PyTorch's
    // bookkeeping, and device 1 is not the first device.
    let converted = Some(SnapshotSummary {
        events: 3,
        stopped: false,
    });
    for (seed, want) in [
        ("snapshot-p2", converted),
        ("snapshot-p3", converted),
        ("snapshot-p4", converted),
        ("snapshot-p5", converted),
        ("snapshot-truncated-p4", None),
        ("size-past-u64-p4", None),
        ("list-p0", None),
        ("nested-10000", None),
        ("shared-40", None),
    ] {
        assert_eq!(snapshot(&read(seed)), want, "{seed}");
    }
    // And every file there, the seeds and what fuzzing added: no panic.
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir("snapshot"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 9);
    for f in files {
        let _ = snapshot(&std::fs::read(&f).unwrap());
    }
}
