#!/usr/bin/env python3
"""The replay tool on damaged traces: exit codes 0, 1 or 2, never a panic,
an abort or a hang.

Takes the trace the crate ships (`cli/traces/inference.csv`), its native
and RMM forms and, when the project's shared folder is beside the
repository, the real snapshot pickle; damages each run's copy at random
(a field replaced by an extreme or malformed value, a row repeated,
dropped or cut short, bytes of the pickle overwritten or the file cut)
and replays it with options drawn at random (devices, streams, packing,
`--repeat` and `--gap`, SVG and Chrome output). Prints every run that
ended otherwise, and keeps its input as `mutate-bad-N.*` in the working
folder:

    cargo build --release -p decaying-pool-cli
    python3 benches/traces/mutate.py                 # seed 1, 300 runs
    python3 benches/traces/mutate.py --seed 2 --runs 1000

Standard library only. Exits 1 if a run failed.
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHIPPED = os.path.join(ROOT, "cli", "traces", "inference.csv")
PICKLE = os.path.join(
    ROOT, "..", "shared", "workloads", "pytorch_cs336_medium_ctx128_inference.pickle"
)

WEIRD = [
    "0", "-1", "18446744073709551615", "18446744073709551616", "0x", "0xffffffffffffffff",
    "1e9", "", " ", "nan", "9" * 40, "alloc", "free", "free_completed", "allocate",
    "allocate failure", "oom", "snapshot", "segment_map", "user_defined", "99:99:99.9",
    "23:59:59.999999", "\u00e9",
]

OPTIONS = [
    [], [], [],
    ["--device", "1"], ["--stream", "7"], ["--strict"],
    ["--packing", "default"], ["--capacity", "0.036GiB"], ["--capacity", "0.00001GiB"],
    ["--repeat", "3", "--gap", "5"], ["--repeat", "2", "--gap", "1000000000000000"],
    ["--reaper", "0"], ["--ttl", "1ns,1s"], ["--half-life", "1ms"], ["--slots", "0,1"],
    ["--limit", "1B,1M"], ["--size-class", "pow2/4,x512B"], ["--capacity", "3"], ["--json"],
    ["--svg", "SVG", "--chrome-trace", "CHROME"],
]


def forms(rows):
    """The shipped trace in the three text formats: (name, header, rows)."""
    body = [r for r in rows if r and not r.startswith("#")]
    pytorch = (body[0], body[1:])
    native, rmm = ["time_ns,action,addr,size"], ["Thread,Time,Action,Pointer,Size,Stream"]
    for r in body[1:]:
        device, time_us, action, addr, size, _stream = r.split(",")
        if action not in ("alloc", "free_completed"):
            continue
        op = "alloc" if action == "alloc" else "free"
        native.append(f"{int(time_us) * 1000},{op},{addr},{size}")
        s = int(time_us) / 1e6
        tod = "%02d:%02d:%09.6f" % (int(s // 3600) % 24, int(s // 60) % 60, s % 60)
        rmm.append(f"1,{tod},{'allocate' if op == 'alloc' else 'free'},{addr},{size},0x1f")
    return [
        ("pytorch.csv", pytorch[0], pytorch[1]),
        ("native.csv", native[0], native[1:]),
        ("rmm.csv", rmm[0], rmm[1:]),
    ]


def damage_rows(rng, rows):
    rows = list(rows[: rng.randint(1, 400)])
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(rows))
        fields = rows[i].split(",")
        k = rng.random()
        if k < 0.6:
            fields[rng.randrange(len(fields))] = rng.choice(WEIRD + [str(rng.randint(0, 1 << 64))])
        elif k < 0.75:
            rows.insert(rng.randrange(len(rows) + 1), rows[i])
        elif k < 0.85:
            fields = fields[:-1]
        else:
            fields.append("x")
        rows[i] = ",".join(fields)
    return rows


def damage_bytes(rng, data):
    data = bytearray(data)
    if rng.random() < 0.3:
        return bytes(data[: rng.randrange(2, len(data))])
    for _ in range(rng.randint(1, 20)):
        data[rng.randrange(2, len(data))] = rng.randrange(256)
    return bytes(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=60, help="seconds a run may take")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "decaying-pool"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(SHIPPED) as f:
        texts = forms(f.read().splitlines())
    pickle = None
    if os.path.exists(PICKLE):
        with open(PICKLE, "rb") as f:
            pickle = f.read()
    bad = 0
    codes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            if pickle is not None and rng.random() < 0.25:
                name, data = "snapshot.pickle", damage_bytes(rng, pickle)
            else:
                name, header, rows = rng.choice(texts)
                data = ("\n".join([header] + damage_rows(rng, rows)) + "\n").encode()
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(data)
            opts = [
                os.path.join(tmp, "out." + o.lower()) if o in ("SVG", "CHROME") else o
                for o in rng.choice(OPTIONS)
            ]
            cmd = [args.bin, "replay", path] + opts
            try:
                p = subprocess.run(cmd, capture_output=True, timeout=args.timeout)
                code, err = p.returncode, p.stderr.decode(errors="replace")
            except subprocess.TimeoutExpired:
                code, err = "timeout", ""
            codes[code] = codes.get(code, 0) + 1
            if code not in (0, 1, 2) or "panicked" in err:
                bad += 1
                keep = f"mutate-bad-{run}.{name.split('.')[-1]}"
                with open(keep, "wb") as f:
                    f.write(data)
                print(f"run {run}: {code} from {' '.join(cmd[1:])} (input kept as {keep})")
                print(err[-600:])
    print(f"{args.runs} runs (seed {args.seed}), exit codes {codes}, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
