//! How series are named and labelled when rendered, shared by the registry (which refuses
//! families whose names would collide) and both renderers.

use std::fmt;

/// What a family measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetricKind {
    /// A monotonic `u64` count.
    Counter,
    /// An `i64` that goes up and down.
    Gauge,
    /// A latency distribution in microseconds.
    Histogram,
}

impl fmt::Display for MetricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        })
    }
}

/// The names a family's samples are exported under, to refuse families that would collide.
pub(crate) fn exposed_names(kind: MetricKind, name: &str) -> Vec<String> {
    match kind {
        MetricKind::Counter | MetricKind::Gauge => vec![name.to_owned()],
        MetricKind::Histogram => [
            "",
            "_bucket",
            "_sum",
            "_count",
            "_quantile",
            "_mean",
            "_max",
        ]
        .iter()
        .map(|suffix| format!("{name}_seconds{suffix}"))
        .collect(),
    }
}

/// Writes `name="value",...` with the values escaped (no braces).
pub(crate) fn render_labels<'a>(
    out: &mut String,
    labels: impl Iterator<Item = (&'a str, &'a str)>,
) {
    for (i, (name, value)) in labels.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        escape_label_value(out, value);
        out.push('"');
    }
}

/// Writes `{a,b,...}` from rendered label lists, skipping empty ones; nothing if all are.
pub(crate) fn push_label_set(out: &mut String, parts: &[&str]) {
    let mut first = true;
    for part in parts.iter().filter(|p| !p.is_empty()) {
        out.push(if first { '{' } else { ',' });
        first = false;
        out.push_str(part);
    }
    if !first {
        out.push('}');
    }
}

/// A label value inside double quotes: `\`, `"` and newline escaped as `\\`, `\"` and `\n`.
pub(crate) fn escape_label_value(out: &mut String, value: &str) {
    if !value.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A line's key, `family{labels}`, into `key` (emptied first): what a `/stats` filter looks at.
pub(crate) fn write_key(key: &mut String, family: &str, labels: &[&str]) {
    key.clear();
    key.push_str(family);
    push_label_set(key, labels);
}
