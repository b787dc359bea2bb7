//! Test doubles that check the pool (feature `testing`).
//!
//! - [`CheckingAllocator`] hands out numbered blocks, records every call,
//!   and panics on a double free, a foreign block or a wrong size;
//! - [`FailingAllocator`] wraps another allocator and fails on demand or
//!   past a byte capacity, so the out-of-memory retry can be exercised;
//! - [`PanickingAllocator`], [`PanickingClock`] and [`PanickingPolicy`]
//!   wrap an allocator, a clock or an eviction policy and panic on demand,
//!   each call kind behind its own [`PanicSwitch`] ("panic on call N"), so
//!   the pool's behaviour under a panic can be exercised.
//!
//! They are shared handles: clones see the same state, so a test keeps a
//! clone and gives the pool another, and can still look after the pool is
//! dropped.

use core::convert::Infallible;
use core::fmt;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::{Clock, ManualClock};
use crate::policy::{EvictionPolicy, FreeReason, Oldest};
use crate::raw::RawAllocator;

/// One call a [`CheckingAllocator`] received.
///
/// # Examples
///
/// ```
/// use decaying_pool::{testing::{Call, CheckingAllocator}, RawAllocator};
/// let mut a = CheckingAllocator::new();
/// let b = a.allocate(32).unwrap();
/// unsafe { a.deallocate(b, 32) };
/// assert_eq!(a.calls()[1], Call::Deallocate { block: b, size: 32 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// `allocate(size)` returned `block`.
    Allocate {
        /// The block handed out.
        block: u64,
        /// The size asked for.
        size: usize,
    },
    /// `deallocate(block, size)`.
    Deallocate {
        /// The block given back.
        block: u64,
        /// The size given with it.
        size: usize,
    },
}

#[derive(Debug, Default)]
struct CheckState {
    next: u64,
    /// Hand out addresses (`with_addresses`) rather than numbers.
    addressed: bool,
    live: HashMap<u64, usize>,
    live_bytes: usize,
    peak_live_bytes: usize,
    allocs: u64,
    deallocs: u64,
    calls: Vec<Call>,
}

/// An allocator that hands out numbered blocks (`1, 2, 3, …`; never 0),
/// records every call, and panics on misuse: a zero-size request, a double
/// free, a block it never handed out, or a size that differs from the
/// allocation's.
///
/// # Examples
///
/// ```
/// use decaying_pool::testing::{Call, CheckingAllocator};
/// use decaying_pool::{DecayingPool, FixedTime};
///
/// let alloc = CheckingAllocator::new();
/// let mut pool = DecayingPool::new(alloc.clone(), FixedTime::default());
/// let b = pool.allocate(64).unwrap();
/// unsafe { pool.release(b, 64) };
/// drop(pool);
/// assert_eq!(alloc.calls(), vec![
///     Call::Allocate { block: 1, size: 64 },
///     Call::Deallocate { block: 1, size: 64 },
/// ]);
/// alloc.assert_all_freed();
/// ```
#[derive(Clone, Debug, Default)]
pub struct CheckingAllocator {
    state: Arc<Mutex<CheckState>>,
}

impl CheckingAllocator {
    /// A new allocator with nothing handed out.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::testing::CheckingAllocator::new().live(), 0);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// An allocator whose blocks are addresses rather than numbers: each
    /// block starts past the end of the previous one (the first at 4096,
    /// every block 4096-aligned), so a block plus an offset inside it
    /// identifies one byte. This is the mode a
    /// [`PackedPool`](crate::PackedPool) needs: its [`Packable`](crate::Packable) impl
    /// carves blocks as `segment + offset`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, RawAllocator};
    /// let mut a = CheckingAllocator::with_addresses();
    /// assert_eq!(a.allocate(100).unwrap(), 4096);
    /// assert_eq!(a.allocate(5000).unwrap(), 8192);
    /// assert_eq!(a.allocate(1).unwrap(), 16384);
    /// ```
    pub fn with_addresses() -> Self {
        let a = Self::default();
        {
            let mut s = a.state();
            s.addressed = true;
            s.next = 4096;
        }
        a
    }

    fn state(&self) -> MutexGuard<'_, CheckState> {
        // A panic inside a check poisons the lock; the state is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Successful `allocate` calls so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// a.allocate(8).unwrap();
    /// assert_eq!(a.allocs(), 1);
    /// ```
    pub fn allocs(&self) -> u64 {
        self.state().allocs
    }

    /// `deallocate` calls so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// let b = a.allocate(8).unwrap();
    /// unsafe { a.deallocate(b, 8) };
    /// assert_eq!(a.deallocs(), 1);
    /// ```
    pub fn deallocs(&self) -> u64 {
        self.state().deallocs
    }

