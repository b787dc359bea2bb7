//! `dp_stats_json`: a device's figures, summed over its stream pools and
//! per pool.

use dp::{PackingStats, Stats};
use serde_json::{Map, Value, json};

use crate::state::{Library, StreamPool};

/// `Stats` as a JSON object (every field, through its `Serialize`).
fn stats_value(s: &Stats) -> Map<String, Value> {
    match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// `PackingStats` as a JSON object.
fn packing_value(p: &PackingStats) -> Map<String, Value> {
    let mut m = Map::new();
    macro_rules! fields {
        ($($f:ident),* $(,)?) => { $( m.insert(stringify!($f).into(), json!(p.$f)); )* };
    }
    fields!(
        requests,
        carved,
        exact,
        exact_fallbacks,
        segments_created,
        segments_released,
        segments,
        segment_bytes,
        peak_segment_bytes,
        packed_blocks,
        packed_bytes,
        free_segment_bytes,
        bytes_requested,
        peak_bytes_requested,
        larger_reuses,
        oversize_bytes,
    );
    m
}

/// Adds the numbers of `add` into `into`, key by key.
fn add_into(into: &mut Map<String, Value>, add: &Map<String, Value>) {
    for (k, v) in add {
        let n = v.as_u64().unwrap_or(0);
        let sum = into
            .get(k)
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .saturating_add(n);
        into.insert(k.clone(), json!(sum));
    }
}

/// One stream pool's object.
fn pool_value(p: &StreamPool) -> (Map<String, Value>, Option<Map<String, Value>>, Value) {
    let stats = stats_value(&p.pool.stats());
    let packing = p.pool.packing_stats().map(|ps| packing_value(&ps));
    let v = json!({
        "stream": p.stream,
        "pending_blocks": p.pending(),
        "stats": stats,
        "packing": packing,
    });
    (stats, packing, v)
}

/// The JSON text of `device`.
pub(crate) fn device_json(lib: &Library, device: i32) -> String {
    let c = &lib.config;
    let dev = lib.opened_device(device);
    let pools = lib.pools(Some(device));
    let mut total = stats_value(&Stats::default());
    let mut packing_total = c.packing.map(|_| packing_value(&PackingStats::default()));
    let mut streams = Vec::with_capacity(pools.len());
    let mut pending = 0;
    for p in &pools {
        let (s, ps, v) = pool_value(p);
        add_into(&mut total, &s);
        if let (Some(t), Some(ps)) = (packing_total.as_mut(), ps.as_ref()) {
            add_into(t, ps);
        }
        pending += p.pending();
        streams.push(v);
    }
    let v = json!({
        "device": device,
        "backend": c.backend.name(),
        "policy": c.policy.label(),
        "packing_enabled": c.packing.is_some(),
        "gc_threshold": c.gc_threshold,
        "capacity": dev.as_ref().and_then(|d| d.capacity()),
        "limit": dev.as_ref().map_or(c.limit, |d| d.limit()),
        "reserved": dev.as_ref().map_or(0, |d| d.reserved()),
        "pools": pools.len(),
        "library_live_pointers": lib.registry.live(),
        "pending_blocks": pending,
        "stats": total,
        "packing": packing_total,
        "streams": streams,
    });
    v.to_string()
}
