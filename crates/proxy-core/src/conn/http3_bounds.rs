//! The QUIC side of an HTTP/3 connection as h3 sees it, with one check of its own: a request
//! stream that ends inside a DATA frame's payload (its header sent, the bytes it announced
//! cut short by the stream's end) is a stream error. RFC 9114 §7.1 makes it a malformed
//! request; h3 0.0.8 reports such a body as ended and then panics when its trailers are asked
//! for, so the check is made here, below it, where the bytes pass. A stream cut inside any
//! other frame, or inside a frame's header, h3 refuses itself (it reads those whole).
//!
//! Everything else is quinn's streams as `h3_quinn` wraps them, passed through.

use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};

/// `h3_quinn`'s connection, its request streams checked for ending inside a frame.
pub(crate) struct Connection(h3_quinn::Connection);

impl Connection {
    pub(crate) fn new(connection: quinn::Connection) -> Self {
        Self(h3_quinn::Connection::new(connection))
    }
}

/// `h3_quinn`'s stream opener, opening checked request streams.
#[derive(Clone)]
pub(crate) struct OpenStreams(h3_quinn::OpenStreams);

/// A request stream (both sides); the receiving side checked.
pub(crate) struct BidiStream {
    inner: h3_quinn::BidiStream<Bytes>,
    bounds: FrameBounds,
}

/// A request stream's receiving side, checked.
pub(crate) struct RecvStream {
    inner: h3_quinn::RecvStream,
    bounds: FrameBounds,
}

/// The stream ended inside a DATA frame.
#[derive(Debug, thiserror::Error)]
#[error("the request stream ended inside an HTTP/3 DATA frame")]
struct EndedInsideData;

impl BidiStream {
    fn checked(inner: h3_quinn::BidiStream<Bytes>) -> Self {
        Self {
            inner,
            bounds: FrameBounds::default(),
        }
    }
}

impl quic::Connection<Bytes> for Connection {
    type RecvStream = h3_quinn::RecvStream;
    type OpenStreams = OpenStreams;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::RecvStream, ConnectionErrorIncoming>> {
        // Unidirectional streams (control, QPACK) start with a stream type, not a frame:
        // h3 checks those itself.
        quic::Connection::<Bytes>::poll_accept_recv(&mut self.0, cx)
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        let inner = ready!(quic::Connection::<Bytes>::poll_accept_bidi(&mut self.0, cx))?;
        Poll::Ready(Ok(BidiStream::checked(inner)))
    }

    fn opener(&self) -> Self::OpenStreams {
        OpenStreams(quic::Connection::<Bytes>::opener(&self.0))
    }
}

/// The streams a connection opens, as its opener does.
macro_rules! open_streams {
    ($type:ty) => {
        impl quic::OpenStreams<Bytes> for $type {
            // A server opens no request streams; one it would is checked as those accepted.
            type BidiStream = BidiStream;
            type SendStream = h3_quinn::SendStream<Bytes>;

            fn poll_open_bidi(
                &mut self,
                cx: &mut Context<'_>,
            ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
                let inner = ready!(quic::OpenStreams::<Bytes>::poll_open_bidi(&mut self.0, cx))?;
                Poll::Ready(Ok(BidiStream::checked(inner)))
            }

            fn poll_open_send(
                &mut self,
                cx: &mut Context<'_>,
            ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
                quic::OpenStreams::<Bytes>::poll_open_send(&mut self.0, cx)
            }

            fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
                quic::OpenStreams::<Bytes>::close(&mut self.0, code, reason)
            }
        }
    };
}

open_streams!(Connection);
open_streams!(OpenStreams);

impl quic::BidiStream<Bytes> for BidiStream {
    type SendStream = h3_quinn::SendStream<Bytes>;
    type RecvStream = RecvStream;

    fn split(self) -> (Self::SendStream, Self::RecvStream) {
        let (send, inner) = self.inner.split();
        (
            send,
            RecvStream {
                inner,
                bounds: self.bounds,
            },
        )
    }
}

impl quic::SendStream<Bytes> for BidiStream {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        quic::SendStream::<Bytes>::poll_ready(&mut self.inner, cx)
    }

    fn send_data<T: Into<WriteBuf<Bytes>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        quic::SendStream::<Bytes>::send_data(&mut self.inner, data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        quic::SendStream::<Bytes>::poll_finish(&mut self.inner, cx)
    }

    fn reset(&mut self, reset_code: u64) {
        quic::SendStream::<Bytes>::reset(&mut self.inner, reset_code)
    }

    fn send_id(&self) -> StreamId {
        quic::SendStream::<Bytes>::send_id(&self.inner)
    }
}

/// A receiving side whose bytes pass its frame bounds on the way to h3.
macro_rules! checked_recv {
    ($type:ty) => {
        impl quic::RecvStream for $type {
            type Buf = Bytes;

            fn poll_data(
                &mut self,
                cx: &mut Context<'_>,
            ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
                let data = ready!(quic::RecvStream::poll_data(&mut self.inner, cx));
                Poll::Ready(self.bounds.check(data))
            }

            fn stop_sending(&mut self, error_code: u64) {
                quic::RecvStream::stop_sending(&mut self.inner, error_code)
            }

            fn recv_id(&self) -> StreamId {
                quic::RecvStream::recv_id(&self.inner)
            }
        }
    };
}

