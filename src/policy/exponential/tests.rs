//! The unit tests of [`Exponential`](super::Exponential): its ratio, its
//! plans and their watches, exactly.

use super::{EvictionPolicy, Exponential, Oldest, float};
use core::time::Duration;

/// A hit leaves the ratio as it is; a release sets it to `ratio + (1 -
/// ratio) * (size / after)`, which leaves a ratio of 1 (the allowance
/// is then the bytes cached) and makes one after an empty cache.
#[test]
fn a_hit_keeps_the_ratio_and_a_release_adds_its_size() {
    let mut p = Exponential::new(Duration::from_secs(1));
    let t = Duration::from_millis(3);
    p.on_release(Duration::ZERO, 3, 3);
    p.on_release(Duration::ZERO, 7, 10);
    p.on_release(Duration::ZERO, 11, 21);
    assert_eq!(p.ratio, 1.0);
    // A hit decays nothing: the ratio stays as of the last release.
    p.on_hit(t, 7, 21, 14);
    p.on_hit(t, 11, 14, 3);
    assert_eq!(p.ratio, 1.0);
    assert_eq!(p.at, Duration::ZERO);
    // The release decays it first, to no round number, then adds.
    p.on_release(t, 11, 14);
    let r = (-0.003f64).exp2();
    let expected = r + (1.0 - r) * (float(11) / float(14));
    assert_eq!(p.ratio.to_bits(), expected.to_bits());
    // Hits keep that ratio too.
    p.on_hit(t, 11, 14, 3);
    assert_eq!(p.ratio.to_bits(), expected.to_bits());
    // A hit that empties the cache, then a release: a ratio of 1.
    p.on_hit(t, 3, 3, 0);
    p.on_release(t, 5, 5);
    assert_eq!(p.ratio, 1.0);
    p.on_release(t, 1 << 40, (1 << 40) + 5);
    assert_eq!(p.ratio, 1.0);
}

/// Round trips at a stopped clock after a tick decayed the ratio take
/// it back towards 1; the release that brings it within `NEAR_ONE`
/// makes it exactly 1, where the releases after it compute nothing.
/// (Rounded, the steps would stop `3.6e-15` below 1, short of it.)
#[test]
fn releases_take_a_decayed_ratio_to_exactly_one() {
    use super::NEAR_ONE;
    let (size, n) = (1024usize, 64usize);
    let bytes = size * n;
    let mut p = Exponential::new(Duration::from_secs(1));
    for i in 1..=n {
        p.on_release(Duration::ZERO, size, size * i);
    }
    assert_eq!(p.ratio, 1.0);
    let t = Duration::from_millis(1);
    let mut releases = 0;
    p.on_hit(t, size, bytes, bytes - size);
    // The next release would decay it first (a hit decays nothing).
    p.rebase(t);
    assert!(p.ratio < 1.0 - 1e-4, "decayed by a tick");
    while p.ratio != 1.0 {
        if releases > 0 {
            p.on_hit(t, size, bytes, bytes - size);
        }
        let before = p.ratio;
        p.on_release(t, size, bytes);
        releases += 1;
        let step = before + (1.0 - before) * (float(size) / float(bytes));
        if p.ratio == 1.0 {
            assert!(1.0 - step <= NEAR_ONE, "made 1 from {before:e}");
        } else {
            assert_eq!(p.ratio.to_bits(), step.to_bits(), "release {releases}");
            assert!(
                p.ratio > before,
                "release {releases}: stopped at {before:e}"
            );
        }
        assert!(
            releases < 2000,
            "{releases} releases: still at {:e}",
            p.ratio
        );
    }
    assert_eq!(releases, 1299);
    // At 1 the release compares the bytes with `limit`, and nothing more.
    assert!(p.limit > bytes);
    for _ in 0..10 {
        p.on_hit(t, size, bytes, bytes - size);
        p.on_release(t, size, bytes);
        assert_eq!(p.ratio, 1.0);
    }
}

