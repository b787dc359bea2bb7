//! [`LoggingAllocator`]: an allocator adaptor that logs every call to a trace.

use core::fmt;
use core::ptr::NonNull;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use super::{Event, TraceWriter};
use crate::{Clock, PreciseClock, RawAllocator, Request};

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

    fn block_key(&self, block: &Self::Block) -> Option<usize> {
        self.inner.block_key(block)
    }

    fn capacity(&self) -> Option<usize> {
        self.inner.capacity()
    }

    fn available(&self) -> Option<usize> {
        self.inner.available()
    }

    crate::raw::forward_spare!(inner);

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

/// A trace of a program's requests, written from any number of pools and
/// threads at once: give [`sink`](Self::sink) to a pool's `log_requests`
/// ([`DecayingPool::log_requests`](crate::DecayingPool::log_requests),
/// [`PackedPool::log_requests`](crate::PackedPool::log_requests); a
/// [`SharedPool`](crate::SharedPool) made from such a pool, plain, packed or
/// with thread caches, logs its callers' requests through it), run the
/// program, [`finish`](Self::finish), and replay the file with
/// `decaying-pool replay FILE` to see what every configuration would have
/// cost on it.
///
/// Events are written in the [native format](super::Format::Native) under
/// a lock, each timed by the log's clock ([`PreciseClock`] by default)
/// inside it, so the file is in time order whatever the threads. A
/// recorded pool pays for the lock and the write on every request; a pool
/// without a hook tests one pointer. A write error stops the logging (the
/// pools keep working); [`finish`](Self::finish) reports it.
///
/// # Examples
///
/// A packed pool shared by four threads, recorded and replayed:
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::trace::{Config, PolicyKind, ReplayOptions, Replayer, RequestLog, TraceReader};
/// use decaying_pool::{DecayingPool, FixedTime, MmapAllocator, Packing, SharedPool};
///
/// let path = std::env::temp_dir().join(format!("decaying-pool-doc-{}.trace", std::process::id()));
/// let log = RequestLog::create(&path)?;
/// let mut pool = DecayingPool::builder(MmapAllocator::new())
///     .policy(FixedTime::new(Duration::from_secs(1)))
///     .packing(Packing::default())
///     .build();
/// pool.log_requests(log.sink());
/// let pool = SharedPool::packed(pool);
/// std::thread::scope(|s| {
///     for t in 1..=4 {
///         let pool = pool.clone();
///         s.spawn(move || {
///             for i in 0..50 {
///                 drop(pool.allocate(t * 1000 + i).unwrap());
///             }
///         });
///     }
/// });
/// log.finish()?;
/// assert_eq!(log.events(), 400); // 200 allocations, 200 releases
///
/// // `decaying-pool replay FILE` does this for every configuration:
/// let mut r = Replayer::new(&[Config::new(PolicyKind::FixedTime(Duration::from_secs(1)))],
///                           ReplayOptions::default());
/// for e in TraceReader::new(std::io::BufReader::new(std::fs::File::open(&path)?))? {
///     r.event(&e?);
/// }
/// assert_eq!(r.finish("threads")[0].allocs, 200);
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RequestLog {
    state: Arc<Mutex<LogState>>,
}

struct LogState {
    out: TraceWriter<Box<dyn Write + Send>>,
    clock: Box<dyn Clock + Send>,
    error: Option<io::Error>,
    events: u64,
}

impl fmt::Debug for RequestLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("RequestLog")
            .field("events", &st.events)
            .field("failed", &st.error.is_some())
            .finish_non_exhaustive()
    }
}

impl RequestLog {
    /// A log writing to `out`, timed by [`PreciseClock`]; writes the header.
    ///
    /// # Errors
    ///
    /// When writing the header fails.
    ///
    /// # Examples
    ///
    /// ```
    /// let log = decaying_pool::trace::RequestLog::new(std::io::sink())?;
    /// assert_eq!(log.events(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new(out: impl Write + Send + 'static) -> io::Result<Self> {
        Self::with_clock(out, PreciseClock)
    }

    /// A log writing to a new file at `path` (buffered), timed by
    /// [`PreciseClock`].
    ///
    /// # Errors
    ///
    /// When the file cannot be created or the header written.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::RequestLog;
    /// assert!(RequestLog::create("/nonexistent-dir/x.trace").is_err());
    /// ```
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = File::create(path)?;
        Self::new(BufWriter::new(file))
    }

    /// A log writing to `out`, timed by `clock` (a
    /// [`ManualClock`](crate::ManualClock) makes it deterministic).
    ///
    /// # Errors
    ///
    /// When writing the header fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{trace::RequestLog, ManualClock};
    /// let log = RequestLog::with_clock(std::io::sink(), ManualClock::new())?;
    /// log.finish()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn with_clock(
        out: impl Write + Send + 'static,
        clock: impl Clock + Send + 'static,
    ) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = Box::new(out);
        Ok(RequestLog {
            state: Arc::new(Mutex::new(LogState {
                out: TraceWriter::new(out)?,
                clock: Box::new(clock),
                error: None,
                events: 0,
            })),
        })
    }

    /// A hook for a pool's `log_requests` that writes each request to this
    /// log (blocks name their address through [`TraceAddress`]). Any number
    /// of sinks of one log may be handed out, to pools on any threads.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{trace::RequestLog, DecayingPool, FixedTime, SystemAllocator};
    /// let log = RequestLog::new(std::io::sink())?;
    /// let mut pool = DecayingPool::new(SystemAllocator::new(), FixedTime::default());
    /// pool.log_requests(log.sink());
    /// drop(pool.allocate(64)?); // handed out, never released: one event
    /// assert_eq!(log.events(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sink<B: TraceAddress>(&self) -> impl FnMut(Request<'_, B>) + Send + 'static {
        let state = Arc::clone(&self.state);
        move |r: Request<'_, B>| {
            let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
            if st.error.is_some() {
                return;
            }
            let now = st.clock.now();
            let (addr, size) = (r.block().trace_address(), r.size() as u64);
            let event = if r.is_allocation() {
                Event::alloc(now, addr, size)
            } else {
                Event::free(now, addr, size)
            };
            match st.out.write(&event) {
                Ok(()) => st.events += 1,
                Err(e) => st.error = Some(e),
            }
        }
    }

    /// Events written so far.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::trace::RequestLog::new(Vec::new())?.events(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn events(&self) -> u64 {
        self.lock().events
    }

    /// Flushes what was written; requests logged after it are written too
    /// (call it again at the end).
    ///
    /// # Errors
    ///
    /// The first write error (logging stopped there), or the flush's.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::trace::RequestLog;
    /// let log = RequestLog::new(std::io::sink())?;
    /// log.finish()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn finish(&self) -> io::Result<()> {
        let mut st = self.lock();
        if let Some(e) = st.error.take() {
            // Stopped for good: later requests are not written.
            st.error = Some(io::Error::new(e.kind(), e.to_string()));
            return Err(e);
        }
        st.out.flush()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
