//! A client for Envoy's external authorization service.
//!
//! An edge proxy asks an authorization sidecar on the same host about most requests. Done
//! well that costs one loopback round trip, so this client keeps one multiplexed HTTP/2
//! connection per [`AuthzClient`] (make one per worker thread), reconnects with backoff when
//! the service goes away, and bounds every check by a hard timeout.
//!
//! Two protocols, as in Envoy's `ext_authz` filter:
//! - gRPC: `envoy.service.auth.v3.Authorization/Check`, with the generated types of
//!   `envoy-types`, so any existing ext_authz server works;
//! - HTTP: the request's method and path (behind a configurable prefix) and its allowed
//!   headers; a 200 allows (as in Envoy, no other 2xx does), anything else is the denial
//!   to send to the client.
//!
//! ```no_run
//! use std::time::Duration;
//! use authz_client::{AuthzClient, CheckInput, Decision, Endpoint};
//!
//! # async fn run() -> Result<(), authz_client::AuthzError> {
//! let client = AuthzClient::grpc(Endpoint::Tcp("127.0.0.1:9191".parse().unwrap()), Duration::from_millis(200));
//! let mut headers = http::HeaderMap::new();
//! headers.insert("authorization", "Bearer token".parse().unwrap());
//! let input = CheckInput {
//!     method: &http::Method::GET,
//!     path: "/orders/7",
//!     host: "shop.example.com",
//!     scheme: "https",
//!     version: http::Version::HTTP_11,
//!     headers: &headers,
//!     request_id: "3f0c2e",
//!     source: "192.0.2.7:51000".parse().unwrap(),
//!     destination: "10.0.0.1:443".parse().unwrap(),
//!     context_extensions: &[],
//!     allowed_headers: None,
//!     route_metadata: None,
//!     body: None,
//!     traceparent: None,
//!     tracestate: None,
//! };
//! match client.check(&input).await? {
//!     Decision::Allow(allowed) => allowed.apply_to_request(&mut headers),
//!     Decision::Deny(denied) => println!("refused with {}", denied.status),
//! }
//! # Ok(())
//! # }
//! ```

mod check_encoding;
mod check_message;
mod decision;
mod grpc;
mod http_mode;
mod retry;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Version};

pub use decision::{Allowed, Decision, Denied, HeaderAction, HeaderMutation, is_protected};

/// The fuzz target of the service's answers (`fuzz/`, feature `fuzzing`). Not an API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;

/// Where the authorization service listens.
pub use service_endpoint::Endpoint;

/// TLS to the service (over TCP); ALPN is set by the mode.
pub use grpc_channel::Tls;

/// HTTP mode's options.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Put before the request's path, e.g. `/authz`.
    pub path_prefix: String,
    /// Every check's path, instead of the request's behind the prefix.
    pub path_override: Option<String>,
    /// Which failed checks are tried again, and when; `None`: none.
    pub retry: Option<std::sync::Arc<dyn CheckRetry>>,
    /// Request headers sent to the service besides `host`, `authorization`, `content-length`
    /// and the method and path, which always go.
    pub allowed_headers: Vec<HeaderName>,
    /// Headers of a 200 answer copied onto the upstream request (replacing any of the name).
    pub allowed_upstream_headers: Vec<HeaderName>,
    /// Headers of a 200 answer appended to the upstream request's.
    pub allowed_upstream_headers_to_append: Vec<HeaderName>,
    /// Headers of a 200 answer added to the response the client gets.
    pub allowed_client_headers_on_success: Vec<HeaderName>,
    /// Headers of a denial the client gets; `None`: all of them (but the hop's own). Given,
    /// `www-authenticate` and `location` go too (as Envoy).
    pub allowed_client_headers: Option<Vec<HeaderName>>,
    /// Set on every check request (over the client's of the name).
    pub headers_to_add: Vec<(HeaderName, HeaderValue)>,
}

/// How a try of a check failed without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryFailure {
    /// No connection: refused, unreachable, or within the back-off after such a failure.
    /// Nothing reached the service.
    Connect,
    /// The connection failed once the check was on its way.
    Reset,
    /// HTTP/2: the service refused the call's stream (REFUSED_STREAM): it never saw it.
    RefusedStream,
}

/// The retry policy of checks, as the embedder defines it (Envoy's `retry_on` conditions,
/// say). All tries together stay within the client's timeout.
pub trait CheckRetry: std::fmt::Debug + Send + Sync {
    /// Tries after the first, at most.
    fn max_retries(&self) -> u32;
    /// Whether a try answered with this head is tried again.
    fn retry_answer(&self, status: http::StatusCode, headers: &HeaderMap) -> bool;
    /// Whether a try that failed so is tried again.
    fn retry_failure(&self, failure: TryFailure) -> bool;
    /// The wait before retry `n` (from 1).
    fn back_off(&self, n: u32) -> Duration;
    /// Each try's own limit, within the client's timeout; `None`: the client's timeout alone.
    fn per_try_timeout(&self) -> Option<Duration> {
        None
    }
}

