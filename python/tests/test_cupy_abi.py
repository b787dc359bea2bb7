"""The library through CuPy's ``CFunctionAllocator`` signatures, on the host
backend, from several threads."""

from __future__ import annotations

import ctypes
import random
import threading
from typing import List, Set, Tuple

import decaying_pool
from conftest import figures

PARAM = 0x5EED  # CuPy passes its `param` through untouched


def test_threads_no_block_twice_every_byte_back(cupy_abi) -> None:
    malloc, free = cupy_abi
    seen_lock = threading.Lock()
    live: Set[int] = set()
    errors: List[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        held: List[Tuple[int, int, int]] = []
        try:
            for _ in range(300):
                if held and (len(held) > 12 or rng.random() < 0.5):
                    ptr, size, tag = held.pop(rng.randrange(len(held)))
                    assert ctypes.string_at(ptr, size) == bytes([tag]) * size
                    with seen_lock:
                        live.remove(ptr)
                    free(PARAM, ptr, 0)
                else:
                    size = rng.choice([16, 256, 1000, 8192, 50_000, 300_000])
                    ptr = malloc(PARAM, size, 0)
                    assert ptr, f"dp_cupy_malloc({size}) failed: {decaying_pool.last_error()}"
                    with seen_lock:
                        assert ptr not in live, f"{ptr:#x} handed out twice"
                        live.add(ptr)
                    tag = rng.randrange(256)
                    ctypes.memset(ptr, tag, size)
                    held.append((ptr, size, tag))
            for ptr, size, tag in held:
                assert ctypes.string_at(ptr, size) == bytes([tag]) * size
                with seen_lock:
                    live.remove(ptr)
                free(PARAM, ptr, 0)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    s = figures(decaying_pool.stats(0))
    assert s["bytes_in_use"] == 0, s
    decaying_pool.empty_cache()
    assert figures(decaying_pool.stats(0))["bytes_reserved"] == 0


def test_impossible_size_and_null_free(cupy_abi) -> None:
    malloc, free = cupy_abi
    assert malloc(PARAM, 2**63, 0) is None
    assert decaying_pool.last_error()
    free(PARAM, None, 0)
    ptr = malloc(PARAM, 64, 0)
    assert ptr
    free(PARAM, ptr, 0)
    assert figures(decaying_pool.stats(0))["bytes_in_use"] == 0


def test_cupy_and_torch_doors_share_the_device(cupy_abi, torch_abi) -> None:
    # Both doors at once on one device: distinct blocks, all given back.
    malloc, cupy_free = cupy_abi
    alloc, torch_free = torch_abi
    a = malloc(PARAM, 4096, 0)
    b = alloc(4096, 0, 0)
    assert a and b and a != b
    cupy_free(PARAM, a, 0)
    torch_free(b, 4096, 0, 0)
    assert figures(decaying_pool.stats(0))["bytes_in_use"] == 0


def test_pinned_host_memory_from_threads() -> None:
    # dp_pinned_malloc / dp_pinned_free, as CuPy's pinned allocator uses
    # them: a pool of its own (device -1), blocks never handed out twice.
    lib = ctypes.CDLL(decaying_pool.library_path())
    lib.dp_pinned_malloc.restype = ctypes.c_void_p
    lib.dp_pinned_malloc.argtypes = [ctypes.c_size_t]
    lib.dp_pinned_free.restype = None
    lib.dp_pinned_free.argtypes = [ctypes.c_void_p]
    errors: List[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        held: List[Tuple[int, int, int]] = []
        for _ in range(300):
            if held and rng.random() < 0.5:
                ptr, size, byte = held.pop(rng.randrange(len(held)))
                if ctypes.string_at(ptr, size) != bytes([byte]) * size:
                    errors.append(f"block {ptr:#x} changed under its owner")
                lib.dp_pinned_free(ptr)
            else:
                size = rng.randrange(1, 1 << 16)
                ptr = lib.dp_pinned_malloc(size)
                if not ptr:
                    errors.append(f"dp_pinned_malloc({size}) failed: {decaying_pool.last_error()}")
                    continue
                byte = seed & 0xFF
                ctypes.memset(ptr, byte, size)
                held.append((ptr, size, byte))
        for ptr, _, _ in held:
            lib.dp_pinned_free(ptr)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert figures(decaying_pool.stats(-1))["bytes_in_use"] == 0
    assert lib.dp_pinned_malloc(2**63) is None
    assert decaying_pool.last_error().startswith("dp_pinned_malloc")
    lib.dp_pinned_free(None)
    decaying_pool.empty_cache()
    assert figures(decaying_pool.stats(-1))["bytes_reserved"] == 0
