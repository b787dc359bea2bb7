//! Tests: the page layer's `Mapped` allocator (`pages::Mapped`).
//!
//! - against a model of the backend, on random operation sequences: the
//!   checks live in `decaying_pool::fuzzing::mapped` (feature `fuzzing`),
//!   shared with the `mapped` fuzz target and its corpus replay (here too:
//!   every file under `fuzz/corpus/mapped/`, which must hold the seeds of
//!   [`seeds`] byte for byte; to rewrite them after changing a seed:
//!   `DECAYING_POOL_WRITE_CORPUS=1 cargo test --test it mapped::write_mapped_corpus -- --ignored`);
//! - the host backend (Linux): bytes written into blocks survive other
//!   blocks coming and going and pages moving; a pool over it reuses its
//!   pages;
//! - the A/B/A fragmentation trace (`cli/traces/aba_frag.csv`) through the
//!   replay's `mapped` row on an 8 GiB device;
//! - errors, decay, and a backend that panics.

use core::time::Duration;
use std::panic::{AssertUnwindSafe, catch_unwind};

use decaying_pool::fuzzing::mapped::{
    self as harness, MAPPED_ALIGNS, MAPPED_CAPACITIES, MAPPED_HUGE, MAPPED_PAGES,
    MAPPED_RESERVATIONS, MAPPED_TTLS, MAX_MAPPED_OPS, MappedConfig, MappedInput, MappedOp,
    MappedSummary, PageCall, SharedModel, SharedModelError, palette_size, run_mapped,
};
use decaying_pool::pages::{Mapped, MappedError, ModelPages, PageError};
use decaying_pool::{DecayingPool, FixedCapacity, ManualClock, Packing, RawAllocator};
use proptest::prelude::*;
use proptest::sample::select;

use crate::support::{assert_corpus_holds, noise, replay_corpus, write_corpus};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// A `Mapped` on `pages` behind a [`SharedModel`] and a manual clock,
/// reserving 256 pages at a time (the default reservation, 64 GiB, costs
/// 40 to 48 bytes of bookkeeping a slot: 16 Mi slots on pages of 4 KiB,
/// which `validate` walks; see `the_default_reservation_costs_little_memory`).
fn manual(pages: ModelPages) -> (Mapped<SharedModel, ManualClock>, SharedModel, ManualClock) {
    let g = decaying_pool::PageBackend::granularity(&pages);
    let backend = SharedModel::new(pages);
    let clock = ManualClock::new();
    (
        Mapped::with_clock(backend.clone(), clock.clone()).with_reservation(256 * g),
        backend,
        clock,
    )
}

fn live_pages(b: &SharedModel) -> u64 {
    b.with_pages(|p| p.counts().live_pages())
}

// --- the model, on random sequences -----------------------------------------

fn config() -> impl Strategy<Value = MappedConfig> {
    let capacity = |page: usize| {
        prop::option::weighted(
            0.4,
            select(MAPPED_CAPACITIES.to_vec()).prop_map(move |n| n * page),
        )
    };
    select(MAPPED_PAGES.to_vec())
        .prop_flat_map(move |page| {
            (
                Just(page),
                select(MAPPED_ALIGNS.to_vec()),
                select(MAPPED_RESERVATIONS.to_vec()).prop_map(move |n| n * page),
                select(MAPPED_TTLS.to_vec()),
                capacity(page),
                capacity(page),
                prop::collection::vec(any::<u8>().prop_map(move |b| palette_size(b, page)), 1..=6),
                any::<bool>(),
                prop::bool::weighted(0.1),
                any::<u8>(),
            )
        })
        .prop_map(
            |(page, align, reservation, ttl, capacity, device, palette, release, leak, seed)| {
                MappedConfig {
                    page,
                    align,
                    reservation,
                    ttl,
                    capacity,
                    device,
                    palette,
                    release_at_end: release,
                    leak_at_end: leak,
                    drop_seed: seed,
                }
            },
        )
}

