//! HTTP/1.1 to a host: a keep-alive pool of connections per host and worker, each carrying
//! one request at a time.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use http::Request;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use super::HostPool;
use super::connect::ConnectionSlot;
use super::host::SendError;
use crate::context::RequestBody;
use crate::error::ProxyError;

/// Idle HTTP/1.1 connections kept per host per worker; more are closed when returned.
const MAX_IDLE_PER_HOST: usize = 1024;

/// One host's HTTP/1.1 connections on one worker.
#[derive(Default)]
pub(super) struct H1Pool {
    /// Connections with no request in flight, most recently used last.
    idle: RefCell<Vec<H1Conn>>,
    /// Requests on this worker waiting for a connection to this host (`max_connections`).
    pub(super) waiters: Cell<u32>,
    /// Woken when a connection is put back while requests wait.
    pub(super) returned: tokio::sync::Notify,
}

/// A pooled HTTP/1.1 connection and the requests it has carried.
pub(super) struct H1Conn {
    sender: http1::SendRequest<RequestBody>,
    uses: u32,
}

/// An HTTP/1.1 connection to hand back to its pool once the response body is done.
pub(super) struct PoolReturn {
    pool: Rc<HostPool>,
    conn: H1Conn,
}

impl PoolReturn {
    /// The response body was dropped; `complete` if it had been read to its end.
    pub(super) fn body_done(self, complete: bool) {
        let PoolReturn { pool, mut conn } = self;
        if !complete {
            // The rest of the response is still on the wire: the connection closes.
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

/// What makes a response's length ambiguous, if anything: a client (or a cache between)
/// could frame it differently from the way it was read here (RFC 9112 section 6.3).
pub(super) fn framing_conflict(headers: &http::HeaderMap) -> Option<&'static str> {
    use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
    (headers.contains_key(CONTENT_LENGTH) && headers.contains_key(TRANSFER_ENCODING))
        .then_some("both content-length and transfer-encoding")
}

impl HostPool {
    pub(super) async fn send_h1(
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
                    if let Some(what) = framing_conflict(response.headers()) {
                        // Dropped unread with its connection: nothing more is read from
                        // an upstream whose framing cannot be trusted.
                        return Err(SendError::sent(ProxyError::UpstreamFraming {
                            addr: self.addr,
                            what,
                        }));
                    }
                    conn.uses += 1;
                    let (head, body) = response.into_parts();
                    let pool_return = PoolReturn {
                        pool: Rc::clone(self),
                        conn,
                    };
                    return Ok((head, body, Some(pool_return)));
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
        let slot = match self.try_connection_slot() {
            Some(slot) => slot,
            None => {
                self.stats.cx_overflow.inc();
                match self.wait_pending().await? {
                    Some(conn) => return Ok((conn, false)),
                    // `None`: a connection slot is ours.
                    None => self.taken_connection_slot(),
                }
            }
        };
        self.stats.rq_pending_active.inc();
        let connected = self.connect_h1(slot).await;
        self.stats.rq_pending_active.dec();
        let sender = connected?;
        Ok((H1Conn { sender, uses: 0 }, true))
    }

    /// The most recently used idle connection that is still open and ready.
    pub(super) async fn idle_h1(&self) -> Option<H1Conn> {
        loop {
            let mut conn = self.h1.idle.borrow_mut().pop()?;
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

    /// Connects on a connection slot the caller took: the connection holds it while open, and
    /// a failure gives it back.
    async fn connect_h1(
        self: &Rc<Self>,
        slot: ConnectionSlot,
    ) -> Result<http1::SendRequest<RequestBody>, ProxyError> {
        let stream = self.connect().await?;
        let (sender, conn) = self
            .settings
            .h1
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ProxyError::from_upstream(self.addr, e))?;
        self.spawn_connection(slot, async move {
            // Errors here surface on the request that was using the connection.
            let _ = conn.await;
        });
        Ok(sender)
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
        if self.h1.waiters.get() == 0 && self.settings.shared.breakers.pending.active() > 0 {
            // Requests wait for a connection slot elsewhere (another worker or host) and none
            // here: closing this idle connection frees its slot for them.
            return;
        }
        let mut idle = self.h1.idle.borrow_mut();
        if idle.len() < MAX_IDLE_PER_HOST {
            idle.push(conn);
            drop(idle);
            if self.h1.waiters.get() > 0 {
                self.h1.returned.notify_one();
            }
        }
    }
}
