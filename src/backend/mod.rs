//! Backing allocators a pool can sit in front of.
//!
//! - [`SystemAllocator`]: the global allocator, with a chosen alignment;
//! - [`MmapAllocator`] (unix): anonymous private mappings, page-aligned,
//!   unmapped (really returned to the OS) on deallocate.

pub(crate) mod host;
mod system;
pub use system::{AllocError, SystemAllocator};

#[cfg(unix)]
mod mmap;
#[cfg(unix)]
pub use mmap::{MmapAllocator, MmapError};

#[cfg(feature = "cuda")]
pub mod cuda;
