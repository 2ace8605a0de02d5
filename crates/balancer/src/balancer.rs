//! The load balancer: a policy's tables over the current host-set snapshot, rebuilt lazily
//! when the snapshot's version moves, and the lock-free pick.
//!
//! Health and priorities follow Envoy. Each host is healthy, degraded or unavailable
//! (unhealthy or ejected), and belongs to a priority level. `priority.rs` shares the load
//! among the levels from their health (with the overprovisioning factor, 140% by default)
//! and says which are in panic: a pick first draws a level and a kind of host (healthy or
//! degraded) by those loads, then balances over those hosts with the policy, or over every
//! host of the level if it is in panic. With locality-weighted balancing, a locality is
//! drawn first by its effective weight (`locality.rs`), then a host of it.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::host::{Ahead, Entry, HostSet, Picked, Snapshot, ZoneRoute};
use crate::member::Member;
use crate::policy::{DEFAULT_PANIC_THRESHOLD, LbPolicy};
use crate::priority::{self, LevelCounts};
use crate::random::Alias;
use crate::slow_start::{self, SlowStart};
use crate::zone::{self, LocalCluster, Plan, ZoneAwareSettings, ZoneRouting};
use crate::{
    BuildError, Health, least_request, locality, maglev, random, ring_hash, rng, round_robin,
};

/// Envoy's default overprovisioning factor, in percent.
pub const DEFAULT_OVERPROVISIONING_FACTOR: u32 = 140;

/// How a balancer shares load across health, priorities and localities (Envoy's
/// `common_lb_config` and the endpoints' overprovisioning factor).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LbSettings {
    /// The healthy panic threshold in percent (`0..=100`; 0 turns panic mode off, so that a
    /// set with no available host yields no pick). Envoy's default: 50.
    pub panic_threshold: f64,
    /// How much a level's (and a locality's) available share is inflated before it is found
    /// short, in percent (at least 1): with 140, a level with 5 of 7 hosts healthy still
    /// takes all its load. Envoy's default: 140.
    pub overprovisioning_factor: u32,
    /// Draw a locality by its weight before a host (Envoy's `locality_weighted_lb_config`);
    /// with the hashing policies, each host's share of the ring or table is its share of its
    /// locality's weight instead, as Envoy's.
    pub locality_weighted: bool,
    /// Zone-aware routing, in use when the balancer has a [`LocalCluster`] and neither
    /// locality weighting nor a hashing policy.
    pub zone_aware: ZoneAwareSettings,
    /// Hosts that join, or pass their health checks again, ramp up to their weight over a
    /// window (round robin and least request).
    pub slow_start: Option<SlowStart>,
}

impl Default for LbSettings {
    fn default() -> Self {
        Self {
            panic_threshold: DEFAULT_PANIC_THRESHOLD,
            overprovisioning_factor: DEFAULT_OVERPROVISIONING_FACTOR,
            locality_weighted: false,
            zone_aware: ZoneAwareSettings::default(),
            slow_start: None,
        }
    }
}

impl LbSettings {
    /// Checks the settings for `policy`, as [`LoadBalancer::with_settings`] does.
    pub fn validate(&self, policy: &LbPolicy) -> Result<(), BuildError> {
        if !(0.0..=100.0).contains(&self.panic_threshold) {
            return Err(BuildError::PanicThresholdOutOfRange {
                threshold: self.panic_threshold,
            });
        }
        if self.overprovisioning_factor == 0 {
            return Err(BuildError::OverprovisioningFactorZero);
        }
        if let Some(slow_start) = &self.slow_start {
            if !matches!(policy, LbPolicy::RoundRobin | LbPolicy::LeastRequest(_)) {
                return Err(BuildError::SlowStartPolicy {
                    policy: policy.name(),
                });
            }
            slow_start.validate()?;
        }
        if self.zone_aware.routing_enabled > 100 {
            return Err(BuildError::RoutingEnabledOutOfRange {
                percent: self.zone_aware.routing_enabled,
            });
        }
        Ok(())
    }
}

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
    settings: LbSettings,
    /// The proxy's own fleet, for zone-aware routing.
    local: Option<LocalCluster>,
    compiled: ArcSwap<Compiled>,
    rebuild: Mutex<()>,
    /// Tables built since this balancer was made.
    rebuilds: AtomicU64,
    /// Picks made ahead by [`peek`](Self::peek), with the versions of the tables they were
    /// made on, handed out in order by the next picks; their count, so that a pick without
    /// any takes no lock.
    ahead: Mutex<VecDeque<((u64, u64), Ahead)>>,
    ahead_len: AtomicUsize,
    #[cfg(feature = "metrics")]
    meters: crate::meters::Meters,
}

