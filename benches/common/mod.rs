//! Shared by the benchmarks and `examples/metadata.rs`.

use decaying_pool::RawAllocator;

/// A backing allocator that does nothing: hands out numbers.
#[derive(Default)]
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
