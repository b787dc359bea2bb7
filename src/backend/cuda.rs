//! CUDA backing allocators through `cudarc` (feature `cuda`).
//!
//! The crate loads `libcuda` at run time (`cudarc`'s dynamic loading), so it
//! builds and its tests pass on machines with no CUDA at all;
//! [`available`] tells whether a driver and a device are there.
//!
//! - [`DeviceAllocator`]: `cuMemAlloc` / `cuMemFree` on one context — the
//!   default. Each `cuMemAlloc` costs about 180 µs at 64 KB, 0.5 ms at 1 MB,
//!   1.2 ms at 64 MB and 12.5 ms at 512 MB, and `cuMemFree` (50–180 µs)
//!   synchronises the device: exactly what a pool in front of it removes.
//! - [`StreamAllocator`]: `cuMemAllocAsync` / `cuMemFreeAsync` on one stream.
//!   The driver's own stream-ordered pool already answers in about 1.7 µs
//!   (alloc) and 1.2 µs (free) when it hits, but by default it gives its
//!   memory back at every synchronisation, unless its release threshold is
//!   raised; a `DecayingPool` in front of it keeps blocks across
//!   synchronisations with a decay you choose. With a raised threshold the
//!   driver's pool already caches, and caching on top of it caches twice:
//!   then use it directly, or a `DecayingPool` over [`DeviceAllocator`].
//! - [`PinnedHostAllocator`]: page-locked host memory (`cuMemHostAlloc`,
//!   about 2.3 ms up to 1 MB and 61 ms at 512 MB) for fast transfers.
//!
//! (Costs: published figures, the same the replay's default cost model
//! uses (`trace::CostCurve::cuda_malloc`, `cuda_free`, `cuda_host_alloc`).
//! Measured on an idle NVIDIA H200 by `examples/cuda_costs.rs`, the device
//! calls cost 10 to 400 times less: 18 µs for 1 MB, 75 µs for 1 GiB
//! (`trace::CostCurve::cu_mem_alloc_h200` and its siblings); pinned host
//! memory cost more, 197 ms for 512 MB. A `cuMemFree` also waits for the
//! work queued on the device. They vary with hardware and driver.)
//!
//! # What the caller guarantees before a block is reused or freed
//!
//! A pool hands a released block to the next request of its class, and
//! frees it when it decays. Work already queued on a stream may still read
//! or write the block at that moment. So:
//!
//! - with [`DeviceAllocator`], use a pool from one stream (stream order
//!   then puts the next user's work after the previous user's), or
//!   synchronise the stream that used a block before releasing it when
//!   blocks move between streams. Freeing is safe: `cuMemFree` waits for
//!   the device;
//! - with [`StreamAllocator`], use the blocks only on its stream: both
//!   reuse and the stream-ordered free are then ordered after earlier work;
//! - with [`PinnedHostAllocator`], make sure no copy still reads or writes
//!   a block (synchronise the stream of an async copy) before releasing it.
//!
//! [`SlicePool`](crate::cuda::SlicePool), above the pool, hands out typed
//! `cudarc` `CudaSlice`s on one stream, which satisfies the first rule by
//! construction.

use core::fmt;
use core::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use cudarc::driver::{CudaContext, CudaStream};

use crate::raw::RawAllocator;

/// Whether CUDA can be used here: the driver library loads, initialises,
/// and reports at least one device. Never panics.
///
/// # Examples
///
/// ```
/// if decaying_pool::cuda::available() {
///     let alloc = decaying_pool::cuda::DeviceAllocator::new(0).unwrap();
///     # drop(alloc);
/// } else {
///     println!("no CUDA device: skipping");
/// }
/// ```
pub fn available() -> bool {
    // SAFETY: `is_culib_present` only tries to open the library by name.
    if !unsafe { sys::is_culib_present() } {
        return false;
    }
    // A driver too old for a symbol cudarc needs panics on first use; treat
    // that as "not available" too.
    std::panic::catch_unwind(|| CudaContext::device_count().is_ok_and(|n| n > 0)).unwrap_or(false)
}

