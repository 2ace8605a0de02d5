//! A listener as the file writes it (serde, unknown keys refused).

use std::time::Duration;

use serde::Deserialize;

use crate::units::{de_opt_duration, de_opt_size};
use crate::*;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub name: String,
    pub address: String,
    pub connection_limit: Option<u64>,
    pub connection_balance: Option<String>,
    pub max_connections_to_accept_per_socket_event: Option<u32>,
    pub bypass_overload_manager: Option<bool>,
    pub ignore_global_conn_limit: Option<bool>,
    /// TCP keep-alive on accepted connections: `probes`, `time`, `interval`.
    pub tcp_keepalive: Option<RawTcpKeepalive>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub per_connection_buffer_limit_bytes: Option<u64>,
    #[serde(default)]
    pub http: RawHttp,
    /// One logger or a list of them.
    #[serde(default, deserialize_with = "crate::access_log::one_or_many")]
    pub access_log: Vec<RawAccessLog>,
    pub proxy_protocol: Option<RawProxyProtocol>,
    pub tls: Option<RawListenerTls>,
    /// HTTP/3 beside the TCP listener, on UDP.
    pub http3: Option<super::http3::RawHttp3>,
    /// Relay TCP to a cluster instead of serving HTTP.
    pub tcp_proxy: Option<super::tcp_proxy::RawTcpProxy>,
    /// Moved into `http_filters`; kept here to say so.
    pub ext_authz: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub http_filters: Vec<RawChainFilter>,
    /// One virtual host for every domain, or
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    /// routes grouped by the hosts they serve.
    #[serde(default)]
    pub virtual_hosts: Vec<RawVirtualHost>,
    /// Hosts matched without their port (Envoy's `ignore_port_in_host_matching`).
    pub ignore_port_in_host_matching: Option<bool>,
    pub tracing: Option<RawListenerTracing>,
    /// Further filter chains, picked per connection by SNI, ALPN, addresses or ports.
    #[serde(default)]
    pub chains: Vec<super::chains::RawChain>,
    /// Whether the listener's own settings serve a connection no chain matches (by default:
    /// when it has routes or a TCP relay of its own); otherwise such a connection is closed.
    pub default_chain: Option<bool>,
    /// How long the first bytes that pick a chain may take (`0s`: no limit).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub listener_filters_timeout: Option<Duration>,
    pub continue_on_listener_filters_timeout: Option<bool>,
    /// Plain-text connections show their HTTP version (`h2c`, `http/1.1`, `http/1.0`) as
    /// their application protocol to the chains (Envoy's `http_inspector`).
    pub http_inspector: Option<bool>,
    /// From a management server: the collector this listener's connection manager names,
    /// which becomes the process's (there is one per process).
    #[serde(skip)]
    pub tracing_provider: Option<RawTracing>,
    /// Set on listeners from a management server: names as control planes write them.
    #[serde(skip)]
    pub dynamic: bool,
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
    pub request_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_stream_duration: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub stream_idle_timeout: Option<Duration>,
    pub max_request_headers_kb: Option<u32>,
    pub max_requests_per_connection: Option<u32>,
    pub path_normalization: Option<RawPathNormalization>,
    pub http2_keepalive: Option<RawKeepalive>,
    /// `hyper` (the default) or `legate`: which HTTP/2 implementation serves the listener.
    pub http2_codec: Option<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_connection_duration: Option<Duration>,
    pub use_remote_address: Option<bool>,
    pub xff_num_trusted_hops: Option<u32>,
    /// Request header changes made before the request is routed.
    pub early_header_mutation: Option<RawHeaderMutations>,
    /// Rewrites of the replies the proxy makes itself.
    pub local_reply: Option<crate::local_reply::RawLocalReply>,
    /// Ways to find the client, in order, instead of the two above.
    #[serde(default)]
    pub original_ip_detection: Vec<crate::listener::client_address::RawClientDetection>,
    pub headers_with_underscores_action: Option<String>,
    pub initial_stream_window_size: Option<u32>,
    pub initial_connection_window_size: Option<u32>,
    pub server_header_transformation: Option<String>,
    pub server_name: Option<String>,
    pub suppress_proxy_headers: Option<bool>,
    pub request_id: Option<RawRequestId>,
    pub accept_http_10: Option<bool>,
    #[serde(default)]
    pub ignore_http11_upgrade: Vec<crate::RawStringMatch>,
    pub preserve_header_case: Option<bool>,
    /// HTTP/1.1: a request the client sent whole and then closed its side after is served.
    pub serve_half_closed: Option<bool>,
    pub default_host_for_http_10: Option<String>,
    pub strip_host_port: Option<String>,
    pub strip_trailing_host_dot: Option<bool>,
    /// `sanitize` (the default), `forward_only`, `append_forward`, `sanitize_set` or
    /// `always_forward_only`: what a request's `x-forwarded-client-cert` gets.
    pub forward_client_cert: Option<String>,
    pub set_current_client_cert_details: Option<crate::listener::client_cert::ClientCertDetails>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRequestId {
    pub generate: Option<bool>,
    pub preserve_external: Option<bool>,
    pub always_set_in_response: Option<bool>,
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
