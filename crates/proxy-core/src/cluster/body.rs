//! A response body from an upstream, and the request's upstream bookkeeping it carries until
//! the body is done with.

use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use balancer::Picked;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::HostPool;
use super::h1_conn::H1Response;
use super::h2_conn::H2Conn;
use crate::error::BodyError;

/// A response body from an upstream: read from its HTTP/1.1 connection (which goes back to
/// the pool once the body has been read to its end, and closes if it is dropped earlier), or
/// an HTTP/2 stream's.
pub struct UpstreamBody {
    inner: Inner,
    request: UpstreamRequest,
}

enum Inner {
    Http1(H1Response),
    /// HTTP/2, or the answer to an upgrade request.
    Hyper(Incoming),
}

impl UpstreamBody {
    pub(super) fn http1(body: H1Response, request: UpstreamRequest) -> Self {
        Self {
            inner: Inner::Http1(body),
            request,
        }
    }

    pub(super) fn hyper(body: Incoming, request: UpstreamRequest) -> Self {
        Self {
            inner: Inner::Hyper(body),
            request,
        }
    }
}

/// Counts an upstream request as active, and times it, from sending until its response body
/// is done with (or the attempt failed).
pub(super) struct UpstreamRequest {
    pool: Rc<HostPool>,
    started: Instant,
    /// The balancer's in-flight mark on the host, released with the request.
    _picked: Picked,
    /// The HTTP/2 connection the request is a stream of.
    h2_connection: Option<Rc<H2Conn>>,
}

impl UpstreamRequest {
    pub(super) fn start(pool: &Rc<HostPool>, picked: Picked) -> Self {
        pool.stats.rq_total.inc();
        pool.stats.rq_active.inc();
        pool.host_stats.rq_active.inc();
        pool.in_flight.set(pool.in_flight.get() + 1);
        if let Some(endpoint) = &pool.endpoint_stats {
            endpoint.rq_total.inc();
        }
        Self {
            pool: Rc::clone(pool),
            started: Instant::now(),
            _picked: picked,
            h2_connection: None,
        }
    }

    /// The request is a stream of HTTP/2 connection `connection`, which counts it as open
    /// until the request is done.
    pub(super) fn on_h2(mut self, connection: Rc<H2Conn>) -> Self {
        self.h2_connection = Some(connection);
        self
    }
}

impl Drop for UpstreamRequest {
    fn drop(&mut self) {
        // The `max_requests` slot handed over when the try was sent.
        self.pool.settings.shared.breakers.requests.release();
        if let Some(connection) = &self.h2_connection {
            self.pool.h2_stream_ended(connection);
        }
        self.pool.stats.rq_active.dec();
        self.pool.host_stats.rq_active.dec();
        (self.pool.in_flight).set(self.pool.in_flight.get().saturating_sub(1));
        self.pool
            .stats
            .rq_time
            .record_duration(self.started.elapsed());
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        match &mut this.inner {
            Inner::Http1(body) => Pin::new(body).poll_frame(cx),
            Inner::Hyper(body) => Pin::new(body).poll_frame(cx).map_err(|error| {
                let request = &this.request;
                if let Some(connection) = &request.h2_connection {
                    request.pool.h2_stream_failed(connection, &error);
                }
                Box::new(error) as BodyError
            }),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Http1(body) => body.is_end_stream(),
            Inner::Hyper(body) => body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Http1(body) => body.size_hint(),
            Inner::Hyper(body) => body.size_hint(),
        }
    }
}