/// `fraction` of the total memory of `ctx`'s device, in bytes: a byte
/// limit for [`DecayingPool::set_limit`](crate::DecayingPool::set_limit) or
/// [`Builder::limit`](crate::Builder::limit), as PyTorch's
/// `set_per_process_memory_fraction`.
///
/// `fraction` is clamped to `0.0..=1.0` (NaN counts as 0); the result is
/// rounded down.
///
/// # Errors
///
/// The driver's error when it cannot tell the device's memory
/// ([`CudaError::Driver`], size 0).
///
/// # Examples
///
/// ```
/// use decaying_pool::{cuda, DecayingPool, FixedTime};
/// if cuda::available() {
///     let alloc = cuda::DeviceAllocator::new(0)?;
///     let limit = cuda::memory_fraction(alloc.context(), 0.5)?;
///     let mut pool = DecayingPool::new(alloc, FixedTime::default());
///     pool.set_limit(Some(limit));
///     assert!(pool.allocate(limit + 1).is_err());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn memory_fraction(ctx: &CudaContext, fraction: f64) -> Result<usize, CudaError> {
    let total = ctx
        .total_mem()
        .map_err(|error| CudaError::Driver { size: 0, error })?;
    Ok(fraction_of(total, fraction))
}

/// `fraction` (clamped to `0.0..=1.0`, NaN as 0) of `total`, rounded down.
fn fraction_of(total: usize, fraction: f64) -> usize {
    let f = if fraction.is_nan() {
        0.0
    } else {
        fraction.clamp(0.0, 1.0)
    };
    if f >= 1.0 {
        return total;
    }
    // `as` saturates; `f < 1` keeps the product below `total`.
    ((total as f64 * f) as usize).min(total)
}

/// Why a CUDA allocator failed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum CudaError {
    /// The device (or the pinned-host allocator) is out of memory: the
    /// pool's retry ladder frees cached blocks and tries again.
    OutOfMemory {
        /// The size asked for.
        size: usize,
    },
    /// Another driver error.
    Driver {
        /// The size asked for (0 when not allocating).
        size: usize,
        /// The driver's error.
        error: DriverError,
    },
    /// No CUDA driver or device on this machine.
    Unavailable,
}

impl CudaError {
    /// Maps a driver error from an allocation of `size` bytes:
    /// `CUDA_ERROR_OUT_OF_MEMORY` becomes [`CudaError::OutOfMemory`].
    ///
    /// # Examples
    ///
    /// ```
    /// use cudarc::driver::{sys::CUresult, DriverError};
    /// use decaying_pool::cuda::CudaError;
    ///
    /// let e = CudaError::from_driver(1 << 30, DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    /// assert_eq!(e, CudaError::OutOfMemory { size: 1 << 30 });
    /// assert!(e.is_out_of_memory());
    /// ```
    pub fn from_driver(size: usize, error: DriverError) -> Self {
        if error.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            CudaError::OutOfMemory { size }
        } else {
            CudaError::Driver { size, error }
        }
    }

    /// Whether this is an out-of-memory error.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!decaying_pool::cuda::CudaError::Unavailable.is_out_of_memory());
    /// ```
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, CudaError::OutOfMemory { .. })
    }
}

impl fmt::Debug for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `DriverError`'s own `Debug` asks the driver for a message; the
        // result code's name needs no driver.
        match self {
            CudaError::OutOfMemory { size } => {
                f.debug_struct("OutOfMemory").field("size", size).finish()
            }
            CudaError::Driver { size, error } => f
                .debug_struct("Driver")
                .field("size", size)
                .field("error", &error.0)
                .finish(),
            CudaError::Unavailable => f.write_str("Unavailable"),
        }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::OutOfMemory { size } => {
                write!(f, "CUDA out of memory allocating {size} bytes")
            }
            CudaError::Driver { size, error } => {
                write!(f, "CUDA driver error {:?} (size {size})", error.0)
            }
            CudaError::Unavailable => f.write_str("no CUDA driver or device"),
        }
    }
}

impl std::error::Error for CudaError {}

fn context(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    if !available() {
        return Err(CudaError::Unavailable);
    }
    CudaContext::new(ordinal).map_err(|error| CudaError::Driver { size: 0, error })
}

/// Device memory from `cuMemAlloc` / `cuMemFree` on one context: the
/// default CUDA backing allocator. Blocks are device pointers
/// ([`CUdeviceptr`]).
///
/// Every call first binds the context to the calling thread, so the pool
/// may call it from any thread. See the [module documentation](self) for
/// what the caller guarantees before a block is reused or freed.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::cuda::{self, DeviceAllocator};
/// use decaying_pool::{DecayingPool, FixedTime};
///
/// if cuda::available() {
///     let mut pool = DecayingPool::new(DeviceAllocator::new(0)?, FixedTime::new(Duration::from_secs(2)));
///     let ptr = pool.allocate(64 << 20)?;       // cuMemAlloc
///     unsafe { pool.release(ptr, 64 << 20) };
///     assert_eq!(pool.allocate(64 << 20)?, ptr); // no driver call
/// #   unsafe { pool.release(ptr, 64 << 20) };
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct DeviceAllocator {
    ctx: Arc<CudaContext>,
}

