//! The CUDA backend (feature `cuda`): pages are `cuMemCreate` handles of
//! pinned device memory, mapped with `cuMemMap` into `cuMemAddressReserve`
//! reservations and made accessible with `cuMemSetAccess`.
//!
//! cudarc 0.19 has these calls only as raw bindings (`cudarc::driver::sys`,
//! functions of the driver library loaded at run time): every call below is
//! an `unsafe` block that says what it relies on.

use core::fmt;
use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle, CUresult};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use fixedbitset::FixedBitSet;

use super::slots::Slots;
use super::{PageBackend, PageCounts, PageError, check_size, next_owner};

/// The driver's entry points the backend calls, checked at construction:
/// cudarc's loader panics on a symbol the driver lacks, so a driver without
/// one is refused up front ([`CudaPageError::MissingEntryPoint`]).
const ENTRY_POINTS: [&str; 8] = [
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// Physical device memory in pages, through CUDA's virtual memory
/// management: each page is one `cuMemCreate` handle of
/// [`granularity`](PageBackend::granularity) bytes of pinned memory on one
/// device.
///
/// - A page is a handle (`cuMemCreate` / `cuMemRelease`). Its memory is not
///   initialised.
/// - A reservation is `cuMemAddressReserve`, aligned to the granularity:
///   address space only, freed with `cuMemAddressFree`.
/// - [`map`](PageBackend::map) makes one `cuMemMap` call a page (each handle
///   at its slot's offset), then one `cuMemSetAccess` over the run
///   (read-write for the device); [`unmap`](PageBackend::unmap) makes one
///   `cuMemUnmap` call a page. The pages keep their bytes while unmapped, so
///   a page moves between ranges without a copy.
///
/// Every call binds the backend's context to the calling thread first
/// (`CudaContext::bind_to_thread`), as the crate's CUDA allocators do, so
/// the backend may be called from any thread.
///
/// **Queued work.** [`unmap`](PageBackend::unmap),
/// [`release_range`](PageBackend::release_range) and
/// [`release_page`](PageBackend::release_page) are `unsafe`: besides the
/// host's rules, no kernel or copy queued on any stream may still touch the
/// addresses. `cuMemUnmap` does not wait for the device: the backend's
/// [`fence`](PageBackend::fence) records an event on its stream (set with
/// [`on_stream`](Self::on_stream)) when a block is given back, and
/// [`wait`](PageBackend::wait) synchronises on that event, not on the
/// device, before [`Mapped`](super::Mapped) unmaps the block's pages.
/// Without a stream, a fence is a number and a wait synchronises the
/// context (`cuCtxSynchronize`): safe for work on any stream, and what
/// PyTorch's expandable segments do before they unmap. Work on another
/// stream than the backend's is the caller's to order before a release
/// (as PyTorch's `record_stream` asks).
///
/// The backend checks the caller's side of the contract where it can: a
/// page released while mapped is refused (and kept, never reused).
/// Dropping the backend releases the handles of the pages not released (a
/// handle still mapped keeps its memory until it is unmapped, by the
/// driver's own reference counting); ranges not released stay reserved and
/// mapped: release them first.
///
/// # Examples
///
/// Two pages written through one range and read back through another
/// (skipped without a device):
///
/// ```
/// use decaying_pool::cuda;
/// use decaying_pool::pages::{CudaPages, PageBackend};
///
/// if !cuda::available() {
///     return Ok(());
/// }
/// let mut b = CudaPages::new(0)?;
/// let g = b.granularity();
/// let (mut first, mut second) = (b.reserve(4 * g)?, b.reserve(4 * g)?);
/// let mut pages = Vec::new();
/// b.create_pages(2, &mut pages)?;
/// b.map(&mut first, g, &pages)?;
/// let data = vec![7u8; 2 * g];
/// // SAFETY: slots 1 and 2 of `first` are mapped, 2 * g bytes, read-write;
/// // the context is current (the backend bound it on this thread).
/// unsafe { cudarc::driver::result::memcpy_htod_sync(first.device_ptr() + g as u64, &data)? };
/// // A copy from pageable memory may return before its DMA ends: wait.
/// b.context().synchronize()?;
/// // SAFETY: the copy is done; nothing else uses `first`.
/// unsafe { b.unmap(&mut first, g, 2)? };
/// b.map(&mut second, 0, &pages)?;
/// let mut back = vec![0u8; 2 * g];
/// // SAFETY: slots 0 and 1 of `second` are mapped, 2 * g bytes.
/// unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut back, second.device_ptr())? };
/// assert_eq!(back, data);
/// // SAFETY: nothing uses either range (the copies were synchronous); the
/// // pages are unmapped with them.
/// unsafe {
///     b.release_range(first)?;
///     b.release_range(second)?;
///     for p in pages {
///         b.release_page(p)?;
///     }
/// }
/// let c = b.counts();
/// assert_eq!((c.created, c.released, c.maps, c.unmaps, c.set_access), (2, 2, 4, 4, 2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CudaPages {
    owner: u64,
    ctx: Arc<CudaContext>,
    /// The device ordinal, as `CUmemLocation::id` wants it.
    device: i32,
    granularity: usize,
    minimum: usize,
    counts: PageCounts,
    /// The handle of each page index (stale where the index is not live).
    handles: Vec<CUmemGenericAllocationHandle>,
    /// Bit `i`: page index `i` holds a live handle.
    live: FixedBitSet,
    /// Bit `i`: page index `i` is mapped.
    mapped: FixedBitSet,
    /// Indices released, to reuse.
    free: Vec<u32>,
    /// The stream fences record their events on (none: waits synchronise
    /// the context).
    stream: Option<Arc<CudaStream>>,
    /// The last fence ticket handed out.
    tickets: u64,
    /// Every ticket up to this one is done.
    done: u64,
    /// Events recorded and not seen done, oldest first, with their tickets.
    pending: VecDeque<(u64, CudaEvent)>,
    /// Events done, to record again.
    spare_events: Vec<CudaEvent>,
}

