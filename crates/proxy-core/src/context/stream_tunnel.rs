//! An HTTP/2 stream on Legate's own codec that a CONNECT (or a WebSocket's extended CONNECT)
//! turns into a tunnel. The request path finds it in the request's body, takes it, and hands
//! it to the relay; once the stream's 2xx has gone, the relay reads the client's DATA from it
//! and writes DATA back, as far as the stream's windows take it. The relay then owns the
//! stream: when it lets go, the stream ends (cleanly if this side sent its end, else reset).

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker, ready};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::stream_inbox::InboxReceiver;

/// The connection's side of a tunnel's stream: what the relay writes goes through it.
pub(crate) trait StreamSink {
    /// Queues what the stream's window and the connection's output take of `buf` (at least
    /// one byte), or registers `cx` to be woken when more can go.
    fn poll_send(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>>;
    /// Ends this side of the stream (`END_STREAM`).
    fn end(&self) -> io::Result<()>;
    /// The tunnel is over: the stream closes, without error if `ended` (this side sent its
    /// end), reset otherwise.
    fn close(&self, ended: bool);
}

/// Where a tunnel's stream stands, shared by the stream's task and the relay.
#[derive(Default)]
pub(crate) struct Opening {
    state: Cell<Open>,
    relay: Cell<Option<Waker>>,
}

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Open {
    /// In the request, not taken by the request path.
    #[default]
    Untaken,
    /// Taken by the request path for a relay.
    Taken,
    /// The 2xx has gone: the relay owns the stream.
    Opened,
    /// Answered otherwise, or the stream went: no tunnel.
    Refused,
}

impl Opening {
    /// Whether a relay waits for the stream (it was taken and is still held).
    pub(crate) fn is_awaited(self: &Rc<Self>) -> bool {
        self.state.get() == Open::Taken && Rc::strong_count(self) > 1
    }

    /// No tunnel opened (the stream was answered otherwise, or went), unless one did.
    pub(crate) fn settle_unopened(&self) {
        if self.state.get() != Open::Opened {
            self.settle(false);
        }
    }

    /// The stream's 2xx has gone (`true`), or it was answered otherwise (`false`).
    pub(crate) fn settle(&self, opened: bool) {
        self.state
            .set(if opened { Open::Opened } else { Open::Refused });
        if let Some(relay) = self.relay.take() {
            relay.wake();
        }
    }
}

/// The client's HTTP/2 stream as a tunnel: reads its DATA, writes DATA to it.
pub(crate) struct StreamTunnel {
    body: InboxReceiver,
    sink: Rc<dyn StreamSink>,
    opening: Rc<Opening>,
    /// What the last DATA frame had left once the reader's buffer was full.
    unread: Bytes,
    /// This side sent its end.
    ended: bool,
}

impl StreamTunnel {
    pub(crate) fn new(body: InboxReceiver, sink: Rc<dyn StreamSink>) -> (Self, Rc<Opening>) {
        let opening = Rc::new(Opening::default());
        let tunnel = Self {
            body,
            sink,
            opening: Rc::clone(&opening),
            unread: Bytes::new(),
            ended: false,
        };
        (tunnel, opening)
    }

    /// Marks the stream as taken for a relay.
    pub(super) fn mark_taken(&self) {
        self.opening.state.set(Open::Taken);
    }

    /// Resolves once the stream's 2xx has gone (`true`), or it was answered otherwise or
    /// went away (`false`).
    pub(crate) async fn opened(&self) -> bool {
        std::future::poll_fn(|cx| match self.opening.state.get() {
            Open::Opened => Poll::Ready(true),
            Open::Refused => Poll::Ready(false),
            Open::Untaken | Open::Taken => {
                self.opening.relay.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}

impl AsyncRead for StreamTunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !self.unread.is_empty() {
                let n = self.unread.len().min(buf.remaining());
                buf.put_slice(&self.unread[..n]);
                self.unread.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(self.body.poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.unread = data,
                    // Trailers end the client's side as END_STREAM does.
                    Err(_) => return Poll::Ready(Ok(())),
                },
                Some(Err(error)) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, error)));
                }
                None => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl AsyncWrite for StreamTunnel {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.ended {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.sink.poll_send(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection's task writes what was queued.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.ended {
            self.ended = true;
            self.sink.end()?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for StreamTunnel {
    fn drop(&mut self) {
        // Before the 2xx the stream's task still owns the stream.
        if self.opening.state.get() == Open::Opened {
            self.sink.close(self.ended);
        }
    }
}
