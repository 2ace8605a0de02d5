//! A listener: its address, limits, HTTP settings, TLS, access log, filters and routes.
//!
//! The topic's files, side by side: this one holds the typed settings and their defaults;
//! `raw.rs` the file's form; `check.rs` the checks from one to the other; `xds.rs` the mapping
//! of Envoy's `Listener` and its connection manager. Path normalisation, which routes are
//! checked against too, is `crate::path`.

pub mod chains;
pub(crate) mod check;
pub mod client_address;
pub mod client_cert;
pub mod http3;
pub mod raw;
pub mod tcp_proxy;
pub mod xds;

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::serialize as ser;
use crate::*;

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

/// Bytes held per connection and direction unless configured (`per_connection_buffer_limit_bytes`).
pub const DEFAULT_BUFFER_LIMIT: u32 = 32 * 1024;

#[derive(Debug, Clone, Serialize)]
pub struct ListenerConfig {
    pub name: String,
    pub address: SocketAddr,
    /// Connections this listener holds at most, over all workers; `None`: no limit. Past it
    /// a new connection is closed at once and counted in `downstream_cx_overflow`.
    pub connection_limit: Option<usize>,
    pub connection_balance: ConnectionBalance,
    /// Connections one worker accepts in a row before it serves its other work and accepts
    /// again; `None`: every connection pending (Envoy's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections_to_accept_per_socket_event: Option<u32>,
    /// The overload manager's actions (connections refused, requests shed, keep-alive
    /// turned off) leave this listener alone: for health checks and admin-like traffic.
    pub bypass_overload_manager: bool,
    /// Its connections are not counted against the process's `max_connections` (health
    /// checks and admin-like traffic still get in when the proxy is full).
    pub ignore_global_conn_limit: bool,
    /// TCP keep-alive on its accepted connections (a dead client's connection is noticed
    /// without traffic); `None`: the system's (off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// What the proxy holds for one client connection in each direction, in bytes: the
    /// HTTP/1.1 read buffer and write queue, the HTTP/2 stream window and send buffer. A slow
    /// peer makes the proxy stop reading from the other side rather than queue more.
    #[serde(rename = "per_connection_buffer_limit_bytes")]
    pub buffer_limit: u32,
    pub http: HttpConfig,
    /// Its loggers: each writes one line (or record) per request.
    #[serde(rename = "access_log", skip_serializing_if = "Vec::is_empty")]
    pub access_logs: Vec<AccessLogConfig>,
    /// A PROXY protocol header read before anything else, naming the client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocolConfig>,
    /// TLS termination; `None`: cleartext (HTTP/1.1 and h2c).
    pub tls: Option<ListenerTlsConfig>,
    /// HTTP/3 on the UDP port of the same number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http3: Option<http3::Http3Config>,
    /// Whether and how its requests are traced, when the process traces.
    pub tracing: ListenerTracing,
    /// Relays TCP to a cluster instead of serving HTTP (no routes, filters or HTTP log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_proxy: Option<tcp_proxy::TcpProxyConfig>,
    /// The HTTP filters requests pass through, in order (routes may turn one off or give it
    /// settings of their own).
    pub http_filters: Vec<ChainFilter>,
    /// Written `routes:` (one virtual host for every domain) or `virtual_hosts:`.
    #[serde(flatten)]
    pub route_config: RouteConfiguration,
    /// Further filter chains, each with its own settings, picked per connection by what it
    /// shows (SNI, ALPN, addresses, ports). The settings above are the default chain's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filter_chains: Vec<chains::FilterChainConfig>,
    /// Whether the settings above serve a connection no chain in `filter_chains` matches;
    /// `false`: it is closed, counted in `downstream_cx_no_filter_chain_match`.
    #[serde(skip_serializing_if = "ser::is_true")]
    pub default_chain: bool,
    /// How long a connection's first bytes (its TLS ClientHello), read to pick a chain, may
    /// take; `None`: no limit. Only listeners whose chains match on SNI, ALPN or transport
    /// read them.
    #[serde(serialize_with = "ser::opt_duration")]
    pub listener_filters_timeout: Option<Duration>,
    /// Past that timeout the connection is served as plain bytes (no SNI) rather than closed.
    pub continue_on_listener_filters_timeout: bool,
    /// Plain-text connections' first bytes are read for their HTTP version, which chains'
    /// `application_protocols` then match (`h2c`, `http/1.1`, `http/1.0`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub http_inspector: bool,
}

impl ListenerConfig {
    /// Whether it has a TCP socket: all but `quic_only` listeners.
    pub fn serves_tcp(&self) -> bool {
        !self.http3.as_ref().is_some_and(|h| h.quic_only)
    }

    /// Whether it has UDP sockets (HTTP/3).
    pub fn serves_quic(&self) -> bool {
        self.http3.is_some()
    }

    /// Whether it and `other` would bind the same port with the same protocol.
    pub fn clashes_with(&self, other: &ListenerConfig) -> bool {
        self.address == other.address
            && self.address.port() != 0
            && ((self.serves_tcp() && other.serves_tcp())
                || (self.serves_quic() && other.serves_quic()))
    }
}

