//! The load balancer: a policy's tables over the current host-set snapshot, rebuilt lazily
//! when the snapshot's version moves, and the lock-free pick.
//!
//! Health follows Envoy's single-priority rules. Each host is healthy, degraded or
//! unavailable (unhealthy or ejected). With `h` healthy and `d` degraded hosts out of `n`,
//! healthy availability is `min(100, 140 * h / n)` and degraded availability
//! `min(100, 140 * d / n)` (Envoy's overprovisioning factor of 1.4); their sum, capped at 100,
//! is the total availability. If it is below 100 and `100 * (h + d) / n` is below the panic
//! threshold, the set is in *panic* and picks go to all hosts whatever their health.
//! Otherwise picks go to healthy hosts, and degraded hosts take the share healthy ones cannot
//! (`100 - min(100, healthy availability * 100 / total availability)` percent).

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use arc_swap::ArcSwap;

use crate::host::{Host, HostSet, Picked, Snapshot};
use crate::policy::{DEFAULT_PANIC_THRESHOLD, LbPolicy};
use crate::{BuildError, Health, least_request, maglev, random, ring_hash, rng, round_robin};

/// Envoy's default overprovisioning factor, in percent.
const OVERPROVISIONING_PERCENT: u64 = 140;

/// Picks hosts from a [`HostSet`] with one [`LbPolicy`].
///
/// `Send + Sync`: share one behind an `Arc` across threads, or give each worker thread its
/// own over clones of the same `HostSet` (what Envoy and Legate do: a worker's picks then write
/// no memory another worker writes except the chosen hosts' shared state, whose in-flight
/// counts are shared on purpose so that least request sees the load of every worker).
///
/// [`pick`](Self::pick) takes no lock and allocates nothing: an `arc-swap` load of the current
/// tables, one atomic load to see that they match the host set's version, the policy's choice,
/// then two atomic increments on the chosen host (its in-flight count, and the reference the
/// guard keeps to it), undone when the guard drops. When the host set has moved on, the first
/// pick to notice rebuilds the tables (other picks meanwhile keep using the old ones rather
/// than wait), unless [`refresh`](Self::refresh) has already done it.
pub struct LoadBalancer {
    hosts: HostSet,
    policy: LbPolicy,
    panic_threshold: f64,
    compiled: ArcSwap<Compiled>,
    rebuild: Mutex<()>,
    cursors: [Cursor; 3],
    #[cfg(feature = "metrics")]
    meters: crate::meters::Meters,
}

/// A round-robin position, on its own cache line: it is the one word every round-robin pick
/// writes.
#[repr(align(64))]
struct Cursor(AtomicU64);

impl LoadBalancer {
    /// A balancer over `hosts` with Envoy's default panic threshold (50%).
    pub fn new(hosts: HostSet, policy: LbPolicy) -> Result<Self, BuildError> {
        Self::with_panic_threshold(hosts, policy, DEFAULT_PANIC_THRESHOLD)
    }

    /// A balancer with another healthy panic threshold, in percent (`0..=100`; 0 turns panic
    /// mode off, so that a set with no available host yields no pick).
    pub fn with_panic_threshold(
        hosts: HostSet,
        policy: LbPolicy,
        panic_threshold: f64,
    ) -> Result<Self, BuildError> {
        policy.validate()?;
        if !(0.0..=100.0).contains(&panic_threshold) {
            return Err(BuildError::PanicThresholdOutOfRange {
                threshold: panic_threshold,
            });
        }
        let compiled = Compiled::build(&hosts.snapshot(), &policy, panic_threshold);
        // Start each balancer's rotation at a random place, as Envoy seeds each worker's, so
        // that per-worker balancers do not all send their first requests to the same host.
        let start = rng::next_u64() >> 1;
        #[cfg(feature = "metrics")]
        let meters = {
            let meters = crate::meters::Meters::new(policy.name());
            meters
                .panic_mode
                .set(if matches!(compiled.route, Route::Panic(_)) {
                    1.0
                } else {
                    0.0
                });
            meters
        };
        Ok(Self {
            hosts,
            policy,
            panic_threshold,
            compiled: ArcSwap::from_pointee(compiled),
            rebuild: Mutex::new(()),
            cursors: [0, 1, 2].map(|_| Cursor(AtomicU64::new(start))),
            #[cfg(feature = "metrics")]
            meters,
        })
    }

