//! [`Reaper`]: the background thread of [`SharedPool::spawn_reaper`].

use core::fmt;
use core::time::Duration;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread::{self, JoinHandle};

use super::handle::SharedPool;
use super::inner::Inner;
use crate::clock::Clock;
use crate::policy::Policy;
use crate::raw::RawAllocator;

/// A weak reference to a pool, for the reaper thread.
struct WeakPool<A: RawAllocator, P: Policy, C: Clock>(Weak<Inner<A, P, C>>);

// SAFETY: it is only upgraded into a `SharedPool`, which `spawn_reaper`
// requires to be `Send + Sync`; the weak reference itself reaches nothing
// else.
unsafe impl<A: RawAllocator, P: Policy, C: Clock> Send for WeakPool<A, P, C> where
    SharedPool<A, P, C>: Send + Sync
{
}

/// Starts the thread of [`SharedPool::spawn_reaper`] on `pool`.
pub(super) fn spawn<A, P, C>(pool: Weak<Inner<A, P, C>>, period: Duration) -> Reaper
where
    A: RawAllocator,
    P: Policy,
    C: Clock,
    SharedPool<A, P, C>: Send + Sync + 'static,
{
    let weak = WeakPool(pool);
    let stop = Arc::new(Stop::default());
    let thread_stop = Arc::clone(&stop);
    let handle = thread::Builder::new()
        .name("decaying-pool-reaper".into())
        .spawn(move || reap(weak, period, &thread_stop))
        .expect("SharedPool::spawn_reaper: cannot start the reaper thread");
    Reaper {
        stop,
        handle: Some(handle),
    }
}

/// The reaper thread's body.
fn reap<A, P, C>(weak: WeakPool<A, P, C>, period: Duration, stop: &Stop)
where
    A: RawAllocator,
    P: Policy,
    C: Clock,
{
    loop {
        if stop.wait(period) {
            return;
        }
        let Some(inner) = weak.0.upgrade() else {
            return;
        };
        // A panic inside `collect` (backing allocator, user policy) is
        // reported by the panic hook; the pool stays usable, so the reaper
        // carries on.
        let _ = catch_unwind(AssertUnwindSafe(|| inner.collect()));
        drop(inner);
    }
}

/// The stop flag a [`Reaper`] shares with its thread.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Waits up to `period`; returns whether a stop was requested.
    fn wait(&self, period: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        let (stopped, _) = self
            .wake
            .wait_timeout_while(stopped, period, |stopped| !*stopped)
            .unwrap_or_else(PoisonError::into_inner);
        *stopped
    }

    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_all();
    }
}

/// A background thread that calls [`SharedPool::collect`] on a period;
/// from [`SharedPool::spawn_reaper`].
///
/// Dropping it stops the thread and joins it, promptly: the thread is woken
/// rather than left to finish its period.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use core::time::Duration;
/// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
///
/// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
/// let reaper = pool.spawn_reaper(Duration::from_secs(60));
/// let start = std::time::Instant::now();
/// drop(reaper);
/// assert!(start.elapsed() < Duration::from_secs(5));
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the Reaper stops the thread at once"]
pub struct Reaper {
    stop: Arc<Stop>,
    handle: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Whether the thread is still running: `false` once it has exited
    /// because every handle to its pool was dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
    /// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
    /// use core::time::Duration;
    /// use decaying_pool::{testing::CheckingAllocator, DecayingPool, FixedTime, SharedPool};
    ///
    /// let pool = SharedPool::new(DecayingPool::new(CheckingAllocator::new(), FixedTime::default()));
    /// let reaper = pool.spawn_reaper(Duration::from_millis(1));
    /// assert!(reaper.is_running());
    /// drop(pool);
    /// let start = std::time::Instant::now();
    /// while reaper.is_running() && start.elapsed() < Duration::from_secs(5) {
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert!(!reaper.is_running());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(handle) = self.handle.take() {
            // The thread catches panics from `collect`; a failure here would
            // only be from dropping the pool on the reaper thread. Do not
            // pass it on from a destructor.
            let _ = handle.join();
        }
    }
}

impl fmt::Debug for Reaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reaper")
            .field("running", &self.is_running())
            .finish()
    }
}
