//! The no-op upstream: answers whatever the `x-noop-*` request headers ask for, over
//! HTTP/1.1 and cleartext HTTP/2 (prior knowledge) on one port.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;

use crate::handle::{NoopHandle, Shared, listen};
use crate::options::{BadHeader, Echo, Options};
use crate::pattern::{PatternBody, hex};

const SERVED_BY: HeaderName = HeaderName::from_static("x-noop-served-by");
const REQUEST_BYTES: HeaderName = HeaderName::from_static("x-noop-request-bytes");
const REQUEST_SHA256: HeaderName = HeaderName::from_static("x-noop-request-sha256");

const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");

/// The body sent when nothing else is asked for: 100 bytes, the size of the nginx reply the
/// benchmarks compare against.
pub(crate) const DEFAULT_BODY: &[u8] =
    b"ok: legate testbed no-op upstream. Default body, exactly 100 bytes to match the nginx baseline.....\n";
const _: () = assert!(DEFAULT_BODY.len() == 100);

type ResBody = BoxBody<Bytes, hyper::Error>;

/// The no-op upstream server. See the crate docs for the headers it obeys.
#[derive(Debug)]
pub struct NoopUpstream;

impl NoopUpstream {
    /// Binds `addr` (port 0 allowed) and serves on the current tokio runtime. Returns once
    /// listening.
    pub async fn bind(addr: SocketAddr) -> io::Result<NoopHandle> {
        let (handle, accept) = listen_noop(addr).await?;
        tokio::spawn(accept);
        Ok(handle)
    }

    /// Serves from a background OS thread with its own two-worker tokio runtime, so the caller
    /// needs no runtime and the upstream doesn't compete with the caller's. Returns once
    /// listening. The thread ends shortly after [`NoopHandle::shutdown`].
    pub fn start_in_thread(addr: SocketAddr) -> io::Result<NoopHandle> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("noop-upstream".into())
            .spawn(move || {
                // Built here rather than by the caller: creating or dropping a runtime inside
                // the caller's async context would panic.
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("noop-upstream-worker")
                    .enable_all()
                    .build();
                let runtime = match runtime {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match listen_noop(addr).await {
                        Ok((handle, accept)) => {
                            let _ = tx.send(Ok(handle));
                            accept.await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            })?;
        rx.recv()
            .map_err(|_| io::Error::other("noop-upstream thread died before listening"))?
    }
}

async fn listen_noop(
    addr: SocketAddr,
) -> io::Result<(NoopHandle, impl Future<Output = ()> + Send + 'static)> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's header-read timeout also runs while a keep-alive connection sits idle, closing
    // it after 30 s; a test upstream keeps idle connections so pooling tests stay
    // deterministic (no timer is configured, so nothing else times out either).
    builder.http1().keep_alive(true).header_read_timeout(None);
    listen(addr, move |stream, shared| {
        serve_connection(stream, shared, builder.clone())
    })
    .await
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    builder: auto::Builder<TokioExecutor>,
) {
    // Small responses shouldn't wait for Nagle: the benchmarks measure latency.
    let _ = stream.set_nodelay(true);
    let served_by = HeaderValue::from_str(&shared.local_addr.to_string())
        .unwrap_or(HeaderValue::from_static("unknown"));
    let stopped = shared.stopped();
    let service = service_fn(move |req| {
        let shared = shared.clone();
        let served_by = served_by.clone();
        async move {
            let mut res = respond(req).await?;
            res.headers_mut().insert(SERVED_BY, served_by);
            shared.count_request();
            Ok::<_, hyper::Error>(res)
        }
    });
    let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
    tokio::select! {
        // Errors are the client's business (resets, bad requests); hyper already answered
        // what it could.
        _ = conn.as_mut() => {}
        () = stopped => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Answers one request. An `Err` (the request body broke off) makes hyper drop the connection.
async fn respond(req: Request<Incoming>) -> Result<Response<ResBody>, hyper::Error> {
    let (parts, body) = req.into_parts();
    let options = Options::parse(&parts.headers);

    if let Ok(
        opts @ Options {
            echo: Some(Echo::Body),
            ..
        },
    ) = &options
    {
        delay(opts).await;
        return Ok(echo_body(&parts, body, opts));
    }

    let read_rate = options.as_ref().ok().and_then(|o| o.read_rate);
    let extra = options
        .as_ref()
        .map(|o| o.response_headers.clone())
        .unwrap_or_default();
    let (len, sha256) = digest(body, read_rate).await?;
    let mut res = match options {
        Err(bad) => bad_request(&parts, &bad),
        Ok(opts) => {
            delay(&opts).await;
            generated(&parts, &opts)
        }
    };
    let headers = res.headers_mut();
    for (name, _) in &extra {
        headers.remove(name);
    }
    for (name, value) in extra {
        headers.append(name, value);
    }
    headers.insert(REQUEST_BYTES, HeaderValue::from(len));
    if let Ok(value) = HeaderValue::from_str(&sha256) {
        headers.insert(REQUEST_SHA256, value);
    }
    Ok(res)
}

async fn delay(opts: &Options) {
    if !opts.delay.is_zero() {
        tokio::time::sleep(opts.delay).await;
    }
}

/// Length and hex SHA-256 of the request body, read frame by frame (constant memory), at no
/// more than `read_rate` bytes a second if given: a slow reader, to push back on the sender.
async fn digest(mut body: Incoming, read_rate: Option<u64>) -> Result<(u64, String), hyper::Error> {
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    let started = tokio::time::Instant::now();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            len += data.len() as u64;
            hasher.update(data);
            if let Some(rate) = read_rate {
                let due = Duration::from_secs_f64(len as f64 / rate as f64);
                tokio::time::sleep_until(started + due).await;
            }
        }
    }
    Ok((len, hex(&hasher.finalize())))
}

fn bad_request(parts: &Parts, bad: &BadHeader) -> Response<ResBody> {
    let text = Bytes::from(format!("{bad}\n"));
    finish(parts, StatusCode::BAD_REQUEST, TEXT_PLAIN, text, false)
}

/// The response for every mode but `x-noop-echo: body`.
fn generated(parts: &Parts, opts: &Options) -> Response<ResBody> {
    if opts.echo == Some(Echo::Headers) {
        let text = Bytes::from(echo_headers(parts));
        return finish(parts, opts.status, TEXT_PLAIN, text, opts.chunked);
    }
    let Some(size) = opts.size else {
        let body = Bytes::from_static(DEFAULT_BODY);
        return finish(parts, opts.status, TEXT_PLAIN, body, opts.chunked);
    };
    let mut res = Response::new(PatternBody::new(size, !opts.chunked).boxed_infallible());
    *res.status_mut() = opts.status;
    res.headers_mut().insert(CONTENT_TYPE, OCTET_STREAM);
    if !opts.chunked {
        res.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(size));
    }
    without_body_if_forbidden(parts, res)
}

/// A response with an in-memory body.
fn finish(
    parts: &Parts,
    status: StatusCode,
    content_type: HeaderValue,
    body: Bytes,
    chunked: bool,
) -> Response<ResBody> {
    let len = body.len();
    let body = if chunked {
        Unsized(Full::new(body)).boxed_infallible()
    } else {
        Full::new(body).boxed_infallible()
    };
    let mut res = Response::new(body);
    *res.status_mut() = status;
    res.headers_mut().insert(CONTENT_TYPE, content_type);
    if !chunked {
        res.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(len));
    }
    without_body_if_forbidden(parts, res)
}

