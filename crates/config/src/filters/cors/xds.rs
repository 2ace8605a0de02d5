//! Envoy's `CorsPolicy` (a virtual host's or route's `typed_per_filter_config` for the
//! `envoy.filters.http.cors` filter) as the `cors` filter's settings there. Envoy reads each
//! field from the route's policy, else the virtual host's: the route's entry here is the two
//! merged, so it stands alone.

use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
use envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher;
use envoy_types::pb::google::protobuf::Any;

use super::{RawCors, RawOrigin, RawOriginMatcher};
use crate::RawPerRoute;
use crate::envoy::{ResourceError, decode, fractional_percent};

pub(crate) const TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy";

/// The filter itself (no settings in v3).
pub(crate) const FILTER_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors";

/// Envoy answers a preflight with 200.
const ENVOY_PREFLIGHT_STATUS: u16 = 200;

pub(crate) fn decode_policy(any: &Any) -> Result<CorsPolicy, ResourceError> {
    decode(any, TYPE_URL, "a CorsPolicy")
}

/// A level's entry: its policy with the fields it leaves empty taken from `parent` (the
/// virtual host's, for a route). `filter_enabled` is the level's own, as Envoy reads it.
pub(crate) fn settings(
    mut policy: CorsPolicy,
    parent: Option<&CorsPolicy>,
    at: &str,
) -> Result<RawPerRoute<RawCors>, ResourceError> {
    if let Some(parent) = parent {
        inherit(&mut policy, parent);
    }
    let CorsPolicy {
        allow_origin_string_match,
        allow_methods,
        allow_headers,
        expose_headers,
        max_age,
        allow_credentials,
        filter_enabled,
        // Counts origins in Envoy's statistics only; no request changes.
        shadow_enabled: _,
        allow_private_network_access,
        forward_not_matching_preflights,
    } = policy;
    if let Some(enabled) = filter_enabled {
        // A runtime key could move the share; there is no runtime here, so the default stands.
        let share = enabled.default_value.unwrap_or_default();
        let (percent, _) = fractional_percent(&share, &format!("{at}.filter_enabled"))?;
        if percent == 0.0 {
            return Ok(RawPerRoute::Word("disabled".into()));
        }
        if percent < 100.0 {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.filter_enabled"),
                fields: vec!["a share of requests (0% or 100% only)".into()],
            });
        }
    }
    let allow_origins = allow_origin_string_match
        .into_iter()
        .enumerate()
        .map(|(i, m)| origin(m, &format!("{at}.allow_origin_string_match[{i}]")))
        .collect::<Result<_, _>>()?;
    let max_age = match max_age.trim() {
        "" => None,
        seconds => Some(std::time::Duration::from_secs(seconds.parse().map_err(
            |_| ResourceError::invalid(format!("{at}.max_age"), "expected a number of seconds"),
        )?)),
    };
    Ok(RawPerRoute::Settings(RawCors {
        allow_origins,
        allow_methods: Some(list(&allow_methods)),
        allow_headers: Some(list(&allow_headers)),
        expose_headers: list(&expose_headers),
        max_age,
        allow_credentials: allow_credentials.map(|v| v.value),
        preflight_status: Some(ENVOY_PREFLIGHT_STATUS),
        forward_not_matching_preflights: forward_not_matching_preflights.map(|v| v.value),
        allow_private_network_access: allow_private_network_access.map(|v| v.value),
        from_envoy: true,
    }))
}

/// Each field the route leaves empty, from the virtual host.
fn inherit(route: &mut CorsPolicy, host: &CorsPolicy) {
    if route.allow_origin_string_match.is_empty() {
        route.allow_origin_string_match = host.allow_origin_string_match.clone();
    }
    for (mine, theirs) in [
        (&mut route.allow_methods, &host.allow_methods),
        (&mut route.allow_headers, &host.allow_headers),
        (&mut route.expose_headers, &host.expose_headers),
        (&mut route.max_age, &host.max_age),
    ] {
        if mine.is_empty() {
            mine.clone_from(theirs);
        }
    }
    for (mine, theirs) in [
        (&mut route.allow_credentials, &host.allow_credentials),
        (
            &mut route.allow_private_network_access,
            &host.allow_private_network_access,
        ),
        (
            &mut route.forward_not_matching_preflights,
            &host.forward_not_matching_preflights,
        ),
    ] {
        if mine.is_none() {
            *mine = *theirs;
        }
    }
}

/// Envoy's comma-separated value as a list: empty names none, `*` what is asked for.
fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

fn origin(mut m: StringMatcher, at: &str) -> Result<RawOrigin, ResourceError> {
    // `ignore_case` is the origin's own setting here (the file checks it against a regex).
    let ignore_case = std::mem::take(&mut m.ignore_case);
    let raw = crate::envoy::matchers::string_match(String::new(), m, at)?;
    Ok(RawOrigin::Matcher(RawOriginMatcher {
        exact: raw.exact,
        prefix: raw.prefix,
        suffix: raw.suffix,
        contains: raw.contains,
        regex: raw.regex,
        ignore_case,
    }))
}
