//! Distributed tracing on the request path (Envoy's OpenTelemetry tracer, in spirit).
//!
//! Every request on a traced listener gets a span id of its own for the proxy hop. The W3C
//! `traceparent` the upstream and the authorization service see names that hop (or, when
//! sampled, the span of the call that carries it) under the caller's trace, or under a new
//! trace when the request came without a valid context; `tracestate` goes on as it came.
//!
//! A request from an internal address follows its caller's decision (the `traceparent`
//! sampled flag), or is sampled when it carries the force header; any other request is
//! sampled by `random_sampling`. A client on the internet decides nothing.
//! Sampled requests record spans: the downstream request (ended with the response's last
//! byte), the ext_authz check, and each upstream try (ended at its response head). Spans
//! gather per worker and go to the exporter's queue in batches; a full queue drops them, and
//! requests never wait for the collector.

use std::borrow::Cow;
use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use trace_export::{
    ExportError, ExportObserver, ExporterConfig, Protocol, Span, SpanId, SpanKind, SpanSink,
    TraceId, TraceParent, Value,
};

use crate::catalog::ProxyStats;
use crate::error::ResponseFlag;
use crate::random::next_u64;
use crate::throttle::LogThrottle;
use config::tracing::Sampler;
use config::{
    CustomTag, CustomTagValue, ListenerTracing, OtlpProtocol, RouteTracing, SpanName, TracingConfig,
};

mod span_name;

use span_name::ClientSide;
pub(crate) use span_name::{RequestView, Upstream};

pub(crate) static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub(crate) static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// What every worker shares: the settings and the exporter's queue. Kept across reloads
/// that leave `tracing` as it was.
pub(crate) struct SharedTracer {
    pub(crate) config: TracingConfig,
    /// The xDS node id, the resource's `service.instance.id`.
    node_id: Option<String>,
    sink: SpanSink,
    /// `random_sampling` as a bound on 64 random bits.
    threshold: u64,
}

impl SharedTracer {
    /// Starts the exporter's thread for `config`.
    pub(crate) fn start(
        config: &TracingConfig,
        node_id: Option<&str>,
        stats: &ProxyStats,
    ) -> std::io::Result<SharedTracer> {
        let mut resource: Vec<(String, Value)> =
            vec![("service.name".into(), config.service_name.clone().into())];
        if let Some(node) = node_id {
            resource.push(("service.instance.id".into(), node.to_owned().into()));
        }
        resource.push(("service.version".into(), env!("CARGO_PKG_VERSION").into()));
        // The configured attributes over the proxy's own, `service.name` included (as Envoy
        // merges its resource detectors over its service name).
        for (key, value) in &config.resource_attributes {
            match resource.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = value.clone().into(),
                None => resource.push((key.clone(), value.clone().into())),
            }
        }
        // A shard of its own: the exporter's thread is the one writer of its counters.
        let shard = stats.registry.shard(&[]);
        let catalog = &stats.catalog;
        let observer = Observer {
            exported: shard.counter(catalog.tracing_spans, &["exported"]),
            failed: shard.counter(catalog.tracing_spans, &["failed"]),
            errors: LogThrottle::default(),
            endpoint: config.endpoint.to_string(),
        };
        let sink = trace_export::start(
            ExporterConfig {
                endpoint: config.endpoint.clone(),
                protocol: match config.protocol {
                    OtlpProtocol::Grpc => Protocol::Grpc,
                    OtlpProtocol::Http => Protocol::HttpProtobuf,
                },
                // Checked at load.
                authority: config.authority.as_deref().and_then(|a| a.parse().ok()),
                headers: config.headers.clone(),
                timeout: config.timeout,
                max_queued_spans: config.max_queued_spans,
                max_export_batch: config.max_export_batch,
                resource,
                tls: config
                    .tls
                    .as_ref()
                    .map(crate::tls::collector_tls)
                    .transpose()?,
            },
            observer,
        )?;
        Ok(SharedTracer {
            config: config.clone(),
            node_id: node_id.map(str::to_owned),
            sink,
            threshold: threshold(config.random_sampling),
        })
    }
}

impl SharedTracer {
    /// Whether this exporter is the one `config` and `node_id` ask for.
    pub(crate) fn is_for(&self, config: &TracingConfig, node_id: Option<&str>) -> bool {
        self.config == *config && self.node_id.as_deref() == node_id
    }

    /// Waits until the spans queued so far are sent, for at most the export timeout (and
    /// 5 s): the last ones of a stopping process.
    pub(crate) fn drain(&self) {
        let limit = self.config.timeout.min(std::time::Duration::from_secs(5));
        if !self.sink.drain(limit) {
            tracing::warn!(
                endpoint = %self.config.endpoint,
                queued = self.sink.queued(),
                "the span exporter did not finish within {limit:?}; its last spans are lost"
            );
        }
    }
}

/// `percent` of the range of a u64; `u64::MAX` stands for always.
fn threshold(percent: f64) -> u64 {
    if percent >= 100.0 {
        return u64::MAX;
    }
    // Exact enough: a sampling rate is not a precise quantity.
    (percent / 100.0 * 18_446_744_073_709_551_616.0) as u64
}

/// Counts each export's spans, and logs failures at most once a second.
struct Observer {
    exported: stats::Counter,
    failed: stats::Counter,
    errors: LogThrottle,
    endpoint: String,
}

