//! Ratios side by side, printed at the end of a bench run: each measured
//! benchmark's estimate over its baseline's from the same run, read back
//! from the files criterion wrote.

use std::path::PathBuf;
use std::time::SystemTime;

/// Where criterion writes its results: as criterion finds it
/// (`CRITERION_HOME`, else `criterion` in `CARGO_TARGET_DIR`, else in
/// `target` under the directory the bench runs in, the package's).
fn criterion_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| "target".into(), PathBuf::from);
    target.join("criterion")
}

/// The estimate criterion printed for benchmark `dir` (its directory under
/// criterion's home, `group/function/value`), in nanoseconds: the middle
/// figure of its `time:` line (the slope of its linear fit, or the mean
/// where there is none). `None` unless this run wrote it (after `since`):
/// a benchmark left out by a filter keeps an older file.
fn estimate(dir: &str, since: SystemTime) -> Option<f64> {
    let path = criterion_home()
        .join(dir)
        .join("new")
        .join("estimates.json");
    let written = std::fs::metadata(&path).ok()?.modified().ok()?;
    if written < since {
        return None;
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let pick = |key: &str| json.get(key)?.get("point_estimate")?.as_f64();
    pick("slope").or_else(|| pick("mean"))
}

/// One table: the rows' benchmarks over the baseline's, column by column.
pub(crate) struct Table<'a> {
    /// What the table measures.
    pub title: &'a str,
    /// The baseline's label and its benchmark directory for a column
    /// (`{}` stands for the column).
    pub baseline: (&'a str, &'a str),
    /// Each row's label and benchmark directory, as the baseline's.
    pub rows: &'a [(&'a str, &'a str)],
    /// The columns (what `{}` stands for in the directories).
    pub columns: &'a [&'a str],
}

impl Table<'_> {
    /// Prints the table for the benchmarks this run measured (written after
    /// `since`); nothing when it measured none of them (a filtered run, a
    /// test run, a listing).
    pub(crate) fn print(&self, since: SystemTime) {
        let at = |dir: &str, col: &str| estimate(&dir.replace("{}", col), since);
        let base: Vec<Option<f64>> = self
            .columns
            .iter()
            .map(|c| at(self.baseline.1, c))
            .collect();
        let cells: Vec<Vec<Option<f64>>> = self
            .rows
            .iter()
            .map(|(_, dir)| self.columns.iter().map(|c| at(dir, c)).collect())
            .collect();
        if base.iter().all(Option::is_none) || cells.iter().flatten().all(Option::is_none) {
            return;
        }
        let width = self
            .rows
            .iter()
            .map(|r| r.0.len())
            .chain([self.baseline.0.len(), self.title.len()])
            .max()
            .unwrap_or(0);
        println!();
        print!("{:width$}", self.title);
        for c in self.columns {
            print!("  {c:>12}");
        }
        println!();
        print!("{:width$}", self.baseline.0);
        for b in &base {
            match b {
                Some(ns) => print!("  {:>12}", format!("{ns:.2} ns")),
                None => print!("  {:>12}", "-"),
            }
        }
        println!();
        for ((label, _), row) in self.rows.iter().zip(&cells) {
            print!("{label:width$}");
            for (cell, b) in row.iter().zip(&base) {
                match (cell, b) {
                    (Some(ns), Some(b)) => print!("  {:>12}", format!("{:.2}x", ns / b)),
                    _ => print!("  {:>12}", "-"),
                }
            }
            println!();
        }
    }
}
