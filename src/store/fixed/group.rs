//! Tag bytes compared eight at a time (SWAR on a `u64`), as hashbrown
//! compares its control bytes on targets without SIMD.
//!
//! A slot's tag is [`EMPTY`] (high bit set) or, high bit clear, six bits
//! of its class's hash and the [`NEWEST`] bit. A [`Group`] is eight
//! consecutive tags read as one little-endian word: byte `k` of the word is
//! the tag of slot `start + k`.

/// The tag of an empty slot.
pub(super) const EMPTY: u8 = 0x80;

/// The bit of a tag that marks the newest block of its class (see the
/// store's documentation); the hash takes the six bits below it.
pub(super) const NEWEST: u8 = 0x40;

/// Tags in one group.
pub(super) const WIDTH: usize = 8;

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// The positions of the zero bytes of `x`, exactly (no borrow between
/// bytes: each byte's low seven bits plus 0x7F stay below 0x100).
#[inline(always)]
fn zero_bytes(x: u64) -> Mask {
    Mask(!(((x & !HI).wrapping_add(!HI)) | x) & HI)
}

/// Eight tags.
#[derive(Clone, Copy)]
pub(super) struct Group(u64);

/// A set of positions in a group: the high bit of each chosen byte.
#[derive(Clone, Copy)]
pub(super) struct Mask(u64);

impl Group {
    /// The eight tags from `tags[at..at + WIDTH]`.
    #[cfg(test)]
    pub(super) fn load(tags: &[u8], at: usize) -> Self {
        let mut word = [0; WIDTH];
        word.copy_from_slice(&tags[at..at + WIDTH]);
        Group(u64::from_le_bytes(word))
    }

    /// The eight tags from `tags[at..at + WIDTH]`, without a bounds check.
    ///
    /// # Safety
    ///
    /// `at + WIDTH <= tags.len()`.
    #[inline(always)]
    pub(super) unsafe fn load_unchecked(tags: &[u8], at: usize) -> Self {
        debug_assert!(at + WIDTH <= tags.len());
        // SAFETY: the caller's promise: the eight bytes are in `tags`; an
        // unaligned read of a `u64` needs no alignment.
        let word = unsafe { tags.as_ptr().add(at).cast::<u64>().read_unaligned() };
        Group(u64::from_le(word))
    }

    /// The positions whose tag is exactly `tag` (below 0x80): never an
    /// empty one.
    #[inline(always)]
    pub(super) fn match_tag(self, tag: u8) -> Mask {
        zero_bytes(self.0 ^ (LO * u64::from(tag)))
    }

    /// The positions whose tag is `tag` or `tag | NEWEST` (`tag` below
    /// [`NEWEST`]): every block whose class hashes to `tag`, marked newest
    /// or not. Never an empty one.
    #[inline(always)]
    pub(super) fn match_hash(self, tag: u8) -> Mask {
        zero_bytes((self.0 ^ (LO * u64::from(tag))) & !(LO * u64::from(NEWEST)))
    }

    /// The empty positions, exactly.
    #[inline(always)]
    pub(super) fn match_empty(self) -> Mask {
        Mask(self.0 & HI)
    }
}

impl Mask {
    /// The first `n` positions (`n <= WIDTH`).
    #[inline(always)]
    pub(super) fn first(n: usize) -> Self {
        debug_assert!(n <= WIDTH);
        if n >= WIDTH {
            Mask(HI)
        } else {
            Mask(HI & ((1u64 << (8 * n)) - 1))
        }
    }

    /// The positions in both.
    #[inline(always)]
    pub(super) fn and(self, other: Mask) -> Mask {
        Mask(self.0 & other.0)
    }

    /// Whether no position is in it.
    #[cfg(test)]
    #[inline(always)]
    pub(super) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The lowest position in it, if any.
    #[inline(always)]
    pub(super) fn lowest(self) -> Option<usize> {
        if self.0 == 0 {
            None
        } else {
            Some(self.0.trailing_zeros() as usize / 8)
        }
    }
}

impl Iterator for Mask {
    type Item = usize;

    /// The positions, lowest first.
    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        let k = self.lowest()?;
        self.0 &= self.0 - 1;
        Some(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(tags: [u8; WIDTH]) -> Group {
        Group::load(&tags, 0)
    }

    #[test]
    fn match_tag_finds_every_equal_byte_and_no_empty_one() {
        for tag in 0..0x80u8 {
            let mut tags = [EMPTY; WIDTH];
            tags[1] = tag;
            tags[4] = tag;
            tags[6] = tag ^ 1;
            tags[7] = tag;
            let m: Vec<usize> = group(tags).match_tag(tag).collect();
            for k in [1, 4, 7] {
                assert!(m.contains(&k), "tag {tag:#x}: position {k} missed in {m:?}");
            }
            for k in [0, 2, 3, 5] {
                assert!(!m.contains(&k), "tag {tag:#x}: empty position {k} matched");
            }
        }
    }

    #[test]
    fn match_tag_is_exact() {
        // A byte right above an equal one (a false positive of the usual
        // borrowing trick) is not matched.
        let m: Vec<usize> = group([4, 5, 9, 4, 5, 0x44, 3, 4]).match_tag(4).collect();
        assert_eq!(m, [0, 3, 7]);
        assert!(group([1, 2, 3, 5, 6, 7, 8, 0x7f]).match_tag(4).is_empty());
        // Every pair of a tag and a byte.
        // Every 5th tag and 17th byte under Miri.
        for tag in (0..0x80u8).step_by(if cfg!(miri) { 5 } else { 1 }) {
            for byte in (0..=0xffu8).step_by(if cfg!(miri) { 17 } else { 1 }) {
                let g = group([byte, EMPTY, byte, tag, byte, 0, byte, 0x7f]);
                let m: Vec<usize> = g.match_tag(tag).collect();
                let mut want = vec![3];
                if byte == tag {
                    want.extend([0, 2, 4, 6]);
                }
                if tag == 0 {
                    want.push(5);
                }
                if tag == 0x7f {
                    want.push(7);
                }
                want.sort_unstable();
                assert_eq!(m, want, "tag {tag:#x}, byte {byte:#x}");
            }
        }
    }

    #[test]
    fn match_hash_ignores_the_newest_bit_only() {
        // Every 5th tag and 17th byte under Miri.
        for tag in (0..NEWEST).step_by(if cfg!(miri) { 5 } else { 1 }) {
            for byte in (0..=0xffu8).step_by(if cfg!(miri) { 17 } else { 1 }) {
                let g = group([byte, EMPTY, tag | NEWEST, tag, byte, byte, byte, byte]);
                let m: Vec<usize> = g.match_hash(tag).collect();
                let mut want = vec![2, 3];
                if byte & !NEWEST == tag {
                    want.extend([0, 4, 5, 6, 7]);
                }
                want.sort_unstable();
                assert_eq!(m, want, "tag {tag:#x}, byte {byte:#x}");
            }
        }
    }

    #[test]
    fn match_empty_and_masks() {
        let g = group([EMPTY, 3, EMPTY, EMPTY, 0x7f, 0, EMPTY, 1]);
        assert_eq!(g.match_empty().collect::<Vec<_>>(), [0, 2, 3, 6]);
        assert_eq!(
            g.match_empty().and(Mask::first(3)).collect::<Vec<_>>(),
            [0, 2]
        );
        assert!(g.match_empty().and(Mask::first(0)).is_empty());
        assert_eq!(g.match_empty().and(Mask::first(WIDTH)).lowest(), Some(0));
        assert_eq!(Mask::first(1).lowest(), Some(0));
    }
}