/// Above a ratio of 1, with so many bytes cached beside `half` that the
/// rounded allowance of a hit may come out over the clamp, a hit goes
/// out of line (`try_on_hit` answers `false`) and `on_hit` checks the
/// rounded product: here `(1 + 2^-52) * 2^60` rounds to `2^60 + 256`,
/// over the clamp `2^60 + 64`, so the deadline is stale. At a ratio of
/// 1 only a hit that empties the cache goes out of line.
#[test]
fn a_hit_near_the_clamp_goes_out_of_line_and_checks_it() {
    let t = Duration::ZERO;
    let bytes = 1usize << 60;
    let mut p = Exponential::new(Duration::from_secs(1));
    p.ratio = 1.0 + f64::EPSILON;
    p.half = 64.0;
    p.watch = 0.5;
    p.stale = false;
    p.oldest_size = 4096;
    p.set_hit_check(bytes + 128);
    assert!(!p.try_on_hit(t, 128, bytes + 128, bytes));
    p.on_hit(t, 128, bytes + 128, bytes);
    assert!(p.stale, "the rounded allowance is over the clamp");
    // At a ratio of 1 a hit computes nothing, unless it empties the
    // cache.
    p.ratio = 1.0;
    p.set_hit_check(bytes + 128);
    assert!(p.try_on_hit(t, 128, bytes + 128, bytes));
    assert!(!p.try_on_hit(t, 128, 128, 0));
}

/// A hit reported with nothing cached before it (which the pool never
/// reports: a hit takes a cached block) has a ratio of NaN, which keeps
/// no watch: `try_on_hit` leaves it to `on_hit` and changes nothing,
/// whatever the watch.
#[test]
fn try_on_hit_leaves_a_hit_from_nothing_cached_to_on_hit() {
    let t = Duration::from_secs(1);
    let mut fresh = Exponential::new(Duration::from_secs(1));
    fresh.set_at(t);
    let mut planned = fresh;
    planned.on_release(t, 64, 64);
    planned.on_release(t, 64, 128);
    assert!(!planned.must_evict(
        t,
        Oldest {
            released_at: t,
            size: 64
        },
        128
    ));
    assert!(!planned.deadline_stale(), "a deadline planned");
    for p in [fresh, planned] {
        let mut q = p;
        assert!(!q.try_on_hit(t, 8, 0, 0));
        assert_eq!(q, p);
    }
}

/// `try_on_hit` either does what `on_hit` does, to the bit, or changes
/// nothing and answers `false`; over random releases, hits,
/// collections and clock steps (a stopped clock between most of them,
/// so that deadlines are planned and hits take both answers).
#[test]
fn try_on_hit_does_what_on_hit_does_or_nothing() {
    use super::FreeReason;
    let mut next = crate::test_rng::rng(0x9e37_79b9_7f4a_7c15u64);
    let sizes = [8, 16, 64, 100, 4096];
    let (mut inline, mut out_of_line) = (0, 0);
    for half_life in [Duration::from_millis(5), Duration::from_secs(1)] {
        let mut p = Exponential::new(half_life);
        let mut q = p;
        let mut cached: Vec<Oldest> = Vec::new();
        let mut bytes = 0;
        let mut now = Duration::ZERO;
        // Under Miri a twentieth: the policy holds no unsafe code, and the
        // branches are all reached in a thousand steps.
        for _ in 0..if cfg!(miri) { 1_000 } else { 20_000 } {
            match next(10) {
                0..=3 => {
                    let size = sizes[next(sizes.len() as u64) as usize];
                    cached.push(Oldest {
                        released_at: now,
                        size,
                    });
                    bytes += size;
                    p.on_release(now, size, bytes);
                    q.on_release(now, size, bytes);
                }
                4..=7 if !cached.is_empty() => {
                    let block = cached.remove(next(cached.len() as u64) as usize);
                    let before = bytes;
                    bytes -= block.size;
                    p.on_hit(now, block.size, before, bytes);
                    let untouched = q;
                    if q.try_on_hit(now, block.size, before, bytes) {
                        inline += 1;
                    } else {
                        assert_eq!(q, untouched, "a `false` changed the policy");
                        q.on_hit(now, block.size, before, bytes);
                        out_of_line += 1;
                    }
                }
                8 => {
                    while let Some(&oldest) = cached.first() {
                        let due = p.must_evict(now, oldest, bytes);
                        assert_eq!(due, q.must_evict(now, oldest, bytes));
                        if !due {
                            break;
                        }
                        cached.remove(0);
                        bytes -= oldest.size;
                        p.on_free(now, oldest.size, bytes, FreeReason::Expired);
                        q.on_free(now, oldest.size, bytes, FreeReason::Expired);
                    }
                }
                _ => now += Duration::from_micros(next(300)),
            }
            assert_eq!(p, q);
            assert_eq!(p.ratio.to_bits(), q.ratio.to_bits());
        }
    }
    let least = if cfg!(miri) { 50 } else { 1000 };
    assert!(
        inline > least && out_of_line > least,
        "{inline} / {out_of_line}"
    );
}

/// A long half-life, so that the deadlines of [`clamped`] (a 2^-23 of
/// it ahead) are far more than a nanosecond.
const LONG: Duration = Duration::from_secs(1 << 20);