    /// Blocks handed out and not yet given back.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// a.allocate(8).unwrap();
    /// assert_eq!(a.live(), 1);
    /// ```
    pub fn live(&self) -> usize {
        self.state().live.len()
    }

    /// Bytes handed out and not yet given back.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// a.allocate(8).unwrap();
    /// assert_eq!(a.live_bytes(), 8);
    /// ```
    pub fn live_bytes(&self) -> usize {
        self.state().live_bytes
    }

    /// The most bytes ever live at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// let b = a.allocate(8).unwrap();
    /// unsafe { a.deallocate(b, 8) };
    /// assert_eq!(a.peak_live_bytes(), 8);
    /// ```
    pub fn peak_live_bytes(&self) -> usize {
        self.state().peak_live_bytes
    }

    /// Every call so far, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::{Call, CheckingAllocator}, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// a.allocate(8).unwrap();
    /// assert_eq!(a.calls(), vec![Call::Allocate { block: 1, size: 8 }]);
    /// ```
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// How many calls [`calls`](Self::calls) would return, without copying
    /// the log: a mark to pass to [`calls_since`](Self::calls_since).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// let b = a.allocate(8).unwrap();
    /// unsafe { a.deallocate(b, 8) };
    /// assert_eq!(a.calls_len(), 2);
    /// ```
    pub fn calls_len(&self) -> usize {
        self.state().calls.len()
    }

    /// The calls after the first `mark` ones, in order: what happened since
    /// [`calls_len`](Self::calls_len) returned `mark`. Empty when `mark` is
    /// at or past the end. Copies only those calls, so a check that runs
    /// after every operation stays cheap however long the log grows.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::{Call, CheckingAllocator}, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// a.allocate(8).unwrap();
    /// let mark = a.calls_len();
    /// let b = a.allocate(16).unwrap();
    /// unsafe { a.deallocate(b, 16) };
    /// assert_eq!(a.calls_since(mark), vec![
    ///     Call::Allocate { block: 2, size: 16 },
    ///     Call::Deallocate { block: 2, size: 16 },
    /// ]);
    /// assert_eq!(a.calls_since(99), vec![]);
    /// ```
    pub fn calls_since(&self, mark: usize) -> Vec<Call> {
        let s = self.state();
        s.calls.get(mark..).map_or_else(Vec::new, <[Call]>::to_vec)
    }

    /// Runs `f` on the whole call log, in order, without copying it. The
    /// allocator is locked meanwhile: `f` must not call it (or a pool over
    /// it), or it deadlocks.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::{Call, CheckingAllocator}, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// a.allocate(8).unwrap();
    /// let want = [Call::Allocate { block: 1, size: 8 }];
    /// assert!(a.with_calls(|calls| calls == want));
    /// ```
    pub fn with_calls<R>(&self, f: impl FnOnce(&[Call]) -> R) -> R {
        f(&self.state().calls)
    }

    /// The size `block` was allocated with, if it is live.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::CheckingAllocator, RawAllocator};
    /// let mut a = CheckingAllocator::new();
    /// let b = a.allocate(8).unwrap();
    /// assert_eq!(a.size_of(b), Some(8));
    /// assert_eq!(a.size_of(999), None);
    /// ```
    pub fn size_of(&self, block: u64) -> Option<usize> {
        self.state().live.get(&block).copied()
    }

    /// Asserts that every block handed out was given back.
    ///
    /// # Panics
    ///
    /// When some block is still live.
    ///
    /// # Examples
    ///
    /// ```
    /// decaying_pool::testing::CheckingAllocator::new().assert_all_freed();
    /// ```
    #[track_caller]
    pub fn assert_all_freed(&self) {
        let s = self.state();
        assert!(
            s.live.is_empty(),
            "{} blocks ({} bytes) were never deallocated",
            s.live.len(),
            s.live_bytes
        );
    }
}

impl RawAllocator for CheckingAllocator {
    type Block = u64;
    type Error = Infallible;

    /// # Panics
    ///
    /// On a zero size: a pool never asks for zero bytes.
    #[track_caller]
    fn allocate(&mut self, size: usize) -> Result<u64, Infallible> {
        assert!(size > 0, "CheckingAllocator: allocate(0)");
        let mut s = self.state();
        let block = if s.addressed {
            let at = s.next;
            let span = (size as u64).div_ceil(4096).saturating_mul(4096);
            s.next = at.saturating_add(span);
            at
        } else {
            s.next += 1;
            s.next
        };
        s.live.insert(block, size);
        s.allocs += 1;
        s.live_bytes = s.live_bytes.saturating_add(size);
        s.peak_live_bytes = s.peak_live_bytes.max(s.live_bytes);
        s.calls.push(Call::Allocate { block, size });
        Ok(block)
    }

