//! One downstream connection: the HTTP/1.1-or-HTTP/2 codec over a TCP stream, and its drain.

mod io;

use std::net::SocketAddr;
use std::rc::Rc;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::exec::LocalExec;
use crate::http::handler;
use crate::worker::{ListenerCtx, WorkerCtx};
use io::DownstreamIo;

/// What a request on this connection needs to know about where it came from.
pub(crate) struct ConnCtx {
    pub(crate) peer: SocketAddr,
    pub(crate) listener: Rc<ListenerCtx>,
    pub(crate) worker: Rc<WorkerCtx>,
}

/// The codec settings of one listener, built once per worker.
pub(crate) fn codec(listener: &crate::config::ListenerConfig) -> auto::Builder<LocalExec> {
    let mut builder = auto::Builder::new(LocalExec);
    builder
        .http1()
        .keep_alive(true)
        // hyper's default 30 s header timeout would also close idle keep-alive connections;
        // idle handling belongs to the listener's own settings.
        .header_read_timeout(None);
    builder
        .http2()
        .max_concurrent_streams(listener.http.max_concurrent_streams);
    builder
}

/// Serves `stream` until the client is done or, after `drain` turns true, until the requests
/// in flight are answered: HTTP/1.1 then closes with `connection: close`, HTTP/2 sends GOAWAY.
pub(crate) async fn serve(
    stream: TcpStream,
    ctx: Rc<ConnCtx>,
    codec: Rc<auto::Builder<LocalExec>>,
    mut drain: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| handler::handle(req, Rc::clone(&ctx)));
    let conn = codec.serve_connection(TokioIo::new(DownstreamIo::new(stream)), service);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => log_end(result),
        _ = drain.wait_for(|draining| *draining) => {
            conn.as_mut().graceful_shutdown();
            log_end(conn.await);
        }
    }
}

fn log_end(result: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
    if let Err(err) = result {
        // Clients vanish all the time; this is worth a look only when debugging.
        tracing::debug!(error = %err, "downstream connection ended with an error");
    }
}
