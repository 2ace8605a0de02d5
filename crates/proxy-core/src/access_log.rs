//! Access log: one line per request, per listener, off by default.
//!
//! A worker formats lines into its own buffer; full buffers, and every buffer at least every
//! [`FLUSH_EVERY`], go over a bounded channel to a writer thread per destination. A worker
//! never waits for the disk: if the writer falls behind, chunks are dropped and counted.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, StatusCode, Version};

use crate::error::ResponseFlag;

/// Envoy's default line, with the proxy's own field names.
pub const DEFAULT_FORMAT: &str = "[%START_TIME%] \"%METHOD% %PATH% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% \"%UPSTREAM_HOST%\" \"%REQ_ID%\"\n";

/// How often a worker hands its partial buffer to the writer.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// A worker hands its buffer over once it holds this much.
const FLUSH_AT: usize = 16 * 1024;
/// Chunks queued per destination before new ones are dropped.
const QUEUE_CHUNKS: usize = 1024;

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LogTarget {
    Stdout,
    File(PathBuf),
}

/// One piece of a line format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Text(String),
    StartTime,
    Method,
    Path,
    Protocol,
    ResponseCode,
    ResponseFlags,
    BytesReceived,
    BytesSent,
    /// Milliseconds from request head to the end of the response.
    Duration,
    UpstreamHost,
    RequestId,
    DownstreamRemoteAddress,
}

/// A parsed `format:` string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFormat(pub Vec<Field>);

impl LogFormat {
    /// Parses `%FIELD%` tokens; `%%` is a literal `%`.
    pub fn parse(text: &str) -> Result<LogFormat, String> {
        let mut fields = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(start) = rest.find('%') {
            literal.push_str(&rest[..start]);
            let after = &rest[start + 1..];
            let end = after
                .find('%')
                .ok_or_else(|| format!("unterminated `%` in `{text}`"))?;
            let name = &after[..end];
            let field = match name {
                "" => {
                    literal.push('%');
                    None
                }
                "START_TIME" => Some(Field::StartTime),
                "METHOD" => Some(Field::Method),
                "PATH" => Some(Field::Path),
                "PROTOCOL" => Some(Field::Protocol),
                "RESPONSE_CODE" => Some(Field::ResponseCode),
                "RESPONSE_FLAGS" => Some(Field::ResponseFlags),
                "BYTES_RECEIVED" => Some(Field::BytesReceived),
                "BYTES_SENT" => Some(Field::BytesSent),
                "DURATION" => Some(Field::Duration),
                "UPSTREAM_HOST" => Some(Field::UpstreamHost),
                "REQ_ID" => Some(Field::RequestId),
                "DOWNSTREAM_REMOTE_ADDRESS" => Some(Field::DownstreamRemoteAddress),
                other => {
                    return Err(format!(
                        "unknown field `%{other}%`; known: START_TIME, METHOD, PATH, PROTOCOL, RESPONSE_CODE, RESPONSE_FLAGS, BYTES_RECEIVED, BYTES_SENT, DURATION, UPSTREAM_HOST, REQ_ID, DOWNSTREAM_REMOTE_ADDRESS"
                    ));
                }
            };
            if let Some(field) = field {
                if !literal.is_empty() {
                    fields.push(Field::Text(std::mem::take(&mut literal)));
                }
                fields.push(field);
            }
            rest = &after[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            fields.push(Field::Text(literal));
        }
        Ok(LogFormat(fields))
    }
}

/// A listener's access log settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogConfig {
    pub target: LogTarget,
    pub format: LogFormat,
}

/// What one request leaves behind for its log line.
#[derive(Debug, Default)]
pub(crate) struct LogRecord {
    pub(crate) method: Option<Method>,
    pub(crate) path: String,
    pub(crate) version: Option<Version>,
    pub(crate) status: Option<StatusCode>,
    pub(crate) flag: Option<ResponseFlag>,
    pub(crate) bytes_received: u64,
    pub(crate) bytes_sent: u64,
    pub(crate) upstream: Option<SocketAddr>,
    pub(crate) request_id: Option<http::HeaderValue>,
    pub(crate) peer: Option<SocketAddr>,
}

/// The writer threads, one per destination, shared by every worker.
pub(crate) struct LogSinks {
    senders: Vec<(LogTarget, SyncSender<Vec<u8>>)>,
    pub(crate) dropped: Arc<AtomicU64>,
}

