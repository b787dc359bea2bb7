#!/usr/bin/env python3
"""One of the replay tool's rows beside PyTorch's expandable segments, on the same traces.

Replays each trace through the replay tool (`decaying-pool replay --json`)
and through the expandable-segments model of the peers' simulator
(`cca_sim.py --json --sims cca_es`, the `cca_es` row: PyTorch's
CUDACachingAllocator with `expandable_segments:True`), on the same device
sizes, and checks the targets below; prints a table and a PASS/FAIL line a
target. The row compared is `--row NAME` (default `mapped`, the page-mapping
layer), replayed with `--extra` (default: `--mapped on` for `mapped`, or
nothing where the replay tool has no `--mapped` option and its default rows
carry `mapped` already; `--packing on` for `packed`; nothing otherwise):

    cargo build --release -p decaying-pool-cli
    pip install sortedcontainers        # cca_sim.py's one dependency
    python3 benches/traces/mapped_sweep.py                        # serving set
    python3 benches/traces/mapped_sweep.py --fixed                # training / inference
    python3 benches/traces/mapped_sweep.py --real                 # every shared workload
    python3 benches/traces/mapped_sweep.py --serving --fixed --real
    python3 benches/traces/mapped_sweep.py --row packed           # the packed pool
    python3 benches/traces/mapped_sweep.py --row "mapped pages 2MiB" --extra "--pages 2MiB"
    python3 benches/traces/mapped_sweep.py --row packed --extra="--packing on,large_fit=0"
    python3 benches/traces/mapped_sweep.py --traces A.csv B.csv --factors 1.1 2
    python3 benches/traces/mapped_sweep.py --per-trace --jobs 4

(`--extra` takes one string, split as a shell would; write `--extra=--flag`
when it is a single word starting with `-`. `--traces` replaces the traces of
every mode selected; the default mode is `--serving`.)

Device sizes: the trace's peak live bytes are the `peak_live_bytes` of our
unbounded replay; a device of F x peak live is int(F x peak) bytes, passed as
the same byte count to both tools (`--capacity NB` to the replay,
`--capacity-bytes N` to cca_sim). The replay's bounded rows are matched by
order (they are named `ROW @ SIZE` with several sizes, `ROW` with one);
cca_sim's by their `capacity_bytes`. Our peak live is checked against
cca_sim's and a difference is reported.

Targets (the costs: ours `modelled_backing_seconds`, the replay's default
`--costs published` unless `--extra` sets another; ES `t_vmm`, its CUDA
virtual-memory calls at the per-call costs of kvcached's VMM benchmark, the
constants at the top of cca_sim.py, which a page-mapping layer's rows are to
be charged with, see shared/peers/README.md):

1. `--serving`: the 30 dynamic-shape serving traces of `capacity_sweep.py`
   (its `SET`, written once by its `write_set` into `--dir`, default
   target/serving-traces), unbounded and on devices of `--factors` (default
   1.02 1.05 1.1 1.5 2 3) x peak live. Summed over the traces, at each device
   size: failed requests, ours <= ES's; modelled backing seconds, ours <= ES
   t_vmm; backing frees, ours `backing_frees` <= 2 x ES `unmaps`; unbounded:
   peak reserved bytes, ours summed <= 1.10 x ES summed (the per-trace
   largest ratio is reported beside it). The set is the one the packed pool's
   capacity sweep is judged on; ES is what a PyTorch user would switch on
   against fragmentation, so the page-mapping layer must fail no more, free
   at most about as often and cost no more than it.
2. `--fixed`: the real training and inference traces (shared/workloads/*.csv
   and cli/traces/training.csv, cli/traces/inference*.csv, identical files
   counted once), unbounded: ours modelled seconds <= our `packed` row's (the
   pool's default packed configuration, replayed in the same run) and <= ES
   t_vmm; peak reserved <= 1.05 x ES. On a fixed-shape workload the page
   layer must not be worse than the packed pool it replaces, nor than ES.
3. `--real`: every trace in shared/workloads (CSV and the snapshot pickle) on
   a device of `--real-factor` (default 1.10) x peak live: failed requests,
   ours 0 on every trace (the README's figure: PyTorch fails 167 requests on
   the inference trace at 1.10x); the summed modelled seconds are printed
   beside ES's t_vmm and our `packed` row's (reported, not a target). A trace
   one tool cannot read (cca_sim reads no pickle) is reported and skipped.

Where our rows carry `pages_created`, `pages_released`, `maps`, `unmaps` they
are printed beside ES's. The replay tool is run with glibc's heap trimming
relaxed (GLIBC_TUNABLES, unless already set): its bounded replays otherwise
spend most of their time in brk and page faults; the output is the same.
It runs a copy of the binary taken at the start, so that a rebuild during
the run cannot mix two builds in one table.

Exit status: 0 when the comparison ran, whether or not the targets pass; 1
when a tool failed (on a --real trace it is only reported) or a row is
missing; 2 for bad usage (no binary, no simulator, no traces). Standard
library only; traces are the only thing written (the serving set).
"""

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
sys.path.insert(0, HERE)
import capacity_sweep  # noqa: E402  (SET, write_set)

