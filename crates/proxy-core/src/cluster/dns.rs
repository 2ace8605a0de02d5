//! DNS endpoints, as Envoy's STRICT_DNS clusters: every address a name resolves to is a host
//! (on the endpoint's port, with its weight). Names are resolved on the monitor thread, never
//! on the request path, and again every `dns_refresh_rate` (sooner when a record's TTL runs
//! out first). An address that leaves the answer leaves the host set, and its pooled
//! connections close; one that stays keeps its health and connections. A failed lookup keeps
//! the last answer; an answer saying the name has no address empties it.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use hickory_resolver::{Resolver, TokioResolver};

use super::SharedCluster;
use crate::catalog::ClusterStats;
use config::{DnsConfig, DnsLookupFamily, Endpoint, EndpointAddress, EndpointHealth};

/// How long one query waits for a server; it is sent once (the next refresh is the retry).
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a whole lookup (both address families, search domains) may take before it
/// counts as failed: under the 5 s a config waits for first answers.
const LOOKUP_LIMIT: Duration = Duration::from_secs(4);

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("cannot read the system's DNS configuration (set `dns_resolvers`): {0}")]
    SystemConfig(hickory_resolver::net::NetError),
    #[error("cannot make a DNS resolver: {0}")]
    Resolver(hickory_resolver::net::NetError),
}

/// A cluster's resolver, made with the cluster.
pub(crate) struct DnsResolver {
    resolver: TokioResolver,
    config: DnsConfig,
}

/// The outcome of one lookup.
#[derive(Debug, PartialEq)]
pub(crate) enum Resolution {
    /// The addresses (none if the name has no address of the family asked for), and how long
    /// the answer is valid.
    Answer { addrs: Vec<IpAddr>, ttl: Duration },
    /// No answer (timeout, server failure): the last one stays in use.
    Failed(String),
}

impl DnsResolver {
    pub(crate) fn new(config: &DnsConfig) -> Result<Self, DnsError> {
        let mut builder = if config.resolvers.is_empty() {
            TokioResolver::builder_tokio().map_err(DnsError::SystemConfig)?
        } else {
            let servers = config
                .resolvers
                .iter()
                .map(|server| {
                    let on_port = |mut c: ConnectionConfig| {
                        c.port = server.port();
                        c
                    };
                    NameServerConfig::new(
                        server.ip(),
                        true,
                        vec![
                            on_port(ConnectionConfig::udp()),
                            on_port(ConnectionConfig::tcp()),
                        ],
                    )
                })
                .collect();
            Resolver::builder_with_config(
                ResolverConfig::from_name_servers(servers),
                TokioRuntimeProvider::default(),
            )
        };
        let options = builder.options_mut();
        options.timeout = QUERY_TIMEOUT;
        options.attempts = 1;
        if !config.resolvers.is_empty() {
            // The servers named are the only source: /etc/hosts is for the system's resolver.
            options.use_hosts_file = ResolveHosts::Never;
        }
        if !config.respect_ttl {
            // Nothing is cached: every refresh asks the servers.
            options.positive_max_ttl = Some(Duration::ZERO);
            options.negative_max_ttl = Some(Duration::ZERO);
        }
        let resolver = builder.build().map_err(DnsError::Resolver)?;
        Ok(DnsResolver {
            resolver,
            config: config.clone(),
        })
    }

    /// Looks `host` up: the addresses of the configured family, or a failure if any query
    /// needed failed (a partial answer is not taken for the whole).
    pub(crate) async fn resolve(&self, host: &str) -> Resolution {
        let Ok(name) = Name::from_ascii(host) else {
            return Resolution::Failed(format!("`{host}` is not a DNS name"));
        };
        let lookup = async {
            match self.config.lookup_family {
                DnsLookupFamily::V4Only => self.query(&name, RecordType::A).await,
                DnsLookupFamily::V6Only => self.query(&name, RecordType::AAAA).await,
                DnsLookupFamily::All => {
                    let (v4, v6) = tokio::join!(
                        self.query(&name, RecordType::A),
                        self.query(&name, RecordType::AAAA)
                    );
                    v4.and(v6)
                }
                DnsLookupFamily::V4Preferred => match self.query(&name, RecordType::A).await {
                    Resolution::Answer { addrs, .. } if addrs.is_empty() => {
                        self.query(&name, RecordType::AAAA).await
                    }
                    v4 => v4,
                },
            }
        };
        match tokio::time::timeout(LOOKUP_LIMIT, lookup).await {
            Ok(Resolution::Answer { mut addrs, ttl }) => {
                // Servers rotate their answers; the host set should not churn with them. A
                // logical name's first address is where its connections go: kept in order.
                if !self.config.logical {
                    addrs.sort_unstable();
                    addrs.dedup();
                }
                Resolution::Answer { addrs, ttl }
            }
            Ok(failed) => failed,
            Err(_) => Resolution::Failed(format!("no answer within {LOOKUP_LIMIT:?}")),
        }
    }

