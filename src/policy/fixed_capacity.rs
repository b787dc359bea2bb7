//! [`FixedCapacity`]: a fixed table of slots, with no clock.

/// A fixed table of `slots` cached blocks that never grows and needs no
/// clock: once full, every release evicts the oldest block of its probe
/// window.
///
/// The table is one open-addressing array of `slots` entries, allocated
/// when the pool is built. It has at most [`FixedCapacity::MAX_SLOTS`]
/// entries ([`new`](Self::new) clamps, [`try_new`](Self::try_new)
/// refuses), and building a pool never aborts for want of memory: if the
/// table cannot be allocated, the pool gets the largest of `slots / 2`,
/// `slots / 4`, … that can be (down to none, which caches nothing). A class
/// hashes to a home slot; its blocks live in the window of up to
/// [`FixedCapacity::WINDOW`] slots from there. Lookups always scan the
/// whole window, so a hit simply empties its entry (no tombstones, no
/// backward shift), and every operation is O(1) in the worst case. The scan
/// reads one tag byte per slot (six bits of the size's hash, and a mark on
/// the newest block of each size), sixteen at a time with SSE2 on x86-64
/// (eight in one word elsewhere), and only the entries whose tag matches;
/// under LIFO a hit after a hit of its size follows a link from the block
/// taken to the size's next newest, where it would compare stamps. `collect` is a
/// no-op; `trim` empties the table; `FixedCapacity::new(0)` caches nothing.
///
/// Each slot costs a record of the block, its size (8), a release stamp
/// and the two links of the age list (16), rounded up to a multiple of 32
/// bytes so that a hit touches one cache line for it; then the link to
/// its size's next newest block (4), and a tag byte, which also says
/// whether the slot holds a block: 37 bytes for a `NonNull` block or a
/// `u64` device pointer (every backend of this crate), 69 for a block of
/// 9 to 40 bytes.
///
/// # Blocks of one size
///
/// `slots` bounds the whole table; the window bounds each size class: at
/// most [`max_per_size`](Self::max_per_size) blocks of one class are
/// cached, by default `min(slots, WINDOW)` = 8. A 24th block of a size
/// released into `FixedCapacity::new(256)` evicts that class's oldest.
/// When a workload keeps many buffers of the same shape, raise the bound
/// with [`per_size`](Self::per_size) (each operation scans that many slots):
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedCapacity};
///
/// let policy = FixedCapacity::new(256).per_size(32);
/// assert_eq!(policy.max_per_size(), 32);
/// let mut pool = DecayingPool::new(CheckingAllocator::new(), policy);
/// let blocks: Vec<_> = (0..24).map(|_| pool.allocate(1 << 20).unwrap()).collect();
/// for b in blocks {
///     unsafe { pool.release(b, 1 << 20) };
/// }
/// assert_eq!((pool.stats().blocks_cached, pool.stats().evictions), (24, 0));
/// # Ok(())
/// # }
/// ```
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "testing"))] fn main() {} // needs the `testing` feature
/// # #[cfg(feature = "testing")] fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Needs the `testing` feature (its test doubles): `features = ["testing"]`.
/// use decaying_pool::testing::CheckingAllocator;
/// use decaying_pool::{DecayingPool, FixedCapacity};
///
/// let mut pool = DecayingPool::new(CheckingAllocator::new(), FixedCapacity::new(2));
/// let blocks: Vec<_> = (0..3).map(|_| pool.allocate(64).unwrap()).collect();
/// for b in blocks {
///     unsafe { pool.release(b, 64) };
/// }
/// let s = pool.stats();
/// assert_eq!((s.blocks_cached, s.evictions), (2, 1));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedCapacity {
    slots: usize,
    per_size: usize,
}

impl FixedCapacity {
    /// The default probe window: a class's blocks live within this many
    /// slots of its home slot, so at most this many blocks of one size are
    /// cached unless [`per_size`](Self::per_size) says otherwise.
    pub const WINDOW: usize = 8;

    /// The most entries a table may have: 2^20 (1,048,576), a table of
    /// tens of MiB. A fixed table this large would hold a million idle
    /// blocks of a costly allocator; a timed policy suits such a cache
    /// better.
    pub const MAX_SLOTS: usize = 1 << 20;

