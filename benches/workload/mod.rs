//! The hit path's workload, shared by `hit_path.rs` and
//! `examples/instructions.rs`: the hand-written map of vectors the pool is
//! measured against, the class sizes, the order requests come in, and the
//! filling of a pool.

use decaying_pool::{Clock, DecayingPool, Policy, RawAllocator};

use crate::common::Null;

/// What most projects write: an exact-size cache that never evicts.
#[derive(Default)]
pub(crate) struct HandWritten {
    map: hashbrown::HashMap<usize, Vec<usize>>,
    backing: Null,
}

impl HandWritten {
    /// A cache holding `per` blocks of each of `sizes`.
    pub(crate) fn filled(sizes: &[usize], per: usize) -> Self {
        let mut hand = HandWritten::default();
        for &s in sizes {
            let held: Vec<_> = (0..per).map(|_| hand.allocate(s)).collect();
            for b in held {
                hand.release(b, s);
            }
        }
        hand
    }

    // Always inlined, as the pool's `allocate` and `release` are: the
    // harnesses compare the two caches' code inlined into their loops
    // (with `#[inline]` alone the compiler called `release` out of line
    // in `examples/instructions.rs`, and the map paid a call per round
    // trip that the pool did not).
    #[inline(always)]
    pub(crate) fn allocate(&mut self, size: usize) -> usize {
        match self.map.get_mut(&size).and_then(Vec::pop) {
            Some(b) => b,
            None => self.backing.allocate(size).unwrap(),
        }
    }
    #[inline(always)]
    pub(crate) fn release(&mut self, block: usize, size: usize) {
        self.map.entry(size).or_default().push(block);
    }
}

/// `n` pseudo-random sizes (a fixed LCG, so every run draws the same).
pub(crate) fn sizes(n: usize) -> Vec<usize> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut out: Vec<usize> = Vec::with_capacity(n);
    while out.len() < n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let s = 256 + ((x >> 33) as usize % (1 << 24));
        if !out.contains(&s) || n > 4096 {
            out.push(s);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The order requests come in: a random walk over the classes.
pub(crate) fn order(classes: usize, len: usize) -> Vec<usize> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as usize % classes
        })
        .collect()
}

/// Caches `per` blocks of each of `sizes` in `pool`.
pub(crate) fn fill<P: Policy, C: Clock>(
    pool: &mut DecayingPool<Null, P, C>,
    sizes: &[usize],
    per: usize,
) {
    let mut held = Vec::new();
    for &s in sizes {
        for _ in 0..per {
            held.push((pool.allocate(s).unwrap(), s));
        }
    }
    for (b, s) in held {
        // SAFETY: each block came from this pool with this size.
        unsafe { pool.release(b, s) };
    }
}