impl ExportObserver for Observer {
    fn exported(&mut self, spans: usize) {
        self.exported.add(spans as u64);
    }

    fn failed(&mut self, spans: usize, error: &ExportError) {
        self.failed.add(spans as u64);
        if let Some(failed) = self.errors.hit() {
            tracing::warn!(endpoint = %self.endpoint, failed, %error, "span export failed; spans were lost");
        }
    }
}

/// One worker's tracer: its batch of finished spans, handed to the exporter when full and on
/// the worker's housekeeping tick.
pub(crate) struct WorkerTracer {
    shared: Arc<SharedTracer>,
    batch: RefCell<Vec<Span>>,
    sampled: stats::Counter,
    dropped: stats::Counter,
}

impl WorkerTracer {
    pub(crate) fn new(shared: Arc<SharedTracer>, stats: &ProxyStats, shard: &stats::Shard) -> Self {
        let catalog = &stats.catalog;
        Self {
            shared,
            batch: RefCell::new(Vec::new()),
            sampled: shard.counter(catalog.tracing_spans, &["sampled"]),
            dropped: shard.counter(catalog.tracing_spans, &["dropped"]),
        }
    }

    /// Whether this tracer was made for `shared`.
    pub(crate) fn serves(&self, shared: &Arc<SharedTracer>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }

    fn record(&self, span: Span) {
        self.sampled.inc();
        let full = {
            let mut batch = self.batch.borrow_mut();
            batch.push(span);
            batch.len() >= self.shared.config.max_export_batch
        };
        if full {
            self.flush();
        }
    }

    /// Hands the batch to the exporter, or counts it dropped when the queue is full.
    pub(crate) fn flush(&self) {
        let batch = std::mem::take(&mut *self.batch.borrow_mut());
        if let Err(dropped) = self.shared.sink.send(batch) {
            self.dropped.add(dropped.0 as u64);
        }
    }

    /// Starts `req`'s trace: reads its context and decides whether it is sampled. `client`
    /// decides whether the caller's decision and the force header are trusted; `policy` is
    /// the listener's sampling and tags. The requests sent on carry
    /// [`RequestTrace::traceparent`] (or a child span's).
    pub(crate) fn start<B>(
        self: &Rc<Self>,
        req: &Request<B>,
        client: IpAddr,
        policy: &TracePolicy,
        tls: bool,
    ) -> Box<RequestTrace> {
        let headers = req.headers();
        // Two traceparent headers are no valid context (the recommendation's test suite).
        let mut values = headers.get_all(&TRACEPARENT).iter();
        let parent = match (values.next(), values.next()) {
            (Some(value), None) => TraceParent::parse(value.as_bytes()),
            _ => None,
        };
        let internal = is_internal(client);
        let config = &self.shared.config;
        let forced = internal
            && config
                .force_trace_header
                .as_ref()
                .is_some_and(|name| headers.contains_key(name));
        let trace_id = match parent {
            Some(parent) => parent.trace_id,
            None => new_trace_id(),
        };
        let sampled = forced
            || match (&policy.sampler, parent) {
                // A caller inside decides for its trace (the sampler's parent too).
                (Some(sampler), _) => {
                    // A trace id from outside is the client's choice: the ratio then draws.
                    let id = if parent.is_some() && !internal {
                        next_u64()
                    } else {
                        trace_id_value(trace_id)
                    };
                    sampler.samples(parent.filter(|_| internal), id)
                }
                (None, Some(parent)) if internal => parent.sampled,
                (None, _) => policy.draw(
                    headers.contains_key(&X_CLIENT_TRACE_ID),
                    policy.random.unwrap_or(self.shared.threshold),
                ),
            };
        let span_id = new_span_id();
        let began = Instant::now();
        let side = ClientSide {
            version: req.version(),
            tls,
        };
        let server = sampled.then(|| {
            let mut span = server_span(req, trace_id, span_id, parent, client);
            policy.tag(&mut span, headers);
            if let Some(operation) = &policy.operation {
                span.name = span_name::render(operation, req.into(), side, None, None).into();
            }
            Open::at(span, began)
        });
        let names = match &server {
            Some(_) if policy.operation.is_some() || policy.upstream_operation.is_some() => {
                Some(Box::new(Names {
                    operation: policy.operation.clone(),
                    upstream_operation: policy.upstream_operation.clone(),
                    original_path: None,
                    client: side,
                }))
            }
            _ => None,
        };
        Box::new(RequestTrace {
            tracer: Rc::clone(self),
            trace_id,
            span_id,
            continued: parent.is_some(),
            answered: false,
            began,
            server,
            names,
        })
    }

    /// Decides `old`'s request again by a route's own `policy` (its shares, tags and
    /// names), before anything has seen the first decision; the request's span still starts
    /// when the request did.
    pub(crate) fn restart<B>(
        self: &Rc<Self>,
        old: &mut RequestTrace,
        req: &Request<B>,
        client: IpAddr,
        policy: &TracePolicy,
        tls: bool,
    ) -> Box<RequestTrace> {
        // Not recorded: it is replaced, not ended.
        old.server = None;
        let mut new = self.start(req, client, policy, tls);
        if let Some(open) = &mut new.server {
            open.span.start = SystemTime::now() - old.began.elapsed();
            open.started = old.began;
        }
        new.began = old.began;
        new
    }
}

