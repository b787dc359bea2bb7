//! Tests: the page figures `Stats` carry over an allocator of mapped pages
//! (`pages::Mapped`), zero over any other; and the bands of the replay's
//! timeline (live bytes, free space inside segments, spare pages apart
//! from the cached blocks).

use core::time::Duration;

use decaying_pool::pages::{Mapped, ModelPages};
use decaying_pool::trace::{Config, Event, ReplayOptions, Replayer};
use decaying_pool::{DecayingPool, FixedCapacity, FixedTime, Packing, Stats, SystemAllocator};

const MIB: usize = 1 << 20;

fn pages() -> Mapped<ModelPages> {
    Mapped::new(ModelPages::new(2 * MIB).unwrap())
}

#[test]
fn a_pool_over_mapped_pages_reports_its_page_figures() {
    // No block kept in the pool: the free pages are the only cache.
    let mut pool = DecayingPool::builder(pages())
        .policy(FixedCapacity::new(0))
        .build();
    let b = pool.allocate(3 * MIB).unwrap();
    let s = pool.stats();
    assert_eq!(s.pages_created, 2);
    assert!(s.page_maps >= 1, "{s:?}");
    assert_eq!(s.bytes_spare, pool.allocator().stats().spare_bytes);
    // SAFETY: `b` came from `allocate(3 MiB)` and is not used again.
    unsafe { pool.release(b, 3 * MIB) };
    let s = pool.stats();
    let m = pool.allocator().stats();
    assert_eq!(s.pages_created, 2);
    assert_eq!(s.bytes_spare, m.spare_bytes);
    assert_eq!(s.bytes_spare, 4 * MIB); // both pages, touched by no block
    assert_eq!((s.bytes_in_use, s.bytes_cached), (0, 0));
    assert_eq!((s.page_maps, s.page_unmaps), (m.maps, m.unmaps));
    assert_eq!(s.pages_released, 0);
    assert!(
        s.to_string().contains("pages: 2 created, 0 released"),
        "{s}"
    );

    pool.trim();
    let s = pool.stats();
    let m = pool.allocator().stats();
    assert_eq!((s.pages_released, s.bytes_spare), (2, 0));
    assert_eq!((s.page_maps, s.page_unmaps), (m.maps, m.unmaps));
    assert!(s.page_unmaps >= 1, "{s:?}");
}

#[test]
fn a_caching_pool_over_mapped_pages_counts_its_block_cached_not_spare() {
    let mut pool = DecayingPool::builder(pages())
        .policy(FixedTime::new(Duration::from_secs(3600)))
        .build();
    let b = pool.allocate(3 * MIB).unwrap();
    // SAFETY: as above.
    unsafe { pool.release(b, 3 * MIB) };
    let s = pool.stats();
    assert_eq!(s.bytes_cached, 3 * MIB);
    // The block's pages stay touched: only the fourth MiB is spare, if any.
    assert_eq!(s.bytes_spare, pool.allocator().stats().spare_bytes);
    assert!(s.bytes_spare < 2 * MIB, "{s:?}");
    pool.trim(); // frees the block, then gives the spare pages back
    let s = pool.stats();
    assert_eq!((s.pages_released, s.bytes_spare, s.bytes_cached), (2, 0, 0));
}

#[test]
fn a_packed_pool_over_mapped_pages_carries_the_page_figures() {
    let mut pool = DecayingPool::builder(pages())
        .packing(Packing::default())
        .build();
    let b = pool.allocate(3 * MIB).unwrap(); // a medium request: a segment
    let s = pool.stats();
    let p = pool.pool().stats();
    assert!(s.pages_created >= 2, "{s:?}");
    let m = pool.pool().allocator().stats();
    for (s, what) in [(s, "request-level"), (p, "exact pool")] {
        assert_eq!(s.pages_created, m.pages_created, "{what}");
        assert_eq!(s.page_maps, m.maps, "{what}");
        assert_eq!(s.bytes_spare, m.spare_bytes, "{what}");
    }
    // SAFETY: `b` came from `allocate(3 MiB)` and is not used again.
    unsafe { pool.release(b, 3 * MIB) };
    pool.trim();
    let s = pool.stats();
    assert_eq!(s.pages_released, s.pages_created);
    assert_eq!(s.bytes_spare, 0);
}