    /// Chooses a host, or `None` when no host may take traffic (an empty set, or no available
    /// host with panic mode off).
    ///
    /// `hash_key` is what ring hash and maglev map to a host (see [`hash_key`](crate::hash_key));
    /// without one they pick at random, as Envoy does. Other policies ignore it. The returned
    /// guard counts one request in flight to the host until it is dropped.
    #[inline]
    pub fn pick(&self, hash_key: Option<u64>) -> Option<Picked> {
        let compiled = self.compiled.load();
        let picked = if compiled.version == self.hosts.version() {
            compiled.pick(hash_key, &self.cursors)
        } else {
            drop(compiled);
            self.try_refresh().pick(hash_key, &self.cursors)
        };
        #[cfg(feature = "metrics")]
        match &picked {
            Some(_) => self.meters.picks.increment(1),
            None => self.meters.pick_failures.increment(1),
        }
        picked
    }

    /// The host set this balancer picks from.
    pub fn hosts(&self) -> &HostSet {
        &self.hosts
    }

    /// The policy this balancer runs.
    pub fn policy(&self) -> &LbPolicy {
        &self.policy
    }

    /// The healthy panic threshold, in percent.
    pub fn panic_threshold(&self) -> f64 {
        self.panic_threshold
    }

    /// True when the tables in use were built in panic mode (too few available hosts, so
    /// picks ignore health).
    pub fn in_panic(&self) -> bool {
        matches!(self.current().route, Route::Panic(_))
    }

    /// Rebuilds the tables for the current host set now, waiting for a rebuild in progress.
    ///
    /// Optional: otherwise the first pick after a change rebuilds them (maglev's default
    /// table, 65537 entries, takes a fraction of a millisecond; a ring of millions of entries,
    /// far longer). The thread that updates the host set can call this to keep that cost off
    /// the request path.
    pub fn refresh(&self) {
        let rebuilding = self.rebuild.lock().unwrap_or_else(PoisonError::into_inner);
        self.rebuild_locked(rebuilding);
    }

    /// The host-set version the tables in use were built for; behind
    /// [`HostSet::version`] until the next pick or [`refresh`](Self::refresh).
    pub fn tables_version(&self) -> u64 {
        self.compiled.load().version
    }

    fn current(&self) -> Arc<Compiled> {
        let compiled = self.compiled.load_full();
        if compiled.version == self.hosts.version() {
            compiled
        } else {
            self.try_refresh()
        }
    }

    #[cold]
    fn try_refresh(&self) -> Arc<Compiled> {
        let rebuilding = match self.rebuild.try_lock() {
            Ok(guard) => guard,
            // Another pick is rebuilding: use the tables we have rather than wait.
            Err(TryLockError::WouldBlock) => return self.compiled.load_full(),
            // The guarded data is `()`; a rebuild that panicked left nothing behind.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        self.rebuild_locked(rebuilding)
    }

    fn rebuild_locked(&self, _rebuilding: MutexGuard<'_, ()>) -> Arc<Compiled> {
        let current = self.compiled.load_full();
        let snapshot = self.hosts.snapshot();
        if current.version == snapshot.version() {
            return current;
        }
        let fresh = Arc::new(Compiled::build(
            &snapshot,
            &self.policy,
            self.panic_threshold,
        ));
        self.compiled.store(Arc::clone(&fresh));
        #[cfg(feature = "metrics")]
        self.meters.rebuilt(
            matches!(current.route, Route::Panic(_)),
            matches!(fresh.route, Route::Panic(_)),
        );
        fresh
    }
}

impl fmt::Debug for LoadBalancer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadBalancer")
            .field("policy", &self.policy)
            .field("panic_threshold", &self.panic_threshold)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// The tables for one snapshot.
struct Compiled {
    version: u64,
    route: Route,
}

enum Route {
    /// No host may take traffic.
    Nowhere,
    /// Too few available hosts: balance over all of them.
    Panic(Source),
    /// Healthy hosts, and degraded ones for the share healthy ones cannot take.
    Normal {
        healthy: Option<Source>,
        degraded: Option<Source>,
        /// Percent of picks (1..=100) that go to healthy hosts when both kinds exist.
        healthy_load: u64,
    },
}

impl Compiled {
    fn build(snapshot: &Snapshot, policy: &LbPolicy, panic_threshold: f64) -> Self {
        let entries = snapshot.entries();
        let positions_with = |health: Health| -> Vec<usize> {
            (0..entries.len())
                .filter(|&i| entries[i].health == health)
                .collect()
        };
        let healthy = positions_with(Health::Healthy);
        let degraded = positions_with(Health::Degraded);
        let source =
            |positions: &[usize], kind: usize| Source::build(snapshot, positions, policy, kind);

        let route = match plan(
            healthy.len(),
            degraded.len(),
            entries.len(),
            panic_threshold,
        ) {
            Plan::Nowhere => Route::Nowhere,
            Plan::Panic => {
                let all: Vec<usize> = (0..entries.len()).collect();
                Route::Panic(source(&all, ALL))
            }
            Plan::Normal {
                healthy_load,
                use_degraded,
            } => Route::Normal {
                healthy: (!healthy.is_empty()).then(|| source(&healthy, HEALTHY)),
                degraded: use_degraded.then(|| source(&degraded, DEGRADED)),
                healthy_load,
            },
        };
        Self {
            version: snapshot.version(),
            route,
        }
    }