    /// # Panics
    ///
    /// On a double free, a foreign block, or a size other than the
    /// allocation's.
    #[track_caller]
    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        let mut s = self.state();
        match s.live.remove(&block) {
            Some(had) => {
                if had != size {
                    s.live.insert(block, had);
                    drop(s);
                    panic!("CheckingAllocator: block {block} of {had} bytes freed as {size} bytes");
                }
            }
            None => {
                let issued = if s.addressed {
                    block >= 4096 && block < s.next
                } else {
                    block != 0 && block <= s.next
                };
                drop(s);
                if issued {
                    panic!("CheckingAllocator: double free of block {block}");
                }
                panic!("CheckingAllocator: block {block} was never handed out");
            }
        }
        s.deallocs += 1;
        s.live_bytes -= size;
        s.calls.push(Call::Deallocate { block, size });
    }

    #[inline]
    fn block_key(&self, block: &u64) -> Option<usize> {
        usize::try_from(*block).ok()
    }
}

/// Why a [`FailingAllocator`] refused.
///
/// # Examples
///
/// ```
/// use decaying_pool::{testing::{FailingAllocator, TestError}, RawAllocator};
/// let mut a = FailingAllocator::with_capacity(10);
/// assert_eq!(a.allocate(11).unwrap_err(), TestError::OutOfMemory { requested: 11, used: 0, capacity: 10 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestError {
    /// The request would take the bytes outstanding past the capacity.
    OutOfMemory {
        /// The size asked for.
        requested: usize,
        /// Bytes outstanding at the time.
        used: usize,
        /// The capacity.
        capacity: usize,
    },
    /// A failure injected with [`FailingAllocator::fail_next`].
    Injected,
}

impl fmt::Display for TestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TestError::OutOfMemory {
                requested,
                used,
                capacity,
            } => write!(
                f,
                "out of memory: {requested} bytes requested, {used} of {capacity} in use"
            ),
            TestError::Injected => f.write_str("injected failure"),
        }
    }
}

impl std::error::Error for TestError {}

#[derive(Debug)]
struct Control {
    capacity: AtomicUsize,
    /// Whether `RawAllocator::capacity` and `available` report it.
    silent: AtomicBool,
    used: AtomicUsize,
    fail_next: AtomicU32,
    failures: AtomicU64,
}

/// Wraps an allocator and fails on demand or past a byte capacity, like a
/// device whose memory runs out.
///
/// Clones share the controls and counters (and the inner allocator's state
/// when it is itself a shared handle, as [`CheckingAllocator`] is).
///
/// # Examples
///
/// ```
/// use decaying_pool::testing::{FailingAllocator, TestError};
/// use decaying_pool::{DecayingPool, FixedTime, PoolError};
///
/// let alloc = FailingAllocator::with_capacity(1000);
/// let mut pool = DecayingPool::new(alloc.clone(), FixedTime::default());
/// let a = pool.allocate(600).unwrap();
/// assert!(matches!(pool.allocate(600), Err(PoolError::Backing(TestError::OutOfMemory { .. }))));
/// unsafe { pool.release(a, 600) };
/// // The cached block is freed and the request retried.
/// let b = pool.allocate(700).unwrap();
/// assert_eq!(pool.stats().trimmed, 1);
/// unsafe { pool.release(b, 700) };
/// ```
#[derive(Clone, Debug)]
pub struct FailingAllocator<A = CheckingAllocator> {
    inner: A,
    ctl: Arc<Control>,
}

impl FailingAllocator<CheckingAllocator> {
    /// A [`CheckingAllocator`] that fails past `capacity` bytes outstanding.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::FailingAllocator, RawAllocator};
    /// let mut a = FailingAllocator::with_capacity(10);
    /// assert!(a.allocate(11).is_err());
    /// ```
    pub fn with_capacity(capacity: usize) -> Self {
        let a = FailingAllocator::new(CheckingAllocator::new());
        a.set_capacity(Some(capacity));
        a
    }
}

impl<A> FailingAllocator<A> {
    /// Wraps `inner`, with no capacity and no failure scheduled.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::{CheckingAllocator, FailingAllocator};
    /// let a = FailingAllocator::new(CheckingAllocator::new());
    /// assert_eq!(a.capacity(), None);
    /// ```
    pub fn new(inner: A) -> Self {
        FailingAllocator {
            inner,
            ctl: Arc::new(Control {
                capacity: AtomicUsize::new(usize::MAX),
                silent: AtomicBool::new(false),
                used: AtomicUsize::new(0),
                fail_next: AtomicU32::new(0),
                failures: AtomicU64::new(0),
            }),
        }
    }

