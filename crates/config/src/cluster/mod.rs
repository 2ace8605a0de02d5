//! Clusters: upstream hosts, how requests are balanced over them, their breakers, health
//! checks and outlier detection.
//!
//! The topic's files, side by side: this one holds the typed settings and defaults; `dns.rs`
//! endpoints by name; `raw.rs` the file's form; `check.rs` and `check_dns.rs` the checks;
//! `socket_match.rs` the transports picked per endpoint;
//! `xds.rs` and `xds_endpoints.rs` the mapping of Envoy's `Cluster` and
//! `ClusterLoadAssignment`.

pub(crate) mod check;
pub(crate) mod check_dns;
pub mod dns;
pub mod local;
pub mod raw;
pub mod socket_match;
pub mod xds;
pub mod xds_endpoints;
mod xds_lb;
mod xds_protocol;

use std::time::Duration;

use http::HeaderName;
use serde::{Serialize, Serializer};

use crate::serialize as ser;
use crate::*;

/// The config's clusters by name: their places in [`Config::clusters`], which routes and
/// filters hold. Keys come from the config, so a fast hash is safe.
pub type ClusterIndex<'a> = std::collections::HashMap<&'a str, usize, foldhash::fast::RandomState>;

/// Time allowed for a TCP connect to an upstream host, unless the cluster says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest a request waits for an upstream connection when `max_connections` is reached.
pub const DEFAULT_PENDING_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Serialize)]
pub struct ClusterConfig {
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    #[serde(flatten, serialize_with = "ser::lb_policy")]
    pub lb_policy: LbPolicy,
    /// Panic threshold, overprovisioning factor and locality weighting.
    #[serde(flatten, serialize_with = "ser::lb_settings")]
    pub lb_settings: LbSettings,
    /// What consistent-hashing policies hash; `None` picks as if without a key.
    pub hash_key: Option<HashKey>,
    /// What a request is hashed on, over its route's `hash_policy` (Envoy's cluster-level
    /// `HttpProtocolOptions.hash_policy`); `ring_hash` and `maglev` clusters only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash_policy: Option<crate::hash_policy::HashPolicy>,
    pub protocol: UpstreamProtocol,
    #[serde(serialize_with = "ser::duration")]
    pub connect_timeout: Duration,
    /// Requests sent on one upstream connection before it is retired; `None`: no limit.
    pub max_requests_per_connection: Option<u32>,
    /// An upstream connection without a request for this long is closed; `None`: never.
    #[serde(serialize_with = "ser::opt_duration")]
    pub idle_timeout: Option<Duration>,
    /// An upstream connection this old takes no new request and closes once its requests
    /// are done; `None`: no limit.
    #[serde(serialize_with = "ser::opt_duration")]
    pub max_connection_duration: Option<Duration>,
    /// Each host's own request and connection counts (`host_rq_total`, ...).
    pub per_endpoint_stats: bool,
    /// TCP keep-alive on upstream connections; `None`: off (the system's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// HTTP/1.1 header names written as the client spelled them (where its listener keeps
    /// case too), and the responses' noted as the host spells them.
    pub preserve_header_case: bool,
    /// HTTP/2: the bytes a host may send on one stream, and on the connection, before the
    /// proxy has passed them on. `None`: the buffer limit (at least 65535 for the connection).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_stream_window_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_connection_window_size: Option<u32>,
    /// HTTP/2: streams one connection to a host carries; past it another is opened.
    /// `None`: no limit of the proxy's (one connection per host and worker).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<u32>,
    /// HTTP/2 PINGs to the hosts; `None`: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http2_keepalive: Option<UpstreamKeepalive>,
    /// HTTP/2: a host's malformed message resets that stream and keeps the connection;
    /// `false` (Envoy's default) closes the connection.
    pub stream_error_on_invalid_http_message: bool,
    /// Relayed (`tcp_proxy`) connections to a host close when it fails its health checks or
    /// is ejected; HTTP connections opened before such a failure take no new request either
    /// way, as Envoy drains them.
    pub close_connections_on_host_health_failure: bool,
    /// Connections opened ahead of requests; `None`: each request opens what it needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preconnect: Option<Preconnect>,
    /// The upstream side of [`ListenerConfig::buffer_limit`], per upstream connection.
    #[serde(rename = "per_connection_buffer_limit_bytes")]
    pub buffer_limit: u32,
    pub circuit_breakers: CircuitBreakerConfig,
    pub health_check: Option<HealthCheckConfig>,
    pub outlier_detection: Option<OutlierDetectionConfig>,
    /// TLS to the hosts; `None`: cleartext.
    pub tls: Option<ClusterTlsConfig>,
    /// SNI from each request's host, connections pooled by it (Envoy's `auto_sni`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_sni: Option<AutoSni>,
    /// Other transports, for the endpoints that name them ([`Endpoint::transport_socket`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub transport_socket_matches: Vec<socket_match::TransportSocketMatch>,
    /// How names among the endpoints are resolved.
    #[serde(flatten)]
    pub dns: DnsConfig,
}

