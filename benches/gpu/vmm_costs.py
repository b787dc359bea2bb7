"""The per-call cost of CUDA's virtual memory management calls on this device,
measured through the driver API (ctypes on `libcuda.so.1`, no PyTorch), beside
the published figures the peers' simulator (`../shared/peers/cca_sim.py`) and
the crate's `PageCosts::PUBLISHED` charge: kvcached's `benchmarks/bench_vmm`
(A100, one thread, pages of 2 MiB), cuMemCreate 193 us, cuMemMap 1.45 us,
cuMemSetAccess 36 us (one call per mapped run), cuMemUnmap 25.6 us,
cuMemRelease 25.6 us (no published figure: charged as cuMemUnmap),
cuMemAddressReserve 19 us.

    python3 benches/gpu/vmm_costs.py [--out FILE.json] [--sizes-mib 2,4,8,20,64]
        [--pages 256] [--max-total-gib 8] [--rounds 3] [--reserves 16]
        [--max-seconds 60] [--device 0]

`--out` defaults to $OUT/vmm_costs.json when $OUT is set (else no file).
`benches/gpu/run.sh` runs it (no build needed: it loads only the driver).

For each page size P (a multiple of the device's minimum granularity; sizes
that are not are skipped) and N = min(--pages, --max-total-gib / P, 80 % of
the free device memory / P) pages, each round:

1. `--reserves` reservations of N x P bytes (`cuMemAddressReserve`, one
   timed call each), then freed (`cuMemAddressFree`, timed);
2. one more reservation (the range of the round, timed as a reserve);
3. N pages created (`cuMemCreate`, pinned device memory, one call a page);
4. each page mapped at its slot (`cuMemMap`, one call a page), access set one
   call a page (`cuMemSetAccess` over one page: `set_access_page`), each page
   unmapped (`cuMemUnmap`, one call a page: `unmap_page`);
5. the pages mapped again (more `cuMemMap` samples), access set in one call
   over the run of N pages (`set_access_run`, as the crate's `CudaPages` and
   PyTorch's expandable segments do), the run unmapped in one call
   (`unmap_run`; if the driver refuses one call over several mappings, its
   error is reported and the pages are unmapped one by one, untimed);
6. the pages released (`cuMemRelease`), the range freed (`cuMemAddressFree`).

Each call is timed alone with `time.perf_counter_ns()` around the ctypes call
(the ctypes floor, a driver call that does no work, `cuCtxGetCurrent`, is
measured and reported: subtract it from the sub-microsecond figures). Per
call and page size: the median, the p90 (nearest rank), mean, min, max, the
first call, and the count; the published figure beside the median, with the
ratio. A *run* figure per page size compares what `cca_sim.py` charges for
mapping a run of N new pages, N x (create + map) + set access, and for giving
it back, N x (unmap + release), with the same sums of the measured medians.
Queued work on a busy stream (which may slow the unmaps) is not measured.

Every driver call's result is checked; a failure names the call and the
CUresult (`cuGetErrorName`), ends that page size (what was created or mapped
is given back) and the next one runs. Rounds stop at `--max-seconds` (the
page size under way finishes its round; later sizes are skipped and
reported). It fails soft: without `libcuda.so.1`, a device or virtual memory
management it prints why and exits 0.
"""

import argparse
import ctypes
import json
import os
import platform
import sys
import time
import traceback

MIB = 1 << 20
GIB = 1 << 30

# The published figures, in microseconds, per call, for pages of 2 MiB (the
# constants of `cca_sim.py`, `VMM_*`; `PageCosts::PUBLISHED` in the crate).
PUBLISHED_US = {
    "create": 193.0,           # VMM_CREATE
    "map": 1.45,               # VMM_MAP
    "set_access_run": 36.0,    # VMM_SET_ACCESS (one call per mapped run)
    "set_access_page": 36.0,   # the same price, one call per page
    "unmap_page": 25.6,        # VMM_UNMAP
    "unmap_run": None,         # cca_sim charges VMM_UNMAP a page: see `run` figures
    "release": 25.6,           # VMM_RELEASE (assumed equal to the unmap)
    "reserve": 19.0,           # VMM_RESERVE
    "address_free": None,      # not charged (`PageCosts::PUBLISHED.range_free` is 0)
}
CALLS = ("reserve", "address_free", "create", "map", "set_access_page", "set_access_run",
         "unmap_page", "unmap_run", "release")
