//! Tests through the C entry points, on the host backend.
//!
//! The library's state is global: every test takes [`SERIAL`] and starts
//! from a fresh configuration ([`fresh`]), so they run one at a time in the
//! test process whatever the harness's thread count.

use core::ffi::{c_char, c_void};
use std::collections::{BTreeMap, HashSet};
use std::ffi::{CStr, CString};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;

use crate::state::{DEVICE_COUNT, LIBRARY};
use crate::*;

/// One test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the test lock and configures `config` on a clean state: whatever
/// an earlier (failed) test left is dropped, the device count forgotten.
fn fresh(config: &str) -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    *LIBRARY.write().unwrap_or_else(PoisonError::into_inner) = None;
    crate::state::lock(&crate::RETIRED).clear();
    DEVICE_COUNT.store(-1, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(configure_str(config), 0, "{:?}", last_error());
    guard
}

fn configure_str(config: &str) -> i32 {
    let c = CString::new(config).unwrap();
    // SAFETY: `c` is a NUL-terminated string, live for the call.
    unsafe { dp_configure(c.as_ptr()) }
}

fn last_error() -> Option<String> {
    let p = dp_last_error();
    // SAFETY: a non-null message is a NUL-terminated string valid until the
    // next call into the library on this thread; copied at once.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn stream(n: usize) -> *mut c_void {
    core::ptr::without_provenance_mut(n)
}

fn stats(device: i32) -> Value {
    // SAFETY: a NULL buffer of length 0: nothing is written.
    let needed = unsafe { dp_stats_json(device, core::ptr::null_mut(), 0) };
    assert!(needed > 0, "{:?}", last_error());
    let mut buf = vec![0u8; needed];
    // SAFETY: `buf` has `needed` writable bytes.
    let again = unsafe { dp_stats_json(device, buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    // The figures may change between the calls only if something runs.
    assert!(again <= needed + 64, "{again} {needed}");
    let text = CStr::from_bytes_until_nul(&buf).unwrap().to_str().unwrap();
    serde_json::from_str(text).unwrap()
}

fn num(v: &Value, path: &[&str]) -> u64 {
    let mut v = v;
    for k in path {
        v = &v[*k];
    }
    v.as_u64().unwrap_or_else(|| panic!("{path:?} in {v}"))
}

/// A tiny xorshift generator, per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn threads_and_streams_round_trip() {
    let _g = fresh("backend=host,reaper=50ms");
    // Live ranges of all threads: [start, end) by start.
    let live: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|s| {
        for t in 0..8usize {
            let live = &live;
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9 + t as u64);
                let device = (t % 2) as i32;
                let st = stream(0x1000 * (t + 1));
                let mut mine: Vec<(*mut c_void, usize, u8)> = Vec::new();
                for i in 0..400 {
                    if mine.len() < 12 && (!rng.next().is_multiple_of(3) || mine.is_empty()) {
                        let size = match rng.next() % 4 {
                            0 => 1 + (rng.next() % 4096) as usize,
                            1 => 1 + (rng.next() % (256 << 10)) as usize,
                            2 => 1 + (rng.next() % (3 << 20)) as usize,
                            _ => (1 << 20) + (rng.next() % (8 << 20)) as usize,
                        };
                        let p = dp_malloc(size, device, st);
                        assert!(!p.is_null(), "{:?}", last_error());
                        let a = p.addr();
                        {
                            let mut l = live.lock().unwrap();
                            let before = l.range(..a + size).next_back();
                            assert!(
                                before.is_none_or(|(&s0, &e0)| e0 <= a || s0 >= a + size),
                                "{a:#x}+{size} overlaps {before:?}"
                            );
                            l.insert(a, a + size);
                        }
                        let byte = (t * 31 + i) as u8;
                        // SAFETY: `p` is `size` writable host bytes, ours
                        // until freed.
                        unsafe { p.cast::<u8>().write_bytes(byte, size) };
                        mine.push((p, size, byte));
                    } else {
                        let k = (rng.next() as usize) % mine.len();
                        let (p, size, byte) = mine.swap_remove(k);
                        // SAFETY: as above: ours, `size` bytes, written.
                        let bytes = unsafe { core::slice::from_raw_parts(p.cast::<u8>(), size) };
                        assert!(bytes.iter().all(|&b| b == byte), "block {p:p} overwritten");
                        live.lock().unwrap().remove(&p.addr());
                        dp_free(p, size, device, st);
                        assert_eq!(last_error(), None);
                    }
                }
                for (p, size, _) in mine {
                    live.lock().unwrap().remove(&p.addr());
                    dp_free(p, size, device, st);
                }
            });
        }
    });
    for device in [0, 1] {
        let s = stats(device);
        assert_eq!(num(&s, &["pools"]), 4, "{s}");
        assert_eq!(num(&s, &["stats", "bytes_in_use"]), 0, "{s}");
        assert_eq!(num(&s, &["stats", "blocks_in_use"]), 0, "{s}");
        assert_eq!(num(&s, &["packing", "packed_blocks"]), 0, "{s}");
        assert!(num(&s, &["stats", "hits"]) > 0, "{s}");
    }
    dp_empty_cache();
    for device in [0, 1] {
        let s = stats(device);
        assert_eq!(num(&s, &["stats", "bytes_reserved"]), 0, "{s}");
        assert_eq!(num(&s, &["reserved"]), 0, "{s}");
    }
}

