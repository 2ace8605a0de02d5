//! HTTP/2 to a host: multiplexed connections per host and worker, opened by the first request
//! that needs one. A connection takes streams up to the cluster's `max_concurrent_streams`;
//! past that another is opened (one connection when the cluster sets no limit). A connection
//! is replaced when it closes, has served its requests, reaches the cluster's
//! `max_connection_duration`, or has had no stream for `idle_timeout` (or, for a new stream,
//! for the keep-alive's `connection_idle_interval`). A retired connection takes no new stream
//! and closes once its streams have ended.

use std::cell::{Cell, RefCell};
use std::pin::{Pin, pin};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::HostPool;
use super::health::Counters;
use super::host::SendError;
use super::settings::Expiry;
use crate::context::RequestBody;
use crate::error::ProxyError;
use config::UpstreamProtocol;

/// One host's HTTP/2 connections on one worker.
#[derive(Default)]
pub(super) struct H2Conns {
    /// The connections taking new streams, oldest first: a request goes on the first with
    /// room, as Envoy's pool fills one connection before the next.
    open: RefCell<Vec<Rc<H2Conn>>>,
    /// Held while a connection is being made, so a burst of requests opens one.
    connecting: tokio::sync::Mutex<()>,
    /// When the last connect failed: requests that queued behind that attempt fail with it
    /// rather than each waiting out its own connect timeout in turn.
    failed_at: Cell<Option<Instant>>,
    /// Woken once per stream ended (with a stream limit), for requests waiting for room, and
    /// when a connection opens.
    pub(super) room: Notify,
    /// Streams open on all of them, retired ones too.
    streams: Cell<u32>,
}

/// One HTTP/2 connection to a host.
pub(super) struct H2Conn {
    sender: http2::SendRequest<RequestBody>,
    opened: Instant,
    /// Requests sent on it.
    uses: Cell<u32>,
    /// Streams open on it, and since when it has had none.
    streams: Cell<u32>,
    idle_since: Cell<Instant>,
    /// Woken when its last stream ends (its idle time starts) or it is retired. Its own
    /// allocation, so the connection's timer can wait on it without holding the sender.
    went_idle: Rc<Notify>,
    /// Cuts the connection's socket: every stream on it fails, and it closes at once.
    cut: Rc<Cut>,
    /// The host's failure count when it was opened: once the host fails again, it takes no
    /// new stream (Envoy drains a failed host's pools).
    failures_at_open: u32,
}

impl H2Conns {
    /// The first open connection with room for a stream, dropping those that have closed
    /// and retiring those idle past `idle_limit` or opened before the host's latest failure
    /// (`failures` now).
    pub(super) fn ready(
        &self,
        max_streams: u32,
        idle_limit: Option<Duration>,
        failures: u32,
    ) -> Option<Rc<H2Conn>> {
        let mut open = self.open.borrow_mut();
        let mut found = None;
        let now = idle_limit.map(|_| Instant::now());
        open.retain(|conn| {
            if conn.sender.is_closed() {
                return false;
            }
            if conn.failures_at_open != failures {
                // Drained: the host has failed since it was opened.
                conn.went_idle.notify_one();
                return false;
            }
            if let (Some(limit), Some(now)) = (idle_limit, now)
                && conn.streams.get() == 0
                && now.saturating_duration_since(conn.idle_since.get()) >= limit
            {
                // Idle too long to trust without a PING: a fresh connection takes the stream.
                conn.went_idle.notify_one();
                return false;
            }
            if found.is_none() && conn.streams.get() < max_streams {
                found = Some(Rc::clone(conn));
            }
            true
        });
        found
    }

    /// A stream of `conn` ended.
    pub(super) fn stream_ended(&self, conn: &H2Conn, max_streams: u32) {
        self.streams.set(self.streams.get().saturating_sub(1));
        let left = conn.streams.get().saturating_sub(1);
        conn.streams.set(left);
        if left == 0 {
            conn.idle_since.set(Instant::now());
            conn.went_idle.notify_one();
        }
        if max_streams != u32::MAX {
            // A request waiting for room (every connection full) may take this stream: one
            // wake-up per stream freed.
            self.room.notify_one();
        }
    }

    /// Retires every connection: each takes no new stream and closes once its streams are
    /// done.
    pub(super) fn retire_all(&self) {
        for conn in self.open.borrow_mut().drain(..) {
            conn.went_idle.notify_one();
        }
    }

    /// Retires `conn` if it is still taking streams.
    fn retire(&self, conn: &H2Conn) -> bool {
        let mut open = self.open.borrow_mut();
        let Some(at) = open.iter().position(|c| std::ptr::eq(&**c, conn)) else {
            return false;
        };
        open.remove(at).went_idle.notify_one();
        true
    }

