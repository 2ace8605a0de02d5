//! Spans and log records as OTLP messages: one `ExportTraceServiceRequest` (or
//! `ExportLogsServiceRequest`) per batch, under the process's resource and this crate as the
//! instrumentation scope.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status, span, status};

use crate::log::LogRecord;
use crate::span::{Span, SpanKind, Value};

/// OTLP `flags`: the W3C sampled flag (every exported span was sampled), and that the
/// parent's remoteness is known (bit 8) and whether it is remote (bit 9).
const SAMPLED: u32 = 0x01;
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The request that exports `spans`. `resource` describes the process (`service.name`...).
pub(crate) fn export_request(
    resource: &[(String, Value)],
    spans: Vec<Span>,
) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource_message(resource)),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope()),
                spans: spans.into_iter().map(span_message).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// The request that exports log `records` under `resource`.
pub(crate) fn logs_request(
    resource: &[(String, Value)],
    records: Vec<LogRecord>,
) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(resource_message(resource)),
            scope_logs: vec![ScopeLogs {
                scope: Some(scope()),
                log_records: records
                    .into_iter()
                    .map(|record| {
                        let time = unix_nanos(record.time);
                        opentelemetry_proto::tonic::logs::v1::LogRecord {
                            time_unix_nano: time,
                            observed_time_unix_nano: time,
                            body: Some(AnyValue {
                                value: Some(any_value::Value::StringValue(record.body)),
                            }),
                            attributes: record
                                .attributes
                                .into_iter()
                                .map(|(key, value)| key_value(key, value))
                                .collect(),
                            ..Default::default()
                        }
                    })
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn resource_message(resource: &[(String, Value)]) -> Resource {
    Resource {
        attributes: resource
            .iter()
            .map(|(key, value)| key_value(key.clone(), value.clone()))
            .collect(),
        ..Resource::default()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: env!("CARGO_PKG_NAME").to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..InstrumentationScope::default()
    }
}

fn span_message(span: Span) -> opentelemetry_proto::tonic::trace::v1::Span {
    // The proxy's server span continues a caller's trace (a remote parent); its client spans
    // are children of the server span, in this process.
    let remote = match span.kind {
        SpanKind::Server => IS_REMOTE,
        SpanKind::Client => 0,
    };
    let flags = SAMPLED
        | if span.parent_span_id.is_some() {
            HAS_IS_REMOTE | remote
        } else {
            0
        };
    opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: span.trace_id.0.to_vec(),
        span_id: span.span_id.0.to_vec(),
        trace_state: span.trace_state.unwrap_or_default(),
        parent_span_id: span
            .parent_span_id
            .map(|id| id.0.to_vec())
            .unwrap_or_default(),
        flags,
        name: span.name.into_owned(),
        kind: match span.kind {
            SpanKind::Server => span::SpanKind::Server,
            SpanKind::Client => span::SpanKind::Client,
        } as i32,
        start_time_unix_nano: unix_nanos(span.start),
        end_time_unix_nano: unix_nanos(span.end),
        attributes: span
            .attributes
            .into_iter()
            .map(|(key, value)| key_value(key.into_owned(), value))
            .collect(),
        status: span.error.map(|message| Status {
            message,
            code: status::StatusCode::Error as i32,
        }),
        ..Default::default()
    }
}

fn key_value(key: String, value: Value) -> KeyValue {
    let value = match value {
        Value::Str(text) => any_value::Value::StringValue(text.into_owned()),
        Value::Int(n) => any_value::Value::IntValue(n),
        Value::Bool(b) => any_value::Value::BoolValue(b),
    };
    KeyValue {
        key,
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_record_becomes_its_otlp_message() {
        let time = UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let request = logs_request(
            &[("log_name".into(), "access".into())],
            vec![LogRecord {
                time,
                body: "GET / 200".into(),
                attributes: vec![("response_code".into(), "200".to_owned().into())],
            }],
        );
        let logs = &request.resource_logs[0];
        assert_eq!(
            logs.resource.as_ref().unwrap().attributes[0].key,
            "log_name"
        );
        let record = &logs.scope_logs[0].log_records[0];
        assert_eq!(record.time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(
            record.body.as_ref().unwrap().value,
            Some(any_value::Value::StringValue("GET / 200".into()))
        );
        assert_eq!(record.attributes[0].key, "response_code");
    }
    use crate::context::{SpanId, TraceId};
    use std::time::Duration;

    #[test]
    fn a_span_becomes_its_otlp_message() {
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut span = Span {
            trace_id: TraceId([7; 16]),
            span_id: SpanId([2; 8]),
            parent_span_id: Some(SpanId([1; 8])),
            trace_state: Some("vendor=x".into()),
            name: "ingress".into(),
            kind: SpanKind::Server,
            start,
            end: start + Duration::from_micros(1500),
            error: Some("upstream reset".into()),
            attributes: Vec::new(),
        };
        span.set("http.status_code", 503_i64);
        span.set("component", "proxy");
        let request = export_request(&[("service.name".into(), "edge".into())], vec![span]);
        let resource_spans = &request.resource_spans[0];
        let resource = resource_spans.resource.as_ref().unwrap();
        assert_eq!(resource.attributes[0].key, "service.name");
        let message = &resource_spans.scope_spans[0].spans[0];
        assert_eq!(message.trace_id, vec![7; 16]);
        assert_eq!(message.parent_span_id, vec![1; 8]);
        assert_eq!(message.trace_state, "vendor=x");
        assert_eq!(message.kind, span::SpanKind::Server as i32);
        assert_eq!(message.flags, SAMPLED | HAS_IS_REMOTE | IS_REMOTE);
        assert_eq!(
            message.end_time_unix_nano - message.start_time_unix_nano,
            1_500_000
        );
        assert_eq!(
            message.status.as_ref().unwrap().code,
            status::StatusCode::Error as i32
        );
        assert_eq!(
            message.attributes[0].value.as_ref().unwrap().value,
            Some(any_value::Value::IntValue(503))
        );
    }
}
