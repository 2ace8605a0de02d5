//! Connecting to the service over TCP or a Unix socket, and the backoff between failed
//! attempts.

use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::{AuthzError, Endpoint};

const FIRST_BACKOFF: Duration = Duration::from_millis(25);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A connection to the service.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

pub(crate) async fn connect(endpoint: &Endpoint) -> io::Result<Stream> {
    match endpoint {
        Endpoint::Tcp(addr) => {
            let stream = TcpStream::connect(addr).await?;
            // Checks are small messages waiting for an answer: never hold them back.
            stream.set_nodelay(true)?;
            Ok(Stream::Tcp(stream))
        }
        Endpoint::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path).await?)),
    }
}

/// After a failed connect, further attempts wait (25 ms doubling to 1 s): while the service is
/// down, checks fail at once instead of each paying a connect attempt.
#[derive(Default)]
pub(crate) struct Backoff {
    state: Mutex<Option<(Instant, Duration)>>,
}

impl Backoff {
    /// `Err` while the last failure's wait has not passed.
    pub(crate) fn check(&self, endpoint: &Endpoint) -> Result<(), AuthzError> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *state {
            Some((until, _)) if Instant::now() < until => Err(AuthzError::Backoff {
                endpoint: endpoint.clone(),
                retry_in: until - Instant::now(),
            }),
            _ => Ok(()),
        }
    }

    pub(crate) fn failed(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let delay = state.map_or(FIRST_BACKOFF, |(_, d)| (d * 2).min(MAX_BACKOFF));
        *state = Some((Instant::now() + delay, delay));
    }

    pub(crate) fn succeeded(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
