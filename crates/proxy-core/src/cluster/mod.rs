//! A cluster as one worker sees it: its hosts' connection pools and the load balancer that
//! picks among them. The host set (health, weights, requests in flight) is shared by every
//! worker's balancer; the pools are the worker's own.
//!
//! ```text
//! forward.rs     pick a host, take a max_requests slot, send under the route's timeout
//! retry.rs       send again on another host, as the retry policy and max_retries allow
//! admission.rs   the max_requests slot, and the pending queue under max_connections
//! host.rs        one host on one worker: send a try, report its outcome
//! h1_pool.rs     HTTP/1.1 keep-alive connections    h2_conn.rs   the HTTP/2 connection
//! h1_conn.rs     one HTTP/1.1 connection on crates/h1, driven by the request using it
//! connect.rs     TCP and TLS within connect_timeout  body.rs      the response body
//! breaker.rs     the four circuit breakers           health.rs    outlier ejection, health
//! health_check.rs  active health checks (HTTP, gRPC, TCP), as the monitor runs them
//! health_events.rs the health-check event log
//! shared.rs      what all workers share              monitor.rs   health checks, headroom
//! dns.rs         names among the endpoints, resolved and followed (STRICT_DNS)
//! locality.rs    one number per locality name, for the whole process
//! upgrade.rs     upgrade requests, each on a connection of its own
//! preconnect.rs  connections opened ahead of requests (preconnect_policy)
//! request_form.rs  the request head as HTTP/1.1 or HTTP/2 writes it
//! ```

mod admission;
mod body;
mod breaker;
mod connect;
mod dns;
mod forward;
mod h1_conn;
mod h1_pool;
mod h2_conn;
mod health;
mod health_check;
mod health_events;
mod host;
pub(crate) mod locality;
pub(crate) mod monitor;
mod preconnect;
mod request_form;
mod retry;
mod settings;
mod shared;
mod tcp;
mod upgrade;

use std::cell::{Cell, OnceCell, RefCell};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;

use balancer::{LbPolicy, LbSettings, LoadBalancer, LocalCluster, Picked, ZoneRoute, ZoneRouting};
use http::HeaderMap;

use crate::catalog::{Catalog, ClusterStats, EndpointStats, HostStats};
pub use body::UpstreamBody;
use config::{ClusterConfig, HashKey};
pub use dns::DnsError;
pub(crate) use forward::Admitted;
pub(crate) use host::HostPool;
pub(crate) use request_form::{HeadFields, write_request_for};
pub(crate) use retry::{
    CountAttempts, CountAttemptsInResponse, X_ENVOY_ATTEMPT_COUNT, answer_retriable,
    connect_failure_retriable, reset_retriable,
};
use settings::UpstreamSettings;
pub(crate) use shared::SharedCluster;
pub(crate) use tcp::TcpUpstream;

pub(crate) struct Cluster {
    /// The worker's pools for the host set's hosts, in the set's order as of `version`.
    pools: RefCell<Pools>,
    /// Replaced, keeping the pools, when the local cluster is.
    balancer: RefCell<LoadBalancer>,
    /// The local cluster this one routes by zone from, and this proxy's locality, if any.
    local: RefCell<Option<(Arc<SharedCluster>, u32)>>,
    /// The balancer's rebuilds counted so far, with zone routing (its recalculation stats).
    zone_rebuilds: Cell<Option<u64>>,
    hash_key: Option<HashKey>,
    /// What requests are hashed on, over their routes' policies.
    hash_policy: Option<config::hash_policy::HashPolicy>,
    settings: Rc<UpstreamSettings>,
    /// Made by the first request this worker sends to the cluster: of a management server's
    /// thousand clusters, a worker serves few, and each one's series cost kilobytes.
    stats: OnceCell<Rc<ClusterStats>>,
    /// Stats of hosts that a previous version of this cluster (same name) had made, each taken
    /// by its host's pool when that is made: a changed cluster's hosts count on, and are not
    /// retired for want of a request meanwhile. Only hosts of the set are kept.
    inherited: RefCell<Vec<InheritedHost>>,
    /// For the cluster's stats and those of its hosts.
    catalog: Catalog,
    shard: stats::Shard,
}

/// A host's stats handles, from a previous version of its cluster.
#[derive(Clone)]
struct InheritedHost {
    addr: SocketAddr,
    stats: Rc<HostStats>,
    per_endpoint: Option<Rc<EndpointStats>>,
}