/// Blocks of `x`, `a` and `big` bytes released at one time, the first
/// evicted half a half-life ([`LONG`]) later; the allowance is then
/// clamped to `bytes + a / 2` (the next oldest is `a`), nothing is due,
/// and a deadline is planned. Returns the policy, the bytes cached,
/// the time and the oldest block.
fn clamped(x: usize, a: usize, big: usize) -> (Exponential, usize, Duration, Oldest) {
    use super::FreeReason;
    let t0 = Duration::from_secs(1);
    let mut p = Exponential::new(LONG);
    p.set_at(t0);
    let mut bytes = 0;
    for size in [x, a, big] {
        bytes += size;
        p.on_release(t0, size, bytes);
    }
    let t1 = t0 + LONG / 2;
    let oldest = |size| Oldest {
        released_at: t0,
        size,
    };
    assert!(p.must_evict(t1, oldest(x), bytes));
    bytes -= x;
    p.on_free(t1, x, bytes, FreeReason::Expired);
    assert!(!p.must_evict(t1, oldest(a), bytes));
    let bound = bytes as f64 + (a / 2) as f64;
    assert_eq!(p.ratio, super::clamp_ratio(bound, bytes as f64));
    assert!(p.ratio * bytes as f64 <= bound);
    assert!(
        p.provisional_deadline(oldest(a))
            .is_some_and(|due| due > t1)
    );
    (p, bytes, t1, oldest(a))
}

/// Whether `p` holds a deadline for `oldest` at `now`; if so, asserts
/// that a collection the pool skips then would have changed nothing:
/// `must_evict` answers `false` and leaves the allowance as it was,
/// unclamped (the model's check of every skipped collection).
fn holds_and_skips_nothing(p: Exponential, now: Duration, oldest: Oldest, bytes: usize) -> bool {
    let Some(due) = p.provisional_deadline(oldest) else {
        return false;
    };
    assert!(now < due);
    let mut asked = p;
    assert!(!asked.must_evict(now, oldest, bytes));
    assert_eq!(
        asked.ratio.to_bits(),
        p.ratio.to_bits(),
        "with {bytes} bytes cached, a collection skipped until {due:?} clamps the ratio {} \
         to {}",
        p.ratio,
        asked.ratio
    );
    true
}

/// A clamp leaves the allowance on (or an ulp under) `bytes + half`
/// with 2^63 bytes cached, where an ulp is 2048 bytes, and a deadline
/// is planned; releases then move the ratio and round the allowance,
/// which could leave it above the clamp. Two releases of each of many
/// sizes from that state (300 under Miri, else 5000) either keep a
/// deadline whose skipped collections would not clamp, or lose it.
/// (With the allowance kept as a ratio, every one keeps it here; the
/// allowance as a sum, before, lost it at the second release of 1025
/// bytes.)
#[test]
fn a_release_from_a_clamped_allowance_keeps_only_a_deadline_that_holds() {
    let (p, bytes, now, oldest) = clamped(1 << 62, 1 << 40, (1 << 63) + 1);
    let (mut kept, mut lost) = (0, 0);
    // Fewer under Miri, which runs this a thousand times slower.
    let sizes = if cfg!(miri) { 300 } else { 5000 };
    for size in (1..=sizes).map(|i| 1000 + 7 * i) {
        let mut q = p;
        let mut b = bytes;
        let mut held = true;
        for _ in 0..2 {
            b += size;
            q.on_release(now, size, b);
            held &= holds_and_skips_nothing(q, now, oldest, b);
        }
        if held {
            kept += 1;
        } else {
            lost += 1;
        }
    }
    assert!(kept > 0, "{kept} kept, {lost} lost");
}

/// The same for a hit: with the allowance clamped to `bytes + half`,
/// 2^61.7 bytes cached (an ulp of 512) and a `half` that is no
/// multiple of an ulp, the ratio is above 1, so a hit checks the
/// product of the ratio and the bytes left (rounded) against the clamp
/// at `after`. Every hit of 1 byte to about 2^52 bytes (300 sizes
/// under Miri, else 5000) from that state either keeps a deadline
/// whose skipped collections would not clamp, or loses it. (The ratio
/// is clamped so that its product with the bytes is within the clamp;
/// in these runs every hit keeps the deadline.)
#[test]
fn a_hit_from_a_clamped_allowance_keeps_only_a_deadline_that_holds() {
    let (p, bytes, now, oldest) = clamped(1 << 62, 2_459_860_883_968, 3_768_991_187_054_580_519);
    let (mut kept, mut lost) = (0, 0);
    // Fewer under Miri, which runs this a thousand times slower.
    let sizes = if cfg!(miri) { 300 } else { 5000 };
    for i in 1..=sizes {
        // Sizes from one byte to about 2^52, where an ulp of the
        // product is no longer small beside the clamp's slack.
        let size = i * i * i * 1_000_000 / 31;
        let size = size.max(i);
        let mut q = p;
        let after = bytes - size;
        if !q.try_on_hit(now, size, bytes, after) {
            q.on_hit(now, size, bytes, after);
        }
        if holds_and_skips_nothing(q, now, oldest, after) {
            kept += 1;
        } else {
            lost += 1;
        }
    }
    assert!(kept > 0, "{kept} kept, {lost} lost");
}

