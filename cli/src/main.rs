//! `decaying-pool`: replays allocation traces (PyTorch snapshot pickles and
//! CSVs, RMM logs, native traces) through pool configurations, prints what
//! each would have cost and recommends one.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Cursor, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use decaying_pool::trace::cli;
use decaying_pool::trace::{
    Config, CostModel, Event, Op, PolicyKind, ReadOptions, ReadStats, ReplayOptions, Replayer,
    Report, StatsTimeline, TraceReader, TraceWriter, format_table, reports_to_json, workloads,
    write_chrome_trace, write_svg,
};
use decaying_pool::{Packing, SizeClass};
use indicatif::{ProgressBar, ProgressStyle};

mod sweep;

const EXIT_CODES: &str = "Sizes (--capacity, --limit, --budget, --size-class xN, the size keys of \
                          --packing) take a unit: B, KiB, MiB, GiB, TiB (K, M, G, T and KB, MB, GB, TB \
                          are the same binary units), e.g. 3GiB, 512MiB, 4k; a bare number is refused.\n\n\
                          Exit codes: 0 success (also when the reader of the output goes away, \
                          as `| head` does); 1 the replay or writing an output failed; \
                          2 bad usage or bad input (an unreadable or malformed trace, a bad number).";

/// Which pool configuration for my workload? Replays allocation traces
/// through caching-pool configurations on a model of the backing
/// allocator's costs (CUDA's by default, host mmap's with --costs host).
#[derive(Parser, Debug)]
#[command(name = "decaying-pool", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay traces through pool configurations, print the comparison
    /// table, the Pareto front and a recommendation.
    #[command(after_help = EXIT_CODES, allow_negative_numbers = true)]
    Replay(Box<ReplayArgs>),
    /// Convert any supported trace to the native format
    /// (`time_ns,action,addr,size`).
    #[command(after_help = EXIT_CODES, allow_negative_numbers = true)]
    Convert(ConvertArgs),
}

