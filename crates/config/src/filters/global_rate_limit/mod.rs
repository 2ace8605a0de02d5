//! Settings of the `global_rate_limit` filter (Envoy's `ratelimit`): a request is described by
//! its route's `rate_limits` (see `rate_limit_actions`) and the descriptors are sent to a rate
//! limit service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, as
//! envoyproxy/ratelimit serves it), whose answer lets it on or refuses it (429). The limits
//! are the service's, so they hold across every replica that asks it.
//!
//! The listener names the service and the defaults; a route (or virtual host) may give its own
//! `domain` and `rate_limits`, or turn the filter off.

pub(crate) mod xds;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::filters::grpc_service::{GrpcService, RawGrpcService, grpc_service};
use crate::rate_limit_actions::{RawRateLimitAction, rules};
use crate::serialize as ser;
use crate::units::de_opt_duration;
use crate::*;

/// Envoy's default: a rate limit call is short, or the request goes on without it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(20);

/// The filter's settings on a listener.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GlobalRateLimitConfig {
    pub service: GrpcService,
    /// The limits' domain in the service.
    pub domain: String,
    /// The service's answer is awaited this long.
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    /// A failed call refuses the request with `status_on_error` (else it goes on).
    pub failure_mode_deny: bool,
    /// Answers carry `x-ratelimit-limit`, `-remaining` and `-reset` (the IETF draft's
    /// version 03) from the service's descriptor statuses.
    pub x_ratelimit_headers: bool,
    /// A refused request's answer carries `x-envoy-ratelimited: true`.
    pub x_envoy_ratelimited_header: bool,
    /// The status of a refused request.
    pub rate_limited_status: u16,
    /// The status of a request refused because the call failed (`failure_mode_deny`).
    pub status_on_error: u16,
    /// Only the rules of this stage are this filter's (several filters may ask one service at
    /// different stages).
    pub stage: u32,
    /// The rules of routes that give none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rate_limits: Vec<GlobalRateLimitRule>,
}

/// One rule: a descriptor, made of its actions' entries, sent when every action applies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GlobalRateLimitRule {
    #[serde(flatten)]
    pub rule: RateLimitRule,
    /// The hits this request counts for against the descriptor's limit (1 unless given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hits_addend: Option<u64>,
}

/// What a route or virtual host gives the filter: its domain (else the listener's), its rules
/// (which take the place of the listener's and of the route table's `rate_limits`), and
/// whether a route's virtual host's `rate_limits` apply besides its own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteRateLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rate_limits: Vec<GlobalRateLimitRule>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vh_rate_limits: Option<VhRateLimits>,
}

