//! What a replay reports, as JSON and as a table.

use std::fmt::Write as _;

use crate::Stats;
use crate::trace::{StatsTimeline, human_bytes, json_escape};

use super::cost::MIB;

/// What one configuration did over a replay.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{Config, Event, PolicyKind, Replayer, ReplayOptions};
/// let mut r = Replayer::new(&[Config::new(PolicyKind::NoPool)], ReplayOptions::default());
/// r.event(&Event::alloc(Duration::ZERO, 1, 1_000_000));
/// r.event(&Event::free(Duration::from_secs(1), 1, 1_000_000));
/// let rep = &r.finish("w")[0];
/// assert_eq!((rep.backing_allocs, rep.backing_frees, rep.hits), (1, 1, 0));
/// assert!((rep.modelled_backing_seconds - 570e-6).abs() < 1e-9);
/// assert_eq!(rep.reserved_over_live(), 1.0);
/// ```
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Report {
    /// The workload's name.
    pub workload: String,
    /// The configuration's name.
    pub policy: String,
    /// Allocation requests in the trace (all passes).
    pub allocs: u64,
    /// Requests served from the cache.
    pub hits: u64,
    /// Backing allocations.
    pub backing_allocs: u64,
    /// Backing frees during the replay (the pool's final drop not counted).
    pub backing_frees: u64,
    /// Cached blocks freed by the policy.
    pub evictions: u64,
    /// Cached blocks freed by the out-of-memory retry.
    pub trimmed: u64,
    /// The most bytes held from the backing allocator at once.
    pub peak_reserved_bytes: usize,
    /// The most bytes the trace held live at once (requested sizes).
    pub peak_live_bytes: usize,
    /// Integral of the pool's cached bytes over trace time, byte-seconds.
    pub idle_byte_seconds: f64,
    /// Modelled time spent in the backing allocator, seconds.
    pub modelled_backing_seconds: f64,
    /// Requests that failed (device full even after the pool emptied its
    /// cache); their frees are skipped.
    pub failures: u64,
    /// Trace time replayed, gaps included, seconds.
    pub span_seconds: f64,
    /// Pages created, on pages ([`Config::pages`](super::Config::pages); 0 otherwise).
    pub pages_created: u64,
    /// Pages released, on pages.
    pub pages_released: u64,
    /// Runs of pages mapped, on pages.
    pub maps: u64,
    /// Runs of pages unmapped, on pages.
    pub unmaps: u64,
    /// The pool's final counters.
    pub stats: Stats,
    /// The stats timeline, when [`ReplayOptions::record`](super::ReplayOptions::record) was set (not
    /// serialized: write it with its own exporters).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub timeline: Option<StatsTimeline>,
}

impl Report {
    /// Peak reserved over peak live bytes (1.0 = no memory held beyond need;
    /// 0 when nothing was live).
    ///
    /// # Examples
    ///
    /// ```
    /// # use decaying_pool::trace::{Config, PolicyKind, Replayer, ReplayOptions};
    /// let r = &Replayer::new(&Config::defaults(), ReplayOptions::default()).finish("empty")[0];
    /// assert_eq!(r.reserved_over_live(), 0.0);
    /// ```
    pub fn reserved_over_live(&self) -> f64 {
        if self.peak_live_bytes == 0 {
            0.0
        } else {
            self.peak_reserved_bytes as f64 / self.peak_live_bytes as f64
        }
    }

