//! Cluster -> a cluster: its balancing, breakers, health checks, outlier detection and
//! protocol; endpoints inline (STATIC, STRICT_DNS) or by EDS name.

// Control planes still send the deprecated protocol and DNS fields; they are read, not
// ignored.
#![allow(deprecated)]

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, DnsLookupFamily,
};
use envoy_types::pb::envoy::config::cluster::v3::{CircuitBreakers, Cluster, OutlierDetection};
use envoy_types::pb::envoy::config::core::v3::{HealthCheck, RoutingPriority, health_check};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::google::protobuf::Any;

use super::xds_endpoints::XdsEndpoints;
use super::xds_lb::balancing;
use super::xds_protocol::upstream_http;
use crate::envoy::{ResourceError, decode, duration, fields, nothing_else, type_url};
use crate::{
    ClusterConfig, ConfigError, RawCircuitBreakers, RawCluster, RawEndpoint, RawHealthCheck,
    RawLimit, RawOutlierDetection, RawRateEjection,
};

/// A cluster with one host: where an ext_authz filter or a collector that names it is
/// reached, with the cluster's TLS (its secrets filled in) when it has some.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SingleHost<'a> {
    pub(crate) address: &'a str,
    pub(crate) tls: Option<&'a crate::tls::raw::RawClusterTls>,
}

/// The clusters ready to serve, as a listener's section sees them: a view of the clusters
/// as checked, not a copy of a thousand names made for each change.
pub(crate) trait ReadyClusters {
    /// Whether the cluster speaks HTTP/1.1; `None` when it is not ready.
    fn http1(&self, name: &str) -> Option<bool>;
    /// Its one host, when it is ready and has a single host.
    fn single_host(&self, name: &str) -> Option<SingleHost<'_>>;
}

/// Clusters by name, each ready and whether it speaks HTTP/1.1, none with a single host
/// (what a route table's section is tested with).
#[cfg(test)]
impl ReadyClusters for std::collections::BTreeMap<&str, bool> {
    fn http1(&self, name: &str) -> Option<bool> {
        self.get(name).copied()
    }

    fn single_host(&self, _: &str) -> Option<SingleHost<'_>> {
        None
    }
}

/// A cluster's section, checked, and what listeners need to know of it.
#[derive(Debug, Clone)]
pub(crate) struct CheckedCluster {
    /// A hash of what it was made from: the cluster, its endpoints, the secrets it names.
    pub(crate) inputs: u64,
    pub(crate) config: Arc<ClusterConfig>,
    /// Whether it can speak HTTP/1.1 (which upgrades need; an `auto` cluster offers it alone
    /// for them).
    http1: bool,
    /// Its one host and that host's TLS, when it has a single host: where an ext_authz
    /// filter or a collector naming it sends its calls.
    single_host: Option<(String, Option<crate::tls::raw::RawClusterTls>)>,
}

impl CheckedCluster {
    pub(crate) fn new(raw: RawCluster, inputs: u64) -> Result<Self, ConfigError> {
        let http1 = raw.protocol.as_deref() != Some("http2");
        let single_host = match raw.endpoints.as_slice() {
            [RawEndpoint::Weighted(e)] => Some(e.address.clone()),
            [RawEndpoint::Address(a)] => Some(a.clone()),
            _ => None,
        }
        .map(|address| (address, raw.tls_of(raw.endpoints.first()).cloned()));
        let at = format!("cluster `{}`", raw.name);
        let config = crate::cluster::check::cluster(raw, &at)?;
        Ok(Self {
            inputs,
            config: Arc::new(config),
            http1,
            single_host,
        })
    }
}

impl ReadyClusters for std::collections::BTreeMap<String, CheckedCluster> {
    fn http1(&self, name: &str) -> Option<bool> {
        self.get(name).map(|c| c.http1)
    }

    fn single_host(&self, name: &str) -> Option<SingleHost<'_>> {
        let (address, tls) = self.get(name)?.single_host.as_ref()?;
        Some(SingleHost {
            address,
            tls: tls.as_ref(),
        })
    }
}

/// Envoy's connect timeout when a cluster gives none.
const ENVOY_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A cluster from the management server.
#[derive(Debug, Clone)]
pub struct XdsCluster {
    pub name: String,
    /// The cluster as the config file would write it, without endpoints.
    raw: RawCluster,
    /// The endpoints given with it (STATIC, STRICT_DNS).
    inline: Option<XdsEndpoints>,
    /// The name its endpoints come under by EDS (`service_name`, or the cluster's name).
    pub eds: Option<String>,
    /// The secrets its TLS names (SDS): it warms until they are all there.
    secrets: crate::tls::sds::SecretRefs,
    /// The same for each of its `transport_socket_matches`, in order.
    match_secrets: Vec<crate::tls::sds::SecretRefs>,
}

