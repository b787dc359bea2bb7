"""``record=``: the requests of a process, as a native trace the command-line
tool replays."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

from conftest import run_python

NATIVE_HEADER = "time_ns,action,addr,size"

WORKLOAD = """
    import random, threading
    import decaying_pool
    lib = decaying_pool._native.lib()

    def worker(seed):
        rng = random.Random(seed)
        held = []
        for _ in range(200):
            if held and rng.random() < 0.5:
                p, n, s = held.pop(rng.randrange(len(held)))
                lib.dp_free(p, n, 0, s)
            else:
                n = rng.choice([256, 4096, 100_000, 1 << 20])
                s = rng.choice([0, 0x1000])
                p = lib.dp_malloc(n, 0, s)
                assert p, decaying_pool.last_error()
                held.append((p, n, s))
        for p, n, s in held:
            lib.dp_free(p, n, 0, s)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    # The CuPy door is recorded too.
    q = lib.dp_cupy_malloc(None, 3000, 0)
    lib.dp_cupy_free(None, q, 0)
    """


def _rows(path: Path) -> List[List[str]]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert lines, f"{path} has no header"
    assert lines[0] == NATIVE_HEADER, lines[0]
    return [line.split(",") for line in lines[1:]]


def _check_balanced(path: Path) -> None:
    rows = _rows(path)
    allocs = [r for r in rows if r[1] == "alloc"]
    frees = [r for r in rows if r[1] == "free"]
    assert allocs, "no allocation recorded"
    assert len(allocs) == len(frees), (len(allocs), len(frees))
    assert len(allocs) + len(frees) == len(rows), "rows other than alloc and free"
    # Every free matches a live allocation of the same address.
    live = {}
    for t, action, addr, size in rows:
        int(t), int(size)
        assert addr.startswith("0x")
        if action == "alloc":
            assert addr not in live, f"{addr} allocated twice in the trace"
            live[addr] = size
        else:
            assert addr in live, f"{addr} freed but not live in the trace"
            assert size in ("0", live.pop(addr))
    assert not live


def _replay_tool() -> Optional[Path]:
    repo = Path(__file__).resolve().parents[2]
    tool = repo / "target" / "release" / "decaying-pool"
    return tool if tool.is_file() else None


@pytest.mark.parametrize("how", ["environment", "record()"])
def test_record_writes_a_balanced_native_trace(tmp_path: Path, how: str) -> None:
    trace = tmp_path / "requests.csv"
    if how == "environment":
        result = run_python(WORKLOAD, config=f"backend=host,record={trace}")
    else:
        code = (
            "import decaying_pool\n"
            f"cmd = decaying_pool.record({str(trace)!r}, backend='host')\n"
            "print(cmd)\n"
        ) + WORKLOAD.replace("\n    ", "\n")
        result = run_python(code, config="backend=host")
        assert "replay" in result.stdout and str(trace) in result.stdout, result.stdout
        assert "replay with" in result.stderr
    assert result.returncode == 0, result.stderr
    assert trace.is_file() and trace.stat().st_size > len(NATIVE_HEADER)
    _check_balanced(trace)

    tool = _replay_tool()
    if tool is None:
        pytest.skip("target/release/decaying-pool not built: the replay itself is not run")
    replay = subprocess.run([str(tool), "replay", str(trace)], capture_output=True, text=True)
    assert replay.returncode == 0, replay.stderr


def test_record_flushed_by_empty_cache(tmp_path: Path) -> None:
    # A long-running process need not end for its trace to be read.
    trace = tmp_path / "live.csv"
    result = run_python(
        f"""
        import decaying_pool
        lib = decaying_pool._native.lib()
        p = lib.dp_malloc(4096, 0, None)
        lib.dp_free(p, 4096, 0, None)
        decaying_pool.empty_cache()
        text = open({str(trace)!r}).read()
        print(sum(1 for l in text.splitlines() if ",alloc," in l))
        """,
        config=f"backend=host,record={trace}",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


def test_record_to_an_unwritable_path_is_an_error(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import decaying_pool
        try:
            decaying_pool.configure(backend="host", record={str(tmp_path / "no" / "dir" / "t.csv")!r})
        except decaying_pool.ConfigError as e:
            print("refused:", e)
        else:
            lib = decaying_pool._native.lib()
            p = lib.dp_malloc(64, 0, None)
            print("served" if p else "null:", decaying_pool.last_error())
        """,
        config=None,
    )
    assert result.returncode == 0, result.stderr
    assert "t.csv" in result.stdout, result.stdout
