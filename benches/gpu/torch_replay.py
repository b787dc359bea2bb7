"""PyTorch's own CUDA caching allocator replaying a trace, for the rows of
`examples/cuda_replay.rs` to stand beside.

    python3 benches/gpu/torch_replay.py TRACE [PASSES [FACTOR]]
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benches/gpu/torch_replay.py TRACE

TRACE is a PyTorch snapshot CSV (`device,time_us,action,addr,size,stream`)
or the crate's native format (`time_ns,action,addr,size`, as
`benches/traces/serving.py` writes), replayed as the crate's reader does:
`alloc` allocates, `free_completed` (or `free`) frees, frees of blocks
allocated before the trace are skipped, the first device's rows only; the
blocks a pass leaves live are freed at its end. With FACTOR, the allocator
may hold at most FACTOR times the trace's peak live bytes
(`torch.cuda.set_per_process_memory_fraction`), as on a device that small
(`cca_sim.py --factor` models the same); a request it cannot serve is
counted as a failure and the replay goes on.
Each request goes straight to the allocator
(`torch.cuda.caching_allocator_alloc` / `caching_allocator_delete`, no
tensor), timed with `time.perf_counter_ns`, so a call's time includes the
Python binding. The counts come from `torch.cuda.memory_stats()`:
`num_device_alloc` / `num_device_free` are PyTorch's cudaMalloc / cudaFree
calls. Run each configuration in a process of its own: the allocator's
settings are read once.
"""

import os
import sys
import time

import torch


def read_trace(path):
    events = []
    live = set()
    device = None
    with open(path) as f:
        header = None
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if header is None:
                header = line.split(",")
                col = {name: i for i, name in enumerate(header)}
                continue
            row = line.split(",")
            dev = int(row[col["device"]]) if "device" in col else 0
            if device is None:
                device = dev
            if dev != device:
                continue
            action = row[col["action"]]
            addr = int(row[col["addr"]], 0)
            size = int(row[col["size"]])
            if action == "alloc":
                live.add(addr)
                events.append((True, addr, size))
            elif action in ("free_completed", "free") and addr in live:
                live.discard(addr)
                events.append((False, addr, size))
    return events


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return 0.0 if n == 0 else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


def main():
    path = sys.argv[1]
    passes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    factor = float(sys.argv[3]) if len(sys.argv) > 3 else None
    events = read_trace(path)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "default"
    torch.cuda.init()
    if factor is not None:
        sizes, live_now, trace_peak = {}, 0, 0
        for is_alloc, addr, size in events:
            if is_alloc:
                sizes[addr] = size
                live_now += size
                trace_peak = max(trace_peak, live_now)
            else:
                live_now -= sizes.pop(addr, 0)
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, factor * trace_peak / total), 0)
        conf += f", limit {factor}x peak live ({factor * trace_peak / 2**30:.4f} GiB)"
    failures = 0
    stream = torch.cuda.current_stream().cuda_stream
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_stats()
    alloc_ns, free_ns = [], []
    live = {}
    peak_live = live_bytes = 0
    for p in range(passes):
        for is_alloc, addr, size in events:
            if is_alloc:
                t = time.perf_counter_ns()
                try:
                    ptr = torch.cuda.caching_allocator_alloc(size, 0, stream)
                except torch.OutOfMemoryError:
                    failures += 1
                    continue
                alloc_ns.append(time.perf_counter_ns() - t)
                live[addr] = (ptr, size)
                live_bytes += size
                peak_live = max(peak_live, live_bytes)
            elif addr in live:
                ptr, size = live.pop(addr)
                t = time.perf_counter_ns()
                torch.cuda.caching_allocator_delete(ptr)
                free_ns.append(time.perf_counter_ns() - t)
                live_bytes -= size
        for ptr, size in live.values():
            torch.cuda.caching_allocator_delete(ptr)
            live_bytes -= size
        live.clear()
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    allocs = s.get("num_device_alloc", -1) - base.get("num_device_alloc", 0)
    frees = s.get("num_device_free", -1) - base.get("num_device_free", 0)
    segments = s.get("segment.all.allocated", 0) - base.get("segment.all.allocated", 0)
    peak = s["reserved_bytes.all.peak"]
    calls = alloc_ns + free_ns
    print(
        f"torch {torch.__version__} {torch.cuda.get_device_name(0)} [{conf}] {os.path.basename(path)} x{passes}: "
        f"cudaMalloc {allocs}, cudaFree {frees}, segments {segments}, peak reserved {peak / 2**20:.1f} MiB "
        f"({peak / max(peak_live, 1):.2f}x live {peak_live / 2**20:.1f} MiB), "
        f"alloc_retries {s.get('num_alloc_retries', 0)}, ooms {s.get('num_ooms', 0)}, failures {failures}; "
        f"time in calls {sum(calls) / 1e9:.4f} s, median alloc {median(alloc_ns) / 1e3:.2f} us, "
        f"median free {median(free_ns) / 1e3:.2f} us, most {max(calls) / 1e3:.0f} us"
    )
    # A hit: the same size allocated and freed, warm.
    n = 100_000
    ptr = torch.cuda.caching_allocator_alloc(4096, 0, stream)
    torch.cuda.caching_allocator_delete(ptr)
    t = time.perf_counter_ns()
    for _ in range(n):
        ptr = torch.cuda.caching_allocator_alloc(4096, 0, stream)
        torch.cuda.caching_allocator_delete(ptr)
    hit = (time.perf_counter_ns() - t) / n
    t = time.perf_counter_ns()
    for _ in range(n):
        torch.cuda.current_device()
        torch.cuda.current_device()
    binding = (time.perf_counter_ns() - t) / n
    print(
        f"  hit round trip (4096 B, alloc + delete from Python): {hit:.0f} ns; "
        f"two trivial torch.cuda calls for scale: {binding:.0f} ns"
    )


if __name__ == "__main__":
    main()
