//! Tags compared sixteen at a time with SSE2, as hashbrown compares its
//! control bytes on x86-64: a [`Group`] is sixteen consecutive tags in one
//! vector register, lane `k` the tag of slot `start + k`, and a [`Mask`]
//! one bit per lane, from one `pmovmskb`.

use core::arch::x86_64::{
    __m128i, _mm_and_si128, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
    _mm_set1_epi32,
};

use super::{EMPTY, NEWEST};

/// Tags in one group.
pub(crate) const WIDTH: usize = 16;

/// Sixteen tags.
#[derive(Clone, Copy)]
pub(crate) struct Group(__m128i);

/// A set of positions in a group: bit `k` for position `k`.
pub(crate) type Mask = super::BitMask<1>;

impl Group {
    /// The sixteen tags from `tags[at..at + WIDTH]`, without a bounds
    /// check.
    ///
    /// # Safety
    ///
    /// `at + WIDTH <= tags.len()`.
    #[inline(always)]
    pub(crate) unsafe fn load_unchecked(tags: &[u8], at: usize) -> Self {
        debug_assert!(at + WIDTH <= tags.len());
        // SAFETY: the caller's promise: the sixteen bytes are in `tags`;
        // `_mm_loadu_si128` reads them unaligned.
        Group(unsafe { _mm_loadu_si128(tags.as_ptr().add(at).cast::<__m128i>()) })
    }

    /// The positions whose tag is exactly `tag` (an empty one only if
    /// `tag` is: a ghost's).
    #[inline(always)]
    pub(crate) fn match_tag(self, tag: u8) -> Mask {
        // SAFETY: SSE2 is enabled (this module is built only with it).
        bits(unsafe { _mm_cmpeq_epi8(self.0, splat(tag)) })
    }

    /// The positions whose tag is `tag` or `tag | NEWEST` (`tag` below
    /// [`NEWEST`]): every block whose class hashes to `tag`, marked newest
    /// or not. Never an empty one (its high bit stays).
    #[inline(always)]
    pub(crate) fn match_hash(self, tag: u8) -> Mask {
        // SAFETY: SSE2 is enabled (this module is built only with it).
        bits(unsafe {
            let hash = _mm_and_si128(self.0, _mm_set1_epi8(!NEWEST as i8));
            _mm_cmpeq_epi8(hash, splat(tag))
        })
    }

    /// The positions whose tag is `tag | NEWEST` or `EMPTY | NEWEST |
    /// tag` (`tag` below [`NEWEST`]): the blocks whose class hashes to
    /// `tag` marked newest, and the ghosts of such classes.
    #[inline(always)]
    pub(crate) fn match_newest(self, tag: u8) -> Mask {
        // SAFETY: SSE2 is enabled (this module is built only with it).
        bits(unsafe {
            let live = _mm_and_si128(self.0, _mm_set1_epi8(!EMPTY as i8));
            _mm_cmpeq_epi8(live, splat(tag | NEWEST))
        })
    }

    /// The empty positions (the tags with the high bit set).
    #[inline(always)]
    pub(crate) fn match_empty(self) -> Mask {
        bits(self.0)
    }
}

/// The high bit of each lane of `v`.
#[inline(always)]
fn bits(v: __m128i) -> Mask {
    // The movemask's 16 bits, in the low half of an `i32`.
    // SAFETY: SSE2 is enabled (this module is built only with it).
    Mask::new(u64::from(unsafe { _mm_movemask_epi8(v) } as u16))
}

/// `byte` in every byte of a vector: the byte times `0x0101_0101` in
/// every 32-bit lane, a multiplication, a move and one shuffle, where
/// `_mm_set1_epi8` (without SSSE3) takes a move and three shuffles: one
/// instruction fewer on every hit and release of `FixedCapacity` (143 ->
/// 142 a round trip at 64 x 1, `examples/instructions.rs`).
#[inline(always)]
fn splat(byte: u8) -> __m128i {
    // SAFETY: SSE2 is enabled (this module is built only with it).
    unsafe { _mm_set1_epi32((u32::from(byte) * 0x0101_0101) as i32) }
}
