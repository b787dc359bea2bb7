//! `trace::LoggingAllocator`: a program records its own workload, and the trace
//! replays to the backing calls the live program made; PyTorch snapshot
//! pickles read as their CSV conversion; stream selection.
//!
//! `snapshot_pickle_reads_as_its_csv_conversion` reads a PyTorch snapshot
//! and its CSV conversion from `../shared/workloads` (the project's shared
//! workloads folder, beside the repository, not in the packaged crate);
//! when a file is absent it prints `skipped` and passes without checking
//! it.

use core::time::Duration;

use decaying_pool::testing::CheckingAllocator;
use decaying_pool::trace::{
    Config, Event, LoggingAllocator, PolicyKind, ReadOptions, ReplayOptions, Replayer, TraceReader,
    snapshot_to_csv,
};
use decaying_pool::{DecayingPool, FixedTime, ManualClock, RawAllocator};

/// A training-like loop with a size that changes, idle phases and an
/// overlap, driven through a recording wrapped around the pool.
#[test]
fn recorded_trace_replays_to_the_live_backing_calls() {
    let ttl = Duration::from_millis(50);
    let clock = ManualClock::new();
    let backing = CheckingAllocator::new();
    let pool = DecayingPool::builder(backing)
        .policy(FixedTime::new(ttl))
        .clock(clock.clone())
        .build();
    // One line: the program's allocator is now recorded.
    let mut rec = LoggingAllocator::with_clock(pool, Vec::new(), clock.clone()).unwrap();

    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut live = Vec::new();
    for step in 0..300u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let size = [4096, 1 << 20, 3 << 20, 65536][(rng % 4) as usize] * (1 + step / 150) as usize;
        live.push((rec.allocate(size).unwrap(), size));
        if rng % 3 != 0 {
            let (b, s) = live.remove((rng as usize / 7) % live.len());
            // SAFETY: `b` came from `rec.allocate(s)` and leaves `live` here.
            unsafe { rec.deallocate(b, s) };
        }
        clock.advance(Duration::from_millis(if step % 40 == 39 { 120 } else { 3 }));
    }
    for (b, s) in live.drain(..) {
        // SAFETY: as above.
        unsafe { rec.deallocate(b, s) };
    }
    let (pool, trace) = rec.finish().unwrap();
    let live_stats = pool.stats();
    assert!(
        live_stats.evictions > 0 && live_stats.hits > 0,
        "{live_stats:?}"
    );

    let mut replayer = Replayer::new(
        &[Config::new(PolicyKind::FixedTime(ttl))],
        ReplayOptions::default(),
    );
    let events: Vec<Event> = TraceReader::new(&trace[..])
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(events.len(), 600);
    for e in &events {
        replayer.event(e);
    }
    let report = &replayer.finish("recorded")[0];
    assert_eq!(report.backing_allocs, live_stats.backing_allocs);
    assert_eq!(report.backing_frees, live_stats.backing_deallocs);
    assert_eq!(report.hits, live_stats.hits);
    assert_eq!(report.evictions, live_stats.evictions);
}

/// Wrapped around the backing allocator, a recording logs exactly the
/// calls that reach it.
#[test]
fn recording_the_backing_allocator_logs_its_calls() {
    let clock = ManualClock::new();
    let mut backing = CheckingAllocator::new();
    let mut text = Vec::new();
    {
        let rec = LoggingAllocator::with_clock(&mut backing, &mut text, clock.clone()).unwrap();
        let mut pool = DecayingPool::builder(rec)
            .policy(FixedTime::new(Duration::from_millis(10)))
            .clock(clock.clone())
            .build();
        for _ in 0..5 {
            let a = pool.allocate(1000).unwrap();
            let b = pool.allocate(2000).unwrap();
            // SAFETY: both came from this pool with these sizes.
            unsafe {
                pool.release(a, 1000);
                pool.release(b, 2000);
            }
            clock.advance(Duration::from_millis(20));
            pool.collect();
        }
    }
    let text = String::from_utf8(text).unwrap();
    let allocs = text.lines().filter(|l| l.contains(",alloc,")).count() as u64;
    let frees = text.lines().filter(|l| l.contains(",free,")).count() as u64;
    assert_eq!((allocs, frees), (backing.allocs(), backing.deallocs()));
    assert_eq!(allocs, 10);
}

