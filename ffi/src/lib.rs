//! `libdecaying_pool.so`: the decaying pool behind a C ABI whose entry
//! points are PyTorch's pluggable-allocator functions
//! (`torch.cuda.memory.CUDAPluggableAllocator`) and CuPy's
//! `CFunctionAllocator` functions.
//!
//! The contract is the C header `ffi/include/decaying_pool.h`; `ffi/README.md`
//! tells how to build and configure the library. In short:
//!
//! - one pool per (device, stream), made on first use, packed by default
//!   (`Packing::default()`), each with a reaper thread;
//! - pointers go out through a registry, so a free of a pointer the library
//!   never handed out (or freed twice) is reported, never a crash;
//! - no lock of this library is held across a backing call;
//! - no panic crosses the C boundary: every entry point runs under
//!   `catch_unwind`, and a failure is NULL (or -1) plus a message for
//!   `dp_last_error`.

use core::ffi::{c_char, c_int, c_void};
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, PoisonError};

mod backend;
mod config;
mod events;
mod state;
mod stats;

#[cfg(test)]
mod tests;

use config::Config;
use state::{DEVICE_COUNT, LIBRARY, Library};

/// The environment variable read at the first call when `dp_configure`
/// was not called first.
const ENV: &str = "DECAYING_POOL";

/// How many messages go to standard error before they are only kept for
/// `dp_last_error`.
const STDERR_MESSAGES: usize = 32;

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Sets this thread's message. A call from a thread-local or pthread-key
/// destructor may come after this thread's slot is gone: the message is
/// then dropped (`try_with`), the call goes on.
fn set_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = Some(c));
}

/// Clears this thread's message (at the start of each call); nothing once
/// the slot is gone, as [`set_error`].
fn clear_error() {
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = None);
}

/// Sets the message and writes it to standard error (the first
/// [`STDERR_MESSAGES`] of the process): for what a caller that checks
/// nothing (PyTorch, on a free) should still see.
pub(crate) fn report(message: &str) {
    static PRINTED: AtomicUsize = AtomicUsize::new(0);
    set_error(message);
    match PRINTED.fetch_add(1, Ordering::Relaxed) {
        n if n < STDERR_MESSAGES => eprintln!("decaying_pool: {message}"),
        n if n == STDERR_MESSAGES => {
            eprintln!("decaying_pool: {message} (further messages only in dp_last_error)")
        }
        _ => {}
    }
}

/// Runs the body of entry point `name`: clears the message, and turns an
/// error or a panic into `fail` with a message. Everything that could
/// panic runs inside a `catch_unwind` (the message slot, the report to
/// standard error): no panic leaves an `extern "C"` function, from any
/// thread at any point of its life (a thread-local destructor included).
fn guard<R>(name: &str, fail: R, body: impl FnOnce() -> Result<R, String>) -> R {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        clear_error();
        body()
    }));
    let message = match outcome {
        Ok(Ok(r)) => return r,
        Ok(Err(message)) => Ok(message),
        Err(panic) => Err(panic),
    };
    let _ = catch_unwind(AssertUnwindSafe(|| match message {
        Ok(message) => set_error(&format!("{name}: {message}")),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            report(&format!("{name}: internal error: {what}"));
        }
    }));
    fail
}

/// The current state, made from `$DECAYING_POOL` (or the defaults) at the
/// first call.
fn library() -> Result<Arc<Library>, String> {
    if let Some(lib) = LIBRARY
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        return Ok(Arc::clone(lib));
    }
    let mut slot = LIBRARY.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(lib) = slot.as_ref() {
        return Ok(Arc::clone(lib));
    }
    let config = match std::env::var(ENV) {
        Ok(text) => Config::parse(&text).map_err(|e| format!("${ENV}: {e}"))?,
        Err(_) => Config::default(),
    };
    let lib = Arc::new(Library::new(config)?);
    register_exit_flush(&lib);
    *slot = Some(Arc::clone(&lib));
    Ok(lib)
}

/// The current state if there is one (no configuration read).
fn current() -> Option<Arc<Library>> {
    LIBRARY
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .map(Arc::clone)
}

