//! Tests: the `packed_ops` fuzz corpus, replayed on stable.
//!
//! Every file under `fuzz/corpus/packed_ops/` runs through the same
//! checking harness as the `cargo fuzz` target
//! (`decaying_pool::fuzzing_packed`), so `cargo test` covers it even where
//! nightly is absent. The hand-written seeds are built here (see
//! [`seeds`]); the committed corpus must hold each of them, byte for byte.
//! To rewrite them after changing a seed:
//!
//! ```text
//! DECAYING_POOL_WRITE_CORPUS=1 cargo test --test it packing_corpus::write_packed_corpus -- --ignored
//! ```

use crate::support::{assert_corpus_holds, noise, replay_corpus, write_corpus};

use decaying_pool::fuzzing_packed::{self, PackedSummary};

// --- the input layout (see `decaying_pool::fuzzing_packed::{PackedConfig, PackedOp}`) ---

/// A configuration, byte by byte.
#[derive(Clone)]
struct Cfg {
    /// Index into `PRESETS`.
    preset: u8,
    /// Index into `CAP_FRACTIONS`: 1, 2, 4, 32.
    cap: u8,
    /// Index into `DEVICE_CAPACITIES`.
    device: Option<u8>,
    /// Index into `PACKED_PERIODS`: 0, 1, 4, 16, 64, 1024 ticks.
    ttl: u8,
    /// 0 Exact, 1 PowerOfTwo, 2 Multiple(1000).
    class: u8,
    /// Index into `PACKED_LIMITS`.
    limit: Option<u8>,
    /// Index into `PACKED_CAPACITIES`.
    capacity: Option<u8>,
    shared: bool,
    /// Indices into `PACKED_SIZES` (1 to 6).
    palette: Vec<u8>,
    trim_at_end: bool,
    drop_seed: u8,
}

/// Indices into `PACKED_SIZES`.
const S64: u8 = 2;
const S100: u8 = 3;
const S255: u8 = 4;
const S256: u8 = 5;
const S257: u8 = 6;
const S300: u8 = 27;
const S1000: u8 = 10;
const S2048: u8 = 13;
const S3000: u8 = 14;
const S4096: u8 = 16;
const S4097: u8 = 17;
const S5000: u8 = 18;
const S8192: u8 = 19;
const S10000: u8 = 21;
const S30000: u8 = 23;
const S100000: u8 = 26;

fn cfg(preset: u8) -> Cfg {
    Cfg {
        preset,
        cap: 0,
        device: None,
        ttl: 2,
        class: 0,
        limit: None,
        capacity: None,
        shared: false,
        palette: vec![S100, S1000, S3000],
        trim_at_end: false,
        drop_seed: 0,
    }
}

impl Cfg {
    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![
            self.preset,
            self.cap,
            self.device.map_or(0, |i| 128 + i),
            self.ttl,
            self.class,
            self.limit.map_or(0, |i| 128 + i),
            self.capacity.map_or(0, |i| 128 + i),
            u8::from(self.shared),
            (self.palette.len() - 1) as u8,
        ];
        b.extend(&self.palette);
        b.push(u8::from(self.trim_at_end));
        b.push(self.drop_seed);
        b
    }
    fn palette(mut self, p: &[u8]) -> Self {
        self.palette = p.to_vec();
        self
    }
    fn shared(mut self) -> Self {
        self.shared = true;
        self
    }
    fn cap(mut self, i: u8) -> Self {
        self.cap = i;
        self
    }
    fn device(mut self, i: u8) -> Self {
        self.device = Some(i);
        self
    }
    fn ttl(mut self, i: u8) -> Self {
        self.ttl = i;
        self
    }
    fn class(mut self, c: u8) -> Self {
        self.class = c;
        self
    }
    fn limit(mut self, i: u8) -> Self {
        self.limit = Some(i);
        self
    }
    fn capacity(mut self, i: u8) -> Self {
        self.capacity = Some(i);
        self
    }
    fn trim(mut self) -> Self {
        self.trim_at_end = true;
        self
    }
    fn drop_seed(mut self, s: u8) -> Self {
        self.drop_seed = s;
        self
    }
}

mod op {
    pub(super) fn alloc(i: u8) -> Vec<u8> {
        vec![0, i]
    }
    pub(super) fn zero() -> Vec<u8> {
        vec![10, 0]
    }
    pub(super) fn huge(k: u8) -> Vec<u8> {
        vec![10, k + 1]
    }
    pub(super) fn release(i: u8) -> Vec<u8> {
        vec![11, i]
    }
    pub(super) fn release_alloc(i: u8) -> Vec<u8> {
        vec![18, i]
    }
    /// `1 + n % 8` blocks of palette entry `i`.
    pub(super) fn burst(i: u8, n: u8) -> Vec<u8> {
        vec![21, i, n]
    }
    pub(super) fn advance(ticks: u8) -> Vec<u8> {
        vec![24, ticks]
    }
    pub(super) fn fail(n: u8) -> Vec<u8> {
        vec![27, n]
    }
    pub(super) fn collect() -> Vec<u8> {
        vec![28]
    }
    pub(super) fn trim() -> Vec<u8> {
        vec![30]
    }
    pub(super) fn alternate(offset: u8) -> Vec<u8> {
        vec![31, offset]
    }
}

