//! The packing layer's settings.

use core::fmt;
use core::str::FromStr;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// How a [`PackedPool`](crate::PackedPool) packs: thresholds, segment
/// sizes, and the cap on a segment as a fraction of the device or limit.
///
/// - a request of at most `small_threshold` bytes is carved from a *small*
///   segment, one of at most `medium_threshold` bytes from a *medium*
///   segment; larger requests are blocks of their own in the pool
///   underneath (rounded up to `large_rounding`), never split;
/// - carved blocks are rounded up to `granularity` bytes (which is also
///   their alignment within the segment);
/// - a new segment is sized by the footprint it joins: at least
///   `1 / growth` of the bytes already in segments of its kind, at least
///   `segment_multiple` times the request (as far as those bytes justify),
///   no smaller than `small_segment` (small) or `medium_segment` (medium),
///   rounded up to one of four sizes per power of two, no larger than
///   `max_segment`; the size of a segment emptied lately (likely still
///   cached in the pool) is taken instead when one fits;
/// - and never larger than `1 / cap_fraction` of the device `capacity`
///   (or of the pool's limit when no capacity is set), see
///   [`segment_cap`](Self::segment_cap); near a known capacity, no larger
///   than half the room left, and leaving free inside segments no more than
///   `1 / slack_fraction` of the device. A request that no allowed segment
///   can hold is an exact block, and so is one whose segment the pool
///   cannot supply.
///
/// The defaults were chosen on real training and inference traces (see
/// `docs/packing.md` for the figures and the grid tried).
///
/// # Examples
///
/// ```
/// use decaying_pool::Packing;
/// let p = Packing::default().medium_threshold(32 << 20).capacity(8 << 30);
/// assert_eq!(p.medium_threshold, 32 << 20);
/// assert_eq!(p.segment_cap(None), 256 << 20); // 8 GiB / 32
/// let q: Packing = "medium_threshold=32M,capacity=8G".parse().unwrap();
/// assert_eq!(p, q);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Packing {
    /// Requests up to this many bytes are carved from small segments
    /// (default 1 MiB, PyTorch's small-block threshold).
    pub small_threshold: usize,
    /// Requests up to this many bytes (and above `small_threshold`) are
    /// carved from medium segments; larger ones are exact blocks
    /// (default 128 MiB).
    pub medium_threshold: usize,
    /// The smallest small segment (default 2 MiB, PyTorch's small segment).
    pub small_segment: usize,
    /// The smallest medium segment (default 32 MiB; PyTorch's is 20 MiB).
    pub medium_segment: usize,
    /// The largest segment (default 256 MiB).
    pub max_segment: usize,
    /// A new segment is at least the bytes already in segments of its kind
    /// divided by this (default 8; at least 1).
    pub growth: usize,
    /// A new segment holds at least this many requests of the size that
    /// asks for it (default 4; at least 1).
    pub segment_multiple: usize,
    /// No segment is larger than the capacity (or limit) divided by this
    /// (default 32; at least 1).
    pub cap_fraction: usize,
    /// On a known capacity (or limit), a new segment leaves at most this
    /// fraction of it free inside segments, all segments together: it
    /// shrinks towards the size of the request that asks for it as free
    /// space accumulates, since free space that live blocks pin is what can
    /// make a request fail on a full device (default 64: 1.6%; at least 1).
    pub slack_fraction: usize,
    /// The device's size in bytes, if known (default: none; the pool's
    /// limit is used instead, if any).
    pub capacity: Option<usize>,
    /// Carved blocks are rounded up to, and aligned to, this many bytes
    /// within their segment (default 512; a power of two).
    pub granularity: usize,
    /// Requests above the medium threshold are exact blocks of this
    /// multiple (default 2 MiB, as PyTorch rounds large blocks, and the page
    /// size CUDA maps large allocations with), so sizes a few bytes apart
    /// share cached blocks; 1 keeps them exact to the byte.
    pub large_rounding: usize,
    /// A request above the medium threshold whose class has no cached
    /// block takes the smallest cached large block up to `1 / large_fit`
    /// larger than its class, whole, rather than miss: requests whose sizes
    /// vary (a batch or sequence length that changes from call to call)
    /// reuse each other's blocks. The block is not split: it goes back to
    /// the pool whole when released, as the class it is. On a known
    /// capacity (or limit), the bytes such blocks hold beyond their
    /// requests' classes stay, with the free space inside segments, within
    /// `1 / slack_fraction` of it: live blocks pin that excess, and on a
    /// device the requests nearly fill it would fail requests an exact
    /// block would serve. On a device more than twice the peak of the bytes
    /// requested so far (`p`), they may pin up to `(capacity - 2p) / 2`
    /// instead, when that is more: a bet that the live bytes will not
    /// double, since a request fails for that excess only once they pass
    /// `capacity / 2 + p`. Default 2: up to half again; 0 reuses exact
    /// classes only.
    pub large_fit: usize,
}

