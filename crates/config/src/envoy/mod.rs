//! Reading Envoy's messages: decoding an `Any`, durations and addresses as Envoy writes them,
//! and refusing, by name, every field a mapping did not take out of its message. Each
//! resource's mapping (`listener/xds.rs`, `route/xds.rs`, ...) is built on these.

pub(crate) mod fields;
pub(crate) mod grpc_service;
pub(crate) mod headers;
pub(crate) mod matchers;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::time::Duration;

pub use xds_client::type_url;

use std::sync::Arc;
use std::time::SystemTime;

/// Why a resource from the management server was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResourceError {
    #[error("cannot decode {kind}: {message}")]
    Decode { kind: &'static str, message: String },
    #[error("{at}: not supported: {} (docs/xds.md lists what is)", fields.join(", "))]
    Unsupported { at: String, fields: Vec<String> },
    #[error("{at}: {message}")]
    Invalid { at: String, message: String },
}

impl ResourceError {
    pub(crate) fn invalid(at: impl Into<String>, message: impl Into<String>) -> Self {
        ResourceError::Invalid {
            at: at.into(),
            message: message.into(),
        }
    }
}

/// `what` at `at` is not supported here: refused by name.
pub(crate) fn unsupported(at: &str, what: impl Into<String>) -> ResourceError {
    ResourceError::Unsupported {
        at: at.to_owned(),
        fields: vec![what.into()],
    }
}

/// Refuses `rest` (a message with the supported fields taken out) if anything is left.
pub(crate) fn nothing_else(
    rest: &impl prost::Message,
    names: &[(u32, &str)],
    at: &(impl std::fmt::Display + ?Sized),
) -> Result<(), ResourceError> {
    let fields = fields::set_fields(rest, names);
    if fields.is_empty() {
        Ok(())
    } else {
        Err(ResourceError::Unsupported {
            at: at.to_string(),
            fields,
        })
    }
}

pub(crate) fn decode<M: prost::Message + Default>(
    value: &envoy_types::pb::google::protobuf::Any,
    type_url: &str,
    kind: &'static str,
) -> Result<M, ResourceError> {
    if value.type_url != type_url {
        return Err(ResourceError::Decode {
            kind,
            message: format!("expected type {type_url}, found {}", value.type_url),
        });
    }
    M::decode(value.value.as_slice()).map_err(|e| ResourceError::Decode {
        kind,
        message: e.to_string(),
    })
}

/// A fractional percentage as percent (above its denominator: 100, as Envoy) and the
/// denominator (100, 10,000 or 1,000,000).
pub(crate) fn fractional_percent(
    value: &envoy_types::pb::envoy::r#type::v3::FractionalPercent,
    at: &str,
) -> Result<(f64, u32), ResourceError> {
    let denominator: u32 = match value.denominator {
        0 => 100,
        1 => 10_000,
        2 => 1_000_000,
        other => {
            return Err(ResourceError::invalid(
                format!("{at}.denominator"),
                format!("unknown denominator {other}"),
            ));
        }
    };
    let percent = f64::from(value.numerator.min(denominator)) * 100.0 / f64::from(denominator);
    Ok((percent, denominator))
}

/// A runtime percentage as its default value (there is no runtime here), in percent for the
/// file's form; unset is 0%, as Envoy's.
pub(crate) fn runtime_percent(
    value: Option<envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent>,
    at: &str,
) -> Result<serde_yaml::Value, ResourceError> {
    let percent = match value.and_then(|v| v.default_value) {
        None => 0.0,
        Some(p) => fractional_percent(&p, &format!("{at}.default_value"))?.0,
    };
    Ok(serde_yaml::Value::Number(percent.into()))
}

/// A protobuf `Value` as JSON (a number that is not finite: null).
pub(crate) fn json(value: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    use serde_json::Value;
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => {
            Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), json(v))).collect())
        }
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(json).collect()),
    }
}

/// What Envoy's `0s` ("no timeout") becomes for a route's and a connection's idle timeout:
/// the longest wait here is a day, so nothing is held forever.
pub(crate) const NO_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A protobuf duration as a std one; negative ones and ones over 10^9 s are refused.
pub(crate) fn duration(
    value: Option<envoy_types::pb::google::protobuf::Duration>,
    at: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<Duration>, ResourceError> {
    let Some(d) = value else {
        return Ok(None);
    };
    if d.seconds < 0 || d.nanos < 0 {
        return Err(ResourceError::invalid(
            at.to_string(),
            "a negative duration",
        ));
    }
    // The file's bound too: deadlines computed from it must not overflow.
    if d.seconds > 1_000_000_000 {
        return Err(ResourceError::invalid(
            at.to_string(),
            "longer than 10^9 seconds",
        ));
    }
    Ok(Some(
        Duration::from_secs(d.seconds as u64) + Duration::from_nanos(d.nanos as u64),
    ))
}

/// `IP:PORT` (`[IPv6]:PORT`) or, where names are allowed, `NAME:PORT`, from an Envoy address.
pub(crate) fn socket_address(
    address: Option<envoy_types::pb::envoy::config::core::v3::Address>,
    at: &str,
) -> Result<String, ResourceError> {
    use envoy_types::pb::envoy::config::core::v3::{SocketAddress, address, socket_address};
    let Some(address::Address::SocketAddress(socket)) = address.and_then(|a| a.address) else {
        return Err(ResourceError::invalid(
            at,
            "expected a socket_address (pipes and internal addresses are not supported)",
        ));
    };
    let port = match socket.port_specifier {
        Some(socket_address::PortSpecifier::PortValue(port)) if port <= 65535 => port,
        _ => {
            return Err(ResourceError::invalid(
                at,
                "expected a port_value of 0 to 65535 (named ports are not supported)",
            ));
        }
    };
    let rest = SocketAddress {
        address: String::new(),
        port_specifier: None,
        ..socket.clone()
    };
    nothing_else(&rest, fields::SOCKET_ADDRESS, at)?;
    Ok(match socket.address.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port as u16).to_string(),
        Err(_) => format!("{}:{port}", socket.address),
    })
}

