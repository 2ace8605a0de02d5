//! Upgrade requests (`Upgrade: websocket`): each goes on an HTTP/1.1 connection of its own,
//! never pooled, since a connection the upstream agrees to upgrade stops being HTTP.

use std::rc::Rc;
use std::time::Duration;

use http::{Request, Response};
use hyper_util::rt::TokioIo;

use super::HostPool;
use super::body::{UpstreamBody, UpstreamRequest};
use super::forward::Admitted;
use crate::context::RequestBody;
use crate::error::{Overflow, ProxyError};

impl Admitted<'_> {
    /// Sends an upgrade request on a new connection and waits (at most `timeout`) for the
    /// answer. A `101` carries the upgraded connection in its extensions
    /// (`hyper::upgrade::on`); any other answer is relayed as usual and its connection closed.
    pub(crate) async fn send_upgrade(
        self,
        req: Request<RequestBody>,
        timeout: Duration,
    ) -> Result<(Rc<HostPool>, Response<UpstreamBody>), ProxyError> {
        let Admitted {
            host, picked, slot, ..
        } = self;
        // Refused: the slot and the pick are given back as they drop.
        let host = host.for_request(&req)?;
        slot.hand_over();
        let request = UpstreamRequest::start(&host, picked);
        let sent = tokio::time::timeout(timeout, host.send_on_own_connection(req))
            .await
            .map_err(|_| {
                host.count_timeout();
                ProxyError::Timeout {
                    addr: host.addr(),
                    after: timeout,
                }
            })??;
        if sent.status() != http::StatusCode::SWITCHING_PROTOCOLS
            && let Some(what) = framing_conflict(sent.headers())
        {
            return Err(ProxyError::UpstreamFraming {
                addr: host.addr(),
                what,
            });
        }
        host.stats.response(sent.status());
        let response = sent.map(|body| UpstreamBody::hyper(body, request));
        Ok((host, response))
    }
}

impl HostPool {
    async fn send_on_own_connection(
        self: &Rc<Self>,
        req: Request<RequestBody>,
    ) -> Result<Response<hyper::body::Incoming>, ProxyError> {
        let _claim = self.claim_pool_slot()?;
        let Some(slot) = self.try_connection_slot() else {
            // No waiting in the pending queue: a connection for an upgrade is never returned,
            // so only a closing one would help, and clients retry an upgrade themselves.
            self.stats.cx_overflow.inc();
            self.stats.rq_pending_overflow.inc();
            self.settings.log_refused(Overflow::Pending);
            return Err(ProxyError::Overflow(Overflow::Pending));
        };
        let stream = self.connect_http1().await?;
        let (mut sender, conn) = self
            .settings
            .h1
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ProxyError::from_upstream(self.addr, e))?;
        // Counted as open until the upgrade hands the socket over (or the exchange ends).
        self.spawn_connection(slot, async move {
            let _ = conn.with_upgrades().await;
        });
        sender
            .send_request(req)
            .await
            .map_err(|e| ProxyError::from_upstream(self.addr, e))
    }
}

/// What makes a response's length ambiguous, if anything: a client (or a cache between)
/// could frame it differently from the way hyper read it (RFC 9112 section 6.3). Pooled
/// requests have the same check in the codec (crates/h1 `parse_response`).
fn framing_conflict(headers: &http::HeaderMap) -> Option<&'static str> {
    use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
    (headers.contains_key(CONTENT_LENGTH) && headers.contains_key(TRANSFER_ENCODING))
        .then_some("both content-length and transfer-encoding")
}
