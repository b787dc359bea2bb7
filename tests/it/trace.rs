//! Trace import, replay, Chrome trace and SVG export.
//!
//! The `shipped_*` tests also replay every `.csv` in `cli/traces` (the
//! traces the command-line tool ships: in the repository, not in the
//! packaged library crate); when that folder is absent or holds no trace
//! they print a note and pass without checking anything. The other tests use the built-in workloads and traces
//! written in the test.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use decaying_pool::trace::{
    Config, CostModel, Event, Format, Op, PolicyKind, ReadOptions, ReplayOptions, Replayer, Report,
    StatsTimeline, TraceErrorKind, TraceReader, TraceWriter, format_table, workloads,
    write_chrome_trace, write_svg,
};

fn read_all(text: &str, opts: ReadOptions) -> Result<Vec<Event>, decaying_pool::trace::TraceError> {
    TraceReader::with_options(text.as_bytes(), opts)?.collect()
}

fn err_of(text: &str) -> decaying_pool::trace::TraceError {
    match TraceReader::new(text.as_bytes()) {
        Err(e) => e,
        Ok(r) => r
            .collect::<Result<Vec<_>, _>>()
            .expect_err("input should be rejected"),
    }
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

#[test]
fn pytorch_reader_keeps_alloc_and_free_completed() {
    let text = "# provenance\n\
                # more\n\
                device,time_us,action,addr,size,stream\n\
                0,100,segment_alloc,0x1000,2097152,0\n\
                0,100,alloc,0x1000,512,0\n\
                0,150,free_requested,0x1000,512,0\n\
                0,170,free_completed,0x1000,512,0\n\
                \n\
                0,180,alloc,0x1000,1024,0\n\
                1,190,alloc,0x1000,4096,0\n";
    let mut r = TraceReader::new(text.as_bytes()).unwrap();
    assert_eq!(r.format(), Format::PyTorch);
    let evs: Vec<Event> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(
        evs,
        vec![
            Event::alloc(us(100), 0x1000, 512),
            Event::free(us(170), 0x1000, 512),
            Event::alloc(us(180), 0x1000, 1024),
        ]
    );
    let s = r.stats();
    assert_eq!((s.allocs, s.frees, s.ignored), (2, 1, 3)); // 2 actions + device 1
    assert_eq!((s.other_devices, s.other_streams), (1, 0));
    assert_eq!(s.lines, 10);
    assert_eq!(r.live_blocks(), 1);
}

#[test]
fn pytorch_reader_replays_the_device_asked_for() {
    let text = "device,time_us,action,addr,size,stream\n\
                0,1,alloc,0x10,8,0\n\
                1,2,alloc,0x10,16,0\n";
    let opts = ReadOptions {
        device: Some(1),
        ..ReadOptions::default()
    };
    assert_eq!(
        read_all(text, opts).unwrap(),
        vec![Event::alloc(us(2), 0x10, 16)]
    );
}

#[test]
fn rmm_reader_skips_failures_and_crosses_midnight() {
    let text = "Thread,Time,Action,Pointer,Size,Stream\n\
                140,23:59:59.500000,allocate,0x7f0000000000,1048576,0x0\n\
                140,23:59:59.600000,allocate failure,0x0,99999999999,0x0\n\
                141,23:59:59.750000,free,7f0000000000,1048576,0x0\n\
                141,00:00:00.250000,allocate,0x7f0000000000,64,0x1\n";
    let mut r = TraceReader::new(text.as_bytes()).unwrap();
    assert_eq!(r.format(), Format::Rmm);
    let evs: Vec<Event> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(evs.len(), 3);
    assert_eq!(evs[1].op, Op::Free);
    assert_eq!(evs[1].time - evs[0].time, Duration::from_millis(250));
    assert_eq!(evs[2].time - evs[1].time, Duration::from_millis(500));
    assert_eq!(r.stats().failed_allocs, 1);
}

#[test]
fn rmm_reader_takes_epoch_seconds_and_deallocate() {
    let text = "Thread,Time,Action,Pointer,Size,Stream\n\
                1,1634567890.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020\n\
                1,1634567890.345678,deallocate,0x7f8a40000000,1024,0x7f8a38001020\n";
    let evs = read_all(text, ReadOptions::default()).unwrap();
    assert_eq!(evs[1].op, Op::Free);
    assert_eq!(evs[1].time - evs[0].time, Duration::from_micros(222_222));
    assert!(matches!(
        err_of("Thread,Time,Action,Pointer,Size,Stream\n1,12.3.4,allocate,0x1,8,0\n").kind,
        TraceErrorKind::Malformed(_)
    ));
}

#[test]
fn native_reader_and_writer_round_trip() {
    for w in workloads::defaults() {
        let mut out = TraceWriter::new(Vec::new()).unwrap();
        for e in &w.events {
            out.write(e).unwrap();
        }
        let bytes = out.finish().unwrap();
        let back: Vec<Event> = TraceReader::new(&bytes[..])
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, w.events, "{}", w.name);
    }
    // A free may name size 0: "as allocated".
    let evs = read_all(
        "time_ns,action,addr,size\n5,alloc,0xa,7\n9,free,0xa,0\n",
        ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(evs[1], Event::free(Duration::from_nanos(9), 0xa, 7));
}

#[test]
fn zero_size_allocations_are_skipped_with_their_frees() {
    let mut r = TraceReader::new(
        "time_ns,action,addr,size\n1,alloc,0x1,0\n2,free,0x1,0\n3,alloc,0x1,8\n".as_bytes(),
    )
    .unwrap();
    let evs: Vec<Event> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(evs, vec![Event::alloc(Duration::from_nanos(3), 1, 8)]);
    assert_eq!(r.stats().zero_size, 1);
}

#[test]
fn every_error_names_its_line() {
    type Check = fn(&TraceErrorKind) -> bool;
    let cases: &[(&str, u64, Check)] = &[
        ("", 1, |k| matches!(k, TraceErrorKind::Empty)),
        ("# only a comment\n\n", 2, |k| {
            matches!(k, TraceErrorKind::Empty)
        }),
        (
            "# c\nfoo,bar\n",
            2,
            |k| matches!(k, TraceErrorKind::UnknownHeader(h) if h == "foo,bar"),
        ),
        ("time_ns,action,addr,size\n1,alloc,0x1\n", 2, |k| {
            matches!(k, TraceErrorKind::Malformed(_))
        }),
        (
            "time_ns,action,addr,size\n1,alloc,0x1,8\nx,free,0x1,8\n",
            3,
            |k| matches!(k, TraceErrorKind::Malformed(_)),
        ),
        ("time_ns,action,addr,size\n1,alloc,0xzz,8\n", 2, |k| {
            matches!(k, TraceErrorKind::Malformed(_))
        }),
        ("time_ns,action,addr,size\n1,alloc,0x1,-8\n", 2, |k| {
            matches!(k, TraceErrorKind::Malformed(_))
        }),
        ("time_ns,action,addr,size\n1,realloc,0x1,8\n", 2, |k| {
            matches!(k, TraceErrorKind::Malformed(_))
        }),
        ("time_ns,action,addr,size\n1,free,0x1,8\n", 2, |k| {
            matches!(k, TraceErrorKind::UnknownFree { addr: 1 })
        }),
        (
            "time_ns,action,addr,size\n1,alloc,0x1,8\n2,alloc,0x1,8\n",
            3,
            |k| matches!(k, TraceErrorKind::DoubleAlloc { addr: 1 }),
        ),
        (
            "time_ns,action,addr,size\n1,alloc,0x1,8\n2,free,0x1,9\n",
            3,
            |k| {
                matches!(
                    k,
                    TraceErrorKind::SizeMismatch {
                        addr: 1,
                        allocated: 8,
                        freed: 9
                    }
                )
            },
        ),
        (
            "device,time_us,action,addr,size,stream\n0,1,explode,0x1,8,0\n",
            2,
            |k| matches!(k, TraceErrorKind::Malformed(_)),
        ),
        (
            "device,time_us,action,addr,size,stream\n0,99999999999999999,alloc,0x1,8,0\n",
            2,
            |k| matches!(k, TraceErrorKind::Malformed(_)),
        ),
        (
            "device,time_us,action,addr,size,stream\n0,1,alloc,0x1,8\n",
            2,
            |k| matches!(k, TraceErrorKind::Malformed(_)),
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n1,25:00:00.0,allocate,0x1,8,0x0\n",
            2,
            |k| matches!(k, TraceErrorKind::Malformed(_)),
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n1,10:00,allocate,0x1,8,0x0\n",
            2,
            |k| matches!(k, TraceErrorKind::Malformed(_)),
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1x,allocate,0x1,8,0x0\n",
            2,
            |k| matches!(k, TraceErrorKind::Malformed(_)),
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,free,0x1,8,0x0\n",
            2,
            |k| matches!(k, TraceErrorKind::UnknownFree { .. }),
        ),
    ];
    for (text, line, check) in cases {
        let e = err_of(text);
        assert_eq!(e.line, Some(*line), "{text:?}: {e}");
        assert!(check(&e.kind), "{text:?}: {e}");
        assert!(e.to_string().starts_with(&format!("line {line}: ")), "{e}");
    }
}

#[test]
fn after_an_error_the_reader_stops() {
    let mut r =
        TraceReader::new("time_ns,action,addr,size\nbad\n1,alloc,0x1,8\n".as_bytes()).unwrap();
    assert!(r.next().unwrap().is_err());
    assert!(r.next().is_none());
}

#[test]
fn lenient_frees_are_skipped_and_counted() {
    let text = "time_ns,action,addr,size\n1,free,0x1,8\n2,alloc,0x2,8\n3,free,0x2,8\n";
    let opts = ReadOptions {
        lenient_frees: true,
        ..ReadOptions::default()
    };
    let mut r = TraceReader::with_options(text.as_bytes(), opts).unwrap();
    assert_eq!(r.by_ref().count(), 2);
    assert_eq!(r.stats().unknown_frees, 1);
}

/// Writes events as a PyTorch CSV and as an RMM CSV.
fn as_pytorch(events: &[Event]) -> String {
    let mut s = String::from("# test\ndevice,time_us,action,addr,size,stream\n");
    for e in events {
        let t = e.time.as_micros() + 1_700_000_000_000_000;
        match e.op {
            Op::Alloc => s.push_str(&format!("0,{t},alloc,{:#x},{},0\n", e.addr, e.size)),
            Op::Free => {
                s.push_str(&format!(
                    "0,{t},free_requested,{:#x},{},0\n",
                    e.addr, e.size
                ));
                s.push_str(&format!(
                    "0,{t},free_completed,{:#x},{},0\n",
                    e.addr, e.size
                ));
            }
        }
    }
    s
}

fn as_rmm(events: &[Event]) -> String {
    // Starts 50 ms before midnight, so long traces cross it.
    let mut s = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    let t0 = events.first().map_or(0, |e| e.time.as_micros() as u64);
    for e in events {
        let t = e.time.as_micros() as u64 - t0 + 24 * 3_600_000_000 - 50_000;
        let (h, m, sec, frac) = (
            t / 3_600_000_000 % 24,
            t / 60_000_000 % 60,
            t / 1_000_000 % 60,
            t % 1_000_000,
        );
        let action = match e.op {
            Op::Alloc => "allocate",
            Op::Free => "free",
        };
        s.push_str(&format!(
            "7,{h:02}:{m:02}:{sec:02}.{frac:06},{action},{:#x},{},0x0\n",
            e.addr, e.size
        ));
    }
    s
}

fn replay(events: impl IntoIterator<Item = Event>, opts: ReplayOptions) -> Vec<Report> {
    let mut r = Replayer::new(&Config::defaults(), opts);
    for e in events {
        r.event(&e);
    }
    r.finish("test")
}

fn key(r: &Report) -> (String, u64, u64, u64, usize, usize, u64, u64) {
    (
        r.policy.clone(),
        r.hits,
        r.backing_allocs,
        r.backing_frees,
        r.peak_reserved_bytes,
        r.peak_live_bytes,
        r.failures,
        (r.idle_byte_seconds * 1e3).round() as u64,
    )
}

#[test]
fn rmm_and_pytorch_readers_give_the_same_replay() {
    let w = workloads::data_dependent_pipeline();
    let py = read_all(&as_pytorch(&w.events), ReadOptions::default()).unwrap();
    let rmm = read_all(&as_rmm(&w.events), ReadOptions::default()).unwrap();
    assert_eq!(py.len(), w.events.len());
    let a = replay(py, ReplayOptions::default());
    let b = replay(rmm, ReplayOptions::default());
    let c = replay(w.events.iter().copied(), ReplayOptions::default());
    let ka: Vec<_> = a.iter().map(key).collect();
    assert_eq!(ka, b.iter().map(key).collect::<Vec<_>>());
    assert_eq!(ka, c.iter().map(key).collect::<Vec<_>>());
}

/// Per size, the peak number of simultaneously live blocks, summed.
fn exact_cache_floor(events: &[Event]) -> u64 {
    let mut live: HashMap<u64, u64> = HashMap::new(); // addr -> size
    let mut per_size: HashMap<u64, (u64, u64)> = HashMap::new();
    for e in events {
        match e.op {
            Op::Alloc => {
                live.insert(e.addr, e.size);
                let (n, peak) = per_size.entry(e.size).or_default();
                *n += 1;
                *peak = (*peak).max(*n);
            }
            Op::Free => {
                let size = live.remove(&e.addr).expect("reader gives live frees only");
                per_size.get_mut(&size).unwrap().0 -= 1;
            }
        }
    }
    per_size.values().map(|&(_, p)| p).sum()
}

fn check_bounds(name: &str, events: &[Event], reports: &[Report]) {
    let allocs = events.iter().filter(|e| e.op == Op::Alloc).count() as u64;
    let floor = exact_cache_floor(events);
    for r in reports {
        assert_eq!(r.allocs, allocs, "{name} {}", r.policy);
        if r.policy == "mapped" {
            // Its backing calls are pages: each made once, mapped under
            // every block that needs it, released once.
            assert!(
                r.pages_created >= 1 && r.pages_released <= r.pages_created,
                "{name}"
            );
            assert!(r.maps >= 1, "{name}");
            assert_eq!(r.backing_allocs, r.pages_created, "{name}");
            assert!(r.peak_reserved_bytes >= r.peak_live_bytes, "{name}");
            assert_eq!(r.failures, 0, "{name}");
            continue;
        }
        assert_eq!(r.hits + r.backing_allocs, allocs, "{name} {}", r.policy);
        // Packing shares segments between sizes: it may go below the exact
        // cache's floor.
        let range = if r.policy.starts_with("packed") {
            1.min(allocs)..=allocs
        } else {
            floor..=allocs
        };
        assert!(
            range.contains(&r.backing_allocs),
            "{name} {}: {} not in {range:?}",
            r.policy,
            r.backing_allocs
        );
        assert!(
            r.peak_reserved_bytes >= r.peak_live_bytes,
            "{name} {}",
            r.policy
        );
        assert_eq!(r.failures, 0);
    }
    let by = |p: &str| reports.iter().find(|r| r.policy == p).unwrap();
    assert_eq!(by("keep-all").backing_allocs, floor, "{name}");
    // Packing over the default policy makes no more backing calls than the
    // default policy alone.
    assert!(by("packed").backing_allocs <= by("fixed-time 1s").backing_allocs);
    assert_eq!(by("keep-all").backing_frees, 0, "{name}");
    assert_eq!(by("no-pool").backing_allocs, allocs, "{name}");
    assert_eq!(by("no-pool").hits, 0, "{name}");
    assert_eq!(by("no-pool").idle_byte_seconds, 0.0, "{name}");
    assert_eq!(
        by("no-pool").peak_reserved_bytes,
        by("no-pool").peak_live_bytes
    );
}

fn shipped_traces() -> Option<Vec<PathBuf>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cli/traces");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!(
            "note: {} absent; shipped-trace tests skipped",
            dir.display()
        );
        return None;
    };
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    v.sort();
    if v.is_empty() {
        println!(
            "note: no traces in {}; shipped-trace tests skipped",
            dir.display()
        );
        return None;
    }
    Some(v)
}