    /// The wrapped allocator.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::FailingAllocator;
    /// assert_eq!(FailingAllocator::with_capacity(1).inner().live(), 0);
    /// ```
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// Sets the byte capacity (`None`: unlimited).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::FailingAllocator;
    /// let a = FailingAllocator::with_capacity(1);
    /// a.set_capacity(None);
    /// assert_eq!(a.capacity(), None);
    /// ```
    pub fn set_capacity(&self, capacity: Option<usize>) {
        self.ctl
            .capacity
            .store(capacity.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// The byte capacity, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::FailingAllocator;
    /// assert_eq!(FailingAllocator::with_capacity(5).capacity(), Some(5));
    /// ```
    pub fn capacity(&self) -> Option<usize> {
        match self.ctl.capacity.load(Ordering::Relaxed) {
            usize::MAX => None,
            c => Some(c),
        }
    }

    /// Whether the capacity and the bytes left are reported to a pool
    /// through [`RawAllocator::capacity`] and [`RawAllocator::available`]
    /// (default: yes, as a device reports them). Off, the allocator tells
    /// nothing, like one that cannot know: the pool then finds the
    /// capacity only by failing, and runs its whole retry ladder.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::FailingAllocator, RawAllocator};
    /// let a = FailingAllocator::with_capacity(10);
    /// a.set_reporting(false);
    /// assert_eq!((RawAllocator::capacity(&a), a.available()), (None, None));
    /// assert_eq!(a.capacity(), Some(10)); // still enforced
    /// ```
    pub fn set_reporting(&self, on: bool) {
        self.ctl.silent.store(!on, Ordering::Relaxed);
    }

    /// The capacity as reported (`None` when reporting is off).
    fn reported(&self) -> Option<usize> {
        if self.ctl.silent.load(Ordering::Relaxed) {
            None
        } else {
            FailingAllocator::capacity(self)
        }
    }

    /// Makes the next `n` allocations fail with [`TestError::Injected`].
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::FailingAllocator, RawAllocator};
    /// let mut a = FailingAllocator::with_capacity(100);
    /// a.fail_next(1);
    /// assert!(a.allocate(1).is_err());
    /// assert!(a.allocate(1).is_ok());
    /// ```
    pub fn fail_next(&self, n: u32) {
        self.ctl.fail_next.store(n, Ordering::Relaxed);
    }

    /// Allocations refused so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::FailingAllocator, RawAllocator};
    /// let mut a = FailingAllocator::with_capacity(0);
    /// let _ = a.allocate(1);
    /// assert_eq!(a.failures(), 1);
    /// ```
    pub fn failures(&self) -> u64 {
        self.ctl.failures.load(Ordering::Relaxed)
    }

    /// Bytes outstanding.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::FailingAllocator, RawAllocator};
    /// let mut a = FailingAllocator::with_capacity(100);
    /// a.allocate(30).unwrap();
    /// assert_eq!(a.used(), 30);
    /// ```
    pub fn used(&self) -> usize {
        self.ctl.used.load(Ordering::Relaxed)
    }
}

impl<A: RawAllocator> RawAllocator for FailingAllocator<A> {
    type Block = A::Block;
    type Error = TestError;