/// Where a coming pick will go ([`LoadBalancer::peek`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peeked {
    addr: SocketAddr,
    index: usize,
}

impl Peeked {
    /// The host's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The host's index in the snapshot it was picked from.
    pub fn index(&self) -> usize {
        self.index
    }
}

/// A round-robin position, on its own cache line: it is the one word every round-robin pick
/// writes.
#[repr(align(64))]
struct Cursor(AtomicU64);

impl LoadBalancer {
    /// A balancer over `hosts` with Envoy's default settings (panic threshold 50%,
    /// overprovisioning factor 140%, no locality weighting).
    pub fn new(hosts: HostSet, policy: LbPolicy) -> Result<Self, BuildError> {
        Self::with_settings(hosts, policy, LbSettings::default())
    }

    /// A balancer with another healthy panic threshold, in percent (`0..=100`; 0 turns panic
    /// mode off, so that a set with no available host yields no pick).
    pub fn with_panic_threshold(
        hosts: HostSet,
        policy: LbPolicy,
        panic_threshold: f64,
    ) -> Result<Self, BuildError> {
        let settings = LbSettings {
            panic_threshold,
            ..LbSettings::default()
        };
        Self::with_settings(hosts, policy, settings)
    }

    /// A balancer with these settings.
    pub fn with_settings(
        hosts: HostSet,
        policy: LbPolicy,
        settings: LbSettings,
    ) -> Result<Self, BuildError> {
        Self::with_local_cluster(hosts, policy, settings, None)
    }

    /// A balancer that routes by zone (Envoy's zone-aware routing) from the proxy's own
    /// fleet, `local`, whose localities are numbered as the hosts' are. Without locality
    /// weighting and with a policy that does not hash; otherwise `local` has no effect.
    pub fn with_local_cluster(
        hosts: HostSet,
        policy: LbPolicy,
        settings: LbSettings,
        local: Option<LocalCluster>,
    ) -> Result<Self, BuildError> {
        policy.validate()?;
        settings.validate(&policy)?;
        let local = local.filter(|_| !settings.locality_weighted && !policy.hashes());
        // Each source's rotation starts at a random place, as Envoy seeds each worker's, so
        // that per-worker balancers do not all send their first requests to the same host.
        let compiled = Compiled::build(
            &hosts.snapshot(),
            &policy,
            &settings,
            local.as_ref().map(|l| (l.hosts.snapshot(), l.locality)),
            None,
        );
        #[cfg(feature = "metrics")]
        let meters = {
            let meters = crate::meters::Meters::new(policy.name());
            meters
                .panic_mode
                .set(if compiled.panic { 1.0 } else { 0.0 });
            meters
        };
        Ok(Self {
            hosts,
            policy,
            settings,
            local,
            compiled: ArcSwap::from_pointee(compiled),
            rebuild: Mutex::new(()),
            rebuilds: AtomicU64::new(0),
            ahead: Mutex::new(VecDeque::new()),
            ahead_len: AtomicUsize::new(0),
            #[cfg(feature = "metrics")]
            meters,
        })
    }

    /// Chooses a host, or `None` when no host may take traffic (an empty set, or no available
    /// host with panic mode off).
    ///
    /// `hash_key` is what ring hash and maglev map to a host (see [`hash_key`](crate::hash_key));
    /// without one they pick at random, as Envoy does. Other policies ignore it. With several
    /// priority levels or kinds of host in use, it also draws the level (as Envoy's), so that
    /// one key keeps to one level. The returned guard counts one request in flight to the host
    /// until it is dropped.
    #[inline]
    pub fn pick(&self, hash_key: Option<u64>) -> Option<Picked> {
        if self.ahead_len.load(Ordering::Relaxed) != 0
            && let Some(picked) = self.take_ahead()
        {
            #[cfg(feature = "metrics")]
            self.meters.picks.increment(1);
            return Some(picked);
        }
        let compiled = self.compiled.load();
        let picked = if self.is_current(&compiled) {
            compiled.pick(hash_key)
        } else {
            drop(compiled);
            self.try_refresh().pick(hash_key)
        };
        #[cfg(feature = "metrics")]
        match &picked {
            Some(_) => self.meters.picks.increment(1),
            None => self.meters.pick_failures.increment(1),
        }
        picked
    }

