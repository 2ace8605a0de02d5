//! The connection and its unary calls: a call is one request on the h2 crate directly, its
//! message sent as the request's only DATA frame; the answer read as one message and the
//! trailers' `grpc-status`. Nothing is spawned per call, and nothing sits between the call and
//! the connection (a tonic client over hyper cost more than the rest of the request).

use std::future::{Future as _, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use h2::RecvStream;
use h2::client::SendRequest;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};

use crate::batched_writes;
use crate::duplex::DuplexCall;
use crate::frame::FRAME_PREFIX;
use crate::status::{code_of_http_status, grpc_status, status};
use crate::transport::{Backoff, connect};
use crate::{ChannelError, Endpoint, Tls};

type Sender = SendRequest<Bytes>;

const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const INITIAL_MAX_SEND_STREAMS: usize = 100;
const MAX_SEND_BUFFER: usize = 1024 * 1024;
const MAX_HEADER_LIST: u32 = 16 * 1024;

/// How a call failed without an answer, by how far it got: what a retry policy tells apart.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No connection: nothing reached the service.
    #[error(transparent)]
    Connect(ChannelError),
    /// The connection failed once the call was on its way.
    #[error(transparent)]
    Reset(ChannelError),
    /// The service refused the call's stream, unseen (REFUSED_STREAM, or above a GOAWAY's
    /// last stream).
    #[error(transparent)]
    Refused(ChannelError),
}

impl From<CallError> for ChannelError {
    fn from(failed: CallError) -> Self {
        match failed {
            CallError::Connect(e) | CallError::Reset(e) | CallError::Refused(e) => e,
        }
    }
}

/// The open connection: its sender, and whether the task driving it has ended.
struct Conn {
    sender: Sender,
    closed: Arc<AtomicBool>,
}

/// One service's connection, made on first use and again after it fails. Cheap to share by
/// reference within a thread; make one per worker thread for one connection per worker.
pub struct Channel {
    endpoint: Endpoint,
    /// The open connection, if any.
    conn: Mutex<Option<Conn>>,
    /// Held while connecting, so a burst of calls opens one connection.
    connecting: tokio::sync::Mutex<()>,
    backoff: Backoff,
    tls: Option<Tls>,
}

