//! The process-wide memory barrier behind the thread caches' lock-free
//! owner path ([`super::thread_cache`]) and the cache lock's bias
//! ([`super::lock`]).
//!
//! [`heavy`] makes every thread of this process that is running at the
//! time execute a full memory barrier (and a thread that is not running
//! executes one before it runs again): Linux `membarrier` with
//! `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, which the process registers for once
//! ([`available`]). In exchange, the threads whose accesses it orders need
//! only a compiler fence on their side, not a fence instruction nor an
//! atomic read-modify-write.
//!
//! It is available only on Linux, and never under Miri (which cannot run
//! the system call) nor in a build with `--cfg decaying_pool_locked_magazines`
//! (which the ThreadSanitizer run of `.ci/verify` sets: the sanitizer does
//! not know that the system call orders memory, so it would report the
//! owner path's accesses as races). Where it is not available, the thread
//! caches take a lock on every access instead, and the cache lock is never
//! biased.

/// Whether [`heavy`] can be used in this process; registers the process
/// for it on the first call. The answer never changes afterwards.
pub(super) fn available() -> bool {
    #[cfg(all(target_os = "linux", not(miri), not(decaying_pool_locked_magazines)))]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(linux::register)
    }
    #[cfg(not(all(target_os = "linux", not(miri), not(decaying_pool_locked_magazines))))]
    {
        false
    }
}

/// A full memory barrier on every running thread of this process, and on
/// every other one before it next runs.
///
/// # Panics
///
/// When called without [`available`] having returned `true` (a bug in this
/// crate), or when the system call fails although the process registered
/// for it (which the kernel documents as impossible).
pub(super) fn heavy() {
    #[cfg(all(target_os = "linux", not(miri), not(decaying_pool_locked_magazines)))]
    linux::barrier();
    #[cfg(not(all(target_os = "linux", not(miri), not(decaying_pool_locked_magazines))))]
    unreachable!("the thread caches' barrier is not available here");
}

#[cfg(all(target_os = "linux", not(miri), not(decaying_pool_locked_magazines)))]
mod linux {
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED` (linux/membarrier.h).
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    /// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
    const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    fn membarrier(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: `membarrier(cmd, flags = 0)` reads and writes no memory
        // of this process; an unknown command or an old kernel makes it
        // fail with an error code, which the callers check.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long) }
    }

    /// Registers the process for the expedited private barrier; `false`
    /// when the kernel (or a seccomp filter) refuses.
    pub(super) fn register() -> bool {
        membarrier(REGISTER_PRIVATE_EXPEDITED) == 0
    }

    pub(super) fn barrier() {
        let r = membarrier(PRIVATE_EXPEDITED);
        assert_eq!(
            r,
            0,
            "membarrier failed after registration: {}",
            std::io::Error::last_os_error()
        );
    }
}
