//! An OpenTelemetry collector for tests: OTLP traces over gRPC (`TraceService/Export`) and
//! over HTTP (a protobuf POST to `/v1/traces`), and OTLP logs over gRPC
//! (`LogsService/Export`), on one port. It keeps every span and log record it receives,
//! flattened for assertions, and can be told to stall or to refuse, so a test can watch an
//! exporter's queue fill and its failures be counted.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type AnyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A span as the collector received it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// Lowercase hex, as in `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub trace_state: String,
    pub name: String,
    /// OTLP's numbering: 2 server, 3 client.
    pub kind: i32,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// OTLP's numbering: 0 unset, 2 error.
    pub status_code: i32,
    /// Values as text (integers and booleans written out).
    pub attributes: BTreeMap<String, String>,
    /// The resource's `service.name`.
    pub service_name: String,
    /// The resource's attributes, values as text.
    pub resource: BTreeMap<String, String>,
    /// `grpc` or `http`: how the span arrived.
    pub protocol: &'static str,
}

/// A log record as the collector received it.
#[derive(Debug, Clone)]
pub struct ReceivedLog {
    pub time_unix_nano: u64,
    /// The body, when it is text.
    pub body: String,
    /// Values as text.
    pub attributes: BTreeMap<String, String>,
    /// The resource's attributes, values as text.
    pub resource: BTreeMap<String, String>,
}

/// What the collector does with an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectorMode {
    Accept,
    /// Holds every export until the mode changes (or the collector stops).
    Stall,
    /// Answers gRPC `UNAVAILABLE` / HTTP 503.
    Refuse,
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    logs: Vec<ReceivedLog>,
    exports: u64,
    callers: Vec<Caller>,
}

/// Who an export said it was for, and what it carried besides spans.
#[derive(Debug, Clone)]
pub struct Caller {
    /// gRPC's `:authority` or HTTP's `host`.
    pub authority: String,
    pub headers: http::HeaderMap,
}

struct State {
    received: Mutex<Received>,
    /// Bumped on every export received, for [`OtlpCollector::wait_for`].
    changed: watch::Sender<u64>,
    mode: watch::Sender<CollectorMode>,
}

/// The collector. Stops when [`shutdown`](Self::shutdown) is called.
pub struct OtlpCollector {
    addr: SocketAddr,
    state: Arc<State>,
    stop: watch::Sender<bool>,
}

impl OtlpCollector {
    /// Binds `addr` (port 0 for any) and serves on the current tokio runtime.
    pub async fn start(addr: SocketAddr) -> io::Result<Self> {
        Self::serve(addr, None).await
    }