impl Default for Packing {
    fn default() -> Self {
        Packing {
            small_threshold: MIB,
            medium_threshold: 128 * MIB,
            small_segment: 2 * MIB,
            medium_segment: 32 * MIB,
            max_segment: 256 * MIB,
            growth: 8,
            segment_multiple: 4,
            cap_fraction: 32,
            slack_fraction: 64,
            capacity: None,
            granularity: 512,
            large_rounding: 2 * MIB,
            large_fit: 2,
        }
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $t:ty) => {
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $t) -> Self {
            self.$name = value;
            self
        }
    };
}

impl Packing {
    setter!(
        /// Sets [`small_threshold`](Self::small_threshold).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().small_threshold(4096).small_threshold, 4096);
        /// ```
        small_threshold: usize
    );
    setter!(
        /// Sets [`medium_threshold`](Self::medium_threshold).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().medium_threshold(1 << 20).medium_threshold, 1 << 20);
        /// ```
        medium_threshold: usize
    );
    setter!(
        /// Sets [`small_segment`](Self::small_segment).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().small_segment(1 << 20).small_segment, 1 << 20);
        /// ```
        small_segment: usize
    );
    setter!(
        /// Sets [`medium_segment`](Self::medium_segment).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().medium_segment(1 << 25).medium_segment, 1 << 25);
        /// ```
        medium_segment: usize
    );
    setter!(
        /// Sets [`max_segment`](Self::max_segment).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().max_segment(1 << 28).max_segment, 1 << 28);
        /// ```
        max_segment: usize
    );
    setter!(
        /// Sets [`growth`](Self::growth).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().growth(8).growth, 8);
        /// ```
        growth: usize
    );
    setter!(
        /// Sets [`segment_multiple`](Self::segment_multiple).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().segment_multiple(2).segment_multiple, 2);
        /// ```
        segment_multiple: usize
    );
    setter!(
        /// Sets [`slack_fraction`](Self::slack_fraction).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().slack_fraction(32).slack_fraction, 32);
        /// ```
        slack_fraction: usize
    );
    setter!(
        /// Sets [`large_rounding`](Self::large_rounding).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().large_rounding(1).large_rounding, 1);
        /// ```
        large_rounding: usize
    );
    setter!(
        /// Sets [`large_fit`](Self::large_fit).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().large_fit(0).large_fit, 0);
        /// ```
        large_fit: usize
    );
    setter!(
        /// Sets [`cap_fraction`](Self::cap_fraction).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().cap_fraction(16).cap_fraction, 16);
        /// ```
        cap_fraction: usize
    );
    setter!(
        /// Sets [`granularity`](Self::granularity) (rounded up to a power
        /// of two when the pool is built).
        ///
        /// ```
        /// assert_eq!(decaying_pool::Packing::default().granularity(256).granularity, 256);
        /// ```
        granularity: usize
    );

    /// Sets [`capacity`](Self::capacity): the device's size in bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::Packing::default().capacity(8 << 30).capacity, Some(8 << 30));
    /// ```
    #[must_use]
    pub fn capacity(mut self, bytes: usize) -> Self {
        self.capacity = Some(bytes);
        self
    }