impl XdsCluster {
    pub fn decode(value: &Any) -> Result<Self, ResourceError> {
        let cluster: Cluster = decode(value, type_url::CLUSTER, "a Cluster")?;
        translate(cluster)
    }

    /// As the config file writes it, with `endpoints` (from EDS) when it takes them from
    /// there; `None` while a secret its TLS names has not arrived.
    pub(crate) fn section(
        &self,
        endpoints: Option<&XdsEndpoints>,
        secrets: &crate::tls::sds::Secrets,
    ) -> Option<RawCluster> {
        let mut raw = self.raw.clone();
        if let Some(endpoints) = endpoints.or(self.inline.as_ref()) {
            raw.endpoints = endpoints.raw();
            raw.overprovisioning_factor = endpoints.overprovisioning_factor;
        }
        if let Some(tls) = &mut raw.tls {
            self.secrets.fill_cluster(tls, secrets)?;
        }
        for (m, refs) in raw
            .transport_socket_matches
            .iter_mut()
            .zip(&self.match_secrets)
        {
            if let Some(tls) = &mut m.tls {
                refs.fill_cluster(tls, secrets)?;
            }
        }
        Some(raw)
    }

    /// The secrets its TLS contexts name (SDS).
    pub fn secret_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&self.secrets)
            .chain(&self.match_secrets)
            .flat_map(|refs| refs.names())
    }

    /// Whether every secret its TLS contexts name has arrived.
    pub fn secrets_ready(&self, secrets: &crate::tls::sds::Secrets) -> bool {
        std::iter::once(&self.secrets)
            .chain(&self.match_secrets)
            .all(|refs| refs.ready(secrets))
    }
}

