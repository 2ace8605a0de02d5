//! `tracing:` distributed tracing. Requests carry W3C trace context to the upstream and the
//! authorization service; sampled ones become spans exported over OTLP.

pub mod span_name;
pub(crate) mod xds;

use std::time::Duration;

use http::HeaderName;
use serde::{Deserialize, Serialize, Serializer};

use super::ConfigError;
use super::serialize as ser;
use crate::units::de_opt_duration;
pub use span_name::SpanName;

/// Percent of requests sampled unless configured. An edge proxy sees every request of the
/// services behind it: all of them would be more spans than a collector wants.
pub const DEFAULT_RANDOM_SAMPLING: f64 = 1.0;
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_QUEUED_SPANS: usize = 8192;
pub const DEFAULT_MAX_EXPORT_BATCH: usize = 512;
/// Asks that a request be traced; honoured only from internal addresses.
pub const DEFAULT_FORCE_TRACE_HEADER: &str = "x-legate-force-trace";
const MAX_QUEUED_SPANS: usize = 1 << 20;

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OtlpProtocol {
    Grpc,
    Http,
}

/// Validated `tracing` settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TracingConfig {
    /// The collector: `http://host:4317` for gRPC, a URL ending in `/v1/traces` for HTTP.
    #[serde(serialize_with = "ser_uri")]
    pub endpoint: http::Uri,
    pub protocol: OtlpProtocol,
    /// The name the collector is called by (gRPC's `:authority`, HTTP's `host`) when it is
    /// not the endpoint's host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// Sent with every export (gRPC metadata, HTTP headers): a collector's API key.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "ser_pairs")]
    pub headers: Vec<(HeaderName, http::HeaderValue)>,
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    /// The resource's `service.name`.
    pub service_name: String,
    /// More resource attributes (`deployment.environment`, ...), over the ones the proxy
    /// sets (`service.name` included).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub resource_attributes: std::collections::BTreeMap<String, String>,
    /// Percent (0 to 100) of requests sampled that come without a trusted decision.
    pub random_sampling: f64,
    /// Present on a request from an internal address: the request is sampled.
    #[serde(serialize_with = "ser_opt_name")]
    pub force_trace_header: Option<HeaderName>,
    pub max_queued_spans: usize,
    pub max_export_batch: usize,
    /// TLS to the collector (an `https://` endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::ClusterTlsConfig>,
}

fn ser_pairs<S: Serializer>(
    pairs: &[(HeaderName, http::HeaderValue)],
    s: S,
) -> Result<S::Ok, S::Error> {
    // Values may be secrets (API keys): the dump names the headers only.
    s.collect_seq(pairs.iter().map(|(name, _)| name.as_str()))
}

fn ser_uri<S: Serializer>(uri: &http::Uri, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(uri)
}

fn ser_opt_name<S: Serializer>(name: &Option<HeaderName>, s: S) -> Result<S::Ok, S::Error> {
    match name {
        Some(name) => ser::header_name(name, s),
        None => s.serialize_none(),
    }
}

