//! Replays allocation traces through every pool configuration and prints
//! what each would have cost: hits, backing calls, peak memory, idle
//! byte-seconds and modelled `cudaMalloc`/`cuMemFree` time.
//!
//! ```text
//! cargo run --release --example replay -- [--json] [--repeat N --gap MS]
//!     [--reaper MS] [--capacity GIB] [--strict]
//!     [--chrome-trace OUT.json] [--svg OUT.svg] [TRACE ...]
//! ```
//!
//! - `TRACE`: a PyTorch snapshot CSV, an RMM logging-adaptor CSV or a
//!   native trace (detected from the header). Without one, the built-in
//!   workloads run (a training loop, a pipeline with a data-dependent size,
//!   an A/B/A pipeline on an 8 GiB device).
//! - `--json`: one JSON array, one object per workload and configuration.
//! - `--repeat N --gap MS`: loop each trace N times with MS of idle time
//!   between passes, so decay over idle time shows.
//! - `--reaper MS`: call `collect` every MS of trace time, as
//!   `SharedPool`'s reaper thread would (default 1; 0: never, so a pool
//!   decays only when the trace calls it, and idle bytes stay counted
//!   until then).
//! - `--capacity GIB`: the device size for traces (built-in workloads carry
//!   their own).
//! - `--strict`: a free of an address the trace never allocated is an
//!   error. By default such frees (blocks allocated before the trace
//!   began) are skipped and counted.
//! - `--chrome-trace OUT.json`, `--svg OUT.svg`: the pool's counters over
//!   time for every configuration (with several workloads, the workload's
//!   name is added to the file name).
//!
//! A progress bar shows on stderr while a trace file is read.

use std::error::Error;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use decaying_pool::trace::{
    cli, format_table, reports_to_json, workloads, write_chrome_trace, write_svg, Config,
    CostModel, Event, Op, ReadOptions, ReadStats, Recorder, ReplayOptions, Replayer, Report,
    TraceErrorKind, TraceReader,
};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Default)]
struct Args {
    json: bool,
    repeat: u32,
    gap: Duration,
    reaper: Option<Duration>,
    capacity: Option<usize>,
    strict: bool,
    chrome: Option<PathBuf>,
    svg: Option<PathBuf>,
    traces: Vec<PathBuf>,
}

const USAGE: &str = "usage: replay [--json] [--repeat N --gap MS] [--reaper MS] [--capacity GIB] \
                     [--strict] [--chrome-trace OUT.json] [--svg OUT.svg] [TRACE ...]";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        repeat: 1,
        reaper: Some(Duration::from_millis(1)),
        ..Args::default()
    };
    let mut it = std::env::args_os().skip(1);
    let value = |v: Option<std::ffi::OsString>, flag: &str| -> Result<String, String> {
        let v = v.ok_or(format!("{flag} needs a value"))?;
        Ok(v.to_string_lossy().into_owned())
    };
    let refused = |e: cli::ArgError| e.to_string();
    while let Some(arg) = it.next() {
        match arg.to_string_lossy().as_ref() {
            "--json" => a.json = true,
            "--strict" => a.strict = true,
            "--repeat" => {
                a.repeat = cli::parse_repeat("--repeat", &value(it.next(), "--repeat")?)
                    .map_err(refused)?
            }
            "--gap" => {
                a.gap = cli::parse_millis("--gap", &value(it.next(), "--gap")?).map_err(refused)?
            }
            "--reaper" => {
                let d = cli::parse_millis("--reaper", &value(it.next(), "--reaper")?)
                    .map_err(refused)?;
                a.reaper = (!d.is_zero()).then_some(d);
            }
            "--capacity" => {
                let v = value(it.next(), "--capacity")?;
                a.capacity = Some(cli::parse_capacity_gib("--capacity", &v).map_err(refused)?);
            }
            "--chrome-trace" => {
                a.chrome = Some(it.next().ok_or("--chrome-trace needs a path")?.into())
            }
            "--svg" => a.svg = Some(it.next().ok_or("--svg needs a path")?.into()),
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with("--") => return Err(format!("unknown option {s}\n{USAGE}")),
            _ => a.traces.push(arg.into()),
        }
    }
    Ok(a)
}

/// The exact-cache floor, computed on the side: per size, the peak number
/// of simultaneously live blocks.
#[derive(Default)]
struct Floor {
    per_size: std::collections::HashMap<u64, (u64, u64)>,
}

impl Floor {
    fn see(&mut self, e: &Event) {
        let (live, peak) = self.per_size.entry(e.size).or_default();
        match e.op {
            Op::Alloc => {
                *live += 1;
                *peak = (*peak).max(*live);
            }
            Op::Free => *live -= 1,
        }
    }

    fn total(&self) -> u64 {
        self.per_size.values().map(|&(_, p)| p).sum()
    }
}

struct Outcome {
    name: String,
    description: String,
    reports: Vec<Report>,
    floor: u64,
    read: Option<ReadStats>,
}

fn options(args: &Args, capacity: Option<usize>) -> ReplayOptions {
    let mut cost = CostModel::cuda();
    if let Some(c) = capacity.or(args.capacity) {
        cost = cost.with_capacity(c);
    }
    ReplayOptions {
        cost,
        gap: args.gap,
        reaper: args.reaper,
        record: args.chrome.is_some() || args.svg.is_some(),
        record_resolution: Duration::ZERO,
    }
}

/// Opens a trace; a header error is prefixed with the file's path (an
/// open error names it already).
fn open(
    path: &Path,
    read_opts: ReadOptions,
) -> Result<TraceReader<std::io::BufReader<std::fs::File>>, String> {
    TraceReader::open(path, read_opts).map_err(|e| match e.kind {
        TraceErrorKind::Open { .. } => e.to_string(),
        _ => format!("{}: {e}", path.display()),
    })
}

