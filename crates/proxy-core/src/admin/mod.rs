//! The admin server: operators' endpoints on their own listener and thread, never on a
//! worker, so a busy data plane cannot starve them and they cannot slow it down.

mod config_dump;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use crate::config::Config;

/// The endpoints, listed in every 404 so an operator can find the right one.
const ENDPOINTS: &str = "\
GET  /ready               200 while serving, 503 when draining or failed by /healthcheck/fail
GET  /config_dump         the effective config as JSON, defaults filled in
POST /healthcheck/fail    make /ready answer 503 (drain this proxy from its load balancer)
POST /healthcheck/ok      undo /healthcheck/fail
";

/// What the admin endpoints read.
pub(crate) struct AdminState {
    pub(crate) config: Arc<Config>,
    pub(crate) workers: usize,
    /// Set by `POST /healthcheck/fail`.
    pub(crate) health_failed: AtomicBool,
    /// Set when the drain starts.
    pub(crate) draining: AtomicBool,
}

impl AdminState {
    pub(crate) fn new(config: Arc<Config>, workers: usize) -> Self {
        Self {
            config,
            workers,
            health_failed: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        }
    }
}

/// The admin server's thread.
pub(crate) struct AdminServer {
    pub(crate) address: SocketAddr,
    stop: watch::Sender<bool>,
    thread: JoinHandle<()>,
}

impl AdminServer {
    /// Binds `address` and serves on a new thread.
    pub(crate) fn start(address: SocketAddr, state: Arc<AdminState>) -> io::Result<AdminServer> {
        let listener = std::net::TcpListener::bind(address)?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("legate-admin".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(err) => {
                        tracing::error!(error = %err, "cannot start the admin runtime");
                        return;
                    }
                };
                runtime.block_on(serve(listener, state, stopped));
            })?;
        Ok(AdminServer {
            address,
            stop,
            thread,
        })
    }

    pub(crate) fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AdminState>,
    mut stopped: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(err) => {
            tracing::error!(error = %err, "cannot register the admin socket");
            return;
        }
    };
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    tracing::warn!(error = %err, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stopped.wait_for(|s| *s) => return,
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(handle(req, &state)) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn handle(req: Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/ready") => {
            if state.draining.load(Ordering::Relaxed) {
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "DRAINING\n")
            } else if state.health_failed.load(Ordering::Relaxed) {
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "FAILED\n")
            } else {
                reply(StatusCode::OK, TEXT, "LIVE\n")
            }
        }
        (&Method::GET, "/config_dump") => {
            let dump = config_dump::config_dump(&state.config, state.workers);
            match serde_json::to_vec_pretty(&dump) {
                Ok(json) => reply(StatusCode::OK, "application/json", json),
                Err(err) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    TEXT,
                    format!("cannot render the config: {err}\n"),
                ),
            }
        }
        (&Method::POST, "/healthcheck/fail") => {
            state.health_failed.store(true, Ordering::Relaxed);
            reply(StatusCode::OK, TEXT, "OK\n")
        }
        (&Method::POST, "/healthcheck/ok") => {
            state.health_failed.store(false, Ordering::Relaxed);
            reply(StatusCode::OK, TEXT, "OK\n")
        }
        (_, "/healthcheck/fail" | "/healthcheck/ok") => {
            reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "use POST\n")
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            format!("unknown admin endpoint; these exist:\n{ENDPOINTS}"),
        ),
    }
}