fn translate(mut c: Cluster) -> Result<XdsCluster, ResourceError> {
    let name = std::mem::take(&mut c.name);
    let at = format!("cluster `{name}`");
    let sub = |field: &str| format!("{at}.{field}");
    // Names for stats and metadata for other filters change nothing here.
    c.alt_stat_name.clear();
    c.metadata = None;

    // Envoy's DnsCluster extension: STRICT_DNS with its settings in the extension.
    let mut dns_cluster = None;
    let kind = match c.cluster_discovery_type.take() {
        None => DiscoveryType::Static,
        Some(ClusterDiscoveryType::Type(t)) => DiscoveryType::try_from(t).map_err(|_| {
            ResourceError::invalid(sub("type"), format!("unknown discovery type {t}"))
        })?,
        Some(ClusterDiscoveryType::ClusterType(custom)) => {
            let typed = custom.typed_config.unwrap_or_default();
            if typed.type_url != DNS_CLUSTER {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!(
                        "cluster_type `{}` (the DNS cluster only)",
                        custom.name
                    )],
                });
            }
            let settings = dns_cluster_settings(&typed, &sub("cluster_type"))?;
            let kind = if settings.logical {
                DiscoveryType::LogicalDns
            } else {
                DiscoveryType::StrictDns
            };
            dns_cluster = Some(settings);
            kind
        }
    };
    let logical = kind == DiscoveryType::LogicalDns;
    let eds_config = c.eds_cluster_config.take();
    let load_assignment = c.load_assignment.take();
    let (inline, eds) = match kind {
        DiscoveryType::Eds => {
            let service = eds_config
                .map(|e| e.service_name)
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| name.clone());
            (None, Some(service))
        }
        DiscoveryType::Static | DiscoveryType::StrictDns | DiscoveryType::LogicalDns => {
            // No assignment: a cluster without hosts (Envoy Gateway's placeholder for
            // routes without backends), whose requests get 503.
            let cla = load_assignment.unwrap_or_else(|| ClusterLoadAssignment {
                cluster_name: name.clone(),
                ..Default::default()
            });
            // Envoy's rule for LOGICAL_DNS, on the assignment as sent (repeats are merged
            // below).
            let single = cla.endpoints.len() == 1 && cla.endpoints[0].lb_endpoints.len() == 1;
            let endpoints = XdsEndpoints::from_assignment(cla, Some(&name))?;
            let names = endpoints
                .hosts
                .iter()
                .any(|h| h.address.parse::<std::net::SocketAddr>().is_err());
            if kind == DiscoveryType::Static && names {
                return Err(ResourceError::invalid(
                    sub("load_assignment"),
                    "a STATIC cluster's endpoints must be IP addresses (STRICT_DNS resolves names)",
                ));
            }
            if logical && (!single || !names) {
                // Envoy's rule, and here the one endpoint must be a name.
                return Err(ResourceError::invalid(
                    sub("load_assignment"),
                    "a LOGICAL_DNS cluster has a single lb_endpoint, a name",
                ));
            }
            (Some(endpoints), None)
        }
        other => {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec![format!("type {}", other.as_str_name())],
            });
        }
    };

    let balancing = balancing(&mut c, &at)?;
    // Hosts leave the set as soon as discovery removes them, whatever their health (Envoy's
    // `ignore_health_on_host_removal: true`); keeping removed hosts while they pass health
    // checks, Envoy's default, is not done.
    c.ignore_health_on_host_removal = false;
    let connect_timeout = duration(c.connect_timeout.take(), &sub("connect_timeout"))?
        .or(Some(ENVOY_CONNECT_TIMEOUT));
    let per_connection_buffer_limit_bytes = c
        .per_connection_buffer_limit_bytes
        .take()
        .map(|v| u64::from(v.value));
    let mut http = upstream_http(&mut c, &at)?;
    let tcp_keepalive = connection_options(&mut c, &at)?;
    let close_on_failure = std::mem::take(&mut c.close_connections_on_host_health_failure);
    let preconnect = preconnect_policy(&mut c, balancing.lb_policy, &at)?;
    let per_endpoint_stats = track_cluster_stats(&mut c, &at)?;
    let circuit_breakers = c
        .circuit_breakers
        .take()
        .map(|b| breakers(b, &sub("circuit_breakers")))
        .transpose()?;
    let health_check = match std::mem::take(&mut c.health_checks).as_slice() {
        [] => None,
        [one] => Some(health(one.clone(), &sub("health_checks[0]"))?),
        _ => {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec!["health_checks (more than one)".into()],
            });
        }
    };
    let outlier_detection = c
        .outlier_detection
        .take()
        .map(|o| outliers(o, &sub("outlier_detection")))
        .transpose()?;
    let (tls, secrets) = transport(c.transport_socket.take(), &at)?;
    let mut transport_socket_matches = Vec::new();
    let mut match_secrets = Vec::new();
    for (i, mut m) in std::mem::take(&mut c.transport_socket_matches)
        .into_iter()
        .enumerate()
    {
        let at = format!("{at}.transport_socket_matches[{i}]");
        let socket = m
            .transport_socket
            .take()
            .ok_or_else(|| ResourceError::invalid(&at, "expected a transport_socket"))?;
        let (tls, secrets) = transport(Some(socket), &at)?;
        transport_socket_matches.push(crate::cluster::socket_match::RawTransportSocketMatch {
            name: std::mem::take(&mut m.name),
            labels: m
                .r#match
                .take()
                .map(|s| crate::cluster::socket_match::struct_labels(&s))
                .unwrap_or_default(),
            tls,
        });
        match_secrets.push(secrets);
        nothing_else(&m, fields::TRANSPORT_SOCKET_MATCH, &at)?;
    }
    let family = DnsLookupFamily::try_from(std::mem::take(&mut c.dns_lookup_family))
        .unwrap_or(DnsLookupFamily::Auto);
    let legacy_dns = DnsSettings {
        logical,
        refresh_rate: duration(c.dns_refresh_rate.take(), &sub("dns_refresh_rate"))?,
        min_refresh_rate: None,
        respect_ttl: std::mem::take(&mut c.respect_dns_ttl),
        family: match family {
            // Envoy's AUTO prefers IPv6; the nearest here prefers IPv4 (docs/xds.md).
            DnsLookupFamily::Auto | DnsLookupFamily::V4Preferred => "v4_preferred",
            DnsLookupFamily::V4Only => "v4_only",
            DnsLookupFamily::V6Only => "v6_only",
            DnsLookupFamily::All => "all",
        },
    };
    // With the extension, its settings are the ones Envoy reads.
    let dns_settings = dns_cluster.unwrap_or(legacy_dns);
    nothing_else(&c, fields::CLUSTER, &at)?;

    let dns = matches!(kind, DiscoveryType::StrictDns | DiscoveryType::LogicalDns);
    let raw = RawCluster {
        name: name.clone(),
        endpoints: Vec::new(),
        lb_policy: Some(balancing.lb_policy.to_owned()),
        least_request: balancing.least_request,
        ring_hash: balancing.ring_hash,
        maglev: balancing.maglev,
        hash_key: None,
        // Envoy reads it only where the balancer hashes: inert on the others, as there.
        hash_policy: if matches!(balancing.lb_policy, "ring_hash" | "maglev") {
            crate::hash_policy::xds::hash_policy(
                std::mem::take(&mut http.hash_policy),
                &http.hash_policy_at,
            )?
        } else {
            Vec::new()
        },
        healthy_panic_threshold: balancing.healthy_panic_threshold,
        overprovisioning_factor: None,
        locality_weighted: Some(balancing.locality_weighted),
        zone_aware: balancing.zone_aware,
        slow_start: balancing.slow_start,
        protocol: http.protocol.map(str::to_owned),
        connect_timeout,
        max_requests_per_connection: http.max_requests_per_connection,
        idle_timeout: http.idle_timeout,
        max_connection_duration: http.max_connection_duration,
        tcp_keepalive,
        per_endpoint_stats,
        preserve_header_case: http.preserve_header_case.filter(|keep| *keep),
        initial_stream_window_size: http.initial_stream_window_size,
        initial_connection_window_size: http.initial_connection_window_size,
        max_concurrent_streams: http.max_concurrent_streams,
        http2_keepalive: http.http2_keepalive,
        stream_error_on_invalid_http_message: http.stream_error_on_invalid_http_message,
        close_connections_on_host_health_failure: Some(close_on_failure).filter(|on| *on),
        preconnect,
        per_connection_buffer_limit_bytes,
        circuit_breakers,
        health_check,
        outlier_detection,
        tls,
        auto_sni: http.auto_sni.filter(|on| *on),
        // Envoy's "verify the name" beside its chain-only default; the name sent is verified
        // here whenever no `subject_alt_names` decide.
        auto_san_validation: http.auto_san_validation.filter(|on| *on),
        // Without `auto_sni` (or the validation, refused alone) it does nothing, as Envoy.
        override_auto_sni_header: http
            .override_auto_sni_header
            .filter(|_| http.auto_sni == Some(true) || http.auto_san_validation == Some(true)),
        transport_socket_matches,
        dns_refresh_rate: dns_settings.refresh_rate.filter(|_| dns),
        dns_min_refresh_rate: dns_settings.min_refresh_rate.filter(|_| dns),
        respect_dns_ttl: dns.then_some(dns_settings.respect_ttl),
        dns_lookup_family: dns.then(|| dns_settings.family.to_owned()),
        dns_resolvers: None,
        logical_dns: Some(logical).filter(|on| *on),
        dynamic: true,
    };
    Ok(XdsCluster {
        name,
        raw,
        inline,
        eds,
        secrets,
        match_secrets,
    })
}