/// A page of a [`CudaPages`]: one `cuMemCreate` handle.
///
/// # Examples
///
/// ```
/// use decaying_pool::cuda;
/// use decaying_pool::pages::{CudaPages, PageBackend};
/// if cuda::available() {
///     let mut b = CudaPages::new(0)?;
///     let p = b.create_page()?;
///     assert_ne!(p.handle(), 0);
///     // SAFETY: `p` is not mapped.
///     unsafe { b.release_page(p)? };
/// }
/// # Ok::<(), decaying_pool::pages::CudaPageError>(())
/// ```
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaPage {
    index: u32,
    owner: u64,
    handle: CUmemGenericAllocationHandle,
}

impl CudaPage {
    /// The driver's handle (`CUmemGenericAllocationHandle`), owned by the
    /// backend: for reading attributes, never to release or map.
    pub fn handle(&self) -> CUmemGenericAllocationHandle {
        self.handle
    }
}

/// A reservation of a [`CudaPages`]: device address space, and which of its
/// slots show which page.
///
/// # Examples
///
/// ```
/// use decaying_pool::cuda;
/// use decaying_pool::pages::{CudaPages, PageBackend};
/// if cuda::available() {
///     let mut b = CudaPages::new(0)?;
///     let r = b.reserve(4 * b.granularity())?;
///     assert_eq!((r.len(), r.mapped_pages()), (4 * b.granularity(), 0));
///     assert_eq!(r.device_ptr() % b.granularity() as u64, 0);
///     // SAFETY: nothing uses the range.
///     unsafe { b.release_range(r)? };
/// }
/// # Ok::<(), decaying_pool::pages::CudaPageError>(())
/// ```
#[derive(Debug)]
pub struct CudaRange {
    owner: u64,
    /// The first slot's address (aligned to the granularity).
    base: CUdeviceptr,
    /// What `cuMemAddressReserve` returned, and its size: what
    /// `cuMemAddressFree` takes back.
    reserved: CUdeviceptr,
    reserved_len: usize,
    slots: Slots,
}

impl CudaRange {
    /// The first device address of the reservation.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.base
    }

    /// The length in bytes.
    #[allow(clippy::len_without_is_empty)] // a reservation is never empty
    pub fn len(&self) -> usize {
        self.slots.len_bytes()
    }

    /// How many of its slots are mapped.
    pub fn mapped_pages(&self) -> usize {
        self.slots.mapped_count()
    }

    /// The runs of consecutive mapped slots, as `(offset, pages)`.
    pub fn mapped_runs(&self) -> Vec<(usize, usize)> {
        self.slots.mapped_runs()
    }

    /// The device address of slot `slot`.
    fn slot_ptr(&self, slot: usize, granularity: usize) -> CUdeviceptr {
        // In bounds: `slot` is below the slot count, and the reservation's
        // length (at most `isize::MAX`) is the count times the granularity.
        self.base + (slot * granularity) as u64
    }
}