#[test]
fn shipped_traces_keep_all_makes_the_exact_cache_floor() {
    let Some(paths) = shipped_traces() else {
        return;
    };
    let opts = ReadOptions {
        lenient_frees: true,
        ..ReadOptions::default()
    };
    for p in paths {
        let events: Vec<Event> = TraceReader::open(&p, opts)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let name = p.display().to_string();
        let reports = replay(
            events.iter().copied(),
            ReplayOptions {
                reaper: Some(Duration::from_millis(1)),
                ..ReplayOptions::default()
            },
        );
        check_bounds(&name, &events, &reports);
        // The same events through the RMM form give the same replay.
        let rmm = read_all(&as_rmm(&events), ReadOptions::default()).unwrap();
        let again = replay(
            rmm,
            ReplayOptions {
                reaper: Some(Duration::from_millis(1)),
                ..ReplayOptions::default()
            },
        );
        let k: Vec<_> = reports.iter().map(key).collect();
        assert_eq!(k, again.iter().map(key).collect::<Vec<_>>(), "{name}");
    }
}

#[test]
fn shipped_training_trace_is_strict_about_pre_trace_frees() {
    let Some(paths) = shipped_traces() else {
        return;
    };
    let Some(p) = paths
        .iter()
        .find(|p| p.to_string_lossy().contains("training"))
    else {
        println!("note: no training trace; skipped");
        return;
    };
    let err = TraceReader::open(p, ReadOptions::default())
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap_err();
    assert!(
        matches!(err.kind, TraceErrorKind::UnknownFree { .. }),
        "{err}"
    );
    assert!(err.line.unwrap() > 8);
}