/// HEAD responses and 204/304 carry no body. hyper enforces that on HTTP/1 but would send
/// DATA frames on HTTP/2, so the body is dropped here for both.
fn without_body_if_forbidden(parts: &Parts, res: Response<ResBody>) -> Response<ResBody> {
    let status = res.status();
    let no_content = status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    if parts.method != Method::HEAD && !no_content {
        return res;
    }
    let (mut head, _) = res.into_parts();
    if no_content {
        head.headers.remove(CONTENT_LENGTH);
    }
    // HEAD keeps the content-length of the body it would have had.
    Response::from_parts(head, Empty::new().boxed_infallible())
}

/// `x-noop-echo: headers`: the request line, then the headers as received.
fn echo_headers(parts: &Parts) -> String {
    let target = match parts.uri.path_and_query() {
        Some(pq) => pq.as_str().to_owned(),
        None => parts.uri.to_string(),
    };
    let mut out = format!("{} {} {:?}\n", parts.method, target, parts.version);
    // HTTP/2 carries the host in `:authority`, which hyper puts in the URI, not the headers.
    if let Some(authority) = parts.uri.authority() {
        let _ = writeln!(out, ":authority: {authority}");
    }
    // HeaderMap keeps first-seen order of names; repeated names are grouped there.
    for (name, value) in &parts.headers {
        let _ = writeln!(out, "{name}: {}", String::from_utf8_lossy(value.as_bytes()));
    }
    out
}

/// `x-noop-echo: body`: the request body streamed back frame by frame as it arrives.
fn echo_body(parts: &Parts, body: Incoming, opts: &Options) -> Response<ResBody> {
    let body = if opts.chunked {
        BoxBody::new(Unsized(body))
    } else {
        BoxBody::new(body)
    };
    let mut res = Response::new(body);
    *res.status_mut() = opts.status;
    res.headers_mut().insert(CONTENT_TYPE, OCTET_STREAM);
    if !opts.chunked
        && let Some(len) = parts.headers.get(CONTENT_LENGTH)
    {
        res.headers_mut().insert(CONTENT_LENGTH, len.clone());
    }
    without_body_if_forbidden(parts, res)
}

/// Hides a body's length: hyper derives `content-length` from an exact size hint, which
/// `x-noop-chunked` must prevent.
struct Unsized<B>(B);

impl<B: Body + Unpin> Body for Unsized<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Boxes an infallible body into the response body type.
trait BoxInfallible {
    fn boxed_infallible(self) -> ResBody;
}

impl<B> BoxInfallible for B
where
    B: Body<Data = Bytes, Error = Infallible> + Send + Sync + 'static,
{
    fn boxed_infallible(self) -> ResBody {
        BoxBody::new(self.map_err(|never| match never {}))
    }
}