    /// One JSON object with the report's figures (not the timeline).
    ///
    /// # Examples
    ///
    /// ```
    /// # use decaying_pool::trace::{Config, PolicyKind, Replayer, ReplayOptions};
    /// let r = &Replayer::new(&[Config::new(PolicyKind::KeepAll)], ReplayOptions::default()).finish("w")[0];
    /// assert!(r.to_json().starts_with(r#"{"workload":"w","policy":"keep-all","#));
    /// ```
    pub fn to_json(&self) -> String {
        format!(
            concat!(
                "{{\"workload\":\"{}\",\"policy\":\"{}\",\"allocs\":{},\"hits\":{},",
                "\"backing_allocs\":{},\"backing_frees\":{},\"evictions\":{},\"trimmed\":{},",
                "\"peak_reserved_bytes\":{},\"peak_live_bytes\":{},\"reserved_over_live\":{},",
                "\"idle_byte_seconds\":{},\"modelled_backing_seconds\":{},\"failures\":{},",
                "\"span_seconds\":{},\"pages_created\":{},\"pages_released\":{},",
                "\"maps\":{},\"unmaps\":{}}}"
            ),
            json_escape(&self.workload),
            json_escape(&self.policy),
            self.allocs,
            self.hits,
            self.backing_allocs,
            self.backing_frees,
            self.evictions,
            self.trimmed,
            self.peak_reserved_bytes,
            self.peak_live_bytes,
            json_f64(self.reserved_over_live()),
            json_f64(self.idle_byte_seconds),
            json_f64(self.modelled_backing_seconds),
            self.failures,
            json_f64(self.span_seconds),
            self.pages_created,
            self.pages_released,
            self.maps,
            self.unmaps,
        )
    }
}

fn json_f64(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

/// A JSON array of [`Report::to_json`] objects.
///
/// # Examples
///
/// ```
/// # use decaying_pool::trace::{reports_to_json, Config, Replayer, ReplayOptions};
/// let reports = Replayer::new(&Config::defaults(), ReplayOptions::default()).finish("w");
/// let json = reports_to_json(&reports);
/// assert!(json.starts_with("[{") && json.ends_with("}]"));
/// ```
pub fn reports_to_json(reports: &[Report]) -> String {
    let mut s = String::from("[");
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&r.to_json());
    }
    s.push(']');
    s
}

/// A plain-text table of reports, one row per configuration.
///
/// # Examples
///
/// ```
/// # use decaying_pool::trace::{format_table, Config, Replayer, ReplayOptions};
/// let reports = Replayer::new(&Config::defaults(), ReplayOptions::default()).finish("w");
/// assert!(format_table(&reports).lines().nth(2).unwrap().starts_with("no-pool"));
/// ```
pub fn format_table(reports: &[Report]) -> String {
    // Each column as wide as its widest cell, at least as wide as the
    // usual figures, so that an outlier (a replay over centuries, a
    // billion hits) widens its column rather than shifting the rest.
    const MIN: [usize; 10] = [6, 9, 7, 9, 9, 11, 6, 11, 9, 8];
    let head: [[String; 10]; 2] = [
        [
            "policy", "hits", "hit %", "b.allocs", "b.frees", "peak res", "÷live", "idle",
            "backing", "failures",
        ]
        .map(String::from),
        ["", "", "", "", "", "", "", "MiB·s", "s", ""].map(String::from),
    ];
    let rows: Vec<[String; 10]> = reports
        .iter()
        .map(|r| {
            let hit = if r.allocs == 0 {
                0.0
            } else {
                100.0 * r.hits as f64 / r.allocs as f64
            };
            [
                r.policy.clone(),
                r.hits.to_string(),
                format!("{hit:.2}"),
                r.backing_allocs.to_string(),
                r.backing_frees.to_string(),
                human_bytes(r.peak_reserved_bytes as f64),
                format!("{:.2}", r.reserved_over_live()),
                format!("{:.3}", r.idle_byte_seconds / MIB as f64),
                format!("{:.3}", r.modelled_backing_seconds),
                r.failures.to_string(),
            ]
        })
        .collect();
    let mut width = MIN;
    for row in head.iter().chain(&rows) {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut s = String::new();
    for row in head.iter().chain(&rows) {
        let mut line = format!("{:<w$}", row[0], w = width[0]);
        for (cell, &w) in row.iter().zip(&width).skip(1) {
            let _ = write!(line, " {cell:>w$}");
        }
        s.push_str(&line);
        s.push('\n');
    }
    s
}
