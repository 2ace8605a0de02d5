//! Legate's configuration: parsed once from YAML (or translated from Envoy's xDS resources),
//! validated, then trusted.
//!
//! [`Config::from_yaml`] is the only way in. Every error names the key path that is wrong
//! (`listeners[0].virtual_hosts[1].routes[0].cluster`) and what was expected; after that, the rest of the proxy
//! reads plain values with defaults filled in and never re-checks them.

pub mod access_log;
mod admin;
mod check;
mod dns;
pub mod filters;
pub mod machine;
mod overload;
pub mod path;
pub mod raw;
mod routing;
mod serialize;
mod stats;
pub mod template;
pub mod tls_material;
pub mod tls_settings;
mod tracing;
pub mod units;
mod validate;
mod virtual_hosts;
pub mod xds;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde::{Serialize, Serializer};

use serialize as ser;

pub use crate::access_log::{AccessLogConfig, JsonFormat, LogFormat, LogTarget};
pub use crate::path::{EscapedSlashes, PathNormalization};
pub use crate::tls_settings::*;
pub use crate::units::{parse_duration, parse_size};
pub use admin::{AdminConfig, AdminToken, READ_ONLY_ENDPOINTS};
pub use balancer::LbPolicy;
pub use dns::*;
pub use filters::compression::*;
pub use filters::cors::*;
pub use filters::ext_authz::*;
pub use filters::headers::*;
pub use filters::local_rate_limit::*;
pub use filters::*;
pub use overload::{Environment as OverloadEnvironment, OverloadConfig, RawOverload};
pub use routing::*;
pub use service_endpoint::Endpoint as ServiceEndpoint;
pub use stats::StatsConfig;
pub use tracing::{OtlpProtocol, TracingConfig};
pub use virtual_hosts::*;
pub use xds::{AdsProtocol, XdsConfig};

/// How long in-flight requests may run after a shutdown signal, unless configured.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for an upstream response to start, unless the route says otherwise.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(15);
/// Time allowed for a TCP connect to an upstream host, unless the cluster says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Where the admin server listens unless configured.
pub const DEFAULT_ADMIN_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9901);
/// How long an HTTP/1.1 connection may sit without a request, unless configured.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Envoy's stream idle timeout default: 5 minutes.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a request head may take to arrive, unless configured.
pub const DEFAULT_REQUEST_HEADERS_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head, in KiB, unless configured (Envoy's default).
pub const DEFAULT_MAX_REQUEST_HEADERS_KB: u32 = 60;
/// HTTP/2 streams a downstream client may have open on one connection.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1000;
/// Longest a request waits for an upstream connection when `max_connections` is reached.
pub const DEFAULT_PENDING_TIMEOUT: Duration = Duration::from_secs(1);
/// Bytes held per connection and direction unless configured (`per_connection_buffer_limit_bytes`).
pub const DEFAULT_BUFFER_LIMIT: u32 = 32 * 1024;

/// A validated configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub concurrency: Concurrency,
    #[serde(serialize_with = "ser::duration")]
    pub drain_timeout: Duration,
    /// The admin server; `None` when disabled.
    pub admin: Option<AdminConfig>,
    /// Downstream connections the whole process holds at most; `None`: no limit.
    pub max_connections: Option<usize>,
    /// When to shed load as memory or connections run short.
    pub overload: OverloadConfig,
    /// Reload when the config file changes (checked once a second), besides `SIGHUP` and
    /// `POST /reload`.
    pub watch: bool,
    /// How latency histograms are exported to Prometheus.
    pub stats: StatsConfig,
    /// Trace context propagation and span export; `None`: requests are not traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingConfig>,
    pub listeners: Vec<ListenerConfig>,
    pub clusters: Vec<ClusterConfig>,
    /// The management server listeners, routes, clusters and endpoints also come from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xds: Option<XdsConfig>,
    /// The file as written, for putting resources from the management server beside it.
    #[serde(skip)]
    pub(crate) origin: Arc<raw::RawConfig>,
}

/// The number of worker threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concurrency {
    /// One worker per CPU this process may use (affinity mask and cgroup quota).
    Auto,
    Fixed(NonZeroUsize),
}

