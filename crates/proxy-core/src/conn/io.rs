//! The downstream socket as the codec sees it, with a lingering close.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use super::http2_frames::FrameMeter;

/// How long a closing connection keeps reading (and discarding) what the client still sends.
const LINGER: Duration = Duration::from_secs(1);
/// How much it reads at most while lingering.
const LINGER_BYTES: usize = 256 * 1024;

/// The client's connection: cleartext, or TLS after the handshake (boxed: the TLS state is
/// large, and parked connections should stay small).
type Transport = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// A downstream stream whose shutdown lingers: it sends FIN, then reads and discards until
/// the client closes too (bounded in time and bytes). Closing a socket with unread input makes
/// the kernel send RST, and a client receiving RST may discard the response it has not read
/// yet, such as the 400 for a malformed request.
pub(crate) struct DownstreamIo {
    transport: Transport,
    /// Bytes already read from the socket that the codec has yet to see.
    prefix: Bytes,
    linger: Option<Pin<Box<Sleep>>>,
    drained: usize,
    /// HTTP/2 only: the frame headers of what is read, followed for floods.
    meter: Option<Box<FrameMeter>>,
    /// A byte relay: shutdown only closes the write side (a half close), as the client may
    /// still be sending what must be relayed.
    half_close: bool,
}

impl DownstreamIo {
    pub(crate) fn plain(stream: TcpStream) -> Self {
        Self::new(Either::Left(stream))
    }

    pub(crate) fn tls(stream: TlsStream<TcpStream>) -> Self {
        Self::new(Either::Right(Box::new(stream)))
    }

    fn new(transport: Transport) -> Self {
        Self {
            transport,
            prefix: Bytes::new(),
            linger: None,
            drained: 0,
            meter: None,
            half_close: false,
        }
    }

    /// The connection becomes a byte relay: its shutdown is a half close, without lingering
    /// (a lingering read would take bytes the relay must pass on).
    pub(crate) fn relay(mut self) -> Self {
        self.half_close = true;
        self
    }

    /// Follows the frames read from now on (the connection speaks HTTP/2).
    pub(crate) fn meter(&mut self, meter: FrameMeter) {
        self.meter = Some(Box::new(meter));
    }

    /// The TCP socket under any TLS.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match &self.transport {
            Either::Left(s) => s,
            Either::Right(s) => s.get_ref().0,
        }
    }

    fn tcp_mut(&mut self) -> &mut TcpStream {
        match &mut self.transport {
            Either::Left(s) => s,
            Either::Right(s) => s.get_mut().0,
        }
    }

    /// Whether the connection is cleartext with nothing carried over or metered: then its
    /// socket alone is the connection, and it can be parked as just that.
    pub(crate) fn is_plain(&self) -> bool {
        matches!(self.transport, Either::Left(_)) && self.prefix.is_empty() && self.meter.is_none()
    }

    /// The cleartext socket ([`is_plain`](Self::is_plain) connections).
    pub(crate) fn into_plain_tcp(self) -> Result<TcpStream, Self> {
        match self.transport {
            Either::Left(stream) => Ok(stream),
            transport => Err(Self { transport, ..self }),
        }
    }

    /// The protocol ALPN chose, on a TLS connection.
    pub(crate) fn alpn(&self) -> Option<&[u8]> {
        match &self.transport {
            Either::Left(_) => None,
            Either::Right(s) => s.get_ref().1.alpn_protocol(),
        }
    }

    /// Bytes to hand out before reading the socket again. They are copied: a slice of a
    /// codec's read buffer would keep that whole buffer alive while the connection is parked.
    pub(crate) fn set_prefix(&mut self, prefix: &[u8]) {
        self.prefix = if prefix.is_empty() {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(prefix)
        };
    }

    /// Whether there is input to read without waiting for the socket: carried-over bytes,
    /// or TLS records already received and not yet read as plaintext.
    pub(crate) fn has_buffered(&mut self) -> bool {
        if !self.prefix.is_empty() {
            return true;
        }
        match &mut self.transport {
            Either::Left(_) => false,
            // An error also counts: reading is how the codec will learn of it.
            Either::Right(s) => s
                .get_mut()
                .1
                .process_new_packets()
                .map_or(true, |state| state.plaintext_bytes_to_read() > 0),
        }
    }
}

impl AsyncRead for DownstreamIo {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            if this.prefix.is_empty() {
                this.prefix = Bytes::new();
            }
        } else {
            ready!(Pin::new(&mut this.transport).poll_read(cx, buf))?;
        }
        if let Some(meter) = &mut this.meter {
            meter.read(&buf.filled()[before..])?;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for DownstreamIo {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.transport).poll_write(cx, buf))?;
        if let Some(meter) = &mut this.meter {
            meter.wrote(&buf[..n]);
        }
        Poll::Ready(Ok(n))
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.transport).poll_write_vectored(cx, bufs))?;
        if let Some(meter) = &mut this.meter {
            let mut left = n;
            for buf in bufs {
                let take = left.min(buf.len());
                meter.wrote(&buf[..take]);
                left -= take;
                if left == 0 {
                    break;
                }
            }
        }
        Poll::Ready(Ok(n))
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.transport.is_write_vectored()
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().transport).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.half_close {
            return Pin::new(&mut this.transport).poll_shutdown(cx);
        }
        if this.linger.is_none() {
            // TLS sends close_notify first, then shuts the socket's write side.
            if ready!(Pin::new(&mut this.transport).poll_shutdown(cx)).is_err() {
                // Already reset by the peer: nothing to linger for.
                return Poll::Ready(Ok(()));
            }
            this.linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        let mut scratch = [0u8; 4096];
        while this.drained < LINGER_BYTES {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(this.tcp_mut()).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => this.drained += buf.filled().len(),
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        match this.linger.as_mut() {
            Some(timer) if this.drained < LINGER_BYTES => timer.as_mut().poll(cx).map(Ok),
            _ => Poll::Ready(Ok(())),
        }
    }
}