#[test]
fn bad_input_is_refused_with_a_message() {
    let _g = fresh("backend=host,reaper=off");
    // Size 0: NULL, no message.
    assert!(dp_malloc(0, 0, stream(0)).is_null());
    assert_eq!(last_error(), None);
    // Too large.
    assert!(dp_malloc(usize::MAX, 0, stream(0)).is_null());
    let e = last_error().unwrap();
    assert!(e.starts_with("dp_malloc: "), "{e}");
    // A bad device.
    assert!(dp_malloc(64, -1, stream(0)).is_null());
    assert!(last_error().unwrap().contains("device -1"));
    dp_init(2);
    assert_eq!(last_error(), None);
    assert!(dp_malloc(64, 2, stream(0)).is_null());
    assert!(last_error().unwrap().contains("dp_init"));
    dp_init(-3);
    assert!(last_error().unwrap().contains("-3"));
    // Frees: NULL, unknown, double, wrong size.
    dp_free(core::ptr::null_mut(), 0, 0, stream(0));
    assert_eq!(last_error(), None);
    let mut local = [0u8; 64];
    dp_free(local.as_mut_ptr().cast(), 64, 0, stream(0));
    assert!(last_error().unwrap().contains("not handed out"));
    let p = dp_malloc(100, 1, stream(7));
    assert!(!p.is_null());
    dp_free(p, 100, 1, stream(7));
    assert_eq!(last_error(), None);
    dp_free(p, 100, 1, stream(7));
    assert!(last_error().unwrap().contains("freed already"));
    let p = dp_malloc(300, 0, stream(0));
    dp_free(p, 200, 0, stream(0));
    let e = last_error().unwrap();
    assert!(e.contains("300") && e.contains("200"), "{e}");
    assert_eq!(num(&stats(0), &["stats", "bytes_in_use"]), 0);
    // Record a stream of a pointer not handed out.
    dp_record_stream(local.as_mut_ptr().cast(), stream(9));
    assert!(last_error().unwrap().starts_with("dp_record_stream"));
    // Fractions.
    for f in [0.0, -0.5, 1.5, f64::NAN] {
        dp_set_memory_fraction(f, 0);
        assert!(last_error().unwrap().contains("fraction"), "{f}");
    }
    // Configurations: an unknown key, a bad value, NULL, while allocated.
    assert_eq!(configure_str("backend=host,colour=blue"), -1);
    assert!(last_error().unwrap().contains("colour"));
    assert_eq!(configure_str("limit=12"), -1);
    assert!(last_error().unwrap().contains("limit"));
    // SAFETY: NULL is allowed.
    assert_eq!(unsafe { dp_configure(core::ptr::null()) }, -1);
    let p = dp_malloc(4096, 0, stream(0));
    assert_eq!(configure_str("backend=host"), -1);
    assert!(last_error().unwrap().contains("allocated"));
    dp_free(p, 4096, 0, stream(0));
    assert_eq!(configure_str("backend=host,reaper=off"), 0);
    // Stats of a bad device.
    // SAFETY: NULL buffer.
    assert_eq!(unsafe { dp_stats_json(-2, core::ptr::null_mut(), 0) }, 0);
    assert!(last_error().unwrap().contains("-2"));
}