/// Why a [`CudaPages`] call failed.
///
/// Formatting asks nothing of the driver (the result code's name is
/// printed), so errors format on machines without CUDA.
///
/// # Examples
///
/// ```
/// use cudarc::driver::{sys::CUresult, DriverError};
/// use decaying_pool::pages::{CudaPageError, PageError};
///
/// let e = CudaPageError::Driver { call: "cuMemCreate", error: DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY) };
/// assert!(e.is_out_of_memory());
/// assert_eq!(e.to_string(), "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY");
/// assert_eq!(CudaPageError::from(PageError::ZeroSize).to_string(), "a size or count of zero");
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaPageError {
    /// The call was refused before reaching the driver.
    Invalid(PageError),
    /// The driver refused.
    Driver {
        /// The driver call (`cuMemCreate`, `cuMemMap`, ...).
        call: &'static str,
        /// What it said.
        error: DriverError,
    },
    /// No CUDA driver or device on this machine.
    Unavailable,
    /// The device does not support virtual memory management
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED`, CUDA's
    /// `..._VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, is 0).
    Unsupported {
        /// The device's ordinal.
        ordinal: usize,
    },
    /// The driver lacks an entry point the backend calls (a driver older
    /// than CUDA 10.2).
    MissingEntryPoint {
        /// The symbol.
        name: &'static str,
    },
}

impl CudaPageError {
    /// Whether the driver ran out of device memory
    /// (`CUDA_ERROR_OUT_OF_MEMORY`, from `cuMemCreate` in practice).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!decaying_pool::pages::CudaPageError::Unavailable.is_out_of_memory());
    /// ```
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, CudaPageError::Driver { error, .. } if error.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }
}

impl From<PageError> for CudaPageError {
    fn from(e: PageError) -> Self {
        CudaPageError::Invalid(e)
    }
}

impl fmt::Debug for CudaPageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `DriverError`'s own `Debug` asks the driver for a message; the
        // result code's name needs no driver.
        match self {
            CudaPageError::Invalid(e) => f.debug_tuple("Invalid").field(e).finish(),
            CudaPageError::Driver { call, error } => f
                .debug_struct("Driver")
                .field("call", call)
                .field("error", &error.0)
                .finish(),
            CudaPageError::Unavailable => f.write_str("Unavailable"),
            CudaPageError::Unsupported { ordinal } => f
                .debug_struct("Unsupported")
                .field("ordinal", ordinal)
                .finish(),
            CudaPageError::MissingEntryPoint { name } => f
                .debug_struct("MissingEntryPoint")
                .field("name", name)
                .finish(),
        }
    }
}

impl fmt::Display for CudaPageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaPageError::Invalid(e) => e.fmt(f),
            CudaPageError::Driver { call, error } => write!(f, "{call} failed: {:?}", error.0),
            CudaPageError::Unavailable => f.write_str("no CUDA driver or device"),
            CudaPageError::Unsupported { ordinal } => write!(
                f,
                "CUDA device {ordinal} does not support virtual memory management"
            ),
            CudaPageError::MissingEntryPoint { name } => {
                write!(f, "the CUDA driver has no {name} (older than CUDA 10.2)")
            }
        }
    }
}

impl std::error::Error for CudaPageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CudaPageError::Invalid(e) => Some(e),
            // `DriverError`'s `Display` asks the driver: not offered.
            _ => None,
        }
    }
}

/// A driver result as this backend's error, naming the call.
fn driver(call: &'static str, result: CUresult) -> Result<(), CudaPageError> {
    result
        .result()
        .map_err(|error| CudaPageError::Driver { call, error })
}

impl CudaPages {
    /// A backend of pages of the recommended granularity (2 MiB on current
    /// GPUs) on the primary context of device `ordinal`.
    ///
    /// # Errors
    ///
    /// [`CudaPageError::Unavailable`] without a driver or device;
    /// [`CudaPageError::MissingEntryPoint`] with a driver too old;
    /// [`CudaPageError::Unsupported`] for a device without virtual memory
    /// management; the driver's error for a bad ordinal.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda;
    /// use decaying_pool::pages::{CudaPageError, CudaPages, PageBackend};
    /// match CudaPages::new(0) {
    ///     Ok(b) => assert!(b.granularity() >= b.minimum_granularity()),
    ///     Err(e) => {
    ///         assert!(!cuda::available());
    ///         assert_eq!(e, CudaPageError::Unavailable);
    ///     }
    /// }
    /// ```
    pub fn new(ordinal: usize) -> Result<Self, CudaPageError> {
        if !crate::backend::cuda::available() {
            return Err(CudaPageError::Unavailable);
        }
        let ctx = CudaContext::new(ordinal).map_err(|error| CudaPageError::Driver {
            call: "CudaContext::new",
            error,
        })?;
        Self::build(ctx, None)
    }

