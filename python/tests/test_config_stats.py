"""The Python layer: configuration text, errors, statistics, the library path."""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import pytest

import decaying_pool
from conftest import figures, run_python


def test_config_string() -> None:
    assert decaying_pool.config_string() == ""
    assert (
        decaying_pool.config_string(backend="host", limit="8GiB", gc_threshold=0.8, reaper=None)
        == "backend=host,limit=8GiB,gc_threshold=0.8"
    )
    assert decaying_pool.config_string(record=Path("/tmp/t.csv")) == "record=/tmp/t.csv"
    assert (
        decaying_pool.config_string(packing={"small_threshold": "64KiB", "medium": "2MiB"})
        == "packing=small_threshold:64KiB;medium:2MiB"
    )
    assert decaying_pool.config_string(**{"packing.small": "1MiB"}) == "packing.small=1MiB"
    with pytest.raises(ValueError):
        decaying_pool.config_string(record="a,b")


def test_bad_configure_is_minus_one_and_a_message(lib) -> None:
    assert lib.dp_configure(b"no_such_key=1") == -1
    assert "no_such_key" in decaying_pool.last_error()
    assert lib.dp_configure(b"backend=quantum") == -1
    assert "quantum" in decaying_pool.last_error()
    assert lib.dp_configure(b"limit=12") == -1  # a size needs its unit
    assert decaying_pool.last_error()
    with pytest.raises(decaying_pool.ConfigError, match="no_such_key"):
        decaying_pool.configure(no_such_key=1)


def test_configure_in_a_fresh_process() -> None:
    # Every documented key, with the spellings of ffi/README.md, before the
    # first allocation; then the pool serves.
    result = run_python(
        """
        import ctypes, decaying_pool
        decaying_pool.configure(backend="host", policy="ttl:500ms", packing="off",
                                limit="64MiB", reaper="50ms", gc_threshold=0.9)
        lib = decaying_pool._native.lib()
        p = lib.dp_malloc(1 << 20, 0, None)
        assert p, decaying_pool.last_error()
        lib.dp_free(p, 1 << 20, 0, None)
        # Past the limit: NULL and a message, never an abort.
        assert not lib.dp_malloc(65 << 20, 0, None)
        assert decaying_pool.last_error()
        print("ok")
        """,
        config=None,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_bad_environment_configuration_fails_requests_not_the_process() -> None:
    result = run_python(
        """
        import decaying_pool
        lib = decaying_pool._native.lib()
        p = lib.dp_malloc(4096, 0, None)
        print("null" if not p else "served")
        print(decaying_pool.last_error())
        """,
        config="backend=host,no_such_key=1",
    )
    assert result.returncode == 0, result.stderr
    first, _, message = result.stdout.partition("\n")
    # Either the bad $DECAYING_POOL fails the request with a message naming
    # it, or the library falls back and says so; it never aborts.
    if first == "null":
        assert "no_such_key" in message or "DECAYING_POOL" in message, result.stdout


def test_stats_json_shape(lib, torch_abi) -> None:
    alloc, free = torch_abi
    ptr = alloc(10_000, 0, 0)
    assert ptr
    s = decaying_pool.stats(0)
    assert isinstance(s, dict)
    f = figures(s)
    for key in (
        "hits",
        "misses",
        "backing_allocs",
        "backing_deallocs",
        "blocks_in_use",
        "blocks_cached",
        "bytes_in_use",
        "bytes_cached",
        "bytes_reserved",
        "peak_bytes_reserved",
        "peak_bytes_in_use",
    ):
        assert isinstance(f[key], int) and f[key] >= 0, (key, s)
    assert f["bytes_in_use"] >= 10_000
    assert f["blocks_in_use"] >= 1
    assert f["bytes_reserved"] >= f["bytes_in_use"]
    free(ptr, 10_000, 0, 0)

    # The C call itself: the bytes needed, whatever the buffer.
    needed = lib.dp_stats_json(0, None, 0)
    assert needed > 2
    small = ctypes.create_string_buffer(8)
    assert lib.dp_stats_json(0, small, 8) > 8  # too small: says how much it needs
    buf = ctypes.create_string_buffer(needed + 1)
    assert lib.dp_stats_json(0, buf, needed + 1) <= needed + 1
    assert isinstance(json.loads(buf.value.decode()), dict)


def test_library_path_and_override(monkeypatch, tmp_path) -> None:
    path = decaying_pool.library_path()
    assert os.path.isfile(path)
    monkeypatch.setenv(decaying_pool.LIBRARY_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(FileNotFoundError, match="missing.so"):
        decaying_pool.library_path()
    monkeypatch.setenv(decaying_pool.LIBRARY_ENV, path)
    assert decaying_pool.library_path() == path


def test_set_memory_fraction_checks_its_range() -> None:
    with pytest.raises(ValueError):
        decaying_pool.set_memory_fraction(1.5)


def test_configure_refused_while_blocks_are_allocated() -> None:
    result = run_python(
        """
        import decaying_pool
        lib = decaying_pool._native.lib()
        p = lib.dp_malloc(4096, 0, None)
        assert p, decaying_pool.last_error()
        try:
            decaying_pool.configure(backend="host", policy="keep-all")
        except decaying_pool.ConfigError as e:
            print("refused:", e)
        lib.dp_free(p, 4096, 0, None)
        decaying_pool.configure(backend="host", policy="keep-all")
        print(decaying_pool.stats()["policy"])
        """,
        config="backend=host",
    )
    assert result.returncode == 0, result.stderr
    refused, policy = result.stdout.strip().splitlines()
    assert refused.startswith("refused:") and "allocated" in refused, refused
    assert policy == "keep-all"


def test_memory_fraction_on_the_host_backend() -> None:
    # The host backend's capacity is the machine's memory (when known): a
    # tiny fraction leaves less than a megabyte, and a request above it is
    # NULL with a message.
    result = run_python(
        """
        import decaying_pool
        lib = decaying_pool._native.lib()
        try:
            decaying_pool.set_memory_fraction(1e-9)
        except RuntimeError as e:
            print("refused:", e)
        else:
            p = lib.dp_malloc(64 << 20, 0, None)
            print("served" if p else "null: " + decaying_pool.last_error())
        """,
        config="backend=host",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.strip()
    # The limit lowers what the backing allocator can ever serve: "too
    # large" (or, for a request under the limit, "exceed the limit").
    if not out.startswith("refused:"):
        assert out.startswith("null: dp_malloc") and ("too large" in out or "limit" in out), out