fn seed(cfg: &Cfg, ops: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut b = cfg.bytes();
    for op in ops {
        b.extend(op);
    }
    b
}

/// Fill segments with bursts, punch holes, fill the holes again.
fn holes() -> Vec<Vec<u8>> {
    let mut ops = vec![
        op::burst(0, 7),
        op::burst(1, 7),
        op::burst(0, 7),
        op::alternate(0),
        op::burst(2, 5),
        op::burst(0, 3),
        op::alternate(1),
        op::release_alloc(3),
        op::release_alloc(0),
    ];
    for i in 0..6 {
        ops.push(op::release(i * 5));
        ops.push(op::alloc(i));
    }
    ops
}

/// Allocate a working set, release it all, let it decay, and again.
fn decay() -> Vec<Vec<u8>> {
    let mut ops = Vec::new();
    for round in 0..3u8 {
        ops.push(op::burst(round, 7));
        ops.push(op::burst(round + 1, 3));
        for _ in 0..12 {
            ops.push(op::release(0));
        }
        ops.push(op::advance(if round == 1 { 70 } else { 2 }));
        ops.push(op::collect());
    }
    ops
}

/// Pressure against a limit or a capacity: bursts until refused, releases,
/// injected failures, a trim.
fn pressure() -> Vec<Vec<u8>> {
    vec![
        op::burst(0, 7),
        op::burst(1, 7),
        op::burst(2, 7),
        op::burst(1, 7),
        op::alternate(0),
        op::burst(2, 7),
        op::fail(1),
        op::alloc(0),
        op::fail(3),
        op::burst(1, 3),
        op::release(0),
        op::release(0),
        op::advance(20),
        op::burst(0, 7),
        op::trim(),
        op::burst(2, 4),
        op::fail(2),
        op::release_alloc(1),
        op::collect(),
    ]
}

/// Large requests of varying sizes: blocks released, then requests a
/// little smaller (a larger block is reused), much smaller (a miss), and
/// the same again under pressure.
fn varying() -> Vec<Vec<u8>> {
    vec![
        op::burst(3, 3),
        op::release(0),
        op::release(0),
        op::release(0),
        op::release(0),
        op::burst(2, 1),
        op::burst(0, 1),
        op::release(1),
        op::alloc(1),
        op::alloc(2),
        op::release(0),
        op::advance(3),
        op::burst(3, 2),
        op::release_alloc(2),
        op::fail(1),
        op::alloc(2),
        op::release(2),
        op::alloc(0),
        op::collect(),
    ]
}

