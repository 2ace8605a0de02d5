//! HTTP/2 connections: the codec until the client is done, GOAWAY on drain, once the
//! connection has served its `max_requests_per_connection`, when no request has come within
//! `request_headers_timeout` of the connection opening, or when it has had no stream open for
//! `idle_timeout`, or once it is `max_connection_duration` old. The input is metered for floods
//! the codec does not name (http2_frames.rs).

use std::cell::Cell;
use std::rc::Rc;

use hyper_util::rt::TokioIo;

use super::Codecs;
use super::http2_frames::{Flood, FrameMeter};
use super::io::DownstreamIo;
use super::service::ProxyService;
use crate::context::SignalWatch;

/// How long a quiet connection's GOAWAY may take before the socket is closed.
const QUIET_CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) async fn serve_h2(
    mut io: DownstreamIo,
    service: ProxyService,
    codecs: &Codecs,
    mut drain: SignalWatch,
) {
    let ctx = Rc::clone(&service.conn);
    let flood = Rc::new(Cell::new(None));
    io.meter(FrameMeter::new(
        codecs.h2_max_header_list_size,
        Rc::clone(&flood),
    ));
    let conn = codecs.h2.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    // GOAWAY on drain, once the connection has taken its share of requests, or when it has
    // been quiet too long: streams in flight finish, the client opens a new connection for
    // the rest.
    // The quiet check runs at the first request's deadline, at the end of an idle spell, and
    // at least every `recheck` while it waits for the first request (which may come and go
    // before that deadline).
    let recheck = codecs.idle_timeout.min(codecs.request_headers_timeout);
    let mut quiet_check = ctx.opened + recheck;
    let expires = ctx.expires_at();
    let mut expired = false;
    let result = loop {
        tokio::select! {
            result = conn.as_mut() => break result,
            () = crate::context::sleep_until_some(expires), if !expired => {
                expired = true;
                ctx.listener.stats.cx_max_duration.inc();
                // GOAWAY: the streams in flight finish, under the other timers.
                conn.as_mut().graceful_shutdown();
            }
            () = drain.raised() => {
                conn.as_mut().graceful_shutdown();
                break conn.await;
            }
            _ = ctx.retire.notified() => {
                conn.as_mut().graceful_shutdown();
                break conn.await;
            }
            _ = tokio::time::sleep_until(quiet_check) => {
                let now = tokio::time::Instant::now();
                if ctx.in_flight.get() > 0 {
                    // Busy: look again once it could have been idle long enough.
                    quiet_check = now + codecs.idle_timeout;
                    continue;
                }
                let first = ctx.requests.get() == 0;
                let due = if first {
                    ctx.opened + codecs.request_headers_timeout
                } else {
                    ctx.last_active.get() + codecs.idle_timeout
                };
                if due > now {
                    quiet_check = if first { due.min(now + recheck) } else { due };
                    continue;
                }
                if first {
                    ctx.listener.stats.cx_headers_timeout.inc();
                } else {
                    ctx.listener.stats.cx_idle_timeout.inc();
                }
                // No stream is open: GOAWAY, and a peer that does not take part in the
                // shutdown (hyper waits for a PING's answer) is cut off a moment later.
                conn.as_mut().graceful_shutdown();
                match tokio::time::timeout(QUIET_CLOSE_GRACE, conn.as_mut()).await {
                    Ok(result) => break result,
                    // A stream that raced the GOAWAY is served to its end.
                    Err(_) if ctx.in_flight.get() > 0 => break conn.await,
                    Err(_) => return,
                }
            }
        }
    };
    if let Err(err) = result {
        let stats = &ctx.listener.stats;
        match flood.get() {
            Some(Flood::Control) => stats.cx_h2_control_flood.inc(),
            // GOAWAY ENHANCE_YOUR_CALM: a flood the codec cut off.
            _ if crate::error::h2_reason(&err) != Some(h2::Reason::ENHANCE_YOUR_CALM) => {}
            Some(Flood::Continuation) => stats.cx_h2_continuation_flood.inc(),
            None => stats.cx_h2_flood.inc(),
        }
        tracing::debug!(error = %err, "downstream HTTP/2 connection ended with an error");
    }
}
