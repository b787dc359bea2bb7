//! Why an `allocate` failed.

use core::fmt;

/// Why [`DecayingPool::allocate`](crate::DecayingPool::allocate) failed.
///
/// A failed `allocate` hands out nothing and loses nothing: every block the
/// pool freed on the way went back through the backing allocator and is
/// counted in [`Stats`](crate::Stats).
///
/// `#[non_exhaustive]`: a later version may add a reason, so a `match`
/// outside the crate ends with a wildcard arm.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedTime, PoolError};
/// use core::time::Duration;
///
/// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedTime::new(Duration::from_secs(1)));
/// assert!(matches!(pool.allocate(0), Err(PoolError::ZeroSize)));
/// assert_eq!(pool.allocate(0).unwrap_err().to_string(), "cannot allocate zero bytes");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError<E> {
    /// A request for zero bytes.
    ZeroSize,
    /// No backing call can ever serve the request: rounding `requested` up
    /// to its size class (or counting it in the bytes reserved) would
    /// overflow `usize`, or its class is above the backing allocator's
    /// [`capacity`](crate::RawAllocator::capacity) (a device's total
    /// memory, the machine's memory for the host allocators, which never
    /// exceeds `isize::MAX`; a stacked pool's limit). Refused before
    /// anything is freed or a backing call made: the cache is kept, and
    /// nothing is counted (not even a `backing_failures`).
    TooLarge {
        /// The size the caller asked for.
        requested: usize,
    },
    /// Serving the request would take the pool's reserved bytes over its limit
    /// even with an empty cache.
    LimitExceeded {
        /// The size the caller asked for.
        requested: usize,
        /// The pool's byte limit.
        limit: usize,
        /// Bytes reserved (in use + cached) when the request was refused.
        reserved: usize,
    },
    /// The backing allocator failed, even after the pool freed its cache and
    /// retried; or at once, the cache kept, when it reported too little
    /// free ([`available`](crate::RawAllocator::available)) for freeing the
    /// cache to help.
    Backing(E),
}

impl<E: fmt::Display> fmt::Display for PoolError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::ZeroSize => f.write_str("cannot allocate zero bytes"),
            PoolError::TooLarge { requested } => write!(
                f,
                "a request of {requested} bytes is too large: its size class overflows \
                 or exceeds what the backing allocator can ever serve"
            ),
            PoolError::LimitExceeded {
                requested,
                limit,
                reserved,
            } => write!(
                f,
                "a request of {requested} bytes exceeds the pool limit of {limit} bytes \
                 ({reserved} bytes reserved)"
            ),
            PoolError::Backing(e) => write!(f, "the backing allocator failed: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for PoolError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Backing(e) => Some(e),
            _ => None,
        }
    }
}
