//! The backing allocator of every pool: host memory or CUDA device memory,
//! behind a device-wide byte limit shared by the device's stream pools.

use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dp::backend::AllocError;
use dp::cuda::{CudaError, DeviceAllocator, PinnedHostAllocator};
use dp::{Packable, RawAllocator, SystemAllocator};

use crate::config::BackendKind;

/// The alignment of host blocks (segments and exact blocks): at least
/// CUDA's 256 bytes, and the packing's default granularity.
const HOST_ALIGN: usize = 512;

/// No limit.
const NO_LIMIT: usize = usize::MAX;

/// The device number of the pinned host pool (`dp_pinned_malloc`; its
/// figures are `dp_stats_json(-1, ...)`).
pub(crate) const PINNED: i32 = -1;

/// One device: its allocator and the byte budget its stream pools share.
pub(crate) struct Device {
    /// The device number the callers use.
    pub(crate) index: i32,
    /// Where its memory comes from.
    pub(crate) kind: BackendKind,
    /// The CUDA allocator (a context handle), on the CUDA backend.
    pub(crate) cuda: Option<DeviceAllocator>,
    /// The pinned host allocator, for the pinned host pool on the CUDA
    /// backend (page-locked memory of device 0's primary context).
    pinned: Option<PinnedHostAllocator>,
    /// Bytes taken from the backing allocator by all the device's pools.
    reserved: AtomicUsize,
    /// The most bytes they may take together ([`NO_LIMIT`]: none).
    limit: AtomicUsize,
    /// The backing allocator's capacity (CUDA: total memory; host: the
    /// machine's memory as Linux bounds it).
    capacity: Option<usize>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("index", &self.index)
            .field("kind", &self.kind)
            .field("reserved", &self.reserved())
            .field("limit", &self.limit())
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Opens device `index` of `kind`, with a byte limit.
    ///
    /// # Errors
    ///
    /// A message when CUDA is not there or the device cannot be opened.
    pub(crate) fn open(
        index: i32,
        kind: BackendKind,
        limit: Option<usize>,
    ) -> Result<Self, String> {
        let ordinal =
            usize::try_from(index).map_err(|_| format!("device {index} is not a device number"))?;
        let (cuda, capacity) = match kind {
            BackendKind::Host => (None, SystemAllocator::new().capacity()),
            BackendKind::Cuda => {
                if !dp::cuda::available() {
                    return Err(format!(
                        "device {index}: CUDA is not available here (no driver or no device); \
                         configure backend=host to use system memory"
                    ));
                }
                let alloc =
                    DeviceAllocator::new(ordinal).map_err(|e| format!("device {index}: {e}"))?;
                let capacity = alloc.capacity();
                (Some(alloc), capacity)
            }
        };
        Ok(Device {
            index,
            kind,
            cuda,
            pinned: None,
            reserved: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit.unwrap_or(NO_LIMIT)),
            capacity,
        })
    }

    /// Opens the pinned host "device" ([`PINNED`]): page-locked host memory
    /// (`cuMemHostAlloc`) on the CUDA backend, system memory on the host
    /// backend. No limit: `limit=` and memory fractions are the devices'.
    ///
    /// # Errors
    ///
    /// A message when CUDA is not there or pinned memory cannot be had.
    pub(crate) fn open_pinned(kind: BackendKind) -> Result<Self, String> {
        let capacity = SystemAllocator::new().capacity();
        let pinned = match kind {
            BackendKind::Host => None,
            BackendKind::Cuda => {
                if !dp::cuda::available() {
                    return Err("pinned host memory: CUDA is not available here (no driver \
                         or no device); configure backend=host to use system memory"
                        .into());
                }
                Some(PinnedHostAllocator::new(0).map_err(|e| format!("pinned host memory: {e}"))?)
            }
        };
        Ok(Device {
            index: PINNED,
            kind,
            cuda: None,
            pinned,
            reserved: AtomicUsize::new(0),
            limit: AtomicUsize::new(NO_LIMIT),
            capacity,
        })
    }

    /// The backing allocator's capacity, if known.
    pub(crate) fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// The device's byte limit, if any.
    pub(crate) fn limit(&self) -> Option<usize> {
        match self.limit.load(Ordering::Relaxed) {
            NO_LIMIT => None,
            l => Some(l),
        }
    }

    /// Sets the device's byte limit.
    pub(crate) fn set_limit(&self, limit: Option<usize>) {
        let bytes = limit.map_or(NO_LIMIT, |l| l.min(NO_LIMIT - 1));
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes the device's pools hold from the backing allocator.
    pub(crate) fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Counts `size` more bytes reserved, if the limit allows them.
    fn reserve(&self, size: usize) -> Result<(), BackendError> {
        let limit = self.limit.load(Ordering::Relaxed);
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(size).filter(|&n| n <= limit)
            })
            .map(drop)
            .map_err(|reserved| BackendError::Limit {
                size,
                reserved,
                limit,
            })
    }

    /// Counts `size` bytes given back.
    fn unreserve(&self, size: usize) {
        self.reserved.fetch_sub(size, Ordering::AcqRel);
    }
}