#[test]
fn stats_json_adds_up() {
    let _g = fresh("backend=host,reaper=off,policy=ttl:10s,gc_threshold=0.9");
    let mut blocks = Vec::new();
    for (i, size) in [100usize, 5000, 70_000, 2 << 20, 20 << 20]
        .into_iter()
        .enumerate()
    {
        for st in [stream(0), stream(0xabc)] {
            let p = dp_malloc(size + i, 0, st);
            assert!(!p.is_null());
            blocks.push((p, size + i, st));
        }
    }
    let s = stats(0);
    assert_eq!(s["backend"], "host");
    assert_eq!(s["policy"], "fixed-time 10s");
    assert_eq!(s["gc_threshold"], 0.9);
    assert_eq!(num(&s, &["pools"]), 2);
    let streams = s["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 2);
    assert_eq!(num(&streams[0], &["stream"]), 0);
    assert_eq!(num(&streams[1], &["stream"]), 0xabc);
    for key in [
        "hits",
        "misses",
        "bytes_in_use",
        "bytes_reserved",
        "backing_allocs",
    ] {
        let sum: u64 = streams.iter().map(|p| num(p, &["stats", key])).sum();
        assert_eq!(sum, num(&s, &["stats", key]), "{key}");
    }
    for key in [
        "requests",
        "packed_blocks",
        "segment_bytes",
        "bytes_requested",
    ] {
        let sum: u64 = streams.iter().map(|p| num(p, &["packing", key])).sum();
        assert_eq!(sum, num(&s, &["packing", key]), "{key}");
    }
    let requested: u64 = blocks.iter().map(|b| b.1 as u64).sum();
    assert_eq!(num(&s, &["packing", "requests"]), 10);
    assert!(num(&s, &["stats", "bytes_in_use"]) >= requested - (40 << 20));
    assert_eq!(
        num(&s, &["reserved"]),
        num(&s, &["stats", "bytes_reserved"])
    );
    assert_eq!(num(&s, &["library_live_pointers"]), 10);
    // A buffer too small holds "", and the size is still returned.
    let mut small = [b'x'; 8];
    // SAFETY: 8 writable bytes.
    let needed = unsafe { dp_stats_json(0, small.as_mut_ptr().cast(), small.len()) };
    assert!(needed > 8);
    assert_eq!(small[0], 0);
    for (p, size, st) in blocks {
        dp_free(p, size, 0, st);
    }
    let s = stats(0);
    assert_eq!(num(&s, &["stats", "bytes_in_use"]), 0);
    assert!(num(&s, &["stats", "bytes_cached"]) > 0);
    dp_empty_cache();
    assert_eq!(num(&stats(0), &["stats", "bytes_reserved"]), 0);
    // A device no pool used: zeros.
    let s = stats(5);
    assert_eq!(num(&s, &["pools"]), 0);
    assert_eq!(num(&s, &["stats", "hits"]), 0);
}

#[test]
fn memory_fraction_holds_across_streams() {
    let _g = fresh("backend=host,reaper=off,packing=off,policy=keep-all");
    // Open device 0 to learn its capacity.
    let p = dp_malloc(1, 0, stream(0));
    dp_free(p, 1, 0, stream(0));
    let capacity = num(&stats(0), &["capacity"]) as f64;
    let fraction = (8u64 << 20) as f64 / capacity;
    dp_set_memory_fraction(fraction, 0);
    assert_eq!(last_error(), None);
    let limit = num(&stats(0), &["limit"]);
    assert!(limit.abs_diff(8 << 20) < 4096, "{limit}");
    // 5 MiB on one stream, 5 MiB more on another: over the device's limit.
    let a = dp_malloc(5 << 20, 0, stream(1));
    assert!(!a.is_null(), "{:?}", last_error());
    assert!(dp_malloc(5 << 20, 0, stream(2)).is_null());
    assert!(last_error().unwrap().contains("limit"));
    // Beyond the limit at all: refused at once.
    assert!(dp_malloc(9 << 20, 0, stream(3)).is_null());
    // Freed (and cached by keep-all on stream 1), the other stream's miss
    // makes stream 1's pool give its idle block back and succeeds.
    dp_free(a, 5 << 20, 0, stream(1));
    let b = dp_malloc(5 << 20, 0, stream(2));
    assert!(!b.is_null(), "{:?}", last_error());
    let s = stats(0);
    assert!(num(&s, &["reserved"]) <= limit, "{s}");
    dp_free(b, 5 << 20, 0, stream(2));
    // A configured limit, packed: the same device-wide rule.
    assert_eq!(configure_str("backend=host,reaper=off,limit=4MiB"), 0);
    let a = dp_malloc(3 << 20, 0, stream(1));
    assert!(!a.is_null());
    // Device 1 has its own limit; device 0 is full.
    let c = dp_malloc(3 << 20, 1, stream(1));
    assert!(!c.is_null(), "{:?}", last_error());
    assert!(dp_malloc(3 << 20, 0, stream(2)).is_null());
    dp_free(a, 3 << 20, 0, stream(1));
    assert_eq!(
        configure_str("backend=host,reaper=off"),
        -1,
        "a block of device 1 is live"
    );
    assert_eq!(num(&stats(1), &["stats", "blocks_in_use"]), 1);
    dp_free(c, 3 << 20, 1, stream(1));
    assert_eq!(configure_str("backend=host,reaper=off"), 0);
}

#[test]
fn record_stream_on_the_host_releases_at_once() {
    let _g = fresh("backend=host,reaper=off");
    let p = dp_malloc(1000, 0, stream(1));
    dp_record_stream(p, stream(2));
    dp_record_stream(p, stream(1)); // its own stream: nothing
    assert_eq!(last_error(), None);
    dp_free(p, 1000, 0, stream(1));
    let s = stats(0);
    assert_eq!(num(&s, &["pending_blocks"]), 0);
    assert_eq!(num(&s, &["stats", "bytes_in_use"]), 0);
    // CuPy's pair: the default stream's pool.
    let q = dp_cupy_malloc(core::ptr::null_mut(), 2000, 0);
    assert!(!q.is_null());
    let s = stats(0);
    assert_eq!(num(&s, &["pools"]), 2);
    assert_eq!(s["streams"][0]["stream"], 0);
    dp_cupy_free(core::ptr::null_mut(), q, 0);
    assert_eq!(last_error(), None);
    dp_cupy_free(core::ptr::null_mut(), q, 0);
    assert!(last_error().unwrap().starts_with("dp_cupy_free"));
}

#[test]
fn pinned_memory_has_a_pool_of_its_own() {
    let _g = fresh("backend=host,reaper=off");
    assert!(dp_pinned_malloc(0).is_null());
    assert_eq!(last_error(), None);
    let a = dp_pinned_malloc(5000);
    assert!(!a.is_null(), "{:?}", last_error());
    // SAFETY: `a` is 5000 writable bytes of host memory (backend=host).
    unsafe { core::ptr::write_bytes(a.cast::<u8>(), 0xA5, 5000) };
    let b = dp_pinned_malloc(5000);
    assert!(!b.is_null() && b != a);
    let s = stats(-1);
    assert_eq!(num(&s, &["stats", "bytes_in_use"]), 10240, "{s}"); // two 512-byte-unit blocks
    assert_eq!(num(&s, &["pools"]), 1);
    // The devices' figures do not count it.
    assert_eq!(num(&stats(0), &["stats", "bytes_in_use"]), 0);
    dp_pinned_free(a);
    dp_pinned_free(b);
    assert_eq!(last_error(), None);
    dp_pinned_free(b);
    assert!(last_error().unwrap().starts_with("dp_pinned_free"));
    dp_pinned_free(core::ptr::null_mut());
    assert_eq!(last_error(), None);
    // A hit: the same block again (carved from the segment still held).
    let hits = num(&stats(-1), &["stats", "hits"]);
    let c = dp_pinned_malloc(5000);
    assert!(c == a || c == b);
    assert_eq!(num(&stats(-1), &["stats", "hits"]), hits + 1);
    assert_eq!(num(&stats(-1), &["stats", "backing_allocs"]), 1);
    assert!(dp_pinned_malloc(usize::MAX).is_null());
    assert!(last_error().unwrap().starts_with("dp_pinned_malloc"));
    dp_pinned_free(c);
    dp_empty_cache();
    assert_eq!(num(&stats(-1), &["stats", "bytes_reserved"]), 0);
    // Not a device of dp_malloc.
    assert!(dp_malloc(100, -1, stream(0)).is_null());
    assert!(last_error().is_some());
}

#[test]
fn record_writes_a_balanced_trace() {
    let path = std::env::temp_dir().join(format!("decaying-pool-ffi-{}.trace", std::process::id()));
    let _g = fresh(&format!(
        "backend=host,reaper=off,record={}",
        path.display()
    ));
    std::thread::scope(|s| {
        for t in 0..4usize {
            s.spawn(move || {
                for i in 0..50 {
                    let size = 100 + 997 * i + t;
                    let p = dp_malloc(size, 0, stream(t));
                    assert!(!p.is_null());
                    dp_free(p, size, 0, stream(t));
                }
            });
        }
    });
    dp_empty_cache();
    let file = std::fs::File::open(&path).unwrap();
    let reader = dp::trace::TraceReader::new(std::io::BufReader::new(file)).unwrap();
    let mut live = HashSet::new();
    let (mut allocs, mut frees) = (0, 0);
    for e in reader {
        let e = e.unwrap();
        match e.op {
            dp::trace::Op::Alloc => {
                allocs += 1;
                assert!(live.insert(e.addr), "{e:?}");
            }
            dp::trace::Op::Free => {
                frees += 1;
                assert!(live.remove(&e.addr), "{e:?}");
            }
        }
    }
    assert_eq!((allocs, frees), (200, 200));
    assert!(live.is_empty());
    assert_eq!(
        configure_str("backend=host,record=/nonexistent-dir/x.trace"),
        -1
    );
    assert!(last_error().unwrap().contains("record"));
    let _ = std::fs::remove_file(&path);
}

/// The `dp_` functions a text declares (`dp_x(` after a return type) or
/// defines (`extern "C" fn dp_x(`).
fn dp_names(text: &str, marker: &str) -> Vec<String> {
    let mut names: Vec<String> = text
        .lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| {
            let at = l.find("dp_")?;
            let rest = &l[at..];
            let end = rest.find('(')?;
            let name = &rest[..end];
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| name.to_owned())
        })
        .collect();
    names.sort();
    names
}

