//! One HTTP/3 request stream: its head into the request path HTTP/1.1 and HTTP/2 take (the
//! same handler, routes, filters and clusters), its body handed on through a bounded pipe as
//! the client sends it, and the response written back (head, data, trailers) as fast as the
//! client's flow control lets it.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::FutureExt;
use h3::error::Code;
use http::{HeaderMap, Method, Response, StatusCode, Version};
use http_body::Frame;
use http_body_util::BodyExt;

use super::service::ProxyService;
use crate::context::RequestBody;
use crate::context::body_pipe::{PipeSender, body_pipe};
use crate::error::BodyError;
use crate::http::ResponseBody;

type Resolver = h3::server::RequestResolver<super::http3_bounds::Connection, Bytes>;
type SendSide = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
type RecvSide = h3::server::RequestStream<super::http3_bounds::RecvStream, Bytes>;

/// Headers that mean something to one HTTP/1.1 connection only, never sent over HTTP/3
/// (RFC 9114 section 4.2).
static CONNECTION_SPECIFIC: [http::HeaderName; 4] = [
    http::header::CONNECTION,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
    http::header::HeaderName::from_static("keep-alive"),
];

/// How long a stream may be slow, as HTTP/2's: its head within `head`
/// (`request_headers_timeout`), and each move of its body, either way, within `idle`
/// (`stream_idle_timeout`).
#[derive(Clone, Copy)]
pub(super) struct StreamTimers {
    pub(super) head: Duration,
    pub(super) idle: Duration,
}

/// Whether the connection's handshake is still to end: a request read meanwhile came in
/// 0-RTT early data, which whoever saw it could send again (RFC 8470). Once it has ended, the
/// connection is known not to be a replay, even for what it read before. Shared by the
/// connection's requests, on its task.
#[derive(Clone)]
pub(super) struct EarlyData(Rc<RefCell<Handshake>>);

enum Handshake {
    /// Its end is still to come: quinn's signal, which a lost connection raises too.
    Pending(quinn::ZeroRttAccepted, quinn::Connection),
    Done,
    /// The connection was lost before the handshake ended: all it read stays early data.
    Lost,
}

impl EarlyData {
    /// `handshake`: its end, for a connection that took 0-RTT.
    pub(super) fn new(handshake: Option<(quinn::ZeroRttAccepted, quinn::Connection)>) -> Self {
        let state = match handshake {
            Some((end, connection)) => Handshake::Pending(end, connection),
            None => Handshake::Done,
        };
        Self(Rc::new(RefCell::new(state)))
    }

    /// Asked as each request head is read: the handshake's end is seen as soon as the
    /// connection has processed it, even if this task has not been woken for it yet.
    pub(super) fn pending(&self) -> bool {
        let mut state = self.0.borrow_mut();
        if let Handshake::Pending(end, connection) = &mut *state
            && end.now_or_never().is_some()
        {
            // Raised by the handshake's end, or by the connection's loss (a forged close, say,
            // after a replayed first flight): only a connection still up has finished it.
            *state = if connection.close_reason().is_none() {
                Handshake::Done
            } else {
                Handshake::Lost
            };
        }
        !matches!(*state, Handshake::Done)
    }
}

/// The client's body stood still for the stream idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body stood still for the stream idle timeout")]
struct BodyIdle;