    async fn query(&self, name: &Name, record_type: RecordType) -> Resolution {
        match self.resolver.lookup(name.clone(), record_type).await {
            Ok(lookup) => Resolution::Answer {
                addrs: lookup
                    .answers()
                    .iter()
                    .filter_map(|record| match &record.data {
                        RData::A(a) => Some(IpAddr::V4(a.0)),
                        RData::AAAA(aaaa) => Some(IpAddr::V6(aaaa.0)),
                        _ => None, // CNAMEs on the way
                    })
                    .collect(),
                ttl: lookup
                    .valid_until()
                    .saturating_duration_since(Instant::now()),
            },
            // NXDOMAIN, or no record of this type: a real answer, "none". Asked again at the
            // refresh rate, not as often as a short TTL would allow.
            Err(error) if error.is_no_records_found() => Resolution::Answer {
                addrs: Vec::new(),
                ttl: self.config.refresh_rate,
            },
            Err(error) => Resolution::Failed(error.to_string()),
        }
    }
}

impl Resolution {
    /// Both answers together; a failure of either is the failure of both.
    fn and(self, other: Resolution) -> Resolution {
        match (self, other) {
            (
                Resolution::Answer { mut addrs, ttl },
                Resolution::Answer {
                    addrs: more,
                    ttl: other_ttl,
                },
            ) => {
                addrs.extend(more);
                Resolution::Answer {
                    addrs,
                    ttl: ttl.min(other_ttl),
                }
            }
            (Resolution::Failed(error), _) | (_, Resolution::Failed(error)) => {
                Resolution::Failed(error)
            }
        }
    }
}

/// A cluster's configured endpoints and the last answer for each name among them: what its
/// host set is made of.
pub(crate) struct Membership {
    configured: Vec<Endpoint>,
    /// `None` until the name's first lookup ends.
    answers: HashMap<String, Option<Vec<IpAddr>>>,
    /// The hosts names gave before a reload, kept until the names it added have had their
    /// first answer: a reload that swaps one name for another leaves no gap without hosts.
    interim: Vec<balancer::HostSpec>,
    /// Envoy's LOGICAL_DNS: the one name is one host, known by the first address it
    /// resolved to (its answer here, for good), whose connections go to `target`.
    logical: bool,
    /// The first address of the latest answer that had one.
    target: Option<IpAddr>,
}

impl Membership {
    pub(crate) fn new(configured: &[Endpoint], logical: bool) -> Self {
        let mut membership = Membership {
            configured: Vec::new(),
            answers: HashMap::new(),
            interim: Vec::new(),
            logical,
            target: None,
        };
        membership.configure(configured);
        membership
    }

    /// New configured endpoints; names that stay keep their answers.
    pub(crate) fn configure(&mut self, configured: &[Endpoint]) {
        let before = self.named_hosts();
        self.configured = configured.to_vec();
        let names: HashSet<String> = self.names().map(str::to_owned).collect();
        self.answers.retain(|name, _| names.contains(name));
        for name in names {
            self.answers.entry(name).or_insert(None);
        }
        self.interim = if self.unanswered() {
            before
        } else {
            Vec::new()
        };
    }

