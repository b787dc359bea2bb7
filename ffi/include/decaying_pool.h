/*
 * decaying_pool.h: the decaying pool (a caching allocator whose idle blocks
 * decay back) as a C library, libdecaying_pool.so.
 *
 * Build: cargo build --release -p decaying-pool-ffi
 *        -> target/release/libdecaying_pool.so
 *
 * The entry points are PyTorch's pluggable-allocator functions
 * (torch.cuda.memory.CUDAPluggableAllocator: dp_malloc, dp_free and the
 * hooks dp_init, dp_empty_cache, dp_set_memory_fraction, dp_record_stream)
 * and CuPy's CFunctionAllocator functions (dp_cupy_malloc, dp_cupy_free),
 * with pinned host memory for CuPy's pinned allocator (dp_pinned_malloc,
 * dp_pinned_free).
 *
 * POOLS. One pool per (device, stream), made on the first request of that
 * pair: a block allocated for a stream is reused for that stream only, as
 * PyTorch's own blocks belong to their stream. Streams are opaque handles
 * to the library (the pool key); on the CUDA backend they are CUstream /
 * cudaStream_t values of the device's primary context, NULL being the
 * legacy default stream.
 *
 * THREADS. Every function may be called from any thread at any time,
 * concurrently, a thread-local (C++ thread_local) or pthread-key
 * destructor included: a block held by one may be freed there, after the
 * library's own per-thread message slot is gone (a message is then lost,
 * the call still does its work). No lock of the library is held across a backing call
 * (cuMemAlloc / cuMemFree, or the host allocator): a hit on one thread
 * never waits for another thread's miss in the library's own locks.
 *
 * ERRORS. A failed call returns NULL (allocations), -1 (dp_configure) or 0
 * (dp_stats_json) and leaves a message for dp_last_error() on the calling
 * thread, prefixed by the name of the function called ("dp_cupy_malloc: "
 * for CuPy's). A request refused for lack of memory (the device's limit,
 * the device or the host) says "out of memory", the device's limit and
 * the bytes its pools reserve; the void functions only leave the message. Misuse the caller
 * cannot see (a free of a pointer never handed out, a double free, a free
 * with the wrong size) also goes to standard error (the first 32 messages
 * of the process). No call aborts the process: every entry point catches
 * panics, which become a message ("internal error: ...").
 *
 * CONFIGURATION. dp_configure(text), or the environment variable
 * DECAYING_POOL read at the first call of any function when dp_configure
 * was not called first. The text is key=value pairs separated by commas
 * (spaces around them are ignored); unknown keys and bad values are
 * refused with a message naming the key. Keys:
 *
 *   backend=cuda|host   cuda (default): device memory, cuMemAlloc on the
 *                       device's primary context (libcuda is loaded at run
 *                       time; without a driver every allocation fails with
 *                       a message). host: system memory (512-byte aligned),
 *                       for machines without a GPU and for tests.
 *   policy=P            the eviction policy, as the command-line tool and
 *                       the replay name them: ttl:TIME (fixed time-to-live,
 *                       alias fixed-time:TIME; default ttl:1s),
 *                       half-life:TIME (exponential decay, alias
 *                       exponential:TIME), slots:N (a fixed table of N
 *                       slots, alias fixed-capacity:N), keep-all, no-pool.
 *                       TIME is a number and a unit (ns, us, ms, s, m), or a
 *                       bare number of milliseconds.
 *   packing=on|off|PAIRS  small and medium requests carved from segments
 *                       (on, the default: the recommended Packing::default())
 *                       or exact blocks (off). PAIRS are the command-line
 *                       tool's --packing keys, KEY:VALUE separated by ';'
 *                       over the defaults: packing=medium:128MiB;growth:2.
 *                       Each may also be given as its own key:
 *                       packing.medium=128MiB. Size keys (small, medium,
 *                       small_segment, medium_segment, max_segment,
 *                       large_rounding, capacity, granularity and their long
 *                       names small_threshold, medium_threshold) take a unit
 *                       (B, KiB, MiB, GiB, TiB; K, M, G, T); the others
 *                       (growth, multiple, cap, slack, large_fit) are whole
 *                       numbers. The granularity is a power of two of at
 *                       least 256B: every pointer the library hands out is
 *                       aligned to 256 bytes, as cudaMalloc's are. A key
 *                       given twice is refused.
 *   limit=SIZE|none     bytes each device's pools may reserve together
 *                       (a size with a unit, e.g. 8GiB; default none).
 *   reaper=TIME|off     the period of each pool's reaper thread, which
 *                       frees decayed blocks while the caller is idle
 *                       (default 100ms; off or 0: decay only on calls).
 *   gc_threshold=F|none PyTorch's garbage_collection_threshold, F in (0, 1]:
 *                       a miss that would bring a pool's reserved bytes past
 *                       F of the device's limit (or its memory, without a
 *                       limit) first frees idle blocks, oldest first.
 *   record=PATH         write every request (allocations and frees, by all
 *                       threads and pools) to PATH as a native trace, which
 *                       `cargo run --release -p decaying-pool-cli -- replay
 *                       PATH` replays against other configurations. Flushed
 *                       by dp_empty_cache and at process exit.
 *
 *   Example: DECAYING_POOL="policy=half-life:200ms,packing.medium=64MiB,
 *            gc_threshold=0.8,record=/tmp/model.trace"
 *
 * The default (no text): backend=cuda,policy=ttl:1s,packing=on,limit=none,
 * reaper=100ms.
 */
