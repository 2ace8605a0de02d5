//! The config file as written: serde structs that reject unknown keys. Nothing here is
//! trusted yet; `validate.rs` turns these into [`super::Config`].

use std::time::Duration;

use serde::Deserialize;

use crate::units::{de_opt_duration, de_opt_size};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub concurrency: Option<RawConcurrency>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub drain_timeout: Option<Duration>,
    #[serde(default)]
    pub admin: Option<RawAdmin>,
    pub max_connections: Option<u64>,
    #[serde(default)]
    pub overload: Option<super::RawOverload>,
    #[serde(default)]
    pub watch: bool,
    pub stats: Option<RawStats>,
    pub tracing: Option<RawTracing>,
    #[serde(default)]
    pub listeners: Vec<RawListener>,
    #[serde(default)]
    pub clusters: Vec<RawCluster>,
    /// Who this proxy is to a management server.
    pub node: Option<RawNode>,
    /// Where listeners, routes, clusters and endpoints come from besides this file.
    pub dynamic_resources: Option<RawDynamicResources>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStats {
    /// Durations (`100us`, `2.5ms`), ascending.
    pub histogram_buckets: Option<Vec<String>>,
    pub quantiles: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    pub otlp: RawOtlp,
    pub service_name: Option<String>,
    /// Percent, 0 to 100.
    pub random_sampling: Option<f64>,
    /// Empty: no header forces a trace.
    pub force_trace_header: Option<String>,
    pub max_queued_spans: Option<usize>,
    pub max_export_batch: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlp {
    pub endpoint: String,
    /// `grpc` (default) or `http`.
    pub protocol: Option<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNode {
    pub id: String,
    pub cluster: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDynamicResources {
    pub ads: RawAds,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAds {
    /// `IP:PORT` or `unix:/path`.
    pub address: String,
    /// `sotw` (the default) or `delta`.
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub address: Option<String>,
    pub enabled: Option<bool>,
    pub allow: Option<Vec<String>>,
    pub token_file: Option<String>,
    pub open: Option<Vec<String>>,
}

/// `concurrency: auto` or a number of workers.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawConcurrency {
    Workers(u64),
    Word(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub name: String,
    pub address: String,
    pub connection_limit: Option<u64>,
    pub connection_balance: Option<String>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub per_connection_buffer_limit_bytes: Option<u64>,
    #[serde(default)]
    pub http: RawHttp,
    pub access_log: Option<RawAccessLog>,
    pub proxy_protocol: Option<RawProxyProtocol>,
    pub tls: Option<RawListenerTls>,
    /// Moved into `http_filters`; kept here to say so.
    pub ext_authz: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub http_filters: Vec<RawHttpFilter>,
    /// One virtual host for every domain, or
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    /// routes grouped by the hosts they serve.
    #[serde(default)]
    pub virtual_hosts: Vec<RawVirtualHost>,
    /// Set on listeners from a management server: names as control planes write them.
    #[serde(skip)]
    pub dynamic: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVirtualHost {
    pub name: String,
    pub domains: Vec<String>,
    pub retry_policy: Option<RawRetryPolicy>,
    pub filters: Option<RawRouteFilters>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
}

/// One entry of `http_filters`: `- NAME: { settings }`.
#[derive(Debug, Clone)]
pub enum RawHttpFilter {
    ExtAuthz(RawExtAuthz),
    LocalRateLimit(Option<RawLocalRateLimit>),
    Headers(Option<RawHeaderRules>),
    Compression(Option<RawCompression>),
    Cors(Option<RawCors>),
}

/// The filters `http_filters` knows, by name.
const FILTER_NAMES: &str = "ext_authz, local_rate_limit, headers, compression, cors";

impl<'de> Deserialize<'de> for RawHttpFilter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let map = serde_yaml::Mapping::deserialize(d)?;
        let mut entries = map.into_iter();
        let (Some((serde_yaml::Value::String(name), settings)), None) =
            (entries.next(), entries.next())
        else {
            return Err(D::Error::custom(format!(
                "expected one filter per item, written `- NAME: {{ settings }}` with NAME one of {FILTER_NAMES}"
            )));
        };
        // A bare `- compression:` means the defaults.
        let settings = match settings {
            serde_yaml::Value::Null => serde_yaml::Value::Mapping(Default::default()),
            other => other,
        };
        fn parse<T: serde::de::DeserializeOwned, E: Error>(
            name: &str,
            settings: serde_yaml::Value,
        ) -> Result<T, E> {
            serde_yaml::from_value(settings).map_err(|e| E::custom(format!("{name}: {e}")))
        }
        Ok(match name.as_str() {
            "ext_authz" => RawHttpFilter::ExtAuthz(parse(&name, settings)?),
            "local_rate_limit" => RawHttpFilter::LocalRateLimit(parse(&name, settings)?),
            "headers" => RawHttpFilter::Headers(parse(&name, settings)?),
            "compression" => RawHttpFilter::Compression(parse(&name, settings)?),
            "cors" => RawHttpFilter::Cors(parse(&name, settings)?),
            other => {
                return Err(D::Error::custom(format!(
                    "unknown filter `{other}`; known: {FILTER_NAMES}"
                )));
            }
        })
    }
}

impl RawHttpFilter {
    pub fn name(&self) -> &'static str {
        match self {
            RawHttpFilter::ExtAuthz(_) => "ext_authz",
            RawHttpFilter::LocalRateLimit(_) => "local_rate_limit",
            RawHttpFilter::Headers(_) => "headers",
            RawHttpFilter::Compression(_) => "compression",
            RawHttpFilter::Cors(_) => "cors",
        }
    }
}

/// A route's `filters:`, by filter name.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteFilters {
    pub ext_authz: Option<RawRouteAuthz>,
    pub local_rate_limit: Option<RawPerRoute<RawLocalRateLimit>>,
    pub headers: Option<RawPerRoute<RawHeaderRules>>,
    pub compression: Option<RawPerRoute<RawCompression>>,
    pub cors: Option<RawPerRoute<RawCors>>,
}

/// `disabled`, or settings for the route.
#[derive(Debug, Clone)]
pub enum RawPerRoute<T> {
    Word(String),
    Settings(T),
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for RawPerRoute<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Read as a value first, so that settings get their own precise error rather than
        // "did not match any variant".
        match serde_yaml::Value::deserialize(d)? {
            serde_yaml::Value::String(word) => Ok(RawPerRoute::Word(word)),
            value => serde_yaml::from_value(value)
                .map(RawPerRoute::Settings)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLocalRateLimit {
    pub token_bucket: Option<RawTokenBucket>,
    pub scope: Option<String>,
    pub key: Option<RawRateLimitKey>,
    pub max_keys: Option<u64>,
    pub status: Option<u16>,
    pub x_ratelimit_headers: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokenBucket {
    pub max_tokens: u64,
    pub tokens_per_fill: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub fill_interval: Option<Duration>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimitKey {
    pub header: Option<String>,
    pub client_ip: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderRules {
    pub request: Option<RawHeaderMutations>,
    pub response: Option<RawHeaderMutations>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMutations {
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub add: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompression {
    pub encodings: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub min_content_length: Option<u64>,
    pub content_types: Option<Vec<String>>,
    pub gzip_level: Option<u32>,
    pub brotli_quality: Option<u32>,
    pub zstd_level: Option<i32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCors {
    #[serde(default)]
    pub allow_origins: Vec<String>,
    #[serde(default)]
    pub allow_methods: Vec<String>,
    #[serde(default)]
    pub allow_headers: Vec<String>,
    #[serde(default)]
    pub expose_headers: Vec<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_age: Option<Duration>,
    pub allow_credentials: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExtAuthz {
    pub grpc: Option<RawAuthzGrpc>,
    pub http: Option<RawAuthzHttp>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    pub failure_mode_allow: Option<bool>,
    pub status_on_error: Option<u16>,
    pub with_request_body: Option<RawAuthzBody>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzGrpc {
    pub address: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzHttp {
    pub address: String,
    pub path_prefix: Option<String>,
    #[serde(default)]
    pub allowed_headers: Vec<String>,
    #[serde(default)]
    pub allowed_upstream_headers: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzBody {
    #[serde(default, deserialize_with = "de_opt_size")]
    pub max_request_bytes: Option<u64>,
    pub allow_partial_message: Option<bool>,
}

/// `ext_authz: disabled` or `ext_authz: { context_extensions: { k: v } }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawRouteAuthz {
    Word(String),
    Settings(RawRouteAuthzSettings),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteAuthzSettings {
    pub disabled: Option<bool>,
    #[serde(default)]
    pub context_extensions: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTls {
    pub certificates: Vec<RawCertificate>,
    pub unknown_server_name: Option<String>,
    pub min_version: Option<String>,
    pub alpn: Option<Vec<String>>,
    pub session_tickets: Option<bool>,
    pub session_cache_size: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub handshake_timeout: Option<Duration>,
    pub client_certificate: Option<RawClientCertificate>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCertificate {
    pub cert_chain: String,
    pub private_key: String,
    #[serde(default)]
    pub server_names: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientCertificate {
    pub ca: String,
    pub required: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClusterTls {
    pub ca: Option<String>,
    pub server_name: Option<String>,
    pub client_certificate: Option<RawKeyPair>,
    pub min_version: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeyPair {
    pub cert_chain: String,
    pub private_key: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccessLog {
    pub path: String,
    pub format: Option<String>,
    /// `{ key: "%FIELD%", ... }`, in order.
    pub json_format: Option<serde_yaml::Mapping>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    pub max_concurrent_streams: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub request_headers_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub stream_idle_timeout: Option<Duration>,
    pub max_request_headers_kb: Option<u32>,
    pub max_requests_per_connection: Option<u32>,
    pub path_normalization: Option<RawPathNormalization>,
    pub http2_keepalive: Option<RawKeepalive>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_connection_duration: Option<Duration>,
    pub use_remote_address: Option<bool>,
    pub xff_num_trusted_hops: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProxyProtocol {
    pub versions: Option<Vec<String>>,
    pub required: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeepalive {
    #[serde(deserialize_with = "crate::units::de_duration")]
    pub interval: Duration,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPathNormalization {
    pub normalize: Option<bool>,
    pub merge_slashes: Option<bool>,
    pub escaped_slashes: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    #[serde(rename = "match")]
    pub matcher: RawMatch,
    pub cluster: Option<String>,
    pub weighted_clusters: Option<Vec<RawWeightedCluster>>,
    /// With `weighted_clusters`: what keeps one client on one side.
    pub hash_key: Option<RawHashKey>,
    pub direct_response: Option<RawDirectResponse>,
    pub redirect: Option<RawRedirect>,
    pub https_redirect: Option<bool>,
    pub prefix_rewrite: Option<String>,
    pub regex_rewrite: Option<RawRegexRewrite>,
    #[serde(default)]
    pub request_mirror_policies: Vec<RawMirrorPolicy>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    pub host_rewrite: Option<String>,
    pub retry_policy: Option<RawRetryPolicy>,
    #[serde(default)]
    pub upgrades: Vec<String>,
    /// Moved into `filters`; kept here to say so.
    pub ext_authz: Option<serde::de::IgnoredAny>,
    pub filters: Option<RawRouteFilters>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetryPolicy {
    pub retry_on: Vec<String>,
    pub num_retries: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub per_try_timeout: Option<Duration>,
    #[serde(default)]
    pub retriable_status_codes: Vec<u16>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub host: Option<String>,
    pub prefix: Option<String>,
    pub path: Option<String>,
    pub regex: Option<String>,
    pub case_sensitive: Option<bool>,
    #[serde(default)]
    pub headers: Vec<RawHeaderMatch>,
    #[serde(default)]
    pub query_parameters: Vec<RawHeaderMatch>,
}

/// A header's or query parameter's match: `name` and one of the rest.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    pub name: String,
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub contains: Option<String>,
    pub regex: Option<String>,
    pub present: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeightedCluster {
    pub cluster: String,
    pub weight: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedirect {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub path: Option<String>,
    pub prefix_rewrite: Option<String>,
    pub status: Option<u16>,
    #[serde(default)]
    pub strip_query: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegexRewrite {
    pub pattern: String,
    pub substitution: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMirrorPolicy {
    pub cluster: String,
    /// `10%`, `0.5%` or a number of percent; default 100%.
    pub fraction: Option<serde_yaml::Value>,
    pub disable_shadow_host_suffix_append: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDirectResponse {
    pub status: u16,
    #[serde(default)]
    pub body: String,
}

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
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub connect_timeout: Option<Duration>,
    pub max_requests_per_connection: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub per_connection_buffer_limit_bytes: Option<u64>,
    pub circuit_breakers: Option<RawCircuitBreakers>,
    pub health_check: Option<RawHealthCheck>,
    pub outlier_detection: Option<RawOutlierDetection>,
    pub tls: Option<RawClusterTls>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub dns_refresh_rate: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub dns_min_refresh_rate: Option<Duration>,
    pub respect_dns_ttl: Option<bool>,
    pub dns_lookup_family: Option<String>,
    pub dns_resolvers: Option<Vec<String>>,
    /// Set on clusters from a management server: names as control planes write them, and
    /// possibly no endpoints.
    #[serde(skip)]
    pub dynamic: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCircuitBreakers {
    pub max_connections: Option<RawLimit>,
    pub max_pending_requests: Option<RawLimit>,
    pub max_requests: Option<RawLimit>,
    pub max_retries: Option<RawLimit>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub pending_timeout: Option<Duration>,
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealthCheck {
    pub path: String,
    pub host: Option<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub interval: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub jitter: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    pub healthy_threshold: Option<u32>,
    pub unhealthy_threshold: Option<u32>,
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
}

/// `127.0.0.1:9000`, `backend.internal:9000`, or `{ address: 127.0.0.1:9000, weight: 3 }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawEndpoint {
    Address(String),
    Weighted(RawWeightedEndpoint),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeightedEndpoint {
    pub address: String,
    pub weight: Option<u32>,
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
