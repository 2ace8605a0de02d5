//! The codec settings of one listener: the HTTP/1.1 codec's limits and hyper's HTTP/2
//! builder, built once per worker.

use std::time::Duration;

use hyper::server::conn::http2;

use super::stream_exec::StreamExec;
use config::{ListenerConfig, RouteAction};

/// HTTP/2 flood limits (h2's defaults, stated here).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// How long a begun HTTP/1.1 request head may sit unfinished before the read buffer is given
/// up (its bytes kept), and how long after a request a connection counts as in use.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// The codec settings of one listener, built once per worker.
pub(crate) struct Codecs {
    pub(super) h1: H1Limits,
    pub(super) h2: http2::Builder<StreamExec>,
    pub(super) idle_timeout: Duration,
    /// HTTP/2: a connection without a request this long after it opened is closed.
    pub(super) request_headers_timeout: Duration,
    /// How long a begun head may sit unfinished before the buffer is given up (its bytes
    /// kept), and a connection counts as in use after a request (a maximum duration does not
    /// close it under the next one): [`PARK_AFTER`], or sooner when the header timeout is
    /// shorter.
    pub(super) park_after: Duration,
    /// What the HTTP/2 codec takes; the frame meter follows the same CONTINUATION limit.
    pub(super) h2_max_header_list_size: usize,
    /// HTTP/3's transport limits, where the listener serves it.
    pub(crate) h3: Option<super::H3Settings>,
    /// Legate's own HTTP/2 codec's settings, where the listener asks for it
    /// (`http.http2_codec: legate`); `None`: hyper's.
    pub(super) h2_own: Option<::http2::server::Config>,
    /// Each HTTP/2 stream's task ends once nothing has moved for `stream_idle_timeout`.
    pub(super) stream_exec: StreamExec,
    /// HTTP/2 PINGs on a quiet connection (Legate's codec; hyper's builder has its own).
    pub(super) h2_keepalive: Option<config::Keepalive>,
}

/// The HTTP/1.1 codec's sizes, and how it spells names.
pub(super) struct H1Limits {
    /// The largest request head read: the buffer limit, or the head limit when that is
    /// larger. (A head over the head limit but within this is refused by the handler, which
    /// counts its size as Envoy does.)
    pub(super) max_head: usize,
    /// How much a request body read asks for at once.
    pub(super) read_size: usize,
    /// How much of a response is gathered before it is written.
    pub(super) write_buffer: usize,
    /// Request names are noted as spelled, and responses written as their upstream spelled
    /// them (`preserve_header_case`).
    pub(super) keep_case: bool,
    /// A request is served after the client closed its sending side (`serve_half_closed`).
    pub(super) serve_half_closed: bool,
}

impl Codecs {
    /// The request-head limit the handler must check itself: the HTTP/1.1 codec only
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
        let h1 = H1Limits {
            max_head: Self::h1_buffer(listener),
            read_size: limit as usize,
            write_buffer: limit as usize,
            keep_case: listener.http.preserve_header_case,
            serve_half_closed: listener.http.serve_half_closed,
        };
        let stream_exec = StreamExec::new(listener.http.stream_idle_timeout, stream_idle_timeouts);
        let mut h2 = http2::Builder::new(stream_exec.clone());
        h2.max_concurrent_streams(listener.http.max_concurrent_streams)
            .max_header_list_size(max_head as u32)
            // Fixed windows: a client can send at most `limit` bytes per stream before the
            // upstream has taken them, and the connection window caps all streams together
            // (unless the listener sets its windows, as control planes do).
            .adaptive_window(false)
            .initial_stream_window_size(listener.http.initial_stream_window_size.unwrap_or(limit))
            .initial_connection_window_size(
                listener
                    .http
                    .initial_connection_window_size
                    .unwrap_or(limit.max(65_535)),
            )
            .max_send_buf_size(limit as usize)
            // Floods end the connection with GOAWAY ENHANCE_YOUR_CALM: streams the client
            // resets before they are served (rapid reset, CVE-2023-44487), and streams reset
            // for the client's protocol errors. (Oversized header blocks are bounded by
            // max_header_list_size above, CONTINUATION floods by the codec's frame count; PING
            // and SETTINGS floods by conn/http2_frames.rs.)
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
            h3: listener
                .http3
                .as_ref()
                .map(|_| super::H3Settings::new(listener)),
            h2_own: (listener.http.http2_codec == config::Http2Codec::Legate).then(|| {
                ::http2::server::Config {
                    max_concurrent_streams: listener.http.max_concurrent_streams,
                    initial_stream_window: listener
                        .http
                        .initial_stream_window_size
                        .unwrap_or(limit),
                    initial_connection_window: listener
                        .http
                        .initial_connection_window_size
                        .unwrap_or(limit.max(65_535)),
                    max_header_list_size: max_head as u32,
                    header_table_size: ::http2::hpack::DEFAULT_TABLE_SIZE as u32,
                    enable_connect_protocol: websocket,
                    // The per-connection buffer limit bounds what waits to be written too.
                    max_output: (limit as usize).max(16 * 1024),
                    floods: ::http2::server::FloodLimits::default(),
                    // The worker's pool of maps, which the HTTP/1.1 upstream's write gives
                    // the request's back to, and the response's is given back to once sent.
                    header_map: h1::request_header_map,
                }
            }),
            stream_exec,
            h2_keepalive: listener.http.http2_keepalive,
        }
    }
}
