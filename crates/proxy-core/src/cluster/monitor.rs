//! The once-per-process side of clusters, on one thread with its own runtime: active health
//! checks (one task per checked host, see `health_check.rs`; results shared with every
//! worker's balancer), DNS lookups of endpoint names (one task per name, see `dns.rs`), the
//! end of outlier ejections and the interval's rate ejections, and the circuit-breaker
//! headroom gauges.
//!
//! Headroom is Little's law read off the stats: over the last 10 s, the requests in flight on
//! average are the upstream request time summed over completed requests divided by the
//! window (rate x mean latency). `max_requests` over that, in percent, says how far the load
//! may grow before the breaker trips; a warning is logged when it stays under 2x for 30 s.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::SharedCluster;
use super::health::RateEjections;
use crate::catalog::{ClusterStats, ProxyStats};

/// How often headroom and ejections are looked at.
const TICK: Duration = Duration::from_secs(1);
/// The window headroom is measured over, in ticks.
const WINDOW: usize = 10;
/// Headroom below this (percent) for [`LOW_FOR`] logs a warning.
const LOW_HEADROOM: i64 = 200;
const LOW_FOR: Duration = Duration::from_secs(30);
/// Shown when nothing was in flight: the limit is at least 1000x away.
pub(crate) const IDLE_HEADROOM: i64 = 100_000;

/// The clusters of the config in force, published by every config change.
pub(crate) type ClusterList = Arc<Vec<Arc<SharedCluster>>>;

/// Starts the monitor thread. It runs as long as the process, following the cluster list
/// `clusters` publishes.
pub(crate) fn start(
    clusters: watch::Receiver<ClusterList>,
    stats: Arc<ProxyStats>,
) -> std::io::Result<()> {
    let runtime = crate::runtime::current_thread_runtime()?;
    std::thread::Builder::new()
        .name("legate-clusters".into())
        .spawn(move || {
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, run(clusters, stats));
        })?;
    Ok(())
}

/// A cluster the monitor looks after, held so that its address keys it uniquely.
struct Watched {
    cluster: Arc<SharedCluster>,
    headroom: Headroom,
    /// One health-check task per host, and the stats they count in.
    checks: HashMap<SocketAddr, tokio::task::JoinHandle<()>>,
    /// One lookup task per endpoint name.
    lookups: HashMap<String, tokio::task::JoinHandle<()>>,
    stats: Option<Rc<ClusterStats>>,
    /// The health-check event log, opened with the first check (`None` inside: none).
    events: Option<Option<Rc<super::health_events::EventLog>>>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        for task in self.checks.values().chain(self.lookups.values()) {
            task.abort();
        }
    }
}

async fn run(mut clusters: watch::Receiver<ClusterList>, stats: Arc<ProxyStats>) {
    let shard = &stats.process;
    let mut watched: HashMap<*const SharedCluster, Watched> = HashMap::new();
    let mut ticks = tokio::time::interval(TICK);
    loop {
        let tick = tokio::select! {
            _ = ticks.tick() => true,
            changed = clusters.changed() => {
                if changed.is_err() {
                    return; // the server is gone
                }
                false
            }
        };
        let current = Arc::clone(&clusters.borrow_and_update());
        follow(&current, &mut watched, &stats, shard);
        if !tick {
            continue;
        }
        let snapshot = stats.registry.snapshot();
        let now = Instant::now();
        for cluster in current.iter() {
            let Some(entry) = watched.get_mut(&Arc::as_ptr(cluster)) else {
                continue;
            };
            cluster.health.expire_ejections(&cluster.host_set);
            let rates = cluster.health.evaluate_rates(&cluster.host_set, now);
            if rates != RateEjections::default() {
                let s = entry
                    .stats
                    .get_or_insert_with(|| Rc::new(stats.catalog.cluster(shard, &cluster.name)));
                s.outlier_detection_ejections_detected_success_rate
                    .add(rates.success_rate_detected);
                s.outlier_detection_ejections_enforced_success_rate
                    .add(rates.success_rate_enforced);
                s.outlier_detection_ejections_detected_failure_percentage
                    .add(rates.failure_percentage_detected);
                s.outlier_detection_ejections_enforced_failure_percentage
                    .add(rates.failure_percentage_enforced);
                s.outlier_detection_ejections_enforced_total
                    .add(rates.success_rate_enforced + rates.failure_percentage_enforced);
                s.outlier_detection_ejections_overflow.add(rates.overflow);
            }
            let headroom = &mut entry.headroom;
            let totals = |name: &str| {
                snapshot
                    .histogram(name, &[&cluster.name])
                    .map_or((0, 0), |h| (h.count(), h.sum()))
            };
            headroom.samples.push_back(Sample {
                at: now,
                rq_time_us: totals("upstream_rq_time").1,
                pending_time_us: totals("upstream_rq_pending_time").1,
            });
            if headroom.samples.len() > WINDOW + 1 {
                headroom.samples.pop_front();
            }
            let (rq, pending) = headroom.percent(
                cluster.breakers.requests.limit(),
                cluster.breakers.pending.limit(),
            );
            cluster.gauges.rq_headroom.set(rq);
            cluster.gauges.pending_headroom.set(pending);
            headroom.watch(&cluster.name, rq, now);
        }
    }
}

