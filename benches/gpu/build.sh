#!/usr/bin/env bash
# Builds, here, what `benches/gpu/run.sh` runs on a machine with a CUDA
# device: the integration tests and the examples with every feature
# (release), and the hit-path benchmarks (`hit_path`, `shared_pool`, and
# `examples/instructions.rs` for `benches/instructions.sh --time`), copied
# with the traces into `.gpu/` (ignored by git), so the folder can be
# carried to a machine that has no Rust. Also the C library of `ffi/`
# (`.gpu/lib/libdecaying_pool.so`) and the Python package `python/decaying_pool`
# (pure Python, `.gpu/python/`), for `torch_plugin.py` and `cupy_aba.py`: on
# the device they run with `PYTHONPATH=.gpu/python
# DECAYING_POOL_LIBRARY=.gpu/lib/libdecaying_pool.so`, no pip install.
#
#   bash benches/gpu/build.sh [TRACE...]   # default: the shared traces, if present
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu && mkdir -p .gpu/bin .gpu/traces
cargo build --release --all-features --examples
it=$(cargo test --release --all-features --test it --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')
cp "$it" .gpu/bin/it
for e in tensor_store cuda_costs cuda_replay instructions; do cp "target/release/examples/$e" .gpu/bin/; done
# The benchmarks as `cargo bench` builds them (without the bench profile's
# debug info, as CI builds them: the same code).
CARGO_PROFILE_BENCH_DEBUG=false cargo bench --bench hit_path --bench shared_pool --no-run \
    --message-format=json | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["bench"]:
        print(m["target"]["name"], m["executable"])' | while read -r name exe; do cp "$exe" ".gpu/bin/$name"; done
strip .gpu/bin/*
if [ $# -eq 0 ]; then
    set -- ../shared/workloads/pytorch_cs336_*.csv
    [ -f "$1" ] || set -- cli/traces/inference.csv
fi
for t in "$@"; do [ -f "$t" ] && cp "$t" .gpu/traces/; done
# The plug-in library and the package that loads it (`run.sh`'s plug-in
# section); the package finds the library through $DECAYING_POOL_LIBRARY.
cargo build --release -p decaying-pool-ffi
mkdir -p .gpu/lib .gpu/python/decaying_pool
cp target/release/libdecaying_pool.so .gpu/lib/
cp python/decaying_pool/*.py python/decaying_pool/py.typed .gpu/python/decaying_pool/
du -sh .gpu
