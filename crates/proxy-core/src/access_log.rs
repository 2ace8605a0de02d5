//! Access log: one line (or OpenTelemetry record) per request and logger of a listener, off
//! by default.
//!
//! A worker formats lines into its own buffer per logger; full buffers, and every buffer at
//! least every [`FLUSH_EVERY`], go over a bounded channel to a writer thread per destination.
//! Records for a collector go the same way, in batches, to an OTLP exporter thread per
//! collector. A worker never waits for the disk or the collector: if the writer falls behind,
//! chunks (or batches) are dropped and counted.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, StatusCode, Version};

use config::access_log::filter::LogFacts;
use config::access_log::{
    AccessLogConfig, Field, HeaderField, JsonFormat, LogFilter, LogFormat, LogTarget, OtlpLogTarget,
};

use crate::error::ResponseFlag;

/// How often a worker hands its partial buffer to the writer.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// A worker hands its buffer over once it holds this much.
const FLUSH_AT: usize = 16 * 1024;
/// Chunks queued per destination before new ones are dropped.
const QUEUE_CHUNKS: usize = 1024;
/// A worker hands its records for a collector over once it holds this many.
const FLUSH_RECORDS: usize = 512;
/// Records queued per collector before new batches are dropped.
const QUEUE_RECORDS: usize = 8192;

/// What one request leaves behind for its log line.
#[derive(Debug, Default)]
pub(crate) struct LogRecord {
    pub(crate) method: Option<Method>,
    pub(crate) path: Option<http::uri::PathAndQuery>,
    pub(crate) version: Option<Version>,
    pub(crate) status: Option<StatusCode>,
    pub(crate) flag: Option<ResponseFlag>,
    pub(crate) bytes_received: u64,
    pub(crate) bytes_sent: u64,
    /// The upstream host as text (formatted once per host).
    pub(crate) upstream: Option<http::HeaderValue>,
    pub(crate) request_id: Option<http::HeaderValue>,
    pub(crate) peer: Option<SocketAddr>,
    /// The request headers the format shows, in the order of [`WorkerLog`]'s list.
    pub(crate) request_headers: Vec<Option<http::HeaderValue>>,
    /// The same for response headers.
    pub(crate) response_headers: Vec<Option<http::HeaderValue>>,
}

/// A log line in the making, recycled through its worker's [`WorkerLog`] so a logged request
/// costs no allocation.
pub(crate) struct PendingLog {
    pub(crate) record: LogRecord,
    pub(crate) wall_start: SystemTime,
    /// Request body bytes, counted by the body as it streams upstream.
    pub(crate) received: Rc<Cell<u64>>,
}

/// Log records kept for reuse per worker and listener.
const PENDING_POOL: usize = 256;

/// A destination's sending side.
#[derive(Clone)]
pub(crate) enum SinkTx {
    /// Chunks of lines for a writer thread.
    Lines(SyncSender<Vec<u8>>),
    /// Batches of records for a collector's exporter.
    Records(trace_export::LogSink),
}

/// Where [`reopen`] leaves a file opened again for its writer thread, which takes it before
/// its next batch. Held only to store or take: a busy or stalled writer never holds up the
/// thread that asks for the reopen.
type FreshFile = Arc<FreshSlot>;

/// Every log file's slot, of every set of sinks whose writer still runs (a reload that
/// changes the log targets leaves older connections writing through the old sinks), so that a
/// reopen reaches them all.
static FILES: Mutex<Vec<(PathBuf, Weak<FreshSlot>)>> = Mutex::new(Vec::new());

type FreshSlot = Mutex<Option<File>>;

/// The writer threads (and collectors' exporters), one per destination, shared by every
/// worker.
pub(crate) struct LogSinks {
    senders: Vec<(LogTarget, SinkTx)>,
    pub(crate) dropped: Arc<AtomicU64>,
}

