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

/// A fresh sub-allocator over `units` units, for blocks of at least
/// `min_units` units each.
///
/// It needs a node per block and per free range between them: at most
/// `2 * (units / min_units) + 2`, far fewer than `units` for a medium
/// segment (its blocks are larger than the small threshold). Its node
/// arrays are allocated and filled here, so the budget is what a new
/// segment costs: a medium segment of 40 MiB in 512-byte units budgets 80
/// nodes rather than 32 768 (about 2 KB rather than 1 MB).
pub(crate) fn sub_allocator(units: u32, min_units: u32) -> Allocator {
    let nodes = (units / min_units.max(1))
        .saturating_mul(2)
        .saturating_add(2)
        .min(MAX_NODES);
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

#[cfg(test)]
mod tests {
    use super::sub_allocator;

    /// The node budget never makes a segment full before its space is: it
    /// holds `units / min_units` blocks of `min_units`, and after every
    /// other one is freed (a free range between each pair of blocks, the
    /// most nodes at once), the holes take blocks again. That needs
    /// `2 * blocks + 1` nodes: a budget below it fails here.
    #[test]
    fn the_node_budget_covers_the_most_blocks_a_segment_can_hold() {
        // Block sizes the sub-allocator's bins hold exactly (a hole of any
        // other size serves a slightly smaller request only).
        // Under Miri a smaller segment of one-unit blocks: the 4 096 blocks
        // of the full case take it half a minute.
        let ones = if cfg!(miri) { 512 } else { 4096 };
        for (units, min) in [(ones, 1), (81_920, 2048), (40_000, 1024), (7, 3), (5, 9)] {
            let mut a = sub_allocator(units, min);
            let most = (units / min) as usize;
            let mut held: Vec<_> = (0..most)
                .map(|i| {
                    a.allocate(min)
                        .unwrap_or_else(|| panic!("{units}/{min}: block {i}"))
                })
                .collect();
            assert!(a.storage_report().total_free_space < min);
            let kept: Vec<_> = held
                .drain(..)
                .enumerate()
                .filter_map(|(i, b)| {
                    if i % 2 == 0 {
                        a.free(b);
                        None
                    } else {
                        Some(b)
                    }
                })
                .collect();
            for i in 0..most.div_ceil(2) {
                assert!(a.allocate(min).is_some(), "{units}/{min}: refill {i}");
            }
            drop(kept);
        }
    }
}
