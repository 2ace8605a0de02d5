//! Envoy's `CsrfPolicy` (the `envoy.filters.http.csrf` filter and its per-route settings) as
//! the `csrf` filter's settings.

use envoy_types::pb::envoy::extensions::filters::http::csrf::v3::CsrfPolicy;
use envoy_types::pb::google::protobuf::Any;

use super::RawCsrf;
use crate::envoy::{ResourceError, decode, matchers, runtime_percent};

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.csrf.v3.CsrfPolicy";

/// The policy, on the listener or on a route: shares at their default values (no runtime
/// here; unset is 0%, as Envoy's).
pub(crate) fn settings(any: &Any, at: &str) -> Result<RawCsrf, ResourceError> {
    let policy: CsrfPolicy = decode(any, TYPE_URL, "a CsrfPolicy")?;
    let additional_origins = policy
        .additional_origins
        .into_iter()
        .enumerate()
        .map(|(i, m)| matchers::pattern_of(m, &format!("{at}.additional_origins[{i}]")))
        .collect::<Result<_, ResourceError>>()?;
    Ok(RawCsrf {
        enabled: Some(runtime_percent(
            policy.filter_enabled,
            &format!("{at}.filter_enabled"),
        )?),
        shadow: Some(runtime_percent(
            policy.shadow_enabled,
            &format!("{at}.shadow_enabled"),
        )?),
        additional_origins,
    })
}