GIB = 1 << 30
MIB = 1 << 20
SERVING_FACTORS = [1.02, 1.05, 1.1, 1.5, 2, 3]
DEFAULT_EXTRA = {"mapped": "--mapped on", "packed": "--packing on"}
VMM_FIELDS = ("pages_created", "pages_released", "maps", "unmaps")
TUNABLES = "glibc.malloc.trim_threshold=1073741824:glibc.malloc.top_pad=67108864"


class ToolError(Exception):
    pass


# ---------------------------------------------------------------- the tools
def _run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    tool = os.path.basename(cmd[1] if cmd[0] == sys.executable else cmd[0])
    if p.returncode != 0:
        lines = [x.strip() for x in (p.stderr or p.stdout or "no output").splitlines() if x.strip()]
        errs = [x for x in lines if x.lower().startswith("error")]
        raise ToolError(f"{tool} exit {p.returncode}: {(errs or lines[-1:] or ['no output'])[0]}")
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise ToolError(f"{tool}: unreadable JSON output: {e}")


def has_option(binary, option):
    p = subprocess.run([binary, "replay", "--help"], capture_output=True, text=True)
    return any(w.strip(",") == option for w in p.stdout.split())


def replay_env():
    env = dict(os.environ)
    env.setdefault("GLIBC_TUNABLES", TUNABLES)
    return env


def find_row(rows, name):
    """The policy our rows call `name`: that name, else the one name that starts `name `."""
    names = list(dict.fromkeys(r["policy"].split(" @ ")[0] for r in rows))
    if name in names:
        return name
    cands = [n for n in names if n.startswith(name + " ")]
    if len(cands) == 1:
        return cands[0]
    raise ToolError(f"no row `{name}` in the replay's output (rows: {', '.join(names)})")


def ours(args, trace, caps=None):
    """{row: our row, packed: our packed row} unbounded, or lists of them, one a capacity."""
    cmd = [args.bin, "replay", "--json", *args.extra_args]
    if caps:
        cmd += ["--capacity", ",".join(f"{c}B" for c in caps)]
    rows = _run(cmd + [trace], replay_env())
    name = find_row(rows, args.row)
    packed = find_row(rows, "packed")

    def pick(n):
        got = [r for r in rows if r["policy"].split(" @ ")[0] == n]
        want = len(caps) if caps else 1
        if len(got) != want:
            raise ToolError(f"{len(got)} rows `{n}` from the replay, {want} expected")
        return got if caps else got[0]

    return {"name": name, "row": pick(name), "packed": pick(packed)}


def es(args, trace, caps=()):
    """(cca_sim's peak live, its `none` row, [its row at each capacity])."""
    cmd = [sys.executable, args.sim, "--json", "--sims", "cca_es"]
    for c in caps:
        cmd += ["--capacity-bytes", str(c)]
    out = _run(cmd + [trace])
    t = out[0]
    by = {r["capacity_bytes"]: r for r in t["rows"]}
    try:
        return t["peak_live_bytes"], by[None], [by[c] for c in caps]
    except KeyError as e:
        raise ToolError(f"cca_sim gave no row at capacity {e}")