    /// Chooses a host for a retry, leaving out of the priority loads the levels whose
    /// priorities are in `excluded` (Envoy's `previous_priorities` retry priority: give it the
    /// priorities of the hosts tried). When those levels are all that is available, picks as
    /// [`pick`](Self::pick) does. Computes the loads anew on each call.
    pub fn pick_excluding(&self, hash_key: Option<u64>, excluded: &[u32]) -> Option<Picked> {
        if excluded.is_empty() {
            return self.pick(hash_key);
        }
        self.current().pick_excluding(hash_key, excluded)
    }

    /// Tells where a coming pick will go, for a connection to be opened there ahead of the
    /// request (Envoy's predictive preconnect): the pick is made now, and the next
    /// [`pick`](Self::pick)s hand the peeked ones out in order before drawing anew. Only
    /// for the policies that can tell ([`LbPolicy::peeks`]), and at most as many picks ahead
    /// as the set has healthy hosts, as Envoy's; `None` otherwise, or when no host may take
    /// traffic. Peeks made on tables since rebuilt for other hosts (or another local
    /// cluster) are dropped.
    pub fn peek(&self) -> Option<Peeked> {
        if !self.policy.peeks() {
            return None;
        }
        let compiled = self.current();
        let versions = (compiled.version, compiled.local_version);
        let mut ahead = self.ahead.lock().unwrap_or_else(PoisonError::into_inner);
        ahead.retain(|(made_on, _)| *made_on == versions);
        let healthy = (self.hosts.snapshot().hosts())
            .filter(|h| h.health() == Health::Healthy)
            .count();
        if ahead.len() >= healthy {
            self.ahead_len.store(ahead.len(), Ordering::Relaxed);
            return None;
        }
        let picked = compiled.pick(None)?.into_ahead();
        let peeked = Peeked {
            addr: picked.addr(),
            index: picked.index(),
        };
        ahead.push_back((versions, picked));
        self.ahead_len.store(ahead.len(), Ordering::Relaxed);
        Some(peeked)
    }

    /// The oldest pick made ahead that is still for the current tables.
    #[cold]
    fn take_ahead(&self) -> Option<Picked> {
        let compiled = self.current();
        let versions = (compiled.version, compiled.local_version);
        let mut ahead = self.ahead.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = loop {
            match ahead.pop_front() {
                Some((made_on, picked)) if made_on == versions => break Some(picked.take()),
                Some(_) => {}
                None => break None,
            }
        };
        self.ahead_len.store(ahead.len(), Ordering::Relaxed);
        taken
    }

    /// The host set this balancer picks from.
    pub fn hosts(&self) -> &HostSet {
        &self.hosts
    }

    /// The policy this balancer runs.
    pub fn policy(&self) -> &LbPolicy {
        &self.policy
    }

    /// The settings this balancer runs with.
    pub fn settings(&self) -> &LbSettings {
        &self.settings
    }

    /// The healthy panic threshold, in percent.
    pub fn panic_threshold(&self) -> f64 {
        self.settings.panic_threshold
    }