    fn allocate(&mut self, size: usize) -> Result<A::Block, TestError> {
        let injected = self
            .ctl
            .fail_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        let used = self.used();
        let capacity = self.ctl.capacity.load(Ordering::Relaxed);
        let error = if injected {
            Some(TestError::Injected)
        } else if used.checked_add(size).is_none_or(|u| u > capacity) {
            Some(TestError::OutOfMemory {
                requested: size,
                used,
                capacity,
            })
        } else {
            None
        };
        if let Some(e) = error {
            self.ctl.failures.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        match self.inner.allocate(size) {
            Ok(block) => {
                self.ctl.used.fetch_add(size, Ordering::Relaxed);
                Ok(block)
            }
            Err(e) => panic!("FailingAllocator: the inner allocator failed: {e}"),
        }
    }

    unsafe fn deallocate(&mut self, block: A::Block, size: usize) {
        self.ctl.used.fetch_sub(size, Ordering::Relaxed);
        // SAFETY: the caller upholds the contract for the same block and size,
        // which this wrapper passed through unchanged from the inner allocator.
        unsafe { self.inner.deallocate(block, size) }
    }

    /// The byte capacity ([`set_capacity`](FailingAllocator::set_capacity)),
    /// or the inner allocator's when that is lower or the only one: a
    /// simulated device reports its size, as a real one does (unless
    /// [`set_reporting`](FailingAllocator::set_reporting) turned it off).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::FailingAllocator, RawAllocator};
    /// let a = FailingAllocator::with_capacity(1000);
    /// assert_eq!(RawAllocator::capacity(&a), Some(1000));
    /// a.set_capacity(None);
    /// assert_eq!(RawAllocator::capacity(&a), None);
    /// ```
    fn capacity(&self) -> Option<usize> {
        min_known(self.reported(), self.inner.capacity())
    }

    /// The capacity less the bytes outstanding (an injected failure
    /// ([`fail_next`](FailingAllocator::fail_next)) does not change it), or
    /// the inner allocator's figure when that is lower or the only one.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::FailingAllocator, RawAllocator};
    /// let mut a = FailingAllocator::with_capacity(1000);
    /// let b = a.allocate(300)?;
    /// assert_eq!(a.available(), Some(700));
    /// # unsafe { a.deallocate(b, 300) };
    /// # Ok::<(), decaying_pool::testing::TestError>(())
    /// ```
    fn available(&self) -> Option<usize> {
        let own = self.reported().map(|c| c.saturating_sub(self.used()));
        min_known(own, self.inner.available())
    }

    crate::raw::forward_spare!(inner);
}

/// The smaller of two bounds, either of which may be unknown.
fn min_known(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A shared "panic on call N" switch for the panicking test doubles.
///
/// Every call the double routes through the switch is counted; once armed
/// with [`panic_on(n)`](Self::panic_on), the `n`-th call from then on panics
/// (once: the switch disarms itself as it fires). Clones share the switch,
/// so a test keeps one and arms it while the pool owns the double.
///
/// The panic payload is a `String` that starts with
/// [`PanicSwitch::MESSAGE`].
///
/// # Examples
///
/// ```
/// use decaying_pool::testing::PanicSwitch;
/// let switch = PanicSwitch::new();
/// switch.hit(); // not armed: counted, no panic
/// switch.panic_on(2);
/// switch.hit();
/// assert!(std::panic::catch_unwind(|| switch.hit()).is_err());
/// switch.hit(); // fired once, disarmed
/// assert_eq!((switch.calls(), switch.fired()), (4, 1));
/// ```
#[derive(Clone, Debug, Default)]
pub struct PanicSwitch {
    state: Arc<SwitchState>,
}

#[derive(Debug, Default)]
struct SwitchState {
    calls: AtomicU64,
    /// Calls left before the panic, counting the one that panics; 0: disarmed.
    countdown: AtomicU64,
    fired: AtomicU64,
}

impl PanicSwitch {
    /// How every injected panic's message starts.
    pub const MESSAGE: &'static str = "PanicSwitch: injected panic";

    /// A disarmed switch.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::testing::PanicSwitch::new().calls(), 0);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Arms the switch: the `n`-th call from now panics (`1`: the next one);
    /// `0` disarms it.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::PanicSwitch;
    /// let s = PanicSwitch::new();
    /// s.panic_on(1);
    /// s.panic_on(0);
    /// s.hit(); // disarmed
    /// ```
    pub fn panic_on(&self, n: u64) {
        self.state.countdown.store(n, Ordering::SeqCst);
    }

    /// Calls counted so far (the panicking ones included).
    ///
    /// # Examples
    ///
    /// ```
    /// let s = decaying_pool::testing::PanicSwitch::new();
    /// s.hit();
    /// assert_eq!(s.calls(), 1);
    /// ```
    pub fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::SeqCst)
    }

    /// Panics injected so far.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::testing::PanicSwitch::new().fired(), 0);
    /// ```
    pub fn fired(&self) -> u64 {
        self.state.fired.load(Ordering::SeqCst)
    }

    /// Counts a call, and panics if it is the one the switch is armed for.
    ///
    /// # Panics
    ///
    /// On the call the switch was armed for, with a message starting with
    /// [`PanicSwitch::MESSAGE`].
    ///
    /// # Examples
    ///
    /// ```
    /// let s = decaying_pool::testing::PanicSwitch::new();
    /// s.panic_on(1);
    /// assert!(std::panic::catch_unwind(|| s.hit()).is_err());
    /// ```
    #[track_caller]
    pub fn hit(&self) {
        let call = self.state.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let fire = self
            .state
            .countdown
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            == Ok(1);
        if fire {
            self.state.fired.fetch_add(1, Ordering::SeqCst);
            panic!("{} (call {call})", Self::MESSAGE);
        }
    }
}

/// Wraps an allocator; panics on demand in `allocate` or `deallocate`.
///
/// Both panic *before* calling the inner allocator: a panicking
/// `allocate` allocates nothing, and the block of a panicking `deallocate`
/// stays live in the inner allocator (so a [`CheckingAllocator`] inside
/// shows which blocks were given back). Clones share the inner allocator's
/// state (when it is a shared handle) and the switches.
///
/// # Examples
///
/// ```
/// use decaying_pool::testing::{CheckingAllocator, PanickingAllocator};
/// use decaying_pool::RawAllocator;
/// let mut a = PanickingAllocator::new(CheckingAllocator::new());
/// a.on_allocate().panic_on(1);
/// assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.allocate(8))).is_err());
/// assert_eq!(a.inner().allocs(), 0);
/// let b = a.allocate(8).unwrap();
/// unsafe { a.deallocate(b, 8) };
/// assert_eq!(a.on_deallocate().calls(), 1);
/// ```
#[derive(Clone, Debug, Default)]
pub struct PanickingAllocator<A = CheckingAllocator> {
    inner: A,
    on_allocate: PanicSwitch,
    on_deallocate: PanicSwitch,
}

impl<A> PanickingAllocator<A> {
    /// Wraps `inner`, with both switches disarmed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::{CheckingAllocator, PanickingAllocator};
    /// let a = PanickingAllocator::new(CheckingAllocator::new());
    /// assert_eq!(a.on_allocate().calls(), 0);
    /// ```
    pub fn new(inner: A) -> Self {
        PanickingAllocator {
            inner,
            on_allocate: PanicSwitch::new(),
            on_deallocate: PanicSwitch::new(),
        }
    }