/// A resource held, with the version the server gave it and when it arrived.
#[derive(Debug)]
pub struct Held<T> {
    pub value: Arc<T>,
    pub version: String,
    pub updated: SystemTime,
    /// A hash of the encoded resource: the same bytes again are not an update.
    pub digest: u64,
}

impl<T> Clone for Held<T> {
    fn clone(&self) -> Self {
        Self {
            value: Arc::clone(&self.value),
            version: self.version.clone(),
            updated: self.updated,
            digest: self.digest,
        }
    }
}

impl<T> Held<T> {
    pub fn new(value: T, version: String, encoded: &[u8]) -> Self {
        Self {
            value: Arc::new(value),
            version,
            updated: SystemTime::now(),
            digest: digest(encoded),
        }
    }
}

/// The hash [`Held::digest`] keeps.
pub fn digest(encoded: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    hasher.write(encoded);
    hasher.finish()
}

/// Envoy's `retry_on`: conditions separated by commas.
pub(crate) fn retry_conditions(text: &str) -> Vec<String> {
    (text.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A retry back-off's intervals (a route's `retry_back_off` or a core `BackoffStrategy`).
pub(crate) fn retry_back_off(
    base: Option<envoy_types::pb::google::protobuf::Duration>,
    max: Option<envoy_types::pb::google::protobuf::Duration>,
    at: &str,
) -> Result<crate::RawRetryBackOff, ResourceError> {
    let at = format!("{at}.retry_back_off");
    let base_interval = duration(base, &format!("{at}.base_interval"))?
        .ok_or_else(|| ResourceError::invalid(&at, "expected base_interval"))?;
    Ok(crate::RawRetryBackOff {
        base_interval,
        max_interval: duration(max, &format!("{at}.max_interval"))?,
    })
}

/// A `SubstitutionFormatString` that is literal (`text_format` or an inline
/// `text_format_source`, no `%`), sent as `text/plain`; its bytes need not be text.
pub(crate) fn literal_body(
    format: envoy_types::pb::envoy::config::core::v3::SubstitutionFormatString,
    at: &str,
) -> Result<bytes::Bytes, ResourceError> {
    use envoy_types::pb::envoy::config::core::v3::substitution_format_string::Format;
    let unsupported = |what: &str| ResourceError::Unsupported {
        at: at.to_owned(),
        fields: vec![what.to_owned()],
    };
    if !matches!(format.content_type.as_str(), "" | "text/plain") || !format.formatters.is_empty() {
        return Err(unsupported("content_type (text/plain only), formatters"));
    }
    let text = match format.format {
        #[allow(deprecated)]
        Some(Format::TextFormat(text)) => bytes::Bytes::from(text),
        Some(Format::TextFormatSource(source)) => match source.specifier {
            Some(
                envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(s),
            ) => bytes::Bytes::from(s),
            Some(
                envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineBytes(b),
            ) => bytes::Bytes::from(b),
            _ => return Err(unsupported("text_format_source (inline only)")),
        },
        _ => return Err(unsupported("json_format (text only)")),
    };
    if text.contains(&b'%') {
        return Err(unsupported(
            "a body with command operators (plain text only)",
        ));
    }
    Ok(text)
}

/// A `DataSource` as text or a file to read at load: `(text, file)`. `what` names the text
/// in an error (`a JWKS document`).
pub(crate) fn data_source(
    source: envoy_types::pb::envoy::config::core::v3::DataSource,
    at: &str,
    what: &str,
) -> Result<(Option<String>, Option<String>), ResourceError> {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    if source.watched_directory.is_some() {
        return Err(unsupported(at, "watched_directory"));
    }
    Ok(match source.specifier {
        Some(Specifier::InlineString(text)) => (Some(text), None),
        Some(Specifier::InlineBytes(bytes)) => {
            let text = String::from_utf8(bytes).map_err(|_| {
                ResourceError::invalid(
                    format!("{at}.inline_bytes"),
                    format!("expected {what} (UTF-8 text)"),
                )
            })?;
            (Some(text), None)
        }
        Some(Specifier::Filename(file)) => (None, Some(file)),
        Some(Specifier::EnvironmentVariable(_)) => {
            return Err(unsupported(at, "environment_variable"));
        }
        None => {
            return Err(ResourceError::invalid(
                at,
                "expected inline_string, inline_bytes or filename",
            ));
        }
    })
}