/// Planning backs off while releases make each plan stale before the
/// next collection with the clock moving, and plans again at every
/// collection once a plan lasts.
#[test]
fn plans_back_off_while_releases_kill_them() {
    let h = Duration::from_secs(1000);
    let mut p = Exponential::new(h);
    let oldest = Oldest {
        released_at: Duration::ZERO,
        size: 4096,
    };
    let mut bytes = 4096;
    p.on_release(Duration::ZERO, 4096, bytes);
    let mut planned = Vec::new();
    for i in 1..=40u64 {
        let now = Duration::from_micros(i);
        assert!(!p.must_evict(now, oldest, bytes));
        planned.push(p.provisional_deadline(oldest).is_some());
        // A release of a block of a quarter of the cache or more: the
        // deadline comes sooner, by more than a plan leaves in hand.
        let size = (bytes / 4).max(1 << 20);
        bytes += size;
        p.on_release(now, size, bytes);
        assert!(p.deadline_stale());
    }
    let plans = planned.iter().filter(|&&x| x).count();
    assert!(planned[0] && planned[1], "{planned:?}");
    assert!(plans <= 8, "{plans} plans in 40 collections: {planned:?}");
    // Without releases, the plan made after the backoff lasts until
    // the pool asks again, which resets it: every collection plans.
    let mut now = Duration::from_micros(41);
    let mut lasted = 0;
    for _ in 0..200 {
        now += Duration::from_micros(1);
        if p.must_evict(now, oldest, bytes) {
            break;
        }
        if p.provisional_deadline(oldest).is_some() {
            lasted += 1;
            assert!(!p.deadline_stale());
            assert!(!p.must_evict(now, oldest, bytes));
            assert!(p.provisional_deadline(oldest).is_some());
        }
    }
    assert!(lasted > 100, "{lasted}");
}

/// The hooks tell a later time from an earlier one beyond 584 years,
/// where whole nanoseconds no longer fit a `u64`.
#[test]
fn the_allowance_decays_beyond_584_years() {
    let mut p = Exponential::new(Duration::from_secs(1));
    let far = Duration::from_secs(u64::MAX / 2);
    p.on_release(far, 8, 8);
    p.on_release(far, 8, 16);
    assert_eq!(p.ratio * 16.0, 16.0);
    p.on_release(far + Duration::from_secs(1), 8, 24);
    assert_eq!(p.ratio * 24.0, 16.0);
    assert_eq!(p.at, far + Duration::from_secs(1));
    p.on_release(far + Duration::from_secs(1), 8, 32);
    assert_eq!(p.ratio * 32.0, 24.0);
}

/// The signed conversion rounds every `usize` as `as f64` does,
/// including above `i64::MAX` and at the halfway points of `f64`.
#[test]
fn float_rounds_as_the_unsigned_conversion() {
    let mut edges = vec![0usize, 1, 2, (1 << 53) - 1, 1 << 53, (1 << 53) + 1];
    for top in [i64::MAX as usize, usize::MAX] {
        // Fewer under Miri, which runs this a thousand times slower.
        for d in 0..if cfg!(miri) { 16 } else { 2050usize } {
            edges.push(top - d);
        }
    }
    for k in 54..64 {
        let base = 1usize << k;
        let ulp = 1usize << (k - 52);
        for x in [
            base + ulp / 2,
            base + ulp / 2 + 1,
            base + ulp + ulp / 2,
            base - 1,
        ] {
            edges.push(x);
        }
    }
    let mut x: u64 = 1;
    for _ in 0..if cfg!(miri) { 500 } else { 100_000 } {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        edges.push(x as usize);
        edges.push((x >> (x % 64)) as usize);
    }
    for v in edges {
        assert_eq!(float(v).to_bits(), (v as f64).to_bits(), "{v}");
    }
}

