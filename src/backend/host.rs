//! The host's memory, as a bound on what a host allocator can serve.

use std::sync::OnceLock;

/// The most bytes one host allocation could ever get, as far as the
/// system tells: the smallest of
///
/// - the commit ceiling: under Linux's default overcommit heuristic
///   (`vm.overcommit_memory = 0`) the kernel refuses any single private
///   writable mapping larger than physical RAM plus swap; under strict
///   accounting (`2`) nothing past `CommitLimit` is committed; under `1`
///   (always overcommit) there is no such ceiling;
/// - the process's address-space limit (`RLIMIT_AS`), when set;
/// - the user address space a mapping gets without an address hint:
///   47 bits on x86-64 (also with 5-level paging), 48 on AArch64;
/// - `isize::MAX`, which no Rust allocation and no mapping exceeds (the
///   only bound on other systems, and under Miri).
///
/// Read once per process, so that a pool's miss pays an atomic load for
/// it: swap added later is not seen.
pub(crate) fn capacity() -> usize {
    static CAPACITY: OnceLock<usize> = OnceLock::new();
    *CAPACITY.get_or_init(read)
}

#[cfg(all(target_os = "linux", not(miri)))]
fn read() -> usize {
    [commit_ceiling(), address_space_limit(), address_space()]
        .into_iter()
        .flatten()
        .fold(isize::MAX as usize, usize::min)
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn read() -> usize {
    isize::MAX as usize
}

/// RAM plus swap under the overcommit heuristic, `CommitLimit` under
/// strict accounting, nothing when the kernel always overcommits.
#[cfg(all(target_os = "linux", not(miri)))]
fn commit_ceiling() -> Option<usize> {
    let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").ok()?;
    match mode.trim() {
        "0" => {
            // SAFETY: `sysinfo` only writes the struct it is given, which
            // is plain integers (all-zero is a valid value).
            let mut info: libc::sysinfo = unsafe { core::mem::zeroed() };
            // SAFETY: `info` is a valid, writable `sysinfo` struct.
            if unsafe { libc::sysinfo(&mut info) } != 0 {
                return None;
            }
            let unit = u128::from(info.mem_unit.max(1));
            let total = (u128::from(info.totalram) + u128::from(info.totalswap)) * unit;
            Some(usize::try_from(total).unwrap_or(usize::MAX))
        }
        "2" => {
            let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
            let line = meminfo.lines().find(|l| l.starts_with("CommitLimit:"))?;
            let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024))
        }
        _ => None,
    }
}

/// `RLIMIT_AS`, when the process has one.
#[cfg(all(target_os = "linux", not(miri)))]
fn address_space_limit() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` only writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0 {
        return None;
    }
    (lim.rlim_cur != libc::RLIM_INFINITY)
        .then(|| usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX))
}

/// The user address space of a mapping made without an address hint.
#[cfg(all(target_os = "linux", not(miri)))]
fn address_space() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    return Some(1 << 47);
    #[cfg(target_arch = "aarch64")]
    return Some(1 << 48);
    #[allow(unreachable_code)]
    None
}

#[cfg(test)]
mod tests {
    /// A bound, when known, is at least the memory a test can allocate and
    /// at most the address space.
    #[test]
    fn capacity_is_plausible() {
        let c = super::capacity();
        assert!(c >= 1 << 20, "{c}");
        assert!(c <= isize::MAX as usize, "{c}");
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(miri)))]
        assert!(c <= 1 << 47, "{c}");
        assert_eq!(super::capacity(), c);
    }
}
