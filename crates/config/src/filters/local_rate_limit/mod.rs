//! Settings of the `local_rate_limit` filter: token buckets, validated. A default bucket
//! (one per key, when keyed), and buckets for the requests its descriptors name.

mod descriptors;
pub(crate) mod xds;

pub use descriptors::*;

use std::time::Duration;

use http::{HeaderName, StatusCode};
use serde::{Deserialize, Serialize};

use super::headers::mutations;
use crate::matchers::share;
use crate::serialize as ser;
use crate::units::de_opt_duration;
use crate::*;

/// Most distinct keys (client IPs, header values) a keyed limit tracks, unless configured.
pub const DEFAULT_RATE_LIMIT_MAX_KEYS: usize = 10_000;

/// A local rate limit: requests take a token from a bucket, and get `status` (429) when it is
/// empty.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LocalRateLimitConfig {
    /// `None`: the filter limits only the routes that set a bucket of their own.
    pub token_bucket: Option<TokenBucketConfig>,
    /// One bucket for the whole process, or one per worker.
    pub scope: RateLimitScope,
    /// A bucket per distinct value of this request attribute; requests without it share one.
    pub key: Option<RateLimitKey>,
    /// Distinct keys tracked at most (per 1/16 shard of them); past it, keys whose bucket has
    /// refilled are forgotten first, then any.
    pub max_keys: usize,
    #[serde(serialize_with = "ser::status")]
    pub status: StatusCode,
    /// Which responses carry `x-ratelimit-limit`, `-remaining` and `-reset`.
    pub x_ratelimit_headers: RateLimitHeaders,
    /// A `retry-after` header on the refused responses.
    pub retry_after: bool,
    /// Buckets for the requests whose `rate_limits` lists they name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<DescriptorLimit>,
    /// How a request is described for `descriptors`: a list of entries per rule.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rate_limits: Vec<RateLimitRule>,
    /// Whether a request a descriptor limits also takes from `token_bucket` (Envoy's
    /// `always_consume_default_token_bucket`).
    pub always_consume_default_token_bucket: bool,
    /// The share of requests the filter looks at; the others pass untouched.
    pub enabled: Share,
    /// The share of requests over the limit that are refused; the others are counted and
    /// pass.
    pub enforced: Share,
    /// Changes to the headers of the refused responses.
    #[serde(skip_serializing_if = "HeaderMutations::is_empty")]
    pub response_headers: HeaderMutations,
}

