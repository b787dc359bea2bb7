#!/usr/bin/env python3
"""Writes the seed corpus of the `snapshot` fuzz target.

    python3 fuzz/snapshot_seeds.py

Pickles as Python's `pickle` writes them (protocols 0 to 5), PyTorch
memory snapshots among them, and shapes a recursive reader does not
survive. `tests/it/snapshot_corpus.rs` replays them on stable Rust and
checks what each converts to; rewriting them with another Python must
leave that test passing.
"""
import collections
import os
import pickle
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "snapshot")

FRAMES = [{"filename": "train.py", "line": 12, "name": "step"}]
BASE = 0x7F0000000000
SNAPSHOT = {
    "segments": [{"address": 0, "total_size": 2**21, "blocks": []}],
    "device_traces": [
        [
            {"action": "segment_alloc", "addr": BASE, "size": 2**21, "stream": 0, "time_us": 1, "frames": FRAMES},
            {"action": "alloc", "addr": BASE, "size": 512, "stream": 0, "time_us": 2, "frames": FRAMES},
            {"action": "alloc", "addr": BASE + 512, "size": 1024, "stream": 7, "time_us": 3, "frames": FRAMES},
            {"action": "free_requested", "addr": BASE, "size": 512, "stream": 0, "time_us": 4, "frames": FRAMES},
            {"action": "free_completed", "addr": BASE, "size": 512, "stream": 0, "time_us": 5, "frames": FRAMES},
        ],
        [{"action": "alloc", "addr": 16, "size": 8, "stream": None, "time_us": 9}],
    ],
    "allocator_settings": collections.OrderedDict(max_split_size=-1),
}


def nested(depth):
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def shared(levels):
    # {'device_traces': x}, where x holds the list before it twice, and
    # so on: 2^levels leaves as a tree.
    p = b"\x80\x04}\x94\x8c\rdevice_traces\x94]\x94"
    for i in range(2, 2 + levels):
        p += b"0](j" + struct.pack("<I", i) + b"j" + struct.pack("<I", i) + b"e\x94"
    return p + b"s."


def main():
    os.makedirs(HERE, exist_ok=True)
    seeds = {f"snapshot-p{p}": pickle.dumps(SNAPSHOT, protocol=p) for p in (2, 3, 4, 5)}
    seeds["snapshot-truncated-p4"] = seeds["snapshot-p4"][: len(seeds["snapshot-p4"]) // 2]
    big = {"device_traces": [[{"action": "alloc", "addr": 2**64 - 512, "size": 2**70, "stream": 0, "time_us": 1}]]}
    seeds["size-past-u64-p4"] = pickle.dumps(big, protocol=4)
    seeds["list-p0"] = pickle.dumps([1, True, -7, 2**70, "ab", 1.5], protocol=0)
    seeds["nested-10000"] = nested(10000)
    seeds["shared-40"] = shared(40)
    for name, data in sorted(seeds.items()):
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
