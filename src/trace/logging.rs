//! [`LoggingAllocator`]: an allocator adaptor that logs every call to a trace.

use core::fmt;
use core::ptr::NonNull;
use std::io::{self, Write};

use super::{Event, TraceWriter};
use crate::{Clock, PreciseClock, RawAllocator};

/// A block handle that names an address, so a [`LoggingAllocator`] can write it
/// to a trace: integers (device pointers, offsets) and host pointers.
///
/// # Examples
///
/// ```
/// use decaying_pool::trace::TraceAddress;
/// assert_eq!(0x40u64.trace_address(), 0x40);
/// ```
pub trait TraceAddress {
    /// The block's address; two live blocks must not share one.
    fn trace_address(&self) -> u64;
}

macro_rules! int_address {
    ($($t:ty),*) => {$(
        impl TraceAddress for $t {
            #[inline]
            fn trace_address(&self) -> u64 {
                *self as u64
            }
        }
    )*};
}
int_address!(u32, u64, usize);

impl<T: ?Sized> TraceAddress for NonNull<T> {
    #[inline]
    fn trace_address(&self) -> u64 {
        self.cast::<u8>().as_ptr() as usize as u64
    }
}

impl<T> TraceAddress for *mut T {
    #[inline]
    fn trace_address(&self) -> u64 {
        *self as usize as u64
    }
}

impl<T> TraceAddress for *const T {
    #[inline]
    fn trace_address(&self) -> u64 {
        *self as usize as u64
    }
}

/// Wraps a [`RawAllocator`] and logs every successful `allocate` and every
/// `deallocate` to `W` in the [native trace format](super::Format::Native),
/// as RMM's `logging_resource_adaptor` does: wrap the allocator a program
/// calls (a pool, to record the program's own requests; a backing
/// allocator, to record what reaches it), run the program, and replay the
/// file with [`Replayer`](super::Replayer) or `decaying-pool replay`.
///
/// Times come from the clock `C` ([`PreciseClock`] by default; a
/// [`ManualClock`](crate::ManualClock) makes a recording deterministic).
/// Failed allocations are not logged. A write error stops the logging (the
/// allocator keeps working); [`finish`](Self::finish) reports it.
///
/// # Examples
///
/// A program records its own requests in one line, and the trace replays
/// to the backing calls the program made:
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::trace::{Config, PolicyKind, LoggingAllocator, Replayer, ReplayOptions, TraceReader};
/// use decaying_pool::{DecayingPool, FixedTime, ManualClock, RawAllocator};
///
/// let clock = ManualClock::new();
/// let pool = DecayingPool::builder(CheckingAllocator::new())
///     .policy(FixedTime::new(Duration::from_millis(100)))
///     .clock(clock.clone())
///     .build();
/// let mut rec = LoggingAllocator::with_clock(pool, Vec::new(), clock.clone())?;
/// for _ in 0..3 {
///     let b = rec.allocate(4096).unwrap();
///     clock.advance(Duration::from_millis(10));
///     unsafe { rec.deallocate(b, 4096) };
/// }
/// let (pool, trace) = rec.finish()?;
///
/// let mut r = Replayer::new(&[Config::new(PolicyKind::FixedTime(Duration::from_millis(100)))],
///                           Default::default());
/// for e in TraceReader::new(&trace[..])? {
///     r.event(&e?);
/// }
/// assert_eq!(r.finish("recorded")[0].backing_allocs, pool.stats().misses);
/// # Ok(())
/// # }
/// ```
pub struct LoggingAllocator<A, W: Write, C = PreciseClock> {
    inner: A,
    out: TraceWriter<W>,
    error: Option<io::Error>,
    clock: C,
}

impl<A, W: Write, C> fmt::Debug for LoggingAllocator<A, W, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingAllocator")
            .field("failed", &self.error.is_some())
            .finish_non_exhaustive()
    }
}

impl<A: RawAllocator, W: Write> LoggingAllocator<A, W, PreciseClock> {
    /// Records `inner`'s calls to `out` on real time; writes the header.
    ///
    /// # Errors
    ///
    /// When writing the header fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{trace::LoggingAllocator, SystemAllocator};
    /// let rec = LoggingAllocator::new(SystemAllocator::new(), Vec::new()).unwrap();
    /// assert_eq!(rec.finish().unwrap().1, b"time_ns,action,addr,size\n");
    /// ```
    pub fn new(inner: A, out: W) -> io::Result<Self> {
        Self::with_clock(inner, out, PreciseClock)
    }
}

impl<A: RawAllocator, W: Write, C: Clock> LoggingAllocator<A, W, C> {
    /// Records `inner`'s calls to `out`, timed by `clock`; writes the header.
    ///
    /// # Errors
    ///
    /// When writing the header fails.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, trace::LoggingAllocator, ManualClock};
    /// let rec = LoggingAllocator::with_clock(CheckingAllocator::new(), Vec::new(), ManualClock::new()).unwrap();
    /// assert!(rec.error().is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_clock(inner: A, out: W, clock: C) -> io::Result<Self> {
        Ok(LoggingAllocator {
            inner,
            out: TraceWriter::new(out)?,
            error: None,
            clock,
        })
    }

    /// The wrapped allocator.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, trace::LoggingAllocator};
    /// let rec = LoggingAllocator::new(CheckingAllocator::new(), Vec::new()).unwrap();
    /// assert_eq!(rec.inner().live(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// The first write error, if logging stopped.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, trace::LoggingAllocator};
    /// let rec = LoggingAllocator::new(CheckingAllocator::new(), Vec::new()).unwrap();
    /// assert!(rec.error().is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn error(&self) -> Option<&io::Error> {
        self.error.as_ref()
    }

    /// Flushes the trace and returns the allocator and the output.
    ///
    /// # Errors
    ///
    /// The first write error, or the flush's.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use decaying_pool::{testing::CheckingAllocator, trace::LoggingAllocator, RawAllocator};
    /// let mut rec = LoggingAllocator::new(CheckingAllocator::new(), Vec::new()).unwrap();
    /// let b = rec.allocate(64).unwrap();
    /// unsafe { rec.deallocate(b, 64) };
    /// let (_, text) = rec.finish().unwrap();
    /// assert_eq!(String::from_utf8(text).unwrap().lines().count(), 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn finish(mut self) -> io::Result<(A, W)> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let out = self.out.finish()?;
        Ok((self.inner, out))
    }

    fn log(&mut self, event: Event) {
        if self.error.is_none() {
            if let Err(e) = self.out.write(&event) {
                self.error = Some(e);
            }
        }
    }
}

impl<A, W, C> RawAllocator for LoggingAllocator<A, W, C>
where
    A: RawAllocator,
    A::Block: TraceAddress,
    W: Write,
    C: Clock,
{
    type Block = A::Block;
    type Error = A::Error;

    fn allocate(&mut self, size: usize) -> Result<Self::Block, Self::Error> {
        let block = self.inner.allocate(size)?;
        let now = self.clock.now();
        self.log(Event::alloc(now, block.trace_address(), size as u64));
        Ok(block)
    }

    unsafe fn deallocate(&mut self, block: Self::Block, size: usize) {
        let now = self.clock.now();
        self.log(Event::free(now, block.trace_address(), size as u64));
        // SAFETY: the caller upholds `deallocate`'s contract for this
        // adaptor, which hands out exactly the inner allocator's blocks.
        unsafe { self.inner.deallocate(block, size) }
    }
}
