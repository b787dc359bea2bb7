"""Finding and loading the C library (``libdecaying_pool``) with ctypes.

The library is loaded once per process. PyTorch's ``CUDAPluggableAllocator``
loads the same file with its own ``ctypes.CDLL``; the dynamic loader hands
both the same copy, so what :func:`decaying_pool.configure` sets is what the
allocator PyTorch calls uses.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from pathlib import Path
from typing import List, Optional

#: Environment variable naming a library to use instead of the bundled one
#: (for example ``target/release/libdecaying_pool.so`` from ``cargo build``).
LIBRARY_ENV = "DECAYING_POOL_LIBRARY"

_PACKAGE_DIR = Path(__file__).resolve().parent
_LOCK = threading.Lock()
_LIB: Optional[ctypes.CDLL] = None


def _candidates() -> List[Path]:
    """The bundled library, then a cargo build of this checkout."""
    found: List[Path] = []
    for pattern in ("_lib*.so", "_lib*.dylib", "_lib*.pyd", "_lib*.dll"):
        found.extend(Path(p) for p in sorted(glob.glob(str(_PACKAGE_DIR / pattern))))
    # Running from a source checkout (python/ on sys.path, nothing built by
    # pip): the library `cargo build --release -p decaying-pool-ffi` made.
    repo = _PACKAGE_DIR.parent.parent
    for name in ("libdecaying_pool.so", "libdecaying_pool.dylib", "decaying_pool.dll"):
        found.append(repo / "target" / "release" / name)
    return found


def library_path() -> str:
    """Return the path of the C library this package uses.

    In order: the file named by ``$DECAYING_POOL_LIBRARY`` (it must exist),
    the library ``pip install`` built into the package, and, in a source
    checkout, ``target/release/libdecaying_pool.so``.

    Raises:
        FileNotFoundError: no library was found (or the override names a
            missing file).
    """
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"${LIBRARY_ENV} names {str(path)!r}, which is not a file"
            )
        return str(path.resolve())
    for path in _candidates():
        if path.is_file():
            return str(path.resolve())
    raise FileNotFoundError(
        "the decaying-pool C library was not found: install the package with "
        "`pip install ./python` (it builds the library), or build it with "
        "`cargo build --release -p decaying-pool-ffi` and set "
        f"${LIBRARY_ENV} to target/release/libdecaying_pool.so"
    )


def _declare(lib: ctypes.CDLL) -> None:
    """Give each entry point of the C contract its argument and result types."""
    c_void_p, c_size_t, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    table = {
        "dp_malloc": (c_void_p, [c_size_t, c_int, c_void_p]),
        "dp_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
        "dp_init": (None, [c_int]),
        "dp_empty_cache": (None, []),
        "dp_set_memory_fraction": (None, [ctypes.c_double, c_int]),
        "dp_record_stream": (None, [c_void_p, c_void_p]),
        "dp_cupy_malloc": (c_void_p, [c_void_p, c_size_t, c_int]),
        "dp_cupy_free": (None, [c_void_p, c_void_p, c_int]),
        "dp_pinned_malloc": (c_void_p, [c_size_t]),
        "dp_pinned_free": (None, [c_void_p]),
        "dp_configure": (c_int, [ctypes.c_char_p]),
        "dp_stats_json": (c_size_t, [c_int, ctypes.c_char_p, c_size_t]),
        "dp_last_error": (ctypes.c_char_p, []),
    }
    for name, (restype, argtypes) in table.items():
        fn = getattr(lib, name)  # AttributeError names a missing entry point
        fn.restype = restype
        fn.argtypes = argtypes


def lib() -> ctypes.CDLL:
    """Return the loaded library (loading it on the first call)."""
    global _LIB
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                loaded = ctypes.CDLL(library_path())
                _declare(loaded)
                _LIB = loaded
    return _LIB


def address(name: str) -> int:
    """Return the address of the library's function ``name`` (as dlsym would)."""
    value = ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value
    if not value:
        raise OSError(f"{library_path()} exports no {name}")
    return int(value)


def last_error() -> str:
    """Return the message of this thread's last failed library call, or "".

    The library keeps one message per thread and clears it at the start of
    each call, so read it right after the call that failed, on its thread.
    """
    raw = lib().dp_last_error()
    return raw.decode("utf-8", "replace") if raw else ""
