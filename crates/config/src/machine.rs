//! What this machine lets the process use: the CPUs it may run on and its open-file limit.
//! Defaults that grow with the machine (worker count, overload limits) are read from here.

/// The CPUs this process may run on: the affinity mask, further limited by a cgroup CPU quota
/// (rounded down, at least 1). This is what a container's limit means, not the host's core
/// count (lesson L8). Not cached: it reads /proc and cgroupfs, so keep it off hot paths.
pub fn usable_cores() -> usize {
    std::thread::available_parallelism()
        .map(std::num::NonZeroUsize::get)
        .unwrap_or(1)
}

/// Raises the soft limit on open files to the hard limit, as nginx's `worker_rlimit_nofile`
/// and Go's runtime do: a proxied connection holds two descriptors, and the usual soft
/// default (1,024) is far below what the hard limit allows. Returns (before, after).
#[cfg(unix)]
#[allow(unsafe_code)] // an FFI call into the C library, which has no safe wrapper
pub fn raise_open_file_limit() -> Option<(u64, u64)> {
    let limit = open_file_limits()?;
    let before = limit.rlim_cur;
    if before >= limit.rlim_max {
        return Some((before, before));
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: as above; the call only reads `raised`.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Some((before, before));
    }
    Some((before, raised.rlim_cur))
}

#[cfg(not(unix))]
pub fn raise_open_file_limit() -> Option<(u64, u64)> {
    None
}

/// The soft limit on open files.
#[cfg(unix)]
pub fn open_file_limit() -> Option<u64> {
    open_file_limits().map(|l| l.rlim_cur)
}

#[cfg(not(unix))]
pub fn open_file_limit() -> Option<u64> {
    None
}

#[cfg(unix)]
#[allow(unsafe_code)] // an FFI call into the C library, which has no safe wrapper
fn open_file_limits() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a plain struct owned by this frame, written by the call.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit)
}

#[cfg(test)]
mod tests {
    /// A thread pinned to one CPU may use one core, whatever the machine has: the count
    /// follows the affinity mask (what `taskset` and a cpuset give), not the hardware.
    #[test]
    #[allow(unsafe_code)]
    fn the_count_follows_the_affinity_mask() {
        let pinned = std::thread::spawn(|| {
            // SAFETY: `set` is a plain bitmask owned by this frame; the calls only read and
            // write it, and change this thread's own affinity.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                let size = std::mem::size_of::<libc::cpu_set_t>();
                assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
                let first = (0..libc::CPU_SETSIZE as usize)
                    .find(|&cpu| libc::CPU_ISSET(cpu, &set))
                    .expect("this thread may run on some CPU");
                libc::CPU_ZERO(&mut set);
                libc::CPU_SET(first, &mut set);
                assert_eq!(libc::sched_setaffinity(0, size, &set), 0);
            }
            super::usable_cores()
        });
        assert_eq!(pinned.join().unwrap(), 1);
    }
}
