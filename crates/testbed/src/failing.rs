//! Origins that misbehave at the TCP level, for testing the proxy's 502 and timeout handling.
//! They speak no HTTP at all: they only look for the end of a request head.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::handle::{NoopHandle, Shared, listen};

/// A request head larger than this is treated as complete; these origins misbehave anyway.
const MAX_HEAD: usize = 64 * 1024;

/// How a [`FailingOrigin`] fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureMode {
    /// Read the request head, then close the socket without answering.
    CloseWithoutResponse,
    /// Read the request head, then write `garbage\r\n\r\n` (not HTTP) and close.
    GarbageResponse,
    /// Read and discard whatever arrives, never answer, keep the socket open until shutdown.
    NeverRespond,
}

/// An origin that accepts TCP connections and then fails per its [`FailureMode`].
#[derive(Debug)]
pub struct FailingOrigin;

impl FailingOrigin {
    /// Binds `addr` (port 0 allowed) and serves on the current tokio runtime. In the handle,
    /// `connections()` counts accepts and `requests()` counts request heads read.
    pub async fn bind(addr: SocketAddr, mode: FailureMode) -> io::Result<NoopHandle> {
        let (handle, accept) =
            listen(addr, move |stream, shared| misbehave(stream, shared, mode)).await?;
        tokio::spawn(accept);
        Ok(handle)
    }
}

async fn misbehave(mut stream: TcpStream, shared: Arc<Shared>, mode: FailureMode) {
    let stopped = shared.stopped();
    let fail = async {
        if !read_head(&mut stream).await {
            return;
        }
        shared.count_request();
        match mode {
            // Returning drops the stream: FIN, or RST if request bytes are still unread.
            FailureMode::CloseWithoutResponse => {}
            FailureMode::GarbageResponse => {
                let _ = stream.write_all(b"garbage\r\n\r\n").await;
                let _ = stream.shutdown().await;
            }
            FailureMode::NeverRespond => {
                // Keep reading so the client's writes never block; after EOF just hold on.
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(1..) = stream.read(&mut buf).await {}
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = fail => {}
        () = stopped => {}
    }
}

/// Reads until a blank line ends the request head (an HTTP/2 preface has one too). Returns
/// `false` if the client went away first.
async fn read_head(stream: &mut TcpStream) -> bool {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        // Only the new bytes plus the 3 before them can complete a "\r\n\r\n".
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if head[from..].windows(4).any(|w| w == b"\r\n\r\n") || head.len() >= MAX_HEAD {
            return true;
        }
    }
}