    /// The wrapped allocator.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::{CheckingAllocator, PanickingAllocator};
    /// assert_eq!(PanickingAllocator::new(CheckingAllocator::new()).inner().live(), 0);
    /// ```
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// The switch `allocate` goes through.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::{CheckingAllocator, PanickingAllocator};
    /// PanickingAllocator::new(CheckingAllocator::new()).on_allocate().panic_on(1);
    /// ```
    pub fn on_allocate(&self) -> &PanicSwitch {
        &self.on_allocate
    }

    /// The switch `deallocate` goes through.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::{CheckingAllocator, PanickingAllocator};
    /// PanickingAllocator::new(CheckingAllocator::new()).on_deallocate().panic_on(1);
    /// ```
    pub fn on_deallocate(&self) -> &PanicSwitch {
        &self.on_deallocate
    }
}

impl<A: RawAllocator> RawAllocator for PanickingAllocator<A> {
    type Block = A::Block;
    type Error = A::Error;

    /// # Panics
    ///
    /// When [`on_allocate`](PanickingAllocator::on_allocate) fires, before
    /// allocating.
    fn allocate(&mut self, size: usize) -> Result<A::Block, A::Error> {
        self.on_allocate.hit();
        self.inner.allocate(size)
    }

    /// # Panics
    ///
    /// When [`on_deallocate`](PanickingAllocator::on_deallocate) fires,
    /// before deallocating (the block stays live in the inner allocator).
    unsafe fn deallocate(&mut self, block: A::Block, size: usize) {
        self.on_deallocate.hit();
        // SAFETY: the caller upholds the contract for the same block and
        // size, passed through unchanged from the inner allocator.
        unsafe { self.inner.deallocate(block, size) }
    }

    /// The inner allocator's capacity (no panic switch).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::testing::{FailingAllocator, PanickingAllocator};
    /// use decaying_pool::RawAllocator;
    /// let a = PanickingAllocator::new(FailingAllocator::with_capacity(64));
    /// assert_eq!((a.capacity(), a.available()), (Some(64), Some(64)));
    /// ```
    fn capacity(&self) -> Option<usize> {
        self.inner.capacity()
    }

    /// The inner allocator's figure (no panic switch).
    fn available(&self) -> Option<usize> {
        self.inner.available()
    }

    crate::raw::forward_spare!(inner);
}

/// Wraps a clock (a [`ManualClock`] by default); every read goes through a
/// [`PanicSwitch`]. Clones share the inner clock (when it is a shared
/// handle) and the switch.
///
/// # Examples
///
/// ```
/// use decaying_pool::testing::PanickingClock;
/// use decaying_pool::{Clock, ManualClock};
/// let clock = PanickingClock::new(ManualClock::new());
/// clock.switch().panic_on(1);
/// assert!(std::panic::catch_unwind(|| clock.now()).is_err());
/// assert_eq!(clock.now(), core::time::Duration::ZERO);
/// ```
#[derive(Clone, Debug, Default)]
pub struct PanickingClock<C = ManualClock> {
    inner: C,
    switch: PanicSwitch,
}

impl<C> PanickingClock<C> {
    /// Wraps `inner`, with the switch disarmed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::PanickingClock, ManualClock};
    /// let c = PanickingClock::new(ManualClock::new());
    /// assert_eq!(c.switch().calls(), 0);
    /// ```
    pub fn new(inner: C) -> Self {
        PanickingClock {
            inner,
            switch: PanicSwitch::new(),
        }
    }

