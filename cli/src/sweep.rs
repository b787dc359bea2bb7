//! The Pareto front and the recommendation.

use std::cmp::Ordering;
use std::fmt::Write as _;

use decaying_pool::trace::Report;

use crate::{Budget, human};

/// Two modelled figures (float sums, whose last bits depend on the order
/// the calls were summed in) compared with a relative tolerance of 1e-9:
/// the same calls in another order tie, as they print.
fn cmp_figure(a: f64, b: f64) -> Ordering {
    let tol = 1e-9 * a.abs().max(b.abs()).max(1e-12);
    if (a - b).abs() <= tol {
        Ordering::Equal
    } else {
        a.total_cmp(&b)
    }
}

/// `a` against `b` on each objective, in the order the recommendation
/// ranks them: modelled backing time, idle byte-seconds, peak reserved.
fn objectives(a: &Report, b: &Report) -> [Ordering; 3] {
    [
        cmp_figure(a.modelled_backing_seconds, b.modelled_backing_seconds),
        cmp_figure(a.idle_byte_seconds, b.idle_byte_seconds),
        a.peak_reserved_bytes.cmp(&b.peak_reserved_bytes),
    ]
}

/// `a` against `b` on the remaining columns, which decide between
/// configurations that tie on every objective: fewer backing calls
/// (allocations, then frees), then more hits.
fn remaining(a: &Report, b: &Report) -> Ordering {
    (a.backing_allocs + a.backing_frees)
        .cmp(&(b.backing_allocs + b.backing_frees))
        .then(a.backing_allocs.cmp(&b.backing_allocs))
        .then(b.hits.cmp(&a.hits))
}

/// Whether `a` dominates `b`: no worse on any objective (modelled backing
/// time, peak reserved, idle byte-seconds; figures that tie within 1e-9
/// are equal) and better on one; or tying on all three and better on the
/// remaining columns ([`remaining`]).
fn dominates(a: &Report, b: &Report) -> bool {
    let o = objectives(a, b);
    if o.contains(&Ordering::Greater) {
        return false;
    }
    o.contains(&Ordering::Less) || remaining(a, b) == Ordering::Less
}

/// The indices of the reports on the Pareto front (configurations with
/// failed requests excluded: they did not serve the workload), by
/// backing time. Of configurations equal on every column, the first
/// listed stands for all.
pub(crate) fn pareto(reports: &[Report]) -> Vec<usize> {
    let ok: Vec<usize> = (0..reports.len())
        .filter(|&i| reports[i].failures == 0)
        .collect();
    let (r, same) = (reports, |a: &Report, b: &Report| {
        objectives(a, b) == [Ordering::Equal; 3] && remaining(a, b) == Ordering::Equal
    });
    let mut front: Vec<usize> = ok
        .iter()
        .copied()
        .filter(|&i| {
            !ok.iter()
                .any(|&j| j != i && (dominates(&r[j], &r[i]) || (j < i && same(&r[j], &r[i]))))
        })
        .collect();
    front.sort_by(|&a, &b| {
        let o = objectives(&r[a], &r[b]);
        o[0].then(o[2]).then(o[1])
    });
    front
}

/// The budget in bytes for these reports.
fn budget_bytes(budget: Budget, reports: &[Report]) -> f64 {
    match budget {
        Budget::Bytes(b) => b as f64,
        Budget::OfLive(f) => f * reports.first().map_or(0, |r| r.peak_live_bytes) as f64,
    }
}

/// The configuration of the Pareto front with the least modelled backing
/// time whose peak reserved bytes fit the budget (ties, within 1e-9:
/// less idle memory, then less peak, then the remaining columns, then the
/// first listed).
pub(crate) fn best(reports: &[Report], budget: Budget) -> Option<usize> {
    let cap = budget_bytes(budget, reports);
    pareto(reports)
        .into_iter()
        .filter(|&i| reports[i].peak_reserved_bytes as f64 <= cap)
        .min_by(|&a, &b| {
            let (ra, rb) = (&reports[a], &reports[b]);
            let o = objectives(ra, rb);
            o[0].then(o[1])
                .then(o[2])
                .then(remaining(ra, rb))
                .then(a.cmp(&b))
        })
}

