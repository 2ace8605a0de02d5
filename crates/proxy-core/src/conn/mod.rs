//! One downstream connection: protocol detection, the HTTP/1.1 or HTTP/2 codec, idle parking,
//! and the drain on shutdown.
//!
//! An HTTP/1.1 keep-alive connection that has been idle for [`PARK_AFTER`] is *parked*: the
//! codec, with its read and write buffers, is dropped and only the socket is kept. When the
//! client sends again, a fresh codec takes over (with any bytes the old one had read but not
//! used). Idle connections thus cost little more than their socket, which is what lets a
//! proxy hold tens of thousands of them (lesson L2).

mod io;

use std::cell::Cell;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;
use std::time::SystemTime;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::access_log::{LogRecord, PendingLog};
use crate::exec::LocalExec;
use crate::http::body::{RequestBody, ResponseBody};
use crate::http::handler;
use crate::worker::{ListenerCtx, WorkerCtx};
pub(crate) use io::DownstreamIo;

/// How long an HTTP/1.1 connection stays idle before its codec is dropped.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// The first bytes of every HTTP/2 prior-knowledge connection (RFC 9113 section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a request on this connection needs to know about where it came from.
pub(crate) struct ConnCtx {
    pub(crate) peer: SocketAddr,
    /// The proxy's address the client connected to.
    pub(crate) local: SocketAddr,
    /// The client's IP as header text, formatted once for `x-forwarded-for`.
    pub(crate) peer_ip: http::HeaderValue,
    pub(crate) listener: Rc<ListenerCtx>,
    pub(crate) worker: Rc<WorkerCtx>,
    /// Responses not yet fully written.
    in_flight: Cell<u32>,
    /// Requests received on this connection.
    pub(crate) requests: Cell<u32>,
    /// Set when the connection has served its `max_requests_per_connection`.
    pub(crate) retire: tokio::sync::Notify,
    /// When the last response finished.
    last_active: Cell<Instant>,
}

impl ConnCtx {
    pub(crate) fn new(
        peer: SocketAddr,
        local: SocketAddr,
        listener: Rc<ListenerCtx>,
        worker: Rc<WorkerCtx>,
    ) -> Self {
        Self {
            peer,
            local,
            peer_ip: crate::http::headers::ip_header_value(peer.ip()),
            listener,
            worker,
            in_flight: Cell::new(0),
            requests: Cell::new(0),
            retire: tokio::sync::Notify::new(),
            last_active: Cell::new(Instant::now()),
        }
    }
}

/// A request from its head until its response body is dropped (written out or abandoned):
/// counted as in flight, timed, and its status class counted.
pub(crate) struct InFlight {
    conn: Rc<ConnCtx>,
    started: Instant,
    status: Option<http::StatusCode>,
    /// Filled in along the way when the listener keeps an access log.
    log: Option<Box<PendingLog>>,
}

impl InFlight {
    fn new(conn: &Rc<ConnCtx>, req: &http::Request<Incoming>) -> Self {
        conn.in_flight.set(conn.in_flight.get() + 1);
        let stats = &conn.listener.stats;
        stats.rq_total.inc();
        stats.rq_active.inc();
        conn.worker.stats.rq_total.inc();
        let log = conn.listener.access_log.as_ref().map(|log| {
            let mut pending = log.take_pending();
            pending.record = LogRecord {
                method: Some(req.method().clone()),
                path: req.uri().path_and_query().cloned(),
                version: Some(req.version()),
                peer: Some(conn.peer),
                request_id: req.headers().get("x-request-id").cloned(),
                ..LogRecord::default()
            };
            pending.wall_start = SystemTime::now();
            pending
        });
        InFlight {
            conn: Rc::clone(conn),
            started: Instant::now(),
            status: None,
            log,
        }
    }

    pub(crate) fn set_status(&mut self, status: http::StatusCode) {
        self.status = Some(status);
    }

    /// The access log's record, when this listener keeps one.
    pub(crate) fn log(&mut self) -> Option<&mut LogRecord> {
        self.log.as_mut().map(|l| &mut l.record)
    }

    /// Counts response body bytes handed to the codec.
    pub(crate) fn sent(&mut self, bytes: usize) {
        if let Some(log) = &mut self.log {
            log.record.bytes_sent += bytes as u64;
        }
    }

    /// The counter the request body adds to, when logging.
    fn received_counter(&self) -> Option<Rc<Cell<u64>>> {
        self.log.as_ref().map(|l| Rc::clone(&l.received))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.conn;
        conn.in_flight.set(conn.in_flight.get() - 1);
        let now = Instant::now();
        conn.last_active.set(now);
        let stats = &conn.listener.stats;
        stats.rq_active.dec();
        stats.rq_time.record_duration(now - self.started);
        if let Some(status) = self.status {
            stats.response(status);
        }
        if let (Some(mut pending), Some(log)) = (self.log.take(), &conn.listener.access_log) {
            pending.record.status = self.status;
            pending.record.bytes_received = pending.received.get();
            log.record(&pending.record, pending.wall_start, now - self.started);
            log.give_back(pending);
        }
    }
}

