//! Why the proxy answered a request itself instead of relaying the upstream's response.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;

/// Why a request body could not be relayed: the codec's error (HTTP/2: hyper's; HTTP/1.1:
/// `h1::BodyError`).
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// Envoy's response flags: the short code an operator greps for in a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFlag {
    /// NR: no route matched.
    NoRoute,
    /// UH: the cluster had no host to send to.
    NoHealthyUpstream,
    /// DPE: the downstream request was malformed.
    DownstreamProtocolError,
    /// UF: the upstream connection could not be made.
    UpstreamConnectFailure,
    /// UT: the upstream did not answer in time.
    UpstreamTimeout,
    /// UR: the upstream reset or closed the connection.
    UpstreamReset,
    /// UPE: the upstream sent something that is not valid HTTP.
    UpstreamProtocolError,
    /// DC: the downstream connection went away mid-request.
    DownstreamConnectionTermination,
    /// UO: a circuit breaker of the cluster refused the request.
    UpstreamOverflow,
    /// UAEX: the external authorization service denied the request, or failed to answer.
    UnauthorizedExternalService,
    /// RL: a rate limit (local or the rate limit service's) refused the request.
    RateLimited,
    /// RLSE: the rate limit service failed to answer, and failures refuse requests.
    RateLimitServiceError,
    /// OM: the overload manager shed the request.
    OverloadManager,
    /// FI: the fault filter answered in the upstream's place.
    FaultInjected,
    /// LH: a health check of this proxy failed (failed by the admin, or draining).
    FailedLocalHealthCheck,
    /// DT: a connection reached its maximum duration.
    DurationTimeout,
    /// NC: the cluster a request header named is not there.
    NoClusterFound,
}

impl ResponseFlag {
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseFlag::NoRoute => "NR",
            ResponseFlag::NoHealthyUpstream => "UH",
            ResponseFlag::DownstreamProtocolError => "DPE",
            ResponseFlag::UpstreamConnectFailure => "UF",
            ResponseFlag::UpstreamTimeout => "UT",
            ResponseFlag::UpstreamReset => "UR",
            ResponseFlag::UpstreamProtocolError => "UPE",
            ResponseFlag::DownstreamConnectionTermination => "DC",
            ResponseFlag::UpstreamOverflow => "UO",
            ResponseFlag::UnauthorizedExternalService => "UAEX",
            ResponseFlag::RateLimited => "RL",
            ResponseFlag::RateLimitServiceError => "RLSE",
            ResponseFlag::OverloadManager => "OM",
            ResponseFlag::FaultInjected => "FI",
            ResponseFlag::FailedLocalHealthCheck => "LH",
            ResponseFlag::DurationTimeout => "DT",
            ResponseFlag::NoClusterFound => "NC",
        }
    }
}

impl fmt::Display for ResponseFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which circuit breaker of a cluster refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// `max_requests`: too many requests in flight to the cluster.
    Requests,
    /// `max_pending_requests`: no connection free and the pending queue full.
    Pending,
    /// Waited `pending_timeout` for a connection without getting one.
    PendingTimeout,
    /// `max_connections`: a relayed connection (tcp_proxy) found the cluster's connections
    /// at their limit.
    Connections,
}

impl Overflow {
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::Requests => "max_requests",
            Overflow::Pending => "max_pending_requests",
            Overflow::PendingTimeout => "pending_timeout",
            Overflow::Connections => "max_connections",
        }
    }
}

