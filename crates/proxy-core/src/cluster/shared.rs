//! What every worker shares about a cluster: its host set (health, weights, requests in flight)
//! and its circuit breakers. Built when the cluster first appears in a config, and kept by
//! later configs that leave it unchanged (its endpoints may change). The host set follows the
//! configured endpoints and, for names among them, the last DNS answers.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::catalog::{ClusterGauges, ProxyStats};
use crate::tls::{UpstreamTls, UpstreamTransports};
use config::{ClusterConfig, Endpoint, HealthCheckConfig, UpstreamProtocol};

use super::breaker::CircuitBreakers;
use super::dns::{DnsError, DnsResolver, Membership};
use super::health::HostHealth;

pub(crate) struct SharedCluster {
    pub(crate) name: String,
    pub(crate) host_set: balancer::HostSet,
    pub(crate) breakers: CircuitBreakers,
    pub(crate) health: HostHealth,
    pub(crate) gauges: ClusterGauges,
    /// TLS to the hosts (the cluster's, and its transport socket matches').
    transports: UpstreamTransports,
    /// With transport socket matches: each host's transport, made when the hosts are
    /// published (read on every new connection without taking the membership's lock).
    transport_of: arc_swap::ArcSwap<std::collections::HashMap<std::net::SocketAddr, usize>>,
    /// Active health checking, run by the monitor thread.
    pub(crate) health_check: Option<HealthCheckConfig>,
    /// What the hosts speak; health checks speak it too.
    pub(crate) protocol: UpstreamProtocol,
    /// Whether any worker has opened a connection to a host (Envoy's "the cluster has had
    /// traffic"): until then health checks go at the `no_traffic` intervals.
    pub(crate) had_traffic: std::sync::atomic::AtomicBool,
    /// Envoy's LOGICAL_DNS ([`connect_addr`](Self::connect_addr)).
    logical_dns: bool,
    /// The resolver of the names among the endpoints, if there are any.
    pub(crate) dns: Option<DnsResolver>,
    /// What the host set is made of; held while the host set is replaced, so that a reload
    /// and a DNS answer publish one after the other.
    membership: Mutex<Membership>,
    /// Signalled when a name's first lookup ends.
    answered: Condvar,
}

impl SharedCluster {
    pub(crate) fn new(
        config: &ClusterConfig,
        workers: usize,
        stats: &ProxyStats,
        transports: UpstreamTransports,
    ) -> Result<Self, DnsError> {
        let dns = config
            .has_names()
            .then(|| DnsResolver::new(&config.dns))
            .transpose()?;
        let membership = Membership::new(&config.endpoints, config.dns.logical);
        let host_set = balancer::HostSet::new(membership.host_specs())
            .expect("hosts are distinct with weights >= 1 by construction");
        let gauges = stats.catalog.cluster_gauges(&stats.process, &config.name);
        let transport_of = transports_by_host(&transports, &membership, &Default::default());
        // Until the monitor has measured anything, nothing is in flight: not "no headroom".
        gauges.rq_headroom.set(super::monitor::IDLE_HEADROOM);
        gauges.pending_headroom.set(super::monitor::IDLE_HEADROOM);
        Ok(Self {
            name: config.name.clone(),
            health: HostHealth::new(&host_set, config.outlier_detection),
            host_set,
            breakers: CircuitBreakers::new(&config.circuit_breakers, workers),
            gauges,
            transports,
            transport_of: arc_swap::ArcSwap::from_pointee(transport_of),
            health_check: config.health_check.clone(),
            protocol: config.protocol,
            had_traffic: std::sync::atomic::AtomicBool::new(false),
            logical_dns: config.dns.logical,
            dns,
            membership: Mutex::new(membership),
            answered: Condvar::new(),
        })
    }

    /// New configured endpoints (a reload). Names that stay keep their answers; new names
    /// have no hosts until their first lookup.
    pub(crate) fn set_endpoints(&self, endpoints: &[Endpoint]) {
        let mut membership = self.membership();
        membership.configure(endpoints);
        self.publish(&membership);
    }

    /// A lookup of `host` ended: its addresses, or `None` if it failed.
    pub(crate) fn set_answer(&self, host: &str, addrs: Option<Vec<std::net::IpAddr>>) {
        let mut membership = self.membership();
        if membership.answer(host, addrs) {
            self.publish(&membership);
        }
        drop(membership);
        self.answered.notify_all();
    }

    /// The names to resolve.
    pub(crate) fn names(&self) -> Vec<String> {
        self.membership().names().map(str::to_owned).collect()
    }

