//! Per-worker, per-host upstream connections: a keep-alive pool for HTTP/1.1, one multiplexed
//! connection for HTTP/2. Nothing here is `Send`: each worker owns its pools.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use balancer::Picked;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::SharedCluster;
use super::breaker::{Overflow, Slot};
use super::health::{Ejection, TryOutcome};
use crate::catalog::{ClusterStats, HostStats};
use crate::config::UpstreamProtocol;
use crate::error::ProxyError;
use crate::exec::LocalExec;
use crate::http::body::RequestBody;
use crate::tls::UpstreamIo;
use tokio_util::either::Either;

/// Idle HTTP/1.1 connections kept per host per worker; more are closed when returned.
const MAX_IDLE_PER_HOST: usize = 1024;

/// How a worker talks to the hosts of one cluster: built once from the cluster's config.
pub(crate) struct UpstreamSettings {
    protocol: UpstreamProtocol,
    connect_timeout: Duration,
    /// Requests per connection before it is retired; `None`: no limit.
    max_requests: Option<u32>,
    buffer_limit: usize,
    h1: http1::Builder,
    h2: http2::Builder<LocalExec>,
    shared: Arc<SharedCluster>,
    /// Requests refused by a breaker since the last log line about it, and when that was.
    refused_unlogged: Cell<u64>,
    refused_logged_at: Cell<Option<Instant>>,
}

impl UpstreamSettings {
    pub(crate) fn new(cluster: &crate::config::ClusterConfig, shared: Arc<SharedCluster>) -> Self {
        let limit = cluster.buffer_limit;
        let mut h1 = http1::Builder::new();
        // The response head and body are read into this buffer; hyper needs at least 8 KiB.
        h1.max_buf_size((limit as usize).max(8192));
        let mut h2 = http2::Builder::new(LocalExec);
        h2.adaptive_window(false)
            .initial_stream_window_size(limit)
            // The connection window cannot start below HTTP/2's 64 KiB default.
            .initial_connection_window_size(limit.max(65_535))
            .max_send_buf_size(limit as usize);
        Self {
            protocol: cluster.protocol,
            connect_timeout: cluster.connect_timeout,
            max_requests: cluster.max_requests_per_connection,
            buffer_limit: limit as usize,
            h1,
            h2,
            shared,
            refused_unlogged: Cell::new(0),
            refused_logged_at: Cell::new(None),
        }
    }

    /// Logs a request refused by a breaker: a line a second per worker and cluster at most,
    /// with the count, since under overload a line per request would flood the log and slow
    /// the cheap path the breaker is there for. The access log still has every request.
    fn log_refused(&self, overflow: Overflow) {
        let refused = self.refused_unlogged.get() + 1;
        let now = Instant::now();
        if self
            .refused_logged_at
            .get()
            .is_some_and(|at| now - at < Duration::from_secs(1))
        {
            self.refused_unlogged.set(refused);
            return;
        }
        self.refused_logged_at.set(Some(now));
        self.refused_unlogged.set(0);
        tracing::warn!(
            flag = "UO",
            cluster = %self.shared.name,
            breaker = overflow.as_str(),
            refused,
            "circuit breaker open: requests refused with 503"
        );
    }
}

pub(crate) struct HostPool {
    /// Position in the cluster's host set.
    index: usize,
    stats: Rc<ClusterStats>,
    host_stats: HostStats,
    addr: SocketAddr,
    /// `addr` as text, for log lines.
    addr_text: http::HeaderValue,
    settings: Rc<UpstreamSettings>,
    /// HTTP/1.1 connections with no request in flight, most recently used last.
    idle: RefCell<Vec<H1Conn>>,
    /// Requests on this worker waiting for a connection to this host (`max_connections`).
    waiters: Cell<u32>,
    /// Woken when a connection is put back while requests wait.
    returned: tokio::sync::Notify,
    /// Requests sent on the current HTTP/2 connection.
    h2_uses: Cell<u32>,
    /// The shared HTTP/2 connection, if one is open.
    h2: RefCell<Option<http2::SendRequest<RequestBody>>>,
    /// Held while an HTTP/2 connection is being made, so a burst of requests opens one.
    h2_connecting: tokio::sync::Mutex<()>,
    /// When the last HTTP/2 connect failed: requests that queued behind that attempt fail
    /// with it rather than each waiting out its own connect timeout in turn.
    h2_failed_at: Cell<Option<Instant>>,
}

