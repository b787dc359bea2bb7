//! The library's state: the configuration, the devices, one pool per
//! (device, stream), the registry of live pointers and the request log.
//!
//! Locks, and what they cover (none is held across a backing call):
//! - [`LIBRARY`]: the current [`Library`], cloned out under a read lock;
//! - [`Library::devices`]: opening a device (once per device);
//! - [`Library::pools`]: the pool map, read-locked for a lookup, write-locked
//!   to insert a pool built outside it;
//! - each registry shard: one map operation;
//! - each pool's pending list: pushing, or taking out the completed blocks
//!   (released after the lock is let go).

use core::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use dp::policy::AnyPolicy;
use dp::trace::RequestLog;
use dp::{DecayingPool, PoolError, Pooled, Reaper, SharedPool};

use crate::backend::{Backend, BackendError, Device, PINNED};
use crate::config::Config;
use crate::events::StreamEvent;

/// Every pool's type: packed or plain, host or CUDA.
pub(crate) type Pool = SharedPool<Backend, AnyPolicy>;

/// The current library state (`None` until the first call).
pub(crate) static LIBRARY: RwLock<Option<Arc<Library>>> = RwLock::new(None);

/// The device count of `dp_init` (-1: not called).
pub(crate) static DEVICE_COUNT: AtomicI64 = AtomicI64::new(-1);

/// Locks `m`, recovering it from a panic elsewhere (the data under every
/// lock here stays consistent: each critical section is one operation).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A block freed while recorded streams may still use it.
struct Pending {
    block: usize,
    size: usize,
    events: Vec<StreamEvent>,
}

/// The pool of one (device, stream).
pub(crate) struct StreamPool {
    /// The device.
    pub(crate) device: Arc<Device>,
    /// The stream handle (0: the legacy default stream).
    pub(crate) stream: usize,
    /// The pool.
    pub(crate) pool: Pool,
    /// Blocks held back until their events complete.
    pending: Mutex<Vec<Pending>>,
    /// `pending.len()`, read without the lock.
    pending_count: AtomicUsize,
    /// The reaper thread (stopped on drop).
    _reaper: Option<Reaper>,
}

impl StreamPool {
    /// Gives `block` (from this pool's `into_raw` with `size`) back.
    ///
    /// # Safety
    ///
    /// `block` and `size` came from `self.pool.allocate(size)?.into_raw()`,
    /// and are given back once, the block not used after.
    pub(crate) unsafe fn release(&self, block: usize, size: usize) {
        // SAFETY: the caller's contract is `from_raw`'s.
        drop(unsafe { Pooled::from_raw(&self.pool, block, size) });
    }

    /// Holds `block` back until events recorded now on `streams` complete
    /// (CUDA); releases it at once when an event cannot be recorded after
    /// synchronising the device, or on the host backend.
    ///
    /// # Safety
    ///
    /// As [`release`](Self::release); every stream in `streams` is null or
    /// a live stream of the device's context.
    pub(crate) unsafe fn release_after(&self, block: usize, size: usize, streams: &[usize]) {
        let Some(cuda) = self.device.cuda.as_ref() else {
            // SAFETY: the caller's contract.
            return unsafe { self.release(block, size) };
        };
        let mut events = Vec::with_capacity(streams.len());
        for &s in streams {
            // SAFETY: `s` is null or a live stream of the device's context
            // (the caller's contract).
            match unsafe { StreamEvent::record(cuda, s) } {
                Ok(e) => events.push(e),
                Err(e) => {
                    crate::report(&format!(
                        "dp_free: cannot record an event on stream {s:#x} ({e}); \
                         synchronising device {} before reusing the block",
                        self.device.index
                    ));
                    let _ = cuda.context().synchronize();
                    // SAFETY: the caller's contract; the device is idle.
                    return unsafe { self.release(block, size) };
                }
            }
        }
        let mut pending = lock(&self.pending);
        pending.push(Pending {
            block,
            size,
            events,
        });
        // Under the lock, so that the count follows the list.
        self.pending_count.store(pending.len(), Ordering::Release);
    }

    /// Blocks held back now.
    pub(crate) fn pending(&self) -> usize {
        self.pending_count.load(Ordering::Acquire)
    }