fn op() -> impl Strategy<Value = MappedOp> {
    prop_oneof![
        30 => any::<u8>().prop_map(MappedOp::Allocate),
        2 => (0..MAPPED_HUGE.len() as u8).prop_map(MappedOp::AllocateHuge),
        22 => any::<u8>().prop_map(MappedOp::Deallocate),
        6 => any::<u8>().prop_map(MappedOp::Reallocate),
        5 => (any::<u8>(), any::<u8>()).prop_map(|(size, n)| MappedOp::Burst { size, n }),
        8 => (0u8..80).prop_map(MappedOp::Advance),
        5 => Just(MappedOp::Collect),
        2 => Just(MappedOp::ReleaseSpare),
        2 => (0u8..4, 0u8..3).prop_map(|(call, n)| MappedOp::Fail { call, n }),
        3 => any::<u8>().prop_map(MappedOp::DeallocateAlternate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 1 } else { 48 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// `Mapped<ModelPages, ManualClock>` keeps every invariant of the
    /// harness on random workloads, with and without capacities: the
    /// bookkeeping of both sides valid (every 32 steps and at the end; what
    /// a step touched after every step), blocks disjoint,
    /// aligned, inside a reservation and backed by pages of their own,
    /// every byte accounted, moves only under a capacity, decay on time,
    /// and nothing left in the backend after the drop.
    #[test]
    fn mapped_matches_the_model(
        cfg in config(),
        ops in prop::collection::vec(op(), if cfg!(miri) { 6..12 } else { 30..120 }),
    ) {
        let n = ops.len().min(MAX_MAPPED_OPS);
        let summary = run_mapped(&MappedInput { config: cfg, ops });
        prop_assert_eq!(summary.ops, n);
    }

    /// The same, always under a capacity told to the allocator and a device
    /// a little larger, with small pages: spare pages move rather than new
    /// ones made, and requests fail for the device only.
    #[test]
    fn mapped_under_capacity_matches_the_model(
        cfg in config(),
        cap in 1usize..12,
        extra in 0usize..3,
        ops in prop::collection::vec(op(), if cfg!(miri) { 6..12 } else { 30..120 }),
    ) {
        let cfg = MappedConfig {
            capacity: Some(cap * cfg.page),
            device: Some((cap + extra) * cfg.page),
            ..cfg
        };
        run_mapped(&MappedInput { config: cfg, ops });
    }
}

/// A hand-made run: blocks of a page and a half side by side share their
/// boundary pages; freed, their pages serve a larger block with no page
/// created; under a capacity of 4 pages a block elsewhere takes them by a
/// move.
#[test]
fn pages_are_shared_reused_and_moved() {
    let cfg = MappedConfig {
        page: 4096,
        align: 512,
        reservation: 16 * 4096,
        ttl: None,
        capacity: Some(4 * 4096),
        device: None,
        palette: vec![6144, 16_384, 4096],
        release_at_end: true,
        leak_at_end: false,
        drop_seed: 0,
    };
    let ops = vec![
        MappedOp::Allocate(0),
        MappedOp::Allocate(0),
        MappedOp::Deallocate(0),
        MappedOp::Deallocate(0),
        MappedOp::Allocate(1),
        MappedOp::Deallocate(0),
        MappedOp::Burst { size: 2, n: 3 },
        MappedOp::DeallocateAlternate(0),
        MappedOp::Allocate(1),
    ];
    let s = run_mapped(&MappedInput { config: cfg, ops });
    assert!(s.peak_shared_slots >= 1, "{s:?}");
    assert!(s.reused >= 1 && s.moves >= 1 && s.remapped >= 1, "{s:?}");
}

// --- the fuzz corpus --------------------------------------------------------

/// A configuration, byte by byte (see `MappedConfig`).
#[derive(Clone)]
struct Cfg {
    /// Index into `MAPPED_PAGES`: 4096, 512, 64 KiB, 2 MiB, 1024.
    page: u8,
    /// Index into `MAPPED_ALIGNS`: 512, 1, 64, 4096, 1 MiB.
    align: u8,
    /// Index into `MAPPED_RESERVATIONS`: 1, 4, 16, 64, 3, 256 pages.
    reservation: u8,
    /// Index into `MAPPED_TTLS`: never, 0, 1, 4, 16, 64 ticks.
    ttl: u8,
    /// Index into `MAPPED_CAPACITIES` (pages: 0, 1, 2, 3, 4, 8, 16, 64).
    capacity: Option<u8>,
    /// The same, for the modelled device.
    device: Option<u8>,
    /// Palette entries (see `palette_size`).
    palette: Vec<u8>,
    release_at_end: bool,
    leak_at_end: bool,
    drop_seed: u8,
}

fn cfg(page: u8, ttl: u8) -> Cfg {
    Cfg {
        page,
        align: 0,
        reservation: 2,
        ttl,
        capacity: None,
        device: None,
        palette: vec![E_HALF, E_PAGE, E_PAGE_AND_EIGHTH],
        release_at_end: false,
        leak_at_end: false,
        drop_seed: 0,
    }
}

impl Cfg {
    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![
            self.page,
            self.align,
            self.reservation,
            self.ttl,
            self.capacity.map_or(0, |i| 128 + i),
            self.device.map_or(0, |i| 128 + i),
            (self.palette.len() - 1) as u8,
        ];
        b.extend(&self.palette);
        b.push(u8::from(self.release_at_end) | u8::from(self.leak_at_end) << 1);
        b.push(self.drop_seed);
        b
    }
    fn palette(mut self, p: &[u8]) -> Self {
        self.palette = p.to_vec();
        self
    }
    fn capacity(mut self, i: u8) -> Self {
        self.capacity = Some(i);
        self
    }
    fn device(mut self, i: u8) -> Self {
        self.device = Some(i);
        self
    }
    fn reservation(mut self, i: u8) -> Self {
        self.reservation = i;
        self
    }
    fn align(mut self, i: u8) -> Self {
        self.align = i;
        self
    }
    fn release_at_end(mut self) -> Self {
        self.release_at_end = true;
        self
    }
    fn leak_at_end(mut self) -> Self {
        self.leak_at_end = true;
        self
    }
}

/// Palette entries: `MAPPED_EIGHTHS[i]` eighths of a page; `+ 24` one
/// byte more, `+ 48` one byte less.
const E_BYTE: u8 = 0;
const E_HALF: u8 = 3;
const E_PAGE: u8 = 5;
const E_PAGE_AND_EIGHTH: u8 = 8;
const E_TWO_PAGES: u8 = 11;
const E_THREE_PAGES: u8 = 13;
const E_EIGHT_PAGES: u8 = 18;
const E_64_PAGES: u8 = 23;
const MORE: u8 = 24;
const LESS: u8 = 48;

/// Indices into `MAPPED_TTLS`.
const TTL_NEVER: u8 = 0;
const TTL_0: u8 = 1;
const TTL_4: u8 = 3;
const TTL_16: u8 = 4;

mod op {
    pub(super) fn alloc(i: u8) -> Vec<u8> {
        vec![0, i]
    }
    pub(super) fn huge(i: u8) -> Vec<u8> {
        vec![4, i]
    }
    pub(super) fn dealloc(i: u8) -> Vec<u8> {
        vec![5, i]
    }
    pub(super) fn realloc(i: u8) -> Vec<u8> {
        vec![8, i]
    }
    /// `1 + n % 8` blocks of palette entry `i`.
    pub(super) fn burst(i: u8, n: u8) -> Vec<u8> {
        vec![9, i, n]
    }
    pub(super) fn advance(ticks: u8) -> Vec<u8> {
        vec![10, ticks]
    }
    pub(super) fn collect() -> Vec<u8> {
        vec![12]
    }
    pub(super) fn release() -> Vec<u8> {
        vec![13]
    }
    /// Fails the next `n` calls of `call` (0 reserve, 1 create, 2 map,
    /// 3 unmap).
    pub(super) fn fail(call: u8, n: u8) -> Vec<u8> {
        vec![14, call + 4 * n]
    }
    pub(super) fn alternate(offset: u8) -> Vec<u8> {
        vec![15, offset]
    }
}

fn seed(cfg: &Cfg, ops: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut b = cfg.bytes();
    b.extend(ops.into_iter().flatten());
    b
}

/// Blocks one size larger each round, the last given back each time: the
/// pages of the ones before serve it (the largest's pages only are made).
fn growing() -> Vec<Vec<u8>> {
    let mut ops = Vec::new();
    for i in 0..6 {
        ops.push(op::alloc(i));
        ops.push(op::dealloc(0));
    }
    ops.extend([
        op::burst(0, 7),
        op::alternate(0),
        op::alloc(5),
        op::realloc(1),
    ]);
    ops
}

/// Holes between blocks, then blocks larger than any hole: under a
/// capacity the holes' pages move.
fn holes() -> Vec<Vec<u8>> {
    vec![
        op::burst(0, 7),
        op::alternate(1),
        op::alloc(1),
        op::alloc(2),
        op::alternate(0),
        op::alloc(2),
        op::burst(1, 2),
        op::realloc(3),
        op::alloc(2),
    ]
}

/// Blocks given back at different times; the clock passes their
/// time-to-live in steps, collects and deallocations sweep.
fn decay() -> Vec<Vec<u8>> {
    let mut ops = vec![op::burst(0, 5), op::burst(1, 1)];
    for t in [1u8, 2, 3, 5] {
        ops.push(op::dealloc(0));
        ops.push(op::advance(t));
        ops.push(op::collect());
        ops.push(op::dealloc(1));
    }
    ops.extend([
        op::advance(4),
        op::alloc(2),
        op::dealloc(0),
        op::advance(16),
        op::dealloc(0),
        op::collect(),
        op::alloc(1),
        op::advance(70),
        op::collect(),
    ]);
    ops
}

/// A device of 4 pages: requests fail while others hold it, succeed once
/// they are given back; and one of more pages than the device holds.
fn oom() -> Vec<Vec<u8>> {
    vec![
        op::alloc(0),
        op::alloc(1),
        op::alloc(1),
        op::dealloc(0),
        op::alloc(1),
        op::alloc(2),
        op::dealloc(0),
        op::dealloc(0),
        op::alloc(2),
        op::alloc(3),
        op::release(),
        op::alloc(0),
    ]
}

/// Zero and huge requests, injected failures of every backend call, and
/// a drop with blocks held.
fn errors_and_failures() -> Vec<Vec<u8>> {
    let mut ops: Vec<Vec<u8>> = (0..MAPPED_HUGE.len() as u8).map(op::huge).collect();
    ops.extend([
        op::fail(0, 1),
        op::alloc(2),
        op::alloc(0),
        op::fail(1, 2),
        op::alloc(1),
        op::alloc(1),
        op::fail(2, 1),
        op::alloc(2),
        op::alloc(0),
        op::dealloc(0),
        op::dealloc(0),
        op::fail(3, 3),
        op::release(),
        op::alloc(2),
        op::release(),
        op::alloc(0),
        op::alloc(1),
        op::dealloc(0),
    ]);
    ops
}

/// The named seeds of `fuzz/corpus/mapped/`.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let named = [
        (
            "grow-and-reuse",
            cfg(0, TTL_NEVER)
                .palette(&[
                    E_HALF,
                    E_PAGE + MORE,
                    E_TWO_PAGES,
                    E_THREE_PAGES + LESS,
                    E_EIGHT_PAGES,
                    E_64_PAGES,
                ])
                .reservation(3),
            growing(),
        ),
        (
            "capacity-moves",
            cfg(0, TTL_16)
                .palette(&[E_PAGE, E_TWO_PAGES + MORE, E_EIGHT_PAGES])
                .capacity(5)
                .reservation(2)
                .release_at_end(),
            holes(),
        ),
        (
            "decay-and-sweeps",
            cfg(1, TTL_4)
                .palette(&[E_PAGE_AND_EIGHTH, E_THREE_PAGES, E_BYTE])
                .align(2),
            decay(),
        ),
        (
            "device-oom",
            cfg(4, TTL_0)
                .palette(&[E_PAGE, E_PAGE_AND_EIGHTH, E_THREE_PAGES, E_EIGHT_PAGES])
                .device(4)
                .capacity(3)
                .align(4),
            oom(),
        ),
        (
            "errors-failures-leak",
            cfg(3, TTL_16)
                .palette(&[E_HALF, E_TWO_PAGES, E_PAGE + LESS])
                .device(6)
                .leak_at_end(),
            errors_and_failures(),
        ),
    ];
    named
        .into_iter()
        .map(|(name, c, ops)| (format!("seed-{name}"), seed(&c, ops)))
        .collect()
}