    /// The streams these connections can carry, as Envoy counts a pool's capacity: the
    /// streams open, and the room left on those taking more and on `connecting` ones being
    /// opened.
    pub(super) fn capacity(&self, max_streams: u32, connecting: u32) -> f64 {
        let max = f64::from(max_streams);
        let room: f64 = (self.open.borrow().iter())
            .map(|c| (max - f64::from(c.streams.get())).max(0.0))
            .sum();
        f64::from(self.streams.get()) + room + f64::from(connecting) * max
    }

    fn holds(&self, conn: &H2Conn) -> bool {
        self.open.borrow().iter().any(|c| std::ptr::eq(&**c, conn))
    }
}

impl HostPool {
    /// Sends on one of the host's connections; with the response, the connection, whose
    /// stream count the request holds until [`H2Conns::stream_ended`].
    pub(super) async fn send_h2(
        self: &Rc<Self>,
        req: &mut Request<RequestBody>,
    ) -> Result<(http::response::Parts, Incoming, Rc<H2Conn>), SendError> {
        let conn = match self.h2_conn().await {
            Ok(conn) => conn,
            Err(error) => return Err(SendError::unsent(error)),
        };
        if let Some(max) = self.settings.max_requests {
            let uses = conn.uses.get() + 1;
            conn.uses.set(uses);
            if uses >= max {
                // The next request opens a new connection; this one ends once its streams do.
                self.h2.retire(&conn);
                self.stats.cx_max_requests.inc();
            }
        }
        conn.streams.set(conn.streams.get() + 1);
        self.h2.streams.set(self.h2.streams.get() + 1);
        // Counted out if the send fails or is dropped; the request takes it over otherwise.
        let stream = OpenStream(self, &conn);
        let mut req = std::mem::replace(req, Request::new(RequestBody::empty()));
        // The upstream's HPACK table may keep these values for the connection's life.
        h1::own_values(req.headers_mut());
        let response = conn.sender.clone().send_request(req).await.map_err(|e| {
            self.h2_stream_failed(&conn, &e);
            SendError::sent(ProxyError::from_upstream(self.addr, e))
        })?;
        std::mem::forget(stream);
        let (head, body) = response.into_parts();
        Ok((head, body, conn))
    }

    /// A connection with room for a stream, opened if none has.
    pub(super) async fn h2_conn(self: &Rc<Self>) -> Result<Rc<H2Conn>, ProxyError> {
        if let Some(conn) = self.ready_h2() {
            self.preconnect(super::preconnect::Ahead::Http2);
            return Ok(conn);
        }
        // Boxed: connecting is rare, and its state would otherwise enlarge every request's
        // future.
        Box::pin(self.connect_h2()).await
    }

    fn ready_h2(&self) -> Option<Rc<H2Conn>> {
        let settings = &self.settings;
        let failures = self.health.health_failures();
        (self.h2).ready(settings.h2_max_streams, settings.h2_idle_limit, failures)
    }

    /// Counts a stream of `conn` out.
    pub(super) fn h2_stream_ended(&self, conn: &H2Conn) {
        self.h2.stream_ended(conn, self.settings.h2_max_streams);
    }

    /// A stream of `conn` failed with `error`: if the host sent a malformed message, Envoy's
    /// default closes the whole connection (`stream_error_on_invalid_http_message: false`),
    /// its other streams with it.
    pub(super) fn h2_stream_failed(&self, conn: &H2Conn, error: &hyper::Error) {
        if self.settings.h2_stream_error_only || !malformed_by_host(error) {
            return;
        }
        tracing::debug!(host = %self.addr, "malformed HTTP/2 message: closing the connection");
        self.h2.retire(conn);
        conn.cut.sever();
    }

