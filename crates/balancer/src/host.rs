//! Hosts and the live host set.
//!
//! A [`HostSet`] is a cheap-to-clone handle on an immutable [`Snapshot`] published through
//! `arc-swap`: writers (health checks, service discovery) build a new snapshot and swap it in,
//! readers (balancers) keep picking from whatever snapshot they loaded, so updates never stop a
//! pick. The per-host state that must outlive snapshots (the in-flight request count) lives in
//! a shared [`Host`], which an update carries over to the new snapshot for every address that
//! stays.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::BuildError;

/// A host's health, as health checking and outlier detection report it.
///
/// Balancing follows Envoy: picks go to healthy hosts; degraded hosts get traffic only when
/// too few hosts are healthy (see [`LoadBalancer`](crate::LoadBalancer)); unhealthy and ejected
/// hosts get none, unless the set is in panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Health {
    /// Serving normally.
    #[default]
    Healthy,
    /// Serving, but should be used only when healthy hosts cannot carry the load.
    Degraded,
    /// Failed health checks.
    Unhealthy,
    /// Removed from rotation by outlier detection; counted like [`Health::Unhealthy`].
    Ejected,
    /// On its way out (Envoy's EDS `DRAINING`): left out of the counts a level's health is
    /// measured by, and picked only when its level is in panic.
    Draining,
}

impl Health {
    fn to_u8(self) -> u8 {
        match self {
            Health::Healthy => 0,
            Health::Degraded => 1,
            Health::Unhealthy => 2,
            Health::Ejected => 3,
            Health::Draining => 4,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => Health::Healthy,
            1 => Health::Degraded,
            2 => Health::Unhealthy,
            3 => Health::Ejected,
            _ => Health::Draining,
        }
    }
}

/// What a caller says about one host: its address, weight, health, and where it stands
/// (priority, locality).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostSpec {
    /// The host's identity in the set: no two hosts share an address.
    pub addr: SocketAddr,
    /// Relative share of traffic, at least 1 (Envoy's `load_balancing_weight`).
    pub weight: u32,
    /// Current health.
    pub health: Health,
    /// Envoy's endpoint priority: 0 is served first; higher levels take the load the levels
    /// above cannot (see [`LoadBalancer`](crate::LoadBalancer)).
    pub priority: u32,
    /// The host's locality, as a number the caller gives each distinct locality (Envoy's
    /// region/zone/sub-zone); hosts without one share locality 0.
    pub locality: u32,
    /// The weight of the host's locality within its priority (Envoy's locality
    /// `load_balancing_weight`; 0: none given). Used only with locality-weighted balancing,
    /// where a locality of weight 0 gets no load; hosts of one locality and priority give the
    /// same weight.
    pub locality_weight: u32,
}

impl HostSpec {
    /// A healthy host of weight 1, at priority 0, in locality 0.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            weight: 1,
            health: Health::Healthy,
            priority: 0,
            locality: 0,
            locality_weight: 0,
        }
    }

    /// The same host at another priority.
    pub fn with_priority(mut self, priority: u32) -> Self {
        self.priority = priority;
        self
    }

    /// The same host in locality `locality`, whose weight is `weight`.
    pub fn with_locality(mut self, locality: u32, weight: u32) -> Self {
        self.locality = locality;
        self.locality_weight = weight;
        self
    }

    /// The same host with another weight.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The same host with another health.
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }
}

impl From<SocketAddr> for HostSpec {
    fn from(addr: SocketAddr) -> Self {
        Self::new(addr)
    }
}

/// One host's shared state: its address, its latest published weight and health, and the
/// number of requests in flight to it (counted by [`Picked`] guards, across every balancer
/// that picks from the same [`HostSet`]).
pub struct Host {
    addr: SocketAddr,
    weight: AtomicU32,
    health: AtomicU8,
    // Relaxed everywhere: the count is a load signal, read racily by design (as Envoy's
    // rq_active stat is); no other memory is published through it.
    active: AtomicU64,
}

impl Host {
    fn new(spec: &HostSpec) -> Self {
        Self {
            addr: spec.addr,
            weight: AtomicU32::new(spec.weight),
            health: AtomicU8::new(spec.health.to_u8()),
            active: AtomicU64::new(0),
        }
    }

    fn publish(&self, spec: &HostSpec) {
        self.weight.store(spec.weight, Ordering::Relaxed);
        self.health.store(spec.health.to_u8(), Ordering::Relaxed);
    }

    /// The host's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The weight in the latest published snapshot.
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// The health in the latest published snapshot.
    pub fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::Relaxed))
    }

    /// Requests picked for this host whose [`Picked`] guard is still alive.
    pub fn active_requests(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host")
            .field("addr", &self.addr)
            .field("weight", &self.weight())
            .field("health", &self.health())
            .field("active_requests", &self.active_requests())
            .finish()
    }
}

/// One host as a snapshot saw it: the shared state plus the spec at publication (weight,
/// health, priority, locality), which is what balancers build their tables from.
#[derive(Clone)]
pub(crate) struct Entry {
    pub(crate) host: Arc<Host>,
    pub(crate) spec: HostSpec,
    /// When the host joined the set or last passed its health checks again (slow start's
    /// start); `None` for hosts the set began with.
    pub(crate) healthy_since: Option<Instant>,
}