/// The codec settings of one listener, built once per worker.
pub(crate) struct Codecs {
    h1: http1::Builder,
    h2: http2::Builder<LocalExec>,
    idle_timeout: Duration,
    /// Idle time before an HTTP/1.1 codec is parked: [`PARK_AFTER`], or sooner when the
    /// header timeout is shorter, since hyper's header timer also runs between requests.
    park_after: Duration,
}

impl Codecs {
    /// The request-head limit the handler must check itself: hyper's HTTP/1.1 buffer only
    /// enforces it when the buffer limit is not larger. (HTTP/2 enforces it in the codec.)
    pub(crate) fn head_limit_to_check(listener: &crate::config::ListenerConfig) -> Option<usize> {
        let max_head = listener.http.max_request_headers_kb as usize * 1024;
        (Self::h1_buffer(listener) > max_head).then_some(max_head)
    }

    fn h1_buffer(listener: &crate::config::ListenerConfig) -> usize {
        let max_head = listener.http.max_request_headers_kb as usize * 1024;
        (listener.buffer_limit as usize).max(max_head).max(8192)
    }

    pub(crate) fn new(listener: &crate::config::ListenerConfig) -> Self {
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
        let mut h2 = http2::Builder::new(LocalExec);
        h2.max_concurrent_streams(listener.http.max_concurrent_streams)
            .max_header_list_size(max_head as u32)
            // Fixed windows: a client can send at most `limit` bytes per stream before the
            // upstream has taken them, and the connection window caps all streams together.
            .adaptive_window(false)
            .initial_stream_window_size(limit)
            .initial_connection_window_size(limit.max(65_535))
            .max_send_buf_size(limit as usize);
        Self {
            h1,
            h2,
            idle_timeout: listener.http.idle_timeout,
            park_after: PARK_AFTER.min(listener.http.request_headers_timeout / 2),
        }
    }
}

/// Serves `stream` until the client is done or, after `drain` turns true, until the requests
/// in flight are answered: HTTP/1.1 then closes with `connection: close`, HTTP/2 sends GOAWAY.
pub(crate) async fn serve(
    stream: TcpStream,
    ctx: Rc<ConnCtx>,
    codecs: Rc<Codecs>,
    mut drain: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let mut io = match &ctx.listener.tls {
        None => DownstreamIo::plain(stream),
        // Boxed: the handshake's state is large and over once it is done.
        Some(tls) => match Box::pin(tls.accept(stream)).await {
            Some(stream) => DownstreamIo::tls(stream),
            None => return,
        },
    };
    // ALPN, when it chose, says the protocol; otherwise the first bytes do.
    let sniffed = match io.alpn() {
        Some(b"h2") => Sniffed::Http2,
        Some(b"http/1.1") => Sniffed::Http1,
        _ => sniff(&mut io, &ctx, codecs.idle_timeout, &mut drain).await,
    };
    match sniffed {
        // Boxed: HTTP/2's connection state is large, and most connections are HTTP/1.1.
        Sniffed::Http2 => Box::pin(serve_h2(io, ctx, &codecs, drain)).await,
        Sniffed::Http1 => serve_h1(io, ctx, &codecs, drain).await,
        Sniffed::Closed => {
            let _ = io.shutdown().await;
        }
    }
}

enum Sniffed {
    Http1,
    Http2,
    Closed,
}

/// Tells HTTP/2 prior knowledge from HTTP/1.1 by its first bytes, which are kept for the
/// codec. Nothing is allocated while the client says nothing.
async fn sniff(
    io: &mut DownstreamIo,
    ctx: &ConnCtx,
    idle_timeout: Duration,
    drain: &mut watch::Receiver<bool>,
) -> Sniffed {
    let mut head = [0u8; H2_PREFACE.len()];
    let mut len = 0;
    let deadline = tokio::time::sleep(idle_timeout);
    tokio::pin!(deadline);
    loop {
        let read = tokio::select! {
            read = io.read(&mut head[len..]) => read,
            _ = drain.wait_for(|draining| *draining) => return Sniffed::Closed,
            _ = &mut deadline => {
                ctx.listener.stats.cx_idle_timeout.inc();
                return Sniffed::Closed;
            }
        };
        match read {
            Ok(0) | Err(_) => return Sniffed::Closed,
            Ok(n) => len += n,
        }
        let sniffed = if head[..len] != H2_PREFACE[..len] {
            Sniffed::Http1
        } else if len == H2_PREFACE.len() {
            Sniffed::Http2
        } else {
            continue;
        };
        io.set_prefix(&head[..len]);
        return sniffed;
    }
}

/// The per-connection service handed to the codec.
#[derive(Clone)]
struct ProxyService(Rc<ConnCtx>);