struct Pools {
    /// The host set's version these pools follow.
    version: u64,
    /// Each host of the set, with its pool once a request has gone to it: a host this worker
    /// never sends to (most of a large fleet's) holds no pool and no stats here.
    hosts: Vec<(SocketAddr, Option<Rc<HostPool>>)>,
}

impl Cluster {
    /// `local`: the local cluster and this proxy's locality (zone-aware routing).
    pub(crate) fn new(
        config: &ClusterConfig,
        shared: &Arc<SharedCluster>,
        local: Option<(&Arc<SharedCluster>, &str)>,
        catalog: &Catalog,
        shard: &stats::Shard,
    ) -> Self {
        let settings = Rc::new(UpstreamSettings::new(config, Arc::clone(shared)));
        let local = local_of(local);
        let balancer = balancer_for(
            &shared.host_set,
            config.lb_policy,
            config.lb_settings,
            local.as_ref(),
        );
        let cluster = Self {
            pools: RefCell::new(Pools {
                version: u64::MAX,
                hosts: Vec::new(),
            }),
            zone_rebuilds: Cell::new(local.is_some().then_some(u64::MAX)),
            balancer: RefCell::new(balancer),
            local: RefCell::new(local),
            hash_key: config.hash_key.clone(),
            hash_policy: config.hash_policy.clone(),
            settings,
            stats: OnceCell::new(),
            inherited: RefCell::new(Vec::new()),
            catalog: *catalog,
            shard: shard.clone(),
        };
        cluster.sync_pools();
        cluster
    }

    pub(crate) fn stats(&self) -> &ClusterStats {
        self.shared_stats()
    }

    /// Records into the handles of the cluster's previous version (same name) from now on:
    /// the cluster's, and those of its hosts that are still in the set.
    pub(crate) fn continue_stats(&self, previous: &Cluster) {
        if let Some(stats) = previous.stats.get() {
            let _ = self.stats.set(Rc::clone(stats));
        }
        let mut inherited: Vec<InheritedHost> = (previous.pools.borrow().hosts.iter())
            .filter_map(|(addr, pool)| {
                let pool = pool.as_ref()?;
                Some(InheritedHost {
                    addr: *addr,
                    stats: Rc::clone(&pool.host_stats),
                    per_endpoint: pool.endpoint_stats.clone(),
                })
            })
            .collect();
        for host in previous.inherited.borrow().iter() {
            if inherited.iter().all(|h| h.addr != host.addr) {
                inherited.push(host.clone());
            }
        }
        let pools = self.pools.borrow();
        inherited.retain(|h| pools.hosts.iter().any(|(addr, _)| *addr == h.addr));
        *self.inherited.borrow_mut() = inherited;
    }

    /// The stats handles of a host whose pool is being made: inherited, or new.
    fn host_stats(&self, addr: SocketAddr) -> (Rc<HostStats>, Option<Rc<EndpointStats>>) {
        let (cluster, host) = (&self.settings.shared.name, addr.to_string());
        let inherited = {
            let mut list = self.inherited.borrow_mut();
            let at = list.iter().position(|h| h.addr == addr);
            at.map(|i| list.swap_remove(i))
        };
        let (stats, per_endpoint) = match inherited {
            Some(host) => (host.stats, host.per_endpoint),
            None => (
                Rc::new(self.catalog.host(&self.shard, cluster, &host)),
                None,
            ),
        };
        let per_endpoint = self.settings.per_endpoint_stats.then(|| {
            per_endpoint
                .unwrap_or_else(|| Rc::new(self.catalog.endpoint(&self.shard, cluster, &host)))
        });
        (stats, per_endpoint)
    }

    fn shared_stats(&self) -> &Rc<ClusterStats> {
        self.stats.get_or_init(|| {
            Rc::new(
                self.catalog
                    .cluster(&self.shard, &self.settings.shared.name),
            )
        })
    }

    /// The cluster's `per_connection_buffer_limit_bytes`.
    pub(crate) fn buffer_limit(&self) -> usize {
        self.settings.buffer_limit
    }

    /// Whether this cluster routes by zone from `local` (the same local cluster and
    /// locality, or none).
    pub(crate) fn has_local(&self, local: Option<(&Arc<SharedCluster>, &str)>) -> bool {
        match (&*self.local.borrow(), local) {
            (None, None) => true,
            (Some((a, id)), Some((b, name))) => {
                Arc::ptr_eq(a, b) && *id == locality::id(Some(name))
            }
            _ => false,
        }
    }

