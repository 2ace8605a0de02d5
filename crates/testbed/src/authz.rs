//! An external authorization sidecar speaking Envoy's gRPC protocol
//! (`envoy.service.auth.v3.Authorization/Check`) or plain HTTP, with rules chosen by config:
//! allow when a header matches, deny with a status, headers and body, add headers, delay.
//! It counts the connections it accepts, so a test can check how many a proxy opens.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue as PbHeader, HeaderValueOption};
use envoy_types::pb::envoy::service::auth::v3::authorization_server::{
    Authorization, AuthorizationServer,
};
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{
    CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::rpc::Status;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

/// What the sidecar decides.
#[derive(Debug, Clone)]
pub struct AuthzRules {
    /// Allow only requests whose header `.0` has the value `.1`; `None`: allow all.
    pub allow_if: Option<(String, String)>,
    pub deny_status: u16,
    pub deny_body: String,
    pub deny_headers: Vec<(String, String)>,
    /// Added to allowed requests on their way upstream (HTTP mode: answer headers).
    pub add_headers: Vec<(String, String)>,
    /// Added to the responses of allowed requests (gRPC mode).
    pub response_headers: Vec<(String, String)>,
    /// Waited before every answer.
    pub delay: Duration,
    /// The first this many checks fail: HTTP 503 (HTTP mode), gRPC `UNAVAILABLE`.
    pub failing_first: u64,
}

impl Default for AuthzRules {
    fn default() -> Self {
        Self {
            allow_if: None,
            deny_status: 403,
            deny_body: String::new(),
            deny_headers: Vec::new(),
            add_headers: Vec::new(),
            response_headers: Vec::new(),
            delay: Duration::ZERO,
            failing_first: 0,
        }
    }
}

/// Where the sidecar listens.
#[derive(Debug, Clone)]
pub enum SidecarAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// The protocol it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SidecarMode {
    Grpc,
    Http,
}

/// A running sidecar. Dropping it does not stop it; [`AuthzSidecar::shutdown`] does, closing
/// every connection.
#[derive(Clone)]
pub struct AuthzSidecar {
    addr: SidecarAddr,
    counters: Arc<Counters>,
    stop: Arc<watch::Sender<bool>>,
}

#[derive(Default, Debug)]
struct Counters {
    connections: AtomicU64,
    open: AtomicI64,
    checks: AtomicU64,
    /// The `:authority` of each gRPC call, in order.
    authorities: std::sync::Mutex<Vec<String>>,
}

impl AuthzSidecar {
    /// Binds and starts serving on the current tokio runtime.
    pub async fn start(
        addr: SidecarAddr,
        mode: SidecarMode,
        rules: AuthzRules,
    ) -> io::Result<Self> {
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = watch::channel(false);
        let rules = Arc::new(rules);
        let bound = match &addr {
            SidecarAddr::Tcp(a) => {
                let listener = TcpListener::bind(a).await?;
                let local = listener.local_addr()?;
                let (counters, rules, stopped) =
                    (Arc::clone(&counters), Arc::clone(&rules), stopped.clone());
                tokio::spawn(async move {
                    accept_loop(
                        || async {
                            let (s, _) = listener.accept().await?;
                            let _ = s.set_nodelay(true);
                            Ok(s)
                        },
                        mode,
                        rules,
                        counters,
                        stopped,
                    )
                    .await
                });
                SidecarAddr::Tcp(local)
            }
            SidecarAddr::Unix(path) => {
                let _ = std::fs::remove_file(path);
                let listener = UnixListener::bind(path)?;
                let (counters, rules, stopped) =
                    (Arc::clone(&counters), Arc::clone(&rules), stopped.clone());
                tokio::spawn(async move {
                    accept_loop(
                        || async { Ok(listener.accept().await?.0) },
                        mode,
                        rules,
                        counters,
                        stopped,
                    )
                    .await
                });
                addr.clone()
            }
        };
        Ok(Self {
            addr: bound,
            counters,
            stop: Arc::new(stop),
        })
    }

