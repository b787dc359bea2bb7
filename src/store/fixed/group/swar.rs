//! Tags compared eight at a time in a `u64` (SWAR), as hashbrown compares
//! its control bytes on targets without SIMD: the groups of targets other
//! than x86-64 (and, under test, of every target).
//!
//! A [`Group`] is eight consecutive tags read as one little-endian word:
//! byte `k` of the word is the tag of slot `start + k`. A [`Mask`] keeps the
//! high bit of each chosen byte.

use super::{EMPTY, NEWEST};

/// Tags in one group.
pub(crate) const WIDTH: usize = 8;

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// The positions of the zero bytes of `x`, exactly (no borrow between
/// bytes: each byte's low seven bits plus 0x7F stay below 0x100).
#[inline(always)]
fn zero_bytes(x: u64) -> Mask {
    Mask::new(!(((x & !HI).wrapping_add(!HI)) | x) & HI)
}

/// Eight tags.
#[derive(Clone, Copy)]
pub(crate) struct Group(u64);

/// A set of positions in a group: the high bit of each chosen byte.
pub(crate) type Mask = super::BitMask<8>;

impl Group {
    /// The eight tags from `tags[at..at + WIDTH]`, without a bounds check.
    ///
    /// # Safety
    ///
    /// `at + WIDTH <= tags.len()`.
    #[inline(always)]
    pub(crate) unsafe fn load_unchecked(tags: &[u8], at: usize) -> Self {
        debug_assert!(at + WIDTH <= tags.len());
        // SAFETY: the caller's promise: the eight bytes are in `tags`; an
        // unaligned read of a `u64` needs no alignment.
        let word = unsafe { tags.as_ptr().add(at).cast::<u64>().read_unaligned() };
        Group(u64::from_le(word))
    }

    /// The positions whose tag is exactly `tag` (an empty one only if
    /// `tag` is: a ghost's).
    #[inline(always)]
    pub(crate) fn match_tag(self, tag: u8) -> Mask {
        zero_bytes(self.0 ^ (LO * u64::from(tag)))
    }

    /// The positions whose tag is `tag` or `tag | NEWEST` (`tag` below
    /// [`NEWEST`]): every block whose class hashes to `tag`, marked newest
    /// or not. Never an empty one.
    #[inline(always)]
    pub(crate) fn match_hash(self, tag: u8) -> Mask {
        zero_bytes((self.0 ^ (LO * u64::from(tag))) & !(LO * u64::from(NEWEST)))
    }

    /// The positions whose tag is `tag | NEWEST` or `EMPTY | NEWEST |
    /// tag` (`tag` below [`NEWEST`]): the blocks whose class hashes to
    /// `tag` marked newest, and the ghosts of such classes.
    #[inline(always)]
    pub(crate) fn match_newest(self, tag: u8) -> Mask {
        zero_bytes((self.0 ^ (LO * u64::from(tag | NEWEST))) & !(LO * u64::from(EMPTY)))
    }

    /// The empty positions, exactly.
    #[inline(always)]
    pub(crate) fn match_empty(self) -> Mask {
        Mask::new(self.0 & HI)
    }
}