/// Envoy's token bucket: it starts full, and every `fill_interval` gets `tokens_per_fill`
/// back, up to `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenBucketConfig {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    #[serde(serialize_with = "ser::duration")]
    pub fill_interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitScope {
    /// One bucket shared by every worker: the limit holds for the process exactly.
    Process,
    /// A bucket per worker (no shared counter): the limit holds per worker.
    Worker,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitKey {
    Header(HeaderName),
    ClientIp,
}

impl Serialize for RateLimitKey {
    /// As written: `header: NAME` or `client_ip: true`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self {
            RateLimitKey::Header(name) => map.serialize_entry("header", name.as_str())?,
            RateLimitKey::ClientIp => map.serialize_entry("client_ip", &true)?,
        }
        map.end()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitHeaders {
    /// Only on the responses the limit refused.
    OnLimited,
    /// On every response that passed the filter.
    Always,
    Never,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLocalRateLimit {
    pub token_bucket: Option<RawTokenBucket>,
    pub scope: Option<String>,
    pub key: Option<RawRateLimitKey>,
    pub max_keys: Option<u64>,
    pub status: Option<u16>,
    pub x_ratelimit_headers: Option<String>,
    pub retry_after: Option<bool>,
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    pub rate_limits: Vec<RawRateLimitRule>,
    pub always_consume_default_token_bucket: Option<bool>,
    pub enabled: Option<serde_yaml::Value>,
    pub enforced: Option<serde_yaml::Value>,
    /// Boxed: most limits have none, and the chain's entries stay small.
    pub response_headers: Option<Box<RawHeaderMutations>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokenBucket {
    pub max_tokens: u64,
    pub tokens_per_fill: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub fill_interval: Option<Duration>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimitKey {
    pub header: Option<String>,
    pub client_ip: Option<bool>,
}

/// Envoy's default fill interval is required; ours defaults to a second.
const DEFAULT_FILL_INTERVAL: Duration = Duration::from_secs(1);

/// Envoy's token bucket, checked.
pub(super) fn token_bucket(b: RawTokenBucket, at: &str) -> Result<TokenBucketConfig, ConfigError> {
    let count = |n: u64, key: &str| {
        u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
            ConfigError::invalid(
                format!("{at}.{key}"),
                format!("expected 1 to {}, found {n}", u32::MAX),
            )
        })
    };
    let max_tokens = count(b.max_tokens, "max_tokens")?;
    let tokens_per_fill = count(b.tokens_per_fill.unwrap_or(b.max_tokens), "tokens_per_fill")?;
    let fill_interval = b.fill_interval.unwrap_or(DEFAULT_FILL_INTERVAL);
    // The bucket counts fills in milliseconds.
    if fill_interval < Duration::from_millis(1) {
        return Err(ConfigError::invalid(
            format!("{at}.fill_interval"),
            "expected at least 1ms",
        ));
    }
    Ok(TokenBucketConfig {
        max_tokens,
        tokens_per_fill,
        fill_interval,
    })
}

/// `per_route`: a route's own limit, which must have a bucket.
pub(super) fn local_rate_limit(
    raw: RawLocalRateLimit,
    path: &str,
    per_route: bool,
) -> Result<LocalRateLimitConfig, ConfigError> {
    let token_bucket = raw
        .token_bucket
        .map(|b| token_bucket(b, &format!("{path}.token_bucket")))
        .transpose()?;
    if per_route && token_bucket.is_none() {
        return Err(ConfigError::invalid(
            format!("{path}.token_bucket"),
            "a route's own limit needs a `token_bucket` (or write `disabled`)",
        ));
    }
    let scope = match raw.scope.as_deref() {
        None | Some("process") => RateLimitScope::Process,
        Some("worker") => RateLimitScope::Worker,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.scope"),
                format!("expected `process` or `worker`, found `{other}`"),
            ));
        }
    };
    let key = match raw.key {
        None => None,
        Some(k) => match (k.header, k.client_ip) {
            (Some(header), None) => Some(RateLimitKey::Header(
                HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                    ConfigError::invalid(
                        format!("{path}.key.header"),
                        format!("expected a header name, found `{header}`"),
                    )
                })?,
            )),
            (None, Some(true)) => Some(RateLimitKey::ClientIp),
            _ => {
                return Err(ConfigError::invalid(
                    format!("{path}.key"),
                    "expected exactly one of `header: NAME` or `client_ip: true`",
                ));
            }
        },
    };
    let max_keys = match raw.max_keys {
        None => DEFAULT_RATE_LIMIT_MAX_KEYS,
        Some(n @ 1..=10_000_000) => n as usize,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.max_keys"),
                format!("expected 1 to 10000000, found {other}"),
            ));
        }
    };
    let status = match raw.status {
        None => StatusCode::TOO_MANY_REQUESTS,
        Some(code) => StatusCode::from_u16(code)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .ok_or_else(|| {
                ConfigError::invalid(
                    format!("{path}.status"),
                    format!("expected a 4xx or 5xx status, found {code}"),
                )
            })?,
    };
    let x_ratelimit_headers = match raw.x_ratelimit_headers.as_deref() {
        None | Some("on_limited") => RateLimitHeaders::OnLimited,
        Some("always") => RateLimitHeaders::Always,
        Some("never") => RateLimitHeaders::Never,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.x_ratelimit_headers"),
                format!("expected `on_limited`, `always` or `never`, found `{other}`"),
            ));
        }
    };
    let descriptors = descriptors(raw.descriptors, &format!("{path}.descriptors"))?;
    let rate_limits = rules(raw.rate_limits, &format!("{path}.rate_limits"))?;
    if descriptors.is_empty() != rate_limits.is_empty() {
        return Err(ConfigError::invalid(
            path,
            "`descriptors` and `rate_limits` go together: the rules describe requests, the \
             descriptors give buckets to what they describe",
        ));
    }
    Ok(LocalRateLimitConfig {
        token_bucket,
        scope,
        key,
        max_keys,
        status,
        x_ratelimit_headers,
        retry_after: raw.retry_after.unwrap_or(true),
        descriptors,
        rate_limits,
        always_consume_default_token_bucket: raw
            .always_consume_default_token_bucket
            .unwrap_or(true),
        enabled: share(raw.enabled.as_ref(), Share::ALL, &format!("{path}.enabled"))?,
        enforced: share(raw.enforced.as_ref(), Share::ALL, &format!("{path}.enforced"))?,
        response_headers: mutations(
            raw.response_headers.map(|h| *h).unwrap_or_default(),
            &format!("{path}.response_headers"),
            true,
        )?,
    })
}

per_route_settings!(LocalRateLimitConfig, RawLocalRateLimit, local_rate_limit);
