//! The connection's side of a tunnel on Legate's own codec: a CONNECT's stream, once its 2xx
//! has gone, carries the relay's bytes as DATA, as far as the client's windows and the
//! connection's output bound take them (context/stream_tunnel.rs is the relay's side).

use std::io;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;

use super::connection::Shared;
use crate::context::stream_tunnel::StreamSink;

/// One stream of the connection, written to by a relay.
pub(super) struct StreamEnd {
    pub(super) shared: Rc<Shared>,
    pub(super) id: u32,
}

impl StreamSink for StreamEnd {
    fn poll_send(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            if self.shared.is_closed() {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            let sent = {
                let mut codec = self.shared.codec.borrow_mut();
                // At least a byte is offered, so a stream without room is marked as waiting.
                let room = codec.send_capacity(self.id).max(1).min(buf.len());
                let mut data = Bytes::copy_from_slice(&buf[..room]);
                if codec.send_data(self.id, &mut data, false).is_err() {
                    return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
                }
                room - data.len()
            };
            if sent > 0 {
                self.shared.wake.wake();
                return Poll::Ready(Ok(sent));
            }
            match self.shared.poll_send_ready(cx, self.id) {
                Poll::Ready(true) => {}
                Poll::Ready(false) => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn end(&self) -> io::Result<()> {
        let sent = (self.shared.codec.borrow_mut()).send_data(self.id, &mut Bytes::new(), true);
        self.shared.wake.wake();
        sent.map_err(|_| io::ErrorKind::BrokenPipe.into())
    }

    fn close(&self, ended: bool) {
        self.shared.finish(self.id, ended);
    }
}
