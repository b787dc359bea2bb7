//! What a host `mmap` backing allocator's calls cost on this machine, by
//! size: the figures behind the replay's host cost model
//! ([`CostModel::host`](decaying_pool::trace::CostModel::host), `--costs
//! host` on the command line).
//!
//! ```text
//! cargo run --release --example host_costs
//! ```
//!
//! For each size from 4 KiB to 1 GiB it maps a few anonymous private
//! regions in a row (`mmap`), writes one byte to every page of each (the
//! first touch, where the kernel finds and zeroes the pages: `mmap` alone
//! only reserves addresses), then unmaps them (`munmap`), timing each step
//! of each region, and prints the median, least and most. The allocation a
//! pool hit saves is the `mmap` plus the first touch; the free is the
//! `munmap`. The `CostCurve` lines at the end are the medians in the form
//! `CostCurve::new` takes (nanoseconds). The CPU named is the first `model
//! name` of `/proc/cpuinfo`. On a system without `mmap` it says so and
//! exits.

#[cfg(unix)]
fn main() {
    unix::main();
}

#[cfg(not(unix))]
fn main() {
    eprintln!("host_costs measures mmap and munmap, which this system does not have");
}

#[cfg(unix)]
mod unix {
    use std::time::{Duration, Instant};

    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;

    /// The sizes measured (and the host cost model's points).
    const SIZES: [usize; 9] = [
        4 * KIB,
        64 * KIB,
        MIB,
        2 * MIB,
        16 * MIB,
        64 * MIB,
        256 * MIB,
        512 * MIB,
        GIB,
    ];

    /// Regions mapped in a row at `size` (fewer when large).
    fn reps(size: usize) -> usize {
        match size {
            s if s <= 2 * MIB => 64,
            s if s <= 64 * MIB => 16,
            s if s <= 256 * MIB => 6,
            _ => 3,
        }
    }

    fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
    }

    fn cpu() -> String {
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU (no /proc/cpuinfo)".into())
    }

    struct Summary {
        median: Duration,
        least: Duration,
        most: Duration,
    }

    fn summary(mut v: Vec<Duration>) -> Summary {
        v.sort();
        Summary {
            median: v[v.len() / 2],
            least: v[0],
            most: v[v.len() - 1],
        }
    }

    fn us(d: Duration) -> f64 {
        d.as_secs_f64() * 1e6
    }

    fn human(size: usize) -> String {
        match size {
            s if s >= GIB => format!("{} GiB", s / GIB),
            s if s >= MIB => format!("{} MiB", s / MIB),
            s => format!("{} KiB", s / KIB),
        }
    }

    /// (mmap, touch, munmap) per region at `size`; `None` when a mapping
    /// failed.
    fn measure(size: usize, page: usize) -> Option<(Summary, Summary, Summary)> {
        let n = reps(size);
        let (mut maps, mut touches, mut unmaps) = (Vec::new(), Vec::new(), Vec::new());
        let mut regions = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            // SAFETY: an anonymous private mapping of `size` bytes at an
            // address the kernel picks; no existing memory is affected.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            maps.push(t.elapsed());
            if p == libc::MAP_FAILED {
                eprintln!("mmap of {} failed", human(size));
                for (q, s) in regions {
                    // SAFETY: `q` was mapped above with length `s` and is
                    // not used again.
                    unsafe { libc::munmap(q, s) };
                }
                return None;
            }
            let base = p.cast::<u8>();
            let t = Instant::now();
            for off in (0..size).step_by(page) {
                // SAFETY: `off < size`, inside the writable mapping.
                unsafe { base.add(off).write_volatile(1) };
            }
            touches.push(t.elapsed());
            regions.push((p, size));
        }
        for (p, s) in regions {
            let t = Instant::now();
            // SAFETY: `p` was mapped above with length `s` and is not used
            // again.
            unsafe { libc::munmap(p, s) };
            unmaps.push(t.elapsed());
        }
        Some((summary(maps), summary(touches), summary(unmaps)))
    }

    pub(super) fn main() {
        let page = page_size();
        println!(
            "host backing costs: anonymous private mmap, a write to every page, munmap; \
             {} ({} CPUs available), page {} B",
            cpu(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            page
        );
        println!("µs per region, median (least–most)\n");
        println!(
            "{:>8} {:>5} {:>22} {:>30} {:>26} {:>12}",
            "size", "runs", "mmap", "first touch", "munmap", "mmap+touch"
        );
        let mut alloc = Vec::new();
        let mut free = Vec::new();
        for size in SIZES {
            let Some((m, t, u)) = measure(size, page) else {
                continue;
            };
            let cell =
                |s: &Summary| format!("{:.1} ({:.1}–{:.1})", us(s.median), us(s.least), us(s.most));
            println!(
                "{:>8} {:>5} {:>22} {:>30} {:>26} {:>12.1}",
                human(size),
                reps(size),
                cell(&m),
                cell(&t),
                cell(&u),
                us(m.median + t.median)
            );
            alloc.push((size, (m.median + t.median).as_nanos()));
            free.push((size, u.median.as_nanos()));
        }
        let line = |v: &[(usize, u128)]| {
            v.iter()
                .map(|(s, ns)| format!("({s}, {ns})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "\nalloc (mmap + touch), CostCurve points (bytes, ns): {}",
            line(&alloc)
        );
        println!(
            "free (munmap), CostCurve points (bytes, ns): {}",
            line(&free)
        );
    }
}