impl LogSinks {
    /// Opens every destination the config names (files in append mode) and starts a writer
    /// thread (or an exporter) for each.
    pub(crate) fn open(targets: impl Iterator<Item = LogTarget>) -> io::Result<LogSinks> {
        let mut senders: Vec<(LogTarget, SinkTx)> = Vec::new();
        for target in targets {
            if senders.iter().any(|(t, _)| *t == target) {
                continue;
            }
            let out = match &target {
                LogTarget::Stdout => Destination::Stdout(io::stdout()),
                LogTarget::File(path) => {
                    let file = open_for_append(path)?;
                    let fresh = FreshFile::default();
                    lock(&FILES).push((path.clone(), Arc::downgrade(&fresh)));
                    Destination::File(file, fresh)
                }
                LogTarget::Otlp(otlp) => {
                    let sink =
                        trace_export::start_logs(exporter_config(otlp)?, Observer::new(otlp))?;
                    senders.push((target, SinkTx::Records(sink)));
                    continue;
                }
            };
            let (tx, rx) = sync_channel(QUEUE_CHUNKS);
            std::thread::Builder::new()
                .name("legate-access-log".into())
                .spawn(move || write_loop(rx, out))?;
            senders.push((target, SinkTx::Lines(tx)));
        }
        Ok(LogSinks {
            senders,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Whether these sinks write to exactly `targets` (repeats aside).
    pub(crate) fn targets_are(&self, targets: impl Iterator<Item = LogTarget>) -> bool {
        let targets: Vec<LogTarget> = targets.collect();
        targets
            .iter()
            .all(|target| self.senders.iter().any(|(t, _)| t == target))
            && self.senders.iter().all(|(t, _)| targets.contains(t))
    }

    pub(crate) fn sender(&self, target: &LogTarget) -> Option<SinkTx> {
        self.senders
            .iter()
            .find(|(t, _)| t == target)
            .map(|(_, tx)| tx.clone())
    }
}

fn exporter_config(otlp: &OtlpLogTarget) -> io::Result<trace_export::ExporterConfig> {
    Ok(trace_export::ExporterConfig {
        endpoint: otlp.endpoint.clone(),
        protocol: trace_export::Protocol::Grpc,
        authority: otlp.authority.clone(),
        headers: otlp.headers.clone(),
        timeout: otlp.timeout,
        max_queued_spans: QUEUE_RECORDS,
        max_export_batch: FLUSH_RECORDS,
        resource: otlp
            .resource
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect(),
        tls: otlp
            .tls
            .as_ref()
            .map(crate::tls::collector_tls)
            .transpose()?,
    })
}

/// Logs a collector's failed exports, at most once a second.
struct Observer {
    errors: crate::throttle::LogThrottle,
    endpoint: String,
}

impl Observer {
    fn new(otlp: &OtlpLogTarget) -> Self {
        Self {
            errors: crate::throttle::LogThrottle::default(),
            endpoint: otlp.endpoint.to_string(),
        }
    }
}

impl trace_export::ExportObserver for Observer {
    fn exported(&mut self, _records: usize) {}

    fn failed(&mut self, records: usize, error: &trace_export::ExportError) {
        if let Some(failed) = self.errors.hit() {
            tracing::warn!(endpoint = %self.endpoint, records, failed, %error, "access log export failed; records were lost");
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Opens every access log file again by its path (`SIGUSR1`, `POST /reopen_logs`), as after
/// logrotate renamed it: lines written before go to the file as it was, later ones to the
/// file now at the path (made if missing), and none is lost. Each writer takes its new file
/// before its next batch and closes the old one then. A file that cannot be opened is kept
/// as it was. Each path (once) with what happened.
pub(crate) fn reopen() -> Vec<(PathBuf, io::Result<()>)> {
    let mut outcomes: Vec<(PathBuf, io::Result<()>)> = Vec::new();
    let mut files = lock(&FILES);
    files.retain(|(_, slot)| slot.strong_count() > 0);
    for (path, slot) in files.iter() {
        let Some(slot) = slot.upgrade() else {
            continue;
        };
        let reopened = open_for_append(path).map(|fresh| *lock(&slot) = Some(fresh));
        match outcomes.iter_mut().find(|(p, _)| p == path) {
            Some((_, outcome)) => {
                if outcome.is_ok() {
                    *outcome = reopened;
                }
            }
            None => outcomes.push((path.clone(), reopened)),
        }
    }
    outcomes
}

/// [`reopen`], each path's outcome logged.
pub(crate) fn reopen_and_report() -> Vec<(PathBuf, io::Result<()>)> {
    let outcomes = reopen();
    for (path, outcome) in &outcomes {
        match outcome {
            Ok(()) => tracing::info!(path = %path.display(), "access log reopened"),
            Err(error) => tracing::error!(
                path = %path.display(), %error,
                "cannot reopen the access log; still writing to the file it had"
            ),
        }
    }
    outcomes
}

/// Where a writer thread writes: stdout, or a file and where a reopened one is left for it.
enum Destination {
    Stdout(io::Stdout),
    File(File, FreshFile),
}

/// In append mode, made if missing: every write lands at the end, also after logrotate's
/// `copytruncate` has emptied the file under it.
fn open_for_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Chunks written between two flushes (and two looks for a reopened file), at most.
const BATCH_CHUNKS: usize = 64;

fn write_loop(rx: Receiver<Vec<u8>>, mut out: Destination) {
    while let Ok(chunk) = rx.recv() {
        let failed = match &mut out {
            Destination::Stdout(stdout) => write_batch(&mut stdout.lock(), chunk, &rx),
            Destination::File(file, fresh) => {
                // Whole batches go to one file or the other: no line is cut between them.
                if let Some(reopened) = lock(fresh).take() {
                    *file = reopened;
                }
                write_batch(file, chunk, &rx)
            }
        };
        if failed {
            tracing::warn!("access log write failed; lines were lost");
        }
    }
}

/// Writes `chunk` and what else is queued (up to a batch), then flushes once: whether a
/// write failed.
fn write_batch(out: &mut impl Write, chunk: Vec<u8>, rx: &Receiver<Vec<u8>>) -> bool {
    let mut failed = out.write_all(&chunk).is_err();
    // Drain what is queued before flushing, so a burst costs one flush.
    for _ in 1..BATCH_CHUNKS {
        let Ok(chunk) = rx.try_recv() else {
            break;
        };
        failed |= out.write_all(&chunk).is_err();
    }
    failed | out.flush().is_err()
}

/// One worker's access logs for one listener: the record each request fills, and its
/// loggers. Lines still buffered when it is dropped (its listener's config was replaced and
/// its last connection closed) are handed on then.
pub(crate) struct WorkerLog {
    outputs: Vec<Output>,
    /// The headers `%REQ(...)%` and `%RESP(...)%` show in any logger, each once: what a
    /// request captures.
    request_fields: Vec<HeaderField>,
    response_fields: Vec<HeaderField>,
    /// A JSON value (or record part) being rendered before it is escaped.
    scratch: RefCell<Vec<u8>>,
    // Boxed: a request holds its record by pointer, keeping its future small; the pool hands
    // the same boxes round.
    #[allow(clippy::vec_box)]
    spare: RefCell<Vec<Box<PendingLog>>>,
    clock: RefCell<SecondCache>,
    dropped: Arc<AtomicU64>,
}

/// One logger: its format and where its lines (or records) go.
struct Output {
    format: LogFormat,
    json: Option<JsonFormat>,
    /// A record's attributes (collectors only).
    attributes: Vec<(String, LogFormat)>,
    /// Which exchanges it writes; `None`: all.
    filter: Option<LogFilter>,
    sink: OutputSink,
}

enum OutputSink {
    Lines {
        buf: RefCell<Vec<u8>>,
        tx: SyncSender<Vec<u8>>,
    },
    Records {
        batch: RefCell<Vec<trace_export::LogRecord>>,
        tx: trace_export::LogSink,
    },
}

impl Drop for WorkerLog {
    fn drop(&mut self) {
        self.flush();
    }
}

impl WorkerLog {
    /// `loggers`: each logger's settings and its destination's sending side.
    pub(crate) fn new(loggers: Vec<(&AccessLogConfig, SinkTx)>, dropped: Arc<AtomicU64>) -> Self {
        let mut request_fields: Vec<HeaderField> = Vec::new();
        let mut response_fields: Vec<HeaderField> = Vec::new();
        let mut outputs = Vec::with_capacity(loggers.len());
        for (config, tx) in loggers {
            let mut fields: Vec<&Field> = match &config.json_format {
                None => config.format.0.iter().collect(),
                Some(json) => json.0.iter().flat_map(|(_, f)| &f.0).collect(),
            };
            fields.extend(config.attributes.iter().flat_map(|(_, f)| &f.0));
            for field in fields {
                let (list, header) = match field {
                    Field::RequestHeader(h) | Field::RequestHeaderWithoutQuery(h) => {
                        (&mut request_fields, h)
                    }
                    Field::ResponseHeader(h) => (&mut response_fields, h),
                    _ => continue,
                };
                if !list.contains(header) {
                    list.push(header.clone());
                }
            }
            // The headers its filter reads, kept whole.
            let read = config.filter.iter().flat_map(LogFilter::headers);
            for name in read {
                let whole = HeaderField {
                    name,
                    alternative: None,
                    max_len: None,
                };
                if !request_fields.contains(&whole) {
                    request_fields.push(whole);
                }
            }
            outputs.push(Output {
                format: config.format.clone(),
                json: config.json_format.clone(),
                attributes: config.attributes.clone(),
                filter: config.filter.clone(),
                sink: match tx {
                    SinkTx::Lines(tx) => OutputSink::Lines {
                        buf: RefCell::new(Vec::with_capacity(FLUSH_AT)),
                        tx,
                    },
                    SinkTx::Records(tx) => OutputSink::Records {
                        batch: RefCell::new(Vec::new()),
                        tx,
                    },
                },
            });
        }
        Self {
            outputs,
            request_fields,
            response_fields,
            scratch: RefCell::new(Vec::new()),
            spare: RefCell::new(Vec::new()),
            clock: RefCell::new(SecondCache::default()),
            dropped,
        }
    }

    /// Keeps the request headers the format shows. `tls`: the scheme, for `:scheme`.
    pub(crate) fn capture_request<B>(
        &self,
        record: &mut LogRecord,
        req: &http::Request<B>,
        tls: bool,
    ) {
        if self.request_fields.is_empty() {
            return;
        }
        let one = |name: &str| -> Option<http::HeaderValue> {
            let value = crate::pseudo_headers::request_header(
                req.method(),
                req.uri(),
                req.headers(),
                tls,
                name,
            )?;
            http::HeaderValue::from_bytes(value).ok()
        };
        record.request_headers.clear();
        record.request_headers.extend(
            self.request_fields
                .iter()
                .map(|f| one(&f.name).or_else(|| f.alternative.as_deref().and_then(one))),
        );
    }

    /// Keeps the response headers the format shows.
    pub(crate) fn capture_response(&self, record: &mut LogRecord, headers: &http::HeaderMap) {
        if self.response_fields.is_empty() {
            return;
        }
        let one = |name: &str| headers.get(name).cloned();
        record.response_headers.clear();
        record.response_headers.extend(
            self.response_fields
                .iter()
                .map(|f| one(&f.name).or_else(|| f.alternative.as_deref().and_then(one))),
        );
    }

    pub(crate) fn record(&self, record: &LogRecord, started: SystemTime, duration: Duration) {
        for output in &self.outputs {
            if let Some(filter) = &output.filter {
                let facts = Facts {
                    log: self,
                    record,
                    duration,
                };
                if !filter.passes(&facts) {
                    continue;
                }
            }
            let full = match &output.sink {
                OutputSink::Lines { buf, .. } => {
                    let mut buf = buf.borrow_mut();
                    let line: &mut Vec<u8> = &mut buf;
                    match &output.json {
                        None => {
                            for field in &output.format.0 {
                                self.write_field(line, field, record, started, duration);
                            }
                        }
                        Some(json) => self.write_json(line, json, record, started, duration),
                    }
                    line.len() >= FLUSH_AT
                }
                OutputSink::Records { batch, .. } => {
                    let text = |format: &LogFormat| {
                        let mut scratch = self.scratch.borrow_mut();
                        scratch.clear();
                        for field in &format.0 {
                            self.write_field(&mut scratch, field, record, started, duration);
                        }
                        String::from_utf8_lossy(&scratch).into_owned()
                    };
                    let entry = trace_export::LogRecord {
                        time: started,
                        body: text(&output.format),
                        attributes: output
                            .attributes
                            .iter()
                            .map(|(key, format)| (key.clone(), text(format).into()))
                            .collect(),
                    };
                    let mut batch = batch.borrow_mut();
                    batch.push(entry);
                    batch.len() >= FLUSH_RECORDS
                }
            };
            if full {
                self.flush_output(output);
            }
        }
    }

    /// `{"key":value,...}` and the line's end.
    fn write_json(
        &self,
        line: &mut Vec<u8>,
        json: &JsonFormat,
        record: &LogRecord,
        started: SystemTime,
        duration: Duration,
    ) {
        let mut scratch = self.scratch.borrow_mut();
        line.push(b'{');
        for (i, (key, value)) in json.0.iter().enumerate() {
            if i > 0 {
                line.push(b',');
            }
            push_json_string(line, key.as_bytes());
            line.push(b':');
            scratch.clear();
            for field in &value.0 {
                self.write_field(&mut scratch, field, record, started, duration);
            }
            match value.0.as_slice() {
                [field] if is_numeric(field) => line.extend_from_slice(&scratch),
                [field] if !matches!(field, Field::Text(_)) && *scratch == *b"-" => {
                    line.extend_from_slice(b"null");
                }
                _ => push_json_string(line, &scratch),
            }
        }
        line.extend_from_slice(b"}\n");
    }

    /// One field's text, as a text line has it.
    fn write_field(
        &self,
        line: &mut Vec<u8>,
        field: &Field,
        record: &LogRecord,
        started: SystemTime,
        duration: Duration,
    ) {
        match field {
            Field::Text(t) => line.extend_from_slice(t.as_bytes()),
            Field::StartTime => self.clock.borrow_mut().write(line, started),
            Field::Method => match &record.method {
                Some(m) => line.extend_from_slice(m.as_str().as_bytes()),
                None => line.push(b'-'),
            },
            Field::Path => match &record.path {
                Some(p) => line.extend_from_slice(p.as_str().as_bytes()),
                None => line.push(b'-'),
            },
            Field::Protocol => line.extend_from_slice(match record.version {
                Some(Version::HTTP_2) => b"HTTP/2",
                Some(Version::HTTP_3) => b"HTTP/3",
                Some(Version::HTTP_10) => b"HTTP/1.0",
                Some(Version::HTTP_11) => b"HTTP/1.1",
                _ => b"-",
            }),
            Field::ResponseCode => match record.status {
                Some(s) => line.extend_from_slice(s.as_str().as_bytes()),
                None => line.push(b'0'),
            },
            Field::ResponseFlags => match record.flag {
                Some(f) => line.extend_from_slice(f.as_str().as_bytes()),
                None => line.push(b'-'),
            },
            Field::BytesReceived => push_u64(line, record.bytes_received),
            Field::BytesSent => push_u64(line, record.bytes_sent),
            Field::Duration => push_u64(line, duration.as_millis() as u64),
            Field::UpstreamHost => match &record.upstream {
                Some(a) => line.extend_from_slice(a.as_bytes()),
                None => line.push(b'-'),
            },
            Field::RequestId => match &record.request_id {
                Some(id) => line.extend_from_slice(id.as_bytes()),
                None => line.push(b'-'),
            },
            Field::DownstreamRemoteAddress => match record.peer {
                Some(a) => push_socket_addr(line, a),
                None => line.push(b'-'),
            },
            Field::RequestHeader(h) => {
                let at = self.request_fields.iter().position(|f| f == h);
                push_header(line, h, at.and_then(|i| record.request_headers.get(i)));
            }
            Field::RequestHeaderWithoutQuery(h) => {
                let at = self.request_fields.iter().position(|f| f == h);
                let value = at.and_then(|i| record.request_headers.get(i));
                let start = line.len();
                push_header(line, h, value);
                // Kept whole (and cut to its length) with `REQ`; the query goes here.
                if value.is_some_and(Option::is_some)
                    && let Some(q) = line[start..].iter().position(|&b| b == b'?')
                {
                    line.truncate(start + q);
                }
            }
            Field::ResponseHeader(h) => {
                let at = self.response_fields.iter().position(|f| f == h);
                push_header(line, h, at.and_then(|i| record.response_headers.get(i)));
            }
            Field::Environment(e) => match &e.value {
                Some(value) => line.extend_from_slice(value.as_bytes()),
                None => line.push(b'-'),
            },
        }
    }

    /// A record to fill for a new request, reused when one is spare.
    pub(crate) fn take_pending(&self) -> Box<PendingLog> {
        match self.spare.borrow_mut().pop() {
            Some(mut pending) => {
                // The previous request's body may still hold its counter; start a fresh one.
                if Rc::strong_count(&pending.received) == 1 {
                    pending.received.set(0);
                } else {
                    pending.received = Rc::new(Cell::new(0));
                }
                pending
            }
            None => Box::new(PendingLog {
                record: LogRecord::default(),
                wall_start: UNIX_EPOCH,
                received: Rc::new(Cell::new(0)),
            }),
        }
    }

    /// Returns a record after its line is written.
    pub(crate) fn give_back(&self, mut pending: Box<PendingLog>) {
        let mut spare = self.spare.borrow_mut();
        if spare.len() < PENDING_POOL {
            // A kept record must not keep its request's path and id (pieces of a shared chunk
            // of head copies) alive; the header lists keep their room.
            let mut request_headers = std::mem::take(&mut pending.record.request_headers);
            let mut response_headers = std::mem::take(&mut pending.record.response_headers);
            request_headers.clear();
            response_headers.clear();
            pending.record = LogRecord {
                request_headers,
                response_headers,
                ..LogRecord::default()
            };
            spare.push(pending);
        }
    }

    /// Hands the buffered lines (and records) to their writers without waiting.
    ///
    /// Also on drop.
    pub(crate) fn flush(&self) {
        for output in &self.outputs {
            self.flush_output(output);
        }
    }

    fn flush_output(&self, output: &Output) {
        let handed = match &output.sink {
            OutputSink::Lines { buf, tx } => {
                let chunk = {
                    let mut buf = buf.borrow_mut();
                    if buf.is_empty() {
                        return;
                    }
                    std::mem::replace(&mut *buf, Vec::with_capacity(FLUSH_AT))
                };
                match tx.try_send(chunk) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
                }
            }
            OutputSink::Records { batch, tx } => {
                let records = std::mem::take(&mut *batch.borrow_mut());
                records.is_empty() || tx.send(records).is_ok()
            }
        };
        if !handed {
            // Relaxed: a count for operators, read at scrape.
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Fields whose text is always a number.
/// A captured header's value, cut to the field's length; `-` when the message had none.
fn push_header(line: &mut Vec<u8>, field: &HeaderField, value: Option<&Option<http::HeaderValue>>) {
    match value {
        Some(Some(value)) => {
            let bytes = value.as_bytes();
            let len = field
                .max_len
                .map_or(bytes.len(), |max| max.min(bytes.len()));
            line.extend_from_slice(&bytes[..len]);
        }
        _ => line.push(b'-'),
    }
}

fn is_numeric(field: &Field) -> bool {
    matches!(
        field,
        Field::ResponseCode | Field::BytesReceived | Field::BytesSent | Field::Duration
    )
}

/// `text` as a JSON string: quotes, backslashes and control characters escaped, bytes that
/// are not UTF-8 (a client's path may have them) as U+FFFD.
fn push_json_string(out: &mut Vec<u8>, text: &[u8]) {
    out.push(b'"');
    for chunk in text.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                '\t' => out.extend_from_slice(b"\\t"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => {
                    let mut utf8 = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                }
            }
        }
        if !chunk.invalid().is_empty() {
            out.extend_from_slice("\u{fffd}".as_bytes());
        }
    }
    out.push(b'"');
}

/// `a.b.c.d:port` written directly (the common case); IPv6 through `Display`.
fn push_socket_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(v4) => {
            let [a, b, c, d] = v4.ip().octets();
            for (i, octet) in [a, b, c, d].into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                push_u64(out, u64::from(octet));
            }
            out.push(b':');
            push_u64(out, u64::from(v4.port()));
        }
        SocketAddr::V6(_) => {
            let _ = write!(out, "{addr}");
        }
    }
}

/// Decimal digits of `n`, without the formatting machinery.
fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The date and time up to the second, formatted once per second (as nginx caches its time
/// strings); only the milliseconds are written per line.
#[derive(Default)]
struct SecondCache {
    second: u64,
    text: String,
}

impl SecondCache {
    fn write(&mut self, out: &mut Vec<u8>, at: SystemTime) {
        let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
        if self.text.is_empty() || since.as_secs() != self.second {
            self.second = since.as_secs();
            self.text.clear();
            write_rfc3339(
                &mut self.text,
                UNIX_EPOCH + Duration::from_secs(self.second),
            );
            // Keep `YYYY-MM-DDTHH:MM:SS.`; the milliseconds follow per line.
            self.text.truncate(self.text.len() - 4);
        }
        out.extend_from_slice(self.text.as_bytes());
        let ms = since.subsec_millis();
        out.extend_from_slice(&[
            b'0' + (ms / 100) as u8,
            b'0' + (ms / 10 % 10) as u8,
            b'0' + (ms % 10) as u8,
            b'Z',
        ]);
    }
}

/// An exchange as a logger's filter reads it.
struct Facts<'a> {
    log: &'a WorkerLog,
    record: &'a LogRecord,
    duration: Duration,
}

impl config::cel::Attributes for Facts<'_> {
    fn response_code(&self) -> Option<u16> {
        self.record.status.map(|s| s.as_u16())
    }

    fn path(&self) -> Option<&str> {
        self.record.path.as_ref().map(|p| p.as_str())
    }

    fn host(&self) -> Option<&str> {
        self.request_header(":authority")
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    fn method(&self) -> Option<&str> {
        self.record.method.as_ref().map(Method::as_str)
    }

    fn scheme(&self) -> Option<&str> {
        self.request_header(":scheme")
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Captured with the request: every header a filter reads is in the worker's list.
    fn request_header(&self, name: &str) -> Option<&[u8]> {
        let at = (self.log.request_fields.iter())
            .position(|f| f.name == name && f.alternative.is_none())?;
        let value = self.record.request_headers.get(at)?.as_ref()?;
        Some(value.as_bytes())
    }
}

impl LogFacts for Facts<'_> {
    fn duration_ms(&self) -> u64 {
        self.duration.as_millis() as u64
    }

    fn flag(&self) -> Option<&str> {
        self.record.flag.map(ResponseFlag::as_str)
    }
}

/// `2026-11-21T23:40:00.123Z`
pub(crate) fn write_rfc3339(out: &mut String, at: SystemTime) {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        since.subsec_millis()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::access_log::DEFAULT_FORMAT;

    #[test]
    fn formats_parse_into_fields() {
        let f = LogFormat::parse("%METHOD% %PATH% 100%% %RESPONSE_FLAGS%\n").unwrap();
        assert_eq!(
            f.0,
            vec![
                Field::Method,
                Field::Text(" ".into()),
                Field::Path,
                Field::Text(" 100% ".into()),
                Field::ResponseFlags,
                Field::Text("\n".into()),
            ]
        );
        assert!(
            LogFormat::parse("%NOPE%")
                .unwrap_err()
                .contains("unknown field `%NOPE%`")
        );
        assert!(
            LogFormat::parse("%METHOD")
                .unwrap_err()
                .contains("unterminated")
        );
        assert!(LogFormat::parse(DEFAULT_FORMAT).is_ok());
        let written = "%METHOD% 100%% %REQ_ID%\n";
        let format = LogFormat::parse(written).unwrap();
        assert_eq!(serde_json::to_value(&format).unwrap(), written);
    }

    #[test]
    fn socket_addresses_match_display() {
        for text in [
            "127.0.0.1:80",
            "10.200.3.4:65535",
            "0.0.0.0:0",
            "[::1]:8080",
        ] {
            let addr: SocketAddr = text.parse().unwrap();
            let mut out = Vec::new();
            push_socket_addr(&mut out, addr);
            assert_eq!(String::from_utf8(out).unwrap(), addr.to_string());
        }
    }

    #[test]
    fn the_cached_second_gives_the_same_text() {
        let at = UNIX_EPOCH + Duration::from_millis(1_795_304_400_007);
        let mut cache = SecondCache::default();
        let mut out = Vec::new();
        cache.write(&mut out, at);
        cache.write(&mut out, at + Duration::from_millis(990));
        cache.write(&mut out, at + Duration::from_millis(1000));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2026-11-21T23:40:00.007Z2026-11-21T23:40:00.997Z2026-11-21T23:40:01.007Z"
        );
    }

    #[test]
    fn times_are_rfc3339_utc() {
        let mut s = String::new();
        write_rfc3339(
            &mut s,
            UNIX_EPOCH + Duration::from_millis(1_795_304_400_123),
        );
        assert_eq!(s, "2026-11-21T23:40:00.123Z");
        s.clear();
        write_rfc3339(&mut s, UNIX_EPOCH + Duration::from_secs(951_782_400)); // leap day
        assert_eq!(s, "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn lines_reach_the_writer_on_flush() {
        let (tx, rx) = sync_channel(4);
        let config = AccessLogConfig {
            target: LogTarget::Stdout,
            format: LogFormat::parse(
                "%METHOD% %PATH% %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_SENT%\n",
            )
            .unwrap(),
            json_format: None,
            attributes: Vec::new(),
            filter: None,
        };
        let log = WorkerLog::new(
            vec![(&config, SinkTx::Lines(tx))],
            Arc::new(AtomicU64::new(0)),
        );
        let record = LogRecord {
            method: Some(Method::GET),
            path: Some(http::uri::PathAndQuery::from_static("/x?y")),
            status: Some(StatusCode::SERVICE_UNAVAILABLE),
            flag: Some(ResponseFlag::UpstreamConnectFailure),
            bytes_sent: 1_234_567,
            ..Default::default()
        };
        log.record(&record, SystemTime::now(), Duration::from_millis(3));
        assert!(rx.try_recv().is_err(), "buffered until flushed");
        log.flush();
        assert_eq!(rx.try_recv().unwrap(), b"GET /x?y 503 UF 1234567\n");
    }

    #[test]
    fn req_without_query_cuts_the_value_at_its_query() {
        let (tx, rx) = sync_channel(4);
        let config = AccessLogConfig {
            target: LogTarget::Stdout,
            format: LogFormat::parse(
                "%REQ_WITHOUT_QUERY(X-ENVOY-ORIGINAL-PATH?:PATH)% %REQ(:PATH)% %REQ_WITHOUT_QUERY(:PATH):4% %REQ_WITHOUT_QUERY(x-absent)%\n",
            )
            .unwrap(),
            json_format: None,
            attributes: Vec::new(),
            filter: None,
        };
        let log = WorkerLog::new(
            vec![(&config, SinkTx::Lines(tx))],
            Arc::new(AtomicU64::new(0)),
        );
        for uri in ["/search?q=secret", "/plain", "/a?b"] {
            let mut record = LogRecord::default();
            let req = http::Request::builder().uri(uri).body(()).unwrap();
            log.capture_request(&mut record, &req, false);
            log.record(&record, SystemTime::now(), Duration::from_millis(1));
        }
        log.flush();
        assert_eq!(
            String::from_utf8(rx.try_recv().unwrap()).unwrap(),
            "/search /search?q=secret /sea -\n/plain /plain /pla -\n/a /a?b /a -\n"
        );
    }

    #[test]
    fn a_filter_picks_the_lines_written_by_what_the_request_sent() {
        use config::access_log::filter::{CompareOp, Comparison};
        let (tx, rx) = sync_channel(4);
        let config = AccessLogConfig {
            target: LogTarget::Stdout,
            format: LogFormat::parse("%PATH% %RESPONSE_CODE%\n").unwrap(),
            json_format: None,
            attributes: Vec::new(),
            filter: Some(LogFilter::Or(vec![
                LogFilter::StatusCode(Comparison {
                    op: CompareOp::Ge,
                    value: 500,
                }),
                LogFilter::Expression(
                    config::cel::Expr::parse("request.headers['x-debug'] == '1'").unwrap(),
                ),
            ])),
        };
        let log = WorkerLog::new(
            vec![(&config, SinkTx::Lines(tx))],
            Arc::new(AtomicU64::new(0)),
        );
        for (path, status, debug) in [
            ("/quiet", 200, None),
            ("/debug", 200, Some("1")),
            ("/failed", 503, None),
        ] {
            let mut record = LogRecord {
                path: Some(http::uri::PathAndQuery::from_static(path)),
                status: Some(StatusCode::from_u16(status).unwrap()),
                ..Default::default()
            };
            let mut req = http::Request::builder().uri(path);
            if let Some(value) = debug {
                req = req.header("x-debug", value);
            }
            log.capture_request(&mut record, &req.body(()).unwrap(), false);
            log.record(&record, SystemTime::now(), Duration::from_millis(1));
        }
        log.flush();
        assert_eq!(rx.try_recv().unwrap(), b"/debug 200\n/failed 503\n");
    }

    #[test]
    fn json_lines_are_objects_with_numbers_nulls_and_escaped_strings() {
        let (tx, rx) = sync_channel(4);
        let field = |f: &str| LogFormat::parse(f).unwrap();
        let config = AccessLogConfig {
            target: LogTarget::Stdout,
            format: LogFormat::parse(DEFAULT_FORMAT).unwrap(),
            json_format: Some(JsonFormat(vec![
                ("method".into(), field("%METHOD%")),
                ("path".into(), field("%PATH%")),
                ("status".into(), field("%RESPONSE_CODE%")),
                ("flags".into(), field("%RESPONSE_FLAGS%")),
                ("upstream".into(), field("%UPSTREAM_HOST%")),
                ("ms".into(), field("%DURATION%")),
                ("line".into(), field("%METHOD% \"%PATH%\"")),
                ("fixed".into(), field("edge-1")),
            ])),
            attributes: Vec::new(),
            filter: None,
        };
        let log = WorkerLog::new(
            vec![(&config, SinkTx::Lines(tx))],
            Arc::new(AtomicU64::new(0)),
        );
        let record = LogRecord {
            method: Some(Method::GET),
            path: Some(http::uri::PathAndQuery::from_static("/a%22b?q=\\")),
            status: Some(StatusCode::OK),
            ..Default::default()
        };
        log.record(&record, SystemTime::now(), Duration::from_millis(7));
        log.flush();
        let line = rx.try_recv().unwrap();
        assert_eq!(line.last(), Some(&b'\n'));
        let parsed: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({
                "method": "GET",
                "path": "/a%22b?q=\\",
                "status": 200,
                "flags": null,
                "upstream": null,
                "ms": 7,
                "line": "GET \"/a%22b?q=\\\"",
                "fixed": "edge-1",
            })
        );
        // The keys keep their order.
        let text = String::from_utf8(line).unwrap();
        assert!(text.starts_with("{\"method\":\"GET\",\"path\":"), "{text}");
    }

    #[test]
    fn json_strings_escape_what_json_requires() {
        let mut out = Vec::new();
        push_json_string(&mut out, b"a\"b\\c\nd\te\x01f\xffg");
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\te\\u0001f\u{fffd}g\"".as_bytes());
        let back: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, "a\"b\\c\nd\te\u{1}f\u{fffd}g");
    }
}