impl Serialize for Concurrency {
    /// As written: `auto` or the number of workers.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Concurrency::Auto => s.serialize_str("auto"),
            Concurrency::Fixed(n) => s.serialize_u64(n.get() as u64),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ListenerConfig {
    pub name: String,
    pub address: SocketAddr,
    /// Connections this listener holds at most, over all workers; `None`: no limit. Past it
    /// a new connection is closed at once and counted in `downstream_cx_overflow`.
    pub connection_limit: Option<usize>,
    pub connection_balance: ConnectionBalance,
    /// What the proxy holds for one client connection in each direction, in bytes: the
    /// HTTP/1.1 read buffer and write queue, the HTTP/2 stream window and send buffer. A slow
    /// peer makes the proxy stop reading from the other side rather than queue more.
    #[serde(rename = "per_connection_buffer_limit_bytes")]
    pub buffer_limit: u32,
    pub http: HttpConfig,
    /// One line per request, if configured.
    pub access_log: Option<AccessLogConfig>,
    /// A PROXY protocol header read before anything else, naming the client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocolConfig>,
    /// TLS termination; `None`: cleartext (HTTP/1.1 and h2c).
    pub tls: Option<ListenerTlsConfig>,
    /// The HTTP filters requests pass through, in order (routes may turn one off or give it
    /// settings of their own).
    pub http_filters: Vec<HttpFilterConfig>,
    /// Written `routes:` (one virtual host for every domain) or `virtual_hosts:`.
    #[serde(flatten)]
    pub route_config: RouteConfiguration,
}

/// How a listener's new connections are spread over the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionBalance {
    /// Each worker accepts on its own `SO_REUSEPORT` socket; the kernel spreads connections.
    ReusePort,
    /// One shared socket; each accepted connection goes to the worker with the fewest open
    /// connections at that moment (Envoy's exact balancer), for few, long-lived connections.
    Exact,
}

/// HTTP options of a listener.
#[derive(Debug, Clone, Serialize)]
pub struct HttpConfig {
    pub max_concurrent_streams: u32,
    /// An HTTP/1.1 connection with no request for this long is closed (checked about once a
    /// second).
    #[serde(serialize_with = "ser::duration")]
    pub idle_timeout: Duration,
    /// A request head must arrive whole within this (slowloris); the connection is closed.
    #[serde(serialize_with = "ser::duration")]
    pub request_headers_timeout: Duration,
    /// HTTP/2: a stream on which nothing moves for this long is reset (a zero-window stall,
    /// a body never finished).
    #[serde(serialize_with = "ser::duration")]
    pub stream_idle_timeout: Duration,
    /// Largest request head accepted, in KiB; a larger one gets 431.
    pub max_request_headers_kb: u32,
    /// Requests served on one client connection before it is retired (HTTP/1.1:
    /// `connection: close` on the last response; HTTP/2: GOAWAY). `None`: no limit.
    pub max_requests_per_connection: Option<u32>,
    pub path_normalization: PathNormalization,
    /// HTTP/2: PING a connection this often; no answer within the timeout closes it.
    pub http2_keepalive: Option<Keepalive>,
    /// A client connection older than this is retired (HTTP/1.1: `connection: close` on its
    /// next response, or closed if idle; HTTP/2: GOAWAY). `None`: no limit.
    #[serde(serialize_with = "ser::opt_duration")]
    pub max_connection_duration: Option<Duration>,
    /// The connection's peer is the client and is appended to `x-forwarded-for` (an edge
    /// proxy's setting, the default here); `false`: `x-forwarded-for` is passed on as it
    /// came, and names the client (Envoy's `use_remote_address`).
    pub use_remote_address: bool,
    /// Proxies in front whose `x-forwarded-for` entries are trusted (Envoy's meaning); with
    /// any, their `x-forwarded-proto` is kept too.
    pub xff_num_trusted_hops: u32,
}

/// A listener's PROXY protocol (HAProxy's, v1 text and v2 binary), as cloud TCP load
/// balancers send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProxyProtocolConfig {
    #[serde(serialize_with = "ser_versions")]
    pub versions: ProxyProtocolVersions,
    /// `false`: a connection without the header is served with its own peer address.
    pub required: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyProtocolVersions {
    pub v1: bool,
    pub v2: bool,
}