/// The states that `dp_configure` replaced while a `dp_malloc` may still be
/// inside one of them: a `dp_malloc` that took the state before the
/// replacement registers its block there, after `dp_configure` found no
/// live block. Its `dp_free` (and `dp_record_stream`) finds it here, and
/// the block goes back to its own pool, which then gives its cache back.
/// A state leaves the list once nothing else holds it (no call in
/// flight), no block of it is live and none is held back.
static RETIRED: Mutex<Vec<Arc<Library>>> = Mutex::new(Vec::new());

/// Runs `f` on the current state, then on each retired one, until it finds
/// something (the registry entry of a pointer): what it found, and whether
/// in a retired state; `None` if no state handed the pointer out.
fn with_entry<R>(mut f: impl FnMut(&Library) -> Option<R>) -> Option<(R, bool)> {
    if let Some(found) = current().and_then(|lib| f(&lib)) {
        return Some((found, false));
    }
    let retired = state::lock(&RETIRED);
    retired
        .iter()
        .find_map(|lib| f(lib))
        .map(|found| (found, true))
}

/// Takes the states that left the list (see [`RETIRED`]) out of it, for
/// the caller to empty and drop once the lock is released.
fn prune_retired() -> Vec<Arc<Library>> {
    let mut retired = state::lock(&RETIRED);
    let (done, kept): (Vec<_>, Vec<_>) = retired.drain(..).partition(|lib| {
        Arc::strong_count(lib) == 1 && lib.registry.live() == 0 && lib.pending() == 0
    });
    *retired = kept;
    done
}

/// Flushes the `record=` trace at process exit (`atexit`), once registered.
fn register_exit_flush(lib: &Library) {
    static ONCE: Once = Once::new();
    if lib.log.is_none() {
        return;
    }
    extern "C" fn flush_at_exit() {
        let _ = catch_unwind(|| {
            if let Ok(slot) = LIBRARY.try_read()
                && let Some(lib) = slot.as_ref()
                && let Some(log) = &lib.log
            {
                let _ = log.finish();
            }
        });
    }
    ONCE.call_once(|| {
        // SAFETY: `flush_at_exit` is a plain `extern "C" fn()` that never
        // unwinds (its body is under `catch_unwind`) and stays loaded as
        // long as the process runs (the library is not unloaded by the
        // frameworks that load it).
        unsafe { libc::atexit(flush_at_exit) };
    });
}

/// A stream handle as the map key.
fn stream_key(stream: *mut c_void) -> usize {
    stream.addr()
}

/// The C pointer of a block address (a host pointer whose provenance was
/// exposed when it was allocated, or a CUDA device address).
fn block_ptr(addr: usize) -> *mut c_void {
    core::ptr::with_exposed_provenance_mut(addr)
}

/// Allocates `size` bytes on `device` for `stream` (PyTorch's pluggable
/// allocator `alloc`).
///
/// Size 0 returns NULL and sets no message (PyTorch's own allocator hands
/// out no memory for an empty tensor). A failure returns NULL and sets the
/// message of [`dp_last_error`].
#[unsafe(no_mangle)]
pub extern "C" fn dp_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    malloc("dp_malloc", size, device, stream)
}

/// The body of `dp_malloc` and `dp_cupy_malloc`, its messages under `name`.
fn malloc(name: &str, size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guard(name, core::ptr::null_mut(), || {
        if size == 0 {
            return Ok(core::ptr::null_mut());
        }
        let lib = library()?;
        lib.allocate(size, device, stream_key(stream))
            .map(block_ptr)
    })
}

/// The body of `dp_free` and `dp_cupy_free`: `size` is checked when given.
fn free(name: &str, ptr: *mut c_void, size: Option<usize>) {
    guard(name, (), || {
        if ptr.is_null() {
            return Ok(());
        }
        let addr = ptr.addr();
        let found = with_entry(|lib| lib.registry.remove(addr));
        let Some((entry, retired)) = found else {
            report(&format!(
                "{name}: {ptr:p} was not handed out by this library, or was freed \
                 already; ignored"
            ));
            return Ok(());
        };
        if let Some(size) = size
            && size != entry.size
        {
            report(&format!(
                "{name}: {ptr:p} was allocated with {} bytes, freed with {size}; \
                 releasing {} bytes",
                entry.size, entry.size
            ));
        }
        let sp = entry.pool;
        if entry.streams.is_empty() {
            // SAFETY: the registry held (addr, size) from this pool's
            // `into_raw` and gave it up here, once.
            unsafe { sp.release(addr, entry.size) };
        } else {
            // SAFETY: as above; the recorded streams were handed to
            // `dp_record_stream` as live streams of the block's device (its
            // contract, in the header).
            unsafe { sp.release_after(addr, entry.size, &entry.streams) };
        }
        sp.poll_pending(false);
        if retired {
            // A block of a replaced state: its cache goes back too, and the
            // state, if this was its last block.
            sp.pool.trim();
            for lib in prune_retired() {
                lib.empty_cache();
            }
        }
        Ok(())
    })
}

