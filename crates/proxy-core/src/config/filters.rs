//! The HTTP filter chain of a listener, and what each route says about its filters.

use serde::{Serialize, Serializer};

use super::compression::CompressionConfig;
use super::cors::CorsConfig;
use super::ext_authz::{ExtAuthzConfig, RouteAuthz};
use super::header_rules::HeaderRulesConfig;
use super::local_rate_limit::LocalRateLimitConfig;

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