/// A write error stops the logging, the allocator keeps working, and
/// `finish` reports it.
#[test]
fn a_write_error_is_reported_by_finish() {
    /// Room for the header line only.
    #[derive(Debug)]
    struct Full(usize);
    impl std::io::Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0 >= buf.len() {
                self.0 -= buf.len();
                Ok(buf.len())
            } else {
                Err(std::io::Error::other("disk full"))
            }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut rec = LoggingAllocator::new(CheckingAllocator::new(), Full(25)).unwrap();
    let b = rec.allocate(64).unwrap();
    assert!(rec.error().is_some());
    // SAFETY: `b` came from `rec.allocate(64)`.
    unsafe { rec.deallocate(b, 64) };
    assert_eq!(rec.inner().live(), 0);
    assert_eq!(rec.finish().unwrap_err().to_string(), "disk full");
}

fn shared(name: &str) -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/workloads")
        .join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: {} is absent", p.display());
        None
    }
}

/// The snapshot pickle PyTorch writes gives exactly the rows of its CSV
/// conversion.
#[test]
fn snapshot_pickle_reads_as_its_csv_conversion() {
    let (Some(pickle), Some(csv)) = (
        shared("pytorch_cs336_medium_ctx128_inference.pickle"),
        shared("pytorch_cs336_medium_ctx128_inference.csv"),
    ) else {
        return;
    };
    let converted = snapshot_to_csv(std::fs::File::open(pickle).unwrap()).unwrap();
    let read = |r: &mut dyn std::io::BufRead| -> Vec<Event> {
        TraceReader::new(r)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let from_pickle = read(&mut &converted[..]);
    let from_csv = read(&mut std::io::BufReader::new(
        std::fs::File::open(csv).unwrap(),
    ));
    assert_eq!(from_pickle.len(), 2560);
    assert_eq!(from_pickle, from_csv);
}

#[test]
fn a_pickle_that_is_not_a_snapshot_is_named_so() {
    // pickle.dumps([1, 2], protocol=2)
    let list = b"\x80\x02]q\x00(K\x01K\x02e.";
    let e = snapshot_to_csv(&list[..]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "not a PyTorch memory snapshot: the pickle is not a dict"
    );
    // pickle.dumps({'segments': []}, protocol=2)
    let no_traces = b"\x80\x02}q\x00X\x08\x00\x00\x00segmentsq\x01]q\x02s.";
    let e = snapshot_to_csv(&no_traces[..]).unwrap_err();
    assert!(e.to_string().contains("no `device_traces`"), "{e}");
    let e = snapshot_to_csv(&b"\x80\x02garbage"[..]).unwrap_err();
    assert!(e.to_string().starts_with("not a readable pickle"), "{e}");
}

/// Protocol 5 as Python writes it (a frame, memoized keys fetched back,
/// shared frames, an address past 2^63, a `None` stream), and pickles
/// nested or shared past what a recursive reader survives: errors, not
/// a stack overflow.
#[test]
fn snapshot_pickles_of_any_shape_read_or_fail_cleanly() {
    // fr = [{'filename': 'a.py', 'line': 1, 'name': 'f'}]
    // pickle.dumps({'segments': [], 'device_traces': [[
    //     {'action': 'alloc', 'addr': 2**64 - 512, 'size': 1 << 40,
    //      'stream': None, 'time_us': 5, 'frames': fr},
    //     {'action': 'free_completed', 'addr': 2**64 - 512, 'size': 1 << 40,
    //      'stream': 2**40, 'time_us': 9, 'frames': fr}]]}, protocol=5)
    let p5 = b"\x80\x05\x95\xeb\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\rdevice_traces\x94]\x94]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\t\x00\xfe\xff\xff\xff\xff\xff\xff\x00\x8c\x04size\x94\x8a\x06\x00\x00\x00\x00\x00\x01\x8c\x06stream\x94N\x8c\x07time_us\x94K\x05\x8c\x06frames\x94]\x94}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x01\x8c\x04name\x94\x8c\x01f\x94uau}\x94(h\x07\x8c\x0efree_completed\x94h\t\x8a\t\x00\xfe\xff\xff\xff\xff\xff\xff\x00h\n\x8a\x06\x00\x00\x00\x00\x00\x01h\x0b\x8a\x06\x00\x00\x00\x00\x00\x01h\x0cK\th\rh\x0eueau.";
    let csv = String::from_utf8(snapshot_to_csv(&p5[..]).unwrap()).unwrap();
    assert_eq!(
        csv,
        "device,time_us,action,addr,size,stream\n\
         0,5,alloc,0xfffffffffffffe00,1099511627776,0\n\
         0,9,free_completed,0xfffffffffffffe00,1099511627776,1099511627776\n"
    );
    // A list nested a million deep, as `device_traces` and at the top.
    let n = 1_000_000;
    let deep = |prefix: &[u8], suffix: &[u8]| {
        let mut p = prefix.to_vec();
        p.extend(std::iter::repeat_n(b']', n));
        p.extend(std::iter::repeat_n(b'a', n - 1));
        p.extend(suffix);
        p
    };
    let e = snapshot_to_csv(&deep(b"\x80\x02", b".")[..]).unwrap_err();
    assert!(e.to_string().contains("the pickle is not a dict"), "{e}");
    let e =
        snapshot_to_csv(&deep(b"\x80\x02}X\r\x00\x00\x00device_traces", b"s.")[..]).unwrap_err();
    assert!(e.to_string().contains("event 0: not a dict"), "{e}");
    // Sixty lists, each holding the one before twice: 2^60 leaves as a
    // tree, sixty values here.
    let mut laughs = b"\x80\x04}\x94\x8c\rdevice_traces\x94]\x94".to_vec();
    for i in 2..62u32 {
        laughs.extend(b"0](j"); // the list before goes off the stack (its memo keeps it)
        laughs.extend(i.to_le_bytes());
        laughs.extend(b"j");
        laughs.extend(i.to_le_bytes());
        laughs.extend(b"e\x94");
    }
    laughs.extend(b"s.");
    let e = snapshot_to_csv(&laughs[..]).unwrap_err();
    assert!(e.to_string().contains("event 0: not a dict"), "{e}");
}

#[test]
fn stream_selection_keeps_one_stream() {
    let csv = "device,time_us,action,addr,size,stream\n\
               0,1,alloc,0x10,64,0\n\
               0,2,alloc,0x20,128,7\n\
               0,3,free_completed,0x10,64,0\n\
               0,4,free_completed,0x20,128,7\n";
    let opts = ReadOptions {
        stream: Some(7),
        ..ReadOptions::default()
    };
    let mut r = TraceReader::with_options(csv.as_bytes(), opts).unwrap();
    let ev: Vec<Event> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(ev.iter().map(|e| e.addr).collect::<Vec<_>>(), [0x20, 0x20]);
    let s = r.stats();
    assert_eq!((s.ignored, s.other_streams, s.other_devices), (2, 2, 0));
    let rmm = "Thread,Time,Action,Pointer,Size,Stream\n\
               1,00:00:00.000001,allocate,0x10,64,0x1f\n\
               1,00:00:00.000002,allocate,0x20,64,0x2f\n";
    let opts = ReadOptions {
        stream: Some(0x2f),
        ..ReadOptions::default()
    };
    let mut r = TraceReader::with_options(rmm.as_bytes(), opts).unwrap();
    let ev: Vec<Event> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].addr, 0x20);
    assert_eq!(r.stats().other_streams, 1);
}