    /// How many times the tables have been rebuilt (host-set changes, a local cluster's, a
    /// ramping host's weight): where zone routing is recalculated.
    pub fn rebuilds(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    /// Where zone-aware routing stands for the current hosts.
    pub fn zone_routing(&self) -> ZoneRouting {
        self.current()
            .zone
            .as_ref()
            .map_or(ZoneRouting::Off, |z| z.plan.state)
    }

    /// True when the tables in use have a priority level in panic that takes load (too few
    /// available hosts there, so picks that land on it ignore health).
    pub fn in_panic(&self) -> bool {
        self.current().panic
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

    /// Whether `compiled` was built for the current hosts (and local cluster), and no ramping
    /// host's weight is due to grow.
    #[inline]
    fn is_current(&self, compiled: &Compiled) -> bool {
        compiled.version == self.hosts.version()
            && self
                .local
                .as_ref()
                .is_none_or(|l| compiled.local_version == l.hosts.version())
            && compiled.ramp_until.is_none_or(|at| Instant::now() < at)
    }

    fn current(&self) -> Arc<Compiled> {
        let compiled = self.compiled.load_full();
        if self.is_current(&compiled) {
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
        if self.is_current(&current) {
            return current;
        }
        let fresh = Arc::new(Compiled::build(
            &self.hosts.snapshot(),
            &self.policy,
            &self.settings,
            self.local
                .as_ref()
                .map(|l| (l.hosts.snapshot(), l.locality)),
            Some(&current),
        ));
        self.compiled.store(Arc::clone(&fresh));
        self.rebuilds.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.meters.rebuilt(current.panic, fresh.panic);
        fresh
    }
}

impl fmt::Debug for LoadBalancer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadBalancer")
            .field("policy", &self.policy)
            .field("settings", &self.settings)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// The tables for one snapshot: for each priority level, a source per kind of host
/// (healthy, degraded, and all of them when the level is in panic), and how load is shared
/// among them.
struct Compiled {
    version: u64,
    /// The local cluster's version, with zone-aware routing.
    local_version: u64,
    /// Zone-aware routing at priority 0.
    zone: Option<Box<Zone>>,
    /// Fail picks that land on a level in panic (`fail_traffic_on_panic`).
    fail_on_panic: bool,
    /// With a host in slow start: when its weight is next raised (the tables rebuilt).
    ramp_until: Option<Instant>,
    /// Running sums of the loads (percent) and where each goes, healthy kinds of every level
    /// first, as Envoy's `choosePriority`; only targets with load. Empty: no host may take
    /// traffic.
    targets: Box<[(u32, Target)]>,
    levels: Box<[Level]>,
    /// Whether some level with load is in panic.
    panic: bool,
    /// Each level's priority, ascending.
    priorities: Box<[u32]>,
    /// Each level's healthy and degraded availability (for retries that leave levels out).
    availability: Box<[(u32, u32)]>,
}

#[derive(Debug, Clone, Copy)]
struct Target {
    level: usize,
    degraded: bool,
}

/// One priority level's sources.
#[derive(Default)]
struct Level {
    panic: bool,
    healthy: Option<Group>,
    degraded: Option<Group>,
    /// Every host of the level, when it is in panic.
    all: Option<Group>,
}

/// Hosts of one kind in one level: balanced as one set, or by locality first (Envoy's
/// locality-weighted balancing).
enum Group {
    Flat(Source),
    Localities {
        alias: Alias,
        sources: Box<[Source]>,
    },
}

/// Which source a round-robin cursor belongs to, so that a rebuild carries the position on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SourceKey {
    level: usize,
    kind: u8,
    /// The locality, for a source of one locality.
    locality: Option<u32>,
}

const HEALTHY: u8 = 0;
const DEGRADED: u8 = 1;
const ALL: u8 = 2;

impl Compiled {
    fn build(
        snapshot: &Snapshot,
        policy: &LbPolicy,
        settings: &LbSettings,
        local: Option<(Arc<Snapshot>, u32)>,
        previous: Option<&Compiled>,
    ) -> Self {
        let entries = snapshot.entries();
        let mut priorities: Vec<u32> = entries.iter().map(|e| e.spec.priority).collect();
        priorities.sort_unstable();
        priorities.dedup();
        // Each level's hosts, by position in the snapshot.
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); priorities.len()];
        for (i, entry) in entries.iter().enumerate() {
            if let Ok(level) = priorities.binary_search(&entry.spec.priority) {
                members[level].push(i);
            }
        }
        let counts: Vec<LevelCounts> = members
            .iter()
            .map(|positions| {
                let mut counts = LevelCounts::default();
                for &i in positions {
                    // Draining hosts are excluded from the counts, as Envoy excludes them.
                    match entries[i].spec.health {
                        Health::Healthy => counts.healthy += 1,
                        Health::Degraded => counts.degraded += 1,
                        Health::Unhealthy | Health::Ejected => {}
                        Health::Draining => continue,
                    }
                    counts.hosts += 1;
                }
                counts
            })
            .collect();
        let loads = priority::loads(
            &counts,
            settings.overprovisioning_factor,
            settings.panic_threshold,
        );
        let cursor = |key: SourceKey| {
            previous
                .and_then(|p| p.cursor(key))
                .unwrap_or_else(|| rng::next_u64() >> 1)
        };
        let (weights, ramp_until) = ramped_weights(entries, settings.slow_start.as_ref());
        let builder = GroupBuilder {
            entries,
            weights: &weights,
            policy,
            settings,
            cursor: &cursor,
        };

        let mut targets = Vec::new();
        let mut sum = 0;
        for (degraded, kind_loads) in [(false, &loads.healthy), (true, &loads.degraded)] {
            for (level, load) in kind_loads.iter().enumerate() {
                if *load > 0 {
                    sum += load;
                    targets.push((sum, Target { level, degraded }));
                }
            }
        }
        let mut panic = false;
        let levels = members
            .iter()
            .enumerate()
            .map(|(level, all)| {
                let wanted = |degraded: bool| {
                    targets
                        .iter()
                        .any(|(_, t)| t.level == level && t.degraded == degraded)
                };
                let with = |health: Health| -> Vec<usize> {
                    all.iter()
                        .copied()
                        .filter(|&i| entries[i].spec.health == health)
                        .collect()
                };
                let in_panic = loads.panic[level];
                panic |= in_panic && (wanted(false) || wanted(true));
                // Every kind with hosts: a retry that leaves other levels out may land here.
                if in_panic {
                    Level {
                        panic: true,
                        all: builder.flat(level, ALL, all),
                        ..Level::default()
                    }
                } else {
                    Level {
                        panic: false,
                        healthy: builder.group(level, HEALTHY, &with(Health::Healthy), all),
                        degraded: builder.group(level, DEGRADED, &with(Health::Degraded), all),
                        all: None,
                    }
                }
            })
            .collect();
        let zone = local.as_ref().and_then(|(local, locality)| {
            let level = priorities.binary_search(&0).ok()?;
            Zone::build(&builder, level, &members[level], local, *locality, settings)
        });
        Self {
            version: snapshot.version(),
            local_version: local.as_ref().map_or(0, |(l, _)| l.version()),
            zone,
            fail_on_panic: settings.zone_aware.fail_traffic_on_panic && !policy.hashes(),
            ramp_until,
            targets: targets.into_boxed_slice(),
            levels,
            panic,
            priorities: priorities.into_boxed_slice(),
            availability: loads.availability.into_boxed_slice(),
        }
    }

