//! An external processor (`envoy.service.ext_proc.v3.ExternalProcessor/Process`) that changes
//! what it is sent, by what the request's path holds:
//!
//! - `/immediate...`: answers the request itself: 403, `x-processor: denied`, the body
//!   `denied by the processor`.
//! - `/hang...`: never answers (a processor too slow for the message timeout).
//! - `/spurious...`: answers the request headers with an answer about response headers.
//! - `/error...`: ends the stream with gRPC status INTERNAL.
//! - `/done...`: ends the stream with status OK, unanswered (the processor has finished).
//! - `/reroute...`: sets `:path` to `/rerouted` and asks for the route to be matched again.
//! - `/replace...`: replaces the request body with `replaced by the processor`
//!   (CONTINUE_AND_REPLACE, in its answer to the request headers).
//! - anything else: sets `x-processed-request: yes`, removes `x-remove-me`, and tries to set
//!   `host` and `x-envoy-forged` (which the proxy must refuse).
//!
//! - `/body-immediate...`: answers the request itself (as `/immediate`) on the first body message.
//! - `/body-hang...`: never answers a body message.
//!
//! A request body is answered with the body in capitals and `x-request-body-length`; response
//! headers with `x-processed-response: yes` (and `:status` 201 for `/created...`); a
//! response body with ` [processed]` after it. Each message received is recorded as a line
//! (`request_headers eos=false`, `request_body 5 eos=true`, ...), with the request headers seen.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingRequest, ProcessingResponse, body_mutation, common_response::ResponseStatus,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::Stream;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

/// What the processor saw: a line per message, and the request headers of each stream.
#[derive(Default)]
struct Seen {
    lines: Vec<String>,
    request_headers: Vec<Vec<(String, String)>>,
    /// Streams the proxy ended as a client ends a call (a half close), and streams it reset
    /// or that failed.
    ended: u64,
    cancelled: u64,
}

#[derive(Clone)]
struct Processor {
    seen: Arc<Mutex<Seen>>,
    /// Whether what it sees is recorded (not in a benchmark, where it would only grow).
    record: bool,
}

fn set(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        ..Default::default()
    }
}

fn go_on(
    set_headers: Vec<HeaderValueOption>,
    remove: Vec<String>,
    body: Option<Vec<u8>>,
) -> CommonResponse {
    CommonResponse {
        status: if body.is_some() {
            ResponseStatus::ContinueAndReplace
        } else {
            ResponseStatus::Continue
        } as i32,
        header_mutation: Some(HeaderMutation {
            set_headers,
            remove_headers: remove,
        }),
        body_mutation: body.map(|b| BodyMutation {
            mutation: Some(body_mutation::Mutation::Body(b)),
        }),
        ..Default::default()
    }
}

fn answer(response: Answer) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// The processor's own answer to the client.
fn denied() -> ProcessingResponse {
    answer(Answer::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus { code: 403 }),
        headers: Some(HeaderMutation {
            set_headers: vec![set("x-processor", "denied")],
            remove_headers: Vec::new(),
        }),
        body: b"denied by the processor".to_vec(),
        ..Default::default()
    }))
}

