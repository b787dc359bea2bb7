//! Allocation traces: read them, write them, replay them through every
//! policy, and show what the pool did.
//!
//! A trace is a sequence of timed [`Event`]s: a block of `size` bytes at
//! address `addr` is allocated, and later freed. [`TraceReader`] streams
//! one from any [`BufRead`] (a 1 GB log is never loaded whole), detecting
//! the format from its header line:
//!
//! - [`Format::PyTorch`]: a PyTorch CUDA caching-allocator snapshot
//!   converted to CSV, header `device,time_us,action,addr,size,stream`.
//!   `alloc` is an allocation and `free_completed` the moment the block is
//!   reusable; `free_requested`, `segment_alloc` and `segment_free` are
//!   PyTorch's own bookkeeping and are ignored. Lines starting with `#` are
//!   comments. Only one device is replayed (the first one seen, or
//!   [`ReadOptions::device`]); rows of other devices are ignored.
//! - [`Format::Rmm`]: RMM's `logging_resource_adaptor` CSV, header
//!   `Thread,Time,Action,Pointer,Size,Stream`. `Time` is wall clock
//!   `HH:MM:SS.ffffff` without a date (a time more than 12 hours before the
//!   previous one is taken as the next day; newer RMM versions write seconds
//!   since the epoch, `1634567890.123456`, which is read too); actions
//!   `allocate` and `free` (or `deallocate`); `allocate failure` rows are
//!   skipped.
//! - [`Format::Native`], this crate's own, written by [`TraceWriter`]:
//!
//!   ```text
//!   # comments start with '#'
//!   time_ns,action,addr,size
//!   0,alloc,0x1000,4096
//!   1500,free,0x1000,4096
//!   ```
//!
//!   `time_ns` is an integer number of nanoseconds from any origin,
//!   `action` is `alloc` or `free`, `addr` is hexadecimal with `0x` and
//!   identifies the block until it is freed, `size` is in bytes (on a
//!   `free` it may be `0`, meaning "as allocated").
//!
//! # Errors and leniency
//!
//! Bad input gives a [`TraceError`] naming the line, never a panic: an
//! unknown header, a malformed row, an allocation of an address that is
//! still live, a free whose size differs from the allocation's, and a free
//! of an address that is not live. The last one is common in real traces:
//! a snapshot starts in the middle of a program, so it frees blocks
//! allocated before it began (the shipped PyTorch training trace has 438).
//! It is an error by default; with [`ReadOptions::lenient_frees`] such frees
//! are skipped and counted in [`ReadStats::unknown_frees`]. Allocations of
//! zero bytes are skipped (and so are their frees), counted in
//! [`ReadStats::zero_size`].
//!
//! # Replay and observability
//!
//! [`Replayer`] runs a trace through several [`Config`]urations at once, on
//! trace time, over a [`ModelledAllocator`] that charges what CUDA would,
//! and gives a [`Report`] per configuration. A [`StatsTimeline`] turns a pool's
//! [`Stats`](crate::Stats) over time into counter tracks and instant events,
//! exported by [`write_chrome_trace`] (Perfetto, `chrome://tracing`) and
//! [`write_svg`] (a chart). [`workloads`] holds small built-in traces.
//!
//! # Examples
//!
//! ```
//! use decaying_pool::trace::{Config, Replayer, ReplayOptions, TraceReader};
//!
//! let csv = "device,time_us,action,addr,size,stream\n\
//!            0,1000,alloc,0x10,4096,0\n\
//!            0,1100,free_completed,0x10,4096,0\n\
//!            0,1200,alloc,0x20,4096,0\n";
//! let reader = TraceReader::new(csv.as_bytes())?;
//! let mut replayer = Replayer::new(&Config::defaults(), ReplayOptions::default());
//! for event in reader {
//!     replayer.event(&event?);
//! }
//! let reports = replayer.finish("example");
//! let keep_all = reports.iter().find(|r| r.policy == "keep-all").unwrap();
//! assert_eq!((keep_all.backing_allocs, keep_all.hits), (1, 1));
//! # Ok::<(), decaying_pool::trace::TraceError>(())
//! ```

