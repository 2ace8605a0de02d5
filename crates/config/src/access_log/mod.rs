//! Access log settings of a listener: its loggers, each with where lines go (stdout, a
//! file, an OpenTelemetry collector) and their format (`%FIELD%` tokens, or one JSON object
//! a line). The data plane's writer is `proxy-core`'s `access_log.rs`.

use std::path::PathBuf;
use std::time::Duration;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ConfigError;

pub mod filter;
pub(crate) mod xds;

pub use crate::header_field::HeaderField;
pub use filter::LogFilter;

/// Envoy's default line, with the proxy's own field names.
pub const DEFAULT_FORMAT: &str = "[%START_TIME%] \"%METHOD% %PATH% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% \"%UPSTREAM_HOST%\" \"%REQ_ID%\"\n";

/// Time allowed for one export to an OpenTelemetry collector, unless given.
pub const DEFAULT_OTLP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LogTarget {
    Stdout,
    File(PathBuf),
    /// Log records to an OpenTelemetry collector (OTLP/gRPC `LogsService`).
    Otlp(Box<OtlpLogTarget>),
}

/// An OpenTelemetry collector of access logs and what describes this process to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OtlpLogTarget {
    /// `http://host:port`.
    pub endpoint: http::Uri,
    /// Its name on each export (gRPC's `:authority`) when not the endpoint's host.
    pub authority: Option<http::uri::Authority>,
    /// gRPC metadata sent with each export.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The resource's attributes: `log_name` and the given ones, in order.
    pub resource: Vec<(String, String)>,
    pub timeout: Duration,
    /// TLS to the collector (an `https://` endpoint).
    pub tls: Option<crate::ClusterTlsConfig>,
}

impl Serialize for LogTarget {
    /// As written: `stdout`, the file's path, or the collector's settings.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LogTarget::Stdout => s.serialize_str("stdout"),
            LogTarget::File(path) => s.collect_str(&path.display()),
            LogTarget::Otlp(otlp) => {
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("endpoint", &otlp.endpoint.to_string())?;
                if let Some(authority) = &otlp.authority {
                    map.serialize_entry("authority", authority.as_str())?;
                }
                if !otlp.headers.is_empty() {
                    // Values may be secrets (API keys): the names only.
                    let names: Vec<&str> = otlp.headers.iter().map(|(n, _)| n.as_str()).collect();
                    map.serialize_entry("headers", &names)?;
                }
                let resource: serde_json::Map<String, serde_json::Value> = otlp
                    .resource
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone().into()))
                    .collect();
                map.serialize_entry("resource_attributes", &resource)?;
                map.serialize_entry("timeout", &format!("{}ms", otlp.timeout.as_millis()))?;
                if let Some(tls) = &otlp.tls {
                    map.serialize_entry("tls", tls)?;
                }
                map.end()
            }
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
    /// `%REQ_WITHOUT_QUERY(NAME?ALTERNATIVE):MAX%`: the same, up to its first `?` (Envoy's
    /// `req_without_query` formatter, for paths logged without their query).
    RequestHeaderWithoutQuery(HeaderField),
    /// `%RESP(NAME?ALTERNATIVE):MAX%`: a response header as the client gets it.
    ResponseHeader(HeaderField),
    /// `%ENVIRONMENT(NAME):MAX%`: an environment variable, read once when the config is
    /// loaded (as Envoy); `-` when it is not set.
    Environment(EnvironmentField),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentField {
    pub name: String,
    /// Already cut to `max_len`.
    pub value: Option<String>,
    pub max_len: Option<usize>,
}

impl EnvironmentField {
    /// `NAME):MAX` after `ENVIRONMENT(`.
    fn parse(args: &str) -> Result<EnvironmentField, String> {
        let (name, rest) = args
            .split_once(')')
            .ok_or_else(|| "`%ENVIRONMENT(...)%` has no closing `)`".to_owned())?;
        let max_len = match rest {
            "" => None,
            _ => Some(
                rest.strip_prefix(':')
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| {
                        format!("`%ENVIRONMENT({name}){rest}%`: expected `:LENGTH` after `)`")
                    })?,
            ),
        };
        if name.is_empty() {
            return Err("`%ENVIRONMENT()%` names no variable".into());
        }
        let value = std::env::var(name).ok().map(|mut v| {
            if let Some(max) = max_len {
                let mut cut = max.min(v.len());
                while !v.is_char_boundary(cut) {
                    cut -= 1;
                }
                v.truncate(cut);
            }
            v
        });
        Ok(EnvironmentField {
            name: name.to_owned(),
            value,
            max_len,
        })
    }

    fn text(&self) -> String {
        match self.max_len {
            Some(max) => format!("ENVIRONMENT({}):{max}", self.name),
            None => format!("ENVIRONMENT({})", self.name),
        }
    }
}