    /// No packing at all: every request is an exact block of its own size
    /// (thresholds 0, no large rounding, no larger block reused), as from
    /// the pool alone.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::Packing::off().medium_threshold, 0);
    /// ```
    pub fn off() -> Self {
        Packing::default()
            .small_threshold(0)
            .medium_threshold(0)
            .large_rounding(1)
            .large_fit(0)
    }

    /// The packing for blocks on mapped pages ([`pages::Mapped`](crate::pages::Mapped),
    /// the replay's `mapped` row): small requests packed into small
    /// segments as by default, every larger request a block of its own
    /// (medium threshold at the small one, sizes rounded to 512 bytes, no
    /// larger block reused), since the mapped allocator carves its blocks
    /// from address space with pages under them and strands no memory.
    ///
    /// # Examples
    ///
    /// ```
    /// let p = decaying_pool::Packing::mapped();
    /// assert_eq!((p.medium_threshold, p.large_rounding, p.large_fit), (1 << 20, 512, 0));
    /// ```
    pub fn mapped() -> Self {
        let d = Packing::default();
        d.medium_threshold(d.small_threshold)
            .large_rounding(512)
            .large_fit(0)
    }

    /// The largest segment allowed with this setting over a pool whose
    /// limit is `limit`: `max_segment`, capped at `capacity / cap_fraction`
    /// (or `limit / cap_fraction` without a capacity) rounded down to a
    /// power of two (so that segments hold whole numbers of the
    /// power-of-two sizes tensors come in, rather than strand a tail each),
    /// and never below `small_segment` (on a device so small that 1/32 of
    /// it is less, small segments keep their size).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::Packing;
    /// assert_eq!(Packing::default().segment_cap(None), 256 << 20);
    /// assert_eq!(Packing::default().segment_cap(Some(1 << 30)), 32 << 20);
    /// assert_eq!(Packing::default().segment_cap(Some(5 << 30)), 128 << 20); // 160 MiB, rounded down
    /// assert_eq!(Packing::default().capacity(2 << 30).segment_cap(Some(1 << 30)), 64 << 20);
    /// assert_eq!(Packing::default().segment_cap(Some(32 << 20)), 2 << 20);
    /// ```
    pub fn segment_cap(&self, limit: Option<usize>) -> usize {
        let bound = self
            .capacity
            .or(limit)
            .map_or(usize::MAX, |c| floor_pow2(c / self.cap_fraction.max(1)));
        self.max_segment.min(bound.max(self.small_segment))
    }

    /// The setting made usable: a power-of-two granularity, divisors of at
    /// least 1, the small threshold at most the medium one.
    pub(crate) fn normalised(mut self) -> Self {
        self.granularity = self
            .granularity
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1));
        self.growth = self.growth.max(1);
        self.segment_multiple = self.segment_multiple.max(1);
        self.cap_fraction = self.cap_fraction.max(1);
        self.slack_fraction = self.slack_fraction.max(1);
        self.large_rounding = self.large_rounding.max(1);
        self.small_threshold = self.small_threshold.min(self.medium_threshold);
        self
    }
}

/// Why a [`Packing`] could not be parsed from `key=value,...`.
///
/// # Examples
///
/// ```
/// let e = "nope=1".parse::<decaying_pool::Packing>().unwrap_err();
/// assert!(e.to_string().contains("nope"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsePackingError(String);

impl fmt::Display for ParsePackingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParsePackingError {}

/// A size: a number with an optional `K`, `M`, `G` suffix (binary units,
/// optionally followed by `iB` or `B`).
fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim();
    let lower = v.to_ascii_lowercase();
    let digits = lower.trim_end_matches("ib").trim_end_matches('b');
    let (num, unit) = match digits.chars().last()? {
        'k' => (&digits[..digits.len() - 1], KIB),
        'm' => (&digits[..digits.len() - 1], MIB),
        'g' => (&digits[..digits.len() - 1], 1 << 30),
        // A bare number: no unit, refused (is `4096` bytes or KiB?).
        _ if digits.len() == lower.len() => return None,
        _ => (digits, 1),
    };
    let x: f64 = num.trim().parse().ok()?;
    if !(x.is_finite() && x >= 0.0) {
        return None;
    }
    let bytes = x * unit as f64;
    (bytes < usize::MAX as f64).then_some(bytes as usize)
}