use core::fmt;
use core::time::Duration;
use std::collections::HashMap;
use std::io::{self, BufRead, Write};

mod chrome;
pub mod cli;
mod logging;
#[cfg(feature = "pickle")]
mod pickle;
mod replay;
mod svg;
mod timeline;
pub mod workloads;

pub use chrome::write_chrome_trace;
pub use logging::{LoggingAllocator, RequestLog, TraceAddress};
#[cfg(feature = "pickle")]
#[cfg_attr(docsrs, doc(cfg(feature = "pickle")))]
pub use pickle::{is_pickle, snapshot_to_csv};
pub use replay::{
    Config, CostCurve, CostModel, ModelledAllocator, OutOfMemory, PageSize, PolicyKind,
    ReplayOptions, Replayer, Report, format_table, reports_to_json,
};
pub use svg::write_svg;
pub use timeline::{Instant, InstantKind, Sample, StatsTimeline};

/// What happens to a block in an [`Event`].
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::Op;
/// assert_ne!(Op::Alloc, Op::Free);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// The block is allocated.
    Alloc,
    /// The block is freed (reusable from now on).
    Free,
}

/// One timed allocation or free.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::Event;
/// let e = Event::alloc(Duration::from_micros(5), 0x1000, 4096);
/// assert_eq!(Event::free(e.time, e.addr, e.size).addr, 0x1000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    /// When it happened, from the trace's own origin.
    pub time: Duration,
    /// Allocation or free.
    pub op: Op,
    /// The block's identity: its address, unique among live blocks.
    pub addr: u64,
    /// The block's size in bytes. A [`TraceReader`] always gives the
    /// allocation's size on a free.
    pub size: u64,
}

impl Event {
    /// An allocation.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Event, Op};
    /// assert_eq!(Event::alloc(Default::default(), 1, 2).op, Op::Alloc);
    /// ```
    pub fn alloc(time: Duration, addr: u64, size: u64) -> Self {
        Event {
            time,
            op: Op::Alloc,
            addr,
            size,
        }
    }

    /// A free.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Event, Op};
    /// assert_eq!(Event::free(Default::default(), 1, 2).op, Op::Free);
    /// ```
    pub fn free(time: Duration, addr: u64, size: u64) -> Self {
        Event {
            time,
            op: Op::Free,
            addr,
            size,
        }
    }
}

/// A trace file format, detected from the header line.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::Format;
/// assert_eq!(Format::detect("Thread,Time,Action,Pointer,Size,Stream"), Some(Format::Rmm));
/// assert_eq!(Format::detect("time_ns,action,addr,size"), Some(Format::Native));
/// assert_eq!(Format::detect("a,b,c"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// This crate's `time_ns,action,addr,size`.
    Native,
    /// PyTorch snapshot CSV, `device,time_us,action,addr,size,stream`.
    PyTorch,
    /// RMM logging adaptor CSV, `Thread,Time,Action,Pointer,Size,Stream`.
    Rmm,
}

const NATIVE_HEADER: &str = "time_ns,action,addr,size";
const PYTORCH_HEADER: &str = "device,time_us,action,addr,size,stream";
const RMM_HEADER: &str = "thread,time,action,pointer,size,stream";

impl Format {
    /// The format whose header `line` is (spaces and case ignored).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::Format;
    /// assert_eq!(Format::detect("device, time_us, action, addr, size, stream"), Some(Format::PyTorch));
    /// ```
    pub fn detect(line: &str) -> Option<Format> {
        let norm: String = line
            .trim()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_lowercase();
        match norm.as_str() {
            NATIVE_HEADER => Some(Format::Native),
            PYTORCH_HEADER => Some(Format::PyTorch),
            RMM_HEADER => Some(Format::Rmm),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Native => "native",
            Format::PyTorch => "pytorch",
            Format::Rmm => "rmm",
        })
    }
}

