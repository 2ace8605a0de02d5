//! Clusters as the file writes them (serde, unknown keys refused).

use std::time::Duration;

use serde::Deserialize;

use crate::units::{de_opt_duration, de_opt_size};
use crate::*;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    pub name: String,
    pub endpoints: Vec<RawEndpoint>,
    #[serde(default)]
    pub lb_policy: Option<String>,
    pub least_request: Option<RawLeastRequest>,
    pub ring_hash: Option<RawRingHash>,
    pub maglev: Option<RawMaglev>,
    pub hash_key: Option<RawHashKey>,
    /// What a request is hashed on, over its route's `hash_policy` (its rules).
    #[serde(default)]
    pub hash_policy: Vec<crate::hash_policy::RawHashRule>,
    pub healthy_panic_threshold: Option<f64>,
    pub overprovisioning_factor: Option<u32>,
    pub locality_weighted: Option<bool>,
    pub zone_aware: Option<RawZoneAware>,
    pub slow_start: Option<RawSlowStart>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub connect_timeout: Option<Duration>,
    pub max_requests_per_connection: Option<u32>,
    /// An upstream connection with no request for this long is closed (`0s`: never).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Duration>,
    /// An upstream connection this old takes no new request and closes once idle.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_connection_duration: Option<Duration>,
    pub tcp_keepalive: Option<RawTcpKeepalive>,
    /// Each host's own request and connection counts, as Envoy's `per_endpoint_stats`.
    pub per_endpoint_stats: Option<bool>,
    pub preserve_header_case: Option<bool>,
    pub initial_stream_window_size: Option<u32>,
    pub initial_connection_window_size: Option<u32>,
    /// HTTP/2: streams one connection to a host carries before another is opened.
    pub max_concurrent_streams: Option<u32>,
    /// HTTP/2: PINGs that find a dead connection to a host.
    pub http2_keepalive: Option<RawUpstreamKeepalive>,
    /// HTTP/2: a host's malformed message resets its stream only (default: closes the
    /// connection, as Envoy).
    pub stream_error_on_invalid_http_message: Option<bool>,
    /// Relayed (`tcp_proxy`) connections to a host close when it fails its health checks or
    /// is ejected (HTTP connections are drained either way).
    pub close_connections_on_host_health_failure: Option<bool>,
    /// Connections opened ahead of the requests that will use them (Envoy's
    /// `preconnect_policy`).
    pub preconnect: Option<RawPreconnect>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub per_connection_buffer_limit_bytes: Option<u64>,
    pub circuit_breakers: Option<RawCircuitBreakers>,
    pub health_check: Option<RawHealthCheck>,
    pub outlier_detection: Option<RawOutlierDetection>,
    pub tls: Option<RawClusterTls>,
    /// TLS connections name each request's host (SNI), and are pooled by it.
    pub auto_sni: Option<bool>,
    /// With `auto_sni`: the host's certificate is verified against that name.
    pub auto_san_validation: Option<bool>,
    /// With `auto_sni`: the header the name is read from instead of the host.
    pub override_auto_sni_header: Option<String>,
    /// Other transports for the endpoints whose labels they match.
    #[serde(default)]
    pub transport_socket_matches: Vec<crate::cluster::socket_match::RawTransportSocketMatch>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub dns_refresh_rate: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub dns_min_refresh_rate: Option<Duration>,
    pub respect_dns_ttl: Option<bool>,
    pub dns_lookup_family: Option<String>,
    pub dns_resolvers: Option<Vec<String>>,
    /// The one endpoint's name is one host whose connections go to the first address of
    /// the latest answer (Envoy's LOGICAL_DNS).
    pub logical_dns: Option<bool>,
    /// Set on clusters from a management server: names as control planes write them, and
    /// possibly no endpoints.
    #[serde(skip)]
    pub dynamic: bool,
}

/// Envoy's `preconnect_policy`: each ratio from 1 (off) to 3.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPreconnect {
    pub per_upstream_ratio: Option<f64>,
    pub predictive_ratio: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCircuitBreakers {
    pub max_connections: Option<RawLimit>,
    pub max_pending_requests: Option<RawLimit>,
    pub max_requests: Option<RawLimit>,
    pub max_retries: Option<RawLimit>,
    pub retry_budget: Option<RawRetryBudget>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub pending_timeout: Option<Duration>,
    /// Connections open to any one host at once (Envoy's `per_host_thresholds`).
    pub max_connections_per_host: Option<u32>,
    /// Connection pools (a host's connections on one worker, for one name) with a
    /// connection open at once.
    pub max_connection_pools: Option<u32>,
}