/// A request the proxy could not relay, with its cause.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no route matches the request")]
    NoRoute,
    /// The route's `cluster_header` named no cluster there is; the route's
    /// `cluster_not_found_response_code`.
    #[error("the cluster the request names is not there")]
    ClusterNotFound(StatusCode),
    /// An upgrade the route allows that its cluster cannot take (one speaking HTTP/2): 403,
    /// as Envoy's `upgrade_failed`, the connection kept.
    #[error("the upgrade cannot be relayed to this cluster")]
    UpgradeFailed,
    /// A CONNECT on a route without `connect`: 403, as Envoy refuses an upgrade no config
    /// enables.
    #[error("the route takes no CONNECT")]
    ConnectNotAllowed,
    /// A request of an unsafe method that came in 0-RTT early data, which could be a replay:
    /// 425, which the client retries once its handshake is done (RFC 8470).
    #[error("an unsafe request in 0-RTT early data")]
    TooEarly,
    #[error("no healthy upstream host")]
    NoHealthyUpstream,
    #[error("circuit breaker open: {}", .0.as_str())]
    Overflow(Overflow),
    #[error("the proxy is overloaded and sheds new requests")]
    Overloaded,
    #[error("malformed request: {0}")]
    BadRequest(&'static str),
    /// The listener finds the client in a header that held no address, and refuses such
    /// requests with this status.
    #[error("the request's header names no client address")]
    ClientUnknown(StatusCode),
    #[error("an HTTP/1.0 request on a listener that takes HTTP/1.1 and later only")]
    Http10Refused,
    #[error("request head of {size} bytes is over the {limit}-byte limit")]
    HeadersTooLarge { size: usize, limit: usize },
    #[error("cannot connect to {addr}: {source}")]
    ConnectFailure { addr: SocketAddr, source: io::Error },
    #[error("TLS handshake with {addr} failed: {source}")]
    UpstreamTls { addr: SocketAddr, source: io::Error },
    #[error("connect to {addr} timed out after {after:?}")]
    ConnectTimeout { addr: SocketAddr, after: Duration },
    #[error("upstream {addr} sent no response within {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("upstream {addr} closed or reset the connection: {source}")]
    UpstreamReset { addr: SocketAddr, source: BodyError },
    #[error("client went away while its request body was being sent: {source}")]
    ClientAborted { source: BodyError },
    #[error("upstream {addr} sent an invalid response: {source}")]
    UpstreamProtocol { addr: SocketAddr, source: BodyError },
    /// A response whose length could be read two ways (smuggling): never relayed.
    #[error("upstream {addr} sent a response with {what}")]
    UpstreamFraming {
        addr: SocketAddr,
        what: &'static str,
    },
    /// The request and its response ran past `max_stream_duration` before the response
    /// began: 408 while the request was not whole yet, 504 after (as Envoy).
    #[error("the request took longer than its max_stream_duration of {limit:?}")]
    StreamDuration {
        limit: Duration,
        request_complete: bool,
    },
}

/// A response body still streaming when its request's `max_stream_duration` ran out: the
/// stream is reset.
#[derive(Debug, thiserror::Error)]
#[error("the response did not end within the max stream duration")]
pub(crate) struct StreamDurationReached;

/// A request body that had not ended when the listener's `request_timeout` ran out.
#[derive(Debug, thiserror::Error)]
#[error("the request did not arrive whole within the request timeout")]
pub(crate) struct RequestTimedOut;

/// An HTTP/2 stream this side reset: hyper resets it when the request body it relays fails
/// (its own error, the body's, goes to the task that relayed it, not to the response).
fn reset_here(error: &hyper::Error) -> bool {
    let mut cause = std::error::Error::source(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_reset() && !h2.is_remote() && !h2.is_library();
        }
        cause = e.source();
    }
    false
}

/// The HTTP/2 error code behind an error, if an h2 error is among its causes.
pub(crate) fn h2_reason(error: &(dyn std::error::Error + 'static)) -> Option<h2::Reason> {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.reason();
        }
        source = e.source();
    }
    None
}

