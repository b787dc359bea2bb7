//! Any policy, chosen at run time: [`AnyPolicy`] and [`BoxedPolicy`].

use super::{EvictionPolicy, Exponential, FixedCapacity, FixedTime};

/// A timed policy chosen at run time.
pub type BoxedPolicy = Box<dyn EvictionPolicy + Send>;

/// Any policy, chosen at run time (from a config file or a flag), in one
/// pool type: a boxed timed policy or a [`FixedCapacity`] table.
///
/// A pool over `AnyPolicy` running a `FixedCapacity` table never reads the
/// clock either, but every store operation dispatches on the variant: pick
/// the concrete policy type where it is known at compile time.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::policy::AnyPolicy;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedCapacity, FixedTime};
///
/// fn pool_for(flag: &str) -> DecayingPool<CheckingAllocator, AnyPolicy> {
///     let policy = match flag {
///         "fixed" => AnyPolicy::from(FixedCapacity::new(64)),
///         _ => AnyPolicy::from(FixedTime::new(Duration::from_secs(2))),
///     };
///     DecayingPool::new(CheckingAllocator::new(), policy)
/// }
/// let mut fixed = pool_for("fixed");
/// let mut timed = pool_for("ttl");
/// for pool in [&mut fixed, &mut timed] {
///     let b = pool.allocate(100)?;
///     unsafe { pool.release(b, 100) };
///     assert_eq!(pool.stats().blocks_cached, 1);
/// }
/// # Ok(())
/// # }
/// ```
pub enum AnyPolicy {
    /// A timed policy ([`FixedTime`], [`Exponential`], your own), boxed.
    Timed(BoxedPolicy),
    /// A fixed table of slots.
    Fixed(FixedCapacity),
}

impl AnyPolicy {
    /// Boxes a timed policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{policy::AnyPolicy, FixedTime};
    /// assert!(matches!(AnyPolicy::timed(FixedTime::default()), AnyPolicy::Timed(_)));
    /// ```
    pub fn timed(policy: impl EvictionPolicy + Send + 'static) -> Self {
        AnyPolicy::Timed(Box::new(policy))
    }
}

impl From<FixedCapacity> for AnyPolicy {
    fn from(policy: FixedCapacity) -> Self {
        AnyPolicy::Fixed(policy)
    }
}

/// A [`FixedTime`] policy, boxed: `AnyPolicy::from(FixedTime::new(ttl))`
/// is `AnyPolicy::timed(FixedTime::new(ttl))`.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::{policy::AnyPolicy, FixedTime};
/// let p = AnyPolicy::from(FixedTime::new(Duration::from_secs(2)));
/// assert!(matches!(p, AnyPolicy::Timed(_)));
/// ```
impl From<FixedTime> for AnyPolicy {
    fn from(policy: FixedTime) -> Self {
        AnyPolicy::timed(policy)
    }
}

/// An [`Exponential`] policy, boxed, as [`AnyPolicy::timed`] boxes it.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::{policy::AnyPolicy, Exponential};
/// let p: AnyPolicy = Exponential::new(Duration::from_secs(3)).into();
/// assert!(matches!(p, AnyPolicy::Timed(_)));
/// ```
impl From<Exponential> for AnyPolicy {
    fn from(policy: Exponential) -> Self {
        AnyPolicy::timed(policy)
    }
}

impl From<BoxedPolicy> for AnyPolicy {
    fn from(policy: BoxedPolicy) -> Self {
        AnyPolicy::Timed(policy)
    }
}

impl core::fmt::Debug for AnyPolicy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AnyPolicy::Timed(_) => f.write_str("AnyPolicy::Timed(..)"),
            AnyPolicy::Fixed(p) => f.debug_tuple("AnyPolicy::Fixed").field(p).finish(),
        }
    }
}