    /// Releases the held-back blocks whose events have completed; returns
    /// how many. With `wait`, takes them all out and waits for their
    /// events outside the lock; without, never waits for the lock either
    /// (another thread polling now does the work).
    pub(crate) fn poll_pending(&self, wait: bool) -> usize {
        if self.pending() == 0 {
            return 0;
        }
        let done: Vec<Pending> = if wait {
            let mut pending = lock(&self.pending);
            self.pending_count.store(0, Ordering::Release);
            core::mem::take(&mut *pending)
        } else {
            let mut pending = match self.pending.try_lock() {
                Ok(p) => p,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return 0,
            };
            let mut done = Vec::new();
            let mut i = 0;
            while i < pending.len() {
                // `cuEventQuery` does not block.
                if pending[i].events.iter().all(StreamEvent::is_complete) {
                    done.push(pending.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            self.pending_count.store(pending.len(), Ordering::Release);
            done
        };
        let n = done.len();
        for p in done {
            if wait {
                p.events.iter().for_each(StreamEvent::wait);
            }
            drop(p.events);
            // SAFETY: `p.block` and `p.size` came from this pool's
            // `into_raw` (`release_after`'s contract), and leave the pending
            // list here, once.
            unsafe { self.release(p.block, p.size) };
        }
        n
    }
}

/// A live pointer.
pub(crate) struct Entry {
    /// The pool it came from.
    pub(crate) pool: Arc<StreamPool>,
    /// The size it was requested with.
    pub(crate) size: usize,
    /// Other streams that used it (`dp_record_stream`).
    pub(crate) streams: Vec<usize>,
}

/// The number of registry shards.
const SHARDS: usize = 64;

/// Live pointers by address, in shards locked one map operation at a time.
pub(crate) struct Registry {
    shards: Box<[Mutex<HashMap<usize, Entry>>]>,
    live: AtomicUsize,
}

impl Registry {
    fn new() -> Self {
        Registry {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            live: AtomicUsize::new(0),
        }
    }

    fn shard(&self, addr: usize) -> &Mutex<HashMap<usize, Entry>> {
        // Blocks are at least 512-byte multiples apart on the host; mix the
        // address so neighbours spread over the shards.
        let h = (addr as u64 >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 58) as usize % SHARDS]
    }

    /// Records a pointer handed out; the entry it replaced, if any (a bug).
    pub(crate) fn insert(&self, addr: usize, entry: Entry) -> Option<Entry> {
        let old = lock(self.shard(addr)).insert(addr, entry);
        if old.is_none() {
            self.live.fetch_add(1, Ordering::Relaxed);
        }
        old
    }

    /// Takes a pointer out (freed).
    pub(crate) fn remove(&self, addr: usize) -> Option<Entry> {
        let e = lock(self.shard(addr)).remove(&addr);
        if e.is_some() {
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
        e
    }

    /// Runs `f` on a live pointer's entry.
    pub(crate) fn with<R>(&self, addr: usize, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        lock(self.shard(addr)).get_mut(&addr).map(f)
    }

    /// Pointers handed out and not freed.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

/// One configuration's state.
pub(crate) struct Library {
    /// The configuration.
    pub(crate) config: Config,
    /// Devices opened, by number.
    devices: Mutex<HashMap<i32, Arc<Device>>>,
    /// Pools by (device, stream).
    pools: RwLock<HashMap<(i32, usize), Arc<StreamPool>>>,
    /// Live pointers.
    pub(crate) registry: Registry,
    /// The request log of `record=`.
    pub(crate) log: Option<RequestLog>,
}

impl Library {
    /// The state of `config` (creates the `record=` file).
    ///
    /// # Errors
    ///
    /// When the record file cannot be created.
    pub(crate) fn new(config: Config) -> Result<Self, String> {
        let log = match &config.record {
            Some(path) => Some(
                RequestLog::create(path)
                    .map_err(|e| format!("record: cannot create {}: {e}", path.display()))?,
            ),
            None => None,
        };
        Ok(Library {
            config,
            devices: Mutex::new(HashMap::new()),
            pools: RwLock::new(HashMap::new()),
            registry: Registry::new(),
            log,
        })
    }

    /// Checks a device number against `dp_init`'s count.
    pub(crate) fn check_device(device: i32) -> Result<(), String> {
        let count = DEVICE_COUNT.load(Ordering::Relaxed);
        if device < 0 {
            return Err(format!("device {device} is not a device number"));
        }
        if count >= 0 && i64::from(device) >= count {
            return Err(format!(
                "device {device} is outside the {count} devices of dp_init"
            ));
        }
        Ok(())
    }

    /// Device `index`, opened on first use.
    ///
    /// # Errors
    ///
    /// A bad device number, or the device cannot be opened.
    pub(crate) fn device(&self, index: i32) -> Result<Arc<Device>, String> {
        Self::check_device(index)?;
        self.open_device(index)
    }

    /// Device `index` (or the pinned host pool's, [`PINNED`]), opened on
    /// first use.
    fn open_device(&self, index: i32) -> Result<Arc<Device>, String> {
        let mut devices = lock(&self.devices);
        if let Some(d) = devices.get(&index) {
            return Ok(Arc::clone(d));
        }
        let d = if index == PINNED {
            Device::open_pinned(self.config.backend)?
        } else {
            Device::open(index, self.config.backend, self.config.limit)?
        };
        let d = Arc::new(d);
        devices.insert(index, Arc::clone(&d));
        Ok(d)
    }

    /// Device `index` if it is open.
    pub(crate) fn opened_device(&self, index: i32) -> Option<Arc<Device>> {
        lock(&self.devices).get(&index).cloned()
    }

    /// The pool of (`device`, `stream`), made on first use.
    ///
    /// # Errors
    ///
    /// As [`device`](Self::device).
    pub(crate) fn pool(&self, device: i32, stream: usize) -> Result<Arc<StreamPool>, String> {
        Self::check_device(device)?;
        self.pool_of(device, stream)
    }

    /// The pool of (`device`, `stream`), [`PINNED`] included, made on
    /// first use.
    fn pool_of(&self, device: i32, stream: usize) -> Result<Arc<StreamPool>, String> {
        let key = (device, stream);
        if let Some(p) = self
            .pools
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(Arc::clone(p));
        }
        let dev = self.open_device(device)?;
        let made = Arc::new(self.build_pool(dev, stream));
        let mut pools = self.pools.write().unwrap_or_else(PoisonError::into_inner);
        // Another thread may have made it meanwhile: keep the first (ours
        // is dropped, empty, after the lock is let go).
        let p = Arc::clone(pools.entry(key).or_insert(made));
        Ok(p)
    }

    /// A new pool for `device` and `stream`, under the configuration.
    fn build_pool(&self, device: Arc<Device>, stream: usize) -> StreamPool {
        let c = &self.config;
        let builder =
            DecayingPool::builder(Backend::new(Arc::clone(&device))).policy(c.policy.build());
        // PyTorch's `garbage_collection_threshold`: checked on each pool's
        // misses, against that pool's reserved bytes, as a fraction of the
        // device's limit (its backing capacity, `Backend::capacity`, is the
        // lower of the device's memory and the limit).
        let builder = match c.gc_threshold {
            Some(f) => builder.gc_threshold(f),
            None => builder,
        };
        let pool = match c.packing {
            Some(packing) => {
                let mut p = builder.packing(packing).build();
                if let Some(log) = &self.log {
                    p.log_requests(log.sink());
                }
                SharedPool::packed(p)
            }
            None => {
                let mut p = builder.build();
                if let Some(log) = &self.log {
                    p.log_requests(log.sink());
                }
                SharedPool::new(p)
            }
        };
        let reaper = c.reaper.map(|period| pool.spawn_reaper(period));
        StreamPool {
            device,
            stream,
            pool,
            pending: Mutex::new(Vec::new()),
            pending_count: AtomicUsize::new(0),
            _reaper: reaper,
        }
    }

    /// Every pool (of `device` only, when given), cloned out of the map.
    pub(crate) fn pools(&self, device: Option<i32>) -> Vec<Arc<StreamPool>> {
        let mut v: Vec<Arc<StreamPool>> = self
            .pools
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|((d, _), _)| device.is_none_or(|want| *d == want))
            .map(|(_, p)| Arc::clone(p))
            .collect();
        v.sort_by_key(|p| (p.device.index, p.stream));
        v
    }

    /// Blocks held back in every pool.
    pub(crate) fn pending(&self) -> usize {
        self.pools(None).iter().map(|p| p.pending()).sum()
    }

    /// Allocates `size` bytes from (`device`, `stream`)'s pool: on a
    /// failure, when the device's other pools hold cached or held-back
    /// blocks, they are released and trimmed and the request tried once
    /// more (PyTorch frees its whole cache before an out-of-memory error).
    ///
    /// # Errors
    ///
    /// The pool's error, as a message.
    pub(crate) fn allocate(
        &self,
        size: usize,
        device: i32,
        stream: usize,
    ) -> Result<usize, String> {
        let sp = self.pool(device, stream)?;
        self.allocate_from(sp, size, device, stream)
    }

    /// Allocates `size` bytes of pinned host memory (the pool of
    /// [`PINNED`]: page-locked on the CUDA backend, system memory on the
    /// host backend).
    ///
    /// # Errors
    ///
    /// As [`allocate`](Self::allocate).
    pub(crate) fn allocate_pinned(&self, size: usize) -> Result<usize, String> {
        let sp = self.pool_of(PINNED, 0)?;
        self.allocate_from(sp, size, PINNED, 0)
    }

    /// [`allocate`](Self::allocate) from the pool `sp` of (`device`,
    /// `stream`).
    fn allocate_from(
        &self,
        sp: Arc<StreamPool>,
        size: usize,
        device: i32,
        stream: usize,
    ) -> Result<usize, String> {
        sp.poll_pending(false);
        let first = match sp.pool.allocate(size) {
            Ok(p) => Ok(p),
            Err(e @ (PoolError::ZeroSize | PoolError::TooLarge { .. })) => Err(e),
            Err(e) => {
                let others: Vec<_> = self
                    .pools(Some(device))
                    .into_iter()
                    .filter(|p| !Arc::ptr_eq(p, &sp))
                    .collect();
                let mut freed = 0;
                for p in &others {
                    freed += p.poll_pending(true);
                    freed += p.pool.trim();
                }
                if freed > 0 {
                    sp.pool.allocate(size)
                } else {
                    Err(e)
                }
            }
        };
        let pooled = first.map_err(|e: PoolError<BackendError>| {
            let what = format!("{size} bytes on device {device}, stream {stream:#x}");
            // What the limit, the device or the host refused says "out of
            // memory", with the limit and the bytes reserved (what PyTorch's
            // users and its memory-fraction tests look for).
            let out_of_memory = match &e {
                PoolError::ZeroSize => false,
                PoolError::TooLarge { .. } | PoolError::LimitExceeded { .. } => true,
                PoolError::Backing(BackendError::Limit { .. } | BackendError::Host(_)) => true,
                PoolError::Backing(BackendError::Cuda(c)) => c.is_out_of_memory(),
                // A reason a later version of the crate adds.
                _ => false,
            };
            if out_of_memory {
                let limit = sp
                    .device
                    .limit()
                    .map_or_else(|| "no limit".to_owned(), |l| format!("limit {l} bytes"));
                format!(
                    "out of memory: {what} ({limit}, {} bytes reserved): {e}",
                    sp.device.reserved()
                )
            } else {
                format!("{what}: {e}")
            }
        })?;
        let (block, size) = pooled.into_raw();
        let entry = Entry {
            pool: sp,
            size,
            streams: Vec::new(),
        };
        if let Some(old) = self.registry.insert(block, entry) {
            // Never expected: the pool handed out a block still live.
            crate::report(&format!(
                "dp_malloc: address {block:#x} was handed out twice (pool bug); \
                 the earlier {} bytes are dropped from the registry",
                old.size
            ));
        }
        Ok(block)
    }

    /// Releases the held-back blocks (waiting for their events) and trims
    /// every pool; flushes the request log. Returns the bytes trimmed.
    pub(crate) fn empty_cache(&self) -> usize {
        let mut freed = 0;
        for p in self.pools(None) {
            p.poll_pending(true);
            freed += p.pool.trim();
        }
        if let Some(log) = &self.log
            && let Err(e) = log.finish()
        {
            crate::report(&format!("record: writing the trace failed: {e}"));
        }
        freed
    }
}