/// What the seeds together must reach.
fn assert_reaches_everything(summaries: &[MappedSummary]) {
    let reach = |what: &str, f: &dyn Fn(&MappedSummary) -> bool| {
        assert!(summaries.iter().any(f), "no input reaches {what}");
    };
    reach("a block served with no page created", &|s| s.reused > 0);
    reach("a slot shared by two blocks", &|s| s.peak_shared_slots > 0);
    reach("spare pages moved under a capacity", &|s| s.moves > 0);
    reach("idle or moved pages mapped again", &|s| s.remapped > 0);
    reach("pages decayed by collect_spare", &|s| s.decayed > 0);
    reach("a sweep inside deallocate", &|s| s.inline_sweeps > 0);
    reach("a request failed for the device", &|s| s.out_of_memory > 0);
    reach("an injected failure", &|s| s.injected > 0);
    reach("a refused request", &|s| s.refused >= 6);
    reach("two reservations", &|s| s.reserves >= 2);
    reach("a drop with blocks held", &|s| s.leaked_at_drop);
}

/// Seeds Miri runs (it is too slow for all of them).
const MIRI_SEEDS: [&str; 2] = ["seed-capacity-moves", "seed-errors-failures-leak"];

/// The hand-written seeds, without the file system (so Miri runs a few
/// of them, over the allocator's unsafe code).
#[test]
fn mapped_seeds_pass_the_harness() {
    let chosen = |name: &String| !cfg!(miri) || MIRI_SEEDS.contains(&name.as_str());
    let summaries: Vec<MappedSummary> = seeds()
        .iter()
        .filter(|(name, _)| chosen(name))
        .map(|(name, bytes)| {
            harness::mapped_ops(bytes).unwrap_or_else(|| panic!("{name} does not parse"))
        })
        .collect();
    if !cfg!(miri) {
        assert_reaches_everything(&summaries);
    }
    // And noise: any bytes are an input.
    let noisy = if cfg!(miri) { 0 } else { 8 };
    for i in 0..noisy {
        harness::mapped_ops(&noise(0x6A09_E667 + i, 400)).expect("noise parses");
    }
}

/// The committed corpus holds every seed, byte for byte, and replays
/// through the harness.
#[test]
#[cfg_attr(miri, ignore)] // reads files
fn mapped_corpus_replays() {
    let seeds = seeds();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    if !dir.is_dir() {
        eprintln!(
            "no fuzz/ directory (a packaged crate): the seeds run in mapped_seeds_pass_the_harness"
        );
        return;
    }
    assert_corpus_holds("mapped", &seeds, "tests/it/mapped.rs");
    let summaries = replay_corpus("mapped", harness::mapped_ops);
    assert!(summaries.len() >= seeds.len());
    assert_reaches_everything(&summaries);
}

/// Writes the seeds into `fuzz/corpus/mapped/` (when
/// `DECAYING_POOL_WRITE_CORPUS` is set).
#[test]
#[ignore = "writes the seed corpus; run by hand"]
fn write_mapped_corpus() {
    write_corpus([("mapped", seeds())]);
}

// --- errors -------------------------------------------------------------------

#[test]
fn zero_and_too_large_requests_are_refused_without_a_call() {
    let (mut m, backend, _) = manual(ModelPages::new(2 * MIB).unwrap());
    assert_eq!(m.allocate(0), Err(MappedError::ZeroSize));
    for size in [usize::MAX, usize::MAX - 511, 1 << 63] {
        assert_eq!(
            m.allocate(size),
            Err(MappedError::TooLarge { requested: size })
        );
    }
    assert_eq!(backend.calls(), 0);
    // Below `isize::MAX` once aligned, but its slot table cannot be
    // allocated: refused before the reservation. (Miri reports the attempt
    // to allocate it as resource exhaustion, not as a failed allocation.)
    if !cfg!(miri) {
        let size = isize::MAX as usize - 4095;
        assert_eq!(
            m.allocate(size),
            Err(MappedError::TooLarge { requested: size })
        );
        assert_eq!(backend.calls(), 0);
    }
    let s = m.stats();
    assert_eq!((s.blocks, s.reserves, s.page_bytes), (0, 0, 0));
    // Still usable.
    let a = m.allocate(1).unwrap();
    assert_eq!(a % m.align(), 0);
    m.validate().unwrap();
    // SAFETY: `a` came from `allocate(1)`, given back once.
    unsafe { m.deallocate(a, 1) };
    drop(m);
    backend.with_pages(ModelPages::validate_released).unwrap();
}

/// Out of memory on a device of 4 pages: the error is the backend's, the
/// page made on the way is kept as spare (counted, not lost), and once a
/// block goes back the request succeeds on its pages.
#[test]
fn out_of_memory_leaks_nothing_and_recovers() {
    let g = 4096;
    let (mut m, backend, _) = manual(ModelPages::new(g).unwrap().with_capacity(4 * g));
    let a = m.allocate(3 * g).unwrap();
    let err = m.allocate(2 * g).unwrap_err();
    assert_eq!(
        err,
        MappedError::Backend(SharedModelError::Model(PageError::OutOfMemory {
            capacity: 4 * g
        }))
    );
    m.validate().unwrap();
    backend.with_pages(ModelPages::validate).unwrap();
    let s = m.stats();
    assert_eq!((s.blocks, s.block_bytes), (1, 3 * g));
    assert_eq!(s.page_bytes, 4 * g, "{s:?}");
    assert_eq!(
        s.spare_bytes, g,
        "the page made before the refusal is spare"
    );
    assert_eq!(backend.with_pages(ModelPages::live_bytes), s.page_bytes);
    // SAFETY: `a` came from `allocate(3 * g)`, given back once.
    unsafe { m.deallocate(a, 3 * g) };
    let b = m.allocate(2 * g).unwrap();
    let c = m.allocate(2 * g).unwrap();
    assert_eq!(m.stats().pages_created, 4, "no page made past the device");
    m.validate().unwrap();
    // SAFETY: `b` and `c` came from `allocate(2 * g)`, each given back once.
    unsafe {
        m.deallocate(b, 2 * g);
        m.deallocate(c, 2 * g);
    }
    assert_eq!(m.release_spare(), 4 * g);
    let s = m.stats();
    assert_eq!(s.pages_created, s.pages_released);
    drop(m);
    backend.with_pages(ModelPages::validate_released).unwrap();
}

/// Under a capacity told to the allocator, spare pages move rather than
/// new ones made past it; free mapped space is reused where it is, with
/// no call; without the capacity, new pages are made instead of a move.
#[test]
fn under_a_capacity_spare_pages_move() {
    let g = 4096;
    for capacity in [Some(4 * g), None] {
        let (m, backend, _) = manual(ModelPages::new(g).unwrap());
        let m = m.with_reservation(64 * g);
        let mut m = match capacity {
            Some(c) => m.with_capacity(c),
            None => m,
        };
        let a = m.allocate(2 * g).unwrap();
        let b = m.allocate(2 * g).unwrap();
        // SAFETY: `a` came from `allocate(2 * g)`, given back once.
        unsafe { m.deallocate(a, 2 * g) };
        let before = m.stats();
        let c = m.allocate(2 * g).unwrap();
        assert_eq!(c, a, "the free mapped space is reused where it is");
        let s = m.stats();
        assert_eq!(
            (s.pages_created, s.maps, s.unmaps),
            (before.pages_created, before.maps, before.unmaps),
            "no call at all"
        );
        // SAFETY: `c` came from `allocate(2 * g)`, given back once.
        unsafe { m.deallocate(c, 2 * g) };
        // Three pages do not fit `a`'s hole: under the capacity `a`'s two
        // pages move under the block and one is made; without it, three
        // are made and `a`'s stay where they are.
        let d = m.allocate(3 * g).unwrap();
        assert!(d >= b + 2 * g);
        let s = m.stats();
        if capacity.is_some() {
            assert_eq!(
                (s.unmaps, s.pages_created, s.spare_bytes),
                (1, 5, 0),
                "{s:?}"
            );
        } else {
            assert_eq!(
                (s.unmaps, s.pages_created, s.spare_bytes),
                (0, 7, 2 * g),
                "{s:?}"
            );
        }
        m.validate().unwrap();
        // SAFETY: each block given back once.
        unsafe {
            m.deallocate(b, 2 * g);
            m.deallocate(d, 3 * g);
        }
        drop(m);
        backend.with_pages(ModelPages::validate_released).unwrap();
    }
}