/// What selects and reads the events of a trace file.
#[derive(Args, Debug, Clone)]
struct InputArgs {
    /// PyTorch traces: the device to replay (default: the first one seen).
    #[arg(long, value_name = "N")]
    device: Option<u32>,
    /// PyTorch and RMM traces: replay only this stream (a number, or an
    /// RMM stream handle in hex, 0x...; default: every stream).
    #[arg(long, value_name = "STREAM", value_parser = parse_stream)]
    stream: Option<u64>,
    /// A free of an address the trace never allocated is an error (by
    /// default such frees, of blocks allocated before the trace began, are
    /// skipped and counted).
    #[arg(long)]
    strict: bool,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// Trace files: a PyTorch snapshot pickle (torch.cuda.memory._dump_snapshot),
    /// a PyTorch snapshot CSV, an RMM logging-adaptor CSV or a native trace
    /// (detected from the content). Without one, three built-in workloads run.
    #[arg(value_name = "FILE")]
    traces: Vec<PathBuf>,
    #[command(flatten)]
    input: InputArgs,
    /// Print one JSON array (an object per workload and configuration)
    /// instead of the tables.
    #[arg(long)]
    json: bool,
    /// Write the pool counters over time as an SVG chart, in bands: live
    /// bytes, free space in segments, the rest of in use, cached, spare
    /// pages (with several workloads, the workload's name is added to the
    /// file name).
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<PathBuf>,
    /// Write the pool counters over time as a Chrome/Perfetto trace.
    #[arg(long, value_name = "OUT.json")]
    chrome_trace: Option<PathBuf>,
    /// Device capacities to replay on (a list sweeps them): sizes with a
    /// unit (5.35GiB, 80MiB; a bare number is refused). Default: an
    /// unbounded device (the built-in workloads carry their own).
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',', allow_hyphen_values = true, value_parser = parse_capacity)]
    capacity: Vec<usize>,
    /// Loop each trace N times, so decay over idle time shows.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = |s: &str| cli::parse_repeat("--repeat", s))]
    repeat: u32,
    /// Idle time between passes of --repeat (e.g. 500ms, 2s; a bare number is ms).
    #[arg(long, value_name = "TIME", default_value = "0", allow_hyphen_values = true, value_parser = |s: &str| parse_duration("--gap", s))]
    gap: Duration,
    /// Call collect every TIME of trace time, as SharedPool's reaper thread
    /// would (0: never; a pool then decays only when the trace calls it).
    #[arg(long, value_name = "TIME", default_value = "1ms", allow_hyphen_values = true, value_parser = |s: &str| parse_duration("--reaper", s))]
    reaper: Duration,
    /// Sweep: fixed-time policies with these time-to-live values (e.g. 10ms,100ms,1s).
    #[arg(long, value_name = "TIME,...", value_delimiter = ',', allow_hyphen_values = true, value_parser = |s: &str| parse_duration("--ttl", s))]
    ttl: Vec<Duration>,
    /// Sweep: exponential policies with these half-lives.
    #[arg(long, value_name = "TIME,...", value_delimiter = ',', allow_hyphen_values = true, value_parser = |s: &str| parse_duration("--half-life", s))]
    half_life: Vec<Duration>,
    /// Sweep: fixed-capacity policies with these numbers of slots.
    #[arg(long, value_name = "N,...", value_delimiter = ',')]
    slots: Vec<usize>,
    /// Sweep: byte limits on the pool (sizes with a unit, 40MiB, 8GiB; or
    /// `none`); requests beyond a limit fail, and configurations with
    /// failures are never recommended.
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',', value_parser = parse_limit)]
    limit: Vec<Limit>,
    /// Sweep: garbage-collection thresholds (PyTorch's
    /// garbage_collection_threshold), fractions in (0, 1] of the --limit
    /// or, without one, of the --capacity (or `none`): once a miss would
    /// bring the reserved bytes past it, idle blocks go back oldest first
    /// until they are under it. Each value applies to every swept
    /// configuration (rows named `..., gc 0.8`), and keep-all, PyTorch's
    /// own pool that frees only there, is swept with it; with neither a
    /// limit nor a capacity a threshold does nothing.
    #[arg(long, value_name = "F,...", value_delimiter = ',', value_parser = parse_gc_threshold)]
    gc_threshold: Vec<GcThreshold>,
    /// Page sizes to sweep (with a unit: 2MiB, 20MiB; `off` for none): each
    /// swept configuration on pages of that size mapped into virtual
    /// ranges (rows named `..., pages 20MiB`), charged at the published
    /// VMM costs. Without a sweep, each size adds a `mapped` row (the
    /// default `mapped` row has 20 MiB pages).
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',', value_parser = parse_pages)]
    pages: Vec<Pages>,
    /// On pages (the `mapped` row, `--pages` rows): how long a page no
    /// block touches is kept before it goes back to the device (a time:
    /// 1s, 500ms; `never`); default 10s (`pages::DEFAULT_SPARE_TTL`).
    #[arg(long, value_name = "TIME|never", value_parser = parse_spare_ttl)]
    spare_ttl: Option<Duration>,
    /// Sweep: size-class rules: exact, pow2, pow2/K (K divisions per power
    /// of two, as PyTorch's roundup_power2_divisions), xSIZE (multiples of
    /// a size with a unit: x512B, x2MiB).
    #[arg(long, value_name = "RULE,...", value_delimiter = ',', value_parser = parse_size_class)]
    size_class: Vec<SizeClass>,
    /// Packing settings to try, each KEY=VALUE,... over the defaults (keys:
    /// small, medium, small_segment, medium_segment, max_segment, growth,
    /// multiple, cap, slack, large_rounding, large_fit, capacity, granularity; `on`
    /// for the defaults, `off` for none). The size keys (small, medium,
    /// small_segment, medium_segment, max_segment, large_rounding, capacity,
    /// granularity) take a unit (medium=128MiB, granularity=512B); growth,
    /// multiple, cap, slack and large_fit are plain numbers. Repeat the
    /// option for several.
    #[arg(long, value_name = "KEY=VALUE,...", value_parser = parse_packing)]
    packing: Vec<PackingArg>,
    /// The goal of the recommendation: a memory budget for peak reserved
    /// bytes, as a size with a unit (8GiB, 512MiB; a bare number is
    /// refused) or a multiple of peak live bytes (1.2x).
    /// The recommendation is the configuration with the least modelled
    /// backing time within it. Default 2x.
    #[arg(long, value_name = "SIZE|Fx", default_value = "2x", allow_hyphen_values = true, value_parser = parse_budget)]
    budget: Budget,
    /// What the backing calls cost in the model: `published` (CUDA's
    /// published cudaMalloc / cuMemFree figures), `h200` or `h100`
    /// (cuMemAlloc / cuMemFree measured on an idle NVIDIA H200 or H100, 10
    /// to 400 times less), `host` (a host mmap allocator: anonymous mmap
    /// plus the first touch of every page, and munmap, measured on an AMD
    /// EPYC by `cargo run --release --example host_costs`; 816 µs a MiB
    /// allocated).
    #[arg(long, value_enum, value_name = "MODEL", default_value_t = Costs::Published)]
    costs: Costs,
}

/// The cost model of `--costs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Costs {
    /// `CostModel::cuda`: the published figures.
    Published,
    /// `CostModel::h200`: measured on an idle H200.
    H200,
    /// `CostModel::h100`: measured on an idle H100.
    H100,
    /// `CostModel::host`: mmap + first touch / munmap, measured on a host.
    Host,
}