impl DeviceAllocator {
    /// An allocator on the primary context of device `ordinal`.
    ///
    /// # Errors
    ///
    /// [`CudaError::Unavailable`] without a driver or device; the driver's
    /// error for a bad ordinal.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda::{self, CudaError, DeviceAllocator};
    /// if !cuda::available() {
    ///     assert_eq!(DeviceAllocator::new(0).unwrap_err(), CudaError::Unavailable);
    /// }
    /// ```
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        Ok(DeviceAllocator {
            ctx: context(ordinal)?,
        })
    }

    /// An allocator on an existing context.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda::{self, DeviceAllocator};
    /// if cuda::available() {
    ///     let ctx = cudarc::driver::CudaContext::new(0)?;
    ///     let alloc = DeviceAllocator::with_context(ctx.clone());
    ///     assert!(std::sync::Arc::ptr_eq(alloc.context(), &ctx));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_context(ctx: Arc<CudaContext>) -> Self {
        DeviceAllocator { ctx }
    }

    /// The context blocks are allocated on.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda::{self, DeviceAllocator};
    /// if cuda::available() {
    ///     assert_eq!(DeviceAllocator::new(0)?.context().ordinal(), 0);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl RawAllocator for DeviceAllocator {
    type Block = CUdeviceptr;
    type Error = CudaError;

    fn allocate(&mut self, size: usize) -> Result<CUdeviceptr, CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::from_driver(size, e))?;
        // SAFETY: the context is current on this thread; the memory is
        // handed out uninitialised, as a `RawAllocator` block is.
        unsafe { result::malloc_sync(size) }.map_err(|e| CudaError::from_driver(size, e))
    }

    unsafe fn deallocate(&mut self, block: CUdeviceptr, _size: usize) {
        // A failed free cannot be reported through this signature; the
        // driver reports a broken context on the next call that can fail.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `block` came from `cuMemAlloc` on this context and is freed
        // once (the caller's contract); `cuMemFree` waits for pending work.
        let _ = unsafe { result::free_sync(block) };
    }

    /// The device's total memory (`cuDeviceTotalMem`; `None` when the
    /// driver cannot tell).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{cuda, RawAllocator};
    /// if cuda::available() {
    ///     let alloc = cuda::DeviceAllocator::new(0)?;
    ///     assert_eq!(alloc.capacity(), alloc.context().total_mem().ok());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn capacity(&self) -> Option<usize> {
        self.ctx.total_mem().ok()
    }

    /// The device's free memory (`cuMemGetInfo`; `None` when the driver
    /// cannot tell).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{cuda, RawAllocator};
    /// if cuda::available() {
    ///     let alloc = cuda::DeviceAllocator::new(0)?;
    ///     assert!(alloc.available() <= alloc.capacity());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn available(&self) -> Option<usize> {
        self.ctx.mem_get_info().ok().map(|(free, _total)| free)
    }
}

/// Stream-ordered device memory from `cuMemAllocAsync` / `cuMemFreeAsync`
/// on one stream. Blocks are device pointers, usable on that stream only:
/// the pool that owns them serves that stream.
///
/// See the [module documentation](self) for when to prefer it to
/// [`DeviceAllocator`].
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::cuda::{self, StreamAllocator};
/// use decaying_pool::{DecayingPool, FixedTime};
///
/// if cuda::available() {
///     let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
///     let mut pool = DecayingPool::new(StreamAllocator::new(stream), FixedTime::new(Duration::from_secs(1)));
///     let ptr = pool.allocate(1 << 20)?;
///     unsafe { pool.release(ptr, 1 << 20) };
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct StreamAllocator {
    stream: Arc<CudaStream>,
}