/// `REQ(...)`, `RESP(...)` or `ENVIRONMENT(...)`, the operators with an argument.
fn header_operator(name: &str) -> Result<Option<Field>, String> {
    if let Some(args) = name.strip_prefix("ENVIRONMENT(") {
        return EnvironmentField::parse(args).map(|f| Some(Field::Environment(f)));
    }
    if let Some(args) = name.strip_prefix("REQ(") {
        return HeaderField::parse("REQ", args, true).map(|f| Some(Field::RequestHeader(f)));
    }
    if let Some(args) = name.strip_prefix("REQ_WITHOUT_QUERY(") {
        return HeaderField::parse("REQ_WITHOUT_QUERY", args, true)
            .map(|f| Some(Field::RequestHeaderWithoutQuery(f)));
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
                Field::RequestHeaderWithoutQuery(h) => Some(h.text("REQ_WITHOUT_QUERY")),
                Field::ResponseHeader(h) => Some(h.text("RESP")),
                Field::Environment(e) => Some(e.text()),
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

/// One logger of a listener.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessLogConfig {
    pub target: LogTarget,
    /// The text line (an OpenTelemetry record's body); not used with `json_format`.
    pub format: LogFormat,
    /// A JSON object per line instead of the text format (files only).
    pub json_format: Option<JsonFormat>,
    /// An OpenTelemetry record's attributes: keys and the formats of their values.
    pub attributes: Vec<(String, LogFormat)>,
    /// Which exchanges it writes; `None`: all.
    pub filter: Option<LogFilter>,
}

impl Serialize for AccessLogConfig {
    /// As written: `path` (or `otlp`), `format` or `json_format`, `attributes`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        match &self.target {
            LogTarget::Otlp(_) => map.serialize_entry("otlp", &self.target)?,
            _ => map.serialize_entry("path", &self.target)?,
        }
        match &self.json_format {
            Some(json) => map.serialize_entry("json_format", json)?,
            None => map.serialize_entry("format", &self.format)?,
        }
        if !self.attributes.is_empty() {
            let attributes: Vec<(&String, &LogFormat)> =
                self.attributes.iter().map(|(k, v)| (k, v)).collect();
            map.serialize_entry("attributes", &JsonFormat::borrowed(&attributes))?;
        }
        if let Some(filter) = &self.filter {
            map.serialize_entry("filter", filter)?;
        }
        map.end()
    }
}

impl JsonFormat {
    /// Keys and formats written as a map, in order.
    fn borrowed<'a>(pairs: &'a [(&'a String, &'a LogFormat)]) -> impl Serialize + 'a {
        struct Pairs<'a>(&'a [(&'a String, &'a LogFormat)]);
        impl Serialize for Pairs<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
            }
        }
        Pairs(pairs)
    }
}

/// One logger as the file writes it: `path` (`stdout` or a file) or `otlp` (a collector).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccessLog {
    pub path: Option<String>,
    pub otlp: Option<RawOtlpLog>,
    pub format: Option<String>,
    /// `{ key: "%FIELD%", ... }`, in order.
    pub json_format: Option<serde_yaml::Mapping>,
    /// With `otlp`: `{ key: "%FIELD%", ... }`, each record's attributes.
    pub attributes: Option<serde_yaml::Mapping>,
    /// Which exchanges it writes (status, duration, flags, a header, an expression).
    pub filter: Option<filter::RawLogFilter>,
}

/// An OpenTelemetry collector of access logs (OTLP/gRPC).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlpLog {
    /// `http://host:port`.
    pub endpoint: String,
    pub authority: Option<String>,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// The resource's `log_name`.
    pub log_name: Option<String>,
    /// More resource attributes (`{ key: value }`), in order.
    pub resource_attributes: Option<serde_yaml::Mapping>,
    #[serde(default, deserialize_with = "crate::units::de_opt_duration")]
    pub timeout: Option<Duration>,
    /// With an `https://` endpoint: the CA, the name to verify, a client certificate.
    pub tls: Option<crate::tls::raw::RawClusterTls>,
}

/// `access_log:` as one logger or a list of them.
pub(crate) fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RawAccessLog>, D::Error> {
    let value = serde_yaml::Value::deserialize(d)?;
    match value {
        serde_yaml::Value::Null => Ok(Vec::new()),
        serde_yaml::Value::Sequence(_) => serde_yaml::from_value(value),
        one => serde_yaml::from_value(one).map(|log| vec![log]),
    }
    .map_err(serde::de::Error::custom)
}