impl Costs {
    fn model(self) -> CostModel {
        match self {
            Costs::Published => CostModel::cuda(),
            Costs::H200 => CostModel::h200(),
            Costs::H100 => CostModel::h100(),
            Costs::Host => CostModel::host(),
        }
    }

    /// Where the model's figures come from, for the legend.
    fn source(self) -> &'static str {
        match self {
            Costs::Published => "published CUDA figures",
            Costs::H200 => "cuMemAlloc / cuMemFree measured on an idle H200",
            Costs::H100 => "cuMemAlloc / cuMemFree measured on an idle H100",
            Costs::Host => {
                "anonymous mmap + first touch of every page / munmap measured on an AMD EPYC host"
            }
        }
    }

    /// The backing calls, for the legend.
    fn calls(self) -> &'static str {
        match self {
            Costs::Host => "mmap / munmap",
            _ => "cudaMalloc / cuMemFree",
        }
    }
}

#[derive(Args, Debug)]
struct ConvertArgs {
    /// The trace to convert (any supported format).
    #[arg(value_name = "IN")]
    input_file: PathBuf,
    /// Where to write the native trace.
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    #[command(flatten)]
    input: InputArgs,
}

/// A `--packing` value: its text and the setting (`None`: off).
#[derive(Clone, Debug)]
struct PackingArg {
    text: String,
    packing: Option<Packing>,
}

/// The recommendation's memory budget.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Budget {
    Bytes(usize),
    OfLive(f64),
}

fn non_negative(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if !x.is_finite() {
        return Err(format!("`{s}` is not a finite number"));
    }
    if x < 0.0 {
        return Err(format!("`{s}` is negative"));
    }
    Ok(x)
}

/// `10ms`, `1.5s`, `100us`, `250ns`, `2m`; a bare number is milliseconds
/// (read by [`trace::cli::parse_millis`] for `option`).
fn parse_duration(option: &str, s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let mut split = t.trim_end_matches(char::is_alphabetic).len();
    if t[..split].trim().is_empty() {
        // `NaN`, `inf`: a number (rejected below), not a unit.
        split = t.len();
    }
    let (num, unit) = t.split_at(split);
    if unit.is_empty() {
        return cli::parse_millis(option, s).map_err(|e| e.to_string());
    }
    let x = non_negative(num).map_err(|e| format!("{e} (expected a time such as 10ms or 1s)"))?;
    let secs = match unit {
        "ms" => x / 1e3,
        "s" => x,
        "us" | "µs" => x / 1e6,
        "ns" => x / 1e9,
        "m" | "min" => x * 60.0,
        other => return Err(format!("unknown time unit `{other}` (ns, us, ms, s, m)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is out of range"))
}

/// A size with a unit (every size option reads its values so; a bare
/// number is refused).
fn parse_size(option: &str, s: &str) -> Result<usize, String> {
    cli::parse_size(option, s).map_err(|e| e.to_string())
}

fn parse_capacity(s: &str) -> Result<usize, String> {
    let c = parse_size("--capacity", s)?;
    if c == 0 {
        return Err("a capacity of 0 bytes holds nothing".into());
    }
    Ok(c)
}

/// A `--limit` value (`None`: no limit).
#[derive(Clone, Copy, Debug)]
struct Limit(Option<usize>);

fn parse_limit(s: &str) -> Result<Limit, String> {
    if s.trim() == "none" {
        return Ok(Limit(None));
    }
    parse_size("--limit", s).map(|b| Limit(Some(b)))
}

/// A `--gc-threshold` value (`None`: no threshold).
#[derive(Clone, Copy, Debug)]
struct GcThreshold(Option<f64>);

/// A `--spare-ttl` value: a time, or `never` (`Duration::MAX`).
fn parse_spare_ttl(s: &str) -> Result<Duration, String> {
    if s.trim() == "never" {
        return Ok(Duration::MAX);
    }
    parse_duration("--spare-ttl", s)
}

/// A `--pages` value: a page size, or `None` for off.
#[derive(Clone, Copy, Debug)]
struct Pages(Option<usize>);

fn parse_pages(s: &str) -> Result<Pages, String> {
    let t = s.trim();
    if t == "off" {
        return Ok(Pages(None));
    }
    match parse_size("--pages", t)? {
        0 => Err("--pages: a page of zero bytes".into()),
        n => Ok(Pages(Some(n))),
    }
}

fn parse_gc_threshold(s: &str) -> Result<GcThreshold, String> {
    let t = s.trim();
    if t == "none" {
        return Ok(GcThreshold(None));
    }
    match t.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(GcThreshold(Some(f))),
        _ => Err(format!(
            "`{s}` is not a fraction in (0, 1] (such as 0.8) or `none`"
        )),
    }
}