def sweep(args, traces, factors, fatal):
    """Replays every trace: {trace: result or ToolError}; result has peak, caps, ours_unb, ours_caps, es_peak, es_unb, es_caps.

    Our unbounded replay of a trace comes first (its peak live sets the
    capacities); then cca_sim (one run for all capacities: each run also
    replays unbounded) and our bounded replays (one a capacity) run side by
    side, all traces at once on `--jobs` workers, the largest traces first."""
    res = {t: {} for t in traces}
    failed = {}
    with cf.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        todo = {pool.submit(ours, args, t): (t, "unbounded")
                for t in sorted(traces, key=os.path.getsize, reverse=True)}
        while todo and not (fatal and failed):
            done, _ = cf.wait(todo, return_when=cf.FIRST_COMPLETED)
            for f in done:
                t, kind = todo.pop(f)
                try:
                    r = f.result()
                except ToolError as e:
                    failed.setdefault(t, e)
                    continue
                if kind == "unbounded":
                    peak = r["row"]["peak_live_bytes"]
                    caps = [int(x * peak) for x in factors]
                    res[t].update(peak=peak, caps=caps, ours_unb=r)
                    todo[pool.submit(es, args, t, caps)] = (t, "es")
                    res[t]["bounded"] = [None] * len(caps)
                    for i, c in enumerate(caps):
                        todo[pool.submit(ours, args, t, [c])] = (t, i)
                elif kind != "es":
                    res[t]["bounded"][kind] = r
                    if all(res[t]["bounded"]):
                        b = res[t].pop("bounded")
                        res[t]["ours_caps"] = {"name": b[0]["name"], "row": [x["row"][0] for x in b],
                                               "packed": [x["packed"][0] for x in b]}
                else:
                    res[t]["es_peak"], res[t]["es_unb"], res[t]["es_caps"] = r
        for f in todo:
            f.cancel()
    if failed and fatal:
        t, e = next(iter(failed.items()))
        sys.exit(f"error: {os.path.basename(t)}: {e}")
    for t, e in failed.items():
        res[t] = e
    return res


# ---------------------------------------------------------------- printing
def size(b):
    if b is None:
        return "-"
    return f"{b / GIB:.2f} GiB" if abs(b) >= GIB else f"{b / MIB:.1f} MiB"


def secs(s):
    if s is None:
        return "-"
    return f"{s:.3f} s" if abs(s) >= 1 else f"{s * 1e3:.2f} ms"


def verdict(ok, text):
    print(f"{'PASS' if ok else 'FAIL'}  {text}")


def table(header, rows):
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w[0]) if i == 0 else str(x).rjust(w[i]) for i, x in enumerate(r))
    print(line(header))
    print("  ".join("-" * n for n in w))
    for r in rows:
        print(line(r))


def vmm_cells(o, e):
    """`ours/ES` for pages created, pages released, maps, unmaps (ours `-` where absent)."""
    return [f"{o[k] if k in o else '-'}/{e.get(k, '-')}" for k in VMM_FIELDS]


VMM_HEAD = ["pages ours/ES", "released ours/ES", "maps ours/ES", "unmaps ours/ES"]


def add(total, row, keys):
    for k in keys:
        if k in row and row[k] is not None:
            total[k] = total.get(k, 0) + row[k]
    return total


def check_peak(res):
    miss = [t for t, r in res.items() if isinstance(r, dict) and r.get("es_peak") not in (None, r["peak"])]
    for t in miss:
        r = res[t]
        print(f"note: {os.path.basename(t)}: peak live {r['peak']} B in the replay, {r['es_peak']} B in cca_sim")


def notes(args):
    print(f"row `{args.row}` of `decaying-pool replay {' '.join(args.extra_args) or '(no options)'}` vs cca_sim `cca_es` "
          f"(ours modelled_backing_seconds vs ES t_vmm)")