#[test]
fn a_pool_over_the_system_allocator_reports_no_page_figures() {
    let mut pool = DecayingPool::new(SystemAllocator::new(), FixedTime::default());
    let b = pool.allocate(3 * MIB).unwrap();
    // SAFETY: `b` came from `allocate(3 MiB)` and is not used again.
    unsafe { pool.release(b, 3 * MIB) };
    pool.trim();
    let s = pool.stats();
    assert_eq!(s.backing_allocs, 1);
    let pages = |s: &Stats| {
        (
            s.pages_created,
            s.pages_released,
            s.page_maps,
            s.page_unmaps,
            s.bytes_spare,
        )
    };
    assert_eq!(pages(&s), (0, 0, 0, 0, 0));
    assert!(!s.to_string().contains("pages:"), "{s}");
    let mut packed = DecayingPool::builder(SystemAllocator::new())
        .packing(Packing::default())
        .build();
    let b = packed.allocate(100).unwrap();
    assert_eq!(pages(&packed.stats()), (0, 0, 0, 0, 0));
    // SAFETY: as above.
    unsafe { packed.release(b, 100) };
}

#[cfg(feature = "serde")]
#[test]
fn an_older_snapshot_without_page_figures_reads_them_as_zero() {
    let old = r#"{"hits":1,"misses":2,"bytes_reserved":4096}"#;
    let s: Stats = serde_json::from_str(old).unwrap();
    assert_eq!((s.hits, s.misses, s.bytes_reserved), (1, 2, 4096));
    assert_eq!((s.pages_created, s.bytes_spare), (0, 0));
    let v = serde_json::to_value(stats! {
        page_maps: 3,
        bytes_spare: 7,
    })
    .unwrap();
    assert_eq!(
        (v["page_maps"].as_u64(), v["bytes_spare"].as_u64()),
        (Some(3), Some(7))
    );
}

/// The replay's timeline: the packed row's samples carry the free space
/// inside its segments, the mapped row's its spare pages apart from the
/// cached blocks, and every row the trace's live bytes.
#[test]
fn the_replay_records_the_bands() {
    let configs = Config::defaults();
    let opts = ReplayOptions {
        record: true,
        ..Default::default()
    };
    let mut r = Replayer::new(&configs, opts);
    let ms = Duration::from_millis;
    // On the mapped row's pages of 20 MiB: the small block's segment
    // touches the first page, the large block the next ones, which are
    // spare once it is freed.
    let large = 60 * MIB as u64;
    r.event(&Event::alloc(ms(0), 2, 100));
    r.event(&Event::alloc(ms(1), 1, large));
    r.event(&Event::free(ms(2), 1, large));
    let reports = r.finish("bands");
    let mut seen = (false, false);
    for rep in &reports {
        let tl = rep.timeline.as_ref().expect("recorded");
        let last = *tl.samples().last().unwrap();
        assert_eq!(last.bytes_live, 100, "{}", rep.policy);
        assert_eq!(last.bytes_spare, rep.stats.bytes_spare, "{}", rep.policy);
        // The tables' cached bytes count the spare pages; the sample's not.
        assert_eq!(
            last.bytes_cached + last.bytes_spare,
            rep.stats.bytes_cached,
            "{}",
            rep.policy
        );
        assert!(last.bytes_live <= last.bytes_in_use, "{}", rep.policy);
        match rep.policy.as_str() {
            "mapped" => {
                seen.0 = true;
                assert!(last.bytes_spare > 0, "{last:?}");
                assert_eq!(rep.stats.pages_created, rep.pages_created);
                assert_eq!(rep.stats.page_maps, rep.maps);
            }
            "packed" => {
                seen.1 = true;
                assert!(last.bytes_free_in_segments > 0, "{last:?}");
                assert!(
                    last.bytes_live + last.bytes_free_in_segments <= last.bytes_in_use,
                    "{last:?}"
                );
            }
            _ => {
                assert_eq!(last.bytes_free_in_segments, 0, "{}", rep.policy);
                assert_eq!(last.bytes_spare, 0, "{}", rep.policy);
            }
        }
    }
    assert_eq!(
        seen,
        (true, true),
        "the default rows have a mapped and a packed one"
    );
}

