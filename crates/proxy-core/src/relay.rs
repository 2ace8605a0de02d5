//! Bytes copied from one socket to another, with at most a buffer's worth held: what an
//! upgraded HTTP connection and a `tcp_proxy` connection are once their upstream is open.

use std::cell::Cell;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// Copies `from` to `to` until `from` ends (then shuts `to`'s write side: a half close).
pub(crate) async fn pipe<R, W>(
    mut from: R,
    mut to: W,
    buffer: usize,
    activity: &Cell<Instant>,
    mut moved: impl FnMut(usize),
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; buffer];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        activity.set(Instant::now());
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
        activity.set(Instant::now());
        moved(n);
    }
}
