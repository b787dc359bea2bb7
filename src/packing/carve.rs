//! Block types that can be carved: "segment block + offset".

use core::num::NonZeroUsize;
use core::ptr::NonNull;

use crate::clock::Clock;
use crate::policy::Policy;
use crate::pool::DecayingPool;
use crate::raw::RawAllocator;

/// An allocator whose blocks can be carved: a block `offset` bytes into a
/// block it handed out is itself a valid block (device pointers, host
/// pointers, addresses).
///
/// A [`PackedPool`](crate::PackedPool) takes large blocks ("segments") from
/// the allocator and hands out pieces of them; it never gives a carved
/// block to the allocator's `deallocate`, only whole segments.
///
/// # Examples
///
/// ```
/// use core::ptr::NonNull;
/// use decaying_pool::{Packable, SystemAllocator};
///
/// let seg = NonNull::<u8>::dangling();
/// let piece = SystemAllocator::carve(&seg, 512);
/// assert_eq!(SystemAllocator::address(&piece), SystemAllocator::address(&seg) + 512);
/// ```
pub trait Packable: RawAllocator {
    /// The block `offset` bytes into `segment`.
    ///
    /// Callers keep `offset` plus the carved block's size inside the
    /// segment; the block is only an address until someone dereferences it.
    ///
    /// # Panics
    ///
    /// May panic when `segment`'s address plus `offset` overflows.
    fn carve(segment: &Self::Block, offset: usize) -> Self::Block;

    /// A number that identifies a block handed out (its address): distinct
    /// for blocks that do not overlap, and for a carved block equal to its
    /// segment's address plus the offset.
    fn address(block: &Self::Block) -> usize;
}

/// `segment + offset` for a non-null pointer, without dereferencing it.
#[inline]
pub(crate) fn carve_ptr(segment: &NonNull<u8>, offset: usize) -> NonNull<u8> {
    segment.map_addr(|a: NonZeroUsize| {
        a.checked_add(offset)
            .expect("carving a block past the end of the address space")
    })
}

macro_rules! packable_ptr {
    ($($t:ty),* $(,)?) => { $(
        impl Packable for $t {
            #[inline]
            fn carve(segment: &NonNull<u8>, offset: usize) -> NonNull<u8> {
                carve_ptr(segment, offset)
            }

            #[inline]
            fn address(block: &NonNull<u8>) -> usize {
                block.addr().get()
            }
        }
    )* };
}

packable_ptr!(crate::SystemAllocator);
#[cfg(unix)]
packable_ptr!(crate::MmapAllocator);
#[cfg(feature = "cuda")]
packable_ptr!(crate::backend::cuda::PinnedHostAllocator);

/// CUDA device pointers: a carved block is the segment's device address
/// plus the offset (the backends stay below the packing layer, so the
/// impls live here).
#[cfg(feature = "cuda")]
macro_rules! packable_device {
    ($($t:ty),* $(,)?) => { $(
        impl Packable for $t {
            #[inline]
            fn carve(segment: &u64, offset: usize) -> u64 {
                carve_u64(segment, offset)
            }

            #[inline]
            fn address(block: &u64) -> usize {
                address_u64(block)
            }
        }
    )* };
}

#[cfg(feature = "cuda")]
packable_device!(
    crate::backend::cuda::DeviceAllocator,
    crate::backend::cuda::StreamAllocator
);

/// Implements [`Packable`] for a type whose blocks are those of the
/// allocator `A` it wraps or points to, by forwarding to `A`.
macro_rules! packable_forward {
    ($([$($generics:tt)*] $t:ty),* $(,)?) => { $(
        impl<$($generics)*> Packable for $t {
            #[inline]
            fn carve(segment: &A::Block, offset: usize) -> A::Block {
                A::carve(segment, offset)
            }

            #[inline]
            fn address(block: &A::Block) -> usize {
                A::address(block)
            }
        }
    )* };
}

packable_forward!(
    // Stacking: a pool's blocks are its allocator's blocks.
    [A: Packable, P: Policy, C: Clock] DecayingPool<A, P, C>,
    [A: Packable + ?Sized] &mut A,
    [A: Packable + ?Sized] Box<A>,
);

/// Blocks that are plain addresses (`u64`): `segment + offset` (for the
/// CUDA allocators, the test doubles and the replay's modelled allocator).
#[cfg(any(feature = "cuda", feature = "testing", feature = "trace"))]
#[inline]
pub(crate) fn carve_u64(segment: &u64, offset: usize) -> u64 {
    segment
        .checked_add(offset as u64)
        .expect("carving a block past the end of the address space")
}

/// The address of a `u64` block, as a `usize` (truncated on 32-bit hosts,
/// where device addresses above 4 GiB are folded: still distinct for the
/// blocks of one device in practice, and only used as a map key).
#[cfg(any(feature = "cuda", feature = "testing", feature = "trace"))]
#[inline]
pub(crate) fn address_u64(block: &u64) -> usize {
    *block as usize
}