    /// Routes by zone from `local` from now on (or not at all): a new balancer over the same
    /// hosts, the pools kept.
    pub(crate) fn set_local(&self, local: Option<(&Arc<SharedCluster>, &str)>) {
        let local = local_of(local);
        let balancer = {
            let current = self.balancer.borrow();
            balancer_for(
                current.hosts(),
                *current.policy(),
                *current.settings(),
                local.as_ref(),
            )
        };
        *self.balancer.borrow_mut() = balancer;
        self.zone_rebuilds.set(local.is_some().then_some(u64::MAX));
        *self.local.borrow_mut() = local;
    }

    /// The shared state this worker's cluster was built on.
    pub(crate) fn shared(&self) -> &Arc<SharedCluster> {
        &self.settings.shared
    }

    /// Follows the host set after its hosts changed (a reload, DNS): hosts that stayed keep
    /// their pools and connections; a removed host's pool is dropped, so its idle connections
    /// close and busy ones close when their request is done.
    pub(crate) fn sync_pools(&self) {
        let host_set = &self.settings.shared.host_set;
        if self.pools.borrow().version == host_set.version() {
            return; // one atomic load when nothing changed
        }
        let snapshot = host_set.snapshot();
        let mut pools = self.pools.borrow_mut();
        if pools.version == snapshot.version() {
            return;
        }
        let hosts = snapshot
            .hosts()
            .map(|host| {
                let addr = host.addr();
                let pool = pools
                    .hosts
                    .iter()
                    .find(|(a, _)| *a == addr)
                    .and_then(|(_, pool)| pool.clone());
                (addr, pool)
            })
            .collect();
        *pools = Pools {
            version: snapshot.version(),
            hosts,
        };
        let hosts = &pools.hosts;
        (self.inherited.borrow_mut()).retain(|h| hosts.iter().any(|(addr, _)| *addr == h.addr));
    }

    /// Whether the cluster picks hosts by a request's hash (ring hash, maglev): only then is
    /// a route's hash policy worth evaluating.
    pub(crate) fn hashes(&self) -> bool {
        self.balancer.borrow().policy().hashes()
    }

    /// The cluster's own `hash_policy`, which a request is hashed on instead of its route's.
    pub(crate) fn hash_policy(&self) -> Option<&config::hash_policy::HashPolicy> {
        self.hash_policy.as_ref()
    }

    /// The hash a request is picked by: its route's (`route_hash`), else the cluster's own
    /// `hash_key`'s; `None` for a policy that does not hash.
    fn request_key(
        &self,
        headers: &HeaderMap,
        client: IpAddr,
        route_hash: Option<u64>,
    ) -> Option<u64> {
        if !self.hashes() {
            return None;
        }
        route_hash.or_else(|| {
            self.hash_key
                .as_ref()
                .and_then(|k| hash_of(k, headers, client))
        })
    }

    /// The host for the next request, counted as in flight on it while the guard lives.
    /// `None` when the cluster has no host to offer.
    fn pick(&self, key: Option<u64>) -> Option<(Rc<HostPool>, Picked)> {
        self.pick_excluding(key, &[])
    }

    /// As [`pick`](Self::pick), with the levels of the `excluded` priorities left out of the
    /// loads where others are available (a retry's `previous_priorities`).
    fn pick_excluding(&self, key: Option<u64>, excluded: &[u32]) -> Option<(Rc<HostPool>, Picked)> {
        let balancer = self.balancer.borrow();
        let picked = balancer.pick_excluding(key, excluded);
        if let Some(seen) = self.zone_rebuilds.get() {
            self.count_zone_recalculation(&balancer, seen);
        }
        drop(balancer);
        let picked = picked?;
        if let Some(route) = picked.zone_route() {
            self.count_zone_route(route);
        }
        if let Some(pool) = self.pool_of(&picked) {
            return Some((pool, picked));
        }
        // The host set changed since this worker built its pools.
        self.sync_pools();
        let pool = self.pool_of(&picked)?;
        Some((pool, picked))
    }

    /// Counts, once per rebuild of the balancer's tables, where zone routing was left (as
    /// Envoy counts each recalculation).
    #[cold]
    fn count_zone_recalculation(&self, balancer: &LoadBalancer, seen: u64) {
        let rebuilds = balancer.rebuilds();
        if rebuilds == seen {
            return;
        }
        self.zone_rebuilds.set(Some(rebuilds));
        let s = self.stats();
        s.lb_recalculate_zone_structures.inc();
        match balancer.zone_routing() {
            ZoneRouting::LocalClusterNotOk => s.lb_local_cluster_not_ok.inc(),
            ZoneRouting::ClusterTooSmall => s.lb_zone_cluster_too_small.inc(),
            _ => {}
        }
    }