/// A release below `steady` stores its ratio and nothing else, so the
/// watch it keeps must still hold at the new ratio: after every
/// operation of caches of a few thousand mixed blocks, a clock that
/// ticks every few hundred round trips (decaying the ratio below 1,
/// and the blocks that decay frees leaving it above 1), a watch still
/// kept satisfies `ratio * bytes > (bytes - half) * watch` (up to the
/// rounding of the test itself) and sits within the clamp, and every
/// collection its deadline lets the pool skip decides nothing (a copy
/// of the policy asked `must_evict` answers `false`). Also counts that
/// releases took the early return both below and above a ratio of 1.
#[test]
#[cfg_attr(miri, ignore)] // thousands of steps of safe arithmetic: too slow under Miri
fn a_kept_watch_holds_after_releases_near_a_ratio_of_one() {
    use super::FreeReason;
    use std::collections::VecDeque;
    let mut next = crate::test_rng::rng(0x2545_f491_4f6c_dd1du64);
    let (mut early_below, mut early_above, mut kept) = (0u32, 0u32, 0u32);
    // `steady` claims no more than it should: with a watch kept, the
    // watch holds just below it at the ratio now (below 1) or at 1
    // (from 1 up, where the allowance is also within the clamp).
    let steady_holds = |p: &Exponential, case: u32, step: u64| {
        if p.stale || p.steady == 0 || p.steady == usize::MAX {
            return;
        }
        let b = float(p.steady - 1);
        let at = p.ratio.min(1.0);
        assert!(
            at * b >= (b - p.half) * p.watch * (1.0 - 1e-14),
            "case {case} step {step}: the watch fails below `steady` \
             (ratio {:e}, steady {}, half {}, watch {:e})",
            p.ratio,
            p.steady,
            p.half,
            p.watch
        );
        assert!((p.ratio - 1.0) * b + 1e-14 * b <= p.half);
    };
    for case in 0..24u32 {
        let mut p = Exponential::new(Duration::from_millis(100 + next(2000)));
        // Sizes oldest first (the policy reads only the oldest's size).
        let mut cache: VecDeque<usize> = VecDeque::new();
        let mut bytes = 0usize;
        let mut now = Duration::ZERO;
        for _ in 0..500 + next(3000) {
            let s = 512 + next(4096) as usize;
            bytes += s;
            cache.push_back(s);
            p.on_release(now, s, bytes);
        }
        let tick = 50 + next(500);
        for step in 0..6000u64 {
            if step % tick == 0 {
                now += Duration::from_micros(200 + next(1000));
            }
            // Collect, as the pool does: skip while a deadline holds.
            while let Some(&size) = cache.front() {
                let oldest = Oldest {
                    released_at: Duration::ZERO,
                    size,
                };
                if let Some(due) = p.provisional_deadline(oldest) {
                    if now < due {
                        let mut q = p;
                        assert!(
                            !q.must_evict(now, oldest, bytes),
                            "case {case} step {step}: a deadline skipped a due block"
                        );
                        break;
                    }
                }
                if !p.must_evict(now, oldest, bytes) {
                    break;
                }
                cache.pop_front();
                bytes -= size;
                p.on_free(now, size, bytes, FreeReason::Expired);
            }
            steady_holds(&p, case, step);
            // A hit of the newest block, then a release of another size.
            if let Some(s) = cache.pop_back() {
                let before = bytes;
                bytes -= s;
                p.on_hit(now, s, before, bytes);
            }
            let s = 512 + next(4096) as usize;
            bytes += s;
            cache.push_back(s);
            let (ratio, steady) = (p.ratio, p.steady);
            p.on_release(now, s, bytes);
            if bytes < steady && p.at == now && ratio != p.ratio {
                if ratio < 1.0 {
                    early_below += 1;
                } else {
                    early_above += 1;
                }
            }
            steady_holds(&p, case, step);
            if !p.stale {
                kept += 1;
                let b = float(bytes);
                assert!(
                    p.ratio * b >= (b - p.half) * p.watch * (1.0 - 1e-14),
                    "case {case} step {step}: a kept watch that does not hold \
                     (ratio {:e}, bytes {bytes}, half {}, watch {:e})",
                    p.ratio,
                    p.half,
                    p.watch
                );
                assert!(p.ratio * b <= b + p.half, "case {case} step {step}");
            }
        }
    }
    assert!(
        early_below > 1000 && early_above > 1000 && kept > 10_000,
        "the releases took the early return {early_below} times below a ratio \
         of 1 and {early_above} above, with a watch kept {kept} times"
    );
}
