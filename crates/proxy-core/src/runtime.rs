//! Runtimes and executors: the single-threaded runtime every proxy thread runs, the executor
//! that keeps hyper's background tasks (HTTP/2 streams, connection drivers) on the current
//! worker, and how many cores there are to run workers on.

use std::future::Future;

/// A hyper executor that spawns onto the worker's `LocalSet`, so request futures need not be
/// `Send` and never leave the worker thread.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// A single-threaded tokio runtime with I/O and timers, as workers and the admin server use.
/// Built on the starting thread so that a failure is returned, not lost in a new thread.
pub(crate) fn current_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

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
pub(crate) fn open_file_limit() -> Option<u64> {
    open_file_limits().map(|l| l.rlim_cur)
}

#[cfg(not(unix))]
pub(crate) fn open_file_limit() -> Option<u64> {
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

/// Resolves once `last_activity` has stood still for `timeout`: the idle timeout of a relay,
/// and a request's timeout, which (as in Envoy) runs from the end of its body, so a large
/// upload that keeps moving is not cut off and one that stalls for the timeout is.
pub(crate) async fn idle_for(
    timeout: std::time::Duration,
    last_activity: &std::cell::Cell<tokio::time::Instant>,
) {
    loop {
        tokio::time::sleep_until(last_activity.get() + timeout).await;
        if last_activity.get() + timeout <= tokio::time::Instant::now() {
            return;
        }
    }
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
