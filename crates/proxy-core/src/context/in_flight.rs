//! A request's bookkeeping from its head until its response body is dropped.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::ConnCtx;
use crate::access_log::{LogRecord, PendingLog};
use crate::trace::RequestTrace;

/// A request from its head until its response body is dropped (written out or abandoned):
/// counted as in flight, timed, and its status class counted.
pub(crate) struct InFlight {
    conn: Rc<ConnCtx>,
    started: Instant,
    status: Option<http::StatusCode>,
    /// Filled in along the way when the listener keeps an access log.
    log: Option<Box<PendingLog>>,
    /// The request's trace, when the listener traces; its span ends with the request.
    trace: Option<Box<RequestTrace>>,
}

impl InFlight {
    pub(crate) fn new<B>(conn: &Rc<ConnCtx>, req: &http::Request<B>) -> Self {
        conn.in_flight.set(conn.in_flight.get() + 1);
        let stats = &conn.listener.stats;
        stats.rq_total.inc();
        stats.rq_active.inc();
        conn.worker.stats.rq_total.inc();
        let log = conn.listener.access_log.as_ref().map(|log| {
            let mut pending = log.take_pending();
            let record = &mut pending.record;
            record.method = Some(req.method().clone());
            record.path = req.uri().path_and_query().cloned();
            record.version = Some(req.version());
            record.peer = Some(conn.peer);
            record.request_id = req.headers().get("x-request-id").cloned();
            log.capture_request(record, req, conn.listener.tls);
            pending.wall_start = SystemTime::now();
            pending
        });
        InFlight {
            conn: Rc::clone(conn),
            started: Instant::now(),
            status: None,
            log,
            trace: None,
        }
    }

    /// When the request's head came.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// Counts a request ended by its `max_stream_duration`.
    pub(crate) fn stream_duration_reached(&self) {
        self.conn.listener.stats.rq_max_duration.inc();
    }

    pub(crate) fn set_status(&mut self, status: http::StatusCode) {
        self.status = Some(status);
    }

    /// The response's head as the client gets it, for the headers the access log shows.
    pub(crate) fn answered_with(&mut self, headers: &http::HeaderMap) {
        if let (Some(pending), Some(log)) = (&mut self.log, &self.conn.listener.access_log) {
            log.capture_response(&mut pending.record, headers);
        }
    }

    pub(crate) fn set_trace(&mut self, trace: Box<RequestTrace>) {
        self.trace = Some(trace);
    }

    pub(crate) fn take_trace(&mut self) -> Option<Box<RequestTrace>> {
        self.trace.take()
    }

    pub(crate) fn trace(&self) -> Option<&RequestTrace> {
        self.trace.as_deref()
    }

    /// The trace, when the request is sampled: for attributes of its span.
    pub(crate) fn sampled_trace(&mut self) -> Option<&mut RequestTrace> {
        self.trace.as_deref_mut().filter(|t| t.sampled())
    }

    /// The access log's record, when this listener keeps one.
    pub(crate) fn log(&mut self) -> Option<&mut LogRecord> {
        self.log.as_mut().map(|l| &mut l.record)
    }

    /// For a request that stays on (a tunnel): its log record's path and id get memory of
    /// their own, so they do not keep the chunk of head copies they were cut from for hours.
    pub(crate) fn outlive_exchange(&mut self) {
        if let Some(record) = self.log() {
            record.path = record
                .path
                .take()
                .and_then(|path| http::uri::PathAndQuery::try_from(path.as_str()).ok());
            record.request_id = record
                .request_id
                .take()
                .and_then(|id| http::HeaderValue::from_bytes(id.as_bytes()).ok());
            for value in record.request_headers.iter_mut() {
                *value = value
                    .take()
                    .and_then(|v| http::HeaderValue::from_bytes(v.as_bytes()).ok());
            }
        }
    }

    /// Counts response body bytes handed to the codec.
    pub(crate) fn sent(&mut self, bytes: usize) {
        if let Some(log) = &mut self.log {
            log.record.bytes_sent += bytes as u64;
        }
    }

    /// The counter the request body adds to, when logging.
    pub(crate) fn received_counter(&self) -> Option<Rc<Cell<u64>>> {
        self.log.as_ref().map(|l| Rc::clone(&l.received))
    }
}

/// A request the codec refused before it was one (a malformed or oversized head), answered
/// `status` with a body of `sent` bytes: counted as a request and logged as Envoy logs its
/// codec errors, flagged `DPE`, with no method, path or headers.
pub(crate) fn refused_head(conn: &ConnCtx, status: http::StatusCode, sent: usize, since: Instant) {
    let stats = &conn.listener.stats;
    let duration = since.elapsed();
    stats.rq_total.inc();
    conn.worker.stats.rq_total.inc();
    stats.response(status);
    stats.rq_time.record_duration(duration);
    if let Some(log) = &conn.listener.access_log {
        let mut pending = log.take_pending();
        let record = &mut pending.record;
        record.peer = Some(conn.peer);
        // The codec's protocol, as Envoy logs it.
        record.version = Some(http::Version::HTTP_11);
        record.status = Some(status);
        record.flag = Some(crate::error::ResponseFlag::DownstreamProtocolError);
        record.bytes_sent = sent as u64;
        let wall_start = SystemTime::now()
            .checked_sub(duration)
            .unwrap_or(UNIX_EPOCH);
        log.record(record, wall_start, duration);
        log.give_back(pending);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.conn;
        conn.in_flight.set(conn.in_flight.get() - 1);
        let now = Instant::now();
        conn.last_active.set(now);
        let stats = &conn.listener.stats;
        stats.rq_active.dec();
        stats.rq_time.record_duration(now - self.started);
        if let Some(status) = self.status {
            stats.response(status);
        }
        if let (Some(mut pending), Some(log)) = (self.log.take(), &conn.listener.access_log) {
            pending.record.status = self.status;
            pending.record.bytes_received = pending.received.get();
            log.record(&pending.record, pending.wall_start, now - self.started);
            log.give_back(pending);
        }
    }
}