checked_recv!(BidiStream);
checked_recv!(RecvStream);

/// Where a request stream's bytes are among its frames (each a type and a length, both
/// QUIC variable-length integers, then that many bytes).
#[derive(Debug, Default)]
struct FrameBounds {
    /// The bytes of a frame header read so far (at most two 8-byte integers).
    header: [u8; 16],
    header_len: usize,
    /// The payload bytes of the current frame still to come.
    payload_left: u64,
    /// The current frame is DATA: h3 passes its payload on as it comes, not whole.
    data: bool,
}

/// The type of a DATA frame.
const DATA: u64 = 0x0;

impl FrameBounds {
    /// Passes `data` on after counting it; the stream's end inside a DATA frame's payload
    /// is an error.
    fn check(
        &mut self,
        data: Result<Option<Bytes>, StreamErrorIncoming>,
    ) -> Result<Option<Bytes>, StreamErrorIncoming> {
        match data {
            Ok(Some(bytes)) => {
                self.read(bytes.chunk());
                Ok(Some(bytes))
            }
            Ok(None) if self.data && self.payload_left > 0 => {
                Err(StreamErrorIncoming::Unknown(Box::new(EndedInsideData)))
            }
            other => other,
        }
    }

    fn read(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.payload_left > 0 {
                let left = usize::try_from(self.payload_left).unwrap_or(usize::MAX);
                let skipped = data.len().min(left);
                self.payload_left -= skipped as u64;
                data = &data[skipped..];
                continue;
            }
            self.header[self.header_len] = data[0];
            self.header_len += 1;
            data = &data[1..];
            if let Some((kind, length)) = frame_header(&self.header[..self.header_len]) {
                self.payload_left = length;
                self.data = kind == DATA;
                self.header_len = 0;
            }
        }
    }
}

/// The type and payload length a complete frame header gives; `None` while `header` is not
/// one yet.
fn frame_header(header: &[u8]) -> Option<(u64, u64)> {
    // A variable-length integer's length is in its first byte's two high bits.
    let size = |first: u8| 1usize << (first >> 6);
    let value = |bytes: &[u8]| {
        let first = u64::from(bytes[0] & 0x3f);
        bytes[1..]
            .iter()
            .fold(first, |n, &b| (n << 8) | u64::from(b))
    };
    let type_len = size(*header.first()?);
    let length_len = size(*header.get(type_len)?);
    if header.len() != type_len + length_len {
        return None;
    }
    Some((value(&header[..type_len]), value(&header[type_len..])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(chunks: &[&[u8]]) -> Result<Option<Bytes>, StreamErrorIncoming> {
        let mut bounds = FrameBounds::default();
        for chunk in chunks {
            assert!(
                bounds
                    .check(Ok(Some(Bytes::copy_from_slice(chunk))))
                    .is_ok()
            );
        }
        bounds.check(Ok(None))
    }

    #[test]
    fn a_stream_may_not_end_inside_a_data_frames_payload() {
        // HEADERS (type 1) of 2 bytes, DATA (type 0) of 3: whole, then cut in each place.
        let frames: &[u8] = &[0x01, 0x02, 0xaa, 0xbb, 0x00, 0x03, b'a', b'b', b'c'];
        assert!(matches!(ended(&[frames]), Ok(None)));
        assert!(matches!(ended(&[]), Ok(None)));
        for cut in 1..frames.len() {
            // Cut inside the DATA frame's payload (after its two header bytes); a cut
            // elsewhere is h3's to refuse.
            let inside_data = cut >= 6;
            assert_eq!(
                ended(&[&frames[..cut]]).is_err(),
                inside_data,
                "cut at {cut}"
            );
        }
        // The same bytes in chunks that split headers and payloads.
        let (a, rest) = frames.split_at(1);
        let (b, c) = rest.split_at(6);
        assert!(matches!(ended(&[a, b, c]), Ok(None)));
        assert!(ended(&[a, b]).is_err());
    }

    #[test]
    fn long_integers_are_read_whole() {
        // A DATA frame whose length takes two bytes (0x40 prefix): 0x0100 = 256 bytes.
        let mut frame = vec![0x00, 0x41, 0x00];
        assert!(ended(&[&frame]).is_err());
        frame.extend(std::iter::repeat_n(b'x', 256));
        assert!(matches!(ended(&[&frame]), Ok(None)));
        // A reserved frame type of eight bytes (0x21 within), its 2 bytes, then DATA cut.
        let reserved = [
            0xc0, 0, 0, 0, 0, 0, 0, 0x21, 0x02, b'h', b'i', 0x00, 0x05, b'x',
        ];
        assert!(matches!(ended(&[&reserved[..11]]), Ok(None)));
        assert!(ended(&[&reserved]).is_err());
    }

    #[test]
    fn errors_and_data_pass_through() {
        let mut bounds = FrameBounds::default();
        let error = StreamErrorIncoming::StreamTerminated { error_code: 0x10c };
        assert!(matches!(
            bounds.check(Err(error)),
            Err(StreamErrorIncoming::StreamTerminated { error_code: 0x10c })
        ));
        let data = Bytes::from_static(&[0x00, 0x01, b'z']);
        assert_eq!(
            bounds.check(Ok(Some(data.clone()))).ok().flatten(),
            Some(data)
        );
    }
}
