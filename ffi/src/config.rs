//! The configuration string of `dp_configure` and `$DECAYING_POOL`:
//! `key=value` pairs separated by commas.

use core::time::Duration;
use std::path::PathBuf;

use dp::policy::AnyPolicy;
use dp::trace::cli::{parse_millis, parse_size};
use dp::{Exponential, FixedCapacity, FixedTime, Packing};

/// The keys `dp_configure` knows, for the message on an unknown one.
const KEYS: &str = "backend, policy, packing, packing.KEY, limit, reaper, gc_threshold, record";

/// The alignment of every pointer the library hands out, in bytes:
/// `cudaMalloc` guarantees 256, and RMM's resources require it. Exact
/// blocks come from the backend at 256 bytes or more (`cuMemAlloc`; 512 on
/// the host backend), and packed blocks sit at multiples of the packing
/// granularity inside them, so a granularity below this is refused.
pub(crate) const MIN_ALIGN: usize = 256;

/// The packing keys whose values are sizes (and so take a unit), as the
/// command-line tool's `--packing` reads them.
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

/// Where the memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BackendKind {
    /// CUDA device memory (`cuMemAlloc` on the device's primary context).
    Cuda,
    /// System memory (the global allocator, 512-byte aligned).
    Host,
}

impl BackendKind {
    /// The name in the configuration and the statistics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Host => "host",
        }
    }
}

/// An eviction policy, as the command-line tool and the replay name them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum PolicySpec {
    /// `ttl:TIME` / `fixed-time:TIME`.
    FixedTime(Duration),
    /// `half-life:TIME` / `exponential:TIME`.
    Exponential(Duration),
    /// `slots:N` / `fixed-capacity:N`.
    FixedCapacity(usize),
    /// `keep-all`: never evicts.
    KeepAll,
    /// `no-pool`: caches nothing.
    NoPool,
}

impl PolicySpec {
    /// A fresh policy of this kind for one pool.
    pub(crate) fn build(self) -> AnyPolicy {
        match self {
            PolicySpec::FixedTime(ttl) => AnyPolicy::timed(FixedTime::new(ttl)),
            PolicySpec::Exponential(h) => AnyPolicy::timed(Exponential::new(h)),
            PolicySpec::FixedCapacity(n) => AnyPolicy::from(FixedCapacity::new(n)),
            PolicySpec::KeepAll => AnyPolicy::timed(FixedTime::new(Duration::MAX)),
            PolicySpec::NoPool => AnyPolicy::from(FixedCapacity::new(0)),
        }
    }

    /// The replay's label of the policy (`fixed-time 1s`, ...).
    pub(crate) fn label(self) -> String {
        match self {
            PolicySpec::FixedTime(d) => format!("fixed-time {d:?}"),
            PolicySpec::Exponential(d) => format!("exponential {d:?}"),
            PolicySpec::FixedCapacity(n) => format!("fixed-capacity {n}"),
            PolicySpec::KeepAll => "keep-all".into(),
            PolicySpec::NoPool => "no-pool".into(),
        }
    }
}

/// A parsed configuration.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// `backend=`.
    pub(crate) backend: BackendKind,
    /// `policy=`.
    pub(crate) policy: PolicySpec,
    /// `packing=`: `None` when off (plain pools).
    pub(crate) packing: Option<Packing>,
    /// `limit=`: bytes per device.
    pub(crate) limit: Option<usize>,
    /// `reaper=`: the period of each pool's reaper thread.
    pub(crate) reaper: Option<Duration>,
    /// `gc_threshold=`: a fraction in (0, 1].
    pub(crate) gc_threshold: Option<f64>,
    /// `record=`: a native trace of the callers' requests.
    pub(crate) record: Option<PathBuf>,
}

/// The reaper period of the default configuration.
pub(crate) const DEFAULT_REAPER: Duration = Duration::from_millis(100);

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Cuda,
            policy: PolicySpec::FixedTime(Duration::from_secs(1)),
            packing: Some(Packing::default()),
            limit: None,
            reaper: Some(DEFAULT_REAPER),
            gc_threshold: None,
            record: None,
        }
    }
}

