//! One segment: a block of the exact pool, carved by an O(1) sub-allocator.

use offset_allocator::{Allocation, Allocator};

/// The most sub-allocator nodes a segment keeps (each a used or a free
/// range; about 28 bytes each). A segment that runs out of nodes reports
/// itself full and the next request goes to another segment.
const MAX_NODES: u32 = 1 << 15;

/// A segment of the exact pool and its sub-allocator, in units of the
/// packing granularity.
pub(crate) struct Segment<B> {
    /// The pool's block.
    pub(crate) block: B,
    /// The bytes asked of the pool for it.
    pub(crate) bytes: usize,
    /// Its size in units.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))] // read by validate()
    pub(crate) units: u32,
    /// The sub-allocator over `0..units`.
    pub(crate) alloc: Allocator,
    /// Units handed out.
    pub(crate) used: u32,
    /// Blocks handed out.
    pub(crate) live: u32,
    /// Small (0) or medium (1).
    pub(crate) kind: usize,
    /// The bin of its largest free range, where the index files it.
    pub(crate) bin: u32,
    /// Its position in that bin.
    pub(crate) pos: u32,
}

/// A fresh sub-allocator over `units` units.
pub(crate) fn sub_allocator(units: u32) -> Allocator {
    let nodes = units.saturating_mul(2).saturating_add(2).min(MAX_NODES);
    Allocator::with_max_allocs(units, nodes)
}

impl<B> Segment<B> {
    /// The largest request, in units, the segment can serve now.
    #[inline]
    pub(crate) fn largest_free(&self) -> u32 {
        self.alloc.storage_report().largest_free_region
    }

    /// Carves `units` units; `None` when no free range fits.
    #[inline]
    pub(crate) fn carve(&mut self, units: u32) -> Option<Allocation> {
        let a = self.alloc.allocate(units)?;
        self.used += units;
        self.live += 1;
        Some(a)
    }

    /// Frees a range carved with `units` units.
    #[inline]
    pub(crate) fn free(&mut self, a: Allocation, units: u32) {
        self.alloc.free(a);
        self.used -= units;
        self.live -= 1;
    }
}
