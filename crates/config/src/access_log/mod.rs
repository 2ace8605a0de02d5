//! Access log settings of a listener: where lines go and their format (`%FIELD%` tokens, or
//! one JSON object a line). The data plane's writer is `proxy-core`'s `access_log.rs`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize, Serializer};

use crate::ConfigError;

pub(crate) mod xds;

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
    /// `%REQ(NAME?ALTERNATIVE):MAX%`: a request header as the client sent it.
    RequestHeader(HeaderField),
    /// `%RESP(NAME?ALTERNATIVE):MAX%`: a response header as the client gets it.
    ResponseHeader(HeaderField),
}

/// A header an access log line shows (Envoy's `%REQ(...)%` and `%RESP(...)%`): `name`, or
/// `alternative` where the message has no `name`, cut to `max_len` bytes. Names are
/// lowercase; a request's pseudo-headers (`:method`, `:path`, `:authority`, `:scheme`) are
/// its method, path with query, host and scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField {
    pub name: String,
    pub alternative: Option<String>,
    pub max_len: Option<usize>,
}

impl HeaderField {
    /// `NAME?ALTERNATIVE):MAX` after `REQ(` or `RESP(`.
    fn parse(operator: &str, args: &str, request: bool) -> Result<HeaderField, String> {
        let (inside, rest) = args
            .split_once(')')
            .ok_or_else(|| format!("`%{operator}(...)%` has no closing `)`"))?;
        let max_len = match rest {
            "" => None,
            _ => Some(
                rest.strip_prefix(':')
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| {
                        format!("`%{operator}({inside}){rest}%`: expected `:LENGTH` after `)`")
                    })?,
            ),
        };
        let (name, alternative) = match inside.split_once('?') {
            Some((name, alternative)) => (name, Some(alternative)),
            None => (inside, None),
        };
        let check = |name: &str| -> Result<String, String> {
            let lower = name.trim().to_ascii_lowercase();
            let pseudo = [":method", ":path", ":authority", ":scheme"];
            let valid = if lower.starts_with(':') {
                request && pseudo.contains(&lower.as_str())
            } else {
                http::HeaderName::from_bytes(lower.as_bytes()).is_ok()
            };
            if valid {
                Ok(lower)
            } else {
                Err(format!(
                    "`%{operator}({inside})%`: `{name}` is not a header it can show"
                ))
            }
        };
        Ok(HeaderField {
            name: check(name)?,
            alternative: alternative.map(check).transpose()?,
            max_len,
        })
    }

    fn text(&self, operator: &str) -> String {
        let mut text = format!("{operator}({}", self.name);
        if let Some(alternative) = &self.alternative {
            text.push('?');
            text.push_str(alternative);
        }
        text.push(')');
        if let Some(max) = self.max_len {
            text.push_str(&format!(":{max}"));
        }
        text
    }
}

/// `REQ(...)` or `RESP(...)`, the operators with an argument.
fn header_operator(name: &str) -> Result<Option<Field>, String> {
    if let Some(args) = name.strip_prefix("REQ(") {
        return HeaderField::parse("REQ", args, true).map(|f| Some(Field::RequestHeader(f)));
    }
    if let Some(args) = name.strip_prefix("RESP(") {
        return HeaderField::parse("RESP", args, false).map(|f| Some(Field::ResponseHeader(f)));
    }
    Ok(None)
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
        s.serialize_str(&crate::template::write_with(
            &self.0,
            &NAMED_FIELDS,
            |field| match field {
                Field::RequestHeader(h) => Some(h.text("REQ")),
                Field::ResponseHeader(h) => Some(h.text("RESP")),
                _ => None,
            },
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
        crate::template::parse_with(text, &NAMED_FIELDS, header_operator, Field::Text, "field")
            .map(LogFormat)
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

#[cfg(test)]
mod header_field_tests {
    use super::*;

    #[test]
    fn header_operators_parse_and_write_back() {
        let format =
            LogFormat::parse("%REQ(User-Agent?x-ua):10% %RESP(content-type)% %REQ(:PATH)%")
                .unwrap();
        assert_eq!(
            format.0[0],
            Field::RequestHeader(HeaderField {
                name: "user-agent".into(),
                alternative: Some("x-ua".into()),
                max_len: Some(10),
            })
        );
        assert_eq!(
            serde_json::to_value(&format).unwrap(),
            "%REQ(user-agent?x-ua):10% %RESP(content-type)% %REQ(:path)%"
        );
        for (bad, says) in [
            ("%REQ(user-agent%", "no closing"),
            ("%RESP(:path)%", "not a header"),
            ("%REQ(a b)%", "not a header"),
            ("%REQ(a):x%", "expected `:LENGTH`"),
            ("%ENVIRONMENT(HOME)%", "unknown field"),
        ] {
            let error = LogFormat::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