    /// The wrapped clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::PanickingClock, Clock, ManualClock};
    /// assert_eq!(PanickingClock::new(ManualClock::new()).inner().now(), core::time::Duration::ZERO);
    /// ```
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// The switch every read goes through.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::PanickingClock, ManualClock};
    /// PanickingClock::new(ManualClock::new()).switch().panic_on(3);
    /// ```
    pub fn switch(&self) -> &PanicSwitch {
        &self.switch
    }
}

impl<C: Clock> Clock for PanickingClock<C> {
    /// # Panics
    ///
    /// When the switch fires.
    fn now(&self) -> Duration {
        self.switch.hit();
        self.inner.now()
    }

    /// # Panics
    ///
    /// When the switch fires.
    fn now_nanos(&self) -> u64 {
        self.switch.hit();
        self.inner.now_nanos()
    }
}

/// The switches of a [`PanickingPolicy`], one per [`EvictionPolicy`] call.
///
/// # Examples
///
/// ```
/// use decaying_pool::testing::{PanickingPolicy, PolicySwitches};
/// use decaying_pool::FixedTime;
/// let policy = PanickingPolicy::new(FixedTime::default());
/// let switches: PolicySwitches = policy.switches();
/// switches.on_free.panic_on(1);
/// ```
#[derive(Clone, Debug, Default)]
pub struct PolicySwitches {
    /// [`EvictionPolicy::on_release`].
    pub on_release: PanicSwitch,
    /// [`EvictionPolicy::on_hit`].
    pub on_hit: PanicSwitch,
    /// [`EvictionPolicy::on_free`].
    pub on_free: PanicSwitch,
    /// [`EvictionPolicy::must_evict`].
    pub must_evict: PanicSwitch,
    /// [`EvictionPolicy::deadline`] and
    /// [`EvictionPolicy::provisional_deadline`]: a deadline query (the pool
    /// asks through `provisional_deadline`, which the wrapper forwards to
    /// the inner policy's own, so each query goes through this switch
    /// once).
    pub deadline: PanicSwitch,
    /// [`EvictionPolicy::deadline_stale`].
    pub deadline_stale: PanicSwitch,
}

/// Wraps an eviction policy; every call goes through its own
/// [`PanicSwitch`] (see [`PolicySwitches`]) before reaching the inner
/// policy. Every method of [`EvictionPolicy`] is forwarded, those with
/// defaults included, so the pool sees the inner policy's deadlines
/// ([`provisional_deadline`](EvictionPolicy::provisional_deadline) and
/// [`deadline_stale`](EvictionPolicy::deadline_stale)) and skips its
/// checks as it would without the wrapper. Clones share the switches, not
/// the inner policy's state.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::testing::{CheckingAllocator, PanickingPolicy};
/// use decaying_pool::{DecayingPool, FixedTime, ManualClock};
/// let policy = PanickingPolicy::new(FixedTime::new(Duration::from_secs(1)));
/// let switches = policy.switches();
/// let mut pool = DecayingPool::builder(CheckingAllocator::new())
///     .policy(policy)
///     .clock(ManualClock::new())
///     .build();
/// let b = pool.allocate(8).unwrap();
/// unsafe { pool.release(b, 8) };
/// assert_eq!(switches.on_release.calls(), 1);
/// ```
#[derive(Clone, Debug, Default)]
pub struct PanickingPolicy<P> {
    inner: P,
    switches: PolicySwitches,
}

impl<P> PanickingPolicy<P> {
    /// Wraps `inner`, with every switch disarmed.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::PanickingPolicy, FixedTime};
    /// let p = PanickingPolicy::new(FixedTime::default());
    /// assert_eq!(p.switches().must_evict.calls(), 0);
    /// ```
    pub fn new(inner: P) -> Self {
        PanickingPolicy {
            inner,
            switches: PolicySwitches::default(),
        }
    }

    /// The switches (shared: arm them after the pool took the policy).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{testing::PanickingPolicy, FixedTime};
    /// let p = PanickingPolicy::new(FixedTime::default());
    /// p.switches().deadline.panic_on(1);
    /// ```
    pub fn switches(&self) -> PolicySwitches {
        self.switches.clone()
    }
}

impl<P: EvictionPolicy> EvictionPolicy for PanickingPolicy<P> {
    fn on_release(&mut self, now: Duration, size: usize, bytes_cached: usize) {
        self.switches.on_release.hit();
        self.inner.on_release(now, size, bytes_cached);
    }

    fn on_hit(&mut self, now: Duration, size: usize, before: usize, after: usize) {
        self.switches.on_hit.hit();
        self.inner.on_hit(now, size, before, after);
    }

    fn on_free(&mut self, now: Duration, size: usize, after: usize, reason: FreeReason) {
        self.switches.on_free.hit();
        self.inner.on_free(now, size, after, reason);
    }