    /// The distinct names among the configured endpoints.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        let mut seen = HashSet::new();
        self.configured
            .iter()
            .filter_map(move |e| match &e.address {
                EndpointAddress::Name { host, .. } if seen.insert(host.as_str()) => {
                    Some(host.as_str())
                }
                _ => None,
            })
    }

    /// Records `host`'s answer (`None`: the lookup failed, the last answer stays). Whether the
    /// hosts changed.
    pub(crate) fn answer(&mut self, host: &str, mut addrs: Option<Vec<IpAddr>>) -> bool {
        let Some(slot) = self.answers.get_mut(host) else {
            return false; // no longer configured
        };
        if self.logical {
            // Connections go to the latest first address; the host stays the one first
            // resolved, so its pools (and their connections) stay in use. An answer without
            // addresses changes nothing, as in Envoy.
            match addrs.as_ref().and_then(|a| a.first()) {
                Some(first) => self.target = Some(*first),
                None => addrs = None,
            }
            if let (Some(known), Some(_)) = (slot.as_ref(), addrs.as_ref())
                && !known.is_empty()
            {
                return false;
            }
            addrs = addrs.map(|a| a.into_iter().take(1).collect());
        }
        let changed = match (addrs, slot.as_ref()) {
            (Some(addrs), Some(old)) if *old == addrs => false,
            (Some(addrs), _) => {
                *slot = Some(addrs);
                true
            }
            // A first lookup that failed: answered, with no address yet.
            (None, None) => {
                *slot = Some(Vec::new());
                false
            }
            (None, Some(_)) => false,
        };
        if !self.interim.is_empty() && !self.unanswered() {
            self.interim.clear();
            return true;
        }
        changed
    }

    /// Where a connection to host `addr` goes: for a logical DNS cluster's host, the first
    /// address of the latest answer.
    pub(crate) fn connect_addr(&self, addr: SocketAddr) -> SocketAddr {
        match self.target {
            Some(target) if self.logical => SocketAddr::new(target, addr.port()),
            _ => addr,
        }
    }

    /// Whether some name has not had its first lookup end.
    pub(crate) fn unanswered(&self) -> bool {
        self.answers.values().any(Option::is_none)
    }

    /// The hosts: each address once, with the weight of the first endpoint that names it.
    pub(crate) fn host_specs(&self) -> Vec<balancer::HostSpec> {
        let mut specs = self.hosts(|_| true);
        let mut seen: HashSet<SocketAddr> = specs.iter().map(|s| s.addr).collect();
        specs.extend(self.interim.iter().filter(|s| seen.insert(s.addr)));
        specs
    }

    /// Each host with the configured endpoint it came from (the first that names it), in
    /// one pass: [`endpoint_of`](Self::endpoint_of) for every host at once.
    pub(crate) fn endpoints_by_host(&self) -> HashMap<SocketAddr, &Endpoint> {
        let mut by_host = HashMap::with_capacity(self.configured.len());
        for endpoint in &self.configured {
            match &endpoint.address {
                EndpointAddress::Ip(addr) => {
                    by_host.entry(*addr).or_insert(endpoint);
                }
                EndpointAddress::Name { host, port } => {
                    let ips = self.answers.get(host).and_then(Option::as_ref);
                    for ip in ips.into_iter().flatten() {
                        by_host
                            .entry(SocketAddr::new(*ip, *port))
                            .or_insert(endpoint);
                    }
                }
            }
        }
        by_host
    }

    /// The configured endpoint host `addr` came from, and the DNS name it was resolved from
    /// when it was.
    pub(crate) fn endpoint_of(&self, addr: SocketAddr) -> Option<(&Endpoint, Option<&str>)> {
        self.configured.iter().find_map(|e| match &e.address {
            EndpointAddress::Ip(a) if *a == addr => Some((e, None)),
            EndpointAddress::Name { host, port }
                if *port == addr.port()
                    && self
                        .answers
                        .get(host)
                        .and_then(Option::as_ref)
                        .is_some_and(|ips| ips.contains(&addr.ip())) =>
            {
                Some((e, Some(host.as_str())))
            }
            _ => None,
        })
    }

    /// The hosts that names gave.
    fn named_hosts(&self) -> Vec<balancer::HostSpec> {
        self.hosts(EndpointAddress::is_name)
    }

    fn hosts(&self, which: impl Fn(&EndpointAddress) -> bool) -> Vec<balancer::HostSpec> {
        let mut seen = HashSet::new();
        let mut specs = Vec::with_capacity(self.configured.len());
        for endpoint in self.configured.iter().filter(|e| which(&e.address)) {
            let locality = super::locality::id(endpoint.locality.as_deref());
            let mut add = |addr: SocketAddr| {
                if seen.insert(addr) {
                    specs.push(
                        balancer::HostSpec::new(addr)
                            .with_weight(endpoint.weight)
                            .with_priority(endpoint.priority)
                            .with_locality(locality, endpoint.locality_weight.unwrap_or(0))
                            .with_health(match endpoint.health {
                                EndpointHealth::Healthy => balancer::Health::Healthy,
                                EndpointHealth::Degraded => balancer::Health::Degraded,
                                EndpointHealth::Unhealthy => balancer::Health::Unhealthy,
                                EndpointHealth::Draining => balancer::Health::Draining,
                            }),
                    );
                }
            };
            match &endpoint.address {
                EndpointAddress::Ip(addr) => add(*addr),
                EndpointAddress::Name { host, port } => {
                    let answer = self.answers.get(host).and_then(Option::as_ref);
                    for ip in answer.into_iter().flatten() {
                        add(SocketAddr::new(*ip, *port));
                    }
                }
            }
        }
        specs
    }
}