fn replay_file(args: &Args, path: &Path) -> Result<Outcome, Box<dyn Error>> {
    let read_opts = ReadOptions {
        lenient_frees: !args.strict,
        ..ReadOptions::default()
    };
    // Opening first: its error names the file.
    drop(open(path, read_opts)?);
    let len = std::fs::metadata(path)?.len();
    let mut opts = options(args, None);
    if len > 64 << 20 {
        // Long traces: one sample per 100 µs keeps the recording small.
        opts.record_resolution = Duration::from_micros(100);
    }
    let mut replayer = Replayer::new(&Config::defaults(), opts);
    let bar = ProgressBar::new(len * u64::from(args.repeat));
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )?
        .progress_chars("=> "),
    );
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    bar.set_message(name.clone());
    let mut floor = Floor::default();
    let mut read = None;
    for pass in 0..args.repeat {
        let mut reader = open(path, read_opts)?;
        replayer.begin_pass();
        let done = u64::from(pass) * len;
        let mut n = 0u64;
        while let Some(ev) = reader.next() {
            let ev = ev.map_err(|e| format!("{}: {e}", path.display()))?;
            if pass == 0 {
                floor.see(&ev);
            }
            replayer.event(&ev);
            n += 1;
            if n % 4096 == 0 {
                bar.set_position(done + reader.stats().bytes);
            }
        }
        read.get_or_insert(reader.stats());
        bar.set_position(done + len);
    }
    bar.finish_and_clear();
    let read = read.expect("at least one pass");
    Ok(Outcome {
        description: format!(
            "{} trace, {} allocations, {} frees{}",
            TraceReader::open(path, read_opts)?.format(),
            read.allocs,
            read.frees,
            if read.unknown_frees > 0 {
                format!(
                    ", {} frees of blocks allocated before the trace began skipped",
                    read.unknown_frees
                )
            } else {
                String::new()
            }
        ),
        reports: replayer.finish(&name),
        name,
        floor: floor.total(),
        read: Some(read),
    })
}

fn replay_builtin(args: &Args, w: &workloads::Workload) -> Outcome {
    let mut replayer = Replayer::new(&Config::defaults(), options(args, w.capacity));
    let mut floor = Floor::default();
    for pass in 0..args.repeat {
        replayer.begin_pass();
        for ev in &w.events {
            if pass == 0 {
                floor.see(ev);
            }
            replayer.event(ev);
        }
    }
    Outcome {
        name: w.name.to_string(),
        description: w.description.to_string(),
        reports: replayer.finish(w.name),
        floor: floor.total(),
        read: None,
    }
}

/// `OUT.svg` for one workload, `OUT-NAME.svg` for several.
fn out_path(base: &Path, name: &str, several: bool) -> PathBuf {
    if !several {
        return base.to_path_buf();
    }
    let stem = base
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let ext = base
        .extension()
        .map_or_else(String::new, |e| format!(".{}", e.to_string_lossy()));
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    base.with_file_name(format!("{stem}-{safe}{ext}"))
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("replay: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    let mut outcomes = Vec::new();
    if args.traces.is_empty() {
        for w in workloads::defaults() {
            outcomes.push(replay_builtin(args, &w));
        }
    } else {
        for p in &args.traces {
            outcomes.push(replay_file(args, p)?);
        }
    }

    let several = outcomes.len() > 1;
    for o in &outcomes {
        let recs: Vec<Recorder> = o
            .reports
            .iter()
            .filter_map(|r| r.recording.clone())
            .collect();
        if let Some(base) = &args.chrome {
            let p = out_path(base, &o.name, several);
            let mut f = BufWriter::new(std::fs::File::create(&p)?);
            write_chrome_trace(&mut f, &recs)?;
            f.flush()?;
            eprintln!("wrote {}", p.display());
        }
        if let Some(base) = &args.svg {
            let p = out_path(base, &o.name, several);
            let mut f = BufWriter::new(std::fs::File::create(&p)?);
            write_svg(&mut f, &format!("{}: bytes over trace time", o.name), &recs)?;
            f.flush()?;
            eprintln!("wrote {}", p.display());
        }
    }

    if args.json {
        let all: Vec<Report> = outcomes.into_iter().flat_map(|o| o.reports).collect();
        println!("{}", reports_to_json(&all));
        return Ok(());
    }
    for o in &outcomes {
        let first = &o.reports[0];
        println!("== {} ==", o.name);
        println!("   {}", o.description);
        let mut repeat = if args.repeat > 1 {
            format!(", {} passes {:?} apart", args.repeat, args.gap)
        } else {
            String::new()
        };
        if let Some(p) = args.reaper {
            repeat.push_str(&format!(", collect every {p:?}"));
        }
        println!(
            "   {:.3} s of trace time{repeat}; peak live {:.1} MiB; exact-cache floor {} backing allocations{}",
            first.span_seconds,
            first.peak_live_bytes as f64 / (1u64 << 20) as f64,
            o.floor,
            if args.repeat > 1 { " per pass" } else { "" },
        );
        if let Some(r) = &o.read {
            if r.zero_size > 0 {
                println!("   {} zero-byte allocations skipped", r.zero_size);
            }
        }
        println!();
        print!("{}", format_table(&o.reports));
        println!();
    }
    println!(
        "hits: requests served from the cache; b.allocs / b.frees: backing allocator calls \
         (cudaMalloc / cuMemFree);\npeak res: peak reserved bytes, ÷live: over the trace's peak \
         live bytes; idle: integral of cached bytes over time;\nbacking: modelled time in the \
         backing allocator (published CUDA figures); failures: requests the device could not serve."
    );
    Ok(())
}
