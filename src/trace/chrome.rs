//! Chrome trace-event JSON export (Perfetto, `chrome://tracing`).

use std::io::{self, Write};

use super::{Sample, StatsTimeline, json_escape};

/// Writes `recorders` as a Chrome trace-event JSON document
/// (`{"traceEvents":[…],"displayTimeUnit":"ms"}`), which Perfetto
/// (ui.perfetto.dev) and `chrome://tracing` open.
///
/// Each recorder is one process, named after it, with five counter tracks
/// (`ph: "C"`, one value each, emitted when it changes): `in_use_bytes`,
/// `cached_bytes`, `reserved_bytes`, `from_pool_bytes` and
/// `from_backing_bytes` (the last two cumulative), and instant events
/// (`ph: "i"`) `eviction`, `trim` and `backing_failure` with the number of
/// blocks (or failed calls) in `args.count`. Timestamps are microseconds.
///
/// # Errors
///
/// When writing fails.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{write_chrome_trace, StatsTimeline};
/// use decaying_pool::Stats;
///
/// let mut rec = StatsTimeline::new("keep-all");
/// let mut s = Stats::default();
/// s.bytes_in_use = 4096;
/// s.bytes_reserved = 4096;
/// rec.record(Duration::from_micros(5), &s);
/// let mut out = Vec::new();
/// write_chrome_trace(&mut out, &[rec])?;
/// let json = String::from_utf8(out).unwrap();
/// assert!(json.contains(r#""name":"in_use_bytes","ph":"C","ts":5,"pid":1,"args":{"value":4096}"#));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn write_chrome_trace<W: Write>(mut out: W, recorders: &[StatsTimeline]) -> io::Result<()> {
    out.write_all(b"{\"traceEvents\":[\n")?;
    let mut first = true;
    let mut sep = |out: &mut W| -> io::Result<()> {
        if first {
            first = false;
            Ok(())
        } else {
            out.write_all(b",\n")
        }
    };
    type Get = fn(&Sample) -> usize;
    let tracks: [(&str, Get); 5] = [
        ("in_use_bytes", |s| s.bytes_in_use),
        ("cached_bytes", |s| s.bytes_cached),
        ("reserved_bytes", |s| s.bytes_reserved),
        ("from_pool_bytes", |s| s.bytes_from_pool),
        ("from_backing_bytes", |s| s.bytes_from_backing),
    ];
    for (i, rec) in recorders.iter().enumerate() {
        let pid = i + 1;
        sep(&mut out)?;
        write!(
            out,
            r#"{{"name":"process_name","ph":"M","pid":{pid},"tid":0,"args":{{"name":"{}"}}}}"#,
            json_escape(rec.name())
        )?;
        sep(&mut out)?;
        write!(
            out,
            r#"{{"name":"process_sort_index","ph":"M","pid":{pid},"tid":0,"args":{{"sort_index":{pid}}}}}"#
        )?;
        let mut last: [Option<usize>; 5] = [None; 5];
        for s in rec.samples() {
            let ts = micros(s.time);
            for (k, (name, get)) in tracks.iter().enumerate() {
                let v = get(s);
                if last[k] == Some(v) {
                    continue;
                }
                last[k] = Some(v);
                sep(&mut out)?;
                write!(
                    out,
                    r#"{{"name":"{name}","ph":"C","ts":{ts},"pid":{pid},"args":{{"value":{v}}}}}"#
                )?;
            }
        }
        for e in rec.instants() {
            sep(&mut out)?;
            write!(
                out,
                r#"{{"name":"{}","ph":"i","s":"p","ts":{},"pid":{pid},"tid":0,"args":{{"count":{}}}}}"#,
                e.kind.name(),
                micros(e.time),
                e.count
            )?;
        }
    }
    out.write_all(b"\n],\"displayTimeUnit\":\"ms\"}\n")?;
    out.flush()
}

/// Microseconds with up to three decimals, as JSON.
fn micros(t: core::time::Duration) -> String {
    let ns = t.as_nanos();
    if ns % 1000 == 0 {
        format!("{}", ns / 1000)
    } else {
        format!("{}.{:03}", ns / 1000, ns % 1000)
    }
}
