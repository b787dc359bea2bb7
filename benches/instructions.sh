#!/usr/bin/env bash
# Instructions per hit round trip (and per block of a batch), counted by
# Valgrind's cachegrind: the same on a busy machine as on a quiet one, so
# it compares two checkouts where `cargo bench --bench hit_path` is noisy.
# Each row runs `examples/instructions.rs` at two counts and divides the
# difference of the totals by the difference of the counts.
#
#
#   bash benches/instructions.sh        (needs `valgrind` on the PATH)
#
# With `--time`, the same tables in nanoseconds instead: for each scale,
# five runs of `examples/instructions.rs --time` over all the table's
# caches, each of which fills them, times their round trips in turn many
# times over and prints the fastest time of each (pinned to one processor
# when `taskset` is there); a cell is the median of the five. A noisy
# machine moves these less than criterion's medians, but a time still
# belongs to the machine and the day that made it: compare ratios from
# one run.
#
#   bash benches/instructions.sh --time
#
# BIN=PATH uses that build of the example instead of building it (on a
# machine without Rust: see `benches/gpu/run.sh`).
set -euo pipefail
shopt -s inherit_errexit # a failed count stops the script
cd "$(dirname "$0")/.."
time=false
if [ "${1:-}" = --time ]; then time=true; fi
if ! $time; then
    command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
fi
if [ -n "${BIN:-}" ]; then
    bin=$BIN
else
    cargo build --release --quiet --example instructions
    bin=target/release/examples/instructions
fi
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 0); fi

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
    # Rounded to the nearest: the difference is a whole count less a
    # hair (the two runs' setups differ by a few instructions), which
    # truncating would take one lower.
    echo $(((2 * (b - a) + n * per) / (2 * n * per)))
}

# Nanoseconds per round trip (per block for batches) of every cache of
# the array `rows` at scale $1: the median over `runs` runs of the
# example, each a new process (whose addresses, and so whose collisions
# in the processor's caches, differ), into the array `times`.
declare -A times
runs=5
time_all() {
    local n=20000 name v k
    if [ "$1" = batch ]; then n=1250; fi
    declare -A all
    for ((k = 0; k < runs; k++)); do
        while read -r name v; do
            all[$name]+="$v "
        done < <("${pin[@]}" "$bin" --time "$1" "$n" "${rows[@]}")
    done
    for name in "${rows[@]}"; do
        times[$name,$1]=$(echo ${all[$name]} | tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    done
}

# A table: the caches of the array `rows` (the first is the baseline of
# the ratios) at the scales of the array `cols`, under the title $1.
table() {
    local c s v
    if $time; then
        for s in "${cols[@]}"; do time_all "$s"; done
    fi
    printf '%-22s' "$1"
    for s in "${cols[@]}"; do printf '%16s' "$s"; done
    echo
    declare -A base
    for c in "${rows[@]}"; do
        printf '%-22s' "$c"
        for s in "${cols[@]}"; do
            if $time; then v=${times[$c,$s]}; else v=$(per_trip "$c" "$s"); fi
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

# The hit path against the map of vectors. In time, also over
# `MonotonicClock`, the default clock, which moves on every millisecond
# of the runs: not in instructions, where Valgrind's slower run sees
# each tick (and the work it brings) dozens of times as often.
rows=(map fixed_time rounded exponential exponential_moved fixed_capacity fixed_capacity_fifo)
if $time; then
    rows=(map fixed_time fixed_time_monotonic rounded exponential exponential_monotonic
        exponential_moved fixed_capacity fixed_capacity_fifo)
fi
cols=(64x1 4096x4 100000x2 batch)
if $time; then table "ns (fastest runs)"; else table instructions; fi
echo
# Through `SharedPool` (FixedTime), against the plain pool: one class, as
# `cargo bench --bench shared_pool`, 64 classes (as many blocks as a
# thread cache holds at first) and 256 classes (more: it grows).
rows=(fixed_time shared thread_caches)
cols=(1x1 64x1 256x1)
table "shared, 1 thread"
