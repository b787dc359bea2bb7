#!/usr/bin/env bash
# Instructions per hit round trip (and per block of a batch), counted by
# Valgrind's cachegrind: the same on a busy machine as on a quiet one, so
# it compares two checkouts where `cargo bench --bench hit_path` is noisy.
# Each row runs `examples/instructions.rs` at two counts and divides the
# difference of the totals by the difference of the counts.
#
#   bash benches/instructions.sh        (needs `valgrind` on the PATH)
set -euo pipefail
shopt -s inherit_errexit # a failed count stops the script
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
cargo build --release --quiet --example instructions
bin=target/release/examples/instructions

# Instructions the whole run of `$bin "$@"` takes.
total() {
    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        "$bin" "$@" 2>&1 | awk '/I *refs/ { gsub(",", "", $NF); print $NF }'
}

# Instructions per round trip of cache $1 at scale $2 (per block for batches).
per_trip() {
    local n=100000 per=1
    if [ "$2" = batch ]; then n=10000 per=16; fi
    local a b
    a=$(total "$1" "$2" "$n")
    b=$(total "$1" "$2" $((2 * n)))
    echo $(((b - a) / (n * per)))
}

# A table: the caches of the array `rows` (the first is the baseline of
# the ratios) at the scales of the array `cols`, under the title $1.
table() {
    printf '%-16s' "$1"
    for s in "${cols[@]}"; do printf '%16s' "$s"; done
    echo
    declare -A base
    local c s v
    for c in "${rows[@]}"; do
        printf '%-16s' "$c"
        for s in "${cols[@]}"; do
            v=$(per_trip "$c" "$s")
            if [ "$c" = "${rows[0]}" ]; then
                base[$s]=$v
                printf '%16s' "$v"
            else
                printf '%16s' "$v ($(awk -v a="$v" -v b="${base[$s]}" 'BEGIN { printf "%.2fx", a / b }'))"
            fi
        done
        echo
    done
}

# The hit path against the map of vectors.
rows=(map fixed_time rounded exponential fixed_capacity fixed_capacity_fifo)
cols=(64x1 4096x4 100000x2 batch)
table instructions
echo
# Through `SharedPool` (FixedTime), against the plain pool: one class, as
# `cargo bench --bench shared_pool`, and 64 classes, more than a thread
# cache holds.
rows=(fixed_time shared thread_caches)
cols=(1x1 64x1)
table "shared, 1 thread"