#[test]
fn builtin_workloads_keep_all_makes_the_floor() {
    for w in workloads::defaults() {
        let unbounded = replay(w.events.iter().copied(), ReplayOptions::default());
        check_bounds(w.name, &w.events, &unbounded);
        if let Some(cap) = w.capacity {
            let bounded = replay(
                w.events.iter().copied(),
                ReplayOptions {
                    cost: CostModel::cuda().with_capacity(cap),
                    ..ReplayOptions::default()
                },
            );
            for r in &bounded {
                assert!(r.peak_reserved_bytes <= cap, "{} {}", w.name, r.policy);
                assert_eq!(r.failures, 0);
            }
            let keep = bounded.iter().find(|r| r.policy == "keep-all").unwrap();
            assert!(
                keep.trimmed > 0,
                "the A/B/A pipeline does not fit a keep-all cache"
            );
        }
    }
}

#[test]
fn repeat_with_a_gap_lets_blocks_decay() {
    let w = workloads::training_loop();
    let floor = exact_cache_floor(&w.events);
    let ms = Duration::from_millis;
    let configs = [
        Config::new(PolicyKind::KeepAll),
        Config::new(PolicyKind::FixedTime(ms(1000))),
    ];
    let mut r = Replayer::new(
        &configs,
        ReplayOptions {
            gap: ms(2000),
            reaper: Some(ms(10)),
            ..ReplayOptions::default()
        },
    );
    for _ in 0..3 {
        r.begin_pass();
        for e in &w.events {
            r.event(e);
        }
    }
    let span = w.events.last().unwrap().time - w.events[0].time;
    assert_eq!(r.now(), span * 3 + ms(4000));
    let reps = r.finish("loop");
    assert_eq!(reps[0].backing_allocs, floor);
    assert!(
        reps[1].backing_allocs >= 3 * floor - 2,
        "{}",
        reps[1].backing_allocs
    );
    assert!(reps[1].idle_byte_seconds < reps[0].idle_byte_seconds);
}