/// An immutable view of the host set at one version.
pub struct Snapshot {
    version: u64,
    entries: Box<[Entry]>,
}

impl Snapshot {
    /// Increases by one with every published change; balancers rebuild their tables when it
    /// moves.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The number of hosts, whatever their health.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the set has no hosts.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The host at `index`, in the order of the list last given to [`HostSet::new`] or
    /// [`HostSet::update`] (the same index a [`Picked`] reports).
    pub fn get(&self, index: usize) -> Option<&Host> {
        self.entries.get(index).map(|e| &*e.host)
    }

    /// The hosts in list order.
    pub fn hosts(&self) -> impl ExactSizeIterator<Item = &Host> + '_ {
        self.entries.iter().map(|e| &*e.host)
    }

    /// The index of the host with this address.
    pub fn position(&self, addr: SocketAddr) -> Option<usize> {
        self.entries.iter().position(|e| e.host.addr == addr)
    }

    /// The hosts as specs (address, weight and health as of this snapshot).
    pub fn specs(&self) -> Vec<HostSpec> {
        self.entries.iter().map(|e| e.spec).collect()
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("version", &self.version)
            .field("hosts", &self.specs())
            .finish()
    }
}

/// The live set of hosts a balancer picks from: a cheap-to-clone, `Send + Sync` handle.
///
/// Clones share the same set, so one `HostSet` can feed a shared [`LoadBalancer`] and any
/// number of per-worker ones; every change is seen by all of them at their next pick.
///
/// [`LoadBalancer`]: crate::LoadBalancer
#[derive(Clone)]
pub struct HostSet {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<Snapshot>,
    // Mirrors `current.version`, so a balancer can see that its tables are current with one
    // plain atomic load instead of an arc-swap load on every pick.
    version: AtomicU64,
    // Serializes writers (read-modify-write of the snapshot); readers never take it.
    writer: Mutex<()>,
    #[cfg(feature = "metrics")]
    updates: metrics::Counter,
}

impl HostSet {
    /// A set of these hosts (possibly none: picks from an empty set return `None`).
    pub fn new(hosts: Vec<HostSpec>) -> Result<Self, BuildError> {
        validate(&hosts)?;
        let entries = hosts
            .iter()
            .map(|spec| Entry {
                host: Arc::new(Host::new(spec)),
                spec: *spec,
                healthy_since: None,
            })
            .collect();
        let snapshot = Snapshot {
            version: 0,
            entries,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(snapshot),
                version: AtomicU64::new(0),
                writer: Mutex::new(()),
                #[cfg(feature = "metrics")]
                updates: crate::meters::host_set_updates(),
            }),
        })
    }

    /// Replaces the host list. Hosts whose address stays keep their shared state (in-flight
    /// count); their weight and health take the new values. Concurrent picks go on from the
    /// previous snapshot until they see this one.
    pub fn update(&self, hosts: Vec<HostSpec>) -> Result<(), BuildError> {
        validate(&hosts)?;
        let _writer = self.lock_writer();
        let old = self.inner.current.load_full();
        let mut kept: HashMap<SocketAddr, &Entry> =
            old.entries.iter().map(|e| (e.host.addr, e)).collect();
        let now = Instant::now();
        let entries = hosts
            .iter()
            .map(|spec| match kept.remove(&spec.addr) {
                Some(entry) => {
                    entry.host.publish(spec);
                    Entry {
                        host: Arc::clone(&entry.host),
                        spec: *spec,
                        healthy_since: healthy_since(entry, spec.health, now),
                    }
                }
                None => Entry {
                    host: Arc::new(Host::new(spec)),
                    spec: *spec,
                    healthy_since: Some(now),
                },
            })
            .collect();
        self.publish(old.version + 1, entries);
        Ok(())
    }

    /// Sets one host's health. Returns false (and publishes nothing) when no host has this
    /// address.
    pub fn set_health(&self, addr: SocketAddr, health: Health) -> bool {
        self.modify(addr, |spec| spec.health = health)
    }

    /// Sets one host's weight. Returns `Ok(false)` when no host has this address.
    pub fn set_weight(&self, addr: SocketAddr, weight: u32) -> Result<bool, BuildError> {
        if weight == 0 {
            return Err(BuildError::ZeroWeight { addr });
        }
        Ok(self.modify(addr, |spec| spec.weight = weight))
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.current.load_full()
    }

    /// The current snapshot's version.
    #[inline]
    pub fn version(&self) -> u64 {
        // Acquire pairs with the Release store in `publish`: whoever sees the new number also
        // sees the snapshot stored before it.
        self.inner.version.load(Ordering::Acquire)
    }

    fn modify(&self, addr: SocketAddr, change: impl FnOnce(&mut HostSpec)) -> bool {
        let _writer = self.lock_writer();
        let old = self.inner.current.load_full();
        let Some(index) = old.position(addr) else {
            return false;
        };
        let mut entries: Vec<Entry> = old.entries.to_vec();
        let entry = &mut entries[index];
        change(&mut entry.spec);
        entry.healthy_since = healthy_since(&old.entries[index], entry.spec.health, Instant::now());
        entry.host.publish(&entry.spec);
        self.publish(old.version + 1, entries);
        true
    }

    fn publish(&self, version: u64, entries: Vec<Entry>) {
        self.inner.current.store(Arc::new(Snapshot {
            version,
            entries: entries.into_boxed_slice(),
        }));
        self.inner.version.store(version, Ordering::Release);
        #[cfg(feature = "metrics")]
        self.inner.updates.increment(1);
    }

    fn lock_writer(&self) -> std::sync::MutexGuard<'_, ()> {
        // The guarded data is `()`: a writer that panicked left nothing half-written.
        self.inner
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for HostSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HostSet").field(&self.snapshot()).finish()
    }
}