impl ClusterConfig {
    /// Whether some endpoint is a DNS name (the cluster then resolves while serving).
    pub fn has_names(&self) -> bool {
        self.endpoints.iter().any(|e| e.address.is_name())
    }
}

/// TLS connections that name the request's host (Envoy's `auto_sni`): sent as SNI and, unless
/// the TLS settings verify the host by `subject_alt_names`, the name its certificate is
/// verified against (Envoy's `auto_san_validation`). A host's connections are pooled per
/// name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AutoSni {
    /// The request header the name is read from when present and not empty
    /// (`override_auto_sni_header`); otherwise the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Asked for (`auto_san_validation`): the certificate is verified against the name.
    pub san_validation: bool,
}

/// Connections opened before the requests that will use them (Envoy's `preconnect_policy`).
/// Each ratio is at least 1 (nothing ahead) and at most 3.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Preconnect {
    /// Per host and worker: connections for this many times the requests in flight (and
    /// being sent), counted in streams (an HTTP/2 connection holds many).
    pub per_upstream_ratio: f64,
    /// Across the cluster: connections for this many times the requests in flight, opened
    /// to the hosts the next picks will go to (round robin and random only).
    pub predictive_ratio: f64,
}

/// The most either preconnect ratio may be, as Envoy's: more would open connections faster
/// than they help.
pub const MAX_PRECONNECT_RATIO: f64 = 3.0;

/// Envoy's default upstream idle timeout.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// HTTP/2 PINGs on upstream connections (Envoy's `connection_keepalive`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UpstreamKeepalive {
    /// A PING this often, plus the jitter; `None`: none on a timer.
    #[serde(serialize_with = "ser::opt_duration")]
    pub interval: Option<Duration>,
    /// No answer this long closes the connection.
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    /// Up to this percent of `interval` added, drawn once per connection.
    pub interval_jitter: f64,
    /// A connection idle this long takes no new stream: the request opens a fresh one.
    #[serde(serialize_with = "ser::opt_duration")]
    pub connection_idle_interval: Option<Duration>,
}

/// TCP keep-alive probes; `None` values are the system's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TcpKeepalive {
    pub probes: Option<u32>,
    #[serde(serialize_with = "ser::opt_duration")]
    pub time: Option<Duration>,
    #[serde(serialize_with = "ser::opt_duration")]
    pub interval: Option<Duration>,
}

/// A circuit-breaker limit as written: a number for the whole process, or a number per
/// worker, multiplied out when the worker count is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitSpec {
    PerCore(u32),
    #[serde(untagged)]
    Fixed(u32),
}

impl LimitSpec {
    /// The limit for a process with `workers` workers.
    pub fn resolve(self, workers: usize) -> u32 {
        match self {
            LimitSpec::Fixed(n) => n,
            LimitSpec::PerCore(n) => n.saturating_mul(workers.max(1) as u32),
        }
    }
}