/// The blocks a pass leaves live go back in ascending order of trace
/// address, whatever the hash seed: with one slot, the block released last
/// is the one cached, and the next pass hits on it or not.
#[test]
fn a_pass_releases_what_it_left_live_in_address_order() {
    let hits_on_the_small_block = |small_addr: u64, large_addr: u64| {
        let mut r = Replayer::new(
            &[Config::new(PolicyKind::FixedCapacity(1))],
            ReplayOptions::default(),
        );
        r.begin_pass();
        r.event(&Event::alloc(us(0), small_addr, 4096));
        r.event(&Event::alloc(us(1), large_addr, 8192));
        r.begin_pass();
        r.event(&Event::alloc(us(0), 0x99, 4096));
        r.finish("order")[0].hits
    };
    // Many address pairs, so a hash-ordered release would fail at least one.
    for k in 0..16u64 {
        let (lo, hi) = (0x1000 + k * 0x40, 0x100_0000 + k * 0x1000);
        assert_eq!(
            hits_on_the_small_block(hi, lo),
            1,
            "pair {k}: released last"
        );
        assert_eq!(
            hits_on_the_small_block(lo, hi),
            0,
            "pair {k}: released first"
        );
    }
}

#[test]
fn a_device_too_small_fails_requests_and_skips_their_frees() {
    let gib = 1u64 << 30;
    let evs = [
        Event::alloc(us(0), 1, 3 * gib),
        Event::alloc(us(1), 2, 3 * gib),
        Event::free(us(2), 2, 3 * gib),
        Event::free(us(3), 1, 3 * gib),
        Event::alloc(us(4), 2, 3 * gib),
    ];
    let reps = replay(
        evs,
        ReplayOptions {
            cost: CostModel::cuda().with_capacity(4 << 30),
            ..ReplayOptions::default()
        },
    );
    for r in &reps {
        assert_eq!(r.failures, 1, "{}", r.policy);
        assert_eq!(r.stats.blocks_in_use, 1);
    }
    let keep = reps.iter().find(|r| r.policy == "keep-all").unwrap();
    assert_eq!((keep.hits, keep.backing_allocs), (1, 1));
}

