//! One HTTP/2 request on Legate's own codec: served by the request path HTTP/1.1 and HTTP/3
//! take (the same handler, routes, filters and clusters), and its response handed to the
//! codec (head, data, trailers) as fast as the client's windows and the connection's output
//! bound take it.

use std::convert::Infallible;
use std::rc::Rc;

use bytes::Bytes;
use http::header::DATE;
use http::{HeaderValue, Response};
use http_body::Body;
use http_body_util::BodyExt;

use super::connection::Shared;
use crate::context::stream_tunnel::Opening;
use crate::http::ResponseBody;

/// How a stream's task left its stream.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Served {
    /// Its response was cut short (or never sent): the stream is reset.
    Cut,
    /// Its response went whole to the codec.
    Whole,
    /// Its 2xx opened a tunnel, whose relay owns the stream now.
    Tunnel,
}

/// Serves the request whose service future is `served` and sends its response; says how.
/// `tunnel`: the request is a CONNECT, whose stream a relay may be waiting for.
pub(super) async fn serve(
    shared: Rc<Shared>,
    id: u32,
    served: impl Future<Output = Result<Response<ResponseBody>, Infallible>>,
    head_only: bool,
    tunnel: Option<Rc<Opening>>,
) -> Served {
    // However the task ends, a relay waiting for the stream learns it.
    let tunnel = tunnel.map(Settle);
    let Ok(mut response) = served.await;
    if let Some(Settle(opening)) = &tunnel
        && opening.is_awaited()
        && response.status().is_success()
    {
        // A 2xx to CONNECT frames no body: the stream stays open for the tunnel.
        let (mut parts, _) = response.into_parts();
        let opened = send_head(&shared, id, parts.status, &mut parts.headers, false);
        opening.settle(opened);
        return if opened { Served::Tunnel } else { Served::Cut };
    }
    drop(tunnel);
    // Answered where it is: a move into `respond`, or taken apart, would copy it (312 bytes).
    if respond(&shared, id, &mut response, head_only).await {
        Served::Whole
    } else {
        Served::Cut
    }
}

/// Tells a relay waiting for the stream that no tunnel opened, unless one did.
struct Settle(Rc<Opening>);

impl Drop for Settle {
    fn drop(&mut self) {
        self.0.settle_unopened();
    }
}

/// Sends the response head (with a `date` if it has none); `false` if the stream is gone.
fn send_head(
    shared: &Shared,
    id: u32,
    status: http::StatusCode,
    headers: &mut http::HeaderMap,
    end: bool,
) -> bool {
    if !headers.contains_key(DATE) {
        h1::with_date(|date| {
            if let Ok(date) = HeaderValue::from_bytes(date) {
                headers.insert(DATE, date);
            }
        });
    }
    let sent = (shared.codec.borrow_mut()).send_response_head(id, status, headers, end);
    shared.wake.wake();
    // Its fields are encoded (the HPACK table copies what it keeps): the map goes back to the
    // worker's pool for the next head.
    h1::recycle_header_map(std::mem::take(headers));
    sent.is_ok()
}

/// Sends the response: its head, then its body's frames as the windows take them, then the
/// end. `false` when it could not be sent whole (the stream is gone, or the body failed).
async fn respond(
    shared: &Shared,
    id: u32,
    response: &mut Response<ResponseBody>,
    head_only: bool,
) -> bool {
    let end = head_only || response.body().is_end_stream();
    let status = response.status();
    if !send_head(shared, id, status, response.headers_mut(), end) {
        return false;
    }
    let body = response.body_mut();
    if end {
        return true;
    }
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                tracing::debug!(%error, "HTTP/2 response body failed: stream reset");
                return false;
            }
        };
        match frame.into_data() {
            Ok(data) => {
                // The body's end goes on its last DATA frame when the body knows it is last.
                let last = body.is_end_stream();
                if !send_data(shared, id, data, last).await {
                    return false;
                }
                if last {
                    return true;
                }
            }
            Err(frame) => {
                let Ok(trailers) = frame.into_trailers() else {
                    continue;
                };
                let sent = shared.codec.borrow_mut().send_trailers(id, &trailers);
                shared.wake.wake();
                return sent.is_ok();
            }
        }
    }
    send_data(shared, id, Bytes::new(), true).await
}

/// Sends `data` (with the stream's end if `end`), waiting for window and output room as
/// needed. `false` once the stream is gone.
async fn send_data(shared: &Shared, id: u32, mut data: Bytes, end: bool) -> bool {
    loop {
        let sent = shared.codec.borrow_mut().send_data(id, &mut data, end);
        shared.wake.wake();
        if sent.is_err() {
            return false;
        }
        if data.is_empty() {
            return true;
        }
        shared.send_ready(id).await;
    }
}
