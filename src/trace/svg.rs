//! An SVG chart of reserved, cached and in-use bytes over time, one panel
//! per configuration, in bands: live, free inside segments, the rest of
//! in use, cached, spare pages.

use core::fmt::Write as _;
use std::io::{self, Write};

use super::{InstantKind, Sample, StatsTimeline, human_bytes};

const WIDTH: f64 = 960.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 18.0;
const TOP: f64 = 86.0;
const PANEL: f64 = 110.0;
const PANEL_GAP: f64 = 30.0;
const BOTTOM: f64 = 44.0;
/// Bytes in use, or the part of them the live blocks requested.
const IN_USE: &str = "#3b6fb6";
/// Free space inside segments (a part of in use).
const FREE_IN_SEGMENTS: &str = "#8fb4e8";
/// The rest of in use: rounding to classes and units.
const IN_USE_REST: &str = "#c8d2de";
const CACHED: &str = "#f2a541";
/// Spare pages of the backing allocator.
const SPARE: &str = "#5fae5a";
const RESERVED: &str = "#7a4a00";

/// The tops of a sample's bands, bottom to top, each clamped at the one
/// under it and at the bytes reserved: the live bytes (in use when they are
/// not known), free inside segments, in use, cached, spare; and the bytes
/// reserved.
fn band_tops(x: &Sample) -> [f64; BANDS + 1] {
    let reserved = x.bytes_reserved;
    let in_use = x.bytes_in_use.min(reserved);
    let (live, free) = if x.bytes_live == 0 {
        // Not known (a timeline recorded with `record`): in use is one band.
        (in_use, in_use)
    } else {
        let live = x.bytes_live.min(in_use);
        (
            live,
            live.saturating_add(x.bytes_free_in_segments).min(in_use),
        )
    };
    let cached = in_use.saturating_add(x.bytes_cached).min(reserved);
    let spare = cached.saturating_add(x.bytes_spare).min(reserved);
    [live, free, in_use, cached, spare, reserved].map(|b| b as f64)
}

/// The number of bands: live, free in segments, the rest of in use,
/// cached, spare.
const BANDS: usize = 5;