/// Starts watching clusters that appeared, names among their endpoints (DNS lookups) and
/// hosts that joined (health checks), and stops for those that left.
fn follow(
    current: &[Arc<SharedCluster>],
    watched: &mut HashMap<*const SharedCluster, Watched>,
    stats: &ProxyStats,
    shard: &stats::Shard,
) {
    let now: HashSet<*const SharedCluster> = current.iter().map(Arc::as_ptr).collect();
    watched.retain(|key, _| now.contains(key));
    for cluster in current {
        let entry = watched
            .entry(Arc::as_ptr(cluster))
            .or_insert_with(|| Watched {
                cluster: Arc::clone(cluster),
                headroom: Headroom::default(),
                checks: HashMap::new(),
                lookups: HashMap::new(),
                stats: None,
                events: None,
            });
        // Only lookups and checks record on this shard: a cluster with neither (most of a
        // management server's) gets no series cells here.
        if cluster.dns.is_none() && cluster.health_check.is_none() {
            continue;
        }
        let cluster_stats = entry
            .stats
            .get_or_insert_with(|| Rc::new(stats.catalog.cluster(shard, &cluster.name)));
        if cluster.dns.is_some() {
            let names = cluster.names();
            entry.lookups.retain(|name, task| {
                let keep = names.contains(name);
                if !keep {
                    task.abort();
                }
                keep
            });
            for name in names {
                entry.lookups.entry(name.clone()).or_insert_with(|| {
                    tokio::task::spawn_local(super::dns::follow_name(
                        Arc::clone(cluster),
                        name,
                        Rc::clone(cluster_stats),
                    ))
                });
            }
        }
        let Some(check) = &entry.cluster.health_check else {
            continue;
        };
        let events = entry
            .events
            .get_or_insert_with(|| super::health_events::EventLog::open(&cluster.name, check))
            .clone();
        let snapshot = cluster.host_set.snapshot();
        entry.checks.retain(|addr, task| {
            let keep = snapshot.position(*addr).is_some();
            if !keep {
                task.abort();
            }
            keep
        });
        for host in snapshot.hosts() {
            let addr = host.addr();
            entry.checks.entry(addr).or_insert_with(|| {
                // The endpoint's own port and host header, if it gives them.
                let (target, hostname) = cluster.check_target(addr);
                let mut check = check.clone();
                if let Some(hostname) = hostname {
                    check.host = Some(hostname.clone());
                    if let Some(grpc) = &mut check.grpc {
                        grpc.authority = Some(hostname);
                    }
                }
                tokio::task::spawn_local(super::health_check::check_host(
                    Arc::clone(cluster),
                    super::health_check::Target {
                        addr,
                        connect: target,
                    },
                    check,
                    Rc::clone(cluster_stats),
                    events.clone(),
                ))
            });
        }
    }
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    rq_time_us: u64,
    pending_time_us: u64,
}

#[derive(Default)]
struct Headroom {
    samples: VecDeque<Sample>,
    low_since: Option<Instant>,
    warned: bool,
}

impl Headroom {
    /// (requests, pending) headroom in percent over the window.
    fn percent(&self, rq_limit: u32, pending_limit: u32) -> (i64, i64) {
        let (Some(first), Some(last)) = (self.samples.front(), self.samples.back()) else {
            return (IDLE_HEADROOM, IDLE_HEADROOM);
        };
        let span_us = (last.at - first.at).as_micros() as f64;
        let of = |limit: u32, busy_us: u64| {
            if span_us <= 0.0 {
                return IDLE_HEADROOM;
            }
            // Little's law: mean in flight = time spent in flight / elapsed time.
            let in_flight = busy_us as f64 / span_us;
            if in_flight * IDLE_HEADROOM as f64 <= f64::from(limit) * 100.0 {
                IDLE_HEADROOM
            } else {
                (f64::from(limit) * 100.0 / in_flight).round() as i64
            }
        };
        (
            of(rq_limit, last.rq_time_us.saturating_sub(first.rq_time_us)),
            of(
                pending_limit,
                last.pending_time_us.saturating_sub(first.pending_time_us),
            ),
        )
    }

    fn watch(&mut self, cluster: &str, rq_headroom: i64, now: Instant) {
        if rq_headroom >= LOW_HEADROOM {
            self.low_since = None;
            self.warned = false;
            return;
        }
        let since = *self.low_since.get_or_insert(now);
        if !self.warned && now - since >= LOW_FOR {
            self.warned = true;
            tracing::warn!(
                cluster,
                headroom_percent = rq_headroom,
                "max_requests is less than twice the requests in flight for 30 s: the circuit breaker will trip if load or latency doubles"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(busy_us: u64, seconds: u64) -> Headroom {
        let start = Instant::now();
        let mut h = Headroom::default();
        h.samples.push_back(Sample {
            at: start,
            rq_time_us: 1_000,
            pending_time_us: 0,
        });
        h.samples.push_back(Sample {
            at: start + Duration::from_secs(seconds),
            rq_time_us: 1_000 + busy_us,
            pending_time_us: 0,
        });
        h
    }

    #[test]
    fn headroom_is_the_limit_over_rate_times_mean_latency() {
        // 100 requests a second of 50 ms each for 10 s: 5 in flight on average.
        let h = window(100 * 10 * 50_000, 10);
        assert_eq!(h.percent(20, 10).0, 400);
        assert_eq!(h.percent(20, 10).1, IDLE_HEADROOM, "nothing waited");
        assert_eq!(
            Headroom::default().percent(20, 10),
            (IDLE_HEADROOM, IDLE_HEADROOM)
        );
    }

    #[test]
    fn low_headroom_warns_once_after_thirty_seconds() {
        let mut h = Headroom::default();
        let t0 = Instant::now();
        h.watch("c", 150, t0);
        assert!(!h.warned);
        h.watch("c", 150, t0 + Duration::from_secs(31));
        assert!(h.warned);
        h.watch("c", 500, t0 + Duration::from_secs(32));
        assert!(!h.warned && h.low_since.is_none());
    }
}