impl Drop for WorkerTracer {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Asks that a request be sampled at the listener's `client_sampling` (Envoy's).
static X_CLIENT_TRACE_ID: HeaderName = HeaderName::from_static("x-client-trace-id");

/// A listener's sampling and tags (Envoy's connection manager `tracing`), made once per
/// config.
pub(crate) struct TracePolicy {
    /// The listener's `random_sampling` as a bound on 64 random bits; `None`: the process's.
    random: Option<u64>,
    client: u64,
    overall: u64,
    tags: Vec<CustomTag>,
    /// OpenTelemetry's sampler: when set, it decides instead of the shares.
    sampler: Option<SamplerBounds>,
    /// The request span's name, and an upstream try's span's.
    operation: Option<Rc<SpanName>>,
    upstream_operation: Option<Rc<SpanName>>,
}

/// A sampler with its ratios as bounds on 64 bits.
enum SamplerBounds {
    AlwaysOn,
    /// Sampled when the trace id's first 8 bytes (as Envoy reads them) modulo the
    /// denominator are below the numerator, as Envoy's `TraceIdRatioBased`: every hop with
    /// the same ratio decides alike.
    TraceIdRatio {
        numerator: u64,
        denominator: u64,
    },
    ParentBased(Box<SamplerBounds>),
}

impl SamplerBounds {
    fn new(sampler: &Sampler) -> Self {
        match sampler {
            Sampler::AlwaysOn => SamplerBounds::AlwaysOn,
            Sampler::TraceIdRatio(percent) => {
                // The smallest of Envoy's denominators that holds the share exactly.
                let (numerator, denominator) = if percent.fract() == 0.0 {
                    (*percent, 100)
                } else if (percent * 100.0).fract() == 0.0 {
                    (percent * 100.0, 10_000)
                } else {
                    ((percent * 10_000.0).round(), 1_000_000)
                };
                SamplerBounds::TraceIdRatio {
                    numerator: numerator as u64,
                    denominator,
                }
            }
            Sampler::ParentBased(inner) => SamplerBounds::ParentBased(Box::new(Self::new(inner))),
        }
    }

    /// `parent`: a trusted caller's context; `id`: the trace id's value for the ratio.
    fn samples(&self, parent: Option<TraceParent>, id: u64) -> bool {
        match self {
            SamplerBounds::AlwaysOn => true,
            SamplerBounds::TraceIdRatio {
                numerator,
                denominator,
            } => id % denominator < *numerator,
            SamplerBounds::ParentBased(inner) => match parent {
                Some(parent) => parent.sampled,
                None => inner.samples(None, id),
            },
        }
    }
}

/// The trace id's first 8 bytes as a number, as Envoy's sampler reads them (copied into a
/// 64-bit integer on a little-endian machine).
fn trace_id_value(trace_id: TraceId) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&trace_id.0[..8]);
    u64::from_le_bytes(first)
}

impl TracePolicy {
    pub(crate) fn new(config: &ListenerTracing) -> Self {
        Self {
            random: config.random_sampling.map(threshold),
            client: threshold(config.client_sampling),
            overall: threshold(config.overall_sampling),
            tags: config.custom_tags.clone(),
            sampler: config.sampler.as_ref().map(SamplerBounds::new),
            operation: config.operation.clone().map(Rc::new),
            upstream_operation: config.upstream_operation.clone().map(Rc::new),
        }
    }

    /// A route's policy (Envoy's route `tracing`): its own shares, the listener's tags with
    /// its own over those of the same name, its names where it has them.
    pub(crate) fn for_route(listener: &ListenerTracing, route: &RouteTracing) -> Self {
        let mut tags: Vec<CustomTag> = (listener.custom_tags.iter())
            .filter(|t| !route.custom_tags.iter().any(|own| own.tag == t.tag))
            .cloned()
            .collect();
        tags.extend(route.custom_tags.iter().cloned());
        let name = |own: &Option<SpanName>, listener: &Option<SpanName>| {
            own.as_ref().or(listener.as_ref()).cloned().map(Rc::new)
        };
        Self {
            random: Some(threshold(route.random_sampling)),
            client: threshold(route.client_sampling),
            overall: threshold(route.overall_sampling),
            tags,
            sampler: listener.sampler.as_ref().map(SamplerBounds::new),
            operation: name(&route.operation, &listener.operation),
            upstream_operation: name(&route.upstream_operation, &listener.upstream_operation),
        }
    }

    /// Whether a request without a trusted decision is sampled: one draw, as Envoy's one
    /// request id, against the client share (when it asks), else the random one, and the
    /// overall cap.
    fn draw(&self, client_asks: bool, random: u64) -> bool {
        let below = |bound: u64, draw: u64| bound == u64::MAX || draw < bound;
        let draw = next_u64();
        ((client_asks && below(self.client, draw)) || below(random, draw))
            && below(self.overall, draw)
    }

    fn tag(&self, span: &mut Span, headers: &HeaderMap) {
        for tag in &self.tags {
            let value = match &tag.value {
                CustomTagValue::Literal(text) => text.clone(),
                CustomTagValue::RequestHeader {
                    name,
                    default_value,
                } => match headers.get(name) {
                    Some(value) => bounded(text_of(value)),
                    None => match default_value {
                        Some(text) => text.clone(),
                        None => continue,
                    },
                },
            };
            span.set(tag.tag.clone(), value);
        }
    }
}

