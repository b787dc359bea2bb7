//! Bad trace input gets an error naming what was wrong, never a panic.

use decaying_pool::trace::{Event, Format, ReadOptions, TraceError, TraceErrorKind, TraceReader};

fn read(text: &str) -> Result<Vec<Event>, TraceError> {
    TraceReader::with_options(text.as_bytes(), ReadOptions::default())?.collect()
}

const BOM: &str = "\u{feff}";

#[test]
fn a_byte_order_mark_on_the_header_is_skipped_in_every_format() {
    let traces = [
        (
            Format::Native,
            "time_ns,action,addr,size\n0,alloc,0x10,8\n5,free,0x10,8\n",
        ),
        (
            Format::PyTorch,
            "device,time_us,action,addr,size,stream\n0,1,alloc,0x10,8,0\n0,2,free_completed,0x10,8,0\n",
        ),
        (
            Format::Rmm,
            "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000001,allocate,0x10,8,0x0\n1,10:00:00.000002,free,0x10,8,0x0\n",
        ),
    ];
    for (format, text) in traces {
        let with_bom = format!("{BOM}{text}");
        let r = TraceReader::new(with_bom.as_bytes()).expect("the header is recognised");
        assert_eq!(r.format(), format);
        let events: Vec<Event> = r.collect::<Result<_, _>>().unwrap();
        assert_eq!(events, read(text).unwrap(), "{format:?}");
        assert_eq!(events.len(), 2);
    }
    // Before a comment line too.
    let text = format!("{BOM}# provenance\ntime_ns,action,addr,size\n0,alloc,0x10,8\n");
    assert_eq!(read(&text).unwrap().len(), 1);
}

#[test]
fn rmm_times_that_overflow_are_an_error_on_their_line() {
    // Seconds since the epoch near the largest representable time, then a
    // time more than half a day earlier (the reader takes it for the next
    // day), then the large time again: on the next day it no longer fits
    // in a u64 of nanoseconds.
    let text = "Thread,Time,Action,Pointer,Size,Stream\n\
                1,18446744073.000000,allocate,0x10,8,0x0\n\
                1,10.000000,allocate,0x20,8,0x0\n\
                1,18446744073.000000,allocate,0x30,8,0x0\n";
    let err = read(text).expect_err("the third time cannot be represented");
    assert_eq!(err.line, Some(4));
    assert!(matches!(err.kind, TraceErrorKind::Malformed(_)));
    let msg = err.to_string();
    assert!(msg.starts_with("line 4: "), "{msg}");
    assert!(
        msg.contains("Time") && msg.contains("18446744073.000000"),
        "{msg}"
    );
    assert!(msg.contains("out of range"), "{msg}");

    // A time of day past midnight is still the next day.
    let text = "Thread,Time,Action,Pointer,Size,Stream\n\
                1,23:59:59.000000,allocate,0x10,8,0x0\n\
                1,00:00:01.000000,free,0x10,8,0x0\n";
    let events = read(text).unwrap();
    assert_eq!(
        events[1].time - events[0].time,
        std::time::Duration::from_secs(2)
    );
}

#[test]
fn a_missing_file_is_named_in_its_error() {
    let path = std::env::temp_dir().join("decaying-pool-no-such-dir/trace.csv");
    let Err(err) = TraceReader::open(&path, ReadOptions::default()) else {
        panic!("no such file");
    };
    assert!(matches!(err.kind, TraceErrorKind::Open { .. }));
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("cannot open {}: ", path.display())),
        "{msg}"
    );
    assert!(std::error::Error::source(&err).is_some());
}
