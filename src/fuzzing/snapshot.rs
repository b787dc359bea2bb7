//! The snapshot-pickle harness (feature `pickle`): any bytes go through
//! [`snapshot_to_csv`](crate::trace::snapshot_to_csv), which must answer a
//! conversion or an error, never panic, overflow the stack or run out of
//! memory; a conversion must read back through
//! [`TraceReader`](crate::trace::TraceReader) without a panic.

use crate::trace::{TraceReader, snapshot_to_csv};

/// What [`snapshot`] converted: the events read back from the CSV, and
/// whether the reader stopped at an error (an unknown action, a double
/// allocation: the snapshot's own, reported as for its CSV).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// Events read back.
    pub events: usize,
    /// The reader stopped at an error.
    pub stopped: bool,
}

/// Runs `data` as a snapshot pickle: `None` when it is not one (an error,
/// as the command-line tool reports it), else what the CSV read back to.
///
/// # Panics
///
/// If the conversion writes a CSV that the reader cannot open (its
/// header), which is a bug.
///
/// # Examples
///
/// ```
/// assert_eq!(decaying_pool::fuzzing::snapshot(b"\x80\x02]."), None); // a list
/// ```
pub fn snapshot(data: &[u8]) -> Option<SnapshotSummary> {
    let csv = snapshot_to_csv(data).ok()?;
    let reader = TraceReader::new(&csv[..]).expect("the CSV's header reads");
    let mut events = 0;
    for ev in reader {
        if ev.is_err() {
            return Some(SnapshotSummary {
                events,
                stopped: true,
            });
        }
        events += 1;
    }
    Some(SnapshotSummary {
        events,
        stopped: false,
    })
}