/// What the service is told about a request.
#[derive(Debug)]
pub struct CheckInput<'a> {
    pub method: &'a Method,
    /// Path and query as the client sent them.
    pub path: &'a str,
    pub host: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    pub version: Version,
    pub headers: &'a HeaderMap,
    pub request_id: &'a str,
    /// The client.
    pub source: SocketAddr,
    /// The proxy's address the client connected to.
    pub destination: SocketAddr,
    /// Per-route `context_extensions` (gRPC mode).
    pub context_extensions: &'a [(String, String)],
    /// gRPC mode: the request headers sent, by lowercase name (`:authority`, `:method` and
    /// `:path` included); `None`: all of them.
    pub allowed_headers: Option<&'a [String]>,
    /// gRPC mode: the route's metadata for the service, an encoded `config.core.v3.Metadata`
    /// (`route_metadata_context`).
    pub route_metadata: Option<&'a [u8]>,
    /// The request body, or its first bytes, when the service is to see it.
    pub body: Option<&'a Bytes>,
    /// W3C trace context for the check itself, sent as the call's own `traceparent` and
    /// `tracestate` headers (gRPC metadata), so the service's span joins the request's trace.
    pub traceparent: Option<&'a HeaderValue>,
    pub tracestate: Option<&'a HeaderValue>,
}

impl CheckInput<'_> {
    /// Puts the check's trace context on the call's headers, replacing any of the names.
    /// Marked sensitive: HPACK never indexes them, so the connection's header table keeps
    /// neither these values, unique to one call, nor the memory they were cut from.
    fn put_trace_context(&self, headers: &mut HeaderMap) {
        for (name, value) in [
            (&TRACEPARENT, self.traceparent),
            (&TRACESTATE, self.tracestate),
        ] {
            if let Some(value) = value {
                let mut value = value.clone();
                value.set_sensitive(true);
                headers.insert(name.clone(), value);
            }
        }
    }
}

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Why a check gave no decision. The caller's failure mode decides what happens then.
#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot connect to the authorization service at {endpoint}: {source}")]
    Connect {
        endpoint: Endpoint,
        source: std::io::Error,
    },
    #[error(
        "the authorization service at {endpoint} is unreachable; next connect attempt in {retry_in:?}"
    )]
    Backoff {
        endpoint: Endpoint,
        retry_in: Duration,
    },
    #[error("the connection to the authorization service failed: {0}")]
    Transport(String),
    #[error("the authorization service answered with gRPC status {code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    #[error("the authorization service reported an error ({status})")]
    ErrorResponse { status: http::StatusCode },
}

impl From<grpc_channel::ChannelError> for AuthzError {
    fn from(error: grpc_channel::ChannelError) -> Self {
        use grpc_channel::ChannelError;
        match error {
            ChannelError::Connect { endpoint, source } => AuthzError::Connect { endpoint, source },
            ChannelError::Backoff { endpoint, retry_in } => {
                AuthzError::Backoff { endpoint, retry_in }
            }
            ChannelError::Transport(message) => AuthzError::Transport(message),
            ChannelError::Status { code, message } => AuthzError::Status { code, message },
        }
    }
}

impl AuthzError {
    pub fn is_timeout(&self) -> bool {
        matches!(self, AuthzError::Timeout(_))
    }
}

/// A client of one authorization service: one HTTP/2 connection (gRPC) or a small keep-alive
/// pool (HTTP mode), made on first use and again after it fails. Cheap to share by reference
/// within a thread; make one per worker thread for one connection per worker.
pub struct AuthzClient {
    timeout: Duration,
    mode: Mode,
}

enum Mode {
    Grpc(grpc::GrpcChannel),
    Http(http_mode::HttpChannel),
}

impl AuthzClient {
    /// A gRPC (`envoy.service.auth.v3`) client.
    pub fn grpc(endpoint: Endpoint, timeout: Duration) -> Self {
        Self {
            timeout,
            mode: Mode::Grpc(grpc::GrpcChannel::new(endpoint)),
        }
    }

    /// The gRPC calls' `:authority` (`ext-authz` by default): the name the service, or a
    /// proxy in front of it, knows itself by.
    pub fn with_authority(mut self, authority: &str) -> Self {
        if let Mode::Grpc(channel) = &mut self.mode {
            channel.set_authority(authority);
        }
        self
    }

    /// Failed gRPC checks are tried again as `retry` says (its answer conditions read the
    /// answer's head: a failed call's `grpc-status` is there, trailers-only). HTTP mode takes
    /// its policy in [`HttpOptions::retry`].
    pub fn with_retry(mut self, retry: std::sync::Arc<dyn CheckRetry>) -> Self {
        if let Mode::Grpc(channel) = &mut self.mode {
            channel.set_retry(retry);
        }
        self
    }

    /// An HTTP-mode client.
    pub fn http(endpoint: Endpoint, timeout: Duration, options: HttpOptions) -> Self {
        Self {
            timeout,
            mode: Mode::Http(http_mode::HttpChannel::new(endpoint, options)),
        }
    }

    /// Speaks TLS to the service (a TCP endpoint): `h2` offered for gRPC, `http/1.1` for
    /// HTTP mode.
    pub fn with_tls(mut self, tls: Tls) -> Self {
        let alpn: &[u8] = match &self.mode {
            Mode::Grpc(_) => b"h2",
            Mode::Http(_) => b"http/1.1",
        };
        let mut config = (*tls.config).clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        let tls = Tls {
            config: std::sync::Arc::new(config),
            server_name: tls.server_name,
        };
        match &mut self.mode {
            Mode::Grpc(channel) => channel.set_tls(tls),
            Mode::Http(channel) => channel.set_tls(tls),
        }
        self
    }

    /// Asks the service about one request, within the timeout.
    pub async fn check(&self, input: &CheckInput<'_>) -> Result<Decision, AuthzError> {
        let check = async {
            match &self.mode {
                Mode::Grpc(channel) => channel.check(input).await,
                Mode::Http(channel) => channel.check(input).await,
            }
        };
        tokio::time::timeout(self.timeout, check)
            .await
            .map_err(|_| AuthzError::Timeout(self.timeout))?
    }
}
