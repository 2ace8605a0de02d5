//! Cluster -> a cluster: its balancing, breakers, health checks, outlier detection and
//! protocol; endpoints inline (STATIC, STRICT_DNS) or by EDS name.

// Control planes still send the deprecated protocol and DNS fields; they are read, not
// ignored.
#![allow(deprecated)]

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, DnsLookupFamily,
};
use envoy_types::pb::envoy::config::cluster::v3::{CircuitBreakers, Cluster, OutlierDetection};
use envoy_types::pb::envoy::config::core::v3::{
    HealthCheck, Http2ProtocolOptions, HttpProtocolOptions, RoutingPriority, health_check,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions as UpstreamOptions;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
};
use envoy_types::pb::google::protobuf::Any;

use super::xds_endpoints::XdsEndpoints;
use super::xds_lb::balancing;
use crate::envoy::{ResourceError, decode, duration, fields, headers, nothing_else, type_url};
use crate::{RawCircuitBreakers, RawCluster, RawHealthCheck, RawLimit, RawOutlierDetection};

/// The upstream HTTP options' key in `typed_extension_protocol_options`.
const UPSTREAM_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
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
}

impl XdsCluster {
    pub fn decode(value: &Any) -> Result<Self, ResourceError> {
        let cluster: Cluster = decode(value, type_url::CLUSTER, "a Cluster")?;
        translate(cluster)
    }

    /// As the config file writes it, with `endpoints` (from EDS) when it takes them from there.
    pub(crate) fn section(&self, endpoints: Option<&XdsEndpoints>) -> RawCluster {
        let mut raw = self.raw.clone();
        if let Some(endpoints) = endpoints.or(self.inline.as_ref()) {
            raw.endpoints = endpoints.raw();
            raw.overprovisioning_factor = endpoints.overprovisioning_factor;
        }
        raw
    }
}

fn translate(mut c: Cluster) -> Result<XdsCluster, ResourceError> {
    let name = std::mem::take(&mut c.name);
    let at = format!("cluster `{name}`");
    let sub = |field: &str| format!("{at}.{field}");
    // Names for stats and metadata for other filters change nothing here.
    c.alt_stat_name.clear();
    c.metadata = None;

    let kind = match c.cluster_discovery_type.take() {
        None => DiscoveryType::Static,
        Some(ClusterDiscoveryType::Type(t)) => DiscoveryType::try_from(t).map_err(|_| {
            ResourceError::invalid(sub("type"), format!("unknown discovery type {t}"))
        })?,
        Some(ClusterDiscoveryType::ClusterType(_)) => {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec!["cluster_type (custom clusters)".into()],
            });
        }
    };
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
        DiscoveryType::Static | DiscoveryType::StrictDns => {
            let Some(cla) = load_assignment else {
                return Err(ResourceError::invalid(
                    sub("load_assignment"),
                    "a STATIC or STRICT_DNS cluster needs its endpoints here",
                ));
            };
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
    let mut max_requests_per_connection = c.max_requests_per_connection.take().map(|v| v.value);
    let mut protocol = None;
    if let Some(h2) = c.http2_protocol_options.take() {
        only_defaults_h2(&h2, &at)?;
        protocol = Some("http2".to_owned());
    }
    let mut preserve_header_case = None;
    if let Some(mut h1) = c.http_protocol_options.take() {
        preserve_header_case = Some(headers::preserve_case(
            &mut h1,
            &sub("http_protocol_options"),
        )?);
        if h1 != Default::default() {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec!["http_protocol_options settings".into()],
            });
        }
        protocol.get_or_insert_with(|| "http1".to_owned());
    }
    if let Some(common) = c.common_http_protocol_options.take() {
        max_requests_per_connection = common_options(common, &sub("common_http_protocol_options"))?
            .or(max_requests_per_connection);
    }
    if let Some(options) = c.typed_extension_protocol_options.remove(UPSTREAM_OPTIONS) {
        let (p, max, preserve) =
            upstream_options(&options, &sub("typed_extension_protocol_options"))?;
        protocol = Some(p.to_owned());
        preserve_header_case = preserve_header_case.or(preserve);
        max_requests_per_connection = max.or(max_requests_per_connection);
    }
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
    let tls = c
        .transport_socket
        .take()
        .map(|socket| crate::tls::xds::cluster_tls(socket, &at))
        .transpose()?;
    let dns_refresh_rate = duration(c.dns_refresh_rate.take(), &sub("dns_refresh_rate"))?;
    let respect_dns_ttl = std::mem::take(&mut c.respect_dns_ttl);
    let family = DnsLookupFamily::try_from(std::mem::take(&mut c.dns_lookup_family))
        .unwrap_or(DnsLookupFamily::Auto);
    nothing_else(&c, fields::CLUSTER, &at)?;

    let dns = kind == DiscoveryType::StrictDns;
    let raw = RawCluster {
        name: name.clone(),
        endpoints: Vec::new(),
        lb_policy: Some(balancing.lb_policy.to_owned()),
        least_request: balancing.least_request,
        ring_hash: balancing.ring_hash,
        maglev: balancing.maglev,
        hash_key: None,
        healthy_panic_threshold: balancing.healthy_panic_threshold,
        overprovisioning_factor: None,
        locality_weighted: Some(balancing.locality_weighted),
        protocol,
        connect_timeout,
        max_requests_per_connection,
        preserve_header_case: preserve_header_case.filter(|keep| *keep),
        per_connection_buffer_limit_bytes,
        circuit_breakers,
        health_check,
        outlier_detection,
        tls,
        dns_refresh_rate: dns_refresh_rate.filter(|_| dns),
        dns_min_refresh_rate: None,
        respect_dns_ttl: dns.then_some(respect_dns_ttl),
        dns_lookup_family: dns.then(|| {
            match family {
                // Envoy's AUTO prefers IPv6; the nearest here prefers IPv4 (docs/xds.md).
                DnsLookupFamily::Auto | DnsLookupFamily::V4Preferred => "v4_preferred",
                DnsLookupFamily::V4Only => "v4_only",
                DnsLookupFamily::V6Only => "v6_only",
                DnsLookupFamily::All => "all",
            }
            .to_owned()
        }),
        dns_resolvers: None,
        dynamic: true,
    };
    Ok(XdsCluster {
        name,
        raw,
        inline,
        eds,
    })
}

