//! A minimal tensor library whose storage comes from a packed `SharedPool`
//! (`SharedPool::packed`): device memory on the GPU when CUDA is available
//! (built with `--features cuda`), host memory from `SystemAllocator`
//! otherwise. Tensors up to the medium threshold are carved from segments,
//! so the many shapes of a step share a few backing allocations. It runs a
//! small training-like loop and prints hits, misses, backing calls,
//! segments and bytes over time.
//!
//! ```text
//! cargo run --release --example tensor_store                  # host
//! cargo run --release --example tensor_store --features cuda  # GPU if present
//! ```

use std::time::Duration;

use decaying_pool::{
    DecayingPool, FixedTime, ManualClock, Packing, PackingStats, Pooled, SharedPool, Stats,
    SystemAllocator,
};

/// Where tensors live.
enum Backend {
    Host(SharedPool<SystemAllocator, FixedTime, ManualClock>),
    #[cfg(feature = "cuda")]
    Device(decaying_pool::cuda::SlicePool<FixedTime, ManualClock>),
}

/// A tensor's storage: a pooled block that goes back to the pool on drop.
enum Storage {
    Host(Pooled<SystemAllocator, FixedTime, ManualClock>),
    #[cfg(feature = "cuda")]
    Device(decaying_pool::cuda::PooledSlice<f32, FixedTime, ManualClock>),
}

/// A dense f32 tensor.
struct Tensor {
    shape: Vec<usize>,
    storage: Storage,
}

impl Backend {
    fn new(clock: &ManualClock) -> Backend {
        let ttl = FixedTime::new(Duration::from_millis(500));
        #[cfg(feature = "cuda")]
        if decaying_pool::cuda::available() {
            let alloc = decaying_pool::cuda::DeviceAllocator::new(0).expect("CUDA device 0");
            let stream = alloc.context().default_stream();
            let pool = SharedPool::packed(
                DecayingPool::builder(alloc)
                    .policy(ttl)
                    .clock(clock.clone())
                    .packing(Packing::default())
                    .build(),
            );
            return Backend::Device(decaying_pool::cuda::SlicePool::new(pool, stream));
        }
        Backend::Host(SharedPool::packed(
            DecayingPool::builder(SystemAllocator::new())
                .policy(ttl)
                .clock(clock.clone())
                .packing(Packing::default())
                .build(),
        ))
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Host(_) => "host (SystemAllocator)",
            #[cfg(feature = "cuda")]
            Backend::Device(_) => "GPU 0 (DeviceAllocator)",
        }
    }

    /// A tensor of `shape`, its contents set to `value`.
    fn full(&self, shape: &[usize], value: f32) -> Tensor {
        let len: usize = shape.iter().product();
        let storage = match self {
            Backend::Host(pool) => {
                let block = pool.allocate(len * 4).expect("host allocation");
                let data = block.as_ptr().cast::<f32>();
                for i in 0..len {
                    // SAFETY: the block holds `len` f32 (64-byte aligned) and
                    // belongs to this tensor alone.
                    unsafe { data.add(i).write(value) };
                }
                Storage::Host(block)
            }
            #[cfg(feature = "cuda")]
            Backend::Device(slices) => {
                let mut slice = slices.alloc::<f32>(len).expect("device allocation");
                slices
                    .stream()
                    .memcpy_htod(&vec![value; len], &mut slice)
                    .expect("copy to device");
                Storage::Device(slice)
            }
        };
        Tensor {
            shape: shape.to_vec(),
            storage,
        }
    }

    /// The exact pool's counters: segments and large tensors are its blocks.
    fn stats(&self) -> Stats {
        self.pool_stats().0
    }

    /// The exact pool's counters and the packing counters.
    fn pool_stats(&self) -> (Stats, PackingStats) {
        let (stats, packing) = match self {
            Backend::Host(pool) => (pool.stats(), pool.packing_stats()),
            #[cfg(feature = "cuda")]
            Backend::Device(slices) => (slices.pool().stats(), slices.pool().packing_stats()),
        };
        (stats, packing.expect("a packed pool"))
    }

    /// Runs the policy now; returns the blocks freed.
    fn collect(&self) -> usize {
        match self {
            Backend::Host(pool) => pool.collect(),
            #[cfg(feature = "cuda")]
            Backend::Device(slices) => slices.pool().collect(),
        }
    }
}

