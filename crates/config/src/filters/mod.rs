//! The HTTP filter chain of a listener, and what each route says about its filters. Each
//! filter's settings (the file's form, the typed form, their checks, and the xDS mapping where
//! Envoy has one) are in a module of their own below.

pub mod compression;
pub mod cors;
pub mod ext_authz;
pub mod headers;
pub mod local_rate_limit;

use serde::{Deserialize, Serialize, Serializer};

use crate::*;

/// One filter of a listener's chain. Requests meet the filters in the order written;
/// responses pass back through them in reverse.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpFilterConfig {
    /// Ask an authorization service (Envoy's `ext_authz`).
    ExtAuthz(ExtAuthzConfig),
    /// A token bucket per listener, route or key (Envoy's `local_ratelimit`).
    LocalRateLimit(LocalRateLimitConfig),
    /// Add, set and remove request and response headers.
    Headers(HeaderRulesConfig),
    /// gzip, brotli or zstd for responses the client accepts them for.
    Compression(CompressionConfig),
    /// Cross-origin resource sharing: preflights answered, response headers added.
    Cors(CorsConfig),
}

impl HttpFilterConfig {
    /// The filter's name, as the config writes it (`http_filters` and a route's `filters`).
    pub fn name(&self) -> &'static str {
        match self {
            HttpFilterConfig::ExtAuthz(_) => "ext_authz",
            HttpFilterConfig::LocalRateLimit(_) => "local_rate_limit",
            HttpFilterConfig::Headers(_) => "headers",
            HttpFilterConfig::Compression(_) => "compression",
            HttpFilterConfig::Cors(_) => "cors",
        }
    }
}

/// A route's settings for its listener's filters: by default each filter applies as the
/// listener configures it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RouteFilters {
    #[serde(skip_serializing_if = "RouteAuthz::is_default")]
    pub ext_authz: RouteAuthz,
    #[serde(skip_serializing_if = "PerRoute::is_inherit")]
    pub local_rate_limit: PerRoute<LocalRateLimitConfig>,
    #[serde(skip_serializing_if = "PerRoute::is_inherit")]
    pub headers: PerRoute<HeaderRulesConfig>,
    #[serde(skip_serializing_if = "PerRoute::is_inherit")]
    pub compression: PerRoute<CompressionConfig>,
    #[serde(skip_serializing_if = "PerRoute::is_inherit")]
    pub cors: PerRoute<CorsConfig>,
}

impl RouteFilters {
    pub(crate) fn is_default(&self) -> bool {
        *self == RouteFilters::default()
    }
}

/// How a route changes one of its listener's filters.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum PerRoute<T> {
    /// As the listener configures it.
    #[default]
    Inherit,
    /// Off for this route.
    Disabled,
    /// These settings instead of the listener's (for `headers`: in addition to them). Boxed:
    /// most routes inherit, and a table may hold 100,000 routes.
    Override(Box<T>),
}

impl<T> PerRoute<T> {
    pub(crate) fn is_inherit(&self) -> bool {
        matches!(self, PerRoute::Inherit)
    }
}

impl<T: Serialize> Serialize for PerRoute<T> {
    /// As written: `disabled`, or the route's settings.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PerRoute::Inherit => s.serialize_none(),
            PerRoute::Disabled => s.serialize_str("disabled"),
            PerRoute::Override(settings) => settings.serialize(s),
        }
    }
}

/// One entry of `http_filters`: `- NAME: { settings }`.
#[derive(Debug, Clone)]
pub enum RawHttpFilter {
    ExtAuthz(RawExtAuthz),
    LocalRateLimit(Option<RawLocalRateLimit>),
    Headers(Option<RawHeaderRules>),
    Compression(Option<RawCompression>),
    Cors(Option<RawCors>),
}

/// The filters `http_filters` knows, by name.
const FILTER_NAMES: &str = "ext_authz, local_rate_limit, headers, compression, cors";

impl<'de> Deserialize<'de> for RawHttpFilter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let map = serde_yaml::Mapping::deserialize(d)?;
        let mut entries = map.into_iter();
        let (Some((serde_yaml::Value::String(name), settings)), None) =
            (entries.next(), entries.next())
        else {
            return Err(D::Error::custom(format!(
                "expected one filter per item, written `- NAME: {{ settings }}` with NAME one of {FILTER_NAMES}"
            )));
        };
        // A bare `- compression:` means the defaults.
        let settings = match settings {
            serde_yaml::Value::Null => serde_yaml::Value::Mapping(Default::default()),
            other => other,
        };
        fn parse<T: serde::de::DeserializeOwned, E: Error>(
            name: &str,
            settings: serde_yaml::Value,
        ) -> Result<T, E> {
            serde_yaml::from_value(settings).map_err(|e| E::custom(format!("{name}: {e}")))
        }
        Ok(match name.as_str() {
            "ext_authz" => RawHttpFilter::ExtAuthz(parse(&name, settings)?),
            "local_rate_limit" => RawHttpFilter::LocalRateLimit(parse(&name, settings)?),
            "headers" => RawHttpFilter::Headers(parse(&name, settings)?),
            "compression" => RawHttpFilter::Compression(parse(&name, settings)?),
            "cors" => RawHttpFilter::Cors(parse(&name, settings)?),
            other => {
                return Err(D::Error::custom(format!(
                    "unknown filter `{other}`; known: {FILTER_NAMES}"
                )));
            }
        })
    }
}