/// What went wrong reading a trace.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::{TraceErrorKind, TraceReader};
/// let err = TraceReader::new("x,y\n".as_bytes()).err().unwrap();
/// assert_eq!(err.line, Some(1));
/// assert!(matches!(err.kind, TraceErrorKind::UnknownHeader(_)));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// Reading failed.
    Io(io::Error),
    /// The trace file could not be opened.
    Open {
        /// The file's path.
        path: std::path::PathBuf,
        /// Why it could not be opened.
        source: io::Error,
    },
    /// The input held no header line.
    Empty,
    /// The header line is none of the known formats.
    UnknownHeader(String),
    /// A row could not be parsed.
    Malformed(String),
    /// A free of an address that is not live (see [`ReadOptions::lenient_frees`]).
    UnknownFree {
        /// The address freed.
        addr: u64,
    },
    /// An allocation of an address that is still live.
    DoubleAlloc {
        /// The address allocated.
        addr: u64,
    },
    /// A free whose size differs from the allocation's.
    SizeMismatch {
        /// The address freed.
        addr: u64,
        /// The size it was allocated with.
        allocated: u64,
        /// The size the free names.
        freed: u64,
    },
}

/// An error reading a trace, with the line it was found on.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::TraceReader;
/// let text = "time_ns,action,addr,size\n0,free,0x10,8\n";
/// let err = TraceReader::new(text.as_bytes()).unwrap().next().unwrap().unwrap_err();
/// assert_eq!(err.to_string(), "line 2: free of 0x10, which is not live");
/// ```
#[derive(Debug)]
pub struct TraceError {
    /// The 1-based line number, when the error belongs to a line.
    pub line: Option<u64>,
    /// What went wrong.
    pub kind: TraceErrorKind,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        match &self.kind {
            TraceErrorKind::Io(e) => write!(f, "read error: {e}"),
            TraceErrorKind::Open { path, source } => {
                write!(f, "cannot open {}: {source}", path.display())
            }
            TraceErrorKind::Empty => f.write_str("no header line: empty trace"),
            TraceErrorKind::UnknownHeader(h) => write!(
                f,
                "unknown header {h:?}; expected {PYTORCH_HEADER:?} (PyTorch), \
                 \"Thread,Time,Action,Pointer,Size,Stream\" (RMM) or {NATIVE_HEADER:?} (native)"
            ),
            TraceErrorKind::Malformed(what) => f.write_str(what),
            TraceErrorKind::UnknownFree { addr } => {
                write!(f, "free of {addr:#x}, which is not live")
            }
            TraceErrorKind::DoubleAlloc { addr } => {
                write!(f, "allocation of {addr:#x}, which is still live")
            }
            TraceErrorKind::SizeMismatch {
                addr,
                allocated,
                freed,
            } => write!(
                f,
                "free of {addr:#x} with size {freed}, allocated with size {allocated}"
            ),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            TraceErrorKind::Io(e) | TraceErrorKind::Open { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for TraceError {
    fn from(e: io::Error) -> Self {
        TraceError {
            line: None,
            kind: TraceErrorKind::Io(e),
        }
    }
}

/// How a [`TraceReader`] treats what real traces contain.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::{ReadOptions, TraceReader};
/// let text = "time_ns,action,addr,size\n0,free,0x10,8\n";
/// let opts = ReadOptions { lenient_frees: true, ..ReadOptions::default() };
/// let mut r = TraceReader::with_options(text.as_bytes(), opts).unwrap();
/// assert!(r.next().is_none());
/// assert_eq!(r.stats().unknown_frees, 1);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Skip frees of addresses that are not live (allocated before the
    /// trace began) instead of failing. Default `false`.
    pub lenient_frees: bool,
    /// PyTorch traces: the device to replay. Default: the first one seen.
    pub device: Option<u32>,
    /// PyTorch and RMM traces: replay only the rows of this stream
    /// (PyTorch's stream number, RMM's stream handle); rows of other
    /// streams are ignored. Default: every stream.
    pub stream: Option<u64>,
}

/// What a [`TraceReader`] has read so far.
///
/// # Examples
///
/// ```
/// let s = decaying_pool::trace::ReadStats::default();
/// assert_eq!(s.allocs + s.frees, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Lines read, the header and comments included.
    pub lines: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Allocation events produced.
    pub allocs: u64,
    /// Free events produced.
    pub frees: u64,
    /// Frees of addresses that were not live, skipped (lenient mode).
    pub unknown_frees: u64,
    /// Zero-byte allocations skipped (and their frees).
    pub zero_size: u64,
    /// RMM `allocate failure` rows skipped.
    pub failed_allocs: u64,
    /// Rows ignored: other PyTorch actions, other devices and streams.
    pub ignored: u64,
    /// Of the rows ignored, those of PyTorch devices other than the one
    /// replayed ([`ReadOptions::device`], or the first one seen).
    pub other_devices: u64,
    /// Of the rows ignored, those of streams other than
    /// [`ReadOptions::stream`].
    pub other_streams: u64,
}

/// A streaming trace reader: an iterator of [`Event`]s, in file order.
///
/// It keeps only the live blocks in memory. After the first error it
/// yields nothing more.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::{Format, Op, TraceReader};
/// let text = "Thread,Time,Action,Pointer,Size,Stream\n\
///             1,23:59:59.999000,allocate,0x7f00,256,0x0\n\
///             1,23:59:59.999500,allocate failure,0x0,1099511627776,0x0\n\
///             1,00:00:00.000500,free,0x7f00,256,0x0\n";
/// let mut r = TraceReader::new(text.as_bytes())?;
/// assert_eq!(r.format(), Format::Rmm);
/// let a = r.next().unwrap()?;
/// let f = r.next().unwrap()?;
/// assert_eq!(f.op, Op::Free);
/// assert_eq!((f.time - a.time).as_micros(), 1500); // across midnight
/// assert_eq!(r.stats().failed_allocs, 1);
/// # Ok::<(), decaying_pool::trace::TraceError>(())
/// ```
pub struct TraceReader<R> {
    input: R,
    format: Format,
    options: ReadOptions,
    line: String,
    stats: ReadStats,
    live: HashMap<u64, u64>,
    failed: bool,
    /// RMM: nanoseconds added for days passed; the previous time of day.
    rmm_day: u64,
    rmm_prev: Option<u64>,
}

impl<R: fmt::Debug> fmt::Debug for TraceReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceReader")
            .field("format", &self.format)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl TraceReader<io::BufReader<std::fs::File>> {
    /// Opens a trace file with the given options.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened ([`TraceErrorKind::Open`], naming
    /// the path) or its header is not a known format.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{ReadOptions, TraceReader};
    /// let err = TraceReader::open("/no/such/trace.csv", ReadOptions::default()).unwrap_err();
    /// assert!(err.to_string().starts_with("cannot open /no/such/trace.csv: "));
    /// ```
    pub fn open(
        path: impl AsRef<std::path::Path>,
        options: ReadOptions,
    ) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|source| TraceError {
            line: None,
            kind: TraceErrorKind::Open {
                path: path.to_owned(),
                source,
            },
        })?;
        Self::with_options(io::BufReader::with_capacity(1 << 16, file), options)
    }
}