/// `tracing: { otlp: { endpoint, protocol, timeout }, service_name, random_sampling, ... }`.
pub(crate) fn tracing(raw: Option<RawTracing>) -> Result<Option<TracingConfig>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let protocol = match raw.otlp.protocol.as_deref() {
        None | Some("grpc") => OtlpProtocol::Grpc,
        Some("http") | Some("http/protobuf") => OtlpProtocol::Http,
        Some(other) => {
            return Err(ConfigError::invalid(
                "tracing.otlp.protocol",
                format!("expected `grpc` or `http`, got `{other}`"),
            ));
        }
    };
    let endpoint = endpoint(&raw.otlp.endpoint, protocol)?;
    let random_sampling = raw.random_sampling.unwrap_or(DEFAULT_RANDOM_SAMPLING);
    if !(0.0..=100.0).contains(&random_sampling) {
        return Err(ConfigError::invalid(
            "tracing.random_sampling",
            "expected a percentage from 0 to 100",
        ));
    }
    let force_trace_header = match raw.force_trace_header {
        None => Some(HeaderName::from_static(DEFAULT_FORCE_TRACE_HEADER)),
        Some(name) if name.is_empty() => None,
        Some(name) => Some(HeaderName::try_from(name.as_str()).map_err(|_| {
            ConfigError::invalid("tracing.force_trace_header", "expected a header name")
        })?),
    };
    let max_queued_spans = raw.max_queued_spans.unwrap_or(DEFAULT_MAX_QUEUED_SPANS);
    if !(1..=MAX_QUEUED_SPANS).contains(&max_queued_spans) {
        return Err(ConfigError::invalid(
            "tracing.max_queued_spans",
            format!("expected 1 to {MAX_QUEUED_SPANS}"),
        ));
    }
    let max_export_batch = raw.max_export_batch.unwrap_or(DEFAULT_MAX_EXPORT_BATCH);
    if !(1..=max_queued_spans).contains(&max_export_batch) {
        return Err(ConfigError::invalid(
            "tracing.max_export_batch",
            "expected 1 to max_queued_spans",
        ));
    }
    let timeout = raw.otlp.timeout.unwrap_or(DEFAULT_EXPORT_TIMEOUT);
    if timeout.is_zero() {
        return Err(ConfigError::invalid(
            "tracing.otlp.timeout",
            "expected more than 0s",
        ));
    }
    let service_name = raw.service_name.unwrap_or_else(|| "legate".to_owned());
    if service_name.is_empty() {
        return Err(ConfigError::invalid(
            "tracing.service_name",
            "expected a name",
        ));
    }
    let authority = match raw.otlp.authority {
        None => None,
        Some(a) if a.parse::<http::uri::Authority>().is_ok() => Some(a),
        Some(a) => {
            return Err(ConfigError::invalid(
                "tracing.otlp.authority",
                format!("expected a host name (and port), found `{a}`"),
            ));
        }
    };
    let mut headers = Vec::with_capacity(raw.otlp.headers.len());
    for (name, value) in raw.otlp.headers {
        let at = format!("tracing.otlp.headers.{name}");
        let header = HeaderName::try_from(name.to_ascii_lowercase().as_str())
            .map_err(|_| ConfigError::invalid(&at, "expected a header name"))?;
        let value = http::HeaderValue::from_str(&value)
            .map_err(|_| ConfigError::invalid(&at, "expected a header value of visible ASCII"))?;
        headers.push((header, value));
    }
    let tls = crate::tls::check::collector_tls(&endpoint, raw.otlp.tls, "tracing.otlp.tls")?;
    Ok(Some(TracingConfig {
        tls,
        endpoint,
        protocol,
        authority,
        headers,
        timeout,
        service_name,
        resource_attributes: raw.resource_attributes,
        random_sampling,
        force_trace_header,
        max_queued_spans,
        max_export_batch,
    }))
}