/// `max_requests_per_connection`; the rest of the common options is refused.
fn common_options(mut common: HttpProtocolOptions, at: &str) -> Result<Option<u32>, ResourceError> {
    let max = common.max_requests_per_connection.take().map(|v| v.value);
    nothing_else(&common, fields::HTTP_PROTOCOL_OPTIONS, at)?;
    Ok(max)
}

/// The upstream protocol (`explicit_http_config` only), `max_requests_per_connection` and
/// whether HTTP/1.1 names keep their case.
fn upstream_options(
    value: &Any,
    at: &str,
) -> Result<(&'static str, Option<u32>, Option<bool>), ResourceError> {
    let mut preserve = None;
    let mut options: UpstreamOptions =
        prost::Message::decode(value.value.as_slice()).map_err(|e| {
            ResourceError::invalid(at, format!("cannot decode {UPSTREAM_OPTIONS}: {e}"))
        })?;
    let max = options
        .common_http_protocol_options
        .take()
        .map(|c| common_options(c, &format!("{at}.common_http_protocol_options")))
        .transpose()?
        .flatten();
    let protocol = match options.upstream_protocol_options.take() {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(explicit)) => {
            match explicit.protocol_config {
                Some(ProtocolConfig::HttpProtocolOptions(mut h1)) => {
                    preserve = Some(headers::preserve_case(&mut h1, at)?);
                    if h1 != Default::default() {
                        return Err(ResourceError::Unsupported {
                            at: at.to_owned(),
                            fields: vec!["http_protocol_options settings".into()],
                        });
                    }
                    "http1"
                }
                Some(ProtocolConfig::Http2ProtocolOptions(h2)) => {
                    only_defaults_h2(&h2, at)?;
                    "http2"
                }
                _ => {
                    return Err(ResourceError::Unsupported {
                        at: at.to_owned(),
                        fields: vec!["http3_protocol_options".into()],
                    });
                }
            }
        }
        None => "http1",
        Some(_) => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec![
                    "use_downstream_protocol_config / auto_config (one explicit protocol only)"
                        .into(),
                ],
            });
        }
    };
    if options != UpstreamOptions::default() {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec![
                "upstream_http_protocol_options / http_filters / header_validation_config".into(),
            ],
        });
    }
    Ok((protocol, max, preserve))
}

/// HTTP/2 to the upstream with its own settings is not supported; with Envoy's defaults it is.
fn only_defaults_h2(h2: &Http2ProtocolOptions, at: &str) -> Result<(), ResourceError> {
    nothing_else(
        h2,
        fields::HTTP2_PROTOCOL_OPTIONS,
        &format!("{at}.http2_protocol_options"),
    )
}

fn breakers(mut b: CircuitBreakers, at: &str) -> Result<RawCircuitBreakers, ResourceError> {
    let thresholds = std::mem::take(&mut b.thresholds);
    nothing_else(&b, fields::CIRCUIT_BREAKERS, at)?;
    let mut raw = RawCircuitBreakers::default();
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
        t.track_remaining = false;
        nothing_else(&t, fields::THRESHOLDS, &format!("{at}.thresholds[{i}]"))?;
    }
    Ok(raw)
}

fn health(mut h: HealthCheck, at: &str) -> Result<RawHealthCheck, ResourceError> {
    let Some(health_check::HealthChecker::HttpHealthCheck(mut http)) = h.health_checker.take()
    else {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["health_checker (HTTP checks only)".into()],
        });
    };
    let path = std::mem::take(&mut http.path);
    let host = Some(std::mem::take(&mut http.host)).filter(|h| !h.is_empty());
    nothing_else(
        &http,
        fields::HTTP_HEALTH_CHECK,
        &format!("{at}.http_health_check"),
    )?;
    let raw = RawHealthCheck {
        path,
        host,
        interval: duration(h.interval.take(), &format!("{at}.interval"))?,
        jitter: duration(h.interval_jitter.take(), &format!("{at}.interval_jitter"))?,
        timeout: duration(h.timeout.take(), &format!("{at}.timeout"))?,
        healthy_threshold: h.healthy_threshold.take().map(|v| v.value),
        unhealthy_threshold: h.unhealthy_threshold.take().map(|v| v.value),
    };
    // Whether checks reuse a connection changes no verdict.
    h.reuse_connection = None;
    nothing_else(&h, fields::HEALTH_CHECK, at)?;
    Ok(raw)
}

/// Consecutive 5xx and gateway failures with Envoy's enforcement defaults (5xx enforced,
/// gateway failures not unless `enforcing_consecutive_gateway_failure` says so). Success-rate
/// and failure-percentage ejection are not supported and refused when configured.
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
    };
    // Ejections are decided as results come in, not on a timer; the interval is unused.
    o.interval = None;
    nothing_else(&o, fields::OUTLIER_DETECTION, at)?;
    Ok(raw)
}