/// Whether a route's virtual host's `rate_limits` apply (Envoy's `vh_rate_limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VhRateLimits {
    /// Unless the route has `rate_limits` of its own (the default).
    Override,
    /// Besides the route's own.
    Include,
    /// Never.
    Ignore,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGlobalRateLimit {
    pub service: Option<RawGrpcService>,
    pub domain: Option<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    pub failure_mode_deny: Option<bool>,
    pub x_ratelimit_headers: Option<bool>,
    pub x_envoy_ratelimited_header: Option<bool>,
    pub rate_limited_status: Option<u16>,
    pub status_on_error: Option<u16>,
    pub stage: Option<u32>,
    #[serde(default)]
    pub rate_limits: Vec<RawGlobalRateLimitRule>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGlobalRateLimitRule {
    pub actions: Vec<RawRateLimitAction>,
    pub hits_addend: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteRateLimits {
    pub domain: Option<String>,
    #[serde(default)]
    pub rate_limits: Vec<RawGlobalRateLimitRule>,
    pub vh_rate_limits: Option<VhRateLimits>,
}

impl FilterSettings for GlobalRateLimitConfig {
    type Raw = RawGlobalRateLimit;
    type RawRoute = RawPerRoute<RawRouteRateLimits>;
    type Route = PerRoute<RouteRateLimits>;

    fn check(raw: RawGlobalRateLimit, path: &str, _: &ChainCtx<'_>) -> Result<Self, ConfigError> {
        global_rate_limit(raw, path)
    }

    fn check_route(raw: Self::RawRoute, path: &str) -> Result<Self::Route, ConfigError> {
        per_route(raw, path, |raw, at| {
            Ok(RouteRateLimits {
                domain: raw.domain.map(|d| domain(d, &format!("{at}.domain"))).transpose()?,
                rate_limits: global_rules(raw.rate_limits, &format!("{at}.rate_limits"))?,
                vh_rate_limits: raw.vh_rate_limits,
            })
        })
    }

    fn route_switch(on: bool) -> Self::RawRoute {
        RawPerRoute::Word(if on { "enabled" } else { "disabled" }.into())
    }
}

fn global_rate_limit(raw: RawGlobalRateLimit, path: &str) -> Result<GlobalRateLimitConfig, ConfigError> {
    let service = grpc_service(raw.service, &format!("{path}.service"), "rate limit service")?;
    let Some(domain_name) = raw.domain else {
        return Err(ConfigError::invalid(
            format!("{path}.domain"),
            "expected the limits' domain in the service",
        ));
    };
    let status = |code: Option<u16>, default: u16, name: &str| -> Result<u16, ConfigError> {
        match code.unwrap_or(default) {
            code @ 400..=599 => Ok(code),
            other => Err(ConfigError::invalid(
                format!("{path}.{name}"),
                format!("expected an error status (400 to 599), found {other}"),
            )),
        }
    };
    let timeout = raw.timeout.unwrap_or(DEFAULT_TIMEOUT);
    if timeout.is_zero() {
        return Err(ConfigError::invalid(format!("{path}.timeout"), "expected more than 0s"));
    }
    Ok(GlobalRateLimitConfig {
        service,
        domain: domain(domain_name, &format!("{path}.domain"))?,
        timeout,
        failure_mode_deny: raw.failure_mode_deny.unwrap_or(false),
        x_ratelimit_headers: raw.x_ratelimit_headers.unwrap_or(false),
        x_envoy_ratelimited_header: raw.x_envoy_ratelimited_header.unwrap_or(true),
        rate_limited_status: status(raw.rate_limited_status, 429, "rate_limited_status")?,
        status_on_error: status(raw.status_on_error, 500, "status_on_error")?,
        stage: match raw.stage.unwrap_or(0) {
            stage @ 0..=10 => stage,
            other => {
                return Err(ConfigError::invalid(
                    format!("{path}.stage"),
                    format!("expected 0 to 10, found {other}"),
                ));
            }
        },
        rate_limits: global_rules(raw.rate_limits, &format!("{path}.rate_limits"))?,
    })
}

fn domain(domain: String, path: &str) -> Result<String, ConfigError> {
    if domain.is_empty() {
        return Err(ConfigError::invalid(path, "expected a domain"));
    }
    Ok(domain)
}

fn global_rules(raw: Vec<RawGlobalRateLimitRule>, path: &str) -> Result<Vec<GlobalRateLimitRule>, ConfigError> {
    let addends: Vec<Option<u64>> = raw.iter().map(|r| r.hits_addend).collect();
    let checked = rules(
        raw.into_iter()
            .map(|r| crate::rate_limit_actions::RawRateLimitRule { actions: r.actions })
            .collect(),
        path,
    )?;
    Ok(checked
        .into_iter()
        .zip(addends)
        .map(|(rule, hits_addend)| GlobalRateLimitRule { rule, hits_addend })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use super::*;

    fn check(yaml: &str) -> Result<GlobalRateLimitConfig, String> {
        let raw: RawGlobalRateLimit = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        global_rate_limit(raw, "f").map_err(|e| e.to_string())
    }

    #[test]
    fn envoys_defaults_and_what_is_checked_at_load() {
        let config = check(
            "service: { address: 127.0.0.1:8081 }\ndomain: edge\nrate_limits:\n  - actions: [{ generic_key: { descriptor_value: all } }]\n    hits_addend: 2",
        )
        .unwrap();
        assert_eq!(config.timeout, DEFAULT_TIMEOUT);
        assert_eq!((config.rate_limited_status, config.status_on_error), (429, 500));
        assert!(config.x_envoy_ratelimited_header && !config.failure_mode_deny && !config.x_ratelimit_headers);
        assert_eq!(config.rate_limits[0].hits_addend, Some(2));
        let dumped = serde_json::to_value(&config).unwrap();
        assert_eq!(dumped["service"]["address"], "127.0.0.1:8081");
        assert_eq!(dumped["rate_limits"][0]["actions"][0]["generic_key"]["descriptor_key"], "generic_key");
        for (yaml, complaint) in [
            ("domain: edge", "f.service"),
            ("service: { address: 127.0.0.1:8081 }", "f.domain"),
            ("service: { address: nowhere }\ndomain: edge", "f.service.address"),
            ("service: { address: 127.0.0.1:1 }\ndomain: edge\nrate_limited_status: 200", "f.rate_limited_status"),
            ("service: { address: 127.0.0.1:1 }\ndomain: edge\nstage: 11", "f.stage"),
            ("service: { address: 127.0.0.1:1 }\ndomain: edge\ntimeout: 0s", "f.timeout"),
            ("service: { address: 127.0.0.1:1 }\ndomain: edge\nrate_limits: [{ actions: [] }]", "f.rate_limits[0].actions"),
        ] {
            let err = check(yaml).unwrap_err();
            assert!(err.contains(complaint), "{yaml}: {err}");
        }
    }
}
