//! Access log settings of a listener: where lines go and their format (`%FIELD%` tokens, or
//! one JSON object a line). The data plane's writer is `proxy-core`'s `access_log.rs`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize, Serializer};

use crate::ConfigError;

/// Envoy's default line, with the proxy's own field names.
pub const DEFAULT_FORMAT: &str = "[%START_TIME%] \"%METHOD% %PATH% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% \"%UPSTREAM_HOST%\" \"%REQ_ID%\"\n";

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LogTarget {
    Stdout,
    File(PathBuf),
}

impl Serialize for LogTarget {
    /// As written: `stdout` or the file's path.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LogTarget::Stdout => s.serialize_str("stdout"),
            LogTarget::File(path) => s.collect_str(&path.display()),
        }
    }
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

/// The `%NAME%` of each field.
pub const NAMED_FIELDS: [(&str, Field); 12] = [
    ("START_TIME", Field::StartTime),
    ("METHOD", Field::Method),
    ("PATH", Field::Path),
    ("PROTOCOL", Field::Protocol),
    ("RESPONSE_CODE", Field::ResponseCode),
    ("RESPONSE_FLAGS", Field::ResponseFlags),
    ("BYTES_RECEIVED", Field::BytesReceived),
    ("BYTES_SENT", Field::BytesSent),
    ("DURATION", Field::Duration),
    ("UPSTREAM_HOST", Field::UpstreamHost),
    ("REQ_ID", Field::RequestId),
    ("DOWNSTREAM_REMOTE_ADDRESS", Field::DownstreamRemoteAddress),
];

/// A parsed `format:` string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFormat(pub Vec<Field>);

impl Serialize for LogFormat {
    /// As written: the format string.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::template::write(
            &self.0,
            &NAMED_FIELDS,
            |field| match field {
                Field::Text(literal) => Some(literal),
                _ => None,
            },
        ))
    }
}

impl LogFormat {
    /// Parses `%FIELD%` tokens; `%%` is a literal `%`.
    pub fn parse(text: &str) -> Result<LogFormat, String> {
        crate::template::parse(text, &NAMED_FIELDS, Field::Text, "field").map(LogFormat)
    }
}

/// A JSON line's keys, in order, each with the format of its value (`json_format`): one
/// object per request. A value that is one numeric field (`%RESPONSE_CODE%`, `%DURATION%`,
/// the byte counts) is a JSON number; a value that is one field with nothing to say (`-` in a
/// text line) is `null`; anything else is a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonFormat(pub Vec<(String, LogFormat)>);

impl Serialize for JsonFormat {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(key, value)| (key, value)))
    }
}

/// A listener's access log settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccessLogConfig {
    #[serde(rename = "path")]
    pub target: LogTarget,
    /// The text line; not used with `json_format`.
    pub format: LogFormat,
    /// A JSON object per line instead of the text format.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_format: Option<JsonFormat>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccessLog {
    pub path: String,
    pub format: Option<String>,
    /// `{ key: "%FIELD%", ... }`, in order.
    pub json_format: Option<serde_yaml::Mapping>,
}

/// `json_format: { key: "%FIELD%", ... }`: keys and value formats, in order.
pub(crate) fn json_format(raw: serde_yaml::Mapping, path: &str) -> Result<JsonFormat, ConfigError> {
    if raw.is_empty() {
        return Err(ConfigError::invalid(path, "expected at least one key"));
    }
    raw.into_iter()
        .map(|(key, value)| {
            let Some(key) = key.as_str().map(str::to_owned) else {
                return Err(ConfigError::invalid(path, "expected text keys"));
            };
            let at = format!("{path}.{key}");
            let Some(value) = value.as_str() else {
                return Err(ConfigError::invalid(
                    at,
                    "expected a format string (`%FIELD%`)",
                ));
            };
            let format = LogFormat::parse(value).map_err(|e| ConfigError::invalid(&at, e))?;
            Ok((key, format))
        })
        .collect::<Result<_, _>>()
        .map(JsonFormat)
}
