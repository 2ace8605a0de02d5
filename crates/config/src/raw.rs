//! The config file as written: serde structs that reject unknown keys. Nothing here is
//! trusted yet; `validate.rs` turns these into [`super::Config`].

use std::time::Duration;

use serde::Deserialize;

use crate::filters::{RawHttpFilter, RawRouteFilters};
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
