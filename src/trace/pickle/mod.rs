//! PyTorch snapshot pickles (`torch.cuda.memory._dump_snapshot`), read
//! directly (feature `pickle`): `machine` runs the pickle into an arena of
//! values, and this module reads the events out of it.

mod machine;

use std::io::Read;

use self::machine::{Id, Node, Unpickled, unpickle};
use super::{PYTORCH_HEADER, TraceError, TraceErrorKind};

/// Whether `bytes` (a file's first bytes) look like a pickle: protocol 2
/// and later start with `0x80` and the protocol number.
///
/// # Examples
///
/// ```
/// assert!(decaying_pool::trace::is_pickle(&[0x80, 4, 0x95]));
/// assert!(!decaying_pool::trace::is_pickle(b"time_ns,action,addr,size"));
/// ```
pub fn is_pickle(bytes: &[u8]) -> bool {
    matches!(bytes, [0x80, 2..=5, ..])
}

fn bad(what: impl Into<String>) -> TraceError {
    TraceError {
        line: None,
        kind: TraceErrorKind::Malformed(what.into()),
    }
}

fn int(u: &Unpickled, v: Id, field: &str, i: usize) -> Result<i128, TraceError> {
    match u.node(v) {
        Node::Int(x) => Ok(*x),
        Node::BigInt => Err(bad(format!("event {i}: {field} out of range"))),
        Node::Bool(b) => Ok(i128::from(*b)),
        other => Err(bad(format!(
            "event {i}: {field} is {other:?}, expected an integer"
        ))),
    }
}

fn unsigned(u: &Unpickled, v: Id, field: &str, i: usize) -> Result<u64, TraceError> {
    let x = int(u, v, field, i)?;
    u64::try_from(x).map_err(|_| bad(format!("event {i}: {field} {x} is negative or too large")))
}

/// Converts a PyTorch memory snapshot pickle into the PyTorch CSV that
/// [`TraceReader`](super::TraceReader) reads
/// (`device,time_us,action,addr,size,stream`, one row per event of
/// `device_traces`, devices in order, events in trace order; stack frames
/// dropped), so a pickle replays exactly as its CSV conversion.
///
/// # Errors
///
/// A [`TraceError`] (without a line) when the input is not a pickle, or
/// not a snapshot (no `device_traces` list of lists of event dicts with
/// integer `addr`, `size`, `time_us` and a string `action`).
///
/// # Examples
///
/// ```
/// // {'device_traces': [[{'action': 'alloc', 'addr': 16, 'size': 512, 'stream': 0, 'time_us': 7}]]}
/// // written by Python's pickle.dumps(..., protocol=2)
/// let pickle = b"\x80\x02}q\x00X\r\x00\x00\x00device_tracesq\x01]q\x02]q\x03}q\x04(X\x06\x00\x00\x00actionq\x05X\x05\x00\x00\x00allocq\x06X\x04\x00\x00\x00addrq\x07K\x10X\x04\x00\x00\x00sizeq\x08M\x00\x02X\x06\x00\x00\x00streamq\tK\x00X\x07\x00\x00\x00time_usq\nK\x07uaas.";
/// let csv = decaying_pool::trace::snapshot_to_csv(&pickle[..])?;
/// assert_eq!(String::from_utf8(csv).unwrap(),
///            "device,time_us,action,addr,size,stream\n0,7,alloc,0x10,512,0\n");
/// # Ok::<(), decaying_pool::trace::TraceError>(())
/// ```
pub fn snapshot_to_csv(mut input: impl Read) -> Result<Vec<u8>, TraceError> {
    let mut bytes = Vec::new();
    input
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("cannot read the pickle: {e}")))?;
    let u = unpickle(&bytes).map_err(|e| bad(format!("not a readable pickle: {e}")))?;
    drop(bytes);
    let Node::Dict(top) = u.node(u.root()) else {
        return Err(bad(
            "not a PyTorch memory snapshot: the pickle is not a dict",
        ));
    };
    let traces = match u.get(top, "device_traces").map(|v| u.node(v)) {
        Some(Node::List(l) | Node::Tuple(l)) => l,
        Some(_) => {
            return Err(bad(
                "not a PyTorch memory snapshot: `device_traces` is not a list",
            ));
        }
        None => {
            return Err(bad(
                "not a PyTorch memory snapshot: no `device_traces` (was the snapshot \
                 taken with torch.cuda.memory._record_memory_history enabled?)",
            ));
        }
    };
    let mut out = Vec::new();
    out.extend_from_slice(PYTORCH_HEADER.as_bytes());
    out.push(b'\n');
    let mut i = 0usize;
    for (device, &events) in traces.iter().enumerate() {
        let (Node::List(events) | Node::Tuple(events)) = u.node(events) else {
            return Err(bad(format!(
                "device_traces[{device}] is not a list of events"
            )));
        };
        for &ev in events {
            let Node::Dict(d) = u.node(ev) else {
                return Err(bad(format!("event {i}: not a dict")));
            };
            let get = |k: &str| {
                u.get(d, k)
                    .ok_or_else(|| bad(format!("event {i}: no `{k}`")))
            };
            let action = match u.node(get("action")?) {
                Node::Str(s) => s.clone(),
                Node::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
                other => return Err(bad(format!("event {i}: action is {other:?}"))),
            };
            if action.contains([',', '\n', '\r']) {
                return Err(bad(format!("event {i}: action {action:?}")));
            }
            let addr = unsigned(&u, get("addr")?, "addr", i)?;
            let size = unsigned(&u, get("size")?, "size", i)?;
            let time_us = unsigned(&u, get("time_us")?, "time_us", i)?;
            let stream = match u.get(d, "stream") {
                None => 0,
                Some(v) if *u.node(v) == Node::None => 0,
                Some(v) => int(&u, v, "stream", i)?,
            };
            out.extend_from_slice(
                format!("{device},{time_us},{action},{addr:#x},{size},{stream}\n").as_bytes(),
            );
            i += 1;
        }
    }
    Ok(out)
}
