//! An HTTP/2 connection on hyper's codec (over the h2 crate). Its input is metered for the
//! floods the codec does not name (conn/http2_frames.rs).

use std::cell::Cell;
use std::rc::Rc;

use hyper_util::rt::TokioIo;

use super::super::Codecs;
use super::super::http2_frames::{Flood, FrameMeter};
use super::super::io::DownstreamIo;
use super::super::service::ProxyService;
use super::{QUIET_CLOSE_GRACE, Quiet};
use crate::context::SignalWatch;

pub(super) async fn serve(
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
                match super::quiet_check(&ctx, codecs, recheck) {
                    Quiet::LookAgainAt(at) => {
                        quiet_check = at;
                        continue;
                    }
                    Quiet::Due => {}
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