/// A `SharedPool` over `Mapped` reports the pages' figures as the plain
/// pool does (read under the allocator's lock).
#[test]
fn a_shared_pool_over_mapped_pages_reports_their_figures() {
    use decaying_pool::pages::{Mapped, ModelPages};
    use decaying_pool::{DecayingPool, FixedCapacity, SharedPool};
    let pool = SharedPool::new(DecayingPool::new(
        Mapped::new(ModelPages::new(2 << 20).unwrap()),
        FixedCapacity::new(0),
    ));
    drop(pool.allocate(3 << 20).unwrap());
    let s = pool.stats();
    assert_eq!((s.pages_created, s.bytes_spare), (2, 4 << 20), "{s:?}");
    assert!(s.page_maps >= 1, "{s:?}");
    pool.trim();
    let s = pool.stats();
    assert_eq!((s.pages_released, s.bytes_spare), (2, 0), "{s:?}");
}

/// The pool's limit covers the spare pages of `Mapped`: lowering it gives
/// them back, and a miss that would keep them past it gives them back
/// before new pages are made, so the pages stay within the limit.
#[test]
fn the_limit_covers_the_spare_pages() {
    use decaying_pool::pages::{Mapped, ModelPages};
    use decaying_pool::{DecayingPool, FixedCapacity};
    const MIB: usize = 1 << 20;
    let mapped = Mapped::new(ModelPages::new(2 * MIB).unwrap()).with_reservation(64 * MIB);
    let mut pool = DecayingPool::builder(mapped)
        .policy(FixedCapacity::new(0))
        .limit(16 * MIB)
        .build();
    // 10 MiB given back: its five pages stay mapped, spare.
    let a = pool.allocate(10 * MIB).unwrap();
    let b = pool.allocate(4 * MIB).unwrap();
    // SAFETY: from this pool with its size, released once.
    unsafe { pool.release(a, 10 * MIB) };
    assert_eq!(pool.stats().bytes_spare, 10 * MIB);
    // 12 MiB more: held 4 + 12, and the spare 10 beside it would pass 16.
    let c = pool.allocate(12 * MIB).unwrap();
    let p = pool.allocator().stats();
    assert!(p.page_bytes <= 16 * MIB, "pages past the limit: {p:?}");
    // Lowering the limit gives the spare pages back.
    // SAFETY: as above.
    unsafe { pool.release(c, 12 * MIB) };
    assert!(pool.stats().bytes_spare >= 12 * MIB);
    let freed = pool.set_limit(Some(8 * MIB));
    assert!(freed >= 12 * MIB, "{freed}");
    let s = pool.stats();
    assert_eq!(s.bytes_spare, 0, "{s:?}");
    assert_eq!(pool.allocator().stats().page_bytes, 4 * MIB);
    // SAFETY: as above.
    unsafe { pool.release(b, 4 * MIB) };
}

/// The same through a [`SharedPool`](decaying_pool::SharedPool): its limit
/// covers the spare pages (on its miss and on `set_limit`).
#[test]
fn a_shared_pools_limit_covers_the_spare_pages() {
    use decaying_pool::pages::{Mapped, ModelPages};
    use decaying_pool::{DecayingPool, FixedCapacity, SharedPool};
    const MIB: usize = 1 << 20;
    let mapped = Mapped::new(ModelPages::new(2 * MIB).unwrap()).with_reservation(64 * MIB);
    let pool = SharedPool::new(
        DecayingPool::builder(mapped)
            .policy(FixedCapacity::new(0))
            .limit(16 * MIB)
            .build(),
    );
    let page_bytes = |pool: &SharedPool<Mapped<ModelPages>, FixedCapacity>| {
        pool.with(|p| p.allocator().stats().page_bytes)
    };
    let a = pool.allocate(10 * MIB).unwrap();
    let b = pool.allocate(4 * MIB).unwrap();
    drop(a);
    assert_eq!(pool.stats().bytes_spare, 10 * MIB);
    let c = pool.allocate(12 * MIB).unwrap();
    assert!(
        page_bytes(&pool) <= 16 * MIB,
        "{} MiB of pages",
        page_bytes(&pool) >> 20
    );
    drop(c);
    assert!(pool.stats().bytes_spare >= 12 * MIB);
    assert!(pool.set_limit(Some(8 * MIB)) >= 12 * MIB);
    assert_eq!(pool.stats().bytes_spare, 0);
    assert_eq!(page_bytes(&pool), 4 * MIB);
    drop(b);
}