    /// Blocks until every name has had a first lookup, or `deadline`. Whether they all have.
    pub(crate) fn wait_for_answers(&self, deadline: Instant) -> bool {
        let mut membership = self.membership();
        while membership.unanswered() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            membership = self
                .answered
                .wait_timeout(membership, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    fn membership(&self) -> MutexGuard<'_, Membership> {
        self.membership
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the hosts: those that stay keep their health, ejections and requests in
    /// flight, and every worker's pools for them.
    fn publish(&self, membership: &Membership) {
        if self.transports.has_matches() {
            let previous = self.transport_of.load();
            let map = transports_by_host(&self.transports, membership, &previous);
            self.transport_of.store(std::sync::Arc::new(map));
        }
        // Hosts that stay are published with the health they have (an ejection stays).
        if let Err(error) = self.health.publish(&self.host_set, membership.host_specs()) {
            // Distinct addresses with weights >= 1 by construction.
            tracing::error!(cluster = %self.name, %error, "cannot update the hosts");
        }
    }

    /// The name of host `addr`, for `auto_host_rewrite`: its endpoint's `hostname`, else the
    /// DNS name it was resolved from.
    pub(crate) fn hostname_of(&self, addr: std::net::SocketAddr) -> Option<String> {
        let membership = self.membership();
        let (endpoint, name) = membership.endpoint_of(addr)?;
        endpoint
            .hostname
            .clone()
            .or_else(|| name.map(str::to_owned))
    }

    /// Which of the cluster's transports host `addr` is reached by now: its endpoint's
    /// transport socket match, as of the last hosts published (so that a management server's
    /// change of an endpoint's labels applies to the host's next connections).
    pub(crate) fn transport_of(&self, addr: std::net::SocketAddr) -> usize {
        if !self.transports.has_matches() {
            return 0;
        }
        self.transport_of.load().get(&addr).copied().unwrap_or(0)
    }

    /// The TLS of transport `index` ([`transport_of`](Self::transport_of)); `None`:
    /// cleartext.
    pub(crate) fn tls(&self, index: usize) -> Option<&UpstreamTls> {
        self.transports.tls(index)
    }

    /// Where host `addr`'s health checks connect (its endpoint's own port, if it gives one)
    /// and the host header they carry over the cluster's, if its endpoint gives one.
    pub(crate) fn check_target(
        &self,
        addr: std::net::SocketAddr,
    ) -> (std::net::SocketAddr, Option<String>) {
        let membership = self.membership();
        match membership.endpoint_of(addr) {
            Some((endpoint, _)) => (
                endpoint
                    .health_check_port
                    .map_or(addr, |port| std::net::SocketAddr::new(addr.ip(), port)),
                endpoint.health_check_hostname.clone(),
            ),
            None => (addr, None),
        }
    }

    /// Where a connection to host `addr` goes: `addr`, except in a logical DNS cluster, whose
    /// one host is reached at the latest answer's first address.
    pub(crate) fn connect_addr(&self, addr: std::net::SocketAddr) -> std::net::SocketAddr {
        if !self.logical_dns {
            return addr;
        }
        self.membership().connect_addr(addr)
    }

    /// Sets the breaker and membership gauges from the live counts.
    pub(crate) fn refresh_gauges(&self) {
        let b = &self.breakers;
        let g = &self.gauges;
        for (breaker, open, remaining) in [
            (&b.connections, &g.cx_open, &g.remaining_cx),
            (&b.pending, &g.rq_pending_open, &g.remaining_pending),
            (&b.requests, &g.rq_open, &g.remaining_rq),
        ] {
            open.set(i64::from(breaker.is_open()));
            remaining.set(i64::from(breaker.remaining()));
        }
        // The retries' limit may follow the load (a retry budget).
        let retry_limit = b.retry_limit();
        g.rq_retry_open
            .set(i64::from(b.retries.active() >= retry_limit));
        g.remaining_retries
            .set(i64::from(retry_limit.saturating_sub(b.retries.active())));
        let (mut healthy, mut ejected) = (0, 0);
        for host in self.host_set.snapshot().hosts() {
            match host.health() {
                balancer::Health::Healthy | balancer::Health::Degraded => healthy += 1,
                balancer::Health::Ejected => ejected += 1,
                balancer::Health::Unhealthy | balancer::Health::Draining => {}
            }
        }
        g.membership_healthy.set(healthy);
        g.ejections_active.set(ejected);
    }
}

/// Each host's transport (its endpoint's match). A host that has no endpoint of its own for
/// now (a DNS host kept while its name is looked up again) keeps the one it had.
fn transports_by_host(
    transports: &UpstreamTransports,
    membership: &Membership,
    previous: &std::collections::HashMap<std::net::SocketAddr, usize>,
) -> std::collections::HashMap<std::net::SocketAddr, usize> {
    if !transports.has_matches() {
        return Default::default();
    }
    let endpoints = membership.endpoints_by_host();
    membership
        .host_specs()
        .iter()
        .map(|spec| {
            let index = match endpoints.get(&spec.addr) {
                Some(endpoint) => transports.index(endpoint.transport_socket.as_deref()),
                None => previous.get(&spec.addr).copied().unwrap_or(0),
            };
            (spec.addr, index)
        })
        .collect()
}
