//! Distributed tracing for a proxy: the W3C trace context read from requests and written
//! onto the ones sent on, finished spans as plain records, and their export over OTLP.
//!
//! The request path records a [`Span`] when an operation ends and hands spans in batches to
//! a [`SpanSink`]; the exporter's own thread turns them into OTLP messages (the
//! `opentelemetry-proto` definitions) and sends them to a collector over gRPC or HTTP. The
//! queue between the two is bounded in spans: when the collector is slow or gone, batches
//! are dropped and counted, and requests never wait. Log records (access logs for an
//! OpenTelemetry collector) travel the same way, through [`start_logs`] and a [`LogSink`].
//!
//! ```no_run
//! use std::time::{Duration, SystemTime};
//! use trace_export::{ExportError, ExportObserver, ExporterConfig, Protocol, Span, SpanId,
//!     SpanKind, TraceParent};
//!
//! struct Counts;
//! impl ExportObserver for Counts {
//!     fn exported(&mut self, _spans: usize) {}
//!     fn failed(&mut self, spans: usize, error: &ExportError) {
//!         eprintln!("{spans} spans lost: {error}");
//!     }
//! }
//!
//! # fn run() -> std::io::Result<()> {
//! let sink = trace_export::start(
//!     ExporterConfig {
//!         endpoint: "http://127.0.0.1:4317".parse().unwrap(),
//!         protocol: Protocol::Grpc,
//!         authority: None,
//!         headers: Vec::new(),
//!         timeout: Duration::from_secs(5),
//!         max_queued_spans: 8192,
//!         max_export_batch: 512,
//!         resource: vec![("service.name".into(), "edge".into())],
//!         tls: None,
//!     },
//!     Counts,
//! )?;
//! let parent = TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
//!     .unwrap();
//! let now = SystemTime::now();
//! let span = Span {
//!     trace_id: parent.trace_id,
//!     span_id: SpanId([1, 2, 3, 4, 5, 6, 7, 8]),
//!     parent_span_id: Some(parent.parent_id),
//!     trace_state: None,
//!     name: "ingress".into(),
//!     kind: SpanKind::Server,
//!     start: now,
//!     end: now,
//!     error: None,
//!     attributes: vec![("http.status_code".into(), 200_i64.into())],
//! };
//! let _ = sink.send(vec![span]);
//! # Ok(())
//! # }
//! ```

mod context;
mod exporter;
mod log;
mod otlp;
mod span;
mod transport;

use std::time::Duration;

pub use context::{SpanId, TRACEPARENT_LEN, TraceId, TraceParent, traceparent};
pub use exporter::{
    Dropped, ExportObserver, ExporterConfig, LogSink, Sink, SpanSink, Tls, start, start_logs,
};
pub use log::LogRecord;
pub use span::{Span, SpanKind, Value};

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
    Grpc,
    /// OTLP/HTTP with protobuf bodies.
    HttpProtobuf,
}

/// Why a batch was not exported. Its spans are lost; the next batch tries again.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the collector answered with gRPC status {code:?}: {message}")]
    Grpc { code: tonic::Code, message: String },
    #[error("the collector answered with HTTP status {0}")]
    Http(http::StatusCode),
    #[error("cannot reach the collector: {0}")]
    Transport(String),
    #[error("no answer from the collector within {0:?}")]
    Timeout(Duration),
}