/// Checks a listener's loggers (`path`: where they are, `listeners[0].access_log`).
pub(crate) fn access_logs(
    raw: Vec<RawAccessLog>,
    path: &str,
) -> Result<Vec<AccessLogConfig>, ConfigError> {
    let many = raw.len() > 1;
    raw.into_iter()
        .enumerate()
        .map(|(i, log)| {
            let at = if many {
                format!("{path}[{i}]")
            } else {
                path.to_owned()
            };
            access_log(log, &at)
        })
        .collect()
}

fn access_log(log: RawAccessLog, path: &str) -> Result<AccessLogConfig, ConfigError> {
    let target = match (log.path.as_deref(), log.otlp) {
        (Some("stdout"), None) => LogTarget::Stdout,
        (Some(""), None) => {
            return Err(ConfigError::invalid(
                format!("{path}.path"),
                "expected `stdout` or a file path",
            ));
        }
        (Some(file), None) => LogTarget::File(file.into()),
        (None, Some(otlp)) => {
            LogTarget::Otlp(Box::new(otlp_target(otlp, &format!("{path}.otlp"))?))
        }
        _ => {
            return Err(ConfigError::invalid(
                path,
                "expected one of `path` (stdout or a file) and `otlp` (a collector)",
            ));
        }
    };
    let otlp = matches!(target, LogTarget::Otlp(_));
    let format = LogFormat::parse(log.format.as_deref().unwrap_or(DEFAULT_FORMAT))
        .map_err(|e| ConfigError::invalid(format!("{path}.format"), e))?;
    let json = log
        .json_format
        .map(|json| {
            if log.format.is_some() || otlp {
                return Err(ConfigError::invalid(
                    path,
                    "`json_format` is for a file's lines, instead of `format`",
                ));
            }
            json_format(json, &format!("{path}.json_format"))
        })
        .transpose()?;
    let attributes = match log.attributes {
        None => Vec::new(),
        Some(_) if !otlp => {
            return Err(ConfigError::invalid(
                format!("{path}.attributes"),
                "attributes are an OpenTelemetry record's (`otlp`)",
            ));
        }
        Some(attributes) => json_format(attributes, &format!("{path}.attributes"))?.0,
    };
    let filter = log
        .filter
        .map(|raw| filter::log_filter(raw, &format!("{path}.filter")))
        .transpose()?;
    Ok(AccessLogConfig {
        target,
        format,
        json_format: json,
        attributes,
        filter,
    })
}