/// Writes an SVG chart of `recorders`: one panel per recorder, stacked,
/// on one time axis and one byte scale. In each panel, stacked from the
/// bottom (each band clamped at the bytes reserved):
///
/// - blue: the bytes the live blocks requested ([`Sample::bytes_live`]);
///   where they are not known (0 with bytes in use, as in a timeline
///   recorded with [`StatsTimeline::record`]), the bytes in use, drawn as
///   one band;
/// - light blue: free space inside the segments of a packed pool
///   ([`Sample::bytes_free_in_segments`]), a part of the bytes in use;
/// - pale blue-grey: the rest of the bytes in use (rounding to size classes
///   and packing units);
/// - orange: the cached (idle) blocks ([`Sample::bytes_cached`]);
/// - green: spare pages of the backing allocator, touched by no block
///   ([`Sample::bytes_spare`]);
///
/// and a dark line, the bytes reserved from the backing allocator, on top.
/// Over mapped pages the bytes reserved are the pages': free space inside
/// pages that some block touches is in no band, and shows white under the
/// line. The legend names the bands that some
/// panel draws. Ticks under a panel mark evictions (grey), trims (purple)
/// and backing failures (red). Long recordings are reduced to one column
/// per pixel, keeping each column's maximum of every band's top, so peaks
/// show.
///
/// # Errors
///
/// When writing fails.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{write_svg, StatsTimeline};
/// use decaying_pool::Stats;
///
/// let mut rec = StatsTimeline::new("keep-all");
/// for (ms, in_use, cached) in [(0, 0, 0), (1, 4096, 0), (2, 0, 4096)] {
///     let mut s = Stats::default();
///     (s.bytes_in_use, s.bytes_cached, s.bytes_reserved) = (in_use, cached, in_use + cached);
///     rec.record(Duration::from_millis(ms), &s);
/// }
/// let mut out = Vec::new();
/// write_svg(&mut out, "demo", &[rec])?;
/// let svg = String::from_utf8(out).unwrap();
/// assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn write_svg<W: Write>(mut out: W, title: &str, recorders: &[StatsTimeline]) -> io::Result<()> {
    let n = recorders.len().max(1) as f64;
    let height = TOP + n * (PANEL + PANEL_GAP) + BOTTOM - PANEL_GAP + 10.0;
    let plot_w = WIDTH - LEFT - RIGHT;
    let t_end = recorders
        .iter()
        .filter_map(|r| r.samples().last().map(|s| s.time))
        .max()
        .unwrap_or_default()
        .as_secs_f64()
        .max(1e-6);
    let y_max_raw = recorders
        .iter()
        .flat_map(|r| r.samples().iter().map(|s| s.bytes_reserved))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let (unit_name, unit) = byte_unit(y_max_raw);
    let (y_step, y_ticks) = nice_ticks(y_max_raw / unit);
    let y_step = y_step * unit;
    let y_max = y_step * y_ticks as f64;
    let (t_step, _) = nice_ticks(t_end);
    let t_ticks = (t_end / t_step + 1e-9).floor() as usize;
    let t_max = t_end;
    let (t_unit, t_scale) = if t_step < 1.0 {
        ("ms", 1e3)
    } else {
        ("s", 1.0)
    };

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="15" font-weight="bold">{}</text>"#,
        xml_escape(title)
    );
    // One column per pixel, each the maximum of every band's top over
    // the samples that fall in it (the state before carried in).
    let cols = plot_w as usize;
    let columns: Vec<(Vec<[f64; BANDS + 1]>, usize)> = recorders
        .iter()
        .map(|rec| {
            let samples = rec.samples();
            let mut tops = vec![[0f64; BANDS + 1]; cols];
            let mut j = 0;
            let mut carry = [0f64; BANDS + 1];
            let end_t = samples.last().map_or(0.0, |x| x.time.as_secs_f64());
            let last_col = ((end_t / t_max * cols as f64) as usize).min(cols.saturating_sub(1));
            for (c, col) in tops.iter_mut().enumerate().take(last_col + 1) {
                let c_end = (c + 1) as f64 / cols as f64 * t_max;
                let mut m = carry;
                while j < samples.len() && samples[j].time.as_secs_f64() < c_end {
                    carry = band_tops(&samples[j]);
                    for (m, t) in m.iter_mut().zip(carry) {
                        *m = m.max(t);
                    }
                    j += 1;
                }
                *col = m;
            }
            (tops, last_col)
        })
        .collect();
    // Which bands some panel draws: a band shows where its top is above
    // the one under it.
    let mut shown = [false; BANDS];
    let mut live_known = false;
    for (rec, (tops, _)) in recorders.iter().zip(&columns) {
        live_known |= rec.samples().iter().any(|x| x.bytes_live > 0);
        for t in tops {
            shown[0] |= t[0] > 0.0;
            for b in 1..BANDS {
                shown[b] |= t[b] > t[b - 1];
            }
        }
    }
    let labels: [(&str, &str); BANDS] = [
        (
            IN_USE,
            if live_known {
                "live (requested)"
            } else {
                "in use"
            },
        ),
        (FREE_IN_SEGMENTS, "free in segments"),
        (IN_USE_REST, "rest of in use (rounding)"),
        (CACHED, "cached (idle)"),
        (SPARE, "spare pages"),
    ];
    // legend
    let mut lx = LEFT;
    let entries = labels
        .iter()
        .zip(shown)
        .enumerate()
        // The in-use and cached entries always show, as before.
        .filter(|&(b, (_, shown))| shown || b == 0 || b == 3)
        .map(|(_, (&(color, label), _))| (color, label, false))
        .chain([(RESERVED, "reserved", true)]);
    for (color, label, line) in entries {
        if line {
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="38" x2="{}" y2="38" stroke="{color}" stroke-width="2"/>"#,
                lx + 14.0
            );
        } else {
            let _ = writeln!(
                s,
                r#"<rect x="{lx}" y="32" width="14" height="12" fill="{color}"/>"#
            );
        }
        let _ = writeln!(s, r#"<text x="{}" y="42">{label}</text>"#, lx + 19.0);
        lx += 30.0 + 6.5 * label.len() as f64;
    }
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="60" fill="#555">ticks under a panel: evictions (grey), trims (purple), backing failures (red)</text>"##
    );

    for (i, (rec, (tops, last_col))) in recorders.iter().zip(&columns).enumerate() {
        let last_col = *last_col;
        let y0 = TOP + i as f64 * (PANEL + PANEL_GAP);
        let base = y0 + PANEL;
        let ys = |b: f64| base - b / y_max * PANEL;
        let xs = |t: f64| LEFT + t / t_max * plot_w;
        // panel frame and grid
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="{}" font-size="12" font-weight="bold">{}</text>"##,
            y0 - 8.0,
            xml_escape(rec.name())
        );
        let peak = rec
            .samples()
            .iter()
            .map(|x| x.bytes_reserved)
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end" fill="#333">peak reserved {}</text>"##,
            WIDTH - RIGHT,
            y0 - 8.0,
            human_bytes(peak as f64)
        );
        for k in 0..=y_ticks {
            let b = y_step * k as f64;
            let y = ys(b);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##,
                WIDTH - RIGHT
            );
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
                LEFT - 5.0,
                y + 4.0,
                if b == 0.0 {
                    "0".to_string()
                } else {
                    format!("{} {unit_name}", trim_num(b / unit))
                }
            );
        }
        for k in 0..=t_ticks {
            let x = xs(t_step * k as f64);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{base:.1}" stroke="#eeeeee"/>"##
            );
        }
        let px = |c: usize| LEFT + c as f64 * plot_w / cols as f64;
        // Step paths with H/V commands, a point only where the value changes.
        let steps = |vals: &[f64]| -> String {
            let mut d = String::new();
            let mut prev = f64::NAN;
            for (c, &v) in vals.iter().enumerate().take(last_col + 1) {
                let y = (ys(v) * 10.0).round() / 10.0;
                if y != prev {
                    let _ = write!(d, "H{:.1}V{y:.1}", px(c));
                    prev = y;
                }
            }
            let _ = write!(d, "H{:.1}", px(last_col + 1));
            d
        };
        // Each band is the area from the base to its top, painted from the
        // top band down. The new bands (free in segments, the rest of in
        // use, spare) are drawn only where their top is somewhere above the
        // one under them; in use (or live) and cached always are.
        let band = |b: usize| -> Vec<f64> { tops.iter().map(|t| t[b]).collect() };
        for b in (0..BANDS).rev() {
            if b != 0 && b != 3 && !tops.iter().any(|t| t[b] > t[b - 1]) {
                continue;
            }
            let vals = band(b);
            let _ = writeln!(
                s,
                r#"<path d="M{LEFT:.1},{base:.1}{}V{base:.1}Z" fill="{}" stroke="none"/>"#,
                steps(&vals),
                labels[b].0
            );
        }
        let reserved = band(BANDS);
        let first = ys(reserved.first().copied().unwrap_or(0.0));
        let _ = writeln!(
            s,
            r#"<path d="M{LEFT:.1},{first:.1}{}" fill="none" stroke="{RESERVED}" stroke-width="1.2"/>"#,
            steps(&reserved)
        );
        // instant ticks, one per pixel and kind
        for (kind, color, dy) in [
            (InstantKind::Eviction, "#888888", 2.0),
            (InstantKind::Trim, "#8e44ad", 8.0),
            (InstantKind::BackingFailure, "#d62728", 14.0),
        ] {
            let mut seen = vec![false; cols];
            let mut d = String::new();
            for e in rec.instants().iter().filter(|e| e.kind == kind) {
                let c = ((e.time.as_secs_f64() / t_max * cols as f64) as usize).min(cols - 1);
                if std::mem::replace(&mut seen[c], true) {
                    continue;
                }
                let x = px(c) + 0.5;
                let _ = write!(d, "M{x:.1},{:.1} v5 ", base + dy);
            }
            if !d.is_empty() {
                let _ = writeln!(
                    s,
                    r#"<path d="{}" stroke="{color}" stroke-width="1"/>"#,
                    d.trim_end()
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{y0:.1}" width="{plot_w:.1}" height="{PANEL:.1}" fill="none" stroke="#999"/>"##
        );
    }
    // time axis under the last panel
    let axis_y = TOP + n * (PANEL + PANEL_GAP) - PANEL_GAP;
    for k in 0..=t_ticks {
        let t = t_step * k as f64;
        let x = LEFT + t / t_max * plot_w;
        let _ = writeln!(
            s,
            r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
            axis_y + 30.0,
            trim_num(t * t_scale)
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#444">trace time ({t_unit})</text>"##,
        LEFT + plot_w / 2.0,
        axis_y + 44.0
    );
    s.push_str("</svg>\n");
    out.write_all(s.as_bytes())?;
    out.flush()
}

/// The binary unit to label a byte axis reaching `max` with.
fn byte_unit(max: f64) -> (&'static str, f64) {
    const K: f64 = 1024.0;
    if max >= K * K * K {
        ("GiB", K * K * K)
    } else if max >= K * K {
        ("MiB", K * K)
    } else if max >= K {
        ("KiB", K)
    } else {
        ("B", 1.0)
    }
}

/// A step of 1, 2, 2.5 or 5 × 10^k and the number of steps (about four)
/// that cover `max`.
fn nice_ticks(max: f64) -> (f64, usize) {
    let raw = max / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    let n = (max / step).ceil().max(1.0) as usize;
    (step, n)
}

fn trim_num(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() {
        "0".into()
    } else {
        s.to_string()
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use super::*;
    use crate::Stats;
    use crate::trace::Sample;

    fn svg(recs: &[StatsTimeline]) -> String {
        let mut out = Vec::new();
        write_svg(&mut out, "t", recs).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn fills(svg: &str) -> Vec<&str> {
        svg.lines()
            .filter(|l| l.starts_with("<path") && l.contains(" fill=\"#"))
            .filter_map(|l| l.split(" fill=\"").nth(1)?.split('"').next())
            .collect()
    }

    #[test]
    fn the_bands_show_live_free_in_segments_rest_cached_and_spare() {
        let mut rec = StatsTimeline::new("bands");
        for ms in 0..4u64 {
            rec.record_sample(Sample {
                time: Duration::from_millis(ms),
                bytes_live: 1000 + ms as usize,
                bytes_free_in_segments: 2000,
                bytes_in_use: 4096,
                bytes_cached: 1024,
                bytes_spare: 2048,
                bytes_reserved: 4096 + 1024 + 2048,
                ..Default::default()
            });
        }
        let text = svg(&[rec]);
        roxmltree::Document::parse(&text).unwrap();
        // Painted from the top band down, each once.
        assert_eq!(
            fills(&text),
            [SPARE, CACHED, IN_USE_REST, FREE_IN_SEGMENTS, IN_USE],
            "{text}"
        );
        for label in [
            "live (requested)",
            "free in segments",
            "rest of in use (rounding)",
            "cached (idle)",
            "spare pages",
        ] {
            assert!(text.contains(&format!(">{label}</text>")), "{label}");
        }
    }

    #[test]
    fn a_timeline_recorded_from_stats_draws_in_use_as_one_band() {
        let mut rec = StatsTimeline::new("stats");
        for (ms, in_use, cached) in [(0, 0, 0), (1, 4096, 0), (2, 1024, 3072)] {
            let s = Stats {
                bytes_in_use: in_use,
                bytes_cached: cached,
                bytes_reserved: in_use + cached,
                ..Default::default()
            };
            rec.record(Duration::from_millis(ms), &s);
        }
        let text = svg(&[rec]);
        assert_eq!(fills(&text), [CACHED, IN_USE], "{text}");
        for colour in [FREE_IN_SEGMENTS, IN_USE_REST, SPARE] {
            assert!(!text.contains(colour), "{colour} in\n{text}");
        }
        assert!(text.contains(">in use</text>"));
    }

    #[test]
    fn bands_are_clamped_at_the_bytes_reserved() {
        let x = Sample {
            bytes_live: 5000, // more than in use
            bytes_free_in_segments: 5000,
            bytes_in_use: 4096,
            bytes_cached: 4096,
            bytes_spare: 4096,
            bytes_reserved: 6000,
            ..Default::default()
        };
        assert_eq!(
            band_tops(&x),
            [4096.0, 4096.0, 4096.0, 6000.0, 6000.0, 6000.0]
        );
        let unknown = Sample {
            bytes_in_use: 100,
            bytes_free_in_segments: 50,
            bytes_reserved: 100,
            ..Default::default()
        };
        assert_eq!(band_tops(&unknown)[..3], [100.0; 3]);
    }

    #[test]
    fn downsampling_keeps_each_bands_maximum() {
        // Many samples in one pixel's time: the column keeps the peak of
        // every band, the spare band's too.
        let mut rec = StatsTimeline::new("dense");
        for us in 0..10_000u64 {
            let spare = if us == 5 { 8192 } else { 0 };
            rec.record_sample(Sample {
                time: Duration::from_micros(us),
                bytes_live: 100,
                bytes_in_use: 200,
                bytes_spare: spare,
                bytes_reserved: 200 + spare,
                ..Default::default()
            });
        }
        let text = svg(&[rec]);
        assert!(fills(&text).contains(&SPARE), "{text}");
    }
}