/// Slow start's start for a host that stays: now if it passes its checks again (unhealthy
/// before, healthy now), else what it was. A host back from an ejection does not ramp.
fn healthy_since(old: &Entry, health: Health, now: Instant) -> Option<Instant> {
    if old.spec.health == Health::Unhealthy && health == Health::Healthy {
        Some(now)
    } else {
        old.healthy_since
    }
}

fn validate(hosts: &[HostSpec]) -> Result<(), BuildError> {
    if u32::try_from(hosts.len()).is_err() {
        return Err(BuildError::TooManyHosts { count: hosts.len() });
    }
    let mut seen = HashSet::with_capacity(hosts.len());
    for spec in hosts {
        if spec.weight == 0 {
            return Err(BuildError::ZeroWeight { addr: spec.addr });
        }
        if !seen.insert(spec.addr) {
            return Err(BuildError::DuplicateHost { addr: spec.addr });
        }
    }
    Ok(())
}

/// How a pick was routed by zone (Envoy's `lb_zone_*` counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneRoute {
    /// The local locality takes everything (`lb_zone_routing_all_directly`).
    AllDirectly,
    /// Kept local by the sampled share (`lb_zone_routing_sampled`).
    Sampled,
    /// Sent to another locality (`lb_zone_routing_cross_zone`).
    CrossZone,
    /// Sent to a random locality: no locality had spare capacity
    /// (`lb_zone_no_capacity_left`; also counted as cross-zone).
    NoCapacityLeft,
    /// Not routed by zone: the local cluster is in panic (`lb_local_cluster_not_ok`).
    LocalClusterNotOk,
}

/// A host chosen by [`LoadBalancer::pick`](crate::LoadBalancer::pick), counted as one request
/// in flight to it until this guard is dropped. Hold it for as long as the request runs.
#[must_use = "the request ends (and the host's in-flight count drops) when the guard is dropped"]
pub struct Picked {
    host: Arc<Host>,
    index: usize,
    priority: u32,
    zone: Option<ZoneRoute>,
}

impl Picked {
    #[inline]
    pub(crate) fn new(host: &Arc<Host>, index: usize, priority: u32) -> Self {
        host.active.fetch_add(1, Ordering::Relaxed);
        Self {
            host: Arc::clone(host),
            index,
            priority,
            zone: None,
        }
    }

    /// The same pick, noted as routed by zone this way.
    #[inline]
    pub(crate) fn routed(mut self, route: ZoneRoute) -> Self {
        self.zone = Some(route);
        self
    }

    /// How zone-aware routing chose the host's locality; `None` when it played no part.
    pub fn zone_route(&self) -> Option<ZoneRoute> {
        self.zone
    }

    /// The priority level the host was picked at.
    pub fn priority(&self) -> u32 {
        self.priority
    }

    /// The chosen host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The chosen host's address.
    pub fn addr(&self) -> SocketAddr {
        self.host.addr
    }

    /// The host's index in the snapshot it was picked from (the host list's order).
    pub fn index(&self) -> usize {
        self.index
    }
}

/// A pick made ahead of its request ([`LoadBalancer::peek`](crate::LoadBalancer::peek)):
/// the host, without its in-flight mark until a pick takes it.
pub(crate) struct Ahead {
    host: Arc<Host>,
    index: usize,
    priority: u32,
    zone: Option<ZoneRoute>,
}

impl Picked {
    /// The same pick kept for later, its in-flight mark given back meanwhile.
    pub(crate) fn into_ahead(self) -> Ahead {
        let ahead = Ahead {
            host: Arc::clone(&self.host),
            index: self.index,
            priority: self.priority,
            zone: self.zone,
        };
        drop(self);
        ahead
    }
}

impl Ahead {
    /// The pick, marked in flight again.
    pub(crate) fn take(self) -> Picked {
        let picked = Picked::new(&self.host, self.index, self.priority);
        match self.zone {
            Some(route) => picked.routed(route),
            None => picked,
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.host.addr
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }
}

impl Deref for Picked {
    type Target = Host;

    fn deref(&self) -> &Host {
        &self.host
    }
}

impl Drop for Picked {
    #[inline]
    fn drop(&mut self) {
        self.host.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for Picked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Picked")
            .field("index", &self.index)
            .field("host", &*self.host)
            .finish()
    }
}