fn errors() -> Vec<Vec<u8>> {
    vec![
        op::zero(),
        op::huge(0),
        op::huge(1),
        op::huge(2),
        op::alloc(0),
        op::zero(),
        op::release(0),
    ]
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, cfg: Cfg, ops: Vec<Vec<u8>>| {
        out.push((format!("seed-{name}"), seed(&cfg, ops)));
    };
    let small = [S64, S100, S255, S256, S257];
    let medium = [S300, S1000, S3000, S2048, S4096];
    let large = [S4097, S5000, S10000, S100000];
    let mixed = [S100, S1000, S3000, S5000, S256, S30000];

    add("small-holes", cfg(0).palette(&small), holes());
    add("medium-holes-best-fit", cfg(1).palette(&medium), holes());
    add("large-exact", cfg(0).palette(&large), holes());
    add("mixed-holes", cfg(0).palette(&mixed).drop_seed(3), holes());
    add(
        "thresholds-boundaries",
        cfg(0).palette(&[S255, S256, S257, S4096, S4097]),
        holes(),
    );
    add(
        "growing-segments",
        cfg(6).palette(&[S1000, S2048, S3000]),
        holes(),
    );
    add(
        "odd-granularity",
        cfg(7).palette(&[S100, S300, S1000, S3000, S5000]),
        holes(),
    );
    add("no-small-class", cfg(3).palette(&mixed), holes());
    add("small-equals-medium", cfg(4).palette(&mixed), holes());
    add("packing-off", cfg(5).palette(&mixed), holes());
    add("pow2-classes", cfg(0).class(1).palette(&mixed), holes());
    add("multiple-classes", cfg(2).class(2).palette(&mixed), holes());
    add("decay-ttl-0", cfg(0).ttl(0).palette(&mixed), decay());
    add("decay-ttl-64", cfg(1).ttl(4).palette(&mixed), decay());
    add(
        "decay-trim-at-end",
        cfg(6).ttl(5).palette(&mixed).trim(),
        decay(),
    );
    add(
        "limit-fallback",
        cfg(1).cap(2).limit(2).palette(&[S1000, S3000, S5000]),
        pressure(),
    );
    add(
        "limit-tight",
        cfg(0).limit(1).palette(&[S100, S1000, S3000]),
        pressure(),
    );
    add(
        "limit-cap-32",
        cfg(6).cap(3).limit(4).palette(&[S100, S1000, S8192]),
        pressure(),
    );
    add(
        "capacity-oom-ladder",
        cfg(1).capacity(1).palette(&[S1000, S3000, S5000]),
        pressure(),
    );
    add(
        "capacity-and-limit",
        cfg(0).capacity(2).limit(6).palette(&mixed),
        pressure(),
    );
    add(
        "device-capacity-cap",
        cfg(1).device(0).cap(2).palette(&[S1000, S3000, S8192]),
        pressure(),
    );
    add("injected-failures", cfg(0).palette(&mixed), pressure());
    add("errors", cfg(0).palette(&mixed), errors());
    // Preset byte + 8 * index into `LARGE_FITS` (2, 0, 1, 8).
    let varying_sizes = [S4097, S5000, S8192, S10000];
    add("large-fit", cfg(0).palette(&varying_sizes), varying());
    add("large-fit-off", cfg(8).palette(&varying_sizes), varying());
    add(
        "large-fit-1-capacity",
        cfg(16).capacity(1).palette(&varying_sizes),
        varying(),
    );
    add(
        "large-fit-1-device",
        cfg(16).device(1).palette(&varying_sizes),
        varying(),
    );
    add(
        "shared-large-fit",
        cfg(24).shared().palette(&varying_sizes),
        varying(),
    );
    add("shared-holes", cfg(0).shared().palette(&mixed), holes());
    add(
        "shared-decay",
        cfg(1).shared().ttl(0).palette(&mixed),
        decay(),
    );
    add(
        "shared-limit",
        cfg(1).shared().limit(2).palette(&[S1000, S3000, S5000]),
        pressure(),
    );
    add(
        "shared-capacity",
        cfg(0).shared().capacity(1).palette(&mixed).trim(),
        pressure(),
    );
    add("shared-errors", cfg(0).shared().palette(&mixed), errors());
    for i in 0..6u64 {
        out.push((format!("seed-noise-{i}"), noise(0x9E37_79B9 + i, 600)));
    }
    out
}

#[test]
#[cfg_attr(miri, ignore)] // reads files
fn packed_ops_corpus_replays() {
    let summaries = replay_corpus("packed_ops", fuzzing_packed::packed_ops);
    assert!(!summaries.is_empty(), "the packed_ops corpus is empty");
    // The committed corpus holds every seed, byte for byte.
    assert_corpus_holds("packed_ops", &seeds(), "tests/it/packing_corpus.rs");
    // And reaches every path of the layer.
    let reach = |what: &str, f: &dyn Fn(&PackedSummary) -> bool| {
        assert!(summaries.iter().any(f), "no corpus input reaches {what}");
    };
    reach("a carved block", &|s| s.carved > 0);
    reach("an exact block", &|s| s.exact > 0);
    reach("an exact fallback", &|s| s.exact_fallbacks > 0);
    reach("a failed request", &|s| s.failures > 0);
    reach("a segment served from the cache", &|s| s.pool_hits > 0);
    reach("a large request served by a larger block", &|s| {
        s.larger_reuses > 0
    });
    reach("an eviction", &|s| s.evictions > 0);
    reach("three segments at once", &|s| s.peak_segments >= 3);
    reach("eight blocks in one segment", &|s| {
        s.peak_blocks_per_segment >= 8
    });
    reach("a shared pool", &|s| s.shared && s.carved > 0);
}

/// The seeds pass the harness (without the files).
#[test]
#[cfg_attr(miri, ignore)] // hundreds of steps per seed
fn packed_seeds_pass_the_harness() {
    for (name, bytes) in seeds() {
        let r = std::panic::catch_unwind(|| fuzzing_packed::packed_ops(&bytes));
        if let Err(panic) = r {
            eprintln!("seed {name} failed");
            std::panic::resume_unwind(panic);
        }
    }
}

/// Writes the seeds into `fuzz/corpus/packed_ops/` (when
/// `DECAYING_POOL_WRITE_CORPUS` is set).
#[test]
#[ignore = "writes the seed corpus; run by hand"]
fn write_packed_corpus() {
    write_corpus([("packed_ops", seeds())]);
}