/// A cluster's (or a match's) transport socket: TLS with the secrets it names, or plain
/// text (none, or `raw_buffer`).
fn transport(
    socket: Option<envoy_types::pb::envoy::config::core::v3::TransportSocket>,
    at: &str,
) -> Result<
    (
        Option<crate::tls::raw::RawClusterTls>,
        crate::tls::sds::SecretRefs,
    ),
    ResourceError,
> {
    match socket {
        None => Ok(Default::default()),
        Some(socket) if crate::tls::xds::is_raw_buffer(&socket) => Ok(Default::default()),
        Some(socket) => {
            let (tls, secrets) = crate::tls::xds::cluster_tls(socket, at)?;
            Ok((Some(tls), secrets))
        }
    }
}

const DNS_CLUSTER: &str = "type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster";

/// How a STRICT_DNS (or LOGICAL_DNS) cluster resolves its names.
struct DnsSettings {
    /// `all_addresses_in_single_endpoint`: LOGICAL_DNS.
    logical: bool,
    refresh_rate: Option<Duration>,
    min_refresh_rate: Option<Duration>,
    respect_ttl: bool,
    family: &'static str,
}

/// Envoy's `DnsCluster`: strict DNS (each address a host) with its refresh, TTL and family
/// settings; logical DNS, failure back-off, jitter and resolvers of its own are refused.
fn dns_cluster_settings(typed: &Any, at: &str) -> Result<DnsSettings, ResourceError> {
    use envoy_types::pb::envoy::extensions::clusters::common::dns::v3::DnsLookupFamily as Family;
    use envoy_types::pb::envoy::extensions::clusters::dns::v3::DnsCluster;
    let at = format!("{at} (DnsCluster)");
    let mut dns: DnsCluster = prost::Message::decode(typed.value.as_slice())
        .map_err(|e| ResourceError::invalid(&at, format!("cannot decode: {e}")))?;
    let settings = DnsSettings {
        logical: std::mem::take(&mut dns.all_addresses_in_single_endpoint),
        refresh_rate: duration(
            dns.dns_refresh_rate.take(),
            &format!("{at}.dns_refresh_rate"),
        )?,
        min_refresh_rate: duration(
            dns.dns_min_refresh_rate.take(),
            &format!("{at}.dns_min_refresh_rate"),
        )?,
        respect_ttl: std::mem::take(&mut dns.respect_dns_ttl),
        family: match Family::try_from(std::mem::take(&mut dns.dns_lookup_family))
            .unwrap_or(Family::Unspecified)
        {
            // Unspecified is AUTO, which prefers IPv6 in Envoy; the nearest here prefers IPv4.
            Family::Unspecified | Family::Auto | Family::V4Preferred => "v4_preferred",
            Family::V4Only => "v4_only",
            Family::V6Only => "v6_only",
            Family::All => "all",
        },
    };
    nothing_else(&dns, fields::DNS_CLUSTER, &at)?;
    Ok(settings)
}