    /// The same service on a TCP address behind TLS with `config` (which should offer `h2`
    /// for gRPC, `http/1.1` for HTTP).
    pub async fn start_tls(
        addr: SocketAddr,
        mode: SidecarMode,
        rules: AuthzRules,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<Self> {
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = watch::channel(false);
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (loop_counters, rules) = (Arc::clone(&counters), Arc::new(rules));
        tokio::spawn(async move {
            accept_loop(
                || async {
                    loop {
                        let (s, _) = listener.accept().await?;
                        let _ = s.set_nodelay(true);
                        // A client that does not finish the handshake is not served.
                        if let Ok(tls) = acceptor.accept(s).await {
                            return Ok(tls);
                        }
                    }
                },
                mode,
                rules,
                loop_counters,
                stopped,
            )
            .await
        });
        Ok(Self {
            addr: SidecarAddr::Tcp(local),
            counters,
            stop: Arc::new(stop),
        })
    }

    /// Starts the sidecar on a thread of its own (with its own runtime), for callers without
    /// a tokio runtime, such as the `demo` command. It runs until [`AuthzSidecar::shutdown`].
    pub fn start_in_thread(
        addr: SidecarAddr,
        mode: SidecarMode,
        rules: AuthzRules,
    ) -> io::Result<AuthzSidecar> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("authz-sidecar".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match AuthzSidecar::start(addr, mode, rules).await {
                        Ok(sidecar) => {
                            let mut stopped = sidecar.stop.subscribe();
                            let _ = tx.send(Ok(sidecar));
                            until_stopped(&mut stopped).await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            })?;
        rx.recv()
            .map_err(|_| io::Error::other("the sidecar thread ended before it listened"))?
    }

    /// Where it listens (the real port when bound to port 0).
    pub fn addr(&self) -> &SidecarAddr {
        &self.addr
    }

    /// The TCP address; `None` on a Unix socket.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self.addr {
            SidecarAddr::Tcp(a) => Some(a),
            SidecarAddr::Unix(_) => None,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.counters.connections.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open_connections(&self) -> i64 {
        self.counters.open.load(Ordering::Relaxed)
    }

    /// Checks answered so far.
    /// The `:authority` each gRPC check came with, in order.
    pub fn authorities(&self) -> Vec<String> {
        (self.counters.authorities.lock())
            .map(|a| a.clone())
            .unwrap_or_default()
    }

    pub fn checks(&self) -> u64 {
        self.counters.checks.load(Ordering::Relaxed)
    }

    /// Stops accepting and closes every connection.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
        if let SidecarAddr::Unix(path) = &self.addr {
            let _ = std::fs::remove_file(path);
        }
    }
}