impl Default for TracePolicy {
    fn default() -> Self {
        Self::new(&ListenerTracing::default())
    }
}

/// Loopback and private addresses: the proxy's own network, whose callers' trace decisions
/// are trusted (Envoy's internal addresses).
fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_private(),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return v4.is_loopback() || v4.is_private();
            }
            v6.is_loopback() || (v6.segments()[0] & 0xfe00) == 0xfc00
        }
    }
}

fn new_trace_id() -> TraceId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&next_u64().to_le_bytes());
    id[8..].copy_from_slice(&next_u64().to_le_bytes());
    TraceId(id)
}

fn new_span_id() -> SpanId {
    // Never all zeros, which would be invalid.
    SpanId((next_u64() | 1).to_le_bytes())
}

fn header(trace_id: TraceId, span: SpanId, sampled: bool) -> HeaderValue {
    let text = trace_export::traceparent(trace_id, span, sampled);
    // Into the thread's chunk of copies, as the request id: no allocation per request.
    HeaderValue::from_maybe_shared(h1::copy_shared(&text))
        .expect("hex digits and dashes are valid header bytes")
}

/// The downstream request's span as it starts.
fn server_span<B>(
    req: &Request<B>,
    trace_id: TraceId,
    span_id: SpanId,
    parent: Option<TraceParent>,
    client: IpAddr,
) -> Span {
    let headers = req.headers();
    let mut span = Span {
        trace_id,
        span_id,
        parent_span_id: parent.map(|p| p.parent_id),
        // Only a trace that goes on keeps its state; past the recommendation's 512 bytes a
        // vendor may drop it, and a span does.
        trace_state: parent.and_then(|_| trace_state(headers)),
        name: "ingress".into(),
        kind: SpanKind::Server,
        start: SystemTime::now(),
        end: SystemTime::UNIX_EPOCH,
        error: None,
        attributes: Vec::with_capacity(12),
    };
    span.set("component", "proxy");
    span.set("http.method", method_text(req.method()));
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| text(headers, &http::header::HOST))
        .unwrap_or_default();
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut url = host;
    url.push_str(path);
    span.set("http.url", bounded(url));
    span.set("http.protocol", version_text(req.version()));
    span.set("peer.address", ip_text(client));
    if let Some(agent) = text(headers, &http::header::USER_AGENT) {
        span.set("user_agent", bounded(agent));
    }
    span
}

fn text(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

// The texts below are built by hand: `format!` and the standard library's `Display` of
// addresses were a quarter of a sampled request's cost on the worker.

fn method_text(method: &http::Method) -> Value {
    // A standard method's name as a static string: no allocation.
    match method.as_str() {
        "GET" => "GET".into(),
        "POST" => "POST".into(),
        "PUT" => "PUT".into(),
        "DELETE" => "DELETE".into(),
        "HEAD" => "HEAD".into(),
        "OPTIONS" => "OPTIONS".into(),
        "PATCH" => "PATCH".into(),
        other => other.to_owned().into(),
    }
}

fn version_text(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_11 => "HTTP/1.1",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP",
    }
}

/// A header's value as an attribute's text.
pub(crate) fn text_of(value: &HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// An address as text: IPv4 digit by digit.
pub(crate) fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let mut text = String::with_capacity(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text.push('.');
                }
                if octet >= 100 {
                    text.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    text.push(char::from(b'0' + octet / 10 % 10));
                }
                text.push(char::from(b'0' + octet % 10));
            }
            text
        }
        IpAddr::V6(v6) => v6.to_string(),
    }
}

/// The recommendation's limit on a `tracestate` a vendor must keep.
const MAX_TRACE_STATE: usize = 512;

/// A request's `tracestate`, its lines joined as one list; `None` past 512 bytes.
fn trace_state(headers: &HeaderMap) -> Option<String> {
    let mut state = String::new();
    for line in headers.get_all(&TRACESTATE) {
        if !state.is_empty() {
            state.push(',');
        }
        state.push_str(&String::from_utf8_lossy(line.as_bytes()));
        if state.len() > MAX_TRACE_STATE {
            return None;
        }
    }
    (!state.is_empty()).then_some(state)
}

/// Envoy's `max_path_tag_length`: client text in a span stops here, so a queued span's size
/// is bounded whatever the client sends.
const MAX_TAG: usize = 256;