impl HostPool {
    pub(crate) fn new(
        index: usize,
        stats: Rc<ClusterStats>,
        host_stats: HostStats,
        addr: SocketAddr,
        settings: Rc<UpstreamSettings>,
    ) -> Self {
        Self {
            index,
            stats,
            host_stats,
            addr_text: http::HeaderValue::from_str(&addr.to_string())
                .expect("a socket address is valid header text"),
            addr,
            settings,
            idle: RefCell::new(Vec::new()),
            waiters: Cell::new(0),
            returned: tokio::sync::Notify::new(),
            h2_uses: Cell::new(0),
            h2: RefCell::new(None),
            h2_connecting: tokio::sync::Mutex::new(()),
            h2_failed_at: Cell::new(None),
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn addr_text(&self) -> &http::HeaderValue {
        &self.addr_text
    }

    pub(crate) fn protocol(&self) -> UpstreamProtocol {
        self.settings.protocol
    }

    pub(crate) fn stats(&self) -> &ClusterStats {
        &self.stats
    }

    pub(crate) fn shared(&self) -> &Arc<SharedCluster> {
        &self.settings.shared
    }

    /// The cluster's `per_connection_buffer_limit_bytes`.
    pub(crate) fn buffer_limit(&self) -> usize {
        self.settings.buffer_limit
    }

    /// Takes a `max_requests` slot for one try, before any work is spent on the request; a
    /// full breaker refuses it here (counted, and logged at most once a second).
    pub(crate) fn admit(&self) -> Result<Slot<'_>, ProxyError> {
        Slot::try_take(&self.settings.shared.breakers.requests).ok_or_else(|| {
            self.stats.rq_pending_overflow.inc();
            self.settings.log_refused(Overflow::Requests);
            ProxyError::Overflow(Overflow::Requests)
        })
    }

    /// Sends `req` and waits for the response head. The response body streams on; for
    /// HTTP/1.1 the connection returns to the pool when that body has been read to its end.
    /// A request refused or failed before any of it was sent comes back with the error.
    /// `admitted` is the slot [`HostPool::admit`] took; it is held until the response is done.
    pub(crate) async fn send(
        self: &Rc<Self>,
        req: Request<RequestBody>,
        picked: Picked,
        admitted: Slot<'_>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        // The request guard, which outlives this borrow, gives the slot back instead.
        admitted.hand_over();
        let request = UpstreamRequest::start(self, picked);
        let sent = match self.settings.protocol {
            UpstreamProtocol::Http1 => self.send_h1(req).await,
            UpstreamProtocol::Http2 => self.send_h2(req).await,
        };
        let outcome = match &sent {
            Ok((head, _, _)) => Some(TryOutcome::Status(head.status.as_u16())),
            // Not the host's doing: the breaker refused, or the client went away.
            Err(SendError {
                error: ProxyError::Overflow(_) | ProxyError::ClientAborted { .. },
                ..
            }) => None,
            Err(_) => Some(TryOutcome::NoResponse),
        };
        if let Some(outcome) = outcome {
            let shared = &self.settings.shared;
            match shared.health.report(&shared.host_set, self.index, outcome) {
                Ejection::None => {}
                Ejection::Ejected => self.stats.outlier_detection_ejections_enforced_total.inc(),
                Ejection::Overflow => self.stats.outlier_detection_ejections_overflow.inc(),
            }
        }
        let (head, body, pool_return) = sent?;
        self.stats.response(head.status);
        Ok(Response::from_parts(
            head,
            UpstreamBody {
                inner: body,
                ended: false,
                pool_return,
                _request: request,
            },
        ))
    }

    async fn send_h1(
        self: &Rc<Self>,
        mut req: Request<RequestBody>,
    ) -> Result<(http::response::Parts, Incoming, Option<PoolReturn>), SendError> {
        // A pooled connection may have been closed by the upstream while idle. If the request
        // was not written before that was noticed, hyper hands it back and it is sent on a
        // fresh connection instead. A fresh connection that fails is reported, so a dead host
        // cannot loop us.
        loop {
            let (mut conn, fresh) = match self.idle_h1().await {
                Some(conn) => (conn, false),
                // Boxed: connecting is rare, and its state would otherwise enlarge every
                // request's future.
                None => match Box::pin(self.connect_h1_within_limit()).await {
                    Ok(conn) => conn,
                    Err(error) => return Err(SendError::unsent(error, req)),
                },
            };
            match conn.sender.try_send_request(req).await {
                Ok(response) => {
                    conn.uses += 1;
                    let (head, body) = response.into_parts();
                    return Ok((head, body, Some(PoolReturn::new(self, conn))));
                }
                Err(mut err) => match err.take_message() {
                    Some(unsent) if !fresh => req = unsent,
                    Some(unsent) => {
                        let error = ProxyError::from_upstream(self.addr, err.into_error());
                        return Err(SendError::unsent(error, unsent));
                    }
                    None => {
                        return Err(SendError::sent(ProxyError::from_upstream(
                            self.addr,
                            err.into_error(),
                        )));
                    }
                },
            }
        }
    }

    /// A connection for a request that found none idle: a new one if `max_connections`
    /// allows, else (bounded by `max_pending_requests` and `pending_timeout`) one put back
    /// on this worker or a slot freed anywhere. `(conn, fresh)`.
    async fn connect_h1_within_limit(self: &Rc<Self>) -> Result<(H1Conn, bool), ProxyError> {
        let breakers = &self.settings.shared.breakers;
        if !breakers.connections.try_acquire() {
            self.stats.cx_overflow.inc();
            // `None`: a connection slot is ours.
            if let Some(conn) = self.wait_pending().await? {
                return Ok((conn, false));
            }
        }
        self.stats.rq_pending_active.inc();
        let connected = self.connect_h1().await;
        self.stats.rq_pending_active.dec();
        match connected {
            Ok(sender) => Ok((H1Conn { sender, uses: 0 }, true)),
            Err(error) => {
                breakers.connection_closed();
                Err(error)
            }
        }
    }

    /// Waits in the cluster's pending queue until a connection to this host is put back on
    /// this worker (`Some`) or a connection slot is taken for this request (`None`).
    async fn wait_pending(&self) -> Result<Option<H1Conn>, ProxyError> {
        let breakers = &self.settings.shared.breakers;
        let Some(_pending) = Slot::try_take(&breakers.pending) else {
            self.stats.rq_pending_overflow.inc();
            self.settings.log_refused(Overflow::Pending);
            return Err(ProxyError::Overflow(Overflow::Pending));
        };
        self.stats.rq_pending_total.inc();
        self.stats.rq_pending_active.inc();
        self.waiters.set(self.waiters.get() + 1);
        let started = Instant::now();
        let deadline = tokio::time::sleep(breakers.pending_timeout);
        tokio::pin!(deadline);
        let outcome = loop {
            // Registered before looking, so a wake-up between the look and the wait is kept.
            let returned = self.returned.notified();
            let freed = breakers.connection_freed.notified();
            tokio::pin!(returned, freed);
            returned.as_mut().enable();
            freed.as_mut().enable();
            if self.settings.protocol == UpstreamProtocol::Http1
                && let Some(conn) = self.idle_h1().await
            {
                break Ok(Some(conn));
            }
            if breakers.connections.try_acquire() {
                break Ok(None);
            }
            tokio::select! {
                () = &mut returned => {}
                () = &mut freed => {}
                () = &mut deadline => {
                    self.stats.rq_pending_timeout.inc();
                    self.settings.log_refused(Overflow::PendingTimeout);
                    break Err(ProxyError::Overflow(Overflow::PendingTimeout));
                }
            }
        };
        self.waiters.set(self.waiters.get() - 1);
        self.stats.rq_pending_active.dec();
        self.stats
            .rq_pending_time
            .record_duration(started.elapsed());
        outcome
    }

    /// The most recently used idle connection that is still open and ready.
    async fn idle_h1(&self) -> Option<H1Conn> {
        loop {
            let mut conn = self.idle.borrow_mut().pop()?;
            if conn.sender.is_closed() {
                continue;
            }
            // Returned connections are normally ready at once; waiting covers the moment
            // between a body's end and the connection task noticing it.
            if conn.sender.ready().await.is_ok() {
                return Some(conn);
            }
        }
    }

    /// A new connection to the host, with the TLS handshake done if the cluster uses TLS;
    /// both within the connect timeout.
    async fn connect(&self) -> Result<UpstreamIo, ProxyError> {
        let addr = self.addr;
        let started = Instant::now();
        let timeout = self.settings.connect_timeout;
        let connected = tokio::time::timeout(timeout, async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|source| ProxyError::ConnectFailure { addr, source })?;
            // Requests and responses are written whole; Nagle would only add latency.
            let _ = stream.set_nodelay(true);
            let Some(tls) = &self.settings.shared.tls else {
                return Ok(Either::Left(stream));
            };
            match tls.connect(addr, stream).await {
                Ok(stream) => {
                    self.stats.ssl_handshake.inc();
                    Ok(Either::Right(Box::new(stream)))
                }
                Err(source) => {
                    self.stats.ssl_connection_error.inc();
                    Err(ProxyError::UpstreamTls { addr, source })
                }
            }
        })
        .await;
        match connected {
            Err(_) => {
                self.stats.cx_connect_timeout.inc();
                Err(ProxyError::ConnectTimeout {
                    addr,
                    after: timeout,
                })
            }
            Ok(Err(error)) => {
                self.stats.cx_connect_fail.inc();
                Err(error)
            }
            Ok(Ok(stream)) => {
                self.stats
                    .cx_connect_time
                    .record_duration(started.elapsed());
                Ok(stream)
            }
        }
    }

    /// Connects, holding a connection slot the caller took; on failure the caller gives it
    /// back.
    async fn connect_h1(self: &Rc<Self>) -> Result<http1::SendRequest<RequestBody>, ProxyError> {
        let stream = self.connect().await?;
        let (sender, conn) = self
            .settings
            .h1
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ProxyError::from_upstream(self.addr, e))?;
        self.spawn_connection(async move {
            // Errors here surface on the request that was using the connection.
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// Drives an upstream connection on this worker, counting it while it is open. It holds
    /// a `max_connections` slot, given back when it closes.
    fn spawn_connection(self: &Rc<Self>, conn: impl Future<Output = ()> + 'static) {
        self.stats.cx_total.inc();
        self.stats.cx_active.inc();
        self.host_stats.cx_active.inc();
        let pool = Rc::clone(self);
        tokio::task::spawn_local(async move {
            conn.await;
            pool.stats.cx_active.dec();
            pool.host_stats.cx_active.dec();
            pool.settings.shared.breakers.connection_closed();
        });
    }

    fn put_back(&self, conn: H1Conn) {
        if self
            .settings
            .max_requests
            .is_some_and(|max| conn.uses >= max)
        {
            // Retired: dropping the sender closes the connection.
            self.stats.cx_max_requests.inc();
            return;
        }
        if conn.sender.is_closed() {
            return;
        }
        if self.waiters.get() == 0 && self.settings.shared.breakers.pending.active() > 0 {
            // Requests wait for a connection slot elsewhere (another worker or host) and none
            // here: closing this idle connection frees its slot for them.
            return;
        }
        let mut idle = self.idle.borrow_mut();
        if idle.len() < MAX_IDLE_PER_HOST {
            idle.push(conn);
            drop(idle);
            if self.waiters.get() > 0 {
                self.returned.notify_one();
            }
        }
    }

    async fn send_h2(
        self: &Rc<Self>,
        req: Request<RequestBody>,
    ) -> Result<(http::response::Parts, Incoming, Option<PoolReturn>), SendError> {
        let mut sender = match self.h2_sender().await {
            Ok(sender) => sender,
            Err(error) => return Err(SendError::unsent(error, req)),
        };
        if let Some(max) = self.settings.max_requests {
            let uses = self.h2_uses.get() + 1;
            self.h2_uses.set(uses);
            if uses >= max {
                // The next request opens a new connection; this one ends once its streams do.
                *self.h2.borrow_mut() = None;
                self.stats.cx_max_requests.inc();
            }
        }
        let response = sender
            .send_request(req)
            .await
            .map_err(|e| SendError::sent(ProxyError::from_upstream(self.addr, e)))?;
        let (head, body) = response.into_parts();
        Ok((head, body, None))
    }

    async fn h2_sender(self: &Rc<Self>) -> Result<http2::SendRequest<RequestBody>, ProxyError> {
        if let Some(sender) = self.live_h2() {
            return Ok(sender);
        }
        // Boxed: connecting is rare, and its state would otherwise enlarge every request's
        // future.
        self.stats.rq_pending_active.inc();
        let connected = Box::pin(self.connect_h2()).await;
        self.stats.rq_pending_active.dec();
        connected
    }

    async fn connect_h2(self: &Rc<Self>) -> Result<http2::SendRequest<RequestBody>, ProxyError> {
        let queued_at = Instant::now();
        let _connecting = self.h2_connecting.lock().await;
        // Someone else may have connected, or failed to, while this request waited.
        if let Some(sender) = self.live_h2() {
            return Ok(sender);
        }
        if self.h2_failed_at.get().is_some_and(|t| t >= queued_at) {
            return Err(ProxyError::ConnectFailure {
                addr: self.addr,
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the connect attempt this request waited for failed",
                ),
            });
        }
        let breakers = &self.settings.shared.breakers;
        if !breakers.connections.try_acquire() {
            self.stats.cx_overflow.inc();
            // No connection to put back on HTTP/2: only a freed slot helps.
            self.wait_pending().await?;
        }
        let stream = match self.connect().await {
            Ok(stream) => stream,
            Err(err) => {
                breakers.connection_closed();
                self.h2_failed_at.set(Some(Instant::now()));
                return Err(err);
            }
        };
        let (sender, conn) = match self.settings.h2.handshake(TokioIo::new(stream)).await {
            Ok(handshake) => handshake,
            Err(e) => {
                breakers.connection_closed();
                return Err(ProxyError::from_upstream(self.addr, e));
            }
        };
        self.spawn_connection(async move {
            let _ = conn.await;
        });
        *self.h2.borrow_mut() = Some(sender.clone());
        self.h2_uses.set(0);
        Ok(sender)
    }

    fn live_h2(&self) -> Option<http2::SendRequest<RequestBody>> {
        let mut slot = self.h2.borrow_mut();
        match slot.as_ref() {
            Some(sender) if !sender.is_closed() => Some(sender.clone()),
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }
}

/// Why a request got no response, and the request itself when none of it was sent (so it
/// can be tried again as it is).
pub(crate) struct SendError {
    pub(crate) error: ProxyError,
    pub(crate) unsent: Option<Request<RequestBody>>,
}

impl SendError {
    fn unsent(error: ProxyError, req: Request<RequestBody>) -> Self {
        Self {
            error,
            unsent: Some(req),
        }
    }

    fn sent(error: ProxyError) -> Self {
        Self {
            error,
            unsent: None,
        }
    }
}

/// A pooled HTTP/1.1 connection and the requests it has carried.
pub(crate) struct H1Conn {
    sender: http1::SendRequest<RequestBody>,
    uses: u32,
}

/// An HTTP/1.1 connection to hand back to its pool once the response body is done.
pub(crate) struct PoolReturn {
    pool: Rc<HostPool>,
    conn: H1Conn,
}

impl PoolReturn {
    fn new(pool: &Rc<HostPool>, conn: H1Conn) -> Self {
        Self {
            pool: Rc::clone(pool),
            conn,
        }
    }
}

/// A response body from an upstream. When it has been read to the end, its HTTP/1.1
/// connection goes back to the pool; dropped earlier, the connection is closed, since the rest
/// of the response would still be on the wire.
pub struct UpstreamBody {
    inner: Incoming,
    ended: bool,
    pool_return: Option<PoolReturn>,
    _request: UpstreamRequest,
}

/// Counts an upstream request as active, and times it, from sending until its response body
/// is done with (or the attempt failed).
struct UpstreamRequest {
    pool: Rc<HostPool>,
    started: Instant,
    /// The balancer's in-flight mark on the host, released with the request.
    _picked: Picked,
}

impl UpstreamRequest {
    fn start(pool: &Rc<HostPool>, picked: Picked) -> Self {
        pool.stats.rq_total.inc();
        pool.stats.rq_active.inc();
        pool.host_stats.rq_active.inc();
        Self {
            pool: Rc::clone(pool),
            started: Instant::now(),
            _picked: picked,
        }
    }
}

impl Drop for UpstreamRequest {
    fn drop(&mut self) {
        // The `max_requests` slot handed over in `send`.
        self.pool.settings.shared.breakers.requests.release();
        self.pool.stats.rq_active.dec();
        self.pool.host_stats.rq_active.dec();
        self.pool
            .stats
            .rq_time
            .record_duration(self.started.elapsed());
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.ended = true;
        }
        polled
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        let Some(PoolReturn { pool, mut conn }) = self.pool_return.take() else {
            return;
        };
        if !(self.ended || self.inner.is_end_stream()) {
            return;
        }
        if conn.sender.is_ready() {
            pool.put_back(conn);
        } else {
            // The response is complete but the exchange is not: the upstream answered before
            // the request body was fully sent (an early 4xx), or the connection task has not
            // caught up yet. Pool it only once it can take a new request, so no request
            // waits behind an upload.
            tokio::task::spawn_local(async move {
                if conn.sender.ready().await.is_ok() {
                    pool.put_back(conn);
                }
            });
        }
    }
}
