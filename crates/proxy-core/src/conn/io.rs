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

/// How long a closing connection keeps reading (and discarding) what the client still sends.
const LINGER: Duration = Duration::from_secs(1);
/// How much it reads at most while lingering.
const LINGER_BYTES: usize = 256 * 1024;

/// A downstream TCP stream whose shutdown lingers: it sends FIN, then reads and discards until
/// the client closes too (bounded in time and bytes). Closing a socket with unread input makes
/// the kernel send RST, and a client receiving RST may discard the response it has not read
/// yet, such as the 400 for a malformed request.
pub(crate) struct DownstreamIo {
    stream: TcpStream,
    /// Bytes already read from the socket that the codec has yet to see.
    prefix: Bytes,
    linger: Option<Pin<Box<Sleep>>>,
    drained: usize,
}

impl DownstreamIo {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            prefix: Bytes::new(),
            linger: None,
            drained: 0,
        }
    }
}

impl DownstreamIo {
    pub(crate) fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Bytes to hand to the codec before anything more from the socket.
    /// Bytes to hand out before reading the socket again. They are copied: a slice of a
    /// codec's read buffer would keep that whole buffer alive while the connection is parked.
    pub(crate) fn set_prefix(&mut self, prefix: &[u8]) {
        self.prefix = if prefix.is_empty() {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(prefix)
        };
    }

    pub(crate) fn has_prefix(&self) -> bool {
        !self.prefix.is_empty()
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
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            if this.prefix.is_empty() {
                this.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for DownstreamIo {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.linger.is_none() {
            if ready!(Pin::new(&mut this.stream).poll_shutdown(cx)).is_err() {
                // Already reset by the peer: nothing to linger for.
                return Poll::Ready(Ok(()));
            }
            this.linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        let mut scratch = [0u8; 4096];
        while this.drained < LINGER_BYTES {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.stream).poll_read(cx, &mut buf) {
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