/// Reads the request's head, serves it, and writes the response; the stream is reset if the
/// response cannot be finished whole.
pub(super) async fn serve_request(
    resolver: Resolver,
    service: ProxyService,
    timers: StreamTimers,
    early: EarlyData,
) {
    let resolved = tokio::time::timeout(timers.head, resolver.resolve_request()).await;
    let (mut request, stream) = match resolved {
        Ok(Ok(resolved)) => resolved,
        Ok(Err(error)) => {
            tracing::debug!(peer = %service.conn.peer, %error, "HTTP/3 request head refused");
            return;
        }
        Err(_) => {
            service.conn.listener.stats.cx_headers_timeout.inc();
            tracing::debug!(peer = %service.conn.peer, "HTTP/3 request head timed out");
            return;
        }
    };
    let (mut send, mut recv) = stream.split();
    let early = early.pending();
    if early {
        // The request path serves safe methods and answers others 425 Too Early.
        service.conn.listener.stats.rq_early_data.inc();
        request
            .extensions_mut()
            .insert(crate::http::ReceivedInEarlyData);
    }
    if request.method() == Method::CONNECT {
        // Tunnels (RFC 9220 and plain CONNECT) are not served over HTTP/3.
        let refused = Response::builder()
            .status(StatusCode::FORBIDDEN)
            .body(())
            .unwrap_or_default();
        recv.stop_sending(Code::H3_NO_ERROR);
        if send.send_response(refused).await.is_ok() {
            let _ = send.finish().await;
        }
        return;
    }
    let head_only = request.method() == Method::HEAD;
    let started = Started::from_stream(&mut recv);
    // Not a body the request path will refuse unread (425).
    let refused_early = early && !crate::http::is_safe_method(request.method());
    if matches!(started, Started::Waiting)
        && super::expects_continue(request.headers())
        && !refused_early
    {
        // A client waiting to send its body: told to go on at once, as Envoy does by default
        // (the upstream never sees `expect`).
        let go_on = Response::builder()
            .status(StatusCode::CONTINUE)
            .body(())
            .unwrap_or_default();
        if let Err(error) = within(timers.idle, send.send_response(go_on)).await {
            tracing::debug!(%error, "HTTP/3 100 Continue not sent: stream reset");
            send.stop_stream(Code::H3_INTERNAL_ERROR);
            return;
        }
    }
    // Boxed, as hyper boxes a request's service future: the handler's state is large, and
    // this task's, held by the connection per stream, stays small to move.
    if let Started::Empty = started {
        let served = Box::pin(service.serve_inline(request, |(), _| RequestBody::empty()));
        let Ok(response) = served.await;
        respond(&mut send, response, head_only, timers.idle).await;
        return;
    }
    let (sender, receiver) = body_pipe();
    let served = Box::pin(service.serve_inline(request, |(), received| {
        RequestBody::piped(receiver, received)
    }));
    let exchange = async {
        let Ok(response) = served.await;
        respond(&mut send, response, head_only, timers.idle).await;
    };
    // The body goes on after the response begins (an upstream may answer before it has read
    // it all); once the response is over, what the client still sends is not wanted.
    let pumping = pump(started, recv, sender, timers.idle);
    tokio::pin!(exchange, pumping);
    let mut pumped = false;
    loop {
        tokio::select! {
            () = &mut exchange => return,
            () = &mut pumping, if !pumped => pumped = true,
        }
    }
}

/// What of the request's body had come with its head.
enum Started {
    /// Nothing, and nothing will: the head ended the stream.
    Empty,
    /// Nothing yet.
    Waiting,
    /// A first chunk.
    Data(Bytes),
    /// No data; the trailers that end the stream.
    Trailers(HeaderMap),
    /// The data is over; trailers may follow.
    DataEnded,
    Failed(h3::error::StreamError),
}

impl Started {
    /// Looks at what has already arrived, without waiting: most requests have no body, and
    /// those need no pump.
    fn from_stream(recv: &mut RecvSide) -> Self {
        match recv.recv_data().now_or_never() {
            None => Started::Waiting,
            Some(Ok(Some(mut data))) => Started::Data(data.copy_to_bytes(data.remaining())),
            Some(Err(error)) => Started::Failed(error),
            Some(Ok(None)) => match recv.recv_trailers().now_or_never() {
                Some(Ok(None)) => Started::Empty,
                Some(Ok(Some(trailers))) => Started::Trailers(trailers),
                Some(Err(error)) => Started::Failed(error),
                None => Started::DataEnded,
            },
        }
    }
}

