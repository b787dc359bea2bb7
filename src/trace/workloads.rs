//! Small built-in workloads, generated deterministically in code: what the
//! command-line tool's `replay` runs when it is given no trace.
//!
//! They stand for three situations a caching allocator in front of a
//! device meets: a training loop that repeats the same sizes every step,
//! with an evaluation pass of other sizes now and then; an inference
//! pipeline whose buffer sizes depend on the data; and two pipeline stages
//! that take turns on a device too small to cache both (a cache that
//! never gives back starves the next stage). Their sizes and timings are
//! chosen by hand to show those situations, not measured on a real
//! program: the real traces the README replays are files.

use core::time::Duration;
use std::collections::HashMap;

use super::Event;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A named trace, with the device capacity it runs on, if any.
///
/// # Examples
///
/// ```
/// let w = decaying_pool::trace::workloads::training_loop();
/// assert_eq!(w.name, "training-loop");
/// assert!(!w.events.is_empty());
/// ```
#[derive(Clone, Debug)]
pub struct Workload {
    /// A short name.
    pub name: &'static str,
    /// One line on what it models.
    pub description: &'static str,
    /// The events, in time order.
    pub events: Vec<Event>,
    /// The device size it runs on (`None`: unbounded).
    pub capacity: Option<usize>,
}

/// The three built-in workloads: [`training_loop`],
/// [`data_dependent_pipeline`], [`aba_pipeline`].
///
/// # Examples
///
/// ```
/// assert_eq!(decaying_pool::trace::workloads::defaults().len(), 3);
/// ```
pub fn defaults() -> Vec<Workload> {
    vec![training_loop(), data_dependent_pipeline(), aba_pipeline()]
}

/// Builds traces: a clock, fresh addresses, live blocks.
struct Gen {
    t: u64,
    next: u64,
    live: HashMap<u64, u64>,
    events: Vec<Event>,
    rng: u64,
}

impl Gen {
    fn new(seed: u64) -> Self {
        Gen {
            t: 0,
            next: 0x7f00_0000_0000,
            live: HashMap::new(),
            events: Vec::new(),
            rng: seed,
        }
    }

    fn alloc(&mut self, size: u64) -> u64 {
        let addr = self.next;
        self.next += size.div_ceil(512) * 512;
        self.live.insert(addr, size);
        self.events
            .push(Event::alloc(Duration::from_nanos(self.t), addr, size));
        addr
    }

    fn free(&mut self, addr: u64) {
        let size = self
            .live
            .remove(&addr)
            .expect("generator frees a live block");
        self.events
            .push(Event::free(Duration::from_nanos(self.t), addr, size));
    }

    fn wait_us(&mut self, us: u64) {
        self.t += us * 1000;
    }

    /// Waits `base` µs plus up to `jitter` µs more.
    fn wait_jitter_us(&mut self, base: u64, jitter: u64) {
        let j = self.below(jitter);
        self.wait_us(base + j);
    }

    /// xorshift64*
    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rand() % n
    }

    fn finish(
        mut self,
        name: &'static str,
        description: &'static str,
        capacity: Option<usize>,
    ) -> Workload {
        let mut live: Vec<u64> = self.live.keys().copied().collect();
        live.sort_unstable();
        for a in live {
            self.free(a);
        }
        Workload {
            name,
            description,
            events: self.events,
            capacity,
        }
    }
}