// --- decay ---------------------------------------------------------------------

/// Spare pages go back one time-to-live after their block, not a
/// nanosecond before; a deallocation sweeps the ones due, not its own.
#[test]
fn spare_pages_decay_after_one_ttl_not_before() {
    let g = 2 * MIB;
    let ttl = Duration::from_millis(100);
    let (m, backend, clock) = manual(ModelPages::new(g).unwrap());
    // Not at time zero: see `a_page_spare_since_time_zero_waits_one_ttl`.
    clock.advance(Duration::from_secs(1));
    let mut m = m.with_spare_ttl(Some(ttl));
    assert_eq!(m.spare_ttl(), Some(ttl));
    let a = m.allocate(8 * MIB).unwrap();
    let b = m.allocate(4 * MIB).unwrap();
    // SAFETY: `a` came from `allocate(8 MiB)`, given back once.
    unsafe { m.deallocate(a, 8 * MIB) };
    assert_eq!(m.spare(), Some(8 * MIB));
    clock.advance(ttl - Duration::from_nanos(1));
    assert_eq!(m.collect_spare(), 0, "not before one time-to-live");
    assert_eq!(m.spare(), Some(8 * MIB));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(m.collect_spare(), 8 * MIB);
    assert_eq!(m.stats().page_bytes, 4 * MIB);
    assert_eq!(live_pages(&backend), 2);
    // The sweep in `deallocate`: `b`'s pages are spare from now on; `c`'s,
    // given back a time-to-live later, find `b`'s due and release them.
    let c = m.allocate(2 * MIB).unwrap();
    // SAFETY: `b` came from `allocate(4 MiB)`, given back once.
    unsafe { m.deallocate(b, 4 * MIB) };
    assert_eq!(m.stats().page_bytes, 6 * MIB, "nothing due yet");
    clock.advance(ttl);
    // SAFETY: `c` came from `allocate(2 MiB)`, given back once.
    unsafe { m.deallocate(c, 2 * MIB) };
    let s = m.stats();
    assert_eq!((s.page_bytes, s.spare_bytes), (2 * MIB, 2 * MIB), "{s:?}");
    m.validate().unwrap();
    clock.advance(ttl);
    assert_eq!(m.collect_spare(), 2 * MIB);
    drop(m);
    backend.with_pages(ModelPages::validate_released).unwrap();
}

/// At time zero of the clock: a block given back at time 0 keeps its
/// pages through a `collect_spare` at `ttl - 1 ns` (before one
/// time-to-live has passed on the clock nothing is due, though pages made
/// and never used carry the time 0), and gives them back at `ttl`. A
/// `ManualClock` starts at zero, as does a replay's.
#[test]
fn a_page_spare_since_time_zero_waits_one_ttl() {
    let ttl = Duration::from_millis(100);
    let (m, _backend, clock) = manual(ModelPages::new(4096).unwrap());
    let mut m = m.with_spare_ttl(Some(ttl));
    let a = m.allocate(4096).unwrap();
    // SAFETY: `a` came from `allocate(4096)`, given back once.
    unsafe { m.deallocate(a, 4096) };
    clock.advance(ttl - Duration::from_nanos(1));
    assert_eq!(m.collect_spare(), 0, "released before one time-to-live");
}

/// With no time-to-live, spare pages stay until `release_spare`.
#[test]
fn without_a_ttl_spare_pages_stay_until_released() {
    let (m, backend, clock) = manual(ModelPages::new(4096).unwrap());
    let mut m = m.with_spare_ttl(None);
    let a = m.allocate(10_000).unwrap();
    // SAFETY: `a` came from `allocate(10_000)`, given back once.
    unsafe { m.deallocate(a, 10_000) };
    clock.advance(Duration::from_secs(1 << 20));
    assert_eq!(m.collect_spare(), 0);
    assert_eq!(m.spare(), Some(3 * 4096));
    assert_eq!(m.release_spare(), 3 * 4096);
    assert_eq!(live_pages(&backend), 0);
}

/// Under a pool that caches nothing (`FixedCapacity(0)`), whose
/// `collect` calls `collect_spare`: the pages' bytes reach zero one
/// time-to-live after the last block goes back, not before; the same
/// through a `PackedPool` (`Packing::mapped`).
#[test]
fn a_pools_collect_decays_the_pages_within_one_ttl() {
    let ttl = Duration::from_millis(250);
    let clock = ManualClock::new();
    let mapped = || {
        Mapped::with_clock(ModelPages::new(2 * MIB).unwrap(), clock.clone())
            .with_spare_ttl(Some(ttl))
    };
    let mut pool = DecayingPool::builder(mapped())
        .policy(FixedCapacity::new(0))
        .clock(clock.clone())
        .build();
    for step in 1..=16usize {
        let b = pool.allocate(step * MIB).unwrap();
        clock.advance(Duration::from_millis(1));
        // SAFETY: `b` came from `pool.allocate(step MiB)`, released once.
        unsafe { pool.release(b, step * MIB) };
    }
    let s = pool.allocator().stats();
    assert_eq!(
        s.pages_created, 8,
        "the largest block's pages, reused: {s:?}"
    );
    assert_eq!(s.page_bytes, 16 * MIB);
    clock.advance(ttl - Duration::from_nanos(1));
    pool.collect();
    assert_eq!(pool.allocator().stats().page_bytes, 16 * MIB, "not before");
    clock.advance(Duration::from_nanos(1));
    pool.collect();
    assert_eq!(pool.allocator().stats().page_bytes, 0);
    assert_eq!(pool.stats().bytes_reserved, 0);

    let mut packed = DecayingPool::builder(mapped())
        .policy(FixedCapacity::new(0))
        .clock(clock.clone())
        .packing(Packing::mapped())
        .build();
    let mut held = Vec::new();
    for (i, size) in [100usize, 5000, 3 * MIB, 70_000, 9 * MIB + 1]
        .into_iter()
        .enumerate()
    {
        held.push((packed.allocate(size).unwrap(), size));
        if i % 2 == 1 {
            let (b, size) = held.remove(0);
            // SAFETY: `b` came from `packed.allocate(size)`, released once.
            unsafe { packed.release(b, size) };
        }
    }
    for (b, size) in held {
        // SAFETY: as above.
        unsafe { packed.release(b, size) };
    }
    clock.advance(ttl - Duration::from_nanos(1));
    packed.collect();
    clock.advance(Duration::from_nanos(1));
    packed.collect();
    assert_eq!(packed.stats().bytes_reserved, 0);
}

// --- a backend that panics --------------------------------------------------

/// What a run of [`panic_scenario`] left.
#[derive(Debug)]
struct AfterPanic {
    /// The call the injected panic hit, if it fired.
    hit: Option<PageCall>,
    /// It fired in the drop.
    in_drop: bool,
    /// `Mapped::validate` right after the panic was caught.
    mapped_valid: Result<(), String>,
    /// `ModelPages::validate` after the drop.
    backend_valid: Result<(), String>,
    live_pages: u64,
    live_ranges: u64,
}