DRIVER_NAMES = {
    "reserve": "cuMemAddressReserve", "address_free": "cuMemAddressFree",
    "create": "cuMemCreate", "map": "cuMemMap", "set_access_page": "cuMemSetAccess (a page)",
    "set_access_run": "cuMemSetAccess (the run)", "unmap_page": "cuMemUnmap (a page)",
    "unmap_run": "cuMemUnmap (the run)", "release": "cuMemRelease",
}

# ---------------------------------------------------------------- the driver API
# The layouts of CUDA 12's `cuda.h` (the same as cudarc's bindings for
# cuda-12080, which `src/pages/cuda.rs` fills): enums are C `int`s.
CUresult = ctypes.c_int
CUdevice = ctypes.c_int
CUcontext = ctypes.c_void_p
CUdeviceptr = ctypes.c_uint64          # unsigned long long
CUmemHandle = ctypes.c_uint64          # CUmemGenericAllocationHandle

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_NONE = 0
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED = 102


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int),      # CUmemLocationType
                ("id", ctypes.c_int)]


class CUmemAllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int),                  # CUmemAllocationType
                ("requestedHandleTypes", ctypes.c_int),  # CUmemAllocationHandleType
                ("location", CUmemLocation),
                ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", CUmemAllocFlags)]


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CUmemLocation),
                ("flags", ctypes.c_int)]                 # CUmemAccess_flags


def check_layouts():
    """The struct layouts of CUDA 12 on a 64-bit target (as bindgen laid them
    out for cudarc): checked before anything reaches the driver."""
    want = [
        (ctypes.sizeof(CUmemLocation), 8),
        (ctypes.sizeof(CUmemAllocFlags), 8),
        (ctypes.sizeof(CUmemAllocationProp), 32),
        (CUmemAllocationProp.location.offset, 8),
        (CUmemAllocationProp.win32HandleMetaData.offset, 16),
        (CUmemAllocationProp.allocFlags.offset, 24),
        (ctypes.sizeof(CUmemAccessDesc), 12),
        (CUmemAccessDesc.flags.offset, 8),
        (ctypes.sizeof(CUdeviceptr), 8),
    ]
    bad = [(got, exp) for got, exp in want if got != exp]
    if bad or ctypes.sizeof(ctypes.c_void_p) != 8:
        raise RuntimeError(f"unexpected struct layout (got, want): {bad}")


class CudaCallError(Exception):
    def __init__(self, call, code, name):
        super().__init__(f"{call} failed: {name} ({code})")
        self.call, self.code, self.name = call, code, name


# name: (argtypes); every function returns CUresult.
SIGNATURES = {
    "cuInit": [ctypes.c_uint],
    "cuDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "cuDeviceGetCount": [ctypes.POINTER(ctypes.c_int)],
    "cuDeviceGet": [ctypes.POINTER(CUdevice), ctypes.c_int],
    "cuDeviceGetName": [ctypes.c_char_p, ctypes.c_int, CUdevice],
    "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, CUdevice],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(CUcontext), CUdevice],
    "cuCtxSetCurrent": [CUcontext],
    "cuCtxGetCurrent": [ctypes.POINTER(CUcontext)],
    "cuCtxSynchronize": [],
    "cuGetErrorName": [CUresult, ctypes.POINTER(ctypes.c_char_p)],
    "cuMemGetAllocationGranularity": [ctypes.POINTER(ctypes.c_size_t),
                                      ctypes.POINTER(CUmemAllocationProp), ctypes.c_int],
    "cuMemAddressReserve": [ctypes.POINTER(CUdeviceptr), ctypes.c_size_t, ctypes.c_size_t,
                            CUdeviceptr, ctypes.c_ulonglong],
    "cuMemAddressFree": [CUdeviceptr, ctypes.c_size_t],
    "cuMemCreate": [ctypes.POINTER(CUmemHandle), ctypes.c_size_t,
                    ctypes.POINTER(CUmemAllocationProp), ctypes.c_ulonglong],
    "cuMemRelease": [CUmemHandle],
    "cuMemMap": [CUdeviceptr, ctypes.c_size_t, ctypes.c_size_t, CUmemHandle, ctypes.c_ulonglong],
    "cuMemUnmap": [CUdeviceptr, ctypes.c_size_t],
    "cuMemSetAccess": [CUdeviceptr, ctypes.c_size_t, ctypes.POINTER(CUmemAccessDesc),
                       ctypes.c_size_t],
}
# `cuda.h` #defines these to their versioned symbols.
VERSIONED = {
    "cuMemGetInfo": ("cuMemGetInfo_v2", [ctypes.POINTER(ctypes.c_size_t),
                                         ctypes.POINTER(ctypes.c_size_t)]),
    "cuDevicePrimaryCtxRelease": ("cuDevicePrimaryCtxRelease_v2", [CUdevice]),
}


