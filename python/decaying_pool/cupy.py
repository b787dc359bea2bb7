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

With ``enable(pinned=True)`` CuPy's pinned host memory (the staging
buffers of ``cupy.asarray``/``asnumpy`` and of user ``alloc_pinned_memory``)
comes from the library's pinned pool too (``dp_pinned_malloc``, page-locked
``cuMemHostAlloc`` memory; its figures are ``decaying_pool.stats(-1)``),
through ``cupy.cuda.set_pinned_memory_allocator``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import _native, configure, last_error

__all__ = ["enable", "enable_pinned", "PinnedBlock", "MALLOC", "FREE"]

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
    ``dp_cupy_malloc``/``dp_cupy_free``. With ``pinned=True`` CuPy's pinned
    host allocator is replaced too (:func:`enable_pinned`).

    Raises:
        ImportError: CuPy is missing.
        decaying_pool.ConfigError: the library refused ``config``.
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


class PinnedBlock:
    """Pinned host memory from the library's pinned pool (``dp_pinned_malloc``).

    What a ``cupy.cuda.PinnedMemoryPointer`` holds (it reads ``ptr`` and
    ``size``); the memory goes back (``dp_pinned_free``) when the last
    reference goes. ``ptr`` is 0 when the library refused (its message in
    :func:`decaying_pool.last_error`).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.ptr = (_native.lib().dp_pinned_malloc(size) or 0) if size else 0

    def __int__(self) -> int:
        return self.ptr

    def __del__(self) -> None:
        ptr, self.ptr = self.ptr, 0
        if ptr:
            try:
                _native.lib().dp_pinned_free(ptr)
            except Exception:  # interpreter shutdown: the library may be gone
                pass


def pinned_allocator(cupy: Any) -> Callable[[int], Any]:
    """Return a CuPy pinned allocator (``size -> PinnedMemoryPointer``) over the library."""
    pointer = getattr(cupy.cuda, "PinnedMemoryPointer", None)
    if pointer is None:
        pointer = cupy.cuda.pinned_memory.PinnedMemoryPointer

    def malloc(size: int) -> Any:
        mem = PinnedBlock(size)
        if size and not mem.ptr:
            raise _out_of_memory(cupy, size)
        return pointer(mem, 0)

    return malloc


def enable_pinned(cupy: Any = None) -> Callable[[int], Any]:
    """Make the library's pinned pool CuPy's pinned host allocator; return it.

    ``cupy.cuda.set_pinned_memory_allocator`` with an allocator whose
    blocks are :class:`PinnedBlock`s. Blocks CuPy's own pinned pool handed
    out before stay with it.
    """
    if cupy is None:
        cupy = _import_cupy()
    malloc = pinned_allocator(cupy)
    cupy.cuda.set_pinned_memory_allocator(malloc)
    return malloc
