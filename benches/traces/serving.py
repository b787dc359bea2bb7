#!/usr/bin/env python3
"""A synthetic allocation trace of LLM serving with dynamic shapes.

Each request has its own batch size and sequence length, so the large
tensors (activations, attention scores, MLP hidden states, logits, the
key/value cache) change size from one request to the next: the case an
exact cache handles worst. A model of 24 layers, d_model 2048, 16 heads,
a 50 304-token vocabulary, bf16 (2 bytes an element); batch 1, 1, 2, 4 or 8;
sequence 16 to 2048 tokens, drawn from a seeded generator, so a seed and a
request count give the same trace on any machine.

Writes the crate's native trace format (`time_ns,action,addr,size`) to
standard output:

    python3 benches/traces/serving.py 1 200 > serving.csv
    cargo run --release -p decaying-pool-cli -- replay serving.csv

Arguments: the seed (default 1), the number of requests (default 200) and
the order of the requests: `random` (default: as drawn), `ascending` or
`descending` (all drawn first, then sorted by their footprint: the largest
request comes last, or first, the cases hardest and easiest for a cache
that learns from the peak seen so far).
"""

import random
import sys


def serve(seed, requests, order="random", d=2048, layers=24, heads=16, vocab=50304, max_seq=2048):
    rnd = random.Random(seed)
    t = 0
    addr = 0x10000000
    rows = []

    def alloc(size):
        nonlocal t, addr
        t += rnd.randint(2000, 20000)
        addr += 0x1000
        rows.append(f"{t},alloc,{hex(addr)},{size}")
        return (addr, size)

    def free(block):
        nonlocal t
        t += rnd.randint(500, 5000)
        rows.append(f"{t},free,{hex(block[0])},{block[1]}")

    def shapes():
        # Drawn one by one as the requests come, or all first and sorted.
        if order == "random":
            for _ in range(requests):
                yield rnd.choice([1, 1, 2, 4, 8]), rnd.randint(16, max_seq)
            return
        drawn = [(rnd.choice([1, 1, 2, 4, 8]), rnd.randint(16, max_seq)) for _ in range(requests)]
        drawn.sort(key=lambda r: r[0] * r[1] * (1 + r[1] / 256), reverse=order == "descending")
        yield from drawn

    for b, s in shapes():
        kv = []
        x = alloc(b * s * d * 2)
        for _ in range(layers):
            qkv = alloc(3 * b * s * d * 2)
            scores = alloc(b * heads * s * s * 2)
            kv.append(alloc(b * s * d * 2))
            kv.append(alloc(b * s * d * 2))
            free(scores)
            out = alloc(b * s * d * 2)
            free(qkv)
            hidden = alloc(b * s * 4 * d * 2)
            free(out)
            y = alloc(b * s * d * 2)
            free(hidden)
            free(x)
            x = y
            small = [alloc(rnd.choice([512, 4096, 8192, 4 * d, 2 * d])) for _ in range(4)]
            for block in small:
                free(block)
        logits = alloc(b * s * vocab * 2)
        free(x)
        free(logits)
        for block in kv:
            free(block)
        # Idle between requests: 0.1 to 10 ms.
        t += rnd.randint(10**5, 10**7)
    return rows


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    order = sys.argv[3] if len(sys.argv) > 3 else "random"
    if order not in ("random", "ascending", "descending"):
        sys.exit(f"ORDER: random, ascending or descending, not {order!r}")
    print("# synthetic LLM serving, dynamic shapes: benches/traces/serving.py", seed, requests, order)
    print("time_ns,action,addr,size")
    print("\n".join(serve(seed, requests, order)))


if __name__ == "__main__":
    main()