    /// A table of `slots` entries, at most [`FixedCapacity::MAX_SLOTS`]
    /// (a larger `slots` is clamped to it).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::FixedCapacity;
    /// assert_eq!(FixedCapacity::new(64).slots(), 64);
    /// assert_eq!(FixedCapacity::new(1 << 40).slots(), FixedCapacity::MAX_SLOTS);
    /// ```
    pub const fn new(slots: usize) -> Self {
        let slots = if slots > Self::MAX_SLOTS {
            Self::MAX_SLOTS
        } else {
            slots
        };
        FixedCapacity {
            slots,
            per_size: Self::WINDOW,
        }
    }

    /// A table of `slots` entries.
    ///
    /// # Errors
    ///
    /// [`TooManySlots`] when `slots` exceeds [`FixedCapacity::MAX_SLOTS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::{policy::TooManySlots, FixedCapacity};
    /// assert_eq!(FixedCapacity::try_new(64).map(|p| p.slots()), Ok(64));
    /// assert_eq!(FixedCapacity::try_new(1 << 40), Err(TooManySlots { requested: 1 << 40 }));
    /// ```
    pub const fn try_new(slots: usize) -> Result<Self, TooManySlots> {
        if slots > Self::MAX_SLOTS {
            Err(TooManySlots { requested: slots })
        } else {
            Ok(FixedCapacity {
                slots,
                per_size: Self::WINDOW,
            })
        }
    }

    /// The number of entries in the table.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(decaying_pool::FixedCapacity::new(0).slots(), 0);
    /// ```
    pub const fn slots(&self) -> usize {
        self.slots
    }

    /// Sets the most blocks of one size class the table holds: its probe
    /// window, [`WINDOW`](Self::WINDOW) (8) by default, at least 1 and at
    /// most `slots` (clamped). Every allocate and release scans the tags
    /// of this many slots, a group at a time (sixteen in one SSE2
    /// comparison on x86-64, eight in one word elsewhere), so past a group
    /// it is a cost as well as a bound: a window of one group takes the
    /// inlined path, a larger one a path out of line.
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::FixedCapacity;
    /// assert_eq!(FixedCapacity::new(256).max_per_size(), 8);
    /// assert_eq!(FixedCapacity::new(256).per_size(24).max_per_size(), 24);
    /// assert_eq!(FixedCapacity::new(16).per_size(24).max_per_size(), 16);
    /// assert_eq!(FixedCapacity::new(16).per_size(0).max_per_size(), 1);
    /// ```
    #[must_use]
    pub const fn per_size(self, blocks: usize) -> Self {
        FixedCapacity {
            slots: self.slots,
            per_size: if blocks == 0 { 1 } else { blocks },
        }
    }

    /// The most blocks of one size class the table holds:
    /// `min(slots, per_size)` (see [`per_size`](Self::per_size)).
    ///
    /// # Examples
    ///
    /// ```
    /// use decaying_pool::FixedCapacity;
    /// assert_eq!(FixedCapacity::new(4).max_per_size(), 4);
    /// assert_eq!(FixedCapacity::new(1024).max_per_size(), FixedCapacity::WINDOW);
    /// ```
    pub const fn max_per_size(&self) -> usize {
        if self.per_size < self.slots {
            self.per_size
        } else {
            self.slots
        }
    }
}

/// Why [`FixedCapacity::try_new`] refused: more slots than
/// [`FixedCapacity::MAX_SLOTS`].
///
/// # Examples
///
/// ```
/// use decaying_pool::FixedCapacity;
/// let err = FixedCapacity::try_new(usize::MAX).unwrap_err();
/// assert_eq!(err.requested, usize::MAX);
/// assert!(err.to_string().contains("at most"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TooManySlots {
    /// The slot count asked for.
    pub requested: usize,
}

impl core::fmt::Display for TooManySlots {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "a FixedCapacity table of {} slots: at most {} are allowed",
            self.requested,
            FixedCapacity::MAX_SLOTS
        )
    }
}

impl std::error::Error for TooManySlots {}