/// Envoy's four circuit breakers of a cluster, for the whole process (all workers together).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CircuitBreakerConfig {
    /// Upstream connections open at once.
    pub max_connections: LimitSpec,
    /// Requests waiting for a connection at once.
    pub max_pending_requests: LimitSpec,
    /// Requests in flight at once.
    pub max_requests: LimitSpec,
    /// Retries in flight at once...
    pub max_retries: LimitSpec,
    /// ...or, where given, a share of the requests active and pending (Envoy's
    /// `retry_budget`), in place of `max_retries`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<RetryBudget>,
    /// Longest a request waits for a connection before it gets 503.
    #[serde(serialize_with = "ser::duration")]
    pub pending_timeout: Duration,
    /// Connections open to any one host at once, on top of `max_connections`; `None`: no
    /// limit per host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections_per_host: Option<u32>,
    /// Connection pools holding a connection at once (a host's on one worker, for one
    /// `auto_sni` name); past it a request needing a new pool gets 503 (Envoy's
    /// `max_connection_pools`). `None`: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connection_pools: Option<u32>,
}

impl Default for CircuitBreakerConfig {
    /// Per core, so that a bigger machine gets proportionally more (lesson L1): one core relays
    /// tens of thousands of requests a second, which at 100 ms mean latency is thousands in
    /// flight.
    fn default() -> Self {
        Self {
            max_connections: LimitSpec::PerCore(1024),
            max_pending_requests: LimitSpec::PerCore(1024),
            max_requests: LimitSpec::PerCore(4096),
            max_retries: LimitSpec::PerCore(32),
            retry_budget: None,
            pending_timeout: DEFAULT_PENDING_TIMEOUT,
            max_connections_per_host: None,
            max_connection_pools: None,
        }
    }
}

/// Envoy's retry budget: retries in flight at most `budget_percent` of the requests active and
/// pending, and never fewer than `min_retry_concurrency`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RetryBudget {
    pub budget_percent: f64,
    pub min_retry_concurrency: u32,
}

/// Active health checking of a cluster's hosts, once per process: an HTTP request (in the
/// protocol the cluster speaks), or a TCP connection with an optional exchange of bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthCheckConfig {
    /// HTTP: the request's path; empty for a TCP check.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// `host` header of the check; the cluster's name if not given (as Envoy).
    pub host: Option<String>,
    /// HTTP: the request's method (GET by default).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser::opt_method"
    )]
    pub method: Option<http::Method>,
    /// HTTP: the statuses that pass, as `[start, end)` ranges; empty: any 2xx.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub expected_statuses: Vec<(u16, u16)>,
    /// HTTP: statuses that count as a failure towards `unhealthy_threshold`; any other
    /// status that does not pass makes the host unhealthy at once (as Envoy).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retriable_statuses: Vec<(u16, u16)>,
    /// TCP instead of HTTP: connect, send `send` if any, and pass once every `receive`
    /// block has been read, in order (not necessarily adjacent).
    pub tcp: bool,
    /// Bytes sent: the HTTP request's body, or on the TCP connection.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser::opt_hex"
    )]
    pub send: Option<Vec<u8>>,
    /// Blocks the response (HTTP: the first 1024 bytes of its body) must hold, in order.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "ser::hex_list"
    )]
    pub receive: Vec<Vec<u8>>,
    #[serde(serialize_with = "ser::duration")]
    pub interval: Duration,
    /// Up to this much is added at random to each interval, so checks do not line up.
    #[serde(serialize_with = "ser::duration")]
    pub jitter: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    /// Consecutive passes that make an unhealthy host healthy.
    pub healthy_threshold: u32,
    /// Consecutive failures that make a healthy host unhealthy.
    pub unhealthy_threshold: u32,
    /// A gRPC check (`grpc.health.v1.Health/Check` over HTTP/2) instead of HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GrpcHealthCheck>,
    /// HTTP and gRPC: headers added to each check, and headers left out of it.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "ser::header_pairs"
    )]
    pub request_headers_to_add: Vec<(HeaderName, http::HeaderValue)>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "ser::header_names"
    )]
    pub request_headers_to_remove: Vec<HeaderName>,
    /// The interval after a failed check, and while a change is pending (short of the
    /// threshold) after a failed and after a passed check.
    #[serde(serialize_with = "ser::duration")]
    pub unhealthy_interval: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub unhealthy_edge_interval: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub healthy_edge_interval: Duration,
    /// The interval until the cluster first opens a connection (traffic), for a failing
    /// host and for a passing one.
    #[serde(serialize_with = "ser::duration")]
    pub no_traffic_interval: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub no_traffic_healthy_interval: Duration,
    /// Where health events are logged as JSON lines; `None`: not logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_log_path: Option<String>,
    pub always_log_health_check_failures: bool,
    pub always_log_health_check_success: bool,
}

