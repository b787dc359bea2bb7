"""PyTorch's CUDA caching allocator called from C++, with no Python between
calls: its hit round trip, and a trace replayed with each call timed as
`examples/cuda_replay.rs` times the pools' calls.

    python3 benches/gpu/torch_cpp.py TRACE [PASSES]

It builds a small extension with `torch.utils.cpp_extension.load_inline`
(about a minute), which calls `CUDACachingAllocator::get()->raw_alloc` /
`raw_delete` on the current stream. The trace is read as
`torch_replay.py` reads it; the blocks a pass leaves live are freed at its
end.
"""

import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_replay import read_trace  # noqa: E402

SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <vector>

namespace cca = c10::cuda::CUDACachingAllocator;
using clk = std::chrono::steady_clock;

// ns per allocate + free of `size` bytes, `n` times in a row (hits).
double hit_ns(int64_t size, int64_t n) {
    auto* a = cca::get();
    void* p = a->raw_alloc(size);
    a->raw_delete(p);
    auto t = clk::now();
    for (int64_t i = 0; i < n; i++) {
        void* q = a->raw_alloc(size);
        a->raw_delete(q);
    }
    return std::chrono::duration<double, std::nano>(clk::now() - t).count() / n;
}

// Replays rows (is_alloc, slot, size) `passes` times, timing each call;
// returns {ns in calls, calls}.
std::vector<double> replay(torch::Tensor ops, int64_t slots, int64_t passes) {
    auto* a = cca::get();
    auto r = ops.accessor<int64_t, 2>();
    std::vector<void*> live(slots, nullptr);
    double ns = 0, calls = 0;
    for (int64_t p = 0; p < passes; p++) {
        for (int64_t i = 0; i < r.size(0); i++) {
            auto t = clk::now();
            if (r[i][0]) {
                live[r[i][1]] = a->raw_alloc(r[i][2]);
            } else {
                a->raw_delete(live[r[i][1]]);
                live[r[i][1]] = nullptr;
            }
            ns += std::chrono::duration<double, std::nano>(clk::now() - t).count();
            calls += 1;
        }
        for (auto& q : live) {
            if (q) {
                a->raw_delete(q);
                q = nullptr;
            }
        }
    }
    return {ns, calls};
}
"""


def main():
    path = sys.argv[1]
    passes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    ext = load_inline(
        name="cca_cpp_bench",
        cpp_sources=[SRC],
        functions=["hit_ns", "replay"],
        extra_cflags=["-O2"],
        with_cuda=True,
    )
    rows, slot_of = [], {}
    for is_alloc, addr, size in read_trace(path):
        if is_alloc:
            slot_of[addr] = len(rows)  # a slot of its own
            rows.append((1, slot_of[addr], size))
        else:
            rows.append((0, slot_of.pop(addr), size))
    slots = len(rows)
    ops = torch.tensor(rows, dtype=torch.int64)
    torch.cuda.init()
    for size in (4096, 1 << 20, 64 << 20):
        print(f"  PyTorch C++ hit round trip, {size} B: {ext.hit_ns(size, 1_000_000):.1f} ns")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_stats()
    ns, calls = ext.replay(ops, slots, passes)
    s = torch.cuda.memory_stats()
    allocs = s.get("num_device_alloc", 0) - base.get("num_device_alloc", 0)
    print(
        f"  PyTorch C++ replay {os.path.basename(path)} x{passes}: {calls:.0f} calls, "
        f"{ns / calls / 1e3:.3f} us per call (cudaMalloc included: {allocs}), "
        f"peak reserved {s['reserved_bytes.all.peak'] / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
