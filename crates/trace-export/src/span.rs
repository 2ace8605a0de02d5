//! A finished span as the proxy records it: plain data, cheap to build on the request path,
//! turned into OTLP messages only on the exporter's thread.

use std::borrow::Cow;
use std::time::SystemTime;

use crate::context::{SpanId, TraceId};

/// What a span stands for, as OpenTelemetry names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// The proxy serving a request it received.
    Server,
    /// A request the proxy sent: an upstream try, an authorization check.
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(Cow<'static, str>),
    Int(i64),
    Bool(bool),
}

impl From<&'static str> for Value {
    fn from(text: &'static str) -> Self {
        Value::Str(Cow::Borrowed(text))
    }
}

impl From<String> for Value {
    fn from(text: String) -> Self {
        Value::Str(Cow::Owned(text))
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The caller's span; `None` for the root of a trace.
    pub parent_span_id: Option<SpanId>,
    /// The request's `tracestate`, as it came.
    pub trace_state: Option<String>,
    pub name: Cow<'static, str>,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    /// Set when the operation failed: the span's status is then an error with this message.
    pub error: Option<String>,
    /// Names are the proxy's own, or configured (a listener's custom tags).
    pub attributes: Vec<(Cow<'static, str>, Value)>,
}

impl Span {
    /// Adds an attribute.
    pub fn set(&mut self, key: impl Into<Cow<'static, str>>, value: impl Into<Value>) {
        self.attributes.push((key.into(), value.into()));
    }
}