async fn accept_loop<S, F, Fut>(
    mut accept: F,
    mode: SidecarMode,
    rules: Arc<AuthzRules>,
    counters: Arc<Counters>,
    mut stopped: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = io::Result<S>>,
{
    loop {
        let stream = tokio::select! {
            s = accept() => match s {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = until_stopped(&mut stopped) => return,
        };
        counters.connections.fetch_add(1, Ordering::Relaxed);
        counters.open.fetch_add(1, Ordering::Relaxed);
        let (rules, counters, mut stopped) =
            (Arc::clone(&rules), Arc::clone(&counters), stopped.clone());
        tokio::spawn(async move {
            let open = Arc::clone(&counters);
            let io = TokioIo::new(stream);
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // Room for every check a proxy may have in flight on its one connection.
            builder.http2().max_concurrent_streams(10_000);
            let served = async {
                match mode {
                    SidecarMode::Grpc => {
                        let service =
                            TowerToHyperService::new(AuthorizationServer::new(GrpcRules {
                                rules,
                                counters: Arc::clone(&counters),
                            }));
                        let counters = Arc::clone(&counters);
                        let recorded = hyper::service::service_fn(
                            move |req: http::Request<hyper::body::Incoming>| {
                                let authority = req
                                    .uri()
                                    .authority()
                                    .map(|a| a.to_string())
                                    .unwrap_or_default();
                                if let Ok(mut seen) = counters.authorities.lock() {
                                    seen.push(authority);
                                }
                                hyper::service::Service::call(&service, req)
                            },
                        );
                        let _ = builder.http2_only().serve_connection(io, recorded).await;
                    }
                    SidecarMode::Http => {
                        let counters = Arc::clone(&counters);
                        let service = hyper::service::service_fn(move |req| {
                            http_check(req, Arc::clone(&rules), Arc::clone(&counters))
                        });
                        let _ = builder.serve_connection(io, service).await;
                    }
                }
            };
            tokio::select! {
                () = served => {}
                () = until_stopped(&mut stopped) => {}
            }
            open.open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Resolves once the sidecar is stopped (the guard `wait_for` returns is not `Send`).
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

struct GrpcRules {
    rules: Arc<AuthzRules>,
    counters: Arc<Counters>,
}

fn option(name: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(PbHeader {
            key: name.to_owned(),
            value: value.to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Authorization for GrpcRules {
    async fn check(
        &self,
        request: tonic::Request<CheckRequest>,
    ) -> Result<tonic::Response<CheckResponse>, tonic::Status> {
        let rules = &self.rules;
        if !rules.delay.is_zero() {
            tokio::time::sleep(rules.delay).await;
        }
        if self.counters.checks.fetch_add(1, Ordering::Relaxed) < rules.failing_first {
            return Err(tonic::Status::unavailable("failing on purpose"));
        }
        let traceparent = request
            .metadata()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let attributes = request.into_inner().attributes.unwrap_or_default();
        let http = attributes.request.and_then(|r| r.http).unwrap_or_default();
        let allowed = rules
            .allow_if
            .as_ref()
            .is_none_or(|(name, value)| http.headers.get(name) == Some(value));
        let response = if allowed {
            let mut headers: Vec<HeaderValueOption> = rules
                .add_headers
                .iter()
                .map(|(n, v)| option(n, v))
                .collect();
            // What the proxy sent, for tests to read back upstream.
            let mut context: Vec<_> = attributes.context_extensions.iter().collect();
            context.sort();
            if !context.is_empty() {
                let text: Vec<String> = context.iter().map(|(k, v)| format!("{k}={v}")).collect();
                headers.push(option("x-ext-authz-context", &text.join(";")));
            }
            if let Some(traceparent) = &traceparent {
                headers.push(option("x-ext-authz-traceparent", traceparent));
            }
            // The request headers it was sent, and the route metadata's text fields.
            let mut names: Vec<&String> = http.headers.keys().collect();
            names.sort();
            let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
            headers.push(option("x-ext-authz-headers", &names.join(",")));
            if let Some(metadata) = &attributes.route_metadata_context {
                let mut fields: Vec<String> = Vec::new();
                for (namespace, values) in &metadata.filter_metadata {
                    for (key, value) in &values.fields {
                        if let Some(Kind::StringValue(text)) = &value.kind {
                            fields.push(format!("{namespace}.{key}={text}"));
                        }
                    }
                }
                fields.sort();
                headers.push(option("x-ext-authz-route-metadata", &fields.join(";")));
            }
            if !http.raw_body.is_empty() || !http.body.is_empty() {
                headers.push(option(
                    "x-ext-authz-body-bytes",
                    &http.raw_body.len().max(http.body.len()).to_string(),
                ));
            }
            CheckResponse {
                status: Some(Status::default()),
                http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                    headers,
                    response_headers_to_add: rules
                        .response_headers
                        .iter()
                        .map(|(n, v)| option(n, v))
                        .collect(),
                    ..Default::default()
                })),
                ..Default::default()
            }
        } else {
            CheckResponse {
                status: Some(Status {
                    code: tonic::Code::PermissionDenied as i32,
                    ..Default::default()
                }),
                http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                    status: Some(HttpStatus {
                        code: i32::from(rules.deny_status),
                    }),
                    headers: rules
                        .deny_headers
                        .iter()
                        .map(|(n, v)| option(n, v))
                        .collect(),
                    body: rules.deny_body.clone(),
                })),
                ..Default::default()
            }
        };
        Ok(tonic::Response::new(response))
    }
}

async fn http_check(
    req: Request<Incoming>,
    rules: Arc<AuthzRules>,
    counters: Arc<Counters>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if !rules.delay.is_zero() {
        tokio::time::sleep(rules.delay).await;
    }
    if counters.checks.fetch_add(1, Ordering::Relaxed) < rules.failing_first {
        let mut response = Response::new(Full::new(Bytes::from_static(b"failing on purpose\n")));
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        return Ok(response);
    }
    let allowed = rules.allow_if.as_ref().is_none_or(|(name, value)| {
        req.headers()
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            == Some(value.as_str())
    });
    let (parts, body) = req.into_parts();
    let body_len = body
        .collect()
        .await
        .map(|b| b.to_bytes().len())
        .unwrap_or(0);
    let mut response = if allowed {
        let mut response = Response::new(Full::new(Bytes::new()));
        for (name, value) in &rules.add_headers {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(value),
            ) {
                response.headers_mut().append(n, v);
            }
        }
        // What the proxy sent, for tests to read back upstream.
        if let Ok(v) = http::HeaderValue::from_str(&format!("{} {}", parts.method, parts.uri)) {
            response.headers_mut().insert("x-ext-authz-saw", v);
        }
        if let Some(traceparent) = parts.headers.get("traceparent") {
            response
                .headers_mut()
                .insert("x-ext-authz-traceparent", traceparent.clone());
        }
        if body_len > 0 {
            response
                .headers_mut()
                .insert("x-ext-authz-body-bytes", http::HeaderValue::from(body_len));
        }
        response
    } else {
        let mut response = Response::new(Full::new(Bytes::from(rules.deny_body.clone())));
        *response.status_mut() =
            http::StatusCode::from_u16(rules.deny_status).unwrap_or(http::StatusCode::FORBIDDEN);
        for (name, value) in &rules.deny_headers {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(value),
            ) {
                response.headers_mut().append(n, v);
            }
        }
        response
    };
    response
        .headers_mut()
        .insert("x-ext-authz-check", http::HeaderValue::from_static("http"));
    Ok(response)
}
