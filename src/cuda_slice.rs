//! [`SlicePool`]: typed `cudarc` slices from a [`SharedPool`] of device
//! memory (feature `cuda`). It sits above the pool and the CUDA backend;
//! the backend knows nothing of it.

use core::marker::PhantomData;
use core::mem::ManuallyDrop;
use core::ops::Deref;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};

use crate::backend::cuda::{CudaError, DeviceAllocator};
use crate::clock::Clock;
use crate::error::PoolError;
use crate::policy::Policy;
use crate::shared::{Pooled, SharedPool};

/// Typed `cudarc` slices from a pool of device memory, all on one stream.
///
/// [`alloc`](Self::alloc) returns a [`PooledSlice`] that derefs to a
/// `&`[`CudaSlice<T>`] and is itself a `cudarc` device slice (`DevicePtr`,
/// `DevicePtrMut`; [`as_view_mut`](PooledSlice::as_view_mut) for kernel
/// outputs), so kernels, `memcpy_htod`/`clone_dtoh` and cuBLAS calls use
/// pooled memory; dropping it gives the block back to the pool. Because every slice lives on the same stream, a block reused
/// by the next slice is only touched by work queued after the previous
/// slice's work. The slices hold a [`SharedPool`] handle, so they never
/// outlive the pool.
///
/// The pool may be packed ([`SharedPool::packed`] over a
/// [`PackedPool`](crate::PackedPool)): slices up to the medium threshold
/// are then carved from device segments (at the packing granularity, 512
/// bytes by default, so every slice is aligned for any element type) and
/// larger ones are exact blocks:
///
/// ```
/// use decaying_pool::cuda::{self, DeviceAllocator, SlicePool};
/// use decaying_pool::{DecayingPool, Packing, SharedPool};
///
/// if cuda::available() {
///     let alloc = DeviceAllocator::new(0)?;
///     let stream = alloc.context().default_stream();
///     let pool = SharedPool::packed(DecayingPool::builder(alloc).packing(Packing::default()).build());
///     let slices = SlicePool::new(pool.clone(), stream);
///     let (a, b) = (slices.alloc::<f32>(1000)?, slices.alloc::<u8>(100)?);
///     assert_eq!(pool.stats().backing_allocs, 1); // one segment holds both
///     assert_eq!(pool.packing_stats().unwrap().carved, 2);
///     drop((a, b));
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Examples
///
/// ```
/// use core::time::Duration;
/// use decaying_pool::cuda::{self, DeviceAllocator, SlicePool};
/// use decaying_pool::{DecayingPool, FixedTime, SharedPool};
///
/// if cuda::available() {
///     let alloc = DeviceAllocator::new(0)?;
///     let stream = alloc.context().default_stream();
///     let pool = SharedPool::new(DecayingPool::new(alloc, FixedTime::new(Duration::from_secs(1))));
///     let slices = SlicePool::new(pool.clone(), stream.clone());
///     let mut x = slices.alloc::<f32>(1024)?;
///     stream.memcpy_htod(&[1.0f32; 1024], &mut x)?;
///     assert_eq!(stream.clone_dtoh(&*x)?, vec![1.0f32; 1024]);
///     drop(x);                                   // back to the pool
///     let _y = slices.alloc::<f32>(1024)?;       // a hit: no cuMemAlloc
///     assert_eq!(pool.stats().hits, 1);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SlicePool<P: Policy, C: Clock> {
    pool: SharedPool<DeviceAllocator, P, C>,
    stream: Arc<CudaStream>,
}

impl<P: Policy, C: Clock> SlicePool<P, C> {
    /// Typed slices from `pool`, all on `stream` (which must belong to the
    /// pool's context).
    ///
    /// # Examples
    ///
    /// See [`SlicePool`].
    pub fn new(pool: SharedPool<DeviceAllocator, P, C>, stream: Arc<CudaStream>) -> Self {
        SlicePool { pool, stream }
    }