/// Resolves `host` for `cluster` until the task is aborted (the name or the cluster left the
/// config): runs on the monitor thread.
pub(crate) async fn follow_name(
    cluster: Arc<SharedCluster>,
    host: String,
    stats: Rc<ClusterStats>,
) {
    let Some(dns) = cluster.dns.as_ref() else {
        return;
    };
    let config = &dns.config;
    let mut failures: u32 = 0;
    loop {
        stats.update_attempt.inc();
        let wait = match dns.resolve(&host).await {
            Resolution::Answer { addrs, ttl } => {
                stats.update_success.inc();
                if failures > 0 {
                    tracing::info!(cluster = %cluster.name, host, "DNS answers again");
                }
                failures = 0;
                if addrs.is_empty() {
                    tracing::warn!(cluster = %cluster.name, host, "the name has no address: its hosts leave the cluster");
                }
                cluster.set_answer(&host, Some(addrs));
                config.next_refresh(ttl)
            }
            Resolution::Failed(error) => {
                stats.update_failure.inc();
                if failures == 0 {
                    tracing::warn!(cluster = %cluster.name, host, %error, "DNS lookup failed; the last answer stays in use");
                }
                failures = failures.saturating_add(1);
                cluster.set_answer(&host, None);
                retry_after(config, failures)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// After `failures` failed lookups in a row: from the minimum refresh, doubling, up to the
/// refresh rate.
fn retry_after(config: &DnsConfig, failures: u32) -> Duration {
    let doubled = config
        .min_refresh_rate
        .saturating_mul(1 << failures.saturating_sub(1).min(16));
    doubled.min(config.refresh_rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(host: &str, port: u16, weight: u32) -> Endpoint {
        Endpoint {
            weight,
            ..Endpoint::new(EndpointAddress::Name {
                host: host.into(),
                port,
            })
        }
    }

    fn ip(addr: &str) -> Endpoint {
        Endpoint::new(EndpointAddress::Ip(addr.parse().unwrap()))
    }

    fn hosts(m: &Membership) -> Vec<(String, u32)> {
        m.host_specs()
            .iter()
            .map(|s| (s.addr.to_string(), s.weight))
            .collect()
    }

    fn ips(list: &[&str]) -> Option<Vec<IpAddr>> {
        Some(list.iter().map(|a| a.parse().unwrap()).collect())
    }

    #[test]
    fn names_expand_to_their_addresses_on_their_port_once_each() {
        let mut m = Membership::new(
            &[ip("10.0.0.1:80"), name("api", 80, 3), name("api", 81, 1)],
            false,
        );
        assert_eq!(m.names().collect::<Vec<_>>(), ["api"]);
        assert!(m.unanswered());
        assert_eq!(hosts(&m), [("10.0.0.1:80".into(), 1)]);
        assert!(m.answer("api", ips(&["10.0.0.1", "10.0.0.2"])));
        assert!(!m.unanswered());
        assert_eq!(
            hosts(&m),
            [
                ("10.0.0.1:80".into(), 1),
                ("10.0.0.2:80".into(), 3),
                ("10.0.0.1:81".into(), 1),
                ("10.0.0.2:81".into(), 1),
            ],
            "an address named twice is one host, weighted by the first"
        );
        assert!(
            !m.answer("api", ips(&["10.0.0.1", "10.0.0.2"])),
            "unchanged"
        );
    }

    #[test]
    fn a_failed_lookup_keeps_the_last_answer_and_an_empty_one_removes_it() {
        let mut m = Membership::new(&[name("api", 80, 1)], false);
        assert!(!m.answer("api", None));
        assert!(!m.unanswered(), "a failed first lookup still ends the wait");
        assert!(hosts(&m).is_empty());
        assert!(m.answer("api", ips(&["10.0.0.1"])));
        assert!(!m.answer("api", None));
        assert_eq!(hosts(&m), [("10.0.0.1:80".into(), 1)]);
        assert!(m.answer("api", ips(&[])));
        assert!(hosts(&m).is_empty());
    }

    #[test]
    fn reconfiguring_keeps_the_answers_of_names_that_stay() {
        let mut m = Membership::new(&[name("api", 80, 1), name("old", 80, 1)], false);
        m.answer("api", ips(&["10.0.0.1"]));
        m.answer("old", ips(&["10.0.0.9"]));
        m.configure(&[name("api", 80, 1), name("new", 80, 1)]);
        assert!(m.unanswered(), "`new` waits for its first lookup");
        assert!(!m.answer("old", ips(&["10.0.0.9"])), "gone from the config");
        assert!(m.answer("new", ips(&["10.0.0.5"])));
        assert_eq!(
            hosts(&m),
            [("10.0.0.1:80".into(), 1), ("10.0.0.5:80".into(), 1)]
        );
    }

    #[test]
    fn a_name_swapped_for_another_serves_until_the_new_one_answers() {
        let mut m = Membership::new(&[ip("10.0.0.1:80"), name("blue", 80, 1)], false);
        m.answer("blue", ips(&["10.0.0.2"]));
        m.configure(&[name("green", 80, 1)]);
        assert_eq!(
            hosts(&m),
            [("10.0.0.2:80".into(), 1)],
            "the old name's hosts stay meanwhile; a removed address leaves at once"
        );
        assert!(m.answer("green", ips(&["10.0.0.3"])));
        assert_eq!(hosts(&m), [("10.0.0.3:80".into(), 1)]);
        // Removing a name without adding one: its hosts leave at once.
        m.configure(&[ip("10.0.0.1:80")]);
        assert_eq!(hosts(&m), [("10.0.0.1:80".into(), 1)]);
    }

    #[test]
    fn failures_back_off_from_the_minimum_to_the_refresh_rate() {
        let config = DnsConfig::default();
        let s = Duration::from_secs;
        assert_eq!(retry_after(&config, 1), s(1));
        assert_eq!(retry_after(&config, 2), s(2));
        assert_eq!(retry_after(&config, 3), s(4));
        assert_eq!(retry_after(&config, 4), s(5));
        assert_eq!(retry_after(&config, 1000), s(5));
    }

    #[test]
    fn a_logical_name_is_one_host_reached_at_the_latest_first_address() {
        let mut m = Membership::new(&[name("api", 80, 1)], true);
        let host: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert!(m.answer("api", ips(&["10.0.0.1", "10.0.0.2"])));
        assert_eq!(hosts(&m), vec![("10.0.0.1:80".to_string(), 1)]);
        assert_eq!(m.connect_addr(host), host);
        // A new answer moves where connections go, not the host (its pools stay).
        assert!(!m.answer("api", ips(&["10.0.0.3", "10.0.0.1"])));
        assert_eq!(hosts(&m), vec![("10.0.0.1:80".to_string(), 1)]);
        assert_eq!(m.connect_addr(host), "10.0.0.3:80".parse().unwrap());
        // Nor does an answer without addresses, or a failed lookup.
        assert!(!m.answer("api", ips(&[])));
        assert!(!m.answer("api", None));
        assert_eq!(m.connect_addr(host), "10.0.0.3:80".parse().unwrap());
        assert_eq!(hosts(&m).len(), 1);
    }
}