/// Feeds the client's body into the pipe the request path reads, frame by frame: the pipe
/// holds two frames at most, and QUIC's stream window holds the client back beyond that.
/// When the request path lets go of the body, the stream's receiving side is dropped, which
/// tells the client to stop sending (STOP_SENDING).
async fn pump(started: Started, mut recv: RecvSide, pipe: PipeSender, idle: Duration) {
    let mut next = Some(started);
    loop {
        let data = match next.take() {
            Some(Started::Data(data)) => Ok(Some(data)),
            Some(Started::Failed(error)) => Err(Box::new(error) as BodyError),
            Some(Started::Trailers(trailers)) => {
                let _ = pipe.send(Frame::trailers(trailers), true).await;
                return;
            }
            Some(Started::DataEnded | Started::Empty) => Ok(None),
            Some(Started::Waiting) | None => tokio::select! {
                data = tokio::time::timeout(idle, recv.recv_data()) => match data {
                    Ok(data) => data
                        .map(|d| d.map(|mut d| d.copy_to_bytes(d.remaining())))
                        .map_err(|e| Box::new(e) as BodyError),
                    Err(_) => Err(Box::new(BodyIdle) as BodyError),
                },
                () = pipe.closed() => return,
            },
        };
        match data {
            Ok(Some(data)) => {
                if !pipe.send(Frame::data(data), false).await {
                    return;
                }
            }
            Ok(None) => break,
            Err(error) => {
                pipe.fail(error).await;
                return;
            }
        }
    }
    let trailers = tokio::select! {
        trailers = tokio::time::timeout(idle, recv.recv_trailers()) => trailers,
        () = pipe.closed() => return,
    };
    match trailers {
        Ok(Ok(Some(trailers))) => {
            let _ = pipe.send(Frame::trailers(trailers), true).await;
        }
        Ok(Ok(None)) => {
            let _ = pipe.send(Frame::data(Bytes::new()), true).await;
        }
        Ok(Err(error)) => pipe.fail(Box::new(error)).await,
        Err(_) => pipe.fail(Box::new(BodyIdle)).await,
    }
}

/// Writes the response: its head, then its body's frames as the client's flow control takes
/// them (each within `idle`), then the stream's end. A response that cannot be finished
/// resets the stream, so the client never takes a cut-short body as whole.
async fn respond(
    send: &mut SendSide,
    response: Response<ResponseBody>,
    head_only: bool,
    idle: Duration,
) {
    let (mut parts, mut body) = response.into_parts();
    strip_connection_specific(&mut parts.headers);
    parts.version = Version::HTTP_3;
    let head = send.send_response(Response::from_parts(parts, ()));
    if let Err(error) = within(idle, head).await {
        tracing::debug!(%error, "HTTP/3 response head not sent: stream reset");
        send.stop_stream(Code::H3_INTERNAL_ERROR);
        return;
    }
    if !head_only {
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(frame) => frame,
                Err(error) => {
                    tracing::debug!(%error, "HTTP/3 response body failed: stream reset");
                    send.stop_stream(Code::H3_INTERNAL_ERROR);
                    return;
                }
            };
            let sent = match frame.into_data() {
                Ok(data) if data.is_empty() => Ok(()),
                Ok(data) => within(idle, send.send_data(data)).await,
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => within(idle, send.send_trailers(trailers)).await,
                    Err(_) => Ok(()),
                },
            };
            if let Err(error) = sent {
                tracing::debug!(%error, "HTTP/3 response not finished: stream reset");
                send.stop_stream(Code::H3_INTERNAL_ERROR);
                return;
            }
        }
    }
    if let Err(error) = send.finish().await {
        tracing::debug!(%error, "HTTP/3 response end not sent");
    }
}

/// A send that must make progress within `idle`: a client that keeps its window shut longer
/// loses the stream.
async fn within(
    idle: Duration,
    send: impl Future<Output = Result<(), h3::error::StreamError>>,
) -> Result<(), BodyError> {
    match tokio::time::timeout(idle, send).await {
        Ok(sent) => sent.map_err(|e| Box::new(e) as BodyError),
        Err(_) => Err("the client took nothing for the stream idle timeout".into()),
    }
}

fn strip_connection_specific(headers: &mut HeaderMap) {
    for name in &CONNECTION_SPECIFIC {
        headers.remove(name);
    }
}