/// An `http://` or `https://` URL with a host. For HTTP, a URL without a path gets the OTLP one,
/// `/v1/traces`; for gRPC, the path must be empty (the call names its own).
fn endpoint(text: &str, protocol: OtlpProtocol) -> Result<http::Uri, ConfigError> {
    let at = "tracing.otlp.endpoint";
    let uri: http::Uri = text
        .parse()
        .map_err(|_| ConfigError::invalid(at, "expected a URL such as http://127.0.0.1:4317"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(ConfigError::invalid(
                at,
                "expected a URL such as http://127.0.0.1:4317",
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid(at, "expected a host"));
    }
    let path = uri.path();
    let bare = path.is_empty() || path == "/";
    match protocol {
        OtlpProtocol::Grpc if !bare => Err(ConfigError::invalid(
            at,
            "a gRPC endpoint has no path (http://host:4317)",
        )),
        OtlpProtocol::Grpc => Ok(uri),
        OtlpProtocol::Http if bare => {
            let mut parts = uri.into_parts();
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/v1/traces"));
            http::Uri::from_parts(parts).map_err(|e| ConfigError::invalid(at, e.to_string()))
        }
        OtlpProtocol::Http => Ok(uri),
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    pub otlp: RawOtlp,
    pub service_name: Option<String>,
    #[serde(default)]
    pub resource_attributes: std::collections::BTreeMap<String, String>,
    /// Percent, 0 to 100.
    pub random_sampling: Option<f64>,
    /// Empty: no header forces a trace.
    pub force_trace_header: Option<String>,
    pub max_queued_spans: Option<usize>,
    pub max_export_batch: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlp {
    pub endpoint: String,
    /// `grpc` (default) or `http`.
    pub protocol: Option<String>,
    pub authority: Option<String>,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    /// With an `https://` endpoint: the CA, the name to verify, a client certificate.
    pub tls: Option<crate::tls::raw::RawClusterTls>,
}

/// A listener's tracing: whether its requests are traced (when the process traces), and
/// how they are sampled and tagged there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListenerTracing {
    pub enabled: bool,
    /// Percent of requests sampled that bring no trusted decision; `None`: the process's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_sampling: Option<f64>,
    /// Percent of requests with `x-client-trace-id` sampled for it (Envoy's client sampling).
    pub client_sampling: f64,
    /// Percent of the sampled requests kept: a cap over the other two.
    pub overall_sampling: f64,
    /// Attributes of every request's span.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub custom_tags: Vec<CustomTag>,
    /// OpenTelemetry's sampler (its provider's, in Envoy): when set, it alone decides which
    /// requests are sampled, instead of the three shares.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampler: Option<Sampler>,
    /// The request span's name (`ingress` without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<SpanName>,
    /// An upstream try's span's name (`router CLUSTER egress` without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_operation: Option<SpanName>,
}

impl Default for ListenerTracing {
    fn default() -> Self {
        Self {
            enabled: true,
            random_sampling: None,
            client_sampling: 0.0,
            overall_sampling: 100.0,
            custom_tags: Vec::new(),
            sampler: None,
            operation: None,
            upstream_operation: None,
        }
    }
}

/// A route's own tracing (Envoy's route `tracing`): its shares replace the listener's (each
/// 100% unless given, as Envoy's), its tags join the listener's (a tag of the same name
/// replaces the listener's), its names replace the listener's where given.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteTracing {
    pub random_sampling: f64,
    pub client_sampling: f64,
    pub overall_sampling: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub custom_tags: Vec<CustomTag>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<SpanName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_operation: Option<SpanName>,
}

/// A route's `decorator` (Envoy's): the request span's name where no `operation` format
/// names it, and told to the client in `x-envoy-decorator-operation` when `propagate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteDecorator {
    pub operation: String,
    /// The operation as a header value, made once.
    #[serde(skip)]
    pub header: http::HeaderValue,
    pub propagate: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDecorator {
    pub operation: String,
    /// Default true, as Envoy's.
    pub propagate: Option<bool>,
}

/// A route's `decorator`, checked.
pub(crate) fn route_decorator(raw: RawDecorator, at: &str) -> Result<RouteDecorator, ConfigError> {
    let header = http::HeaderValue::from_maybe_shared(bytes::Bytes::from(raw.operation.clone()))
        .ok()
        .filter(|_| !raw.operation.is_empty())
        .ok_or_else(|| {
            ConfigError::invalid(
                format!("{at}.decorator.operation"),
                "expected a name (text that can be a header value)",
            )
        })?;
    Ok(RouteDecorator {
        operation: raw.operation,
        header,
        propagate: raw.propagate.unwrap_or(true),
    })
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteTracing {
    pub random_sampling: Option<f64>,
    pub client_sampling: Option<f64>,
    pub overall_sampling: Option<f64>,
    #[serde(default)]
    pub custom_tags: Vec<RawCustomTag>,
    pub operation: Option<String>,
    pub upstream_operation: Option<String>,
}

/// A route's `tracing`, checked (`at` names it).
pub(crate) fn route_tracing(raw: RawRouteTracing, at: &str) -> Result<RouteTracing, ConfigError> {
    let at = format!("{at}.tracing");
    Ok(RouteTracing {
        random_sampling: percent(raw.random_sampling, &at, "random_sampling", 100.0)?,
        client_sampling: percent(raw.client_sampling, &at, "client_sampling", 100.0)?,
        overall_sampling: percent(raw.overall_sampling, &at, "overall_sampling", 100.0)?,
        custom_tags: custom_tags(raw.custom_tags, &at)?,
        operation: span_name(raw.operation, &at, "operation")?,
        upstream_operation: span_name(raw.upstream_operation, &at, "upstream_operation")?,
    })
}

/// A share of requests, `default` where not given.
fn percent(value: Option<f64>, at: &str, key: &str, default: f64) -> Result<f64, ConfigError> {
    let value = value.unwrap_or(default);
    if (0.0..=100.0).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::invalid(
            format!("{at}.{key}"),
            "expected a percentage from 0 to 100",
        ))
    }
}

/// `operation` or `upstream_operation` (`key`), parsed.
fn span_name(text: Option<String>, at: &str, key: &str) -> Result<Option<SpanName>, ConfigError> {
    text.filter(|t| !t.is_empty())
        .map(|t| {
            SpanName::parse(&t, key == "upstream_operation")
                .map_err(|e| ConfigError::invalid(format!("{at}.{key}"), e))
        })
        .transpose()
}

/// OpenTelemetry's samplers, as Envoy's OpenTelemetry tracer has them. Written
/// `always_on`, `{ trace_id_ratio: PERCENT }` or `{ parent_based: SAMPLER }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampler {
    /// Every request.
    AlwaysOn,
    /// This percentage of traces, decided by the trace id (so every hop of a trace that
    /// uses the same ratio decides alike).
    TraceIdRatio(f64),
    /// A caller's decision where there is a trusted one (a `traceparent` from inside the
    /// network), else the wrapped sampler's.
    ParentBased(Box<Sampler>),
}

