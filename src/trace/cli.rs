//! Parsing of the numbers the `decaying-pool` command line takes (`--gap`,
//! `--reaper`, `--repeat`, and the sizes of `--capacity`, `--limit`,
//! `--budget`, `--size-class xN` and `--packing`), so that every bad value
//! is refused with a message naming the option and the value, never a
//! panic or a silent zero.
//!
//! Every size on the command line takes a unit ([`parse_size`]): `3GiB`,
//! `512MiB`, `4k`, `100B`. A bare number is refused, so that no option
//! reads `3` as 3 bytes while another reads it as 3 GiB.
//!
//! # Examples
//!
//! ```
//! use core::time::Duration;
//! use decaying_pool::trace::cli::{parse_millis, parse_size};
//! assert_eq!(parse_millis("--gap", "1.5").unwrap(), Duration::from_micros(1500));
//! assert_eq!(parse_size("--capacity", "0.5GiB").unwrap(), 1 << 29);
//! let err = parse_size("--capacity", "3").unwrap_err();
//! assert!(err.to_string().starts_with("--capacity: \"3\" is not a size with a unit"));
//! ```

use core::fmt;
use core::time::Duration;

/// A command-line value that was refused: the option, the value given and
/// what the option expects.
///
/// # Examples
///
/// ```
/// let err = decaying_pool::trace::cli::parse_millis("--gap", "nan").unwrap_err();
/// assert_eq!(err.option, "--gap");
/// assert_eq!(err.value, "nan");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgError {
    /// The option, e.g. `--gap`.
    pub option: String,
    /// The value given.
    pub value: String,
    /// What the option expects, e.g. `a positive number of GiB`.
    pub expected: &'static str,
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {:?} is not {}",
            self.option, self.value, self.expected
        )
    }
}

impl std::error::Error for ArgError {}

fn refuse(option: &str, text: &str, expected: &'static str) -> ArgError {
    ArgError {
        option: option.to_owned(),
        value: text.to_owned(),
        expected,
    }
}

/// Parses a non-negative, finite number of milliseconds (`--gap`,
/// `--reaper`) into a [`Duration`].
///
/// # Errors
///
/// When `text` is not a number, or is negative, NaN, infinite or too large
/// for a [`Duration`].
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::cli::parse_millis;
/// assert_eq!(parse_millis("--reaper", "0").unwrap(), Duration::ZERO);
/// assert!(parse_millis("--gap", "1e30").is_err());
/// assert!(parse_millis("--gap", "-1").is_err());
/// ```
pub fn parse_millis(option: &str, text: &str) -> Result<Duration, ArgError> {
    const EXPECTED: &str = "a non-negative number of milliseconds (at most about 1.8e19 s)";
    let ms: f64 = text
        .trim()
        .parse()
        .map_err(|_| refuse(option, text, EXPECTED))?;
    if !(ms.is_finite() && ms >= 0.0) {
        return Err(refuse(option, text, EXPECTED));
    }
    Duration::try_from_secs_f64(ms / 1e3).map_err(|_| refuse(option, text, EXPECTED))
}

/// Parses a positive, finite number of GiB into bytes. (`--capacity` read
/// a bare number so until every size option took [`parse_size`]'s units;
/// the command line no longer takes bare sizes.)
///
/// # Errors
///
/// When `text` is not a number, or is zero, negative, NaN, infinite, less
/// than a byte or more bytes than a `usize` holds.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::cli::parse_capacity_gib;
/// assert_eq!(parse_capacity_gib("--capacity", "8").unwrap(), 8 << 30);
/// assert!(parse_capacity_gib("--capacity", "nan").is_err());
/// assert!(parse_capacity_gib("--capacity", "0").is_err());
/// ```
pub fn parse_capacity_gib(option: &str, text: &str) -> Result<usize, ArgError> {
    const EXPECTED: &str = "a positive number of GiB";
    let gib: f64 = text
        .trim()
        .parse()
        .map_err(|_| refuse(option, text, EXPECTED))?;
    let bytes = gib * (1u64 << 30) as f64;
    // `usize::MAX as f64` rounds up to 2^64 (or 2^32): strictly below it fits.
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < usize::MAX as f64) {
        return Err(refuse(option, text, EXPECTED));
    }
    Ok(bytes as usize)
}

/// What [`parse_size`] expects, as its errors say.
pub const SIZE_EXPECTED: &str = "a size with a unit: B, KiB, MiB, GiB or TiB \
     (K, M, G, T and KB, MB, GB, TB are the same binary units), e.g. 3GiB, 512MiB, 4k; \
     a bare number is refused";

/// Parses a size with a unit into bytes: a non-negative number (a
/// fraction is allowed: `5.3493GiB`), then `B`, or `K`, `M`, `G`, `T`
/// (binary, 1024-based), each optionally followed by `iB` or `B`, in any
/// case (`4k`, `512MiB`, `3GB`, `1.5t`). Fractions of a byte are dropped.
/// This is how every size option of the command line reads its value.
///
/// # Errors
///
/// When `text` has no unit (a bare number is refused, whatever it is), an
/// unknown unit, a number that is not finite or is negative, or more
/// bytes than a `usize` holds.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::cli::parse_size;
/// assert_eq!(parse_size("--limit", "512MiB").unwrap(), 512 << 20);
/// assert_eq!(parse_size("--limit", "4k").unwrap(), 4096);
/// assert_eq!(parse_size("--limit", "3GB").unwrap(), 3 << 30);
/// assert_eq!(parse_size("--limit", "100B").unwrap(), 100);
/// let err = parse_size("--budget", "3").unwrap_err();
/// assert_eq!(err.option, "--budget");
/// assert!(err.to_string().contains("a bare number is refused"));
/// assert!(parse_size("--limit", "-1G").is_err());
/// assert!(parse_size("--limit", "3 parsecs").is_err());
/// ```
pub fn parse_size(option: &str, text: &str) -> Result<usize, ArgError> {
    let bad = || refuse(option, text, SIZE_EXPECTED);
    let t = text.trim();
    let split = t
        .find(|c: char| c.is_ascii_alphabetic() && !matches!(c, 'e' | 'E'))
        .or_else(|| {
            // `inf`, `NaN`: no unit (and no number either).
            t.find(|c: char| c.is_ascii_alphabetic())
        })
        .ok_or_else(bad)?;
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024f64.powi(2),
        "g" | "gb" | "gib" => 1024f64.powi(3),
        "t" | "tb" | "tib" => 1024f64.powi(4),
        _ => return Err(bad()),
    };
    let x: f64 = num.trim().parse().map_err(|_| bad())?;
    let bytes = x * scale;
    // `usize::MAX as f64` rounds up to 2^64 (or 2^32): strictly below it fits.
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < usize::MAX as f64) {
        return Err(bad());
    }
    Ok(bytes as usize)
}

/// Parses a pass count (`--repeat`): an integer of at least 1.
///
/// # Errors
///
/// When `text` is not an integer from 1 to `u32::MAX`.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::cli::parse_repeat;
/// assert_eq!(parse_repeat("--repeat", "3").unwrap(), 3);
/// assert!(parse_repeat("--repeat", "0").is_err());
/// ```
pub fn parse_repeat(option: &str, text: &str) -> Result<u32, ArgError> {
    const EXPECTED: &str = "a whole number of passes from 1 to 4294967295";
    match text.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(refuse(option, text, EXPECTED)),
    }
}
