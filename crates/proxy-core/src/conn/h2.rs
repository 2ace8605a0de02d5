//! HTTP/2 connections: the codec until the client is done, GOAWAY on drain or once the
//! connection has served its `max_requests_per_connection`.

use std::rc::Rc;

use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use super::Codecs;
use super::io::DownstreamIo;
use super::service::ProxyService;

pub(super) async fn serve_h2(
    io: DownstreamIo,
    service: ProxyService,
    codecs: &Codecs,
    mut drain: watch::Receiver<bool>,
) {
    let ctx = Rc::clone(&service.conn);
    let conn = codecs.h2.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    // GOAWAY on drain, or once the connection has taken its share of requests: streams in
    // flight finish, the client opens a new connection for the rest.
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = drain.wait_for(|draining| *draining) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        _ = ctx.retire.notified() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(err) = result {
        tracing::debug!(error = %err, "downstream HTTP/2 connection ended with an error");
    }
}