impl RawHttpFilter {
    pub fn name(&self) -> &'static str {
        match self {
            RawHttpFilter::ExtAuthz(_) => "ext_authz",
            RawHttpFilter::LocalRateLimit(_) => "local_rate_limit",
            RawHttpFilter::Headers(_) => "headers",
            RawHttpFilter::Compression(_) => "compression",
            RawHttpFilter::Cors(_) => "cors",
        }
    }
}

/// A route's `filters:`, by filter name.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteFilters {
    pub ext_authz: Option<RawRouteAuthz>,
    pub local_rate_limit: Option<RawPerRoute<RawLocalRateLimit>>,
    pub headers: Option<RawPerRoute<RawHeaderRules>>,
    pub compression: Option<RawPerRoute<RawCompression>>,
    pub cors: Option<RawPerRoute<RawCors>>,
}

/// `disabled`, or settings for the route.
#[derive(Debug, Clone)]
pub enum RawPerRoute<T> {
    Word(String),
    Settings(T),
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for RawPerRoute<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Read as a value first, so that settings get their own precise error rather than
        // "did not match any variant".
        match serde_yaml::Value::deserialize(d)? {
            serde_yaml::Value::String(word) => Ok(RawPerRoute::Word(word)),
            value => serde_yaml::from_value(value)
                .map(RawPerRoute::Settings)
                .map_err(serde::de::Error::custom),
        }
    }
}

pub(super) fn http_filters(
    raw: Vec<RawHttpFilter>,
    path: &str,
    buffer_limit: u32,
) -> Result<Vec<HttpFilterConfig>, ConfigError> {
    let mut chain: Vec<HttpFilterConfig> = Vec::with_capacity(raw.len());
    for (i, filter) in raw.into_iter().enumerate() {
        let at = format!("{path}[{i}]");
        let name = filter.name();
        // Routes name filters by type, so a type appears once.
        if chain.iter().any(|f| f.name() == name) {
            return Err(ConfigError::invalid(
                format!("{at}.{name}"),
                format!("`{name}` is already in the chain; a filter may appear once"),
            ));
        }
        let at = format!("{at}.{name}");
        chain.push(match filter {
            RawHttpFilter::ExtAuthz(raw) => {
                HttpFilterConfig::ExtAuthz(ext_authz::listener_authz(raw, &at, buffer_limit)?)
            }
            RawHttpFilter::LocalRateLimit(raw) => HttpFilterConfig::LocalRateLimit(
                local_rate_limit::local_rate_limit(raw.unwrap_or_default(), &at, false)?,
            ),
            RawHttpFilter::Headers(raw) => {
                HttpFilterConfig::Headers(headers::header_rules(raw.unwrap_or_default(), &at)?)
            }
            RawHttpFilter::Compression(raw) => HttpFilterConfig::Compression(
                compression::compression(raw.unwrap_or_default(), &at)?,
            ),
            RawHttpFilter::Cors(raw) => {
                HttpFilterConfig::Cors(cors::cors(raw.unwrap_or_default(), &at)?)
            }
        });
    }
    Ok(chain)
}

pub(super) fn route_filters(
    raw: Option<RawRouteFilters>,
    path: &str,
    chain: &[HttpFilterConfig],
) -> Result<RouteFilters, ConfigError> {
    let Some(raw) = raw else {
        return Ok(RouteFilters::default());
    };
    let in_chain = |name: &str, given: bool| {
        if given && !chain.iter().any(|f| f.name() == name) {
            return Err(ConfigError::invalid(
                format!("{path}.{name}"),
                format!("the listener has no `{name}` filter in its http_filters"),
            ));
        }
        Ok(())
    };
    in_chain("ext_authz", raw.ext_authz.is_some())?;
    in_chain("local_rate_limit", raw.local_rate_limit.is_some())?;
    in_chain("headers", raw.headers.is_some())?;
    in_chain("compression", raw.compression.is_some())?;
    in_chain("cors", raw.cors.is_some())?;
    Ok(RouteFilters {
        ext_authz: ext_authz::route_authz(raw.ext_authz, &format!("{path}.ext_authz"))?,
        local_rate_limit: per_route(
            raw.local_rate_limit,
            &format!("{path}.local_rate_limit"),
            |raw, at| local_rate_limit::local_rate_limit(raw, at, true),
        )?,
        headers: per_route(
            raw.headers,
            &format!("{path}.headers"),
            headers::header_rules,
        )?,
        compression: per_route(
            raw.compression,
            &format!("{path}.compression"),
            compression::compression,
        )?,
        cors: per_route(raw.cors, &format!("{path}.cors"), cors::cors)?,
    })
}

fn per_route<R, T>(
    raw: Option<RawPerRoute<R>>,
    path: &str,
    settings: impl FnOnce(R, &str) -> Result<T, ConfigError>,
) -> Result<PerRoute<T>, ConfigError> {
    match raw {
        None => Ok(PerRoute::Inherit),
        Some(RawPerRoute::Word(word)) if word == "disabled" => Ok(PerRoute::Disabled),
        Some(RawPerRoute::Word(other)) => Err(ConfigError::invalid(
            path,
            format!("expected `disabled` or the route's settings, found `{other}`"),
        )),
        Some(RawPerRoute::Settings(raw)) => {
            settings(raw, path).map(|s| PerRoute::Override(Box::new(s)))
        }
    }
}
