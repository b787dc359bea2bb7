"""The pool behind CuPy's allocator (``CFunctionAllocator``).

::

    import decaying_pool.cupy
    decaying_pool.cupy.enable()
    x = cupy.zeros(1 << 20)

:func:`enable` hands CuPy the library's ``dp_cupy_malloc``/``dp_cupy_free``
(``void *malloc(void *param, size_t, int device)``, ``void free(void *param,
void *ptr, int device)``) through ``cupy.cuda.memory.CFunctionAllocator`` and
installs it with ``cupy.cuda.set_allocator``. Blocks CuPy allocated before
stay with the allocator that served them and go back to it when freed.

CuPy's C-function door carries no stream: the library serves these blocks
from its pool of the device's default stream. Work on other CuPy streams
must be ordered (synchronise, or use the default stream) before an array's
memory is freed and reused.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import _native, configure, last_error

__all__ = ["enable", "MALLOC", "FREE"]

#: The entry points CuPy's ``CFunctionAllocator`` calls.
MALLOC = "dp_cupy_malloc"
FREE = "dp_cupy_free"

_device_allocator: Optional[Callable[[int], Any]] = None


def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as e:
        raise ImportError(
            "decaying_pool.cupy.enable() needs CuPy: `pip install cupy-cuda12x` "
            "(or the build for your CUDA)"
        ) from e
    return cupy


def _out_of_memory(cupy: Any, size: int) -> BaseException:
    """CuPy's ``OutOfMemoryError`` (a ``MemoryError``) with the library's message."""
    base = getattr(cupy.cuda.memory, "OutOfMemoryError", MemoryError)
    error = base(size, 0)
    error.args = (f"decaying_pool could not allocate {size:,} bytes: {last_error() or 'no message'}",)
    return error


def device_allocator(cupy: Any) -> Callable[[int], Any]:
    """Return a CuPy allocator (``size -> MemoryPointer``) over the library.

    ``CFunctionAllocator`` turns a NULL from ``malloc`` into a pointer 0
    without complaint; this wrapper turns it into CuPy's
    ``OutOfMemoryError`` with the library's message.
    """
    lib = _native.lib()
    cfa = cupy.cuda.memory.CFunctionAllocator(
        0, _native.address(MALLOC), _native.address(FREE), lib
    )
    c_malloc = cfa.malloc

    def malloc(size: int) -> Any:
        memptr = c_malloc(size)
        if size and not memptr.ptr:
            raise _out_of_memory(cupy, size)
        return memptr

    malloc.c_function_allocator = cfa  # type: ignore[attr-defined]
    return malloc


def enable(pinned: bool = False, **config: Any) -> Callable[[int], Any]:
    """Make the pool CuPy's device allocator; return the installed allocator.

    Configures the library with ``config`` (see
    :func:`decaying_pool.configure`), then
    ``cupy.cuda.set_allocator(...)`` with a ``CFunctionAllocator`` over
    ``dp_cupy_malloc``/``dp_cupy_free``. With ``pinned=True`` the pinned
    host allocator is replaced too (see :func:`enable_pinned`).

    Raises:
        ImportError: CuPy is missing.
        decaying_pool.ConfigError: the library refused ``config``.
        NotImplementedError: ``pinned=True`` but the library has no pinned
            host entry point.
    """
    global _device_allocator
    cupy = _import_cupy()
    configure(**config)
    if _device_allocator is None:
        _device_allocator = device_allocator(cupy)
    if pinned:
        enable_pinned(cupy)
    cupy.cuda.set_allocator(_device_allocator)
    return _device_allocator


def enable_pinned(cupy: Any = None) -> None:
    """Replace CuPy's pinned host allocator with the library's (when it has one)."""
    raise NotImplementedError(
        "the decaying-pool C library has no pinned host entry point yet; "
        "CuPy's own pinned memory pool stays in place"
    )