impl<R: BufRead> TraceReader<R> {
    /// Reads the header of `input` with the default (strict) options.
    ///
    /// # Errors
    ///
    /// When reading fails or the header is not a known format.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Format, TraceReader};
    /// let r = TraceReader::new("# hi\ntime_ns,action,addr,size\n".as_bytes()).unwrap();
    /// assert_eq!(r.format(), Format::Native);
    /// ```
    pub fn new(input: R) -> Result<Self, TraceError> {
        Self::with_options(input, ReadOptions::default())
    }

    /// Reads the header of `input`.
    ///
    /// # Errors
    ///
    /// When reading fails or the header is not a known format.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{ReadOptions, TraceReader};
    /// let r = TraceReader::with_options("".as_bytes(), ReadOptions::default());
    /// assert_eq!(r.unwrap_err().to_string(), "line 1: no header line: empty trace");
    /// ```
    pub fn with_options(input: R, options: ReadOptions) -> Result<Self, TraceError> {
        let mut r = TraceReader {
            input,
            format: Format::Native,
            options,
            line: String::new(),
            stats: ReadStats::default(),
            live: HashMap::new(),
            failed: false,
            rmm_day: 0,
            rmm_prev: None,
        };
        loop {
            if !r.read_line()? {
                return Err(r.error(TraceErrorKind::Empty));
            }
            let l = r.line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            match Format::detect(l) {
                Some(f) => {
                    r.format = f;
                    return Ok(r);
                }
                None => {
                    let h = l.to_owned();
                    return Err(r.error(TraceErrorKind::UnknownHeader(h)));
                }
            }
        }
    }