/// A training loop: 40 steps of a 12-layer network, one every ~200 ms.
/// Each step loads a 96 MiB batch, keeps one activation per layer through
/// the forward pass, frees them in reverse in the backward pass, with an
/// 8 MiB workspace per layer and per-layer gradients; every 10th step is an
/// evaluation pass at half the batch (sizes seen nowhere else).
///
/// # Examples
///
/// ```
/// let w = decaying_pool::trace::workloads::training_loop();
/// assert_eq!(w.capacity, None);
/// ```
pub fn training_loop() -> Workload {
    let mut g = Gen::new(0x7121_0001);
    let layer = |i: usize| -> u64 { [96, 96, 64, 64, 48, 48, 32, 32, 24, 24, 16, 16][i] * MIB };
    for step in 0..40 {
        let eval = step % 10 == 9;
        let scale = if eval { 2 } else { 1 };
        let batch = g.alloc(96 * MIB / scale);
        g.wait_us(2_000);
        let mut acts = Vec::new();
        for i in 0..12 {
            let ws = g.alloc(8 * MIB);
            g.wait_jitter_us(3_000, 500);
            acts.push(g.alloc(layer(i) / scale));
            g.free(ws);
        }
        g.free(batch);
        if !eval {
            let mut grads = Vec::new();
            for (i, act) in acts.into_iter().enumerate().rev() {
                let ws = g.alloc(8 * MIB);
                let grad = g.alloc(layer(i));
                g.wait_jitter_us(6_000, 1_000);
                g.free(ws);
                g.free(act);
                grads.push(g.alloc(4 * MIB));
                g.free(grad);
            }
            let tmp = g.alloc(32 * MIB);
            g.wait_us(4_000);
            g.free(tmp);
            for gr in grads {
                g.free(gr);
            }
        } else {
            for a in acts.into_iter().rev() {
                g.free(a);
            }
        }
        g.wait_jitter_us(40_000, 20_000);
    }
    g.finish(
        "training-loop",
        "40 steps of a 12-layer net, ~200 ms apart; every 10th an eval pass at half batch",
        None,
    )
}

/// An inference pipeline whose buffer sizes vary with a data-dependent
/// `k` (1 to 16 items per request, skewed towards small): 300 requests
/// ~20 ms apart, each with `k` × 6 MiB of input, `k` × 24 MiB of
/// intermediate, `k` × 2 MiB of output and a fixed 64 MiB workspace. Exact
/// sizes recur only when `k` does; size classes merge neighbours.
///
/// # Examples
///
/// ```
/// let w = decaying_pool::trace::workloads::data_dependent_pipeline();
/// assert!(w.events.len() > 1000);
/// ```
pub fn data_dependent_pipeline() -> Workload {
    let mut g = Gen::new(0xdada_0002);
    for _ in 0..300 {
        // skewed: min of two uniforms, then a rare burst
        let k = 1 + g.below(16).min(g.below(16));
        let k = if g.below(20) == 0 { 16 } else { k };
        let ws = g.alloc(64 * MIB);
        let input = g.alloc(k * 6 * MIB);
        g.wait_us(1_000);
        let mid = g.alloc(k * 24 * MIB);
        g.wait_us(k * 600);
        g.free(input);
        let out = g.alloc(k * 2 * MIB);
        g.wait_us(k * 300);
        g.free(mid);
        g.free(ws);
        g.wait_us(500);
        g.free(out);
        g.wait_jitter_us(15_000, 10_000);
    }
    g.finish(
        "data-dependent-k",
        "300 requests ~20 ms apart, buffers of k x 6/24/2 MiB with a data-dependent k",
        None,
    )
}

/// The A/B/A pipeline on an 8 GiB device: stage A (30 iterations, 50 ms
/// apart, two 1.5 GiB buffers and a 512 MiB scratch), a 1 s pause, stage B
/// (30 iterations of a 5 GiB and a 1 GiB buffer), a 1 s pause, stage A
/// again. A cache that keeps A's 3.5 GiB leaves B too little room: the
/// pool must free it (trims) before B fits.
///
/// # Examples
///
/// ```
/// let w = decaying_pool::trace::workloads::aba_pipeline();
/// assert_eq!(w.capacity, Some(8 << 30));
/// ```
pub fn aba_pipeline() -> Workload {
    let mut g = Gen::new(0xaba0_0003);
    let stage_a = |g: &mut Gen| {
        for _ in 0..30 {
            let x = g.alloc(3 * GIB / 2);
            let y = g.alloc(3 * GIB / 2);
            let s = g.alloc(512 * MIB);
            g.wait_jitter_us(20_000, 2_000);
            g.free(s);
            g.free(x);
            g.wait_us(5_000);
            g.free(y);
            g.wait_us(25_000);
        }
    };
    stage_a(&mut g);
    g.wait_us(1_000_000);
    for _ in 0..30 {
        let big = g.alloc(5 * GIB);
        let aux = g.alloc(GIB);
        g.wait_jitter_us(30_000, 3_000);
        g.free(aux);
        g.free(big);
        g.wait_us(20_000);
    }
    g.wait_us(1_000_000);
    stage_a(&mut g);
    g.finish(
        "aba-8gib",
        "stage A (2 x 1.5 GiB + 512 MiB), 1 s pause, stage B (5 GiB + 1 GiB), 1 s pause, A again, on an 8 GiB device",
        Some(8 << 30),
    )
}