impl hyper::service::Service<http::Request<Incoming>> for ProxyService {
    type Response = http::Response<ResponseBody>;
    type Error = std::convert::Infallible;
    // Boxed so the codec can be taken apart when parked (that needs Unpin futures).
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>>>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let conn = &self.0;
        let served = conn.requests.get() + 1;
        conn.requests.set(served);
        if req.version() == http::Version::HTTP_2
            && conn.listener.max_requests_per_connection == Some(served)
        {
            // Counted here, when decided, so the count is there before the response is.
            conn.listener.stats.cx_max_requests.inc();
            conn.retire.notify_one();
        }
        let in_flight = InFlight::new(&self.0, &req);
        let req = req.map(|body| RequestBody::new(body, in_flight.received_counter()));
        Box::pin(handler::handle(req, Rc::clone(&self.0), in_flight))
    }
}

async fn serve_h1(
    mut io: DownstreamIo,
    ctx: Rc<ConnCtx>,
    codecs: &Codecs,
    mut drain: watch::Receiver<bool>,
) {
    loop {
        if !io.has_buffered() {
            // Parked: hold nothing but the socket until the client speaks, or idles out.
            let idle_until = ctx.last_active.get() + codecs.idle_timeout;
            tokio::select! {
                ready = io.tcp().readable() => if ready.is_err() { return },
                _ = drain.wait_for(|draining| *draining) => {
                    let _ = io.shutdown().await;
                    return;
                }
                _ = tokio::time::sleep_until(idle_until) => {
                    ctx.listener.stats.cx_idle_timeout.inc();
                    let _ = io.shutdown().await;
                    return;
                }
            }
        }
        // Boxed, so that the state of an active connection is not part of every connection's
        // task: a parked one costs only what the loop above needs.
        match Box::pin(serve_h1_until_idle(io, &ctx, codecs, &mut drain)).await {
            Some(parked) => io = parked,
            None => return,
        }
    }
}

/// Runs the HTTP/1.1 codec until the connection ends (`None`, the socket shut down) or has
/// been idle long enough to park (`Some`: the socket and any bytes already read).
async fn serve_h1_until_idle(
    io: DownstreamIo,
    ctx: &Rc<ConnCtx>,
    codecs: &Codecs,
    drain: &mut watch::Receiver<bool>,
) -> Option<DownstreamIo> {
    // Boxed: taking it apart on parking needs it Unpin.
    let mut conn = Box::pin(
        codecs
            .h1
            .serve_connection(TokioIo::new(io), ProxyService(Rc::clone(ctx))),
    );
    let mut parking = false;
    let mut closing_after_exchange = false;
    let mut draining = false;
    let park_after = codecs.park_after;
    let park_timer = tokio::time::sleep(park_after);
    tokio::pin!(park_timer);
    let result = loop {
        tokio::select! {
            result = poll_fn(|cx| conn.as_mut().poll_without_shutdown(cx)) => break result,
            _ = drain.wait_for(|draining| *draining), if !draining => {
                draining = true;
                parking = false;
                conn.as_mut().graceful_shutdown();
            }
            _ = &mut park_timer, if !parking && !draining => {
                let idle_since = ctx.last_active.get();
                if ctx.in_flight.get() == 0 && idle_since.elapsed() >= park_after {
                    tracing::trace!(peer = %ctx.peer, "parking idle connection");
                    conn.as_mut().graceful_shutdown();
                    // hyper stops at once only when it is idle between messages. If it
                    // is not (a head half read, a response still flushing), it has just
                    // switched keep-alive off and will finish that exchange and close:
                    // then the socket must close too, not be parked.
                    match poll_fn(|cx| Poll::Ready(conn.as_mut().poll_without_shutdown(cx))).await {
                        Poll::Ready(result) => {
                            parking = true;
                            break result;
                        }
                        Poll::Pending => {}
                    }
                    parking = true;
                    closing_after_exchange = true;
                } else {
                    park_timer.as_mut().reset(idle_since.max(Instant::now()) + park_after);
                }
            }
        }
    };
    let parts = (*Pin::into_inner(conn)).into_parts();
    let mut io = parts.io.into_inner();
    if let Err(err) = result {
        if err.is_timeout() {
            ctx.listener.stats.cx_headers_timeout.inc();
        }
        tracing::debug!(error = %err, "downstream connection ended with an error");
    } else if parking && !closing_after_exchange {
        tracing::trace!(peer = %ctx.peer, buffered = parts.read_buf.len(), "parked");
        io.set_prefix(&parts.read_buf);
        crate::memory::codec_released();
        return Some(io);
    }
    let _ = io.shutdown().await;
    None
}

async fn serve_h2(
    io: DownstreamIo,
    ctx: Rc<ConnCtx>,
    codecs: &Codecs,
    mut drain: watch::Receiver<bool>,
) {
    let conn = codecs
        .h2
        .serve_connection(TokioIo::new(io), ProxyService(Rc::clone(&ctx)));
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
