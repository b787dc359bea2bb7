# Sourced by .ci/run and .ci/verify: section banners, and the table of
# the sections' times that .ci/run prints at its end.
#
# A section lasts from its banner to the next banner of the same lane (or
# the lane's end). Each lane appends `SECONDS_SINCE_EPOCH<TAB>NAME` lines to
# `$CI_TIMES/$CI_LANE` (nothing is recorded when CI_TIMES is unset, as when
# .ci/verify runs alone); `note` adds a figure to the lane's current
# section (a fuzz target's executions a second).

# The banner, and the section's start in the lane's record.
section() {
    printf '\n=== %s (%ss)\n' "$1" "$SECONDS"
    if [ -n "${CI_TIMES:-}" ]; then
        printf '%s\t%s\n' "$(date +%s)" "$1" >>"$CI_TIMES/${CI_LANE:-main}"
    fi
}

# A figure for the lane's current section, shown beside its time.
note() {
    if [ -n "${CI_TIMES:-}" ]; then
        printf 'note\t%s\n' "$*" >>"$CI_TIMES/${CI_LANE:-main}"
    fi
}

# The lane's end: its last section's time runs to here.
lane_end() {
    if [ -n "${CI_TIMES:-}" ]; then
        printf '%s\t-\n' "$(date +%s)" >>"$CI_TIMES/${CI_LANE:-main}"
    fi
}

# The table: for each lane, each section's seconds (and its notes), then
# the lane's total.
print_times() {
    local f
    printf '\n%-8s %7s  %s\n' lane seconds section
    for f in "$CI_TIMES"/*; do
        [ -f "$f" ] || continue
        awk -F'\t' -v lane="$(basename "$f")" -v now="$(date +%s)" '
            function flush(end) {
                if (name != "") {
                    printf "%-8s %7d  %s%s\n", lane, end - start, name, notes
                }
            }
            $1 == "note" { notes = notes " [" $2 "]"; next }
            {
                if (first == "") first = $1
                flush($1)
                start = $1; name = ($2 == "-" ? "" : $2); notes = ""; last = $1
            }
            END {
                if (name != "") { flush(now); last = now }
                printf "%-8s %7d  (the lane, in all)\n", lane, last - first
            }' "$f"
    done
}