/// A gRPC health check's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrpcHealthCheck {
    /// The service asked about; empty: the server as a whole.
    pub service_name: String,
    /// The check's `:authority`; `None`: the cluster's name.
    pub authority: Option<String>,
}

/// Passive health: hosts that keep failing are ejected for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OutlierDetectionConfig {
    /// Consecutive 5xx responses (including local 502/503/504) that eject a host; 0: off.
    pub consecutive_5xx: u32,
    /// Consecutive 502/503/504 and connect failures or resets that eject a host; 0: off.
    pub consecutive_gateway_failure: u32,
    /// An ejection lasts this times the host's number of ejections so far...
    #[serde(serialize_with = "ser::duration")]
    pub base_ejection_time: Duration,
    /// ...but never longer than this (at least `base_ejection_time`).
    #[serde(serialize_with = "ser::duration")]
    pub max_ejection_time: Duration,
    /// At most this share of the cluster's hosts is ejected at once...
    pub max_ejection_percent: u32,
    /// ...but one host may be when none is, whatever the share (Envoy's
    /// `always_eject_one_host`).
    pub always_eject_one_host: bool,
    /// A passing active health check ends an ejection (Envoy's
    /// `successful_active_health_check_uneject_host`, true by default).
    pub uneject_on_health_check: bool,
    /// How often success rates and failure percentages are computed over the hosts.
    #[serde(serialize_with = "ser::duration")]
    pub interval: Duration,
    /// Envoy's success-rate ejection: a host whose success rate over the interval is below
    /// the mean of the hosts' minus `stdev_factor / 1000` standard deviations.
    pub success_rate: RateEjection,
    /// Envoy's failure-percentage ejection: a host whose failures over the interval reach
    /// `threshold` percent.
    pub failure_percentage: RateEjection,
    /// With local-origin failures split from the host's answers: their own limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_origin: Option<LocalOriginConfig>,
}

/// Envoy's `split_external_local_origin_errors`: connect failures, resets and timeouts are
/// counted apart, with these limits; 5xx and the gateway failures count the host's answers
/// only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LocalOriginConfig {
    /// Local-origin failures in a row that eject a host; 0: off.
    pub consecutive_failure: u32,
    /// Percent of the success-rate and failure-percentage outliers over local-origin
    /// failures ejected (the rules' other settings are theirs).
    pub success_rate_enforcing: u32,
    pub failure_percentage_enforcing: u32,
}

/// An ejection by rates measured over an interval (success rate, failure percentage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RateEjection {
    /// Percent of detected outliers actually ejected (0: detection only).
    pub enforcing: u32,
    /// Hosts with at least `request_volume` requests in the interval needed to judge.
    pub minimum_hosts: u32,
    /// Requests a host needs in the interval to be judged.
    pub request_volume: u32,
    /// Success rate: standard deviations below the mean, x1000 (Envoy's 1900 = 1.9).
    /// Failure percentage: the percent of failures that ejects.
    pub threshold: u32,
}

impl RateEjection {
    /// Envoy's success-rate defaults: enforced, 5 hosts of 100 requests, 1.9 deviations.
    pub const SUCCESS_RATE: RateEjection = RateEjection {
        enforcing: 100,
        minimum_hosts: 5,
        request_volume: 100,
        threshold: 1900,
    };
    /// Envoy's failure-percentage defaults: not enforced, 5 hosts of 50 requests, 85%.
    pub const FAILURE_PERCENTAGE: RateEjection = RateEjection {
        enforcing: 0,
        minimum_hosts: 5,
        request_volume: 50,
        threshold: 85,
    };
}