    /// The format detected from the header.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Format, TraceReader};
    /// let r = TraceReader::new("device,time_us,action,addr,size,stream".as_bytes()).unwrap();
    /// assert_eq!(r.format(), Format::PyTorch);
    /// ```
    pub fn format(&self) -> Format {
        self.format
    }

    /// What has been read so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::TraceReader;
    /// let r = TraceReader::new("time_ns,action,addr,size\n".as_bytes()).unwrap();
    /// assert_eq!(r.stats().lines, 1);
    /// ```
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// Blocks allocated in the trace and not freed by the events read so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::TraceReader;
    /// let mut r = TraceReader::new("time_ns,action,addr,size\n0,alloc,0x1,8\n".as_bytes()).unwrap();
    /// r.next();
    /// assert_eq!(r.live_blocks(), 1);
    /// ```
    pub fn live_blocks(&self) -> usize {
        self.live.len()
    }

    fn read_line(&mut self) -> Result<bool, TraceError> {
        self.line.clear();
        let n = self
            .input
            .read_line(&mut self.line)
            .map_err(|e| TraceError {
                line: Some(self.stats.lines + 1),
                kind: TraceErrorKind::Io(e),
            })?;
        if n == 0 {
            return Ok(false);
        }
        self.stats.lines += 1;
        self.stats.bytes += n as u64;
        if self.stats.lines == 1 && self.line.starts_with('\u{feff}') {
            // A UTF-8 byte-order mark, as spreadsheet programs write.
            self.line.drain(..'\u{feff}'.len_utf8());
        }
        Ok(true)
    }

    fn error(&self, kind: TraceErrorKind) -> TraceError {
        TraceError {
            line: Some(self.stats.lines.max(1)),
            kind,
        }
    }

