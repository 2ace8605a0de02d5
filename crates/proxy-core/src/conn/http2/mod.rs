//! HTTP/2 connections, served by hyper's codec (hyper_codec.rs) or by Legate's own
//! (`crates/http2`: the connection's task in connection.rs, each stream's in stream.rs), as
//! the listener's `http.http2_codec` says. Either way the connection sends GOAWAY on drain,
//! once it has served its `max_requests_per_connection`, when no request has come within
//! `request_headers_timeout` of its opening, when it has had no stream open for
//! `idle_timeout`, or once it is `max_connection_duration` old; streams in flight finish.

mod connection;
mod hyper_codec;
mod stream;
mod stream_task;
mod tunnel;

use std::time::Duration;

use tokio::time::Instant;

use super::Codecs;
use super::io::DownstreamIo;
use super::service::ProxyService;
use crate::context::{ConnCtx, SignalWatch};

/// How long a quiet connection's GOAWAY may take before the socket is closed.
const QUIET_CLOSE_GRACE: Duration = Duration::from_secs(1);

pub(super) async fn serve_h2(
    io: DownstreamIo,
    service: ProxyService,
    codecs: &Codecs,
    drain: SignalWatch,
) {
    match &codecs.h2_own {
        Some(config) => connection::serve(io, service, codecs, config.clone(), drain).await,
        // Boxed: hyper's connection state is large, and would take room in every connection
        // on Legate's own codec (the default) too.
        None => Box::pin(hyper_codec::serve(io, service, codecs, drain)).await,
    }
}

/// What the quiet check found.
enum Quiet {
    /// Not quiet long enough (or busy): look again then.
    LookAgainAt(Instant),
    /// Quiet too long (counted): the connection goes away.
    Due,
}

/// Whether a connection has been quiet too long: no request within `request_headers_timeout`
/// of its opening, or no stream open for `idle_timeout`. It runs at the first request's
/// deadline, at the end of an idle spell, and at least every `recheck` while it waits for the
/// first request (which may come and go before that deadline).
fn quiet_check(ctx: &ConnCtx, codecs: &Codecs, recheck: Duration) -> Quiet {
    let now = Instant::now();
    if ctx.in_flight.get() > 0 {
        // Busy: look again once it could have been idle long enough.
        return Quiet::LookAgainAt(now + codecs.idle_timeout);
    }
    let first = ctx.requests.get() == 0;
    let due = if first {
        ctx.opened + codecs.request_headers_timeout
    } else {
        ctx.last_active.get() + codecs.idle_timeout
    };
    if due > now {
        return Quiet::LookAgainAt(if first { due.min(now + recheck) } else { due });
    }
    if first {
        ctx.listener.stats.cx_headers_timeout.inc();
    } else {
        ctx.listener.stats.cx_idle_timeout.inc();
    }
    Quiet::Due
}
