#!/usr/bin/env python3
"""The packed pool on devices of several sizes, over many dynamic-shape traces.

Writes (once) a set of serving traces with `serving.py` into a folder, then
replays each through the replay tool on devices of FACTOR times the trace's
peak live bytes, and prints, for the default packed configuration (or the
one `--packing` names), the backing allocations and failed requests at each
factor, and their totals over the set:

    cargo build --release -p decaying-pool-cli
    python3 benches/traces/capacity_sweep.py                 # the 30 traces
    python3 benches/traces/capacity_sweep.py --packing large_fit=0
    python3 benches/traces/capacity_sweep.py --traces A.csv B.csv --factors 1.1 3

The set: seeds 1-6 of 200 requests, seeds 11-26 of 100, seeds 7-10 of 40,
and seeds 1-2 of 120 requests in ascending and in descending order of size.
Standard library only; the replay tool's `--json` output is read.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SET = (
    [(s, 200, "random") for s in range(1, 7)]
    + [(s, 100, "random") for s in range(11, 27)]
    + [(s, 40, "random") for s in range(7, 11)]
    + [(s, 120, o) for o in ("ascending", "descending") for s in (1, 2)]
)


def write_set(folder):
    os.makedirs(folder, exist_ok=True)
    paths = []
    for seed, requests, order in SET:
        path = os.path.join(folder, f"serving-{seed}-{requests}-{order}.csv")
        if not os.path.exists(path):
            with open(path, "w") as f:
                subprocess.run(
                    [sys.executable, os.path.join(HERE, "serving.py"), str(seed), str(requests), order],
                    stdout=f,
                    check=True,
                )
        paths.append(path)
    return paths


def replay(binary, trace, packing, factors):
    """(unbounded backing allocations, reserved ÷ live, [(allocations, failures)] per factor)."""
    row = "packed" if packing == "on" else f"packed {packing}"

    def run(extra):
        out = subprocess.run(
            [binary, "replay", "--json", "--packing", packing, *extra, trace],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return json.loads(out)

    unbounded = [r for r in run([]) if r["policy"] == row][0]
    peak = unbounded["peak_live_bytes"]
    caps = ",".join(f"{f * peak / 2**30!r}GiB" for f in factors)
    bounded = [r for r in run(["--capacity", caps]) if r["policy"].startswith(row + " @")]
    return (
        unbounded["backing_allocs"],
        unbounded["reserved_over_live"],
        [(r["backing_allocs"], r["failures"]) for r in bounded],
    )


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "decaying-pool"))
    a.add_argument("--dir", default=os.path.join(ROOT, "target", "serving-traces"))
    a.add_argument("--packing", default="on", help="a --packing value of the replay tool (default: on, the defaults)")
    a.add_argument("--factors", nargs="+", type=float, default=[1.02, 1.05, 1.1, 1.25, 1.5, 2, 3, 5])
    a.add_argument("--traces", nargs="+", help="replay these instead of the serving set")
    args = a.parse_args()
    traces = args.traces or write_set(args.dir)
    print(f"packing {args.packing}: backing allocations (failed requests) on a device of F x peak live")
    print(f"{'trace':<36} {'unbounded':>12}" + "".join(f"{f:>11}x" for f in args.factors))
    allocs = [0] * len(args.factors)
    fails = [0] * len(args.factors)
    for t in traces:
        n, ratio, rows = replay(args.bin, t, args.packing, args.factors)
        cells = []
        for i, (b, f) in enumerate(rows):
            allocs[i] += b
            fails[i] += f
            cells.append(f"{b}({f})")
        print(f"{os.path.basename(t)[:36]:<36} {n:>6}/{ratio:<5.2f}" + "".join(f"{c:>12}" for c in cells))
    print(f"{'total':<36} {'':>12}" + "".join(f"{f'{b}({f})':>12}" for b, f in zip(allocs, fails)))


if __name__ == "__main__":
    main()
