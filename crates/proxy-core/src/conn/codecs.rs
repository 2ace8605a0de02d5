//! The codec settings of one listener: hyper's HTTP/1.1 and HTTP/2 builders with the
//! listener's limits, built once per worker.

use std::time::Duration;

use hyper::server::conn::{http1, http2};

use super::stream_exec::StreamExec;
use crate::config::{ListenerConfig, RouteAction};

/// HTTP/2 flood limits (h2's defaults, stated here).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// How long an HTTP/1.1 connection stays idle before its codec is dropped.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// The codec settings of one listener, built once per worker.
pub(crate) struct Codecs {
    pub(super) h1: http1::Builder,
    pub(super) h2: http2::Builder<StreamExec>,
    pub(super) idle_timeout: Duration,
    /// HTTP/2: a connection without a request this long after it opened is closed.
    pub(super) request_headers_timeout: Duration,
    /// Idle time before an HTTP/1.1 codec is parked: [`PARK_AFTER`], or sooner when the
    /// header timeout is shorter, since hyper's header timer also runs between requests.
    pub(super) park_after: Duration,
    /// What the HTTP/2 codec takes; the frame meter follows the same CONTINUATION limit.
    pub(super) h2_max_header_list_size: usize,
}

impl Codecs {
    /// The request-head limit the handler must check itself: hyper's HTTP/1.1 buffer only
    /// enforces it when the buffer limit is not larger. (HTTP/2 enforces it in the codec.)
    pub(crate) fn head_limit_to_check(listener: &ListenerConfig) -> Option<usize> {
        let max_head = listener.http.max_request_headers_kb as usize * 1024;
        (Self::h1_buffer(listener) > max_head).then_some(max_head)
    }

    fn h1_buffer(listener: &ListenerConfig) -> usize {
        let max_head = listener.http.max_request_headers_kb as usize * 1024;
        (listener.buffer_limit as usize).max(max_head).max(8192)
    }

    /// `stream_idle_timeouts` counts the HTTP/2 streams ended by `stream_idle_timeout`.
    pub(crate) fn new(listener: &ListenerConfig, stream_idle_timeouts: stats::Counter) -> Self {
        let max_head = listener.http.max_request_headers_kb as usize * 1024;
        let limit = listener.buffer_limit;
        let mut h1 = http1::Builder::new();
        h1.keep_alive(true)
            .timer(hyper_util::rt::TokioTimer::new())
            // A codec is created when a request starts arriving (idle connections are parked
            // without one), so this bounds the head itself, not the idle time between requests.
            .header_read_timeout(listener.http.request_headers_timeout)
            // hyper reads heads and bodies into one buffer, and bounds its write queue by the
            // same size: the buffer limit, or the head limit when that is larger (a head
            // larger than the buffer is answered 431 by hyper, a smaller one over the head
            // limit by the handler). Never below hyper's 8 KiB minimum.
            .max_buf_size(Self::h1_buffer(listener));
        let mut h2 = http2::Builder::new(StreamExec::new(
            listener.http.stream_idle_timeout,
            stream_idle_timeouts,
        ));
        h2.max_concurrent_streams(listener.http.max_concurrent_streams)
            .max_header_list_size(max_head as u32)
            // Fixed windows: a client can send at most `limit` bytes per stream before the
            // upstream has taken them, and the connection window caps all streams together.
            .adaptive_window(false)
            .initial_stream_window_size(limit)
            .initial_connection_window_size(limit.max(65_535))
            .max_send_buf_size(limit as usize)
            // Floods end the connection with GOAWAY ENHANCE_YOUR_CALM: streams the client
            // resets before they are served (rapid reset, CVE-2023-44487), and streams reset
            // for the client's protocol errors. (Oversized header blocks are bounded by
            // max_header_list_size above, CONTINUATION floods by the codec's frame count; PING
            // and SETTINGS floods by conn/h2_frames.rs.)
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
            .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESETS);
        if let Some(keepalive) = listener.http.http2_keepalive {
            // PINGs on a quiet connection; no answer within the timeout closes it.
            h2.timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(keepalive.interval)
                .keep_alive_timeout(keepalive.timeout);
        }
        // WebSocket over HTTP/2 (RFC 8441) is offered where a route takes it.
        let websocket = listener.route_config.routes.iter().any(|r| {
            matches!(&r.action, RouteAction::Forward(f) if f.upgrades.iter().any(|u| u == "websocket"))
        });
        if websocket {
            h2.enable_connect_protocol();
        }
        Self {
            h1,
            h2,
            idle_timeout: listener.http.idle_timeout,
            request_headers_timeout: listener.http.request_headers_timeout,
            park_after: PARK_AFTER.min(listener.http.request_headers_timeout / 2),
            h2_max_header_list_size: max_head,
        }
    }
}