impl Config {
    /// Parses `key=value,...` over the defaults.
    ///
    /// # Errors
    ///
    /// A message naming the key, for an unknown key or a bad value.
    pub(crate) fn parse(text: &str) -> Result<Config, String> {
        let mut c = Config::default();
        // The `packing=` value (on, off, or pairs) and the `packing.KEY`
        // pairs, combined at the end.
        let mut packing_off = false;
        let mut packing_pairs: Vec<(String, String)> = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                return Err(format!("`{part}`: expected key=value (keys: {KEYS})"));
            };
            let (key, value) = (key.trim(), value.trim());
            // A key given twice is refused, not settled by its last value
            // (`backend=host,backend=cuda` would otherwise ask for the
            // device silently).
            if !key.starts_with("packing.") {
                if seen.contains(&key) {
                    return Err(format!("{key}: given twice"));
                }
                seen.push(key);
            }
            match key {
                "backend" => {
                    c.backend = match value {
                        "cuda" => BackendKind::Cuda,
                        "host" => BackendKind::Host,
                        _ => return Err(format!("backend: `{value}` is not cuda or host")),
                    }
                }
                "policy" => c.policy = parse_policy(value)?,
                "packing" => match value {
                    "off" | "none" => packing_off = true,
                    "on" | "default" => packing_off = false,
                    pairs => {
                        packing_off = false;
                        for pair in pairs.split(';').map(str::trim).filter(|p| !p.is_empty()) {
                            let Some((k, v)) = pair.split_once([':', '=']) else {
                                return Err(format!(
                                    "packing: `{pair}` is not KEY:VALUE (pairs separated by `;`, \
                                     or on, off)"
                                ));
                            };
                            packing_pairs.push((k.trim().to_owned(), v.trim().to_owned()));
                        }
                    }
                },
                "limit" => {
                    c.limit = match value {
                        "none" | "off" => None,
                        v => Some(parse_size("limit", v).map_err(|e| e.to_string())?),
                    }
                }
                "reaper" => {
                    c.reaper = match value {
                        "off" | "none" => None,
                        v => {
                            let d = parse_duration("reaper", v)?;
                            if d.is_zero() { None } else { Some(d) }
                        }
                    }
                }
                "gc_threshold" => {
                    c.gc_threshold = match value {
                        "none" | "off" => None,
                        v => Some(parse_fraction("gc_threshold", v)?),
                    }
                }
                "record" => {
                    if value.is_empty() {
                        return Err("record: expected a file path".into());
                    }
                    c.record = Some(PathBuf::from(value));
                }
                k => match k.strip_prefix("packing.") {
                    Some(sub) if !sub.is_empty() => {
                        packing_pairs.push((sub.to_owned(), value.to_owned()));
                    }
                    _ => return Err(format!("unknown key `{k}` (keys: {KEYS})")),
                },
            }
        }
        for (i, (k, _)) in packing_pairs.iter().enumerate() {
            if packing_pairs[..i].iter().any(|(earlier, _)| earlier == k) {
                return Err(format!("packing.{k}: given twice"));
            }
        }
        c.packing = if packing_off {
            if let Some((k, _)) = packing_pairs.first() {
                return Err(format!("packing.{k}: packing is off"));
            }
            None
        } else {
            let packing = parse_packing(&packing_pairs)?;
            if packing.granularity < MIN_ALIGN {
                return Err(format!(
                    "packing.granularity: {} bytes is below {MIN_ALIGN} (every pointer the \
                     library hands out is aligned to {MIN_ALIGN} bytes, as cudaMalloc's are)",
                    packing.granularity
                ));
            }
            Some(packing)
        };
        Ok(c)
    }
}

/// The packing pairs over [`Packing::default`], sizes with units.
fn parse_packing(pairs: &[(String, String)]) -> Result<Packing, String> {
    let mut parts = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        if PACKING_SIZE_KEYS.contains(&k.as_str()) {
            let bytes = parse_size(&format!("packing.{k}"), v).map_err(|e| e.to_string())?;
            parts.push(format!("{k}={bytes}B"));
        } else {
            parts.push(format!("{k}={v}"));
        }
    }
    parts
        .join(",")
        .parse::<Packing>()
        .map_err(|e| format!("packing: {e}"))
}