fn ser_versions<S: Serializer>(v: &ProxyProtocolVersions, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        [(v.v1, "v1"), (v.v2, "v2")]
            .into_iter()
            .filter_map(|(on, n)| on.then_some(n)),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Keepalive {
    #[serde(serialize_with = "ser::duration")]
    pub interval: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct RouteConfig {
    #[serde(rename = "match")]
    pub matcher: RouteMatch,
    #[serde(flatten)]
    pub action: RouteAction,
    /// What this route changes about its listener's filters.
    #[serde(skip_serializing_if = "RouteFilters::is_default")]
    pub filters: RouteFilters,
}

/// What a request must look like for a route to take it. All parts must match.
#[derive(Debug, Clone, Serialize)]
pub struct RouteMatch {
    #[serde(skip_serializing_if = "HostMatch::is_any")]
    pub host: HostMatch,
    #[serde(flatten)]
    pub path: PathMatch,
    /// `false`: the path matches whatever its ASCII case (`/Private` takes a `/private`
    /// route), for origins that ignore case; the prefix or path is then kept lowercase.
    #[serde(skip_serializing_if = "is_true")]
    pub case_sensitive: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    /// Parameters of the request's query, percent-decoded; all must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub query_parameters: Vec<QueryMatch>,
}

impl RouteMatch {
    /// Whether the route is decided by more than its host and path (or its path is a regex):
    /// the index must then check each candidate in full.
    pub fn has_conditions(&self) -> bool {
        !self.headers.is_empty()
            || !self.query_parameters.is_empty()
            || matches!(self.path, PathMatch::Regex(_))
    }
}

fn is_true(value: &bool) -> bool {
    *value
}

/// Matches the request's host (without its port), case-insensitively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Any,
    /// `api.example.com`, stored lowercase.
    Exact(String),
    /// `*.example.com` is stored as `.example.com`: any host ending in it.
    Suffix(String),
}

impl HostMatch {
    fn is_any(&self) -> bool {
        *self == HostMatch::Any
    }
}

impl Serialize for HostMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            HostMatch::Any => s.serialize_str("*"),
            HostMatch::Exact(name) => s.serialize_str(name),
            HostMatch::Suffix(suffix) => s.collect_str(&format_args!("*{suffix}")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    Prefix(String),
    #[serde(rename = "path")]
    Exact(String),
    /// The whole path (without the query) must match.
    Regex(Pattern),
}

#[derive(Debug, Clone, Serialize)]
pub struct HeaderMatch {
    #[serde(serialize_with = "ser::header_name")]
    pub name: HeaderName,
    #[serde(flatten)]
    pub value: HeaderValueMatch,
}

#[derive(Debug, Clone)]
pub enum HeaderValueMatch {
    Exact(HeaderValue),
    /// `prefix`, `suffix`, `contains` or `regex`: one of the header's values matches.
    Pattern(StringMatch),
    Present,
    Absent,
}

impl Serialize for HeaderValueMatch {
    /// As written: `exact: VALUE`, `present: true` or `present: false`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self {
            HeaderValueMatch::Exact(value) => {
                map.serialize_entry("exact", &String::from_utf8_lossy(value.as_bytes()))?
            }
            HeaderValueMatch::Pattern(pattern) => pattern.write(&mut map)?,
            HeaderValueMatch::Present => map.serialize_entry("present", &true)?,
            HeaderValueMatch::Absent => map.serialize_entry("present", &false)?,
        }
        map.end()
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteAction {
    /// Answer from the proxy itself.
    DirectResponse {
        #[serde(serialize_with = "ser::status")]
        status: StatusCode,
        #[serde(serialize_with = "ser::bytes_text")]
        body: Bytes,
    },
    /// Answer with a redirect.
    Redirect(RedirectAction),
    /// Forward to a cluster.
    #[serde(untagged)]
    Forward(Box<ForwardAction>),
}

#[derive(Debug, Clone, Serialize)]
pub struct ForwardAction {
    /// Index into [`Config::clusters`]; with a split, its first cluster.
    #[serde(skip)]
    pub cluster: usize,
    /// The cluster's name.
    #[serde(rename = "cluster", skip_serializing_if = "String::is_empty")]
    pub cluster_name: String,
    /// `weighted_clusters`: the cluster is drawn per request, `cluster` is not used.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub split: Option<TrafficSplit>,
    /// `prefix_rewrite` or `regex_rewrite` of the path sent upstream.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub path_rewrite: Option<PathRewrite>,
    #[serde(
        rename = "request_mirror_policies",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub mirrors: Vec<MirrorPolicy>,
    /// Time allowed for the response head to arrive after the request body has been sent
    /// (as Envoy's route timeout); while the body is still going up, time it stands still.
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    /// Replaces the `host` (or `:authority`) sent upstream.
    #[serde(serialize_with = "ser::opt_header_value")]
    pub host_rewrite: Option<HeaderValue>,
    pub retry_policy: Option<RetryPolicy>,
    /// Protocols clients may switch to on this route (`websocket`): the upgrade is relayed
    /// to the upstream and, once it agrees, bytes flow both ways.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upgrades: Vec<String>,
}

/// When and how often a failed request is tried again, on another host if there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryPolicy {
    pub retry_on: RetryOn,
    pub num_retries: u32,
    /// Time allowed for each try; the route timeout still bounds them all together.
    #[serde(serialize_with = "ser::opt_duration")]
    pub per_try_timeout: Option<Duration>,
    pub retriable_status_codes: Vec<u16>,
}