    /// Parses the current line: `Ok(None)` for a line that makes no event.
    fn parse(&mut self) -> Result<Option<Event>, TraceErrorKind> {
        let line = self.line.trim();
        if line.is_empty() || line.starts_with('#') {
            return Ok(None);
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let want = match self.format {
            Format::Native => 4,
            Format::PyTorch | Format::Rmm => 6,
        };
        if fields.len() != want {
            return Err(malformed(format!(
                "expected {want} comma-separated fields, found {}",
                fields.len()
            )));
        }
        if let (Some(want), Format::PyTorch | Format::Rmm) = (self.options.stream, self.format) {
            let s = fields[5];
            let stream = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => s.parse::<u64>().ok(),
            }
            .ok_or_else(|| malformed(format!("stream {s:?} is not a number")))?;
            if stream != want {
                self.stats.ignored += 1;
                self.stats.other_streams += 1;
                return Ok(None);
            }
        }
        let (time_ns, op, addr, size) = match self.format {
            Format::Native => {
                let t = parse_u64(fields[0], "time_ns")?;
                let op = match fields[1] {
                    "alloc" => Op::Alloc,
                    "free" => Op::Free,
                    other => {
                        return Err(malformed(format!(
                            "unknown action {other:?} (expected alloc or free)"
                        )));
                    }
                };
                (
                    t,
                    op,
                    parse_hex(fields[2], "addr")?,
                    parse_u64(fields[3], "size")?,
                )
            }
            Format::PyTorch => {
                let op = match fields[2] {
                    "alloc" => Op::Alloc,
                    "free_completed" => Op::Free,
                    "free_requested" | "segment_alloc" | "segment_free" | "segment_map"
                    | "segment_unmap" | "snapshot" | "oom" => {
                        self.stats.ignored += 1;
                        return Ok(None);
                    }
                    other => return Err(malformed(format!("unknown action {other:?}"))),
                };
                let device = u32::try_from(parse_u64(fields[0], "device")?)
                    .map_err(|_| malformed(format!("device {:?} out of range", fields[0])))?;
                match self.options.device {
                    None => self.options.device = Some(device),
                    Some(d) if d != device => {
                        self.stats.ignored += 1;
                        self.stats.other_devices += 1;
                        return Ok(None);
                    }
                    Some(_) => {}
                }
                let us = parse_u64(fields[1], "time_us")?;
                let t = us
                    .checked_mul(1000)
                    .ok_or_else(|| malformed(format!("time_us {us} out of range")))?;
                (
                    t,
                    op,
                    parse_hex(fields[3], "addr")?,
                    parse_u64(fields[4], "size")?,
                )
            }
            Format::Rmm => {
                let op = match fields[2] {
                    "allocate" => Op::Alloc,
                    "free" | "deallocate" => Op::Free,
                    "allocate failure" => {
                        self.stats.failed_allocs += 1;
                        return Ok(None);
                    }
                    other => return Err(malformed(format!("unknown action {other:?}"))),
                };
                let tod = if fields[1].contains(':') {
                    parse_time_of_day(fields[1])?
                } else {
                    // Some RMM versions log seconds since the epoch.
                    parse_seconds(fields[1])?
                };
                let out_of_range = || malformed(format!("time {:?} out of range", fields[1]));
                let mut day = self.rmm_day;
                if let Some(prev) = self.rmm_prev {
                    const HALF_DAY: u64 = 12 * 3600 * 1_000_000_000;
                    if tod.saturating_add(HALF_DAY) < prev {
                        day = day.checked_add(2 * HALF_DAY).ok_or_else(out_of_range)?;
                    }
                }
                let t = day.checked_add(tod).ok_or_else(out_of_range)?;
                self.rmm_day = day;
                self.rmm_prev = Some(tod);
                (
                    t,
                    op,
                    parse_hex(fields[3], "pointer")?,
                    parse_u64(fields[4], "size")?,
                )
            }
        };
        let time = Duration::from_nanos(time_ns);
        match op {
            Op::Alloc => {
                if self.live.insert(addr, size).is_some() {
                    return Err(TraceErrorKind::DoubleAlloc { addr });
                }
                if size == 0 {
                    self.stats.zero_size += 1;
                    return Ok(None);
                }
                self.stats.allocs += 1;
                Ok(Some(Event::alloc(time, addr, size)))
            }
            Op::Free => match self.live.get(&addr).copied() {
                None if self.options.lenient_frees => {
                    self.stats.unknown_frees += 1;
                    Ok(None)
                }
                None => Err(TraceErrorKind::UnknownFree { addr }),
                Some(allocated) => {
                    if size != 0 && size != allocated {
                        return Err(TraceErrorKind::SizeMismatch {
                            addr,
                            allocated,
                            freed: size,
                        });
                    }
                    self.live.remove(&addr);
                    if allocated == 0 {
                        return Ok(None);
                    }
                    self.stats.frees += 1;
                    Ok(Some(Event::free(time, addr, allocated)))
                }
            },
        }
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<Event, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            match self.read_line() {
                Ok(false) => return None,
                Ok(true) => {}
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
            match self.parse() {
                Ok(Some(ev)) => return Some(Ok(ev)),
                Ok(None) => {}
                Err(kind) => {
                    self.failed = true;
                    return Some(Err(self.error(kind)));
                }
            }
        }
    }
}

fn malformed(what: String) -> TraceErrorKind {
    TraceErrorKind::Malformed(what)
}

fn parse_u64(s: &str, what: &str) -> Result<u64, TraceErrorKind> {
    s.parse::<u64>()
        .map_err(|e| malformed(format!("{what} {s:?}: {e}")))
}

fn parse_hex(s: &str, what: &str) -> Result<u64, TraceErrorKind> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|e| malformed(format!("{what} {s:?}: {e}")))
}

