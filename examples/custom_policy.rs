//! Replays the trace the CLI ships through the built-in configurations and
//! a policy of your own, through the library's `Replayer`.
//!
//! ```text
//! cargo run --release --example custom_policy [TRACE]
//! ```

use core::time::Duration;

use decaying_pool::policy::{EvictionPolicy, Oldest};
use decaying_pool::trace::{
    Config, PolicyKind, ReplayOptions, Replayer, TraceReader, format_table,
};

/// Keeps at most this many idle bytes.
struct MaxIdle(usize);

impl EvictionPolicy for MaxIdle {
    fn must_evict(&mut self, _now: Duration, _oldest: Oldest, cached: usize) -> bool {
        cached > self.0
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/cli/traces/inference.csv").into());
    let mut r = Replayer::new(&Config::defaults(), ReplayOptions::default());
    r.add_policy(
        &Config::new(PolicyKind::KeepAll).named("max-idle 16MiB"),
        MaxIdle(16 << 20),
    );
    // An error opening the file names it.
    for event in TraceReader::open(&path, Default::default()).map_err(|e| e.to_string())? {
        r.event(&event.map_err(|e| format!("{path}: {e}"))?);
    }
    print!("{}", format_table(&r.finish("inference")));
    Ok(())
}
