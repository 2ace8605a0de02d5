//! One HTTP/1.1 response written: the head, then the body's frames as they come, gathered
//! into one write while they are ready (a small response leaves in a single write) and
//! written as soon as the body has to wait.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use h1::{Answering, ResponseLength};
use http::Response;
use http_body::Body;
use tokio::io::AsyncWrite;

use super::Shared;
use crate::buffer_pool;
use crate::http::ResponseBody;

/// Frames at least this large are written from their own memory, not copied.
const COPY_BELOW: usize = 8 * 1024;

pub(super) enum Written {
    /// The whole response is out; whether its head lets the connection stay open.
    Complete { keep_alive: bool },
    /// The body failed, or the client went away: the connection must close.
    Failed,
}

/// Writes `response`, gathering at most `buffer` bytes before writing; with `keep_case`, its
/// names as the upstream spelled them. Its header map goes back to the worker's pool; the
/// caller drops the rest.
///
/// The response is borrowed where the exchange keeps it, not moved in: a move copies it
/// (312 bytes) into this future, and again as the future is started.
pub(super) async fn response(
    input: &Shared,
    response: &mut Response<ResponseBody>,
    answering: Answering,
    buffer: usize,
    keep_case: bool,
) -> Written {
    // The worker's pooled buffers serve writes too: no allocation per response.
    let mut out = OutBuffer(buffer_pool::take());
    let out = &mut out.0;
    // A 100 (Continue) already begun goes out whole before the final response.
    if poll_fn(|cx| input.borrow_mut().poll_finish_continue(cx))
        .await
        .is_err()
    {
        return Written::Failed;
    }
    let case = if keep_case {
        response.extensions().get::<h1::HeaderCase>()
    } else {
        None
    };
    let framed = h1::encode_head_cased(
        response.status(),
        response.headers(),
        case,
        response.body().size_hint().exact(),
        answering,
        out,
    );
    // Its fields are written: the map goes back to the worker's pool for the next head.
    h1::recycle_header_map(std::mem::take(response.headers_mut()));
    let body = response.body_mut();
    let mut sent = 0u64;
    let mut ended = framed.length == ResponseLength::NoBody;
    while !ended {
        let frame = match poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                // Nothing more yet: what is gathered goes out while the body waits.
                if write_all(input, out, None).await.is_err() {
                    return Written::Failed;
                }
                poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
            }
        };
        let frame = match frame {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(err)) => {
                tracing::debug!(error = %err, "response body failed mid-way");
                // What was whole goes out; the close tells the client the rest is missing.
                let _ = write_all(input, out, None).await;
                return Written::Failed;
            }
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let (Ok(trailers), ResponseLength::Chunked) =
                    (frame.into_trailers(), framed.length)
                {
                    h1::encode_last_chunk(Some(&trailers), out);
                    ended = true;
                }
                continue;
            }
        };
        sent += data.len() as u64;
        if let ResponseLength::Length(declared) = framed.length
            && sent > declared
        {
            tracing::debug!(declared, "response body longer than its length");
            let _ = write_all(input, out, None).await;
            return Written::Failed;
        }
        let large = data.len() >= COPY_BELOW;
        if framed.length == ResponseLength::Chunked {
            if large {
                h1::encode_chunk_header(data.len(), out);
                let mut data = data;
                if write_all(input, out, Some(&mut data)).await.is_err() {
                    return Written::Failed;
                }
                out.extend_from_slice(b"\r\n");
            } else {
                h1::encode_chunk(&data, out);
            }
        } else if large {
            let mut data = data;
            if write_all(input, out, Some(&mut data)).await.is_err() {
                return Written::Failed;
            }
        } else {
            out.extend_from_slice(&data);
        }
        if out.len() >= buffer && write_all(input, out, None).await.is_err() {
            return Written::Failed;
        }
    }
    if framed.length == ResponseLength::Chunked && !ended {
        h1::encode_last_chunk(None, out);
    }
    if write_all(input, out, None).await.is_err() {
        return Written::Failed;
    }
    if let ResponseLength::Length(declared) = framed.length
        && sent < declared
    {
        tracing::debug!(declared, sent, "response body shorter than its length");
        return Written::Failed;
    }
    Written::Complete {
        keep_alive: framed.keep_alive,
    }
}

/// The write buffer, back to the worker's pool however the write ends (a dropped exchange
/// included).
struct OutBuffer(BytesMut);

impl Drop for OutBuffer {
    fn drop(&mut self) {
        buffer_pool::give(std::mem::take(&mut self.0));
    }
}

/// Writes `out`, then `data` if given (in one vectored write where the socket takes it), and
/// flushes.
async fn write_all(
    input: &Shared,
    out: &mut BytesMut,
    mut data: Option<&mut Bytes>,
) -> io::Result<()> {
    poll_fn(|cx| {
        let mut input = input.borrow_mut();
        let io = &mut input.io;
        loop {
            let rest = data.as_deref().map_or(&[][..], |d| &d[..]);
            if out.is_empty() && rest.is_empty() {
                break;
            }
            let slices = [io::IoSlice::new(out), io::IoSlice::new(rest)];
            let n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let from_out = n.min(out.len());
            out.advance(from_out);
            if let Some(data) = data.as_deref_mut() {
                data.advance(n - from_out);
            }
        }
        Pin::new(&mut *io).poll_flush(cx)
    })
    .await
}