    /// The round-robin position of the source with this key.
    fn cursor(&self, key: SourceKey) -> Option<u64> {
        self.levels
            .iter()
            .flat_map(|l| [&l.healthy, &l.degraded, &l.all])
            .flatten()
            .flat_map(|group| match group {
                Group::Flat(source) => std::slice::from_ref(source),
                Group::Localities { sources, .. } => sources,
            })
            .find(|s| s.key == key)
            .map(|s| s.cursor.0.load(Ordering::Relaxed))
    }

    #[inline]
    fn pick(&self, hash_key: Option<u64>) -> Option<Picked> {
        let target = match &*self.targets {
            [(_, only)] => *only,
            [] => return None,
            targets => {
                // As Envoy's choosePriority: the hash key (or a random number) modulo 100
                // decides, so one key keeps going to the same level and kind.
                let bucket = (hash_key.unwrap_or_else(rng::next_u64) % 100 + 1) as u32;
                targets
                    .iter()
                    .find(|(upto, _)| bucket <= *upto)
                    .map_or(targets[targets.len() - 1].1, |(_, t)| *t)
            }
        };
        self.pick_at(target, hash_key)
    }

    /// A pick with the levels of the `excluded` priorities left out of the loads (Envoy's
    /// `previous_priorities`); as [`pick`](Self::pick) when that leaves nothing available.
    #[cold]
    fn pick_excluding(&self, hash_key: Option<u64>, excluded: &[u32]) -> Option<Picked> {
        let mask: Vec<bool> = self
            .priorities
            .iter()
            .map(|p| excluded.contains(p))
            .collect();
        if !mask.contains(&true) {
            return self.pick(hash_key);
        }
        let Some((healthy, degraded)) = priority::excluding(&self.availability, &mask) else {
            return self.pick(hash_key);
        };
        let bucket = (hash_key.unwrap_or_else(rng::next_u64) % 100 + 1) as u32;
        let mut upto = 0;
        for (is_degraded, loads) in [(false, &healthy), (true, &degraded)] {
            for (level, load) in loads.iter().enumerate() {
                upto += load;
                if *load > 0 && bucket <= upto {
                    let target = Target {
                        level,
                        degraded: is_degraded,
                    };
                    return self.pick_at(target, hash_key);
                }
            }
        }
        self.pick(hash_key)
    }

