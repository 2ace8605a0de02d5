//! How a worker talks to the hosts of one cluster: the codec builders and limits, built once
//! from the cluster's config.

use std::sync::Arc;
use std::time::Duration;

use hyper::client::conn::{http1, http2};
use tokio::time::Instant;

use super::SharedCluster;
use crate::error::Overflow;
use crate::runtime::LocalExec;
use crate::throttle::LogThrottle;
use config::{ClusterConfig, UpstreamProtocol};

pub(crate) struct UpstreamSettings {
    pub(super) protocol: UpstreamProtocol,
    pub(super) connect_timeout: Duration,
    /// Requests per connection before it is retired; `None`: no limit.
    pub(super) max_requests: Option<u32>,
    /// A connection without a request this long is closed; `None`: never.
    pub(super) idle_timeout: Option<Duration>,
    /// A connection this old is retired; `None`: no limit.
    pub(super) max_connection_duration: Option<Duration>,
    /// Keep-alive probes on each connection's socket.
    pub(super) tcp_keepalive: Option<socket2::TcpKeepalive>,
    /// Each host's own counts (`host_rq_total`, ...).
    pub(super) per_endpoint_stats: bool,
    pub(super) buffer_limit: usize,
    /// HTTP/1.1 names written as the client spelled them, and responses' noted.
    pub(super) keep_case: bool,
    pub(super) h1: http1::Builder,
    pub(super) h2: http2::Builder<LocalExec>,
    /// Streams one HTTP/2 connection carries before another is opened (`u32::MAX`: no
    /// limit of the proxy's: one connection per host and worker).
    pub(super) h2_max_streams: u32,
    /// HTTP/2 PINGs every `interval`, plus up to this share of it drawn per connection.
    pub(super) h2_ping: Option<(Duration, f64)>,
    /// An HTTP/2 connection idle this long takes no new stream.
    pub(super) h2_idle_limit: Option<Duration>,
    /// A host's malformed HTTP/2 message resets its stream only; `false`: it closes the
    /// connection.
    pub(super) h2_stream_error_only: bool,
    /// Relayed (TCP) connections to a host close when it fails its checks or is ejected.
    pub(super) close_on_host_failure: bool,
    /// Connections opened ahead per host (`per_upstream_ratio`) and across the cluster
    /// (`predictive_ratio`); `None` where the ratio is 1.
    pub(super) preconnect_ratio: Option<f64>,
    pub(super) predictive_ratio: Option<f64>,
    pub(super) shared: Arc<SharedCluster>,
    /// With `auto_sni`: the header the name is read from instead of the host, if any.
    pub(super) auto_sni: Option<Option<http::HeaderName>>,
    /// Requests refused by a breaker, logged at most once a second.
    refused: LogThrottle,
}

/// Why a connection's time is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    Idle,
    MaxDuration,
}

impl UpstreamSettings {
    pub(crate) fn new(cluster: &ClusterConfig, shared: Arc<SharedCluster>) -> Self {
        let limit = cluster.buffer_limit;
        let mut h1 = http1::Builder::new();
        // The response head and body are read into this buffer; hyper needs at least 8 KiB.
        h1.max_buf_size((limit as usize).max(8192));
        let mut h2 = http2::Builder::new(LocalExec);
        h2.adaptive_window(false)
            // What a host may send ahead of the proxy: the buffer limit unless the cluster
            // says otherwise (Envoy's http2_protocol_options windows).
            .initial_stream_window_size(cluster.initial_stream_window_size.unwrap_or(limit))
            // The connection window cannot start below HTTP/2's 64 KiB default.
            .initial_connection_window_size(
                cluster
                    .initial_connection_window_size
                    .unwrap_or(limit.max(65_535)),
            )
            .max_send_buf_size(limit as usize);
        if let Some(keepalive) = cluster.http2_keepalive
            && keepalive.interval.is_some()
        {
            // Envoy's interval PINGs go whether or not streams are open; the interval itself
            // is set per connection, with its jitter.
            h2.timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_timeout(keepalive.timeout)
                .keep_alive_while_idle(true);
        }
        let keepalive = cluster.http2_keepalive;
        Self {
            h2_max_streams: cluster.max_concurrent_streams.unwrap_or(u32::MAX),
            h2_ping: keepalive.and_then(|k| k.interval.map(|i| (i, k.interval_jitter / 100.0))),
            h2_idle_limit: keepalive.and_then(|k| k.connection_idle_interval),
            h2_stream_error_only: cluster.stream_error_on_invalid_http_message,
            close_on_host_failure: cluster.close_connections_on_host_health_failure,
            preconnect_ratio: (cluster.preconnect)
                .map(|p| p.per_upstream_ratio)
                .filter(|r| *r > 1.0),
            predictive_ratio: (cluster.preconnect)
                .map(|p| p.predictive_ratio)
                .filter(|r| *r > 1.0),
            protocol: cluster.protocol,
            connect_timeout: cluster.connect_timeout,
            max_requests: cluster.max_requests_per_connection,
            idle_timeout: cluster.idle_timeout,
            max_connection_duration: cluster.max_connection_duration,
            per_endpoint_stats: cluster.per_endpoint_stats,
            tcp_keepalive: cluster.tcp_keepalive.map(crate::listen::tcp_keepalive),
            buffer_limit: limit as usize,
            keep_case: cluster.preserve_header_case,
            h1,
            h2,
            shared,
            // Checked as a header name at load.
            auto_sni: cluster.auto_sni.as_ref().map(|auto| {
                (auto.header.as_deref())
                    .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok())
            }),
            refused: LogThrottle::default(),
        }
    }

    /// When a connection opened at `opened`, idle since `idle_since`, is to be closed: the
    /// earlier of its idle timeout and its maximum duration; `None`: never.
    pub(super) fn expiry(&self, opened: Instant, idle_since: Instant) -> Option<(Instant, Expiry)> {
        let idle = self.idle_timeout.map(|t| (idle_since + t, Expiry::Idle));
        let aged = self
            .max_connection_duration
            .map(|d| (opened + d, Expiry::MaxDuration));
        match (idle, aged) {
            (Some(a), Some(b)) => Some(if b.0 <= a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Logs a request refused by a breaker: a line a second per worker and cluster at most,
    /// with the count, since under overload a line per request would flood the log and slow
    /// the cheap path the breaker is there for. The access log still has every request.
    pub(super) fn log_refused(&self, overflow: Overflow) {
        if let Some(refused) = self.refused.hit() {
            tracing::warn!(
                flag = "UO",
                cluster = %self.shared.name,
                breaker = overflow.as_str(),
                refused,
                "circuit breaker open: requests refused with 503"
            );
        }
    }
}
