//! Bad trace input and bad command-line numbers: a clear error naming the
//! file, line, field or option, never a panic or a silent zero.

use std::time::Duration;

use decaying_pool::trace::cli::{parse_capacity_gib, parse_millis, parse_repeat};
use decaying_pool::trace::{Event, ReadOptions, TraceError, TraceErrorKind, TraceReader};

fn read_all(text: &str) -> Result<Vec<Event>, TraceError> {
    TraceReader::with_options(text.as_bytes(), ReadOptions::default())?.collect()
}

const NATIVE: &str = "time_ns,action,addr,size\n0,alloc,0x10,64\n5,free,0x10,64\n";
const PYTORCH: &str = "device,time_us,action,addr,size,stream\n\
                       0,1,alloc,0x10,64,0\n\
                       0,2,free_completed,0x10,64,0\n";
const RMM: &str = "Thread,Time,Action,Pointer,Size,Stream\n\
                   1,10:00:00.000001,allocate,0x10,64,0x0\n\
                   1,10:00:00.000002,free,0x10,64,0x0\n";

#[test]
fn a_utf8_bom_before_the_header_is_skipped_in_every_format() {
    for text in [NATIVE, PYTORCH, RMM] {
        let plain = read_all(text).unwrap();
        assert_eq!(plain.len(), 2);
        let with_bom = format!("\u{feff}{text}");
        let bommed = read_all(&with_bom)
            .unwrap_or_else(|e| panic!("BOM-prefixed trace refused: {e}\n{text}"));
        assert_eq!(bommed, plain);
    }
    // Before a leading comment too.
    let commented = format!("\u{feff}# from a spreadsheet\n{NATIVE}");
    assert_eq!(read_all(&commented).unwrap(), read_all(NATIVE).unwrap());
}

#[test]
fn rmm_times_near_u64_max_read_or_are_an_error_naming_line_and_field() {
    // Seconds since the epoch: 18446744073 s is just under u64::MAX ns.
    let big = "18446744073.000000";
    let text = format!(
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,1.000000,allocate,0x10,64,0x0\n\
         1,{big},allocate,0x20,64,0x0\n"
    );
    let events = read_all(&text).unwrap();
    assert_eq!(events[1].time, Duration::from_secs(18_446_744_073));

    // Back in time by more than half a day (a day is added), then the
    // large time again: day + time overflows.
    let text = format!(
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,{big},allocate,0x10,64,0x0\n\
         1,1.000000,allocate,0x20,64,0x0\n\
         1,{big},allocate,0x30,64,0x0\n"
    );
    let err = read_all(&text).unwrap_err();
    assert_eq!(err.line, Some(4), "{err}");
    assert!(matches!(err.kind, TraceErrorKind::Malformed(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("line 4: time {big:?} out of range")
    );
}

#[test]
fn a_missing_trace_file_names_its_path() {
    let path = std::env::temp_dir().join("decaying-pool-no-such-trace.csv");
    let err = TraceReader::open(&path, ReadOptions::default()).unwrap_err();
    assert!(
        matches!(&err.kind, TraceErrorKind::Open { path: p, source }
            if p == &path && source.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&*path.to_string_lossy()), "{msg}");
    assert!(msg.starts_with("cannot open "), "{msg}");
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn millisecond_options_refuse_negative_nan_infinite_and_huge_values() {
    for opt in ["--gap", "--reaper"] {
        for bad in ["-1", "nan", "NaN", "inf", "-inf", "1e30", "", "ten"] {
            let err = parse_millis(opt, bad).expect_err(bad);
            assert_eq!((err.option.as_str(), err.value.as_str()), (opt, bad));
            let msg = err.to_string();
            assert!(msg.starts_with(&format!("{opt}: {bad:?} is not ")), "{msg}");
            assert!(msg.contains("milliseconds"), "{msg}");
        }
        assert_eq!(parse_millis(opt, "0").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_millis(opt, "250").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_millis(opt, "0.5").unwrap(),
            Duration::from_micros(500)
        );
    }
}

#[test]
fn capacity_refuses_negative_nan_infinite_zero_and_huge_values() {
    for bad in ["-1", "nan", "inf", "1e30", "0", "-0", "1e-30", "", "8GiB"] {
        let err = parse_capacity_gib("--capacity", bad).expect_err(bad);
        assert_eq!(
            err.to_string(),
            format!("--capacity: {bad:?} is not a positive number of GiB")
        );
    }
    assert_eq!(parse_capacity_gib("--capacity", "8").unwrap(), 8 << 30);
    assert_eq!(parse_capacity_gib("--capacity", "0.25").unwrap(), 1 << 28);
}

#[test]
fn repeat_refuses_zero_negative_and_non_integers() {
    for bad in ["0", "-1", "1.5", "nan", "99999999999", ""] {
        let err = parse_repeat("--repeat", bad).expect_err(bad);
        assert!(
            err.to_string()
                .starts_with(&format!("--repeat: {bad:?} is not "))
        );
    }
    assert_eq!(parse_repeat("--repeat", "3").unwrap(), 3);
}
