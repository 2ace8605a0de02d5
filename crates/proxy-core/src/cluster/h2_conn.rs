//! HTTP/2 to a host: one multiplexed connection per host and worker, opened by the first
//! request that needs it and replaced when it closes, has served its requests, or reaches
//! the cluster's `max_connection_duration`, or has had no stream for `idle_timeout`. A
//! retired connection takes no new stream and closes once its streams have ended.

use std::cell::{Cell, RefCell};
use std::pin::pin;
use std::rc::{Rc, Weak};

use http::Request;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::HostPool;
use super::host::SendError;
use super::settings::Expiry;
use crate::context::RequestBody;
use crate::error::ProxyError;
use config::UpstreamProtocol;

/// One host's HTTP/2 connection on one worker.
#[derive(Default)]
pub(super) struct H2Conn {
    /// Requests sent on the current connection.
    uses: Cell<u32>,
    /// The shared connection, if one is open.
    sender: RefCell<Option<http2::SendRequest<RequestBody>>>,
    /// Held while a connection is being made, so a burst of requests opens one.
    connecting: tokio::sync::Mutex<()>,
    /// When the last connect failed: requests that queued behind that attempt fail with it
    /// rather than each waiting out its own connect timeout in turn.
    failed_at: Cell<Option<Instant>>,
    /// The current connection's number, when it opened, its streams, and since when it has
    /// had none.
    generation: Cell<u64>,
    opened: Cell<Option<Instant>>,
    streams: Cell<u32>,
    idle_since: Cell<Option<Instant>>,
    /// Woken when the current connection's last stream ends (its idle time starts).
    went_idle: tokio::sync::Notify,
}

impl H2Conn {
    /// A stream of connection `generation` ended.
    pub(super) fn stream_ended(&self, generation: u64) {
        if self.generation.get() != generation {
            return;
        }
        let left = self.streams.get().saturating_sub(1);
        self.streams.set(left);
        if left == 0 {
            self.idle_since.set(Some(Instant::now()));
            self.went_idle.notify_one();
        }
    }

    /// Retires the current connection, if any: it takes no new stream and closes once its
    /// streams are done.
    pub(super) fn retire_current(&self) {
        self.sender.borrow_mut().take();
    }

    /// Retires connection `generation` if it is still the current one.
    fn retire(&self, generation: u64) -> bool {
        if self.generation.get() != generation {
            return false;
        }
        self.sender.borrow_mut().take().is_some()
    }
}

impl HostPool {
    /// Sends on the host's connection; with the response, the connection's number, whose
    /// stream count the request holds until [`H2Conn::stream_ended`].
    pub(super) async fn send_h2(
        self: &Rc<Self>,
        req: &mut Request<RequestBody>,
    ) -> Result<(http::response::Parts, Incoming, u64), SendError> {
        let mut sender = match self.h2_sender().await {
            Ok(sender) => sender,
            Err(error) => return Err(SendError::unsent(error)),
        };
        if let Some(max) = self.settings.max_requests {
            let uses = self.h2.uses.get() + 1;
            self.h2.uses.set(uses);
            if uses >= max {
                // The next request opens a new connection; this one ends once its streams do.
                *self.h2.sender.borrow_mut() = None;
                self.stats.cx_max_requests.inc();
            }
        }
        let generation = self.h2.generation.get();
        self.h2.streams.set(self.h2.streams.get() + 1);
        // Counted out if the send fails or is dropped; the request takes it over otherwise.
        let stream = OpenStream(&self.h2, generation);
        let mut req = std::mem::replace(req, Request::new(RequestBody::empty()));
        // The upstream's HPACK table may keep these values for the connection's life.
        h1::own_values(req.headers_mut());
        let response = sender
            .send_request(req)
            .await
            .map_err(|e| SendError::sent(ProxyError::from_upstream(self.addr, e)))?;
        std::mem::forget(stream);
        let (head, body) = response.into_parts();
        Ok((head, body, generation))
    }

