//! Settings of the `health_check` filter: which requests are this proxy's own health checks
//! (a load balancer's probe), answered here without going upstream.

pub(crate) mod xds;

use serde::{Deserialize, Serialize};

use crate::matchers::header_match;
use crate::*;

/// Requests matching all of these are answered by the proxy: 200 while it serves, 503 once
/// failed by the admin's `POST /healthcheck/fail` or draining (Envoy's `health_check` filter
/// without pass-through).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeConfig {
    /// The request target (path and query), exactly; `None`: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProbe {
    pub path: Option<String>,
    #[serde(default)]
    pub headers: Vec<RawHeaderMatch>,
}

fn health_check(raw: RawProbe, path: &str) -> Result<ProbeConfig, ConfigError> {
    if raw.path.is_none() && raw.headers.is_empty() {
        return Err(ConfigError::invalid(
            path,
            "expected a `path` or `headers` (else every request would be a health check)",
        ));
    }
    if let Some(target) = &raw.path
        && !target.starts_with('/')
    {
        return Err(ConfigError::invalid(
            format!("{path}.path"),
            format!("expected a path starting with `/`, found `{target}`"),
        ));
    }
    let headers = raw
        .headers
        .into_iter()
        .enumerate()
        .map(|(i, h)| header_match(h, &format!("{path}.headers[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(ProbeConfig {
        path: raw.path,
        headers,
    })
}

impl FilterSettings for ProbeConfig {
    type Raw = RawProbe;
    /// Nothing: a health check is the listener's, not a route's.
    type RawRoute = serde::de::IgnoredAny;
    type Route = ();

    fn check(raw: RawProbe, path: &str, _: &ChainCtx) -> Result<Self, ConfigError> {
        health_check(raw, path)
    }

    fn check_route(_: serde::de::IgnoredAny, path: &str) -> Result<(), ConfigError> {
        Err(ConfigError::invalid(
            path,
            "the health_check filter has no settings per route",
        ))
    }

    fn route_switch(_: bool) -> serde::de::IgnoredAny {
        serde::de::IgnoredAny
    }
}