fn recorded(w: &workloads::Workload) -> Vec<StatsTimeline> {
    let reps = replay(
        w.events.iter().copied(),
        ReplayOptions {
            cost: CostModel::cuda().with_capacity(w.capacity.unwrap_or(usize::MAX)),
            reaper: Some(Duration::from_millis(1)),
            record: true,
            ..ReplayOptions::default()
        },
    );
    reps.into_iter().map(|r| r.timeline.unwrap()).collect()
}

#[test]
fn chrome_trace_parses_with_the_expected_tracks() {
    let w = workloads::aba_pipeline();
    let recs = recorded(&w);
    let mut out = Vec::new();
    write_chrome_trace(&mut out, &recs).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    let configs: Vec<String> = Config::defaults().into_iter().map(|c| c.name).collect();
    assert_eq!(names, configs);
    for pid in 1..=recs.len() as u64 {
        let mine: Vec<&serde_json::Value> = events.iter().filter(|e| e["pid"] == pid).collect();
        for track in [
            "in_use_bytes",
            "cached_bytes",
            "reserved_bytes",
            "from_pool_bytes",
            "from_backing_bytes",
        ] {
            assert!(
                mine.iter()
                    .any(|e| e["ph"] == "C" && e["name"] == track && e["args"]["value"].is_u64()),
                "pid {pid} lacks {track}"
            );
        }
        let mut last = -1.0;
        for e in mine.iter().filter(|e| e["ph"] == "C") {
            let ts = e["ts"].as_f64().unwrap();
            assert!(ts >= last);
            last = ts;
        }
    }
    let instants = |name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "i" && e["name"] == name)
            .count()
    };
    assert!(instants("eviction") > 0);
    assert!(instants("trim") > 0); // keep-all on the 8 GiB device
}