/// The Pareto front as a table and the recommendation line.
pub(crate) fn recommend(reports: &[Report], budget: Budget) -> String {
    let mut s = String::new();
    let front = pareto(reports);
    let _ = writeln!(
        s,
        "Pareto front (no configuration is better on backing time, peak reserved and idle byte-seconds at once):"
    );
    let w = front
        .iter()
        .map(|&i| reports[i].policy.chars().count())
        .max()
        .unwrap_or(0);
    for &i in &front {
        let r = &reports[i];
        let _ = writeln!(
            s,
            "  {:<w$}  backing {:>9.3} s  peak reserved {:>10} ({:.2}x live)  idle {:>10.3} MiB·s",
            r.policy,
            r.modelled_backing_seconds,
            human(r.peak_reserved_bytes as f64),
            r.reserved_over_live(),
            r.idle_byte_seconds / (1u64 << 20) as f64,
        );
    }
    let goal = match budget {
        Budget::Bytes(b) => format!("peak reserved within {}", human(b as f64)),
        Budget::OfLive(f) => format!(
            "peak reserved within {f}x peak live ({})",
            human(budget_bytes(budget, reports))
        ),
    };
    match best(reports, budget) {
        Some(i) => {
            let r = &reports[i];
            let _ = writeln!(
                s,
                "recommendation ({goal}, least backing time): {}: backing {:.3} s, peak reserved {} ({:.2}x live), idle {:.3} MiB·s",
                r.policy,
                r.modelled_backing_seconds,
                human(r.peak_reserved_bytes as f64),
                r.reserved_over_live(),
                r.idle_byte_seconds / (1u64 << 20) as f64,
            );
        }
        None => {
            let least = reports
                .iter()
                .filter(|r| r.failures == 0)
                .map(|r| r.peak_reserved_bytes)
                .min();
            let _ = writeln!(
                s,
                "recommendation ({goal}): none fits; the least peak reserved without failures is {} (raise --budget)",
                least.map_or_else(|| "none".to_string(), |b| human(b as f64)),
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use decaying_pool::Stats;

    /// A report of `policy` with these figures (peak live 100 bytes).
    fn report(policy: &str, backing: f64, peak: usize, idle: f64, calls: (u64, u64)) -> Report {
        Report {
            workload: "w".into(),
            policy: policy.into(),
            allocs: 100,
            hits: 100 - calls.0,
            backing_allocs: calls.0,
            backing_frees: calls.1,
            evictions: 0,
            trimmed: 0,
            peak_reserved_bytes: peak,
            peak_live_bytes: 100,
            idle_byte_seconds: idle,
            modelled_backing_seconds: backing,
            failures: 0,
            span_seconds: 1.0,
            pages_created: 0,
            pages_released: 0,
            maps: 0,
            unmaps: 0,
            stats: Stats::default(),
            timeline: None,
        }
    }

    fn names(reports: &[Report], idx: &[usize]) -> Vec<String> {
        idx.iter().map(|&i| reports[i].policy.clone()).collect()
    }

    /// The case: 1 s ties 500 ms on backing time (to the last few
    /// bits of a float sum) and peak reserved, and idles more: it is
    /// dominated, and neither the front nor the recommendation names it.
    #[test]
    fn a_tie_on_backing_and_peak_with_more_idle_is_dominated() {
        let backing = 0.1 + 0.2 + 0.3; // 0.6000000000000001
        let r = vec![
            report("no-pool", 4.0, 100, 0.0, (100, 100)),
            report("fixed-time 1s, packed on", 0.6, 150, 9.0, (4, 0)),
            report("fixed-time 500ms, packed on", backing, 150, 7.0, (4, 0)),
        ];
        assert!(r[1].modelled_backing_seconds < r[2].modelled_backing_seconds);
        let front = pareto(&r);
        assert_eq!(
            names(&r, &front),
            ["fixed-time 500ms, packed on", "no-pool"]
        );
        assert_eq!(best(&r, Budget::OfLive(2.0)), Some(2));
        let text = recommend(&r, Budget::OfLive(2.0));
        assert!(!text.contains("fixed-time 1s"), "{text}");
    }

    /// Equal on some objectives, worse on none, better on one: dominated,
    /// whichever objective it is.
    #[test]
    fn better_on_one_objective_and_equal_on_the_others_dominates() {
        for (worse, why) in [
            (report("b", 1.5, 150, 7.0, (4, 0)), "backing"),
            (report("b", 1.0, 160, 7.0, (4, 0)), "peak"),
            (report("b", 1.0, 150, 7.5, (4, 0)), "idle"),
        ] {
            let r = vec![report("a", 1.0, 150, 7.0, (4, 0)), worse];
            assert_eq!(pareto(&r), [0], "{why}");
            assert!(dominates(&r[0], &r[1]), "{why}");
            assert!(!dominates(&r[1], &r[0]), "{why}");
        }
        // A trade-off keeps both, by backing time.
        let r = vec![
            report("slow, lean", 2.0, 120, 1.0, (8, 4)),
            report("fast, fat", 1.0, 150, 7.0, (4, 0)),
        ];
        assert_eq!(pareto(&r), [1, 0]);
    }

    /// Tying on all three objectives, the remaining columns decide (fewer
    /// backing calls, then more hits); all equal, the first listed stands.
    #[test]
    fn full_ties_are_broken_on_the_remaining_columns() {
        let r = vec![
            report("more calls", 1.0, 150, 7.0, (4, 2)),
            report("fewer calls", 1.0, 150, 7.0, (4, 0)),
            report("same as fewer", 1.0, 150, 7.0, (4, 0)),
        ];
        assert_eq!(pareto(&r), [1]);
        assert_eq!(best(&r, Budget::Bytes(1 << 20)), Some(1));
        let mut r2 = r.clone();
        r2[2].hits += 1;
        assert_eq!(pareto(&r2), [2]);
    }

    /// The recommendation: least backing time within the budget; ties on
    /// backing go to less idle memory, then less peak.
    #[test]
    fn the_recommendation_breaks_backing_ties_on_idle_then_peak() {
        let r = vec![
            report("idle 9", 1.0, 140, 9.0, (4, 0)),
            report("idle 7", 1.0 + 1e-15, 150, 7.0, (4, 0)),
            report("too big", 0.5, 300, 0.0, (2, 0)),
        ];
        assert_eq!(best(&r, Budget::OfLive(2.0)), Some(1));
        assert_eq!(best(&r, Budget::OfLive(3.0)), Some(2));
        assert_eq!(best(&r, Budget::Bytes(100)), None);
        let r = vec![
            report("peak 150", 1.0, 150, 7.0, (4, 0)),
            report("peak 140", 1.0, 140, 7.0, (4, 0)),
        ];
        assert_eq!(best(&r, Budget::OfLive(2.0)), Some(1));
    }
}