fn breakers(mut b: CircuitBreakers, at: &str) -> Result<RawCircuitBreakers, ResourceError> {
    let thresholds = std::mem::take(&mut b.thresholds);
    let per_host = std::mem::take(&mut b.per_host_thresholds);
    nothing_else(&b, fields::CIRCUIT_BREAKERS, at)?;
    let mut raw = RawCircuitBreakers::default();
    // Envoy honours `max_connections` alone per host; the others are refused by name.
    for (i, mut t) in per_host.into_iter().enumerate() {
        if t.priority == RoutingPriority::High as i32 {
            continue;
        }
        raw.max_connections_per_host = t.max_connections.take().map(|v| v.value);
        nothing_else(
            &t,
            fields::THRESHOLDS,
            &format!("{at}.per_host_thresholds[{i}]"),
        )?;
    }
    for (i, mut t) in thresholds.into_iter().enumerate() {
        // Routes here all have the default priority, so HIGH limits never apply.
        if t.priority == RoutingPriority::High as i32 {
            continue;
        }
        let limit = |v: Option<u32>| v.map(|v| RawLimit::Fixed(u64::from(v)));
        raw.max_connections = limit(t.max_connections.take().map(|v| v.value));
        raw.max_pending_requests = limit(t.max_pending_requests.take().map(|v| v.value));
        raw.max_requests = limit(t.max_requests.take().map(|v| v.value));
        raw.max_retries = limit(t.max_retries.take().map(|v| v.value));
        raw.max_connection_pools = t.max_connection_pools.take().map(|v| v.value);
        raw.retry_budget = t.retry_budget.take().map(|b| crate::RawRetryBudget {
            budget_percent: b.budget_percent.map(|p| p.value),
            min_retry_concurrency: b.min_retry_concurrency.map(|v| v.value),
        });
        // The remaining_* gauges are always kept here.
        t.track_remaining = false;
        nothing_else(&t, fields::THRESHOLDS, &format!("{at}.thresholds[{i}]"))?;
    }
    Ok(raw)
}

fn health(mut h: HealthCheck, at: &str) -> Result<RawHealthCheck, ResourceError> {
    let mut raw = match h.health_checker.take() {
        Some(health_check::HealthChecker::HttpHealthCheck(http)) => {
            http_check(http, &format!("{at}.http_health_check"))?
        }
        Some(health_check::HealthChecker::GrpcHealthCheck(mut grpc)) => {
            let at = format!("{at}.grpc_health_check");
            let metadata = std::mem::take(&mut grpc.initial_metadata);
            let (add, remove) =
                check_headers(metadata, Vec::new(), &format!("{at}.initial_metadata"))?;
            let raw = RawHealthCheck {
                grpc: Some(crate::RawGrpcHealthCheck {
                    service_name: std::mem::take(&mut grpc.service_name),
                    authority: Some(std::mem::take(&mut grpc.authority)).filter(|a| !a.is_empty()),
                }),
                request_headers_to_add: add,
                request_headers_to_remove: remove,
                ..RawHealthCheck::default()
            };
            nothing_else(&grpc, fields::GRPC_HEALTH_CHECK, &at)?;
            raw
        }
        Some(health_check::HealthChecker::TcpHealthCheck(mut tcp)) => {
            let at = format!("{at}.tcp_health_check");
            let raw = RawHealthCheck {
                tcp: Some(true),
                send: tcp.send.take().map(|p| payload(p, &at)).transpose()?,
                receive: Some(
                    std::mem::take(&mut tcp.receive)
                        .into_iter()
                        .map(|p| payload(p, &at))
                        .collect::<Result<_, _>>()?,
                ),
                ..RawHealthCheck::default()
            };
            nothing_else(&tcp, fields::TCP_HEALTH_CHECK, &at)?;
            raw
        }
        _ => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec!["health_checker (HTTP, gRPC and TCP checks only)".into()],
            });
        }
    };
    raw = RawHealthCheck {
        interval: duration(h.interval.take(), &format!("{at}.interval"))?,
        jitter: duration(h.interval_jitter.take(), &format!("{at}.interval_jitter"))?,
        timeout: duration(h.timeout.take(), &format!("{at}.timeout"))?,
        healthy_threshold: h.healthy_threshold.take().map(|v| v.value),
        unhealthy_threshold: h.unhealthy_threshold.take().map(|v| v.value),
        unhealthy_interval: duration(
            h.unhealthy_interval.take(),
            &format!("{at}.unhealthy_interval"),
        )?,
        unhealthy_edge_interval: duration(
            h.unhealthy_edge_interval.take(),
            &format!("{at}.unhealthy_edge_interval"),
        )?,
        healthy_edge_interval: duration(
            h.healthy_edge_interval.take(),
            &format!("{at}.healthy_edge_interval"),
        )?,
        // Envoy's default: 60 s between checks until the cluster has had traffic.
        no_traffic_interval: Some(
            duration(
                h.no_traffic_interval.take(),
                &format!("{at}.no_traffic_interval"),
            )?
            .unwrap_or(std::time::Duration::from_secs(60)),
        ),
        no_traffic_healthy_interval: duration(
            h.no_traffic_healthy_interval.take(),
            &format!("{at}.no_traffic_healthy_interval"),
        )?,
        event_log_path: event_log_path(&mut h, at)?,
        always_log_health_check_failures: Some(std::mem::take(
            &mut h.always_log_health_check_failures,
        )),
        always_log_health_check_success: Some(std::mem::take(
            &mut h.always_log_health_check_success,
        )),
        ..raw
    };
    // Whether checks reuse a connection changes no verdict.
    h.reuse_connection = None;
    nothing_else(&h, fields::HEALTH_CHECK, at)?;
    Ok(raw)
}

