//! A program built with `panic = "abort"` (this crate's profiles), as
//! release binaries often are: a packed `SharedPool` makes its backing
//! calls outside its packing lock there too, so while one thread's miss is
//! held inside the backing allocator, another thread's 1 000 hits go on.
//! `.ci/run` runs it (`cargo run --manifest-path tests/panic_abort/Cargo.toml`);
//! it exits with a failure, or aborts, when a hit waits.

use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use decaying_pool::testing::CheckingAllocator;
use decaying_pool::{DecayingPool, FixedTime, Packable, Packing, RawAllocator, SharedPool};

/// Holds every `allocate` of at least `from` bytes while closed, counting
/// the calls inside.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl Gate {
    fn set(&self, closed: bool) {
        self.state.lock().unwrap().0 = closed;
        self.changed.notify_all();
    }

    fn inside(&self) -> usize {
        self.state.lock().unwrap().1
    }

    fn wait_inside(&self, n: usize) {
        let mut s = self.state.lock().unwrap();
        while s.1 < n {
            s = self.changed.wait(s).unwrap();
        }
    }
}

/// A checking allocator behind a [`Gate`].
struct Gated {
    inner: CheckingAllocator,
    gate: Arc<Gate>,
    from: usize,
}

impl RawAllocator for Gated {
    type Block = u64;
    type Error = <CheckingAllocator as RawAllocator>::Error;

    fn allocate(&mut self, size: usize) -> Result<u64, Self::Error> {
        if size >= self.from {
            let mut s = self.gate.state.lock().unwrap();
            s.1 += 1;
            self.gate.changed.notify_all();
            while s.0 {
                s = self.gate.changed.wait(s).unwrap();
            }
            s.1 -= 1;
        }
        self.inner.allocate(size)
    }

    unsafe fn deallocate(&mut self, block: u64, size: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.deallocate(block, size) }
    }
}

impl Packable for Gated {
    fn carve(segment: &u64, offset: usize) -> u64 {
        <CheckingAllocator as Packable>::carve(segment, offset)
    }
    fn address(block: &u64) -> usize {
        <CheckingAllocator as Packable>::address(block)
    }
}

fn main() -> ExitCode {
    assert!(
        cfg!(panic = "abort"),
        "this program checks a build with panic = \"abort\""
    );
    let gate = Arc::new(Gate::default());
    let checking = CheckingAllocator::with_addresses();
    let pool = SharedPool::packed(
        DecayingPool::builder(Gated {
            inner: checking.clone(),
            gate: gate.clone(),
            from: 4 << 20,
        })
        .policy(FixedTime::new(Duration::from_secs(3600)))
        .packing(Packing::default())
        .build(),
    );
    // A 2 MiB segment, below the gate, held by `keep`.
    let keep = pool.allocate(100).unwrap();
    gate.set(true);
    let slow = {
        let pool = pool.clone();
        thread::spawn(move || pool.allocate(64 << 20).map(|b| b.size()))
    };
    gate.wait_inside(1);
    let (tx, rx) = mpsc::channel();
    let fast = {
        let pool = pool.clone();
        thread::spawn(move || {
            for i in 0..1000 {
                drop(pool.allocate(200 + i % 300).unwrap());
            }
            tx.send(pool.stats()).unwrap();
        })
    };
    // Generous: a hit takes well under a microsecond; the bound only keeps
    // a regression (the lock held across the call) from hanging.
    let Ok(during) = rx.recv_timeout(Duration::from_secs(60)) else {
        eprintln!("FAILED: a hit waited for another thread's backing call");
        return ExitCode::FAILURE;
    };
    let held = gate.inside();
    gate.set(false);
    let big = slow.join().unwrap().unwrap();
    fast.join().unwrap();
    let checks = [
        (held == 1, "the miss was still inside its backing call"),
        (during.backing_allocs == 1, "only the segment was allocated"),
        (during.hits >= 1000, "1 000 hits were served"),
        (big == 64 << 20, "the miss was served"),
    ];
    drop(keep);
    drop(pool);
    checking.assert_all_freed();
    let mut ok = true;
    for (passed, what) in checks {
        if !passed {
            eprintln!("FAILED: {what} ({during:?})");
            ok = false;
        }
    }
    if ok {
        println!(
            "panic = \"abort\": {} hits while another thread's miss was inside the allocator",
            during.hits
        );
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