/// `SSSS[.ffffff…]` (seconds since the epoch) to nanoseconds.
fn parse_seconds(s: &str) -> Result<u64, TraceErrorKind> {
    let bad = || malformed(format!("time {s:?}: expected HH:MM:SS.ffffff or seconds"));
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 9
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let secs: u64 = whole.parse().map_err(|_| bad())?;
    let mut nanos = 0u64;
    for (i, b) in frac.bytes().enumerate() {
        nanos += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
    }
    secs.checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(nanos))
        .ok_or_else(bad)
}

/// `HH:MM:SS[.ffffff…]` to nanoseconds since midnight.
fn parse_time_of_day(s: &str) -> Result<u64, TraceErrorKind> {
    let bad = || malformed(format!("time {s:?}: expected HH:MM:SS.ffffff"));
    let mut parts = s.split(':');
    let (Some(h), Some(m), Some(sec), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let (whole, frac) = sec.split_once('.').unwrap_or((sec, ""));
    let num = |x: &str, max: u64| -> Result<u64, TraceErrorKind> {
        if x.is_empty() || !x.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let v = x.parse::<u64>().map_err(|_| bad())?;
        if v > max {
            return Err(bad());
        }
        Ok(v)
    };
    let (h, m, whole) = (num(h, 23)?, num(m, 59)?, num(whole, 60)?);
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let mut nanos = 0u64;
    for (i, b) in frac.bytes().enumerate() {
        nanos += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
    }
    Ok(((h * 60 + m) * 60 + whole) * 1_000_000_000 + nanos)
}

/// Writes traces in the [`Format::Native`] format.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{Event, TraceReader, TraceWriter};
///
/// let events = vec![
///     Event::alloc(Duration::from_nanos(0), 0x10, 4096),
///     Event::free(Duration::from_nanos(1500), 0x10, 4096),
/// ];
/// let mut w = TraceWriter::new(Vec::new())?;
/// for e in &events {
///     w.write(e)?;
/// }
/// let bytes = w.finish()?;
/// let back: Vec<Event> = TraceReader::new(&bytes[..])?.collect::<Result<_, _>>()?;
/// assert_eq!(back, events);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: W,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header to `out`.
    ///
    /// # Errors
    ///
    /// When writing fails.
    ///
    /// # Examples
    ///
    /// ```
    /// let w = decaying_pool::trace::TraceWriter::new(Vec::new()).unwrap();
    /// assert_eq!(w.finish().unwrap(), b"time_ns,action,addr,size\n");
    /// ```
    pub fn new(mut out: W) -> io::Result<Self> {
        writeln!(out, "{NATIVE_HEADER}")?;
        Ok(TraceWriter { out })
    }

    /// Writes one event.
    ///
    /// # Errors
    ///
    /// When writing fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::{Event, TraceWriter};
    /// let mut w = TraceWriter::new(Vec::new()).unwrap();
    /// w.write(&Event::alloc(core::time::Duration::from_nanos(7), 0xab, 64)).unwrap();
    /// assert!(String::from_utf8(w.finish().unwrap()).unwrap().ends_with("7,alloc,0xab,64\n"));
    /// ```
    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        let action = match event.op {
            Op::Alloc => "alloc",
            Op::Free => "free",
        };
        writeln!(
            self.out,
            "{},{action},{:#x},{}",
            event.time.as_nanos(),
            event.addr,
            event.size
        )
    }

    /// Flushes and returns the output.
    ///
    /// # Errors
    ///
    /// When flushing fails.
    ///
    /// # Examples
    ///
    /// ```
    /// let w = decaying_pool::trace::TraceWriter::new(Vec::new()).unwrap();
    /// assert!(!w.finish().unwrap().is_empty());
    /// ```
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    /// Flushes the output, to keep writing after.
    ///
    /// # Errors
    ///
    /// When flushing fails.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut w = decaying_pool::trace::TraceWriter::new(Vec::new()).unwrap();
    /// w.flush().unwrap();
    /// ```
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Formats a byte count for people: `512 B`, `1.5 KiB`, `64.0 MiB`, `8.00 GiB`.
pub(crate) fn human_bytes(b: f64) -> String {
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

/// Escapes a string for JSON and XML-free contexts (quotes, backslashes,
/// control characters).
pub(crate) fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}
