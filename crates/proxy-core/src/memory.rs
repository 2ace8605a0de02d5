//! Giving freed memory back to the system after connections go idle.
//!
//! An HTTP/1.1 connection gives its read buffer back to the worker's pool between requests
//! (buffer_pool.rs); buffers beyond what the pool keeps are freed. glibc's malloc
//! keeps freed memory in its arenas, and pages that sit between live allocations (the parked
//! connections' own small state) are never handed back by `free`: 10,000 connections that made
//! one request each would keep ~14 KiB apiece resident long after they went quiet.
//! `malloc_trim` returns every whole free page inside the heaps, so a background thread calls
//! it, at most twice a second, after enough codecs were freed since the last call or once a
//! burst of freeing has settled.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Codecs freed since the last trim.
static RELEASED: AtomicUsize = AtomicUsize::new(0);

/// Freed codecs (about 16 KiB each) that make a trim worth its cost.
const TRIM_AFTER: usize = 64;
/// How often the thread looks, and how often it trims at most: a trim walks every free
/// chunk of the heaps (a millisecond or two for a heap of 100 MB).
const CHECK_EVERY: Duration = Duration::from_millis(250);
const MIN_TRIM_INTERVAL: Duration = Duration::from_millis(500);

/// Notes that a connection's codec was freed.
pub(crate) fn codec_released() {
    RELEASED.fetch_add(1, Ordering::Relaxed);
}

/// Starts, once per process, the thread that trims the heap after bursts of parking. It lives
/// as long as the process and takes no lock of the proxy's. Without it the proxy works the
/// same, only holding more memory, so a failure to start it is logged, not fatal.
pub(crate) fn start_trimmer() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("legate-trim".into())
            .spawn(|| {
                let mut last_trim = Instant::now();
                let mut seen = 0;
                loop {
                    std::thread::sleep(CHECK_EVERY);
                    let released = RELEASED.load(Ordering::Relaxed);
                    // Enough freed, or the last of a burst: some freed, and nothing since the
                    // last look (so the burst's tail is given back too).
                    let settled = released > 0 && released == seen;
                    seen = released;
                    if (released >= TRIM_AFTER || settled)
                        && last_trim.elapsed() >= MIN_TRIM_INTERVAL
                    {
                        RELEASED.store(0, Ordering::Relaxed);
                        seen = 0;
                        let started = Instant::now();
                        trim();
                        last_trim = Instant::now();
                        tracing::debug!(took = ?last_trim - started, "returned freed memory to the system");
                    }
                }
            });
        if let Err(err) = spawned {
            tracing::warn!(error = %err, "cannot start the memory trim thread; idle memory is not returned");
        }
    });
}

/// Returns freed memory to the system now: the overload manager's `shrink_heap`, under
/// memory pressure.
pub(crate) fn trim_now() {
    RELEASED.store(0, Ordering::Relaxed);
    trim();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // one FFI call into the C library, which has no safe wrapper
fn trim() {
    // SAFETY: malloc_trim only walks and locks glibc's own arenas; it is safe to call from any
    // thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
