//! gRPC mode: `envoy.service.auth.v3.Authorization/Check` over one HTTP/2 connection.
//!
//! A check is one unary call on the h2 crate directly: the CheckRequest encoded once, into the
//! one buffer that is its gRPC frame and the request's only DATA frame; the answer read as
//! one message and the trailers' `grpc-status`. Nothing is spawned per check, and nothing sits
//! between the call and the connection (a tonic client over hyper cost more than the rest of
//! the request). The connection is exactly one per client, made again after it fails, with
//! backoff.

use std::future::{Future as _, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::auth::v3::CheckResponse;
use h2::RecvStream;
use h2::client::SendRequest;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use prost::Message;

use crate::batched_writes;
use crate::check_encoding::{FRAME_PREFIX, check_frame};
use crate::check_message::decision;
use crate::decision::Decision;
use crate::retry::Failed;
use crate::transport::{Backoff, connect};
use crate::{AuthzError, CheckInput, Endpoint};

type Sender = SendRequest<Bytes>;

const CHECK_URI: &str = "http://ext-authz/envoy.service.auth.v3.Authorization/Check";
const CHECK_PATH: &str = "/envoy.service.auth.v3.Authorization/Check";

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// The largest answer read: gRPC's usual limit on a received message.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const INITIAL_MAX_SEND_STREAMS: usize = 100;
const MAX_SEND_BUFFER: usize = 1024 * 1024;
const MAX_HEADER_LIST: u32 = 16 * 1024;

/// The open connection: its sender, and whether the task driving it has ended.
struct Conn {
    sender: Sender,
    closed: Arc<AtomicBool>,
}

pub(crate) struct GrpcChannel {
    endpoint: Endpoint,
    /// The open connection, if any.
    conn: Mutex<Option<Conn>>,
    /// Held while connecting, so a burst of checks opens one connection.
    connecting: tokio::sync::Mutex<()>,
    backoff: Backoff,
    /// The call's URI, parsed once: a check clones it.
    check_uri: Uri,
    tls: Option<crate::Tls>,
    /// Which failed calls are tried again; `None`: none.
    retry: Option<Arc<dyn crate::CheckRetry>>,
}

impl GrpcChannel {
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            backoff: Backoff::default(),
            check_uri: Uri::from_static(CHECK_URI),
            tls: None,
            retry: None,
        }
    }

    pub(crate) fn set_retry(&mut self, retry: Arc<dyn crate::CheckRetry>) {
        self.retry = Some(retry);
    }

    /// Calls go over TLS, with the `https` scheme.
    pub(crate) fn set_tls(&mut self, tls: crate::Tls) {
        let mut parts = self.check_uri.clone().into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTPS);
        if let Ok(uri) = Uri::from_parts(parts) {
            self.check_uri = uri;
        }
        self.tls = Some(tls);
    }

    /// Calls go with this `:authority`; one that makes no URI keeps the default.
    pub(crate) fn set_authority(&mut self, authority: &str) {
        let scheme = self.check_uri.scheme_str().unwrap_or("http").to_owned();
        if let Ok(uri) = Uri::builder()
            .scheme(scheme.as_str())
            .authority(authority)
            .path_and_query(&CHECK_URI[CHECK_URI.len() - CHECK_PATH.len()..])
            .build()
        {
            self.check_uri = uri;
        }
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

    async fn sender(&self) -> Result<Sender, AuthzError> {
        if let Some(sender) = self.live() {
            return Ok(sender);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(sender) = self.live() {
            return Ok(sender);
        }
        self.backoff.check(&self.endpoint)?;
        let connected = async {
            let stream = connect(&self.endpoint, self.tls.as_ref()).await?;
            let (io, writer) = batched_writes::split(stream);
            // hyper's client settings, which the checks ran on before: windows wide enough
            // that a thousand answers in flight never wait for WINDOW_UPDATEs, and at most 100
            // streams opened before the service's SETTINGS say how many it takes.
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
                return Err(AuthzError::Connect {
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
            // One write of everything the poll buffered: checks made in the same turn share it.
            let ended_with = poll_fn(|cx| {
                let polled = Pin::new(&mut connection).poll(cx);
                if let Poll::Ready(Err(error)) = writer.poll_write_out(cx) {
                    return Poll::Ready(Err(error.to_string()));
                }
                polled.map_err(|error| error.to_string())
            })
            .await;
            if let Err(error) = ended_with {
                tracing::debug!(%endpoint, %error, "authorization service connection ended");
            }
            ended.store(true, Ordering::Release);
        });
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(Conn {
            sender: sender.clone(),
            closed,
        });
        Ok(sender)
    }

    /// One call, then retries as the policy allows (the caller's timeout bounds them all):
    /// a retry reads the answer's head, where a failed call's `grpc-status` is (trailers-only).
    pub(crate) async fn check(&self, input: &CheckInput<'_>) -> Result<Decision, AuthzError> {
        let frame = check_frame(input)?;
        let response = crate::retry::tries(
            self.retry.as_deref(),
            &self.backoff,
            |response: &Response<RecvStream>| (response.status(), response.headers()),
            async || self.call(input, frame.clone()).await,
        )
        .await?;
        decision(read_answer(response).await?)
    }

    /// One Check call, up to its answer's head.
    async fn call(
        &self,
        input: &CheckInput<'_>,
        frame: Bytes,
    ) -> Result<Response<RecvStream>, Failed> {
        let sender = self.sender().await.map_err(Failed::Connect)?;
        let call = async {
            let mut sender = sender.ready().await?;
            let (response, mut request_body) =
                sender.send_request(call_head(input, self.check_uri.clone()), false)?;
            request_body.send_data(frame, true)?;
            response.await
        };
        call.await.map_err(|e| {
            // Refused, or above a GOAWAY's last stream: the service never processed it.
            if e.reason() == Some(h2::Reason::REFUSED_STREAM) || (e.is_go_away() && e.is_remote()) {
                Failed::Refused(transport(e))
            } else {
                Failed::Reset(transport(e))
            }
        })
    }
}

/// The head of a Check call.
fn call_head(input: &CheckInput<'_>, uri: Uri) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = Method::POST;
    *head.uri_mut() = uri;
    let headers = head.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    input.put_trace_context(headers);
    head
}

fn transport(error: h2::Error) -> AuthzError {
    AuthzError::Transport(error.to_string())
}

fn status(code: tonic::Code, message: impl Into<String>) -> AuthzError {
    AuthzError::Status {
        code,
        message: message.into(),
    }
}

/// The answer's one message, once its status says OK.
async fn read_answer(response: Response<RecvStream>) -> Result<CheckResponse, AuthzError> {
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
        let data = data.map_err(transport)?;
        // The window is given back as data arrives: the answer is bounded below, not by it.
        let _ = body.flow_control().release_capacity(data.len());
        if message.len() + gathered.len() + data.len() > FRAME_PREFIX + MAX_ANSWER {
            return Err(status(
                tonic::Code::ResourceExhausted,
                format!("an answer larger than {MAX_ANSWER} bytes"),
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
    let trailers = body.trailers().await.map_err(transport)?;
    match trailers.as_ref().and_then(grpc_status) {
        Some(outcome) => outcome?,
        None => {
            return Err(status(
                tonic::Code::Internal,
                "an answer without grpc-status",
            ));
        }
    }
    decode_frame(if gathered.is_empty() {
        &message
    } else {
        &gathered
    })
}

/// The one message of a unary answer.
fn decode_frame(frame: &[u8]) -> Result<CheckResponse, AuthzError> {
    let Some((prefix, message)) = frame.split_first_chunk::<FRAME_PREFIX>() else {
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
    if message.len() != len {
        return Err(status(
            tonic::Code::Internal,
            format!(
                "an answer framed as {len} bytes with {} bytes after the prefix",
                message.len()
            ),
        ));
    }
    CheckResponse::decode(message).map_err(|e| {
        status(
            tonic::Code::Internal,
            format!("cannot decode the answer: {e}"),
        )
    })
}

/// `grpc-status` (and `grpc-message`) of a head or trailers: `None` if absent.
fn grpc_status(fields: &HeaderMap) -> Option<Result<(), AuthzError>> {
    let value = fields.get(&GRPC_STATUS)?;
    let code = value
        .to_str()
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Unknown, tonic::Code::from_i32);
    if code == tonic::Code::Ok {
        return Some(Ok(()));
    }
    let message = fields
        .get(&GRPC_MESSAGE)
        // Percent-encoded UTF-8.
        .map(|m| {
            percent_encoding::percent_decode(m.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Some(Err(status(code, message)))
}

/// The gRPC status of an answer that is not HTTP 200, as gRPC's HTTP mapping gives it.
fn code_of_http_status(status: StatusCode) -> tonic::Code {
    match status.as_u16() {
        400 => tonic::Code::Internal,
        401 => tonic::Code::Unauthenticated,
        403 => tonic::Code::PermissionDenied,
        404 => tonic::Code::Unimplemented,
        429 | 502..=504 => tonic::Code::Unavailable,
        _ => tonic::Code::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
    use envoy_types::pb::envoy::service::auth::v3::{CheckResponse, DeniedHttpResponse};

    #[test]
    fn an_answer_is_one_uncompressed_frame_of_its_message() {
        let answer = CheckResponse {
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                body: "no".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut framed = vec![0];
        framed.extend_from_slice(&(answer.encoded_len() as u32).to_be_bytes());
        framed.extend_from_slice(&answer.encode_to_vec());
        assert_eq!(decode_frame(&framed).ok(), Some(answer));
        // Short, long, compressed, or no message at all: errors, not a guess.
        for bad in [
            &framed[..framed.len() - 1],
            &[&framed[..], b"x"].concat()[..],
            &[1, 0, 0, 0, 0],
            &[],
        ] {
            assert!(matches!(
                decode_frame(bad),
                Err(AuthzError::Status {
                    code: tonic::Code::Internal,
                    ..
                })
            ));
        }
    }

    /// A service on 127.0.0.1 that answers every check with `answer`, its frame cut into
    /// DATA frames at `cuts`, and an OK status in the trailers.
    async fn service_sending_pieces(answer: CheckResponse, cuts: Vec<usize>) -> Endpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let mut framed = vec![0];
        framed.extend_from_slice(&(answer.encoded_len() as u32).to_be_bytes());
        framed.extend_from_slice(&answer.encode_to_vec());
        let framed = Bytes::from(framed);
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
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                body.send_trailers(trailers).expect("trailers sent");
            }
        });
        Endpoint::Tcp(addr)
    }

    #[tokio::test]
    async fn an_answer_in_several_data_frames_is_read_whole() {
        let denied = CheckResponse {
            status: Some(envoy_types::pb::google::rpc::Status {
                code: tonic::Code::PermissionDenied as i32,
                ..Default::default()
            }),
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                body: "not you".repeat(40),
                ..Default::default()
            })),
            ..Default::default()
        };
        let headers = HeaderMap::new();
        let input = CheckInput {
            method: &Method::GET,
            path: "/",
            host: "example.test",
            scheme: "http",
            version: http::Version::HTTP_11,
            headers: &headers,
            request_id: "1",
            source: "127.0.0.1:1000".parse().expect("address"),
            destination: "127.0.0.1:80".parse().expect("address"),
            context_extensions: &[],
            allowed_headers: None,
            route_metadata: None,
            body: None,
            traceparent: None,
            tracestate: None,
        };
        // Whole; cut inside the prefix; an empty frame first; three pieces.
        for cuts in [vec![], vec![2], vec![0, 5], vec![1, 100, 200]] {
            let endpoint = service_sending_pieces(denied.clone(), cuts.clone()).await;
            let channel = GrpcChannel::new(endpoint);
            let Ok(Decision::Deny(answer)) = channel.check(&input).await else {
                panic!("a denial, cut at {cuts:?}");
            };
            assert_eq!(answer.status, StatusCode::FORBIDDEN, "cut at {cuts:?}");
            assert_eq!(answer.body, "not you".repeat(40), "cut at {cuts:?}");
        }
    }

    #[test]
    fn grpc_status_and_message_are_read_from_the_fields() {
        let mut fields = HeaderMap::new();
        assert!(grpc_status(&fields).is_none());
        fields.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(matches!(grpc_status(&fields), Some(Ok(()))));
        fields.insert("grpc-status", HeaderValue::from_static("14"));
        fields.insert(
            "grpc-message",
            HeaderValue::from_static("down%20for%3A now%2"),
        );
        let Some(Err(AuthzError::Status { code, message })) = grpc_status(&fields) else {
            panic!("a failed status");
        };
        assert_eq!(code, tonic::Code::Unavailable);
        assert_eq!(message, "down for: now%2");
        fields.insert("grpc-status", HeaderValue::from_static("nine"));
        assert!(matches!(
            grpc_status(&fields),
            Some(Err(AuthzError::Status {
                code: tonic::Code::Unknown,
                ..
            }))
        ));
        assert_eq!(
            code_of_http_status(StatusCode::SERVICE_UNAVAILABLE),
            tonic::Code::Unavailable
        );
        assert_eq!(
            code_of_http_status(StatusCode::IM_A_TEAPOT),
            tonic::Code::Unknown
        );
    }
}