/// Envoy's HTTP check: path, host, method, body, expected and retriable statuses (200
/// alone passes unless told otherwise), and the blocks the body must hold.
fn http_check(
    mut http: envoy_types::pb::envoy::config::core::v3::health_check::HttpHealthCheck,
    at: &str,
) -> Result<RawHealthCheck, ResourceError> {
    let ranges = |list: Vec<envoy_types::pb::envoy::r#type::v3::Int64Range>, key: &str| {
        list.into_iter()
            .enumerate()
            .map(
                |(i, r)| match (u16::try_from(r.start), u16::try_from(r.end)) {
                    (Ok(start), Ok(end)) => Ok(crate::RawStatusRange { start, end }),
                    _ => Err(ResourceError::invalid(
                        format!("{at}.{key}[{i}]"),
                        "expected a range of statuses",
                    )),
                },
            )
            .collect::<Result<Vec<_>, _>>()
    };
    let expected = ranges(
        std::mem::take(&mut http.expected_statuses),
        "expected_statuses",
    )?;
    let (headers_add, headers_remove) = check_headers(
        std::mem::take(&mut http.request_headers_to_add),
        std::mem::take(&mut http.request_headers_to_remove),
        &format!("{at}.request_headers_to_add"),
    )?;
    let raw = RawHealthCheck {
        request_headers_to_add: headers_add,
        request_headers_to_remove: headers_remove,
        path: std::mem::take(&mut http.path),
        host: Some(std::mem::take(&mut http.host)).filter(|h| !h.is_empty()),
        method: match http.method {
            0 => None,
            m => Some(
                envoy_types::pb::envoy::config::core::v3::RequestMethod::try_from(m)
                    .map_err(|_| ResourceError::invalid(format!("{at}.method"), "unknown method"))?
                    .as_str_name()
                    .to_owned(),
            ),
        },
        // Envoy's default: 200 alone.
        expected_statuses: Some(if expected.is_empty() {
            vec![crate::RawStatusRange {
                start: 200,
                end: 201,
            }]
        } else {
            expected
        }),
        retriable_statuses: Some(ranges(
            std::mem::take(&mut http.retriable_statuses),
            "retriable_statuses",
        )?),
        send: http.send.take().map(|p| payload(p, at)).transpose()?,
        receive: Some(
            std::mem::take(&mut http.receive)
                .into_iter()
                .map(|p| payload(p, at))
                .collect::<Result<_, _>>()?,
        ),
        ..RawHealthCheck::default()
    };
    http.method = 0;
    // Envoy's default buffer for `receive` is the 1024 bytes read here.
    if http
        .response_buffer_size
        .as_ref()
        .is_some_and(|v| v.value == 1024)
    {
        http.response_buffer_size = None;
    }
    nothing_else(&http, fields::HTTP_HEALTH_CHECK, at)?;
    Ok(raw)
}

/// The file an event logger writes to: the deprecated `event_log_path`, or one
/// `envoy.health_check.event_sinks.file` logger (Envoy writes to both; one file here).
fn event_log_path(h: &mut HealthCheck, at: &str) -> Result<Option<String>, ResourceError> {
    use envoy_types::pb::envoy::extensions::health_check::event_sinks::file::v3::HealthCheckEventFileSink;
    let mut paths = Vec::new();
    let deprecated = std::mem::take(&mut h.event_log_path);
    if !deprecated.is_empty() {
        paths.push(deprecated);
    }
    for (i, logger) in std::mem::take(&mut h.event_logger).into_iter().enumerate() {
        let at = format!("{at}.event_logger[{i}]");
        const FILE_SINK: &str = "type.googleapis.com/envoy.extensions.health_check.event_sinks.file.v3.HealthCheckEventFileSink";
        let config = logger.typed_config.unwrap_or_default();
        if config.type_url != FILE_SINK {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec![format!(
                    "event sink {} (the file sink only)",
                    config.type_url
                )],
            });
        }
        let sink: HealthCheckEventFileSink = prost::Message::decode(config.value.as_slice())
            .map_err(|e| ResourceError::invalid(&at, format!("cannot decode: {e}")))?;
        paths.push(sink.event_log_path);
    }
    paths.dedup();
    match paths.len() {
        0 | 1 => Ok(paths.pop()),
        _ => Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["event logs to more than one file".into()],
        }),
    }
}

