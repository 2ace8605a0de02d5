//! Retires the stats series of what was removed: a cluster, a host that left its cluster
//! through EDS or DNS, a listener. Their handles go with them (and with the last connection
//! that used them); a thread sweeps the registry so that series no handle has held for
//! `stats.retire_after` leave `/stats` and Prometheus and free their memory. Without it, a
//! fleet whose endpoints come and go every few seconds would keep every address ever seen.

use std::sync::Weak;
use std::time::Duration;

use crate::catalog::ProxyStats;

/// Sweeps this often within the grace period, so that a series goes at most a quarter of it
/// late.
const SWEEPS_PER_GRACE: u32 = 4;
/// Bounds on the sweep period: a sweep walks every series under the registry's lock.
const SWEEP_EVERY: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(15));
/// Series retired in one sweep that make giving the heap's free pages back worth a trim: the
/// removed clusters' memory was freed before their series went, and glibc keeps it otherwise.
const TRIM_AFTER_SERIES: usize = 256;

/// Starts the thread that sweeps, with the grace period `retire_after` gives, until it gives
/// `None` or the stats are gone (the server stopped).
pub(crate) fn start(
    stats: Weak<ProxyStats>,
    retire_after: impl Fn() -> Option<Duration> + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("legate-stats".into())
        .spawn(move || {
            while let Some(grace) = retire_after() {
                std::thread::sleep((grace / SWEEPS_PER_GRACE).clamp(SWEEP_EVERY.0, SWEEP_EVERY.1));
                let Some(stats) = stats.upgrade() else {
                    return;
                };
                let retired = stats.registry.retire_unheld(grace);
                if retired.series > 0 {
                    tracing::debug!(
                        series = retired.series,
                        pending = retired.pending,
                        "retired the stats of removed clusters, hosts and listeners"
                    );
                }
                if retired.series >= TRIM_AFTER_SERIES {
                    crate::memory::trim_now();
                }
            }
        })
        .map(drop)
}
