"""Shared set-up: the host backend, the library, and its C entry points typed
exactly as PyTorch and CuPy type them.

The library reads ``$DECAYING_POOL`` at its first call, so this sets it
before anything loads the library: every test in this process runs on the
host backend (system memory, no GPU). Tests that need a fresh library (a
configuration, a recorded trace) run Python in a subprocess.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict, Optional

os.environ["DECAYING_POOL"] = "backend=host"

import pytest  # noqa: E402

import decaying_pool  # noqa: E402
from decaying_pool import _native  # noqa: E402

# PyTorch's pluggable allocator: `void *alloc(size_t, int, cudaStream_t)` and
# `void free(void *, size_t, int, cudaStream_t)` (torch/cuda/memory.py builds
# these CFUNCTYPEs for its own UVM allocator; its C++ casts the dlsym'd
# addresses to the same types).
TORCH_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
TORCH_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
# CuPy's CFunctionAllocator (cupy/cuda/memory.pyx): `void *(*)(void *, size_t,
# int)` and `void (*)(void *, void *, int)`.
CUPY_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
CUPY_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)


def entry(name: str, prototype: Any) -> Any:
    """The library's function ``name`` at its raw address, cast to ``prototype``."""
    return prototype(_native.address(name))


@pytest.fixture(scope="session")
def lib() -> ctypes.CDLL:
    return _native.lib()


@pytest.fixture(scope="session")
def torch_abi() -> Any:
    return entry("dp_malloc", TORCH_ALLOC), entry("dp_free", TORCH_FREE)


@pytest.fixture(scope="session")
def cupy_abi() -> Any:
    return entry("dp_cupy_malloc", CUPY_MALLOC), entry("dp_cupy_free", CUPY_FREE)


def figures(stats: Dict[str, Any]) -> Dict[str, Any]:
    """The ``Stats`` fields of a ``decaying_pool.stats()`` dict (summed over
    the device's stream pools)."""
    assert isinstance(stats.get("stats"), dict), f"no stats object in {stats}"
    return stats["stats"]


def run_python(code: str, config: Optional[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``$DECAYING_POOL`` = ``config``."""
    env = dict(os.environ)
    env.pop("DECAYING_POOL", None)
    if config is not None:
        env["DECAYING_POOL"] = config
    # The same library as this process (the installed one, or the override).
    env[_native.LIBRARY_ENV] = decaying_pool.library_path()
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pytest_report_header(config: Any) -> str:
    """Which package and which library the tests run against."""
    return f"decaying_pool: {decaying_pool.__file__}\nlibrary: {decaying_pool.library_path()}"
