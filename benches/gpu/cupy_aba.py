"""The A/B/A fragmentation case (`cli/traces/aba_frag.csv`, a copy of the
peers' `aba_frag.csv`) replayed with CuPy arrays on a device limited to the
scenario's 8 GiB, under CuPy's own memory pool and under the decaying pool
(`decaying_pool.cupy.enable(limit="8GiB")`), each in a process of its own.

    python3 benches/gpu/cupy_aba.py [OUT.json] [--trace cli/traces/aba_frag.csv] [--capacity 8GiB]

On the GPU machine (no pip install; `benches/gpu/build.sh` copies the package
and the library into `.gpu/`):

    PYTHONPATH=.gpu/python DECAYING_POOL_LIBRARY=.gpu/lib/libdecaying_pool.so \
        python3 benches/gpu/cupy_aba.py /tmp/gpu-out/cupy_aba.json

The trace: a 1 GiB output and a 4 GiB temporary; the temporary freed; 1 GiB;
then 1 GiB and 4 GiB again. A splitting cache (CuPy's, PyTorch's) carves the
1 GiB blocks out of the freed 4 GiB block, and the second 4 GiB then fails on
an 8 GiB device with most of it free; an exact cache keeps the 4 GiB block
whole and serves it again.

Modes:
- `cupy`: `cupy.cuda.MemoryPool` (the class of CuPy's default pool) with
  `set_limit(size=CAPACITY)`, the limit CuPy offers (it refuses a request
  that would take the pool past it, without freeing cached blocks first);
- `cupy-device`: the same pool without `set_limit`, over a base allocator
  that fails with `cudaErrorMemoryAllocation` past CAPACITY bytes of device
  memory, as an 8 GiB device would (the pool then frees its unsplit cached
  blocks and retries, as it does on a full device);
- `dp`: `decaying_pool.cupy.enable(limit=CAPACITY)` (packing on, the
  library's defaults otherwise).

Each allocation is `cupy.empty(size, uint8)` filled (so the memory is
touched), each free drops the array; the trace's times are kept (10 ms
apart). Reported per step: success or failure (with the error), the pool's
reserved and in-use bytes, the device's used bytes over the process's
baseline (`cudaMemGetInfo`); per mode: peak reserved, device allocations
and frees (CuPy: counted in the base allocator, which is `cudaMalloc` /
`cudaFree` as CuPy's own; dp: `backing_allocs` / `backing_deallocs`).
It fails soft: without CuPy or a CUDA device it prints why and exits 0; a
mode that errors is reported and the next one runs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = ROOT / "cli" / "traces" / "aba_frag.csv"
MODES = ("cupy", "cupy-device", "dp")
GIB = 1 << 30
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20,
         "G": GIB, "GIB": GIB, "T": 1 << 40, "TIB": 1 << 40}


def parse_size(text):
    t = text.strip().upper()
    num = t.rstrip("KMGTIB")
    return int(float(num) * UNITS[t[len(num):]])


def read_trace(path):
    """(time_ns, is_alloc, addr, size) rows of a native trace."""
    rows = []
    with open(path) as f:
        header = None
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if header is None:
                header = {n: i for i, n in enumerate(line.split(","))}
                continue
            c = line.split(",")
            action = c[header["action"]]
            rows.append((int(c[header["time_ns"]]), action == "alloc",
                         int(c[header["addr"]], 0), int(c[header["size"]])))
    return rows


def gib(x):
    return "-" if x is None else f"{x / GIB:.2f}"


# --------------------------------------------------------------------------
# The child: one allocator, one process.
# --------------------------------------------------------------------------


def child(args):
    result = {"mode": args.child, "capacity": args.capacity, "status": "started", "steps": []}

    def save():
        with open(args.result, "w") as f:
            json.dump(result, f, indent=1)

    save()
    mode = args.child
    cap = args.capacity
    dp = None
    import cupy

    result["cupy"] = cupy.__version__
    runtime = cupy.cuda.runtime
    dev = cupy.cuda.Device(0)
    dev.use()
    runtime.free(runtime.malloc(1 << 20))  # the context, before the baseline
    baseline_free, total = runtime.memGetInfo()
    result["total_memory"] = total
    name = runtime.getDeviceProperties(0).get("name", b"?")
    result["device"] = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    counts = {"allocs": 0, "frees": 0, "failed": 0, "held": 0}
    pool = None

    if mode in ("cupy", "cupy-device"):

        class DeviceBlock:
            """One cudaMalloc, freed (and counted) when the pool drops it."""

            def __init__(self, size):
                if mode == "cupy-device" and counts["held"] + size > cap:
                    counts["failed"] += 1
                    raise runtime.CUDARuntimeError(runtime.errorMemoryAllocation)
                self.ptr = runtime.malloc(size)
                self.size = size
                counts["allocs"] += 1
                counts["held"] += size

            def __del__(self):
                if getattr(self, "ptr", 0):  # not when __init__ refused
                    runtime.free(self.ptr)
                    counts["frees"] += 1
                    counts["held"] -= self.size

        def base_alloc(size):
            block = DeviceBlock(size)
            mem = cupy.cuda.memory.UnownedMemory(block.ptr, size, block, 0)
            return cupy.cuda.MemoryPointer(mem, 0)

        pool = cupy.cuda.MemoryPool(allocator=base_alloc)
        if mode == "cupy":
            pool.set_limit(size=cap)
            result["pool_limit"] = pool.get_limit()
        cupy.cuda.set_allocator(pool.malloc)

        def figures():
            return {"reserved": pool.total_bytes(), "in_use": pool.used_bytes(),
                    "device_allocs": counts["allocs"], "device_frees": counts["frees"],
                    "device_failures": counts["failed"]}
    elif mode == "dp":
        import decaying_pool
        import decaying_pool.cupy

        dp = decaying_pool
        result["library"] = decaying_pool.library_path()
        # The library refuses a bare number. A configuration is whole:
        # --dp-config adds keys (backend=host for a dry run without a GPU).
        extra = dict(kv.split("=", 1) for kv in args.dp_config.split(",") if kv)
        result["dp_config"] = {"limit": f"{cap}B", **extra}
        decaying_pool.cupy.enable(**result["dp_config"])

        def figures():
            s = dp.stats(0)
            st = s["stats"]
            return {"reserved": s.get("reserved"), "in_use": st.get("bytes_in_use"),
                    "device_allocs": st.get("backing_allocs"),
                    "device_frees": st.get("backing_deallocs"),
                    "device_failures": st.get("backing_failures"),
                    "peak_reserved": st.get("peak_bytes_reserved"),
                    "limit": s.get("limit")}
    else:
        raise SystemExit(f"unknown mode {mode}")

    arrays = {}
    peak_reserved = peak_device = 0
    t0 = time.perf_counter_ns()
    for time_ns, is_alloc, addr, size in read_trace(args.trace):
        wait = t0 + time_ns - time.perf_counter_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        step = {"t_ms": time_ns / 1e6, "action": "alloc" if is_alloc else "free",
                "addr": hex(addr), "size": size}
        if is_alloc:
            try:
                a = cupy.empty(size, dtype=cupy.uint8)
                a.fill(1)
                dev.synchronize()
                arrays[addr] = a
                step["ok"] = True
            except MemoryError as e:  # CuPy's OutOfMemoryError, and the plug-in's
                step["ok"] = False
                step["error"] = f"{type(e).__name__}: {e}"[:300]
        else:
            a = arrays.pop(addr, None)
            step["ok"] = True
            if a is None:
                step["skipped"] = "its allocation failed"
            del a
            dev.synchronize()
        f = figures()
        free, _ = runtime.memGetInfo()
        f["device_used"] = baseline_free - free
        f["live"] = sum(x.nbytes for x in arrays.values())
        step.update(f)
        peak_reserved = max(peak_reserved, f.get("reserved") or 0)
        peak_device = max(peak_device, f["device_used"])
        result["steps"].append(step)
        save()
    end = figures()
    result["end"] = end
    result["peak_reserved"] = end.get("peak_reserved") or peak_reserved
    result["peak_device_used"] = peak_device
    result["failed_allocs"] = sum(1 for s in result["steps"] if not s["ok"])
    result["status"] = "done"
    arrays.clear()
    if pool is not None:
        pool.free_all_blocks()
        result["device_frees_after_free_all_blocks"] = counts["frees"]
    save()
    return 0


# --------------------------------------------------------------------------
# The parent.
# --------------------------------------------------------------------------


def run_child(mode, args, timeout):
    fd, path = tempfile.mkstemp(prefix=f"cupy_aba_{mode}_", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--result", path,
           "--trace", str(args.trace), "--capacity", str(args.capacity), "--dp-config", args.dp_config]
    print(f"== {mode}", flush=True)
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        rc, tail = "timeout", (out.decode(errors="replace") if isinstance(out, bytes) else out)[-3000:]
    try:
        with open(path) as f:
            r = json.load(f)
    except Exception as e:
        r = {"mode": mode, "status": f"no result ({e})", "steps": []}
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    r["rc"], r["wall_s"] = rc, time.perf_counter() - t
    if rc != 0:
        r["status"] = f"rc {rc}: " + r.get("status", "")
        r["output_tail"] = tail
        print(f"   {mode} failed (rc {rc}); last output:")
        for line in tail.strip().splitlines()[-12:]:
            print("   | " + line)
    for s in r.get("steps", []):
        print(
            f"   {s['t_ms']:5.0f} ms {s['action']:5} {s['addr']:>7} {s['size'] / GIB:4.1f} GiB: "
            f"{'skip' if 'skipped' in s else 'ok  ' if s['ok'] else 'FAIL'} reserved {gib(s.get('reserved'))}, in use "
            f"{gib(s.get('in_use'))}, live {gib(s.get('live'))}, device {gib(s.get('device_used'))} GiB, "
            f"device allocs {s.get('device_allocs')}, frees {s.get('device_frees')}"
            + (f"  [{s['error']}]" if not s["ok"] and "error" in s else ""),
            flush=True,
        )
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="write the figures as JSON here")
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--capacity", default="8GiB", help="the scenario's device (default 8GiB)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--dp-config", default="", help="more pool keys, KEY=VALUE,... (e.g. backend=host)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.capacity = parse_size(str(args.capacity))
    if args.child:
        return child(args)

    report = {"script": "benches/gpu/cupy_aba.py", "trace": str(args.trace),
              "capacity": args.capacity, "runs": []}

    def finish(skipped=None):
        if skipped:
            report["skipped"] = skipped
            print(f"cupy_aba: skipped: {skipped}", flush=True)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
            print(f"cupy_aba: figures written to {args.out}")
        return 0

    if not Path(args.trace).is_file():
        return finish(f"no trace at {args.trace}")
    try:
        import cupy
    except Exception as e:
        return finish(f"CuPy is not importable ({type(e).__name__}: {e})")
    report["cupy"] = cupy.__version__
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        n, report["cuda_error"] = 0, f"{type(e).__name__}: {e}"
    if n == 0:
        return finish(f"no CUDA device (cupy {cupy.__version__}: {report.get('cuda_error', 'no device')})")
    try:
        import decaying_pool

        report["library"] = decaying_pool.library_path()
        dp_problem = None
    except Exception as e:
        dp_problem = f"decaying_pool unusable: {type(e).__name__}: {e}"
    print(f"cupy_aba: cupy {cupy.__version__}, {os.path.basename(args.trace)} on a "
          f"{args.capacity / GIB:g} GiB device, library {report.get('library', '-')}", flush=True)
    for mode in args.modes.split(","):
        if mode not in MODES:
            report["runs"].append({"mode": mode, "status": "skipped: unknown mode"})
            continue
        if mode == "dp" and dp_problem:
            print(f"== dp: skipped: {dp_problem}")
            report["runs"].append({"mode": mode, "status": "skipped: " + dp_problem})
            continue
        report["runs"].append(run_child(mode, args, args.timeout_s))
    print()
    head = ("mode", "allocs ok", "failed", "peak reserved GiB", "peak device GiB", "device allocs",
            "device frees", "status")
    rows = [head]
    for r in report["runs"]:
        steps = r.get("steps", [])
        end = r.get("end") or (steps[-1] if steps else {})
        allocs = [s for s in steps if s["action"] == "alloc"]
        rows.append((r["mode"], f"{sum(1 for s in allocs if s['ok'])}/{len(allocs)}",
                     ", ".join(f"{s['size'] / GIB:g} GiB at {s['t_ms']:.0f} ms"
                               for s in allocs if not s["ok"]) or "-",
                     gib(r.get("peak_reserved")), gib(r.get("peak_device_used")),
                     str(end.get("device_allocs", "-")), str(end.get("device_frees", "-")),
                     str(r.get("status", "?"))[:40]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    print("\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows))
    return finish()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        print("cupy_aba: stopped by the error above", flush=True)
        sys.exit(0 if "--child" not in sys.argv else 1)
