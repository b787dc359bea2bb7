import random, sys
# dynamic-shape LLM serving: random batch x sequence per request
def serve(seed, n_req=300, d=2048, layers=24, heads=16, vocab=50304, maxs=2048):
    rnd = random.Random(seed)
    t = 0; addr = 0x10000000; out = []
    def alloc(size):
        nonlocal t, addr
        t += rnd.randint(2000, 20000); addr += 0x1000
        out.append(f"{t},alloc,{hex(addr)},{size}"); return (addr, size)
    def free(a):
        nonlocal t
        t += rnd.randint(500, 5000)
        out.append(f"{t},free,{hex(a[0])},{a[1]}")
    for r in range(n_req):
        b = rnd.choice([1,1,2,4,8]); s = rnd.randint(16, maxs)
        kv = []
        x = alloc(b*s*d*2)
        for l in range(layers):
            qkv = alloc(3*b*s*d*2)
            sc = alloc(b*heads*s*s*2)
            kv.append(alloc(b*s*d*2)); kv.append(alloc(b*s*d*2))
            free(sc)
            o = alloc(b*s*d*2); free(qkv)
            h = alloc(b*s*4*d*2); free(o)
            y = alloc(b*s*d*2); free(h); free(x); x = y
            small = [alloc(rnd.choice([512, 4096, 8192, 4*d, 2*d])) for _ in range(4)]
            for sm in small: free(sm)
        lg = alloc(b*s*vocab*2); free(x); free(lg)
        for k in kv: free(k)
        t += rnd.randint(10**5, 10**7)
    return out
print("time_ns,action,addr,size")
print("\n".join(serve(int(sys.argv[1]), n_req=int(sys.argv[2]) if len(sys.argv)>2 else 300)))
