//! The body of a response sent downstream: relayed from an upstream, or made by the proxy.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use tokio::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::cluster::UpstreamBody;
use crate::conn::InFlight;

/// A response body: either streamed from an upstream or a small local reply. It holds its
/// connection's in-flight count until it is dropped, which is when the codec is done with it.
pub struct ResponseBody {
    inner: Inner,
    in_flight: Option<InFlight>,
}

enum Inner {
    Local(Option<Bytes>),
    Upstream(UpstreamBody),
}

impl ResponseBody {
    pub(crate) fn local(bytes: Bytes) -> Self {
        let bytes = if bytes.is_empty() { None } else { Some(bytes) };
        Self {
            inner: Inner::Local(bytes),
            in_flight: None,
        }
    }

    pub(crate) fn upstream(body: UpstreamBody) -> Self {
        Self {
            inner: Inner::Upstream(body),
            in_flight: None,
        }
    }

    pub(crate) fn hold(&mut self, in_flight: InFlight) {
        self.in_flight = Some(in_flight);
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = match &mut this.inner {
            Inner::Local(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Upstream(body) => Pin::new(body).poll_frame(cx),
        };
        if let (Some(in_flight), Poll::Ready(Some(Ok(frame)))) = (&mut this.in_flight, &polled)
            && let Some(data) = frame.data_ref()
        {
            in_flight.sent(data.len());
        }
        polled
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Local(bytes) => bytes.is_none(),
            Inner::Upstream(body) => body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Local(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Inner::Upstream(body) => body.size_hint(),
        }
    }
}

/// A request body relayed upstream, counting its bytes for the access log when asked to.
pub struct RequestBody {
    inner: hyper::body::Incoming,
    received: Option<Rc<Cell<u64>>>,
    /// When the last frame was handed upstream, if someone watches.
    progress: Option<Rc<Cell<Instant>>>,
}

impl RequestBody {
    pub(crate) fn new(inner: hyper::body::Incoming, received: Option<Rc<Cell<u64>>>) -> Self {
        Self {
            inner,
            received,
            progress: None,
        }
    }

    /// A clock the body moves forward each time a frame goes upstream, and when it ends;
    /// `None` for a body that is already complete (no request body).
    pub(crate) fn track_progress(&mut self) -> Option<Rc<Cell<Instant>>> {
        if self.inner.is_end_stream() {
            return None;
        }
        let clock = Rc::new(Cell::new(Instant::now()));
        self.progress = Some(Rc::clone(&clock));
        Some(clock)
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        // Dropped when the codec is done with it: the request has left, or failed.
        if let Some(clock) = &self.progress {
            clock.set(Instant::now());
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Some(counter), Poll::Ready(Some(Ok(frame)))) = (&this.received, &polled)
            && let Some(data) = frame.data_ref()
        {
            counter.set(counter.get() + data.len() as u64);
        }
        if let (Some(clock), Poll::Ready(_)) = (&this.progress, &polled) {
            clock.set(Instant::now());
        }
        polled
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