/// A count (`growth`, `segment_multiple`, ...): a whole number, without a
/// unit, at least `min`.
fn parse_count(v: &str, min: usize) -> Option<usize> {
    v.trim().parse::<usize>().ok().filter(|&n| n >= min)
}

impl FromStr for Packing {
    type Err = ParsePackingError;

    /// `key=value` pairs separated by commas, over the defaults. Keys:
    /// `small_threshold` (`small`), `medium_threshold` (`medium`),
    /// `small_segment`, `medium_segment`, `max_segment`, `growth`,
    /// `segment_multiple`
    /// (`multiple`), `cap_fraction` (`cap`), `slack_fraction` (`slack`),
    /// `large_rounding`, `large_fit`,
    /// `capacity`, `granularity`. Sizes need a unit (`B`, `K`/`KiB`,
    /// `M`/`MiB`, `G`/`GiB`: a bare number is refused); the counts
    /// (`growth`, `segment_multiple`, `cap_fraction`, `slack_fraction`,
    /// `large_fit`) are whole numbers, at least 1 (`large_fit` at least 0).
    /// The granularity is a power of two, and the small threshold at most
    /// the medium one. `off` alone turns packing off.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::Packing;
    /// let p: Packing = "small=512KiB,growth=4,granularity=1K".parse().unwrap();
    /// assert_eq!((p.small_threshold, p.growth, p.granularity), (512 << 10, 4, 1024));
    /// for bad in ["small=4096", "growth=0", "granularity=768B", "small=2M,medium=1M"] {
    ///     assert!(bad.parse::<Packing>().is_err(), "{bad}");
    /// }
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut p = Packing::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "off" {
                p = Packing::off();
                continue;
            }
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| ParsePackingError(format!("`{part}`: expected key=value")))?;
            let size = || {
                parse_size(v).ok_or_else(|| {
                    ParsePackingError(format!(
                        "`{part}`: not a size (a number and a unit: B, KiB, MiB or GiB)"
                    ))
                })
            };
            let count = |min: usize| {
                parse_count(v, min).ok_or_else(|| {
                    ParsePackingError(format!("`{part}`: not a whole number of at least {min}"))
                })
            };
            match k.trim() {
                "small_threshold" | "small" => p.small_threshold = size()?,
                "medium_threshold" | "medium" => p.medium_threshold = size()?,
                "small_segment" => p.small_segment = size()?,
                "medium_segment" => p.medium_segment = size()?,
                "max_segment" => p.max_segment = size()?,
                "growth" => p.growth = count(1)?,
                "segment_multiple" | "multiple" => p.segment_multiple = count(1)?,
                "cap_fraction" | "cap" => p.cap_fraction = count(1)?,
                "capacity" => p.capacity = Some(size()?),
                "granularity" => {
                    p.granularity = size()?;
                    if !p.granularity.is_power_of_two() {
                        return Err(ParsePackingError(format!(
                            "`{part}`: the granularity is a power of two"
                        )));
                    }
                }
                "large_rounding" => p.large_rounding = size()?,
                "large_fit" => p.large_fit = count(0)?,
                "slack_fraction" | "slack" => p.slack_fraction = count(1)?,
                other => return Err(ParsePackingError(format!("unknown packing key `{other}`"))),
            }
        }
        if p.small_threshold > p.medium_threshold {
            return Err(ParsePackingError(format!(
                "the small threshold ({} bytes) is above the medium one ({} bytes)",
                p.small_threshold, p.medium_threshold
            )));
        }
        Ok(p)
    }
}

/// The largest power of two at most `x` (0 for 0).
pub(crate) fn floor_pow2(x: usize) -> usize {
    match x {
        0 => 0,
        _ => 1 << (usize::BITS - 1 - x.leading_zeros()),
    }
}