    #[inline]
    fn pick_at(&self, target: Target, hash_key: Option<u64>) -> Option<Picked> {
        let level = &self.levels[target.level];
        if level.panic && self.fail_on_panic {
            return None;
        }
        let mut unrouted = None;
        if let Some(zone) = &self.zone
            && zone.level == target.level
            && !level.panic
        {
            match zone.pick(target.degraded, self.fail_on_panic, hash_key) {
                ZonePick::Routed(picked) => return picked,
                ZonePick::Unrouted => {}
                ZonePick::LocalClusterInPanic => unrouted = Some(ZoneRoute::LocalClusterNotOk),
            }
        }
        let group = if level.panic {
            &level.all
        } else if target.degraded {
            &level.degraded
        } else {
            &level.healthy
        };
        let picked = group.as_ref()?.pick(hash_key);
        match unrouted {
            Some(route) => picked.map(|p| p.routed(route)),
            None => picked,
        }
    }
}

/// Zone-aware routing over priority 0: its plan, and a source per locality and kind.
struct Zone {
    level: usize,
    plan: Plan,
    routing_enabled: u32,
    /// By the plan's localities.
    healthy: Box<[Option<Source>]>,
    degraded: Box<[Option<Source>]>,
}

impl Zone {
    fn build<C: Fn(SourceKey) -> u64>(
        builder: &GroupBuilder<'_, C>,
        level: usize,
        members: &[usize],
        local: &Snapshot,
        locality: u32,
        settings: &LbSettings,
    ) -> Option<Box<Zone>> {
        let entries = builder.entries;
        let level_entries = members.iter().map(|&i| &entries[i]);
        let local_entries = local.entries().iter().filter(|e| e.spec.priority == 0);
        let plan = zone::plan(
            level_entries,
            local_entries,
            locality,
            &settings.zone_aware,
            settings.panic_threshold,
        );
        let sources = |kind: u8, health: Health| -> Box<[Option<Source>]> {
            if !plan.routes() {
                return Box::default();
            }
            plan.localities
                .iter()
                .map(|&l| {
                    let positions: Vec<usize> = members
                        .iter()
                        .copied()
                        .filter(|&i| {
                            entries[i].spec.locality == l && entries[i].spec.health == health
                        })
                        .collect();
                    let key = SourceKey {
                        level,
                        kind,
                        locality: Some(l),
                    };
                    (!positions.is_empty()).then(|| builder.source(key, &positions))
                })
                .collect()
        };
        Some(Box::new(Zone {
            level,
            routing_enabled: settings.zone_aware.routing_enabled,
            healthy: sources(HEALTHY, Health::Healthy),
            degraded: sources(DEGRADED, Health::Degraded),
            plan,
        }))
    }

    /// A pick routed by zone, or why this one is not.
    #[inline]
    fn pick(&self, degraded: bool, fail_on_panic: bool, hash_key: Option<u64>) -> ZonePick {
        if !self.plan.routes() {
            return ZonePick::Unrouted;
        }
        if self.routing_enabled < 100 && rng::next_u64() % 100 >= u64::from(self.routing_enabled) {
            return ZonePick::Unrouted;
        }
        if self.plan.local_in_panic {
            if fail_on_panic {
                return ZonePick::Routed(None);
            }
            return ZonePick::LocalClusterInPanic;
        }
        let (locality, route) = self.plan.choose();
        let sources = if degraded {
            &self.degraded
        } else {
            &self.healthy
        };
        // As Envoy: a locality without hosts of the kind yields no host.
        let picked = sources
            .get(locality)
            .and_then(Option::as_ref)
            .and_then(|s| s.pick(hash_key))
            .map(|p| p.routed(route));
        ZonePick::Routed(picked)
    }
}

