//! Shared by the benchmarks and `examples/metadata.rs`.

use decaying_pool::{Packable, RawAllocator};

/// A backing allocator that does nothing: hands out numbers.
#[derive(Default)]
#[allow(dead_code)] // the packing bench carves, so it uses `NullAddresses`
pub(crate) struct Null(usize);

impl RawAllocator for Null {
    type Block = usize;
    type Error = core::convert::Infallible;
    fn allocate(&mut self, _size: usize) -> Result<usize, Self::Error> {
        self.0 += 1;
        Ok(self.0)
    }
    unsafe fn deallocate(&mut self, _block: usize, _size: usize) {}
}

/// A backing allocator that does nothing but hand out address ranges, so
/// blocks can be carved (`segment + offset`) by a packed pool.
#[derive(Default)]
#[allow(dead_code)] // not every target that includes this module packs
pub(crate) struct NullAddresses(usize);

impl RawAllocator for NullAddresses {
    type Block = usize;
    type Error = core::convert::Infallible;
    fn allocate(&mut self, size: usize) -> Result<usize, Self::Error> {
        let at = (self.0 + 4095) & !4095;
        self.0 = at + size;
        Ok(at + 4096)
    }
    unsafe fn deallocate(&mut self, _block: usize, _size: usize) {}
}

impl Packable for NullAddresses {
    fn carve(segment: &usize, offset: usize) -> usize {
        segment + offset
    }
    fn address(block: &usize) -> usize {
        *block
    }
}

/// `n` sizes drawn from `lo..hi` (a fixed LCG, so every run draws the same).
#[allow(dead_code)] // the packing and mapped benches draw sizes
pub(crate) fn sizes(n: usize, lo: usize, hi: usize, seed: u64) -> Vec<usize> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (x >> 33) as usize % (hi - lo)
        })
        .collect()
}
