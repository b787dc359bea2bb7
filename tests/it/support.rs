//! Helpers shared by the test modules.

/// A small deterministic generator (64-bit LCG, high bits).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A small deterministic generator (xorshift64*).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The blocks the backing allocator was given back, in order.
pub(crate) fn freed_ids(alloc: &decaying_pool::testing::CheckingAllocator) -> Vec<u64> {
    use decaying_pool::testing::Call;
    alloc
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Deallocate { block, .. } => Some(block),
            Call::Allocate { .. } => None,
        })
        .collect()
}