/// Frees `ptr` (PyTorch's pluggable allocator `free`): `size` should be the
/// size it was allocated with (checked; the registry's size is what goes
/// back), `device` and `stream` are ignored (the registry knows the pool).
///
/// NULL does nothing; a pointer not handed out, or freed twice, is reported
/// (message and standard error) and ignored.
#[unsafe(no_mangle)]
pub extern "C" fn dp_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) {
    let _ = (device, stream);
    free("dp_free", ptr, Some(size));
}

/// Records the number of devices (PyTorch's `init` hook): a later call on a
/// device at or above it fails. Reads the configuration if not done yet.
#[unsafe(no_mangle)]
pub extern "C" fn dp_init(device_count: c_int) {
    guard("dp_init", (), || {
        if device_count < 0 {
            return Err(format!("{device_count} is not a device count"));
        }
        DEVICE_COUNT.store(i64::from(device_count), Ordering::Relaxed);
        library().map(drop)
    });
}

/// Releases the held-back blocks (waiting for their streams' events) and
/// trims every pool (PyTorch's `reset` hook, what `empty_cache` calls);
/// flushes the `record=` trace.
#[unsafe(no_mangle)]
pub extern "C" fn dp_empty_cache() {
    guard("dp_empty_cache", (), || {
        if let Some(lib) = current() {
            lib.empty_cache();
        }
        Ok(())
    });
}

/// Limits `device` to `fraction` (in (0, 1]) of its capacity, across its
/// stream pools. A bad fraction sets a message and changes nothing.
#[unsafe(no_mangle)]
pub extern "C" fn dp_set_memory_fraction(fraction: f64, device: c_int) {
    guard("dp_set_memory_fraction", (), || {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(format!("{fraction} is not a fraction in (0, 1]"));
        }
        let lib = library()?;
        let dev = lib.device(device)?;
        let Some(capacity) = dev.capacity() else {
            return Err(format!("device {device}: its capacity is unknown"));
        };
        let limit = if fraction >= 1.0 {
            capacity
        } else {
            (capacity as f64 * fraction) as usize
        };
        dev.set_limit(Some(limit));
        if dev.reserved() > limit {
            for p in lib.pools(Some(device)) {
                p.poll_pending(false);
                p.pool.trim();
            }
        }
        Ok(())
    });
}

/// Marks `ptr` as used on `stream` too (PyTorch's `record_stream` hook): on
/// the CUDA backend its free records an event on `stream` and the block is
/// reused only after the event completes.
#[unsafe(no_mangle)]
pub extern "C" fn dp_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    guard("dp_record_stream", (), || {
        let stream = stream_key(stream);
        let found = with_entry(|lib| {
            lib.registry.with(ptr.addr(), |e| {
                if e.pool.stream != stream && !e.streams.contains(&stream) {
                    e.streams.push(stream);
                }
            })
        });
        match found {
            Some(((), _)) => Ok(()),
            None => Err(format!("{ptr:p} was not handed out by this library")),
        }
    });
}

/// CuPy's `CFunctionAllocator` malloc: `dp_malloc(size, device, NULL)`
/// (the legacy default stream's pool); `param` is ignored.
#[unsafe(no_mangle)]
pub extern "C" fn dp_cupy_malloc(param: *mut c_void, size: usize, device: c_int) -> *mut c_void {
    let _ = param;
    malloc("dp_cupy_malloc", size, device, core::ptr::null_mut())
}

/// CuPy's `CFunctionAllocator` free: frees `ptr` (its size from the
/// registry); `param` and `device` are ignored.
#[unsafe(no_mangle)]
pub extern "C" fn dp_cupy_free(param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let _ = (param, device);
    free("dp_cupy_free", ptr, None);
}