    async fn connect_h2(self: &Rc<Self>) -> Result<Rc<H2Conn>, ProxyError> {
        let queued_at = Instant::now();
        let mut pending = Some(self.pending());
        let mut connecting = Some(self.h2.connecting.lock().await);
        // Someone else may have connected, or failed to, while this request waited. While a
        // connection opened ahead (`preconnect`) is on its way, its streams serve this request
        // rather than another connection, as in Envoy's pool.
        loop {
            let room = self.h2.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if let Some(conn) = self.ready_h2() {
                self.preconnect(super::preconnect::Ahead::Http2);
                return Ok(conn);
            }
            if self.opening.get() == 0 {
                break;
            }
            room.await;
        }
        if self.h2.failed_at.get().is_some_and(|t| t >= queued_at) {
            return Err(ProxyError::ConnectFailure {
                addr: self.addr,
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the connect attempt this request waited for failed",
                ),
            });
        }
        let _claim = self.claim_pool_slot()?;
        let slot = match self.try_connection_slot() {
            Some(slot) => slot,
            None => {
                self.stats.cx_overflow.inc();
                // A stream freed on a full connection serves as well as a freed slot. The
                // pending queue counts the request while it waits there, with its own limit
                // and timeout: the connect lock is let go, so every waiter is in that queue.
                drop((pending.take(), connecting.take()));
                match (self.wait_pending(&self.h2.room, None, |pool| pool.ready_h2())).await? {
                    Some(conn) => return Ok(conn),
                    None => {
                        pending = Some(self.pending());
                        self.taken_connection_slot()
                    }
                }
            }
        };
        // Counted as being opened before more are opened ahead beside it.
        let opening = self.opening();
        self.preconnect(super::preconnect::Ahead::Http2);
        let conn = self.open_h2(slot, opening).await;
        if conn.is_err() {
            self.h2.failed_at.set(Some(Instant::now()));
        }
        drop((pending, connecting));
        conn
    }

    /// Opens a connection on a slot the caller took, for the requests to come: it joins the
    /// open ones, and requests waiting for room are woken.
    pub(super) async fn open_h2(
        self: &Rc<Self>,
        slot: super::connect::ConnectionSlot,
        _opening: super::preconnect::Opening,
    ) -> Result<Rc<H2Conn>, ProxyError> {
        // Taken before connecting: a failure while it connects drains it too.
        let failures_at_open = self.health.health_failures();
        let stream = self.connect().await?;
        if self.settings.protocol == UpstreamProtocol::Downstream
            && let tokio_util::either::Either::Right(tls) = &stream
            && tls.get_ref().1.alpn_protocol() != Some(b"h2")
        {
            // A request that came over HTTP/2 goes over HTTP/2: a host that will not speak it
            // fails the try.
            return Err(ProxyError::ConnectFailure {
                addr: self.addr,
                source: std::io::Error::other("the host did not choose h2 by ALPN"),
            });
        }
        if self.settings.protocol == UpstreamProtocol::Auto {
            let chose_h2 = match &stream {
                tokio_util::either::Either::Right(tls) => {
                    tls.get_ref().1.alpn_protocol() == Some(b"h2")
                }
                tokio_util::either::Either::Left(_) => false,
            };
            self.learned.set(Some(if chose_h2 {
                UpstreamProtocol::Http2
            } else {
                UpstreamProtocol::Http1
            }));
            if !chose_h2 {
                // The connection is dropped (its slot with it); the caller sees the host's
                // choice in `learned` and sends over HTTP/1.1 instead of failing.
                return Err(ProxyError::ConnectFailure {
                    addr: self.addr,
                    source: std::io::Error::other("the host chose HTTP/1.1 by ALPN"),
                });
            }
        }
        let cut = Rc::new(Cut::default());
        let stream = TokioIo::new(Severable {
            io: stream,
            cut: Rc::clone(&cut),
        });
        let handshake = match self.settings.h2_ping {
            None => self.settings.h2.handshake(stream).await,
            Some((interval, jitter)) => {
                // Drawn once per connection, so connections opened together do not PING
                // together.
                let mut builder = self.settings.h2.clone();
                builder.keep_alive_interval(jittered(interval, jitter));
                builder.handshake(stream).await
            }
        };
        let (sender, conn) = handshake.map_err(|e| ProxyError::from_upstream(self.addr, e))?;
        let now = Instant::now();
        let h2 = Rc::new(H2Conn {
            sender,
            opened: now,
            uses: Cell::new(0),
            streams: Cell::new(0),
            idle_since: Cell::new(now),
            went_idle: Rc::new(Notify::new()),
            cut,
            failures_at_open,
        });
        let pool = Rc::downgrade(self);
        let watched = Rc::downgrade(&h2);
        let went_idle = Rc::clone(&h2.went_idle);
        let host = Arc::clone(&self.health);
        self.spawn_connection(slot, async move {
            let mut conn = pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                () = retire_when_due(pool, watched, went_idle, host) => {}
            }
            let _ = conn.await;
        });
        self.h2.open.borrow_mut().push(Rc::clone(&h2));
        // Requests in the pending queue may take streams on it.
        self.h2.room.notify_waiters();
        Ok(h2)
    }
}