/// Envoy's `listener_filters_timeout` default.
pub const DEFAULT_LISTENER_FILTERS_TIMEOUT: Duration = Duration::from_secs(15);

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
    /// A request's body must arrive whole within this from its head, unless the response
    /// has begun (Envoy's `request_timeout`): 408 otherwise. `None`: no limit (the stream
    /// idle timeout still holds).
    #[serde(serialize_with = "ser::opt_duration")]
    pub request_timeout: Option<Duration>,
    /// A request and its response must be done within this from the request's head (Envoy's
    /// `max_stream_duration`): 408 (the request not whole yet) or 504 before the response,
    /// the stream reset after. A route may set its own. `None`: no limit.
    #[serde(
        serialize_with = "ser::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_stream_duration: Option<Duration>,
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
    /// Which implementation serves the listener's HTTP/2 connections.
    pub http2_codec: Http2Codec,
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
    /// Request header changes made before the request is routed (Envoy's
    /// `early_header_mutation_extensions`), as a `headers` rule's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_header_mutation: Option<HeaderMutations>,
    /// Rewrites of the replies the proxy makes itself (Envoy's `local_reply_config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_reply: Option<crate::local_reply::LocalReplyConfig>,
    /// Ways to find the client behind trusted proxies, in order (Envoy's
    /// `original_ip_detection_extensions`); when given, the two above are off.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub original_ip_detection: Vec<client_address::ClientDetection>,
    /// What a request header whose name has an underscore gets.
    pub headers_with_underscores_action: HeadersWithUnderscores,
    /// HTTP/2: the bytes a client may send on one stream, and on the connection, before the
    /// proxy has passed them on. `None`: the buffer limit (at least 65535 for the connection).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_stream_window_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_connection_window_size: Option<u32>,
    /// The `server` header of every response.
    pub server_header: ServerHeader,
    /// The proxy's own response headers (`x-legate-overloaded`) are not added (Envoy's
    /// router `suppress_envoy_headers`).
    pub suppress_proxy_headers: bool,
    pub request_id: RequestIdConfig,
    /// HTTP/1.0 requests are served; `false`: answered 426 and the connection closed.
    pub accept_http_10: bool,
    /// HTTP/1.1 `Upgrade` values (the whole value) that are dropped, the request served as
    /// a plain one (Envoy's `ignore_http_11_upgrade`: `TLS/1.2` upgrades, say).
    #[serde(
        serialize_with = "ser::string_matches",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ignore_http11_upgrade: Vec<StringMatch>,
    /// HTTP/1.1 header names go on as the client spelled them (to clusters that also keep
    /// case), and responses come back as the upstream spelled them (Envoy's `preserve_case`
    /// header formatter). Otherwise they are written in lower case.
    pub preserve_header_case: bool,
    /// HTTP/1.1: a client that closes its sending side (a FIN) after a complete request still
    /// gets the response, as HAProxy's default; `false` (Envoy's and nginx's behaviour)
    /// cancels the request as if the client had gone. A reset cancels it either way.
    pub serve_half_closed: bool,
    /// The host an HTTP/1.0 request without one is routed and forwarded with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_host_for_http_10: Option<String>,
    /// The port taken off the request's host before filters, routing and forwarding
    /// (Envoy's `strip_any_host_port` / `strip_matching_host_port`).
    pub strip_host_port: StripHostPort,
    /// A trailing dot taken off the request's host (`example.com.` is `example.com`).
    pub strip_trailing_host_dot: bool,
    /// What a request's `x-forwarded-client-cert` gets.
    pub forward_client_cert: client_cert::ForwardClientCert,
    /// What the header says of the client's certificate, when it says something.
    pub set_current_client_cert_details: client_cert::ClientCertDetails,
}

/// Which port of a request's host is taken off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StripHostPort {
    None,
    /// Any port.
    Any,
    /// The listener's own port only (the one the client connected to).
    Matching,
}

/// `x-request-id`: made, kept or replaced (Envoy's `generate_request_id`,
/// `preserve_external_request_id`, `always_set_request_id_in_response`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequestIdConfig {
    /// A request without an id gets a random UUID.
    pub generate: bool,
    /// A client's id is kept; `false`, on a listener that takes its peer as the client
    /// (`use_remote_address`): replaced by a new one, as a client is not to be trusted with
    /// the id that ties the logs of every hop together.
    pub preserve_external: bool,
    /// The response carries the request's id.
    pub always_set_in_response: bool,
}

/// What a request header whose name holds `_` gets (Envoy's `headers_with_underscores_action`):
/// such names can smuggle a header past a backend that reads `_` as `-`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadersWithUnderscores {
    /// Passed on.
    Allow,
    /// The request is answered 400 and, on HTTP/1.1, the connection closed; counted in
    /// `downstream_rq_rejected_with_underscores_in_headers`.
    RejectRequest,
    /// The header is removed; counted in `downstream_headers_dropped_with_underscores`.
    DropHeader,
}

/// The `server` header of the responses a listener sends (Envoy's
/// `server_header_transformation` and `server_name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerHeader {
    /// The upstream's, if it sent one; none on the proxy's own replies.
    PassThrough,
    /// Always this name, the upstream's replaced.
    Overwrite(String),
    /// This name where the upstream sent none.
    AppendIfAbsent(String),
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

/// Which implementation serves a listener's HTTP/2 connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Http2Codec {
    /// hyper's server over the h2 crate, kept to fall back on.
    Hyper,
    /// Legate's own (`crates/http2`): frames, HPACK, streams and flood limits of its own,
    /// driven by the connection's task, which holds no buffer while idle.
    #[default]
    Legate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Keepalive {
    #[serde(serialize_with = "ser::duration")]
    pub interval: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
}
