//! The body of a response sent downstream: relayed from an upstream, or made by the proxy.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::cluster::UpstreamBody;

/// A response body: either streamed from an upstream or a small local reply.
pub enum ResponseBody {
    Local(Option<Bytes>),
    Upstream(UpstreamBody),
}

impl ResponseBody {
    pub(crate) fn local(bytes: Bytes) -> Self {
        ResponseBody::Local(if bytes.is_empty() { None } else { Some(bytes) })
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
        match self.get_mut() {
            ResponseBody::Local(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ResponseBody::Upstream(body) => Pin::new(body).poll_frame(cx),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Local(bytes) => bytes.is_none(),
            ResponseBody::Upstream(body) => body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Local(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            ResponseBody::Upstream(body) => body.size_hint(),
        }
    }
}