    #[inline]
    fn pick(&self, hash_key: Option<u64>, cursors: &[Cursor; 3]) -> Option<Picked> {
        let source = match &self.route {
            Route::Normal {
                healthy: Some(healthy),
                degraded: None,
                ..
            } => healthy,
            Route::Normal {
                healthy,
                degraded,
                healthy_load,
            } => match (healthy, degraded) {
                (Some(healthy), Some(degraded)) => {
                    // As Envoy's choosePriority: the hash key (or a random number) modulo 100
                    // decides, so one key keeps going to the same kind of host.
                    let bucket = hash_key.unwrap_or_else(rng::next_u64) % 100 + 1;
                    if bucket <= *healthy_load {
                        healthy
                    } else {
                        degraded
                    }
                }
                (Some(only), None) | (None, Some(only)) => only,
                (None, None) => return None,
            },
            Route::Panic(all) => all,
            Route::Nowhere => return None,
        };
        source.pick(hash_key, &cursors[source.kind].0)
    }
}

/// Where picks go, from the counts of healthy and degraded hosts among `total`.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    Nowhere,
    Panic,
    Normal {
        /// Percent of picks for healthy hosts; the rest go to degraded ones.
        healthy_load: u64,
        use_degraded: bool,
    },
}

fn plan(healthy: usize, degraded: usize, total: usize, panic_threshold: f64) -> Plan {
    let (h, d, n) = (healthy as u64, degraded as u64, total as u64);
    let availability = |count: u64| {
        (OVERPROVISIONING_PERCENT * count)
            .checked_div(n)
            .map_or(0, |a| a.min(100))
    };
    let (healthy_availability, degraded_availability) = (availability(h), availability(d));
    let total_availability = (healthy_availability + degraded_availability).min(100);
    if n == 0 {
        return Plan::Nowhere;
    }
    let available_percent = 100.0 * (h + d) as f64 / n as f64;
    if total_availability < 100 && available_percent < panic_threshold {
        return Plan::Panic;
    }
    let share = |availability: u64| (availability * 100).checked_div(total_availability);
    match (share(healthy_availability), share(degraded_availability)) {
        (Some(healthy_load), Some(degraded_load)) => {
            let healthy_load = healthy_load.min(100);
            let degraded_load = degraded_load.min(100 - healthy_load);
            Plan::Normal {
                // Rounding leftovers go to healthy hosts when they have any availability,
                // as in Envoy.
                healthy_load: if healthy_availability > 0 {
                    100 - degraded_load
                } else {
                    healthy_load
                },
                use_degraded: d > 0 && degraded_load > 0,
            }
        }
        // Panic mode is off (threshold 0) and almost nothing is available: like Envoy, send
        // everything to the healthy hosts, if any.
        _ if h > 0 => Plan::Normal {
            healthy_load: 100,
            use_degraded: false,
        },
        _ => Plan::Nowhere,
    }
}

const HEALTHY: usize = 0;
const DEGRADED: usize = 1;
const ALL: usize = 2;

/// One kind of host (healthy, degraded, or all in panic) and the policy's table over them.
struct Source {
    members: Box<[Member]>,
    table: Table,
    /// Which round-robin cursor this source advances.
    kind: usize,
}

