//! The response-body phase: a filter that set up a [`BodyFilter`] in its response-headers
//! phase sees every frame of the body, and its log phase when the body is done with.

use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};

use super::compression::Compressor;
use crate::catalog::CompressionStats;
use crate::error::BodyError;

/// A change to a response body as it streams. Boxed by its owner: most responses have none.
#[allow(clippy::large_enum_variant)] // boxed whole by its owner
pub(crate) enum BodyFilter {
    Compress(Compress),
    GrpcWeb(GrpcWebBody),
    /// Another body instead of the response's own, which is not read (`custom_response`);
    /// `None` once sent.
    Replace(Option<Bytes>),
}

impl BodyFilter {
    pub(super) fn compress(compressor: Compressor, stats: Rc<CompressionStats>) -> Self {
        BodyFilter::Compress(Compress {
            compressor: Some(compressor),
            written: false,
            trailers: None,
            bytes_in: 0,
            bytes_out: 0,
            stats,
        })
    }

    pub(super) fn grpc_web(text: bool) -> Self {
        BodyFilter::GrpcWeb(GrpcWebBody { text, done: false })
    }

    pub(super) fn replace(body: Bytes) -> Self {
        BodyFilter::Replace(Some(body).filter(|b| !b.is_empty()))
    }

    /// The next frame of the filtered body, polling `inner` for input.
    pub(crate) fn poll_frame<B>(
        &mut self,
        inner: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>>
    where
        B: Body<Data = Bytes, Error = BodyError>,
    {
        match self {
            BodyFilter::Compress(c) => c.poll_frame(inner, cx),
            BodyFilter::GrpcWeb(g) => g.poll_frame(inner, cx),
            BodyFilter::Replace(body) => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        match self {
            BodyFilter::Compress(c) => c.compressor.is_none() && c.trailers.is_none(),
            BodyFilter::GrpcWeb(g) => g.done,
            BodyFilter::Replace(body) => body.is_none(),
        }
    }
}

/// Compresses a body as it comes. Input is compressed as soon as it arrives, and what the
/// encoder has produced goes out whenever the upstream has nothing more for now (a sync flush),
/// so a streamed response keeps streaming; memory is the encoder's state and one frame.
pub(crate) struct Compress {
    /// `None` once the stream is finished.
    compressor: Option<Compressor>,
    /// Data written since the last flush.
    written: bool,
    /// Trailers to send after the last compressed bytes.
    trailers: Option<http::HeaderMap>,
    bytes_in: u64,
    bytes_out: u64,
    stats: Rc<CompressionStats>,
}

impl Compress {
    fn poll_frame<B>(
        &mut self,
        mut inner: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>>
    where
        B: Body<Data = Bytes, Error = BodyError>,
    {
        loop {
            let Some(compressor) = self.compressor.as_mut() else {
                return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            let produced = match inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        self.bytes_in += data.len() as u64;
                        self.written = true;
                        compressor.write(&data)
                    }
                    Err(frame) => {
                        self.trailers = frame.into_trailers().ok();
                        self.finish()
                    }
                },
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(None) => self.finish(),
                Poll::Pending if self.written => {
                    self.written = false;
                    compressor.flush()
                }
                Poll::Pending => return Poll::Pending,
            };
            match produced {
                Ok(bytes) if bytes.is_empty() => continue,
                Ok(bytes) => {
                    self.bytes_out += bytes.len() as u64;
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Err(error) => {
                    // An encoder error is ours, not the upstream's: the client gets a cut-off
                    // body, as when the upstream resets.
                    tracing::warn!(%error, "compression failed; ending the response");
                    self.compressor = None;
                    self.trailers = None;
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn finish(&mut self) -> std::io::Result<Bytes> {
        match self.compressor.take() {
            Some(compressor) => compressor.finish(),
            None => Ok(Bytes::new()),
        }
    }
}

impl Drop for Compress {
    /// The log phase: what the response cost and saved, counted however it ended.
    fn drop(&mut self) {
        self.stats.uncompressed_bytes.add(self.bytes_in);
        self.stats.compressed_bytes.add(self.bytes_out);
    }
}

/// A gRPC response's body as gRPC-Web: its trailers as a last message, and for a text client
/// every frame base64 (padded: a message is never held back for the next).
pub(crate) struct GrpcWebBody {
    text: bool,
    done: bool,
}

impl GrpcWebBody {
    fn poll_frame<B>(
        &mut self,
        mut inner: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>>
    where
        B: Body<Data = Bytes, Error = BodyError>,
    {
        use base64::Engine;
        let out = |bytes: Bytes, text: bool| {
            let bytes = if text {
                Bytes::from(base64::engine::general_purpose::STANDARD.encode(&bytes))
            } else {
                bytes
            };
            Poll::Ready(Some(Ok(Frame::data(bytes))))
        };
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match std::task::ready!(inner.as_mut().poll_frame(cx)) {
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => return out(data, self.text),
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.done = true;
                            return out(super::grpc_web::trailer_message(&trailers), self.text);
                        }
                    }
                },
                None => {
                    self.done = true;
                    return Poll::Ready(None);
                }
            }
        }
    }
}