    /// The same behind TLS with `config` (which should offer `h2` and `http/1.1`): the
    /// endpoints are then `https://`.
    pub async fn start_tls(
        addr: SocketAddr,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<Self> {
        Self::serve(addr, Some(tokio_rustls::TlsAcceptor::from(config))).await
    }

    async fn serve(addr: SocketAddr, tls: Option<tokio_rustls::TlsAcceptor>) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            received: Mutex::default(),
            changed: watch::Sender::new(0),
            mode: watch::Sender::new(CollectorMode::Accept),
        });
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(accept_loop(listener, tls, Arc::clone(&state), stopped));
        Ok(Self { addr, state, stop })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The gRPC endpoint, `http://ADDR`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The HTTP endpoint, `http://ADDR/v1/traces`.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    pub fn set_mode(&self, mode: CollectorMode) {
        self.state.mode.send_replace(mode);
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        lock(&self.state.received).spans.clone()
    }

    /// Every log record received so far, in arrival order.
    pub fn logs(&self) -> Vec<ReceivedLog> {
        lock(&self.state.received).logs.clone()
    }

    /// Waits until `done` holds for the log records received, or `limit` passes. Returns
    /// whether it held.
    pub async fn wait_for_logs(
        &self,
        limit: Duration,
        mut done: impl FnMut(&[ReceivedLog]) -> bool,
    ) -> bool {
        let mut changed = self.state.changed.subscribe();
        let check = async {
            loop {
                if done(&lock(&self.state.received).logs) {
                    return;
                }
                if changed.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(limit, check).await.is_ok()
    }

    /// Who each export (gRPC call or POST) was addressed to, in order.
    pub fn callers(&self) -> Vec<Caller> {
        lock(&self.state.received).callers.clone()
    }

    /// Export calls received so far (stalled and refused ones included).
    pub fn exports(&self) -> u64 {
        lock(&self.state.received).exports
    }

    /// Waits until `done` holds for the spans received, or `limit` passes. Returns whether
    /// it held.
    pub async fn wait_for(
        &self,
        limit: Duration,
        mut done: impl FnMut(&[ReceivedSpan]) -> bool,
    ) -> bool {
        let mut changed = self.state.changed.subscribe();
        let check = async {
            loop {
                if done(&lock(&self.state.received).spans) {
                    return;
                }
                if changed.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(limit, check).await.is_ok()
    }

    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }
}

impl Drop for OtlpCollector {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl State {
    /// Counts an export, waits while stalled, then keeps its spans unless refusing.
    /// `Err` means refused.
    async fn take(
        &self,
        request: ExportTraceServiceRequest,
        protocol: &'static str,
    ) -> Result<(), ()> {
        self.admit().await?;
        let spans = flatten(request, protocol);
        lock(&self.received).spans.extend(spans);
        self.changed.send_modify(|n| *n += 1);
        Ok(())
    }

    /// The same for log records.
    async fn take_logs(&self, request: ExportLogsServiceRequest) -> Result<(), ()> {
        self.admit().await?;
        let logs = flatten_logs(request);
        lock(&self.received).logs.extend(logs);
        self.changed.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Counts an export and waits while stalled; `Err` when refusing.
    async fn admit(&self) -> Result<(), ()> {
        lock(&self.received).exports += 1;
        self.changed.send_modify(|n| *n += 1);
        let mut mode = self.mode.subscribe();
        let mode = match mode.wait_for(|m| *m != CollectorMode::Stall).await {
            Ok(mode) => *mode,
            Err(_) => return Err(()),
        };
        if mode == CollectorMode::Refuse {
            return Err(());
        }
        Ok(())
    }
}

fn attributes(
    list: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
) -> BTreeMap<String, String> {
    list.into_iter()
        .map(|kv| {
            let value = kv.value.and_then(|v| v.value);
            (kv.key, value.as_ref().map(text).unwrap_or_default())
        })
        .collect()
}

fn flatten_logs(request: ExportLogsServiceRequest) -> Vec<ReceivedLog> {
    let mut out = Vec::new();
    for resource_logs in request.resource_logs {
        let resource = attributes(
            resource_logs
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default(),
        );
        for scope in resource_logs.scope_logs {
            for record in scope.log_records {
                out.push(ReceivedLog {
                    time_unix_nano: record.time_unix_nano,
                    body: record
                        .body
                        .and_then(|b| b.value)
                        .as_ref()
                        .map(text)
                        .unwrap_or_default(),
                    attributes: attributes(record.attributes),
                    resource: resource.clone(),
                });
            }
        }
    }
    out
}

fn flatten(request: ExportTraceServiceRequest, protocol: &'static str) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = attributes(
            resource_spans
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default(),
        );
        let service_name = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                out.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    trace_state: span.trace_state,
                    name: span.name,
                    kind: span.kind,
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                    status_code: span.status.map_or(0, |s| s.code),
                    attributes: span
                        .attributes
                        .into_iter()
                        .map(|kv| {
                            let value = kv.value.and_then(|v| v.value);
                            (kv.key, value.as_ref().map(text).unwrap_or_default())
                        })
                        .collect(),
                    service_name: service_name.clone(),
                    resource: resource.clone(),
                    protocol,
                });
            }
        }
    }
    out
}

