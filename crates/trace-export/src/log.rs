//! Log records as the proxy hands them over (an access log line for OpenTelemetry): plain
//! data, made into OTLP messages on the exporter's thread.

use std::time::SystemTime;

use crate::span::Value;

/// One log record: when it happened, its body and its attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    pub time: SystemTime,
    pub body: String,
    pub attributes: Vec<(String, Value)>,
}