    /// A backend of pages of the recommended granularity on an existing
    /// context.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), but for the driver's presence.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda;
    /// use decaying_pool::pages::CudaPages;
    /// if cuda::available() {
    ///     let ctx = cudarc::driver::CudaContext::new(0)?;
    ///     let b = CudaPages::with_context(ctx.clone())?;
    ///     assert!(std::sync::Arc::ptr_eq(b.context(), &ctx));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_context(ctx: Arc<CudaContext>) -> Result<Self, CudaPageError> {
        Self::build(ctx, None)
    }

    /// A backend of pages of `granularity` bytes on an existing context: a
    /// multiple of the device's [minimum
    /// granularity](Self::minimum_granularity) (PyTorch's expandable
    /// segments use 20 MiB pages for large pools).
    ///
    /// # Errors
    ///
    /// As [`with_context`](Self::with_context); a granularity of zero
    /// ([`PageError::ZeroSize`]), not a multiple of the minimum
    /// ([`PageError::NotAligned`]) or above `isize::MAX / 2`
    /// ([`PageError::TooLarge`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda;
    /// use decaying_pool::pages::{CudaPageError, CudaPages, PageBackend, PageError};
    /// if cuda::available() {
    ///     let ctx = cudarc::driver::CudaContext::new(0)?;
    ///     let min = CudaPages::with_context(ctx.clone())?.minimum_granularity();
    ///     assert_eq!(CudaPages::with_granularity(ctx.clone(), 10 * min)?.granularity(), 10 * min);
    ///     assert!(matches!(
    ///         CudaPages::with_granularity(ctx.clone(), min + 1),
    ///         Err(CudaPageError::Invalid(PageError::NotAligned { .. }))
    ///     ));
    ///     assert!(CudaPages::with_granularity(ctx, 0).is_err());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_granularity(
        ctx: Arc<CudaContext>,
        granularity: usize,
    ) -> Result<Self, CudaPageError> {
        Self::build(ctx, Some(granularity))
    }

    fn build(ctx: Arc<CudaContext>, granularity: Option<usize>) -> Result<Self, CudaPageError> {
        // SAFETY: a context exists, so the driver library is loaded already
        // (`culib` returns it); looking a symbol up runs nothing, and the
        // symbols are not called through this type.
        let lib = unsafe { sys::culib() };
        for name in ENTRY_POINTS {
            // SAFETY: as above: a lookup only; the function type is never
            // used to call.
            if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
                return Err(CudaPageError::MissingEntryPoint { name });
            }
        }
        let ordinal = ctx.ordinal();
        let bind = |ctx: &CudaContext| {
            ctx.bind_to_thread().map_err(|error| CudaPageError::Driver {
                call: "cuCtxSetCurrent",
                error,
            })
        };
        bind(&ctx)?;
        let vmm = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            )
            .map_err(|error| CudaPageError::Driver {
                call: "cuDeviceGetAttribute",
                error,
            })?;
        let device = i32::try_from(ordinal).map_err(|_| CudaPageError::Unsupported { ordinal })?;
        if vmm == 0 {
            return Err(CudaPageError::Unsupported { ordinal });
        }
        let mut b = CudaPages {
            owner: next_owner(),
            ctx,
            device,
            granularity: 0,
            minimum: 0,
            counts: PageCounts::default(),
            handles: Vec::new(),
            live: FixedBitSet::new(),
            mapped: FixedBitSet::new(),
            free: Vec::new(),
            stream: None,
            tickets: 0,
            done: 0,
            pending: VecDeque::new(),
            spare_events: Vec::new(),
        };
        let flags = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        b.minimum = b.query_granularity(flags)?;
        if b.minimum == 0 {
            return Err(CudaPageError::Unsupported { ordinal });
        }
        let g = match granularity {
            Some(g) => g,
            None => {
                let flags =
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
                let g = b.query_granularity(flags)?;
                // The recommended granularity is a multiple of the minimum;
                // fall back on the minimum if a driver says otherwise.
                if g == 0 || g % b.minimum != 0 {
                    b.minimum
                } else {
                    g
                }
            }
        };
        if g == 0 {
            return Err(PageError::ZeroSize.into());
        }
        if g % b.minimum != 0 {
            return Err(PageError::NotAligned {
                value: g,
                granularity: b.minimum,
            }
            .into());
        }
        if g > isize::MAX as usize / 2 {
            return Err(PageError::TooLarge { bytes: g }.into());
        }
        b.granularity = g;
        Ok(b)
    }

    /// The properties of every page: pinned memory on the device, no
    /// shareable handle.
    fn prop(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: self.location(),
            win32HandleMetaData: core::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.device,
        }
    }

    fn query_granularity(
        &self,
        option: sys::CUmemAllocationGranularity_flags,
    ) -> Result<usize, CudaPageError> {
        let prop = self.prop();
        let mut g = 0usize;
        // SAFETY: `g` is a valid, writable `usize` for the out-parameter;
        // `prop` is a fully initialised `CUmemAllocationProp` that lives
        // across the call (its null `win32HandleMetaData` is allowed: no
        // Win32 handle is requested); the context is current (bound by the
        // caller).
        let r = unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop, option) };
        driver("cuMemGetAllocationGranularity", r)?;
        Ok(g)
    }

    /// Binds the context to the calling thread.
    fn bind(&self) -> Result<(), CudaPageError> {
        self.ctx
            .bind_to_thread()
            .map_err(|error| CudaPageError::Driver {
                call: "cuCtxSetCurrent",
                error,
            })
    }

    /// The context the pages live on.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{cuda, pages::CudaPages};
    /// if cuda::available() {
    ///     assert_eq!(CudaPages::new(0)?.context().ordinal(), 0);
    /// }
    /// # Ok::<(), decaying_pool::pages::CudaPageError>(())
    /// ```
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's minimum granularity
    /// (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`): every granularity is a
    /// multiple of it.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{cuda, pages::{CudaPages, PageBackend}};
    /// if cuda::available() {
    ///     let b = CudaPages::new(0)?;
    ///     assert_eq!(b.granularity() % b.minimum_granularity(), 0);
    /// }
    /// # Ok::<(), decaying_pool::pages::CudaPageError>(())
    /// ```
    pub fn minimum_granularity(&self) -> usize {
        self.minimum
    }

    /// The calls made so far (counted as for
    /// [`ModelPages`](super::ModelPages), so the replay's model and the
    /// device agree).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{cuda, pages::{CudaPages, PageBackend}};
    /// if cuda::available() {
    ///     let mut b = CudaPages::new(0)?;
    ///     let p = b.create_page()?;
    ///     // SAFETY: `p` is not mapped.
    ///     unsafe { b.release_page(p)? };
    ///     assert_eq!((b.counts().created, b.counts().released), (1, 1));
    /// }
    /// # Ok::<(), decaying_pool::pages::CudaPageError>(())
    /// ```
    pub fn counts(&self) -> PageCounts {
        self.counts
    }

    /// Fences on `stream`: each [`fence`](PageBackend::fence) records an
    /// event there (events are reused once done), and a
    /// [`wait`](PageBackend::wait) synchronises on the event of its ticket
    /// (`u64::MAX`: on the stream). Give the stream the blocks' work runs
    /// on; work queued on other streams is the caller's to order before a
    /// block is given back.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{cuda, pages::{CudaPages, PageBackend}};
    /// if cuda::available() {
    ///     let ctx = cudarc::driver::CudaContext::new(0)?;
    ///     let mut b = CudaPages::with_context(ctx.clone())?.on_stream(ctx.new_stream()?);
    ///     let t = b.fence()?;
    ///     b.wait(t)?;
    ///     assert_eq!(b.counts().fences, 1);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn on_stream(mut self, stream: Arc<CudaStream>) -> Self {
        self.stream = Some(stream);
        self
    }

    /// The stream fences record on, if one was set.
    pub fn stream(&self) -> Option<&Arc<CudaStream>> {
        self.stream.as_ref()
    }

    /// Retires the pending events that are done, oldest first, so the
    /// queue holds only the events in flight.
    fn retire(&mut self) {
        while let Some((t, e)) = self.pending.front() {
            if !matches!(e.try_is_complete(), Ok(true)) {
                break;
            }
            self.done = self.done.max(*t);
            if let Some((_, e)) = self.pending.pop_front() {
                self.spare_events.push(e);
            }
        }
    }

    fn own_range(&self, range: &CudaRange) -> Result<(), PageError> {
        if range.owner == self.owner {
            Ok(())
        } else {
            Err(PageError::ForeignHandle)
        }
    }

    /// A page's index, checked to be this backend's and live.
    fn index(&self, page: &CudaPage) -> Result<usize, PageError> {
        let i = page.index as usize;
        if page.owner == self.owner
            && i < self.handles.len()
            && self.live.contains(i)
            && self.handles[i] == page.handle
        {
            Ok(i)
        } else {
            Err(PageError::ForeignHandle)
        }
    }

    /// Unmaps slot `slot` of `range`.
    ///
    /// # Safety
    ///
    /// The slot lies in `range`, a reservation of this backend, and is
    /// mapped (one page, mapped by one `cuMemMap` of one granularity);
    /// nothing uses its addresses any more, on the host or the device. The
    /// context is current.
    unsafe fn unmap_slot(&self, range: &CudaRange, slot: usize) -> Result<(), CudaPageError> {
        let g = self.granularity;
        // SAFETY: the address and size are exactly one earlier `cuMemMap`
        // of this backend (one page at this slot: the caller's contract), so
        // the unmap covers whole mappings; nothing uses them (the caller's
        // contract), so no access is lost.
        driver("cuMemUnmap", unsafe {
            sys::cuMemUnmap(range.slot_ptr(slot, g), g)
        })
    }

    /// Undoes the `cuMemMap` of `pages` at slots `first..` of `range`
    /// (a failed [`map`](PageBackend::map)). A page the driver will not
    /// unmap stays recorded as mapped there, and counted, so that it is
    /// never mapped twice nor released while mapped.
    fn undo_map(&mut self, range: &mut CudaRange, first: usize, pages: &[CudaPage]) {
        for (k, p) in pages.iter().enumerate() {
            // SAFETY: slot `first + k` lies in `range` (checked by `map`),
            // which this backend reserved, and `map` just mapped `p` there
            // with one `cuMemMap`; no one has used it: `map` has not
            // returned, and the caller may not use unmapped slots.
            if unsafe { self.unmap_slot(range, first + k) }.is_err() {
                self.mapped.insert(p.index as usize);
                range.slots.set(first + k, [p.index]);
                self.counts.maps += 1;
            }
        }
    }
}