fn bounded(mut text: String) -> String {
    if text.len() > MAX_TAG {
        let mut end = MAX_TAG;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A span being recorded, with the monotonic time of its start: its end is the start plus
/// the time elapsed, so a step of the wall clock cannot make it end before it starts.
struct Open {
    span: Span,
    started: Instant,
}

impl Open {
    /// A span whose `start` is the wall time of the monotonic instant `started`.
    fn at(span: Span, started: Instant) -> Box<Open> {
        Box::new(Open { span, started })
    }

    fn finish(self) -> Span {
        let Open { mut span, started } = self;
        span.end = span.start + started.elapsed();
        span
    }
}

/// One request's trace, from its head until its response's last byte.
pub(crate) struct RequestTrace {
    tracer: Rc<WorkerTracer>,
    trace_id: TraceId,
    /// The proxy hop's span id.
    span_id: SpanId,
    /// Whether the request came with a valid context, whose `tracestate` then goes on.
    continued: bool,
    answered: bool,
    /// When the request's head came.
    began: Instant,
    /// The downstream request's span, while open; `None` when not sampled.
    server: Option<Box<Open>>,
    /// A sampled request's span name formats, where its policy has any. Boxed: most
    /// requests have none.
    names: Option<Box<Names>>,
}

/// What a sampled request's span names are made from.
struct Names {
    operation: Option<Rc<SpanName>>,
    upstream_operation: Option<Rc<SpanName>>,
    /// The path as the client sent it, once the route has rewritten it.
    original_path: Option<Box<str>>,
    client: ClientSide,
}

impl RequestTrace {
    pub(crate) fn sampled(&self) -> bool {
        self.server.is_some()
    }

    /// Whether the request's trace context goes on (`false`: a new trace, whose requests
    /// must not carry the client's `tracestate`).
    pub(crate) fn continued(&self) -> bool {
        self.continued
    }

    /// Adds an attribute to the downstream request's span, when sampled.
    pub(crate) fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(open) = &mut self.server {
            open.span.set(key, value);
        }
    }

    /// The request's answer: its status and, for a local reply, why.
    pub(crate) fn answered(&mut self, status: StatusCode, flag: Option<ResponseFlag>) {
        self.answered = true;
        let Some(open) = &mut self.server else {
            return;
        };
        let span = &mut open.span;
        span.set("http.status_code", i64::from(status.as_u16()));
        span.set("response_flags", flag.map_or("-", ResponseFlag::as_str));
        if status.is_server_error() {
            span.set("error", true);
            span.error = Some(flag.map_or_else(
                || format!("status {}", status.as_u16()),
                |flag| flag.as_str().to_owned(),
            ));
        }
    }

    /// A span for a call the proxy makes on the request's behalf, when sampled: a child of
    /// the downstream request's span.
    pub(crate) fn child(&self, name: impl Into<Cow<'static, str>>) -> Option<ChildSpan<'_>> {
        let server = self.server.as_ref()?;
        // Timed from the request's span: the child's start and end fall within it by the
        // monotonic clock, whatever the wall clock does meanwhile.
        let started = Instant::now();
        Some(ChildSpan {
            trace: self,
            outcome_known: false,
            open: Some(Open::at(
                Span {
                    trace_id: self.trace_id,
                    span_id: new_span_id(),
                    parent_span_id: Some(self.span_id),
                    trace_state: server.span.trace_state.clone(),
                    name: name.into(),
                    kind: SpanKind::Client,
                    start: server.span.start + started.saturating_duration_since(server.started),
                    end: SystemTime::UNIX_EPOCH,
                    error: None,
                    attributes: Vec::with_capacity(6),
                },
                started,
            )),
        })
    }

    /// The `traceparent` naming the proxy hop.
    pub(crate) fn traceparent(&self) -> HeaderValue {
        header(self.trace_id, self.span_id, self.sampled())
    }

    /// The request goes upstream as `req`, its path rewritten from `original` where the
    /// route rewrote it: the request span's name is made again from it, as Envoy names the
    /// span from the request as it went.
    pub(crate) fn forwarded(&mut self, req: RequestView<'_>, original: Option<&http::Uri>) {
        let (Some(names), Some(open)) = (&mut self.names, &mut self.server) else {
            return;
        };
        names.original_path = original
            .and_then(http::Uri::path_and_query)
            .map(|p| p.as_str().into());
        if let Some(operation) = &names.operation {
            open.span.name = span_name::render(
                operation,
                req,
                names.client,
                names.original_path.as_deref(),
                None,
            )
            .into();
        }
    }

    /// Whether its span names are made from formats (which may read the path before the
    /// route's rewrite).
    pub(crate) fn has_name_formats(&self) -> bool {
        self.names.is_some()
    }

    /// The request span's name from a route's decorator or the client's
    /// `x-envoy-decorator-operation`, where no `operation` format names it.
    pub(crate) fn name_by_decorator(&mut self, name: &HeaderValue) {
        let Some(open) = &mut self.server else {
            return;
        };
        if self.names.as_ref().is_some_and(|n| n.operation.is_some()) {
            return;
        }
        open.span.name = bounded(text_of(name)).into();
    }

    /// An upstream try's span name by `upstream_operation`, where it has one.
    pub(crate) fn upstream_name(
        &self,
        req: RequestView<'_>,
        upstream: &Upstream<'_>,
    ) -> Option<String> {
        let names = self.names.as_ref()?;
        let operation = names.upstream_operation.as_ref()?;
        Some(span_name::render(
            operation,
            req,
            names.client,
            names.original_path.as_deref(),
            Some(upstream),
        ))
    }
}

impl Drop for RequestTrace {
    /// Ends the downstream request's span: the request is done with.
    fn drop(&mut self) {
        if let Some(open) = self.server.take() {
            let mut span = (*open).finish();
            if !self.answered {
                span.set("error", true);
                span.error = Some("the client went away before the answer".into());
            }
            self.tracer.record(span);
        }
    }
}

/// An open span of a call made for a sampled request: an upstream try, an authorization
/// check. Recorded when dropped; one dropped before its outcome was set (a timeout, the
/// client gone) is recorded as abandoned.
pub(crate) struct ChildSpan<'a> {
    trace: &'a RequestTrace,
    open: Option<Box<Open>>,
    outcome_known: bool,
}

impl ChildSpan<'_> {
    /// The `traceparent` the call carries: this span as the callee's parent.
    pub(crate) fn traceparent(&self) -> HeaderValue {
        match &self.open {
            Some(open) => header(open.span.trace_id, open.span.span_id, true),
            None => self.trace.traceparent(),
        }
    }

    pub(crate) fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(open) = &mut self.open {
            open.span.set(key, value);
        }
    }

    /// The call got an answer; a 5xx marks the span an error, as Envoy's do.
    pub(crate) fn answered(&mut self, status: StatusCode) {
        self.outcome_known = true;
        self.set("http.status_code", i64::from(status.as_u16()));
        if status.is_server_error() {
            self.set("error", true);
            if let Some(open) = &mut self.open {
                open.span.error = Some(format!("status {}", status.as_u16()));
            }
        }
    }

    /// The call got no answer, for this reason.
    pub(crate) fn fail(&mut self, message: String) {
        self.outcome_known = true;
        self.set("error", true);
        if let Some(open) = &mut self.open {
            open.span.error = Some(message);
        }
    }

    /// The call's outcome, when it has no HTTP status: an authorization decision.
    pub(crate) fn done(&mut self) {
        self.outcome_known = true;
    }
}

