//! Envoy's `CsrfPolicy` (the `envoy.filters.http.csrf` filter and its per-route settings) as
//! the `csrf` filter's settings.

use envoy_types::pb::envoy::extensions::filters::http::csrf::v3::CsrfPolicy;
use envoy_types::pb::google::protobuf::Any;

use super::RawCsrf;
use crate::RawStringMatch;
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
        .map(|(i, m)| {
            let m = matchers::string_match(
                String::new(),
                m,
                &format!("{at}.additional_origins[{i}]"),
            )?;
            Ok(RawStringMatch {
                exact: m.exact,
                prefix: m.prefix,
                suffix: m.suffix,
                contains: m.contains,
                regex: m.regex,
            })
        })
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
