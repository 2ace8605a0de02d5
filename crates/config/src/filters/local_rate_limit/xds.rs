//! Envoy's `LocalRateLimit` (the `envoy.filters.http.local_ratelimit` filter and its
//! per-route settings) as the `local_rate_limit` filter's settings. Envoy's buckets are
//! shared by its worker threads: `scope: process` here.

use envoy_types::pb::envoy::config::route::v3::RateLimit;
use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
use envoy_types::pb::envoy::r#type::v3::TokenBucket;
use envoy_types::pb::google::protobuf::Any;

use super::{RawDescriptor, RawDescriptorEntry, RawLocalRateLimit, RawRateLimitRule, RawTokenBucket};
use crate::envoy::headers::mutations;
use crate::envoy::unsupported;
use crate::filters::rate_limit_actions::xds::actions;
use crate::envoy::{ResourceError, decode, duration, fields, nothing_else, runtime_percent};

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit";

/// Envoy keeps this many values per descriptor that leaves a value out, unless told.
const DEFAULT_MAX_DYNAMIC_DESCRIPTORS: u64 = 20;

/// The filter's settings, on the listener or on a route.
pub(crate) fn settings(any: &Any, at: &str) -> Result<RawLocalRateLimit, ResourceError> {
    let mut limit: LocalRateLimit = decode(any, TYPE_URL, "a LocalRateLimit")?;
    // Names the filter's counters; they are the listener's here.
    limit.stat_prefix.clear();
    let status = limit.status.take().map(|s| {
        // Envoy answers 429 in place of a status that is not an error.
        u16::try_from(s.code)
            .ok()
            .filter(|code| *code >= 400)
            .unwrap_or(429)
    });
    let token_bucket = limit
        .token_bucket
        .take()
        .map(|b| bucket(b, &format!("{at}.token_bucket")))
        .transpose()?;
    let enabled = runtime_percent(limit.filter_enabled.take(), &format!("{at}.filter_enabled"))?;
    let enforced = runtime_percent(limit.filter_enforced.take(), &format!("{at}.filter_enforced"))?;
    let response_headers = mutations(
        std::mem::take(&mut limit.response_headers_to_add),
        Vec::new(),
        &format!("{at}.response_headers_to_add"),
    )?;
    let x_ratelimit_headers = match std::mem::take(&mut limit.enable_x_ratelimit_headers) {
        0 => "never",
        1 => "always",
        other => {
            return Err(ResourceError::invalid(
                format!("{at}.enable_x_ratelimit_headers"),
                format!("unknown version {other}"),
            ));
        }
    };
    let descriptors = std::mem::take(&mut limit.descriptors)
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let at = format!("{at}.descriptors[{i}]");
            let token_bucket = d
                .token_bucket
                .ok_or_else(|| ResourceError::invalid(&at, "expected a token_bucket"))?;
            Ok(RawDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| RawDescriptorEntry {
                        key: e.key,
                        value: Some(e.value),
                    })
                    .collect(),
                token_bucket: bucket(token_bucket, &format!("{at}.token_bucket"))?,
                shadow_mode: Some(d.shadow_mode),
            })
        })
        .collect::<Result<Vec<_>, ResourceError>>()?;
    let rate_limits = std::mem::take(&mut limit.rate_limits)
        .into_iter()
        .enumerate()
        .map(|(i, r)| rule(r, &format!("{at}.rate_limits[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    if !descriptors.is_empty() && rate_limits.is_empty() {
        // Envoy would describe requests by the route's `rate_limits` then.
        return Err(unsupported(
            at,
            "descriptors without the filter's own rate_limits",
        ));
    }
    let max_keys = limit
        .max_dynamic_descriptors
        .take()
        .map_or(DEFAULT_MAX_DYNAMIC_DESCRIPTORS, |n| u64::from(n.value));
    let always_consume = limit
        .always_consume_default_token_bucket
        .take()
        .is_none_or(|b| b.value);
    let retry_after = std::mem::take(&mut limit.enable_retry_after_header);
    nothing_else(&limit, fields::LOCAL_RATE_LIMIT, at)?;
    Ok(RawLocalRateLimit {
        token_bucket,
        // Without descriptors, rules would describe no request: Envoy makes none.
        rate_limits: if descriptors.is_empty() {
            Vec::new()
        } else {
            rate_limits
        },
        descriptors,
        scope: Some("process".into()),
        key: None,
        max_keys: Some(max_keys.max(1)),
        status,
        x_ratelimit_headers: Some(x_ratelimit_headers.into()),
        retry_after: Some(retry_after),
        always_consume_default_token_bucket: Some(always_consume),
        enabled: Some(enabled),
        enforced: Some(enforced),
        response_headers: response_headers.map(Box::new),
    })
}

/// Envoy's token bucket: `tokens_per_fill` is 1 unless given, `fill_interval` is required.
fn bucket(b: TokenBucket, at: &str) -> Result<RawTokenBucket, ResourceError> {
    let fill_interval = duration(b.fill_interval, &format!("{at}.fill_interval"))?
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            ResourceError::invalid(format!("{at}.fill_interval"), "expected more than 0s")
        })?;
    if b.max_tokens == 0 {
        return Err(unsupported(at, "max_tokens: 0 (every request refused)"));
    }
    Ok(RawTokenBucket {
        max_tokens: u64::from(b.max_tokens),
        tokens_per_fill: Some(b.tokens_per_fill.map_or(1, |n| u64::from(n.value))),
        fill_interval: Some(fill_interval),
    })
}