/// A host as a policy table sees it.
/// Members over hosts `10.0.NET.1:80`, `10.0.NET.2:80`, ... with the given weights, for the
/// policies' unit tests.
#[cfg(test)]
pub(crate) fn test_members(weights: &[u32], net: u8) -> Vec<Member> {
    use crate::host::{HostSet, HostSpec};
    let specs: Vec<HostSpec> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            HostSpec::new(format!("10.0.{net}.{}:80", i + 1).parse().unwrap()).with_weight(w)
        })
        .collect();
    let snapshot = HostSet::new(specs).unwrap().snapshot();
    snapshot
        .entries()
        .iter()
        .enumerate()
        .map(|(index, e)| Member {
            host: Arc::clone(&e.host),
            index,
            weight: e.weight,
        })
        .collect()
}

pub(crate) struct Member {
    pub(crate) host: Arc<Host>,
    /// Index in the snapshot.
    pub(crate) index: usize,
    pub(crate) weight: u32,
}

enum Table {
    RoundRobin(round_robin::Schedule),
    LeastRequest(least_request::Chooser),
    Random(random::Chooser),
    RingHash(ring_hash::Ring),
    Maglev(maglev::Table),
}

impl Source {
    fn build(snapshot: &Snapshot, positions: &[usize], policy: &LbPolicy, kind: usize) -> Self {
        let entries = snapshot.entries();
        let members: Box<[Member]> = positions
            .iter()
            .map(|&i| Member {
                host: Arc::clone(&entries[i].host),
                index: i,
                weight: entries[i].weight,
            })
            .collect();
        let table = match policy {
            LbPolicy::RoundRobin => Table::RoundRobin(round_robin::Schedule::build(&members)),
            LbPolicy::LeastRequest(options) => {
                Table::LeastRequest(least_request::Chooser::build(&members, options))
            }
            LbPolicy::Random => Table::Random(random::Chooser::build(&members)),
            LbPolicy::RingHash(options) => {
                Table::RingHash(ring_hash::Ring::build(&members, options))
            }
            LbPolicy::Maglev(options) => Table::Maglev(maglev::Table::build(&members, options)),
        };
        Self {
            members,
            table,
            kind,
        }
    }

    #[inline]
    fn pick(&self, hash_key: Option<u64>, cursor: &AtomicU64) -> Option<Picked> {
        let position = match &self.table {
            Table::RoundRobin(schedule) => schedule.pick(cursor),
            Table::LeastRequest(chooser) => chooser.pick(&self.members),
            Table::Random(chooser) => chooser.pick(self.members.len()),
            Table::RingHash(ring) => ring.pick(hash_key.unwrap_or_else(rng::next_u64)),
            Table::Maglev(table) => table.pick(hash_key.unwrap_or_else(rng::next_u64)),
        };
        let member = self.members.get(position)?;
        Some(Picked::new(&member.host, member.index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_follow_envoys_arithmetic() {
        let normal = |healthy_load, use_degraded| Plan::Normal {
            healthy_load,
            use_degraded,
        };
        assert_eq!(plan(0, 0, 0, 50.0), Plan::Nowhere);
        assert_eq!(plan(10, 0, 10, 50.0), normal(100, false));
        // 1.4 * 60% = 84% healthy, 1.4 * 40% = 56% degraded, total capped at 100.
        assert_eq!(plan(6, 4, 10, 50.0), normal(84, true));
        // 1.4 * 80% >= 100%: degraded hosts not needed.
        assert_eq!(plan(8, 2, 10, 50.0), normal(100, false));
        // 3 of 10 healthy, 2 degraded: 42% and 28%, total 70%, loads 60 / 40; 50% available is
        // not below the threshold.
        assert_eq!(plan(3, 2, 10, 50.0), normal(60, true));
        assert_eq!(plan(3, 1, 10, 50.0), Plan::Panic);
        assert_eq!(plan(0, 3, 3, 50.0), normal(0, true));
        assert_eq!(plan(0, 0, 3, 50.0), Plan::Panic);
        assert_eq!(plan(0, 0, 3, 0.0), Plan::Nowhere);
        // 1 healthy of 200: availability rounds to 0; with panic off it still gets traffic.
        assert_eq!(plan(1, 0, 200, 0.0), normal(100, false));
    }
}
