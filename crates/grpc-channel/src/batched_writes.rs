//! The gRPC connection's writes gathered into one system call per poll of the connection.
//!
//! h2 flushes its write buffer before every DATA frame of 256 bytes or more, and a check's
//! message is longer than that: left alone, every check is a `writev` of its own, however
//! many checks the worker made in the same event-loop turn. Here the h2 connection writes into
//! a buffer and its flushes do nothing; the task that drives the connection writes the buffer
//! out once after each poll ([`Writer::poll_write_out`]). Checks made in one turn go out in
//! one write, and a lone check leaves as early as before (at the end of the same poll).
//!
//! The buffer is bounded: past [`HIGH_WATER`] bytes a write first tries the socket, and waits
//! for it if the service is not reading.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, unix};
use tokio_util::either::Either;

use crate::transport::Stream;

/// The most bytes held for the socket before a write waits for it.
pub(crate) const HIGH_WATER: usize = 64 * 1024;

type TlsStream = Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
type ReadHalf =
    Either<Either<tcp::OwnedReadHalf, unix::OwnedReadHalf>, tokio::io::ReadHalf<TlsStream>>;
type WriteHalf =
    Either<Either<tcp::OwnedWriteHalf, unix::OwnedWriteHalf>, tokio::io::WriteHalf<TlsStream>>;

/// What h2 reads from and writes to: the socket's read half, and the shared output buffer.
pub(crate) struct BatchedIo {
    read: ReadHalf,
    out: Arc<Mutex<Output>>,
}

/// The driving task's side: writes the buffer out after each poll of the connection.
pub(crate) struct Writer {
    out: Arc<Mutex<Output>>,
}

struct Output {
    write: WriteHalf,
    buf: BytesMut,
}

/// The stream split into the connection's I/O and the writer of its task.
pub(crate) fn split(stream: Stream) -> (BatchedIo, Writer) {
    let (read, write) = match stream {
        Either::Left(Either::Left(tcp)) => {
            let (read, write) = tcp.into_split();
            (
                Either::Left(Either::Left(read)),
                Either::Left(Either::Left(write)),
            )
        }
        Either::Left(Either::Right(unix)) => {
            let (read, write) = unix.into_split();
            (
                Either::Left(Either::Right(read)),
                Either::Left(Either::Right(write)),
            )
        }
        Either::Right(tls) => {
            let (read, write) = tokio::io::split(tls);
            (Either::Right(read), Either::Right(write))
        }
    };
    let out = Arc::new(Mutex::new(Output {
        write,
        buf: BytesMut::new(),
    }));
    (
        BatchedIo {
            read,
            out: Arc::clone(&out),
        },
        Writer { out },
    )
}

fn lock(out: &Mutex<Output>) -> MutexGuard<'_, Output> {
    // Only the connection's task touches the buffer; a poisoned lock still holds whole bytes.
    out.lock().unwrap_or_else(|e| e.into_inner())
}

impl Output {
    /// Writes the buffer to the socket until it is empty (`Ready`) or the socket is full
    /// (`Pending`, woken when it takes more).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.buf.is_empty() {
            let n = ready!(Pin::new(&mut self.write).poll_write(cx, &self.buf))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.buf.advance(n);
        }
        // TLS holds records it took but could not send yet: pushed out here (nothing to do
        // on a plain socket).
        Pin::new(&mut self.write).poll_flush(cx)
    }

    /// Room for more: `Ready` while the buffer is below the high-water mark, after trying the
    /// socket once it is not.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.len() >= HIGH_WATER {
            match self.poll_drain(cx) {
                Poll::Ready(result) => result?,
                Poll::Pending if self.buf.len() >= HIGH_WATER => return Poll::Pending,
                Poll::Pending => {}
            }
        }
        Poll::Ready(Ok(HIGH_WATER - self.buf.len()))
    }
}

impl Writer {
    /// Writes out what the connection buffered. `Pending` leaves the task woken when the
    /// socket takes more; an error means the connection cannot go on.
    pub(crate) fn poll_write_out(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.out).poll_drain(cx)
    }
}

impl AsyncRead for BatchedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl AsyncWrite for BatchedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut out = lock(&self.out);
        let room = ready!(out.poll_room(cx))?;
        let n = room.min(data.len());
        out.buf.extend_from_slice(&data[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut out = lock(&self.out);
        let mut room = ready!(out.poll_room(cx))?;
        let mut written = 0;
        for slice in slices {
            let n = room.min(slice.len());
            out.buf.extend_from_slice(&slice[..n]);
            written += n;
            room -= n;
            if room == 0 {
                break;
            }
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        // h2 hands over its frame buffer and a DATA frame's payload together.
        true
    }

    /// Nothing here: the connection's task writes the buffer out after this poll.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = lock(&self.out);
        ready!(out.poll_drain(cx))?;
        Pin::new(&mut out.write).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    async fn pair() -> (BatchedIo, Writer, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (io, writer) = split(Either::Left(Either::Left(client.expect("connect"))));
        (io, writer, accepted.expect("accept").0)
    }

    #[tokio::test]
    async fn writes_wait_in_the_buffer_until_the_task_writes_them_out() {
        let (mut io, writer, mut peer) = pair().await;
        io.write_all(b"one ").await.expect("buffered");
        let taken = io
            .write_vectored(&[IoSlice::new(b"two "), IoSlice::new(b"three")])
            .await
            .expect("buffered");
        assert_eq!(taken, 9, "both slices are taken whole");
        io.flush().await.expect("a flush does nothing");
        assert_eq!(lock(&io.out).buf.as_ref(), b"one two three");
        poll_fn(|cx| writer.poll_write_out(cx))
            .await
            .expect("written out");
        assert!(lock(&io.out).buf.is_empty());
        let mut got = [0; 13];
        peer.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"one two three");
    }

    #[tokio::test]
    async fn the_buffer_stops_at_the_high_water_mark_while_the_peer_does_not_read() {
        let (mut io, _writer, mut peer) = pair().await;
        let chunk = vec![7u8; 16 * 1024];
        // The peer does not read: the socket's buffers fill, then ours up to its mark, and a
        // write then waits instead of growing the buffer.
        let mut sent = 0usize;
        loop {
            let wrote = poll_fn(|cx| match Pin::new(&mut io).poll_write(cx, &chunk) {
                Poll::Pending => Poll::Ready(None),
                Poll::Ready(result) => Poll::Ready(Some(result)),
            })
            .await;
            match wrote {
                Some(result) => sent += result.expect("a write"),
                None => break,
            }
            assert!(lock(&io.out).buf.len() <= HIGH_WATER);
            assert!(
                sent < 64 * 1024 * 1024,
                "a peer that reads nothing took 64 MiB"
            );
        }
        assert_eq!(lock(&io.out).buf.len(), HIGH_WATER);
        // Once the peer reads, shutting down writes everything that was accepted.
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            peer.read_to_end(&mut all).await.expect("read");
            all.len()
        });
        io.shutdown().await.expect("shutdown");
        assert_eq!(reader.await.expect("reader"), sent);
    }
}
