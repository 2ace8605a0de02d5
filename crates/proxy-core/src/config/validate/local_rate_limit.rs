//! The `local_rate_limit` filter's settings.

use std::time::Duration;

use http::{HeaderName, StatusCode};

use crate::config::raw::RawLocalRateLimit;
use crate::config::*;

/// Envoy's default fill interval is required; ours defaults to a second.
const DEFAULT_FILL_INTERVAL: Duration = Duration::from_secs(1);

/// `per_route`: a route's own limit, which must have a bucket.
pub(super) fn local_rate_limit(
    raw: RawLocalRateLimit,
    path: &str,
    per_route: bool,
) -> Result<LocalRateLimitConfig, ConfigError> {
    let token_bucket = raw
        .token_bucket
        .map(|b| -> Result<TokenBucketConfig, ConfigError> {
            let at = format!("{path}.token_bucket");
            let count = |n: u64, key: &str| {
                u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
                    ConfigError::invalid(
                        format!("{at}.{key}"),
                        format!("expected 1 to {}, found {n}", u32::MAX),
                    )
                })
            };
            let max_tokens = count(b.max_tokens, "max_tokens")?;
            let tokens_per_fill =
                count(b.tokens_per_fill.unwrap_or(b.max_tokens), "tokens_per_fill")?;
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
        })
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
    Ok(LocalRateLimitConfig {
        token_bucket,
        scope,
        key,
        max_keys,
        status,
        x_ratelimit_headers,
    })
}