impl LogSinks {
    /// Opens every destination the config names (files in append mode) and starts a writer
    /// thread for each.
    pub(crate) fn open(targets: impl Iterator<Item = LogTarget>) -> io::Result<LogSinks> {
        let mut senders: Vec<(LogTarget, SyncSender<Vec<u8>>)> = Vec::new();
        for target in targets {
            if senders.iter().any(|(t, _)| *t == target) {
                continue;
            }
            let out: Box<dyn Write + Send> = match &target {
                LogTarget::Stdout => Box::new(io::stdout()),
                LogTarget::File(path) => {
                    Box::new(OpenOptions::new().create(true).append(true).open(path)?)
                }
            };
            let (tx, rx) = sync_channel(QUEUE_CHUNKS);
            std::thread::Builder::new()
                .name("legate-access-log".into())
                .spawn(move || write_loop(rx, out))?;
            senders.push((target, tx));
        }
        Ok(LogSinks {
            senders,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    pub(crate) fn sender(&self, target: &LogTarget) -> Option<SyncSender<Vec<u8>>> {
        self.senders
            .iter()
            .find(|(t, _)| t == target)
            .map(|(_, tx)| tx.clone())
    }
}

fn write_loop(rx: Receiver<Vec<u8>>, mut out: Box<dyn Write + Send>) {
    while let Ok(chunk) = rx.recv() {
        let mut failed = out.write_all(&chunk).is_err();
        // Drain what is queued before flushing, so a burst costs one flush.
        while let Ok(chunk) = rx.try_recv() {
            failed |= out.write_all(&chunk).is_err();
        }
        failed |= out.flush().is_err();
        if failed {
            tracing::warn!("access log write failed; lines were lost");
        }
    }
    let _ = out.flush();
}

/// One worker's access log for one listener.
pub(crate) struct WorkerLog {
    format: LogFormat,
    buf: RefCell<Vec<u8>>,
    tx: SyncSender<Vec<u8>>,
    dropped: Arc<AtomicU64>,
}

impl WorkerLog {
    pub(crate) fn new(format: LogFormat, tx: SyncSender<Vec<u8>>, dropped: Arc<AtomicU64>) -> Self {
        Self {
            format,
            buf: RefCell::new(Vec::with_capacity(FLUSH_AT)),
            tx,
            dropped,
        }
    }

    pub(crate) fn record(&self, record: &LogRecord, started: SystemTime, duration: Duration) {
        let mut line = String::with_capacity(160);
        for field in &self.format.0 {
            let _ = match field {
                Field::Text(t) => {
                    line.push_str(t);
                    Ok(())
                }
                Field::StartTime => {
                    write_rfc3339(&mut line, started);
                    Ok(())
                }
                Field::Method => match &record.method {
                    Some(m) => write!(line, "{m}"),
                    None => write!(line, "-"),
                },
                Field::Path => {
                    line.push_str(if record.path.is_empty() {
                        "-"
                    } else {
                        &record.path
                    });
                    Ok(())
                }
                Field::Protocol => write!(
                    line,
                    "{}",
                    match record.version {
                        Some(Version::HTTP_2) => "HTTP/2",
                        Some(Version::HTTP_10) => "HTTP/1.0",
                        Some(Version::HTTP_11) => "HTTP/1.1",
                        _ => "-",
                    }
                ),
                Field::ResponseCode => match record.status {
                    Some(s) => write!(line, "{}", s.as_u16()),
                    None => write!(line, "0"),
                },
                Field::ResponseFlags => match record.flag {
                    Some(f) => write!(line, "{f}"),
                    None => write!(line, "-"),
                },
                Field::BytesReceived => write!(line, "{}", record.bytes_received),
                Field::BytesSent => write!(line, "{}", record.bytes_sent),
                Field::Duration => write!(line, "{}", duration.as_millis()),
                Field::UpstreamHost => match record.upstream {
                    Some(a) => write!(line, "{a}"),
                    None => write!(line, "-"),
                },
                Field::RequestId => {
                    match record.request_id.as_ref().and_then(|v| v.to_str().ok()) {
                        Some(id) => line.push_str(id),
                        None => line.push('-'),
                    }
                    Ok(())
                }
                Field::DownstreamRemoteAddress => match record.peer {
                    Some(a) => write!(line, "{a}"),
                    None => write!(line, "-"),
                },
            };
        }
        let full = {
            let mut buf = self.buf.borrow_mut();
            buf.extend_from_slice(line.as_bytes());
            buf.len() >= FLUSH_AT
        };
        if full {
            self.flush();
        }
    }

    /// Hands the buffered lines to the writer thread without waiting.
    pub(crate) fn flush(&self) {
        let chunk = {
            let mut buf = self.buf.borrow_mut();
            if buf.is_empty() {
                return;
            }
            std::mem::replace(&mut *buf, Vec::with_capacity(FLUSH_AT))
        };
        match self.tx.try_send(chunk) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                // Relaxed: a count for operators, read at scrape.
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// `2026-11-21T23:40:00.123Z`
fn write_rfc3339(out: &mut String, at: SystemTime) {
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
        let log = WorkerLog::new(
            LogFormat::parse("%METHOD% %RESPONSE_CODE% %RESPONSE_FLAGS%\n").unwrap(),
            tx,
            Arc::new(AtomicU64::new(0)),
        );
        let record = LogRecord {
            method: Some(Method::GET),
            status: Some(StatusCode::SERVICE_UNAVAILABLE),
            flag: Some(ResponseFlag::UpstreamConnectFailure),
            ..Default::default()
        };
        log.record(&record, SystemTime::now(), Duration::from_millis(3));
        assert!(rx.try_recv().is_err(), "buffered until flushed");
        log.flush();
        assert_eq!(rx.try_recv().unwrap(), b"GET 503 UF\n");
    }
}
