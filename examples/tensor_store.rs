//! A minimal tensor library whose storage comes from a `SharedPool`: device
//! memory on the GPU when CUDA is available (built with `--features cuda`),
//! host memory from `SystemAllocator` otherwise. It runs a small
//! training-like loop and prints hits, misses, backing calls and bytes over
//! time.
//!
//! ```text
//! cargo run --release --example tensor_store                  # host
//! cargo run --release --example tensor_store --features cuda  # GPU if present
//! ```

use std::time::Duration;

use decaying_pool::{
    DecayingPool, FixedTime, ManualClock, Pooled, SharedPool, Stats, SystemAllocator,
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
            let pool = SharedPool::new(
                DecayingPool::builder(alloc)
                    .policy(ttl)
                    .clock(clock.clone())
                    .build(),
            );
            return Backend::Device(decaying_pool::cuda::SlicePool::new(pool, stream));
        }
        Backend::Host(SharedPool::new(
            DecayingPool::builder(SystemAllocator::new())
                .policy(ttl)
                .clock(clock.clone())
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

    fn stats(&self) -> Stats {
        match self {
            Backend::Host(pool) => pool.stats(),
            #[cfg(feature = "cuda")]
            Backend::Device(slices) => slices.pool().stats(),
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
fn train(backend: &Backend, clock: &ManualClock, steps: usize) -> Vec<Stats> {
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
        history.push(backend.stats());
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
        "{:>5} {:>6} {:>7} {:>10} {:>10} {:>10} {:>11}",
        "step", "hits", "misses", "b.allocs", "b.frees", "held KiB", "pooled KiB"
    );
    let history = train(&backend, &clock, 24);
    for (step, s) in history.iter().enumerate() {
        if step % 4 == 3 {
            println!(
                "{:>5} {:>6} {:>7} {:>10} {:>10} {:>10} {:>11}",
                step + 1,
                s.hits,
                s.misses,
                s.backing_allocs,
                s.backing_deallocs,
                s.bytes_reserved / 1024,
                s.bytes_from_pool / 1024
            );
        }
    }
    clock.advance(Duration::from_secs(1));
    let freed = match &backend {
        Backend::Host(pool) => pool.collect(),
        #[cfg(feature = "cuda")]
        Backend::Device(slices) => slices.pool().collect(),
    };
    let s = backend.stats();
    println!(
        "\nidle 1 s: collect freed {freed} blocks; {} KiB still held",
        s.bytes_reserved / 1024
    );
}

#[test]
fn host_path_serves_repeated_shapes_from_the_pool() {
    let clock = ManualClock::new();
    let backend = Backend::new(&clock);
    let history = train(&backend, &clock, 24);
    let last = history.last().unwrap();
    // Batch sizes cycle through 32, 64, 128: after the first cycle every
    // request is a hit.
    assert!(last.hits > 3 * last.misses, "{last:?}");
    assert_eq!(last.misses, last.backing_allocs);
    assert_eq!(history[11].misses, last.misses, "no miss after warm-up");
}