fn otlp_target(raw: RawOtlpLog, path: &str) -> Result<OtlpLogTarget, ConfigError> {
    let endpoint: http::Uri = raw
        .endpoint
        .parse()
        .ok()
        .filter(|u: &http::Uri| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
        })
        .ok_or_else(|| {
            ConfigError::invalid(
                format!("{path}.endpoint"),
                format!(
                    "expected `http://host:port` or `https://host:port`, found `{}`",
                    raw.endpoint
                ),
            )
        })?;
    let tls = crate::tls::check::collector_tls(&endpoint, raw.tls, &format!("{path}.tls"))?;
    let authority = raw
        .authority
        .map(|a| {
            a.parse::<http::uri::Authority>().map_err(|_| {
                ConfigError::invalid(
                    format!("{path}.authority"),
                    format!("expected a host name, found `{a}`"),
                )
            })
        })
        .transpose()?;
    let headers = raw
        .headers
        .into_iter()
        .map(|(name, value)| {
            let at = format!("{path}.headers.{name}");
            let name = http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|_| ConfigError::invalid(&at, "not a valid header name"))?;
            let value = http::HeaderValue::from_str(&value)
                .map_err(|_| ConfigError::invalid(&at, "not a valid header value"))?;
            Ok((name, value))
        })
        .collect::<Result<_, ConfigError>>()?;
    let mut resource = Vec::new();
    if let Some(name) = raw.log_name {
        resource.push(("log_name".to_owned(), name));
    }
    for (key, value) in raw.resource_attributes.unwrap_or_default() {
        match (key.as_str(), value.as_str()) {
            (Some(key), Some(value)) => resource.push((key.to_owned(), value.to_owned())),
            _ => {
                return Err(ConfigError::invalid(
                    format!("{path}.resource_attributes"),
                    "expected text keys and text values",
                ));
            }
        }
    }
    let timeout = raw.timeout.unwrap_or(DEFAULT_OTLP_TIMEOUT);
    if timeout.is_zero() {
        return Err(ConfigError::invalid(
            format!("{path}.timeout"),
            "expected a duration above zero",
        ));
    }
    Ok(OtlpLogTarget {
        endpoint,
        authority,
        headers,
        resource,
        timeout,
        tls,
    })
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
    fn environment_values_are_read_at_load_and_written_back_as_operators() {
        // A variable every test process has, and one no process has.
        let path = std::env::var("PATH").unwrap();
        let format =
            LogFormat::parse("%ENVIRONMENT(PATH):3% %ENVIRONMENT(LEGATE_NO_SUCH_VARIABLE)%")
                .unwrap();
        let Field::Environment(cut) = &format.0[0] else {
            panic!("an environment field");
        };
        assert_eq!(cut.value.as_deref(), Some(&path[..3]));
        let Field::Environment(unset) = &format.0[2] else {
            panic!("an environment field");
        };
        assert_eq!(unset.value, None);
        assert_eq!(
            serde_json::to_value(&format).unwrap(),
            "%ENVIRONMENT(PATH):3% %ENVIRONMENT(LEGATE_NO_SUCH_VARIABLE)%"
        );
    }

    #[test]
    fn loggers_are_one_or_a_list_each_to_a_file_or_a_collector() {
        #[derive(serde::Deserialize)]
        struct Listener {
            #[serde(deserialize_with = "one_or_many")]
            access_log: Vec<RawAccessLog>,
        }
        let parse = |yaml: &str| -> Result<Vec<AccessLogConfig>, String> {
            let raw: Listener = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
            access_logs(raw.access_log, "listeners[0].access_log").map_err(|e| e.to_string())
        };
        let one = parse("access_log: { path: stdout }").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].target, LogTarget::Stdout);
        let two = parse(
            "access_log:\n  - { path: stdout, format: \"%METHOD%\\n\" }\n  - otlp: { endpoint: \"http://127.0.0.1:4317\", log_name: access, resource_attributes: { k8s.cluster.name: c1 }, headers: { Authorization: Bearer x } }\n    format: \"%METHOD% %RESPONSE_CODE%\"\n    attributes: { code: \"%RESPONSE_CODE%\" }\n",
        )
        .unwrap();
        let LogTarget::Otlp(otlp) = &two[1].target else {
            panic!("a collector");
        };
        assert_eq!(otlp.endpoint, "http://127.0.0.1:4317/");
        assert!(otlp.tls.is_none());
        let over_tls =
            parse("access_log: { otlp: { endpoint: \"https://logs.example.com:4317\" } }").unwrap();
        let LogTarget::Otlp(secure) = &over_tls[0].target else {
            panic!("a collector");
        };
        let tls = secure.tls.as_ref().expect("TLS for https");
        assert_eq!(tls.server_name.as_deref(), Some("logs.example.com"));
        assert_eq!(
            otlp.resource,
            [
                ("log_name".into(), "access".into()),
                ("k8s.cluster.name".into(), "c1".into())
            ]
        );
        assert_eq!(otlp.headers[0].0, "authorization");
        assert_eq!(two[1].attributes[0].0, "code");
        let dump = serde_json::to_value(&two[1]).unwrap();
        assert_eq!(
            dump["otlp"]["headers"],
            serde_json::json!(["authorization"])
        );
        assert_eq!(dump["attributes"]["code"], "%RESPONSE_CODE%");
        for (yaml, says) in [
            (
                "access_log: { format: x }",
                "listeners[0].access_log: expected one of `path`",
            ),
            (
                "access_log: [{ path: stdout }, { path: stdout, otlp: { endpoint: \"http://a:1\" } }]",
                "listeners[0].access_log[1]: expected one of",
            ),
            (
                "access_log: { otlp: { endpoint: \"a:1\" } }",
                "listeners[0].access_log.otlp.endpoint",
            ),
            (
                "access_log: { path: stdout, attributes: { a: b } }",
                "listeners[0].access_log.attributes",
            ),
            (
                "access_log: { otlp: { endpoint: \"http://a:1\" }, json_format: { a: b } }",
                "`json_format` is for a file's lines",
            ),
        ] {
            let error = parse(yaml).unwrap_err();
            assert!(error.contains(says), "{yaml}: {error}");
        }
    }

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
            ("%HOSTNAME(x)%", "unknown field"),
            ("%ENVIRONMENT()%", "names no variable"),
            ("%ENVIRONMENT(HOME):x%", "expected `:LENGTH`"),
        ] {
            let error = LogFormat::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