impl Tensor {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// The first element, read back from wherever the tensor lives.
    fn first(&self) -> f32 {
        match &self.storage {
            // SAFETY: the block holds at least one initialised f32.
            Storage::Host(block) => unsafe { block.as_ptr().cast::<f32>().read() },
            #[cfg(feature = "cuda")]
            Storage::Device(slice) => {
                let host = slice.stream().clone_dtoh(&**slice).expect("copy to host");
                host[0]
            }
        }
    }
}

/// A training-like loop: per step, activations for a batch whose size
/// varies, gradients of fixed size, a workspace; the clock moves 100 ms a
/// step. Returns the stats after each step.
fn train(backend: &Backend, clock: &ManualClock, steps: usize) -> Vec<(Stats, PackingStats)> {
    let mut history = Vec::with_capacity(steps);
    let weights = backend.full(&[256, 256], 0.01);
    for step in 0..steps {
        let batch = [32, 64, 32, 128][step % 4];
        let activations = backend.full(&[batch, 256], 1.0);
        let gradients = backend.full(&[256, 256], 0.0);
        let workspace = backend.full(&[batch * 4], 0.0);
        assert_eq!(activations.len(), batch * 256);
        assert_eq!(activations.first(), 1.0);
        assert_eq!(weights.first(), 0.01);
        drop((workspace, gradients, activations));
        clock.advance(Duration::from_millis(100));
        history.push(backend.pool_stats());
    }
    history
}

fn main() {
    let clock = ManualClock::new();
    let backend = Backend::new(&clock);
    println!(
        "tensor store on {}: FixedTime(500 ms), 100 ms per step\n",
        backend.name()
    );
    println!(
        "{:>5} {:>7} {:>9} {:>10} {:>10} {:>10} {:>12} {:>13}",
        "step",
        "carved",
        "segments",
        "b.allocs",
        "b.frees",
        "held KiB",
        "tensors KiB",
        "free seg KiB"
    );
    let history = train(&backend, &clock, 24);
    for (step, (s, p)) in history.iter().enumerate() {
        if step % 4 == 3 {
            println!(
                "{:>5} {:>7} {:>9} {:>10} {:>10} {:>10} {:>12} {:>13}",
                step + 1,
                p.carved,
                p.segments,
                s.backing_allocs,
                s.backing_deallocs,
                s.bytes_reserved / 1024,
                p.bytes_requested / 1024,
                p.free_segment_bytes / 1024
            );
        }
    }
    clock.advance(Duration::from_secs(1));
    let freed = backend.collect();
    let s = backend.stats();
    println!(
        "\nidle 1 s: collect freed {freed} blocks; {} KiB still held",
        s.bytes_reserved / 1024
    );
}

#[test]
fn host_path_packs_every_shape_into_a_few_segments() {
    let clock = ManualClock::new();
    let backend = Backend::new(&clock);
    let history = train(&backend, &clock, 24);
    let (last, packing) = history.last().unwrap();
    // Every tensor (at most 256 KiB) is carved: the weights, then three
    // per step.
    assert_eq!(packing.requests, 1 + 3 * 24, "{packing:?}");
    assert_eq!(packing.carved, packing.requests, "{packing:?}");
    // Five tensor sizes, yet a single segment holds a step's working set:
    // one backing allocation, none after the first step.
    assert_eq!(last.backing_allocs, 1, "{last:?}");
    assert_eq!(history[0].0.backing_allocs, last.backing_allocs);
    assert_eq!(last.backing_deallocs, 0);
    drop(history);
    // Idle past the period: the emptied segment decays.
    clock.advance(Duration::from_secs(1));
    assert_eq!(backend.collect(), 1);
    assert_eq!(backend.stats().bytes_reserved, 0);
}