/// `ttl:1s`, `fixed-time:1s`, `half-life:50ms`, `exponential:50ms`,
/// `slots:256`, `fixed-capacity:256`, `keep-all`, `no-pool`.
fn parse_policy(value: &str) -> Result<PolicySpec, String> {
    match value {
        "keep-all" => return Ok(PolicySpec::KeepAll),
        "no-pool" => return Ok(PolicySpec::NoPool),
        _ => {}
    }
    let Some((kind, arg)) = value.split_once([':', ' ']) else {
        return Err(format!(
            "policy: `{value}` is not ttl:TIME, half-life:TIME, slots:N, keep-all or no-pool"
        ));
    };
    let arg = arg.trim();
    match kind.trim() {
        "ttl" | "fixed-time" => Ok(PolicySpec::FixedTime(parse_duration("policy", arg)?)),
        "half-life" | "exponential" => {
            let h = parse_duration("policy", arg)?;
            if h.is_zero() {
                return Err("policy: a half-life must be above zero".into());
            }
            Ok(PolicySpec::Exponential(h))
        }
        "slots" | "fixed-capacity" => arg
            .parse::<usize>()
            .map(PolicySpec::FixedCapacity)
            .map_err(|_| format!("policy: `{arg}` is not a number of slots")),
        other => Err(format!(
            "policy: unknown policy `{other}` (ttl, half-life, slots, keep-all, no-pool)"
        )),
    }
}

/// A time: a number and a unit (ns, us, ms, s, m), or a bare number of
/// milliseconds, as the command-line tool reads `--reaper` and `--ttl`.
pub(crate) fn parse_duration(key: &str, s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let mut split = t.trim_end_matches(char::is_alphabetic).len();
    if t[..split].trim().is_empty() {
        // `NaN`, `inf`: a number (refused below), not a unit.
        split = t.len();
    }
    let (num, unit) = t.split_at(split);
    if unit.is_empty() {
        return parse_millis(key, s).map_err(|e| e.to_string());
    }
    let bad = || format!("{key}: `{s}` is not a time such as 100ms or 1s");
    let x: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(x.is_finite() && x >= 0.0) {
        return Err(bad());
    }
    let secs = match unit {
        "ns" => x / 1e9,
        "us" | "µs" => x / 1e6,
        "ms" => x / 1e3,
        "s" => x,
        "m" | "min" => x * 60.0,
        other => {
            return Err(format!(
                "{key}: unknown time unit `{other}` (ns, us, ms, s, m)"
            ));
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// A fraction in (0, 1].
pub(crate) fn parse_fraction(key: &str, s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("{key}: `{s}` is not a fraction in (0, 1]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_keys() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.backend, BackendKind::Cuda);
        assert_eq!(c.packing, Some(Packing::default()));
        assert_eq!(c.reaper, Some(DEFAULT_REAPER));
        let c = Config::parse(
            "backend=host, policy=half-life:50ms, packing=medium:128MiB;small=2MiB, \
             packing.granularity=1KiB, limit=1GiB, reaper=off, gc_threshold=0.8, record=/tmp/x",
        )
        .unwrap();
        assert_eq!(c.backend, BackendKind::Host);
        assert_eq!(c.policy, PolicySpec::Exponential(Duration::from_millis(50)));
        let p = c.packing.unwrap();
        assert_eq!(p.medium_threshold, 128 << 20);
        assert_eq!(p.small_threshold, 2 << 20);
        assert_eq!(p.granularity, 1024);
        assert_eq!(c.limit, Some(1 << 30));
        assert_eq!(c.reaper, None);
        assert_eq!(c.gc_threshold, Some(0.8));
        assert_eq!(c.record, Some(PathBuf::from("/tmp/x")));
        assert_eq!(Config::parse("packing=off").unwrap().packing, None);
        assert_eq!(
            Config::parse("policy=slots:64").unwrap().policy,
            PolicySpec::FixedCapacity(64)
        );
        assert_eq!(
            Config::parse("policy=ttl:2s,reaper=250").unwrap().reaper,
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            ("colour=blue", "colour"),
            ("backend=tpu", "backend"),
            ("policy=lru", "policy"),
            ("policy=ttl:soon", "policy"),
            ("packing=medium:3", "packing.medium"),
            ("packing=wobble:1", "packing"),
            ("packing=off,packing.medium=1MiB", "packing.medium"),
            ("limit=3", "limit"),
            ("reaper=fast", "reaper"),
            ("gc_threshold=1.5", "gc_threshold"),
            ("gc_threshold=0", "gc_threshold"),
            ("record=", "record"),
            ("backend", "backend"),
            ("backend=host,backend=cuda", "backend: given twice"),
            (
                "limit=1GiB, policy=keep-all, limit=2GiB",
                "limit: given twice",
            ),
            ("packing=on,packing=off", "packing: given twice"),
            (
                "packing=medium:1MiB,packing.medium=2MiB",
                "packing.medium: given twice",
            ),
            ("packing.granularity=64B", "packing.granularity"),
            ("packing.granularity=1B", "below 256"),
        ] {
            let e = Config::parse(text).unwrap_err();
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}
