//! The body of a response sent downstream: relayed from an upstream, or made by the proxy.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::cluster::UpstreamBody;
use crate::context::InFlight;

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