#[test]
fn the_header_declares_exactly_the_exports() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let header = std::fs::read_to_string(format!("{dir}/include/decaying_pool.h")).unwrap();
    // Prototypes: lines that start with a type and end with `);`.
    let declared: Vec<String> = dp_names(&header, ");")
        .into_iter()
        .filter(|n| header.contains(&format!(" {n}(")) || header.contains(&format!("*{n}(")))
        .collect();
    let source = std::fs::read_to_string(format!("{dir}/src/lib.rs")).unwrap();
    let exported = dp_names(&source, "extern \"C\" fn dp_");
    let no_mangle = source.matches("#[unsafe(no_mangle)]").count();
    assert_eq!(
        no_mangle,
        exported.len(),
        "every no_mangle item is a dp_ function"
    );
    let contract = [
        "dp_configure",
        "dp_cupy_free",
        "dp_cupy_malloc",
        "dp_empty_cache",
        "dp_free",
        "dp_init",
        "dp_last_error",
        "dp_malloc",
        "dp_pinned_free",
        "dp_pinned_malloc",
        "dp_record_stream",
        "dp_set_memory_fraction",
        "dp_stats_json",
    ];
    assert_eq!(exported, contract);
    assert_eq!(declared, contract);
    // The built library, when there is one built from this source (not
    // older than `lib.rs`) and `nm` is installed.
    let modified = |path: &str| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let source_time = modified(&format!("{dir}/src/lib.rs"));
    for profile in ["debug", "release"] {
        let so = format!("{dir}/../target/{profile}/libdecaying_pool.so");
        if modified(&so) < source_time {
            continue;
        }
        let Ok(out) = std::process::Command::new("nm")
            .args(["-D", "--defined-only", &so])
            .output()
        else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        let mut symbols: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .filter(|s| s.starts_with("dp_"))
            .map(str::to_owned)
            .collect();
        symbols.sort();
        assert_eq!(symbols, contract, "{so}");
    }
}