/// Allocates `size` bytes of pinned (page-locked) host memory, for
/// transfers that overlap with kernels (CuPy's pinned memory allocator):
/// `cuMemHostAlloc` behind a pool of its own on the CUDA backend, system
/// memory on the host backend. Size 0 returns NULL and sets no message; a
/// failure returns NULL and sets the message of [`dp_last_error`]. Its
/// figures are `dp_stats_json(-1, ...)`.
#[unsafe(no_mangle)]
pub extern "C" fn dp_pinned_malloc(size: usize) -> *mut c_void {
    guard("dp_pinned_malloc", core::ptr::null_mut(), || {
        if size == 0 {
            return Ok(core::ptr::null_mut());
        }
        library()?.allocate_pinned(size).map(block_ptr)
    })
}

/// Frees pinned host memory from [`dp_pinned_malloc`] (its size from the
/// registry). NULL does nothing; a pointer not handed out, or freed twice,
/// is reported and ignored.
#[unsafe(no_mangle)]
pub extern "C" fn dp_pinned_free(ptr: *mut c_void) {
    free("dp_pinned_free", ptr, None);
}

/// Configures the library from `key=value,...` (see the header): 0, or -1
/// and a message naming the key. Refused (-1) while blocks are allocated or
/// held back; otherwise the pools are trimmed and replaced.
///
/// # Safety
///
/// `config` is NULL or points to a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dp_configure(config: *const c_char) -> c_int {
    guard("dp_configure", -1, || {
        if config.is_null() {
            return Err("the configuration is NULL".into());
        }
        // SAFETY: `config` is not null and points to a NUL-terminated
        // string (the caller's contract).
        let text = unsafe { CStr::from_ptr(config) }
            .to_str()
            .map_err(|_| "the configuration is not UTF-8".to_string())?;
        configure(text).map(|()| 0)
    })
}

/// The body of `dp_configure`.
fn configure(text: &str) -> Result<(), String> {
    let config = Config::parse(text)?;
    let old = {
        let mut slot = LIBRARY.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = slot.as_ref() {
            let (live, pending) = (old.registry.live(), old.pending());
            if live + pending > 0 {
                return Err(format!(
                    "{live} blocks are allocated and {pending} held back: free them \
                     first (configuration unchanged)"
                ));
            }
        }
        let lib = Arc::new(Library::new(config)?);
        register_exit_flush(&lib);
        let old = slot.replace(lib);
        // The old state stays findable while a `dp_malloc` may still be
        // inside it: retired before the lock is released, so that a
        // `dp_free` that no longer finds it current finds it there.
        if let Some(old) = &old {
            state::lock(&RETIRED).push(Arc::clone(old));
        }
        old
    };
    // The old pools give their memory back outside the lock.
    if let Some(old) = old {
        old.empty_cache();
    }
    for lib in prune_retired() {
        lib.empty_cache();
    }
    Ok(())
}

/// Writes the statistics of `device` as JSON into `buf` (see the header
/// for the shape); returns the bytes needed including the NUL, 0 on error.
///
/// # Safety
///
/// `buf` is NULL or points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dp_stats_json(device: c_int, buf: *mut c_char, len: usize) -> usize {
    guard("dp_stats_json", 0, || {
        let lib = library()?;
        if device != backend::PINNED {
            Library::check_device(device)?;
        }
        let json = stats::device_json(&lib, device);
        let needed = json.len() + 1;
        if buf.is_null() || len == 0 {
            return Ok(needed);
        }
        if len >= needed {
            // SAFETY: `buf` has `len >= needed` writable bytes (the
            // caller's contract); `json` is a distinct Rust allocation.
            unsafe {
                core::ptr::copy_nonoverlapping(json.as_ptr().cast::<c_char>(), buf, json.len());
                buf.add(json.len()).write(0);
            }
        } else {
            // SAFETY: `len >= 1` writable bytes: an empty string.
            unsafe { buf.write(0) };
        }
        Ok(needed)
    })
}

/// The message of this thread's last failed call, or NULL when the last
/// call succeeded; valid until the next call into the library on this
/// thread.
#[unsafe(no_mangle)]
pub extern "C" fn dp_last_error() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|e| {
                e.borrow()
                    .as_ref()
                    .map_or(core::ptr::null(), |c| c.as_ptr())
            })
            .unwrap_or(core::ptr::null())
    })
    .unwrap_or(core::ptr::null())
}
