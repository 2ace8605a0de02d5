//! Settings of the `local_rate_limit` filter: token buckets, validated.

use std::time::Duration;

use http::{HeaderName, StatusCode};
use serde::Serialize;

use super::serialize as ser;

/// Most distinct keys (client IPs, header values) a keyed limit tracks, unless configured.
pub const DEFAULT_RATE_LIMIT_MAX_KEYS: usize = 10_000;

/// A local rate limit: requests take a token from a bucket, and get `status` (429) when it is
/// empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