fn parse_budget(s: &str) -> Result<Budget, String> {
    let t = s.trim();
    if let Some(f) = t.strip_suffix(['x', 'X']) {
        return Ok(Budget::OfLive(non_negative(f)?));
    }
    parse_size("--budget", t)
        .map(Budget::Bytes)
        .map_err(|e| format!("{e}; or a multiple of peak live bytes such as 1.5x"))
}

fn parse_stream(s: &str) -> Result<u64, String> {
    let t = s.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    }
    .map_err(|_| format!("`{s}` is not a stream number"))
}

fn parse_size_class(s: &str) -> Result<SizeClass, String> {
    let t = s.trim();
    let bad = || format!("`{s}`: expected exact, pow2, pow2/K or xSIZE (x512B, x2MiB)");
    match t {
        "exact" => Ok(SizeClass::Exact),
        "pow2" => Ok(SizeClass::PowerOfTwo),
        _ => {
            if let Some(k) = t.strip_prefix("pow2/") {
                let k: u32 = k.parse().map_err(|_| bad())?;
                if k == 0 {
                    return Err(bad());
                }
                Ok(SizeClass::PowerOfTwoDivisions(k))
            } else if let Some(n) = t.strip_prefix('x') {
                let n = parse_size("--size-class xSIZE", n)?;
                if n == 0 {
                    return Err(bad());
                }
                Ok(SizeClass::Multiple(n))
            } else {
                Err(bad())
            }
        }
    }
}

/// The `--packing` keys whose values are sizes (and so take a unit).
const PACKING_SIZE_KEYS: [&str; 10] = [
    "small_threshold",
    "small",
    "medium_threshold",
    "medium",
    "small_segment",
    "medium_segment",
    "max_segment",
    "large_rounding",
    "capacity",
    "granularity",
];

fn parse_packing(s: &str) -> Result<PackingArg, String> {
    let t = s.trim();
    let packing = match t {
        "off" | "none" => None,
        "on" | "default" => Some(Packing::default()),
        _ => {
            // Sizes read as every size option reads them (a unit needed),
            // then handed to `Packing`'s parser in bytes.
            let mut parts = Vec::new();
            for part in t.split(',') {
                match part.split_once('=') {
                    Some((k, v)) if PACKING_SIZE_KEYS.contains(&k.trim()) => {
                        let bytes = parse_size(&format!("--packing {}", k.trim()), v)?;
                        parts.push(format!("{}={bytes}B", k.trim()));
                    }
                    _ => parts.push(part.to_string()),
                }
            }
            Some(
                parts
                    .join(",")
                    .parse::<Packing>()
                    .map_err(|e| e.to_string())?,
            )
        }
    };
    Ok(PackingArg {
        text: t.to_string(),
        packing,
    })
}

/// An error and the exit code it gets.
struct Failure {
    code: u8,
    message: String,
}

fn input_error(message: String) -> Failure {
    Failure { code: 2, message }
}