impl Processor {
    /// Counts how a stream ended (kept whether or not messages are recorded).
    fn count(&self, change: impl FnOnce(&mut Seen)) {
        change(&mut self.seen.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// What a path asks of the answer to a body message, where not the usual one: no answer
    /// (`Some(None)`) or the processor's own.
    fn body_behavior(path: &str) -> Option<Option<ProcessingResponse>> {
        if path.contains("/body-immediate") {
            Some(Some(denied()))
        } else if path.contains("/body-hang") {
            Some(None)
        } else {
            None
        }
    }

    fn note(&self, line: String) {
        if !self.record {
            return;
        }
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lines
            .push(line);
    }

    /// The answer to one message of a stream whose request path is `path`; `None`: none.
    fn answer(
        &self,
        message: Message,
        path: &mut String,
    ) -> Result<Option<ProcessingResponse>, Status> {
        Ok(Some(match message {
            Message::RequestHeaders(headers) => {
                let list: Vec<(String, String)> = (headers.headers.iter().flat_map(|h| &h.headers))
                    .map(|h| {
                        let value = if h.raw_value.is_empty() {
                            h.value.clone()
                        } else {
                            String::from_utf8_lossy(&h.raw_value).into_owned()
                        };
                        (h.key.clone(), value)
                    })
                    .collect();
                *path = (list.iter().find(|(k, _)| k == ":path"))
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                self.note(format!("request_headers eos={}", headers.end_of_stream));
                if self.record {
                    (self.seen.lock().unwrap_or_else(|e| e.into_inner()))
                        .request_headers
                        .push(list);
                }
                if path.contains("/immediate") {
                    denied()
                } else if path.contains("/hang") {
                    return Ok(None);
                } else if path.contains("/spurious") {
                    answer(Answer::ResponseHeaders(HeadersResponse::default()))
                } else if path.contains("/error") {
                    return Err(Status::internal("the processor failed"));
                } else if path.contains("/done") {
                    return Err(Status::ok("finished"));
                } else if path.contains("/reroute") {
                    let mut common = go_on(vec![set(":path", "/rerouted")], Vec::new(), None);
                    common.clear_route_cache = true;
                    answer(Answer::RequestHeaders(HeadersResponse {
                        response: Some(common),
                    }))
                } else if path.contains("/replace") {
                    let common = go_on(
                        Vec::new(),
                        Vec::new(),
                        Some(b"replaced by the processor".to_vec()),
                    );
                    answer(Answer::RequestHeaders(HeadersResponse {
                        response: Some(common),
                    }))
                } else {
                    let common = go_on(
                        vec![
                            set("x-processed-request", "yes"),
                            set("host", "forged.example"),
                            set("x-envoy-forged", "yes"),
                        ],
                        vec!["x-remove-me".into()],
                        None,
                    );
                    answer(Answer::RequestHeaders(HeadersResponse {
                        response: Some(common),
                    }))
                }
            }
            Message::RequestBody(body) => {
                self.note(format!(
                    "request_body {} eos={}",
                    body.body.len(),
                    body.end_of_stream
                ));
                if let Some(answer) = Self::body_behavior(path) {
                    return Ok(answer);
                }
                let length = body.body.len().to_string();
                let common = CommonResponse {
                    header_mutation: Some(HeaderMutation {
                        set_headers: vec![set("x-request-body-length", &length)],
                        remove_headers: Vec::new(),
                    }),
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::Body(
                            body.body.to_ascii_uppercase(),
                        )),
                    }),
                    ..Default::default()
                };
                answer(Answer::RequestBody(BodyResponse {
                    response: Some(common),
                }))
            }
            Message::ResponseHeaders(headers) => {
                self.note(format!("response_headers eos={}", headers.end_of_stream));
                let mut set_headers = vec![set("x-processed-response", "yes")];
                if path.contains("/created") {
                    set_headers.push(set(":status", "201"));
                }
                answer(Answer::ResponseHeaders(HeadersResponse {
                    response: Some(go_on(set_headers, Vec::new(), None)),
                }))
            }
            Message::ResponseBody(body) => {
                self.note(format!(
                    "response_body {} eos={}",
                    body.body.len(),
                    body.end_of_stream
                ));
                if let Some(answer) = Self::body_behavior(path) {
                    return Ok(answer);
                }
                let mut processed = body.body;
                processed.extend_from_slice(b" [processed]");
                let common = CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::Body(processed)),
                    }),
                    ..Default::default()
                };
                answer(Answer::ResponseBody(BodyResponse {
                    response: Some(common),
                }))
            }
            Message::RequestTrailers(_) | Message::ResponseTrailers(_) => {
                return Err(Status::unimplemented("trailers"));
            }
        }))
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let processor = self.clone();
        tokio::spawn(async move {
            let mut path = String::new();
            loop {
                let message = match incoming.message().await {
                    Ok(Some(message)) => message,
                    Ok(None) => {
                        processor.count(|seen| seen.ended += 1);
                        return;
                    }
                    Err(_) => {
                        processor.count(|seen| seen.cancelled += 1);
                        return;
                    }
                };
                let Some(message) = message.request else {
                    continue;
                };
                match processor.answer(message, &mut path) {
                    Ok(Some(answer)) => {
                        if tx.send(Ok(answer)).await.is_err() {
                            return;
                        }
                    }
                    // Hangs: the stream stays open, unanswered, until the proxy gives up.
                    Ok(None) => {}
                    // Finished: the stream ends with OK.
                    Err(status) if status.code() == tonic::Code::Ok => return,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The processor, serving on the runtime it was started on until the runtime ends.
pub struct ExtProcessor {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl ExtProcessor {
    /// Binds `addr` (port 0 for any).
    pub async fn start(addr: SocketAddr) -> io::Result<Self> {
        Self::serve(addr, true).await
    }

    /// Binds `addr` and records nothing it sees: for a benchmark.
    pub async fn start_unrecorded(addr: SocketAddr) -> io::Result<Self> {
        Self::serve(addr, false).await
    }

    async fn serve(addr: SocketAddr, record: bool) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let service = ExternalProcessorServer::new(Processor {
            seen: Arc::clone(&seen),
            record,
        });
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(service.clone());
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, seen })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A line per message received, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lines
            .clone()
    }

    /// The request headers of each stream, oldest first.
    pub fn request_headers(&self) -> Vec<Vec<(String, String)>> {
        (self.seen.lock().unwrap_or_else(|e| e.into_inner()))
            .request_headers
            .clone()
    }

    /// Streams the proxy ended with a half close, and streams reset (or failed).
    pub fn stream_ends(&self) -> (u64, u64) {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        (seen.ended, seen.cancelled)
    }

    /// Forgets what it saw.
    pub fn forget(&self) {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Seen::default();
    }
}
