//! CUDA events for `dp_record_stream`: a block freed while other streams
//! may still use it is held back until events recorded on those streams at
//! its free have completed.

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUevent, CUevent_flags, CUresult, CUstream};
use dp::cuda::DeviceAllocator;

/// An event recorded on one stream, destroyed on drop.
pub(crate) struct StreamEvent {
    event: CUevent,
    /// The allocator of the event's device (its context), made current
    /// before each call on the event.
    device: DeviceAllocator,
}

// SAFETY: a `CUevent` is a driver handle, not tied to the thread that made
// it: the driver accepts it from any thread whose current context is the
// event's, and every call here binds `device`'s context first. The handle
// is owned by this value alone (destroyed once, on drop).
unsafe impl Send for StreamEvent {}

impl StreamEvent {
    /// Creates an event (timing off) and records it on `stream` of
    /// `device`'s context.
    ///
    /// # Errors
    ///
    /// The driver's error (binding the context, creating or recording).
    ///
    /// # Safety
    ///
    /// `stream` is null (the legacy default stream) or a live stream
    /// (`CUstream` / `cudaStream_t`) of `device`'s context, not destroyed
    /// before this call returns.
    pub(crate) unsafe fn record(
        device: &DeviceAllocator,
        stream: usize,
    ) -> Result<Self, DriverError> {
        device.context().bind_to_thread()?;
        let event = result::event::create(CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
        let this = StreamEvent {
            event,
            device: device.clone(),
        };
        let stream = stream as CUstream;
        // SAFETY: `event` was just created on the current context (the
        // device's) and is live until `this` is dropped; `stream` is null
        // or a live stream of that context (the caller's contract).
        unsafe { result::event::record(this.event, stream) }?;
        Ok(this)
    }

    /// Whether the work queued on the stream before the event has
    /// completed. A driver error other than "not ready" counts as done:
    /// the event can then never complete, and holding the block forever
    /// would leak it.
    pub(crate) fn is_complete(&self) -> bool {
        let _ = self.device.context().bind_to_thread();
        // SAFETY: `self.event` was created by `cuEventCreate` and is not
        // destroyed before `self` is dropped.
        match unsafe { result::event::query(self.event) } {
            Ok(()) => true,
            Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) => false,
            Err(_) => true,
        }
    }

    /// Waits until the event has completed (or the driver fails).
    pub(crate) fn wait(&self) {
        let _ = self.device.context().bind_to_thread();
        // SAFETY: as in `is_complete`: a live event of this context.
        let _ = unsafe { result::event::synchronize(self.event) };
    }
}

impl Drop for StreamEvent {
    fn drop(&mut self) {
        let _ = self.device.context().bind_to_thread();
        // SAFETY: `self.event` came from `cuEventCreate`, is destroyed only
        // here, once, and is not used after; destroying an event that has
        // not completed is allowed (the driver releases it at completion).
        let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
    }
}