/// Envoy's defaults: 20 percent, at least 3.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetryBudget {
    pub budget_percent: Option<f64>,
    pub min_retry_concurrency: Option<u32>,
}

/// `1000` or `{ per_core: 250 }`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum RawLimit {
    Fixed(u64),
    PerCore(RawPerCore),
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPerCore {
    pub per_core: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealthCheck {
    #[serde(default)]
    pub path: String,
    pub host: Option<String>,
    pub method: Option<String>,
    /// `[{ start: 200, end: 300 }]`: `end` excluded.
    pub expected_statuses: Option<Vec<RawStatusRange>>,
    pub retriable_statuses: Option<Vec<RawStatusRange>>,
    /// A TCP check instead of HTTP.
    pub tcp: Option<bool>,
    /// `{ text: HEX }` or `{ binary: BASE64 }`.
    pub send: Option<RawPayload>,
    pub receive: Option<Vec<RawPayload>>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub interval: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub jitter: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    pub healthy_threshold: Option<u32>,
    pub unhealthy_threshold: Option<u32>,
    /// A gRPC check (grpc.health.v1) instead of HTTP.
    pub grpc: Option<RawGrpcHealthCheck>,
    /// HTTP and gRPC: headers added to each check (literal values), and headers removed.
    pub request_headers_to_add: Option<std::collections::BTreeMap<String, String>>,
    pub request_headers_to_remove: Option<Vec<String>>,
    /// The interval after a failed check (default: `interval`)...
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub unhealthy_interval: Option<Duration>,
    /// ...after a failed check while the host is still passing (a change pending; default:
    /// `unhealthy_interval`)...
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub unhealthy_edge_interval: Option<Duration>,
    /// ...and after a passed check while the host is still failing (default: `interval`).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub healthy_edge_interval: Option<Duration>,
    /// The interval while the cluster has never opened a connection (default: `interval`;
    /// Envoy's 60s over xDS)...
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub no_traffic_interval: Option<Duration>,
    /// ...and for a passing host then (default: `no_traffic_interval`).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub no_traffic_healthy_interval: Option<Duration>,
    /// A JSON line per health event (Envoy's `HealthCheckEvent`) is appended to this file.
    pub event_log_path: Option<String>,
    /// Also log every failed check, and every passed one, not only changes.
    pub always_log_health_check_failures: Option<bool>,
    pub always_log_health_check_success: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGrpcHealthCheck {
    /// The service asked about; empty: the server as a whole.
    #[serde(default)]
    pub service_name: String,
    /// The `:authority` of the check (default: the cluster's name).
    pub authority: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStatusRange {
    pub start: u16,
    pub end: u16,
}

/// Bytes as Envoy's health-check `Payload` writes them: hex text or base64.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPayload {
    pub text: Option<String>,
    pub binary: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutlierDetection {
    pub consecutive_5xx: Option<u32>,
    pub consecutive_gateway_failure: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub base_ejection_time: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_ejection_time: Option<Duration>,
    pub max_ejection_percent: Option<u32>,
    pub always_eject_one_host: Option<bool>,
    pub successful_active_health_check_uneject_host: Option<bool>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub interval: Option<Duration>,
    pub success_rate: Option<RawRateEjection>,
    pub failure_percentage: Option<RawRateEjection>,
    /// Count failures of the proxy's own making (no connection, a reset, a timeout) apart from
    /// the host's answers (5xx), each with its own limits (Envoy's
    /// `split_external_local_origin_errors`).
    pub split_external_local_origin_errors: Option<bool>,
    /// With the split: local-origin failures in a row that eject a host (5; 0: off)...
    pub consecutive_local_origin_failure: Option<u32>,
    /// ...and the enforcement of the rate ejections over local-origin failures (percent).
    pub enforcing_local_origin_success_rate: Option<u32>,
    pub enforcing_failure_percentage_local_origin: Option<u32>,
}

/// `{ enforcing, minimum_hosts, request_volume, stdev_factor | threshold }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateEjection {
    pub enforcing: Option<u32>,
    pub minimum_hosts: Option<u32>,
    pub request_volume: Option<u32>,
    /// Success rate only.
    pub stdev_factor: Option<u32>,
    /// Failure percentage only.
    pub threshold: Option<u32>,
}

impl RawCluster {
    /// The TLS `endpoint` is reached with (its transport socket match's, else the
    /// cluster's); `None`: cleartext.
    pub(crate) fn tls_of(&self, endpoint: Option<&RawEndpoint>) -> Option<&RawClusterTls> {
        let labels = match endpoint {
            Some(RawEndpoint::Weighted(e)) => (
                e.transport_socket_match.as_ref(),
                e.locality_transport_socket_match.as_ref(),
            ),
            _ => (None, None),
        };
        let matches = self.transport_socket_matches.iter().map(|m| (&m.labels, m));
        match crate::cluster::socket_match::resolve(matches, labels.0, labels.1) {
            Some(m) => m.tls.as_ref(),
            None => self.tls.as_ref(),
        }
    }
}

/// `127.0.0.1:9000`, `backend.internal:9000`, or `{ address: 127.0.0.1:9000, weight: 3 }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawEndpoint {
    Address(String),
    Weighted(RawWeightedEndpoint),
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeightedEndpoint {
    pub address: String,
    pub weight: Option<u32>,
    pub priority: Option<u32>,
    pub locality: Option<String>,
    pub locality_weight: Option<u32>,
    pub health: Option<String>,
    /// The host's name, for routes with `auto_host_rewrite`.
    pub hostname: Option<String>,
    /// The host's own health-check target: another port, another host header.
    pub health_check: Option<RawEndpointHealthCheck>,
    /// The labels a cluster's `transport_socket_matches` are matched against (Envoy's
    /// `envoy.transport_socket_match` metadata), and those of its locality, asked second.
    pub transport_socket_match: Option<crate::cluster::socket_match::Labels>,
    pub locality_transport_socket_match: Option<crate::cluster::socket_match::Labels>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEndpointHealthCheck {
    pub hostname: Option<String>,
    pub port: Option<u16>,
}

/// HTTP/2 PINGs to a host (Envoy's `connection_keepalive`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamKeepalive {
    /// A PING this often (`0s`: none on a timer).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub interval: Option<Duration>,
    /// How long an answer may take before the connection is closed (default 20s).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    /// Percent of `interval` added at random, drawn per connection (default 15).
    pub interval_jitter: Option<f64>,
    /// A connection idle this long is not given a new stream (`0s`: no limit).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub connection_idle_interval: Option<Duration>,
}

/// TCP keep-alive probes on upstream connections; unset values are the system's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTcpKeepalive {
    /// Unanswered probes before the connection is dropped.
    pub probes: Option<u32>,
    /// Idle time before the first probe.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub time: Option<Duration>,
    /// Time between probes.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub interval: Option<Duration>,
}

/// Slow start (Envoy's `slow_start_config`): hosts that join ramp up to their weight.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlowStart {
    #[serde(deserialize_with = "crate::units::de_duration")]
    pub window: Duration,
    /// 1 (the default) is linear.
    pub aggression: Option<f64>,
    /// The least share of its weight a ramping host gets (10 by default).
    pub min_weight_percent: Option<f64>,
}

/// Zone-aware routing's settings (Envoy's `zone_aware_lb_config`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawZoneAware {
    /// Percent of requests routed by zone (100).
    pub routing_enabled: Option<f64>,
    /// Fewer healthy hosts than this: no zone routing (6).
    pub min_cluster_size: Option<u64>,
    /// With this many healthy hosts in the local zone, everything goes there.
    pub force_local_zone_min_size: Option<u32>,
    pub fail_traffic_on_panic: Option<bool>,
    /// `healthy_hosts_num` (the default) or `healthy_hosts_weight`.
    pub locality_basis: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLeastRequest {
    pub choice_count: Option<u32>,
    pub active_request_bias: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRingHash {
    pub minimum_ring_size: Option<u64>,
    pub maximum_ring_size: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMaglev {
    pub table_size: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHashKey {
    pub header: Option<String>,
    pub cookie: Option<String>,
    pub source_ip: Option<bool>,
}