    pub(super) async fn h2_sender(
        self: &Rc<Self>,
    ) -> Result<http2::SendRequest<RequestBody>, ProxyError> {
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
        let _connecting = self.h2.connecting.lock().await;
        // Someone else may have connected, or failed to, while this request waited.
        if let Some(sender) = self.live_h2() {
            return Ok(sender);
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
        let slot = match self.try_connection_slot() {
            Some(slot) => slot,
            None => {
                self.stats.cx_overflow.inc();
                // No connection to put back on HTTP/2: only a freed slot helps.
                self.wait_pending(false).await?;
                self.taken_connection_slot()
            }
        };
        let stream = match self.connect().await {
            Ok(stream) => stream,
            Err(err) => {
                self.h2.failed_at.set(Some(Instant::now()));
                return Err(err);
            }
        };
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
        let (sender, conn) = self
            .settings
            .h2
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ProxyError::from_upstream(self.addr, e))?;
        let generation = self.h2.generation.get() + 1;
        self.h2.generation.set(generation);
        let now = Instant::now();
        self.h2.opened.set(Some(now));
        self.h2.streams.set(0);
        self.h2.idle_since.set(Some(now));
        let timed =
            self.settings.idle_timeout.is_some() || self.settings.max_connection_duration.is_some();
        let pool = Rc::downgrade(self);
        self.spawn_connection(slot, async move {
            let mut conn = pin!(conn);
            if timed {
                tokio::select! {
                    _ = conn.as_mut() => return,
                    () = retire_when_due(pool, generation) => {}
                }
            }
            let _ = conn.await;
        });
        *self.h2.sender.borrow_mut() = Some(sender.clone());
        self.h2.uses.set(0);
        Ok(sender)
    }

    fn live_h2(&self) -> Option<http2::SendRequest<RequestBody>> {
        let mut slot = self.h2.sender.borrow_mut();
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

/// A stream counted on connection `.1` until dropped.
struct OpenStream<'a>(&'a H2Conn, u64);

impl Drop for OpenStream<'_> {
    fn drop(&mut self) {
        self.0.stream_ended(self.1);
    }
}

/// When connection `generation` of `pool` is due to retire: at its maximum duration, or
/// `idle_timeout` after its last stream ended while it has none. `Err(())`: the pool has gone
/// or moved on to another connection; `Ok(None)`: not until a stream ends.
fn due(pool: &Weak<HostPool>, generation: u64) -> Result<Option<(Instant, Expiry)>, ()> {
    let pool = pool.upgrade().ok_or(())?;
    let h2 = &pool.h2;
    if h2.generation.get() != generation || h2.sender.borrow().is_none() {
        return Err(());
    }
    let opened = h2.opened.get().ok_or(())?;
    let aged = pool
        .settings
        .max_connection_duration
        .map(|d| (opened + d, Expiry::MaxDuration));
    let idle = match (
        h2.streams.get(),
        h2.idle_since.get(),
        pool.settings.idle_timeout,
    ) {
        (0, Some(since), Some(timeout)) => Some((since + timeout, Expiry::Idle)),
        _ => None,
    };
    Ok(match (aged, idle) {
        (Some(a), Some(i)) => Some(if a.0 <= i.0 { a } else { i }),
        (a, i) => a.or(i),
    })
}

/// Waits until connection `generation` of `pool` is due (see [`due`]), then retires it (it
/// closes once its streams end). Returns at once if the pool has gone or moved on.
async fn retire_when_due(pool: Weak<HostPool>, generation: u64) {
    loop {
        let Ok(due) = due(&pool, generation) else {
            return;
        };
        // Woken by the last stream ending, to start (or restart) the idle count.
        let Some(held) = pool.upgrade() else {
            return;
        };
        let went_idle = held.h2.went_idle.notified();
        match due {
            Some((at, why)) if at <= Instant::now() => {
                if let Some(pool) = pool.upgrade()
                    && pool.h2.retire(generation)
                {
                    pool.count_expiry(why);
                }
                return;
            }
            Some((at, _)) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = went_idle => {}
                }
            }
            None => went_idle.await,
        }
        drop(held);
    }
}