fn runtime_error(message: String) -> Failure {
    Failure { code: 1, message }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Replay(a) => replay(a),
        Command::Convert(a) => convert(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("decaying-pool: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn read_options(a: &InputArgs) -> ReadOptions {
    ReadOptions {
        lenient_frees: !a.strict,
        device: a.device,
        stream: a.stream,
    }
}

/// Why a trace gave no allocation, when `--device` or `--stream` left out
/// every row that would have made one: so that an empty replay or
/// conversion says it was the selection, not the trace.
fn nothing_selected(read: &ReadStats, opts: ReadOptions) -> Option<String> {
    if read.allocs > 0 {
        return None;
    }
    let mut why = Vec::new();
    if let (Some(d), n @ 1..) = (opts.device, read.other_devices) {
        why.push(format!(
            "no allocation on device {d} ({n} rows of other devices skipped; \
             without --device the first device seen is replayed)"
        ));
    }
    if let (Some(s), n @ 1..) = (opts.stream, read.other_streams) {
        why.push(format!(
            "no allocation on stream {s} ({n} rows of other streams skipped)"
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// A trace file's text, ready for a [`TraceReader`]: pickles are
/// converted to PyTorch CSV in memory.
enum Source {
    File(PathBuf),
    Converted(Vec<u8>),
}

impl Source {
    fn open(path: &Path) -> Result<(Source, u64), Failure> {
        let mut f = File::open(path)
            .map_err(|e| input_error(format!("cannot open {}: {e}", path.display())))?;
        let mut head = [0u8; 2];
        let n = f
            .read(&mut head)
            .map_err(|e| input_error(format!("cannot read {}: {e}", path.display())))?;
        if decaying_pool::trace::is_pickle(&head[..n]) {
            let mut bytes = Vec::new();
            f = File::open(path)
                .map_err(|e| input_error(format!("cannot open {}: {e}", path.display())))?;
            f.read_to_end(&mut bytes)
                .map_err(|e| input_error(format!("cannot read {}: {e}", path.display())))?;
            let csv = decaying_pool::trace::snapshot_to_csv(&bytes[..])
                .map_err(|e| input_error(format!("{}: {e}", path.display())))?;
            let len = csv.len() as u64;
            return Ok((Source::Converted(csv), len));
        }
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        Ok((Source::File(path.to_path_buf()), len))
    }

    fn reader(
        &self,
        path: &Path,
        opts: ReadOptions,
    ) -> Result<TraceReader<Box<dyn BufRead + '_>>, Failure> {
        let input: Box<dyn BufRead + '_> = match self {
            Source::File(p) => {
                Box::new(BufReader::new(File::open(p).map_err(|e| {
                    input_error(format!("cannot open {}: {e}", path.display()))
                })?))
            }
            Source::Converted(bytes) => Box::new(Cursor::new(&bytes[..])),
        };
        TraceReader::with_options(input, opts)
            .map_err(|e| input_error(format!("{}: {e}", path.display())))
    }
}

/// Reads the events of one pass, checking that time never goes backwards.
fn for_each_event(
    path: &Path,
    reader: &mut TraceReader<Box<dyn BufRead + '_>>,
    mut f: impl FnMut(&Event, u64),
) -> Result<(), Failure> {
    let mut last: Option<Duration> = None;
    while let Some(ev) = reader.next() {
        let ev = ev.map_err(|e| input_error(format!("{}: {e}", path.display())))?;
        if let Some(prev) = last {
            if ev.time < prev {
                return Err(input_error(format!(
                    "{}: line {}: time goes backwards: {} ns after {} ns",
                    path.display(),
                    reader.stats().lines,
                    ev.time.as_nanos(),
                    prev.as_nanos()
                )));
            }
        }
        last = Some(ev.time);
        f(&ev, reader.stats().bytes);
    }
    Ok(())
}

fn convert(a: &ConvertArgs) -> Result<(), Failure> {
    let out = File::create(&a.output)
        .map_err(|e| input_error(format!("cannot write {}: {e}", a.output.display())))?;
    let (source, _) = Source::open(&a.input_file)?;
    let mut reader = source.reader(&a.input_file, read_options(&a.input))?;
    let format = reader.format();
    let mut w = TraceWriter::new(BufWriter::new(out))
        .map_err(|e| runtime_error(format!("{}: {e}", a.output.display())))?;
    let mut err = None;
    for_each_event(&a.input_file, &mut reader, |ev, _| {
        if err.is_none() {
            err = w.write(ev).err();
        }
    })?;
    let werr = |e: std::io::Error| runtime_error(format!("{}: {e}", a.output.display()));
    if let Some(e) = err {
        return Err(werr(e));
    }
    w.finish().map_err(werr)?;
    let s = reader.stats();
    if let Some(why) = nothing_selected(&s, read_options(&a.input)) {
        eprintln!("warning: {}: {why}", a.input_file.display());
    }
    eprintln!(
        "wrote {}: {} allocations, {} frees (from a {} trace{})",
        a.output.display(),
        s.allocs,
        s.frees,
        if matches!(source, Source::Converted(_)) {
            "PyTorch snapshot pickle, read as a "
        } else {
            ""
        }
        .to_string()
            + &format.to_string(),
        if s.unknown_frees > 0 {
            format!(
                "; {} frees of blocks allocated before the trace began skipped",
                s.unknown_frees
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

/// The exact-cache floor: per size, the peak number of live blocks.
#[derive(Default)]
struct Floor {
    per_size: HashMap<u64, (u64, u64)>,
}

impl Floor {
    fn see(&mut self, e: &Event) {
        let (live, peak) = self.per_size.entry(e.size).or_default();
        match e.op {
            Op::Alloc => {
                *live += 1;
                *peak = (*peak).max(*live);
            }
            Op::Free => *live = live.saturating_sub(1),
        }
    }

    fn total(&self) -> u64 {
        self.per_size.values().map(|&(_, p)| p).sum()
    }
}

struct Outcome {
    name: String,
    description: String,
    /// Reports, each with the capacity it ran on.
    reports: Vec<(Option<usize>, Report)>,
    floor: u64,
    read: Option<ReadStats>,
}

/// The configurations to replay: the defaults, or the sweep; those on
/// pages with `--spare-ttl`'s time.
fn configs(a: &ReplayArgs) -> Vec<Config> {
    let mut v = configs_unset(a);
    if let Some(ttl) = a.spare_ttl {
        for c in v.iter_mut().filter(|c| c.pages.is_some()) {
            c.spare_ttl = Some(ttl);
        }
    }
    v
}

fn configs_unset(a: &ReplayArgs) -> Vec<Config> {
    let sweep = !(a.ttl.is_empty()
        && a.half_life.is_empty()
        && a.slots.is_empty()
        && a.size_class.is_empty()
        && a.limit.is_empty()
        && a.gc_threshold.is_empty());
    if !sweep {
        let mut v = Config::defaults();
        for &Pages(p) in &a.pages {
            if let Some(p) = p {
                v.push(
                    Config::mapped()
                        .pages(p)
                        .named(format!("mapped pages {}", format_size(p))),
                );
            }
        }
        for p in &a.packing {
            if let Some(packing) = p.packing {
                v.push(
                    Config::new(PolicyKind::FixedTime(Duration::from_secs(1)))
                        .packing(packing)
                        .named(format!("packed {}", p.text)),
                );
            }
        }
        return v;
    }
    let mut policies: Vec<PolicyKind> = Vec::new();
    policies.extend(a.ttl.iter().map(|&t| PolicyKind::FixedTime(t)));
    policies.extend(a.half_life.iter().map(|&h| PolicyKind::Exponential(h)));
    policies.extend(a.slots.iter().map(|&n| PolicyKind::FixedCapacity(n)));
    if policies.is_empty() {
        policies.push(PolicyKind::FixedTime(Duration::from_secs(1)));
    }
    let classes = if a.size_class.is_empty() {
        vec![SizeClass::Exact]
    } else {
        a.size_class.clone()
    };
    let packings: Vec<PackingArg> = if a.packing.is_empty() {
        vec![PackingArg {
            text: "off".into(),
            packing: None,
        }]
    } else {
        a.packing.clone()
    };
    let limits = if a.limit.is_empty() {
        vec![Limit(None)]
    } else {
        a.limit.clone()
    };
    let pages = if a.pages.is_empty() {
        vec![Pages(None)]
    } else {
        a.pages.clone()
    };
    let thresholds = if a.gc_threshold.is_empty() {
        vec![GcThreshold(None)]
    } else {
        a.gc_threshold.clone()
    };
    // Keep-all frees nothing but at a threshold: swept with the
    // thresholds, and only where there is one (the row without is the
    // baseline's).
    if thresholds.iter().any(|t| t.0.is_some()) {
        policies.insert(0, PolicyKind::KeepAll);
    }
    let mut v = vec![
        Config::new(PolicyKind::NoPool),
        Config::new(PolicyKind::KeepAll),
    ];
    for &p in &policies {
        for &c in &classes {
            for pk in &packings {
                for &Limit(l) in &limits {
                    for (&GcThreshold(gc), &Pages(pg)) in thresholds
                        .iter()
                        .flat_map(|t| pages.iter().map(move |p| (t, p)))
                    {
                        if p == PolicyKind::KeepAll && gc.is_none() {
                            continue;
                        }
                        let mut cfg = Config::new(p).size_class(c);
                        if let Some(packing) = pk.packing {
                            let name = format!("{}, packed {}", cfg.name, pk.text);
                            cfg = cfg.packing(packing).named(name);
                        }
                        if let Some(l) = l {
                            cfg = cfg.limit(l);
                        }
                        if let Some(gc) = gc {
                            cfg = cfg.gc_threshold(gc);
                        }
                        if let Some(pg) = pg {
                            let name = format!("{}, pages {}", cfg.name, format_size(pg));
                            cfg = cfg.pages(pg).named(name);
                        }
                        v.push(cfg);
                    }
                }
            }
        }
    }
    v
}

fn options(a: &ReplayArgs, capacity: Option<usize>, record: bool) -> ReplayOptions {
    let mut cost = a.costs.model();
    if let Some(c) = capacity {
        cost = cost.with_capacity(c);
    }
    ReplayOptions {
        cost,
        gap: a.gap,
        reaper: (!a.reaper.is_zero()).then_some(a.reaper),
        record,
        record_resolution: Duration::ZERO,
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

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn replay(a: &ReplayArgs) -> Result<(), Failure> {
    let configs = configs(a);
    let record = a.svg.is_some() || a.chrome_trace.is_some();
    let capacities: Vec<Option<usize>> = if a.capacity.is_empty() {
        vec![None]
    } else {
        a.capacity.iter().map(|&c| Some(c)).collect()
    };

    // The workloads' names, then every output opened before the replay.
    let names: Vec<String> = if a.traces.is_empty() {
        workloads::defaults()
            .iter()
            .map(|w| w.name.to_string())
            .collect()
    } else {
        a.traces.iter().map(|p| file_name(p)).collect()
    };
    let several = names.len() > 1;
    let mut outputs: HashMap<(usize, &'static str), (PathBuf, File)> = HashMap::new();
    for (kind, base) in [("svg", &a.svg), ("chrome", &a.chrome_trace)] {
        if let Some(base) = base {
            for (i, n) in names.iter().enumerate() {
                let p = out_path(base, n, several);
                let f = File::create(&p)
                    .map_err(|e| input_error(format!("cannot write {}: {e}", p.display())))?;
                outputs.insert((i, kind), (p, f));
            }
        }
    }

    let mut outcomes = Vec::new();
    if a.traces.is_empty() {
        for w in workloads::defaults() {
            let caps = if a.capacity.is_empty() {
                vec![w.capacity]
            } else {
                capacities.clone()
            };
            let mut replayers: Vec<Replayer> = caps
                .iter()
                .map(|&c| Replayer::new(&configs, options(a, c, record)))
                .collect();
            let mut floor = Floor::default();
            for pass in 0..a.repeat {
                for r in &mut replayers {
                    r.begin_pass();
                }
                for ev in &w.events {
                    if pass == 0 {
                        floor.see(ev);
                    }
                    for r in &mut replayers {
                        r.event(ev);
                    }
                }
            }
            outcomes.push(Outcome {
                name: w.name.to_string(),
                description: w.description.to_string(),
                reports: finish(caps, replayers, w.name),
                floor: floor.total(),
                read: None,
            });
        }
    } else {
        for p in &a.traces {
            match replay_file(a, p, &configs, &capacities, record) {
                Ok(o) => outcomes.push(o),
                Err(f) => {
                    // Leave no empty output behind.
                    for (p, _) in outputs.values() {
                        let _ = std::fs::remove_file(p);
                    }
                    return Err(f);
                }
            }
        }
    }

    for (i, o) in outcomes.iter().enumerate() {
        let recs: Vec<StatsTimeline> = o
            .reports
            .iter()
            .filter_map(|(_, r)| r.timeline.clone())
            .collect();
        for kind in ["chrome", "svg"] {
            if let Some((p, f)) = outputs.remove(&(i, kind)) {
                let mut w = BufWriter::new(f);
                let res = if kind == "svg" {
                    write_svg(&mut w, &format!("{}: bytes over trace time", o.name), &recs)
                } else {
                    write_chrome_trace(&mut w, &recs)
                };
                res.and_then(|()| w.flush())
                    .map_err(|e| runtime_error(format!("writing {}: {e}", p.display())))?;
                eprintln!("wrote {}", p.display());
            }
        }
    }

    if a.json {
        let all: Vec<Report> = outcomes
            .into_iter()
            .flat_map(|o| o.reports)
            .map(|(c, mut r)| {
                if capacities.len() > 1 {
                    r.policy = label(&r, c, true);
                }
                r
            })
            .collect();
        return written(|out| writeln!(out, "{}", reports_to_json(&all)));
    }
    written(|out| {
        for o in &outcomes {
            print_outcome(out, a, o, capacities.len() > 1)?;
        }
        writeln!(
            out,
            "hits: requests served from the cache; b.allocs / b.frees: backing allocator calls \
             ({});\npeak res: peak reserved bytes, ÷live: over the trace's \
             peak live bytes; idle: integral of cached bytes over time;\nbacking: modelled time \
             in the backing allocator ({}); failures: requests the device could not serve.\n\
             mapped: blocks on pages mapped into address space (pages of 20 MiB, or a 64th of a \
             small device); its b.allocs are pages created (cuMemCreate),\nits b.frees the times \
             pages went back (cuMemUnmap + cuMemRelease), its idle bytes spare pages, its backing \
             time the VMM calls at published costs.",
            a.costs.calls(),
            a.costs.source()
        )
    })
}

/// Writes the results to standard output through `write`. A reader that
/// went away (`| head`) ends the output quietly, as it ends `cat`'s;
/// another write error is a failure.
fn written(
    write: impl FnOnce(&mut BufWriter<std::io::StdoutLock<'_>>) -> std::io::Result<()>,
) -> Result<(), Failure> {
    let mut out = BufWriter::new(std::io::stdout().lock());
    match write(&mut out).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(runtime_error(format!("cannot write the results: {e}"))),
    }
}

/// A report's configuration, with its capacity when several were swept.
fn label(r: &Report, capacity: Option<usize>, with_capacity: bool) -> String {
    match (with_capacity, capacity) {
        (true, Some(c)) => format!("{} @ {}", r.policy, human(c as f64)),
        _ => r.policy.clone(),
    }
}

/// A page size as `--pages` takes it: `20MiB`, `64KiB`, `1000B`.
fn format_size(bytes: usize) -> String {
    match bytes {
        b if b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

fn human(b: f64) -> String {
    const K: f64 = 1024.0;
    if b < K {
        format!("{b:.0} B")
    } else if b < K * K {
        format!("{:.1} KiB", b / K)
    } else if b < K * K * K {
        format!("{:.1} MiB", b / (K * K))
    } else {
        format!("{:.2} GiB", b / (K * K * K))
    }
}

fn finish(
    caps: Vec<Option<usize>>,
    replayers: Vec<Replayer>,
    name: &str,
) -> Vec<(Option<usize>, Report)> {
    caps.into_iter()
        .zip(replayers)
        .flat_map(|(c, r)| r.finish(name).into_iter().map(move |rep| (c, rep)))
        .collect()
}

fn replay_file(
    a: &ReplayArgs,
    path: &Path,
    configs: &[Config],
    capacities: &[Option<usize>],
    record: bool,
) -> Result<Outcome, Failure> {
    let opts = read_options(&a.input);
    let (source, len) = Source::open(path)?;
    let mut replayers: Vec<Replayer> = capacities
        .iter()
        .map(|&c| {
            let mut o = options(a, c, record);
            if len > 64 << 20 {
                o.record_resolution = Duration::from_micros(100);
            }
            Replayer::new(configs, o)
        })
        .collect();
    let bar = ProgressBar::new(len * u64::from(a.repeat));
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let name = file_name(path);
    bar.set_message(name.clone());
    let mut floor = Floor::default();
    let mut read = None;
    let mut format = None;
    for pass in 0..a.repeat {
        let mut reader = source.reader(path, opts)?;
        format = Some(reader.format());
        for r in &mut replayers {
            r.begin_pass();
        }
        let done = u64::from(pass) * len;
        let mut n = 0u64;
        for_each_event(path, &mut reader, |ev, bytes| {
            if pass == 0 {
                floor.see(ev);
            }
            for r in &mut replayers {
                r.event(ev);
            }
            n += 1;
            if n % 4096 == 0 {
                bar.set_position(done + bytes);
            }
        })?;
        read.get_or_insert(reader.stats());
        bar.set_position(done + len);
    }
    bar.finish_and_clear();
    let read = read.unwrap_or_default();
    let selection = nothing_selected(&read, opts);
    if let Some(why) = &selection {
        eprintln!("warning: {}: {why}", path.display());
    }
    let kind = match (&source, format) {
        (Source::Converted(_), _) => "PyTorch snapshot pickle".to_string(),
        (_, Some(f)) => format!("{f} trace"),
        _ => "trace".to_string(),
    };
    Ok(Outcome {
        description: format!(
            "{kind}, {} allocations, {} frees{}",
            read.allocs,
            read.frees,
            if read.unknown_frees > 0 {
                format!(
                    ", {} frees of blocks allocated before the trace began skipped",
                    read.unknown_frees
                )
            } else {
                String::new()
            } + &selection.map(|why| format!(": {why}")).unwrap_or_default()
        ),
        reports: finish(capacities.to_vec(), replayers, &name),
        name,
        floor: floor.total(),
        read: Some(read),
    })
}

fn print_outcome(
    out: &mut impl Write,
    a: &ReplayArgs,
    o: &Outcome,
    several_caps: bool,
) -> std::io::Result<()> {
    let Some((_, first)) = o.reports.first() else {
        return Ok(());
    };
    writeln!(out, "== {} ==", o.name)?;
    writeln!(out, "   {}", o.description)?;
    let mut extra = if a.repeat > 1 {
        format!(", {} passes {:?} apart", a.repeat, a.gap)
    } else {
        String::new()
    };
    if !a.reaper.is_zero() {
        extra.push_str(&format!(", collect every {:?}", a.reaper));
    }
    writeln!(
        out,
        "   {:.3} s of trace time{extra}; peak live {:.1} MiB; exact-cache floor {} backing allocations{}",
        first.span_seconds,
        first.peak_live_bytes as f64 / (1u64 << 20) as f64,
        o.floor,
        if a.repeat > 1 { " per pass" } else { "" },
    )?;
    if let Some(r) = &o.read {
        if r.zero_size > 0 {
            writeln!(out, "   {} zero-byte allocations skipped", r.zero_size)?;
        }
    }
    writeln!(out)?;
    let reports: Vec<Report> = o
        .reports
        .iter()
        .map(|(c, r)| {
            let mut r = r.clone();
            r.policy = label(&r, *c, several_caps);
            r
        })
        .collect();
    write!(out, "{}", format_table(&reports))?;
    writeln!(out)?;
    write!(out, "{}", sweep::recommend(&reports, a.budget))?;
    writeln!(out)?;
    Ok(())
}