/// Why a backing allocation failed.
#[derive(Debug)]
pub(crate) enum BackendError {
    /// The device's limit (`limit=` or `dp_set_memory_fraction`).
    Limit {
        /// Bytes asked for.
        size: usize,
        /// Bytes the device's pools held then.
        reserved: usize,
        /// The limit.
        limit: usize,
    },
    /// The host allocator failed.
    Host(AllocError),
    /// The CUDA driver failed.
    Cuda(CudaError),
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Limit {
                size,
                reserved,
                limit,
            } => write!(
                f,
                "{size} more bytes would exceed the device's limit of {limit} bytes \
                 ({reserved} reserved by its pools)"
            ),
            BackendError::Host(e) => write!(f, "host memory: {e}"),
            BackendError::Cuda(e) => write!(f, "CUDA: {e}"),
        }
    }
}

/// The allocator under every pool: blocks are addresses (`usize`: a host
/// pointer's address, or a CUDA device pointer), so one pool type serves
/// both backends.
pub(crate) struct Backend {
    device: Arc<Device>,
    host: SystemAllocator,
    cuda: Option<DeviceAllocator>,
    pinned: Option<PinnedHostAllocator>,
}

impl Backend {
    /// An allocator for one pool of `device`.
    pub(crate) fn new(device: Arc<Device>) -> Self {
        let cuda = device.cuda.clone();
        let pinned = device.pinned.clone();
        Backend {
            device,
            host: SystemAllocator::with_align(HOST_ALIGN).unwrap_or_default(),
            cuda,
            pinned,
        }
    }
}

impl RawAllocator for Backend {
    type Block = usize;
    type Error = BackendError;

    fn allocate(&mut self, size: usize) -> Result<usize, BackendError> {
        self.device.reserve(size)?;
        let block = match (&mut self.cuda, &mut self.pinned) {
            (Some(cuda), _) => cuda
                .allocate(size)
                .map(|p| p as usize)
                .map_err(BackendError::Cuda),
            (None, Some(pinned)) => pinned
                .allocate(size)
                .map(|p| p.as_ptr().expose_provenance())
                .map_err(BackendError::Cuda),
            (None, None) => self
                .host
                .allocate(size)
                .map(|p| p.as_ptr().expose_provenance())
                .map_err(BackendError::Host),
        };
        if block.is_err() {
            self.device.unreserve(size);
        }
        block
    }

    unsafe fn deallocate(&mut self, block: usize, size: usize) {
        match (&mut self.cuda, &mut self.pinned) {
            // SAFETY: `block` came from `cuda.allocate(size)` (the caller's
            // contract on `self.allocate`), given back once.
            (Some(cuda), _) => unsafe { cuda.deallocate(block as u64, size) },
            (None, Some(pinned)) => {
                let ptr = NonNull::new(core::ptr::with_exposed_provenance_mut::<u8>(block))
                    .expect("a pinned block is never null");
                // SAFETY: `block` is the exposed address of a pointer from
                // `pinned.allocate(size)` (the caller's contract), so `ptr`
                // has its provenance; given back once.
                unsafe { pinned.deallocate(ptr, size) }
            }
            (None, None) => {
                let ptr = NonNull::new(core::ptr::with_exposed_provenance_mut::<u8>(block))
                    .expect("a host block is never null");
                // SAFETY: `block` is the exposed address of a pointer from
                // `self.host.allocate(size)` (the caller's contract), so
                // `ptr` has its provenance; given back once.
                unsafe { self.host.deallocate(ptr, size) }
            }
        }
        self.device.unreserve(size);
    }

    fn block_key(&self, block: &usize) -> Option<usize> {
        Some(*block)
    }

    /// The backing capacity, or the device's limit when lower: a request
    /// above it fails at once, the cache kept.
    fn capacity(&self) -> Option<usize> {
        match (self.device.capacity(), self.device.limit()) {
            (Some(c), Some(l)) => Some(c.min(l)),
            (c, l) => c.or(l),
        }
    }

    /// What the limit leaves (the device's pools together), or the device's
    /// free memory (CUDA) when lower; `None` on the host without a limit.
    fn available(&self) -> Option<usize> {
        let backing = self.cuda.as_ref().and_then(RawAllocator::available);
        let left = self
            .device
            .limit()
            .map(|l| l.saturating_sub(self.device.reserved()));
        match (backing, left) {
            (Some(b), Some(l)) => Some(b.min(l)),
            (b, l) => b.or(l),
        }
    }
}

impl Packable for Backend {
    fn carve(segment: &usize, offset: usize) -> usize {
        segment
            .checked_add(offset)
            .expect("carving a block past the end of the address space")
    }

    fn address(block: &usize) -> usize {
        *block
    }
}