/// An HTTP/2 connection's socket, which the proxy can cut: from then on reads and writes
/// fail, so the codec ends the connection, and every stream on it, at once (hyper drives the
/// connection in a task of its own, which nothing else could stop).
struct Severable {
    io: crate::tls::UpstreamIo,
    cut: Rc<Cut>,
}

/// Whether a [`Severable`] socket is cut, and the waker of its last read, woken by the cut.
#[derive(Default)]
struct Cut {
    done: Cell<bool>,
    reader: RefCell<Option<std::task::Waker>>,
}

impl Cut {
    fn sever(&self) {
        self.done.set(true);
        if let Some(reader) = self.reader.borrow_mut().take() {
            reader.wake();
        }
    }

    fn check(&self) -> std::io::Result<()> {
        if self.done.get() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the connection was closed for a malformed message",
            ));
        }
        Ok(())
    }
}

impl tokio::io::AsyncRead for Severable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.cut.check()?;
        {
            let mut reader = self.cut.reader.borrow_mut();
            if !reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *reader = Some(cx.waker().clone());
            }
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Severable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.cut.check()?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.cut.check()?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.cut.check()?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Whether `error` is the codec's reset of a stream for a malformed message from the host
/// (a `PROTOCOL_ERROR` it raised itself, not one the host sent).
fn malformed_by_host(error: &hyper::Error) -> bool {
    let mut cause = std::error::Error::source(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_reset()
                && h2.is_library()
                && h2.reason() == Some(h2::Reason::PROTOCOL_ERROR);
        }
        cause = e.source();
    }
    false
}

/// `interval` plus up to `share` of it, drawn at random.
fn jittered(interval: Duration, share: f64) -> Duration {
    let drawn = (crate::random::next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    interval.mul_f64(1.0 + share * drawn)
}

/// A stream counted on a connection until dropped.
struct OpenStream<'a>(&'a HostPool, &'a H2Conn);

impl Drop for OpenStream<'_> {
    fn drop(&mut self) {
        self.0.h2_stream_ended(self.1);
    }
}

/// When `conn` is due to retire: at its maximum duration, or `idle_timeout` after its last
/// stream ended while it has none. `Err(())`: the pool or the connection has gone, or it
/// is retired already; `Ok(None)`: not until a stream ends.
fn due(pool: &Weak<HostPool>, conn: &Weak<H2Conn>) -> Result<Option<(Instant, Expiry)>, ()> {
    let pool = pool.upgrade().ok_or(())?;
    let conn = conn.upgrade().ok_or(())?;
    if !pool.h2.holds(&conn) {
        return Err(());
    }
    let aged = pool
        .settings
        .max_connection_duration
        .map(|d| (conn.opened + d, Expiry::MaxDuration));
    let idle = match (conn.streams.get(), pool.settings.idle_timeout) {
        (0, Some(timeout)) => Some((conn.idle_since.get() + timeout, Expiry::Idle)),
        _ => None,
    };
    Ok(match (aged, idle) {
        (Some(a), Some(i)) => Some(if a.0 <= i.0 { a } else { i }),
        (a, i) => a.or(i),
    })
}

/// Waits until `conn` is due (see [`due`]), or its host has failed since it was opened (a
/// drain: an idle connection closes at once), then retires it (it closes once its streams
/// end). Returns at once if the pool or the connection has gone or it was retired. Holds the
/// connection only weakly, so that a retired one closes when its last stream ends.
async fn retire_when_due(
    pool: Weak<HostPool>,
    conn: Weak<H2Conn>,
    went_idle: Rc<Notify>,
    host: Arc<Counters>,
) {
    // Registered before the first look, so a failure between a look and the wait is kept;
    // made again only once it has fired.
    let mut failed = pin!(host.failed.notified());
    failed.as_mut().enable();
    loop {
        let woken = went_idle.notified();
        let Ok(due) = due(&pool, &conn) else {
            return;
        };
        if let (Some(pool), Some(conn)) = (pool.upgrade(), conn.upgrade())
            && conn.failures_at_open != pool.health.health_failures()
        {
            pool.h2.retire(&conn);
            return;
        }
        let fired = match due {
            Some((at, why)) if at <= Instant::now() => {
                if let (Some(pool), Some(conn)) = (pool.upgrade(), conn.upgrade())
                    && pool.h2.retire(&conn)
                {
                    pool.count_expiry(why);
                }
                return;
            }
            Some((at, _)) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => false,
                    () = woken => false,
                    () = failed.as_mut() => true,
                }
            }
            None => {
                tokio::select! {
                    () = woken => false,
                    () = failed.as_mut() => true,
                }
            }
        };
        if fired {
            failed.set(host.failed.notified());
            failed.as_mut().enable();
        }
    }
}