impl Drop for ChildSpan<'_> {
    fn drop(&mut self) {
        if !self.outcome_known {
            self.fail("abandoned before an answer (a timeout, or the client went away)".into());
        }
        if let Some(open) = self.open.take() {
            self.trace.tracer.record((*open).finish());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_loopback_and_private_ones() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "::1",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "172.32.0.1", "2001:db8::1", "::ffff:8.8.8.8"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn the_sampling_bound_follows_the_percentage() {
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(100.0), u64::MAX);
        let half = threshold(50.0);
        assert!(half.abs_diff(u64::MAX / 2) < 1 << 12, "{half}");
        let one = threshold(1.0) as f64 / u64::MAX as f64;
        assert!((one - 0.01).abs() < 1e-9, "{one}");
    }

    /// A worker's tracer whose exporter has nowhere to send: these tests read decisions.
    fn tracer(random_sampling: f64, force: Option<&'static str>) -> Rc<WorkerTracer> {
        let stats = ProxyStats::new();
        let config = TracingConfig {
            authority: None,
            headers: Vec::new(),
            endpoint: "http://127.0.0.1:9".parse().unwrap(),
            protocol: OtlpProtocol::Grpc,
            timeout: std::time::Duration::from_secs(1),
            service_name: "test".into(),
            resource_attributes: Default::default(),
            random_sampling,
            force_trace_header: force.map(HeaderName::from_static),
            max_queued_spans: 16,
            max_export_batch: 16,
            tls: None,
        };
        let shared = Arc::new(SharedTracer::start(&config, None, &stats).unwrap());
        let shard = stats.registry.shard(&[]);
        Rc::new(WorkerTracer::new(shared, &stats, &shard))
    }

    const SAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const NOT_SAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

    fn request(headers: &[(&'static str, &'static str)]) -> Request<()> {
        let mut req = Request::get("http://edge.test/a?b=1").body(()).unwrap();
        for (name, value) in headers {
            req.headers_mut()
                .insert(*name, HeaderValue::from_static(value));
        }
        req
    }

    fn fields(trace: &RequestTrace) -> (String, String, String) {
        let text = trace.traceparent();
        let text = text.to_str().unwrap();
        let parts: Vec<&str> = text.split('-').collect();
        (parts[1].into(), parts[2].into(), parts[3].into())
    }

    #[test]
    fn a_client_outside_decides_nothing() {
        let outside: IpAddr = "203.0.113.9".parse().unwrap();
        let tracer = tracer(0.0, Some("x-legate-force-trace"));
        let req = request(&[("traceparent", SAMPLED), ("x-legate-force-trace", "1")]);
        let trace = tracer.start(&req, outside, &TracePolicy::default(), false);
        assert!(
            !trace.sampled(),
            "neither its flag nor the force header count"
        );
        let (trace_id, hop, flags) = fields(&trace);
        assert_eq!(
            trace_id, "4bf92f3577b34da6a3ce929d0e0e4736",
            "the trace goes on"
        );
        assert_ne!(hop, "00f067aa0ba902b7");
        assert_eq!(flags, "00");

        let tracer = self::tracer(100.0, None);
        let trace = tracer.start(
            &request(&[("traceparent", NOT_SAMPLED)]),
            outside,
            &TracePolicy::default(),
            false,
        );
        assert!(trace.sampled(), "sampled by rate, whatever it says");
    }

    /// A listener's shares: `x-client-trace-id` is sampled at the client share, others at
    /// the random one (the listener's over the process's), and the overall share caps both.
    #[test]
    fn a_listeners_shares_decide_for_requests_without_a_trusted_decision() {
        let outside: IpAddr = "203.0.113.9".parse().unwrap();
        let tracer = tracer(100.0, None);
        let policy = |random: f64, client: f64, overall: f64| {
            TracePolicy::new(&ListenerTracing {
                random_sampling: Some(random),
                client_sampling: client,
                overall_sampling: overall,
                ..Default::default()
            })
        };
        let asks = request(&[("x-client-trace-id", "c-1")]);
        let plain = request(&[]);
        let client_only = policy(0.0, 100.0, 100.0);
        assert!(tracer.start(&asks, outside, &client_only, false).sampled());
        assert!(!tracer.start(&plain, outside, &client_only, false).sampled());
        let capped = policy(100.0, 100.0, 0.0);
        assert!(!tracer.start(&asks, outside, &capped, false).sampled());
        assert!(!tracer.start(&plain, outside, &capped, false).sampled());
        // No share of its own: the process's 100%.
        assert!(
            tracer
                .start(&plain, outside, &TracePolicy::default(), false)
                .sampled()
        );
    }

    /// OpenTelemetry's samplers decide instead of the shares: always on; by the trace id's
    /// first 8 bytes against the ratio; a trusted parent's flag, else the wrapped sampler.
    #[test]
    fn a_sampler_decides_instead_of_the_shares() {
        let inside: IpAddr = "10.1.2.3".parse().unwrap();
        let outside: IpAddr = "203.0.113.9".parse().unwrap();
        let tracer = tracer(0.0, None);
        let with = |sampler: Sampler| {
            TracePolicy::new(&ListenerTracing {
                random_sampling: Some(0.0),
                sampler: Some(sampler),
                ..Default::default()
            })
        };
        let plain = request(&[]);
        assert!(
            tracer
                .start(&plain, outside, &with(Sampler::AlwaysOn), false)
                .sampled()
        );
        // The trace id's first 8 bytes, little-endian, modulo 100 against 50: 0x31 (49) is
        // below, 0x32 (50) not; only a trusted caller's id counts.
        let low = "00-31000000000000000000000000000000-00f067aa0ba902b7-00";
        let high = "00-32000000000000000000000000000000-00f067aa0ba902b7-01";
        let half = with(Sampler::TraceIdRatio(50.0));
        assert!(
            tracer
                .start(&request(&[("traceparent", low)]), inside, &half, false)
                .sampled()
        );
        assert!(
            !tracer
                .start(&request(&[("traceparent", high)]), inside, &half, false)
                .sampled()
        );
        let none = with(Sampler::TraceIdRatio(0.0));
        assert!(!tracer.start(&plain, outside, &none, false).sampled());
        let parent_based = with(Sampler::ParentBased(Box::new(Sampler::TraceIdRatio(0.0))));
        assert!(
            tracer
                .start(
                    &request(&[("traceparent", SAMPLED)]),
                    inside,
                    &parent_based,
                    false
                )
                .sampled(),
            "a trusted parent's flag"
        );
        assert!(
            !tracer
                .start(
                    &request(&[("traceparent", SAMPLED)]),
                    outside,
                    &parent_based,
                    false,
                )
                .sampled(),
            "a client outside has no say: the wrapped sampler's 0%"
        );
        let parent_on = with(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        assert!(
            !tracer
                .start(
                    &request(&[("traceparent", NOT_SAMPLED)]),
                    inside,
                    &parent_on,
                    false,
                )
                .sampled()
        );
        assert!(tracer.start(&plain, inside, &parent_on, false).sampled());
    }

    #[test]
    fn a_client_inside_decides_for_its_trace() {
        let inside: IpAddr = "10.1.2.3".parse().unwrap();
        let tracer = tracer(0.0, Some("x-legate-force-trace"));
        let trace = tracer.start(
            &request(&[("traceparent", SAMPLED)]),
            inside,
            &TracePolicy::default(),
            false,
        );
        assert!(trace.sampled());
        assert_eq!(fields(&trace).2, "01");
        let parent = trace.server.as_ref().unwrap().span.parent_span_id.unwrap();
        assert_eq!(parent.to_string(), "00f067aa0ba902b7");

        let trace = tracer.start(
            &request(&[("x-legate-force-trace", "")]),
            inside,
            &TracePolicy::default(),
            false,
        );
        assert!(trace.sampled(), "forced");
        assert_eq!(trace.server.as_ref().unwrap().span.parent_span_id, None);

        let tracer = self::tracer(100.0, None);
        let trace = tracer.start(
            &request(&[("traceparent", NOT_SAMPLED)]),
            inside,
            &TracePolicy::default(),
            false,
        );
        assert!(!trace.sampled(), "its own decision, even at 100%");
        let trace = tracer.start(
            &request(&[("x-legate-force-trace", "1")]),
            inside,
            &TracePolicy::default(),
            false,
        );
        assert!(trace.sampled(), "sampled by rate: no caller decision");
        let trace = tracer.start(&request(&[]), inside, &TracePolicy::default(), false);
        assert!(trace.sampled());
    }

    #[test]
    fn two_contexts_are_none_and_client_text_in_a_span_is_bounded() {
        let inside: IpAddr = "127.0.0.1".parse().unwrap();
        let tracer = tracer(100.0, None);
        let mut req = request(&[("traceparent", SAMPLED)]);
        req.headers_mut()
            .append("traceparent", HeaderValue::from_static(SAMPLED));
        let trace = tracer.start(&req, inside, &TracePolicy::default(), false);
        assert!(!trace.continued(), "two headers: a new trace");
        assert_ne!(fields(&trace).0, "4bf92f3577b34da6a3ce929d0e0e4736");

        let long = "x".repeat(600);
        let mut req = Request::get(format!("http://edge.test/{long}"))
            .body(())
            .unwrap();
        let headers = req.headers_mut();
        headers.insert("traceparent", HeaderValue::from_static(SAMPLED));
        headers.insert("user-agent", HeaderValue::from_str(&long).unwrap());
        headers.append("tracestate", HeaderValue::from_static("a=1"));
        headers.append("tracestate", HeaderValue::from_static("b=2"));
        let trace = tracer.start(&req, inside, &TracePolicy::default(), false);
        let span = &trace.server.as_ref().unwrap().span;
        assert_eq!(span.trace_state.as_deref(), Some("a=1,b=2"), "one list");
        for key in ["http.url", "user_agent"] {
            let (_, value) = span.attributes.iter().find(|(k, _)| *k == key).unwrap();
            let Value::Str(text) = value else {
                panic!("{key}: {value:?}")
            };
            assert_eq!(text.len(), MAX_TAG, "{key}");
        }

        let mut req = request(&[("traceparent", SAMPLED)]);
        req.headers_mut()
            .insert("tracestate", HeaderValue::from_str(&long).unwrap());
        let trace = tracer.start(&req, inside, &TracePolicy::default(), false);
        assert!(trace.continued());
        assert_eq!(trace.server.as_ref().unwrap().span.trace_state, None);
    }

    #[test]
    fn a_child_span_names_itself_as_the_callee_parent() {
        let tracer = tracer(100.0, None);
        let trace = tracer.start(
            &request(&[]),
            "127.0.0.1".parse().unwrap(),
            &TracePolicy::default(),
            false,
        );
        let child = trace.child("router backend egress").unwrap();
        let (trace_id, hop, _) = fields(&trace);
        let text = child.traceparent();
        let text = text.to_str().unwrap();
        assert!(text.starts_with(&format!("00-{trace_id}-")));
        assert!(text.ends_with("-01"));
        assert!(!text.contains(&hop), "its own span id, not the hop's");
        let span = &child.open.as_ref().unwrap().span;
        assert_eq!(span.parent_span_id, Some(trace.span_id));

        // Dropped before an outcome (a timeout cancelled the try): recorded as abandoned.
        drop(child);
        let mut answered = trace.child("router backend egress").unwrap();
        answered.answered(StatusCode::BAD_GATEWAY);
        drop(answered);
        let batch = tracer.batch.borrow();
        assert_eq!(batch.len(), 2);
        assert!(batch[0].error.as_deref().unwrap().starts_with("abandoned"));
        assert_eq!(batch[1].error.as_deref(), Some("status 502"));
        assert!(
            batch[1]
                .attributes
                .contains(&("http.status_code".into(), Value::Int(502)))
        );
    }

    #[test]
    fn a_routes_policy_decides_again_keeping_the_start_and_merging_tags() {
        let tag = |tag: &str, text: &str| CustomTag {
            tag: tag.into(),
            value: CustomTagValue::Literal(text.into()),
        };
        let listener = ListenerTracing {
            custom_tags: vec![tag("env", "listener"), tag("zone", "a")],
            operation: Some(SpanName::parse("%REQ(:authority)%", false).unwrap()),
            ..ListenerTracing::default()
        };
        let route = RouteTracing {
            random_sampling: 100.0,
            client_sampling: 100.0,
            overall_sampling: 100.0,
            custom_tags: vec![tag("env", "route")],
            operation: None,
            upstream_operation: Some(SpanName::parse("to-%UPSTREAM_CLUSTER%", true).unwrap()),
        };
        let outside: IpAddr = "203.0.113.9".parse().unwrap();
        let tracer = tracer(0.0, None);
        let req = request(&[]);
        let mut first = tracer.start(&req, outside, &TracePolicy::new(&listener), false);
        assert!(!first.sampled(), "the listener samples none");
        let began = first.began;
        let policy = TracePolicy::for_route(&listener, &route);
        let mut trace = tracer.restart(&mut first, &req, outside, &policy, false);
        drop(first);
        assert!(trace.sampled(), "the route samples all");
        assert_eq!(trace.began, began);
        let address = HeaderValue::from_static("127.0.0.1:1");
        let upstream = Upstream {
            address: &address,
            hostname: None,
            cluster: "backend",
        };
        assert_eq!(
            trace.upstream_name((&req).into(), &upstream).as_deref(),
            Some("to-backend")
        );
        trace.answered(StatusCode::OK, None);
        drop(trace);
        let batch = tracer.batch.borrow();
        assert_eq!(batch.len(), 1, "the first decision is not recorded");
        let span = &batch[0];
        assert_eq!(span.name, "edge.test", "the listener's operation");
        let text = |key: &str| {
            let (_, value) = span.attributes.iter().find(|(k, _)| *k == key).unwrap();
            value.clone()
        };
        assert_eq!(text("env"), Value::from("route"));
        assert_eq!(text("zone"), Value::from("a"));
    }

    #[test]
    fn texts_built_by_hand_match_the_standard_ones() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.30.40",
            "255.255.255.255",
            "1.100.9.250",
            "::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
        for method in ["GET", "POST", "TRACE", "CONNECT", "PURGE"] {
            let parsed = http::Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(method_text(&parsed), Value::from(method.to_owned()));
        }
        assert_eq!(version_text(http::Version::HTTP_2), "HTTP/2.0");
    }

    #[test]
    fn span_ids_are_never_zero_and_trace_ids_differ() {
        for _ in 0..1000 {
            assert_ne!(new_span_id().0, [0; 8]);
        }
        assert_ne!(new_trace_id(), new_trace_id());
    }
}