fn rule(mut r: RateLimit, at: &str) -> Result<RawRateLimitRule, ResourceError> {
    let actions = actions(std::mem::take(&mut r.actions), at)?;
    nothing_else(&r, fields::RATE_LIMIT, at)?;
    Ok(RawRateLimitRule { actions })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use envoy_types::pb::envoy::r#type::v3::HttpStatus;
    use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
    use prost::{Message, Name};

    use super::*;
    use envoy_types::pb::envoy::config::route::v3::rate_limit::action::ActionSpecifier;
    use crate::filters::local_rate_limit::local_rate_limit;
    use crate::{RateLimitHeaders, Share};

    fn pack(limit: &LocalRateLimit) -> Any {
        Any {
            type_url: LocalRateLimit::type_url(),
            value: limit.encode_to_vec(),
        }
    }

    #[test]
    fn envoys_defaults_are_kept() {
        let limit = LocalRateLimit {
            stat_prefix: "rl".into(),
            status: Some(HttpStatus { code: 200 }),
            token_bucket: Some(TokenBucket {
                max_tokens: 5,
                tokens_per_fill: None,
                fill_interval: Some(PbDuration {
                    seconds: 1,
                    nanos: 0,
                }),
            }),
            ..Default::default()
        };
        let raw = settings(&pack(&limit), "at").unwrap();
        let config = local_rate_limit(raw, "at", true).unwrap();
        let bucket = config.token_bucket.unwrap();
        // One token a fill unless given; a status that is no error answers 429; no share
        // enabled or enforced unless given; no x-ratelimit headers, no retry-after.
        assert_eq!((bucket.max_tokens, bucket.tokens_per_fill), (5, 1));
        assert_eq!(config.status, http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!((config.enabled, config.enforced), (Share::NONE, Share::NONE));
        assert_eq!(config.x_ratelimit_headers, RateLimitHeaders::Never);
        assert!(!config.retry_after);
        assert!(config.always_consume_default_token_bucket);
        assert_eq!(config.max_keys, 20);
    }

    #[test]
    fn what_is_not_done_here_is_refused_by_name() {
        let refused = |limit: LocalRateLimit| settings(&pack(&limit), "at").unwrap_err().to_string();
        let err = refused(LocalRateLimit {
            rate_limited_as_resource_exhausted: true,
            ..Default::default()
        });
        assert!(err.contains("rate_limited_as_resource_exhausted"), "{err}");
        let err = refused(LocalRateLimit {
            token_bucket: Some(TokenBucket {
                max_tokens: 1,
                tokens_per_fill: Some(UInt32Value { value: 1 }),
                fill_interval: None,
            }),
            ..Default::default()
        });
        assert!(err.contains("at.token_bucket.fill_interval"), "{err}");
        let err = refused(LocalRateLimit {
            descriptors: vec![Default::default()],
            ..Default::default()
        });
        assert!(err.contains("descriptors[0]: expected a token_bucket"), "{err}");
        let err = refused(LocalRateLimit {
            rate_limits: vec![RateLimit {
                actions: vec![envoy_types::pb::envoy::config::route::v3::rate_limit::Action {
                    action_specifier: Some(ActionSpecifier::DestinationCluster(
                        Default::default(),
                    )),
                }],
                ..Default::default()
            }],
            ..Default::default()
        });
        assert!(err.contains("rate_limits[0].actions[0]") && err.contains("destination_cluster"), "{err}");
    }
}