#[test]
fn svg_is_well_formed_with_a_panel_per_configuration() {
    for w in workloads::defaults() {
        let recs = recorded(&w);
        let mut out = Vec::new();
        write_svg(&mut out, &format!("{} <&> \"chart\"", w.name), &recs).unwrap();
        let text = String::from_utf8(out).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap();
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        for c in Config::defaults() {
            assert!(
                texts.contains(&c.name.as_str()),
                "{}: no panel {}",
                w.name,
                c.name
            );
        }
        let paths = doc.descendants().filter(|n| n.has_tag_name("path")).count();
        assert!(paths >= 3 * recs.len());
    }
    // An empty chart is still a document.
    let mut out = Vec::new();
    write_svg(&mut out, "empty", &[]).unwrap();
    roxmltree::Document::parse(std::str::from_utf8(&out).unwrap()).unwrap();
}

#[test]
fn json_report_has_the_documented_keys() {
    let w = workloads::training_loop();
    let reps = replay(w.events.iter().copied(), ReplayOptions::default());
    let v: serde_json::Value =
        serde_json::from_str(&decaying_pool::trace::reports_to_json(&reps)).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), reps.len());
    for (o, r) in arr.iter().zip(&reps) {
        for k in [
            "workload",
            "policy",
            "hits",
            "backing_allocs",
            "backing_frees",
            "peak_reserved_bytes",
            "peak_live_bytes",
            "idle_byte_seconds",
            "modelled_backing_seconds",
            "failures",
        ] {
            assert!(o.get(k).is_some(), "missing {k}");
        }
        assert_eq!(o["policy"], r.policy.as_str());
        assert_eq!(o["hits"], r.hits);
    }
}