    fn count_zone_route(&self, route: ZoneRoute) {
        let s = self.stats();
        match route {
            ZoneRoute::AllDirectly => s.lb_zone_routing_all_directly.inc(),
            ZoneRoute::Sampled => s.lb_zone_routing_sampled.inc(),
            ZoneRoute::CrossZone => s.lb_zone_routing_cross_zone.inc(),
            ZoneRoute::NoCapacityLeft => {
                s.lb_zone_routing_cross_zone.inc();
                s.lb_zone_no_capacity_left.inc();
            }
            ZoneRoute::LocalClusterNotOk => s.lb_local_cluster_not_ok.inc(),
        }
    }

    /// The pool of the picked host, made on its first request; `None` if the host is not in
    /// the set these pools follow.
    fn pool_of(&self, picked: &Picked) -> Option<Rc<HostPool>> {
        self.pool_at(picked.index(), picked.addr())
    }

    /// The pool of the host at `addr`, `index` in the host set; as [`pool_of`](Self::pool_of).
    fn pool_at(&self, index: usize, addr: SocketAddr) -> Option<Rc<HostPool>> {
        let mut pools = self.pools.borrow_mut();
        let slot = match pools.hosts.get(index) {
            Some((a, _)) if *a == addr => index,
            _ => pools.hosts.iter().position(|(a, _)| *a == addr)?,
        };
        let (_, pool) = &mut pools.hosts[slot];
        let pool = pool.get_or_insert_with(|| {
            let (host_stats, endpoint_stats) = self.host_stats(addr);
            Rc::new(HostPool::new(
                Rc::clone(self.shared_stats()),
                host_stats,
                endpoint_stats,
                addr,
                Rc::clone(&self.settings),
            ))
        });
        Some(Rc::clone(pool))
    }
}

/// The local cluster and this proxy's locality number.
fn local_of(local: Option<(&Arc<SharedCluster>, &str)>) -> Option<(Arc<SharedCluster>, u32)> {
    local.map(|(cluster, locality)| (Arc::clone(cluster), locality::id(Some(locality))))
}

fn balancer_for(
    hosts: &balancer::HostSet,
    policy: LbPolicy,
    settings: LbSettings,
    local: Option<&(Arc<SharedCluster>, u32)>,
) -> LoadBalancer {
    LoadBalancer::with_local_cluster(
        hosts.clone(),
        policy,
        settings,
        local.map(|(cluster, locality)| LocalCluster {
            hosts: cluster.host_set.clone(),
            locality: *locality,
        }),
    )
    .expect("the policy and settings were validated with the config")
}

/// The address as text (`10.0.0.1`, `::1`), hashed: Envoy's hash of a client address.
pub(crate) fn ip_hash(ip: IpAddr) -> u64 {
    use std::io::Write as _;
    let mut text = [0u8; 48];
    let mut at = &mut text[..];
    // An address's text fits: at most 45 bytes (IPv6 with an IPv4 tail).
    let _ = write!(at, "{ip}");
    let len = 48 - at.len();
    balancer::hash_key(&text[..len])
}

/// The hash of the request attribute a consistent-hashing cluster balances on. A request
/// without it hashes as if it had no key (the policy then picks like random).
pub(crate) fn hash_of(key: &HashKey, headers: &HeaderMap, client: IpAddr) -> Option<u64> {
    match key {
        HashKey::Header(name) => headers.get(name).map(|v| balancer::hash_key(v.as_bytes())),
        HashKey::Cookie(name) => config::cookie_value(headers, name).map(balancer::hash_key),
        HashKey::SourceIp => Some(match client {
            IpAddr::V4(ip) => balancer::hash_key(&ip.octets()),
            IpAddr::V6(ip) => balancer::hash_key(&ip.octets()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_and_headers_hash_their_values() {
        let mut headers = HeaderMap::new();
        headers.insert("cookie", "a=1; session=abc; b=2".parse().unwrap());
        headers.insert("x-user", "abc".parse().unwrap());
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let cookie = hash_of(&HashKey::Cookie("session".into()), &headers, ip);
        let header = hash_of(&HashKey::Header("x-user".parse().unwrap()), &headers, ip);
        assert_eq!(cookie, Some(balancer::hash_key(b"abc")));
        assert_eq!(cookie, header);
        assert_eq!(hash_of(&HashKey::Cookie("none".into()), &headers, ip), None);
        assert_eq!(
            hash_of(&HashKey::SourceIp, &headers, ip),
            Some(balancer::hash_key(&[10, 0, 0, 1]))
        );
    }
}