#ifndef DECAYING_POOL_H
#define DECAYING_POOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Allocates `size` bytes on `device` for `stream` (PyTorch's alloc,
 * void*(size_t, int, cudaStream_t)). The block belongs to the pool of
 * (device, stream); free it with dp_free (or dp_cupy_free), once.
 *
 * size 0 returns NULL and sets no message (PyTorch's own allocator gives
 * no memory to an empty tensor). A failure (out of memory, the device's
 * limit, a device outside dp_init's count, no CUDA on the cuda backend)
 * returns NULL and sets dp_last_error(). Before failing for lack of memory,
 * the device's other stream pools give back their idle blocks and the
 * request is tried once more.
 */
void *dp_malloc(size_t size, int device, void *stream);

/*
 * Gives `ptr` back (PyTorch's free, void(void*, size_t, int, cudaStream_t)).
 * `size` should be the size `ptr` was allocated with: a different size is
 * reported (message, standard error) and the allocated size is released.
 * `device` and `stream` are ignored: the library knows the pool of each
 * pointer it handed out.
 *
 * NULL does nothing. A pointer the library never handed out, or one freed
 * already, is reported (message, standard error) and otherwise ignored.
 *
 * A block marked by dp_record_stream is, on the cuda backend, held back
 * until events recorded on those streams now have completed (checked on
 * later calls of its pool, waited for by dp_empty_cache); on the host
 * backend it is released at once.
 */
void dp_free(void *ptr, size_t size, int device, void *stream);

/*
 * Records the number of devices (PyTorch's init hook, void(int)); a later
 * request on a device at or above it fails with a message. Reads the
 * configuration ($DECAYING_POOL) if that was not done yet. A negative count
 * sets a message and changes nothing.
 */
void dp_init(int device_count);

/*
 * Releases the held-back blocks of every pool (waiting for their streams'
 * events), then frees every idle block of every pool (PyTorch's reset hook,
 * what torch.cuda.empty_cache() calls). Blocks in use stay. Flushes the
 * record= trace.
 */
void dp_empty_cache(void);

/*
 * Limits `device` to `fraction` of its memory (PyTorch's memory-fraction
 * hook, void(double, int)): CUDA's total memory, or on the host backend the
 * machine's memory as Linux bounds it. The limit is per device: it counts
 * the bytes all the device's stream pools reserve together (blocks in use,
 * idle blocks and segments), checked on each miss. Lowering it below what
 * is reserved frees the device's idle blocks. A fraction not in (0, 1]
 * sets a message and changes nothing. It replaces the limit= of the
 * configuration for that device.
 */
void dp_set_memory_fraction(double fraction, int device);

/*
 * Marks `ptr` as used on `stream` too (PyTorch's record_stream hook,
 * void(void*, cudaStream_t)). On the cuda backend, dp_free then records an
 * event on each marked stream and the block is reused only after they have
 * completed; `stream` must be a live stream of the block's device until
 * the block is freed. On the host backend streams are opaque handles and
 * the mark changes nothing. Marking the block's own stream does nothing; a
 * pointer not handed out sets a message.
 */
void dp_record_stream(void *ptr, void *stream);

/*
 * CuPy's CFunctionAllocator malloc (void*(void*, size_t, int)):
 * dp_malloc(size, device, NULL), the pool of the legacy default stream.
 * `param` is ignored (pass anything, e.g. 0). CuPy work on other streams
 * must be ordered by the caller before a freed block is reused.
 */
void *dp_cupy_malloc(void *param, size_t size, int device);

/*
 * CuPy's CFunctionAllocator free (void(void*, void*, int)): frees `ptr`
 * with the size it was allocated with, as dp_free. `param` and `device` are
 * ignored.
 */
void dp_cupy_free(void *param, void *ptr, int device);

/*
 * Allocates `size` bytes of pinned (page-locked) host memory, for host to
 * device copies that overlap with kernels (what CuPy's pinned memory
 * allocator hands out): cuMemHostAlloc behind a pool of its own on the
 * CUDA backend, system memory on the host backend. The pool has no limit
 * (limit= and memory fractions bound the devices); its figures are
 * dp_stats_json(-1, ...). size 0 returns NULL and sets no message; a
 * failure returns NULL and sets dp_last_error(). Free with dp_pinned_free,
 * once, after the copies that use the memory are done.
 */
void *dp_pinned_malloc(size_t size);

/*
 * Gives pinned host memory from dp_pinned_malloc back (its size from the
 * library's record). NULL does nothing; a pointer not handed out, or freed
 * twice, is reported and ignored.
 */
void dp_pinned_free(void *ptr);

/*
 * Configures the library from `config` (key=value,...; see the top of this
 * file). Returns 0, or -1 with a message naming the key. `config` is a
 * NUL-terminated UTF-8 string owned by the caller (not kept).
 *
 * May be called again: while any block is allocated (or held back for its
 * streams) it is refused (-1, configuration unchanged); otherwise the old
 * pools give their idle memory back and the new configuration starts with
 * no pools (dp_set_memory_fraction limits are forgotten; dp_init's count
 * stays). A dp_malloc running on another thread meanwhile may still return
 * a block of the old configuration: it stays valid, dp_free and
 * dp_record_stream take it as any other, and its memory goes back once it
 * is freed (the old configuration's figures no longer appear in
 * dp_stats_json). Best called before other threads use the library.
 */
int dp_configure(const char *config);

/*
 * Writes the figures of `device` as a JSON object into `buf` and returns
 * the bytes it needs, including the terminating NUL. When `len` is at least
 * that, `buf` holds the NUL-terminated JSON; when it is less (but not 0), buf
 * holds the empty string "". `buf` NULL or `len` 0: nothing is written,
 * only the size returned. 0 on error (a bad device; message set). Device
 * -1 is the pinned host pool of dp_pinned_malloc.
 *
 * The object (sizes in bytes; a device no pool has used reports zeros):
 *   device, backend ("cuda"|"host"), policy (the replay's label, e.g.
 *   "fixed-time 1s"), packing_enabled, gc_threshold (number or null),
 *   capacity (number or null: unknown before the device's first use),
 *   limit (number or null), reserved (the device's pools together, as the
 *   limit counts them), pools (stream pools of the device),
 *   library_live_pointers (pointers handed out and not freed, all devices),
 *   pending_blocks (held back for recorded streams),
 *   stats: the pool's Stats fields summed over the device's pools (hits,
 *     misses, evictions, trimmed, backing_allocs, backing_deallocs,
 *     backing_failures, blocks_in_use, blocks_cached, bytes_in_use,
 *     bytes_cached, bytes_reserved, peak_bytes_reserved, peak_bytes_in_use,
 *     bytes_from_pool, bytes_from_backing, bytes_requested, and any field
 *     Stats gains; the peaks are sums of the pools' peaks),
 *   packing: the PackingStats fields summed (requests, carved, exact,
 *     exact_fallbacks, segments_created, segments_released, segments,
 *     segment_bytes, peak_segment_bytes, packed_blocks, packed_bytes,
 *     free_segment_bytes, bytes_requested, peak_bytes_requested,
 *     larger_reuses, oversize_bytes), or null with packing=off,
 *   streams: an array, one object per pool of the device, by stream:
 *     { stream (the handle as an integer), pending_blocks, stats, packing }.
 * With packing on, the Stats count the callers' requests, as for a plain
 * pool (hits + misses is the number of successful requests; bytes_in_use
 * the blocks handed out, bytes_cached what is idle: cached blocks and the
 * free space inside segments); the segments are in packing.
 */
size_t dp_stats_json(int device, char *buf, size_t len);

/*
 * The message of the last call on this thread, if it failed; NULL when it
 * succeeded. Every other function clears it when it starts. The string is
 * owned by the library and valid until the next call into the library on
 * this thread; copy it to keep it.
 */
const char *dp_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* DECAYING_POOL_H */
