//! The page layer (`decaying_pool::pages`): the host backend on Linux (memfd
//! pages moving between reservations, memory given back, the kernel's
//! mapping count under churn) and the modelled backend everywhere (its
//! checks, counts and charges, and random sequences against a model).

use core::time::Duration;

use decaying_pool::pages::{
    ModelPage, ModelPages, ModelRange, PageBackend, PageCosts, PageCounts, PageError,
};

use crate::support::Rng;

#[cfg(target_os = "linux")]
mod host {
    use decaying_pool::pages::{
        HostPage, HostPageError, HostPages, HostRange, PageBackend, PageError,
    };

    use crate::support::Rng;

    fn invalid(r: Result<impl core::fmt::Debug, HostPageError>) -> PageError {
        match r {
            Err(HostPageError::Invalid(e)) => e,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Writes `byte` over `len` bytes at `offset` of `range`.
    ///
    /// # Safety
    ///
    /// Those bytes are mapped.
    unsafe fn fill(range: &HostRange, offset: usize, len: usize, byte: u8) {
        // SAFETY: the caller's contract.
        unsafe { range.as_ptr().add(offset).write_bytes(byte, len) }
    }

    /// The bytes at `offset..offset + len` of `range`.
    ///
    /// # Safety
    ///
    /// Those bytes are mapped.
    unsafe fn read(range: &HostRange, offset: usize, len: usize) -> Vec<u8> {
        // SAFETY: the caller's contract.
        unsafe { core::slice::from_raw_parts(range.as_ptr().add(offset), len).to_vec() }
    }

    /// The lines of `/proc/self/maps`: all, and those inside `range`.
    fn mappings(range: &HostRange) -> (usize, usize) {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let (lo, hi) = (
            range.as_ptr() as usize,
            range.as_ptr() as usize + range.len(),
        );
        let inside = maps
            .lines()
            .filter(|l| {
                let span = l.split(' ').next().unwrap();
                let (a, b) = span.split_once('-').unwrap();
                let (a, b) = (
                    usize::from_str_radix(a, 16).unwrap(),
                    usize::from_str_radix(b, 16).unwrap(),
                );
                a < hi && b > lo
            })
            .count();
        (maps.lines().count(), inside)
    }

    #[test]
    #[cfg_attr(miri, ignore)] // mmap and memfd: FFI
    fn pages_move_between_ranges_with_their_bytes() {
        let mut b = HostPages::with_os_pages().unwrap();
        let g = b.granularity();
        let (mut a, mut c) = (b.reserve(8 * g).unwrap(), b.reserve(8 * g).unwrap());
        assert_eq!(a.as_ptr() as usize % g, 0);
        let mut pages = Vec::new();
        b.create_pages(3, &mut pages).unwrap();
        b.map(&mut a, 2 * g, &pages).unwrap();
        assert_eq!(a.mapped_runs(), vec![(2 * g, 3)]);
        // SAFETY: slots 2..5 of `a` are mapped.
        unsafe {
            assert_eq!(
                read(&a, 2 * g, 3 * g),
                vec![0; 3 * g],
                "new pages read zero"
            );
            for k in 0..3 {
                fill(&a, (2 + k) * g, g, 10 + k as u8);
            }
        }
        // SAFETY: nothing uses `a`'s slots any more.
        unsafe { b.unmap(&mut a, 2 * g, 3).unwrap() };
        assert_eq!(a.mapped_pages(), 0);
        // The same pages in another range, in another order, one by one.
        let order = [2, 0, 1];
        for (slot, &k) in order.iter().enumerate() {
            b.map(&mut c, slot * g, core::slice::from_ref(&pages[k]))
                .unwrap();
        }
        for (slot, &k) in order.iter().enumerate() {
            // SAFETY: slot `slot` of `c` is mapped.
            assert_eq!(unsafe { read(&c, slot * g, g) }, vec![10 + k as u8; g]);
        }
        // And back into `a`, at once, where they show what `c` wrote.
        // SAFETY: slot 0 of `c` is mapped.
        unsafe { fill(&c, 0, 1, 99) };
        // SAFETY: nothing uses `c` any more.
        unsafe { b.unmap(&mut c, 0, 3).unwrap() };
        b.map(&mut a, 0, &pages).unwrap();
        // SAFETY: slots 0..3 of `a` are mapped; page 2 is at slot 2.
        assert_eq!(unsafe { read(&a, 2 * g, 2) }, vec![99, 12]);
        let c_counts = b.counts();
        assert_eq!(
            (
                c_counts.created,
                c_counts.maps,
                c_counts.unmaps,
                c_counts.set_access,
                c_counts.unmap_calls
            ),
            (3, 9, 6, 5, 2)
        );
        // SAFETY: nothing uses either range; their pages are unmapped with them.
        unsafe {
            b.release_range(a).unwrap();
            b.release_range(c).unwrap();
            for p in pages {
                b.release_page(p).unwrap();
            }
        }
        let n = b.counts();
        assert_eq!(
            (n.released, n.unmaps, n.range_frees, n.reserves),
            (3, 9, 2, 2)
        );
    }

    #[test]
    #[cfg_attr(miri, ignore)] // mmap and memfd: FFI
    fn released_pages_give_their_memory_back() {
        let g = 64 << 10;
        let mut b = HostPages::new(g).unwrap();
        let mut r = b.reserve(16 * g).unwrap();
        let mut pages = Vec::new();
        b.create_pages(16, &mut pages).unwrap();
        assert_eq!(
            b.file_bytes().unwrap(),
            0,
            "created pages hold no memory until touched"
        );
        b.map(&mut r, 0, &pages).unwrap();
        // SAFETY: the whole range is mapped.
        unsafe { fill(&r, 0, 16 * g, 5) };
        assert_eq!(b.file_bytes().unwrap(), 16 * g as u64);
        // SAFETY: nothing uses the range.
        unsafe { b.unmap(&mut r, 0, 16).unwrap() };
        assert_eq!(
            b.file_bytes().unwrap(),
            16 * g as u64,
            "unmapped pages keep their memory"
        );
        let rest = pages.split_off(8);
        for p in pages {
            // SAFETY: `p` is not mapped.
            unsafe { b.release_page(p).unwrap() };
        }
        assert_eq!(b.file_bytes().unwrap(), 8 * g as u64);
        // A new page takes a released slot, and reads zero.
        let mut fresh = Vec::new();
        b.create_pages(2, &mut fresh).unwrap();
        assert_eq!(fresh[0].file_offset(), 0);
        b.map(&mut r, 0, &fresh).unwrap();
        // SAFETY: slots 0 and 1 are mapped.
        assert_eq!(unsafe { read(&r, 0, 2 * g) }, vec![0; 2 * g]);
        // SAFETY: nothing uses the range; its pages are unmapped with it.
        unsafe {
            b.release_range(r).unwrap();
            for p in rest.into_iter().chain(fresh) {
                b.release_page(p).unwrap();
            }
        }
        assert_eq!(b.file_bytes().unwrap(), 0);
        assert_eq!(
            b.file_len(),
            16 * g as u64,
            "the file keeps its length: holes"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore)] // mmap and memfd: FFI
    fn bad_calls_are_refused_and_change_nothing() {
        assert_eq!(invalid(HostPages::new(0)), PageError::ZeroSize);
        assert!(matches!(
            invalid(HostPages::new(1000)),
            PageError::NotAligned { value: 1000, .. }
        ));
        let mut b = HostPages::with_os_pages().unwrap();
        let g = b.granularity();
        assert_eq!(invalid(b.reserve(0)), PageError::ZeroSize);
        assert_eq!(
            invalid(b.reserve(g + 1)),
            PageError::NotAligned {
                value: g + 1,
                granularity: g
            }
        );
        let huge = usize::MAX / g * g;
        assert_eq!(
            invalid(b.reserve(huge)),
            PageError::TooLarge { bytes: huge }
        );
        // The kernel's refusal is an OS error, not a panic.
        let big = (isize::MAX as usize) / 2 / g * g;
        assert!(matches!(
            b.reserve(big),
            Err(HostPageError::Os { call: "mmap", .. })
        ));

        let mut r = b.reserve(4 * g).unwrap();
        let mut pages = Vec::new();
        b.create_pages(3, &mut pages).unwrap();
        assert_eq!(invalid(b.map(&mut r, 0, &[])), PageError::ZeroSize);
        assert_eq!(
            invalid(b.map(&mut r, 1, &pages[..1])),
            PageError::NotAligned {
                value: 1,
                granularity: g
            }
        );
        assert_eq!(
            invalid(b.map(&mut r, 2 * g, &pages)),
            PageError::OutOfRange {
                offset: 2 * g,
                count: 3,
                len: 4 * g
            }
        );
        let far = usize::MAX / g * g;
        assert_eq!(
            invalid(b.map(&mut r, far, &pages[..1])),
            PageError::OutOfRange {
                offset: far,
                count: 1,
                len: 4 * g
            }
        );
        b.map(&mut r, g, &pages[..1]).unwrap();
        assert_eq!(
            invalid(b.map(&mut r, 0, &pages[1..])),
            PageError::SlotMapped { offset: g }
        );
        assert_eq!(
            invalid(b.map(&mut r, 2 * g, &pages[..1])),
            PageError::PageMapped
        );
        let spare = [pages.remove(1)];
        // SAFETY: nothing uses the range (for every call below).
        unsafe {
            assert_eq!(
                invalid(b.unmap(&mut r, 0, 1)),
                PageError::SlotUnmapped { offset: 0 }
            );
            assert_eq!(invalid(b.unmap(&mut r, g, 0)), PageError::ZeroSize);
            assert_eq!(
                invalid(b.unmap(&mut r, g, 2)),
                PageError::SlotUnmapped { offset: 2 * g }
            );
        }
        assert_eq!(r.mapped_pages(), 1, "failed calls change nothing");
        // Releasing a mapped page is refused; the page is kept.
        let mapped = pages.remove(0);
        // SAFETY: deliberately breaks the contract: the backend checks it.
        let refused = unsafe { b.release_page(mapped) };
        assert_eq!(invalid(refused), PageError::PageMapped);
        // Foreign handles.
        let mut other = HostPages::with_os_pages().unwrap();
        let mut theirs = other.reserve(g).unwrap();
        assert_eq!(
            invalid(other.map(&mut theirs, 0, &spare)),
            PageError::ForeignHandle
        );
        assert_eq!(
            invalid(b.map(&mut theirs, 0, &spare)),
            PageError::ForeignHandle
        );
        // SAFETY: nothing uses the ranges; `spare` and `pages` are unmapped
        // (`pages[0]`, mapped, was kept by the refusal above).
        unsafe {
            assert_eq!(invalid(b.release_range(theirs)), PageError::ForeignHandle);
            let [t] = spare;
            b.release_page(t).unwrap();
            b.release_range(r).unwrap();
            for p in pages {
                b.release_page(p).unwrap();
            }
        }
        let c = b.counts();
        assert_eq!(
            (
                c.created,
                c.released,
                c.maps,
                c.unmaps,
                c.reserves,
                c.range_frees
            ),
            (3, 2, 1, 1, 1, 1)
        );
    }

    /// The kernel's mapping count stays bounded under churn: thousands of
    /// runs of 1 to 32 pages mapped and unmapped at random places of one
    /// reservation, their pages fresh (made as a run) or reused (idle pages,
    /// by file offset). Each run of file-contiguous pages is one mapping,
    /// and the `PROT_NONE` gaps between them merge: the reservation holds at
    /// most two mappings a run plus one, and one when nothing is mapped.
    #[test]
    #[cfg_attr(miri, ignore)] // mmap and memfd: FFI
    fn the_mapping_count_stays_bounded_under_churn() {
        const SLOTS: usize = 2048;
        const ROUNDS: usize = 6000;
        let mut b = HostPages::with_os_pages().unwrap();
        let g = b.granularity();
        let mut r = b.reserve(SLOTS * g).unwrap();
        let (before, inside) = mappings(&r);
        assert_eq!(inside, 1);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut used = vec![false; SLOTS];
        // Live runs: (first slot, pages); idle pages.
        let mut live: Vec<(usize, Vec<HostPage>)> = Vec::new();
        let mut idle: Vec<HostPage> = Vec::new();
        let (mut most_inside, mut most_total, mut most_runs) = (0, 0, 0);
        for round in 0..ROUNDS {
            if live.len() < 40 && rng.below(2) == 0 {
                let n = 1 + rng.below(32) as usize;
                let at = rng.below(SLOTS as u64) as usize;
                let Some(first) = (at..SLOTS - n + 1)
                    .chain(0..at.min(SLOTS - n + 1))
                    .find(|&s| used[s..s + n].iter().all(|u| !u))
                else {
                    continue;
                };
                let mut pages = Vec::new();
                if idle.len() >= n && rng.below(2) == 0 {
                    idle.sort();
                    let k = rng.below((idle.len() - n + 1) as u64) as usize;
                    pages.extend(idle.drain(k..k + n));
                } else {
                    b.create_pages(n, &mut pages).unwrap();
                }
                b.map(&mut r, first * g, &pages).unwrap();
                // SAFETY: the run's first byte is mapped.
                unsafe { fill(&r, first * g, 1, round as u8) };
                used[first..first + n].fill(true);
                live.push((first, pages));
            } else if !live.is_empty() {
                let (first, pages) = live.swap_remove(rng.below(live.len() as u64) as usize);
                // SAFETY: nothing uses the run any more.
                unsafe { b.unmap(&mut r, first * g, pages.len()).unwrap() };
                used[first..first + pages.len()].fill(false);
                if rng.below(2) == 0 {
                    idle.extend(pages);
                } else {
                    for p in pages {
                        // SAFETY: `p` is unmapped.
                        unsafe { b.release_page(p).unwrap() };
                    }
                }
            }
            if round % 25 == 0 {
                let (total, inside) = mappings(&r);
                // Runs of pages at consecutive file offsets in the range.
                let file_runs: usize = live
                    .iter()
                    .map(|(_, p)| {
                        1 + p
                            .windows(2)
                            .filter(|w| w[1].file_offset() != w[0].file_offset() + g as u64)
                            .count()
                    })
                    .sum();
                assert!(
                    inside <= 2 * file_runs + 1,
                    "{inside} mappings for {file_runs} runs"
                );
                most_inside = most_inside.max(inside);
                most_total = most_total.max(total);
                most_runs = most_runs.max(file_runs);
            }
        }
        for (first, pages) in live.drain(..) {
            // SAFETY: nothing uses the run any more.
            unsafe { b.unmap(&mut r, first * g, pages.len()).unwrap() };
            idle.extend(pages);
        }
        let (after, inside) = mappings(&r);
        assert_eq!(inside, 1, "an empty reservation is one mapping again");
        let c = b.counts();
        println!(
            "mappings under churn ({} maps, {} unmaps of {} runs): at most {most_inside} in the reservation \
             ({most_runs} file runs), at most {most_total} in the process (before {before}, after {after})",
            c.maps, c.unmaps, c.set_access
        );
        assert!(c.set_access > 1000);
        // Other tests run beside this one: allow for their mappings.
        assert!(
            most_total <= before + 2 * most_runs + 1 + 500,
            "{most_total} against {before}"
        );
        // SAFETY: nothing uses the range; every page is unmapped.
        unsafe {
            b.release_range(r).unwrap();
            for p in idle {
                b.release_page(p).unwrap();
            }
        }
        assert_eq!(b.file_bytes().unwrap(), 0);
        let c = b.counts();
        assert_eq!(
            (c.created, c.maps, c.reserves),
            (c.released, c.unmaps, c.range_frees)
        );
    }
}

#[test]
fn modelled_calls_are_counted_and_charged() {
    let g = 2 << 20;
    let mut b = ModelPages::new(g).unwrap();
    let mut r = b.reserve(64 * g).unwrap();
    assert_eq!(r.address() % g, 0);
    let mut pages = Vec::new();
    b.create_pages(5, &mut pages).unwrap();
    b.map(&mut r, 0, &pages[..3]).unwrap();
    b.map(&mut r, 10 * g, &pages[3..]).unwrap();
    // SAFETY: nothing uses the range.
    unsafe { b.unmap(&mut r, 0, 3).unwrap() };
    b.map(&mut r, 20 * g, &pages[..3]).unwrap();
    // SAFETY: nothing uses the range; its pages are unmapped with it.
    unsafe {
        b.release_range(r).unwrap();
        for p in pages {
            b.release_page(p).unwrap();
        }
    }
    b.validate_released().unwrap();
    let c = b.counts();
    let want = PageCounts {
        created: 5,
        released: 5,
        maps: 8,
        unmaps: 8,
        set_access: 3,
        unmap_calls: 2,
        reserves: 1,
        range_frees: 1,
        fences: 0,
        waits: 0,
    };
    assert_eq!(c, want);
    // cca_sim.py's VMM_* constants, in microseconds.
    let us = 5.0 * 193.0 + 5.0 * 25.6 + 8.0 * 1.45 + 3.0 * 36.0 + 8.0 * 25.6 + 19.0;
    let t = b.modelled_time();
    assert_eq!(t, PageCosts::PUBLISHED.charge(&c));
    assert!(
        (t.as_secs_f64() * 1e6 - us).abs() < 1e-6,
        "{t:?} against {us} us"
    );
    // Expandable segments' map_block of n pages: n (create + map) + one set access.
    let es = PageCounts {
        created: 4,
        maps: 4,
        set_access: 1,
        ..PageCounts::default()
    };
    assert_eq!(
        PageCosts::PUBLISHED.charge(&es),
        Duration::from_nanos(4 * (193_000 + 1_450) + 36_000)
    );
    assert!(b.to_string().starts_with("created 5, released 5, maps 8"));
}

#[test]
fn modelled_refusals() {
    assert_eq!(ModelPages::new(0).unwrap_err(), PageError::ZeroSize);
    let g = 4096;
    let mut b = ModelPages::new(g).unwrap().with_capacity(3 * g);
    assert_eq!(b.reserve(0).unwrap_err(), PageError::ZeroSize);
    assert_eq!(
        b.reserve(g - 1).unwrap_err(),
        PageError::NotAligned {
            value: g - 1,
            granularity: g
        }
    );
    assert_eq!(
        b.reserve(usize::MAX / g * g).unwrap_err(),
        PageError::TooLarge {
            bytes: usize::MAX / g * g
        }
    );
    let mut r = b.reserve(4 * g).unwrap();
    let mut pages = Vec::new();
    b.create_pages(3, &mut pages).unwrap();
    assert_eq!(
        b.create_page().unwrap_err(),
        PageError::OutOfMemory { capacity: 3 * g }
    );
    assert_eq!(b.map(&mut r, 0, &[]).unwrap_err(), PageError::ZeroSize);
    assert_eq!(
        b.map(&mut r, 8, &pages[..1]).unwrap_err(),
        PageError::NotAligned {
            value: 8,
            granularity: g
        }
    );
    assert_eq!(
        b.map(&mut r, 2 * g, &pages).unwrap_err(),
        PageError::OutOfRange {
            offset: 2 * g,
            count: 3,
            len: 4 * g
        }
    );
    assert_eq!(
        b.map(&mut r, usize::MAX / g * g, &pages).unwrap_err(),
        PageError::OutOfRange {
            offset: usize::MAX / g * g,
            count: 3,
            len: 4 * g
        }
    );
    b.map(&mut r, g, &pages[..2]).unwrap();
    assert_eq!(b.map(&mut r, 0, &pages[2..]).map(|_| ()), Ok(()));
    assert_eq!(
        b.map(&mut r, 3 * g, &pages[..1]).unwrap_err(),
        PageError::PageMapped
    );
    assert_eq!(
        b.map(&mut r, 2 * g, &pages[2..]).unwrap_err(),
        PageError::SlotMapped { offset: 2 * g }
    );
    // SAFETY: nothing uses the range (for every call below).
    unsafe {
        assert_eq!(
            b.unmap(&mut r, 3 * g, 1).unwrap_err(),
            PageError::SlotUnmapped { offset: 3 * g }
        );
        assert_eq!(b.unmap(&mut r, 0, 0).unwrap_err(), PageError::ZeroSize);
        assert_eq!(
            b.unmap(&mut r, 2 * g, 2).unwrap_err(),
            PageError::SlotUnmapped { offset: 3 * g }
        );
    }
    assert_eq!(r.mapped_pages(), 3);
    b.validate().unwrap();
    // A page released while mapped: refused and kept, and the leak found.
    let kept = pages.pop().unwrap();
    // SAFETY: deliberately breaks the contract: the modelled backend checks it.
    let refused = unsafe { b.release_page(kept) };
    assert_eq!(refused.unwrap_err(), PageError::PageMapped);
    // Handles of another backend.
    let mut other = ModelPages::new(g).unwrap();
    let theirs = other.create_page().unwrap();
    let mut their_range = other.reserve(g).unwrap();
    assert_eq!(
        b.map(&mut r, 3 * g, core::slice::from_ref(&theirs))
            .unwrap_err(),
        PageError::ForeignHandle
    );
    assert_eq!(
        b.map(&mut their_range, 0, &pages[..1]).unwrap_err(),
        PageError::ForeignHandle
    );
    // SAFETY: nothing uses the ranges; the pages are unmapped with `r`.
    unsafe {
        assert_eq!(
            b.release_page(theirs).unwrap_err(),
            PageError::ForeignHandle
        );
        assert_eq!(
            b.release_range(their_range).unwrap_err(),
            PageError::ForeignHandle
        );
        b.release_range(r).unwrap();
        for p in pages {
            b.release_page(p).unwrap();
        }
    }
    b.validate().unwrap();
    let err = b.validate_released().unwrap_err();
    assert!(err.contains("1 pages and 0 reservations left"), "{err}");
}

/// A simple model of the backend: which pages live and where they are
/// mapped, which slots of each range show which page.
#[derive(Default)]
struct Model {
    /// Per page number: live, and where mapped `(range, slot)`.
    pages: Vec<Option<Option<(usize, usize)>>>,
    /// Per range: its slots (a page number or none), or `None` once freed.
    ranges: Vec<Option<Vec<Option<u32>>>>,
    counts: PageCounts,
}

/// Random sequences of create / map / unmap / release / reserve / free on
/// the modelled backend, against [`Model`]: every call's outcome (which
/// error), the counts, and `validate` after every step; at the end
/// everything is released and `validate_released` passes.
#[test]
fn modelled_backend_against_a_model() {
    let rounds = if cfg!(miri) { 150 } else { 20_000 };
    for seed in [1u64, 0xDEAD_BEEF, 0x1234_5678_9ABC] {
        let g = 4096;
        let capacity = 48;
        let mut b = ModelPages::new(g).unwrap().with_capacity(capacity * g);
        let mut m = Model::default();
        let mut rng = Rng(seed);
        // Live handles: pages held (unmapped or not), ranges (with their model index).
        let mut held: Vec<ModelPage> = Vec::new();
        let mut ranges: Vec<(usize, ModelRange)> = Vec::new();
        for _ in 0..rounds {
            match rng.below(10) {
                0 if ranges.len() < 4 => {
                    let slots = 1 + rng.below(24) as usize;
                    let r = b.reserve(slots * g).unwrap();
                    m.ranges.push(Some(vec![None; slots]));
                    m.counts.reserves += 1;
                    ranges.push((m.ranges.len() - 1, r));
                }
                1 if !ranges.is_empty() && rng.below(4) == 0 => {
                    let (ri, r) = ranges.swap_remove(rng.below(ranges.len() as u64) as usize);
                    // SAFETY: nothing uses the range.
                    unsafe { b.release_range(r).unwrap() };
                    let slots = m.ranges[ri].take().unwrap();
                    let n = slots.iter().flatten().count() as u64;
                    for p in slots.into_iter().flatten() {
                        m.pages[p as usize] = Some(None);
                    }
                    if n > 0 {
                        m.counts.unmaps += n;
                        m.counts.unmap_calls += 1;
                    }
                    m.counts.range_frees += 1;
                }
                2 | 3 => {
                    let n = 1 + rng.below(4) as usize;
                    let live = m.pages.iter().flatten().count();
                    let mut out = Vec::new();
                    let res = b.create_pages(n, &mut out);
                    let fits = (capacity - live).min(n);
                    assert_eq!(out.len(), fits);
                    assert_eq!(res.is_err(), fits < n);
                    if fits < n {
                        assert_eq!(
                            res.unwrap_err(),
                            PageError::OutOfMemory {
                                capacity: capacity * g
                            }
                        );
                    }
                    for p in out {
                        let i = p.index() as usize;
                        if m.pages.len() <= i {
                            m.pages.resize(i + 1, None);
                        }
                        assert!(m.pages[i].is_none(), "page number {i} is live already");
                        m.pages[i] = Some(None);
                        m.counts.created += 1;
                        held.push(p);
                    }
                }
                4 | 5 if !ranges.is_empty() && !held.is_empty() => {
                    let k = rng.below(ranges.len() as u64) as usize;
                    let (ri, r) = &mut ranges[k];
                    let len = m.ranges[*ri].as_ref().unwrap().len();
                    let n = (1 + rng.below(4) as usize).min(held.len());
                    let start = rng.below(held.len() as u64 - n as u64 + 1) as usize;
                    let slot = rng.below(len as u64 + 1) as usize;
                    let res = b.map(r, slot * g, &held[start..start + n]);
                    let slots = m.ranges[*ri].as_mut().unwrap();
                    let run = &held[start..start + n];
                    let want = if slot + n > len {
                        Err(PageError::OutOfRange {
                            offset: slot * g,
                            count: n,
                            len: len * g,
                        })
                    } else if let Some(s) = (slot..slot + n).find(|&s| slots[s].is_some()) {
                        Err(PageError::SlotMapped { offset: s * g })
                    } else if run
                        .iter()
                        .any(|p| m.pages[p.index() as usize] != Some(None))
                    {
                        Err(PageError::PageMapped)
                    } else {
                        Ok(())
                    };
                    assert_eq!(res, want);
                    if want.is_ok() {
                        for (i, p) in run.iter().enumerate() {
                            slots[slot + i] = Some(p.index());
                            m.pages[p.index() as usize] = Some(Some((*ri, slot + i)));
                        }
                        m.counts.maps += n as u64;
                        m.counts.set_access += 1;
                    }
                }
                6 | 7 if !ranges.is_empty() => {
                    let k = rng.below(ranges.len() as u64) as usize;
                    let (ri, r) = &mut ranges[k];
                    let slots = m.ranges[*ri].as_mut().unwrap();
                    let len = slots.len();
                    let slot = rng.below(len as u64) as usize;
                    let n = 1 + rng.below((len - slot) as u64) as usize;
                    // SAFETY: nothing uses the range.
                    let res = unsafe { b.unmap(r, slot * g, n) };
                    let want = match (slot..slot + n).find(|&s| slots[s].is_none()) {
                        Some(s) => Err(PageError::SlotUnmapped { offset: s * g }),
                        None => Ok(()),
                    };
                    assert_eq!(res, want);
                    if want.is_ok() {
                        for s in &mut slots[slot..slot + n] {
                            m.pages[s.take().unwrap() as usize] = Some(None);
                        }
                        m.counts.unmaps += n as u64;
                        m.counts.unmap_calls += 1;
                    }
                }
                8 | 9 if !held.is_empty() => {
                    let k = rng.below(held.len() as u64) as usize;
                    let i = held[k].index() as usize;
                    // Only pages that are not mapped: the contract.
                    if m.pages[i] == Some(None) {
                        let p = held.swap_remove(k);
                        // SAFETY: `p` is not mapped (the model says).
                        unsafe { b.release_page(p).unwrap() };
                        m.pages[i] = None;
                        m.counts.released += 1;
                    }
                }
                _ => {}
            }
            assert_eq!(b.counts(), m.counts);
            b.validate().unwrap();
            for (ri, r) in &ranges {
                let slots = m.ranges[*ri].as_ref().unwrap();
                assert_eq!(r.mapped_pages(), slots.iter().flatten().count());
            }
        }
        // SAFETY: nothing uses the ranges; their pages are unmapped with them.
        unsafe {
            for (_, r) in ranges {
                b.release_range(r).unwrap();
            }
            for p in held {
                b.release_page(p).unwrap();
            }
        }
        b.validate_released().unwrap();
        let c = b.counts();
        assert!(
            c.maps > 0 && c.unmaps == c.maps && c.created == c.released,
            "{c}"
        );
    }
}