/// An upstream host of a cluster, or a name whose addresses are its hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    pub address: EndpointAddress,
    /// Relative share of traffic, at least 1.
    pub weight: u32,
    /// Envoy's priority: 0 is served first, higher levels take what it cannot.
    #[serde(skip_serializing_if = "is_first_priority")]
    pub priority: u32,
    /// The host's locality (Envoy's region/zone/sub-zone, joined with `/`); `None`: the
    /// unnamed one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locality: Option<String>,
    /// The locality's weight (with `locality_weighted` balancing); `None`: no load for the
    /// locality there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locality_weight: Option<u32>,
    /// The health the configuration (a management server) gives the host.
    #[serde(skip_serializing_if = "EndpointHealth::is_healthy")]
    pub health: EndpointHealth,
    /// The host's name (routes with `auto_host_rewrite` send it); for an endpoint that is a
    /// DNS name, that name when not given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The host header of its health checks, over the cluster's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_check_hostname: Option<String>,
    /// The port its health checks connect to, instead of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_check_port: Option<u16>,
    /// The cluster's transport socket match it is reached by, by name; `None`: the
    /// cluster's own `tls` (or cleartext).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport_socket: Option<String>,
}

fn is_first_priority(priority: &u32) -> bool {
    *priority == 0
}

impl Endpoint {
    /// A healthy endpoint of weight 1 at priority 0, in no locality.
    pub fn new(address: EndpointAddress) -> Self {
        Self {
            address,
            weight: 1,
            priority: 0,
            locality: None,
            locality_weight: None,
            health: EndpointHealth::Healthy,
            hostname: None,
            health_check_hostname: None,
            health_check_port: None,
            transport_socket: None,
        }
    }
}

/// The health a management server (Envoy's EDS `health_status`) or the file gives a host.
/// Active health checks and outlier detection can only make it worse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointHealth {
    #[default]
    Healthy,
    /// Takes load only when healthy hosts are too few.
    Degraded,
    /// Takes no load unless its priority level is in panic (Envoy's UNHEALTHY and TIMEOUT).
    Unhealthy,
    /// On its way out (Envoy's DRAINING): not counted in its level's health, and takes load
    /// only when the level is in panic.
    Draining,
}

impl EndpointHealth {
    fn is_healthy(&self) -> bool {
        *self == EndpointHealth::Healthy
    }
}

/// The request attribute that ring hash and maglev hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    Header(HeaderName),
    Cookie(String),
    SourceIp,
}

impl Serialize for HashKey {
    /// As written: `header: NAME`, `cookie: NAME` or `source_ip: true`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self {
            HashKey::Header(name) => map.serialize_entry("header", name.as_str())?,
            HashKey::Cookie(name) => map.serialize_entry("cookie", name)?,
            HashKey::SourceIp => map.serialize_entry("source_ip", &true)?,
        }
        map.end()
    }
}

/// The protocol spoken to a cluster's hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with a keep-alive pool of connections per host.
    Http1,
    /// HTTP/2 (prior knowledge in cleartext, ALPN `h2` over TLS): one multiplexed
    /// connection per host.
    Http2,
    /// Whichever of the two each host chooses by ALPN, HTTP/2 first (Envoy's `auto_config`);
    /// TLS clusters only.
    Auto,
    /// The client's: HTTP/2 for requests that came over HTTP/2, HTTP/1.1 for the others
    /// (Envoy's `use_downstream_protocol_config`).
    Downstream,
}

impl UpstreamProtocol {
    /// The ALPN identifiers offered to TLS hosts, preferred first.
    pub fn alpn(self) -> &'static [&'static [u8]] {
        match self {
            UpstreamProtocol::Http1 => &[b"http/1.1"],
            UpstreamProtocol::Http2 => &[b"h2"],
            UpstreamProtocol::Auto | UpstreamProtocol::Downstream => &[b"h2", b"http/1.1"],
        }
    }
}