impl ProxyError {
    /// Sorts a hyper client error into a reset or a protocol error.
    pub(crate) fn from_upstream(addr: SocketAddr, source: hyper::Error) -> Self {
        if source.is_user() || reset_here(&source) {
            // The request body we were relaying (the client's) failed: not the upstream's doing.
            ProxyError::ClientAborted {
                source: source.into(),
            }
        } else if source.is_parse() || source.is_parse_status() || source.is_parse_too_large() {
            ProxyError::UpstreamProtocol {
                addr,
                source: Box::new(source),
            }
        } else {
            ProxyError::UpstreamReset {
                addr,
                source: Box::new(source),
            }
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::UpgradeFailed | ProxyError::ConnectNotAllowed => StatusCode::FORBIDDEN,
            ProxyError::TooEarly => StatusCode::TOO_EARLY,
            ProxyError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::ClientAborted { .. } if self.is_request_timeout() => {
                StatusCode::REQUEST_TIMEOUT
            }
            ProxyError::BadRequest(_) | ProxyError::ClientAborted { .. } => StatusCode::BAD_REQUEST,
            ProxyError::Http10Refused => StatusCode::UPGRADE_REQUIRED,
            ProxyError::ClientUnknown(status) | ProxyError::ClusterNotFound(status) => *status,
            ProxyError::ConnectFailure { .. }
            | ProxyError::UpstreamTls { .. }
            | ProxyError::ConnectTimeout { .. }
            | ProxyError::NoHealthyUpstream
            | ProxyError::Overflow(_)
            | ProxyError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::StreamDuration {
                request_complete, ..
            } => {
                if *request_complete {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::REQUEST_TIMEOUT
                }
            }
            ProxyError::UpstreamReset { .. }
            | ProxyError::UpstreamProtocol { .. }
            | ProxyError::UpstreamFraming { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// The response flag of the failure; `None` for a request that took longer than the
    /// listener's `request_timeout` (Envoy sets none).
    pub fn flag(&self) -> Option<ResponseFlag> {
        if self.is_request_timeout() {
            return None;
        }
        Some(match self {
            ProxyError::NoRoute => ResponseFlag::NoRoute,
            ProxyError::ClusterNotFound(_) => ResponseFlag::NoClusterFound,
            ProxyError::NoHealthyUpstream => ResponseFlag::NoHealthyUpstream,
            ProxyError::Overflow(_) => ResponseFlag::UpstreamOverflow,
            ProxyError::Overloaded => ResponseFlag::OverloadManager,
            ProxyError::BadRequest(_)
            | ProxyError::HeadersTooLarge { .. }
            | ProxyError::Http10Refused => ResponseFlag::DownstreamProtocolError,
            // Envoy's downstream duration timeout and failed upgrade set no flag.
            ProxyError::ClientUnknown(_)
            | ProxyError::StreamDuration { .. }
            | ProxyError::UpgradeFailed
            | ProxyError::ConnectNotAllowed
            | ProxyError::TooEarly => return None,
            ProxyError::ClientAborted { .. } => ResponseFlag::DownstreamConnectionTermination,
            ProxyError::ConnectFailure { .. }
            | ProxyError::UpstreamTls { .. }
            | ProxyError::ConnectTimeout { .. } => ResponseFlag::UpstreamConnectFailure,
            ProxyError::Timeout { .. } => ResponseFlag::UpstreamTimeout,
            ProxyError::UpstreamReset { .. } => ResponseFlag::UpstreamReset,
            ProxyError::UpstreamProtocol { .. } | ProxyError::UpstreamFraming { .. } => {
                ResponseFlag::UpstreamProtocolError
            }
        })
    }

    /// The gRPC status a gRPC request gets for the failure, where not the one its HTTP status
    /// maps to: an upstream that did not answer in time is DEADLINE_EXCEEDED, as Envoy's
    /// router has it (not UNAVAILABLE, which tells the client to try again).
    pub(crate) fn grpc_status(&self) -> Option<u32> {
        const DEADLINE_EXCEEDED: u32 = 4;
        matches!(self, ProxyError::Timeout { .. }).then_some(DEADLINE_EXCEEDED)
    }

    /// The client's body did not end within the listener's `request_timeout`.
    pub(crate) fn is_request_timeout(&self) -> bool {
        let ProxyError::ClientAborted { source } = self else {
            return false;
        };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
        while let Some(e) = cause {
            if e.is::<RequestTimedOut>() {
                return true;
            }
            cause = e.source();
        }
        false
    }

    /// The short plain-text body sent to the client. It names the failure, never internals
    /// such as upstream addresses.
    pub fn client_body(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "no route\n",
            ProxyError::ClusterNotFound(_) => "cluster not found\n",
            ProxyError::UpgradeFailed => "upgrade failed\n",
            ProxyError::ConnectNotAllowed => "CONNECT is not allowed here\n",
            ProxyError::TooEarly => "too early: send again once the handshake is done\n",
            ProxyError::NoHealthyUpstream => "no healthy upstream\n",
            ProxyError::Overflow(_) => "upstream overloaded\n",
            ProxyError::Overloaded => "proxy overloaded\n",
            ProxyError::BadRequest(_) => "bad request\n",
            ProxyError::Http10Refused => "HTTP/1.1 or later required\n",
            ProxyError::ClientUnknown(_) => "client address not found\n",
            ProxyError::HeadersTooLarge { .. } => "request headers too large\n",
            ProxyError::ClientAborted { .. } if self.is_request_timeout() => "request timeout\n",
            ProxyError::ClientAborted { .. } => "request body incomplete\n",
            ProxyError::ConnectFailure { .. } | ProxyError::ConnectTimeout { .. } => {
                "upstream connect failure\n"
            }
            ProxyError::UpstreamTls { .. } => "upstream TLS handshake failure\n",
            ProxyError::Timeout { .. } => "upstream request timeout\n",
            ProxyError::StreamDuration { .. } => "downstream duration timeout\n",
            ProxyError::UpstreamReset { .. } => "upstream connection reset\n",
            ProxyError::UpstreamProtocol { .. } | ProxyError::UpstreamFraming { .. } => {
                "upstream protocol error\n"
            }
        }
    }
}