impl Channel {
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            backoff: Backoff::default(),
            tls: None,
        }
    }

    /// Calls go over TLS (`h2` offered by ALPN); their URIs should say `https`.
    pub fn set_tls(&mut self, tls: Tls) {
        let mut config = (*tls.config).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        self.tls = Some(Tls {
            config: Arc::new(config),
            server_name: tls.server_name,
        });
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The connect back-off: a retry should not come before it allows a connect.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// Whether a connection is open.
    pub fn is_connected(&self) -> bool {
        self.live().is_some()
    }

    /// Opens the connection if none is (within the backoff): for a caller whose calls have a
    /// deadline shorter than a connect, run on a task of its own so the connect completes.
    pub async fn connect(&self) -> Result<(), ChannelError> {
        self.sender().await.map(drop)
    }

    fn live(&self) -> Option<Sender> {
        let mut slot = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(conn) if !conn.closed.load(Ordering::Acquire) => Some(conn.sender.clone()),
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    async fn sender(&self) -> Result<Sender, ChannelError> {
        if let Some(sender) = self.live() {
            return Ok(sender);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(sender) = self.live() {
            return Ok(sender);
        }
        self.backoff
            .check()
            .map_err(|retry_in| ChannelError::Backoff {
                endpoint: self.endpoint.clone(),
                retry_in,
            })?;
        let connected = async {
            let stream = connect(&self.endpoint, self.tls.as_ref()).await?;
            let (io, writer) = batched_writes::split(stream);
            // Windows wide enough that a thousand answers in flight never wait for
            // WINDOW_UPDATEs, and at most 100 streams opened before the service's SETTINGS
            // say how many it takes.
            h2::client::Builder::new()
                .initial_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .initial_max_send_streams(INITIAL_MAX_SEND_STREAMS)
                .max_send_buffer_size(MAX_SEND_BUFFER)
                .max_header_list_size(MAX_HEADER_LIST)
                .handshake(io)
                .await
                .map(|(sender, connection)| (sender, connection, writer))
                .map_err(std::io::Error::other)
        }
        .await;
        let (sender, mut connection, writer) = match connected {
            Ok(pair) => pair,
            Err(source) => {
                self.backoff.failed();
                return Err(ChannelError::Connect {
                    endpoint: self.endpoint.clone(),
                    source,
                });
            }
        };
        self.backoff.succeeded();
        let closed = Arc::new(AtomicBool::new(false));
        let ended = Arc::clone(&closed);
        let endpoint = self.endpoint.clone();
        tokio::spawn(async move {
            // One write of everything the poll buffered: calls made in the same turn share it.
            let ended_with = poll_fn(|cx| {
                let polled = Pin::new(&mut connection).poll(cx);
                if let Poll::Ready(Err(error)) = writer.poll_write_out(cx) {
                    return Poll::Ready(Err(error.to_string()));
                }
                polled.map_err(|error| error.to_string())
            })
            .await;
            if let Err(error) = ended_with {
                tracing::debug!(%endpoint, %error, "gRPC service connection ended");
            }
            ended.store(true, Ordering::Release);
        });
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(Conn {
            sender: sender.clone(),
            closed,
        });
        Ok(sender)
    }

    /// One unary call, up to its answer's head: `head` (see [`call_head`]) and the framed
    /// message (see [`crate::unary_frame`]) as its only DATA frame.
    pub async fn call(
        &self,
        head: Request<()>,
        frame: Bytes,
    ) -> Result<Response<RecvStream>, CallError> {
        let sender = self.sender().await.map_err(CallError::Connect)?;
        let call = async {
            let mut sender = sender.ready().await?;
            let (response, mut request_body) = sender.send_request(head, false)?;
            request_body.send_data(frame, true)?;
            response.await
        };
        call.await.map_err(call_error)
    }

    /// Opens a streaming call (a bidirectional gRPC method): its messages are sent and read
    /// one at a time (see [`DuplexCall`]).
    pub async fn open(&self, head: Request<()>) -> Result<DuplexCall, CallError> {
        let sender = self.sender().await.map_err(CallError::Connect)?;
        let opened = async {
            let mut sender = sender.ready().await?;
            sender.send_request(head, false)
        };
        let (response, send) = opened.await.map_err(call_error)?;
        Ok(DuplexCall::new(send, response))
    }
}

/// The head of a call to `uri` (the service's method path on it).
pub fn call_head(uri: Uri) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = Method::POST;
    *head.uri_mut() = uri;
    let headers = head.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    head
}

/// How far a failed call got.
fn call_error(e: h2::Error) -> CallError {
    let failed = transport(&e);
    // Refused, or above a GOAWAY's last stream: the service never processed it.
    if e.reason() == Some(h2::Reason::REFUSED_STREAM) || (e.is_go_away() && e.is_remote()) {
        CallError::Refused(failed)
    } else {
        CallError::Reset(failed)
    }
}

fn transport(error: &h2::Error) -> ChannelError {
    crate::transport_error(error)
}

/// A unary answer's one message (without its prefix), once its status says OK; an answer
/// over `max_message` bytes is refused.
pub async fn read_unary(
    response: Response<RecvStream>,
    max_message: usize,
) -> Result<Bytes, ChannelError> {
    let (head, mut body) = response.into_parts();
    if head.status != StatusCode::OK {
        return Err(status(
            code_of_http_status(head.status),
            format!("the service answered HTTP {}", head.status),
        ));
    }
    // A trailers-only answer: the status is in the head, and there is no message.
    if let Some(outcome) = grpc_status(&head.headers) {
        outcome?;
        return Err(status(
            tonic::Code::Internal,
            "an OK answer without a message",
        ));
    }
    // Usually the message is one DATA frame, kept as it came; more are gathered.
    let mut message = Bytes::new();
    let mut gathered = BytesMut::new();
    while let Some(data) = body.data().await {
        let data = data.map_err(|e| transport(&e))?;
        // The window is given back as data arrives: the answer is bounded below, not by it.
        let _ = body.flow_control().release_capacity(data.len());
        if message.len() + gathered.len() + data.len() > FRAME_PREFIX + max_message {
            return Err(status(
                tonic::Code::ResourceExhausted,
                format!("an answer larger than {max_message} bytes"),
            ));
        }
        if message.is_empty() && gathered.is_empty() {
            message = data;
        } else {
            if gathered.is_empty() {
                gathered.extend_from_slice(&std::mem::take(&mut message));
            }
            gathered.extend_from_slice(&data);
        }
    }
    let trailers = body.trailers().await.map_err(|e| transport(&e))?;
    match trailers.as_ref().and_then(grpc_status) {
        Some(outcome) => outcome?,
        None => {
            return Err(status(
                tonic::Code::Internal,
                "an answer without grpc-status",
            ));
        }
    }
    let frame = if gathered.is_empty() {
        message
    } else {
        gathered.freeze()
    };
    unframe(frame)
}

/// The one message of a unary answer's frame.
fn unframe(mut frame: Bytes) -> Result<Bytes, ChannelError> {
    let Some(prefix) = frame.first_chunk::<FRAME_PREFIX>().copied() else {
        return Err(status(
            tonic::Code::Internal,
            "an OK answer without a message",
        ));
    };
    if prefix[0] != 0 {
        // No compression was offered, so none may be used.
        return Err(status(tonic::Code::Internal, "a compressed answer"));
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    let message = frame.split_off(FRAME_PREFIX);
    if message.len() != len {
        return Err(status(
            tonic::Code::Internal,
            format!(
                "an answer framed as {len} bytes with {} bytes after the prefix",
                message.len()
            ),
        ));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::unary_frame;

    #[test]
    fn an_answer_is_one_uncompressed_frame_of_its_message() {
        let framed = unary_frame(b"message");
        assert_eq!(
            unframe(framed.clone()).ok(),
            Some(Bytes::from_static(b"message"))
        );
        // Short, long, compressed, or no message at all: errors, not a guess.
        for bad in [
            framed.slice(..framed.len() - 1),
            Bytes::from([&framed[..], b"x"].concat()),
            Bytes::from_static(&[1, 0, 0, 0, 0]),
            Bytes::new(),
        ] {
            assert!(matches!(
                unframe(bad),
                Err(ChannelError::Status {
                    code: tonic::Code::Internal,
                    ..
                })
            ));
        }
    }

    /// A service on 127.0.0.1 that answers every call with `message`, its frame cut into
    /// DATA frames at `cuts`, and an OK status in the trailers.
    async fn service_sending_pieces(message: &'static [u8], cuts: Vec<usize>) -> Endpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let framed = unary_frame(message);
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.expect("accept");
            let mut conn = h2::server::handshake(socket).await.expect("handshake");
            while let Some(Ok((_request, mut respond))) = conn.accept().await {
                let head = http::Response::builder()
                    .header(CONTENT_TYPE, "application/grpc")
                    .body(())
                    .expect("head");
                let mut body = respond.send_response(head, false).expect("head sent");
                let mut from = 0;
                for &cut in cuts.iter().chain([&framed.len()]) {
                    body.send_data(framed.slice(from..cut), false)
                        .expect("data sent");
                    from = cut;
                }
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                body.send_trailers(trailers).expect("trailers sent");
            }
        });
        Endpoint::Tcp(addr)
    }

    #[tokio::test]
    async fn an_answer_in_several_data_frames_is_read_whole() {
        let message: &'static [u8] = &[7; 300];
        // Whole; cut inside the prefix; an empty frame first; three pieces.
        for cuts in [vec![], vec![2], vec![0, 5], vec![1, 100, 200]] {
            let endpoint = service_sending_pieces(message, cuts.clone()).await;
            let channel = Channel::new(endpoint);
            let uri = Uri::from_static("http://service/a.B/C");
            let answer = channel
                .call(call_head(uri), unary_frame(b"ask"))
                .await
                .expect("an answer");
            let read = read_unary(answer, 1024).await.expect("a message");
            assert_eq!(&read[..], message, "cut at {cuts:?}");
        }
    }
}