#[test]
fn the_cuda_backend_without_a_driver_fails_with_a_message() {
    let _g = fresh("backend=cuda,reaper=off");
    if dp::cuda::available() {
        return; // covered by `cuda_record_stream_holds_blocks_back`
    }
    assert!(dp_malloc(1 << 20, 0, stream(0)).is_null());
    let e = last_error().unwrap();
    assert!(e.contains("CUDA is not available"), "{e}");
    dp_set_memory_fraction(0.5, 0);
    assert!(last_error().unwrap().contains("CUDA"));
    // Statistics still answer (no device opened).
    assert_eq!(num(&stats(0), &["pools"]), 0);
}

#[test]
fn cuda_record_stream_holds_blocks_back() {
    if !dp::cuda::available() {
        eprintln!("no CUDA device: skipping");
        return;
    }
    let _g = fresh("backend=cuda,reaper=off");
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let (s1, s2) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let (h1, h2) = (
        s1.cu_stream().cast::<c_void>(),
        s2.cu_stream().cast::<c_void>(),
    );
    let p = dp_malloc(4 << 20, 0, h1);
    assert!(!p.is_null(), "{:?}", last_error());
    dp_record_stream(p, h2);
    assert_eq!(last_error(), None);
    dp_free(p, 4 << 20, 0, h1);
    assert_eq!(last_error(), None);
    // Held back until the event on s2 completes (at once on idle streams,
    // seen by the pool's next call or by dp_empty_cache, which waits).
    dp_empty_cache();
    let s = stats(0);
    assert_eq!(num(&s, &["pending_blocks"]), 0, "{s}");
    assert_eq!(num(&s, &["stats", "bytes_in_use"]), 0, "{s}");
    assert_eq!(num(&s, &["stats", "bytes_reserved"]), 0, "{s}");
    // A memory fraction of the device.
    dp_set_memory_fraction(0.01, 0);
    let limit = num(&stats(0), &["limit"]) as usize;
    assert!(dp_malloc(limit + 1, 0, h1).is_null());
    let q = dp_malloc(limit / 2, 0, h1);
    assert!(!q.is_null(), "{:?}", last_error());
    dp_free(q, limit / 2, 0, h1);
    dp_empty_cache();
}