impl<'de> Deserialize<'de> for Sampler {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fn from(value: serde_yaml::Value) -> Result<Sampler, String> {
            const EXPECTED: &str = "expected `always_on`, `{ trace_id_ratio: PERCENT }` or `{ parent_based: SAMPLER }`";
            match value {
                serde_yaml::Value::String(name) if name == "always_on" => Ok(Sampler::AlwaysOn),
                serde_yaml::Value::Mapping(map) if map.len() == 1 => {
                    let Some((key, value)) = map.into_iter().next() else {
                        return Err(EXPECTED.into());
                    };
                    match (key.as_str(), value) {
                        (Some("trace_id_ratio"), value) => value
                            .as_f64()
                            .map(Sampler::TraceIdRatio)
                            .ok_or_else(|| "trace_id_ratio: expected a percentage".to_owned()),
                        (Some("parent_based"), inner) => {
                            Ok(Sampler::ParentBased(Box::new(from(inner)?)))
                        }
                        _ => Err(EXPECTED.into()),
                    }
                }
                _ => Err(EXPECTED.into()),
            }
        }
        from(serde_yaml::Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl Sampler {
    fn check(&self, at: &str) -> Result<(), ConfigError> {
        match self {
            Sampler::AlwaysOn => Ok(()),
            Sampler::TraceIdRatio(percent) if (0.0..=100.0).contains(percent) => Ok(()),
            Sampler::TraceIdRatio(_) => Err(ConfigError::invalid(
                format!("{at}.trace_id_ratio"),
                "expected a percentage from 0 to 100",
            )),
            Sampler::ParentBased(inner) => inner.check(&format!("{at}.parent_based")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CustomTag {
    pub tag: String,
    pub value: CustomTagValue,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CustomTagValue {
    Literal(String),
    /// The request header's first value, or `default_value` without it (no tag without
    /// either).
    RequestHeader {
        #[serde(serialize_with = "ser::header_name")]
        name: HeaderName,
        default_value: Option<String>,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTracing {
    pub enabled: Option<bool>,
    pub random_sampling: Option<f64>,
    pub client_sampling: Option<f64>,
    pub overall_sampling: Option<f64>,
    #[serde(default)]
    pub custom_tags: Vec<RawCustomTag>,
    pub sampler: Option<Sampler>,
    pub operation: Option<String>,
    pub upstream_operation: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCustomTag {
    pub tag: String,
    pub literal: Option<String>,
    pub request_header: Option<RawTagSource>,
    /// Read once, at load.
    pub environment: Option<RawTagSource>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTagSource {
    pub name: String,
    pub default_value: Option<String>,
}

/// A listener's `tracing`, checked; `traced`: whether the process has `tracing` at all.
pub(crate) fn listener_tracing(
    raw: Option<RawListenerTracing>,
    path: &str,
    traced: bool,
) -> Result<ListenerTracing, ConfigError> {
    let Some(raw) = raw else {
        return Ok(ListenerTracing::default());
    };
    let at = format!("{path}.tracing");
    if !traced && raw.enabled != Some(false) {
        return Err(ConfigError::invalid(
            at,
            "a listener's tracing needs the top-level `tracing` (its collector)",
        ));
    }
    let random_sampling = raw
        .random_sampling
        .map(|r| percent(Some(r), &at, "random_sampling", 0.0))
        .transpose()?;
    let custom_tags = custom_tags(raw.custom_tags, &at)?;
    if let Some(sampler) = &raw.sampler {
        sampler.check(&format!("{at}.sampler"))?;
    }
    Ok(ListenerTracing {
        sampler: raw.sampler,
        enabled: raw.enabled.unwrap_or(true),
        random_sampling,
        client_sampling: percent(raw.client_sampling, &at, "client_sampling", 0.0)?,
        overall_sampling: percent(raw.overall_sampling, &at, "overall_sampling", 100.0)?,
        custom_tags,
        operation: span_name(raw.operation, &at, "operation")?,
        upstream_operation: span_name(raw.upstream_operation, &at, "upstream_operation")?,
    })
}

/// `custom_tags`, checked; an `environment` tag is read now, once.
fn custom_tags(raw: Vec<RawCustomTag>, at: &str) -> Result<Vec<CustomTag>, ConfigError> {
    let mut custom_tags = Vec::with_capacity(raw.len());
    for (i, t) in raw.into_iter().enumerate() {
        let at = format!("{at}.custom_tags[{i}]");
        if t.tag.is_empty() {
            return Err(ConfigError::invalid(format!("{at}.tag"), "expected a name"));
        }
        let value = match (t.literal, t.request_header, t.environment) {
            (Some(text), None, None) => CustomTagValue::Literal(text),
            (None, Some(h), None) => CustomTagValue::RequestHeader {
                name: HeaderName::try_from(h.name.to_ascii_lowercase().as_str()).map_err(|_| {
                    ConfigError::invalid(
                        format!("{at}.request_header.name"),
                        format!("expected a header name, found `{}`", h.name),
                    )
                })?,
                default_value: h.default_value,
            },
            // Envoy reads the variable once, when the configuration loads.
            (None, None, Some(e)) => match std::env::var(&e.name).ok().or(e.default_value) {
                Some(text) => CustomTagValue::Literal(text),
                None => continue,
            },
            _ => {
                return Err(ConfigError::invalid(
                    at,
                    "expected exactly one of `literal`, `request_header` or `environment`",
                ));
            }
        };
        custom_tags.push(CustomTag { tag: t.tag, value });
    }
    Ok(custom_tags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    const LISTENER: &str = "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    routes:\n      - match: { prefix: / }\n        direct_response: { status: 200 }\n";

    fn load(tracing: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(&format!("tracing:\n{tracing}\n{LISTENER}"))
    }

    #[test]
    fn defaults_fill_in_around_the_endpoint() {
        let config = load("  otlp: { endpoint: http://127.0.0.1:4317 }").unwrap();
        let tracing = config.tracing.unwrap();
        assert_eq!(tracing.protocol, OtlpProtocol::Grpc);
        assert_eq!(tracing.random_sampling, DEFAULT_RANDOM_SAMPLING);
        assert_eq!(tracing.service_name, "legate");
        assert_eq!(
            tracing.force_trace_header.unwrap().as_str(),
            DEFAULT_FORCE_TRACE_HEADER
        );
        assert_eq!(tracing.max_queued_spans, DEFAULT_MAX_QUEUED_SPANS);
    }

    #[test]
    fn an_http_endpoint_without_a_path_gets_the_otlp_one() {
        let config = load("  otlp: { endpoint: 'http://collector:4318', protocol: http }").unwrap();
        assert_eq!(
            config.tracing.unwrap().endpoint.to_string(),
            "http://collector:4318/v1/traces"
        );
    }

    #[test]
    fn an_https_endpoint_is_verified_by_its_host_name_unless_told_otherwise() {
        let config = load("  otlp: { endpoint: 'https://collector.example.com:4317' }").unwrap();
        let tls = config.tracing.unwrap().tls.expect("TLS for https");
        assert_eq!(tls.server_name.as_deref(), Some("collector.example.com"));
        assert!(tls.ca.is_none(), "the system's roots");
        let config = load(
            "  otlp: { endpoint: 'https://10.0.0.7:4317', tls: { server_name: otel.internal } }",
        )
        .unwrap();
        let tls = config.tracing.unwrap().tls.expect("TLS");
        assert_eq!(tls.server_name.as_deref(), Some("otel.internal"));
    }

    #[test]
    fn bad_settings_name_their_key() {
        let cases = [
            (
                "  otlp: { endpoint: 'http://c:4317', tls: { server_name: c } }",
                "tracing.otlp.tls",
            ),
            ("  otlp: { endpoint: 'c:4317' }", "tracing.otlp.endpoint"),
            (
                "  otlp: { endpoint: 'http://c:4317/v1/traces' }",
                "tracing.otlp.endpoint",
            ),
            (
                "  otlp: { endpoint: 'http://c:4317', protocol: zipkin }",
                "tracing.otlp.protocol",
            ),
            (
                "  otlp: { endpoint: 'http://c:4317', timeout: 0s }",
                "tracing.otlp.timeout",
            ),
            (
                "  otlp: { endpoint: 'http://c:4317' }\n  random_sampling: 101",
                "tracing.random_sampling",
            ),
            (
                "  otlp: { endpoint: 'http://c:4317' }\n  max_queued_spans: 0",
                "tracing.max_queued_spans",
            ),
            (
                "  otlp: { endpoint: 'http://c:4317' }\n  max_queued_spans: 4\n  max_export_batch: 5",
                "tracing.max_export_batch",
            ),
            (
                "  otlp: { endpoint: 'http://c:4317' }\n  force_trace_header: 'bad header'",
                "tracing.force_trace_header",
            ),
        ];
        for (yaml, key) in cases {
            let error = load(yaml).unwrap_err().to_string();
            assert!(error.contains(key), "{yaml}: {error}");
        }
    }

    #[test]
    fn an_empty_force_header_turns_forcing_off() {
        let config =
            load("  otlp: { endpoint: 'http://c:4317' }\n  force_trace_header: ''").unwrap();
        assert_eq!(config.tracing.unwrap().force_trace_header, None);
    }

    #[test]
    fn a_listeners_sampler_is_read_and_checked() {
        let with = |sampler: &str| {
            Config::from_yaml(&format!(
                "tracing: {{ otlp: {{ endpoint: 'http://c:4317' }} }}\nlisteners:\n  - name: main\n    address: 127.0.0.1:0\n    tracing: {{ sampler: {sampler} }}\n    routes:\n      - match: {{ prefix: / }}\n        direct_response: {{ status: 200 }}\n"
            ))
        };
        let config = with("{ parent_based: { trace_id_ratio: 10 } }").unwrap();
        assert_eq!(
            config.listeners[0].tracing.sampler,
            Some(Sampler::ParentBased(Box::new(Sampler::TraceIdRatio(10.0))))
        );
        assert_eq!(
            with("always_on").unwrap().listeners[0].tracing.sampler,
            Some(Sampler::AlwaysOn)
        );
        let err = with("{ parent_based: { trace_id_ratio: 101 } }")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("listeners[0].tracing.sampler.parent_based.trace_id_ratio"),
            "{err}"
        );
        assert!(with("sometimes").is_err());
    }

    /// A listener's tracing: it needs the process's collector (unless it turns tracing
    /// off), and each custom tag takes exactly one source.
    #[test]
    fn a_listeners_tracing_is_checked() {
        let with = |top: &str, listener: &str| {
            Config::from_yaml(&format!(
                "{top}listeners:\n  - name: main\n    address: 127.0.0.1:0\n    tracing: {listener}\n    routes:\n      - match: {{ prefix: / }}\n        direct_response: {{ status: 200 }}\n"
            ))
        };
        let top = "tracing: { otlp: { endpoint: 'http://c:4317' } }\n";
        let err = with("", "{ random_sampling: 5 }").unwrap_err().to_string();
        assert!(
            err.contains("listeners[0].tracing: a listener's tracing needs"),
            "{err}"
        );
        assert!(with("", "{ enabled: false }").is_ok());
        let err = with(
            top,
            "{ custom_tags: [{ tag: a, literal: b, request_header: { name: c } }] }",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("listeners[0].tracing.custom_tags[0]: expected exactly one"),
            "{err}"
        );
        let err = with(top, "{ overall_sampling: 101 }")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("listeners[0].tracing.overall_sampling"),
            "{err}"
        );
        let config = with(
            top,
            "{ client_sampling: 20, custom_tags: [{ tag: h, request_header: { name: X-Id } }] }",
        )
        .unwrap();
        let tracing = &config.listeners[0].tracing;
        assert_eq!(
            (tracing.client_sampling, tracing.overall_sampling),
            (20.0, 100.0)
        );
        assert_eq!(
            tracing.custom_tags[0].value,
            CustomTagValue::RequestHeader {
                name: HeaderName::from_static("x-id"),
                default_value: None
            }
        );
    }

    #[test]
    fn routes_take_their_own_tracing_and_decorators() {
        let config = Config::from_yaml(
            "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    routes:\n      - match: { prefix: / }\n        direct_response: { status: 200 }\n        decorator: { operation: home }\n        tracing: { random_sampling: 5, operation: \"%REQ(:path)%\" }\n",
        )
        .unwrap();
        let route = &config.listeners[0].route_config.routes[0];
        let decorator = route.decorator.as_deref().unwrap();
        assert_eq!(
            (decorator.operation.as_str(), decorator.propagate),
            ("home", true)
        );
        let tracing = route.tracing.as_deref().unwrap();
        assert_eq!(tracing.random_sampling, 5.0);
        assert_eq!(tracing.client_sampling, 100.0, "Envoy's route default");
        assert!(tracing.operation.is_some());
        let bad = |route: &str| {
            Config::from_yaml(&format!(
                "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    routes:\n      - match: {{ prefix: / }}\n        direct_response: {{ status: 200 }}\n        {route}\n"
            ))
            .unwrap_err()
            .to_string()
        };
        assert!(bad("decorator: { operation: \"\" }").contains("decorator.operation"));
        let err = bad("tracing: { operation: \"%UPSTREAM_HOST%\" }");
        assert!(
            err.contains("tracing.operation") && err.contains("upstream_operation"),
            "{err}"
        );
        assert!(bad("tracing: { overall_sampling: 101 }").contains("overall_sampling"));
    }
}