    fn must_evict(&mut self, now: Duration, oldest: Oldest, bytes_cached: usize) -> bool {
        self.switches.must_evict.hit();
        self.inner.must_evict(now, oldest, bytes_cached)
    }

    fn deadline(&self, oldest: Oldest) -> Option<Duration> {
        self.switches.deadline.hit();
        self.inner.deadline(oldest)
    }

    /// Forwarded: a wrapper that left it out would give the pool the inner
    /// policy's [`deadline`](EvictionPolicy::deadline) instead (none, for
    /// [`Exponential`](crate::Exponential)), and the planned-deadline path
    /// would never run under the wrapper.
    fn provisional_deadline(&self, oldest: Oldest) -> Option<Duration> {
        self.switches.deadline.hit();
        self.inner.provisional_deadline(oldest)
    }

    fn deadline_stale(&self) -> bool {
        self.switches.deadline_stale.hit();
        self.inner.deadline_stale()
    }
}

impl crate::Packable for CheckingAllocator {
    /// `segment + offset`: meaningful for an allocator made with
    /// [`CheckingAllocator::with_addresses`] (numbered blocks would collide).
    fn carve(segment: &u64, offset: usize) -> u64 {
        crate::packing::carve_u64(segment, offset)
    }

    fn address(block: &u64) -> usize {
        crate::packing::address_u64(block)
    }
}

impl<A: crate::Packable> crate::Packable for FailingAllocator<A> {
    fn carve(segment: &A::Block, offset: usize) -> A::Block {
        A::carve(segment, offset)
    }

    fn address(block: &A::Block) -> usize {
        A::address(block)
    }
}

impl<A: crate::Packable> crate::Packable for PanickingAllocator<A> {
    fn carve(segment: &A::Block, offset: usize) -> A::Block {
        A::carve(segment, offset)
    }

    fn address(block: &A::Block) -> usize {
        A::address(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Exponential, FixedTime};
    use crate::pool::DecayingPool;

    /// The pool gets the inner policy's planned deadline through the
    /// wrapper: once a collection kept the oldest block, an allocation
    /// before the deadline skips `must_evict`. (Without the forwarding,
    /// `Exponential` gives no deadline and every allocation asks.)
    #[test]
    fn panicking_policy_forwards_deadlines() {
        fn run<P: EvictionPolicy>(inner: P) -> (u64, u64, u64) {
            let policy = PanickingPolicy::new(inner);
            let switches = policy.switches();
            let clock = ManualClock::new();
            let mut pool = DecayingPool::builder(CheckingAllocator::new())
                .policy(policy)
                .clock(clock.clone())
                .build();
            let a = pool.allocate(64).unwrap();
            // SAFETY: `a` came from this pool with 64 bytes, released once.
            unsafe { pool.release(a, 64) };
            assert_eq!(pool.collect(), 0);
            assert_eq!(switches.must_evict.calls(), 1, "the collection asks");
            clock.advance(Duration::from_millis(250));
            let b = pool.allocate(128).unwrap();
            let skipped = switches.must_evict.calls() == 1;
            assert!(
                skipped,
                "the allocation before the deadline skips must_evict"
            );
            // SAFETY: `b` came from this pool with 128 bytes, released once.
            unsafe { pool.release(b, 128) };
            (
                switches.deadline.calls(),
                switches.deadline_stale.calls(),
                switches.must_evict.calls(),
            )
        }
        let (deadlines, stale, _) = run(Exponential::new(Duration::from_secs(1)));
        assert!(deadlines >= 1, "provisional_deadline reaches the switch");
        assert_eq!(stale, 2, "deadline_stale after each release");
        let (deadlines, stale, _) = run(FixedTime::new(Duration::from_secs(1)));
        assert!(deadlines >= 1);
        assert_eq!(stale, 2);
    }

    /// A panic injected into `deadline_stale` or `provisional_deadline`
    /// fires in the pool's calls to them.
    #[test]
    fn deadline_switches_fire() {
        let policy = PanickingPolicy::new(Exponential::new(Duration::from_secs(1)));
        let switches = policy.switches();
        let mut pool = DecayingPool::builder(CheckingAllocator::new())
            .policy(policy)
            .clock(ManualClock::new())
            .build();
        let a = pool.allocate(64).unwrap();
        switches.deadline_stale.panic_on(1);
        let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: `a` came from this pool with 64 bytes, released once
            // (a release that panics still takes the block).
            unsafe { pool.release(a, 64) }
        }));
        assert!(released.is_err());
        assert_eq!(switches.deadline_stale.fired(), 1);
        switches.deadline.panic_on(1);
        let collected = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.collect()));
        assert!(collected.is_err());
        assert_eq!(switches.deadline.fired(), 1);
        assert_eq!(pool.stats().blocks_cached, 1);
    }
}
