"""The pool behind PyTorch's CUDA allocator (``CUDAPluggableAllocator``).

::

    import decaying_pool.torch
    decaying_pool.torch.enable()   # before the first CUDA tensor
    x = torch.empty(1 << 20, device="cuda")

:func:`enable` must run before PyTorch's CUDA allocator is first used:
PyTorch refuses to swap an allocator that has served a block ("Can't swap
an already initialized allocator"), so call it at the top of the program,
before any ``.cuda()``/``device="cuda"`` tensor, and before anything that
initialises CUDA in PyTorch.

In this replacement mode PyTorch keeps no figures of its own:
``torch.cuda.memory_stats`` (and ``memory_allocated``, ``memory_reserved``,
``memory_summary``), ``memory_snapshot`` and ``reset_peak_memory_stats``
raise; use :func:`decaying_pool.stats` instead. ``torch.cuda.empty_cache``
reaches the pool through the reset hook (:func:`decaying_pool.empty_cache`)
and ``torch.cuda.set_per_process_memory_fraction`` through the
memory-fraction hook.

Streams: PyTorch passes the current stream with each request, and the
library keeps one pool per device and stream, so a block is reused on the
stream it was allocated for. A tensor used on another stream needs
``tensor.record_stream(other)`` (as with PyTorch's own allocator): the
record-stream hook makes its block wait for that stream's work at its free.
"""

from __future__ import annotations

from typing import Any, Optional

from . import _native, configure, library_path

__all__ = ["enable", "HOOKS", "ALLOC", "FREE"]

#: The entry points PyTorch loads with ``CUDAPluggableAllocator``:
#: ``void *alloc(size_t, int device, cudaStream_t)`` and
#: ``void free(void *, size_t, int device, cudaStream_t)``.
ALLOC = "dp_malloc"
FREE = "dp_free"

#: The optional hooks of PyTorch's ``_CUDAPluggableAllocator`` (each takes a
#: function address as an integer) and the library's function for each.
HOOKS = (
    ("set_init_fn", "dp_init"),  # void(int device_count)
    ("set_reset_fn", "dp_empty_cache"),  # void(), torch.cuda.empty_cache
    ("set_memory_fraction_fn", "dp_set_memory_fraction"),  # void(double, int)
    ("set_record_stream_fn", "dp_record_stream"),  # void(void *, cudaStream_t)
)

_enabled: Optional[Any] = None


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "decaying_pool.torch.enable() needs PyTorch (with CUDA): `pip install torch`"
        ) from e
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    if memory is None or not hasattr(memory, "CUDAPluggableAllocator"):
        raise ImportError(
            "this PyTorch has no torch.cuda.memory.CUDAPluggableAllocator (PyTorch 2.0 or newer, "
            "built with CUDA, is needed)"
        )
    return torch


def enable(**config: Any) -> Any:
    """Make the pool PyTorch's CUDA allocator; return the allocator object.

    Configures the library with ``config`` (see
    :func:`decaying_pool.configure`; ``enable(limit="20GiB",
    gc_threshold=0.8)``), creates ``torch.cuda.memory.CUDAPluggableAllocator``
    over :func:`decaying_pool.library_path` with ``dp_malloc``/``dp_free``,
    installs the hooks PyTorch offers (``set_init_fn``, ``set_reset_fn`` for
    ``torch.cuda.empty_cache``, ``set_memory_fraction_fn`` for
    ``torch.cuda.set_per_process_memory_fraction``, ``set_record_stream_fn``
    for ``Tensor.record_stream``) and swaps it in with
    ``torch.cuda.memory.change_current_allocator``.

    Call it once, before the first CUDA allocation. A second call returns
    the allocator already installed (a configuration is then refused).

    Raises:
        ImportError: PyTorch (with ``CUDAPluggableAllocator``) is missing.
        RuntimeError: PyTorch's CUDA state is already initialised.
        decaying_pool.ConfigError: the library refused ``config``.
    """
    global _enabled
    torch = _import_torch()
    if _enabled is not None:
        if config:
            raise RuntimeError(
                "decaying_pool.torch.enable() already ran; the configuration cannot change now"
            )
        return _enabled
    is_initialized = getattr(torch.cuda, "is_initialized", None)
    if is_initialized is not None and is_initialized():
        raise RuntimeError(
            "decaying_pool.torch.enable() must run before PyTorch initialises CUDA "
            "(before the first CUDA tensor): PyTorch cannot swap an allocator in use"
        )
    configure(**config)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), ALLOC, FREE)
    native = allocator.allocator() if hasattr(allocator, "allocator") else allocator._allocator
    for setter, function in HOOKS:
        install = getattr(native, setter, None)
        if install is not None:  # older PyTorch lacks some hooks
            install(_native.address(function))
    torch.cuda.memory.change_current_allocator(allocator)
    _enabled = allocator
    return allocator