impl StreamAllocator {
    /// An allocator ordered on `stream`.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda::{self, StreamAllocator};
    /// if cuda::available() {
    ///     let stream = cudarc::driver::CudaContext::new(0)?.default_stream();
    ///     let alloc = StreamAllocator::new(stream.clone());
    ///     assert!(std::sync::Arc::ptr_eq(alloc.stream(), &stream));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(stream: Arc<CudaStream>) -> Self {
        StreamAllocator { stream }
    }

    /// The stream blocks are ordered on.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda::{self, StreamAllocator};
    /// if cuda::available() {
    ///     let stream = cudarc::driver::CudaContext::new(0)?.default_stream();
    ///     assert_eq!(StreamAllocator::new(stream).stream().context().ordinal(), 0);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl RawAllocator for StreamAllocator {
    type Block = CUdeviceptr;
    type Error = CudaError;

    fn allocate(&mut self, size: usize) -> Result<CUdeviceptr, CudaError> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| CudaError::from_driver(size, e))?;
        // SAFETY: the stream is alive (we hold it) and its context current;
        // the block is used on this stream only (documented contract).
        unsafe { result::malloc_async(self.stream.cu_stream(), size) }
            .map_err(|e| CudaError::from_driver(size, e))
    }

    unsafe fn deallocate(&mut self, block: CUdeviceptr, _size: usize) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: `block` came from `cuMemAllocAsync` on this stream and is
        // freed once (the caller's contract); the free is ordered after the
        // work already queued on the stream.
        let _ = unsafe { result::free_async(block, self.stream.cu_stream()) };
    }

    /// The device's total memory (`cuDeviceTotalMem`; `None` when the
    /// driver cannot tell). No `available`: the driver's stream-ordered
    /// pool keeps memory it can reuse that `cuMemGetInfo` does not count
    /// as free, so that figure would be too low.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{cuda, RawAllocator};
    /// if cuda::available() {
    ///     let stream = cudarc::driver::CudaContext::new(0)?.default_stream();
    ///     let alloc = cuda::StreamAllocator::new(stream.clone());
    ///     assert_eq!(alloc.capacity(), stream.context().total_mem().ok());
    ///     assert_eq!(alloc.available(), None);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn capacity(&self) -> Option<usize> {
        self.stream.context().total_mem().ok()
    }
}

/// Page-locked ("pinned") host memory from `cuMemHostAlloc` /
/// `cuMemFreeHost`, portable across contexts. Blocks are host pointers.
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::cuda::{self, PinnedHostAllocator};
/// use decaying_pool::{DecayingPool, FixedTime};
///
/// if cuda::available() {
///     let mut pool = DecayingPool::new(PinnedHostAllocator::new(0)?, FixedTime::new(Duration::from_secs(5)));
///     let p = pool.allocate(1 << 20)?;
///     unsafe { p.as_ptr().write_bytes(0, 1 << 20) };
///     unsafe { pool.release(p, 1 << 20) };
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct PinnedHostAllocator {
    ctx: Arc<CudaContext>,
}

impl PinnedHostAllocator {
    /// An allocator using the primary context of device `ordinal`.
    ///
    /// # Errors
    ///
    /// [`CudaError::Unavailable`] without a driver or device.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda::{self, CudaError, PinnedHostAllocator};
    /// if !cuda::available() {
    ///     assert_eq!(PinnedHostAllocator::new(0).unwrap_err(), CudaError::Unavailable);
    /// }
    /// ```
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        Ok(PinnedHostAllocator {
            ctx: context(ordinal)?,
        })
    }
}

impl RawAllocator for PinnedHostAllocator {
    type Block = NonNull<u8>;
    type Error = CudaError;

    fn allocate(&mut self, size: usize) -> Result<NonNull<u8>, CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::from_driver(size, e))?;
        // SAFETY: the context is current; the memory is handed out
        // uninitialised.
        let p = unsafe { result::malloc_host(size, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| CudaError::from_driver(size, e))?;
        NonNull::new(p.cast::<u8>()).ok_or(CudaError::OutOfMemory { size })
    }

    unsafe fn deallocate(&mut self, block: NonNull<u8>, _size: usize) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `block` came from `cuMemHostAlloc` and is freed once (the
        // caller's contract).
        let _ = unsafe { result::free_host(block.as_ptr().cast()) };
    }

    /// The host's memory, as for
    /// [`SystemAllocator`](crate::SystemAllocator) (pinned memory is
    /// never more than that).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{cuda, RawAllocator, SystemAllocator};
    /// if cuda::available() {
    ///     let alloc = cuda::PinnedHostAllocator::new(0)?;
    ///     assert_eq!(alloc.capacity(), SystemAllocator::new().capacity());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn capacity(&self) -> Option<usize> {
        Some(super::host::capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::fraction_of;

    #[test]
    fn fraction_of_clamps_and_rounds_down() {
        assert_eq!(fraction_of(1000, 0.5), 500);
        assert_eq!(fraction_of(1000, 0.8), 800);
        assert_eq!(fraction_of(1001, 0.5), 500);
        assert_eq!(fraction_of(1000, 1.0), 1000);
        assert_eq!(fraction_of(1000, 7.0), 1000);
        assert_eq!(fraction_of(1000, -0.5), 0);
        assert_eq!(fraction_of(1000, f64::NAN), 0);
        assert_eq!(
            fraction_of(usize::MAX, 0.999_999_999),
            (usize::MAX as f64 * 0.999_999_999) as usize
        );
        assert_eq!(fraction_of(1 << 20, 1.0 - f64::EPSILON), (1 << 20) - 1);
    }
}
