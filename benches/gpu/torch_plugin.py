"""A `transformers` generate loop under three CUDA allocators, each in a
process of its own: PyTorch's default caching allocator (`native`), the same
with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (`expandable`), and
the decaying pool behind PyTorch's pluggable-allocator door
(`dp`: `decaying_pool.torch.enable()` before any CUDA allocation). Then the
same three again with the device capped by
`torch.cuda.set_per_process_memory_fraction(f)` (under `dp` the plug-in's
memory-fraction hook, `dp_set_memory_fraction`), where
f = FACTOR x the native run's peak reserved bytes / the device's memory.

    python3 benches/gpu/torch_plugin.py [OUT.json] [--factor 1.10] [--model auto|random|NAME]
        [--modes native,dp,expandable] [--work N] [--budget-s 40] [--deadline-s 270]

On the GPU machine (no pip install; `benches/gpu/build.sh` copies the package
and the library into `.gpu/`):

    PYTHONPATH=.gpu/python DECAYING_POOL_LIBRARY=.gpu/lib/libdecaying_pool.so \
        python3 benches/gpu/torch_plugin.py /tmp/gpu-out/torch_plugin.json

The model: the first of a few small causal LMs the Hugging Face cache holds
(`from_pretrained(..., local_files_only=True)`; nothing is downloaded), else
GPT-2 small built from `GPT2Config` with random weights, in bfloat16 on the
device. The prompts are random token ids (no tokenizer needed); generation is
greedy with `min_new_tokens = max_new_tokens`, so each generate makes the
same number of decode steps under every allocator. The batches and lengths
change from call to call (dynamic shapes), so the KV caches grow every step
and no two generates ask for the same sizes.

Per run: the wall time of each generate (with `torch.cuda.synchronize()`
before and after; mean, p50 and p99, which is the largest with fewer than 100
generates), the time per decode step, peak reserved bytes
(`torch.cuda.max_memory_reserved()`; under `dp`, `decaying_pool.stats()`'s
`peak_bytes_reserved`, since PyTorch keeps no figures for a pluggable
allocator), the device allocation calls (`memory_stats()`'s
`num_device_alloc` / `num_device_free`; under `dp`, `backing_allocs` /
`backing_deallocs`), over the whole process and over the generate loop alone,
and the failures (OOM exceptions, other errors; under `dp`
`backing_failures` too: PyTorch does not check a pluggable allocator's NULL,
so a failed request shows later as a CUDA error, which ends the run).

It fails soft: without torch, transformers or a CUDA device it prints why and
exits 0; a mode that errors, or runs past its time, is reported and the next
one runs. A child writes its figures after every generate, so a run cut
short still reports what it measured.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback

MODES = {
    "native": None,
    "expandable": "expandable_segments:True",
    "dp": None,
}

# Small causal LMs tried from the local cache, in order.
CANDIDATES = (
    "openai-community/gpt2",
    "gpt2",
    "distilbert/distilgpt2",
    "distilgpt2",
    "HuggingFaceTB/SmolLM2-135M",
    "facebook/opt-125m",
    "EleutherAI/pythia-160m",
    "Qwen/Qwen2.5-0.5B",
)

# (batch, prompt length, new tokens): lengths and batches that change from
# call to call, so the caches grow on every step and sizes rarely repeat.
WORK = [
    (1, 24, 64),
    (2, 64, 96),
    (4, 128, 112),
    (1, 300, 128),
    (8, 96, 144),
    (3, 480, 160),
    (16, 200, 176),
    (6, 640, 192),
]
WARMUP = (1, 16, 8)

MIB = 1 << 20


def pct(xs, q):
    """Nearest-rank percentile (the largest value when len(xs) < 1/(1-q))."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


# --------------------------------------------------------------------------
# The child: one allocator, one process.
# --------------------------------------------------------------------------