/// A check's headers as the file writes them: literal values set, names removed.
#[allow(clippy::type_complexity)]
fn check_headers(
    add: Vec<envoy_types::pb::envoy::config::core::v3::HeaderValueOption>,
    remove: Vec<String>,
    at: &str,
) -> Result<
    (
        Option<std::collections::BTreeMap<String, String>>,
        Option<Vec<String>>,
    ),
    ResourceError,
> {
    let Some(m) = crate::envoy::headers::mutations(add, remove, at)? else {
        return Ok((None, None));
    };
    // A check's request starts with no header but its host: adding, adding if absent and
    // setting are one here.
    let mut set = m.add;
    set.extend(m.add_if_absent);
    set.extend(m.set);
    Ok((
        Some(set).filter(|s| !s.is_empty()),
        Some(m.remove).filter(|r| !r.is_empty()),
    ))
}

/// A check's payload as the file writes it (`text`: hex).
fn payload(
    p: envoy_types::pb::envoy::config::core::v3::health_check::Payload,
    at: &str,
) -> Result<crate::RawPayload, ResourceError> {
    use envoy_types::pb::envoy::config::core::v3::health_check::payload::Payload as Kind;
    let text = match p.payload {
        Some(Kind::Text(hex)) => hex,
        Some(Kind::Binary(bytes)) => crate::serialize::hex(&bytes),
        None => return Err(ResourceError::invalid(at, "a payload without bytes")),
    };
    Ok(crate::RawPayload {
        text: Some(text),
        binary: None,
    })
}

/// Consecutive 5xx and gateway failures with Envoy's enforcement defaults (5xx enforced,
/// gateway failures not unless `enforcing_consecutive_gateway_failure` says so), success-rate
/// and failure-percentage ejection every `interval` with Envoy's defaults (success rate
/// enforced, failure percentage detected only), and Envoy's split of local-origin failures.
fn outliers(mut o: OutlierDetection, at: &str) -> Result<RawOutlierDetection, ResourceError> {
    let enforced = |v: Option<u32>, default: u32| v.unwrap_or(default) > 0;
    let five = o.consecutive_5xx.take().map_or(5, |v| v.value);
    let five_on = enforced(o.enforcing_consecutive_5xx.take().map(|v| v.value), 100);
    let gateway = o.consecutive_gateway_failure.take().map_or(5, |v| v.value);
    let gateway_on = enforced(
        o.enforcing_consecutive_gateway_failure
            .take()
            .map(|v| v.value),
        0,
    );
    let raw = RawOutlierDetection {
        consecutive_5xx: Some(if five_on { five } else { 0 }),
        consecutive_gateway_failure: Some(if gateway_on { gateway } else { 0 }),
        base_ejection_time: duration(
            o.base_ejection_time.take(),
            &format!("{at}.base_ejection_time"),
        )?,
        max_ejection_time: duration(
            o.max_ejection_time.take(),
            &format!("{at}.max_ejection_time"),
        )?,
        max_ejection_percent: o.max_ejection_percent.take().map(|v| v.value),
        always_eject_one_host: o.always_eject_one_host.take().map(|v| v.value),
        successful_active_health_check_uneject_host: o
            .successful_active_health_check_uneject_host
            .take()
            .map(|v| v.value),
        interval: duration(o.interval.take(), &format!("{at}.interval"))?,
        success_rate: Some(RawRateEjection {
            enforcing: o.enforcing_success_rate.take().map(|v| v.value),
            minimum_hosts: o.success_rate_minimum_hosts.take().map(|v| v.value),
            request_volume: o.success_rate_request_volume.take().map(|v| v.value),
            stdev_factor: o.success_rate_stdev_factor.take().map(|v| v.value),
            threshold: None,
        }),
        failure_percentage: Some(RawRateEjection {
            enforcing: o.enforcing_failure_percentage.take().map(|v| v.value),
            minimum_hosts: o.failure_percentage_minimum_hosts.take().map(|v| v.value),
            request_volume: o.failure_percentage_request_volume.take().map(|v| v.value),
            stdev_factor: None,
            threshold: o.failure_percentage_threshold.take().map(|v| v.value),
        }),
        ..RawOutlierDetection::default()
    };
    let mut raw = raw;
    // Without `split_external_local_origin_errors`, Envoy reads none of the local-origin
    // settings (connect failures and timeouts count as 5xx-like failures everywhere).
    if std::mem::take(&mut o.split_external_local_origin_errors) {
        let local = o
            .consecutive_local_origin_failure
            .take()
            .map_or(5, |v| v.value);
        let local_on = enforced(
            o.enforcing_consecutive_local_origin_failure
                .take()
                .map(|v| v.value),
            100,
        );
        raw.split_external_local_origin_errors = Some(true);
        raw.consecutive_local_origin_failure = Some(if local_on { local } else { 0 });
        raw.enforcing_local_origin_success_rate = o
            .enforcing_local_origin_success_rate
            .take()
            .map(|v| v.value);
        raw.enforcing_failure_percentage_local_origin = o
            .enforcing_failure_percentage_local_origin
            .take()
            .map(|v| v.value);
    } else {
        o.consecutive_local_origin_failure = None;
        o.enforcing_consecutive_local_origin_failure = None;
        o.enforcing_local_origin_success_rate = None;
        o.enforcing_failure_percentage_local_origin = None;
    }
    if o.max_ejection_time_jitter
        .as_ref()
        .is_some_and(|j| j.seconds == 0 && j.nanos == 0)
    {
        o.max_ejection_time_jitter = None;
    }
    nothing_else(&o, fields::OUTLIER_DETECTION, at)?;
    Ok(raw)
}