/// A clock that jumps by centuries (a corrupt timestamp, or a `--gap` of
/// years) with the reaper ticking every millisecond: the ticks after the
/// pools have nothing left to free are passed over, so the replay ends
/// (one tick a millisecond would be 1.6e13 of them), and the time-to-live
/// and half-life policies still free their block on the first ticks
/// after it expires.
#[test]
fn a_clock_jump_of_centuries_replays_in_a_few_ticks() {
    let opts = ReplayOptions {
        reaper: Some(Duration::from_millis(1)),
        ..ReplayOptions::default()
    };
    let years = Duration::from_secs(500 * 365 * 86_400);
    let mut r = Replayer::new(&Config::defaults(), opts);
    r.event(&Event::alloc(Duration::ZERO, 0x10, 4096));
    r.event(&Event::free(Duration::from_millis(1), 0x10, 4096));
    r.event(&Event::alloc(years, 0x20, 4096));
    r.event(&Event::free(years, 0x20, 4096));
    // The last moment there is: no tick is left there.
    r.event(&Event::alloc(Duration::MAX, 0x30, 4096));
    let reports = r.finish("jump");
    for rep in &reports {
        let timed = rep.policy.starts_with("fixed-time") || rep.policy.starts_with("exponential");
        if timed {
            // The block expired long before the second request: a miss,
            // and the first block went back.
            assert_eq!(rep.hits, 0, "{}", rep.policy);
            assert!(rep.evictions >= 1, "{}", rep.policy);
        }
        if rep.policy == "keep-all" {
            assert_eq!(rep.hits, 2);
            // Its block sat idle for the whole span: 4096 bytes for
            // about 584 years (to the last event), integrated in one
            // step.
            let secs = 4096.0 * Duration::from_nanos(u64::MAX).as_secs_f64();
            assert!(
                (rep.idle_byte_seconds - secs).abs() < secs * 1e-6,
                "{} against {secs}",
                rep.idle_byte_seconds
            );
        }
    }
}

/// An outlier widens its own column: every line of the table keeps the
/// same width, and each header stays over its figures.
#[test]
fn the_table_widens_a_column_for_an_outlier() {
    let mut reports = replay(
        [
            Event::alloc(Duration::ZERO, 0x10, 4096),
            Event::free(Duration::from_millis(1), 0x10, 4096),
        ],
        ReplayOptions::default(),
    );
    let normal = format_table(&reports);
    let width = |t: &str| -> Vec<usize> { t.lines().map(|l| l.chars().count()).collect() };
    let w = width(&normal);
    assert!(w.iter().all(|&n| n == w[0]), "{normal}");
    reports[1].idle_byte_seconds = 1.5e21;
    reports[1].hits = 123_456_789_012;
    reports[1].allocs = 123_456_789_012;
    let wide = format_table(&reports);
    let v = width(&wide);
    assert!(v.iter().all(|&n| n == v[0]), "{wide}");
    // Three digits more of hits, nine of idle byte-seconds.
    assert_eq!(v[0], w[0] + 3 + 9, "{wide}");
    // The figures end where their headers end.
    let lines: Vec<&str> = wide.lines().collect();
    // In characters: the header has a `÷`.
    let end =
        |line: &str, cell: &str| line[..line.find(cell).unwrap()].chars().count() + cell.len();
    assert_eq!(
        end(lines[0], "idle"),
        end(lines[3], "1430511474609375.000"),
        "{wide}"
    );
    assert_eq!(
        end(lines[0], "hits"),
        end(lines[3], "123456789012"),
        "{wide}"
    );
}
