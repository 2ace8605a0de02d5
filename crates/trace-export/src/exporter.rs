//! The exporter: a thread of its own that takes batches of finished spans (or log records)
//! from a bounded queue and sends them to the collector, so no request ever waits for the
//! collector.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::log::LogRecord;
use crate::otlp::{export_request, logs_request};
use crate::span::{Span, Value};
use crate::transport::{Export, Transport};
use crate::{ExportError, Protocol};

/// Where and how spans (or log records) are exported.
#[derive(Debug, Clone)]
pub struct ExporterConfig {
    /// `http://host:4317` for gRPC; the whole URL (`http://host:4318/v1/traces`) for HTTP.
    pub endpoint: http::Uri,
    pub protocol: Protocol,
    /// The collector's name on each export (gRPC's `:authority`, HTTP's `host`) when it is
    /// not the endpoint's host.
    pub authority: Option<http::uri::Authority>,
    /// Sent with each export: gRPC metadata, HTTP headers.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Bounds each export, connecting included.
    pub timeout: Duration,
    /// Spans (or log records) waiting for export at most; a batch that would go past it is
    /// dropped whole.
    pub max_queued_spans: usize,
    /// Spans (or log records) sent in one export at most.
    pub max_export_batch: usize,
    /// What describes the process: `service.name` and the like.
    pub resource: Vec<(String, Value)>,
    /// TLS to the collector, for an `https://` endpoint.
    pub tls: Option<Tls>,
}

/// TLS to a collector: the client config (its roots, its client certificate; ALPN is set
/// here) and the name its certificate must carry.
#[derive(Clone)]
pub struct Tls {
    pub config: Arc<rustls::ClientConfig>,
    pub server_name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Told how each export went, on the exporter's thread: for counters and logs.
pub trait ExportObserver: Send + 'static {
    fn exported(&mut self, spans: usize);
    fn failed(&mut self, spans: usize, error: &ExportError);
}

/// What an exporter sends: each kind becomes its own OTLP export request.
pub(crate) trait Exported: Send + 'static {
    fn request(resource: &[(String, Value)], batch: Vec<Self>) -> Export
    where
        Self: Sized;
}

impl Exported for Span {
    fn request(resource: &[(String, Value)], batch: Vec<Self>) -> Export {
        Export::Traces(export_request(resource, batch))
    }
}

impl Exported for LogRecord {
    fn request(resource: &[(String, Value)], batch: Vec<Self>) -> Export {
        Export::Logs(logs_request(resource, batch))
    }
}

/// What the exporter's queue carries.
enum Message<T> {
    Items(Vec<T>),
    /// Answered once everything queued before it has been sent (or has failed).
    Drain(std::sync::mpsc::Sender<()>),
}

/// The sending side of an exporter's queue. Cheap to clone, one per worker. When the last
/// clone is dropped, the exporter sends what is queued and its thread ends.
pub struct Sink<T> {
    tx: mpsc::UnboundedSender<Message<T>>,
    queued: Arc<AtomicUsize>,
    max_queued: usize,
}

impl<T> Clone for Sink<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            queued: Arc::clone(&self.queued),
            max_queued: self.max_queued,
        }
    }
}

/// The queue of a span exporter.
pub type SpanSink = Sink<Span>;
/// The queue of a log exporter.
pub type LogSink = Sink<LogRecord>;

/// A batch the queue had no room for (or the exporter is gone): these are lost.
#[derive(Debug, PartialEq, Eq)]
pub struct Dropped(pub usize);

impl<T> Sink<T> {
    /// Queues a batch for export, or drops it whole when the queue is full: spans and logs
    /// are worth less than the memory and time of the requests they describe.
    pub fn send(&self, batch: Vec<T>) -> Result<(), Dropped> {
        let n = batch.len();
        if n == 0 {
            return Ok(());
        }
        let reserved = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued + n <= self.max_queued).then_some(queued + n)
            });
        if reserved.is_err() {
            return Err(Dropped(n));
        }
        self.tx.send(Message::Items(batch)).map_err(|_| {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            Dropped(n)
        })
    }

    /// Waits, blocking the calling thread up to `limit`, until everything queued so far has
    /// been sent: for a process about to exit. Returns whether it was.
    pub fn drain(&self, limit: Duration) -> bool {
        let (done, drained) = std::sync::mpsc::channel();
        if self.tx.send(Message::Drain(done)).is_err() {
            return self.queued() == 0;
        }
        drained.recv_timeout(limit).is_ok()
    }

    /// Items queued and not yet taken by the exporter.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

/// Starts a span exporter's thread and returns the queue's sending side.
pub fn start(config: ExporterConfig, observer: impl ExportObserver) -> std::io::Result<SpanSink> {
    start_sink(config, observer)
}

/// Starts a log exporter's thread (OTLP logs: `LogsService/Export`, or the HTTP endpoint
/// given, usually `/v1/logs`) and returns the queue's sending side.
pub fn start_logs(
    config: ExporterConfig,
    observer: impl ExportObserver,
) -> std::io::Result<LogSink> {
    start_sink(config, observer)
}

fn start_sink<T: Exported>(
    config: ExporterConfig,
    observer: impl ExportObserver,
) -> std::io::Result<Sink<T>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let sink = Sink {
        tx,
        queued: Arc::clone(&queued),
        max_queued: config.max_queued_spans.max(1),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("legate-otlp".into())
        .spawn(move || runtime.block_on(export_loop(config, rx, queued, observer)))?;
    Ok(sink)
}

async fn export_loop<T: Exported>(
    config: ExporterConfig,
    mut rx: mpsc::UnboundedReceiver<Message<T>>,
    queued: Arc<AtomicUsize>,
    mut observer: impl ExportObserver,
) {
    let mut transport = Transport::new(&config);
    let limit = config.max_export_batch.max(1);
    while let Some(first) = rx.recv().await {
        let mut drained = None;
        let mut items = match first {
            Message::Items(items) => items,
            Message::Drain(done) => {
                let _ = done.send(());
                continue;
            }
        };
        while items.len() < limit {
            match rx.try_recv() {
                Ok(Message::Items(more)) => items.extend(more),
                Ok(Message::Drain(done)) => {
                    drained = Some(done);
                    break;
                }
                Err(_) => break,
            }
        }
        // Taken off the queue: room for the workers' next batches while this one goes.
        queued.fetch_sub(items.len(), Ordering::AcqRel);
        while !items.is_empty() {
            let rest = items.split_off(items.len().min(limit));
            let n = items.len();
            let request = T::request(&config.resource, std::mem::replace(&mut items, rest));
            let outcome =
                match tokio::time::timeout(config.timeout, transport.export(request)).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(ExportError::Timeout(config.timeout)),
                };
            match outcome {
                Ok(()) => observer.exported(n),
                Err(error) => observer.failed(n, &error),
            }
        }
        if let Some(done) = drained {
            let _ = done.send(());
        }
    }
}