class Driver:
    """The entry points, typed, and a checked call."""

    def __init__(self, lib):
        self.lib = lib
        self.f = {}
        for name, args in SIGNATURES.items():
            self.f[name] = self._bind(name, args)
        for name, (symbol, args) in VERSIONED.items():
            self.f[name] = self._bind(symbol, args)

    def _bind(self, symbol, args):
        try:
            fn = getattr(self.lib, symbol)
        except AttributeError:
            raise RuntimeError(f"libcuda.so.1 has no {symbol} (a driver older than CUDA 10.2?)")
        fn.argtypes = args
        fn.restype = CUresult
        return fn

    def error_name(self, code):
        s = ctypes.c_char_p()
        if self.f["cuGetErrorName"](code, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return f"CUresult {code}"

    def check(self, call, code):
        if code != 0:
            raise CudaCallError(call, code, self.error_name(code))

    def __call__(self, name, *args):
        self.check(name, self.f[name](*args))


def load_driver():
    """(Driver, None) or (None, why not)."""
    if platform.system() != "Linux":
        return None, f"not Linux ({platform.system()}): no libcuda.so.1"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return None, f"no CUDA driver library (libcuda.so.1: {e})"
    try:
        return Driver(lib), None
    except RuntimeError as e:
        return None, str(e)


# ---------------------------------------------------------------- figures
def summary(ns):
    """Figures in microseconds of a list of nanosecond samples."""
    if not ns:
        return {"n": 0}
    s = sorted(ns)
    n = len(s)
    median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    p90 = s[min(n - 1, max(0, -(-9 * n // 10) - 1))]  # nearest rank
    return {"n": n, "median_us": median / 1e3, "p90_us": p90 / 1e3,
            "mean_us": sum(s) / n / 1e3, "min_us": s[0] / 1e3, "max_us": s[-1] / 1e3,
            "first_us": ns[0] / 1e3}


def fmt_us(v):
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


# ---------------------------------------------------------------- the measurement
class Session:
    """A device, its primary context current, and what is held (given back
    whatever happens)."""

    def __init__(self, drv, ordinal):
        self.drv = drv
        self.dev = CUdevice()
        drv("cuDeviceGet", ctypes.byref(self.dev), ordinal)
        self.ordinal = ordinal
        self.ctx = CUcontext()
        drv("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        drv("cuCtxSetCurrent", self.ctx)
        self.prop = CUmemAllocationProp()
        self.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE
        self.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = ordinal
        self.prop.win32HandleMetaData = None
        self.access = CUmemAccessDesc()
        self.access.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        self.access.location.id = ordinal
        self.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        # What is held: reservations (ptr, size), handles, mappings (ptr, size).
        self.ranges, self.handles, self.mappings = [], [], []

    def granularity(self, option):
        g = ctypes.c_size_t()
        self.drv("cuMemGetAllocationGranularity", ctypes.byref(g), ctypes.byref(self.prop), option)
        return g.value

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.drv("cuMemGetInfo", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def cleanup(self):
        """Gives back what is held, in order; the errors, in words."""
        errors = []
        f = self.drv.f
        for ptr, size in reversed(self.mappings):
            r = f["cuMemUnmap"](ptr, size)
            if r:
                errors.append(f"cleanup cuMemUnmap: {self.drv.error_name(r)}")
        self.mappings = []
        for h in self.handles:
            r = f["cuMemRelease"](h)
            if r:
                errors.append(f"cleanup cuMemRelease: {self.drv.error_name(r)}")
        self.handles = []
        for ptr, size in self.ranges:
            r = f["cuMemAddressFree"](ptr, size)
            if r:
                errors.append(f"cleanup cuMemAddressFree: {self.drv.error_name(r)}")
        self.ranges = []
        return errors

    def close(self):
        self.cleanup()
        self.drv.f["cuDevicePrimaryCtxRelease"](self.dev)


def ctypes_floor(drv, n=2000):
    """The time of a ctypes call into the driver that does no work."""
    fn = drv.f["cuCtxGetCurrent"]
    out = CUcontext()
    ref = ctypes.byref(out)
    clock = time.perf_counter_ns
    ns = []
    for _ in range(n):
        t = clock()
        fn(ref)
        ns.append(clock() - t)
    return summary(ns)


def measure_size(s, page, pages, align, rounds, reserves, deadline, samples, notes):
    """Adds the samples (nanoseconds) of each call for one page size to
    `samples` (kept if a call fails); the rounds done."""
    drv, f = s.drv, s.drv.f
    clock = time.perf_counter_ns
    length = page * pages
    prop_ref = ctypes.byref(s.prop)
    access_ref = ctypes.byref(s.access)
    done = 0
    for rnd in range(rounds):
        if rnd > 0 and time.monotonic() > deadline:
            notes.append(f"stopped after {rnd} round(s): the time limit")
            break
        # 1. Reservations alone.
        extra = []
        for _ in range(reserves):
            ptr = CUdeviceptr()
            t = clock()
            r = f["cuMemAddressReserve"](ctypes.byref(ptr), length, align, 0, 0)
            dt = clock() - t
            drv.check("cuMemAddressReserve", r)
            samples["reserve"].append(dt)
            s.ranges.append((ptr.value, length))
            extra.append(ptr.value)
        for ptr in reversed(extra):
            t = clock()
            r = f["cuMemAddressFree"](ptr, length)
            dt = clock() - t
            drv.check("cuMemAddressFree", r)
            samples["address_free"].append(dt)
            s.ranges.remove((ptr, length))
        # 2. The round's range.
        base = CUdeviceptr()
        t = clock()
        r = f["cuMemAddressReserve"](ctypes.byref(base), length, align, 0, 0)
        dt = clock() - t
        drv.check("cuMemAddressReserve", r)
        samples["reserve"].append(dt)
        base = base.value
        s.ranges.append((base, length))
        # 3. Pages.
        handles = []
        for _ in range(pages):
            h = CUmemHandle()
            t = clock()
            r = f["cuMemCreate"](ctypes.byref(h), page, prop_ref, 0)
            dt = clock() - t
            drv.check("cuMemCreate", r)
            samples["create"].append(dt)
            s.handles.append(h.value)
            handles.append(h.value)
        # 4. Map a page a call, access a page a call, unmap a page a call.
        for i, h in enumerate(handles):
            ptr = base + i * page
            t = clock()
            r = f["cuMemMap"](ptr, page, 0, h, 0)
            dt = clock() - t
            drv.check("cuMemMap", r)
            samples["map"].append(dt)
            s.mappings.append((ptr, page))
        for i in range(pages):
            t = clock()
            r = f["cuMemSetAccess"](base + i * page, page, access_ref, 1)
            dt = clock() - t
            drv.check("cuMemSetAccess", r)
            samples["set_access_page"].append(dt)
        for i in range(pages):
            ptr = base + i * page
            t = clock()
            r = f["cuMemUnmap"](ptr, page)
            dt = clock() - t
            drv.check("cuMemUnmap", r)
            samples["unmap_page"].append(dt)
            s.mappings.remove((ptr, page))
        # 5. Map again, access over the run in one call, unmap the run in one.
        for i, h in enumerate(handles):
            ptr = base + i * page
            t = clock()
            r = f["cuMemMap"](ptr, page, 0, h, 0)
            dt = clock() - t
            drv.check("cuMemMap", r)
            samples["map"].append(dt)
            s.mappings.append((ptr, page))
        t = clock()
        r = f["cuMemSetAccess"](base, length, access_ref, 1)
        dt = clock() - t
        drv.check("cuMemSetAccess", r)
        samples["set_access_run"].append(dt)
        drv("cuCtxSynchronize")
        t = clock()
        r = f["cuMemUnmap"](base, length)
        dt = clock() - t
        if r == 0:
            samples["unmap_run"].append(dt)
            s.mappings = [m for m in s.mappings if not (base <= m[0] < base + length)]
        else:
            notes.append(f"cuMemUnmap over the run of {pages} mappings refused: "
                         f"{drv.error_name(r)}; unmapped a page a call")
            for i in range(pages):
                ptr = base + i * page
                drv("cuMemUnmap", ptr, page)
                s.mappings.remove((ptr, page))
        # 6. Release the pages, free the range.
        for h in handles:
            t = clock()
            r = f["cuMemRelease"](h)
            dt = clock() - t
            drv.check("cuMemRelease", r)
            samples["release"].append(dt)
            s.handles.remove(h)
        t = clock()
        r = f["cuMemAddressFree"](base, length)
        dt = clock() - t
        drv.check("cuMemAddressFree", r)
        samples["address_free"].append(dt)
        s.ranges.remove((base, length))
        done += 1
    return done


def run_figures(calls, pages):
    """What mapping and giving back a run of `pages` new pages costs, from
    the medians measured and at the published prices (cca_sim's charges)."""
    def med(c):
        return calls.get(c, {}).get("median_us")
    if None in (med("create"), med("map"), med("set_access_run"), med("unmap_page"), med("release")):
        return None
    p = PUBLISHED_US
    return {
        "pages": pages,
        "map_run_us": pages * (med("create") + med("map")) + med("set_access_run"),
        "map_run_published_us": pages * (p["create"] + p["map"]) + p["set_access_run"],
        "unmap_run_us": pages * (med("unmap_page") + med("release")),
        "unmap_run_one_call_us": (pages * med("release") + med("unmap_run"))
        if med("unmap_run") is not None else None,
        "unmap_run_published_us": pages * (p["unmap_page"] + p["release"]),
    }


def print_table(report):
    floor = report.get("ctypes_floor", {}).get("median_us")
    print()
    print(f"vmm_costs: per call, microseconds (ctypes floor {fmt_us(floor)} us a call "
          f"included); published: kvcached bench_vmm, 2 MiB pages (cca_sim.py VMM_*)")
    head = ("page MiB", "pages", "call", "n", "median", "p90", "first", "published", "x pub")
    rows = [head]
    for sz in report["sizes"]:
        if "calls" not in sz:
            continue
        for c in CALLS:
            st = sz["calls"][c]
            if not st.get("n"):
                continue
            pub = PUBLISHED_US[c]
            ratio = f"{st['median_us'] / pub:.2f}" if pub else "-"
            rows.append((f"{sz['page_bytes'] / MIB:g}", str(sz["pages"]), DRIVER_NAMES[c],
                         str(st["n"]), fmt_us(st["median_us"]), fmt_us(st["p90_us"]),
                         fmt_us(st["first_us"]), fmt_us(pub), ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(c.rjust(w) if i != 2 else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
    print()
    print("a run of N new pages mapped (N x (create + map) + set access over the run) "
          "and given back (N x (unmap + release)), ms:")
    head = ("page MiB", "N", "map measured", "map published", "back measured",
            "back, one unmap", "back published")
    rows = [head]
    for sz in report["sizes"]:
        rf = sz.get("run")
        if not rf:
            continue
        ms = lambda v: "-" if v is None else f"{v / 1e3:.2f}"
        rows.append((f"{sz['page_bytes'] / MIB:g}", str(rf["pages"]), ms(rf["map_run_us"]),
                     ms(rf["map_run_published_us"]), ms(rf["unmap_run_us"]),
                     ms(rf["unmap_run_one_call_us"]), ms(rf["unmap_run_published_us"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    for sz in report["sizes"]:
        if sz.get("status") != "ok":
            print(f"note ({sz['page_bytes'] / MIB:g} MiB): {sz.get('status')}")
        for n in sz.get("notes", []):
            print(f"note ({sz['page_bytes'] / MIB:g} MiB): {n}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None,
                    help="the JSON file (default $OUT/vmm_costs.json when $OUT is set)")
    ap.add_argument("--sizes-mib", default="2,4,8,20,64")
    ap.add_argument("--pages", type=int, default=256, help="pages per size, at most")
    ap.add_argument("--max-total-gib", type=float, default=8.0,
                    help="bytes of pages per size, at most")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reserves", type=int, default=16,
                    help="reservations timed alone per round")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    if args.out is None and os.environ.get("OUT"):
        args.out = os.path.join(os.environ["OUT"], "vmm_costs.json")
    start = time.monotonic()
    deadline = start + args.max_seconds

    report = {"script": "benches/gpu/vmm_costs.py", "published_us_2mib": PUBLISHED_US,
              "published_source": "kvcached benchmarks/bench_vmm (A100, one thread, 2 MiB "
                                  "pages), as ../shared/peers/cca_sim.py VMM_* charges",
              "args": vars(args), "sizes": []}

    def finish(skipped=None):
        if skipped:
            report["skipped"] = skipped
            print(f"vmm_costs: skipped: {skipped}", flush=True)
        report["wall_s"] = time.monotonic() - start
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as fh:
                json.dump(report, fh, indent=1)
            print(f"vmm_costs: figures written to {args.out}")
        return 0

    check_layouts()
    drv, why = load_driver()
    if drv is None:
        return finish(why)
    r = drv.f["cuInit"](0)
    if r != 0:
        return finish(f"cuInit failed: {drv.error_name(r)} (no usable CUDA device)")
    ver, count = ctypes.c_int(), ctypes.c_int()
    drv("cuDriverGetVersion", ctypes.byref(ver))
    drv("cuDeviceGetCount", ctypes.byref(count))
    report["driver_version"] = ver.value
    if count.value <= args.device:
        return finish(f"no CUDA device {args.device} ({count.value} device(s))")
    try:
        s = Session(drv, args.device)
    except CudaCallError as e:
        return finish(f"no context on device {args.device}: {e}")
    try:
        name = ctypes.create_string_buffer(256)
        drv("cuDeviceGetName", name, 256, s.dev)
        report["device"] = name.value.decode(errors="replace")
        vmm = ctypes.c_int()
        drv("cuDeviceGetAttribute", ctypes.byref(vmm),
            CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED, s.dev)
        if not vmm.value:
            return finish(f"device {args.device} ({report['device']}) has no virtual memory "
                          "management")
        minimum = s.granularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        recommended = s.granularity(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        free, total = s.mem_info()
        report.update(minimum_granularity=minimum, recommended_granularity=recommended,
                      free_bytes=free, total_bytes=total)
        report["ctypes_floor"] = ctypes_floor(drv)
        print(f"vmm_costs: {report['device']}, driver {ver.value // 1000}.{ver.value % 1000 // 10}, "
              f"granularity {minimum / MIB:g} MiB (recommended {recommended / MIB:g} MiB), "
              f"{free / GIB:.1f} of {total / GIB:.1f} GiB free, ctypes floor "
              f"{report['ctypes_floor']['median_us']:.2f} us", flush=True)
        for mib in (float(x) for x in args.sizes_mib.split(",") if x.strip()):
            page = int(mib * MIB)
            entry = {"page_bytes": page}
            report["sizes"].append(entry)
            if page <= 0 or page % minimum:
                entry["status"] = f"skipped: not a multiple of the granularity ({minimum} B)"
                continue
            if time.monotonic() > deadline:
                entry["status"] = f"skipped: past --max-seconds {args.max_seconds:g}"
                print(f"== {mib:g} MiB: skipped (time limit)", flush=True)
                continue
            free, _ = s.mem_info()
            pages = min(args.pages, int(args.max_total_gib * GIB) // page, int(free * 0.8) // page)
            entry["pages"] = pages
            if pages < 1:
                entry["status"] = f"skipped: {free / GIB:.2f} GiB free"
                continue
            align = page if page & (page - 1) == 0 else minimum
            t0 = time.monotonic()
            samples, notes, done = {c: [] for c in CALLS}, [], 0
            try:
                done = measure_size(s, page, pages, align, max(1, args.rounds),
                                    max(0, args.reserves), deadline, samples, notes)
                entry["status"] = "ok"
            except CudaCallError as e:
                # The samples before the failure are kept.
                entry["status"] = f"error: {e}"
                entry["error"] = {"call": e.call, "code": e.code, "name": e.name}
                print(f"vmm_costs: ERROR at {mib:g} MiB: {e}", flush=True)
            notes.extend(s.cleanup())
            entry["rounds"] = done
            entry["notes"] = notes
            entry["seconds"] = time.monotonic() - t0
            if any(samples.values()):
                entry["calls"] = {c: summary(samples[c]) for c in CALLS}
                run = run_figures(entry["calls"], pages)
                if run:
                    entry["run"] = run
            print(f"== {mib:g} MiB x {pages}: {entry['status']}, {done} round(s), "
                  f"{entry['seconds']:.1f} s", flush=True)
        print_table(report)
        return finish()
    finally:
        s.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        print("vmm_costs: stopped by the error above", flush=True)
        sys.exit(0)