# ---------------------------------------------------------------- the modes
def serving(args):
    traces = args.traces or capacity_sweep.write_set(args.dir)
    factors = args.factors
    res = sweep(args, traces, factors, fatal=True)
    check_peak(res)
    name = next(iter(res.values()))["ours_unb"]["name"]
    labels = ["unbounded"] + [f"{f:g}x" for f in factors]
    okeys = ("failures", "modelled_backing_seconds", "backing_frees", "peak_reserved_bytes") + VMM_FIELDS
    ekeys = ("failures", "t_vmm", "unmaps", "peak_reserved_bytes") + VMM_FIELDS
    sums = []
    for i in range(len(labels)):
        o, e = {}, {}
        for r in res.values():
            add(o, r["ours_unb"]["row"] if i == 0 else r["ours_caps"]["row"][i - 1], okeys)
            add(e, r["es_unb"] if i == 0 else r["es_caps"][i - 1], ekeys)
        sums.append((o, e))

    print(f"\n== serving set: {len(traces)} traces, summed; row `{name}`")
    notes(args)
    if args.per_trace:
        head = ["trace", "device", "fail ours/ES", "modelled ours", "t_vmm ES", "frees ours", "unmaps ES",
                "peak res. ours", "peak res. ES"]
        rows = []
        for t in traces:
            r = res[t]
            for i, lab in enumerate(labels):
                o = r["ours_unb"]["row"] if i == 0 else r["ours_caps"]["row"][i - 1]
                e = r["es_unb"] if i == 0 else r["es_caps"][i - 1]
                rows.append([os.path.basename(t) if i == 0 else "", lab, f"{o['failures']}/{e['failures']}",
                             secs(o["modelled_backing_seconds"]), secs(e["t_vmm"]), o["backing_frees"],
                             e["unmaps"], size(o["peak_reserved_bytes"]), size(e["peak_reserved_bytes"])])
        table(head, rows)
        print()
    head = ["device", "fail ours", "fail ES", "modelled ours", "t_vmm ES", "frees ours", "2 x unmaps ES",
            "peak res. ours", "peak res. ES"] + VMM_HEAD + ["fail/s/frees"]
    rows = []
    bad = {"fail": [], "s": [], "frees": []}
    for lab, (o, e) in zip(labels, sums):
        oks = (o["failures"] <= e["failures"], o["modelled_backing_seconds"] <= e["t_vmm"],
               o["backing_frees"] <= 2 * e["unmaps"])
        for k, ok in zip(bad, oks):
            if not ok:
                bad[k].append(lab)
        rows.append([lab, o["failures"], e["failures"], secs(o["modelled_backing_seconds"]), secs(e["t_vmm"]),
                     o["backing_frees"], 2 * e["unmaps"], size(o["peak_reserved_bytes"]),
                     size(e["peak_reserved_bytes"])] + vmm_cells(o, e)
                    + ["/".join("ok" if x else "FAIL" for x in oks)])
    table(head, rows)
    ratios = sorted(((r["ours_unb"]["row"]["peak_reserved_bytes"] / r["es_unb"]["peak_reserved_bytes"], t)
                     for t, r in res.items()), reverse=True)
    o, e = sums[0]
    ratio = o["peak_reserved_bytes"] / e["peak_reserved_bytes"]
    print()
    fails = lambda k: "every size" if not bad[k] else "failing at " + ", ".join(bad[k])
    verdict(not bad["fail"], f"failed requests, ours <= ES, summed at each device size ({fails('fail')})")
    verdict(not bad["s"], f"modelled backing seconds, ours <= ES t_vmm, summed at each device size ({fails('s')})")
    verdict(not bad["frees"], f"backing frees, ours <= 2 x ES unmaps, summed at each device size ({fails('frees')})")
    verdict(ratio <= 1.10, f"unbounded peak reserved, ours {size(o['peak_reserved_bytes'])} <= 1.10 x ES "
            f"{size(e['peak_reserved_bytes'])} (ratio {ratio:.3f}; per trace max {ratios[0][0]:.3f}, "
            f"{os.path.basename(ratios[0][1])}; min {ratios[-1][0]:.3f})")
    return 0