fn text(value: &Value) -> String {
    match value {
        Value::StringValue(s) => s.clone(),
        Value::BoolValue(b) => b.to_string(),
        Value::IntValue(n) => n.to_string(),
        Value::DoubleValue(x) => x.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The gRPC side.
struct Grpc(Arc<State>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        match self.0.take(request.into_inner(), "grpc").await {
            Ok(()) => Ok(tonic::Response::new(ExportTraceServiceResponse::default())),
            Err(()) => Err(tonic::Status::unavailable("refused by the test collector")),
        }
    }
}

#[tonic::async_trait]
impl LogsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        match self.0.take_logs(request.into_inner()).await {
            Ok(()) => Ok(tonic::Response::new(ExportLogsServiceResponse::default())),
            Err(()) => Err(tonic::Status::unavailable("refused by the test collector")),
        }
    }
}

/// The gRPC services, one per signal.
#[derive(Clone)]
struct GrpcServices {
    traces: TraceServiceServer<Grpc>,
    logs: LogsServiceServer<Grpc>,
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<State>,
    mut stopped: watch::Receiver<bool>,
) {
    let grpc = GrpcServices {
        traces: TraceServiceServer::new(Grpc(Arc::clone(&state))),
        logs: LogsServiceServer::new(Grpc(Arc::clone(&state))),
    };
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => return,
        };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors, most likely: try again shortly.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let state = Arc::clone(&state);
        let grpc = grpc.clone();
        let mut stopped = stopped.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let state = Arc::clone(&state);
                    let mut grpc = grpc.clone();
                    async move { Ok::<_, Infallible>(route(request, &state, &mut grpc).await) }
                });
            let builder = auto::Builder::new(TokioExecutor::new());
            let io = match tls {
                None => tokio_util::either::Either::Left(stream),
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => tokio_util::either::Either::Right(stream),
                    Err(_) => return,
                },
            };
            let served = builder.serve_connection(TokioIo::new(io), service);
            tokio::select! {
                _ = served => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
    }
}

/// gRPC calls to the trace and logs services, protobuf POSTs to `/v1/traces`; 404 for
/// anything else.
async fn route(
    request: http::Request<hyper::body::Incoming>,
    state: &State,
    grpc: &mut GrpcServices,
) -> http::Response<AnyBody> {
    let authority = request
        .uri()
        .authority()
        .map(|a| a.to_string())
        .or_else(|| {
            let host = request.headers().get(http::header::HOST)?;
            host.to_str().ok().map(str::to_owned)
        })
        .unwrap_or_default();
    lock(&state.received).callers.push(Caller {
        authority,
        headers: request.headers().clone(),
    });
    let is_grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if is_grpc {
        let answer = if request.uri().path().contains(".logs.") {
            grpc.logs.call(request).await
        } else {
            grpc.traces.call(request).await
        };
        return match answer {
            Ok(response) => response.map(|body| body.map_err(BoxError::from).boxed_unsync()),
            Err(never) => match never {},
        };
    }
    if request.method() != http::Method::POST || request.uri().path() != "/v1/traces" {
        return plain(http::StatusCode::NOT_FOUND, "not found\n");
    }
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return plain(http::StatusCode::BAD_REQUEST, "body read failed\n"),
    };
    let Ok(export) = ExportTraceServiceRequest::decode(body) else {
        return plain(
            http::StatusCode::BAD_REQUEST,
            "not an ExportTraceServiceRequest\n",
        );
    };
    match state.take(export, "http").await {
        Ok(()) => {
            let answer = ExportTraceServiceResponse::default().encode_to_vec();
            let mut response = http::Response::new(full(Bytes::from(answer)));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/x-protobuf"),
            );
            response
        }
        Err(()) => plain(http::StatusCode::SERVICE_UNAVAILABLE, "refused\n"),
    }
}

fn full(bytes: Bytes) -> AnyBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn plain(status: http::StatusCode, text: &'static str) -> http::Response<AnyBody> {
    let mut response = http::Response::new(full(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}
