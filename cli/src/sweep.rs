//! The Pareto front and the recommendation.

use std::fmt::Write as _;

use decaying_pool::trace::Report;

use crate::{Budget, human};

/// Whether `a` is at least as good as `b` on every objective (modelled
/// backing time, peak reserved, idle byte-seconds) and better on one.
fn dominates(a: &Report, b: &Report) -> bool {
    let ka = key(a);
    let kb = key(b);
    ka.iter().zip(&kb).all(|(x, y)| x <= y) && ka.iter().zip(&kb).any(|(x, y)| x < y)
}

fn key(r: &Report) -> [f64; 3] {
    [
        r.modelled_backing_seconds,
        r.peak_reserved_bytes as f64,
        r.idle_byte_seconds,
    ]
}

/// The indices of the reports on the Pareto front (configurations with
/// failed requests excluded: they did not serve the workload).
pub(crate) fn pareto(reports: &[Report]) -> Vec<usize> {
    let ok: Vec<usize> = (0..reports.len())
        .filter(|&i| reports[i].failures == 0)
        .collect();
    let mut front: Vec<usize> = ok
        .iter()
        .copied()
        .filter(|&i| {
            !ok.iter()
                .any(|&j| j != i && dominates(&reports[j], &reports[i]))
        })
        .collect();
    front.sort_by(|&a, &b| key(&reports[a])[0].total_cmp(&key(&reports[b])[0]));
    // Identical figures: keep the first configuration of each.
    front.dedup_by(|a, b| key(&reports[*a]) == key(&reports[*b]));
    front
}

/// The budget in bytes for these reports.
fn budget_bytes(budget: Budget, reports: &[Report]) -> f64 {
    match budget {
        Budget::Bytes(b) => b as f64,
        Budget::OfLive(f) => f * reports.first().map_or(0, |r| r.peak_live_bytes) as f64,
    }
}

/// The configuration with the least modelled backing time whose peak
/// reserved bytes fit the budget (ties: less idle memory, then less peak).
pub(crate) fn best(reports: &[Report], budget: Budget) -> Option<usize> {
    let cap = budget_bytes(budget, reports);
    (0..reports.len())
        .filter(|&i| reports[i].failures == 0 && reports[i].peak_reserved_bytes as f64 <= cap)
        .min_by(|&a, &b| {
            let (ka, kb) = (key(&reports[a]), key(&reports[b]));
            ka[0]
                .total_cmp(&kb[0])
                .then(ka[2].total_cmp(&kb[2]))
                .then(ka[1].total_cmp(&kb[1]))
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
