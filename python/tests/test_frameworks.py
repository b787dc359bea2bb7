"""``decaying_pool.torch`` and ``decaying_pool.cupy`` without the frameworks:
the error when one is missing, and ``enable`` against small stand-ins that
do with the library what PyTorch and CuPy do (load it, take the addresses,
call them through the same function types)."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import types
from typing import Any, List, Tuple

import pytest

import decaying_pool
import decaying_pool.cupy as dp_cupy
import decaying_pool.torch as dp_torch
from conftest import CUPY_FREE, CUPY_MALLOC, figures
from decaying_pool import _native


# -- the frameworks missing ------------------------------------------------


@pytest.mark.parametrize("module, enable", [("torch", dp_torch.enable), ("cupy", dp_cupy.enable)])
def test_enable_without_the_framework_is_an_import_error(monkeypatch, module, enable) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` fails
    with pytest.raises(ImportError, match=f"needs {'PyTorch' if module == 'torch' else 'CuPy'}"):
        enable()


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_really_absent() -> None:
    with pytest.raises(ImportError, match="pip install torch"):
        decaying_pool.torch.enable()


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed")
def test_cupy_really_absent() -> None:
    with pytest.raises(ImportError, match="CuPy"):
        decaying_pool.cupy.enable()


def test_importing_the_package_imports_no_framework() -> None:
    from conftest import run_python

    result = run_python(
        """
        import sys, decaying_pool, decaying_pool.torch, decaying_pool.cupy
        print(sorted(m for m in ("torch", "cupy") if m in sys.modules))
        """,
        config="backend=host",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- a stand-in for torch ----------------------------------------------------


class FakeTorchAllocator:
    """torch._C._CUDAPluggableAllocator: records the hooks set on it."""

    def __init__(self, alloc_fn: int, free_fn: int) -> None:
        self.alloc_fn, self.free_fn = alloc_fn, free_fn
        self.hooks: List[Tuple[str, int]] = []

    def set_init_fn(self, ptr: int) -> None:
        self.hooks.append(("set_init_fn", ptr))

    def set_reset_fn(self, ptr: int) -> None:
        self.hooks.append(("set_reset_fn", ptr))

    def set_memory_fraction_fn(self, ptr: int) -> None:
        self.hooks.append(("set_memory_fraction_fn", ptr))

    def set_record_stream_fn(self, ptr: int) -> None:
        self.hooks.append(("set_record_stream_fn", ptr))


def fake_torch(initialized: bool = False) -> Tuple[types.ModuleType, List[Any]]:
    events: List[Any] = []

    class CUDAPluggableAllocator:
        # As torch/cuda/memory.py: load the file, look both names up.
        def __init__(self, path: str, alloc_name: str, free_name: str) -> None:
            events.append(("CUDAPluggableAllocator", path, alloc_name, free_name))
            so = ctypes.CDLL(path)
            alloc = ctypes.cast(getattr(so, alloc_name), ctypes.c_void_p).value
            free = ctypes.cast(getattr(so, free_name), ctypes.c_void_p).value
            self._allocator = FakeTorchAllocator(alloc, free)

        def allocator(self) -> FakeTorchAllocator:
            return self._allocator

    def change_current_allocator(allocator: Any) -> None:
        events.append(("change_current_allocator", allocator))

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_initialized=lambda: initialized,
        memory=types.SimpleNamespace(
            CUDAPluggableAllocator=CUDAPluggableAllocator,
            change_current_allocator=change_current_allocator,
        ),
    )
    return torch, events


def test_torch_enable_installs_the_allocator_and_its_hooks(monkeypatch, torch_abi) -> None:
    torch, events = fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(dp_torch, "_enabled", None)

    allocator = dp_torch.enable()

    assert events[0] == ("CUDAPluggableAllocator", decaying_pool.library_path(), "dp_malloc", "dp_free")
    assert events[-1] == ("change_current_allocator", allocator)  # hooks first, then the swap
    native = allocator.allocator()
    assert native.alloc_fn == _native.address("dp_malloc")
    assert native.free_fn == _native.address("dp_free")
    assert native.hooks == [
        ("set_init_fn", _native.address("dp_init")),
        ("set_reset_fn", _native.address("dp_empty_cache")),
        ("set_memory_fraction_fn", _native.address("dp_set_memory_fraction")),
        ("set_record_stream_fn", _native.address("dp_record_stream")),
    ]
    # The reset hook, called as PyTorch's emptyCache calls it (void()),
    # trims the pools.
    alloc, free = torch_abi
    reset = ctypes.CFUNCTYPE(None)(dict(native.hooks)["set_reset_fn"])
    for _ in range(5):  # the cached block decays after 1 s: on a slow machine, again
        ptr = alloc(1 << 20, 0, 0)
        free(ptr, 1 << 20, 0, 0)
        if figures(decaying_pool.stats(0))["bytes_reserved"] > 0:
            break
    else:
        pytest.fail("a freed block was never seen cached")
    reset()
    assert figures(decaying_pool.stats(0))["bytes_reserved"] == 0

    # Once installed, enable() returns the same allocator; a new
    # configuration is refused.
    assert dp_torch.enable() is allocator
    with pytest.raises(RuntimeError, match="already"):
        dp_torch.enable(limit="1GiB")


def test_torch_enable_after_cuda_initialised_is_refused(monkeypatch) -> None:
    torch, events = fake_torch(initialized=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(dp_torch, "_enabled", None)
    with pytest.raises(RuntimeError, match="before PyTorch initialises CUDA"):
        dp_torch.enable()
    assert events == []


# -- a stand-in for cupy -----------------------------------------------------


def fake_cupy() -> Tuple[types.ModuleType, List[Any]]:
    installed: List[Any] = []

    class OutOfMemoryError(MemoryError):
        def __init__(self, size: int, total: int, limit: int = 0) -> None:
            super().__init__(f"Out of memory allocating {size:,} bytes")

    class Memory:
        # As CFunctionAllocatorMemory (cupy/cuda/memory.pyx): malloc in the
        # constructor, free when the last reference goes; NULL is kept as 0.
        def __init__(self, size: int, param: int, malloc: int, free: int, device: int) -> None:
            self._free = CUPY_FREE(free)
            self._param, self.device_id, self.size = param, device, size
            self.ptr = (CUPY_MALLOC(malloc)(param, size, device) or 0) if size else 0

        def __del__(self) -> None:
            if self.ptr:
                self._free(self._param, self.ptr, self.device_id)

    class MemoryPointer:
        def __init__(self, mem: Memory, offset: int) -> None:
            self.mem, self.ptr = mem, mem.ptr + offset

    class CFunctionAllocator:
        def __init__(self, param: int, malloc_func: int, free_func: int, owner: Any) -> None:
            self._args = (param, malloc_func, free_func)
            self._owner = owner

        def malloc(self, size: int) -> MemoryPointer:
            param, malloc, free = self._args
            return MemoryPointer(Memory(size, param, malloc, free, 0), 0)

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        memory=types.SimpleNamespace(
            CFunctionAllocator=CFunctionAllocator, OutOfMemoryError=OutOfMemoryError
        ),
        set_allocator=installed.append,
    )
    return cupy, installed


def test_cupy_enable_installs_the_c_functions(monkeypatch) -> None:
    cupy, installed = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(dp_cupy, "_device_allocator", None)

    malloc = dp_cupy.enable()
    assert installed == [malloc]
    before = figures(decaying_pool.stats(0))["bytes_in_use"]
    memptr = malloc(100_000)
    assert memptr.ptr
    ctypes.memset(memptr.ptr, 7, 100_000)
    assert figures(decaying_pool.stats(0))["bytes_in_use"] >= before + 100_000
    del memptr  # CuPy frees when the last reference goes
    assert figures(decaying_pool.stats(0))["bytes_in_use"] == before

    # CFunctionAllocator keeps a NULL as pointer 0; enable()'s allocator
    # raises CuPy's OutOfMemoryError with the library's message instead.
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError, match="dp_cupy_malloc: out of memory"):
        malloc(2**63)
    assert malloc(0).ptr == 0  # size 0 is no error (CuPy never calls malloc)


def test_cupy_enable_pinned_installs_the_pinned_pool(monkeypatch) -> None:
    cupy, installed = fake_cupy()
    pinned_installed: List[Any] = []

    class PinnedMemoryPointer:
        # As cupy/cuda/pinned_memory.pyx: keeps `mem`, reads its `ptr`.
        def __init__(self, mem: Any, offset: int) -> None:
            self.mem, self.ptr = mem, mem.ptr + offset

        def size(self) -> int:
            return int(self.mem.size - (self.ptr - self.mem.ptr))

    cupy.cuda.PinnedMemoryPointer = PinnedMemoryPointer  # type: ignore[attr-defined]
    cupy.cuda.set_pinned_memory_allocator = pinned_installed.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(dp_cupy, "_device_allocator", None)

    malloc = dp_cupy.enable(pinned=True)
    assert installed == [malloc]
    (pinned,) = pinned_installed
    before = figures(decaying_pool.stats(-1))["bytes_in_use"]
    p = pinned(300_000)
    assert p.ptr and p.size() == 300_000
    ctypes.memset(p.ptr, 3, 300_000)
    assert figures(decaying_pool.stats(-1))["bytes_in_use"] >= before + 300_000
    del p  # the last reference: back to the pinned pool
    assert figures(decaying_pool.stats(-1))["bytes_in_use"] == before
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError, match="dp_pinned_malloc"):
        pinned(2**63)