enum ZonePick {
    /// Routed by zone: the host, or none (a locality without hosts of the kind, or the
    /// local cluster in panic with `fail_traffic_on_panic`).
    Routed(Option<Picked>),
    /// Not routed by zone (routing off, or this request not in `routing_enabled`).
    Unrouted,
    /// Not routed by zone: the local cluster is in panic.
    LocalClusterInPanic,
}

/// Each host's weight for the tables, and when to raise them again: the configured weights,
/// or with a host in slow start every weight times [`slow_start::SCALE`], the ramping hosts'
/// scaled down by their factor.
fn ramped_weights(
    entries: &[Entry],
    slow_start: Option<&SlowStart>,
) -> (Vec<u32>, Option<Instant>) {
    let configured = || entries.iter().map(|e| e.spec.weight).collect();
    let Some(slow_start) = slow_start else {
        return (configured(), None);
    };
    let now = Instant::now();
    let factor = |e: &Entry| match e.healthy_since {
        Some(since) if e.spec.health == Health::Healthy => {
            slow_start.factor(now.saturating_duration_since(since))
        }
        _ => 1.0,
    };
    if entries.iter().all(|e| factor(e) >= 1.0) {
        return (configured(), None);
    }
    let weights = entries
        .iter()
        .map(|e| {
            let scaled = f64::from(e.spec.weight) * slow_start::SCALE * factor(e);
            scaled.round().clamp(1.0, f64::from(u32::MAX)) as u32
        })
        .collect();
    (weights, Some(now + slow_start.step()))
}

/// Builds a level's groups.
struct GroupBuilder<'a, C: Fn(SourceKey) -> u64> {
    entries: &'a [Entry],
    /// Each entry's weight for the tables (slow start scales them).
    weights: &'a [u32],
    policy: &'a LbPolicy,
    settings: &'a LbSettings,
    cursor: &'a C,
}