impl Drop for CudaPages {
    /// Releases the handles of the pages not released. A handle still
    /// mapped keeps its memory until it is unmapped (the driver counts the
    /// mappings), so no mapping loses its memory.
    fn drop(&mut self) {
        if self.live.is_clear() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        for i in self.live.ones() {
            // SAFETY: a live handle of this backend, released once (the
            // backend goes away, so no `CudaPage` of it reaches a backend
            // that accepts it again); the driver frees the memory only when
            // its last mapping is unmapped, so nothing mapped is lost.
            let _ = unsafe { sys::cuMemRelease(self.handles[i]) };
        }
    }
}

impl PageBackend for CudaPages {
    type Range = CudaRange;
    type Page = CudaPage;
    type Error = CudaPageError;

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn reserve(&mut self, bytes: usize) -> Result<CudaRange, CudaPageError> {
        let count = check_size(bytes, self.granularity)?;
        let g = self.granularity;
        // A power of two is an alignment the driver takes; another
        // granularity (a multiple of the minimum, itself a power of two) is
        // reached by reserving `g - minimum` more at the minimum's alignment.
        let (align, extra) = if g.is_power_of_two() {
            (g, 0)
        } else {
            (self.minimum, g - self.minimum)
        };
        // `check_size` left room for `extra < g`.
        let len = bytes + extra;
        self.bind()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid, writable `CUdeviceptr` for the
        // out-parameter; reserving address space (no fixed address: hint 0,
        // flags 0) maps nothing and touches no memory; the context is
        // current.
        let r = unsafe { sys::cuMemAddressReserve(&mut ptr, len, align, 0, 0) };
        driver("cuMemAddressReserve", r)?;
        let base = ptr.next_multiple_of(g as u64);
        debug_assert!(base - ptr <= extra as u64);
        self.counts.reserves += 1;
        Ok(CudaRange {
            owner: self.owner,
            base,
            reserved: ptr,
            reserved_len: len,
            slots: Slots::new(count, g),
        })
    }

