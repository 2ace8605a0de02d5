//! The exporter against the testbed's OTLP collector, over real sockets: spans arrive whole
//! over gRPC and over HTTP, a stalled collector fills the bounded queue and later batches
//! are dropped, and a refusing or absent collector is reported as a failure.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use testbed::{CollectorMode, OtlpCollector};
use tokio::sync::mpsc;
use trace_export::{
    Dropped, ExportError, ExportObserver, ExporterConfig, Protocol, Span, SpanId, SpanKind,
    SpanSink, TraceId,
};

const PATIENCE: Duration = Duration::from_secs(20);

#[derive(Debug)]
enum Outcome {
    Exported(usize),
    Failed(usize, String),
}

struct Events(mpsc::UnboundedSender<Outcome>);

impl ExportObserver for Events {
    fn exported(&mut self, spans: usize) {
        let _ = self.0.send(Outcome::Exported(spans));
    }
    fn failed(&mut self, spans: usize, error: &ExportError) {
        let kind = match error {
            ExportError::Grpc { code, .. } => format!("grpc {code:?}"),
            ExportError::Http(status) => format!("http {}", status.as_u16()),
            ExportError::Transport(_) => "transport".to_owned(),
            ExportError::Timeout(_) => "timeout".to_owned(),
        };
        let _ = self.0.send(Outcome::Failed(spans, kind));
    }
}

fn exporter(
    endpoint: String,
    protocol: Protocol,
    max_queued_spans: usize,
    max_export_batch: usize,
) -> (SpanSink, mpsc::UnboundedReceiver<Outcome>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sink = trace_export::start(
        ExporterConfig {
            endpoint: endpoint.parse().expect("endpoint"),
            protocol,
            authority: None,
            headers: Vec::new(),
            timeout: Duration::from_secs(30),
            max_queued_spans,
            max_export_batch,
            resource: vec![("service.name".into(), "edge-test".into())],
            tls: None,
        },
        Events(tx),
    )
    .expect("exporter starts");
    (sink, rx)
}

fn span(trace: u8, id: u8, parent: Option<u8>, kind: SpanKind) -> Span {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut span = Span {
        trace_id: TraceId([trace; 16]),
        span_id: SpanId([id; 8]),
        parent_span_id: parent.map(|p| SpanId([p; 8])),
        trace_state: Some("vendor=x".into()),
        name: format!("span {id}").into(),
        kind,
        start,
        end: start + Duration::from_millis(3),
        error: None,
        attributes: Vec::new(),
    };
    span.set("http.status_code", 200_i64);
    span.set("upstream_cluster", "web");
    span
}

async fn collector() -> OtlpCollector {
    OtlpCollector::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("collector binds")
}

async fn next(events: &mut mpsc::UnboundedReceiver<Outcome>) -> Outcome {
    tokio::time::timeout(PATIENCE, events.recv())
        .await
        .expect("an export outcome in time")
        .expect("exporter alive")
}

