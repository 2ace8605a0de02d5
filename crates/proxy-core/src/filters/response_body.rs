//! The body of a response sent downstream: relayed from an upstream, or made by the proxy,
//! and changed on the way by a filter's body filter if one was set up.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::BodyFilter;
use crate::cluster::UpstreamBody;
use crate::context::InFlight;
use crate::context::body_pipe::{PipeReceiver, PipeSender, body_pipe};
use crate::error::{BodyError, StreamDurationReached};

/// A response body: either streamed from an upstream or a small local reply. It holds its
/// connection's in-flight count until it is dropped, which is when the codec is done with it.
pub struct ResponseBody {
    inner: Inner,
    /// Set by a filter's response phase (compression). Boxed: most responses have none.
    filter: Option<Box<BodyFilter>>,
    in_flight: Option<InFlight>,
    /// The request's `max_stream_duration` end, when it has one: the body fails then, and
    /// the codec resets the stream. Boxed: most responses have none.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

enum Inner {
    Local(Option<Bytes>),
    Upstream(UpstreamBody),
    /// A body that failed while it was read ahead: the failure, once.
    Failed(Option<BodyError>),
    /// Frames another task makes from the upstream's (an external processor's answers).
    Piped(PipeReceiver),
    /// A body whose start was read ahead (for an external processor): that start (or what
    /// replaced it), then the rest of the body as it was, or the trailers of one read whole.
    Front {
        data: Option<Bytes>,
        rest: Option<Box<ResponseBody>>,
        trailers: Option<http::HeaderMap>,
    },
}

impl ResponseBody {
    pub(crate) fn local(bytes: Bytes) -> Self {
        let bytes = if bytes.is_empty() { None } else { Some(bytes) };
        Self::new(Inner::Local(bytes))
    }

    /// Made by the proxy (a local reply), not relayed from an upstream.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self.inner, Inner::Local(_))
    }

    /// A local reply's bytes, leaving it empty; `None` for an upstream's body.
    pub(crate) fn take_local(&mut self) -> Option<Bytes> {
        match &mut self.inner {
            Inner::Local(bytes) => Some(bytes.take().unwrap_or_default()),
            Inner::Upstream(_) | Inner::Front { .. } | Inner::Failed(_) | Inner::Piped(_) => None,
        }
    }

    pub(crate) fn upstream(body: UpstreamBody) -> Self {
        Self::new(Inner::Upstream(body))
    }

    fn new(inner: Inner) -> Self {
        Self {
            inner,
            filter: None,
            in_flight: None,
            deadline: None,
        }
    }

    /// The body fails at `at` if it has not ended by then.
    pub(crate) fn end_by(&mut self, at: tokio::time::Instant) {
        self.deadline = Some(Box::pin(tokio::time::sleep_until(at)));
    }

    pub(crate) fn hold(&mut self, in_flight: InFlight) {
        self.in_flight = Some(in_flight);
    }

    pub(crate) fn filter(&mut self, filter: BodyFilter) {
        self.filter = Some(Box::new(filter));
    }

    /// Reads the body (through its filter) until more than `max` bytes or its end:
    /// `(what was read, whether that is the whole body)`. The body then starts with what was
    /// read, which [`ResponseBody::replace_front`] may change; a whole body keeps its trailers
    /// (a gRPC answer's status).
    /// `None` when the body failed: what was read, then the failure, is what the body sends.
    pub(crate) async fn read_front(&mut self, max: usize) -> Option<(Bytes, bool)> {
        let mut rest = std::mem::replace(self, ResponseBody::local(Bytes::new()));
        let mut read = bytes::BytesMut::new();
        let mut trailers = None;
        let mut whole = false;
        while read.len() <= max {
            if rest.is_end_stream() {
                whole = true;
                break;
            }
            match std::future::poll_fn(|cx| Pin::new(&mut rest).poll_frame(cx)).await {
                None => {
                    whole = true;
                    break;
                }
                Some(Err(error)) => {
                    self.inner = Inner::Front {
                        data: Some(read.freeze()).filter(|b| !b.is_empty()),
                        rest: Some(Box::new(ResponseBody::new(Inner::Failed(Some(error))))),
                        trailers: None,
                    };
                    return None;
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => read.extend_from_slice(&data),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                },
            }
        }
        let read = read.freeze();
        self.inner = Inner::Front {
            data: Some(read.clone()).filter(|b| !b.is_empty()),
            rest: (!whole).then(|| Box::new(rest)),
            trailers,
        };
        Some((read, whole))
    }

    /// Hands the body's frames to another task (an external processor's streamed body), which
    /// sends what the client gets in their place: the frames as a body of their own (through
    /// the body filter of the filters after, as they left them), and where to send their
    /// replacements. The stream's deadline stays with this body.
    pub(crate) fn pipe(&mut self) -> (ResponseBody, PipeSender) {
        let (sender, receiver) = body_pipe();
        let inner = std::mem::replace(&mut self.inner, Inner::Piped(receiver));
        let mut frames = ResponseBody::new(inner);
        frames.filter = self.filter.take();
        (frames, sender)
    }

    /// The start read by [`ResponseBody::read_front`] replaced by `data`.
    pub(crate) fn replace_front(&mut self, data: Bytes) {
        let data = Some(data).filter(|b| !b.is_empty());
        match &mut self.inner {
            Inner::Front { data: front, .. } => *front = data,
            inner => *inner = Inner::Local(data),
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            this.deadline = None;
            if let Some(in_flight) = &this.in_flight {
                in_flight.stream_duration_reached();
            }
            return Poll::Ready(Some(Err(Box::new(StreamDurationReached))));
        }
        let polled = match &mut this.filter {
            None => Pin::new(&mut this.inner).poll_frame(cx),
            Some(filter) => filter.poll_frame(Pin::new(&mut this.inner), cx),
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
        match &self.filter {
            None => self.inner.is_end_stream(),
            Some(filter) => filter.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.filter {
            None => self.inner.size_hint(),
            // A filtered body's length is known only at its end.
            Some(_) => SizeHint::default(),
        }
    }
}

impl Body for Inner {
    type Data = Bytes;
    type Error = BodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Inner::Local(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Upstream(body) => Pin::new(body).poll_frame(cx),
            Inner::Failed(error) => Poll::Ready(error.take().map(Err)),
            Inner::Piped(receiver) => receiver.poll_frame(cx),
            Inner::Front {
                data,
                rest,
                trailers,
            } => match (data.take(), rest) {
                (Some(front), _) => Poll::Ready(Some(Ok(Frame::data(front)))),
                (None, Some(rest)) => Pin::new(&mut **rest).poll_frame(cx),
                (None, None) => Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t)))),
            },
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            Inner::Local(bytes) => bytes.is_none(),
            Inner::Upstream(body) => body.is_end_stream(),
            Inner::Failed(error) => error.is_none(),
            Inner::Piped(receiver) => receiver.is_end_stream(),
            Inner::Front {
                data,
                rest,
                trailers,
            } => {
                data.is_none()
                    && trailers.is_none()
                    && rest.as_ref().is_none_or(|r| r.is_end_stream())
            }
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            Inner::Local(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Inner::Upstream(body) => body.size_hint(),
            Inner::Front { .. } | Inner::Failed(_) | Inner::Piped(_) => SizeHint::default(),
        }
    }
}
