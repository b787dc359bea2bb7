//! Tag bytes compared a group at a time, as hashbrown compares its
//! control bytes: sixteen at a time with SSE2 on x86-64 ([`sse2`]), eight
//! at a time in a `u64` elsewhere ([`swar`], built under test on every
//! target, so that its tests run here too; `--cfg decaying_pool_swar`
//! gives the store these groups on x86-64 as well, for its tests).
//!
//! A slot's tag is [`EMPTY`] (high bit set) or, high bit clear, six bits
//! of its class's hash and the [`NEWEST`] bit. Under LIFO, the slot a hit
//! empties keeps `EMPTY | NEWEST | hash` (its class's ghost) until it is
//! filled or used. A [`Group`] is the `WIDTH` tags of consecutive slots, and
//! a [`Mask`] a set of positions in it: both implementations give the same
//! operations, exact (no position matches by a borrow from its neighbour).

/// The tag of an empty slot.
pub(super) const EMPTY: u8 = 0x80;

/// The bit of a tag that marks the newest block of its class (see the
/// store's documentation); the hash takes the six bits below it.
pub(super) const NEWEST: u8 = 0x40;

// `--cfg decaying_pool_swar` (internal: for tests, and CI) gives the store
// the `u64` groups on x86-64 too, so that the store's own tests run on them.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod sse2;
#[cfg(any(
    test,
    decaying_pool_swar,
    not(all(target_arch = "x86_64", target_feature = "sse2"))
))]
mod swar;

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "sse2",
    not(decaying_pool_swar)
))]
pub(super) use self::sse2::{Group, Mask, WIDTH};
#[cfg(any(
    decaying_pool_swar,
    not(all(target_arch = "x86_64", target_feature = "sse2"))
))]
pub(super) use self::swar::{Group, Mask, WIDTH};

/// A set of positions in a group, as both implementations give it: the
/// top bit of each position's `STRIDE` bits of a word (8: the tags' own
/// high bits in the `u64` groups; 1: a movemask's bit a lane), as
/// hashbrown's `BitMask` is shared by its groups.
#[derive(Clone, Copy)]
pub(crate) struct BitMask<const STRIDE: u32>(u64);

impl<const STRIDE: u32> BitMask<STRIDE> {
    /// The bits that stand for positions: the top bit of each lane.
    const MARKS: u64 = (u64::MAX / ((1 << STRIDE) - 1)) << (STRIDE - 1);

    /// The positions whose bits (the top one of their lane) are set in
    /// `bits`, which has no other bit set.
    #[inline(always)]
    pub(crate) fn new(bits: u64) -> Self {
        debug_assert_eq!(bits & !Self::MARKS, 0);
        BitMask(bits)
    }

    /// The first `n` positions (`n` at most a group's width).
    #[inline(always)]
    pub(crate) fn first(n: usize) -> Self {
        let bits = STRIDE as usize * n;
        debug_assert!(bits <= 64);
        if bits >= 64 {
            BitMask(Self::MARKS)
        } else {
            BitMask(Self::MARKS & ((1u64 << bits) - 1))
        }
    }

    /// The positions in both.
    #[inline(always)]
    pub(crate) fn and(self, other: Self) -> Self {
        BitMask(self.0 & other.0)
    }

    /// Whether no position is in it.
    #[cfg(test)]
    #[inline(always)]
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The lowest position in it, if any.
    #[inline(always)]
    pub(crate) fn lowest(self) -> Option<usize> {
        if self.0 == 0 {
            None
        } else {
            Some((self.0.trailing_zeros() / STRIDE) as usize)
        }
    }
}

impl<const STRIDE: u32> Iterator for BitMask<STRIDE> {
    type Item = usize;

    /// The positions, lowest first.
    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        let k = self.lowest()?;
        self.0 &= self.0 - 1;
        Some(k)
    }
}

/// The same tests for each implementation.
#[cfg(test)]
macro_rules! tests {
    ($imp:ident) => {
        mod $imp {
            use super::super::$imp::{Group, Mask, WIDTH};
            use super::super::{EMPTY, NEWEST};

            /// The group of eight tags and, past them, empty ones.
            fn group(tags: [u8; 8]) -> Group {
                let mut all = [EMPTY; WIDTH];
                all[..8].copy_from_slice(&tags);
                // SAFETY: `all` holds `WIDTH` tags.
                unsafe { Group::load_unchecked(&all, 0) }
            }

            #[test]
            fn match_tag_finds_every_equal_byte_and_no_empty_one() {
                for tag in 0..0x80u8 {
                    let mut tags = [EMPTY; 8];
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
            fn match_tag_finds_ghosts_exactly() {
                // A ghost's tag (`EMPTY | NEWEST | hash`) against every byte.
                // Every 5th tag and 17th byte under Miri.
                for tag in (0..NEWEST).step_by(if cfg!(miri) { 5 } else { 1 }) {
                    let ghost = EMPTY | NEWEST | tag;
                    for byte in (0..=0xffu8).step_by(if cfg!(miri) { 17 } else { 1 }) {
                        let g = group([byte, EMPTY, ghost, tag, tag | NEWEST, byte, 0xff, byte]);
                        let m: Vec<usize> = g.match_tag(ghost).collect();
                        let mut want = vec![2];
                        if byte == ghost {
                            want.extend([0, 5, 7]);
                        }
                        if ghost == 0xff {
                            want.push(6);
                        }
                        want.sort_unstable();
                        assert_eq!(m, want, "ghost {ghost:#x}, byte {byte:#x}");
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
            fn match_newest_finds_marked_blocks_and_ghosts_only() {
                // Every 5th tag and 17th byte under Miri.
                for tag in (0..NEWEST).step_by(if cfg!(miri) { 5 } else { 1 }) {
                    for byte in (0..=0xffu8).step_by(if cfg!(miri) { 17 } else { 1 }) {
                        let marked = tag | NEWEST;
                        let g = group([
                            byte,
                            EMPTY,
                            marked,
                            tag,
                            EMPTY | marked,
                            byte,
                            EMPTY | tag,
                            byte,
                        ]);
                        let m: Vec<usize> = g.match_newest(tag).collect();
                        let mut want = vec![2, 4];
                        if byte & !EMPTY == marked {
                            want.extend([0, 5, 7]);
                        }
                        want.sort_unstable();
                        assert_eq!(m, want, "tag {tag:#x}, byte {byte:#x}");
                    }
                }
            }

            #[test]
            fn match_empty_and_masks() {
                let g = group([EMPTY, 3, EMPTY, EMPTY, 0x7f, 0, EMPTY, 1]);
                let eight = Mask::first(8);
                assert_eq!(g.match_empty().and(eight).collect::<Vec<_>>(), [0, 2, 3, 6]);
                assert_eq!(g.match_empty().collect::<Vec<_>>().len(), WIDTH - 4);
                // Ghosts and any tag with the high bit set are empty.
                let ghosts = group([0xC5, 0x45, 5, EMPTY, 0xC0, 0x40, 0xFF, 0x7F]);
                let m: Vec<usize> = ghosts.match_empty().and(eight).collect();
                assert_eq!(m, [0, 3, 4, 6]);
                assert_eq!(
                    g.match_empty().and(Mask::first(3)).collect::<Vec<_>>(),
                    [0, 2]
                );
                assert!(g.match_empty().and(Mask::first(0)).is_empty());
                assert_eq!(g.match_empty().and(Mask::first(WIDTH)).lowest(), Some(0));
                assert_eq!(Mask::first(1).lowest(), Some(0));
            }
        }
    };
}

#[cfg(test)]
mod tests {
    tests!(swar);
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    tests!(sse2);
}