    /// A slice of `len` elements of `T` from the pool. Its contents are
    /// whatever the block last held: write before reading.
    ///
    /// # Errors
    ///
    /// As [`SharedPool::allocate`]; [`PoolError::ZeroSize`] for `len == 0`
    /// or a zero-sized `T`, [`PoolError::TooLarge`] when `len *
    /// size_of::<T>()` overflows.
    ///
    /// # Examples
    ///
    /// See [`SlicePool`].
    pub fn alloc<T>(&self, len: usize) -> Result<PooledSlice<T, P, C>, PoolError<CudaError>> {
        let bytes = len
            .checked_mul(core::mem::size_of::<T>())
            .ok_or(PoolError::TooLarge { requested: len })?;
        let (ptr, size) = self.pool.allocate(bytes)?.into_raw();
        // SAFETY: `ptr` is a live device allocation of at least `size =
        // len * size_of::<T>()` bytes on the stream's context, owned by this
        // slice until it is leaked back in `PooledSlice::drop`.
        let slice = unsafe { self.stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(PooledSlice {
            slice: ManuallyDrop::new(slice),
            size,
            pool: self.pool.clone(),
            marker: PhantomData,
        })
    }

    /// The pool.
    ///
    /// # Examples
    ///
    /// See [`SlicePool`].
    pub fn pool(&self) -> &SharedPool<DeviceAllocator, P, C> {
        &self.pool
    }

    /// The stream every slice lives on.
    ///
    /// # Examples
    ///
    /// See [`SlicePool`].
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// A [`CudaSlice<T>`] backed by a pooled block; dropping it gives the block
/// back to the pool (the slice is leaked, not freed). From
/// [`SlicePool::alloc`].
///
/// It derefs to `&CudaSlice<T>` only: writes go through its own
/// `DevicePtrMut` or [`as_view_mut`](Self::as_view_mut). A `&mut
/// CudaSlice<T>` would let safe code swap another slice in, whose pointer
/// would then go back to the pool:
///
/// ```compile_fail,E0596
/// use decaying_pool::cuda::{DeviceAllocator, SlicePool};
/// use decaying_pool::{DecayingPool, FixedTime, SharedPool};
///
/// fn swap_in(slices: &SlicePool<FixedTime, decaying_pool::MonotonicClock>, other: cudarc::driver::CudaSlice<f32>) {
///     let mut x = slices.alloc::<f32>(16).unwrap();
///     drop(core::mem::replace(&mut *x, other));
/// }
/// ```
pub struct PooledSlice<T, P: Policy, C: Clock> {
    slice: ManuallyDrop<CudaSlice<T>>,
    size: usize,
    pool: SharedPool<DeviceAllocator, P, C>,
    marker: PhantomData<T>,
}

impl<T, P: Policy, C: Clock> Deref for PooledSlice<T, P, C> {
    type Target = CudaSlice<T>;

    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T, P: Policy, C: Clock> PooledSlice<T, P, C> {
    /// A mutable view of the whole slice, for kernel arguments and copies
    /// that write to it.
    ///
    /// The slice itself is never handed out as `&mut CudaSlice<T>`: safe
    /// code could then swap another slice in (`mem::replace`), whose
    /// pointer would go back to the pool when this one drops.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::cuda::{self, DeviceAllocator, SlicePool};
    /// use decaying_pool::{DecayingPool, FixedTime, SharedPool};
    ///
    /// if cuda::available() {
    ///     let alloc = DeviceAllocator::new(0)?;
    ///     let stream = alloc.context().default_stream();
    ///     let slices = SlicePool::new(SharedPool::new(DecayingPool::new(alloc, FixedTime::default())), stream.clone());
    ///     let mut x = slices.alloc::<u8>(64)?;
    ///     stream.memset_zeros(&mut x.as_view_mut())?;
    ///     assert_eq!(stream.clone_dtoh(&*x)?, vec![0u8; 64]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }
}

impl<T, P: Policy, C: Clock> DeviceSlice<T> for PooledSlice<T, P, C> {
    fn len(&self) -> usize {
        self.slice.len()
    }

    fn stream(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(&*self.slice)
    }
}

impl<T, P: Policy, C: Clock> DevicePtr<T> for PooledSlice<T, P, C> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.slice.device_ptr(stream)
    }
}

/// Writes go through the slice's own synchronisation, as for a
/// `CudaSlice`: `stream.memcpy_htod(&data, &mut pooled)`.
impl<T, P: Policy, C: Clock> DevicePtrMut<T> for PooledSlice<T, P, C> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.slice.device_ptr_mut(stream)
    }
}

impl<T, P: Policy, C: Clock> Drop for PooledSlice<T, P, C> {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once; the slice is not used afterwards.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // `leak` hands the pointer back without freeing it (after making the
        // stream wait for the slice's recorded reads and writes).
        let ptr = slice.leak();
        // SAFETY: `ptr` and `size` are what `into_raw` returned for a block
        // of this pool in `SlicePool::alloc`, given back once.
        drop(unsafe { Pooled::from_raw(&self.pool, ptr, self.size) });
    }
}
