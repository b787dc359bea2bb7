#!/usr/bin/env bash
# The GPU checks, on a machine with a CUDA device and PyTorch, from the
# repository root, after `bash benches/gpu/build.sh` built `.gpu/`: the
# device tests, the tensor example, the allocators' costs by size, and each
# trace replayed on the device by the pools (`cuda_replay`) and by PyTorch's
# own allocator, default and with expandable segments (`torch_replay.py`),
# and called from C++ (`torch_cpp.py`).
# Everything goes to $OUT/log (default /tmp/gpu-out/log).
#
#   bash benches/gpu/run.sh [PASSES]   # default 3
#
# LIMITS="1.1 1.5" adds, for each trace, one pass with the pools and
# PyTorch's allocator bounded to that many times the trace's peak live
# bytes (failures counted); QUICK=1 leaves out the allocators' costs, the
# C++ calls and the no-caching replay (the device's time is scarce).
# BENCH=1 runs only the hit-path benchmarks on the machine's processor
# (`cargo bench --bench hit_path` and `--bench shared_pool`, and
# `benches/instructions.sh --time`, about three minutes): a quieter
# machine than a shared development one, and more processors.
#
# The plug-in section (after the traces; about three minutes, bounded by
# `timeout 300` each): `torch_plugin.py`, a `transformers` generate loop
# (a small cached model, else GPT-2 small with random weights) under
# PyTorch's allocator, its expandable segments and `decaying_pool.torch`,
# then at 1.10x the native run's peak reserved; and `cupy_aba.py`, the
# A/B/A case on an 8 GiB limit under CuPy's pool and `decaying_pool.cupy`.
# They load the package and the library `build.sh` copied
# (`.gpu/python`, `.gpu/lib`) and write $OUT/torch_plugin.json and
# $OUT/cupy_aba.json beside the log. PLUGIN=1 runs only this section;
# NO_PLUGIN=1 leaves it out.
#
# `vmm_costs.py` (after `cuda_costs`, left out by QUICK=1 as it is; a few
# seconds, at most 45 s by its own `--max-seconds`, bounded by `timeout
# 90`): the per-call cost of the CUDA virtual memory management calls
# (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
# cuMemAddressReserve / Free) for pages of 2 to 64 MiB, through the driver
# alone (ctypes, nothing built), beside the published figures `cca_sim.py`
# and `PageCosts::PUBLISHED` charge; $OUT/vmm_costs.json. VMM=1 runs only
# this step.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
passes=${1:-3}
g=.gpu
plugin() {
    export PYTHONPATH=$PWD/$g/python${PYTHONPATH:+:$PYTHONPATH}
    export DECAYING_POOL_LIBRARY=$PWD/$g/lib/libdecaying_pool.so
    echo "== torch_plugin (generate loop: native, dp, expandable; then at 1.10x native peak reserved)"
    timeout 300 python3 benches/gpu/torch_plugin.py "$out/torch_plugin.json" --deadline-s 210
    echo "== cupy_aba (the A/B/A case on 8 GiB: CuPy's pool, and decaying_pool.cupy)"
    timeout 300 python3 benches/gpu/cupy_aba.py "$out/cupy_aba.json"
}
vmm() {
    echo "== vmm_costs (CUDA virtual memory management calls, per call, by page size)"
    timeout 90 python3 benches/gpu/vmm_costs.py --out "$out/vmm_costs.json" --max-seconds 45
}
if [ -n "${VMM:-}" ]; then
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        vmm
        echo "== done"
    } 2>&1 | tee "$out/log"
    exit
fi
if [ -n "${PLUGIN:-}" ]; then
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        plugin
        echo "== done"
    } 2>&1 | tee "$out/log"
    exit
fi
if [ -n "${BENCH:-}" ]; then
    {
        date -u
        grep -m1 'model name' /proc/cpuinfo
        nproc
        echo "== benches/instructions.sh --time"
        BIN=$g/bin/instructions bash benches/instructions.sh --time
        echo "== hit_path"
        $g/bin/hit_path --bench
        echo "== shared_pool"
        $g/bin/shared_pool --bench
        echo "== done"
    } 2>&1 | tee "$out/log"
    exit
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    grep -m1 'model name' /proc/cpuinfo
    echo "== device tests"
    timeout 180 $g/bin/it cuda:: --test-threads=1
    echo "== tensor_store"
    timeout 60 $g/bin/tensor_store
    if [ -z "${QUICK:-}" ]; then
        echo "== cuda_costs"
        timeout 180 $g/bin/cuda_costs
        vmm
    fi
    for t in $g/traces/*.csv; do
        for p in $(printf '%s\n' 1 "$passes" | sort -un); do
            echo "== cuda_replay $t $p"
            timeout 90 $g/bin/cuda_replay "$t" "$p"
            echo "== torch_replay $t $p"
            timeout 90 python3 benches/gpu/torch_replay.py "$t" "$p"
            PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
                timeout 90 python3 benches/gpu/torch_replay.py "$t" "$p"
        done
        for f in ${LIMITS:-}; do
            echo "== cuda_replay $t 1 $f"
            timeout 120 $g/bin/cuda_replay "$t" 1 "$f"
            echo "== torch_replay $t 1 $f"
            timeout 120 python3 benches/gpu/torch_replay.py "$t" 1 "$f"
            PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
                timeout 120 python3 benches/gpu/torch_replay.py "$t" 1 "$f"
        done
        [ -n "${QUICK:-}" ] && continue
        echo "== torch_cpp $t $passes"
        timeout 240 python3 benches/gpu/torch_cpp.py "$t" "$passes"
        echo "== torch_replay $t 1, no caching (every request a cudaMalloc)"
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 120 python3 benches/gpu/torch_replay.py "$t" 1
    done
    [ -z "${NO_PLUGIN:-}" ] && (plugin)
    echo "== done"
} 2>&1 | tee "$out/log"