/// `upstream_connection_options`: TCP keep-alive (Envoy's seconds as durations);
/// `happy_eyeballs_config` is refused (a host here is one address).
fn connection_options(
    c: &mut Cluster,
    at: &str,
) -> Result<Option<crate::RawTcpKeepalive>, ResourceError> {
    let Some(mut options) = c.upstream_connection_options.take() else {
        return Ok(None);
    };
    let at = format!("{at}.upstream_connection_options");
    let keepalive = options
        .tcp_keepalive
        .take()
        .map(|k| crate::RawTcpKeepalive {
            probes: k.keepalive_probes.map(|v| v.value),
            time: k
                .keepalive_time
                .map(|v| Duration::from_secs(v.value.into())),
            interval: k
                .keepalive_interval
                .map(|v| Duration::from_secs(v.value.into())),
        });
    // The interface's name is only reported to filters that read it; none do here.
    options.set_local_interface_name_on_upstream_connections = false;
    nothing_else(&options, fields::UPSTREAM_CONNECTION_OPTIONS, &at)?;
    Ok(keepalive)
}

/// `preconnect_policy`: its two ratios, within 1..=3 as its proto bounds them. As in Envoy,
/// the predictive ratio does nothing where the balancer cannot tell its next picks (least
/// request, ring hash, maglev); `preconnect_enabled_metadata` is refused by name.
fn preconnect_policy(
    c: &mut Cluster,
    lb_policy: &str,
    at: &str,
) -> Result<Option<crate::RawPreconnect>, ResourceError> {
    let Some(mut policy) = c.preconnect_policy.take() else {
        return Ok(None);
    };
    let at = format!("{at}.preconnect_policy");
    let ratio = |value: Option<f64>, key: &str| match value {
        Some(r) if !(1.0..=crate::MAX_PRECONNECT_RATIO).contains(&r) => Err(
            ResourceError::invalid(format!("{at}.{key}"), "expected a ratio from 1 to 3"),
        ),
        value => Ok(value),
    };
    let per_upstream_ratio = ratio(
        policy.per_upstream_preconnect_ratio.take().map(|v| v.value),
        "per_upstream_preconnect_ratio",
    )?;
    let predictive_ratio = ratio(
        policy.predictive_preconnect_ratio.take().map(|v| v.value),
        "predictive_preconnect_ratio",
    )?;
    nothing_else(&policy, fields::PRECONNECT_POLICY, &at)?;
    Ok(Some(crate::RawPreconnect {
        per_upstream_ratio,
        predictive_ratio: predictive_ratio
            .filter(|_| matches!(lb_policy, "round_robin" | "random")),
    }))
}

/// `track_cluster_stats`: `per_endpoint_stats` (each host's counts); the request and response
/// size histograms and timeout budgets are refused by name.
fn track_cluster_stats(c: &mut Cluster, at: &str) -> Result<Option<bool>, ResourceError> {
    let Some(mut track) = c.track_cluster_stats.take() else {
        return Ok(None);
    };
    let per_endpoint = std::mem::take(&mut track.per_endpoint_stats);
    nothing_else(
        &track,
        fields::TRACK_CLUSTER_STATS,
        &format!("{at}.track_cluster_stats"),
    )?;
    Ok(Some(per_endpoint).filter(|on| *on))
}