/// Envoy's `retry_on` conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryOn {
    pub connect_failure: bool,
    pub refused_stream: bool,
    pub reset: bool,
    /// Any 5xx, and no response at all (connect failure, reset, try timeout).
    pub server_error: bool,
    /// 502, 503, 504, and no response at all.
    pub gateway_error: bool,
    pub retriable_status_codes: bool,
}

impl Serialize for RetryOn {
    /// As written: the list of condition names.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            [
                (self.connect_failure, "connect-failure"),
                (self.refused_stream, "refused-stream"),
                (self.reset, "reset"),
                (self.server_error, "5xx"),
                (self.gateway_error, "gateway-error"),
                (self.retriable_status_codes, "retriable-status-codes"),
            ]
            .into_iter()
            .filter_map(|(set, name)| set.then_some(name)),
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterConfig {
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    #[serde(flatten, serialize_with = "ser::lb_policy")]
    pub lb_policy: LbPolicy,
    /// What consistent-hashing policies hash; `None` picks as if without a key.
    pub hash_key: Option<HashKey>,
    pub protocol: UpstreamProtocol,
    #[serde(serialize_with = "ser::duration")]
    pub connect_timeout: Duration,
    /// Requests sent on one upstream connection before it is retired; `None`: no limit.
    pub max_requests_per_connection: Option<u32>,
    /// The upstream side of [`ListenerConfig::buffer_limit`], per upstream connection.
    #[serde(rename = "per_connection_buffer_limit_bytes")]
    pub buffer_limit: u32,
    pub circuit_breakers: CircuitBreakerConfig,
    pub health_check: Option<HealthCheckConfig>,
    pub outlier_detection: Option<OutlierDetectionConfig>,
    /// TLS to the hosts; `None`: cleartext.
    pub tls: Option<ClusterTlsConfig>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CircuitBreakerConfig {
    /// Upstream connections open at once.
    pub max_connections: LimitSpec,
    /// Requests waiting for a connection at once.
    pub max_pending_requests: LimitSpec,
    /// Requests in flight at once.
    pub max_requests: LimitSpec,
    /// Retries in flight at once.
    pub max_retries: LimitSpec,
    /// Longest a request waits for a connection before it gets 503.
    #[serde(serialize_with = "ser::duration")]
    pub pending_timeout: Duration,
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
            pending_timeout: DEFAULT_PENDING_TIMEOUT,
        }
    }
}

/// Active health checking of a cluster's hosts: `GET path`, once per process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthCheckConfig {
    pub path: String,
    /// `host` header of the check; the host's address if not given.
    pub host: Option<String>,
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
    /// At most this share of the cluster's hosts is ejected at once.
    pub max_ejection_percent: u32,
}

/// An upstream host of a cluster, or a name whose addresses are its hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    pub address: EndpointAddress,
    /// Relative share of traffic, at least 1.
    pub weight: u32,
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
}

impl UpstreamProtocol {
    /// The protocol's ALPN identifier, offered to TLS hosts.
    pub fn alpn(self) -> &'static [u8] {
        match self {
            UpstreamProtocol::Http1 => b"http/1.1",
            UpstreamProtocol::Http2 => b"h2",
        }
    }
}

/// Why a config was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    /// The YAML does not have the expected shape (unknown key, wrong type, bad unit).
    #[error("{0}")]
    Syntax(String),
    /// A value is well-formed but not acceptable.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

impl ConfigError {
    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl Config {
    /// Parses and validates a YAML document.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let raw: raw::RawConfig =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let origin = Arc::new(raw.clone());
        validate::validate(raw, origin)
    }

    /// Reads, parses and validates a file.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// The file as written, which resources from a management server are put beside
    /// ([`xds::compose`]).
    pub fn origin(&self) -> &Arc<raw::RawConfig> {
        &self.origin
    }

    /// The number of workers to run: the configured number, or the usable CPU count.
    pub fn worker_count(&self) -> usize {
        match self.concurrency {
            Concurrency::Fixed(n) => n.get(),
            Concurrency::Auto => crate::machine::usable_cores(),
        }
    }
}
