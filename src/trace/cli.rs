//! Parsing of the bare numbers the `decaying-pool` command line takes
//! (`--gap`, `--reaper`, `--capacity`, `--repeat`), so that every bad
//! value is refused with a message naming the option and the value, never
//! a panic or a silent zero.
//!
//! # Examples
//!
//! ```
//! use core::time::Duration;
//! use decaying_pool::trace::cli::{parse_capacity_gib, parse_millis};
//! assert_eq!(parse_millis("--gap", "1.5").unwrap(), Duration::from_micros(1500));
//! assert_eq!(parse_capacity_gib("--capacity", "0.5").unwrap(), 1 << 29);
//! let err = parse_capacity_gib("--capacity", "-1").unwrap_err();
//! assert_eq!(err.to_string(), "--capacity: \"-1\" is not a positive number of GiB");
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

/// Parses a positive, finite number of GiB (`--capacity`) into bytes.
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
