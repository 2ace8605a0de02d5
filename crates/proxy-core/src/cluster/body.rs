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
use super::h1_pool::PoolReturn;

/// A response body from an upstream. When it has been read to the end, its HTTP/1.1
/// connection goes back to the pool; dropped earlier, the connection is closed, since the rest
/// of the response would still be on the wire.
pub struct UpstreamBody {
    inner: Incoming,
    ended: bool,
    pool_return: Option<PoolReturn>,
    _request: UpstreamRequest,
}

impl UpstreamBody {
    pub(super) fn new(
        inner: Incoming,
        pool_return: Option<PoolReturn>,
        request: UpstreamRequest,
    ) -> Self {
        Self {
            inner,
            ended: false,
            pool_return,
            _request: request,
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
}

impl UpstreamRequest {
    pub(super) fn start(pool: &Rc<HostPool>, picked: Picked) -> Self {
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
        // The `max_requests` slot handed over when the try was sent.
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
        if let Some(pool_return) = self.pool_return.take() {
            pool_return.body_done(self.ended || self.inner.is_end_stream());
        }
    }
}
