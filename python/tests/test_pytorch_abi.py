"""The library through PyTorch's pluggable-allocator signatures, on the host
backend: many threads, streams as opaque handles, every block checked."""

from __future__ import annotations

import ctypes
import random
import threading
from typing import Dict, List, Tuple

import decaying_pool
from conftest import figures

THREADS = 8
ROUNDS = 400
STREAMS = [0, 0x1000, 0x2000, 0x3000]  # cudaStream_t handles, never dereferenced
SIZES = [1, 8, 100, 512, 4096, 10_000, 65_536, 1 << 20, 3 << 20]


def _pattern(ptr: int, size: int) -> int:
    return (ptr >> 4 ^ size) & 0xFF


def _fill(ptr: int, size: int) -> None:
    ctypes.memset(ptr, _pattern(ptr, size), size)


def _check(ptr: int, size: int) -> None:
    want = _pattern(ptr, size)
    # The first and last 64 bytes and one in the middle: enough to see a
    # block handed to two owners (the other owner wrote its own pattern).
    for start in {0, max(0, size // 2 - 32), max(0, size - 64)}:
        got = ctypes.string_at(ptr + start, min(64, size - start))
        assert got == bytes([want]) * len(got), f"block {ptr:#x}+{start} of {size} overwritten"


def test_threads_and_streams_no_block_twice(torch_abi) -> None:
    alloc, free = torch_abi
    live_lock = threading.Lock()
    live: Dict[int, int] = {}  # start -> end, of every block handed out now
    errors: List[BaseException] = []

    def claim(ptr: int, size: int) -> None:
        with live_lock:
            for start, end in live.items():
                assert ptr + size <= start or end <= ptr, (
                    f"[{ptr:#x}, +{size}) overlaps a live block [{start:#x}, {end:#x})"
                )
            live[ptr] = ptr + size

    def release(ptr: int) -> None:
        with live_lock:
            del live[ptr]

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        held: List[Tuple[int, int, int]] = []
        try:
            for _ in range(ROUNDS):
                if held and (len(held) > 16 or rng.random() < 0.45):
                    ptr, size, stream = held.pop(rng.randrange(len(held)))
                    _check(ptr, size)
                    release(ptr)
                    free(ptr, size, 0, stream)
                else:
                    size = rng.choice(SIZES) + rng.randrange(64)
                    stream = rng.choice(STREAMS)
                    ptr = alloc(size, 0, stream)
                    assert ptr, f"dp_malloc({size}) failed: {decaying_pool.last_error()}"
                    claim(ptr, size)
                    _fill(ptr, size)
                    held.append((ptr, size, stream))
            for ptr, size, stream in held:
                _check(ptr, size)
                release(ptr)
                free(ptr, size, 0, stream)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert not live

    # Every byte back: nothing in use, and nothing reserved once trimmed.
    device = decaying_pool.stats(0)
    s = figures(device)
    assert s["bytes_in_use"] == 0, s
    assert s["blocks_in_use"] == 0, s
    assert device["library_live_pointers"] == 0, device
    assert device["pending_blocks"] == 0, device
    assert {p["stream"] for p in device["streams"]} >= set(STREAMS), device["streams"]
    assert s["hits"] > 0, "nothing was reused"
    decaying_pool.empty_cache()
    device = decaying_pool.stats(0)
    s = figures(device)
    assert s["bytes_reserved"] == 0, s
    assert s["bytes_cached"] == 0, s
    assert device["reserved"] == 0, device


def test_block_freed_on_one_thread_from_another(torch_abi) -> None:
    alloc, free = torch_abi
    blocks = []
    for i in range(32):
        ptr = alloc(4096 + i, 0, STREAMS[i % len(STREAMS)])
        assert ptr
        _fill(ptr, 4096 + i)
        blocks.append((ptr, 4096 + i, STREAMS[i % len(STREAMS)]))

    def freer() -> None:
        for ptr, size, stream in blocks:
            _check(ptr, size)
            free(ptr, size, 0, stream)

    t = threading.Thread(target=freer)
    t.start()
    t.join()
    assert figures(decaying_pool.stats(0))["bytes_in_use"] == 0


def test_impossible_size_is_null_with_a_message(torch_abi) -> None:
    alloc, _ = torch_abi
    for size in (2**63, 2**64 - 1):
        assert alloc(size, 0, 0) is None
        message = decaying_pool.last_error()
        assert message.startswith("dp_malloc"), f"dp_malloc({size}): message {message!r}"
    # A device that is no device.
    assert alloc(64, -1, 0) is None
    assert "device" in decaying_pool.last_error()
    # Size 0: NULL, as PyTorch's own allocator gives for an empty tensor,
    # and no error.
    assert alloc(0, 0, 0) is None
    assert decaying_pool.last_error() == ""
    # The pool still serves afterwards.
    _, free = torch_abi
    ptr = alloc(256, 0, 0)
    assert ptr
    free(ptr, 256, 0, 0)


def test_free_null_does_nothing(torch_abi) -> None:
    _, free = torch_abi
    before = figures(decaying_pool.stats(0))
    free(None, 0, 0, None)
    assert decaying_pool.last_error() == ""
    free(None, 128, 0, 0x1000)
    assert decaying_pool.last_error() == ""
    after = figures(decaying_pool.stats(0))
    assert after["bytes_in_use"] == before["bytes_in_use"]


def test_unknown_pointer_free_is_reported_not_a_crash(torch_abi) -> None:
    alloc, free = torch_abi
    ptr = alloc(1024, 0, 0)
    assert ptr
    stranger = ctypes.create_string_buffer(1024)  # memory the library never handed out
    free(ctypes.addressof(stranger), 1024, 0, 0)
    assert "not handed out" in decaying_pool.last_error()
    # A pointer inside a live block is not the block.
    free(ptr + 16, 1008, 0, 0)
    assert "not handed out" in decaying_pool.last_error()
    s = figures(decaying_pool.stats(0))
    assert s["blocks_in_use"] == 1, s
    free(ptr, 1024, 0, 0)
    assert decaying_pool.last_error() == ""
    # A second free of the same block is unknown too, and changes nothing.
    free(ptr, 1024, 0, 0)
    assert "freed already" in decaying_pool.last_error()
    s = figures(decaying_pool.stats(0))
    assert s["bytes_in_use"] == 0 and s["blocks_in_use"] == 0, s
    ptr = alloc(1024, 0, 0)
    assert ptr
    free(ptr, 1024, 0, 0)


def test_free_with_another_size_releases_the_allocated_size(torch_abi) -> None:
    alloc, free = torch_abi
    ptr = alloc(5000, 0, 0)
    assert ptr
    free(ptr, 4000, 0, 0)
    assert "5000" in decaying_pool.last_error()
    assert figures(decaying_pool.stats(0))["bytes_in_use"] == 0


def test_record_stream_and_init_on_the_host_backend(lib, torch_abi) -> None:
    alloc, free = torch_abi
    lib.dp_init(1)  # PyTorch's init hook: one device
    assert decaying_pool.last_error() == ""
    ptr = alloc(2048, 0, 0x1000)
    assert ptr
    lib.dp_record_stream(ptr, 0x2000)  # used on a second stream too
    assert decaying_pool.last_error() == ""
    lib.dp_record_stream(0x10, 0x2000)
    assert "not handed out" in decaying_pool.last_error()
    free(ptr, 2048, 0, 0x1000)
    # The host backend has no events: the block is not held back.
    device = decaying_pool.stats(0)
    assert figures(device)["bytes_in_use"] == 0
    assert device["pending_blocks"] == 0
    # A device past dp_init's count.
    assert alloc(64, 1, 0) is None
    assert "device 1" in decaying_pool.last_error()