def child(args):
    result = {
        "mode": args.child,
        "fraction": args.fraction,
        "status": "started",
        "generates": [],
        "failures": 0,
        "ooms": 0,
        "errors": [],
    }

    def save():
        with open(args.result, "w") as f:
            json.dump(result, f, indent=1)

    save()
    mode = args.child
    dp = None
    if mode == "dp":
        # First, before torch touches CUDA.
        import decaying_pool
        import decaying_pool.torch

        dp = decaying_pool
        result["library"] = decaying_pool.library_path()
        decaying_pool.torch.enable()
    import torch

    result["torch"] = torch.__version__
    result["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if args.fraction:
        torch.cuda.set_per_process_memory_fraction(float(args.fraction), 0)
    props = torch.cuda.get_device_properties(0)
    result["device"] = props.name
    result["total_memory"] = props.total_memory
    if dp is not None:
        result["dp_limit"] = dp.stats(0).get("limit")
        if args.fraction and not result["dp_limit"]:
            result["errors"].append("the memory fraction did not reach the pool (limit is null)")

    def figures():
        if dp is not None:
            s = dp.stats(0)
            st = s["stats"]
            return {
                "device_allocs": st.get("backing_allocs"),
                "device_frees": st.get("backing_deallocs"),
                "backing_failures": st.get("backing_failures"),
                "peak_reserved": st.get("peak_bytes_reserved"),
                "reserved": s.get("reserved"),
                "peak_in_use": st.get("peak_bytes_in_use"),
                "hits": st.get("hits"),
                "misses": st.get("misses"),
                "segments_created": (s.get("packing") or {}).get("segments_created"),
            }
        m = torch.cuda.memory_stats(0)
        return {
            "device_allocs": m.get("num_device_alloc"),
            "device_frees": m.get("num_device_free"),
            "alloc_retries": m.get("num_alloc_retries"),
            "num_ooms": m.get("num_ooms"),
            "peak_reserved": torch.cuda.max_memory_reserved(0),
            "reserved": torch.cuda.memory_reserved(0),
            "peak_in_use": torch.cuda.max_memory_allocated(0),
            "segments_created": m.get("segment.all.allocated"),
        }

    def device_used():
        free, total = torch.cuda.mem_get_info(0)
        return total - free

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers
    from transformers import AutoModelForCausalLM

    result["transformers"] = transformers.__version__
    t = time.perf_counter()
    model = None
    names = CANDIDATES if args.model == "auto" else () if args.model == "random" else (args.model,)
    for name in names:
        try:
            model = AutoModelForCausalLM.from_pretrained(name, local_files_only=True)
            result["model"] = name
            break
        except Exception as e:  # not in the cache, or unreadable
            if args.model not in ("auto", "random"):
                result["errors"].append(f"{name}: {type(e).__name__}: {e}"[:300])
    if model is None:
        cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
        result["model"] = "random GPT2Config(n_layer=12, n_embd=768)"
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    cfg = model.config
    vocab = int(getattr(cfg, "vocab_size", 50257))
    max_pos = int(
        getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 1024
    )
    result["params"] = sum(p.numel() for p in model.parameters())
    result["load_s"] = time.perf_counter() - t
    gen = torch.Generator().manual_seed(1234)

    def generate(batch, prompt, new):
        if prompt + new > max_pos:
            prompt = max(8, max_pos - new)
        ids = torch.randint(3, vocab, (batch, prompt), generator=gen).to("cuda")
        mask = torch.ones_like(ids)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        steps = int(out.shape[1]) - prompt
        del out, ids, mask
        return wall, prompt, steps

    def failed_backing():
        if dp is None:
            return 0
        return figures().get("backing_failures") or 0

    try:
        generate(*WARMUP)
    except Exception as e:
        result["errors"].append(f"warmup: {type(e).__name__}: {e}"[:300])
    result["after_load"] = figures()
    result["device_used_after_load"] = device_used()
    result["status"] = "running"
    save()

    work = WORK[: args.work] * args.rounds
    start = time.perf_counter()
    dead = False
    for batch, prompt, new in work:
        if time.perf_counter() - start > args.budget_s:
            result["status"] = "stopped at the time budget"
            break
        before = failed_backing()
        entry = {"batch": batch, "prompt": prompt, "new": new}
        try:
            wall, entry["prompt"], entry["steps"] = generate(batch, prompt, new)
            entry["wall_s"] = wall
        except torch.cuda.OutOfMemoryError as e:
            entry["error"] = f"OutOfMemoryError: {str(e).splitlines()[0]}"[:300]
            result["ooms"] += 1
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            try:
                torch.cuda.synchronize()
            except Exception:
                dead = True  # a sticky CUDA error: nothing more can run
        if dp is not None:
            entry["backing_failures"] = failed_backing() - before
        if "error" in entry or entry.get("backing_failures"):
            result["failures"] += 1
        entry["device_used"] = None if dead else device_used()
        result["generates"].append(entry)
        try:
            result["end"] = figures()
        except Exception as e:
            result["errors"].append(f"figures: {type(e).__name__}: {e}"[:300])
        save()
        if dead:
            result["status"] = "CUDA context lost after an error"
            break
    else:
        result["status"] = "done"
    try:
        result["end"] = figures()
    except Exception as e:
        result["errors"].append(f"figures: {type(e).__name__}: {e}"[:300])
    save()
    return 0


# --------------------------------------------------------------------------
# The parent: checks, one child a run, the table.
# --------------------------------------------------------------------------


def summarize(r):
    gens = [g for g in r.get("generates", []) if "wall_s" in g]
    walls = [g["wall_s"] for g in gens]
    steps = sum(g["steps"] for g in gens)
    end, base = r.get("end") or {}, r.get("after_load") or {}

    def delta(key):
        if end.get(key) is None or base.get(key) is None:
            return None
        return end[key] - base[key]

    used = [g["device_used"] for g in r.get("generates", []) if g.get("device_used") is not None]
    return {
        "generates_ok": sum(1 for g in gens if not g.get("backing_failures")),
        "generates": len(r.get("generates", [])),
        "mean_s": sum(walls) / len(walls) if walls else None,
        "p50_s": pct(walls, 0.50),
        "p99_s": pct(walls, 0.99),
        "ms_per_step": 1e3 * sum(walls) / steps if steps else None,
        "peak_reserved": end.get("peak_reserved"),
        "device_allocs": end.get("device_allocs"),
        "device_frees": end.get("device_frees"),
        "loop_device_allocs": delta("device_allocs"),
        "loop_device_frees": delta("device_frees"),
        "alloc_retries": end.get("alloc_retries"),
        "backing_failures": end.get("backing_failures"),
        "failures": r.get("failures", 0),
        "ooms": r.get("ooms", 0),
        "device_used_max_sampled": max(used) if used else None,
    }


def fmt(x, scale=1.0, digits=1):
    if x is None:
        return "-"
    if isinstance(x, float) or scale != 1.0:
        return f"{x / scale:.{digits}f}"
    return str(x)


def table(runs):
    head = (
        "mode", "fraction", "ok/gen", "mean ms", "p50 ms", "p99 ms", "ms/step",
        "peak res MiB", "dev allocs", "dev frees", "loop allocs", "loop frees",
        "retries", "fails", "status",
    )
    rows = [head]
    for r in runs:
        s = r.get("summary") or {}
        rows.append((
            r["mode"],
            f"{r['fraction']:.4f}" if r.get("fraction") else "-",
            f"{s.get('generates_ok', 0)}/{s.get('generates', 0)}",
            fmt(s.get("mean_s"), 1e-3), fmt(s.get("p50_s"), 1e-3), fmt(s.get("p99_s"), 1e-3),
            fmt(s.get("ms_per_step"), 1.0, 2),
            fmt(s.get("peak_reserved"), MIB),
            fmt(s.get("device_allocs")), fmt(s.get("device_frees")),
            fmt(s.get("loop_device_allocs")), fmt(s.get("loop_device_frees")),
            fmt(s.get("alloc_retries")),
            fmt(s.get("failures")) + (f" (+{s['backing_failures']} backing)" if s.get("backing_failures") else ""),
            r.get("status", "?")[:40],
        ))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in rows)


