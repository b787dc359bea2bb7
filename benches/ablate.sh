#!/usr/bin/env bash
# Where a hit's time goes: builds `examples/instructions.rs` once as it is
# and once for each patch in `benches/ablations/` (each takes one piece
# of the pool's per-block work out: a measurement, never a build to
# use; most of them break the pool's guarantees), then counts each
# build's instructions (with `valgrind` on the PATH) and times it
# against the unchanged build in alternating pinned runs.
#
#   bash benches/ablate.sh [SCALE] [CACHE] [ROUNDS]
#
# SCALE is `batch` (the default) or CLASSESxPER (`64x1`), CACHE a cache
# of `examples/instructions.rs` (default `fixed_time`), ROUNDS the timed
# runs of each build (default 5). The last row, `all`, takes out every
# patch but `stale_after_hit` at once. A cell is the median of the
# rounds' fastest times (ns per round trip, or per block of a batch),
# with the map of vectors' median from the same runs beside it.
#
# The patches are diffs against the commit that added them (see
# docs/PERFORMANCE.md, "Where a batch's time goes"); one that no longer applies is
# reported and skipped. Each build lives in a folder of one name length,
# so that where the loader puts the stack does not differ between them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scale=${1:-batch}
cache=${2:-fixed_time}
rounds=${3:-5}
n=100000
if [ "$scale" = batch ]; then n=10000; fi

work=$(mktemp -d)
trap 'git worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --quiet --detach "$work/tree" HEAD
export CARGO_TARGET_DIR=$work/target

# Builds the example in the worktree as it stands into folder $1.
build() {
    # A patch that leaves code unused makes warnings: shown only if the
    # build fails.
    (cd "$work/tree" && cargo build --release --quiet --example instructions) \
        >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
    mkdir -p "$work/$1"
    cp "$CARGO_TARGET_DIR/release/examples/instructions" "$work/$1/inst"
}

names=(base)
dirs=(b00)
build b00
i=0
patches=(benches/ablations/*.patch)
for p in "${patches[@]}" all; do
    i=$((i + 1))
    dir=$(printf 'b%02d' "$i")
    (cd "$work/tree" && git checkout --quiet -- .)
    if [ "$p" = all ]; then
        ok=true
        for q in "${patches[@]}"; do
            case $q in *stale_after_hit*) continue ;; esac
            (cd "$work/tree" && git apply "$root/$q") || ok=false
        done
    else
        ok=true
        (cd "$work/tree" && git apply "$root/$p") || ok=false
    fi
    name=$(basename "$p" .patch)
    if ! $ok; then
        echo "$name: the patch no longer applies; skipped" >&2
        continue
    fi
    build "$dir"
    names+=("$name")
    dirs+=("$dir")
done

pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 0); fi

# Instructions per round trip (per block of a batch) of build $1.
count() {
    local per=1
    if [ "$scale" = batch ]; then per=16; fi
    local a b
    a=$(valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        "$work/$1/inst" "$cache" "$scale" "$n" 2>&1 | awk '/I *refs/ { gsub(",", "", $NF); print $NF }')
    b=$(valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        "$work/$1/inst" "$cache" "$scale" $((2 * n)) 2>&1 | awk '/I *refs/ { gsub(",", "", $NF); print $NF }')
    echo $(((2 * (b - a) + n * per) / (2 * n * per)))
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

printf '%-18s %12s %10s %10s\n' build instructions "$cache" map
for k in "${!names[@]}"; do
    dir=${dirs[$k]}
    ins=-
    if command -v valgrind >/dev/null; then ins=$(count "$dir"); fi
    : >"$work/t_pool" && : >"$work/t_map"
    for _ in $(seq "$rounds"); do
        # The unchanged build runs between two runs of the patched one's
        # rounds, so both see the machine alike.
        for d in b00 "$dir"; do
            out=$("${pin[@]}" "$work/$d/inst" --time "$scale" "$n" map "$cache")
            if [ "$d" = "$dir" ]; then
                echo "$out" | awk -v c="$cache" '$1 == c { print $2 }' >>"$work/t_pool"
                echo "$out" | awk '$1 == "map" { print $2 }' >>"$work/t_map"
            fi
        done
    done
    printf '%-18s %12s %10s %10s\n' "${names[$k]}" "$ins" \
        "$(median <"$work/t_pool")" "$(median <"$work/t_map")"
done