/// One scenario, with the backend's `nth` call panicking: blocks of one
/// to six pages allocated and given back, spare pages moved under a
/// capacity, swept by deallocations, collected and released, then the
/// allocator dropped with no block held. Every panic is caught where it
/// comes out, and the scenario goes on.
fn panic_scenario(nth: u32) -> AfterPanic {
    let g = 4096;
    let (m, backend, clock) = manual(ModelPages::new(g).unwrap().with_capacity(12 * g));
    clock.advance(Duration::from_secs(1));
    let mut m = m
        .with_capacity(8 * g)
        .with_reservation(16 * g)
        .with_spare_ttl(Some(Duration::from_millis(1)));
    backend.panic_on_call(Some(nth));
    let mut mapped_valid = Ok(());
    let mut caught = |m: &Mapped<SharedModel, ManualClock>, r: std::thread::Result<()>| {
        if r.is_err() {
            mapped_valid = m.validate();
        }
    };
    let mut held: Vec<(usize, usize)> = Vec::new();
    let sizes = [3 * g + 1, 2 * g, 5000, 6 * g, 100, 4 * g, 2 * g];
    for (i, &size) in sizes.iter().enumerate() {
        let r = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(b) = m.allocate(size) {
                held.push((b, size));
            }
        }));
        caught(&m, r);
        if i % 2 == 1 && !held.is_empty() {
            let (b, size) = held.remove(0);
            clock.advance(Duration::from_millis(1));
            // SAFETY: `b` came from `allocate(size)`, given back once.
            let r = catch_unwind(AssertUnwindSafe(|| unsafe { m.deallocate(b, size) }));
            caught(&m, r);
        }
    }
    clock.advance(Duration::from_millis(2));
    let r = catch_unwind(AssertUnwindSafe(|| {
        m.collect_spare();
    }));
    caught(&m, r);
    for (b, size) in held {
        // SAFETY: as above.
        let r = catch_unwind(AssertUnwindSafe(|| unsafe { m.deallocate(b, size) }));
        caught(&m, r);
    }
    let r = catch_unwind(AssertUnwindSafe(|| {
        m.release_spare();
    }));
    caught(&m, r);
    let before_drop = backend.panicked();
    let _ = catch_unwind(AssertUnwindSafe(move || drop(m)));
    let hit = backend.panicked();
    let c = backend.with_pages(|p| p.counts());
    AfterPanic {
        hit,
        in_drop: hit.is_some() && before_drop.is_none(),
        mapped_valid,
        backend_valid: backend.with_pages(ModelPages::validate),
        live_pages: c.live_pages(),
        live_ranges: c.live_ranges(),
    }
}

/// Runs [`panic_scenario`] for every call it makes; returns the outcomes.
fn every_panic() -> Vec<(u32, AfterPanic)> {
    let clean = panic_scenario(u32::MAX);
    assert_eq!(clean.hit, None);
    clean.backend_valid.unwrap();
    assert_eq!(
        (clean.live_pages, clean.live_ranges),
        (0, 0),
        "the scenario without a panic"
    );
    let mut out = Vec::new();
    for nth in 1..=if cfg!(miri) { 6 } else { 400 } {
        let after = crate::support::quiet(|| panic_scenario(nth))
            .unwrap_or_else(|_| panic!("call {nth}: a panic escaped the scenario"));
        if after.hit.is_none() {
            break;
        }
        out.push((nth, after));
    }
    out
}

/// A backend whose `nth` call panics, for every `nth` the scenario
/// reaches: after the panic is caught, the allocator used on and dropped,
/// the backend's own bookkeeping is whole (no page released twice or
/// while mapped, no page mapped in two places), and every reservation is
/// freed unless the panic hit the drop itself (see
/// `a_panicking_backend_loses_no_page` for the pages).
#[test]
fn a_panicking_backend_leaves_the_backend_whole() {
    let outcomes = every_panic();
    assert!(
        outcomes.len() > if cfg!(miri) { 5 } else { 20 },
        "the scenario makes few calls"
    );
    let mut kinds = std::collections::HashSet::new();
    for (nth, after) in &outcomes {
        kinds.insert(after.hit.unwrap());
        if let Err(e) = &after.backend_valid {
            panic!("call {nth} ({after:?}): the backend's bookkeeping: {e}");
        }
        if !after.in_drop {
            assert_eq!(
                after.live_ranges, 0,
                "call {nth} ({after:?}): a reservation left"
            );
        }
    }
    if !cfg!(miri) {
        for call in [
            PageCall::Reserve,
            PageCall::Create,
            PageCall::Map,
            PageCall::Unmap,
            PageCall::ReleasePage,
            PageCall::ReleaseRange,
        ] {
            assert!(kinds.contains(&call), "no panic in {call:?}");
        }
    }
}