impl<C: Fn(SourceKey) -> u64> GroupBuilder<'_, C> {
    fn flat(&self, level: usize, kind: u8, positions: &[usize]) -> Option<Group> {
        let key = SourceKey {
            level,
            kind,
            locality: None,
        };
        (!positions.is_empty()).then(|| Group::Flat(self.source(key, positions)))
    }

    /// `positions`: the hosts of this kind; `level_hosts`: every host of the level, whose
    /// count per locality is what a locality's health is measured against.
    fn group(
        &self,
        level: usize,
        kind: u8,
        positions: &[usize],
        level_hosts: &[usize],
    ) -> Option<Group> {
        if !self.settings.locality_weighted {
            return self.flat(level, kind, positions);
        }
        if self.policy.hashes() {
            return self.hashed_by_locality(level, kind, positions);
        }
        let spec = |i: usize| &self.entries[i].spec;
        let mut localities: Vec<u32> = level_hosts.iter().map(|&i| spec(i).locality).collect();
        localities.sort_unstable();
        localities.dedup();
        let mut weights = Vec::new();
        let mut sources = Vec::new();
        for locality in localities {
            let eligible: Vec<usize> = positions
                .iter()
                .copied()
                .filter(|&i| spec(i).locality == locality)
                .collect();
            let mut members = level_hosts
                .iter()
                .filter(|&&i| spec(i).locality == locality);
            let hosts = members.clone().count();
            let weight = members.next().map_or(0, |&i| spec(i).locality_weight);
            let weight = locality::effective_weight(
                weight,
                eligible.len(),
                hosts,
                self.settings.overprovisioning_factor,
            );
            if weight > 0.0 {
                weights.push(weight);
                let key = SourceKey {
                    level,
                    kind,
                    locality: Some(locality),
                };
                sources.push(self.source(key, &eligible));
            }
        }
        match sources.len() {
            // No locality has weight and available hosts: as Envoy, balance over the kind.
            0 => self.flat(level, kind, positions),
            _ => Some(Group::Localities {
                alias: Alias::from_weights(&weights),
                sources: sources.into_boxed_slice(),
            }),
        }
    }

    /// A hashing policy's source with locality weighting (Envoy's thread-aware balancers):
    /// each host weighs `locality weight / all localities' x host weight / its locality's`,
    /// so that one key still maps to one host of the whole level. Hosts of localities without
    /// weight get none.
    fn hashed_by_locality(&self, level: usize, kind: u8, positions: &[usize]) -> Option<Group> {
        let spec = |i: usize| &self.entries[i].spec;
        let mut localities: Vec<(u32, u64, u64)> = Vec::new(); // (locality, its weight, host weights)
        for &i in positions {
            let s = spec(i);
            match localities.iter_mut().find(|(l, _, _)| *l == s.locality) {
                Some((_, _, hosts)) => *hosts += u64::from(self.weights[i]),
                None => localities.push((
                    s.locality,
                    u64::from(s.locality_weight),
                    u64::from(self.weights[i]),
                )),
            }
        }
        let total: u64 = localities.iter().map(|(_, w, _)| w).sum();
        if total == 0 {
            return self.flat(level, kind, positions);
        }
        let mut weights = self.weights.to_vec();
        let mut kept = Vec::with_capacity(positions.len());
        for &i in positions {
            let Some(&(_, locality, hosts)) =
                localities.iter().find(|(l, _, _)| *l == spec(i).locality)
            else {
                continue;
            };
            if locality == 0 || hosts == 0 {
                continue;
            }
            let share = locality as f64 / total as f64 * f64::from(self.weights[i]) / hosts as f64;
            // A million steps keep the ratio to a millionth of the level's load.
            weights[i] = (share * 1_000_000.0)
                .round()
                .clamp(1.0, f64::from(u32::MAX)) as u32;
            kept.push(i);
        }
        if kept.is_empty() {
            return None;
        }
        let key = SourceKey {
            level,
            kind,
            locality: None,
        };
        let source = Source::build(
            self.entries,
            &weights,
            &kept,
            self.policy,
            key,
            (self.cursor)(key),
        );
        Some(Group::Flat(source))
    }

    fn source(&self, key: SourceKey, positions: &[usize]) -> Source {
        Source::build(
            self.entries,
            self.weights,
            positions,
            self.policy,
            key,
            (self.cursor)(key),
        )
    }
}

impl Group {
    #[inline]
    fn pick(&self, hash_key: Option<u64>) -> Option<Picked> {
        match self {
            Group::Flat(source) => source.pick(hash_key),
            Group::Localities { alias, sources } => {
                sources[alias.sample(rng::next_u64())].pick(hash_key)
            }
        }
    }
}

/// The hosts of one source and the policy's table over them.
struct Source {
    members: Box<[Member]>,
    table: Table,
    key: SourceKey,
    /// The round-robin position: the one word every round-robin pick writes.
    cursor: Cursor,
}

enum Table {
    RoundRobin(round_robin::Schedule),
    LeastRequest(least_request::Chooser),
    Random(random::Chooser),
    RingHash(ring_hash::Ring),
    Maglev(maglev::Table),
}

impl Source {
    fn build(
        entries: &[Entry],
        weights: &[u32],
        positions: &[usize],
        policy: &LbPolicy,
        key: SourceKey,
        cursor: u64,
    ) -> Self {
        let members: Box<[Member]> = positions
            .iter()
            .map(|&i| Member {
                host: Arc::clone(&entries[i].host),
                index: i,
                weight: weights[i],
                priority: entries[i].spec.priority,
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
            key,
            cursor: Cursor(AtomicU64::new(cursor)),
        }
    }

    #[inline]
    fn pick(&self, hash_key: Option<u64>) -> Option<Picked> {
        let position = match &self.table {
            Table::RoundRobin(schedule) => schedule.pick(&self.cursor.0),
            Table::LeastRequest(chooser) => chooser.pick(&self.members),
            Table::Random(chooser) => chooser.pick(self.members.len()),
            Table::RingHash(ring) => ring.pick(hash_key.unwrap_or_else(rng::next_u64)),
            Table::Maglev(table) => table.pick(hash_key.unwrap_or_else(rng::next_u64)),
        };
        let member = self.members.get(position)?;
        Some(Picked::new(&member.host, member.index, member.priority))
    }
}