async fn spans_arrive_whole(protocol: Protocol) {
    let collector = collector().await;
    let endpoint = match protocol {
        Protocol::Grpc => collector.grpc_endpoint(),
        Protocol::HttpProtobuf => collector.http_endpoint(),
    };
    let (sink, mut events) = exporter(endpoint, protocol, 64, 16);
    let mut failed = span(7, 3, Some(2), SpanKind::Client);
    failed.error = Some("upstream reset".into());
    sink.send(vec![span(7, 2, Some(1), SpanKind::Server)])
        .expect("room");
    sink.send(vec![failed]).expect("room");

    // A drain returns once both are sent: what a stopping process waits for.
    let draining = sink.clone();
    let drained = tokio::task::spawn_blocking(move || draining.drain(PATIENCE))
        .await
        .expect("drain");
    assert!(drained);
    let spans = collector.spans();
    assert_eq!(spans.len(), 2);
    let mut exported = 0;
    while exported < 2 {
        match next(&mut events).await {
            Outcome::Exported(n) => exported += n,
            other => panic!("export failed: {other:?}"),
        }
    }
    let server = spans
        .iter()
        .find(|s| s.name == "span 2")
        .expect("server span");
    assert_eq!(server.trace_id, "07".repeat(16));
    assert_eq!(server.span_id, "02".repeat(8));
    assert_eq!(server.parent_span_id, "01".repeat(8));
    assert_eq!(server.trace_state, "vendor=x");
    assert_eq!(server.kind, 2);
    assert_eq!(server.status_code, 0);
    assert_eq!(server.end_unix_nano - server.start_unix_nano, 3_000_000);
    assert_eq!(server.attributes["http.status_code"], "200");
    assert_eq!(server.attributes["upstream_cluster"], "web");
    assert_eq!(server.service_name, "edge-test");
    let client = spans
        .iter()
        .find(|s| s.name == "span 3")
        .expect("client span");
    assert_eq!(client.kind, 3);
    assert_eq!(client.status_code, 2, "an error status");
    let expected = match protocol {
        Protocol::Grpc => "grpc",
        Protocol::HttpProtobuf => "http",
    };
    assert!(spans.iter().all(|s| s.protocol == expected));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_arrive_whole_over_grpc() {
    spans_arrive_whole(Protocol::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_arrive_whole_over_http() {
    spans_arrive_whole(Protocol::HttpProtobuf).await;
}

/// Polls `done` until it holds, or panics after [`PATIENCE`].
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collector_fills_the_queue_and_later_batches_are_dropped() {
    let collector = collector().await;
    collector.set_mode(CollectorMode::Stall);
    let (sink, mut events) = exporter(collector.grpc_endpoint(), Protocol::Grpc, 4, 2);

    // The exporter takes the first batch off the queue and waits on the collector with it.
    sink.send(vec![
        span(1, 1, None, SpanKind::Server),
        span(1, 2, Some(1), SpanKind::Client),
    ])
    .expect("room");
    until("the first export", || collector.exports() == 1).await;
    assert_eq!(sink.queued(), 0);

    // Four spans fill the queue; the fifth has no room and is refused, not queued.
    sink.send(vec![
        span(2, 1, None, SpanKind::Server),
        span(2, 2, Some(1), SpanKind::Client),
    ])
    .expect("room");
    sink.send(vec![
        span(3, 1, None, SpanKind::Server),
        span(3, 2, Some(1), SpanKind::Client),
    ])
    .expect("room");
    assert_eq!(sink.queued(), 4);
    assert_eq!(
        sink.send(vec![span(4, 1, None, SpanKind::Server)]),
        Err(Dropped(1))
    );
    assert!(
        collector.spans().is_empty(),
        "the collector holds the first export"
    );
    // Nor can a drain end while the collector holds it: the drain gives up at its limit.
    let draining = sink.clone();
    let drained = tokio::task::spawn_blocking(move || draining.drain(Duration::from_millis(100)))
        .await
        .expect("drain");
    assert!(!drained);

    // Once the collector answers, everything queued is sent; the dropped span never is.
    collector.set_mode(CollectorMode::Accept);
    let mut exported = 0;
    while exported < 6 {
        match next(&mut events).await {
            Outcome::Exported(n) => exported += n,
            other => panic!("export failed: {other:?}"),
        }
    }
    assert_eq!(exported, 6);
    let spans = collector.spans();
    assert_eq!(spans.len(), 6);
    assert!(!spans.iter().any(|s| s.trace_id == "04".repeat(16)));
    assert_eq!(sink.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_collector_is_a_failure_of_the_batch() {
    let collector = collector().await;
    collector.set_mode(CollectorMode::Refuse);
    let (grpc, mut grpc_events) = exporter(collector.grpc_endpoint(), Protocol::Grpc, 16, 16);
    let (http, mut http_events) =
        exporter(collector.http_endpoint(), Protocol::HttpProtobuf, 16, 16);
    grpc.send(vec![span(1, 1, None, SpanKind::Server)])
        .expect("room");
    http.send(vec![
        span(2, 1, None, SpanKind::Server),
        span(2, 2, Some(1), SpanKind::Client),
    ])
    .expect("room");
    match next(&mut grpc_events).await {
        Outcome::Failed(1, kind) => assert_eq!(kind, "grpc Unavailable"),
        other => panic!("unexpected: {other:?}"),
    }
    match next(&mut http_events).await {
        Outcome::Failed(2, kind) => assert_eq!(kind, "http 503"),
        other => panic!("unexpected: {other:?}"),
    }
    assert!(collector.spans().is_empty());

    // The same exporters deliver once the collector takes spans again.
    collector.set_mode(CollectorMode::Accept);
    grpc.send(vec![span(3, 1, None, SpanKind::Server)])
        .expect("room");
    assert!(matches!(next(&mut grpc_events).await, Outcome::Exported(1)));
    assert_eq!(collector.spans().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_collector_is_a_transport_failure() {
    // A port bound and never listened on: connections are refused, and no one else can
    // take the port meanwhile.
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bound");
    let closed = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("an address");
    for (endpoint, protocol) in [
        (format!("http://{closed}"), Protocol::Grpc),
        (format!("http://{closed}/v1/traces"), Protocol::HttpProtobuf),
    ] {
        let (sink, mut events) = exporter(endpoint, protocol, 16, 16);
        sink.send(vec![span(1, 1, None, SpanKind::Server)])
            .expect("room");
        match next(&mut events).await {
            Outcome::Failed(1, kind) => {
                // tonic reports a refused connection as UNAVAILABLE.
                assert!(
                    kind == "transport" || kind == "grpc Unavailable",
                    "{protocol:?}: {kind}"
                );
            }
            other => panic!("{protocol:?}: unexpected {other:?}"),
        }
    }
}