/// The stronger property: a panic in the backend loses no page and
/// leaves the allocator's bookkeeping whole, so that once every block is
/// back and the allocator dropped the backend holds nothing. Pages stay in
/// the idle list until a map of them succeeded, `create_pages` fills the
/// idle list itself (counted at the next call), and a page is counted
/// released before `release_page` is called: a page handed to a panicking
/// `release_page` is the backend's to lose.
#[test]
fn a_panicking_backend_loses_no_page() {
    let mut bad = Vec::new();
    for (nth, after) in every_panic() {
        if after.in_drop {
            continue;
        }
        // A page handed to a `release_page` that panics is the backend's:
        // the allocator counted it gone before the call.
        let handed_over = after.hit == Some(PageCall::ReleasePage) && after.live_pages <= 1;
        if after.mapped_valid.is_err() || (after.live_pages != 0 && !handed_over) {
            bad.push((nth, after));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

// --- the host backend -----------------------------------------------------------

#[cfg(target_os = "linux")]
mod host {
    use super::*;
    use decaying_pool::PageBackend;
    use decaying_pool::pages::HostPages;

    /// The bytes of a block that the pattern covers: the first 64, every
    /// 61st (so every page of the block, several times), the last.
    fn probes(len: usize) -> impl Iterator<Item = usize> {
        (0..len.min(64))
            .chain((64..len).step_by(61))
            .chain(core::iter::once(len - 1))
    }

    fn pattern(seed: u8, i: usize) -> u8 {
        seed.wrapping_mul(31).wrapping_add(i as u8 ^ (i >> 8) as u8)
    }

    /// Writes the pattern of `seed` into `[block, block + len)`.
    fn fill(block: usize, len: usize, seed: u8) {
        // SAFETY: the block's bytes are mapped, readable and writable, and
        // the caller's alone.
        let bytes = unsafe { core::slice::from_raw_parts_mut(block as *mut u8, len) };
        for i in probes(len) {
            bytes[i] = pattern(seed, i);
        }
    }

    /// The pattern of `seed` reads back from `[block, block + len)`.
    fn intact(block: usize, len: usize, seed: u8) -> bool {
        // SAFETY: as in `fill`.
        let bytes = unsafe { core::slice::from_raw_parts(block as *const u8, len) };
        probes(len).all(|i| bytes[i] == pattern(seed, i))
    }

    /// A request above the machine's memory is refused at once as too
    /// large, by the allocator alone and by a pool over it, before any
    /// address space is reserved (64 TiB was once accepted, and dropping
    /// the allocator then walked its 32 million slots for minutes).
    #[test]
    #[cfg_attr(miri, ignore)] // mmap: FFI
    fn more_than_the_machine_is_too_large_at_once() {
        let backend = HostPages::with_os_pages().unwrap();
        let capacity = backend.capacity().unwrap();
        let mut m = Mapped::new(backend);
        assert_eq!(m.capacity(), Some(capacity));
        for size in [64usize << 40, capacity + 1] {
            let e = m.allocate(size);
            assert!(
                matches!(e, Err(MappedError::TooLarge { requested }) if requested == size),
                "{e:?}"
            );
        }
        let s = m.stats();
        assert_eq!((s.reserves, s.pages_created, s.blocks), (0, 0, 0), "{s:?}");
        let mut pool = DecayingPool::new(m, FixedCapacity::new(4));
        assert!(matches!(
            pool.allocate(64 << 40),
            Err(decaying_pool::PoolError::TooLarge { .. })
        ));
        // Still usable, and a block it hands out is memory.
        let b = pool.allocate(4096).unwrap();
        // SAFETY: `b` came from `allocate(4096)`: 4096 writable bytes,
        // given back once below.
        unsafe {
            core::ptr::write_bytes(b as *mut u8, 7, 4096);
            pool.release(b, 4096);
        }
        assert_eq!(pool.allocator().stats().reserves, 1);
    }

    /// After `fork`, the child of a process with a pool over host pages
    /// cannot change the parent's blocks: its page calls fail with
    /// `Forked` (a new page, a drop that would punch holes in the shared
    /// file), the parent's pages are not mapped in it (`MADV_DONTFORK`),
    /// and after the child dropped its copy of the pool the parent's live
    /// block still holds its bytes and its next blocks read as the parent
    /// left them. Run in a child test process (one thread forks).
    #[test]
    #[cfg_attr(miri, ignore)] // mmap, fork: FFI
    fn a_forked_child_leaves_the_parents_pages_alone() {
        if !crate::support::in_child_test(
            "DECAYING_POOL_FORK_CHILD",
            "mapped::host::a_forked_child_leaves_the_parents_pages_alone",
        ) {
            return;
        }
        let g = HostPages::with_os_pages().unwrap().granularity();
        let mut m = Mapped::new(HostPages::new(g).unwrap());
        let live = m.allocate(3 * g).unwrap();
        let spare = m.allocate(2 * g).unwrap();
        // SAFETY: both blocks are their sizes of writable host memory,
        // ours until deallocated.
        unsafe {
            core::ptr::write_bytes(live as *mut u8, 0xaa, 3 * g);
            core::ptr::write_bytes(spare as *mut u8, 0x55, 2 * g);
            m.deallocate(spare, 2 * g); // its pages spare, still mapped
        }
        let created = m.stats().pages_created;
        // SAFETY: fork in a process whose other threads (the harness's
        // main thread, waiting; the clock's ticker, parked) hold no lock
        // the child takes; the child ends with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // The child: every check is a bit of its exit code.
            let mut code = 0;
            let mut vec = [0u8; 1];
            // SAFETY: `mincore` only reads the page tables of the range.
            if unsafe { libc::mincore(live as *mut _, g, vec.as_mut_ptr()) } == 0 {
                code |= 1; // the parent's pages are mapped here
            }
            match m.allocate(16 * g) {
                Err(e) if e.to_string().contains("fork") => {}
                _ => code |= 2,
            }
            match HostPages::with_os_pages().map(|mut p| p.create_page()) {
                Ok(Ok(_)) => {}
                _ => code |= 4, // a backend of its own works
            }
            // Dropping its copy: the spare pages are not released (their
            // holes would read 0 in the parent).
            drop(m);
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the forked child: status {status:#x} (exit bits: 1 the parent's pages mapped, \
             2 a new page made, 4 its own backend refused)"
        );
        // SAFETY: `live` is ours, `3 * g` bytes, written above.
        let bytes = unsafe { core::slice::from_raw_parts(live as *const u8, 3 * g) };
        assert!(
            bytes.iter().all(|&b| b == 0xaa),
            "the parent's live block changed"
        );
        let again = m.allocate(2 * g).unwrap();
        assert_eq!(m.stats().pages_created, created, "the spare pages serve it");
        // SAFETY: `again` is `2 * g` bytes of ours, on the spare pages,
        // which keep what the parent wrote: the child's drop punched no
        // hole in them (they would read 0) and wrote nothing.
        let bytes = unsafe { core::slice::from_raw_parts(again as *const u8, 2 * g) };
        assert!(
            bytes.iter().all(|&b| b == 0x55),
            "the parent's next block changed"
        );
        // SAFETY: both blocks came from `m` with these sizes.
        unsafe {
            m.deallocate(again, 2 * g);
            m.deallocate(live, 3 * g);
        }
    }

    /// The safe byte views of blocks on host pages: through a `LocalPool`
    /// of a pool over `Mapped<HostPages>` and through a packed
    /// `SharedPool` of one, each block's bytes are its own (a block filled after
    /// another leaves it intact, also across pages), and a hit's view is
    /// the block the miss wrote.
    #[test]
    #[cfg_attr(miri, ignore)] // mmap: FFI
    fn byte_views_of_blocks_on_host_pages() {
        use decaying_pool::{LocalPool, SharedPool};
        let g = HostPages::with_os_pages().unwrap().granularity();
        let sizes = [100, 5000, g + 1, 3 * g];
        let pages = || Mapped::new(HostPages::new(g).unwrap());
        let local = LocalPool::new(DecayingPool::new(pages(), FixedCapacity::new(8)));
        let mut blocks: Vec<_> = sizes.iter().map(|&n| local.allocate(n).unwrap()).collect();
        for (i, b) in blocks.iter_mut().enumerate() {
            assert_eq!(b.fill(i as u8 + 1).len(), sizes[i]);
        }
        for (i, b) in blocks.iter().enumerate() {
            // SAFETY: `fill` initialised every byte.
            let bytes = b.as_uninit().iter().map(|x| unsafe { x.assume_init() });
            assert!(bytes.into_iter().all(|x| x == i as u8 + 1), "block {i}");
        }
        let address = *blocks[1];
        drop(blocks);
        let mut again = local.allocate(5000).unwrap();
        assert_eq!(*again, address, "a hit");
        again.as_uninit_mut()[4999] = core::mem::MaybeUninit::new(9);
        // SAFETY: byte 4999 was just written.
        assert_eq!(unsafe { again.as_uninit()[4999].assume_init() }, 9);
        drop(again);

        let shared = SharedPool::packed(
            DecayingPool::builder(pages())
                .packing(Packing::mapped())
                .build(),
        );
        let mut a = shared.allocate(g + 1).unwrap();
        let mut b = shared.allocate(g + 1).unwrap();
        a.fill(0xaa);
        b.fill(0xbb);
        assert!(a.fill(0xaa).iter().all(|&x| x == 0xaa));
        assert!(b.fill(0xbb).iter().all(|&x| x == 0xbb));
    }

    /// Blocks of many sizes written with their own patterns read back
    /// intact while others come and go and, under a capacity of 24 pages,
    /// spare pages move from one place to another.
    #[test]
    #[cfg_attr(miri, ignore)] // mmap: FFI
    fn blocks_keep_their_bytes_while_pages_move() {
        let backend = HostPages::with_os_pages().unwrap();
        let g = backend.granularity();
        let mut m = Mapped::with_clock(backend, ManualClock::new())
            .with_reservation(64 * g)
            .with_capacity(24 * g);
        let sizes = [
            100,
            g,
            g + 1,
            3 * g - 7,
            5000,
            2 * g,
            7 * g + 513,
            64,
            4 * g,
        ];
        let mut held: Vec<(usize, usize, u8)> = Vec::new();
        let mut rng = crate::support::Lcg(42);
        for round in 0..120u32 {
            let size = sizes[rng.below(sizes.len() as u64) as usize];
            if held.len() < 3 || (held.len() < 6 && rng.below(2) == 0) {
                let before = m.stats();
                let b = m.allocate(size).unwrap();
                let after = m.stats();
                if after.pages_created > before.pages_created {
                    assert!(
                        after.page_bytes <= 24 * g || after.spare_bytes == 0,
                        "round {round}: pages made past the capacity, spare ones left: {after:?}"
                    );
                }
                {
                    let seed = round as u8;
                    fill(b, size, seed);
                    held.push((b, size, seed));
                }
            } else {
                let (b, size, seed) = held.swap_remove(rng.below(held.len() as u64) as usize);
                assert!(
                    intact(b, size, seed),
                    "round {round}: a freed block's bytes"
                );
                // SAFETY: `b` came from `allocate(size)`, given back once.
                unsafe { m.deallocate(b, size) };
            }
            for &(b, size, seed) in &held {
                assert!(
                    intact(b, size, seed),
                    "round {round}: block {b:#x} of {size}"
                );
            }
            m.validate().unwrap();
        }
        let s = m.stats();
        assert!(s.unmaps > 0, "no page moved: {s:?}");
        assert!(s.maps > s.unmaps);
        for (b, size, seed) in held {
            assert!(intact(b, size, seed));
            // SAFETY: as above.
            unsafe { m.deallocate(b, size) };
        }
        assert_eq!(m.release_spare(), s.page_bytes);
        assert_eq!(m.backend().file_bytes().unwrap(), 0, "the memory went back");
    }

    /// A page keeps its bytes when it moves: a block given back between
    /// two others, its page taken (under a capacity of three pages) by a
    /// block of two pages that does not fit its hole, read there.
    #[test]
    #[cfg_attr(miri, ignore)] // mmap: FFI
    fn a_moved_page_shows_its_bytes_at_the_new_place() {
        let backend = HostPages::with_os_pages().unwrap();
        let g = backend.granularity();
        let mut m = Mapped::with_clock(backend, ManualClock::new())
            .with_reservation(8 * g)
            .with_capacity(3 * g)
            .with_align(g);
        let left = m.allocate(g).unwrap();
        let a = m.allocate(g).unwrap();
        let right = m.allocate(g).unwrap();
        fill(a, g, 9);
        // SAFETY: `a` came from `allocate(g)`, given back once.
        unsafe { m.deallocate(a, g) };
        let b = m.allocate(2 * g).unwrap();
        assert!(b > right, "after the three: {b:#x}");
        let s = m.stats();
        assert_eq!(
            (s.unmaps, s.pages_created, s.spare_bytes),
            (1, 4, 0),
            "a's page moved: {s:?}"
        );
        let shows = (0..2).any(|k| intact(b + k * g, g, 9));
        assert!(shows, "the moved page keeps a's bytes");
        // SAFETY: each block given back once.
        unsafe {
            m.deallocate(b, 2 * g);
            m.deallocate(left, g);
            m.deallocate(right, g);
        }
        m.validate().unwrap();
    }

    /// A pool caching nothing over host pages serves a growing-size loop
    /// with the pages of the largest block only, made once; the same
    /// through a `PackedPool`.
    #[test]
    #[cfg_attr(miri, ignore)] // mmap: FFI
    fn a_pool_over_host_pages_reuses_them() {
        let backend = HostPages::with_os_pages().unwrap();
        let g = backend.granularity();
        let mapped = Mapped::with_clock(backend, ManualClock::new()).with_reservation(64 * MIB);
        let mut pool = DecayingPool::new(mapped, FixedCapacity::new(0));
        for step in 1..=32usize {
            let size = step * 64 * KIB + 100;
            let b = pool.allocate(size).unwrap();
            fill(b, size, step as u8);
            assert!(intact(b, size, step as u8));
            // SAFETY: `b` came from `pool.allocate(size)`, released once.
            unsafe { pool.release(b, size) };
        }
        let s = pool.allocator().stats();
        let peak_pages = (32 * 64 * KIB + 100).div_ceil(g) as u64;
        assert!(s.pages_created <= peak_pages + 1, "{s:?}");
        assert_eq!(s.pages_released, 0);
        assert_eq!(s.peak_page_bytes, s.page_bytes);
        assert_eq!(pool.trim(), s.page_bytes);
        assert_eq!(pool.allocator().backend().file_bytes().unwrap(), 0);

        let backend = HostPages::with_os_pages().unwrap();
        let mapped = Mapped::with_clock(backend, ManualClock::new()).with_reservation(64 * MIB);
        let mut packed = DecayingPool::builder(mapped)
            .policy(FixedCapacity::new(0))
            .packing(Packing::mapped())
            .build();
        for step in 1..=24usize {
            let (small, large) = (step * 100, step * 128 * KIB);
            let a = packed.allocate(small).unwrap();
            let b = packed.allocate(large).unwrap();
            fill(a, small, 1);
            fill(b, large, 2);
            assert!(intact(a, small, 1) && intact(b, large, 2));
            // SAFETY: each block came from `packed.allocate(its size)`,
            // released once.
            unsafe {
                packed.release(b, large);
                packed.release(a, small);
            }
        }
        assert_eq!(packed.stats().blocks_in_use, 0);
    }

    /// `Mapped::new(HostPages::with_os_pages()?)` as documented, with its default
    /// reservation (64 GiB of address space) and the OS page (4 KiB): the
    /// first allocation must not cost the process memory in proportion to
    /// the address space reserved (it did, 800 MiB for a block of 100
    /// bytes, before the default reservation was capped at 65 536 pages).
    #[test]
    #[cfg(not(miri))] // mmap: FFI
    fn the_default_reservation_costs_little_memory() {
        fn resident() -> usize {
            let status = std::fs::read_to_string("/proc/self/statm").unwrap();
            let pages: usize = status.split_whitespace().nth(1).unwrap().parse().unwrap();
            pages * 4096
        }
        let mut m = Mapped::new(HostPages::with_os_pages().unwrap());
        let before = resident();
        let a = m.allocate(100).unwrap();
        let grown = resident().saturating_sub(before);
        // SAFETY: `a` came from `allocate(100)`, given back once.
        unsafe { m.deallocate(a, 100) };
        assert!(
            grown < 64 * MIB,
            "{} MiB resident for one block",
            grown / MIB
        );
    }
}

// --- the A/B/A trace -------------------------------------------------------------

/// The A/B/A fragmentation scenario of the design (`cli/traces/aba_frag.csv`,
/// `shared/peers/README.md`): 1 GiB + 4 GiB, the 4 GiB freed, 1 GiB more,
/// then 1 GiB + 4 GiB again on an 8 GiB device (7 GiB live at the peak).
/// The `mapped` row serves every request: the pages of the freed 4 GiB
/// block serve the second one wherever it lands.
#[test]
#[cfg_attr(miri, ignore)] // reads a file
fn the_aba_trace_fits_an_8_gib_device_through_the_mapped_row() {
    use decaying_pool::trace::{
        Config, CostModel, ReadOptions, ReplayOptions, Replayer, TraceReader,
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cli/traces/aba_frag.csv");
    if !path.exists() {
        println!("note: {} absent; skipped", path.display());
        return;
    }
    let events: Vec<_> = TraceReader::open(&path, ReadOptions::default())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(events.len(), 10);
    let opts = ReplayOptions {
        cost: CostModel::cuda().with_capacity(8 * GIB),
        ..ReplayOptions::default()
    };
    let mut r = Replayer::new(&[Config::mapped()], opts);
    for e in &events {
        r.event(e);
    }
    let rep = r.finish("aba").pop().unwrap();
    assert_eq!(rep.failures, 0, "{rep:?}");
    assert_eq!(rep.allocs, 5);
    assert_eq!(rep.peak_live_bytes, 7 * GIB);
    assert!(rep.peak_reserved_bytes <= 8 * GIB, "{rep:?}");
    // 7 GiB live at the peak in pages of 20 MiB (a boundary page or so
    // more per block), each made once: the second 4 GiB block maps the
    // first one's pages again, and none goes back (the trace lasts 50 ms).
    let page = 20 * MIB as u64;
    assert!(
        rep.pages_created <= (7 * GIB as u64).div_ceil(page) + 6,
        "{rep:?}"
    );
    assert_eq!(rep.pages_released, 0);
}

// --- alignment --------------------------------------------------------------------

/// `with_align` gives a power of two, also on pages that are not one (the
/// host backend allows any multiple of the OS page, the modelled one any
/// size): the largest that divides the page.
#[test]
fn with_align_gives_a_power_of_two() {
    let m = Mapped::new(ModelPages::new(3 * 4096).unwrap()).with_align(1 << 20);
    assert!(m.align().is_power_of_two(), "align {}", m.align());
}

/// Blocks are aligned to `align()`, also on pages of 3000 bytes (whose
/// ranges start at multiples of 3000: `align()` is then 8).
#[test]
fn blocks_are_aligned_on_any_page() {
    let mut m = Mapped::new(ModelPages::new(3000).unwrap()).with_reservation(30_000);
    let a = m.allocate(100).unwrap();
    let align = m.align();
    // SAFETY: `a` came from `allocate(100)`, given back once.
    unsafe { m.deallocate(a, 100) };
    assert_eq!(a % align, 0, "block {a:#x}, align {align}");
}

// --- a request whose bookkeeping does not fit ------------------------------------

/// `allocate(1 << 62)` on the modelled backend (pages of 2 MiB): a
/// reservation whose slot table (2⁴¹ entries) cannot be allocated is
/// refused with an error before the backend is asked (whose own slot
/// bitset, 2⁴¹ bits, would abort the process: "memory allocation of
/// 274877906944 bytes failed"). Run in a child process, so that an abort
/// does not take the test binary down.
#[test]
#[cfg(not(miri))] // spawns a process
fn a_huge_request_fails_instead_of_aborting() {
    if crate::support::in_child_test(
        "DECAYING_POOL_MAPPED_HUGE_CHILD",
        "mapped::a_huge_request_fails_instead_of_aborting",
    ) {
        let mut m = Mapped::new(ModelPages::new(2 * MIB).unwrap());
        assert!(m.allocate(1 << 62).is_err());
    }
}

// --- the pool over the mapped allocator ------------------------------------------

/// A pool that caches blocks over `Mapped`: a miss of another size, with
/// too little spare memory for its class, gives the oldest cached block
/// back first (`Reason::Remapped`), and its pages serve the request: no
/// page is made for it.
#[test]
fn a_miss_takes_the_pages_of_the_oldest_cached_block() {
    use decaying_pool::{Event, FixedTime, Reason};
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let clock = ManualClock::new();
    let mapped = Mapped::with_clock(ModelPages::new(2 * MIB).unwrap(), clock.clone());
    let mut pool = DecayingPool::builder(mapped)
        .policy(FixedTime::new(Duration::from_secs(3600)))
        .clock(clock)
        .observer(move |e| log.lock().unwrap().push(e))
        .build();
    let a = pool.allocate(10 * MIB).unwrap();
    let b = pool.allocate(6 * MIB).unwrap();
    // SAFETY: each from this pool with its size, released once.
    unsafe {
        pool.release(a, 10 * MIB);
        pool.release(b, 6 * MIB);
    }
    assert_eq!(pool.allocator().stats().pages_created, 8);
    assert_eq!(pool.allocator().spare(), Some(0), "both blocks cached");
    // 8 MiB: no cached block of its class, no spare page: the oldest
    // cached block (10 MiB) goes back, and its pages serve it.
    let c = pool.allocate(8 * MIB).unwrap();
    let s = pool.allocator().stats();
    assert_eq!(s.pages_created, 8, "no page made for the miss");
    assert_eq!(s.blocks, 2);
    pool.allocator().validate().unwrap();
    let freed: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match *e {
            Event::Freed { size, reason } => Some((size, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(freed, [(10 * MIB, Reason::Remapped)]);
    assert_eq!(pool.stats().evictions, 1);
    // SAFETY: from this pool with its size, released once.
    unsafe { pool.release(c, 8 * MIB) };
}

/// A clock that panics on every read after the first `ok` ones, and
/// counts its panics.
struct FailingClock {
    inner: ManualClock,
    ok: std::cell::Cell<u32>,
    panics: std::rc::Rc<std::cell::Cell<u32>>,
}

impl decaying_pool::Clock for FailingClock {
    fn now(&self) -> Duration {
        let left = self.ok.get();
        if left == 0 {
            self.panics.set(self.panics.get() + 1);
            panic!("the clock failed");
        }
        self.ok.set(left - 1);
        self.inner.now()
    }
}

/// A clock that panics inside `deallocate` loses nothing: the block goes
/// back (its pages spare, stamped with the last sweep), and the pages are
/// released on `release_spare` as any others.
#[test]
fn a_panicking_clock_in_deallocate_loses_no_block() {
    let panics = std::rc::Rc::new(std::cell::Cell::new(0));
    // Two good reads: the construction's and the first deallocate's.
    let clock = FailingClock {
        inner: ManualClock::new(),
        ok: std::cell::Cell::new(2),
        panics: panics.clone(),
    };
    let mut m = Mapped::with_clock(ModelPages::new(2 * MIB).unwrap(), clock);
    let a = m.allocate(5 * MIB).unwrap();
    let b = m.allocate(3 * MIB).unwrap();
    // SAFETY: each from `allocate` with its size, given back once.
    unsafe {
        m.deallocate(a, 5 * MIB); // the clock's last good read
        m.deallocate(b, 3 * MIB); // the clock panics inside
    }
    assert_eq!(
        panics.get(),
        1,
        "the clock panicked inside the second deallocate"
    );
    let s = m.stats();
    assert_eq!((s.blocks, s.block_bytes), (0, 0));
    assert_eq!(s.spare_bytes, s.page_bytes);
    m.validate().unwrap();
    assert_eq!(m.release_spare(), s.page_bytes);
    assert_eq!(m.stats().page_bytes, 0);
}

/// A page is never unmapped while work queued before its block's release
/// may still use it: the release takes a fence, and the unmap waits on it
/// first (the modelled device refuses, and `validate` reports, an unmap of
/// addresses with work in flight). A refused wait leaves the pages mapped
/// and spare, for a later try; a refused fence makes the unmap wait for
/// all the work queued.
#[test]
fn mapped_waits_on_the_release_fence_before_unmapping() {
    let g = 4 * KIB;
    let (mut m, backend, _clock) = manual(ModelPages::new(g).unwrap());
    let a = m.allocate(3 * g).unwrap();
    backend.queue_work(a, 3 * g);
    // SAFETY: `a` came from `allocate(3 * g)`, given back once; the host
    // uses it no more (the modelled device may).
    unsafe { m.deallocate(a, 3 * g) };
    backend.fail_next(PageCall::Wait, 1);
    assert_eq!(m.release_spare(), 0, "a refused wait unmaps nothing");
    assert_eq!(m.stats().spare_bytes, 3 * g);
    assert_eq!(m.release_spare(), 3 * g);
    backend.with_pages(|p| {
        p.validate().unwrap();
        assert_eq!((p.counts().fences, p.counts().waits), (1, 1));
    });
    // A second block on the same pages, its release's fence refused.
    let b = m.allocate(g).unwrap();
    backend.queue_work(b, g);
    backend.fail_next(PageCall::Fence, 1);
    // SAFETY: as above.
    unsafe { m.deallocate(b, g) };
    backend.take_log();
    assert_eq!(m.release_spare(), g);
    let waited: Vec<_> = backend
        .take_log()
        .into_iter()
        .filter_map(|e| match e {
            harness::PageEvent::Waited { ticket } => Some(ticket),
            _ => None,
        })
        .collect();
    assert_eq!(waited, [u64::MAX], "a failed fence stands for all the work");
    drop(m);
    backend.with_pages(|p| p.validate_released()).unwrap();
}

/// The same through a [`SharedPool`]: its miss, with too little spare
/// memory for the class, gives the oldest cached block back first, under
/// the cache lock, and the freed pages serve the request.
#[test]
fn a_shared_pool_miss_takes_the_pages_of_the_oldest_cached_block() {
    use decaying_pool::{FixedTime, SharedPool};
    let mapped = Mapped::new(ModelPages::new(2 * MIB).unwrap());
    let pool = SharedPool::new(DecayingPool::new(
        mapped,
        FixedTime::new(Duration::from_secs(3600)),
    ));
    let (a, b) = (
        pool.allocate(10 * MIB).unwrap(),
        pool.allocate(6 * MIB).unwrap(),
    );
    drop((a, b));
    type Pool = SharedPool<Mapped<ModelPages>, FixedTime>;
    let pages = |pool: &Pool| pool.with(|p| p.allocator().stats());
    let s = pages(&pool);
    assert_eq!(
        (s.pages_created, s.spare_bytes),
        (8, 0),
        "both cached: {s:?}"
    );
    // 8 MiB: no cached block of its class, no spare page: the oldest
    // cached block (10 MiB) goes back, and its pages serve it.
    let c = pool.allocate(8 * MIB).unwrap();
    let s = pages(&pool);
    assert_eq!(s.pages_created, 8, "no page made for the miss: {s:?}");
    assert_eq!(s.blocks, 2, "{s:?}");
    assert_eq!(pool.stats().evictions, 1);
    drop(c);
    pool.validate();
}