def run_child(mode, fraction, args, model, timeout):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if MODES[mode]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = MODES[mode]
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    fd, path = tempfile.mkstemp(prefix=f"torch_plugin_{mode}_", suffix=".json")
    os.close(fd)
    cmd = [
        sys.executable, os.path.abspath(__file__), "--child", mode, "--result", path,
        "--model", model, "--work", str(args.work), "--rounds", str(args.rounds),
        "--budget-s", str(args.budget_s),
    ]
    if fraction:
        cmd += ["--fraction", repr(fraction)]
    label = mode + (f" at fraction {fraction:.4f}" if fraction else "")
    print(f"== {label}", flush=True)
    t = time.perf_counter()
    rc, tail = None, ""
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc = p.returncode
        tail = (p.stdout + p.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = (e.stdout or b"") + (e.stderr or b"")
        tail = (out.decode(errors="replace") if isinstance(out, bytes) else out)[-3000:]
    try:
        with open(path) as f:
            r = json.load(f)
    except Exception as e:
        r = {"mode": mode, "fraction": fraction, "status": f"no result ({e})"}
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    r["mode"], r["fraction"] = mode, fraction
    r["rc"], r["wall_s"] = rc, time.perf_counter() - t
    if rc != 0:
        r["status"] = f"rc {rc}: " + r.get("status", "")
        r["output_tail"] = tail
        print(f"   {label} failed (rc {rc}); last output:", flush=True)
        for line in tail.strip().splitlines()[-12:]:
            print("   | " + line)
    r["summary"] = summarize(r)
    s = r["summary"]
    print(
        f"   {r.get('model', '?')}: {s['generates_ok']}/{s['generates']} generates, "
        f"mean {fmt(s['mean_s'], 1e-3)} ms, peak reserved {fmt(s['peak_reserved'], MIB)} MiB, "
        f"device allocs {fmt(s['device_allocs'])}, failures {s['failures']}, {r['wall_s']:.1f} s; "
        f"{r.get('status')}",
        flush=True,
    )
    for err in r.get("errors", [])[:3]:
        print(f"   note: {err}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="write the figures as JSON here")
    ap.add_argument("--factor", type=float, default=1.10,
                    help="tight runs: FACTOR x native peak reserved (default 1.10; 0: none)")
    ap.add_argument("--model", default="auto", help="auto (cached small LM, else random), random, or a name")
    ap.add_argument("--modes", default="native,dp,expandable")
    ap.add_argument("--work", type=int, default=len(WORK), help="generates a round (at most %d)" % len(WORK))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=40.0, help="a child starts no generate after this")
    ap.add_argument("--timeout-s", type=float, default=90.0, help="a child is killed after this")
    ap.add_argument("--deadline-s", type=float, default=270.0, help="no child starts after this")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--fraction", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    started = time.perf_counter()
    report = {"script": "benches/gpu/torch_plugin.py", "argv": sys.argv[1:], "runs": []}

    def finish(skipped=None):
        if skipped:
            report["skipped"] = skipped
            print(f"torch_plugin: skipped: {skipped}", flush=True)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
            print(f"torch_plugin: figures written to {args.out}")
        return 0

    try:
        import torch
    except Exception as e:
        return finish(f"PyTorch is not importable ({type(e).__name__}: {e})")
    report["torch"] = torch.__version__
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as e:
        n, report["cuda_error"] = 0, str(e)
    if n == 0:
        return finish(f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False)")
    try:
        import transformers
    except Exception as e:
        return finish(f"transformers is not importable ({type(e).__name__}: {e})")
    report["transformers"] = transformers.__version__
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            return finish(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    dp_problem = None
    try:
        import decaying_pool

        report["library"] = decaying_pool.library_path()
    except Exception as e:
        dp_problem = f"decaying_pool unusable: {type(e).__name__}: {e}"
        print(f"torch_plugin: {dp_problem}; the dp runs are skipped", flush=True)
    # No CUDA call here that makes a context: the children's device-wide
    # figures (mem_get_info) would count this process's too.
    print(
        f"torch_plugin: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{n} CUDA device(s), library {report.get('library', '-')}",
        flush=True,
    )

    model = args.model
    native_peak = total = None

    def plan():
        for m in modes:
            yield m, None
        if args.factor > 0:
            for m in modes:
                yield m, "tight"

    for mode, tight in plan():
        left = args.deadline_s - (time.perf_counter() - started)
        fraction = None
        if tight:
            if not native_peak or not total:
                report["runs"].append({"mode": mode, "fraction": None,
                                       "status": "skipped: no native peak reserved to size the fraction"})
                continue
            fraction = min(1.0, args.factor * native_peak / total)
            report["fraction"] = fraction
        if mode == "dp" and dp_problem:
            report["runs"].append({"mode": mode, "fraction": fraction, "status": "skipped: " + dp_problem})
            continue
        if left < 20:
            report["runs"].append({"mode": mode, "fraction": fraction,
                                   "status": f"skipped: the {args.deadline_s:.0f} s deadline"})
            print(f"== {mode}{' tight' if tight else ''}: skipped (deadline)", flush=True)
            continue
        r = run_child(mode, fraction, args, model, min(args.timeout_s, left))
        report["runs"].append(r)
        if r.get("model") and r["model"] != model and not r["model"].startswith("random"):
            model = r["model"]  # every later run loads the same one
        elif r.get("model", "").startswith("random"):
            model = "random"
        if mode == "native" and not tight:
            native_peak = (r.get("summary") or {}).get("peak_reserved")
            total = r.get("total_memory")
            report["native_peak_reserved"] = native_peak
            report["total_memory"] = total
            report["device"] = r.get("device")
    report["model"] = next((r["model"] for r in report["runs"] if r.get("model")), None)
    print()
    print(
        f"torch_plugin: {report.get('device', '?')}, {report['model']}, "
        f"tight fraction {report.get('fraction', 0) or 0:.4f} "
        f"({args.factor}x native peak reserved {fmt(native_peak, MIB)} MiB)"
    )
    print(table(report["runs"]))
    print("(p99 of fewer than 100 generates is the slowest; dev allocs/frees: cudaMalloc/cudaFree calls, "
          "dp: backing_allocs/backing_deallocs; loop: during the generates alone)")
    return finish()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        # Fail soft: a bug here must not stop run.sh's later sections.
        traceback.print_exc()
        print("torch_plugin: stopped by the error above", flush=True)
        sys.exit(0 if "--child" not in sys.argv else 1)