def dedupe(paths):
    seen, out = {}, []
    for p in paths:
        with open(p, "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()
        if h in seen:
            print(f"note: {p} is a copy of {seen[h]}: counted once")
            continue
        seen[h] = p
        out.append(p)
    return out


def fixed(args):
    import glob
    traces = args.traces or (sorted(glob.glob(os.path.join(args.workloads, "*.csv")))
                             + [p for p in [os.path.join(ROOT, "cli", "traces", "training.csv")]
                                + sorted(glob.glob(os.path.join(ROOT, "cli", "traces", "inference*.csv")))
                                if os.path.exists(p)])
    if not traces:
        sys.exit(f"error: no training / inference traces (looked in {args.workloads} and cli/traces)")
    traces = dedupe(traces)
    res = sweep(args, traces, [], fatal=True)
    check_peak(res)
    name = next(iter(res.values()))["ours_unb"]["name"]
    print(f"\n== fixed: {len(traces)} traces, unbounded; row `{name}`")
    notes(args)
    head = ["trace", "peak live", "modelled ours", "packed", "t_vmm ES", "peak res. ours", "peak res. ES",
            "ratio", "fail ours/ES"] + VMM_HEAD
    rows, bad_s, bad_p = [], [], []
    for t in traces:
        r = res[t]
        o, p, e = r["ours_unb"]["row"], r["ours_unb"]["packed"], r["es_unb"]
        ratio = o["peak_reserved_bytes"] / e["peak_reserved_bytes"]
        s = o["modelled_backing_seconds"]
        if not (s <= p["modelled_backing_seconds"] and s <= e["t_vmm"]):
            bad_s.append(os.path.basename(t))
        if ratio > 1.05:
            bad_p.append(os.path.basename(t))
        rows.append([os.path.basename(t), size(r["peak"]), secs(s), secs(p["modelled_backing_seconds"]),
                     secs(e["t_vmm"]), size(o["peak_reserved_bytes"]), size(e["peak_reserved_bytes"]),
                     f"{ratio:.3f}", f"{o['failures']}/{e['failures']}"] + vmm_cells(o, e))
    table(head, rows)
    print()
    verdict(not bad_s, "modelled backing seconds, ours <= packed and <= ES t_vmm, on every trace"
            + (f" (failing on {', '.join(bad_s)})" if bad_s else ""))
    verdict(not bad_p, "peak reserved, ours <= 1.05 x ES, on every trace"
            + (f" (failing on {', '.join(bad_p)})" if bad_p else ""))
    return 0


def real(args):
    import glob
    traces = args.traces or sorted(p for p in glob.glob(os.path.join(args.workloads, "*"))
                                   if p.endswith((".csv", ".pickle", ".pkl")))
    if not traces:
        sys.exit(f"error: no traces in {args.workloads}")
    f = args.real_factor
    res = sweep(args, traces, [f], fatal=False)
    check_peak(res)
    ok = {t: r for t, r in res.items() if isinstance(r, dict)}
    names = {r["ours_unb"]["name"] for r in ok.values()}
    print(f"\n== real: {len(traces)} traces on a device of {f:g}x peak live; row `{', '.join(names)}`")
    notes(args)
    head = ["trace", "device", "fail ours", "fail ES", "fail packed", "modelled ours", "t_vmm ES", "packed",
            "peak res. ours", "peak res. ES"] + VMM_HEAD
    rows, bad = [], []
    tot = {"o": 0.0, "e": 0.0, "p": 0.0}
    for t in traces:
        r = res[t]
        if not isinstance(r, dict):
            print(f"skipped: {os.path.basename(t)}: {r}")
            continue
        o, p, e = r["ours_caps"]["row"][0], r["ours_caps"]["packed"][0], r["es_caps"][0]
        if o["failures"]:
            bad.append(f"{os.path.basename(t)} {o['failures']}")
        tot["o"] += o["modelled_backing_seconds"]
        tot["e"] += e["t_vmm"]
        tot["p"] += p["modelled_backing_seconds"]
        rows.append([os.path.basename(t), size(r["caps"][0]), o["failures"], e["failures"], p["failures"],
                     secs(o["modelled_backing_seconds"]), secs(e["t_vmm"]), secs(p["modelled_backing_seconds"]),
                     size(o["peak_reserved_bytes"]), size(e["peak_reserved_bytes"])] + vmm_cells(o, e))
    if rows:
        rows.append(["total", "", "", "", "", secs(tot["o"]), secs(tot["e"]), secs(tot["p"]), "", ""]
                    + [""] * len(VMM_HEAD))
        table(head, rows)
    print()
    if not ok:
        print("error: no trace could be compared")
        return 1
    verdict(not bad, f"failed requests at {f:g}x, ours 0 on every trace compared ({len(ok)} of {len(traces)})"
            + (f" (failing: {', '.join(bad)})" if bad else ""))
    print(f"info  summed modelled seconds: ours {secs(tot['o'])}, ES t_vmm {secs(tot['e'])} "
          f"({'<=' if tot['o'] <= tot['e'] else '>'}), our packed {secs(tot['p'])} "
          f"({'<=' if tot['o'] <= tot['p'] else '>'}); reported, not a target")
    return 0


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--serving", action="store_true", help="target 1, the serving set (the default mode)")
    a.add_argument("--fixed", action="store_true", help="target 2, training and inference traces, unbounded")
    a.add_argument("--real", action="store_true", help="target 3, every shared workload at --real-factor")
    a.add_argument("--row", default="mapped", help="our row to compare (default: mapped)")
    a.add_argument("--extra", help="replay arguments for the row (default: `--mapped on` for mapped, "
                   "`--packing on` for packed)")
    a.add_argument("--traces", nargs="+", help="these traces instead of each mode's own")
    a.add_argument("--factors", nargs="+", type=float, default=SERVING_FACTORS,
                   help="--serving: device sizes, multiples of peak live (default: %(default)s)")
    a.add_argument("--real-factor", type=float, default=1.10, help="--real: device size (default: 1.10)")
    a.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel replays (default: the CPUs)")
    a.add_argument("--per-trace", action="store_true", help="--serving: a row a trace and device size too")
    a.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "decaying-pool"))
    a.add_argument("--sim", default=os.path.join(SHARED, "peers", "cca_sim.py"))
    a.add_argument("--dir", default=os.path.join(ROOT, "target", "serving-traces"),
                   help="where the serving set is written (once)")
    a.add_argument("--workloads", default=os.path.join(SHARED, "workloads"))
    args = a.parse_args()
    if not os.access(args.bin, os.X_OK):
        a.exit(2, f"error: no replay tool at {args.bin} (cargo build --release -p decaying-pool-cli)\n")
    if args.extra is None:
        args.extra = DEFAULT_EXTRA.get(args.row, "")
        if args.row == "mapped" and not has_option(args.bin, "--mapped"):
            args.extra = ""  # a build without --mapped: its default rows carry `mapped`
    args.extra_args = shlex.split(args.extra)
    if not os.path.exists(args.sim):
        a.exit(2, f"error: no simulator at {args.sim}\n")
    for t in args.traces or []:
        if not os.path.exists(t):
            a.exit(2, f"error: no trace {t}\n")
    if args.jobs < 1 or any(f <= 0 for f in args.factors) or args.real_factor <= 0:
        a.exit(2, "error: --jobs and the factors must be positive\n")
    modes = [m for m, on in ((serving, args.serving), (fixed, args.fixed), (real, args.real)) if on] or [serving]
    start = time.monotonic()
    rc = 0
    with tempfile.TemporaryDirectory(prefix="mapped_sweep-") as tmp:
        # Every replay of the run from one build, though the binary be rebuilt meanwhile.
        args.bin = shutil.copy2(args.bin, os.path.join(tmp, "decaying-pool"))
        for m in modes:
            rc = max(rc, m(args))
    print(f"\n({time.monotonic() - start:.0f} s, {args.jobs} jobs)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