/// Runs the test `name` of this file again in a child process, with
/// `DP_CHILD` set, and checks that it exited cleanly: for what would end
/// the test process (an abort) if it went wrong.
fn in_child(name: &str) {
    if std::env::var_os("DP_CHILD").is_some() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("tests::{name}"),
            "--test-threads=1",
            "--nocapture",
        ])
        .env("DP_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_free_from_a_thread_exit_destructor_does_not_abort() {
    use core::cell::Cell;
    use core::sync::atomic::{AtomicUsize, Ordering};

    if std::env::var_os("DP_CHILD").is_none() {
        return in_child("a_free_from_a_thread_exit_destructor_does_not_abort");
    }
    static FREED: AtomicUsize = AtomicUsize::new(0);

    /// A thread-local that frees its block when the thread exits.
    struct FreeOnExit(Cell<usize>);
    impl Drop for FreeOnExit {
        fn drop(&mut self) {
            let p = self.0.get();
            if p != 0 {
                dp_free(
                    core::ptr::with_exposed_provenance_mut(p),
                    4096,
                    0,
                    stream(0),
                );
                FREED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    thread_local! {
        static HOLDER: FreeOnExit = const { FreeOnExit(Cell::new(0)) };
    }
    /// A pthread key's destructor: runs after every thread-local of the
    /// thread is gone, the library's message slot included.
    ///
    /// # Safety
    ///
    /// `p` is a block of 4096 bytes from `dp_malloc` not freed yet (the
    /// thread library passes the key's value once, at the thread's exit).
    unsafe extern "C" fn free_key(p: *mut c_void) {
        dp_free(p, 4096, 0, stream(0));
        FREED.fetch_add(1, Ordering::Relaxed);
    }

    let _g = fresh("backend=host,reaper=off");
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is writable; `free_key` has the destructor's type.
    let made = unsafe { libc::pthread_key_create(&mut key, Some(free_key)) };
    assert_eq!(made, 0);
    std::thread::spawn(move || {
        // The holder's destructor is registered first, so it runs after
        // the library's message slot (made by the call below) is gone.
        HOLDER.with(|h| h.0.set(0));
        let p = dp_malloc(4096, 0, stream(0));
        assert!(!p.is_null(), "{:?}", last_error());
        HOLDER.with(|h| h.0.set(p.expose_provenance()));
        let q = dp_malloc(4096, 0, stream(0));
        assert!(!q.is_null(), "{:?}", last_error());
        // SAFETY: `key` was made above; `q` stays live until its destructor.
        assert_eq!(unsafe { libc::pthread_setspecific(key, q) }, 0);
    })
    .join()
    .unwrap();
    assert_eq!(FREED.load(Ordering::Relaxed), 2);
    let s = stats(0);
    assert_eq!(num(&s, &["stats", "bytes_in_use"]), 0, "{s}");
    assert_eq!(num(&s, &["stats", "blocks_in_use"]), 0, "{s}");
    println!("both blocks freed at thread exit");
}

#[test]
fn every_pointer_is_aligned_to_256_bytes() {
    for config in [
        "backend=host,reaper=off",
        "backend=host,reaper=off,packing=off",
        "backend=host,reaper=off,packing.granularity=256B",
        "backend=host,reaper=off,packing=small:1MiB;granularity:256B,policy=keep-all",
    ] {
        let _g = fresh(config);
        let mut held = Vec::new();
        for size in [
            1,
            3,
            100,
            255,
            257,
            1000,
            4097,
            70_000,
            1 << 20,
            (3 << 20) + 5,
        ] {
            for _ in 0..3 {
                let p = dp_malloc(size, 0, stream(0));
                assert!(!p.is_null(), "{config}: {size}: {:?}", last_error());
                assert_eq!(p.addr() % config::MIN_ALIGN, 0, "{config}: {size} at {p:p}");
                held.push((p, size));
            }
        }
        for (p, size) in held {
            dp_free(p, size, 0, stream(0));
            assert_eq!(last_error(), None);
        }
    }
    // Smaller granularities are refused, with a message.
    let _g = fresh("backend=host,reaper=off");
    for config in ["packing.granularity=1B", "packing.granularity=64B"] {
        assert_eq!(configure_str(&format!("backend=host,{config}")), -1);
        let e = last_error().unwrap();
        assert!(e.starts_with("dp_configure: packing.granularity"), "{e}");
    }
}

#[test]
fn messages_name_their_entry_point_and_say_out_of_memory() {
    let _g = fresh("backend=host,reaper=off,limit=1MiB");
    // CuPy's entry points name themselves.
    assert!(dp_cupy_malloc(core::ptr::null_mut(), 64, -1).is_null());
    let e = last_error().unwrap();
    assert!(e.starts_with("dp_cupy_malloc: "), "{e}");
    // Over the limit: out of memory, the limit and the bytes reserved.
    let held = dp_malloc(600 << 10, 0, stream(0));
    assert!(!held.is_null(), "{:?}", last_error());
    for (size, name) in [(2 << 20, "dp_malloc"), (700 << 10, "dp_malloc")] {
        assert!(dp_malloc(size, 0, stream(0)).is_null());
        let e = last_error().unwrap();
        assert!(
            e.starts_with(&format!("{name}: out of memory: ")) && e.contains("limit 1048576 bytes"),
            "{e}"
        );
        let reserved = num(&stats(0), &["reserved"]);
        assert!(e.contains(&format!("{reserved} bytes reserved")), "{e}");
    }
    assert!(dp_cupy_malloc(core::ptr::null_mut(), 2 << 20, 0).is_null());
    let e = last_error().unwrap();
    assert!(e.starts_with("dp_cupy_malloc: out of memory: "), "{e}");
    dp_free(held, 600 << 10, 0, stream(0));
    // A key given twice.
    assert_eq!(configure_str("backend=host,backend=cuda"), -1);
    let e = last_error().unwrap();
    assert!(e.contains("backend: given twice"), "{e}");
}

/// Threads allocate and free while another thread configures again and
/// again: a `dp_malloc` that took the state a `dp_configure` then replaced
/// registers its block in the replaced state, and its `dp_free` still
/// finds it there (no "not handed out" message, no block lost); once every
/// block is back, no replaced state is left, and the current one holds no
/// block.
#[test]
fn configure_while_threads_allocate_loses_no_block() {
    let _g = fresh("backend=host,reaper=off");
    let done = std::sync::atomic::AtomicBool::new(false);
    let (mut configured, mut refused) = (0, 0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..3usize)
            .map(|t| {
                let done = &done;
                s.spawn(move || {
                    let mut rng = Rng(0x51ED + t as u64);
                    let mut trips = 0u64;
                    while !done.load(std::sync::atomic::Ordering::Relaxed) || trips < 100 {
                        let size = 1 + (rng.next() % (512 << 10)) as usize;
                        let p = dp_malloc(size, 0, stream(t));
                        assert!(!p.is_null(), "{:?}", last_error());
                        // SAFETY: `size` writable host bytes, ours until freed.
                        unsafe { p.cast::<u8>().write_bytes(t as u8, size) };
                        dp_free(p, size, 0, stream(t));
                        assert_eq!(last_error(), None, "thread {t}, trip {trips}");
                        trips += 1;
                    }
                    trips
                })
            })
            .collect();
        for i in 0..300 {
            let config = if i % 2 == 0 {
                "backend=host,reaper=off,packing=off"
            } else {
                "backend=host,reaper=off"
            };
            if configure_str(config) == 0 {
                configured += 1;
            } else {
                let e = last_error().unwrap();
                assert!(e.contains("blocks are allocated"), "{e}");
                refused += 1;
            }
            std::thread::yield_now();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in workers {
            assert!(w.join().unwrap() >= 100);
        }
    });
    assert!(configured > 0, "{configured} configured, {refused} refused");
    assert_eq!(
        configure_str("backend=host,reaper=off"),
        0,
        "{:?}",
        last_error()
    );
    assert!(
        crate::state::lock(&crate::RETIRED).is_empty(),
        "a replaced state is still held"
    );
    let s = stats(0);
    assert_eq!(num(&s, &["stats", "blocks_in_use"]), 0, "{s}");
}
