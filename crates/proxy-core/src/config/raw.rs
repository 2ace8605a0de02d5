//! The config file as written: serde structs that reject unknown keys. Nothing here is
//! trusted yet; `validate.rs` turns these into [`super::Config`].

use std::time::Duration;

use serde::Deserialize;

use crate::units::{de_opt_duration, de_opt_size};

#[derive(Debug, Deserialize)]
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
    pub listeners: Vec<RawListener>,
    #[serde(default)]
    pub clusters: Vec<RawCluster>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub address: Option<String>,
    pub enabled: Option<bool>,
}

/// `concurrency: auto` or a number of workers.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawConcurrency {
    Workers(u64),
    Word(String),
}

#[derive(Debug, Deserialize)]
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
    pub tls: Option<RawListenerTls>,
    pub ext_authz: Option<RawExtAuthz>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzGrpc {
    pub address: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzHttp {
    pub address: String,
    pub path_prefix: Option<String>,
    #[serde(default)]
    pub allowed_headers: Vec<String>,
    #[serde(default)]
    pub allowed_upstream_headers: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthzBody {
    #[serde(default, deserialize_with = "de_opt_size")]
    pub max_request_bytes: Option<u64>,
    pub allow_partial_message: Option<bool>,
}

/// `ext_authz: disabled` or `ext_authz: { context_extensions: { k: v } }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawRouteAuthz {
    Word(String),
    Settings(RawRouteAuthzSettings),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteAuthzSettings {
    pub disabled: Option<bool>,
    #[serde(default)]
    pub context_extensions: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCertificate {
    pub cert_chain: String,
    pub private_key: String,
    #[serde(default)]
    pub server_names: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientCertificate {
    pub ca: String,
    pub required: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClusterTls {
    pub ca: Option<String>,
    pub server_name: Option<String>,
    pub client_certificate: Option<RawKeyPair>,
    pub min_version: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeyPair {
    pub cert_chain: String,
    pub private_key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccessLog {
    pub path: String,
    pub format: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    pub max_concurrent_streams: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub request_headers_timeout: Option<Duration>,
    pub max_request_headers_kb: Option<u32>,
    pub max_requests_per_connection: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    #[serde(rename = "match")]
    pub matcher: RawMatch,
    pub cluster: Option<String>,
    pub direct_response: Option<RawDirectResponse>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    pub host_rewrite: Option<String>,
    pub retry_policy: Option<RawRetryPolicy>,
    pub ext_authz: Option<RawRouteAuthz>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetryPolicy {
    pub retry_on: Vec<String>,
    pub num_retries: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub per_try_timeout: Option<Duration>,
    #[serde(default)]
    pub retriable_status_codes: Vec<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub host: Option<String>,
    pub prefix: Option<String>,
    pub path: Option<String>,
    #[serde(default)]
    pub headers: Vec<RawHeaderMatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    pub name: String,
    pub exact: Option<String>,
    pub present: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDirectResponse {
    pub status: u16,
    #[serde(default)]
    pub body: String,
}

#[derive(Debug, Deserialize)]
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
}

#[derive(Debug, Default, Deserialize)]
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

#[derive(Debug, Deserialize)]
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutlierDetection {
    pub consecutive_5xx: Option<u32>,
    pub consecutive_gateway_failure: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub base_ejection_time: Option<Duration>,
    pub max_ejection_percent: Option<u32>,
}

/// `127.0.0.1:9000` or `{ address: 127.0.0.1:9000, weight: 3 }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawEndpoint {
    Address(String),
    Weighted(RawWeightedEndpoint),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeightedEndpoint {
    pub address: String,
    pub weight: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLeastRequest {
    pub choice_count: Option<u32>,
    pub active_request_bias: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRingHash {
    pub minimum_ring_size: Option<u64>,
    pub maximum_ring_size: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMaglev {
    pub table_size: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHashKey {
    pub header: Option<String>,
    pub cookie: Option<String>,
    pub source_ip: Option<bool>,
}