    fn range_address(&self, range: &CudaRange) -> usize {
        // CUDA's address space is 64-bit, as are the targets it runs on.
        range.base as usize
    }

    fn range_len(&self, range: &CudaRange) -> usize {
        range.len()
    }

    /// Unmaps the mapped slots one page a call, then frees the
    /// reservation. If the driver refuses an unmap, the other slots are
    /// still unmapped, the reservation is kept (lost: never freed, never
    /// reused) and its pages the driver would not unmap stay recorded as
    /// mapped (refused by [`release_page`](PageBackend::release_page)).
    unsafe fn release_range(&mut self, mut range: CudaRange) -> Result<(), CudaPageError> {
        self.own_range(&range)?;
        self.bind()?;
        let g = self.granularity;
        let mut unmapped = 0u64;
        let mut failed = None;
        for (offset, count) in range.slots.mapped_runs() {
            for s in offset / g..offset / g + count {
                // SAFETY: slot `s` lies in `range`, a reservation of this
                // backend (checked), and is mapped (its bookkeeping says so,
                // one page by one `cuMemMap`); nothing uses the range any
                // more (the caller's contract); the context is current.
                match unsafe { self.unmap_slot(&range, s) } {
                    Ok(()) => {
                        let mapped = &mut self.mapped;
                        range.slots.clear(s, 1, |p| mapped.remove(p as usize));
                        unmapped += 1;
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        if unmapped > 0 {
            self.counts.unmaps += unmapped;
            self.counts.unmap_calls += 1;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        // SAFETY: `reserved` and `reserved_len` are exactly what
        // `cuMemAddressReserve` returned and was given for this range, freed
        // once (the range is consumed); nothing is mapped in it any more
        // (every slot unmapped above, and the padding never mapped).
        let r = unsafe { sys::cuMemAddressFree(range.reserved, range.reserved_len) };
        driver("cuMemAddressFree", r)?;
        self.counts.range_frees += 1;
        Ok(())
    }

    /// `cuMemCreate` of one page of pinned device memory (not initialised).
    fn create_page(&mut self) -> Result<CudaPage, CudaPageError> {
        let index = match self.free.last() {
            Some(&i) => i as usize,
            None => self.handles.len(),
        };
        // `u32::MAX` marks an empty slot.
        if index >= u32::MAX as usize {
            return Err(PageError::TooManyPages.into());
        }
        self.bind()?;
        let prop = self.prop();
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid, writable handle for the
        // out-parameter; `prop` is a fully initialised property block that
        // lives across the call (pinned memory on this backend's device, no
        // shareable handle, so the null Win32 metadata is unused); the size
        // is the granularity, a multiple of the device's minimum (checked at
        // construction); flags must be 0; the context is current.
        let r = unsafe { sys::cuMemCreate(&mut handle, self.granularity, &prop, 0) };
        driver("cuMemCreate", r)?;
        if index == self.handles.len() {
            self.handles.push(handle);
            self.live.grow(index + 1);
            self.mapped.grow(index + 1);
        } else {
            self.free.pop();
            self.handles[index] = handle;
        }
        self.live.insert(index);
        self.counts.created += 1;
        Ok(CudaPage {
            // Below `u32::MAX` (checked).
            index: index as u32,
            owner: self.owner,
            handle,
        })
    }

    /// `cuMemRelease`. A page still mapped is refused and kept; a page the
    /// driver will not release is lost (its index never reused; dropping
    /// the backend tries again).
    unsafe fn release_page(&mut self, page: CudaPage) -> Result<(), CudaPageError> {
        let i = self.index(&page)?;
        if self.mapped.contains(i) {
            // The caller broke the contract: keep the handle, never reuse it.
            return Err(PageError::PageMapped.into());
        }
        self.bind()?;
        // SAFETY: `page.handle` is a live handle of this backend (checked),
        // released once: the page is consumed, and its index stops being
        // live below. It is mapped nowhere (checked), so no address loses
        // its memory; the context is current.
        driver("cuMemRelease", unsafe { sys::cuMemRelease(page.handle) })?;
        self.live.remove(i);
        self.free.push(page.index);
        self.counts.released += 1;
        Ok(())
    }

    /// One `cuMemMap` a page, then one `cuMemSetAccess` (read-write, this
    /// device) over the run. On a refusal what this call mapped is
    /// unmapped again, so nothing is mapped; should the driver refuse that
    /// too, the pages it would not unmap stay recorded (and counted) as
    /// mapped at their slots, where [`unmap`](PageBackend::unmap) takes
    /// them, so no page is ever mapped twice.
    fn map(
        &mut self,
        range: &mut CudaRange,
        offset: usize,
        pages: &[CudaPage],
    ) -> Result<(), CudaPageError> {
        self.own_range(range)?;
        let first = range.slots.run(offset, pages.len())?;
        range.slots.check_unmapped(first, pages.len())?;
        let mut seen = FixedBitSet::with_capacity(self.handles.len());
        for p in pages {
            let i = self.index(p)?;
            if self.mapped.contains(i) || seen.put(i) {
                return Err(PageError::PageMapped.into());
            }
        }
        self.bind()?;
        let g = self.granularity;
        for (k, p) in pages.iter().enumerate() {
            // SAFETY: slot `first + k` lies in `range` (checked: the run is
            // in bounds), a reservation of this backend (checked), and is
            // unmapped (checked), so the mapping replaces nothing; the size
            // is one granularity, the whole of `p`'s allocation, at offset
            // 0; `p` is a live handle of this backend (checked) mapped
            // nowhere else (checked, and named once in the run); flags must
            // be 0; the context is current.
            let r = unsafe { sys::cuMemMap(range.slot_ptr(first + k, g), g, 0, p.handle, 0) };
            if let Err(e) = driver("cuMemMap", r) {
                self.undo_map(range, first, &pages[..k]);
                return Err(e);
            }
        }
        let desc = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the address range is the run just mapped, whole pages of
        // this backend inside `range`; `desc` is one initialised descriptor
        // (count 1) that lives across the call; granting access makes
        // memory accessible that nothing else can see (no page shows
        // elsewhere), so no aliasing arises; the context is current.
        let r = unsafe { sys::cuMemSetAccess(range.slot_ptr(first, g), pages.len() * g, &desc, 1) };
        if let Err(e) = driver("cuMemSetAccess", r) {
            self.undo_map(range, first, pages);
            return Err(e);
        }
        for p in pages {
            self.mapped.insert(p.index as usize);
        }
        range.slots.set(first, pages.iter().map(|p| p.index));
        self.counts.maps += pages.len() as u64;
        self.counts.set_access += 1;
        Ok(())
    }

    /// One `cuMemUnmap` a page. If the driver refuses one, the slots before
    /// it are unmapped (and counted), it and the rest stay mapped.
    unsafe fn unmap(
        &mut self,
        range: &mut CudaRange,
        offset: usize,
        count: usize,
    ) -> Result<(), CudaPageError> {
        self.own_range(range)?;
        let first = range.slots.run(offset, count)?;
        range.slots.check_mapped(first, count)?;
        self.bind()?;
        let mut done = 0u64;
        let mut failed = None;
        for s in first..first + count {
            // SAFETY: slot `s` lies in `range`, a reservation of this
            // backend (checked), and is mapped (checked); nothing uses it
            // any more, on the host or the device (the caller's contract);
            // the context is current.
            if let Err(e) = unsafe { self.unmap_slot(range, s) } {
                failed = Some(e);
                break;
            }
            let mapped = &mut self.mapped;
            range.slots.clear(s, 1, |p| mapped.remove(p as usize));
            done += 1;
        }
        if done > 0 {
            self.counts.unmaps += done;
            self.counts.unmap_calls += 1;
        }
        failed.map_or(Ok(()), Err)
    }

    fn fence(&mut self) -> Result<u64, CudaPageError> {
        self.counts.fences += 1;
        let Some(stream) = self.stream.clone() else {
            // No stream: a number, and `wait` synchronises the context.
            self.tickets += 1;
            return Ok(self.tickets);
        };
        self.retire();
        let event = match self.spare_events.pop() {
            Some(e) => e,
            None => self
                .ctx
                .new_event(None)
                .map_err(|error| CudaPageError::Driver {
                    call: "cuEventCreate",
                    error,
                })?,
        };
        if let Err(error) = event.record(&stream) {
            self.spare_events.push(event);
            return Err(CudaPageError::Driver {
                call: "cuEventRecord",
                error,
            });
        }
        self.tickets += 1;
        self.pending.push_back((self.tickets, event));
        Ok(self.tickets)
    }

    fn wait(&mut self, ticket: u64) -> Result<(), CudaPageError> {
        if ticket <= self.done {
            return Ok(());
        }
        self.counts.waits += 1;
        let Some(stream) = self.stream.clone() else {
            let tickets = self.tickets;
            self.ctx
                .synchronize()
                .map_err(|error| CudaPageError::Driver {
                    call: "cuCtxSynchronize",
                    error,
                })?;
            self.done = if ticket == u64::MAX {
                tickets
            } else {
                ticket.min(tickets)
            };
            return Ok(());
        };
        if ticket == u64::MAX {
            stream
                .synchronize()
                .map_err(|error| CudaPageError::Driver {
                    call: "cuStreamSynchronize",
                    error,
                })?;
            self.done = self.tickets;
            self.spare_events
                .extend(self.pending.drain(..).map(|(_, e)| e));
            return Ok(());
        }
        // The newest pending event at or before `ticket`: the events before
        // it on the same stream are done when it is.
        let Some(k) = self.pending.iter().rposition(|&(t, _)| t <= ticket) else {
            // Every event at or before `ticket` was retired: done.
            self.done = self.done.max(ticket.min(self.tickets));
            return Ok(());
        };
        self.pending[k]
            .1
            .synchronize()
            .map_err(|error| CudaPageError::Driver {
                call: "cuEventSynchronize",
                error,
            })?;
        self.done = self.done.max(self.pending[k].0);
        for _ in 0..=k {
            if let Some((_, e)) = self.pending.pop_front() {
                self.spare_events.push(e);
            }
        }
        Ok(())
    }
}
